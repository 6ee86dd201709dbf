//! The memory a channel's buffers live in, seen through two small traits:
//! a side writes its own half ([`Sink`]) and reads the other side's
//! ([`Source`]). Three kinds, so the ring code is the same for both
//! transports:
//!
//! - [`Local`]: shared memory between processes of one guest (a
//!   `/dev/shm` file): plain copies and acquire/release words;
//! - [`TxWindow`]: MEMORY CHANNEL's transmit side, a read-write mapping of
//!   the adapter's window: 8-byte release stores in ascending order;
//! - [`RxWindow`]: MEMORY CHANNEL's receive side, a read-only mapping of
//!   the region's receive buffer: it has no stores at all.
//!
//! Each is a range of a `guest_mem::Mapping` it shares (`Arc`): every
//! access borrows the mapping through a checked `Window` for its
//! duration, so no raw pointer outlives it. Offsets come from the ring,
//! which checks the other side's indexes first; an access outside the
//! range is a bug here and panics with what it was.
//!
//! Threads: a channel's producer and consumer (and a background reader or
//! writer) use the same halves; every access is independent.

use std::sync::Arc;

use guest_mem::{Access, Mapping, MemError, ReadOnly, ReadWrite, Window};

/// Memory a side reads: the other side's half, or a sender's outbuf.
pub trait Source: Send + Sync {
    /// Bytes.
    fn len(&self) -> usize;
    /// True for no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Loads a control word (data loads after it see what came before it).
    fn load(&self, off: usize) -> u64;
    /// Copies `dst.len()` bytes (a multiple of 8) from `off`.
    fn read(&self, off: usize, dst: &mut [u8]);
}

/// Memory a side writes: its own half.
pub trait Sink: Send + Sync {
    /// Stores a control word (ordered after every earlier data store).
    fn store(&self, off: usize, v: u64);
    /// Copies `src` (a multiple of 8 bytes) to `off`.
    fn write(&self, off: usize, src: &[u8]);
}

/// A range of a shared mapping.
struct Range<A: Access> {
    map: Arc<Mapping<A>>,
    base: usize,
    len: usize,
}

impl<A: Access> Range<A> {
    fn new(map: Arc<Mapping<A>>, base: usize, len: usize) -> Result<Range<A>, MemError> {
        map.window(base, len)?;
        Ok(Range { map, base, len })
    }

    /// All of `map`.
    fn whole(map: Arc<Mapping<A>>) -> Range<A> {
        let len = map.len();
        Range { map, base: 0, len }
    }

    fn window(&self) -> Window<'_, A> {
        bug(self.map.window(self.base, self.len))
    }

    /// A control word, acquire-loaded (both kinds of receive memory).
    fn load(&self, off: usize) -> u64 {
        bug(self.window().load_acquire(off))
    }

    /// Data published by an acquire-loaded index (both kinds of receive memory).
    fn read(&self, off: usize, dst: &mut [u8]) {
        bug(self.window().read(off, dst))
    }
}

fn bug<T>(r: Result<T, MemError>) -> T {
    r.unwrap_or_else(|e| panic!("channel memory: {e}"))
}

/// Shared memory between processes of one guest.
pub struct Local(Range<ReadWrite>);

impl Local {
    /// `len` bytes at `base` of `map`.
    pub fn new(map: Arc<Mapping<ReadWrite>>, base: usize, len: usize) -> Result<Local, MemError> {
        Range::new(map, base, len).map(Local)
    }
}

impl Source for Local {
    fn len(&self) -> usize {
        self.0.len
    }
    fn load(&self, off: usize) -> u64 {
        self.0.load(off)
    }
    fn read(&self, off: usize, dst: &mut [u8]) {
        // Published by an acquire-loaded index, and not reused by the
        // producer until we publish our tail.
        self.0.read(off, dst)
    }
}

impl Sink for Local {
    fn store(&self, off: usize, v: u64) {
        bug(self.0.window().store_release(off, v))
    }
    fn write(&self, off: usize, src: &[u8]) {
        // The ring gives these bytes to the producer alone until it
        // publishes them with a release store.
        bug(self.0.window().write(off, src))
    }
}

/// The transmit side of a MEMORY CHANNEL region. Data moves in 8-byte
/// stores in ascending order: the adapter window must never see wider or
/// byte-sized ones, and a reader that sees a word has every word before it.
pub struct TxWindow(Range<ReadWrite>);

impl TxWindow {
    /// All of a transmit mapping.
    pub fn new(map: Arc<Mapping<ReadWrite>>) -> TxWindow {
        TxWindow(Range::whole(map))
    }
}

impl Sink for TxWindow {
    fn store(&self, off: usize, v: u64) {
        bug(self.0.window().store_release(off, v))
    }
    fn write(&self, off: usize, src: &[u8]) {
        assert!(off % 8 == 0 && src.len() % 8 == 0, "transmit copies are whole words ({off}+{})", src.len());
        bug(self.0.window().write_ordered(off, src))
    }
}

/// The receive side of a MEMORY CHANNEL region: read-only.
pub struct RxWindow(Range<ReadOnly>);

impl RxWindow {
    /// All of a receive mapping.
    pub fn new(map: Arc<Mapping<ReadOnly>>) -> RxWindow {
        RxWindow(Range::whole(map))
    }
}

impl Source for RxWindow {
    fn len(&self) -> usize {
        self.0.len
    }
    fn load(&self, off: usize) -> u64 {
        self.0.load(off)
    }
    fn read(&self, off: usize, dst: &mut [u8]) {
        self.0.read(off, dst)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A scratch file of `len` bytes, mapped read-write.
    pub(crate) fn scratch(len: usize) -> (tempfile::TempDir, Arc<Mapping<ReadWrite>>) {
        let d = tempfile::tempdir().unwrap();
        let m = Mapping::create(&d.path().join("mem"), len).unwrap();
        (d, Arc::new(m))
    }

    #[test]
    fn halves_see_only_their_range_and_windows_keep_the_mapping() {
        let (_d, m) = scratch(8192);
        let a = Local::new(m.clone(), 0, 4096).unwrap();
        let b = Local::new(m.clone(), 4096, 4096).unwrap();
        assert!(Local::new(m.clone(), 4096, 4097).is_err(), "past the end of the mapping");
        Sink::write(&a, 8, &[7u8; 16]);
        Sink::store(&b, 0, 99);
        assert_eq!(m.load::<u64>(4096).unwrap(), 99);
        let mut got = [0u8; 16];
        Source::read(&a, 8, &mut got);
        assert_eq!(got, [7u8; 16]);
        // The halves keep the mapping alive after the owner lets it go.
        drop(m);
        assert_eq!(Source::load(&b, 0), 99);
    }

    #[test]
    #[should_panic(expected = "channel memory")]
    fn an_access_outside_the_range_is_caught() {
        let (_d, m) = scratch(8192);
        let a = Local::new(m, 0, 4096).unwrap();
        Source::load(&a, 4096);
    }
}
