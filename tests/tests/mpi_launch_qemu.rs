//! QEMU tier for the MPI launchers: `mc-cluster mpirun` on 2 guests runs
//! `mpiexec` in guest 0, which starts ranks through the `mpid` of both
//! guests (UMP over shared memory and MEMORY CHANNEL). A stand-in program
//! in the shared folder prints its launch variables and host name.

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use tests::{launcher, Cluster};

/// `show`: print and exit 0; `fail R C`: rank R exits C after a second,
/// the others sleep; `sleep`: every rank sleeps.
const STAND_IN: &str = r#"#!/bin/sh
echo "rank=$MCMPI_RANK size=$MCMPI_SIZE job=$MCMPI_JOB host=$(hostname) pid=$$"
case "$1" in
show) exit 0 ;;
fail)
    if [ "$MCMPI_RANK" = "$2" ]; then sleep 1; exit "$3"; fi
    exec sleep 300 ;;
sleep) exec sleep 300 ;;
esac
exit 9
"#;

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
}

fn mpirun(c: &Cluster, args: &[&str]) -> (Output, Duration) {
    let t0 = Instant::now();
    let o = Command::new(launcher())
        .args(["--name", &c.name, "mpirun", "--timeout", "180"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (o, t0.elapsed())
}

/// (rank, host) of each report line, sorted by rank; checks one job of `size`.
fn placed(out: &str, size: u32) -> Vec<(u32, String)> {
    let mut v = Vec::new();
    let mut jobs = std::collections::HashSet::new();
    for l in out.lines().filter(|l| l.starts_with("rank=")) {
        let f: Vec<&str> = l.split_whitespace().map(|kv| kv.split_once('=').unwrap().1).collect();
        assert_eq!(f[1], size.to_string(), "{l}");
        jobs.insert(f[2].to_string());
        v.push((f[0].parse::<u32>().unwrap(), f[3].to_string()));
    }
    assert_eq!(jobs.len(), 1, "ranks of more than one job:\n{out}");
    v.sort();
    v
}

/// Waits until no stand-in is left sleeping on any node.
fn no_ranks_left(c: &Cluster, secs: u64) {
    for n in 0..c.nodes {
        c.poll_until(n, &["sh", "-c", "ps | grep -c '[s]leep 300' || true"], secs, |o| o.trim() == "0");
    }
}

#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn mpirun_starts_ranks_on_both_guests_and_ends_failing_jobs() {
    let c = Cluster::up("t-mpi-launch", 2);
    // `up` returns once every mpid listens, over MEMORY CHANNEL: a job can
    // start at once, with no waiting here.
    for n in 0..c.nodes {
        let said =
            c.up_output.lines().any(|l| l.contains(&format!("node {n} ready after")) && l.contains("(mpid listening)"));
        assert!(said, "{}", c.up_output);
        let log = String::from_utf8(c.run(n, &["cat", "/var/log/mpid.log"])).unwrap();
        assert!(log.contains("listening on handle") && log.contains("MEMORY CHANNEL"), "node {n}:\n{log}");
    }
    let prog = c.run_dir().join("share/rank.sh");
    std::fs::write(&prog, STAND_IN).unwrap();
    std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();

    // 4 ranks in blocks: 0,1 on node0 and 2,3 on node1, one job.
    let (o, _) = mpirun(&c, &["-n", "4", "/share/rank.sh", "show"]);
    assert!(o.status.success(), "{}", text(&o));
    let p = placed(&String::from_utf8_lossy(&o.stdout), 4);
    let want: Vec<(u32, String)> =
        [(0, "node0"), (1, "node0"), (2, "node1"), (3, "node1")].iter().map(|(r, h)| (*r, h.to_string())).collect();
    assert_eq!(p, want, "{}", text(&o));

    // --ppn 1: round robin.
    let (o, _) = mpirun(&c, &["-n", "4", "--ppn", "1", "/share/rank.sh", "show"]);
    assert!(o.status.success(), "{}", text(&o));
    let hosts: Vec<String> = placed(&String::from_utf8_lossy(&o.stdout), 4).into_iter().map(|x| x.1).collect();
    assert_eq!(hosts, ["node0", "node1", "node0", "node1"], "{}", text(&o));

    // A failing rank on node1 ends the job with its code, within seconds,
    // and nothing is left running on either guest.
    let (o, took) = mpirun(&c, &["-n", "4", "/share/rank.sh", "fail", "3", "5"]);
    assert_eq!(o.status.code(), Some(5), "{}", text(&o));
    assert!(text(&o).contains("mpiexec: rank 3 on node1 exited with code 5; ending the other 3 ranks"), "{}", text(&o));
    assert!(took < Duration::from_secs(30), "took {took:?}");
    no_ranks_left(&c, 15);

    // Errors: a program that is not there, a host that is not there.
    let (o, _) = mpirun(&c, &["-n", "2", "/share/no-such-program"]);
    assert_eq!(o.status.code(), Some(127), "{}", text(&o));
    assert!(text(&o).contains("could not start"), "{}", text(&o));
    let o = c.exec(0, &["mpiexec", "-hosts", "node5", "/share/rank.sh", "show"]);
    assert_eq!(o.status.code(), Some(255), "{}", text(&o));
    assert!(text(&o).contains("unknown host 'node5'"), "{}", text(&o));

    // Ending mc-cluster mpirun ends the job on both guests.
    let log = c.run_dir().join("mpirun-sleep.log");
    let mut run = Command::new(launcher())
        .args(["--name", &c.name, "mpirun", "-n", "4", "/share/rank.sh", "sleep"])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::create(log.with_extension("err")).unwrap())
        .spawn()
        .unwrap();
    // (Node 0's agent serves mpirun meanwhile: look at node 1.)
    let t0 = Instant::now();
    loop {
        let o = c.exec(1, &["sh", "-c", "ps | grep -c '[s]leep 300' || true"]);
        if String::from_utf8_lossy(&o.stdout).trim() == "2" {
            break;
        }
        if t0.elapsed() > Duration::from_secs(60) || run.try_wait().unwrap().is_some() {
            let _ = run.kill();
            let _ = run.wait();
            panic!(
                "node 1 never ran its 2 ranks; mpirun said:\n{}{}",
                std::fs::read_to_string(&log).unwrap_or_default(),
                std::fs::read_to_string(log.with_extension("err")).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    // SAFETY: kill on our child's pid.
    unsafe { libc::kill(run.id() as i32, libc::SIGINT) };
    // (The ranks sleep 300 s: an mpirun that ignored the signal would end
    // only with them, and nothing would be left to find.)
    let t0 = Instant::now();
    let _ = run.wait();
    assert!(t0.elapsed() < Duration::from_secs(20), "mpirun took {:?} to end on SIGINT", t0.elapsed());
    no_ranks_left(&c, 20);

    // mpiexec killed outright in guest 0: both daemons find out (node 1's
    // through imcd's relay) and end their ranks.
    let job = "mpiexec -n 4 -hosts node0,node1 /share/rank.sh sleep";
    c.run(0, &["sh", "-c", &format!("({job} > /tmp/killed.log 2>&1 &)")]);
    c.poll_until(1, &["sh", "-c", "ps | grep -c '[s]leep 300' || true"], 60, |o| o.trim() == "2");
    c.run(0, &["sh", "-c", "kill -9 $(pidof mpiexec)"]);
    no_ranks_left(&c, 20);
    let log = String::from_utf8(c.run(1, &["cat", "/var/log/mpid.log"])).unwrap();
    assert!(log.contains("the other side is gone"), "{log}");

    // Node 1 leaves the cluster: its link down past imcd's grace revokes
    // every attachment there, mpid's listening inbox among them (nobody
    // could reach it: "no mpid answered on node1"). mpid sets up again,
    // and a job runs across both guests once node 1 is back.
    c.hub(&["link-down", "1"]);
    std::thread::sleep(Duration::from_secs(5));
    c.hub(&["link-up", "1"]);
    c.poll_until(1, &["cat", "/var/log/mpid.log"], 30, |o| o.contains("this node left the cluster"));
    let t0 = Instant::now();
    loop {
        let (o, _) = mpirun(&c, &["-n", "2", "--ppn", "1", "/share/rank.sh", "show"]);
        if o.status.success() {
            assert_eq!(placed(&String::from_utf8_lossy(&o.stdout), 2).len(), 2, "{}", text(&o));
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(40),
            "no job across node 1 after it left and rejoined:\n{}\n{}",
            text(&o),
            c.guest_logs()
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    eprintln!("a job across node 1 {:?} after it was back", t0.elapsed());
}
