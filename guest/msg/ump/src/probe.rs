//! Liveness of the processes at the far end of MEMORY CHANNEL channels,
//! found off the data path. One prober thread per process asks imcd, on a
//! connection of its own, whether each peer process is still there
//! (`imc_kill` with signal 0), every [`PROBE_EVERY`]; each channel's
//! waits only read the last verdict. imcd answers a remote probe by asking
//! the other node, and may be busy for seconds with a repair or a
//! coherent allocation: a reader or writer never waits for that.
//!
//! Touched by the prober thread (probes and writes verdicts) and by every
//! channel's reader and writer (read verdicts, through [`Probe::check`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use imc_client::{Imc, ImcError, Status};

/// How often each peer process is probed.
pub(crate) const PROBE_EVERY: Duration = Duration::from_millis(250);

/// Longest a probe waits for imcd's answer; a probe that gives up decides
/// nothing and the next one goes on a new connection.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the other side's node may be missing from imcd's table
/// before the other side counts as dead: longer than imcd's flap grace and
/// repair delay together (`imcd::daemon::Settings`), so a short link flap
/// never breaks a channel.
pub(crate) const NODE_AWAY: Duration = Duration::from_secs(4);

/// One channel's view of its peer: who it is (node << 32 | pid, 0 until
/// known) and, once found dead, why.
#[derive(Default)]
pub(crate) struct Probe {
    who: AtomicU64,
    dead: Mutex<Option<String>>,
}

impl Probe {
    /// The verdict so far on `who` (the channel's peer as it now reads it).
    pub(crate) fn check(&self, who: u64) -> Result<(), String> {
        self.who.store(who, Ordering::Relaxed);
        match &*self.dead.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(why) => Err(why.clone()),
            None => Ok(()),
        }
    }
}

/// The process's prober: hands out [`Probe`]s and runs the thread that
/// fills them in. Dropping it stops the thread (after its current probe).
pub(crate) struct Prober {
    probes: Arc<Mutex<Vec<Weak<Probe>>>>,
    stop: Arc<AtomicBool>,
}

impl Prober {
    /// Starts the prober thread.
    pub(crate) fn start() -> Prober {
        let probes: Arc<Mutex<Vec<Weak<Probe>>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (probes.clone(), stop.clone());
        // Without the thread, peers that die are found by timeouts only.
        let _ = std::thread::Builder::new().name("ump-probe".into()).spawn(move || run(&p, &s));
        Prober { probes, stop }
    }

    /// A probe for a new channel.
    pub(crate) fn probe(&self) -> Arc<Probe> {
        let p = Arc::new(Probe::default());
        self.probes.lock().unwrap_or_else(|e| e.into_inner()).push(Arc::downgrade(&p));
        p
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// The prober thread: probes every distinct peer of the live channels,
/// then sleeps.
fn run(probes: &Mutex<Vec<Weak<Probe>>>, stop: &AtomicBool) {
    let mut imc: Option<Imc> = None;
    // Since when each peer's node has been missing from imcd's table.
    let mut away: HashMap<u64, Instant> = HashMap::new();
    while !stop.load(Ordering::Acquire) {
        let live: Vec<Arc<Probe>> = {
            let mut v = probes.lock().unwrap_or_else(|e| e.into_inner());
            v.retain(|w| w.strong_count() > 0);
            v.iter().filter_map(Weak::upgrade).collect()
        };
        let mut asked: HashMap<u64, Option<String>> = HashMap::new();
        for p in &live {
            let who = p.who.load(Ordering::Relaxed);
            if who as u32 == 0 || p.dead.lock().unwrap_or_else(|e| e.into_inner()).is_some() {
                continue;
            }
            let verdict = asked.entry(who).or_insert_with(|| ask(&mut imc, who, &mut away));
            if let Some(why) = verdict {
                *p.dead.lock().unwrap_or_else(|e| e.into_inner()) = Some(why.clone());
            }
        }
        away.retain(|who, _| asked.contains_key(who));
        std::thread::sleep(PROBE_EVERY);
    }
}

/// Probes one peer process; `Some(why)` once it is dead.
fn ask(imc: &mut Option<Imc>, who: u64, away: &mut HashMap<u64, Instant>) -> Option<String> {
    let (node, pid) = ((who >> 32) as u32, who as u32);
    if imc.is_none() {
        *imc = Imc::connect().ok();
        if let Some(c) = imc.as_ref() {
            let _ = c.set_call_timeout(PROBE_TIMEOUT);
        }
    }
    let c = imc.as_ref()?;
    match c.kill(&node.to_string(), pid as i32, 0) {
        Err(ImcError::Refused { code: Status::Errno, message }) => {
            Some(format!("process {pid} on node {node}: {message}"))
        }
        // Its node is not in imcd's table: through a link flap that imcd
        // rides out, or for good. Dead once it has been away longer than
        // imcd takes to repair a node out.
        Err(ImcError::Refused { code: Status::NoHost, message }) => {
            let since = *away.entry(who).or_insert_with(Instant::now);
            (since.elapsed() > NODE_AWAY)
                .then(|| format!("process {pid} on node {node}: {message} (for {} s)", NODE_AWAY.as_secs()))
        }
        Ok(()) => {
            away.remove(&who);
            None
        }
        // imcd busy: do not guess. A connection that gave up or broke
        // cannot pair answers any more: the next probe connects afresh.
        Err(ImcError::Refused { .. }) => None,
        Err(_) => {
            *imc = None;
            None
        }
    }
}
