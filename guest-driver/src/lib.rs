//! `guest-driver`: the MEMORY CHANNEL adapter's driver for Linux guests
//! (user space, over VFIO). `imcd` and `mctool` are built on it; the
//! message-passing libraries never use it (they go through `imc-client`).
//!
//! # Layout
//! - [`vfio`]: binding to vfio-pci, BAR mmaps, DMA maps through the IOMMU.
//! - [`Adapter`]: a safe API over the registers and the page control table
//!   documented in `docs/adapter.md` (constants from `regs`).
//! - [`RxBuffer`]: pinned receive memory, backed by a file in `/dev/shm` so
//!   other processes (and `mctool dump`) can read what the adapter wrote.
//! - [`ivshmem`]: QEMU's `ivshmem-plain` shared memory, mapped through sysfs
//!   (the comparison floor of `mctool pingpong --via ivshmem`).
#![warn(missing_docs)]

pub mod ivshmem;
pub mod vfio;

use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::path::Path;

pub use regs as regs;
use regs::{pct, reg, PAGE_SIZE};
use vfio::{Bar, VfioDevice, VfioError};

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
        let id = regs_bar.read32(reg::ID as usize);
        if id != regs::ID_VALUE {
            return Err(VfioError::Unexpected(format!(
                "adapter ID register reads {id:#x}, expected {:#x}",
                regs::ID_VALUE
            )));
        }
        let pct = dev.map_bar(regs::BAR_PCT)?;
        let tx = dev.map_bar(regs::BAR_TX)?;
        Ok(Adapter { dev, regs: regs_bar, pct, tx })
    }

    /// Reads a 32-bit register (`regs::reg::*`).
    pub fn reg(&self, off: u64) -> u32 {
        self.regs.read32(off as usize)
    }

    /// Writes a 32-bit register.
    pub fn set_reg(&self, off: u64, v: u32) {
        self.regs.write32(off as usize, v)
    }

    /// This node's id, or `None` while the link is down.
    pub fn node(&self) -> Option<u16> {
        let n = self.reg(reg::NODE) & 0xFFFF;
        (n != 0xFFFF).then_some(n as u16)
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
        self.pct.write64(off + 8, rx_iova);
        self.pct.write64(off, bits);
    }

    /// Reads back page `page`'s PCT entry (bits, receive address).
    pub fn page(&self, page: u64) -> (u64, u64) {
        let off = (page * pct::ENTRY) as usize;
        (self.pct.read64(off), self.pct.read64(off + 8))
    }

    /// One 8-byte store into the transmit window at global address `addr`.
    pub fn store64(&self, addr: u64, v: u64) {
        self.tx.write64(addr as usize, v)
    }

    /// Copies `data` (a multiple of 8 bytes) into the transmit window at `addr`
    /// with 8-byte stores, in address order.
    pub fn store(&self, addr: u64, data: &[u8]) {
        assert!(data.len() % 8 == 0, "transmit stores are 8-byte words");
        for (i, w) in data.chunks_exact(8).enumerate() {
            self.store64(addr + 8 * i as u64, u64::from_le_bytes(w.try_into().unwrap()));
        }
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

/// Receive memory: a `/dev/shm` file mapped shared, pinned and mapped for
/// DMA at [`RX_IOVA_BASE`].
pub struct RxBuffer {
    ptr: *mut u8,
    len: usize,
}

impl RxBuffer {
    /// Creates (or reuses) `path` with `pages` MEMORY CHANNEL pages and maps it.
    pub fn create(path: &Path, pages: u64) -> std::io::Result<RxBuffer> {
        let len = (pages * PAGE_SIZE) as usize;
        let f = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?;
        f.set_len(len as u64)?;
        Self::map(&f, len, true)
    }

    /// Opens an existing buffer read-only (for `dump` and `wait`).
    pub fn open_ro(path: &Path) -> std::io::Result<RxBuffer> {
        let f = OpenOptions::new().read(true).open(path)?;
        let len = f.metadata()?.len() as usize;
        Self::map(&f, len, false)
    }

    /// Maps all `len` bytes of `f` shared (read-write with `write`); the
    /// ivshmem BAR uses this too.
    pub(crate) fn map(f: &std::fs::File, len: usize, write: bool) -> std::io::Result<RxBuffer> {
        if len == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "empty receive buffer"));
        }
        let prot = if write { libc::PROT_READ | libc::PROT_WRITE } else { libc::PROT_READ };
        // SAFETY: shared mapping of a file we opened; checked below.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, f.as_raw_fd(), 0) };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(RxBuffer { ptr: ptr.cast(), len })
    }

    /// Pins the buffer and maps it for the adapter's DMA at [`RX_IOVA_BASE`].
    pub fn map_for_dma(&self, dev: &VfioDevice) -> Result<(), VfioError> {
        self.map_for_dma_at(dev, RX_IOVA_BASE)
    }

    /// Pins the buffer and maps it for the adapter's DMA at `iova`.
    pub fn map_for_dma_at(&self, dev: &VfioDevice, iova: u64) -> Result<(), VfioError> {
        dev.map_dma(self.ptr, iova, self.len as u64)
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty (never, once created).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies out `len` bytes at `off` (volatile: the adapter writes concurrently).
    pub fn read(&self, off: usize, len: usize) -> Vec<u8> {
        assert!(off + len <= self.len, "read past the receive buffer");
        (0..len)
            .map(|i| {
                // SAFETY: in bounds (asserted); the mapping lives as long as self.
                unsafe { std::ptr::read_volatile(self.ptr.add(off + i)) }
            })
            .collect()
    }

    /// Volatile 8-byte read at `off` (8-byte aligned).
    pub fn read64(&self, off: usize) -> u64 {
        assert!(off % 8 == 0 && off + 8 <= self.len, "bad 8-byte read at {off}");
        // SAFETY: in bounds and aligned (asserted).
        unsafe { std::ptr::read_volatile(self.ptr.add(off).cast::<u64>()) }
    }

    /// Volatile 8-byte write at `off` (8-byte aligned; a buffer made by
    /// [`RxBuffer::create`], which maps it writable).
    pub fn write64(&self, off: usize, v: u64) {
        assert!(off % 8 == 0 && off + 8 <= self.len, "bad 8-byte write at {off}");
        // SAFETY: in bounds and aligned (asserted).
        unsafe { std::ptr::write_volatile(self.ptr.add(off).cast::<u64>(), v) }
    }

    /// Zeroes the buffer.
    pub fn clear(&self) {
        // SAFETY: the whole mapping, writable when created by `create`.
        unsafe { std::ptr::write_bytes(self.ptr, 0, self.len) }
    }
}

// SAFETY: an RxBuffer owns its shared mapping; reads are volatile copies
// and nothing hands out references into it (the adapter writes it
// concurrently anyway), so it may move to and be shared with other threads.
unsafe impl Send for RxBuffer {}
// SAFETY: as for Send.
unsafe impl Sync for RxBuffer {}

impl Drop for RxBuffer {
    fn drop(&mut self) {
        // SAFETY: from the mmap in `map`, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}
