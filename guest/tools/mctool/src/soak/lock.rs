//! The `lock` thread: increments of one coherent counter under a cluster
//! spinlock (`imc_lkacquire`), with this node's tally of confirmed and
//! in-doubt increments published next to it for the driver to check.

use std::time::{Duration, Instant};

use anyhow::Result;
use serde::Serialize;
use testkit::soak::Tally;

use super::{open_retrying, Region, Shared, KEY};

/// This workload's figures in the status file.
#[derive(Debug, Default, Clone, Serialize)]
pub(super) struct Lock {
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

/// Longest wait for an increment to come back through the hub.
const STORE_WAIT: Duration = Duration::from_secs(10);

pub(super) fn lock(sh: &Shared, tick: impl Fn()) -> Result<()> {
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
pub(super) fn tally_words(sh: &Shared, r: &Region) -> Vec<u64> {
    (0..sh.nodes * testkit::soak::TALLY_SLOTS).map(|k| r.load(testkit::soak::TALLIES + 8 * k)).collect()
}

/// Offset of the views in the counter region: word n is node n's
/// (tick, stale, counter as it sees it), republished every 100 ms or so.
const VIEWS: usize = 512;

pub(super) fn publish_view(sh: &Shared, r: &Region, tick: &mut u64, fresh: bool) {
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
pub(super) fn refresh(sh: &Shared, r: &Region, tick: &mut u64) -> bool {
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
