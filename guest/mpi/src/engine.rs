//! The point-to-point engine: message matching, the eager and rendezvous
//! protocols, requests and progress. It knows ranks of `MPI_COMM_WORLD`,
//! context ids (one per communicator and purpose) and bytes; communicators,
//! datatypes and handles are the C layer's ([`crate::ffi`]).
//!
//! # Protocols (docs/mpi.md, "Protocols")
//! - **Eager** (up to [`Engine::eager_limit`] bytes, a quarter of the
//!   smallest ring, 16 to 256 KiB): the envelope and the
//!   payload travel in one frame. A sender's buffer is free at once; an
//!   unmatched message waits in the receiver's unexpected queue.
//! - **Credits** bound what eager messages can hold at a receiver. Each
//!   sender may have [`Engine::credit_limit`] bytes (a message costs its
//!   length plus [`ENTRY_COST`]) sent eagerly to a rank and not yet
//!   matched there: in its own send queue, in the ring, or unexpected at
//!   the receiver. The receiver gives them back as its receives take the
//!   messages (a `CREDIT` frame once a quarter of the limit is owed, or on
//!   a `CTS`). A message with no credit left goes by rendezvous, whatever
//!   its size: it waits at the sender, and only its envelope at the
//!   receiver. Nothing is lost and nobody blocks.
//! - **Rendezvous** (larger): the sender announces (`RTS`); once a receive
//!   matches, the receiver answers (`CTS`) and the sender streams `DATA`
//!   frames straight into the posted buffer as ring space allows.
//! - **Zero copy** ([`Direct`]; docs/mpi.md, "Zero copy"): when the
//!   posted buffer is in the receiver's landing memory (`MPI_Alloc_mem`
//!   across guests), its `CTS` says where (`FLAG_DIRECT`); a sender whose
//!   buffer is in its own such memory moves the message with one DMA
//!   straight into the posted buffer, then sends `DONE`. The receiver takes
//!   it if its adapter counted no error and saw no node leave or join
//!   since before the `CTS` ([`Direct::losses`]) and answers `TAKEN`,
//!   which completes the send; otherwise it asks again with a plain `CTS`
//!   and the message is streamed as `DATA`. A sender that cannot start the
//!   DMA, or whose transfer fails, streams `DATA` instead: into the same
//!   buffer.
//! - **Synchronous** sends (`MPI_Ssend`) complete when the receiver
//!   matched: eagerly sent ones get an `ACK`, rendezvous ones complete at
//!   the `CTS`.
//! - **Cancelling a send** (`MPI_Cancel`) that still waits for its
//!   receiver (a rendezvous before its `CTS`, a synchronous send before its
//!   `ACK`): the sender asks (`CANCEL`), and the receiver takes the message
//!   out of its unexpected queue if nothing has matched it yet and answers
//!   (`CANCELLED`, `b` = 1 if it did). A send already matched completes as
//!   usual; one already complete (eager) cannot be cancelled.
//!
//! Messages between one pair of ranks arrive in the order sent and are
//! matched in arrival order, so MPI's non-overtaking rule holds. No frame
//! is written unless it fits the link now, so a rank never blocks on one
//! peer while another waits for it.
//!
//! # A frame
//!
//! ```text
//! 0  kind u8 | flags u8 | 0 u16 | ctx u32
//! 8  tag i32 | 0 u32
//! 16 len u64            message bytes (EAGER, RTS), chunk offset (DATA) or credit given back (CTS)
//! 24 a u64              sender's request (EAGER sync, RTS, CTS, ACK, CANCEL, CANCELLED), receiver's (DATA)
//!                       or credit given back (CREDIT)
//! 32 b u64              receiver's request (CTS, DONE); 1 if cancelled (CANCELLED); a short message's number (CANCEL)
//! 40 payload            EAGER, DATA
//! ```
//!
//! A `CTS` with `FLAG_DIRECT` carries in bytes 8..16 (where other frames
//! have the tag) the offset of the posted buffer in the receiver's landing
//! memory. `DONE` has the message's length in `len`, the sender's request
//! in `a` and the receiver's in `b`; `TAKEN` the sender's request in `a`.
//!
//! A standard eager send (not synchronous, context below 2^24) has the
//! short envelope instead, one word, its length the frame's:
//!
//! ```text
//! 0  EAGER8 u8 | ctx u24 | tag i32
//! 8  payload
//! ```
//!
//! Over MEMORY CHANNEL every 8 bytes of a frame is one trapped store, so
//! an 8-byte message costs 2 stores of envelope instead of 5.
//!
//! Touched by the thread that calls MPI, under the C layer's lock.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap as HashMap;
use thiserror::Error;

use crate::rma::{Rma, RmaError};
use crate::transport::{Link, TransportError};

/// Bytes of a frame header.
pub const HDR: usize = 40;

const EAGER: u8 = 1;
const RTS: u8 = 2;
const CTS: u8 = 3;
const DATA: u8 = 4;
const ACK: u8 = 5;
const CANCEL: u8 = 6;
const CANCELLED: u8 = 7;
/// Credit given back: `a` bytes (see "Credits").
const CREDIT: u8 = 9;
/// Zero copy: the DMA into the posted buffer is complete.
const DONE: u8 = 10;
/// Zero copy: the receiver took the message (the send is complete).
const TAKEN: u8 = 11;
/// Store your board slot again: a store of it may have been lost on the
/// way here (`crate::board`, "Lost stores").
const REPOST: u8 = 12;
/// An eager message with the one-word envelope (see "A frame").
const EAGER8: u8 = 8;
/// One-sided communication: `ctx` is the window, `tag` the operation
/// ([`crate::rma`], "A frame").
const RMA: u8 = 13;
/// This rank has passed the job's last barrier and will close its end
/// once everyone has its goodbye ([`Engine::leave`]).
const BYE: u8 = 14;
/// Bytes of the short envelope.
const HDR8: usize = 8;
/// Contexts the short envelope can carry.
const CTX8_LIMIT: u32 = 1 << 24;
/// A short eager message carries no sender's request: both sides number
/// them per pair of ranks, and a cancel names one as `SHORT_ID | number`
/// (request ids never have the top bit).
const SHORT_ID: u64 = 1 << 63;

const FLAG_SYNC: u8 = 1;
/// On a `CTS`: the posted buffer is in the receiver's landing memory.
const FLAG_DIRECT: u8 = 2;

/// Zero-copy transfers between guests ([`crate::zcopy`] is the real one):
/// memory a DMA can both come from and land in.
pub trait Direct: Send {
    /// Where `len` bytes at `ptr` are in this rank's landing memory, if
    /// they are there and rank `peer` can send to it by DMA.
    fn landing(&self, peer: u32, ptr: *const u8, len: usize) -> Option<u64>;
    /// Starts sending `len` bytes at `src` to byte `off` of rank `to`'s
    /// landing memory; `None` when that cannot be done (the bytes are not
    /// in this rank's memory, or the engine refused).
    fn start(&mut self, to: u32, off: u64, src: *const u8, len: usize) -> Option<u64>;
    /// A transfer's outcome: `Some(true)` sent whole, `Some(false)` failed,
    /// `None` in flight.
    fn poll(&mut self, token: u64) -> Option<bool>;
    /// A stamp of what this node's adapter saw that may have lost a write
    /// to it: its error count and its link events (another node leaving,
    /// as a sender whose link went down with packets in flight does), both
    /// only ever growing. With `fresh`, read now from the adapter (trapped
    /// loads); without, the last one read (reading it the first time): an
    /// older stamp only makes a comparison more cautious.
    fn losses(&mut self, fresh: bool) -> u64;
    /// `len` bytes of landing memory for rank `me` (`MPI_Alloc_mem`), if
    /// there is any.
    fn alloc(&mut self, _me: u32, _len: usize) -> Option<*mut u8> {
        None
    }
    /// Gives back memory [`Direct::alloc`] returned; false if `ptr` is not
    /// such memory.
    fn free(&mut self, _ptr: *mut u8) -> bool {
        false
    }
    /// Why there is no landing memory, once it was asked for.
    fn why_not(&self) -> Option<String> {
        None
    }
}

/// A send moving by zero copy.
#[derive(Debug)]
struct DirectSend {
    sreq: ReqId,
    rreq: u64,
    to: u32,
    /// The transfer in flight; `None` once `DONE` is queued.
    token: Option<u64>,
}

/// The smallest default eager limit (bytes).
pub const EAGER_DEFAULT: usize = 16 << 10;
/// The largest default eager limit: a quarter of the smallest ring, up to
/// this. A rendezvous costs a round trip of two small messages (~1 ms
/// across TCG guests), more than copying 256 KiB once more; NPmpi across 2
/// guests with 1 MiB rings, eager limit 64 KiB against 256 KiB: 128 KiB
/// messages 67-69 -> 151-168 MB/s.
pub const EAGER_MAX: usize = 256 << 10;

/// What an unexpected message costs a receiver beyond its payload (its
/// queue entry), in credit.
pub const ENTRY_COST: usize = 64;
/// Eager bytes a rank may have waiting unmatched at it, from all other
/// ranks together, unless `MCMPI_UNEXPECTED` says: the credit of each
/// sender is this much over the other ranks, and at least
/// [`CREDIT_MIN_MESSAGES`] eager messages of the largest size.
pub const UNEXPECTED_DEFAULT: usize = 16 << 20;
/// Largest eager messages a sender's credit always covers.
pub const CREDIT_MIN_MESSAGES: usize = 2;

/// Credit a message of `len` bytes costs.
fn cost(len: usize) -> usize {
    len + ENTRY_COST
}

/// Errors of the engine.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum EngineError {
    /// A link to another rank failed.
    #[error(transparent)]
    Link(#[from] TransportError),
    /// A frame that makes no sense (corrupt, or a protocol bug).
    #[error("from rank {from}: {what}")]
    Protocol {
        /// The rank it came from.
        from: u32,
        /// What is wrong.
        what: String,
    },
    /// A request id that is not (or no longer) known.
    #[error("no request {0}")]
    NoRequest(u64),
    /// A rank outside the job.
    #[error("rank {0} is not in the job")]
    NoRank(u32),
    /// One-sided communication failed.
    #[error(transparent)]
    Rma(#[from] RmaError),
}

/// A request id.
pub type ReqId = u64;

/// What a completed request reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Status {
    /// The sender's rank in the world.
    pub source: u32,
    /// The message's tag.
    pub tag: i32,
    /// Bytes delivered.
    pub bytes: usize,
    /// The message was longer than the receive buffer (`bytes` were kept).
    pub truncated: bool,
    /// The request was cancelled.
    pub cancelled: bool,
}

/// `cap` bytes of the caller's memory that a receive may write, until
/// it completes or is cancelled (MPI's rule for receive buffers). Made
/// only by [`Posted::new`], whose caller promises that.
#[derive(Debug, Clone, Copy)]
pub struct Posted {
    ptr: *mut u8,
    cap: usize,
}

impl Posted {
    /// The receive buffer of `cap` bytes at `ptr`.
    ///
    /// # Safety
    /// `ptr..ptr + cap` must stay valid for writes, and written by nothing
    /// else, until the receive that takes it completes or is cancelled.
    pub unsafe fn new(ptr: *mut u8, cap: usize) -> Posted {
        Posted { ptr, cap }
    }
}

/// Where a receive puts the message.
#[derive(Debug, Clone, Copy)]
pub enum RecvBuf {
    /// Straight into the caller's memory.
    Contig(Posted),
    /// Into a buffer the engine keeps (the caller unpacks it later with
    /// [`Engine::take_packed`]): for non-contiguous datatypes.
    Packed {
        /// Bytes wanted at most.
        cap: usize,
    },
}

impl RecvBuf {
    fn cap(&self) -> usize {
        match *self {
            RecvBuf::Contig(Posted { cap, .. }) | RecvBuf::Packed { cap } => cap,
        }
    }
}

/// `len` bytes of the caller's memory that a send reads, until it
/// completes or is cancelled (MPI's rule for send buffers). Made only by
/// [`Lent::new`], whose caller promises that.
#[derive(Debug, Clone, Copy)]
pub struct Lent {
    ptr: *const u8,
    len: usize,
}

impl Lent {
    /// The send buffer of `len` bytes at `ptr`.
    ///
    /// # Safety
    /// `ptr..ptr + len` must stay valid for reads, and unchanged, until the
    /// send that takes it completes or is cancelled.
    pub unsafe fn new(ptr: *const u8, len: usize) -> Lent {
        Lent { ptr, len }
    }
}

/// What a send takes its bytes from.
#[derive(Debug)]
pub enum SendBuf {
    /// Bytes the engine owns (packed, or copied).
    Owned(Vec<u8>),
    /// The caller's memory.
    Borrowed(Lent),
}

impl SendBuf {
    /// The same bytes, owned by the engine (a copy of the caller's): for a
    /// send that completes before the bytes leave (`MPI_Bsend`).
    pub fn into_owned(self) -> SendBuf {
        match self {
            SendBuf::Borrowed(_) => SendBuf::Owned(self.bytes(0, self.len()).to_vec()),
            owned => owned,
        }
    }
    fn len(&self) -> usize {
        match self {
            SendBuf::Owned(v) => v.len(),
            SendBuf::Borrowed(Lent { len, .. }) => *len,
        }
    }
    fn bytes(&self, off: usize, n: usize) -> &[u8] {
        match self {
            SendBuf::Owned(v) => &v[off..off + n],
            // SAFETY: `Lent::new`'s caller keeps `len` bytes at `ptr` valid
            // and unchanged until the send completes; off + n <= len.
            SendBuf::Borrowed(Lent { ptr, len }) => unsafe {
                std::slice::from_raw_parts(ptr.add(off), n.min(len - off))
            },
        }
    }
}

/// Which messages a receive or probe takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pattern {
    /// Context id (the communicator's).
    pub ctx: u32,
    /// World rank, or any.
    pub src: Option<u32>,
    /// Tag, or any.
    pub tag: Option<i32>,
}

impl Pattern {
    fn takes(&self, ctx: u32, src: u32, tag: i32) -> bool {
        self.ctx == ctx && self.src.is_none_or(|s| s == src) && self.tag.is_none_or(|t| t == tag)
    }
}

/// A message that arrived before its receive.
#[derive(Debug)]
struct Unexpected {
    ctx: u32,
    src: u32,
    tag: i32,
    len: usize,
    kind: Arrived,
}

impl Unexpected {
    /// Whether it is the message of send request `sreq` of its sender.
    fn sent_by(&self, sreq: u64) -> bool {
        matches!(self.kind, Arrived::Rts { sreq: s } | Arrived::Eager { sreq: s, .. } if s == sreq)
    }
}

#[derive(Debug)]
enum Arrived {
    /// The whole message; `sync` names the sender's request to ACK;
    /// `sreq` is the sender's request (for a cancel).
    Eager { data: Vec<u8>, sync: Option<u64>, sreq: u64 },
    /// Announced; the sender's request.
    Rts { sreq: u64 },
}

#[derive(Debug)]
enum Kind {
    /// `waiting`: for the receiver (a CTS or an ACK); `cancelling`: a
    /// CANCEL is out, and whether the send was complete when it went;
    /// `wire`: how the receiver knows the message when it is not by this
    /// request's id (a short eager message: [`SHORT_ID`] | its number).
    Send { dest: u32, data: SendBuf, waiting: bool, cancelling: Option<bool>, wire: u64 },
    Recv {
        pattern: Pattern,
        into: RecvBuf,
        total: usize,
        got: usize,
        packed: Vec<u8>,
        posted: bool,
        /// Offered as a zero-copy target: the sender's request and this
        /// node's loss stamp from before the offer.
        direct: Option<(u64, u64)>,
    },
}

#[derive(Debug)]
struct Req {
    kind: Kind,
    done: bool,
    status: Status,
}

/// Frames waiting for room on one link.
enum Out {
    Frame(Vec<u8>),
    /// DATA frames of send request `sreq` for receive request `rreq`.
    Stream {
        sreq: ReqId,
        rreq: u64,
        off: usize,
    },
}

/// A message removed from the queue by a matched probe (`MPI_Mprobe`).
#[derive(Debug)]
pub struct Matched(Unexpected);

impl Matched {
    /// Its status (source, tag, bytes).
    pub fn status(&self) -> Status {
        Status { source: self.0.src, tag: self.0.tag, bytes: self.0.len, ..Status::default() }
    }
}

/// One rank's engine.
pub struct Engine {
    me: u32,
    links: Vec<Option<Box<dyn Link>>>,
    out: Vec<VecDeque<Out>>,
    reqs: HashMap<ReqId, Req>,
    next_id: ReqId,
    /// Receives posted and not yet matched, in posting order.
    posted: VecDeque<ReqId>,
    /// Messages not yet matched, in arrival order.
    unexpected: VecDeque<Unexpected>,
    scratch: Vec<u8>,
    eager_limit: usize,
    /// Ranks that closed their end (finished, or died): an error only for
    /// a request that still needs them.
    gone: Vec<Option<TransportError>>,
    /// Past the job's last barrier ([`Engine::leave`]): a rank that closed
    /// its end needs nothing more from this one.
    leaving: bool,
    /// Per rank: it said goodbye (it is past the job's last barrier).
    bye: Vec<bool>,
    /// Frames and bytes moved (for `MCMPI_STATS`).
    pub stats: Stats,
    /// Per rank: short eager messages sent to it, and received from it.
    short_sent: Vec<u64>,
    short_seen: Vec<u64>,
    /// Eager bytes received from all ranks together that a rank may hold
    /// unmatched ([`Engine::set_unexpected_limit`]).
    unexpected_limit: usize,
    /// Per rank: the eager credit we still have with it.
    credit: Vec<usize>,
    /// Per rank: credit its messages freed here, not yet given back.
    owed: Vec<usize>,
    /// Eager payload bytes (with [`ENTRY_COST`] each) waiting unmatched here.
    unexpected_bytes: usize,
    /// Zero-copy transfers, when this rank has them.
    direct: Option<Box<dyn Direct>>,
    /// Sends moving by zero copy, until the receiver took them.
    direct_sends: Vec<DirectSend>,
    /// Another rank asked us to store our board slot again.
    repost_asked: bool,
    /// Windows and one-sided operations ([`Engine::rma`] sends what
    /// they queue).
    rma: Rma,
}

// SAFETY: the raw pointers an engine holds are the application's send and
// receive buffers, which MPI lets any thread pass; the engine touches them
// only under the C layer's lock, while the request that names them is live.
unsafe impl Send for Engine {}

/// Counters.
#[derive(Debug, Clone, Copy, Default)]
pub struct Stats {
    /// Messages sent eagerly.
    pub eager: u64,
    /// Messages sent by rendezvous.
    pub rendezvous: u64,
    /// Bytes sent to other ranks.
    pub bytes_out: u64,
    /// Most messages ever waiting unmatched.
    pub unexpected_peak: usize,
    /// `DATA` frames read straight into a posted buffer.
    pub direct: u64,
    /// `DATA` payload bytes written into links, and the time that took
    /// (copying into the ring, checksums, starting the DMA).
    pub data_out: (u64, Duration),
    /// `DATA` payload bytes read straight into place, and the time that
    /// took (copying out of the ring, checking).
    pub data_in: (u64, Duration),
    /// Messages small enough to go eagerly that went by rendezvous for
    /// want of credit.
    pub no_credit: u64,
    /// Most credit ever held here by unexpected eager messages (payload
    /// bytes plus [`ENTRY_COST`] each).
    pub unexpected_bytes_peak: usize,
    /// Messages sent by one DMA straight into the receiver's buffer, and
    /// their bytes.
    pub zero_copy: (u64, u64),
    /// Zero-copy offers that ended as `DATA` (the DMA could not start or
    /// failed, or an adapter counted an error).
    pub zero_copy_streamed: u64,
    /// Messages received by zero copy.
    pub zero_copy_in: u64,
}

fn header(kind: u8, flags: u8, ctx: u32, tag: i32, len: u64, a: u64, b: u64) -> [u8; HDR] {
    let mut h = [0u8; HDR];
    h[0] = kind;
    h[1] = flags;
    h[4..8].copy_from_slice(&ctx.to_ne_bytes());
    h[8..12].copy_from_slice(&tag.to_ne_bytes());
    h[16..24].copy_from_slice(&len.to_ne_bytes());
    h[24..32].copy_from_slice(&a.to_ne_bytes());
    h[32..40].copy_from_slice(&b.to_ne_bytes());
    h
}

/// The one-word envelope of a standard eager message (`ctx` < [`CTX8_LIMIT`]).
fn short_header(ctx: u32, tag: i32) -> [u8; HDR8] {
    let mut h = [0u8; HDR8];
    h[0] = EAGER8;
    h[1..4].copy_from_slice(&ctx.to_le_bytes()[..3]);
    h[4..8].copy_from_slice(&tag.to_ne_bytes());
    h
}

/// `DATA` frames at least this much longer than a header are read
/// straight into the posted buffer when they can be ([`data_place`]).
const SPLIT_MIN: usize = 1024;

/// Where the payload of a frame with header `h` and `rest` bytes after
/// it can go straight: the posted buffer of a contiguous receive, when the
/// frame is the `DATA` it expects next and all of it lands there.
fn data_place<'d>(reqs: &HashMap<ReqId, Req>, h: &[u8], rest: usize) -> Option<&'d mut [u8]> {
    if h.len() < HDR || h[0] != DATA {
        return None;
    }
    let (off, id) = (word(h, 16) as usize, word(h, 24));
    match reqs.get(&id)? {
        Req {
            kind: Kind::Recv { into: RecvBuf::Contig(Posted { ptr, cap }), got, total, .. }, done: false, ..
        } if *got == off && off + rest <= *total && off + rest <= *cap => {
            // SAFETY: the receive buffer holds `cap` bytes at `ptr` (the
            // caller's promise, kept until the receive completes, which it
            // has not); off + rest <= cap; nothing else writes there while
            // this frame is read.
            Some(unsafe { std::slice::from_raw_parts_mut(ptr.add(off), rest) })
        }
        _ => None,
    }
}

fn word(f: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&f[at..at + 8]);
    u64::from_ne_bytes(w)
}

impl Engine {
    /// The engine of rank `me`, with one link per other rank (`None` at `me`).
    pub fn new(me: u32, links: Vec<Option<Box<dyn Link>>>) -> Engine {
        let max = links.iter().flatten().map(|l| l.max_frame()).min().unwrap_or(usize::MAX);
        let eager_limit = (max / 4).clamp(EAGER_DEFAULT, EAGER_MAX).min(max.saturating_sub(HDR) / 2);
        let out = links.iter().map(|_| VecDeque::new()).collect();
        let gone = links.iter().map(|_| None).collect();
        let n = links.len();
        let mut e = Engine {
            me,
            links,
            out,
            reqs: HashMap::default(),
            next_id: 1,
            posted: VecDeque::new(),
            unexpected: VecDeque::new(),
            scratch: Vec::new(),
            eager_limit,
            gone,
            leaving: false,
            bye: vec![false; n],
            stats: Stats::default(),
            short_sent: vec![0; n],
            short_seen: vec![0; n],
            unexpected_limit: UNEXPECTED_DEFAULT,
            credit: vec![0; n],
            owed: vec![0; n],
            unexpected_bytes: 0,
            direct: None,
            direct_sends: Vec::new(),
            repost_asked: false,
            rma: Rma::new(),
        };
        e.reset_credit();
        e
    }

    /// Runs `f` on this rank's windows, then sends the frames it queued
    /// (those to this rank itself are applied at once).
    pub fn rma<T>(&mut self, f: impl FnOnce(&mut Rma) -> Result<T, RmaError>) -> Result<T, EngineError> {
        let r = f(&mut self.rma)?;
        self.send_rma()?;
        Ok(r)
    }

    /// The one-sided state, read only.
    pub fn rma_ref(&self) -> &Rma {
        &self.rma
    }

    /// Frames waiting for room on the link to rank `p`.
    pub fn queued_frames(&self, p: u32) -> usize {
        self.out.get(p as usize).map_or(0, |q| q.len())
    }

    /// The most payload one frame of one-sided communication carries.
    pub fn rma_frame(&self) -> usize {
        self.eager_limit
    }

    fn send_rma(&mut self) -> Result<(), EngineError> {
        loop {
            let out = self.rma.take_out();
            if out.is_empty() {
                return Ok(());
            }
            for m in out {
                if m.to == self.me {
                    self.rma.arrive(self.me, m.op, m.win, m.a, m.b, &m.payload)?;
                    continue;
                }
                if m.to >= self.size() {
                    return Err(EngineError::NoRank(m.to));
                }
                let mut f = header(RMA, 0, m.win, m.op as i32, m.payload.len() as u64, m.a, m.b).to_vec();
                f.extend_from_slice(&m.payload);
                self.stats.bytes_out += m.payload.len() as u64;
                self.out[m.to as usize].push_back(Out::Frame(f));
                self.flush(m.to as usize)?;
            }
        }
    }

    /// Every link's state and what waits to be written into it, a line
    /// each, for a report of a wait that lasts.
    pub fn describe_links(&self) -> String {
        let mut s = String::new();
        for (p, l) in self.links.iter().enumerate() {
            let state = match (l, &self.gone[p]) {
                (Some(l), _) => l.describe(),
                (None, Some(e)) => format!("gone: {e}"),
                (None, None) => continue,
            };
            s.push_str(&format!("  to rank {p}: {} frames queued; {state}\n", self.out[p].len()));
        }
        s
    }

    /// What request `id` waits for, and the zero-copy transfers in
    /// flight, for a report of a wait that lasts.
    pub fn describe_request(&self, id: ReqId) -> String {
        let mut s = match self.reqs.get(&id) {
            None => format!("request {id}: gone"),
            Some(Req { done: true, .. }) => format!("request {id}: done"),
            Some(Req { kind: Kind::Send { dest, data, waiting, cancelling, .. }, .. }) => format!(
                "request {id}: a send of {} bytes to rank {dest}{}{}",
                data.len(),
                if *waiting { ", waiting for the receiver's answer" } else { "" },
                if cancelling.is_some() { ", being cancelled" } else { "" },
            ),
            Some(Req { kind: Kind::Recv { pattern, total, got, posted, direct, .. }, .. }) => format!(
                "request {id}: a receive from {} tag {}: {}{}",
                pattern.src.map_or_else(|| "any rank".into(), |r| format!("rank {r}")),
                pattern.tag.map_or_else(|| "any".into(), |t| t.to_string()),
                if *posted { "no message matched yet".into() } else { format!("matched, {got} of {total} bytes in") },
                if direct.is_some() { ", offered as a zero-copy target" } else { "" },
            ),
        };
        for z in &self.direct_sends {
            s.push_str(&format!(
                "\n  zero-copy send (request {}) to rank {} for its request {}: {}",
                z.sreq,
                z.to,
                z.rreq,
                if z.token.is_some() { "DMA in flight" } else { "DONE queued" }
            ));
        }
        s
    }

    /// Asks rank `to` to store its board slot again.
    pub fn ask_repost(&mut self, to: u32) -> Result<(), EngineError> {
        if to >= self.size() || to == self.me {
            return Err(EngineError::NoRank(to));
        }
        self.out[to as usize].push_back(Out::Frame(header(REPOST, 0, 0, 0, 0, 0, 0).to_vec()));
        self.flush(to as usize)
    }

    /// Whether a rank asked us to store our board slot again since the
    /// last call.
    pub fn take_repost_asked(&mut self) -> bool {
        std::mem::take(&mut self.repost_asked)
    }

    /// Gives the engine zero-copy transfers ([`Direct`]).
    pub fn set_direct(&mut self, d: Box<dyn Direct>) {
        self.direct = Some(d);
    }

    /// Per rank: whether it is on another guest.
    pub fn remote_ranks(&self) -> Vec<bool> {
        self.links.iter().map(|l| l.as_ref().is_some_and(|l| l.remote())).collect()
    }

    /// Why this rank has no zero-copy memory, once it was asked for (or
    /// was never given any).
    pub fn direct_why_not(&self) -> Option<String> {
        match &self.direct {
            Some(d) => d.why_not(),
            None => Some("off, or every rank on this guest".into()),
        }
    }

    /// The zero-copy transfers, if set.
    pub fn direct_mut(&mut self) -> Option<&mut (dyn Direct + 'static)> {
        self.direct.as_deref_mut()
    }

    /// Every sender's credit: the unexpected limit over the other ranks,
    /// at least [`CREDIT_MIN_MESSAGES`] eager messages of the largest size.
    pub fn credit_limit(&self) -> usize {
        let others = self.links.len().saturating_sub(1).max(1);
        (self.unexpected_limit / others).max(CREDIT_MIN_MESSAGES * cost(self.eager_limit))
    }

    /// Sets the eager bytes this rank may hold unmatched from all others
    /// together (`MCMPI_UNEXPECTED`). Every rank of a job must set the
    /// same, before any message.
    pub fn set_unexpected_limit(&mut self, n: usize) {
        self.unexpected_limit = n;
        self.reset_credit();
    }

    fn reset_credit(&mut self) {
        let c = self.credit_limit();
        self.credit.iter_mut().for_each(|x| *x = c);
    }

    /// Eager bytes (with [`ENTRY_COST`] each) waiting unmatched here now.
    pub fn unexpected_bytes(&self) -> usize {
        self.unexpected_bytes
    }

    /// This rank.
    pub fn me(&self) -> u32 {
        self.me
    }

    /// Ranks in the job.
    pub fn size(&self) -> u32 {
        self.links.len() as u32
    }

    /// Messages up to this many bytes go eagerly.
    pub fn eager_limit(&self) -> usize {
        self.eager_limit
    }

    /// Sets the eager limit (capped so that an eager frame fits every link).
    pub fn set_eager_limit(&mut self, n: usize) {
        let max = self.links.iter().flatten().map(|l| l.max_frame()).min().unwrap_or(usize::MAX);
        self.eager_limit = n.min(max.saturating_sub(HDR));
        self.reset_credit();
    }

    fn add(&mut self, kind: Kind) -> ReqId {
        let id = self.next_id;
        self.next_id += 1;
        self.reqs.insert(id, Req { kind, done: false, status: Status::default() });
        id
    }

    fn req(&mut self, id: ReqId) -> Result<&mut Req, EngineError> {
        self.reqs.get_mut(&id).ok_or(EngineError::NoRequest(id))
    }

    /// Starts a send of `data` to world rank `dest`; `sync` for `MPI_Ssend`.
    pub fn isend(&mut self, dest: u32, ctx: u32, tag: i32, data: SendBuf, sync: bool) -> Result<ReqId, EngineError> {
        if dest >= self.size() {
            return Err(EngineError::NoRank(dest));
        }
        let len = data.len();
        let id = self.add(Kind::Send { dest, data, waiting: sync, cancelling: None, wire: 0 });
        if dest == self.me {
            // To ourselves: delivered as it arrives, whatever its size.
            let bytes = match &self.req(id)?.kind {
                Kind::Send { data, .. } => data.bytes(0, len).to_vec(),
                Kind::Recv { .. } => unreachable!("just added as a send"),
            };
            self.arrive_eager(self.me, ctx, tag, bytes, sync.then_some(id), id)?;
            if !sync {
                self.finish_send(id);
            }
            return Ok(id);
        }
        let small = len <= self.eager_limit;
        let credit = &mut self.credit[dest as usize];
        let eager = small && *credit >= cost(len);
        if eager {
            *credit -= cost(len);
        } else if small {
            self.stats.no_credit += 1;
        }
        if eager {
            let mut f = Vec::with_capacity(HDR + len);
            if !sync && ctx < CTX8_LIMIT {
                f.extend_from_slice(&short_header(ctx, tag));
                self.short_sent[dest as usize] += 1;
                let n = self.short_sent[dest as usize];
                if let Kind::Send { wire, .. } = &mut self.req(id)?.kind {
                    *wire = SHORT_ID | n;
                }
            } else {
                let flags = if sync { FLAG_SYNC } else { 0 };
                f.extend_from_slice(&header(EAGER, flags, ctx, tag, len as u64, id, 0));
            }
            if let Kind::Send { data, .. } = &self.req(id)?.kind {
                f.extend_from_slice(data.bytes(0, len));
            }
            self.out[dest as usize].push_back(Out::Frame(f));
            self.stats.eager += 1;
            self.stats.bytes_out += len as u64;
            if !sync {
                // The bytes are copied: the buffer is free.
                self.finish_send(id);
            }
        } else {
            self.out[dest as usize].push_back(Out::Frame(header(RTS, 0, ctx, tag, len as u64, id, 0).to_vec()));
            if let Kind::Send { waiting, .. } = &mut self.req(id)?.kind {
                *waiting = true;
            }
            self.stats.rendezvous += 1;
        }
        self.flush(dest as usize)?;
        Ok(id)
    }

    fn finish_send(&mut self, id: ReqId) {
        if let Some(r) = self.reqs.get_mut(&id) {
            r.done = true;
            if let Kind::Send { data, .. } = &mut r.kind {
                // Nothing of the caller's is kept.
                *data = SendBuf::Owned(Vec::new());
            }
        }
    }

    /// Posts a receive.
    pub fn irecv(&mut self, pattern: Pattern, into: RecvBuf) -> Result<ReqId, EngineError> {
        let id =
            self.add(Kind::Recv { pattern, into, total: 0, got: 0, packed: Vec::new(), posted: false, direct: None });
        if let Some(i) = self.unexpected.iter().position(|u| pattern.takes(u.ctx, u.src, u.tag)) {
            let u = self.unexpected.remove(i).expect("position is in range");
            self.deliver(id, u)?;
        } else {
            if let Kind::Recv { posted, .. } = &mut self.req(id)?.kind {
                *posted = true;
            }
            self.posted.push_back(id);
        }
        Ok(id)
    }

    /// Receives a message a matched probe took (`MPI_Mrecv`).
    pub fn imrecv(&mut self, m: Matched, into: RecvBuf) -> Result<ReqId, EngineError> {
        let pattern = Pattern { ctx: m.0.ctx, src: Some(m.0.src), tag: Some(m.0.tag) };
        let id =
            self.add(Kind::Recv { pattern, into, total: 0, got: 0, packed: Vec::new(), posted: false, direct: None });
        self.deliver(id, m.0)?;
        Ok(id)
    }

    /// Matches receive `id` with message `u`.
    fn deliver(&mut self, id: ReqId, u: Unexpected) -> Result<(), EngineError> {
        let (src, tag, len) = (u.src, u.tag, u.len);
        match u.kind {
            Arrived::Eager { data, sync, .. } => {
                self.consumed(src, len)?;
                self.write_into(id, 0, &data, len)?;
                self.complete_recv(id, src, tag, len);
                if let Some(sreq) = sync {
                    self.ack(src, sreq)?;
                }
            }
            Arrived::Rts { sreq } => {
                let d = self.direct.as_deref_mut();
                let r = self.reqs.get_mut(&id).ok_or(EngineError::NoRequest(id))?;
                r.status.source = src;
                r.status.tag = tag;
                let mut landing = None;
                if let Kind::Recv { total, into, direct, .. } = &mut r.kind {
                    *total = len;
                    // The whole message into a posted buffer in landing memory.
                    if let (RecvBuf::Contig(Posted { ptr, cap }), Some(d)) = (*into, d) {
                        landing = (len > 0 && len <= cap).then(|| d.landing(src, ptr, len)).flatten();
                        if landing.is_some() {
                            *direct = Some((sreq, d.losses(false)));
                        }
                    }
                }
                // The credit owed to the sender goes with the answer.
                let owed = std::mem::take(&mut self.owed[src as usize]);
                let mut cts = header(CTS, 0, 0, 0, owed as u64, sreq, id);
                if let Some(off) = landing {
                    cts[1] = FLAG_DIRECT;
                    cts[8..16].copy_from_slice(&off.to_ne_bytes());
                }
                self.out[src as usize].push_back(Out::Frame(cts.to_vec()));
                self.flush(src as usize)?;
            }
        }
        Ok(())
    }

    /// An eager message of `len` bytes from `src` left the unexpected
    /// state (matched, or cancelled): its credit is owed to `src`, and
    /// given back once a quarter of the limit is.
    fn consumed(&mut self, src: u32, len: usize) -> Result<(), EngineError> {
        if src == self.me {
            return Ok(());
        }
        let p = src as usize;
        self.unexpected_bytes = self.unexpected_bytes.saturating_sub(cost(len));
        self.owed[p] += cost(len);
        if self.owed[p] >= self.credit_limit() / 4 {
            let owed = std::mem::take(&mut self.owed[p]);
            self.out[p].push_back(Out::Frame(header(CREDIT, 0, 0, 0, 0, owed as u64, 0).to_vec()));
            self.flush(p)?;
        }
        Ok(())
    }

    /// Credit `n` given back by rank `from`.
    fn credit_back(&mut self, from: u32, n: u64) -> Result<(), EngineError> {
        let limit = self.credit_limit();
        let c = &mut self.credit[from as usize];
        match usize::try_from(n).ok().and_then(|n| c.checked_add(n)).filter(|&t| t <= limit) {
            Some(t) => {
                *c = t;
                Ok(())
            }
            None => Err(EngineError::Protocol {
                from,
                what: format!("{n} bytes of credit given back, with {c} of {limit} still held here"),
            }),
        }
    }

    fn ack(&mut self, src: u32, sreq: u64) -> Result<(), EngineError> {
        if src == self.me {
            self.finish_send(sreq);
            return Ok(());
        }
        self.out[src as usize].push_back(Out::Frame(header(ACK, 0, 0, 0, 0, sreq, 0).to_vec()));
        self.flush(src as usize)
    }

    /// Copies `chunk` to offset `off` of receive `id` (what fits).
    fn write_into(&mut self, id: ReqId, off: usize, chunk: &[u8], total: usize) -> Result<(), EngineError> {
        let r = self.req(id)?;
        let Kind::Recv { into, packed, got, .. } = &mut r.kind else {
            return Err(EngineError::NoRequest(id));
        };
        let cap = into.cap();
        let keep = cap.saturating_sub(off).min(chunk.len());
        match *into {
            RecvBuf::Contig(Posted { ptr, .. }) => {
                if keep > 0 {
                    // SAFETY: the receive buffer holds `cap` bytes at `ptr`
                    // (the caller's promise, kept until the receive
                    // completes); off + keep <= cap.
                    unsafe { std::ptr::copy_nonoverlapping(chunk.as_ptr(), ptr.add(off), keep) };
                }
            }
            RecvBuf::Packed { .. } => {
                if packed.len() < total.min(cap) {
                    packed.resize(total.min(cap), 0);
                }
                packed[off..off + keep].copy_from_slice(&chunk[..keep]);
            }
        }
        *got += chunk.len();
        Ok(())
    }

    /// `n` more bytes of receive `id`'s rendezvous data are in place
    /// (counted by the caller when 0); completes it when all are.
    fn data_landed(&mut self, id: ReqId, n: usize) {
        let Some(Req { kind: Kind::Recv { got, total, .. }, status, .. }) = self.reqs.get_mut(&id) else { return };
        *got += n;
        if *got == *total {
            let (src, tag, total) = (status.source, status.tag, *total);
            self.complete_recv(id, src, tag, total);
        }
    }

    fn complete_recv(&mut self, id: ReqId, src: u32, tag: i32, len: usize) {
        if let Some(r) = self.reqs.get_mut(&id) {
            let cap = match &r.kind {
                Kind::Recv { into, .. } => into.cap(),
                Kind::Send { .. } => 0,
            };
            r.done = true;
            r.status = Status { source: src, tag, bytes: len.min(cap), truncated: len > cap, cancelled: false };
        }
    }

    /// A message that arrived eagerly (or from ourselves).
    fn arrive_eager(
        &mut self,
        src: u32,
        ctx: u32,
        tag: i32,
        data: Vec<u8>,
        sync: Option<u64>,
        sreq: u64,
    ) -> Result<(), EngineError> {
        let len = data.len();
        if src != self.me {
            self.unexpected_bytes += cost(len);
        }
        let u = Unexpected { ctx, src, tag, len, kind: Arrived::Eager { data, sync, sreq } };
        self.arrive(u)?;
        self.stats.unexpected_bytes_peak = self.stats.unexpected_bytes_peak.max(self.unexpected_bytes);
        Ok(())
    }

    fn arrive(&mut self, u: Unexpected) -> Result<(), EngineError> {
        let reqs = &self.reqs;
        let hit = self.posted.iter().position(|id| {
            matches!(reqs.get(id), Some(Req { kind: Kind::Recv { pattern, .. }, .. }) if pattern.takes(u.ctx, u.src, u.tag))
        });
        match hit {
            Some(i) => {
                let id = self.posted.remove(i).expect("position is in range");
                if let Kind::Recv { posted, .. } = &mut self.req(id)?.kind {
                    *posted = false;
                }
                self.deliver(id, u)
            }
            None => {
                self.unexpected.push_back(u);
                self.stats.unexpected_peak = self.stats.unexpected_peak.max(self.unexpected.len());
                Ok(())
            }
        }
    }

    /// Writes what fits of link `p`'s queue.
    fn flush(&mut self, p: usize) -> Result<(), EngineError> {
        let Some(link) = self.links[p].as_ref() else { return Ok(()) };
        while let Some(o) = self.out[p].front_mut() {
            match o {
                Out::Frame(f) => {
                    if link.room()? < f.len() {
                        return Ok(());
                    }
                    link.send(f)?;
                    self.out[p].pop_front();
                }
                Out::Stream { sreq, rreq, off } => {
                    let (sreq, rreq) = (*sreq, *rreq);
                    let Some(Req { kind: Kind::Send { data, .. }, .. }) = self.reqs.get(&sreq) else {
                        return Err(EngineError::NoRequest(sreq));
                    };
                    let total = data.len();
                    let room = link.room()?;
                    let left = total - *off;
                    // Not worth a frame: wait for a useful amount of room.
                    let want = left.min(4096).min(link.max_frame() / 2);
                    if room < HDR + want {
                        return Ok(());
                    }
                    let n = left.min(room - HDR);
                    let t0 = Instant::now();
                    link.send_parts(&[&header(DATA, 0, 0, 0, *off as u64, rreq, 0), data.bytes(*off, n)])?;
                    self.stats.data_out.0 += n as u64;
                    self.stats.data_out.1 += t0.elapsed();
                    self.stats.bytes_out += n as u64;
                    *off += n;
                    if *off == total {
                        self.out[p].pop_front();
                        if let Some(r) = self.reqs.get_mut(&sreq) {
                            r.done = true;
                            if let Kind::Send { data, .. } = &mut r.kind {
                                *data = SendBuf::Owned(Vec::new());
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// One round of progress: writes what fits, reads what arrived.
    /// Returns whether anything moved.
    pub fn progress(&mut self) -> Result<bool, EngineError> {
        let mut moved = self.poll_direct()?;
        for p in 0..self.links.len() {
            if self.links[p].is_none() {
                continue;
            }
            let before = self.out[p].len();
            self.flush_or_part(p)?;
            if self.links[p].is_none() {
                continue;
            }
            moved |= self.out[p].len() != before;
            // A bounded number of frames per link and round, for fairness.
            for _ in 0..64 {
                let Some(link) = self.links[p].as_ref() else { break };
                let n = match link.next_len() {
                    Ok(Some(n)) => n,
                    Ok(None) => break,
                    Err(e) if self.out[p].is_empty() || self.leaving => {
                        // Everything it sent has been read: it finished (or
                        // died); only a request that needs it fails.
                        self.left(p, e);
                        break;
                    }
                    Err(e) => return Err(e.into()),
                };
                if n >= HDR + SPLIT_MIN {
                    // A DATA frame's payload straight into the posted buffer.
                    let mut head = [0u8; HDR];
                    let reqs = &self.reqs;
                    let t0 = Instant::now();
                    let got = link.recv_split(&mut head, &mut |h, rest| data_place(reqs, h, rest))?;
                    if let Some(len) = got {
                        self.stats.data_in.0 += (len - HDR) as u64;
                        self.stats.data_in.1 += t0.elapsed();
                        self.data_landed(word(&head, 24), len - HDR);
                        self.stats.direct += 1;
                        moved = true;
                        continue;
                    }
                }
                let mut buf = std::mem::take(&mut self.scratch);
                if buf.len() < n {
                    buf.resize(n, 0);
                }
                let r =
                    link.recv(&mut buf[..n]).map_err(EngineError::from).and_then(|n| self.frame(p as u32, &buf[..n]));
                self.scratch = buf;
                r?;
                moved = true;
            }
        }
        Ok(moved)
    }

    /// Rank `p` closed its end (`e`): only a request that needs it fails
    /// from now on. While leaving, what was still queued for it goes too.
    fn left(&mut self, p: usize, e: TransportError) {
        self.links[p] = None;
        self.gone[p] = Some(e);
        if self.leaving {
            self.out[p].clear();
        }
    }

    /// The job's last barrier is behind this rank (`MPI_Finalize`): every
    /// rank has entered it, so all the job's messages were sent. Says
    /// goodbye to every rank still there; [`Engine::parted`] says when
    /// this rank may close its channels.
    ///
    /// # Goodbyes
    /// A rank that closes its end can no longer serve anything: a repair
    /// of a frame lost on the way, or a board slot a rank still in the
    /// barrier asks to be stored again (under faults a rank can finish
    /// the barrier while another still waits for a lost store). So a rank
    /// closes only once every other rank has said goodbye, which each says
    /// only past the barrier, and has taken everything sent to it
    /// (goodbye included). Until then it keeps serving. From `leave` on,
    /// a rank that closed is not an error, and what was still queued for
    /// it (credits, reposts) is dropped: it needed nothing more.
    pub fn leave(&mut self) -> Result<(), EngineError> {
        self.leaving = true;
        for p in 0..self.links.len() {
            if self.links[p].is_some() {
                self.out[p].push_back(Out::Frame(header(BYE, 0, 0, 0, 0, 0, 0).to_vec()));
                self.flush_or_part(p)?;
            }
        }
        Ok(())
    }

    /// [`Engine::flush`]; once leaving, a rank that has gone is marked
    /// left ([`Engine::left`]) instead of failing the flush.
    fn flush_or_part(&mut self, p: usize) -> Result<(), EngineError> {
        match self.flush(p) {
            Err(EngineError::Link(e @ TransportError::PeerGone(..))) if self.leaving => {
                self.left(p, e);
                Ok(())
            }
            r => r,
        }
    }

    /// Whether a leaving rank still waits for rank `p`: it is there and
    /// has not said goodbye or not taken everything we sent.
    fn waits_for(&self, p: usize) -> bool {
        self.links[p].as_deref().is_some_and(|l| !(self.bye[p] && self.out[p].is_empty() && l.delivered()))
    }

    /// Whether this rank, leaving, may close its channels: every other
    /// rank has gone, or has said goodbye and taken everything we sent.
    pub fn parted(&self) -> bool {
        self.leaving && !(0..self.links.len()).any(|p| self.waits_for(p))
    }

    /// The ranks still there that a leaving rank waits for (see
    /// [`Engine::parted`]).
    pub fn parting_from(&self) -> Vec<u32> {
        (0..self.links.len()).filter(|&p| self.waits_for(p)).map(|p| p as u32).collect()
    }

    /// Moves zero-copy sends whose DMA finished: `DONE` when it was sent
    /// whole, else the message goes as `DATA` (whatever was lost on the way
    /// shows in the receiver's loss stamp). Returns whether anything moved.
    fn poll_direct(&mut self) -> Result<bool, EngineError> {
        let Some(d) = self.direct.as_deref_mut() else { return Ok(false) };
        if self.direct_sends.iter().all(|z| z.token.is_none()) {
            return Ok(false);
        }
        // (index, sent whole)
        let mut ended = Vec::new();
        for (i, z) in self.direct_sends.iter().enumerate() {
            if let Some(ok) = z.token.and_then(|t| d.poll(t)) {
                ended.push((i, ok));
            }
        }
        for &(i, good) in ended.iter().rev() {
            let (sreq, rreq, to) = (self.direct_sends[i].sreq, self.direct_sends[i].rreq, self.direct_sends[i].to);
            if good {
                let len = match self.reqs.get(&sreq) {
                    Some(Req { kind: Kind::Send { data, .. }, .. }) => data.len(),
                    _ => 0,
                };
                self.direct_sends[i].token = None;
                self.out[to as usize].push_back(Out::Frame(header(DONE, 0, 0, 0, len as u64, sreq, rreq).to_vec()));
                self.stats.zero_copy.0 += 1;
                self.stats.zero_copy.1 += len as u64;
                self.stats.bytes_out += len as u64;
                self.flush(to as usize)?;
            } else {
                self.direct_sends.remove(i);
                self.stream_instead(to, sreq, rreq)?;
            }
        }
        Ok(!ended.is_empty())
    }

    /// A zero-copy offer for send `sreq` that ends as `DATA` frames to
    /// `to`'s receive `rreq`, from the first byte.
    fn stream_instead(&mut self, to: u32, sreq: ReqId, rreq: u64) -> Result<(), EngineError> {
        self.stats.zero_copy_streamed += 1;
        self.out[to as usize].push_back(Out::Stream { sreq, rreq, off: 0 });
        self.flush(to as usize)
    }

    /// A `CTS` for send `sreq` of ours, to `from`'s receive `rreq`; with
    /// `landing`, where the posted buffer is in `from`'s landing memory.
    fn clear_to_send(&mut self, from: u32, sreq: u64, rreq: u64, landing: Option<u64>) -> Result<(), EngineError> {
        let resend = self.direct_sends.iter().position(|z| z.sreq == sreq && z.to == from);
        match self.reqs.get_mut(&sreq) {
            Some(Req { kind: Kind::Send { dest, waiting, .. }, .. }) if *dest == from && *waiting => {
                *waiting = false;
            }
            // Asked again after a zero-copy transfer the receiver could
            // not trust: the message goes as DATA.
            Some(Req { kind: Kind::Send { dest, .. }, .. }) if *dest == from && landing.is_none() => {
                let Some(i) = resend else {
                    return Err(EngineError::Protocol { from, what: format!("clear-to-send for unknown send {sreq}") });
                };
                self.direct_sends.remove(i);
                return self.stream_instead(from, sreq, rreq);
            }
            _ => return Err(EngineError::Protocol { from, what: format!("clear-to-send for unknown send {sreq}") }),
        }
        if let (Some(off), Some(d)) = (landing, self.direct.as_deref_mut()) {
            if let Some(Req { kind: Kind::Send { data: SendBuf::Borrowed(Lent { ptr, len }), .. }, .. }) =
                self.reqs.get(&sreq)
            {
                if let Some(token) = d.start(from, off, *ptr, *len) {
                    self.direct_sends.push(DirectSend { sreq, rreq, to: from, token: Some(token) });
                    return Ok(());
                }
            }
            return self.stream_instead(from, sreq, rreq);
        }
        self.out[from as usize].push_back(Out::Stream { sreq, rreq, off: 0 });
        self.flush(from as usize)
    }

    fn frame(&mut self, from: u32, f: &[u8]) -> Result<(), EngineError> {
        let bad = |what: String| EngineError::Protocol { from, what };
        if f.len() >= HDR8 && f[0] == EAGER8 {
            let ctx = u32::from_le_bytes([f[1], f[2], f[3], 0]);
            let tag = i32::from_ne_bytes([f[4], f[5], f[6], f[7]]);
            // Known for a cancel by its number from this sender.
            self.short_seen[from as usize] += 1;
            let wire = SHORT_ID | self.short_seen[from as usize];
            return self.arrive_eager(from, ctx, tag, f[HDR8..].to_vec(), None, wire);
        }
        if f.len() < HDR {
            return Err(bad(format!("a frame of {} bytes", f.len())));
        }
        let (kind, flags) = (f[0], f[1]);
        let ctx = u32::from_ne_bytes([f[4], f[5], f[6], f[7]]);
        let tag = i32::from_ne_bytes([f[8], f[9], f[10], f[11]]);
        let (len, a, b) = (word(f, 16), word(f, 24), word(f, 32));
        let payload = &f[HDR..];
        match kind {
            EAGER => {
                if payload.len() as u64 != len {
                    return Err(bad(format!("eager frame says {len} bytes, carries {}", payload.len())));
                }
                let sync = (flags & FLAG_SYNC != 0).then_some(a);
                self.arrive_eager(from, ctx, tag, payload.to_vec(), sync, a)
            }
            RTS => self.arrive(Unexpected { ctx, src: from, tag, len: len as usize, kind: Arrived::Rts { sreq: a } }),
            CTS => {
                if len > 0 {
                    self.credit_back(from, len)?;
                }
                let landing = (flags & FLAG_DIRECT != 0).then(|| word(f, 8));
                self.clear_to_send(from, a, b, landing)
            }
            DONE => {
                let ours = match self.reqs.get_mut(&b) {
                    Some(Req { kind: Kind::Recv { total, got, direct, .. }, done: false, .. })
                        if *got == 0 && *total as u64 == len && direct.is_some_and(|(s, _)| s == a) =>
                    {
                        direct.take()
                    }
                    _ => None,
                };
                let Some((_, before)) = ours else {
                    return Err(bad(format!("zero-copy data for receive {b}, which expects none")));
                };
                if self.direct.as_deref_mut().is_some_and(|d| d.losses(true) == before) {
                    self.stats.zero_copy_in += 1;
                    self.data_landed(b, len as usize);
                    self.out[from as usize].push_back(Out::Frame(header(TAKEN, 0, 0, 0, 0, a, 0).to_vec()));
                } else {
                    // This adapter counted an error or saw a node leave or
                    // join since the offer: the bytes may be incomplete.
                    // Again, as DATA.
                    self.out[from as usize].push_back(Out::Frame(header(CTS, 0, 0, 0, 0, a, b).to_vec()));
                }
                self.flush(from as usize)
            }
            TAKEN => match self.direct_sends.iter().position(|z| z.sreq == a && z.to == from && z.token.is_none()) {
                Some(i) => {
                    self.direct_sends.remove(i);
                    self.finish_send(a);
                    Ok(())
                }
                None => Err(bad(format!("zero-copy acknowledgement of unknown send {a}"))),
            },
            DATA => {
                let total = match self.reqs.get(&a) {
                    Some(Req { kind: Kind::Recv { total, got, .. }, done: false, .. })
                        if (*got as u64) == len && *got + payload.len() <= *total =>
                    {
                        *total
                    }
                    _ => return Err(bad(format!("data for unknown receive {a} at offset {len}"))),
                };
                self.write_into(a, len as usize, payload, total)?;
                self.data_landed(a, 0);
                Ok(())
            }
            ACK => match self.reqs.get(&a) {
                Some(Req { kind: Kind::Send { dest, .. }, .. }) if *dest == from => {
                    self.finish_send(a);
                    Ok(())
                }
                _ => Err(bad(format!("acknowledgement of unknown send {a}"))),
            },
            CANCEL => {
                // `b`: the message's number when it came short, else 0.
                let key = if b != 0 { b } else { a };
                let taken = match self.unexpected.iter().position(|u| u.src == from && u.sent_by(key)) {
                    Some(i) => {
                        let u = self.unexpected.remove(i).expect("position is in range");
                        if let Arrived::Eager { .. } = u.kind {
                            self.consumed(from, u.len)?;
                        }
                        true
                    }
                    None => false,
                };
                self.out[from as usize].push_back(Out::Frame(header(CANCELLED, 0, 0, 0, 0, a, taken as u64).to_vec()));
                self.flush(from as usize)
            }
            CANCELLED => {
                // A send finished meanwhile (its data went or its ACK came,
                // and the caller took it) needs nothing.
                let Some(Req { kind: Kind::Send { dest, cancelling, .. }, done, .. }) = self.reqs.get_mut(&a) else {
                    return Ok(());
                };
                let Some(was_done) = cancelling.take().filter(|_| *dest == from) else {
                    return Err(bad(format!("a cancel answer for send {a}, which asked rank {from} none")));
                };
                if b == 1 {
                    self.cancelled_send(a);
                } else if was_done {
                    // Refused: complete again, as before the cancel.
                    *done = true;
                }
                Ok(())
            }
            CREDIT => self.credit_back(from, a),
            REPOST => {
                self.repost_asked = true;
                Ok(())
            }
            BYE => {
                self.bye[from as usize] = true;
                Ok(())
            }
            RMA => {
                if payload.len() as u64 != len {
                    return Err(bad(format!("one-sided frame says {len} bytes, carries {}", payload.len())));
                }
                self.rma.arrive(from, tag as u8, ctx, a, b, payload)?;
                self.send_rma()
            }
            k => Err(bad(format!("unknown frame kind {k}"))),
        }
    }

    /// Whether request `id` is complete (after one round of progress).
    pub fn test(&mut self, id: ReqId) -> Result<bool, EngineError> {
        if !self.req(id)?.done {
            self.progress()?;
        }
        Ok(self.req(id)?.done)
    }

    /// Whether request `id` is complete, without progress.
    pub fn is_done(&self, id: ReqId) -> Result<bool, EngineError> {
        self.reqs.get(&id).map(|r| r.done).ok_or(EngineError::NoRequest(id))
    }

    /// Waits until request `id` completes.
    pub fn wait(&mut self, id: ReqId) -> Result<(), EngineError> {
        let mut idle = 0u32;
        while !self.req(id)?.done {
            if self.progress()? {
                idle = 0;
            } else {
                self.check_needed(id)?;
                backoff(&mut idle);
            }
        }
        Ok(())
    }

    /// Why rank `p` has gone, if it has (it finished, or died).
    pub fn peer_gone(&self, p: u32) -> Option<EngineError> {
        self.gone.get(p as usize).cloned().flatten().map(EngineError::from)
    }

    /// An error if request `id` can no longer complete because a rank it
    /// needs has gone.
    pub fn check_needed(&self, id: ReqId) -> Result<(), EngineError> {
        let Some(r) = self.reqs.get(&id) else { return Err(EngineError::NoRequest(id)) };
        if r.done {
            return Ok(());
        }
        let needs: Vec<usize> = match &r.kind {
            Kind::Send { dest, .. } => vec![*dest as usize],
            Kind::Recv { posted: false, .. } => vec![r.status.source as usize],
            Kind::Recv { pattern, .. } => match pattern.src {
                Some(s) => vec![s as usize],
                // Any source: stuck only when every other rank has gone.
                None => {
                    let others = (0..self.links.len()).filter(|&p| p != self.me as usize);
                    if others.clone().all(|p| self.gone[p].is_some()) {
                        others.collect()
                    } else {
                        Vec::new()
                    }
                }
            },
        };
        match needs.iter().find_map(|&p| self.gone.get(p).cloned().flatten()) {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// Frees a completed request and returns its status (and, for a
    /// packed receive, its bytes).
    pub fn finish(&mut self, id: ReqId) -> Result<(Status, Vec<u8>), EngineError> {
        let r = self.reqs.remove(&id).ok_or(EngineError::NoRequest(id))?;
        let packed = match r.kind {
            Kind::Recv { packed, .. } => packed,
            Kind::Send { .. } => Vec::new(),
        };
        Ok((r.status, packed))
    }

    /// The status of a completed request, leaving it in place.
    pub fn status(&self, id: ReqId) -> Result<Status, EngineError> {
        self.reqs.get(&id).map(|r| r.status.clone()).ok_or(EngineError::NoRequest(id))
    }

    /// Takes the bytes of a completed packed receive.
    pub fn take_packed(&mut self, id: ReqId) -> Result<Vec<u8>, EngineError> {
        match &mut self.req(id)?.kind {
            Kind::Recv { packed, .. } => Ok(std::mem::take(packed)),
            Kind::Send { .. } => Ok(Vec::new()),
        }
    }

    /// Cancels a receive not yet matched (a matched one, or a send,
    /// completes normally: MPI lets a cancel fail). Returns whether it was
    /// cancelled.
    pub fn cancel(&mut self, id: ReqId) -> Result<bool, EngineError> {
        let Some(i) = self.posted.iter().position(|&p| p == id) else {
            // A send: its message may still sit unmatched at the receiver
            // (an eager one completed here at once). Ask the receiver; the
            // request is not complete until the answer comes.
            let me = self.me;
            let r = self.req(id)?;
            let Kind::Send { dest, cancelling: None, wire, .. } = r.kind else { return Ok(false) };
            if r.status.cancelled {
                return Ok(false);
            }
            if dest == me {
                if let Some(i) = self.unexpected.iter().position(|u| u.src == me && u.sent_by(id)) {
                    self.unexpected.remove(i);
                    self.cancelled_send(id);
                }
                return Ok(false);
            }
            // A complete send is held incomplete until the answer.
            let was_done = std::mem::replace(&mut r.done, false);
            if let Kind::Send { cancelling, .. } = &mut r.kind {
                *cancelling = Some(was_done);
            }
            self.out[dest as usize].push_back(Out::Frame(header(CANCEL, 0, 0, 0, 0, id, wire).to_vec()));
            self.flush(dest as usize)?;
            return Ok(false);
        };
        self.posted.remove(i);
        let r = self.req(id)?;
        r.done = true;
        r.status.cancelled = true;
        Ok(true)
    }

    /// Send `id` was taken back before its receiver matched it.
    fn cancelled_send(&mut self, id: ReqId) {
        self.finish_send(id);
        if let Some(r) = self.reqs.get_mut(&id) {
            r.status.cancelled = true;
            if let Kind::Send { waiting, .. } = &mut r.kind {
                *waiting = false;
            }
        }
    }

    /// Looks for a matching message without receiving it (`MPI_Iprobe`).
    pub fn iprobe(&mut self, pattern: Pattern) -> Result<Option<Status>, EngineError> {
        self.progress()?;
        Ok(self.unexpected.iter().find(|u| pattern.takes(u.ctx, u.src, u.tag)).map(|u| Status {
            source: u.src,
            tag: u.tag,
            bytes: u.len,
            ..Status::default()
        }))
    }

    /// Takes a matching message out of the queue (`MPI_Improbe`).
    pub fn improbe(&mut self, pattern: Pattern) -> Result<Option<Matched>, EngineError> {
        self.progress()?;
        Ok(self
            .unexpected
            .iter()
            .position(|u| pattern.takes(u.ctx, u.src, u.tag))
            .map(|i| Matched(self.unexpected.remove(i).expect("position is in range"))))
    }

    /// Sends whatever is still queued, waiting for room (before finalize).
    pub fn drain(&mut self) -> Result<(), EngineError> {
        let mut idle = 0u32;
        while self.out.iter().zip(&self.links).any(|(q, l)| l.is_some() && !q.is_empty())
            || self.direct_sends.iter().any(|z| z.token.is_some())
        {
            if self.progress()? {
                idle = 0;
            } else {
                backoff(&mut idle);
            }
        }
        Ok(())
    }
}

/// Idle polls a waiting rank spins through before it yields. With one CPU
/// the rank it waits for may be on the same CPU (two ranks in one guest of
/// one vCPU, the default), and every spin only delays it: a poll costs a
/// few µs under TCG, so 63 of them were most of an 8-byte message's time
/// inside one guest. A yield with nothing else to run costs ~8 µs.
fn spin_rounds() -> u32 {
    static ROUNDS: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *ROUNDS.get_or_init(|| match std::thread::available_parallelism() {
        Ok(n) if n.get() == 1 => 1,
        _ => 64,
    })
}

/// Idle polls that yield before a waiting rank starts to sleep
/// (`MCMPI_YIELDS`).
fn yield_rounds() -> u32 {
    static ROUNDS: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *ROUNDS.get_or_init(|| std::env::var("MCMPI_YIELDS").ok().and_then(|v| v.parse().ok()).unwrap_or(2048))
}

/// Idle polls that yield before a rank waiting on the job's board in a
/// blocking collective starts to sleep: `MCMPI_BOARD_YIELDS`, else 16 in
/// a guest whose host has fewer cores than its cluster's vCPUs
/// (`mc.oversubscribed=1` on the kernel command line, from `mc-cluster`),
/// else as for any wait. Every rank of the job may be waiting on the
/// board at once, and a rank that yields keeps its vCPU running: on an
/// oversubscribed host the rank it waits for may then get no core. 4
/// guests on 2 cores, median of 300 barriers: 2048 yields 1.8 ms, 16
/// 0.53 ms; 2 guests on 2 cores: 8-byte broadcast 46-65 us with 2048,
/// 127-147 us with 16.
fn board_yield_rounds() -> u32 {
    static ROUNDS: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *ROUNDS.get_or_init(|| {
        let oversubscribed = || {
            std::fs::read_to_string("/proc/cmdline")
                .is_ok_and(|c| c.split_whitespace().any(|w| w == "mc.oversubscribed=1"))
        };
        match std::env::var("MCMPI_BOARD_YIELDS").ok().and_then(|v| v.parse().ok()) {
            Some(n) => n,
            None if oversubscribed() => 16,
            None => yield_rounds(),
        }
    })
}

/// Spins, then yields, then sleeps briefly: a waiting rank must not keep
/// a guest's only vCPU from the rank it waits for.
pub fn backoff(idle: &mut u32) {
    backoff_until(idle, yield_rounds())
}

/// [`backoff`] for a rank waiting in a blocking collective on the job's
/// board ([`board_yield_rounds`]).
pub fn board_backoff(idle: &mut u32) {
    backoff_until(idle, board_yield_rounds())
}

fn backoff_until(idle: &mut u32, yields: u32) {
    *idle = idle.saturating_add(1);
    if *idle < spin_rounds() {
        std::hint::spin_loop();
    } else if *idle < yields {
        std::thread::yield_now();
    } else {
        std::thread::sleep(nap(*idle - yields));
    }
}

/// The sleep of a waiting rank's `n`th nap: 50 µs, doubled every
/// [`NAPS_PER_STEP`] naps up to 800 µs. A TCG guest pays ~0.4 ms of its
/// vCPU for each timer wake-up, so a rank that waits long (for a slow
/// rank, or in a barrier while two others exchange) must not keep its
/// host core busy waking up.
fn nap(n: u32) -> std::time::Duration {
    std::time::Duration::from_micros(50 << (n / NAPS_PER_STEP).min(4))
}

/// Naps between two doublings of a waiting rank's sleep ([`nap`]).
const NAPS_PER_STEP: u32 = 64;

/// Engines joined in-process, for the unit tests of the engine and of
/// the layers on it.
#[cfg(test)]
pub(crate) mod testkit {
    use super::*;
    use crate::transport::pipe;

    /// `n` engines joined by pipes of `cap` bytes.
    #[allow(clippy::needless_range_loop)]
    pub(crate) fn engines(n: usize, cap: usize) -> Vec<Engine> {
        let mut links: Vec<Vec<Option<Box<dyn Link>>>> = (0..n).map(|_| (0..n).map(|_| None).collect()).collect();
        for i in 0..n {
            for j in i + 1..n {
                let (a, b) = pipe(cap);
                links[i][j] = Some(Box::new(a));
                links[j][i] = Some(Box::new(b));
            }
        }
        links.into_iter().enumerate().map(|(i, l)| Engine::new(i as u32, l)).collect()
    }

    /// Progress on every engine until `done` or 100,000 rounds.
    pub(crate) fn run(es: &mut [Engine], mut done: impl FnMut(&mut [Engine]) -> bool) {
        for _ in 0..100_000 {
            if done(es) {
                return;
            }
            for e in es.iter_mut() {
                e.progress().unwrap();
            }
        }
        panic!("no completion after 100,000 rounds");
    }
}

#[cfg(test)]
mod tests {
    use super::testkit::{engines, run};
    use super::*;

    fn any(ctx: u32) -> Pattern {
        Pattern { ctx, src: None, tag: None }
    }

    fn recv_vec(e: &mut Engine, p: Pattern, cap: usize) -> ReqId {
        e.irecv(p, RecvBuf::Packed { cap }).unwrap()
    }

    #[test]
    fn eager_and_rendezvous_arrive_intact_posted_or_not() {
        let mut es = engines(2, 4096);
        for len in [0usize, 1, 100, 1000, 1500, 5000, 100_000] {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
            // Unexpected first, then posted first.
            for posted_first in [false, true] {
                let mut r = 0;
                if posted_first {
                    r = recv_vec(&mut es[1], any(1), len);
                }
                let s = es[0].isend(1, 1, 5, SendBuf::Owned(data.clone()), false).unwrap();
                if !posted_first {
                    run(&mut es, |es| es[1].iprobe(any(1)).unwrap().is_some());
                    r = recv_vec(&mut es[1], any(1), len);
                }
                run(&mut es, |es| es[0].is_done(s).unwrap() && es[1].is_done(r).unwrap());
                let (st, got) = es[1].finish(r).unwrap();
                assert_eq!((st.source, st.tag, st.bytes, st.truncated), (0, 5, len, false));
                assert!(got == data, "{len} bytes, posted first {posted_first}: contents differ");
                es[0].finish(s).unwrap();
            }
        }
        assert!(es[0].stats.rendezvous > 0 && es[0].stats.eager > 0);
    }

    /// A sender that floods a rank which receives nothing: what waits
    /// unmatched there never passes the sender's credit, the messages past
    /// it go by rendezvous, and when the receives come (in reverse order)
    /// every message arrives intact and the credit comes back, so eager
    /// sends resume.
    #[test]
    fn credit_bounds_what_waits_unmatched_at_a_receiver() {
        let mut es = engines(3, 64 << 10);
        for e in es.iter_mut() {
            e.set_unexpected_limit(80 << 10);
        }
        let limit = es[1].credit_limit();
        assert_eq!(limit, 40 << 10, "80 KiB over the 2 other ranks");
        let msg = |from: usize, i: usize| -> Vec<u8> { (0..1000 + i).map(|j| (j * 31 + i * 7 + from) as u8).collect() };
        // Ranks 0 and 2 each send 200 messages of ~1 KiB, tags 0..200,
        // standard and synchronous mixed.
        let mut sends = Vec::new();
        for i in 0..200 {
            for from in [0, 2] {
                let s = es[from].isend(1, 1, i as i32, SendBuf::Owned(msg(from, i)), i % 7 == 3).unwrap();
                sends.push((from, s));
            }
        }
        // Let everything that can move, move.
        for _ in 0..2000 {
            for e in es.iter_mut() {
                e.progress().unwrap();
            }
        }
        let held = es[1].unexpected_bytes();
        assert!(held <= 2 * limit, "{held} bytes wait unmatched at rank 1, more than the 2 senders' credit");
        assert!(held >= limit, "{held} bytes: the senders' credit was not used");
        assert!(es[0].stats.no_credit > 100 && es[2].stats.no_credit > 100, "past the credit, rendezvous");
        assert_eq!(es[1].unexpected.len(), 400, "every message is known at rank 1, most by envelope only");
        // Receives in reverse tag order, from each sender.
        let mut recvs = Vec::new();
        for i in (0..200).rev() {
            for from in [0u32, 2] {
                let p = Pattern { ctx: 1, src: Some(from), tag: Some(i) };
                recvs.push((from, i, recv_vec(&mut es[1], p, 2000)));
            }
        }
        run(&mut es, |es| {
            recvs.iter().all(|&(_, _, r)| es[1].is_done(r).unwrap())
                && sends.iter().all(|&(f, s)| es[f].is_done(s).unwrap())
        });
        for (from, i, r) in recvs {
            let (st, got) = es[1].finish(r).unwrap();
            assert_eq!((st.source, st.tag), (from, i));
            assert!(got == msg(from as usize, i as usize), "message {i} from {from} differs");
        }
        assert_eq!(es[1].unexpected_bytes(), 0);
        assert!(es[1].stats.unexpected_bytes_peak <= 2 * limit, "peak {}", es[1].stats.unexpected_bytes_peak);
        // The credit came back: the next message is eager again.
        for _ in 0..100 {
            for e in es.iter_mut() {
                e.progress().unwrap();
            }
        }
        assert!(es[0].credit[1] >= limit - limit / 4, "credit {} of {limit} back", es[0].credit[1]);
        let (eager, r) = (es[0].stats.eager, es[0].stats.rendezvous);
        let s = es[0].isend(1, 1, 9, SendBuf::Owned(vec![5; 1000]), false).unwrap();
        assert_eq!((es[0].stats.eager, es[0].stats.rendezvous), (eager + 1, r));
        es[0].finish(s).unwrap();
    }

    /// Credit given back that was never lent is a protocol error, not a
    /// larger allowance.
    /// A waiting rank naps 50 µs at first and at most 800 µs.
    #[test]
    fn naps_lengthen_while_a_rank_waits() {
        let us = |n| nap(n).as_micros();
        assert_eq!((us(0), us(NAPS_PER_STEP - 1)), (50, 50));
        assert_eq!((us(NAPS_PER_STEP), us(2 * NAPS_PER_STEP)), (100, 200));
        assert_eq!((us(4 * NAPS_PER_STEP), us(u32::MAX)), (800, 800));
    }

    #[test]
    fn credit_never_lent_is_refused() {
        let mut es = engines(2, 64 << 10);
        let f = header(CREDIT, 0, 0, 0, 0, 64, 0);
        let e = es[0].frame(1, &f).unwrap_err();
        assert!(matches!(&e, EngineError::Protocol { from: 1, what } if what.contains("credit")), "{e}");
    }

    /// The eager limit is a quarter of the smallest ring's largest frame, from 16 KiB to
    /// 256 KiB, and always leaves an eager frame room in the ring.
    #[test]
    fn the_eager_limit_follows_the_smallest_ring() {
        let limit = |cap: usize| engines(2, cap)[0].eager_limit();
        // A pipe's largest frame is its ring less 16 bytes, as UMP's.
        assert_eq!(limit(1 << 20), ((1 << 20) - 16) / 4);
        assert_eq!(limit(4 << 20), 256 << 10, "never above 256 KiB");
        assert_eq!(limit(256 << 10), ((256 << 10) - 16) / 4);
        assert_eq!(limit(64 << 10), 16 << 10, "never below 16 KiB while the ring allows");
        assert_eq!(limit(4096), (4096 - 16 - HDR) / 2, "half a small ring");
    }

    /// Rendezvous data for a contiguous posted buffer is read straight
    /// into it; a buffer too short for the message (truncation) takes the
    /// frames the ordinary way. Both arrive intact.
    #[test]
    fn rendezvous_data_lands_straight_in_a_contiguous_buffer() {
        let mut es = engines(2, 64 << 10);
        let len = 300_000;
        let data: Vec<u8> = (0..len).map(|i| (i * 13 + 1) as u8).collect();
        let mut direct = Vec::new();
        for cap in [len, len - 5000] {
            let mut buf = vec![0u8; cap];
            let before = es[1].stats.direct;
            // SAFETY: `buf` outlives the receive (run until it is done).
            let r = es[1].irecv(any(1), RecvBuf::Contig(unsafe { Posted::new(buf.as_mut_ptr(), cap) })).unwrap();
            let s = es[0].isend(1, 1, 9, SendBuf::Owned(data.clone()), false).unwrap();
            run(&mut es, |es| es[0].is_done(s).unwrap() && es[1].is_done(r).unwrap());
            let (st, _) = es[1].finish(r).unwrap();
            es[0].finish(s).unwrap();
            assert_eq!((st.bytes, st.truncated), (cap, cap < len));
            assert!(buf[..] == data[..cap], "cap {cap}: contents differ");
            direct.push(es[1].stats.direct - before);
        }
        // 300,000 bytes in frames of under 64 KiB: at least 5, all straight
        // in; with the short buffer, the one across its end is not.
        assert!(direct[0] >= 5, "only {} frames straight into the buffer", direct[0]);
        assert_eq!(es[0].stats.data_out.0, 2 * len as u64, "every DATA byte written is counted");
        assert!(es[1].stats.data_in.0 > len as u64 && es[1].stats.data_in.0 < 2 * len as u64);
        assert!(direct[1] < direct[0], "{direct:?}: the short buffer's last frame went straight in");
    }

    /// A standard eager send carries the one-word envelope (8 bytes of
    /// data make a 16-byte frame); a synchronous one, or one on a context
    /// the short envelope cannot carry, the full header. Both arrive with
    /// their context, tag (negative ones too) and bytes.
    #[test]
    fn standard_small_sends_have_the_one_word_envelope() {
        let mut es = engines(2, 4096);
        let data = 0x1122_3344_5566_7788u64.to_le_bytes().to_vec();
        for (ctx, tag, sync, frame) in [
            (3, 7, false, HDR8 + 8),
            (CTX8_LIMIT - 1, -9, false, HDR8 + 8),
            (3, 7, true, HDR + 8),
            (CTX8_LIMIT, 1, false, HDR + 8),
        ] {
            let s = es[0].isend(1, ctx, tag, SendBuf::Owned(data.clone()), sync).unwrap();
            es[0].progress().unwrap();
            let sent = es[1].links[0].as_ref().unwrap().next_len().unwrap();
            assert_eq!(sent, Some(frame), "ctx {ctx} sync {sync}");
            let r = recv_vec(&mut es[1], Pattern { ctx, src: Some(0), tag: Some(tag) }, 8);
            run(&mut es, |es| es[0].is_done(s).unwrap() && es[1].is_done(r).unwrap());
            let (st, got) = es[1].finish(r).unwrap();
            assert_eq!((st.source, st.tag, st.bytes, got), (0, tag, 8, data.clone()), "ctx {ctx} sync {sync}");
            es[0].finish(s).unwrap();
        }
    }

    #[test]
    fn a_send_is_cancelled_until_its_receiver_matched_it() {
        let mut es = engines(2, 4096);
        // A rendezvous, a synchronous and a plain eager send nobody has
        // received: all come back cancelled and leave nothing at the
        // receiver. The eager one, complete at once, is held incomplete
        // until the receiver answers.
        let big = es[0].isend(1, 1, 5, SendBuf::Owned(vec![7; 100_000]), false).unwrap();
        let sync = es[0].isend(1, 1, 6, SendBuf::Owned(vec![8; 10]), true).unwrap();
        let eager = es[0].isend(1, 1, 7, SendBuf::Owned(vec![6; 10]), false).unwrap();
        assert!(es[0].is_done(eager).unwrap());
        run(&mut es, |es| es[1].unexpected.len() == 3);
        for s in [big, sync, eager] {
            assert!(!es[0].cancel(s).unwrap(), "a send is not cancelled on the spot");
        }
        assert!(!es[0].is_done(eager).unwrap());
        run(&mut es, |es| [big, sync, eager].iter().all(|&s| es[0].is_done(s).unwrap()));
        for s in [big, sync, eager] {
            assert!(es[0].finish(s).unwrap().0.cancelled);
        }
        assert!(es[1].unexpected.is_empty());
        // Matched first (the receiver's CTS is on its way when the sender
        // asks): the cancel is refused and the data arrives.
        let s = es[0].isend(1, 1, 5, SendBuf::Owned(vec![9; 100_000]), false).unwrap();
        run(&mut es, |es| es[1].unexpected.len() == 1);
        let r = recv_vec(&mut es[1], any(1), 100_000);
        assert!(matches!(es[0].reqs[&s].kind, Kind::Send { waiting: true, .. }));
        es[0].cancel(s).unwrap();
        run(&mut es, |es| es[0].is_done(s).unwrap() && es[1].is_done(r).unwrap());
        assert!(!es[0].finish(s).unwrap().0.cancelled);
        assert_eq!(es[1].finish(r).unwrap().1, vec![9; 100_000]);
        // To itself: taken back from its own queue at once.
        let own = es[0].isend(0, 1, 3, SendBuf::Owned(vec![1]), true).unwrap();
        es[0].cancel(own).unwrap();
        assert!(es[0].is_done(own).unwrap() && es[0].finish(own).unwrap().0.cancelled);
    }

    #[test]
    fn order_wildcards_and_contexts() {
        let mut es = engines(3, 8192);
        // Rank 0 sends tags 1, 2, 1 on context 7 and one on context 8.
        for (tag, ctx) in [(1, 7), (2, 7), (1, 7), (1, 8)] {
            let s = es[0].isend(2, ctx, tag, SendBuf::Owned(vec![tag as u8, ctx as u8]), false).unwrap();
            es[0].finish(s).unwrap();
        }
        let s = es[1].isend(2, 7, 9, SendBuf::Owned(vec![9]), false).unwrap();
        es[1].finish(s).unwrap();
        run(&mut es, |es| es[2].unexpected.len() == 5);
        // Tag 2 first: it overtakes nothing of its own tag.
        let r = es[2].irecv(Pattern { ctx: 7, src: Some(0), tag: Some(2) }, RecvBuf::Packed { cap: 8 }).unwrap();
        assert_eq!(es[2].finish(r).unwrap().1, vec![2, 7]);
        // Context 8 is apart from 7.
        let r = es[2].irecv(Pattern { ctx: 8, src: None, tag: None }, RecvBuf::Packed { cap: 8 }).unwrap();
        assert_eq!(es[2].finish(r).unwrap().1, vec![1, 8]);
        // Any source, any tag: arrival order among what is left of ctx 7.
        let mut seen = Vec::new();
        for _ in 0..3 {
            let r = es[2].irecv(any(7), RecvBuf::Packed { cap: 8 }).unwrap();
            let (st, b) = es[2].finish(r).unwrap();
            seen.push((st.source, st.tag, b[0]));
        }
        seen.sort();
        assert_eq!(seen, vec![(0, 1, 1), (0, 1, 1), (1, 9, 9)]);
        // From one sender, same tag: in the order sent.
        let a = es[0].isend(1, 3, 4, SendBuf::Owned(vec![1; 20_000]), false).unwrap();
        let b = es[0].isend(1, 3, 4, SendBuf::Owned(vec![2; 10]), false).unwrap();
        let r1 = recv_vec(&mut es[1], any(3), 20_000);
        let r2 = recv_vec(&mut es[1], any(3), 20_000);
        run(&mut es, |es| es[1].is_done(r1).unwrap() && es[1].is_done(r2).unwrap() && es[0].is_done(a).unwrap());
        assert_eq!(es[1].finish(r1).unwrap().0.bytes, 20_000);
        assert_eq!(es[1].finish(r2).unwrap().1, vec![2; 10]);
        let _ = es[0].finish(b);
    }

    #[test]
    fn exchange_of_large_messages_both_ways_does_not_deadlock() {
        let mut es = engines(2, 2048);
        let n = 300_000;
        let s0 = es[0].isend(1, 1, 0, SendBuf::Owned(vec![0xA; n]), false).unwrap();
        let s1 = es[1].isend(0, 1, 0, SendBuf::Owned(vec![0xB; n]), false).unwrap();
        let r0 = recv_vec(&mut es[0], any(1), n);
        let r1 = recv_vec(&mut es[1], any(1), n);
        run(&mut es, |es| {
            [s0, r0].iter().all(|&r| es[0].is_done(r).unwrap()) && [s1, r1].iter().all(|&r| es[1].is_done(r).unwrap())
        });
        assert!(es[0].finish(r0).unwrap().1.iter().all(|&b| b == 0xB));
        assert!(es[1].finish(r1).unwrap().1.iter().all(|&b| b == 0xA));
    }

    #[test]
    fn sync_send_completes_only_once_matched() {
        let mut es = engines(2, 4096);
        for len in [10usize, 50_000] {
            let s = es[0].isend(1, 1, 0, SendBuf::Owned(vec![1; len]), true).unwrap();
            for _ in 0..200 {
                es[0].progress().unwrap();
                es[1].progress().unwrap();
            }
            assert!(!es[0].is_done(s).unwrap(), "ssend of {len} bytes completed before a receive");
            let r = recv_vec(&mut es[1], any(1), len);
            run(&mut es, |es| es[0].is_done(s).unwrap() && es[1].is_done(r).unwrap());
        }
        // To ourselves too.
        let s = es[0].isend(0, 2, 0, SendBuf::Owned(vec![3]), true).unwrap();
        assert!(!es[0].is_done(s).unwrap());
        let r = recv_vec(&mut es[0], any(2), 1);
        assert!(es[0].is_done(s).unwrap() && es[0].is_done(r).unwrap());
    }

    #[test]
    fn truncation_cancel_and_matched_probe() {
        let mut es = engines(2, 4096);
        let mut small = [0u8; 4];
        // SAFETY: `small` outlives the receive (run until it is done).
        let r = es[1].irecv(any(1), RecvBuf::Contig(unsafe { Posted::new(small.as_mut_ptr(), 4) })).unwrap();
        es[0].isend(1, 1, 0, SendBuf::Owned(vec![1, 2, 3, 4, 5, 6]), false).unwrap();
        run(&mut es, |es| es[1].is_done(r).unwrap());
        let st = es[1].finish(r).unwrap().0;
        assert!(st.truncated && st.bytes == 4);
        assert_eq!(small, [1, 2, 3, 4]);
        // A posted receive cancels; nothing arrives in it.
        let r = recv_vec(&mut es[1], any(9), 8);
        assert!(es[1].cancel(r).unwrap());
        assert!(es[1].finish(r).unwrap().0.cancelled);
        // Mprobe takes the message away from other receives.
        es[0].isend(1, 3, 1, SendBuf::Owned(vec![7; 3]), false).unwrap();
        let mut m = None;
        run(&mut es, |es| {
            m = es[1].improbe(any(3)).unwrap();
            m.is_some()
        });
        let m = m.unwrap();
        assert_eq!(m.status().bytes, 3);
        assert!(es[1].iprobe(any(3)).unwrap().is_none());
        let r = es[1].imrecv(m, RecvBuf::Packed { cap: 3 }).unwrap();
        assert_eq!(es[1].finish(r).unwrap().1, vec![7; 3]);
    }

    #[test]
    fn a_dead_peer_is_an_error_not_a_hang() {
        let mut es = engines(2, 4096);
        let r = recv_vec(&mut es[0], any(1), 8);
        let dead = es.pop().unwrap();
        drop(dead);
        assert!(matches!(es[0].wait(r), Err(EngineError::Link(_))));
    }

    /// Frames still queued for a rank that has closed its end: an error
    /// while the job runs, dropped once this rank is leaving (past the
    /// last barrier), where waiting for them would hang and failing would
    /// fail a finished job.
    #[test]
    fn frames_for_a_rank_that_left_are_dropped_only_when_leaving() {
        for leaving in [false, true] {
            let mut es = engines(2, 4096);
            for _ in 0..10 {
                es[0].isend(1, 1, 5, SendBuf::Owned(vec![7; 1000]), false).unwrap();
            }
            assert!(!es[0].out[1].is_empty(), "the pipe is full and frames wait");
            drop(es.pop());
            if leaving {
                es[0].leave().unwrap();
            }
            match es[0].drain() {
                Ok(()) => assert!(leaving && es[0].out[1].is_empty() && es[0].gone[1].is_some()),
                Err(e) => assert!(!leaving && matches!(e, EngineError::Link(TransportError::PeerGone(..))), "{e}"),
            }
        }
    }

    /// A rank past the last barrier says goodbye and stays, serving, until
    /// every rank has said goodbye and taken what it sent: a rank still in
    /// the barrier can ask it for its board slot again, and nobody sees a
    /// closed channel before it is leaving too.
    #[test]
    fn a_leaving_rank_stays_until_everyone_said_goodbye() {
        let mut es = engines(3, 4096);
        let rounds = |es: &mut [Engine]| {
            for _ in 0..100 {
                for e in es.iter_mut() {
                    e.progress().unwrap();
                }
            }
        };
        es[0].leave().unwrap();
        rounds(&mut es);
        assert!(!es[0].parted());
        assert_eq!(es[0].parting_from(), vec![1, 2]);
        es[1].ask_repost(0).unwrap();
        run(&mut es, |es| es[0].take_repost_asked());
        es[1].leave().unwrap();
        rounds(&mut es);
        assert_eq!(es[0].parting_from(), vec![2]);
        assert!(!es[1].parted() && !es[2].parted());
        es[2].leave().unwrap();
        run(&mut es, |es| es.iter().all(|e| e.parted()));
        // The first to close is no error for the others.
        drop(es.remove(0));
        rounds(&mut es);
        assert!(es.iter().all(|e| e.parted()));
    }

    /// Landing memory and a DMA engine shared by the engines of a test:
    /// each rank's memory, each node's error count, and what the next
    /// transfers do.
    #[derive(Default)]
    struct Fabric {
        mem: Vec<Vec<u8>>,
        errors: Vec<u64>,
        /// Transfers started and not yet polled: (token, to, off, bytes).
        flying: Vec<(u64, u32, u64, Vec<u8>)>,
        /// The next transfer fails.
        fail_next: bool,
        /// The next transfer lands, but a piece is lost and rank `.0`'s
        /// adapter counts it.
        error_at: Option<u32>,
        /// Each rank's stamp as it last read it.
        read: Vec<u64>,
        started: u64,
    }

    struct FakeDirect {
        me: u32,
        f: std::sync::Arc<std::sync::Mutex<Fabric>>,
    }

    impl Direct for FakeDirect {
        fn landing(&self, _peer: u32, ptr: *const u8, len: usize) -> Option<u64> {
            let f = self.f.lock().unwrap();
            let m = &f.mem[self.me as usize];
            let off = (ptr as usize).checked_sub(m.as_ptr() as usize)?;
            (off + len <= m.len()).then_some(off as u64)
        }
        fn start(&mut self, to: u32, off: u64, src: *const u8, len: usize) -> Option<u64> {
            let off_here = self.landing(to, src, len)?;
            let mut f = self.f.lock().unwrap();
            let bytes = f.mem[self.me as usize][off_here as usize..][..len].to_vec();
            f.started += 1;
            let token = f.started;
            f.flying.push((token, to, off, bytes));
            Some(token)
        }
        fn poll(&mut self, token: u64) -> Option<bool> {
            let mut f = self.f.lock().unwrap();
            let i = f.flying.iter().position(|t| t.0 == token)?;
            let (_, to, off, bytes) = f.flying.remove(i);
            if std::mem::take(&mut f.fail_next) {
                return Some(false);
            }
            f.mem[to as usize][off as usize..][..bytes.len()].copy_from_slice(&bytes);
            if let Some(r) = f.error_at.take() {
                // A lost piece: the receiver's memory is not all there.
                f.mem[to as usize][off as usize] ^= 0xFF;
                f.errors[r as usize] += 1;
            }
            Some(true)
        }
        fn losses(&mut self, fresh: bool) -> u64 {
            let mut f = self.f.lock().unwrap();
            let me = self.me as usize;
            if fresh || f.read[me] == u64::MAX {
                f.read[me] = f.errors[me];
            }
            f.read[me]
        }
    }

    #[test]
    fn zero_copy_lands_in_the_posted_buffer_and_falls_back_to_data_when_it_cannot_be_trusted() {
        let len = 50_000;
        let f = std::sync::Arc::new(std::sync::Mutex::new(Fabric {
            mem: vec![vec![0u8; 2 * len]; 2],
            errors: vec![0; 2],
            read: vec![u64::MAX; 2],
            ..Fabric::default()
        }));
        let mut es = engines(2, 4096);
        for (i, e) in es.iter_mut().enumerate() {
            e.set_direct(Box::new(FakeDirect { me: i as u32, f: f.clone() }));
        }
        let base = |r: usize| f.lock().unwrap().mem[r].as_mut_ptr();
        // (what happens, sender's buffer in its landing memory, DMAs, messages streamed)
        let cases: [(&str, bool, u64, u64); 6] = [
            ("clean", true, 1, 0),
            ("send buffer elsewhere", false, 0, 1),
            ("transfer failed", true, 1, 1),
            ("a piece lost, the receiver's stamp moved", true, 1, 1),
            ("an error counted before the offer", true, 1, 1),
            ("clean again", true, 1, 0),
        ];
        for (n, (what, registered, dmas, streamed)) in cases.into_iter().enumerate() {
            let data: Vec<u8> = (0..len).map(|i| (i * 13 + n) as u8).collect();
            let outside = data.clone();
            {
                let mut g = f.lock().unwrap();
                g.mem[0][len..].copy_from_slice(&data);
                g.mem[1].iter_mut().for_each(|b| *b = 0);
                g.fail_next = what == "transfer failed";
                g.error_at = (what == "a piece lost, the receiver's stamp moved").then_some(1);
                if what == "an error counted before the offer" {
                    // Counted after the receiver last read its stamp, before
                    // this offer: the offer uses the older stamp, so the
                    // (whole) transfer is not trusted, and goes again.
                    g.errors[1] += 1;
                }
            }
            let (zc, st, started) =
                (es[0].stats.zero_copy.0, es[0].stats.zero_copy_streamed, f.lock().unwrap().started);
            let dst = base(1).wrapping_add(len / 2);
            // SAFETY: `dst` is in engine 1's landing memory, which outlives the receive.
            let r = es[1].irecv(any(1), RecvBuf::Contig(unsafe { Posted::new(dst, len) })).unwrap();
            let src = if registered { base(0).wrapping_add(len).cast_const() } else { outside.as_ptr() };
            // SAFETY: `src` is in engine 0's memory or `outside`, both of which outlive the send.
            let s = es[0].isend(1, 1, 9, SendBuf::Borrowed(unsafe { Lent::new(src, len) }), false).unwrap();
            run(&mut es, |es| es[0].is_done(s).unwrap() && es[1].is_done(r).unwrap());
            let (status, _) = es[1].finish(r).unwrap();
            es[0].finish(s).unwrap();
            assert_eq!((status.bytes, status.truncated), (len, false), "{what}");
            let got = f.lock().unwrap().mem[1][len / 2..][..len].to_vec();
            assert!(got == data, "{what}: the posted buffer's contents differ");
            assert_eq!(f.lock().unwrap().started - started, dmas, "{what}: transfers started");
            assert_eq!(es[0].stats.zero_copy_streamed - st, streamed, "{what}: messages streamed as DATA");
            // DONE went out for every transfer that was sent whole.
            let whole = u64::from(dmas == 1 && what != "transfer failed");
            assert_eq!(es[0].stats.zero_copy.0 - zc, whole, "{what}");
            assert!(es[0].direct_sends.is_empty() && es[1].reqs.is_empty(), "{what}: nothing left behind");
        }
        assert_eq!(es[1].stats.zero_copy_in, 2, "only the clean transfers were taken as they landed");
    }
}
