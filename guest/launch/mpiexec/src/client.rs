//! `mpiexec`'s side of one job: connects to the `mpid` of every node in
//! the plan over UMP, asks each to start its ranks, prints their output,
//! and decides the exit code. Every rank goes through an `mpid`, this
//! node's included (one path).
//!
//! The job ends when every rank has ended, or early: a rank that fails
//! (exit code other than 0, a signal, or it could not start), an `mpid`
//! lost, a signal to `mpiexec`, `-timeout`, or the end of standard input
//! with `-end-on-stdin-eof`. Ending early means a `Kill` to every `mpid`
//! and up to [`END_WAIT`] for the ranks' ends. Every wait has a deadline.
//!
//! Threads: [`run`] runs on the caller's thread; the signal handlers and
//! the standard-input watcher only set the flags it looks at.

use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use thiserror::Error;
use ump::{Event, UmpError, Want};

use crate::proto::{self, Reply, Request, Start, MAX_MESSAGE};

/// How long the ranks get to end once the job is ending.
pub const END_WAIT: Duration = Duration::from_secs(10);
/// How long an `mpid` gets to start its ranks.
const START_WAIT: Duration = Duration::from_secs(15);
/// How often `mpiexec` tells each `mpid` it is still there.
const PING_EVERY: Duration = Duration::from_secs(1);
/// After this long without a message, the event loop naps 20 ms, not 2.
const QUIET_AFTER: Duration = Duration::from_millis(100);
/// How long a request may wait for room in a channel.
const WRITE_WAIT: Duration = Duration::from_secs(5);

/// Exit code when `mpiexec` itself fails.
pub const EXIT_LAUNCH_FAILED: i32 = 255;
/// Exit code after `-timeout`.
pub const EXIT_TIMEOUT: i32 = 124;

/// Why a job could not even begin.
#[derive(Debug, Error)]
pub enum ClientError {
    /// UMP said no.
    #[error("UMP: {0}")]
    Ump(#[from] UmpError),
    /// No `mpid` answered.
    #[error("no mpid answered on {0} within {1} s (is mpid running there? see /var/log/mpid.log)")]
    NoDaemon(String, u64),
    /// A request could not be encoded.
    #[error("{0}")]
    Proto(#[from] proto::ProtoError),
    /// Stopped by a signal before the ranks were asked for.
    #[error("stopped by signal {0} before the job started")]
    Signal(usize),
}

/// A job, placed.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Job id.
    pub job: u32,
    /// For each rank, its node.
    pub node_of: Vec<u32>,
    /// Program and arguments.
    pub argv: Vec<String>,
    /// Variables for the ranks.
    pub env: Vec<(String, String)>,
    /// Working folder.
    pub cwd: String,
    /// Whether a node without `cwd` is an error.
    pub cwd_required: bool,
}

/// How to run it.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `mpid` handle base.
    pub base: u64,
    /// How long to wait for each `mpid` to answer.
    pub connect_wait: Duration,
    /// Prefix output lines with `[rank] `.
    pub prepend_rank: bool,
    /// Job time limit.
    pub timeout: Option<Duration>,
}

/// What can make `mpiexec` end the job (set by other threads).
#[derive(Debug, Clone, Default)]
pub struct Stops {
    /// The number of a signal received (0: none).
    pub signal: Arc<AtomicUsize>,
    /// Standard input ended (with `-end-on-stdin-eof`).
    pub stdin_eof: Arc<AtomicBool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RankState {
    Pending,
    Running,
    Done,
}

struct Node {
    node: u32,
    chan: i32,
    ranks: Vec<u32>,
    live: bool,
}

struct Job<'a> {
    plan: &'a Plan,
    set: &'a Settings,
    nodes: Vec<Node>,
    state: Vec<RankState>,
    /// Exit code of the first failure.
    failure: Option<i32>,
    ending: Option<Instant>,
    line_start: HashMap<(u32, u8), bool>,
    buf: Vec<u8>,
}

fn say(msg: &str) {
    eprintln!("mpiexec: {msg}");
}

/// With `MPIEXEC_TRACE` set, each phase of the job and when it came
/// (seconds since `mpiexec` started), on standard error.
fn trace(msg: &str) {
    static T0: std::sync::OnceLock<Option<Instant>> = std::sync::OnceLock::new();
    if let Some(t0) = T0.get_or_init(|| std::env::var_os("MPIEXEC_TRACE").map(|_| Instant::now())) {
        eprintln!("mpiexec: [{:7.3} s] {msg}", t0.elapsed().as_secs_f64());
    }
}

fn node_name(n: u32) -> String {
    format!("node{n}")
}

/// A fresh job id (1 to [`proto::JOB_LIMIT`] - 1), from the kernel's
/// random numbers.
pub fn fresh_job_id() -> u32 {
    let mut b = [0u8; 4];
    let ok = std::fs::File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b)).is_ok();
    let mut x = u32::from_le_bytes(b);
    if !ok {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        x = t.subsec_nanos() ^ std::process::id().rotate_left(16);
    }
    1 + x % (proto::JOB_LIMIT - 1)
}

/// Runs the job; returns `mpiexec`'s exit code. Errors only before any
/// rank was asked for.
pub fn run(plan: &Plan, set: &Settings, stops: &Stops) -> Result<i32, ClientError> {
    trace("start");
    ump::init(ump::Config::default())?;
    trace("UMP up");
    let r = run_inner(plan, set, stops);
    trace("job over");
    let _ = ump::exit();
    trace("UMP closed");
    r
}

fn run_inner(plan: &Plan, set: &Settings, stops: &Stops) -> Result<i32, ClientError> {
    let me = proto::client_handle(plan.job);
    let mut by_node: Vec<(u32, Vec<u32>)> = Vec::new();
    for (rank, &node) in plan.node_of.iter().enumerate() {
        match by_node.iter_mut().find(|(n, _)| *n == node) {
            Some((_, v)) => v.push(rank as u32),
            None => by_node.push((node, vec![rank as u32])),
        }
    }
    let mut nodes = Vec::new();
    for (node, ranks) in by_node {
        let chan = ump::open(me, proto::mpid_handle(set.base, node), Want::Any)?;
        trace(&format!("asked node{node}'s mpid for a channel"));
        nodes.push(Node { node, chan, ranks, live: true });
    }
    // Every mpid answers, or we give up.
    let t0 = Instant::now();
    let mut open = vec![false; nodes.len()];
    while open.iter().any(|o| !o) {
        let sig = stops.signal.load(Ordering::Relaxed);
        if sig != 0 {
            return Err(ClientError::Signal(sig));
        }
        if let Some(Event::Open(id)) = ump::wait(None, Some(Duration::from_millis(20)))? {
            if let Some(i) = nodes.iter().position(|n| n.chan == id) {
                open[i] = true;
                trace(&format!("node{}'s mpid answered", nodes[i].node));
            }
        }
        if t0.elapsed() > set.connect_wait {
            let i = open.iter().position(|o| !o).unwrap_or(0);
            return Err(ClientError::NoDaemon(node_name(nodes[i].node), set.connect_wait.as_secs()));
        }
    }
    let mut job = Job {
        plan,
        set,
        state: vec![RankState::Pending; plan.node_of.len()],
        nodes,
        failure: None,
        ending: None,
        line_start: HashMap::new(),
        buf: vec![0u8; MAX_MESSAGE],
    };
    // Where every rank runs, so that a rank knows which of its channels
    // go over MEMORY CHANNEL before it opens any (it opens them on first use).
    let mut env = plan.env.clone();
    env.push(("MCMPI_NODES".into(), nodes_var(&plan.node_of)));
    for i in 0..job.nodes.len() {
        let start = Request::Start(Start {
            job: plan.job,
            size: plan.node_of.len() as u32,
            ranks: job.nodes[i].ranks.clone(),
            argv: plan.argv.clone(),
            env: env.clone(),
            cwd: plan.cwd.clone(),
            cwd_required: plan.cwd_required,
        });
        job.send(i, &start);
    }
    Ok(job.serve(stops))
}

/// `MCMPI_NODES`: each rank's node in rank order, as runs of
/// `NODE*COUNT` separated by commas (`0*4,1*4`: ranks 0-3 on node 0, 4-7
/// on node 1); read by the MPI library (`mpi::launch::nodes_from_var`).
pub fn nodes_var(node_of: &[u32]) -> String {
    let mut runs: Vec<(u32, usize)> = Vec::new();
    for &n in node_of {
        match runs.last_mut() {
            Some((m, c)) if *m == n => *c += 1,
            _ => runs.push((n, 1)),
        }
    }
    runs.iter().map(|(n, c)| format!("{n}*{c}")).collect::<Vec<_>>().join(",")
}

impl Job<'_> {
    fn send(&mut self, i: usize, r: &Request) {
        if !self.nodes[i].live {
            return;
        }
        let res = proto::encode(r)
            .map_err(|e| e.to_string())
            .and_then(|m| ump::write_timeout(self.nodes[i].chan, &m, WRITE_WAIT).map_err(|e| e.to_string()));
        if let Err(e) = res {
            self.node_lost(i, &e);
        }
    }

    fn left(&self) -> usize {
        self.state.iter().filter(|s| **s != RankState::Done).count()
    }

    /// Ends the job: a Kill to every mpid; `why` is printed with the
    /// number of ranks being ended; `code` is the exit code unless an
    /// earlier failure set one.
    fn end(&mut self, why: &str, code: i32) {
        if self.failure.is_none() {
            self.failure = Some(code);
        }
        if self.ending.is_some() {
            return;
        }
        let left = self.left();
        match left {
            0 => say(why),
            1 => say(&format!("{why}; ending the other rank")),
            n => say(&format!("{why}; ending the other {n} ranks")),
        }
        self.ending = Some(Instant::now());
        for i in 0..self.nodes.len() {
            self.send(i, &Request::Kill);
        }
    }

    fn node_lost(&mut self, i: usize, why: &str) {
        if !self.nodes[i].live {
            return;
        }
        self.nodes[i].live = false;
        let mut lost = 0;
        for &r in &self.nodes[i].ranks {
            if self.state[r as usize] != RankState::Done {
                self.state[r as usize] = RankState::Done;
                lost += 1;
            }
        }
        if lost > 0 {
            let node = node_name(self.nodes[i].node);
            self.end(&format!("lost mpid on {node} ({why}) with {lost} rank(s) on it"), EXIT_LAUNCH_FAILED);
        }
    }

    fn serve(&mut self, stops: &Stops) -> i32 {
        let started = Instant::now();
        let mut last_ping = Instant::now();
        let mut quiet_since = Instant::now();
        let mut signals_seen = 0;
        while self.left() > 0 {
            let mut busy = false;
            loop {
                match ump::wait(None, Some(Duration::ZERO)) {
                    Ok(Some(ev)) => {
                        busy = true;
                        self.event(ev);
                    }
                    Ok(None) => break,
                    Err(e) => {
                        say(&format!("UMP: {e}"));
                        break;
                    }
                }
            }
            if self.left() == 0 {
                break;
            }
            let now = Instant::now();
            let sig = stops.signal.swap(0, Ordering::Relaxed);
            if sig != 0 {
                signals_seen += 1;
                if signals_seen > 1 {
                    say("second signal: leaving now (each mpid ends its ranks when our channels close)");
                    return self.failure.unwrap_or(128 + sig as i32);
                }
                self.end(&format!("got signal {sig}"), 128 + sig as i32);
            }
            if stops.stdin_eof.load(Ordering::Relaxed) && self.ending.is_none() {
                self.end("standard input ended (-end-on-stdin-eof)", EXIT_LAUNCH_FAILED);
            }
            if let Some(t) = self.set.timeout {
                if self.ending.is_none() && now.duration_since(started) > t {
                    self.end(&format!("the job ran past -timeout {} s", t.as_secs()), EXIT_TIMEOUT);
                }
            }
            if self.ending.is_none() && now.duration_since(started) > START_WAIT {
                if let Some(r) = self.state.iter().position(|s| *s == RankState::Pending) {
                    let node = node_name(self.plan.node_of[r]);
                    let why = format!("mpid on {node} did not start rank {r} within {} s", START_WAIT.as_secs());
                    self.end(&why, EXIT_LAUNCH_FAILED);
                }
            }
            if let Some(t) = self.ending {
                if now.duration_since(t) > END_WAIT {
                    say(&format!("{} rank(s) did not report their end within {} s", self.left(), END_WAIT.as_secs()));
                    break;
                }
            }
            if now.duration_since(last_ping) >= PING_EVERY {
                last_ping = now;
                for i in 0..self.nodes.len() {
                    self.send(i, &Request::Ping);
                    self.probe(i);
                }
            }
            // Naps: short while messages flow, longer once the job has been
            // quiet for a while (under TCG each wake-up costs the guest's
            // vCPU several hundred µs, taken from the ranks on this guest).
            if busy {
                quiet_since = now;
            } else if now.duration_since(quiet_since) < QUIET_AFTER {
                std::thread::sleep(Duration::from_millis(2));
            } else {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = std::io::stdout().flush();
        self.failure.unwrap_or(0)
    }

    fn event(&mut self, ev: Event) {
        let Some(i) = self.nodes.iter().position(|n| match ev {
            Event::Open(c) | Event::Message(c) | Event::Closed(c) | Event::WriteDone(c) | Event::ReadDone(c) => {
                n.chan == c
            }
        }) else {
            return;
        };
        match ev {
            Event::Message(c) => match ump::read_timeout(c, &mut self.buf, WRITE_WAIT) {
                Ok(n) => match proto::decode::<Reply>(&self.buf[..n]) {
                    Ok(r) => self.reply(i, r),
                    Err(e) => say(&format!("{}: {e}", node_name(self.nodes[i].node))),
                },
                Err(e) => self.node_lost(i, &e.to_string()),
            },
            Event::Closed(_) => self.node_lost(i, "it closed the channel"),
            Event::Open(_) | Event::WriteDone(_) | Event::ReadDone(_) => {}
        }
    }

    /// Whether node `i`'s mpid still lives: a read that waits a moment
    /// checks the other side of the channel (a message that is there is
    /// handled as usual).
    fn probe(&mut self, i: usize) {
        if !self.nodes[i].live {
            return;
        }
        match ump::read_timeout(self.nodes[i].chan, &mut self.buf, Duration::from_millis(1)) {
            Ok(n) => match proto::decode::<Reply>(&self.buf[..n]) {
                Ok(r) => self.reply(i, r),
                Err(e) => say(&format!("{}: {e}", node_name(self.nodes[i].node))),
            },
            Err(UmpError::Channel(ump::ChanError::Timeout)) => {}
            Err(e) => self.node_lost(i, &e.to_string()),
        }
    }

    fn rank_ok(&self, i: usize, rank: u32) -> bool {
        (rank as usize) < self.state.len() && self.nodes[i].ranks.contains(&rank)
    }

    fn reply(&mut self, i: usize, r: Reply) {
        let node = node_name(self.nodes[i].node);
        match r {
            Reply::Started { rank, .. } if self.rank_ok(i, rank) => {
                trace(&format!("rank {rank} started on {node}"));
                if self.state[rank as usize] == RankState::Pending {
                    self.state[rank as usize] = RankState::Running;
                }
            }
            Reply::Output { rank, fd, data } => self.print(rank, fd, &data),
            Reply::Exited { rank, code, signal } if self.rank_ok(i, rank) => {
                trace(&format!("rank {rank} ended on {node}"));
                self.state[rank as usize] = RankState::Done;
                let (c, how) = match (code, signal) {
                    (Some(0), _) => return,
                    (Some(c), _) => (c, format!("exited with code {c}")),
                    (None, Some(s)) => (128 + s, format!("was killed by signal {s} ({})", signal_name(s))),
                    (None, None) => (EXIT_LAUNCH_FAILED, "ended in an unknown way".to_string()),
                };
                if self.ending.is_none() {
                    self.end(&format!("rank {rank} on {node} {how}"), c);
                }
            }
            Reply::Error { rank: Some(rank), message } if self.rank_ok(i, rank) => {
                self.state[rank as usize] = RankState::Done;
                self.not_started(i);
                self.end(&format!("rank {rank} on {node} could not start: {message}"), 127);
            }
            Reply::Error { message, .. } => {
                self.not_started(i);
                self.end(&format!("{node} refused the job: {message}"), EXIT_LAUNCH_FAILED);
            }
            Reply::Started { rank, .. } | Reply::Exited { rank, .. } => {
                say(&format!("{node} reported rank {rank}, which is not one of its ranks"));
            }
        }
    }

    /// Node `i`'s ranks that were never started count as done.
    fn not_started(&mut self, i: usize) {
        for &r in &self.nodes[i].ranks {
            if self.state[r as usize] == RankState::Pending {
                self.state[r as usize] = RankState::Done;
            }
        }
    }

    fn print(&mut self, rank: u32, fd: u8, data: &str) {
        let text = if self.set.prepend_rank {
            let start = self.line_start.entry((rank, fd)).or_insert(true);
            let mut out = String::with_capacity(data.len() + 8);
            for piece in data.split_inclusive('\n') {
                if *start {
                    out.push_str(&format!("[{rank}] "));
                }
                out.push_str(piece);
                *start = piece.ends_with('\n');
            }
            out
        } else {
            data.to_string()
        };
        // A closed output (`| head`) must not stop the job.
        if fd == 2 {
            let _ = std::io::stderr().write_all(text.as_bytes());
        } else {
            let mut o = std::io::stdout().lock();
            let _ = o.write_all(text.as_bytes()).and_then(|()| o.flush());
        }
    }
}

/// A signal's name (SIGKILL), or its number.
fn signal_name(s: i32) -> String {
    nix::sys::signal::Signal::try_from(s).map(|s| s.as_str().to_string()).unwrap_or_else(|_| s.to_string())
}

#[cfg(test)]
mod tests {
    use super::nodes_var;

    #[test]
    fn the_placement_goes_as_runs_of_nodes() {
        assert_eq!(nodes_var(&[0, 0, 1, 1, 1, 0]), "0*2,1*3,0*1");
        assert_eq!(nodes_var(&[3]), "3*1");
        assert_eq!(nodes_var(&[]), "");
    }
}
