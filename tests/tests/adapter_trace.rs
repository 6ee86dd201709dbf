//! The register trace end to end: a real `mc-hub` with a local port, a
//! vfio-user client standing in for QEMU and its guest driver, and
//! `mc-hub trace` following the port's trace socket, decoded and as JSON,
//! with filters; a second follower takes over from the first; a bad
//! filter is a clear error.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::*;
use device::regs::{ctrl, int, pct, reg, BAR_TX, PAGE_SIZE};

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Lines of a child's stdout, as they come.
fn lines(out: ChildStdout) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    rx
}

/// Takes lines until one contains `want`; returns those seen (panics after 10 s).
fn until(rx: &mpsc::Receiver<String>, want: &str) -> Vec<String> {
    let mut seen = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(l) => {
                let hit = l.contains(want);
                seen.push(l);
                if hit {
                    return seen;
                }
            }
            Err(e) => panic!("no line with {want:?} ({e}); seen:\n{}", seen.join("\n")),
        }
    }
}

fn follow(socket: &Path, args: &[&str]) -> (Killed, mpsc::Receiver<String>) {
    let mut c = Command::new(tests::host_bin("mc-hub"))
        .args(["trace", "--socket"])
        .arg(socket)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run mc-hub trace");
    let rx = lines(c.stdout.take().unwrap());
    (Killed(c), rx)
}

#[test]
fn the_trace_shows_a_drivers_accesses_decoded_filtered_and_as_json() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let sock = d.join("n0.sock");
    let trace = d.join("n0.sock.trace");
    let _hub = Killed(
        Command::new(tests::host_bin("mc-hub"))
            .arg("--socket")
            .arg(d.join("hub.sock"))
            .args(["--max-nodes", "2", "--aspace-mib", "1", "--local"])
            .arg(format!("0:a:{}", sock.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    poll("the trace socket", || trace.exists().then_some(()));
    let mut g = VfioClient::connect(&sock);
    let ram = GuestRam::new(64 << 10);

    // Everything, decoded.
    let (_all, all) = follow(&trace, &[]);
    // The follower is attached once a marker access shows.
    poll("the follower to attach", || {
        g.reg(reg::ID);
        all.try_recv().ok()
    });
    g.dma_map(0x10000, 64 << 10, &ram, 0);
    g.set_reg(reg::CTRL, ctrl::RESET);
    g.set_reg(reg::INT_MASK, int::ALL);
    g.set_pct(3, pct::TX | pct::ACK, 0);
    g.region_write(BAR_TX, 3 * PAGE_SIZE + 16, &0xABCDu64.to_le_bytes(), true);
    g.reg(reg::ERR_STATUS);
    let seen = until(&all, "R ERR_STATUS");
    let want = [
        "DMA map 0x10000..0x20000",
        "W CTRL = 0x1 [RESET]",
        "W INT_MASK = 0xf [NOTIFY LINK ERROR DMA]",
        "W PCT[3].0 = 0x11 [TX ACK]",
        "W PCT[3].1 = 0x0",
        "W TX page 3 +0x10 (8 bytes) = 0xabcd",
        "R ERR_STATUS -> 0x0",
    ];
    let mut at = 0;
    for w in want {
        let i = seen[at..]
            .iter()
            .position(|l| l.ends_with(w))
            .unwrap_or_else(|| panic!("{w:?} not in the trace after line {at}:\n{}", seen.join("\n")));
        at += i + 1;
    }
    // CTRL.RESET is its register write only; QEMU's reset of the device
    // (vfio-user DEVICE_RESET) is `RESET`.
    assert!(!seen.iter().any(|l| l.ends_with(" RESET")), "{}", seen.join("\n"));
    g.request_ok(CMD_DEVICE_RESET, &[]);
    g.reg(reg::ERR_STATUS);
    let seen = until(&all, "R ERR_STATUS");
    assert!(seen.iter().any(|l| l.ends_with(" RESET")), "{}", seen.join("\n"));

    // A second follower takes over (the first is told and ends), with a
    // filter: PCT writes of pages 2-5, as JSON.
    let (_pct, pcts) = follow(&trace, &["--kind", "pct", "--pages", "2-5", "--dir", "w", "--json"]);
    std::thread::sleep(Duration::from_millis(300));
    g.set_pct(9, pct::RX, 0x10000);
    g.pct(4);
    g.set_reg(reg::INT_MASK, 0);
    g.set_pct(4, pct::RX | pct::INT, 0x12000);
    let l = until(&pcts, "\"page\":4");
    assert_eq!(l.len(), 1, "only the write to page 4 passes the filter: {l:?}");
    let v: serde_json::Value = serde_json::from_str(&l[0]).unwrap();
    assert_eq!((v["kind"].as_str(), v["write"].as_bool(), v["word"].as_u64()), (Some("pct"), Some(true), Some(0)));
    assert_eq!(v["value"].as_u64(), Some(pct::RX | pct::INT));
    assert!(v["seq"].as_u64().is_some() && v["t_us"].as_u64().is_some(), "{v}");

    // A bad filter is an error that names it.
    let out = Command::new(tests::host_bin("mc-hub"))
        .args(["trace", "--socket"])
        .arg(&trace)
        .args(["--reg", "NOPE"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--reg NOPE: no such register"), "{err}");
}
