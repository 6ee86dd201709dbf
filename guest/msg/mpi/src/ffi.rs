//! The C entry points of `libmpi_abi.so.1`: every `PMPI_X` (with its weak
//! `MPI_X` alias, [`crate::weak_alias!`]) checks its arguments, maps the
//! ABI's handles to the runtime's objects and calls the engine.
//!
//! - this module: the process's MPI state (one lock: MPI is
//!   `MPI_THREAD_SERIALIZED`), handles, error handling;
//! - [`env`]: init, finalize, abort, the environment queries;
//! - [`comm`]: communicators and groups;
//! - [`p2p`]: sends, receives, probes, requests and their completion;
//! - [`coll`]: the collectives; [`sched`]: the schedules they run as;
//! - [`types`]: datatype and operation handles;
//! - [`attr`]: attribute caching; [`topo`]: Cartesian and graph
//!   topologies; [`info`]: info objects and `MPI_Alloc_mem`;
//! - [`win`]: one-sided communication (windows, put, get, accumulates
//!   and their synchronisation);
//! - [`handles`]: handles as ints, address arithmetic;
//! - [`missing`]: what is not implemented yet (each fails with
//!   `MPI_ERR_UNSUPPORTED_OPERATION`).
//!
//! Touched by the application's threads, one at a time, under [`STATE`].

// The C signatures take as many arguments as the standard gives them.
#![allow(clippy::too_many_arguments)]

pub mod attr;
pub mod coll;
pub mod comm;
pub mod env;
pub mod handles;
pub mod info;
pub mod missing;
pub mod p2p;
pub mod sched;
pub mod topo;
pub mod types;
pub mod win;

use rustc_hash::FxHashMap as HashMap;
use std::ffi::c_int;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::abi::*;
use crate::datatype::Datatype;
use crate::engine::{Engine, EngineError, ReqId};
use crate::launch::Place;

/// An MPI error: its class and what happened.
#[derive(Debug, Clone)]
pub struct MpiErr {
    /// The error class (`MPI_ERR_*`).
    pub class: c_int,
    /// The message.
    pub msg: String,
}

/// Result of the runtime's functions.
pub type R<T> = Result<T, MpiErr>;

/// An error of class `class`.
pub fn err<T>(class: c_int, msg: impl Into<String>) -> R<T> {
    Err(MpiErr { class, msg: msg.into() })
}

impl From<EngineError> for MpiErr {
    fn from(e: EngineError) -> MpiErr {
        MpiErr { class: MPI_ERR_OTHER, msg: e.to_string() }
    }
}

/// A communicator: a context id pair and its members.
#[derive(Debug, Clone)]
pub struct Comm {
    /// Context of point-to-point traffic; `ctx + 1` carries collectives.
    pub ctx: u32,
    /// World rank of each member, by rank in this communicator.
    pub ranks: Vec<u32>,
    /// Our rank here.
    pub rank: u32,
    /// Its error handler.
    pub errhandler: MPI_Errhandler,
    /// Its name.
    pub name: String,
    /// An intercommunicator's remote group (world ranks); `None` for an
    /// intracommunicator.
    pub remote: Option<Vec<u32>>,
    /// An intercommunicator's local group as an intracommunicator of its
    /// own (a hidden handle), for the local steps of its collectives and
    /// constructors; `MPI_COMM_NULL` for an intracommunicator.
    pub local: MPI_Comm,
}

impl Comm {
    /// An intracommunicator.
    pub fn intra(ctx: u32, ranks: Vec<u32>, rank: u32, errhandler: MPI_Errhandler) -> Comm {
        Comm { ctx, ranks, rank, errhandler, name: String::new(), remote: None, local: MPI_COMM_NULL }
    }
    /// Members (of the local group).
    pub fn size(&self) -> u32 {
        self.ranks.len() as u32
    }
    /// Whether this is an intercommunicator.
    pub fn is_inter(&self) -> bool {
        self.remote.is_some()
    }
    /// The world ranks that point-to-point ranks name: the remote group's
    /// on an intercommunicator, the members' otherwise.
    pub fn peers(&self) -> &[u32] {
        self.remote.as_deref().unwrap_or(&self.ranks)
    }
    /// The point-to-point rank here of world rank `w`.
    pub fn rank_of(&self, w: u32) -> Option<u32> {
        self.peers().iter().position(|&r| r == w).map(|i| i as u32)
    }
}

/// A receive to unpack on completion: buffer address, count, type.
pub type Unpack = (usize, u64, Arc<Datatype>);

/// A request as the C layer tracks it.
#[derive(Debug)]
pub struct Pending {
    /// The engine's request (`None`: done from the start, e.g. `MPI_PROC_NULL`).
    pub id: Option<ReqId>,
    /// The communicator (for the status's source).
    pub comm: MPI_Comm,
    /// A non-contiguous receive to unpack on completion.
    pub unpack: Option<Unpack>,
    /// Freed by the user before completion (`MPI_Request_free`,
    /// `MPI_Bsend`): dropped when it completes.
    pub detached: bool,
    /// A persistent request's recipe, restarted by `MPI_Start`.
    pub persistent: Option<p2p::Recipe>,
    /// The status of a request completed without the engine.
    pub status: Option<MPI_Status>,
    /// A non-blocking collective still in flight (its schedule is in
    /// [`State::scheds`]).
    pub coll: bool,
    /// How a non-blocking collective failed.
    pub failed: Option<MpiErr>,
    /// Another request that completes with this one (the send half of
    /// `MPI_Isendrecv`; this one is the receive, whose status counts).
    pub linked: Option<MPI_Request>,
    /// A one-sided operation whose data comes back (`MPI_Rget`,
    /// `MPI_Rget_accumulate`): its reply id ([`crate::rma`]).
    pub rma: Option<u64>,
}

impl Pending {
    /// A request of the engine's (`id`), or one already complete (`None`
    /// with a status).
    pub fn new(id: Option<ReqId>, comm: MPI_Comm, unpack: Option<Unpack>, status: Option<MPI_Status>) -> Pending {
        Pending {
            id,
            comm,
            unpack,
            detached: false,
            persistent: None,
            status,
            coll: false,
            failed: None,
            linked: None,
            rma: None,
        }
    }

    /// A non-blocking collective's request.
    pub fn collective(comm: MPI_Comm) -> Pending {
        Pending { coll: true, ..Pending::new(None, comm, None, None) }
    }
}

/// The process's MPI state.
pub struct State {
    /// The engine.
    pub eng: Engine,
    /// Our place in the job.
    pub place: Place,
    /// Communicators by handle.
    pub comms: HashMap<MPI_Comm, Comm>,
    /// Groups by handle (world ranks).
    pub groups: HashMap<MPI_Group, Vec<u32>>,
    /// Datatypes by handle (predefined ones included).
    pub types: HashMap<MPI_Datatype, Arc<Datatype>>,
    /// User operations by handle.
    pub ops: HashMap<MPI_Op, types::UserOp>,
    /// Requests by handle.
    pub reqs: HashMap<MPI_Request, Pending>,
    /// User error handlers.
    pub errhandlers: HashMap<MPI_Errhandler, comm::UserErrhandler>,
    next_handle: usize,
    next_ctx: u32,
    /// Thread level granted.
    pub thread_level: c_int,
    /// The thread that called `MPI_Init`.
    pub main_thread: std::thread::ThreadId,
    /// The attached buffer for `MPI_Bsend` (address, bytes).
    pub buffer: Option<(usize, usize)>,
    /// Keyvals and cached attributes.
    pub attrs: attr::Attrs,
    /// Info objects by handle.
    pub infos: HashMap<MPI_Info, Vec<(String, String)>>,
    /// Topologies by communicator.
    pub topos: HashMap<MPI_Comm, topo::Topo>,
    /// Persistent requests' datatypes, kept alive for their restarts.
    pub kept_types: HashMap<MPI_Request, Arc<Datatype>>,
    /// Messages taken by `MPI_Mprobe`, with their communicator.
    pub messages: HashMap<MPI_Message, (crate::engine::Matched, MPI_Comm)>,
    /// The next collective tag of each collective context.
    pub coll_seq: HashMap<u32, i32>,
    /// Non-blocking collectives in flight, by request.
    pub scheds: HashMap<MPI_Request, sched::Sched>,
    /// Hints set on communicators (`MPI_Comm_set_info`).
    pub comm_infos: HashMap<MPI_Comm, Vec<(String, String)>>,
    /// Persistent collectives, by request.
    pub coll_recipes: HashMap<MPI_Request, sched::Persistent>,
    /// Collective tags a persistent collective's init records or its start
    /// replays.
    pub tags: sched::TagLog,
    /// Windows by handle.
    pub wins: HashMap<MPI_Win, win::Window>,
    /// The job's billboard, when every rank has one ([`crate::board`]),
    /// else why not (for `MCMPI_STATS`).
    pub board: Result<Arc<Mutex<crate::board::Board>>, String>,
}

impl State {
    /// A fresh handle at or above [`FIRST_RUNTIME_HANDLE`].
    pub fn handle(&mut self) -> usize {
        let h = self.next_handle;
        self.next_handle += 16;
        h
    }

    /// The communicator of handle `c`.
    pub fn comm(&self, c: MPI_Comm) -> R<&Comm> {
        match self.comms.get(&c) {
            Some(x) => Ok(x),
            None if c == MPI_COMM_NULL => err(MPI_ERR_COMM, "MPI_COMM_NULL"),
            None => err(MPI_ERR_COMM, format!("{c:#x} is not a communicator")),
        }
    }

    /// The datatype of handle `t`.
    pub fn dtype(&self, t: MPI_Datatype) -> R<Arc<Datatype>> {
        match self.types.get(&t) {
            Some(x) => Ok(x.clone()),
            None if t == MPI_DATATYPE_NULL => err(MPI_ERR_TYPE, "MPI_DATATYPE_NULL"),
            None => err(MPI_ERR_TYPE, format!("{t:#x} is not a datatype")),
        }
    }

    /// A new block of context ids agreed by every member of `parent`
    /// (collective over it; over both groups of an intercommunicator): the
    /// largest next id any member has. A block is [`CTX_BLOCK`] ids: point
    /// to point, collectives, and the same two for an intercommunicator's
    /// local group.
    pub fn agree_ctx(&mut self, parent: MPI_Comm) -> R<u32> {
        let mine = self.next_ctx as u64;
        let local = match self.comm(parent)? {
            c if c.is_inter() => c.local,
            _ => parent,
        };
        let all = coll::allgather_u64(self, local, &[mine])?;
        let mut ctx = all.into_iter().max().unwrap_or(mine);
        if local != parent {
            let theirs = coll::inter_exchange(self, parent, vec![ctx])?;
            ctx = ctx.max(theirs.first().copied().unwrap_or(0));
        }
        let ctx = ctx as u32;
        self.next_ctx = ctx + CTX_BLOCK;
        Ok(ctx)
    }
}

/// Context ids each communicator takes ([`State::agree_ctx`]).
pub const CTX_BLOCK: u32 = 4;

/// The process's MPI state: `None` before `MPI_Init` and after `MPI_Finalize`.
pub static STATE: Mutex<Option<State>> = Mutex::new(None);

/// Whether `MPI_Finalize` has run.
pub static FINALIZED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn lock() -> MutexGuard<'static, Option<State>> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `f` on the initialised state; `MPI_ERR_OTHER` before init.
pub fn with<T>(f: impl FnOnce(&mut State) -> R<T>) -> R<T> {
    let mut g = lock();
    match g.as_mut() {
        Some(st) => f(st),
        None => err(MPI_ERR_OTHER, "MPI is not initialised (call MPI_Init first)"),
    }
}

/// The error handler in force for communicator `c` (the world's when `c`
/// is not a communicator).
fn handler_of(c: MPI_Comm) -> MPI_Errhandler {
    let g = lock();
    let Some(st) = g.as_ref() else { return MPI_ERRORS_ARE_FATAL };
    st.comms.get(&c).or_else(|| st.comms.get(&MPI_COMM_WORLD)).map_or(MPI_ERRORS_ARE_FATAL, |x| x.errhandler)
}

/// Turns a result into the C return code, applying communicator `c`'s
/// error handler: fatal ones print and end the job, `MPI_ERRORS_RETURN`
/// returns the class, a user handler is called first.
pub fn ret(func: &str, c: MPI_Comm, r: R<()>) -> c_int {
    let Err(e) = r else { return MPI_SUCCESS };
    handle_error(func, handler_of(c), c, e)
}

/// Applies error handler `h` of object `obj` (a communicator or a
/// window) to error `e` of `func`: returns the class, after calling a
/// user handler, or ends the job for the fatal ones.
pub fn handle_error(func: &str, h: MPI_Errhandler, obj: usize, e: MpiErr) -> c_int {
    if h == MPI_ERRORS_RETURN {
        return e.class;
    }
    if h != MPI_ERRORS_ARE_FATAL && h != MPI_ERRORS_ABORT {
        if let Some(f) = comm::user_handler(h) {
            let mut comm = obj;
            let mut code = e.class;
            // SAFETY: a handler the user registered with
            // MPI_Comm_create_errhandler, called as the standard says.
            unsafe { f(&mut comm, &mut code) };
            return e.class;
        }
    }
    let rank = lock().as_ref().map_or(0, |s| s.place.rank);
    eprintln!("MPI error in {func} (rank {rank}): {} ({})", e.msg, env::class_name(e.class));
    eprintln!("MPI: rank {rank} ends the job");
    env::abort_process(1)
}

/// A null pointer argument error.
pub fn nonnull<T>(p: *const T, what: &str) -> R<()> {
    if p.is_null() {
        return err(MPI_ERR_ARG, format!("{what} is NULL"));
    }
    Ok(())
}

/// A negative count error.
pub fn count_ok(n: c_int) -> R<u64> {
    u64::try_from(n).map_err(|_| MpiErr { class: MPI_ERR_COUNT, msg: format!("count {n} is negative") })
}

/// Stores `v` through the caller's pointer `p` (an `MPI_ERR_ARG` if null).
///
/// # Safety
/// `p` is null or points to a writable `T` (alignment not needed), as the
/// MPI standard requires of an output argument.
pub(crate) unsafe fn put<T>(p: *mut T, v: T, what: &str) -> R<()> {
    nonnull(p, what)?;
    // SAFETY: `p` is not null and points to a writable `T` (this
    // function's contract).
    unsafe { p.write_unaligned(v) };
    Ok(())
}

/// Reads the caller's array of `n` values at `p`.
///
/// # Safety
/// When `n` > 0, `p` is null or points to `n` readable values of `T`
/// (alignment not needed), as the MPI standard requires of an array
/// argument.
pub(crate) unsafe fn array<T: Copy>(p: *const T, n: usize, what: &str) -> R<Vec<T>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    nonnull(p, what)?;
    // SAFETY: `p` is not null and points to `n` values (this function's
    // contract).
    Ok((0..n).map(|i| unsafe { p.add(i).read_unaligned() }).collect())
}

/// Declares `PMPI_X` with the body given (a closure returning [`R`]), its
/// error handling through communicator `comm` (`comm(c)`) or window `w`
/// (`win(w)`), and its weak alias `MPI_X`.
///
/// The body runs in an unsafe block: it is the whole of an `unsafe extern
/// "C"` function whose contract is the MPI standard's for each pointer
/// argument, and what it does with them is call the helpers that read or
/// write through a caller's pointer (`put`, `array`, `put_str`, `text`,
/// `put_status`, ...), each an `unsafe fn` that says what it needs.
#[macro_export]
macro_rules! entry {
    ($mpi:ident / $pmpi:ident ( $($a:ident : $t:ty),* $(,)? ) $how:ident($c:expr) $body:block) => {
        #[doc = concat!("`", stringify!($mpi), "` (see the MPI standard).")]
        ///
        /// # Safety
        /// Pointer arguments must be what the MPI standard requires.
        #[no_mangle]
        #[allow(unused_unsafe, clippy::macro_metavars_in_unsafe)]
        pub unsafe extern "C" fn $pmpi($($a: $t),*) -> ::std::ffi::c_int {
            #[allow(clippy::redundant_closure_call)]
            let r: $crate::ffi::R<()> = (|| {
                // SAFETY: the caller's pointer arguments are what the MPI
                // standard requires of this call (this function's
                // contract), which is what the helpers that read or write
                // through them (`put`, `array`, `put_str`, ...) ask of them.
                unsafe { $body }
            })();
            // SAFETY: as above (a window handle may be read through one).
            let handler = unsafe { $c };
            $crate::ret_through!($how, stringify!($mpi), handler, r)
        }
        $crate::weak_alias!($mpi, $pmpi);
    };
}

/// The C return code of a result, through the error handler of the
/// communicator (`comm`) or window (`win`) an [`entry!`] names.
#[macro_export]
macro_rules! ret_through {
    (comm, $func:expr, $c:expr, $r:expr) => {
        $crate::ffi::ret($func, $c, $r)
    };
    (win, $func:expr, $w:expr, $r:expr) => {
        $crate::ffi::win::ret_win($func, $w, $r)
    };
}
