//! Signal handling of the long-running commands: SIGTERM/SIGINT stop a
//! receiver cleanly ([`STOP`]); `wait-signal` waits for SIGUSR1/SIGUSR2
//! (the target of `imc-kill`). Touched by the main thread and the handlers.

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

/// Set by SIGTERM/SIGINT: the receiver disables its pages, then exits.
pub(crate) static STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_stop(_: libc::c_int) {
    STOP.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// SIGTERM and SIGINT set [`STOP`].
pub(crate) fn stop_on_signals() {
    // SAFETY: installing an async-signal-safe handler (it only stores an atomic).
    unsafe {
        libc::signal(libc::SIGTERM, on_stop as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_stop as *const () as libc::sighandler_t);
    }
}

/// The last signal `wait-signal` caught.
pub(crate) static CAUGHT: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

extern "C" fn on_caught(sig: libc::c_int) {
    CAUGHT.store(sig, std::sync::atomic::Ordering::SeqCst);
}

/// Waits up to `timeout` s for SIGUSR1 or SIGUSR2 (the target of imc_kill tests).
pub(crate) fn wait_signal(timeout: u64) -> Result<()> {
    // SAFETY: installing an async-signal-safe handler (it only stores an atomic).
    unsafe {
        libc::signal(libc::SIGUSR1, on_caught as *const () as libc::sighandler_t);
        libc::signal(libc::SIGUSR2, on_caught as *const () as libc::sighandler_t);
    }
    println!("pid {} waiting for a signal", std::process::id());
    std::io::stdout().flush()?;
    let t0 = Instant::now();
    while CAUGHT.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        if t0.elapsed() > Duration::from_secs(timeout) {
            bail!("no signal within {timeout} s");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    println!("got signal {}", CAUGHT.load(std::sync::atomic::Ordering::SeqCst));
    Ok(())
}
