//! The register file (BAR 0) and the page control table (BAR 2), as
//! `docs/adapter.md` describes them; offsets and bits are in crate `regs`.
//!
//! Reads and writes come from the vfio-user thread; the PCT words are
//! atomics that deliverers read concurrently.

use std::sync::atomic::Ordering;

use tracing::debug;

use super::{Adapter, Shared};
use crate::regs::{self, err, int, pct, reg, NOTIFY_EMPTY, PAGE_SIZE};

impl Shared {
    /// Reads a 32-bit register. `NOTIFY_FIFO` pops, so this takes `&self` but has effects.
    pub(super) fn reg_read(&self, off: u64) -> u32 {
        match off {
            reg::ID => regs::ID_VALUE,
            reg::NODE => self.node.load(Ordering::SeqCst),
            reg::LINK => self.link_up.load(Ordering::SeqCst) as u32,
            reg::PAGE_SIZE => PAGE_SIZE as u32,
            reg::ASPACE_PAGES => self.pages as u32,
            reg::ERR_STATUS => self.err_status(),
            reg::ERR_COUNT => self.err_count(),
            reg::CTRL => 0,
            reg::MEMBERS_LO => self.members.load(Ordering::SeqCst) as u32,
            reg::MEMBERS_HI => (self.members.load(Ordering::SeqCst) >> 32) as u32,
            reg::INT_CAUSE => self.irq.lock().unwrap().cause,
            reg::INT_MASK => self.irq.lock().unwrap().mask,
            reg::NOTIFY_FIFO => self.irq.lock().unwrap().fifo.pop_front().unwrap_or(NOTIFY_EMPTY),
            reg::NOTIFY_COUNT => self.irq.lock().unwrap().fifo.len() as u32,
            reg::TX_PACKETS => self.tx_packets.load(Ordering::Relaxed) as u32,
            reg::RX_PACKETS => self.rx_packets.load(Ordering::Relaxed) as u32,
            reg::RX_DROPPED => self.rx_dropped.load(Ordering::Relaxed) as u32,
            reg::NOTIFY_LOST => self.irq.lock().unwrap().lost,
            reg::LINK_EVENTS => self.link_events.load(Ordering::Relaxed),
            reg::LAST_SEQ => self.last_seq.load(Ordering::Relaxed) as u32,
            reg::CAPS => regs::caps::ALL,
            reg::DMA_RING_LO..=reg::DMA_BYTES => self.txdma.reg(off),
            _ => 0,
        }
    }
}

impl Adapter {
    pub(super) fn regs_read(&self, off: u64, data: &mut [u8]) {
        // Whole registers are read once each (NOTIFY_FIFO pops on read).
        let mut cache: Option<(u64, [u8; 4])> = None;
        for (i, b) in data.iter_mut().enumerate() {
            let o = off + i as u64;
            let base = o & !3;
            let bytes = match cache {
                Some((c, v)) if c == base => v,
                _ => {
                    let v = self.shared.reg_read(base).to_le_bytes();
                    cache = Some((base, v));
                    v
                }
            };
            *b = bytes[(o & 3) as usize];
        }
    }

    pub(super) fn regs_write(&mut self, off: u64, data: &[u8]) {
        if off % 4 != 0 || data.len() != 4 {
            debug!(off, len = data.len(), "register write ignored: registers take aligned 32-bit writes");
            return;
        }
        let v = u32::from_le_bytes(data.try_into().unwrap());
        match off {
            reg::ERR_STATUS => {
                // LINK_DOWN stays set while the link is down.
                let keep = if self.shared.link_up.load(Ordering::SeqCst) { 0 } else { err::LINK_DOWN };
                self.shared.err_status.fetch_and(!(v & err::ALL) | keep, Ordering::SeqCst);
            }
            reg::INT_CAUSE => {
                let mut irq = self.shared.irq.lock().unwrap();
                let before = irq.pending();
                irq.cause &= !(v & int::ALL);
                irq.update(before);
            }
            reg::INT_MASK => {
                let mut irq = self.shared.irq.lock().unwrap();
                let before = irq.pending();
                irq.mask = v & int::ALL;
                irq.update(before);
            }
            reg::CTRL if v & regs::ctrl::RESET != 0 => self.reset_adapter(),
            reg::DMA_TAIL => {
                if let Err(code) = self.shared.txdma.doorbell(v) {
                    self.shared.dma_failed(code);
                }
            }
            reg::DMA_RING_LO | reg::DMA_RING_HI => {
                self.shared.txdma.wait_idle();
                self.shared.txdma.set_base(off == reg::DMA_RING_HI, v);
            }
            reg::DMA_RING_SIZE => {
                self.shared.txdma.wait_idle();
                if !self.shared.txdma.set_size(v) {
                    self.shared.dma_failed(regs::dma::status::RING);
                }
            }
            _ => debug!(off, v, "write to read-only register ignored"),
        }
    }

    pub(super) fn pct_read(&self, off: u64, data: &mut [u8]) {
        for (i, b) in data.iter_mut().enumerate() {
            let o = off + i as u64;
            let word = o / 8;
            *b = if word < self.shared.pages * 2 {
                self.shared.pct[word as usize].load(Ordering::Acquire).to_le_bytes()[(o % 8) as usize]
            } else {
                0
            };
        }
    }

    pub(super) fn pct_write(&mut self, off: u64, data: &[u8]) {
        // Packets of a doorbell before this write are sent under the old entry.
        self.shared.txdma.wait_idle();
        // Stores already made under the old entry go out first.
        self.flush_pending();
        // Each touched word is built whole and stored once, so the receive
        // thread never sees half an update; word 1 (the receive address) is
        // stored before word 0 (the enables) when both change.
        let first = off / 8;
        let last = (off + data.len() as u64 - 1) / 8;
        let mut words: Vec<(u64, u64)> = Vec::with_capacity(2);
        for word in first..=last {
            if word >= self.shared.pages * 2 {
                continue;
            }
            let mut bytes = self.shared.pct[word as usize].load(Ordering::Acquire).to_le_bytes();
            for (i, &b) in data.iter().enumerate() {
                let o = off + i as u64;
                if o / 8 == word {
                    bytes[(o % 8) as usize] = b;
                }
            }
            let v = u64::from_le_bytes(bytes) & if word % 2 == 0 { pct::WORD0_MASK } else { pct::WORD1_MASK };
            words.push((word, v));
        }
        words.sort_by_key(|&(w, _)| (w / 2, std::cmp::Reverse(w % 2)));
        for (word, v) in words {
            self.shared.pct[word as usize].store(v, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use link::{FLAG_ACK, FLAG_ACK_REPLY, FLAG_LOOPBACK};

    use super::super::Adapter;
    use crate::regs::{self, err, int, pct, reg, BAR_PCT, PAGE_SIZE};
    use crate::uplink::LinkInfo;
    use crate::vfio_user::Device;

    fn adapter() -> Adapter {
        Adapter::new(regs::MIN_ASPACE).unwrap()
    }

    fn join(a: &Adapter, node: u16, max_nodes: u16, members: &[u16]) {
        a.shared.link_up(&LinkInfo { node, max_nodes, members: members.to_vec(), next_seq: 100 });
    }

    #[test]
    fn node_reads_reset_value_then_keeps_the_ports_while_down() {
        let mut a = adapter();
        let s = a.shared();
        assert_eq!(s.reg_read(reg::NODE), regs::NODE_RESET, "NODE before the first join");
        assert_eq!(s.reg_read(reg::NODE), 0x0000_FFFF);
        assert_eq!(s.reg_read(reg::LINK), 0);
        assert_eq!(s.reg_read(reg::ERR_STATUS), err::LINK_DOWN);
        assert_eq!(s.reg_read(reg::MEMBERS_LO), 0);

        join(&a, 3, 8, &[1, 3, 40]);
        assert_eq!(s.reg_read(reg::NODE), 8 << 16 | 3);
        assert_eq!(s.reg_read(reg::MEMBERS_LO), 1 << 1 | 1 << 3);
        assert_eq!(s.reg_read(reg::MEMBERS_HI), 1 << (40 - 32));

        s.link_down("test");
        assert_eq!(s.reg_read(reg::NODE), 8 << 16 | regs::NO_NODE, "the port count stays while down");
        assert_eq!(s.reg_read(reg::MEMBERS_LO), 0, "no members while down, not even this node");
        assert_eq!(s.reg_read(reg::MEMBERS_HI), 0);
        // A reset does not touch NODE.
        a.reset();
        assert_eq!(s.reg_read(reg::NODE), 8 << 16 | regs::NO_NODE);
        join(&a, 3, 8, &[3]);
        assert_eq!(s.reg_read(reg::NODE), 8 << 16 | 3);
    }

    #[test]
    fn receive_address_low_three_bits_read_as_zero() {
        let mut a = adapter();
        a.region_write(BAR_PCT, 2 * pct::ENTRY + 8, &u64::MAX.to_le_bytes()).unwrap();
        a.region_write(BAR_PCT, 3 * pct::ENTRY + 8, &0x1_2345_6787u64.to_le_bytes()).unwrap();
        // A one-byte store to the low byte of word 1.
        a.region_write(BAR_PCT, 4 * pct::ENTRY + 8, &[0xFF]).unwrap();
        let word1 = |a: &mut Adapter, p: u64| {
            let mut b = [0u8; 8];
            a.region_read(BAR_PCT, p * pct::ENTRY + 8, &mut b).unwrap();
            u64::from_le_bytes(b)
        };
        assert_eq!(word1(&mut a, 2), pct::WORD1_MASK, "all ones but the reserved bits");
        assert_eq!(word1(&mut a, 2), 0xFFFF_FFFF_FFFF_FFF8);
        assert_eq!(word1(&mut a, 3), 0x1_2345_6780);
        assert_eq!(word1(&mut a, 4), 0xF8);
    }

    #[test]
    fn reset_keeps_last_seq() {
        let mut a = adapter();
        let s = a.shared();
        join(&a, 1, 8, &[0, 1]);
        assert_eq!(s.reg_read(reg::LAST_SEQ), 0, "no delivery yet");
        assert!(s.deliver(0x1_0000_0123, 0, 0, 0, &[1; 8]).is_none());
        assert_eq!(s.reg_read(reg::LAST_SEQ), 0x123, "low 32 bits");
        assert_eq!(s.reg_read(reg::RX_DROPPED), 1, "no RX on page 0");
        a.reset();
        assert_eq!(s.reg_read(reg::RX_DROPPED), 0);
        assert_eq!(s.reg_read(reg::LAST_SEQ), 0x123, "CTRL.RESET leaves LAST_SEQ");
    }

    #[test]
    fn ack_answer_ignores_the_answering_pct_and_loops_back_to_self() {
        let mut a = adapter();
        let s = a.shared();
        join(&a, 2, 8, &[2, 5]);
        s.err_status_clear(err::ALL);
        s.raise_error(err::TX_READ | err::TX_LINK_DOWN);
        s.irq.lock().unwrap().cause = 0;
        let page = 7;
        let at = page * PAGE_SIZE + 0x40;
        // No PCT entry at all: the node answers anyway.
        let r = s.deliver(200, 5, FLAG_ACK, at, &[9; 8]).expect("an answer");
        assert_eq!((r.dest, r.flags, r.addr), (5, FLAG_ACK_REPLY, page * PAGE_SIZE + 2));
        assert_eq!(r.status, 0x80 | err::TX_READ as u8, "bits 0-6 only, with bit 7 set");
        // RX and INT on the page: still only an answer, no write, no notification.
        a.region_write(BAR_PCT, page * pct::ENTRY + 8, &0x10000u64.to_le_bytes()).unwrap();
        a.region_write(BAR_PCT, page * pct::ENTRY, &(pct::RX | pct::INT).to_le_bytes()).unwrap();
        assert!(s.deliver(201, 5, FLAG_ACK, at, &[9; 8]).is_some());
        assert_eq!(s.reg_read(reg::NOTIFY_COUNT), 0);
        assert_eq!(s.reg_read(reg::INT_CAUSE) & int::NOTIFY, 0);
        assert_eq!(s.reg_read(reg::RX_PACKETS), 0);
        assert_eq!(s.reg_read(reg::RX_DROPPED), 0);
        // Its own ACK store looped back: the answer is a loopback write to itself.
        let r = s.deliver(202, 2, FLAG_ACK | FLAG_LOOPBACK, at, &[9; 8]).expect("an answer to itself");
        assert_eq!((r.dest, r.flags, r.addr), (2, FLAG_ACK_REPLY | FLAG_LOOPBACK, page * PAGE_SIZE + 2));
        // Not joined: no answer.
        s.link_down("test");
        assert!(s.deliver(203, 5, FLAG_ACK, at, &[9; 8]).is_none());
    }
}
