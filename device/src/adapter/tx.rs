//! Transmit: stores into the transmit window become write packets, coalesced
//! while contiguous, handed to the adapter's uplink (`docs/adapter.md`,
//! "Transmit window").
//!
//! Only the vfio-user thread (QEMU's requests, in order) runs this.

use std::sync::atomic::Ordering;

use link::{BROADCAST, FLAG_ACK, FLAG_LOOPBACK, MAX_DATA};

use super::{Adapter, Shared};
use crate::regs::{err, pct, PAGE_SIZE};
use crate::uplink::WritePacket;

/// A transmit packet being built from contiguous stores.
pub(super) struct Pending {
    pub(super) addr: u64,
    pub(super) dest: u16,
    pub(super) flags: u16,
    pub(super) data: Vec<u8>,
}

impl Shared {
    /// Where a packet for `page` goes under its PCT entry: (destination,
    /// `link::FLAG_*`), or the error bit that refuses it (TX_DISABLED, or
    /// TX_DEST for a point-to-point page naming a node outside the ports).
    pub(super) fn route(&self, page: u64) -> Result<(u16, u16), u32> {
        let w0 = self.pct_word(page, 0);
        let p2p = w0 & pct::P2P != 0;
        let dest = if p2p { ((w0 >> pct::DEST_SHIFT) & pct::DEST_MASK) as u16 } else { BROADCAST };
        if w0 & pct::TX == 0 {
            return Err(err::TX_DISABLED);
        }
        if p2p && dest as u32 >= self.ports() {
            // Checked before anything else: dest 0xFFFF must not become a broadcast.
            return Err(err::TX_DEST);
        }
        let mut flags = 0;
        if w0 & pct::LOOPBACK != 0 {
            flags |= FLAG_LOOPBACK;
        }
        if w0 & pct::ACK != 0 {
            flags |= FLAG_ACK;
        }
        Ok((dest, flags))
    }
}

impl Adapter {
    pub(super) fn flush_pending(&mut self) {
        let Some(p) = self.pending.take() else { return };
        let w = WritePacket { dest: p.dest, flags: p.flags, addr: p.addr, data: &p.data };
        match self.uplink.send(&w) {
            Ok(()) => {
                self.shared.tx_packets.fetch_add(1, Ordering::Relaxed);
            }
            // Link down: the packet is lost, as on a cable that is unplugged.
            Err(_) => self.shared.raise_error(err::TX_LINK_DOWN),
        }
    }

    /// Sends the packet being built and everything queued for the hub.
    pub(super) fn flush_link(&mut self) {
        self.flush_pending();
        self.uplink.flush();
    }

    /// A store of `data` at transmit-window offset `off`.
    pub(super) fn tx_store(&mut self, off: u64, data: &[u8]) {
        // A doorbell is ordered before the stores after it.
        self.shared.txdma.wait_idle();
        let mut at = off;
        let mut rest = data;
        while !rest.is_empty() {
            let page = at / PAGE_SIZE;
            let n = rest.len().min((PAGE_SIZE - at % PAGE_SIZE) as usize);
            match self.shared.route(page) {
                Err(bit) => self.shared.raise_error(bit),
                Ok((dest, flags)) => {
                    let chunk = &rest[..n];
                    match self.pending.as_mut() {
                        Some(p)
                            if p.dest == dest
                                && p.flags == flags
                                && flags & FLAG_ACK == 0
                                && p.addr + p.data.len() as u64 == at
                                && (p.addr / PAGE_SIZE) == page
                                && p.data.len() + n <= MAX_DATA =>
                        {
                            p.data.extend_from_slice(chunk);
                        }
                        _ => {
                            self.flush_pending();
                            self.pending = Some(Pending { addr: at, dest, flags, data: chunk.to_vec() });
                        }
                    }
                }
            }
            at += n as u64;
            rest = &rest[n..];
        }
    }
}
