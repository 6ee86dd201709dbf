//! The channel buffer of seed 000's UMP: one lockless single-producer,
//! single-consumer circular buffer per direction. The producer's index
//! (bytes written) lives in the producer's half, the consumer's index
//! (bytes read) in the consumer's half; each is written by one side only,
//! so no lock is ever taken. Messages larger than the buffer stream
//! through it in chunks of half the buffer: the consumer reads one chunk
//! while the producer writes the next.
//!
//! # A half (written by one side, read by the other)
//!
//! ```text
//! 0   OPEN   session token while open; CLOSED when closed
//! 8   HEAD   bytes produced into this half's ring
//! 16  TAIL   bytes consumed from the other half's ring
//! 24  WHO    node << 32 | pid of the side that writes this half
//! 32  ACK    (the channel's opening handshake)
//! 40  NACK   repair requests for the other half's ring (a counter)
//! 64  ring   `size` bytes
//! ```
//!
//! # A chunk in the ring
//!
//! A message is one chunk, or several when it does not fit the buffer.
//! Each chunk is a 16-byte header and its payload padded to 8 bytes:
//!
//! ```text
//! word 0   (kind ^ lap mark) << 32 | length (first chunk: the message's; later ones: what is left)
//! word 1   header check << 32 | payload check
//! ```
//!
//! The lap mark is the ring lap the chunk was written in (bytes produced
//! before it, divided by the ring's size, low 16 bits) in the kind's high
//! half: a header of the lap before reads as no kind at all.
//!
//! The header check covers word 0 and the chunk's position in the ring
//! (bytes produced before it), so a header left from an earlier lap of the
//! ring never checks. A multicast record is one chunk whose payload is
//! three words (outbuf key, offset, outbuf size), covered by the header
//! check; its payload check is that of the message in the outbuf.
//!
//! # The header last (MEMORY CHANNEL)
//!
//! Over shared memory a producer writes a chunk's header, then its
//! payload, then HEAD, which publishes it. Over MEMORY CHANNEL every 8
//! bytes stored is a trapped store, and HEAD would be one more per
//! message (5 instead of 4 for 16 bytes). There the producer writes the
//! payload (and a record's words) first and the header last, and does
//! not store HEAD: the consumer looks at the header at its index, and one
//! that checks (for this session, this position and this lap) says the
//! whole chunk is there, since MEMORY CHANNEL delivers one node's writes
//! in order and a DMA's bytes before the stores after its doorbell. HEAD
//! is still sent again now and then while the producer waits or is
//! serviced, covering only chunks written whole: it is how a consumer
//! learns that a chunk whose header does not check was written (below).
//! The consumer's view of HEAD never goes back.
//!
//! # Short chunks (MEMORY CHANNEL)
//!
//! A whole message of up to [`SHORT_MAX`] bytes goes as a short chunk:
//! one header word and the payload, one store fewer than the long header.
//!
//! ```text
//! word 0   ((kind 0x554D53 << 8 | length) ^ lap mark) << 32 | check
//! ```
//!
//! The check covers the session, the position, the kind word and the
//! payload together, so a short chunk that does not check is one whose
//! header or payload has not all arrived: the consumer reads it as not
//! there yet, and the repair below finds it when HEAD, sent again, says
//! it was written.
//!
//! # Lost bytes (MEMORY CHANNEL)
//!
//! A frame the hub drops (a link flap, a frame that fails its CRC) can
//! leave a hole in the ring while a later header or index store arrives. Over
//! MEMORY CHANNEL ([`Producer::new`] with `repair`) every chunk carries
//! a payload check, and the consumer copies a chunk out only once all of
//! it checks: it never delivers a hole. A chunk that does not check is
//! asked for again (NACK: the consumer publishes its index, then bumps
//! its counter); the producer keeps a copy of its ring and sends
//! everything the consumer has not consumed again. Index stores can be
//! lost too, so a side that waits re-sends its index every
//! [`REPAIR_EVERY`]. A chunk that still does not check after
//! [`REPAIR_LIMIT`] is reported corrupt (the caller sees the channel
//! broken, never wrong bytes). Over shared memory nothing is lost, and
//! payloads are not checked.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::mem::{Sink, Source};

/// Offset of the open/session word.
pub const OPEN: usize = 0;
/// Offset of the producer index.
pub const HEAD: usize = 8;
/// Offset of the consumer index (of the other direction).
pub const TAIL: usize = 16;
/// Offset of the writer's identity.
pub const WHO: usize = 24;
/// Offset of the consumer's repair requests for the other direction.
pub const NACK: usize = 40;
/// Offset of the ring.
pub const RING: usize = 64;
/// OPEN after the writer closed its side.
pub const CLOSED: u64 = u64::MAX;
/// Bytes of a chunk header.
pub const HEADER: usize = 16;
/// Kind of the first chunk of a message.
const MAGIC: u64 = 0x554D_5032; // "UMP2"
/// Kind of a later chunk of a message.
const MAGIC_MORE: u64 = 0x554D_502B; // "UMP+"
/// Kind of a multicast record: the payload is in the sender's outbuf;
/// the record says where (outbuf key, offset, outbuf size).
const MAGIC_OUTBUF: u64 = 0x554D_504D; // "UMPM"
/// The lap of the ring a chunk at byte `pos` is written in, in the high
/// half of its kind (`kind ^ lap_mark`): a header left from the lap
/// before, at the same place, reads as another kind and never as a
/// chunk (a consumer over MEMORY CHANNEL looks at the header at its index
/// before anything says it was written).
fn lap_mark(size: usize, pos: u64) -> u64 {
    ((pos / size as u64) & 0xFFFF) << 16
}

/// Kind of a short chunk (its low 8 bits are the length): a whole
/// message of up to [`SHORT_MAX`] bytes over MEMORY CHANNEL, with a
/// one-word header (see "Short chunks").
const MAGIC_SHORT: u64 = 0x554D_5300; // "US" + length
/// Bytes of a short chunk's header.
const SHORT_HEADER: usize = 8;
/// The longest message that goes as a short chunk.
pub const SHORT_MAX: usize = 255;

/// The length of a short chunk, if `kind` (lap mark removed) is one.
fn short_len(kind: u64) -> Option<usize> {
    (kind & !0xFF == MAGIC_SHORT).then_some((kind & 0xFF) as usize)
}

/// Words of a multicast record after its header.
const RECORD_WORDS: usize = 3;
/// Over MEMORY CHANNEL, how long a consumer waits for the next chunk
/// before it tells the producer how far it has read. Every index store is
/// a trapped store and a packet; in a ping-pong the next message comes
/// sooner than this, so the index goes only with every quarter ring read.
/// The producer never needs it sooner to make progress: with at most a
/// quarter of the ring unpublished, a chunk (at most half the ring and
/// its header) always finds room once the consumer has read the rest.
pub const LAZY_TAIL: Duration = Duration::from_micros(200);
/// How often a waiting side sends its index again (and a consumer its
/// repair request), in case the last store was lost.
pub const REPAIR_EVERY: Duration = Duration::from_millis(100);
/// How long a chunk may fail its checks before it is reported corrupt.
pub const REPAIR_LIMIT: Duration = Duration::from_secs(5);

/// Finds a sender's outbuf by its key and size (maps it on first use).
pub type Resolver = Arc<dyn Fn(u64, u64) -> Option<Arc<dyn Source>> + Send + Sync>;

/// Bytes a half of a ring of `size` bytes takes.
pub fn half_len(size: usize) -> usize {
    RING + size
}

/// Why a transfer stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RingError {
    /// The consumer's index, read by the producer, is past the producer's
    /// or more than a ring behind it.
    #[error("channel buffer corrupt: consumer index {tail} does not fit producer index {head}")]
    ConsumerIndex {
        /// Bytes produced.
        head: u64,
        /// The consumer's index as read.
        tail: u64,
    },
    /// The producer's index, read by the consumer, is behind the
    /// consumer's or more than a ring ahead of it.
    #[error("channel buffer corrupt: producer index {head} does not fit consumer index {tail}")]
    ProducerIndex {
        /// The producer's index as read.
        head: u64,
        /// Bytes consumed.
        tail: u64,
    },
    /// Over shared memory, where nothing is lost: the bytes at the
    /// consumer's index are not a message.
    #[error("channel buffer corrupt: {0}")]
    NotAMessage(Doubt),
    /// Over MEMORY CHANNEL: still not a message after asking the producer
    /// again for [`REPAIR_LIMIT`].
    #[error(
        "channel buffer corrupt: {0} (still after asking the sender again for {secs} s: bytes were lost in transit)",
        secs = REPAIR_LIMIT.as_secs()
    )]
    Lost(Doubt),
    /// A multicast record names an outbuf that cannot be mapped.
    #[error("channel buffer corrupt: multicast record names outbuf {key:#x}, which cannot be mapped")]
    NoOutbuf {
        /// The outbuf's key.
        key: u64,
    },
    /// A multicast record points outside its outbuf.
    #[error("channel buffer corrupt: multicast record {off}+{len} outside an outbuf of {size}")]
    OutsideOutbuf {
        /// Where the message starts in the outbuf.
        off: u64,
        /// The message's length.
        len: usize,
        /// The outbuf's size.
        size: u64,
    },
    /// A message began before the one being read was finished.
    #[error("channel buffer corrupt: the sender gave up part-way through a {len}-byte message ({done} bytes read)")]
    Abandoned {
        /// The message's length.
        len: usize,
        /// Bytes of it read.
        done: usize,
    },
    /// The message does not fit the buffer given for it (nothing consumed).
    #[error("the message ({0} bytes) does not fit the buffer")]
    TooBig(usize),
    /// The waiter said stop (peer gone, channel closed, timeout: it knows
    /// which).
    #[error("stopped waiting")]
    Stopped,
}

/// Why the bytes at a consumer's index are not (yet) a message it can
/// take. Over MEMORY CHANNEL they are asked for again; over shared memory
/// this is [`RingError::NotAMessage`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Doubt {
    /// A short chunk whose check fails (its header or payload not all here).
    #[error("the short chunk {word:#018x} at byte {at} does not check")]
    Short {
        /// The chunk's header word.
        word: u64,
        /// Its position (bytes consumed before it).
        at: u64,
    },
    /// A header of no known kind, or whose check fails.
    #[error("bad chunk header {w0:#018x} {w1:#018x} at byte {at}")]
    Header {
        /// Header word 0 (kind and length).
        w0: u64,
        /// Header word 1 (checks).
        w1: u64,
        /// Its position (bytes consumed before it).
        at: u64,
    },
    /// A chunk's payload whose check fails.
    #[error("the {len}-byte chunk at byte {at} does not check")]
    Payload {
        /// The chunk's payload bytes.
        len: usize,
        /// Its position (bytes consumed before it).
        at: u64,
    },
    /// A multicast message in an outbuf whose check fails.
    #[error("the {len}-byte multicast message in outbuf {key:#x} does not check")]
    Outbuf {
        /// The message's length.
        len: usize,
        /// The outbuf's key.
        key: u64,
    },
    /// A later chunk of a message where no message began (`reading`
    /// None), or not the one the message being read needs next.
    #[error("a later chunk ({left} bytes left) at byte {at} while reading {}", reading_text(.reading))]
    Stray {
        /// Bytes of its message the chunk says are left.
        left: usize,
        /// Its position (bytes consumed before it).
        at: u64,
        /// The message being read: its length and the bytes read.
        reading: Option<(usize, usize)>,
    },
}

fn reading_text(reading: &Option<(usize, usize)>) -> String {
    match reading {
        None => "no message".to_string(),
        Some((len, done)) => format!("a {len}-byte message ({done} bytes read)"),
    }
}

/// What a wait callback says to stop with: its owner knows why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stop;

/// What a wait callback says: go on waiting, or stop.
pub type Waiter<'a> = &'a mut dyn FnMut() -> Result<(), Stop>;

fn pad8(n: usize) -> usize {
    n.div_ceil(8) * 8
}

/// Payload bytes of each chunk of a message that does not fit the ring
/// whole: a chunk takes at most half the ring.
fn chunk_payload(size: usize) -> usize {
    (size / 2 - HEADER) & !7
}

/// Whether a message of `len` bytes goes into a ring of `size` as one chunk.
fn whole(size: usize, len: usize) -> bool {
    HEADER + pad8(len) <= size
}

/// Bytes a message of `len` takes in a ring of `size`.
pub fn footprint(size: usize, len: usize) -> usize {
    if whole(size, len) {
        HEADER + pad8(len)
    } else {
        len.div_ceil(chunk_payload(size)) * HEADER + pad8(len)
    }
}

/// The largest message that goes in as one chunk when `free` bytes are free.
pub fn room(free: usize) -> usize {
    free.saturating_sub(HEADER) & !7
}

fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// The header check of a chunk at ring position `pos` of the producer
/// session `seed`, with header word 0 and (records) the words after it.
fn head_check(seed: u64, pos: u64, words: &[u64]) -> u32 {
    let mut h = mix(mix(seed) ^ pos ^ 0x9E37_79B9_7F4A_7C15);
    for w in words {
        h = mix(h ^ w);
    }
    (h >> 32) as u32
}

/// The check of a short chunk at ring position `pos` of session `seed`:
/// its kind word (kind, lap mark and length) and its payload together.
fn short_check(seed: u64, pos: u64, kind: u64, payload: Sum) -> u32 {
    let h = mix(mix(mix(seed) ^ pos ^ 0x9E37_79B9_7F4A_7C15) ^ kind);
    (mix(h ^ payload.a ^ mix(payload.b)) >> 32) as u32
}

/// A running check of payload words (Fletcher's, on 64-bit words: a lost
/// or reordered word changes it).
#[derive(Debug, Clone, Copy, Default)]
struct Sum {
    a: u64,
    b: u64,
}

impl Sum {
    fn add(&mut self, bytes: &[u8]) {
        for w in bytes.chunks_exact(8) {
            self.a = self.a.wrapping_add(u64::from_ne_bytes(w.try_into().expect("8 bytes")));
            self.b = self.b.wrapping_add(self.a);
        }
    }

    /// `bytes` as they are padded in the ring.
    fn add_padded(&mut self, bytes: &[u8]) {
        let whole = bytes.len() / 8 * 8;
        self.add(&bytes[..whole]);
        if whole < bytes.len() {
            let mut last = [0u8; 8];
            last[..bytes.len() - whole].copy_from_slice(&bytes[whole..]);
            self.add(&last);
        }
    }

    fn value(self) -> u32 {
        mix(self.a ^ mix(self.b)) as u32
    }

    fn of(bytes: &[u8]) -> u32 {
        Sum::of_parts(&[bytes]).value()
    }

    /// The running check of `parts` one after the other, as padded in the
    /// ring (every part but the last a multiple of 8 bytes).
    fn of_parts(parts: &[&[u8]]) -> Sum {
        let mut s = Sum::default();
        for p in parts {
            s.add_padded(p);
        }
        s
    }
}

/// Where a producer keeps a copy of its ring (MEMORY CHANNEL), to send
/// lost bytes again; it may also send them by the adapter's transmit DMA
/// engine instead of stores (`crate::mc`).
pub trait Shadow: Send {
    /// Keeps `src` at ring position `pos` (`pos + src.len()` ≤ the ring).
    fn keep(&mut self, pos: usize, src: &[u8]);
    /// The kept bytes at `pos`.
    fn get(&self, pos: usize, dst: &mut [u8]);
    /// Sends the kept bytes `pos..pos + len` into the ring by DMA; false
    /// when they must go by stores instead (too few to be worth it, no
    /// engine, or the engine refused).
    fn dma(&mut self, pos: usize, len: usize) -> bool;
}

/// A copy in the process's memory: lost bytes go again by stores.
pub struct MemCopy(Vec<u8>);

impl MemCopy {
    /// A copy of a ring of `size` bytes.
    pub fn new(size: usize) -> MemCopy {
        MemCopy(vec![0; size])
    }

    /// All of it.
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }
}

impl Shadow for MemCopy {
    fn keep(&mut self, pos: usize, src: &[u8]) {
        self.0[pos..pos + src.len()].copy_from_slice(src);
    }
    fn get(&self, pos: usize, dst: &mut [u8]) {
        dst.copy_from_slice(&self.0[pos..pos + dst.len()]);
    }
    fn dma(&mut self, _pos: usize, _len: usize) -> bool {
        false
    }
}

/// The payload check of `bytes` as a chunk carries it (for measuring).
pub fn payload_check(bytes: &[u8]) -> u32 {
    Sum::of(bytes)
}

/// The producer end of one direction.
pub struct Producer {
    out: Arc<dyn Sink>,
    peer: Arc<dyn Source>,
    size: usize,
    head: u64,
    tail: u64,
    /// MEMORY CHANNEL: what we wrote into the ring, to send again.
    copy: Option<Box<dyn Shadow>>,
    /// Bytes sent by DMA.
    dma_bytes: u64,
    /// The consumer's repair request we last served.
    nack_seen: u64,
    /// When HEAD was last sent again.
    kicked: Instant,
    /// Repair requests served.
    repairs: u64,
    /// Our session: headers of an earlier channel in the same memory never check.
    seed: u64,
    /// Bytes of the chunks written whole (HEAD as sent again never
    /// covers a chunk still being written).
    whole_chunks: u64,
}

impl Producer {
    /// The producer writing `out`'s ring, reading its consumer's index from
    /// `peer`, for session `seed`; with a `copy` of the ring (MEMORY
    /// CHANNEL), it checks payloads and serves repair requests.
    pub fn new(
        out: Arc<dyn Sink>,
        peer: Arc<dyn Source>,
        size: usize,
        seed: u64,
        copy: Option<Box<dyn Shadow>>,
    ) -> Producer {
        assert!(size >= 64 && size % 8 == 0);
        let (head, tail, nack_seen, kicked, repairs, dma_bytes) = (0, 0, 0, Instant::now(), 0, 0);
        Producer { out, peer, size, head, tail, copy, dma_bytes, nack_seen, kicked, repairs, seed, whole_chunks: 0 }
    }

    /// Bytes sent into the ring by the DMA engine.
    pub fn dma_bytes(&self) -> u64 {
        self.dma_bytes
    }

    /// Bytes produced so far.
    pub fn produced(&self) -> u64 {
        self.head
    }

    /// Repair requests served so far.
    pub fn repairs(&self) -> u64 {
        self.repairs
    }

    /// Serves the consumer: sends again what it has not consumed when it
    /// asked for that, and our index now and then (a lost index store
    /// would leave it waiting). Cheap; called while we wait and before
    /// each message.
    pub fn service(&mut self) {
        if self.copy.is_none() {
            return;
        }
        let req = self.peer.load(NACK);
        if req != self.nack_seen {
            self.nack_seen = req;
            self.resend();
        } else if self.kicked.elapsed() >= REPAIR_EVERY {
            self.kicked = Instant::now();
            self.out.store(HEAD, self.whole_chunks);
        }
    }

    /// Writes the bytes the consumer has not consumed again, then HEAD.
    fn resend(&mut self) {
        let tail = self.peer.load(TAIL);
        // An index that makes no sense: the consumer's own checks report it.
        if self.copy.is_none() || self.head.checked_sub(tail).is_none_or(|u| u > self.size as u64) {
            return;
        }
        let mut at = tail;
        let mut bytes = Vec::new();
        while at < self.head {
            let pos = (at % self.size as u64) as usize;
            let n = ((self.head - at) as usize).min(self.size - pos);
            let copy = self.copy.as_mut().expect("checked above");
            if copy.dma(pos, n) {
                self.dma_bytes += n as u64;
            } else {
                bytes.resize(n, 0);
                copy.get(pos, &mut bytes);
                self.out.write(RING + pos, &bytes);
            }
            at += n as u64;
        }
        self.out.store(HEAD, self.whole_chunks);
        self.kicked = Instant::now();
        self.repairs += 1;
    }

    /// Free bytes, contiguous from the head (refreshing the consumer's
    /// index when the ring looks full). An index from the other side that
    /// makes no sense (past our head, or more than a ring behind) is an error.
    fn contiguous(&mut self) -> Result<usize, RingError> {
        if self.head.wrapping_sub(self.tail) as usize >= self.size {
            self.tail = self.peer.load(TAIL);
        }
        let used = self.used()?;
        let pos = (self.head % self.size as u64) as usize;
        Ok((self.size - used).min(self.size - pos))
    }

    fn used(&self) -> Result<usize, RingError> {
        self.head
            .checked_sub(self.tail)
            .filter(|&u| u <= self.size as u64)
            .map(|u| u as usize)
            .ok_or(RingError::ConsumerIndex { head: self.head, tail: self.tail })
    }

    /// Bytes free in the ring now (refreshing the consumer's index). A
    /// message whose [`footprint`] fits goes in without waiting.
    pub fn free(&mut self) -> Result<usize, RingError> {
        self.tail = self.peer.load(TAIL);
        Ok(self.size - self.used()?)
    }

    /// Waits for contiguous room at the head: the bytes free there.
    fn room_at_head(&mut self, wait: Waiter) -> Result<usize, RingError> {
        let mut spins = 0u32;
        loop {
            let r = self.contiguous()?;
            if r > 0 {
                return Ok(r);
            }
            self.tail = self.peer.load(TAIL);
            self.service();
            backoff(&mut spins, wait).map_err(|Stop| RingError::Stopped)?;
        }
    }

    /// Writes `src` at ring offset `pos` (contiguous): by DMA when the copy
    /// can, else by stores.
    fn put(&mut self, pos: usize, src: &[u8]) {
        match &mut self.copy {
            Some(c) => {
                c.keep(pos, src);
                if c.dma(pos, src.len()) {
                    self.dma_bytes += src.len() as u64;
                } else {
                    self.out.write(RING + pos, src);
                }
            }
            None => self.out.write(RING + pos, src),
        }
    }

    /// Waits for room, then writes up to `src.len()` bytes (a multiple of 8)
    /// contiguously. Returns the bytes written (not yet published).
    fn push(&mut self, src: &[u8], wait: Waiter) -> Result<usize, RingError> {
        let n = self.room_at_head(wait)?.min(src.len());
        let pos = (self.head % self.size as u64) as usize;
        self.put(pos, &src[..n]);
        self.head += n as u64;
        Ok(n)
    }

    /// Waits for room for `n` bytes (a multiple of 8) and takes them
    /// without writing them yet (a header written after its payload).
    fn reserve(&mut self, mut n: usize, wait: Waiter) -> Result<(), RingError> {
        while n > 0 {
            let k = self.room_at_head(wait)?.min(n);
            self.head += k as u64;
            n -= k;
        }
        Ok(())
    }

    /// Writes `src` at ring position `at` (bytes produced before it),
    /// already reserved, wrapping at the end of the ring.
    fn put_at(&mut self, at: u64, src: &[u8]) {
        let mut off = 0;
        while off < src.len() {
            let pos = ((at + off as u64) % self.size as u64) as usize;
            let n = (self.size - pos).min(src.len() - off);
            self.put(pos, &src[off..off + n]);
            off += n;
        }
    }

    /// Writes all of `src` (a multiple of 8), not yet published. The
    /// consumer takes only whole chunks, so HEAD moves once per chunk; a
    /// chunk fits the ring, so the room it waits for here is freed by
    /// chunks already published.
    fn push_all(&mut self, src: &[u8], wait: Waiter) -> Result<(), RingError> {
        let mut at = 0;
        while at < src.len() {
            at += self.push(&src[at..], wait)?;
        }
        Ok(())
    }

    /// Writes `parts` one after the other, the last padded to 8 bytes
    /// (every part but the last a multiple of 8 bytes), not yet published.
    fn push_padded(&mut self, parts: &[&[u8]], wait: Waiter) -> Result<(), RingError> {
        for payload in parts {
            let whole = payload.len() / 8 * 8;
            self.push_all(&payload[..whole], wait)?;
            if whole < payload.len() {
                let mut last = [0u8; 8];
                last[..payload.len() - whole].copy_from_slice(&payload[whole..]);
                self.push_all(&last, wait)?;
            }
        }
        Ok(())
    }

    /// Writes one chunk: its header (kind, value, extra words) and payload.
    fn chunk(&mut self, kind: u64, value: u64, extra: &[u64], payload: &[u8], wait: Waiter) -> Result<(), RingError> {
        self.chunk_parts(kind, value, extra, &[payload], wait)
    }

    /// Writes one chunk whose payload is `parts` one after the other
    /// (every part but the last a multiple of 8 bytes).
    fn chunk_parts(
        &mut self,
        kind: u64,
        value: u64,
        extra: &[u64],
        parts: &[&[u8]],
        wait: Waiter,
    ) -> Result<(), RingError> {
        let pcheck = if self.copy.is_some() { Sum::of_parts(parts).value() } else { 0 };
        self.chunk_checked(kind, value, extra, parts, pcheck, wait)
    }

    /// Writes one chunk with payload check `pcheck`: its header (kind,
    /// value), the `extra` words after it (at most [`RECORD_WORDS`]) and
    /// the payload `parts`, then publishes it. Over shared memory the
    /// header goes first and the HEAD store publishes the chunk; over
    /// MEMORY CHANNEL the header goes last and publishes it (see "The
    /// header last").
    fn chunk_checked(
        &mut self,
        kind: u64,
        value: u64,
        extra: &[u64],
        parts: &[&[u8]],
        pcheck: u32,
        wait: Waiter,
    ) -> Result<(), RingError> {
        let w0 = (kind ^ lap_mark(self.size, self.head)) << 32 | value;
        let mut words = [w0; 1 + RECORD_WORDS];
        words[1..=extra.len()].copy_from_slice(extra);
        let w1 = u64::from(head_check(self.seed, self.head, &words[..=extra.len()])) << 32 | u64::from(pcheck);
        let mut hdr = [0u8; HEADER];
        hdr[..8].copy_from_slice(&w0.to_ne_bytes());
        hdr[8..].copy_from_slice(&w1.to_ne_bytes());
        let at = self.head;
        let header_last = self.copy.is_some();
        if header_last {
            self.reserve(HEADER, wait)?;
        } else {
            self.push_all(&hdr, wait)?;
        }
        for w in extra {
            self.push_all(&w.to_ne_bytes(), wait)?;
        }
        self.push_padded(parts, wait)?;
        if header_last {
            self.put_at(at, &hdr);
        } else {
            self.out.store(HEAD, self.head);
        }
        self.whole_chunks = self.head;
        Ok(())
    }

    /// Writes a whole message of at most [`SHORT_MAX`] bytes made of
    /// `parts` (every part but the last a multiple of 8 bytes) as a short
    /// chunk, header last (MEMORY CHANNEL only).
    fn short(&mut self, parts: &[&[u8]], len: usize, wait: Waiter) -> Result<(), RingError> {
        let kind = (MAGIC_SHORT | len as u64) ^ lap_mark(self.size, self.head);
        let w0 = kind << 32 | u64::from(short_check(self.seed, self.head, kind, Sum::of_parts(parts)));
        let at = self.head;
        self.reserve(SHORT_HEADER, wait)?;
        self.push_padded(parts, wait)?;
        self.put_at(at, &w0.to_ne_bytes());
        self.whole_chunks = self.head;
        Ok(())
    }

    /// Whether a message of `len` bytes goes as a short chunk.
    fn goes_short(&self, len: usize) -> bool {
        self.copy.is_some() && len <= SHORT_MAX && SHORT_HEADER + pad8(len) <= self.size
    }

    /// Writes one message made of `parts`, as [`Producer::write`] writes
    /// their concatenation, without copying them together first when
    /// the message fits the ring whole and every part but the last is a
    /// multiple of 8 bytes (a header and a payload).
    pub fn write_parts(&mut self, parts: &[&[u8]], wait: Waiter) -> Result<(), RingError> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let aligned = parts.split_last().is_none_or(|(_, init)| init.iter().all(|p| p.len() % 8 == 0));
        match u32::try_from(len) {
            Ok(_) if aligned && self.goes_short(len) => {
                self.service();
                self.short(parts, len, wait)
            }
            Ok(n) if aligned && whole(self.size, len) => {
                self.service();
                self.chunk_parts(MAGIC, n.into(), &[], parts, wait)
            }
            _ => self.write(&parts.concat(), wait),
        }
    }

    /// Writes one whole message, streaming it through the ring in chunks
    /// when it does not fit whole.
    pub fn write(&mut self, msg: &[u8], wait: Waiter) -> Result<(), RingError> {
        self.service();
        let len = u32::try_from(msg.len()).map_err(|_| RingError::TooBig(msg.len()))?;
        if self.goes_short(msg.len()) {
            return self.short(&[msg], msg.len(), wait);
        }
        if whole(self.size, msg.len()) {
            return self.chunk(MAGIC, len.into(), &[], msg, wait);
        }
        let c = chunk_payload(self.size);
        for (i, part) in msg.chunks(c).enumerate() {
            let (kind, left) = if i == 0 { (MAGIC, msg.len()) } else { (MAGIC_MORE, msg.len() - i * c) };
            self.chunk(kind, left as u64, &[], part, wait)?;
        }
        Ok(())
    }

    /// Writes a multicast record for `msg`, which sits at byte `off` (mod
    /// `size`) of the outbuf `key`, already written there.
    pub fn write_record(&mut self, msg: &[u8], key: u64, off: u64, size: u64, wait: Waiter) -> Result<(), RingError> {
        self.service();
        let len = u32::try_from(msg.len()).map_err(|_| RingError::TooBig(msg.len()))?;
        // The record's payload check is the message's, in the outbuf.
        let pcheck = if self.copy.is_some() { Sum::of(msg) } else { 0 };
        self.chunk_checked(MAGIC_OUTBUF, len.into(), &[key, off, size], &[], pcheck, wait)
    }
}

/// A chunk header that checked.
#[derive(Debug, Clone, Copy)]
enum Chunk {
    /// A message's first chunk: the message's length, the payload check.
    First { len: usize, pcheck: u32 },
    /// A later chunk: the bytes left of the message, the payload check.
    More { left: usize, pcheck: u32 },
    /// A multicast record.
    Record { len: usize, pcheck: u32, key: u64, off: u64, size: u64 },
    /// A short chunk (a whole message), checked with its header.
    Short { len: usize },
}

/// What is at the consumer's index.
enum Next {
    /// Not all of the header has arrived.
    Waiting(usize),
    /// A header that checks.
    Chunk(Chunk),
}

/// The consumer end of one direction.
pub struct Consumer {
    out: Arc<dyn Sink>,
    peer: Arc<dyn Source>,
    size: usize,
    tail: u64,
    head: u64,
    /// The message being read: (length, payload bytes copied out).
    current: Option<(usize, usize)>,
    /// Payload bytes of the current message copied out (for watchers).
    progress: Arc<std::sync::atomic::AtomicUsize>,
    /// Where multicast records point to.
    resolver: Option<Resolver>,
    /// The consumer index the producer was last told.
    published: u64,
    /// Looks by [`Consumer::peek`] that found nothing since the last read.
    empty_looks: u32,
    /// Since when we have waited for the next chunk (None while reading).
    idle_since: Option<Instant>,
    /// MEMORY CHANNEL: payloads are checked and repairs asked for.
    repair: bool,
    /// Repair requests made.
    nacks: u64,
    /// Since when the chunk at our index has failed its checks.
    doubt: Option<Instant>,
    /// When our index (or repair request) was last sent again.
    kicked: Instant,
    /// The producer's session ([`Consumer::set_seed`]).
    seed: u64,
}

impl Consumer {
    /// The consumer reading `peer`'s ring, publishing its index in `out`;
    /// with `repair`, payloads are checked and lost bytes asked for again.
    pub fn new(out: Arc<dyn Sink>, peer: Arc<dyn Source>, size: usize, repair: bool) -> Consumer {
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
            empty_looks: 0,
            idle_since: None,
            repair,
            nacks: 0,
            doubt: None,
            kicked: Instant::now(),
            seed: 0,
        }
    }

    /// The producer's session, once the channel is open (before any read).
    pub fn set_seed(&mut self, seed: u64) {
        self.seed = seed;
    }

    /// Repair requests made so far.
    pub fn nacks(&self) -> u64 {
        self.nacks
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

    /// While we wait: our index (over MEMORY CHANNEL once we have waited
    /// [`LAZY_TAIL`]), again now and then (its last store may have been
    /// lost), and the repair request while a chunk fails its checks.
    fn service(&mut self) {
        let idle = *self.idle_since.get_or_insert_with(Instant::now);
        self.publish(!self.repair || idle.elapsed() >= LAZY_TAIL);
        if !self.repair || self.kicked.elapsed() < REPAIR_EVERY {
            return;
        }
        self.kicked = Instant::now();
        self.out.store(TAIL, self.tail);
        if self.doubt.is_some() {
            self.nacks += 1;
            self.out.store(NACK, self.nacks);
        }
    }

    /// The chunk at our index failed a check (`why`): ask for it again, or
    /// give up once it has failed for [`REPAIR_LIMIT`].
    fn doubted(&mut self, why: Doubt) -> Result<(), RingError> {
        if !self.repair {
            return Err(RingError::NotAMessage(why));
        }
        let first = self.doubt.is_none();
        let since = *self.doubt.get_or_insert_with(Instant::now);
        if since.elapsed() > REPAIR_LIMIT {
            self.doubt = None;
            return Err(RingError::Lost(why));
        }
        if first || self.kicked.elapsed() >= REPAIR_EVERY {
            self.publish(true);
            self.out.store(TAIL, self.tail);
            self.nacks += 1;
            self.out.store(NACK, self.nacks);
            self.kicked = Instant::now();
        }
        Ok(())
    }

    /// Lets this consumer follow multicast records into senders' outbufs.
    pub fn set_resolver(&mut self, r: Resolver) {
        self.resolver = Some(r);
    }

    /// Looks again how far the producer has written: its HEAD, and over
    /// MEMORY CHANNEL the header at our index (see "The header last"):
    /// there HEAD only moves when the producer sends it again, so it may
    /// be behind what we have read, and our view of it never goes back.
    fn refresh(&mut self) {
        let h = self.peer.load(HEAD);
        if !self.repair {
            self.head = h;
            return;
        }
        self.head = self.head.max(h);
        if self.head == self.tail {
            if let Some(n) = self.arrived() {
                self.head = self.tail + n as u64;
            }
        }
    }

    /// The ring bytes of the chunk at our index, when its header has
    /// arrived and checks (a header is written after the rest of its chunk).
    fn arrived(&self) -> Option<usize> {
        let w0 = self.word(self.tail);
        let (kind, value) = (self.kind(w0), (w0 & 0xFFFF_FFFF) as usize);
        if let Some(len) = short_len(kind) {
            let n = SHORT_HEADER + pad8(len);
            return (n <= self.size && self.short_checks(w0, len)).then_some(n);
        }
        let (extra, payload) = match kind {
            MAGIC if whole(self.size, value) => (0, value),
            MAGIC | MAGIC_MORE => (0, value.min(chunk_payload(self.size))),
            MAGIC_OUTBUF => (RECORD_WORDS, 0),
            _ => return None,
        };
        let n = HEADER + 8 * extra + pad8(payload);
        let hc = (self.word(self.tail + 8) >> 32) as u32;
        (head_check(self.seed, self.tail, &self.header_words(w0, extra)[..=extra]) == hc && n <= self.size).then_some(n)
    }

    /// The kind of the header word `w0` at our index, its lap mark removed.
    fn kind(&self, w0: u64) -> u64 {
        (w0 >> 32) ^ lap_mark(self.size, self.tail)
    }

    /// Header word `w0` at our index and the `extra` words after the
    /// header (a record's), as the header check covers them.
    fn header_words(&self, w0: u64, extra: usize) -> [u64; 1 + RECORD_WORDS] {
        let mut words = [w0; 1 + RECORD_WORDS];
        for (i, w) in words[1..=extra].iter_mut().enumerate() {
            *w = self.word(self.tail + (HEADER + 8 * i) as u64);
        }
        words
    }

    /// Whether the short chunk at our index (header `w0`, `len` bytes,
    /// all arrived) checks.
    fn short_checks(&self, w0: u64, len: usize) -> bool {
        let mut payload = [0u8; SHORT_MAX.div_ceil(8) * 8];
        let padded = &mut payload[..pad8(len)];
        self.copy_out(self.tail + SHORT_HEADER as u64, padded);
        let mut sum = Sum::default();
        sum.add(padded);
        short_check(self.seed, self.tail, w0 >> 32, sum) == w0 as u32
    }

    /// Bytes available now.
    pub fn available(&mut self) -> usize {
        if self.head == self.tail {
            self.refresh();
        }
        // A producer index behind ours is garbage: reads as "more than a
        // ring", which the callers report as corrupt.
        self.head.checked_sub(self.tail).map_or(usize::MAX, |a| a as usize)
    }

    /// Bytes of the ring consumed so far.
    pub fn taken(&self) -> u64 {
        self.tail
    }

    /// True while a message has been started but not finished.
    pub fn mid_message(&self) -> bool {
        self.current.is_some()
    }

    fn index_error(&self) -> RingError {
        RingError::ProducerIndex { head: self.head, tail: self.tail }
    }

    fn wait_for(&mut self, n: usize, wait: Waiter) -> Result<(), RingError> {
        let mut spins = 0u32;
        loop {
            let a = self.available();
            if a > self.size {
                return Err(self.index_error());
            }
            if a >= n {
                return Ok(());
            }
            self.refresh();
            if self.head.checked_sub(self.tail).is_none_or(|a| a as usize >= n) {
                continue;
            }
            self.service();
            if backoff(&mut spins, wait).is_err() {
                // The writer may have written the rest and then closed
                // (why we stop) after our last look at its index: its
                // index (or header) store came before its close, so one
                // more look sees everything it wrote.
                self.refresh();
                if self.head.checked_sub(self.tail).is_some_and(|a| a as usize >= n) {
                    continue;
                }
                return Err(RingError::Stopped);
            }
        }
    }

    /// Copies `dst.len()` bytes (a multiple of 8) from ring position `at`
    /// (bytes consumed), wrapping at the end of the ring.
    fn copy_out(&self, at: u64, dst: &mut [u8]) {
        let mut off = 0;
        while off < dst.len() {
            let pos = ((at + off as u64) % self.size as u64) as usize;
            let n = (self.size - pos).min(dst.len() - off);
            self.peer.read(RING + pos, &mut dst[off..off + n]);
            off += n;
        }
    }

    fn word(&self, at: u64) -> u64 {
        let mut w = [0u8; 8];
        self.copy_out(at, &mut w);
        u64::from_ne_bytes(w)
    }

    /// The header at our index, if it has arrived; `Err` with why when it
    /// does not check.
    fn next(&mut self) -> Result<Result<Next, Doubt>, RingError> {
        let a = self.available();
        if a > self.size {
            return Err(self.index_error());
        }
        if a < SHORT_HEADER {
            return Ok(Ok(Next::Waiting(SHORT_HEADER)));
        }
        let w0 = self.word(self.tail);
        let kind = self.kind(w0);
        if let Some(len) = short_len(kind) {
            let need = SHORT_HEADER + pad8(len);
            if a < need {
                return Ok(Ok(Next::Waiting(need)));
            }
            if !self.short_checks(w0, len) {
                return Ok(Err(Doubt::Short { word: w0, at: self.tail }));
            }
            return Ok(Ok(Next::Chunk(Chunk::Short { len })));
        }
        if a < HEADER {
            return Ok(Ok(Next::Waiting(HEADER)));
        }
        let w1 = self.word(self.tail + 8);
        let (value, hc, pcheck) = ((w0 & 0xFFFF_FFFF) as usize, (w1 >> 32) as u32, w1 as u32);
        let extra = if kind == MAGIC_OUTBUF { RECORD_WORDS } else { 0 };
        if a < HEADER + 8 * extra {
            return Ok(Ok(Next::Waiting(HEADER + 8 * extra)));
        }
        let words = self.header_words(w0, extra);
        if ![MAGIC, MAGIC_MORE, MAGIC_OUTBUF].contains(&kind)
            || head_check(self.seed, self.tail, &words[..=extra]) != hc
        {
            return Ok(Err(Doubt::Header { w0, w1, at: self.tail }));
        }
        Ok(Ok(Next::Chunk(match kind {
            MAGIC => Chunk::First { len: value, pcheck },
            MAGIC_MORE => Chunk::More { left: value, pcheck },
            _ => Chunk::Record { len: value, pcheck, key: words[1], off: words[2], size: words[3] },
        })))
    }

    /// The length of the next message, if its header has arrived (or of
    /// the one being read). Over MEMORY CHANNEL a header that does not
    /// check reads as not arrived while it is asked for again.
    pub fn peek(&mut self) -> Result<Option<usize>, RingError> {
        if let Some((len, _)) = self.current {
            return Ok(Some(len));
        }
        match self.next()? {
            Ok(Next::Chunk(Chunk::First { len, .. } | Chunk::Record { len, .. } | Chunk::Short { len })) => {
                Ok(Some(len))
            }
            Ok(Next::Chunk(Chunk::More { left, .. })) => {
                self.doubted(Doubt::Stray { left, at: self.tail, reading: None })?;
                Ok(None)
            }
            Ok(Next::Waiting(_)) => {
                // Nothing to read. The first look after a read leaves our
                // index unpublished: a poller about to answer the message
                // it just read (a ping-pong) would otherwise pay one more
                // store (a trapped one over MEMORY CHANNEL) before its
                // answer. From the second look on, the producer learns how
                // far we got (it may be waiting for that room).
                self.empty_looks = self.empty_looks.saturating_add(1);
                if self.empty_looks >= 2 {
                    self.service();
                }
                Ok(None)
            }
            Err(why) => {
                self.doubted(why)?;
                Ok(None)
            }
        }
    }

    /// Reads a multicast record and copies its message out of the sender's
    /// outbuf: all in one go, since the payload was in place before the
    /// record was written. `Ok(Err(why))`: the payload does not check.
    #[allow(clippy::too_many_arguments)]
    fn read_record(
        &mut self,
        len: usize,
        pcheck: u32,
        key: u64,
        off: u64,
        size: u64,
        buf: &mut [u8],
    ) -> Result<Result<usize, Doubt>, RingError> {
        let ob = self.resolver.as_ref().and_then(|r| r(key, size)).ok_or(RingError::NoOutbuf { key })?;
        let start = (off % size.max(1)) as usize;
        let padded = pad8(len);
        if size == 0 || start + padded > size as usize || start + padded > ob.len() {
            return Err(RingError::OutsideOutbuf { off, len, size });
        }
        let whole = len / 8 * 8;
        let mut sum = Sum::default();
        ob.read(start, &mut buf[..whole]);
        sum.add(&buf[..whole]);
        if whole < len {
            let mut last = [0u8; 8];
            ob.read(start + whole, &mut last);
            sum.add(&last);
            buf[whole..len].copy_from_slice(&last[..len - whole]);
        }
        if self.repair && sum.value() != pcheck {
            return Ok(Err(Doubt::Outbuf { len, key }));
        }
        self.tail += (HEADER + 8 * RECORD_WORDS) as u64;
        self.empty_looks = 0;
        self.idle_since = None;
        self.publish(false);
        self.progress.store(len, std::sync::atomic::Ordering::Release);
        Ok(Ok(len))
    }

    /// Copies the chunk at our index (`n` payload bytes, all arrived) into
    /// `dst`; consumes it when it checks. `Err(why)` when it does not.
    fn take_chunk(&mut self, hdr: usize, n: usize, pcheck: Option<u32>, dst: &mut [u8]) -> Result<(), Doubt> {
        self.take_chunk_parts(hdr, n, pcheck, &mut [&mut dst[..n]])
    }

    /// As [`Consumer::take_chunk`], the payload copied into `parts` one
    /// after the other (every part but the last a multiple of 8 bytes,
    /// `n` bytes in all).
    fn take_chunk_parts(
        &mut self,
        hdr: usize,
        n: usize,
        pcheck: Option<u32>,
        parts: &mut [&mut [u8]],
    ) -> Result<(), Doubt> {
        let mut at = self.tail + hdr as u64;
        let mut sum = Sum::default();
        let mut last = [0u8; 8];
        let mut tail_part = None;
        for (i, part) in parts.iter_mut().enumerate() {
            let whole = part.len() / 8 * 8;
            self.copy_out(at, &mut part[..whole]);
            at += whole as u64;
            if whole < part.len() {
                self.copy_out(at, &mut last);
                tail_part = Some((i, whole));
            }
            // Only over MEMORY CHANNEL (shared memory loses nothing), and
            // not for a short chunk (checked with its header).
            if self.repair && pcheck.is_some() {
                sum.add(&part[..whole]);
                if whole < part.len() {
                    sum.add(&last);
                }
            }
        }
        if self.repair && pcheck.is_some_and(|c| c != sum.value()) {
            return Err(Doubt::Payload { len: n, at: self.tail });
        }
        if let Some((i, whole)) = tail_part {
            let k = parts[i].len() - whole;
            parts[i][whole..].copy_from_slice(&last[..k]);
        }
        self.tail += (hdr + pad8(n)) as u64;
        self.doubt = None;
        self.empty_looks = 0;
        self.idle_since = None;
        self.publish(false);
        Ok(())
    }

    /// Reads the next message straight into two places, when it is one
    /// whole chunk of at least `head.len()` bytes (a multiple of 8) and
    /// no message is half read: its first `head.len()` bytes into `head`,
    /// then the rest into the slice `place` gives for them (`place` sees
    /// the head and the number of bytes left, and gives a slice of exactly
    /// that length, or `None`). Waits for the whole chunk. `Ok(None)`:
    /// nothing consumed, read it with [`Consumer::read`] (no message yet,
    /// another shape, `place` said no, or it did not check, which `read`
    /// then repairs; `head` and the slice may hold garbage then).
    pub fn read_split<'d>(
        &mut self,
        head: &mut [u8],
        place: impl FnOnce(&[u8], usize) -> Option<&'d mut [u8]>,
        wait: Waiter,
    ) -> Result<Option<usize>, RingError> {
        if self.current.is_some() || head.len() % 8 != 0 {
            return Ok(None);
        }
        let (hdr, len, pcheck) = match self.next()? {
            Ok(Next::Chunk(Chunk::First { len, pcheck })) if whole(self.size, len) => (HEADER, len, Some(pcheck)),
            Ok(Next::Chunk(Chunk::Short { len })) => (SHORT_HEADER, len, None),
            _ => return Ok(None),
        };
        if len < head.len() {
            return Ok(None);
        }
        self.wait_for(hdr + pad8(len), wait)?;
        self.copy_out(self.tail + hdr as u64, head);
        let rest = len - head.len();
        let Some(dst) = place(head, rest) else { return Ok(None) };
        if dst.len() != rest || self.take_chunk_parts(hdr, len, pcheck, &mut [head, dst]).is_err() {
            return Ok(None);
        }
        self.progress.store(len, std::sync::atomic::Ordering::Release);
        Ok(Some(len))
    }

    /// Reads the next message into `buf` (waiting for it); returns its
    /// length. If `wait` stops it part-way, the chunks so far stay in `buf`
    /// and the next call with the same buffer goes on from there.
    /// [`Consumer::progress`] counts the payload bytes in `buf` as they land.
    pub fn read(&mut self, buf: &mut [u8], wait: Waiter) -> Result<usize, RingError> {
        use std::sync::atomic::Ordering::Release;
        let mut spins = 0u32;
        loop {
            let chunk = match self.next()? {
                Ok(Next::Chunk(c)) => c,
                Ok(Next::Waiting(n)) => {
                    self.wait_for(n, wait)?;
                    continue;
                }
                Err(why) => {
                    self.doubted(why)?;
                    backoff(&mut spins, wait).map_err(|Stop| RingError::Stopped)?;
                    continue;
                }
            };
            let (len, done, pcheck) = match (chunk, self.current) {
                (Chunk::Short { len }, None) => {
                    if len > buf.len() {
                        return Err(RingError::TooBig(len));
                    }
                    // Checked with its header: taking it cannot fail.
                    if let Err(why) = self.take_chunk(SHORT_HEADER, len, None, &mut buf[..len]) {
                        return Err(RingError::NotAMessage(why));
                    }
                    self.progress.store(len, Release);
                    return Ok(len);
                }
                (Chunk::First { len, pcheck }, None) => (len, 0, pcheck),
                (Chunk::More { left, pcheck }, Some((len, done))) if left == len - done => (len, done, pcheck),
                (Chunk::Record { len, pcheck, key, off, size }, None) => {
                    if len > buf.len() {
                        return Err(RingError::TooBig(len));
                    }
                    match self.read_record(len, pcheck, key, off, size, buf)? {
                        Ok(n) => {
                            self.doubt = None;
                            return Ok(n);
                        }
                        Err(why) => {
                            self.doubted(why)?;
                            backoff(&mut spins, wait).map_err(|Stop| RingError::Stopped)?;
                            continue;
                        }
                    }
                }
                (Chunk::First { .. } | Chunk::Record { .. } | Chunk::Short { .. }, Some((len, done))) => {
                    self.current = None;
                    return Err(RingError::Abandoned { len, done });
                }
                (Chunk::More { left, .. }, reading) => {
                    self.doubted(Doubt::Stray { left, at: self.tail, reading })?;
                    backoff(&mut spins, wait).map_err(|Stop| RingError::Stopped)?;
                    continue;
                }
            };
            if len > buf.len() {
                return Err(RingError::TooBig(len));
            }
            let n = if whole(self.size, len) { len } else { (len - done).min(chunk_payload(self.size)) };
            self.wait_for(HEADER + pad8(n), wait)?;
            if let Err(why) = self.take_chunk(HEADER, n, Some(pcheck), &mut buf[done..done + n]) {
                self.doubted(why)?;
                backoff(&mut spins, wait).map_err(|Stop| RingError::Stopped)?;
                continue;
            }
            self.progress.store(done + n, Release);
            if done + n == len {
                self.current = None;
                return Ok(len);
            }
            self.current = Some((len, done + n));
        }
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
fn backoff(spins: &mut u32, wait: Waiter) -> Result<(), Stop> {
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

    fn forever() -> impl FnMut() -> Result<(), Stop> {
        || Ok(())
    }

    /// The producer's session in these tests.
    const SEED: u64 = 0x5EED;

    fn copy(size: usize, repair: bool) -> Option<Box<dyn Shadow>> {
        repair.then(|| Box::new(MemCopy::new(size)) as Box<dyn Shadow>)
    }

    fn seeded(mut c: Consumer) -> Consumer {
        c.set_seed(SEED);
        c
    }

    /// Random sizes (many larger than the ring, so they stream), two
    /// threads, every byte of every message checked, in order.
    fn stress(size: usize, sizes: Vec<usize>) {
        stress_over(size, sizes, false)
    }

    fn stress_over(size: usize, sizes: Vec<usize>, repair: bool) {
        let p = pair(size);
        let mut prod = Producer::new(p.a.clone(), p.b.clone(), size, SEED, copy(size, repair));
        let mut cons = seeded(Consumer::new(p.b.clone(), p.a.clone(), size, repair));
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

    fn random_sizes(n: usize) -> Vec<usize> {
        let mut x = 0x1234_5678u64;
        (0..n)
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
            .collect()
    }

    #[test]
    fn two_threads_random_sizes_every_byte_checked() {
        stress(4096, random_sizes(3000));
    }

    #[test]
    fn two_threads_with_checks_and_nothing_lost() {
        stress_over(4096, random_sizes(3000), true);
    }

    /// `count` messages of random sizes from a writer thread to `cons`,
    /// every byte checked. The reader's waits serve the producer when it
    /// is idle, as a channel's do.
    fn exchange(prod: &Arc<std::sync::Mutex<Producer>>, cons: &mut Consumer, count: usize) {
        let sizes = random_sizes(count);
        let expect = sizes.clone();
        let w = prod.clone();
        let writer = std::thread::spawn(move || {
            for (i, &n) in sizes.iter().enumerate() {
                w.lock().unwrap().write(&msg(i as u64, n), &mut forever()).unwrap();
            }
        });
        let mut serve = || {
            if let Ok(mut p) = prod.try_lock() {
                p.service();
            }
            Ok(())
        };
        let mut buf = vec![0u8; 40_000];
        for (i, &n) in expect.iter().enumerate() {
            let got = cons.read(&mut buf, &mut serve).unwrap();
            assert!(got == n && buf[..n] == msg(i as u64, n)[..], "message {i} of {n} bytes delivered wrong");
        }
        writer.join().unwrap();
    }

    /// A half that counts its 8-byte stores (what a transmit window traps).
    struct Counting {
        inner: Arc<Local>,
        words: std::sync::atomic::AtomicU64,
    }

    impl Sink for Counting {
        fn store(&self, off: usize, v: u64) {
            self.words.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.inner.store(off, v)
        }
        fn write(&self, off: usize, src: &[u8]) {
            self.words.fetch_add(src.len().div_ceil(8) as u64, std::sync::atomic::Ordering::Relaxed);
            self.inner.write(off, src)
        }
    }

    /// Over MEMORY CHANNEL a chunk is published by its header, written
    /// after its payload, and HEAD is not stored: a 16-byte message is a
    /// short chunk, one header word and its payload, 3 stores, and a
    /// 300-byte one a chunk with the long header, 2 + 38 stores. Over
    /// shared memory the header goes first and HEAD publishes the chunk
    /// (5 and 41). Either way the reader gets every message, across the
    /// end of the ring.
    #[test]
    fn over_memory_channel_the_header_publishes_a_chunk() {
        for repair in [true, false] {
            let size = 512;
            let p = pair(size);
            let out = Arc::new(Counting { inner: p.a.clone(), words: Default::default() });
            let mut prod = Producer::new(out.clone(), p.b.clone(), size, SEED, copy(size, repair));
            let mut cons = seeded(Consumer::new(p.b.clone(), p.a.clone(), size, repair));
            let mut buf = [0u8; 512];
            assert_eq!(cons.peek().unwrap(), None);
            for i in 0..40u64 {
                let n = if i % 4 == 3 { 300 } else { 16 };
                let before = out.words.load(std::sync::atomic::Ordering::Relaxed);
                prod.write(&msg(i, n), &mut forever()).unwrap();
                let cost = out.words.load(std::sync::atomic::Ordering::Relaxed) - before;
                let want = match (repair, n) {
                    (true, 16) => 3,
                    (true, _) => 40,
                    (false, 16) => 5,
                    (false, _) => 41,
                };
                assert_eq!(cost, want, "stores of a {n}-byte message, repair {repair}");
                assert_eq!(p.a.load(HEAD), if repair { 0 } else { prod.produced() }, "HEAD");
                assert_eq!(cons.peek().unwrap(), Some(n));
                assert_eq!(cons.read(&mut buf, &mut forever()).unwrap(), n);
                assert_eq!(buf[..n], msg(i, n)[..], "message {i}, repair {repair}");
                assert_eq!(cons.peek().unwrap(), None, "nothing more");
            }
            // Sizes that end a chunk at every offset of the ring's end, short
            // and long.
            for (i, n) in (0..40).map(|k| k * 8 + 1).enumerate() {
                prod.write(&msg(i as u64, n), &mut forever()).unwrap();
                assert_eq!(cons.read(&mut buf, &mut forever()).unwrap(), n);
                assert_eq!(buf[..n], msg(i as u64, n)[..]);
            }
            assert_eq!(cons.available(), 0);
        }
    }

    /// A consumer over MEMORY CHANNEL looks at the header at its index
    /// before anything says it was written, so a header from the lap
    /// before must never read as a chunk, even one whose check happens to
    /// fit this lap's position: its lap mark says which lap wrote it.
    #[test]
    fn a_header_from_the_lap_before_is_not_a_chunk() {
        let size = 4096;
        // Long chunks (496 bytes: 512 ring bytes) and short ones (24: 32).
        for (n, per_lap) in [(496usize, 8u64), (24, 128)] {
            let p = pair(size);
            let mut prod = Producer::new(p.a.clone(), p.b.clone(), size, SEED, copy(size, true));
            let mut cons = seeded(Consumer::new(p.b.clone(), p.a.clone(), size, true));
            let mut buf = [0u8; 512];
            for i in 0..per_lap {
                prod.write(&msg(i, n), &mut forever()).unwrap();
                assert_eq!(cons.read(&mut buf, &mut forever()).unwrap(), n);
            }
            assert_eq!(cons.taken(), size as u64);
            // The lap-0 header at ring offset 0, with a check made to fit
            // byte 4096 (a 1 in 2^32 chance without the mark), and the
            // same header with this lap's mark.
            let w0 = p.a.load(RING);
            let remark = (lap_mark(size, 0) ^ lap_mark(size, size as u64)) << 32;
            let forge = |w0: u64| {
                if n > SHORT_MAX {
                    let w1 = u64::from(head_check(SEED, size as u64, &[w0])) << 32 | (p.a.load(RING + 8) & 0xFFFF_FFFF);
                    p.a.store(RING + 8, w1);
                    p.a.store(RING, w0);
                } else {
                    let mut sum = Sum::default();
                    let mut bytes = vec![0u8; n];
                    p.a.read(RING + SHORT_HEADER, &mut bytes);
                    sum.add_padded(&bytes);
                    let w = w0 & !0xFFFF_FFFF | u64::from(short_check(SEED, size as u64, w0 >> 32, sum));
                    p.a.store(RING, w);
                }
            };
            forge(w0);
            assert_eq!(cons.peek().unwrap(), None, "the lap before's {n}-byte chunk read as a chunk");
            forge(w0 ^ remark);
            assert_eq!(cons.peek().unwrap(), Some(n), "with this lap's mark it is one");
        }
    }

    /// A half whose stores a link drops: writes (ring bytes) and control
    /// stores are lost at random, as frames in a link flap or a CRC error.
    struct Lossy {
        inner: Arc<Local>,
        rng: std::sync::Mutex<u64>,
        /// Out of 1000: writes lost, control stores lost.
        writes: u64,
        stores: u64,
        lost: std::sync::atomic::AtomicU64,
        /// Drop every write (a whole message lost) while set.
        all: std::sync::atomic::AtomicBool,
    }

    impl Lossy {
        fn new(inner: Arc<Local>, writes: u64, stores: u64) -> Arc<Lossy> {
            Arc::new(Lossy {
                inner,
                rng: std::sync::Mutex::new(0x9E37_79B9),
                writes,
                stores,
                lost: Default::default(),
                all: Default::default(),
            })
        }
        fn lose(&self, per_mille: u64) -> bool {
            let mut x = self.rng.lock().unwrap();
            *x ^= *x << 13;
            *x ^= *x >> 7;
            *x ^= *x << 17;
            let l = *x % 1000 < per_mille;
            if l {
                self.lost.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            l
        }
    }

    impl Sink for Lossy {
        fn store(&self, off: usize, v: u64) {
            if !self.lose(self.stores) {
                self.inner.store(off, v)
            }
        }
        fn write(&self, off: usize, src: &[u8]) {
            if !self.all.load(std::sync::atomic::Ordering::Relaxed) && !self.lose(self.writes) {
                self.inner.write(off, src)
            }
        }
    }

    /// Both directions' stores lost at random (ring writes 3%, index and
    /// repair stores 3%), two threads, messages from 0 bytes to ten rings:
    /// every message arrives whole, in order, and nothing wrong is delivered.
    /// A 4 KiB ring whose producer loses 3% of its ring writes and both
    /// sides 3% of their index stores: the pair (kept alive), the lossy
    /// producer half, the producer (shared with its reader's waits) and the
    /// consumer.
    #[allow(clippy::type_complexity)]
    fn lossy_ring() -> (Pair, Arc<Lossy>, Arc<std::sync::Mutex<Producer>>, Consumer) {
        let size = 4096;
        let p = pair(size);
        let (tx, rx) = (Lossy::new(p.a.clone(), 30, 30), Lossy::new(p.b.clone(), 0, 30));
        let prod =
            Arc::new(std::sync::Mutex::new(Producer::new(tx.clone(), p.b.clone(), size, SEED, copy(size, true))));
        let cons = seeded(Consumer::new(rx, p.a.clone(), size, true));
        (p, tx, prod, cons)
    }

    #[test]
    fn lost_frames_are_sent_again_never_delivered_wrong() {
        let (_p, tx, prod, mut cons) = lossy_ring();
        exchange(&prod, &mut cons, 600);
        let repairs = prod.lock().unwrap().repairs();
        let lost = tx.lost.load(std::sync::atomic::Ordering::Relaxed);
        assert!(lost > 20 && repairs > 0 && cons.nacks() > 0, "lost {lost}, repairs {repairs}, nacks {}", cons.nacks());
    }

    /// Messages written as a 16-byte head and a body (`write_parts`) and
    /// read split into a head and a place of the reader's choosing
    /// (`read_split`), with ring writes and index stores lost at random: a
    /// split read that does not check gives way to the repairing `read`,
    /// and every message arrives whole, in order. Most are read split.
    #[test]
    fn parts_and_split_reads_deliver_every_byte_despite_losses() {
        let (_p, tx, prod, mut cons) = lossy_ring();
        let sizes = random_sizes(600);
        let expect = sizes.clone();
        let w = prod.clone();
        let writer = std::thread::spawn(move || {
            for (i, &n) in sizes.iter().enumerate() {
                let m = msg(i as u64, n + 16);
                w.lock().unwrap().write_parts(&[&m[..16], &m[16..]], &mut forever()).unwrap();
            }
        });
        let mut serve = || {
            if let Ok(mut p) = prod.try_lock() {
                p.service();
            }
            Ok(())
        };
        let (mut split, mut whole_reads) = (0, 0);
        let mut buf = vec![0u8; 41_000];
        for (i, &n) in expect.iter().enumerate() {
            let want = msg(i as u64, n + 16);
            let mut head = [0u8; 16];
            let mut body = vec![0u8; n];
            let got =
                cons.read_split(&mut head, |h, rest| (h.len() == 16 && rest == n).then_some(&mut body[..]), &mut serve);
            match got.unwrap() {
                Some(len) => {
                    split += 1;
                    assert!(
                        len == n + 16 && head[..] == want[..16] && body[..] == want[16..],
                        "message {i} split wrong"
                    );
                }
                None => {
                    whole_reads += 1;
                    let len = cons.read(&mut buf, &mut serve).unwrap();
                    assert!(len == n + 16 && buf[..len] == want[..], "message {i} of {n} bytes delivered wrong");
                }
            }
        }
        writer.join().unwrap();
        let lost = tx.lost.load(std::sync::atomic::Ordering::Relaxed);
        assert!(lost > 20 && cons.nacks() > 0, "lost {lost}, nacks {}", cons.nacks());
        assert!(split > 300, "{split} read split, {whole_reads} whole");
    }

    /// A copy that sends pieces of 256 bytes or more by a fake engine
    /// writing straight into the ring's memory; one transfer in ten is
    /// accepted and then lost (as a failed DMA: nothing tells the writer).
    struct FakeDma {
        copy: MemCopy,
        ring: Arc<Local>,
        sent: u64,
        lost: u64,
    }

    impl Shadow for FakeDma {
        fn keep(&mut self, pos: usize, src: &[u8]) {
            self.copy.keep(pos, src)
        }
        fn get(&self, pos: usize, dst: &mut [u8]) {
            self.copy.get(pos, dst)
        }
        fn dma(&mut self, pos: usize, len: usize) -> bool {
            if len < 256 {
                return false;
            }
            self.sent += 1;
            if self.sent % 10 == 0 {
                self.lost += 1;
                return true;
            }
            let mut b = vec![0u8; len];
            self.copy.get(pos, &mut b);
            self.ring.write(RING + pos, &b);
            true
        }
    }

    #[test]
    fn pieces_sent_by_dma_arrive_and_failed_transfers_are_repaired() {
        let size = 4096;
        let p = pair(size);
        let fake = FakeDma { copy: MemCopy::new(size), ring: p.a.clone(), sent: 0, lost: 0 };
        let prod =
            Arc::new(std::sync::Mutex::new(Producer::new(p.a.clone(), p.b.clone(), size, SEED, Some(Box::new(fake)))));
        let mut cons = seeded(Consumer::new(p.b.clone(), p.a.clone(), size, true));
        exchange(&prod, &mut cons, 400);
        let prod = prod.lock().unwrap();
        assert!(prod.dma_bytes() > 100_000, "large pieces went by DMA: {}", prod.dma_bytes());
        assert!(prod.repairs() > 0 && cons.nacks() > 0, "lost transfers were repaired");
    }

    /// A message lost whole, whose index store arrives: the reader finds
    /// the bytes of the ring's last lap there, which must not pass for it.
    #[test]
    fn a_lost_message_over_the_last_lap_is_not_delivered() {
        let size = 256;
        let p = pair(size);
        let tx = Lossy::new(p.a.clone(), 0, 0);
        let mut prod = Producer::new(tx.clone(), p.b.clone(), size, SEED, copy(size, true));
        let mut cons = seeded(Consumer::new(p.b.clone(), p.a.clone(), size, true));
        let mut buf = [0u8; 256];
        // Four laps of the same 48-byte message: position 256 holds a
        // header and payload that checked at position 0.
        for _ in 0..(256 / footprint(size, 48)) + 1 {
            prod.write(&msg(1, 48), &mut forever()).unwrap();
            assert_eq!(cons.read(&mut buf, &mut forever()).unwrap(), 48);
        }
        let at = prod.produced();
        let mut same_spot = 0;
        while (prod.produced() - at) % size as u64 != 0 || prod.produced() == at {
            prod.write(&msg(1, 48), &mut forever()).unwrap();
            assert_eq!(cons.read(&mut buf, &mut forever()).unwrap(), 48);
            same_spot += 1;
            assert!(same_spot < 64);
        }
        // Now lose a different message of the same length at a spot whose
        // last lap held msg(1, 48).
        tx.all.store(true, std::sync::atomic::Ordering::Relaxed);
        let at = prod.produced();
        prod.write(&msg(2, 48), &mut forever()).unwrap();
        tx.all.store(false, std::sync::atomic::Ordering::Relaxed);
        let mut polls = 0;
        let mut serve = || {
            polls += 1;
            if polls > 3 {
                prod.service();
            }
            Ok(())
        };
        assert_eq!(cons.read(&mut buf, &mut serve).unwrap(), 48);
        assert_eq!(buf[..48], msg(2, 48)[..], "the last lap's bytes were delivered for message at {at}");
    }

    /// Bytes that stay lost (every write of the sender is lost, its
    /// repairs too) end in an error after [`REPAIR_LIMIT`], never in
    /// delivery.
    #[test]
    fn bytes_lost_for_good_are_an_error_not_a_message() {
        let size = 4096;
        let p = pair(size);
        let tx = Lossy::new(p.a.clone(), 1000, 0);
        let mut prod = Producer::new(tx.clone(), p.b.clone(), size, SEED, copy(size, true));
        let mut cons = seeded(Consumer::new(p.b.clone(), p.a.clone(), size, true));
        prod.write(&msg(3, 100), &mut forever()).unwrap();
        let t0 = Instant::now();
        // The writer is serviced meanwhile, as a channel's side that waits
        // or polls services its own writer: it sends HEAD again (a store,
        // which arrives here) and answers repair requests (writes, lost).
        let r = cons.read(&mut [0u8; 128], &mut || {
            prod.service();
            Ok(())
        });
        assert!(matches!(&r, Err(e @ RingError::Lost(_)) if e.to_string().contains("lost in transit")), "{r:?}");
        assert!(t0.elapsed() >= REPAIR_LIMIT);
        assert!(cons.nacks() >= 10, "asked again every {REPAIR_EVERY:?}: {}", cons.nacks());
    }

    /// Over shared memory nothing is lost: payloads are not checked, and
    /// a ring from another session is garbage at once.
    #[test]
    fn another_session_s_bytes_never_check() {
        let p = pair(4096);
        let mut prod = Producer::new(p.a.clone(), p.b.clone(), 4096, SEED + 1, None);
        prod.write(&msg(1, 100), &mut forever()).unwrap();
        let mut cons = seeded(Consumer::new(p.b.clone(), p.a.clone(), 4096, false));
        assert!(matches!(
            cons.read(&mut [0u8; 128], &mut forever()),
            Err(RingError::NotAMessage(Doubt::Header { .. }))
        ));
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
        let mut prod = Producer::new(p.a.clone(), p.b.clone(), 256, SEED, None);
        let mut cons = seeded(Consumer::new(p.b.clone(), p.a.clone(), 256, false));
        assert_eq!(prod.free().unwrap(), 256);
        prod.write(&msg(0, 100), &mut forever()).unwrap();
        assert_eq!(prod.free().unwrap(), 256 - footprint(256, 100));
        // A message that fits the free space goes in with a waiter that
        // refuses to wait.
        let fits = room(prod.free().unwrap());
        prod.write(&msg(1, fits), &mut || Err(Stop)).unwrap();
        assert_eq!(prod.free().unwrap(), 0);
        assert!(prod.write(&msg(2, 1), &mut || Err(Stop)).is_err());
        let mut buf = [0u8; 256];
        assert_eq!(cons.read(&mut buf, &mut forever()).unwrap(), 100);
        assert_eq!(cons.peek().unwrap(), Some(fits));
        assert_eq!(cons.read(&mut buf, &mut forever()).unwrap(), fits);
        assert_eq!(prod.free().unwrap(), 256, "reading a quarter of the ring gives its space back at once");
        // Less is given back lazily: not at the first poll that finds
        // nothing more (a ping-pong's answer goes first), at the second.
        prod.write(&msg(3, 8), &mut forever()).unwrap();
        assert_eq!(cons.read(&mut buf, &mut forever()).unwrap(), 8);
        assert_eq!(cons.peek().unwrap(), None);
        assert_eq!(prod.free().unwrap(), 256 - footprint(256, 8), "the first empty poll publishes nothing");
        assert_eq!(cons.peek().unwrap(), None);
        assert_eq!(prod.free().unwrap(), 256, "the second gives the space back");
    }

    /// Over MEMORY CHANNEL (repair on) a waiting consumer keeps its index
    /// to itself for [`LAZY_TAIL`]: a ping-pong's answer never pays for
    /// it; the index goes once the consumer has waited that long.
    #[test]
    fn over_memory_channel_the_index_waits_a_little() {
        let p = pair(256);
        let mut prod = Producer::new(p.a.clone(), p.b.clone(), 256, SEED, copy(256, true));
        let mut cons = seeded(Consumer::new(p.b.clone(), p.a.clone(), 256, true));
        let mut buf = [0u8; 256];
        prod.write(&msg(1, 8), &mut forever()).unwrap();
        assert_eq!(cons.read(&mut buf, &mut forever()).unwrap(), 8);
        for _ in 0..3 {
            assert_eq!(cons.peek().unwrap(), None);
        }
        assert_eq!(prod.free().unwrap(), 256 - (SHORT_HEADER + 8), "no index store right after a read");
        std::thread::sleep(LAZY_TAIL + Duration::from_millis(1));
        assert_eq!(cons.peek().unwrap(), None);
        assert_eq!(prod.free().unwrap(), 256, "the index goes once the consumer has waited");
    }

    #[test]
    fn too_big_for_the_buffer_is_left_in_place() {
        let p = pair(4096);
        let mut prod = Producer::new(p.a.clone(), p.b.clone(), 4096, SEED, None);
        let mut cons = seeded(Consumer::new(p.b.clone(), p.a.clone(), 4096, false));
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
        let mut cons = seeded(Consumer::new(p.b.clone(), p.a.clone(), 4096, false));
        let mut buf = [0u8; 64];
        assert!(matches!(cons.read(&mut buf, &mut forever()), Err(RingError::NotAMessage(Doubt::Header { .. }))));
        // A producer index beyond the ring is caught too.
        p.a.store(HEAD, 1 << 40);
        let mut cons = seeded(Consumer::new(p.b.clone(), p.a.clone(), 4096, false));
        assert!(matches!(cons.read(&mut buf, &mut forever()), Err(RingError::ProducerIndex { .. })));
    }

    #[test]
    fn a_garbage_consumer_index_is_reported_not_a_panic() {
        let p = pair(4096);
        let mut prod = Producer::new(p.a.clone(), p.b.clone(), 4096, SEED, None);
        // Fill the ring so the producer has to look at the consumer's index...
        let mut give_up = || Err(Stop);
        assert!(prod.write(&msg(1, 5000), &mut give_up).is_err());
        // ...which is nonsense: far behind, then ahead of us.
        for bad in [1u64 << 40, u64::MAX] {
            p.b.store(TAIL, bad);
            let mut prod = Producer::new(p.a.clone(), p.b.clone(), 4096, SEED, None);
            prod.head = 8192;
            prod.tail = 0;
            assert!(matches!(prod.write(&msg(2, 64), &mut forever()), Err(RingError::ConsumerIndex { .. })), "{bad}");
        }
        // A producer index behind ours, for the consumer.
        let mut cons = seeded(Consumer::new(p.b.clone(), p.a.clone(), 4096, false));
        cons.tail = 100;
        p.a.store(HEAD, 8);
        cons.head = 8;
        assert!(matches!(cons.read(&mut [0u8; 64], &mut forever()), Err(RingError::ProducerIndex { .. })));
    }

    #[test]
    fn a_stopped_wait_keeps_the_partial_message_for_the_next_call() {
        let p = pair(4096);
        let mut prod = Producer::new(p.a.clone(), p.b.clone(), 4096, SEED, None);
        let mut cons = seeded(Consumer::new(p.b.clone(), p.a.clone(), 4096, false));
        let m = msg(3, 10_000);
        // The writer fills the ring and stops (its wait gives up).
        let mut give_up = || Err(Stop);
        assert!(prod.write(&m, &mut give_up).is_err());
        let mut buf = vec![0u8; 10_000];
        assert!(cons.read(&mut buf, &mut give_up).is_err());
        assert!(cons.mid_message());
        let done = cons.progress().load(std::sync::atomic::Ordering::Acquire);
        assert!(done > 0 && done < 10_000, "{done}");
    }
}
