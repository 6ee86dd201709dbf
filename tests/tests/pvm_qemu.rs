//! QEMU tier for PVM: Debian's PVM 3.4.6 example binaries, unchanged, on
//! our `libpvm3.so.3` across guests (the library is in the image's
//! `/usr/local/lib`; the tables in MEMORY CHANNEL space; `pvmd` in every
//! guest spawns for tasks of the others; tasks on one guest talk over
//! shared memory, across guests over MEMORY CHANNEL). Debian's binaries
//! come from `scripts/setup.sh --only pvm` and go into the cluster's
//! shared folder as `$PVM_ROOT/bin/LINUX64`, where PVM looks for spawned
//! programs. Each program's output is checked, not only its exit code.

use std::process::Command;

use tests::{cache, root, Cluster};

/// Runs shell command `cmd` in guest `node` with PVM's environment;
/// returns its exit code and output.
fn pvm_sh(c: &Cluster, node: usize, cmd: &str) -> (Option<i32>, String) {
    let full = format!("cd /tmp && export PVM_ROOT=/share/pvm && {cmd}");
    let o = c.exec(node, &["sh", "-c", &full]);
    (o.status.code(), String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr))
}

/// Puts Debian's example binaries and `tests/pvm/api.c` in the shared folder.
fn share_programs(c: &Cluster) {
    let deb = cache().join("pvm/root/usr/bin");
    assert!(deb.join("master1").is_file(), "{} missing: run scripts/setup.sh --only pvm", deb.display());
    let share = c.run_dir().join("share/pvm");
    let bin = share.join("bin/LINUX64");
    std::fs::create_dir_all(&bin).unwrap();
    for p in ["hello.pvm", "hello_other", "master1", "slave1", "gexample", "gexamp", "trsg", "timing", "timing_slave"] {
        std::fs::copy(deb.join(p), bin.join(p)).unwrap();
    }
    let o = Command::new("gcc")
        .arg("-O1")
        .arg("-I")
        .arg(root().join("guest/msg/pvm/include"))
        .arg("-o")
        .arg(share.join("api"))
        .arg(root().join("tests/pvm/api.c"))
        .arg("-L")
        .arg(root().join("target/release"))
        .arg("-lpvm3")
        .output()
        .unwrap();
    assert!(o.status.success(), "building api.c: {}", String::from_utf8_lossy(&o.stderr));
}

/// Debian's examples from guest 0 of `c` (`nodes` guests, a daemon on each).
fn examples_across(c: &Cluster, nodes: usize) {
    share_programs(c);
    // hello: its one hello_other goes to the next host, node1.
    let (code, out) = pvm_sh(c, 0, "/share/pvm/bin/LINUX64/hello.pvm");
    assert_eq!(code, Some(0), "{out}");
    let me = out.lines().find_map(|l| l.strip_prefix("i'm t")).unwrap_or_else(|| panic!("{out}"));
    assert!(me.starts_with('4'), "node0 is host 1, its TIDs 0x4xxxx: {out}");
    assert!(out.lines().any(|l| l.starts_with("from t8") && l.ends_with(": hello, world from node1")), "{out}");

    // master1: pvm_config's hosts times 3 slaves, spread over the guests.
    let (code, out) = pvm_sh(c, 0, "/share/pvm/bin/LINUX64/master1");
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains(&format!("Spawning {} worker tasks ... SUCCESSFUL", 3 * nodes)), "{out}");
    let got: Vec<_> = out.lines().filter(|l| l.starts_with("I got ")).collect();
    assert_eq!(got.len(), 3 * nodes, "{out}");
    for l in got {
        let (a, b) = l.split_once("; (expecting ").unwrap();
        assert_eq!(a.trim_start_matches("I got ").split(" from ").next().unwrap(), b.trim_end_matches(')'), "{out}");
    }

    // Groups in MEMORY CHANNEL space: freeze, reduce, barrier; scatter and
    // gather; every member at one barrier.
    let (code, out) = pvm_sh(c, 0, "printf '10\\n4\\n' | /share/pvm/bin/LINUX64/gexample");
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("The 1-Norm is 55") && out.contains("The product of column 1 is 3.6288e+06"), "{out}");
    let (_, out) = pvm_sh(c, 0, "printf '4\\n5\\n' | /share/pvm/bin/LINUX64/trsg");
    assert!(out.contains("Test OK: Sum of Squares of first 20 integers is 2870") && !out.contains("ERROR"), "{out}");
    let (code, out) = pvm_sh(c, 0, "/share/pvm/bin/LINUX64/gexamp 4");
    assert_eq!(code, Some(0), "{out}");
    // The copies on other guests write to their daemon's log; ours here.
    assert!(out.lines().any(|l| l.ends_with(" 0: sync")), "{out}");

    // Every call between processes, a worker on another guest.
    let (code, out) = pvm_sh(c, 0, "/share/pvm/api");
    assert_eq!(code, Some(0), "{out}");
    assert!(out.lines().any(|l| l == "api: ok"), "{out}");

    // timing against timing_slave on node1; it exits 1 by design.
    let (_, out) = pvm_sh(c, 0, "/share/pvm/bin/LINUX64/timing");
    assert!(out.contains("Avg uSec") && out.trim_end().ends_with("done"), "{out}");
}

#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn pvm_examples_run_unchanged() {
    let c = Cluster::up("t-pvm-2", 2);
    examples_across(&c, 2);
    // The copies of gexamp on node1 ran there, under its daemon.
    let log = String::from_utf8_lossy(&c.run(1, &["cat", "/var/log/pvmd.log"])).into_owned();
    assert!(log.contains("pvmd: host 2 (node1)") && log.contains(": sync"), "{log}");
    c.down();
}

#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn pvm_examples_run_unchanged_on_four_guests() {
    let c = Cluster::up_mpi("t-pvm-4", 4);
    examples_across(&c, 4);
    c.down();
}
