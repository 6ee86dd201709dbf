//! Links to the other ranks: framed messages over UMP channels (shared
//! memory inside a guest, MEMORY CHANNEL between guests), used so that the
//! progress engine never blocks on one peer while another waits for it.
//! A frame is written only when [`Link::room`] says it fits, and read only
//! when [`Link::next_len`] says one is there.
//!
//! Links are opened all at once ([`connect_all`]) or on first use
//! ([`lazy_links`]: each rank listens on its handle, and a link opens its
//! channel when it first has a frame to send, or takes the one the other
//! rank opened first).
//!
//! Also an in-process link pair ([`pipe`]) for the engine's unit tests.
//!
//! Touched only by the thread that calls MPI (the engine's lock).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap as HashMap;
use thiserror::Error;

/// A link that failed.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum TransportError {
    /// The UMP layer refused or failed.
    #[error("UMP: {0}")]
    Ump(String),
    /// The channel to a rank did not open in time.
    #[error("rank {rank}'s channel did not open within {secs} s (is rank {rank} running?)")]
    NotOpen {
        /// The rank.
        rank: u32,
        /// How long we waited.
        secs: u64,
    },
    /// The other rank closed its end or died.
    #[error("rank {0} is gone: {1}")]
    PeerGone(u32, String),
}

/// Where [`Link::recv_split`] puts the rest of a frame: given the head
/// and the bytes left, a slice of exactly that length, or `None`.
pub type Place<'a, 'd> = dyn FnMut(&[u8], usize) -> Option<&'d mut [u8]> + 'a;

/// One direction-pair to one other rank.
pub trait Link: Send {
    /// Bytes of frame that can be sent now without waiting.
    fn room(&self) -> Result<usize, TransportError>;
    /// Sends a frame; called only when `frame.len() <= room()`.
    fn send(&self, frame: &[u8]) -> Result<(), TransportError>;
    /// The length of the next frame, if one has arrived.
    fn next_len(&self) -> Result<Option<usize>, TransportError>;
    /// Reads the next frame (whose length `next_len` gave) into `buf`.
    fn recv(&self, buf: &mut [u8]) -> Result<usize, TransportError>;
    /// The largest frame this link can ever carry.
    fn max_frame(&self) -> usize;
    /// Sends a frame made of `parts` (a header, then a payload), without
    /// copying them together where the link can; as [`Link::send`].
    fn send_parts(&self, parts: &[&[u8]]) -> Result<(), TransportError> {
        self.send(&parts.concat())
    }
    /// Reads the next frame straight into two places, where the link can:
    /// its first `head.len()` bytes into `head`, the rest into the slice
    /// `place` gives (it sees the head and the bytes left). `Ok(None)`:
    /// nothing was read; read it with [`Link::recv`].
    fn recv_split<'d>(&self, head: &mut [u8], place: &mut Place<'_, 'd>) -> Result<Option<usize>, TransportError> {
        let _ = (head, place);
        Ok(None)
    }
    /// Whether the other rank is on another guest (MEMORY CHANNEL).
    fn remote(&self) -> bool {
        false
    }
    /// The link's state in words, for a report of a wait that lasts.
    fn describe(&self) -> String {
        String::new()
    }
    /// Whether the other side has taken everything sent into the link.
    fn delivered(&self) -> bool;
    /// Whether anything was ever opened or sent on the link (a link opened
    /// on first use that neither side used has nothing to say goodbye to);
    /// `look_now`: look for a channel the other side opened first now, not
    /// only now and then.
    fn in_use(&self, look_now: bool) -> bool {
        let _ = look_now;
        true
    }
}

/// A link over one UMP channel.
pub struct UmpLink {
    rank: u32,
    id: i32,
    ch: Arc<ump::Channel>,
}

fn gone(rank: u32, e: impl std::fmt::Display) -> TransportError {
    TransportError::PeerGone(rank, e.to_string())
}

impl Link for UmpLink {
    fn room(&self) -> Result<usize, TransportError> {
        let room = self.ch.room().map_err(|e| gone(self.rank, e))?;
        if room == 0 && (self.ch.peer_closed() || self.ch.is_closed()) {
            return Err(gone(self.rank, "its channel is closed"));
        }
        Ok(room)
    }
    fn send(&self, frame: &[u8]) -> Result<(), TransportError> {
        self.ch.write(frame, Some(Instant::now() + Duration::from_secs(60))).map_err(|e| gone(self.rank, e))
    }
    fn next_len(&self) -> Result<Option<usize>, TransportError> {
        // Closed is read first: everything the other side wrote before it
        // closed is visible by then, so "closed and nothing pending" means
        // nothing more will come (the other order loses a last frame that
        // lands between the two reads).
        let closed = self.ch.peer_closed();
        match self.ch.pending() {
            Some(n) => Ok(Some(n)),
            None if closed => Err(gone(self.rank, "it closed its channel")),
            None => Ok(None),
        }
    }
    fn recv(&self, buf: &mut [u8]) -> Result<usize, TransportError> {
        self.ch.read(buf, Some(Instant::now() + Duration::from_secs(60))).map_err(|e| gone(self.rank, e))
    }
    fn max_frame(&self) -> usize {
        self.ch.max_unsplit()
    }
    fn send_parts(&self, parts: &[&[u8]]) -> Result<(), TransportError> {
        self.ch.write_parts(parts, Some(Instant::now() + Duration::from_secs(60))).map_err(|e| gone(self.rank, e))
    }
    fn recv_split<'d>(&self, head: &mut [u8], place: &mut Place<'_, 'd>) -> Result<Option<usize>, TransportError> {
        let deadline = Some(Instant::now() + Duration::from_secs(60));
        self.ch.read_split(head, place, deadline).map_err(|e| gone(self.rank, e))
    }
    fn remote(&self) -> bool {
        self.ch.transport == ump::Transport::Mc
    }
    fn describe(&self) -> String {
        format!("{:?}: {}", self.ch.transport, self.ch.state())
    }
    fn delivered(&self) -> bool {
        // The reader publishes how far it has read while it polls (again
        // and again over MEMORY CHANNEL, where a store of it can be lost).
        self.ch.consumed() >= self.ch.produced()
    }
}

impl Drop for UmpLink {
    fn drop(&mut self) {
        let _ = ump::close(self.id);
    }
}

/// Opens a UMP channel from each rank of a job to every other one (both
/// sides open; UMP picks shared memory or MEMORY CHANNEL) and waits until
/// all are complete. `handle(r)` is rank r's UMP handle. Entry `me` of
/// the result is `None`.
pub fn connect_all(
    me: u32,
    size: u32,
    handle: impl Fn(u32) -> u64,
    timeout: Duration,
) -> Result<Vec<Option<Box<dyn Link>>>, TransportError> {
    let ump_err = |e: ump::UmpError| TransportError::Ump(e.to_string());
    let mut ids = Vec::new();
    for r in 0..size {
        if r == me {
            ids.push(None);
            continue;
        }
        ids.push(Some(ump::open(handle(me), handle(r), ump::Want::Any).map_err(ump_err)?));
    }
    let t0 = Instant::now();
    let mut links: Vec<Option<Box<dyn Link>>> = Vec::new();
    for (r, id) in ids.iter().enumerate() {
        let Some(id) = *id else {
            links.push(None);
            continue;
        };
        let rank = r as u32;
        loop {
            let left = timeout.saturating_sub(t0.elapsed());
            if left.is_zero() {
                return Err(TransportError::NotOpen { rank, secs: timeout.as_secs() });
            }
            match ump::wait(Some(id), Some(left.min(Duration::from_millis(200)))).map_err(ump_err)? {
                Some(ump::Event::Closed(_)) => return Err(gone(rank, "it closed the channel while opening")),
                _ if ump::chan(id).map_err(ump_err)?.is_complete() => break,
                _ => {}
            }
        }
        let ch = ump::chan(id).map_err(ump_err)?;
        links.push(Some(Box::new(UmpLink { rank, id, ch })));
    }
    Ok(links)
}

/// When a rank whose first send waits for the other rank to take the
/// channel says so on stderr.
const OPEN_REPORT: Duration = Duration::from_secs(10);

/// How often an opening link tells the other side's listener again (it
/// may have started listening after our open).
const RENOTIFY_EVERY: Duration = Duration::from_millis(100);

/// Of the calls that ask the [`Acceptor`], one in this many looks at the
/// listener (and only if [`ACCEPT_EVERY`] passed): every idle link asks
/// in every round of progress.
const ACCEPT_CALLS: u32 = 64;
/// The least time between two looks at the listener.
const ACCEPT_EVERY: Duration = Duration::from_millis(1);

/// What a rank's links share: the channels its listener accepted (another
/// rank opened them first) that no link has taken yet.
pub struct Acceptor {
    inner: Mutex<Accepted>,
}

struct Accepted {
    /// Channel ids by the other side's handle.
    waiting: HashMap<u64, i32>,
    /// Channels of this rank not complete yet (opened or accepted).
    opening: Vec<i32>,
    calls: u32,
    last: Instant,
}

impl Acceptor {
    /// A new one, for a rank that listens on its handle (`ump::listen`).
    pub fn new() -> Arc<Acceptor> {
        Arc::new(Acceptor {
            inner: Mutex::new(Accepted {
                waiting: HashMap::default(),
                opening: Vec::new(),
                calls: 0,
                last: Instant::now(),
            }),
        })
    }

    /// The channel the rank with handle `peer` opened to us, if the
    /// listener has accepted it. Looks at the listener now if `now`, else
    /// only now and then ([`ACCEPT_CALLS`], [`ACCEPT_EVERY`]).
    fn take(&self, peer: u64, now: bool) -> Result<Option<i32>, TransportError> {
        let mut a = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        a.calls = a.calls.wrapping_add(1);
        if now || (a.calls % ACCEPT_CALLS == 0 && a.last.elapsed() >= ACCEPT_EVERY) {
            Self::accept(&mut a)?;
        }
        Ok(a.waiting.remove(&peer))
    }

    /// Takes the channels the listener has accepted (opening our side of
    /// each), for their links to find later, and moves the opening
    /// handshake of every channel of this rank not complete yet. A rank
    /// that waits for one channel must still answer the others: the
    /// other side of each waits for our acknowledgement of its header
    /// (which it sends again and again, since what it wrote before we
    /// mapped its half was lost), and ranks that each wait for the next
    /// one's channel in a circle would otherwise wait for ever.
    fn look(&self) -> Result<(), TransportError> {
        let mut a = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        Self::accept(&mut a)?;
        a.opening.retain(|&id| ump::chan(id).is_ok_and(|c| !c.poll_open()));
        Ok(())
    }

    /// Channel `id` of this rank is opening.
    fn opening(&self, id: i32) {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).opening.push(id);
    }

    fn accept(a: &mut Accepted) -> Result<(), TransportError> {
        a.last = Instant::now();
        for (id, h) in ump::accept_new().map_err(|e| TransportError::Ump(e.to_string()))? {
            a.waiting.insert(h, id);
            a.opening.push(id);
        }
        Ok(())
    }
}

/// Where a link opened on first use stands.
enum Lazy {
    /// No channel yet: nothing was sent either way.
    Idle,
    /// Our side is open (we opened it, or our listener accepted it); not
    /// complete yet.
    /// `told`: when we last told the other side's listener (`None`: the
    /// listener accepted it, the other side opened first).
    Opening {
        id: i32,
        since: Instant,
        told: Option<Instant>,
    },
    Open(UmpLink),
}

/// A link to one rank whose UMP channel is opened on first use: when the
/// engine first has a frame for it, or when the other rank opened it
/// first (our listener accepted it). Until it is complete it has no room
/// and nothing to read, so frames wait in the engine's queue. Shared
/// memory or MEMORY CHANNEL is known from the placement (`MCMPI_NODES`)
/// before anything opens.
pub struct LazyLink {
    rank: u32,
    me: u64,
    peer: u64,
    remote: bool,
    max: usize,
    /// How long the opening waits for the other side.
    timeout: Duration,
    acceptor: Arc<Acceptor>,
    state: std::cell::RefCell<Lazy>,
}

impl LazyLink {
    /// Moves the link on: takes a channel the other side opened, opens
    /// one if `open` (we have something to send), completes the opening.
    fn advance(&self, open: bool, look_now: bool) -> Result<(), TransportError> {
        let mut st = self.state.borrow_mut();
        let ump_err = |e: ump::UmpError| TransportError::Ump(e.to_string());
        if let Lazy::Idle = *st {
            let now = Instant::now();
            let (id, told) = match self.acceptor.take(self.peer, look_now)? {
                Some(id) => (id, None),
                None if open => {
                    let want = if self.remote { ump::Want::Mc } else { ump::Want::Shm };
                    let id = ump::open_or_join(self.me, self.peer, want).map_err(ump_err)?;
                    self.acceptor.opening(id);
                    (id, Some(now))
                }
                None => return Ok(()),
            };
            *st = Lazy::Opening { id, since: now, told };
        }
        if let Lazy::Opening { id, since, told } = &mut *st {
            let ch = ump::chan(*id).map_err(ump_err)?;
            if ch.poll_open() {
                if ch.max_unsplit() < self.max {
                    return Err(TransportError::Ump(format!(
                        "the channel to rank {} carries frames of {} bytes, not {}: the ranks' ring sizes differ",
                        self.rank,
                        ch.max_unsplit(),
                        self.max
                    )));
                }
                *st = Lazy::Open(UmpLink { rank: self.rank, id: *id, ch });
            } else if since.elapsed() > self.timeout {
                return Err(TransportError::NotOpen { rank: self.rank, secs: self.timeout.as_secs() });
            } else if let Some(told) = told.as_mut().filter(|t| t.elapsed() > RENOTIFY_EVERY) {
                *told = Instant::now();
                ump::renotify(*id).map_err(ump_err)?;
            }
        }
        Ok(())
    }

    /// Where the link stands.
    fn state(&self) -> std::cell::Ref<'_, Lazy> {
        self.state.borrow()
    }

    fn not_open(&self) -> TransportError {
        TransportError::Ump(format!("the channel to rank {} is not open", self.rank))
    }

    /// Opens the channel and waits until it is complete. A frame must not
    /// stay queued for a channel that is opening when the MPI call that
    /// sent it returns: nothing would write it while the program computes,
    /// and the receiver would wait for it (an open channel takes it at
    /// once, into its ring). So the first send to a rank waits until that
    /// rank takes part: it does in any MPI call that waits (its progress
    /// looks for channels opened to it). Meanwhile this rank takes the
    /// channels others open to it, so ranks opening to each other in a
    /// circle do not wait for ever.
    fn open_now(&self) -> Result<(), TransportError> {
        let mut idle = 0u32;
        let t0 = Instant::now();
        let mut looked = t0;
        let mut said = false;
        loop {
            self.advance(true, false)?;
            if matches!(&*self.state(), Lazy::Open(_)) {
                return Ok(());
            }
            if !said && t0.elapsed() >= OPEN_REPORT {
                said = true;
                eprintln!(
                    "mcmpi: {:#x}: has waited {} s for rank {} to take the channel it opened to it (is rank {} in an MPI call?)",
                    self.me,
                    OPEN_REPORT.as_secs(),
                    self.rank,
                    self.rank
                );
            }
            if looked.elapsed() >= ACCEPT_EVERY {
                looked = Instant::now();
                self.acceptor.look()?;
            }
            crate::engine::wait::backoff(&mut idle);
        }
    }
}

impl Link for LazyLink {
    fn room(&self) -> Result<usize, TransportError> {
        self.open_now()?;
        match &*self.state() {
            Lazy::Open(l) => l.room(),
            _ => Ok(0),
        }
    }
    fn send(&self, frame: &[u8]) -> Result<(), TransportError> {
        match &*self.state() {
            Lazy::Open(l) => l.send(frame),
            _ => Err(self.not_open()),
        }
    }
    fn next_len(&self) -> Result<Option<usize>, TransportError> {
        self.advance(false, false)?;
        match &*self.state() {
            Lazy::Open(l) => l.next_len(),
            _ => Ok(None),
        }
    }
    fn recv(&self, buf: &mut [u8]) -> Result<usize, TransportError> {
        match &*self.state() {
            Lazy::Open(l) => l.recv(buf),
            _ => Err(self.not_open()),
        }
    }
    fn max_frame(&self) -> usize {
        self.max
    }
    fn send_parts(&self, parts: &[&[u8]]) -> Result<(), TransportError> {
        match &*self.state() {
            Lazy::Open(l) => l.send_parts(parts),
            _ => Err(self.not_open()),
        }
    }
    fn recv_split<'d>(&self, head: &mut [u8], place: &mut Place<'_, 'd>) -> Result<Option<usize>, TransportError> {
        match &*self.state() {
            Lazy::Open(l) => l.recv_split(head, place),
            _ => Ok(None),
        }
    }
    fn remote(&self) -> bool {
        self.remote
    }
    fn describe(&self) -> String {
        match &*self.state() {
            Lazy::Idle => "not opened (nothing sent either way)".into(),
            Lazy::Opening { since, .. } => format!("opening for {:.1} s", since.elapsed().as_secs_f64()),
            Lazy::Open(l) => l.describe(),
        }
    }
    fn delivered(&self) -> bool {
        match &*self.state() {
            Lazy::Open(l) => l.delivered(),
            // Nothing goes into a link before it is open.
            _ => true,
        }
    }
    fn in_use(&self, look_now: bool) -> bool {
        // A failed look leaves the link as it was: the next call says more.
        let _ = self.advance(false, look_now);
        !matches!(&*self.state(), Lazy::Idle)
    }
}

/// Links from rank `me` to every other rank of a job placed by `nodes`
/// (each rank's node), opened on first use: `handle(r)` is rank r's UMP
/// handle, on which each rank listens. Frames of up to `mc_max` bytes
/// over MEMORY CHANNEL (ranks on other nodes), `shm_max` over shared
/// memory; an opening waits up to `timeout` for the other side. Entry
/// `me` of the result is `None`.
pub fn lazy_links(
    me: u32,
    nodes: &[u32],
    handle: impl Fn(u32) -> u64,
    (shm_max, mc_max): (usize, usize),
    timeout: Duration,
) -> Result<Vec<Option<Box<dyn Link>>>, TransportError> {
    ump::listen(handle(me), ump::Want::Any).map_err(|e| TransportError::Ump(e.to_string()))?;
    let acceptor = Acceptor::new();
    let mine = nodes[me as usize];
    Ok((0..nodes.len() as u32)
        .map(|r| {
            (r != me).then(|| {
                let remote = nodes[r as usize] != mine;
                Box::new(LazyLink {
                    rank: r,
                    me: handle(me),
                    peer: handle(r),
                    remote,
                    max: if remote { mc_max } else { shm_max },
                    timeout,
                    acceptor: acceptor.clone(),
                    state: std::cell::RefCell::new(Lazy::Idle),
                }) as Box<dyn Link>
            })
        })
        .collect())
}

/// One direction of an in-process pipe: frames and the bytes they take.
#[derive(Default)]
struct Queue {
    frames: VecDeque<Vec<u8>>,
    bytes: usize,
    closed: bool,
}

/// One end of an in-process link pair with a ring of `cap` bytes each way
/// (the same accounting as UMP: a 16-byte header, payload padded to 8).
pub struct PipeEnd {
    out: Arc<Mutex<Queue>>,
    inb: Arc<Mutex<Queue>>,
    cap: usize,
}

/// A pair of in-process links, for tests.
pub fn pipe(cap: usize) -> (PipeEnd, PipeEnd) {
    let a = Arc::new(Mutex::new(Queue::default()));
    let b = Arc::new(Mutex::new(Queue::default()));
    (PipeEnd { out: a.clone(), inb: b.clone(), cap }, PipeEnd { out: b, inb: a, cap })
}

fn footprint(n: usize) -> usize {
    16 + n.div_ceil(8) * 8
}

impl PipeEnd {
    fn lock(q: &Mutex<Queue>) -> std::sync::MutexGuard<'_, Queue> {
        q.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for PipeEnd {
    fn drop(&mut self) {
        Self::lock(&self.out).closed = true;
    }
}

impl Link for PipeEnd {
    fn room(&self) -> Result<usize, TransportError> {
        let q = Self::lock(&self.out);
        if Self::lock(&self.inb).closed {
            return Err(gone(0, "pipe closed"));
        }
        Ok((self.cap - q.bytes).saturating_sub(16) & !7)
    }
    fn send(&self, frame: &[u8]) -> Result<(), TransportError> {
        let mut q = Self::lock(&self.out);
        let f = footprint(frame.len());
        if q.bytes + f > self.cap {
            return Err(TransportError::Ump(format!("a frame of {} bytes does not fit", frame.len())));
        }
        q.bytes += f;
        q.frames.push_back(frame.to_vec());
        Ok(())
    }
    fn next_len(&self) -> Result<Option<usize>, TransportError> {
        let q = Self::lock(&self.inb);
        match q.frames.front() {
            Some(f) => Ok(Some(f.len())),
            None if q.closed => Err(gone(0, "pipe closed")),
            None => Ok(None),
        }
    }
    fn recv(&self, buf: &mut [u8]) -> Result<usize, TransportError> {
        let mut q = Self::lock(&self.inb);
        let f = q.frames.pop_front().ok_or_else(|| TransportError::Ump("no frame".into()))?;
        q.bytes -= footprint(f.len());
        buf[..f.len()].copy_from_slice(&f);
        Ok(f.len())
    }
    fn max_frame(&self) -> usize {
        self.cap - 16
    }
    fn delivered(&self) -> bool {
        Self::lock(&self.out).frames.is_empty()
    }
    fn recv_split<'d>(&self, head: &mut [u8], place: &mut Place<'_, 'd>) -> Result<Option<usize>, TransportError> {
        let mut q = Self::lock(&self.inb);
        let Some(f) = q.frames.front() else { return Ok(None) };
        if f.len() < head.len() {
            return Ok(None);
        }
        let (h, rest) = f.split_at(head.len());
        head.copy_from_slice(h);
        match place(head, rest.len()) {
            Some(dst) if dst.len() == rest.len() => dst.copy_from_slice(rest),
            _ => return Ok(None),
        }
        let n = f.len();
        q.frames.pop_front();
        q.bytes -= footprint(n);
        Ok(Some(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pipe_accounts_like_a_ring() {
        let (a, b) = pipe(64);
        assert_eq!(a.room().unwrap(), 48);
        a.send(&[1; 20]).unwrap();
        assert_eq!(a.room().unwrap(), 64 - footprint(20) - 16);
        assert!(a.send(&[0; 40]).is_err());
        assert_eq!(b.next_len().unwrap(), Some(20));
        let mut buf = [0u8; 64];
        assert_eq!(b.recv(&mut buf).unwrap(), 20);
        assert_eq!(b.next_len().unwrap(), None);
        drop(a);
        assert!(b.next_len().is_err());
    }
}
