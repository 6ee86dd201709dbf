//! [`Node`]: one node's view of imcd's own MEMORY CHANNEL pages (layout in
//! `imc_proto::layout`): the host table, coherency acks, published error
//! counts; and the start-up announcement by which a new imcd joins
//! ([`Node::join`]).
//!
//! It also keeps the state of this node's own link ([`Node::watch_link`]):
//! the mapper notices an outage (MEMBERS without our bit, or a latched
//! LINK_DOWN) and, past the flap grace, revokes every attachment here; the
//! main thread then settles ([`crate::daemon::Daemon`]: re-synchronise, or
//! leave and rejoin). The policy is docs/faults.md, "Link flaps".
//!
//! Read by both imcd threads; the main thread and the mapper each store
//! only their own words (host row and join at start-up, acks and error
//! counts in the mapper), so no lock is needed; the link state is atomics
//! and one mutex.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use imc_proto::layout::{host, relay, ACK_PAGE, ERRCNT_PAGE, HOST_PAGE, MAX_NODES, RELAY_PAGE};
use regs::{err, PAGE_SIZE};

use crate::hw::Hw;
use crate::watch::Watches;

/// How often a waiting join stores its request again.
const JOIN_RESEND: Duration = Duration::from_millis(200);

/// How long a join waits, past its usual wait, while some other node runs
/// a ready imcd that could serve it (a server busy with a repair or a
/// late join of its own answers late, but answers): going on without its
/// directory would make a second cluster beside the first.
pub const SERVER_WAIT: Duration = Duration::from_secs(30);

/// One node's imcd state in MEMORY CHANNEL space.
pub struct Node<H: Hw> {
    /// The adapter.
    pub hw: H,
    /// This node's id.
    pub me: usize,
    link: LinkState,
    /// Our imcd token and host name, as [`Node::join`] announced them.
    ident: Mutex<(u64, String)>,
    /// Kicks sent ([`Node::kick`]).
    kicks: AtomicU64,
    /// Processes waiting for stores to a region ([`crate::watch`]).
    pub watches: Watches,
}

/// What the mapper saw of our own link, for the main thread.
#[derive(Default)]
struct LinkState {
    /// When the current outage began (as the mapper first saw it).
    down_since: Mutex<Option<Instant>>,
    /// An outage happened and the main thread has not settled it yet: our
    /// copy of the cluster's pages may miss writes, so we must not
    /// re-announce ourselves.
    unsettled: AtomicBool,
    /// The outage outlasted the grace: every attachment here was revoked,
    /// and the node must leave and rejoin as a new member.
    revoked: AtomicBool,
    /// Outages seen so far (a settle covers those up to its start).
    outages: AtomicU64,
}

/// What [`Node::watch_link`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// Up, and no outage since the last look.
    Up,
    /// Up again after an outage (or a latched LINK_DOWN).
    Back,
    /// Down now.
    Down,
}

/// How [`Node::join`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Joined {
    /// A running node sent us the directory.
    Served,
    /// No other node is up.
    First,
    /// Other nodes are up but none runs an imcd that could serve us (none
    /// is ready, or every ready one is waiting to be served too): we are
    /// the first imcd of the cluster, or every imcd lost its link at once.
    Unanswered,
    /// Nodes (a bit each) run a ready imcd that could serve us, and none
    /// did within [`SERVER_WAIT`]: we go on with the copy we have, and say
    /// so (their imcd is hung, or was killed and not restarted).
    Ignored(u64),
    /// Our own link went down again while we waited: nothing was decided
    /// (only a node back from an outage gets this; a newcomer keeps
    /// waiting).
    LinkDown,
    /// Every other node up runs an imcd that is joining as a newcomer too
    /// (the cluster is booting), and ours is the lowest-numbered: we go
    /// first at once and serve the others.
    Together,
}

impl std::fmt::Display for Joined {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Joined::Served => f.write_str("sent the directory by a running node"),
            Joined::First => f.write_str("the first node of the cluster"),
            Joined::Unanswered => f.write_str("the first imcd of the cluster (no imcd up could serve the join)"),
            Joined::Ignored(nodes) => write!(
                f,
                "nodes {:?} run imcd but none answered the join within {} s: going on with our own copy",
                (0..MAX_NODES).filter(|&n| nodes & (1 << n) != 0).collect::<Vec<_>>(),
                SERVER_WAIT.as_secs()
            ),
            Joined::LinkDown => f.write_str("our link went down again before anyone answered"),
            Joined::Together => f.write_str("the first of the imcds starting together (it serves the others)"),
        }
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
        Node {
            hw,
            me,
            link: LinkState::default(),
            ident: Mutex::new((0, String::new())),
            kicks: AtomicU64::new(0),
            watches: Watches::default(),
        }
    }

    /// Wakes every node's mapper now (a store to our kick word on the
    /// relay page, which interrupts): after a coherent region's entry (so
    /// the others receive and ack it at once, not at their next tick) and
    /// after a join request. MEMORY CHANNEL keeps our stores in order, so
    /// whatever we wrote before is there when the kick is.
    pub fn kick(&self) {
        let k = self.kicks.fetch_add(1, Ordering::Relaxed) + 1;
        self.put(RELAY_PAGE, self.me * relay::ROW + relay::KICK, k);
    }

    /// Looks at our own link (the mapper does, every tick): an outage is
    /// MEMBERS without our own bit (it reads 0 while the link is down), or
    /// LINK_DOWN latched in the error bits (an outage too short to be
    /// seen). An outage longer than `grace` revokes every attachment here
    /// at once, while the link is still down: the others repair this node
    /// out a little later, and its processes must not write pages by then.
    pub fn watch_link(&self, grace: Duration) -> Link {
        let up = self.members() & (1 << self.me) != 0;
        let latched = self.hw.errors().0 & err::LINK_DOWN != 0;
        let mut since = self.link.down_since.lock().unwrap_or_else(|e| e.into_inner());
        if !up {
            let first = since.is_none();
            let t = *since.get_or_insert_with(Instant::now);
            if first {
                self.link.outages.fetch_add(1, Ordering::SeqCst);
            }
            if !self.link.unsettled.swap(true, Ordering::SeqCst) {
                eprintln!("imcd: our link is down");
            }
            if t.elapsed() >= grace && !self.link.revoked.swap(true, Ordering::SeqCst) {
                self.hw.forget_all();
                eprintln!("imcd: link down for more than {grace:?}: every attachment here is revoked");
            }
            return Link::Down;
        }
        if since.take().is_some() || latched {
            if latched {
                self.link.outages.fetch_add(1, Ordering::SeqCst);
            }
            self.link.unsettled.store(true, Ordering::SeqCst);
            return Link::Back;
        }
        Link::Up
    }

    /// Whether an outage is waiting for the main thread to settle it: the
    /// number of outages so far, to hand back to [`Node::settled`].
    pub fn unsettled(&self) -> Option<u64> {
        self.link.unsettled.load(Ordering::SeqCst).then(|| self.link.outages.load(Ordering::SeqCst))
    }

    /// Whether the last outage outlasted the grace (attachments revoked).
    pub fn revoked(&self) -> bool {
        self.link.revoked.load(Ordering::SeqCst)
    }

    /// The main thread settled the outages up to number `upto` (what
    /// [`Node::unsettled`] said); a later one stays to settle.
    pub fn settled(&self, upto: u64) {
        let since = self.link.down_since.lock().unwrap_or_else(|e| e.into_inner());
        if since.is_none() && self.link.outages.load(Ordering::SeqCst) == upto {
            self.link.revoked.store(false, Ordering::SeqCst);
            self.link.unsettled.store(false, Ordering::SeqCst);
        }
    }

    /// Our token and host name (from the last [`Node::join`]).
    pub fn ident(&self) -> (u64, String) {
        self.ident.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Whether node `m` asked to be sent the directory and was not served
    /// yet (a newcomer, or a node re-synchronising after an outage): it
    /// serves nobody meanwhile.
    pub fn pending(&self, m: usize) -> bool {
        let req = self.host(m, host::JOIN_REQ);
        req != 0 && self.host(m, host::JOIN_SERVED) != req
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
        *self.ident.lock().unwrap_or_else(|e| e.into_inner()) = (token, name.to_string());
        let mut bytes = [0u8; host::NAME_WORDS * 8];
        let keep = name.len().min(bytes.len() - 1);
        bytes[..keep].copy_from_slice(&name.as_bytes()[..keep]);
        self.put_host(me, host::TOKEN, token);
        for (i, w) in bytes.chunks_exact(8).enumerate() {
            let mut word = [0u8; 8];
            word.copy_from_slice(w);
            self.put_host(me, host::NAME + i, u64::from_le_bytes(word));
        }
        let joined = self.wait_served(token, wait, true);
        self.put_host(me, host::READY, token);
        joined
    }

    /// Asks to be sent the directory with request `req` (fresh, nonzero)
    /// and waits until a running node served it, or no other node is up,
    /// or `wait` passed and no other node could serve it (past `wait`, it
    /// waits up to [`SERVER_WAIT`] more while one could), or our link went
    /// down again. Unserved, it marks the request served itself, so the
    /// others do not take this node for a newcomer for ever.
    pub fn ask_directory(&self, req: u64, wait: Duration) -> Joined {
        self.wait_served(req, wait, false)
    }

    /// The nodes in `others` that could serve a join: a ready imcd that is
    /// not itself waiting to be served.
    fn servers_among(&self, others: u64) -> u64 {
        self.ready_among(others) & !(0..MAX_NODES).filter(|&m| self.pending(m)).fold(0, |b, m| b | 1 << m)
    }

    /// [`Node::ask_directory`]; a `newcomer` (its request is its token)
    /// also stops waiting when it is the lowest-numbered of the nodes up
    /// and every other one is a newcomer waiting too ([`Joined::Together`]:
    /// nobody has a directory to send, and the others wait for us). The
    /// request, token and name are stored again every [`JOIN_RESEND`]: an
    /// imcd that set up its receive side after our first stores (all start
    /// together at boot) sees them then.
    fn wait_served(&self, req: u64, wait: Duration, newcomer: bool) -> Joined {
        let me = self.me;
        self.put_host(me, host::JOIN_SERVED, 0);
        self.put_host(me, host::JOIN_REQ, req);
        self.kick();
        let t0 = Instant::now();
        let mut sent = t0;
        let joined = loop {
            if self.host(me, host::JOIN_SERVED) == req {
                break Joined::Served;
            }
            let members = self.members();
            if members & (1 << me) == 0 && !newcomer {
                // MEMBERS reads 0 while our link is down: it says nothing
                // of the others, and nobody can serve us now.
                break Joined::LinkDown;
            }
            let others = members & !(1 << me);
            if others == 0 {
                break Joined::First;
            }
            if newcomer && self.all_newcomers_above(others) {
                break Joined::Together;
            }
            if t0.elapsed() > wait {
                let servers = self.servers_among(others);
                if servers == 0 {
                    break Joined::Unanswered;
                }
                if t0.elapsed() > wait + SERVER_WAIT {
                    break Joined::Ignored(servers);
                }
            }
            if sent.elapsed() >= JOIN_RESEND {
                sent = Instant::now();
                self.store_again(host::TOKEN..host::NAME + host::NAME_WORDS);
                self.put_host(me, host::JOIN_REQ, req);
                self.kick();
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        // Whatever the outcome: a re-send of the request may have gone out
        // after the server's "served", and an imcd whose receive side came
        // up between the two would take us for a newcomer for good.
        self.put_host(me, host::JOIN_SERVED, req);
        joined
    }

    /// Whether every node in `others` is numbered above us and is joining
    /// as a newcomer (its request is its token and not yet served, and it
    /// has never been ready: a member rejoining after an outage keeps
    /// announcing its old ready word, and holds a directory we must not
    /// replace with our empty one).
    fn all_newcomers_above(&self, others: u64) -> bool {
        (0..MAX_NODES).filter(|&m| others & (1 << m) != 0).all(|m| {
            let req = self.host(m, host::JOIN_REQ);
            m > self.me && self.pending(m) && req == self.host(m, host::TOKEN) && self.host(m, host::READY) == 0
        })
    }

    /// Stores our host row (token, name, ready) again, about once a
    /// second, and our error count when `errcount`: a node whose imcd set
    /// up its receive side after we first wrote them (all imcds start
    /// together at boot) would otherwise never have them. Our own copy
    /// comes back by loopback. The error count page interrupts every node,
    /// so the mapper asks for it only after a node became ready.
    pub fn reannounce(&self, errcount: bool) {
        self.store_again((host::TOKEN..host::NAME + host::NAME_WORDS).chain([host::READY]));
        if errcount {
            self.put(ERRCNT_PAGE, self.me, self.word(ERRCNT_PAGE, self.me));
        }
    }

    /// Stores words `ws` of our host row again, as our own copy has them.
    /// It comes back by loopback; a word not back yet reads 0 and is left
    /// for the next time.
    fn store_again(&self, ws: impl IntoIterator<Item = usize>) {
        for w in ws {
            let v = self.host(self.me, w);
            if v != 0 {
                self.put_host(self.me, w, v);
            }
        }
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
