//! MPICH's example programs `cpi`, `hellow` and `srtest`, unmodified,
//! built with our `mpicc` and run with 4 ranks on the host (shared memory
//! between the ranks). Fast tier (no guests).
//!
//! The sources come from Debian's `mpich` source package, which
//! `scripts/setup.sh --only mpich-suite` unpacks into `.cache/mpich-src`;
//! without them the test is skipped with a message. The library is linked
//! afresh by `scripts/build-mpi.sh` into a scratch folder, so the test runs
//! the code of this tree.
//!
//! - `cpi`: every rank reports itself, rank 0 prints pi with an error
//!   below 1e-8 (the midpoint rule with 10000 intervals, summed by
//!   `MPI_Reduce` over the ranks' partial sums, after an `MPI_Bcast`).
//! - `hellow`: a greeting from every rank, each knowing the size.
//! - `srtest`: "hello there" passed around the ring 0 → 1 → 2 → 3 → 0
//!   (`MPI_Send`, `MPI_Recv` from `MPI_ANY_SOURCE`), then `MPI_Barrier`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tests::run_ok as run;

const RANKS: u32 = 4;

/// What one rank printed.
struct Rank {
    stdout: String,
    stderr: String,
}

/// Starts `RANKS` ranks of `exe` with a fresh job id; every rank must exit
/// 0 within the time limit.
fn launch(exe: &Path, lib: &Path, job: u32, dir: &Path) -> Vec<Rank> {
    let mut children = Vec::new();
    for r in 0..RANKS {
        let out = std::fs::File::create(dir.join(format!("out{r}"))).unwrap();
        let err = std::fs::File::create(dir.join(format!("err{r}"))).unwrap();
        let child = Command::new(exe)
            .env("MCMPI_JOB", job.to_string())
            .env("MCMPI_RANK", r.to_string())
            .env("MCMPI_SIZE", RANKS.to_string())
            .env("LD_LIBRARY_PATH", lib)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap();
        children.push(child);
    }
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut status = vec![None; children.len()];
    while status.iter().any(Option::is_none) && Instant::now() < deadline {
        for (i, c) in children.iter_mut().enumerate() {
            if status[i].is_none() {
                status[i] = c.try_wait().unwrap();
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for c in &mut children {
        let _ = c.kill();
        let _ = c.wait();
    }
    let ranks: Vec<Rank> = (0..RANKS)
        .map(|r| Rank {
            stdout: std::fs::read_to_string(dir.join(format!("out{r}"))).unwrap_or_default(),
            stderr: std::fs::read_to_string(dir.join(format!("err{r}"))).unwrap_or_default(),
        })
        .collect();
    let all: String = ranks.iter().enumerate().map(|(i, r)| format!("rank {i}:\n{}{}", r.stdout, r.stderr)).collect();
    for (i, s) in status.iter().enumerate() {
        match s {
            Some(st) => assert!(st.success(), "{} rank {i} exited {st}\n{all}", exe.display()),
            None => panic!("{} rank {i} still running after 90 s (killed)\n{all}", exe.display()),
        }
    }
    ranks
}

/// A job id no other run of this test uses.
fn job(n: u32) -> u32 {
    0x6e00_0000 | (std::process::id() & 0xffff) << 8 | n
}

#[test]
fn mpich_examples_cpi_hellow_srtest_run_with_four_ranks_on_the_host() {
    let examples = tests::cache().join("mpich-src/examples");
    if !examples.join("cpi.c").is_file() {
        eprintln!(
            "SKIPPED: MPICH's examples are not in {} (run scripts/setup.sh --only mpich-suite)",
            examples.display()
        );
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let home = scratch.path();
    let lib = home.join("lib");
    run(Command::new("nice").args(["-n", "19"]).arg(tests::root().join("scripts/build-mpi.sh")).arg(&lib));
    std::os::unix::fs::symlink(tests::root().join("guest/msg/mpi/include"), home.join("include")).unwrap();
    let build = |name: &str| -> PathBuf {
        let exe = home.join(name);
        run(Command::new("nice")
            .args(["-n", "19"])
            .arg(tests::root().join("guest/msg/mpi/mpicc"))
            .env("MCMPI_HOME", home)
            .args(["-O1", "-o"])
            .arg(&exe)
            .arg(examples.join(format!("{name}.c")))
            .arg("-lm"));
        exe
    };

    // cpi
    let ranks = launch(&build("cpi"), &lib, job(1), home);
    for (r, out) in ranks.iter().enumerate() {
        assert!(
            out.stdout.contains(&format!("Process {r} of {RANKS} is on ")),
            "cpi rank {r} did not report itself:\n{}",
            out.stdout
        );
    }
    let line = ranks[0]
        .stdout
        .lines()
        .find(|l| l.starts_with("pi is approximately "))
        .unwrap_or_else(|| panic!("cpi rank 0 printed no result:\n{}", ranks[0].stdout));
    let nums: Vec<f64> = line.split([' ', ',']).filter_map(|w| w.parse().ok()).collect();
    assert_eq!(nums.len(), 2, "cannot read {line:?}");
    assert!((nums[0] - std::f64::consts::PI).abs() < 1e-8, "{line}");
    assert!(nums[1] < 1e-8 && (nums[1] - (nums[0] - std::f64::consts::PI).abs()).abs() < 1e-12, "{line}");
    for r in &ranks[1..] {
        assert!(!r.stdout.contains("pi is approximately"), "only rank 0 prints the result");
    }

    // hellow
    let ranks = launch(&build("hellow"), &lib, job(2), home);
    for (r, out) in ranks.iter().enumerate() {
        assert_eq!(out.stdout.trim(), format!("Hello world from process {r} of {RANKS}"), "hellow rank {r}");
    }

    // srtest
    let ranks = launch(&build("srtest"), &lib, job(3), home);
    let msg = "'hello there'";
    for (r, out) in ranks.iter().enumerate() {
        assert!(out.stderr.contains(&format!("Process {r} of {RANKS}")), "srtest rank {r}:\n{}", out.stderr);
        let want: Vec<String> = if r == 0 {
            vec![format!("0 sending {msg}"), "0 receiving".into(), format!("0 received {msg}")]
        } else {
            vec![format!("{r} receiving"), format!("{r} received {msg}"), format!("{r} sent {msg}")]
        };
        let got: Vec<&str> = out.stdout.lines().map(str::trim).collect();
        assert_eq!(got, want, "srtest rank {r}");
    }
}
