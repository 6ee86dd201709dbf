//! Admission of connections the hub does not trust yet: a [`Gate`] caps how
//! many are open at once (link connections before their `Hello`, control
//! connections) and counts those closed at the door.
//!
//! Touched by the accept loops (tokio tasks) and by the connection tasks,
//! which hold a [`Slot`] until they are trusted or closed; lock-free.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

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
