//! `imcd`: the guest daemon that plays the Tru64 kernel subsystem of
//! TruCluster MEMORY CHANNEL Software (seed 000). One per guest, started by
//! the guest's init; it owns the adapter and answers `libimc`
//! (`imc_client`, and the C library) over `/run/imcd.sock`.
//!
//! # What lives where (MEMORY CHANNEL pages imcd keeps for itself)
//!
//! | page | contents |
//! |---|---|
//! | 0 | the region directory: its cluster lock and the CRDs ([`Regions`]) |
//! | 1–4 | coherency acks: word `entry * 64 + node` = the entry's ctime once `node` receives it |
//! | 5 | host table: row `n` (8 words) = imcd token, host name (4 words), join request, join served, ready |
//! | 6 | command relay: request mailbox of node `n` at word `n * 8`, its response at `512 + n * 8` |
//! | 7 | error counts: word `n` = node `n`'s adapter error count, as its imcd last published it |
//! | 8 | the ACK page `imc_ckerrcnt` stores to (answers land in `/dev/shm/imcd-ack`) |
//!
//! Pages 0–7 are transmitted with loopback and received by every imcd;
//! page 6 raises a notification interrupt. Regions get pages from 16 up.
//!
//! # Threads
//!
//! The main thread serves clients and does everything that takes the
//! directory lock (allocation, release, late-join service, failure
//! repair). The mapper thread (the paper's mapper process) never takes it:
//! it receives every coherent region and acks it, drops receive buffers of
//! freed regions, and serves the command relay. So a node blocked on the
//! directory lock still acks the coherent allocation holding it.

use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};
use guest_driver::guest_mem::{Mapping, ReadWrite};
use guest_driver::{rx_buffer, Adapter, Interrupt, RX_IOVA_BASE};
use imc_client::{self as imc, Reply, Request, IMCD_SOCKET, MAX_LINE};
use imcd::bus::AdapterBus;
use imcd::regions::{Access, Cred, RegionDesc, RegionError, Regions, FLAG_COHERENT};
use regs::{int, pct, reg, BAR_TX, NOTIFY_EMPTY, PAGE_SIZE};

/// MEMORY CHANNEL page holding the region directory.
const DIR_PAGE: u64 = 0;
/// First of the four coherency-ack pages.
const ACK_PAGE: u64 = 1;
/// The host table.
const HOST_PAGE: u64 = 5;
/// The command relay's mailboxes.
const RELAY_PAGE: u64 = 6;
/// Every node's published error count.
const ERRCNT_PAGE: u64 = 7;
/// imcd's own pages received by every node (the ACK page is apart).
const META_PAGES: u64 = 8;
/// The ACK page of `imc_ckerrcnt`.
const ACK_Q_PAGE: u64 = 8;
/// First page handed out to regions.
const DATA_FIRST: u64 = 16;
/// Nodes imcd keeps rows for (the hub's ports beyond this get no imcd).
const MAX_NODES: usize = 64;
/// Directory lock slots: one per possible node.
const LOCK_SLOTS: usize = MAX_NODES;
/// Directory entries (regions in the cluster): as many as fit in page 0
/// beside the lock (64 + 56 * 17 = 1016 of 1024 words).
const ENTRIES: usize = 56;
/// How often the main thread looks at membership and join requests.
const TICK_MS: libc::c_int = 20;
/// How often the mapper thread looks at the directory and the relay.
const MAPPER_TICK: Duration = Duration::from_millis(2);
/// Longest wait for the directory lock, a coherency ack, a relay answer.
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a newcomer waits to be sent the directory before deciding it
/// is the first imcd of the cluster.
const JOIN_WAIT: Duration = Duration::from_secs(3);

/// Key bit that puts spinlock sets in the region directory beside regions.
const LOCK_KEY: u64 = 1 << 63;
/// Slots per lock: one per possible node.
const LOCK_SLOTS_PER_LOCK: u64 = MAX_NODES as u64;
/// imcd's own bid values (processes use pid << 32, below this).
const IMCD_BID_BASE: u64 = 1 << 62;

/// Host table row words.
mod host {
    pub const TOKEN: usize = 0;
    pub const NAME: usize = 1;
    pub const NAME_WORDS: usize = 4;
    pub const JOIN_REQ: usize = 5;
    pub const JOIN_SERVED: usize = 6;
    pub const READY: usize = 7;
    pub const ROW: usize = 8;
}

/// Relay mailbox words (request row; the response row is [SEQ, STATUS]).
mod relay {
    pub const SEQ: usize = 0;
    pub const DEST: usize = 1;
    pub const SERVICE: usize = 2;
    pub const PID: usize = 3;
    pub const SIG: usize = 4;
    pub const UID: usize = 5;
    pub const STATUS: usize = 1;
    pub const ROW: usize = 8;
    pub const RESPONSES: usize = 512;
    /// Service: deliver a UNIX signal (`imc_kill`).
    pub const SIGNAL: u64 = 1;
}

fn iova(page: u64) -> u64 {
    RX_IOVA_BASE + page * PAGE_SIZE
}

fn now_ns() -> u64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1) | 1
}

fn peer_cred(s: &UnixStream) -> Cred {
    let mut c = libc::ucred { pid: 0, uid: u32::MAX, gid: u32::MAX };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED fills one ucred.
    unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut c as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    Cred { uid: c.uid, gid: c.gid }
}

fn refusal(e: &RegionError) -> Reply {
    let code = match e {
        RegionError::Exists(_) => "EXISTS",
        RegionError::Permission(_) => "PERMISSION",
        RegionError::SizeMismatch { .. } => "SIZE",
        RegionError::NoSpace { .. } => "NOSPACE",
        RegionError::TableFull(_) => "TABLEFULL",
        RegionError::NotFound(_) => "NOTFOUND",
        RegionError::Empty => "INVALID",
        RegionError::Lock(_) | RegionError::Toggle(_) => "CLUSTER",
    };
    Reply::Error { code: code.into(), message: e.to_string() }
}

fn error(code: &str, message: impl std::fmt::Display) -> Reply {
    Reply::Error { code: code.into(), message: message.to_string() }
}

/// The adapter and imcd's own pages, shared by both threads.
struct Node {
    a: Adapter,
    meta: Mapping<ReadWrite>,
    me: usize,
    /// The clusterwide error count as processes read it (`imc_rderrcnt`):
    /// one page of `/dev/shm`, mapped read-only by them, written here.
    errcount: Mapping<ReadWrite>,
    /// Answers to `imc_ckerrcnt`'s ACK-page stores (processes clear and
    /// read it through its file; held here for its DMA map).
    _ack_answers: Mapping<ReadWrite>,
}

impl Node {
    /// Stores our host row (token, name, ready) and our error count again,
    /// about once a second: a node whose imcd set up its receive side
    /// after we first wrote them (all imcds start together at boot) would
    /// otherwise never have them. Our own copy comes back by loopback.
    fn reannounce(&self) {
        for w in (host::TOKEN..host::NAME + host::NAME_WORDS).chain([host::READY]) {
            let v = self.host(self.me, w);
            if v != 0 {
                self.put_host(self.me, w, v);
            }
        }
        self.put(ERRCNT_PAGE, self.me, self.word(ERRCNT_PAGE, self.me));
    }

    /// Error handling, once per mapper tick and on the ERROR interrupt:
    /// publishes this adapter's error count to every node (page 5) when it
    /// moved, clears the error bits it has counted (so an ACK answer with
    /// bits set means "not yet counted"), and writes the clusterwide sum
    /// (members only) into the copy processes read.
    fn publish_errcount(&self, last: &mut Option<u64>) {
        let status = self.a.reg(reg::ERR_STATUS);
        let count = self.a.reg(reg::ERR_COUNT) as u64;
        if *last != Some(count) {
            self.put(ERRCNT_PAGE, self.me, count);
            *last = Some(count);
        }
        if status != 0 {
            self.a.set_reg(reg::ERR_STATUS, status);
        }
        let m = self.members();
        let others: u64 =
            (0..MAX_NODES).filter(|&n| n != self.me && m & (1 << n) != 0).map(|n| self.word(ERRCNT_PAGE, n)).sum();
        let _ = self.errcount.store::<u64>(0, count + others);
    }
}

impl Node {
    fn word(&self, page: u64, idx: usize) -> u64 {
        let off = (page * PAGE_SIZE) as usize + idx * 8;
        self.meta.load::<u64>(off).unwrap_or_else(|e| panic!("imcd page {page} word {idx}: {e}"))
    }

    fn put(&self, page: u64, idx: usize, v: u64) {
        self.a.store64(page * PAGE_SIZE + idx as u64 * 8, v)
    }

    fn host(&self, n: usize, w: usize) -> u64 {
        self.word(HOST_PAGE, n * host::ROW + w)
    }

    fn put_host(&self, n: usize, w: usize, v: u64) {
        self.put(HOST_PAGE, n * host::ROW + w, v)
    }

    /// Nodes the hub counts as up.
    fn members(&self) -> u64 {
        (self.a.reg(reg::MEMBERS_HI) as u64) << 32 | self.a.reg(reg::MEMBERS_LO) as u64
    }

    /// Nodes that are up and run a ready imcd.
    fn imcd_hosts(&self) -> u64 {
        self.ready_among(self.members())
    }

    /// Of the nodes in `members`, those that run a ready imcd.
    fn ready_among(&self, members: u64) -> u64 {
        (0..MAX_NODES).filter(|&n| members & (1 << n) != 0 && self.host(n, host::READY) != 0).fold(0, |b, n| b | 1 << n)
    }

    fn host_name(&self, n: usize) -> String {
        let bytes: Vec<u8> = (0..host::NAME_WORDS)
            .flat_map(|i| self.host(n, host::NAME + i).to_le_bytes())
            .take_while(|&b| b != 0)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    fn ack(&self, entry: u32, n: usize) -> u64 {
        self.word(ACK_PAGE, entry as usize * MAX_NODES + n)
    }
}

/// This node's receive buffers and transmit settings (both threads).
struct Io<'a> {
    n: &'a Node,
    /// Receive buffers: region id -> (buffer, its file, first page).
    rx: HashMap<u32, (Mapping<ReadWrite>, PathBuf, u64)>,
}

impl Io<'_> {
    /// Receive buffer for `r`, mapped for DMA and enabled in the PCT.
    fn receive(&mut self, r: &RegionDesc) -> Result<&(Mapping<ReadWrite>, PathBuf, u64)> {
        if !self.rx.contains_key(&r.id) {
            let a = &self.n.a;
            let path = PathBuf::from(format!("/dev/shm/imc-region-{}", r.id));
            let buf = rx_buffer(&path, r.pages)?;
            a.dev.map_dma(&buf, iova(r.first_page))?;
            for p in r.first_page..r.first_page + r.pages {
                let (bits, _) = a.page(p);
                a.set_page(p, bits | pct::RX, iova(p));
            }
            self.rx.insert(r.id, (buf, path, r.first_page));
        }
        Ok(&self.rx[&r.id])
    }

    /// Stops receiving region `id` here: receive and transmit off on its
    /// pages, then the buffer (and its DMA map) goes.
    fn forget(&mut self, id: u32) {
        let Some((buf, path, base)) = self.rx.remove(&id) else { return };
        let a = &self.n.a;
        let pages = buf.len() as u64 / PAGE_SIZE;
        for p in base..base + pages {
            let (bits, iova) = a.page(p);
            a.set_page(p, bits & !(pct::RX | pct::TX | pct::LOOPBACK), iova);
        }
        let _ = a.dev.unmap_dma(iova(base), pages * PAGE_SIZE);
        drop(buf);
        let _ = std::fs::remove_file(path);
    }

    /// Enables transmit (and loopback) on the pages of `r`.
    fn transmit(&self, r: &RegionDesc, loopback: bool) {
        let a = &self.n.a;
        for p in r.first_page..r.first_page + r.pages {
            let (bits, iova) = a.page(p);
            let lb = if loopback { pct::LOOPBACK } else { 0 };
            a.set_page(p, bits | pct::TX | lb, iova);
        }
    }

    /// Drops buffers of regions that were freed (by any node) or whose
    /// entry now describes another region.
    fn drop_stale(&mut self, live: &[RegionDesc]) {
        let stale: Vec<u32> = self
            .rx
            .iter()
            .filter(|(id, (buf, _, first))| {
                !live.iter().any(|r| r.id == **id && r.first_page == *first && r.pages * PAGE_SIZE == buf.len() as u64)
            })
            .map(|(id, _)| *id)
            .collect();
        for id in stale {
            self.forget(id);
        }
    }
}

/// The mapper thread: coherent regions, stale buffers, the relay.
fn mapper(n: &Node, io: &Mutex<Io>, bus: AdapterBus, irq: Option<&Interrupt>, stop: &AtomicBool) {
    let reader = match Regions::new(bus, LOCK_SLOTS, ENTRIES, DATA_FIRST..n.a.pages(), CLUSTER_TIMEOUT) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("imcd: mapper: {e}");
            return;
        }
    };
    let mut served = [0u64; MAX_NODES];
    let mut published = None;
    let mut ticks = 0u64;
    while !stop.load(Ordering::Relaxed) {
        ticks += 1;
        if ticks % 500 == 0 {
            n.reannounce();
        }
        match irq {
            Some(irq) => {
                if irq.wait(MAPPER_TICK).unwrap_or(0) > 0 {
                    let cause = n.a.reg(reg::INT_CAUSE);
                    n.a.set_reg(reg::INT_CAUSE, cause);
                    while n.a.reg(reg::NOTIFY_FIFO) != NOTIFY_EMPTY {}
                }
            }
            None => std::thread::sleep(MAPPER_TICK),
        }
        n.publish_errcount(&mut published);
        let live = reader.list();
        {
            let mut io = io.lock().unwrap_or_else(|e| e.into_inner());
            io.drop_stale(&live);
            for r in live.iter().filter(|r| r.coherent()) {
                if let Err(e) = io.receive(r) {
                    eprintln!("imcd: cannot receive coherent region {}: {e:#}", r.id);
                    continue;
                }
                if n.ack(r.id, n.me) != r.ctime {
                    n.put(ACK_PAGE, r.id as usize * MAX_NODES + n.me, r.ctime);
                }
            }
        }
        serve_relay(n, &mut served);
    }
}

/// Answers relay requests addressed to this node.
fn serve_relay(n: &Node, served: &mut [u64; MAX_NODES]) {
    for src in (0..MAX_NODES).filter(|&s| s != n.me) {
        let w = |i: usize| n.word(RELAY_PAGE, src * relay::ROW + i);
        let seq = w(relay::SEQ);
        if seq == 0 || seq == served[src] || w(relay::DEST) != n.me as u64 {
            continue;
        }
        served[src] = seq;
        let status = match w(relay::SERVICE) {
            relay::SIGNAL => signal(w(relay::PID), w(relay::SIG), w(relay::UID)),
            _ => libc::ENOSYS as u64,
        };
        let resp = relay::RESPONSES + src * relay::ROW;
        n.put(RELAY_PAGE, resp + relay::STATUS, status);
        n.put(RELAY_PAGE, resp + relay::SEQ, seq);
    }
}

/// The cluster-signal service: kill(2) with the sender's uid checked the
/// way the local kernel would (root, or the same real uid).
fn signal(pid: u64, sig: u64, uid: u64) -> u64 {
    let (Ok(pid), Ok(sig)) = (libc::pid_t::try_from(pid), libc::c_int::try_from(sig)) else {
        return libc::EINVAL as u64;
    };
    if pid <= 0 {
        return libc::EINVAL as u64; // no process groups or broadcast across the cluster
    }
    if uid != 0 {
        let owner = std::fs::read_to_string(format!("/proc/{pid}/status")).ok().and_then(|s| {
            s.lines().find(|l| l.starts_with("Uid:")).and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        });
        match owner {
            None => return libc::ESRCH as u64,
            Some(o) if o != uid => return libc::EPERM as u64,
            _ => {}
        }
    }
    // SAFETY: kill(2) with checked arguments.
    if unsafe { libc::kill(pid, sig) } == 0 {
        0
    } else {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO) as u64
    }
}

/// Waits until every ready imcd of the cluster acked coherent region `r`
/// (nodes that fail meanwhile drop out).
fn wait_coherent(n: &Node, r: &RegionDesc) -> Result<(), RegionError> {
    let want = n.imcd_hosts() | 1 << n.me;
    let t0 = Instant::now();
    loop {
        let now = n.imcd_hosts() | 1 << n.me;
        let missing: Vec<usize> =
            (0..MAX_NODES).filter(|&m| want & now & (1 << m) != 0 && n.ack(r.id, m) != r.ctime).collect();
        if missing.is_empty() {
            return Ok(());
        }
        if t0.elapsed() > CLUSTER_TIMEOUT {
            eprintln!("imcd: nodes {missing:?} never received coherent region {}", r.id);
            return Err(RegionError::NotFound(r.key));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// IMC_CREATOR: places `bid` for our node in lock 0 of the new set `r` and
/// waits for it to come back, all while the directory lock is held: nobody
/// can see the set without seeing lock 0 taken.
fn place_creator_bid(n: &Node, io: &Mutex<Io>, r: &RegionDesc, bid: u64) -> Result<()> {
    let lock = || io.lock().unwrap_or_else(|e| e.into_inner());
    lock().transmit(r, true);
    let slot = n.me as u64 * 8;
    n.a.store64(r.first_page * PAGE_SIZE + slot, bid);
    let t0 = Instant::now();
    while lock().receive(r)?.0.load::<u64>(slot as usize)? != bid {
        anyhow::ensure!(t0.elapsed() < CLUSTER_TIMEOUT, "our bid did not come back: link down?");
        std::thread::sleep(Duration::from_micros(50));
    }
    Ok(())
}

struct Daemon<'a> {
    n: &'a Node,
    dir: Regions<AdapterBus<'a>>,
    io: &'a Mutex<Io<'a>>,
    tx_offset: u64,
    next_bid: u64,
    /// Per region: the clients (connection numbers) on this node that hold
    /// it (the paper's PRD). The node holds it while this is non-empty.
    holders: HashMap<u32, HashSet<u64>>,
    relay_seq: u64,
    /// Nodes up at the last tick (for failure repair).
    members: u64,
    test_hooks: bool,
}

impl<'a> Daemon<'a> {
    fn io(&self) -> std::sync::MutexGuard<'a, Io<'a>> {
        self.io.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn region(&self, id: u32) -> Result<RegionDesc, RegionError> {
        self.dir.list().into_iter().find(|r| r.id == id).ok_or(RegionError::NotFound(id as u64))
    }

    /// Client `client` holds region `id` (after a successful allocation).
    fn hold(&mut self, id: u32, client: u64) {
        self.holders.entry(id).or_default().insert(client);
    }

    /// Client `client` lets go of region `id`; the node lets go once no
    /// client here holds it.
    fn let_go(&mut self, id: u32, client: u64) -> Result<(), RegionError> {
        let Some(h) = self.holders.get_mut(&id) else { return Err(RegionError::NotFound(id as u64)) };
        if !h.remove(&client) {
            return Err(RegionError::NotFound(id as u64));
        }
        if h.is_empty() {
            self.holders.remove(&id);
            let coherent = self.region(id).map(|r| r.coherent()).unwrap_or(false);
            let freed = self.dir.release(id)?;
            if freed || !coherent {
                self.io().forget(id);
            }
        }
        Ok(())
    }

    fn client_left(&mut self, client: u64) {
        let held: Vec<u32> = self.holders.iter().filter(|(_, c)| c.contains(&client)).map(|(id, _)| *id).collect();
        for id in held {
            if let Err(e) = self.let_go(id, client) {
                eprintln!("imcd: releasing region {id} of a client that left: {e}");
            }
        }
    }

    fn handle(&mut self, req: Request, cred: Cred, client: u64) -> (Reply, Option<std::fs::File>) {
        match req {
            Request::Asalloc { key, size, mode, exclusive, coherent } => {
                if key & LOCK_KEY != 0 {
                    return (error("INVALID", format!("key {key:#x}: the top bit is reserved")), None);
                }
                let pages = size.div_ceil(PAGE_SIZE);
                let flags = if coherent { FLAG_COHERENT } else { 0 };
                let n = self.n;
                let r = self.dir.alloc_with(key, pages, mode & 0o777, flags, cred, now_ns(), exclusive, |r| {
                    if coherent {
                        wait_coherent(n, r)?;
                    }
                    Ok(())
                });
                match r {
                    Ok((r, created)) => {
                        self.hold(r.id, client);
                        (Reply::Region { id: r.id, first_page: r.first_page, pages: r.pages, created }, None)
                    }
                    Err(e) => (refusal(&e), None),
                }
            }
            Request::Lkalloc { key, nlocks, mode, creator } => {
                if nlocks == 0 || nlocks > 1024 {
                    return (error("INVALID", format!("{nlocks} locks: 1 to 1024 per set")), None);
                }
                if key & LOCK_KEY != 0 {
                    return (error("INVALID", format!("key {key:#x}: the top bit is reserved")), None);
                }
                let pages = (nlocks as u64 * LOCK_SLOTS_PER_LOCK * 8).div_ceil(PAGE_SIZE);
                let mut placed = 0;
                self.next_bid += 1;
                let bid = IMCD_BID_BASE | self.next_bid;
                let (n, io) = (self.n, self.io);
                // Lock sets are coherent: a process that attaches late must
                // see the bids made before.
                let r = self.dir.alloc_with(
                    key | LOCK_KEY,
                    pages,
                    mode & 0o777,
                    FLAG_COHERENT,
                    cred,
                    now_ns(),
                    creator,
                    |r| {
                        wait_coherent(n, r)?;
                        if creator {
                            place_creator_bid(n, io, r, bid).map_err(|e| {
                                eprintln!("imcd: lock set {key}: {e:#}");
                                RegionError::NotFound(r.key)
                            })?;
                            placed = bid;
                        }
                        Ok(())
                    },
                );
                match r {
                    Ok((r, created)) => {
                        self.hold(r.id, client);
                        (Reply::LockSet { id: r.id, nlocks, node: self.n.me as u32, created, placed_bid: placed }, None)
                    }
                    Err(RegionError::Exists(_)) => (refusal(&RegionError::Exists(key)), None),
                    Err(e) => (refusal(&e), None),
                }
            }
            Request::Dealloc { id } => match self.let_go(id, client) {
                Ok(()) => (Reply::Done, None),
                Err(RegionError::NotFound(_)) => {
                    (error("NOTALLOC", format!("this process has not allocated region {id}")), None)
                }
                Err(e) => (refusal(&e), None),
            },
            Request::Regs => {
                let fd = self.n.a.dev.device_fd().try_clone_to_owned().map(std::fs::File::from).ok();
                match self.n.a.dev.region(regs::BAR_REGS) {
                    Ok(r) => (Reply::Mapping { offset: r.offset, len: r.size }, fd),
                    Err(e) => (error("NODEV", e), None),
                }
            }
            Request::ErrCount => match std::fs::File::open(imc::ERRCOUNT_FILE) {
                Ok(f) => (Reply::Mapping { offset: 0, len: PAGE_SIZE }, Some(f)),
                Err(e) => (error("NOMEM", e), None),
            },
            Request::AckPage { transmit: true } => {
                let fd = self.n.a.dev.device_fd().try_clone_to_owned().map(std::fs::File::from).ok();
                (Reply::Mapping { offset: self.tx_offset + ACK_Q_PAGE * PAGE_SIZE, len: PAGE_SIZE }, fd)
            }
            Request::AckPage { transmit: false } => {
                match std::fs::OpenOptions::new().read(true).write(true).open(imc::ACK_FILE) {
                    Ok(f) => (Reply::Mapping { offset: 0, len: PAGE_SIZE }, Some(f)),
                    Err(e) => (error("NOMEM", e), None),
                }
            }
            Request::Find { key } => match self.dir.find(key) {
                Some(r) => (Reply::Region { id: r.id, first_page: r.first_page, pages: r.pages, created: false }, None),
                None => (refusal(&RegionError::NotFound(key)), None),
            },
            Request::Hosts => {
                let hosts = self.n.imcd_hosts();
                let list = (0..MAX_NODES)
                    .filter(|&m| hosts & (1 << m) != 0)
                    .map(|m| (m as u32, self.n.host_name(m)))
                    .collect();
                (Reply::Hosts { hosts: list }, None)
            }
            Request::Kill { host, pid, sig } => (self.kill(&host, pid, sig, cred), None),
            Request::Asattach { id, transmit, loopback } => self.attach(id, transmit, loopback, cred, client),
            Request::AbandonUpdate { id } => {
                if !self.test_hooks {
                    return (error("INVALID", "imcd was not started with --test-hooks"), None);
                }
                // A failure drill: take the directory lock, write half of an
                // update of entry `id`, then stop serving for good, as a
                // node dying mid-update would.
                match self.dir.abandon_update(id) {
                    Ok(()) => {
                        eprintln!("imcd: abandoned an update of entry {id} with the directory lock held");
                        loop {
                            std::thread::sleep(Duration::from_secs(3600));
                        }
                    }
                    Err(e) => (refusal(&e), None),
                }
            }
        }
    }

    fn attach(
        &mut self,
        id: u32,
        transmit: bool,
        loopback: bool,
        cred: Cred,
        client: u64,
    ) -> (Reply, Option<std::fs::File>) {
        let r = match self.region(id) {
            Ok(r) => r,
            Err(e) => return (refusal(&e), None),
        };
        if !self.holders.get(&id).is_some_and(|h| h.contains(&client)) {
            return (error("NOTALLOC", format!("this process has not allocated region {id}")), None);
        }
        let want = if transmit { Access::Write } else { Access::Read };
        if !r.allows(cred, want) {
            return (refusal(&RegionError::Permission(r.key)), None);
        }
        let len = r.pages * PAGE_SIZE;
        let mut io = self.io();
        if transmit {
            if loopback {
                // Our own writes come back: they need somewhere to land here.
                if let Err(e) = io.receive(&r) {
                    return (error("NOMEM", format!("{e:#}")), None);
                }
            }
            io.transmit(&r, loopback);
            let fd = self.n.a.dev.device_fd().try_clone_to_owned().map(std::fs::File::from).ok();
            (Reply::Mapping { offset: self.tx_offset + r.first_page * PAGE_SIZE, len }, fd)
        } else {
            match io.receive(&r).and_then(|(_, path, _)| Ok(std::fs::File::open(path)?)) {
                Ok(f) => (Reply::Mapping { offset: 0, len }, Some(f)),
                Err(e) => (error("NOMEM", format!("{e:#}")), None),
            }
        }
    }

    /// `imc_kill` through the command relay: the request goes into our
    /// mailbox (the destination's interrupt wakes its imcd), the answer
    /// comes back in our response slot.
    fn kill(&mut self, host: &str, pid: i32, sig: i32, cred: Cred) -> Reply {
        let hosts = self.n.imcd_hosts();
        let dest = (0..MAX_NODES)
            .find(|&m| hosts & (1 << m) != 0 && (self.n.host_name(m) == host || host.parse::<usize>().ok() == Some(m)));
        let Some(dest) = dest else {
            return error("NOHOST", format!("no host {host:?} with imcd in the cluster"));
        };
        if dest == self.n.me {
            return match signal(pid as u64, sig as u64, cred.uid as u64) {
                0 => Reply::Done,
                e => error("ERRNO", std::io::Error::from_raw_os_error(e as i32)),
            };
        }
        // Increasing, and unlike any earlier run's (a restarted imcd).
        self.relay_seq = now_ns().max(self.relay_seq + 1);
        let seq = self.relay_seq;
        let row = self.n.me * relay::ROW;
        let n = self.n;
        n.put(RELAY_PAGE, row + relay::DEST, dest as u64);
        n.put(RELAY_PAGE, row + relay::SERVICE, relay::SIGNAL);
        n.put(RELAY_PAGE, row + relay::PID, pid as u32 as u64);
        n.put(RELAY_PAGE, row + relay::SIG, sig as u32 as u64);
        n.put(RELAY_PAGE, row + relay::UID, cred.uid as u64);
        n.put(RELAY_PAGE, row + relay::SEQ, seq);
        let resp = relay::RESPONSES + row;
        let t0 = Instant::now();
        while n.word(RELAY_PAGE, resp + relay::SEQ) != seq {
            if t0.elapsed() > CLUSTER_TIMEOUT || n.members() & (1 << dest) == 0 {
                return error("NOHOST", format!("host {host} did not answer the command relay"));
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        match n.word(RELAY_PAGE, resp + relay::STATUS) {
            0 => Reply::Done,
            e => error("ERRNO", std::io::Error::from_raw_os_error(e as i32)),
        }
    }

    /// Takes node `gone` out of the cluster's structures: its bit in every
    /// region (freeing what only it held), its directory lock slot, its bids
    /// in every lock set; repairs half-done entry updates.
    fn clear_node(&mut self, gone: usize, why: &str) {
        match self.dir.clear_host(gone) {
            Ok(freed) => eprintln!("imcd: node {gone} {why}: directory repaired, freed regions {freed:?}"),
            Err(e) => eprintln!("imcd: node {gone} {why}; repair: {e}"),
        }
        for r in self.dir.list().iter().filter(|r| r.key & LOCK_KEY != 0) {
            self.io().transmit(r, true);
            let locks = r.pages * PAGE_SIZE / 8 / LOCK_SLOTS_PER_LOCK;
            for l in 0..locks {
                self.n.a.store64(r.first_page * PAGE_SIZE + (l * LOCK_SLOTS_PER_LOCK + gone as u64) * 8, 0);
            }
        }
    }

    /// Once per tick: failure repair and late-join service, by the lowest
    /// ready imcd.
    fn tick(&mut self) {
        let members = self.n.members();
        let gone = self.members & !members;
        self.members = members;
        let ready = self.n.ready_among(members) | 1 << self.n.me;
        let elected = ready.trailing_zeros() as usize == self.n.me;
        for dead in (0..MAX_NODES).filter(|&d| gone & (1 << d) != 0) {
            if elected {
                self.clear_node(dead, "failed");
                for w in [host::READY, host::TOKEN] {
                    self.n.put_host(dead, w, 0);
                }
            }
        }
        if !elected {
            return;
        }
        for m in (0..MAX_NODES).filter(|&m| m != self.n.me && members & (1 << m) != 0) {
            let req = self.n.host(m, host::JOIN_REQ);
            if req == 0 || self.n.host(m, host::JOIN_SERVED) == req {
                continue;
            }
            let n = self.n;
            let r = self.dir.restore(|| {
                // Host rows of the other ready nodes, then "served".
                for h in (0..MAX_NODES).filter(|&h| h != m && ready & (1 << h) != 0) {
                    for w in (host::TOKEN..host::NAME + host::NAME_WORDS).chain([host::READY]) {
                        n.put_host(h, w, n.host(h, w));
                    }
                }
                n.put_host(m, host::JOIN_SERVED, req);
            });
            match r {
                Ok(()) => eprintln!("imcd: sent node {m} the directory (late join)"),
                Err(e) => eprintln!("imcd: late join of node {m}: {e}"),
            }
        }
    }
}

/// Reads one request line (None: the client left).
fn read_line(s: &mut UnixStream) -> std::io::Result<Option<Vec<u8>>> {
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    loop {
        match s.read(&mut b)? {
            0 if line.is_empty() => return Ok(None),
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            _ if b[0] == b'\n' => return Ok(Some(line)),
            _ if line.len() >= MAX_LINE => {
                return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "request too long"))
            }
            _ => line.push(b[0]),
        }
    }
}

/// Opens the adapter, waiting for its link to come up.
fn open_adapter() -> Result<(Adapter, usize)> {
    let a = Adapter::open()?;
    let t0 = Instant::now();
    loop {
        if let Some(n) = a.node() {
            if (n as usize) >= MAX_NODES {
                bail!("node {n}: imcd keeps rows for nodes 0 to {}", MAX_NODES - 1);
            }
            return Ok((a, n as usize));
        }
        if t0.elapsed() > Duration::from_secs(30) {
            bail!("the adapter has not joined a hub within 30 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn run(test_hooks: bool) -> Result<()> {
    // Listen first: clients that come early wait in the backlog.
    let _ = std::fs::remove_file(IMCD_SOCKET);
    let listener = UnixListener::bind(IMCD_SOCKET).with_context(|| format!("cannot listen on {IMCD_SOCKET}"))?;
    std::fs::set_permissions(IMCD_SOCKET, std::fs::Permissions::from_mode(0o666))?;

    let (a, me) = open_adapter()?;
    let meta = rx_buffer(Path::new("/dev/shm/imcd-meta"), META_PAGES)?;
    a.dev.map_dma(&meta, iova(0))?;
    for p in 0..META_PAGES {
        let intr = if p == RELAY_PAGE { pct::INT } else { 0 };
        a.set_page(p, pct::TX | pct::RX | pct::LOOPBACK | intr, iova(p));
    }
    let irq = match Interrupt::msix(&a.dev) {
        Ok(i) => {
            a.set_reg(reg::INT_CAUSE, int::ALL);
            while a.reg(reg::NOTIFY_FIFO) != NOTIFY_EMPTY {}
            a.set_reg(reg::INT_MASK, int::NOTIFY | int::ERROR);
            Some(i)
        }
        Err(e) => {
            eprintln!("imcd: no MSI-X ({e}); the relay polls");
            None
        }
    };
    let tx_offset = a.dev.region(BAR_TX)?.offset;
    let pages = a.pages();
    let errcount = rx_buffer(Path::new(imc::ERRCOUNT_FILE), 1)?;
    std::fs::set_permissions(imc::ERRCOUNT_FILE, std::fs::Permissions::from_mode(0o644))?;
    // Any process may run imc_ckerrcnt, so any may clear the answers: the
    // worst a rogue one can do is confuse error checks on this node.
    let ack_answers = rx_buffer(Path::new(imc::ACK_FILE), 1)?;
    std::fs::set_permissions(imc::ACK_FILE, std::fs::Permissions::from_mode(0o666))?;
    a.dev.map_dma(&ack_answers, iova(ACK_Q_PAGE))?;
    a.set_page(ACK_Q_PAGE, pct::TX | pct::RX | pct::ACK, iova(ACK_Q_PAGE));
    let node = Node { a, meta, me, errcount, _ack_answers: ack_answers };
    node.publish_errcount(&mut None);
    let n = &node;
    let bus = AdapterBus { adapter: &n.a, buf: &n.meta, page: DIR_PAGE, node: me, slots: (PAGE_SIZE / 8) as usize };
    let dir = Regions::new(bus, LOCK_SLOTS, ENTRIES, DATA_FIRST..pages, CLUSTER_TIMEOUT)?;

    // Announce ourselves; a node already serving sends us the directory.
    let token = now_ns();
    let mut name = [0u8; host::NAME_WORDS * 8];
    let hn = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let hn = hn.trim().as_bytes();
    let keep = hn.len().min(name.len() - 1);
    name[..keep].copy_from_slice(&hn[..keep]);
    n.put_host(me, host::TOKEN, token);
    for (i, w) in name.chunks_exact(8).enumerate() {
        n.put_host(me, host::NAME + i, u64::from_le_bytes(w.try_into().unwrap()));
    }
    n.put_host(me, host::JOIN_SERVED, 0);
    n.put_host(me, host::JOIN_REQ, token);
    let t0 = Instant::now();
    let joined = loop {
        if n.host(me, host::JOIN_SERVED) == token {
            break "sent the directory by a running node";
        }
        if n.members() & !(1 << me) == 0 {
            break "the first node of the cluster";
        }
        if t0.elapsed() > JOIN_WAIT {
            break "the first imcd of the cluster (nobody answered the join)";
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    n.put_host(me, host::READY, token);

    let io = Mutex::new(Io { n, rx: HashMap::new() });
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| -> Result<()> {
        let mapper_thread = s.spawn(|| mapper(n, &io, bus, irq.as_ref(), &stop));
        let mut d = Daemon {
            n,
            dir,
            io: &io,
            tx_offset,
            next_bid: 0,
            holders: HashMap::new(),
            relay_seq: 0,
            members: n.members(),
            test_hooks,
        };
        // A restarted imcd: what its processes held before is gone with them.
        if d.dir.list().iter().any(|r| r.hosts & (1 << me) != 0) {
            d.clear_node(me, "restarted");
        }
        eprintln!("imcd: node {me}, {pages} pages, {joined}; listening on {IMCD_SOCKET}");
        let r = serve(&mut d, &listener);
        stop.store(true, Ordering::Relaxed);
        let _ = mapper_thread.join();
        r
    })
}

fn serve(d: &mut Daemon, listener: &UnixListener) -> Result<()> {
    let mut clients: Vec<(UnixStream, u64)> = Vec::new();
    let mut next_client = 0u64;
    loop {
        let mut fds: Vec<libc::pollfd> = std::iter::once(listener.as_raw_fd())
            .chain(clients.iter().map(|c| c.0.as_raw_fd()))
            .map(|fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 })
            .collect();
        // SAFETY: a valid array of pollfds.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, TICK_MS) };
        d.tick();
        if ready <= 0 {
            continue;
        }
        if fds[0].revents & libc::POLLIN != 0 {
            if let Ok((s, _)) = listener.accept() {
                next_client += 1;
                clients.push((s, next_client));
            }
        }
        let mut gone = Vec::new();
        for (i, pfd) in fds.iter().enumerate().skip(1) {
            if pfd.revents == 0 {
                continue;
            }
            let (c, id) = &mut clients[i - 1];
            let reply = match read_line(c) {
                Ok(None) | Err(_) => {
                    gone.push(i - 1);
                    continue;
                }
                Ok(Some(line)) => match serde_json::from_slice::<Request>(&line) {
                    Ok(req) => d.handle(req, peer_cred(c), *id),
                    Err(e) => (error("INVALID", format!("bad request: {e}")), None),
                },
            };
            let mut out = serde_json::to_vec(&reply.0)?;
            out.push(b'\n');
            if imc::send_with_fd(c, &out, reply.1.as_ref().map(|f| f.as_raw_fd())).is_err() {
                gone.push(i - 1);
            }
            let _ = c.flush();
        }
        for i in gone.into_iter().rev() {
            let (_, id) = clients.remove(i);
            d.client_left(id);
        }
    }
}

fn main() {
    let mut test_hooks = false;
    for a in std::env::args().skip(1) {
        match a.as_str() {
            "--test-hooks" => test_hooks = true,
            "-h" | "--help" => {
                println!(
                    "usage: imcd [--test-hooks]\n  the TruCluster MEMORY CHANNEL daemon; listens on {IMCD_SOCKET}"
                );
                return;
            }
            other => {
                eprintln!("imcd: unknown argument {other:?} (try --help)");
                std::process::exit(2);
            }
        }
    }
    if let Err(e) = run(test_hooks) {
        eprintln!("imcd: {e:#}");
        std::process::exit(1);
    }
}
