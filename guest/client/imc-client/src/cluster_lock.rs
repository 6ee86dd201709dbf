//! Cluster spinlocks on MEMORY CHANNEL: mutual exclusion across nodes from
//! nothing but the hub's total order and loopback (seed 000, "TruCluster
//! MEMORY CHANNEL Software": `imc_lkacquire`, `imc_lkrelease`).
//!
//! # The algorithm
//!
//! A lock is one 8-byte slot per node in a region every node receives, and
//! each node transmits its own slot with loopback. To acquire, node `i`:
//!
//! 1. waits until every slot reads 0 (the lock looks free);
//! 2. stores a fresh nonzero value into its slot (its *bid*) and waits until
//!    that value has come back through the hub: every write ordered before
//!    the bid is then applied locally too. The value must be fresh: a release
//!    still in flight would otherwise leave the previous bid's value in the
//!    slot, and the wait would end before the new bid was ordered;
//! 3. if every other slot reads 0, it holds the lock;
//! 4. otherwise, if some bidder has a lower node id it withdraws (stores 0,
//!    waits for that to come back) and starts again; if it has the lowest id
//!    of the bidders it keeps its bid and waits until the others withdraw.
//!
//! Release stores 0 into its slot.
//!
//! Mutual exclusion holds whatever the delays: if `i` and `k` both held the
//! lock with bids `b_i` before `b_k` in the total order, `k` checked after
//! `b_k` came back, so after `b_i` was applied at `k`, and saw `slot[i] = 0`,
//! which needs a withdrawal by `i` ordered between the two — but a holder
//! does not withdraw. The lowest-id rule only makes progress certain: two
//! bidders that see each other never both give up.
//!
//! The algorithm talks to the adapter through [`OrderedBus`], so it runs
//! unchanged on the real transmit window and receive buffer, and on the
//! simulated bus its tests use.

use std::time::{Duration, Instant};

/// How often imcd makes a store it waits to see come back again
/// ([`ClusterLock::resending`]). A store can be lost to this node alone (a
/// frame to it failed its CRC check): the others have it, we never will,
/// and without a second copy the wait would last until its deadline.
/// Storing the same value again is harmless: the others already have it,
/// and the wait ends at whichever copy comes back first, every write
/// ordered before that copy applied here too.
///
/// Only for a bus whose pages are never taken away from the writer
/// (imcd's own): a process whose attachments were revoked (docs/faults.md)
/// stores into pages with transmit off, and every copy would count one
/// more adapter error (20 a second) where one bid counted one.
pub const RESEND: Duration = Duration::from_millis(50);

/// What the lock needs from MEMORY CHANNEL: stores that go through the
/// hub's total order and come back to this node (loopback), and loads from
/// this node's receive copy.
pub trait OrderedBus {
    /// This node's slot index.
    fn node(&self) -> usize;
    /// Slots in the lock (nodes that may take it).
    fn slots(&self) -> usize;
    /// Transmits `v` into `slot` (all nodes, this one included, apply it in the total order).
    fn store(&self, slot: usize, v: u64);
    /// This node's current copy of `slot`.
    fn load(&self, slot: usize) -> u64;
}

/// A range of another bus's words, seen as a bus of its own. The lock and
/// the records it protects must share one total order (a release has to
/// come after the writes it protects), so they are windows of one bus.
#[derive(Clone)]
pub struct Window<B: OrderedBus> {
    bus: B,
    first: usize,
    len: usize,
}

impl<B: OrderedBus> Window<B> {
    /// Words `first .. first + len` of `bus`.
    pub fn new(bus: B, first: usize, len: usize) -> Self {
        assert!(first + len <= bus.slots(), "window {first}+{len} outside a bus of {} words", bus.slots());
        Window { bus, first, len }
    }
}

impl<B: OrderedBus> OrderedBus for Window<B> {
    fn node(&self) -> usize {
        self.bus.node()
    }
    fn slots(&self) -> usize {
        self.len
    }
    fn store(&self, slot: usize, v: u64) {
        assert!(slot < self.len, "word {slot} outside a window of {}", self.len);
        self.bus.store(self.first + slot, v)
    }
    fn load(&self, slot: usize) -> u64 {
        assert!(slot < self.len, "word {slot} outside a window of {}", self.len);
        self.bus.load(self.first + slot)
    }
}

/// Why an acquire gave up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LockError {
    /// The lock stayed held (or contested) past the deadline.
    #[error("lock still held by node(s) {holders:?} after {waited:?}")]
    Timeout {
        /// Nodes whose slots were set at the end.
        holders: Vec<usize>,
        /// How long we tried.
        waited: Duration,
    },
    /// Our own store never came back: the link is down.
    #[error("our own bid did not come back within {0:?}: is the link down?")]
    NoLoopback(Duration),
}

/// A cluster spinlock over an [`OrderedBus`].
pub struct ClusterLock<B: OrderedBus> {
    bus: B,
    /// Bids carry a fresh nonzero value each time: "my bid came back" must
    /// not be satisfied by an earlier bid whose release is still in flight.
    next_bid: std::cell::Cell<u64>,
    /// Store our own bids again this often while they are not back, and
    /// withdraw a bid given up on ([`ClusterLock::resending`]).
    resend: Option<Duration>,
}

impl<B: OrderedBus> ClusterLock<B> {
    /// Wraps a bus; the lock's slots must start at 0.
    pub fn new(bus: B) -> Self {
        Self::with_bid_base(bus, 0)
    }

    /// Like [`ClusterLock::new`], with bid values starting above `base`.
    /// Several processes that take turns on one node's slot need disjoint
    /// bid values (e.g. `pid << 32`), or one's stale bid could satisfy
    /// another's wait.
    pub fn with_bid_base(bus: B, base: u64) -> Self {
        ClusterLock { bus, next_bid: std::cell::Cell::new(base | 1), resend: None }
    }

    /// Stores a bid or a withdrawal again every `every` while it has not
    /// come back, and withdraws a bid when giving up on its coming back
    /// (see [`RESEND`]: for imcd's directory lock).
    pub fn resending(mut self, every: Duration) -> Self {
        self.resend = Some(every);
        self
    }

    /// Marks a bid of ours already in place (placed for us, e.g. by imcd
    /// when it created the lock set for us): we hold the lock.
    pub fn held_by_placed_bid(&self, bid: u64) {
        self.next_bid.set(bid.wrapping_add(1).max(1));
    }

    fn fresh_bid(&self) -> u64 {
        let b = self.next_bid.get();
        self.next_bid.set(b.wrapping_add(1).max(1));
        b
    }

    /// The bus (for the node id and the slots).
    pub fn bus(&self) -> &B {
        &self.bus
    }

    fn others_set(&self) -> Vec<usize> {
        let me = self.bus.node();
        (0..self.bus.slots()).filter(|&s| s != me && self.bus.load(s) != 0).collect()
    }

    /// Stores `v` into our slot and waits until it came back. Resending
    /// ([`ClusterLock::resending`]), it stores it again while it is not,
    /// and past the deadline withdraws (stores 0: a bid the others
    /// received but we did not would hold the lock for them).
    fn store_own(&self, v: u64, deadline: Instant) -> Result<(), LockError> {
        let me = self.bus.node();
        self.bus.store(me, v);
        let t0 = Instant::now();
        let mut sent = t0;
        while self.bus.load(me) != v {
            let now = Instant::now();
            if now > deadline {
                if self.resend.is_some() {
                    self.bus.store(me, 0);
                }
                return Err(LockError::NoLoopback(t0.elapsed()));
            }
            if self.resend.is_some_and(|every| now.duration_since(sent) >= every) {
                self.bus.store(me, v);
                sent = now;
            }
            std::hint::spin_loop();
        }
        Ok(())
    }

    /// Acquires the lock, giving up after `timeout`.
    pub fn acquire(&self, timeout: Duration) -> Result<(), LockError> {
        let t0 = Instant::now();
        let deadline = t0 + timeout;
        let me = self.bus.node();
        let timed_out = |s: &Self| LockError::Timeout { holders: s.others_set(), waited: t0.elapsed() };
        loop {
            // 1. Wait until the lock looks free.
            while !self.others_set().is_empty() {
                if Instant::now() > deadline {
                    return Err(timed_out(self));
                }
                std::hint::spin_loop();
            }
            // 2. Bid, and wait for this very bid to come back through the order.
            self.store_own(self.fresh_bid(), deadline)?;
            // 3./4. Judge only now.
            loop {
                let others = self.others_set();
                if others.is_empty() {
                    return Ok(());
                }
                if others.iter().any(|&o| o < me) {
                    // A lower id bids too: give way.
                    self.store_own(0, deadline)?;
                    break;
                }
                // We are the lowest bidder: keep the bid, the others withdraw.
                if Instant::now() > deadline {
                    self.store_own(0, deadline + Duration::from_secs(1))?;
                    return Err(timed_out(self));
                }
                std::hint::spin_loop();
            }
        }
    }

    /// Releases the lock (stores 0 into our slot; no wait).
    pub fn release(&self) {
        self.bus.store(self.bus.node(), 0);
    }

    /// Clears the slot of a node that failed while holding or bidding (the
    /// repair the surviving nodes do after a membership change).
    pub fn clear_failed(&self, node: usize) {
        self.bus.store(node, 0);
    }
}

/// A totally ordered bus simulated in memory, for tests: one sequencer, and
/// per node a receive copy applied in order with random lags. A node's link
/// can go down and up ([`sim::SimCluster::link_down`]): meanwhile its stores
/// are dropped and it misses, for good, every write ordered in between, as
/// the adapter does (docs/adapter.md, "Link").
pub mod sim {
    use std::collections::VecDeque;
    use std::ops::Range;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::{Arc, Condvar, Mutex};
    use std::thread;
    use std::time::Duration;

    use super::OrderedBus;

    /// `down_since` of a node whose link is up.
    const UP: u64 = u64::MAX;

    struct Inner {
        /// The total order: (slot, value).
        log: Mutex<Vec<(usize, u64)>>,
        grew: Condvar,
        /// Per node: its copy of the slots, and how far in the log it is.
        copies: Vec<Vec<AtomicU64>>,
        applied: Vec<AtomicU64>,
        /// Per node: the log length when its link went down, or [`UP`].
        down_since: Vec<AtomicU64>,
        /// Per node: the stretches of the log it missed while down.
        missed: Vec<Mutex<Vec<Range<u64>>>>,
        /// Per node: how many more writes reach it corrupted (not applied).
        corrupt: Vec<AtomicU64>,
        stop: AtomicBool,
    }

    impl Inner {
        /// Whether node `n` misses log entry `i` (its link was down when
        /// the entry was ordered). Reads `down_since` before `missed`:
        /// [`SimCluster::link_up`] records the stretch before it marks the
        /// link up, so one of the two always tells.
        fn misses(&self, n: usize, i: u64) -> bool {
            let since = self.down_since[n].load(Ordering::SeqCst);
            if since != UP && i >= since {
                return true;
            }
            self.missed[n].lock().unwrap().iter().any(|r| r.contains(&i))
        }
    }

    /// The simulated cluster; drop it to stop the delivery threads.
    pub struct SimCluster {
        inner: Arc<Inner>,
        threads: Vec<thread::JoinHandle<()>>,
    }

    /// One node's view of a [`SimCluster`].
    #[derive(Clone)]
    pub struct SimNode {
        inner: Arc<Inner>,
        node: usize,
    }

    impl SimCluster {
        /// `nodes` nodes with one slot each; each node applies the order with
        /// random lags of up to `max_lag` per write (seeded, so a failing run
        /// can be repeated).
        pub fn new(nodes: usize, max_lag: Duration, seed: u64) -> SimCluster {
            Self::with_slots(nodes, nodes, max_lag, seed)
        }

        /// Like [`SimCluster::new`] with `slots` words on the bus.
        pub fn with_slots(nodes: usize, slots: usize, max_lag: Duration, seed: u64) -> SimCluster {
            let inner = Arc::new(Inner {
                log: Mutex::new(Vec::new()),
                grew: Condvar::new(),
                copies: (0..nodes).map(|_| (0..slots).map(|_| AtomicU64::new(0)).collect()).collect(),
                applied: (0..nodes).map(|_| AtomicU64::new(0)).collect(),
                down_since: (0..nodes).map(|_| AtomicU64::new(UP)).collect(),
                missed: (0..nodes).map(|_| Mutex::new(Vec::new())).collect(),
                corrupt: (0..nodes).map(|_| AtomicU64::new(0)).collect(),
                stop: AtomicBool::new(false),
            });
            let threads = (0..nodes)
                .map(|n| {
                    let inner = inner.clone();
                    let mut rng = seed ^ (n as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                    thread::spawn(move || {
                        let mut pending: VecDeque<(u64, usize, u64)> = VecDeque::new();
                        let mut next = 0usize;
                        while !inner.stop.load(Ordering::Relaxed) {
                            {
                                let log = inner.log.lock().unwrap();
                                let log = if log.len() == next && pending.is_empty() {
                                    inner.grew.wait_timeout(log, Duration::from_millis(5)).unwrap().0
                                } else {
                                    log
                                };
                                pending.extend(
                                    log[next..].iter().enumerate().map(|(k, &(s, v))| ((next + k) as u64, s, v)),
                                );
                                next = log.len();
                            }
                            if let Some((i, slot, v)) = pending.pop_front() {
                                rng ^= rng << 13;
                                rng ^= rng >> 7;
                                rng ^= rng << 17;
                                let lag = max_lag.as_nanos() as u64;
                                if lag > 0 && rng % 4 == 0 {
                                    thread::sleep(Duration::from_nanos(rng % lag));
                                }
                                let corrupted = inner.corrupt[n]
                                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |c| c.checked_sub(1))
                                    .is_ok();
                                if !inner.misses(n, i) && !corrupted {
                                    inner.copies[n][slot].store(v, Ordering::SeqCst);
                                }
                                inner.applied[n].fetch_add(1, Ordering::SeqCst);
                            }
                        }
                    })
                })
                .collect();
            SimCluster { inner, threads }
        }

        /// Node `n`'s view.
        pub fn node(&self, n: usize) -> SimNode {
            SimNode { inner: self.inner.clone(), node: n }
        }

        /// Zeroes node `n`'s copy: a node that (re)joins late and has seen
        /// nothing. Call while nobody writes.
        pub fn wipe(&self, n: usize) {
            self.inner.copies[n].iter().for_each(|w| w.store(0, Ordering::SeqCst));
        }

        /// Node `n`'s link goes down: from now on its stores are dropped and
        /// it applies none of the writes ordered, until [`SimCluster::link_up`].
        pub fn link_down(&self, n: usize) {
            let log = self.inner.log.lock().unwrap();
            let _ = self.inner.down_since[n].compare_exchange(UP, log.len() as u64, Ordering::SeqCst, Ordering::SeqCst);
        }

        /// Node `n`'s link is back: it applies writes ordered from now on;
        /// those ordered while it was down are lost to it.
        pub fn link_up(&self, n: usize) {
            let log = self.inner.log.lock().unwrap();
            let since = self.inner.down_since[n].load(Ordering::SeqCst);
            if since == UP {
                return;
            }
            self.inner.missed[n].lock().unwrap().push(since..log.len() as u64);
            self.inner.down_since[n].store(UP, Ordering::SeqCst);
        }

        /// The next `count` writes to reach node `n` arrive corrupted and
        /// are not applied there (the hub's `corrupt`); the other nodes
        /// apply them.
        pub fn corrupt(&self, n: usize, count: u64) {
            self.inner.corrupt[n].store(count, Ordering::SeqCst);
        }

        /// Whether node `n`'s link is up.
        pub fn is_up(&self, n: usize) -> bool {
            self.inner.down_since[n].load(Ordering::SeqCst) == UP
        }

        /// Every write so far, in the total order.
        pub fn log(&self) -> Vec<(usize, u64)> {
            self.inner.log.lock().unwrap().clone()
        }
    }

    impl Drop for SimCluster {
        fn drop(&mut self) {
            self.inner.stop.store(true, Ordering::Relaxed);
            self.inner.grew.notify_all();
            for t in self.threads.drain(..) {
                let _ = t.join();
            }
        }
    }

    impl OrderedBus for SimNode {
        fn node(&self) -> usize {
            self.node
        }
        fn slots(&self) -> usize {
            self.inner.copies[self.node].len()
        }
        fn store(&self, slot: usize, v: u64) {
            let mut log = self.inner.log.lock().unwrap();
            // A node whose link is down drops its stores at the sender.
            if self.inner.down_since[self.node].load(Ordering::SeqCst) != UP {
                return;
            }
            log.push((slot, v));
            drop(log);
            self.inner.grew.notify_all();
        }
        fn load(&self, slot: usize) -> u64 {
            self.inner.copies[self.node][slot].load(Ordering::SeqCst)
        }
    }

    impl SimNode {
        /// Zeroes `slots` of this node's own copy (local memory: nothing
        /// goes on the bus).
        pub fn clear_local(&self, slots: Range<usize>) {
            self.inner.copies[self.node][slots].iter().for_each(|w| w.store(0, Ordering::SeqCst));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::thread;

    use super::sim::SimCluster;
    use super::*;

    /// Several nodes take the lock many times with random delivery lags:
    /// never two inside at once, and every increment of a plain
    /// read-modify-write counter survives.
    fn mutual_exclusion(nodes: usize, rounds: usize, lag: Duration, seed: u64) {
        let cluster = SimCluster::new(nodes, lag, seed);
        let inside = Arc::new(AtomicUsize::new(0));
        let counter = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..nodes)
            .map(|n| {
                let lock = ClusterLock::new(cluster.node(n));
                let (inside, counter) = (inside.clone(), counter.clone());
                thread::spawn(move || {
                    for _ in 0..rounds {
                        lock.acquire(Duration::from_secs(30)).expect("acquire");
                        assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two nodes hold the lock");
                        // A non-atomic increment: lost updates show a broken lock.
                        let v = counter.load(Ordering::SeqCst);
                        thread::yield_now();
                        counter.store(v + 1, Ordering::SeqCst);
                        inside.fetch_sub(1, Ordering::SeqCst);
                        lock.release();
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(counter.load(Ordering::SeqCst), nodes * rounds);
    }

    #[test]
    fn lock_is_exclusive_on_an_ordered_bus() {
        mutual_exclusion(2, 200, Duration::from_micros(50), 1);
        mutual_exclusion(3, 150, Duration::from_micros(200), 2);
        mutual_exclusion(6, 40, Duration::from_micros(100), 3);
    }

    #[test]
    fn uncontended_acquire_is_one_bid() {
        let cluster = SimCluster::new(3, Duration::ZERO, 7);
        let lock = ClusterLock::new(cluster.node(1));
        lock.acquire(Duration::from_secs(5)).unwrap();
        lock.release();
        lock.acquire(Duration::from_secs(5)).unwrap();
        assert_eq!(cluster.log(), vec![(1, 1), (1, 0), (1, 2)], "one store per bid, each bid a fresh value");
    }

    #[test]
    fn held_lock_times_out_and_failed_holder_is_cleared() {
        let cluster = SimCluster::new(3, Duration::ZERO, 9);
        let holder = ClusterLock::new(cluster.node(2));
        holder.acquire(Duration::from_secs(5)).unwrap();
        let waiter = ClusterLock::new(cluster.node(0));
        match waiter.acquire(Duration::from_millis(100)) {
            Err(LockError::Timeout { holders, .. }) => assert_eq!(holders, vec![2]),
            other => panic!("expected a timeout, got {other:?}"),
        }
        // Node 2 dies holding the lock; the survivors clear its slot.
        waiter.clear_failed(2);
        waiter.acquire(Duration::from_secs(5)).unwrap();
    }

    #[test]
    fn a_node_whose_link_is_down_drops_its_stores_and_misses_the_others() {
        let cluster = SimCluster::new(2, Duration::ZERO, 11);
        let (a, b) = (cluster.node(0), cluster.node(1));
        cluster.link_down(1);
        assert!(!cluster.is_up(1));
        b.store(1, 5);
        a.store(0, 7);
        // Its own bid never comes back: an acquire fails instead of hanging.
        match ClusterLock::new(cluster.node(1)).acquire(Duration::from_millis(50)) {
            Err(LockError::NoLoopback(_)) => {}
            other => panic!("expected NoLoopback, got {other:?}"),
        }
        cluster.link_up(1);
        a.store(0, 8);
        let t0 = Instant::now();
        while b.load(0) != 8 || a.load(0) != 8 {
            assert!(t0.elapsed() < Duration::from_secs(5), "writes after the rejoin never arrived");
            thread::yield_now();
        }
        assert_eq!(cluster.log(), vec![(0, 7), (0, 8)], "the stores made while down were dropped");
        // Node 1 missed 7 for good, and nothing of its own came back.
        assert_eq!((b.load(1), a.load(1)), (0, 0));
    }

    /// A bid lost to the bidder alone (the frame back to it corrupted; the
    /// others applied it) is stored again: the acquire succeeds at once,
    /// not at its deadline. If its own copies never come back at all, the
    /// acquire gives up and withdraws the bid the others hold.
    #[test]
    fn a_bid_lost_to_the_bidder_alone_is_sent_again_and_withdrawn_on_giving_up_when_resending() {
        let cluster = SimCluster::new(3, Duration::ZERO, 13);
        cluster.corrupt(0, 1);
        let lock = ClusterLock::new(cluster.node(0)).resending(RESEND);
        let t0 = Instant::now();
        lock.acquire(Duration::from_secs(10)).unwrap();
        assert!(t0.elapsed() < Duration::from_secs(2), "the acquire waited {:?} for a lost bid", t0.elapsed());
        assert!(cluster.log().len() >= 2, "the bid was stored again: {:?}", cluster.log());
        lock.release();
        let other = cluster.node(1);
        let t0 = Instant::now();
        while other.load(0) != 0 {
            assert!(t0.elapsed() < Duration::from_secs(5), "the release never reached node 1");
            thread::yield_now();
        }
        // Every frame back to node 0 is lost now.
        cluster.corrupt(0, u64::MAX);
        match lock.acquire(Duration::from_millis(300)) {
            Err(LockError::NoLoopback(_)) => {}
            other => panic!("expected NoLoopback, got {other:?}"),
        }
        let t0 = Instant::now();
        while !(other.load(0) == 0 && cluster.log().last() == Some(&(0, 0))) {
            assert!(t0.elapsed() < Duration::from_secs(5), "the bid node 1 received was not withdrawn");
            thread::yield_now();
        }
        cluster.corrupt(0, 0);
        lock.acquire(Duration::from_secs(5)).unwrap();
        lock.release();

        // Without resending (a process's lock: its pages can be revoked),
        // a lost bid is stored once and the acquire waits out its deadline.
        let plain = ClusterLock::new(cluster.node(2));
        let t0 = Instant::now();
        while plain.bus().load(0) != 0 {
            assert!(t0.elapsed() < Duration::from_secs(5), "node 0's release never reached node 2");
            thread::yield_now();
        }
        let before = cluster.log().len();
        cluster.corrupt(2, u64::MAX);
        assert!(matches!(plain.acquire(Duration::from_millis(300)), Err(LockError::NoLoopback(_))));
        assert_eq!(cluster.log().len(), before + 1, "one bid stored, nothing else: {:?}", &cluster.log()[before..]);
    }
}
