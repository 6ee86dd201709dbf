//! Link ports: remote `mc-adapter` processes over a Unix socket or TCP,
//! speaking the link protocol of crate `link`.
//!
//! [`Hub::serve`] and [`Hub::serve_tcp`] accept them. Each connection has
//! two tokio tasks: a reader (the greeting: challenge,
//! `Hello` and its proof, within the authentication deadline and without
//! buffers; then the adapter's writes into the order) and a writer (the port's queue
//! out to the socket, batched, with link sequence numbers stamped on the way
//! and faults on purpose applied: corruption, delay).
//!
//! A live link (the adapter's `Hello` asked for it: `link` crate,
//! "Liveness") gets an `Idle` frame from the writer whenever the port's
//! queue has been empty for `IDLE_EVERY_MS`, and the reader closes it once
//! the adapter has sent nothing for `DEAD_AFTER_MS`: the node's departure
//! is announced as for any link that drops.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use device::uplink::WritePacket;
use link::{self as link, Header, Kind, Msg, ANY_NODE, AUTH_LEN, BROADCAST, HEADER_LEN};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::mpsc;
use tracing::{debug, info, info_span, warn, Instrument};

use crate::bounds::{accept_failed, closed_at_door, Slot};
use crate::hub::{Hub, Shared};
use crate::order::{Port, PortKind};
use crate::port::{Frame, PortCtl, MEMBER_ROOM};

/// Bytes buffered for a port after which its writer flushes without
/// waiting for more.
const FLUSH_AT: usize = 32 * 1024;

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

async fn refuse<W: AsyncWrite + Unpin>(shared: &Shared, w: &mut W, reason: &str) -> std::io::Result<()> {
    shared.rejected.fetch_add(1, Ordering::Relaxed);
    warn!("refusing peer: {reason}");
    w.write_all(&Msg::Refuse { reason }.encode()).await?;
    w.flush().await
}

/// What a new connection said before it was trusted.
struct Greeting {
    /// Its `Hello` frame's header.
    hdr: Header,
    want: u16,
    name: String,
    /// The adapter asked for a live link.
    keepalive: bool,
}

/// The untrusted start of a connection: the challenge out (TCP), the
/// `Hello` in and its proof checked. Reads and writes the socket directly:
/// no buffer is allocated for a peer that has not proved itself, and a
/// frame that is not a `Hello` of the right size is refused before its
/// payload is read. `Ok(None)`: refused (logged and counted).
async fn greet<R, W>(
    shared: &Shared,
    r: &mut R,
    w: &mut W,
    challenge: Option<[u8; AUTH_LEN]>,
) -> std::io::Result<Option<Greeting>>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    if let Some(nonce) = challenge {
        w.write_all(&Msg::Challenge { nonce }.encode()).await?;
        w.flush().await?;
    }
    let mut h = [0u8; HEADER_LEN];
    let mut buf = Vec::new();
    let read = async {
        r.read_exact(&mut h).await?;
        let hdr = Header::parse(&h).map_err(invalid)?;
        if hdr.kind != Kind::Hello || hdr.len > link::MAX_HELLO {
            return Err(invalid(format!("a {} frame of {} bytes", hdr.kind.name(), hdr.len)));
        }
        buf.resize(hdr.len, 0);
        r.read_exact(&mut buf).await?;
        Ok(hdr)
    };
    let hdr = match read.await {
        Ok(h) => h,
        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
            shared.rejected.fetch_add(1, Ordering::Relaxed);
            warn!("garbage from new peer ({e}); closing");
            return Ok(None);
        }
        // Gone before its Hello (closed, reset): counted, not worth a
        // warning each, since a flood of these would flood the log.
        Err(e) => return Err(e),
    };
    let (want, name, auth, keepalive) = match Msg::parse(&hdr, &buf) {
        Ok(Msg::Hello { want_node, name, auth, keepalive, .. }) => (want_node, name.to_string(), auth, keepalive),
        Ok(other) => {
            shared.rejected.fetch_add(1, Ordering::Relaxed);
            warn!("peer opened with {:?} instead of Hello; closing", kind_of(&other));
            return Ok(None);
        }
        Err(e) => {
            shared.rejected.fetch_add(1, Ordering::Relaxed);
            warn!("garbage from new peer ({e}); closing");
            return Ok(None);
        }
    };
    if let Some(nonce) = challenge {
        let secret = shared.cfg.secret.as_deref().unwrap_or_default();
        let ok = auth.is_some_and(|tag| link::auth_ok(secret, &nonce, &tag));
        if !ok {
            let why = if auth.is_none() { "no cluster secret presented" } else { "wrong cluster secret" };
            refuse(shared, w, &format!("authentication failed for '{name}': {why}")).await?;
            return Ok(None);
        }
    }
    Ok(Some(Greeting { hdr, want, name, keepalive }))
}

/// Serves one link port connection: authentication, join, then the
/// adapter's writes into the order and the ordered frames back out, until the
/// link drops; then the node's departure is announced.
///
/// `slot` is the connection's place among those not trusted yet: given back
/// once the `Hello` is in (or the connection closes). The whole greeting
/// must be done within [`HubConfig::auth_timeout`](crate::hub::HubConfig).
pub(crate) async fn handle<R, W>(
    shared: Arc<Shared>,
    mut r: R,
    mut w: W,
    challenge: Option<[u8; AUTH_LEN]>,
    slot: Slot,
) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let deadline = shared.cfg.auth_timeout;
    let greeting = match tokio::time::timeout(deadline, greet(&shared, &mut r, &mut w, challenge)).await {
        Ok(Ok(Some(g))) => g,
        Ok(Ok(None)) => return Ok(()),
        Ok(Err(e)) => {
            shared.rejected.fetch_add(1, Ordering::Relaxed);
            debug!("new peer went away: {e}");
            return Ok(());
        }
        Err(_) => {
            shared.rejected.fetch_add(1, Ordering::Relaxed);
            shared.auth_timeouts.fetch_add(1, Ordering::Relaxed);
            warn!("peer sent no Hello within {deadline:?}; closing");
            return Ok(());
        }
    };
    drop(slot);
    let Greeting { hdr, want, name, keepalive } = greeting;
    let idle_every = std::time::Duration::from_millis(link::IDLE_EVERY_MS);
    let dead_after = std::time::Duration::from_millis(link::DEAD_AFTER_MS);
    // Our link frames: the challenge (if any) was frame 0.
    let first_link_seq: u16 = if challenge.is_some() { 1 } else { 0 };
    // Trusted from here on: buffers for the data path.
    let mut w = BufWriter::with_capacity(64 * 1024, w);
    // Frames are read through a buffer: one read(2) per batch, not two per frame.
    let mut r = tokio::io::BufReader::with_capacity(64 * 1024, r);
    let mut buf = Vec::new();

    // Join: choose a port, send Welcome, announce to the others.
    let (node, mut rx, port) = match join_link(&shared, want, &name) {
        Ok(j) => j,
        Err(reason) => return refuse(&shared, &mut w, &reason.to_string()).await,
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
                if f.len() > HEADER_LEN && out_port.take_corrupt() {
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
            let idle = Arc::new(Msg::Idle.encode());
            loop {
                let f = if keepalive {
                    match tokio::time::timeout(idle_every, rx.recv()).await {
                        Ok(f) => f,
                        // Nothing to send for a while: the adapter hears the link lives.
                        Err(_) => Some(idle.clone()),
                    }
                } else {
                    rx.recv().await
                };
                let Some(f) = f else { break };
                // Held back while a delay is set; a shorter (or no) delay set
                // meanwhile takes effect at once.
                let held = std::time::Instant::now();
                while let Some(left) = out_port.hold_left(held) {
                    tokio::time::sleep(left).await;
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
                out_port.room.notify_waiters();
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
            let read = async {
                if !keepalive {
                    return read_frame(&mut r, &mut buf).await;
                }
                match tokio::time::timeout(dead_after, read_frame(&mut r, &mut buf)).await {
                    Ok(h) => h,
                    Err(_) => Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("nothing from the adapter for {} ms: link taken for dead", link::DEAD_AFTER_MS),
                    )),
                }
            };
            let hdr = tokio::select! {
                h = read => h?,
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
                    if !shared.order.write(node, &WritePacket { dest, flags, addr, data }).await {
                        stats.dropped.fetch_add(1, Ordering::Relaxed);
                        debug!(node, dest, "write to a node that is not up dropped");
                    }
                }
                Msg::Idle => {}
                other => return Err(invalid(format!("unexpected {:?} from an adapter", kind_of(&other)))),
            }
        }
    }
    .instrument(span.clone())
    .await;

    // Leave: free the port and tell everybody.
    {
        let mut st = shared.order.state.lock().unwrap();
        st.ports[node as usize] = None;
        shared.ctl.lock().unwrap().ports[node as usize] = None;
        shared.order.announce(&mut st, node, false);
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

impl Hub {
    /// Accepts adapters over TCP until `shutdown` completes. Every connection
    /// must prove the cluster secret ([`HubConfig::secret`], required).
    pub async fn serve_tcp(&self, listener: TcpListener, shutdown: impl Future<Output = ()>) -> std::io::Result<()> {
        if self.shared.cfg.secret.as_ref().is_none_or(|s| s.is_empty()) {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "a TCP hub needs a cluster secret"));
        }
        // Opened now, while descriptors are surely free; kept for good.
        self.shared.nonces.nonce()?;
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => return Ok(()),
                acc = listener.accept() => {
                    let (stream, peer) = match acc {
                        Ok(x) => x,
                        Err(e) => {
                            accept_failed("TCP", &e).await;
                            continue;
                        }
                    };
                    let Some(slot) = self.shared.unauthenticated.enter() else {
                        closed_at_door("TCP", &self.shared.unauthenticated);
                        continue;
                    };
                    let _ = stream.set_nodelay(true);
                    let shared = self.shared.clone();
                    tokio::spawn(async move {
                        let nonce = match shared.nonces.nonce() {
                            Ok(n) => n,
                            Err(e) => {
                                shared.rejected.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                warn!(%peer, "connection closed: no challenge for it: {e}");
                                return;
                            }
                        };
                        let (r, w) = stream.into_split();
                        if let Err(e) = handle(shared, r, w, Some(nonce), slot).instrument(info_span!("tcp", %peer)).await {
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
                            accept_failed("link", &e).await;
                            continue;
                        }
                    };
                    let Some(slot) = self.shared.unauthenticated.enter() else {
                        closed_at_door("link", &self.shared.unauthenticated);
                        continue;
                    };
                    let shared = self.shared.clone();
                    tokio::spawn(async move {
                        let (r, w) = stream.into_split();
                        if let Err(e) = handle(shared, r, w, None, slot).await {
                            debug!("link closed: {e}");
                        }
                    });
                }
            }
        }
    }
}

/// Why the hub refused an adapter a port (sent to it in `Refuse`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JoinError {
    /// The node id asked for is past the hub's ports.
    #[error("node id {want} is outside this hub's {max} ports")]
    Outside {
        /// The node id asked for.
        want: u16,
        /// The hub's ports.
        max: usize,
    },
    /// Another adapter holds the node id asked for.
    #[error("node id {want} is already taken by '{by}'")]
    Taken {
        /// The node id asked for.
        want: u16,
        /// The name of the adapter that holds it.
        by: String,
    },
    /// The hub holds that node's link down (`link-down`).
    #[error("link of node {want} is held down by the hub")]
    HeldDown {
        /// The node id asked for.
        want: u16,
    },
    /// The node id is one of the hub's local ports.
    #[error("node id {want} is a local port of this hub")]
    Local {
        /// The node id asked for.
        want: u16,
    },
    /// No port is free.
    #[error("hub is full ({max} ports)")]
    Full {
        /// The hub's ports.
        max: usize,
    },
}

/// Chooses a node id for a link port, announces it and queues its `Welcome`.
fn join_link(shared: &Shared, want: u16, name: &str) -> Result<(u16, mpsc::Receiver<Frame>, Arc<PortCtl>), JoinError> {
    let mut guard = shared.order.state.lock().unwrap();
    let st = &mut *guard;
    let (held_down, local) = {
        let c = shared.ctl.lock().unwrap();
        (c.held_down.clone(), c.local.iter().map(Option::is_some).collect::<Vec<bool>>())
    };
    let max = shared.cfg.max_nodes;
    let node = if want != ANY_NODE {
        match st.ports.get(want as usize) {
            None => return Err(JoinError::Outside { want, max }),
            Some(Some(p)) => return Err(JoinError::Taken { want, by: p.ctl.name.clone() }),
            Some(None) if held_down[want as usize] => return Err(JoinError::HeldDown { want }),
            Some(None) if local[want as usize] => return Err(JoinError::Local { want }),
            Some(None) => want,
        }
    } else {
        let free = |i: usize| st.ports[i].is_none() && !held_down[i] && !local[i];
        let sticky = st.names.get(name).copied().filter(|&i| free(i as usize));
        sticky.or_else(|| (0..max).find(|&i| free(i)).map(|i| i as u16)).ok_or(JoinError::Full { max })?
    };
    st.remember_name(name, node);
    let (tx, rx) = mpsc::channel(shared.cfg.queue_depth.max(2) + MEMBER_ROOM);
    let ctl = Arc::new(PortCtl::new(name, Some(tx.clone())));
    shared.order.announce(st, node, true);
    let members = st.members(node);
    let welcome = Msg::Welcome { node, max_nodes: max as u16, next_seq: st.next_seq, members }.encode();
    tx.try_send(Arc::new(welcome)).expect("fresh channel has room");
    st.ports[node as usize] = Some(Port { ctl: ctl.clone(), kind: PortKind::Link(tx), failed: AtomicBool::new(false) });
    shared.ctl.lock().unwrap().ports[node as usize] = Some(ctl.clone());
    Ok((node, rx, ctl))
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
        Msg::Idle => Kind::Idle,
    }
}
