//! Transmit DMA from a process (an extension: not in the paper's Table 1;
//! `docs/imc.md`, "Transmit DMA"). The adapter's engine copies bytes from
//! memory into MEMORY CHANNEL space without the CPU storing each word.
//!
//! Set-up goes through imcd ([`crate::Imc::dma_open`],
//! [`crate::Imc::dma_target`]); the data path does not:
//! - a [`DmaPort`] holds this process's source area (a file imcd mapped for
//!   the adapter's DMA at an IOVA of its own) and the node's one descriptor
//!   ring, shared by every process of the node that uses DMA: a
//!   `guest_driver::txdma::SharedRing` over the ring and the doorbell imcd
//!   handed over (the driver encodes descriptors, takes turns under the
//!   ring's `flock` and reads the written-back status; this module never
//!   names a register);
//! - [`DmaPort::start`] checks the transfer and posts it, and returns a
//!   [`DmaHandle`];
//! - [`DmaPort::test`] and [`DmaPort::wait`] read the status the engine
//!   wrote back into the descriptor.
//!
//! A transfer can only name a region this process attached for transmit
//! (a [`DmaTarget`] comes from imcd, which checks that) and bytes of its own
//! source area; both are checked here, before the descriptor is written.
//! That is the library's check, not the hardware's: see `docs/imc.md` for
//! what it protects against and what it does not.
//!
//! Threads: a [`DmaPort`] may be shared by threads (`&self` everywhere; the
//! `flock` serialises posting).

use std::time::{Duration, Instant};

use guest_driver::txdma::{self, Descriptor, SharedRing};
use guest_mem::{Mapping, MemError, ReadWrite};
use regs::PAGE_SIZE;
use thiserror::Error;

/// Why a transmit DMA call failed.
#[derive(Debug, Error)]
pub enum DmaError {
    /// The bytes named are not all inside the source area or the region.
    #[error("{what}: {len} bytes at offset {off} do not fit its {size} bytes")]
    Range {
        /// "source area" or "region N".
        what: String,
        /// Offset named.
        off: u64,
        /// Bytes named.
        len: u64,
        /// Size of the area or region.
        size: u64,
    },
    /// A length of 0 or of 4 GiB or more.
    #[error("a transfer of {0} bytes: 1 to 2^32-1")]
    BadLength(u64),
    /// A source pointer outside the DMA source area (C callers).
    #[error("the source is not inside this process's DMA buffer")]
    NotInArea,
    /// Every descriptor of the node's ring is posted and not yet retired.
    #[error("the node's DMA ring is full ({0} descriptors in flight)")]
    Full(u32),
    /// The engine retired the transfer with an error; nothing past `bytes`
    /// was sent.
    #[error("the transfer failed: {name} (code {code}) after {bytes} bytes")]
    Failed {
        /// `regs::dma::status` code.
        code: u32,
        /// Its name.
        name: &'static str,
        /// Bytes sent before the failure.
        bytes: u32,
    },
    /// The engine stopped without retiring the transfer (a reset, or the
    /// ring itself failed); DMA_STATUS says why.
    #[error("the engine dropped the transfer: {name} (DMA_STATUS {dma_status:#x})")]
    Dropped {
        /// DMA_STATUS.
        dma_status: u32,
        /// Name of its code.
        name: &'static str,
    },
    /// The transfer's ring slot was reused before its status was read
    /// (more than a ring's worth of transfers were posted on the node
    /// since): it was retired, its outcome is lost.
    #[error("descriptor {0}'s slot was reused before its status was read")]
    Overwritten(u32),
    /// The deadline passed with the transfer not retired.
    #[error("the transfer was not retired within {waited:?} (DMA_STATUS {dma_status:#x})")]
    Timeout {
        /// How long it was waited for.
        waited: Duration,
        /// DMA_STATUS at the deadline.
        dma_status: u32,
    },
    /// Taking the ring's lock.
    #[error("locking the DMA ring: {0}")]
    Lock(std::io::Error),
    /// Reading or writing the mappings.
    #[error("DMA mapping: {0}")]
    Mem(#[from] MemError),
    /// Anything else the ring's driver refused.
    #[error("DMA ring: {0}")]
    Ring(txdma::DmaError),
}

impl From<txdma::DmaError> for DmaError {
    fn from(e: txdma::DmaError) -> DmaError {
        use txdma::DmaError as D;
        match e {
            D::Full(n) => DmaError::Full(n),
            D::Failed { code, name, bytes, .. } => DmaError::Failed { code, name, bytes },
            D::Dropped { dma_status, name, .. } => DmaError::Dropped { dma_status, name },
            D::Overwritten(i) => DmaError::Overwritten(i),
            D::BadLength(n) => DmaError::BadLength(n),
            D::Lock(e) => DmaError::Lock(e),
            D::Mem(e) => DmaError::Mem(e),
            other => DmaError::Ring(other),
        }
    }
}

/// A region this process may send to by DMA: imcd gave it because the
/// process attached the region for transmit ([`crate::Imc::dma_target`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DmaTarget {
    id: u32,
    first_page: u64,
    pages: u64,
}

impl DmaTarget {
    pub(crate) fn new(id: u32, first_page: u64, pages: u64) -> DmaTarget {
        DmaTarget { id, first_page, pages }
    }

    /// The region id.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Bytes in the region.
    pub fn len(&self) -> u64 {
        self.pages * PAGE_SIZE
    }

    /// Never true (regions have at least one page).
    pub fn is_empty(&self) -> bool {
        self.pages == 0
    }
}

/// A transfer in flight: which ring slot it is in and what it asked for
/// (to tell it from a later transfer in the same slot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DmaHandle {
    index: u32,
    len: u32,
    src: u64,
    dest: u64,
}

impl DmaHandle {
    /// The handle as three words (the C library's `imc_dma_t`).
    pub fn to_words(self) -> [u64; 3] {
        [self.index as u64 | (self.len as u64) << 32, self.src, self.dest]
    }

    /// A handle from [`DmaHandle::to_words`].
    pub fn from_words(w: [u64; 3]) -> DmaHandle {
        DmaHandle { index: w[0] as u32, len: (w[0] >> 32) as u32, src: w[1], dest: w[2] }
    }

    /// Bytes the transfer sends.
    pub fn len(&self) -> u32 {
        self.len
    }

    /// Never true (a transfer has at least one byte).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Its descriptor.
    fn descriptor(&self) -> Descriptor {
        Descriptor { src: self.src, mc_addr: self.dest, len: self.len as u64, interrupt: false }
    }
}

/// This process's access to the adapter's transmit DMA engine.
pub struct DmaPort {
    area: Mapping<ReadWrite>,
    area_iova: u64,
    ring: SharedRing,
}

impl DmaPort {
    /// A port over mappings imcd handed out: the source area (at
    /// `area_iova` for the adapter), the ring of `entries` descriptors and
    /// the registers.
    pub fn new(
        area: Mapping<ReadWrite>,
        area_iova: u64,
        ring: Mapping<ReadWrite>,
        entries: u32,
        regs: Mapping<ReadWrite>,
    ) -> Result<DmaPort, MemError> {
        Ok(DmaPort { area, area_iova, ring: SharedRing::new(ring, entries, regs)? })
    }

    /// The source area: fill it, then [`DmaPort::start`] transfers from it.
    pub fn buffer(&self) -> &Mapping<ReadWrite> {
        &self.area
    }

    /// Starts copying `len` bytes at `src_off` of the source area into
    /// region `target` at byte `offset`. Returns at once; the bytes must
    /// stay unchanged until [`DmaPort::test`] says the transfer is done.
    /// Stores made after this return (through any transmit window of the
    /// node) reach every receiver after the transfer's bytes.
    pub fn start(&self, target: &DmaTarget, offset: u64, src_off: u64, len: u64) -> Result<DmaHandle, DmaError> {
        let len32 = u32::try_from(len).ok().filter(|&l| l > 0).ok_or(DmaError::BadLength(len))?;
        let fits = |off: u64, size: u64| off.checked_add(len).is_some_and(|end| end <= size);
        if !fits(src_off, self.area.len() as u64) {
            let size = self.area.len() as u64;
            return Err(DmaError::Range { what: "source area".into(), off: src_off, len, size });
        }
        if !fits(offset, target.len()) {
            let what = format!("region {}", target.id);
            return Err(DmaError::Range { what, off: offset, len, size: target.len() });
        }
        let mut h = DmaHandle {
            index: 0,
            len: len32,
            src: self.area_iova + src_off,
            dest: target.first_page * PAGE_SIZE + offset,
        };
        h.index = self.ring.post(&h.descriptor())?;
        Ok(h)
    }

    /// The transfer's outcome: `Some(bytes)` when it was sent whole, None
    /// while it is in flight, or why it failed.
    pub fn test(&self, h: &DmaHandle) -> Result<Option<u32>, DmaError> {
        Ok(self.ring.outcome(h.index, &h.descriptor())?)
    }

    /// As [`DmaPort::test`], and a transfer the engine stopped without
    /// retiring (it is idle, and ours is not retired) is an error
    /// ([`DmaError::Dropped`]) instead of in flight for ever. Reads a
    /// register when the transfer is not retired: a trapped load.
    pub fn check(&self, h: &DmaHandle) -> Result<Option<u32>, DmaError> {
        Ok(self.ring.check(h.index, &h.descriptor())?)
    }

    /// Waits until the transfer is retired (or `timeout` passes): the bytes
    /// sent, or why it failed.
    pub fn wait(&self, h: &DmaHandle, timeout: Duration) -> Result<u32, DmaError> {
        let t0 = Instant::now();
        let mut spins = 0u32;
        loop {
            if let Some(bytes) = self.test(h)? {
                return Ok(bytes);
            }
            spins += 1;
            if spins % 64 == 0 {
                if let Some(bytes) = self.check(h)? {
                    return Ok(bytes);
                }
                if t0.elapsed() >= timeout {
                    let dma_status = self.ring.dma_status();
                    return Err(DmaError::Timeout { waited: t0.elapsed(), dma_status });
                }
                std::thread::sleep(Duration::from_micros(20));
            } else {
                std::hint::spin_loop();
            }
        }
    }

    /// Where `ptr` is in the source area, if it is there with `len` bytes
    /// after it (C callers pass pointers).
    pub fn offset_of(&self, ptr: *const u8, len: u64) -> Result<u64, DmaError> {
        let base = self.area.as_ptr() as usize;
        let p = ptr as usize;
        let off = p.checked_sub(base).ok_or(DmaError::NotInArea)? as u64;
        if off.checked_add(len).is_none_or(|end| end > self.area.len() as u64) {
            return Err(DmaError::NotInArea);
        }
        Ok(off)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    // The tests play the engine: they write its status back and move its
    // registers, so they name what the library does not.
    use regs::dma::{self, status, DONE};
    use regs::reg;

    /// A port over plain files; the test plays the engine by writing the
    /// descriptors' status back.
    fn port(dir: &std::path::Path, entries: u32) -> (DmaPort, Mapping<ReadWrite>, Mapping<ReadWrite>) {
        let area = Mapping::<ReadWrite>::create(&dir.join("area"), 16384).unwrap();
        let ring = Mapping::<ReadWrite>::create(&dir.join("ring"), 8192).unwrap();
        let regs = Mapping::<ReadWrite>::create(&dir.join("regs"), 4096).unwrap();
        let ring_view = Mapping::<ReadWrite>::open(&dir.join("ring")).unwrap();
        let regs_view = Mapping::<ReadWrite>::open(&dir.join("regs")).unwrap();
        (DmaPort::new(area, 0x4000_0000, ring, entries, regs).unwrap(), ring_view, regs_view)
    }

    fn retire(ring: &Mapping<ReadWrite>, regs: &Mapping<ReadWrite>, index: u32, entries: u32, code: u32) {
        let at = ((index & (entries - 1)) * 32) as usize;
        let len = ring.load::<u32>(at + 16).unwrap();
        ring.store::<u64>(at + 24, len as u64 | ((DONE | code) as u64) << 32).unwrap();
        regs.store::<u32>(reg::DMA_HEAD as usize, index + 1).unwrap();
    }

    #[test]
    fn start_writes_a_descriptor_and_rings_and_test_reads_the_outcome() {
        let d = tempfile::tempdir().unwrap();
        let (p, ring, regs) = port(d.path(), 4);
        let t = DmaTarget::new(3, 16, 2);
        let h = p.start(&t, 100, 8, 5000).unwrap();
        assert_eq!(regs.load::<u32>(reg::DMA_TAIL as usize).unwrap(), 1, "the doorbell");
        assert_eq!(ring.load::<u64>(0).unwrap(), 0x4000_0008, "source IOVA");
        assert_eq!(ring.load::<u64>(8).unwrap(), 16 * 8192 + 100, "MEMORY CHANNEL address");
        assert_eq!(ring.load::<u32>(16).unwrap(), 5000);
        assert_eq!(p.test(&h).unwrap(), None, "in flight");
        retire(&ring, &regs, 0, 4, status::OK);
        assert_eq!(p.test(&h).unwrap(), Some(5000));
        assert_eq!(p.wait(&h, Duration::from_secs(1)).unwrap(), 5000);
        assert_eq!(DmaHandle::from_words(h.to_words()), h);
        let h2 = p.start(&t, 0, 0, 8).unwrap();
        retire(&ring, &regs, 1, 4, status::TX_DISABLED);
        match p.test(&h2) {
            Err(DmaError::Failed { name, .. }) => assert_eq!(name, "tx-disabled"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_transfer_the_engine_dropped_is_an_error_not_in_flight_for_ever() {
        let d = tempfile::tempdir().unwrap();
        let (p, ring, regs) = port(d.path(), 4);
        let h = p.start(&DmaTarget::new(3, 16, 2), 0, 0, 100).unwrap();
        regs.store::<u32>(reg::DMA_STATUS as usize, dma::BUSY).unwrap();
        assert_eq!(p.check(&h).unwrap(), None, "busy: still in flight");
        regs.store::<u32>(reg::DMA_STATUS as usize, status::ABORTED).unwrap();
        assert!(matches!(p.check(&h), Err(DmaError::Dropped { .. })), "idle and not retired");
        assert_eq!(p.test(&h).unwrap(), None, "test alone does not tell");
        retire(&ring, &regs, 0, 4, status::OK);
        assert_eq!(p.check(&h).unwrap(), Some(100), "retired after all");
    }

    #[test]
    fn nothing_outside_the_area_or_the_region_is_posted() {
        let d = tempfile::tempdir().unwrap();
        let (p, _ring, regs) = port(d.path(), 4);
        let t = DmaTarget::new(3, 16, 1);
        assert!(matches!(p.start(&t, 8192 - 7, 0, 8), Err(DmaError::Range { .. })), "past the region's end");
        assert!(matches!(p.start(&t, 0, 16384 - 4, 8), Err(DmaError::Range { .. })), "past the area's end");
        assert!(matches!(p.start(&t, u64::MAX, 0, 8), Err(DmaError::Range { .. })), "overflow");
        assert!(matches!(p.start(&t, 0, 0, 0), Err(DmaError::BadLength(0))));
        assert_eq!(regs.load::<u32>(reg::DMA_TAIL as usize).unwrap(), 0, "no doorbell for a refused transfer");
        let inside = p.buffer().as_ptr().wrapping_add(100).cast_const();
        assert_eq!(p.offset_of(inside, 100).unwrap(), 100);
        assert!(matches!(p.offset_of(inside, 16384), Err(DmaError::NotInArea)));
        assert!(matches!(p.offset_of(std::ptr::null(), 1), Err(DmaError::NotInArea)));
    }

    #[test]
    fn a_full_ring_and_a_reused_slot_are_errors() {
        let d = tempfile::tempdir().unwrap();
        let (p, ring, regs) = port(d.path(), 2);
        let t = DmaTarget::new(3, 16, 1);
        let h0 = p.start(&t, 0, 0, 8).unwrap();
        p.start(&t, 8, 8, 8).unwrap();
        assert!(matches!(p.start(&t, 16, 16, 8), Err(DmaError::Full(2))), "both slots in flight");
        retire(&ring, &regs, 0, 2, status::OK);
        let h2 = p.start(&t, 16, 16, 8).unwrap();
        assert_eq!(h2.index, 2);
        assert!(matches!(p.test(&h0), Err(DmaError::Overwritten(0))), "slot 0 now holds transfer 2");
        // The engine went idle without retiring transfer 2 (dropped).
        assert!(matches!(p.wait(&h2, Duration::from_secs(1)), Err(DmaError::Dropped { .. })));
    }
}
