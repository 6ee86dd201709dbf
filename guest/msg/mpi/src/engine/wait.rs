//! How a rank waits for progress: a few spins, then yields
//! (`MCMPI_YIELDS`; on the board `MCMPI_BOARD_YIELDS`, fewer when the host
//! is oversubscribed), then naps that lengthen while it waits (the policy
//! is UMP's, [`ump::backoff`]; the numbers of yields are MPI's).

use ump::backoff::backoff_until;

/// Idle polls that yield before a waiting rank starts to sleep
/// (`MCMPI_YIELDS`).
pub(super) fn yield_rounds() -> u32 {
    static ROUNDS: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *ROUNDS.get_or_init(|| {
        std::env::var("MCMPI_YIELDS").ok().and_then(|v| v.parse().ok()).unwrap_or(ump::backoff::DEFAULT_YIELDS)
    })
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
    *ROUNDS.get_or_init(|| match std::env::var("MCMPI_BOARD_YIELDS").ok().and_then(|v| v.parse().ok()) {
        Some(n) => n,
        None if ump::backoff::oversubscribed() => ump::backoff::OVERSUBSCRIBED_YIELDS,
        None => yield_rounds(),
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
