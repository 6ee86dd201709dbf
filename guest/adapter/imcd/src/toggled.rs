//! Two-copy records in MEMORY CHANNEL space: how the clusterwide descriptors
//! (seed 000: CRD/HRD/PRD for regions, CLD/HLD/PLD for spinlock sets)
//! survive a node that dies in the middle of updating one.
//!
//! # Layout (words of an [`OrderedBus`])
//!
//! ```text
//! word 0              1 .. 1+W            1+W .. 1+2W
//! +------------------+-------------------+-------------------+
//! | toggle           | copy 0 (W words)  | copy 1 (W words)  |
//! +------------------+-------------------+-------------------+
//! toggle = generation << 1 | index of the valid copy
//! ```
//!
//! A writer (holding the descriptor's cluster spinlock) fills the copy that is
//! *not* valid, then stores a new toggle in one 8-byte store. The hub orders
//! the copy's words before the toggle on every node, so a reader never finds
//! a toggle pointing at a half-written copy. A writer that dies before its
//! toggle store leaves the old copy valid: nothing is lost, and
//! [`Toggled::repair`] makes the two copies equal again. Readers check the
//! toggle before and after reading a copy and retry if it moved (a seqlock),
//! so a read that overlaps a write is never torn.

use std::time::{Duration, Instant};

use imc_client::cluster_lock::{OrderedBus, RESEND};

/// A two-copy record of `words` 8-byte words over an [`OrderedBus`] whose
/// slots are the words `0 ..= 2 * words`.
pub struct Toggled<B: OrderedBus> {
    bus: B,
    words: usize,
}

/// Why an update did not complete.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToggleError {
    /// The record does not fit the bus.
    #[error("a record of {words} words needs {needed} bus words, the bus has {have}")]
    TooBig {
        /// Words per copy.
        words: usize,
        /// Words needed.
        needed: usize,
        /// Words available.
        have: usize,
    },
    /// Data of the wrong length.
    #[error("record is {expected} words, got {got}")]
    BadLength {
        /// Words per copy.
        expected: usize,
        /// Words given.
        got: usize,
    },
    /// Our toggle store did not come back: the link is down.
    #[error("our toggle did not come back within {0:?}: is the link down?")]
    NoLoopback(Duration),
}

impl<B: OrderedBus> Toggled<B> {
    /// A record of `words` words per copy.
    pub fn new(bus: B, words: usize) -> Result<Self, ToggleError> {
        let needed = 1 + 2 * words;
        if needed > bus.slots() {
            return Err(ToggleError::TooBig { words, needed, have: bus.slots() });
        }
        Ok(Toggled { bus, words })
    }

    fn copy_base(&self, index: u64) -> usize {
        1 + index as usize * self.words
    }

    /// The valid copy, consistent (retries while a write overlaps).
    pub fn read(&self) -> Vec<u64> {
        loop {
            let t1 = self.bus.load(0);
            let base = self.copy_base(t1 & 1);
            let data: Vec<u64> = (0..self.words).map(|i| self.bus.load(base + i)).collect();
            if self.bus.load(0) == t1 {
                return data;
            }
        }
    }

    /// The generation of the valid copy (0 before the first write).
    pub fn generation(&self) -> u64 {
        self.bus.load(0) >> 1
    }

    /// Writes `data` as the new valid copy. Call with the record's cluster
    /// lock held; returns once our toggle came back (every node that
    /// receives has the new copy before it sees the toggle).
    pub fn write(&self, data: &[u64], timeout: Duration) -> Result<(), ToggleError> {
        if data.len() != self.words {
            return Err(ToggleError::BadLength { expected: self.words, got: data.len() });
        }
        let t = self.bus.load(0);
        let target = (t & 1) ^ 1;
        let base = self.copy_base(target);
        for (i, &w) in data.iter().enumerate() {
            self.bus.store(base + i, w);
        }
        let next = ((t >> 1) + 1) << 1 | target;
        self.bus.store(0, next);
        let t0 = Instant::now();
        let mut sent = t0;
        while self.bus.load(0) != next {
            let now = Instant::now();
            if now.duration_since(t0) > timeout {
                return Err(ToggleError::NoLoopback(t0.elapsed()));
            }
            if now.duration_since(sent) >= RESEND {
                // Lost to us alone (a corrupted frame back to us): the copy
                // and the toggle again, the same values, so a node that has
                // them sees no change and one that missed a word gets it.
                for (i, &w) in data.iter().enumerate() {
                    self.bus.store(base + i, w);
                }
                self.bus.store(0, next);
                sent = now;
            }
            std::hint::spin_loop();
        }
        Ok(())
    }

    /// After a writer died mid-update: copy the valid copy over the other
    /// one (call with the record's lock held). Readers are never affected;
    /// this only makes both copies equal again.
    pub fn repair(&self) {
        let t = self.bus.load(0);
        let (valid, other) = (self.copy_base(t & 1), self.copy_base((t & 1) ^ 1));
        for i in 0..self.words {
            self.bus.store(other + i, self.bus.load(valid + i));
        }
    }

    /// Writes the first half of the invalid copy with junk and stops, as
    /// a writer dying mid-update would (failure drills only).
    pub fn write_half_for_drill(&self) {
        let base = self.copy_base((self.bus.load(0) & 1) ^ 1);
        for i in 0..self.words / 2 {
            self.bus.store(base + i, 0xDEAD_0000 + i as u64);
        }
    }

    /// The copy that is not valid (for tests and repair diagnostics).
    pub fn shadow(&self) -> Vec<u64> {
        let base = self.copy_base((self.bus.load(0) & 1) ^ 1);
        (0..self.words).map(|i| self.bus.load(base + i)).collect()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::thread;

    use super::*;
    use imc_client::cluster_lock::sim::SimCluster;

    const W: usize = 6;

    fn settle(t: &Toggled<impl OrderedBus>, generation: u64) {
        let t0 = Instant::now();
        while t.generation() != generation {
            assert!(t0.elapsed() < Duration::from_secs(5), "generation {generation} never arrived");
            thread::yield_now();
        }
    }

    #[test]
    fn writes_reach_every_node_whole() {
        let cluster = SimCluster::with_slots(4, 1 + 2 * W, Duration::from_micros(30), 5);
        let writer = Toggled::new(cluster.node(0), W).unwrap();
        let readers: Vec<_> = (1..4).map(|n| Toggled::new(cluster.node(n), W).unwrap()).collect();
        assert_eq!(writer.read(), vec![0; W]);
        for g in 1..=20u64 {
            writer.write(&[g; W], Duration::from_secs(5)).unwrap();
        }
        for r in &readers {
            settle(r, 20);
            assert_eq!(r.read(), vec![20; W]);
        }
        assert!(matches!(writer.write(&[1; 3], Duration::from_secs(1)), Err(ToggleError::BadLength { .. })));
        assert!(matches!(Toggled::new(cluster.node(0), 2 * W), Err(ToggleError::TooBig { .. })));
    }

    /// A toggle lost to the writer alone is stored again with its copy:
    /// the write ends at once, not at its timeout.
    #[test]
    fn a_toggle_lost_to_the_writer_alone_is_sent_again() {
        let cluster = SimCluster::with_slots(3, 1 + 2 * W, Duration::ZERO, 8);
        let writer = Toggled::new(cluster.node(0), W).unwrap();
        // The copy's words and the toggle: the toggle is the last of them.
        cluster.corrupt(0, W as u64 + 1);
        let t0 = Instant::now();
        writer.write(&[7; W], Duration::from_secs(10)).unwrap();
        assert!(t0.elapsed() < Duration::from_secs(2), "the write waited {:?}", t0.elapsed());
        assert_eq!(writer.read(), vec![7; W], "the writer's own copy is whole");
        let reader = Toggled::new(cluster.node(1), W).unwrap();
        settle(&reader, 1);
        assert_eq!(reader.read(), vec![7; W]);
    }

    #[test]
    fn reads_overlapping_writes_are_never_torn() {
        let cluster = SimCluster::with_slots(3, 1 + 2 * W, Duration::from_micros(20), 6);
        let writer = Toggled::new(cluster.node(0), W).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = (1..3)
            .map(|n| {
                let r = Toggled::new(cluster.node(n), W).unwrap();
                let stop = stop.clone();
                thread::spawn(move || {
                    let mut reads = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let rec = r.read();
                        // Every record written has all words equal.
                        assert!(rec.iter().all(|&w| w == rec[0]), "torn read: {rec:?}");
                        reads += 1;
                    }
                    reads
                })
            })
            .collect();
        for g in 1..=300u64 {
            writer.write(&[g; W], Duration::from_secs(5)).unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        for r in readers {
            assert!(r.join().unwrap() > 0);
        }
    }

    #[test]
    fn writer_dying_mid_update_loses_nothing_and_is_repaired() {
        let cluster = SimCluster::with_slots(2, 1 + 2 * W, Duration::ZERO, 8);
        let writer = Toggled::new(cluster.node(0), W).unwrap();
        writer.write(&[7; W], Duration::from_secs(5)).unwrap();
        // The writer dies after half of its next copy and before its toggle.
        let bus = cluster.node(0);
        let shadow_base = 1 + ((bus.load(0) & 1) ^ 1) as usize * W;
        for i in 0..W / 2 {
            bus.store(shadow_base + i, 99);
        }
        let survivor = Toggled::new(cluster.node(1), W).unwrap();
        let t0 = Instant::now();
        while survivor.shadow()[..W / 2] != [99; W / 2] {
            assert!(t0.elapsed() < Duration::from_secs(5));
            thread::yield_now();
        }
        // Readers still see the last complete record.
        assert_eq!(survivor.read(), vec![7; W]);
        assert_eq!(survivor.generation(), 1);
        // Repair makes both copies equal; the next write works as usual.
        survivor.repair();
        let t0 = Instant::now();
        while survivor.shadow() != vec![7; W] {
            assert!(t0.elapsed() < Duration::from_secs(5));
            thread::yield_now();
        }
        survivor.write(&[8; W], Duration::from_secs(5)).unwrap();
        assert_eq!(survivor.read(), vec![8; W]);
        assert_eq!(survivor.generation(), 2);
    }
}
