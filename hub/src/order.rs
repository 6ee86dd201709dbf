//! The global order: the one lock every write of every node passes through,
//! the ports it fans out to, and membership events.
//!
//! Owns [`Order`]: the order lock ([`Order::state`], the ports and the next
//! sequence number), the capture and the counters a step keeps. Threads
//! that take the lock: the vfio-user threads of local guests (their
//! stores), the tokio tasks reading link ports (remote adapters' writes),
//! a delayed local port's holder thread (the answers of held ACK stores),
//! joins and leaves of both kinds, and control requests that take a local
//! port down or up.
//!
//! One ordering step ([`Order::try_order`]) numbers a write and, under the
//! lock, queues it on every receiving link port and hands it to every
//! receiving local port's adapter: the numbering thread is the delivering
//! thread for local ports, so a store reaches another guest on this host in
//! one hop. Nothing in a step waits: a port without room (a link port's
//! queue, a delayed local port's held frames) makes the step return
//! [`Step::Full`] before anything is numbered, and the caller waits for room
//! with the lock released. Steps are driven by one machine
//! ([`Order::advance`] over a [`Writing`]: the write, then the ACK answers it
//! made); a link port's task ([`Order::write`]) and a local port's thread
//! ([`Order::write_blocking`]) differ only in how they wait.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use device::uplink::{AckReply, Downlink, UplinkError, WritePacket};
use link::{Msg, BROADCAST, FLAG_LOOPBACK};
use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::capture::Capture;
use crate::faulty::Faulty;
use crate::observe::Observe;
use crate::port::{Frame, PortCtl, MEMBER_ROOM};
/// Longest wait for room before a writer looks again (a writer's room
/// signal can come between the step that found no room and the wait).
const ROOM_POLL: Duration = Duration::from_millis(1);

/// How a port reaches its node.
pub(crate) enum PortKind {
    /// A remote adapter over a socket: frames go into its writer's queue.
    Link(mpsc::Sender<Frame>),
    /// A guest whose adapter this hub serves: writes are applied to its
    /// memory by the ordering thread, through the port's faults on purpose.
    Local(Arc<Faulty>),
}

pub(crate) struct Port {
    pub ctl: Arc<PortCtl>,
    pub kind: PortKind,
    /// Cut off (stalled): skip it until its removal is announced.
    pub failed: AtomicBool,
}

/// What the order lock guards.
pub(crate) struct State {
    pub next_seq: u64,
    pub ports: Vec<Option<Port>>,
    /// Node id each name last had.
    pub names: HashMap<String, u16>,
}

/// The global order: see the module doc.
pub(crate) struct Order {
    /// The order lock.
    pub state: Mutex<State>,
    /// Where every ordered frame is recorded, if anywhere.
    pub capture: Mutex<Option<Capture>>,
    /// Copy of the next sequence number for `stats`.
    pub seq_hint: AtomicU64,
    /// Receivers cut off because they stayed full.
    pub stalled: AtomicU64,
    /// Heat map, step times and imcd's pages, for the monitor (taken
    /// inside a step, after the order lock).
    pub observe: Observe,
    /// How long a full receiver may hold the bus.
    stall_timeout: Duration,
}

impl State {
    /// A state for `ports` ports, none joined.
    fn new(ports: usize) -> State {
        State { next_seq: 0, ports: (0..ports).map(|_| None).collect(), names: HashMap::new() }
    }

    /// Members up now (for a `Welcome`), `extra` included.
    pub fn members(&self, extra: u16) -> Vec<u16> {
        let mut m: Vec<u16> =
            self.ports.iter().enumerate().filter(|(_, p)| p.is_some()).map(|(i, _)| i as u16).collect();
        m.push(extra);
        m.sort_unstable();
        m.dedup();
        m
    }

    /// Most names remembered for sticky node ids (a restarted guest comes
    /// back as the same node): without a bound, every distinct name a client
    /// ever sent would stay in memory.
    fn names_cap(&self) -> usize {
        4 * self.ports.len().max(16)
    }

    /// Remembers that `name` has node `node`. At the bound, names of nodes
    /// that are not up under that name are forgotten first.
    pub fn remember_name(&mut self, name: &str, node: u16) {
        if name.is_empty() {
            return;
        }
        if self.names.len() >= self.names_cap() && !self.names.contains_key(name) {
            let ports = &self.ports;
            self.names
                .retain(|n, id| ports.get(*id as usize).is_some_and(|p| p.as_ref().is_some_and(|p| p.ctl.name == *n)));
        }
        self.names.insert(name.to_string(), node);
    }
}

/// The outcome of one ordering step.
pub(crate) enum Step {
    /// Numbered and delivered; ACK answers of local receivers to order next
    /// (answering node, answer).
    Done(Vec<(u16, AckReply)>),
    /// The writer's port is not up (a local port taken down): nothing done.
    NotUp,
    /// Point-to-point to a node that is not up: dropped, no number taken.
    NoDest,
    /// This port has no room (a link port's queue, a delayed local port's
    /// held frames): nothing done; wait for room and retry.
    Full(u16, Arc<PortCtl>),
}

/// What became of a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Numbered and delivered (with the ACK answers it made).
    Ordered,
    /// The writer's port is not up.
    NotUp,
    /// Point-to-point to a node that is not up: dropped.
    NoDest,
}

/// What a writer does after [`Order::advance`].
pub(crate) enum Next {
    /// Wait for room on this link port (at most [`ROOM_POLL`]), then advance again.
    Wait(Arc<PortCtl>),
    /// Nothing more to order.
    Finished(Outcome),
}

/// One write on its way through the order, with the ACK answers still to
/// order after it: the state of the step machine ([`Order::advance`]).
pub(crate) struct Writing<'a, 'w> {
    src: u16,
    w: &'a WritePacket<'w>,
    /// What became of the write itself (None until it is settled).
    outcome: Option<Outcome>,
    /// ACK answers to order next, in order: (answering node, answer).
    answers: Vec<(u16, AckReply)>,
    /// Since when the write has found a receiver full.
    first_full: Option<Instant>,
}

impl<'a, 'w> Writing<'a, 'w> {
    pub(crate) fn new(src: u16, w: &'a WritePacket<'w>) -> Self {
        Writing { src, w, outcome: None, answers: Vec::new(), first_full: None }
    }
}

impl Order {
    /// An order of `ports` ports; a receiver full for `stall_timeout` is cut off.
    pub(crate) fn new(ports: usize, stall_timeout: Duration) -> Order {
        Order {
            state: Mutex::new(State::new(ports)),
            capture: Mutex::new(None),
            seq_hint: AtomicU64::new(0),
            stalled: AtomicU64::new(0),
            observe: Observe::new(),
            stall_timeout,
        }
    }

    /// One ordering step for a write of node `src` (see the module doc).
    pub(crate) fn try_order(&self, src: u16, w: &WritePacket<'_>) -> Step {
        let t0 = Observe::timed(self.seq_hint.load(Ordering::Relaxed)).then(Instant::now);
        let mut guard = self.state.lock().unwrap();
        let st = &mut *guard;
        let Some(Some(sender)) = st.ports.get(src as usize) else { return Step::NotUp };
        let sender = &sender.ctl;
        if w.dest != BROADCAST && st.ports.get(w.dest as usize).is_none_or(Option::is_none) {
            sender.stats.writes_in.fetch_add(1, Ordering::Relaxed);
            sender.stats.bytes_in.fetch_add(w.data.len() as u64, Ordering::Relaxed);
            return Step::NoDest;
        }
        let loopback = w.flags & FLAG_LOOPBACK != 0;
        let wanted =
            |id: usize| if id == src as usize { loopback } else { w.dest == BROADCAST || w.dest as usize == id };
        // Room first: nothing is numbered unless every receiver can take it.
        let mut links = false;
        for (id, port) in st.ports.iter().enumerate() {
            let Some(port) = port else { continue };
            if !wanted(id) || port.failed.load(Ordering::Relaxed) {
                continue;
            }
            match &port.kind {
                PortKind::Link(tx) => {
                    if tx.capacity() <= MEMBER_ROOM && !tx.is_closed() {
                        return Step::Full(id as u16, port.ctl.clone());
                    }
                    links = true;
                }
                PortKind::Local(dev) => {
                    if !dev.has_room(src) {
                        return Step::Full(id as u16, port.ctl.clone());
                    }
                }
            }
        }
        sender.stats.writes_in.fetch_add(1, Ordering::Relaxed);
        sender.stats.bytes_in.fetch_add(w.data.len() as u64, Ordering::Relaxed);
        let seq = st.next_seq;
        st.next_seq += 1;
        self.seq_hint.store(seq + 1, Ordering::Relaxed);
        debug!(seq, src, dest = w.dest, addr = w.addr, len = w.data.len(), "ordered");
        let capture = self.capture.lock().unwrap();
        let frame: Option<Frame> = (links || capture.is_some())
            .then(|| Arc::new(Msg::Deliver { seq, src, flags: w.flags, addr: w.addr, data: w.data }.encode()));
        if let (Some(c), Some(f)) = (capture.as_ref(), &frame) {
            c.record(f, Some(w.dest));
        }
        drop(capture);
        let mut acks = Vec::new();
        for (id, port) in st.ports.iter().enumerate() {
            let Some(port) = port else { continue };
            if !wanted(id) || port.failed.load(Ordering::Relaxed) {
                continue;
            }
            port.ctl.stats.frames_out.fetch_add(1, Ordering::Relaxed);
            match &port.kind {
                PortKind::Link(tx) => {
                    // Room was checked above and only ordering steps (under
                    // this lock) fill queues; a closed queue is a node leaving.
                    let _ = tx.try_send(frame.clone().expect("encoded for link ports"));
                }
                PortKind::Local(dev) => {
                    // Through the port's faults on purpose (crate::faulty):
                    // a delayed port holds it and answers later itself.
                    if let Some(a) = dev.deliver(seq, src, w.flags, w.addr, w.data) {
                        acks.push((id as u16, a));
                    }
                }
            }
        }
        self.observe.write(seq, src, w.dest, w.flags, w.addr, w.data, t0);
        Step::Done(acks)
    }

    /// Drives `m` as far as it goes without waiting: its write, then the
    /// ACK answers each ordered write made (each a write of its own, from
    /// the answering node, depth first). Both callers drive this one
    /// machine and differ only in how they wait for room
    /// ([`Order::write`], [`Order::write_blocking`]).
    pub(crate) fn advance(&self, m: &mut Writing<'_, '_>) -> Next {
        loop {
            let (src, step) = match (&m.outcome, m.answers.first()) {
                (None, _) => (m.src, self.try_order(m.src, m.w)),
                (Some(_), None) => return Next::Finished(m.outcome.expect("set")),
                (Some(_), Some(&(from, ref a))) => (from, self.try_order(from, &a.write())),
            };
            let first = m.outcome.is_none();
            match step {
                Step::Full(id, port) => {
                    if self.still_waiting(&mut m.first_full, id, &port) {
                        return Next::Wait(port);
                    }
                    // Cut off: try again without it.
                    continue;
                }
                Step::Done(acks) => {
                    m.first_full = None;
                    if first {
                        m.outcome = Some(Outcome::Ordered);
                    } else {
                        m.answers.remove(0);
                    }
                    // Depth first: an answer's own answers go before the
                    // answers after it.
                    m.answers.splice(0..0, acks);
                }
                Step::NotUp | Step::NoDest if first => {
                    let why = if matches!(step, Step::NotUp) { Outcome::NotUp } else { Outcome::NoDest };
                    return Next::Finished(why);
                }
                Step::NotUp | Step::NoDest => {
                    // An answer to a node that left meanwhile: dropped.
                    if matches!(step, Step::NoDest) {
                        if let Some(Some(p)) = self.state.lock().unwrap().ports.get(src as usize) {
                            p.ctl.stats.dropped.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    m.answers.remove(0);
                }
            }
        }
    }

    /// Orders a write from a link port's reader task, waiting for room when
    /// a receiver's queue is full. False when the write was dropped.
    pub(crate) async fn write(&self, src: u16, w: &WritePacket<'_>) -> bool {
        let mut m = Writing::new(src, w);
        loop {
            match self.advance(&mut m) {
                Next::Finished(o) => return o == Outcome::Ordered,
                // A wake-up can be missed between the step and the wait:
                // the poll interval bounds the delay that costs.
                Next::Wait(port) => {
                    let _ = tokio::time::timeout(ROOM_POLL, port.room.notified()).await;
                }
            }
        }
    }

    /// Orders a write from a local guest's vfio-user thread, waiting (on
    /// `rt`) for room when a link port's queue is full.
    pub(crate) fn write_blocking(
        &self,
        src: u16,
        w: &WritePacket<'_>,
        rt: &tokio::runtime::Handle,
    ) -> Result<(), UplinkError> {
        let mut m = Writing::new(src, w);
        loop {
            match self.advance(&mut m) {
                Next::Finished(Outcome::Ordered) => return Ok(()),
                Next::Finished(Outcome::NotUp) => return Err(UplinkError::Down),
                Next::Finished(Outcome::NoDest) => {
                    if let Some(Some(p)) = self.state.lock().unwrap().ports.get(src as usize) {
                        p.ctl.stats.dropped.fetch_add(1, Ordering::Relaxed);
                    }
                    return Ok(());
                }
                Next::Wait(port) => rt.block_on(async {
                    let _ = tokio::time::timeout(ROOM_POLL, port.room.notified()).await;
                }),
            }
        }
    }

    /// A writer found port `id` full: true while it should wait for room;
    /// past the stall timeout the port is cut off instead (and the writer
    /// tries again without it).
    fn still_waiting(&self, first_full: &mut Option<Instant>, id: u16, port: &Arc<PortCtl>) -> bool {
        let since = *first_full.get_or_insert_with(Instant::now);
        if since.elapsed() < self.stall_timeout {
            return true;
        }
        self.cut_off(id, port);
        *first_full = None;
        false
    }

    /// A receiver kept its queue full for the stall timeout: it is declared
    /// failed (its link closed, its departure announced by its reader).
    fn cut_off(&self, id: u16, ctl: &Arc<PortCtl>) {
        let st = self.state.lock().unwrap();
        let Some(Some(port)) = st.ports.get(id as usize) else { return };
        // The same port still (not a newcomer on the same id).
        if Arc::ptr_eq(&port.ctl, ctl) && !port.failed.swap(true, Ordering::Relaxed) {
            warn!(node = id, timeout = ?self.stall_timeout, "receiver stalled with a full queue: cutting it off");
            self.stalled.fetch_add(1, Ordering::Relaxed);
            port.ctl.kick.notify_one();
        }
    }

    /// Announces a membership change to every port except `node` itself, in
    /// the global order. Never waits: link ports keep [`MEMBER_ROOM`] free
    /// for this; one that has not even that is stalled and is cut off.
    pub(crate) fn announce(&self, st: &mut State, node: u16, up: bool) {
        let seq = st.next_seq;
        st.next_seq += 1;
        self.seq_hint.store(seq + 1, Ordering::Relaxed);
        let frame: Frame = Arc::new(Msg::Member { seq, node, up }.encode());
        if let Some(c) = self.capture.lock().unwrap().as_ref() {
            c.record(&frame, None);
        }
        for (id, port) in st.ports.iter().enumerate() {
            let Some(port) = port else { continue };
            if id as u16 == node || port.failed.load(Ordering::Relaxed) {
                continue;
            }
            port.ctl.stats.frames_out.fetch_add(1, Ordering::Relaxed);
            match &port.kind {
                PortKind::Link(tx) => {
                    if let Err(mpsc::error::TrySendError::Full(_)) = tx.try_send(frame.clone()) {
                        warn!(node = id, "receiver has no room even for a membership event: cutting it off");
                        port.failed.store(true, Ordering::Relaxed);
                        self.stalled.fetch_add(1, Ordering::Relaxed);
                        port.ctl.kick.notify_one();
                    }
                }
                PortKind::Local(dev) => dev.member(seq, node, up),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembered_names_are_bounded() {
        let mut st = State::new(8);
        for i in 0..10_000u32 {
            st.remember_name(&format!("guest-{i}"), (i % 8) as u16);
        }
        assert!(st.names.len() <= st.names_cap(), "{} names kept", st.names.len());
        assert_eq!(st.names.get("guest-9999"), Some(&7), "the newest name is remembered");
        st.remember_name("", 3);
        assert!(!st.names.contains_key(""));
    }
}
