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
//! sequence word (the number of the collective that wrote it, from 1),
//! then up to [`DATA_MAX`] bytes of data. The data is stored before the
//! sequence word; one sender's stores arrive in order everywhere, so a
//! reader that sees sequence k sees k's data.
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

use thiserror::Error;

/// Bytes of one rank's slot.
pub const SLOT: usize = 128;
/// Bytes of one half of a slot.
pub const HALF: usize = SLOT / 2;
/// The most data one rank puts in one collective.
pub const DATA_MAX: usize = HALF - 8;

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
}

impl Board {
    /// Rank `rank` of `size` on board memory `mem` (all zero to start).
    pub fn new(mem: Box<dyn Mem>, rank: u32, size: u32) -> Board {
        Board { mem, rank, size, next: 1, done: 0, count: 0 }
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

    /// The highest collective rank `r` has written.
    pub fn seq(&self, r: u32) -> u64 {
        let at = r as usize * SLOT;
        self.mem.load(at).max(self.mem.load(at + HALF))
    }

    /// Whether this rank may write collective `k` now (see "Turns").
    pub fn may_post(&self, k: u64) -> bool {
        self.done + 1 == k && (0..self.size).all(|r| self.seq(r) + 1 >= k)
    }

    /// Writes collective `k`: `data` (at most [`DATA_MAX`] bytes), then
    /// the sequence word. Only when [`Board::may_post`] said so.
    pub fn post(&mut self, k: u64, data: &[u8]) {
        debug_assert!(data.len() <= DATA_MAX, "{} bytes on the board", data.len());
        let at = Self::half(self.rank, k);
        for (i, w) in data.chunks(8).enumerate() {
            let mut b = [0u8; 8];
            b[..w.len()].copy_from_slice(w);
            self.mem.store(at + 8 + i * 8, u64::from_ne_bytes(b));
        }
        self.mem.store(at, k);
        self.count += 1;
    }

    /// Whether rank `r` has written collective `k`.
    pub fn arrived(&self, r: u32, k: u64) -> bool {
        self.seq(r) >= k
    }

    /// The ranks that have not yet written collective `k`.
    pub fn missing(&self, k: u64) -> Vec<u32> {
        (0..self.size).filter(|&r| !self.arrived(r, k)).collect()
    }

    /// The `len` bytes rank `r` wrote with collective `k` (once arrived).
    pub fn data(&self, r: u32, k: u64, len: usize) -> Vec<u8> {
        let at = Self::half(r, k) + 8;
        let mut out: Vec<u8> = (0..len.div_ceil(8)).flat_map(|i| self.mem.load(at + i * 8).to_ne_bytes()).collect();
        out.truncate(len);
        out
    }

    /// This rank has read all it needs of collective `k`.
    pub fn finish(&mut self, k: u64) {
        self.done = self.done.max(k);
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
}
