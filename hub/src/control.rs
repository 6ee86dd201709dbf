//! Control requests: the `--control` socket (`mc-hub ctl`, `mc-cluster hub
//! -- …`): counters, and faults on purpose (link down and up, corrupted and
//! delayed frames) for link ports and local ports alike.
//!
//! Connections are capped ([`crate::hub::HubConfig::max_control`]) and
//! closed when idle ([`crate::hub::HubConfig::control_idle_timeout`]).
//!
//! Runs on the hub's tokio tasks. Takes the control view's mutex, never the
//! order lock while holding it (lock order: order lock, then control view),
//! so `stats` and `link-down` answer at once even while a full receiver
//! holds the bus.

use std::future::Future;
use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tracing::{debug, info};

use crate::bounds::{accept_failed, closed_at_door};
use crate::hub::{CtlView, Hub};
use crate::port::PortCtl;
use device::adapter::faults::Fault;

/// Longest control request line accepted.
const MAX_CONTROL_LINE: usize = 4096;
/// Longest `delay` accepted: every frame to the port waits that long, one
/// after another, so it must stay short.
pub const MAX_DELAY_MICROS: u64 = 1_000_000;

/// A control request (one JSON object per line on the control socket; also
/// the `mc-hub ctl` subcommands).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, clap::Subcommand)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Control {
    /// Per-node packet counters and queue depths (JSON).
    Stats,
    /// Take NODE's link down and keep it down until link-up.
    LinkDown {
        /// Node id.
        node: u16,
    },
    /// Let NODE rejoin.
    LinkUp {
        /// Node id.
        node: u16,
    },
    /// Corrupt the next COUNT frames to NODE (its adapter counts CRC errors).
    Corrupt {
        /// Node id.
        node: u16,
        /// Frames to corrupt.
        #[arg(default_value_t = 1)]
        count: u32,
    },
    /// Hold every frame to NODE back by MICROS microseconds (0 to stop; at most 1 s).
    Delay {
        /// Node id.
        node: u16,
        /// Microseconds.
        micros: u64,
    },
    /// Write every ordered frame from now on to FILE (pcap, link type
    /// USER0; created or truncated; a capture already running stops).
    CaptureStart {
        /// The capture file (an absolute path: the hub's working directory
        /// is not the caller's).
        file: std::path::PathBuf,
    },
    /// Stop the running capture (its file holds every frame until now).
    CaptureStop,
    /// What the monitor shows: writes and writers per page, ordering step
    /// times, and COUNT pages from FIRST of the hub's copy of imcd's pages.
    Observe {
        /// First page of the copy to return.
        #[arg(default_value_t = 0)]
        #[serde(default)]
        first: u64,
        /// Pages of the copy to return (0: none).
        #[arg(default_value_t = 0)]
        #[serde(default)]
        count: u64,
    },
    /// Arm a fault in a local port's adapter, for a driver's error paths
    /// (docs/adapter.md, "Testing a driver"). KIND: rx-dma (the next
    /// COUNT receive DMAs fail), error (raise --bits now), drop-irq,
    /// delay-irq (--ms), dead-reads (reads return all ones), dma-desc (the
    /// next COUNT descriptors complete with --status), clear.
    Fault {
        /// The node (a local port).
        node: u16,
        /// rx-dma, error, drop-irq, delay-irq, dead-reads, dma-desc or clear.
        kind: String,
        /// How many times it takes effect.
        #[arg(long, default_value_t = 1)]
        #[serde(default = "one")]
        count: u32,
        /// error: ERR_STATUS bits by name, comma-separated (rx-dma,crc).
        #[arg(long)]
        #[serde(default)]
        bits: Option<String>,
        /// dma-desc: the status by name (src-unmapped, link-down, ...).
        #[arg(long)]
        #[serde(default)]
        status: Option<String>,
        /// delay-irq: milliseconds.
        #[arg(long)]
        #[serde(default)]
        ms: Option<u32>,
    },
    /// Restart the hub in place: the same process id, arguments and
    /// sockets; local guests keep running and see a link flap
    /// (`docs/hub.md`, "Hub restart"). Answered before it begins.
    Restart,
}

fn one() -> u32 {
    1
}

/// The device fault a `fault` request names.
fn device_fault(
    kind: &str,
    count: u32,
    bits: Option<&str>,
    status: Option<&str>,
    ms: Option<u32>,
) -> Result<Fault, String> {
    use device::regs::{dma, err};
    let missing = |flag: &str| format!("fault {kind} needs --{flag}");
    let f = match kind {
        "rx-dma" => Fault::RxDma { count },
        "drop-irq" => Fault::DropIrq { count },
        "dead-reads" => Fault::DeadReads { count },
        "delay-irq" => Fault::DelayIrq { count, ms: ms.ok_or_else(|| missing("ms"))? },
        "error" => {
            let names = bits.ok_or_else(|| missing("bits"))?;
            let mut v = 0;
            for n in names.split(',').map(str::trim) {
                let (b, _) = err::NAMES.iter().find(|(_, name)| name.eq_ignore_ascii_case(n)).ok_or_else(|| {
                    let all: Vec<&str> = err::NAMES.iter().map(|(_, n)| *n).collect();
                    format!("--bits {n}: no such error bit ({})", all.join(", "))
                })?;
                v |= b;
            }
            Fault::Error { bits: v }
        }
        "dma-desc" => {
            let n = status.ok_or_else(|| missing("status"))?;
            let (code, _) =
                dma::status::NAMES.iter().find(|(_, name)| name.eq_ignore_ascii_case(n)).ok_or_else(|| {
                    let all: Vec<&str> = dma::status::NAMES.iter().map(|(_, n)| *n).collect();
                    format!("--status {n}: no such DMA status ({})", all.join(", "))
                })?;
            Fault::DmaDesc { count, status: *code }
        }
        "clear" => Fault::Clear,
        other => {
            return Err(format!("no fault '{other}' (rx-dma, error, drop-irq, delay-irq, dead-reads, dma-desc, clear)"))
        }
    };
    f.check()?;
    Ok(f)
}

impl Control {
    /// Decodes one request line (without its newline, at most
    /// [`MAX_CONTROL_LINE`] bytes: the reader caps it). A malformed line
    /// gives the [`ControlReply::Error`] to send back, never a panic.
    pub fn parse_line(line: &[u8]) -> Result<Control, ControlReply> {
        let text =
            std::str::from_utf8(line).map_err(|_| ControlReply::Error { message: "request is not UTF-8".into() })?;
        serde_json::from_str::<Control>(text).map_err(|e| ControlReply::Error { message: format!("bad request: {e}") })
    }
}

/// One node's line in [`ControlReply::Stats`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct NodeStats {
    /// Node id.
    pub node: u16,
    /// Name the adapter gave.
    pub name: String,
    /// Writes received from it.
    pub writes_in: u64,
    /// Payload bytes received from it.
    pub bytes_in: u64,
    /// Frames queued for it.
    pub frames_out: u64,
    /// Frames waiting in its queue now.
    pub queued: usize,
    /// Frames corrupted on purpose.
    pub corrupted: u64,
    /// Writes from it that were dropped.
    pub dropped: u64,
    /// Frames from it that went missing (its link sequence skipped).
    pub link_gaps: u64,
    /// Transmit DMA descriptors retired by its adapter since its last
    /// reset (local ports: the hub serves the adapter; None for link ports).
    #[serde(default)]
    pub dma_descs: Option<u32>,
    /// Bytes its adapter's DMA engine sent since its last reset.
    #[serde(default)]
    pub dma_bytes: Option<u64>,
    /// Device faults that took effect (local ports).
    #[serde(default)]
    pub faults: Option<device::adapter::faults::FaultCounts>,
}

/// The answer to a [`Control`] request.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum ControlReply {
    /// Done.
    Ok,
    /// Counters.
    Stats {
        /// Next sequence number.
        next_seq: u64,
        /// Nodes that are up.
        nodes: Vec<NodeStats>,
        /// Nodes held down by control.
        held_down: Vec<u16>,
        /// Connections refused: garbage, bad Hello, failed authentication, full hub.
        rejected: u64,
        /// Nodes cut off because their queue stayed full.
        stalled: u64,
        /// Link connections open now that have not completed their `Hello`.
        #[serde(default)]
        unauthenticated: usize,
        /// Link connections closed at once because `unauthenticated` was at its cap.
        #[serde(default)]
        unauthenticated_closed: u64,
        /// Link connections closed because they sent no `Hello` in time.
        #[serde(default)]
        auth_timeouts: u64,
        /// Control connections open now (this one included).
        #[serde(default)]
        control_connections: usize,
        /// Control connections closed at once because they were at their cap.
        #[serde(default)]
        control_closed: u64,
        /// Control connections closed after sending nothing for the idle timeout.
        #[serde(default)]
        control_idle_closed: u64,
    },
    /// What `observe` asked for.
    Observe(crate::observe::Seen),
    /// Refused.
    Error {
        /// Why.
        message: String,
    },
}

/// Reads one line (without its newline) into `line`, keeping at most `cap`
/// bytes; a longer line is read to its end and dropped. `Ok(None)` at the
/// end of the stream, `Ok(Some(true))` for a line that was too long.
async fn read_line_capped<R: tokio::io::AsyncBufRead + Unpin>(
    r: &mut R,
    line: &mut Vec<u8>,
    cap: usize,
) -> std::io::Result<Option<bool>> {
    line.clear();
    let mut too_long = false;
    loop {
        let buf = r.fill_buf().await?;
        if buf.is_empty() {
            return Ok((!line.is_empty() || too_long).then_some(too_long));
        }
        let (chunk, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (&buf[..i], Some(i + 1)),
            None => (buf, None),
        };
        if line.len() + chunk.len() > cap {
            too_long = true;
            line.clear();
        } else if !too_long {
            line.extend_from_slice(chunk);
        }
        let used = done.unwrap_or(buf.len());
        r.consume(used);
        if done.is_some() {
            return Ok(Some(too_long));
        }
    }
}

impl Hub {
    /// Answers control requests on `listener` (one JSON object per line each
    /// way) until `shutdown` completes.
    pub async fn serve_control(
        &self,
        listener: UnixListener,
        shutdown: impl Future<Output = ()>,
    ) -> std::io::Result<()> {
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => return Ok(()),
                acc = listener.accept() => {
                    let stream = match acc {
                        Ok((s, _)) => s,
                        Err(e) => {
                            accept_failed("control", &e).await;
                            continue;
                        }
                    };
                    let Some(slot) = self.shared.control_conns.enter() else {
                        closed_at_door("control", &self.shared.control_conns);
                        self.turn_away(stream);
                        continue;
                    };
                    let hub = self.clone();
                    tokio::spawn(async move {
                        hub.serve_control_conn(stream).await;
                        drop(slot);
                    });
                }
            }
        }
    }

    /// Tells a control client over the cap why it is closed, without waiting:
    /// the line fits a fresh socket's buffer, or is not sent.
    fn turn_away(&self, stream: UnixStream) {
        let cap = self.shared.control_conns.cap();
        let reply = ControlReply::Error { message: format!("too many control connections ({cap} open); try again") };
        let mut out = serde_json::to_vec(&reply).unwrap_or_default();
        out.push(b'\n');
        if let Ok(s) = stream.into_std() {
            let _ = std::io::Write::write(&mut &s, &out);
        }
    }

    /// Answers one control connection: one request per line, for as long as
    /// the client sends one within the idle timeout; each line is bounded,
    /// and every line gets an answer.
    async fn serve_control_conn(&self, stream: UnixStream) {
        let idle = self.shared.cfg.control_idle_timeout;
        let (r, mut w) = stream.into_split();
        let mut r = BufReader::new(r);
        let mut line = Vec::with_capacity(256);
        loop {
            let too_long = match tokio::time::timeout(idle, read_line_capped(&mut r, &mut line, MAX_CONTROL_LINE)).await
            {
                Ok(Ok(Some(too_long))) => too_long,
                Ok(_) => break,
                Err(_) => {
                    self.shared.control_idle_closed.fetch_add(1, Ordering::Relaxed);
                    debug!("control connection idle for {idle:?}; closed");
                    break;
                }
            };
            let mut restart = false;
            let reply = if too_long {
                ControlReply::Error { message: format!("request over {MAX_CONTROL_LINE} bytes") }
            } else {
                match Control::parse_line(&line) {
                    Ok(c) => {
                        restart = c == Control::Restart;
                        self.control(c).await
                    }
                    Err(refusal) => refusal,
                }
            };
            let mut out = serde_json::to_vec(&reply).unwrap_or_default();
            out.push(b'\n');
            let sent = w.write_all(&out).await.is_ok() && w.flush().await.is_ok();
            if restart && reply == ControlReply::Ok {
                // Only now: the answer is out before the process is replaced.
                self.shared.restart.notify_one();
            }
            if !sent {
                break;
            }
        }
    }

    /// Carries out one control request. Never waits for the ordering lock.
    pub async fn control(&self, c: Control) -> ControlReply {
        let mut ctl = self.shared.ctl.lock().unwrap();
        let max = self.shared.cfg.max_nodes;
        let node_of = |n: u16| {
            if (n as usize) < max {
                Ok(n as usize)
            } else {
                Err(ControlReply::Error { message: format!("node {n} is outside this hub's {max} ports") })
            }
        };
        let connected = |ctl: &CtlView, n: u16| -> Result<std::sync::Arc<PortCtl>, ControlReply> {
            let i = node_of(n)?;
            ctl.ports[i].clone().ok_or_else(|| ControlReply::Error { message: format!("node {n} is not connected") })
        };
        match c {
            Control::Fault { node, kind, count, bits, status, ms } => {
                let port = match node_of(node) {
                    Err(e) => return e,
                    Ok(i) => ctl.local[i].clone(),
                };
                let Some(port) = port else {
                    return ControlReply::Error {
                        message: format!(
                            "node {node} is not a local port: device faults reach the hub's own adapters (in-hub mode)"
                        ),
                    };
                };
                match device_fault(&kind, count, bits.as_deref(), status.as_deref(), ms)
                    .and_then(|f| port.counters.inject(&f).map(|()| f))
                {
                    Ok(f) => {
                        info!(node, ?f, "control: device fault armed");
                        ControlReply::Ok
                    }
                    Err(message) => ControlReply::Error { message },
                }
            }
            Control::Restart if !self.shared.restart_enabled.load(Ordering::SeqCst) => {
                ControlReply::Error { message: "this hub cannot restart in place (only mc-hub can)".into() }
            }
            Control::Restart => {
                info!("control: restart in place requested");
                ControlReply::Ok
            }
            Control::Stats => ControlReply::Stats {
                next_seq: self.shared.order.seq_hint.load(Ordering::Relaxed),
                nodes: ctl
                    .ports
                    .iter()
                    .enumerate()
                    .filter_map(|(i, p)| p.as_ref().map(|p| (i, p)))
                    .map(|(i, p)| NodeStats {
                        node: i as u16,
                        name: p.name.clone(),
                        writes_in: p.stats.writes_in.load(Ordering::Relaxed),
                        bytes_in: p.stats.bytes_in.load(Ordering::Relaxed),
                        frames_out: p.stats.frames_out.load(Ordering::Relaxed),
                        queued: p
                            .tx
                            .as_ref()
                            .map_or_else(|| p.held.load(Ordering::Relaxed), |tx| tx.max_capacity() - tx.capacity()),
                        corrupted: p.stats.corrupted.load(Ordering::Relaxed),
                        dropped: p.stats.dropped.load(Ordering::Relaxed),
                        link_gaps: p.stats.link_gaps.load(Ordering::Relaxed),
                        dma_descs: ctl.local[i].as_ref().map(|l| l.counters.dma().0),
                        dma_bytes: ctl.local[i].as_ref().map(|l| l.counters.dma().1),
                        faults: ctl.local[i].as_ref().map(|l| l.counters.faults()),
                    })
                    .collect(),
                held_down: ctl.held_down.iter().enumerate().filter(|(_, h)| **h).map(|(i, _)| i as u16).collect(),
                rejected: self.shared.rejected.load(Ordering::Relaxed),
                stalled: self.shared.order.stalled.load(Ordering::Relaxed),
                unauthenticated: self.shared.unauthenticated.open(),
                unauthenticated_closed: self.shared.unauthenticated.closed(),
                auth_timeouts: self.shared.auth_timeouts.load(Ordering::Relaxed),
                control_connections: self.shared.control_conns.open(),
                control_closed: self.shared.control_conns.closed(),
                control_idle_closed: self.shared.control_idle_closed.load(Ordering::Relaxed),
            },
            Control::Delay { micros, .. } if micros > MAX_DELAY_MICROS => {
                ControlReply::Error { message: format!("delay {micros} us is over the {MAX_DELAY_MICROS} us limit") }
            }
            Control::Delay { node, micros } => match connected(&ctl, node) {
                Err(e) => e,
                Ok(p) => {
                    p.delay.store(micros, Ordering::SeqCst);
                    ControlReply::Ok
                }
            },
            Control::Corrupt { node, count } => match connected(&ctl, node) {
                Err(e) => e,
                Ok(p) => {
                    // Saturates: asking for more never wraps around to fewer.
                    let _ =
                        p.corrupt.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |c| Some(c.saturating_add(count)));
                    ControlReply::Ok
                }
            },
            Control::LinkDown { node } => match node_of(node) {
                Err(e) => e,
                Ok(i) => {
                    ctl.held_down[i] = true;
                    if let Some(p) = &ctl.ports[i] {
                        p.kick.notify_one();
                    }
                    let local = ctl.local[i].is_some();
                    // Lock order: the order lock before the control view.
                    drop(ctl);
                    if local {
                        self.leave_local(node, "link taken down by hub control");
                    }
                    info!(node, "link held down by control");
                    ControlReply::Ok
                }
            },
            Control::CaptureStart { file } if !file.is_absolute() => {
                ControlReply::Error { message: format!("capture file {} is not an absolute path", file.display()) }
            }
            Control::CaptureStart { file } => {
                // Lock order: the capture is taken inside the ordering step,
                // never with the control view held.
                drop(ctl);
                match self.capture_to(&file) {
                    Ok(()) => {
                        info!(file = %file.display(), "capture started by control");
                        ControlReply::Ok
                    }
                    Err(e) => ControlReply::Error { message: format!("capture to {}: {e}", file.display()) },
                }
            }
            Control::Observe { first, count } => {
                drop(ctl);
                match self.shared.order.observe.seen(first, count) {
                    Ok(s) => ControlReply::Observe(s),
                    Err(message) => ControlReply::Error { message },
                }
            }
            Control::CaptureStop => {
                drop(ctl);
                match self.stop_capture() {
                    true => ControlReply::Ok,
                    false => ControlReply::Error { message: "no capture is running".into() },
                }
            }
            Control::LinkUp { node } => match node_of(node) {
                Err(e) => e,
                Ok(i) => {
                    ctl.held_down[i] = false;
                    let local = ctl.local[i].is_some();
                    drop(ctl);
                    if local {
                        // A remote adapter rejoins by itself; a local port's
                        // cable is plugged back in here.
                        self.rejoin_local(node);
                    }
                    info!(node, "link released by control");
                    ControlReply::Ok
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_line_decodes_requests_and_refuses_garbage_with_a_reply() {
        assert_eq!(
            Control::parse_line(br#"{"cmd":"corrupt","node":2,"count":5}"#),
            Ok(Control::Corrupt { node: 2, count: 5 })
        );
        assert_eq!(Control::parse_line(br#"{"cmd":"stats"}"#), Ok(Control::Stats));
        match Control::parse_line(b"{\"cmd\":\"stats\"}\xff") {
            Err(ControlReply::Error { message }) => assert!(message.contains("not UTF-8"), "{message}"),
            other => panic!("invalid UTF-8 gave {other:?}"),
        }
        for bad in [&br#"{"cmd":"link_down","node":70000}"#[..], br#"{"cmd":"reboot"}"#, b"", b"[1,2"] {
            match Control::parse_line(bad) {
                Err(ControlReply::Error { message }) => assert!(message.starts_with("bad request: "), "{message}"),
                other => panic!("{:?} gave {other:?}", String::from_utf8_lossy(bad)),
            }
        }
    }
}
