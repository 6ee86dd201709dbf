//! The driver conformance suite on real guests (`docs/adapter.md`, "The
//! conformance suite"): `mc-cluster conform` runs its six scenarios
//! against the project's own driver (`mctool conform`, on `guest-driver`)
//! and against the C driver outside the workspace
//! (`docs/tutorial/driver/conform.c`, built here with the host's C
//! compiler), and fails drivers with a step taken out, naming it. All on
//! one cluster of `qemu-configs/conformance.toml`.

use std::process::Command;

use tests::{launcher, root, shared, Cluster};

const NAME: &str = "t-conform";

fn cluster() -> std::sync::MutexGuard<'static, Cluster> {
    let cfg = root().join("qemu-configs/conformance.toml");
    shared(NAME, 3, &["--config", cfg.to_str().unwrap()])
}

/// Runs the suite with `--json`: the exit code and each scenario's outcome.
fn conform(c: &Cluster, args: &[&str]) -> (i32, Vec<serde_json::Value>, String) {
    let o = Command::new(launcher())
        .args(["--name", &c.name, "conform", "--json"])
        .args(args)
        .output()
        .expect("mc-cluster conform");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let text = format!("{out}{}", String::from_utf8_lossy(&o.stderr));
    let outcomes = out.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    (o.status.code().unwrap_or(-1), outcomes, text)
}

fn assert_all_pass(code: i32, outcomes: &[serde_json::Value], text: &str) {
    let names: Vec<&str> = outcomes.iter().filter_map(|o| o["scenario"].as_str()).collect();
    assert_eq!(names, ["reset", "errors", "link", "fifo", "dma", "removal"], "{text}");
    for o in outcomes {
        assert_eq!(o["passed"], true, "{}: {}\n{text}", o["scenario"], o["detail"]);
        eprintln!("PASS {} ({:.1} s): {}", o["scenario"], o["seconds"].as_f64().unwrap_or(0.0), o["detail"]);
    }
    assert_eq!(code, 0, "{text}");
}

#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn conformance_suite_passes_on_our_driver() {
    let c = cluster();
    let (code, outcomes, text) = conform(&c, &["--driver", "mctool conform"]);
    assert_all_pass(code, &outcomes, &text);
    // The scenarios did what they say to the adapter: the hub counted the
    // injected faults (ten error bits and the reset's two, one failed
    // descriptor).
    let stats: serde_json::Value = serde_json::from_str(&c.hub(&["stats"])).unwrap();
    let faults = &stats["nodes"][1]["faults"];
    assert!(faults["error"].as_u64().unwrap() >= 11, "{faults}");
    assert!(faults["dma_desc"].as_u64().unwrap() >= 1, "{faults}");
}

/// Bad requests are refused before anything runs, naming what is wrong.
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn conformance_runner_refuses_what_it_cannot_run() {
    let c = cluster();
    let (code, _, text) = conform(&c, &["--driver", "mctool conform", "--only", "resets"]);
    assert!(code != 0 && text.contains("no scenario 'resets'"), "{text}");
    let (code, _, text) = conform(&c, &["--driver", "mctool conform", "--node", "3"]);
    assert!(code != 0 && text.contains("node 3 does not exist"), "{text}");
    // A driver that is not there fails its scenario with its shell's words.
    let (code, outcomes, text) = conform(&c, &["--driver", "/share/no-such-driver", "--only", "errors"]);
    assert_eq!(code, 1, "{text}");
    assert_eq!(outcomes[0]["passed"], false, "{text}");
    assert!(outcomes[0]["detail"].as_str().unwrap().contains("ready"), "{text}");
}

/// Builds a C driver statically into the shared folder; its guest path.
fn build_c(c: &Cluster, src: &std::path::Path, name: &str) -> String {
    let share = c.run_dir().join("share");
    let out = Command::new("cc")
        .args(["-static", "-O2", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(share.join(name))
        .arg(src)
        .output()
        .expect("cc");
    assert!(out.status.success(), "{} does not build:\n{}", src.display(), String::from_utf8_lossy(&out.stderr));
    format!("/share/{name}")
}

/// `docs/tutorial/driver/conform.c` with `from` replaced by `to`
/// (exactly once), built; its guest path.
fn build_mutant(c: &Cluster, name: &str, from: &str, to: &str) -> String {
    let text = std::fs::read_to_string(root().join("docs/tutorial/driver/conform.c")).unwrap();
    assert!(text.contains(from), "conform.c no longer has {from:?}");
    let src = std::env::temp_dir().join(format!("{name}.c"));
    std::fs::write(&src, text.replacen(from, to, 1)).unwrap();
    build_c(c, &src, name)
}

/// The C driver outside the workspace passes every scenario; the same
/// driver with one step taken out fails the scenario that needs it, and
/// the runner names the step.
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn conformance_suite_passes_on_the_c_example_and_fails_its_mutants() {
    let c = cluster();
    let driver = build_c(&c, &root().join("docs/tutorial/driver/conform.c"), "conform");
    let (code, outcomes, text) = conform(&c, &["--driver", &driver]);
    assert_all_pass(code, &outcomes, &text);

    let mutants = [
        ("no-reset", "wr(a, REG_CTRL, CTRL_RESET);", "", "reset", "from before its open"),
        ("no-w1c", "wr(a, REG_ERR_STATUS, err);", "", "errors", "must be cleared"),
        ("overfill", "s->posted - head < s->size", "s->posted - head <= s->size", "dma", "OVERFLOW"),
    ];
    for (name, from, to, scenario, why) in mutants {
        let driver = build_mutant(&c, name, from, to);
        let (code, outcomes, text) = conform(&c, &["--driver", &driver, "--only", scenario]);
        assert_eq!(code, 1, "{name}: {text}");
        assert_eq!(outcomes.len(), 1, "{name}: {text}");
        assert_eq!(outcomes[0]["passed"], false, "{name}: {text}");
        assert!(outcomes[0]["detail"].as_str().unwrap().contains(why), "{name}: {text}");
        eprintln!("{name} fails {scenario}: {}", outcomes[0]["detail"]);
    }
}
