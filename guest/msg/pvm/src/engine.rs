//! Messages between tasks: UMP channels opened on first use, PVM messages
//! cut into frames that fit a channel's ring, and the queue of messages
//! that arrived and wait for `pvm_recv` (seed 000, "PVM": messages go
//! through UMP, with the intermediate buffers PVM's semantics need).
//!
//! A task listens on its UMP handle (made from its TID and the virtual
//! machine's number), and opens a channel to a task the first time it
//! sends to it; the receiver takes the channel at its next PVM call. Over
//! shared memory to a task of the same host (TID host field), over MEMORY
//! CHANNEL between guests.
//!
//! A send waits until its frames are in the ring (the receiver's ring
//! absorbs them, and the receiver's every PVM call drains its rings into
//! its queue), and while it waits it drains its own rings, so tasks that
//! send to each other at once never wait for each other for ever.
//!
//! Owned by the thread calling PVM (under the C layer's lock).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use thiserror::Error;
use ump::Channel;

/// What went wrong moving a message.
#[derive(Debug, Error)]
pub enum EngineError {
    #[error("UMP: {0}")]
    Ump(#[from] ump::UmpError),
    #[error("UMP channel to t{tid:x}: {err}")]
    Chan { tid: i32, err: ump::ChanError },
    #[error("task t{0:x} is not there (it exited, or never was)")]
    NoTask(i32),
    #[error("task t{tid:x} did not take the channel opened to it within {secs} s (is it in a PVM call?)")]
    NotTaken { tid: i32, secs: u64 },
    #[error("a message of {0} bytes is larger than PVM messages go (4 GiB)")]
    TooBig(usize),
}

/// First bytes of every frame.
const MAGIC: u32 = u32::from_le_bytes(*b"PVMf");
/// Bytes of a frame header: magic, source, tag, context, encoding,
/// message length, flags, message number.
pub const FRAME_HDR: usize = 32;
const FIRST: u32 = 1;
const LAST: u32 = 2;

/// How long a send waits for the receiver to take a new channel.
pub const TAKE_TIMEOUT: Duration = Duration::from_secs(60);
/// How often a waiting task checks that the task it waits for exists.
const CHECK_EVERY: Duration = Duration::from_millis(250);
/// How often a task takes the channels other tasks opened to it: the
/// first message on a new channel waits up to this long.
const ACCEPT_EVERY: Duration = Duration::from_millis(1);

/// A message that arrived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Msg {
    pub src: i32,
    pub tag: i32,
    pub ctx: i32,
    pub enc: i32,
    pub data: Vec<u8>,
}

/// A frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    pub src: i32,
    pub tag: i32,
    pub ctx: i32,
    pub enc: i32,
    pub total: u32,
    pub flags: u32,
    pub seq: u32,
}

impl Frame {
    pub fn encode(&self) -> [u8; FRAME_HDR] {
        let mut h = [0u8; FRAME_HDR];
        let words = [
            MAGIC,
            self.src as u32,
            self.tag as u32,
            self.ctx as u32,
            self.enc as u32,
            self.total,
            self.flags,
            self.seq,
        ];
        for (c, w) in h.chunks_exact_mut(4).zip(words) {
            c.copy_from_slice(&w.to_le_bytes());
        }
        h
    }

    pub fn decode(f: &[u8]) -> Option<Frame> {
        if f.len() < FRAME_HDR {
            return None;
        }
        let w = |i: usize| u32::from_le_bytes([f[i * 4], f[i * 4 + 1], f[i * 4 + 2], f[i * 4 + 3]]);
        (w(0) == MAGIC).then(|| Frame {
            src: w(1) as i32,
            tag: w(2) as i32,
            ctx: w(3) as i32,
            enc: w(4) as i32,
            total: w(5),
            flags: w(6),
            seq: w(7),
        })
    }
}

/// Cuts a message into frames of at most `max` bytes.
pub fn frames(head: Frame, data: &[u8], max: usize) -> Vec<Vec<u8>> {
    let room = max.saturating_sub(FRAME_HDR).max(1);
    let n = data.len().div_ceil(room).max(1);
    (0..n)
        .map(|i| {
            let part = &data[(i * room).min(data.len())..((i + 1) * room).min(data.len())];
            let mut flags = 0;
            if i == 0 {
                flags |= FIRST;
            }
            if i == n - 1 {
                flags |= LAST;
            }
            let mut f = Vec::with_capacity(FRAME_HDR + part.len());
            f.extend_from_slice(&Frame { flags, ..head }.encode());
            f.extend_from_slice(part);
            f
        })
        .collect()
}

/// Puts frames back together, per sender.
#[derive(Default)]
pub struct Assembler {
    partial: HashMap<i32, (Frame, Vec<u8>)>,
}

impl Assembler {
    /// Takes one frame; returns a whole message when this was its last
    /// frame, or an error for a frame that does not belong where it is.
    pub fn frame(&mut self, f: &[u8]) -> Result<Option<Msg>, String> {
        let h = Frame::decode(f).ok_or_else(|| format!("a frame of {} bytes without a PVM header", f.len()))?;
        let body = &f[FRAME_HDR..];
        if h.flags & FIRST != 0 {
            if self.partial.remove(&h.src).is_some() {
                return Err(format!("t{:x} started a message before ending the last", h.src));
            }
            self.partial.insert(h.src, (h, Vec::with_capacity(h.total as usize)));
        }
        let Some((first, data)) = self.partial.get_mut(&h.src) else {
            return Err(format!("a middle frame from t{:x} without its start", h.src));
        };
        if first.seq != h.seq || data.len() + body.len() > first.total as usize {
            self.partial.remove(&h.src);
            return Err(format!("frames of two messages from t{:x} mixed up", h.src));
        }
        data.extend_from_slice(body);
        if h.flags & LAST == 0 {
            return Ok(None);
        }
        let Some((first, data)) = self.partial.remove(&h.src) else { return Ok(None) };
        if data.len() != first.total as usize {
            return Err(format!("a message from t{:x} of {} bytes ended at {}", h.src, first.total, data.len()));
        }
        Ok(Some(Msg { src: first.src, tag: first.tag, ctx: first.ctx, enc: first.enc, data }))
    }
}

/// Whether message `m` is what a receive for (`tid`, `tag`, `ctx`)
/// wants (-1: any task, any tag).
pub fn matches(m: &Msg, tid: i32, tag: i32, ctx: i32) -> bool {
    (tid == -1 || m.src == tid) && (tag == -1 || m.tag == tag) && m.ctx == ctx
}

/// The UMP handle of task `tid` in virtual machine `vm`.
pub fn handle(vm: u16, tid: i32) -> u64 {
    0x5056_0000_0000_0000 | u64::from(vm) << 32 | u64::from(tid as u32)
}

/// A channel to another task.
struct Peer {
    id: i32,
    ch: Option<Arc<Channel>>,
}

/// The queue of arrived messages, in the order they came, and how many
/// at its back are new since the last [`Inbox::claim_fresh`] (message
/// handlers see each message once, as it arrives).
#[derive(Default)]
struct Inbox {
    q: VecDeque<Msg>,
    fresh: usize,
}

impl Inbox {
    fn push(&mut self, m: Msg) {
        self.q.push_back(m);
        self.fresh += 1;
    }

    /// Takes the first message `want` accepts.
    fn take(&mut self, want: impl Fn(&Msg) -> bool) -> Option<Msg> {
        let i = self.q.iter().position(want)?;
        if i + self.fresh >= self.q.len() {
            self.fresh -= 1;
        }
        self.q.remove(i)
    }

    /// Takes the new messages `want` accepts; all are old after.
    fn claim_fresh(&mut self, want: impl Fn(&Msg) -> bool) -> Vec<Msg> {
        let mut i = self.q.len() - self.fresh;
        let mut out = Vec::new();
        while i < self.q.len() {
            if want(&self.q[i]) {
                out.extend(self.q.remove(i));
            } else {
                i += 1;
            }
        }
        self.fresh = 0;
        out
    }
}

/// A task's messaging.
pub struct Engine {
    pub me: i32,
    vm: u16,
    peers: HashMap<i32, Peer>,
    inbox: Inbox,
    asm: Assembler,
    seq: u32,
    scratch: Vec<u8>,
    /// When [`Engine::progress`] last took the channels opened to us.
    accepted: Option<Instant>,
    /// Frames that did not belong (dropped), for `pvm_perror`-style reports.
    pub bad_frames: u64,
}

impl Engine {
    /// Starts UMP for task `me` and listens on its handle.
    pub fn start(me: i32, vm: u16) -> Result<Engine, EngineError> {
        ump::init(ump::Config::from_env().map_err(|e| ump::UmpError::Invalid(e.to_string()))?)?;
        ump::listen(handle(vm, me), ump::Want::Any)?;
        Ok(Engine {
            me,
            vm,
            peers: HashMap::new(),
            inbox: Inbox::default(),
            asm: Assembler::default(),
            seq: 0,
            scratch: Vec::new(),
            accepted: None,
            bad_frames: 0,
        })
    }

    /// One round: takes new channels, and drains every ring into the
    /// queue. Returns whether anything arrived.
    pub fn progress(&mut self) -> Result<bool, EngineError> {
        // Channels opened to us: at most every ACCEPT_EVERY (a look scans
        // this guest's inboxes and stats the listener's folder, which under
        // TCG cost more than the rest of an 8-byte message's poll).
        if self.accepted.is_none_or(|t| t.elapsed() >= ACCEPT_EVERY) {
            self.accepted = Some(Instant::now());
            for (id, remote) in ump::accept_new()? {
                let tid = remote as u32 as i32;
                self.peers.entry(tid).or_insert(Peer { id, ch: None });
            }
        }
        let mut moved = false;
        let mut gone = Vec::new();
        for (&tid, p) in self.peers.iter_mut() {
            if p.ch.is_none() {
                let ch = ump::chan(p.id)?;
                if !ch.poll_open() {
                    continue;
                }
                p.ch = Some(ch);
            }
            let Some(ch) = p.ch.as_ref() else { continue };
            while let Some(n) = ch.pending() {
                if self.scratch.len() < n {
                    self.scratch.resize(n, 0);
                }
                match ch.read(&mut self.scratch[..n], Some(Instant::now() + Duration::from_secs(10))) {
                    Ok(n) => match self.asm.frame(&self.scratch[..n]) {
                        Ok(Some(m)) => {
                            self.inbox.push(m);
                            moved = true;
                        }
                        Ok(None) => {}
                        Err(e) => {
                            self.bad_frames += 1;
                            eprintln!("libpvm [t{:x}]: dropped a frame from t{tid:x}: {e}", self.me);
                        }
                    },
                    Err(_) => {
                        gone.push(tid);
                        break;
                    }
                }
            }
            if ch.peer_closed() && ch.pending().is_none() {
                gone.push(tid);
            }
        }
        for tid in gone {
            if let Some(p) = self.peers.remove(&tid) {
                let _ = ump::close(p.id);
            }
        }
        Ok(moved)
    }

    /// Whether any channel is open (a daemon with one may get a request
    /// on it, which no listener would wake it for).
    pub fn has_peers(&self) -> bool {
        !self.peers.is_empty()
    }

    /// Closes the channel to `tid` (the other side reads what we sent
    /// before it sees the close).
    pub fn close(&mut self, tid: i32) {
        if let Some(p) = self.peers.remove(&tid) {
            let _ = ump::close(p.id);
        }
    }

    /// Takes the first queued message for (`tid`, `tag`, `ctx`).
    pub fn take(&mut self, tid: i32, tag: i32, ctx: i32) -> Option<Msg> {
        self.inbox.take(|m| matches(m, tid, tag, ctx))
    }

    /// Takes, in the order they came, the messages that arrived since the
    /// last call and `want` accepts (what message handlers claim); the
    /// others stay queued, no longer new.
    pub fn claim_fresh(&mut self, want: impl Fn(&Msg) -> bool) -> Vec<Msg> {
        self.inbox.claim_fresh(want)
    }

    /// The first queued message for (`tid`, `tag`, `ctx`), left queued.
    pub fn peek(&self, tid: i32, tag: i32, ctx: i32) -> Option<&Msg> {
        self.inbox.q.iter().find(|m| matches(m, tid, tag, ctx))
    }

    /// Sends a message to `dest`; returns once it is all in the channel.
    /// `exists` says whether a task is still there (the task table).
    pub fn send(
        &mut self,
        dest: i32,
        what: (i32, i32, i32),
        data: &[u8],
        exists: &mut dyn FnMut(i32) -> bool,
    ) -> Result<(), EngineError> {
        self.send_from(self.me, dest, what, data, exists)
    }

    /// [`Engine::send`] with `src` as the sender the receiver sees (a
    /// notification comes from the host's daemon TID, as in PVM).
    pub fn send_from(
        &mut self,
        src: i32,
        dest: i32,
        (tag, ctx, enc): (i32, i32, i32),
        data: &[u8],
        exists: &mut dyn FnMut(i32) -> bool,
    ) -> Result<(), EngineError> {
        let total = u32::try_from(data.len()).map_err(|_| EngineError::TooBig(data.len()))?;
        if dest == self.me {
            self.inbox.push(Msg { src, tag, ctx, enc, data: data.to_vec() });
            return Ok(());
        }
        let ch = self.open(dest, exists)?;
        self.seq = self.seq.wrapping_add(1);
        let head = Frame { src, tag, ctx, enc, total, flags: 0, seq: self.seq };
        let mut idle = 0u32;
        let mut checked = Instant::now();
        for f in frames(head, data, ch.max_unsplit()) {
            loop {
                let room = ch.room().map_err(|err| EngineError::Chan { tid: dest, err })?;
                if room >= f.len() {
                    ch.write(&f, Some(Instant::now() + Duration::from_secs(10)))
                        .map_err(|err| EngineError::Chan { tid: dest, err })?;
                    break;
                }
                if ch.peer_closed() || ch.is_closed() {
                    return Err(EngineError::NoTask(dest));
                }
                if self.progress()? {
                    idle = 0;
                }
                if checked.elapsed() > CHECK_EVERY {
                    checked = Instant::now();
                    if !exists(dest) {
                        return Err(EngineError::NoTask(dest));
                    }
                }
                backoff(&mut idle);
            }
        }
        Ok(())
    }

    /// The complete channel to `dest`, opened (and waited for) if needed.
    fn open(&mut self, dest: i32, exists: &mut dyn FnMut(i32) -> bool) -> Result<Arc<Channel>, EngineError> {
        if !self.peers.contains_key(&dest) {
            if !exists(dest) {
                return Err(EngineError::NoTask(dest));
            }
            // The TIDs' host fields say where the other task is: shared
            // memory on this machine, MEMORY CHANNEL between guests (a
            // task spawned here may not listen yet, so UMP could not tell).
            let want = if crate::table::host_of(dest) == crate::table::host_of(self.me) {
                ump::Want::Shm
            } else {
                ump::Want::Mc
            };
            let id = ump::open_or_join(handle(self.vm, self.me), handle(self.vm, dest), want)?;
            self.peers.insert(dest, Peer { id, ch: None });
        }
        let t0 = Instant::now();
        let mut checked = t0;
        let mut idle = 0u32;
        loop {
            self.progress()?;
            match self.peers.get(&dest) {
                Some(Peer { ch: Some(ch), .. }) => return Ok(ch.clone()),
                Some(_) => {}
                None => return Err(EngineError::NoTask(dest)),
            }
            if checked.elapsed() > CHECK_EVERY {
                checked = Instant::now();
                if !exists(dest) {
                    if let Some(p) = self.peers.remove(&dest) {
                        let _ = ump::close(p.id);
                    }
                    return Err(EngineError::NoTask(dest));
                }
                if let Some(p) = self.peers.get(&dest) {
                    let _ = ump::renotify(p.id);
                }
            }
            if t0.elapsed() > TAKE_TIMEOUT {
                return Err(EngineError::NotTaken { tid: dest, secs: TAKE_TIMEOUT.as_secs() });
            }
            backoff(&mut idle);
        }
    }

    /// Stops UMP at once (imcd is gone: every MEMORY CHANNEL mapping must
    /// go).
    pub fn stop(self) {
        let _ = ump::exit();
    }

    /// Waits (draining rings) until every task we wrote to has read it
    /// all, the task is gone, or `limit` passed; then stops UMP.
    pub fn finish(mut self, limit: Duration, exists: &mut dyn FnMut(i32) -> bool) {
        let t0 = Instant::now();
        let mut idle = 0u32;
        loop {
            let _ = self.progress();
            let waiting: Vec<i32> = self
                .peers
                .iter()
                .filter(|(_, p)| p.ch.as_ref().is_some_and(|c| c.consumed() < c.produced() && !c.peer_closed()))
                .map(|(&t, _)| t)
                .collect();
            if waiting.is_empty() || t0.elapsed() > limit || !waiting.iter().any(|&t| exists(t)) {
                break;
            }
            backoff(&mut idle);
        }
        let _ = ump::exit();
    }
}

/// How a waiting task waits: UMP's policy ([`ump::backoff`]): spins,
/// then yields (another task of this guest may need the CPU) for
/// `PVM_MC_YIELDS` polls (2,048), then naps that lengthen to 800 µs. With
/// 256 yields an 8-byte one-way time between guests was 400 µs (a nap's
/// wake-up under TCG costs ~380 µs) against our MPI's 73 µs.
pub fn backoff(idle: &mut u32) {
    static YIELDS: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    let yields = *YIELDS.get_or_init(|| {
        std::env::var("PVM_MC_YIELDS").ok().and_then(|v| v.parse().ok()).unwrap_or(ump::backoff::DEFAULT_YIELDS)
    });
    ump::backoff::backoff_until(idle, yields)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(src: i32, total: usize, seq: u32) -> Frame {
        Frame { src, tag: 7, ctx: 0, enc: 0, total: total as u32, flags: 0, seq }
    }

    #[test]
    fn messages_are_cut_to_the_ring_and_put_back_together() {
        for len in [0usize, 1, 31, 32, 33, 1000, 4096] {
            let data: Vec<u8> = (0..len).map(|i| (i * 13) as u8).collect();
            let fs = frames(head(0x40001, len, 1), &data, 64 + FRAME_HDR);
            assert_eq!(fs.len(), len.div_ceil(64).max(1));
            assert!(fs.iter().all(|f| f.len() <= 64 + FRAME_HDR));
            let mut a = Assembler::default();
            let mut out = None;
            for f in &fs {
                assert!(out.is_none());
                out = a.frame(f).unwrap();
            }
            let m = out.unwrap();
            assert_eq!((m.src, m.tag, m.data), (0x40001, 7, data));
        }
    }

    #[test]
    fn two_senders_interleave_and_bad_frames_are_refused() {
        let mut a = Assembler::default();
        let fa = frames(head(1, 100, 1), &[1u8; 100], 82);
        let fb = frames(head(2, 100, 1), &[2u8; 100], 82);
        assert_eq!(fa.len(), 2);
        assert_eq!(a.frame(&fa[0]).unwrap(), None);
        assert_eq!(a.frame(&fb[0]).unwrap(), None);
        assert_eq!(a.frame(&fb[1]).unwrap().unwrap().data, vec![2u8; 100]);
        assert_eq!(a.frame(&fa[1]).unwrap().unwrap().data, vec![1u8; 100]);
        assert!(a.frame(&[0u8; 10]).is_err());
        assert!(a.frame(&fa[1]).is_err(), "a middle frame without its start");
        let other = frames(head(1, 100, 2), &[3u8; 100], 82);
        assert_eq!(a.frame(&fa[0]).unwrap(), None);
        assert!(a.frame(&other[1]).is_err(), "frames of two messages");
    }

    #[test]
    fn handlers_see_each_message_once_as_it_arrives() {
        let m = |tag| Msg { src: 5, tag, ctx: 0, enc: 0, data: vec![] };
        let mut q = Inbox::default();
        q.push(m(1));
        q.push(m(2));
        assert_eq!(q.claim_fresh(|m| m.tag == 9).len(), 0);
        q.push(m(9));
        q.push(m(3));
        q.push(m(9));
        // A receive takes a new one: the count of new ones follows.
        assert_eq!(q.take(|m| m.tag == 3).unwrap().tag, 3);
        q.push(m(4));
        let got: Vec<i32> = q.claim_fresh(|m| m.tag != 4).iter().map(|m| m.tag).collect();
        assert_eq!(got, vec![9, 9], "only the new ones, in order; 1 and 2 came before");
        assert_eq!(q.claim_fresh(|_| true).len(), 0, "nothing new");
        let left: Vec<i32> = q.q.iter().map(|m| m.tag).collect();
        assert_eq!(left, vec![1, 2, 4]);
        // Taking an old message leaves the new count alone.
        q.push(m(5));
        assert_eq!(q.take(|m| m.tag == 1).unwrap().tag, 1);
        assert_eq!(q.claim_fresh(|_| true).iter().map(|m| m.tag).collect::<Vec<_>>(), vec![5]);
    }

    #[test]
    fn wildcards_match() {
        let m = Msg { src: 5, tag: 9, ctx: 0, enc: 0, data: vec![] };
        assert!(matches(&m, -1, -1, 0));
        assert!(matches(&m, 5, 9, 0));
        assert!(!matches(&m, 6, -1, 0));
        assert!(!matches(&m, -1, 8, 0));
        assert!(!matches(&m, -1, -1, 1));
        assert_ne!(handle(1, 0x40001), handle(2, 0x40001));
    }
}
