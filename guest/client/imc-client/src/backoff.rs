//! How a process that waits on MEMORY CHANNEL gives the CPU away: a few
//! spins, then yields, then naps that lengthen while it waits. UMP and the
//! layers above it (MPI, PVM) wait in their own loops, over many channels
//! and their own queues, and BBP on its billboard; all share this policy,
//! and each chooses how many yields come before the first nap (MPI:
//! `MCMPI_YIELDS`, PVM: `PVM_MC_YIELDS`, BBP: `BBP_YIELDS`).
//! No state of its own beyond two values read once; any thread.

use std::time::Duration;

/// Idle polls a waiting process spins through before it yields. With one
/// CPU the process it waits for may be on the same CPU (two ranks or
/// tasks in one guest of one vCPU, the default), and every spin only
/// delays it: a poll costs a few µs under TCG, so 63 of them were most of
/// an 8-byte message's time inside one guest. A yield with nothing else
/// to run costs ~8 µs.
pub fn spin_rounds() -> u32 {
    static ROUNDS: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *ROUNDS.get_or_init(|| match std::thread::available_parallelism() {
        Ok(n) if n.get() == 1 => 1,
        _ => 64,
    })
}

/// Idle polls that yield before a waiting process naps, unless the layer
/// says otherwise: a nap's timer wake-up costs a TCG guest at least
/// ~380 µs, more than a whole 8-byte round trip between guests, so a wait
/// that may end soon yields. 2,000 8-byte round trips between two guests
/// of a 4-guest cluster on 2 cores, median: 166–180 µs with 2,048 yields,
/// 429–528 with 16 (docs/mpi.md, "Waiting").
pub const DEFAULT_YIELDS: u32 = 2048;

/// Whether this guest's host has fewer cores than its cluster's vCPUs
/// (`mc.oversubscribed=1` on the kernel command line, from `mc-cluster`).
/// Read once.
pub fn oversubscribed() -> bool {
    static OVER: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OVER.get_or_init(|| {
        std::fs::read_to_string("/proc/cmdline").is_ok_and(|c| c.split_whitespace().any(|w| w == "mc.oversubscribed=1"))
    })
}

/// Yields before the first nap for a wait that every process of a job may
/// be in at once (a collective, a barrier) on an [`oversubscribed`] host:
/// a process that yields keeps its vCPU running, and the one it waits for
/// may then get no core (4 guests on 2 cores, MPI's barrier: 1.8 ms with
/// [`DEFAULT_YIELDS`], 0.53 ms with 16).
pub const OVERSUBSCRIBED_YIELDS: u32 = 16;

/// The `idle`th poll of a wait that has found nothing: spins first, yields
/// until `yields` polls, then sleeps ([`nap`]). Counts `idle` up.
pub fn backoff_until(idle: &mut u32, yields: u32) {
    *idle = idle.saturating_add(1);
    if *idle < spin_rounds() {
        std::hint::spin_loop();
    } else if *idle < yields {
        std::thread::yield_now();
    } else {
        std::thread::sleep(nap(*idle - yields));
    }
}

/// The sleep of a waiting process's `n`th nap: 50 µs, doubled every
/// [`NAPS_PER_STEP`] naps up to 800 µs. A TCG guest pays ~0.4 ms of its
/// vCPU for each timer wake-up, so a process that waits long must not
/// keep its host core busy waking up.
pub fn nap(n: u32) -> Duration {
    Duration::from_micros(50 << (n / NAPS_PER_STEP).min(4))
}

/// Naps between two doublings of a waiting process's sleep ([`nap`]).
pub const NAPS_PER_STEP: u32 = 64;

#[cfg(test)]
mod tests {
    use super::*;

    /// A waiting process naps 50 µs at first and at most 800 µs.
    #[test]
    fn naps_lengthen_while_a_process_waits() {
        let us = |n| nap(n).as_micros();
        assert_eq!((us(0), us(NAPS_PER_STEP - 1)), (50, 50));
        assert_eq!((us(NAPS_PER_STEP), us(2 * NAPS_PER_STEP)), (100, 200));
        assert_eq!((us(4 * NAPS_PER_STEP), us(u32::MAX)), (800, 800));
    }

    /// Spins and yields return at once; the first poll past `yields` naps.
    #[test]
    fn a_wait_naps_only_after_its_yields() {
        let mut idle = 0;
        let t = std::time::Instant::now();
        for _ in 0..10 {
            backoff_until(&mut idle, 100);
        }
        assert_eq!(idle, 10);
        let mut late = 100;
        backoff_until(&mut late, 100);
        assert!(t.elapsed() >= nap(0), "the 101st poll sleeps {:?}", nap(0));
    }
}
