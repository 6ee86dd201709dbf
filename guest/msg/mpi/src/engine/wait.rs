//! How a rank waits for progress: a few spins, then yields
//! (`MCMPI_YIELDS`; on the board `MCMPI_BOARD_YIELDS`, fewer when the host
//! is oversubscribed), then naps that lengthen while it waits.

/// Idle polls a waiting rank spins through before it yields. With one CPU
/// the rank it waits for may be on the same CPU (two ranks in one guest of
/// one vCPU, the default), and every spin only delays it: a poll costs a
/// few µs under TCG, so 63 of them were most of an 8-byte message's time
/// inside one guest. A yield with nothing else to run costs ~8 µs.
pub(super) fn spin_rounds() -> u32 {
    static ROUNDS: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *ROUNDS.get_or_init(|| match std::thread::available_parallelism() {
        Ok(n) if n.get() == 1 => 1,
        _ => 64,
    })
}

/// Idle polls that yield before a waiting rank starts to sleep
/// (`MCMPI_YIELDS`).
pub(super) fn yield_rounds() -> u32 {
    static ROUNDS: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *ROUNDS.get_or_init(|| std::env::var("MCMPI_YIELDS").ok().and_then(|v| v.parse().ok()).unwrap_or(2048))
}

/// Idle polls that yield before a rank waiting on the job's board in a
/// blocking collective starts to sleep: `MCMPI_BOARD_YIELDS`, else 16 in
/// a guest whose host has fewer cores than its cluster's vCPUs
/// (`mc.oversubscribed=1` on the kernel command line, from `mc-cluster`),
/// else as for any wait. Every rank of the job may be waiting on the
/// board at once, and a rank that yields keeps its vCPU running: on an
/// oversubscribed host the rank it waits for may then get no core. 4
/// guests on 2 cores, median of 300 barriers: 2048 yields 1.8 ms, 16
/// 0.53 ms; 2 guests on 2 cores: 8-byte broadcast 46-65 us with 2048,
/// 127-147 us with 16.
pub(super) fn board_yield_rounds() -> u32 {
    static ROUNDS: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *ROUNDS.get_or_init(|| {
        let oversubscribed = || {
            std::fs::read_to_string("/proc/cmdline")
                .is_ok_and(|c| c.split_whitespace().any(|w| w == "mc.oversubscribed=1"))
        };
        match std::env::var("MCMPI_BOARD_YIELDS").ok().and_then(|v| v.parse().ok()) {
            Some(n) => n,
            None if oversubscribed() => 16,
            None => yield_rounds(),
        }
    })
}

/// Spins, then yields, then sleeps briefly: a waiting rank must not keep
/// a guest's only vCPU from the rank it waits for.
pub fn backoff(idle: &mut u32) {
    backoff_until(idle, yield_rounds())
}

/// [`backoff`] for a rank waiting in a blocking collective on the job's
/// board ([`board_yield_rounds`]).
pub fn board_backoff(idle: &mut u32) {
    backoff_until(idle, board_yield_rounds())
}

pub(super) fn backoff_until(idle: &mut u32, yields: u32) {
    *idle = idle.saturating_add(1);
    if *idle < spin_rounds() {
        std::hint::spin_loop();
    } else if *idle < yields {
        std::thread::yield_now();
    } else {
        std::thread::sleep(nap(*idle - yields));
    }
}

/// The sleep of a waiting rank's `n`th nap: 50 µs, doubled every
/// [`NAPS_PER_STEP`] naps up to 800 µs. A TCG guest pays ~0.4 ms of its
/// vCPU for each timer wake-up, so a rank that waits long (for a slow
/// rank, or in a barrier while two others exchange) must not keep its
/// host core busy waking up.
pub(super) fn nap(n: u32) -> std::time::Duration {
    std::time::Duration::from_micros(50 << (n / NAPS_PER_STEP).min(4))
}

/// Naps between two doublings of a waiting rank's sleep ([`nap`]).
pub(super) const NAPS_PER_STEP: u32 = 64;
