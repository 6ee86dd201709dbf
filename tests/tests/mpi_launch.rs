//! `mc-cluster mpirun` without QEMU: what it refuses, and how.

use std::process::{Command, Output};

use tests::launcher;

fn mc(args: &[&str]) -> Output {
    let run = tempfile::tempdir().unwrap();
    Command::new(launcher()).env("MC_RUN_DIR", run.path()).args(args).output().unwrap()
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
}

#[test]
fn mpirun_errors_are_clear() {
    for (args, says) in [
        (vec!["--name", "t-mpi-none", "mpirun", "-n", "2", "/share/prog"], "cluster 't-mpi-none' is not up"),
        (vec!["mpirun", "-n", "0", "/share/prog"], "invalid value '0'"),
        (vec!["mpirun", "-n", "2"], "PROG"),
        (vec!["mpirun", "-n", "2", "--ppn", "0", "/share/prog"], "--ppn"),
    ] {
        let o = mc(&args);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(text(&o).contains(says), "{args:?}: expected '{says}' in:\n{}", text(&o));
    }
}
