//! QEMU tier for UMP (issue 6): channels between guests over MEMORY
//! CHANNEL, and between processes of one guest over shared memory, with
//! the same program (`ump-tool`).

use tests::Cluster;

fn up(name: &str, nodes: usize) -> Cluster {
    let c = Cluster::up(name, nodes);
    c.imcd_ready();
    c
}

/// Every message size from 0 B to 1 MiB there and back between two
/// guests, contents checked, through a 32 KiB MEMORY CHANNEL buffer (the
/// large ones stream through it).
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn ump_pingpong_two_guests() {
    let c = up("t-ump", 2);
    c.background(1, "serve", "ump-tool serve --me 1 --peer 2");
    let sizes = "0,1,2,3,4,5,7,8,9,31,32,33,100,1K,4K,8K,32K,33K,64K,256K,1M";
    let out = c.exec(0, &["ump-tool", "pingpong", "--me", "2", "--peer", "1", "--rounds", "2", "--sizes", sizes]);
    let (text, err) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{text}{err}");
    assert!(err.contains("open over Mc"), "guests talk over MEMORY CHANNEL: {err}");
    assert!(text.contains("size 1048576 ok") && text.contains("pingpong ok: 21 sizes"), "{text}");
    let (rc, log) = c.background_result(1, "serve", 60);
    assert_eq!(rc, "0", "{log}");
    assert!(log.contains("served 42 messages"), "{log}");

    // ump_listen: a server on node 1 accepts clients it does not know, one
    // from the other guest (MEMORY CHANNEL inbox) and one from its own.
    c.background(1, "listen", "ump-tool listen --me 50 --count 2");
    c.poll_until(1, &["cat", "/tmp/listen.log"], 20, |o| o.contains("listening"));
    let far = c.exec(0, &["ump-tool", "pingpong", "--me", "60", "--peer", "50", "--sizes", "8,5000", "--rounds", "1"]);
    assert!(far.status.success(), "{}", String::from_utf8_lossy(&far.stderr));
    let near = c.exec(1, &["ump-tool", "pingpong", "--me", "61", "--peer", "50", "--sizes", "8", "--rounds", "1"]);
    assert!(near.status.success(), "{}", String::from_utf8_lossy(&near.stderr));
    let (rc, log) = c.background_result(1, "listen", 60);
    assert_eq!(rc, "0", "{log}");
    assert!(log.contains("on a Mc channel") && log.contains("on a Shm channel"), "{log}");
}

/// Four processes on two guests, every pair talking at once: the pairs on
/// one guest over shared memory, the others over MEMORY CHANNEL, chosen
/// by UMP_ANY with the same program.
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn ump_mixed_transports() {
    let c = up("t-ump-mixed", 2);
    let all = [1u64, 2, 3, 4];
    for h in all {
        let node = if h <= 2 { 0 } else { 1 };
        let peers: Vec<String> = all.iter().filter(|&&p| p != h).map(|p| p.to_string()).collect();
        c.background(
            node,
            &format!("m{h}"),
            &format!("ump-tool mesh --me {h} --peers {} --rounds 10", peers.join(",")),
        );
    }
    // Every process's outcome first: one that failed may have made
    // another fail, and the first failure is the one to see.
    let results: Vec<(u64, String, String)> = all
        .iter()
        .map(|&h| {
            let (rc, log) = c.background_result(if h <= 2 { 0 } else { 1 }, &format!("m{h}"), 240);
            (h, rc, log)
        })
        .collect();
    let logs: String = results.iter().map(|(h, rc, log)| format!("--- process {h} (exit {rc}):\n{log}\n")).collect();
    for (h, rc, log) in &results {
        let h = *h;
        assert_eq!(rc, "0", "process {h} failed; all four:\n{logs}");
        assert!(log.contains("mesh ok: 10 rounds with 3 peers"), "process {h}:\n{log}");
        for p in all.iter().filter(|&&p| p != h) {
            let same = (h <= 2) == (*p <= 2);
            let want = format!("{p}:{}", if same { "Shm" } else { "Mc" });
            assert!(log.contains(&want), "process {h} to {p} should be {want}:\n{log}");
        }
    }
}

/// `ump_mcast` to three guests: every receiver gets every message intact
/// and in order, and the sender puts each message on the wire once (its
/// outbuf is received by every node), not once per receiver: the hub
/// counts the bytes node 0 sent.
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn ump_mcast_reaches_all() {
    let c = up("t-ump-mcast", 4);
    for n in 1..4 {
        c.background(n, "mr", &format!("ump-tool mcast-recv --me {} --from 1 --count 40", n + 1));
    }
    let bytes_in = |c: &Cluster| -> u64 {
        let s: serde_json::Value = serde_json::from_str(&c.hub(&["stats"])).unwrap();
        s["nodes"].as_array().unwrap().iter().find(|n| n["node"] == 0).unwrap()["bytes_in"].as_u64().unwrap()
    };
    let before = bytes_in(&c);
    let out = c.exec(0, &["ump-tool", "mcast-send", "--me", "1", "--peers", "2,3,4", "--count", "40"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    let sent: u64 = text.split(" bytes").next().and_then(|s| s.rsplit(' ').next()).unwrap().parse().unwrap();
    for n in 1..4 {
        let (rc, log) = c.background_result(n, "mr", 120);
        assert_eq!(rc, "0", "node {n}:\n{log}");
        assert!(log.contains("open over Mc") && log.contains("received 40 multicast messages intact"), "{log}");
    }
    let wire = bytes_in(&c) - before;
    eprintln!("ump_mcast: {sent} bytes to 3 receivers, {wire} bytes from the sender's node on the wire");
    assert!(wire > sent, "the payload went out ({wire} bytes on the wire for {sent})");
    assert!(
        wire < sent + sent / 2,
        "each message went out once, not once per receiver: {wire} bytes on the wire for {sent} bytes to 3 receivers"
    );
}

/// Frames lost on the way while two guests ping-pong (corrupted frames
/// both ways, and short link flaps within imcd's grace): the receiving
/// side never delivers a hole, asks for the lost bytes again, and every
/// echo comes back intact. Messages of 8 B to 100 KB: the largest stream
/// through the 32 KiB buffer in chunks, each repaired on its own. The
/// ping-pong goes over its sizes again until every fault has been made
/// (`--until`), however fast the guests are.
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn ump_repairs_lost_frames() {
    let c = up("t-ump-loss", 2);
    c.background(1, "serve", "ump-tool serve --me 1 --peer 2");
    c.background(
        0,
        "ping",
        "ump-tool pingpong --me 2 --peer 1 --rounds 300 --sizes 8,1000,20K,100K --timeout 120 --until /tmp/faults-made",
    );
    let done = |c: &Cluster| !c.exec(0, &["cat", "/tmp/ping.rc"]).stdout.is_empty();
    let (mut corrupted, mut flaps) = (0, 0);
    while (corrupted < 8 || flaps < 2) && !done(&c) {
        corrupted += 1;
        c.hub(&["corrupt", &(corrupted % 2).to_string(), "2"]);
        std::thread::sleep(std::time::Duration::from_millis(300));
        if corrupted % 4 == 0 {
            flaps += 1;
            c.hub(&["link-down", "1"]);
            std::thread::sleep(std::time::Duration::from_millis(250));
            c.hub(&["link-up", "1"]);
        }
    }
    c.exec(0, &["touch", "/tmp/faults-made"]);
    let (rc, log) = c.background_result(0, "ping", 300);
    eprintln!("ump_repairs_lost_frames: {corrupted} corrupt bursts, {flaps} flaps\n{log}");
    assert_eq!(rc, "0", "{log}");
    assert!(log.contains("pingpong ok: 4 sizes"), "{log}");
    let (rc, served) = c.background_result(1, "serve", 60);
    assert_eq!(rc, "0", "{served}");
    let asked = |text: &str| -> u64 {
        text.split("repairs: asked ").nth(1).and_then(|t| t.split(',').next()).and_then(|n| n.parse().ok()).unwrap_or(0)
    };
    assert!(asked(&log) + asked(&served) > 0, "lost bytes were asked for again:\n{log}\n{served}");
}

/// Large UMP messages go into the other side's ring by the adapter's
/// transmit DMA engine: contents checked both ways, the writer counts
/// the bytes it sent by DMA, and the adapter's DMA_BYTES moved by at
/// least as many. With `UMP_DMA_THRESHOLD=0` nothing goes by DMA.
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn ump_large_messages_use_dma() {
    let c = up("t-ump-dma", 2);
    let engine = |c: &Cluster| c.mctool_info(0)["dma_bytes"].as_u64().unwrap();
    let sent_by_dma = |text: &str| -> u64 {
        text.split("dma: ").nth(1).and_then(|t| t.split(' ').next()).and_then(|n| n.parse().ok()).unwrap()
    };
    let before = engine(&c);
    c.background(1, "serve", "ump-tool serve --me 1 --peer 2");
    let out =
        c.exec(0, &["ump-tool", "pingpong", "--me", "2", "--peer", "1", "--rounds", "2", "--sizes", "8,20K,256K,1M"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("pingpong ok: 4 sizes"), "{text}");
    let payload = 2 * (20 << 10) + 2 * (256 << 10) + 2 * (1 << 20);
    let dma = sent_by_dma(&text);
    let moved = engine(&c).wrapping_sub(before) & 0xFFFF_FFFF;
    eprintln!("ump_large_messages_use_dma: {payload} bytes of payload, {dma} sent by DMA, engine moved {moved}");
    assert!(dma >= payload / 2, "most of the payload went by DMA ({dma} of {payload})\n{text}");
    assert!(moved >= dma, "the adapter's engine moved what UMP sent by DMA ({moved} < {dma})");
    let (rc, log) = c.background_result(1, "serve", 60);
    assert_eq!(rc, "0", "{log}");
    assert!(sent_by_dma(&log) >= payload / 2, "the echoes went by DMA too:\n{log}");

    // DMA off: stores only, the engine idle on node 0.
    c.background(1, "serve2", "ump-tool serve --me 3 --peer 4");
    let before = engine(&c);
    let out = c.exec(0, &["sh", "-c", "UMP_DMA_THRESHOLD=0 ump-tool pingpong --me 4 --peer 3 --rounds 2 --sizes 256K"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("dma: 0 bytes"), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(engine(&c), before, "the engine stayed idle with UMP_DMA_THRESHOLD=0");
}

/// Whether a MEMORY CHANNEL peer is alive is found off the data path: with
/// imcd frozen on both guests (it may be busy for seconds with a repair),
/// a ping-pong goes on; and a peer process that is killed is reported as
/// gone within seconds, long before the caller's own timeout.
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn ump_liveness_is_off_the_data_path() {
    let c = up("t-ump-live", 2);
    let running =
        |c: &Cluster, node: usize, tag: &str| c.exec(node, &["cat", &format!("/tmp/{tag}.rc")]).stdout.is_empty();
    c.background(1, "serve", "ump-tool serve --me 1 --peer 2 --timeout 120");
    c.background(0, "ping", "ump-tool pingpong --me 2 --peer 1 --rounds 4000 --sizes 8,4K --timeout 10");
    c.poll_until(0, &["cat", "/tmp/ping.log"], 60, |o| o.contains("open over Mc"));
    assert!(running(&c, 0, "ping"), "the ping-pong is under way: {}", c.background_log(0, "ping"));
    for n in 0..2 {
        c.run(n, &["sh", "-c", "kill -STOP $(pidof imcd)"]);
    }
    std::thread::sleep(std::time::Duration::from_secs(12));
    let during = running(&c, 0, "ping");
    for n in 0..2 {
        c.run(n, &["sh", "-c", "kill -CONT $(pidof imcd)"]);
    }
    let (rc, log) = c.background_result(0, "ping", 300);
    eprintln!("ump_liveness_is_off_the_data_path: still running after 12 s of frozen imcd: {during}\n{log}");
    assert_eq!(rc, "0", "pings went on while imcd was frozen (10 s timeout per message):\n{log}");
    assert!(log.contains("pingpong ok: 2 sizes"), "{log}");

    // A killed peer: the reader waiting for its echo hears of it.
    c.background(1, "serve2", "ump-tool serve --me 3 --peer 4 --timeout 120");
    c.background(0, "ping2", "ump-tool pingpong --me 4 --peer 3 --rounds 1000000 --sizes 8 --timeout 120");
    c.poll_until(0, &["cat", "/tmp/ping2.log"], 60, |o| o.contains("open over Mc"));
    std::thread::sleep(std::time::Duration::from_secs(1));
    c.run(1, &["sh", "-c", "kill -9 $(pidof ump-tool)"]);
    let t0 = std::time::Instant::now();
    let (rc, log) = c.background_result(0, "ping2", 60);
    let took = t0.elapsed();
    eprintln!("ump_liveness_is_off_the_data_path: peer killed, reader stopped after {took:?}\n{log}");
    assert_ne!(rc, "0", "{log}");
    assert!(log.contains("the other side is gone"), "the reader says why: {log}");
    assert!(took < std::time::Duration::from_secs(30), "found within seconds, not by the 120 s timeout ({took:?})");
}
