//! Shared by the launch tests: `mpid` daemons on this machine (each test
//! with its own handle base, so tests run side by side), the stand-in rank
//! program, and process checks.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The stand-in for an MPI program: prints its launch variables, its pid
/// and its parent's (the mpid that started it), then by its arguments:
/// `show` exits 0; `fail R C`: rank R exits C after a moment, the others
/// sleep; `sleep`: every rank sleeps; `env NAME`: prints $NAME and `pwd`.
pub const STAND_IN: &str = r#"#!/bin/sh
echo "rank=$MCMPI_RANK size=$MCMPI_SIZE job=$MCMPI_JOB pid=$$ ppid=$PPID"
case "$1" in
show) exit 0 ;;
fail)
    if [ "$MCMPI_RANK" = "$2" ]; then sleep 0.5; echo "rank $2 failing" >&2; exit "$3"; fi
    exec sleep 60 ;;
sleep) exec sleep 60 ;;
env) eval "echo \"$2=\$$2 cwd=\$(pwd)\""; exit 0 ;;
esac
exit 9
"#;

/// Writes the stand-in into `dir`; returns its path.
pub fn stand_in(dir: &Path) -> PathBuf {
    let p = dir.join("rank.sh");
    std::fs::write(&p, STAND_IN).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

/// A handle base of its own for test `idx` (1 to 255) of this process.
pub fn base(idx: u64) -> u64 {
    0x4D50_FFFF_0000_0000 | ((u64::from(std::process::id()) & 0xFF) << 8 | idx) << 16
}

/// A running mpid, stopped on drop.
pub struct Mpid {
    pub child: Child,
    pub base: u64,
    pub node: u32,
}

impl Mpid {
    /// Starts mpid for `node` with handle base `base`; returns once it listens.
    pub fn start(base: u64, node: u32) -> Mpid {
        let mut child = Command::new(env!("CARGO_BIN_EXE_mpid"))
            .args(["--node", &node.to_string()])
            .env("MCMPI_MPID_BASE", format!("{base:#x}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let err = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                eprintln!("[mpid {node}] {line}");
                let _ = tx.send(line);
            }
        });
        let t0 = Instant::now();
        loop {
            match rx.recv_timeout(Duration::from_secs(30)) {
                Ok(l) if l.contains("listening on handle") => break,
                Ok(_) => {}
                Err(e) => panic!("mpid for node {node} did not start listening: {e}"),
            }
            assert!(t0.elapsed() < Duration::from_secs(30), "mpid did not start");
        }
        Mpid { child, base, node }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Mpid {
    fn drop(&mut self) {
        // SAFETY: kill on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An mpiexec command for daemons with handle base `base`, on node 0.
pub fn mpiexec(base: u64) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_mpiexec"));
    c.env("MCMPI_MPID_BASE", format!("{base:#x}")).env("MCMPI_NODE", "0").env("MCMPI_CONNECT_TIMEOUT", "3");
    c
}

/// Runs `c` to its end, failing the test after `secs` (nothing may hang).
pub fn run(c: &mut Command, secs: u64) -> (Output, Duration) {
    let t0 = Instant::now();
    let child = c.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        if rx.recv_timeout(Duration::from_secs(secs)).is_err() {
            // SAFETY: kill on the child's pid (still ours: not reaped yet).
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
    });
    let out = child.wait_with_output().unwrap();
    let _ = tx.send(());
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(secs), "command ran past {secs} s: {}", text(&out));
    (out, took)
}

pub fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
}

/// The stand-in's report lines: (rank, size, job, pid, ppid).
pub fn reports(out: &str) -> Vec<(u32, u32, u32, u32, u32)> {
    let mut v = Vec::new();
    for l in out.lines() {
        let l = l.split_once("] ").map(|(_, r)| r).unwrap_or(l);
        if !l.starts_with("rank=") {
            continue;
        }
        let f: Vec<u32> = l.split_whitespace().map(|kv| kv.split_once('=').unwrap().1.parse().unwrap()).collect();
        v.push((f[0], f[1], f[2], f[3], f[4]));
    }
    v.sort();
    v
}

/// Whether process `pid` exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s.rsplit_once(')').is_some_and(|(_, r)| !r.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

/// Waits up to `secs` for every pid to be gone; returns those still alive.
pub fn wait_gone(pids: &[u32], secs: u64) -> Vec<u32> {
    let t0 = Instant::now();
    loop {
        let left: Vec<u32> = pids.iter().copied().filter(|&p| alive(p)).collect();
        if left.is_empty() || t0.elapsed() > Duration::from_secs(secs) {
            return left;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
