//! The MEMORY CHANNEL adapter: register file, page control table, transmit
//! window and receive DMA, behind the [`Device`] trait.
//!
//! Two threads touch an adapter:
//! - the vfio-user thread (QEMU's requests, in order): register and PCT
//!   accesses, transmit-window stores, which become `Write` packets to the hub;
//! - the receive thread: ordered `Deliver` packets from the hub, applied to
//!   guest memory through the DMA maps in the order they arrive.
//!
//! What both need lives in [`Shared`], as atomics (the PCT, counters, error
//! bits) or behind the [`DmaSpace`] lock. The receive thread never blocks on
//! the vfio-user thread and never writes guest memory outside a DMA map.

use std::io::{self, BufWriter, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mc_hub::client;
use mc_hub::link::{self, LinkError, Msg, ANY_NODE, BROADCAST, FLAG_LOOPBACK, MAX_DATA};
use tracing::{debug, info, warn};

use crate::dma::DmaSpace;
use crate::pci::{ConfigSpace, CONFIG_SIZE};
use crate::regs::{self, err, pct, reg, PAGE_SIZE};
use crate::vfio_user::{self, region, region_flags, Device, Errno, IrqSet, RegionInfo};

/// Node id value of `NODE` while the adapter has not joined a hub.
pub const NO_NODE: u32 = 0xFFFF;

/// How the adapter is set up.
#[derive(Debug, Clone)]
pub struct AdapterConfig {
    /// Size of the MEMORY CHANNEL address space in bytes (multiple of the page size).
    pub aspace: u64,
    /// Hub socket.
    pub hub: PathBuf,
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
            hub: PathBuf::from("mc-hub.sock"),
            want_node: ANY_NODE,
            name: String::from("adapter"),
            hub_wait: Duration::from_secs(10),
        }
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
    link_up: AtomicBool,
    err_status: AtomicU32,
    err_count: AtomicU32,
    members: AtomicU64,
    tx_packets: AtomicU64,
    rx_packets: AtomicU64,
    rx_dropped: AtomicU64,
    /// Next sequence number expected from the hub (gap detection).
    next_seq: AtomicU64,
    irqs: Mutex<Irqs>,
}

#[derive(Default)]
struct Irqs {
    intx: Option<OwnedFd>,
    intx_masked: bool,
}

impl Shared {
    fn new(pages: u64) -> Self {
        Shared {
            pages,
            pct: (0..pages * 2).map(|_| AtomicU64::new(0)).collect(),
            dma: DmaSpace::new(),
            node: AtomicU32::new(NO_NODE),
            link_up: AtomicBool::new(false),
            err_status: AtomicU32::new(0),
            err_count: AtomicU32::new(0),
            members: AtomicU64::new(0),
            tx_packets: AtomicU64::new(0),
            rx_packets: AtomicU64::new(0),
            rx_dropped: AtomicU64::new(0),
            next_seq: AtomicU64::new(0),
            irqs: Mutex::new(Irqs::default()),
        }
    }

    /// Latches error bits and counts one error.
    pub fn raise_error(&self, bits: u32) {
        self.err_status.fetch_or(bits, Ordering::SeqCst);
        let _ = self.err_count.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |c| c.checked_add(1));
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

    /// Reads a 32-bit register.
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
            reg::TX_PACKETS => self.tx_packets.load(Ordering::Relaxed) as u32,
            reg::RX_PACKETS => self.rx_packets.load(Ordering::Relaxed) as u32,
            reg::RX_DROPPED => self.rx_dropped.load(Ordering::Relaxed) as u32,
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

    /// Applies one ordered write from the hub to guest memory, page by page.
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
            } else {
                let base = self.pct_word(page, 1);
                match base.checked_add(in_page).map(|iova| self.dma.write(iova, &rest[..n])) {
                    Some(Ok(())) => {
                        self.rx_packets.fetch_add(1, Ordering::Relaxed);
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

    fn reset(&self) {
        for w in self.pct.iter() {
            w.store(0, Ordering::Release);
        }
        self.err_status.store(if self.link_up.load(Ordering::SeqCst) { 0 } else { err::LINK_DOWN }, Ordering::SeqCst);
        self.err_count.store(0, Ordering::SeqCst);
        self.tx_packets.store(0, Ordering::Relaxed);
        self.rx_packets.store(0, Ordering::Relaxed);
        self.rx_dropped.store(0, Ordering::Relaxed);
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
    link: Option<BufWriter<UnixStream>>,
    pending: Option<Pending>,
}

impl Adapter {
    /// Creates an adapter with no hub link (tests attach one with [`Adapter::attach_link`]).
    pub fn new(aspace: u64) -> io::Result<Adapter> {
        if !(regs::MIN_ASPACE..=regs::MAX_ASPACE).contains(&aspace)
            || aspace % PAGE_SIZE != 0
            || !aspace.is_power_of_two()
        {
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
        shared.err_status.store(err::LINK_DOWN, Ordering::SeqCst);
        Ok(Adapter { config: ConfigSpace::new(Self::pct_bar_size(pages), aspace), shared, link: None, pending: None })
    }

    fn pct_bar_size(pages: u64) -> u64 {
        (pages * pct::ENTRY).next_power_of_two().max(4096)
    }

    /// State shared with the receive thread.
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Joins the hub at `cfg.hub`, retrying for `cfg.hub_wait`, and starts the receive thread.
    pub fn connect(&mut self, cfg: &AdapterConfig) -> io::Result<()> {
        let deadline = Instant::now() + cfg.hub_wait;
        let (joined, reader, writer) = loop {
            match client::join(&cfg.hub, cfg.want_node, PAGE_SIZE as u32, self.shared.pages as u32, &cfg.name) {
                Ok(j) => break j,
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused && e.to_string().starts_with("hub refused") => {
                    return Err(e)
                }
                Err(e) if Instant::now() < deadline => {
                    debug!("hub not reachable yet: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => {
                    return Err(io::Error::new(e.kind(), format!("cannot reach hub at {}: {e}", cfg.hub.display())))
                }
            }
        };
        info!(node = joined.node, ports = joined.max_nodes, members = ?joined.members, "joined hub");
        self.attach_link(joined, reader, writer);
        Ok(())
    }

    /// Uses an already-joined link (from [`client::join`]).
    pub fn attach_link(&mut self, joined: client::Joined, reader: UnixStream, writer: BufWriter<UnixStream>) {
        let s = &self.shared;
        s.node.store(joined.node as u32 | (joined.max_nodes as u32) << 16, Ordering::SeqCst);
        s.members.store(0, Ordering::SeqCst);
        for m in &joined.members {
            s.set_member(*m, true);
        }
        s.next_seq.store(joined.next_seq, Ordering::SeqCst);
        s.link_up.store(true, Ordering::SeqCst);
        s.err_status.fetch_and(!err::LINK_DOWN, Ordering::SeqCst);
        self.link = Some(writer);
        let shared = self.shared.clone();
        std::thread::Builder::new()
            .name("mc-rx".into())
            .spawn(move || receive_loop(shared, reader))
            .expect("spawn receive thread");
    }

    fn flush_pending(&mut self) {
        let Some(p) = self.pending.take() else { return };
        let Some(w) = self.link.as_mut() else {
            self.shared.raise_error(err::LINK_DOWN);
            return;
        };
        let frame = Msg::Write { dest: p.dest, flags: p.flags, addr: p.addr, data: &p.data }.encode();
        if let Err(e) = w.write_all(&frame) {
            self.link_lost(e);
            return;
        }
        self.shared.tx_packets.fetch_add(1, Ordering::Relaxed);
    }

    fn link_lost(&mut self, e: io::Error) {
        warn!("link to hub lost while sending: {e}");
        self.link = None;
        self.shared.link_up.store(false, Ordering::SeqCst);
        self.shared.raise_error(err::LINK_DOWN);
    }

    /// A store of `data` at transmit-window offset `off`.
    fn tx_store(&mut self, off: u64, data: &[u8]) {
        let mut at = off;
        let mut rest = data;
        while !rest.is_empty() {
            let page = at / PAGE_SIZE;
            let n = rest.len().min((PAGE_SIZE - at % PAGE_SIZE) as usize);
            let w0 = self.shared.pct_word(page, 0);
            if w0 & pct::TX == 0 {
                self.shared.raise_error(err::TX_DISABLED);
            } else {
                let dest =
                    if w0 & pct::P2P != 0 { ((w0 >> pct::DEST_SHIFT) & pct::DEST_MASK) as u16 } else { BROADCAST };
                let flags = if w0 & pct::LOOPBACK != 0 { FLAG_LOOPBACK } else { 0 };
                let chunk = &rest[..n];
                match self.pending.as_mut() {
                    Some(p)
                        if p.dest == dest
                            && p.flags == flags
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
        for (i, b) in data.iter_mut().enumerate() {
            let o = off + i as u64;
            *b = self.shared.reg_read(o & !3).to_le_bytes()[(o & 3) as usize];
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
        // Stores already made to the old mapping go out first.
        self.flush_pending();
        for (i, &b) in data.iter().enumerate() {
            let o = off + i as u64;
            let word = o / 8;
            if word >= self.shared.pages * 2 {
                continue;
            }
            let a = &self.shared.pct[word as usize];
            let mut bytes = a.load(Ordering::Acquire).to_le_bytes();
            bytes[(o % 8) as usize] = b;
            let mut v = u64::from_le_bytes(bytes);
            if word % 2 == 0 {
                v &= pct::WORD0_MASK;
            }
            a.store(v, Ordering::Release);
        }
    }
}

fn receive_loop(shared: Arc<Shared>, mut reader: UnixStream) {
    let mut buf = Vec::with_capacity(MAX_DATA + 64);
    let reason = loop {
        let hdr = match link::read_frame(&mut reader, &mut buf) {
            Ok(h) => h,
            Err(e) => break e.to_string(),
        };
        match Msg::parse(&hdr, &buf) {
            Ok(Msg::Deliver { seq, addr, data, .. }) => {
                let expect = shared.next_seq.swap(seq + 1, Ordering::SeqCst);
                if seq < expect {
                    warn!(seq, expect, "sequence went backwards");
                }
                shared.apply(addr, data);
            }
            Ok(Msg::Member { seq, node, up }) => {
                shared.next_seq.store(seq + 1, Ordering::SeqCst);
                info!(node, up, "membership change");
                shared.set_member(node, up);
            }
            Err(LinkError::BadCrc) => {
                // Framing is intact: count it, drop the packet, go on.
                shared.raise_error(err::CRC);
            }
            Ok(other) => break format!("unexpected {other:?} from hub"),
            Err(e) => break e.to_string(),
        }
    };
    warn!("link to hub down: {reason}");
    shared.link_up.store(false, Ordering::SeqCst);
    shared.members.store(0, Ordering::SeqCst);
    shared.raise_error(err::LINK_DOWN);
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
            vfio_user::irq::INTX => 1,
            _ => 0,
        }
    }

    fn region_read(&mut self, index: u32, offset: u64, data: &mut [u8]) -> Result<(), Errno> {
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
            regs::BAR_REGS => self.regs_write(offset, data),
            regs::BAR_PCT => self.pct_write(offset, data),
            regs::BAR_TX => self.tx_store(offset, data),
            region::CONFIG => self.config.write(offset, data),
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
        let mut irqs = self.shared.irqs.lock().unwrap();
        match (req.index, req.flags & (ACTION_MASK | ACTION_UNMASK | ACTION_TRIGGER)) {
            (INTX, ACTION_TRIGGER) if req.flags & DATA_EVENTFD != 0 => {
                irqs.intx = req.fds.into_iter().next();
            }
            (INTX, ACTION_TRIGGER) if req.count == 0 => irqs.intx = None,
            (INTX, ACTION_MASK) => irqs.intx_masked = true,
            (INTX, ACTION_UNMASK) => irqs.intx_masked = false,
            _ => {}
        }
        Ok(())
    }

    fn reset(&mut self) {
        self.pending = None;
        self.shared.reset();
        info!("adapter reset");
    }

    fn idle(&mut self) {
        self.flush_pending();
        if let Some(w) = self.link.as_mut() {
            if let Err(e) = w.flush() {
                self.link_lost(e);
            }
        }
    }

    fn disconnected(&mut self) {
        self.shared.dma.clear();
        *self.shared.irqs.lock().unwrap() = Irqs::default();
    }
}
