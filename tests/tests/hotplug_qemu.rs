//! Surprise removal and hot-plug on real guests (docs/adapter.md,
//! "Surprise removal"): `mc-cluster unplug` takes node 1's adapter out
//! under a running imcd (the guest kernel's release request ends imcd,
//! mpid lets go, QEMU removes the device, the others see node 1 leave);
//! `mc-cluster plug` puts it back, imcd takes it and rejoins, and MEMORY
//! CHANNEL work between the two guests runs again.

use std::process::Command;
use std::time::{Duration, Instant};

use tests::{launcher, root, Cluster};

fn mc(c: &Cluster, args: &[&str]) -> (bool, String) {
    let o = Command::new(launcher()).args(["--name", &c.name]).args(args).output().unwrap();
    (o.status.success(), String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr))
}

/// Node `n` has a device with the adapter's PCI ids (the same look as
/// `mc-cluster plug` and the conformance runner take).
fn has_adapter(c: &Cluster, n: usize) -> bool {
    let o = c.exec(n, &["sh", "-c", launcher::FIND_ADAPTER]);
    !String::from_utf8_lossy(&o.stdout).trim().is_empty()
}

#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn surprise_removal_and_replug_under_imcd() {
    let config = root().join("qemu-configs/hotplug.toml");
    let c = Cluster::up_with("t-hotplug", 2, &["--config", config.to_str().unwrap()]);
    c.imcd_ready();
    c.poll_until(0, &["mctool", "imc-hosts"], 60, |o| o.contains("hosts [0, 1]"));
    // mpid holds device files imcd handed out: it must let go too.
    c.poll_until(1, &["cat", "/var/log/mpid.log"], 60, |o| o.contains("listening"));
    assert!(has_adapter(&c, 1));

    let t0 = Instant::now();
    let (ok, said) = mc(&c, &["unplug", "1"]);
    eprintln!("unplug took {:?}: {said}", t0.elapsed());
    assert!(ok && said.contains("node 1: adapter unplugged"), "{said}\n{}", c.guest_logs());
    assert!(!has_adapter(&c, 1), "node 1 still lists the adapter after the unplug");
    let log = c.poll_until(1, &["cat", "/var/log/imcd.log"], 30, |o| o.contains("waiting for one to be plugged in"));
    assert!(log.contains("asks for the adapter back"), "imcd did not see the release request:\n{log}");
    c.poll_until(0, &["mctool", "imc-hosts"], 30, |o| o.contains("hosts [0]") && !o.contains("hosts [0, 1]"));
    let (ok, said) = mc(&c, &["unplug", "1"]);
    assert!(!ok && said.contains("is the adapter plugged in?"), "a second unplug: {said}");

    let (ok, said) = mc(&c, &["plug", "1"]);
    assert!(ok && said.contains("node 1: adapter plugged in (imcd there took it"), "{said}");
    // `plug` returned once imcd serves again: no waiting here.
    let hosts = String::from_utf8_lossy(&c.run(1, &["mctool", "imc-hosts"])).into_owned();
    assert!(hosts.contains("hosts [0, 1]"), "right after plug, node 1's imcd: {hosts}");
    let log = String::from_utf8_lossy(&c.run(1, &["cat", "/var/log/imcd.log"])).into_owned();
    assert!(log.contains("an adapter was plugged in"), "{log}");
    let (ok, said) = mc(&c, &["plug", "1"]);
    assert!(!ok && said.contains("is the adapter unplugged?"), "a second plug: {said}");
    c.poll_until(0, &["mctool", "imc-hosts"], 60, |o| o.contains("hosts [0, 1]"));
    eprintln!("back in the cluster {:?} after the plug", t0.elapsed());

    // MEMORY CHANNEL work between the two again: the cluster lock, exact.
    for n in 0..2 {
        c.background(n, "lk", "mctool imc-lock-test --procs 1 --rounds 200 --total 400");
    }
    for n in 0..2 {
        let (rc, log) = c.background_result(n, "lk", 120);
        assert!(rc == "0" && log.contains("counter 400 exact"), "node {n}'s lock counter after the replug:\n{log}");
    }
    // And an MPI job through mpid, which listens again on the new adapter.
    let t1 = Instant::now();
    loop {
        let (ok, out) = mc(&c, &["mpirun", "-n", "2", "--ppn", "1", "/bin/bbp-tool", "barrier", "--rounds", "5"]);
        if ok {
            break;
        }
        assert!(t1.elapsed() < Duration::from_secs(60), "no MPI job across the replugged node:\n{out}");
        std::thread::sleep(Duration::from_secs(2));
    }
}
