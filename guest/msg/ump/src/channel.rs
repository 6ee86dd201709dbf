//! A UMP channel: a duplex link between two 64-bit endpoint handles, made
//! of two halves (one per side, see [`crate::ring`]). Side 0 is the lower
//! handle. Where the halves live is the transport:
//!
//! - shared memory: one `/dev/shm/ump-ch-<lo>-<hi>` file, both halves in it;
//! - MEMORY CHANNEL: one region per half (libimc), keyed by the handle
//!   pair. Each side maps its own half for transmit only (no loopback, as
//!   in the revised UMP) and the other half for receive.
//!
//! # Opening
//!
//! A channel is complete only when both sides have opened it. Each side
//! zeroes its half's indexes, writes who it is, and its session token in
//! OPEN; when it sees the other side's token it echoes it in ACK; a side is
//! complete when the other side's ACK carries its own token. Until then it
//! re-sends its header (over MEMORY CHANNEL a write made before the other
//! side attached is lost), so stale words from an earlier channel with the
//! same handles can never complete a new one.
//!
//! A side stores OPEN before ACK and reads ACK before OPEN, so a side that
//! completes knows the other side's current token: its reader checks every
//! chunk header against it (`crate::ring`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::mem::{Sink, Source};
use crate::ring::{self, Consumer, Producer, RingError, CLOSED, HEAD, NACK, OPEN, TAIL, WHO};

/// The echo of the other side's token.
pub const ACK: usize = 32;

/// Where a channel's buffers live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// Shared memory between processes of one guest.
    Shm,
    /// MEMORY CHANNEL between guests.
    Mc,
}

/// Is the other side still there? (`Err`: why not.)
pub type Liveness = Box<dyn Fn(u64) -> Result<(), String> + Send + Sync>;

/// One open channel.
pub struct Channel {
    /// This side's handle.
    pub local: u64,
    /// The other side's handle.
    pub remote: u64,
    /// Where its buffers live.
    pub transport: Transport,
    /// Ring bytes per direction.
    pub size: usize,
    out: Arc<dyn Sink>,
    peer: Arc<dyn Source>,
    session: u64,
    complete: AtomicBool,
    closed: AtomicBool,
    /// The token of the other side we last echoed.
    acked: AtomicU64,
    pub(crate) tx: Mutex<Producer>,
    pub(crate) rx: Mutex<Consumer>,
    alive: Liveness,
    /// When we last resent our header while opening (10 ms units since `started`).
    last_announce: AtomicU64,
    /// When we last checked the other side is alive (ms since `started`).
    last_liveness: AtomicU64,
    started: Instant,
    /// Mappings and regions the halves live in (released on drop).
    _keep: Box<dyn Send + Sync>,
    /// Who we are in WHO (node << 32 | pid).
    who: u64,
}

/// Why a channel operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChanError {
    /// The other side closed the channel (mid-message: the partial message
    /// is dropped, never delivered).
    #[error("the other side closed the channel{0}")]
    Closed(String),
    /// The other side's process or node is gone.
    #[error("the other side is gone: {0}")]
    PeerDead(String),
    /// The channel is not complete yet (the other side has not opened it).
    #[error("the channel is not open on the other side yet")]
    NotOpen,
    /// We closed it.
    #[error("the channel was closed")]
    ClosedHere,
    /// The ring is corrupt (what was found, or lost for good).
    #[error("{0}")]
    Corrupt(RingError),
    /// The message does not fit the buffer.
    #[error("the message ({0} bytes) does not fit the buffer")]
    TooBig(usize),
    /// Gave up waiting.
    #[error("timed out")]
    Timeout,
}

/// How often a waiting side asks whether the other one is alive.
const LIVENESS_EVERY: Duration = Duration::from_millis(100);

impl Channel {
    /// A channel over halves `out` (ours) and `peer` (theirs); with `copy`
    /// (MEMORY CHANNEL) the writer keeps a copy of its ring to send lost
    /// bytes again, and the reader checks payloads.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        local: u64,
        remote: u64,
        transport: Transport,
        size: usize,
        out: Arc<dyn Sink>,
        peer: Arc<dyn Source>,
        who: u64,
        alive: Liveness,
        keep: Box<dyn Send + Sync>,
        copy: Option<Box<dyn ring::Shadow>>,
    ) -> Arc<Channel> {
        let session = fresh_token();
        let c = Arc::new(Channel {
            local,
            remote,
            transport,
            size,
            tx: Mutex::new(Producer::new(out.clone(), peer.clone(), size, session, copy)),
            rx: Mutex::new(Consumer::new(out.clone(), peer.clone(), size, transport == Transport::Mc)),
            out,
            peer,
            session,
            complete: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            acked: AtomicU64::new(0),
            alive,
            last_announce: AtomicU64::new(0),
            last_liveness: AtomicU64::new(0),
            started: Instant::now(),
            _keep: keep,
            who,
        });
        c.announce();
        c
    }

    /// (Re-)sends our header: indexes zero, who we are, our token.
    fn announce(&self) {
        self.out.store(HEAD, 0);
        self.out.store(TAIL, 0);
        self.out.store(NACK, 0);
        self.out.store(WHO, self.who);
        // OPEN before ACK: a side that sees its token in our ACK then
        // reads our OPEN and finds this session's token, never an earlier
        // one left in the memory (its reader checks our chunks against it).
        self.out.store(OPEN, self.session);
        let peer_token = self.peer.load(OPEN);
        if peer_token != 0 && peer_token != CLOSED {
            self.out.store(ACK, peer_token);
            self.acked.store(peer_token, Ordering::Relaxed);
        }
    }

    /// Advances the opening handshake; true once complete.
    pub fn poll_open(&self) -> bool {
        if self.complete.load(Ordering::Acquire) {
            return true;
        }
        // ACK first: the other side wrote its OPEN before it, so the OPEN
        // read after an ACK that carries our token is the other side's
        // current session.
        let peer_ack = self.peer.load(ACK);
        let peer_token = self.peer.load(OPEN);
        if peer_token != 0 && peer_token != CLOSED && self.out_ack() != peer_token {
            self.out.store(ACK, peer_token);
            self.acked.store(peer_token, Ordering::Relaxed);
        }
        if peer_token != 0 && peer_token != CLOSED && peer_ack == self.session {
            // Nobody reads before the channel is complete.
            self.rx.lock().unwrap_or_else(|e| e.into_inner()).set_seed(peer_token);
            self.complete.store(true, Ordering::Release);
            return true;
        }
        // Re-send now and then: a write made before the other side mapped
        // its receive side is lost.
        let now = self.started.elapsed().as_millis() as u64;
        if now / 10 != self.last_announce.swap(now / 10, Ordering::Relaxed) {
            self.announce();
        }
        false
    }

    fn out_ack(&self) -> u64 {
        self.acked.load(Ordering::Relaxed)
    }

    /// Complete (both sides opened).
    pub fn is_complete(&self) -> bool {
        self.complete.load(Ordering::Acquire)
    }

    /// Whether the other side closed its end.
    pub fn peer_closed(&self) -> bool {
        self.is_complete() && self.peer.load(OPEN) == CLOSED
    }

    /// The other side's identity (node << 32 | pid).
    pub fn peer_who(&self) -> u64 {
        self.peer.load(WHO)
    }

    /// Why a ring operation should stop waiting, if it should: we closed,
    /// the other side closed (`closed` says what that means for this
    /// operation), it died (checked every [`LIVENESS_EVERY`]), or `deadline`.
    fn stop_reason(&self, deadline: Option<Instant>, closed: &str) -> Result<(), ChanError> {
        self.service();
        if self.closed.load(Ordering::Acquire) {
            return Err(ChanError::ClosedHere);
        }
        if self.peer.load(OPEN) == CLOSED {
            return Err(ChanError::Closed(closed.into()));
        }
        let now = self.started.elapsed().as_millis() as u64;
        if now >= self.last_liveness.load(Ordering::Relaxed) + LIVENESS_EVERY.as_millis() as u64 {
            self.last_liveness.store(now, Ordering::Relaxed);
            (self.alive)(self.peer_who()).map_err(ChanError::PeerDead)?;
        }
        if deadline.is_some_and(|d| Instant::now() > d) {
            return Err(ChanError::Timeout);
        }
        Ok(())
    }

    /// Runs a ring operation whose waits stop for [`Channel::stop_reason`],
    /// and turns its error into the channel's.
    fn waiting<T>(
        &self,
        deadline: Option<Instant>,
        closed: &str,
        op: impl FnOnce(ring::Waiter) -> Result<T, RingError>,
    ) -> Result<T, ChanError> {
        let mut why = None;
        let r = op(&mut || {
            self.stop_reason(deadline, closed).map_err(|e| {
                why = Some(e);
                ring::Stop
            })
        });
        r.map_err(|e| match e {
            RingError::TooBig(n) => ChanError::TooBig(n),
            RingError::Stopped => why.take().unwrap_or(ChanError::Corrupt(RingError::Stopped)),
            corrupt => ChanError::Corrupt(corrupt),
        })
    }

    fn wait_open(&self, deadline: Option<Instant>) -> Result<(), ChanError> {
        let mut spins = 0u32;
        while !self.poll_open() {
            if self.closed.load(Ordering::Acquire) {
                return Err(ChanError::ClosedHere);
            }
            if deadline.is_some_and(|d| Instant::now() > d) {
                return Err(ChanError::NotOpen);
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        Ok(())
    }

    /// Writes one message (blocking until all of it is in the ring).
    pub fn write(&self, msg: &[u8], deadline: Option<Instant>) -> Result<(), ChanError> {
        self.wait_open(deadline)?;
        let mut tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        self.waiting(deadline, "", |wait| tx.write(msg, wait))
    }

    /// Writes one message made of `parts` (see
    /// [`crate::ring::Producer::write_parts`]: a header and a payload go
    /// into the ring without being copied together first).
    pub fn write_parts(&self, parts: &[&[u8]], deadline: Option<Instant>) -> Result<(), ChanError> {
        self.wait_open(deadline)?;
        let mut tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        self.waiting(deadline, "", |wait| tx.write_parts(parts, wait))
    }

    /// Reads the next message into `head` and the slice `place` gives
    /// for the rest, when it can (see [`crate::ring::Consumer::read_split`]);
    /// `Ok(None)`: nothing was read, use [`Channel::read`].
    pub fn read_split<'d>(
        &self,
        head: &mut [u8],
        place: impl FnOnce(&[u8], usize) -> Option<&'d mut [u8]>,
        deadline: Option<Instant>,
    ) -> Result<Option<usize>, ChanError> {
        self.wait_open(deadline)?;
        let mut rx = self.rx.lock().unwrap_or_else(|e| e.into_inner());
        let closed = " in the middle of a message (the partial message is dropped)";
        self.waiting(deadline, closed, |wait| rx.read_split(head, place, wait))
    }

    /// Serves the other side's reader while this side waits or polls:
    /// bytes it asked for again, and our index now and then (see
    /// [`crate::ring`], "Lost bytes"). A writer of ours does it itself.
    pub fn service(&self) {
        if self.transport == Transport::Mc && self.is_complete() {
            if let Ok(mut tx) = self.tx.try_lock() {
                tx.service();
            }
        }
    }

    /// Repair requests: (made by our reader, served by our writer).
    pub fn repairs(&self) -> (u64, u64) {
        let asked = self.rx.try_lock().map(|r| r.nacks()).unwrap_or(0);
        let served = self.tx.try_lock().map(|t| t.repairs()).unwrap_or(0);
        (asked, served)
    }

    /// Bytes our writer sent into the ring by the adapter's DMA engine.
    pub fn dma_bytes(&self) -> u64 {
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).dma_bytes()
    }

    /// Writes a multicast record pointing into an outbuf (see
    /// [`crate::ring::Producer::write_record`]); returns our producer index
    /// after it (the record is consumed once the reader's index passes it).
    pub fn write_record(
        &self,
        msg: &[u8],
        key: u64,
        off: u64,
        size: u64,
        deadline: Option<Instant>,
    ) -> Result<u64, ChanError> {
        self.wait_open(deadline)?;
        let mut tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        self.waiting(deadline, "", |wait| tx.write_record(msg, key, off, size, wait))?;
        Ok(tx.produced())
    }

    /// Bytes that can be written now without waiting: 0 until the channel
    /// is complete (and after either side closed it).
    pub fn writable(&self) -> Result<usize, ChanError> {
        if !self.poll_open() || self.is_closed() || self.peer.load(OPEN) == CLOSED {
            return Ok(0);
        }
        let mut tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        tx.free().map_err(ChanError::Corrupt)
    }

    /// The longest message that can be written now without waiting (0
    /// until the channel is complete, and after either side closed it).
    pub fn room(&self) -> Result<usize, ChanError> {
        self.writable().map(ring::room)
    }

    /// The longest message that ever goes in without waiting (when the
    /// other side has read everything).
    pub fn max_unsplit(&self) -> usize {
        ring::room(self.size)
    }

    /// Whether the other side's process is still there.
    pub fn alive(&self) -> Result<(), ChanError> {
        (self.alive)(self.peer_who()).map_err(ChanError::PeerDead)
    }

    /// The reader's index of our ring (bytes it has consumed).
    pub fn consumed(&self) -> u64 {
        self.peer.load(TAIL)
    }

    /// Lets reads follow multicast records into senders' outbufs.
    pub fn set_resolver(&self, r: ring::Resolver) {
        self.rx.lock().unwrap_or_else(|e| e.into_inner()).set_resolver(r);
    }

    /// Reads one message into `buf`; returns its length.
    pub fn read(&self, buf: &mut [u8], deadline: Option<Instant>) -> Result<usize, ChanError> {
        self.wait_open(deadline)?;
        let mut rx = self.rx.lock().unwrap_or_else(|e| e.into_inner());
        let mid = rx.mid_message();
        let closed = " in the middle of a message (the partial message is dropped)";
        match self.waiting(deadline, closed, |wait| rx.read(buf, wait)) {
            // Closed between messages: nothing was lost.
            Err(ChanError::Closed(_)) if !mid && !rx.mid_message() => Err(ChanError::Closed(String::new())),
            r => r,
        }
    }

    /// Length of the next message if one has (started to) arrive(d).
    pub fn pending(&self) -> Option<usize> {
        if !self.is_complete() {
            return None;
        }
        self.service();
        self.rx.try_lock().ok().and_then(|mut r| r.peek().ok().flatten())
    }

    /// Closes our side: the other side sees CLOSED after everything we
    /// wrote; a transfer of ours in progress stops with an error.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.out.store(OPEN, CLOSED);
    }

    /// Whether we closed it.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Bytes this side has written into its ring.
    pub fn produced(&self) -> u64 {
        self.tx.try_lock().map(|t| t.produced()).unwrap_or(0)
    }

    /// The channel's indices and repair counts, for a report when an
    /// operation waited too long.
    pub fn state(&self) -> String {
        let (asked, served) = self.repairs();
        let taken = self.rx.try_lock().map(|r| r.taken().to_string()).unwrap_or_else(|_| "?".into());
        format!(
            "we sent {} bytes and the other side took {}; it sent {} and we took {taken}; repairs asked {asked}, \
             served {served}; complete: {}; other side {:#x}",
            self.produced(),
            self.consumed(),
            self.peer.load(HEAD),
            self.is_complete(),
            self.peer_who()
        )
    }

    /// Ring bytes a message of `len` takes.
    pub fn footprint(&self, len: usize) -> usize {
        ring::footprint(self.size, len)
    }
}

/// A fresh nonzero token (time and a counter: unique per process).
pub fn fresh_token() -> u64 {
    static N: AtomicU64 = AtomicU64::new(0);
    let t =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    let v =
        t ^ (std::process::id() as u64) << 40 ^ N.fetch_add(1, Ordering::Relaxed).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    if v == 0 || v == CLOSED {
        1
    } else {
        v
    }
}
