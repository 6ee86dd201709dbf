//! Our PVM (`libpvm3.so.3`, `pvm3.h`) against Debian's PVM 3.4.6, on the
//! host (tasks over shared memory). Fast tier (no guests).
//!
//! Debian's packages come from `scripts/setup.sh --only pvm` (unpacked in
//! `.cache/pvm/root`); without them the comparisons and the runs of
//! Debian's programs are skipped with a message. The library is linked
//! afresh by `scripts/build-pvm.sh` into a scratch folder, so the tests
//! run the code of this tree.
//!
//! - Header: a C program compiled once with each `pvm3.h` prints every
//!   `Pvm*`/`PVM*` constant and the size and field offsets of the four
//!   structures; the outputs must be equal, both ways. `gcc -aux-info`
//!   lists each header's functions: the same names, both ways, and the
//!   same prototypes.
//! - Library: the sonames; every function our header declares is
//!   exported; every Debian program that needs `libpvm3.so.3` finds all
//!   it imports (Debian builds them with BIND_NOW), but for Debian's own
//!   daemon, console and group tools, listed with the reason.
//! - Runs, unchanged and with their output checked: Debian's `hello`
//!   (spawns `hello_other`, which answers) and `master1` (spawns three
//!   `slave1`, each returns its share); our `tests/pvm/api.c` (every
//!   pk/upk type, in-place data, multicast, probe, timeouts, psend/precv
//!   of 1 MiB, the errors).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use tests::run_ok as run;

fn our_include() -> PathBuf {
    tests::root().join("guest/msg/pvm/include")
}

/// Debian's unpacked packages, when set-up has fetched them.
fn debian() -> Option<PathBuf> {
    let p = tests::cache().join("pvm/root");
    if p.join("usr/include/pvm3.h").is_file() {
        return Some(p);
    }
    eprintln!("SKIPPED: {} is missing; run `scripts/setup.sh --only pvm` to fetch Debian's PVM", p.display());
    None
}

/// Links the library of this tree into `dir`.
fn build_lib(dir: &Path) {
    run(Command::new(tests::root().join("scripts/build-pvm.sh")).arg(dir));
}

/// Constant names of `pvm3.h` in `include` (PVM's prefixes only; the
/// system headers it includes are the same for both).
fn constant_names(include: &Path, scratch: &Path) -> BTreeMap<String, String> {
    let src = scratch.join("names.c");
    std::fs::write(&src, "#include <pvm3.h>\n").unwrap();
    let out = run(Command::new("gcc").arg("-dM").arg("-E").arg("-I").arg(include).arg(&src));
    out.lines()
        .filter_map(|l| l.strip_prefix("#define "))
        .filter_map(|l| l.split_once(' ').map(|(n, v)| (n.to_string(), v.trim().to_string())))
        .filter(|(n, _)| (n.starts_with("Pvm") || n.starts_with("PVM")) && !n.contains('('))
        .collect()
}

/// What a program built with the `pvm3.h` in `include` prints of `names`
/// and the structures.
fn values(include: &Path, names: &BTreeMap<String, String>, scratch: &Path, tag: &str) -> BTreeMap<String, String> {
    let mut c = String::from("#include <stdio.h>\n#include <stddef.h>\n#include <pvm3.h>\nint main(void) {\n");
    for (n, v) in names {
        if v.starts_with('"') {
            c += &format!("printf(\"{n} %s\\n\", {n});\n");
        } else if n == "PVMTMPNAMFUN" {
            continue;
        } else {
            c += &format!("printf(\"{n} %lld\\n\", (long long)({n}));\n");
        }
    }
    c += "for (int i = -3; i < 5; i++) printf(\"PvmMboxDirectIndex(%d) %lld %lld\\n\", i, (long long)PvmMboxDirectIndex(i), (long long)PvmMboxDirectIndexOf(PvmMboxDirectIndex(i)));\n";
    let structs: [(&str, &[&str]); 4] = [
        ("pvmhostinfo", &["hi_tid", "hi_name", "hi_arch", "hi_speed", "hi_dsig"]),
        ("pvmtaskinfo", &["ti_tid", "ti_ptid", "ti_host", "ti_flag", "ti_a_out", "ti_pid"]),
        ("pvmminfo", &["len", "ctx", "tag", "wid", "enc", "crc", "src", "dst"]),
        ("pvmmboxinfo", &["mi_name", "mi_nentries", "mi_indices", "mi_owners", "mi_flags"]),
    ];
    for (s, fields) in structs {
        c += &format!("printf(\"sizeof {s} %zu\\n\", sizeof(struct {s}));\n");
        for f in fields {
            c += &format!(
                "printf(\"{s}.{f} %zu %zu\\n\", offsetof(struct {s}, {f}), sizeof(((struct {s} *)0)->{f}));\n"
            );
        }
    }
    c += "return 0; }\n";
    let src = scratch.join(format!("{tag}.c"));
    let exe = scratch.join(tag);
    std::fs::write(&src, c).unwrap();
    run(Command::new("gcc").arg("-w").arg("-I").arg(include).arg("-o").arg(&exe).arg(&src));
    run(&mut Command::new(&exe))
        .lines()
        .filter_map(|l| l.rsplit_once(' ').map(|(k, v)| (k.to_string(), v.to_string())))
        .map(|(k, v)| match k.split_once(' ') {
            Some((a, b)) if a == "sizeof" || a.starts_with("PvmMbox") => (format!("{a} {b}"), v),
            Some((a, b)) => (a.to_string(), format!("{b} {v}")),
            None => (k, v),
        })
        .collect()
}

/// Function prototypes `pvm3.h` in `include` declares (`gcc -aux-info`:
/// parameter names dropped), by name.
fn prototypes(include: &Path, scratch: &Path, tag: &str) -> BTreeMap<String, String> {
    let src = scratch.join(format!("{tag}-p.c"));
    let aux = scratch.join(format!("{tag}.aux"));
    std::fs::write(&src, "#include <stdio.h>\n#include <pvm3.h>\n").unwrap();
    run(Command::new("gcc")
        .arg("-w")
        .arg("-I")
        .arg(include)
        .arg("-c")
        .arg("-o")
        .arg(scratch.join(format!("{tag}.o")))
        .arg("-aux-info")
        .arg(&aux)
        .arg(&src));
    let mut out = BTreeMap::new();
    for line in std::fs::read_to_string(&aux).unwrap().lines().filter(|l| l.contains("pvm3.h")) {
        let Some((_, decl)) = line.split_once("*/ ") else { continue };
        let decl = decl.trim_start_matches("extern ").trim_end_matches(';');
        // The first PVM name in the declaration is the function's (also
        // for pvm_recvf, which returns a function pointer).
        let Some(name) = decl
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .find(|w| w.starts_with("pvm") || w.starts_with("Pvm"))
        else {
            continue;
        };
        out.insert(name.to_string(), decl.to_string());
    }
    out
}

#[test]
fn the_header_matches_debians_both_ways() {
    let Some(deb) = debian() else { return };
    let scratch = tempfile::tempdir().unwrap();
    let theirs_inc = deb.join("usr/include");
    let ours_n = constant_names(&our_include(), scratch.path());
    let theirs_n = constant_names(&theirs_inc, scratch.path());
    let only_theirs: Vec<_> = theirs_n.keys().filter(|k| !ours_n.contains_key(*k)).collect();
    let only_ours: Vec<_> = ours_n.keys().filter(|k| !theirs_n.contains_key(*k)).collect();
    assert!(only_theirs.is_empty(), "constants only Debian's pvm3.h has: {only_theirs:?}");
    assert!(only_ours.is_empty(), "constants only our pvm3.h has: {only_ours:?}");
    assert!(theirs_n.len() > 120, "only {} constants found in Debian's pvm3.h", theirs_n.len());
    let ours_v = values(&our_include(), &ours_n, scratch.path(), "ours");
    let theirs_v = values(&theirs_inc, &theirs_n, scratch.path(), "theirs");
    let differ: Vec<_> = theirs_v
        .iter()
        .filter(|(k, v)| ours_v.get(*k) != Some(v))
        .map(|(k, v)| format!("{k}: theirs {v}, ours {:?}", ours_v.get(k)))
        .collect();
    assert!(differ.is_empty(), "values that differ:\n{}", differ.join("\n"));
    assert_eq!(ours_v.len(), theirs_v.len());
    let ours_p = prototypes(&our_include(), scratch.path(), "ours");
    let theirs_p = prototypes(&theirs_inc, scratch.path(), "theirs");
    let names = |m: &BTreeMap<String, String>| m.keys().cloned().collect::<BTreeSet<_>>();
    assert_eq!(names(&ours_p), names(&theirs_p), "the functions declared differ");
    let differ: Vec<_> = theirs_p
        .iter()
        .filter(|(k, v)| ours_p.get(*k) != Some(v))
        .map(|(k, v)| format!("{k}: theirs {v}, ours {:?}", ours_p.get(k)))
        .collect();
    assert!(differ.is_empty(), "prototypes that differ:\n{}", differ.join("\n"));
}

/// Debian programs that need Debian's own PVM internals, not the library
/// interface: they are not expected to load on ours.
const NOT_LIBRARY_USERS: &[(&str, &str)] = &[
    ("pvmd", "Debian's daemon: pvmd internals (message and wait tables)"),
    ("pvm", "Debian's console: pvmd internals (i_dump, pvmreset, ...)"),
    ("pvm_gstat", "Debian's group-server status tool: the group server's internals"),
    ("pvmgroups", "Debian's group server tool: the group server's internals"),
    ("xep", "needs X11 and Xt, not in the guests"),
];

#[test]
fn the_library_exports_what_programs_import() {
    let scratch = tempfile::tempdir().unwrap();
    build_lib(scratch.path());
    let lib = scratch.path().join("libpvm3.so.3");
    let dynamic = run(Command::new("readelf").arg("-d").arg(&lib));
    assert!(dynamic.contains("Library soname: [libpvm3.so.3]"), "{dynamic}");
    let g = run(Command::new("readelf").arg("-d").arg(scratch.path().join("libgpvm3.so.3")));
    assert!(g.contains("Library soname: [libgpvm3.so.3]") && g.contains("Shared library: [libpvm3.so.3]"), "{g}");
    let exported: BTreeSet<String> = run(Command::new("nm").args(["-D", "--defined-only"]).arg(&lib))
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_string))
        .collect();
    let scratch2 = tempfile::tempdir().unwrap();
    let declared = prototypes(&our_include(), scratch2.path(), "ours");
    let missing: Vec<_> = declared.keys().filter(|n| !exported.contains(*n)).collect();
    assert!(missing.is_empty(), "declared in pvm3.h but not exported: {missing:?}");
    assert!(exported.iter().all(|n| n.starts_with("pvm") || n.starts_with("Pvm") || n == "lpvmerr"), "{exported:?}");
    let Some(deb) = debian() else { return };
    let mut checked = 0;
    for e in std::fs::read_dir(deb.join("usr/bin")).unwrap() {
        let path = e.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let Ok(d) = Command::new("readelf").arg("-d").arg(&path).output() else { continue };
        if !String::from_utf8_lossy(&d.stdout).contains("[libpvm3.so.3]")
            || NOT_LIBRARY_USERS.iter().any(|(n, _)| *n == name)
        {
            continue;
        }
        let imports = run(Command::new("nm").args(["-D", "--undefined-only"]).arg(&path));
        let lacking: Vec<_> = imports
            .lines()
            .filter_map(|l| l.split_whitespace().nth(1))
            .filter(|s| !s.contains('@') && (s.starts_with("pvm") || s.starts_with("Pvm") || *s == "lpvmerr"))
            .filter(|s| !exported.contains(*s))
            .collect();
        assert!(lacking.is_empty(), "{name} imports what we do not export: {lacking:?}");
        checked += 1;
    }
    assert!(checked >= 40, "only {checked} Debian programs checked");
}

/// A PVM virtual machine of our library in a scratch folder: programs
/// spawned by name are found in its `bin/LINUX64` (Debian's examples).
struct Vm {
    dir: tempfile::TempDir,
}

impl Vm {
    fn new(deb: Option<&Path>) -> Vm {
        let dir = tempfile::tempdir().unwrap();
        build_lib(&dir.path().join("lib"));
        let bin = dir.path().join("root/bin/LINUX64");
        std::fs::create_dir_all(&bin).unwrap();
        if let Some(deb) = deb {
            for e in std::fs::read_dir(deb.join("usr/bin")).unwrap() {
                let p = e.unwrap().path();
                let name = p.file_name().unwrap().to_owned();
                std::os::unix::fs::symlink(&p, bin.join(name)).unwrap();
            }
        }
        Vm { dir }
    }

    /// Runs `exe` as a task of this VM; returns its standard output
    /// (with its tasks', which inherit it).
    fn run(&self, exe: &Path, args: &[&str]) -> String {
        self.run_with(exe, args, "", true)
    }

    /// [`Vm::run`] with `input` on standard input; `ok`: the program must
    /// exit 0 (Debian's `timing` always exits 1).
    fn run_with(&self, exe: &Path, args: &[&str], input: &str, ok: bool) -> String {
        let out = self.dir.path().join("out");
        let f = std::fs::File::create(&out).unwrap();
        let input_file = self.dir.path().join("in");
        std::fs::write(&input_file, input).unwrap();
        let mut child = Command::new(exe)
            .args(args)
            .env("PVM_ROOT", self.dir.path().join("root"))
            .env("PVM_TMP", self.dir.path())
            .env("LD_LIBRARY_PATH", self.dir.path().join("lib"))
            .env_remove("PVM_EP")
            .stdin(std::fs::File::open(&input_file).unwrap())
            .stdout(f.try_clone().unwrap())
            .stderr(f)
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("{} did not finish in 60 s:\n{}", exe.display(), std::fs::read_to_string(&out).unwrap());
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        // Spawned tasks may still be writing their last lines.
        std::thread::sleep(Duration::from_millis(300));
        let text = std::fs::read_to_string(&out).unwrap();
        assert!(!ok || status.success(), "{} failed ({status}):\n{text}", exe.display());
        text
    }
}

#[test]
fn debians_hello_and_master1_run_unchanged() {
    let Some(deb) = debian() else { return };
    let vm = Vm::new(Some(&deb));
    let out = vm.run(&deb.join("usr/bin/hello.pvm"), &[]);
    let me = out.lines().find_map(|l| l.strip_prefix("i'm t")).unwrap_or_else(|| panic!("no \"i'm\" line:\n{out}"));
    let me = i32::from_str_radix(me, 16).unwrap();
    let host = run(&mut Command::new("hostname")).trim().to_string();
    let from = out.lines().find(|l| l.starts_with("from t")).unwrap_or_else(|| panic!("no answer:\n{out}"));
    let (tid, text) = from["from t".len()..].split_once(": ").unwrap();
    let tid = i32::from_str_radix(tid, 16).unwrap();
    assert!(tid != me && tid & 0x3ffc_0000 == me & 0x3ffc_0000, "{out}");
    assert_eq!(text, format!("hello, world from {host}"), "{out}");

    let out = vm.run(&deb.join("usr/bin/master1"), &[]);
    assert!(out.contains("Spawning 3 worker tasks ... SUCCESSFUL"), "{out}");
    let got: Vec<_> = out.lines().filter(|l| l.starts_with("I got ")).collect();
    assert_eq!(got.len(), 3, "{out}");
    for l in got {
        // I got 300.000000 from 2; (expecting 300.000000)
        let (a, b) = l.split_once("; (expecting ").unwrap();
        let value = a.trim_start_matches("I got ").split(" from ").next().unwrap();
        assert_eq!(value, b.trim_end_matches(')'), "{out}");
    }
}

#[test]
fn debians_group_programs_and_timing_run_unchanged() {
    let Some(deb) = debian() else { return };
    let vm = Vm::new(Some(&deb));
    let bin = |n: &str| deb.join("usr/bin").join(n);
    // A 10 x 10 Toeplitz matrix over 4 tasks: freezegroup, reduce with
    // PvmSum and a user function, barrier.
    let out = vm.run_with(&bin("gexample"), &[], "10\n4\n", true);
    for want in ["--> Using 4 processors <--", "The 1-Norm is 55", "The product of column 1 is 3.6288e+06"] {
        assert!(out.contains(want), "gexample: no {want:?}:\n{out}");
    }
    // Reduce (PvmSum, PvmProduct, a user function), scatter and gather.
    // (trsg exits 1 by design.)
    let out = vm.run_with(&bin("trsg"), &[], "4\n5\n", false);
    assert!(out.contains("Test OK: Sum of Squares of first 20 integers is 2870"), "trsg:\n{out}");
    assert!(out.contains("Test Ok: Received") && !out.contains("ERROR"), "trsg:\n{out}");
    // Four copies join a group and meet at a barrier.
    let out = vm.run(&bin("gexamp"), &["4"]);
    assert_eq!(out.lines().filter(|l| l.ends_with(": sync")).count(), 4, "gexamp:\n{out}");
    // 32 groups joined, instances checked, three tnb tasks at a barrier
    // and a broadcast, every group left.
    let out = vm.run(&bin("thb"), &["3"]);
    assert!(out.contains("leaving all the groups") && out.contains("done."), "thb:\n{out}");
    assert!(!out.contains("not myself") && !out.contains("trouble"), "thb:\n{out}");
    let out = vm.run(&bin("tst"), &[]);
    assert!(
        out.contains("joined prognosis 0, negative 0") && out.contains("left prognosis 0, negative 0"),
        "tst:\n{out}"
    );
    let out = vm.run(&bin("joinleave"), &[]);
    assert!(out.contains("Joined 10000 times"), "joinleave:\n{out}");
    // Round trips with timing_slave; it exits 1 by design, so its "done".
    let out = vm.run_with(&bin("timing"), &[], "", false);
    assert!(out.contains("Avg uSec") && out.trim_end().ends_with("done"), "timing:\n{out}");
}

#[test]
fn the_pvm_calls_work_between_processes() {
    let vm = Vm::new(None);
    let exe = vm.dir.path().join("api");
    run(Command::new("gcc")
        .arg("-O1")
        .arg("-I")
        .arg(our_include())
        .arg("-o")
        .arg(&exe)
        .arg(tests::root().join("tests/pvm/api.c"))
        .arg("-L")
        .arg(vm.dir.path().join("lib"))
        .arg("-lpvm3"));
    let out = vm.run(&exe, &[]);
    assert!(out.lines().any(|l| l == "api: ok"), "{out}");
}
