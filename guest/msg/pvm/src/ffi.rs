//! The C interface: every `pvm_*` call of `pvm3.h`, the data symbols PVM
//! programs reach (`pvm_errno`, `pvm_errlist`, `pvm_nerr`, ...), and the
//! few internal calls Debian's example programs import (`pvmsleep`,
//! `pvmgetclock`, `lpvmerr`, ...). A call that is not implemented returns
//! `PvmNotImpl` (docs/pvm.md lists them).
//!
//! The task's state is one [`Pvm`] behind one lock, made by the first call
//! that needs it (PVM enrolls a task on its first call).

use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::ffi::{c_char, c_int, c_long, c_void, CStr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::consts::{self, err, opt};
use crate::daemon;
use crate::engine::{self, Engine, EngineError};
use crate::group::{self, Arrival, GroupTable};
use crate::mbox::{self, Mailbox, MboxError};
use crate::mhf::{self, Handlers};
use crate::notify::{self, Notify};
use crate::output::{self, Collector};
use crate::pack::{Buffer, InPlace};
use crate::reduce::{self, Op};
use crate::spawn;
use crate::table::{self, State, Table, TableError};

/// One task's PVM.
pub struct Pvm {
    pub(crate) table: Table,
    pub(crate) groups: GroupTable,
    pub(crate) notify: Notify,
    pub(crate) mbox: Mailbox,
    /// Message handlers, and the messages they claimed that wait for
    /// their handler to run (outside the state lock).
    handlers: Handlers,
    mhf_due: VecDeque<(mhf::HandlerFn, engine::Msg)>,
    /// When this task last sent the notifications that were due.
    looked: Instant,
    pub(crate) host: u32,
    pub(crate) me: i32,
    ptid: i32,
    siblings: Vec<c_int>,
    pub(crate) eng: Engine,
    bufs: HashMap<c_int, Buffer>,
    next_buf: c_int,
    sbuf: c_int,
    rbuf: c_int,
    ctx: c_int,
    pub(crate) opts: [c_int; opt::LAST as usize + 1],
    children: Vec<std::process::Child>,
    /// The readers of spawned copies' output pipes (`PvmOutputTid`) and
    /// what they queued to send.
    pub(crate) out: Collector,
    /// `pvm_catchout`'s file and line assembly, while it is on.
    pub(crate) catch: Option<(*mut libc::FILE, output::Lines)>,
    /// Where the next copy spawned without a place goes (round robin).
    next_host: usize,
    /// What `pvm_config` and `pvm_tasks` hand out stays here until the
    /// next such call.
    hosts_out: Vec<PvmHostInfo>,
    tasks_out: Vec<PvmTaskInfo>,
    strings: Vec<std::ffi::CString>,
    /// The names `hosts_out` points to (apart from `strings`, which
    /// `pvm_tasks` replaces while a program still holds the host list).
    host_strings: Vec<std::ffi::CString>,
    /// What `pvm_getmboxinfo` hands out, kept until its next call: the
    /// structures, their names and their arrays.
    mbox_out: Vec<PvmMboxInfo>,
    mbox_names: Vec<std::ffi::CString>,
    mbox_ints: Vec<Vec<c_int>>,
}

// SAFETY: `catch` holds the program's `FILE*`, which stdio locks for
// each call from any thread. The raw pointers in `hosts_out` point into
// `host_strings`, those in `tasks_out` into `strings`, those in
// `mbox_out` into `mbox_names` and `mbox_ints`, which
// the same `Pvm` owns; they move with it. The tables'
// shared connection to imcd and lock set (`Rc`s in `store::McTable`) are
// held only by this `Pvm`'s tables, so they move with it too, and the
// state lock lets one thread at a time use them.
unsafe impl Send for Pvm {}

/// `struct pvmhostinfo`.
#[repr(C)]
pub struct PvmHostInfo {
    pub hi_tid: c_int,
    pub hi_name: *const c_char,
    pub hi_arch: *const c_char,
    pub hi_speed: c_int,
    pub hi_dsig: c_int,
}

/// `struct pvmtaskinfo`.
#[repr(C)]
pub struct PvmTaskInfo {
    pub ti_tid: c_int,
    pub ti_ptid: c_int,
    pub ti_host: c_int,
    pub ti_flag: c_int,
    pub ti_a_out: *const c_char,
    pub ti_pid: c_int,
}

/// `struct pvmmboxinfo`.
#[repr(C)]
pub struct PvmMboxInfo {
    pub mi_name: *const c_char,
    pub mi_nentries: c_int,
    pub mi_indices: *const c_int,
    pub mi_owners: *const c_int,
    pub mi_flags: *const c_int,
}

/// `struct pvmminfo`.
#[repr(C)]
pub struct PvmMInfo {
    pub len: c_int,
    pub ctx: c_int,
    pub tag: c_int,
    pub wid: c_int,
    pub enc: c_int,
    pub crc: c_int,
    pub src: c_int,
    pub dst: c_int,
}

// SAFETY (for the statics below): C programs read and write these words
// directly, as PVM's ABI has them do; this library writes them only under
// the state lock.
/// The error code of the last failed call.
#[no_mangle]
pub static mut pvm_errno: c_int = 0;
/// How many entries `pvm_errlist` has.
#[no_mangle]
pub static mut pvm_nerr: c_int = consts::ERRLIST.len() as c_int;
/// The task's current message context (`pvm_getcontext`).
#[no_mangle]
pub static mut pvmmyctx: c_int = 0;

/// A table of C string pointers that C code may read.
#[repr(transparent)]
pub struct CStrTable<const N: usize>(pub [*const c_char; N]);
// SAFETY: the pointers are to 'static, immutable, NUL-terminated strings.
unsafe impl<const N: usize> Sync for CStrTable<N> {}

/// `pvm_errlist`'s pointers, from [`consts::ERRLIST`].
const fn errlist() -> [*const c_char; consts::ERRLIST.len()] {
    let mut t = [std::ptr::null(); consts::ERRLIST.len()];
    let mut i = 0;
    while i < t.len() {
        t[i] = consts::ERRLIST[i].as_ptr();
        i += 1;
    }
    t
}

/// Error messages by negated code (`pvm_errlist[-code]`).
#[no_mangle]
pub static pvm_errlist: CStrTable<{ consts::ERRLIST.len() }> = CStrTable(errlist());

/// The tracer's control (`pvmctrc`): tracing is not implemented, so it
/// stays zero; it exists, with Debian's size, because Debian's programs
/// link to it (the event table and data IDs, `pvmtevinfo` and
/// `pvmtevdidlist`, are in `console`).
#[no_mangle]
pub static mut pvmctrc: [u8; 68] = [0; 68];

pub(crate) static STATE: Mutex<Option<Pvm>> = Mutex::new(None);

fn set_errno(code: c_int) {
    // SAFETY: see the statics above; written under STATE's lock or by the
    // one thread that reports an error before any state exists.
    unsafe { pvm_errno = code };
}

/// Reports a failed call as PVM does (with `PvmAutoErr` on) and returns
/// its code.
pub(crate) fn fail(call: &str, me: i32, auto: c_int, code: c_int) -> c_int {
    set_errno(code);
    if auto != 0 && code != err::NO_DATA {
        if me > 0 {
            eprintln!("libpvm [t{me:x}]: {call}(): {}", consts::message(code));
        } else {
            eprintln!("libpvm [pid{}]: {call}(): {}", std::process::id(), consts::message(code));
        }
    }
    code
}

/// Runs `f` on the task's state, enrolling it first; turns an error code
/// into PVM's report.
pub(crate) fn with(call: &str, f: impl FnMut(&mut Pvm) -> Result<c_int, c_int>) -> c_int {
    with_quiet(call, &[], f)
}

/// What a call that waits for a message returns when message handlers
/// must run first: the C layer runs them with the lock released and
/// calls it again. Never returned to a program.
const RUN_HANDLERS: c_int = c_int::MIN + 1;

thread_local! {
    /// Whether this thread is inside a message handler (whose PVM calls
    /// run no handlers themselves).
    static IN_HANDLER: Cell<bool> = const { Cell::new(false) };
}

/// [`with`], where the codes in `quiet` are normal answers that set
/// `pvm_errno` without a report (as PVM's mailbox calls do). Message
/// handlers for the messages the call drained run after it, outside the
/// lock; a wait that has them to run ([`RUN_HANDLERS`]) runs them, then
/// `f` again.
fn with_quiet(call: &str, quiet: &[c_int], mut f: impl FnMut(&mut Pvm) -> Result<c_int, c_int>) -> c_int {
    loop {
        let mut g = STATE.lock().unwrap_or_else(|e| e.into_inner());
        if g.is_none() {
            match Pvm::enroll() {
                Ok(p) => *g = Some(p),
                Err(e) => {
                    eprintln!("libpvm [pid{}]: {call}(): cannot enroll: {e}", std::process::id());
                    return fail(call, 0, 1, err::SYS_ERR);
                }
            }
        }
        let Some(p) = g.as_mut() else { return fail(call, 0, 1, err::SYS_ERR) };
        p.reap();
        let r = f(p);
        p.flush_output();
        p.claim_handled();
        let due = std::mem::take(&mut p.mhf_due);
        let out = match r {
            Err(RUN_HANDLERS) => {
                drop(g);
                run_handlers(due);
                continue;
            }
            Ok(v) => v,
            Err(code) if quiet.contains(&code) => code,
            Err(code) => fail(call, p.me, p.opts[opt::AUTO_ERR as usize], code),
        };
        drop(g);
        if !due.is_empty() {
            run_handlers(due);
        }
        if out < 0 {
            set_errno(out);
        }
        return out;
    }
}

/// What a task had before a message handler ran, to put back after.
struct Saved {
    sbuf: c_int,
    rbuf: c_int,
    ctx: c_int,
}

/// Calls each handler with its message, the lock released while it runs.
fn run_handlers(due: VecDeque<(mhf::HandlerFn, engine::Msg)>) {
    for (f, m) in due {
        let entered = STATE.lock().unwrap_or_else(|e| e.into_inner()).as_mut().map(|p| p.enter_handler(m));
        // The task left PVM in an earlier handler: nothing more to run.
        let Some((id, saved)) = entered else { return };
        IN_HANDLER.with(|h| h.set(true));
        // SAFETY: `f` is a function the program registered with
        // pvm_addmhf, `int (*)(int)` as pvm3.h declares; it gets the
        // buffer id of its message.
        unsafe { f(id) };
        IN_HANDLER.with(|h| h.set(false));
        if let Some(p) = STATE.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            p.leave_handler(saved);
        }
    }
}

fn engine_code(e: &EngineError) -> c_int {
    match e {
        EngineError::NoTask(_) => err::NO_TASK,
        EngineError::TooBig(_) => err::OVERFLOW,
        _ => err::SYS_ERR,
    }
}

pub(crate) fn hostname() -> String {
    nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_else(|| "localhost".into())
}

/// The name a task is listed under: its program's file name.
fn program_name() -> String {
    std::env::args().next().map(|a| a.rsplit('/').next().unwrap_or(&a).to_string()).unwrap_or_default()
}

impl Pvm {
    fn enroll() -> Result<Pvm, String> {
        let vm = crate::vm::open()?;
        let table = vm.tasks;
        let host = table.host();
        let pid = std::process::id() as i32;
        let given = std::env::var(spawn::ENV_TID).ok().and_then(|v| v.parse::<i32>().ok());
        let siblings = std::env::var(spawn::ENV_SIBLINGS)
            .ok()
            .map(|v| v.split(',').filter_map(|t| t.parse().ok()).collect())
            .unwrap_or_default();
        // Our children must not take our TID for theirs.
        std::env::remove_var(spawn::ENV_TID);
        std::env::remove_var(spawn::ENV_SIBLINGS);
        let (me, ptid) = match given.map(|t| table.enroll(t, pid)) {
            Some(Ok(t)) => (t.tid, t.ptid),
            _ => (
                table.add(err::NO_PARENT, pid, 0, State::Running, &program_name()).map_err(|e| e.to_string())?,
                err::NO_PARENT,
            ),
        };
        let (groups, notify, mbox, vm) = (vm.groups, vm.notify, vm.mbox, vm.id);
        // A spawned task starts in its parent's context, as in PVM.
        let ctx = std::env::var(spawn::ENV_CTX).ok().and_then(|v| v.parse::<c_int>().ok()).unwrap_or(0);
        std::env::remove_var(spawn::ENV_CTX);
        // Output goes where the parent's children's went (PvmOutputTid is
        // inherited, as in PVM); this task's own is already there.
        let out = std::env::var(output::ENV_OUT).ok().and_then(|v| output::Dest::parse(&v));
        std::env::remove_var(output::ENV_OUT);
        // SAFETY: see the statics; the state lock is held by our caller.
        unsafe { pvmmyctx = ctx };
        let eng = Engine::start(me, vm).map_err(|e| {
            let _ = table.remove(me);
            e.to_string()
        })?;
        let mut opts = [0; opt::LAST as usize + 1];
        opts[opt::ROUTE as usize] = consts::ALLOW_DIRECT;
        opts[opt::AUTO_ERR as usize] = 1;
        opts[opt::FRAG_SIZE as usize] = 4096;
        opts[opt::POLL_TYPE as usize] = 1;
        opts[opt::SHOW_TIDS as usize] = 1;
        if let Some(d) = out {
            for (o, v) in [(opt::OUTPUT_TID, d.tid), (opt::OUTPUT_CONTEXT, d.ctx), (opt::OUTPUT_CODE, d.code)] {
                opts[o as usize] = v;
            }
            for (o, v) in
                [(opt::SELF_OUTPUT_TID, d.tid), (opt::SELF_OUTPUT_CONTEXT, d.ctx), (opt::SELF_OUTPUT_CODE, d.code)]
            {
                opts[o as usize] = v;
            }
        }
        // `mc-cluster pvm` starts the program with PVM_MC_CATCHOUT=1: a task
        // started from the shell then catches every task's output on its
        // standard output, as after pvm_catchout(stdout), and its
        // pvm_exit waits for the end of it.
        let catch = if ptid == err::NO_PARENT && std::env::var(output::ENV_CATCHOUT).is_ok_and(|v| v == "1") {
            // SAFETY: fd 1 is this process's standard output; the stream
            // is ours and lives as long as the process.
            let f = unsafe { libc::fdopen(1, c"w".as_ptr()) };
            (!f.is_null()).then(|| {
                opts[opt::OUTPUT_TID as usize] = me;
                opts[opt::OUTPUT_CONTEXT as usize] = daemon::SYS_CTX;
                opts[opt::OUTPUT_CODE as usize] = output::CATCH_TAG;
                (f, output::Lines::default())
            })
        } else {
            None
        };
        std::env::remove_var(output::ENV_CATCHOUT);
        Ok(Pvm {
            groups,
            notify,
            mbox,
            handlers: Handlers::default(),
            mhf_due: VecDeque::new(),
            looked: Instant::now(),
            table,
            host,
            me,
            ptid,
            siblings,
            eng,
            bufs: HashMap::new(),
            next_buf: 1,
            sbuf: 0,
            rbuf: 0,
            ctx,
            opts,
            children: Vec::new(),
            out: Collector::default(),
            catch,
            next_host: 0,
            hosts_out: Vec::new(),
            tasks_out: Vec::new(),
            strings: Vec::new(),
            host_strings: Vec::new(),
            mbox_out: Vec::new(),
            mbox_names: Vec::new(),
            mbox_ints: Vec::new(),
        })
    }

    /// Moves the messages that arrived since the last look and a handler
    /// wants, in the order they came, to those waiting for their handler;
    /// the others stay queued, to be received (as in PVM, a handler gets
    /// what arrives once it is there). Not inside a handler, whose calls
    /// run none.
    fn claim_handled(&mut self) {
        if IN_HANDLER.with(Cell::get) {
            return;
        }
        let hs = &self.handlers;
        for m in self.eng.claim_fresh(|m| m.ctx != SYS_CTX && hs.find(m).is_some()) {
            if let Some(f) = hs.find(&m) {
                self.mhf_due.push_back((f, m));
            }
        }
    }

    /// Sets the current context (and `pvmmyctx`, which programs read).
    fn set_ctx(&mut self, ctx: c_int) -> c_int {
        // SAFETY: see the statics; under the state lock.
        unsafe { pvmmyctx = ctx };
        std::mem::replace(&mut self.ctx, ctx)
    }

    /// Before a handler runs: its message becomes the receive buffer and
    /// the context, with no send buffer; returns the buffer's id and what
    /// to put back.
    fn enter_handler(&mut self, m: engine::Msg) -> (c_int, Saved) {
        let id = self.new_buf(Buffer::received(m.enc, m.data, m.src, m.tag, m.ctx));
        let saved = Saved {
            sbuf: std::mem::replace(&mut self.sbuf, 0),
            rbuf: std::mem::replace(&mut self.rbuf, id),
            ctx: self.set_ctx(m.ctx),
        };
        (id, saved)
    }

    /// After a handler ran: frees the send and receive buffers it left
    /// current and puts back the task's own (those it has not freed).
    fn leave_handler(&mut self, s: Saved) {
        self.set_ctx(s.ctx);
        for cur in [self.sbuf, self.rbuf] {
            if cur != 0 && cur != s.sbuf && cur != s.rbuf {
                self.bufs.remove(&cur);
            }
        }
        self.sbuf = if self.bufs.contains_key(&s.sbuf) { s.sbuf } else { 0 };
        self.rbuf = if self.bufs.contains_key(&s.rbuf) { s.rbuf } else { 0 };
    }

    /// Collects children that have ended (they stay zombies otherwise).
    fn reap(&mut self) {
        self.children.retain_mut(|c| !matches!(c.try_wait(), Ok(Some(_))));
    }

    /// Sends the notifications that are due (tasks gone without leaving).
    fn send_due(&mut self) -> Result<(), c_int> {
        self.looked = Instant::now();
        daemon::send_notifications(&self.table, &self.notify, &mut self.eng, self.me)
    }

    /// What a waiting task does about once a second besides waiting:
    /// sends the notifications that are due.
    fn now_and_then(&mut self) -> Result<(), c_int> {
        if self.looked.elapsed() >= Duration::from_secs(1) {
            self.send_due()?;
        }
        Ok(())
    }

    fn exists(table: &Table, tid: i32) -> bool {
        // A table that cannot be read says nothing: go on waiting.
        table.find(tid).map(|t| t.is_some()).unwrap_or(true)
    }

    fn new_buf(&mut self, b: Buffer) -> c_int {
        let id = self.next_buf;
        self.next_buf = if self.next_buf == c_int::MAX { 1 } else { self.next_buf + 1 };
        self.bufs.insert(id, b);
        id
    }

    fn sbuf(&mut self) -> Result<&mut Buffer, c_int> {
        if self.sbuf == 0 {
            return Err(err::NO_BUF);
        }
        self.bufs.get_mut(&self.sbuf).ok_or(err::NO_BUF)
    }

    fn rbuf(&mut self) -> Result<&mut Buffer, c_int> {
        if self.rbuf == 0 {
            return Err(err::NO_BUF);
        }
        self.bufs.get_mut(&self.rbuf).ok_or(err::NO_BUF)
    }

    /// The send buffer's bytes, reading in-place data from the caller.
    fn outgoing(&mut self) -> Result<(Vec<u8>, c_int), c_int> {
        self.sbuf()?;
        self.flat(self.sbuf)
    }

    /// Buffer `id`'s bytes and encoding, reading in-place data from the
    /// caller.
    fn flat(&self, id: c_int) -> Result<(Vec<u8>, c_int), c_int> {
        let b = self.bufs.get(&id).ok_or(if id <= 0 { err::BAD_PARAM } else { err::NO_SUCH_BUF })?;
        let enc = b.enc;
        let data = b.flatten(|r, out| {
            for i in 0..r.count {
                let at = r.addr + i * r.stride * r.size;
                // SAFETY: PvmDataInPlace's contract: the caller keeps the
                // packed data alive and unchanged until it is sent; `at`
                // is inside the span the caller passed to pvm_pk*.
                out.extend_from_slice(unsafe { std::slice::from_raw_parts(at as *const u8, r.size) });
            }
        });
        Ok((data, enc))
    }

    fn send(&mut self, tid: c_int, tag: c_int) -> Result<c_int, c_int> {
        if tag < 0 {
            return Err(err::BAD_PARAM);
        }
        let (data, enc) = self.outgoing()?;
        let table = &self.table;
        self.eng
            .send(tid, (tag, self.ctx, enc), &data, &mut |t| Self::exists(table, t))
            .map_err(|e| engine_code(&e))?;
        Ok(0)
    }

    /// Makes message `m` the active receive buffer; returns its id.
    fn deliver(&mut self, m: engine::Msg) -> c_int {
        if self.rbuf != 0 {
            self.bufs.remove(&self.rbuf);
        }
        let id = self.new_buf(Buffer::received(m.enc, m.data, m.src, m.tag, m.ctx));
        self.rbuf = id;
        id
    }

    /// Waits for a message for (`tid`, `tag`) until `deadline` (None: for
    /// ever); Ok(0) when the time ran out.
    fn recv(&mut self, tid: c_int, tag: c_int, deadline: Option<Instant>) -> Result<c_int, c_int> {
        Ok(match self.wait_for(tid, tag, self.ctx, deadline, true)? {
            Some(m) => self.deliver(m),
            None => 0,
        })
    }

    /// The next message from `tid` (-1: any) with `tag` (-1: any) in
    /// context `ctx`, waited for until `deadline` (None: for ever; Ok(None)
    /// when the time ran out), not made the receive buffer. Nothing can
    /// come from a task that is not there: `PvmNoTask` once it is gone
    /// and left nothing queued. Messages a handler claims are not
    /// received; with `handlers`, the wait stops with [`RUN_HANDLERS`]
    /// when there are some (the C layer runs them and calls again).
    fn wait_for(
        &mut self,
        tid: c_int,
        tag: c_int,
        ctx: c_int,
        deadline: Option<Instant>,
        handlers: bool,
    ) -> Result<Option<engine::Msg>, c_int> {
        let mut idle = 0u32;
        let mut checked = Instant::now();
        loop {
            self.flush_output();
            self.claim_handled();
            if handlers && !self.mhf_due.is_empty() {
                return Err(RUN_HANDLERS);
            }
            if let Some(m) = self.eng.take(tid, tag, ctx) {
                return Ok(Some(m));
            }
            if self.eng.progress().map_err(|e| engine_code(&e))? {
                idle = 0;
                continue;
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(None);
            }
            self.now_and_then()?;
            if tid > 0 && checked.elapsed() > Duration::from_secs(1) {
                checked = Instant::now();
                if !Self::exists(&self.table, tid) {
                    let _ = self.eng.progress();
                    return self.eng.take(tid, tag, ctx).map(Some).ok_or(err::NO_TASK);
                }
            }
            engine::backoff(&mut idle);
        }
    }
}

/// A C string argument, or `PvmBadParam`.
///
/// # Safety
/// `p` is null or points to a NUL-terminated string.
pub(crate) unsafe fn cstr<'a>(p: *const c_char) -> Result<&'a str, c_int> {
    if p.is_null() {
        return Err(err::BAD_PARAM);
    }
    // SAFETY: the caller's contract.
    unsafe { CStr::from_ptr(p) }.to_str().map_err(|_| err::BAD_PARAM)
}

/// Stores `v` through `p` unless it is null.
///
/// # Safety
/// `p` is null or points to a writable `T`.
unsafe fn put<T>(p: *mut T, v: T) {
    if !p.is_null() {
        // SAFETY: the caller's contract.
        unsafe { p.write(v) };
    }
}

// ---------------------------------------------------------------- tasks --

/// `pvm_mytid`: this task's TID (enrolling it).
#[no_mangle]
pub extern "C" fn pvm_mytid() -> c_int {
    with("pvm_mytid", |p| Ok(p.me))
}

/// `pvm_parent`: the TID of the task that spawned this one, or
/// `PvmNoParent`: a normal answer that programs test for, so it is not
/// reported as an error (it sets `pvm_errno`).
#[no_mangle]
pub extern "C" fn pvm_parent() -> c_int {
    let ptid = with("pvm_parent", |p| Ok(p.ptid));
    if ptid <= 0 {
        set_errno(err::NO_PARENT);
        return err::NO_PARENT;
    }
    ptid
}

/// `pvm_exit`: leaves PVM once what this task sent has been read (or
/// its readers are gone).
#[no_mangle]
pub extern "C" fn pvm_exit() -> c_int {
    let mut g = STATE.lock().unwrap_or_else(|e| e.into_inner());
    let Some(mut p) = g.take() else { return 0 };
    p.reap();
    // Output of our copies still on its way is sent first (PVM blocks
    // here while output is collected).
    p.drain_output(Duration::from_secs(30));
    let _ = p.groups.leave_all(p.me, &|_| true);
    let _ = p.mbox.leave(p.me, &|_| true);
    let _ = p.table.remove(p.me);
    // Those who asked to hear of our exit hear it now.
    let _ = p.send_due();
    let table = &p.table;
    p.eng.finish(Duration::from_secs(30), &mut |t| Pvm::exists(table, t));
    // Children keep running (as with PVM); they are collected by init.
    std::mem::forget(p.children);
    0
}

/// `pvm_spawn`: starts `ntask` copies of `task` on this host.
///
/// # Safety
/// `task` and `where_` are null or C strings, `argv` is null or a
/// null-terminated array of C strings, `tids` is null or holds `ntask`
/// ints.
#[no_mangle]
pub unsafe extern "C" fn pvm_spawn(
    task: *const c_char,
    argv: *const *const c_char,
    flag: c_int,
    where_: *const c_char,
    ntask: c_int,
    tids: *mut c_int,
) -> c_int {
    with("pvm_spawn", |p| {
        // SAFETY: the caller's contract for each pointer.
        let task = unsafe { cstr(task) }?;
        if ntask < 1 {
            return Err(err::BAD_PARAM);
        }
        let mut args = Vec::new();
        if !argv.is_null() {
            for i in 0.. {
                // SAFETY: argv is a null-terminated array.
                let a = unsafe { *argv.add(i) };
                if a.is_null() {
                    break;
                }
                // SAFETY: each entry is a C string.
                args.push(unsafe { CStr::from_ptr(a) }.to_string_lossy().into_owned());
            }
        }
        // SAFETY: the caller's contract: `where_` is null or a C string.
        let place = if where_.is_null() { "" } else { unsafe { cstr(where_) }.unwrap_or("") };
        let out = |i: usize, v: c_int| {
            // SAFETY: tids holds ntask ints.
            unsafe { put(tids.wrapping_add(i), v) }
        };
        let hosts = p.spawn_hosts(flag, place);
        if hosts.is_empty() {
            (0..ntask as usize).for_each(|i| out(i, err::NO_HOST));
            return Err(err::NO_HOST);
        }
        let ptid = if flag & consts::NO_SPAWN_PARENT != 0 { err::NO_PARENT } else { p.me };
        // Every copy's host and TID first (pvm_siblings lists them all).
        let mut plan: Vec<(u32, c_int)> = Vec::new();
        for _ in 0..ntask {
            let (h, _) = hosts[p.next_host % hosts.len()];
            p.next_host += 1;
            match p.table.add_on(h, ptid, 0, flag, State::Starting, task) {
                Ok(t) => plan.push((h, t)),
                Err(TableError::Full) => break,
                Err(_) => return Err(err::SYS_ERR),
            }
        }
        let siblings: Vec<c_int> = plan.iter().map(|&(_, t)| t).collect();
        let mut results = vec![err::OUT_OF_RES; ntask as usize];
        let mine = p.host;
        let local: Vec<usize> = (0..plan.len()).filter(|&i| plan[i].0 == mine).collect();
        let mut env: Vec<(String, String)> =
            daemon::PASSED_ENV.iter().filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v))).collect();
        env.push((spawn::ENV_CTX.to_string(), p.ctx.to_string()));
        let redirect = p.output_dest().map(|dest| output::Redirect { dest, ptid });
        // Every copy is announced before any starts (output.rs, "Who
        // announces").
        if let Some(r) = redirect {
            for &(_, t) in &plan {
                p.out.announce(r.dest, t, output::TO_SPAWN, &r.ptid.max(0).to_ne_bytes());
            }
            p.flush_output();
        }
        if !local.is_empty() {
            let req = daemon::SpawnRequest {
                task: task.to_string(),
                args: args.clone(),
                env: env.clone(),
                tids: local.iter().map(|&i| plan[i].1).collect(),
                siblings: siblings.clone(),
                output: redirect,
            };
            for (k, (t, r)) in daemon::start(&req, &mut p.children, &p.out, output::poke_output).into_iter().enumerate()
            {
                results[local[k]] = match r {
                    Ok(pid) => {
                        let _ = p.table.set_pid(t, pid as i32);
                        t
                    }
                    Err(code) => {
                        let _ = p.table.remove(t);
                        code
                    }
                };
            }
        }
        for (h, dtid) in hosts.iter().copied().filter(|&(h, _)| h != mine) {
            let idx: Vec<usize> = (0..plan.len()).filter(|&i| plan[i].0 == h).collect();
            if idx.is_empty() {
                continue;
            }
            let req = daemon::SpawnRequest {
                task: task.to_string(),
                args: args.clone(),
                env: env.clone(),
                tids: idx.iter().map(|&i| plan[i].1).collect(),
                siblings: siblings.clone(),
                output: redirect,
            };
            match p.spawn_remote(dtid, &req) {
                Ok(r) if r.len() == idx.len() => idx.iter().zip(r).for_each(|(&i, v)| results[i] = v),
                other => {
                    let code = other.err().unwrap_or(err::D_SYS_ERR);
                    for &i in &idx {
                        let _ = p.table.remove(plan[i].1);
                        results[i] = code;
                    }
                }
            }
        }
        for (i, &v) in results.iter().enumerate() {
            out(i, v);
        }
        if let Some(r) = redirect {
            // Announced copies that did not start have ended.
            for (k, &(_, t)) in plan.iter().enumerate() {
                if results[k] <= 0 {
                    p.out.announce(r.dest, t, output::TO_EOF, &[]);
                }
            }
            p.flush_output();
        }
        // As Debian's PVM: the number started, each failure's code in
        // `tids` (a program not found is 0 started, `tids[0]` PvmNoFile).
        Ok(results.iter().filter(|&&v| v > 0).count() as c_int)
    })
}

impl Pvm {
    /// The hosts a spawn may use, in round-robin order starting after this
    /// one: (host number, daemon TID). Off a cluster, or with no daemon,
    /// this host alone.
    fn spawn_hosts(&self, flag: c_int, place: &str) -> Vec<(u32, i32)> {
        let tasks = self.table.tasks().unwrap_or_default();
        let mut hosts: Vec<(u32, i32, String)> = daemon::hosts(&tasks);
        if !hosts.iter().any(|h| h.0 == self.host) {
            hosts.push((self.host, daemon::daemon_tid(self.host), hostname()));
            hosts.sort();
        }
        let here = |p: &str| p.is_empty() || p == "." || p == "localhost";
        if flag & consts::TASK_HOST != 0 && !here(place) {
            return hosts.into_iter().filter(|h| h.2 == place).map(|h| (h.0, h.1)).collect();
        }
        if flag & consts::TASK_HOST != 0 {
            return vec![(self.host, daemon::daemon_tid(self.host))];
        }
        if flag & consts::TASK_ARCH != 0 && !place.is_empty() && place != consts::ARCH {
            return Vec::new();
        }
        let at = hosts.iter().position(|h| h.0 == self.host).unwrap_or(0);
        let n = hosts.len();
        (1..=n).map(|k| &hosts[(at + k) % n]).map(|h| (h.0, h.1)).collect()
    }

    /// Asks host daemon `dtid` to start `req`'s copies; its answer.
    fn spawn_remote(&mut self, dtid: i32, req: &daemon::SpawnRequest) -> Result<Vec<c_int>, c_int> {
        let body = serde_json::to_vec(req).map_err(|_| err::SYS_ERR)?;
        let table = &self.table;
        self.eng
            .send(dtid, (daemon::SPAWN_TAG, SYS_CTX, consts::DATA_RAW), &body, &mut |t| Self::exists(table, t))
            .map_err(|e| {
                eprintln!("libpvm [t{:x}]: pvm_spawn(): asking t{dtid:x} to start {}: {e}", self.me, req.task);
                engine_code(&e)
            })?;
        let t0 = Instant::now();
        let mut checked = Instant::now();
        let mut idle = 0u32;
        let answer = loop {
            if let Some(m) = self.eng.take(dtid, daemon::SPAWNED_TAG, SYS_CTX) {
                break m;
            }
            if !self.eng.progress().map_err(|e| engine_code(&e))? {
                // A daemon whose host failed (repaired out of the table)
                // never answers: no need to wait the 30 s.
                let gone = checked.elapsed() > Duration::from_secs(1) && {
                    checked = Instant::now();
                    !Self::exists(&self.table, dtid)
                };
                if gone || t0.elapsed() > Duration::from_secs(30) {
                    self.eng.close(dtid);
                    return Err(err::D_SYS_ERR);
                }
                engine::backoff(&mut idle);
            }
        };
        // A new request opens a new channel, which wakes the daemon.
        self.eng.close(dtid);
        serde_json::from_slice::<daemon::Spawned>(&answer.data).map(|s| s.results).map_err(|_| err::D_SYS_ERR)
    }
}

/// `pvm_notify`: asks for a message with tag `tag` when one of the
/// `cnt` tasks in `tids` exits (`PvmTaskExit`; the message holds its TID,
/// one int, and comes from a daemon TID), when one of the hosts `tids`
/// (daemon TIDs, as `pvm_config` lists them) leaves (`PvmHostDelete`; the
/// message holds the host's daemon TID), or when hosts are added
/// (`PvmHostAdd`, `cnt` messages, -1: for ever, 0: no more; each holds the
/// number of hosts added and their daemon TIDs). `| PvmNotifyCancel`
/// withdraws requests. A task already gone, or a host not in the virtual
/// machine, is reported at once.
///
/// # Safety
/// `tids` holds `cnt` ints (for `PvmTaskExit` and `PvmHostDelete`).
#[no_mangle]
pub unsafe extern "C" fn pvm_notify(what: c_int, tag: c_int, cnt: c_int, tids: *const c_int) -> c_int {
    with("pvm_notify", |p| {
        let cancel = what & consts::NOTIFY_CANCEL != 0;
        let kind = what & !consts::NOTIFY_CANCEL;
        let list: Vec<i32> = match kind {
            consts::TASK_EXIT | consts::HOST_DELETE => {
                if cnt < 0 || (cnt > 0 && tids.is_null()) {
                    return Err(err::BAD_PARAM);
                }
                if cnt == 0 {
                    Vec::new()
                } else {
                    // SAFETY: the caller's contract.
                    unsafe { std::slice::from_raw_parts(tids, cnt as usize) }.to_vec()
                }
            }
            consts::HOST_ADD if cnt < -1 => return Err(err::BAD_PARAM),
            consts::HOST_ADD => vec![0],
            _ => return Err(err::BAD_PARAM),
        };
        let left = if kind == consts::HOST_ADD { cnt } else { 0 };
        let mut reqs: Vec<notify::Request> =
            list.into_iter().map(|on| notify::Request { what: kind, on, to: p.me, tag, ctx: p.ctx, left }).collect();
        if kind == consts::HOST_ADD {
            // A new call replaces the count left; 0 (or a cancel) stops.
            p.notify.add(&reqs, true)?;
            if cancel || cnt == 0 {
                return Ok(0);
            }
        }
        if kind == consts::HOST_DELETE && !cancel {
            // A host not in the virtual machine (no daemon entry) is
            // reported at once. This host without a daemon (off a
            // cluster) is never reported: its leaving ends every task.
            let tasks = p.table.tasks().map_err(|_| err::SYS_ERR)?;
            let hosts: Vec<i32> = daemon::hosts(&tasks).into_iter().map(|h| h.1).collect();
            let mine = p.me & table::TID_HOST;
            let src = daemon::notifier_tid(p.me);
            let (known, gone): (Vec<_>, Vec<_>) =
                reqs.into_iter().partition(|r| hosts.contains(&r.on) || r.on & table::TID_HOST == mine);
            for r in gone {
                let table = &p.table;
                let _ = p.eng.send_from(src, p.me, (tag, p.ctx, consts::DATA_DEFAULT), &r.on.to_ne_bytes(), &mut |t| {
                    Pvm::exists(table, t)
                });
            }
            reqs = known.into_iter().filter(|r| hosts.contains(&r.on)).collect();
        }
        p.notify.add(&reqs, cancel)?;
        p.send_due()?;
        Ok(0)
    })
}

/// `pvm_kill`: ends another task (SIGTERM).
#[no_mangle]
pub extern "C" fn pvm_kill(tid: c_int) -> c_int {
    with("pvm_kill", |p| {
        if tid == p.me {
            return Err(err::BAD_PARAM);
        }
        let t = p.table.find(tid).map_err(|_| err::SYS_ERR)?.ok_or(err::NO_TASK)?;
        if t.pid <= 0 {
            return Err(err::NO_TASK);
        }
        signal(p, &t, libc::SIGTERM)?;
        let _ = p.table.remove(tid);
        Ok(0)
    })
}

/// `pvm_sendsig`: sends signal `sig` to a task.
#[no_mangle]
pub extern "C" fn pvm_sendsig(tid: c_int, sig: c_int) -> c_int {
    with("pvm_sendsig", |p| {
        let t = p.table.find(tid).map_err(|_| err::SYS_ERR)?.ok_or(err::NO_TASK)?;
        nix::sys::signal::Signal::try_from(sig).map_err(|_| err::BAD_PARAM)?;
        signal(p, &t, sig)?;
        Ok(0)
    })
}

/// Sends signal `sig` to task `t`: directly on this host, as a cluster
/// signal (`imc_kill`, through imcd) on another.
pub(crate) fn signal(p: &Pvm, t: &table::Task, sig: c_int) -> Result<(), c_int> {
    if table::host_of(t.tid) == p.host {
        let s = nix::sys::signal::Signal::try_from(sig).map_err(|_| err::BAD_PARAM)?;
        return nix::sys::signal::kill(nix::unistd::Pid::from_raw(t.pid), s).map_err(|_| err::NO_TASK);
    }
    let node = crate::vm::node_of_host(table::host_of(t.tid));
    let imc = imc_client::Imc::connect().map_err(|_| err::SYS_ERR)?;
    let hosts = imc.gethosts().map_err(|_| err::SYS_ERR)?;
    let name = hosts.into_iter().find(|(n, _)| *n == node).map(|(_, name)| name).ok_or(err::NO_HOST)?;
    imc.kill(&name, t.pid, sig).map_err(|_| err::NO_TASK)
}

/// `pvm_pstat`: `PvmOk` if the task is there, else `PvmNoTask`.
#[no_mangle]
pub extern "C" fn pvm_pstat(tid: c_int) -> c_int {
    with("pvm_pstat", |p| match p.table.find(tid) {
        Ok(Some(_)) => Ok(0),
        Ok(None) => Err(err::NO_TASK),
        Err(_) => Err(err::SYS_ERR),
    })
}

/// `pvm_mstat`: `PvmOk` if the host is in the virtual machine.
///
/// # Safety
/// `host` is null or a C string.
#[no_mangle]
pub unsafe extern "C" fn pvm_mstat(host: *const c_char) -> c_int {
    with("pvm_mstat", |p| {
        // SAFETY: the caller's contract.
        let h = unsafe { cstr(host) }?;
        let tasks = p.table.tasks().map_err(|_| err::SYS_ERR)?;
        if h == hostname() || h == "localhost" || daemon::hosts(&tasks).iter().any(|x| x.2 == h) {
            Ok(0)
        } else {
            Err(err::NO_HOST)
        }
    })
}

/// `pvm_tidtohost`: the TID of the daemon of the task's host.
#[no_mangle]
pub extern "C" fn pvm_tidtohost(tid: c_int) -> c_int {
    tid & table::TID_HOST
}

/// `pvm_siblings`: the TIDs spawned by the same `pvm_spawn` call.
///
/// # Safety
/// `tids` is null or a writable pointer.
#[no_mangle]
pub unsafe extern "C" fn pvm_siblings(tids: *mut *const c_int) -> c_int {
    with("pvm_siblings", |p| {
        if p.siblings.is_empty() {
            p.siblings.push(p.me);
        }
        // SAFETY: the caller's contract.
        unsafe { put(tids, p.siblings.as_ptr()) };
        Ok(p.siblings.len() as c_int)
    })
}

/// `pvm_config`: the hosts of the virtual machine.
///
/// # Safety
/// Each pointer is null or writable.
#[no_mangle]
pub unsafe extern "C" fn pvm_config(nhost: *mut c_int, narch: *mut c_int, hostp: *mut *const PvmHostInfo) -> c_int {
    with("pvm_config", |p| {
        let tasks = p.table.tasks().map_err(|_| err::SYS_ERR)?;
        let mut hosts = daemon::hosts(&tasks);
        if !hosts.iter().any(|h| h.0 == p.host) {
            hosts.push((p.host, daemon::daemon_tid(p.host), hostname()));
            hosts.sort();
        }
        let arch = std::ffi::CString::new(consts::ARCH).unwrap_or_default();
        p.host_strings = hosts.iter().map(|h| std::ffi::CString::new(h.2.clone()).unwrap_or_default()).collect();
        p.hosts_out = hosts
            .iter()
            .zip(&p.host_strings)
            .map(|(h, name)| PvmHostInfo {
                hi_tid: table::tid(h.0, 0),
                hi_name: name.as_ptr(),
                hi_arch: arch.as_ptr(),
                hi_speed: 1000,
                hi_dsig: consts::DSIG,
            })
            .collect();
        p.host_strings.push(arch);
        // SAFETY: the caller's contract.
        unsafe {
            put(nhost, p.hosts_out.len() as c_int);
            put(narch, 1);
            put(hostp, p.hosts_out.as_ptr());
        }
        Ok(0)
    })
}

/// `pvm_tasks`: tasks of the virtual machine (`where` 0), of one host
/// (a daemon's TID) or one task.
///
/// # Safety
/// Each pointer is null or writable.
#[no_mangle]
pub unsafe extern "C" fn pvm_tasks(where_: c_int, ntask: *mut c_int, taskp: *mut *const PvmTaskInfo) -> c_int {
    with("pvm_tasks", |p| {
        let all = p.table.tasks().map_err(|_| err::SYS_ERR)?;
        let chosen: Vec<_> = all
            .into_iter()
            .filter(|t| t.tid & table::TID_LOCAL != 0)
            .filter(|t| {
                where_ == 0 || (where_ & table::TID_LOCAL == 0 && t.tid & table::TID_HOST == where_) || t.tid == where_
            })
            .collect();
        if chosen.is_empty() && where_ != 0 {
            return Err(if where_ & table::TID_LOCAL == 0 { err::NO_HOST } else { err::NO_TASK });
        }
        p.strings = chosen.iter().map(|t| std::ffi::CString::new(t.name.clone()).unwrap_or_default()).collect();
        p.tasks_out = chosen
            .iter()
            .zip(&p.strings)
            .map(|(t, n)| PvmTaskInfo {
                ti_tid: t.tid,
                ti_ptid: if t.ptid > 0 { t.ptid } else { 0 },
                ti_host: t.tid & table::TID_HOST,
                ti_flag: task_status(t),
                ti_a_out: n.as_ptr(),
                ti_pid: t.pid,
            })
            .collect();
        // SAFETY: the caller's contract.
        unsafe {
            put(ntask, p.tasks_out.len() as c_int);
            put(taskp, p.tasks_out.as_ptr());
        }
        Ok(0)
    })
}

/// A task's status flags as PVM's `ti_flag` has them (the console's `ps`
/// shows them): `c` (0x4) once it runs, `f` (0x2) if `pvm_spawn` started
/// it (its entry has a parent or spawn flags).
fn task_status(t: &table::Task) -> c_int {
    let running = if t.state == State::Running { 0x4 } else { 0 };
    let spawned = if t.ptid > 0 || t.flag != 0 { 0x2 } else { 0 };
    running | spawned
}

// -------------------------------------------------------------- buffers --

/// `pvm_mkbuf`: a new, empty buffer with encoding `enc`.
#[no_mangle]
pub extern "C" fn pvm_mkbuf(enc: c_int) -> c_int {
    with("pvm_mkbuf", |p| {
        if !(consts::DATA_DEFAULT..=consts::DATA_IN_PLACE).contains(&enc) {
            return Err(err::BAD_PARAM);
        }
        Ok(p.new_buf(Buffer::new(enc)))
    })
}

/// `pvm_initsend`: clears the send buffer (a new one with encoding `enc`).
#[no_mangle]
pub extern "C" fn pvm_initsend(enc: c_int) -> c_int {
    with("pvm_initsend", |p| {
        if !(consts::DATA_DEFAULT..=consts::DATA_IN_PLACE).contains(&enc) {
            return Err(err::BAD_PARAM);
        }
        if p.sbuf != 0 {
            p.bufs.remove(&p.sbuf);
        }
        p.sbuf = p.new_buf(Buffer::new(enc));
        Ok(p.sbuf)
    })
}

/// `pvm_freebuf`.
#[no_mangle]
pub extern "C" fn pvm_freebuf(id: c_int) -> c_int {
    with("pvm_freebuf", |p| {
        if id < 0 {
            return Err(err::BAD_PARAM);
        }
        if id == 0 {
            return Ok(0);
        }
        p.bufs.remove(&id).ok_or(err::NO_SUCH_BUF)?;
        if p.sbuf == id {
            p.sbuf = 0;
        }
        if p.rbuf == id {
            p.rbuf = 0;
        }
        Ok(0)
    })
}

/// `pvm_getsbuf`.
#[no_mangle]
pub extern "C" fn pvm_getsbuf() -> c_int {
    with("pvm_getsbuf", |p| Ok(p.sbuf))
}

/// `pvm_getrbuf`.
#[no_mangle]
pub extern "C" fn pvm_getrbuf() -> c_int {
    with("pvm_getrbuf", |p| Ok(p.rbuf))
}

/// `pvm_setsbuf`: makes `id` the send buffer (0: none); returns the old.
#[no_mangle]
pub extern "C" fn pvm_setsbuf(id: c_int) -> c_int {
    with("pvm_setsbuf", |p| {
        if id != 0 && !p.bufs.contains_key(&id) {
            return Err(if id < 0 { err::BAD_PARAM } else { err::NO_SUCH_BUF });
        }
        Ok(std::mem::replace(&mut p.sbuf, id))
    })
}

/// `pvm_setrbuf`: makes `id` the receive buffer (0: none); returns the old.
#[no_mangle]
pub extern "C" fn pvm_setrbuf(id: c_int) -> c_int {
    with("pvm_setrbuf", |p| {
        if id != 0 && !p.bufs.contains_key(&id) {
            return Err(if id < 0 { err::BAD_PARAM } else { err::NO_SUCH_BUF });
        }
        if let Some(b) = p.bufs.get_mut(&id) {
            b.rewind();
        }
        Ok(std::mem::replace(&mut p.rbuf, id))
    })
}

/// `pvm_bufinfo`: a buffer's length, tag and source.
///
/// # Safety
/// Each out-pointer is null or writable.
#[no_mangle]
pub unsafe extern "C" fn pvm_bufinfo(id: c_int, bytes: *mut c_int, tag: *mut c_int, tid: *mut c_int) -> c_int {
    with("pvm_bufinfo", |p| {
        if id <= 0 {
            return Err(err::BAD_PARAM);
        }
        let b = p.bufs.get(&id).ok_or(err::NO_SUCH_BUF)?;
        let (src, t, _) = b.from.unwrap_or((p.me, -1, p.ctx));
        // SAFETY: the caller's contract.
        unsafe {
            put(bytes, b.len() as c_int);
            put(tag, t);
            put(tid, src);
        }
        Ok(0)
    })
}

/// `pvm_getminfo`: a buffer's header.
///
/// # Safety
/// `info` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn pvm_getminfo(id: c_int, info: *mut PvmMInfo) -> c_int {
    with("pvm_getminfo", |p| {
        let b = p.bufs.get(&id).ok_or(err::NO_SUCH_BUF)?;
        let (src, tag, ctx) = b.from.unwrap_or((p.me, -1, p.ctx));
        let m = PvmMInfo { len: b.len() as c_int, ctx, tag, wid: 0, enc: b.enc, crc: 0, src, dst: p.me };
        // SAFETY: the caller's contract.
        unsafe { put(info, m) };
        Ok(0)
    })
}

// -------------------------------------------------------------- packing --

/// Packs `n` items of `size` bytes, `stride` apart, from `addr`.
fn pack_items(call: &str, addr: *const c_void, n: c_int, stride: c_int, size: usize) -> c_int {
    with(call, |p| {
        if n < 0 || stride < 1 || (addr.is_null() && n > 0) {
            return Err(err::BAD_PARAM);
        }
        let r = InPlace { addr: addr as usize, count: n as usize, size, stride: stride as usize };
        let b = p.sbuf()?;
        if b.enc == consts::DATA_IN_PLACE {
            b.pack_ref(r)?;
        } else if n > 0 {
            // SAFETY: pvm_pk*'s contract: `addr` holds n items `stride`
            // apart, which is `span` bytes from `addr`.
            let data = unsafe { std::slice::from_raw_parts(addr as *const u8, r.span()) };
            b.pack(data, r.count, size, r.stride)?;
        }
        Ok(0)
    })
}

/// Unpacks `n` items of `size` bytes, `stride` apart, to `addr`.
fn unpack_items(call: &str, addr: *mut c_void, n: c_int, stride: c_int, size: usize) -> c_int {
    with(call, |p| {
        if n < 0 || stride < 1 || (addr.is_null() && n > 0) {
            return Err(err::BAD_PARAM);
        }
        if n == 0 {
            return Ok(0);
        }
        let r = InPlace { addr: addr as usize, count: n as usize, size, stride: stride as usize };
        // SAFETY: pvm_upk*'s contract: `addr` has room for n items
        // `stride` apart.
        let out = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, r.span()) };
        p.rbuf()?.unpack(out, r.count, size, r.stride)?;
        Ok(0)
    })
}

macro_rules! pk_upk {
    ($($pk:ident $upk:ident $t:ty, $size:expr;)*) => {$(
        #[doc = concat!("`", stringify!($pk), "`: packs `n` items `stride` apart.")]
        ///
        /// # Safety
        /// `addr` holds `n` items `stride` items apart.
        #[no_mangle]
        pub unsafe extern "C" fn $pk(addr: *const $t, n: c_int, stride: c_int) -> c_int {
            pack_items(stringify!($pk), addr as *const c_void, n, stride, $size)
        }
        #[doc = concat!("`", stringify!($upk), "`: unpacks `n` items `stride` apart.")]
        ///
        /// # Safety
        /// `addr` has room for `n` items `stride` items apart.
        #[no_mangle]
        pub unsafe extern "C" fn $upk(addr: *mut $t, n: c_int, stride: c_int) -> c_int {
            unpack_items(stringify!($upk), addr as *mut c_void, n, stride, $size)
        }
    )*};
}

pk_upk! {
    pvm_pkbyte pvm_upkbyte c_char, 1;
    pvm_pkshort pvm_upkshort i16, 2;
    pvm_pkushort pvm_upkushort u16, 2;
    pvm_pkint pvm_upkint c_int, 4;
    pvm_pkuint pvm_upkuint u32, 4;
    pvm_pklong pvm_upklong c_long, 8;
    pvm_pkulong pvm_upkulong u64, 8;
    pvm_pkfloat pvm_upkfloat f32, 4;
    pvm_pkdouble pvm_upkdouble f64, 8;
    pvm_pkcplx pvm_upkcplx f32, 8;
    pvm_pkdcplx pvm_upkdcplx f64, 16;
}

/// `pvm_pkstr`: packs a NUL-terminated string.
///
/// # Safety
/// `s` is null or a C string.
#[no_mangle]
pub unsafe extern "C" fn pvm_pkstr(s: *const c_char) -> c_int {
    with("pvm_pkstr", |p| {
        if s.is_null() {
            return Err(err::BAD_PARAM);
        }
        // SAFETY: the caller's contract.
        let bytes = unsafe { CStr::from_ptr(s) }.to_bytes();
        p.sbuf()?.pack_str(bytes);
        Ok(0)
    })
}

/// `pvm_upkstr`: unpacks a string (the caller's buffer must hold it).
///
/// # Safety
/// `s` is null or has room for the string packed.
#[no_mangle]
pub unsafe extern "C" fn pvm_upkstr(s: *mut c_char) -> c_int {
    with("pvm_upkstr", |p| {
        if s.is_null() {
            return Err(err::BAD_PARAM);
        }
        let b = p.rbuf()?;
        // PVM's contract: the caller's buffer holds the packed string; its
        // length is in the message, checked against what is left.
        let n = b.left();
        // SAFETY: the caller's buffer holds the string, which is at most
        // the rest of the message long.
        let out = unsafe { std::slice::from_raw_parts_mut(s as *mut u8, n) };
        b.unpack_str(out)?;
        Ok(0)
    })
}

// ------------------------------------------------------------ messaging --

/// `pvm_send`: sends the send buffer to `tid` with tag `tag`.
#[no_mangle]
pub extern "C" fn pvm_send(tid: c_int, tag: c_int) -> c_int {
    with("pvm_send", |p| p.send(tid, tag))
}

/// `pvm_mcast`: sends the send buffer to each of `ntask` tasks.
///
/// # Safety
/// `tids` holds `ntask` ints.
#[no_mangle]
pub unsafe extern "C" fn pvm_mcast(tids: *const c_int, ntask: c_int, tag: c_int) -> c_int {
    with("pvm_mcast", |p| {
        if ntask < 0 || (tids.is_null() && ntask > 0) {
            return Err(err::BAD_PARAM);
        }
        // SAFETY: the caller's contract.
        let list = if ntask == 0 { &[][..] } else { unsafe { std::slice::from_raw_parts(tids, ntask as usize) } };
        let mut first_err = 0;
        for &t in list {
            if t == p.me {
                continue;
            }
            if let Err(e) = p.send(t, tag) {
                first_err = if first_err == 0 { e } else { first_err };
            }
        }
        if first_err != 0 {
            Err(first_err)
        } else {
            Ok(0)
        }
    })
}

/// `pvm_recv`: waits for a message from `tid` (-1: any) with tag `tag`
/// (-1: any); returns its buffer, now the receive buffer.
#[no_mangle]
pub extern "C" fn pvm_recv(tid: c_int, tag: c_int) -> c_int {
    with("pvm_recv", |p| p.recv(tid, tag, None))
}

/// `pvm_nrecv`: `pvm_recv` that returns 0 at once when nothing is there.
#[no_mangle]
pub extern "C" fn pvm_nrecv(tid: c_int, tag: c_int) -> c_int {
    with("pvm_nrecv", |p| p.recv(tid, tag, Some(Instant::now())))
}

/// `pvm_trecv`: `pvm_recv` that gives up after `tmout` (null: never).
///
/// # Safety
/// `tmout` is null or a valid `struct timeval`.
#[no_mangle]
pub unsafe extern "C" fn pvm_trecv(tid: c_int, tag: c_int, tmout: *const libc::timeval) -> c_int {
    // The deadline is fixed before the wait (which starts again after
    // message handlers ran).
    let deadline = if tmout.is_null() {
        Ok(None)
    } else {
        // SAFETY: the caller's contract.
        let tv = unsafe { *tmout };
        if tv.tv_sec < 0 || tv.tv_usec < 0 {
            Err(err::BAD_PARAM)
        } else {
            Ok(Some(Instant::now() + Duration::from_secs(tv.tv_sec as u64) + Duration::from_micros(tv.tv_usec as u64)))
        }
    };
    with("pvm_trecv", |p| p.recv(tid, tag, deadline?))
}

/// `pvm_probe`: whether a message for (`tid`, `tag`) is there: a buffer
/// id to inspect it with `pvm_bufinfo` (the message stays to be
/// received), or 0.
#[no_mangle]
pub extern "C" fn pvm_probe(tid: c_int, tag: c_int) -> c_int {
    with("pvm_probe", |p| {
        p.eng.progress().map_err(|e| engine_code(&e))?;
        // What a handler wants is not there to probe.
        p.claim_handled();
        let ctx = p.ctx;
        let Some(m) = p.eng.peek(tid, tag, ctx).cloned() else { return Ok(0) };
        Ok(p.new_buf(Buffer::received(m.enc, m.data, m.src, m.tag, m.ctx)))
    })
}

/// `pvm_psend`: packs `len` items of type `ty` from `buf` and sends
/// them, in one call.
///
/// # Safety
/// `buf` holds `len` items of type `ty`.
#[no_mangle]
pub unsafe extern "C" fn pvm_psend(tid: c_int, tag: c_int, buf: *const c_void, len: c_int, ty: c_int) -> c_int {
    with("pvm_psend", |p| {
        let size = consts::type_size(ty).ok_or(err::BAD_PARAM)?;
        if len < 0 || tag < 0 || (buf.is_null() && len > 0) {
            return Err(err::BAD_PARAM);
        }
        let data = if len == 0 {
            &[][..]
        } else {
            // SAFETY: the caller's contract.
            unsafe { std::slice::from_raw_parts(buf as *const u8, len as usize * size) }
        };
        let table = &p.table;
        p.eng
            .send(tid, (tag, p.ctx, consts::DATA_RAW), data, &mut |t| Pvm::exists(table, t))
            .map_err(|e| engine_code(&e))?;
        Ok(0)
    })
}

/// `pvm_precv`: receives a message into `buf` (room for `len` items of
/// type `ty`), reporting its source, tag and length in bytes (as
/// Debian's PVM 3.4.6 does, whatever the type).
///
/// # Safety
/// `buf` has room for `len` items of type `ty`; the out-pointers are null
/// or writable.
#[no_mangle]
pub unsafe extern "C" fn pvm_precv(
    tid: c_int,
    tag: c_int,
    buf: *mut c_void,
    len: c_int,
    ty: c_int,
    rtid: *mut c_int,
    rtag: *mut c_int,
    rlen: *mut c_int,
) -> c_int {
    with("pvm_precv", |p| {
        let size = consts::type_size(ty).ok_or(err::BAD_PARAM)?;
        if len < 0 || (buf.is_null() && len > 0) {
            return Err(err::BAD_PARAM);
        }
        let m = p.wait_for(tid, tag, p.ctx, None, true)?.ok_or(err::SYS_ERR)?;
        // SAFETY: the caller's contract.
        unsafe {
            put(rtid, m.src);
            put(rtag, m.tag);
            put(rlen, m.data.len() as c_int);
        }
        let room = len as usize * size;
        let n = m.data.len().min(room);
        if n > 0 {
            // SAFETY: `buf` has room for `len` items, `n` bytes at most.
            unsafe { std::ptr::copy_nonoverlapping(m.data.as_ptr(), buf as *mut u8, n) };
        }
        if m.data.len() > room {
            return Err(err::NO_MEM);
        }
        Ok(0)
    })
}

// ------------------------------------------------------ options, errors --

/// `pvm_setopt`: sets an option; returns its old value.
#[no_mangle]
pub extern "C" fn pvm_setopt(what: c_int, val: c_int) -> c_int {
    with("pvm_setopt", |p| {
        if !(1..=opt::LAST).contains(&what) {
            return Err(err::BAD_PARAM);
        }
        Ok(std::mem::replace(&mut p.opts[what as usize], val))
    })
}

/// `pvm_getopt`: an option's value.
#[no_mangle]
pub extern "C" fn pvm_getopt(what: c_int) -> c_int {
    with("pvm_getopt", |p| {
        if !(1..=opt::LAST).contains(&what) {
            return Err(err::BAD_PARAM);
        }
        Ok(p.opts[what as usize])
    })
}

/// `pvm_perror`: prints `msg` and the last error's message.
///
/// # Safety
/// `msg` is null or a C string.
#[no_mangle]
pub unsafe extern "C" fn pvm_perror(msg: *const c_char) -> c_int {
    let me = STATE.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(|p| p.me).unwrap_or(0);
    // SAFETY: the caller's contract.
    let msg = if msg.is_null() { String::new() } else { unsafe { CStr::from_ptr(msg) }.to_string_lossy().into_owned() };
    // SAFETY: see the statics.
    let code = unsafe { pvm_errno };
    let who = if me > 0 { format!("t{me:x}") } else { format!("pid{}", std::process::id()) };
    eprintln!("libpvm [{who}]: {msg}: {}", consts::message(code));
    0
}

/// `lpvmerr`: PVM's internal error report (`f()`: message), returning
/// the code; some example programs call it.
///
/// # Safety
/// `f` is null or a C string.
#[no_mangle]
pub unsafe extern "C" fn lpvmerr(f: *const c_char, code: c_int) -> c_int {
    // SAFETY: the caller's contract.
    let call = if f.is_null() { String::new() } else { unsafe { CStr::from_ptr(f) }.to_string_lossy().into_owned() };
    let (me, auto) = STATE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .map(|p| (p.me, p.opts[opt::AUTO_ERR as usize]))
        .unwrap_or((0, 1));
    fail(&call, me, auto, code)
}

/// `pvm_version`: "3.4.6".
#[no_mangle]
pub extern "C" fn pvm_version() -> *const c_char {
    c"3.4.6".as_ptr()
}

/// `pvm_archcode`: the data-format class of an architecture name (every
/// guest is LINUX64: 1; unknown names 0).
///
/// # Safety
/// `arch` is null or a C string.
#[no_mangle]
pub unsafe extern "C" fn pvm_archcode(arch: *const c_char) -> c_int {
    // SAFETY: the caller's contract.
    match unsafe { cstr(arch) } {
        Ok(a) if a == consts::ARCH => 1,
        _ => 0,
    }
}

/// `pvmgettmp`: the folder of PVM's files (`PVM_TMP`, else /tmp).
#[no_mangle]
pub extern "C" fn pvmgettmp() -> *const c_char {
    static TMP: std::sync::OnceLock<std::ffi::CString> = std::sync::OnceLock::new();
    TMP.get_or_init(|| {
        std::ffi::CString::new(std::env::var("PVM_TMP").unwrap_or_else(|_| "/tmp".into())).unwrap_or_default()
    })
    .as_ptr()
}

/// `pvmsleep`: sleeps `secs` seconds (PVM's helper).
#[no_mangle]
pub extern "C" fn pvmsleep(secs: c_int) -> c_int {
    std::thread::sleep(Duration::from_secs(secs.max(0) as u64));
    0
}

/// `pvmgetclock`: the time of day into `tv` (PVM's helper).
///
/// # Safety
/// `tv` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn pvmgetclock(tv: *mut libc::timeval) -> c_int {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    // SAFETY: the caller's contract.
    unsafe {
        put(
            tv,
            libc::timeval { tv_sec: now.as_secs() as libc::time_t, tv_usec: now.subsec_micros() as libc::suseconds_t },
        )
    };
    0
}

/// `pvm_strerror`: the message of the last error (`pvm_errno`).
#[no_mangle]
pub extern "C" fn pvm_strerror() -> *const c_char {
    // SAFETY: see the statics.
    let code = unsafe { pvm_errno };
    match code.checked_neg().and_then(|i| usize::try_from(i).ok()) {
        Some(i) if i < pvm_errlist.0.len() => pvm_errlist.0[i],
        _ => c"Unknown error".as_ptr(),
    }
}

/// `pvmgetrsh`: the remote shell PVM would start daemons with
/// (`PVM_RSH`, else rsh); this PVM starts none.
#[no_mangle]
pub extern "C" fn pvmgetrsh() -> *const c_char {
    static RSH: std::sync::OnceLock<std::ffi::CString> = std::sync::OnceLock::new();
    RSH.get_or_init(|| {
        std::ffi::CString::new(std::env::var("PVM_RSH").unwrap_or_else(|_| "/usr/bin/rsh".into())).unwrap_or_default()
    })
    .as_ptr()
}

/// A receive-matching function of `pvm_recvf`.
pub type MatchFn = Option<extern "C" fn(c_int, c_int, c_int) -> c_int>;

/// `pvm_recvf`: not implemented yet (docs/pvm.md): reports `PvmNotImpl`
/// and returns no function, keeping PVM's own matching.
#[no_mangle]
pub extern "C" fn pvm_recvf(new: MatchFn) -> MatchFn {
    let _ = new;
    with("pvm_recvf", |_| Err(err::NOT_IMPL));
    None
}

/// `pvmnametag`: the name of a system message tag (PVM's helper for
/// trace output); there are none, so always null with `*found` 0.
///
/// # Safety
/// `found` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn pvmnametag(tag: c_int, found: *mut c_int) -> *const c_char {
    let _ = tag;
    // SAFETY: the caller's contract.
    unsafe { put(found, 0) };
    std::ptr::null()
}

// ------------------------------------------------------------- contexts --

/// `pvm_getcontext`: the current message context.
#[no_mangle]
pub extern "C" fn pvm_getcontext() -> c_int {
    with("pvm_getcontext", |p| Ok(p.ctx))
}

/// `pvm_setcontext`: sets the message context; returns the old one.
#[no_mangle]
pub extern "C" fn pvm_setcontext(ctx: c_int) -> c_int {
    with("pvm_setcontext", |p| {
        if ctx < 0 {
            return Err(err::BAD_PARAM);
        }
        Ok(p.set_ctx(ctx))
    })
}

/// `pvm_newcontext`: a context no other task of the virtual machine has
/// (built from this task's TID and a count).
#[no_mangle]
pub extern "C" fn pvm_newcontext() -> c_int {
    static COUNT: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);
    with("pvm_newcontext", |p| {
        let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        if n > 0xff {
            return Err(err::OUT_OF_RES);
        }
        // 12 host bits and 10 task bits of the TID, 8 bits of count.
        let host = (p.me & table::TID_HOST) >> table::HOST_SHIFT & 0x3f;
        Ok(host << 24 | (p.me & 0x3ff) << 14 | n << 6 | 1)
    })
}

/// `pvm_freecontext`: a context is no longer used.
#[no_mangle]
pub extern "C" fn pvm_freecontext(ctx: c_int) -> c_int {
    with("pvm_freecontext", |_| if ctx < 0 { Err(err::BAD_PARAM) } else { Ok(0) })
}

// ------------------------------------------------- not implemented yet --

macro_rules! not_impl {
    ($($name:ident($($arg:ident: $t:ty),*);)*) => {$(
        #[doc = concat!("`", stringify!($name), "`: not implemented yet (docs/pvm.md); returns `PvmNotImpl`.")]
        #[no_mangle]
        pub extern "C" fn $name($($arg: $t),*) -> c_int {
            $(let _ = $arg;)*
            with(stringify!($name), |_| Err(err::NOT_IMPL))
        }
    )*};
}

type Cp = *const c_char;
type Ip = *mut c_int;
type Vp = *mut c_void;

not_impl! {
    pvm_addhosts(names: Vp, n: c_int, infos: Ip);
    pvm_delhosts(names: Vp, n: c_int, infos: Ip);
    pvm_hostsync(host: c_int, clk: Vp, delta: Vp);
    pvm_getfds(fds: Vp);
    pvm_tickle(narg: c_int, argp: Ip, nresp: Ip, resp: Ip);
    pvm_reg_tracer(a: c_int, b: c_int, c: c_int, d: c_int, e: Cp, f: c_int, g: c_int);
    pvm_reg_rm(infos: Vp);
    pvm_reg_hoster();
    pvm_reg_tasker();
    pvm_export(name: Cp);
    pvm_unexport(name: Cp);
    pvm_setminfo(id: c_int, info: Vp);
    pvm_pkmesg(id: c_int);
    pvm_pkmesgbody(id: c_int);
    pvm_upkmesg();
    pvm_getnoresets(tids: Vp, n: Ip);
}

/// The predefined reductions of `pvm_reduce`: `x = x op y` for `*n`
/// items of type `*ty`; `*info` is 0, or `PvmBadParam` for a type the
/// reduction does not take ([`reduce::apply`]).
macro_rules! reductions {
    ($($name:ident $op:expr),*) => {$(
        #[doc = concat!("`", stringify!($name), "`: a predefined `pvm_reduce` function.")]
        ///
        /// # Safety
        /// `ty`, `n` and `info` point to ints; `x` and `y` hold `*n` items
        /// of type `*ty`.
        #[no_mangle]
        pub unsafe extern "C" fn $name(ty: *mut c_int, x: *mut c_void, y: *mut c_void, n: *mut c_int, info: *mut c_int) {
            // SAFETY: the caller's contract.
            let code = unsafe { reduce_raw($op, ty, x, y, n) };
            // SAFETY: the caller's contract.
            unsafe { put(info, code) };
        }
    )*};
}

/// One predefined reduction on the caller's memory.
///
/// # Safety
/// As for the functions [`reductions`] makes.
unsafe fn reduce_raw(op: Op, ty: *mut c_int, x: *mut c_void, y: *mut c_void, n: *mut c_int) -> c_int {
    if ty.is_null() || n.is_null() || x.is_null() || y.is_null() {
        return err::BAD_PARAM;
    }
    // SAFETY: the caller's contract.
    let (ty, n) = unsafe { (*ty, *n) };
    let Some(size) = consts::type_size(ty) else { return err::BAD_PARAM };
    if n < 0 {
        return err::BAD_PARAM;
    }
    let len = n as usize * size;
    // SAFETY: x and y hold n items of type ty.
    let (xs, ys) =
        unsafe { (std::slice::from_raw_parts_mut(x as *mut u8, len), std::slice::from_raw_parts(y as *const u8, len)) };
    match reduce::apply(op, ty, xs, ys, n as usize) {
        Ok(()) => 0,
        Err(e) => e,
    }
}

reductions!(PvmSum Op::Sum, PvmProduct Op::Product, PvmMax Op::Max, PvmMin Op::Min);

// --------------------------------------------------------------- groups --

use crate::daemon::{BARRIER_TAG, SYS_CTX};

impl Pvm {
    fn members(&self, g: &str) -> Result<Vec<(i32, i32)>, c_int> {
        let live = self.table.live();
        self.groups.members(g, &|t| live.contains(t))
    }

    /// The member with instance `inst`.
    fn member_tid(&self, g: &str, inst: c_int) -> Result<c_int, c_int> {
        instance_tid(&self.members(g)?, inst)
    }

    /// Receives the next message from `tid` with `tag` in context `ctx`,
    /// without making it the receive buffer ([`Pvm::wait_for`], for ever).
    fn take_from(&mut self, tid: c_int, tag: c_int, ctx: c_int) -> Result<engine::Msg, c_int> {
        self.wait_for(tid, tag, ctx, None, false)?.ok_or(err::SYS_ERR)
    }

    /// Sends raw bytes to `tid` in context `ctx`.
    fn send_raw(&mut self, tid: c_int, tag: c_int, ctx: c_int, data: &[u8]) -> Result<(), c_int> {
        let table = &self.table;
        self.eng
            .send(tid, (tag, ctx, consts::DATA_RAW), data, &mut |t| Self::exists(table, t))
            .map_err(|e| engine_code(&e))
    }
}

/// The TID of instance `inst` among `members` (TID, instance).
fn instance_tid(members: &[(i32, i32)], inst: c_int) -> Result<c_int, c_int> {
    members.iter().find(|&&(_, i)| i == inst).map(|&(t, _)| t).ok_or(err::NO_INST)
}

/// A group name argument.
///
/// # Safety
/// `g` is null or a C string.
unsafe fn group_name<'a>(g: *const c_char) -> Result<&'a str, c_int> {
    // SAFETY: the caller's contract.
    let n = if g.is_null() { None } else { Some(unsafe { cstr(g) }?) };
    group::name(n)
}

/// `pvm_joingroup`: joins a group (made if new); returns the instance.
///
/// # Safety
/// `g` is null or a C string.
#[no_mangle]
pub unsafe extern "C" fn pvm_joingroup(g: *const c_char) -> c_int {
    with("pvm_joingroup", |p| {
        // SAFETY: the caller's contract.
        let g = unsafe { group_name(g) }?;
        let live = p.table.live();
        p.groups.join(g, p.me, &|t| live.contains(t))
    })
}

/// `pvm_lvgroup`: leaves a group.
///
/// # Safety
/// `g` is null or a C string.
#[no_mangle]
pub unsafe extern "C" fn pvm_lvgroup(g: *const c_char) -> c_int {
    with("pvm_lvgroup", |p| {
        // SAFETY: the caller's contract.
        let g = unsafe { group_name(g) }?;
        let live = p.table.live();
        p.groups.leave(g, p.me, &|t| live.contains(t)).map(|()| 0)
    })
}

/// `pvm_gsize`: a group's members.
///
/// # Safety
/// `g` is null or a C string.
#[no_mangle]
pub unsafe extern "C" fn pvm_gsize(g: *const c_char) -> c_int {
    with("pvm_gsize", |p| {
        // SAFETY: the caller's contract.
        let g = unsafe { group_name(g) }?;
        Ok(p.members(g)?.len() as c_int)
    })
}

/// `pvm_getinst`: the instance of task `tid` in a group.
///
/// # Safety
/// `g` is null or a C string.
#[no_mangle]
pub unsafe extern "C" fn pvm_getinst(g: *const c_char, tid: c_int) -> c_int {
    with("pvm_getinst", |p| {
        // SAFETY: the caller's contract.
        let g = unsafe { group_name(g) }?;
        p.members(g)?.into_iter().find(|&(t, _)| t == tid).map(|(_, i)| i).ok_or(err::NOT_IN_GROUP)
    })
}

/// `pvm_gettid`: the TID of instance `inst` of a group.
///
/// # Safety
/// `g` is null or a C string.
#[no_mangle]
pub unsafe extern "C" fn pvm_gettid(g: *const c_char, inst: c_int) -> c_int {
    with("pvm_gettid", |p| {
        // SAFETY: the caller's contract.
        let g = unsafe { group_name(g) }?;
        p.member_tid(g, inst)
    })
}

/// `pvm_freezegroup`: waits until `size` tasks have joined (-1: the size
/// now), then the group takes no more.
///
/// # Safety
/// `g` is null or a C string.
#[no_mangle]
pub unsafe extern "C" fn pvm_freezegroup(g: *const c_char, size: c_int) -> c_int {
    with("pvm_freezegroup", |p| {
        // SAFETY: the caller's contract.
        let g = unsafe { group_name(g) }?;
        let mut idle = 0u32;
        loop {
            let live = p.table.live();
            if p.groups.freeze(g, p.me, size, &|t| live.contains(t))? {
                return Ok(0);
            }
            // Messages keep arriving while it waits.
            p.eng.progress().map_err(|e| engine_code(&e))?;
            p.now_and_then()?;
            engine::backoff(&mut idle);
        }
    })
}

/// `pvm_barrier`: waits until `count` members (-1: all) have reached it.
///
/// # Safety
/// `g` is null or a C string.
#[no_mangle]
pub unsafe extern "C" fn pvm_barrier(g: *const c_char, count: c_int) -> c_int {
    with("pvm_barrier", |p| {
        // SAFETY: the caller's contract.
        let g = unsafe { group_name(g) }?;
        let live = p.table.live();
        match p.groups.arrive(g, p.me, count, &|t| live.contains(t))? {
            Arrival::Release { waiting, generation } => {
                let me = p.me;
                for t in waiting.into_iter().filter(|&t| t != me) {
                    // A waiter that is gone meanwhile needs no release.
                    let _ = p.send_raw(t, BARRIER_TAG, SYS_CTX, &generation.to_le_bytes());
                }
            }
            Arrival::Wait(_) => {
                p.take_from(-1, BARRIER_TAG, SYS_CTX)?;
            }
        }
        Ok(0)
    })
}

/// `pvm_bcast`: sends the send buffer to every other member of a group.
///
/// # Safety
/// `g` is null or a C string.
#[no_mangle]
pub unsafe extern "C" fn pvm_bcast(g: *const c_char, tag: c_int) -> c_int {
    with("pvm_bcast", |p| {
        // SAFETY: the caller's contract.
        let g = unsafe { group_name(g) }?;
        for (t, _) in p.members(g)? {
            if t != p.me {
                p.send(t, tag)?;
            }
        }
        Ok(0)
    })
}

/// The bytes of `count` items of type `ty` at `addr`, checked.
fn span(addr: *const c_void, count: c_int, ty: c_int) -> Result<usize, c_int> {
    let size = consts::type_size(ty).ok_or(err::BAD_PARAM)?;
    if count < 0 || (addr.is_null() && count > 0) {
        return Err(err::BAD_PARAM);
    }
    Ok(count as usize * size)
}

/// `pvm_reduce`: combines every member's `data` with `func` into the
/// root's (instance `root`); other members' data is left as it was.
///
/// # Safety
/// `data` holds `count` items of type `ty`; `func` is a reduction as
/// `pvm3.h` declares it; `g` is a C string.
#[no_mangle]
pub unsafe extern "C" fn pvm_reduce(
    func: Option<unsafe extern "C" fn(*mut c_int, *mut c_void, *mut c_void, *mut c_int, *mut c_int)>,
    data: *mut c_void,
    count: c_int,
    ty: c_int,
    tag: c_int,
    g: *const c_char,
    root: c_int,
) -> c_int {
    with("pvm_reduce", |p| {
        // SAFETY: the caller's contract.
        let g = unsafe { group_name(g) }?;
        let func = func.ok_or(err::BAD_PARAM)?;
        let len = span(data, count, ty)?;
        let members = p.members(g)?;
        let root_tid = instance_tid(&members, root)?;
        if !members.iter().any(|&(t, _)| t == p.me) {
            return Err(err::NOT_IN_GROUP);
        }
        // SAFETY: data holds count items of type ty.
        let mine = unsafe { std::slice::from_raw_parts_mut(data as *mut u8, len) };
        if root_tid != p.me {
            return p.send_raw(root_tid, tag, p.ctx, mine).map(|()| 0);
        }
        let me = p.me;
        for (t, _) in members.into_iter().filter(|&(t, _)| t != me) {
            let mut m = p.take_from(t, tag, p.ctx)?;
            if m.data.len() != len {
                return Err(err::MISMATCH);
            }
            let (mut ty, mut n, mut info) = (ty, count, 0);
            // SAFETY: func is a reduction over count items of type ty; both
            // buffers hold that many.
            unsafe {
                func(&mut ty, mine.as_mut_ptr() as *mut c_void, m.data.as_mut_ptr() as *mut c_void, &mut n, &mut info)
            };
            if info < 0 {
                return Err(info);
            }
        }
        Ok(0)
    })
}

/// `pvm_gather`: the root (instance `root`) collects every member's
/// `count` items into `result`, by instance.
///
/// # Safety
/// `data` holds `count` items of type `ty`; at the root `result` has room
/// for `count` items per instance up to the highest; `g` is a C string.
#[no_mangle]
pub unsafe extern "C" fn pvm_gather(
    result: *mut c_void,
    data: *const c_void,
    count: c_int,
    ty: c_int,
    tag: c_int,
    g: *const c_char,
    root: c_int,
) -> c_int {
    with("pvm_gather", |p| {
        // SAFETY: the caller's contract.
        let g = unsafe { group_name(g) }?;
        let len = span(data, count, ty)?;
        let members = p.members(g)?;
        let root_tid = instance_tid(&members, root)?;
        // SAFETY: data holds count items of type ty.
        let mine = unsafe { std::slice::from_raw_parts(data as *const u8, len) };
        if root_tid != p.me {
            return p.send_raw(root_tid, tag, p.ctx, mine).map(|()| 0);
        }
        if result.is_null() && len > 0 {
            return Err(err::BAD_PARAM);
        }
        let slots = members.iter().map(|&(_, i)| i as usize + 1).max().unwrap_or(0);
        // SAFETY: at the root, result has room for count items per instance.
        let out = unsafe { std::slice::from_raw_parts_mut(result as *mut u8, len * slots) };
        for (t, inst) in members {
            let at = inst as usize * len;
            if t == p.me {
                out[at..at + len].copy_from_slice(mine);
                continue;
            }
            let m = p.take_from(t, tag, p.ctx)?;
            if m.data.len() != len {
                return Err(err::MISMATCH);
            }
            out[at..at + len].copy_from_slice(&m.data);
        }
        Ok(0)
    })
}

/// `pvm_scatter`: the root (instance `root`) sends each member its
/// `count` items of `data` (by instance) into its `result`.
///
/// # Safety
/// `result` has room for `count` items of type `ty`; at the root `data`
/// holds `count` items per instance up to the highest; `g` is a C string.
#[no_mangle]
pub unsafe extern "C" fn pvm_scatter(
    result: *mut c_void,
    data: *const c_void,
    count: c_int,
    ty: c_int,
    tag: c_int,
    g: *const c_char,
    root: c_int,
) -> c_int {
    with("pvm_scatter", |p| {
        // SAFETY: the caller's contract.
        let g = unsafe { group_name(g) }?;
        let len = span(result, count, ty)?;
        let root_tid = p.member_tid(g, root)?;
        // SAFETY: result has room for count items of type ty.
        let out = unsafe { std::slice::from_raw_parts_mut(result as *mut u8, len) };
        if root_tid != p.me {
            let m = p.take_from(root_tid, tag, p.ctx)?;
            if m.data.len() != len {
                return Err(err::MISMATCH);
            }
            out.copy_from_slice(&m.data);
            return Ok(0);
        }
        if data.is_null() && len > 0 {
            return Err(err::BAD_PARAM);
        }
        let members = p.members(g)?;
        let slots = members.iter().map(|&(_, i)| i as usize + 1).max().unwrap_or(0);
        // SAFETY: at the root, data holds count items per instance.
        let all = unsafe { std::slice::from_raw_parts(data as *const u8, len * slots) };
        for (t, inst) in members {
            let part = &all[inst as usize * len..(inst as usize + 1) * len];
            if t == p.me {
                out.copy_from_slice(part);
            } else {
                p.send_raw(t, tag, p.ctx, part)?;
            }
        }
        Ok(0)
    })
}

// -------------------------------------------------------------- mailbox --

impl Pvm {
    /// The mailbox call's error code, with a line of its own for a limit
    /// or a fault (PVM's answers need none).
    fn mbox_code(&self, call: &str, e: MboxError) -> c_int {
        if e.is_limit_or_fault() {
            eprintln!("libpvm [t{:x}]: {call}(): {e}", self.me);
        }
        e.code()
    }

    /// Stores buffer `id` in the mailbox (`req` -1 for `pvm_putinfo`).
    fn put_info(&self, call: &str, name: &str, req: c_int, flags: c_int, id: c_int) -> Result<c_int, c_int> {
        let (data, enc) = self.flat(id)?;
        let m = mbox::Message { enc, data, src: self.me, ctx: self.ctx };
        let live = self.table.live();
        self.mbox.put(self.me, name, req, flags, &m, &|t| live.contains(t)).map_err(|e| self.mbox_code(call, e))
    }

    /// The mailbox entry for (`name`, `index`, `flags`); with
    /// `PvmMboxWaitForInfo` it waits until there is one.
    fn get_info(
        &mut self,
        call: &str,
        name: &str,
        index: c_int,
        flags: c_int,
    ) -> Result<(c_int, mbox::Message), c_int> {
        let mut idle = 0u32;
        loop {
            let live = self.table.live();
            match self.mbox.get(self.me, name, index, flags, &|t| live.contains(t)) {
                Err(MboxError::Pvm(err::NOT_FOUND)) if flags & mbox::WAIT_FOR_INFO != 0 => {
                    // Messages keep arriving while it waits.
                    self.eng.progress().map_err(|e| engine_code(&e))?;
                    self.now_and_then()?;
                    engine::backoff(&mut idle);
                }
                r => return r.map_err(|e| self.mbox_code(call, e)),
            }
        }
    }
}

/// A class name argument (`PvmBadParam` for none or an empty one).
///
/// # Safety
/// `name` is null or a C string.
unsafe fn class_name<'a>(name: *const c_char) -> Result<&'a str, c_int> {
    // SAFETY: the caller's contract.
    let n = unsafe { cstr(name) }?;
    mbox::name(n).map_err(|e| e.code())
}

/// `pvm_putinfo`: stores message buffer `buf` in the mailbox under
/// `name`; returns its index. `PvmDenied` (an entry there that is not
/// ours nor overwritable) is an answer, not reported.
///
/// # Safety
/// `name` is null or a C string.
#[no_mangle]
pub unsafe extern "C" fn pvm_putinfo(name: *const c_char, buf: c_int, flags: c_int) -> c_int {
    with_quiet("pvm_putinfo", &[err::DENIED, err::EXISTS], |p| {
        // SAFETY: the caller's contract.
        let name = unsafe { class_name(name) }?;
        p.put_info("pvm_putinfo", name, -1, flags, buf)
    })
}

/// `pvm_recvinfo`: the mailbox entry of `name` at `index` as a new
/// receive buffer (the active one; the old one is freed, as in PVM).
/// `PvmNotFound` is an answer, not reported.
///
/// # Safety
/// `name` is null or a C string.
#[no_mangle]
pub unsafe extern "C" fn pvm_recvinfo(name: *const c_char, index: c_int, flags: c_int) -> c_int {
    with_quiet("pvm_recvinfo", &[err::NOT_FOUND], |p| {
        // SAFETY: the caller's contract.
        let name = unsafe { class_name(name) }?;
        if index < 0 {
            return Err(err::BAD_PARAM);
        }
        if p.rbuf != 0 {
            p.bufs.remove(&p.rbuf);
            p.rbuf = 0;
        }
        let (_, m) = p.get_info("pvm_recvinfo", name, index, flags)?;
        Ok(p.deliver(engine::Msg { src: m.src, tag: 0, ctx: m.ctx, enc: m.enc, data: m.data }))
    })
}

/// `pvm_delinfo`: removes the mailbox entry of `name` at `index`.
/// `PvmDenied` and `PvmNotFound` are answers, not reported.
///
/// # Safety
/// `name` is null or a C string.
#[no_mangle]
pub unsafe extern "C" fn pvm_delinfo(name: *const c_char, index: c_int, flags: c_int) -> c_int {
    let _ = flags;
    // SAFETY: the caller's contract.
    unsafe { delete_entry("pvm_delinfo", name, index) }
}

/// Removes the mailbox entry of `name` at `index` for `call`
/// (`pvm_delinfo`, 3.3's `pvm_delete`): `PvmDenied` and `PvmNotFound` are
/// answers, not reported.
///
/// # Safety
/// `name` is null or a C string.
unsafe fn delete_entry(call: &str, name: *const c_char, index: c_int) -> c_int {
    with_quiet(call, &[err::DENIED, err::NOT_FOUND], |p| {
        // SAFETY: the caller's contract.
        let name = unsafe { class_name(name) }?;
        let live = p.table.live();
        p.mbox.delete(p.me, name, index, &|t| live.contains(t)).map_err(|e| p.mbox_code(call, e))?;
        Ok(0)
    })
}

/// `pvm_getmboxinfo`: the classes whose names match `pattern` (`*`: any
/// run of characters; null or empty: all), with each entry's index,
/// owner and flags. What it hands out stays valid until its next call.
///
/// # Safety
/// `pattern` is null or a C string; the out-pointers are null or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn pvm_getmboxinfo(
    pattern: *const c_char,
    nclasses: *mut c_int,
    classes: *mut *const PvmMboxInfo,
) -> c_int {
    with("pvm_getmboxinfo", |p| {
        // SAFETY: the caller's contract.
        let pattern = if pattern.is_null() { "" } else { unsafe { cstr(pattern) }? };
        let live = p.table.live();
        let info = p.mbox.names(pattern, &|t| live.contains(t)).map_err(|e| p.mbox_code("pvm_getmboxinfo", e))?;
        p.mbox_names = info.iter().map(|c| std::ffi::CString::new(c.name.clone()).unwrap_or_default()).collect();
        p.mbox_ints = info
            .iter()
            .flat_map(|c| {
                [
                    c.entries.iter().map(|e| e.0).collect::<Vec<c_int>>(),
                    c.entries.iter().map(|e| e.1).collect(),
                    c.entries.iter().map(|e| e.2).collect(),
                ]
            })
            .collect();
        p.mbox_out = info
            .iter()
            .enumerate()
            .map(|(i, c)| PvmMboxInfo {
                mi_name: p.mbox_names[i].as_ptr(),
                mi_nentries: c.entries.len() as c_int,
                mi_indices: p.mbox_ints[3 * i].as_ptr(),
                mi_owners: p.mbox_ints[3 * i + 1].as_ptr(),
                mi_flags: p.mbox_ints[3 * i + 2].as_ptr(),
            })
            .collect();
        // SAFETY: the caller's contract.
        unsafe {
            put(nclasses, p.mbox_out.len() as c_int);
            put(classes, p.mbox_out.as_ptr());
        }
        Ok(0)
    })
}

/// `pvm_insert` (PVM 3.3): stores the int `data` in class `name` at
/// index `req` (-1: the first free), persistent; returns the index.
/// A taken index is `PvmDupEntry` (`PvmDenied`), not reported.
///
/// # Safety
/// `name` is null or a C string.
#[no_mangle]
pub unsafe extern "C" fn pvm_insert(name: *const c_char, req: c_int, data: c_int) -> c_int {
    with_quiet("pvm_insert", &[err::DENIED], |p| {
        // SAFETY: the caller's contract.
        let name = unsafe { class_name(name) }?;
        if req < -1 {
            return Err(err::BAD_PARAM);
        }
        let m = mbox::Message { enc: consts::DATA_DEFAULT, data: data.to_ne_bytes().to_vec(), src: p.me, ctx: p.ctx };
        let live = p.table.live();
        let flags = mbox::MULTI_INSTANCE | mbox::PERSISTENT;
        p.mbox.put(p.me, name, req, flags, &m, &|t| live.contains(t)).map_err(|e| p.mbox_code("pvm_insert", e))
    })
}

/// `pvm_lookup` (PVM 3.3): the int stored in class `name` at index
/// `req` (-1: the first there) into `*data`; returns its index.
/// `PvmNoEntry` (`PvmNotFound`) is an answer, not reported.
///
/// # Safety
/// `name` is null or a C string; `data` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn pvm_lookup(name: *const c_char, req: c_int, data: *mut c_int) -> c_int {
    with_quiet("pvm_lookup", &[err::NOT_FOUND], |p| {
        // SAFETY: the caller's contract.
        let name = unsafe { class_name(name) }?;
        if req < -1 {
            return Err(err::BAD_PARAM);
        }
        let (index, flags) = if req == -1 { (0, mbox::FIRST_AVAIL) } else { (req, 0) };
        let (at, m) = p.get_info("pvm_lookup", name, index, flags)?;
        let v = m.data.get(..4).map(|b| c_int::from_ne_bytes([b[0], b[1], b[2], b[3]])).ok_or(err::NO_DATA)?;
        // SAFETY: the caller's contract.
        unsafe { put(data, v) };
        Ok(at)
    })
}

/// `pvm_delete` (PVM 3.3): removes the entry of class `name` at `req`.
/// `PvmNoEntry` (`PvmNotFound`) is an answer, not reported.
///
/// # Safety
/// `name` is null or a C string.
#[no_mangle]
pub unsafe extern "C" fn pvm_delete(name: *const c_char, req: c_int) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { delete_entry("pvm_delete", name, req) }
}

// ----------------------------------------------------- message handlers --

/// `pvm_addmhf`: calls `f` with the buffer id of each message from `src`
/// with `tag` in context `ctx` (-1: any), instead of queueing it to be
/// received; returns the handler's id. One that overlaps a handler there
/// is `PvmExists`.
#[no_mangle]
pub extern "C" fn pvm_addmhf(src: c_int, tag: c_int, ctx: c_int, f: Option<mhf::HandlerFn>) -> c_int {
    with("pvm_addmhf", |p| {
        let f = f.ok_or(err::BAD_PARAM)?;
        p.handlers.add(mhf::Handler { src, tag, ctx, f })
    })
}

/// `pvm_delmhf`: removes handler `mhid`.
#[no_mangle]
pub extern "C" fn pvm_delmhf(mhid: c_int) -> c_int {
    with("pvm_delmhf", |p| p.handlers.delete(mhid).map(|()| 0))
}

/// `pvmdisplaymhfinfo`: PVM's debugging list of a task's message
/// handlers, on standard output: who asks, their message, then each
/// handler's id, source, tag and context.
///
/// # Safety
/// `who` and `msg` are null or C strings.
#[no_mangle]
pub unsafe extern "C" fn pvmdisplaymhfinfo(who: *const c_char, msg: *const c_char, tid: c_int) -> c_int {
    let text = |s: *const c_char| {
        if s.is_null() {
            String::new()
        } else {
            // SAFETY: the caller's contract.
            unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
        }
    };
    let (who, msg) = (text(who), text(msg));
    let list = STATE.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(|p| p.handlers.list()).unwrap_or_default();
    let mut out = format!("\n{who} t{tid:x}: {msg}\n{who} t{tid:x}: {} message handler(s)\n", list.len());
    let any = |v: c_int, hex: bool| match (v, hex) {
        (-1, _) => "any".to_string(),
        (v, true) => format!("t{v:x}"),
        (v, false) => v.to_string(),
    };
    for (id, src, tag, ctx) in list {
        out += &format!(
            "{who} t{tid:x}:   mhid {id}: src {} tag {} ctx {}\n",
            any(src, true),
            any(tag, false),
            any(ctx, false)
        );
    }
    // C's stdout is buffered apart from ours: write through it, in order.
    let c = std::ffi::CString::new(out.replace('\0', "")).unwrap_or_default();
    // SAFETY: printf with a "%s" format and a C string.
    unsafe { libc::printf(c"%s".as_ptr(), c.as_ptr()) };
    0
}
