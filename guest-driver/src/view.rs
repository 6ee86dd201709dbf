//! The adapter as a client process sees it: its identity and counters,
//! read from the registers imcd maps read-only for it (`Imc::regs`). The
//! client libraries (imc-client, UMP, MPI and those to come) hold an
//! [`AdapterView`] and never name a register. Every call is a device read
//! (a trapped load under QEMU). Any thread.

use guest_mem::{Mapping, ReadOnly};
use regs::reg;

/// The adapter's identity and counters, read-only.
pub struct AdapterView {
    map: Mapping<ReadOnly>,
}

impl AdapterView {
    /// A view over `map`, the adapter's register file (BAR 0) as imcd
    /// hands it out.
    pub fn new(map: Mapping<ReadOnly>) -> AdapterView {
        AdapterView { map }
    }

    /// A register; 0xFFFF_FFFF (what a PCI read of nothing returns) when
    /// the mapping is shorter than the register file.
    fn reg(&self, off: u64) -> u32 {
        self.map.load::<u32>(off as usize).unwrap_or(u32::MAX)
    }

    /// Any register by offset, for the tools that show them all (`mctool
    /// info`); the libraries use the named reads.
    pub fn raw(&self, off: u64) -> u32 {
        self.reg(off)
    }

    /// ERR_COUNT: errors this adapter saw since it was reset.
    pub fn err_count(&self) -> u32 {
        self.reg(reg::ERR_COUNT)
    }

    /// ERR_STATUS: the error bits now set (`regs::err`).
    pub fn err_status(&self) -> u32 {
        self.reg(reg::ERR_STATUS)
    }

    /// LINK_EVENTS: link and membership changes the adapter saw; it moves
    /// when another node leaves or joins, as one whose link went down does.
    pub fn link_events(&self) -> u32 {
        self.reg(reg::LINK_EVENTS)
    }

    /// This node's id (None while the adapter has none).
    pub fn node(&self) -> Option<u16> {
        regs::node_id(self.reg(reg::NODE))
    }

    /// The nodes the hub counts as up (whether or not they run imcd).
    pub fn members(&self) -> Vec<u16> {
        regs::members(self.reg(reg::MEMBERS_LO), self.reg(reg::MEMBERS_HI)).map(|n| n as u16).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_view_reads_the_documented_registers() {
        let dir = std::env::temp_dir().join(format!("view-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("regs");
        let rw = guest_mem::Mapping::<guest_mem::ReadWrite>::create(&path, 4096).unwrap();
        rw.store::<u32>(reg::ERR_COUNT as usize, 7).unwrap();
        rw.store::<u32>(reg::LINK_EVENTS as usize, 3).unwrap();
        rw.store::<u32>(reg::ERR_STATUS as usize, regs::err::CRC).unwrap();
        rw.store::<u32>(reg::MEMBERS_LO as usize, 0b1011).unwrap();
        let v = AdapterView::new(Mapping::<ReadOnly>::open(&path).unwrap());
        assert_eq!((v.err_count(), v.link_events(), v.err_status()), (7, 3, regs::err::CRC));
        assert_eq!(v.members(), vec![0, 1, 3]);
        // A mapping shorter than the register file reads as nothing there.
        std::fs::write(dir.join("short"), [0u8; 8]).unwrap();
        let short = AdapterView::new(Mapping::<ReadOnly>::open(&dir.join("short")).unwrap());
        assert_eq!(short.err_count(), u32::MAX);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
