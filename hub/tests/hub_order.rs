//! The hub over real Unix sockets with blocking link clients: one global
//! order for concurrent senders, node-id refusal, and surviving garbage.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{Arc, Barrier};

use std::time::Duration;

use device::link_client as client;

use link::{Msg, ANY_NODE, BROADCAST, FLAG_LOOPBACK};

const IO_TIMEOUT: Duration = Duration::from_secs(10);

use hub::testing::{read_event, Seen, TestHub as Hub};

fn join(path: &Path, want: u16, name: &str) -> io::Result<(client::Joined, UnixStream, io::BufWriter<UnixStream>)> {
    let r = client::join(path, want, 8192, 128, name)?;
    r.1.set_read_timeout(Some(IO_TIMEOUT))?;
    Ok(r)
}

const CLIENTS: usize = 4;
const WRITES: u64 = 500;

fn addr_of(k: usize, i: u64) -> u64 {
    ((k as u64) << 32) | (i * 8)
}
fn data_of(k: usize, i: u64) -> [u8; 8] {
    ((k as u64) << 48 | i).to_le_bytes()
}

#[test]
fn hub_orders_concurrent_senders_small() {
    let hub = Hub::start();
    // All join first, so every one of them receives every write.
    let clients: Vec<_> = (0..CLIENTS).map(|k| join(&hub.path, ANY_NODE, &format!("c{k}")).unwrap()).collect();
    let nodes: Vec<u16> = clients.iter().map(|c| c.0.node).collect();
    let mut uniq = nodes.clone();
    uniq.sort_unstable();
    uniq.dedup();
    assert_eq!(uniq.len(), CLIENTS, "node ids not distinct: {nodes:?}");

    let start = Arc::new(Barrier::new(CLIENTS));
    let mut senders = Vec::new();
    let mut receivers = Vec::new();
    for (k, (joined, mut reader, mut writer)) in clients.into_iter().enumerate() {
        let start = start.clone();
        senders.push(std::thread::spawn(move || {
            start.wait();
            for i in 0..WRITES {
                let d = data_of(k, i);
                let f = Msg::Write { dest: BROADCAST, flags: FLAG_LOOPBACK, addr: addr_of(k, i), data: &d }.encode();
                writer.write_all(&f).unwrap();
                // Flush often so the senders' frames interleave at the hub.
                if i % 4 == 3 {
                    writer.flush().unwrap();
                }
            }
            writer.flush().unwrap();
            writer // keep the link open until the test is done
        }));
        receivers.push(std::thread::spawn(move || {
            let mut buf = Vec::new();
            let mut seen = Vec::new();
            let mut delivers = 0;
            while delivers < CLIENTS * WRITES as usize {
                let e = read_event(&mut reader, &mut buf).1;
                if matches!(e, Seen::Deliver { .. }) {
                    delivers += 1;
                }
                seen.push(e);
            }
            (joined, seen, reader)
        }));
    }
    let _writers: Vec<_> = senders.into_iter().map(|t| t.join().expect("sender panicked")).collect();
    let results: Vec<_> = receivers.into_iter().map(|t| t.join().expect("receiver panicked")).collect();

    let mut reference: Option<Vec<(u64, u16, u64)>> = None;
    for (k, (joined, seen, _)) in results.iter().enumerate() {
        // Sequence numbers: the first event after joining carries Welcome's
        // next_seq, and from there on every numbered event reaches this node
        // (broadcast + loopback), so they are contiguous.
        for (j, e) in seen.iter().enumerate() {
            assert_eq!(e.seq(), joined.next_seq + j as u64, "client {k}: event {j} has a gap or goes backwards: {e:?}");
        }
        // Members seen: exactly the nodes that joined after this one, all up.
        let members: Vec<u16> = seen
            .iter()
            .filter_map(|e| match e {
                Seen::Member { node, up: true, .. } => Some(*node),
                Seen::Member { node, up: false, .. } => panic!("client {k}: node {node} left during the test"),
                _ => None,
            })
            .collect();
        assert_eq!(members, nodes[k + 1..].to_vec(), "client {k}: membership events");

        let delivers: Vec<(u64, u16, u64)> = seen
            .iter()
            .filter_map(|e| match e {
                Seen::Deliver { seq, src, flags, addr, data } => {
                    let s = nodes.iter().position(|n| n == src).expect("src is one of ours");
                    assert_eq!(addr >> 32, s as u64, "client {k}: write from node {src} carries another's address");
                    assert_eq!(&data[..], &data_of(s, (addr & 0xFFFF_FFFF) / 8)[..], "client {k}: payload");
                    assert_eq!(*flags, FLAG_LOOPBACK);
                    Some((*seq, *src, *addr))
                }
                Seen::Member { .. } => None,
            })
            .collect();
        assert_eq!(delivers.len(), CLIENTS * WRITES as usize);
        // Each sender's writes arrive complete, once, and in the order sent.
        for (s, node) in nodes.iter().enumerate() {
            let from: Vec<u64> = delivers.iter().filter(|d| d.1 == *node).map(|d| d.2).collect();
            let want: Vec<u64> = (0..WRITES).map(|i| addr_of(s, i)).collect();
            assert_eq!(from, want, "client {k}: writes of node {node} missing, duplicated or reordered");
        }
        // Seq strictly increasing (also implied by the contiguity check above).
        assert!(delivers.windows(2).all(|w| w[0].0 < w[1].0), "client {k}: seq not increasing");
        match &reference {
            None => reference = Some(delivers),
            Some(r) => assert!(*r == delivers, "client {k} saw another order than client 0"),
        }
    }
    let r = reference.unwrap();
    let switches = r.windows(2).filter(|w| w[0].1 != w[1].1).count();
    eprintln!("{switches} changes of sender in the global order of {} writes", r.len());
}

#[test]
fn hub_refuses_taken_node_id() {
    let hub = Hub::start();
    let (first, _r1, _w1) = join(&hub.path, 1, "first").unwrap();
    assert_eq!(first.node, 1);
    assert_eq!(first.members, vec![1]);
    let e = join(&hub.path, 1, "second").expect_err("a second node 1 was accepted");
    assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused);
    assert!(e.to_string().contains("already taken"), "unexpected refusal: {e}");
    // Out-of-range ids are refused as well; a free id still works.
    let e = join(&hub.path, 8, "outside").expect_err("node 8 on an 8-port hub was accepted");
    assert!(e.to_string().contains("outside"), "unexpected refusal: {e}");
    let (other, _r2, _w2) = join(&hub.path, ANY_NODE, "any").unwrap();
    assert_eq!(other.node, 0);
    assert_eq!(other.members, vec![0, 1]);
    // Once node 1 leaves, its id is free again.
    drop((_r1, _w1));
    let deadline = std::time::Instant::now() + IO_TIMEOUT;
    let again = loop {
        match join(&hub.path, 1, "again") {
            Ok(j) => break j,
            Err(e) if std::time::Instant::now() < deadline && e.to_string().contains("already taken") => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(e) => panic!("node 1 not freed: {e}"),
        }
    };
    assert_eq!(again.0.node, 1);
}

#[test]
fn hub_drops_garbage_peer_and_continues() {
    let hub = Hub::start();
    // A node that is up before the garbage arrives.
    let (old, mut old_r, _old_w) = join(&hub.path, ANY_NODE, "old").unwrap();

    let mut g = UnixStream::connect(&hub.path).unwrap();
    g.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    let garbage: Vec<u8> = (0..32u8).map(|i| i.wrapping_mul(37) ^ 0x5C).collect();
    g.write_all(&garbage).unwrap();
    let mut b = [0u8; 64];
    match g.read(&mut b) {
        Ok(0) => {}
        Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {}
        Ok(n) => panic!("hub answered garbage with {n} bytes instead of closing"),
        Err(e) => panic!("hub did not close the garbage link: {e}"),
    }

    // Two normal clients join and exchange a write.
    let (a, _a_r, mut a_w) = join(&hub.path, ANY_NODE, "a").unwrap();
    let (bj, mut b_r, _b_w) = join(&hub.path, ANY_NODE, "b").unwrap();
    assert_eq!(bj.members.len(), 3, "members at b's join: {:?}", bj.members);
    a_w.write_all(&Msg::Write { dest: bj.node, flags: 0, addr: 0x2000, data: b"after-garbage" }.encode()).unwrap();
    a_w.flush().unwrap();
    let mut buf = Vec::new();
    let got = loop {
        match read_event(&mut b_r, &mut buf).1 {
            Seen::Member { .. } => continue,
            d => break d,
        }
    };
    match got {
        Seen::Deliver { src, addr, data, flags, .. } => {
            assert_eq!((src, addr, flags), (a.node, 0x2000, 0));
            assert_eq!(&data[..], b"after-garbage");
        }
        other => panic!("unexpected {other:?}"),
    }
    // The old node saw a and b join (point-to-point write not for it), and
    // the garbage peer never became a member.
    let e1 = read_event(&mut old_r, &mut buf).1;
    let e2 = read_event(&mut old_r, &mut buf).1;
    assert!(matches!(e1, Seen::Member { node, up: true, .. } if node == a.node), "{e1:?}");
    assert!(matches!(e2, Seen::Member { node, up: true, .. } if node == bj.node), "{e2:?}");
    assert_eq!(e1.seq(), old.next_seq);
    assert_eq!(e2.seq(), old.next_seq + 1);
    // Nothing else pending for old: the point-to-point write went to b only.
    old_r.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let mut one = [0u8; 1];
    match old_r.read(&mut one) {
        Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
        other => panic!("old node received something extra: {other:?}"),
    }
}
