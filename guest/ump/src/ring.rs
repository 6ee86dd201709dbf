//! The channel buffer of seed 000's UMP: one lockless single-producer,
//! single-consumer circular buffer per direction. The producer's index
//! (bytes written) lives in the producer's half, the consumer's index
//! (bytes read) in the consumer's half; each is written by one side only,
//! so no lock is ever taken. Messages larger than the buffer stream
//! through it in fragments: the producer publishes its index after every
//! fragment, so the consumer reads while the producer writes.
//!
//! # A half (written by one side, read by the other)
//!
//! ```text
//! 0   OPEN   session token while open; CLOSED when closed
//! 8   HEAD   bytes produced into this half's ring
//! 16  TAIL   bytes consumed from the other half's ring
//! 24  WHO    node << 32 | pid of the side that writes this half
//! 64  ring   `size` bytes
//! ```
//!
//! A message is an 8-byte header (length, and a check word) and the
//! payload padded to 8 bytes.

use std::sync::Arc;

use crate::mem::{Sink, Source};

/// Offset of the open/session word.
pub const OPEN: usize = 0;
/// Offset of the producer index.
pub const HEAD: usize = 8;
/// Offset of the consumer index (of the other direction).
pub const TAIL: usize = 16;
/// Offset of the writer's identity.
pub const WHO: usize = 24;
/// Offset of the ring.
pub const RING: usize = 64;
/// OPEN after the writer closed its side.
pub const CLOSED: u64 = u64::MAX;
/// High half of a message header.
const MAGIC: u64 = 0x554D_5031; // "UMP1"
/// High half of the header of a multicast record: the payload is in the
/// sender's outbuf; the record says where (outbuf key, offset, outbuf size).
const MAGIC_OUTBUF: u64 = 0x554D_504D; // "UMPM"
/// Words of a multicast record after its header.
const RECORD_WORDS: usize = 3;

/// Finds a sender's outbuf by its key and size (maps it on first use).
pub type Resolver = Arc<dyn Fn(u64, u64) -> Option<Arc<dyn Source>> + Send + Sync>;

/// Bytes a half of a ring of `size` bytes takes.
pub fn half_len(size: usize) -> usize {
    RING + size
}

/// Why a transfer stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RingError {
    /// The ring holds bytes that are not a message header.
    #[error("channel buffer corrupt: {0}")]
    Corrupt(String),
    /// The message does not fit the buffer given for it (nothing consumed).
    #[error("the message ({0} bytes) does not fit the buffer")]
    TooBig(usize),
    /// Waiting was given up (peer gone, channel closed, timeout).
    #[error("stopped waiting: {0}")]
    Stopped(String),
}

/// What a wait callback says: go on waiting, or stop with a reason.
pub type Waiter<'a> = &'a mut dyn FnMut() -> Result<(), String>;

fn pad8(n: usize) -> usize {
    n.div_ceil(8) * 8
}

/// The producer end of one direction.
pub struct Producer {
    out: Arc<dyn Sink>,
    peer: Arc<dyn Source>,
    size: usize,
    head: u64,
    tail: u64,
}

impl Producer {
    /// The producer writing `out`'s ring, reading its consumer's index from `peer`.
    pub fn new(out: Arc<dyn Sink>, peer: Arc<dyn Source>, size: usize) -> Producer {
        assert!(size >= 64 && size % 8 == 0);
        Producer { out, peer, size, head: 0, tail: 0 }
    }

    /// Bytes produced so far.
    pub fn produced(&self) -> u64 {
        self.head
    }

    /// Free bytes, contiguous from the head (refreshing the consumer's
    /// index when the ring looks full). An index from the other side that
    /// makes no sense (past our head, or more than a ring behind) is an error.
    fn room(&mut self) -> Result<usize, RingError> {
        if self.head.wrapping_sub(self.tail) as usize >= self.size {
            self.tail = self.peer.load(TAIL);
        }
        let used = self.head.checked_sub(self.tail).filter(|&u| u <= self.size as u64).ok_or_else(|| {
            RingError::Corrupt(format!("consumer index {} does not fit producer index {}", self.tail, self.head))
        })? as usize;
        let pos = (self.head % self.size as u64) as usize;
        Ok((self.size - used).min(self.size - pos))
    }

    /// Bytes free in the ring now (refreshing the consumer's index). A
    /// message whose [`footprint`] fits goes in without waiting.
    pub fn free(&mut self) -> Result<usize, RingError> {
        self.tail = self.peer.load(TAIL);
        let used = self.head.checked_sub(self.tail).filter(|&u| u <= self.size as u64).ok_or_else(|| {
            RingError::Corrupt(format!("consumer index {} does not fit producer index {}", self.tail, self.head))
        })? as usize;
        Ok(self.size - used)
    }

    /// Waits for room, then writes up to `src.len()` bytes (a multiple of 8)
    /// in one fragment and publishes it. Returns the bytes written.
    fn push(&mut self, src: &[u8], wait: Waiter) -> Result<usize, RingError> {
        let mut spins = 0u32;
        let room = loop {
            let r = self.room()?;
            if r > 0 {
                break r;
            }
            self.tail = self.peer.load(TAIL);
            backoff(&mut spins, wait).map_err(RingError::Stopped)?;
        };
        let n = room.min(src.len());
        let pos = (self.head % self.size as u64) as usize;
        self.out.write(RING + pos, &src[..n]);
        self.head += n as u64;
        self.out.store(HEAD, self.head);
        Ok(n)
    }

    /// Writes one whole message, streaming it through the ring.
    pub fn write(&mut self, msg: &[u8], wait: Waiter) -> Result<(), RingError> {
        let len = u32::try_from(msg.len()).map_err(|_| RingError::TooBig(msg.len()))?;
        let header = (MAGIC << 32 | len as u64).to_ne_bytes();
        let mut at = 0;
        while at < 8 {
            at += self.push(&header[at..], wait)?;
        }
        let whole = msg.len() / 8 * 8;
        let mut off = 0;
        while off < whole {
            off += self.push(&msg[off..whole], wait)?;
        }
        if whole < msg.len() {
            let mut last = [0u8; 8];
            last[..msg.len() - whole].copy_from_slice(&msg[whole..]);
            let mut at = 0;
            while at < 8 {
                at += self.push(&last[at..], wait)?;
            }
        }
        Ok(())
    }

    /// Writes a multicast record: a message of `len` bytes that sits at
    /// byte `off` (mod `size`) of the outbuf `key`, already written there.
    pub fn write_record(&mut self, len: usize, key: u64, off: u64, size: u64, wait: Waiter) -> Result<(), RingError> {
        let len = u32::try_from(len).map_err(|_| RingError::TooBig(len))?;
        let mut rec = Vec::with_capacity(8 * (1 + RECORD_WORDS));
        for w in [MAGIC_OUTBUF << 32 | len as u64, key, off, size] {
            rec.extend_from_slice(&w.to_ne_bytes());
        }
        let mut at = 0;
        while at < rec.len() {
            at += self.push(&rec[at..], wait)?;
        }
        Ok(())
    }
}

/// The consumer end of one direction.
pub struct Consumer {
    out: Arc<dyn Sink>,
    peer: Arc<dyn Source>,
    size: usize,
    tail: u64,
    head: u64,
    /// The message being read: (length, payload bytes consumed).
    current: Option<(usize, usize)>,
    /// Payload bytes of the current message copied out (for watchers).
    progress: Arc<std::sync::atomic::AtomicUsize>,
    /// Where multicast records point to.
    resolver: Option<Resolver>,
    /// The consumer index the producer was last told.
    published: u64,
}

impl Consumer {
    /// The consumer reading `peer`'s ring, publishing its index in `out`.
    pub fn new(out: Arc<dyn Sink>, peer: Arc<dyn Source>, size: usize) -> Consumer {
        Consumer {
            out,
            peer,
            size,
            tail: 0,
            head: 0,
            current: None,
            progress: Default::default(),
            resolver: None,
            published: 0,
        }
    }

    /// Tells the producer how far we have read: at once when `now` (we are
    /// about to wait, or a quarter of the ring has been read), else later.
    /// Over MEMORY CHANNEL every index store is a packet, and one off the
    /// critical path of a small message is one less on it.
    fn publish(&mut self, now: bool) {
        if self.tail != self.published && (now || self.tail - self.published >= self.size as u64 / 4) {
            self.out.store(TAIL, self.tail);
            self.published = self.tail;
        }
    }

    /// Lets this consumer follow multicast records into senders' outbufs.
    pub fn set_resolver(&mut self, r: Resolver) {
        self.resolver = Some(r);
    }

    fn next_is_record(&mut self) -> bool {
        let mut h = [0u8; 8];
        let pos = (self.tail % self.size as u64) as usize;
        self.peer.read(RING + pos, &mut h);
        u64::from_ne_bytes(h) >> 32 == MAGIC_OUTBUF
    }

    /// Bytes available now.
    pub fn available(&mut self) -> usize {
        if self.head == self.tail {
            self.head = self.peer.load(HEAD);
        }
        // A producer index behind ours is garbage: reads as "more than a
        // ring", which the callers report as corrupt.
        self.head.checked_sub(self.tail).map_or(usize::MAX, |a| a as usize)
    }

    /// True while a message has been started but not finished.
    pub fn mid_message(&self) -> bool {
        self.current.is_some()
    }

    fn wait_for(&mut self, n: usize, wait: Waiter) -> Result<usize, RingError> {
        let mut spins = 0u32;
        loop {
            let a = self.available();
            if a > self.size {
                return Err(RingError::Corrupt(format!(
                    "producer index {} beyond consumer {} + size",
                    self.head, self.tail
                )));
            }
            if a >= n {
                return Ok(a);
            }
            self.head = self.peer.load(HEAD);
            if self.head.checked_sub(self.tail).is_none_or(|a| a as usize >= n) {
                continue;
            }
            self.publish(true);
            backoff(&mut spins, wait).map_err(RingError::Stopped)?;
        }
    }

    /// Copies `dst.len()` bytes (a multiple of 8) out of the ring, in
    /// fragments as they arrive, publishing our index after each.
    fn pop(&mut self, dst: &mut [u8], wait: Waiter) -> Result<(), RingError> {
        let mut off = 0;
        while off < dst.len() {
            let avail = self.wait_for(8, wait)?;
            let pos = (self.tail % self.size as u64) as usize;
            let n = avail.min(self.size - pos).min(dst.len() - off);
            self.peer.read(RING + pos, &mut dst[off..off + n]);
            self.tail += n as u64;
            self.publish(false);
            off += n;
        }
        Ok(())
    }

    /// The length of the next message, if its header has arrived (or of
    /// the one being read).
    pub fn peek(&mut self) -> Result<Option<usize>, RingError> {
        if let Some((len, _)) = self.current {
            return Ok(Some(len));
        }
        match self.available() {
            a if a > self.size => {
                return Err(RingError::Corrupt(format!("producer index {} does not fit ours {}", self.head, self.tail)))
            }
            a if a < 8 => {
                // Nothing to read: a poller may not come back soon, so the
                // producer learns now how far we got (it may be waiting
                // for that room).
                self.publish(true);
                return Ok(None);
            }
            _ => {}
        }
        let mut h = [0u8; 8];
        let pos = (self.tail % self.size as u64) as usize;
        self.peer.read(RING + pos, &mut h);
        let h = u64::from_ne_bytes(h);
        if h >> 32 != MAGIC && h >> 32 != MAGIC_OUTBUF {
            return Err(RingError::Corrupt(format!("bad message header {h:#018x} at byte {}", self.tail)));
        }
        Ok(Some((h & 0xFFFF_FFFF) as usize))
    }

    /// Reads a multicast record (its header is next) and copies its
    /// message out of the sender's outbuf: all in one go, since the payload
    /// was in place before the record was written.
    fn read_record(&mut self, len: usize, buf: &mut [u8], wait: Waiter) -> Result<usize, RingError> {
        let mut rec = [0u8; 8 * (1 + RECORD_WORDS)];
        self.pop(&mut rec, wait)?;
        let w = |i: usize| u64::from_ne_bytes(rec[8 * i..8 * i + 8].try_into().expect("8 bytes"));
        let (key, off, size) = (w(1), w(2), w(3));
        let ob = self.resolver.as_ref().and_then(|r| r(key, size)).ok_or_else(|| {
            RingError::Corrupt(format!("multicast record names outbuf {key:#x}, which cannot be mapped"))
        })?;
        let start = (off % size.max(1)) as usize;
        let padded = len.div_ceil(8) * 8;
        if size == 0 || start + padded > size as usize || start + padded > ob.len() {
            return Err(RingError::Corrupt(format!("multicast record {off}+{len} outside an outbuf of {size}")));
        }
        let whole = len / 8 * 8;
        ob.read(start, &mut buf[..whole]);
        if whole < len {
            let mut last = [0u8; 8];
            ob.read(start + whole, &mut last);
            buf[whole..len].copy_from_slice(&last[..len - whole]);
        }
        self.progress.store(len, std::sync::atomic::Ordering::Release);
        Ok(len)
    }

    /// Reads the next message into `buf` (waiting for it); returns its
    /// length. If `wait` stops it part-way, the bytes so far stay in `buf`
    /// and the next call with the same buffer goes on from there.
    /// [`Consumer::progress`] counts the payload bytes in `buf` as they land.
    pub fn read(&mut self, buf: &mut [u8], wait: Waiter) -> Result<usize, RingError> {
        let len = loop {
            if let Some(l) = self.peek()? {
                break l;
            }
            self.wait_for(8, wait)?;
        };
        if len > buf.len() {
            return Err(RingError::TooBig(len));
        }
        if self.current.is_none() && self.next_is_record() {
            return self.read_record(len, buf, wait);
        }
        if self.current.is_none() {
            let mut h = [0u8; 8];
            self.pop(&mut h, wait)?;
            self.current = Some((len, 0));
            self.progress.store(0, std::sync::atomic::Ordering::Release);
        }
        let (_, done) = self.current.expect("set above");
        let whole = len / 8 * 8;
        if done < whole {
            let mut off = done;
            while off < whole {
                let avail = self.wait_for(8, wait).inspect_err(|_| self.current = Some((len, off)))?;
                let pos = (self.tail % self.size as u64) as usize;
                let n = avail.min(self.size - pos).min(whole - off);
                self.peer.read(RING + pos, &mut buf[off..off + n]);
                self.tail += n as u64;
                self.publish(false);
                off += n;
                self.progress.store(off, std::sync::atomic::Ordering::Release);
            }
        }
        if whole < len {
            let mut last = [0u8; 8];
            self.pop(&mut last, wait).inspect_err(|_| self.current = Some((len, whole)))?;
            buf[whole..len].copy_from_slice(&last[..len - whole]);
        }
        self.current = None;
        self.progress.store(len, std::sync::atomic::Ordering::Release);
        Ok(len)
    }

    /// A counter of the payload bytes of the current message copied out so
    /// far (shared, for a watcher while another thread reads).
    pub fn progress(&self) -> Arc<std::sync::atomic::AtomicUsize> {
        self.progress.clone()
    }
}

/// Spins a while, then yields the CPU, then sleeps (50 µs, growing to
/// 1 ms): a reader that waits long must not keep a guest's only vCPU from
/// the process it waits for. Every 256 rounds asks `wait` whether to go on
/// (it checks the peer and the deadline).
fn backoff(spins: &mut u32, wait: Waiter) -> Result<(), String> {
    *spins += 1;
    if *spins < 64 {
        std::hint::spin_loop();
    } else if *spins < 1024 {
        std::thread::yield_now();
    } else {
        let us = 50u64 << ((*spins - 1024) / 256).min(4);
        std::thread::sleep(std::time::Duration::from_micros(us.min(1000)));
    }
    if *spins % 256 == 0 {
        wait()?;
    }
    Ok(())
}

/// Bytes a message of `len` takes in a ring.
pub fn footprint(len: usize) -> usize {
    8 + pad8(len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::tests::scratch;
    use crate::mem::Local;
    use proptest::prelude::*;

    /// Two halves of one file mapping, as two processes map a channel's file.
    struct Pair {
        _dir: tempfile::TempDir,
        a: Arc<Local>,
        b: Arc<Local>,
    }

    fn pair(size: usize) -> Pair {
        let half = half_len(size);
        let (dir, m) = scratch(2 * half);
        let a = Arc::new(Local::new(m.clone(), 0, half).unwrap());
        let b = Arc::new(Local::new(m, half, half).unwrap());
        Pair { _dir: dir, a, b }
    }

    fn msg(seq: u64, len: usize) -> Vec<u8> {
        (0..len).map(|i| (seq as usize * 31 + i * 7 + (i >> 8)) as u8).collect()
    }

    fn forever() -> impl FnMut() -> Result<(), String> {
        || Ok(())
    }

    /// Random sizes (many larger than the ring, so they stream), two
    /// threads, every byte of every message checked, in order.
    fn stress(size: usize, sizes: Vec<usize>) {
        let p = pair(size);
        let mut prod = Producer::new(p.a.clone(), p.b.clone(), size);
        let mut cons = Consumer::new(p.b.clone(), p.a.clone(), size);
        let expect = sizes.clone();
        let writer = std::thread::spawn(move || {
            for (i, &n) in sizes.iter().enumerate() {
                prod.write(&msg(i as u64, n), &mut forever()).unwrap();
            }
        });
        let mut buf = vec![0u8; expect.iter().copied().max().unwrap_or(0) + 8];
        for (i, &n) in expect.iter().enumerate() {
            let got = cons.read(&mut buf, &mut forever()).unwrap();
            assert_eq!(got, n, "message {i}");
            assert!(buf[..n] == msg(i as u64, n)[..], "message {i} of {n} bytes corrupted");
        }
        writer.join().unwrap();
        assert_eq!(cons.available(), 0, "nothing left over");
    }

    #[test]
    fn two_threads_random_sizes_every_byte_checked() {
        let mut x = 0x1234_5678u64;
        let sizes: Vec<usize> = (0..3000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                match x % 10 {
                    0 => (x >> 20) as usize % 40_000, // up to ten times the ring
                    1..=3 => (x >> 20) as usize % 4096,
                    _ => (x >> 20) as usize % 64,
                }
            })
            .collect();
        stress(4096, sizes);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        #[test]
        fn any_sizes_any_ring(ring in (8usize..64).prop_map(|k| k * 64), sizes in proptest::collection::vec(0usize..9000, 1..60)) {
            stress(ring, sizes);
        }
    }

    #[test]
    fn free_space_says_what_goes_in_without_waiting() {
        let p = pair(256);
        let mut prod = Producer::new(p.a.clone(), p.b.clone(), 256);
        let mut cons = Consumer::new(p.b.clone(), p.a.clone(), 256);
        assert_eq!(prod.free().unwrap(), 256);
        prod.write(&msg(0, 100), &mut forever()).unwrap();
        assert_eq!(prod.free().unwrap(), 256 - footprint(100));
        // A message that fits the free space goes in with a waiter that
        // refuses to wait.
        let fits = prod.free().unwrap() - 8;
        prod.write(&msg(1, fits), &mut || Err("would wait".to_string())).unwrap();
        assert_eq!(prod.free().unwrap(), 0);
        assert!(prod.write(&msg(2, 1), &mut || Err("would wait".to_string())).is_err());
        let mut buf = [0u8; 256];
        assert_eq!(cons.read(&mut buf, &mut forever()).unwrap(), 100);
        // The reader publishes lazily, but a poll that finds nothing more
        // gives the space back.
        assert_eq!(cons.peek().unwrap(), Some(fits));
        assert_eq!(cons.read(&mut buf, &mut forever()).unwrap(), fits);
        assert_eq!(cons.peek().unwrap(), None);
        assert_eq!(prod.free().unwrap(), 256, "reading gives the space back");
    }

    #[test]
    fn too_big_for_the_buffer_is_left_in_place() {
        let p = pair(4096);
        let mut prod = Producer::new(p.a.clone(), p.b.clone(), 4096);
        let mut cons = Consumer::new(p.b.clone(), p.a.clone(), 4096);
        prod.write(&msg(1, 100), &mut forever()).unwrap();
        let mut small = [0u8; 50];
        assert_eq!(cons.read(&mut small, &mut forever()), Err(RingError::TooBig(100)));
        let mut big = [0u8; 100];
        assert_eq!(cons.read(&mut big, &mut forever()), Ok(100));
        assert_eq!(big[..], msg(1, 100)[..]);
    }

    #[test]
    fn garbage_in_the_ring_is_reported_not_delivered() {
        let p = pair(4096);
        p.a.write(RING, &[0xAB; 64]);
        p.a.store(HEAD, 64);
        let mut cons = Consumer::new(p.b.clone(), p.a.clone(), 4096);
        let mut buf = [0u8; 64];
        assert!(matches!(cons.read(&mut buf, &mut forever()), Err(RingError::Corrupt(_))));
        // A producer index beyond the ring is caught too.
        p.a.store(HEAD, 1 << 40);
        let mut cons = Consumer::new(p.b.clone(), p.a.clone(), 4096);
        assert!(matches!(cons.read(&mut buf, &mut forever()), Err(RingError::Corrupt(_))));
    }

    #[test]
    fn a_garbage_consumer_index_is_reported_not_a_panic() {
        let p = pair(4096);
        let mut prod = Producer::new(p.a.clone(), p.b.clone(), 4096);
        // Fill the ring so the producer has to look at the consumer's index...
        let mut give_up = || Err("stop".to_string());
        assert!(prod.write(&msg(1, 5000), &mut give_up).is_err());
        // ...which is nonsense: far behind, then ahead of us.
        for bad in [1u64 << 40, u64::MAX] {
            p.b.store(TAIL, bad);
            let mut prod = Producer::new(p.a.clone(), p.b.clone(), 4096);
            prod.head = 8192;
            prod.tail = 0;
            assert!(matches!(prod.write(&msg(2, 64), &mut forever()), Err(RingError::Corrupt(_))), "{bad}");
        }
        // A producer index behind ours, for the consumer.
        let mut cons = Consumer::new(p.b.clone(), p.a.clone(), 4096);
        cons.tail = 100;
        p.a.store(HEAD, 8);
        cons.head = 8;
        assert!(matches!(cons.read(&mut [0u8; 64], &mut forever()), Err(RingError::Corrupt(_))));
    }

    #[test]
    fn a_stopped_wait_keeps_the_partial_message_for_the_next_call() {
        let p = pair(4096);
        let mut prod = Producer::new(p.a.clone(), p.b.clone(), 4096);
        let mut cons = Consumer::new(p.b.clone(), p.a.clone(), 4096);
        let m = msg(3, 10_000);
        // The writer fills the ring and stops (its wait gives up).
        let mut give_up = || Err("stop".to_string());
        assert!(prod.write(&m, &mut give_up).is_err());
        let mut buf = vec![0u8; 10_000];
        assert!(cons.read(&mut buf, &mut give_up).is_err());
        assert!(cons.mid_message());
        let done = cons.progress().load(std::sync::atomic::Ordering::Acquire);
        assert!(done > 0 && done < 10_000, "{done}");
    }
}
