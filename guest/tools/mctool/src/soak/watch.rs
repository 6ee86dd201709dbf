//! The `watch` thread (the adapter's error count and members every 10 ms:
//! this node's outages and each other node's absences) and the status
//! file the main thread writes once a second.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::Shared;

pub(super) fn write_status(sh: &Shared, path: &Path, t0: Instant, done: bool) -> Result<()> {
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
pub(super) fn watch(sh: &Shared, regs: imc_client::Regs) -> Result<()> {
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
