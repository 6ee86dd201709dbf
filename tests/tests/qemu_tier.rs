//! QEMU tier: real guests, real adapters, a real hub. Ignored by a plain
//! `cargo test`; `scripts/test.sh` runs them (`-- --ignored`).

use std::time::{Duration, Instant};

use launcher::{processes_mentioning, sockets_in};
use testkit::pattern;
use tests::Cluster;

const PAGE: usize = 8192;

/// Node 0 fills page 0 with a non-repeating pattern and page 1 with another;
/// node 1 receives page 0 (and page 2, the flag) but not page 1. The flag is
/// stored after the pattern, so by total order node 1 has all of page 0 once
/// it sees the flag.
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn two_guests_store_reaches_peer() {
    let c = Cluster::up_raw("t-store", 2);
    c.run(1, &["mctool", "rx", "--pages", "0-2"]);
    // Page 1 is in the buffer but only pages 0 and 2 are receive-enabled.
    c.run(1, &["sh", "-c", "mctool stop && mctool rx --pages 0,2"]);
    c.run(0, &["mctool", "fill", "--page", "0", "--seed", "1996"]);
    c.run(0, &["mctool", "fill", "--page", "1", "--seed", "64"]);
    c.run(0, &["mctool", "poke", "--page", "2", "--value", "24301"]);
    let seen = c.run(1, &["mctool", "wait", "--page", "2", "--value", "24301", "--timeout", "20"]);
    assert!(String::from_utf8_lossy(&seen).contains("seen after"));

    let page0 = c.run(1, &["mctool", "dump", "--page", "0"]);
    assert_eq!(page0.len(), PAGE);
    assert_eq!(page0, pattern(1996, 0, PAGE), "node 1's receive buffer must hold exactly node 0's pattern");
    let page1 = c.run(1, &["mctool", "dump", "--page", "1"]);
    assert!(page1.iter().all(|&b| b == 0), "page 1 is not receive-enabled on node 1 and must stay untouched");

    // The adapter counted the page-1 packets as dropped, not applied.
    c.run(1, &["mctool", "stop"]);
    let info = c.mctool_info(1);
    let dropped = info["rx_dropped"].as_u64().unwrap_or_else(|| panic!("no rx_dropped in {info}"));
    assert!(dropped > 0, "page-1 packets should be counted as dropped: {info}");
    assert_eq!(info["members"], serde_json::json!([0, 1]), "{info}");
}

/// Killing a guest's QEMU mid-run: `down` still leaves no process and no
/// socket behind.
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn killed_qemu_then_down_leaves_nothing() {
    let c = Cluster::up("t-kill", 2);
    let rd = c.run_dir();
    assert!(!processes_mentioning(&rd).is_empty());
    let qemu_pid = c.state()["nodes"][1]["qemu_pid"].as_u64().unwrap() as i32;
    // SAFETY: kill(2) on the QEMU the launcher started for node 1.
    assert_eq!(unsafe { libc::kill(qemu_pid, libc::SIGKILL) }, 0);
    // The supervisor notices; node 0 keeps working.
    let t0 = Instant::now();
    while c.state()["nodes"][1]["qemu_exit"].is_null() {
        assert!(t0.elapsed() < Duration::from_secs(10), "supervisor did not notice the dead QEMU");
        std::thread::sleep(Duration::from_millis(100));
    }
    c.run(0, &["true"]);
    if std::env::var("MC_TEST_ADAPTERS").as_deref() != Ok("per-guest") {
        // The hub served node 1's adapter: the dead QEMU is announced as a
        // failed node, and the hub no longer lists it.
        let stats = c.hub(&["stats"]);
        assert!(!stats.contains("\"node\": 1,"), "node 1 still listed after its QEMU died:\n{stats}");
        assert!(stats.contains("\"node\": 0,"), "{stats}");
        let log = std::fs::read_to_string(rd.join("hub.log")).unwrap();
        assert!(log.contains("local port left: its QEMU went away"), "{log}");
    }
    let out = c.exec(1, &["true"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("node 1 is down"));

    let said = c.down();
    assert!(said.contains("is down"), "{said}");
    assert_eq!(processes_mentioning(&rd), Vec::<u32>::new(), "processes left behind");
    assert_eq!(sockets_in(&rd), Vec::<std::path::PathBuf>::new(), "sockets left behind");
}

/// Ctrl-C while `mc-cluster up` waits for the guests: everything it started
/// is stopped and no socket is left.
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn ctrl_c_during_up_leaves_nothing() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let _serial = tests::serial();
    let rd = tests::root().join(".run/t-ctrlc");
    let mut up = Command::new(tests::launcher())
        .args(["--name", "t-ctrlc", "up", "--nodes", "2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(up.stdout.take().unwrap()).lines();
    // Wait until the guests are booting, then interrupt.
    loop {
        let l = lines.next().expect("up ended before the guests booted").unwrap();
        if l.contains("guests booting") {
            break;
        }
    }
    assert!(!processes_mentioning(&rd).is_empty(), "something should be running");
    // SAFETY: kill(2) on the child we started.
    unsafe { libc::kill(up.id() as i32, libc::SIGINT) };
    let status = up.wait().unwrap();
    assert!(!status.success(), "an interrupted up must not report success");
    assert_eq!(processes_mentioning(&rd), Vec::<u32>::new(), "processes left behind");
    assert_eq!(sockets_in(&rd), Vec::<std::path::PathBuf>::new(), "sockets left behind");
}

/// The cluster over the hub's TCP transport (challenge and secret), with
/// real guests: node 0's page reaches node 1, and the hub refuses a client
/// without the secret.
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn two_guests_over_tcp_transport() {
    let cfg = tests::root().join("qemu-configs/tcp-loopback.toml");
    let c = Cluster::up_with("t-tcp", 2, &["--config", cfg.to_str().unwrap()]);
    assert!(c.up_output.contains("on tcp:127.0.0.1:"), "{}", c.up_output);
    // imcd runs over it: a region by key, written on node 0, read on node 1.
    c.imcd_ready();
    c.background(1, "get", "mctool imc-get --key 42 --value 4242 --timeout 60");
    c.poll_until(1, &["cat", "/tmp/get.log"], 20, |o| o.contains("waiting"));
    c.run(0, &["mctool", "imc-put", "--key", "42", "--value", "4242"]);
    let (rc, log) = c.background_result(1, "get", 60);
    assert!(rc == "0" && log.contains("all 1024 words read 4242"), "{rc}: {log}");
    // Someone on the network without the secret is turned away.
    let addr = std::fs::read_to_string(c.run_dir().join("hub.tcp")).unwrap();
    let mut raw = std::net::TcpStream::connect(addr.trim()).unwrap();
    let mut buf = Vec::new();
    let _challenge = link::read_frame(&mut raw, &mut buf).unwrap();
    let hello = link::Msg::Hello {
        want_node: 0xFFFF,
        page_size: 8192,
        aspace_pages: 8,
        auth: None,
        name: "intruder",
        keepalive: false,
    };
    std::io::Write::write_all(&mut raw, &hello.encode()).unwrap();
    let h = link::read_frame(&mut raw, &mut buf).unwrap();
    assert!(matches!(link::Msg::parse(&h, &buf), Ok(link::Msg::Refuse { .. })));
    assert!(c.hub(&["stats"]).contains("\"rejected\": 1"));
}
