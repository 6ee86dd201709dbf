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

use crate::mem::Mem;

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

/// Bytes a half of a ring of `size` bytes takes.
pub fn half_len(size: usize) -> usize {
    RING + size
}

/// Why a transfer stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RingError {
    /// The ring holds bytes that are not a message header.
    Corrupt(String),
    /// The message does not fit the buffer given for it (nothing consumed).
    TooBig(usize),
    /// Waiting was given up (peer gone, channel closed, timeout).
    Stopped(String),
}

/// What a wait callback says: go on waiting, or stop with a reason.
pub type Waiter<'a> = &'a mut dyn FnMut() -> Result<(), String>;

fn pad8(n: usize) -> usize {
    n.div_ceil(8) * 8
}

/// The producer end of one direction.
pub struct Producer {
    out: Arc<dyn Mem>,
    peer: Arc<dyn Mem>,
    size: usize,
    head: u64,
    tail: u64,
}

impl Producer {
    /// The producer writing `out`'s ring, reading its consumer's index from `peer`.
    pub fn new(out: Arc<dyn Mem>, peer: Arc<dyn Mem>, size: usize) -> Producer {
        assert!(size >= 64 && size % 8 == 0);
        Producer { out, peer, size, head: 0, tail: 0 }
    }

    /// Bytes produced so far.
    pub fn produced(&self) -> u64 {
        self.head
    }

    /// Free bytes, contiguous from the head (refreshing the consumer's index).
    fn room(&mut self) -> usize {
        let used = (self.head - self.tail) as usize;
        if used == self.size {
            self.tail = self.peer.load(TAIL);
        }
        let used = (self.head - self.tail) as usize;
        let pos = (self.head % self.size as u64) as usize;
        (self.size - used).min(self.size - pos)
    }

    /// Waits for room, then writes up to `src.len()` bytes (a multiple of 8)
    /// in one fragment and publishes it. Returns the bytes written.
    fn push(&mut self, src: &[u8], wait: Waiter) -> Result<usize, RingError> {
        let mut spins = 0u32;
        let room = loop {
            let r = self.room();
            if r > 0 {
                break r;
            }
            self.tail = self.peer.load(TAIL);
            if self.tail > self.head {
                return Err(RingError::Corrupt(format!("consumer index {} past producer {}", self.tail, self.head)));
            }
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
}

/// The consumer end of one direction.
pub struct Consumer {
    out: Arc<dyn Mem>,
    peer: Arc<dyn Mem>,
    size: usize,
    tail: u64,
    head: u64,
    /// The message being read: (length, payload bytes consumed).
    current: Option<(usize, usize)>,
    /// Payload bytes of the current message copied out (for watchers).
    progress: Arc<std::sync::atomic::AtomicUsize>,
}

impl Consumer {
    /// The consumer reading `peer`'s ring, publishing its index in `out`.
    pub fn new(out: Arc<dyn Mem>, peer: Arc<dyn Mem>, size: usize) -> Consumer {
        Consumer { out, peer, size, tail: 0, head: 0, current: None, progress: Default::default() }
    }

    /// Bytes available now.
    pub fn available(&mut self) -> usize {
        if self.head == self.tail {
            self.head = self.peer.load(HEAD);
        }
        (self.head - self.tail) as usize
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
                return Err(RingError::Corrupt(format!("producer index {} beyond consumer {} + size", self.head, self.tail)));
            }
            if a >= n {
                return Ok(a);
            }
            self.head = self.peer.load(HEAD);
            if (self.head - self.tail) as usize >= n {
                continue;
            }
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
            self.out.store(TAIL, self.tail);
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
        if self.available() < 8 {
            return Ok(None);
        }
        let mut h = [0u8; 8];
        let pos = (self.tail % self.size as u64) as usize;
        self.peer.read(RING + pos, &mut h);
        let h = u64::from_ne_bytes(h);
        if h >> 32 != MAGIC {
            return Err(RingError::Corrupt(format!("bad message header {h:#018x} at byte {}", self.tail)));
        }
        Ok(Some((h & 0xFFFF_FFFF) as usize))
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
                self.out.store(TAIL, self.tail);
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

/// Spins a while, then yields the CPU; every 1024 rounds asks `wait`
/// whether to go on (it checks the peer and the deadline).
fn backoff(spins: &mut u32, wait: Waiter) -> Result<(), String> {
    *spins += 1;
    if *spins < 64 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
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
