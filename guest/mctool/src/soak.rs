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
//! and one mutex for the status).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use imc_client::guest_mem::{Mapping, ReadOnly, ReadWrite};
use imc_client::Imc;
use serde::Serialize;
use testkit::soak::{classify, pack, payload, unpack, Next, Tally, RING};

/// Region key of the broadcast slots (the counter region is
/// `KEY + 1`, the spinlock set `KEY + 2`).
pub(crate) const KEY: u64 = 0x50AC_0000;
/// Bytes per node slot: a header page (head, acks) and a ring page.
const SLOT: usize = 2 * regs::PAGE_SIZE as usize;
/// A writer never runs more than this many records ahead of the slowest
/// reader that follows it.
const WINDOW: u64 = RING - 16;
/// Offset of reader acks in a slot header: word w is this node's ack of writer w.
const ACKS: usize = 64;
/// How far a reader may lag behind what has arrived, in ms.
const LAG_MS: u64 = 5000;
/// How long a reader waits for a record lost in the writer's announced
/// outage to be sent again.
const ANNOUNCED_WAIT: Duration = Duration::from_secs(5);
/// How long a reader waits for a missing record to be sent again.
const RETRANSMIT_WAIT: Duration = Duration::from_secs(25);
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
    bcast: Bcast,
    lock: Lock,
    ump: Ump,
    /// What the UMP worker is doing (or waiting for) right now.
    ump_doing: String,
    /// Workers that made no progress for [`HANG`] without an outage.
    stalls: Vec<String>,
    /// Errors a worker hit (set-up retried).
    errors: Vec<String>,
}

#[derive(Debug, Default, Clone, Serialize)]
struct Bcast {
    written: u64,
    retransmits: u64,
    setups: u64,
    /// Records read and found right.
    checked: u64,
    /// Records that arrived only after being sent again.
    recovered: u64,
    lost_announced: u64,
    lost_unannounced: u64,
    /// A head that went back, or a record from later than expected.
    reorders: u64,
    /// A record with the wrong contents.
    corrupt: u64,
    /// New incarnations of writers adopted.
    joins: u64,
    /// Per writer: (incarnation, last sequence read) as packed words.
    seen: Vec<u64>,
    /// This node's own head (incarnation, last sequence written).
    head: u64,
}

#[derive(Debug, Default, Clone, Serialize)]
struct Lock {
    tally: Option<Tally>,
    rounds: u64,
    /// Counter copy found stale (after an outage or at start) and refreshed.
    resyncs: u64,
    setups: u64,
    /// Counter read lower than one already seen under the lock.
    regressions: u64,
    /// The counter as this node last read it.
    counter: u64,
    /// Every tally word (`TALLY_SLOTS` per node) as this node last read it.
    tallies: Vec<u64>,
}

#[derive(Debug, Default, Clone, Serialize)]
struct Ump {
    role: String,
    pings: u64,
    echoed: u64,
    bytes: u64,
    corrupt: u64,
    interrupted_announced: u64,
    interrupted_unannounced: u64,
    reopens: u64,
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

fn write_status(sh: &Shared, path: &Path, t0: Instant, done: bool) -> Result<()> {
    let mut s = sh.status.lock().unwrap_or_else(|e| e.into_inner()).clone();
    s.elapsed_s = t0.elapsed().as_secs_f64();
    s.done = done;
    s.own_outages = sh.own();
    s.absences = (0..sh.nodes).map(|n| sh.absent(n)).collect();
    s.hw_errors = sh.hw_errors.load(Ordering::Relaxed) as u32;
    s.err_bits = sh.err_bits.load(Ordering::Relaxed) as u32;
    let p = sh.present.load(Ordering::Relaxed);
    s.members = (0..64).filter(|n| p & (1 << n) != 0).map(|n| n as u16).collect();
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec(&s)?).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))?;
    Ok(())
}

/// Polls the error count and the members; counts outages.
fn watch(sh: &Shared, regs: imc_client::Regs) -> Result<()> {
    let mut hw = regs.hw_errcnt();
    let mut was = u64::MAX;
    while !sh.stopping() {
        let now = regs.hw_errcnt();
        let members = regs.members().iter().fold(0u64, |m, &n| m | 1 << n);
        let me_up = members & (1 << sh.node) != 0;
        if now != hw || !me_up {
            sh.own_at.store(sh.now_ms(), Ordering::Release);
        }
        if now != hw || (!me_up && was & (1 << sh.node) != 0) {
            sh.own_outages.fetch_add(1, Ordering::AcqRel);
            hw = now;
        }
        if me_up {
            for n in 0..sh.nodes {
                if members & (1 << n) == 0 {
                    sh.absent_at[n].store(sh.now_ms(), Ordering::Release);
                    if was & (1 << n) != 0 {
                        sh.absences[n].fetch_add(1, Ordering::AcqRel);
                    }
                }
            }
        }
        sh.hw_errors.store(u64::from(now), Ordering::Relaxed);
        sh.err_bits.fetch_or(u64::from(regs.err_status()), Ordering::Relaxed);
        sh.cluster_errors.store(u64::from(regs.rderrcnt()), Ordering::Release);
        sh.present.store(members, Ordering::Release);
        was = members;
        std::thread::sleep(Duration::from_millis(10));
    }
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

/// A reader's view of one writer.
#[derive(Default, Clone)]
struct Follow {
    inc: u16,
    seq: u64,
    /// When the last record was read right (ms since start).
    good_ms: u64,
    /// Since when the next record has been missing.
    missing_since: Option<Instant>,
    /// The writer's head as last seen, and when it was last seen so.
    head: u64,
    head_ms: u64,
    /// Heads seen and not yet read up to, each with when the head before
    /// it was last seen: a record up to that head was stored after then.
    batches: std::collections::VecDeque<(u64, u64)>,
}

fn bcast(sh: &Shared, rate: u64, tick: impl Fn()) -> Result<()> {
    let me = sh.node;
    let size = (sh.nodes * SLOT) as u64;
    let open = || Region::open(KEY, size, false, false);
    let Some(mut r) = open_retrying(sh, "bcast", open) else { return Ok(()) };
    let mine = me * SLOT;
    let mut seq = 0u64;
    let mut follow = vec![Follow::default(); sh.nodes];
    let mut st = Bcast { seen: vec![0; sh.nodes], ..Bcast::default() };
    let mut own_seen = sh.own();
    let period = Duration::from_micros(1_000_000 / rate);
    let mut next_write = Instant::now();
    let mut last_ack_refresh = Instant::now();
    let mut blocked_since: Option<Instant> = None;
    let mut drain: Option<(Instant, Vec<u64>, Instant)> = None;
    // A new incarnation follows nobody yet: clear what an earlier one
    // acknowledged, or writers would wait for it.
    for w in 0..sh.nodes {
        r.store(mine + ACKS + 8 * w, 0);
    }
    let write_record = |r: &Region, s: u64| {
        let slot = mine + regs::PAGE_SIZE as usize + (s % RING) as usize * 16;
        r.store(slot + 8, payload(me, sh.inc, s));
        r.store(slot, pack(sh.inc, s));
    };
    loop {
        // Our own link went down: what we stored meanwhile may be lost, and
        // after a long outage our attachments were revoked. Map again and
        // send the last window again.
        if sh.own() != own_seen {
            if !sh.wait_link() {
                break;
            }
            std::thread::sleep(Duration::from_millis(300));
            own_seen = sh.own();
            // Mapped anew before the old mapping goes, so that a receive
            // buffer that survived the outage is kept.
            let Some(nr) = open_retrying(sh, "bcast", open) else { break };
            r = nr;
            st.setups += 1;
            for s in seq.saturating_sub(WINDOW - 1).max(1)..=seq {
                write_record(&r, s);
            }
            if seq > 0 {
                r.store(mine, pack(sh.inc, seq));
            }
            st.retransmits += 1;
            for f in follow.iter_mut() {
                // Everything we missed while down is an announced loss.
                f.missing_since = None;
            }
        }
        let stopping = sh.stopping();
        // Write the next record when the readers that follow us keep up.
        if !stopping && Instant::now() >= next_write {
            let ahead = (0..sh.nodes).filter(|&n| n != me && sh.up(n)).any(|n| {
                let (ai, aseq) = unpack(r.load(n * SLOT + ACKS + 8 * me));
                ai == sh.inc && seq + 1 > aseq + WINDOW
            });
            if ahead {
                let since = *blocked_since.get_or_insert_with(Instant::now);
                if since.elapsed() > HANG {
                    sh.with(|s| s.stalls.push("bcast: held back 90 s by a reader that does not acknowledge".into()));
                    blocked_since = Some(Instant::now());
                }
            } else {
                blocked_since = None;
                seq += 1;
                write_record(&r, seq);
                r.store(mine, pack(sh.inc, seq));
                st.written += 1;
                next_write += period;
                if next_write + period * 100 < Instant::now() {
                    next_write = Instant::now();
                }
                tick();
            }
        }
        // Read every other writer.
        for w in (0..sh.nodes).filter(|&w| w != me) {
            let f = &mut follow[w];
            let (hi, hs) = unpack(r.load(w * SLOT));
            if hi == 0 {
                continue;
            }
            if hi != f.inc {
                if hi > f.inc {
                    let now = sh.now_ms();
                    *f = Follow { inc: hi, seq: hs, good_ms: now, head: hs, head_ms: now, ..Follow::default() };
                    st.joins += 1;
                } else {
                    st.reorders += 1;
                    sh.error(format!("bcast: writer {w}'s head went back from incarnation {} to {hi}", f.inc));
                }
                continue;
            }
            if hs < f.head {
                st.reorders += 1;
                sh.error(format!("bcast: writer {w}'s head went back from {} to {hs}", f.head));
                f.head = hs;
                f.seq = f.seq.min(hs);
                continue;
            }
            let now = sh.now_ms();
            if hs > f.head {
                f.batches.push_back((hs, f.head_ms));
                f.head = hs;
            }
            f.head_ms = now;
            while f.seq < hs {
                let t = f.seq + 1;
                while f.batches.front().is_some_and(|b| b.0 < t) {
                    f.batches.pop_front();
                }
                // Record t was stored after the writer's earlier head was
                // last seen here; a loss is explained by an outage since
                // then (give or take the gap between its two stores).
                let stored_after = f.batches.front().map_or(f.good_ms, |b| b.1).min(f.good_ms);
                let slot = w * SLOT + regs::PAGE_SIZE as usize + (t % RING) as usize * 16;
                // A record read now may have arrived a while ago: an outage up
                // to LAG before the last good read may still explain a loss.
                let announced = sh.announced_since(w, stored_after.saturating_sub(LAG_MS));
                match classify(r.load(slot), r.load(slot + 8), w, hi, t) {
                    Next::Good => {
                        st.checked += 1;
                        if f.missing_since.take().is_some() {
                            st.recovered += 1;
                        }
                        // Later losses are excused only by outages after this.
                        f.good_ms = sh.now_ms();
                    }
                    // Its tag arrived but its payload store did not (a
                    // frame dropped as corrupt, say): a loss, announced.
                    Next::Corrupt | Next::Later if announced => st.lost_announced += 1,
                    // The watch thread may not have seen the error count move
                    // yet (it looks every 10 ms): judge a second later.
                    Next::Corrupt | Next::Later if !judged(&mut f.missing_since) => break,
                    Next::Corrupt => {
                        st.corrupt += 1;
                        sh.error(format!("bcast: writer {w} record {t}: wrong contents"));
                    }
                    Next::Later => {
                        st.reorders += 1;
                        sh.error(format!("bcast: writer {w} record {t}: a later record in its slot"));
                    }
                    Next::Missing => {
                        // Lost while our own link was down: nobody sends it
                        // again. Lost while the writer's was: it sends its
                        // last ring again once back. Otherwise: wait long.
                        let since = *f.missing_since.get_or_insert_with(Instant::now);
                        let from = stored_after.saturating_sub(LAG_MS);
                        let wait = if sh.own_since(from) {
                            Duration::ZERO
                        } else if announced {
                            ANNOUNCED_WAIT
                        } else {
                            RETRANSMIT_WAIT
                        };
                        if since.elapsed() < wait && !(stopping && drain_over(&drain)) {
                            break;
                        }
                        if sh.announced_since(w, from) {
                            st.lost_announced += 1;
                        } else {
                            st.lost_unannounced += 1;
                            sh.error(format!(
                                "bcast: writer {w} record {t} never arrived, and no outage was announced"
                            ));
                        }
                    }
                }
                f.seq = t;
                f.missing_since = None;
                tick();
            }
            st.seen[w] = pack(f.inc, f.seq);
        }
        // Acknowledge (and now and then again, for a writer whose copy is stale).
        let refresh = last_ack_refresh.elapsed() > Duration::from_secs(1);
        if refresh && seq > 0 {
            // The head again too: a reader that joined while we were held
            // back still learns where we are.
            r.store(mine, pack(sh.inc, seq));
        }
        for w in (0..sh.nodes).filter(|&w| w != me) {
            let off = mine + ACKS + 8 * w;
            let v = pack(follow[w].inc, follow[w].seq);
            if follow[w].inc != 0 && (refresh || r.load(off) != v) {
                r.store(off, v);
            }
        }
        if refresh {
            last_ack_refresh = Instant::now();
        }
        st.head = pack(sh.inc, seq);
        sh.with(|s| s.bcast = st.clone());
        if stopping {
            // Drain: send our last window once more, then read until every
            // writer's head stays put for 3 s (at most 40 s).
            let heads: Vec<u64> = (0..sh.nodes).map(|w| r.load(w * SLOT)).collect();
            match &mut drain {
                None => {
                    for s in seq.saturating_sub(WINDOW - 1).max(1)..=seq {
                        write_record(&r, s);
                    }
                    if seq > 0 {
                        r.store(mine, pack(sh.inc, seq));
                    }
                    drain = Some((Instant::now(), heads, Instant::now()));
                }
                Some((start, last, since)) => {
                    if *last != heads {
                        *last = heads;
                        *since = Instant::now();
                    }
                    let caught_up = follow.iter().all(|f| f.missing_since.is_none());
                    if (since.elapsed() > Duration::from_secs(3) && caught_up)
                        || start.elapsed() > Duration::from_secs(40)
                    {
                        break;
                    }
                }
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(())
}

/// Whether a record that looks wrong has looked so for a second (the
/// first look starts the clock).
fn judged(since: &mut Option<Instant>) -> bool {
    since.get_or_insert_with(Instant::now).elapsed() > Duration::from_secs(1)
}

/// During the drain, missing records stop waiting for retransmission once
/// the drain has run half its course.
fn drain_over(drain: &Option<(Instant, Vec<u64>, Instant)>) -> bool {
    drain.as_ref().is_some_and(|(start, ..)| start.elapsed() > Duration::from_secs(30))
}

/// Longest wait for an increment to come back through the hub.
const STORE_WAIT: Duration = Duration::from_secs(10);

fn lock(sh: &Shared, tick: impl Fn()) -> Result<()> {
    let me = sh.node;
    let open = || -> Result<(Region, imc_client::LockSet)> {
        let r = Region::open(KEY + 1, regs::PAGE_SIZE, true, true)?;
        let (set, _) = r.imc.lkalloc(KEY + 2, 1, 0o666, false).map_err(crate::imc::imc_status)?;
        Ok((r, set))
    };
    let open_both = || open_retrying(sh, "lock", open);
    let Some((mut r, mut set)) = open_both() else { return Ok(()) };
    let mut st = Lock::default();
    let mut tally = Tally { inc: sh.inc, pending: false, doubt: 0, confirmed: 0 };
    let tally_off = testkit::soak::tally_offset(me, sh.inc);
    // A fresh receive buffer (and one after an outage) may miss writes:
    // the counter is trusted only once it has been seen to change.
    let mut fresh = false;
    let mut own_seen = sh.own();
    let mut high = 0u64;
    let mut view_tick = 0u64;
    let mut waiting: Option<Instant> = None;
    while !sh.stopping() {
        if sh.own() != own_seen {
            if !sh.wait_link() {
                break;
            }
            std::thread::sleep(Duration::from_millis(300));
            own_seen = sh.own();
            fresh = false;
            let Some((nr, ns)) = open_both() else { return Ok(()) };
            (r, set) = (nr, ns);
            st.setups += 1;
            // A release we made while the link was down never arrived, and
            // the lock stays ours until we take it again: take and release
            // it (the counter stays untouched until our copy is fresh).
            if set.acquire(0, Duration::from_secs(30)).is_ok() {
                let _ = set.release(0);
            }
        }
        if !fresh {
            fresh = refresh(sh, &r, &mut view_tick);
            if fresh {
                st.resyncs += 1;
            } else {
                continue;
            }
        }
        // Short tries, so our view stays current for nodes refreshing.
        match set.acquire(0, Duration::from_secs(2)) {
            Ok(()) => waiting = None,
            Err(imc_client::ImcError::Refused { code: imc_client::Status::Timeout, .. })
                if waiting.get_or_insert_with(Instant::now).elapsed() < Duration::from_secs(60) =>
            {
                publish_view(sh, &r, &mut view_tick, fresh);
                continue;
            }
            Err(e) => {
                sh.error(format!("lock: acquire: {e}"));
                waiting = None;
                own_seen = own_seen.wrapping_sub(1); // set up again
                continue;
            }
        }
        if sh.own() != own_seen {
            let _ = set.release(0);
            continue;
        }
        let c = r.load(0);
        if c < high {
            st.regressions += 1;
            sh.error(format!("lock: counter read {c} under the lock after {high}"));
        }
        tally.pending = true;
        r.store(tally_off, tally.word());
        r.store(0, c + 1);
        let t0 = Instant::now();
        while r.load(0) != c + 1 && t0.elapsed() < STORE_WAIT {
            std::hint::spin_loop();
        }
        tally.pending = false;
        if r.load(0) == c + 1 {
            tally.confirmed += 1;
            high = c + 1;
        } else {
            tally.doubt += 1;
            fresh = false;
        }
        r.store(tally_off, tally.word());
        let _ = set.release(0);
        publish_view(sh, &r, &mut view_tick, fresh);
        st.rounds += 1;
        st.tally = Some(tally);
        st.counter = r.load(0);
        st.tallies = tally_words(sh, &r);
        sh.with(|s| s.lock = st.clone());
        tick();
        std::thread::sleep(Duration::from_millis(20));
    }
    // Let the last increments settle, then report the counter as seen here.
    std::thread::sleep(Duration::from_secs(3));
    st.tally = Some(tally);
    st.counter = r.load(0);
    st.tallies = tally_words(sh, &r);
    sh.with(|s| s.lock = st.clone());
    Ok(())
}

/// Every tally word in the counter region, as this node reads it.
fn tally_words(sh: &Shared, r: &Region) -> Vec<u64> {
    (0..sh.nodes * testkit::soak::TALLY_SLOTS).map(|k| r.load(testkit::soak::TALLIES + 8 * k)).collect()
}

/// Offset of the views in the counter region: word n is node n's
/// (tick, stale, counter as it sees it), republished every 100 ms or so.
const VIEWS: usize = 512;

fn publish_view(sh: &Shared, r: &Region, tick: &mut u64, fresh: bool) {
    *tick = (*tick + 1) & 0xFFFF;
    r.store(VIEWS + 8 * sh.node, *tick << 48 | u64::from(!fresh) << 47 | (r.load(0) & ((1 << 47) - 1)));
}

/// Makes a counter copy that may be stale (after an outage, or a new
/// receive buffer) trustworthy: it is once the counter is seen to change
/// (someone fresh incremented it), or once every node that runs the
/// workload has republished its view within 5 s and none holds a higher
/// counter than ours (the counter only grows, so the highest copy is the
/// latest; after a hub restart every node is stale, nobody could write
/// meanwhile, and the highest ones go on).
fn refresh(sh: &Shared, r: &Region, tick: &mut u64) -> bool {
    let view = |n: usize| r.load(VIEWS + 8 * n);
    let before: Vec<u64> = (0..sh.nodes).map(view).collect();
    let v0 = r.load(0);
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(5) {
        if sh.stopping() || r.load(0) != v0 {
            return r.load(0) != v0;
        }
        publish_view(sh, r, tick, false);
        std::thread::sleep(Duration::from_millis(100));
    }
    let mine = r.load(0);
    if mine != v0 {
        return true;
    }
    let (lo47, me) = ((1u64 << 47) - 1, sh.node);
    // A new cluster: nobody has ever counted.
    if sh.inc == 1 && mine == 0 && (0..sh.nodes).all(|n| view(n) & lo47 == 0) {
        return true;
    }
    (0..sh.nodes).filter(|&n| n != me && sh.up(n) && view(n) != before[n]).all(|n| view(n) & lo47 <= mine)
}

/// UMP handles: the echo side listens on `ECHO + pair`; the pinger opens
/// from a new handle each time.
const ECHO: u64 = 0x50AC_E000_0000;
const PING: u64 = 0x50AC_F000_0000;

/// Message lengths the pinger cycles through.
const LENGTHS: [usize; 6] = [16, 100, 1000, 4096, 9000, 20000];

/// Header of a ping: sequence number and length; the rest is
/// `testkit::message(seq, len - 16)`.
fn ping_message(seq: u64, len: usize) -> Vec<u8> {
    let mut m = Vec::with_capacity(len);
    m.extend_from_slice(&seq.to_le_bytes());
    m.extend_from_slice(&(len as u64).to_le_bytes());
    m.extend_from_slice(&testkit::message(seq, len.saturating_sub(16)));
    m
}

/// Whether `m` is a well-formed ping.
fn ping_ok(m: &[u8]) -> bool {
    if m.len() < 16 {
        return false;
    }
    let seq = u64::from_le_bytes(m[..8].try_into().expect("8 bytes"));
    let len = u64::from_le_bytes(m[8..16].try_into().expect("8 bytes")) as usize;
    len == m.len() && m[16..] == testkit::message(seq, len - 16)[..]
}

fn ump_worker(sh: &Shared, tick: impl Fn()) -> Result<()> {
    let pair = sh.node / 2;
    let echo_node = pair * 2 + 1;
    if echo_node >= sh.nodes {
        sh.with(|s| s.ump.role = "none".into());
        return Ok(());
    }
    let pinger = sh.node % 2 == 0;
    let peer = if pinger { echo_node } else { pair * 2 };
    let mut st = Ump { role: if pinger { "ping" } else { "echo" }.into(), ..Ump::default() };
    let mut attempt = 0u64;
    let mut seq = 0u64;
    let mut buf = vec![0u8; 64 * 1024];
    while !sh.stopping() {
        sh.doing("waiting for the link".into());
        if !sh.wait_link() {
            break;
        }
        sh.doing("ump exit and init".into());
        let _ = ump::exit();
        if let Err(e) = ump::init(ump::Config::from_env()?) {
            sh.error(format!("ump: init: {e}"));
            std::thread::sleep(Duration::from_secs(1));
            continue;
        }
        let errs = || sh.cluster_errors.load(Ordering::Acquire);
        let mark = (sh.own(), sh.absent(peer), errs());
        // The peer's own errors reach us through the clusterwide count (the
        // echo side closes its channel when its error count moves).
        let announced = |m: (u64, u64, u64)| sh.own() != m.0 || sh.absent(peer) != m.1 || errs() != m.2 || !sh.up(peer);
        if pinger {
            attempt += 1;
            let me = PING + ((pair as u64) << 24) + (u64::from(sh.inc) << 12) + (attempt & 0xFFF);
            sh.doing(format!("opening {me:#x} to {:#x}", ECHO + pair as u64));
            let id = match ump::open(me, ECHO + pair as u64, ump::Want::Mc) {
                Ok(id) => id,
                Err(e) => {
                    sh.error(format!("ump: open: {e}"));
                    std::thread::sleep(Duration::from_secs(1));
                    continue;
                }
            };
            st.reopens += 1;
            sh.doing(format!("waiting for node {peer} to open channel {me:#x}"));
            let t0 = Instant::now();
            let mut open = false;
            while !open && t0.elapsed() < Duration::from_secs(20) && !sh.stopping() {
                open = matches!(ump::wait(Some(id), Some(Duration::from_millis(200))), Ok(Some(ump::Event::Open(_))));
            }
            if !open {
                continue;
            }
            while !sh.stopping() {
                seq += 1;
                let msg = ping_message(seq, LENGTHS[(seq % LENGTHS.len() as u64) as usize]);
                let m0 = (sh.own(), sh.absent(peer), errs());
                sh.doing(format!("ping {seq} of {} bytes", msg.len()));
                let r = ump::write_timeout(id, &msg, Duration::from_secs(10))
                    .and_then(|_| ump::read_timeout(id, &mut buf, Duration::from_secs(10)));
                match r {
                    Ok(n) if buf[..n] == msg[..] => {
                        st.pings += 1;
                        st.bytes += 2 * n as u64;
                        tick();
                    }
                    Ok(n) => {
                        st.corrupt += 1;
                        sh.error(format!("ump: ping {seq}: {n} bytes came back different from the {} sent", msg.len()));
                        break;
                    }
                    Err(e) => {
                        let state = ump::chan(id).map(|c| c.state()).unwrap_or_default();
                        // The echo side stops a moment before we do.
                        let t = Instant::now();
                        while !sh.stopping() && t.elapsed() < Duration::from_secs(3) {
                            std::thread::sleep(Duration::from_millis(50));
                        }
                        if sh.stopping() {
                            break;
                        }
                        if announced(m0) || announced(mark) {
                            st.interrupted_announced += 1;
                        } else {
                            st.interrupted_unannounced += 1;
                            sh.error(format!("ump: ping {seq}: {e}, and no outage was announced ({state})"));
                        }
                        break;
                    }
                }
                sh.with(|s| s.ump = st.clone());
                std::thread::sleep(Duration::from_millis(20));
            }
        } else {
            sh.doing("listening".into());
            if let Err(e) = ump::listen(ECHO + pair as u64, ump::Want::Mc) {
                sh.error(format!("ump: listen: {e}"));
                std::thread::sleep(Duration::from_secs(1));
                continue;
            }
            st.reopens += 1;
            sh.doing("listening, no channel yet".into());
            let mut cur: Option<i32> = None;
            let mut last = Instant::now();
            tick();
            while !sh.stopping() {
                if sh.own() != mark.0 || last.elapsed() > Duration::from_secs(30) {
                    // Our link went down (the inbox may be gone) or nobody
                    // pinged for long: listen afresh.
                    break;
                }
                match ump::wait(None, Some(Duration::from_millis(200))) {
                    Ok(Some(ump::Event::Open(id))) => {
                        sh.doing(format!("echoing on channel {id}"));
                        if let Some(old) = cur.replace(id) {
                            let _ = ump::close(old);
                        }
                        last = Instant::now();
                    }
                    Ok(Some(ump::Event::Message(id))) if Some(id) == cur => {
                        let r = ump::read_timeout(id, &mut buf, Duration::from_secs(10));
                        match r {
                            Ok(n) if ping_ok(&buf[..n]) => {
                                if ump::write_timeout(id, &buf[..n], Duration::from_secs(10)).is_ok() {
                                    st.echoed += 1;
                                    st.bytes += 2 * n as u64;
                                    last = Instant::now();
                                    tick();
                                }
                            }
                            Ok(n) => {
                                st.corrupt += 1;
                                sh.error(format!("ump: echo: a {n}-byte message is not a well-formed ping"));
                                let _ = ump::close(id);
                                cur = None;
                            }
                            Err(_) => {
                                let _ = ump::close(id);
                                cur = None;
                            }
                        }
                    }
                    Ok(Some(ump::Event::Message(id) | ump::Event::Closed(id))) => {
                        let _ = ump::close(id);
                        if Some(id) == cur {
                            cur = None;
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        sh.error(format!("ump: wait: {e}"));
                        break;
                    }
                }
                sh.with(|s| s.ump = st.clone());
            }
        }
        sh.with(|s| s.ump = st.clone());
    }
    let _ = ump::exit();
    sh.with(|s| s.ump = st.clone());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pings_are_checked() {
        let m = ping_message(5, 1000);
        assert!(ping_ok(&m));
        let mut bad = m.clone();
        bad[500] ^= 1;
        assert!(!ping_ok(&bad));
        assert!(!ping_ok(&m[..999]));
        assert!(ping_ok(&ping_message(1, 16)));
        assert!(!ping_ok(&[0u8; 8]));
    }
}
