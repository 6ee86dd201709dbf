//! The MEMORY CHANNEL adapter: register file, page control table, transmit
//! window, receive DMA, interrupts and ACK pages, behind the [`Device`] trait.
//!
//! Two kinds of thread touch an adapter:
//! - its vfio-user thread (QEMU's requests, in order): register and PCT
//!   accesses and transmit-window stores, which become write packets handed
//!   to the adapter's [`Uplink`];
//! - whoever delivers ordered writes: on a hub's local port, the vfio-user
//!   thread of whichever guest made the write (under the hub's order lock);
//!   on a link port, the link's receive thread ([`crate::remote`]). It calls
//!   [`Shared::deliver`], which applies the bytes to guest memory through the
//!   DMA maps, and returns ACK answers for the deliverer to send.
//!
//! What both need lives in [`Shared`]: atomics for the PCT and counters and
//! a mutex for the interrupt state (taken last, never held across anything
//! that waits). A deliverer never waits for the vfio-user thread, and never
//! writes guest memory outside a DMA map.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mc_link::{ANY_NODE, BROADCAST, FLAG_ACK, FLAG_LOOPBACK, MAX_DATA};
use tracing::{debug, info, warn};

use crate::dma::DmaSpace;
use crate::link_client::{HubAddr, Joined, Stream};
use crate::pci::{ConfigSpace, CONFIG_SIZE};
use crate::regs::{self, err, int, pct, reg, ACK_VALID, MSIX_VECTORS, NOTIFY_DEPTH, NOTIFY_EMPTY, PAGE_SIZE};
use crate::remote::RemoteLink;
use crate::uplink::{AckReply, LinkInfo, Unplugged, Uplink, WritePacket};
use crate::vfio_user::{self, region, region_flags, Device, Errno, IrqSet, RegionInfo};

/// Node id value of `NODE` while the adapter has not joined a hub.
pub const NO_NODE: u32 = 0xFFFF;

/// How the adapter is set up.
#[derive(Debug, Clone)]
pub struct AdapterConfig {
    /// Size of the MEMORY CHANNEL address space in bytes (power of two).
    pub aspace: u64,
    /// The hub: `HubAddr::Unix(path)` or `HubAddr::Tcp("host:port")`.
    pub hub: HubAddr,
    /// Cluster secret (a TCP hub requires it).
    pub secret: Option<Vec<u8>>,
    /// Node id to ask the hub for, or `ANY_NODE`.
    pub want_node: u16,
    /// Name given to the hub (logs, stable ids).
    pub name: String,
    /// How long to keep trying to reach the hub at start.
    pub hub_wait: Duration,
}

impl Default for AdapterConfig {
    fn default() -> Self {
        AdapterConfig {
            aspace: regs::DEFAULT_ASPACE,
            hub: HubAddr::Unix("mc-hub.sock".into()),
            secret: None,
            want_node: ANY_NODE,
            name: String::from("adapter"),
            hub_wait: Duration::from_secs(10),
        }
    }
}

/// Interrupt state: causes, enables, the notification FIFO and the eventfds
/// QEMU gave us for INTx and MSI-X.
#[derive(Default)]
struct Irq {
    cause: u32,
    mask: u32,
    fifo: VecDeque<u32>,
    lost: u32,
    intx: Option<File>,
    /// Masked by QEMU, or automasked after we asserted it until QEMU unmasks.
    intx_masked: bool,
    msix: Vec<Option<File>>,
    msix_masked: Vec<bool>,
    msix_pending: Vec<bool>,
    /// Error-recovery eventfd (kept so QEMU is satisfied; never signalled).
    err: Option<File>,
}

fn kick(f: &File) {
    // An eventfd takes an 8-byte count; a full counter (EAGAIN) is still signalled.
    let _ = (&*f).write(&1u64.to_ne_bytes());
}

impl Irq {
    fn pending(&self) -> u32 {
        self.cause & self.mask
    }

    fn msix_enabled(&self) -> bool {
        self.msix.iter().any(Option::is_some)
    }

    /// Delivers the interrupt: MSI-X vector 0 when MSI-X is set up, else INTx.
    fn signal(&mut self) {
        debug!(cause = self.cause, mask = self.mask, msix = self.msix_enabled(), "interrupt");
        if self.msix_enabled() {
            if self.msix_masked.first().copied().unwrap_or(false) {
                self.msix_pending[0] = true;
            } else if let Some(f) = self.msix.first().and_then(Option::as_ref) {
                kick(f);
            }
        } else if !self.intx_masked {
            if let Some(f) = &self.intx {
                kick(f);
                // INTx is level-triggered: stay quiet until QEMU unmasks.
                self.intx_masked = true;
            }
        }
    }

    /// Re-evaluates after `cause` or `mask` changed from `before` (cause & mask).
    fn update(&mut self, before: u32) {
        if self.pending() & !before != 0 {
            self.signal();
        }
    }

    /// Forgets every mask and pending vector (reset, new client).
    fn unmask_all(&mut self) {
        self.intx_masked = false;
        self.msix_masked.iter_mut().for_each(|m| *m = false);
        self.msix_pending.iter_mut().for_each(|p| *p = false);
    }

    fn raise(&mut self, bits: u32) {
        debug!(bits, cause = self.cause, mask = self.mask, "raise");
        let before = self.pending();
        self.cause |= bits;
        self.update(before);
    }
}

/// State shared by the vfio-user thread and the receive thread.
pub struct Shared {
    /// Pages in the address space.
    pub pages: u64,
    /// Two words per page, see [`regs::pct`].
    pct: Box<[AtomicU64]>,
    /// Guest memory.
    pub dma: DmaSpace,
    node: AtomicU32,
    /// Node id to rejoin as after a link loss.
    home_node: AtomicU32,
    link_up: AtomicBool,
    /// PCI command register's bus master bit: no receive DMA without it.
    bus_master: AtomicBool,
    err_status: AtomicU32,
    err_count: AtomicU32,
    members: AtomicU64,
    tx_packets: AtomicU64,
    rx_packets: AtomicU64,
    rx_dropped: AtomicU64,
    link_events: AtomicU32,
    last_seq: AtomicU64,
    /// Next sequence number expected from the hub (gap detection).
    next_seq: AtomicU64,
    irq: Mutex<Irq>,
}

impl Shared {
    fn new(pages: u64) -> Self {
        Shared {
            pages,
            pct: (0..pages * 2).map(|_| AtomicU64::new(0)).collect(),
            dma: DmaSpace::new(),
            node: AtomicU32::new(NO_NODE),
            home_node: AtomicU32::new(ANY_NODE as u32),
            link_up: AtomicBool::new(false),
            bus_master: AtomicBool::new(false),
            err_status: AtomicU32::new(err::LINK_DOWN),
            err_count: AtomicU32::new(0),
            members: AtomicU64::new(0),
            tx_packets: AtomicU64::new(0),
            rx_packets: AtomicU64::new(0),
            rx_dropped: AtomicU64::new(0),
            link_events: AtomicU32::new(0),
            last_seq: AtomicU64::new(0),
            next_seq: AtomicU64::new(0),
            irq: Mutex::new(Irq {
                msix: (0..MSIX_VECTORS).map(|_| None).collect(),
                msix_masked: vec![false; MSIX_VECTORS as usize],
                msix_pending: vec![false; MSIX_VECTORS as usize],
                ..Irq::default()
            }),
        }
    }

    /// Latches error bits, counts one error and raises the error interrupt cause.
    pub fn raise_error(&self, bits: u32) {
        self.err_status.fetch_or(bits, Ordering::SeqCst);
        let _ = self.err_count.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |c| c.checked_add(1));
        self.irq.lock().unwrap().raise(int::ERROR);
    }

    /// Clears error status bits without counting anything (link installed).
    pub fn err_status_clear(&self, bits: u32) {
        self.err_status.fetch_and(!bits, Ordering::SeqCst);
    }

    /// Current error status bits.
    pub fn err_status(&self) -> u32 {
        self.err_status.load(Ordering::SeqCst)
    }

    /// Errors counted since reset.
    pub fn err_count(&self) -> u32 {
        self.err_count.load(Ordering::SeqCst)
    }

    /// Word `w` (0 or 1) of page `page`'s PCT entry.
    pub fn pct_word(&self, page: u64, w: u64) -> u64 {
        self.pct[(page * 2 + w) as usize].load(Ordering::Acquire)
    }

    fn node_id(&self) -> Option<u16> {
        let n = self.node.load(Ordering::SeqCst) & 0xFFFF;
        (n != NO_NODE).then_some(n as u16)
    }

    fn ports(&self) -> u32 {
        self.node.load(Ordering::SeqCst) >> 16
    }

    /// Reads a 32-bit register. `NOTIFY_FIFO` pops, so this takes `&self` but has effects.
    fn reg_read(&self, off: u64) -> u32 {
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

    fn set_member(&self, node: u16, up: bool) {
        if node < 64 {
            let bit = 1u64 << node;
            if up {
                self.members.fetch_or(bit, Ordering::SeqCst);
            } else {
                self.members.fetch_and(!bit, Ordering::SeqCst);
            }
        }
    }

    fn link_event(&self) {
        self.link_events.fetch_add(1, Ordering::Relaxed);
        self.irq.lock().unwrap().raise(int::LINK);
    }

    fn notify(&self, page: u64) {
        let mut irq = self.irq.lock().unwrap();
        if irq.fifo.len() >= NOTIFY_DEPTH {
            irq.lost = irq.lost.saturating_add(1);
        } else {
            irq.fifo.push_back(page as u32);
        }
        irq.raise(int::NOTIFY);
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
    /// the page in the sender's receive buffer.
    fn ack_reply(&self, src: u16, addr: u64) -> Option<AckReply> {
        let me = self.node_id()?;
        let page_base = addr - addr % PAGE_SIZE;
        let status = (self.err_status() as u8 & !ACK_VALID) | ACK_VALID;
        Some(AckReply { dest: src, addr: page_base + me as u64, status })
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
            } else if !self.bus_master.load(Ordering::Acquire) {
                // A device without bus mastering cannot DMA.
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

    /// The link came up (first join or rejoin): node id, ports, members.
    pub fn link_up(&self, info: &LinkInfo) {
        self.node.store(info.node as u32 | (info.max_nodes as u32) << 16, Ordering::SeqCst);
        self.home_node.store(info.node as u32, Ordering::SeqCst);
        self.members.store(0, Ordering::SeqCst);
        for m in &info.members {
            self.set_member(*m, true);
        }
        self.next_seq.store(info.next_seq, Ordering::SeqCst);
        self.link_up.store(true, Ordering::SeqCst);
        self.link_event();
    }

    /// The node id this adapter rejoins as after a link loss.
    pub fn home_node(&self) -> u16 {
        self.home_node.load(Ordering::SeqCst) as u16
    }

    /// True while the link is up.
    pub fn is_link_up(&self) -> bool {
        self.link_up.load(Ordering::SeqCst)
    }

    /// The link went down: no node id, no members, LINK_DOWN and the LINK cause.
    pub fn link_down(&self, reason: &str) {
        warn!("link to hub down: {reason}");
        let was_up = self.link_up.swap(false, Ordering::SeqCst);
        self.node.fetch_or(NO_NODE, Ordering::SeqCst);
        self.members.store(0, Ordering::SeqCst);
        if was_up {
            self.raise_error(err::LINK_DOWN);
            self.link_event();
        }
    }

    fn reset(&self) {
        for w in self.pct.iter() {
            w.store(0, Ordering::Release);
        }
        self.err_status.store(if self.link_up.load(Ordering::SeqCst) { 0 } else { err::LINK_DOWN }, Ordering::SeqCst);
        self.err_count.store(0, Ordering::SeqCst);
        self.tx_packets.store(0, Ordering::Relaxed);
        self.rx_packets.store(0, Ordering::Relaxed);
        self.rx_dropped.store(0, Ordering::Relaxed);
        self.link_events.store(0, Ordering::Relaxed);
        let mut irq = self.irq.lock().unwrap();
        irq.cause = 0;
        irq.mask = 0;
        irq.fifo.clear();
        irq.lost = 0;
        irq.unmask_all();
    }
}

/// A transmit packet being built from contiguous stores.
struct Pending {
    addr: u64,
    dest: u16,
    flags: u16,
    data: Vec<u8>,
}

/// The adapter device.
pub struct Adapter {
    shared: Arc<Shared>,
    config: ConfigSpace,
    pending: Option<Pending>,
    uplink: Arc<dyn Uplink>,
}

impl Adapter {
    /// Creates an adapter with no hub link (tests attach one with [`Adapter::attach_link`]).
    pub fn new(aspace: u64) -> io::Result<Adapter> {
        if !(regs::MIN_ASPACE..=regs::MAX_ASPACE).contains(&aspace) || !aspace.is_power_of_two() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "address space must be a power of two between {} MiB and {} MiB, not {aspace} bytes",
                    regs::MIN_ASPACE >> 20,
                    regs::MAX_ASPACE >> 20
                ),
            ));
        }
        let pages = aspace / PAGE_SIZE;
        let shared = Arc::new(Shared::new(pages));
        Ok(Adapter {
            config: ConfigSpace::new(Self::pct_bar_size(pages), aspace),
            shared,
            pending: None,
            uplink: Arc::new(Unplugged),
        })
    }

    fn pct_bar_size(pages: u64) -> u64 {
        (pages * pct::ENTRY).next_power_of_two().max(4096)
    }

    /// The state deliverers use (a hub's local port keeps it).
    pub fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    /// Plugs the adapter's cable in: its writes go to `uplink` from now on.
    pub fn set_uplink(&mut self, uplink: Arc<dyn Uplink>) {
        self.flush_pending();
        self.uplink = uplink;
    }

    /// Joins the hub at `cfg.hub` over a link port (retrying for
    /// `cfg.hub_wait`); the link rejoins by itself whenever it goes down.
    pub fn connect(&mut self, cfg: &AdapterConfig) -> io::Result<()> {
        let link = RemoteLink::connect(self.shared.clone(), cfg)?;
        self.set_uplink(Arc::new(link));
        Ok(())
    }

    /// Uses an already-joined link (from `link_client::join`); no rejoin after a loss.
    pub fn attach_link(&mut self, joined: Joined, reader: UnixStream, writer: BufWriter<UnixStream>) {
        let writer =
            BufWriter::with_capacity(64 * 1024, Stream::Unix(writer.into_inner().expect("fresh writer is empty")));
        let link = RemoteLink::attach(self.shared.clone(), joined, Stream::Unix(reader), writer);
        self.set_uplink(Arc::new(link));
    }

    fn flush_pending(&mut self) {
        let Some(p) = self.pending.take() else { return };
        let w = WritePacket { dest: p.dest, flags: p.flags, addr: p.addr, data: &p.data };
        match self.uplink.send(&w) {
            Ok(()) => {
                self.shared.tx_packets.fetch_add(1, Ordering::Relaxed);
            }
            // Link down: the store is lost, as on a cable that is unplugged.
            Err(_) => self.shared.raise_error(err::LINK_DOWN),
        }
    }

    /// Sends the packet being built and everything queued for the hub.
    fn flush_link(&mut self) {
        self.flush_pending();
        self.uplink.flush();
    }

    /// A store of `data` at transmit-window offset `off`.
    fn tx_store(&mut self, off: u64, data: &[u8]) {
        let mut at = off;
        let mut rest = data;
        while !rest.is_empty() {
            let page = at / PAGE_SIZE;
            let n = rest.len().min((PAGE_SIZE - at % PAGE_SIZE) as usize);
            let w0 = self.shared.pct_word(page, 0);
            let p2p = w0 & pct::P2P != 0;
            let dest = if p2p { ((w0 >> pct::DEST_SHIFT) & pct::DEST_MASK) as u16 } else { BROADCAST };
            if w0 & pct::TX == 0 {
                self.shared.raise_error(err::TX_DISABLED);
            } else if p2p && dest as u32 >= self.shared.ports() {
                // Checked before anything else: dest 0xFFFF must not become a broadcast.
                self.shared.raise_error(err::TX_DEST);
            } else {
                let mut flags = 0;
                if w0 & pct::LOOPBACK != 0 {
                    flags |= FLAG_LOOPBACK;
                }
                if w0 & pct::ACK != 0 {
                    flags |= FLAG_ACK;
                }
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
            at += n as u64;
            rest = &rest[n..];
        }
    }

    fn regs_read(&self, off: u64, data: &mut [u8]) {
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

    fn regs_write(&mut self, off: u64, data: &[u8]) {
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
            reg::CTRL if v & regs::ctrl::RESET != 0 => self.reset(),
            _ => debug!(off, v, "write to read-only register ignored"),
        }
    }

    fn pct_read(&self, off: u64, data: &mut [u8]) {
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

    fn pct_write(&mut self, off: u64, data: &[u8]) {
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

impl Device for Adapter {
    fn region_info(&self, index: u32) -> RegionInfo {
        let rw = region_flags::READ | region_flags::WRITE;
        match index {
            regs::BAR_REGS => RegionInfo { size: regs::REGS_SIZE, flags: rw },
            regs::BAR_PCT => RegionInfo { size: Self::pct_bar_size(self.shared.pages), flags: rw },
            regs::BAR_TX => RegionInfo { size: self.shared.pages * PAGE_SIZE, flags: rw },
            region::CONFIG => RegionInfo { size: CONFIG_SIZE, flags: rw },
            _ => RegionInfo::default(),
        }
    }

    fn irq_count(&self, index: u32) -> u32 {
        match index {
            vfio_user::irq::INTX | vfio_user::irq::ERR => 1,
            vfio_user::irq::MSIX => MSIX_VECTORS,
            _ => 0,
        }
    }

    fn region_read(&mut self, index: u32, offset: u64, data: &mut [u8]) -> Result<(), Errno> {
        if index != regs::BAR_TX {
            // Anything but a store ends the current packet (bounds its delay).
            self.flush_link();
        }
        match index {
            regs::BAR_REGS => self.regs_read(offset, data),
            regs::BAR_PCT => self.pct_read(offset, data),
            regs::BAR_TX => {
                // Master abort: all ones and an error bit, never a hang.
                data.fill(0xFF);
                self.shared.raise_error(err::TX_READ);
            }
            region::CONFIG => self.config.read(offset, data),
            _ => return Err(Errno(libc::EINVAL)),
        }
        Ok(())
    }

    fn region_write(&mut self, index: u32, offset: u64, data: &[u8]) -> Result<(), Errno> {
        match index {
            regs::BAR_REGS => {
                self.flush_link();
                self.regs_write(offset, data)
            }
            regs::BAR_PCT => self.pct_write(offset, data),
            regs::BAR_TX => self.tx_store(offset, data),
            region::CONFIG => {
                self.config.write(offset, data);
                self.shared.bus_master.store(self.config.bus_master(), Ordering::Release);
            }
            _ => return Err(Errno(libc::EINVAL)),
        }
        Ok(())
    }

    fn dma_map(&mut self, iova: u64, size: u64, fd: Option<OwnedFd>, offset: u64, flags: u32) -> Result<(), Errno> {
        let writable = flags & vfio_user::dma_flags::WRITE != 0;
        self.shared.dma.map(iova, size, fd, offset, writable).map_err(|e| {
            warn!("DMA_MAP refused: {e}");
            Errno(libc::EINVAL)
        })
    }

    fn dma_unmap(&mut self, iova: u64, size: u64, all: bool) -> Result<(), Errno> {
        if all {
            self.shared.dma.clear();
        } else {
            self.shared.dma.unmap(iova, size);
        }
        Ok(())
    }

    fn set_irqs(&mut self, req: IrqSet) -> Result<(), Errno> {
        use vfio_user::irq::*;
        let mut irq = self.shared.irq.lock().unwrap();
        let action = req.flags & (ACTION_MASK | ACTION_UNMASK | ACTION_TRIGGER);
        let eventfds = req.flags & DATA_EVENTFD != 0;
        let range = req.start as usize..(req.start + req.count) as usize;
        debug!(
            index = req.index,
            flags = req.flags,
            start = req.start,
            count = req.count,
            fds = req.fds.len(),
            "SET_IRQS"
        );
        match (req.index, action) {
            (INTX, ACTION_TRIGGER) if eventfds => irq.intx = req.fds.into_iter().next().map(File::from),
            (INTX, ACTION_TRIGGER) if req.count == 0 => irq.intx = None,
            (INTX, ACTION_TRIGGER) => {
                if let Some(f) = &irq.intx {
                    kick(f);
                }
            }
            (INTX, ACTION_MASK) => irq.intx_masked = true,
            (INTX, ACTION_UNMASK) if eventfds => {} // resample fds: not needed, we re-assert on unmask
            (INTX, ACTION_UNMASK) => {
                irq.intx_masked = false;
                if irq.pending() != 0 {
                    irq.signal();
                }
            }
            (MSIX, ACTION_TRIGGER) if eventfds => {
                let mut fds = req.fds.into_iter().map(File::from);
                for v in range {
                    irq.msix[v] = fds.next();
                }
            }
            (MSIX, ACTION_TRIGGER) if req.count == 0 => irq.msix.iter_mut().for_each(|f| *f = None),
            (MSIX, ACTION_TRIGGER) => {
                for v in range {
                    if let Some(f) = &irq.msix[v] {
                        kick(f);
                    }
                }
            }
            (MSIX, ACTION_MASK) | (MSIX, ACTION_UNMASK) => {
                let masked = action == ACTION_MASK;
                for v in range {
                    irq.msix_masked[v] = masked;
                    if !masked && std::mem::take(&mut irq.msix_pending[v]) {
                        if let Some(f) = &irq.msix[v] {
                            kick(f);
                        }
                    }
                }
            }
            (ERR, ACTION_TRIGGER) if eventfds => irq.err = req.fds.into_iter().next().map(File::from),
            _ => {}
        }
        Ok(())
    }

    fn reset(&mut self) {
        // Stores the guest made before the reset still go out.
        self.flush_link();
        self.shared.reset();
        info!("adapter reset");
    }

    fn idle(&mut self) {
        self.flush_link();
    }

    fn batch_limit(&mut self) {
        // Complete packets go out; the one being built is bounded by its
        // page and goes out when full, on a page change or when idle.
        self.uplink.flush();
    }

    fn disconnected(&mut self) {
        self.shared.dma.clear();
        let mut irq = self.shared.irq.lock().unwrap();
        irq.intx = None;
        irq.msix.iter_mut().for_each(|f| *f = None);
        irq.err = None;
        irq.unmask_all();
    }
}
