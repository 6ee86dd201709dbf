//! QEMU tier: the cluster spinlock (total order + loopback, no other
//! hardware help) on real guests.

use tests::Cluster;

/// Three guests each increment a counter kept in MEMORY CHANNEL space 200
/// times under the cluster spinlock, with plain loads and stores: every node
/// ends with the exact total, so no update was lost.
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn cluster_spinlock_counts_exactly_across_three_guests() {
    let c = Cluster::up_raw("t-lock", 3);
    for n in 0..3 {
        c.background(n, "lk", "mctool lock-test --nodes 3 --rounds 200");
    }
    for n in 0..3 {
        let (rc, log) = c.background_result(n, "lk", 120);
        assert_eq!(rc, "0", "node {n}:\n{log}");
        assert!(log.contains("counter 600 of 600 exact"), "node {n}:\n{log}");
    }
}
