//! The billboard on MEMORY CHANNEL: one region per job, allocated
//! coherently (every node receives it before anyone writes), mapped for
//! transmit with loopback (a process stores only into its own share, and
//! the other ranks on its own node read that share from their receive
//! memory like everyone else, so a node's stores must come back to it)
//! and for receive (it reads every share there). Also
//! what the protocol's waits ask of the cluster: the error count (imcd's
//! clusterwide count, the adapter's count and its link events) and the
//! liveness of the other processes, found by a prober thread that asks
//! imcd (`imc_kill` with signal 0, and whether the node is still in the
//! cluster) off the data path.
//!
//! Touched by the thread that owns the endpoint (stores, loads, verdicts)
//! and by the prober thread (probes, writes verdicts).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use guest_mem::{Mapping, ReadOnly, ReadWrite};
use imc_client::keys::Namespace;
use imc_client::{Imc, ImcError, Regs, Status};

use crate::layout::Geometry;
use crate::proto::{BbpError, Bus};

/// How often the prober asks about each process waited on.
const PROBE_EVERY: Duration = Duration::from_millis(250);
/// Longest a probe waits for imcd.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a process's node may be missing from imcd's table before the
/// process counts as gone: longer than imcd rides out a link flap and
/// repairs a node out (`imcd::daemon::Settings`), so a short flap never
/// ends a job.
const NODE_AWAY: Duration = Duration::from_secs(4);

/// The region key of job `job`'s billboard (`imc_proto::keys`).
pub fn key(job: u64) -> u64 {
    Namespace::Bbp.key(job)
}

/// Verdicts on the processes waited on, by who (node << 32 | pid): None
/// while alive (or not asked yet), Some(why) once gone.
type Verdicts = Arc<Mutex<HashMap<u64, Option<String>>>>;

/// The billboard in a MEMORY CHANNEL region.
pub struct McBus {
    tx: Mapping<ReadWrite>,
    rx: Mapping<ReadOnly>,
    regs: Option<Regs>,
    verdicts: Verdicts,
    stop: Arc<AtomicBool>,
    /// Holds the region (and is how it is released).
    imc: Imc,
    id: u32,
}

impl McBus {
    /// Allocates (or finds) job `job`'s billboard shaped `geo` and maps
    /// it. Returns the bus and this node's id.
    pub fn open(job: u64, geo: &Geometry) -> Result<(McBus, u16), BbpError> {
        let err = |e: ImcError| BbpError::Setup(format!("imcd: {e}"));
        let imc = Imc::connect().map_err(err)?;
        let want = geo.bytes();
        let (id, ..) = imc.asalloc_flags(key(job), want as u64, 0o666, false, true).map_err(err)?;
        let rx = imc.asattach_rx(id).map_err(err)?;
        let tx = imc.asattach_tx(id, true).map_err(err)?;
        let got = tx.len().min(rx.len());
        if got < want {
            return Err(BbpError::Setup(format!(
                "the billboard region of job {job} has {got} bytes, {want} needed (another job's, of other size?)"
            )));
        }
        let regs = imc.regs().ok();
        let node = regs.as_ref().and_then(Regs::node).unwrap_or(0);
        let verdicts: Verdicts = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (v, s) = (verdicts.clone(), stop.clone());
        std::thread::Builder::new()
            .name("bbp-probe".into())
            .spawn(move || probe_loop(&v, &s))
            .map_err(|e| BbpError::Setup(format!("starting the prober thread: {e}")))?;
        Ok((McBus { tx, rx, regs, verdicts, stop, imc, id }, node))
    }
}

impl Drop for McBus {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.imc.asdealloc(self.id);
    }
}

impl Bus for McBus {
    fn store(&self, w: usize, v: u64) {
        // In bounds: the mapping was checked against the geometry.
        let _ = self.tx.store_release::<u64>(w * 8, v);
    }
    fn load(&self, w: usize) -> u64 {
        self.rx.load_acquire::<u64>(w * 8).unwrap_or(0)
    }
    fn store_bytes(&self, w: usize, src: &[u8]) {
        // MEMORY CHANNEL's order: ascending aligned stores, each a release.
        let _ = self.tx.write_ordered(w * 8, src);
    }
    fn load_bytes(&self, w: usize, dst: &mut [u8]) {
        let _ = self.rx.read(w * 8, dst);
    }
    fn errors(&self) -> u64 {
        self.regs
            .as_ref()
            .map_or(0, |r| u64::from(r.rderrcnt()) + u64::from(r.hw_errcnt()) + u64::from(r.link_events()))
    }
    fn alive(&self, who: u64) -> Result<(), String> {
        let mut v = self.verdicts.lock().unwrap_or_else(|e| e.into_inner());
        match v.entry(who).or_default() {
            Some(why) => Err(why.clone()),
            None => Ok(()),
        }
    }
}

/// The prober thread: asks about every process someone waited on, until
/// told to stop.
fn probe_loop(verdicts: &Mutex<HashMap<u64, Option<String>>>, stop: &AtomicBool) {
    let mut imc: Option<Imc> = None;
    let mut away: HashMap<u64, Instant> = HashMap::new();
    while !stop.load(Ordering::Acquire) {
        let whos: Vec<u64> = {
            let v = verdicts.lock().unwrap_or_else(|e| e.into_inner());
            v.iter().filter(|(_, d)| d.is_none()).map(|(&w, _)| w).collect()
        };
        for who in whos {
            if let Some(why) = ask(&mut imc, who, &mut away) {
                verdicts.lock().unwrap_or_else(|e| e.into_inner()).insert(who, Some(why));
            }
        }
        std::thread::sleep(PROBE_EVERY);
    }
}

/// One probe: Some(why) once the process is gone.
fn ask(imc: &mut Option<Imc>, who: u64, away: &mut HashMap<u64, Instant>) -> Option<String> {
    let (node, pid) = ((who >> 32) as u32, who as u32);
    if imc.is_none() {
        let c = Imc::connect().ok()?;
        let _ = c.set_call_timeout(PROBE_TIMEOUT);
        *imc = Some(c);
    }
    match imc.as_ref()?.kill(&node.to_string(), pid as i32, 0) {
        Ok(()) => {
            away.remove(&who);
            None
        }
        Err(ImcError::Refused { code: Status::Errno, message }) => {
            Some(format!("process {pid} on node {node}: {message}"))
        }
        Err(ImcError::Refused { code: Status::NoHost, message }) => {
            let since = *away.entry(who).or_insert_with(Instant::now);
            (since.elapsed() > NODE_AWAY).then(|| format!("node {node} left the cluster ({message}) for {NODE_AWAY:?}"))
        }
        // imcd busy: decide nothing.
        Err(ImcError::Refused { .. }) => None,
        // A broken connection: the next probe connects again.
        Err(_) => {
            *imc = None;
            None
        }
    }
}
