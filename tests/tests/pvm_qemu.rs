//! QEMU tier for PVM: Debian's PVM 3.4.6 example binaries, unchanged, on
//! our `libpvm3.so.3` across guests (the library is in the image's
//! `/usr/local/lib`; the tables in MEMORY CHANNEL space; `pvmd` in every
//! guest spawns for tasks of the others; tasks on one guest talk over
//! shared memory, across guests over MEMORY CHANNEL), and the same binaries
//! on Debian's own PVM (its `pvmd` over TCP on the cluster LAN, started
//! with `scripts/pvm-peer.sh`'s kit) in the same guests, with the same
//! results. Debian's binaries come from `scripts/setup.sh --only pvm` and go
//! into the cluster's shared folder as `$PVM_ROOT/bin/LINUX64`, where PVM
//! looks for spawned programs. Each program's output is checked, not only
//! its exit code.

use std::process::Command;

use tests::{cache, root, Cluster};

/// Which PVM runs the programs: the same binaries, chosen by the
/// environment (`LD_LIBRARY_PATH` and `PVM_ROOT`).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Pvm {
    /// Ours, from the image (`/usr/local/lib`), `PVM_ROOT=/share/pvm`.
    Ours,
    /// Debian's `pvmd` and `libpvm3.so.3`, `PVM_ROOT=/share/dpvm`.
    Debian,
}

impl Pvm {
    fn env(self) -> &'static str {
        match self {
            Pvm::Ours => "export PVM_ROOT=/share/pvm",
            Pvm::Debian => ". /share/dpvm/env && export API_PEER=debian",
        }
    }
}

/// Runs shell command `cmd` in guest `node` in `pvm`'s environment, with
/// `$B` the folder of the example programs; returns its exit code and
/// output.
fn pvm_sh(c: &Cluster, pvm: Pvm, node: usize, cmd: &str) -> (Option<i32>, String) {
    let full = format!("cd /tmp && {} && B=$PVM_ROOT/bin/LINUX64 && {cmd}", pvm.env());
    let o = c.exec(node, &["sh", "-c", &full]);
    (o.status.code(), String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr))
}

/// Puts Debian's example binaries and `tests/pvm/api.c` in the shared
/// folder: `/share/pvm` for ours, `/share/dpvm` (with Debian's daemon and
/// library) for Debian's PVM.
fn share_programs(c: &Cluster) {
    let deb = cache().join("pvm/root/usr/bin");
    assert!(deb.join("master1").is_file(), "{} missing: run scripts/setup.sh --only pvm", deb.display());
    let share = c.run_dir().join("share");
    let bin = share.join("pvm/bin/LINUX64");
    std::fs::create_dir_all(&bin).unwrap();
    for e in std::fs::read_dir(&deb).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, bin.join(p.file_name().unwrap())).unwrap();
    }
    let o =
        Command::new(root().join("scripts/pvm-peer.sh")).arg(share.join("dpvm")).arg("/share/dpvm").output().unwrap();
    assert!(o.status.success(), "pvm-peer.sh: {}", String::from_utf8_lossy(&o.stderr));
    build_c("api.c", &share.join("pvm-api"));
}

/// Builds `tests/pvm/SRC` against our `pvm3.h` and `libpvm3.so.3` into
/// `out` (the same binary runs on Debian's library).
fn build_c(src: &str, out: &std::path::Path) {
    let o = Command::new("gcc")
        .arg("-O1")
        .arg("-I")
        .arg(root().join("guest/msg/pvm/include"))
        .arg("-o")
        .arg(out)
        .arg(root().join("tests/pvm").join(src))
        .arg("-L")
        .arg(root().join("target/release"))
        .arg("-lpvm3")
        .output()
        .unwrap();
    assert!(o.status.success(), "building {src}: {}", String::from_utf8_lossy(&o.stderr));
}

/// Gives the console (`pvm`) command `cmd` in guest 0, waits up to 60 s
/// for `until` in its output, then halts the virtual machine; returns the
/// console's output. An empty line every half second has the console
/// prompt again, which flushes what it printed into the file. A console
/// that ended early must not take the script with it (SIGPIPE on the
/// fifo): its exit status and output are what the caller needs to see.
fn console(c: &Cluster, pvm: Pvm, cmd: &str, until: &str) -> String {
    let script = format!(
        "rm -f con con.out && mkfifo con && {{ $B/pvm <con >con.out 2>&1 & }} && cp=$! && trap '' PIPE && exec 3>con && \
         echo '{cmd}' >&3 && \
         i=0; while kill -0 $cp 2>/dev/null && ! grep -q '{until}' con.out && [ $i -lt 120 ]; do sleep 0.5; echo >&3; i=$((i + 1)); done; \
         echo halt >&3; exec 3>&-; i=0; while kill -0 $cp 2>/dev/null && [ $i -lt 20 ]; do sleep 0.5; i=$((i + 1)); done; \
         kill -0 $cp 2>/dev/null && {{ echo 'the console did not end after halt'; kill $cp; }}; \
         wait $cp; echo \"(the console exited with $?)\"; cat con.out"
    );
    pvm_sh(c, pvm, 0, &script).1
}

/// What the examples computed, to compare the two PVMs by.
#[derive(Debug, PartialEq)]
struct Results {
    /// hello's greeting from hello_other, which ran on node1 (without
    /// its TID).
    hello: String,
    /// master1's "I got X from N" lines, sorted.
    master1: Vec<String>,
    /// gexample's two results.
    gexample: Vec<String>,
    /// trsg's "Test OK" lines.
    trsg: Vec<String>,
}

/// The lines of `out` that start with `prefix` (leading blanks ignored).
fn lines_with(out: &str, prefix: &str) -> Vec<String> {
    out.lines().map(str::trim).filter(|l| l.starts_with(prefix)).map(String::from).collect()
}

/// One bwtest program (`prog`: dbwtest, ibwtest, pbwtest or rbwtest) as
/// two copies, one started on guest 1 and one here on guest 0: they pair
/// up through the group "bwtest" and check 100,000 doubles sent back and
/// forth, then time round trips of 0 to 800,000 bytes. Returns both copies'
/// output.
fn bwtest(c: &Cluster, pvm: Pvm, prog: &str) -> String {
    let other = format!(
        "{{ mpiexec -hosts node1 -n 1 /bin/sh -c '{} && $PVM_ROOT/bin/LINUX64/{prog}' >/tmp/{prog}.1 2>&1 & }}; \
         sleep 1; $B/{prog}; wait; cat /tmp/{prog}.1",
        pvm.env()
    );
    let (_, out) = pvm_sh(c, pvm, 0, &other);
    assert_eq!(out.matches("100000 doubles received correctly").count(), 2, "{pvm:?} {prog}: {out}");
    assert!(out.contains("I am the master") && out.contains("I am the slave"), "{pvm:?} {prog}: {out}");
    let sizes: Vec<_> = out.lines().filter_map(|l| l.split_once("Data size: ")).map(|(_, s)| s.trim()).collect();
    assert_eq!(sizes, ["0", "8", "80", "800", "8000", "80000", "800000"], "{pvm:?} {prog}: {out}");
    out
}

/// Debian's examples from guest 0 of `c` (`nodes` guests) on `pvm`.
fn examples_across(c: &Cluster, nodes: usize, pvm: Pvm) -> Results {
    // Every guest's pvmd holds its entry (they start at boot, after imcd).
    for n in 0..nodes {
        c.poll_until(n, &["cat", "/var/log/pvmd.log"], 60, |l| l.contains("pvmd: host"));
    }
    // hello: its one hello_other goes to the next host, node1.
    let (code, out) = pvm_sh(c, pvm, 0, "$B/hello.pvm");
    assert_eq!(code, Some(0), "{pvm:?}: {out}");
    let me = out.lines().find_map(|l| l.strip_prefix("i'm t")).unwrap_or_else(|| panic!("{out}"));
    assert!(me.starts_with('4'), "node0 is host 1, its TIDs 0x4xxxx: {out}");
    let hello = lines_with(&out, "from t8");
    assert!(hello.len() == 1 && hello[0].ends_with(": hello, world from node1"), "{pvm:?}: {out}");
    let hello = hello[0].split_once(": ").unwrap().1.to_string();

    // master1: pvm_config's hosts times 3 slaves, spread over the guests.
    let (code, out) = pvm_sh(c, pvm, 0, "$B/master1");
    assert_eq!(code, Some(0), "{pvm:?}: {out}");
    assert!(out.contains(&format!("Spawning {} worker tasks ... SUCCESSFUL", 3 * nodes)), "{pvm:?}: {out}");
    let mut master1 = lines_with(&out, "I got ");
    assert_eq!(master1.len(), 3 * nodes, "{pvm:?}: {out}");
    for l in &master1 {
        let (a, b) = l.split_once("; (expecting ").unwrap();
        assert_eq!(a.trim_start_matches("I got ").split(" from ").next().unwrap(), b.trim_end_matches(')'), "{out}");
    }
    master1.sort();

    // Groups: freeze, reduce, barrier; scatter and gather; every member at
    // one barrier; many groups at once (thb spawns tnb); join and leave.
    let (code, out) = pvm_sh(c, pvm, 0, "printf '10\\n4\\n' | $B/gexample");
    assert_eq!(code, Some(0), "{pvm:?}: {out}");
    assert!(out.contains("The 1-Norm is 55") && out.contains("The product of column 1 is 3.6288e+06"), "{out}");
    let gexample = lines_with(&out, "The ");
    let (_, out) = pvm_sh(c, pvm, 0, "printf '4\\n5\\n' | $B/trsg");
    assert!(out.contains("Test OK: Sum of Squares of first 20 integers is 2870") && !out.contains("ERROR"), "{out}");
    let trsg = lines_with(&out, "Test O");
    let (code, out) = pvm_sh(c, pvm, 0, "$B/gexamp 4");
    assert_eq!(code, Some(0), "{pvm:?}: {out}");
    // The copies on other guests write to their daemon's log; ours here.
    assert!(out.lines().any(|l| l.ends_with(" 0: sync")), "{pvm:?}: {out}");
    let (code, out) = pvm_sh(c, pvm, 0, "$B/thb 3");
    assert_eq!(code, Some(0), "{pvm:?}: {out}");
    assert!(out.contains("joined group31") && out.contains("barrier on group0") && out.contains("done."), "{out}");
    let (code, out) = pvm_sh(c, pvm, 0, "$B/tst");
    assert_eq!(code, Some(0), "{pvm:?}: {out}");
    assert!(out.contains("joined prognosis 0, negative 0") && out.contains("left prognosis 0, negative 0"), "{out}");
    let (code, out) = pvm_sh(c, pvm, 0, "$B/joinleave 200");
    assert_eq!(code, Some(0), "{pvm:?}: {out}");
    assert!(out.contains("Joined 100 times") && out.contains("Joined 200 times"), "{pvm:?}: {out}");

    // The four bandwidth tests: packed (default, raw, in place) and psend.
    for prog in ["dbwtest", "rbwtest", "ibwtest", "pbwtest"] {
        bwtest(c, pvm, prog);
    }

    // Every call between processes, a worker on another guest.
    let (code, out) = pvm_sh(c, pvm, 0, "/share/pvm-api");
    assert_eq!(code, Some(0), "{pvm:?}: {out}");
    assert!(out.lines().any(|l| l == "api: ok"), "{pvm:?}: {out}");

    // timing against timing_slave on node1; it exits 1 by design.
    let (_, out) = pvm_sh(c, pvm, 0, "$B/timing");
    assert!(out.contains("Avg uSec") && out.trim_end().ends_with("done"), "{pvm:?}: {out}");
    Results { hello, master1, gexample, trsg }
}

#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn pvm_examples_run_unchanged() {
    let c = Cluster::up("t-pvm-2", 2);
    share_programs(&c);
    examples_across(&c, 2, Pvm::Ours);
    // The copies of gexamp on node1 ran there, under its daemon.
    let log = String::from_utf8_lossy(&c.run(1, &["cat", "/var/log/pvmd.log"])).into_owned();
    assert!(log.contains("pvmd: host 2 (node1)") && log.contains(": sync"), "{log}");

    // mc-cluster pvm: the program in guest 0, every task's output here,
    // each line after its TID, the copy on node1 (t8xxxx) as well.
    let o = Command::new(tests::launcher())
        .args(["--name", &c.name, "pvm", "--timeout", "120", "gexamp", "3"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{out}");
    let remote: Vec<_> = out.lines().filter(|l| l.starts_with("[t8")).collect();
    assert!(
        remote.iter().any(|l| l.ends_with("BEGIN"))
            && remote.iter().any(|l| l.ends_with(": sync"))
            && remote.iter().any(|l| l.ends_with("EOF")),
        "{out}"
    );
    assert!(out.lines().any(|l| l.ends_with(" 0: sync")), "the program's own output: {out}");
    let o = Command::new(tests::launcher()).args(["--name", &c.name, "pvm", "no-such-program"]).output().unwrap();
    assert_eq!(o.status.code(), Some(127));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no such program"));
    c.down();
}

/// Four guests: ours, then Debian's PVM over TCP on the LAN with the same
/// binaries, the same results.
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn pvm_same_binaries_run_on_real_pvm() {
    let c = Cluster::up_mpi("t-pvm-4", 4);
    share_programs(&c);
    let ours = examples_across(&c, 4, Pvm::Ours);
    // Debian's console on ours: spmd's ring over 4 copies, their output
    // back at the console; halt ends every task (our pvmds stay).
    let out = console(&c, Pvm::Ours, "spawn -4 -> spmd", "] finished");
    assert!(out.contains("4 successful") && out.contains("token ring done"), "{out}");
    assert_eq!(out.matches("] EOF").count(), 4, "{out}");
    // It ended by `halt`, not by a crash (it once freed a job while
    // notices of its copies were still to come: output.rs).
    assert!(out.contains("(the console exited with 0)"), "{out}");
    let (code, out) = pvm_sh(&c, Pvm::Debian, 0, "/share/dpvm/lib/pvm-up node0 node1 node2 node3");
    assert_eq!(code, Some(0), "Debian's pvmd on 4 guests: {out}");
    let debian = examples_across(&c, 4, Pvm::Debian);
    // Debian's console: spmd passes a token around a ring of 4 copies,
    // their output back at the console; then halt.
    let out = console(&c, Pvm::Debian, "spawn -4 -> spmd", "] finished");
    assert!(out.contains("4 successful") && out.contains("token ring done"), "{out}");
    assert_eq!(ours, debian);
    c.down();
}

/// Faults, on three guests: `tests/pvm/fault.c` on node0 spawns two
/// workers on node1 and two on node2 and asks for `PvmTaskExit`,
/// `PvmHostDelete` and `PvmHostAdd`. A worker killed with `pvm_kill` is
/// reported; then node2's QEMU is killed while the master waits in
/// `pvm_recv` from a worker there: the surviving daemons repair node2 out
/// of the tables once imcd has not listed it for 4 s, the recv returns
/// `PvmNoTask`, `PvmHostDelete` and both workers' `PvmTaskExit` arrive,
/// `pvm_config`, `pvm_tasks`, the group and the mailbox no longer have
/// them. Then node1's `pvmd` is killed: `PvmHostDelete` for node1.
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn pvm_notify_reports_a_killed_task_and_a_failed_node() {
    use std::time::{Duration, Instant};
    let c = Cluster::up("t-pvm-fault", 3);
    let prog = c.run_dir().join("share/pvm-fault");
    build_c("fault.c", &prog);
    // Every daemon is up (each lists the others' hosts once they are).
    for n in 0..3 {
        c.poll_until(n, &["cat", "/var/log/pvmd.log"], 60, |l| l.contains("pvmd: host"));
    }
    c.background(0, "fault", "cd /tmp && PVM_ROOT=/share/pvm /share/pvm-fault");
    let wait_log = |what: &str, secs: u64| {
        let t0 = Instant::now();
        loop {
            let log = c.background_log(0, "fault");
            if log.contains(what) {
                return log;
            }
            assert!(!log.contains("FAILED"), "{log}");
            assert!(t0.elapsed() < Duration::from_secs(secs), "no {what:?} within {secs} s:\n{log}");
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    let log = wait_log("waiting for node2 to fail", 120);
    assert!(log.contains("fault: 4 workers") && log.contains("reported after"), "{log}");
    let qemu = c.state()["nodes"][2]["qemu_pid"].as_u64().unwrap() as i32;
    // SAFETY: kill(2) on the QEMU the launcher started for node 2.
    assert_eq!(unsafe { libc::kill(qemu, libc::SIGKILL) }, 0);
    let killed = Instant::now();
    let log = wait_log("fault: host delete", 30);
    let reported = killed.elapsed();
    eprintln!("node2's PvmHostDelete seen {:.1} s after its QEMU was killed", reported.as_secs_f64());
    assert!(reported < Duration::from_secs(15), "{reported:?}");
    assert!(log.contains("returned -31"), "pvm_recv from a task of the failed node: {log}");
    let log = wait_log("waiting for node1's pvmd to go", 30);
    assert!(log.contains("node2 is out: 2 hosts, group fault of 1"), "{log}");
    // A surviving daemon did the repair and said so.
    let daemons: String =
        (0..2).map(|n| String::from_utf8_lossy(&c.run(n, &["cat", "/var/log/pvmd.log"])).into_owned()).collect();
    assert!(daemons.contains("host 3 (node 2) failed: imcd has not listed it for 4 s"), "{daemons}");
    c.run(1, &["sh", "-c", "kill -9 $(pidof pvmd)"]);
    let (rc, log) = c.background_result(0, "fault", 60);
    let node1 = String::from_utf8_lossy(&c.run(1, &["cat", "/var/log/pvmd.log"])).into_owned();
    assert_eq!(rc, "0", "{log}\nnode1's pvmd.log:\n{node1}");
    assert!(log.contains("host delete of t80000, 1 host(s)"), "{log}");
    assert!(log.trim_end().ends_with("fault: ok"), "{log}");
    c.down();
}
