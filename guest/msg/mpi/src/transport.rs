//! Links to the other ranks: framed messages over UMP channels (shared
//! memory inside a guest, MEMORY CHANNEL between guests), used so that the
//! progress engine never blocks on one peer while another waits for it.
//! A frame is written only when [`Link::room`] says it fits, and read only
//! when [`Link::next_len`] says one is there.
//!
//! Also an in-process link pair ([`pipe`]) for the engine's unit tests.
//!
//! Touched only by the thread that calls MPI (the engine's lock).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
