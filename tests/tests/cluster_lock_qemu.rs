//! QEMU tier: the cluster spinlock (total order + loopback, no other
//! hardware help) on real guests.

use mc_tests::Cluster;

/// Three guests each increment a counter kept in MEMORY CHANNEL space 200
/// times under the cluster spinlock, with plain loads and stores: every node
/// ends with the exact total, so no update was lost.
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn cluster_spinlock_counts_exactly_across_three_guests() {
    let c = Cluster::up("t-lock", 3);
    for n in 0..3 {
        c.run(n, &["sh", "-c", "(mctool lock-test --nodes 3 --rounds 200 > /tmp/lk.log 2>&1; echo $? > /tmp/lk.rc) &"]);
    }
    for n in 0..3 {
        let rc = c.poll_until(n, &["sh", "-c", "cat /tmp/lk.rc 2>/dev/null"], 120, |o| !o.trim().is_empty());
        let log = String::from_utf8(c.run(n, &["cat", "/tmp/lk.log"])).unwrap();
        assert_eq!(rc.trim(), "0", "node {n}:\n{log}");
        assert!(log.contains("counter 600 of 600 exact"), "node {n}:\n{log}");
    }
}
