//! The hub: accepts adapters, gives each a node id, and puts every write of
//! every node into one global order.
//!
//! # Ports
//!
//! A hub has two kinds of port, and any mix of them:
//! - **local ports** ([`crate::local`]): the hub serves the guest's
//!   vfio-user socket itself, with the adapter model as a library. A store
//!   is numbered and applied to every local receiver's guest memory by the
//!   thread that received it from QEMU: one hop, no socket, no other thread.
//! - **link ports** ([`crate::link_port`]): a remote `mc-adapter` process
//!   over a Unix socket or TCP (the link protocol of crate `link`), for fault
//!   isolation and for guests on other hosts.
//!
//! # Ordering
//!
//! All writes pass through the ordering step ([`crate::order`]), which holds
//! the order lock while it numbers a write, queues it on every receiving
//! link port and applies it to every receiving local port. Because numbering
//! and delivery happen under one lock, every node sees the writes in the same
//! order. Membership events (`Member`) are numbered in the same sequence.
//!
//! # Lock order
//!
//! 1. the order lock (`Order::state`);
//! 2. the control view ([`Shared::ctl`]);
//! 3. the capture queue (`Order::capture`), a delayed local port's queue
//!    (`crate::faulty`), a local port's client state;
//! 4. inside an adapter: its DMA map lock, then its interrupt mutex.
//!
//! The nonce source's mutex (challenges for TCP connections) is taken
//! alone, never with another lock held.
//!
//! A lock is only taken while holding locks above it in this list. Nobody
//! waits for another thread while holding the order lock: a step that finds
//! a link port's queue full returns before numbering, and the writer waits
//! for room with the lock released.
//!
//! # Flow control
//!
//! Each link port has a bounded queue ([`HubConfig::queue_depth`] frames).
//! When a receiver's queue is full, writers to it wait for room: back-pressure
//! to the senders, as on the original shared bus. Memory is bounded by
//! `ports × queue_depth × frame` (frames are shared between ports, so usually
//! far less). Local ports take a write as it is ordered and never fill,
//! unless a delay is set on one: then it holds up to `queue_depth` frames
//! of other nodes' writes and is full the same way (`crate::faulty`).
//!
//! Connections not trusted yet are bounded too ([`crate::bounds`]): at most
//! [`HubConfig::max_unauthenticated`] link connections before their `Hello`
//! (each without buffers: those come after the `Hello`), closed after
//! [`HubConfig::auth_timeout`]; at most [`HubConfig::max_control`] control
//! connections, closed after [`HubConfig::control_idle_timeout`] idle.
//! Every listener backs off after a failed `accept()` and goes on.
//!
//! A receiver whose queue stays full for [`HubConfig::stall_timeout`] is
//! declared failed: its link is closed and its departure announced, exactly
//! like a node that died, and the cluster goes on. So a stuck node can hold
//! the bus for at most that long, never forever.
//!
//! # Node ids
//!
//! An adapter may ask for a node id. One that asks for any id gets the id
//! its name had before (if free), so a restarted guest comes back as the
//! same node; otherwise the lowest free id. A local port has the id it was
//! created with.
//!
//! # Faults on purpose
//!
//! [`Hub::control`] (the `--control` socket, `mc-hub ctl`) can hold a node's
//! link down (its connection is closed, or its local port unplugged, until
//! released), corrupt the next frames sent to a node (its adapter must count
//! CRC errors), delay them (only that node's deliveries wait), and report
//! per-node counters.

use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::UnixListener;

use crate::bounds::{Gate, NonceSource};
use crate::capture::Capture;
pub use crate::capture::{
    CaptureReader, Next as CaptureNext, ReadError as CaptureReadError, DEST_TRAILER, PCAP_DATALINK,
};
pub use crate::control::{Control, ControlReply, NodeStats};
pub use crate::observe::{Seen, BUCKETS, PAGES, SHADOW_PAGES, TIME_EVERY};
use crate::order::Order;
pub use crate::port::PortStats;
use crate::port::{LocalPort, PortCtl};

/// Hub settings.
#[derive(Debug, Clone)]
pub struct HubConfig {
    /// Ports (node ids 0..max_nodes). The original hub had 8.
    pub max_nodes: usize,
    /// Frames queued per receiving port before senders are held back.
    pub queue_depth: usize,
    /// How long a full receiver may hold the bus before it is declared failed.
    pub stall_timeout: Duration,
    /// Cluster secret adapters must prove on TCP connections.
    pub secret: Option<Vec<u8>>,
    /// Link connections (Unix and TCP together) that have not completed
    /// their `Hello` and authentication yet, at most. A connection beyond
    /// it is closed at once and counted (`unauthenticated_closed`).
    pub max_unauthenticated: usize,
    /// How long a new link connection has to complete its `Hello` (and, on
    /// TCP, prove the secret); then it is closed and counted.
    pub auth_timeout: Duration,
    /// Control connections open at once, at most; one more gets an error
    /// line and is closed.
    pub max_control: usize,
    /// A control connection that sends no request for this long is closed.
    pub control_idle_timeout: Duration,
}

impl Default for HubConfig {
    fn default() -> Self {
        HubConfig {
            max_nodes: 8,
            queue_depth: 4096,
            stall_timeout: Duration::from_secs(10),
            secret: None,
            max_unauthenticated: 64,
            auth_timeout: Duration::from_secs(5),
            max_control: 16,
            control_idle_timeout: Duration::from_secs(60),
        }
    }
}

/// The control view: never held across an await.
pub(crate) struct CtlView {
    pub ports: Vec<Option<Arc<PortCtl>>>,
    pub held_down: Vec<bool>,
    /// Local ports by node id (whether or not they are joined now).
    pub local: Vec<Option<Arc<LocalPort>>>,
}

/// Everything the hub's threads and tasks share.
pub(crate) struct Shared {
    pub cfg: HubConfig,
    /// The global order and its lock (see [`crate::order`]).
    pub order: Order,
    pub ctl: Mutex<CtlView>,
    pub rejected: AtomicU64,
    /// Link connections that have not completed their `Hello` yet.
    pub unauthenticated: Arc<Gate>,
    /// Link connections closed at the authentication deadline.
    pub auth_timeouts: AtomicU64,
    /// Control connections.
    pub control_conns: Arc<Gate>,
    /// Control connections closed after their idle timeout.
    pub control_idle_closed: AtomicU64,
    /// Where authentication challenges come from.
    pub nonces: NonceSource,
    /// Whether this process can restart in place (`mc-hub`; see
    /// [`crate::restart`]), and the request to.
    pub restart_enabled: AtomicBool,
    pub restart: tokio::sync::Notify,
}

/// A running hub's handle: serve adapters, answer control requests.
#[derive(Clone)]
pub struct Hub {
    pub(crate) shared: Arc<Shared>,
}

impl Hub {
    /// A hub with no adapters yet.
    pub fn new(cfg: HubConfig) -> Hub {
        let ctl = CtlView {
            ports: vec![None; cfg.max_nodes],
            held_down: vec![false; cfg.max_nodes],
            local: vec![None; cfg.max_nodes],
        };
        Hub {
            shared: Arc::new(Shared {
                order: Order::new(cfg.max_nodes, cfg.stall_timeout),
                ctl: Mutex::new(ctl),
                rejected: AtomicU64::new(0),
                unauthenticated: Gate::new(cfg.max_unauthenticated),
                auth_timeouts: AtomicU64::new(0),
                control_conns: Gate::new(cfg.max_control),
                control_idle_closed: AtomicU64::new(0),
                nonces: NonceSource::default(),
                restart_enabled: AtomicBool::new(false),
                restart: tokio::sync::Notify::new(),
                cfg,
            }),
        }
    }

    /// Ports of this hub (node ids 0..max_nodes).
    pub fn max_nodes(&self) -> usize {
        self.shared.cfg.max_nodes
    }

    /// Writes every ordered frame (deliveries and membership events) to a
    /// pcap file from now on; see `docs/hub.md` for reading it.
    pub fn capture_to(&self, path: &Path) -> std::io::Result<()> {
        *self.shared.order.capture.lock().unwrap() = Some(Capture::open(path)?);
        Ok(())
    }

    /// Stops the running capture (its thread writes what is queued and
    /// ends); false when none was running.
    pub fn stop_capture(&self) -> bool {
        self.shared.order.capture.lock().unwrap().take().is_some()
    }
}

/// Runs a hub on `listener` until `shutdown` completes (no control socket).
pub async fn serve(listener: UnixListener, cfg: HubConfig, shutdown: impl Future<Output = ()>) -> std::io::Result<()> {
    Hub::new(cfg).serve(listener, shutdown).await
}
