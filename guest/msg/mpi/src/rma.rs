//! One-sided communication (MPI-3 RMA): the windows this rank exposes and
//! accesses, and the protocol that carries `MPI_Put`, `MPI_Get`, the
//! accumulates, compare-and-swap and the three kinds of synchronisation
//! between ranks, as frames of kind `RMA` on the engine's links
//! ([`crate::engine`]). The C entry points are [`crate::ffi::win`].
//!
//! # Design (docs/mpi.md, "One-sided communication")
//! - **An operation is one frame to its target, applied on arrival.** The
//!   origin sends the target's pieces of memory (offset and length, from
//!   the target datatype, which only the origin knows) and the packed data;
//!   the target's engine copies it into the window when it reads the frame,
//!   whatever MPI call it is in. An operation larger than a frame goes as
//!   several, split at element boundaries. Frames between two ranks arrive
//!   in order, so operations from one origin to one target apply in the
//!   order issued (MPI's default accumulate ordering) and each accumulate
//!   is atomic: the target applies one frame at a time.
//! - **Replies** (`Get`, `Get_accumulate`, `Fetch_and_op`,
//!   `Compare_and_swap`) come back as `REPLY` frames into the origin's
//!   buffer; an operation is complete at the origin when all its bytes are
//!   back.
//! - **Fence**: every rank sends each other rank of the window a `MARK`
//!   carrying the fence's number after its operations, and waits for a
//!   `MARK` of that number from every other rank and for its own replies.
//!   A `MARK` arrives after everything its sender sent before it, so the
//!   window then holds every operation of the epoch.
//! - **Post, start, complete, wait**: `POST` from the target to each
//!   origin of its group; `start` waits for one from each target;
//!   `COMPLETE` from each origin after its operations; `wait` (and `test`)
//!   for one from each origin.
//! - **Passive target**: `LOCK` asks the target for a shared or exclusive
//!   lock, which it grants (`GRANT`) in the order asked, a shared one only
//!   while no exclusive one is held or waiting; `UNLOCK` releases it after
//!   the origin's operations and is answered (`UNLOCKED`) once they are
//!   applied; `FLUSH` is answered (`FLUSHED`) likewise.
//!
//! Operations to the origin itself go through the same code without a
//! link (the engine loops them back).
//!
//! # A frame
//! The engine's header (kind `RMA`) with `ctx` = the window, `tag` = the
//! operation (`PUT` ...), `a` = the target address (the byte offset in the
//! window; the absolute address in a dynamic window), `b` = the origin's
//! reply id. The payload of `PUT`, `ACC`, `GET`, `GET_ACC` and `CAS`:
//!
//! ```text
//! 0  offset u64      where this frame's bytes are in the operation's packed data (replies land there)
//! 8  pieces u32 | kind u16 | op u8 | 0 u8
//! 16 pieces × (displacement i64, bytes u64), from the target address
//! .. data            PUT, ACC, GET_ACC: the packed origin data; CAS: compare then swap
//! ```
//!
//! Touched by the thread that calls MPI, under the C layer's lock (the
//! engine owns it).

use std::collections::VecDeque;
use std::sync::Arc;

use rustc_hash::FxHashMap as HashMap;
use thiserror::Error;

use crate::datatype::{Basic, Datatype, Pair};
use crate::op::{self, Builtin, Kind};

/// Bytes of the payload's fixed part.
pub const SUB: usize = 16;
/// Bytes of one piece.
const PIECE: usize = 16;

/// A put: data into the target's window.
pub const PUT: u8 = 1;
/// A get: the target answers with `REPLY`.
pub const GET: u8 = 2;
/// An accumulate.
pub const ACC: u8 = 3;
/// A get-accumulate (and fetch-and-op): the old data comes back.
pub const GET_ACC: u8 = 4;
/// A compare-and-swap: the old value comes back.
pub const CAS: u8 = 5;
/// Data coming back: `a` = the reply id, `b` = its offset.
pub const REPLY: u8 = 6;
/// End of a fence epoch: `a` = the fence's number.
pub const MARK: u8 = 7;
/// An exposure epoch started (post).
pub const POST: u8 = 8;
/// An access epoch ended (complete).
pub const COMPLETE: u8 = 9;
/// Asks for a lock: `a` = 1 shared, 2 exclusive.
pub const LOCK: u8 = 10;
/// A lock granted.
pub const GRANT: u8 = 11;
/// Releases a lock once the operations before it are applied.
pub const UNLOCK: u8 = 12;
/// The answer to `UNLOCK`.
pub const UNLOCKED: u8 = 13;
/// Asks for an answer once the operations before it are applied.
pub const FLUSH: u8 = 14;
/// The answer to `FLUSH`.
pub const FLUSHED: u8 = 15;
/// An operation the target refused: the payload says why (dynamic
/// windows, where only the target knows what is attached).
pub const ERROR: u8 = 16;

/// Errors of one-sided communication.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum RmaError {
    /// A window id that is not (or no longer) known.
    #[error("window {0} is not known here")]
    NoWindow(u32),
    /// A target outside the window's group.
    #[error("rank {rank} is not in the window (it has {size} ranks)")]
    NoRank {
        /// The rank asked for.
        rank: u32,
        /// The window's ranks.
        size: u32,
    },
    /// An access outside the target's window.
    #[error("{len} bytes at byte {at} of rank {rank}'s window fall outside it ({size} bytes)")]
    Range {
        /// The target (rank in the window).
        rank: u32,
        /// The first byte accessed, from the window's base.
        at: i128,
        /// How many bytes.
        len: u64,
        /// The window's size there.
        size: u64,
    },
    /// An operation its target refused.
    #[error("rank {rank} refused an operation: {what}")]
    Refused {
        /// The target (rank in the window).
        rank: u32,
        /// Why.
        what: String,
    },
    /// An accumulate's operation and type do not go together.
    #[error(transparent)]
    Op(#[from] op::OpError),
    /// A frame that makes no sense.
    #[error("from rank {from}: {what}")]
    Protocol {
        /// The world rank it came from.
        from: u32,
        /// What is wrong.
        what: String,
    },
}

type Result<T> = std::result::Result<T, RmaError>;

/// A frame to send: to world rank `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Msg {
    /// World rank of the receiver.
    pub to: u32,
    /// The operation (`PUT` ...).
    pub op: u8,
    /// The window.
    pub win: u32,
    /// See "A frame".
    pub a: u64,
    /// See "A frame".
    pub b: u64,
    /// See "A frame".
    pub payload: Vec<u8>,
}

/// What a window is at this rank, as its creation agreed.
#[derive(Debug, Clone)]
pub struct WinSpec {
    /// World rank of each rank of the window.
    pub ranks: Vec<u32>,
    /// Our rank in the window.
    pub me: u32,
    /// Our window's first byte (0 for a dynamic window).
    pub base: usize,
    /// Each rank's window size in bytes.
    pub sizes: Vec<u64>,
    /// Each rank's displacement unit.
    pub units: Vec<u64>,
    /// A dynamic window (`MPI_Win_create_dynamic`): targets are absolute
    /// addresses in memory the target attached.
    pub dynamic: bool,
}

/// Where a reply's data goes: `count` elements of `dt` at `ptr`.
#[derive(Debug, Clone)]
pub struct Dest {
    /// The origin buffer.
    pub ptr: usize,
    /// Elements.
    pub count: u64,
    /// Their type.
    pub dt: Arc<Datatype>,
}

/// What an accumulate does at the target: the operation and the element
/// kind its data is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accum {
    /// The operation.
    pub op: Builtin,
    /// The element kind.
    pub kind: Kind,
}

/// The target's side of an operation: its window rank, the byte offset
/// (or address) there, and the target datatype and count.
#[derive(Debug, Clone)]
pub struct Target {
    /// Rank in the window.
    pub rank: u32,
    /// Byte offset in its window (`disp × disp_unit`), or an absolute
    /// address in a dynamic window.
    pub addr: u64,
    /// Elements at the target.
    pub count: u64,
    /// Their type (as the origin defines it).
    pub dt: Arc<Datatype>,
}

/// A reply being received: each frame of it is unpacked straight into
/// the origin buffer at its offset.
#[derive(Debug)]
struct Reply {
    win: u32,
    target: u32,
    total: usize,
    got: usize,
    dest: Dest,
}

/// Reply bytes an origin lets be outstanding from one target before it
/// holds back further operations to it (in order), so that a target never
/// queues more answers than this for one origin however many gets the
/// origin issues (MPICH's `rma/manyget` issues 100,000 of 128 KiB).
pub const REPLY_WINDOW: usize = 4 << 20;

/// One window's state at this rank.
#[derive(Debug)]
struct Win {
    spec: WinSpec,
    /// World rank -> rank in the window.
    index: HashMap<u32, u32>,
    /// Dynamic windows: attached memory (address, bytes).
    attached: Vec<(usize, usize)>,
    /// Fences begun here.
    epoch: u64,
    /// `MARK`s received, by fence number.
    marks: HashMap<u64, u32>,
    /// Per rank: `POST`s received and used.
    posts: Vec<(u64, u64)>,
    /// Per rank: `COMPLETE`s received and used.
    completes: Vec<(u64, u64)>,
    /// Per rank: `GRANT`s received and used.
    grants: Vec<(u64, u64)>,
    /// Per rank: `UNLOCKED` and `FLUSHED` answers received and used.
    acks: Vec<(u64, u64)>,
    /// Per rank: replies still expected from it, and their bytes.
    replies: Vec<u32>,
    reply_bytes: Vec<usize>,
    /// Per rank: frames held back until its replies shrink below
    /// [`REPLY_WINDOW`] (each with the reply bytes it will bring).
    held: Vec<VecDeque<(Msg, usize)>>,
    /// Locks held on our window: shared holders, the exclusive holder.
    shared: u32,
    exclusive: Option<u32>,
    /// Locks asked for and not yet granted: (rank, exclusive), in order.
    queue: VecDeque<(u32, bool)>,
    /// Operations targets refused, not yet reported.
    errors: Vec<RmaError>,
}

/// Counters (for `MCMPI_STATS`).
#[derive(Debug, Clone, Copy, Default)]
pub struct RmaStats {
    /// Operations issued here (put, get, accumulates, compare-and-swap).
    pub ops: u64,
    /// Frames they took.
    pub frames: u64,
    /// Bytes of data they carried out.
    pub bytes: u64,
    /// Operations applied to our windows.
    pub applied: u64,
}

/// This rank's windows and one-sided operations in flight.
#[derive(Debug, Default)]
pub struct Rma {
    wins: HashMap<u32, Win>,
    replies: HashMap<u64, Reply>,
    next_reply: u64,
    out: Vec<Msg>,
    /// Counters.
    pub stats: RmaStats,
}

/// The wire code of an element kind.
pub fn kind_code(k: Kind) -> u16 {
    match k {
        Kind::Basic(b) => Basic::ALL.iter().position(|&x| x == b).unwrap_or(0) as u16,
        Kind::Pair(p) => 0x8000 | Pair::ALL.iter().position(|&x| x == p).unwrap_or(0) as u16,
    }
}

/// The element kind of a wire code.
pub fn kind_of(code: u16) -> Option<Kind> {
    if code & 0x8000 != 0 {
        Pair::ALL.get((code & 0x7fff) as usize).map(|&p| Kind::Pair(p))
    } else {
        Basic::ALL.get(code as usize).map(|&b| Kind::Basic(b))
    }
}

fn op_code(op: Builtin) -> u8 {
    Builtin::ALL.iter().position(|&x| x == op).unwrap_or(0) as u8
}

fn le64(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// A data operation's payload.
fn payload(offset: u64, pieces: &[(i64, u64)], kind: u16, op: u8, data: &[&[u8]]) -> Vec<u8> {
    let n: usize = data.iter().map(|d| d.len()).sum();
    let mut p = Vec::with_capacity(SUB + PIECE * pieces.len() + n);
    p.extend_from_slice(&offset.to_le_bytes());
    p.extend_from_slice(&(pieces.len() as u32).to_le_bytes());
    p.extend_from_slice(&kind.to_le_bytes());
    p.extend_from_slice(&[op, 0]);
    for &(d, l) in pieces {
        p.extend_from_slice(&d.to_le_bytes());
        p.extend_from_slice(&l.to_le_bytes());
    }
    for d in data {
        p.extend_from_slice(d);
    }
    p
}

/// A decoded data operation.
struct Parsed<'a> {
    offset: u64,
    pieces: Vec<(i64, u64)>,
    kind: u16,
    op: u8,
    data: &'a [u8],
}

fn parse(p: &[u8]) -> std::result::Result<Parsed<'_>, String> {
    if p.len() < SUB {
        return Err(format!("a one-sided frame of {} bytes", p.len()));
    }
    let n = u32::from_le_bytes([p[8], p[9], p[10], p[11]]) as usize;
    let end = n.checked_mul(PIECE).and_then(|x| x.checked_add(SUB)).filter(|&e| e <= p.len());
    let Some(end) = end else { return Err(format!("{n} pieces do not fit a frame of {} bytes", p.len())) };
    let pieces = (0..n).map(|i| (le64(p, SUB + i * PIECE) as i64, le64(p, SUB + i * PIECE + 8))).collect();
    Ok(Parsed { offset: le64(p, 0), pieces, kind: u16::from_le_bytes([p[12], p[13]]), op: p[14], data: &p[end..] })
}

/// A frame's share of an operation: its packed offset, its length and
/// its pieces at the target.
type Chunk = (u64, u64, Vec<(i64, u64)>);

/// Splits `total` packed bytes into ranges that fit a frame of `max`
/// payload bytes with their pieces, each a whole number of `elem`-byte
/// elements: `pieces(start, len)` gives a range's pieces.
fn split(total: u64, elem: u64, max: usize, mut pieces: impl FnMut(u64, u64) -> Vec<(i64, u64)>) -> Vec<Chunk> {
    let elem = elem.max(1);
    let room = max.saturating_sub(SUB).max(PIECE + elem as usize) as u64;
    let first = ((room / 2) / elem).max(1) * elem;
    let mut out = Vec::new();
    let mut at = 0;
    while at < total {
        let mut len = first.min(total - at);
        loop {
            let p = pieces(at, len);
            if len <= elem || (p.len() * PIECE) as u64 + len <= room {
                out.push((at, len, p));
                break;
            }
            len = ((len / 2) / elem).max(1) * elem;
        }
        at += len;
    }
    out
}

impl Win {
    fn new(spec: WinSpec) -> Win {
        let n = spec.ranks.len();
        let index = spec.ranks.iter().enumerate().map(|(i, &w)| (w, i as u32)).collect();
        Win {
            spec,
            index,
            attached: Vec::new(),
            epoch: 0,
            marks: HashMap::default(),
            posts: vec![(0, 0); n],
            completes: vec![(0, 0); n],
            grants: vec![(0, 0); n],
            acks: vec![(0, 0); n],
            replies: vec![0; n],
            reply_bytes: vec![0; n],
            held: (0..n).map(|_| VecDeque::new()).collect(),
            shared: 0,
            exclusive: None,
            queue: VecDeque::new(),
            errors: Vec::new(),
        }
    }

    fn size(&self) -> u32 {
        self.spec.ranks.len() as u32
    }

    fn rank_ok(&self, rank: u32) -> Result<()> {
        if rank >= self.size() {
            return Err(RmaError::NoRank { rank, size: self.size() });
        }
        Ok(())
    }

    /// The memory of `pieces` from target address `addr` in our window:
    /// (address, bytes) each, or why not.
    fn locate(&self, addr: u64, pieces: &[(i64, u64)]) -> std::result::Result<Vec<(usize, usize)>, String> {
        let mut out = Vec::with_capacity(pieces.len());
        for &(d, l) in pieces {
            let at = addr as i128 + d as i128;
            let end = at + l as i128;
            let ok = if self.spec.dynamic {
                self.attached.iter().any(|&(s, n)| at >= s as i128 && end <= (s + n) as i128)
            } else {
                at >= 0 && end <= self.spec.sizes[self.spec.me as usize] as i128
            };
            if !ok {
                return Err(if self.spec.dynamic {
                    format!("{l} bytes at address {at:#x} are not in memory attached to the window")
                } else {
                    format!(
                        "{l} bytes at byte {at} fall outside the window ({} bytes)",
                        self.spec.sizes[self.spec.me as usize]
                    )
                });
            }
            let base = if self.spec.dynamic { 0 } else { self.spec.base };
            out.push((base + at as usize, l as usize));
        }
        Ok(out)
    }

    /// Grants queued locks while they can be.
    fn grant_queued(&mut self, out: &mut Vec<Msg>, id: u32) {
        while let Some(&(r, excl)) = self.queue.front() {
            let can = if excl { self.shared == 0 && self.exclusive.is_none() } else { self.exclusive.is_none() };
            if !can {
                break;
            }
            self.queue.pop_front();
            if excl {
                self.exclusive = Some(r);
            } else {
                self.shared += 1;
            }
            out.push(Msg { to: self.spec.ranks[r as usize], op: GRANT, win: id, a: 0, b: 0, payload: Vec::new() });
        }
    }
}

/// Copies the bytes of `places` into one packed buffer.
fn gather(places: &[(usize, usize)]) -> Vec<u8> {
    let mut v = Vec::with_capacity(places.iter().map(|p| p.1).sum());
    for &(a, n) in places {
        // SAFETY: `Win::locate` checked that these bytes are in the
        // window's memory, which the application keeps valid while the
        // window exists (MPI's rule for window memory).
        v.extend_from_slice(unsafe { std::slice::from_raw_parts(a as *const u8, n) });
    }
    v
}

/// Copies `data` (packed) out to `places`.
fn scatter(places: &[(usize, usize)], data: &[u8]) {
    let mut at = 0;
    for &(a, n) in places {
        // SAFETY: as in `gather`; `data` holds the pieces' bytes in turn
        // (checked by the caller) and is not window memory.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr().add(at), a as *mut u8, n) };
        at += n;
    }
}

impl Rma {
    /// No windows.
    pub fn new() -> Rma {
        Rma::default()
    }

    /// Registers window `id` (before its creation's collective step, so
    /// that no operation can arrive for it unknown).
    pub fn create(&mut self, id: u32, spec: WinSpec) {
        self.wins.insert(id, Win::new(spec));
    }

    /// Forgets window `id`.
    pub fn free(&mut self, id: u32) -> Result<()> {
        self.wins.remove(&id).map(|_| ()).ok_or(RmaError::NoWindow(id))
    }

    /// Whether window `id` exists here.
    pub fn exists(&self, id: u32) -> bool {
        self.wins.contains_key(&id)
    }

    /// Attaches `len` bytes at `addr` to dynamic window `id`.
    pub fn attach(&mut self, id: u32, addr: usize, len: usize) -> Result<()> {
        self.win_mut(id)?.attached.push((addr, len));
        Ok(())
    }

    /// Detaches the memory at `addr` from dynamic window `id`; false when
    /// none was attached there.
    pub fn detach(&mut self, id: u32, addr: usize) -> Result<bool> {
        let w = self.win_mut(id)?;
        Ok(match w.attached.iter().position(|a| a.0 == addr) {
            Some(i) => {
                w.attached.remove(i);
                true
            }
            None => false,
        })
    }

    fn win(&self, id: u32) -> Result<&Win> {
        self.wins.get(&id).ok_or(RmaError::NoWindow(id))
    }

    fn win_mut(&mut self, id: u32) -> Result<&mut Win> {
        self.wins.get_mut(&id).ok_or(RmaError::NoWindow(id))
    }

    /// Frames to send (the engine takes them after each call).
    pub fn take_out(&mut self) -> Vec<Msg> {
        std::mem::take(&mut self.out)
    }

    /// Checks that `len` bytes of `t` fit its window (dynamic windows:
    /// the target checks).
    fn check_range(&self, id: u32, t: &Target, len: u64) -> Result<()> {
        let w = self.win(id)?;
        w.rank_ok(t.rank)?;
        if w.spec.dynamic || len == 0 {
            return Ok(());
        }
        let (lo, hi) = t.dt.span(t.count).unwrap_or((0, i128::MAX / 4));
        let size = w.spec.sizes[t.rank as usize];
        let (at, end) = (t.addr as i128 + lo, t.addr as i128 + hi);
        if at < 0 || end > size as i128 {
            return Err(RmaError::Range { rank: t.rank, at, len: (hi - lo) as u64, size });
        }
        Ok(())
    }

    /// Sends a data operation as frames of at most `max` payload bytes,
    /// after checking its range; with `back`, its data comes back there:
    /// returns the reply id (0 without).
    #[allow(clippy::too_many_arguments)]
    fn issue(
        &mut self,
        id: u32,
        t: &Target,
        op: u8,
        acc: Option<Accum>,
        data: &[u8],
        back: Option<Dest>,
        max: usize,
    ) -> Result<u64> {
        let total = t.dt.size().saturating_mul(t.count);
        self.check_range(id, t, total)?;
        let reply = match back {
            Some(dest) => self.expect(id, t.rank, total, dest)?,
            None => 0,
        };
        if reply != 0 && total == 0 {
            self.complete_reply(reply);
            return Ok(reply);
        }
        let to = self.win(id)?.spec.ranks[t.rank as usize];
        let (kind, code) = acc.map_or((0, 0), |a| (kind_code(a.kind), op_code(a.op)));
        let elem = acc.map_or(1, |a| a.kind.packed_size() as u64);
        let dt = t.dt.clone();
        let count = t.count;
        let chunks = split(total, elem, max, |s, l| dt.pieces(count, s, l));
        self.stats.ops += 1;
        for (at, len, pieces) in chunks {
            let body: &[u8] = if data.is_empty() { &[] } else { &data[at as usize..(at + len) as usize] };
            self.stats.frames += 1;
            self.stats.bytes += body.len() as u64;
            let payload = payload(at, &pieces, kind, code, &[body]);
            let returns = if reply != 0 { len as usize } else { 0 };
            self.send(id, t.rank, Msg { to, op, win: id, a: t.addr, b: reply, payload }, returns)?;
        }
        Ok(reply)
    }

    /// Sends `m` to rank `target` of window `id`, or holds it back behind
    /// others while too many reply bytes are outstanding from there;
    /// `back`: the reply bytes it will bring.
    fn send(&mut self, id: u32, target: u32, m: Msg, back: usize) -> Result<()> {
        let w = self.win_mut(id)?;
        w.rank_ok(target)?;
        let t = target as usize;
        let busy = w.reply_bytes[t] > 0 && w.reply_bytes[t] + back > REPLY_WINDOW;
        if busy || !w.held[t].is_empty() {
            w.held[t].push_back((m, back));
            return Ok(());
        }
        w.reply_bytes[t] += back;
        self.out.push(m);
        Ok(())
    }

    /// Sends what was held back for `target` while there is room.
    fn release(&mut self, id: u32, target: u32) {
        let Some(w) = self.wins.get_mut(&id) else { return };
        let t = target as usize;
        while let Some((_, back)) = w.held[t].front() {
            if w.reply_bytes[t] > 0 && w.reply_bytes[t] + back > REPLY_WINDOW {
                break;
            }
            let (m, back) = w.held[t].pop_front().expect("front exists");
            w.reply_bytes[t] += back;
            self.out.push(m);
        }
    }

    /// A reply id for data coming back into `dest` (`total` packed bytes).
    fn expect(&mut self, id: u32, target: u32, total: u64, dest: Dest) -> Result<u64> {
        self.win_mut(id)?.replies[target as usize] += 1;
        self.next_reply += 1;
        let r = self.next_reply;
        self.replies.insert(r, Reply { win: id, target, total: total as usize, got: 0, dest });
        Ok(r)
    }

    /// Whether reply `r` is complete (its data is in the origin buffer).
    pub fn reply_done(&self, r: u64) -> bool {
        !self.replies.contains_key(&r)
    }

    /// `MPI_Put`: `data` (packed) into target `t`.
    pub fn put(&mut self, id: u32, t: &Target, data: &[u8], max: usize) -> Result<()> {
        self.issue(id, t, PUT, None, data, None, max).map(|_| ())
    }

    /// `MPI_Accumulate`.
    pub fn accumulate(&mut self, id: u32, t: &Target, data: &[u8], acc: Accum, max: usize) -> Result<()> {
        op::check(acc.op, acc.kind)?;
        self.issue(id, t, ACC, Some(acc), data, None, max).map(|_| ())
    }

    /// `MPI_Get`: target `t` into `dest`; returns the reply id.
    pub fn get(&mut self, id: u32, t: &Target, dest: Dest, max: usize) -> Result<u64> {
        self.issue(id, t, GET, None, &[], Some(dest), max)
    }

    /// `MPI_Get_accumulate` (and `MPI_Fetch_and_op`): the old data into
    /// `dest`, then `data` combined into the target.
    pub fn get_accumulate(
        &mut self,
        id: u32,
        t: &Target,
        data: &[u8],
        acc: Accum,
        dest: Dest,
        max: usize,
    ) -> Result<u64> {
        op::check(acc.op, acc.kind)?;
        self.issue(id, t, GET_ACC, Some(acc), data, Some(dest), max)
    }

    /// `MPI_Compare_and_swap`: one element of `kind`.
    pub fn compare_and_swap(&mut self, id: u32, t: &Target, compare: &[u8], swap: &[u8], dest: Dest) -> Result<u64> {
        let total = t.dt.size();
        self.check_range(id, t, total)?;
        let r = self.expect(id, t.rank, total, dest)?;
        let to = self.win(id)?.spec.ranks[t.rank as usize];
        let kind = match t.dt.basic_kind() {
            Some(b) => Kind::Basic(b),
            None => {
                return Err(RmaError::Op(op::OpError::NotUniform {
                    op: "MPI_Compare_and_swap",
                    why: "it is not a predefined type".into(),
                }))
            }
        };
        let pieces = t.dt.pieces(1, 0, total);
        self.stats.ops += 1;
        self.stats.frames += 1;
        let payload = payload(0, &pieces, kind_code(kind), 0, &[compare, swap]);
        self.send(id, t.rank, Msg { to, op: CAS, win: id, a: t.addr, b: r, payload }, total as usize)?;
        Ok(r)
    }

    /// Replies still expected on window `id` (from `target`, or any).
    pub fn replies_pending(&self, id: u32, target: Option<u32>) -> Result<bool> {
        let w = self.win(id)?;
        Ok(match target {
            Some(t) => w.replies.get(t as usize).is_some_and(|&n| n > 0),
            None => w.replies.iter().any(|&n| n > 0),
        })
    }

    /// Takes the first error a target reported on window `id`.
    pub fn take_error(&mut self, id: u32) -> Result<Option<RmaError>> {
        let w = self.win_mut(id)?;
        Ok((!w.errors.is_empty()).then(|| w.errors.remove(0)))
    }

    fn send_all_others(&mut self, id: u32, op: u8, a: u64) -> Result<()> {
        let w = self.win(id)?;
        let me = w.spec.me;
        let others: Vec<u32> = (0..w.size()).filter(|&r| r != me).collect();
        self.send_group(id, op, a, &others)
    }

    fn send_group(&mut self, id: u32, op: u8, a: u64, group: &[u32]) -> Result<()> {
        let w = self.win(id)?;
        for &r in group {
            w.rank_ok(r)?;
        }
        let msgs: Vec<(u32, Msg)> = group
            .iter()
            .map(|&r| (r, Msg { to: w.spec.ranks[r as usize], op, win: id, a, b: 0, payload: Vec::new() }))
            .collect();
        for (r, m) in msgs {
            self.send(id, r, m, 0)?;
        }
        Ok(())
    }

    /// Begins a fence on window `id`: a `MARK` to every other rank after
    /// the operations sent so far. Returns the fence's number.
    pub fn fence_begin(&mut self, id: u32) -> Result<u64> {
        let w = self.win_mut(id)?;
        w.epoch += 1;
        let e = w.epoch;
        self.send_all_others(id, MARK, e)?;
        Ok(e)
    }

    /// Whether fence `epoch` on window `id` is complete here: a `MARK` in
    /// from every other rank and no reply outstanding.
    pub fn fence_done(&mut self, id: u32, epoch: u64) -> Result<bool> {
        let w = self.win_mut(id)?;
        let need = w.size() - 1;
        let have = w.marks.get(&epoch).copied().unwrap_or(0);
        if have < need || w.replies.iter().any(|&n| n > 0) {
            return Ok(false);
        }
        w.marks.remove(&epoch);
        Ok(true)
    }

    /// `MPI_Win_post`: tells each origin of `group` (window ranks).
    pub fn post(&mut self, id: u32, group: &[u32]) -> Result<()> {
        self.send_group(id, POST, 0, group)
    }

    /// `MPI_Win_start`'s wait: true (and uses them) once a `POST` came
    /// from every target of `group`.
    pub fn posted(&mut self, id: u32, group: &[u32]) -> Result<bool> {
        take_all(&mut self.win_mut(id)?.posts, group)
    }

    /// `MPI_Win_complete`: a `COMPLETE` to each target of `group` after
    /// the operations.
    pub fn complete(&mut self, id: u32, group: &[u32]) -> Result<()> {
        self.send_group(id, COMPLETE, 0, group)
    }

    /// `MPI_Win_wait`/`MPI_Win_test`: true (and uses them) once a
    /// `COMPLETE` came from every origin of `group`.
    pub fn completed(&mut self, id: u32, group: &[u32]) -> Result<bool> {
        take_all(&mut self.win_mut(id)?.completes, group)
    }

    /// Asks `target` for a lock.
    pub fn lock(&mut self, id: u32, target: u32, exclusive: bool) -> Result<()> {
        self.send_group(id, LOCK, if exclusive { 2 } else { 1 }, &[target])
    }

    /// True (and uses it) once `target` granted a lock.
    pub fn granted(&mut self, id: u32, target: u32) -> Result<bool> {
        take_all(&mut self.win_mut(id)?.grants, &[target])
    }

    /// Releases the lock on `target` after the operations sent so far.
    pub fn unlock(&mut self, id: u32, target: u32) -> Result<()> {
        self.send_group(id, UNLOCK, 0, &[target])
    }

    /// Asks `target` to answer once the operations sent so far are applied.
    pub fn flush(&mut self, id: u32, target: u32) -> Result<()> {
        self.send_group(id, FLUSH, 0, &[target])
    }

    /// True (and uses it) once `target` answered an `UNLOCK` or `FLUSH`.
    pub fn acked(&mut self, id: u32, target: u32) -> Result<bool> {
        take_all(&mut self.win_mut(id)?.acks, &[target])
    }

    fn complete_reply(&mut self, r: u64) {
        let Some(rep) = self.replies.remove(&r) else { return };
        if let Some(w) = self.wins.get_mut(&rep.win) {
            w.replies[rep.target as usize] = w.replies[rep.target as usize].saturating_sub(1);
        }
    }

    /// A frame of kind `RMA` from world rank `from`.
    pub fn arrive(&mut self, from: u32, op: u8, id: u32, a: u64, b: u64, p: &[u8]) -> Result<()> {
        let bad = |what: String| RmaError::Protocol { from, what };
        if op == REPLY {
            let Some(rep) = self.replies.get_mut(&a) else {
                return Err(bad(format!("a reply for operation {a}, which expects none")));
            };
            let at = b as usize;
            if at.checked_add(p.len()).is_none_or(|e| e > rep.total) || rep.got + p.len() > rep.total {
                return Err(bad(format!("{} reply bytes at {at} of a {}-byte reply", p.len(), rep.total)));
            }
            // SAFETY: the origin buffer holds `count` elements of its type
            // (MPI's rule) and stays valid until the operation completes;
            // these are packed bytes at..at + len of them, within the total.
            unsafe { rep.dest.dt.unpack_at(rep.dest.count, rep.dest.ptr as *mut u8, at as u64, p) };
            rep.got += p.len();
            let (win, target, whole) = (rep.win, rep.target, rep.got == rep.total);
            if whole {
                self.complete_reply(a);
            }
            if let Some(w) = self.wins.get_mut(&win) {
                let t = target as usize;
                w.reply_bytes[t] = w.reply_bytes[t].saturating_sub(p.len());
            }
            self.release(win, target);
            return Ok(());
        }
        let Some(w) = self.wins.get_mut(&id) else {
            return Err(bad(format!("an operation on window {id}, not known here")));
        };
        let Some(&r) = w.index.get(&from) else {
            return Err(bad(format!("an operation on window {id}, which it is not in")));
        };
        let ru = r as usize;
        let back = |op: u8, a: u64, b: u64, payload: Vec<u8>| Msg { to: from, op, win: id, a, b, payload };
        match op {
            PUT | ACC | GET | GET_ACC | CAS => {
                let d = parse(p).map_err(bad)?;
                let places = match w.locate(a, &d.pieces) {
                    Ok(x) => x,
                    Err(why) => {
                        if matches!(op, GET | GET_ACC | CAS) {
                            // The origin waits for these bytes: send zeros,
                            // and the error.
                            let n: u64 = d.pieces.iter().map(|x| x.1).sum();
                            self.out.push(back(REPLY, b, d.offset, vec![0; n as usize]));
                        }
                        self.out.push(back(ERROR, 0, 0, why.into_bytes()));
                        return Ok(());
                    }
                };
                let n: usize = places.iter().map(|x| x.1).sum();
                let want = match op {
                    PUT | ACC | GET_ACC => n,
                    CAS => 2 * n,
                    _ => 0,
                };
                if d.data.len() != want {
                    return Err(bad(format!("{} data bytes for {n} bytes of window", d.data.len())));
                }
                let acc = if matches!(op, ACC | GET_ACC | CAS) {
                    let kind = kind_of(d.kind).ok_or_else(|| bad(format!("element kind {}", d.kind)))?;
                    let bop = *Builtin::ALL.get(d.op as usize).ok_or_else(|| bad(format!("operation {}", d.op)))?;
                    if n % kind.packed_size() != 0 {
                        return Err(bad(format!("{n} bytes are not whole {} elements", kind.name())));
                    }
                    Some(Accum { op: bop, kind })
                } else {
                    None
                };
                self.stats.applied += 1;
                match op {
                    PUT => scatter(&places, d.data),
                    GET => self.out.push(back(REPLY, b, d.offset, gather(&places))),
                    ACC | GET_ACC => {
                        let acc = acc.expect("set for accumulates");
                        let mut cur = gather(&places);
                        if op == GET_ACC {
                            self.out.push(back(REPLY, b, d.offset, cur.clone()));
                        }
                        if acc.op != Builtin::NoOp {
                            op::reduce(acc.op, acc.kind, d.data, &mut cur)?;
                            scatter(&places, &cur);
                        }
                    }
                    _ => {
                        let cur = gather(&places);
                        let (cmp, swap) = d.data.split_at(n);
                        if cur == cmp {
                            scatter(&places, swap);
                        }
                        self.out.push(back(REPLY, b, 0, cur));
                    }
                }
            }
            MARK => *w.marks.entry(a).or_insert(0) += 1,
            POST => w.posts[ru].0 += 1,
            COMPLETE => w.completes[ru].0 += 1,
            GRANT => w.grants[ru].0 += 1,
            UNLOCKED | FLUSHED => w.acks[ru].0 += 1,
            LOCK => {
                w.queue.push_back((r, a == 2));
                w.grant_queued(&mut self.out, id);
            }
            UNLOCK => {
                if w.exclusive == Some(r) {
                    w.exclusive = None;
                } else if w.shared > 0 {
                    w.shared -= 1;
                } else {
                    return Err(bad(format!("an unlock of window {id}, which it holds no lock on")));
                }
                self.out.push(back(UNLOCKED, 0, 0, Vec::new()));
                w.grant_queued(&mut self.out, id);
            }
            FLUSH => self.out.push(back(FLUSHED, 0, 0, Vec::new())),
            ERROR => w.errors.push(RmaError::Refused { rank: r, what: String::from_utf8_lossy(p).into_owned() }),
            k => return Err(bad(format!("unknown one-sided operation {k}"))),
        }
        Ok(())
    }
}

/// Uses one of each of `group`'s received counts if every one has one
/// unused.
fn take_all(counts: &mut [(u64, u64)], group: &[u32]) -> Result<bool> {
    for &r in group {
        match counts.get(r as usize) {
            Some(&(got, used)) if got > used => {}
            Some(_) => return Ok(false),
            None => return Err(RmaError::NoRank { rank: r, size: counts.len() as u32 }),
        }
    }
    for &r in group {
        counts[r as usize].1 += 1;
    }
    Ok(true)
}

#[cfg(test)]
mod tests;
