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
//! original shared bus. Memory is bounded by `ports × queue_depth × frame`
//! (frames are shared between ports, so usually far less).
//!
//! A receiver whose queue stays full for [`HubConfig::stall_timeout`] is
//! declared failed: its link is closed and its departure announced, exactly
//! like a node that died, and the cluster goes on. So a stuck node can hold
//! the bus for at most that long, never forever.
//!
//! # Node ids
//!
//! An adapter may ask for a node id. One that asks for any id gets the id
//! its name had before (if free), so a restarted guest comes back as the
//! same node; otherwise the lowest free id.
//!
//! # Faults on purpose
//!
//! [`Hub::control`] (the `--control` socket, `mc-hub ctl`) can hold a node's
//! link down (its connection is closed and it cannot rejoin until released),
//! corrupt the next frames sent to a node (its adapter must count CRC errors)
//! and report per-node counters.

use std::collections::HashMap;
use std::future::Future;
use std::io::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{mpsc, Mutex, Notify};
use tracing::{debug, info, info_span, warn, Instrument};

use mc_link::{self as link, Header, Kind, Msg, ANY_NODE, AUTH_LEN, BROADCAST, FLAG_LOOPBACK, HEADER_LEN};

/// How long a new connection may take to send its `Hello`.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// Bytes buffered for a port after which its writer flushes without
/// waiting for more.
const FLUSH_AT: usize = 32 * 1024;
/// Longest control request line accepted.
const MAX_CONTROL_LINE: usize = 4096;

/// Hub settings.
#[derive(Debug, Clone)]
pub struct HubConfig {
    /// Ports (node ids 0..max_nodes). The original hub had 8.
    pub max_nodes: usize,
    /// Frames queued per receiving port before senders are held back.
    pub queue_depth: usize,
    /// How long a full receiver may hold the bus before it is declared failed.
    pub stall_timeout: Duration,
    /// Cluster secret adapters must prove on TCP connections.
    pub secret: Option<Vec<u8>>,
}

impl Default for HubConfig {
    fn default() -> Self {
        HubConfig { max_nodes: 8, queue_depth: 4096, stall_timeout: Duration::from_secs(10), secret: None }
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
    /// Writes from this node dropped (destination outside the ports or not up).
    pub dropped: AtomicU64,
    /// Frames from this node that went missing (link sequence skipped).
    pub link_gaps: AtomicU64,
}

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
    /// Hold every frame to NODE back by MICROS microseconds (0 to stop).
    Delay {
        /// Node id.
        node: u16,
        /// Microseconds.
        micros: u64,
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
    /// Frames from it that went missing (its link sequence skipped).
    pub link_gaps: u64,
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
    },
    /// Refused.
    Error {
        /// Why.
        message: String,
    },
}

type Frame = Arc<Vec<u8>>;

/// What control requests need of a port. Kept apart from the ordering state
/// so that `stats` and `link-down` answer at once even while a full receiver
/// holds the bus.
struct PortCtl {
    name: String,
    tx: mpsc::Sender<Frame>,
    stats: Arc<PortStats>,
    /// Frames still to corrupt on the way out.
    corrupt: AtomicU32,
    /// Wakes the connection's reader to close the link.
    kick: Notify,
    /// Microseconds to hold each frame back (fault injection).
    delay: AtomicU64,
}

struct Port {
    ctl: Arc<PortCtl>,
    /// Cut off (stalled): skip it until its removal is announced.
    failed: AtomicBool,
}

struct State {
    next_seq: u64,
    ports: Vec<Option<Port>>,
    /// Node id each name last had.
    names: HashMap<String, u16>,
}

/// The control view: never held across an await.
struct CtlView {
    ports: Vec<Option<Arc<PortCtl>>>,
    held_down: Vec<bool>,
}

struct Shared {
    cfg: HubConfig,
    state: Mutex<State>,
    ctl: std::sync::Mutex<CtlView>,
    /// Copy of the next sequence number for `stats`.
    seq_hint: AtomicU64,
    rejected: AtomicU64,
    stalled: AtomicU64,
    capture: std::sync::Mutex<Option<Capture>>,
}

/// Writes every ordered frame to a pcap file (link type USER0) from its own
/// thread, so file I/O never holds up the order.
struct Capture {
    tx: std::sync::mpsc::SyncSender<(SystemTime, Frame)>,
}

/// pcap link type for the frames: LINKTYPE_USER0.
pub const PCAP_LINKTYPE: u32 = 147;

impl Capture {
    fn open(path: &Path) -> std::io::Result<Capture> {
        let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
        // pcap global header: magic, v2.4, zone 0, sigfigs 0, snaplen, link type.
        f.write_all(&0xa1b2_c3d4u32.to_le_bytes())?;
        f.write_all(&2u16.to_le_bytes())?;
        f.write_all(&4u16.to_le_bytes())?;
        for v in [0u32, 0, 65535, PCAP_LINKTYPE] {
            f.write_all(&v.to_le_bytes())?;
        }
        f.flush()?;
        let (tx, rx) = std::sync::mpsc::sync_channel::<(SystemTime, Frame)>(65536);
        fn record(f: &mut impl std::io::Write, t: SystemTime, fr: &[u8]) -> std::io::Result<()> {
            let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
            for v in [d.as_secs() as u32, d.subsec_micros(), fr.len() as u32, fr.len() as u32] {
                f.write_all(&v.to_le_bytes())?;
            }
            f.write_all(fr)
        }
        std::thread::Builder::new().name("pcap".into()).spawn(move || {
            while let Ok((t, fr)) = rx.recv() {
                if record(&mut f, t, &fr).is_err() {
                    return;
                }
                while let Ok((t, fr)) = rx.try_recv() {
                    if record(&mut f, t, &fr).is_err() {
                        return;
                    }
                }
                if f.flush().is_err() {
                    return;
                }
            }
        })?;
        Ok(Capture { tx })
    }
}

impl Shared {
    /// Numbers one write and queues it on every port that receives it.
    /// Returns false when the write had nowhere to go (point-to-point to a
    /// node that is not up): it is dropped and takes no place in the order.
    async fn order(&self, src: u16, dest: u16, flags: u16, addr: u64, data: &[u8]) -> bool {
        let mut st = self.state.lock().await;
        if dest != BROADCAST && st.ports.get(dest as usize).is_none_or(Option::is_none) {
            return false;
        }
        let seq = st.next_seq;
        st.next_seq += 1;
        self.seq_hint.store(seq + 1, Ordering::Relaxed);
        let frame: Frame = Arc::new(link::deliver_from_write(seq, src, flags, addr, data));
        debug!(seq, src, dest, addr, len = data.len(), "ordered");
        self.capture(&frame);
        let loopback = flags & FLAG_LOOPBACK != 0;
        for (id, port) in st.ports.iter().enumerate() {
            let Some(port) = port else { continue };
            let id = id as u16;
            let wanted = if id == src { loopback } else { dest == BROADCAST || dest == id };
            if wanted {
                self.queue(id, port, &frame).await;
            }
        }
        true
    }

    /// Queues a frame for one port, waiting for room (the back-pressure), but
    /// no longer than the stall timeout: then the port is cut off as failed.
    async fn queue(&self, id: u16, port: &Port, frame: &Frame) {
        if port.failed.load(Ordering::Relaxed) {
            return;
        }
        port.ctl.stats.frames_out.fetch_add(1, Ordering::Relaxed);
        // Fast path: room in the queue, no timer needed.
        let frame = match port.ctl.tx.try_send(frame.clone()) {
            Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => return,
            Err(mpsc::error::TrySendError::Full(f)) => f,
        };
        match tokio::time::timeout(self.cfg.stall_timeout, port.ctl.tx.send(frame)).await {
            // A closed channel means the node is leaving; its removal announces it.
            Ok(_) => {}
            Err(_) => {
                warn!(node = id, timeout = ?self.cfg.stall_timeout, "receiver stalled with a full queue: cutting it off");
                port.failed.store(true, Ordering::Relaxed);
                self.stalled.fetch_add(1, Ordering::Relaxed);
                port.ctl.kick.notify_one();
            }
        }
    }

    fn capture(&self, frame: &Frame) {
        if let Some(c) = self.capture.lock().unwrap().as_ref() {
            // A full capture queue drops the record rather than slow the order.
            let _ = c.tx.try_send((SystemTime::now(), frame.clone()));
        }
    }

    /// Announces a membership change to every port except `node` itself,
    /// in the global order (waiting for queue room like a write does).
    async fn announce(&self, st: &mut State, node: u16, up: bool) {
        let seq = st.next_seq;
        st.next_seq += 1;
        self.seq_hint.store(seq + 1, Ordering::Relaxed);
        let frame: Frame = Arc::new(Msg::Member { seq, node, up }.encode());
        self.capture(&frame);
        for (id, port) in st.ports.iter().enumerate() {
            if let Some(port) = port {
                if id as u16 != node {
                    self.queue(id as u16, port, &frame).await;
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
        let state = State { next_seq: 0, ports: (0..cfg.max_nodes).map(|_| None).collect(), names: HashMap::new() };
        let ctl = CtlView { ports: vec![None; cfg.max_nodes], held_down: vec![false; cfg.max_nodes] };
        Hub {
            shared: Arc::new(Shared {
                state: Mutex::new(state),
                ctl: std::sync::Mutex::new(ctl),
                seq_hint: AtomicU64::new(0),
                cfg,
                rejected: AtomicU64::new(0),
                stalled: AtomicU64::new(0),
                capture: std::sync::Mutex::new(None),
            }),
        }
    }

    /// Writes every ordered frame (deliveries and membership events) to a
    /// pcap file from now on; see `docs/hub.md` for reading it.
    pub fn capture_to(&self, path: &Path) -> std::io::Result<()> {
        *self.shared.capture.lock().unwrap() = Some(Capture::open(path)?);
        Ok(())
    }

    /// Accepts adapters over TCP until `shutdown` completes. Every connection
    /// must prove the cluster secret ([`HubConfig::secret`], required).
    pub async fn serve_tcp(&self, listener: TcpListener, shutdown: impl Future<Output = ()>) -> std::io::Result<()> {
        if self.shared.cfg.secret.as_ref().is_none_or(|s| s.is_empty()) {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "a TCP hub needs a cluster secret"));
        }
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => return Ok(()),
                acc = listener.accept() => {
                    let (stream, peer) = match acc {
                        Ok(x) => x,
                        Err(e) => {
                            warn!("accept failed: {e}");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                    };
                    let _ = stream.set_nodelay(true);
                    let shared = self.shared.clone();
                    tokio::spawn(async move {
                        let (r, w) = stream.into_split();
                        let nonce = random_nonce();
                        if let Err(e) = handle(shared, r, w, Some(nonce)).instrument(info_span!("tcp", %peer)).await {
                            debug!("link closed: {e}");
                        }
                    });
                }
            }
        }
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
                        if let Err(e) = handle(shared, r, w, None).await {
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
        let connected = |ctl: &CtlView, n: u16| -> Result<Arc<PortCtl>, ControlReply> {
            let i = node_of(n)?;
            ctl.ports[i].clone().ok_or_else(|| ControlReply::Error { message: format!("node {n} is not connected") })
        };
        match c {
            Control::Stats => ControlReply::Stats {
                next_seq: self.shared.seq_hint.load(Ordering::Relaxed),
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
                        queued: p.tx.max_capacity() - p.tx.capacity(),
                        corrupted: p.stats.corrupted.load(Ordering::Relaxed),
                        dropped: p.stats.dropped.load(Ordering::Relaxed),
                        link_gaps: p.stats.link_gaps.load(Ordering::Relaxed),
                    })
                    .collect(),
                held_down: ctl.held_down.iter().enumerate().filter(|(_, h)| **h).map(|(i, _)| i as u16).collect(),
                rejected: self.shared.rejected.load(Ordering::Relaxed),
                stalled: self.shared.stalled.load(Ordering::Relaxed),
            },
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
                    p.corrupt.fetch_add(count, Ordering::SeqCst);
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
                    info!(node, "link held down by control");
                    ControlReply::Ok
                }
            },
            Control::LinkUp { node } => match node_of(node) {
                Err(e) => e,
                Ok(i) => {
                    ctl.held_down[i] = false;
                    info!(node, "link released by control");
                    ControlReply::Ok
                }
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

/// 32 bytes from the kernel's random source for an authentication challenge.
fn random_nonce() -> [u8; AUTH_LEN] {
    let mut n = [0u8; AUTH_LEN];
    let mut f = std::fs::File::open("/dev/urandom").expect("/dev/urandom");
    std::io::Read::read_exact(&mut f, &mut n).expect("reading /dev/urandom");
    n
}

async fn refuse<W: AsyncWrite + Unpin>(shared: &Shared, w: &mut W, reason: &str) -> std::io::Result<()> {
    shared.rejected.fetch_add(1, Ordering::Relaxed);
    warn!("refusing peer: {reason}");
    w.write_all(&Msg::Refuse { reason }.encode()).await?;
    w.flush().await
}

async fn handle<R, W>(shared: Arc<Shared>, r: R, w: W, challenge: Option<[u8; AUTH_LEN]>) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let mut w = BufWriter::with_capacity(64 * 1024, w);
    // Frames are read through a buffer: one read(2) per batch, not two per frame.
    let mut r = tokio::io::BufReader::with_capacity(64 * 1024, r);
    let mut buf = Vec::new();
    // Our link frames: the challenge (if any) is frame 0.
    let mut first_link_seq: u16 = 0;
    if let Some(nonce) = challenge {
        w.write_all(&Msg::Challenge { nonce }.encode()).await?;
        w.flush().await?;
        first_link_seq = 1;
    }
    let hdr = match tokio::time::timeout(HELLO_TIMEOUT, read_frame(&mut r, &mut buf)).await {
        Ok(Ok(h)) => h,
        Ok(Err(e)) => {
            shared.rejected.fetch_add(1, Ordering::Relaxed);
            warn!("garbage from new peer ({e}); closing");
            return Ok(());
        }
        Err(_) => {
            shared.rejected.fetch_add(1, Ordering::Relaxed);
            warn!("peer sent no Hello within {HELLO_TIMEOUT:?}; closing");
            return Ok(());
        }
    };
    let (want, name, auth) = match Msg::parse(&hdr, &buf) {
        Ok(Msg::Hello { want_node, name, auth, .. }) => (want_node, name.to_string(), auth),
        Ok(other) => {
            shared.rejected.fetch_add(1, Ordering::Relaxed);
            warn!("peer opened with {:?} instead of Hello; closing", kind_of(&other));
            return Ok(());
        }
        Err(e) => {
            shared.rejected.fetch_add(1, Ordering::Relaxed);
            warn!("garbage from new peer ({e}); closing");
            return Ok(());
        }
    };
    if let Some(nonce) = challenge {
        let secret = shared.cfg.secret.as_deref().unwrap_or_default();
        let ok = auth.is_some_and(|tag| link::auth_ok(secret, &nonce, &tag));
        if !ok {
            let why = if auth.is_none() { "no cluster secret presented" } else { "wrong cluster secret" };
            return refuse(&shared, &mut w, &format!("authentication failed for '{name}': {why}")).await;
        }
    }

    // Join: choose a port, send Welcome, announce to the others.
    let (node, mut rx, port) = {
        let mut st = shared.state.lock().await;
        let held_down = shared.ctl.lock().unwrap().held_down.clone();
        let max = shared.cfg.max_nodes;
        let chosen = if want != ANY_NODE {
            match st.ports.get(want as usize) {
                None => Err(format!("node id {want} is outside this hub's {max} ports")),
                Some(Some(p)) => Err(format!("node id {want} is already taken by '{}'", p.ctl.name)),
                Some(None) if held_down[want as usize] => Err(format!("link of node {want} is held down by the hub")),
                Some(None) => Ok(want),
            }
        } else {
            let sticky =
                st.names.get(&name).copied().filter(|&i| st.ports[i as usize].is_none() && !held_down[i as usize]);
            sticky
                .or_else(|| (0..max).find(|&i| st.ports[i].is_none() && !held_down[i]).map(|i| i as u16))
                .ok_or_else(|| format!("hub is full ({max} ports)"))
        };
        let node = match chosen {
            Ok(n) => n,
            Err(reason) => {
                drop(st);
                return refuse(&shared, &mut w, &reason).await;
            }
        };
        if !name.is_empty() {
            st.names.insert(name.clone(), node);
        }
        let (tx, rx) = mpsc::channel(shared.cfg.queue_depth.max(2));
        let ctl = Arc::new(PortCtl {
            name: name.clone(),
            tx: tx.clone(),
            stats: Arc::new(PortStats::default()),
            corrupt: AtomicU32::new(0),
            kick: Notify::new(),
            delay: AtomicU64::new(0),
        });
        shared.announce(&mut st, node, true).await;
        let mut members: Vec<u16> =
            st.ports.iter().enumerate().filter(|(_, p)| p.is_some()).map(|(i, _)| i as u16).collect();
        members.push(node);
        members.sort_unstable();
        let welcome = Msg::Welcome { node, max_nodes: max as u16, next_seq: st.next_seq, members }.encode();
        tx.try_send(Arc::new(welcome)).expect("fresh channel has room");
        drop(tx);
        st.ports[node as usize] = Some(Port { ctl: ctl.clone(), failed: AtomicBool::new(false) });
        shared.ctl.lock().unwrap().ports[node as usize] = Some(ctl.clone());
        (node, rx, ctl)
    };
    let stats = port.stats.clone();
    let out_port = port.clone();
    let span = info_span!("node", node, %name);
    info!(parent: &span, "adapter joined");

    let out_stats = stats.clone();
    let writer = tokio::spawn(
        async move {
            let send = |f: Frame| {
                // Corrupt on purpose: flip one payload bit; the CRC no longer matches.
                if f.len() > HEADER_LEN
                    && out_port.corrupt.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |c| c.checked_sub(1)).is_ok()
                {
                    let mut bad = f.as_ref().clone();
                    let last = bad.len() - 1;
                    bad[last] ^= 0x01;
                    out_stats.corrupted.fetch_add(1, Ordering::Relaxed);
                    return Arc::new(bad);
                }
                f
            };
            // Link sequence numbers continue after the challenge, if one was sent.
            let mut link_seq: u16 = first_link_seq;
            while let Some(f) = rx.recv().await {
                let d = out_port.delay.load(Ordering::Relaxed);
                if d > 0 {
                    tokio::time::sleep(Duration::from_micros(d)).await;
                }
                write_stamped(&mut w, &send(f), &mut link_seq).await?;
                // Gather what is queued; give the ordering step one chance to
                // add more before the write(2): under load this turns a
                // syscall per frame into one per batch.
                let mut yielded = false;
                loop {
                    while let Ok(f) = rx.try_recv() {
                        write_stamped(&mut w, &send(f), &mut link_seq).await?;
                    }
                    if yielded || w.buffer().len() >= FLUSH_AT {
                        break;
                    }
                    yielded = true;
                    tokio::task::yield_now().await;
                }
                w.flush().await?;
            }
            Ok::<(), std::io::Error>(())
        }
        .instrument(span.clone()),
    );

    let result = async {
        // The Hello was the adapter's frame 0.
        let mut expect_seq: u16 = hdr.link_seq.wrapping_add(1);
        loop {
            let hdr = tokio::select! {
                h = read_frame(&mut r, &mut buf) => h?,
                _ = port.kick.notified() => return Err(std::io::Error::new(std::io::ErrorKind::ConnectionAborted, "link taken down by hub control")),
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
                    if !shared.order(node, dest, flags, addr, data).await {
                        stats.dropped.fetch_add(1, Ordering::Relaxed);
                        debug!(node, dest, "write to a node that is not up dropped");
                    }
                }
                other => return Err(invalid(format!("unexpected {:?} from an adapter", kind_of(&other)))),
            }
        }
    }
    .instrument(span.clone())
    .await;

    // Leave: free the port and tell everybody.
    {
        let mut st = shared.state.lock().await;
        st.ports[node as usize] = None;
        shared.ctl.lock().unwrap().ports[node as usize] = None;
        shared.announce(&mut st, node, false).await;
    }
    let _enter = span.enter();
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
        Msg::Challenge { .. } => Kind::Challenge,
    }
}
