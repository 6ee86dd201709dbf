//! Output redirection of spawned tasks, as PVM 3.4 does it: a task whose
//! `PvmOutputTid` is set spawns copies whose standard output and error go
//! to one pipe; whoever started the copy reads the pipe and sends what
//! comes as messages to the output TID, with `PvmOutputCode` as the tag
//! in `PvmOutputContext`. Each message is `int tid, int count`, then
//! `count` bytes; `count` 0 is the end of the copy's output, and the two
//! negative counts announce a copy (`-1`, spawned; `-2`, starting; both
//! followed by the parent's TID), as PVM's console and `pvm_catchout`
//! expect. The copy inherits the destination (`PVM_MC_OUT`), so its own
//! children's output goes there too.
//!
//! Who announces: the spawning task sends `TO_SPAWN` for every copy of a
//! `pvm_spawn` before it starts any of them (and `TO_EOF` for a copy that
//! then failed to start); the reader of a copy's pipe sends `TO_NEW`, the
//! output and `TO_EOF`. PVM's console counts a job finished when each of
//! its copies has had both `TO_SPAWN` and `TO_EOF`, and frees the job then:
//! when the readers sent `TO_SPAWN` themselves, a copy on one guest could
//! finish before another guest's copy had been announced, the console
//! freed the job and then handled that copy's notices on freed memory (a
//! crash in 1 run of 5 of `spawn -4 -> spmd` on 4 guests).
//!
//! Who reads: for copies started in-line, a reader thread per copy in the
//! spawning task (it queues notices; the task's PVM calls, or the reader
//! itself when the task is outside PVM, send them); for copies started by
//! a guest's daemon, a reader thread per copy in the daemon, whose loop
//! sends them. The notices come from the host's daemon TID, as in PVM.
//!
//! Also the line assembly of `pvm_catchout` ([`Lines`]).
//!
//! Threads: one reader thread per captured copy (pushes to the queue);
//! the thread that holds the task's state lock (or the daemon's thread)
//! takes the queue.

use std::collections::{HashMap, VecDeque};
use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Environment variable that hands a spawned task its output destination
/// (`tid,ctx,code`).
pub const ENV_OUT: &str = "PVM_MC_OUT";
/// Environment variable that makes a task started from the shell catch
/// every task's output on its standard output (`1`; set by `mc-cluster
/// pvm`), as if it had called `pvm_catchout(stdout)`.
pub const ENV_CATCHOUT: &str = "PVM_MC_CATCHOUT";
/// `count` of the end of a copy's output (PVM's `TO_EOF`).
pub const TO_EOF: i32 = 0;
/// `count` of a copy just spawned (PVM's `TO_SPAWN`).
pub const TO_SPAWN: i32 = -1;
/// `count` of a copy starting (PVM's `TO_NEW`).
pub const TO_NEW: i32 = -2;
/// Tag of `pvm_catchout`'s messages, in the library's own context
/// (`daemon::SYS_CTX`; the daemon's own tags are 1 to 3).
pub const CATCH_TAG: i32 = 16;
/// Bytes read from a pipe at a time (one message at most).
const CHUNK: usize = 4096;

/// What went wrong setting up a capture.
#[derive(Debug, Error)]
pub enum OutputError {
    #[error("a pipe for a spawned task's output: {0}")]
    Pipe(std::io::Error),
}

/// Where a task's children's output goes: `PvmOutputTid`,
/// `PvmOutputContext`, `PvmOutputCode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dest {
    pub tid: i32,
    pub ctx: i32,
    pub code: i32,
}

impl Dest {
    /// The value of [`ENV_OUT`].
    pub fn env(&self) -> String {
        format!("{},{},{}", self.tid, self.ctx, self.code)
    }

    /// Parses [`ENV_OUT`]'s value; None if it is not three ints with a
    /// TID above 0.
    pub fn parse(s: &str) -> Option<Dest> {
        let v: Vec<i32> = s.split(',').map(|x| x.trim().parse().ok()).collect::<Option<_>>()?;
        match v[..] {
            [tid, ctx, code] if tid > 0 => Some(Dest { tid, ctx, code }),
            _ => None,
        }
    }
}

/// A copy's capture as a spawn request carries it: the destination and
/// the copy's parent (for the notices).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Redirect {
    pub dest: Dest,
    pub ptid: i32,
}

/// One message to send: its destination and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    pub dest: Dest,
    pub body: Vec<u8>,
}

/// A message body: `tid`, `count`, then `rest` (the bytes, or the
/// parent's TID for a notice), in native byte order as our packing has
/// ints.
pub fn body(tid: i32, count: i32, rest: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(8 + rest.len());
    b.extend_from_slice(&tid.to_ne_bytes());
    b.extend_from_slice(&count.to_ne_bytes());
    b.extend_from_slice(rest);
    b
}

#[derive(Default)]
struct Shared {
    queue: Mutex<VecDeque<Notice>>,
    /// The readers still reading: (copy's TID, its destination).
    live: Mutex<Vec<(i32, Dest)>>,
    /// Set when nobody will send any more: readers drain and drop.
    closed: AtomicBool,
}

/// The readers of one task (or daemon) and the notices they queued.
#[derive(Clone, Default)]
pub struct Collector(Arc<Shared>);

/// Sets `cmd`'s standard output and error to one new pipe; returns its
/// read end. The write ends live in `cmd` until it is dropped.
pub fn capture(cmd: &mut std::process::Command) -> Result<std::fs::File, OutputError> {
    // Close-on-exec: only the copy, whose output they become, keeps them.
    let (rd, wr) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| OutputError::Pipe(std::io::Error::from_raw_os_error(e as i32)))?;
    let wr2 = wr.try_clone().map_err(OutputError::Pipe)?;
    cmd.stdout(wr).stderr(wr2);
    Ok(std::fs::File::from(rd))
}

impl Collector {
    /// Starts the reader of copy `tid`'s pipe: it queues the spawn
    /// notices, then what the copy writes, then the end, and calls
    /// `poke` after each (to send at once if it can).
    pub fn watch(&self, tid: i32, r: Redirect, mut rd: std::fs::File, poke: fn()) {
        let shared = self.0.clone();
        lock(&shared.live).push((tid, r.dest));
        let ptid = r.ptid.max(0).to_ne_bytes();
        let push = move |s: &Shared, count: i32, rest: &[u8]| {
            if !s.closed.load(Ordering::Acquire) {
                lock(&s.queue).push_back(Notice { dest: r.dest, body: body(tid, count, rest) });
            }
        };
        let spawned = std::thread::Builder::new().name(format!("pvm-out-t{tid:x}")).spawn(move || {
            push(&shared, TO_NEW, &ptid);
            poke();
            let mut buf = vec![0u8; CHUNK];
            loop {
                match rd.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => push(&shared, n as i32, &buf[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => break,
                }
                poke();
            }
            push(&shared, TO_EOF, &[]);
            lock(&shared.live).retain(|(t, _)| *t != tid);
            poke();
        });
        if spawned.is_err() {
            // No thread: the copy's output cannot be read; say it ended so
            // the receiver does not wait for it.
            let s = &self.0;
            lock(&s.live).retain(|(t, _)| *t != tid);
            for (count, rest) in [(TO_NEW, &ptid[..]), (TO_EOF, &[][..])] {
                lock(&s.queue).push_back(Notice { dest: r.dest, body: body(tid, count, rest) });
            }
        }
    }

    /// Queues one notice about copy `tid` for `dest` (the spawner's
    /// `TO_SPAWN`, or the end of a copy that did not start).
    pub fn announce(&self, dest: Dest, tid: i32, count: i32, rest: &[u8]) {
        if !self.0.closed.load(Ordering::Acquire) {
            lock(&self.0.queue).push_back(Notice { dest, body: body(tid, count, rest) });
        }
    }

    /// The notices queued so far, in order.
    pub fn take(&self) -> Vec<Notice> {
        lock(&self.0.queue).drain(..).collect()
    }

    /// The destinations of the readers still reading.
    pub fn live(&self) -> Vec<Dest> {
        lock(&self.0.live).iter().map(|(_, d)| *d).collect()
    }

    /// Nobody sends any more: readers go on draining their pipes (so the
    /// copies never block writing) and drop what they read.
    pub fn close(&self) {
        self.0.closed.store(true, Ordering::Release);
        lock(&self.0.queue).clear();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `pvm_catchout`'s line assembly: per copy, the bytes of its unfinished
/// line; whether its spawn notice and its end came.
#[derive(Debug, Default)]
pub struct Lines {
    tasks: HashMap<i32, (Vec<u8>, bool, bool)>,
}

impl Lines {
    /// Takes one message body; returns the lines to write, each with its
    /// newline. With `show`, lines carry `[t<tid>] `, and a copy's output
    /// starts with `BEGIN` and finishes with `EOF` (PVM's `PvmShowTids`).
    pub fn feed(&mut self, b: &[u8], show: bool) -> Vec<String> {
        let int = |at: usize| b.get(at..at + 4).map(|x| i32::from_ne_bytes([x[0], x[1], x[2], x[3]]));
        let (Some(tid), Some(count)) = (int(0), int(4)) else { return Vec::new() };
        let tag = |s: &str| if show { format!("[t{tid:x}] {s}\n") } else { format!("{s}\n") };
        let mut out = Vec::new();
        match count {
            TO_SPAWN | TO_NEW => {
                let e = self.tasks.entry(tid).or_insert_with(|| {
                    if show {
                        out.push(tag("BEGIN"));
                    }
                    (Vec::new(), false, false)
                });
                e.1 |= count == TO_SPAWN;
            }
            TO_EOF => {
                if let Some(e) = self.tasks.get_mut(&tid) {
                    if !e.0.is_empty() {
                        out.push(tag(&String::from_utf8_lossy(&std::mem::take(&mut e.0))));
                    }
                    e.2 = true;
                }
            }
            n if n > 0 => {
                let Some(e) = self.tasks.get_mut(&tid) else { return out };
                let rest = &b[8.min(b.len())..];
                e.0.extend_from_slice(&rest[..rest.len().min(n as usize)]);
                while let Some(i) = e.0.iter().position(|&c| c == b'\n') {
                    let line: Vec<u8> = e.0.drain(..=i).collect();
                    out.push(tag(&String::from_utf8_lossy(&line[..i])));
                }
            }
            _ => {}
        }
        if self.tasks.get(&tid).is_some_and(|e| e.1 && e.2) {
            self.tasks.remove(&tid);
            if show {
                out.push(tag("EOF"));
            }
        }
        out
    }

    /// Whether some copy has not finished.
    pub fn open(&self) -> bool {
        !self.tasks.is_empty()
    }
}

// ------------------------------------------------------ the task's side --

use crate::consts::{self, opt};
use crate::daemon::{self, SYS_CTX};
use crate::ffi::{Pvm, STATE};

impl Pvm {
    /// Where this task's children's output goes (`PvmOutputTid` and the
    /// rest), or None (`PvmOutputTid` 0: they inherit our standard output
    /// and error, or on another guest its daemon's log).
    pub(crate) fn output_dest(&self) -> Option<Dest> {
        let o = |k: i32| self.opts[k as usize];
        let tid = o(opt::OUTPUT_TID);
        (tid > 0).then(|| Dest { tid, ctx: o(opt::OUTPUT_CONTEXT), code: o(opt::OUTPUT_CODE) })
    }

    /// Sends what our readers queued (to ourselves: into our own queue, or
    /// to `pvm_catchout`'s file), and writes the `pvm_catchout` messages
    /// that arrived. A destination that is gone gets nothing.
    pub(crate) fn flush_output(&mut self) {
        let me = self.me;
        for n in self.out.take() {
            if n.dest.tid == me && n.dest.ctx == SYS_CTX && n.dest.code == CATCH_TAG {
                self.catch_write(&n.body);
                continue;
            }
            let table = &self.table;
            let _ = self.eng.send_from(
                daemon::notifier_tid(me),
                n.dest.tid,
                (n.dest.code, n.dest.ctx, consts::DATA_DEFAULT),
                &n.body,
                &mut |t| table.find(t).map(|x| x.is_some()).unwrap_or(true),
            );
        }
        while let Some(m) = self.eng.take(-1, CATCH_TAG, SYS_CTX) {
            self.catch_write(&m.data);
        }
    }

    /// Writes one output message to `pvm_catchout`'s file (dropped when
    /// it is off).
    fn catch_write(&mut self, body: &[u8]) {
        let show = self.opts[opt::SHOW_TIDS as usize] != 0;
        let Some((file, lines)) = self.catch.as_mut() else { return };
        for l in lines.feed(body, show) {
            let Ok(c) = std::ffi::CString::new(l.replace('\0', " ")) else { continue };
            // SAFETY: `file` is the FILE* the program gave pvm_catchout,
            // valid while catching is on (PVM's contract); `c` is a C
            // string.
            unsafe {
                libc::fputs(c.as_ptr(), *file);
                libc::fflush(*file);
            }
        }
    }

    /// At `pvm_exit`: waits (up to `limit`) until the output of our copies
    /// that goes to another task, or to `pvm_catchout`, has all been sent
    /// and written; then readers drop what still comes (nobody is left
    /// to send it from this task).
    pub(crate) fn drain_output(&mut self, limit: std::time::Duration) {
        let t0 = std::time::Instant::now();
        loop {
            self.flush_output();
            let me = self.me;
            let catching = self.catch.as_ref().is_some_and(|(_, l)| l.open());
            let pending = self.out.live().iter().any(|d| d.tid != me || d.ctx == SYS_CTX);
            if !(pending || catching) || t0.elapsed() > limit {
                // A reader queues its last notices before it counts as
                // done: send what came since the flush above.
                self.flush_output();
                break;
            }
            let _ = self.eng.progress();
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        self.out.close();
        self.catch = None;
    }
}

/// Called by a reader after it queued something: sends it at once if the
/// task is outside PVM (else the PVM call under way sends it).
pub(crate) fn poke_output() {
    if let Ok(mut g) = STATE.try_lock() {
        if let Some(p) = g.as_mut() {
            p.flush_output();
        }
    }
}

/// `pvm_catchout`: the output of tasks spawned from now on (and of
/// their children) is written to `ff`, line by line, with
/// `[t<tid>] ` before each line and `BEGIN`/`EOF` lines with
/// `PvmShowTids` (on by default); a null `ff` turns it off (later
/// spawns inherit our own destination again, and what is still sent is
/// dropped). `pvm_exit` waits (up to 30 s) until the output caught has
/// ended. Always returns 0.
///
/// # Safety
/// `ff` is null or a `FILE*` that stays open while catching is on.
#[no_mangle]
pub unsafe extern "C" fn pvm_catchout(ff: *mut libc::FILE) -> std::ffi::c_int {
    crate::ffi::with("pvm_catchout", |p| {
        let set = |p: &mut Pvm, k: i32, v: i32| p.opts[k as usize] = v;
        if ff.is_null() {
            for (k, from) in [
                (opt::OUTPUT_TID, opt::SELF_OUTPUT_TID),
                (opt::OUTPUT_CONTEXT, opt::SELF_OUTPUT_CONTEXT),
                (opt::OUTPUT_CODE, opt::SELF_OUTPUT_CODE),
            ] {
                let v = p.opts[from as usize].max(0);
                set(p, k, v);
            }
            // What copies still send is dropped, as PVM does once its
            // file is gone.
            p.catch = None;
        } else {
            let me = p.me;
            set(p, opt::OUTPUT_TID, me);
            set(p, opt::OUTPUT_CONTEXT, SYS_CTX);
            set(p, opt::OUTPUT_CODE, CATCH_TAG);
            let lines = p.catch.take().map(|(_, l)| l).unwrap_or_default();
            p.catch = Some((ff, lines));
        }
        Ok(0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn poke() {}

    #[test]
    fn a_copys_output_arrives_announced_then_in_order_then_ended() {
        let c = Collector::default();
        let mut cmd = std::process::Command::new("sh");
        cmd.args(["-c", "echo one; echo two >&2; printf three"]);
        let rd = capture(&mut cmd).unwrap();
        let mut child = cmd.spawn().unwrap();
        drop(cmd);
        let dest = Dest { tid: 0x40001, ctx: 0, code: 7 };
        c.announce(dest, 0x40002, TO_SPAWN, &0x40001i32.to_ne_bytes());
        c.watch(0x40002, Redirect { dest, ptid: 0x40001 }, rd, poke);
        child.wait().unwrap();
        let t0 = std::time::Instant::now();
        while !c.live().is_empty() && t0.elapsed().as_secs() < 10 {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let n = c.take();
        assert!(n.iter().all(|x| x.dest == dest));
        let counts: Vec<i32> = n.iter().map(|x| i32::from_ne_bytes(x.body[4..8].try_into().unwrap())).collect();
        // The spawner's announcement, then the reader's: it started.
        assert_eq!(&counts[..2], &[TO_SPAWN, TO_NEW]);
        assert_eq!(counts.last(), Some(&TO_EOF));
        assert_eq!(&n[0].body[8..], &0x40001i32.to_ne_bytes());
        let text: Vec<u8> = n[2..n.len() - 1].iter().flat_map(|x| x.body[8..].to_vec()).collect();
        assert_eq!(String::from_utf8_lossy(&text), "one\ntwo\nthree");
        let mut l = Lines::default();
        let lines: Vec<String> = n.iter().flat_map(|x| l.feed(&x.body, true)).collect();
        assert_eq!(
            lines,
            ["[t40002] BEGIN\n", "[t40002] one\n", "[t40002] two\n", "[t40002] three\n", "[t40002] EOF\n"]
        );
        assert!(!l.open());
    }

    #[test]
    fn destinations_round_trip_and_bad_ones_are_refused() {
        let d = Dest { tid: 0x40003, ctx: -5, code: 12 };
        assert_eq!(Dest::parse(&d.env()), Some(d));
        assert_eq!(Dest::parse("0,0,1"), None);
        assert_eq!(Dest::parse("x"), None);
        assert_eq!(Dest::parse("1,2"), None);
    }

    #[test]
    fn output_of_an_unknown_copy_and_bad_bodies_are_ignored() {
        let mut l = Lines::default();
        assert!(l.feed(&body(5, 3, b"abc"), true).is_empty());
        assert!(l.feed(&[1, 2], true).is_empty());
        assert_eq!(l.feed(&body(5, TO_NEW, &[0; 4]), false), Vec::<String>::new());
        assert_eq!(l.feed(&body(5, 4, b"a\nbc"), false), ["a\n"]);
        assert_eq!(l.feed(&body(5, TO_EOF, &[]), false), ["bc\n"]);
        // Still open until its spawn notice comes.
        assert!(l.open());
        assert!(l.feed(&body(5, TO_SPAWN, &[0; 4]), false).is_empty());
        assert!(!l.open());
    }
}
