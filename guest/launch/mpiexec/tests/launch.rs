//! mpid and mpiexec on this machine (no QEMU): UMP over shared memory,
//! with the stand-in rank program. Two daemons with different node
//! numbers play two guests.

mod common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;

#[test]
fn four_ranks_get_distinct_ranks_of_one_job() {
    let dir = tempfile::tempdir().unwrap();
    let prog = stand_in(dir.path());
    let d = Mpid::start(base(1), 0);
    let (o, _) = run(mpiexec(d.base).args(["-n", "4", prog.to_str().unwrap(), "show"]), 60);
    assert!(o.status.success(), "{}", text(&o));
    let r = reports(&String::from_utf8_lossy(&o.stdout));
    assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), [0, 1, 2, 3], "{}", text(&o));
    let job = r[0].2;
    assert!(job != 0 && r.iter().all(|x| x.1 == 4 && x.2 == job), "{r:?}");
    // Every rank was started by the daemon.
    assert!(r.iter().all(|x| x.4 == d.pid()), "{r:?} (mpid pid {})", d.pid());

    // A second launch is a different job; -l tags each line with its rank.
    let (o, _) = run(mpiexec(d.base).args(["-n", "2", "-l", prog.to_str().unwrap(), "show"]), 60);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(out.lines().any(|l| l.starts_with("[1] rank=1 size=2")), "{out}");
    let r2 = reports(&out);
    assert_eq!(r2.len(), 2);
    assert_ne!(r2[0].2, job, "two launches got the same job id");
}

#[test]
fn ranks_go_to_hosts_in_blocks_with_environment_and_folder() {
    let dir = tempfile::tempdir().unwrap();
    let prog = stand_in(dir.path());
    let b = base(2);
    let (d0, d1) = (Mpid::start(b, 0), Mpid::start(b, 1));
    let node_of = |out: &str| -> Vec<u32> {
        reports(out)
            .iter()
            .map(|x| {
                if x.4 == d0.pid() {
                    0
                } else if x.4 == d1.pid() {
                    1
                } else {
                    99
                }
            })
            .collect()
    };
    let (o, _) = run(mpiexec(b).args(["-n", "4", "-hosts", "localhost,node1", prog.to_str().unwrap(), "show"]), 60);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(node_of(&String::from_utf8_lossy(&o.stdout)), [0, 0, 1, 1], "{}", text(&o));
    let (o, _) = run(mpiexec(b).args(["-n", "4", "-hosts", "0,1", "-ppn", "1", prog.to_str().unwrap(), "show"]), 60);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(node_of(&String::from_utf8_lossy(&o.stdout)), [0, 1, 0, 1], "{}", text(&o));

    // -genv reaches every rank on both nodes, and -wdir is their folder.
    let wdir = dir.path().join("w");
    std::fs::create_dir(&wdir).unwrap();
    let (o, _) = run(
        mpiexec(b).args(["-n", "2", "-hosts", "0,1", "-genv", "COLOUR", "deep blue", "-wdir"]).arg(&wdir).args([
            prog.to_str().unwrap(),
            "env",
            "COLOUR",
        ]),
        60,
    );
    assert!(o.status.success(), "{}", text(&o));
    let want = format!("COLOUR=deep blue cwd={}", wdir.display());
    assert_eq!(String::from_utf8_lossy(&o.stdout).lines().filter(|l| *l == want).count(), 2, "{}", text(&o));
}

#[test]
fn a_failing_rank_ends_the_job_with_its_code() {
    let dir = tempfile::tempdir().unwrap();
    let prog = stand_in(dir.path());
    let d = Mpid::start(base(3), 0);
    let (o, took) = run(mpiexec(d.base).args(["-n", "4", prog.to_str().unwrap(), "fail", "2", "3"]), 60);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("mpiexec: rank 2 on node0 exited with code 3; ending the other 3 ranks"), "{err}");
    assert!(err.contains("rank 2 failing"), "the rank's standard error was not forwarded: {err}");
    assert!(took < Duration::from_secs(10), "took {took:?}");
    let r = reports(&String::from_utf8_lossy(&o.stdout));
    assert_eq!(r.len(), 4, "{}", text(&o));
    let sleepers: Vec<u32> = r.iter().filter(|x| x.0 != 2).map(|x| x.3).collect();
    assert_eq!(wait_gone(&sleepers, 5), Vec::<u32>::new(), "ranks still running after mpiexec ended");
}

/// Starts `-n 3 sleep` ranks; returns mpiexec and the ranks' pids once all run.
fn sleeping_job(base: u64, prog: &str) -> (std::process::Child, Vec<u32>) {
    let mut c = mpiexec(base)
        .args(["-n", "3", prog, "sleep"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(c.stdout.take().unwrap()).lines();
    let mut pids = Vec::new();
    let t0 = Instant::now();
    while pids.len() < 3 {
        let l = lines.next().expect("mpiexec ended early").unwrap();
        pids.push(reports(&l)[0].3);
        assert!(t0.elapsed() < Duration::from_secs(30));
    }
    std::thread::spawn(move || for _ in lines {});
    (c, pids)
}

#[test]
fn killing_mpiexec_ends_its_ranks() {
    let dir = tempfile::tempdir().unwrap();
    let prog = stand_in(dir.path());
    let d = Mpid::start(base(4), 0);
    let p = prog.to_str().unwrap();

    // SIGKILL: mpid sees the other end of the channel die.
    let (mut c, pids) = sleeping_job(d.base, p);
    assert!(pids.iter().all(|&p| alive(p)));
    c.kill().unwrap();
    c.wait().unwrap();
    assert_eq!(wait_gone(&pids, 6), Vec::<u32>::new(), "ranks outlived a killed mpiexec");

    // SIGTERM (and Ctrl-C alike): mpiexec ends the ranks and exits 128 + 15.
    let (mut c, pids) = sleeping_job(d.base, p);
    // SAFETY: kill on our child's pid.
    unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
    let t0 = Instant::now();
    let st = loop {
        if let Some(st) = c.try_wait().unwrap() {
            break st;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "mpiexec did not end after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(st.code(), Some(143));
    assert_eq!(wait_gone(&pids, 3), Vec::<u32>::new(), "ranks outlived mpiexec's SIGTERM");
    // The daemon is still there for the next job.
    let (o, _) = run(mpiexec(d.base).args(["-n", "1", p, "show"]), 60);
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn bad_input_gets_clear_errors_and_nothing_hangs() {
    let dir = tempfile::tempdir().unwrap();
    let prog = stand_in(dir.path());
    let p = prog.to_str().unwrap();
    let d = Mpid::start(base(5), 0);
    let missing = dir.path().join("missing");
    let cases: Vec<(Vec<&str>, i32, String)> = vec![
        (vec!["-n", "0", p], 255, "mpiexec: -n 0: must be 1 to 65536".into()),
        (vec!["-n", "2"], 255, "no program given".into()),
        (vec!["-bogus", p], 255, "unknown option -bogus".into()),
        (vec!["-hosts", "frobnicate", p], 255, "unknown host 'frobnicate'".into()),
        (vec!["-hosts", "node0,node7", "-n", "2", p, "show"], 255, "no mpid answered on node7 within 3 s".into()),
        (
            vec!["-n", "2", "/no/such/program"],
            127,
            "rank 0 on node0 could not start: node 0: cannot run /no/such/program".into(),
        ),
        (
            vec!["-n", "1", "-wdir", missing.to_str().unwrap(), p, "show"],
            255,
            format!("working folder {} does not exist", missing.display()),
        ),
        (vec!["-n", "1", "-timeout", "1", p, "sleep"], 124, "the job ran past -timeout 1 s".into()),
    ];
    for (args, code, says) in cases {
        let (o, took) = run(mpiexec(d.base).args(&args), 30);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {}", text(&o));
        assert!(text(&o).contains(&says), "{args:?}: expected '{says}' in:\n{}", text(&o));
        assert!(took < Duration::from_secs(15), "{args:?} took {took:?}");
    }
    // mpirun is the same program under its other name.
    let link = dir.path().join("mpirun");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_mpiexec"), &link).unwrap();
    let mut c = mpiexec(d.base);
    let mut m = std::process::Command::new(&link);
    m.envs(c.get_envs().filter_map(|(k, v)| Some((k.to_owned(), v?.to_owned()))));
    let (o, _) = run(m.args(["-n", "2", p, "show"]), 60);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(reports(&String::from_utf8_lossy(&o.stdout)).len(), 2);
    let (o, _) = run(c.args(["-n", "x", p]), 30);
    assert!(String::from_utf8_lossy(&o.stderr).starts_with("mpiexec: -n x"), "{}", text(&o));
    assert!(alive(d.pid()), "mpid died");
}

#[test]
fn a_lost_mpid_ends_the_job_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let prog = stand_in(dir.path());
    let b = base(6);
    let d0 = Mpid::start(b, 0);
    let mut d1 = Mpid::start(b, 1);
    let mut c = mpiexec(b)
        .args(["-n", "4", "-hosts", "0,1", prog.to_str().unwrap(), "sleep"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(c.stdout.take().unwrap()).lines();
    let mut pids = Vec::new();
    while pids.len() < 4 {
        pids.push(reports(&lines.next().expect("mpiexec ended early").unwrap())[0].3);
    }
    // Node 1's daemon dies: its ranks die with it, mpiexec notices and ends node 0's.
    d1.child.kill().unwrap();
    d1.child.wait().unwrap();
    let t0 = Instant::now();
    let st = loop {
        if let Some(st) = c.try_wait().unwrap() {
            break st;
        }
        assert!(t0.elapsed() < Duration::from_secs(15), "mpiexec did not notice the lost mpid");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut c.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(st.code(), Some(255), "{err}");
    assert!(err.contains("lost mpid on node1") && err.contains("ending the other 2 ranks"), "{err}");
    assert_eq!(wait_gone(&pids, 5), Vec::<u32>::new(), "ranks outlived the job");
    assert!(alive(d0.pid()));
}
