//! A real hub for tests: `hub::hub::Hub` serving a Unix socket in a
//! temporary folder, on its own tokio runtime, stopped when dropped.
//! Enabled by the `testing` feature (dev-dependencies only).

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::hub::{Control, ControlReply, Hub, HubConfig, NodeStats};
use link::{self as link, Msg};

/// One ordered event as a receiving node saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// An ordered write.
    Deliver {
        /// Global sequence number.
        seq: u64,
        /// Writer.
        src: u16,
        /// Link flags.
        flags: u16,
        /// Global address.
        addr: u64,
        /// Bytes.
        data: Vec<u8>,
    },
    /// A membership change.
    Member {
        /// Global sequence number.
        seq: u64,
        /// Node concerned.
        node: u16,
        /// Joined (true) or left.
        up: bool,
    },
}

impl Seen {
    /// Its place in the global order.
    pub fn seq(&self) -> u64 {
        match self {
            Seen::Deliver { seq, .. } | Seen::Member { seq, .. } => *seq,
        }
    }
}

/// Reads the next frame from the hub and returns it as an event, with its
/// link sequence number. Panics on anything but a delivery or membership event.
pub fn read_event(r: &mut impl io::Read, buf: &mut Vec<u8>) -> (u16, Seen) {
    let hdr = link::read_frame(r, buf).expect("read frame from the hub");
    let seen = match Msg::parse(&hdr, buf).expect("valid frame from the hub") {
        Msg::Deliver { seq, src, flags, addr, data } => Seen::Deliver { seq, src, flags, addr, data: data.to_vec() },
        Msg::Member { seq, node, up } => Seen::Member { seq, node, up },
        other => panic!("unexpected frame from the hub: {other:?}"),
    };
    (hdr.link_seq, seen)
}

/// How long a stopping hub may take before the test fails.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

type Task = tokio::task::JoinHandle<io::Result<()>>;

/// A running hub.
pub struct TestHub {
    /// Its Unix socket.
    pub path: PathBuf,
    /// The hub handle (for `capture_to` and the like).
    pub hub: Hub,
    rt: Option<tokio::runtime::Runtime>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<Task>,
    /// Node ids of the local ports added.
    locals: std::sync::Mutex<Vec<u16>>,
    _dir: tempfile::TempDir,
}

impl TestHub {
    /// A hub with the default settings (8 ports).
    pub fn start() -> TestHub {
        Self::start_with(HubConfig::default())
    }

    /// A hub with `cfg`.
    pub fn start_with(cfg: HubConfig) -> TestHub {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("hub.sock");
        let (hub, rt, shutdown, task) = launch(&path, cfg);
        TestHub {
            path,
            hub,
            rt: Some(rt),
            shutdown: Some(shutdown),
            task: Some(task),
            locals: std::sync::Mutex::new(Vec::new()),
            _dir: dir,
        }
    }

    /// Kills the hub (every link drops, nothing is said) and starts a fresh
    /// one on the same socket, as a restarted `mc-hub` would be.
    pub fn restart(&mut self, cfg: HubConfig) {
        drop(self.shutdown.take());
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
        self.task = None;
        let _ = std::fs::remove_file(&self.path);
        let (hub, rt, shutdown, task) = launch(&self.path, cfg);
        (self.hub, self.rt, self.shutdown, self.task) = (hub, Some(rt), Some(shutdown), Some(task));
    }

    /// Also accepts adapters over TCP on a free loopback port (the config
    /// needs a secret); returns HOST:PORT.
    pub fn listen_tcp(&self) -> String {
        let rt = self.rt.as_ref().expect("running");
        let l = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).expect("bind TCP");
        let addr = l.local_addr().expect("local addr").to_string();
        let h = self.hub.clone();
        rt.spawn(async move { h.serve_tcp(l, std::future::pending()).await });
        addr
    }

    /// Also answers control requests on a socket in the hub's temporary
    /// folder (as `mc-hub --control`); returns its path.
    pub fn listen_control(&self) -> PathBuf {
        let sock = self.path.with_file_name("hub.ctl");
        let rt = self.rt.as_ref().expect("running");
        let l = rt.block_on(async { tokio::net::UnixListener::bind(&sock) }).expect("bind control socket");
        let h = self.hub.clone();
        rt.spawn(async move { h.serve_control(l, std::future::pending()).await });
        sock
    }

    /// Adds a local port for `name` (the lowest node id not in use): the hub
    /// serves an adapter with `aspace` bytes of address space on a vfio-user
    /// socket in the hub's temporary folder. Returns the socket and the node id.
    pub fn add_local(&self, name: &str, aspace: u64) -> (PathBuf, u16) {
        let mut locals = self.locals.lock().unwrap();
        let used: Vec<u16> = self.stats().iter().map(|n| n.node).chain(locals.iter().copied()).collect();
        let node = (0..u16::MAX).find(|n| !used.contains(n)).expect("a free node id");
        let sock = self.path.with_file_name(format!("local-{node}.sock"));
        let listener = std::os::unix::net::UnixListener::bind(&sock).expect("bind local port socket");
        let rt = self.rt.as_ref().expect("running").handle().clone();
        let cfg = crate::local::LocalConfig {
            node,
            name: name.to_string(),
            aspace,
            interrupts: Default::default(),
            vfio: device::vfio_user::ConnectionConfig::default(),
        };
        self.hub.add_local(cfg, listener, rt).expect("add local port");
        locals.push(node);
        (sock, node)
    }

    /// Carries out one control request.
    pub fn control(&self, c: Control) -> ControlReply {
        self.rt.as_ref().expect("running").block_on(self.hub.control(c))
    }

    /// Carries out a control request that must succeed.
    pub fn control_ok(&self, c: Control) {
        match self.control(c.clone()) {
            ControlReply::Ok => {}
            other => panic!("{c:?} answered {other:?}"),
        }
    }

    /// The stats reply as JSON (for ad-hoc field access).
    pub fn stats_json(&self) -> serde_json::Value {
        serde_json::to_value(self.control(Control::Stats)).expect("stats as JSON")
    }

    /// Per-node counters of the nodes that are up.
    pub fn stats(&self) -> Vec<NodeStats> {
        match self.control(Control::Stats) {
            ControlReply::Stats { nodes, .. } => nodes,
            other => panic!("stats answered {other:?}"),
        }
    }

    /// Counters of one node (which must be up).
    pub fn node_stats(&self, node: u16) -> NodeStats {
        self.stats()
            .into_iter()
            .find(|n| n.node == node)
            .unwrap_or_else(|| panic!("node {node} is not in the hub's stats"))
    }
}

fn launch(path: &Path, cfg: HubConfig) -> (Hub, tokio::runtime::Runtime, tokio::sync::oneshot::Sender<()>, Task) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("test-hub")
        .enable_all()
        .build()
        .expect("hub runtime");
    let listener = rt.block_on(async { tokio::net::UnixListener::bind(path) }).expect("bind hub socket");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let hub = Hub::new(cfg);
    let h = hub.clone();
    let task = rt.spawn(async move {
        h.serve(listener, async move {
            let _ = stop_rx.await;
        })
        .await
    });
    (hub, rt, stop_tx, task)
}

impl Drop for TestHub {
    fn drop(&mut self) {
        if let Some(s) = self.shutdown.take() {
            let _ = s.send(());
        }
        let Some(rt) = self.rt.take() else { return };
        if let Some(t) = self.task.take() {
            let r = rt.block_on(async { tokio::time::timeout(STOP_TIMEOUT, t).await });
            if !std::thread::panicking() {
                r.expect("hub did not stop").expect("hub task panicked").expect("hub failed");
            }
        }
        // Ends the connection tasks still running (links still up).
        rt.shutdown_timeout(Duration::from_secs(1));
    }
}
