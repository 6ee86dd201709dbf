//! Our MPI on the host, ranks over shared memory (fast tier): the C test
//! programs of `tests/mpi/`, built once with `guest/msg/mpi/mpicc`, run as
//! several processes (the launch variables set directly, as `mpid` would),
//! and the same binaries run unchanged on MPICH's `libmpi_abi.so.1` from
//! the PyPI wheel (set-up's `mpich` step).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use tests::root;

/// Builds the library into a temporary folder once per test process.
fn lib_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("mpi-host-lib-{}", std::process::id()));
        let o = Command::new("nice")
            .args(["-n", "19"])
            .arg(root().join("scripts/build-mpi.sh"))
            .arg(&dir)
            .output()
            .unwrap();
        assert!(o.status.success(), "build-mpi.sh: {}", String::from_utf8_lossy(&o.stderr));
        dir
    })
    .clone()
}

/// Compiles `tests/mpi/NAME.c` with our mpicc into `dir`.
fn build(dir: &Path, name: &str) -> PathBuf {
    let out = dir.join(name);
    let o = Command::new(root().join("guest/msg/mpi/mpicc"))
        .args(["-O1", "-Wall", "-o"])
        .arg(&out)
        .arg(root().join(format!("tests/mpi/{name}.c")))
        .output()
        .unwrap();
    assert!(o.status.success(), "mpicc {name}: {}", String::from_utf8_lossy(&o.stderr));
    out
}

/// A job id unlike other tests' and other runs'.
fn job() -> u32 {
    static N: AtomicU32 = AtomicU32::new(0);
    (std::process::id() & 0xFFF) << 8 | (N.fetch_add(1, Ordering::Relaxed) + 1)
}

/// Starts `n` ranks of one job on our library, each from `command()`,
/// with `env` set too (an empty value unsets a variable); their output is
/// piped. As `mpiexec` does, the placement (`MCMPI_NODES`: all on this
/// host) is set; channels open on first use (`MCMPI_LAZY=1`: the default
/// only for jobs whose channels would fill imcd's directory), the path
/// with more to go wrong.
fn spawn_ranks(command: impl Fn() -> Command, n: u32, env: &[(&str, &str)]) -> Vec<Child> {
    let job = job().to_string();
    (0..n)
        .map(|r| {
            let mut c = command();
            c.env("LD_LIBRARY_PATH", lib_dir())
                .env("MCMPI_JOB", &job)
                .env("MCMPI_RANK", r.to_string())
                .env("MCMPI_SIZE", n.to_string())
                .env("MCMPI_NODES", format!("0*{n}"))
                .env("MCMPI_LAZY", "1");
            for (k, v) in env {
                if v.is_empty() {
                    c.env_remove(k);
                } else {
                    c.env(k, v);
                }
            }
            c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap()
        })
        .collect()
}

/// Runs `prog` as `n` ranks on our library (each ended after 120 s), with
/// `env` set too; each rank's output.
fn run_ours_with(prog: &Path, n: u32, env: &[(&str, &str)]) -> Vec<Output> {
    let timed = || {
        let mut c = Command::new("timeout");
        c.arg("120").arg(prog);
        c
    };
    spawn_ranks(timed, n, env).into_iter().map(|c| c.wait_with_output().unwrap()).collect()
}

/// [`run_ours_with`] with no more settings.
fn run_ours(prog: &Path, n: u32) -> Vec<Output> {
    run_ours_with(prog, n, &[])
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
}

#[test]
fn c_programs_run_over_shared_memory_on_the_host() {
    let dir = tempfile::tempdir().unwrap();
    for (name, ranks) in [
        ("ring", 4),
        ("ring", 3),
        ("comms", 4),
        ("comms", 5),
        ("nbc", 4),
        ("nbc", 5),
        ("inter", 2),
        ("inter", 5),
        ("onesided", 8),
        ("onesided", 3),
    ] {
        let prog = build(dir.path(), name);
        let outs = run_ours(&prog, ranks);
        for (r, o) in outs.iter().enumerate() {
            assert!(o.status.success(), "{name} with {ranks} ranks: rank {r} failed:\n{}", text(o));
        }
        assert!(text(&outs[0]).contains(" No Errors"), "{name} with {ranks} ranks:\n{}", text(&outs[0]));
    }
}

/// `MCMPI_STATS`' count of the other ranks a rank had a channel to.
fn channels_of(out: &str) -> usize {
    let head = out.split(" with a channel").next().filter(|h| h.len() < out.len());
    let head = head.unwrap_or_else(|| panic!("no channel count in:\n{out}"));
    head.rsplit(' ').next().and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("{out}"))
}

/// With `MCMPI_LAZY=1` (and the placement, `MCMPI_NODES`, as `mpiexec`
/// sets it), ranks open their channels on first use: a rank that only
/// ever hears from another takes the channel that one opened, and ranks
/// that never talk open none. Without the placement, with `MCMPI_LAZY=0`,
/// or by default for a job this small, every channel opens in `MPI_Init`.
#[test]
fn channels_open_on_first_use() {
    let dir = tempfile::tempdir().unwrap();
    let prog = build(dir.path(), "lazy");
    let n = 8;
    for (env, lazy) in [
        (vec![("MCMPI_STATS", "1")], true),
        (vec![("MCMPI_STATS", "1"), ("MCMPI_LAZY", "0")], false),
        (vec![("MCMPI_STATS", "1"), ("MCMPI_LAZY", "")], false),
        (vec![("MCMPI_STATS", "1"), ("MCMPI_NODES", "")], false),
    ] {
        let outs = run_ours_with(&prog, n, &env);
        for (r, o) in outs.iter().enumerate() {
            assert!(o.status.success(), "{env:?}: rank {r} failed:\n{}", text(o));
        }
        assert!(text(&outs[0]).contains(" No Errors"), "{env:?}:\n{}", text(&outs[0]));
        let used: Vec<usize> = outs.iter().map(|o| channels_of(&text(o))).collect();
        assert_eq!(used[0], n as usize - 1, "{env:?}: rank 0 heard from every rank: {used:?}");
        if lazy {
            assert!(used.iter().any(|&u| u < n as usize - 1), "every rank opened every channel: {used:?}");
            eprintln!("channels per rank, opened on first use: {used:?}");
        } else {
            assert!(used.iter().all(|&u| u == n as usize - 1), "{env:?}: {used:?}");
        }
    }
    // A placement that does not add up is refused by name.
    let outs = run_ours_with(&prog, 2, &[("MCMPI_NODES", "0*3")]);
    assert!(!outs[0].status.success() && text(&outs[0]).contains("MCMPI_NODES"), "{}", text(&outs[0]));
}

#[test]
fn a_wait_that_lasts_says_what_it_waits_for() {
    let dir = tempfile::tempdir().unwrap();
    let prog = build(dir.path(), "stall");
    let outs = run_ours_with(&prog, 2, &[("MCMPI_STALL_REPORT", "1")]);
    for (r, o) in outs.iter().enumerate() {
        assert!(o.status.success(), "rank {r}:\n{}", text(o));
    }
    let zero = text(&outs[0]);
    assert!(zero.contains("stall ok: got 7"), "{zero}");
    assert!(
        zero.contains("mcmpi: rank 0: has waited")
            && zero.contains("a receive from rank 1 tag 42: no message matched yet"),
        "the receive's report:\n{zero}"
    );
    assert!(zero.contains("in a collective;"), "the barrier's report:\n{zero}");
    assert!(zero.contains("to rank 1:"), "each link's state:\n{zero}");
    assert!(!text(&outs[1]).contains("has waited"), "rank 1 never waited long:\n{}", text(&outs[1]));
}

#[test]
fn an_aborting_rank_exits_with_its_code_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let prog = build(dir.path(), "abort");
    // Rank 3 aborts right after MPI_Init; the others would sleep for 10
    // minutes (ending them is the launcher's part: tests/tests/mpi_qemu.rs).
    let mut kids = spawn_ranks(|| Command::new(&prog), 4, &[]);
    let three = kids.remove(3).wait_with_output().unwrap();
    assert_eq!(three.status.code(), Some(7), "{}", text(&three));
    assert!(text(&three).contains("MPI_Abort: rank 3 ends the job with code 7"), "{}", text(&three));
    for mut k in kids {
        let _ = k.kill();
        let _ = k.wait();
    }
}

#[test]
fn the_same_binary_runs_on_mpich() {
    let mpich = root().join(".cache/mpich");
    if !mpich.join("lib/libmpi_abi.so.1").is_file() {
        eprintln!("SKIP: MPICH's wheel is not in .cache/mpich (scripts/setup.sh --only mpich)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for name in ["ring", "comms", "nbc", "inter", "onesided"] {
        let prog = build(dir.path(), name);
        let ours = run_ours(&prog, 4);
        assert!(text(&ours[0]).contains(" No Errors"), "{name} on ours:\n{}", text(&ours[0]));
        let theirs = Command::new("timeout")
            .arg("120")
            .arg(mpich.join("bin/mpiexec"))
            .args(["-n", "4", "-launcher", "fork"])
            .arg(&prog)
            .env("LD_LIBRARY_PATH", mpich.join("lib"))
            .output()
            .unwrap();
        assert!(theirs.status.success(), "{name} on MPICH:\n{}", text(&theirs));
        assert!(text(&theirs).contains(" No Errors"), "{name} on MPICH:\n{}", text(&theirs));
    }
}
