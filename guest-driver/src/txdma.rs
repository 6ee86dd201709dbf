//! Transmit DMA (`docs/adapter.md`, "Transmit DMA"): a safe API over the
//! adapter's descriptor ring.
//!
//! A [`DmaRing`] owns the ring's memory (a [`Mapping`] from [`crate::rx_buffer`],
//! mapped for the adapter with [`crate::vfio::VfioDevice::map_dma`]) and the
//! engine's registers while it lives: [`Adapter::dma_ring`] sets it up,
//! [`DmaRing::post`] writes a descriptor, [`DmaRing::ring`] rings the
//! doorbell, [`DmaRing::wait`] polls the written-back status until a
//! deadline. Dropping it turns the engine off (the adapter finishes what was
//! posted first) and unmaps the ring. Source buffers are the caller's: any
//! memory it mapped with `map_dma`, named by IOVA.
//!
//! The node's ring is imcd's (it owns the adapter); its client processes
//! post into it through a [`SharedRing`], built from what imcd hands over
//! (the ring's memory and a mapping of the registers for the doorbell):
//! they take turns under an `flock` of the ring, and the adapter's
//! `DMA_TAIL` is the truth about the next slot. Descriptors are encoded,
//! and written-back statuses read, by the same code for both.
//!
//! Threads: a [`DmaRing`] has one owner (`&mut self` to post); the
//! registers are reached through [`DmaRegs`], so the ring logic runs
//! against a fake in tests. A [`SharedRing`] may be shared by threads
//! (`&self`; the `flock` serialises posting).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

use guest_mem::{Mapping, MemError, ReadWrite};
use regs::dma::{self, status, DESC_SIZE, DONE};
use regs::{caps, reg, PAGE_SIZE};
use thiserror::Error;

use crate::vfio::VfioError;
use crate::Adapter;

/// IOVA where [`Adapter::dma_ring`] callers conventionally put the ring
/// (below [`crate::RX_IOVA_BASE`]).
pub const DMA_RING_IOVA: u64 = 0x0800_0000;

/// Why a transmit DMA call failed.
#[derive(Debug, Error)]
pub enum DmaError {
    /// The adapter has no transmit DMA engine (CAPS.TX_DMA clear).
    #[error("the adapter has no transmit DMA engine (CAPS {0:#x})")]
    NoEngine(u32),
    /// A ring size the engine does not take.
    #[error("ring size {0} is not a power of two from 1 to {max}", max = dma::MAX_RING)]
    BadSize(u32),
    /// Every slot holds a descriptor not yet retired.
    #[error("the ring is full ({0} descriptors posted and not retired)")]
    Full(u32),
    /// The index was never posted, or its slot was reused since.
    #[error("descriptor {0} is not in the ring")]
    NotPosted(u32),
    /// The deadline passed before the descriptor was retired.
    #[error("descriptor {index} not retired after {waited:?} (DMA_STATUS {dma_status:#x})")]
    Timeout {
        /// The descriptor.
        index: u32,
        /// How long it was waited for.
        waited: Duration,
        /// DMA_STATUS at the deadline.
        dma_status: u32,
    },
    /// The engine retired the descriptor with an error status.
    #[error("descriptor {index} failed: {name} (code {code}) after {bytes} bytes")]
    Failed {
        /// The descriptor.
        index: u32,
        /// `regs::dma::status` code.
        code: u32,
        /// Its name.
        name: &'static str,
        /// Bytes sent before the failure.
        bytes: u32,
    },
    /// The ring stopped without retiring the descriptor (DMA_STATUS says why:
    /// the ring outside mapped memory, bus mastering off, a reset).
    #[error("the engine dropped descriptor {index}: {name} (DMA_STATUS {dma_status:#x})")]
    Dropped {
        /// The descriptor.
        index: u32,
        /// DMA_STATUS.
        dma_status: u32,
        /// Name of its code.
        name: &'static str,
    },
    /// A descriptor's length is 0 or over 4 GiB − 1.
    #[error("length {0} is not from 1 to 2^32-1 bytes")]
    BadLength(u64),
    /// A slot's descriptor is not the one posted there as `index`: the slot
    /// was reused (more than a ring's worth of transfers were posted since)
    /// and the outcome is lost.
    #[error("descriptor {0}'s slot was reused before its status was read")]
    Overwritten(u32),
    /// Taking the shared ring's `flock`.
    #[error("locking the DMA ring: {0}")]
    Lock(std::io::Error),
    /// Allocating or mapping the ring.
    #[error("ring memory: {0}")]
    Mem(#[from] MemError),
    /// Mapping the ring for the device.
    #[error("ring DMA map: {0}")]
    Vfio(#[from] VfioError),
}

/// One transfer: `len` bytes of guest memory at IOVA `src` to MEMORY
/// CHANNEL address `mc_addr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Descriptor {
    /// Source IOVA (memory the caller mapped for the adapter).
    pub src: u64,
    /// Global MEMORY CHANNEL address of the first byte.
    pub mc_addr: u64,
    /// Bytes, 1 to 2^32 − 1.
    pub len: u64,
    /// Raise the DMA interrupt cause when retired.
    pub interrupt: bool,
}

impl Descriptor {
    /// The 32 bytes the engine reads (status 0: not retired).
    pub fn encode(&self) -> Result<[u8; DESC_SIZE as usize], DmaError> {
        let len = u32::try_from(self.len).ok().filter(|&l| l > 0).ok_or(DmaError::BadLength(self.len))?;
        let mut b = [0u8; DESC_SIZE as usize];
        b[dma::SRC as usize..][..8].copy_from_slice(&self.src.to_le_bytes());
        b[dma::DEST as usize..][..8].copy_from_slice(&self.mc_addr.to_le_bytes());
        b[dma::LEN as usize..][..4].copy_from_slice(&len.to_le_bytes());
        let flags = if self.interrupt { dma::flags::INT } else { 0 };
        b[dma::FLAGS as usize..][..4].copy_from_slice(&flags.to_le_bytes());
        Ok(b)
    }
}

/// The adapter's registers as the ring uses them.
pub trait DmaRegs {
    /// Reads a register.
    fn reg(&self, off: u64) -> u32;
    /// Writes a register.
    fn set_reg(&self, off: u64, v: u32);
    /// Undoes the DMA map of the ring's memory (when the ring is dropped).
    fn unmap(&self, _iova: u64, _len: u64) {}
}

impl DmaRegs for Adapter {
    fn reg(&self, off: u64) -> u32 {
        Adapter::reg(self, off)
    }
    fn set_reg(&self, off: u64, v: u32) {
        Adapter::set_reg(self, off, v)
    }
    fn unmap(&self, iova: u64, len: u64) {
        let _ = self.dev.unmap_dma(iova, len);
    }
}

impl<T: DmaRegs + ?Sized> DmaRegs for &T {
    fn reg(&self, off: u64) -> u32 {
        (**self).reg(off)
    }
    fn set_reg(&self, off: u64, v: u32) {
        (**self).set_reg(off, v)
    }
    fn unmap(&self, iova: u64, len: u64) {
        (**self).unmap(iova, len)
    }
}

impl<T: DmaRegs + ?Sized> DmaRegs for std::sync::Arc<T> {
    fn reg(&self, off: u64) -> u32 {
        (**self).reg(off)
    }
    fn set_reg(&self, off: u64, v: u32) {
        (**self).set_reg(off, v)
    }
    fn unmap(&self, iova: u64, len: u64) {
        (**self).unmap(iova, len)
    }
}

/// A transmit DMA ring, in memory this process owns.
pub struct DmaRing<R: DmaRegs> {
    regs: R,
    mem: Mapping<ReadWrite>,
    iova: u64,
    size: u32,
    /// One past the last descriptor posted (free-running, as DMA_TAIL).
    tail: u32,
    /// Posted up to here when the doorbell last rang.
    rung: u32,
}

impl Adapter {
    /// True when the adapter has the transmit DMA engine.
    pub fn has_tx_dma(&self) -> bool {
        self.reg(reg::CAPS) & caps::TX_DMA != 0
    }

    /// Sets up a ring of `size` descriptors in a new file `path` (in
    /// `/dev/shm`), mapped for the adapter at `iova`.
    pub fn dma_ring(&self, path: &Path, iova: u64, size: u32) -> Result<DmaRing<&Adapter>, DmaError> {
        let caps = self.reg(reg::CAPS);
        if caps & caps::TX_DMA == 0 {
            return Err(DmaError::NoEngine(caps));
        }
        check_size(size)?;
        let pages = (size as u64 * DESC_SIZE).div_ceil(PAGE_SIZE);
        let mem = crate::rx_buffer(path, pages)?;
        self.dev.map_dma(&mem, iova)?;
        DmaRing::with_memory(self, mem, iova, size)
    }
}

fn check_size(size: u32) -> Result<(), DmaError> {
    if size == 0 || !size.is_power_of_two() || size > dma::MAX_RING {
        return Err(DmaError::BadSize(size));
    }
    Ok(())
}

impl<R: DmaRegs> DmaRing<R> {
    /// Programs the engine with a ring in `mem` (already mapped for the
    /// adapter at `iova`, 32-byte aligned). The ring starts empty at index 0.
    pub fn with_memory(regs: R, mem: Mapping<ReadWrite>, iova: u64, size: u32) -> Result<Self, DmaError> {
        check_size(size)?;
        let need = (size as u64 * DESC_SIZE) as usize;
        if mem.len() < need || iova % DESC_SIZE != 0 {
            return Err(DmaError::Mem(MemError::BadMap(format!(
                "a ring of {size} descriptors needs {need} bytes at a 32-byte aligned IOVA ({} bytes at {iova:#x})",
                mem.len()
            ))));
        }
        mem.fill(0, need, 0)?;
        regs.set_reg(reg::DMA_RING_LO, iova as u32);
        regs.set_reg(reg::DMA_RING_HI, (iova >> 32) as u32);
        regs.set_reg(reg::DMA_RING_SIZE, size);
        Ok(DmaRing { regs, mem, iova, size, tail: 0, rung: 0 })
    }

    fn slot(&self, index: u32) -> usize {
        ((index & (self.size - 1)) as u64 * DESC_SIZE) as usize
    }

    /// Descriptors posted and not yet retired (as far as the adapter says).
    pub fn in_flight(&self) -> u32 {
        self.tail.wrapping_sub(self.regs.reg(reg::DMA_HEAD))
    }

    /// Writes a descriptor into the next slot; returns its index. It is
    /// sent once [`DmaRing::ring`] rings the doorbell.
    pub fn post(&mut self, d: &Descriptor) -> Result<u32, DmaError> {
        let bytes = d.encode()?;
        let busy = self.in_flight();
        if busy >= self.size {
            return Err(DmaError::Full(busy));
        }
        let index = self.tail;
        let at = self.slot(index);
        self.mem.write(at, &bytes[..dma::BYTES as usize])?;
        // Status (and bytes) last, as one 8-byte store: 0 = not retired.
        self.mem.store_release::<u64>(at + dma::BYTES as usize, 0)?;
        self.tail = index.wrapping_add(1);
        Ok(index)
    }

    /// Rings the doorbell: the engine sends everything posted. Stores made
    /// before this go out before the transfer, stores made after it after.
    pub fn ring(&mut self) {
        if self.rung != self.tail {
            // The descriptors are in memory before the doorbell store.
            fence(Ordering::SeqCst);
            self.regs.set_reg(reg::DMA_TAIL, self.tail);
            self.rung = self.tail;
        }
    }

    /// [`DmaRing::post`] then [`DmaRing::ring`].
    pub fn send(&mut self, d: &Descriptor) -> Result<u32, DmaError> {
        let i = self.post(d)?;
        self.ring();
        Ok(i)
    }

    /// The written-back (code, bytes) of descriptor `index`, or None while
    /// it is not retired.
    pub fn completion(&self, index: u32) -> Result<Option<(u32, u32)>, DmaError> {
        if self.tail.wrapping_sub(index).wrapping_sub(1) >= self.size {
            return Err(DmaError::NotPosted(index));
        }
        let back = self.mem.load_acquire::<u64>(self.slot(index) + dma::BYTES as usize)?;
        Ok(retired(back))
    }

    /// Waits until descriptor `index` is retired or `deadline` passes;
    /// returns the bytes sent, or the error status.
    pub fn wait(&self, index: u32, deadline: Instant) -> Result<u32, DmaError> {
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            if let Some((code, bytes)) = self.completion(index)? {
                if code == status::OK {
                    return Ok(bytes);
                }
                return Err(DmaError::Failed { index, code, name: status::name(code), bytes });
            }
            let dma_status = self.regs.reg(reg::DMA_STATUS);
            if dma_status & dma::BUSY == 0 {
                // Idle, and this one not retired: dropped, or retired just now.
                if self.completion(index)?.is_some() {
                    continue;
                }
                let code = dma_status & 0xFF;
                return Err(DmaError::Dropped { index, dma_status, name: status::name(code) });
            }
            if Instant::now() >= deadline {
                return Err(DmaError::Timeout { index, waited: start.elapsed(), dma_status });
            }
            spins += 1;
            if spins > 64 {
                std::thread::sleep(Duration::from_micros(50));
            } else {
                std::hint::spin_loop();
            }
        }
    }

    /// DMA_STATUS: bit 31 busy, bits 0–7 the last failure's code.
    pub fn dma_status(&self) -> u32 {
        self.regs.reg(reg::DMA_STATUS)
    }

    /// The ring's IOVA.
    pub fn iova(&self) -> u64 {
        self.iova
    }
}

/// A written-back status word: `Some((code, bytes))` once retired.
fn retired(back: u64) -> Option<(u32, u32)> {
    let st = (back >> 32) as u32;
    (st & DONE != 0).then_some((st & 0xFF, back as u32))
}

/// Holds a ring's `flock` while it lives.
struct RingLock<'a>(&'a File);

impl<'a> RingLock<'a> {
    fn take(f: &'a File) -> Result<RingLock<'a>, DmaError> {
        loop {
            // SAFETY: flock(2) on a file we hold open.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return Ok(RingLock(f));
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(DmaError::Lock(e));
            }
        }
    }
}

impl Drop for RingLock<'_> {
    fn drop(&mut self) {
        // SAFETY: flock(2) on a file we hold open.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// A client process's way into the node's ring, which imcd set up: the
/// ring's memory, the doorbell (the registers as imcd maps them), and an
/// `flock` of the ring so that the processes of the node take turns for a
/// slot and one doorbell store.
pub struct SharedRing {
    ring: Mapping<ReadWrite>,
    /// Our own open file description of the ring (what `flock` locks).
    file: File,
    entries: u32,
    regs: Mapping<ReadWrite>,
}

impl SharedRing {
    /// A ring of `entries` descriptors in `ring`, with `regs` the
    /// adapter's registers (DMA_TAIL, DMA_HEAD, DMA_STATUS).
    pub fn new(ring: Mapping<ReadWrite>, entries: u32, regs: Mapping<ReadWrite>) -> Result<SharedRing, MemError> {
        if !entries.is_power_of_two() || (ring.len() as u64) < entries as u64 * DESC_SIZE {
            return Err(MemError::BadMap(format!("a ring of {entries} descriptors in {} bytes", ring.len())));
        }
        if (regs.len() as u64) < reg::DMA_BYTES + 4 {
            return Err(MemError::BadMap(format!("registers mapped over {} bytes", regs.len())));
        }
        let file = ring
            .file()
            .ok_or_else(|| MemError::BadMap("the ring has no file".into()))?
            .try_clone()
            .map_err(|err| MemError::Os { what: "the ring's file".into(), err })?;
        Ok(SharedRing { ring, file, entries, regs })
    }

    fn reg(&self, off: u64) -> u32 {
        self.regs.load::<u32>(off as usize).unwrap_or(u32::MAX)
    }

    fn slot(&self, index: u32) -> usize {
        ((index & (self.entries - 1)) as u64 * DESC_SIZE) as usize
    }

    /// Writes `d` into the next slot and rings the doorbell; returns its
    /// index. Stores made after this returns (through any transmit window
    /// of the node) reach every receiver after the transfer's bytes.
    pub fn post(&self, d: &Descriptor) -> Result<u32, DmaError> {
        let bytes = d.encode()?;
        let _lock = RingLock::take(&self.file)?;
        // The adapter's tail is the truth: a process killed between writing
        // a slot and ringing leaves the slot to the next poster.
        let tail = self.reg(reg::DMA_TAIL);
        let at = self.slot(tail);
        let back = self.ring.load_acquire::<u64>(at + dma::BYTES as usize)?;
        let used = self.ring.load::<u32>(at + dma::LEN as usize)? != 0;
        if used && retired(back).is_none() {
            // Not retired: still in flight, or dropped by the engine.
            let busy = tail.wrapping_sub(self.reg(reg::DMA_HEAD));
            if busy >= self.entries {
                return Err(DmaError::Full(busy));
            }
        }
        self.ring.write(at, &bytes[..dma::BYTES as usize])?;
        // Status (and bytes) last: 0 = not retired.
        self.ring.store_release::<u64>(at + dma::BYTES as usize, 0)?;
        // The descriptor is in memory before the doorbell store.
        fence(Ordering::SeqCst);
        self.regs.store::<u32>(reg::DMA_TAIL as usize, tail.wrapping_add(1))?;
        Ok(tail)
    }

    /// The outcome of `d`, posted as `index`: `Some(bytes)` when it was
    /// sent whole, `None` while it is in flight, or why it failed (its slot
    /// holds another descriptor now: [`DmaError::Overwritten`]).
    pub fn outcome(&self, index: u32, d: &Descriptor) -> Result<Option<u32>, DmaError> {
        let at = self.slot(index);
        let back = self.ring.load_acquire::<u64>(at + dma::BYTES as usize)?;
        // Three loads, no encoding: a waiter polls this in a loop, and
        // under TCG every instruction of the poll is host time the engine
        // does not get.
        let mine = self.ring.load::<u64>(at + dma::SRC as usize)? == d.src
            && self.ring.load::<u64>(at + dma::DEST as usize)? == d.mc_addr
            && u64::from(self.ring.load::<u32>(at + dma::LEN as usize)?) == d.len;
        if !mine {
            return Err(DmaError::Overwritten(index));
        }
        match retired(back) {
            None => Ok(None),
            Some((status::OK, bytes)) => Ok(Some(bytes)),
            Some((code, bytes)) => Err(DmaError::Failed { index, code, name: status::name(code), bytes }),
        }
    }

    /// As [`SharedRing::outcome`], and a transfer the engine stopped
    /// without retiring (it is idle, and ours is not retired) is an error
    /// ([`DmaError::Dropped`]) instead of in flight for ever. Reads a
    /// register when the transfer is not retired: a trapped load.
    pub fn check(&self, index: u32, d: &Descriptor) -> Result<Option<u32>, DmaError> {
        if let Some(bytes) = self.outcome(index, d)? {
            return Ok(Some(bytes));
        }
        let dma_status = self.dma_status();
        if dma_status & dma::BUSY != 0 {
            return Ok(None);
        }
        // Idle with ours not retired: dropped, or retired just now.
        match self.outcome(index, d)? {
            Some(bytes) => Ok(Some(bytes)),
            None => Err(DmaError::Dropped { index, dma_status, name: status::name(dma_status & 0xFF) }),
        }
    }

    /// DMA_STATUS (a trapped load).
    pub fn dma_status(&self) -> u32 {
        self.reg(reg::DMA_STATUS)
    }
}

impl<R: DmaRegs> Drop for DmaRing<R> {
    fn drop(&mut self) {
        // The adapter finishes what was posted before it takes this.
        self.regs.set_reg(reg::DMA_RING_SIZE, 0);
        self.regs.unmap(self.iova, self.mem.len() as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::{Cell, RefCell};
    use std::collections::HashMap;

    /// Registers of a fake engine that retires every descriptor at the
    /// doorbell with the status `code`, writing into the same memory.
    struct Fake<'m> {
        regs: RefCell<HashMap<u64, u32>>,
        ring: &'m Mapping<ReadWrite>,
        code: Cell<u32>,
        retire: Cell<bool>,
    }

    impl<'m> Fake<'m> {
        fn new(ring: &'m Mapping<ReadWrite>, code: u32, retire: bool) -> Self {
            Fake { regs: RefCell::new(HashMap::new()), ring, code: Cell::new(code), retire: Cell::new(retire) }
        }
    }

    impl DmaRegs for Fake<'_> {
        fn reg(&self, off: u64) -> u32 {
            self.regs.borrow().get(&off).copied().unwrap_or(0)
        }
        fn set_reg(&self, off: u64, v: u32) {
            self.regs.borrow_mut().insert(off, v);
            let size = self.reg(reg::DMA_RING_SIZE);
            if off == reg::DMA_TAIL && self.retire.get() {
                let mut head = self.reg(reg::DMA_HEAD);
                while head != v {
                    let at = (head & (size - 1)) as usize * 32;
                    let len = self.ring.load::<u32>(at + dma::LEN as usize).unwrap();
                    let back = (len as u64) | ((DONE | self.code.get()) as u64) << 32;
                    self.ring.store::<u64>(at + dma::BYTES as usize, back).unwrap();
                    head = head.wrapping_add(1);
                }
                self.regs.borrow_mut().insert(reg::DMA_HEAD, head);
            }
        }
    }

    fn mem() -> (tempfile_path::Dir, Mapping<ReadWrite>) {
        let dir = tempfile_path::Dir::new();
        let m = crate::rx_buffer(&dir.0.join("ring"), 1).unwrap();
        (dir, m)
    }

    /// A directory removed on drop (no extra crate for it).
    mod tempfile_path {
        pub struct Dir(pub std::path::PathBuf);
        impl Dir {
            pub fn new() -> Dir {
                let p = std::env::temp_dir().join(format!(
                    "txdma-test-{}-{:?}",
                    std::process::id(),
                    std::thread::current().id()
                ));
                std::fs::create_dir_all(&p).unwrap();
                Dir(p)
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    #[test]
    fn encode_lays_out_the_documented_fields() {
        let d = Descriptor { src: 0x1122_3344_5566_7788, mc_addr: 0x2000, len: 100, interrupt: true };
        let b = d.encode().unwrap();
        assert_eq!(&b[0..8], &0x1122_3344_5566_7788u64.to_le_bytes());
        assert_eq!(&b[8..16], &0x2000u64.to_le_bytes());
        assert_eq!(&b[16..20], &100u32.to_le_bytes());
        assert_eq!(&b[20..24], &dma::flags::INT.to_le_bytes());
        assert_eq!(&b[24..32], &[0; 8]);
        assert!(matches!(Descriptor { len: 0, ..d }.encode(), Err(DmaError::BadLength(0))));
        assert!(matches!(Descriptor { len: 1 << 32, ..d }.encode(), Err(DmaError::BadLength(_))));
    }

    #[test]
    fn post_ring_wait_and_a_full_ring() {
        let (_d, ring_mem) = mem();
        let view = Mapping::<ReadWrite>::from_file(ring_mem.file().unwrap().try_clone().unwrap(), 0, 8192).unwrap();
        let fake = Fake::new(&view, status::OK, false);
        let mut r = DmaRing::with_memory(&fake, ring_mem, 0x8000_0000, 4).unwrap();
        assert_eq!(fake.reg(reg::DMA_RING_LO), 0x8000_0000);
        assert_eq!(fake.reg(reg::DMA_RING_SIZE), 4);
        let d = |n| Descriptor { src: 0x1000, mc_addr: 0, len: n, interrupt: false };
        for n in 1..=4 {
            assert_eq!(r.post(&d(n)).unwrap(), n as u32 - 1);
        }
        assert!(matches!(r.post(&d(5)), Err(DmaError::Full(4))), "a fifth descriptor overwrites the first");
        assert_eq!(fake.reg(reg::DMA_TAIL), 0, "nothing rung yet");
        assert_eq!(r.completion(0).unwrap(), None);
        // The engine is busy and never answers: the deadline holds.
        fake.regs.borrow_mut().insert(reg::DMA_STATUS, dma::BUSY);
        let t0 = Instant::now();
        assert!(matches!(r.wait(0, t0 + Duration::from_millis(20)), Err(DmaError::Timeout { index: 0, .. })));
        fake.regs.borrow_mut().insert(reg::DMA_STATUS, 0);
        // Now it retires at the doorbell.
        fake.retire.set(true);
        r.ring();
        assert_eq!(fake.reg(reg::DMA_TAIL), 4);
        for i in 0..4 {
            assert_eq!(r.wait(i, Instant::now() + Duration::from_secs(1)).unwrap(), i + 1);
        }
        // The ring wraps.
        let i = r.send(&d(9)).unwrap();
        assert_eq!(i, 4);
        assert_eq!(r.wait(4, Instant::now() + Duration::from_secs(1)).unwrap(), 9);
        assert!(matches!(r.completion(0), Err(DmaError::NotPosted(0))), "slot 0 was reused");
        assert!(matches!(r.completion(5), Err(DmaError::NotPosted(5))));
        drop(r);
        assert_eq!(fake.reg(reg::DMA_RING_SIZE), 0, "dropping the ring turns the engine off");
    }

    #[test]
    fn errors_and_dropped_descriptors_are_reported() {
        let (_d, ring_mem) = mem();
        let view = Mapping::<ReadWrite>::from_file(ring_mem.file().unwrap().try_clone().unwrap(), 0, 8192).unwrap();
        let fake = Fake::new(&view, status::SRC_UNMAPPED, true);
        let mut r = DmaRing::with_memory(&fake, ring_mem, 0x8000_0000, 8).unwrap();
        let i = r.send(&Descriptor { src: 0xdead_0000, mc_addr: 0, len: 64, interrupt: false }).unwrap();
        match r.wait(i, Instant::now() + Duration::from_secs(1)) {
            Err(DmaError::Failed { code, name, .. }) => {
                assert_eq!((code, name), (status::SRC_UNMAPPED, "src-unmapped"))
            }
            other => panic!("{other:?}"),
        }
        // The engine went idle without retiring it (a ring fault).
        fake.retire.set(false);
        fake.regs.borrow_mut().insert(reg::DMA_STATUS, status::RING);
        let i = r.send(&Descriptor { src: 0, mc_addr: 0, len: 8, interrupt: false }).unwrap();
        match r.wait(i, Instant::now() + Duration::from_secs(1)) {
            Err(DmaError::Dropped { name, .. }) => assert_eq!(name, "ring"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(check_size(3), Err(DmaError::BadSize(3))));
        assert!(matches!(check_size(dma::MAX_RING * 2), Err(DmaError::BadSize(_))));
    }
}
