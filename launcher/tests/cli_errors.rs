//! Bad input to `mc-cluster` gives a one-line error that says what to do,
//! before anything is started.

use std::path::Path;
use std::process::{Command, Output};

fn mc(args: &[&str], envs: &[(&str, &Path)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mc-cluster"));
    cmd.args(args).env("MC_HOME", Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// Asserts failure with exactly one line on stderr containing every `needle`.
fn fails_with(out: &Output, needles: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "should fail; stderr: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one-line error expected, got:\n{err}");
    for n in needles {
        assert!(err.contains(n), "'{n}' missing from: {err}");
    }
}

#[test]
fn zero_nodes_is_refused() {
    let run = tempfile::tempdir().unwrap();
    fails_with(&mc(&["up", "--nodes", "0"], &[("MC_RUN_DIR", run.path())]), &["--nodes must be at least 1"]);
}

#[test]
fn more_nodes_than_hub_ports_is_refused() {
    let run = tempfile::tempdir().unwrap();
    fails_with(&mc(&["up", "--nodes", "9"], &[("MC_RUN_DIR", run.path())]), &["8 ports", "cluster.hub_ports"]);
}

#[test]
fn unknown_config_key_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, "[cluster]\nnodes = 2\nnode_count = 3\n").unwrap();
    let out = mc(&["up", "--config", cfg.to_str().unwrap()], &[("MC_RUN_DIR", dir.path())]);
    fails_with(&out, &["unknown field `node_count`", "line 3", "c.toml"]);
}

#[test]
fn missing_qemu_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, "[qemu]\nbinary = \"/nonexistent/qemu-system-x86_64\"\n").unwrap();
    let out = mc(&["up", "--config", cfg.to_str().unwrap()], &[("MC_RUN_DIR", dir.path())]);
    fails_with(&out, &["QEMU not found at /nonexistent/qemu-system-x86_64"]);
    // No configured binary, nothing cached and nothing on PATH: say how to get one.
    let out = mc(&["up"], &[("MC_RUN_DIR", dir.path()), ("MC_CACHE", dir.path()), ("PATH", Path::new("/nonexistent"))]);
    fails_with(&out, &["QEMU not found", "scripts/setup.sh"]);
}

#[test]
fn exec_and_down_without_a_cluster() {
    let run = tempfile::tempdir().unwrap();
    fails_with(&mc(&["exec", "0", "--", "true"], &[("MC_RUN_DIR", run.path())]), &["is not up", "mc-cluster up"]);
    let out = mc(&["down"], &[("MC_RUN_DIR", run.path())]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("nothing was running"));
}

#[test]
fn restarts_without_a_cluster_and_bad_hub_requests_are_refused() {
    let run = tempfile::tempdir().unwrap();
    let env = [("MC_RUN_DIR", run.path())];
    fails_with(&mc(&["--name", "none", "restart", "1"], &env), &["cluster 'none' is not up"]);
    fails_with(&mc(&["--name", "none", "hub", "restart"], &env), &["cluster 'none' is not up"]);
    fails_with(&mc(&["--name", "none", "hub"], &env), &["give a request after --", "restart"]);
    fails_with(&mc(&["--name", "none", "hub", "restart", "--", "stats"], &env), &["takes no request"]);
    let out = mc(&["--name", "none", "hub", "reboot"], &env);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("restart"));
}
