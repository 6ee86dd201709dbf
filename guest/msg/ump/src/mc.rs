//! The MEMORY CHANNEL transport: one region per half, keyed by the
//! handle pair; each side maps its own half for transmit only (no
//! loopback, as in the revised UMP) and the other half for receive.
//! Also the receive side of multicast: mapping senders' outbufs when a
//! record first points into one; and the transmit DMA engine's use by
//! UMP: the process's source area, cut into one slot per channel, holds
//! each writer's copy of its ring ([`ring::Shadow`]), and large pieces go
//! from there into the other side's ring by DMA. Called with the UMP
//! state locked (open, accept), from a channel's reader (the resolver)
//! and from its writer (the shadow, which opens the DMA area at its
//! first piece big enough for DMA, under the imcd connection's lock).

use rustc_hash::FxHashMap as HashMap;
use std::sync::{Arc, Mutex};

use imc_client::dma::{DmaError, DmaHandle, DmaPort, DmaTarget};
use imc_client::keys::Namespace;
use imc_client::{Imc, ImcError};

use crate::channel::{self, Channel, Transport};
use crate::mem::{RxWindow, Sink, Source, TxWindow};
use crate::probe::Prober;
use crate::{ring, State, UmpError};

/// MEMORY CHANNEL key of half `side` of the channel (lo, hi): a hash of
/// the pair in UMP's channel namespace (`imc_proto::keys`).
pub(crate) fn mc_key(lo: u64, hi: u64, side: u64) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for b in lo.to_le_bytes().into_iter().chain(hi.to_le_bytes()) {
        h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
    }
    Namespace::UmpChannel.key(h & !1 | side & 1)
}

/// A sender's outbuf, mapped for receive here.
pub(crate) struct OutbufIn {
    mem: Arc<dyn Source>,
    _id: u32,
}

/// Outbufs mapped for receive, by key (shared by the process's channels).
pub(crate) type OutbufsIn = Arc<Mutex<HashMap<u64, OutbufIn>>>;

/// Keeps the channel's regions: the attachments go with the windows, then
/// the allocations are released.
struct McKeep {
    imc: Arc<Mutex<Imc>>,
    ids: [u32; 2],
}

impl Drop for McKeep {
    fn drop(&mut self) {
        let imc = self.imc.lock().unwrap_or_else(|e| e.into_inner());
        for id in self.ids {
            let _ = imc.asdealloc(id);
        }
    }
}

/// The process's transmit DMA source area, one slot of a ring's size per
/// channel, then the spare the caller asked for ([`DmaSpare`]).
pub struct DmaArea {
    port: DmaPort,
    slot: usize,
    free: Mutex<Vec<bool>>,
    /// Where the spare starts, and its bytes.
    spare: (usize, usize),
}

/// Largest source area asked of imcd (its own limit is 16 MiB).
const DMA_AREA_MAX: usize = 16 << 20;

impl DmaArea {
    /// Opens the engine for this process: slots of `ring` bytes for up to
    /// `channels` channels (none: only the spare), within [`DMA_AREA_MAX`].
    fn open(imc: &Imc, ring: usize, channels: usize, spare: usize) -> Result<DmaArea, String> {
        let slots = channels.min(DMA_AREA_MAX.saturating_sub(spare) / ring);
        if slots == 0 && spare == 0 {
            return Err("no DMA slots and no spare were asked for".into());
        }
        let port = imc.dma_open((slots * ring + spare) as u64).map_err(|e| format!("imcd: {e}"))?;
        let len = port.buffer().len();
        if len < slots * ring + spare {
            return Err(format!("a DMA area of {len} bytes holds no {slots} rings of {ring} and {spare} spare"));
        }
        Ok(DmaArea { port, slot: ring, free: Mutex::new(vec![true; slots]), spare: (slots * ring, spare) })
    }

    fn take(&self) -> Option<usize> {
        let mut f = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let i = f.iter().position(|&x| x)?;
        f[i] = false;
        Some(i)
    }
}

/// A writer's copy of its ring in a slot of the DMA area: pieces of at
/// least `threshold` bytes go by DMA into `target` (our half), the rest
/// by stores.
struct DmaShadow {
    area: Arc<DmaArea>,
    index: usize,
    target: DmaTarget,
    threshold: usize,
}

impl DmaShadow {
    fn base(&self) -> usize {
        self.index * self.area.slot
    }
}

impl ring::Shadow for DmaShadow {
    fn keep(&mut self, pos: usize, src: &[u8]) {
        // Inside our slot: pos + len ≤ the ring, which is the slot's size.
        let _ = self.area.port.buffer().write(self.base() + pos, src);
    }
    fn get(&self, pos: usize, dst: &mut [u8]) {
        let _ = self.area.port.buffer().read(self.base() + pos, dst);
    }
    fn dma(&mut self, pos: usize, len: usize) -> bool {
        // A failed transfer loses bytes like a dropped frame: the reader
        // asks for them again. Not waiting for completion is safe: a slot
        // byte is rewritten only after the reader consumed it, so after
        // the transfer that carried it.
        self.threshold > 0
            && len >= self.threshold
            && self
                .area
                .port
                .start(&self.target, (ring::RING + pos) as u64, (self.base() + pos) as u64, len as u64)
                .is_ok()
    }
}

impl Drop for DmaShadow {
    fn drop(&mut self) {
        self.area.free.lock().unwrap_or_else(|e| e.into_inner())[self.index] = true;
    }
}

/// The process's DMA area, opened the first time (by a channel, or by
/// [`crate::dma_spare`]).
/// The process's DMA source area, opened the first time something needs
/// it: a channel's first piece big enough for DMA, or the spare. Opening
/// it maps every page of it for the adapter, 0.2 s (rings only) to 1.5 s
/// (with MPI's 8 MiB spare) under TCG on a busy host; at a channel's
/// open, that was most of a 4-guest `MPI_Init` (docs/ump.md, "Large
/// messages by transmit DMA"). Shared by the process's channels.
pub(crate) struct LazyArea {
    /// Ring bytes, slots and spare, from the process's configuration.
    open: (usize, usize, usize),
    area: std::sync::OnceLock<Result<Arc<DmaArea>, String>>,
}

impl LazyArea {
    pub(crate) fn new(cfg: &crate::Config) -> Arc<LazyArea> {
        let open = (cfg.mc_buffer, cfg.dma_slots.unwrap_or(cfg.max_channels), cfg.dma_spare);
        Arc::new(LazyArea { open, area: std::sync::OnceLock::new() })
    }

    /// The area, opening it through `imc` if nobody has (a failure is
    /// kept: it is not tried again).
    fn get(&self, imc: &Imc) -> Result<Arc<DmaArea>, String> {
        let (ring, channels, spare) = self.open;
        self.area.get_or_init(|| DmaArea::open(imc, ring, channels, spare).map(Arc::new)).clone()
    }

    /// Ok once opened, Err why it could not be, None before anything needed it.
    pub(crate) fn state(&self) -> Option<Result<(), String>> {
        self.area.get().map(|d| d.as_ref().map(|_| ()).map_err(Clone::clone))
    }
}

/// The spare part of the process's DMA source area ([`crate::Config::dma_spare`]):
/// memory the process reads and writes, that the adapter's engine can
/// send from ([`DmaSpare::start`]) and that a region can land in
/// ([`DmaSpare::land`]), so that what other nodes send to that region is
/// written straight into it. MPI's `MPI_Alloc_mem` hands it out.
#[derive(Clone)]
pub struct DmaSpare {
    area: Arc<DmaArea>,
    imc: Arc<Mutex<Imc>>,
}

impl DmaSpare {
    /// The spare's first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.area.port.buffer().as_ptr().wrapping_add(self.area.spare.0)
    }

    /// Its bytes.
    pub fn len(&self) -> usize {
        self.area.spare.1
    }

    /// Never true (a spare of 0 bytes is not handed out).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The imcd connection the area belongs to (regions to land or to
    /// send to are allocated and attached through it).
    pub fn imc(&self) -> std::sync::MutexGuard<'_, Imc> {
        self.imc.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Region `id` (which this process allocated, no bigger than the
    /// spare) lands at the spare's first byte from now on.
    pub fn land(&self, id: u32) -> Result<(), ImcError> {
        self.imc().dma_land(id, self.area.spare.0 as u64)
    }

    /// Starts sending `len` bytes at `src` (inside the spare) to byte
    /// `offset` of `target`. The bytes must stay unchanged until
    /// [`DmaSpare::test`] says the transfer is done; stores made after
    /// this returns reach every node after them.
    pub fn start(&self, target: &DmaTarget, offset: u64, src: *const u8, len: u64) -> Result<DmaHandle, DmaError> {
        let (base, size) = (self.as_ptr() as usize, self.len() as u64);
        let off = (src as usize).checked_sub(base).ok_or(DmaError::NotInArea)? as u64;
        if off.checked_add(len).is_none_or(|end| end > size) {
            return Err(DmaError::NotInArea);
        }
        self.area.port.start(target, offset, self.area.spare.0 as u64 + off, len)
    }

    /// A transfer's outcome: Some(bytes) once sent whole, None in flight.
    pub fn test(&self, h: &DmaHandle) -> Result<Option<u32>, DmaError> {
        self.area.port.test(h)
    }

    /// As [`DmaSpare::test`], and a transfer the engine dropped without
    /// retiring it is an error (`DmaPort::check`: reads a register).
    pub fn check(&self, h: &DmaHandle) -> Result<Option<u32>, DmaError> {
        self.area.port.check(h)
    }
}

/// The spare of the process's DMA area, opening the area if no channel has.
pub(crate) fn spare(st: &mut State) -> Result<DmaSpare, UmpError> {
    if st.cfg.dma_spare == 0 {
        return Err(UmpError::NoTransport("no DMA spare was asked for (UMP_DMA_SPARE)".into()));
    }
    let imc = st.imc.clone().ok_or_else(|| UmpError::NoTransport("transmit DMA needs imcd (not reachable)".into()))?;
    let c = imc.lock().unwrap_or_else(|e| e.into_inner());
    let area = st.dma.get(&c).map_err(|e| UmpError::NoTransport(format!("transmit DMA: {e}")))?;
    drop(c);
    Ok(DmaSpare { area, imc })
}

/// The copy a new channel's writer keeps: plain memory, moved into a slot
/// of the DMA area at the first piece big enough for DMA ([`LazyDma`])
/// when DMA is on.
fn shadow(st: &State, imc: &Arc<Mutex<Imc>>, mine: u32) -> Box<dyn ring::Shadow> {
    let size = st.cfg.mc_buffer;
    if st.cfg.dma_threshold == 0 {
        return Box::new(ring::MemCopy::new(size));
    }
    Box::new(LazyDma {
        copy: ring::MemCopy::new(size),
        area: st.dma.clone(),
        imc: imc.clone(),
        mine,
        threshold: st.cfg.dma_threshold,
        dma: None,
        without: false,
    })
}

/// A writer's copy of its ring that starts in plain memory and moves into
/// a slot of the DMA area ([`DmaShadow`]) the first time a piece is big
/// enough to go by DMA, opening the area if nobody has.
struct LazyDma {
    copy: ring::MemCopy,
    area: Arc<LazyArea>,
    imc: Arc<Mutex<Imc>>,
    /// Our half (the DMA target).
    mine: u32,
    threshold: usize,
    dma: Option<DmaShadow>,
    /// No area, no free slot or no target: stores for good.
    without: bool,
}

impl LazyDma {
    /// Takes a slot of the area (opening it) and moves the copy into it.
    fn upgrade(&mut self) {
        let imc = self.imc.lock().unwrap_or_else(|e| e.into_inner());
        let area = self.area.get(&imc);
        let target = imc.dma_target(self.mine);
        drop(imc);
        let (Ok(area), Ok(target)) = (area, target) else {
            self.without = true;
            return;
        };
        let Some(index) = area.take() else {
            self.without = true;
            return;
        };
        let mut d = DmaShadow { area, index, target, threshold: self.threshold };
        ring::Shadow::keep(&mut d, 0, self.copy.bytes());
        self.copy = ring::MemCopy::new(0);
        self.dma = Some(d);
    }
}

impl ring::Shadow for LazyDma {
    fn keep(&mut self, pos: usize, src: &[u8]) {
        match &mut self.dma {
            Some(d) => d.keep(pos, src),
            None => self.copy.keep(pos, src),
        }
    }
    fn get(&self, pos: usize, dst: &mut [u8]) {
        match &self.dma {
            Some(d) => d.get(pos, dst),
            None => self.copy.get(pos, dst),
        }
    }
    fn dma(&mut self, pos: usize, len: usize) -> bool {
        if len < self.threshold {
            return false;
        }
        if self.dma.is_none() && !self.without {
            self.upgrade();
        }
        self.dma.as_mut().is_some_and(|d| d.dma(pos, len))
    }
}

/// Opens our side of the MEMORY CHANNEL channel (local, remote).
pub(crate) fn open_mc(st: &mut State, local: u64, remote: u64) -> Result<Arc<Channel>, UmpError> {
    let imc =
        st.imc.clone().ok_or_else(|| UmpError::NoTransport("MEMORY CHANNEL needs imcd (not reachable)".into()))?;
    let (lo, hi) = (local.min(remote), local.max(remote));
    let side = u64::from(local > remote);
    let size = st.cfg.mc_buffer;
    let bytes = ring::half_len(size) as u64;
    let mut steps = crate::trace::Steps::new();
    let c = imc.lock().unwrap_or_else(|e| e.into_inner());
    let err = |e: ImcError| UmpError::NoTransport(format!("imcd: {e}"));
    let (mine, ..) = c.asalloc(mc_key(lo, hi, side), bytes, 0o666, false).map_err(err)?;
    steps.step("our half allocated");
    let (theirs, ..) = c.asalloc(mc_key(lo, hi, 1 - side), bytes, 0o666, false).map_err(err)?;
    steps.step("theirs");
    // Receive first: the other side's first writes must land here.
    let rx = c.asattach_rx(theirs).map_err(err)?;
    steps.step("attached for receive");
    let tx = c.asattach_tx(mine, false).map_err(err)?;
    steps.step("for transmit");
    drop(c);
    let copy = shadow(st, &imc, mine);
    steps.done(&format!("open over MEMORY CHANNEL {local:#x} -> {remote:#x}"));
    let (out, peer): (Arc<dyn Sink>, Arc<dyn Source>) =
        (Arc::new(TxWindow::new(Arc::new(tx))), Arc::new(RxWindow::new(Arc::new(rx))));
    let probe = st.prober.get_or_insert_with(Prober::start).probe();
    let alive: channel::Liveness = Box::new(move |who| if who as u32 == 0 { Ok(()) } else { probe.check(who) });
    let who = (st.node as u64) << 32 | std::process::id() as u64;
    let keep = McKeep { imc: imc.clone(), ids: [mine, theirs] };
    let ch = Channel::new(local, remote, Transport::Mc, size, out, peer, who, alive, Box::new(keep), Some(copy));
    install_resolver(st, &ch);
    Ok(ch)
}

/// Lets a channel's reads follow multicast records into the senders'
/// outbufs, mapping each outbuf (for receive) the first time.
fn install_resolver(st: &State, ch: &Channel) {
    let (Some(imc), cache) = (st.imc.clone(), st.outbufs_in.clone()) else { return };
    ch.set_resolver(Arc::new(move |key, size| {
        let mut c = cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(o) = c.get(&key) {
            return Some(o.mem.clone());
        }
        let i = imc.lock().unwrap_or_else(|e| e.into_inner());
        // The outbuf exists (its record came after it); finding it by key
        // also holds it for us while we read from it.
        let (id, ..) = i.asalloc_flags(key, size, 0o666, false, true).ok()?;
        let rx = i.asattach_rx(id).ok()?;
        let mem: Arc<dyn Source> = Arc::new(RxWindow::new(Arc::new(rx)));
        c.insert(key, OutbufIn { mem: mem.clone(), _id: id });
        Some(mem)
    }));
}
