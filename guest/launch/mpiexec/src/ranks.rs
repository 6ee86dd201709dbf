//! Rank processes on this node (for `mpid`): starting one in its own
//! process group with the launch environment, reading its output, seeing
//! it end, and signalling its group.
//!
//! Threads: [`spawn`] runs on `mpid`'s main thread (so that the ranks'
//! parent-death signal is tied to it) and starts, per rank, two readers
//! (standard output and error) and one waiter; they send [`RankEvent`]s
//! to the main thread and end with the rank.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, Stdio};
use std::sync::mpsc::{self, Sender};
use std::thread;
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use thiserror::Error;

use crate::proto::OUTPUT_PIECE;

/// How long the waiter lets the readers finish after the rank exits
/// (children that keep its pipes open must not hold its end back).
const OUTPUT_GRACE: Duration = Duration::from_millis(300);

/// A rank that could not be started.
#[derive(Debug, Error)]
pub enum RankError {
    /// exec (or fork) failed.
    #[error("cannot run {prog}: {err}")]
    Spawn {
        /// The program.
        prog: String,
        /// Why.
        err: std::io::Error,
    },
}

/// What a rank's threads report; `key` is the caller's (its job's) key.
#[derive(Debug)]
pub enum RankEvent {
    /// A piece of output.
    Output {
        /// The job's key.
        key: i32,
        /// Rank.
        rank: u32,
        /// 1 or 2.
        fd: u8,
        /// Bytes (a line, or up to [`OUTPUT_PIECE`] of one).
        data: Vec<u8>,
    },
    /// The rank ended (after its output, or [`OUTPUT_GRACE`] after).
    Exited {
        /// The job's key.
        key: i32,
        /// Rank.
        rank: u32,
        /// Exit code.
        code: Option<i32>,
        /// Killing signal.
        signal: Option<i32>,
    },
}

/// What the rank's process needs.
pub struct Launch<'a> {
    /// The job's key in events.
    pub key: i32,
    /// Job id.
    pub job: u32,
    /// Rank.
    pub rank: u32,
    /// Ranks in the job.
    pub size: u32,
    /// Ranks of the job this daemon starts (on this guest).
    pub local: u32,
    /// Program and arguments.
    pub argv: &'a [String],
    /// Variables on top of ours.
    pub env: &'a [(String, String)],
    /// Working folder.
    pub cwd: &'a str,
}

/// Starts a rank; returns its pid (also its process group).
pub fn spawn(l: &Launch<'_>, events: &Sender<RankEvent>) -> Result<u32, RankError> {
    let Some((prog, args)) = l.argv.split_first() else {
        return Err(RankError::Spawn { prog: String::new(), err: std::io::ErrorKind::InvalidInput.into() });
    };
    let mut cmd = Command::new(prog);
    cmd.args(args)
        .envs(l.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .env("MCMPI_JOB", l.job.to_string())
        .env("MCMPI_RANK", l.rank.to_string())
        .env("MCMPI_SIZE", l.size.to_string())
        .env("MCMPI_LOCAL_SIZE", l.local.to_string())
        .current_dir(l.cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    // SAFETY: the closure runs in the child between fork and exec and only
    // calls prctl, which is async-signal-safe and touches no memory of ours.
    unsafe {
        cmd.pre_exec(|| {
            // The rank dies with mpid (whose main thread forks it).
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|err| RankError::Spawn { prog: prog.clone(), err })?;
    let pid = child.id();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let (key, rank) = (l.key, l.rank);
    let readers: Vec<(u8, Box<dyn Read + Send>)> = [
        child.stdout.take().map(|s| (1u8, Box::new(s) as Box<dyn Read + Send>)),
        child.stderr.take().map(|s| (2u8, Box::new(s) as Box<dyn Read + Send>)),
    ]
    .into_iter()
    .flatten()
    .collect();
    let nreaders = readers.len();
    for (fd, src) in readers {
        let (ev, done) = (events.clone(), done_tx.clone());
        thread::spawn(move || {
            read_output(key, rank, fd, src, &ev);
            let _ = done.send(());
        });
    }
    drop(done_tx);
    let ev = events.clone();
    thread::spawn(move || {
        let st = child.wait();
        let deadline = std::time::Instant::now() + OUTPUT_GRACE;
        for _ in 0..nreaders {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if done_rx.recv_timeout(left).is_err() {
                break;
            }
        }
        let (code, signal) = match st {
            Ok(s) => (s.code(), s.signal()),
            Err(_) => (None, None),
        };
        let _ = ev.send(RankEvent::Exited { key, rank, code, signal });
    });
    Ok(pid)
}

/// Forwards `src` in pieces: a line, or [`OUTPUT_PIECE`] bytes of one.
fn read_output(key: i32, rank: u32, fd: u8, src: Box<dyn Read + Send>, ev: &Sender<RankEvent>) {
    let mut r = BufReader::new(src);
    loop {
        let mut buf = Vec::new();
        match (&mut r).take(OUTPUT_PIECE as u64).read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                if ev.send(RankEvent::Output { key, rank, fd, data: buf }).is_err() {
                    return;
                }
            }
        }
    }
}

/// Sends `sig` to the process group of the rank with pid `pid`.
pub fn signal_group(pid: u32, sig: Signal) {
    if let Ok(p) = i32::try_from(pid) {
        if p > 1 {
            let _ = killpg(Pid::from_raw(p), sig);
        }
    }
}
