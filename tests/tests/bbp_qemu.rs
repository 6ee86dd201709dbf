//! QEMU tier for the Billboard Protocol (`guest/msg/bbp`, `docs/bbp.md`):
//! one 4-guest cluster, shared by every test here ([`tests::shared`]),
//! one rank per guest through `mc-cluster mpirun` (`mpiexec` gives each
//! rank its rank, the job size and a job number), with `bbp-tool` and the
//! C API (`tests/bbp/pingmcast.c`, built against the installed `bbp.h`
//! and `libbbp.a`). Each test leaves the cluster as it found it.

use std::process::Command;
use std::sync::MutexGuard;
use std::time::{Duration, Instant};

use tests::{launcher, root, Cluster};

const NODES: usize = 4;

fn cluster() -> MutexGuard<'static, Cluster> {
    let c = tests::shared("t-bbp", NODES, &[]);
    c.imcd_ready();
    c
}

/// `mc-cluster mpirun -n 4 --ppn 1 PROG ARGS…`: exit code and output.
fn mpirun(c: &Cluster, prog: &str, args: &[&str]) -> (Option<i32>, String) {
    let o = Command::new("timeout")
        .arg("300")
        .arg(launcher())
        .args(["--name", &c.name, "mpirun", "-n", &NODES.to_string(), "--ppn", "1", prog])
        .args(args)
        .output()
        .unwrap();
    (o.status.code(), String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr))
}

/// Ranks 0..4 each printed a line starting with `prefix R`.
fn every_rank_says(out: &str, prefix: &str) {
    for r in 0..NODES {
        assert!(out.contains(&format!("{prefix} {r}")), "rank {r} did not say {prefix:?}:\n{out}");
    }
}

/// Pingpong between rank 0 and each other guest (0 B to 4 KiB), then
/// every rank multicasting to every subset of the other three, contents
/// checked at every receiver, with barriers between rounds; then the same
/// through the C API (polling and any-source receives, `BBP_ALL`, the
/// refusals). Nothing but the sent messages arrives.
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn bbp_pingpong_and_multicast_across_four_guests() {
    let c = cluster();
    let (rc, out) = mpirun(&c, "/bin/bbp-tool", &["check", "--rounds", "2"]);
    assert_eq!(rc, Some(0), "bbp-tool check:\n{out}");
    every_rank_says(&out, "OK rank");
    assert!(out.contains("pingpong, multicast to every subset, barrier, 2 rounds"), "{out}");
    let prog = c.share_c("bbp", &root().join("tests/bbp/pingmcast.c"));
    let (rc, out) = mpirun(&c, &prog, &[]);
    assert_eq!(rc, Some(0), "pingmcast.c:\n{out}");
    every_rank_says(&out, "OK rank");
    assert!(out.contains("of 4"), "{out}");
}

/// 200 barriers across the four guests; before each, every rank sends its
/// right neighbour the barrier's number, which must be there when the
/// barrier returns (nobody leaves before everyone arrived). Then a rank
/// that is killed ends the others' waits with an error naming the dead
/// process, within seconds, instead of hanging them.
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn bbp_barrier_across_four_guests() {
    let c = cluster();
    let (rc, out) = mpirun(&c, "/bin/bbp-tool", &["barrier", "--rounds", "200"]);
    assert_eq!(rc, Some(0), "bbp-tool barrier:\n{out}");
    every_rank_says(&out, "OK rank");
    assert!(out.contains("200 barriers, median"), "{out}");
    // Ranks started by hand (explicit rank, size and job), so that no
    // launcher tears the job down: rank 2 is killed mid-barrier.
    for n in 0..NODES {
        let cmd = format!("bbp-tool --rank {n} --nprocs {NODES} --job 4242 barrier --rounds 1000000");
        c.background(n, "bar", &cmd);
    }
    std::thread::sleep(Duration::from_secs(3));
    let t0 = Instant::now();
    c.run(2, &["killall", "-9", "bbp-tool"]);
    // Rank 0 (the barrier's root) waits on rank 2 and names it; ranks 1
    // and 3 wait on rank 0, and name whichever death they saw first.
    for n in [0, 1, 3] {
        let (rc, log) = c.background_result(n, "bar", 60);
        assert_ne!(rc, "0", "node {n} finished a million barriers:\n{log}");
        let named = log.contains("rank 2: process") || (n != 0 && log.contains("rank 0: process"));
        assert!(named, "node {n}'s error does not name the dead rank:\n{log}");
    }
    eprintln!("bbp: the survivors of a killed rank stopped within {:?}", t0.elapsed());
}

/// The stream workload (rank 0 sends 4000 messages of up to 4 KiB, every
/// other one multicast to all) while the hub corrupts bursts of packets
/// and drops links for a moment: every message arrives intact and in
/// order, or the job ends with an error; never a wrong byte. The repairs
/// (reposts after the error count moved) show in the ranks' counters.
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn bbp_survives_corrupt_bursts_and_flaps() {
    let c = cluster();
    let errs = |c: &Cluster| (0..NODES).map(|n| c.mctool_info(n)["err_count"].as_u64().unwrap()).sum::<u64>();
    let before = errs(&c);
    let job = std::thread::scope(|s| {
        let job = s.spawn(|| mpirun(&c, "/bin/bbp-tool", &["stream", "--count", "4000", "--max", "4096"]));
        let t0 = Instant::now();
        let (mut bursts, mut flaps) = (0, 0);
        std::thread::sleep(Duration::from_secs(3));
        while !job.is_finished() && t0.elapsed() < Duration::from_secs(60) {
            bursts += 1;
            c.hub(&["corrupt", &(bursts % NODES).to_string(), "2"]);
            std::thread::sleep(Duration::from_millis(400));
            if bursts % 3 == 0 {
                flaps += 1;
                let n = (flaps % (NODES - 1) + 1).to_string();
                c.hub(&["link-down", &n]);
                std::thread::sleep(Duration::from_millis(250));
                c.hub(&["link-up", &n]);
            }
        }
        eprintln!("bbp faults: {bursts} corrupt bursts, {flaps} flaps");
        job.join().unwrap()
    });
    let (rc, out) = job;
    let errors = errs(&c) - before;
    eprintln!("bbp faults: {errors} adapter errors counted\n{out}");
    assert!(!out.contains("contents differ") && !out.contains("bytes from"), "a wrong message was handed out:\n{out}");
    assert!(errors > 0, "the faults were not counted by the adapters");
    if rc == Some(0) {
        for r in 1..NODES {
            assert!(out.contains(&format!("OK rank {r}: ")), "rank {r}:\n{out}");
        }
        let reposts: u64 = out
            .lines()
            .filter_map(|l| l.split("reposts ").nth(1))
            .filter_map(|t| t.split_whitespace().next()?.parse::<u64>().ok())
            .sum();
        assert!(reposts > 0, "lost stores were repaired by reposts:\n{out}");
    } else {
        // An error must name what ended the job.
        assert!(out.contains("rank ") && out.contains("Error"), "the job failed without saying why:\n{out}");
    }
    // The cluster is whole again for the next test (a node that imcd
    // repaired out during the flaps rejoins first).
    let t0 = Instant::now();
    loop {
        let (rc, out) = mpirun(&c, "/bin/bbp-tool", &["barrier", "--rounds", "5"]);
        if rc == Some(0) {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(90), "not whole 90 s after the faults:\n{out}\n{}", c.guest_logs());
        std::thread::sleep(Duration::from_secs(3));
    }
}

/// Eight ranks, two on each guest (ranks on one node read each other's
/// shares through the node's own receive memory, so the billboard is
/// transmitted with loopback): the whole check, pingpong with every rank
/// and multicast from every rank to every subset of the other seven.
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn bbp_eight_ranks_two_per_guest() {
    let c = cluster();
    let o = Command::new("timeout")
        .arg("600")
        .arg(launcher())
        .args(["--name", &c.name, "mpirun", "-n", "8", "--ppn", "2", "/bin/bbp-tool", "check", "--rounds", "1"])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "bbp-tool check on 8 ranks:\n{out}");
    for r in 0..8 {
        assert!(out.contains(&format!("OK rank {r} of 8")), "rank {r}:\n{out}");
    }
}
