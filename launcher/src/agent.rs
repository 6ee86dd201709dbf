//! Host side of the guest agent protocol (`agent` crate): ping a guest, run
//! a command in it with its stdin and output streamed, copy files in and out.
//!
//! Threads: every call runs on the caller's thread, except that `exec` with
//! stdin starts one thread that reads the stdin source and sends it in
//! chunks; it stops at the first chunk boundary after the command ends.

use std::fs;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent::{b64_decode, b64_encode, read_frame, write_frame, Envelope, Request, Response, CHUNK};
use anyhow::{anyhow, bail, Context, Result};

/// How a command run in a guest ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exit {
    /// Exit code (128 + signal when killed).
    pub code: i32,
    /// The guest killed it at the timeout.
    pub timed_out: bool,
}

/// A finished copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copied {
    /// The guest file.
    pub guest_path: String,
    /// Bytes copied.
    pub bytes: u64,
    /// Its permission bits.
    pub mode: u32,
}

fn next_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    (std::process::id() as u64) << 32 | NEXT.fetch_add(1, Ordering::Relaxed)
}

/// One connection to a guest agent, for one operation.
struct Conn {
    stream: UnixStream,
    id: u64,
    timeout: Duration,
}

impl Conn {
    fn open(sock: &Path, timeout: Duration) -> Result<Conn> {
        let stream =
            UnixStream::connect(sock).with_context(|| format!("cannot reach the guest agent at {}", sock.display()))?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        Ok(Conn { stream, id: next_id(), timeout })
    }

    fn send(&mut self, body: Request) -> Result<()> {
        write_frame(&mut self.stream, &Envelope { id: self.id, body }).context("guest agent connection")
    }

    /// The next answer to this connection's request.
    fn recv(&mut self) -> Result<Response> {
        loop {
            let resp: Option<Envelope<Response>> = read_frame(&mut self.stream).map_err(|e| match e.kind() {
                ErrorKind::WouldBlock | ErrorKind::TimedOut => {
                    anyhow!("no answer from the guest agent within {:?}", self.timeout)
                }
                _ => anyhow!("guest agent connection: {e}"),
            })?;
            let Some(resp) = resp else { bail!("guest agent closed the connection") };
            // An answer meant for an earlier client that left before reading it.
            if resp.id == self.id {
                return Ok(resp.body);
            }
        }
    }
}

/// Pings the agent; returns the guest's uptime in seconds.
pub fn ping(sock: &Path, timeout: Duration) -> Result<f64> {
    let mut c = Conn::open(sock, timeout)?;
    c.send(Request::Ping)?;
    match c.recv()? {
        Response::Pong { uptime_s, .. } => Ok(uptime_s),
        other => bail!("unexpected answer to ping: {other:?}"),
    }
}

/// Sends `src` as `Stdin` chunks and `StdinEnd` on `w`, unless `stop` is set
/// first. Holds the writer's lock for each whole frame, so whoever takes the
/// lock after setting `stop` knows no frame is half sent.
fn pump(mut src: impl Read, w: &Mutex<UnixStream>, id: u64, stop: &AtomicBool) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match src.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            // An unreadable stdin ends like an empty one.
            Err(_) => break,
        };
        let mut s = w.lock().unwrap_or_else(|e| e.into_inner());
        if stop.load(Ordering::SeqCst)
            || write_frame(&mut *s, &Envelope { id, body: Request::Stdin { data: b64_encode(&buf[..n]) } }).is_err()
        {
            return;
        }
    }
    let mut s = w.lock().unwrap_or_else(|e| e.into_inner());
    if !stop.load(Ordering::SeqCst) {
        let _ = write_frame(&mut *s, &Envelope { id, body: Request::StdinEnd });
    }
}

/// A guest command's standard streams on the host.
pub struct Streams<'a> {
    /// Streamed to the command (its end of file is the command's); `None`:
    /// the command reads /dev/null.
    pub stdin: Option<Box<dyn Read + Send>>,
    /// Receives the command's stdout as it comes.
    pub out: &'a mut dyn Write,
    /// Receives the command's stderr as it comes.
    pub err: &'a mut dyn Write,
}

/// The exit code of a command whose standard output nobody reads any more
/// (128 + SIGPIPE, as a shell reports it).
pub const BROKEN_PIPE: i32 = 141;

/// Runs `argv` in the guest with `io` as its standard streams. `timeout_s`
/// 0 means no limit. When `io.out` is a closed pipe, the command is ended
/// and the exit is [`BROKEN_PIPE`].
pub fn exec(sock: &Path, argv: &[String], io: Streams<'_>, timeout_s: u64) -> Result<Exit> {
    let Streams { stdin, out, err } = io;
    let wait = if timeout_s == 0 { Duration::from_secs(24 * 3600) } else { Duration::from_secs(timeout_s + 15) };
    let mut c = Conn::open(sock, wait)?;
    c.send(Request::Exec { argv: argv.to_vec(), stdin: stdin.is_some(), timeout_s })?;
    let stop = Arc::new(AtomicBool::new(false));
    let writer = Arc::new(Mutex::new(c.stream.try_clone()?));
    if let Some(src) = stdin {
        let (w, s, id) = (writer.clone(), stop.clone(), c.id);
        // Not joined: it may sit in a read of a terminal that never ends.
        std::thread::spawn(move || pump(src, &w, id, &s));
    }
    let result = loop {
        match c.recv() {
            Ok(Response::Output { fd, data }) => {
                let bytes = b64_decode(&data)?;
                if fd == 2 {
                    // A closed stderr must not stop the command's answer.
                    let _ = err.write_all(&bytes).and_then(|()| err.flush());
                } else if let Err(e) = out.write_all(&bytes).and_then(|()| out.flush()) {
                    if e.kind() == ErrorKind::BrokenPipe {
                        // Nobody reads stdout (`| head`): end here as a
                        // shell's SIGPIPE would; closing the connection
                        // ends the command in the guest.
                        break Ok(Exit { code: BROKEN_PIPE, timed_out: false });
                    }
                    break Err(anyhow!("writing the command's output: {e}"));
                }
            }
            Ok(Response::Exited { code, timed_out }) => break Ok(Exit { code, timed_out }),
            Ok(Response::Error { message }) => break Err(anyhow!("{message}")),
            Ok(other) => break Err(anyhow!("unexpected answer to exec: {other:?}")),
            Err(e) => break Err(e),
        }
    };
    // No more stdin; wait for a chunk being sent to be sent whole.
    stop.store(true, Ordering::SeqCst);
    drop(writer.lock().unwrap_or_else(|e| e.into_inner()));
    result
}

/// Copies host file `src` to `dest` in the guest (a folder there means
/// `dest/<name of src>`), with `src`'s permission bits.
pub fn put(sock: &Path, src: &Path, dest: &str, timeout: Duration) -> Result<Copied> {
    let mut f = fs::File::open(src).map_err(|e| match e.kind() {
        ErrorKind::NotFound => anyhow!("{}: no such file", src.display()),
        _ => anyhow!("cannot read {}: {e}", src.display()),
    })?;
    let meta = f.metadata()?;
    if !meta.is_file() {
        bail!("{} is not a regular file", src.display());
    }
    let name = src.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let mut c = Conn::open(sock, timeout)?;
    c.send(Request::Put { path: dest.to_string(), mode: meta.permissions().mode() & 0o7777, name })?;
    match c.recv()? {
        Response::Ready { .. } => {}
        Response::Error { message } => bail!("{message}"),
        other => bail!("unexpected answer to put: {other:?}"),
    }
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            // The agent drops the partial file when the stream ends without StdinEnd.
            Err(e) => bail!("reading {}: {e}", src.display()),
        };
        c.send(Request::Stdin { data: b64_encode(&buf[..n]) })?;
    }
    c.send(Request::StdinEnd)?;
    match c.recv()? {
        Response::Done { path, bytes, mode } => Ok(Copied { guest_path: path, bytes, mode }),
        Response::Error { message } => bail!("{message}"),
        other => bail!("unexpected answer to put: {other:?}"),
    }
}

/// Where a copy from the guest lands: `dest`, or `dest/<name>` when `dest`
/// is a folder.
fn get_target(guest_path: &str, dest: &Path) -> Result<PathBuf> {
    let name = Path::new(guest_path).file_name().context("the guest path names no file")?;
    let target = if dest.is_dir() { dest.join(name) } else { dest.to_path_buf() };
    if let Some(d) = target.parent().filter(|d| !d.as_os_str().is_empty()) {
        if !d.is_dir() {
            bail!("host folder {} does not exist", d.display());
        }
    }
    Ok(target)
}

/// Copies guest file `src` to host path `dest` (a folder means
/// `dest/<name of src>`), with the guest file's permission bits. The file
/// appears whole or not at all.
pub fn get(sock: &Path, src: &str, dest: &Path, timeout: Duration) -> Result<(PathBuf, Copied)> {
    let target = get_target(src, dest)?;
    let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = target.with_file_name(format!(".{name}.mc-cp.{}", std::process::id()));
    let r = get_into(sock, src, &tmp, timeout).and_then(|copied| {
        fs::set_permissions(&tmp, fs::Permissions::from_mode(copied.mode & 0o777))?;
        fs::rename(&tmp, &target).with_context(|| format!("cannot create {}", target.display()))?;
        Ok(copied)
    });
    if r.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    Ok((target, r?))
}

fn get_into(sock: &Path, src: &str, tmp: &Path, timeout: Duration) -> Result<Copied> {
    let mut c = Conn::open(sock, timeout)?;
    c.send(Request::Get { path: src.to_string() })?;
    let mut f: Option<fs::File> = None;
    loop {
        match c.recv()? {
            Response::Data { data } => {
                let file = match &mut f {
                    Some(f) => f,
                    None => f.insert(create(tmp)?),
                };
                file.write_all(&b64_decode(&data)?).with_context(|| format!("writing {}", tmp.display()))?;
            }
            Response::Done { path, bytes, mode } => {
                if f.is_none() {
                    create(tmp)?;
                }
                return Ok(Copied { guest_path: path, bytes, mode });
            }
            Response::Error { message } => bail!("{message}"),
            other => bail!("unexpected answer to get: {other:?}"),
        }
    }
}

fn create(p: &Path) -> Result<fs::File> {
    fs::File::create(p).with_context(|| format!("cannot create {}", p.display()))
}

#[cfg(test)]
mod tests {
    //! The host side against the real guest side ([`agent::server`]) on a
    //! Unix socket: what `mc-cluster exec` and `cp` do, without a guest.
    use super::*;
    use std::io;
    use std::os::unix::net::UnixListener;

    /// A socket served by the agent's server loop; the path and its folder.
    fn agent() -> (PathBuf, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("agent.sock");
        let l = UnixListener::bind(&sock).unwrap();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let mut s = s.unwrap();
                let _ = agent::server::serve(&mut s);
            }
        });
        (sock, dir)
    }

    fn run(sock: &Path, argv: &[&str], stdin: Option<Vec<u8>>) -> (Exit, Vec<u8>, Vec<u8>) {
        let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let src = stdin.map(|b| Box::new(io::Cursor::new(b)) as Box<dyn Read + Send>);
        let e = exec(sock, &argv, Streams { stdin: src, out: &mut out, err: &mut err }, 30).unwrap();
        (e, out, err)
    }

    fn noise(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect()
    }

    #[test]
    fn stdin_streams_through_a_command_byte_exact() {
        let (sock, _d) = agent();
        let data = noise(700 << 10, 42);
        let (e, out, _) = run(&sock, &["cat"], Some(data.clone()));
        assert_eq!(e, Exit { code: 0, timed_out: false });
        assert_eq!(out.len(), data.len());
        assert!(out == data, "cat's output differs from its input");
        // No stdin: the command reads end of file at once.
        let (e, out, _) = run(&sock, &["wc", "-c"], None);
        assert_eq!((e.code, String::from_utf8_lossy(&out).trim()), (0, "0"));
    }

    #[test]
    fn exit_codes_stderr_and_a_command_that_ignores_stdin() {
        let (sock, _d) = agent();
        let (e, out, err) = run(&sock, &["sh", "-c", "echo out; echo err >&2; exit 7"], Some(noise(300 << 10, 1)));
        assert_eq!((e.code, out, err), (7, b"out\n".to_vec(), b"err\n".to_vec()));
        // The connection is still in step: the next request is answered.
        let (e, out, _) = run(&sock, &["sh", "-c", "head -c 5"], Some(b"hello world".to_vec()));
        assert_eq!((e.code, out), (0, b"hello".to_vec()));
        let argv = vec!["/no/such/program".to_string()];
        let r = exec(&sock, &argv, Streams { stdin: None, out: &mut Vec::new(), err: &mut Vec::new() }, 5);
        assert!(r.unwrap_err().to_string().contains("cannot run /no/such/program"));
    }

    /// Standard output that nobody reads (`mc-cluster exec 0 -- yes | head`).
    struct ClosedPipe;
    impl Write for ClosedPipe {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::Error::from(ErrorKind::BrokenPipe))
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_closed_stdout_ends_the_command_with_141() {
        let (sock, _d) = agent();
        let argv = vec!["yes".to_string()];
        let t0 = std::time::Instant::now();
        let e = exec(&sock, &argv, Streams { stdin: None, out: &mut ClosedPipe, err: &mut Vec::new() }, 30).unwrap();
        assert_eq!(e, Exit { code: BROKEN_PIPE, timed_out: false });
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
        // A closed stderr is not a reason to stop.
        let argv: Vec<String> = ["sh", "-c", "echo e >&2; echo out"].iter().map(|a| a.to_string()).collect();
        let mut out = Vec::new();
        let e = exec(&sock, &argv, Streams { stdin: None, out: &mut out, err: &mut ClosedPipe }, 30).unwrap();
        assert_eq!((e.code, out), (0, b"out\n".to_vec()));
    }

    #[test]
    fn timeout_kills_the_command() {
        let (sock, _d) = agent();
        let argv = vec!["sleep".to_string(), "20".to_string()];
        let t0 = std::time::Instant::now();
        let e = exec(&sock, &argv, Streams { stdin: None, out: &mut Vec::new(), err: &mut Vec::new() }, 1).unwrap();
        assert!(e.timed_out && e.code == 128 + 9, "{e:?}");
        assert!(t0.elapsed() < Duration::from_secs(10));
    }

    /// The command's end is answered as it happens (the server sleeps
    /// until output or the end comes, with no timer tick), and a child left
    /// running in the background with the output pipes delays the answer
    /// only by the output grace.
    #[test]
    fn the_end_of_a_command_is_answered_at_once() {
        let (sock, _d) = agent();
        for (argv, most) in
            [(vec!["sh", "-c", "sleep 0.3; echo done"], 0.8), (vec!["sh", "-c", "sleep 5 & echo started"], 1.2)]
        {
            let argv: Vec<String> = argv.iter().map(|a| a.to_string()).collect();
            let mut out = Vec::new();
            let t0 = std::time::Instant::now();
            let e = exec(&sock, &argv, Streams { stdin: None, out: &mut out, err: &mut Vec::new() }, 30).unwrap();
            let took = t0.elapsed().as_secs_f64();
            assert_eq!(e, Exit { code: 0, timed_out: false }, "{argv:?}");
            assert!(!out.is_empty(), "{argv:?}: no output");
            assert!(took < most, "{argv:?} was answered after {took:.2} s");
        }
    }

    #[test]
    fn files_copy_both_ways_with_their_mode() {
        let (sock, d) = agent();
        let t = Duration::from_secs(10);
        let src = d.path().join("prog");
        let data = noise(200 << 10, 7);
        fs::write(&src, &data).unwrap();
        fs::set_permissions(&src, fs::Permissions::from_mode(0o751)).unwrap();
        let guest_dir = d.path().join("guest");
        fs::create_dir(&guest_dir).unwrap();
        // Into a folder: the file keeps its name and mode.
        let c = put(&sock, &src, guest_dir.to_str().unwrap(), t).unwrap();
        let there = guest_dir.join("prog");
        assert_eq!(c, Copied { guest_path: there.display().to_string(), bytes: data.len() as u64, mode: 0o751 });
        assert!(fs::read(&there).unwrap() == data);
        assert_eq!(fs::metadata(&there).unwrap().permissions().mode() & 0o777, 0o751);
        // And back, under another name.
        let back = d.path().join("back");
        let (p, c) = get(&sock, there.to_str().unwrap(), &back, t).unwrap();
        assert_eq!((p.clone(), c.bytes, c.mode), (back.clone(), data.len() as u64, 0o751));
        assert!(fs::read(&back).unwrap() == data);
        assert_eq!(fs::metadata(&back).unwrap().permissions().mode() & 0o777, 0o751);
        // An empty file is a file too.
        let empty = d.path().join("empty");
        fs::write(&empty, b"").unwrap();
        put(&sock, &empty, guest_dir.join("e").to_str().unwrap(), t).unwrap();
        let (p, c) = get(&sock, guest_dir.join("e").to_str().unwrap(), d.path(), t).unwrap();
        assert_eq!((p, c.bytes), (d.path().join("e"), 0));
        assert_eq!(fs::read(d.path().join("e")).unwrap(), b"");
    }

    #[test]
    fn copy_errors_are_clear_and_leave_nothing_behind() {
        let (sock, d) = agent();
        let t = Duration::from_secs(10);
        let e = put(&sock, &d.path().join("missing"), "/tmp/x", t).unwrap_err().to_string();
        assert!(e.contains("missing: no such file"), "{e}");
        let src = d.path().join("f");
        fs::write(&src, b"x").unwrap();
        let nowhere = d.path().join("no/such/folder/f");
        let e = put(&sock, &src, nowhere.to_str().unwrap(), t).unwrap_err().to_string();
        assert!(e.contains("guest folder") && e.contains("does not exist"), "{e}");
        let e = get(&sock, "/no/such/file", d.path(), t).unwrap_err().to_string();
        assert!(e.contains("/no/such/file: no such file in the guest"), "{e}");
        let e = get(&sock, d.path().to_str().unwrap(), &d.path().join("x"), t).unwrap_err().to_string();
        assert!(e.contains("is a folder in the guest"), "{e}");
        let e = get(&sock, src.to_str().unwrap(), &d.path().join("no/dir/x"), t).unwrap_err().to_string();
        assert!(e.contains("host folder") && e.contains("does not exist"), "{e}");
        let left: Vec<_> = fs::read_dir(d.path()).unwrap().flatten().map(|e| e.file_name()).collect();
        assert!(left.iter().all(|n| !n.to_string_lossy().contains("mc-cp")), "temporary files left: {left:?}");
    }
}
