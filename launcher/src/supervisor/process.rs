//! The supervisor's child processes: starting one (its log, the network
//! namespace, real-time priority, killed with the supervisor), waiting for
//! the socket it makes, stopping it, and the last lines of its log for an
//! error message. Called from the supervisor's one thread.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::fd::BorrowedFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// Starts `argv` with its output in `log`, killed when the supervisor dies;
/// inside the network namespace `netns` when given; with `realtime` every
/// thread of the child runs at real-time priority (`crate::priority`; left
/// normal where not allowed).
pub(super) fn spawn(argv: &[String], log: &Path, netns: Option<BorrowedFd<'_>>, realtime: bool) -> Result<Child> {
    let out = File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let mut cmd = Command::new(&argv[0]);
    if realtime {
        // SAFETY: sched_setscheduler(2) only, between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                // Not allowed: the child runs at normal priority.
                let _ = crate::priority::make_realtime(0);
                Ok(())
            });
        }
    }
    if let Some(ns) = netns {
        crate::lan::enter_netns(&mut cmd, ns);
    }
    cmd.args(&argv[1..]).stdin(Stdio::null()).stdout(out.try_clone()?).stderr(out);
    // SAFETY: prctl(2) only, between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn().with_context(|| format!("cannot start {}", argv[0]))
}

pub(super) fn wait_for_path(p: &Path, child: &mut Child, what: &str, timeout: Duration, log: &Path) -> Result<()> {
    let t0 = Instant::now();
    while !p.exists() {
        if let Some(st) = child.try_wait()? {
            bail!("{what} exited ({st}) before it was ready: {}", tail(log, 3));
        }
        if t0.elapsed() > timeout {
            bail!("{what} not ready after {timeout:?}: {}", tail(log, 3));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// A fresh random cluster secret (hex), readable by its owner only.
pub(super) fn write_secret(path: &Path) -> Result<()> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut raw = [0u8; 32];
    File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut raw)).context("reading /dev/urandom")?;
    let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    f.write_all(hex.as_bytes())?;
    Ok(())
}

/// Last `n` non-empty lines of a log, joined on one line.
pub fn tail(log: &Path, n: usize) -> String {
    let text = fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let start = lines.len().saturating_sub(n);
    let joined = lines[start..].join(" | ");
    if joined.is_empty() {
        format!("(nothing in {})", log.display())
    } else {
        format!("{joined} (see {})", log.display())
    }
}

/// Stops a child: SIGTERM, then SIGKILL after 5 s; returns how it ended.
pub(super) fn stop_child(c: &mut Child) -> String {
    if let Ok(Some(st)) = c.try_wait() {
        return st.to_string();
    }
    // SAFETY: kill(2) on our own child, not yet reaped.
    unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
    let t0 = Instant::now();
    loop {
        if let Ok(Some(st)) = c.try_wait() {
            return st.to_string();
        }
        if t0.elapsed() > Duration::from_secs(5) {
            let _ = c.kill();
            return c.wait().map(|s| s.to_string()).unwrap_or_else(|e| e.to_string());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
