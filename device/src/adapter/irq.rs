//! The adapter's interrupt state: causes, enables, the notification FIFO,
//! and the eventfds QEMU gave for INTx and MSI-X (or MSI, when the adapter
//! offers that instead: the same one vector, `msix` below) (`docs/adapter.md`,
//! "INT_CAUSE and INT_MASK bits").
//!
//! Lives behind `Shared::irq`, a mutex taken by the vfio-user thread
//! (registers, `SET_IRQS`) and by deliverers (notifications, errors); it is
//! the last lock taken and never held across anything that waits.

use std::collections::VecDeque;
use std::fs::File;
use std::io::Write;

use tracing::debug;

use super::faults::Faults;
use super::trace::{Event, Tracer};
use crate::vfio_user::IrqSet;
use std::sync::Arc;

/// Interrupt state: causes, enables, the notification FIFO and the eventfds
/// QEMU gave us for INTx and MSI-X.
#[derive(Default)]
pub(super) struct Irq {
    pub(super) cause: u32,
    pub(super) mask: u32,
    pub(super) fifo: VecDeque<u32>,
    pub(super) lost: u32,
    pub(super) intx: Option<File>,
    /// Masked by QEMU, or automasked after we asserted it until QEMU unmasks.
    pub(super) intx_masked: bool,
    pub(super) msix: Vec<Option<File>>,
    pub(super) msix_masked: Vec<bool>,
    pub(super) msix_pending: Vec<bool>,
    /// Error-recovery eventfd (kept so QEMU is satisfied; never signalled).
    pub(super) err: Option<File>,
    /// The adapter's trace (interrupts signalled).
    pub(super) trace: Arc<Tracer>,
    /// Injected faults (interrupts dropped or delayed).
    pub(super) faults: Arc<Faults>,
}

pub(super) fn kick(f: &File) {
    // An eventfd takes an 8-byte count; a full counter (EAGAIN) is still signalled.
    let _ = (&*f).write(&1u64.to_ne_bytes());
}

impl Irq {
    pub(super) fn pending(&self) -> u32 {
        self.cause & self.mask
    }

    pub(super) fn msix_enabled(&self) -> bool {
        self.msix.iter().any(Option::is_some)
    }

    /// Delivers the interrupt: MSI-X vector 0 when MSI-X is set up, else INTx.
    pub(super) fn signal(&mut self) {
        debug!(cause = self.cause, mask = self.mask, msix = self.msix_enabled(), "interrupt");
        if self.faults.drop_irq() {
            return;
        }
        let cause = self.pending();
        self.trace.record(|| Event::Irq { cause });
        if let Some(ms) = self.faults.delay_irq() {
            let to = if self.msix_enabled() { self.msix.first().and_then(Option::as_ref) } else { self.intx.as_ref() };
            if let Some(f) = to.and_then(|f| f.try_clone().ok()) {
                self.intx_masked |= !self.msix_enabled();
                std::thread::spawn(move || {
                    std::thread::sleep(std::time::Duration::from_millis(ms as u64));
                    kick(&f);
                });
            }
            return;
        }
        if self.msix_enabled() {
            if self.msix_masked.first().copied().unwrap_or(false) {
                self.msix_pending[0] = true;
            } else if let Some(f) = self.msix.first().and_then(Option::as_ref) {
                kick(f);
            }
        } else if !self.intx_masked {
            if let Some(f) = &self.intx {
                kick(f);
                // INTx is level-triggered: stay quiet until QEMU unmasks.
                self.intx_masked = true;
            }
        }
    }

    /// Re-evaluates after `cause` or `mask` changed from `before` (cause & mask).
    pub(super) fn update(&mut self, before: u32) {
        if self.pending() & !before != 0 {
            self.signal();
        }
    }

    /// Forgets every mask and pending vector (reset, new client).
    pub(super) fn unmask_all(&mut self) {
        self.intx_masked = false;
        self.msix_masked.iter_mut().for_each(|m| *m = false);
        self.msix_pending.iter_mut().for_each(|p| *p = false);
    }

    pub(super) fn raise(&mut self, bits: u32) {
        debug!(bits, cause = self.cause, mask = self.mask, "raise");
        let before = self.pending();
        self.cause |= bits;
        self.update(before);
    }
}

impl Irq {
    /// Carries out a vfio-user `SET_IRQS` request (eventfds, masks, triggers).
    pub(super) fn set_irqs(&mut self, req: IrqSet) {
        use crate::vfio_user::irq::*;
        let irq = self;
        let action = req.flags & (ACTION_MASK | ACTION_UNMASK | ACTION_TRIGGER);
        let eventfds = req.flags & DATA_EVENTFD != 0;
        let range = req.start as usize..(req.start + req.count) as usize;
        debug!(
            index = req.index,
            flags = req.flags,
            start = req.start,
            count = req.count,
            fds = req.fds.len(),
            "SET_IRQS"
        );
        match (req.index, action) {
            (INTX, ACTION_TRIGGER) if eventfds => irq.intx = req.fds.into_iter().next().map(File::from),
            (INTX, ACTION_TRIGGER) if req.count == 0 => irq.intx = None,
            (INTX, ACTION_TRIGGER) => {
                if let Some(f) = &irq.intx {
                    kick(f);
                }
            }
            (INTX, ACTION_MASK) => irq.intx_masked = true,
            (INTX, ACTION_UNMASK) if eventfds => {} // resample fds: not needed, we re-assert on unmask
            (INTX, ACTION_UNMASK) => {
                irq.intx_masked = false;
                if irq.pending() != 0 {
                    irq.signal();
                }
            }
            (MSI | MSIX, ACTION_TRIGGER) if eventfds => {
                let mut fds = req.fds.into_iter().map(File::from);
                for v in range {
                    irq.msix[v] = fds.next();
                }
            }
            (MSI | MSIX, ACTION_TRIGGER) if req.count == 0 => irq.msix.iter_mut().for_each(|f| *f = None),
            (MSI | MSIX, ACTION_TRIGGER) => {
                for v in range {
                    if let Some(f) = &irq.msix[v] {
                        kick(f);
                    }
                }
            }
            (MSI | MSIX, ACTION_MASK) | (MSI | MSIX, ACTION_UNMASK) => {
                let masked = action == ACTION_MASK;
                for v in range {
                    irq.msix_masked[v] = masked;
                    if !masked && std::mem::take(&mut irq.msix_pending[v]) {
                        if let Some(f) = &irq.msix[v] {
                            kick(f);
                        }
                    }
                }
            }
            (ERR, ACTION_TRIGGER) if eventfds => irq.err = req.fds.into_iter().next().map(File::from),
            _ => {}
        }
    }
}
