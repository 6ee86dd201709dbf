//! What a panic does to a host process of the cluster (`mc-adapter`,
//! `mc-hub`): it aborts the whole process, at once, after the usual
//! message. Installed by each binary's `main` before it starts a thread.
//!
//! A panic is a bug, and one that happens under the hub's order lock or an
//! adapter's state lock can leave them half-changed: a sequence number
//! taken and nothing delivered, a page half-programmed. Every later user
//! of a poisoned lock would panic in turn (`lock().unwrap()`), or, if it
//! recovered the lock, carry on with that state, and deliver out of order
//! or lose a write without a word: what MEMORY CHANNEL promises never to
//! do. A process that dies instead is what the cluster already survives:
//! the supervisor restarts a hub or an adapter that exits
//! (`launcher/src/supervisor/policy.rs`; `docs/faults.md`), and the other
//! nodes see a node fail and rejoin, as after a crash.
//!
//! Any thread (the hook runs on the thread that panicked).

/// Makes every later panic in this process abort it after printing the
/// panic's message and location (and a backtrace when `RUST_BACKTRACE`
/// asks), so that no thread carries on past another's panic.
pub fn abort_on_panic() {
    let print = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        print(info);
        eprintln!("{}: a panic is a bug; aborting the whole process (see device/src/fatal.rs)", process_name());
        std::process::abort();
    }));
}

fn process_name() -> String {
    std::env::args()
        .next()
        .and_then(|a| std::path::Path::new(&a).file_name().map(|f| f.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "process".into())
}
