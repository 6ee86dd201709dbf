//! `mc-agent`: the guest side of `mc-cluster exec`.
//!
//! Finds the virtio-serial port named `mc.agent`, then answers requests one
//! at a time. Started (and restarted if it dies) by the guest's init.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use agent::{b64_decode, b64_encode, read_frame, write_frame, Envelope, Request, Response, MAX_OUTPUT, PORT_NAME};

/// How long output readers get after the command exits (background children
/// that keep the pipes open must not hold the answer forever).
const OUTPUT_GRACE: Duration = Duration::from_millis(300);

fn find_port() -> Option<PathBuf> {
    for e in fs::read_dir("/sys/class/virtio-ports").ok()?.flatten() {
        let name = fs::read_to_string(e.path().join("name")).unwrap_or_default();
        if name.trim() == PORT_NAME {
            return Some(PathBuf::from("/dev").join(e.file_name()));
        }
    }
    None
}

fn uptime() -> f64 {
    fs::read_to_string("/proc/uptime").ok().and_then(|s| s.split_whitespace().next()?.parse().ok()).unwrap_or(0.0)
}

fn reader(mut r: impl Read + Send + 'static) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let mut out = Vec::new();
        let mut buf = [0u8; 65536];
        loop {
            match r.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if out.len() < MAX_OUTPUT {
                        let take = n.min(MAX_OUTPUT - out.len());
                        out.extend_from_slice(&buf[..take]);
                    }
                }
            }
        }
        let _ = tx.send(out);
    });
    rx
}

fn exec(argv: &[String], stdin: &str, timeout_s: u64) -> Response {
    let Some((prog, args)) = argv.split_first() else {
        return Response::Error { message: "empty command".into() };
    };
    let input = match b64_decode(stdin) {
        Ok(b) => b,
        Err(e) => return Response::Error { message: format!("stdin is not base64: {e}") },
    };
    let mut child = match Command::new(prog)
        .args(args)
        .stdin(if input.is_empty() { Stdio::null() } else { Stdio::piped() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => return Response::Error { message: format!("cannot run {prog}: {e}") },
    };
    if let Some(mut si) = child.stdin.take() {
        thread::spawn(move || {
            let _ = io::Write::write_all(&mut si, &input);
        });
    }
    let out = reader(child.stdout.take().unwrap());
    let err = reader(child.stderr.take().unwrap());
    let deadline = (timeout_s > 0).then(|| Instant::now() + Duration::from_secs(timeout_s));
    let mut timed_out = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) => {}
            Err(e) => return Response::Error { message: format!("wait failed: {e}") },
        }
        if deadline.is_some_and(|d| Instant::now() > d) {
            timed_out = true;
            // SAFETY: kill(2) on the child's process group; no memory involved.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
        }
        thread::sleep(Duration::from_millis(5));
    };
    let code = status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
    let stdout = out.recv_timeout(OUTPUT_GRACE).unwrap_or_default();
    let stderr = err.recv_timeout(OUTPUT_GRACE).unwrap_or_default();
    Response::Exited { code, stdout: b64_encode(&stdout), stderr: b64_encode(&stderr), timed_out }
}

fn serve(port: &PathBuf) -> io::Result<()> {
    let mut f: File = OpenOptions::new().read(true).write(true).open(port)?;
    let hostname = fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default().trim().to_string();
    loop {
        let req: Envelope<Request> = match read_frame(&mut f) {
            Ok(Some(r)) => r,
            // No host connected: the port reads as end of file. Wait for one.
            Ok(None) => {
                thread::sleep(Duration::from_millis(20));
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                let body = Response::Error { message: format!("bad request: {e}") };
                let _ = write_frame(&mut f, &Envelope { id: 0, body });
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => continue,
            Err(e) => return Err(e),
        };
        let body = match req.body {
            Request::Ping => Response::Pong { hostname: hostname.clone(), uptime_s: uptime() },
            Request::Exec { argv, stdin, timeout_s } => exec(&argv, &stdin, timeout_s),
        };
        let resp = Envelope { id: req.id, body };
        // The host may have gone away meanwhile; the next request starts afresh.
        let _ = write_frame(&mut f, &resp);
    }
}

fn main() {
    let port = loop {
        match find_port() {
            Some(p) => break p,
            None => thread::sleep(Duration::from_millis(100)),
        }
    };
    eprintln!("mc-agent: serving on {}", port.display());
    if let Err(e) = serve(&port) {
        eprintln!("mc-agent: {}: {e}", port.display());
        std::process::exit(1);
    }
}
