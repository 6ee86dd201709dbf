//! Receive: ordered deliveries applied to guest memory through the DMA maps,
//! per the page control table (`docs/adapter.md`, "Receive" and "ACK pages").
//!
//! Called by whoever delivers: a hub's ordering thread (local ports) or a
//! link's receive thread (`crate::remote`). Never waits for the vfio-user
//! thread; never writes guest memory outside a DMA map.

use std::sync::atomic::Ordering;

use link::{FLAG_ACK, FLAG_ACK_REPLY, FLAG_LOOPBACK};
use tracing::{debug, info, warn};

use super::Shared;
use crate::regs::{err, int, pct, ACK_VALID, NOTIFY_DEPTH, PAGE_SIZE};
use crate::uplink::AckReply;

impl Shared {
    fn notify(&self, page: u64) {
        let mut irq = self.irq.lock().unwrap();
        if irq.fifo.len() >= NOTIFY_DEPTH {
            irq.lost = irq.lost.saturating_add(1);
        } else {
            irq.fifo.push_back(page as u32);
        }
        irq.raise(int::NOTIFY);
    }

    /// A frame for this adapter that failed its CRC on the way in (a link
    /// frame, or one the hub corrupts on purpose): counted in ERR_STATUS
    /// (`CRC`), never applied.
    pub fn bad_crc(&self) {
        self.raise_error(err::CRC);
    }

    /// Applies one ordered delivery. For a store to an ACK page nothing is
    /// applied; the answer is returned, for the deliverer to put into the
    /// global order as a point-to-point write to the ACK's sender.
    pub fn deliver(&self, seq: u64, src: u16, flags: u16, addr: u64, data: &[u8]) -> Option<AckReply> {
        // The global order only moves forward (numbers we do not receive are
        // other nodes' point-to-point traffic; lost frames show in the link
        // sequence instead).
        let floor = self.next_seq.swap(seq + 1, Ordering::SeqCst);
        if seq < floor {
            warn!(seq, floor, "hub sequence went backwards");
            self.raise_error(err::SEQ_GAP);
        }
        self.last_seq.store(seq, Ordering::Relaxed);
        if flags & FLAG_ACK != 0 {
            self.ack_reply(src, addr)
        } else {
            self.apply(addr, data);
            None
        }
    }

    /// A node joined (`up`) or left, at `seq` in the global order.
    pub fn member(&self, seq: u64, node: u16, up: bool) {
        self.next_seq.store(seq + 1, Ordering::SeqCst);
        info!(node, up, "membership change");
        self.set_member(node, up);
        self.link_event();
    }

    /// Our answer to an ACK store: our error status, into byte `node` of
    /// the page in the sender's receive buffer. Every node an ACK store is
    /// delivered to answers, whatever its own PCT says about the page; the
    /// sender answers itself when the page has LOOPBACK (the store was
    /// delivered back to it), and its answer comes back as a loopback.
    fn ack_reply(&self, src: u16, addr: u64) -> Option<AckReply> {
        let me = self.node_id()?;
        let page_base = addr - addr % PAGE_SIZE;
        let status = (self.err_status() as u8 & !ACK_VALID) | ACK_VALID;
        let flags = if src == me { FLAG_ACK_REPLY | FLAG_LOOPBACK } else { FLAG_ACK_REPLY };
        Some(AckReply { dest: src, flags, addr: page_base + me as u64, status })
    }

    /// Writes received bytes to guest memory, page by page, per the PCT.
    pub fn apply(&self, addr: u64, data: &[u8]) {
        let mut at = addr;
        let mut rest = data;
        while !rest.is_empty() {
            let page = at / PAGE_SIZE;
            if page >= self.pages {
                self.raise_error(err::RX_RANGE);
                return;
            }
            let in_page = at % PAGE_SIZE;
            let n = rest.len().min((PAGE_SIZE - in_page) as usize);
            let w0 = self.pct_word(page, 0);
            if w0 & pct::RX == 0 {
                self.rx_dropped.fetch_add(1, Ordering::Relaxed);
            } else if !self.bus_master.load(Ordering::Acquire) || self.faults.rx_dma() {
                // A device without bus mastering cannot DMA (nor one told
                // to fail, `faults`).
                self.raise_error(err::RX_DMA);
            } else {
                let base = self.pct_word(page, 1);
                match base.checked_add(in_page).map(|iova| self.dma.write(iova, &rest[..n])) {
                    Some(Ok(())) => {
                        self.rx_packets.fetch_add(1, Ordering::Relaxed);
                        if w0 & pct::INT != 0 {
                            self.notify(page);
                        }
                    }
                    Some(Err(e)) => {
                        debug!(page, "receive DMA refused: {e}");
                        self.raise_error(err::RX_DMA);
                    }
                    None => self.raise_error(err::RX_DMA),
                }
            }
            at += n as u64;
            rest = &rest[n..];
        }
    }
}
