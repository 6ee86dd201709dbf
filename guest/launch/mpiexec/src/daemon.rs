//! `mpid`: the launch daemon of one node. It listens on its UMP handle
//! ([`crate::proto::mpid_handle`]); each `mpiexec` that wants ranks here
//! opens a channel to it and sends one [`Start`]; mpid starts the ranks
//! ([`crate::ranks`]), forwards their output and their ends, and ends them
//! (SIGTERM to each rank's process group, SIGKILL [`KILL_GRACE`] later)
//! when asked ([`Request::Kill`]), when the channel closes, when the
//! `mpiexec` on the other end dies, or when nothing has come from it for
//! [`LEASE`] (it pings every second).
//!
//! Threads: [`run`] owns all state on the caller's thread (UMP calls,
//! spawning, signalling); the ranks' reader and waiter threads only send
//! events to it.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use thiserror::Error;
use ump::{ChanError, Event, UmpError, Want};

use crate::proto::{self, Reply, Request, Start, JOB_LIMIT, MAX_MESSAGE, MAX_RANKS};
use crate::ranks::{self, Launch, RankEvent};

/// SIGTERM to SIGKILL.
pub const KILL_GRACE: Duration = Duration::from_secs(2);
/// A job whose `mpiexec` has said nothing for this long is ended.
pub const LEASE: Duration = Duration::from_secs(15);
/// A channel that sends no request for this long is closed.
const IDLE_CHANNEL: Duration = Duration::from_secs(30);
/// How often each channel's other side is checked for life.
const PROBE_EVERY: Duration = Duration::from_millis(500);
/// How long a reply may wait for room in the channel: an `mpiexec` that
/// reads nothing for this long (its own output blocked) loses its job.
const WRITE_WAIT: Duration = Duration::from_secs(30);

/// Why mpid cannot run.
#[derive(Debug, Error)]
pub enum DaemonError {
    /// Another mpid serves this handle.
    #[error("another mpid serves handle {0:#x} (lock {1})")]
    Running(u64, String),
    /// UMP could not be set up.
    #[error("UMP: {0}")]
    Ump(#[from] UmpError),
    /// The lock file.
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
}

/// How mpid was started.
#[derive(Debug, Clone)]
pub struct Options {
    /// This node.
    pub node: u32,
    /// Handle base ([`proto::mpid_base`]).
    pub base: u64,
    /// Wait this long for imcd before listening (0: do not wait).
    pub wait_imcd: Duration,
}

enum RankState {
    Running(u32),
    Done,
}

/// One channel and the job it asked for.
struct Job {
    job: u32,
    ranks: HashMap<u32, RankState>,
    started: bool,
    opened: Instant,
    last_heard: Instant,
    last_probe: Instant,
    /// When SIGTERM went out, and whether SIGKILL did.
    ending: Option<Instant>,
    killed: bool,
    /// The channel is closed or its other side gone.
    gone: bool,
}

impl Job {
    fn new() -> Job {
        let now = Instant::now();
        Job {
            job: 0,
            ranks: HashMap::new(),
            started: false,
            opened: now,
            last_heard: now,
            last_probe: now,
            ending: None,
            killed: false,
            gone: false,
        }
    }

    fn running(&self) -> impl Iterator<Item = u32> + '_ {
        self.ranks.values().filter_map(|s| match s {
            RankState::Running(pid) => Some(*pid),
            RankState::Done => None,
        })
    }

    fn all_done(&self) -> bool {
        self.running().next().is_none()
    }

    /// Starts ending the job's ranks (once).
    fn end(&mut self) {
        if self.ending.is_none() {
            self.ending = Some(Instant::now());
            for pid in self.running() {
                ranks::signal_group(pid, Signal::SIGTERM);
            }
        }
    }
}

struct Daemon {
    node: u32,
    jobs: HashMap<i32, Job>,
    events: Sender<RankEvent>,
    buf: Vec<u8>,
    /// The guest kernel's count of OOM kills when we last looked.
    oom_kills: u64,
    /// Wakes an idle mpid when a channel may have opened.
    waker: Option<ump::ListenWaker>,
    /// Since when, with no job, some channel has not been complete.
    opening_since: Option<Instant>,
}

/// The guest kernel's count of processes its OOM killer ended
/// (`oom_kill` in `/proc/vmstat`, Linux 4.13 and later).
fn oom_kills() -> u64 {
    std::fs::read_to_string("/proc/vmstat")
        .ok()
        .and_then(|v| v.lines().find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok()))
        .unwrap_or(0)
}

/// The guest's memory in MiB (`MemTotal`), for messages.
fn guest_mib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines().find_map(|l| l.strip_prefix("MemTotal:")?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
        })
        .map_or(0, |k| k >> 10)
}

fn log(msg: &str) {
    eprintln!("mpid: {msg}");
}

/// Holds an exclusive lock for `handle` (one mpid per handle).
fn lock(handle: u64) -> Result<nix::fcntl::Flock<std::fs::File>, DaemonError> {
    let path = format!("/dev/shm/mpid-{handle:016x}.lock");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| DaemonError::Io(path.clone(), e))?;
    nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock)
        .map_err(|_| DaemonError::Running(handle, path))
}

/// Waits up to `limit` for imcd to answer with a node id (or until `stop`).
fn wait_for_imcd(limit: Duration, stop: &AtomicBool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < limit && !stop.load(Ordering::Relaxed) {
        if imc_client::Imc::connect().ok().and_then(|i| i.regs().ok()?.node()).is_some() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    false
}

/// How often a serving mpid checks that imcd is still there.
const IMCD_CHECK: Duration = Duration::from_secs(1);

/// Serves until `stop` is set; then ends every rank and returns.
///
/// If imcd goes away (killed or restarted), mpid's MEMORY CHANNEL
/// mappings belong to a directory that no longer exists, and the
/// device files they hold keep the adapter busy, so a new imcd could not
/// open it. mpid then ends its jobs, drops every mapping ([`ump::exit`]),
/// waits for an imcd to answer and listens again. The same when this node
/// left the cluster (a link outage past imcd's grace): its attachments,
/// the listening inbox among them, were revoked, and nobody could reach
/// this mpid any more.
pub fn run(opts: &Options, stop: &Arc<AtomicBool>) -> Result<(), DaemonError> {
    let handle = proto::mpid_handle(opts.base, opts.node);
    let _lock = lock(handle)?;
    let mut wait = opts.wait_imcd;
    if !wait.is_zero() && !wait_for_imcd(wait, stop) && !stop.load(Ordering::Relaxed) {
        log(&format!("imcd did not answer within {} s: serving this guest only", wait.as_secs()));
    }
    loop {
        let imcd_lost = serve(opts, handle, wait, stop)?;
        if !imcd_lost {
            return Ok(());
        }
        log("MEMORY CHANNEL released; waiting for imcd");
        while !stop.load(Ordering::Relaxed) && !wait_for_imcd(Duration::from_secs(3600), stop) {}
        if stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        // A new imcd may answer before it can allocate: listen() retries.
        wait = Duration::from_secs(120);
    }
}

/// One life of the listener: returns true when it ended because imcd went
/// away or this node left the cluster, false when `stop` was set.
fn serve(opts: &Options, handle: u64, wait: Duration, stop: &AtomicBool) -> Result<bool, DaemonError> {
    ump::init(ump::Config::default())?;
    let t0 = Instant::now();
    loop {
        match ump::listen(handle, Want::Any) {
            Ok(()) => break,
            Err(e) if t0.elapsed() < wait && !stop.load(Ordering::Relaxed) => {
                log(&format!("listen: {e}; trying again"));
                std::thread::sleep(Duration::from_secs(1));
            }
            Err(e) => {
                let _ = ump::exit();
                return Err(e.into());
            }
        }
    }
    let mc = ump::info().map(|i| i.mc_available).unwrap_or(false);
    log(&format!(
        "node {} listening on handle {handle:#x} ({})",
        opts.node,
        if mc { "shared memory and MEMORY CHANNEL" } else { "shared memory only: no imcd" }
    ));
    // Idle, mpid sleeps until an mpiexec may have opened a channel.
    let waker = ump::listen_waker(handle)
        .inspect_err(|e| log(&format!("cannot sleep until a channel opens ({e}): looking every {NAP:?}")))
        .ok();
    let (tx, rx) = mpsc::channel();
    let mut d = Daemon {
        node: opts.node,
        jobs: HashMap::new(),
        events: tx,
        buf: vec![0u8; MAX_MESSAGE],
        oom_kills: oom_kills(),
        waker,
        opening_since: None,
    };
    // This node's departures so far (imcd publishes them): one more means
    // our attachments were revoked.
    let departures = imc_client::departures();
    let mut checked = Instant::now();
    let mut lost = None;
    while !stop.load(Ordering::Relaxed) {
        d.turn(&rx);
        if mc && checked.elapsed() >= IMCD_CHECK {
            checked = Instant::now();
            if !ump::info().map(|i| i.imcd_alive).unwrap_or(false) {
                lost = Some("imcd went away");
                break;
            }
            if imc_client::departures() != departures {
                lost = Some("this node left the cluster (its MEMORY CHANNEL attachments were revoked)");
                break;
            }
        }
    }
    let imcd_lost = lost.is_some();
    log(&match lost {
        Some(why) => format!("{why}: ending every rank"),
        None => "stopping: ending every rank".into(),
    });
    for j in d.jobs.values_mut() {
        j.end();
    }
    let t0 = Instant::now();
    while d.jobs.values().any(|j| !j.all_done()) && t0.elapsed() < KILL_GRACE + Duration::from_secs(2) {
        d.turn(&rx);
    }
    let _ = ump::exit();
    Ok(imcd_lost)
}

/// How long a round waits for a rank event when nothing else happens.
const NAP: Duration = Duration::from_millis(50);
/// How long a round sleeps while a channel an opener asked for is not
/// complete yet (the opener sends its header again every 10 ms).
const OPENING_NAP: Duration = Duration::from_millis(5);
/// How long an incomplete channel keeps mpid looking every
/// [`OPENING_NAP`].
const OPENING_LIMIT: Duration = Duration::from_secs(10);
/// How long a round of an mpid with no channel sleeps on its
/// [`ump::ListenWaker`] (an opener wakes it at once): the imcd check
/// ([`IMCD_CHECK`]) is what it still wakes for.
const IDLE_NAP: Duration = Duration::from_secs(1);

impl Daemon {
    /// One round: channel events, rank events, time-outs, then a short sleep.
    fn turn(&mut self, rx: &Receiver<RankEvent>) {
        loop {
            match ump::wait(None, Some(Duration::ZERO)) {
                Ok(Some(ev)) => self.ump_event(ev),
                Ok(None) => break,
                Err(e) => {
                    log(&format!("wait: {e}"));
                    break;
                }
            }
        }
        while let Ok(ev) = rx.try_recv() {
            self.rank_event(ev);
        }
        self.housekeeping();
        // With no channel there are no ranks: sleep until an opener comes.
        // Twenty looks a second were 2.2% of a host core per idle guest
        // (scripts/idle-bench.sh).
        if let (true, Some(w)) = (self.jobs.is_empty(), &self.waker) {
            // A channel accepted but not complete yet: its completion (the
            // opener's header arriving again) wakes nobody, so look again
            // soon rather than after a whole idle nap (that was most of a
            // job's start-up on other guests). For a while only: an
            // opener that died leaves the channel half open.
            if !ump::info().is_ok_and(|i| i.channels > 0) {
                self.opening_since = None;
            } else if self.opening_since.get_or_insert_with(Instant::now).elapsed() < OPENING_LIMIT {
                std::thread::sleep(OPENING_NAP);
                return;
            }
            w.sleep(IDLE_NAP);
            return;
        }
        self.opening_since = None;
        // Rank events (output, exits) end the nap at once; only requests
        // from mpiexec wait for it. A short nap is not free: under TCG each
        // timer wake-up costs the guest's vCPU several hundred µs, taken
        // from the ranks (at 5 ms, about a tenth of it during every job).
        match rx.recv_timeout(NAP) {
            Ok(ev) => self.rank_event(ev),
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {}
        }
    }

    fn ump_event(&mut self, ev: Event) {
        match ev {
            Event::Open(id) => {
                self.jobs.insert(id, Job::new());
            }
            Event::Message(id) => self.read(id, Duration::from_secs(1)),
            Event::Closed(id) => self.lost(id, "mpiexec closed its channel"),
            Event::WriteDone(_) | Event::ReadDone(_) => {}
        }
    }

    /// Reads and handles one message of channel `id` (waiting up to
    /// `wait`; a probe uses a tiny wait to see whether the other side lives).
    fn read(&mut self, id: i32, wait: Duration) {
        match ump::read_timeout(id, &mut self.buf, wait) {
            Ok(n) => {
                let msg = self.buf[..n].to_vec();
                self.request(id, &msg);
            }
            Err(UmpError::Channel(ChanError::Timeout)) => {}
            Err(UmpError::Channel(ChanError::TooBig(n))) => {
                // Take it out of the channel, then refuse it.
                if n <= 16 * MAX_MESSAGE {
                    let mut big = vec![0u8; n];
                    let _ = ump::read_timeout(id, &mut big, wait);
                    self.reply(id, &Reply::Error { rank: None, message: format!("request of {n} bytes is too long") });
                } else {
                    self.reply(id, &Reply::Error { rank: None, message: format!("request of {n} bytes is too long") });
                    self.lost(id, "sent a request too long to read");
                }
            }
            Err(e) => self.lost(id, &e.to_string()),
        }
    }

    fn reply(&mut self, id: i32, r: &Reply) {
        let Some(j) = self.jobs.get(&id) else { return };
        if j.gone {
            return;
        }
        let msg = match proto::encode(r) {
            Ok(m) => m,
            Err(e) => {
                log(&format!("cannot encode a reply: {e}"));
                return;
            }
        };
        if let Err(e) = ump::write_timeout(id, &msg, WRITE_WAIT) {
            self.lost(id, &format!("reply: {e}"));
        }
    }

    /// The channel's other side is gone: end its ranks.
    fn lost(&mut self, id: i32, why: &str) {
        let Some(j) = self.jobs.get_mut(&id) else { return };
        if !j.gone {
            j.gone = true;
            if j.started && !j.all_done() {
                log(&format!("job {}: {why}; ending its ranks", j.job));
            }
            j.end();
        }
    }

    fn request(&mut self, id: i32, msg: &[u8]) {
        let Some(j) = self.jobs.get_mut(&id) else { return };
        j.last_heard = Instant::now();
        match proto::decode::<Request>(msg) {
            Ok(Request::Ping) => {}
            Ok(Request::Kill) => {
                if !j.all_done() {
                    log(&format!("job {}: ending its ranks as asked", j.job));
                }
                j.end();
            }
            Ok(Request::Start(s)) => self.start(id, s),
            Err(e) => self.reply(id, &Reply::Error { rank: None, message: format!("node {}: {e}", self.node) }),
        }
    }

    /// What is wrong with a start request, if anything.
    fn check(&self, id: i32, s: &Start) -> Result<(), String> {
        if s.job == 0 || s.job >= JOB_LIMIT {
            return Err(format!("job id {} is out of range (1 to {})", s.job, JOB_LIMIT - 1));
        }
        if s.size == 0 || s.size > MAX_RANKS {
            return Err(format!("job size {} is out of range (1 to {MAX_RANKS})", s.size));
        }
        if s.ranks.is_empty() {
            return Err("no ranks to start".into());
        }
        let mut seen = std::collections::HashSet::new();
        for &r in &s.ranks {
            if r >= s.size {
                return Err(format!("rank {r} is not below the job size {}", s.size));
            }
            if !seen.insert(r) {
                return Err(format!("rank {r} is listed twice"));
            }
        }
        if s.argv.first().is_none_or(|p| p.is_empty()) {
            return Err("no program to run".into());
        }
        if s.argv.iter().any(|a| a.contains('\0')) {
            return Err("an argument holds a NUL byte".into());
        }
        if let Some((k, _)) = s.env.iter().find(|(k, v)| k.is_empty() || k.contains(['=', '\0']) || v.contains('\0')) {
            return Err(format!("bad environment variable name {k:?}"));
        }
        if self.jobs.get(&id).is_some_and(|j| j.started) {
            return Err("this channel has started its job already".into());
        }
        for j in self.jobs.values() {
            if j.job == s.job && !j.all_done() && s.ranks.iter().any(|r| j.ranks.contains_key(r)) {
                return Err(format!("ranks of job {} run here already", s.job));
            }
        }
        Ok(())
    }

    fn start(&mut self, id: i32, s: Start) {
        if let Err(why) = self.check(id, &s) {
            return self.reply(id, &Reply::Error { rank: None, message: format!("node {}: {why}", self.node) });
        }
        let mut cwd = s.cwd.clone();
        if !Path::new(&cwd).is_dir() {
            if s.cwd_required {
                let message = format!("node {}: working folder {cwd} does not exist", self.node);
                return self.reply(id, &Reply::Error { rank: None, message });
            }
            cwd = "/".into();
        }
        if let Some(j) = self.jobs.get_mut(&id) {
            j.job = s.job;
            j.started = true;
        }
        log(&format!("job {}: starting ranks {:?} of {}: {:?}", s.job, s.ranks, s.size, s.argv));
        for &rank in &s.ranks {
            let local = s.ranks.len() as u32;
            let l = Launch { key: id, job: s.job, rank, size: s.size, local, argv: &s.argv, env: &s.env, cwd: &cwd };
            match ranks::spawn(&l, &self.events) {
                Ok(pid) => {
                    if let Some(j) = self.jobs.get_mut(&id) {
                        j.ranks.insert(rank, RankState::Running(pid));
                    }
                    self.reply(id, &Reply::Started { rank, pid });
                }
                Err(e) => {
                    let message = format!("node {}: {e}", self.node);
                    log(&format!("job {}: rank {rank}: {message}", s.job));
                    self.reply(id, &Reply::Error { rank: Some(rank), message });
                    if let Some(j) = self.jobs.get_mut(&id) {
                        j.end();
                    }
                    return;
                }
            }
        }
    }

    fn rank_event(&mut self, ev: RankEvent) {
        match ev {
            RankEvent::Output { key, rank, fd, data } => {
                let data = String::from_utf8_lossy(&data).into_owned();
                self.reply(key, &Reply::Output { rank, fd, data });
            }
            RankEvent::Exited { key, rank, code, signal } => {
                if let Some(j) = self.jobs.get_mut(&key) {
                    j.ranks.insert(rank, RankState::Done);
                }
                // A rank the guest's OOM killer took dies of SIGKILL; say so
                // (on its standard error), with the knob that helps.
                let kills = oom_kills();
                if signal == Some(libc::SIGKILL) && kills > self.oom_kills {
                    let data = format!(
                        "mpid: rank {rank} was killed by node{}'s out-of-memory killer: the guest has {} MiB \
                         (more with [guest] memory_mib in the cluster's config, or fewer ranks per guest)\n",
                        self.node,
                        guest_mib()
                    );
                    log(data.trim_end());
                    self.reply(key, &Reply::Output { rank, fd: 2, data });
                }
                self.oom_kills = kills;
                self.reply(key, &Reply::Exited { rank, code, signal });
            }
        }
    }

    /// Probes, leases, SIGKILL after the grace, and forgetting finished channels.
    fn housekeeping(&mut self) {
        let now = Instant::now();
        let ids: Vec<i32> = self.jobs.keys().copied().collect();
        for id in ids {
            let Some(j) = self.jobs.get_mut(&id) else { continue };
            if let Some(t) = j.ending {
                if !j.killed && now.duration_since(t) >= KILL_GRACE {
                    j.killed = true;
                    for pid in j.running() {
                        ranks::signal_group(pid, Signal::SIGKILL);
                    }
                }
            }
            if !j.gone {
                if j.started && now.duration_since(j.last_heard) > LEASE {
                    let job = j.job;
                    self.lost(id, &format!("no word from mpiexec for {} s", LEASE.as_secs()));
                    log(&format!("job {job}: lease ran out"));
                    continue;
                }
                if !j.started && now.duration_since(j.opened) > IDLE_CHANNEL {
                    self.lost(id, "no request");
                    continue;
                }
                if now.duration_since(j.last_probe) >= PROBE_EVERY {
                    j.last_probe = now;
                    self.read(id, Duration::from_millis(1));
                }
            }
            let Some(j) = self.jobs.get(&id) else { continue };
            if j.gone && j.all_done() {
                if j.started {
                    log(&format!("job {}: done", j.job));
                }
                self.jobs.remove(&id);
                let _ = ump::close(id);
            }
        }
    }
}
