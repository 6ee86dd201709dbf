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
//!   daemon and group tools, listed with the reason (the console is
//!   checked too).
//! - Runs, unchanged and with their output checked: Debian's `hello`
//!   (spawns `hello_other`, which answers) and `master1` (spawns three
//!   `slave1`, each returns its share); the group programs and `timing`;
//!   the mailbox programs (`lmbi`, `gmbi`, `rme`, `task0`/`task1`/
//!   `task_end`), the context programs (`inherita`, `inheritb` and their
//!   children) and the message-handler pair (`mhf_server` driven by
//!   `mhf_tickle`'s menu); our `tests/pvm/api.c` (every pk/upk type,
//!   in-place data, multicast, probe, timeouts, psend/precv of 1 MiB,
//!   the errors); our `tests/pvm/output.c` (children's output as
//!   messages to `PvmOutputTid`, inherited by grandchildren, and
//!   `pvm_catchout`); Debian's console driven on its standard input
//!   (`conf`, `spawn -4 -> spmd`, `ps -a`, `kill`, `reset`, `halt`).

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
    assert!(
        exported.iter().all(|n| n.starts_with("pvm") || n.starts_with("Pvm") || n == "lpvmerr" || n == "i_dump"),
        "{exported:?}"
    );
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
            .filter(|s| {
                !s.contains('@') && (s.starts_with("pvm") || s.starts_with("Pvm") || ["lpvmerr", "i_dump"].contains(s))
            })
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
        let input_file = self.dir.path().join("in");
        std::fs::write(&input_file, input).unwrap();
        let child = self.start(exe, args, "out", std::fs::File::open(&input_file).unwrap().into());
        self.finish(child, exe, "out", ok)
    }

    /// Starts `exe` as a task of this VM, its output in file `name` of
    /// the VM's folder.
    fn start(&self, exe: &Path, args: &[&str], name: &str, stdin: std::process::Stdio) -> std::process::Child {
        let f = std::fs::File::create(self.dir.path().join(name)).unwrap();
        Command::new(exe)
            .args(args)
            .env("PVM_ROOT", self.dir.path().join("root"))
            .env("PVM_TMP", self.dir.path())
            .env("LD_LIBRARY_PATH", self.dir.path().join("lib"))
            .env_remove("PVM_EP")
            .stdin(stdin)
            .stdout(f.try_clone().unwrap())
            .stderr(f)
            .spawn()
            .unwrap()
    }

    /// Waits (30 s at most) until Debian's `gmbi` lists `n` mailbox
    /// classes matching `pattern`: a task started with [`Vm::start`] has
    /// got that far (its output, to a file, comes only at its exit).
    fn wait_for_classes(&self, task: &mut std::process::Child, name: &str, gmbi: &Path, pattern: &str, n: usize) {
        let want = format!("gmbi: {n} mbox entries returned.");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let out = self.run(gmbi, &[pattern]);
            if out.contains(&want) {
                return;
            }
            let exited = task.try_wait().unwrap();
            if exited.is_some() || Instant::now() >= deadline {
                let theirs = std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
                let stacks = Command::new("gdb")
                    .args(["-batch", "-ex", "thread apply all bt", "-p", &task.id().to_string()])
                    .output()
                    .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
                    .unwrap_or_default();
                let _ = task.kill();
                panic!("no {want:?} (the task: {exited:?}, its output:\n{theirs}\n), gmbi:\n{out}\nthe task's threads:\n{stacks}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Runs `exe` with `chunks` written to its standard input one at a
    /// time, 300 ms apart (an interactive program, given time to act on
    /// each answer); returns its output.
    fn run_paced(&self, exe: &Path, args: &[&str], chunks: &[&str]) -> String {
        use std::io::Write;
        let mut child = self.start(exe, args, "paced", std::process::Stdio::piped());
        let mut stdin = child.stdin.take().unwrap();
        for c in chunks {
            std::thread::sleep(Duration::from_millis(300));
            stdin.write_all(c.as_bytes()).unwrap();
            stdin.flush().unwrap();
        }
        drop(stdin);
        self.finish(child, exe, "paced", true)
    }

    /// Waits (60 s at most) for a task started with [`Vm::start`] to
    /// end; returns its output. `ok`: it must exit 0.
    fn finish(&self, mut child: std::process::Child, exe: &Path, name: &str, ok: bool) -> String {
        let out = self.dir.path().join(name);
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

/// The first hex TID after `prefix` on a line of `out`.
fn tid_after(out: &str, prefix: &str) -> String {
    let l = out
        .lines()
        .find_map(|l| l.split_once(prefix).map(|(_, r)| r))
        .unwrap_or_else(|| panic!("no {prefix:?}:\n{out}"));
    l.chars().take_while(|c| c.is_ascii_hexdigit()).collect()
}

/// The number after `prefix` on the first line of `out` that has it.
fn number_after(out: &str, prefix: &str) -> i64 {
    let l = out
        .lines()
        .find_map(|l| l.split_once(prefix).map(|(_, r)| r))
        .unwrap_or_else(|| panic!("no {prefix:?}:\n{out}"));
    l.chars().take_while(|c| c.is_ascii_digit() || *c == '-').collect::<String>().parse().unwrap()
}

#[test]
fn debians_mailbox_programs_run_unchanged() {
    let Some(deb) = debian() else { return };
    let vm = Vm::new(Some(&deb));
    let bin = |n: &str| deb.join("usr/bin").join(n);
    // Three persistent classes that outlive their task.
    let out = vm.run(&bin("lmbi"), &["3", "mp", "e"]);
    let a = tid_after(&out, "lmbi: t");
    for i in 0..3 {
        assert!(out.contains(&format!("just inserted entry <t{a}lmbi{i}> at index 0.")), "lmbi:\n{out}");
    }
    let out = vm.run(&bin("gmbi"), &[]);
    assert!(out.contains("gmbi: 3 mbox entries returned."), "gmbi:\n{out}");
    for i in 0..3 {
        assert!(out.contains(&format!("class name: <t{a}lmbi{i}>")), "gmbi:\n{out}");
    }
    let owned = "indices <0>\towner_tid <t0>\tflags <3> = <PvmMboxMultiInstance PvmMboxPersistent >";
    assert_eq!(out.matches(owned).count(), 3, "persistent, their owner gone:\n{out}");
    // Two overwritable ones of a task that stays, waiting for "END".
    let mut waiting = vm.start(&bin("lmbi"), &["2", "mo", "w"], "lmbi-w", std::process::Stdio::null());
    vm.wait_for_classes(&mut waiting, "lmbi-w", &bin("gmbi"), "t*lmbi*", 5);
    let out = vm.run(&bin("gmbi"), &["t*lmbi*"]);
    let b = out
        .lines()
        .filter_map(|l| l.strip_prefix("gmbi: class name: <t"))
        .map(|r| r.split("lmbi").next().unwrap_or_default().to_string())
        .find(|t| *t != a)
        .unwrap_or_else(|| panic!("gmbi:\n{out}"));
    let theirs = format!("owner_tid <t{b}>\tflags <6> = <PvmMboxOverWritable PvmMboxMultiInstance >");
    assert_eq!(out.matches(&theirs).count(), 2, "gmbi:\n{out}");
    let out = vm.run(&bin("gmbi"), &[&format!("t{b}*1")]);
    assert!(out.contains("gmbi: 1 mbox entries returned.") && out.contains(&format!("<t{b}lmbi1>")), "{out}");
    // A locked entry cannot be removed by another task; an overwritable
    // one can.
    let out = vm.run_with(&bin("rme"), &[&format!("t{a}lmbi0"), "0"], "", false);
    assert!(out.contains("Key locked by another task, can't delete."), "rme:\n{out}");
    let out = vm.run(&bin("rme"), &[&format!("t{b}lmbi0"), "0"]);
    assert!(!out.contains("rme: no service"), "rme:\n{out}");
    let out = vm.run_with(&bin("rme"), &[&format!("t{b}lmbi0"), "0"], "", false);
    assert!(out.contains(&format!("no service running for <t{b}lmbi0> index <0>")), "rme:\n{out}");
    // task_end reads lmbi's entry (its TID and context lead the
    // message) and sends it "END"; its entries go with it.
    let out = vm.run(&bin("task_end"), &[&format!("t{b}lmbi1"), "0"]);
    assert!(out.contains(&format!("id: {b}   with their context: 0")), "task_end:\n{out}");
    let out = vm.finish(waiting, &bin("lmbi"), "lmbi-w", true);
    assert!(out.contains(&format!("lmbi: t{b} END.")), "lmbi:\n{out}");
    let out = vm.run(&bin("gmbi"), &[]);
    assert!(out.contains("gmbi: 3 mbox entries returned.") && !out.contains(&format!("t{b}lmbi")), "gmbi:\n{out}");
}

#[test]
fn debians_service_and_context_programs_run_unchanged() {
    let Some(deb) = debian() else { return };
    let vm = Vm::new(Some(&deb));
    let bin = |n: &str| deb.join("usr/bin").join(n);
    // task0 offers a service in a new context through the mailbox;
    // task1 finds it there and talks to it in that context.
    let mut server = vm.start(&bin("task0"), &["svc"], "task0", std::process::Stdio::null());
    vm.wait_for_classes(&mut server, "task0", &bin("gmbi"), "svc", 1);
    let out = vm.run(&bin("gmbi"), &["svc"]);
    let s = tid_after(&out, "owner_tid <t");
    let out = vm.run(&bin("task1"), &["svc"]);
    let ctx = number_after(&out, "and with context: ");
    assert!(ctx > 0, "task1:\n{out}");
    for (n, args) in [(1, &["svc"][..]), (2, &["svc", "0", "f"][..])] {
        let out = if n == 1 { out.clone() } else { vm.run(&bin("task1"), args) };
        assert!(out.contains(&format!("tid: {s} and with context: {ctx}")), "task1:\n{out}");
        assert!(
            out.contains(&format!("from task t{s} welcome to my server - you are service request number {n}.")),
            "task1:\n{out}"
        );
    }
    // The name is taken: a second server is refused.
    let out = vm.run_with(&bin("task0"), &["svc"], "", false);
    assert!(out.contains("Key locked by another task, can't delete."), "task0:\n{out}");
    let out = vm.run(&bin("task_end"), &["svc", "0"]);
    assert!(out.contains(&format!("id: {s}   with their context: {ctx}")), "task_end:\n{out}");
    let t0 = vm.finish(server, &bin("task0"), "task0", true);
    assert!(t0.contains("just inserted service name <svc> at index 0."), "task0:\n{t0}");
    assert!(t0.contains(&format!("task0: t{s} on machine")) && t0.contains(&format!("with context {ctx}.")), "{t0}");
    assert!(t0.contains("END  Request number 3.") && t0.contains("handled 3 service requests."), "task0:\n{t0}");

    // A spawned task starts in its parent's context.
    let out = vm.run(&bin("inherita"), &["inherit1"]);
    let c = number_after(&out, "with changed context ");
    assert!(c > 0, "{out}");
    assert!(out.contains("I just spawned inherit2 as tid t"), "{out}");
    let lines: Vec<_> = out.lines().filter(|l| l.contains("with context")).collect();
    assert_eq!(lines.len(), 5, "inherit1 twice, its spawn, inherit2, END:\n{out}");
    assert!(lines.iter().all(|l| l.contains(&format!("with context {c}."))), "inherita inherit1:\n{out}");
    assert!(out.contains("END - sent from inherit1") && out.contains("with original context 0."), "{out}");
    // inherit3 makes a context of its own and spawns in it.
    let out = vm.run(&bin("inherita"), &["inherit3"]);
    let c = number_after(&out, "with changed context ");
    let c3 = out
        .lines()
        .filter_map(|l| l.split_once("inherit3: I just spawned inherit2 as tid t"))
        .map(|(_, r)| number_after(r, "with context "))
        .next()
        .unwrap_or_else(|| panic!("{out}"));
    assert!(c3 != c && c3 > 0, "inherit3's own context:\n{out}");
    assert!(out.contains(&format!("with context {c3}.\n")) && out.contains("END - sent from inherit3"), "{out}");
    let inherit2 = out.lines().find(|l| l.contains("\tinherit2 t")).unwrap_or_else(|| panic!("{out}"));
    assert!(inherit2.contains(&format!("with context {c3}.")), "inherit2 in inherit3's context:\n{out}");
    // Two children in two contexts, each heard in its own.
    let out = vm.run(&bin("inheritb"), &[]);
    let c1 = number_after(&out, "with new #1 context ");
    let c2 = number_after(&out, "with new #2 context ");
    assert!(c1 != c2, "{out}");
    assert!(out.contains(&format!("with context {c2}. <-- received from 2nd inherit2.")), "inheritb:\n{out}");
    assert!(out.contains(&format!("with context {c1}. <-- received from 1st inherit2.")), "inheritb:\n{out}");
}

#[test]
fn debians_message_handler_programs_run_unchanged() {
    let Some(deb) = debian() else { return };
    let vm = Vm::new(Some(&deb));
    let bin = |n: &str| deb.join("usr/bin").join(n);
    // mhf_server registers in the mailbox; mhf_tickle (a menu on
    // standard input) finds it there and has it load a handler for its
    // tag 5 in context 0, sends a message the handler must catch, asks
    // the server to list its handlers, deletes the handler, sends again
    // (now nothing catches it), and ends the server.
    let mut server = vm.start(&bin("mhf_server"), &[], "server", std::process::Stdio::null());
    vm.wait_for_classes(&mut server, "server", &bin("gmbi"), "mhf_server", 1);
    let out = vm.run_paced(
        &bin("mhf_tickle"),
        &[],
        &["1\n5\n0\n1\n", "4\n5\n0\n1\nhello there\n", "0\n", "2\n0\n", "4\n5\n0\n1\nagain\n", "9\n"],
    );
    let t = tid_after(&out, "mhf_tickle: message source tid: t");
    let srv = vm.finish(server, &bin("mhf_server"), "server", true);
    assert!(srv.contains("just inserted server <mhf_server> at mailbox 0"), "{srv}");
    let at = |want: &str| srv.find(want).unwrap_or_else(|| panic!("mhf_server: no {want:?}:\n{srv}"));
    let loaded = at(&format!("pvm_addmhf( src = t{t}, tag = 5, ctx = 0 )  -> loaded SC1"));
    let caught = at("string_catcher1: string_catcher1 received message -->> <hello there>");
    let hit = at("HIT:  ping target 1 - SC1   strings match <hello there>.");
    let listed =
        at(&format!("mhf_server t{}: mhf_server: PMH: Are you talking to me!!!", tid_after(&srv, "mhf_server: t")));
    let deleted = at("DMH: AFTER delete with pvm_delmhf( mhid = 0 )");
    let missed =
        at("NO HIT:  lmh = 1 - SC1   mhf_catch = -99 - ?C?   strings NO match - local <again>   mhf <NO MATCH>.");
    assert!(loaded < caught && caught < hit && hit < listed && listed < deleted && deleted < missed, "order:\n{srv}");
    assert!(srv[listed..deleted].contains(&format!("mhid 0: src t{t} tag 5 ctx 0")), "the list:\n{srv}");
    assert!(srv[deleted..].contains("0 message handler(s)"), "{srv}");
    assert!(!srv.contains("received message -->> <again>"), "a deleted handler ran:\n{srv}");
    assert!(srv.contains("CEAT: Termiate Self..."), "{srv}");
}

#[test]
fn spawned_tasks_output_goes_to_the_output_tid_and_catchout() {
    let vm = Vm::new(None);
    let exe = vm.dir.path().join("output");
    run(Command::new("gcc")
        .args(["-O1", "-Wall", "-I"])
        .arg(our_include())
        .arg("-o")
        .arg(&exe)
        .arg(tests::root().join("tests/pvm/output.c"))
        .arg("-L")
        .arg(vm.dir.path().join("lib"))
        .arg("-lpvm3"));
    // Two children and their two children, each announced, its text and
    // its end, from the host's daemon TID.
    let out = vm.run(&exe, &[]);
    assert!(out.lines().any(|l| l == "output: ok"), "{out}");
    // pvm_catchout: the lines, tagged, with BEGIN and EOF; pvm_exit waits
    // for them.
    let file = vm.dir.path().join("caught");
    let out = vm.run(&exe, &["catch", file.to_str().unwrap()]);
    assert!(out.lines().any(|l| l == "output: ok"), "{out}");
}

/// Processes still running a program of the VM's `bin` (spawned tasks).
fn running_from(dir: &Path) -> Vec<String> {
    let dir = dir.to_string_lossy().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(&dir) && c.contains("/bin/LINUX64/"))
        .collect()
}

#[test]
fn debians_console_runs_on_ours() {
    let Some(deb) = debian() else { return };
    let vm = Vm::new(Some(&deb));
    // The console reads a line at a time and looks for its jobs' output
    // only after each one (its stdout, a file here, is flushed as it
    // goes); empty lines give it time. In a fresh VM the console is
    // t40001, spmd's copies t40002 to t40005, then t40006, t40007.
    let out = vm.run_paced(
        &deb.join("usr/bin/pvm"),
        &[],
        &[
            "conf\n",
            "spawn -4 -> spmd\n",
            "\n",
            "\n",
            "\n",
            "\n",
            "spawn -> timing_slave\n",
            "\n",
            "ps -a\n",
            "kill t40006\n",
            "\n",
            "\n",
            "ps -a\n",
            "spawn -> timing_slave\n",
            "\n",
            "reset\n",
            "\n",
            "\n",
            "ps -a\n",
            "spawn timing_slave\n",
            "\n",
            "halt\n",
        ],
    );
    let host = run(&mut Command::new("hostname")).trim().to_string();
    assert!(out.contains("pvmd already running."), "{out}");
    assert!(out.contains("1 host, 1 data format"), "{out}");
    assert!(
        out.lines().any(|l| l.split_whitespace().eq([host.as_str(), "40000", "LINUX64", "1000", "0x00408841"])),
        "{out}"
    );
    // spmd's ring over 4 tasks, its output through the console's job 1.
    assert!(out.contains("4 successful"), "{out}");
    assert!(out.contains("[1:t40002] token ring done"), "{out}");
    for t in 2..=5 {
        assert!(out.contains(&format!("[1:t4000{t}] EOF")), "no EOF of t4000{t}:\n{out}");
    }
    assert!(out.contains("[1] finished"), "{out}");
    // ps -a lists timing_slave (running, spawned); kill ends it (job 2
    // finishes), and the next ps lists nothing.
    let ps: Vec<&str> = out.split("HOST      TID   FLAG 0x COMMAND").skip(1).collect();
    assert_eq!(ps.len(), 3, "three ps listings:\n{out}");
    // The tasks a listing shows: its lines that start with the host name.
    let listed = |seg: &str| -> Vec<String> {
        seg.lines().filter(|l| l.split_whitespace().next() == Some(host.as_str())).map(str::to_string).collect()
    };
    assert_eq!(listed(ps[0]).len(), 1, "{out}");
    assert!(listed(ps[0])[0].split_whitespace().eq([host.as_str(), "40006", "6/c,f", "timing_slave"]), "{out}");
    assert!(out.contains("[2:t40006] EOF") && out.contains("[2] finished"), "{out}");
    assert!(listed(ps[1]).is_empty(), "{out}");
    // reset ends the second timing_slave (job 3).
    assert!(out.contains("[3:t40007] EOF") && out.contains("[3] finished"), "{out}");
    assert!(listed(ps[2]).is_empty(), "{out}");
    // halt ends the last one (output not redirected) and the console.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !running_from(vm.dir.path()).is_empty() {
        assert!(Instant::now() < deadline, "tasks left after halt: {:?}", running_from(vm.dir.path()));
        std::thread::sleep(Duration::from_millis(100));
    }
}
