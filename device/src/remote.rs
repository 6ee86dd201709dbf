//! A link port: the adapter's cable to a hub in another process (Unix socket
//! or TCP, the link protocol of crate `link`).
//!
//! Three threads touch a link:
//! - the adapter's vfio-user thread queues write packets ([`Uplink::send`])
//!   and waits when the queue is full: back-pressure reaches the guest;
//! - the writer thread (`mc-link-tx`) is the only one that writes the
//!   socket: it takes everything queued, stamps the link sequence numbers
//!   and writes it with one flush;
//! - the receive thread (`mc-rx`) applies ordered deliveries to guest memory,
//!   queues ACK answers without ever waiting for room, and rejoins the hub
//!   after a link loss.
//!
//! A link joined by [`RemoteLink::connect`] is live (`link` crate,
//! "Liveness"): the writer sends an `Idle` frame when it has sent nothing
//! for `IDLE_EVERY_MS`, and the receive thread takes a hub it has heard
//! nothing from for `DEAD_AFTER_MS` for gone (a partition, which TCP alone
//! would hide): the link goes down and it rejoins. A write blocked that long
//! fails the same way.
//!
//! # Lock order
//!
//! There is one lock, [`Queue`]'s mutex, and nobody does I/O or waits for
//! another thread while holding it (condition-variable waits release it).
//! The receive thread never waits for the writer or the vfio-user thread, so
//! it always drains the hub. Earlier the vfio-user thread held the link's
//! mutex while a socket write blocked under the hub's back-pressure, and an
//! ACK answer made the receive thread wait for that mutex: the hub waited
//! for the receive thread to drain, the receive thread for the vfio-user
//! thread, the vfio-user thread for the hub — a cycle only the hub's stall
//! timeout broke.

use std::collections::VecDeque;
use std::io::{self, BufReader, BufWriter, Write};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use link::{self as link, LinkError, Msg, MAX_DATA};
use tracing::{debug, info, warn};

use crate::adapter::{Adapter, AdapterConfig, Shared};
use crate::link_client::{self, Joined, Stream};
use crate::regs::{err, PAGE_SIZE};
use crate::uplink::{LinkInfo, Uplink, UplinkError, WritePacket};

/// Pause between attempts to rejoin the hub after the link went down.
pub const RECONNECT_INTERVAL: Duration = Duration::from_millis(200);
/// Bytes of frames queued before the vfio-user thread waits for the writer:
/// bounds the memory a guest can fill while the hub holds it back.
pub const QUEUE_LIMIT: usize = 256 * 1024;
/// Bytes queued after which the writer is woken without waiting for the
/// adapter to go idle (a long store stream still goes out in big writes).
pub const WAKE_AT: usize = 32 * 1024;

/// Frames waiting for the writer, and the socket's writing half.
struct Queue {
    frames: VecDeque<Vec<u8>>,
    bytes: usize,
    /// Set by a flush or a full batch: the writer should write now.
    kick: bool,
    /// The writing half and its next link sequence number (None while down,
    /// or while the writer is using it).
    stream: Option<(BufWriter<Stream>, u16)>,
    /// Counts link installs, so a writer does not put back a stale stream.
    epoch: u64,
    up: bool,
}

struct Inner {
    shared: Arc<Shared>,
    /// A live link: `Idle` frames out, silence in taken for a dead link.
    live: bool,
    q: Mutex<Queue>,
    /// Signalled when the writer has taken frames (room) or the link went down.
    room: Condvar,
    /// Signalled when the writer has work.
    work: Condvar,
}

/// The adapter's link to a hub in another process.
pub struct RemoteLink {
    inner: Arc<Inner>,
}

impl Inner {
    fn push(&self, frame: Vec<u8>, wait_for_room: bool) -> Result<(), UplinkError> {
        let mut q = self.q.lock().unwrap();
        if wait_for_room {
            while q.up && q.bytes >= QUEUE_LIMIT {
                q.kick = true;
                self.work.notify_one();
                q = self.room.wait(q).unwrap();
            }
        }
        if !q.up {
            return Err(UplinkError::Down);
        }
        q.bytes += frame.len();
        q.frames.push_back(frame);
        if q.bytes >= WAKE_AT || !wait_for_room {
            q.kick = true;
            self.work.notify_one();
        }
        Ok(())
    }

    /// Takes a joined link into use (first join or rejoin).
    fn install(&self, joined: &Joined, writer: BufWriter<Stream>) {
        if self.live {
            // A write the hub does not take for this long fails: the
            // writer gives the stream up and the receive thread rejoins.
            let _ = writer.get_ref().set_write_timeout(Some(dead_after()));
        }
        {
            let mut q = self.q.lock().unwrap();
            q.frames.clear();
            q.bytes = 0;
            // Our Hello was link frame 0.
            q.stream = Some((writer, 1));
            q.epoch += 1;
            q.up = true;
        }
        self.shared.link_up(&LinkInfo {
            node: joined.node,
            max_nodes: joined.max_nodes,
            members: joined.members.clone(),
            next_seq: joined.next_seq,
        });
    }

    fn down(&self, reason: &str) {
        {
            let mut q = self.q.lock().unwrap();
            q.up = false;
            q.stream = None;
            q.frames.clear();
            q.bytes = 0;
        }
        self.room.notify_all();
        self.shared.link_down(reason);
    }

    /// The writer thread: the only writer of the socket.
    fn writer(self: Arc<Self>) {
        let mut batch: VecDeque<Vec<u8>> = VecDeque::new();
        let idle_every = Duration::from_millis(link::IDLE_EVERY_MS);
        let idle = Msg::Idle.encode();
        let mut last_sent = Instant::now();
        loop {
            let (mut stream, epoch) = {
                let mut q = self.q.lock().unwrap();
                loop {
                    if q.kick && q.stream.is_some() && !q.frames.is_empty() {
                        break;
                    }
                    if self.live && q.stream.is_some() && last_sent.elapsed() >= idle_every {
                        // Nothing sent for a while: tell the hub the link lives.
                        q.frames.push_back(idle.clone());
                        break;
                    }
                    if Arc::strong_count(&self) == 1 {
                        return;
                    }
                    let wait = if self.live && q.stream.is_some() {
                        idle_every.saturating_sub(last_sent.elapsed()).max(Duration::from_millis(1))
                    } else {
                        Duration::from_millis(500)
                    };
                    q = self.work.wait_timeout(q, wait).unwrap().0;
                }
                q.kick = false;
                std::mem::swap(&mut batch, &mut q.frames);
                q.bytes = 0;
                (q.stream.take().expect("checked above"), q.epoch)
            };
            self.room.notify_all();
            let (w, seq) = &mut stream;
            let mut result = Ok(());
            for f in batch.drain(..) {
                result = link::write_stamped(w, &f, *seq);
                *seq = seq.wrapping_add(1);
                if result.is_err() {
                    break;
                }
            }
            let result = result.and_then(|_| w.flush());
            batch.clear();
            match result {
                Ok(()) => {
                    last_sent = Instant::now();
                    let mut q = self.q.lock().unwrap();
                    if q.epoch == epoch && q.up {
                        q.stream = Some(stream);
                    }
                }
                Err(e) => {
                    warn!("link to hub lost while sending: {e}");
                    // Closing our half makes the receive thread see the end
                    // of the link too, and rejoin.
                    let _ = stream.0.get_ref().shutdown();
                    let mut q = self.q.lock().unwrap();
                    if q.epoch == epoch {
                        q.up = false;
                        q.frames.clear();
                        q.bytes = 0;
                    }
                    drop(q);
                    self.room.notify_all();
                }
            }
        }
    }
}

impl Uplink for RemoteLink {
    fn send(&self, w: &WritePacket<'_>) -> Result<(), UplinkError> {
        let frame = Msg::Write { dest: w.dest, flags: w.flags, addr: w.addr, data: w.data }.encode();
        self.inner.push(frame, true)
    }

    fn flush(&self) {
        let mut q = self.inner.q.lock().unwrap();
        if !q.frames.is_empty() {
            q.kick = true;
            self.inner.work.notify_one();
        }
    }
}

impl RemoteLink {
    /// Joins the hub at `cfg.hub`, retrying for `cfg.hub_wait`, and starts
    /// the writer and receive threads; the receive thread rejoins by itself
    /// whenever the link goes down.
    pub fn connect(shared: Arc<Shared>, cfg: &AdapterConfig) -> io::Result<RemoteLink> {
        let deadline = Instant::now() + cfg.hub_wait;
        let (joined, reader, writer) = loop {
            match link_client::join_addr(&cfg.hub, &hello(cfg, shared.pages)) {
                Ok(j) => break j,
                // A refusal (wrong secret, id taken) will not change by retrying.
                Err(e)
                    if matches!(e.kind(), io::ErrorKind::ConnectionRefused | io::ErrorKind::PermissionDenied)
                        && e.to_string().contains("refused") =>
                {
                    return Err(io::Error::new(e.kind(), format!("cannot join hub at {}: {e}", cfg.hub)));
                }
                Err(e) if Instant::now() < deadline => {
                    debug!("hub not reachable yet: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => return Err(io::Error::new(e.kind(), format!("cannot join hub at {}: {e}", cfg.hub))),
            }
        };
        info!(node = joined.node, ports = joined.max_nodes, members = ?joined.members, "joined hub");
        Ok(Self::start(shared, joined, reader, writer, Some(cfg.clone())))
    }

    /// Uses an already-joined link (from [`link_client::join_addr`]); no
    /// rejoin after a loss.
    pub fn attach(shared: Arc<Shared>, joined: Joined, reader: Stream, writer: BufWriter<Stream>) -> RemoteLink {
        Self::start(shared, joined, reader, writer, None)
    }

    fn start(
        shared: Arc<Shared>,
        joined: Joined,
        reader: Stream,
        writer: BufWriter<Stream>,
        rejoin: Option<AdapterConfig>,
    ) -> RemoteLink {
        let inner = Arc::new(Inner {
            shared,
            live: rejoin.is_some(),
            q: Mutex::new(Queue { frames: VecDeque::new(), bytes: 0, kick: false, stream: None, epoch: 0, up: false }),
            room: Condvar::new(),
            work: Condvar::new(),
        });
        inner.shared.err_status_clear(err::LINK_DOWN);
        inner.install(&joined, writer);
        let w = inner.clone();
        std::thread::Builder::new().name("mc-link-tx".into()).spawn(move || w.writer()).expect("spawn writer thread");
        let r = inner.clone();
        let link_seq = joined.next_link_seq;
        std::thread::Builder::new()
            .name("mc-rx".into())
            .spawn(move || receive_loop(r, reader, link_seq, rejoin))
            .expect("spawn receive thread");
        RemoteLink { inner }
    }
}

/// The `Hello` this adapter sends.
impl Adapter {
    /// Joins the hub at `cfg.hub` over a link port (retrying for
    /// `cfg.hub_wait`); the link rejoins by itself whenever it goes down.
    pub fn connect(&mut self, cfg: &AdapterConfig) -> io::Result<()> {
        let link = RemoteLink::connect(self.shared(), cfg)?;
        self.set_uplink(Arc::new(link));
        Ok(())
    }

    /// Uses an already-joined link (from `link_client::join`); no rejoin after a loss.
    pub fn attach_link(&mut self, joined: Joined, reader: UnixStream, writer: BufWriter<UnixStream>) {
        let writer =
            BufWriter::with_capacity(64 * 1024, Stream::Unix(writer.into_inner().expect("fresh writer is empty")));
        let link = RemoteLink::attach(self.shared(), joined, Stream::Unix(reader), writer);
        self.set_uplink(Arc::new(link));
    }
}

fn hello(cfg: &AdapterConfig, pages: u64) -> link_client::Hello<'_> {
    link_client::Hello {
        want_node: cfg.want_node,
        page_size: PAGE_SIZE as u32,
        aspace_pages: pages as u32,
        name: &cfg.name,
        secret: cfg.secret.as_deref(),
        keepalive: true,
    }
}

/// Silence after which a live link is taken for dead.
fn dead_after() -> Duration {
    Duration::from_millis(link::DEAD_AFTER_MS)
}

fn receive_loop(inner: Arc<Inner>, reader: Stream, mut link_seq: u16, rejoin: Option<AdapterConfig>) {
    let shared = inner.shared.clone();
    let mut buf = Vec::with_capacity(MAX_DATA + 64);
    if inner.live {
        let _ = reader.set_read_timeout(Some(dead_after()));
    }
    // Frames are read through a buffer: one read(2) per batch, not two per frame.
    let mut reader = BufReader::with_capacity(64 * 1024, reader);
    loop {
        let reason = loop {
            let hdr = match link::read_frame(&mut reader, &mut buf) {
                Ok(h) => h,
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    break format!("nothing from the hub for {} ms: link taken for dead", link::DEAD_AFTER_MS);
                }
                Err(e) => break e.to_string(),
            };
            let lost = link::check_link_seq(&mut link_seq, hdr.link_seq);
            if lost != 0 {
                warn!(lost, "frames from the hub went missing (link sequence skipped)");
                shared.raise_error(err::SEQ_GAP);
            }
            match Msg::parse(&hdr, &buf) {
                Ok(Msg::Deliver { seq, src, flags, addr, data }) => {
                    if let Some(a) = shared.deliver(seq, src, flags, addr, data) {
                        let frame =
                            Msg::Write { dest: a.dest, flags: a.flags, addr: a.addr, data: &[a.status] }.encode();
                        // Never waits: the receive thread must keep draining the hub.
                        let _ = inner.push(frame, false);
                    }
                }
                Ok(Msg::Member { seq, node, up }) => shared.member(seq, node, up),
                Ok(Msg::Idle) => {}
                // Framing is intact: count it, drop the packet, go on.
                Err(LinkError::BadCrc) => shared.bad_crc(),
                Ok(other) => break format!("unexpected {other:?} from hub"),
                Err(e) => break e.to_string(),
            }
        };
        warn!("link to hub down: {reason}");
        // Both directions end: a writer blocked on this socket gives up now.
        let _ = reader.get_ref().shutdown();
        inner.down(&reason);
        let Some(cfg) = &rejoin else { return };
        // Rejoin as the same node, for as long as it takes.
        let mut again = cfg.clone();
        again.want_node = shared.home_node();
        reader = loop {
            std::thread::sleep(RECONNECT_INTERVAL);
            match link_client::join_addr(&again.hub, &hello(&again, shared.pages)) {
                Ok((joined, r, w)) => {
                    info!(node = joined.node, "rejoined hub");
                    let _ = r.set_read_timeout(Some(dead_after()));
                    inner.install(&joined, w);
                    link_seq = joined.next_link_seq;
                    break BufReader::with_capacity(64 * 1024, r);
                }
                Err(e) => debug!("rejoin failed: {e}"),
            }
        };
    }
}
