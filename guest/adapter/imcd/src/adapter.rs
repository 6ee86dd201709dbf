//! [`AdapterHw`]: [`Hw`] on the real adapter, through the guest driver:
//! imcd's own pages in one receive buffer (`/dev/shm/imcd-meta`), one
//! receive buffer per received region (`/dev/shm/imc-region-<id>`, made
//! then or a spare renamed: [`crate::spares`]), the
//! page control table, the MSI-X interrupt, and the files processes map
//! (error count, ACK answers), and the transmit DMA set-up processes use
//! (the node's one descriptor ring, a source area per process; see
//! `docs/imc.md`, "Transmit DMA").
//!
//! Shared by imcd's main thread, mapper and `spares` thread; the region buffers and the DMA
//! state are behind mutexes, and every change of a PCT entry goes through
//! the driver's [`Adapter::update_page`] (both threads program entries).

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use guest_driver::guest_mem::{Mapping, ReadWrite};
use guest_driver::txdma::{DmaRing, DMA_RING_IOVA};
use guest_driver::{rx_buffer, Adapter, Interrupt, RX_IOVA_BASE};
use imc_proto::layout::{ACK_Q_PAGE, DIR_PAGE, DIR_PAGES, ERRCNT_PAGE, MAX_NODES, META_PAGES, RELAY_PAGE};
use imc_proto::{ACK_FILE, ERRCOUNT_FILE, ERRCOUNT_LEFT, ERRCOUNT_SUM};
use regs::{int, pct, reg, BAR_TX, NOTIFY_EMPTY, PAGE_SIZE};

use crate::bus::AdapterBus;
use crate::hw::{DmaArea, Handout, Hw, HwError, Notified, DMA_AREA_MAX};
use crate::regions::RegionDesc;
use crate::spares::{self, Spare, Spares};

fn iova(page: u64) -> u64 {
    RX_IOVA_BASE + page * PAGE_SIZE
}

fn mem(what: &str) -> impl FnOnce(guest_driver::guest_mem::MemError) -> HwError + '_ {
    move |e| HwError::Device(format!("{what}: {e}"))
}

fn os(what: &str) -> impl FnOnce(std::io::Error) -> HwError + '_ {
    move |err| HwError::Os { what: what.to_string(), err }
}

/// A region this node receives: its buffer, the buffer's file, first
/// page, the IOVA its buffer is mapped at, and the spare slot it came from.
struct Rx {
    buf: Mapping<ReadWrite>,
    path: PathBuf,
    first: u64,
    iova: u64,
    slot: Option<usize>,
}

/// The file of spare receive buffer slot `slot`.
fn spare_path(slot: usize) -> PathBuf {
    PathBuf::from(format!("/dev/shm/imcd-spare-{slot}"))
}

/// Waits until the guest has an adapter: after an unplug (docs/adapter.md,
/// "Surprise removal") the imcd that `/etc/keep-imcd` starts again waits
/// here for the adapter to be plugged back, and says so once.
fn wait_for_adapter() {
    let mut said = false;
    while let Err(guest_driver::vfio::VfioError::NotFound(ids)) =
        guest_driver::vfio::find_pci(regs::VENDOR_ID, regs::DEVICE_ID)
    {
        if !said {
            eprintln!("imcd: no MEMORY CHANNEL adapter (PCI {ids}): waiting for one to be plugged in");
            said = true;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    if said {
        eprintln!("imcd: an adapter was plugged in");
    }
}

/// Waits for the guest kernel's request to let the adapter go (it is
/// being unplugged: QMP `device_del`, `mc-cluster unplug`), then ends
/// imcd: its exit closes the device, and the processes that hold the
/// device files imcd handed out let go once they see imcd gone (mpid,
/// pvmd and UMP do within seconds). `/etc/keep-imcd` starts a new imcd,
/// which waits for an adapter and joins as a restarted node.
fn watch_release(req: Interrupt) {
    loop {
        match req.wait(Duration::from_secs(3600)) {
            Ok(0) => continue,
            Ok(_) => {
                eprintln!("imcd: the kernel asks for the adapter back (it is being unplugged): imcd ends to let it go");
                std::process::exit(0);
            }
            Err(e) => {
                eprintln!("imcd: waiting for the release request: {e}; an unplug waits until imcd stops");
                return;
            }
        }
    }
}

/// Removes the spare buffers' files an imcd that was killed left behind
/// (their DMA maps went with its VFIO container).
fn remove_stale_spares() {
    let Ok(dir) = std::fs::read_dir("/dev/shm") else { return };
    for e in dir.flatten() {
        if e.file_name().to_string_lossy().starts_with("imcd-spare-") {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Where the node's transmit DMA ring lives (root's only: processes get
/// an fd from imcd).
const DMA_RING_FILE: &str = "/dev/shm/imcd-dma-ring";
/// Descriptors in the ring: a retired descriptor's status stays readable
/// until this many more are posted on the node.
pub const DMA_RING_ENTRIES: u32 = 4096;
/// Source areas per node (one per process that asks).
const DMA_AREAS: usize = 64;

/// The page control table bits of a point-to-point page: P2P and its
/// destination node (`docs/adapter.md`, PCT word 0).
const P2P_BITS: u64 = pct::P2P | pct::DEST_MASK << pct::DEST_SHIFT;

/// Transmit DMA: the ring (set up on first use) and the clients' areas.
#[derive(Default)]
struct Dma {
    ring: Option<DmaRing<Arc<Adapter>>>,
    /// Per client: its slot (IOVA `src_base + slot * DMA_AREA_MAX`) and the area.
    areas: HashMap<u64, (usize, Mapping<ReadWrite>)>,
    /// Regions received into a client's area ([`Hw::dma_land`]), by id:
    /// the client, the first page and the pages.
    landed: HashMap<u32, (u64, u64, u64)>,
}

/// The real adapter, set up for imcd.
pub struct AdapterHw {
    a: Arc<Adapter>,
    me: usize,
    meta: Arc<Mapping<ReadWrite>>,
    errcount: Mapping<ReadWrite>,
    _ack_answers: Mapping<ReadWrite>,
    irq: Option<Interrupt>,
    tx_offset: u64,
    rx: Mutex<HashMap<u32, Rx>>,
    /// Receive buffers mapped ahead of need ([`crate::spares`]).
    spares: Spares<Mapping<ReadWrite>>,
    /// Regions with transmit enabled here: id -> (first page, pages).
    tx: Mutex<HashMap<u32, (u64, u64)>>,
    dma: Mutex<Dma>,
    /// NOTIFY_LOST when last read: a change means notifications were lost.
    notify_lost: AtomicU32,
}

impl AdapterHw {
    /// Drops region `id`'s receive buffer, if this node has one: receive
    /// (and transmit) off on its pages, the DMA mapping and the file gone.
    /// Pages in `keep` (a new region's, about to receive) keep transmit.
    fn drop_receive(&self, rx: &mut HashMap<u32, Rx>, id: u32, keep: std::ops::Range<u64>) {
        let Some(r) = rx.remove(&id) else { return };
        let a = &self.a;
        let pages = r.buf.len() as u64 / PAGE_SIZE;
        for p in r.first..r.first + pages {
            let off = if keep.contains(&p) { pct::RX | pct::INT } else { pct::RX | pct::TX | pct::LOOPBACK | pct::INT };
            a.update_page(p, |bits, iova| (bits & !off, iova));
        }
        let _ = a.dev.unmap_dma(r.iova, pages * PAGE_SIZE);
        drop(r.buf);
        let _ = std::fs::remove_file(r.path);
        if let Some(slot) = r.slot {
            self.spares.free(slot);
        }
    }

    /// IOVA of spare slot `slot`: above the transmit DMA source areas.
    fn spare_iova(&self, slot: usize) -> u64 {
        self.dma_src_base() + DMA_AREAS as u64 * DMA_AREA_MAX + slot as u64 * spares::MAX_PAGES * PAGE_SIZE
    }

    /// Keeps spare receive buffers ready until `stop` (the `spares` thread;
    /// see [`crate::spares`]).
    pub fn keep_spares(&self, stop: &AtomicBool) {
        let drop_spare = |s| self.drop_spare(s);
        let make = |slot, pages| {
            let buf = rx_buffer(&spare_path(slot), pages).map_err(|e| e.to_string())?;
            self.a.dev.map_dma(&buf, self.spare_iova(slot)).map_err(|e| e.to_string())?;
            Ok(buf)
        };
        self.spares.run(stop, make, drop_spare);
        self.spares.drain().into_iter().for_each(drop_spare);
    }

    /// Undoes a spare: its DMA map, its memory and its file (its slot is
    /// the caller's to free).
    fn drop_spare(&self, s: Spare<Mapping<ReadWrite>>) {
        let _ = self.a.dev.unmap_dma(self.spare_iova(s.slot), s.pages * PAGE_SIZE);
        drop(s.buf);
        let _ = std::fs::remove_file(spare_path(s.slot));
    }

    /// A receive buffer for `r` at `path`: a spare renamed there if one is
    /// ready, else one made and mapped now. Returns it, the IOVA of its
    /// first page and its spare slot.
    fn rx_buffer_for(&self, r: &RegionDesc, path: &Path) -> Result<(Mapping<ReadWrite>, u64, Option<usize>), HwError> {
        if let Some(s) = self.spares.take(r.pages) {
            let at = self.spare_iova(s.slot);
            match std::fs::rename(spare_path(s.slot), path) {
                Ok(()) => return Ok((s.buf, at, Some(s.slot))),
                Err(e) => {
                    eprintln!("imcd: spare receive buffer {} not used: {e}", s.slot);
                    let slot = s.slot;
                    self.drop_spare(s);
                    self.spares.free(slot);
                }
            }
        }
        let buf = rx_buffer(path, r.pages).map_err(mem("region buffer"))?;
        self.a.dev.map_dma(&buf, iova(r.first_page)).map_err(|e| HwError::Device(e.to_string()))?;
        Ok((buf, iova(r.first_page), None))
    }

    /// Opens the adapter (waiting up to 30 s for its link), and sets up
    /// imcd's pages, the interrupt and the files processes map.
    pub fn open() -> Result<AdapterHw, HwError> {
        wait_for_adapter();
        let a = Adapter::open().map_err(|e| HwError::Device(e.to_string()))?;
        remove_stale_spares();
        let t0 = Instant::now();
        let me = loop {
            if let Some(n) = a.node() {
                if (n as usize) >= MAX_NODES {
                    return Err(HwError::Device(format!("node {n}: imcd keeps rows for nodes 0 to {}", MAX_NODES - 1)));
                }
                break n as usize;
            }
            if t0.elapsed() > Duration::from_secs(30) {
                return Err(HwError::Device("the adapter has not joined a hub within 30 s".into()));
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        // Nothing resets the adapter between opens (guest VFIO offers no
        // device reset): start from the reset state, as docs/adapter.md
        // asks of the driver that takes the adapter into service.
        a.reset();
        let meta = rx_buffer(Path::new("/dev/shm/imcd-meta"), META_PAGES).map_err(mem("imcd-meta"))?;
        a.dev.map_dma(&meta, iova(0)).map_err(|e| HwError::Device(e.to_string()))?;
        for p in 0..META_PAGES {
            // The relay (requests, kicks) and the error counts wake the
            // mapper (docs/imc.md, "Threads"). The directory does not:
            // woken by its own node's allocation, the mapper would read the
            // entry before its loopback copy is complete and drop the
            // receive buffer the allocation has just made. An allocation
            // kicks on the relay page after its entry instead.
            let intr = if p == RELAY_PAGE || p == ERRCNT_PAGE { pct::INT } else { 0 };
            a.set_page(p, pct::TX | pct::RX | pct::LOOPBACK | intr, iova(p));
        }
        let irq = match Interrupt::msix(&a.dev) {
            Ok(i) => {
                a.set_reg(reg::INT_CAUSE, int::ALL);
                while a.reg(reg::NOTIFY_FIFO) != NOTIFY_EMPTY {}
                a.set_reg(reg::INT_MASK, int::NOTIFY | int::ERROR | int::LINK);
                Some(i)
            }
            Err(e) => {
                eprintln!("imcd: no MSI-X ({e}); the relay polls");
                None
            }
        };
        match Interrupt::release_request(&a.dev) {
            Ok(req) => {
                if let Err(e) = std::thread::Builder::new().name("release".into()).spawn(move || watch_release(req)) {
                    eprintln!("imcd: cannot watch for the release request ({e}): an unplug waits until imcd stops");
                }
            }
            Err(e) => eprintln!("imcd: no release request interrupt ({e}): an unplug waits until imcd stops"),
        }
        let tx_offset = a.dev.region(BAR_TX).map_err(|e| HwError::Device(e.to_string()))?.offset;
        let errcount = rx_buffer(Path::new(ERRCOUNT_FILE), 1).map_err(mem(ERRCOUNT_FILE))?;
        std::fs::set_permissions(ERRCOUNT_FILE, std::fs::Permissions::from_mode(0o644)).map_err(os(ERRCOUNT_FILE))?;
        // Any process may run imc_ckerrcnt, so any may clear the answers: the
        // worst a rogue one can do is confuse error checks on this node.
        let ack_answers = rx_buffer(Path::new(ACK_FILE), 1).map_err(mem(ACK_FILE))?;
        std::fs::set_permissions(ACK_FILE, std::fs::Permissions::from_mode(0o666)).map_err(os(ACK_FILE))?;
        a.dev.map_dma(&ack_answers, iova(ACK_Q_PAGE)).map_err(|e| HwError::Device(e.to_string()))?;
        a.set_page(ACK_Q_PAGE, pct::TX | pct::RX | pct::ACK, iova(ACK_Q_PAGE));
        let notify_lost = AtomicU32::new(a.reg(reg::NOTIFY_LOST));
        Ok(AdapterHw {
            a: Arc::new(a),
            me,
            meta: Arc::new(meta),
            errcount,
            _ack_answers: ack_answers,
            irq,
            tx_offset,
            rx: Mutex::new(HashMap::new()),
            spares: Spares::default(),
            tx: Mutex::new(HashMap::new()),
            dma: Mutex::new(Dma::default()),
            notify_lost,
        })
    }

    fn rx(&self) -> MutexGuard<'_, HashMap<u32, Rx>> {
        self.rx.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn tx(&self) -> MutexGuard<'_, HashMap<u32, (u64, u64)>> {
        self.tx.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Clears TX and LOOPBACK on `pages` pages from `first`.
    fn stop_transmit(&self, first: u64, pages: u64) {
        for p in first..first + pages {
            self.a.update_page(p, |bits, iova| (bits & !(pct::TX | pct::LOOPBACK | P2P_BITS), iova));
        }
    }

    fn dma(&self) -> MutexGuard<'_, Dma> {
        self.dma.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// IOVA of source area slot 0: above every receive buffer, on a 1 GiB boundary.
    fn dma_src_base(&self) -> u64 {
        iova(self.a.pages()).next_multiple_of(1 << 30)
    }

    fn device_fd(&self) -> Option<File> {
        self.a.dev.device_fd().try_clone_to_owned().map(File::from).ok()
    }
}

impl Hw for AdapterHw {
    type Bus = AdapterBus;

    fn me(&self) -> usize {
        self.me
    }
    fn pages(&self) -> u64 {
        self.a.pages()
    }
    fn members(&self) -> u64 {
        regs::members_bitmap(self.a.reg(reg::MEMBERS_LO), self.a.reg(reg::MEMBERS_HI))
    }
    fn store64(&self, addr: u64, v: u64) {
        self.a.store64(addr, v)
    }
    fn meta(&self, page: u64, idx: usize) -> u64 {
        let off = (page * PAGE_SIZE) as usize + idx * 8;
        self.meta.load::<u64>(off).unwrap_or_else(|e| panic!("imcd page {page} word {idx}: {e}"))
    }
    fn dir_bus(&self) -> Self::Bus {
        AdapterBus {
            adapter: self.a.clone(),
            buf: self.meta.clone(),
            page: DIR_PAGE,
            node: self.me,
            slots: (DIR_PAGES * PAGE_SIZE / 8) as usize,
        }
    }
    fn errors(&self) -> (u32, u64) {
        (self.a.reg(reg::ERR_STATUS), self.a.reg(reg::ERR_COUNT) as u64)
    }
    fn clear_errors(&self, bits: u32) {
        self.a.set_reg(reg::ERR_STATUS, bits)
    }
    fn set_error_sum(&self, sum: u64) {
        // Word 0 of a one-page buffer: cannot fail.
        let _ = self.errcount.store::<u64>(ERRCOUNT_SUM, sum);
    }
    fn count_departure(&self) {
        // Word 1 of a one-page buffer: cannot fail.
        let left = self.errcount.load::<u64>(ERRCOUNT_LEFT).unwrap_or(0);
        let _ = self.errcount.store::<u64>(ERRCOUNT_LEFT, left + 1);
    }
    fn wait_event(&self, timeout: Duration, notified: &mut Notified) -> bool {
        match &self.irq {
            Some(irq) => {
                if irq.wait(timeout).unwrap_or(0) > 0 {
                    let cause = self.a.reg(reg::INT_CAUSE);
                    self.a.set_reg(reg::INT_CAUSE, cause);
                    loop {
                        let page = self.a.reg(reg::NOTIFY_FIFO);
                        if page == NOTIFY_EMPTY {
                            break;
                        }
                        notified.pages.push(u64::from(page));
                    }
                    if cause & int::NOTIFY != 0 {
                        let lost = self.a.reg(reg::NOTIFY_LOST);
                        notified.lost = self.notify_lost.swap(lost, Ordering::Relaxed) != lost;
                    }
                    return true;
                }
                false
            }
            // Without interrupts the mapper must look often, and every
            // watcher is woken each time.
            None => {
                std::thread::sleep(timeout.min(crate::mapper::POLL_WITHOUT_IRQ));
                notified.lost = true;
                true
            }
        }
    }
    fn set_notify(&self, first: u64, pages: u64, on: bool) {
        for p in first..first + pages {
            self.a.update_page(p, |bits, iova| (if on { bits | pct::INT } else { bits & !pct::INT }, iova));
        }
    }
    fn receive(&self, r: &RegionDesc) -> Result<(), HwError> {
        let mut rx = self.rx();
        match rx.get(&r.id) {
            Some(x) if x.first == r.first_page && x.buf.len() as u64 == r.pages * PAGE_SIZE => return Ok(()),
            // The buffer of a freed region whose entry now describes
            // another one (the mapper drops those, but only at its next
            // look): handing it out would receive nothing of the new one.
            Some(_) => self.drop_receive(&mut rx, r.id, r.first_page..r.first_page + r.pages),
            None => {}
        }
        if self.dma().landed.contains_key(&r.id) {
            // Its pages point into a process's area: a buffer of its own
            // would take them away from it.
            return Err(HwError::Landing { id: r.id, why: "a process of this node receives it into its area".into() });
        }
        let path = PathBuf::from(format!("/dev/shm/imc-region-{}", r.id));
        let (buf, at, slot) = self.rx_buffer_for(r, &path)?;
        for p in r.first_page..r.first_page + r.pages {
            self.a.update_page(p, |bits, _| (bits | pct::RX, at + (p - r.first_page) * PAGE_SIZE));
        }
        rx.insert(r.id, Rx { buf, path, first: r.first_page, iova: at, slot });
        Ok(())
    }
    fn region_word(&self, id: u32, off: u64) -> Option<u64> {
        let rx = self.rx();
        let r = rx.get(&id)?;
        r.buf.load::<u64>(usize::try_from(off).ok()?).ok()
    }
    fn received(&self) -> Vec<(u32, u64, u64)> {
        self.rx().iter().map(|(id, r)| (*id, r.first, r.buf.len() as u64 / PAGE_SIZE)).collect()
    }
    fn forget(&self, id: u32) {
        let landed = self.dma().landed.get(&id).copied();
        if let Some((client, ..)) = landed {
            self.dma_unland(client, id);
        }
        // A region attached for transmit only has no receive buffer.
        if let Some((first, pages)) = self.tx().remove(&id) {
            self.stop_transmit(first, pages);
        }
        // The receive table stays locked until the file is gone: a
        // `receive` of the same id in between would make a new file under
        // the same name, and this one's removal would take it away.
        let mut rx = self.rx();
        self.drop_receive(&mut rx, id, 0..0);
        drop(rx);
    }
    fn forget_stale(&self, id: u32, first: u64, pages: u64) {
        // Checked and dropped under one hold of the receive table, which
        // `receive` takes too: no buffer made in between can go.
        let mut rx = self.rx();
        if !rx.get(&id).is_some_and(|r| r.first == first && r.buf.len() as u64 == pages * PAGE_SIZE) {
            return;
        }
        self.drop_receive(&mut rx, id, 0..0);
        drop(rx);
        let mut tx = self.tx();
        if tx.get(&id) == Some(&(first, pages)) {
            tx.remove(&id);
            drop(tx);
            self.stop_transmit(first, pages);
        }
    }
    fn forget_all(&self) {
        let mut ids: Vec<u32> = self.tx().keys().copied().collect();
        ids.extend(self.rx().keys().copied());
        for id in ids {
            self.forget(id);
        }
    }
    fn clear_meta(&self, page: u64, words: std::ops::Range<usize>) {
        for w in words {
            let _ = self.meta.store::<u64>((page * PAGE_SIZE) as usize + w * 8, 0);
        }
    }
    fn transmit(&self, r: &RegionDesc, loopback: bool, p2p: Option<u16>) {
        if let Some((first, pages)) = self.tx().insert(r.id, (r.first_page, r.pages)) {
            if (first, pages) != (r.first_page, r.pages) {
                // The entry was reused for another region: the old pages go.
                self.stop_transmit(first, pages);
            }
        }
        let a = &self.a;
        let lb = if loopback { pct::LOOPBACK } else { 0 };
        let dest = match p2p {
            Some(d) => pct::P2P | (d as u64 & pct::DEST_MASK) << pct::DEST_SHIFT,
            None => 0,
        };
        for p in r.first_page..r.first_page + r.pages {
            // Under the driver's PCT lock: the mapper may be setting RX on
            // the same page (a coherent region) at this moment.
            a.update_page(p, |bits, iova| ((bits & !P2P_BITS) | pct::TX | lb | dest, iova));
        }
    }
    fn signal(&self, pid: u64, sig: u64, uid: u64) -> u64 {
        crate::relay::deliver_signal(pid, sig, uid)
    }
    fn handout(&self, what: Handout) -> Result<(u64, u64, Option<File>), HwError> {
        match what {
            Handout::Regs => {
                let r = self.a.dev.region(regs::BAR_REGS).map_err(|e| HwError::Device(e.to_string()))?;
                Ok((r.offset, r.size, self.device_fd()))
            }
            Handout::ErrCount => Ok((0, PAGE_SIZE, Some(File::open(ERRCOUNT_FILE).map_err(os(ERRCOUNT_FILE))?))),
            Handout::AckTransmit => Ok((self.tx_offset + ACK_Q_PAGE * PAGE_SIZE, PAGE_SIZE, self.device_fd())),
            Handout::AckAnswers => {
                let f = std::fs::OpenOptions::new().read(true).write(true).open(ACK_FILE).map_err(os(ACK_FILE))?;
                Ok((0, PAGE_SIZE, Some(f)))
            }
            Handout::Transmit { first_page, pages } => {
                Ok((self.tx_offset + first_page * PAGE_SIZE, pages * PAGE_SIZE, self.device_fd()))
            }
            Handout::Receive { id } => {
                let rx = self.rx();
                let r = rx.get(&id).ok_or(HwError::NotReceived(id))?;
                // The buffer's own file, not its name, so what is handed out
                // is always the memory the adapter writes into; opened anew
                // through /proc so the process gets it read-only.
                let f = match r.buf.file() {
                    Some(f) => File::open(format!("/proc/self/fd/{}", f.as_raw_fd())),
                    None => File::open(&r.path),
                }
                .map_err(os("region buffer"))?;
                Ok((0, r.buf.len() as u64, Some(f)))
            }
            Handout::DmaRing => {
                if self.dma().ring.is_none() {
                    return Err(HwError::Device("the DMA ring is not set up (DmaOpen first)".into()));
                }
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(DMA_RING_FILE)
                    .map_err(os(DMA_RING_FILE))?;
                Ok((0, DMA_RING_ENTRIES as u64 * regs::dma::DESC_SIZE, Some(f)))
            }
        }
    }
    fn dma_open(&self, client: u64, size: u64) -> Result<DmaArea, HwError> {
        if !self.a.has_tx_dma() {
            return Err(HwError::NoDma);
        }
        if size == 0 || size > DMA_AREA_MAX {
            return Err(HwError::DmaSize(size));
        }
        let mut dma = self.dma();
        if dma.ring.is_none() {
            let pages = (DMA_RING_ENTRIES as u64 * regs::dma::DESC_SIZE).div_ceil(PAGE_SIZE);
            let mem = rx_buffer(Path::new(DMA_RING_FILE), pages).map_err(mem(DMA_RING_FILE))?;
            std::fs::set_permissions(DMA_RING_FILE, std::fs::Permissions::from_mode(0o600))
                .map_err(os(DMA_RING_FILE))?;
            self.a.dev.map_dma(&mem, DMA_RING_IOVA).map_err(|e| HwError::Device(e.to_string()))?;
            let ring = DmaRing::with_memory(self.a.clone(), mem, DMA_RING_IOVA, DMA_RING_ENTRIES)
                .map_err(|e| HwError::Device(e.to_string()))?;
            dma.ring = Some(ring);
        }
        if dma.areas.contains_key(&client) {
            return Err(HwError::Device("this process has set up transmit DMA already".into()));
        }
        let slot =
            (0..DMA_AREAS).find(|s| dma.areas.values().all(|(t, _)| t != s)).ok_or(HwError::DmaFull(DMA_AREAS))?;
        let pages = size.div_ceil(PAGE_SIZE);
        // A file nobody else can open: the process gets it as an fd.
        let path = PathBuf::from(format!("/dev/shm/imcd-dma-src-{client}"));
        let buf = rx_buffer(&path, pages).map_err(mem("DMA source area"));
        let _ = std::fs::remove_file(&path);
        let buf = buf?;
        let iova = self.dma_src_base() + slot as u64 * DMA_AREA_MAX;
        self.a.dev.map_dma(&buf, iova).map_err(|e| HwError::Device(e.to_string()))?;
        let file = buf.file().ok_or_else(|| HwError::Device("DMA source area has no file".into()))?;
        let file = file.try_clone().map_err(os("DMA source area"))?;
        let len = buf.len() as u64;
        dma.areas.insert(client, (slot, buf));
        Ok(DmaArea { iova, len, file, ring_entries: DMA_RING_ENTRIES })
    }
    fn dma_land(&self, client: u64, r: &RegionDesc, offset: u64) -> Result<(), HwError> {
        let refuse = |why: String| Err(HwError::Landing { id: r.id, why });
        // Receive table first, as `receive` takes them.
        let rx = self.rx();
        let mut dma = self.dma();
        let Some((slot, area)) = dma.areas.get(&client) else {
            return refuse("this process has no DMA source area (DmaOpen first)".into());
        };
        let bytes = r.pages * PAGE_SIZE;
        if offset % PAGE_SIZE != 0 || offset.checked_add(bytes).is_none_or(|end| end > area.len() as u64) {
            return refuse(format!("{bytes} bytes at byte {offset} of a {}-byte area (whole pages only)", area.len()));
        }
        if rx.contains_key(&r.id) {
            return refuse("this node receives it into a buffer of its own already".into());
        }
        match dma.landed.get(&r.id) {
            Some(&(c, ..)) if c != client => return refuse("another process of this node receives it".into()),
            Some(_) => return refuse("this process receives it already".into()),
            None => {}
        }
        let base = self.dma_src_base() + *slot as u64 * DMA_AREA_MAX + offset;
        for p in r.first_page..r.first_page + r.pages {
            self.a.update_page(p, |bits, _| (bits | pct::RX, base + (p - r.first_page) * PAGE_SIZE));
        }
        dma.landed.insert(r.id, (client, r.first_page, r.pages));
        Ok(())
    }
    fn dma_unland(&self, client: u64, id: u32) {
        let mut dma = self.dma();
        let Some(&(c, first, pages)) = dma.landed.get(&id) else { return };
        if c != client {
            return;
        }
        dma.landed.remove(&id);
        for p in first..first + pages {
            // Nothing arrives for it here any more; the address goes with
            // the next receive.
            self.a.update_page(p, |bits, iova| (bits & !(pct::RX | pct::LOOPBACK), iova));
        }
    }
    fn dma_close(&self, client: u64) {
        let ids: Vec<u32> = self.dma().landed.iter().filter(|(_, l)| l.0 == client).map(|(id, _)| *id).collect();
        for id in ids {
            self.dma_unland(client, id);
        }
        let mut dma = self.dma();
        if let Some((slot, buf)) = dma.areas.remove(&client) {
            // A transfer still reading the area ends with SRC_UNMAPPED.
            let _ = self.a.dev.unmap_dma(self.dma_src_base() + slot as u64 * DMA_AREA_MAX, buf.len() as u64);
        }
    }
}
