//! QEMU tier for imcd and libimc (the TruCluster MEMORY CHANNEL API).
//! Guests boot with imcd running (`[guest] imcd = true`, the default).

use std::process::Command;

use tests::{host_bin, launcher, run_ok, Cluster};

fn up(name: &str, nodes: usize) -> Cluster {
    let c = Cluster::up(name, nodes);
    c.imcd_ready();
    c
}

/// Starts `mctool imc-alloc … --hold S` (tag `tag`) on node `n` and
/// returns its first answer (IMC_SUCCESS or the refusal) once it is there.
fn hold(c: &Cluster, n: usize, tag: &str, cmd: &str) -> String {
    c.background(n, tag, cmd);
    c.poll_until(n, &["cat", &format!("/tmp/{tag}.log")], 30, |o| o.contains("IMC_"))
}

/// The "pages A..B" an imc-alloc, imc-get or imc-put line names. The first
/// pages go to whatever holds regions at boot (mpid's inbox), so tests
/// compare page ranges with each other rather than with fixed numbers.
fn pages(out: &str) -> std::ops::Range<u32> {
    let range = out.split("pages ").nth(1).and_then(|r| r.split([',', ' ', ')']).next());
    let ends = range.and_then(|r| r.split_once("..")).and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)));
    let (a, b) = ends.unwrap_or_else(|| panic!("no page range in:\n{out}"));
    a..b
}

/// Like [`hold`], insisting on success.
fn hold_ok(c: &Cluster, n: usize, tag: &str, cmd: &str) -> String {
    let log = hold(c, n, tag, cmd);
    assert!(log.contains("IMC_SUCCESS"), "node {n}, {cmd}:\n{log}");
    log
}

fn out(c: &Cluster, n: usize, argv: &[&str]) -> String {
    String::from_utf8(c.run(n, argv)).unwrap()
}

/// A region allocated by key is the same region on every guest (the
/// clusterwide directory lives in MEMORY CHANNEL space), and data moves by
/// plain stores and loads in the processes: imcd only sets the mappings up.
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn imc_region_by_key_spans_guests() {
    let c = up("t-imc", 2);
    c.background(1, "get", "mctool imc-get --key 42 --value 7 --timeout 60");
    let waiting = c.poll_until(1, &["cat", "/tmp/get.log"], 20, |o| o.contains("waiting"));
    assert!(waiting.contains("created"), "node 1 creates the region:\n{waiting}");
    let put = out(&c, 0, &["mctool", "imc-put", "--key", "42", "--value", "7"]);
    assert!(put.contains("existing") && pages(&put) == pages(&waiting), "node 0 finds node 1's region:\n{put}");
    let (rc, log) = c.background_result(1, "get", 60);
    assert_eq!(rc, "0", "{log}");
    assert!(log.contains("all 1024 words read 7"), "{log}");
    // Both processes have exited, so the region is gone and its pages are
    // free for the next key.
    let other = out(&c, 0, &["mctool", "imc-put", "--key", "43", "--value", "1"]);
    assert!(other.contains("created") && pages(&other) == pages(&put), "{other}");
}

/// Issue 5: 3 nodes × 2 processes each increment a shared counter (a
/// region in MEMORY CHANNEL space) 1000 times under an `imc_lkacquire`
/// lock, with plain loads and stores; the final value is exact everywhere.
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn spinlock_mutual_exclusion_across_nodes() {
    let c = up("t-imclock", 3);
    for n in 0..3 {
        c.background(n, "lt", "mctool imc-lock-test --procs 2 --rounds 1000 --total 6000");
    }
    for n in 0..3 {
        let (rc, log) = c.background_result(n, "lt", 240);
        assert_eq!(rc, "0", "node {n}:\n{log}");
        assert_eq!(log.matches("counter 6000 exact").count(), 2, "node {n}:\n{log}");
    }
    let hosts = out(&c, 0, &["mctool", "imc-hosts"]);
    assert!(hosts.contains("hosts [0, 1, 2] errors 0 names 0=node0,1=node1,2=node2"), "{hosts}");
}

/// Issue 5, Figure 6 of the paper in C (libimc.a, `<sys/imc.h>`): two
/// copies on each of three nodes; the global counter rises to 6, every copy
/// sees the creator's pattern, and the counter returns to 0.
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn figure6_counter_returns_to_zero() {
    let c = up("t-fig6", 3);
    // Recorded, for the time machine and the dissector below.
    let capture = c.run_dir().join("fig6.pcap");
    let mc = |args: &[&str]| run_ok(Command::new(launcher()).args(["--name", &c.name]).args(args));
    assert!(mc(&["capture", "start", capture.to_str().unwrap()]).contains("capture started"));
    for n in 0..3 {
        for copy in ["a", "b"] {
            c.background(n, &format!("f6{copy}"), "env FIG6_COPIES=6 figure6");
        }
    }
    let mut logs = String::new();
    for n in 0..3 {
        for copy in ["a", "b"] {
            let (rc, log) = c.background_result(n, &format!("f6{copy}"), 240);
            assert_eq!(rc, "0", "node {n} copy {copy}:\n{log}");
            assert!(log.contains("body: saw processes 6 of 6; pattern ok"), "node {n} copy {copy}:\n{log}");
            logs += &log;
        }
    }
    assert_eq!(logs.matches("creator: initialized, processes 1").count(), 1, "{logs}");
    let mut joined: Vec<i32> = values(&logs, "joined: processes ");
    joined.sort();
    assert_eq!(joined, vec![2, 3, 4, 5, 6], "every other copy counted itself in once:\n{logs}");
    let mut left: Vec<i32> = values(&logs, "left: processes ");
    left.sort();
    assert_eq!(left, vec![0, 1, 2, 3, 4, 5], "the counter went back down to 0:\n{logs}");
    mc(&["capture", "stop"]);
    time_machine_replays_figure6(&capture);
}

/// `mc-trace` on the capture of Figure 6's run: the region's page is the
/// one whose words 1..2047 hold the pattern at the end; its word 0, the
/// process counter, was written by all three nodes, went up to 6 and came
/// back to 0, and `state` at each of those writes shows that value. The
/// dissector decodes the same capture without an error and names imcd's
/// directory lock slots (Figure 6 allocates under the directory lock).
fn time_machine_replays_figure6(capture: &std::path::Path) {
    let trace = |args: &[&str]| -> String { run_ok(Command::new(host_bin("mc-trace")).arg(capture).args(args)) };
    let lines = |t: String| -> Vec<serde_json::Value> { t.lines().map(|l| serde_json::from_str(l).unwrap()).collect() };
    let mut pages = std::collections::BTreeSet::new();
    for n in 0..3 {
        for e in lines(trace(&["--json", "timeline", "--node", &n.to_string()])) {
            if let Some(p) = e["page"].as_u64().filter(|&p| p >= imc_proto::layout::DATA_FIRST) {
                pages.insert(p);
            }
        }
    }
    let pattern_ok = |b: &[u8]| (1..2047).all(|i| b[4 * i..4 * i + 4] == ((i - 1) as i32).to_le_bytes());
    let page = pages
        .iter()
        .copied()
        .find(|p| {
            let out = Command::new(host_bin("mc-trace"))
                .arg(capture)
                .args(["state", "--raw", "--page", &p.to_string()])
                .output()
                .unwrap();
            out.status.success() && out.stdout.len() == 8192 && pattern_ok(&out.stdout)
        })
        .unwrap_or_else(|| panic!("no page of {pages:?} holds Figure 6's pattern"));
    let writes = lines(trace(&["--json", "who-wrote", &format!("{page}:0")]));
    let counter: Vec<i32> = writes
        .iter()
        .map(|w| u64::from_str_radix(w["after"].as_str().unwrap().trim_start_matches("0x"), 16).unwrap() as u32 as i32)
        .collect();
    let writers: std::collections::BTreeSet<u64> = writes.iter().map(|w| w["node"].as_u64().unwrap()).collect();
    assert_eq!(writers.len(), 3, "every node wrote the counter: {writes:?}");
    assert_eq!(counter.iter().max(), Some(&6), "the counter reached 6: {counter:?}");
    assert_eq!(counter.last(), Some(&0), "and came back to 0: {counter:?}");
    // state at the write that made it 6 shows 6.
    let six = writes[counter.iter().position(|&v| v == 6).unwrap()]["seq"].as_u64().unwrap();
    let out = Command::new(host_bin("mc-trace"))
        .arg(capture)
        .args(["state", "--raw", "--page", &page.to_string(), "--at", &six.to_string()])
        .output()
        .unwrap();
    assert_eq!(out.stdout[..4], 6i32.to_le_bytes());
    // The dissector: no error, imcd's directory lock named.
    let f = capture.to_str().unwrap();
    let script = tests::root().join("hub/wireshark/mc.lua");
    let tshark = |filter: &str| -> usize {
        run_ok(
            Command::new("tshark")
                .arg("-X")
                .arg(format!("lua_script:{}", script.display()))
                .args(["-r", f, "-Y", filter]),
        )
        .lines()
        .count()
    };
    assert_eq!(tshark("_ws.malformed || _ws.lua.error || mc.bad_crc"), 0);
    assert!(tshark("mc.imcd contains \"directory lock\"") > 0, "directory lock slots named");
    assert!(tshark(&format!("mc.page == {page}")) >= writes.len());
}

fn values(log: &str, prefix: &str) -> Vec<i32> {
    log.lines().filter_map(|l| l.strip_prefix(prefix)?.trim().parse().ok()).collect()
}

/// Issue 5: IMC_COHERENT. A process on another node that attaches for
/// receive after the writes sees them (its imcd has received the region
/// since its creation); without IMC_COHERENT it does not.
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn coherent_region_late_attach_sees_history() {
    let c = up("t-coherent", 2);
    hold_ok(&c, 0, "hc", "mctool imc-alloc --key 60 --mode 666 --coherent --hold 300");
    hold_ok(&c, 0, "hn", "mctool imc-alloc --key 61 --mode 666 --hold 300");
    out(&c, 0, &["mctool", "imc-put", "--key", "60", "--value", "9"]);
    out(&c, 0, &["mctool", "imc-put", "--key", "61", "--value", "9"]);
    // Node 1 attaches only now.
    let late = out(&c, 1, &["mctool", "imc-get", "--key", "60", "--value", "9", "--timeout", "10"]);
    assert!(late.contains("existing") && late.contains("all 1024 words read 9"), "{late}");
    let plain = c.exec(1, &["mctool", "imc-get", "--key", "61", "--value", "9", "--timeout", "3"]);
    assert!(!plain.status.success(), "a non-coherent region has no history on a late node");
}

/// Issue 5: `imc_ckerrcnt` sees an error injected at the hub (a corrupted
/// packet to node 1) between `imc_rderrcnt` and the check, on node 1 and,
/// through the ACK page and the published counts, on node 0 as well: the
/// error count is clusterwide.
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn ckerrcnt_detects_injected_error() {
    let c = up("t-ckerr", 2);
    for n in 0..2 {
        c.background(n, "ck", "mctool imc-check-errors --seconds 8");
    }
    for n in 0..2 {
        c.poll_until(n, &["cat", "/tmp/ck.log"], 20, |o| o.contains("waiting"));
    }
    c.hub(&["corrupt", "1", "1"]);
    // Any traffic will do: node 0 allocates and writes a region.
    out(&c, 0, &["mctool", "imc-put", "--key", "5", "--value", "1"]);
    for n in 0..2 {
        let (rc, log) = c.background_result(n, "ck", 30);
        assert_eq!(rc, "0", "node {n}: {log}");
        assert!(log.contains("error count 0") && log.contains("new errors (count now 1)"), "node {n}: {log}");
    }
    // And imc_rderrcnt catches up everywhere.
    for n in 0..2 {
        c.poll_until(n, &["mctool", "imc-hosts"], 20, |o| o.contains("errors 1"));
    }
}

/// Issue 5: another uid cannot get at a region its mode does not grant
/// (System V rules: owner, group, other; uid 0 may).
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn permission_denied_for_other_uid() {
    let c = up("t-perm", 1);
    let made = hold(&c, 0, "h77", "mctool imc-alloc --key 77 --mode 600 --hold 300");
    assert!(made.contains("IMC_SUCCESS") && made.contains("created"), "{made}");
    let denied = c.exec(0, &["mctool", "--uid", "1000", "imc-alloc", "--key", "77"]);
    assert!(!denied.status.success());
    assert!(String::from_utf8_lossy(&denied.stderr).contains("IMC_PERMISSION"), "{denied:?}");
    // Mode 644: others may read (attach for receive), so the region is found.
    hold(&c, 0, "h78", "mctool imc-alloc --key 78 --mode 644 --hold 300");
    let ok = out(&c, 0, &["mctool", "--uid", "1000", "imc-alloc", "--key", "78"]);
    assert!(ok.contains("IMC_SUCCESS") && ok.contains("existing"), "{ok}");
    // The owner itself is fine with 600.
    let own = hold(&c, 0, "h79", "mctool --uid 1000 imc-alloc --key 79 --mode 600 --hold 300");
    assert!(own.contains("created"), "{own}");
    let again = out(&c, 0, &["mctool", "--uid", "1000", "imc-alloc", "--key", "79"]);
    assert!(again.contains("existing"), "{again}");
}

/// A region lives while some process anywhere holds it (the host bits of
/// its directory entry): when the last holder lets go, every node stops
/// receiving it (its imcd drops the buffer and the DMA map), and its pages
/// go to the next region.
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn imc_dealloc_frees_pages_on_every_node() {
    let c = up("t-imcfree", 2);
    let held = hold_ok(&c, 0, "h0", "mctool imc-alloc --key 50 --mode 666 --hold 300");
    c.background(1, "get", "mctool imc-get --key 50 --value 5 --timeout 60");
    c.poll_until(1, &["cat", "/tmp/get.log"], 20, |o| o.contains("waiting"));
    out(&c, 0, &["mctool", "imc-put", "--key", "50", "--value", "5"]);
    let (rc, log) = c.background_result(1, "get", 60);
    assert_eq!(rc, "0", "{log}");
    // Node 1's process is gone; node 0 still holds the region.
    let again = out(&c, 1, &["mctool", "imc-alloc", "--key", "50", "--mode", "666"]);
    assert!(again.contains("existing"), "{again}");
    // Node 0's holder lets go (imc_asdealloc): now nobody holds it.
    c.run(0, &["sh", "-c", "kill $(pidof mctool)"]);
    let (rc, log) = c.background_result(0, "h0", 30);
    let id = held.split("region ").nth(1).and_then(|r| r.split_whitespace().next()).unwrap_or("?").to_string();
    assert!(rc == "0" && log.contains(&format!("let go of region {id}")), "{rc}: {log}");
    let shm = format!("imc-region-{id}\n");
    c.poll_until(0, &["ls", "-1", "/dev/shm"], 20, |o| !format!("{o}\n").contains(&shm));
    // The pages are free for the next key.
    let next = out(&c, 1, &["mctool", "imc-alloc", "--key", "51", "--mode", "666"]);
    assert!(next.contains("created") && pages(&next) == pages(&held), "{held}\n{next}");
}

/// Issue 5: `imc_kill` sends a UNIX signal to a process on another node
/// through the command relay (mailboxes in MEMORY CHANNEL space, woken by
/// the notification interrupt); the remote side checks the sender's uid.
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn imc_kill_signals_remote_process() {
    let c = up("t-kill-relay", 2);
    c.background(1, "ws", "mctool --uid 1000 wait-signal --timeout 120");
    let w = c.poll_until(1, &["cat", "/tmp/ws.log"], 20, |o| o.contains("waiting"));
    let pid = w.split_whitespace().nth(1).unwrap().to_string();
    let stranger = c.exec(0, &["mctool", "--uid", "1001", "imc-kill", "--host", "node1", "--pid", &pid]);
    assert!(!stranger.status.success(), "uid 1001 may not signal uid 1000's process");
    assert!(String::from_utf8_lossy(&stranger.stderr).contains("IMC_ERRNO"), "{stranger:?}");
    let nohost = c.exec(0, &["mctool", "imc-kill", "--host", "node7", "--pid", &pid]);
    assert!(String::from_utf8_lossy(&nohost.stderr).contains("IMC_NOHOST"), "{nohost:?}");
    let ok = out(&c, 0, &["mctool", "--uid", "1000", "imc-kill", "--host", "node1", "--pid", &pid, "--sig", "12"]);
    assert!(ok.contains("IMC_SUCCESS"), "{ok}");
    let (rc, log) = c.background_result(1, "ws", 30);
    assert_eq!(rc, "0", "{log}");
    assert!(log.contains("got signal 12"), "{log}");
}

/// What the latest imcd started by `/etc/keep-imcd` logged (its log holds
/// every start, each after a "keep-imcd: start N" line); "" before the
/// second start.
fn latest_imcd(log: &str) -> &str {
    match log.rsplit_once("keep-imcd: start ") {
        Some((_, last)) if !last.starts_with("1 ") => last,
        _ => "",
    }
}

/// Issue 5: a node fails in the middle of a directory update, holding the
/// directory lock. The lowest surviving imcd repairs the directory (the
/// two-copy toggle), clears the dead node's lock slot and its host bits,
/// frees what only it held, and the cluster goes on.
///
/// Node 2's imcd is restarted first (with the failure-drill hook), which
/// also exercises late join: a running node sends it the directory.
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn node_failure_repairs_descriptors() {
    let c = up("t-fail", 3);
    hold_ok(&c, 0, "h70", "mctool imc-alloc --key 70 --mode 666 --hold 600");
    // mpid (the MPI launch daemon) holds mappings from the old imcd, which
    // keep the adapter busy: it lets them go when imcd goes away. imcd's
    // keeper (/etc/keep-imcd) starts it again, with the failure-drill hook.
    c.run(2, &["sh", "-c", "echo --test-hooks > /run/imcd.args; kill $(pidof imcd)"]);
    c.poll_until(2, &["cat", "/var/log/mpid.log"], 30, |o| o.contains("MEMORY CHANNEL released"));
    let log2 = c.poll_until(2, &["cat", "/var/log/imcd.log"], 30, |o| latest_imcd(o).contains("listening"));
    assert!(latest_imcd(&log2).contains("sent the directory by a running node"), "{log2}");
    // ...and listens again once the new imcd answers.
    c.poll_until(2, &["cat", "/var/log/mpid.log"], 60, |o| o.matches("listening on handle").count() == 2);
    // The newcomer sees node 0's region, and holds two of its own.
    let h = hold(&c, 2, "h70b", "mctool imc-alloc --key 70 --mode 666 --hold 600");
    assert!(h.contains("existing"), "{h}");
    hold_ok(&c, 2, "h71", "mctool imc-alloc --key 71 --mode 666 --hold 600");
    // Node 2 stops dead mid-update of entry 0 with the lock held...
    c.background(2, "drill", "mctool imc-drill --id 0");
    c.poll_until(2, &["cat", "/var/log/imcd.log"], 30, |o| latest_imcd(o).contains("abandoned an update"));
    // ...and leaves the cluster.
    c.hub(&["link-down", "2"]);
    let log0 = c.poll_until(0, &["cat", "/var/log/imcd.log"], 30, |o| o.contains("node 2 failed"));
    assert!(log0.contains("directory repaired"), "{log0}");
    // The lock is free again, region 70 is still there, 71 went with node 2.
    let r70 = out(&c, 1, &["mctool", "imc-alloc", "--key", "70", "--mode", "666"]);
    assert!(r70.contains("existing"), "{r70}");
    let r71 = out(&c, 1, &["mctool", "imc-alloc", "--key", "71", "--mode", "666"]);
    assert!(r71.contains("created"), "{r71}");
    let hosts = out(&c, 1, &["mctool", "imc-hosts"]);
    assert!(hosts.contains("hosts [0, 1]"), "{hosts}");
}

/// Issue 12, finding 1: a 0.5 s flap of node 1's link is ridden out (it is
/// shorter than imcd's flap grace, docs/faults.md "Link flaps"). Both host
/// tables still list both nodes, node 1's region keeps its pages (a new
/// allocation on node 0 does not get them) and its holder still has it.
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn short_link_flap_keeps_hosts_and_regions() {
    let c = up("t-flap", 2);
    c.poll_until(0, &["mctool", "imc-hosts"], 30, |o| o.contains("hosts [0, 1]"));
    let held = hold_ok(&c, 1, "h55", "mctool imc-alloc --key 55 --size 16384 --hold 120");
    assert!(held.contains("created"), "{held}");
    let own = pages(&held);
    c.hub(&["link-down", "1"]);
    std::thread::sleep(std::time::Duration::from_millis(500));
    c.hub(&["link-up", "1"]);
    // Past the grace and the repair delay (2 s + 1 s): nothing was repaired.
    std::thread::sleep(std::time::Duration::from_secs(5));
    for n in 0..2 {
        let hosts = c.poll_until(n, &["mctool", "imc-hosts"], 30, |o| o.contains("hosts [0, 1]"));
        assert!(hosts.contains("names 0=node0,1=node1"), "node {n}: {hosts}");
    }
    let other = out(&c, 0, &["mctool", "imc-alloc", "--key", "66", "--size", "16384"]);
    let theirs = pages(&other);
    let overlap = theirs.start < own.end && own.start < theirs.end;
    assert!(other.contains("IMC_SUCCESS") && !overlap, "node 1's pages {own:?} given away: {other}");
    let same = out(&c, 0, &["mctool", "imc-alloc", "--key", "55", "--size", "16384"]);
    assert!(same.contains("existing") && pages(&same) == own, "key 55 lost ({own:?}): {same}");
    let log = c.background_log(1, "h55");
    assert!(!log.contains("let go"), "node 1's holder let go early: {log}");
    // The outage is counted: node 1's adapter saw its link go down.
    let hosts = out(&c, 1, &["mctool", "imc-hosts"]);
    assert!(!hosts.contains("errors 0 "), "the flap counts as an error: {hosts}");
}
