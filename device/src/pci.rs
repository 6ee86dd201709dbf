//! PCI configuration space of the adapter (vfio region 7).
//!
//! A type 0 header with the Digital vendor id and the MEMORY CHANNEL device
//! id, three memory BARs (see [`crate::regs`]) and INTA. QEMU virtualises
//! most of the header itself (BAR addresses, MSI-X); it reads the BAR type
//! bits from here and the sizes from the region info.

use crate::regs;

/// Size of the configuration space exposed.
pub const CONFIG_SIZE: u64 = 256;

const COMMAND: usize = 0x04;
const STATUS: usize = 0x06;
const BAR0: usize = 0x10;
const CAP_PTR: usize = 0x34;
const INTERRUPT_LINE: usize = 0x3C;
/// Offset of the interrupt capability (MSI-X, or MSI: [`Interrupts`]).
pub const MSIX_CAP: usize = 0x40;
/// Capability id of MSI-X.
const CAP_ID_MSIX: u8 = 0x11;
/// Capability id of MSI.
const CAP_ID_MSI: u8 = 0x05;
/// MSI message control: 64-bit addresses, one vector, no per-vector mask.
const MSI_CTRL_64BIT: u16 = 1 << 7;

/// Which message-signalled interrupt capability the adapter offers. Both
/// carry the same one vector (every cause shares it).
///
/// MSI-X is the default. MSI is for an adapter on a hot-pluggable slot:
/// QEMU 10.2's `vfio-user-pci` aborts when a device with MSI-X is
/// unplugged (its finalizer takes the PBA overlay out of a BAR it is no
/// longer in), and skips that step for a device without MSI-X.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Interrupts {
    /// An MSI-X capability, table and PBA in BAR 0.
    #[default]
    MsiX,
    /// An MSI capability (64-bit address, one vector).
    Msi,
}

impl std::str::FromStr for Interrupts {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "msix" => Ok(Interrupts::MsiX),
            "msi" => Ok(Interrupts::Msi),
            other => Err(format!("interrupts {other:?}: msix or msi")),
        }
    }
}

impl std::fmt::Display for Interrupts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Interrupts::MsiX => "msix",
            Interrupts::Msi => "msi",
        })
    }
}
/// MSI-X message control: enable and function-mask bits (the guest's).
const MSIX_CTRL_RW: u16 = 0xC000;
/// Command register bits the guest may change: I/O, memory, bus master, INTx disable.
const COMMAND_RW: u16 = 0x0007 | 0x0400;

/// BAR type bits: 64-bit memory BAR.
const BAR_MEM64: u32 = 0x4;
/// BAR type bits: prefetchable.
const BAR_PREFETCH: u32 = 0x8;

/// The configuration space and the BAR sizes it answers sizing probes with.
#[derive(Clone)]
pub struct ConfigSpace {
    bytes: [u8; CONFIG_SIZE as usize],
    /// Size of each BAR (0: unused; the high half of a 64-bit BAR is 0 here).
    bar_sizes: [u64; 6],
}

impl ConfigSpace {
    /// The bytes as they are now (for a snapshot).
    pub fn raw(&self) -> &[u8] {
        &self.bytes
    }

    /// Puts back bytes [`ConfigSpace::raw`] gave (of this same adapter
    /// shape): BARs, command register and capabilities as the guest left them.
    pub fn set_raw(&mut self, bytes: &[u8]) {
        let n = bytes.len().min(self.bytes.len());
        self.bytes[..n].copy_from_slice(&bytes[..n]);
    }

    /// Builds the reset state for an adapter with `pct_size` and `tx_size`
    /// BARs and an MSI-X capability.
    pub fn new(pct_size: u64, tx_size: u64) -> Self {
        Self::with_interrupts(pct_size, tx_size, Interrupts::MsiX)
    }

    /// [`ConfigSpace::new`] with the interrupt capability `irq`.
    pub fn with_interrupts(pct_size: u64, tx_size: u64, irq: Interrupts) -> Self {
        let mut c = ConfigSpace { bytes: [0; CONFIG_SIZE as usize], bar_sizes: [0; 6] };
        c.put16(0x00, regs::VENDOR_ID);
        c.put16(0x02, regs::DEVICE_ID);
        c.bytes[0x08] = 0x01; // revision
        c.bytes[0x09] = 0x00; // prog if
        c.bytes[0x0A] = 0x80; // subclass: other
        c.bytes[0x0B] = 0x02; // class: network controller
        c.bytes[0x0E] = 0x00; // header type 0
        c.put16(0x2C, regs::VENDOR_ID); // subsystem vendor
        c.put16(0x2E, regs::DEVICE_ID); // subsystem id
        c.bytes[0x3D] = 1; // interrupt pin: INTA
                           // Capability list: one capability, MSI-X (table and PBA in BAR 0,
                           // see crate regs) or MSI. QEMU emulates either for the guest.
        c.put16(STATUS, 1 << 4);
        c.bytes[CAP_PTR] = MSIX_CAP as u8;
        c.bytes[MSIX_CAP + 1] = 0; // last capability
        match irq {
            Interrupts::MsiX => {
                c.bytes[MSIX_CAP] = CAP_ID_MSIX;
                c.put16(MSIX_CAP + 2, (regs::MSIX_VECTORS - 1) as u16);
                c.put32(MSIX_CAP + 4, regs::reg::MSIX_TABLE as u32 | regs::BAR_REGS);
                c.put32(MSIX_CAP + 8, regs::reg::MSIX_PBA as u32 | regs::BAR_REGS);
            }
            Interrupts::Msi => {
                c.bytes[MSIX_CAP] = CAP_ID_MSI;
                c.put16(MSIX_CAP + 2, MSI_CTRL_64BIT);
            }
        }
        c.bar_sizes[regs::BAR_REGS as usize] = regs::REGS_SIZE;
        c.bar_sizes[regs::BAR_PCT as usize] = pct_size;
        c.bar_sizes[regs::BAR_TX as usize] = tx_size;
        c.put32(BAR0 + 4 * regs::BAR_PCT as usize, BAR_MEM64);
        c.put32(BAR0 + 4 * regs::BAR_TX as usize, BAR_MEM64 | BAR_PREFETCH);
        c
    }

    fn put16(&mut self, o: usize, v: u16) {
        self.bytes[o..o + 2].copy_from_slice(&v.to_le_bytes());
    }
    fn put32(&mut self, o: usize, v: u32) {
        self.bytes[o..o + 4].copy_from_slice(&v.to_le_bytes());
    }
    fn get32(&self, o: usize) -> u32 {
        u32::from_le_bytes(self.bytes[o..o + 4].try_into().unwrap())
    }

    /// Reads `data.len()` bytes at `offset` (caller checked the bounds).
    pub fn read(&self, offset: u64, data: &mut [u8]) {
        let o = offset as usize;
        data.copy_from_slice(&self.bytes[o..o + data.len()]);
    }

    /// Writes with PCI semantics: read-only fields keep their value, BARs
    /// take sizing probes, the command register keeps only its writable bits.
    pub fn write(&mut self, offset: u64, data: &[u8]) {
        for (i, &b) in data.iter().enumerate() {
            let o = offset as usize + i;
            match o {
                COMMAND | 0x05 => {
                    let mut cmd = u16::from_le_bytes([self.bytes[COMMAND], self.bytes[COMMAND + 1]]);
                    let shift = (o - COMMAND) * 8;
                    cmd = (cmd & !(0xFF << shift)) | ((b as u16) << shift);
                    self.put16(COMMAND, cmd & COMMAND_RW);
                }
                0x10..=0x27 => {
                    let bar = (o - BAR0) / 4;
                    let mut v = self.get32(BAR0 + bar * 4).to_le_bytes();
                    v[(o - BAR0) % 4] = b;
                    self.put32(BAR0 + bar * 4, self.bar_value(bar, u32::from_le_bytes(v)));
                }
                INTERRUPT_LINE => self.bytes[o] = b,
                o if o == MSIX_CAP + 3 && self.bytes[MSIX_CAP] == CAP_ID_MSIX => {
                    let hi = (b as u16) << 8 & MSIX_CTRL_RW;
                    let ctrl = u16::from_le_bytes([self.bytes[MSIX_CAP + 2], self.bytes[MSIX_CAP + 3]]);
                    self.put16(MSIX_CAP + 2, (ctrl & !MSIX_CTRL_RW) | hi);
                }
                STATUS | 0x07 => {} // read-only here: W1C error bits and INTx status are not modelled
                _ => {}
            }
        }
    }

    /// Value a BAR register holds after the guest wrote `v` to it.
    fn bar_value(&self, bar: usize, v: u32) -> u32 {
        let is_high = bar > 0
            && self.bar_sizes[bar] == 0
            && self.bar_sizes[bar - 1] != 0
            && self.get32(BAR0 + (bar - 1) * 4) & BAR_MEM64 != 0;
        if is_high {
            let size = self.bar_sizes[bar - 1];
            let mask = !(size - 1);
            return v & (mask >> 32) as u32;
        }
        let size = self.bar_sizes[bar];
        if size == 0 {
            return 0;
        }
        let flags = self.get32(BAR0 + bar * 4) & 0xF;
        (v & !(size as u32).wrapping_sub(1) & !0xF) | flags
    }

    /// The interrupt capability this space offers.
    pub fn interrupts(&self) -> Interrupts {
        if self.bytes[MSIX_CAP] == CAP_ID_MSI {
            Interrupts::Msi
        } else {
            Interrupts::MsiX
        }
    }

    /// True when the guest enabled bus mastering (the device may DMA).
    pub fn bus_master(&self) -> bool {
        self.bytes[COMMAND] & 0x4 != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rd32(c: &ConfigSpace, o: u64) -> u32 {
        let mut b = [0u8; 4];
        c.read(o, &mut b);
        u32::from_le_bytes(b)
    }

    #[test]
    fn identity_and_bar_sizing() {
        let mut c = ConfigSpace::new(1 << 20, 512 << 20);
        assert_eq!(rd32(&c, 0), 0x0018_1011);
        // 32-bit register BAR: sizing probe returns the size mask
        c.write(0x10, &0xFFFF_FFFFu32.to_le_bytes());
        assert_eq!(rd32(&c, 0x10), 0xFFFF_F000);
        // 64-bit prefetchable TX BAR (4/5)
        c.write(0x20, &0xFFFF_FFFFu32.to_le_bytes());
        c.write(0x24, &0xFFFF_FFFFu32.to_le_bytes());
        assert_eq!(rd32(&c, 0x20), 0xE000_000C);
        assert_eq!(rd32(&c, 0x24), 0xFFFF_FFFF);
        // unused BAR 1 stays zero
        c.write(0x14, &0xFFFF_FFFFu32.to_le_bytes());
        assert_eq!(rd32(&c, 0x14), 0);
        // vendor id is read-only
        c.write(0, &[0xAA, 0xBB]);
        assert_eq!(rd32(&c, 0) & 0xFFFF, 0x1011);
        // capability list: MSI-X, one vector, table and PBA in BAR 0
        assert_eq!(rd32(&c, 0x04) >> 16 & (1 << 4), 1 << 4);
        assert_eq!(rd32(&c, 0x34) & 0xFF, MSIX_CAP as u32);
        assert_eq!(rd32(&c, MSIX_CAP as u64), 0x0000_0011);
        assert_eq!(rd32(&c, MSIX_CAP as u64 + 4), 0x800);
        assert_eq!(rd32(&c, MSIX_CAP as u64 + 8), 0xC00);
        c.write(MSIX_CAP as u64 + 3, &[0xFF]);
        assert_eq!(rd32(&c, MSIX_CAP as u64) >> 16, 0xC000, "only enable and mask are writable");
    }

    #[test]
    fn msi_instead_of_msix() {
        let c = ConfigSpace::with_interrupts(1 << 20, 512 << 20, Interrupts::Msi);
        assert_eq!(rd32(&c, 0x34) & 0xFF, MSIX_CAP as u32);
        // MSI, last capability, 64-bit, one vector, no per-vector mask.
        assert_eq!(rd32(&c, MSIX_CAP as u64), 0x0080_0005);
        assert_eq!(c.interrupts(), Interrupts::Msi);
        assert_eq!(ConfigSpace::new(1 << 20, 512 << 20).interrupts(), Interrupts::MsiX);
        assert_eq!("msi".parse::<Interrupts>(), Ok(Interrupts::Msi));
        assert_eq!("msix".parse::<Interrupts>(), Ok(Interrupts::MsiX));
        assert!("intx".parse::<Interrupts>().unwrap_err().contains("msix or msi"));
    }
}
