//! Init, finalize, abort and the environment queries (`MPI_Wtime`,
//! `MPI_Get_processor_name`, error strings, thread levels).

use rustc_hash::FxHashMap as HashMap;
use std::ffi::{c_char, c_double, c_int};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::datatype::{Basic, Datatype, Pair};
use crate::entry;
use crate::launch::Place;
use crate::transport::{connect_all, lazy_links};
use imc_client::layout::ENTRIES;

/// How long `MPI_Init` waits for the channels to the other ranks (or,
/// opened on first use, a first send for its channel).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(120);

/// How long `MPI_Finalize` waits for the other ranks' goodbyes.
const GOODBYE_LIMIT: Duration = Duration::from_secs(60);

static T0: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

/// Ends this process with `code` after flushing C's stdio (the launcher
/// ends the other ranks).
pub fn abort_process(code: c_int) -> ! {
    std::process::exit(code)
}

/// The predefined datatypes by handle.
fn predefined_types() -> HashMap<MPI_Datatype, Arc<Datatype>> {
    let mut m = HashMap::default();
    for &(name, h) in DATATYPES.iter().chain(DATATYPE_ALIASES.iter()) {
        if h == MPI_DATATYPE_NULL {
            continue;
        }
        let t = Basic::ALL
            .iter()
            .find(|b| b.name() == name)
            .map(|&b| Datatype::basic(b))
            .or_else(|| Pair::ALL.iter().find(|p| p.name() == name).map(|&p| Datatype::pair(p)));
        if let Some(t) = t {
            m.insert(h, Arc::new(t));
        }
    }
    m
}

fn init(level: c_int) -> R<c_int> {
    let mut g = STATE.lock().unwrap_or_else(|e| e.into_inner());
    if g.is_some() || FINALIZED.load(Ordering::SeqCst) {
        return err(MPI_ERR_OTHER, "MPI_Init called twice");
    }
    T0.get_or_init(Instant::now);
    let place = Place::from_env().map_err(|e| MpiErr { class: MPI_ERR_OTHER, msg: e.to_string() })?;
    let mut trace = InitTrace::new(place.rank);
    let mut zcopy_bytes = 0;
    let links = if place.size > 1 {
        let var = |v: &str| std::env::var(v).ok();
        let cfg = crate::launch::Guest::from_system(var)
            .and_then(|guest| crate::launch::ump_config(place.size, guest, var))
            .map_err(|e| MpiErr { class: MPI_ERR_OTHER, msg: e.to_string() })?;
        zcopy_bytes = cfg.dma_spare;
        let frames = (ump::ring::room(cfg.shm_buffer), ump::ring::room(cfg.mc_buffer));
        // Where every rank runs (mpiexec says), and whether channels then
        // open on first use (docs/ump.md, "Channels of a job").
        let launch_err = |e: crate::launch::LaunchError| MpiErr { class: MPI_ERR_OTHER, msg: e.to_string() };
        let nodes = var("MCMPI_NODES").map(|v| crate::launch::nodes_from_var(&v, place.size)).transpose();
        let lazy = var("MCMPI_LAZY");
        let nodes = match nodes.map_err(launch_err)? {
            Some(n) if crate::launch::opens_on_first_use(&n, lazy.as_deref(), ENTRIES).map_err(launch_err)? => Some(n),
            _ => None,
        };
        ump::init(cfg).map_err(|e| MpiErr { class: MPI_ERR_OTHER, msg: format!("UMP: {e}") })?;
        trace.mark("UMP started");
        let (links, done) = match nodes {
            Some(nodes) => (
                lazy_links(place.rank, &nodes, |r| place.handle(r), frames, CONNECT_TIMEOUT),
                "listening (channels open on first use)",
            ),
            None => (
                connect_all(place.rank, place.size, |r| place.handle(r), CONNECT_TIMEOUT),
                "channels to every rank open",
            ),
        };
        trace.mark(done);
        links.map_err(|e| MpiErr { class: MPI_ERR_OTHER, msg: e.to_string() })?
    } else {
        vec![None]
    };
    let mut eng = Engine::new(place.rank, links);
    let remote = eng.remote_ranks();
    // The zero-copy memory is UMP's DMA spare, as fitted to the guest.
    if zcopy_bytes > 0 && remote.iter().any(|&r| r) {
        eng.set_direct(Box::new(crate::zcopy::Zcopy::new(place.job, remote, zcopy_bytes)));
    }
    if let Some(n) = std::env::var("MCMPI_EAGER_LIMIT").ok().and_then(|v| v.parse().ok()) {
        eng.set_eager_limit(n);
    }
    if let Ok(v) = std::env::var("MCMPI_UNEXPECTED") {
        match ump::parse_size(&v) {
            Some(n) => eng.set_unexpected_limit(n),
            None => return err(MPI_ERR_OTHER, format!("MCMPI_UNEXPECTED={v:?}: a size like 16M")),
        }
    }
    let world = Comm {
        name: "MPI_COMM_WORLD".into(),
        ..Comm::intra(0, (0..place.size).collect(), place.rank, MPI_ERRORS_ARE_FATAL)
    };
    let me = Comm { name: "MPI_COMM_SELF".into(), ..Comm::intra(CTX_BLOCK, vec![place.rank], 0, MPI_ERRORS_ARE_FATAL) };
    let granted = level.min(MPI_THREAD_SERIALIZED);
    *g = Some(State {
        eng,
        place,
        comms: HashMap::from_iter([(MPI_COMM_WORLD, world), (MPI_COMM_SELF, me)]),
        groups: HashMap::default(),
        types: predefined_types(),
        ops: HashMap::default(),
        reqs: HashMap::default(),
        errhandlers: HashMap::default(),
        next_handle: FIRST_RUNTIME_HANDLE,
        next_ctx: 2 * CTX_BLOCK,
        thread_level: granted,
        main_thread: std::thread::current().id(),
        buffer: None,
        attrs: Default::default(),
        infos: HashMap::default(),
        topos: HashMap::default(),
        messages: HashMap::default(),
        kept_types: HashMap::default(),
        coll_seq: HashMap::default(),
        scheds: HashMap::default(),
        coll_recipes: HashMap::default(),
        tags: Default::default(),
        comm_infos: HashMap::default(),
        wins: HashMap::default(),
        board: Err("a job of one rank".into()),
    });
    if let Some(st) = g.as_mut() {
        open_board(st)?;
    }
    trace.mark("board agreed");
    trace.done();
    Ok(granted)
}

/// `MCMPI_TRACE=1` (or `MPIEXEC_TRACE=1`): where `MPI_Init`'s time goes, one line a rank on
/// stderr at its end (milliseconds since the process started, and each
/// phase's share).
struct InitTrace {
    rank: u32,
    on: bool,
    last: Instant,
    parts: Vec<(&'static str, Duration)>,
}

impl InitTrace {
    fn new(rank: u32) -> InitTrace {
        let on = ["MCMPI_TRACE", "MPIEXEC_TRACE"].iter().any(|k| std::env::var(k).is_ok_and(|v| v.trim() == "1"));
        InitTrace { rank, on, last: Instant::now(), parts: Vec::new() }
    }

    fn mark(&mut self, what: &'static str) {
        self.parts.push((what, self.last.elapsed()));
        self.last = Instant::now();
    }

    fn done(&self) {
        if !self.on {
            return;
        }
        // The process's age, from /proc/self/stat's start time (clock ticks
        // since boot) and the uptime.
        let age = process_age_ms().map_or_else(|| "?".to_string(), |ms| format!("{ms:.0}"));
        let parts: Vec<String> =
            self.parts.iter().map(|(w, d)| format!("{w} +{:.0} ms", d.as_secs_f64() * 1e3)).collect();
        eprintln!(
            "mcmpi init: rank {}: MPI_Init returns {age} ms after the process started: {}",
            self.rank,
            parts.join(", ")
        );
    }
}

/// Milliseconds since this process started.
fn process_age_ms() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let after = stat.rsplit_once(')')?.1;
    let start: f64 = after.split_whitespace().nth(19)?.parse().ok()?;
    let up: f64 = std::fs::read_to_string("/proc/uptime").ok()?.split_whitespace().next()?.parse().ok()?;
    // SAFETY: sysconf with a valid name has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some((up - start / hz) * 1e3)
}

/// Opens the job's billboard (`crate::board`) when every rank can: the
/// ranks agree over point-to-point first, so either all use it or none.
/// `MCMPI_BOARD=0` turns it off.
fn open_board(st: &mut State) -> R<()> {
    let p = st.place;
    if p.size < 2 {
        return Ok(());
    }
    let mine = if std::env::var("MCMPI_BOARD").is_ok_and(|v| v.trim() == "0") {
        Err("MCMPI_BOARD=0".to_string())
    } else {
        crate::board::open(p.job, p.rank, p.size).map_err(|e| e.to_string())
    };
    let all = coll::allgather_u64(st, MPI_COMM_WORLD, &[mine.is_ok() as u64])?;
    st.board = match mine {
        Ok(b) if all.iter().all(|&ok| ok == 1) => Ok(Arc::new(std::sync::Mutex::new(b))),
        Ok(_) => {
            let off: Vec<String> =
                all.iter().enumerate().filter(|(_, &ok)| ok == 0).map(|(r, _)| r.to_string()).collect();
            Err(format!("rank(s) {} have none", off.join(",")))
        }
        Err(e) => Err(e),
    };
    Ok(())
}

/// With `MCMPI_STATS` set, what this rank did, on standard error at
/// `MPI_Finalize`.
fn print_stats(st: &State) {
    if std::env::var_os("MCMPI_STATS").is_none() {
        return;
    }
    let s = &st.eng.stats;
    let board = match &st.board {
        Ok(b) => {
            let b = b.lock().unwrap_or_else(|e| e.into_inner());
            format!(
                "{} collectives on the board, {} board slot stores again, {} asks for them",
                b.count, b.reposts.0, b.reposts.1
            )
        }
        Err(why) => format!("no board ({why})"),
    };
    // MB/s of a (bytes, time) pair.
    let rate = |(b, t): (u64, Duration)| if t.is_zero() { 0.0 } else { b as f64 / t.as_secs_f64() / 1e6 };
    let zero_copy = match st.eng.direct_why_not() {
        Some(why) => format!("no zero copy ({why})"),
        None => format!(
            "{} zero-copy sends, {} bytes sent by zero copy, {} zero-copy offers streamed as data, {} zero-copy receives",
            s.zero_copy.0, s.zero_copy.1, s.zero_copy_streamed, s.zero_copy_in
        ),
    };
    eprintln!(
        "mcmpi stats: rank {}: {} eager, {} rendezvous, {} for want of credit, {} bytes sent, \
         {} unexpected bytes at most, {} bytes of credit per sender, {} data frames read straight into place, \
         data written {} bytes at {:.0} MB/s, data read {} bytes at {:.0} MB/s, \
         {} one-sided operations, {} one-sided frames, {} one-sided operations applied here, \
         {} other ranks, {} with a channel, {zero_copy}, {board}",
        st.place.rank,
        s.eager,
        s.rendezvous,
        s.no_credit,
        s.bytes_out,
        s.unexpected_bytes_peak,
        st.eng.credit_limit(),
        s.direct,
        s.data_out.0,
        rate(s.data_out),
        s.data_in.0,
        rate(s.data_in),
        st.eng.rma_ref().stats.ops,
        st.eng.rma_ref().stats.frames,
        st.eng.rma_ref().stats.applied,
        st.place.size.saturating_sub(1),
        st.eng.links_in_use()
    );
}

/// Leaves the job past its last barrier (`crate::engine`'s `leave`,
/// "Goodbyes"): says goodbye, then serves the other ranks (their repairs,
/// their asks for our board slot) until every one has said goodbye too and
/// taken all we sent, or [`GOODBYE_LIMIT`] passed.
fn goodbye(st: &mut State) -> R<()> {
    st.eng.leave()?;
    let t0 = Instant::now();
    let mut idle = 0;
    while !st.eng.parted() {
        if t0.elapsed() > GOODBYE_LIMIT {
            eprintln!(
                "mcmpi: rank {}: leaves after waiting {} s for the goodbyes of ranks {:?}\n{}",
                st.place.rank,
                GOODBYE_LIMIT.as_secs(),
                st.eng.parting_from(),
                st.eng.describe_links()
            );
            break;
        }
        if sched::progress(st)? {
            idle = 0;
        } else {
            crate::engine::backoff(&mut idle);
        }
    }
    Ok(())
}

entry!(MPI_Init / PMPI_Init(_argc: *mut c_int, _argv: *mut *mut *mut c_char) comm(MPI_COMM_WORLD) {
    init(MPI_THREAD_SINGLE).map(|_| ())
});

entry!(MPI_Init_thread / PMPI_Init_thread(_argc: *mut c_int, _argv: *mut *mut *mut c_char, required: c_int, provided: *mut c_int) comm(MPI_COMM_WORLD) {
    let got = init(required)?;
    put(provided, got, "provided")
});

entry!(MPI_Finalize / PMPI_Finalize() comm(MPI_COMM_WORLD) {
    // As if MPI_COMM_SELF were freed first: its attributes' delete
    // callbacks run (a way for libraries to clean up), then the world's.
    super::attr::drop_all(MPI_COMM_SELF)?;
    super::attr::drop_all(MPI_COMM_WORLD)?;
    // Everything sent is delivered before anyone leaves, and no rank
    // closes its channels while another may still need it.
    with(|st| {
        st.eng.drain()?;
        coll::barrier_now(st, MPI_COMM_WORLD)?;
        goodbye(st)?;
        print_stats(st);
        Ok(())
    })?;
    let st = STATE.lock().unwrap_or_else(|e| e.into_inner()).take();
    FINALIZED.store(true, Ordering::SeqCst);
    drop(st);
    let _ = ump::exit();
    Ok(())
});

entry!(MPI_Initialized / PMPI_Initialized(flag: *mut c_int) comm(MPI_COMM_WORLD) {
    let on = STATE.lock().unwrap_or_else(|e| e.into_inner()).is_some() || FINALIZED.load(Ordering::SeqCst);
    put(flag, on as c_int, "flag")
});

entry!(MPI_Finalized / PMPI_Finalized(flag: *mut c_int) comm(MPI_COMM_WORLD) {
    put(flag, FINALIZED.load(Ordering::SeqCst) as c_int, "flag")
});

entry!(MPI_Abort / PMPI_Abort(_comm: MPI_Comm, errorcode: c_int) comm(MPI_COMM_WORLD) {
    let rank = STATE.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map_or(0, |s| s.place.rank);
    eprintln!("MPI_Abort: rank {rank} ends the job with code {errorcode}");
    abort_process(if errorcode == 0 { 1 } else { errorcode })
});

entry!(MPI_Query_thread / PMPI_Query_thread(provided: *mut c_int) comm(MPI_COMM_WORLD) {
    let l = with(|st| Ok(st.thread_level))?;
    put(provided, l, "provided")
});

entry!(MPI_Is_thread_main / PMPI_Is_thread_main(flag: *mut c_int) comm(MPI_COMM_WORLD) {
    let main = with(|st| Ok(st.main_thread == std::thread::current().id()))?;
    put(flag, main as c_int, "flag")
});

/// Copies `s` into the caller's `char` buffer of `cap` bytes, NUL ended,
/// and stores the length (without the NUL) in `len`.
///
/// # Safety
/// `dst` is null or points to `cap` writable chars (the MPI_MAX_* constant
/// of the call); `len` is null or points to a writable `int`.
pub(crate) unsafe fn put_str(dst: *mut c_char, cap: usize, s: &str, len: *mut c_int) -> R<()> {
    nonnull(dst, "string buffer")?;
    let n = s.len().min(cap.saturating_sub(1));
    // SAFETY: `dst` is not null and holds `cap` chars (this function's
    // contract); n + 1 <= cap.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), dst as *mut u8, n);
        *dst.add(n) = 0;
    }
    if !len.is_null() {
        // SAFETY: `len` points to an `int` (this function's contract).
        unsafe { put(len, n as c_int, "resultlen")? };
    }
    Ok(())
}

fn hostname() -> String {
    nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_else(|| "localhost".into())
}

entry!(MPI_Get_processor_name / PMPI_Get_processor_name(name: *mut c_char, resultlen: *mut c_int) comm(MPI_COMM_WORLD) {
    put_str(name, MPI_MAX_PROCESSOR_NAME as usize, &hostname(), resultlen)
});

/// What `MPI_Get_library_version` reports.
pub const LIBRARY_VERSION: &str =
    concat!("MEMORY CHANNEL MPI ", env!("CARGO_PKG_VERSION"), " (MPI 5.0 standard ABI, over UMP)");

entry!(MPI_Get_library_version / PMPI_Get_library_version(version: *mut c_char, resultlen: *mut c_int) comm(MPI_COMM_WORLD) {
    put_str(version, MPI_MAX_LIBRARY_VERSION_STRING as usize, LIBRARY_VERSION, resultlen)
});

/// `MPI_Wtime`: seconds since the first `MPI_Init` (or first call).
#[no_mangle]
pub extern "C" fn PMPI_Wtime() -> c_double {
    T0.get_or_init(Instant::now).elapsed().as_secs_f64()
}
crate::weak_alias!(MPI_Wtime, PMPI_Wtime);

/// `MPI_Wtick`: the resolution of [`PMPI_Wtime`].
#[no_mangle]
pub extern "C" fn PMPI_Wtick() -> c_double {
    1e-9
}
crate::weak_alias!(MPI_Wtick, PMPI_Wtick);

/// The name of error class `c`.
pub fn class_name(c: c_int) -> &'static str {
    ERROR_CLASSES.iter().find(|e| e.1 == c).map_or("unknown error class", |e| e.0)
}

fn error_text(c: c_int) -> String {
    let what = match c {
        x if x == MPI_SUCCESS => "no error",
        x if x == MPI_ERR_BUFFER => "invalid buffer pointer",
        x if x == MPI_ERR_COUNT => "invalid count argument",
        x if x == MPI_ERR_TYPE => "invalid datatype",
        x if x == MPI_ERR_TAG => "invalid tag",
        x if x == MPI_ERR_COMM => "invalid communicator",
        x if x == MPI_ERR_RANK => "invalid rank",
        x if x == MPI_ERR_REQUEST => "invalid request",
        x if x == MPI_ERR_ROOT => "invalid root",
        x if x == MPI_ERR_GROUP => "invalid group",
        x if x == MPI_ERR_OP => "invalid operation",
        x if x == MPI_ERR_ARG => "invalid argument",
        x if x == MPI_ERR_TRUNCATE => "message truncated",
        x if x == MPI_ERR_PENDING => "pending request",
        x if x == MPI_ERR_IN_STATUS => "error code is in status",
        x if x == MPI_ERR_UNSUPPORTED_OPERATION => "operation not supported by this library yet",
        x if x == MPI_ERR_INTERN => "internal error",
        _ => "error",
    };
    format!("{what} ({})", class_name(c))
}

entry!(MPI_Error_string / PMPI_Error_string(errorcode: c_int, string: *mut c_char, resultlen: *mut c_int) comm(MPI_COMM_WORLD) {
    put_str(string, MPI_MAX_ERROR_STRING as usize, &error_text(errorcode), resultlen)
});

entry!(MPI_Error_class / PMPI_Error_class(errorcode: c_int, errorclass: *mut c_int) comm(MPI_COMM_WORLD) {
    if !ERROR_CLASSES.iter().any(|e| e.1 == errorcode) {
        return err(MPI_ERR_ARG, format!("{errorcode} is not an error code"));
    }
    put(errorclass, errorcode, "errorclass")
});
