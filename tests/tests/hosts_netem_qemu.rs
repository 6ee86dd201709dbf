//! QEMU tier: a cluster across hosts over a slower network. Network
//! namespaces stand in for the hosts (`scripts/netns-hosts.sh`: the hub in
//! `mcy-hub`, two guests on each of `mcy-h1` and `mcy-h2`), and on each
//! host an `mc-netem` relay adds 200 µs ± 100 µs each way between its
//! adapters and the hub (`[hosts.NAME] hub_address`): this machine's
//! kernel has no `sch_netem`, so `tc qdisc ... netem` cannot do it. Every
//! store between the hosts crosses two relays. Two clusters of the same
//! shape: one without imcd for the device-level order test, one with imcd
//! for an MPI job and the cluster lock.

use std::process::{Child, Command};
use std::sync::{Mutex, Once};

use tests::{root, run_ok, Cluster};

const PREFIX: &str = "mcy";
const NODES: usize = 4;

/// The relays, stopped at exit.
static RELAYS: Mutex<Vec<Child>> = Mutex::new(Vec::new());

fn netns(args: &[&str]) -> String {
    run_ok(Command::new(root().join("scripts/netns-hosts.sh")).args(args))
}

extern "C" fn cleanup() {
    for mut c in RELAYS.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
        let _ = c.kill();
        let _ = c.wait();
    }
    let _ = Command::new(root().join("scripts/netns-hosts.sh")).args(["down", PREFIX]).output();
}

/// Makes the namespaces and the relays once; returns the definition
/// (`raw`: without imcd).
fn config(raw: bool) -> String {
    static HOSTS: Once = Once::new();
    let dir = root().join(".run");
    HOSTS.call_once(|| {
        netns(&["down", PREFIX]);
        netns(&["up", PREFIX, "2"]);
        // SAFETY: registers a plain function without arguments to run at exit.
        unsafe { libc::atexit(cleanup) };
        for h in 1..=2 {
            let relay = Command::new("ip")
                .args(["netns", "exec", &format!("{PREFIX}-h{h}")])
                .arg(tests::host_bin("mc-netem"))
                .args(["--listen", "127.0.0.1:7401", "--to", "10.77.0.1:7400", "--delay", "200us", "--jitter", "100us"])
                .args(["--seed", &h.to_string()])
                .spawn()
                .unwrap();
            RELAYS.lock().unwrap().push(relay);
        }
        let base = netns(&["config", PREFIX, "2", "2"]);
        // Each host's adapters dial their relay.
        let mut text = String::new();
        for l in base.lines() {
            text += l;
            text += "\n";
            if l.starts_with("way_in") && l.contains(&format!("\"{PREFIX}-h")) {
                text += "hub_address = \"127.0.0.1:7401\"\n";
            }
        }
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("t-netem.toml"), &text).unwrap();
        std::fs::write(dir.join("t-netem-raw.toml"), text.replace("lan = \"off\"", "lan = \"off\"\nimcd = false"))
            .unwrap();
    });
    let f = dir.join(if raw { "t-netem-raw.toml" } else { "t-netem.toml" });
    assert!(std::fs::read_to_string(&f).unwrap().contains("hub_address"), "{}", f.display());
    f.display().to_string()
}

/// Every adapter dials its host's relay; blocks and flags from guest 0
/// (host 1) arrive at guest 2 (host 2) in program order through both
/// relays (`mctool order-test`, as `order_qemu.rs` runs it on one host),
/// nothing lost on any link.
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn added_delay_and_jitter_keep_order_and_lose_nothing() {
    let cfg = config(true);
    let c = Cluster::up_with("t-netem-raw", NODES, &["--config", &cfg]);
    for n in 0..NODES {
        let pid = c.state()["nodes"][n]["adapter_pid"].as_u64().unwrap();
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        assert!(String::from_utf8_lossy(&cmdline).contains("tcp:127.0.0.1:7401"), "node {n}'s adapter: {cmdline:?}");
    }
    let plan: [(u64, u64); 4] = [(64, 20_000), (1024, 2_000), (4096, 500), (8192, 200)];
    let sizes: Vec<String> = plan.iter().map(|p| p.0.to_string()).collect();
    let rounds: Vec<String> = plan.iter().map(|p| p.1.to_string()).collect();
    let args = format!("--sizes {} --rounds {}", sizes.join(","), rounds.join(","));
    c.background(2, "checker", &format!("mctool order-test --role checker {args} --timeout 600"));
    c.poll_until(2, &["cat", "/tmp/checker.log"], 60, |o| o.contains("checker ready"));
    c.background(0, "writer", &format!("mctool order-test --role writer {args}"));
    let (wrc, wlog) = c.background_result(0, "writer", 900);
    let (crc, clog) = c.background_result(2, "checker", 300);
    tests::assert_order_test(&plan, (&wrc, &wlog), (&crc, &clog));
    // Nothing went missing on any link (the hub counts gaps in the link
    // sequence), and no node left.
    let stats: serde_json::Value = serde_json::from_str(&c.hub(&["stats"])).unwrap();
    let nodes = stats["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), NODES, "{stats}");
    assert!(nodes.iter().all(|n| n["link_gaps"] == 0 && n["dropped"] == 0), "{stats}");
    c.down();
}

/// An MPI job of 8 ranks, 2 per guest, and the cluster lock counter on
/// every guest, over the slower network: exact results, no error counted.
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn mpi_and_the_cluster_lock_over_a_slower_network() {
    let cfg = config(false);
    let c = Cluster::up_with("t-netem", NODES, &["--config", &cfg]);
    for n in 0..NODES {
        c.poll_until(n, &["mctool", "imc-hosts"], 60, |o| o.contains("hosts [0, 1, 2, 3]"));
    }
    for n in 0..NODES {
        c.background(n, "lt", "mctool imc-lock-test --procs 1 --rounds 100 --total 400");
    }
    for n in 0..NODES {
        let (rc, log) = c.background_result(n, "lt", 300);
        assert_eq!(rc, "0", "node {n}:\n{log}");
        assert!(log.contains("counter 400 exact"), "node {n}:\n{log}");
    }
    c.mpicc("ring");
    let (code, out) = c.mpirun(&["-n", "8", "--ppn", "2", "/share/ring"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains(" No Errors") && out.matches("rank ").count() == 8, "{out}");
    let hosts = String::from_utf8_lossy(&c.run(0, &["mctool", "imc-hosts"])).into_owned();
    assert!(hosts.contains("hosts [0, 1, 2, 3] errors 0"), "{hosts}");
    c.down();
}
