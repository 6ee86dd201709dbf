//! Every script in scripts/ answers -h/--help with its usage and exit 0
//! before doing anything, and refuses an option it does not know with
//! exit 2 (the convention of the field's tools). The host binaries name
//! themselves in `-V` and end quietly on a closed pipe.

use std::process::Command;
use std::time::{Duration, Instant};

use tests::root;

/// The scripts a user runs (`usage.sh` is sourced by them; `bench-cluster.sh`
/// is sourced by the benchmarks).
fn scripts() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(root().join("scripts"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".sh") && n != "usage.sh" && n != "bench-cluster.sh")
        .collect();
    v.sort();
    v
}

#[test]
fn every_script_answers_help_and_refuses_unknown_options() {
    let all = scripts();
    assert!(all.len() >= 10, "{all:?}");
    for s in all {
        let path = root().join("scripts").join(&s);
        let t0 = Instant::now();
        let o = Command::new(&path).arg("--help").output().unwrap();
        let text = String::from_utf8_lossy(&o.stdout).to_lowercase();
        assert_eq!(o.status.code(), Some(0), "{s} --help: {}", String::from_utf8_lossy(&o.stderr));
        assert!(text.contains("usage"), "{s} --help prints no usage:\n{text}");
        // Nothing was started: a help that builds or boots takes minutes.
        assert!(t0.elapsed() < Duration::from_secs(5), "{s} --help took {:?}", t0.elapsed());
        let o = Command::new(&path).arg("--no-such-option").output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{s} --no-such-option: {}", String::from_utf8_lossy(&o.stderr));
    }
}

/// The binaries a user runs: on the host, and (host builds of) the guest tools.
const BINS: &[&str] =
    &["mc-cluster", "mc-hub", "mc-adapter", "mc-trace", "mc-netem", "mctool", "ump-tool", "imc-bench", "mpiexec"];

#[test]
fn the_binaries_name_themselves_in_their_version() {
    for b in BINS {
        let o = Command::new(tests::host_bin(b)).arg("-V").output().unwrap();
        let v = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success() && v.starts_with(&format!("{b} ")), "{b} -V: {v}");
    }
}

/// `--help` of every binary shows examples and says what its exit codes mean.
#[test]
fn every_binary_help_has_examples_and_exit_codes() {
    for b in BINS {
        let o = Command::new(tests::host_bin(b)).arg("--help").output().unwrap();
        let h = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{b} --help: {}", String::from_utf8_lossy(&o.stderr));
        assert!(h.contains("Examples"), "{b} --help has no examples:\n{h}");
        assert!(h.contains("Exit"), "{b} --help does not say what its exit codes mean:\n{h}");
        let first = h.lines().next().unwrap_or_default();
        assert!(first.len() <= 100, "{b}: the first line of help is not a one-line summary: {first}");
        // Each subcommand in one line of the list (its paragraphs are in its own help).
        for l in h.lines().skip_while(|l| *l != "Commands:").take_while(|l| !l.is_empty()) {
            assert!(l.chars().count() <= 100, "{b}: a subcommand's summary is not one line: {l}");
        }
    }
}

/// `mc-cluster hub stats` (the request without `--`) says where it goes.
#[test]
fn a_hub_request_without_the_separator_gets_a_hint() {
    let o = Command::new(tests::launcher()).args(["--name", "no-such-cluster-here", "hub", "stats"]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("mc-cluster hub -- stats"), "{err}");
}

/// `mc-cluster status | head -1` with the reader gone: exit 141 as a
/// shell reports SIGPIPE, and no panic.
#[test]
fn a_closed_pipe_ends_mc_cluster_quietly() {
    // The reader is closed before the child starts: its first write fails.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let o = Command::new(tests::launcher())
        .args(["--name", "no-such-cluster-here", "status"])
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(141), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// `mctool pattern | head -c 1`: the guest tools end quietly too, from a
/// failed write (`pattern`) and from a failed `println!` (`wait-signal`
/// prints its pid first); neither needs an adapter, so the host build runs
/// them.
#[test]
fn a_closed_pipe_ends_a_guest_tool_quietly() {
    for args in [&["pattern", "--page", "0", "--seed", "1"][..], &["wait-signal", "--timeout", "20"]] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let t0 = Instant::now();
        let o = Command::new(tests::host_bin("mctool"))
            .args(args)
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(141), "mctool {args:?}: {err}");
        assert!(err.is_empty(), "mctool {args:?}: {err}");
        assert!(t0.elapsed() < Duration::from_secs(10), "mctool {args:?} went on after its output was gone");
    }
}
