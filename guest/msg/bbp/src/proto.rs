//! The Billboard Protocol itself (seed 002, section 3), over any [`Bus`]:
//! sending, multicast, receiving, buffer collection, the barrier, and the
//! repair of lost stores. Nothing here knows MEMORY CHANNEL: the real
//! transport is `mc`, the host's shared-memory file `shm`, and the tests
//! run the same code on the simulated ordered bus.
//!
//! Every word of the billboard has one writer (its share's process), so
//! nothing takes a lock. A process keeps a copy of everything it wrote
//! (its MESSAGE and ACK words, descriptors and data), so that it can store
//! any of it again when a store may have been lost ([`Endpoint::repost`]).
//!
//! Touched by the one thread that owns the [`Endpoint`] (the C layer holds
//! it under a lock).

use std::time::{Duration, Instant};

use imc_client::backoff;
use thiserror::Error;

use crate::layout::{Geometry, BUFFERS, FINALIZED, MAX_PROCS, RUNNING};

/// What the protocol needs from the memory the billboard lives in.
pub trait Bus: Send {
    /// Stores word `v` at word `w`; every other process sees one writer's
    /// stores in the order they were made.
    fn store(&self, w: usize, v: u64);
    /// Loads word `w` as this process last received it.
    fn load(&self, w: usize) -> u64;
    /// Stores `src` from word `w` on (the last word padded with zeros),
    /// ordered before any later [`Bus::store`].
    fn store_bytes(&self, w: usize, src: &[u8]) {
        for (i, c) in src.chunks(8).enumerate() {
            let mut b = [0u8; 8];
            b[..c.len()].copy_from_slice(c);
            self.store(w + i, u64::from_le_bytes(b));
        }
    }
    /// Loads `dst.len()` bytes from word `w` on.
    fn load_bytes(&self, w: usize, dst: &mut [u8]) {
        for (i, c) in dst.chunks_mut(8).enumerate() {
            let b = self.load(w + i).to_le_bytes();
            c.copy_from_slice(&b[..c.len()]);
        }
    }
    /// A count that moves whenever a store anywhere may have been lost
    /// (the adapter's error count and link events); 0 where none can be.
    fn errors(&self) -> u64 {
        0
    }
    /// Whether the process that published `who` (node << 32 | pid) is
    /// still there; Err says why not.
    fn alive(&self, _who: u64) -> Result<(), String> {
        Ok(())
    }
}

/// Message kinds (the low byte of a descriptor's second word).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// A message the program sent.
    User = 0,
    /// A barrier's null message.
    Barrier = 1,
}

/// Waits and repairs, in time.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// A process blocked this long stores its live words again, and again
    /// as often while it stays blocked (a store of them may be lost).
    pub repost_every: Duration,
    /// How often a waiting process checks the processes it waits on.
    pub check_every: Duration,
    /// How long a process that never published itself may keep others
    /// waiting.
    pub start_wait: Duration,
    /// Idle polls of a wait that yield before it naps
    /// ([`backoff::backoff_until`]; `BBP_YIELDS` in the environment).
    pub yields: u32,
    /// The same in a barrier, where every rank of the job may be waiting
    /// at once (`BBP_BARRIER_YIELDS`, else fewer on an oversubscribed
    /// host, as MPI's collectives).
    pub barrier_yields: u32,
    /// A wait this long naps [`Timing::long_nap`] at a time.
    pub long_wait: Duration,
    /// The nap of a long wait: the most a message that ends it may wait
    /// to be seen.
    pub long_nap: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            repost_every: Duration::from_millis(200),
            check_every: Duration::from_millis(20),
            start_wait: Duration::from_secs(60),
            yields: std::env::var("BBP_YIELDS").ok().and_then(|v| v.parse().ok()).unwrap_or(backoff::DEFAULT_YIELDS),
            barrier_yields: std::env::var("BBP_BARRIER_YIELDS").ok().and_then(|v| v.parse().ok()).unwrap_or_else(
                || {
                    if backoff::oversubscribed() {
                        backoff::OVERSUBSCRIBED_YIELDS
                    } else {
                        backoff::DEFAULT_YIELDS
                    }
                },
            ),
            long_wait: Duration::from_millis(50),
            long_nap: Duration::from_millis(5),
        }
    }
}

/// Why a call failed. Each limit names itself.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum BbpError {
    /// A message larger than a data partition.
    #[error("a message of {len} bytes is larger than a buffer can be (the data partition holds {max} bytes)")]
    TooBig {
        /// Bytes asked for.
        len: usize,
        /// The data partition's bytes.
        max: usize,
    },
    /// A rank that is not in the job (or is the caller, where that makes no sense).
    #[error("rank {rank} is out of range (ranks 0..{nprocs}, not the caller's own {me})")]
    Rank {
        /// The rank given.
        rank: i64,
        /// Processes in the job.
        nprocs: usize,
        /// The caller.
        me: usize,
    },
    /// An argument that makes no sense.
    #[error("bad argument: {0}")]
    Arg(String),
    /// The receive buffer cannot hold the message (it stays unreceived).
    #[error("a message of {len} bytes from rank {from} does not fit a buffer of {cap} bytes (left unreceived)")]
    Truncated {
        /// The message's bytes.
        len: usize,
        /// The buffer's bytes.
        cap: usize,
        /// Its sender.
        from: usize,
    },
    /// A process this call waits on died, left, finalized or never started.
    #[error("rank {rank}: {why}")]
    Peer {
        /// The rank.
        rank: usize,
        /// What happened to it.
        why: String,
    },
    /// Setting the billboard up failed.
    #[error("setting up the billboard: {0}")]
    Setup(String),
    /// A polling call found nothing.
    #[error("no message yet")]
    Again,
    /// The endpoint was finalized (or never initialized).
    #[error("BBP is not initialized (bbp_init first, nothing after bbp_finalize)")]
    NotInit,
}

/// What a receive got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    /// The sender.
    pub from: usize,
    /// Bytes of the message.
    pub len: usize,
}

/// A buffer in our data partition.
#[derive(Debug, Clone, Copy)]
struct Live {
    /// First data word, relative to the partition.
    off: usize,
    /// Words.
    words: usize,
    /// Receivers that have not acknowledged it yet.
    waiting: u64,
}

/// One process's end of a billboard.
pub struct Endpoint<B: Bus> {
    bus: B,
    geo: Geometry,
    me: usize,
    timing: Timing,
    /// Our MESSAGE words as we stored them (one per receiver).
    msg: Vec<u64>,
    /// Our ACK words as we stored them (one per sender): also what we have
    /// read of each sender's MESSAGE word.
    ack: Vec<u64>,
    /// Our descriptors as we stored them.
    desc: Vec<[u64; 4]>,
    /// Our data partition as we wrote it (for reposts).
    data: Vec<u8>,
    /// Buffers in use.
    live: [Option<Live>; BUFFERS],
    /// The sequence number of our next message.
    seq: u64,
    /// Per sender and kind: the sequence number of the last message of
    /// that kind we read from it.
    last_seq: Vec<[u64; 2]>,
    /// The sender after which a receive from any starts looking.
    rr: usize,
    /// The error count when we last reposted.
    errors_seen: u64,
    /// Messages sent, received, buffers collected, reposts, and messages
    /// found not (yet) intact.
    pub stats: Stats,
    /// When we first saw each rank unstarted.
    unstarted_since: Vec<Option<Instant>>,
    finalized: bool,
}

/// Counters of one endpoint.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    /// Messages posted (a multicast counts once).
    pub sent: u64,
    /// Messages received.
    pub received: u64,
    /// Buffers collected after every receiver acknowledged them.
    pub collected: u64,
    /// Times this process stored its live words again.
    pub reposts: u64,
    /// Times a flagged message did not check (a lost store, repaired by a repost).
    pub not_intact: u64,
}

/// The check of a descriptor and its data: a 64-bit hash over the
/// sender's rank, the descriptor's first three words and the data.
fn check(sender: usize, d: &[u64; 3], data: &[u8]) -> u64 {
    let mut h = 0x6a09_e667_f3bc_c909u64 ^ sender as u64;
    let mut mix = |v: u64| {
        h = (h ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        h ^= h >> 31;
    };
    d.iter().for_each(|&v| mix(v));
    for c in data.chunks(8) {
        let mut b = [0u8; 8];
        b[..c.len()].copy_from_slice(c);
        mix(u64::from_le_bytes(b));
    }
    h
}

impl<B: Bus> Endpoint<B> {
    /// Process `me` of a billboard shaped `geo` on `bus`, which publishes
    /// `who` (node << 32 | pid) for the others' liveness checks. Our share
    /// must read all zero (a fresh billboard).
    pub fn new(bus: B, geo: Geometry, me: usize, who: u64, timing: Timing) -> Result<Self, BbpError> {
        if geo.nprocs == 0 || geo.nprocs > MAX_PROCS {
            return Err(BbpError::Arg(format!("{} processes (1..={MAX_PROCS})", geo.nprocs)));
        }
        if me >= geo.nprocs {
            return Err(BbpError::Rank { rank: me as i64, nprocs: geo.nprocs, me });
        }
        if geo.data_bytes % 8 != 0 {
            return Err(BbpError::Arg(format!("a data partition of {} bytes (a multiple of 8)", geo.data_bytes)));
        }
        let n = geo.nprocs;
        if bus.load(geo.header(me)) != 0 || bus.load(geo.state(me)) != 0 {
            return Err(BbpError::Setup(format!(
                "share {me} of the billboard is in use (another process with this rank, or a job before this one)"
            )));
        }
        let ep = Endpoint {
            bus,
            geo,
            me,
            timing,
            msg: vec![0; n],
            ack: vec![0; n],
            desc: vec![[0; 4]; BUFFERS],
            data: vec![0; geo.data_bytes],
            live: [None; BUFFERS],
            seq: 0,
            last_seq: vec![[0; 2]; n],
            rr: me,
            errors_seen: 0,
            stats: Stats::default(),
            unstarted_since: vec![None; n],
            finalized: false,
        };
        let mut ep = ep;
        ep.errors_seen = ep.bus.errors();
        ep.bus.store(geo.who(me), who);
        ep.bus.store(geo.header(me), geo.header_word(me));
        ep.bus.store(geo.state(me), RUNNING);
        Ok(ep)
    }

    /// Our rank.
    pub fn rank(&self) -> usize {
        self.me
    }

    /// Processes in the job.
    pub fn nprocs(&self) -> usize {
        self.geo.nprocs
    }

    /// The largest message.
    pub fn max_message(&self) -> usize {
        self.geo.data_bytes
    }

    /// The bus (tests look at it).
    pub fn bus(&self) -> &B {
        &self.bus
    }

    fn live_state(&self) -> Result<(), BbpError> {
        if self.finalized {
            Err(BbpError::NotInit)
        } else {
            Ok(())
        }
    }

    fn rank_ok(&self, r: i64) -> Result<usize, BbpError> {
        if r < 0 || r as usize >= self.geo.nprocs || r as usize == self.me {
            return Err(BbpError::Rank { rank: r, nprocs: self.geo.nprocs, me: self.me });
        }
        Ok(r as usize)
    }

    /// Sends `data` to `dest`.
    pub fn send(&mut self, dest: i64, data: &[u8]) -> Result<(), BbpError> {
        self.live_state()?;
        let d = self.rank_ok(dest)?;
        self.post(1 << d, data, Kind::User)
    }

    /// Sends `data` to every rank of `dests` (each once, none the caller);
    /// `None` sends to every other rank.
    pub fn mcast(&mut self, dests: Option<&[i64]>, data: &[u8]) -> Result<(), BbpError> {
        self.live_state()?;
        let mask = self.mask_of(dests)?;
        if mask == 0 {
            return Ok(());
        }
        self.post(mask, data, Kind::User)
    }

    fn mask_of(&self, dests: Option<&[i64]>) -> Result<u64, BbpError> {
        let Some(dests) = dests else {
            return Ok((0..self.geo.nprocs).filter(|&r| r != self.me).fold(0, |m, r| m | 1 << r));
        };
        if dests.is_empty() {
            return Err(BbpError::Arg("a multicast to an empty list of ranks".into()));
        }
        let mut mask = 0u64;
        for &r in dests {
            let r = self.rank_ok(r)?;
            if mask & 1 << r != 0 {
                return Err(BbpError::Arg(format!("rank {r} is twice in the multicast list")));
            }
            mask |= 1 << r;
        }
        Ok(mask)
    }

    /// Allocates a buffer, writes descriptor and data, then sets the
    /// MESSAGE flags of every receiver in `mask`.
    fn post(&mut self, mask: u64, data: &[u8], kind: Kind) -> Result<(), BbpError> {
        if data.len() > self.geo.data_bytes {
            return Err(BbpError::TooBig { len: data.len(), max: self.geo.data_bytes });
        }
        for r in (0..self.geo.nprocs).filter(|r| mask & 1 << r != 0) {
            self.peer_usable(r)?;
        }
        let words = data.len().div_ceil(8);
        let (b, off) = self.allocate(words, mask)?;
        self.seq += 1;
        let d = [off as u64 | (data.len() as u64) << 32, self.seq << 8 | kind as u64, mask];
        let at = off * 8;
        self.data[at..at + data.len()].copy_from_slice(data);
        self.data[at + data.len()..at + words * 8].fill(0);
        let c = check(self.me, &d, &self.data[at..at + words * 8]);
        self.desc[b] = [d[0], d[1], d[2], c];
        self.bus.store_bytes(self.geo.data(self.me) + off, &self.data[at..at + words * 8]);
        for (k, &v) in self.desc[b].iter().enumerate() {
            self.bus.store(self.geo.desc(self.me, b) + k, v);
        }
        for r in (0..self.geo.nprocs).filter(|r| mask & 1 << r != 0) {
            self.msg[r] ^= 1 << b;
            self.bus.store(self.geo.msg(self.me, r), self.msg[r]);
        }
        self.stats.sent += 1;
        Ok(())
    }

    /// A receiver we may send to: not finalized (a dead one is found when
    /// we wait for its acknowledgement).
    fn peer_usable(&self, r: usize) -> Result<(), BbpError> {
        if self.bus.load(self.geo.state(r)) == FINALIZED {
            return Err(BbpError::Peer { rank: r, why: "finalized".into() });
        }
        Ok(())
    }

    /// Frees every buffer whose receivers have all acknowledged it (or
    /// finalized: they will never read it). Returns how many were freed.
    fn collect(&mut self) -> usize {
        let mut freed = 0;
        for b in 0..BUFFERS {
            let Some(mut l) = self.live[b] else { continue };
            let waiting = l.waiting;
            for r in (0..self.geo.nprocs).filter(|r| waiting & 1 << r != 0) {
                let acked = (self.bus.load(self.geo.ack(r, self.me)) ^ self.msg[r]) & 1 << b == 0;
                if acked || self.bus.load(self.geo.state(r)) == FINALIZED {
                    l.waiting &= !(1 << r);
                }
            }
            if l.waiting == 0 {
                self.live[b] = None;
                freed += 1;
            } else {
                self.live[b] = Some(l);
            }
        }
        self.stats.collected += freed as u64;
        freed
    }

    /// A free descriptor and `words` free words of the data partition
    /// (first fit), collecting acknowledged buffers when there is none.
    fn allocate(&mut self, words: usize, mask: u64) -> Result<(usize, usize), BbpError> {
        let mut w = Waiter::new();
        loop {
            if let Some(found) = self.fit(words) {
                let (b, off) = found;
                self.live[b] = Some(Live { off, words, waiting: mask });
                return Ok(found);
            }
            if self.collect() > 0 {
                continue;
            }
            // Wait on the receivers of the oldest buffers.
            let waiting = self.live.iter().flatten().fold(0, |m, l| m | l.waiting);
            self.tick(&mut w, waiting)?;
        }
    }

    fn fit(&self, words: usize) -> Option<(usize, usize)> {
        let b = self.live.iter().position(Option::is_none)?;
        let mut used: Vec<(usize, usize)> = self.live.iter().flatten().map(|l| (l.off, l.words)).collect();
        used.sort_unstable();
        let mut at = 0;
        for (off, n) in used {
            if off >= at + words {
                return Some((b, at));
            }
            at = at.max(off + n);
        }
        (at + words <= self.geo.data_bytes / 8).then_some((b, at))
    }

    /// Whether a message from `src` (a rank, or any when None) is waiting.
    pub fn msgavail(&mut self, src: Option<i64>) -> Result<bool, BbpError> {
        self.live_state()?;
        let senders = self.senders(src)?;
        Ok(senders.into_iter().any(|s| self.pending(s, Kind::User).is_some()))
    }

    fn senders(&self, src: Option<i64>) -> Result<Vec<usize>, BbpError> {
        Ok(match src {
            Some(s) => vec![self.rank_ok(s)?],
            None => {
                let n = self.geo.nprocs;
                // Every other rank once, starting after the last one served.
                (1..=n).map(|k| (self.rr + k) % n).filter(|&s| s != self.me).collect()
            }
        })
    }

    /// The oldest intact message of `kind` from `s`: (buffer, descriptor).
    /// None when there is none, or when one of the flagged messages does
    /// not check yet (a lost store: later ones wait, to keep the order).
    fn pending(&mut self, s: usize, kind: Kind) -> Option<(usize, [u64; 3])> {
        let flags = self.bus.load(self.geo.msg(s, self.me));
        let mut changed = flags ^ self.ack[s];
        let mut best: Option<(usize, [u64; 3])> = None;
        while changed != 0 {
            let b = changed.trailing_zeros() as usize;
            changed &= changed - 1;
            let Some(d) = self.intact(s, b, kind) else {
                self.stats.not_intact += 1;
                return None;
            };
            if d[1] & 0xff == kind as u64 && best.is_none_or(|(_, e)| d[1] >> 8 < e[1] >> 8) {
                best = Some((b, d));
            }
        }
        best
    }

    /// `s`'s buffer `b`'s descriptor, if it and the data check, name us
    /// and, when of `kind`, are newer than what we last read of that kind
    /// from `s` (a descriptor of the buffer's earlier use checks too, but
    /// is not newer, or does not name us).
    fn intact(&self, s: usize, b: usize, kind: Kind) -> Option<[u64; 3]> {
        let at = self.geo.desc(s, b);
        let d = [self.bus.load(at), self.bus.load(at + 1), self.bus.load(at + 2)];
        let c = self.bus.load(at + 3);
        let (off, len) = ((d[0] & 0xffff_ffff) as usize, (d[0] >> 32) as usize);
        let words = len.div_ceil(8);
        let k = (d[1] & 0xff) as usize;
        let stale = k > 1 || (k == kind as usize && d[1] >> 8 <= self.last_seq[s][k]);
        if d[2] & 1 << self.me == 0 || stale || off + words > self.geo.data_bytes / 8 {
            return None;
        }
        let mut data = vec![0u8; words * 8];
        self.bus.load_bytes(self.geo.data(s) + off, &mut data);
        (check(s, &d, &data) == c).then_some(d)
    }

    /// Receives the oldest message from `src` (any when None) into `buf`,
    /// waiting for one.
    pub fn recv(&mut self, src: Option<i64>, buf: &mut [u8]) -> Result<Received, BbpError> {
        self.recv_kind(src, buf, Kind::User, true)
    }

    /// As [`Endpoint::recv`], but [`BbpError::Again`] when nothing waits.
    pub fn try_recv(&mut self, src: Option<i64>, buf: &mut [u8]) -> Result<Received, BbpError> {
        self.recv_kind(src, buf, Kind::User, false)
    }

    fn recv_kind(&mut self, src: Option<i64>, buf: &mut [u8], kind: Kind, block: bool) -> Result<Received, BbpError> {
        self.live_state()?;
        let senders = self.senders(src)?;
        let mut w = Waiter::new();
        w.barrier = kind == Kind::Barrier;
        loop {
            for &s in &senders {
                if let Some((b, d)) = self.pending(s, kind) {
                    return self.take(s, b, d, buf);
                }
            }
            if !block {
                return Err(BbpError::Again);
            }
            let mask = senders.iter().fold(0u64, |m, &s| m | 1 << s);
            self.tick(&mut w, mask)?;
        }
    }

    /// Reads message `b` of `s` (descriptor `d`, found intact) into `buf`
    /// and acknowledges it. The bytes cannot change in between: `s` reuses
    /// the buffer only after our acknowledgement, and a repost stores the
    /// same bytes again.
    fn take(&mut self, s: usize, b: usize, d: [u64; 3], buf: &mut [u8]) -> Result<Received, BbpError> {
        let (off, len) = ((d[0] & 0xffff_ffff) as usize, (d[0] >> 32) as usize);
        if len > buf.len() {
            return Err(BbpError::Truncated { len, cap: buf.len(), from: s });
        }
        self.bus.load_bytes(self.geo.data(s) + off, &mut buf[..len]);
        self.ack[s] ^= 1 << b;
        self.bus.store(self.geo.ack(self.me, s), self.ack[s]);
        self.last_seq[s][(d[1] & 0xff) as usize] = d[1] >> 8;
        self.rr = s;
        self.stats.received += 1;
        Ok(Received { from: s, len })
    }

    /// The barrier of the paper's MPI: every rank sends a null message to
    /// rank 0, which multicasts one null message back to all.
    pub fn barrier(&mut self) -> Result<(), BbpError> {
        let all: Vec<usize> = (0..self.geo.nprocs).collect();
        self.barrier_group(&all)
    }

    /// The same barrier among the ranks of `group` (the first one
    /// coordinates); every rank of it calls this with the same list.
    pub fn barrier_group(&mut self, group: &[usize]) -> Result<(), BbpError> {
        self.live_state()?;
        let mut mask = 0u64;
        for &r in group {
            if r >= self.geo.nprocs || mask & 1 << r != 0 {
                return Err(BbpError::Arg(format!("barrier group {group:?}: rank {r} out of range or twice")));
            }
            mask |= 1 << r;
        }
        if mask & 1 << self.me == 0 {
            return Err(BbpError::Arg(format!("barrier group {group:?} without the caller, rank {}", self.me)));
        }
        let root = group[0];
        let others = mask & !(1 << root);
        if others == 0 {
            return Ok(());
        }
        if self.me == root {
            for &r in &group[1..] {
                self.recv_kind(Some(r as i64), &mut [], Kind::Barrier, true)?;
            }
            self.post(others, &[], Kind::Barrier)
        } else {
            self.post(1 << root, &[], Kind::Barrier)?;
            self.recv_kind(Some(root as i64), &mut [], Kind::Barrier, true).map(|_| ())
        }
    }

    /// Stores again every word we own that someone may still need: our
    /// MESSAGE and ACK words, and the descriptors and data of buffers not
    /// yet acknowledged by everyone. Idempotent: the same values again.
    pub fn repost(&mut self) {
        for b in 0..BUFFERS {
            let Some(l) = self.live[b] else { continue };
            let at = l.off * 8;
            self.bus.store_bytes(self.geo.data(self.me) + l.off, &self.data[at..at + l.words * 8]);
            for (k, &v) in self.desc[b].iter().enumerate() {
                self.bus.store(self.geo.desc(self.me, b) + k, v);
            }
        }
        for r in 0..self.geo.nprocs {
            self.bus.store(self.geo.msg(self.me, r), self.msg[r]);
            self.bus.store(self.geo.ack(self.me, r), self.ack[r]);
        }
        self.stats.reposts += 1;
    }

    /// One round of a wait on the ranks in `mask`: repairs (reposts when
    /// the error count moved, and every `repost_every`), checks that they
    /// are there (every `check_every`), and backs off.
    fn tick(&mut self, w: &mut Waiter, mask: u64) -> Result<(), BbpError> {
        // The project's waiting policy (spins, yields, lengthening naps):
        // a spinning rank takes the host core from the guests it waits for.
        // A wait that has lasted `long_wait` is on nobody's fast path (a
        // rank idle in a barrier while two others measure): it naps
        // `long_nap` at a time, since every wake-up costs a TCG guest
        // ~0.4 ms of host CPU.
        let yields = if w.barrier { self.timing.barrier_yields } else { self.timing.yields };
        if w.idle > yields && w.since.elapsed() > self.timing.long_wait {
            std::thread::sleep(self.timing.long_nap);
        } else {
            backoff::backoff_until(&mut w.idle, yields);
        }
        // The clock, only once spinning is over or every 64 spins.
        if w.idle < backoff::spin_rounds() && w.idle % 64 != 0 {
            return Ok(());
        }
        let now = Instant::now();
        if now.duration_since(w.last_check) >= self.timing.check_every {
            w.last_check = now;
            // The error count is a device read: not on every spin.
            let errors = self.bus.errors();
            if errors != self.errors_seen {
                self.errors_seen = errors;
                w.last_repost = now;
                self.repost();
            }
            self.check_peers(mask)?;
        }
        if now.duration_since(w.last_repost) >= self.timing.repost_every {
            w.last_repost = now;
            self.repost();
        }
        Ok(())
    }

    /// Err when a rank in `mask` died, left or never started; one that
    /// finalized is an error only when every rank in `mask` did.
    fn check_peers(&mut self, mask: u64) -> Result<(), BbpError> {
        let mut gone = None;
        let mut any = false;
        for r in (0..self.geo.nprocs).filter(|r| mask & 1 << r != 0) {
            any = true;
            let who = self.bus.load(self.geo.who(r));
            let state = self.bus.load(self.geo.state(r));
            if who == 0 {
                let since = *self.unstarted_since[r].get_or_insert_with(Instant::now);
                if since.elapsed() > self.timing.start_wait {
                    return Err(BbpError::Peer {
                        rank: r,
                        why: format!("never started (waited {:?})", self.timing.start_wait),
                    });
                }
                gone = Some(usize::MAX);
                continue;
            }
            if state == FINALIZED {
                gone.get_or_insert(r);
                continue;
            }
            if let Err(why) = self.bus.alive(who) {
                return Err(BbpError::Peer { rank: r, why });
            }
            gone = Some(usize::MAX);
        }
        match gone {
            Some(r) if any && r != usize::MAX => Err(BbpError::Peer { rank: r, why: "finalized".into() }),
            _ => Ok(()),
        }
    }

    /// Leaves the billboard: waits (up to `linger`) until every buffer we
    /// posted was read by its receivers, then marks us finalized, storing
    /// our words once more after any error that may have lost them.
    pub fn finalize(&mut self, linger: Duration) -> Result<(), BbpError> {
        self.live_state()?;
        let t0 = Instant::now();
        let mut w = Waiter::new();
        let mut result = Ok(());
        loop {
            self.collect();
            let waiting = self.live.iter().flatten().fold(0, |m, l| m | l.waiting);
            if waiting == 0 {
                break;
            }
            if t0.elapsed() > linger {
                let r = waiting.trailing_zeros() as usize;
                result = Err(BbpError::Peer { rank: r, why: format!("did not read our messages within {linger:?}") });
                break;
            }
            if let Err(e) = self.tick(&mut w, waiting) {
                result = Err(e);
                break;
            }
        }
        // Our last stores (the final acknowledgements, a barrier's
        // release, FINALIZED) have nobody to repost them once we are gone:
        // store them again until a spell passes with the error count
        // still, so none of them fell into a flap (up to `linger` more).
        let t1 = Instant::now();
        loop {
            self.repost();
            self.bus.store(self.geo.state(self.me), FINALIZED);
            let seen = self.bus.errors();
            std::thread::sleep(self.timing.check_every);
            if self.bus.errors() == seen || t1.elapsed() > linger {
                break;
            }
        }
        self.finalized = true;
        result
    }
}

/// The state of one wait.
struct Waiter {
    /// When the wait began.
    since: Instant,
    /// Polls that found nothing ([`backoff::backoff_until`]).
    idle: u32,
    /// A barrier's wait ([`Timing::barrier_yields`]).
    barrier: bool,
    last_repost: Instant,
    last_check: Instant,
}

impl Waiter {
    fn new() -> Waiter {
        let now = Instant::now();
        Waiter { since: now, idle: 0, barrier: false, last_repost: now, last_check: now }
    }
}
