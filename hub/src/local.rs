//! Local ports: the adapters of guests on this host, served by the hub.
//!
//! Each local guest has one thread (`vfio-node<N>`) that serves its
//! vfio-user socket with the adapter model (`device::adapter::Adapter`).
//! The adapter's uplink is the hub's order itself ([`LocalUplink`]): a write
//! packet the guest builds is numbered and applied to every local receiver's
//! guest memory by this thread, under the order lock, before the next
//! request from QEMU is read. That is the whole path of a store between two
//! guests on one host: QEMU's vCPU, this thread, the other guest's memory.
//!
//! A local port is joined (its cable plugged in) from its creation, like an
//! adapter powered on before its guest; it leaves the cluster — announced
//! as a failure to the others — when its QEMU goes away, and joins again
//! when a new QEMU connects. `link-down` and `link-up` unplug and replug it.
//!
//! Threads: the port's own thread; control tasks (`link-down`/`link-up`)
//! call [`Hub::leave_local`] and [`Hub::rejoin_local`]. State of a port's
//! client is behind its own small mutex, taken after the order lock.

use std::io;
use std::os::unix::net::UnixListener;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, Weak};

use device::adapter::Adapter;
use device::uplink::{Downlink, LinkInfo, Uplink, UplinkError, WritePacket};
use device::vfio_user::{Connection, ConnectionConfig};
use thiserror::Error;
use tracing::{info, warn};

use crate::bounds::ACCEPT_BACKOFF;
use crate::faulty::Faulty;
use crate::hub::{Hub, Shared};
use crate::order::{Port, PortKind};
use crate::port::{Client, LocalPort, PortCtl};

/// Why a local port could not be created.
#[derive(Debug, Error)]
pub enum LocalError {
    /// The node id is outside the hub's ports.
    #[error("node {node} is outside this hub's {ports} ports")]
    OutOfRange {
        /// The id asked for.
        node: u16,
        /// Ports of the hub.
        ports: usize,
    },
    /// Another port already has this node id.
    #[error("node {0} already has a port")]
    Taken(u16),
    /// The adapter model refused its settings (address space size).
    #[error("adapter for node {node}: {source}")]
    Adapter {
        /// The node.
        node: u16,
        /// What the adapter said.
        source: io::Error,
    },
    /// The serving thread could not start.
    #[error("cannot start the thread of node {node}: {source}")]
    Thread {
        /// The node.
        node: u16,
        /// Why.
        source: io::Error,
    },
}

/// An adapter's uplink on a local port: the hub's ordering step, run by the
/// guest's own vfio-user thread.
struct LocalUplink {
    hub: Arc<Shared>,
    node: u16,
    rt: tokio::runtime::Handle,
}

impl Uplink for LocalUplink {
    fn send(&self, w: &WritePacket<'_>) -> Result<(), UplinkError> {
        self.hub.order.write_blocking(self.node, w, &self.rt)
    }
}

/// The same for a delayed port's holder thread, which orders the answers of
/// held ACK stores. Kept in the port (so in the hub's state), it must not
/// keep the hub alive: it holds it weakly, and once the hub is gone an
/// answer is lost as on a link that went down.
struct AnswerUplink {
    hub: Weak<Shared>,
    node: u16,
    rt: tokio::runtime::Handle,
}

impl Uplink for AnswerUplink {
    fn send(&self, w: &WritePacket<'_>) -> Result<(), UplinkError> {
        let hub = self.hub.upgrade().ok_or(UplinkError::Down)?;
        hub.order.write_blocking(self.node, w, &self.rt)
    }
}

/// Settings of one local port.
#[derive(Debug, Clone)]
pub struct LocalConfig {
    /// Node id.
    pub node: u16,
    /// Name (logs, stats).
    pub name: String,
    /// MEMORY CHANNEL address space in bytes.
    pub aspace: u64,
    /// How the vfio-user server talks to QEMU.
    pub vfio: ConnectionConfig,
}

impl Hub {
    /// Creates local port `cfg.node`: an adapter served on `listener` by a
    /// thread of its own. `rt` is the hub's runtime (a local writer waits on
    /// it when a link port's queue is full). The port joins the cluster now.
    pub fn add_local(
        &self,
        cfg: LocalConfig,
        listener: UnixListener,
        rt: tokio::runtime::Handle,
    ) -> Result<std::thread::JoinHandle<()>, LocalError> {
        let node = cfg.node;
        let ports = self.shared.cfg.max_nodes;
        if node as usize >= ports {
            return Err(LocalError::OutOfRange { node, ports });
        }
        let mut adapter = Adapter::new(cfg.aspace).map_err(|source| LocalError::Adapter { node, source })?;
        let port = Arc::new(LocalPort {
            node,
            name: cfg.name.clone(),
            dev: adapter.downlink(),
            client: Mutex::new(Client::Waiting),
            rt: rt.clone(),
            counters: adapter.counters(),
        });
        {
            let st = self.shared.order.state.lock().unwrap();
            let mut ctl = self.shared.ctl.lock().unwrap();
            if st.ports[node as usize].is_some() || ctl.local[node as usize].is_some() {
                return Err(LocalError::Taken(node));
            }
            ctl.local[node as usize] = Some(port.clone());
        }
        adapter.set_uplink(Arc::new(LocalUplink { hub: self.shared.clone(), node, rt }));
        adapter.plugged_in_at_power_on();
        self.rejoin_local(node);
        let hub = self.clone();
        std::thread::Builder::new()
            .name(format!("vfio-node{node}"))
            .spawn(move || hub.serve_local(port, listener, adapter, cfg.vfio))
            .map_err(|source| LocalError::Thread { node, source })
    }

    fn serve_local(&self, port: Arc<LocalPort>, listener: UnixListener, mut adapter: Adapter, vfio: ConnectionConfig) {
        let node = port.node;
        loop {
            let stream = match listener.accept() {
                Ok((s, _)) => s,
                Err(e) => {
                    warn!(node, "vfio-user accept failed: {e}");
                    std::thread::sleep(ACCEPT_BACKOFF);
                    continue;
                }
            };
            info!(node, name = %port.name, "QEMU connected");
            *port.client.lock().unwrap() = Client::Connected;
            self.rejoin_local(node);
            match Connection::with_config(stream, &mut adapter, vfio.clone()).run() {
                Ok(()) => info!(node, "QEMU disconnected"),
                Err(e) => warn!(node, "vfio-user connection closed: {e}"),
            }
            *port.client.lock().unwrap() = Client::Gone;
            self.leave_local(node, "its QEMU went away");
        }
    }

    /// Plugs local port `node` into the cluster, unless it is joined already,
    /// held down by control, or its QEMU went away.
    pub(crate) fn rejoin_local(&self, node: u16) {
        let sh = &self.shared;
        let mut guard = sh.order.state.lock().unwrap();
        let st = &mut *guard;
        let port = {
            let ctl = sh.ctl.lock().unwrap();
            match &ctl.local[node as usize] {
                Some(p) if !ctl.held_down[node as usize] => p.clone(),
                _ => return,
            }
        };
        if st.ports[node as usize].is_some() || *port.client.lock().unwrap() == Client::Gone {
            return;
        }
        let ctl = Arc::new(PortCtl::new(&port.name, None));
        let answers = Arc::new(AnswerUplink { hub: Arc::downgrade(&self.shared), node, rt: port.rt.clone() });
        let dev = Arc::new(Faulty::new(node, port.dev.clone(), ctl.clone(), answers, sh.cfg.queue_depth));
        sh.order.announce(st, node, true);
        let members = st.members(node);
        st.ports[node as usize] =
            Some(Port { ctl: ctl.clone(), kind: PortKind::Local(dev.clone()), failed: AtomicBool::new(false) });
        st.remember_name(&port.name, node);
        sh.ctl.lock().unwrap().ports[node as usize] = Some(ctl);
        dev.link_up(&LinkInfo { node, max_nodes: sh.cfg.max_nodes as u16, members, next_seq: st.next_seq });
        info!(node, name = %port.name, "local port joined");
    }

    /// Unplugs local port `node`: its departure is announced in the order,
    /// and its adapter sees the link go down.
    pub(crate) fn leave_local(&self, node: u16, reason: &str) {
        let sh = &self.shared;
        let mut st = sh.order.state.lock().unwrap();
        let dev = match st.ports.get(node as usize) {
            Some(Some(Port { kind: PortKind::Local(dev), .. })) => dev.clone(),
            _ => return,
        };
        st.ports[node as usize] = None;
        sh.ctl.lock().unwrap().ports[node as usize] = None;
        sh.order.announce(&mut st, node, false);
        drop(st);
        dev.link_down(reason);
        info!(node, "local port left: {reason}");
    }
}
