//! `pvmd`, the daemon of one guest: it does only what a task cannot do
//! in-line (seed 000, "PVM": the daemon relays what cannot run in-line,
//! such as starting a process on another node; all daemons are equal).
//!
//! - Spawns programs on its guest for tasks of other guests: a request
//!   names the TIDs the spawner took for them in the task table, the
//!   program, its arguments and the spawner's search path; the daemon
//!   starts each copy with its TID and answers with what became of each.
//! - Reads the output pipes of the copies it started for a spawner with
//!   `PvmOutputTid` set and sends it on (`output`).
//! - Is the host's entry in the task table (TID with task number 0, the
//!   host's name): `pvm_config` lists hosts from these entries.
//! - About once a second, frees the entries of this guest's tasks that
//!   died without leaving and sends the notifications that are due, and
//!   collects the processes it started.
//! - About once a second, asks imcd which nodes are up and repairs a host
//!   that failed out of the tables ([`crate::repair`]): its tasks, group
//!   members and mailbox entries go, and the `PvmTaskExit` and
//!   `PvmHostDelete` notifications about them are sent.
//! - Puts its entry back if another daemon repaired its host out while
//!   it ran.
//! - When imcd goes away, lets go of every MEMORY CHANNEL mapping (a new
//!   imcd cannot own the adapter while any is held) and waits for it.
//! - Sleeps in between: a request opens a new UMP channel (both sides
//!   close it after the answer), which wakes the daemon's listener.
//!
//! Its own thread does everything; the spawn messages are JSON in a
//! context of the library's own ([`SYS_CTX`]).

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::consts::{self, err};
use crate::engine::{Engine, Msg};
use crate::notify::Notify;
use crate::output::{self, Collector};
use crate::repair::Watch;
use crate::spawn;
use crate::table::{self, State};
use crate::vm;

/// The context of the library's own messages: below every context a
/// program can set (`pvm_setcontext` takes 0 and up).
pub const SYS_CTX: i32 = i32::MIN + 7;
/// Tag of a barrier release (see `ffi`).
pub const BARRIER_TAG: i32 = 1;
/// Tag of a spawn request to a daemon.
pub const SPAWN_TAG: i32 = 2;
/// Tag of a daemon's answer.
pub const SPAWNED_TAG: i32 = 3;

/// Environment variables a spawner passes with a request: where to look
/// for the program, as on the spawner's guest.
pub const PASSED_ENV: [&str; 5] = ["PVM_ROOT", "PVM_ARCH", "PVM_EP", "HOME", "PVM_TMP"];

/// A spawn request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpawnRequest {
    pub task: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// The TIDs taken for the copies (state starting, on this host).
    pub tids: Vec<i32>,
    /// Every TID of the `pvm_spawn` call, for `pvm_siblings`.
    pub siblings: Vec<i32>,
    /// Where the copies' output goes (the spawner's `PvmOutputTid`), if
    /// anywhere: then the starter reads their pipes (`output`).
    #[serde(default)]
    pub output: Option<output::Redirect>,
}

/// A daemon's answer: per TID, the TID (started) or an error code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spawned {
    pub results: Vec<i32>,
}

/// The TID of host `host`'s daemon in the task table (task number 0).
pub fn daemon_tid(host: u32) -> i32 {
    table::tid(host, 0)
}

/// Starts `req`'s copies here; returns each one's process or error
/// code. With `req.output`, each copy's output goes to a pipe that a
/// reader of `out` reads (`poke` is called as it queues).
pub fn start(
    req: &SpawnRequest,
    children: &mut Vec<std::process::Child>,
    out: &Collector,
    poke: fn(),
) -> Vec<(i32, Result<u32, i32>)> {
    let env = |k: &str| req.env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let path = spawn::find(&req.task, &env);
    let siblings = req.siblings.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(",");
    req.tids
        .iter()
        .map(|&t| {
            let r = path.clone().and_then(|path| {
                let mut cmd = std::process::Command::new(&path);
                cmd.args(&req.args)
                    .env(spawn::ENV_TID, t.to_string())
                    .env(spawn::ENV_SIBLINGS, &siblings)
                    .stdin(std::process::Stdio::null());
                for (k, v) in &req.env {
                    cmd.env(k, v);
                }
                let pipe = match req.output {
                    Some(r) => {
                        cmd.env(output::ENV_OUT, r.dest.env());
                        // A copy that outlives its reader gets EPIPE on
                        // writing, not a signal that ends it.
                        // SAFETY: the closure runs in the child between
                        // fork and exec and calls only signal(2), which is
                        // async-signal-safe.
                        unsafe {
                            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                                libc::signal(libc::SIGPIPE, libc::SIG_IGN);
                                Ok(())
                            });
                        }
                        match output::capture(&mut cmd) {
                            Ok(rd) => Some((r, rd)),
                            Err(e) => {
                                eprintln!("libpvm: starting t{t:x}: {e}");
                                return Err(err::CANT_START);
                            }
                        }
                    }
                    None => None,
                };
                let started = cmd.spawn();
                // The pipe's write ends go with the command, so the reader
                // sees the end once the copy (and its children) close them.
                drop(cmd);
                match started {
                    Ok(child) => {
                        let pid = child.id();
                        children.push(child);
                        if let Some((r, rd)) = pipe {
                            out.watch(t, r, rd, poke);
                        }
                        Ok(pid)
                    }
                    Err(_) => Err(err::CANT_START),
                }
            });
            (t, r)
        })
        .collect()
}

/// Runs the daemon for ever (returns only an error that stops it). When
/// imcd goes away, the daemon lets go of every MEMORY CHANNEL mapping (a
/// new imcd cannot own the adapter while any is held) and waits for it.
pub fn run(wait_for_imcd: Duration) -> Result<(), String> {
    let mut wait = wait_for_imcd;
    loop {
        let t0 = Instant::now();
        let mut said = false;
        let v = loop {
            match vm::open() {
                Ok(v) => break v,
                Err(e) if t0.elapsed() < wait => {
                    // Said once per wait: a copy of the tables that stays
                    // empty waits for another node's daemon to store them
                    // again (repair.rs, Watch::came_back).
                    if !said {
                        eprintln!("pvmd: {e}; trying again");
                        said = true;
                    }
                    std::thread::sleep(Duration::from_millis(500));
                }
                Err(e) => return Err(e),
            }
        };
        match serve(v) {
            Ok(()) => eprintln!("pvmd: imcd went away: MEMORY CHANNEL released; waiting for imcd"),
            // imcd going away mid-way shows as any error; start afresh.
            Err(e) => {
                eprintln!("pvmd: {e}; starting afresh");
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        // A restarted imcd may take a while (its adapter is free once every
        // process let go); wait for it as long as it takes.
        wait = Duration::MAX;
    }
}

/// Serves until imcd goes away.
fn serve(v: vm::Vm) -> Result<(), String> {
    let host = v.tasks.host();
    let me = daemon_tid(host);
    let name = nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_default();
    // Listening first: a daemon that cannot listen yet (and starts
    // afresh) has not taken its entry.
    let mut eng = Engine::start(me, v.id).map_err(|e| e.to_string())?;
    let waker = ump::listen_waker(crate::engine::handle(v.id, me)).map_err(|e| e.to_string())?;
    let new = v.tasks.put(me, std::process::id() as i32, &name).map_err(|e| e.to_string())?;
    eprintln!("pvmd: host {host} ({name}), t{me:x}, virtual machine {:#x}", v.id);
    if new {
        // PvmHostAdd is not sent yet (docs/pvm.md, "Not implemented yet").
        eprintln!("pvmd: host {host} joins the virtual machine");
    }
    let mut children: Vec<std::process::Child> = Vec::new();
    let out = Collector::default();
    let mut looked = Instant::now();
    let mut watch = Watch::default();
    loop {
        let moved = eng.progress().unwrap_or(false);
        while let Some(m) = eng.take(-1, SPAWN_TAG, SYS_CTX) {
            serve_one(&v, &mut eng, &mut children, &out, m);
        }
        send_output(&v.tasks, &mut eng, me, &out);
        if looked.elapsed() >= Duration::from_secs(1) {
            looked = Instant::now();
            if !v.tasks.imcd_alive() {
                drop(waker);
                eng.stop();
                // The processes it started go on; they are init's now.
                std::mem::forget(children);
                return Ok(());
            }
            children.retain_mut(|c| !matches!(c.try_wait(), Ok(Some(_))));
            repair(&v, &mut watch, me, &name);
            let _ = send_notifications(&v.tasks, &v.notify, &mut eng, me);
        }
        if !moved {
            // Output being read is sent within a few milliseconds.
            let busy = eng.has_peers() || !out.live().is_empty();
            waker.sleep(Duration::from_millis(if busy { 5 } else { 1000 }));
        }
    }
}

/// Repairs out the hosts that failed ([`crate::repair`]): frees their
/// tasks, then their group members and mailbox entries; the
/// notifications about them are due at once. Puts this daemon's entry
/// back if it is missing (another daemon took this host for failed).
fn repair(v: &vm::Vm, watch: &mut Watch, me: i32, name: &str) {
    let listed = match watch.listed() {
        Ok(l) => l,
        // imcd busy or away: decide nothing now.
        Err(_) => return,
    };
    let host = table::host_of(me);
    let asked = watch.asked(v.tasks.store().refresh_request());
    if watch.came_back(&listed, vm::node_of_host(host), Instant::now()) || asked {
        match v.refresh() {
            Ok(()) => eprintln!("pvmd: a node came back or asked: stored the tables again in full for it"),
            Err(e) => eprintln!("pvmd: storing the tables again for a node that came back: {e}"),
        }
    }
    let Ok(tasks) = v.tasks.tasks() else { return };
    if !tasks.iter().any(|t| t.tid == me) && listed.contains(&vm::node_of_host(host)) {
        eprintln!("pvmd: this host was taken out of the virtual machine; joining again");
        let _ = v.tasks.put(me, std::process::id() as i32, name);
    }
    let hosts = tasks.iter().map(|t| table::host_of(t.tid)).collect();
    let failed = watch.failed(&hosts, &listed, host, Instant::now());
    if failed.is_empty() {
        return;
    }
    for h in failed {
        match v.tasks.remove_host(h) {
            Ok(gone) if gone.is_empty() => {}
            Ok(gone) => eprintln!(
                "pvmd: host {h} (node {}) failed: imcd has not listed it for {} s; freed its {} task table entries",
                vm::node_of_host(h),
                crate::repair::HOST_AWAY.as_secs(),
                gone.len()
            ),
            Err(e) => eprintln!("pvmd: freeing the entries of failed host {h}: {e}"),
        }
    }
    // Their group members and mailbox entries go with them.
    let live = v.tasks.live();
    let _ = v.groups.leave_all(0, &|t| live.contains(t));
    let live = v.tasks.live();
    let _ = v.mbox.leave(0, &|t| live.contains(t));
}

/// Answers one spawn request and closes its channel.
fn serve_one(v: &vm::Vm, eng: &mut Engine, children: &mut Vec<std::process::Child>, out: &Collector, m: Msg) {
    let from = m.src;
    let results = match serde_json::from_slice::<SpawnRequest>(&m.data) {
        Ok(req) => start(&req, children, out, || {})
            .into_iter()
            .map(|(t, r)| match r {
                Ok(pid) => {
                    let _ = v.tasks.set_pid(t, pid as i32);
                    t
                }
                Err(code) => {
                    let _ = v.tasks.remove(t);
                    code
                }
            })
            .collect(),
        Err(e) => {
            eprintln!("pvmd: a bad spawn request from t{from:x}: {e}");
            vec![]
        }
    };
    let reply = serde_json::to_vec(&Spawned { results }).unwrap_or_default();
    let tasks = &v.tasks;
    if let Err(e) = eng.send(from, (SPAWNED_TAG, SYS_CTX, consts::DATA_RAW), &reply, &mut |t| {
        tasks.find(t).map(|x| x.is_some()).unwrap_or(true)
    }) {
        eprintln!("pvmd: answering t{from:x}: {e}");
    }
    // Both sides close the channel after the answer, so the next request
    // opens a new one (which wakes this daemon's listener) and neither
    // side has an old one left.
    eng.close(from);
}

/// Sends the output notices `out` queued (`output`), from the host's
/// daemon TID as in PVM; a destination that is gone gets none.
pub fn send_output(tasks: &table::Table, eng: &mut Engine, me: i32, out: &Collector) {
    for n in out.take() {
        let _ = eng.send_from(
            notifier_tid(me),
            n.dest.tid,
            (n.dest.code, n.dest.ctx, consts::DATA_DEFAULT),
            &n.body,
            &mut |t| tasks.find(t).map(|x| x.is_some()).unwrap_or(true),
        );
    }
}

/// The TID notifications come from, as in PVM: the daemon flag
/// (`0x80000000`) with the host field of `tid`, the task or daemon that
/// noticed.
pub fn notifier_tid(tid: i32) -> i32 {
    (0x8000_0000u32 as i32) | (tid & table::TID_HOST)
}

/// Sends the notifications that are due (requests about tasks no longer
/// in the task table), from `notifier_tid(me)`; used by the daemon and by
/// every waiting task.
pub fn send_notifications(tasks: &table::Table, notify: &Notify, eng: &mut Engine, me: i32) -> Result<(), i32> {
    let live = tasks.live();
    for (to, tag, ctx, on) in notify.due(&|t| live.contains(t))? {
        // A watcher gone meanwhile needs no message.
        let _ = eng.send_from(notifier_tid(me), to, (tag, ctx, consts::DATA_DEFAULT), &on.to_ne_bytes(), &mut |t| {
            live.contains(t)
        });
    }
    Ok(())
}

/// Hosts of the virtual machine: (host number, daemon TID, name), from
/// the daemons' entries.
pub fn hosts(tasks: &[table::Task]) -> Vec<(u32, i32, String)> {
    let mut h: Vec<_> = tasks
        .iter()
        .filter(|t| t.tid & table::TID_LOCAL == 0 && t.state == State::Running)
        .map(|t| (table::host_of(t.tid), t.tid, t.name.clone()))
        .collect();
    h.sort();
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_starts_each_copy_with_its_tid_or_says_why_not() {
        let req = SpawnRequest {
            task: "/bin/true".into(),
            args: vec![],
            env: vec![],
            tids: vec![0x40005, 0x40006],
            siblings: vec![0x40005, 0x40006],
            output: None,
        };
        let mut children = Vec::new();
        let r = start(&req, &mut children, &Collector::default(), || {});
        assert_eq!(r.len(), 2);
        assert!(r.iter().all(|(_, x)| x.is_ok()));
        for c in &mut children {
            assert!(c.wait().unwrap().success());
        }
        let missing =
            SpawnRequest { task: "no-such-program".into(), env: vec![("PVM_ROOT".into(), "/nowhere".into())], ..req };
        assert!(start(&missing, &mut children, &Collector::default(), || {})
            .iter()
            .all(|(_, x)| *x == Err(err::NO_FILE)));
        let j = serde_json::to_vec(&missing).unwrap();
        assert_eq!(serde_json::from_slice::<SpawnRequest>(&j).unwrap(), missing);
    }
}
