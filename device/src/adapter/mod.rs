//! The MEMORY CHANNEL adapter: register file, page control table, transmit
//! window, receive DMA, interrupts and ACK pages, behind the [`Device`] trait.
//!
//! Three kinds of thread touch an adapter:
//! - its vfio-user thread (QEMU's requests, in order): register and PCT
//!   accesses and transmit-window stores, which become write packets handed
//!   to the adapter's [`Uplink`];
//! - whoever delivers ordered writes: on a hub's local port, the vfio-user
//!   thread of whichever guest made the write (under the hub's order lock);
//!   on a link port, the link's receive thread ([`crate::remote`]). It calls
//!   [`Shared::deliver`], which applies the bytes to guest memory through the
//!   DMA maps, and returns ACK answers for the deliverer to send;
//! - its transmit DMA engine thread (`txdma`), which sends what the
//!   descriptors the guest posted name, into the same uplink.
//!
//! What both need lives in [`Shared`]: atomics for the PCT and counters and
//! a mutex for the interrupt state (taken last, never held across anything
//! that waits). A deliverer never waits for the vfio-user thread, and never
//! writes guest memory outside a DMA map.

pub mod faults;
mod irq;
mod registers;
mod rx;
mod snapshot;
pub mod trace;
mod tx;
mod txdma;

pub use self::snapshot::{named_twice, own_fd, AdapterState, RawFds, SnapshotError};

use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use link::ANY_NODE;
use tracing::{info, warn};

use self::faults::{Fault, FaultCounts, Faults};
use self::irq::Irq;
use self::trace::{Event, Tracer};
use self::tx::Pending;
use self::txdma::TxDma;
use crate::dma::DmaSpace;
use crate::link_client::HubAddr;
use crate::pci::{ConfigSpace, Interrupts, CONFIG_SIZE};
use crate::regs::{self, err, int, pct, MSIX_VECTORS, PAGE_SIZE};
use crate::uplink::{AckReply, Downlink, LinkInfo, Unplugged, Uplink};
use crate::vfio_user::{self, region, region_flags, Device, Errno, IrqSet, RegionInfo};

/// Node id value of `NODE` while the adapter is not joined to a hub.
pub use crate::regs::NO_NODE;

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
    /// The transmit DMA engine's ring and counters.
    txdma: TxDma,
    irq: Mutex<Irq>,
    /// The register trace.
    trace: Arc<Tracer>,
    /// Faults injected for the driver's error paths.
    faults: Arc<Faults>,
}

impl Shared {
    fn new(pages: u64) -> Self {
        let trace = Arc::new(Tracer::default());
        let faults = Arc::new(Faults::default());
        Shared {
            pages,
            pct: (0..pages * 2).map(|_| AtomicU64::new(0)).collect(),
            dma: DmaSpace::new(),
            node: AtomicU32::new(regs::NODE_RESET),
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
            txdma: TxDma::new(),
            irq: Mutex::new(Irq {
                msix: (0..MSIX_VECTORS).map(|_| None).collect(),
                msix_masked: vec![false; MSIX_VECTORS as usize],
                msix_pending: vec![false; MSIX_VECTORS as usize],
                trace: trace.clone(),
                faults: faults.clone(),
                ..Irq::default()
            }),
            trace,
            faults,
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
        regs::node_id(self.node.load(Ordering::SeqCst))
    }

    fn ports(&self) -> u32 {
        self.node.load(Ordering::SeqCst) >> 16
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

    /// The link went down: no node id (the port count stays in `NODE`), no
    /// members, LINK_DOWN and the LINK cause.
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

    /// CTRL.RESET and DEVICE_RESET: everything `docs/adapter.md` ("Reset")
    /// lists. Not the node id, link, membership or LAST_SEQ (the cluster's
    /// state, not this adapter's), nor PCI configuration space.
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
        self.txdma.reset();
        let mut irq = self.irq.lock().unwrap();
        irq.cause = 0;
        irq.mask = 0;
        irq.fifo.clear();
        irq.lost = 0;
        irq.unmask_all();
    }
}

impl Downlink for Shared {
    fn deliver(&self, seq: u64, src: u16, flags: u16, addr: u64, data: &[u8]) -> Option<AckReply> {
        Shared::deliver(self, seq, src, flags, addr, data)
    }
    fn bad_crc(&self) {
        Shared::bad_crc(self)
    }
    fn member(&self, seq: u64, node: u16, up: bool) {
        Shared::member(self, seq, node, up)
    }
    fn link_up(&self, info: &LinkInfo) {
        Shared::link_up(self, info)
    }
    fn link_down(&self, reason: &str) {
        Shared::link_down(self, reason)
    }
}

/// A view of an adapter for the process serving it (the hub's monitor and
/// control): its counters, its trace, its injected faults; valid as long
/// as the view is held.
#[derive(Clone)]
pub struct Counters(Arc<Shared>);

impl Counters {
    /// Transmit DMA descriptors retired and bytes sent since the adapter's
    /// last reset (DMA_DESCS, DMA_BYTES).
    pub fn dma(&self) -> (u32, u64) {
        self.0.txdma.totals()
    }

    /// The adapter's register trace.
    pub fn tracer(&self) -> Arc<Tracer> {
        self.0.trace.clone()
    }

    /// Arms fault `f` ([`faults`]); an `Error` fault raises its bits now.
    pub fn inject(&self, f: &Fault) -> Result<(), String> {
        self.0.faults.arm(f)?;
        if let Fault::Error { bits } = *f {
            self.0.raise_error(bits);
        }
        Ok(())
    }

    /// Injected faults that took effect.
    pub fn faults(&self) -> FaultCounts {
        self.0.faults.counts()
    }
}

/// The adapter device.
pub struct Adapter {
    shared: Arc<Shared>,
    config: ConfigSpace,
    pending: Option<Pending>,
    uplink: Arc<dyn Uplink>,
    /// The transmit DMA engine's thread.
    engine: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Adapter {
    fn drop(&mut self) {
        self.shared.txdma.shutdown();
        if let Some(t) = self.engine.take() {
            let _ = t.join();
        }
    }
}

impl Adapter {
    /// CTRL.RESET, and the work of a DEVICE_RESET: `docs/adapter.md`, "Reset".
    fn reset_adapter(&mut self) {
        // Stores the guest made before the reset still go out; a transfer
        // in progress stops at its next page.
        self.flush_link();
        let cut = self.shared.txdma.abort();
        self.shared.reset();
        if cut {
            // Counted after the clearing, so the driver learns of it.
            self.shared.dma_failed(regs::dma::status::ABORTED);
        }
        info!("adapter reset");
    }

    /// Its counters, for the process serving it.
    pub fn counters(&self) -> Counters {
        Counters(self.shared.clone())
    }

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
        let s = shared.clone();
        let engine = std::thread::Builder::new().name("mc-txdma".into()).spawn(move || txdma::run(s))?;
        Ok(Adapter {
            config: ConfigSpace::new(Self::pct_bar_size(pages), aspace),
            shared,
            pending: None,
            uplink: Arc::new(Unplugged),
            engine: Some(engine),
        })
    }

    /// Offers interrupt capability `irq` (before a guest driver looks:
    /// the configuration space is rebuilt in its reset state).
    pub fn set_interrupts(&mut self, irq: Interrupts) {
        let pages = self.shared.pages;
        self.config = ConfigSpace::with_interrupts(Self::pct_bar_size(pages), pages * PAGE_SIZE, irq);
    }

    /// The interrupt capability offered.
    pub fn interrupts(&self) -> Interrupts {
        self.config.interrupts()
    }

    fn pct_bar_size(pages: u64) -> u64 {
        (pages * pct::ENTRY).next_power_of_two().max(4096)
    }

    /// The state deliverers use (a hub's local port keeps it).
    pub fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    /// The receiving side of the adapter's cable, for a deliverer that
    /// should see nothing else of it (a hub's local port).
    pub fn downlink(&self) -> Arc<dyn Downlink> {
        self.shared.clone()
    }

    /// Powered on with the cable plugged in: no link error is latched, as
    /// there is when an adapter starts unplugged.
    pub fn plugged_in_at_power_on(&self) {
        self.shared.err_status_clear(err::LINK_DOWN);
    }

    /// Plugs the adapter's cable in: its writes go to `uplink` from now on.
    pub fn set_uplink(&mut self, uplink: Arc<dyn Uplink>) {
        self.flush_pending();
        self.shared.txdma.set_uplink(uplink.clone());
        self.uplink = uplink;
    }

    /// The adapter's register trace (`trace`).
    pub fn tracer(&self) -> Arc<Tracer> {
        self.shared.trace.clone()
    }

    /// Waits until the transmit DMA engine has retired what the guest
    /// posted and sent it into the uplink.
    pub fn wait_tx_idle(&self) {
        self.shared.txdma.wait_idle();
    }

    // `connect` and `attach_link` (a link port to a hub in another
    // process) are in `crate::remote`, which builds on this module.
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
            vfio_user::irq::MSIX if self.interrupts() == Interrupts::MsiX => MSIX_VECTORS,
            vfio_user::irq::MSI if self.interrupts() == Interrupts::Msi => MSIX_VECTORS,
            _ => 0,
        }
    }

    fn region_read(&mut self, index: u32, offset: u64, data: &mut [u8]) -> Result<(), Errno> {
        if index != regs::BAR_TX {
            // Anything but a store ends the current packet (bounds its delay).
            self.flush_link();
        }
        match index {
            regs::BAR_REGS => {
                self.regs_read(offset, data);
                if self.shared.faults.dead_read() {
                    data.fill(0xFF);
                }
                self.shared.trace.record(|| Event::Reg { write: false, off: offset, value: le(data) as u32 });
            }
            regs::BAR_PCT => {
                self.pct_read(offset, data);
                if self.shared.faults.dead_read() {
                    data.fill(0xFF);
                }
                trace_pct(&self.shared.trace, false, offset, data);
            }
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
        let t = &self.shared.trace;
        match index {
            regs::BAR_REGS => t.record(|| Event::Reg { write: true, off: offset, value: le(data) as u32 }),
            regs::BAR_PCT => trace_pct(t, true, offset, data),
            regs::BAR_TX => t.record(|| Event::Tx {
                page: offset / PAGE_SIZE,
                off: offset % PAGE_SIZE,
                len: data.len() as u32,
                value: (data.len() <= 8).then(|| le(data)),
            }),
            _ => {}
        }
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
        self.shared.trace.record(|| Event::DmaMap { iova, size, writable });
        self.shared.dma.map(iova, size, fd, offset, writable).map_err(|e| {
            warn!("DMA_MAP refused: {e}");
            Errno(libc::EINVAL)
        })
    }

    fn dma_unmap(&mut self, iova: u64, size: u64, all: bool) -> Result<(), Errno> {
        self.shared.trace.record(|| Event::DmaUnmap { iova, size, all });
        if all {
            self.shared.dma.clear();
        } else {
            self.shared.dma.unmap(iova, size);
        }
        Ok(())
    }

    fn set_irqs(&mut self, req: IrqSet) -> Result<(), Errno> {
        use vfio_user::irq::{ACTION_MASK, ACTION_UNMASK};
        if req.flags & (ACTION_MASK | ACTION_UNMASK) != 0 {
            let masked = req.flags & ACTION_MASK != 0;
            self.shared.trace.record(|| Event::IrqMask { index: req.index, masked });
        }
        self.shared.irq.lock().unwrap().set_irqs(req);
        Ok(())
    }

    /// The vfio-user DEVICE_RESET (QEMU resetting the device): traced as
    /// `RESET`; CTRL.RESET shows as its register write.
    fn reset(&mut self) {
        self.shared.trace.record(|| Event::Reset);
        self.reset_adapter();
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
        // A transfer in progress stops before the maps it reads go away.
        if self.shared.txdma.abort() {
            self.shared.dma_failed(regs::dma::status::ABORTED);
        }
        self.shared.dma.clear();
        let mut irq = self.shared.irq.lock().unwrap();
        irq.intx = None;
        irq.msix.iter_mut().for_each(|f| *f = None);
        irq.err = None;
        irq.unmask_all();
    }
}

/// Up to 8 bytes as a little-endian number.
fn le(data: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = data.len().min(8);
    b[..n].copy_from_slice(&data[..n]);
    u64::from_le_bytes(b)
}

/// A PCT access at BAR 2 offset `offset`: one trace event per word it
/// touches (the bytes of that word it carries, in place).
fn trace_pct(t: &Tracer, write: bool, offset: u64, data: &[u8]) {
    if !t.is_on() || data.is_empty() {
        return;
    }
    let (first, last) = (offset / 8, (offset + data.len() as u64 - 1) / 8);
    for w in first..=last {
        let mut bytes = [0u8; 8];
        for (i, &b) in data.iter().enumerate() {
            let o = offset + i as u64;
            if o / 8 == w {
                bytes[(o % 8) as usize] = b;
            }
        }
        let value = u64::from_le_bytes(bytes);
        t.record(|| Event::Pct { write, page: w / 2, word: w % 2, value });
    }
}
