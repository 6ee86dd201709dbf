//! Host side of the guest agent protocol: ping a guest, run a command in it.

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use agent::{b64_decode, b64_encode, read_frame, write_frame, Envelope, Request, Response};

/// What a command run in a guest produced.
#[derive(Debug, Clone)]
pub struct ExecResult {
    /// Exit code (128 + signal when killed).
    pub code: i32,
    /// Standard output.
    pub stdout: Vec<u8>,
    /// Standard error.
    pub stderr: Vec<u8>,
    /// The guest killed it at the timeout.
    pub timed_out: bool,
}

fn next_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    (std::process::id() as u64) << 32 | NEXT.fetch_add(1, Ordering::Relaxed)
}

fn call(sock: &Path, req: Request, timeout: Duration) -> Result<Response> {
    let mut s =
        UnixStream::connect(sock).with_context(|| format!("cannot reach the guest agent at {}", sock.display()))?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let id = next_id();
    write_frame(&mut s, &Envelope { id, body: req })?;
    loop {
        let resp: Option<Envelope<Response>> = read_frame(&mut s).map_err(|e| match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                anyhow::anyhow!("no answer from the guest agent within {timeout:?}")
            }
            _ => anyhow::anyhow!("guest agent connection: {e}"),
        })?;
        let Some(resp) = resp else { bail!("guest agent closed the connection") };
        // An answer meant for an earlier client that left before reading it.
        if resp.id != id {
            continue;
        }
        return Ok(resp.body);
    }
}

/// Pings the agent; returns the guest's uptime in seconds.
pub fn ping(sock: &Path, timeout: Duration) -> Result<f64> {
    match call(sock, Request::Ping, timeout)? {
        Response::Pong { uptime_s, .. } => Ok(uptime_s),
        other => bail!("unexpected answer to ping: {other:?}"),
    }
}

/// Runs `argv` in the guest. `timeout_s` 0 means no limit.
pub fn exec(sock: &Path, argv: &[String], stdin: &[u8], timeout_s: u64) -> Result<ExecResult> {
    let wait = if timeout_s == 0 { Duration::from_secs(24 * 3600) } else { Duration::from_secs(timeout_s + 15) };
    let req = Request::Exec { argv: argv.to_vec(), stdin: b64_encode(stdin), timeout_s };
    match call(sock, req, wait)? {
        Response::Exited { code, stdout, stderr, timed_out } => {
            Ok(ExecResult { code, stdout: b64_decode(&stdout)?, stderr: b64_decode(&stderr)?, timed_out })
        }
        Response::Error { message } => bail!("{message}"),
        other => bail!("unexpected answer to exec: {other:?}"),
    }
}
