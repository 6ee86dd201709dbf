//! `mctool soak`: one node's share of the soak workload that
//! `scripts/soak.sh` (the `mc-soak` driver) runs on every node while it
//! injects faults. Three workloads, each checked as it runs:
//!
//! - **Sequenced broadcast writes** (`bcast` thread): every node writes
//!   numbered records into its slot of one region, and checks every other
//!   node's records for order, completeness and contents. A writer whose
//!   own link went down sends its last ring of records again (the
//!   TruCluster way: `imc_ckerrcnt` says stores may have been lost, the
//!   program retransmits). A record a reader never gets is a loss: inside
//!   an announced outage (this node's error count moved, or the writer left
//!   the members) it is counted as such, otherwise it is a failure.
//! - **Counters under a cluster spinlock** (`lock` thread): increments of
//!   one coherent counter under `imc_lkacquire`, with each node's tally of
//!   confirmed and in-doubt increments published next to it, so the driver
//!   can check the counter against the sum of every incarnation's tally.
//! - **UMP ping-pong** (`ump` thread): node 2k pings node 2k+1 with
//!   numbered messages of varied length, contents checked on both sides;
//!   after an error or timeout the pinger opens a new channel.
//!
//! The `watch` thread polls the adapter (error count, members) every 10 ms
//! and counts outages: this node's own, and each other node's absences.
//! The main thread writes the status file once a second (JSON, replaced
//! atomically) and stops everything when the stop file appears.
//!
//! Threads: main, watch, bcast, lock, ump; they share [`Shared`] (atomics
//! and one mutex for the status). One module per workload ([`bcast`],
//! [`lock`], [`ump`]), the watcher and the status file in [`watch`]; this
//! file holds what they share and the main thread.

mod bcast;
mod lock;
mod ump;
mod watch;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use imc_client::guest_mem::{Mapping, ReadOnly, ReadWrite};
use imc_client::Imc;
use serde::Serialize;

use bcast::bcast;
use lock::lock;
use ump::ump_worker;
use watch::{watch, write_status};

/// Region key of the broadcast slots (the counter region is
/// `KEY + 1`, the spinlock set `KEY + 2`).
pub(crate) const KEY: u64 = 0x50AC_0000;
/// A worker that makes no progress this long (and saw no outage of its own,
/// nor, for UMP, an absence of its partner) is hung.
const HANG: Duration = Duration::from_secs(90);
/// Largest node count (slots in the region).
pub(crate) const MAX_NODES: usize = 16;

/// What one node reports (the status file).
#[derive(Debug, Default, Clone, Serialize)]
pub(crate) struct Status {
    node: usize,
    incarnation: u16,
    elapsed_s: f64,
    done: bool,
    /// This node's own outages seen (link down, own error count moved).
    own_outages: u64,
    /// Absences seen of each node.
    absences: Vec<u64>,
    /// The adapter's error count register.
    hw_errors: u32,
    /// Every ERR_STATUS bit seen set (`regs::err`).
    err_bits: u32,
    members: Vec<u16>,
    bcast: bcast::Bcast,
    lock: lock::Lock,
    ump: ump::Ump,
    /// What the UMP worker is doing (or waiting for) right now.
    ump_doing: String,
    /// Workers that made no progress for [`HANG`] without an outage.
    stalls: Vec<String>,
    /// Errors a worker hit (set-up retried).
    errors: Vec<String>,
}

/// Options of `mctool soak`.
pub(crate) struct Opts {
    pub nodes: usize,
    pub incarnation: u16,
    pub status: PathBuf,
    pub stop: PathBuf,
    pub seconds: u64,
    /// Broadcast records per second.
    pub rate: u64,
}

/// State the threads share.
struct Shared {
    node: usize,
    nodes: usize,
    inc: u16,
    stop: AtomicBool,
    own_outages: AtomicU64,
    absences: Vec<AtomicU64>,
    /// When (ms since start, 0 never) this node was last seen in an outage
    /// of its own, and each node last seen absent.
    own_at: AtomicU64,
    absent_at: Vec<AtomicU64>,
    t0: Instant,
    present: AtomicU64,
    hw_errors: AtomicU64,
    err_bits: AtomicU64,
    /// The clusterwide error count (`imc_rderrcnt`): every node's errors.
    cluster_errors: AtomicU64,
    status: Mutex<Status>,
}

impl Shared {
    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
    fn own(&self) -> u64 {
        self.own_outages.load(Ordering::Acquire)
    }
    fn absent(&self, n: usize) -> u64 {
        self.absences[n].load(Ordering::Acquire)
    }
    /// Milliseconds since the workload started (at least 1).
    fn now_ms(&self) -> u64 {
        self.t0.elapsed().as_millis() as u64 + 1
    }
    /// Whether this node had an outage, or writer `w` was absent, at or
    /// after `since_ms` (a loss of `w`'s writes after then is announced).
    fn announced_since(&self, w: usize, since_ms: u64) -> bool {
        let own = self.own_at.load(Ordering::Acquire);
        let away = self.absent_at[w].load(Ordering::Acquire);
        (own != 0 && own >= since_ms) || (away != 0 && away >= since_ms)
    }
    /// Whether this node had an outage of its own at or after `since_ms`.
    fn own_since(&self, since_ms: u64) -> bool {
        let own = self.own_at.load(Ordering::Acquire);
        own != 0 && own >= since_ms
    }
    fn up(&self, n: usize) -> bool {
        self.present.load(Ordering::Acquire) & (1 << n) != 0
    }
    fn with(&self, f: impl FnOnce(&mut Status)) {
        f(&mut self.status.lock().unwrap_or_else(|e| e.into_inner()));
    }
    /// Records what the UMP worker is about to do (shown if it stalls).
    fn doing(&self, what: String) {
        let at = self.t0.elapsed().as_secs_f64();
        self.with(|s| s.ump_doing = format!("[{at:.1} s] {what}"));
    }
    fn error(&self, what: String) {
        self.with(|s| {
            if s.errors.len() < 50 {
                s.errors.push(format!("[{:.1} s] {what}", self.t0.elapsed().as_secs_f64()))
            }
        });
    }
    /// Waits until this node's link is up again (or stop); false on stop.
    fn wait_link(&self) -> bool {
        while !self.up(self.node) {
            if self.stopping() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }
}

/// Runs the workload until the stop file appears or `seconds` pass.
pub(crate) fn run(o: Opts) -> Result<()> {
    if o.nodes < 2 || o.nodes > MAX_NODES {
        bail!("--nodes must be 2..={MAX_NODES}");
    }
    if o.incarnation == 0 || o.incarnation > 0xFFF {
        bail!("--incarnation must be 1..=4095");
    }
    let imc = Imc::connect().context("imcd")?;
    let regs = imc.regs()?;
    let node = usize::from(regs.node().context("the adapter has no node id")?);
    if node >= o.nodes {
        bail!("this is node {node}, outside --nodes {}", o.nodes);
    }
    let sh = Arc::new(Shared {
        node,
        nodes: o.nodes,
        inc: o.incarnation,
        stop: AtomicBool::new(false),
        own_outages: AtomicU64::new(0),
        absences: (0..o.nodes).map(|_| AtomicU64::new(0)).collect(),
        own_at: AtomicU64::new(0),
        absent_at: (0..o.nodes).map(|_| AtomicU64::new(0)).collect(),
        t0: Instant::now(),
        present: AtomicU64::new(u64::MAX),
        hw_errors: AtomicU64::new(u64::from(regs.hw_errcnt())),
        err_bits: AtomicU64::new(0),
        cluster_errors: AtomicU64::new(0),
        status: Mutex::new(Status { node, incarnation: o.incarnation, ..Status::default() }),
    });
    let t0 = Instant::now();
    let progress: Arc<Vec<AtomicU64>> = Arc::new((0..3).map(|_| AtomicU64::new(0)).collect());
    let mut threads = Vec::new();
    {
        let sh = sh.clone();
        threads.push(("watch", std::thread::spawn(move || watch(&sh, regs))));
    }
    let rate = o.rate.max(1);
    for (i, name) in ["bcast", "lock", "ump"].into_iter().enumerate() {
        let sh = sh.clone();
        let p = progress.clone();
        let tick = move || p[i].store(t0.elapsed().as_millis() as u64, Ordering::Relaxed);
        threads.push((
            name,
            std::thread::spawn(move || match name {
                "bcast" => bcast(&sh, rate, tick),
                "lock" => lock(&sh, tick),
                _ => ump_worker(&sh, tick),
            }),
        ));
    }
    let deadline = (o.seconds > 0).then(|| t0 + Duration::from_secs(o.seconds));
    let mut last_own = (sh.own(), Instant::now());
    // The UMP partner (pairs 0-1, 2-3, ...): while it reboots, its new
    // incarnation takes a boot and a listen before the next ping, so the
    // UMP worker's clock runs from its last absence.
    let partner = sh.node ^ 1;
    let partner_absent = |sh: &Shared| if partner < sh.nodes { sh.absent(partner) } else { 0 };
    let mut last_partner = (partner_absent(&sh), Instant::now());
    loop {
        let stop = o.stop.exists() || deadline.is_some_and(|d| Instant::now() > d);
        if sh.own() != last_own.0 {
            last_own = (sh.own(), Instant::now());
        }
        if partner_absent(&sh) != last_partner.0 {
            last_partner = (partner_absent(&sh), Instant::now());
        }
        let now_ms = t0.elapsed().as_millis() as u64;
        let stalls: Vec<String> = ["bcast", "lock", "ump"]
            .iter()
            .enumerate()
            .filter(|&(i, _)| {
                // A worker with nothing to do (no UMP partner) has ended.
                let running = !threads[i + 1].1.is_finished();
                let p = progress[i].load(Ordering::Relaxed);
                let excused = i == 2 && last_partner.1.elapsed() <= HANG;
                running && now_ms.saturating_sub(p) > HANG.as_millis() as u64 && last_own.1.elapsed() > HANG && !excused
            })
            .map(|(_, n)| n.to_string())
            .collect();
        sh.with(|s| {
            for x in stalls {
                if !s.stalls.iter().any(|e| e.starts_with(&format!("{x}:"))) {
                    let at = t0.elapsed().as_secs_f64();
                    let doing = if x == "ump" { format!("; doing {}", s.ump_doing) } else { String::new() };
                    s.stalls.push(format!("{x}: no progress for 90 s (seen at {at:.1} s{doing})"));
                }
            }
        });
        write_status(&sh, &o.status, t0, false)?;
        if stop {
            break;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    sh.stop.store(true, Ordering::Relaxed);
    // Workers finish their round and drain; one that does not within a
    // minute is reported (and the process exits anyway).
    let end = Instant::now() + Duration::from_secs(60);
    for (name, t) in threads {
        while !t.is_finished() && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(50));
        }
        if t.is_finished() {
            if let Err(e) = t.join().unwrap_or_else(|_| Err(anyhow::anyhow!("panicked"))) {
                sh.error(format!("{name}: {e:#}"));
            }
        } else {
            sh.with(|s| s.stalls.push(format!("{name} did not stop")));
        }
    }
    write_status(&sh, &o.status, t0, true)?;
    Ok(())
}

/// A connection to imcd and one region mapped both ways.
struct Region {
    imc: Imc,
    tx: Mapping<ReadWrite>,
    rx: Mapping<ReadOnly>,
}

impl Region {
    fn open(key: u64, size: u64, coherent: bool, loopback: bool) -> Result<Region> {
        let imc = Imc::connect()?;
        imc.set_call_timeout(Duration::from_secs(30))?;
        let (id, ..) = imc.asalloc_flags(key, size, 0o666, false, coherent).map_err(crate::imc::imc_status)?;
        let tx = imc.asattach_tx(id, loopback).map_err(crate::imc::imc_status)?;
        let rx = imc.asattach_rx(id).map_err(crate::imc::imc_status)?;
        Ok(Region { imc, tx, rx })
    }

    fn load(&self, off: usize) -> u64 {
        self.rx.load_acquire::<u64>(off).unwrap_or(0)
    }

    fn store(&self, off: usize, v: u64) {
        let _ = self.tx.store::<u64>(off, v);
    }
}

/// Sets up (a region, a lock set), retrying once a second with the error
/// recorded, until it works or stop.
fn open_retrying<T>(sh: &Shared, what: &str, open: impl Fn() -> Result<T>) -> Option<T> {
    loop {
        if sh.stopping() || !sh.wait_link() {
            return None;
        }
        match open() {
            Ok(r) => return Some(r),
            Err(e) => {
                sh.error(format!("{what}: set-up: {e:#}"));
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
}
