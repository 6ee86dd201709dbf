//! imcd's node logic on a simulated cluster (`imcd::sim`): coherency,
//! the command relay, late join and failure repair, each across real
//! daemon and mapper threads on an ordered bus with random lags.

use std::time::{Duration, Instant};

use imc_proto::layout::{lock_slot_offset, DATA_FIRST};
use imc_proto::{Reply, Request, Status};
use imcd::daemon::Settings;
use imcd::hw::Hw;
use imcd::node::Joined;
use imcd::regions::Cred;
use imcd::sim::{Running, Signal, SimNet};
use regs::PAGE_SIZE;

const ME: Cred = Cred { uid: 1000, gid: 100 };
const PAGES: u64 = DATA_FIRST + 16;

fn settings() -> Settings {
    Settings { cluster_timeout: Duration::from_secs(20), ..Settings::default() }
}

fn net(nodes: usize, seed: u64) -> SimNet {
    SimNet::new(nodes, PAGES, Duration::from_micros(20), seed)
}

fn start(net: &SimNet, n: usize) -> Running {
    let r = net.start(n, &format!("n{n}"), settings());
    assert!(r.joined().is_some(), "node {n} never finished joining");
    r
}

fn call(r: &Running, req: Request) -> Reply {
    r.call(req, ME, 1).expect("the simulated imcd answers")
}

fn alloc(r: &Running, key: u64, coherent: bool) -> (u32, u64) {
    match call(r, Request::Asalloc { key, size: 2 * PAGE_SIZE, mode: 0o666, exclusive: false, coherent }) {
        Reply::Region { id, first_page, .. } => (id, first_page),
        other => panic!("asalloc {key}: {other:?}"),
    }
}

/// Polls `f` for up to 20 s (the failure says how many polls it made and
/// how long the slowest took: a daemon that stops answering shows there).
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    let (mut polls, mut slowest) = (0u32, Duration::ZERO);
    loop {
        let t = Instant::now();
        let done = f();
        polls += 1;
        slowest = slowest.max(t.elapsed());
        if done {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "timed out waiting until {what} ({polls} polls, the slowest {slowest:?})"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn hosts(r: &Running) -> Vec<(u32, String)> {
    match call(r, Request::Hosts) {
        Reply::Hosts { hosts } => hosts,
        other => panic!("hosts: {other:?}"),
    }
}

#[test]
fn coherent_allocation_returns_once_every_node_received_it() {
    let net = net(3, 1);
    let nodes: Vec<Running> = (0..3).map(|n| start(&net, n)).collect();
    eventually("all three imcds see each other", || hosts(&nodes[0]).len() == 3);
    let (id, first) = alloc(&nodes[1], 0x42, true);
    // The reply came after every node's ack: each receives the region and
    // acked this entry's ctime, as seen from the allocating node.
    for (n, r) in nodes.iter().enumerate() {
        assert!(
            r.hw().received().iter().any(|&(rid, f, p)| rid == id && f == first && p == 2),
            "node {n} does not receive coherent region {id}"
        );
    }
    // A plain region is received only where a process attaches it.
    let (plain, _) = alloc(&nodes[1], 0x43, false);
    assert!(nodes.iter().all(|r| !r.hw().received().iter().any(|&(rid, ..)| rid == plain)));
    // Every node finds both by key, with the same placement.
    for r in &nodes {
        match call(r, Request::Find { key: 0x42 }) {
            Reply::Region { id: i, first_page, .. } => assert_eq!((i, first_page), (id, first)),
            other => panic!("find: {other:?}"),
        }
    }
}

#[test]
fn relay_delivers_signals_and_answers_errors() {
    let net = net(2, 2);
    let nodes: Vec<Running> = (0..2).map(|n| start(&net, n)).collect();
    eventually("both imcds see each other", || hosts(&nodes[0]).len() == 2);
    assert_eq!(call(&nodes[0], Request::Kill { host: "n1".into(), pid: 4321, sig: 10 }), Reply::Done);
    assert_eq!(net.signals(), vec![Signal { node: 1, pid: 4321, sig: 10, uid: 1000 }]);
    // By node number too, and the remote errno comes back.
    net.absent_pid(999);
    match call(&nodes[0], Request::Kill { host: "1".into(), pid: 999, sig: 0 }) {
        Reply::Error { code: Status::Errno, message } => assert!(message.contains("No such process"), "{message}"),
        other => panic!("kill of an absent pid: {other:?}"),
    }
    match call(&nodes[0], Request::Kill { host: "nowhere".into(), pid: 1, sig: 0 }) {
        Reply::Error { code: Status::NoHost, .. } => {}
        other => panic!("kill on an unknown host: {other:?}"),
    }
    assert_eq!(net.signals().len(), 1, "nothing else was delivered");
}

/// A node that starts after the others learns the error counts they
/// published before: they store theirs again once it is ready (and not
/// every second, which interrupted every node).
#[test]
fn a_late_node_learns_the_error_counts_published_before_it_came() {
    let net = net(3, 4);
    let a = start(&net, 0);
    let b = start(&net, 1);
    eventually("both imcds see each other", || hosts(&a).len() == 2);
    net.flap(0, Duration::from_millis(100));
    let count = net.error_count(0);
    assert!(count > 0, "the flap counted no error");
    eventually("node 1 sums node 0's count", || b.hw().error_sum() >= count);
    // Long enough for the re-stores after the start to be over.
    std::thread::sleep(Duration::from_secs(5));
    net.wipe(2);
    let c = start(&net, 2);
    eventually("node 2 sums node 0's count", || c.hw().error_sum() >= count);
}

/// How many wake-ups eventfd `f` counted since the last look (0: none).
fn wakeups(f: &std::fs::File) -> u64 {
    use std::io::Read;
    let mut b = [0u8; 8];
    match (&*f).read(&mut b) {
        Ok(8) => u64::from_ne_bytes(b),
        _ => 0,
    }
}

#[test]
fn a_watched_region_wakes_its_watcher_at_a_store_from_another_node() {
    let net = net(2, 3);
    let nodes: Vec<Running> = (0..2).map(|n| start(&net, n)).collect();
    eventually("both imcds see each other", || hosts(&nodes[0]).len() == 2);
    let (id, first) = alloc(&nodes[1], 0x77, true);
    let (other, other_first) = alloc(&nodes[1], 0x78, true);
    let watch = |n: &Running, id: u32, client: u64| n.call_fd(Request::Watch { id }, ME, client).expect("an answer");

    // Only a holder may watch.
    match watch(&nodes[1], id, 2).0 {
        Reply::Error { code: Status::NotAlloc, .. } => {}
        other => panic!("a watch by a client that holds nothing: {other:?}"),
    }
    let (reply, fd) = watch(&nodes[1], id, 1);
    assert_eq!(reply, Reply::Watching { first_page: first, pages: 2 });
    let fd = fd.expect("an eventfd with the reply");
    assert_eq!(wakeups(&fd), 0, "woken before any store");

    // A store from node 0 to the region's second page wakes it.
    nodes[0].hw().store64((first + 1) * PAGE_SIZE + 8, 5);
    eventually("the watcher is woken", || wakeups(&fd) > 0);
    // A store to another region does not.
    nodes[0].hw().store64(other_first * PAGE_SIZE, 5);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(wakeups(&fd), 0, "woken by a store to region {other}");

    // Once the client lets go of the region, stores wake nobody.
    assert_eq!(call(&nodes[1], Request::Dealloc { id }), Reply::Done);
    nodes[0].hw().store64(first * PAGE_SIZE, 6);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(wakeups(&fd), 0, "woken after the watch ended");
}

#[test]
fn late_joiner_is_sent_the_directory_and_the_host_table() {
    let net = net(3, 3);
    let a = start(&net, 0);
    let b = start(&net, 1);
    eventually("two imcds see each other", || hosts(&a).len() == 2);
    let (id, first) = alloc(&b, 0x77, false);
    // Node 2 comes up having seen nothing of what went before.
    net.wipe(2);
    let c = net.start(2, "n2", settings());
    assert_eq!(c.joined(), Some(Joined::Served));
    match call(&c, Request::Find { key: 0x77 }) {
        Reply::Region { id: i, first_page, .. } => assert_eq!((i, first_page), (id, first)),
        other => panic!("the newcomer does not know region 0x77: {other:?}"),
    }
    eventually("the newcomer lists every host", || {
        hosts(&c) == vec![(0, "n0".to_string()), (1, "n1".to_string()), (2, "n2".to_string())]
    });
    // Its allocations do not collide with what it was sent.
    let (id2, first2) = alloc(&c, 0x78, false);
    assert_ne!(id2, id);
    assert!(first2 >= first + 2 || first2 + 2 <= first, "pages {first2}.. overlap region 0x77 at {first}..");
}

#[test]
fn imcds_starting_together_do_not_wait_out_the_join() {
    let net = net(3, 11);
    net.power_on(0..3);
    // A join that waited this out would say Unanswered.
    let s = Settings { join_wait: Duration::from_secs(25), ..settings() };
    // The lowest-numbered starts last, when the others already wait.
    let c = net.start(2, "n2", s);
    let b = net.start(1, "n1", s);
    let a = net.start(0, "n0", s);
    assert_eq!(a.joined(), Some(Joined::Together));
    assert_eq!(b.joined(), Some(Joined::Served));
    assert_eq!(c.joined(), Some(Joined::Served));
    for r in [&a, &b, &c] {
        eventually("three imcds see each other", || hosts(r).len() == 3);
    }
    let (id, first) = alloc(&c, 0x5a, true);
    for r in [&a, &b] {
        assert_eq!(find(r, 0x5a), Some((id, first)), "one directory for all three");
    }
}

#[test]
fn failed_node_is_repaired_out_of_regions_locks_and_hosts() {
    let net = net(3, 4);
    let nodes: Vec<Running> = (0..3).map(|n| start(&net, n)).collect();
    eventually("three imcds see each other", || hosts(&nodes[0]).len() == 3);
    // Region 0x10 is held by node 2 alone; 0x11 by nodes 1 and 2.
    let (only, _) = alloc(&nodes[2], 0x10, false);
    let (shared, _) = alloc(&nodes[2], 0x11, false);
    alloc(&nodes[1], 0x11, false);
    // A lock set both hold, with node 2 holding lock 0 (IMC_CREATOR).
    let set = match call(&nodes[2], Request::Lkalloc { key: 0x12, nlocks: 1, mode: 0o666, creator: true }) {
        Reply::LockSet { id, placed_bid, .. } => {
            assert_ne!(placed_bid, 0);
            id
        }
        other => panic!("lkalloc: {other:?}"),
    };
    assert!(matches!(
        call(&nodes[1], Request::Lkalloc { key: 0x12, nlocks: 1, mode: 0o666, creator: false }),
        Reply::LockSet { id, .. } if id == set
    ));
    let slot2 = lock_slot_offset(0, 2);
    eventually("node 1 sees node 2's bid", || nodes[1].hw().region_word(set, slot2).unwrap_or(0) != 0);

    let mut nodes = nodes;
    let dead = nodes.pop().unwrap();
    net.fail(2, dead);

    eventually("node 2's lone region is freed", || {
        matches!(call(&nodes[0], Request::Find { key: 0x10 }), Reply::Error { code: Status::NotFound, .. })
    });
    match call(&nodes[1], Request::Find { key: 0x11 }) {
        Reply::Region { id, .. } => assert_eq!(id, shared, "the region node 1 still holds survives"),
        other => panic!("shared region lost: {other:?}"),
    }
    eventually("node 2's bid in the lock set is cleared", || nodes[1].hw().region_word(set, slot2) == Some(0));
    eventually("the host table lists the survivors", || {
        hosts(&nodes[1]) == vec![(0, "n0".to_string()), (1, "n1".to_string())]
    });
    assert_ne!(only, shared);
}

/// Settings with a short flap grace, so the outages stay short.
fn flap_settings() -> Settings {
    Settings {
        cluster_timeout: Duration::from_secs(5),
        flap_grace: Duration::from_millis(800),
        repair_after: Duration::from_millis(1600),
        join_wait: Duration::from_secs(3),
        ..Settings::default()
    }
}

fn start_with(net: &SimNet, n: usize, s: Settings) -> Running {
    let r = net.start(n, &format!("n{n}"), s);
    assert!(r.joined().is_some(), "node {n} never finished joining");
    r
}

fn find(r: &Running, key: u64) -> Option<(u32, u64)> {
    match call(r, Request::Find { key }) {
        Reply::Region { id, first_page, .. } => Some((id, first_page)),
        Reply::Error { code: Status::NotFound, .. } => None,
        other => panic!("find {key:#x}: {other:?}"),
    }
}

fn both_hosts() -> Vec<(u32, String)> {
    vec![(0, "n0".to_string()), (1, "n1".to_string())]
}

/// Regions of the directory as node `r` sees it never share a page.
fn assert_disjoint(r: &Running) {
    let mut ranges: Vec<(u64, u64, u64)> = match call(r, Request::Hosts) {
        Reply::Hosts { .. } => Vec::new(),
        other => panic!("hosts: {other:?}"),
    };
    for key in [0x50u64, 0x55, 0x66, 0x67] {
        if let Reply::Region { first_page, pages, .. } = call(r, Request::Find { key }) {
            ranges.push((first_page, first_page + pages, key));
        }
    }
    ranges.sort_unstable();
    assert!(ranges.windows(2).all(|w| w[0].1 <= w[1].0), "two regions share pages: {ranges:?}");
}

/// A flap shorter than the grace is ridden out: nobody is repaired (host
/// table, regions and lock bids stay), and the flapped node is sent the
/// directory again, so it sees an allocation made while it was down and
/// does not allocate over it. The outage counts as an error.
#[test]
fn short_flap_is_ridden_out_and_the_node_resynchronised() {
    let net = net(2, 21);
    let a = start_with(&net, 0, flap_settings());
    let b = start_with(&net, 1, flap_settings());
    eventually("both imcds see each other", || hosts(&a).len() == 2 && hosts(&b).len() == 2);
    let (id55, first55) = alloc(&b, 0x55, false);
    assert!(matches!(
        call(&b, Request::Asattach { id: id55, transmit: true, loopback: false, p2p: None }),
        Reply::Mapping { .. }
    ));
    let set = match call(&b, Request::Lkalloc { key: 0x12, nlocks: 1, mode: 0o666, creator: true }) {
        Reply::LockSet { id, placed_bid, .. } if placed_bid != 0 => id,
        other => panic!("lkalloc: {other:?}"),
    };
    assert!(matches!(
        call(&a, Request::Lkalloc { key: 0x12, nlocks: 1, mode: 0o666, creator: false }),
        Reply::LockSet { id, .. } if id == set
    ));
    let slot1 = lock_slot_offset(0, 1);
    eventually("node 0 sees node 1's bid", || a.hw().region_word(set, slot1).unwrap_or(0) != 0);
    let errors_before = net.error_count(1);

    net.link_down(1);
    std::thread::sleep(Duration::from_millis(150));
    // Made while node 1 is down: it misses these writes.
    let (id66, first66) = alloc(&a, 0x66, false);
    assert!(first66 >= first55 + 2 || first66 + 2 <= first55, "node 1's pages were given away");
    std::thread::sleep(Duration::from_millis(250));
    net.link_up(1);

    eventually("node 1 was sent the allocation it missed", || find(&b, 0x66) == Some((id66, first66)));
    eventually("both host tables list both nodes", || hosts(&a) == both_hosts() && hosts(&b) == both_hosts());
    // Past the repair delay too: nothing was repaired.
    std::thread::sleep(Duration::from_millis(2000));
    assert_eq!(hosts(&a), both_hosts());
    assert_eq!(find(&a, 0x55), Some((id55, first55)), "node 1's region survived the flap");
    assert_eq!(a.hw().region_word(set, slot1).map(|b| b != 0), Some(true), "node 1's bid survived the flap");
    assert!(b.hw().transmits(first55), "node 1's attachment was not revoked");
    assert_eq!(b.hw().departures(), 0, "a flap ridden out is no departure");
    // Node 1 still holds what it held, and allocates around what it missed.
    let (_, first67) = alloc(&b, 0x67, false);
    assert_disjoint(&a);
    assert_disjoint(&b);
    assert_ne!(first67, first66);
    assert_eq!(call(&b, Request::Dealloc { id: id55 }), Reply::Done, "node 1's holder kept its region");
    assert_eq!(net.error_count(1), errors_before + 1, "the outage counts one error");
    eventually("the clusterwide error count shows the outage", || {
        a.hw().error_sum() > errors_before && b.hw().error_sum() > errors_before
    });
}

/// A node back from a short flap whose server is busy (the elected imcd
/// stalled past the join wait: a late join of its own held up, a repair)
/// waits for it instead of going on with the copy it had: that copy misses
/// a region made while it was down, and allocating from it would hand the
/// region's pages out again (a second cluster beside the first, as a
/// cross-host soak saw). It is served once the server is back.
#[test]
fn a_node_back_from_a_flap_waits_for_a_busy_server() {
    let net = net(3, 24);
    let nodes: Vec<Running> = (0..3).map(|n| start_with(&net, n, flap_settings())).collect();
    eventually("all three imcds see each other", || nodes.iter().all(|r| hosts(r).len() == 3));
    // Node 0, the elected server, is busy for twice the join wait.
    let stall = 2 * flap_settings().join_wait;
    nodes[0].stall(stall);
    let t0 = Instant::now();
    net.link_down(1);
    std::thread::sleep(Duration::from_millis(150));
    let (id66, first66) = alloc(&nodes[2], 0x66, false);
    std::thread::sleep(Duration::from_millis(150));
    net.link_up(1);
    // Node 1 answers this only once its outage is settled.
    let (_, first67) = alloc(&nodes[1], 0x67, false);
    assert!(t0.elapsed() >= stall, "node 1 settled after {:?}, before its server was back", t0.elapsed());
    assert_eq!(find(&nodes[1], 0x66), Some((id66, first66)), "node 1 was sent the region it missed");
    assert!(first67 >= first66 + 2 || first67 + 2 <= first66, "node 1 allocated over region {id66}");
    for r in &nodes {
        assert_disjoint(r);
        assert_eq!(find(r, 0x66), Some((id66, first66)));
    }
}

/// A node away longer than the repair delay is repaired out (its region
/// freed, its pages reusable); when it comes back its imcd has revoked
/// what its processes held (transmit off, holders gone) and it rejoins as
/// a new member: no page is owned by two regions.
#[test]
fn long_outage_repairs_the_node_out_and_it_revokes_on_return() {
    let net = net(2, 22);
    let a = start_with(&net, 0, flap_settings());
    let b = start_with(&net, 1, flap_settings());
    eventually("both imcds see each other", || hosts(&a).len() == 2 && hosts(&b).len() == 2);
    let (id55, first55) = alloc(&b, 0x55, false);
    match call(&b, Request::Asattach { id: id55, transmit: true, loopback: false, p2p: None }) {
        Reply::Mapping { .. } => {}
        other => panic!("attach: {other:?}"),
    }
    assert!(b.hw().transmits(first55), "node 1 transmits on its region");
    eventually("node 0 sees node 1's region", || find(&a, 0x55) == Some((id55, first55)));

    net.link_down(1);
    eventually("node 0 repairs node 1 out and frees its region", || find(&a, 0x55).is_none());
    eventually("node 1 revoked its attachments while down", || !b.hw().transmits(first55));
    // The freed pages go to a new region on node 0.
    let (id66, first66) = alloc(&a, 0x66, false);
    assert_eq!(first66, first55, "first fit reuses the freed pages");
    net.link_up(1);

    eventually("node 1 rejoined", || hosts(&a) == both_hosts() && hosts(&b) == both_hosts());
    // Published for the processes that serve others (mpid sets up again).
    assert_eq!((a.hw().departures(), b.hw().departures()), (0, 1), "departures published");
    eventually("node 1 sees the new region", || find(&b, 0x66) == Some((id66, first66)));
    assert!(!b.hw().transmits(first66), "node 1's old attachment must not write the new region's pages");
    match call(&b, Request::Dealloc { id: id55 }) {
        Reply::Error { code: Status::NotAlloc, .. } => {}
        other => panic!("the revoked holder still holds region {id55}: {other:?}"),
    }
    match call(&b, Request::Asattach { id: id66, transmit: true, loopback: false, p2p: None }) {
        Reply::Error { code: Status::NotAlloc, .. } => {}
        other => panic!("the revoked holder may attach the new region: {other:?}"),
    }
    assert_eq!(find(&b, 0x55), None);
    assert_disjoint(&a);
    assert_disjoint(&b);
    // The rejoined node works as a new member.
    let (_, first67) = alloc(&b, 0x67, false);
    assert_ne!(first67, first66);
    assert_disjoint(&a);
}

/// A node whose own link is down (MEMBERS reads 0 there) repairs nobody:
/// after it comes back, the other node's regions, lock bids and host row
/// are intact, even with the outage longer than the repair delay.
#[test]
fn node_whose_link_is_down_repairs_nobody() {
    let net = net(2, 23);
    let s = Settings { cluster_timeout: Duration::from_millis(500), ..flap_settings() };
    let a = start_with(&net, 0, s);
    let b = start_with(&net, 1, s);
    eventually("both imcds see each other", || hosts(&a).len() == 2 && hosts(&b).len() == 2);
    let (id50, first50) = alloc(&a, 0x50, false);
    let set = match call(&a, Request::Lkalloc { key: 0x13, nlocks: 1, mode: 0o666, creator: true }) {
        Reply::LockSet { id, placed_bid, .. } if placed_bid != 0 => id,
        other => panic!("lkalloc: {other:?}"),
    };
    let slot0 = lock_slot_offset(0, 0);
    eventually("node 0's bid is in place", || a.hw().region_word(set, slot0).unwrap_or(0) != 0);
    for outage in [Duration::from_millis(300), Duration::from_millis(2500)] {
        net.flap(1, outage);
        eventually("both host tables list both nodes", || hosts(&a) == both_hosts() && hosts(&b) == both_hosts());
        std::thread::sleep(Duration::from_millis(1500));
        assert_eq!(hosts(&a), both_hosts(), "node 0's host row survives a {outage:?} outage of node 1");
        assert_eq!(find(&a, 0x50), Some((id50, first50)), "node 0's region survives");
        assert_ne!(a.hw().region_word(set, slot0), Some(0), "node 0's bid survives");
    }
}

#[test]
fn coherent_allocation_a_node_never_acks_fails_as_a_cluster_error() {
    let net = net(2, 5);
    let fast = Settings { cluster_timeout: Duration::from_millis(500), ..settings() };
    let a = net.start(0, "n0", fast);
    assert!(a.joined().is_some());
    let b = start(&net, 1);
    eventually("both imcds see each other", || hosts(&a).len() == 2);
    net.deafen(1);
    match call(&a, Request::Asalloc { key: 0x90, size: PAGE_SIZE, mode: 0o666, exclusive: false, coherent: true }) {
        Reply::Error { code: Status::Cluster, message } => assert!(message.contains("[1]"), "{message}"),
        other => panic!("a coherent allocation node 1 never acked: {other:?}"),
    }
    // Nothing is left behind: the key is free again.
    assert!(matches!(call(&a, Request::Find { key: 0x90 }), Reply::Error { code: Status::NotFound, .. }));
    drop(b);
}

#[test]
fn rebooting_node_is_not_waited_for_until_its_new_imcd_joins() {
    let net = net(3, 6);
    // Repair would take the node out of the waits anyway; keep it far off,
    // as a reboot is quicker than the repair delay.
    let s = Settings { cluster_timeout: Duration::from_secs(3), repair_after: Duration::from_secs(600), ..settings() };
    let nodes: Vec<Running> = (0..3).map(|n| net.start(n, &format!("n{n}"), s)).collect();
    for (n, r) in nodes.iter().enumerate() {
        assert!(r.joined().is_some(), "node {n} never finished joining");
    }
    eventually("three imcds see each other", || hosts(&nodes[0]).len() == 3);
    let mut nodes = nodes;
    let old = nodes.pop().unwrap();
    net.fail(2, old);
    // (Each different answer on the way is printed: shown if it fails.)
    let (mut seen, mut answers) = (Vec::new(), std::collections::HashSet::new());
    eventually("node 0 sees node 2 leave", || {
        seen = hosts(&nodes[0]);
        if answers.insert(seen.clone()) {
            println!("node 0's hosts: {seen:?}");
        }
        seen.len() == 2
    });
    assert_eq!(seen.iter().map(|h| h.0).collect::<Vec<_>>(), [0, 1], "{seen:?}");
    // A new adapter: node 2 is a member again, its old host row still
    // reads ready, but no imcd there acks anything yet.
    net.adapter_back(2);
    eventually("node 0 sees node 2's adapter back", || hosts(&nodes[0]).len() == 3);
    let t0 = Instant::now();
    alloc(&nodes[0], 0x70, true);
    assert!(t0.elapsed() < Duration::from_secs(2), "the allocation waited {:?} for a node without imcd", t0.elapsed());
    // Its new imcd joins and is counted again: it receives the next
    // coherent region before the allocation returns.
    let new = net.start(2, "n2", s);
    assert_eq!(new.joined(), Some(Joined::Served));
    let (id, _) = alloc(&nodes[1], 0x71, true);
    assert!(
        new.hw().received().iter().any(|&(rid, ..)| rid == id),
        "the coherent region was not received on the new imcd's node"
    );
    drop(new);
}

/// The same, with no tick between node 2's departure and its return: node
/// 0's daemon is driven by hand here, and a client saw node 2 leave
/// (`Hosts`) just before its adapter came back. The departure a client was
/// told of must not be missed (it was when only the tick looked).
#[test]
fn a_departure_seen_by_a_client_counts_even_without_a_tick() {
    use imcd::daemon::Daemon;
    use imcd::mapper::Mapper;
    use imcd::node::Node;
    use std::sync::atomic::{AtomicBool, Ordering};

    let net = net(3, 8);
    let s = Settings { cluster_timeout: Duration::from_secs(3), repair_after: Duration::from_secs(600), ..settings() };
    net.power_on([0]);
    let node = Node::new(net.hw(0));
    /// Stops the mapper when the test ends, failed or not.
    struct StopOnDrop<'a>(&'a AtomicBool);
    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let mapper = Mapper::new(&node, s.flap_grace).expect("directory on the simulated bus");
        scope.spawn(|| mapper.run(&stop, &|| {}));
        let _stop = StopOnDrop(&stop);
        let others: Vec<Running> = (1..3).map(|n| net.start(n, &format!("n{n}"), s)).collect();
        node.join(imcd::node::now_ns(), "n0", s.join_wait);
        let mut d = Daemon::new(&node, s).expect("directory on the simulated bus");
        let ask_hosts = |d: &mut Daemon<_>| match d.handle(Request::Hosts, ME, 1).0 {
            Reply::Hosts { hosts } => hosts.len(),
            other => panic!("hosts: {other:?}"),
        };
        eventually("three imcds see each other", || {
            d.tick();
            ask_hosts(&mut d) == 3
        });
        let mut others = others;
        net.fail(2, others.pop().unwrap());
        eventually("a client sees node 2 leave", || ask_hosts(&mut d) == 2);
        net.adapter_back(2);
        let t0 = Instant::now();
        let req = Request::Asalloc { key: 0x72, size: PAGE_SIZE, mode: 0o666, exclusive: false, coherent: true };
        let reply = d.handle(req, ME, 1).0;
        assert!(matches!(reply, Reply::Region { .. }), "a coherent allocation after node 2 came back: {reply:?}");
        assert!(
            t0.elapsed() < Duration::from_secs(2),
            "the allocation waited {:?} for a node without imcd",
            t0.elapsed()
        );
        drop(others);
    });
}

#[test]
fn a_listed_host_that_does_not_answer_the_relay_is_a_cluster_error_not_gone() {
    let net = net(2, 7);
    let fast =
        Settings { cluster_timeout: Duration::from_millis(500), repair_after: Duration::from_secs(600), ..settings() };
    let a = net.start(0, "n0", fast);
    assert!(a.joined().is_some());
    let b = start(&net, 1);
    eventually("both imcds see each other", || hosts(&a).len() == 2);
    // Node 1's imcd stops answering; its adapter stays in the cluster.
    drop(b);
    match call(&a, Request::Kill { host: "n1".into(), pid: 4321, sig: 0 }) {
        Reply::Error { code: Status::Cluster, message } => assert!(message.contains("did not answer"), "{message}"),
        other => panic!("a relay nobody answers: {other:?}"),
    }
}

/// The mapper drops this node's buffer of a region it saw freed; the
/// daemon may meanwhile have made a buffer for a new region that reuses
/// the id (an MPI job starting right after another: "region 25 is not
/// received on this node" from `MPI_Init`). Only the buffer the mapper
/// listed goes.
#[test]
fn the_mappers_cleanup_takes_only_the_buffer_it_listed() {
    use imcd::hw::Hw;
    use imcd::regions::RegionDesc;
    let net = SimNet::new(1, 64, Duration::ZERO, 1);
    let hw = net.hw(0);
    let region = |first_page| RegionDesc {
        id: 25,
        key: 7,
        first_page,
        pages: 2,
        mode: 0o666,
        uid: 0,
        gid: 0,
        ctime: first_page,
        flags: 0,
        hosts: 1,
    };
    hw.receive(&region(10)).unwrap();
    let listed = hw.received();
    assert_eq!(listed, vec![(25, 10, 2)]);
    // The old region is freed and id 25 is given to a new one elsewhere.
    hw.receive(&region(20)).unwrap();
    hw.forget_stale(25, 10, 2);
    assert_eq!(hw.received(), vec![(25, 20, 2)], "the new region's buffer stays");
    hw.forget_stale(25, 20, 2);
    assert!(hw.received().is_empty(), "the listed buffer goes");
}
