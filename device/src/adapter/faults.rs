//! Faults injected at the device, for a driver's error paths
//! (`docs/adapter.md`, "Testing a driver"). The hub's `link-down`,
//! `corrupt` and `delay` fault the network; these fault the adapter as a
//! driver sees it:
//! - the next N receive DMAs fail, as an unmapped IOVA does (RX_DMA, a
//!   count, the ERROR cause; nothing written);
//! - error bits of the driver's choice raised now;
//! - the next N interrupts dropped, or signalled late;
//! - the next N register and PCT reads return all ones, as from a device
//!   that fell off the bus;
//! - the next N transmit DMA descriptors complete with a given status.
//!
//! Each is armed by [`Fault`] and counted when it takes effect
//! ([`FaultCounts`], in the hub's `stats`).
//!
//! Threads: armed by the process serving the adapter (a hub control task);
//! taken by deliverers (receive DMA), the vfio-user thread (reads) and
//! whoever signals an interrupt or retires a descriptor.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use crate::regs::{dma::status, err};

/// Longest delay an interrupt can be given.
pub const MAX_DELAY_MS: u32 = 10_000;

/// One fault to arm (see the module header).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "fault", rename_all = "snake_case")]
pub enum Fault {
    /// The next `count` receive DMAs fail.
    RxDma {
        /// How many.
        count: u32,
    },
    /// Raise `bits` in ERR_STATUS now (one error counted, the ERROR cause).
    Error {
        /// `regs::err` bits.
        bits: u32,
    },
    /// The next `count` interrupts are not signalled.
    DropIrq {
        /// How many.
        count: u32,
    },
    /// The next `count` interrupts are signalled `ms` late.
    DelayIrq {
        /// How many.
        count: u32,
        /// Milliseconds (up to [`MAX_DELAY_MS`]).
        ms: u32,
    },
    /// The next `count` register and PCT reads return all ones.
    DeadReads {
        /// How many.
        count: u32,
    },
    /// The next `count` transmit DMA descriptors complete with `status`
    /// (nothing sent).
    DmaDesc {
        /// How many.
        count: u32,
        /// `regs::dma::status` code (not OK).
        status: u32,
    },
    /// Disarms every fault not taken yet.
    Clear,
}

impl Fault {
    /// Refuses a fault that cannot be: a zero count, no or undefined error
    /// bits, an undefined or OK status, a delay over [`MAX_DELAY_MS`].
    pub fn check(&self) -> Result<(), String> {
        let count = |c: u32| if c == 0 { Err("the count must be at least 1".to_string()) } else { Ok(()) };
        match *self {
            Fault::RxDma { count: c } | Fault::DropIrq { count: c } | Fault::DeadReads { count: c } => count(c),
            Fault::DelayIrq { count: c, ms } => {
                count(c)?;
                if ms == 0 || ms > MAX_DELAY_MS {
                    return Err(format!("the delay must be 1 to {MAX_DELAY_MS} ms, not {ms}"));
                }
                Ok(())
            }
            Fault::Error { bits } if bits == 0 || bits & !err::ALL != 0 => {
                Err(format!("error bits {bits:#x}: give defined bits of ERR_STATUS ({:#x})", err::ALL))
            }
            Fault::DmaDesc { count: c, status: s } => {
                count(c)?;
                if s == status::OK || status::name(s) == "unknown" {
                    return Err(format!("DMA status {s}: give a failure code of regs::dma::status"));
                }
                Ok(())
            }
            Fault::Error { .. } | Fault::Clear => Ok(()),
        }
    }
}

/// Faults that took effect, per kind, since the adapter was created.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultCounts {
    /// Receive DMAs failed.
    pub rx_dma: u64,
    /// Error injections.
    pub error: u64,
    /// Interrupts dropped.
    pub drop_irq: u64,
    /// Interrupts delayed.
    pub delay_irq: u64,
    /// Reads answered with all ones.
    pub dead_reads: u64,
    /// Descriptors failed.
    pub dma_desc: u64,
}

/// The armed faults of one adapter, and what they did.
#[derive(Default)]
pub struct Faults {
    rx_dma: AtomicU32,
    drop_irq: AtomicU32,
    delay_irq: AtomicU32,
    delay_ms: AtomicU32,
    dead_reads: AtomicU32,
    dma_desc: AtomicU32,
    dma_status: AtomicU32,
    done: [AtomicU64; 6],
}

/// Takes one armed occurrence of a fault: true if there was one.
fn take(a: &AtomicU32) -> bool {
    // Cheap when nothing is armed (the usual case): one load.
    a.load(Ordering::Relaxed) != 0 && a.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok()
}

impl Faults {
    /// Arms `f` (checked first). `Error` is not armed here: the caller
    /// raises its bits ([`super::Shared::raise_error`]) and counts it.
    pub(super) fn arm(&self, f: &Fault) -> Result<(), String> {
        f.check()?;
        match *f {
            Fault::RxDma { count } => self.rx_dma.store(count, Ordering::SeqCst),
            Fault::DropIrq { count } => self.drop_irq.store(count, Ordering::SeqCst),
            Fault::DelayIrq { count, ms } => {
                self.delay_ms.store(ms, Ordering::SeqCst);
                self.delay_irq.store(count, Ordering::SeqCst);
            }
            Fault::DeadReads { count } => self.dead_reads.store(count, Ordering::SeqCst),
            Fault::DmaDesc { count, status } => {
                self.dma_status.store(status, Ordering::SeqCst);
                self.dma_desc.store(count, Ordering::SeqCst);
            }
            Fault::Error { .. } => self.count(1),
            Fault::Clear => {
                for a in [&self.rx_dma, &self.drop_irq, &self.delay_irq, &self.dead_reads, &self.dma_desc] {
                    a.store(0, Ordering::SeqCst);
                }
            }
        }
        Ok(())
    }

    fn count(&self, i: usize) {
        self.done[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Takes one armed occurrence of `a` and counts it as kind `i`.
    fn hit(&self, a: &AtomicU32, i: usize) -> bool {
        let hit = take(a);
        if hit {
            self.count(i);
        }
        hit
    }

    /// A receive DMA about to be made fails.
    pub(super) fn rx_dma(&self) -> bool {
        self.hit(&self.rx_dma, 0)
    }

    /// An interrupt about to be signalled is dropped.
    pub(super) fn drop_irq(&self) -> bool {
        self.hit(&self.drop_irq, 2)
    }

    /// An interrupt about to be signalled is delayed: by how long.
    pub(super) fn delay_irq(&self) -> Option<u32> {
        self.hit(&self.delay_irq, 3).then(|| self.delay_ms.load(Ordering::SeqCst))
    }

    /// A read about to be answered returns all ones.
    pub(super) fn dead_read(&self) -> bool {
        self.hit(&self.dead_reads, 4)
    }

    /// A descriptor about to be sent fails: with this status.
    pub(super) fn dma_desc(&self) -> Option<u32> {
        self.hit(&self.dma_desc, 5).then(|| self.dma_status.load(Ordering::SeqCst))
    }

    /// What took effect so far.
    pub fn counts(&self) -> FaultCounts {
        let d = |i: usize| self.done[i].load(Ordering::Relaxed);
        FaultCounts { rx_dma: d(0), error: d(1), drop_irq: d(2), delay_irq: d(3), dead_reads: d(4), dma_desc: d(5) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fault_is_taken_as_many_times_as_armed_and_counted() {
        let f = Faults::default();
        assert!(!f.rx_dma());
        f.arm(&Fault::RxDma { count: 2 }).unwrap();
        assert!(f.rx_dma() && f.rx_dma() && !f.rx_dma());
        f.arm(&Fault::DelayIrq { count: 1, ms: 300 }).unwrap();
        assert_eq!((f.delay_irq(), f.delay_irq()), (Some(300), None));
        f.arm(&Fault::DmaDesc { count: 3, status: status::SRC_UNMAPPED }).unwrap();
        f.arm(&Fault::Clear).unwrap();
        assert_eq!(f.dma_desc(), None);
        assert_eq!(f.counts(), FaultCounts { rx_dma: 2, delay_irq: 1, ..FaultCounts::default() });
    }

    #[test]
    fn faults_that_cannot_be_are_refused_with_a_reason() {
        let bad = [
            (Fault::RxDma { count: 0 }, "at least 1"),
            (Fault::Error { bits: 0 }, "defined bits"),
            (Fault::Error { bits: 1 << 20 }, "defined bits"),
            (Fault::DelayIrq { count: 1, ms: MAX_DELAY_MS + 1 }, "1 to 10000 ms"),
            (Fault::DmaDesc { count: 1, status: status::OK }, "failure code"),
            (Fault::DmaDesc { count: 1, status: 99 }, "failure code"),
        ];
        for (f, why) in bad {
            let e = f.check().unwrap_err();
            assert!(e.contains(why), "{f:?}: {e}");
        }
        assert!(Fault::Error { bits: err::RX_DMA | err::CRC }.check().is_ok());
    }
}
