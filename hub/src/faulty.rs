//! Faults on purpose at a local port: a decorator over its adapter's
//! receiving side ([`Downlink`]), so the ordering step only ever delivers.
//!
//! - **Corruption** (`corrupt N`): the next N frames reach the adapter as
//!   frames that failed their CRC, counted by the adapter ([`Downlink::bad_crc`])
//!   and in the port's `corrupted`, never applied.
//! - **Delay** (`delay MICROS`): while a delay is set, or frames are still
//!   held, every event for the port (writes and membership changes) joins
//!   the port's queue instead of being applied, and the port's own thread
//!   (`held-node<N>`, started the first time) applies them in order, each
//!   one the delay after the last: a slow receiver. Only this port's
//!   deliveries wait; the ordering step goes on for everyone else. ACK
//!   answers of held writes are put into the order by that thread, as a
//!   remote adapter sends its answers back over its link.
//!
//! The queue holds at most `cap` frames of other nodes' writes (the hub's
//! `queue_depth`): beyond it [`Faulty::has_room`] is false, and writers to the
//! port wait for room as they do for a link port's queue. The node's own
//! loopback writes and ACK answers may go up to twice that, so the thread
//! that answers never waits for room it alone makes. Membership events are
//! never refused. Frames still held when the port leaves are lost with the
//! link.
//!
//! Threads: the ordering step calls [`Downlink`]'s methods (under the order
//! lock, one at a time); the holder thread applies held events; control
//! requests set the delay and the corruption count in the port's
//! [`PortCtl`]. The queue's sender is behind a mutex taken after the order
//! lock and never held while waiting.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use device::uplink::{AckReply, Downlink, LinkInfo, Uplink};
use tracing::warn;

use crate::port::PortCtl;

/// One event held for the port.
enum Held {
    Deliver { seq: u64, src: u16, flags: u16, addr: u64, data: Vec<u8> },
    Member { seq: u64, node: u16, up: bool },
}

/// A local port's adapter as the ordering step sees it: faults on purpose
/// in front of the adapter's own receiving side.
pub(crate) struct Faulty {
    node: u16,
    dev: Arc<dyn Downlink>,
    ctl: Arc<PortCtl>,
    /// Where ACK answers of held writes go: the node's own uplink.
    answers: Arc<dyn Uplink>,
    /// Frames of other nodes held at most (then writers wait for room).
    cap: usize,
    /// The holder thread's queue, once it is started.
    queue: Mutex<Option<mpsc::Sender<Held>>>,
    /// The link went down: what is still held is lost.
    gone: Arc<AtomicBool>,
}

impl Faulty {
    pub(crate) fn new(
        node: u16,
        dev: Arc<dyn Downlink>,
        ctl: Arc<PortCtl>,
        answers: Arc<dyn Uplink>,
        cap: usize,
    ) -> Faulty {
        Faulty {
            node,
            dev,
            ctl,
            answers,
            cap: cap.max(1),
            queue: Mutex::new(None),
            gone: Arc::new(AtomicBool::new(false)),
        }
    }

    /// False when a write of node `src` must wait before it is ordered:
    /// the port holds as many frames as it may.
    pub(crate) fn has_room(&self, src: u16) -> bool {
        let cap = if src == self.node { 2 * self.cap } else { self.cap };
        self.ctl.held.load(Ordering::Acquire) < cap
    }

    /// True when `ev` must wait its turn in the queue.
    fn holds(&self) -> bool {
        self.ctl.held.load(Ordering::Acquire) > 0 || self.ctl.delay().is_some()
    }

    /// Puts `ev` at the end of the queue (starting the holder thread the
    /// first time). If the thread cannot be started, `ev` is applied now.
    fn hold(&self, ev: Held) -> Option<AckReply> {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        if q.is_none() {
            match self.spawn_holder() {
                Ok(tx) => *q = Some(tx),
                Err(e) => {
                    warn!(node = self.node, "cannot start the thread that holds frames back: {e}; not delayed");
                    return apply(&*self.dev, &self.ctl, ev);
                }
            }
        }
        self.ctl.held.fetch_add(1, Ordering::AcqRel);
        let tx = q.as_ref().expect("started above");
        if let Err(mpsc::SendError(ev)) = tx.send(ev) {
            // The thread is gone (it never exits while we hold its queue).
            self.ctl.held.fetch_sub(1, Ordering::AcqRel);
            return apply(&*self.dev, &self.ctl, ev);
        }
        None
    }

    fn spawn_holder(&self) -> std::io::Result<mpsc::Sender<Held>> {
        let (tx, rx) = mpsc::channel::<Held>();
        let (dev, ctl, answers, gone) = (self.dev.clone(), self.ctl.clone(), self.answers.clone(), self.gone.clone());
        std::thread::Builder::new().name(format!("held-node{}", self.node)).spawn(move || {
            while let Ok(ev) = rx.recv() {
                let taken = Instant::now();
                while let Some(left) = ctl.hold_left(taken) {
                    if gone.load(Ordering::Acquire) {
                        break;
                    }
                    std::thread::sleep(left);
                }
                let answer = if gone.load(Ordering::Acquire) { None } else { apply(&*dev, &ctl, ev) };
                // Taken off only once applied: an event ordered meanwhile
                // joins the queue behind it, never overtakes it.
                ctl.held.fetch_sub(1, Ordering::AcqRel);
                ctl.room.notify_waiters();
                if let Some(a) = answer {
                    // Lost only if this node left meanwhile, as the answer
                    // of a remote adapter whose link went down.
                    let _ = answers.send(&a.write());
                }
            }
        })?;
        Ok(tx)
    }
}

/// Delivers one write to the adapter, unless it is to be corrupted: then
/// the adapter counts a frame that failed its CRC.
fn deliver_now(
    dev: &dyn Downlink,
    ctl: &PortCtl,
    seq: u64,
    src: u16,
    flags: u16,
    addr: u64,
    data: &[u8],
) -> Option<AckReply> {
    if ctl.take_corrupt() {
        ctl.stats.corrupted.fetch_add(1, Ordering::Relaxed);
        dev.bad_crc();
        return None;
    }
    dev.deliver(seq, src, flags, addr, data)
}

/// Applies one held event to the adapter.
fn apply(dev: &dyn Downlink, ctl: &PortCtl, ev: Held) -> Option<AckReply> {
    match ev {
        Held::Deliver { seq, src, flags, addr, data } => deliver_now(dev, ctl, seq, src, flags, addr, &data),
        Held::Member { seq, node, up } => {
            dev.member(seq, node, up);
            None
        }
    }
}

impl Downlink for Faulty {
    fn deliver(&self, seq: u64, src: u16, flags: u16, addr: u64, data: &[u8]) -> Option<AckReply> {
        if self.holds() {
            return self.hold(Held::Deliver { seq, src, flags, addr, data: data.to_vec() });
        }
        deliver_now(&*self.dev, &self.ctl, seq, src, flags, addr, data)
    }

    fn bad_crc(&self) {
        self.dev.bad_crc();
    }

    fn member(&self, seq: u64, node: u16, up: bool) {
        if self.holds() {
            self.hold(Held::Member { seq, node, up });
        } else {
            self.dev.member(seq, node, up);
        }
    }

    fn link_up(&self, info: &LinkInfo) {
        self.dev.link_up(info);
    }

    fn link_down(&self, reason: &str) {
        self.gone.store(true, Ordering::Release);
        self.dev.link_down(reason);
    }
}

impl Drop for Faulty {
    fn drop(&mut self) {
        // The holder thread ends once its queue is closed; what it still
        // holds is not applied.
        self.gone.store(true, Ordering::Release);
    }
}
