//! `mc-soak`: the soak test (`scripts/soak.sh`). Brings up a cluster of
//! real guests (per-guest adapters, so the hub can restart under them),
//! runs `mctool soak` on every node, and injects faults from a fixed seed
//! while the workload runs: link flaps, links down past imcd's flap grace,
//! corrupt bursts, a guest killed and rebooted (it joins late, as a new
//! incarnation of its workload), and hub restarts. Every fault must be
//! detected by the nodes it hits. At the end it prints one table and
//! fails unless the losses outside announced outages, the reorderings,
//! the lock-counter error, the UMP failures and the hangs are all 0.
//!
//! With `--hosts H` the cluster spans H "hosts" (network namespaces made
//! with `scripts/netns-hosts.sh`, prefix `soak`; the hub in `soak-hub`, the
//! nodes spread evenly), its adapters join over TCP, and partitions are
//! among the faults: a host's link cut for 4 to 8 s (longer than the live
//! link's dead time, so every node there sees an outage).
//!
//! The guests write their status to the cluster's shared folder
//! (`.run/<name>/share/soak/`, `/share/soak/` inside), which this driver
//! reads directly; `result.json` there keeps the final figures.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use serde_json::{json, Value};
use testkit::soak::{unpack, Tally};

#[derive(Parser)]
#[command(about = "Soak test: a cluster under a workload and seeded faults; one table at the end")]
struct Args {
    /// Nodes (2..=16).
    #[arg(long, default_value_t = 4)]
    nodes: usize,
    /// How long the workload runs under faults.
    #[arg(long, default_value_t = 10.0)]
    minutes: f64,
    /// Seed of the fault injector (the same seed, the same faults).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Mean seconds between faults (each interval varies ±50%).
    #[arg(long, default_value_t = 20)]
    fault_every: u64,
    /// Broadcast records each node writes per second.
    #[arg(long, default_value_t = 100)]
    rate: u64,
    /// Cluster name (its run folder is .run/NAME).
    #[arg(long, default_value = "soak")]
    name: String,
    /// Leave the cluster up at the end.
    #[arg(long)]
    keep: bool,
    /// Spread the nodes over this many hosts (network namespaces; root);
    /// 0: one machine.
    #[arg(long, default_value_t = 0)]
    hosts: usize,
}

/// The namespaces' prefix of `--hosts`.
const NETNS: &str = "soak";

/// One fault the injector can make.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    /// Link down for 0.2–1.5 s (ridden out).
    Flap,
    /// Link down for 4–6 s (past the flap grace: repaired out, rejoins).
    Outage,
    /// The next 1–5 frames to a node corrupted.
    Corrupt,
    /// A guest killed and rebooted.
    Restart,
    /// The hub restarted.
    HubRestart,
    /// A host's link cut for 4–8 s (`--hosts` only).
    Partition,
}

const KINDS: [Kind; 5] = [Kind::Flap, Kind::Outage, Kind::Corrupt, Kind::Restart, Kind::HubRestart];

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Flap => "link flap",
            Kind::Outage => "link down past the grace",
            Kind::Corrupt => "corrupt burst",
            Kind::Restart => "guest killed and rebooted",
            Kind::HubRestart => "hub restart",
            Kind::Partition => "host partitioned",
        }
    }
}

/// splitmix64: the injector's generator (fixed by the seed).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
}

/// The faults of a run: the first five (six across hosts) are every kind
/// once (in a seeded order), then kinds by weight; across hosts every
/// third fault after those is a partition.
fn plan(rng: &mut Rng, count: usize, hosts: bool) -> Vec<Kind> {
    let mut kinds = KINDS.to_vec();
    if hosts {
        kinds.push(Kind::Partition);
    }
    for i in (1..kinds.len()).rev() {
        kinds.swap(i, rng.below(i as u64 + 1) as usize);
    }
    while kinds.len() < count {
        if hosts && kinds.len() % 3 == 0 {
            kinds.push(Kind::Partition);
            continue;
        }
        kinds.push(match rng.below(100) {
            0..=39 => Kind::Flap,
            40..=54 => Kind::Outage,
            55..=79 => Kind::Corrupt,
            80..=89 => Kind::Restart,
            _ => Kind::HubRestart,
        });
    }
    kinds.truncate(count);
    kinds
}

struct Soak {
    name: String,
    nodes: usize,
    rate: u64,
    /// The shared folder's soak directory on the host.
    dir: PathBuf,
    /// Current incarnation of each node's workload.
    inc: Vec<u16>,
    /// Best tally seen of every (node, incarnation).
    tallies: BTreeMap<(usize, u16), Tally>,
    /// Stalls reported: (node, incarnation, worker).
    stalls: std::collections::BTreeSet<(usize, u16, String)>,
    /// Hangs the driver saw itself.
    hangs: Vec<String>,
    keep: bool,
    /// Hosts the nodes are spread over (0: one machine).
    hosts: usize,
}

impl Drop for Soak {
    fn drop(&mut self) {
        if !self.keep {
            let _ = self.mc(&["down"]);
            if self.hosts > 0 {
                let _ = netns(&["down", NETNS]);
            }
        }
    }
}

fn mc_cluster() -> PathBuf {
    ::tests::launcher()
}

/// `scripts/netns-hosts.sh ARGS`; its stdout.
fn netns(args: &[&str]) -> Result<String> {
    let out = Command::new(::tests::root().join("scripts/netns-hosts.sh")).args(args).output()?;
    if !out.status.success() {
        bail!("netns-hosts.sh {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl Soak {
    /// `mc-cluster --name NAME ARGS`; stdout, or an error with both streams.
    fn mc(&self, args: &[&str]) -> Result<String> {
        let out = Command::new(mc_cluster()).args(["--name", &self.name]).args(args).output()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            bail!("mc-cluster {}: {}{}", args.join(" "), text, String::from_utf8_lossy(&out.stderr));
        }
        Ok(text)
    }

    fn exec(&self, node: usize, cmd: &str, timeout: u64) -> Result<String> {
        self.mc(&["exec", &node.to_string(), "-n", "--timeout", &timeout.to_string(), "--", "sh", "-c", cmd])
    }

    fn status_path(&self, node: usize, inc: u16) -> PathBuf {
        self.dir.join(format!("node{node}-{inc}.json"))
    }

    fn status(&self, node: usize) -> Option<Value> {
        read_status(&self.status_path(node, self.inc[node]))
    }

    /// Waits until imcd serves on `node` (a fresh boot's log says "listening").
    fn imcd_ready(&self, node: usize) -> Result<()> {
        let t0 = Instant::now();
        loop {
            if self.exec(node, "cat /var/log/imcd.log", 30).is_ok_and(|o| o.contains("listening")) {
                return Ok(());
            }
            if t0.elapsed() > Duration::from_secs(120) {
                bail!("node {node}: imcd did not start within 120 s");
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    fn start_worker(&self, node: usize) -> Result<()> {
        let inc = self.inc[node];
        let cmd = format!(
            "(mctool soak --nodes {} --incarnation {inc} --rate {} --status /share/soak/node{node}-{inc}.json \
             --stop /share/soak/stop > /share/soak/node{node}-{inc}.log 2>&1 &)",
            self.nodes, self.rate
        );
        self.exec(node, &cmd, 30)?;
        // Running once its first status is there.
        let t0 = Instant::now();
        while self.status(node).is_none() {
            if t0.elapsed() > Duration::from_secs(60) {
                let log = std::fs::read_to_string(self.dir.join(format!("node{node}-{inc}.log"))).unwrap_or_default();
                bail!("node {node}: mctool soak wrote no status within 60 s: {log}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(())
    }

    /// The latest status of every incarnation so far.
    fn every_status(&self) -> Vec<Value> {
        (0..self.nodes)
            .flat_map(|n| (1..=self.inc[n]).filter_map(move |i| read_status(&self.status_path(n, i))))
            .collect()
    }

    /// Reads every node's status; keeps the best tallies and the stalls.
    fn collect(&mut self) -> Vec<Option<Value>> {
        let all: Vec<Option<Value>> = (0..self.nodes).map(|n| self.status(n)).collect();
        for (n, s) in all.iter().enumerate() {
            let Some(s) = s else { continue };
            if let Some(t) = s["lock"]["tally"].as_object() {
                let t: Tally = serde_json::from_value(Value::Object(t.clone())).expect("a tally");
                self.keep_tally(n, t);
            }
            for (m, w) in s["lock"]["tallies"].as_array().into_iter().flatten().enumerate() {
                let t = Tally::from_word(w.as_u64().unwrap_or(0));
                if t.inc != 0 {
                    self.keep_tally(m / testkit::soak::TALLY_SLOTS, t);
                }
            }
            for st in s["stalls"].as_array().into_iter().flatten() {
                self.stalls.insert((n, self.inc[n], st.as_str().unwrap_or("?").to_string()));
            }
        }
        all
    }

    fn keep_tally(&mut self, node: usize, t: Tally) {
        let e = self.tallies.entry((node, t.inc)).or_insert(t);
        if (t.confirmed, t.doubt, t.pending) > (e.confirmed, e.doubt, e.pending) {
            *e = t;
        }
    }

    /// Polls until `pred` holds for the statuses (or `secs` pass).
    fn until(&mut self, secs: u64, pred: impl Fn(&[Option<Value>]) -> bool) -> bool {
        let t0 = Instant::now();
        loop {
            let all = self.collect();
            if pred(&all) {
                return true;
            }
            if t0.elapsed() > Duration::from_secs(secs) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Waits until every node's workload runs with every node a member.
    fn settle(&mut self) -> bool {
        let nodes = self.nodes;
        let paths: Vec<PathBuf> = (0..nodes).map(|n| self.status_path(n, self.inc[n])).collect();
        self.until(120, |all| {
            all.iter().zip(&paths).all(|(s, p)| {
                s.as_ref().is_some_and(|s| {
                    s["members"].as_array().is_some_and(|m| m.len() == nodes) && fresh(p, Duration::from_secs(5))
                })
            })
        })
    }

    /// Makes one fault; returns what was done and whether the nodes it hit
    /// noticed within 30 s.
    fn inject(&mut self, kind: Kind, rng: &mut Rng) -> Result<(String, bool)> {
        let before = self.collect();
        let field = |all: &[Option<Value>], n: usize, f: &str| all[n].as_ref().and_then(|s| s[f].as_u64()).unwrap_or(0);
        let node = rng.below(self.nodes as u64) as usize;
        match kind {
            Kind::Flap | Kind::Outage => {
                let ms = if kind == Kind::Flap { rng.range(200, 1500) } else { rng.range(4000, 6000) };
                let was = field(&before, node, "own_outages");
                self.mc(&["hub", "--", "link-down", &node.to_string()])?;
                std::thread::sleep(Duration::from_millis(ms));
                self.mc(&["hub", "--", "link-up", &node.to_string()])?;
                let seen = self.until(30, |all| field(all, node, "own_outages") > was);
                Ok((format!("node {node} link down {ms} ms"), seen))
            }
            Kind::Corrupt => {
                let count = rng.range(1, 5);
                let was = field(&before, node, "hw_errors");
                self.mc(&["hub", "--", "corrupt", &node.to_string(), &count.to_string()])?;
                let seen = self.until(30, |all| field(all, node, "hw_errors") > was);
                Ok((format!("node {node}: next {count} frames corrupted"), seen))
            }
            Kind::Restart => {
                let others: Vec<(usize, u64)> = (0..self.nodes)
                    .filter(|&n| n != node)
                    .map(|n| (n, before[n].as_ref().map_or(0, |s| s["absences"][node].as_u64().unwrap_or(0))))
                    .collect();
                self.mc(&["restart", &node.to_string()])?;
                self.imcd_ready(node)?;
                self.inc[node] += 1;
                self.start_worker(node)?;
                // Every other node saw it leave, or (with per-guest adapters
                // the new adapter may join the hub within milliseconds, too
                // fast for a 10 ms poll of MEMBERS) follows its new
                // incarnation: it joined late.
                let inc = self.inc[node];
                let seen = self.until(60, |all| {
                    others.iter().all(|&(n, was)| {
                        all[n].as_ref().is_some_and(|s| {
                            s["absences"][node].as_u64().unwrap_or(0) > was
                                || unpack(s["bcast"]["seen"][node].as_u64().unwrap_or(0)).0 == inc
                        })
                    })
                });
                Ok((format!("node {node} killed and rebooted (incarnation {inc})"), seen))
            }
            Kind::Partition => {
                let host = rng.range(1, self.hosts as u64) as usize;
                let per = self.nodes / self.hosts;
                let there: Vec<usize> = ((host - 1) * per..host * per).collect();
                let was: Vec<u64> = there.iter().map(|&n| field(&before, n, "own_outages")).collect();
                let ms = rng.range(4000, 8000);
                netns(&["cut", NETNS, &host.to_string()])?;
                std::thread::sleep(Duration::from_millis(ms));
                netns(&["heal", NETNS, &host.to_string()])?;
                let seen =
                    self.until(30, |all| there.iter().zip(&was).all(|(&n, &w)| field(all, n, "own_outages") > w));
                Ok((format!("host {host} (nodes {there:?}) cut off {ms} ms"), seen))
            }
            Kind::HubRestart => {
                let was: Vec<u64> = (0..self.nodes).map(|n| field(&before, n, "own_outages")).collect();
                self.mc(&["hub", "restart"])?;
                let seen = self.until(30, |all| (0..was.len()).all(|n| field(all, n, "own_outages") > was[n]));
                Ok(("hub restarted".into(), seen))
            }
        }
    }
}

fn read_status(p: &Path) -> Option<Value> {
    serde_json::from_slice(&std::fs::read(p).ok()?).ok()
}

/// Whether `p` was written within `age`.
fn fresh(p: &Path, age: Duration) -> bool {
    std::fs::metadata(p).and_then(|m| m.modified()).is_ok_and(|t| t.elapsed().is_ok_and(|e| e < age))
}

fn sum(all: &[Value], f: impl Fn(&Value) -> u64) -> u64 {
    all.iter().map(f).sum()
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("mc-soak: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<bool> {
    let a = Args::parse();
    if !(2..=16).contains(&a.nodes) {
        bail!("--nodes must be 2..=16");
    }
    if a.hosts == 1 || (a.hosts > 0 && a.nodes % a.hosts != 0) {
        bail!(
            "--hosts must be 0 (one machine) or at least 2, and divide --nodes ({} nodes, {} hosts)",
            a.nodes,
            a.hosts
        );
    }
    if a.minutes <= 0.0 || a.fault_every == 0 || a.rate == 0 {
        bail!("--minutes, --fault-every and --rate must be positive");
    }
    let run_dir = std::env::var_os("MC_RUN_DIR").map(PathBuf::from).unwrap_or_else(|| ::tests::root().join(".run"));
    let share = run_dir.join(&a.name).join("share");
    let dir = share.join("soak");
    let t_all = Instant::now();
    println!(
        "soak: {} nodes, {} min, seed {}, a fault every ~{} s, {} records/s per node",
        a.nodes, a.minutes, a.seed, a.fault_every, a.rate
    );
    let mut s = Soak {
        name: a.name.clone(),
        nodes: a.nodes,
        rate: a.rate,
        dir: dir.clone(),
        inc: vec![1; a.nodes],
        tallies: BTreeMap::new(),
        stalls: Default::default(),
        hangs: Vec::new(),
        keep: a.keep,
        hosts: a.hosts,
    };
    let _ = s.mc(&["down"]);
    let share_s = share.to_str().context("run folder path")?.to_string();
    let mut up = vec!["up".to_string(), "--nodes".into(), a.nodes.to_string(), "--adapters".into(), "per-guest".into()];
    up.extend(["--share".into(), share_s]);
    if a.hosts > 0 {
        netns(&["down", NETNS])?;
        netns(&["up", NETNS, &a.hosts.to_string()])?;
        let cfg = run_dir.join(format!("{}-hosts.toml", a.name));
        std::fs::create_dir_all(&run_dir)?;
        std::fs::write(&cfg, netns(&["config", NETNS, &a.hosts.to_string(), &(a.nodes / a.hosts).to_string()])?)?;
        up.extend(["--config".into(), cfg.display().to_string()]);
        println!("soak: across {} hosts ({NETNS}-h1..), the hub in {NETNS}-hub", a.hosts);
    }
    let up: Vec<&str> = up.iter().map(String::as_str).collect();
    s.mc(&up)?;
    println!("[{:>5.0} s] cluster up", t_all.elapsed().as_secs_f64());
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    for n in 0..a.nodes {
        s.imcd_ready(n)?;
    }
    for n in 0..a.nodes {
        s.start_worker(n)?;
    }
    if !s.settle() {
        bail!("the workload did not start on every node with every node a member");
    }
    println!("[{:>5.0} s] workload running on {} nodes", t_all.elapsed().as_secs_f64(), a.nodes);

    let mut rng = Rng(a.seed);
    let run_for = Duration::from_secs_f64(a.minutes * 60.0);
    let expected = ((run_for.as_secs() / a.fault_every) as usize).max(1);
    let faults = plan(&mut rng, expected + 5, a.hosts > 0);
    let mut injected: BTreeMap<Kind, (u64, u64)> = BTreeMap::new();
    let mut log = Vec::new();
    let t0 = Instant::now();
    let mut next_fault = t0 + Duration::from_secs(a.fault_every.min(20));
    let mut next_progress = t0;
    let mut fi = 0;
    // The workload runs on for at least this long after the last fault
    // settled, so readers that were cut off catch up before the count.
    const CATCH_UP: Duration = Duration::from_secs(20);
    let mut last_fault = t0;
    while t0.elapsed() < run_for || last_fault.elapsed() < CATCH_UP {
        if Instant::now() >= next_progress {
            s.collect();
            let all = s.every_status();
            println!(
                "[{:>5.0} s] faults {} ({} detected) · checked: writes {} · lost in outages {} · lost otherwise {} · \
                 reorders {} · lock rounds {} · pings {}",
                t_all.elapsed().as_secs_f64(),
                injected.values().map(|v| v.0).sum::<u64>(),
                injected.values().map(|v| v.1).sum::<u64>(),
                sum(&all, |v| u(&v["bcast"]["checked"])),
                sum(&all, |v| u(&v["bcast"]["lost_announced"])),
                sum(&all, |v| u(&v["bcast"]["lost_unannounced"])),
                sum(&all, |v| u(&v["bcast"]["reorders"])),
                sum(&all, |v| u(&v["lock"]["rounds"])),
                sum(&all, |v| u(&v["ump"]["pings"])),
            );
            next_progress = Instant::now() + Duration::from_secs(30);
        }
        if Instant::now() >= next_fault && fi < faults.len() && t0.elapsed() < run_for {
            let kind = faults[fi];
            fi += 1;
            let (what, seen) = s.inject(kind, &mut rng)?;
            let e = injected.entry(kind).or_default();
            e.0 += 1;
            e.1 += seen as u64;
            println!(
                "[{:>5.0} s] fault {fi}: {}: {what}: {}",
                t_all.elapsed().as_secs_f64(),
                kind.name(),
                if seen { "detected" } else { "NOT DETECTED" }
            );
            log.push(json!({"kind": kind.name(), "what": what, "detected": seen}));
            if !s.settle() {
                s.hangs.push(format!("the cluster did not settle within 120 s after fault {fi} ({what})"));
                println!("[{:>5.0} s] the cluster did not settle after fault {fi}", t_all.elapsed().as_secs_f64());
            }
            last_fault = Instant::now();
            let jitter = a.fault_every / 2;
            next_fault =
                Instant::now() + Duration::from_secs(rng.range(a.fault_every - jitter, a.fault_every + jitter));
        }
        std::thread::sleep(Duration::from_millis(500));
    }

    println!("[{:>5.0} s] stopping the workload", t_all.elapsed().as_secs_f64());
    std::fs::write(dir.join("stop"), b"")?;
    let paths: Vec<PathBuf> = (0..a.nodes).map(|n| s.status_path(n, s.inc[n])).collect();
    if !s.until(150, |all| all.iter().all(|v| v.as_ref().is_some_and(|v| v["done"] == true))) {
        for (n, p) in paths.iter().enumerate() {
            if !read_status(p).is_some_and(|v| v["done"] == true) {
                s.hangs.push(format!("node {n}: the workload did not finish within 150 s of the stop"));
            }
        }
    }
    s.collect();
    // imcd's log of every node's current incarnation, next to the figures.
    for n in 0..a.nodes {
        if let Err(e) = s.exec(n, &format!("cp /var/log/imcd.log /share/soak/node{n}-imcd.log"), 30) {
            println!("node {n}: imcd's log not kept: {e:#}");
        }
    }

    // Every incarnation's last status: the current ones are final, the
    // killed ones stopped where they were.
    let mut finals: Vec<(usize, u16, Value)> = Vec::new();
    for n in 0..a.nodes {
        for inc in 1..=s.inc[n] {
            if let Some(v) = read_status(&s.status_path(n, inc)) {
                finals.push((n, inc, v));
            }
        }
    }
    let all: Vec<Value> = finals.iter().map(|f| f.2.clone()).collect();
    let current: Vec<&Value> = finals.iter().filter(|f| f.1 == s.inc[f.0]).map(|f| &f.2).collect();

    // Completeness at the end: every reader read every writer's last record.
    let mut lost_at_end = 0u64;
    let mut notes = Vec::new();
    for r in &current {
        let rn = u(&r["node"]) as usize;
        for w in &current {
            let wn = u(&w["node"]) as usize;
            if wn == rn {
                continue;
            }
            let (hi, hs) = unpack(u(&w["bcast"]["head"]));
            let (si, ss) = unpack(u(&r["bcast"]["seen"][wn]));
            if si == hi && ss < hs {
                lost_at_end += hs - ss;
                notes.push(format!("node {rn} read node {wn} up to {ss} of {hs}"));
            } else if si != hi && hs > 0 {
                notes.push(format!("node {rn} never followed node {wn}'s incarnation {hi}"));
                lost_at_end += 1;
            }
        }
    }

    // The lock counter against every incarnation's tally.
    let confirmed: u64 = s.tallies.values().map(|t| t.confirmed).sum();
    let live: std::collections::BTreeSet<(usize, u16)> = (0..a.nodes).map(|n| (n, s.inc[n])).collect();
    let doubt: u64 = s.tallies.iter().map(|(k, t)| t.doubt + u64::from(t.pending && !live.contains(k))).sum();
    let counters: Vec<u64> = current.iter().map(|v| u(&v["lock"]["counter"])).collect();
    let counter = counters.iter().copied().max().unwrap_or(0);
    let regressions = sum(&all, |v| u(&v["lock"]["regressions"]));
    let lock_error =
        if counter < confirmed { confirmed - counter } else { counter.saturating_sub(confirmed + doubt) } + regressions;

    let hangs = s.stalls.len() as u64 + s.hangs.len() as u64;
    let lost_unannounced = sum(&all, |v| u(&v["bcast"]["lost_unannounced"])) + lost_at_end;
    let reorders = sum(&all, |v| u(&v["bcast"]["reorders"]));
    let corrupt = sum(&all, |v| u(&v["bcast"]["corrupt"]) + u(&v["ump"]["corrupt"]));
    let ump_unannounced = sum(&all, |v| u(&v["ump"]["interrupted_unannounced"]));
    let n_injected: u64 = injected.values().map(|v| v.0).sum();
    let n_detected: u64 = injected.values().map(|v| v.1).sum();
    let checked = sum(&all, |v| u(&v["bcast"]["checked"]));
    let rounds = sum(&all, |v| u(&v["lock"]["rounds"]));
    let pings = sum(&all, |v| u(&v["ump"]["pings"]));
    let pairs = a.nodes / 2;

    let rows: Vec<(String, String, &str)> = vec![
        ("faults injected".into(), n_injected.to_string(), ""),
        ("faults detected".into(), n_detected.to_string(), "= injected"),
        ("writes made".into(), sum(&all, |v| u(&v["bcast"]["written"])).to_string(), ""),
        ("writes checked (record × reader)".into(), checked.to_string(), "> 0"),
        ("writes recovered by retransmission".into(), sum(&all, |v| u(&v["bcast"]["recovered"])).to_string(), ""),
        (
            "writes lost inside announced outages".into(),
            sum(&all, |v| u(&v["bcast"]["lost_announced"])).to_string(),
            "",
        ),
        ("writes lost outside an announced outage".into(), lost_unannounced.to_string(), "0"),
        ("reorderings".into(), reorders.to_string(), "0"),
        ("wrong contents (broadcast, UMP)".into(), corrupt.to_string(), "0"),
        ("lock rounds".into(), rounds.to_string(), "> 0"),
        ("lock counter / confirmed / in doubt".into(), format!("{counter} / {confirmed} / {doubt}"), ""),
        ("lock-counter error".into(), lock_error.to_string(), "0"),
        ("UMP pings (contents checked)".into(), pings.to_string(), if pairs > 0 { "> 0" } else { "" }),
        (
            "UMP channels broken by announced outages".into(),
            sum(&all, |v| u(&v["ump"]["interrupted_announced"])).to_string(),
            "",
        ),
        ("UMP failures without an announced outage".into(), ump_unannounced.to_string(), "0"),
        ("hangs".into(), hangs.to_string(), "0"),
    ];
    println!();
    let across = if a.hosts > 0 { format!(" on {} hosts", a.hosts) } else { String::new() };
    println!("soak result: {} nodes{across}, {:.1} min under faults, seed {}", a.nodes, a.minutes, a.seed);
    for (k, (i, d)) in &injected {
        println!("  {:<40} {i} injected, {d} detected", k.name());
    }
    println!("  {:-<72}", "");
    for (name, value, want) in &rows {
        println!(
            "  {name:<42} {value:>18}  {}",
            if want.is_empty() { String::new() } else { format!("(must be {want})") }
        );
    }
    for n in &notes {
        println!("  note: {n}");
    }
    for (n, inc, w) in &s.stalls {
        println!("  hang: node {n} incarnation {inc}: {w}");
    }
    for h in &s.hangs {
        println!("  hang: {h}");
    }
    for v in &all {
        for e in v["errors"].as_array().into_iter().flatten().take(5) {
            println!("  node {} incarnation {}: {}", v["node"], v["incarnation"], e.as_str().unwrap_or(""));
        }
    }
    let ok = n_detected == n_injected
        && n_injected > 0
        && checked > 0
        && lost_unannounced == 0
        && reorders == 0
        && corrupt == 0
        && lock_error == 0
        && rounds > 0
        && (pairs == 0 || pings > 0)
        && ump_unannounced == 0
        && hangs == 0;
    let result = json!({
        "nodes": a.nodes, "hosts": a.hosts, "minutes": a.minutes, "seed": a.seed, "ok": ok,
        "faults": log,
        "table": rows.iter().map(|(k, v, w)| json!({"row": k, "value": v, "must_be": w})).collect::<Vec<_>>(),
        "faults_injected": n_injected, "faults_detected": n_detected, "writes_checked": checked,
        "lost_unannounced": lost_unannounced, "reorders": reorders, "corrupt": corrupt,
        "lock_counter": counter, "lock_confirmed": confirmed, "lock_doubt": doubt, "lock_error": lock_error,
        "lock_tallies": s.tallies.iter().map(|((n, i), t)| json!({"node": n, "incarnation": i, "confirmed": t.confirmed, "doubt": t.doubt, "pending": t.pending})).collect::<Vec<_>>(),
        "lock_counters": counters,
        "lock_rounds": rounds, "ump_pings": pings, "ump_unannounced": ump_unannounced, "hangs": hangs,
        "wall_seconds": t_all.elapsed().as_secs(),
    });
    std::fs::write(dir.join("result.json"), serde_json::to_vec_pretty(&result)?)?;
    if !ok {
        // What imcd saw is what a failure needs first.
        for n in 0..a.nodes {
            let log = std::fs::read_to_string(dir.join(format!("node{n}-imcd.log"))).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            println!("  imcd on node {n}, last {} lines:", lines.len().min(25));
            for l in &lines[lines.len().saturating_sub(25)..] {
                println!("    {l}");
            }
        }
    }
    println!("  {}", if ok { "PASS" } else { "FAIL" });
    println!("(figures: {})", dir.join("result.json").display());
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_has_every_kind_first_and_follows_the_seed() {
        let p = plan(&mut Rng(5), 12, false);
        assert_eq!(p.len(), 12);
        let first: std::collections::BTreeSet<Kind> = p[..5].iter().copied().collect();
        assert_eq!(first.len(), 5, "every kind in the first five: {p:?}");
        assert!(!p.contains(&Kind::Partition), "{p:?}");
        assert_eq!(p, plan(&mut Rng(5), 12, false));
        assert_ne!(p, plan(&mut Rng(6), 12, false));
        // Across hosts: partitions too, among the first six and every third after.
        let h = plan(&mut Rng(5), 30, true);
        let first: std::collections::BTreeSet<Kind> = h[..6].iter().copied().collect();
        assert_eq!(first.len(), 6, "every kind in the first six: {h:?}");
        assert!(h[6..].iter().filter(|k| **k == Kind::Partition).count() >= 8, "{h:?}");
    }
}
