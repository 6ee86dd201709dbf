//! A simulated cluster for imcd's in-process tests: nodes running the real
//! node logic ([`Daemon`] and [`Mapper`] threads) on a simulated ordered
//! bus (`imc_client::cluster_lock::sim`: one total order, per-node copies
//! applied with random lags), with a membership bitmap the test controls
//! (a node fails, or joins late), links that go down and up as the
//! adapter's do (docs/adapter.md, "Link": stores dropped, writes missed for
//! good, MEMBERS reading 0 on the node itself, one error counted and
//! LINK_DOWN latched), and a recorded signal service.
//!
//! Interrupts are simulated for what the adapter interrupts on: a store to
//! the relay or error-count page or to a page a node set INT on (which
//! also queues the page for that node, as the adapter's notification FIFO
//! does), a membership or link change, an error.
//! Each wakes every node's mapper after [`IRQ_LATENCY`], past the bus's
//! lags, so the store that raised it has arrived.
//!
//! Every node receives every page (a superset of what the adapter's page
//! control table would let through), which the node logic does not rely
//! on either way.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use imc_client::cluster_lock::sim::{SimCluster, SimNode};
use imc_client::cluster_lock::OrderedBus;
use imc_proto::layout::{ERRCNT_PAGE, RELAY_PAGE};
use imc_proto::{Reply, Request};
use regs::{err, PAGE_SIZE};

use crate::daemon::{Daemon, Settings};
use crate::hw::{Handout, Hw, HwError, Notified};
use crate::mapper::Mapper;
use crate::node::{now_ns, Joined, Node};
use crate::regions::{Cred, RegionDesc};

/// Words per page.
const PAGE_WORDS: usize = (PAGE_SIZE / 8) as usize;

/// From an event to the interrupt it raises on every node.
const IRQ_LATENCY: Duration = Duration::from_millis(2);

/// A signal the simulated service was asked to deliver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Signal {
    /// The node that delivered it.
    pub node: usize,
    /// Target process.
    pub pid: u64,
    /// Signal number.
    pub sig: u64,
    /// The sender's uid.
    pub uid: u64,
}

struct Shared {
    bus: SimCluster,
    pages: u64,
    members: AtomicU64,
    /// Nodes whose link is down (bit n: node n).
    down: AtomicU64,
    /// Per node: the adapter's error count and latched error bits.
    errors: Vec<(AtomicU64, AtomicU64)>,
    signals: Mutex<Vec<Signal>>,
    /// Pids the signal service answers ESRCH for.
    absent: Mutex<Vec<u64>>,
    /// Nodes whose adapter refuses to set up receive buffers (a node that
    /// is up but cannot take a region: its mapper never acks).
    deaf: AtomicU64,
    /// Interrupts raised so far, and their waiters.
    irqs: Mutex<u64>,
    irq: Condvar,
    /// Per node: the pages with INT set, and the notifications not yet taken.
    notify: Vec<Mutex<(HashSet<u64>, Vec<u64>)>>,
}

impl Shared {
    /// Raises an interrupt on every node.
    fn interrupt(&self) {
        *self.irqs.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        self.irq.notify_all();
    }
}

/// The simulated cluster.
#[derive(Clone)]
pub struct SimNet {
    shared: Arc<Shared>,
}

/// [`Hw`] of one simulated node.
pub struct SimHw {
    me: usize,
    bus: SimNode,
    shared: Arc<Shared>,
    received: Mutex<HashMap<u32, (u64, u64)>>,
    /// Regions with transmit enabled: id -> (first page, pages).
    transmitted: Mutex<HashMap<u32, (u64, u64)>>,
    /// Regions transmitted point-to-point: id -> destination node.
    p2p: Mutex<HashMap<u32, u16>>,
    error_sum: AtomicU64,
    /// Departures published ([`Hw::count_departure`]).
    departures: AtomicU64,
    /// The interrupts this node has taken.
    irqs_seen: AtomicU64,
}

/// A request to a simulated imcd: (request, credentials, client, where
/// the reply and its fd go).
type Call = (Request, Cred, u64, mpsc::Sender<(Reply, Option<File>)>);

/// A running simulated imcd: its daemon thread (with the mapper beside it).
pub struct Running {
    hw: Arc<SimHw>,
    stop: Arc<AtomicBool>,
    requests: Option<mpsc::Sender<Option<Call>>>,
    joined: mpsc::Receiver<Joined>,
    thread: Option<JoinHandle<()>>,
    /// Until when the daemon thread does nothing ([`Running::stall`]).
    stalled_until: Arc<Mutex<Option<std::time::Instant>>>,
}

impl SimNet {
    /// `nodes` nodes on a bus of `pages` pages, none up yet; lags up to
    /// `max_lag` per write, seeded with `seed`.
    pub fn new(nodes: usize, pages: u64, max_lag: Duration, seed: u64) -> SimNet {
        let bus = SimCluster::with_slots(nodes, pages as usize * PAGE_WORDS, max_lag, seed);
        SimNet {
            shared: Arc::new(Shared {
                bus,
                pages,
                members: AtomicU64::new(0),
                down: AtomicU64::new(0),
                errors: (0..nodes).map(|_| (AtomicU64::new(0), AtomicU64::new(0))).collect(),
                signals: Mutex::new(Vec::new()),
                absent: Mutex::new(Vec::new()),
                deaf: AtomicU64::new(0),
                irqs: Mutex::new(0),
                irq: Condvar::new(),
                notify: (0..nodes).map(|_| Mutex::new((HashSet::new(), Vec::new()))).collect(),
            }),
        }
    }

    /// Node `n`'s adapter, as a running imcd would use it.
    pub fn hw(&self, n: usize) -> Arc<SimHw> {
        Arc::new(SimHw {
            me: n,
            bus: self.shared.bus.node(n),
            shared: self.shared.clone(),
            received: Mutex::new(HashMap::new()),
            transmitted: Mutex::new(HashMap::new()),
            p2p: Mutex::new(HashMap::new()),
            error_sum: AtomicU64::new(0),
            departures: AtomicU64::new(0),
            irqs_seen: AtomicU64::new(*self.shared.irqs.lock().unwrap_or_else(|e| e.into_inner())),
        })
    }

    /// Brings node `n`'s link up and starts its imcd (host name `name`),
    /// with `settings`; returns at once ([`Running::joined`] waits).
    pub fn start(&self, n: usize, name: &str, settings: Settings) -> Running {
        self.shared.members.fetch_or(1 << n, Ordering::SeqCst);
        let hw = self.hw(n);
        self.shared.interrupt();
        let stop = Arc::new(AtomicBool::new(false));
        // `None` wakes the main thread (the mapper after an interrupt, or
        // a stop).
        let (tx, rx) = mpsc::channel::<Option<Call>>();
        let wake = tx.clone();
        let (jtx, jrx) = mpsc::channel();
        let (hw2, stop2, name) = (hw.clone(), stop.clone(), name.to_string());
        let stalled_until: Arc<Mutex<Option<std::time::Instant>>> = Arc::new(Mutex::new(None));
        let stall = stalled_until.clone();
        let thread = std::thread::Builder::new()
            .name(format!("sim-imcd-{n}"))
            .spawn(move || {
                let node = Node::new(hw2);
                let joined = node.join(now_ns(), &name, settings.join_wait);
                let mut d = Daemon::new(&node, settings).expect("directory on the simulated bus");
                let _ = jtx.send(joined);
                let woken = || {
                    let _ = wake.send(None);
                };
                std::thread::scope(|s| {
                    let mapper = Mapper::new(&node, settings.flap_grace).expect("directory on the simulated bus");
                    s.spawn(|| mapper.run(&stop2, &woken));
                    while !stop2.load(Ordering::Relaxed) {
                        let until = stall.lock().unwrap_or_else(|e| e.into_inner()).take();
                        if let Some(t) = until {
                            std::thread::sleep(t.saturating_duration_since(std::time::Instant::now()));
                        }
                        d.tick();
                        match rx.recv_timeout(d.next_tick()) {
                            Ok(Some((req, cred, client, reply))) => {
                                let _ = reply.send(d.handle(req, cred, client));
                            }
                            Ok(None) | Err(mpsc::RecvTimeoutError::Timeout) => {}
                            Err(mpsc::RecvTimeoutError::Disconnected) => stop2.store(true, Ordering::Relaxed),
                        }
                    }
                });
            })
            .expect("spawn a simulated imcd");
        Running { hw, stop, requests: Some(tx), joined: jrx, thread: Some(thread), stalled_until }
    }

    /// Node `n` fails: its link goes down (the survivors see it leave the
    /// membership) and its imcd stops.
    pub fn fail(&self, n: usize, r: Running) {
        self.shared.members.fetch_and(!(1 << n), Ordering::SeqCst);
        drop(r);
        self.shared.interrupt();
    }

    /// A new adapter for failed node `n` joins (its guest rebooting): the
    /// node is a member again, with an empty copy of the bus, and no imcd
    /// runs there until [`SimNet::start`] starts one.
    pub fn adapter_back(&self, n: usize) {
        self.shared.bus.wipe(n);
        self.shared.members.fetch_or(1 << n, Ordering::SeqCst);
        self.shared.interrupt();
    }

    /// Node `n`'s link goes down (its imcd keeps running): its stores are
    /// dropped, it misses every write ordered meanwhile, its MEMBERS reads
    /// 0 and the others see it leave; its adapter counts one error.
    pub fn link_down(&self, n: usize) {
        if self.shared.down.fetch_or(1 << n, Ordering::SeqCst) & (1 << n) == 0 {
            self.shared.bus.link_down(n);
            let (count, bits) = &self.shared.errors[n];
            count.fetch_add(1, Ordering::SeqCst);
            bits.fetch_or(err::LINK_DOWN as u64, Ordering::SeqCst);
        }
        self.shared.interrupt();
    }

    /// Node `n`'s link is back (same node id): it receives again, and the
    /// others see it rejoin.
    pub fn link_up(&self, n: usize) {
        self.shared.bus.link_up(n);
        self.shared.down.fetch_and(!(1 << n), Ordering::SeqCst);
        self.shared.interrupt();
    }

    /// Node `n`'s link goes down for `outage`, then comes back.
    pub fn flap(&self, n: usize, outage: Duration) {
        self.link_down(n);
        std::thread::sleep(outage);
        self.link_up(n);
    }

    /// Node `n`'s adapter error count.
    pub fn error_count(&self, n: usize) -> u64 {
        self.shared.errors[n].0.load(Ordering::SeqCst)
    }

    /// Puts `nodes` in MEMBERS without starting their imcds: adapters up,
    /// guests still booting, as when a whole cluster starts.
    pub fn power_on(&self, nodes: impl IntoIterator<Item = usize>) {
        for n in nodes {
            self.shared.members.fetch_or(1 << n, Ordering::SeqCst);
        }
        self.shared.interrupt();
    }

    /// Zeroes node `n`'s copy of the bus: a node that has seen nothing.
    pub fn wipe(&self, n: usize) {
        self.shared.bus.wipe(n);
    }

    /// Signals delivered so far.
    pub fn signals(&self) -> Vec<Signal> {
        self.shared.signals.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Makes the signal service answer ESRCH for `pid`.
    pub fn absent_pid(&self, pid: u64) {
        self.shared.absent.lock().unwrap_or_else(|e| e.into_inner()).push(pid);
    }

    /// Makes node `n`'s adapter refuse every receive buffer from now on.
    pub fn deafen(&self, n: usize) {
        self.shared.deaf.fetch_or(1 << n, Ordering::SeqCst);
    }
}

impl Running {
    /// How it joined (waits for the join to finish).
    pub fn joined(&self) -> Option<Joined> {
        self.joined.recv_timeout(Duration::from_secs(30)).ok()
    }

    /// The daemon thread does nothing for `d` from its next turn (no
    /// tick, no request; the mapper goes on): an imcd busy in a long
    /// repair or a lock wait.
    pub fn stall(&self, d: Duration) {
        *self.stalled_until.lock().unwrap_or_else(|e| e.into_inner()) = Some(std::time::Instant::now() + d);
        if let Some(tx) = &self.requests {
            let _ = tx.send(None);
        }
    }

    /// Sends request `req` as client `client` with `cred`; the reply.
    pub fn call(&self, req: Request, cred: Cred, client: u64) -> Option<Reply> {
        self.call_fd(req, cred, client).map(|(r, _)| r)
    }

    /// [`Running::call`], with the fd sent with the reply.
    pub fn call_fd(&self, req: Request, cred: Cred, client: u64) -> Option<(Reply, Option<File>)> {
        let (tx, rx) = mpsc::channel();
        self.requests.as_ref()?.send(Some((req, cred, client, tx))).ok()?;
        rx.recv_timeout(Duration::from_secs(60)).ok()
    }

    /// This node's adapter.
    pub fn hw(&self) -> &SimHw {
        &self.hw
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(r) = self.requests.take() {
            let _ = r.send(None);
        }
        self.hw.shared.interrupt();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl SimHw {
    /// Times this node published that it left the cluster.
    pub fn departures(&self) -> u64 {
        self.departures.load(Ordering::SeqCst)
    }

    /// The clusterwide error count this node publishes.
    pub fn error_sum(&self) -> u64 {
        self.error_sum.load(Ordering::SeqCst)
    }

    /// Where this node's stores to page `page` go: None when it does not
    /// transmit the page, Some(None) when it broadcasts them, Some(Some(n))
    /// when they go point-to-point to node n only.
    pub fn transmit_dest(&self, page: u64) -> Option<Option<u16>> {
        let tx = self.transmitted.lock().unwrap_or_else(|e| e.into_inner());
        let (id, _) = tx.iter().find(|(_, &(f, p))| (f..f + p).contains(&page))?;
        Some(self.p2p.lock().unwrap_or_else(|e| e.into_inner()).get(id).copied())
    }

    /// Whether this node has transmit enabled on MEMORY CHANNEL page `page`.
    pub fn transmits(&self, page: u64) -> bool {
        self.transmitted.lock().unwrap_or_else(|e| e.into_inner()).values().any(|&(f, p)| (f..f + p).contains(&page))
    }
}

impl Hw for SimHw {
    type Bus = SimNode;

    fn me(&self) -> usize {
        self.me
    }
    fn pages(&self) -> u64 {
        self.shared.pages
    }
    fn members(&self) -> u64 {
        let down = self.shared.down.load(Ordering::SeqCst);
        if down & (1 << self.me) != 0 {
            return 0;
        }
        self.shared.members.load(Ordering::SeqCst) & !down
    }
    fn store64(&self, addr: u64, v: u64) {
        self.bus.store((addr / 8) as usize, v);
        if self.members() & (1 << self.me) == 0 {
            return;
        }
        let page = addr / PAGE_SIZE;
        let mut watched = false;
        for n in &self.shared.notify {
            let mut n = n.lock().unwrap_or_else(|e| e.into_inner());
            if n.0.contains(&page) {
                n.1.push(page);
                watched = true;
            }
        }
        if watched || [RELAY_PAGE, ERRCNT_PAGE].contains(&page) {
            self.shared.interrupt();
        }
    }
    fn meta(&self, page: u64, idx: usize) -> u64 {
        self.bus.load(page as usize * PAGE_WORDS + idx)
    }
    fn dir_bus(&self) -> SimNode {
        // The directory is page 0: its words are the bus's first ones.
        self.bus.clone()
    }
    fn errors(&self) -> (u32, u64) {
        let (count, bits) = &self.shared.errors[self.me];
        (bits.load(Ordering::SeqCst) as u32, count.load(Ordering::SeqCst))
    }
    fn clear_errors(&self, bits: u32) {
        // LINK_DOWN cannot be cleared while the link is down.
        let keep = if self.shared.down.load(Ordering::SeqCst) & (1 << self.me) != 0 { err::LINK_DOWN } else { 0 };
        self.shared.errors[self.me].1.fetch_and(!((bits & !keep) as u64), Ordering::SeqCst);
    }
    fn set_error_sum(&self, sum: u64) {
        self.error_sum.store(sum, Ordering::SeqCst)
    }
    fn count_departure(&self) {
        self.departures.fetch_add(1, Ordering::SeqCst);
    }
    fn wait_event(&self, timeout: Duration, notified: &mut Notified) -> bool {
        let seen = self.irqs_seen.load(Ordering::SeqCst);
        let irqs = self.shared.irqs.lock().unwrap_or_else(|e| e.into_inner());
        let (irqs, _) =
            self.shared.irq.wait_timeout_while(irqs, timeout, |n| *n == seen).unwrap_or_else(|e| e.into_inner());
        let now = *irqs;
        drop(irqs);
        if now == seen {
            return false;
        }
        self.irqs_seen.store(now, Ordering::SeqCst);
        std::thread::sleep(IRQ_LATENCY);
        notified.pages.append(&mut self.shared.notify[self.me].lock().unwrap_or_else(|e| e.into_inner()).1);
        true
    }
    fn set_notify(&self, first: u64, pages: u64, on: bool) {
        let mut n = self.shared.notify[self.me].lock().unwrap_or_else(|e| e.into_inner());
        for p in first..first + pages {
            if on {
                n.0.insert(p);
            } else {
                n.0.remove(&p);
            }
        }
    }
    fn receive(&self, r: &RegionDesc) -> Result<(), HwError> {
        if self.shared.deaf.load(Ordering::SeqCst) & (1 << self.me) != 0 {
            return Err(HwError::Device(format!("node {} refuses receive buffers (test)", self.me)));
        }
        if (r.first_page + r.pages) > self.shared.pages {
            return Err(HwError::Device(format!("region {} past the simulated bus", r.id)));
        }
        self.received.lock().unwrap_or_else(|e| e.into_inner()).insert(r.id, (r.first_page, r.pages));
        Ok(())
    }
    fn region_word(&self, id: u32, off: u64) -> Option<u64> {
        let (first, pages) = *self.received.lock().unwrap_or_else(|e| e.into_inner()).get(&id)?;
        (off + 8 <= pages * PAGE_SIZE).then(|| self.bus.load(((first * PAGE_SIZE + off) / 8) as usize))
    }
    fn received(&self) -> Vec<(u32, u64, u64)> {
        self.received.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|(id, (f, p))| (*id, *f, *p)).collect()
    }
    fn forget(&self, id: u32) {
        self.received.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
        self.transmitted.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
        self.p2p.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
    }
    fn forget_stale(&self, id: u32, first: u64, pages: u64) {
        let mut rx = self.received.lock().unwrap_or_else(|e| e.into_inner());
        if rx.get(&id) != Some(&(first, pages)) {
            return;
        }
        rx.remove(&id);
        drop(rx);
        let mut tx = self.transmitted.lock().unwrap_or_else(|e| e.into_inner());
        if tx.get(&id) == Some(&(first, pages)) {
            tx.remove(&id);
            self.p2p.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
        }
    }
    fn forget_all(&self) {
        let mut ids: HashSet<u32> =
            self.transmitted.lock().unwrap_or_else(|e| e.into_inner()).keys().copied().collect();
        ids.extend(self.received.lock().unwrap_or_else(|e| e.into_inner()).keys());
        for id in ids {
            self.forget(id);
        }
    }
    fn clear_meta(&self, page: u64, words: std::ops::Range<usize>) {
        let base = page as usize * PAGE_WORDS;
        self.bus.clear_local(base + words.start..base + words.end);
    }
    fn transmit(&self, r: &RegionDesc, _loopback: bool, p2p: Option<u16>) {
        self.transmitted.lock().unwrap_or_else(|e| e.into_inner()).insert(r.id, (r.first_page, r.pages));
        let mut dests = self.p2p.lock().unwrap_or_else(|e| e.into_inner());
        match p2p {
            Some(d) => dests.insert(r.id, d),
            None => dests.remove(&r.id),
        };
    }
    fn signal(&self, pid: u64, sig: u64, uid: u64) -> u64 {
        if self.shared.absent.lock().unwrap_or_else(|e| e.into_inner()).contains(&pid) {
            return libc::ESRCH as u64;
        }
        self.shared.signals.lock().unwrap_or_else(|e| e.into_inner()).push(Signal { node: self.me, pid, sig, uid });
        0
    }
    fn handout(&self, what: Handout) -> Result<(u64, u64, Option<File>), HwError> {
        match what {
            Handout::Transmit { first_page, pages } => Ok((first_page * PAGE_SIZE, pages * PAGE_SIZE, None)),
            Handout::Receive { id } => {
                let (_, pages) = *self
                    .received
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(&id)
                    .ok_or(HwError::NotReceived(id))?;
                Ok((0, pages * PAGE_SIZE, None))
            }
            _ => Ok((0, PAGE_SIZE, None)),
        }
    }
}
