//! QEMU tier for Direct Deposit (`guest/msg/dd`, `docs/dd.md`): two
//! guests, a receiver on node 1 and a sender on node 0, through the C API
//! (`tests/dd/deposit.c`, built against the installed `dd.h` and
//! `libdd.a`) and `dd-tool`.

use std::time::Duration;

use tests::{root, Cluster};

fn up(name: &str) -> Cluster {
    let c = Cluster::up(name, 2);
    c.imcd_ready();
    c
}

fn text(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
}

/// A number after `key` in `log` (`KEY 12`).
fn field(log: &str, key: &str) -> u64 {
    log.split(key)
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in:\n{log}"))
}

/// The C API: the sender places 24 messages at offsets it chooses, the
/// first at 0 and the last ending at the buffer's end; the receiver's
/// notes come in order with those offsets and lengths, and the bytes read
/// are the bytes sent. A send past the buffer is refused first.
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn dd_deposits_at_the_senders_offsets_and_notes_arrive_in_order() {
    let c = up("t-dd-deposit");
    let prog = c.share_c("dd", &root().join("tests/dd/deposit.c"));
    c.background(1, "recv", &format!("{prog} recv 0"));
    let sent = c.exec(0, &[&prog, "send", "1"]);
    assert!(sent.status.success(), "sender:\n{}", text(&sent));
    assert!(text(&sent).contains("deposit ok: sent 24 messages"), "{}", text(&sent));
    assert!(text(&sent).contains("do not fit the connection's buffer"), "{}", text(&sent));
    let (rc, log) = c.background_result(1, "recv", 120);
    assert_eq!(rc, "0", "receiver:\n{log}");
    assert!(log.contains("deposit ok: received 24 messages in order"), "{log}");
    assert_eq!(log.matches(" ok\n").count(), 24, "{log}");
    assert!(log.contains("note seq=24 offset=65512 len=24 ok"), "the last message ends at the buffer's end:\n{log}");
}

/// The blocking receive sleeps (little CPU while three messages come two
/// seconds apart) and wakes on each note (all three in about four
/// seconds, not at a timeout).
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn dd_blocking_receive_wakes_on_the_interrupt() {
    let c = up("t-dd-block");
    c.background(1, "recv", "dd-tool recv --peer 0 --count 3 --blocking --timeout-ms 30000");
    let sent = c.exec(0, &["dd-tool", "send", "--peer", "1", "--count", "3", "--delay-ms", "2000", "--mode", "stores"]);
    assert!(sent.status.success(), "{}", text(&sent));
    let (rc, log) = c.background_result(1, "recv", 60);
    assert_eq!(rc, "0", "{log}");
    assert_eq!(field(&log, "RECEIVED"), 3, "{log}");
    assert_eq!(field(&log, "ERRORS"), 0, "{log}");
    let (cpu, wall) = (field(&log, "CPU_US"), field(&log, "WALL_US"));
    eprintln!("dd blocking receive: {cpu} us of CPU in {wall} us");
    assert!(wall >= 3_000_000, "the receiver waited for the sender's pauses: {wall} us");
    assert!(wall < 25_000_000, "each note woke it (no timeouts): {wall} us");
    assert!(cpu * 5 < wall, "it slept while blocked: {cpu} us of CPU in {wall} us");
}

/// A message past the buffer, or not fitting at its offset, is refused at
/// the sender with an error naming the buffer, and nothing is written: the
/// sender's adapter transmitted no packet during the refused sends, and
/// the one message that fits arrives as note 1 (no note was used).
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn dd_refuses_an_offset_past_the_buffer_and_writes_nothing() {
    let c = up("t-dd-refuse");
    c.background(1, "recv", "dd-tool recv --peer 0 --bytes 65536 --count 1 --timeout-ms 60000");
    let o = c.exec(
        0,
        &[
            "dd-tool", "send", "--peer", "1", "--try", "65536:8", "--try", "65528:9", "--try", "0:65537", "--offset",
            "65528", "--size", "8",
        ],
    );
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    let refused: Vec<&str> = out.lines().filter(|l| l.starts_with("REFUSED")).collect();
    assert_eq!(refused.len(), 3, "{out}");
    for l in refused {
        assert!(l.contains("do not fit the connection's buffer of 65536 bytes"), "{l}");
        let counts = l.split("tx_packets=").nth(1).and_then(|t| t.split_whitespace().next()).unwrap();
        let (a, b) = counts.split_once("->").unwrap();
        assert_eq!(a, b, "a refused send transmitted packets: {l}");
    }
    let (rc, log) = c.background_result(1, "recv", 60);
    assert_eq!(rc, "0", "{log}");
    assert!(log.contains("NOTE conn=1 seq=1 offset=65528 len=8 dma=0 ok"), "{log}");
}

/// Sends by the transmit DMA engine: each has a completion status the
/// sender tests, the receiver's notes say DMA and the bytes are right,
/// and the engine moved the bytes.
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn dd_dma_sends_complete_and_report_status() {
    let c = up("t-dd-dma");
    let engine = |c: &Cluster| c.mctool_info(0)["dma_bytes"].as_u64().unwrap();
    let before = engine(&c);
    c.background(1, "recv", "dd-tool recv --peer 0 --bytes 1048576 --count 6");
    let o = c.exec(0, &["dd-tool", "send", "--peer", "1", "--count", "6", "--size", "150000", "--mode", "dma"]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    for seq in 1..=6 {
        assert!(out.contains(&format!("SENT seq={seq} ")), "{out}");
        assert!(out.contains(&format!("DONE seq={seq} dma=1 status=ok")), "{out}");
    }
    let (rc, log) = c.background_result(1, "recv", 120);
    assert_eq!(rc, "0", "{log}");
    assert_eq!(log.matches("len=150000 dma=1 ok").count(), 6, "{log}");
    let moved = engine(&c) - before;
    assert!(moved >= 6 * 150000, "the engine moved {moved} bytes");
}

/// Only the process that owns a connection sends on it: a second process
/// on the sending node asking imcd for the connection's transmit mapping
/// is refused with a clear error, and only the owner's message arrives.
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn dd_only_the_owner_may_send_on_a_connection() {
    let c = up("t-dd-owner");
    c.background(1, "recv", "dd-tool recv --peer 0 --count 1");
    c.background(0, "owner", "dd-tool send --peer 1 --count 1 --linger-ms 30000");
    c.poll_until(0, &["cat", "/tmp/owner.log"], 60, |o| o.contains("DONE seq=1"));
    let o = c.exec(0, &["dd-tool", "send", "--peer", "1", "--count", "1"]);
    assert!(!o.status.success(), "a second process sent on the connection:\n{}", text(&o));
    assert!(text(&o).contains("owned by another process"), "{}", text(&o));
    let (rc, log) = c.background_result(1, "recv", 60);
    assert_eq!(rc, "0", "{log}");
    assert_eq!(log.matches("NOTE ").count(), 1, "only the owner's message arrived:\n{log}");
    let (rc, log) = c.background_result(0, "owner", 60);
    assert_eq!(rc, "0", "{log}");
}

/// Under faults (the hub's corrupt bursts, short link flaps): every
/// message that arrives holds the right bytes, and a loss shows as an
/// error (a lost or damaged note, or the adapter's error count), never as
/// wrong data.
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn dd_faults_show_as_errors_never_as_wrong_data() {
    let c = up("t-dd-faults");
    let errs =
        |c: &Cluster| c.mctool_info(1)["err_count"].as_u64().unwrap() + c.mctool_info(0)["err_count"].as_u64().unwrap();
    let errs_before = errs(&c);
    c.background(1, "recv", "dd-tool recv --peer 0 --bytes 1048576 --count 400 --timeout-ms 15000");
    c.background(0, "send", "dd-tool send --peer 1 --count 400 --size 2000 --delay-ms 10 --mode stores");
    let done = |c: &Cluster| !c.exec(0, &["cat", "/tmp/send.rc"]).stdout.is_empty();
    let (mut bursts, mut flaps) = (0, 0);
    while !done(&c) && bursts < 12 {
        bursts += 1;
        c.hub(&["corrupt", &(bursts % 2).to_string(), "2"]);
        std::thread::sleep(Duration::from_millis(300));
        if bursts % 4 == 0 {
            flaps += 1;
            c.hub(&["link-down", "1"]);
            std::thread::sleep(Duration::from_millis(250));
            c.hub(&["link-up", "1"]);
        }
    }
    let (rc, sent) = c.background_result(0, "send", 300);
    let (rrc, log) = c.background_result(1, "recv", 300);
    eprintln!(
        "dd faults: {bursts} corrupt bursts, {flaps} flaps\n{}",
        log.lines().filter(|l| !l.starts_with("NOTE")).collect::<Vec<_>>().join("\n")
    );
    assert!(!log.contains("WRONG"), "wrong bytes were handed out:\n{log}");
    assert!(rrc == "0" || rrc == "3", "receiver exit {rrc}:\n{log}");
    let (ok, errors) = (field(&log, "RECEIVED"), field(&log, "ERRORS"));
    let adapter_errors = errs(&c) - errs_before;
    if rc == "0" && ok < 400 {
        assert!(errors > 0 || adapter_errors > 0, "{} messages vanished without an error:\n{log}", 400 - ok);
    }
    assert!(rc == "0" || sent.contains("Busy") || sent.contains("released"), "sender:\n{sent}");
    assert!(ok > 0, "nothing came through:\n{log}");
}
