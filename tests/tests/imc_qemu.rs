//! QEMU tier for imcd and libimc (the TruCluster MEMORY CHANNEL API).

use mc_tests::Cluster;

/// A region allocated by key is the same region on every guest (the
/// clusterwide directory lives in MEMORY CHANNEL space), and data moves by
/// plain stores and loads in the processes: imcd only sets the mappings up.
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn imc_region_by_key_spans_guests() {
    let c = Cluster::up("t-imc", 2);
    for n in 0..2 {
        c.run(n, &["sh", "-c", "imcd > /tmp/imcd.log 2>&1 &"]);
        c.poll_until(n, &["cat", "/tmp/imcd.log"], 20, |o| o.contains("listening"));
    }
    c.run(
        1,
        &["sh", "-c", "(mctool imc-get --key 42 --value 7 --timeout 60 > /tmp/get.log 2>&1; echo $? > /tmp/get.rc) &"],
    );
    let waiting = c.poll_until(1, &["cat", "/tmp/get.log"], 20, |o| o.contains("waiting"));
    assert!(waiting.contains("created"), "node 1 creates the region:\n{waiting}");
    let put = String::from_utf8(c.run(0, &["mctool", "imc-put", "--key", "42", "--value", "7"])).unwrap();
    assert!(put.contains("existing") && put.contains("pages 16..17"), "node 0 finds node 1's region:\n{put}");
    let rc = c.poll_until(1, &["sh", "-c", "cat /tmp/get.rc 2>/dev/null"], 60, |o| !o.trim().is_empty());
    let log = String::from_utf8(c.run(1, &["cat", "/tmp/get.log"])).unwrap();
    assert_eq!(rc.trim(), "0", "{log}");
    assert!(log.contains("all 1024 words read 7"), "{log}");
    // A different key is a different region, after the first one.
    let other = String::from_utf8(c.run(0, &["mctool", "imc-put", "--key", "43", "--value", "1"])).unwrap();
    assert!(other.contains("created") && other.contains("pages 17..18"), "{other}");
}

/// Issue 5: 3 nodes × 2 processes each increment a shared counter (a
/// region in MEMORY CHANNEL space) 1000 times under an `imc_lkacquire`
/// lock, with plain loads and stores; the final value is exact everywhere.
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn spinlock_mutual_exclusion_across_nodes() {
    let c = Cluster::up("t-imclock", 3);
    for n in 0..3 {
        c.run(n, &["sh", "-c", "imcd > /tmp/imcd.log 2>&1 &"]);
        c.poll_until(n, &["cat", "/tmp/imcd.log"], 20, |o| o.contains("listening"));
    }
    // Every node receives the counter before anyone increments it.
    for n in 0..3 {
        let out = String::from_utf8(c.run(n, &["mctool", "imc-lock-test", "--setup"])).unwrap();
        assert!(out.contains("ready"), "{out}");
    }
    for n in 0..3 {
        c.run(
            n,
            &["sh", "-c", "(mctool imc-lock-test --procs 2 --rounds 1000 --total 6000 > /tmp/lt.log 2>&1; echo $? > /tmp/lt.rc) &"],
        );
    }
    for n in 0..3 {
        let rc = c.poll_until(n, &["sh", "-c", "cat /tmp/lt.rc 2>/dev/null"], 180, |o| !o.trim().is_empty());
        let log = String::from_utf8(c.run(n, &["cat", "/tmp/lt.log"])).unwrap();
        assert_eq!(rc.trim(), "0", "node {n}:\n{log}");
        assert_eq!(log.matches("counter 6000 exact").count(), 2, "node {n}:\n{log}");
    }
    let hosts = String::from_utf8(c.run(0, &["mctool", "imc-hosts"])).unwrap();
    assert!(hosts.contains("hosts [0, 1, 2] errors 0"), "{hosts}");
}
