//! The memory a channel's buffers live in, seen through one interface:
//! shared memory between processes of one guest (`Local`: plain copies and
//! atomics), or MEMORY CHANNEL (`Window`: 8-byte stores into a transmit
//! mapping, loads from a receive mapping), so the ring code is the same
//! for both transports.

use std::sync::atomic::{fence, AtomicU64, Ordering};

/// A mapping a channel half lives in. Offsets and lengths of data copies
/// are multiples of 8 (UMP moves whole 32-bit words, here pairs of them).
pub trait Mem: Send + Sync {
    /// Bytes mapped.
    fn len(&self) -> usize;
    /// Stores a control word (ordered after every earlier data store).
    fn store(&self, off: usize, v: u64);
    /// Loads a control word (data loads after it see what came before it).
    fn load(&self, off: usize) -> u64;
    /// Copies `src` (a multiple of 8 bytes) to `off`.
    fn write(&self, off: usize, src: &[u8]);
    /// Copies `dst.len()` bytes (a multiple of 8) from `off`.
    fn read(&self, off: usize, dst: &mut [u8]);
}

/// A raw mapping this process owns (unmapped by its owner).
#[derive(Clone, Copy)]
pub struct Raw {
    /// Start.
    pub ptr: *mut u8,
    /// Bytes.
    pub len: usize,
}

// SAFETY: a Raw names memory its owner keeps mapped for as long as any
// channel uses it; all accesses go through the Mem impls below, which are
// either atomic (control words) or confined by the ring protocol to bytes
// only one side touches at a time.
unsafe impl Send for Raw {}
// SAFETY: as for Send.
unsafe impl Sync for Raw {}

impl Raw {
    fn check(&self, off: usize, n: usize) {
        assert!(off % 8 == 0 && n % 8 == 0 && off + n <= self.len, "access {off}+{n} outside {} bytes", self.len);
    }
}

/// Shared memory between processes of one guest.
pub struct Local(pub Raw);

impl Mem for Local {
    fn len(&self) -> usize {
        self.0.len
    }
    fn store(&self, off: usize, v: u64) {
        self.0.check(off, 8);
        // SAFETY: in bounds and aligned (checked); the word is only ever
        // accessed atomically.
        unsafe { &*(self.0.ptr.add(off) as *const AtomicU64) }.store(v, Ordering::Release)
    }
    fn load(&self, off: usize) -> u64 {
        self.0.check(off, 8);
        // SAFETY: as in `store`.
        unsafe { &*(self.0.ptr.add(off) as *const AtomicU64) }.load(Ordering::Acquire)
    }
    fn write(&self, off: usize, src: &[u8]) {
        self.0.check(off, src.len());
        // SAFETY: in bounds (checked); the ring protocol gives these bytes to
        // the producer alone until it publishes them with a Release store.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.0.ptr.add(off), src.len()) }
    }
    fn read(&self, off: usize, dst: &mut [u8]) {
        self.0.check(off, dst.len());
        // SAFETY: in bounds (checked); published by an Acquire-loaded index
        // and not reused by the producer until we publish our tail.
        unsafe { std::ptr::copy_nonoverlapping(self.0.ptr.add(off), dst.as_mut_ptr(), dst.len()) }
    }
}

/// One side of a MEMORY CHANNEL region: a transmit mapping (stores only)
/// or a receive mapping (loads only). Data moves in 8-byte volatile
/// accesses: the adapter window must never see wider or byte-sized ones.
pub struct Window(pub Raw);

impl Mem for Window {
    fn len(&self) -> usize {
        self.0.len
    }
    fn store(&self, off: usize, v: u64) {
        self.0.check(off, 8);
        fence(Ordering::Release);
        // SAFETY: in bounds and aligned (checked).
        unsafe { std::ptr::write_volatile(self.0.ptr.add(off).cast::<u64>(), v) }
    }
    fn load(&self, off: usize) -> u64 {
        self.0.check(off, 8);
        // SAFETY: in bounds and aligned (checked).
        let v = unsafe { std::ptr::read_volatile(self.0.ptr.add(off).cast::<u64>()) };
        fence(Ordering::Acquire);
        v
    }
    fn write(&self, off: usize, src: &[u8]) {
        self.0.check(off, src.len());
        for (i, w) in src.chunks_exact(8).enumerate() {
            let v = u64::from_ne_bytes(w.try_into().expect("8 bytes"));
            // SAFETY: in bounds and aligned (checked above).
            unsafe { std::ptr::write_volatile(self.0.ptr.add(off + 8 * i).cast::<u64>(), v) }
        }
    }
    fn read(&self, off: usize, dst: &mut [u8]) {
        self.0.check(off, dst.len());
        for (i, w) in dst.chunks_exact_mut(8).enumerate() {
            // SAFETY: in bounds and aligned (checked above).
            let v = unsafe { std::ptr::read_volatile(self.0.ptr.add(off + 8 * i).cast::<u64>()) };
            w.copy_from_slice(&v.to_ne_bytes());
        }
    }
}
