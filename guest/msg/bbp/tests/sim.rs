//! The protocol on the simulated ordered bus (`imc_client::cluster_lock::sim`):
//! every node applies the total order with random lags, links go down and
//! come back (their stores and deliveries in between are lost). One
//! endpoint per node, each in its own thread, as processes would be.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use bbp::layout::BUFFERS;
use bbp::{BbpError, Bus, Endpoint, Geometry, Timing};
use imc_client::cluster_lock::sim::{SimCluster, SimNode};
use imc_client::cluster_lock::OrderedBus;

/// A node of the simulated cluster as a billboard bus, with an error
/// count the tests move (as a flap moves the adapter's) and processes
/// the tests declare dead.
#[derive(Clone)]
struct SimBus {
    node: SimNode,
    errors: Arc<AtomicU64>,
    dead: Arc<Mutex<Vec<u64>>>,
}

impl Bus for SimBus {
    fn store(&self, w: usize, v: u64) {
        self.node.store(w, v)
    }
    fn load(&self, w: usize) -> u64 {
        self.node.load(w)
    }
    fn errors(&self) -> u64 {
        self.errors.load(Ordering::SeqCst)
    }
    fn alive(&self, who: u64) -> Result<(), String> {
        if self.dead.lock().unwrap().contains(&who) {
            Err(format!("process {who} is dead"))
        } else {
            Ok(())
        }
    }
}

struct Job {
    sim: SimCluster,
    geo: Geometry,
    errors: Arc<AtomicU64>,
    dead: Arc<Mutex<Vec<u64>>>,
}

fn timing() -> Timing {
    Timing {
        repost_every: Duration::from_millis(20),
        check_every: Duration::from_millis(5),
        start_wait: Duration::from_secs(5),
        yields: 256,
        barrier_yields: 256,
        long_wait: Duration::from_millis(50),
        long_nap: Duration::from_millis(2),
    }
}

impl Job {
    fn new(nprocs: usize, data_bytes: usize, lag: Duration, seed: u64) -> Job {
        let geo = Geometry { nprocs, data_bytes };
        Job {
            sim: SimCluster::with_slots(nprocs, geo.words(), lag, seed),
            geo,
            errors: Arc::default(),
            dead: Arc::default(),
        }
    }

    fn bus(&self, p: usize) -> SimBus {
        SimBus { node: self.sim.node(p), errors: self.errors.clone(), dead: self.dead.clone() }
    }

    fn endpoint(&self, p: usize) -> Endpoint<SimBus> {
        Endpoint::new(self.bus(p), self.geo, p, 1000 + p as u64, timing()).unwrap()
    }

    /// Runs `f(rank, endpoint)` on every rank in its own thread; their results.
    fn run<T: Send + 'static>(&self, f: impl Fn(usize, &mut Endpoint<SimBus>) -> T + Send + Sync + 'static) -> Vec<T> {
        let f = Arc::new(f);
        let eps: Vec<_> = (0..self.geo.nprocs).map(|p| self.endpoint(p)).collect();
        let hs: Vec<_> = eps
            .into_iter()
            .enumerate()
            .map(|(p, mut ep)| {
                let f = f.clone();
                thread::spawn(move || f(p, &mut ep))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    }
}

/// A message whose bytes say who sent it, to whom and which it is.
fn message(from: usize, tag: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (from * 31 + tag * 7 + i * 13) as u8).collect()
}

#[test]
fn pingpong_between_every_pair_keeps_contents_and_order() {
    let job = Job::new(4, 1024, Duration::from_micros(200), 7);
    let sizes = [0usize, 1, 4, 7, 8, 9, 100, 1024];
    job.run(move |me, ep| {
        let mut buf = vec![0u8; 2048];
        for other in 0..4 {
            if other == me {
                continue;
            }
            for (k, &len) in sizes.iter().enumerate() {
                // The lower rank serves first.
                if me < other {
                    ep.send(other as i64, &message(me, k, len)).unwrap();
                    let got = ep.recv(Some(other as i64), &mut buf).unwrap();
                    assert_eq!((got.from, got.len), (other, len));
                    assert_eq!(buf[..len], message(other, k, len)[..]);
                } else {
                    let got = ep.recv(Some(other as i64), &mut buf).unwrap();
                    assert_eq!((got.from, got.len), (other, len));
                    assert_eq!(buf[..len], message(other, k, len)[..]);
                    ep.send(other as i64, &message(me, k, len)).unwrap();
                }
            }
        }
        ep.barrier().unwrap();
        ep.finalize(Duration::from_secs(5)).unwrap();
    });
}

#[test]
fn a_full_partition_is_collected_and_every_message_arrives_in_order() {
    // 256 bytes of data: three 80-byte messages fill it.
    let job = Job::new(2, 256, Duration::from_micros(300), 11);
    let count = 200;
    let stats = job.run(move |me, ep| {
        if me == 0 {
            for k in 0..count {
                ep.send(1, &message(0, k, 80 - k % 3)).unwrap();
            }
            ep.barrier().unwrap();
        } else {
            let mut buf = [0u8; 256];
            for k in 0..count {
                if k % 10 == 0 {
                    thread::sleep(Duration::from_millis(2));
                }
                let got = ep.recv(Some(0), &mut buf).unwrap();
                assert_eq!(got.len, 80 - k % 3, "message {k}");
                assert_eq!(buf[..got.len], message(0, k, got.len)[..], "message {k}");
            }
            ep.barrier().unwrap();
        }
        ep.stats
    });
    assert_eq!(stats[0].sent, count as u64 + 1);
    assert!(stats[0].collected >= count as u64 - 3, "{:?}", stats[0]);
}

#[test]
fn more_messages_than_buffers_wait_for_collection() {
    let job = Job::new(2, 4096, Duration::ZERO, 3);
    let n = 3 * BUFFERS;
    let stats = job.run(move |me, ep| {
        if me == 0 {
            for k in 0..n {
                ep.send(1, &(k as u32).to_le_bytes()).unwrap();
            }
        } else {
            thread::sleep(Duration::from_millis(50));
            let mut buf = [0u8; 4];
            for k in 0..n {
                let got = ep.recv(None, &mut buf).unwrap();
                assert_eq!((got.from, got.len, u32::from_le_bytes(buf)), (0, 4, k as u32));
            }
        }
        ep.barrier().unwrap();
        ep.stats
    });
    assert!(stats[0].collected >= (n - BUFFERS) as u64, "{:?}", stats[0]);
}

#[test]
fn multicast_to_every_subset_of_four_ranks_reaches_exactly_its_members() {
    let job = Job::new(4, 2048, Duration::from_micros(100), 5);
    job.run(|me, ep| {
        let others: Vec<usize> = (0..4).filter(|&r| r != me).collect();
        // Every nonempty subset of the other three (as a multicast list),
        // and the whole job through `None`.
        for bits in 1u32..8 {
            let list: Vec<i64> = (0..3).filter(|i| bits & 1 << i != 0).map(|i| others[i] as i64).collect();
            ep.mcast(Some(&list), &message(me, bits as usize, 40 + bits as usize)).unwrap();
        }
        ep.mcast(None, &message(me, 99, 33)).unwrap();
        // What each sender sent us, in order.
        let mut buf = [0u8; 128];
        for s in (0..4).filter(|&s| s != me) {
            let theirs: Vec<usize> = (0..4).filter(|&r| r != s).collect();
            let pos = theirs.iter().position(|&r| r == me).unwrap();
            for bits in (1u32..8).filter(|b| b & 1 << pos != 0) {
                let got = ep.recv(Some(s as i64), &mut buf).unwrap();
                assert_eq!(got.len, 40 + bits as usize, "from {s}, subset {bits:03b}");
                assert_eq!(buf[..got.len], message(s, bits as usize, got.len)[..]);
            }
            let got = ep.recv(Some(s as i64), &mut buf).unwrap();
            assert_eq!(buf[..got.len], message(s, 99, 33)[..]);
        }
        ep.barrier().unwrap();
        // Nothing more for anyone.
        assert!(!ep.msgavail(None).unwrap());
    });
}

#[test]
fn every_refusal_names_its_limit_and_changes_nothing() {
    let job = Job::new(3, 64, Duration::ZERO, 1);
    let mut a = job.endpoint(0);
    let mut b = job.endpoint(1);
    let big = vec![0u8; 65];
    assert_eq!(a.send(1, &big), Err(BbpError::TooBig { len: 65, max: 64 }));
    assert!(a.send(1, &big).unwrap_err().to_string().contains("data partition holds 64 bytes"));
    assert_eq!(a.mcast(None, &big), Err(BbpError::TooBig { len: 65, max: 64 }));
    for r in [-1i64, 3, 1000, 0] {
        assert_eq!(a.send(r, b"x"), Err(BbpError::Rank { rank: r, nprocs: 3, me: 0 }), "rank {r}");
        assert!(matches!(a.mcast(Some(&[1, r]), b"x"), Err(BbpError::Rank { .. })));
        assert!(matches!(a.recv(Some(r), &mut []), Err(BbpError::Rank { .. })));
        assert!(matches!(a.msgavail(Some(r)), Err(BbpError::Rank { .. })));
    }
    assert!(matches!(a.mcast(Some(&[]), b"x"), Err(BbpError::Arg(_))));
    assert!(matches!(a.mcast(Some(&[1, 2, 1]), b"x"), Err(BbpError::Arg(_))));
    // Nothing was sent by any of those.
    assert_eq!(a.stats.sent, 0);
    assert_eq!(b.try_recv(None, &mut [0u8; 64]), Err(BbpError::Again));

    // A message that does not fit stays there for a larger buffer.
    a.send(1, &[7u8; 64]).unwrap();
    let t0 = Instant::now();
    while !b.msgavail(Some(0)).unwrap() {
        assert!(t0.elapsed() < Duration::from_secs(5));
    }
    assert_eq!(b.recv(Some(0), &mut [0u8; 10]), Err(BbpError::Truncated { len: 64, cap: 10, from: 0 }));
    let mut buf = [0u8; 64];
    assert_eq!(b.recv(None, &mut buf).map(|r| (r.from, r.len)), Ok((0, 64)));
    assert_eq!(buf, [7u8; 64]);

    // Shapes and ranks refused at the start.
    let bad = |nprocs, data_bytes, me| {
        Endpoint::new(job.bus(2), Geometry { nprocs, data_bytes }, me, 1, timing()).err().unwrap()
    };
    assert!(matches!(bad(0, 64, 0), BbpError::Arg(_)));
    assert!(matches!(bad(65, 64, 0), BbpError::Arg(_)));
    assert!(matches!(bad(3, 60, 2), BbpError::Arg(_)));
    assert!(matches!(bad(3, 64, 3), BbpError::Rank { rank: 3, .. }));
    // A share already in use (seen from node 1, which has received a
    // message posted after share 0's header).
    assert!(matches!(
        Endpoint::new(job.bus(1), job.geo, 0, 1, timing()).err().unwrap(),
        BbpError::Setup(m) if m.contains("in use")
    ));

    // After finalize, nothing; sending to a finalized rank is refused.
    b.finalize(Duration::from_secs(1)).unwrap();
    assert_eq!(b.send(0, b"x"), Err(BbpError::NotInit));
    assert_eq!(b.recv(None, &mut []), Err(BbpError::NotInit));
    let t0 = Instant::now();
    loop {
        match a.send(1, b"late") {
            Err(BbpError::Peer { rank: 1, why }) => {
                assert_eq!(why, "finalized");
                break;
            }
            Ok(()) => assert!(t0.elapsed() < Duration::from_secs(5), "rank 1's finalize never arrived"),
            Err(e) => panic!("{e}"),
        }
    }
}

#[test]
fn the_barrier_lets_nobody_through_before_everyone_arrived() {
    let job = Job::new(4, 256, Duration::from_micros(200), 9);
    let arrived = Arc::new(AtomicUsize::new(0));
    let rounds = 30;
    let a = arrived.clone();
    job.run(move |me, ep| {
        for round in 0..rounds {
            if (round + me) % 3 == 0 {
                thread::sleep(Duration::from_millis(1));
            }
            a.fetch_add(1, Ordering::SeqCst);
            ep.barrier().unwrap();
            let n = a.load(Ordering::SeqCst);
            assert!(n >= 4 * (round + 1), "rank {me} left barrier {round} with {n} arrivals");
            // And a user message between barriers is not taken for one.
            if me == 1 {
                ep.send(2, &[round as u8]).unwrap();
            }
            if me == 2 {
                let mut b = [0u8; 1];
                ep.recv(Some(1), &mut b).unwrap();
                assert_eq!(b[0], round as u8);
            }
        }
    });
    assert_eq!(arrived.load(Ordering::SeqCst), 4 * rounds);
}

#[test]
fn lost_stores_are_repaired_never_read_as_messages() {
    // The sender's link flaps while it streams: stores it makes while down
    // are lost everywhere, and it misses what others store meanwhile.
    for seed in [1u64, 2, 3] {
        let job = Job::new(3, 1024, Duration::from_micros(100), seed);
        let count = 300usize;
        let eps: Vec<_> = (0..3).map(|p| job.endpoint(p)).collect();
        let mut hs = Vec::new();
        let finishing = Arc::new(AtomicUsize::new(0));
        for (p, mut ep) in eps.into_iter().enumerate() {
            let finishing = finishing.clone();
            hs.push(thread::spawn(move || {
                let mut buf = [0u8; 1024];
                if p == 0 {
                    for k in 0..count {
                        let len = 1 + k * 37 % 900;
                        if k % 2 == 0 {
                            ep.send(1 + (k / 2 % 2) as i64, &message(0, k, len)).unwrap();
                        } else {
                            ep.mcast(None, &message(0, k, len)).unwrap();
                        }
                    }
                    ep.barrier().unwrap();
                } else {
                    for k in (0..count).filter(|k| k % 2 == 1 || 1 + k / 2 % 2 == p) {
                        let len = 1 + k * 37 % 900;
                        let got = ep.recv(Some(0), &mut buf).unwrap();
                        assert_eq!(got.len, len, "rank {p}, message {k}");
                        assert_eq!(buf[..len], message(0, k, len)[..], "rank {p}, message {k}");
                    }
                    ep.barrier().unwrap();
                }
                // The last stores (the barrier's release, acknowledgements)
                // are repaired only while their writer is there: finalize
                // stores them again until the error count stays still.
                finishing.fetch_add(1, Ordering::SeqCst);
                ep.finalize(Duration::from_secs(20)).unwrap();
                ep.stats
            }));
        }
        // Flap links (the sender's and a receiver's) while they run.
        let t0 = Instant::now();
        let mut flaps = 0;
        // Until everyone is finalizing (their last stores are repaired
        // after the flaps end).
        while finishing.load(Ordering::SeqCst) < 3 && !hs.iter().any(|h| h.is_finished()) {
            assert!(t0.elapsed() < Duration::from_secs(60), "seed {seed}: stuck");
            let n = flaps % 2;
            job.sim.link_down(n);
            thread::sleep(Duration::from_micros(300));
            job.sim.link_up(n);
            job.errors.fetch_add(1, Ordering::SeqCst);
            flaps += 1;
            thread::sleep(Duration::from_millis(3));
        }
        let stats: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        assert!(flaps > 3, "seed {seed}: only {flaps} flaps");
        assert!(stats.iter().map(|s| s.reposts).sum::<u64>() > 0, "{stats:?}");
    }
}

#[test]
fn a_dead_or_finalized_peer_ends_the_waits_on_it() {
    let job = Job::new(3, 256, Duration::ZERO, 4);
    let mut a = job.endpoint(0);
    let mut b = job.endpoint(1);
    let mut c = job.endpoint(2);
    // Rank 1 dies: a receive from it, and a receive from any once rank 2
    // has finalized, end with an error naming rank 1.
    job.dead.lock().unwrap().push(1001);
    let t0 = Instant::now();
    assert!(matches!(a.recv(Some(1), &mut []), Err(BbpError::Peer { rank: 1, .. })));
    assert!(t0.elapsed() < Duration::from_secs(2));
    // A message it left before dying is still delivered.
    b.send(2, b"last words").unwrap();
    let mut buf = [0u8; 16];
    let got = c.recv(None, &mut buf).unwrap();
    assert_eq!(&buf[..got.len], b"last words");
    assert!(matches!(c.recv(Some(1), &mut buf), Err(BbpError::Peer { rank: 1, .. })));
    // A sender whose buffers are all waiting on the dead rank stops too.
    let mut sent = 0;
    let err = loop {
        match a.send(1, &[]) {
            Ok(()) => sent += 1,
            Err(e) => break e,
        }
    };
    assert_eq!(sent, BUFFERS);
    assert!(matches!(err, BbpError::Peer { rank: 1, .. }), "{err}");
    // Rank 2 finalizes: a wait on it alone ends.
    c.finalize(Duration::from_secs(1)).unwrap();
    let t0 = Instant::now();
    let e = a.recv(Some(2), &mut []).expect_err("a message from nowhere");
    assert!(matches!(e, BbpError::Peer { rank: 2, ref why } if why == "finalized"), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(2));
}
