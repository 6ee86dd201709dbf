//! QEMU tier: MPICH's own test suite across guests (issue 14). The
//! programs of `tests/mpich-suite-guests.list` (from `test/mpi` of Debian's
//! `mpich` source package, `scripts/setup.sh --only mpich-suite`) are built
//! on the host with our `mpicc` by the `mpi-suite` runner, copied into the
//! cluster's shared folder and run with `mc-cluster mpirun` on 2 guests
//! of the cluster for MPI jobs (`qemu-configs/mpi.toml`),
//! the ranks spread over both: each program's messages cross MEMORY
//! CHANNEL. The suite's rule for a pass is every rank exiting 0 and
//! " No Errors" in the output. The runner prints one line a test, a table
//! and the pass count, and fails when a test listed as passing does not.

use std::process::Command;

use tests::{launcher, root, Cluster};

/// Fewest tests the list must pass.
const AT_LEAST: usize = 70;

#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn mpich_suite_runs_across_guests() {
    let mtest = tests::cache().join("mpich-src/test/mpi/util/mtest.c");
    assert!(mtest.is_file(), "MPICH's test suite is not in the cache (run scripts/setup.sh --only mpich-suite)");
    let name = "t-mpi-suite";
    let c = Cluster::up_mpi(name, 2);
    c.imcd_ready();
    let share = c.run_dir().join("share/suite");
    let mpirun = format!("{} --name {name} mpirun --timeout 100", launcher().display());
    let o = Command::new(env!("CARGO_BIN_EXE_mpi-suite"))
        .arg("--list")
        .arg(root().join("tests/mpich-suite-guests.list"))
        .args(["--mpiexec", &mpirun, "--timeout", "120", "--share"])
        .arg(format!("{}=/share/suite", share.display()))
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    // The table and the count go to the test's log whatever happens.
    eprintln!("{out}");
    assert!(o.status.success(), "a test listed as passing did not pass in the guests (table above)");
    let line = out.lines().find(|l| l.contains(" passed (")).unwrap_or_else(|| panic!("no pass count:\n{out}"));
    let passed: usize = line.split_whitespace().nth(1).and_then(|w| w.parse().ok()).unwrap_or(0);
    assert!(passed >= AT_LEAST, "{passed} tests passed across the guests; the list promises at least {AT_LEAST}");
}
