//! The job's billboard: one MEMORY CHANNEL region per job, received by
//! every node, in which each rank owns a slot that only it writes (seed
//! 002's Billboard Protocol; seed 000's broadcast). A store into a slot
//! reaches every node at once, so `MPI_COMM_WORLD`'s small collectives
//! take one round of stores instead of a tree of messages: a barrier is
//! one store per rank, an 8-byte broadcast or allreduce two.
//!
//! # Layout
//! A slot is [`SLOT`] bytes: two halves of [`HALF`] bytes, used by
//! alternate collectives (collective k uses half k mod 2). A half is a
//! sequence word, then up to [`DATA_MAX`] bytes of data. The sequence word
//! holds the number of the collective that wrote it (from 1) in its low 32
//! bits, the data words it wrote in the next 4, and a 28-bit check of the
//! rank, the number and those words in the top 28. The data is stored
//! before the sequence word, and one sender's stores arrive in order
//! everywhere.
//!
//! # Lost stores
//! A store can be lost on the way (a corrupted frame, a link flap: the
//! adapter counts an error, docs/faults.md). A reader takes collective k
//! from rank r only when r's half for k holds k and its data checks, so a
//! lost data store is never read as data, and a lost sequence store is
//! waited for. Each rank keeps a copy of its own slot; a rank that has
//! waited [`ASK_AFTER`] for others is told which ranks to ask
//! ([`Board::overdue`], again every [`ASK_EVERY`]), asks them over their
//! point-to-point channel (which repairs its own losses), and an asked
//! rank stores its whole slot again ([`Board::repost`]). The half a
//! waiting rank needs is still intact at the rank it waits for (see
//! "Turns": nobody is ever two collectives ahead of anyone).
//!
//! # Turns
//! Every rank numbers its board collectives 1, 2, ... in call order (MPI
//! has every rank call a communicator's collectives in the same order).
//! Rank r may write collective k when
//! - its own collective k−1 has finished (so it has read all it needed of
//!   k−1), and
//! - every rank's sequence is at least k−1: each has finished k−2, so
//!   nobody still reads the half that k is about to overwrite.
//!
//! A rank's sequence never moves more than one past the slowest rank's,
//! so the half of k is intact for as long as anyone may read it.
//!
//! Touched by the thread that calls MPI (under the C layer's lock); the
//! region is mapped twice, for transmit (with loopback, so a rank sees its
//! own slot like everyone else's) and for receive.

use std::time::{Duration, Instant};

use thiserror::Error;

/// Bytes of one rank's slot.
pub const SLOT: usize = 128;
/// Bytes of one half of a slot.
pub const HALF: usize = SLOT / 2;
/// The most data one rank puts in one collective.
pub const DATA_MAX: usize = HALF - 8;

/// A rank waiting this long on the board asks the ranks it waits for to
/// store their slots again (a store may have been lost).
pub const ASK_AFTER: Duration = Duration::from_millis(200);
/// And again this often while it still waits.
pub const ASK_EVERY: Duration = Duration::from_secs(1);

/// Words of a slot.
const SLOT_WORDS: usize = SLOT / 8;

/// The collective number a sequence word holds.
fn seq_number(w: u64) -> u64 {
    w & 0xFFFF_FFFF
}

/// The data words a sequence word says came with it.
fn seq_words(w: u64) -> usize {
    (w >> 32 & 0xF) as usize
}

/// The sequence word of collective `k` by rank `r` with data words `data`.
fn seq_word(r: u32, k: u64, data: &[u64]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ u64::from(r) << 32 ^ k;
    for w in data {
        h = (h ^ w).wrapping_mul(0x100_0000_01b3);
        h ^= h >> 29;
    }
    seq_number(k) | (data.len() as u64) << 32 | (h >> 36) << 36
}

/// Setting up a board failed (the job then runs without one).
#[derive(Debug, Error)]
pub enum BoardError {
    /// imcd refused or could not be reached.
    #[error("imcd: {0}")]
    Imc(#[from] imc_client::ImcError),
    /// The region imcd gave is smaller than the job needs.
    #[error("the board region has {got} bytes, {want} needed")]
    Small {
        /// Bytes mapped.
        got: usize,
        /// Bytes needed.
        want: usize,
    },
}

/// The memory a board lives in: stores go to every rank, loads see what
/// every rank stored (its own stores included).
pub trait Mem: Send {
    /// Stores word `v` at byte `off`.
    fn store(&self, off: usize, v: u64);
    /// Loads the word at byte `off`.
    fn load(&self, off: usize) -> u64;
}

/// A board in a MEMORY CHANNEL region.
struct Region {
    tx: imc_client::guest_mem::Mapping<imc_client::guest_mem::ReadWrite>,
    rx: imc_client::guest_mem::Mapping<imc_client::guest_mem::ReadOnly>,
    /// The connection that holds the region for this process.
    _imc: imc_client::Imc,
}

impl Mem for Region {
    fn store(&self, off: usize, v: u64) {
        // In bounds: the mapping was checked against the job's size.
        let _ = self.tx.store::<u64>(off, v);
    }
    fn load(&self, off: usize) -> u64 {
        self.rx.load::<u64>(off).unwrap_or(0)
    }
}

/// Bytes of the board of a job of `size` ranks.
pub fn bytes(size: u32) -> usize {
    size as usize * SLOT
}

/// The region key of job `job`'s board.
pub fn key(job: u32) -> u64 {
    imc_client::keys::Namespace::MpiBoard.key(job as u64)
}

/// Allocates (or finds) job `job`'s board through imcd, coherently, so
/// that every node receives it before any rank writes.
pub fn open(job: u32, rank: u32, size: u32) -> Result<Board, BoardError> {
    let imc = imc_client::Imc::connect()?;
    let want = bytes(size);
    let (id, ..) = imc.asalloc_flags(key(job), want as u64, 0o666, false, true)?;
    let tx = imc.asattach_tx(id, true)?;
    let rx = imc.asattach_rx(id)?;
    let got = tx.len().min(rx.len());
    if got < want {
        return Err(BoardError::Small { got, want });
    }
    Ok(Board::new(Box::new(Region { tx, rx, _imc: imc }), rank, size))
}

/// One rank's view of the board.
pub struct Board {
    mem: Box<dyn Mem>,
    rank: u32,
    size: u32,
    /// The number the next collective takes.
    next: u64,
    /// The last collective this rank finished.
    done: u64,
    /// Collectives run on the board (for `MCMPI_STATS`).
    pub count: u64,
    /// This rank's slot as it stored it (for [`Board::repost`]).
    mine: [u64; SLOT_WORDS],
    /// The collective this rank waits in, since when, and when it last
    /// asked others to store their slots again.
    waiting: Option<(u64, Instant, Option<Instant>)>,
    /// Times this rank stored its slot again, and asked others to.
    pub reposts: (u64, u64),
    /// [`ASK_AFTER`] and [`ASK_EVERY`] (shorter in tests).
    ask: (Duration, Duration),
}

impl Board {
    /// Rank `rank` of `size` on board memory `mem` (all zero to start).
    pub fn new(mem: Box<dyn Mem>, rank: u32, size: u32) -> Board {
        Board {
            mem,
            rank,
            size,
            next: 1,
            done: 0,
            count: 0,
            mine: [0; SLOT_WORDS],
            waiting: None,
            reposts: (0, 0),
            ask: (ASK_AFTER, ASK_EVERY),
        }
    }

    /// Waits before asking others to store their slots again, and between
    /// asks (tests make them short).
    pub fn set_ask_times(&mut self, after: Duration, every: Duration) {
        self.ask = (after, every);
    }

    /// Numbers a new collective (in call order).
    pub fn take(&mut self) -> u64 {
        let k = self.next;
        self.next += 1;
        k
    }

    fn half(r: u32, k: u64) -> usize {
        r as usize * SLOT + (k % 2) as usize * HALF
    }

    /// The highest collective rank `r` has written, as far as this rank
    /// has seen.
    pub fn seq(&self, r: u32) -> u64 {
        // Our own from our copy: what comes back by loopback may be lost too.
        let (a, b) = if r == self.rank {
            (self.mine[0], self.mine[HALF / 8])
        } else {
            let at = r as usize * SLOT;
            (self.mem.load(at), self.mem.load(at + HALF))
        };
        seq_number(a).max(seq_number(b))
    }

    /// Whether this rank may write collective `k` now (see "Turns").
    pub fn may_post(&self, k: u64) -> bool {
        self.done + 1 == k && (0..self.size).all(|r| self.seq(r) + 1 >= k)
    }

    /// Writes collective `k`: `data` (at most [`DATA_MAX`] bytes), then
    /// the sequence word. Only when [`Board::may_post`] said so.
    pub fn post(&mut self, k: u64, data: &[u8]) {
        debug_assert!(data.len() <= DATA_MAX, "{} bytes on the board", data.len());
        let mut words = [0u64; DATA_MAX / 8];
        let n = data.len().div_ceil(8);
        for (w, bytes) in words.iter_mut().zip(data.chunks(8)) {
            let mut b = [0u8; 8];
            b[..bytes.len()].copy_from_slice(bytes);
            *w = u64::from_ne_bytes(b);
        }
        let h = (k % 2) as usize * HALF / 8;
        self.mine[h] = seq_word(self.rank, k, &words[..n]);
        self.mine[h + 1..h + 1 + n].copy_from_slice(&words[..n]);
        self.store_half(h, n);
        self.count += 1;
        self.waiting = None;
    }

    /// Stores half `h` (its first word) of our slot from our copy: `n`
    /// data words, then the sequence word.
    fn store_half(&self, h: usize, n: usize) {
        let at = self.rank as usize * SLOT + h * 8;
        for i in 1..=n {
            self.mem.store(at + i * 8, self.mine[h + i]);
        }
        self.mem.store(at, self.mine[h]);
    }

    /// Stores this rank's whole slot again (another rank asked: a store of
    /// it may have been lost on the way there).
    pub fn repost(&mut self) {
        for h in [0, HALF / 8] {
            if self.mine[h] != 0 {
                self.store_half(h, seq_words(self.mine[h]));
            }
        }
        self.reposts.0 += 1;
    }

    /// Whether rank `r` has written collective `k` (its half for `k` holds
    /// `k`, and the data there checks).
    pub fn arrived(&self, r: u32, k: u64) -> bool {
        if r == self.rank {
            return self.seq(r) >= k;
        }
        let at = Self::half(r, k);
        let w = self.mem.load(at);
        let n = seq_words(w);
        if seq_number(w) != seq_number(k) || n > DATA_MAX / 8 {
            return false;
        }
        let mut data = [0u64; DATA_MAX / 8];
        for (i, d) in data[..n].iter_mut().enumerate() {
            *d = self.mem.load(at + (i + 1) * 8);
        }
        seq_word(r, k, &data[..n]) == w
    }

    /// Notes that this rank waits in collective `k` (for its turn, or for
    /// others' stores).
    pub fn waits(&mut self, k: u64) {
        if self.waiting.is_none_or(|(j, ..)| j != k) {
            self.waiting = Some((k, Instant::now(), None));
        }
    }

    /// The ranks to ask to store their slots again, when this rank has
    /// waited long enough in its collective for them (see "Lost stores").
    pub fn overdue(&mut self) -> Vec<u32> {
        let Some((k, since, asked)) = self.waiting else { return Vec::new() };
        if since.elapsed() < self.ask.0 || asked.is_some_and(|t| t.elapsed() < self.ask.1) {
            return Vec::new();
        }
        // Whoever we wait for: their turn's store (to post, we need
        // everyone at k-1), or their store of k.
        let want = if self.seq(self.rank) >= k { k } else { k - 1 };
        let late: Vec<u32> =
            (0..self.size).filter(|&r| r != self.rank && !(want == 0 || self.arrived(r, want))).collect();
        if !late.is_empty() {
            self.waiting = Some((k, since, Some(Instant::now())));
            self.reposts.1 += 1;
        }
        late
    }

    /// What this rank waits for on the board, in words, for a report of a
    /// wait that lasts.
    pub fn describe(&self) -> String {
        let seqs: Vec<u64> = (0..self.size).map(|r| self.seq(r)).collect();
        match self.waiting {
            Some((k, since, asked)) => format!(
                "board: collective {k}, waiting {:.1} s, last ask {:?} ago; missing {:?}; sequences {seqs:?}; \
                 stored again {} times, asked {} times",
                since.elapsed().as_secs_f64(),
                asked.map(|t| t.elapsed()),
                self.missing(k),
                self.reposts.0,
                self.reposts.1
            ),
            None => format!("board: not waiting; sequences {seqs:?}"),
        }
    }

    /// The ranks that have not yet written collective `k`.
    pub fn missing(&self, k: u64) -> Vec<u32> {
        (0..self.size).filter(|&r| !self.arrived(r, k)).collect()
    }

    /// The `len` bytes rank `r` wrote with collective `k` (once arrived).
    pub fn data(&self, r: u32, k: u64, len: usize) -> Vec<u8> {
        let at = Self::half(r, k) + 8;
        let word = |i: usize| {
            if r == self.rank {
                self.mine[(at - r as usize * SLOT) / 8 + i]
            } else {
                self.mem.load(at + i * 8)
            }
        };
        let mut out: Vec<u8> = (0..len.div_ceil(8)).flat_map(|i| word(i).to_ne_bytes()).collect();
        out.truncate(len);
        out
    }

    /// This rank has read all it needs of collective `k`.
    pub fn finish(&mut self, k: u64) {
        self.done = self.done.max(k);
        self.waiting = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    use std::sync::Arc;

    /// Shared words: every store visible to every rank (as a board with
    /// loopback), in order.
    #[derive(Clone)]
    struct Shared(Arc<Vec<AtomicU64>>);

    impl Mem for Shared {
        fn store(&self, off: usize, v: u64) {
            self.0[off / 8].store(v, Ordering::Release);
        }
        fn load(&self, off: usize) -> u64 {
            self.0[off / 8].load(Ordering::Acquire)
        }
    }

    fn boards(n: u32) -> Vec<Board> {
        let mem = Shared(Arc::new((0..bytes(n) / 8).map(|_| AtomicU64::new(0)).collect()));
        (0..n).map(|r| Board::new(Box::new(mem.clone()), r, n)).collect()
    }

    fn spin_until(mut f: impl FnMut() -> bool) {
        let t0 = std::time::Instant::now();
        while !f() {
            assert!(t0.elapsed().as_secs() < 20, "no progress for 20 s");
            std::thread::yield_now();
        }
    }

    /// Each rank runs `rounds` allreduces (a sum of rank * round) and
    /// barriers; the sums must be right and no rank may leave a barrier
    /// before every rank entered it, though ranks run at different speeds.
    #[test]
    fn barriers_and_allreduces_agree_at_any_speed() {
        let n = 5u32;
        let rounds = 400u64;
        let entered = Arc::new((0..rounds).map(|_| AtomicUsize::new(0)).collect::<Vec<_>>());
        let threads: Vec<_> = boards(n)
            .into_iter()
            .map(|mut b| {
                let entered = entered.clone();
                std::thread::spawn(move || {
                    let me = b.rank;
                    for round in 0..rounds {
                        // Allreduce.
                        let k = b.take();
                        spin_until(|| b.may_post(k));
                        b.post(k, &(u64::from(me) * round).to_ne_bytes());
                        spin_until(|| b.missing(k).is_empty());
                        let sum: u64 =
                            (0..n).map(|r| u64::from_ne_bytes(b.data(r, k, 8).try_into().expect("8 bytes"))).sum();
                        assert_eq!(sum, round * u64::from(n * (n - 1) / 2), "round {round} on rank {me}");
                        b.finish(k);
                        if (me + round as u32) % 3 == 0 {
                            std::thread::sleep(std::time::Duration::from_micros(200));
                        }
                        // Barrier.
                        entered[round as usize].fetch_add(1, Ordering::SeqCst);
                        let k = b.take();
                        spin_until(|| b.may_post(k));
                        b.post(k, &[]);
                        spin_until(|| b.missing(k).is_empty());
                        assert_eq!(entered[round as usize].load(Ordering::SeqCst), n as usize, "left early");
                        b.finish(k);
                    }
                    b.count
                })
            })
            .collect();
        for t in threads {
            assert_eq!(t.join().expect("rank thread"), 2 * rounds);
        }
    }

    /// A broadcast root runs ahead of slow readers by at most one
    /// collective, so every reader gets every value (a root that wrote on
    /// without waiting would overwrite a half before it was read).
    #[test]
    fn a_broadcast_root_never_overwrites_what_a_slow_rank_has_not_read() {
        let n = 3u32;
        let rounds = 300u64;
        let threads: Vec<_> = boards(n)
            .into_iter()
            .map(|mut b| {
                std::thread::spawn(move || {
                    let root = 0;
                    for round in 0..rounds {
                        let k = b.take();
                        spin_until(|| b.may_post(k));
                        if b.rank == root {
                            b.post(k, &(round * 7 + 1).to_ne_bytes());
                        } else {
                            b.post(k, &[]);
                            if b.rank == 2 {
                                std::thread::sleep(std::time::Duration::from_micros(300));
                            }
                            spin_until(|| b.arrived(root, k));
                            let got = u64::from_ne_bytes(b.data(root, k, 8).try_into().expect("8 bytes"));
                            assert_eq!(got, round * 7 + 1, "rank {} round {round}", b.rank);
                        }
                        b.finish(k);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("rank thread");
        }
    }

    /// Each rank's own copy of the board, as on a cluster: a store reaches
    /// every copy (its writer's too, by loopback) unless it is lost on the
    /// way, which happens to one store in `1 / lose_one_in`.
    #[derive(Clone)]
    struct Views {
        copies: Arc<Vec<Vec<AtomicU64>>>,
        me: usize,
        lose_one_in: u64,
        stores: Arc<AtomicU64>,
        lost: Arc<AtomicU64>,
    }

    impl Mem for Views {
        fn store(&self, off: usize, v: u64) {
            for copy in self.copies.iter() {
                let n = self.stores.fetch_add(1, Ordering::Relaxed);
                // A fixed scramble of the store's number: the same losses every run.
                if n.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(17) % self.lose_one_in == 0 {
                    self.lost.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                copy[off / 8].store(v, Ordering::Release);
            }
        }
        fn load(&self, off: usize) -> u64 {
            self.copies[self.me][off / 8].load(Ordering::Acquire)
        }
    }

    /// Stores are lost on the way, a data store or a sequence store, to
    /// another rank or back to the writer: no rank reads a lost store as
    /// data, and ranks that wait ask the ones they wait for to store their
    /// slots again, so every allreduce sums right and every barrier holds.
    #[test]
    fn lost_stores_are_asked_for_again_never_read() {
        let n = 4u32;
        let rounds = 200u64;
        let words = bytes(n) / 8;
        let copies: Arc<Vec<Vec<AtomicU64>>> =
            Arc::new((0..n).map(|_| (0..words).map(|_| AtomicU64::new(0)).collect()).collect());
        let (stores, lost) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let asked = Arc::new((0..n).map(|_| std::sync::atomic::AtomicBool::new(false)).collect::<Vec<_>>());
        let entered = Arc::new((0..rounds).map(|_| AtomicUsize::new(0)).collect::<Vec<_>>());
        let finished = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..n)
            .map(|me| {
                let mem = Views {
                    copies: copies.clone(),
                    me: me as usize,
                    lose_one_in: 23,
                    stores: stores.clone(),
                    lost: lost.clone(),
                };
                let mut b = Board::new(Box::new(mem), me, n);
                b.set_ask_times(std::time::Duration::from_millis(2), std::time::Duration::from_millis(2));
                let (asked, entered, finished) = (asked.clone(), entered.clone(), finished.clone());
                std::thread::spawn(move || {
                    // What a waiting rank does besides looking: serve asks, make them.
                    let wait = |b: &mut Board, k: u64, ready: &dyn Fn(&Board) -> bool| {
                        let t0 = std::time::Instant::now();
                        while !ready(b) {
                            assert!(t0.elapsed().as_secs() < 20, "rank {me}: no progress in collective {k}");
                            b.waits(k);
                            if asked[me as usize].swap(false, Ordering::SeqCst) {
                                b.repost();
                            }
                            for r in b.overdue() {
                                asked[r as usize].store(true, Ordering::SeqCst);
                            }
                            std::thread::yield_now();
                        }
                    };
                    for round in 0..rounds {
                        let k = b.take();
                        wait(&mut b, k, &|b| b.may_post(k));
                        b.post(k, &(u64::from(me) * round + 1).to_ne_bytes());
                        wait(&mut b, k, &|b| b.missing(k).is_empty());
                        let sum: u64 =
                            (0..n).map(|r| u64::from_ne_bytes(b.data(r, k, 8).try_into().expect("8 bytes"))).sum();
                        assert_eq!(
                            sum,
                            round * u64::from(n * (n - 1) / 2) + u64::from(n),
                            "round {round} on rank {me}"
                        );
                        b.finish(k);
                        entered[round as usize].fetch_add(1, Ordering::SeqCst);
                        let k = b.take();
                        wait(&mut b, k, &|b| b.may_post(k));
                        b.post(k, &[]);
                        wait(&mut b, k, &|b| b.missing(k).is_empty());
                        assert_eq!(entered[round as usize].load(Ordering::SeqCst), n as usize, "left early");
                        b.finish(k);
                    }
                    // Others may still wait for our last stores.
                    finished.fetch_add(1, Ordering::SeqCst);
                    while finished.load(Ordering::SeqCst) < n as usize {
                        if asked[me as usize].swap(false, Ordering::SeqCst) {
                            b.repost();
                        }
                        std::thread::yield_now();
                    }
                    b.reposts
                })
            })
            .collect();
        let reposts: Vec<(u64, u64)> = threads.into_iter().map(|t| t.join().expect("rank thread")).collect();
        let lost = lost.load(Ordering::Relaxed);
        assert!(lost > 50, "the test lost only {lost} stores");
        assert!(reposts.iter().map(|r| r.0).sum::<u64>() > 0, "nobody stored a slot again: {reposts:?}");
    }

    #[test]
    fn turns_wait_for_the_slowest_rank_and_data_round_trips() {
        let mut b = boards(3);
        let k = b[0].take();
        assert!(b[0].may_post(k), "every rank may write the first");
        let data: Vec<u8> = (1..=DATA_MAX as u8).collect();
        b[0].post(k, &data);
        b[0].finish(k);
        assert_eq!(b[1].data(0, k, DATA_MAX), data);
        assert_eq!(b[1].data(0, k, 3), &data[..3]);
        assert_eq!(b[1].missing(k), vec![1, 2]);
        let k2 = b[0].take();
        assert!(!b[0].may_post(k2), "ranks 1 and 2 have not written 1");
        for other in &mut b[1..] {
            let k = other.take();
            other.post(k, &[]);
        }
        assert!(b[0].may_post(k2));
        assert!(!b[1].may_post(2), "rank 1 has not finished 1");
        b[0].post(k2, &[9]);
        assert_eq!(b[2].seq(0), 2);
        assert_eq!(b[2].data(0, 1, DATA_MAX), data, "collective 1's half is intact");
        assert_eq!(b[0].count, 2);
    }

    /// The report of a wait names the collective, the ranks it waits for
    /// and everyone's sequence.
    #[test]
    fn a_wait_is_described_with_whom_it_waits_for() {
        let mut b = boards(3);
        assert!(b[1].describe().starts_with("board: not waiting"), "{}", b[1].describe());
        for x in b.iter_mut() {
            let k = x.take();
            assert!(x.may_post(k));
        }
        b[0].post(1, &[]);
        b[1].post(1, &[]);
        b[1].waits(1);
        let d = b[1].describe();
        assert!(d.contains("collective 1") && d.contains("missing [2]") && d.contains("sequences [1, 1, 0]"), "{d}");
    }
}
