//! What every port of the hub has: the control side (counters, faults on
//! purpose, room signals), the frames link ports queue, and a local port as
//! kept whether or not it is joined. Data only; the ordering step
//! ([`crate::order`], which also has the two kinds of joined port) and the
//! ports' own code ([`crate::link_port`], [`crate::local`]) act on it.
//!
//! Touched by every thread of the hub: ordering steps read ports under the
//! order lock; control requests and the ports' own threads and tasks use
//! the atomics of [`PortCtl`] without it.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use device::uplink::Downlink;
use tokio::sync::{mpsc, Notify};

/// A frame as queued for link ports: encoded once, shared by every queue.
pub(crate) type Frame = Arc<Vec<u8>>;

/// Frames every link port's queue keeps free for membership events, which
/// are queued without waiting: writes wait while fewer slots are free.
pub(crate) const MEMBER_ROOM: usize = 64;

/// Counters kept for every port.
#[derive(Debug, Default)]
pub struct PortStats {
    /// Writes received from this node.
    pub writes_in: AtomicU64,
    /// Payload bytes received from this node.
    pub bytes_in: AtomicU64,
    /// Frames queued for delivery to this node.
    pub frames_out: AtomicU64,
    /// Frames corrupted on purpose on the way to this node.
    pub corrupted: AtomicU64,
    /// Writes from this node dropped (destination outside the ports or not up).
    pub dropped: AtomicU64,
    /// Frames from this node that went missing (link sequence skipped).
    pub link_gaps: AtomicU64,
}

/// What control requests need of a port. Kept apart from the ordering state
/// so that `stats` and `link-down` answer at once even while a full receiver
/// holds the bus.
pub(crate) struct PortCtl {
    pub name: String,
    /// The link port's queue (None for a local port).
    pub tx: Option<mpsc::Sender<Frame>>,
    pub stats: Arc<PortStats>,
    /// Frames still to corrupt on the way out.
    pub corrupt: AtomicU32,
    /// Wakes a link port's reader to close the link.
    pub kick: Notify,
    /// Microseconds to hold each frame back (fault injection).
    pub delay: AtomicU64,
    /// Signalled by a port's deliverer (a link port's writer, a local
    /// port's held frames) each time it has taken frames.
    pub room: Notify,
    /// Events a local port holds back now ([`Faulty`]).
    pub held: AtomicUsize,
}

impl PortCtl {
    pub fn new(name: &str, tx: Option<mpsc::Sender<Frame>>) -> PortCtl {
        PortCtl {
            name: name.to_string(),
            tx,
            stats: Arc::new(PortStats::default()),
            corrupt: AtomicU32::new(0),
            kick: Notify::new(),
            delay: AtomicU64::new(0),
            room: Notify::new(),
            held: AtomicUsize::new(0),
        }
    }

    /// Takes one from the corruption count, if any is left.
    pub fn take_corrupt(&self) -> bool {
        // Nearly always none: one load, no read-modify-write.
        self.corrupt.load(Ordering::Relaxed) != 0
            && self.corrupt.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |c| c.checked_sub(1)).is_ok()
    }

    /// The delay set now, if any.
    pub fn delay(&self) -> Option<Duration> {
        Some(Duration::from_micros(self.delay.load(Ordering::Relaxed))).filter(|d| !d.is_zero())
    }

    /// How much longer a frame held since `held` still waits under the
    /// delay set now (None: it goes out). Looked at again at least every
    /// 10 ms by whoever holds it, so a shorter (or no) delay set meanwhile
    /// takes effect at once.
    pub fn hold_left(&self, held: Instant) -> Option<Duration> {
        let left = self.delay()?.checked_sub(held.elapsed()).filter(|l| !l.is_zero())?;
        Some(left.min(Duration::from_millis(10)))
    }
}

/// Where a local guest's QEMU is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Client {
    /// None has connected yet (the adapter is powered on, the cable plugged in).
    Waiting,
    /// Connected.
    Connected,
    /// Its QEMU went away: the node failed.
    Gone,
}

/// One local port (kept whether or not it is joined now).
pub(crate) struct LocalPort {
    pub node: u16,
    pub name: String,
    /// The receiving side of its adapter.
    pub dev: Arc<dyn Downlink>,
    pub client: Mutex<Client>,
    /// The hub's runtime: a local writer waits on it for room.
    pub rt: tokio::runtime::Handle,
    /// Its adapter's counters (transmit DMA), for `stats`.
    pub counters: device::adapter::Counters,
    /// Written to park the port's thread (a restart in place).
    pub stop: nix::sys::eventfd::EventFd,
    /// The port's thread: what it parked, when it was asked to.
    pub thread: Mutex<Option<std::thread::JoinHandle<Option<crate::local::ParkedPort>>>>,
}
