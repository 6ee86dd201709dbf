//! The guest's side of the agent protocol: answers the requests read from a
//! port (the virtio-serial port in `mc-agent`, a socket in tests), one
//! operation at a time.
//!
//! Threads: [`serve`] runs on the caller's thread and owns the port. While a
//! command runs, one thread per output pipe reads it into a channel and one
//! thread writes the stdin chunks into the command's pipe, so the serving
//! thread never blocks on the command: it only moves chunks between the
//! port and those threads.

use std::fs::{self, File, OpenOptions};
use std::io::{self, ErrorKind, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender, TrySendError};
use std::thread;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

use crate::{b64_decode, b64_encode, read_frame, write_frame, Envelope, Request, Response, CHUNK};

/// How long output readers get after the command exits (background children
/// that keep the pipes open must not hold the answer forever).
const OUTPUT_GRACE: Duration = Duration::from_millis(300);
/// How long the serving loop waits for something to happen before it looks
/// at the command again while it feeds the command's stdin.
const TICK: Duration = Duration::from_millis(5);
/// The longest the serving loop sleeps while a command runs and nothing
/// happens (it wakes at once for output, the command's end, the deadline).
const IDLE_WAIT: Duration = Duration::from_secs(1);
/// Stdin chunks queued for the command beyond what its pipe holds.
const STDIN_QUEUE: usize = 8;
/// How long the port must go on reading as hung up before a stream counts
/// its host as gone. On virtio-serial a client leaving and the next one
/// connecting reach the guest as port-closed and port-open control events,
/// which the kernel handles after the data queue: the next client's request
/// can be read while the port still reads as closed from the one before.
const HANGUP_GRACE: Duration = Duration::from_secs(2);

/// Answers requests from `port` until it reads as end of file (no host
/// connected: `mc-agent` calls it again; a closed socket: the test is over).
pub fn serve<P: Read + Write + AsFd>(port: &mut P) -> io::Result<()> {
    let hostname = fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default().trim().to_string();
    loop {
        let req: Envelope<Request> = match read_frame(port) {
            Ok(Some(r)) => r,
            Ok(None) => return Ok(()),
            Err(e) if e.kind() == ErrorKind::InvalidData => {
                send(port, 0, Response::Error { message: format!("bad request: {e}") })?;
                continue;
            }
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        };
        let id = req.id;
        match req.body {
            Request::Ping => send(port, id, Response::Pong { hostname: hostname.clone(), uptime_s: uptime() })?,
            Request::Exec { argv, stdin, timeout_s } => exec(port, id, &argv, stdin, timeout_s)?,
            Request::Put { path, mode, name } => put(port, id, &path, mode, &name)?,
            Request::Get { path } => get(port, id, &path)?,
            // The rest of a stream whose operation has ended (the command
            // exited before reading all its input, or its host went away).
            Request::Stdin { .. } | Request::StdinEnd => {}
        }
    }
}

fn send<P: Write>(port: &mut P, id: u64, body: Response) -> io::Result<()> {
    write_frame(port, &Envelope { id, body })
}

fn uptime() -> f64 {
    fs::read_to_string("/proc/uptime").ok().and_then(|s| s.split_whitespace().next()?.parse().ok()).unwrap_or(0.0)
}

/// True when `port` has bytes to read within `wait`.
fn readable<P: AsFd>(port: &P, wait: Duration) -> io::Result<bool> {
    let mut fds = [PollFd::new(port.as_fd(), PollFlags::POLLIN)];
    let ms = PollTimeout::try_from(wait).unwrap_or(PollTimeout::MAX);
    match nix::poll::poll(&mut fds, ms) {
        Ok(n) => Ok(n > 0),
        Err(nix::errno::Errno::EINTR) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// What the stream after `Exec { stdin: true }` or `Put` brought next.
enum Incoming {
    Chunk(Vec<u8>),
    End,
    /// Nothing: the port read as end of file, but a host is connected
    /// again (the end of file was an earlier client's leaving, seen late).
    Nothing,
    /// The host went away (the port stays hung up) or sent something that
    /// is not a chunk of this stream (answered with an error): the stream
    /// is over.
    Gone,
}

/// The next frame of operation `op`'s stream.
fn next_chunk<P: Read + Write + AsFd>(port: &mut P, op: u64) -> io::Result<Incoming> {
    match read_frame::<_, Envelope<Request>>(port) {
        Ok(Some(Envelope { id, body: Request::Stdin { data } })) if id == op => match b64_decode(&data) {
            Ok(b) => Ok(Incoming::Chunk(b)),
            Err(e) => {
                send(port, op, Response::Error { message: format!("stdin chunk is not base64: {e}") })?;
                Ok(Incoming::Gone)
            }
        },
        Ok(Some(Envelope { id, body: Request::StdinEnd })) if id == op => Ok(Incoming::End),
        Ok(Some(Envelope { id, .. })) => {
            send(port, id, Response::Error { message: "the agent is busy with another operation".into() })?;
            Ok(Incoming::Gone)
        }
        Ok(None) if !hung_up(port)? => Ok(Incoming::Nothing),
        Ok(None) => Ok(Incoming::Gone),
        Err(e) if matches!(e.kind(), ErrorKind::InvalidData | ErrorKind::UnexpectedEof) => Ok(Incoming::Gone),
        Err(e) => Err(e),
    }
}

/// After the port read as end of file: true when it still reads as hung up
/// after [`HANGUP_GRACE`] (the host is gone), false as soon as it does not
/// (a host is connected).
fn hung_up<P: AsFd>(port: &P) -> io::Result<bool> {
    let until = Instant::now() + HANGUP_GRACE;
    loop {
        // A virtio-serial port without a host reads as POLLHUP; a socket
        // (tests) whose peer stopped writing as POLLRDHUP, which nix has no
        // name for: its `revents` is then `None`.
        let rdhup = PollFlags::from_bits_retain(libc::POLLRDHUP);
        let mut fds = [PollFd::new(port.as_fd(), PollFlags::POLLIN | rdhup)];
        match nix::poll::poll(&mut fds, PollTimeout::ZERO) {
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
        if fds[0].revents().is_some_and(|r| !r.contains(PollFlags::POLLHUP)) {
            return Ok(false);
        }
        if Instant::now() >= until {
            return Ok(true);
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// A piece of a command's output, from its reader threads.
enum Piece {
    Out(u8, Vec<u8>),
    Closed,
    Exited(io::Result<std::process::ExitStatus>),
}

fn reader(fd: u8, mut r: impl Read + Send + 'static, tx: mpsc::Sender<Piece>) {
    thread::spawn(move || {
        let mut buf = vec![0u8; CHUNK];
        loop {
            match r.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if tx.send(Piece::Out(fd, buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        let _ = tx.send(Piece::Closed);
    });
}

/// Feeds the command's stdin from a bounded queue. When the command stops
/// reading (broken pipe), later chunks are dropped so the port keeps moving.
fn stdin_writer(mut si: ChildStdin) -> SyncSender<Vec<u8>> {
    let (tx, rx) = mpsc::sync_channel::<Vec<u8>>(STDIN_QUEUE);
    thread::spawn(move || {
        let mut broken = false;
        for chunk in rx {
            if !broken && si.write_all(&chunk).is_err() {
                broken = true;
            }
        }
        // The queue closed (StdinEnd): dropping `si` is the command's end of file.
    });
    tx
}

fn spawn(argv: &[String], stdin: bool) -> Result<Child, String> {
    let Some((prog, args)) = argv.split_first() else { return Err("empty command".into()) };
    Command::new(prog)
        .args(args)
        .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot run {prog}: {e}"))
}

fn exec<P: Read + Write + AsFd>(port: &mut P, id: u64, argv: &[String], stdin: bool, timeout_s: u64) -> io::Result<()> {
    let mut child = match spawn(argv, stdin) {
        Ok(c) => c,
        // Stdin chunks the host already sent are ignored by `serve`.
        Err(message) => return send(port, id, Response::Error { message }),
    };
    let (tx, rx) = mpsc::channel();
    reader(1, child.stdout.take().expect("piped stdout"), tx.clone());
    reader(2, child.stderr.take().expect("piped stderr"), tx.clone());
    let mut feed = child.stdin.take().map(stdin_writer);
    let pid = Pid::from_raw(child.id() as i32);
    // The command's end comes as a message too, so that nothing here wakes
    // on a timer while it runs: a TCG guest pays ~0.4 ms of its only vCPU
    // for every timer wake-up, and the command may be an MPI job.
    thread::spawn(move || {
        let _ = tx.send(Piece::Exited(child.wait()));
    });
    let mut pending: Option<Vec<u8>> = None;
    let deadline = (timeout_s > 0).then(|| Instant::now() + Duration::from_secs(timeout_s));
    let mut timed_out = false;
    let mut exited: Option<(io::Result<std::process::ExitStatus>, Instant)> = None;
    let mut closed = 0;
    loop {
        let mut progress = false;
        // Output first: it is what the host is waiting for.
        while let Ok(p) = rx.try_recv() {
            take(port, id, p, &mut closed, &mut exited)?;
            progress = true;
        }
        if let Some(f) = &feed {
            if let Some(chunk) = pending.take() {
                match f.try_send(chunk) {
                    Ok(()) => progress = true,
                    Err(TrySendError::Full(c)) => pending = Some(c),
                    Err(TrySendError::Disconnected(_)) => {}
                }
            }
            if pending.is_none() && readable(port, Duration::ZERO)? {
                match next_chunk(port, id)? {
                    Incoming::Chunk(c) => pending = Some(c),
                    Incoming::Nothing => {}
                    Incoming::End | Incoming::Gone => feed = None,
                }
                progress = true;
            }
        }
        if exited.is_none() && !timed_out && deadline.is_some_and(|d| Instant::now() > d) {
            timed_out = true;
            let _ = killpg(pid, Signal::SIGKILL);
        }
        if let Some((_, at)) = exited {
            if closed == 2 || at.elapsed() > OUTPUT_GRACE {
                break;
            }
        }
        if !progress {
            if feed.is_some() && pending.is_none() {
                // Wake for a stdin chunk or after a tick, whichever comes first.
                readable(port, TICK)?;
            } else {
                // Wake for output or the command's end, or when the
                // deadline or the output grace runs out.
                let until = match exited {
                    Some((_, at)) => Some(at + OUTPUT_GRACE),
                    None if !timed_out => deadline,
                    None => None,
                };
                let wait = until.map_or(IDLE_WAIT, |u| u.saturating_duration_since(Instant::now()).min(IDLE_WAIT));
                match rx.recv_timeout(wait.max(Duration::from_millis(1))) {
                    Ok(p) => take(port, id, p, &mut closed, &mut exited)?,
                    Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {}
                }
            }
        }
    }
    let (status, _) = exited.expect("loop ends after exit");
    let status = status?;
    let code = status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
    send(port, id, Response::Exited { code, timed_out })
}

/// One message of the command's threads: output on its way to the host,
/// a closed pipe, or the command's end.
fn take<P: Write>(
    port: &mut P,
    id: u64,
    p: Piece,
    closed: &mut usize,
    exited: &mut Option<(io::Result<std::process::ExitStatus>, Instant)>,
) -> io::Result<()> {
    match p {
        Piece::Out(fd, data) => send(port, id, Response::Output { fd, data: b64_encode(&data) }),
        Piece::Closed => {
            *closed += 1;
            Ok(())
        }
        Piece::Exited(st) => {
            *exited = Some((st, Instant::now()));
            Ok(())
        }
    }
}

/// Where `Put` writes: `path`, or `path/name` when `path` is a folder.
fn put_target(path: &str, name: &str) -> Result<PathBuf, String> {
    let p = PathBuf::from(path);
    if path.is_empty() {
        return Err("empty guest path".into());
    }
    if p.is_dir() {
        if name.is_empty() || name.contains('/') {
            return Err(format!("{path} is a folder in the guest and no file name was given"));
        }
        return Ok(p.join(name));
    }
    match p.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(d) if !d.is_dir() => Err(format!("guest folder {} does not exist", d.display())),
        _ => Ok(p),
    }
}

/// The temporary file a copy is written to before it is renamed into place.
fn temp_beside(target: &Path) -> PathBuf {
    let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    target.with_file_name(format!(".{name}.mc-cp.{}", std::process::id()))
}

fn put<P: Read + Write + AsFd>(port: &mut P, id: u64, path: &str, mode: u32, name: &str) -> io::Result<()> {
    let target = match put_target(path, name) {
        Ok(t) => t,
        Err(message) => return send(port, id, Response::Error { message }),
    };
    let tmp = temp_beside(&target);
    let mut file = match OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp) {
        Ok(f) => f,
        Err(e) => {
            return send(port, id, Response::Error { message: format!("cannot create {}: {e}", target.display()) })
        }
    };
    send(port, id, Response::Ready { path: target.display().to_string() })?;
    let mut bytes = 0u64;
    let mut failed: Option<String> = None;
    loop {
        match next_chunk(port, id)? {
            Incoming::Chunk(c) => {
                if failed.is_none() {
                    match file.write_all(&c) {
                        Ok(()) => bytes += c.len() as u64,
                        Err(e) => failed = Some(format!("writing {}: {e}", target.display())),
                    }
                }
            }
            Incoming::End => break,
            Incoming::Nothing => {}
            Incoming::Gone => {
                let _ = fs::remove_file(&tmp);
                return Ok(());
            }
        }
    }
    let done = failed.map_or_else(|| finish_put(&file, &tmp, &target, mode), Err);
    drop(file);
    match done {
        Ok(()) => send(port, id, Response::Done { path: target.display().to_string(), bytes, mode: mode & 0o7777 }),
        Err(message) => {
            let _ = fs::remove_file(&tmp);
            send(port, id, Response::Error { message })
        }
    }
}

fn finish_put(file: &File, tmp: &Path, target: &Path, mode: u32) -> Result<(), String> {
    file.set_permissions(fs::Permissions::from_mode(mode & 0o7777))
        .map_err(|e| format!("setting the mode of {}: {e}", target.display()))?;
    fs::rename(tmp, target).map_err(|e| format!("cannot create {}: {e}", target.display()))
}

fn get<P: Write>(port: &mut P, id: u64, path: &str) -> io::Result<()> {
    let opened = File::open(path).and_then(|f| {
        let m = f.metadata()?;
        Ok((f, m))
    });
    let (mut f, meta) = match opened {
        Ok((_, m)) if m.is_dir() => {
            return send(port, id, Response::Error { message: format!("{path} is a folder in the guest") })
        }
        Ok(x) => x,
        Err(e) if e.kind() == ErrorKind::NotFound => {
            return send(port, id, Response::Error { message: format!("{path}: no such file in the guest") })
        }
        Err(e) => return send(port, id, Response::Error { message: format!("cannot read {path}: {e}") }),
    };
    let mut buf = vec![0u8; CHUNK];
    let mut bytes = 0u64;
    loop {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                send(port, id, Response::Data { data: b64_encode(&buf[..n]) })?;
                bytes += n as u64;
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return send(port, id, Response::Error { message: format!("reading {path}: {e}") }),
        }
    }
    send(port, id, Response::Done { path: path.to_string(), bytes, mode: meta.permissions().mode() & 0o7777 })
}

#[cfg(test)]
mod tests {
    use std::os::fd::BorrowedFd;
    use std::os::unix::net::UnixStream;

    use super::*;

    /// A port that reads as end of file once, when a frame starts after
    /// `frames` whole frames were read: what virtio-serial does when the
    /// port-closed event of the client before is handled late.
    struct LateHangup {
        s: UnixStream,
        frames: usize,
        body: bool,
    }

    impl Read for LateHangup {
        fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
            if self.frames == 0 && !self.body {
                self.frames = usize::MAX;
                return Ok(0);
            }
            let n = self.s.read(b)?;
            // Frames go length (4 bytes) then body, read in two steps.
            if n > 0 && self.frames != usize::MAX {
                if self.body {
                    self.frames -= 1;
                }
                self.body = !self.body;
            }
            Ok(n)
        }
    }

    impl Write for LateHangup {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.s.write(b)
        }
        fn flush(&mut self) -> io::Result<()> {
            self.s.flush()
        }
    }

    impl AsFd for LateHangup {
        fn as_fd(&self) -> BorrowedFd<'_> {
            self.s.as_fd()
        }
    }

    fn req(s: &mut UnixStream, id: u64, body: Request) {
        write_frame(s, &Envelope { id, body }).unwrap();
    }

    /// Output and the exit of operation `id`, until `Exited`.
    fn answers(s: &mut UnixStream, id: u64) -> (Vec<u8>, i32) {
        let mut out = Vec::new();
        loop {
            let r: Envelope<Response> = read_frame(s).unwrap().expect("agent closed");
            assert_eq!(r.id, id, "{r:?}");
            match r.body {
                Response::Output { data, .. } => out.extend(b64_decode(&data).unwrap()),
                Response::Exited { code, .. } => return (out, code),
                other => panic!("{other:?}"),
            }
        }
    }

    /// The end of file of a client that left is seen after the next
    /// client's `Exec` was read: the command's stdin stays open while a
    /// host is connected, and its input arrives whole.
    #[test]
    fn a_late_hangup_of_the_client_before_does_not_end_stdin() {
        let (mut host, guest) = UnixStream::pair().unwrap();
        let t = thread::spawn(move || serve(&mut LateHangup { s: guest, frames: 1, body: false }));
        req(&mut host, 7, Request::Exec { argv: vec!["cat".into()], stdin: true, timeout_s: 30 });
        thread::sleep(Duration::from_millis(200));
        req(&mut host, 7, Request::Stdin { data: b64_encode(b"all of it") });
        req(&mut host, 7, Request::StdinEnd);
        assert_eq!(answers(&mut host, 7), (b"all of it".to_vec(), 0));
        drop(host);
        t.join().unwrap().unwrap();
    }

    /// A host that leaves mid-stream ends the command's stdin (after the
    /// grace), and a stdin chunk of another operation is not fed to it.
    #[test]
    fn a_host_that_leaves_ends_stdin_and_other_streams_are_refused() {
        let (mut host, mut guest) = UnixStream::pair().unwrap();
        let t = thread::spawn(move || serve(&mut guest));
        req(&mut host, 8, Request::Exec { argv: vec!["cat".into()], stdin: true, timeout_s: 30 });
        req(&mut host, 8, Request::Stdin { data: b64_encode(b"mine ") });
        req(&mut host, 9, Request::Stdin { data: b64_encode(b"not mine") });
        let r: Envelope<Response> = read_frame(&mut host).unwrap().unwrap();
        assert!(matches!((r.id, &r.body), (9, Response::Error { .. })), "{r:?}");
        assert_eq!(answers(&mut host, 8), (b"mine ".to_vec(), 0));
        drop(host);
        t.join().unwrap().unwrap();

        let (mut host, mut guest) = UnixStream::pair().unwrap();
        let t = thread::spawn(move || serve(&mut guest));
        req(
            &mut host,
            10,
            Request::Exec { argv: vec!["sh".into(), "-c".into(), "cat; echo end".into()], stdin: true, timeout_s: 30 },
        );
        host.shutdown(std::net::Shutdown::Write).unwrap();
        let t0 = Instant::now();
        // Nothing to read back once gone: the command ran to its end.
        let (out, code) = answers(&mut host, 10);
        assert_eq!((out, code), (b"end\n".to_vec(), 0));
        assert!(t0.elapsed() >= HANGUP_GRACE, "{:?}", t0.elapsed());
        drop(host);
        t.join().unwrap().unwrap();
    }
}
