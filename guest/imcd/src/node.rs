//! [`Node`]: one node's view of imcd's own MEMORY CHANNEL pages (layout in
//! `imc_proto::layout`): the host table, coherency acks, published error
//! counts; and the start-up announcement by which a new imcd joins
//! ([`Node::join`]).
//!
//! Read by both imcd threads; the main thread and the mapper each store
//! only their own words (host row and join at start-up, acks and error
//! counts in the mapper), so no lock is needed.

use std::time::{Duration, Instant, SystemTime};

use imc_proto::layout::{host, ACK_PAGE, ERRCNT_PAGE, HOST_PAGE, MAX_NODES};
use regs::PAGE_SIZE;

use crate::hw::Hw;

/// One node's imcd state in MEMORY CHANNEL space.
pub struct Node<H: Hw> {
    /// The adapter.
    pub hw: H,
    /// This node's id.
    pub me: usize,
}

/// How [`Node::join`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Joined {
    /// A running node sent us the directory.
    Served,
    /// No other node is up.
    First,
    /// Other nodes are up but none answered within the wait: we are the
    /// first imcd of the cluster.
    Unanswered,
}

impl std::fmt::Display for Joined {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Joined::Served => "sent the directory by a running node",
            Joined::First => "the first node of the cluster",
            Joined::Unanswered => "the first imcd of the cluster (nobody answered the join)",
        })
    }
}

/// A nonzero value that grows with time: tokens and relay sequence numbers
/// unlike any earlier run's.
pub fn now_ns() -> u64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1) | 1
}

impl<H: Hw> Node<H> {
    /// The node on `hw`.
    pub fn new(hw: H) -> Node<H> {
        let me = hw.me();
        Node { hw, me }
    }

    /// Word `idx` of imcd page `page`.
    pub fn word(&self, page: u64, idx: usize) -> u64 {
        self.hw.meta(page, idx)
    }

    /// Transmits word `idx` of imcd page `page`.
    pub fn put(&self, page: u64, idx: usize, v: u64) {
        self.hw.store64(page * PAGE_SIZE + idx as u64 * 8, v)
    }

    /// Word `w` of node `n`'s host row.
    pub fn host(&self, n: usize, w: usize) -> u64 {
        self.word(HOST_PAGE, n * host::ROW + w)
    }

    /// Transmits word `w` of node `n`'s host row.
    pub fn put_host(&self, n: usize, w: usize, v: u64) {
        self.put(HOST_PAGE, n * host::ROW + w, v)
    }

    /// Nodes the hub counts as up.
    pub fn members(&self) -> u64 {
        self.hw.members()
    }

    /// Nodes that are up and run a ready imcd.
    pub fn imcd_hosts(&self) -> u64 {
        self.ready_among(self.members())
    }

    /// Of the nodes in `members`, those that run a ready imcd.
    pub fn ready_among(&self, members: u64) -> u64 {
        (0..MAX_NODES).filter(|&n| members & (1 << n) != 0 && self.host(n, host::READY) != 0).fold(0, |b, n| b | 1 << n)
    }

    /// Node `n`'s host name.
    pub fn host_name(&self, n: usize) -> String {
        let bytes: Vec<u8> = (0..host::NAME_WORDS)
            .flat_map(|i| self.host(n, host::NAME + i).to_le_bytes())
            .take_while(|&b| b != 0)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Node `n`'s coherency ack of directory entry `entry`.
    pub fn ack(&self, entry: u32, n: usize) -> u64 {
        self.word(ACK_PAGE, entry as usize * MAX_NODES + n)
    }

    /// Acknowledges entry `entry` created at `ctime`.
    pub fn put_ack(&self, entry: u32, ctime: u64) {
        self.put(ACK_PAGE, entry as usize * MAX_NODES + self.me, ctime)
    }

    /// Announces this imcd (token, host name) and asks to be sent the
    /// directory; returns once a running node served the request, or no
    /// other node is up, or nobody answered within `wait`. Marks this node
    /// ready either way.
    pub fn join(&self, token: u64, name: &str, wait: Duration) -> Joined {
        let me = self.me;
        let mut bytes = [0u8; host::NAME_WORDS * 8];
        let keep = name.len().min(bytes.len() - 1);
        bytes[..keep].copy_from_slice(&name.as_bytes()[..keep]);
        self.put_host(me, host::TOKEN, token);
        for (i, w) in bytes.chunks_exact(8).enumerate() {
            let mut word = [0u8; 8];
            word.copy_from_slice(w);
            self.put_host(me, host::NAME + i, u64::from_le_bytes(word));
        }
        self.put_host(me, host::JOIN_SERVED, 0);
        self.put_host(me, host::JOIN_REQ, token);
        let t0 = Instant::now();
        let joined = loop {
            if self.host(me, host::JOIN_SERVED) == token {
                break Joined::Served;
            }
            if self.members() & !(1 << me) == 0 {
                break Joined::First;
            }
            if t0.elapsed() > wait {
                break Joined::Unanswered;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        self.put_host(me, host::READY, token);
        joined
    }

    /// Stores our host row (token, name, ready) and our error count again,
    /// about once a second: a node whose imcd set up its receive side
    /// after we first wrote them (all imcds start together at boot) would
    /// otherwise never have them. Our own copy comes back by loopback.
    pub fn reannounce(&self) {
        for w in (host::TOKEN..host::NAME + host::NAME_WORDS).chain([host::READY]) {
            let v = self.host(self.me, w);
            if v != 0 {
                self.put_host(self.me, w, v);
            }
        }
        self.put(ERRCNT_PAGE, self.me, self.word(ERRCNT_PAGE, self.me));
    }

    /// Error handling, once per mapper tick and on the ERROR interrupt:
    /// publishes this adapter's error count to every node (page 7) when it
    /// moved, clears the error bits it has counted (so an ACK answer with
    /// bits set means "not yet counted"), and writes the clusterwide sum
    /// over the members into the copy processes read.
    pub fn publish_errcount(&self, last: &mut Option<u64>) {
        let (status, count) = self.hw.errors();
        if *last != Some(count) {
            self.put(ERRCNT_PAGE, self.me, count);
            *last = Some(count);
        }
        if status != 0 {
            self.hw.clear_errors(status);
        }
        let m = self.members();
        let others: u64 =
            (0..MAX_NODES).filter(|&n| n != self.me && m & (1 << n) != 0).map(|n| self.word(ERRCNT_PAGE, n)).sum();
        self.hw.set_error_sum(count + others);
    }
}
