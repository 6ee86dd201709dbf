//! `guest-driver`: the MEMORY CHANNEL adapter's driver for Linux guests
//! (user space, over VFIO). `imcd` and `mctool` are built on it; the
//! message-passing libraries never use it (they go through `imc-client`).
//!
//! # Layout
//! - [`vfio`]: binding to vfio-pci, BAR mmaps, DMA maps through the IOMMU.
//! - [`Adapter`]: a safe API over the registers and the page control table
//!   documented in `docs/adapter.md` (constants from `regs`).
//! - [`rx_buffer`]: pinned receive memory, a [`guest_mem::Mapping`] of a
//!   file in `/dev/shm` so other processes (and `mctool dump`) can read
//!   what the adapter wrote; [`VfioDevice::map_dma`] maps it for the adapter.
//! - [`txdma`]: the transmit DMA engine's descriptor ring ([`Adapter::dma_ring`]),
//!   in memory allocated like receive buffers.
//! - [`ivshmem`]: QEMU's `ivshmem-plain` shared memory, mapped through sysfs
//!   (the comparison floor of `mctool pingpong --via ivshmem`).
#![warn(missing_docs)]

pub mod ivshmem;
pub mod txdma;
pub mod vfio;
pub mod view;

use std::os::fd::AsRawFd;
use std::path::Path;

pub use guest_mem;
use guest_mem::{Mapping, MemError, ReadWrite};
pub use regs;
use regs::{pct, reg, PAGE_SIZE};
use vfio::{Bar, VfioDevice, VfioError};

/// What the driver last wrote into each PCT entry, so that changing an
/// entry costs only the stores of the words that change. Every PCT read is
/// a round trip to the adapter (a vfio-user message QEMU waits on), while
/// the stores are posted: reading an entry back before each change made
/// the reads most of the cost of attaching a region (about 0.45 ms a page
/// under TCG). Entries not known are read from the adapter once; after a
/// reset every entry is known to be zero.
#[derive(Debug, Default)]
struct PctCopy {
    /// Everything is zero but `known` (true from a reset on).
    zero: bool,
    known: std::collections::HashMap<u64, (u64, u64)>,
}

impl PctCopy {
    /// The entry of `page`, reading it with `read` if it is not known.
    fn get(&mut self, page: u64, read: impl FnOnce() -> (u64, u64)) -> (u64, u64) {
        match self.known.get(&page) {
            Some(&v) => v,
            None if self.zero => (0, 0),
            None => {
                let v = read();
                self.known.insert(page, v);
                v
            }
        }
    }

    /// Records what was written to `page` (as the adapter keeps it: the
    /// bits its words hold).
    fn set(&mut self, page: u64, bits: u64, addr: u64) {
        self.known.insert(page, (bits & pct::WORD0_MASK, addr & pct::WORD1_MASK));
    }

    /// A reset cleared every entry.
    fn reset(&mut self) {
        self.known.clear();
        self.zero = true;
    }

    /// Changes `page`'s entry by `f(bits, receive address)`: `read` reads
    /// it from the adapter (only when not known), `write` stores one word
    /// (0: the enables, 1: the receive address; the address first, as
    /// [`Adapter::set_page`]) and is called only for words that change.
    fn update(
        &mut self,
        page: u64,
        read: impl FnOnce() -> (u64, u64),
        mut write: impl FnMut(u64, u64),
        f: impl FnOnce(u64, u64) -> (u64, u64),
    ) -> (u64, u64) {
        let old = self.get(page, read);
        let new = f(old.0, old.1);
        if new.1 & pct::WORD1_MASK != old.1 {
            write(1, new.1);
        }
        if new.0 & pct::WORD0_MASK != old.0 {
            write(0, new.0);
        }
        self.set(page, new.0, new.1);
        new
    }
}

/// IOVA where receive buffers are mapped: MEMORY CHANNEL page `p` of the
/// buffer lands at `RX_IOVA_BASE + p * PAGE_SIZE`.
pub const RX_IOVA_BASE: u64 = 0x1000_0000;

/// The adapter, opened and mapped.
pub struct Adapter {
    /// The VFIO device (kept open: closing it releases the DMA maps).
    pub dev: VfioDevice,
    regs: Bar,
    pct: Bar,
    tx: Bar,
    /// What the PCT holds, as far as this driver wrote it; held across
    /// each [`Adapter::update_page`]: threads that program the same entry
    /// (imcd's main thread enables transmit, its mapper receive) would
    /// otherwise undo each other's bits.
    pct_copy: std::sync::Mutex<PctCopy>,
}

impl Adapter {
    /// Finds the adapter, binds it to vfio-pci, enables bus mastering and
    /// maps its BARs.
    pub fn open() -> Result<Adapter, VfioError> {
        let bdf = vfio::find_pci(regs::VENDOR_ID, regs::DEVICE_ID)?;
        vfio::bind_vfio_pci(&bdf)?;
        let dev = VfioDevice::open(&bdf)?;
        dev.enable_bus_master()?;
        let regs_bar = dev.map_bar(regs::BAR_REGS)?;
        let id = regs_bar.load::<u32>(reg::ID as usize).map_err(|e| VfioError::Map { what: "BAR 0".into(), err: e })?;
        if id != regs::ID_VALUE {
            return Err(VfioError::Unexpected(format!(
                "adapter ID register reads {id:#x}, expected {:#x}",
                regs::ID_VALUE
            )));
        }
        let pct = dev.map_bar(regs::BAR_PCT)?;
        let tx = dev.map_bar(regs::BAR_TX)?;
        Ok(Adapter { dev, regs: regs_bar, pct, tx, pct_copy: Default::default() })
    }

    /// Reads a 32-bit register (`regs::reg::*`).
    ///
    /// # Panics
    /// On an offset outside BAR 0 or not 4-aligned: register offsets are
    /// the constants of `regs::reg`, so that is a bug in the caller.
    pub fn reg(&self, off: u64) -> u32 {
        self.regs.load::<u32>(off as usize).unwrap_or_else(|e| panic!("register {off:#x}: {e}"))
    }

    /// Writes a 32-bit register (panics as [`Adapter::reg`]).
    pub fn set_reg(&self, off: u64, v: u32) {
        self.regs.store::<u32>(off as usize, v).unwrap_or_else(|e| panic!("register {off:#x}: {e}"))
    }

    /// Resets the adapter through CTRL (guest VFIO offers no device reset,
    /// so nothing else clears the PCT, masks, causes and counters between
    /// opens; `docs/adapter.md`, "Reset"). Node, link, members and LAST_SEQ
    /// are kept.
    pub fn reset(&self) {
        let mut copy = self.copy();
        self.set_reg(reg::CTRL, regs::ctrl::RESET);
        copy.reset();
    }

    fn copy(&self) -> std::sync::MutexGuard<'_, PctCopy> {
        self.pct_copy.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// This node's id, or `None` while the link is down.
    pub fn node(&self) -> Option<u16> {
        regs::node_id(self.reg(reg::NODE))
    }

    /// Pages in the address space.
    pub fn pages(&self) -> u64 {
        self.reg(reg::ASPACE_PAGES) as u64
    }

    /// Programs page `page`'s PCT entry: control bits (`regs::pct::*`) and
    /// receive DMA address. The address is written first, so the page is
    /// never receive-enabled with a stale address.
    pub fn set_page(&self, page: u64, bits: u64, rx_iova: u64) {
        let mut copy = self.copy();
        self.store_entry(page, 1, rx_iova);
        self.store_entry(page, 0, bits);
        copy.set(page, bits, rx_iova);
    }

    /// Stores word `word` (0: enables, 1: receive address) of page
    /// `page`'s PCT entry; panics outside the address space (the BAR's
    /// length, so no register read per store).
    fn store_entry(&self, page: u64, word: u64, v: u64) {
        assert!(page < self.pct.len() as u64 / pct::ENTRY, "page {page} outside the address space");
        let off = (page * pct::ENTRY + word * 8) as usize;
        self.pct.store::<u64>(off, v).unwrap_or_else(|e| panic!("PCT entry {page}: {e}"))
    }

    /// Changes page `page`'s PCT entry by `f(bits, receive address)`, which
    /// returns the new pair; every change made through here is atomic with
    /// respect to the others, so two threads each setting their own bits on
    /// one page both keep them. Only the words that change are stored, and
    /// the entry is read from the adapter only the first time this driver
    /// touches it (never after [`Adapter::reset`]). Returns the new pair.
    pub fn update_page(&self, page: u64, f: impl FnOnce(u64, u64) -> (u64, u64)) -> (u64, u64) {
        self.copy().update(page, || self.page(page), |w, v| self.store_entry(page, w, v), f)
    }

    /// Reads back page `page`'s PCT entry (bits, receive address);
    /// panics outside the address space, as [`Adapter::set_page`].
    pub fn page(&self, page: u64) -> (u64, u64) {
        let off = (page * pct::ENTRY) as usize;
        let get = |o: usize| self.pct.load::<u64>(o).unwrap_or_else(|e| panic!("PCT entry {page}: {e}"));
        (get(off), get(off + 8))
    }

    /// One 8-byte store into the transmit window at global address `addr`.
    ///
    /// # Panics
    /// When `addr` is outside the window or not 8-aligned; use
    /// [`Adapter::try_store64`] for addresses that come from a user.
    pub fn store64(&self, addr: u64, v: u64) {
        self.try_store64(addr, v).unwrap_or_else(|e| panic!("transmit window: {e}"))
    }

    /// One 8-byte store into the transmit window, or why it cannot be made.
    pub fn try_store64(&self, addr: u64, v: u64) -> Result<(), MemError> {
        self.tx.store::<u64>(usize::try_from(addr).unwrap_or(usize::MAX), v)
    }

    /// Copies `data` (a multiple of 8 bytes, at an 8-aligned `addr`) into
    /// the transmit window in address order with 8-byte release stores
    /// (MEMORY CHANNEL's ordering); nothing is stored when it does not fit.
    pub fn store(&self, addr: u64, data: &[u8]) -> Result<(), MemError> {
        if data.len() % 8 != 0 || addr % 8 != 0 {
            return Err(MemError::Misaligned { off: addr as usize, width: 8 });
        }
        self.tx.write_ordered(usize::try_from(addr).unwrap_or(usize::MAX), data)
    }

    /// The transmit window (for stores wider than one word).
    pub fn tx(&self) -> &Mapping<ReadWrite> {
        &self.tx
    }
}

/// An eventfd an interrupt of the adapter is routed to: its one vector
/// (MSI-X, or MSI on an adapter that offers that: `docs/adapter.md`,
/// "Surprise removal"), or the guest kernel's request to let it go.
pub struct Interrupt {
    fd: std::os::fd::OwnedFd,
}

fn eventfd() -> Result<std::os::fd::OwnedFd, VfioError> {
    // SAFETY: eventfd(2) returns a new fd or -1.
    let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if raw < 0 {
        return Err(VfioError::Os { what: "eventfd".into(), err: std::io::Error::last_os_error() });
    }
    // SAFETY: `raw` is a fresh fd we own.
    Ok(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) })
}

impl Interrupt {
    /// Creates an eventfd and routes the adapter's interrupt vector to it:
    /// MSI-X vector 0, or the MSI vector when the adapter has no MSI-X.
    pub fn msix(dev: &VfioDevice) -> Result<Interrupt, VfioError> {
        let fd = eventfd()?;
        let index = if dev.irq_count(vfio::MSIX_IRQ_INDEX)? > 0 { vfio::MSIX_IRQ_INDEX } else { vfio::MSI_IRQ_INDEX };
        dev.set_irq_eventfd(index, 0, &fd)?;
        Ok(Interrupt { fd })
    }

    /// The guest kernel's request to let the device go (the adapter is
    /// being unplugged): it fires, again every 10 s, until every file of
    /// the device is closed.
    pub fn release_request(dev: &VfioDevice) -> Result<Interrupt, VfioError> {
        let fd = eventfd()?;
        dev.set_irq_eventfd(vfio::REQ_IRQ_INDEX, 0, &fd)?;
        Ok(Interrupt { fd })
    }

    /// Waits up to `timeout` for the interrupt; returns how many fired (0 on timeout).
    pub fn wait(&self, timeout: std::time::Duration) -> std::io::Result<u64> {
        let mut p = libc::pollfd { fd: self.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut p, 1, ms) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if n == 0 {
            return Ok(0);
        }
        let mut v = 0u64;
        // SAFETY: reading the eventfd's 8-byte counter into `v`.
        let r = unsafe { libc::read(self.fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        if r != 8 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(v)
    }
}

/// Receive memory: the file `path` in `/dev/shm`, sized to `pages`
/// MEMORY CHANNEL pages, mapped shared and zeroed. Map it for the
/// adapter's DMA with [`VfioDevice::map_dma`] (at [`RX_IOVA_BASE`], or at
/// the IOVA of its first page).
pub fn rx_buffer(path: &Path, pages: u64) -> Result<Mapping<ReadWrite>, MemError> {
    let len = usize::try_from(pages * PAGE_SIZE)
        .map_err(|_| MemError::BadMap(format!("{pages} pages do not fit this process")))?;
    let buf = Mapping::create(path, len)?;
    // Zeroed by punching out the file's pages: the kernel then hands out
    // zeroed pages as the DMA map pins them, instead of this process
    // storing zeroes into a megabyte a page at a time (about 25 ms a MiB
    // under TCG). The file keeps its size, so a process that has it mapped
    // reads zeroes, never past the end. Stores where that is refused.
    use nix::fcntl::{fallocate, FallocateFlags};
    let punch = FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE;
    let punched = buf.file().is_some_and(|f| fallocate(f.as_raw_fd(), punch, 0, len as libc::off_t).is_ok());
    if !punched {
        buf.fill(0, len, 0)?;
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Mutex;

    use super::{pct, PctCopy};

    /// Two threads set their own bits of one entry, one bit per update,
    /// with a pause inside each update (where imcd's main thread and
    /// mapper used to interleave): no update is lost.
    #[test]
    fn concurrent_updates_of_one_entry_keep_every_bit() {
        let copy = Mutex::new(PctCopy::default());
        let (bits, addr) = (AtomicU64::new(0), AtomicU64::new(0));
        let start = std::sync::Barrier::new(2);
        std::thread::scope(|s| {
            for half in [0u32, 3] {
                let (copy, bits, addr, start) = (&copy, &bits, &addr, &start);
                s.spawn(move || {
                    start.wait();
                    for i in half..half + 3 {
                        copy.lock().unwrap().update(
                            9,
                            || (bits.load(Ordering::SeqCst), addr.load(Ordering::SeqCst)),
                            |w, v| {
                                std::thread::sleep(std::time::Duration::from_micros(200));
                                [&bits, &addr][w as usize].store(v, Ordering::SeqCst);
                            },
                            |b, a| (b | 1 << i, a.max(u64::from(i) << 3)),
                        );
                    }
                });
            }
        });
        assert_eq!(bits.load(Ordering::SeqCst), 0x3F, "an update was lost");
        assert_eq!(addr.load(Ordering::SeqCst), 5 << 3);
    }

    /// A receive buffer made again over an old file reads zero, keeps the
    /// file (a process that mapped it sees the new contents) and its size.
    #[test]
    fn a_receive_buffer_made_again_is_zero_in_the_same_file() {
        use std::os::unix::fs::MetadataExt;
        let path = std::env::temp_dir().join(format!("rx-buffer-test-{}", std::process::id()));
        let old = super::rx_buffer(&path, 2).unwrap();
        old.write(100, &[0xAB; 64]).unwrap();
        let inode = std::fs::metadata(&path).unwrap().ino();
        let new = super::rx_buffer(&path, 2).unwrap();
        let mut back = vec![0xFFu8; 2 * super::PAGE_SIZE as usize];
        new.read(0, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0), "the new buffer is not zero");
        let mut seen = [0xFFu8; 64];
        old.read(100, &mut seen).unwrap();
        assert_eq!(seen, [0; 64], "the old mapping does not see the same file");
        assert_eq!(std::fs::metadata(&path).unwrap().ino(), inode);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 2 * super::PAGE_SIZE);
        let _ = std::fs::remove_file(&path);
    }

    /// Only the words that change are stored; an entry is read once, and
    /// never after a reset.
    #[test]
    fn only_changed_words_are_stored_and_an_entry_is_read_once() {
        let mut copy = PctCopy::default();
        let reads = std::cell::Cell::new(0);
        let read = || {
            reads.set(reads.get() + 1);
            (pct::TX, 0x4000)
        };
        let mut stores = Vec::new();
        let new = copy.update(3, read, |w, v| stores.push((w, v)), |b, a| (b | pct::RX, a));
        assert_eq!(new, (pct::TX | pct::RX, 0x4000));
        assert_eq!(stores, [(0, pct::TX | pct::RX)], "the unchanged address was stored");
        stores.clear();
        copy.update(3, read, |w, v| stores.push((w, v)), |b, a| (b, a));
        assert!(stores.is_empty(), "an unchanged entry was stored: {stores:?}");
        assert_eq!(reads.get(), 1, "the entry was read again");
        copy.update(3, read, |w, v| stores.push((w, v)), |b, _| (b, 0x6000));
        assert_eq!(stores, [(1, 0x6000)]);
        copy.reset();
        stores.clear();
        let new = copy.update(3, read, |w, v| stores.push((w, v)), |b, a| (b | pct::TX, a | 0x2000));
        assert_eq!(new, (pct::TX, 0x2000), "a reset entry is not zero");
        assert_eq!(stores, [(1, 0x2000), (0, pct::TX)], "the address goes first");
        assert_eq!(reads.get(), 1);
    }
}
