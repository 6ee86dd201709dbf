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

/// A read-modify-write of one PCT entry under `lock`: reads the pair,
/// applies `f`, writes it back if it changed.
fn update_entry(
    lock: &std::sync::Mutex<()>,
    read: impl FnOnce() -> (u64, u64),
    write: impl FnOnce(u64, u64),
    f: impl FnOnce(u64, u64) -> (u64, u64),
) -> (u64, u64) {
    let _held = lock.lock().unwrap_or_else(|e| e.into_inner());
    let (bits, addr) = read();
    let new = f(bits, addr);
    if new != (bits, addr) {
        write(new.0, new.1);
    }
    new
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
    /// Held across each [`Adapter::update_page`]: threads that program the
    /// same entry (imcd's main thread enables transmit, its mapper receive)
    /// would otherwise undo each other's bits.
    pct_update: std::sync::Mutex<()>,
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
        Ok(Adapter { dev, regs: regs_bar, pct, tx, pct_update: std::sync::Mutex::new(()) })
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
        self.set_reg(reg::CTRL, regs::ctrl::RESET)
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
        assert!(page < self.pages(), "page {page} outside the address space");
        let off = (page * pct::ENTRY) as usize;
        let set = |o: usize, v: u64| self.pct.store::<u64>(o, v).unwrap_or_else(|e| panic!("PCT entry {page}: {e}"));
        set(off + 8, rx_iova);
        set(off, bits);
    }

    /// Changes page `page`'s PCT entry by `f(bits, receive address)`, which
    /// returns the new pair; every change made through here is atomic with
    /// respect to the others, so two threads each setting their own bits on
    /// one page both keep them. Returns the new pair.
    pub fn update_page(&self, page: u64, f: impl FnOnce(u64, u64) -> (u64, u64)) -> (u64, u64) {
        update_entry(&self.pct_update, || self.page(page), |b, a| self.set_page(page, b, a), f)
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

/// An eventfd the adapter's interrupt is routed to (MSI-X vector 0).
pub struct Interrupt {
    fd: std::os::fd::OwnedFd,
}

impl Interrupt {
    /// Creates an eventfd and routes the adapter's MSI-X vector 0 to it.
    pub fn msix(dev: &VfioDevice) -> Result<Interrupt, VfioError> {
        // SAFETY: eventfd(2) returns a new fd or -1.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if raw < 0 {
            return Err(VfioError::Os { what: "eventfd".into(), err: std::io::Error::last_os_error() });
        }
        // SAFETY: `raw` is a fresh fd we own.
        let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) };
        dev.set_irq_eventfd(vfio::MSIX_IRQ_INDEX, 0, &fd)?;
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
    buf.fill(0, len, 0)?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Mutex;

    use super::update_entry;

    /// Two threads set their own bits of one entry, one bit per update,
    /// with a pause between the read and the write-back (where imcd's
    /// main thread and mapper used to interleave): no update is lost.
    #[test]
    fn concurrent_updates_of_one_entry_keep_every_bit() {
        let lock = Mutex::new(());
        let (bits, addr) = (AtomicU64::new(0), AtomicU64::new(0));
        let start = std::sync::Barrier::new(2);
        std::thread::scope(|s| {
            for half in [0u32, 32] {
                let (lock, bits, addr, start) = (&lock, &bits, &addr, &start);
                s.spawn(move || {
                    start.wait();
                    for i in half..half + 32 {
                        update_entry(
                            lock,
                            || {
                                let v = (bits.load(Ordering::SeqCst), addr.load(Ordering::SeqCst));
                                std::thread::sleep(std::time::Duration::from_micros(200));
                                v
                            },
                            |b, a| {
                                addr.store(a, Ordering::SeqCst);
                                bits.store(b, Ordering::SeqCst);
                            },
                            |b, a| (b | 1 << i, a.max(u64::from(i))),
                        );
                    }
                });
            }
        });
        assert_eq!(bits.load(Ordering::SeqCst), u64::MAX, "an update was lost");
        assert_eq!(addr.load(Ordering::SeqCst), 63);
    }

    #[test]
    fn an_unchanged_entry_is_not_written() {
        let lock = Mutex::new(());
        let new = update_entry(&lock, || (5, 7), |_, _| panic!("written"), |b, a| (b, a));
        assert_eq!(new, (5, 7));
    }
}
