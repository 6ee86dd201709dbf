//! Guest memory as the adapter sees it: the DMA maps QEMU sent.
//!
//! QEMU sends one `DMA_MAP` per mapped range, with the fd of the guest RAM
//! backend (a memfd) and the range's offset in it. While the guest's IOMMU
//! switches domains that is hundreds of 4 KiB maps, so the maps live in an
//! interval map (a `BTreeMap` keyed by start IOVA; vm-memory's `GuestMemory`
//! wants few, large, non-overlapping regions) and every distinct backing file
//! is mmapped once, whatever the number of maps into it, as a rust-vmm
//! `vm_memory::MmapRegion`. Every access goes through its bounds-checked
//! volatile and atomic accessors: this module has no `unsafe`.
//!
//! Threads: the vfio-user thread maps and unmaps (write lock); deliverers
//! (a hub's ordering thread, a link's receive thread) copy (read lock).
//!
//! Owns: the mmaps of guest RAM. Must not: write outside a mapped range or
//! into a read-only one — [`DmaSpace::write`] validates the whole span first
//! and touches nothing when any byte of it is unmapped.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, RwLock, Weak};

use vm_memory::{FileOffset, MmapRegion, VolatileMemory};

use ordered_copy::ordered_store;
use thiserror::Error;

/// Most distinct maps kept; advertised to QEMU as `max_dma_maps`.
pub const MAX_DMA_MAPS: usize = 65535;

/// Why a DMA map or access failed.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum DmaError {
    /// No map covers this address.
    #[error("DMA address {0:#x} is not mapped")]
    Unmapped(u64),
    /// The map covering this address is read-only for the device.
    #[error("DMA address {0:#x} is mapped read-only")]
    ReadOnly(u64),
    /// The map exists but has no fd: QEMU could not give us its memory.
    #[error("DMA address {0:#x} has no shared backing")]
    NoBacking(u64),
    /// A map request is malformed (zero size, wraps, overlaps, beyond the file).
    #[error("bad DMA map: {0}")]
    BadMap(String),
    /// Too many maps.
    #[error("more than {MAX_DMA_MAPS} DMA maps")]
    TooMany,
}

/// A map as [`DmaSpace::export`] gives it out.
#[derive(Debug)]
pub struct ExportedMap {
    /// First IOVA.
    pub iova: u64,
    /// Bytes.
    pub size: u64,
    /// The backing file and the offset of `iova` in it (`None`: a map QEMU
    /// sent without an fd).
    pub fd: Option<(OwnedFd, u64)>,
    /// Whether the device may write it.
    pub writable: bool,
}

/// One mmap of a backing file, shared by every range that points into it.
type Backing = MmapRegion<()>;

/// Makes sure nobody can shrink the file behind a map: a receive into a
/// page past a truncated end would kill the process with SIGBUS (on a hub's
/// local ports, every guest's adapter at once). QEMU's
/// `memory-backend-memfd` seals its memfd against shrinking already
/// (`seal=on`, the default); a memfd that allows sealing gets the seal here;
/// anything else (a plain file, a memfd created without
/// `MFD_ALLOW_SEALING`) is refused.
fn seal_against_shrinking(fd: &OwnedFd) -> Result<(), DmaError> {
    use nix::fcntl::{fcntl, FcntlArg, SealFlag};
    let refuse = |why: String| {
        Err(DmaError::BadMap(format!(
            "guest memory must be a memfd sealed against shrinking (QEMU: memory-backend-memfd): {why}"
        )))
    };
    match fcntl(fd.as_raw_fd(), FcntlArg::F_GET_SEALS) {
        Ok(s) if SealFlag::from_bits_truncate(s).contains(SealFlag::F_SEAL_SHRINK) => Ok(()),
        Ok(_) => match fcntl(fd.as_raw_fd(), FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_SHRINK)) {
            Ok(_) => Ok(()),
            Err(e) => refuse(format!("it cannot be sealed ({e})")),
        },
        Err(e) => refuse(format!("it is not a memfd ({e})")),
    }
}

/// Maps all of `fd` (shared, read-write).
fn map_file(fd: OwnedFd, len: usize) -> Result<Backing, DmaError> {
    MmapRegion::from_file(FileOffset::new(File::from(fd), 0), len)
        .map_err(|e| DmaError::BadMap(format!("mmap of {len} bytes failed: {e}")))
}

#[derive(Clone)]
struct Range {
    end: u64,
    /// `None` for maps QEMU sent without an fd (ROMs and the like).
    backing: Option<(Arc<Backing>, u64)>,
    writable: bool,
}

#[derive(Default)]
struct Maps {
    ranges: BTreeMap<u64, Range>,
    /// Backing files by (device, inode, size), so each is mmapped once.
    files: HashMap<(u64, u64, u64), Weak<Backing>>,
}

/// The device's view of guest memory.
#[derive(Default)]
pub struct DmaSpace {
    maps: RwLock<Maps>,
}

impl DmaSpace {
    /// Creates an empty space: every access fails until QEMU maps memory.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a map of `[iova, iova+size)` to `fd` at `offset` (no fd: recorded,
    /// but not accessible).
    pub fn map(&self, iova: u64, size: u64, fd: Option<OwnedFd>, offset: u64, writable: bool) -> Result<(), DmaError> {
        let end = iova
            .checked_add(size)
            .filter(|_| size > 0)
            .ok_or_else(|| DmaError::BadMap(format!("iova {iova:#x} size {size:#x}")))?;
        let mut maps = self.maps.write().unwrap();
        if maps.ranges.len() >= MAX_DMA_MAPS {
            return Err(DmaError::TooMany);
        }
        if let Some((s, r)) = maps.ranges.range(..end).next_back() {
            if r.end > iova {
                return Err(DmaError::BadMap(format!("[{iova:#x}, {end:#x}) overlaps [{s:#x}, {:#x})", r.end)));
            }
        }
        let backing = match fd {
            None => None,
            Some(fd) => {
                let st = nix::sys::stat::fstat(fd.as_raw_fd()).map_err(|e| DmaError::BadMap(format!("fstat: {e}")))?;
                seal_against_shrinking(&fd)?;
                let file_len = st.st_size as u64;
                if offset.checked_add(size).is_none_or(|e| e > file_len) {
                    return Err(DmaError::BadMap(format!(
                        "offset {offset:#x} + size {size:#x} beyond the {file_len:#x}-byte file"
                    )));
                }
                let key = (st.st_dev, st.st_ino, file_len);
                let b = match maps.files.get(&key).and_then(Weak::upgrade) {
                    Some(b) => b,
                    None => {
                        let b = Arc::new(map_file(fd, file_len as usize)?);
                        maps.files.insert(key, Arc::downgrade(&b));
                        b
                    }
                };
                Some((b, offset))
            }
        };
        maps.ranges.insert(iova, Range { end, backing, writable });
        Ok(())
    }

    /// Removes every map inside `[iova, iova+size)`, trimming maps that
    /// straddle its edges. Returns the number of bytes unmapped.
    pub fn unmap(&self, iova: u64, size: u64) -> u64 {
        let end = iova.saturating_add(size);
        let mut maps = self.maps.write().unwrap();
        let mut removed = 0;
        let starts: Vec<u64> =
            maps.ranges.range(..end).rev().take_while(|(_, r)| r.end > iova).map(|(s, _)| *s).collect();
        for s in starts {
            let r = maps.ranges.remove(&s).unwrap();
            if s < iova {
                let mut left = r.clone();
                left.end = iova;
                maps.ranges.insert(s, left);
            }
            if r.end > end {
                let mut right = r.clone();
                if let Some((_, off)) = right.backing.as_mut() {
                    *off += end - s;
                }
                maps.ranges.insert(end, right);
            }
            removed += r.end.min(end) - s.max(iova);
        }
        maps.files.retain(|_, w| w.strong_count() > 0);
        removed
    }

    /// Drops every map (device reset, client gone).
    pub fn clear(&self) {
        let mut maps = self.maps.write().unwrap();
        maps.ranges.clear();
        maps.files.clear();
    }

    /// Every map, each with its own duplicate of the backing file's fd
    /// (what [`DmaSpace::map`] takes back, in this process or the next).
    pub fn export(&self) -> Result<Vec<ExportedMap>, DmaError> {
        let maps = self.maps.read().unwrap();
        maps.ranges
            .iter()
            .map(|(&iova, r)| {
                let fd = match &r.backing {
                    None => None,
                    Some((b, offset)) => {
                        let file = b.file_offset().map(|f| f.file()).ok_or(DmaError::NoBacking(iova))?;
                        let dup =
                            file.try_clone().map_err(|e| DmaError::BadMap(format!("dup of a backing fd: {e}")))?;
                        Some((OwnedFd::from(dup), *offset))
                    }
                };
                Ok(ExportedMap { iova, size: r.end - iova, fd, writable: r.writable })
            })
            .collect()
    }

    /// Number of maps held.
    pub fn len(&self) -> usize {
        self.maps.read().unwrap().ranges.len()
    }

    /// True when nothing is mapped.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Resolves `[iova, iova+len)` into pieces of mapped files, or fails
    /// without side effects.
    fn resolve(maps: &Maps, iova: u64, len: usize, write: bool) -> Result<Vec<(&Backing, usize, usize)>, DmaError> {
        let mut out = Vec::with_capacity(2);
        let mut at = iova;
        let mut left = len as u64;
        while left > 0 {
            let (start, r) =
                maps.ranges.range(..=at).next_back().filter(|(_, r)| r.end > at).ok_or(DmaError::Unmapped(at))?;
            if write && !r.writable {
                return Err(DmaError::ReadOnly(at));
            }
            let (b, off) = r.backing.as_ref().ok_or(DmaError::NoBacking(at))?;
            let n = left.min(r.end - at);
            out.push((&**b, (off + (at - start)) as usize, n as usize));
            at += n;
            left -= n;
        }
        Ok(out)
    }

    /// Copies `data` into guest memory at `iova` in ascending address order
    /// ([`ordered_copy::ordered_store`]). Either every byte is written or none is.
    pub fn write(&self, iova: u64, data: &[u8]) -> Result<(), DmaError> {
        if iova.checked_add(data.len() as u64).is_none() {
            return Err(DmaError::Unmapped(iova));
        }
        let maps = self.maps.read().unwrap();
        let chunks = Self::resolve(&maps, iova, data.len(), true)?;
        let mut src = data;
        for (b, off, n) in chunks {
            // Inside the file: checked against its size when the map was added.
            let slice = b.get_slice(off, n).map_err(|_| DmaError::Unmapped(iova))?;
            ordered_store(&slice, off, &src[..n]);
            src = &src[n..];
        }
        Ok(())
    }

    /// Checks that `[iova, iova+len)` is all in mapped guest memory with a
    /// backing (readable by the device), without touching it.
    pub fn check_readable(&self, iova: u64, len: u64) -> Result<(), DmaError> {
        if iova.checked_add(len).is_none() {
            return Err(DmaError::Unmapped(iova));
        }
        let maps = self.maps.read().unwrap();
        let mut at = iova;
        let end = iova + len;
        while at < end {
            let (_, r) =
                maps.ranges.range(..=at).next_back().filter(|(_, r)| r.end > at).ok_or(DmaError::Unmapped(at))?;
            r.backing.as_ref().ok_or(DmaError::NoBacking(at))?;
            at = r.end;
        }
        Ok(())
    }

    /// Copies guest memory at `iova` into `buf`.
    pub fn read(&self, iova: u64, buf: &mut [u8]) -> Result<(), DmaError> {
        if iova.checked_add(buf.len() as u64).is_none() {
            return Err(DmaError::Unmapped(iova));
        }
        let maps = self.maps.read().unwrap();
        let chunks = Self::resolve(&maps, iova, buf.len(), false)?;
        let mut at = 0;
        for (b, off, n) in chunks {
            b.get_slice(off, n).map_err(|_| DmaError::Unmapped(iova))?.copy_to(&mut buf[at..at + n]);
            at += n;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memfd(len: u64) -> OwnedFd {
        let fd =
            nix::sys::memfd::memfd_create(c"dma-test", nix::sys::memfd::MemFdCreateFlag::MFD_ALLOW_SEALING).unwrap();
        nix::unistd::ftruncate(&fd, len as i64).unwrap();
        fd
    }

    fn dup(fd: &OwnedFd) -> OwnedFd {
        fd.try_clone().unwrap()
    }

    #[test]
    fn per_page_maps_share_one_backing_and_split_writes() {
        let ram = memfd(1 << 20);
        let dma = DmaSpace::new();
        // IOVA pages mapped out of order onto RAM pages, like a guest IOMMU does.
        dma.map(0x1000_0000, 4096, Some(dup(&ram)), 0x5000, true).unwrap();
        dma.map(0x1000_1000, 4096, Some(dup(&ram)), 0x2000, true).unwrap();
        assert_eq!(dma.maps.read().unwrap().files.len(), 1);
        let data: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
        dma.write(0x1000_0000, &data).unwrap();
        let mut back = vec![0u8; 8192];
        dma.read(0x1000_0000, &mut back).unwrap();
        assert_eq!(back, data);
        // bytes landed at the two file offsets
        let file = std::fs::File::from(dup(&ram));
        let mut page = vec![0u8; 4096];
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut page, 0x2000).unwrap();
        assert_eq!(&page[..], &data[4096..]);
    }

    #[test]
    fn write_outside_maps_touches_nothing() {
        let ram = memfd(1 << 16);
        let dma = DmaSpace::new();
        dma.map(0x10000, 4096, Some(dup(&ram)), 0, true).unwrap();
        // straddles the end of the map: refused as a whole
        assert_eq!(dma.write(0x10000 + 4000, &[0xAA; 200]), Err(DmaError::Unmapped(0x11000)));
        let mut b = vec![0u8; 4096];
        dma.read(0x10000, &mut b).unwrap();
        assert!(b.iter().all(|&x| x == 0));
        assert_eq!(dma.write(u64::MAX - 3, &[1; 8]), Err(DmaError::Unmapped(u64::MAX - 3)));
    }

    #[test]
    fn unmap_trims_and_readonly_is_enforced() {
        let ram = memfd(1 << 16);
        let dma = DmaSpace::new();
        dma.map(0, 0x4000, Some(dup(&ram)), 0, true).unwrap();
        assert_eq!(dma.unmap(0x1000, 0x1000), 0x1000);
        assert_eq!(dma.len(), 2);
        assert!(dma.write(0x1800, &[1]).is_err());
        dma.write(0x2000, &[7]).unwrap();
        let mut b = [0u8];
        dma.read(0x2000, &mut b).unwrap();
        assert_eq!(b[0], 7);
        dma.map(0x8000, 0x1000, Some(dup(&ram)), 0x8000, false).unwrap();
        assert_eq!(dma.write(0x8000, &[1]), Err(DmaError::ReadOnly(0x8000)));
        assert!(matches!(dma.map(0x3000, 0x2000, None, 0, true), Err(DmaError::BadMap(_))));
        assert!(matches!(dma.map(0x10000, 0x1000, Some(dup(&ram)), 0xF800, true), Err(DmaError::BadMap(_))));
        dma.map(0x20000, 0x1000, None, 0, true).unwrap();
        assert_eq!(dma.write(0x20000, &[1]), Err(DmaError::NoBacking(0x20000)));
    }

    /// A map is only taken when the memory behind it cannot shrink under
    /// the device (a receive past a truncated end is a SIGBUS): unsealable
    /// files are refused, sealable memfds are sealed.
    #[test]
    fn backing_that_could_shrink_is_sealed_or_refused() {
        use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
        let dma = DmaSpace::new();
        let plain = memfd_create(c"unsealable", MemFdCreateFlag::empty()).unwrap();
        nix::unistd::ftruncate(&plain, 1 << 16).unwrap();
        match dma.map(0, 0x1000, Some(plain), 0, true) {
            Err(DmaError::BadMap(m)) => assert!(m.contains("sealed against shrinking"), "{m}"),
            other => panic!("an unsealable memfd was accepted: {other:?}"),
        }
        let file = tempfile::tempfile().unwrap();
        file.set_len(1 << 16).unwrap();
        assert!(matches!(dma.map(0, 0x1000, Some(OwnedFd::from(file)), 0, true), Err(DmaError::BadMap(_))));
        assert!(dma.is_empty());

        let ram = memfd(1 << 16);
        dma.map(0, 0x4000, Some(dup(&ram)), 0, true).unwrap();
        assert_eq!(
            nix::unistd::ftruncate(&ram, 0x1000),
            Err(nix::errno::Errno::EPERM),
            "the file behind a map can still shrink"
        );
        dma.write(0x3000, &[9; 8]).unwrap();
        let mut b = [0u8; 8];
        dma.read(0x3000, &mut b).unwrap();
        assert_eq!(b, [9; 8]);
    }
}
