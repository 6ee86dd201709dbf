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

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::net::UnixListener;
use tokio::sync::{mpsc, Mutex};
use tracing::{debug, info, warn};

use crate::link::{self, Header, Kind, Msg, ANY_NODE, BROADCAST, FLAG_LOOPBACK, HEADER_LEN};

/// How long a new connection may take to send its `Hello`.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

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

/// Counters kept for every port (`mc-hub stats` reads them in a later version).
#[derive(Debug, Default)]
pub struct PortStats {
    /// Writes received from this node.
    pub writes_in: AtomicU64,
    /// Frames queued for delivery to this node.
    pub frames_out: AtomicU64,
}

type Frame = Arc<Vec<u8>>;

struct Port {
    name: String,
    tx: mpsc::Sender<Frame>,
    stats: Arc<PortStats>,
}

struct State {
    next_seq: u64,
    ports: Vec<Option<Port>>,
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

    /// Announces a membership change to every port except `node` itself.
    fn announce(st: &mut State, node: u16, up: bool) {
        let seq = st.next_seq;
        st.next_seq += 1;
        let frame: Frame = Arc::new(Msg::Member { seq, node, up }.encode());
        for (id, port) in st.ports.iter().enumerate() {
            if let Some(port) = port {
                if id as u16 != node && port.tx.try_send(frame.clone()).is_err() {
                    warn!(node = id, "membership event dropped: queue full");
                }
            }
        }
    }
}

/// Runs the hub on `listener` until `shutdown` completes.
pub async fn serve(listener: UnixListener, cfg: HubConfig, shutdown: impl Future<Output = ()>) -> std::io::Result<()> {
    let shared = Arc::new(Shared {
        state: Mutex::new(State { next_seq: 0, ports: (0..cfg.max_nodes).map(|_| None).collect() }),
        cfg,
    });
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => {
                info!("hub shutting down");
                return Ok(());
            }
            acc = listener.accept() => {
                let (stream, _) = acc?;
                let shared = shared.clone();
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
    let (node, mut rx, stats) = {
        let mut st = shared.state.lock().await;
        let max = shared.cfg.max_nodes;
        let chosen = if want != ANY_NODE {
            match st.ports.get(want as usize) {
                None => Err(format!("node id {want} is outside this hub's {max} ports")),
                Some(Some(p)) => Err(format!("node id {want} is already taken by '{}'", p.name)),
                Some(None) => Ok(want),
            }
        } else {
            st.ports
                .iter()
                .position(|p| p.is_none())
                .map(|i| i as u16)
                .ok_or_else(|| format!("hub is full ({max} ports)"))
        };
        let node = match chosen {
            Ok(n) => n,
            Err(reason) => {
                drop(st);
                warn!(%name, "refusing adapter: {reason}");
                w.write_all(&Msg::Refuse { reason: &reason }.encode()).await?;
                w.flush().await?;
                return Ok(());
            }
        };
        let (tx, rx) = mpsc::channel(shared.cfg.queue_depth.max(2));
        let stats = Arc::new(PortStats::default());
        Shared::announce(&mut st, node, true);
        let mut members: Vec<u16> =
            st.ports.iter().enumerate().filter(|(_, p)| p.is_some()).map(|(i, _)| i as u16).collect();
        members.push(node);
        members.sort_unstable();
        let welcome = Msg::Welcome { node, max_nodes: max as u16, next_seq: st.next_seq, members }.encode();
        tx.try_send(Arc::new(welcome)).expect("fresh channel has room");
        st.ports[node as usize] = Some(Port { name: name.clone(), tx, stats: stats.clone() });
        (node, rx, stats)
    };
    info!(node, %name, "adapter joined");

    let writer = tokio::spawn(async move {
        while let Some(f) = rx.recv().await {
            w.write_all(&f).await?;
            while let Ok(f) = rx.try_recv() {
                w.write_all(&f).await?;
            }
            w.flush().await?;
        }
        Ok::<(), std::io::Error>(())
    });

    let result = async {
        loop {
            let hdr = read_frame(&mut r, &mut buf).await?;
            match Msg::parse(&hdr, &buf).map_err(invalid)? {
                Msg::Write { dest, flags, addr, data } => {
                    if dest != BROADCAST && dest as usize >= shared.cfg.max_nodes {
                        return Err(invalid(format!("write to node {dest} outside the hub's ports")));
                    }
                    stats.writes_in.fetch_add(1, Ordering::Relaxed);
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
        Shared::announce(&mut st, node, false);
    }
    writer.abort();
    match &result {
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            info!(node, %name, "adapter left")
        }
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
