//! The register trace on a real guest (`docs/adapter.md`, "Testing a
//! driver"): `mc-cluster trace NODE` follows node 1's adapter while its
//! guest reboots (`mc-cluster restart 1`, a new QEMU on the same local
//! port), and shows the bring-up of the guest's driver in order: QEMU
//! mapping guest memory, imcd resetting the adapter, programming its PCT,
//! clearing and enabling its interrupt causes, and the interrupts that
//! follow.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tests::Cluster;

#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn register_trace_shows_a_drivers_bring_up() {
    let c = Cluster::up("t-trace", 2);
    let mut follower = Command::new(tests::launcher())
        .args(["--name", &c.name, "trace", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("mc-cluster trace");
    let (tx, rx) = mpsc::channel();
    let out = follower.stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    // The follower is attached once an access of the running guest shows
    // (imcd polls registers).
    std::thread::sleep(Duration::from_millis(500));
    let out = Command::new(tests::launcher()).args(["--name", &c.name, "restart", "1"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    c.imcd_ready();
    // imcd is up: its bring-up is in the trace by now.
    std::thread::sleep(Duration::from_secs(1));
    let _ = follower.kill();
    let _ = follower.wait();
    let t0 = Instant::now();
    let mut lines = Vec::new();
    while let Ok(l) = rx.recv_timeout(Duration::from_millis(500)) {
        lines.push(l);
        assert!(t0.elapsed() < Duration::from_secs(30), "the trace never ended");
    }
    assert!(lines.len() > 20, "a short trace:\n{}", lines.join("\n"));
    // The bring-up, in order, after the new QEMU mapped guest memory.
    let steps = [
        "DMA map ",
        "W CTRL = 0x1 [RESET]",
        "W PCT[",
        "W INT_CAUSE = 0xf [NOTIFY LINK ERROR DMA]",
        "W INT_MASK = 0x7 [NOTIFY LINK ERROR]",
    ];
    let mut at = 0;
    for s in steps {
        match lines[at..].iter().position(|l| l.contains(s)) {
            Some(i) => at += i + 1,
            None => panic!("{s:?} not in the trace after line {at}:\n{}", lines.join("\n")),
        }
    }
    // Every line decodes (no undecodable event), and the guest's register
    // reads show by name.
    assert!(!lines.iter().any(|l| l.contains("undecodable")), "{}", lines.join("\n"));
    assert!(lines.iter().any(|l| l.contains("R NODE -> ") && l.contains("ports]")), "{}", lines.join("\n"));
    eprintln!(
        "{} trace lines; the bring-up:\n{}",
        lines.len(),
        lines.iter().take(at).cloned().collect::<Vec<_>>().join("\n")
    );
}
