//! Admission of connections the hub does not trust yet: a [`Gate`] caps how
//! many are open at once (link connections before their `Hello`, control
//! connections) and counts those closed at the door; what every listener
//! does when `accept()` fails or a gate is full; and the source of the
//! challenges a TCP connection must answer ([`NonceSource`]).
//!
//! Touched by the accept loops (tokio tasks) and by the connection tasks,
//! which hold a [`Slot`] until they are trusted or closed; lock-free but
//! for the nonce source's own mutex.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use link::AUTH_LEN;
use tracing::{debug, warn};

/// A capped count of open connections of one kind.
#[derive(Debug)]
pub(crate) struct Gate {
    cap: usize,
    open: AtomicUsize,
    closed: AtomicU64,
}

/// One admitted connection: its place is given back when dropped.
#[derive(Debug)]
pub(crate) struct Slot(Arc<Gate>);

impl Gate {
    /// A gate letting at most `cap` connections in at once.
    pub fn new(cap: usize) -> Arc<Gate> {
        Arc::new(Gate { cap, open: AtomicUsize::new(0), closed: AtomicU64::new(0) })
    }

    /// Takes a place, or counts a connection closed at the door (`None`)
    /// when all `cap` places are taken.
    pub fn enter(self: &Arc<Self>) -> Option<Slot> {
        let cap = self.cap;
        match self.open.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < cap).then_some(n + 1)) {
            Ok(_) => Some(Slot(self.clone())),
            Err(_) => {
                self.closed.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Connections in now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Connections closed at the door so far.
    pub fn closed(&self) -> u64 {
        self.closed.load(Ordering::Relaxed)
    }

    /// The cap.
    pub fn cap(&self) -> usize {
        self.cap
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Pause after a failed `accept()` (out of fds and the like): every listener
/// of the hub backs off and keeps serving, never gives up.
pub(crate) const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Logs a failed `accept()` on the `what` listener and backs off.
pub(crate) async fn accept_failed(what: &str, e: &std::io::Error) {
    warn!("{what} accept failed: {e}");
    tokio::time::sleep(ACCEPT_BACKOFF).await;
}

/// Logs a connection on the `what` listener closed at once because `gate`
/// was full: the first, then each time the count doubles, so a flood is
/// seen in the log without flooding it.
pub(crate) fn closed_at_door(what: &str, gate: &Gate) {
    let n = gate.closed();
    if n.is_power_of_two() {
        warn!("{what}: connection closed at once: {} already open, the cap ({n} closed so far)", gate.cap());
    } else {
        debug!("{what}: connection closed at once ({n} so far)");
    }
}

/// The kernel's random source for authentication challenges, opened once
/// (on first use) and kept: a challenge costs no file descriptor, so a hub
/// out of descriptors still authenticates; if it cannot be opened, the one
/// connection that needed it is refused with the error.
#[derive(Debug, Default)]
pub(crate) struct NonceSource(std::sync::Mutex<Option<std::fs::File>>);

impl NonceSource {
    /// 32 random bytes for one challenge.
    pub fn nonce(&self) -> std::io::Result<[u8; AUTH_LEN]> {
        let mut n = [0u8; AUTH_LEN];
        let mut guard = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let f = match &mut *guard {
            Some(f) => f,
            slot => slot.insert(
                std::fs::File::open("/dev/urandom")
                    .map_err(|e| std::io::Error::new(e.kind(), format!("cannot open /dev/urandom: {e}")))?,
            ),
        };
        std::io::Read::read_exact(f, &mut n)
            .map_err(|e| std::io::Error::new(e.kind(), format!("cannot read /dev/urandom: {e}")))?;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gate_caps_and_gives_places_back() {
        let g = Gate::new(2);
        let a = g.enter().expect("first");
        let b = g.enter().expect("second");
        assert!(g.enter().is_none());
        assert_eq!((g.open(), g.closed()), (2, 1));
        drop(a);
        let c = g.enter().expect("a place was given back");
        assert_eq!((g.open(), g.closed()), (2, 1));
        drop((b, c));
        assert_eq!(g.open(), 0);
    }
}
