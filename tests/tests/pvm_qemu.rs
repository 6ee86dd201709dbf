//! QEMU tier for PVM: Debian's PVM 3.4.6 example binaries, unchanged, on
//! our `libpvm3.so.3` inside a real guest (tasks over UMP's shared
//! memory; the library is in the image's `/usr/local/lib`). Debian's
//! binaries come from `scripts/setup.sh --only pvm` and go into the
//! cluster's shared folder as `$PVM_ROOT/bin/LINUX64`, where PVM looks
//! for spawned programs.

use std::process::Command;

use tests::{cache, root, Cluster};

/// Runs shell command `cmd` in guest `node` with PVM's environment;
/// returns its exit code and output.
fn pvm_sh(c: &Cluster, node: usize, cmd: &str) -> (Option<i32>, String) {
    let full = format!("cd /tmp && export PVM_ROOT=/share/pvm LD_LIBRARY_PATH=/usr/local/lib && {cmd}");
    let o = c.exec(node, &["sh", "-c", &full]);
    (o.status.code(), String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr))
}

#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn pvm_examples_run_unchanged_inside_a_guest() {
    let deb = cache().join("pvm/root/usr/bin");
    assert!(deb.join("master1").is_file(), "{} missing: run scripts/setup.sh --only pvm", deb.display());
    let name = "t-pvm-guest";
    let c = Cluster::up(name, 2);
    let share = c.run_dir().join("share/pvm");
    let bin = share.join("bin/LINUX64");
    std::fs::create_dir_all(&bin).unwrap();
    for p in ["hello.pvm", "hello_other", "master1", "slave1", "gexample", "trsg", "timing", "timing_slave"] {
        std::fs::copy(deb.join(p), bin.join(p)).unwrap();
    }
    let api = share.join("api");
    let o = Command::new("gcc")
        .arg("-O1")
        .arg("-I")
        .arg(root().join("guest/msg/pvm/include"))
        .arg("-o")
        .arg(&api)
        .arg(root().join("tests/pvm/api.c"))
        .arg("-L")
        .arg(root().join("target/release"))
        .arg("-lpvm3")
        .output()
        .unwrap();
    assert!(o.status.success(), "building api.c: {}", String::from_utf8_lossy(&o.stderr));

    let (code, out) = pvm_sh(&c, 0, "/share/pvm/bin/LINUX64/hello.pvm");
    assert_eq!(code, Some(0), "{out}");
    let me = out.lines().find_map(|l| l.strip_prefix("i'm t")).unwrap_or_else(|| panic!("{out}"));
    assert!(me.starts_with('4'), "the first host's TIDs are 0x4xxxx: {out}");
    assert!(out.lines().any(|l| l.starts_with("from t4") && l.ends_with(": hello, world from node0")), "{out}");

    let (code, out) = pvm_sh(&c, 0, "/share/pvm/bin/LINUX64/master1");
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("Spawning 3 worker tasks ... SUCCESSFUL"), "{out}");
    let got: Vec<_> = out.lines().filter(|l| l.starts_with("I got ")).collect();
    assert_eq!(got.len(), 3, "{out}");
    for l in got {
        let (a, b) = l.split_once("; (expecting ").unwrap();
        assert_eq!(a.trim_start_matches("I got ").split(" from ").next().unwrap(), b.trim_end_matches(')'), "{out}");
    }

    let (code, out) = pvm_sh(&c, 0, "printf '10\\n4\\n' | /share/pvm/bin/LINUX64/gexample");
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("The 1-Norm is 55") && out.contains("The product of column 1 is 3.6288e+06"), "{out}");

    let (_, out) = pvm_sh(&c, 0, "printf '4\\n5\\n' | /share/pvm/bin/LINUX64/trsg");
    assert!(out.contains("Test OK: Sum of Squares of first 20 integers is 2870") && !out.contains("ERROR"), "{out}");

    let (code, out) = pvm_sh(&c, 0, "/share/pvm/api");
    assert_eq!(code, Some(0), "{out}");
    assert!(out.lines().any(|l| l == "api: ok"), "{out}");

    // timing exits 1 by design: its "done" says it finished.
    let (_, out) = pvm_sh(&c, 0, "/share/pvm/bin/LINUX64/timing");
    assert!(out.contains("Avg uSec") && out.trim_end().ends_with("done"), "{out}");
    c.down();
}
