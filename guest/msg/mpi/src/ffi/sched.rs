//! Collective schedules: the one form every collective takes, blocking or
//! not. A collective's algorithm is an `async` function over an [`Io`]: it
//! posts sends and receives to ranks of its communicator and awaits them,
//! packs, unpacks and reduces in between. A [`Sched`] holds that future
//! and drives it: it starts the posted operations on the engine, hands
//! their results back, and polls again, never blocking. So:
//!
//! - a blocking collective (`MPI_Bcast`) drives its schedule to the end
//!   ([`run`]);
//! - a non-blocking one (`MPI_Ibcast`) is a request whose schedule moves
//!   whenever the process makes progress ([`progress`]: in every wait,
//!   test and blocking call), so ranks that wait on something else still
//!   forward their part of a tree;
//! - a persistent one (`MPI_Bcast_init`) builds a new schedule at each
//!   `MPI_Start` ([`Persistent`]), on the tags it took at init: persistent
//!   collectives are matched in the order they were initialised, whatever
//!   the order of their starts.
//!
//! Each collective call on a communicator takes the next tag of its
//! collective context ([`next_tag`]). Every rank calls collectives in the
//! same order, so the tags agree, and two collectives in flight on one
//! communicator never take each other's messages.
//!
//! Touched by the thread that calls MPI, under the C layer's lock.

use rustc_hash::FxHashMap as HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

use super::*;
use crate::board::{self, Board};
use crate::engine::{backoff, board_backoff, Pattern, RecvBuf, SendBuf};

/// One posted operation, named in its schedule.
pub type Key = u64;

/// An operation as the engine takes it: world rank, context, tag.
enum Action {
    Send {
        to: u32,
        ctx: u32,
        tag: i32,
        bytes: Vec<u8>,
    },
    Recv {
        from: u32,
        ctx: u32,
        tag: i32,
        cap: usize,
    },
    /// A rank outside the group (a bug in an algorithm, reported as one).
    Bad(u32, usize),
}

struct Shared {
    next: Key,
    queued: Vec<(Key, Action)>,
    results: HashMap<Key, R<Vec<u8>>>,
}

/// What a collective's algorithm sees: its communicator (as ranks of it)
/// and the operations it posts. Cheap to clone; every clone is the same
/// schedule's, and so is every view made by [`Io::also`] (an
/// intercommunicator's collectives use its remote group and its local one).
#[derive(Clone)]
pub struct Io {
    shared: Arc<Mutex<Shared>>,
    ctx: u32,
    tag: i32,
    ranks: Arc<Vec<u32>>,
    rank: u32,
}

impl Io {
    /// A schedule's view of communicator `comm` for its next collective.
    /// On an intercommunicator its ranks are the remote group's.
    pub fn new(st: &mut State, comm: MPI_Comm) -> R<Io> {
        let c = st.comm(comm)?;
        let (ctx, ranks, rank) = (c.ctx + 1, Arc::new(c.peers().to_vec()), c.rank);
        let tag = next_tag(st, ctx);
        let shared = Arc::new(Mutex::new(Shared { next: 0, queued: Vec::new(), results: HashMap::default() }));
        Ok(Io { shared, ctx, tag, ranks, rank })
    }

    /// A view of communicator `comm` in the same schedule.
    pub fn also(&self, st: &mut State, comm: MPI_Comm) -> R<Io> {
        Ok(Io { shared: self.shared.clone(), ..Io::new(st, comm)? })
    }

    /// Our rank in the communicator.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Members of the communicator.
    pub fn size(&self) -> u32 {
        self.ranks.len() as u32
    }

    fn shared(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn post(&self, a: Action) -> Key {
        let mut s = self.shared();
        let k = s.next;
        s.next += 1;
        s.queued.push((k, a));
        k
    }

    /// Posts a send of `bytes` to rank `to`; it starts when the algorithm
    /// next awaits.
    pub fn send(&self, to: u32, bytes: Vec<u8>) -> Key {
        let (ctx, tag) = (self.ctx, self.tag);
        self.post(match self.ranks.get(to as usize) {
            Some(&to) => Action::Send { to, ctx, tag, bytes },
            None => Action::Bad(to, self.ranks.len()),
        })
    }

    /// Posts a receive of up to `cap` bytes from rank `from`.
    pub fn recv(&self, from: u32, cap: usize) -> Key {
        let (ctx, tag) = (self.ctx, self.tag);
        self.post(match self.ranks.get(from as usize) {
            Some(&from) => Action::Recv { from, ctx, tag, cap },
            None => Action::Bad(from, self.ranks.len()),
        })
    }

    /// The result of operation `k`: the bytes received (empty for a send).
    pub fn wait(&self, k: Key) -> Done {
        Done { io: self.clone(), key: k }
    }

    /// Sends and waits for the send to complete.
    pub async fn send_now(&self, to: u32, bytes: Vec<u8>) -> R<()> {
        let k = self.send(to, bytes);
        self.wait(k).await.map(|_| ())
    }

    /// Receives (posts and waits).
    pub async fn recv_now(&self, from: u32, cap: usize) -> R<Vec<u8>> {
        let k = self.recv(from, cap);
        self.wait(k).await
    }
}

/// The future of one posted operation ([`Io::wait`]).
pub struct Done {
    io: Io,
    key: Key,
}

impl Future for Done {
    type Output = R<Vec<u8>>;

    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<R<Vec<u8>>> {
        match self.io.shared().results.remove(&self.key) {
            Some(r) => Poll::Ready(r),
            None => Poll::Pending,
        }
    }
}

/// The next tag of collective context `ctx` (while a persistent
/// collective is being built, the tags it took at init, in order).
fn next_tag(st: &mut State, ctx: u32) -> i32 {
    if let Some(t) = st.tags.replay.pop_front() {
        return t;
    }
    let seq = st.coll_seq.entry(ctx).or_insert(0);
    let tag = *seq;
    *seq = if *seq == i32::MAX { 0 } else { *seq + 1 };
    if let Some(log) = st.tags.log.as_mut() {
        log.push(tag);
    }
    tag
}

/// Tags being recorded (a persistent collective's init) or replayed (its
/// start).
#[derive(Default)]
pub struct TagLog {
    log: Option<Vec<i32>>,
    replay: std::collections::VecDeque<i32>,
    /// A persistent collective's schedule is being built.
    persistent: bool,
}

impl TagLog {
    /// Whether the schedule being built is a persistent collective's: its
    /// starts may come in any order, so it never takes a turn on the job's
    /// board (which numbers collectives in call order).
    pub fn persistent(&self) -> bool {
        self.persistent
    }
}

/// A persistent collective: how to build its schedule, and its tags.
pub struct Persistent {
    recipe: Box<Recipe>,
    tags: Vec<i32>,
}

impl Persistent {
    /// Builds the schedule once (checking the arguments now, as the init
    /// call must) and keeps the tags that took.
    pub fn new(st: &mut State, recipe: Box<Recipe>) -> R<Persistent> {
        st.tags.log = Some(Vec::new());
        st.tags.persistent = true;
        let built = recipe(st);
        st.tags.persistent = false;
        let tags = st.tags.log.take().unwrap_or_default();
        built.map(|_| Persistent { recipe, tags })
    }

    /// A new schedule on the tags of the init.
    pub fn build(&self, st: &mut State) -> R<Sched> {
        st.tags.replay = self.tags.iter().copied().collect();
        st.tags.persistent = true;
        let s = (self.recipe)(st);
        st.tags.persistent = false;
        st.tags.replay.clear();
        s
    }
}

/// Schedules are polled, never woken: the driver polls them whenever the
/// engine moved.
struct Nobody;

impl Wake for Nobody {
    fn wake(self: Arc<Self>) {}
}

/// A collective in flight.
pub struct Sched {
    fut: Pin<Box<dyn Future<Output = R<()>> + Send>>,
    io: Io,
    inflight: Vec<(Key, ReqId)>,
    waker: Waker,
    then: Option<Box<Then>>,
    /// The board collective it runs, if it runs on the job's board.
    turn: Option<Turn>,
}

/// What a finished schedule does to the state ([`Sched::then`]).
type Then = dyn FnOnce(&mut State) + Send;

impl Sched {
    /// The schedule of algorithm `fut` posting through `io`.
    pub fn new(io: Io, fut: impl Future<Output = R<()>> + Send + 'static) -> Sched {
        Sched {
            fut: Box::pin(fut),
            io,
            inflight: Vec::new(),
            waker: Waker::from(Arc::new(Nobody)),
            then: None,
            turn: None,
        }
    }

    /// The schedule of a collective that runs on the job's board as
    /// collective `turn` (so a rank it waits for that has gone is an
    /// error, not a hang).
    pub fn on_board(io: Io, turn: Turn, fut: impl Future<Output = R<()>> + Send + 'static) -> Sched {
        Sched { turn: Some(turn), ..Sched::new(io, fut) }
    }

    /// Runs `f` on the state when the collective has succeeded (what a
    /// non-blocking constructor does at its end, e.g. `MPI_Comm_idup`
    /// registering the new communicator).
    pub fn then(mut self, f: impl FnOnce(&mut State) + Send + 'static) -> Sched {
        self.then = Some(Box::new(f));
        self
    }

    /// Advances as far as it can without waiting: `Some` with the
    /// collective's result once it has finished.
    pub fn poll(&mut self, st: &mut State) -> Option<R<()>> {
        loop {
            let mut cx = Context::from_waker(&self.waker);
            if let Poll::Ready(r) = self.fut.as_mut().poll(&mut cx) {
                self.abandon(st);
                if let (Ok(()), Some(f)) = (&r, self.then.take()) {
                    f(st);
                }
                return Some(r);
            }
            let queued = std::mem::take(&mut self.io.shared().queued);
            let mut moved = !queued.is_empty();
            for (k, a) in queued {
                match begin(st, a) {
                    Ok(id) => self.inflight.push((k, id)),
                    Err(e) => {
                        self.io.shared().results.insert(k, Err(e));
                    }
                }
            }
            let mut i = 0;
            while i < self.inflight.len() {
                let (k, id) = self.inflight[i];
                let r = match st.eng.is_done(id) {
                    Ok(false) => {
                        i += 1;
                        continue;
                    }
                    Ok(true) => st.eng.finish(id).map(|(_, b)| b).map_err(MpiErr::from),
                    Err(e) => Err(e.into()),
                };
                self.inflight.swap_remove(i);
                self.io.shared().results.insert(k, r);
                moved = true;
            }
            if !moved {
                return None;
            }
        }
    }

    /// Fails with the error of a peer that has gone while an operation of
    /// this schedule waits for it.
    pub fn check(&self, st: &State) -> R<()> {
        for &(_, id) in &self.inflight {
            st.eng.check_needed(id)?;
        }
        if let Some(t) = &self.turn {
            for r in t.board().missing(t.k) {
                if let Some(e) = st.eng.peer_gone(r) {
                    return Err(e.into());
                }
            }
        }
        Ok(())
    }

    /// An algorithm that ended early (an error) leaves operations behind:
    /// receives are cancelled, sends complete on their own and are dropped.
    fn abandon(&mut self, st: &mut State) {
        for (_, id) in self.inflight.drain(..) {
            if st.eng.cancel(id).is_ok() && st.eng.is_done(id).unwrap_or(false) {
                let _ = st.eng.finish(id);
            }
        }
    }
}

/// Starts one operation on the engine.
fn begin(st: &mut State, a: Action) -> R<ReqId> {
    match a {
        Action::Send { to, ctx, tag, bytes } => Ok(st.eng.isend(to, ctx, tag, SendBuf::Owned(bytes), false)?),
        Action::Recv { from, ctx, tag, cap } => {
            Ok(st.eng.irecv(Pattern { ctx, src: Some(from), tag: Some(tag) }, RecvBuf::Packed { cap })?)
        }
        Action::Bad(r, n) => err(MPI_ERR_INTERN, format!("a collective names rank {r} of a group of {n}")),
    }
}

/// A collective's turn on the job's board ([`crate::board`]): the
/// awaits an algorithm makes there.
#[derive(Clone)]
pub struct Turn {
    board: Arc<Mutex<Board>>,
    /// The collective's number on the board.
    pub k: u64,
}

impl Turn {
    /// The next turn on `st`'s board for a collective on `comm` that puts
    /// `len` bytes per rank there; `None` when it does not go on the board
    /// (no board, another communicator, too much data, or persistent).
    pub fn take(st: &mut State, comm: MPI_Comm, len: usize) -> Option<Turn> {
        if comm != MPI_COMM_WORLD || len > board::DATA_MAX || st.tags.persistent() {
            return None;
        }
        let board = st.board.clone().ok()?;
        let k = board.lock().unwrap_or_else(|e| e.into_inner()).take();
        Some(Turn { board, k })
    }

    fn board(&self) -> std::sync::MutexGuard<'_, Board> {
        self.board.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes our `data` when our turn comes.
    pub async fn post(&self, data: &[u8]) {
        std::future::poll_fn(|_| {
            let mut b = self.board();
            if b.may_post(self.k) {
                b.post(self.k, data);
                Poll::Ready(())
            } else {
                b.waits(self.k);
                Poll::Pending
            }
        })
        .await
    }

    /// Waits until `ready` says so, noting the wait on the board (so that
    /// a lost store is asked for again).
    async fn until(&self, ready: impl Fn(&Board) -> bool) {
        std::future::poll_fn(|_| {
            let mut b = self.board();
            if ready(&b) {
                Poll::Ready(())
            } else {
                b.waits(self.k);
                Poll::Pending
            }
        })
        .await
    }

    /// Waits until every rank has written this collective.
    pub async fn all(&self) {
        self.until(|b| b.missing(self.k).is_empty()).await
    }

    /// Waits until rank `r` has written this collective.
    pub async fn from(&self, r: u32) {
        self.until(|b| b.arrived(r, self.k)).await
    }

    /// The `len` bytes rank `r` wrote (once it has).
    pub fn data(&self, r: u32, len: usize) -> Vec<u8> {
        self.board().data(r, self.k, len)
    }

    /// We have read all we need of this collective.
    pub fn finish(&self) {
        self.board().finish(self.k);
    }
}

/// How a persistent collective builds its schedule at each `MPI_Start`.
pub type Recipe = dyn Fn(&mut State) -> R<Sched> + Send;

/// A blocking call that has waited this long prints what it waits for
/// (once): for a collective the board's state, for a point-to-point wait
/// its request and the zero-copy transfers in flight; every link's state.
/// `MCMPI_STALL_REPORT` (seconds), else 60 s.
fn stall_report() -> std::time::Duration {
    static AFTER: std::sync::OnceLock<std::time::Duration> = std::sync::OnceLock::new();
    *AFTER.get_or_init(|| {
        let secs = std::env::var("MCMPI_STALL_REPORT").ok().and_then(|v| v.parse::<f64>().ok());
        match secs {
            Some(s) if s >= 0.0 => std::time::Duration::try_from_secs_f64(s).unwrap_or(std::time::Duration::MAX),
            _ => std::time::Duration::from_secs(60),
        }
    })
}

/// Watches one blocking wait: [`StallWatch::check`] reports on stderr,
/// once, when it has lasted [`stall_report`].
pub struct StallWatch {
    t0: std::time::Instant,
    reported: bool,
    /// Idle polls so far: the clock is read every [`STALL_POLLS`]th.
    polls: u32,
}

/// How many idle polls go by between two looks at the clock.
const STALL_POLLS: u32 = 128;

impl Default for StallWatch {
    fn default() -> StallWatch {
        StallWatch { t0: std::time::Instant::now(), reported: false, polls: 0 }
    }
}

impl StallWatch {
    /// Reports `what` (with every link's state) if this wait has lasted.
    pub fn check(&mut self, st: &State, what: impl FnOnce(&State) -> String) {
        self.polls = self.polls.wrapping_add(1);
        if !self.reported && self.polls % STALL_POLLS == 0 && self.t0.elapsed() > stall_report() {
            self.reported = true;
            eprintln!(
                "mcmpi: rank {}: has waited {:.0} s in {}\n{}",
                st.place.rank,
                self.t0.elapsed().as_secs_f64(),
                what(st),
                st.eng.describe_links()
            );
        }
    }
}

/// Runs a collective to its end (the blocking collectives).
pub fn run(st: &mut State, mut s: Sched) -> R<()> {
    let mut idle = 0;
    let mut watch = StallWatch::default();
    loop {
        if let Some(r) = s.poll(st) {
            return r;
        }
        watch.check(st, board_state);
        if progress(st)? {
            idle = 0;
        } else {
            s.check(st)?;
            if s.turn.is_some() {
                board_backoff(&mut idle);
            } else {
                backoff(&mut idle);
            }
        }
    }
}

/// What a blocking collective waits for: the board's state.
fn board_state(st: &State) -> String {
    let board = match &st.board {
        Ok(b) => b.lock().unwrap_or_else(|e| e.into_inner()).describe(),
        Err(e) => format!("no board: {e}"),
    };
    format!("a collective; {board}")
}

/// One round of progress: the engine, then every non-blocking collective
/// in flight (finished ones complete their requests). True when anything
/// moved.
pub fn progress(st: &mut State) -> R<bool> {
    let mut moved = st.eng.progress()?;
    board_repair(st)?;
    if st.scheds.is_empty() {
        return Ok(moved);
    }
    let mut scheds = std::mem::take(&mut st.scheds);
    scheds.retain(|&h, s| {
        let Some(r) = s.poll(st) else { return true };
        moved = true;
        if let Some(p) = st.reqs.get_mut(&h) {
            if p.detached {
                st.reqs.remove(&h);
            } else {
                p.coll = false;
                p.status = Some(p2p::empty_status());
                p.failed = r.err();
            }
        }
        false
    });
    st.scheds.extend(scheds);
    Ok(moved)
}

/// The board's lost stores (`crate::board`, "Lost stores"): stores our
/// slot again when another rank asked, and asks the ranks we have waited
/// too long for.
fn board_repair(st: &mut State) -> R<()> {
    let Ok(board) = &st.board else { return Ok(()) };
    let ask = {
        let mut b = board.lock().unwrap_or_else(|e| e.into_inner());
        if st.eng.take_repost_asked() {
            b.repost();
        }
        b.overdue()
    };
    for r in ask {
        st.eng.ask_repost(r)?;
    }
    Ok(())
}

/// Starts schedule `s` as request `h` (already in `st.reqs`, marked
/// `coll`), moving it as far as it goes at once.
pub fn start(st: &mut State, h: MPI_Request, s: Sched) -> R<()> {
    st.scheds.insert(h, s);
    progress(st)?;
    Ok(())
}
