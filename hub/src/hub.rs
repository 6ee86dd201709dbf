//! The hub: accepts adapters, gives each a node id, and puts every write of
//! every node into one global order.
//!
//! # Ordering
//!
//! All writes pass through [`Shared::order`], which holds the hub state lock
//! while it numbers a write and queues it on every receiving port. Because
//! numbering and queueing happen under one lock, every port's queue holds
//! deliveries in increasing sequence order: each node sees the same order.
//! Membership events (`Member`) are numbered in the same sequence.
//!
//! # Flow control
//!
//! Each port has a bounded queue ([`HubConfig::queue_depth`] frames). When a
//! receiver's queue is full, the ordering step waits for room while holding
//! the lock, so every sender waits: back-pressure to all senders, as on the
//! original shared bus. Memory is bounded by `ports × queue_depth × frame`.
//!
//! # Faults on purpose
//!
//! [`Hub::control`] (the `--control` socket, `mc-hub ctl`) can hold a node's
//! link down (its connection is closed and it cannot rejoin until released),
//! corrupt the next frames sent to a node (its adapter must count CRC errors)
//! and report per-node counters.

use std::future::Future;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::UnixListener;
use tokio::sync::{mpsc, Mutex, Notify};
use tracing::{debug, info, warn};

use crate::link::{self, Header, Kind, Msg, ANY_NODE, BROADCAST, FLAG_LOOPBACK, HEADER_LEN};

/// How long a new connection may take to send its `Hello`.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest control request line accepted.
const MAX_CONTROL_LINE: usize = 4096;

/// Hub settings.
#[derive(Debug, Clone)]
pub struct HubConfig {
    /// Ports (node ids 0..max_nodes). The original hub had 8.
    pub max_nodes: usize,
    /// Frames queued per receiving port before senders are held back.
    pub queue_depth: usize,
}

impl Default for HubConfig {
    fn default() -> Self {
        HubConfig { max_nodes: 8, queue_depth: 4096 }
    }
}

/// Counters kept for every port.
#[derive(Debug, Default)]
pub struct PortStats {
    /// Writes received from this node.
    pub writes_in: AtomicU64,
    /// Payload bytes received from this node.
    pub bytes_in: AtomicU64,
    /// Frames queued for delivery to this node.
    pub frames_out: AtomicU64,
    /// Frames corrupted on purpose on the way to this node.
    pub corrupted: AtomicU64,
    /// Writes from this node dropped (destination outside the hub's ports).
    pub dropped: AtomicU64,
    /// Frames from this node that went missing (link sequence skipped).
    pub link_gaps: AtomicU64,
}

/// A control request (one JSON object per line on the control socket).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Control {
    /// Per-node counters.
    Stats,
    /// Close node's link and keep it from rejoining.
    LinkDown {
        /// Node id.
        node: u16,
    },
    /// Let a held-down node rejoin.
    LinkUp {
        /// Node id.
        node: u16,
    },
    /// Corrupt the payload of the next `count` frames sent to `node`.
    Corrupt {
        /// Node id.
        node: u16,
        /// Frames to corrupt.
        count: u32,
    },
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
    },
    /// Refused.
    Error {
        /// Why.
        message: String,
    },
}

type Frame = Arc<Vec<u8>>;

struct Port {
    name: String,
    tx: mpsc::Sender<Frame>,
    stats: Arc<PortStats>,
    /// Frames still to corrupt on the way out.
    corrupt: Arc<AtomicU32>,
    /// Wakes the connection's reader to close the link.
    kick: Arc<Notify>,
}

struct State {
    next_seq: u64,
    ports: Vec<Option<Port>>,
    held_down: Vec<bool>,
}

struct Shared {
    cfg: HubConfig,
    state: Mutex<State>,
}

impl Shared {
    /// Numbers one write and queues it on every port that receives it.
    async fn order(&self, src: u16, dest: u16, flags: u16, addr: u64, data: &[u8]) {
        let mut st = self.state.lock().await;
        let seq = st.next_seq;
        st.next_seq += 1;
        let frame: Frame = Arc::new(link::deliver_from_write(seq, src, flags, addr, data));
        let loopback = flags & FLAG_LOOPBACK != 0;
        for (id, port) in st.ports.iter().enumerate() {
            let Some(port) = port else { continue };
            let id = id as u16;
            let wanted = if id == src { loopback } else { dest == BROADCAST || dest == id };
            if !wanted {
                continue;
            }
            port.stats.frames_out.fetch_add(1, Ordering::Relaxed);
            // A closed channel means that node is leaving; its removal
            // announces it. Waiting for room here is the back-pressure.
            let _ = port.tx.send(frame.clone()).await;
        }
    }

    /// Announces a membership change to every port except `node` itself,
    /// in the global order (waiting for queue room like a write does).
    async fn announce(st: &mut State, node: u16, up: bool) {
        let seq = st.next_seq;
        st.next_seq += 1;
        let frame: Frame = Arc::new(Msg::Member { seq, node, up }.encode());
        for (id, port) in st.ports.iter().enumerate() {
            if let Some(port) = port {
                if id as u16 != node {
                    let _ = port.tx.send(frame.clone()).await;
                }
            }
        }
    }
}

/// A running hub's handle: serve adapters, answer control requests.
#[derive(Clone)]
pub struct Hub {
    shared: Arc<Shared>,
}

impl Hub {
    /// A hub with no adapters yet.
    pub fn new(cfg: HubConfig) -> Hub {
        let state = State {
            next_seq: 0,
            ports: (0..cfg.max_nodes).map(|_| None).collect(),
            held_down: vec![false; cfg.max_nodes],
        };
        Hub { shared: Arc::new(Shared { state: Mutex::new(state), cfg }) }
    }

    /// Accepts adapters on `listener` until `shutdown` completes.
    pub async fn serve(&self, listener: UnixListener, shutdown: impl Future<Output = ()>) -> std::io::Result<()> {
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => {
                    info!("hub shutting down");
                    return Ok(());
                }
                acc = listener.accept() => {
                    let stream = match acc {
                        Ok((s, _)) => s,
                        Err(e) => {
                            // Out of fds and the like: back off and keep serving.
                            warn!("accept failed: {e}");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                    };
                    let shared = self.shared.clone();
                    tokio::spawn(async move {
                        let (r, w) = stream.into_split();
                        if let Err(e) = handle(shared, r, w).await {
                            debug!("link closed: {e}");
                        }
                    });
                }
            }
        }
    }

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
                    let (stream, _) = acc?;
                    let hub = self.clone();
                    tokio::spawn(async move {
                        let (r, mut w) = stream.into_split();
                        let mut lines = BufReader::new(r.take(64 * MAX_CONTROL_LINE as u64)).lines();
                        while let Ok(Some(line)) = lines.next_line().await {
                            let reply = if line.len() > MAX_CONTROL_LINE {
                                ControlReply::Error { message: format!("request over {MAX_CONTROL_LINE} bytes") }
                            } else {
                                match serde_json::from_str::<Control>(&line) {
                                    Ok(c) => hub.control(c).await,
                                    Err(e) => ControlReply::Error { message: format!("bad request: {e}") },
                                }
                            };
                            let mut out = serde_json::to_vec(&reply).unwrap_or_default();
                            out.push(b'\n');
                            if w.write_all(&out).await.is_err() {
                                break;
                            }
                        }
                    });
                }
            }
        }
    }

    /// Carries out one control request.
    pub async fn control(&self, c: Control) -> ControlReply {
        let mut st = self.shared.state.lock().await;
        let max = self.shared.cfg.max_nodes;
        let check = |n: u16| {
            if (n as usize) < max {
                Ok(n as usize)
            } else {
                Err(ControlReply::Error { message: format!("node {n} is outside this hub's {max} ports") })
            }
        };
        match c {
            Control::Stats => ControlReply::Stats {
                next_seq: st.next_seq,
                nodes: st
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
                        queued: p.tx.max_capacity() - p.tx.capacity(),
                        corrupted: p.stats.corrupted.load(Ordering::Relaxed),
                        dropped: p.stats.dropped.load(Ordering::Relaxed),
                    })
                    .collect(),
                held_down: st.held_down.iter().enumerate().filter(|(_, h)| **h).map(|(i, _)| i as u16).collect(),
            },
            Control::LinkDown { node } => match check(node) {
                Err(e) => e,
                Ok(i) => {
                    st.held_down[i] = true;
                    if let Some(p) = &st.ports[i] {
                        p.kick.notify_one();
                    }
                    info!(node, "link held down by control");
                    ControlReply::Ok
                }
            },
            Control::LinkUp { node } => match check(node) {
                Err(e) => e,
                Ok(i) => {
                    st.held_down[i] = false;
                    info!(node, "link released by control");
                    ControlReply::Ok
                }
            },
            Control::Corrupt { node, count } => match check(node) {
                Err(e) => e,
                Ok(i) => match &st.ports[i] {
                    Some(p) => {
                        p.corrupt.fetch_add(count, Ordering::SeqCst);
                        ControlReply::Ok
                    }
                    None => ControlReply::Error { message: format!("node {node} is not connected") },
                },
            },
        }
    }
}

/// Runs a hub on `listener` until `shutdown` completes (no control socket).
pub async fn serve(listener: UnixListener, cfg: HubConfig, shutdown: impl Future<Output = ()>) -> std::io::Result<()> {
    Hub::new(cfg).serve(listener, shutdown).await
}

/// Writes a shared frame with this link's next sequence number (see [`link`]).
async fn write_stamped<W: AsyncWrite + Unpin>(w: &mut W, f: &[u8], seq: &mut u16) -> std::io::Result<()> {
    w.write_all(&f[..6]).await?;
    w.write_all(&seq.to_le_bytes()).await?;
    w.write_all(&f[8..]).await?;
    *seq = seq.wrapping_add(1);
    Ok(())
}

async fn read_frame<R: AsyncRead + Unpin>(r: &mut R, buf: &mut Vec<u8>) -> std::io::Result<Header> {
    let mut h = [0u8; HEADER_LEN];
    r.read_exact(&mut h).await?;
    let hdr = Header::parse(&h).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    buf.resize(hdr.len, 0);
    r.read_exact(buf).await?;
    Ok(hdr)
}

fn invalid(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string())
}

async fn handle<R, W>(shared: Arc<Shared>, mut r: R, w: W) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let mut w = BufWriter::new(w);
    let mut buf = Vec::new();
    let hdr = match tokio::time::timeout(HELLO_TIMEOUT, read_frame(&mut r, &mut buf)).await {
        Ok(h) => h?,
        Err(_) => {
            warn!("peer sent no Hello within {HELLO_TIMEOUT:?}; closing");
            return Ok(());
        }
    };
    let (want, name) = match Msg::parse(&hdr, &buf) {
        Ok(Msg::Hello { want_node, name, .. }) => (want_node, name.to_string()),
        Ok(other) => {
            warn!("peer opened with {:?} instead of Hello; closing", kind_of(&other));
            return Ok(());
        }
        Err(e) => {
            warn!("garbage from new peer ({e}); closing");
            return Ok(());
        }
    };

    // Join: choose a port, send Welcome, announce to the others.
    let (node, mut rx, stats, corrupt, kick) = {
        let mut st = shared.state.lock().await;
        let max = shared.cfg.max_nodes;
        let chosen = if want != ANY_NODE {
            match st.ports.get(want as usize) {
                None => Err(format!("node id {want} is outside this hub's {max} ports")),
                Some(Some(p)) => Err(format!("node id {want} is already taken by '{}'", p.name)),
                Some(None) if st.held_down[want as usize] => {
                    Err(format!("link of node {want} is held down by the hub"))
                }
                Some(None) => Ok(want),
            }
        } else {
            (0..max)
                .find(|&i| st.ports[i].is_none() && !st.held_down[i])
                .map(|i| i as u16)
                .ok_or_else(|| format!("hub is full ({max} ports)"))
        };
        let node = match chosen {
            Ok(n) => n,
            Err(reason) => {
                drop(st);
                debug!(%name, "refusing adapter: {reason}");
                w.write_all(&Msg::Refuse { reason: &reason }.encode()).await?;
                w.flush().await?;
                return Ok(());
            }
        };
        let (tx, rx) = mpsc::channel(shared.cfg.queue_depth.max(2));
        let stats = Arc::new(PortStats::default());
        let corrupt = Arc::new(AtomicU32::new(0));
        let kick = Arc::new(Notify::new());
        Shared::announce(&mut st, node, true).await;
        let mut members: Vec<u16> =
            st.ports.iter().enumerate().filter(|(_, p)| p.is_some()).map(|(i, _)| i as u16).collect();
        members.push(node);
        members.sort_unstable();
        let welcome = Msg::Welcome { node, max_nodes: max as u16, next_seq: st.next_seq, members }.encode();
        tx.try_send(Arc::new(welcome)).expect("fresh channel has room");
        st.ports[node as usize] =
            Some(Port { name: name.clone(), tx, stats: stats.clone(), corrupt: corrupt.clone(), kick: kick.clone() });
        (node, rx, stats, corrupt, kick)
    };
    info!(node, %name, "adapter joined");

    let out_stats = stats.clone();
    let writer = tokio::spawn(async move {
        let send = |f: Frame| {
            // Corrupt on purpose: flip one payload bit; the CRC no longer matches.
            if f.len() > HEADER_LEN
                && corrupt.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |c| c.checked_sub(1)).is_ok()
            {
                let mut bad = f.as_ref().clone();
                let last = bad.len() - 1;
                bad[last] ^= 0x01;
                out_stats.corrupted.fetch_add(1, Ordering::Relaxed);
                return Arc::new(bad);
            }
            f
        };
        // Link sequence numbers: the Welcome (first in the queue) is frame 0.
        let mut link_seq: u16 = 0;
        while let Some(f) = rx.recv().await {
            write_stamped(&mut w, &send(f), &mut link_seq).await?;
            while let Ok(f) = rx.try_recv() {
                write_stamped(&mut w, &send(f), &mut link_seq).await?;
            }
            w.flush().await?;
        }
        Ok::<(), std::io::Error>(())
    });

    let result = async {
        // The Hello was the adapter's frame 0.
        let mut expect_seq: u16 = hdr.link_seq.wrapping_add(1);
        loop {
            let hdr = tokio::select! {
                h = read_frame(&mut r, &mut buf) => h?,
                _ = kick.notified() => return Err(std::io::Error::new(std::io::ErrorKind::ConnectionAborted, "link taken down by hub control")),
            };
            let lost = link::check_link_seq(&mut expect_seq, hdr.link_seq);
            if lost != 0 {
                warn!(node, lost, "frames from the adapter went missing (link sequence skipped)");
                stats.link_gaps.fetch_add(lost as u64, Ordering::Relaxed);
            }
            match Msg::parse(&hdr, &buf).map_err(invalid)? {
                Msg::Write { dest, flags, addr, data } => {
                    if dest != BROADCAST && dest as usize >= shared.cfg.max_nodes {
                        // Framing is intact; only this write is bad. Drop and count it.
                        stats.dropped.fetch_add(1, Ordering::Relaxed);
                        debug!(node, dest, "write to a node outside the hub's ports dropped");
                        continue;
                    }
                    stats.writes_in.fetch_add(1, Ordering::Relaxed);
                    stats.bytes_in.fetch_add(data.len() as u64, Ordering::Relaxed);
                    shared.order(node, dest, flags, addr, data).await;
                }
                other => return Err(invalid(format!("unexpected {:?} from an adapter", kind_of(&other)))),
            }
        }
    }
    .await;

    // Leave: free the port and tell everybody.
    {
        let mut st = shared.state.lock().await;
        st.ports[node as usize] = None;
        Shared::announce(&mut st, node, false).await;
    }
    writer.abort();
    match &result {
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => info!(node, %name, "adapter left"),
        Err(e) => warn!(node, %name, "adapter disconnected: {e}"),
        Ok(()) => {}
    }
    result
}

fn kind_of(m: &Msg<'_>) -> Kind {
    match m {
        Msg::Hello { .. } => Kind::Hello,
        Msg::Welcome { .. } => Kind::Welcome,
        Msg::Write { .. } => Kind::Write,
        Msg::Deliver { .. } => Kind::Deliver,
        Msg::Member { .. } => Kind::Member,
        Msg::Refuse { .. } => Kind::Refuse,
    }
}
