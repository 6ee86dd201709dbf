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
//! Touched by the thread that calls MPI, under the C layer's lock.
//!
//! By job: [`frame`] the frames on the wire, [`buffers`] the caller's
//! buffers, [`matching`] receives against arrivals, [`credit`] what eager
//! messages may hold at a receiver, [`rendezvous`] `RTS`/`CTS`/`DATA`,
//! [`zcopy`] one DMA into the posted buffer, [`progress`] moving and
//! dispatching frames, [`wait`] how a rank waits; this file holds the
//! engine, its requests and sends.

mod buffers;
mod credit;
mod frame;
mod matching;
mod progress;
mod rendezvous;
#[cfg(test)]
mod tests;
pub(crate) mod wait;
mod zcopy;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap as HashMap;
use thiserror::Error;

use crate::rma::{Rma, RmaError};
use crate::transport::{Link, TransportError};

pub use buffers::*;
pub use credit::*;
pub use frame::*;
pub use matching::*;
pub use wait::*;
pub use zcopy::*;

/// The smallest default eager limit (bytes).
pub const EAGER_DEFAULT: usize = 16 << 10;

/// The largest default eager limit: a quarter of the smallest ring, up to
/// this. A rendezvous costs a round trip of two small messages (~1 ms
/// across TCG guests), more than copying 256 KiB once more; NPmpi across 2
/// guests with 1 MiB rings, eager limit 64 KiB against 256 KiB: 128 KiB
/// messages 67-69 -> 151-168 MB/s.
pub const EAGER_MAX: usize = 256 << 10;

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
    /// Per rank: we said goodbye.
    bye_sent: Vec<bool>,
    /// Per rank that has gone: whether its link was in use.
    used_gone: Vec<bool>,
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
            bye_sent: vec![false; n],
            used_gone: vec![false; n],
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

    /// Every link's state and what waits to be written into it, a line
    /// each, for a report of a wait that lasts.
    pub fn describe_links(&self) -> String {
        let mut s = String::new();
        let mut unused = 0;
        for (p, l) in self.links.iter().enumerate() {
            let state = match (l, &self.gone[p]) {
                // Opened on first use and used by neither rank: a count.
                (Some(l), _) if !l.in_use(false) && self.out[p].is_empty() => {
                    unused += 1;
                    continue;
                }
                (Some(l), _) => l.describe(),
                (None, Some(e)) => format!("gone: {e}"),
                (None, None) => continue,
            };
            s.push_str(&format!("  to rank {p}: {} frames queued; {state}\n", self.out[p].len()));
        }
        if unused > 0 {
            s.push_str(&format!("  and {unused} ranks with no channel (none used yet)\n"));
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

    fn ack(&mut self, src: u32, sreq: u64) -> Result<(), EngineError> {
        if src == self.me {
            self.finish_send(sreq);
            return Ok(());
        }
        self.out[src as usize].push_back(Out::Frame(header(ACK, 0, 0, 0, 0, sreq, 0).to_vec()));
        self.flush(src as usize)
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
}

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
