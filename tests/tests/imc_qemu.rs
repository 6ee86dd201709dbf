//! QEMU tier for imcd and libimc (the TruCluster MEMORY CHANNEL API).

use mc_tests::Cluster;

/// Starts imcd on node `n` and waits until it listens.
fn start_imcd(c: &Cluster, n: usize) {
    c.run(n, &["sh", "-c", "imcd > /tmp/imcd.log 2>&1 &"]);
    c.poll_until(n, &["cat", "/tmp/imcd.log"], 20, |o| o.contains("listening"));
}

/// A region allocated by key is the same region on every guest (the
/// clusterwide directory lives in MEMORY CHANNEL space), and data moves by
/// plain stores and loads in the processes: imcd only sets the mappings up.
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn imc_region_by_key_spans_guests() {
    let c = Cluster::up("t-imc", 2);
    for n in 0..2 {
        start_imcd(&c, n);
    }
    c.background(1, "get", "mctool imc-get --key 42 --value 7 --timeout 60");
    let waiting = c.poll_until(1, &["cat", "/tmp/get.log"], 20, |o| o.contains("waiting"));
    assert!(waiting.contains("created"), "node 1 creates the region:\n{waiting}");
    let put = String::from_utf8(c.run(0, &["mctool", "imc-put", "--key", "42", "--value", "7"])).unwrap();
    assert!(put.contains("existing") && put.contains("pages 16..17"), "node 0 finds node 1's region:\n{put}");
    let (rc, log) = c.background_result(1, "get", 60);
    assert_eq!(rc, "0", "{log}");
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
        start_imcd(&c, n);
    }
    // Every node receives the counter before anyone increments it.
    for n in 0..3 {
        let out = String::from_utf8(c.run(n, &["mctool", "imc-lock-test", "--setup"])).unwrap();
        assert!(out.contains("ready"), "{out}");
    }
    for n in 0..3 {
        c.background(n, "lt", "mctool imc-lock-test --procs 2 --rounds 1000 --total 6000");
    }
    for n in 0..3 {
        let (rc, log) = c.background_result(n, "lt", 180);
        assert_eq!(rc, "0", "node {n}:\n{log}");
        assert_eq!(log.matches("counter 6000 exact").count(), 2, "node {n}:\n{log}");
    }
    let hosts = String::from_utf8(c.run(0, &["mctool", "imc-hosts"])).unwrap();
    assert!(hosts.contains("hosts [0, 1, 2] errors 0"), "{hosts}");
}

/// Issue 5: `imc_ckerrcnt` sees an error injected at the hub (a corrupted
/// packet to this node) between `imc_rderrcnt` and the check.
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn ckerrcnt_detects_injected_error() {
    let c = Cluster::up("t-ckerr", 2);
    start_imcd(&c, 1);
    c.background(1, "ck", "mctool imc-check-errors --seconds 8");
    c.poll_until(1, &["cat", "/tmp/ck.log"], 20, |o| o.contains("waiting"));
    c.hub(&["corrupt", "1", "1"]);
    c.run(0, &["mctool", "poke", "--page", "3", "--value", "1"]);
    let (rc, log) = c.background_result(1, "ck", 30);
    assert_eq!(rc, "0", "{log}");
    assert!(log.contains("error count 0") && log.contains("new errors (count now 1)"), "{log}");
}

/// Issue 5: another uid cannot get at a region its mode does not grant
/// (System V rules: owner, group, other; uid 0 may).
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn permission_denied_for_other_uid() {
    let c = Cluster::up("t-perm", 1);
    start_imcd(&c, 0);
    let made = String::from_utf8(c.run(0, &["mctool", "imc-alloc", "--key", "77", "--mode", "600"])).unwrap();
    assert!(made.contains("IMC_SUCCESS") && made.contains("created"), "{made}");
    let denied = c.exec(0, &["mctool", "--uid", "1000", "imc-alloc", "--key", "77"]);
    assert!(!denied.status.success());
    assert!(String::from_utf8_lossy(&denied.stderr).contains("IMC_PERMISSION"), "{denied:?}");
    // Mode 644: others may read (attach for receive) but the region is found.
    c.run(0, &["mctool", "imc-alloc", "--key", "78", "--mode", "644"]);
    let ok = String::from_utf8(c.run(0, &["mctool", "--uid", "1000", "imc-alloc", "--key", "78"])).unwrap();
    assert!(ok.contains("IMC_SUCCESS") && ok.contains("existing"), "{ok}");
    // The owner itself is fine with 600.
    let own =
        String::from_utf8(c.run(0, &["mctool", "--uid", "1000", "imc-alloc", "--key", "79", "--mode", "600"])).unwrap();
    assert!(own.contains("created"), "{own}");
    let again = String::from_utf8(c.run(0, &["mctool", "--uid", "1000", "imc-alloc", "--key", "79"])).unwrap();
    assert!(again.contains("existing"), "{again}");
}

/// `imc_asdealloc` frees a region clusterwide: every node stops receiving
/// it (its imcd drops the buffer and the DMA map), and its pages go to the
/// next region.
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn imc_dealloc_frees_pages_on_every_node() {
    let c = Cluster::up("t-imcfree", 2);
    for n in 0..2 {
        start_imcd(&c, n);
    }
    c.background(1, "get", "mctool imc-get --key 50 --value 5 --timeout 60");
    c.poll_until(1, &["cat", "/tmp/get.log"], 20, |o| o.contains("waiting"));
    c.run(0, &["mctool", "imc-put", "--key", "50", "--value", "5"]);
    let (rc, log) = c.background_result(1, "get", 60);
    assert_eq!(rc, "0", "{log}");
    assert!(String::from_utf8(c.run(1, &["ls", "/dev/shm"])).unwrap().contains("imc-region-0"));

    let freed = String::from_utf8(c.run(0, &["mctool", "imc-free", "--key", "50"])).unwrap();
    assert!(freed.contains("freed region 0") && freed.contains("pages 16..17"), "{freed}");
    // Node 1 notices through the directory and lets go of the region.
    c.poll_until(1, &["ls", "/dev/shm"], 20, |o| !o.contains("imc-region-0"));
    // The pages are free for the next key.
    let next = String::from_utf8(c.run(1, &["mctool", "imc-alloc", "--key", "51", "--mode", "666"])).unwrap();
    assert!(next.contains("created") && next.contains("pages 16..17"), "{next}");
    // Only its creator (or root) may free a region.
    let again = c.exec(0, &["mctool", "--uid", "1000", "imc-free", "--key", "51"]);
    assert!(!again.status.success(), "uid 1000 may not free root's region");
}
