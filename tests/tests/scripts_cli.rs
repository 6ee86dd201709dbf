//! Every script in scripts/ answers -h/--help with its usage and exit 0
//! before doing anything, and refuses an option it does not know with
//! exit 2 (the convention of the field's tools).

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
