//! An adapter's whole state as one value, to hand a running adapter to
//! another process (`mc-hub`'s restart in place, `docs/hub.md`, "Hub
//! restart"): registers, page control table, error and traffic counters,
//! the transmit DMA engine's ring, interrupt state, PCI configuration
//! space, and the guest's DMA maps and interrupt eventfds.
//!
//! Fds travel as numbers ([`RawFds`]): [`Adapter::freeze`] gives up its
//! ownership of each (the caller keeps them open, across `exec` if it
//! likes), and [`Adapter::thaw`] takes ownership of the numbers it is given
//! after checking each is open.
//!
//! Called by whichever thread owns the adapter (a hub's port thread has
//! parked first); nothing else runs on the adapter meanwhile.

use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::txdma::EngineState;
use super::Adapter;
use crate::pci::CONFIG_SIZE;
use crate::regs::{self, MSIX_VECTORS, PAGE_SIZE};

/// Why an adapter could not be frozen or thawed.
#[derive(Debug, Error)]
pub enum SnapshotError {
    /// A DMA map's backing file could not be duplicated.
    #[error("guest memory map: {0}")]
    Dma(#[from] crate::dma::DmaError),
    /// The snapshot describes something this adapter model cannot be.
    #[error("snapshot refused: {0}")]
    Invalid(String),
    /// An fd the snapshot names is not open in this process.
    #[error("fd {0} named by the snapshot is not open")]
    ClosedFd(RawFd),
    /// The transmit DMA engine thread could not start.
    #[error("adapter: {0}")]
    Io(#[from] std::io::Error),
}

/// Fd numbers a snapshot owns (open in the process that holds it).
pub type RawFds = Vec<RawFd>;

/// One DMA map: `[iova, iova+size)`, backed by `fd` at `offset` (or not).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct MapState {
    iova: u64,
    size: u64,
    fd: Option<RawFd>,
    offset: u64,
    writable: bool,
}

/// Interrupt state and the eventfds QEMU gave.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct IrqState {
    cause: u32,
    mask: u32,
    fifo: Vec<u32>,
    lost: u32,
    intx: Option<RawFd>,
    intx_masked: bool,
    msix: Vec<Option<RawFd>>,
    msix_masked: Vec<bool>,
    msix_pending: Vec<bool>,
    err: Option<RawFd>,
}

/// A frozen adapter (see the module header).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct AdapterState {
    /// Pages of the MEMORY CHANNEL address space.
    pub pages: u64,
    /// Non-zero PCT words: (index, value).
    pct: Vec<(u64, u64)>,
    config: Vec<u8>,
    node: u32,
    home_node: u32,
    link_up: bool,
    err_status: u32,
    err_count: u32,
    members: u64,
    tx_packets: u64,
    rx_packets: u64,
    rx_dropped: u64,
    link_events: u32,
    last_seq: u64,
    next_seq: u64,
    txdma: EngineState,
    irq: IrqState,
    dma: Vec<MapState>,
}

impl AdapterState {
    /// The fds this state owns.
    pub fn fds(&self) -> RawFds {
        let irq = &self.irq;
        let maps = self.dma.iter().filter_map(|m| m.fd);
        irq.intx.into_iter().chain(irq.msix.iter().flatten().copied()).chain(irq.err).chain(maps).collect()
    }
}

/// Whether `fd` is an open fd of this process.
fn is_open(fd: RawFd) -> bool {
    fd >= 0 && nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFD).is_ok()
}

/// Ownership of fd number `fd`, if it is open (a hand-over's fds: this
/// module's, and the hub's restart in place).
///
/// # Safety
/// Nothing else in this process may own `fd`: the caller holds a hand-over
/// that names it, once ([`named_twice`] refused any other), and gave up
/// every other claim on it.
pub unsafe fn own_fd(fd: RawFd) -> Option<OwnedFd> {
    // SAFETY: the caller vouches that nothing else owns `fd`; it is open.
    is_open(fd).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

/// An fd number `fds` names more than once (it would be closed twice).
pub fn named_twice(fds: impl IntoIterator<Item = RawFd>) -> Option<RawFd> {
    let mut fds: Vec<RawFd> = fds.into_iter().collect();
    fds.sort_unstable();
    fds.windows(2).find(|w| w[0] == w[1]).map(|w| w[0])
}

/// Takes ownership of fd `fd`, after checking it is open.
fn own(fd: RawFd) -> Result<OwnedFd, SnapshotError> {
    // SAFETY: the snapshot owns `fd` (module header: freeze gave up its
    // ownership, nothing else closes it), and `thaw` takes each number once
    // (it refused a state with one `named_twice`).
    unsafe { own_fd(fd) }.ok_or(SnapshotError::ClosedFd(fd))
}

impl Adapter {
    /// Freezes this adapter: waits for the transmit DMA engine to go idle,
    /// flushes the packet being built, and returns its state. The adapter
    /// is gone; the fds in the state stay open (the caller owns them).
    pub fn freeze(mut self) -> Result<AdapterState, SnapshotError> {
        let sh = self.shared.clone();
        sh.txdma.wait_idle();
        self.flush_link();
        let dma = sh
            .dma
            .export()?
            .into_iter()
            .map(|m| {
                let (fd, offset) = match m.fd {
                    Some((fd, off)) => (Some(fd.into_raw_fd()), off),
                    None => (None, 0),
                };
                MapState { iova: m.iova, size: m.size, fd, offset, writable: m.writable }
            })
            .collect();
        let irq = {
            let mut g = sh.irq.lock().unwrap();
            IrqState {
                cause: g.cause,
                mask: g.mask,
                fifo: g.fifo.iter().copied().collect(),
                lost: g.lost,
                intx: g.intx.take().map(IntoRawFd::into_raw_fd),
                intx_masked: g.intx_masked,
                msix: g.msix.iter_mut().map(|f| f.take().map(IntoRawFd::into_raw_fd)).collect(),
                msix_masked: g.msix_masked.clone(),
                msix_pending: g.msix_pending.clone(),
                err: g.err.take().map(IntoRawFd::into_raw_fd),
            }
        };
        let pct = (0..sh.pct.len() as u64)
            .map(|i| (i, sh.pct[i as usize].load(Ordering::Acquire)))
            .filter(|&(_, v)| v != 0)
            .collect();
        Ok(AdapterState {
            pages: sh.pages,
            pct,
            config: self.config.raw().to_vec(),
            node: sh.node.load(Ordering::SeqCst),
            home_node: sh.home_node.load(Ordering::SeqCst),
            link_up: sh.link_up.load(Ordering::SeqCst),
            err_status: sh.err_status.load(Ordering::SeqCst),
            err_count: sh.err_count.load(Ordering::SeqCst),
            members: sh.members.load(Ordering::SeqCst),
            tx_packets: sh.tx_packets.load(Ordering::Relaxed),
            rx_packets: sh.rx_packets.load(Ordering::Relaxed),
            rx_dropped: sh.rx_dropped.load(Ordering::Relaxed),
            link_events: sh.link_events.load(Ordering::Relaxed),
            last_seq: sh.last_seq.load(Ordering::SeqCst),
            next_seq: sh.next_seq.load(Ordering::SeqCst),
            txdma: sh.txdma.export(),
            irq,
            dma,
        })
    }

    /// An adapter in the state `s` (from [`Adapter::freeze`], here or in
    /// the process that exec'd this one), owning the fds it names. Its
    /// uplink is unplugged until [`Adapter::set_uplink`]. Refuses (and
    /// leaves every fd open) a state this model could not have been in or
    /// one naming an fd that is not open; past those checks every fd is
    /// owned, and closed if a DMA map is refused.
    pub fn thaw(s: AdapterState) -> Result<Adapter, SnapshotError> {
        let bad = |why: String| Err(SnapshotError::Invalid(why));
        let aspace = s.pages.checked_mul(PAGE_SIZE).unwrap_or(0);
        if !(regs::MIN_ASPACE..=regs::MAX_ASPACE).contains(&aspace) || !aspace.is_power_of_two() {
            return bad(format!("{} pages", s.pages));
        }
        if s.config.len() != CONFIG_SIZE as usize {
            return bad(format!("configuration space of {} bytes", s.config.len()));
        }
        if let Some(&(i, _)) = s.pct.iter().find(|&&(i, _)| i >= s.pages * 2) {
            return bad(format!("PCT word {i} of {} pages", s.pages));
        }
        let v = MSIX_VECTORS as usize;
        if s.irq.msix.len() != v || s.irq.msix_masked.len() != v || s.irq.msix_pending.len() != v {
            return bad(format!("MSI-X state for other than {v} vectors"));
        }
        if let Some(fd) = named_twice(s.fds()) {
            return Err(SnapshotError::Invalid(format!("fd {fd} named twice")));
        }
        if let Some(fd) = s.fds().into_iter().find(|&fd| !is_open(fd)) {
            return Err(SnapshotError::ClosedFd(fd));
        }
        let a = Adapter::new(aspace)?;
        let sh = &a.shared;
        sh.txdma.import(&s.txdma).map_err(SnapshotError::Invalid)?;
        // From here on every fd is owned (closed if anything fails).
        let own_opt = |fd: Option<RawFd>| fd.map(own).transpose();
        let intx = own_opt(s.irq.intx)?;
        let err = own_opt(s.irq.err)?;
        let msix: Vec<_> = s.irq.msix.iter().map(|&f| own_opt(f)).collect::<Result<_, _>>()?;
        let maps: Vec<_> = s.dma.iter().map(|m| Ok((m, own_opt(m.fd)?))).collect::<Result<Vec<_>, SnapshotError>>()?;
        for (m, fd) in maps {
            sh.dma.map(m.iova, m.size, fd, m.offset, m.writable)?;
        }
        for &(i, v) in &s.pct {
            sh.pct[i as usize].store(v, Ordering::Release);
        }
        let mut a = a;
        a.config.set_raw(&s.config);
        let sh = a.shared.clone();
        sh.bus_master.store(a.config.bus_master(), Ordering::Release);
        sh.node.store(s.node, Ordering::SeqCst);
        sh.home_node.store(s.home_node, Ordering::SeqCst);
        sh.link_up.store(s.link_up, Ordering::SeqCst);
        sh.err_status.store(s.err_status, Ordering::SeqCst);
        sh.err_count.store(s.err_count, Ordering::SeqCst);
        sh.members.store(s.members, Ordering::SeqCst);
        sh.tx_packets.store(s.tx_packets, Ordering::Relaxed);
        sh.rx_packets.store(s.rx_packets, Ordering::Relaxed);
        sh.rx_dropped.store(s.rx_dropped, Ordering::Relaxed);
        sh.link_events.store(s.link_events, Ordering::Relaxed);
        sh.last_seq.store(s.last_seq, Ordering::SeqCst);
        sh.next_seq.store(s.next_seq, Ordering::SeqCst);
        {
            let mut g = sh.irq.lock().unwrap();
            g.cause = s.irq.cause;
            g.mask = s.irq.mask;
            g.fifo = s.irq.fifo.into_iter().collect();
            g.lost = s.irq.lost;
            g.intx = intx.map(Into::into);
            g.intx_masked = s.irq.intx_masked;
            g.msix = msix.into_iter().map(|f| f.map(Into::into)).collect();
            g.msix_masked = s.irq.msix_masked;
            g.msix_pending = s.irq.msix_pending;
            g.err = err.map(Into::into);
        }
        Ok(a)
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use nix::sys::eventfd::{EfdFlags, EventFd};
    use nix::sys::memfd::{memfd_create, MemFdCreateFlag};

    use super::*;
    use crate::regs::pct;
    use crate::vfio_user::{dma_flags, irq, Device, IrqSet};

    const ASPACE: u64 = 16 << 20;

    fn guest_ram(len: u64) -> OwnedFd {
        let fd = memfd_create(c"ram", MemFdCreateFlag::MFD_ALLOW_SEALING | MemFdCreateFlag::MFD_CLOEXEC).unwrap();
        nix::unistd::ftruncate(&fd, len as i64).unwrap();
        fd
    }

    /// The state with its fd numbers left out (a thaw owns other numbers).
    fn without_fds(mut s: AdapterState) -> AdapterState {
        s.irq.intx = None;
        s.irq.err = None;
        s.irq.msix.iter_mut().for_each(|f| *f = None);
        s.dma.iter_mut().for_each(|m| m.fd = None);
        s
    }

    #[test]
    fn a_thawed_adapter_is_the_frozen_one_and_still_reaches_guest_memory_and_interrupts() {
        let mut a = Adapter::new(ASPACE).unwrap();
        let ram = guest_ram(1 << 20);
        let ram_view = ram.try_clone().unwrap();
        a.dma_map(0x10_0000, 1 << 20, Some(ram), 0, dma_flags::READ | dma_flags::WRITE).unwrap();
        let ev = EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK).unwrap();
        let ev_dup = ev.as_fd().try_clone_to_owned().unwrap();
        a.set_irqs(IrqSet {
            index: irq::MSIX,
            flags: irq::DATA_EVENTFD | irq::ACTION_TRIGGER,
            start: 0,
            count: 1,
            fds: vec![ev_dup],
            bools: Vec::new(),
        })
        .unwrap();
        // Page 3 receives into guest memory at 0x10_2000; page 5 transmits.
        a.region_write(regs::BAR_PCT, 3 * pct::ENTRY, &(pct::RX | pct::INT).to_le_bytes()).unwrap();
        a.region_write(regs::BAR_PCT, 3 * pct::ENTRY + 8, &0x10_2000u64.to_le_bytes()).unwrap();
        a.region_write(regs::BAR_PCT, 5 * pct::ENTRY, &pct::TX.to_le_bytes()).unwrap();
        // Bus master on (no receive DMA without it): kept in configuration space.
        a.region_write(crate::vfio_user::region::CONFIG, 4, &6u16.to_le_bytes()).unwrap();
        a.region_write(regs::BAR_REGS, regs::reg::INT_MASK, &u32::MAX.to_le_bytes()).unwrap();
        a.plugged_in_at_power_on();
        let frozen = a.freeze().unwrap();
        assert_eq!(frozen.fds().len(), 2, "the MSI-X eventfd and the guest memory: {:?}", frozen.fds());

        let mut b = Adapter::thaw(frozen.clone()).unwrap();
        // A delivery to page 3 lands in guest memory and interrupts.
        let sh = b.shared();
        sh.link_up(&crate::uplink::LinkInfo { node: 1, max_nodes: 8, members: vec![0, 1], next_seq: 1 });
        while ev.read().is_ok() {}
        let _ = sh.deliver(1, 0, 0, 3 * PAGE_SIZE + 16, b"thawed!!");
        let mut page = vec![0u8; 0x2000 + 24];
        nix::sys::uio::pread(&ram_view, &mut page, 0).unwrap();
        assert_eq!(&page[0x2000 + 16..0x2000 + 24], b"thawed!!");
        assert!(ev.read().is_ok(), "no interrupt through the thawed MSI-X eventfd");
        // Everything else is as it was (the link came up in between: put back).
        sh.link_down("test");
        let mut pct_word = [0u8; 8];
        b.region_read(regs::BAR_PCT, 5 * pct::ENTRY, &mut pct_word).unwrap();
        assert_eq!(u64::from_le_bytes(pct_word), pct::TX);
        let again = b.freeze().unwrap();
        assert_eq!(without_fds(again.clone()).pct, without_fds(frozen.clone()).pct);
        assert_eq!(without_fds(again).config, without_fds(frozen).config);
    }

    #[test]
    fn a_snapshot_naming_a_closed_or_doubled_fd_or_a_wrong_shape_is_refused() {
        let a = Adapter::new(ASPACE).unwrap();
        let mut s = a.freeze().unwrap();
        s.irq.intx = Some(1_000_000);
        assert!(matches!(Adapter::thaw(s.clone()), Err(SnapshotError::ClosedFd(1_000_000))));
        s.irq.intx = Some(0);
        s.irq.err = Some(0);
        assert!(matches!(Adapter::thaw(s.clone()), Err(SnapshotError::Invalid(m)) if m.contains("fd 0 named twice")));
        s.irq.intx = None;
        s.irq.err = None;
        s.pages = 3;
        assert!(matches!(Adapter::thaw(s.clone()), Err(SnapshotError::Invalid(m)) if m.contains("3 pages")));
        s.pages = ASPACE / PAGE_SIZE;
        s.pct.push((s.pages * 2, 1));
        assert!(matches!(Adapter::thaw(s), Err(SnapshotError::Invalid(m)) if m.contains("PCT word")));
    }
}
