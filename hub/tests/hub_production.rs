//! The hub under load and faults: many concurrent senders, a flood against a
//! slow receiver, a stuck receiver, TCP with the cluster secret, stable ids.
//! Real sockets, the real hub, simulated adapters (raw link clients).

use std::io::{BufWriter, Read, Write};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use device::link_client::{self as client, HubAddr, Joined, Stream};
use hub::hub::{Control, ControlReply, HubConfig};
use link::{self as link, Msg, ANY_NODE, BROADCAST, FLAG_LOOPBACK};

use hub::testing::TestHub;

mod common;
use common::Sim;

/// `nodes` simulated adapters broadcast `per_node` writes each at once;
/// every receiver must see the identical sequence.
fn orders_concurrent_senders(nodes: usize, per_node: usize) {
    let hub = TestHub::start_with(HubConfig { max_nodes: nodes, ..HubConfig::default() });
    let sims: Vec<Sim> = (0..nodes).map(|i| Sim::join(&hub.path, &format!("n{i}"))).collect();
    let total = nodes * per_node;
    let start = Arc::new(Barrier::new(nodes));
    let handles: Vec<_> = sims
        .into_iter()
        .map(|mut s| {
            let start = start.clone();
            thread::spawn(move || {
                let me = s.joined.node;
                let mut rd = Sim {
                    joined: s.joined.clone(),
                    r: s.r.try_clone().unwrap(),
                    w: BufWriter::new(s.r.try_clone().unwrap()),
                    seq: 0,
                    expect: s.expect,
                    buf: Vec::new(),
                };
                let reader = thread::spawn(move || {
                    (0..total)
                        .map(|_| rd.next_delivery())
                        .map(|(seq, src, addr, _)| (seq, src, addr))
                        .collect::<Vec<_>>()
                });
                start.wait();
                for k in 0..per_node {
                    s.write(BROADCAST, FLAG_LOOPBACK, (me as u64) << 32 | k as u64, &(k as u64).to_le_bytes());
                    if k % 64 == 0 {
                        s.flush();
                    }
                }
                s.flush();
                reader.join().unwrap()
            })
        })
        .collect();
    let seen: Vec<Vec<(u64, u16, u64)>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    for (i, s) in seen.iter().enumerate() {
        assert_eq!(s.len(), total);
        assert_eq!(s, &seen[0], "node {i} saw another order than node 0");
        assert!(s.windows(2).all(|w| w[0].0 < w[1].0), "sequence numbers increase");
    }
    // Each sender's writes come through complete and in its own order.
    for n in 0..nodes as u16 {
        let mine: Vec<u64> = seen[0].iter().filter(|e| e.1 == n).map(|e| e.2 & 0xFFFF_FFFF).collect();
        assert_eq!(mine, (0..per_node as u64).collect::<Vec<_>>());
    }
}

#[test]
fn hub_orders_concurrent_senders() {
    orders_concurrent_senders(8, 400);
    orders_concurrent_senders(64, 40);
}

/// A receiver that does not read: senders are held back (the queue and the
/// socket buffers fill, no more), memory stays bounded, and once it reads
/// again everything arrives, in order, nothing lost.
#[test]
fn hub_flood_memory_bounded() {
    let depth = 64;
    let hub = TestHub::start_with(HubConfig {
        queue_depth: depth,
        stall_timeout: Duration::from_secs(60),
        ..HubConfig::default()
    });
    let mut slow = Sim::join(&hub.path, "slow");
    let mut fast = Sim::join(&hub.path, "fast");
    let n = 200_000usize;
    let payload = [0x5Au8; 256];
    let sender = thread::spawn(move || {
        for k in 0..n {
            fast.write(BROADCAST, 0, k as u64, &payload);
        }
        fast.flush();
        fast
    });
    // Let the flood run against the silent receiver.
    thread::sleep(Duration::from_millis(1500));
    let s1 = hub.stats_json();
    thread::sleep(Duration::from_millis(500));
    let s2 = hub.stats_json();
    let writes = |s: &serde_json::Value| {
        s["nodes"].as_array().unwrap().iter().find(|n| n["name"] == "fast").unwrap()["writes_in"].as_u64().unwrap()
    };
    let queued = |s: &serde_json::Value| {
        s["nodes"].as_array().unwrap().iter().find(|n| n["name"] == "slow").unwrap()["queued"].as_u64().unwrap()
    };
    assert!(writes(&s1) < n as u64, "the sender should be held back, but all {n} writes were taken");
    assert_eq!(writes(&s1), writes(&s2), "the sender must be stalled while the receiver does not read");
    assert!(queued(&s2) <= depth as u64, "queue over its bound: {}", queued(&s2));
    // Hub memory: frames held are at most the queue plus socket buffers.
    // Now drain: everything arrives in order.
    for k in 0..n {
        let (_, _, addr, data) = slow.next_delivery();
        assert_eq!(addr, k as u64, "delivery {k} out of order or lost");
        assert_eq!(data.len(), payload.len());
    }
    sender.join().unwrap();
}

/// A receiver whose queue stays full past the stall timeout is cut off and
/// its failure announced; the others go on.
#[test]
fn hub_stuck_receiver_is_cut_off() {
    let hub = TestHub::start_with(HubConfig {
        queue_depth: 8,
        stall_timeout: Duration::from_millis(300),
        ..HubConfig::default()
    });
    let stuck = Sim::join(&hub.path, "stuck");
    let mut watcher = Sim::join(&hub.path, "watcher");
    let mut sender = Sim::join(&hub.path, "sender");
    let stuck_id = stuck.joined.node;
    let t0 = Instant::now();
    let w = thread::spawn(move || {
        // The watcher reads everything: writes and, eventually, the stuck node's departure.
        let mut saw_leave = false;
        let mut writes = 0;
        while !saw_leave || writes < 100_000 {
            let hdr = link::read_frame(&mut watcher.r, &mut watcher.buf).unwrap();
            match Msg::parse(&hdr, &watcher.buf).unwrap() {
                Msg::Member { node, up: false, .. } if node == stuck_id => saw_leave = true,
                Msg::Deliver { .. } => writes += 1,
                _ => {}
            }
        }
        saw_leave
    });
    for k in 0..100_000u64 {
        sender.write(BROADCAST, 0, k, &[1; 64]);
    }
    sender.flush();
    assert!(w.join().unwrap(), "the stuck node's failure was announced");
    assert!(t0.elapsed() < Duration::from_secs(20));
    let st = hub.stats_json();
    assert_eq!(st["stalled"], 1, "{st}");
    assert!(st["nodes"].as_array().unwrap().iter().all(|n| n["name"] != "stuck"), "{st}");
    drop(stuck);
}

fn tcp_join(addr: &str, secret: Option<&[u8]>) -> std::io::Result<(Joined, Stream, BufWriter<Stream>)> {
    client::join_addr(
        &HubAddr::Tcp(addr.into()),
        &client::Hello {
            want_node: ANY_NODE,
            page_size: 8192,
            aspace_pages: 64,
            name: "remote",
            secret,
            keepalive: false,
        },
    )
}

/// TCP adapters must prove the cluster secret: the right one joins, a wrong
/// or missing one is refused (and counted), and the hub goes on.
#[test]
fn hub_rejects_wrong_secret() {
    let secret = b"correct horse battery staple".to_vec();
    let hub = TestHub::start_with(HubConfig { secret: Some(secret.clone()), ..HubConfig::default() });
    let addr = hub.listen_tcp();
    let e = tcp_join(&addr, Some(b"wrong secret, same length....")).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
    assert!(e.to_string().contains("wrong cluster secret"), "{e}");
    // A client that has no secret cannot even answer the challenge.
    let e = tcp_join(&addr, None).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
    // A raw peer that answers the challenge with a Hello without auth.
    let mut raw = std::net::TcpStream::connect(&addr).unwrap();
    let mut buf = Vec::new();
    let h = link::read_frame(&mut raw, &mut buf).unwrap();
    assert!(matches!(Msg::parse(&h, &buf).unwrap(), Msg::Challenge { .. }));
    raw.write_all(
        &Msg::Hello {
            want_node: ANY_NODE,
            page_size: 8192,
            aspace_pages: 8,
            auth: None,
            name: "raw",
            keepalive: false,
        }
        .encode(),
    )
    .unwrap();
    let h = link::read_frame(&mut raw, &mut buf).unwrap();
    match Msg::parse(&h, &buf).unwrap() {
        Msg::Refuse { reason } => assert!(reason.contains("no cluster secret"), "{reason}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(raw.read(&mut [0u8; 1]).unwrap(), 0, "the hub closes after refusing");
    // The client without a secret just hung up: the hub counts that when it
    // sees the close, which on a busy machine may come after the refusals.
    let t0 = Instant::now();
    while hub.stats_json()["rejected"] != 3 && t0.elapsed() < Duration::from_secs(5) {
        thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(hub.stats_json()["rejected"], 3);

    // The right secret joins over TCP and talks to a Unix-socket node.
    let mut local = Sim::join(&hub.path, "local");
    let (joined, mut r, mut w) = tcp_join(&addr, Some(&secret)).unwrap();
    let f = Msg::Write { dest: local.joined.node, flags: 0, addr: 0x40, data: &[7; 8] }.encode();
    link::write_stamped(&mut w, &f, 1).unwrap();
    w.flush().unwrap();
    let (_, src, a, d) = local.next_delivery();
    assert_eq!((src, a, d), (joined.node, 0x40, vec![7; 8]));
    drop(r.flush());
}

/// An adapter that asks for any id gets the one its name had before, so a
/// restarted guest comes back as the same node; an explicit id is honoured.
#[test]
fn hub_node_ids_are_stable_per_name() {
    let hub = TestHub::start();
    let a = Sim::join(&hub.path, "alpha");
    let b = Sim::join(&hub.path, "beta");
    let c = Sim::join_as(&hub.path, 5, "gamma");
    assert_eq!((a.joined.node, b.joined.node, c.joined.node), (0, 1, 5));
    drop(a);
    drop(b);
    thread::sleep(Duration::from_millis(200));
    // beta comes back first but still gets 1, not the lower free 0.
    let b2 = Sim::join(&hub.path, "beta");
    let a2 = Sim::join(&hub.path, "alpha");
    assert_eq!((a2.joined.node, b2.joined.node), (0, 1));
    let d = Sim::join(&hub.path, "delta");
    assert_eq!(d.joined.node, 2);
}

/// `corrupt N COUNT`: the next COUNT frames to N fail their CRC at the
/// receiver (the adapter counts them and does not apply them), later frames
/// are intact, and the hub counts what it corrupted.
#[test]
fn hub_corrupt_packet_counted_not_applied() {
    let hub = TestHub::start();
    let mut a = Sim::join(&hub.path, "a");
    let mut b = Sim::join(&hub.path, "b");
    assert_eq!(hub.control(Control::Corrupt { node: b.joined.node, count: 2 }), ControlReply::Ok);
    for k in 0..3u64 {
        a.write(BROADCAST, 0, 0x1000 + 8 * k, &k.to_le_bytes());
    }
    a.flush();
    let mut crc_errors = 0;
    let mut applied = Vec::new();
    while applied.is_empty() {
        let hdr = link::read_frame(&mut b.r, &mut b.buf).unwrap();
        assert_eq!(link::check_link_seq(&mut b.expect, hdr.link_seq), 0, "corruption must not lose frames");
        match Msg::parse(&hdr, &b.buf) {
            Err(link::LinkError::BadCrc) => crc_errors += 1,
            Ok(Msg::Deliver { addr, .. }) => applied.push(addr),
            Ok(Msg::Member { .. }) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(crc_errors, 2);
    assert_eq!(applied, vec![0x1010], "only the third write arrives intact");
    let st = hub.stats_json();
    let bstats = st["nodes"].as_array().unwrap().iter().find(|n| n["name"] == "b").unwrap().clone();
    assert_eq!(bstats["corrupted"], 2, "{st}");
    // Unknown node and a node that is not connected are refused.
    assert!(matches!(hub.control(Control::Corrupt { node: 99, count: 1 }), ControlReply::Error { .. }));
    assert!(matches!(hub.control(Control::Corrupt { node: 7, count: 1 }), ControlReply::Error { .. }));
}

/// `delay N MICROS` holds frames to N back by that long, and 0 turns it off.
#[test]
fn hub_delay_holds_frames_back() {
    let hub = TestHub::start();
    let mut a = Sim::join(&hub.path, "a");
    let mut b = Sim::join(&hub.path, "b");
    let one_way = |a: &mut Sim, b: &mut Sim, k: u64| {
        let t0 = Instant::now();
        a.write(BROADCAST, 0, k, &k.to_le_bytes());
        a.flush();
        assert_eq!(b.next_delivery().2, k);
        t0.elapsed()
    };
    one_way(&mut a, &mut b, 0);
    assert_eq!(hub.control(Control::Delay { node: b.joined.node, micros: 400_000 }), ControlReply::Ok);
    let slow = one_way(&mut a, &mut b, 1);
    assert!(slow >= Duration::from_millis(400), "delayed delivery took only {slow:?}");
    assert_eq!(hub.control(Control::Delay { node: b.joined.node, micros: 0 }), ControlReply::Ok);
    // The frame already waiting behind the delay may still be held once.
    one_way(&mut a, &mut b, 2);
    let fast = one_way(&mut a, &mut b, 3);
    assert!(fast < Duration::from_millis(200), "delay 0 still slow: {fast:?}");
    assert!(matches!(hub.control(Control::Delay { node: 6, micros: 1 }), ControlReply::Error { .. }));
}

/// `--pcap`: every ordered frame (writes as delivered, membership events) is
/// in the capture, in order, and `mc-hub pcap` decodes it.
#[test]
fn hub_pcap_records_the_order() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("trace.pcap");
    let hub = TestHub::start();
    hub.hub.capture_to(&file).unwrap();
    let mut a = Sim::join(&hub.path, "a");
    let mut b = Sim::join(&hub.path, "b");
    for k in 0..5u64 {
        a.write(BROADCAST, 0, 0x2000 + 8 * k, &[k as u8; 8]);
    }
    a.flush();
    for _ in 0..5 {
        b.next_delivery();
    }
    drop(b);
    // members up (a, b) + 5 writes + member down (b) = 8 records.
    let t0 = Instant::now();
    let text = loop {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_mc-hub")).arg("pcap").arg(&file).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8(out.stdout).unwrap();
        if text.lines().count() >= 8 || t0.elapsed() > Duration::from_secs(5) {
            break text;
        }
        thread::sleep(Duration::from_millis(50));
    };
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 8, "{text}");
    assert!(lines[0].contains("member node 0 up"), "{text}");
    assert!(lines[1].contains("member node 1 up"), "{text}");
    for (k, l) in lines[2..7].iter().enumerate() {
        assert!(l.contains("write  src 0   to all") && l.contains(&format!("addr {:#010x}", 0x2000 + 8 * k)), "{l}");
        assert!(l.contains(&format!("{:02x}{:02x}", k, k)), "payload shown: {l}");
    }
    assert!(lines[7].contains("member node 1 down"), "{text}");
    // Sequence numbers in the capture increase one by one.
    let seqs: Vec<u64> = lines.iter().map(|l| l.split_whitespace().nth(2).unwrap().parse().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
    // A capture cut short in its last record (as one still being written
    // can be): every whole record, and a note.
    let whole = std::fs::read(&file).unwrap();
    std::fs::write(dir.path().join("cut"), &whole[..whole.len() - 3]).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mc-hub"))
        .arg("pcap")
        .arg(dir.path().join("cut"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 7);
    assert!(String::from_utf8_lossy(&out.stderr).contains("the last record is incomplete"));
    // Not a capture: a clear error.
    std::fs::write(dir.path().join("junk"), b"not a pcap file at all, definitely").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mc-hub"))
        .arg("pcap")
        .arg(dir.path().join("junk"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a MEMORY CHANNEL capture"));

    // Started and stopped from the control socket (`mc-cluster capture`).
    let again = dir.path().join("again.pcap");
    let refused = hub.control(Control::CaptureStart { file: "relative.pcap".into() });
    assert!(
        matches!(&refused, ControlReply::Error { message } if message.contains("not an absolute path")),
        "{refused:?}"
    );
    assert_eq!(hub.control(Control::CaptureStart { file: again.clone() }), ControlReply::Ok);
    a.write(BROADCAST, 0, 0x4000, &[0x5a; 8]);
    a.flush();
    let decoded = || {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_mc-hub")).arg("pcap").arg(&again).output().unwrap();
        String::from_utf8(out.stdout).unwrap()
    };
    let t0 = Instant::now();
    while !decoded().contains("addr 0x00004000") {
        assert!(t0.elapsed() < Duration::from_secs(5), "the write after capture-start: {}", decoded());
        thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(decoded().lines().count(), 1, "only what was ordered after the start: {}", decoded());
    assert_eq!(hub.control(Control::CaptureStop), ControlReply::Ok);
    a.write(BROADCAST, 0, 0x6000, &[1; 8]);
    a.flush();
    thread::sleep(Duration::from_millis(200));
    assert!(!decoded().contains("addr 0x00006000"), "nothing after the stop");
    assert!(matches!(hub.control(Control::CaptureStop), ControlReply::Error { .. }));
    // What the monitor reads: writes per page with their writers, step
    // times, and the hub's copy of imcd's pages (0x4000 is page 2).
    let ControlReply::Observe(seen) = hub.control(Control::Observe { first: 2, count: 1 }) else { panic!() };
    let page2 = seen.pages.iter().find(|p| p.0 == 2).expect("page 2 in the heat map");
    assert_eq!(page2.2, 1 << a.joined.node, "written by a only: {:?}", seen.pages);
    assert!(page2.1 >= 1 && seen.pages.iter().any(|p| p.0 == 1 && p.1 >= 5), "{:?}", seen.pages);
    assert_eq!(seen.step_ns.len(), hub::hub::BUCKETS);
    let (timed, writes) = (seen.step_ns.iter().sum::<u64>(), seen.pages.iter().map(|p| p.1).sum::<u64>());
    assert!(
        timed >= 1 && timed <= writes.div_ceil(hub::hub::TIME_EVERY) + 1,
        "one step in 8 timed: {timed} of {writes}"
    );
    assert_eq!(&seen.shadow[..16], "5a5a5a5a5a5a5a5a", "the copy holds the write at 0x4000");
    let past = hub.control(Control::Observe { first: 47, count: 2 });
    assert!(matches!(&past, ControlReply::Error { message } if message.contains("past the 48 pages")), "{past:?}");
    let bad = hub.control(Control::CaptureStart { file: dir.path().join("no/such/dir/x.pcap") });
    assert!(matches!(&bad, ControlReply::Error { message } if message.contains("no/such/dir")), "{bad:?}");
}

/// The control socket answers every line, for as long as a client likes:
/// bytes that are not UTF-8 and an oversize line get an error reply and the
/// connection goes on; 20,000 requests (over 256 KiB) on one connection are
/// all answered; a delay past the limit is refused.
#[test]
fn control_socket_answers_every_line() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let (sock, ctl) = (dir.path().join("hub.sock"), dir.path().join("hub.ctl"));
    let mut hub = std::process::Command::new(env!("CARGO_BIN_EXE_mc-hub"))
        .arg("--socket")
        .arg(&sock)
        .arg("--control")
        .arg(&ctl)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !ctl.exists() {
        assert!(t0.elapsed() < Duration::from_secs(10), "the hub never made its control socket");
        thread::sleep(Duration::from_millis(20));
    }
    let s = std::os::unix::net::UnixStream::connect(&ctl).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut w = s.try_clone().unwrap();
    let mut r = std::io::BufReader::new(s);
    let mut ask = |w: &mut std::os::unix::net::UnixStream, req: &[u8]| {
        w.write_all(req).unwrap();
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        line
    };
    let reply = ask(&mut w, b"\xff\xfe{\n");
    assert!(reply.contains("not UTF-8"), "{reply}");
    let mut long = vec![b'x'; 5000];
    long.push(b'\n');
    let reply = ask(&mut w, &long);
    assert!(reply.contains("over 4096 bytes"), "{reply}");
    let reply = ask(&mut w, b"{\"cmd\":\"delay\",\"node\":0,\"micros\":18446744073709551615}\n");
    assert!(reply.contains("limit"), "{reply}");
    let one = b"{\"cmd\":\"stats\"}\n";
    let n = 20_000;
    assert!(n * one.len() > 256 * 1024);
    let batch: Vec<u8> = one.iter().copied().cycle().take(one.len() * 100).collect();
    let mut answered = 0;
    for _ in 0..n / 100 {
        w.write_all(&batch).unwrap();
        for _ in 0..100 {
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            assert!(line.starts_with("{\"reply\":\"stats\""), "reply {answered}: {line}");
            answered += 1;
        }
    }
    assert_eq!(answered, n, "every request is answered");
    hub.kill().unwrap();
    let _ = hub.wait();
}
