//! The register file (BAR 0) and the page control table (BAR 2), as
//! `docs/adapter.md` describes them; offsets and bits are in crate `regs`.
//!
//! Reads and writes come from the vfio-user thread; the PCT words are
//! atomics that deliverers read concurrently.

use std::sync::atomic::Ordering;

use tracing::debug;

use super::{Adapter, Shared};
use crate::regs::{self, err, int, pct, reg, NOTIFY_EMPTY, PAGE_SIZE};
use crate::vfio_user::Device;

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
            reg::CTRL if v & regs::ctrl::RESET != 0 => Device::reset(self),
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
            let mut v = u64::from_le_bytes(bytes);
            if word % 2 == 0 {
                v &= pct::WORD0_MASK;
            }
            words.push((word, v));
        }
        words.sort_by_key(|&(w, _)| (w / 2, std::cmp::Reverse(w % 2)));
        for (word, v) in words {
            self.shared.pct[word as usize].store(v, Ordering::Release);
        }
    }
}
