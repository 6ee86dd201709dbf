//! The imc commands: the TruCluster MEMORY CHANNEL API through imcd
//! (`imc-client`), as a C program would use `libimc`.

use std::io::Write;

use crate::raw::load64;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::signals::{stop_on_signals, STOP};

pub(crate) fn imc_status(e: imc_client::ImcError) -> anyhow::Error {
    match e {
        imc_client::ImcError::Refused { code, message } => anyhow::anyhow!("IMC_{code}: {message}"),
        e => e.into(),
    }
}

/// Longest wait for one increment of `imc-lock-test` to come back through
/// the hub (a store dropped while the link is down never does).
const STORE_WAIT: Duration = Duration::from_secs(10);

/// `imc-lock-test`: every wait has a deadline, and a counter that comes up
/// short is reported with the errors the adapters counted meanwhile (the
/// API's answer to writes dropped during an outage), never as success.
pub(crate) fn imc_lock_test(key: u64, procs: usize, rounds: u64, total: u64, timeout: u64) -> Result<()> {
    use imc_client::Imc;
    let counter_key = key + 1000;
    let limit = Duration::from_secs(timeout);
    let mut children = Vec::new();
    for p in 0..procs {
        // SAFETY: fork before any threads; the child only runs the loop below.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            bail!("fork: {}", std::io::Error::last_os_error());
        }
        if pid > 0 {
            children.push(pid);
            continue;
        }
        let mut errcheck: Option<(imc_client::Regs, u32)> = None;
        let r = (|| -> Result<u64> {
            let imc = Imc::connect()?;
            let regs = imc.regs()?;
            let before = regs.rderrcnt();
            let regs = &errcheck.insert((regs, before)).0;
            let errors = |what: String| {
                let k = regs.rderrcnt().wrapping_sub(before);
                anyhow::anyhow!("{what} (the adapters counted {k} errors during the run)")
            };
            let (set, _) = imc.lkalloc(key, 1, 0o666, false)?;
            // Coherent: every node has received the counter from the start.
            let (id, ..) = imc.asalloc_flags(counter_key, 8192, 0o666, false, true)?;
            let tx = imc.asattach_tx(id, true)?;
            let rx = imc.asattach_rx(id)?;
            let t_run = Instant::now();
            for round in 0..rounds {
                let left = limit.saturating_sub(t_run.elapsed());
                set.acquire(0, left).map_err(|e| errors(format!("round {round}: lock: {e}")))?;
                // A plain read-modify-write, safe only under the lock.
                let c = rx.load::<u64>(0)?;
                tx.store::<u64>(0, c + 1)?;
                let t0 = Instant::now();
                while load64(&rx, 0) != c + 1 {
                    if t0.elapsed() > STORE_WAIT {
                        let _ = set.release(0);
                        return Err(errors(format!(
                            "round {round}: our increment did not come back within {STORE_WAIT:?}: link down?"
                        )));
                    }
                    std::hint::spin_loop();
                }
                set.release(0)?;
            }
            let t0 = Instant::now();
            while total > 0 && load64(&rx, 0) < total && t0.elapsed() < limit {
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok(rx.load::<u64>(0)?)
        })();
        match r {
            Ok(seen) if total == 0 || seen == total => {
                println!("process {p}: counter {seen} exact");
                std::process::exit(0)
            }
            Ok(seen) => {
                let (regs, before) = errcheck.as_ref().expect("set before the counter is read");
                let mut now = *before;
                let moved = regs.ckerrcnt(&mut now);
                let k = now.wrapping_sub(*before);
                if seen < total && moved {
                    println!(
                        "process {p}: counter short by {}; the adapter counted {k} errors during the run",
                        total - seen
                    );
                } else {
                    println!("process {p}: counter {seen}, expected {total}; {k} errors counted during the run");
                }
                std::process::exit(1)
            }
            Err(e) => {
                println!("process {p}: {e:#}");
                std::process::exit(1)
            }
        }
    }
    let mut failed = 0;
    for pid in children {
        let mut st = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(pid, &mut st, 0) };
        if st != 0 {
            failed += 1;
        }
    }
    if failed > 0 {
        bail!("{failed} of {procs} processes failed");
    }
    Ok(())
}

/// `imc_kill`: signal `sig` to `pid` on `host` through the command relay.
pub(crate) fn kill(host: &str, pid: i32, sig: i32) -> Result<()> {
    let imc = imc_client::Imc::connect()?;
    imc.kill(host, pid, sig).map_err(imc_status)?;
    println!("IMC_SUCCESS signal {sig} sent to pid {pid} on {host}");
    Ok(())
}

/// Failure drill: imcd (with --test-hooks) stops dead mid-update.
pub(crate) fn drill(id: u32) -> Result<()> {
    let imc = imc_client::Imc::connect()?;
    imc.abandon_update(id).map_err(imc_status)?;
    bail!("imcd answered the drill: it should have stopped")
}

/// Reads the error count, waits, reports whether `imc_ckerrcnt` saw new errors.
pub(crate) fn check_errors(seconds: u64) -> Result<()> {
    let imc = imc_client::Imc::connect()?;
    let regs = imc.regs()?;
    let before = regs.rderrcnt();
    println!("error count {before}; waiting {seconds} s");
    std::io::stdout().flush()?;
    std::thread::sleep(Duration::from_secs(seconds));
    let mut errors = before;
    if regs.ckerrcnt(&mut errors) {
        println!("ckerrcnt: new errors (count now {errors})");
        Ok(())
    } else {
        bail!("ckerrcnt: no new errors");
    }
}

/// `imc_asalloc` of `key` with octal `mode`; holds it `hold` seconds.
pub(crate) fn alloc(key: u64, mode: &str, size: u64, coherent: bool, hold: u64) -> Result<()> {
    let mode = u32::from_str_radix(mode, 8).context("--mode is octal, like 600")?;
    let imc = imc_client::Imc::connect()?;
    let (id, first, pages, created) = imc.asalloc_flags(key, size, mode, false, coherent).map_err(imc_status)?;
    println!(
        "IMC_SUCCESS region {id} pages {first}..{} {}",
        first + pages,
        if created { "created" } else { "existing" }
    );
    if hold > 0 {
        std::io::stdout().flush()?;
        stop_on_signals();
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(hold) && !STOP.load(std::sync::atomic::Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(10));
        }
        imc.asdealloc(id).map_err(imc_status)?;
        println!("let go of region {id}");
    }
    Ok(())
}

/// The nodes running imcd, their names and the error count.
pub(crate) fn hosts() -> Result<()> {
    let imc = imc_client::Imc::connect()?;
    let regs = imc.regs()?;
    let hosts = imc.gethosts()?;
    let names: Vec<String> = hosts.iter().map(|(n, h)| format!("{n}={h}")).collect();
    println!(
        "hosts {:?} errors {} names {}",
        hosts.iter().map(|h| h.0).collect::<Vec<_>>(),
        regs.rderrcnt(),
        names.join(",")
    );
    Ok(())
}

fn created(c: bool) -> &'static str {
    if c {
        "created"
    } else {
        "existing"
    }
}

/// Allocates region `key`, attaches it for transmit, stores `value` into every word.
pub(crate) fn put(key: u64, size: u64, value: u64) -> Result<()> {
    let imc = imc_client::Imc::connect()?;
    let (id, first, pages, c) = imc.asalloc(key, size, 0o666, false)?;
    let tx = imc.asattach_tx(id, false)?;
    for off in (0..tx.len()).step_by(8) {
        tx.store::<u64>(off, value)?;
    }
    println!(
        "region {id} (key {key}, pages {first}..{}, {}): stored {value} into {} words",
        first + pages,
        created(c),
        tx.len() / 8
    );
    Ok(())
}

/// Allocates region `key`, attaches it for receive, waits until every word reads `value`.
pub(crate) fn get(key: u64, size: u64, value: u64, timeout: u64) -> Result<()> {
    let imc = imc_client::Imc::connect()?;
    let (id, first, pages, c) = imc.asalloc(key, size, 0o666, false)?;
    let rx = imc.asattach_rx(id)?;
    println!("region {id} (key {key}, pages {first}..{}, {}): waiting", first + pages, created(c));
    std::io::stdout().flush()?;
    let t0 = Instant::now();
    while (0..rx.len()).step_by(8).any(|off| load64(&rx, off) != value) {
        if t0.elapsed() > Duration::from_secs(timeout) {
            bail!("region {id} did not fill with {value} within {timeout} s");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    println!("all {} words read {value} after {:.1} ms", rx.len() / 8, t0.elapsed().as_secs_f64() * 1e3);
    Ok(())
}
