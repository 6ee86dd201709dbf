//! QEMU tier: the MEMORY CHANNEL ordering rule end to end. A receiver that
//! sees a later write also sees every earlier write of the sender, in the
//! sender's program order, including writes that reach it in one packet.

use std::time::Instant;

use tests::{assert_order_test, field, Cluster};

/// Block sizes and rounds of each, weighted toward small blocks: 257,000
/// rounds, about 16 s of writing per size. On the default cluster (the
/// direct store path: every store its own vfio-user message and mostly its
/// own packet) under TCG on 2 cores, with the checker spinning on the other
/// core, the writer made 8,700 rounds/s of 64-byte blocks and 61 of
/// 8-KiB blocks (540 KB/s in all): the whole plan takes about 110 s. The
/// plan of the queued path (452,500 rounds, the larger blocks 4 to 7 times
/// as many) took 520 s on the direct path. Block and flag of the middle sizes
/// make packets of 264 to 2056 bytes, the sizes for which glibc's vector
/// memcpy (AVX2 above 256 bytes, AVX-512 above 512) stores the first vector
/// last.
const PLAN: [(u64, u64); 6] =
    [(64, 200_000), (256, 40_000), (1024, 10_000), (2048, 4_000), (4096, 2_000), (8192, 1_000)];

/// Node 0 stores, round after round, a block (every word the round number)
/// and then a flag word right after it (the round number): in the same page
/// below 8 KiB, so block and flag travel in one packet, in the next page for
/// an 8 KiB block. Node 1 polls the flags; for every flag f it reads, every
/// word of the block must already hold f or more. Each size has its own
/// pages. The checker must observe flags of every size (a run that checked
/// nothing fails) and see no violation.
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn stores_arrive_in_program_order() {
    let sizes: Vec<String> = PLAN.iter().map(|p| p.0.to_string()).collect();
    let rounds: Vec<String> = PLAN.iter().map(|p| p.1.to_string()).collect();
    let total_rounds: u64 = PLAN.iter().map(|p| p.1).sum();
    assert!(total_rounds >= 100_000);
    let args = format!("--sizes {} --rounds {}", sizes.join(","), rounds.join(","));

    let c = Cluster::up_raw("t-order", 2);
    c.background(1, "checker", &format!("mctool order-test --role checker {args} --timeout 600"));
    c.poll_until(1, &["cat", "/tmp/checker.log"], 60, |o| o.contains("checker ready"));
    let t0 = Instant::now();
    c.background(0, "writer", &format!("mctool order-test --role writer {args}"));
    let (wrc, wlog) = c.background_result(0, "writer", 900);
    let (crc, clog) = c.background_result(1, "checker", 300);
    let secs = t0.elapsed().as_secs_f64();
    println!("--- writer (node 0), exit {wrc}\n{wlog}--- checker (node 1), exit {crc}\n{clog}--- {secs:.1} s");

    assert_order_test(&PLAN, (&wrc, &wlog), (&crc, &clog));
    let total = wlog.lines().find(|l| l.starts_with("writer total")).unwrap_or_else(|| panic!("{wlog}"));
    assert_eq!(field(total, "rounds"), total_rounds, "{total}");
    // On the default store path (direct, QEMU's send buffer enlarged) the
    // flood never overruns QEMU: no register read behind it timed out
    // (docs/adapter.md, "The store path").
    let served: String = ["hub.log", "node0/adapter.log"]
        .iter()
        .map(|f| std::fs::read_to_string(c.run_dir().join(f)).unwrap_or_default())
        .collect();
    assert!(served.contains("store path: direct"), "the writer's stores did not take the direct path:\n{served}");
    let qlog = std::fs::read_to_string(c.run_dir().join("node0/qemu.log")).unwrap_or_default();
    assert!(!qlog.contains("timed out waiting for reply"), "QEMU's requests to the adapter timed out:\n{qlog}");
}
