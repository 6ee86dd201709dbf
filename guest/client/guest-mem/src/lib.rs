//! `guest-mem`: the one type for mapped memory on the guest side.
//!
//! A [`Mapping`] is a shared mapping of a file (a receive buffer in
//! `/dev/shm`), of a file descriptor at an offset (a region of the VFIO
//! device fd: the adapter's registers or transmit window), or of a PCI
//! resource file in sysfs (ivshmem's BAR 2). It is a rust-vmm
//! [`vm_memory::MmapRegion`] underneath, and every access goes through
//! vm-memory's bounds-checked volatile and atomic accessors: this crate has
//! no `unsafe`, and a mapping is `Send + Sync` because `MmapRegion` is.
//!
//! Owns: the mmaps (unmapped on drop) and the checks on every access.
//! Offsets and lengths past the end, and accesses that are not naturally
//! aligned, are a [`MemError`], never a panic. Threads: any; a mapping is
//! shared by reference (or `Arc`) and every access is one volatile or
//! atomic load or store, or a copy made of them.
//!
//! Read-only vs read-write is a type state: [`Mapping<ReadOnly>`] (and its
//! [`Window`]s) have loads and copies out, and no store method at all, so
//! a receive mapping cannot be written by mistake; [`Mapping<ReadWrite>`]
//! adds the stores. Writing through a read-only mapping does not compile:
//!
//! ```compile_fail
//! let m = guest_mem::Mapping::<guest_mem::ReadOnly>::open(std::path::Path::new("/dev/zero")).unwrap();
//! m.store::<u64>(0, 1).unwrap(); // no `store` on a read-only mapping
//! ```
//!
//! [`Window`] is a checked sub-range of a mapping that borrows it: it
//! cannot outlive the mapping, and its accesses are checked against its
//! own bounds.
#![warn(missing_docs)]

use std::fs::{File, OpenOptions};
use std::io;
use std::marker::PhantomData;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::atomic::Ordering;

use thiserror::Error;
use vm_memory::{AtomicAccess, ByteValued, Bytes, FileOffset, MmapRegion, VolatileMemory, VolatileSlice};

/// Why a mapping could not be made, or an access was refused.
#[derive(Debug, Error)]
pub enum MemError {
    /// Opening, sizing or mapping failed.
    #[error("{what}: {err}")]
    Os {
        /// The step.
        what: String,
        /// The OS error.
        err: io::Error,
    },
    /// The mapping asked for cannot be made (empty, past the end of the file).
    #[error("bad mapping: {0}")]
    BadMap(String),
    /// An access reaches past the end of the mapping or window.
    #[error("access of {len} bytes at {off:#x} is outside the {size:#x} bytes mapped")]
    OutOfBounds {
        /// Offset of the access.
        off: usize,
        /// Bytes accessed.
        len: usize,
        /// Bytes mapped.
        size: usize,
    },
    /// A load or store of `width` bytes at an offset that is not a multiple of `width`.
    #[error("{width}-byte access at {off:#x} is not naturally aligned")]
    Misaligned {
        /// Offset of the access.
        off: usize,
        /// Bytes accessed.
        width: usize,
    },
}

type Result<T> = std::result::Result<T, MemError>;

mod sealed {
    pub trait Access {}
    pub trait Word {}
}

/// The access a mapping was made with (a type state: [`ReadOnly`] or [`ReadWrite`]).
pub trait Access: sealed::Access + Send + Sync + 'static {
    /// `mmap` protection.
    const PROT: i32;
    /// Whether the file is opened for writing.
    const WRITE: bool;
}

/// Loads only: a receive buffer, the registers as a client sees them.
#[derive(Debug)]
pub struct ReadOnly;
/// Loads and stores.
#[derive(Debug)]
pub struct ReadWrite;

impl sealed::Access for ReadOnly {}
impl sealed::Access for ReadWrite {}
impl Access for ReadOnly {
    const PROT: i32 = libc::PROT_READ;
    const WRITE: bool = false;
}
impl Access for ReadWrite {
    const PROT: i32 = libc::PROT_READ | libc::PROT_WRITE;
    const WRITE: bool = true;
}

/// A naturally aligned integer one load or store moves: `u8`, `u16`, `u32`, `u64`.
pub trait Word: sealed::Word + ByteValued + AtomicAccess {}
impl sealed::Word for u8 {}
impl sealed::Word for u16 {}
impl sealed::Word for u32 {}
impl sealed::Word for u64 {}
impl Word for u8 {}
impl Word for u16 {}
impl Word for u32 {}
impl Word for u64 {}

fn os(what: impl Into<String>) -> impl FnOnce(io::Error) -> MemError {
    let what = what.into();
    move |err| MemError::Os { what, err }
}

/// A shared mapping of a file or device region.
#[derive(Debug)]
pub struct Mapping<A: Access> {
    region: MmapRegion<()>,
    _access: PhantomData<A>,
}

impl<A: Access> Mapping<A> {
    /// Maps `len` bytes of `file` from `offset`, shared. A regular file
    /// must hold them (a load past its end would be a SIGBUS).
    pub fn from_file(file: File, offset: u64, len: usize) -> Result<Self> {
        Self::check_file(&file, offset, len)?;
        Self::build(file, offset, len, 0)
    }

    /// Maps `len` bytes of the descriptor `fd` from `offset` (a file
    /// another process sent), checked as [`Mapping::from_file`] does.
    pub fn from_fd(fd: OwnedFd, offset: u64, len: usize) -> Result<Self> {
        Self::from_file(File::from(fd), offset, len)
    }

    /// As [`Mapping::from_fd`], with every page of the mapping made
    /// present at once (`MAP_POPULATE`) instead of at its first access.
    /// For memory the data path uses at once and in whole (a DMA source
    /// area, a receive region): a first touch costs a page fault per 4 KiB,
    /// 10–20 µs each in a TCG guest, which the first large messages would
    /// otherwise pay (256 of them per MiB).
    pub fn from_fd_populated(fd: OwnedFd, offset: u64, len: usize) -> Result<Self> {
        let file = File::from(fd);
        Self::check_file(&file, offset, len)?;
        Self::build(file, offset, len, libc::MAP_POPULATE)
    }

    /// A regular file must hold the bytes mapped.
    fn check_file(file: &File, offset: u64, len: usize) -> Result<()> {
        let meta = file.metadata().map_err(os("fstat of the file to map"))?;
        let end = offset.checked_add(len as u64).ok_or_else(|| MemError::BadMap(format!("{offset:#x} + {len:#x}")))?;
        if meta.is_file() && meta.len() < end {
            return Err(MemError::BadMap(format!("bytes {offset:#x}..{end:#x} of a file of {:#x} bytes", meta.len())));
        }
        Ok(())
    }

    /// Maps `len` bytes of a device region: the VFIO device fd at the
    /// offset `VFIO_DEVICE_GET_REGION_INFO` gave for a BAR. The device
    /// fd reports no size (an anonymous inode); its driver checks the
    /// range and refuses a mapping that does not fit the BAR.
    pub fn device_region(fd: OwnedFd, offset: u64, len: usize) -> Result<Self> {
        offset.checked_add(len as u64).ok_or_else(|| MemError::BadMap(format!("{offset:#x} + {len:#x}")))?;
        Self::build(File::from(fd), offset, len, 0)
    }

    fn build(file: File, offset: u64, len: usize, flags: i32) -> Result<Self> {
        if len == 0 {
            return Err(MemError::BadMap("a mapping of 0 bytes".into()));
        }
        let region = MmapRegion::build(Some(FileOffset::new(file, offset)), len, A::PROT, libc::MAP_SHARED | flags)
            .map_err(|e| MemError::Os { what: format!("mmap of {len:#x} bytes at {offset:#x}"), err: mmap_err(e) })?;
        Ok(Mapping { region, _access: PhantomData })
    }

    /// Maps all of the existing file at `path` (opened read-only or
    /// read-write, as the mapping).
    pub fn open(path: &Path) -> Result<Self> {
        let f = OpenOptions::new()
            .read(true)
            .write(A::WRITE)
            .open(path)
            .map_err(os(format!("opening {}", path.display())))?;
        let len = f.metadata().map_err(os(format!("size of {}", path.display())))?.len();
        let len = usize::try_from(len).map_err(|_| MemError::BadMap(format!("{} is too large", path.display())))?;
        Self::from_file(f, 0, len).map_err(|e| match e {
            MemError::BadMap(m) => MemError::BadMap(format!("{}: {m}", path.display())),
            e => e,
        })
    }

    /// Maps BAR `bar` of PCI function `bdf` through its sysfs resource
    /// file (`/sys/bus/pci/devices/<bdf>/resource<bar>`), all of it.
    pub fn pci_resource(bdf: &str, bar: u32) -> Result<Self> {
        Self::open(&Path::new("/sys/bus/pci/devices").join(bdf).join(format!("resource{bar}")))
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.region.size()
    }

    /// Never true: empty mappings are refused.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where the mapping starts in this process (for C callers and for
    /// VFIO DMA maps; Rust code uses the checked accessors).
    pub fn as_ptr(&self) -> *mut u8 {
        self.region.as_ptr()
    }

    /// The file behind the mapping (to `flock` it, for example).
    pub fn file(&self) -> Option<&File> {
        self.region.file_offset().map(|f| f.file())
    }

    /// All of the mapping as a [`Window`].
    pub fn whole(&self) -> Window<'_, A> {
        Window { region: &self.region, base: 0, len: self.len(), _access: PhantomData }
    }

    /// The `len` bytes at `off`, as a [`Window`] that borrows the mapping.
    pub fn window(&self, off: usize, len: usize) -> Result<Window<'_, A>> {
        self.whole().window(off, len)
    }

    /// Volatile load of one naturally aligned word at `off`.
    pub fn load<T: Word>(&self, off: usize) -> Result<T> {
        self.whole().load(off)
    }

    /// Load of one naturally aligned word at `off` with acquire ordering:
    /// later loads see what was stored before the matching release store.
    pub fn load_acquire<T: Word>(&self, off: usize) -> Result<T> {
        self.whole().load_acquire(off)
    }

    /// Copies `buf.len()` bytes at `off` out of the mapping.
    pub fn read(&self, off: usize, buf: &mut [u8]) -> Result<()> {
        self.whole().read(off, buf)
    }

    /// `len` bytes at `off`, copied out.
    pub fn read_vec(&self, off: usize, len: usize) -> Result<Vec<u8>> {
        let mut v = vec![0u8; len];
        self.read(off, &mut v)?;
        Ok(v)
    }
}

fn mmap_err(e: vm_memory::mmap::MmapRegionError) -> io::Error {
    match e {
        vm_memory::mmap::MmapRegionError::Mmap(e) => e,
        e => io::Error::other(e.to_string()),
    }
}

impl Mapping<ReadWrite> {
    /// Creates (or reuses) the file at `path`, sizes it to `len` bytes and
    /// maps it read-write (a receive buffer in `/dev/shm`).
    pub fn create(path: &Path, len: usize) -> Result<Self> {
        if len == 0 {
            return Err(MemError::BadMap(format!("{}: a mapping of 0 bytes", path.display())));
        }
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(os(format!("creating {}", path.display())))?;
        f.set_len(len as u64).map_err(os(format!("sizing {} to {len} bytes", path.display())))?;
        Self::from_file(f, 0, len)
    }

    /// Volatile store of one naturally aligned word at `off`.
    pub fn store<T: Word>(&self, off: usize, v: T) -> Result<()> {
        self.whole().store(off, v)
    }

    /// Store of one naturally aligned word at `off` with release ordering:
    /// every earlier store is visible before it.
    pub fn store_release<T: Word>(&self, off: usize, v: T) -> Result<()> {
        self.whole().store_release(off, v)
    }

    /// Copies `src` to `off` (unordered, like `memcpy`).
    pub fn write(&self, off: usize, src: &[u8]) -> Result<()> {
        self.whole().write(off, src)
    }

    /// Copies `src` to `off` in ascending address order, see [`Window::write_ordered`].
    pub fn write_ordered(&self, off: usize, src: &[u8]) -> Result<()> {
        self.whole().write_ordered(off, src)
    }

    /// Sets `len` bytes at `off` to `byte`.
    pub fn fill(&self, off: usize, len: usize, byte: u8) -> Result<()> {
        self.whole().fill(off, len, byte)
    }
}

/// A checked sub-range of a [`Mapping`], borrowing it. Offsets are
/// relative to the window's start.
#[derive(Clone, Copy, Debug)]
pub struct Window<'a, A: Access> {
    region: &'a MmapRegion<()>,
    /// Offset of the window in its mapping (mappings are page aligned, so
    /// `base + off` has the alignment of the address).
    base: usize,
    len: usize,
    _access: PhantomData<&'a A>,
}

impl<'a, A: Access> Window<'a, A> {
    /// Bytes in the window.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a window of no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn check(&self, off: usize, len: usize) -> Result<()> {
        match off.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(MemError::OutOfBounds { off, len, size: self.len }),
        }
    }

    fn check_word<T: Word>(&self, off: usize) -> Result<()> {
        let width = std::mem::size_of::<T>();
        self.check(off, width)?;
        if (self.base + off) % width != 0 {
            return Err(MemError::Misaligned { off, width });
        }
        Ok(())
    }

    fn sub(&self, off: usize, len: usize) -> Result<VolatileSlice<'a, ()>> {
        self.check(off, len)?;
        self.region.get_slice(self.base + off, len).map_err(|_| MemError::OutOfBounds { off, len, size: self.len })
    }

    /// The `len` bytes at `off` of this window.
    pub fn window(&self, off: usize, len: usize) -> Result<Window<'a, A>> {
        self.check(off, len)?;
        Ok(Window { region: self.region, base: self.base + off, len, _access: PhantomData })
    }

    /// Volatile load of one naturally aligned word at `off`: exactly one
    /// access of that width (what device registers need).
    pub fn load<T: Word>(&self, off: usize) -> Result<T> {
        let s = self.word::<T>(off)?;
        Ok(s.get_ref::<T>(0).map_err(|_| self.oob::<T>(off))?.load())
    }

    /// Load of one naturally aligned word with acquire ordering.
    pub fn load_acquire<T: Word>(&self, off: usize) -> Result<T> {
        self.word::<T>(off)?.load(0, Ordering::Acquire).map_err(|_| self.oob::<T>(off))
    }

    /// The checked, aligned slice one word at `off` is accessed through.
    fn word<T: Word>(&self, off: usize) -> Result<VolatileSlice<'a, ()>> {
        self.check_word::<T>(off)?;
        self.sub(off, std::mem::size_of::<T>())
    }

    fn oob<T>(&self, off: usize) -> MemError {
        MemError::OutOfBounds { off, len: std::mem::size_of::<T>(), size: self.len }
    }

    /// Copies `buf.len()` bytes at `off` out of the window.
    pub fn read(&self, off: usize, buf: &mut [u8]) -> Result<()> {
        self.sub(off, buf.len())?.copy_to(buf);
        Ok(())
    }
}

impl Window<'_, ReadWrite> {
    /// Volatile store of one naturally aligned word at `off`: exactly one
    /// access of that width.
    pub fn store<T: Word>(&self, off: usize, v: T) -> Result<()> {
        let s = self.word::<T>(off)?;
        s.get_ref::<T>(0).map_err(|_| self.oob::<T>(off))?.store(v);
        Ok(())
    }

    /// Store of one naturally aligned word with release ordering: every
    /// earlier load and store of this thread is visible before it.
    pub fn store_release<T: Word>(&self, off: usize, v: T) -> Result<()> {
        self.word::<T>(off)?.store(v, 0, Ordering::Release).map_err(|_| self.oob::<T>(off))
    }

    /// Copies `src` to `off` with no promise about the order of the
    /// stores (a `memcpy`): for data published afterwards by a release store.
    pub fn write(&self, off: usize, src: &[u8]) -> Result<()> {
        self.sub(off, src.len())?.copy_from(src);
        Ok(())
    }

    /// Copies `src` to `off` in ascending address order, each store
    /// naturally aligned, at most 8 bytes wide, and a release store:
    /// MEMORY CHANNEL's ordering, a reader that sees a word also sees every
    /// byte before it in the same copy (`ordered_copy::ordered_store`).
    /// Checked as a whole first: a copy that does not fit stores nothing.
    pub fn write_ordered(&self, off: usize, src: &[u8]) -> Result<()> {
        let dst = self.sub(off, src.len())?;
        ordered_copy::ordered_store(&dst, self.base + off, src);
        Ok(())
    }

    /// Sets `len` bytes at `off` to `byte`.
    pub fn fill(&self, off: usize, len: usize, byte: u8) -> Result<()> {
        let s = self.sub(off, len)?;
        let chunk = [byte; 4096];
        let mut at = 0;
        while at < len {
            let n = (len - at).min(chunk.len());
            s.subslice(at, n)
                .map_err(|_| MemError::OutOfBounds { off: off + at, len: n, size: self.len() })?
                .copy_from(&chunk[..n]);
            at += n;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(len: u64) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("buf");
        std::fs::write(&p, vec![0u8; len as usize]).unwrap();
        (dir, p)
    }

    #[test]
    fn every_width_round_trips_and_lands_little_endian() {
        let (_d, p) = file(4096);
        let m = Mapping::<ReadWrite>::open(&p).unwrap();
        m.store::<u8>(1, 0xAB).unwrap();
        m.store::<u16>(2, 0xBEEF).unwrap();
        m.store::<u32>(4, 0xDEAD_BEEF).unwrap();
        m.store::<u64>(8, 0x0102_0304_0506_0708).unwrap();
        m.store_release::<u64>(16, 42).unwrap();
        assert_eq!(m.load::<u8>(1).unwrap(), 0xAB);
        assert_eq!(m.load::<u16>(2).unwrap(), 0xBEEF);
        assert_eq!(m.load::<u32>(4).unwrap(), 0xDEAD_BEEF);
        assert_eq!(m.load::<u64>(8).unwrap(), 0x0102_0304_0506_0708);
        assert_eq!(m.load_acquire::<u64>(16).unwrap(), 42);
        // The bytes reached the file, and a second (read-only) mapping sees them.
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!(&bytes[..16], &[0, 0xAB, 0xEF, 0xBE, 0xEF, 0xBE, 0xAD, 0xDE, 8, 7, 6, 5, 4, 3, 2, 1]);
        let ro = Mapping::<ReadOnly>::open(&p).unwrap();
        assert_eq!(ro.load::<u32>(4).unwrap(), 0xDEAD_BEEF);
        assert_eq!(ro.read_vec(1, 3).unwrap(), vec![0xAB, 0xEF, 0xBE]);
    }

    #[test]
    fn out_of_bounds_and_misaligned_are_errors_not_panics() {
        let (_d, p) = file(4096);
        let m = Mapping::<ReadWrite>::open(&p).unwrap();
        assert!(matches!(m.load::<u64>(4096), Err(MemError::OutOfBounds { off: 4096, len: 8, size: 4096 })));
        assert!(matches!(m.load::<u64>(4092), Err(MemError::OutOfBounds { .. })));
        assert!(matches!(m.store::<u32>(usize::MAX - 1, 1), Err(MemError::OutOfBounds { .. })));
        assert!(matches!(m.load::<u32>(2), Err(MemError::Misaligned { off: 2, width: 4 })));
        assert!(matches!(m.store_release::<u64>(4, 1), Err(MemError::Misaligned { .. })));
        let mut buf = [0u8; 16];
        assert!(matches!(m.read(4090, &mut buf), Err(MemError::OutOfBounds { .. })));
        assert!(matches!(m.write(usize::MAX, &buf), Err(MemError::OutOfBounds { .. })));
        assert!(matches!(m.fill(4000, 97, 1), Err(MemError::OutOfBounds { .. })));
        // A copy that does not fit stores nothing.
        assert!(m.write_ordered(4088, &[0xFF; 16]).is_err());
        assert_eq!(m.load::<u64>(4088).unwrap(), 0);
        // Windows are checked against their own bounds and alignment.
        let w = m.window(100, 20).unwrap();
        assert!(matches!(w.load::<u64>(16), Err(MemError::OutOfBounds { size: 20, .. })));
        assert!(matches!(w.load::<u64>(0), Err(MemError::Misaligned { off: 0, width: 8 })), "100 is not 8-aligned");
        assert!(w.load::<u32>(0).is_ok(), "100 is 4-aligned");
        assert!(matches!(w.load::<u32>(1), Err(MemError::Misaligned { .. })), "100 + 1 is not 4-aligned");
        assert!(w.load::<u32>(4).is_ok(), "100 + 4 is");
        assert!(matches!(m.window(4000, 200), Err(MemError::OutOfBounds { .. })));
        w.store::<u32>(4, 7).unwrap();
        assert_eq!(m.load::<u32>(104).unwrap(), 7);
    }

    #[test]
    fn bad_mappings_are_refused() {
        let (_d, p) = file(4096);
        let f = File::open(&p).unwrap();
        assert!(matches!(Mapping::<ReadOnly>::from_file(f, 0, 8192), Err(MemError::BadMap(_))));
        let f = File::open(&p).unwrap();
        assert!(matches!(Mapping::<ReadOnly>::from_file(f, 0, 0), Err(MemError::BadMap(_))));
        let f = File::open(&p).unwrap();
        assert!(matches!(Mapping::<ReadOnly>::from_file(f, u64::MAX - 10, 4096), Err(MemError::BadMap(_))));
        // Read-write needs a writable file.
        let f = File::open(&p).unwrap();
        assert!(matches!(Mapping::<ReadWrite>::from_file(f, 0, 4096), Err(MemError::Os { .. })));
        assert!(matches!(Mapping::<ReadOnly>::open(&p.with_extension("missing")), Err(MemError::Os { .. })));
        let empty = p.with_extension("empty");
        std::fs::write(&empty, b"").unwrap();
        assert!(matches!(Mapping::<ReadOnly>::open(&empty), Err(MemError::BadMap(_))));
    }

    /// Resident kB of this process's mappings of `path` (/proc/self/smaps).
    fn resident_kb(path: &Path) -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let name = path.to_str().unwrap();
        let mut mine = false;
        let mut kb = 0;
        for line in smaps.lines() {
            let first = line.split_whitespace().next().unwrap_or("");
            if first.contains('-') && !first.ends_with(':') {
                mine = line.ends_with(name);
            } else if mine && first == "Rss:" {
                kb += line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap();
            }
        }
        kb
    }

    #[test]
    fn populated_mappings_are_resident_at_once() {
        let (_d, p) = file(64 * 4096);
        let open = || OwnedFd::from(OpenOptions::new().read(true).write(true).open(&p).unwrap());
        let lazy = Mapping::<ReadWrite>::from_fd(open(), 0, 64 * 4096).unwrap();
        assert_eq!(resident_kb(&p), 0, "a plain mapping has no page until it is touched");
        drop(lazy);
        let m = Mapping::<ReadWrite>::from_fd_populated(open(), 4096, 63 * 4096).unwrap();
        assert_eq!(resident_kb(&p), 63 * 4, "every page is present at once");
        m.store::<u64>(0, 7).unwrap();
        assert_eq!(std::fs::read(&p).unwrap()[4096], 7);
        // The file is checked as for a plain mapping.
        assert!(matches!(Mapping::<ReadOnly>::from_fd_populated(open(), 0, 65 * 4096), Err(MemError::BadMap(_))));
        assert!(matches!(Mapping::<ReadOnly>::from_fd_populated(open(), 0, 0), Err(MemError::BadMap(_))));
    }

    #[test]
    fn create_sizes_the_file_and_fill_clears_it() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("rx");
        let m = Mapping::<ReadWrite>::create(&p, 3 * 4096).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 3 * 4096);
        m.fill(0, m.len(), 0x5A).unwrap();
        assert!(std::fs::read(&p).unwrap().iter().all(|&b| b == 0x5A));
        m.fill(10, 5000, 0).unwrap();
        let v = m.read_vec(0, 5020).unwrap();
        assert!(
            v[..10].iter().all(|&b| b == 0x5A)
                && v[10..5010].iter().all(|&b| b == 0)
                && v[5010..].iter().all(|&b| b == 0x5A)
        );
        // At an offset into a file.
        let f = OpenOptions::new().read(true).write(true).open(&p).unwrap();
        let tail = Mapping::<ReadWrite>::from_file(f, 4096, 8192).unwrap();
        tail.store::<u64>(0, 99).unwrap();
        assert_eq!(m.load::<u64>(4096).unwrap(), 99);
        assert!(m.file().is_some());
    }

    #[test]
    fn ordered_copies_use_aligned_stores_and_keep_unaligned_edges() {
        let (_d, p) = file(4096);
        let m = Mapping::<ReadWrite>::open(&p).unwrap();
        let data: Vec<u8> = (1..=29).collect();
        m.write_ordered(3, &data).unwrap();
        assert_eq!(m.read_vec(0, 34).unwrap(), [&[0u8; 3][..], &data, &[0, 0]].concat());
        let w = m.window(101, 50).unwrap();
        w.write_ordered(0, &data).unwrap();
        assert_eq!(m.read_vec(101, 29).unwrap(), data);
    }

    #[test]
    fn mappings_are_send_and_sync() {
        fn both<T: Send + Sync>() {}
        both::<Mapping<ReadOnly>>();
        both::<Mapping<ReadWrite>>();
        both::<Window<'static, ReadWrite>>();
    }
}
