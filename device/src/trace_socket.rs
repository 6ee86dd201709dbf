//! An adapter's register trace on a Unix socket (`<vfio-user socket>.trace`,
//! next to the socket QEMU connects to, for `mc-adapter` and for each of
//! `mc-hub`'s local ports), and the client that follows one
//! (`mc-cluster trace NODE`, `mc-hub trace --socket PATH`).
//!
//! Protocol, one JSON object a line: the client sends a
//! [`Filter`]; the server sends one [`Record`] a line, `{"dropped":N}`
//! (the total so far) when events were dropped because the client read too
//! slowly, and `{"error":"…"}` before it closes on a bad filter or when
//! another client takes over (one client at a time). The trace runs until
//! either side closes.
//!
//! Threads: an accept thread per socket and one thread per client session.

use std::io::{self, BufRead, BufReader, BufWriter, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::mpsc::RecvTimeoutError;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use thiserror::Error;
use tracing::{debug, warn};

use crate::adapter::trace::{Filter, Record, Tracer, DEFAULT_CAPACITY};

/// How long a new client has to send its filter line.
const FILTER_TIMEOUT: Duration = Duration::from_secs(5);
/// How often an idle session checks whether its client is still there.
const IDLE_CHECK: Duration = Duration::from_millis(200);
/// Pause after each batch sent, so that a flood of events is sent in
/// batches: a reader waiting in the queue is woken once per event (a
/// futex wake and a context switch for every store of the guest), one
/// that looks again later takes them all with one write.
const BATCH_PAUSE: Duration = Duration::from_millis(2);

/// Why following a trace failed.
#[derive(Debug, Error)]
pub enum TraceError {
    /// The socket could not be reached or read.
    #[error("trace socket {path}: {source}")]
    Io {
        /// The socket.
        path: String,
        /// Why.
        source: io::Error,
    },
    /// The adapter refused or ended the trace.
    #[error("the adapter says: {0}")]
    Refused(String),
}

/// The trace socket of the adapter QEMU reaches at `vfio_socket`.
pub fn socket_for(vfio_socket: &Path) -> std::path::PathBuf {
    let mut p = vfio_socket.as_os_str().to_owned();
    p.push(".trace");
    p.into()
}

/// Serves `tracer` on the trace socket of `vfio_socket` ([`socket_for`]),
/// replacing a stale one; returns its path.
pub fn bind_and_serve(vfio_socket: &Path, tracer: Arc<Tracer>) -> io::Result<std::path::PathBuf> {
    let path = socket_for(vfio_socket);
    if path.exists() {
        std::fs::remove_file(&path)?;
    }
    let l = UnixListener::bind(&path)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot listen on {}: {e}", path.display())))?;
    serve(l, tracer)?;
    Ok(path)
}

/// Serves `tracer` on `listener` from a thread of its own.
pub fn serve(listener: UnixListener, tracer: Arc<Tracer>) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new().name("mc-trace-accept".into()).spawn(move || {
        for stream in listener.incoming() {
            match stream {
                Ok(s) => {
                    let t = tracer.clone();
                    if let Err(e) = std::thread::Builder::new().name("mc-trace".into()).spawn(move || session(s, &t)) {
                        warn!("trace session not started: {e}");
                    }
                }
                Err(e) => {
                    warn!("trace socket accept: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    })
}

fn line(w: &mut impl Write, v: &impl serde::Serialize) -> io::Result<()> {
    serde_json::to_writer(&mut *w, v)?;
    w.write_all(b"\n")
}

/// Whether the peer closed its end (a read would return 0 now).
fn peer_closed(s: &UnixStream) -> bool {
    use nix::sys::socket::{recv, MsgFlags};
    let mut b = [0u8; 1];
    matches!(recv(s.as_raw_fd(), &mut b, MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT), Ok(0))
}

fn session(stream: UnixStream, tracer: &Tracer) {
    let _ = stream.set_read_timeout(Some(FILTER_TIMEOUT));
    let mut text = String::new();
    let read = BufReader::new(&stream).read_line(&mut text);
    let mut out = BufWriter::new(&stream);
    let filter = match read.map_err(|e| e.to_string()).and_then(|_| {
        let f: Filter = serde_json::from_str(text.trim()).map_err(|e| format!("bad filter: {e}"))?;
        f.check().map(|()| f)
    }) {
        Ok(f) => f,
        Err(e) => {
            let _ = line(&mut out, &serde_json::json!({ "error": e }));
            let _ = out.flush();
            return;
        }
    };
    debug!(?filter, "trace client connected");
    let rx = tracer.listen(filter, DEFAULT_CAPACITY);
    let mut dropped = tracer.dropped();
    loop {
        let r = match rx.recv_timeout(IDLE_CHECK) {
            Ok(first) => {
                let r = std::iter::once(first)
                    .chain(rx.try_iter().take(4096))
                    .try_for_each(|r: Record| line(&mut out, &r))
                    .and_then(|()| out.flush());
                std::thread::sleep(BATCH_PAUSE);
                r
            }
            Err(RecvTimeoutError::Timeout) if peer_closed(&stream) => break,
            Err(RecvTimeoutError::Timeout) => Ok(()),
            Err(RecvTimeoutError::Disconnected) => {
                let _ = line(&mut out, &serde_json::json!({ "error": "another trace client took over" }));
                let _ = out.flush();
                return;
            }
        };
        let now = tracer.dropped();
        let r = r.and_then(|()| {
            if now == dropped {
                return Ok(());
            }
            dropped = now;
            line(&mut out, &serde_json::json!({ "dropped": now })).and_then(|()| out.flush())
        });
        if r.is_err() {
            break;
        }
    }
    // Ours or not, the next event finds a closed receiver if it was ours.
    drop(rx);
    debug!("trace client gone");
}

/// Follows the trace at `socket` with `filter`, writing one line per event
/// to `out`: decoded (`0.001234 W CTRL = 0x1 [RESET]`) or, with `json`, as
/// the socket sends it. Returns when the adapter closes the trace, or with
/// the error it gave; a write error to `out` ends it too (a closed pipe).
pub fn follow(socket: &Path, filter: &Filter, json: bool, out: &mut dyn Write) -> Result<(), TraceError> {
    let io_err = |source| TraceError::Io { path: socket.display().to_string(), source };
    let mut s = UnixStream::connect(socket).map_err(io_err)?;
    line(&mut s, filter).map_err(io_err)?;
    // Written in batches: flushed whenever what has come is written, not
    // at every line (a write per event cost a flood of stores a third of
    // its rate on a 2-core host).
    let mut out = std::io::BufWriter::with_capacity(1 << 16, out);
    let mut input = BufReader::new(s);
    let mut l = String::new();
    loop {
        l.clear();
        if input.read_line(&mut l).map_err(io_err)? == 0 {
            break;
        }
        let l = l.trim_end();
        let text = match serde_json::from_str::<Record>(l) {
            Ok(_) if json => l.to_string(),
            Ok(r) => format!("{}.{:06} {}", r.t_us / 1_000_000, r.t_us % 1_000_000, r.event.describe()),
            Err(_) => {
                let v: serde_json::Value =
                    serde_json::from_str(l).map_err(|e| TraceError::Refused(format!("undecodable line {l:?}: {e}")))?;
                if let Some(e) = v.get("error").and_then(|e| e.as_str()) {
                    let _ = out.flush();
                    return Err(TraceError::Refused(e.to_string()));
                }
                match v.get("dropped") {
                    Some(_) if json => l.to_string(),
                    Some(n) => format!("-- {n} events dropped in all so far: this reader fell behind"),
                    None if json => l.to_string(),
                    None => format!("(undecodable event {l})"),
                }
            }
        };
        if writeln!(out, "{text}").is_err() {
            return Ok(());
        }
        if input.buffer().is_empty() && out.flush().is_err() {
            return Ok(());
        }
    }
    let _ = out.flush();
    Ok(())
}

/// The trace filter as command-line flags (`mc-hub trace`, `mc-cluster trace`).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct FilterArgs {
    /// Only these kinds (comma-separated): reg, pct, tx, dma_map,
    /// dma_unmap, irq, irq_mask, dma_desc, dma_done, reset.
    #[arg(long, value_delimiter = ',')]
    pub kind: Vec<String>,
    /// Only these registers, by name (comma-separated: CTRL,INT_MASK).
    #[arg(long = "reg", value_delimiter = ',')]
    pub regs: Vec<String>,
    /// Only pages FIRST-LAST (or one page) for PCT, transmit and DMA events.
    #[arg(long, value_name = "FIRST[-LAST]")]
    pub pages: Option<String>,
    /// Only reads (`r`) or only writes (`w`).
    #[arg(long, value_name = "r|w")]
    pub dir: Option<String>,
    /// One JSON object a line, as the socket sends them.
    #[arg(long)]
    pub json: bool,
}

impl FilterArgs {
    /// The filter, and whether JSON was asked for; a clear error for a
    /// name or range that does not parse.
    pub fn filter(&self) -> Result<(Filter, bool), String> {
        let regs = self
            .regs
            .iter()
            .map(|n| {
                regs::decode::reg_offset(n).ok_or_else(|| format!("--reg {n}: no such register (docs/adapter.md)"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let num = |s: &str| s.trim().parse::<u64>().map_err(|_| format!("--pages {s}: not a page number"));
        let pages = match self.pages.as_deref() {
            None => None,
            Some(p) => Some(match p.split_once('-') {
                Some((a, b)) => (num(a)?, num(b)?),
                None => (num(p)?, num(p)?),
            }),
        };
        let write = match self.dir.as_deref() {
            None => None,
            Some("r") => Some(false),
            Some("w") => Some(true),
            Some(d) => return Err(format!("--dir {d}: r or w")),
        };
        let f = Filter { kinds: self.kind.clone(), regs, pages, write };
        f.check()?;
        Ok((f, self.json))
    }
}
