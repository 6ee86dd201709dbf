//! [`Daemon`]: imcd's main thread. It answers requests (allocation, attach,
//! release, hosts, cluster signals) and, once per tick, does what needs the
//! directory lock: failure repair of nodes that stayed away longer than
//! [`Settings::repair_after`], late-join service for nodes that started
//! after the others or come back from a short outage, and settling this
//! node's own outages (docs/faults.md, "Link flaps"). Only the lowest ready
//! imcd that is not itself waiting to be served repairs and serves joins;
//! an imcd whose own link is down does neither.
//!
//! Touched by the main thread only; it shares the [`Node`] with the mapper.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::time::{Duration, Instant};

use imc_proto::layout::{
    host, lock_set_pages, lock_slot_offset, DATA_FIRST, DIR_PAGE, ENTRIES, IMCD_BID_BASE, LOCK_KEY, LOCK_SLOTS,
    MAX_LOCKS, MAX_NODES,
};
use imc_proto::{Reply, Request, Status};
use regs::PAGE_SIZE;

use crate::hw::{Handout, Hw, HwError};
use crate::node::{now_ns, Joined, Node};
use crate::regions::{Access, Cred, RegionDesc, RegionError, Regions, FLAG_COHERENT};
use crate::relay;

/// Timeouts of the cluster-wide waits, and the flap policy.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Longest wait for the directory lock, a coherency ack, a relay answer.
    pub cluster_timeout: Duration,
    /// Whether the failure drill (`AbandonUpdate`) is allowed.
    pub test_hooks: bool,
    /// An outage of our own link up to this long is ridden out (we ask to
    /// be sent the directory again); a longer one revokes every attachment
    /// here, and the node rejoins as a new member.
    pub flap_grace: Duration,
    /// The others repair a node out once it has been away this long. More
    /// than `flap_grace` by a margin that covers the skew between when a
    /// node sees its own link go down and when the others see it leave, so
    /// that a node repaired out has always revoked its attachments first.
    pub repair_after: Duration,
    /// How long a node waits to be sent the directory (start-up, rejoin,
    /// re-synchronisation).
    pub join_wait: Duration,
}

/// Default [`Settings::flap_grace`].
pub const FLAP_GRACE: Duration = Duration::from_secs(2);
/// The main thread's tick when nothing is due ([`Daemon::next_tick`]).
pub const IDLE_TICK: Duration = Duration::from_secs(1);
/// Its tick while an outage of our own link is unsettled.
const UNSETTLED_TICK: Duration = Duration::from_millis(50);
/// Default margin of [`Settings::repair_after`] over the grace.
pub const REPAIR_MARGIN: Duration = Duration::from_secs(1);

impl Default for Settings {
    fn default() -> Self {
        Settings {
            cluster_timeout: Duration::from_secs(10),
            test_hooks: false,
            flap_grace: FLAP_GRACE,
            repair_after: FLAP_GRACE + REPAIR_MARGIN,
            join_wait: Duration::from_secs(3),
        }
    }
}

/// The status a directory refusal maps to.
pub fn refusal(e: &RegionError) -> Reply {
    let code = match e {
        RegionError::Exists(_) => Status::Exists,
        RegionError::Permission(_) => Status::Permission,
        RegionError::SizeMismatch { .. } => Status::Size,
        RegionError::NoSpace { .. } => Status::NoSpace,
        RegionError::TableFull(_) => Status::TableFull,
        RegionError::NotFound(_) => Status::NotFound,
        RegionError::Empty | RegionError::AddressSpaceTooSmall { .. } => Status::Invalid,
        RegionError::Lock(_) | RegionError::Toggle(_) | RegionError::Unanswered { .. } => Status::Cluster,
    };
    Reply::error(code, e)
}

/// imcd's main-thread state.
pub struct Daemon<'a, H: Hw> {
    n: &'a Node<H>,
    dir: Regions<H::Bus>,
    settings: Settings,
    next_bid: u64,
    /// Per region: the clients (connection numbers) on this node that hold
    /// it (the paper's PRD). The node holds it while this is non-empty.
    holders: HashMap<u32, HashSet<u64>>,
    /// Per client: the regions it attached for transmit (what it may name
    /// as a transmit DMA destination).
    tx_attached: HashMap<u64, HashSet<u32>>,
    /// Per region attached point-to-point: the one client here that may
    /// transmit to it, and the node its stores go to.
    p2p_owner: HashMap<u32, (u64, u16)>,
    relay_seq: u64,
    /// Nodes up at the last tick (for failure repair).
    members: u64,
    /// Per node: since when it has been away (not repaired yet).
    away: [Option<Instant>; MAX_NODES],
    /// Per node that went away: its join request as it was then. Until it
    /// asks again and is served, the node is back in MEMBERS but its imcd
    /// may not be (a guest still rebooting behind a new adapter, with the
    /// old imcd's host row still ready), so coherency does not wait for it.
    returning: [Option<u64>; MAX_NODES],
}

/// Ends client `client`'s watches on node `n` (of region `id`, or all),
/// and the INT bit of pages no one watches any more.
fn unwatch<H: Hw>(n: &Node<H>, client: u64, id: Option<u32>) {
    for p in n.watches.remove(client, id) {
        n.hw.set_notify(p, 1, false);
    }
}

impl<'a, H: Hw> Daemon<'a, H> {
    /// The daemon of node `n`. A restarted imcd first takes back what its
    /// processes held before (they are gone with the old imcd).
    pub fn new(n: &'a Node<H>, settings: Settings) -> Result<Self, RegionError> {
        let dir =
            Regions::new(n.hw.dir_bus(), LOCK_SLOTS, ENTRIES, DATA_FIRST..n.hw.pages(), settings.cluster_timeout)?;
        let mut d = Daemon {
            n,
            dir,
            settings,
            next_bid: 0,
            holders: HashMap::new(),
            tx_attached: HashMap::new(),
            p2p_owner: HashMap::new(),
            relay_seq: 0,
            members: n.members(),
            away: [None; MAX_NODES],
            returning: [None; MAX_NODES],
        };
        if d.dir.list().iter().any(|r| r.hosts & (1 << n.me) != 0) {
            d.clear_node(n.me, "restarted");
        }
        Ok(d)
    }

    /// Every region in the directory, as this node sees it.
    pub fn regions(&self) -> Vec<RegionDesc> {
        self.dir.list()
    }

    fn region(&self, id: u32) -> Result<RegionDesc, RegionError> {
        self.dir.get(id).ok_or(RegionError::NotFound(id as u64))
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
        if let Some(t) = self.tx_attached.get_mut(&client) {
            t.remove(&id);
        }
        if self.p2p_owner.get(&id).is_some_and(|&(owner, _)| owner == client) {
            self.p2p_owner.remove(&id);
        }
        self.n.hw.dma_unland(client, id);
        unwatch(self.n, client, Some(id));
        if h.is_empty() {
            self.holders.remove(&id);
            let coherent = self.region(id).map(|r| r.coherent()).unwrap_or(false);
            let freed = self.dir.release(id)?;
            if freed || !coherent {
                self.n.hw.forget(id);
            }
            if freed {
                // The other nodes drop their buffers of it now, not at
                // their next tick.
                self.n.kick();
            }
        }
        Ok(())
    }

    /// Client `client` left: lets go of everything it held.
    pub fn client_left(&mut self, client: u64) {
        let held: Vec<u32> = self.holders.iter().filter(|(_, c)| c.contains(&client)).map(|(id, _)| *id).collect();
        for id in held {
            if let Err(e) = self.let_go(id, client) {
                eprintln!("imcd: releasing region {id} of a client that left: {e}");
            }
        }
        self.tx_attached.remove(&client);
        self.n.hw.dma_close(client);
        unwatch(self.n, client, None);
    }

    /// Region `id`, if client `client` holds it and `cred` may read it;
    /// else the refusal (`NOTALLOC`, the directory's error, `PERMISSION`).
    fn held_readable(&self, id: u32, cred: Cred, client: u64) -> Result<RegionDesc, Reply> {
        if !self.holders.get(&id).is_some_and(|h| h.contains(&client)) {
            return Err(Reply::error(Status::NotAlloc, format!("this process has not allocated region {id}")));
        }
        let r = self.region(id).map_err(|e| refusal(&e))?;
        if !r.allows(cred, Access::Read) {
            return Err(refusal(&RegionError::Permission(r.key)));
        }
        Ok(r)
    }

    /// Client `client` watches region `id` ([`Request::Watch`]): only a
    /// region it holds and may read; this node receives it from now on.
    fn watch(&self, id: u32, cred: Cred, client: u64) -> (Reply, Option<File>) {
        let r = match self.held_readable(id, cred, client) {
            Ok(r) => r,
            Err(refused) => return (refused, None),
        };
        // A store interrupts only where it is received.
        if let Err(e) = self.n.hw.receive(&r) {
            return (Reply::error(Status::NoMem, e), None);
        }
        match self.n.watches.add(client, &r) {
            Ok(fd) => {
                self.n.hw.set_notify(r.first_page, r.pages, true);
                (Reply::Watching { first_page: r.first_page, pages: r.pages }, Some(fd))
            }
            Err(e) => (Reply::error(Status::NoMem, e), None),
        }
    }

    /// Waits until every ready imcd of the cluster acked coherent region
    /// `r` (nodes that fail meanwhile drop out).
    fn wait_coherent(&self, r: &RegionDesc) -> Result<(), RegionError> {
        // Every mapper looks at the directory now, not at its next tick.
        self.n.kick();
        let n = self.n;
        let want = self.coherent_peers();
        let t0 = Instant::now();
        loop {
            let now = self.coherent_peers();
            let missing: Vec<usize> =
                (0..MAX_NODES).filter(|&m| want & now & (1 << m) != 0 && n.ack(r.id, m) != r.ctime).collect();
            if missing.is_empty() {
                return Ok(());
            }
            if t0.elapsed() > self.settings.cluster_timeout {
                eprintln!("imcd: nodes {missing:?} never received coherent region {}", r.id);
                return Err(RegionError::Unanswered { key: r.key, nodes: missing });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The nodes a coherent allocation waits for: ourselves, and every
    /// ready imcd that is not on its way back from an outage nor waiting
    /// to be sent the directory (which, served after this allocation,
    /// holds the new region: its mapper receives it then).
    fn coherent_peers(&self) -> u64 {
        let returning = (0..MAX_NODES)
            .filter(|&m| {
                (self.returning[m].is_some() && !self.served_again(m)) || (m != self.n.me && self.n.pending(m))
            })
            .fold(0u64, |b, m| b | 1 << m);
        (self.n.imcd_hosts() & !returning) | 1 << self.n.me
    }

    /// Whether node `m`, away at an earlier tick, is a member again and
    /// has since asked for the directory and been served (its new imcd is
    /// in). Read live: an allocation made before our next tick notices
    /// must wait for that imcd's ack, since its mapper receives the region.
    fn served_again(&self, m: usize) -> bool {
        let n = self.n;
        self.returning[m].is_some_and(|before| {
            let req = n.host(m, host::JOIN_REQ);
            n.members() & (1 << m) != 0 && req != before && n.host(m, host::JOIN_SERVED) == req
        })
    }

    /// IMC_CREATOR: places `bid` for our node in lock 0 of the new set `r`
    /// and waits for it to come back, all while the directory lock is held:
    /// nobody can see the set without seeing lock 0 taken.
    fn place_creator_bid(&self, r: &RegionDesc, bid: u64) -> Result<(), String> {
        let hw = &self.n.hw;
        hw.transmit(r, true, None);
        hw.receive(r).map_err(|e| e.to_string())?;
        let slot = lock_slot_offset(0, self.n.me as u64);
        hw.store64(r.first_page * PAGE_SIZE + slot, bid);
        let t0 = Instant::now();
        while hw.region_word(r.id, slot) != Some(bid) {
            if t0.elapsed() > self.settings.cluster_timeout {
                return Err("our bid did not come back: link down?".into());
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        Ok(())
    }

    fn mapping(&self, what: Handout) -> (Reply, Option<File>) {
        match self.n.hw.handout(what) {
            Ok((offset, len, fd)) => (Reply::Mapping { offset, len }, fd),
            Err(e) => (Reply::error(Status::NoMem, e), None),
        }
    }

    /// Answers one request of client `client` with credentials `cred`: the
    /// reply, and an fd to send with it.
    pub fn handle(&mut self, req: Request, cred: Cred, client: u64) -> (Reply, Option<File>) {
        let members = self.n.members();
        if let Some(upto) = self.n.unsettled().filter(|_| members & (1 << self.n.me) != 0) {
            // Our link came back since the last tick: we may have missed
            // writes, so the request waits until we were sent the directory.
            self.settle(upto);
        }
        self.observe_members(self.n.members());
        match req {
            Request::Asalloc { key, size, mode, exclusive, coherent } => {
                if key & LOCK_KEY != 0 {
                    return (Reply::error(Status::Invalid, format!("key {key:#x}: the top bit is reserved")), None);
                }
                let pages = size.div_ceil(PAGE_SIZE);
                let flags = if coherent { FLAG_COHERENT } else { 0 };
                let r = self.dir.alloc_with(key, pages, mode & 0o777, flags, cred, now_ns(), exclusive, |r| {
                    if coherent {
                        self.wait_coherent(r)?;
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
            Request::Lkalloc { key, nlocks, mode, creator } => self.lkalloc(key, nlocks, mode, creator, cred, client),
            Request::Dealloc { id } => match self.let_go(id, client) {
                Ok(()) => (Reply::Done, None),
                Err(RegionError::NotFound(_)) => {
                    (Reply::error(Status::NotAlloc, format!("this process has not allocated region {id}")), None)
                }
                Err(e) => (refusal(&e), None),
            },
            Request::Regs => match self.n.hw.handout(Handout::Regs) {
                Ok((offset, len, fd)) => (Reply::Mapping { offset, len }, fd),
                Err(e) => (Reply::error(Status::NoDev, e), None),
            },
            Request::ErrCount => self.mapping(Handout::ErrCount),
            Request::AckPage { transmit: true } => self.mapping(Handout::AckTransmit),
            Request::AckPage { transmit: false } => self.mapping(Handout::AckAnswers),
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
            Request::Asattach { id, transmit, loopback, p2p } => self.attach(id, transmit, loopback, p2p, cred, client),
            Request::DmaOpen { size } => match self.n.hw.dma_open(client, size) {
                Ok(a) => (Reply::DmaArea { iova: a.iova, len: a.len, ring_entries: a.ring_entries }, Some(a.file)),
                Err(e @ HwError::NoDma) => (Reply::error(Status::NoDev, e), None),
                Err(e @ (HwError::DmaSize(_) | HwError::Device(_))) => (Reply::error(Status::Invalid, e), None),
                Err(e) => (Reply::error(Status::NoMem, e), None),
            },
            Request::DmaRing => self.mapping(Handout::DmaRing),
            Request::DmaTarget { id } => (self.dma_target(id, client), None),
            Request::DmaLand { id, offset } => (self.dma_land(id, offset, cred, client), None),
            Request::Watch { id } => self.watch(id, cred, client),
            Request::AbandonUpdate { id } => {
                if !self.settings.test_hooks {
                    return (Reply::error(Status::Invalid, "imcd was not started with --test-hooks"), None);
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

    fn lkalloc(
        &mut self,
        key: u64,
        nlocks: u32,
        mode: u32,
        creator: bool,
        cred: Cred,
        client: u64,
    ) -> (Reply, Option<File>) {
        if nlocks == 0 || nlocks > MAX_LOCKS {
            return (Reply::error(Status::Invalid, format!("{nlocks} locks: 1 to {MAX_LOCKS} per set")), None);
        }
        if key & LOCK_KEY != 0 {
            return (Reply::error(Status::Invalid, format!("key {key:#x}: the top bit is reserved")), None);
        }
        let pages = lock_set_pages(nlocks, PAGE_SIZE);
        let mut placed = 0;
        self.next_bid += 1;
        let bid = IMCD_BID_BASE | self.next_bid;
        // Lock sets are coherent: a process that attaches late must see the
        // bids made before.
        let r = self.dir.alloc_with(key | LOCK_KEY, pages, mode & 0o777, FLAG_COHERENT, cred, now_ns(), creator, |r| {
            self.wait_coherent(r)?;
            if creator {
                self.place_creator_bid(r, bid).map_err(|e| {
                    eprintln!("imcd: lock set {key}: {e}");
                    RegionError::Unanswered { key: r.key, nodes: vec![self.n.me] }
                })?;
                placed = bid;
            }
            Ok(())
        });
        match r {
            Ok((r, created)) => {
                self.hold(r.id, client);
                (Reply::LockSet { id: r.id, nlocks, node: self.n.me as u32, created, placed_bid: placed }, None)
            }
            Err(RegionError::Exists(_)) => (refusal(&RegionError::Exists(key)), None),
            Err(e) => (refusal(&e), None),
        }
    }

    /// Whether client `client` may attach region `r` for transmit, to node
    /// `p2p` or broadcast: the point-to-point rules (an owned region has
    /// one sender here; a Direct Deposit key names its only sending node
    /// and its destination). The refusal says which rule.
    fn may_transmit(&self, r: &RegionDesc, p2p: Option<u32>, client: u64) -> Result<Option<u16>, Reply> {
        let id = r.id;
        let dest = match p2p {
            None => None,
            Some(d) if d as usize >= MAX_NODES => {
                return Err(Reply::error(
                    Status::Invalid,
                    format!("point-to-point to node {d}: nodes are 0 to {}", MAX_NODES - 1),
                ))
            }
            Some(d) if d as usize == self.n.me => {
                return Err(Reply::error(
                    Status::Invalid,
                    format!("point-to-point to node {d}, this node: such stores reach nobody"),
                ))
            }
            Some(d) => Some(d as u16),
        };
        if let Some((from, to)) = imc_proto::keys::dd_wire_nodes(r.key) {
            if from as usize != self.n.me {
                return Err(Reply::error(
                    Status::Permission,
                    format!(
                        "region {id} is a Direct Deposit connection sent from node {from} only, not from node {}",
                        self.n.me
                    ),
                ));
            }
            if dest != Some(to as u16) {
                return Err(Reply::error(
                    Status::Permission,
                    format!("region {id} is a Direct Deposit connection to node {to}: attach it point-to-point to that node"),
                ));
            }
        }
        if let Some(&(owner, _)) = self.p2p_owner.get(&id) {
            if owner != client {
                return Err(Reply::error(
                    Status::Permission,
                    format!("region {id} is a point-to-point connection owned by another process: only its owner may transmit to it"),
                ));
            }
        }
        if dest.is_some() {
            let others = self.tx_attached.iter().any(|(&c, ids)| c != client && ids.contains(&id));
            if others {
                return Err(Reply::error(
                    Status::Permission,
                    format!("region {id} is attached for transmit by another process here: it cannot become a point-to-point connection"),
                ));
            }
        }
        Ok(dest)
    }

    fn attach(
        &mut self,
        id: u32,
        transmit: bool,
        loopback: bool,
        p2p: Option<u32>,
        cred: Cred,
        client: u64,
    ) -> (Reply, Option<File>) {
        let r = match self.region(id) {
            Ok(r) => r,
            Err(e) => return (refusal(&e), None),
        };
        if !self.holders.get(&id).is_some_and(|h| h.contains(&client)) {
            return (Reply::error(Status::NotAlloc, format!("this process has not allocated region {id}")), None);
        }
        let want = if transmit { Access::Write } else { Access::Read };
        if !r.allows(cred, want) {
            return (refusal(&RegionError::Permission(r.key)), None);
        }
        let hw = &self.n.hw;
        if transmit {
            let dest = match self.may_transmit(&r, p2p, client) {
                Ok(d) => d,
                Err(refused) => return (refused, None),
            };
            if dest.is_some() && loopback {
                return (Reply::error(Status::Invalid, "a point-to-point attach has no loopback"), None);
            }
            if let Some(d) = dest {
                self.p2p_owner.insert(id, (client, d));
            }
            let dest = dest.or_else(|| self.p2p_owner.get(&id).map(|&(_, d)| d));
            if loopback {
                // Our own writes come back: they need somewhere to land here.
                if let Err(e) = hw.receive(&r) {
                    return (Reply::error(Status::NoMem, e), None);
                }
            }
            hw.transmit(&r, loopback, dest);
            self.tx_attached.entry(client).or_default().insert(id);
            self.mapping(Handout::Transmit { first_page: r.first_page, pages: r.pages })
        } else {
            if let Err(e) = hw.receive(&r) {
                return (Reply::error(Status::NoMem, e), None);
            }
            self.mapping(Handout::Receive { id })
        }
    }

    /// Region `id` as a transmit DMA destination of client `client`: only
    /// a region it attached for transmit (and still holds).
    fn dma_target(&self, id: u32, client: u64) -> Reply {
        let holds = self.holders.get(&id).is_some_and(|h| h.contains(&client));
        if !holds || !self.tx_attached.get(&client).is_some_and(|t| t.contains(&id)) {
            return Reply::error(
                Status::NotAlloc,
                format!("this process has not attached region {id} for transmit: it cannot be a DMA destination"),
            );
        }
        match self.region(id) {
            Ok(r) => Reply::DmaTarget { id, first_page: r.first_page, pages: r.pages },
            Err(e) => refusal(&e),
        }
    }

    /// Region `id` received into client `client`'s DMA source area at
    /// `offset`: only a region it holds and may read.
    fn dma_land(&self, id: u32, offset: u64, cred: Cred, client: u64) -> Reply {
        let r = match self.held_readable(id, cred, client) {
            Ok(r) => r,
            Err(refused) => return refused,
        };
        match self.n.hw.dma_land(client, &r, offset) {
            Ok(()) => Reply::Done,
            Err(e @ HwError::NoDma) => Reply::error(Status::NoDev, e),
            Err(e) => Reply::error(Status::Invalid, e),
        }
    }

    /// `imc_kill` through the command relay.
    fn kill(&mut self, host: &str, pid: i32, sig: i32, cred: Cred) -> Reply {
        let n = self.n;
        let hosts = n.imcd_hosts();
        let dest = (0..MAX_NODES)
            .find(|&m| hosts & (1 << m) != 0 && (n.host_name(m) == host || host.parse::<usize>().ok() == Some(m)));
        let Some(dest) = dest else {
            return Reply::error(Status::NoHost, format!("no host {host:?} with imcd in the cluster"));
        };
        let args = (pid as u32 as u64, sig as u32 as u64, cred.uid as u64);
        let status = if dest == n.me {
            n.hw.signal(args.0, args.1, args.2)
        } else {
            // Increasing, and unlike any earlier run's (a restarted imcd).
            self.relay_seq = now_ns().max(self.relay_seq + 1);
            match relay::request(n, dest, self.relay_seq, args, self.settings.cluster_timeout) {
                Ok(s) => s,
                // The host is up and its imcd listed: it is slow, not gone.
                Err(relay::NoAnswer) => {
                    return Reply::error(
                        Status::Cluster,
                        format!("host {host} did not answer the command relay in time"),
                    )
                }
            }
        };
        match status {
            0 => Reply::Done,
            e => Reply::error(Status::Errno, std::io::Error::from_raw_os_error(e as i32)),
        }
    }

    /// Takes node `gone` out of the cluster's structures: its bit in every
    /// region (freeing what only it held), its directory lock slot, its bids
    /// in every lock set; repairs half-done entry updates.
    pub fn clear_node(&mut self, gone: usize, why: &str) {
        match self.dir.clear_host(gone) {
            Ok(freed) => eprintln!("imcd: node {gone} {why}: directory repaired, freed regions {freed:?}"),
            Err(e) => eprintln!("imcd: node {gone} {why}; repair: {e}"),
        }
        let hw = &self.n.hw;
        for r in self.dir.list().iter().filter(|r| r.key & LOCK_KEY != 0) {
            hw.transmit(r, true, None);
            let locks = r.pages * PAGE_SIZE / 8 / LOCK_SLOTS as u64;
            for l in 0..locks {
                hw.store64(r.first_page * PAGE_SIZE + lock_slot_offset(l, gone as u64), 0);
            }
        }
    }

    /// Settles an outage of our own link (the mapper saw it): we missed
    /// writes, so our copy of the directory lock is forgotten and we ask to
    /// be sent the directory and the host table again. If the outage
    /// outlasted the grace (the mapper revoked every attachment here), or
    /// the others repaired us out meanwhile (the host row they send back
    /// is not ready), we leave: our processes' holds are dropped, our bits
    /// and bids are taken out of the directory, and we rejoin as a new
    /// member with a new token.
    fn settle(&mut self, upto: u64) {
        let n = self.n;
        let revoked = n.revoked();
        // Bids ordered while we were down are lost to us: our copy of the
        // directory lock may show a slot set for good. Every slot that
        // matters is re-sent (the server's) or rewritten by its owner.
        n.hw.clear_meta(DIR_PAGE, 0..LOCK_SLOTS);
        // A release of ours dropped while down would hold the lock for good.
        n.hw.store64(DIR_PAGE * PAGE_SIZE + n.me as u64 * 8, 0);
        let joined = n.ask_directory(now_ns(), self.settings.join_wait);
        if joined == Joined::LinkDown {
            // A new outage: it is settled when the link is back.
            eprintln!("imcd: our link is back; {joined}");
            return;
        }
        let (token, name) = n.ident();
        let member = n.host(n.me, host::READY) == token;
        eprintln!("imcd: our link is back; {joined}; {}", if member { "still a member" } else { "repaired out" });
        if revoked || !member {
            n.hw.forget_all();
            let dropped: usize = self.holders.values().map(|h| h.len()).sum();
            self.holders.clear();
            eprintln!("imcd: left the cluster: {dropped} holds of processes here revoked");
            n.hw.count_departure();
            self.clear_node(n.me, "left the cluster");
            // Clearing our bids enabled transmit on lock sets again.
            n.hw.forget_all();
            let joined = n.join(now_ns(), &name, self.settings.join_wait);
            eprintln!("imcd: rejoined as a new member: {joined}");
        }
        n.settled(upto);
    }

    /// How long the main thread may wait for a client or the mapper's
    /// wake-up before its next [`Daemon::tick`]: until the next repair is
    /// due, a short while as long as an outage of our own link is
    /// unsettled, else [`IDLE_TICK`] (a guard against a lost kick: the
    /// events themselves wake it).
    pub fn next_tick(&self) -> Duration {
        if self.n.unsettled().is_some() {
            return UNSETTLED_TICK;
        }
        let repair = self.away.iter().flatten().map(|t| self.settings.repair_after.saturating_sub(t.elapsed())).min();
        repair.map_or(IDLE_TICK, |r| r.clamp(Duration::from_millis(5), IDLE_TICK))
    }

    /// Notes which nodes left and came back since the last look at
    /// MEMBERS (`members`, read now). Called at every tick and before every
    /// request, so a departure a client was told of (`imc_getclusterinfo`)
    /// is never missed when the node is back before the next tick.
    fn observe_members(&mut self, members: u64) {
        let n = self.n;
        if members & (1 << n.me) == 0 || n.unsettled().is_some() {
            // Our own link is down or its outage unsettled: MEMBERS says
            // nothing of the others now.
            return;
        }
        let now = Instant::now();
        for m in 0..MAX_NODES {
            if members & (1 << m) != 0 {
                if self.away[m].take().is_some() {
                    eprintln!("imcd: node {m} is back");
                }
            } else if self.members & (1 << m) != 0 {
                self.away[m] = Some(now);
                // Its link is down, so this is its request from before.
                self.returning[m] = Some(n.host(m, host::JOIN_REQ));
            }
            if self.served_again(m) {
                self.returning[m] = None;
                eprintln!("imcd: node {m} has been sent the directory again");
            }
        }
        self.members = members;
    }

    /// Once per tick: settling our own outages, then failure repair and
    /// late-join service, by the lowest ready imcd not waiting to be served.
    pub fn tick(&mut self) {
        let n = self.n;
        let members = n.members();
        if members & (1 << n.me) == 0 {
            // Our own link is down: MEMBERS reads 0, which says nothing of
            // the others. Repair nobody, serve nobody.
            return;
        }
        if let Some(upto) = n.unsettled() {
            self.settle(upto);
            return;
        }
        self.observe_members(members);
        let ready = n.ready_among(members) | 1 << n.me;
        let serving = (0..MAX_NODES).filter(|&m| ready & (1 << m) != 0 && (m == n.me || !n.pending(m)));
        let elected = serving.min() == Some(n.me);
        for dead in 0..MAX_NODES {
            let Some(t) = self.away[dead] else { continue };
            if elected && t.elapsed() >= self.settings.repair_after {
                self.away[dead] = None;
                self.clear_node(dead, &format!("failed (away for {:.1} s)", t.elapsed().as_secs_f64()));
                for w in [host::READY, host::TOKEN] {
                    n.put_host(dead, w, 0);
                }
            }
        }
        if !elected {
            return;
        }
        for m in (0..MAX_NODES).filter(|&m| m != n.me && members & (1 << m) != 0) {
            let req = n.host(m, host::JOIN_REQ);
            if req == 0 || n.host(m, host::JOIN_SERVED) == req {
                continue;
            }
            let r = self.dir.restore(|| {
                // Host rows of the other ready nodes, then "served".
                for h in (0..MAX_NODES).filter(|&h| h != m && ready & (1 << h) != 0) {
                    for w in (host::TOKEN..host::NAME + host::NAME_WORDS).chain([host::READY]) {
                        n.put_host(h, w, n.host(h, w));
                    }
                }
                // A node back from an outage (asking again with a fresh
                // request, not its token) gets its own ready word as we see
                // it: 0 tells it that it was repaired out. A newcomer's is
                // left alone: it writes it itself once served, or once it
                // gave up waiting, and a copy of ours landing after that
                // (we decided to serve before its give-up reached us) unset
                // it for good: every node, itself included, then left it
                // out of the host list.
                if req != n.host(m, host::TOKEN) {
                    n.put_host(m, host::READY, n.host(m, host::READY));
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
