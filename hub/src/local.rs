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
//! A port's thread can be parked ([`Hub::park_locals`]): it stops between
//! two reads of its sockets and gives back its listener, its adapter and
//! its QEMU's connection, which a restart in place (`crate::restart`)
//! hands to the next hub process; [`Hub::resume_locals`] serves them there.
//!
//! Threads: the port's own thread; control tasks (`link-down`/`link-up`)
//! call [`Hub::leave_local`] and [`Hub::rejoin_local`]; the restart calls
//! [`Hub::park_locals`]. State of a port's client is behind its own small
//! mutex, taken after the order lock.

use std::io;
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, Weak};

use device::adapter::Adapter;
use device::uplink::{Downlink, LinkInfo, Uplink, UplinkError, WritePacket};
use device::vfio_user::{Connection, ConnectionConfig, Ended, Parked};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};
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
    /// The serving thread could not start, or its stop eventfd be made.
    #[error("cannot start the thread of node {node}: {source}")]
    Thread {
        /// The node.
        node: u16,
        /// Why.
        source: io::Error,
    },
}

/// A local port whose thread was parked: everything a hub needs to serve
/// it again, here or after `exec`.
pub struct ParkedPort {
    /// Node id.
    pub node: u16,
    /// Name (logs, stats).
    pub name: String,
    /// The socket QEMU connects to.
    pub listener: UnixListener,
    /// The adapter, as the guest left it.
    pub adapter: Adapter,
    /// The connected QEMU, if any, with what it sent that was not handled.
    pub client: Option<Parked>,
    /// How the vfio-user server talks to QEMU.
    pub vfio: ConnectionConfig,
}

/// A port made and joined, its thread not started yet.
struct Installed {
    port: Arc<LocalPort>,
    listener: UnixListener,
    adapter: Adapter,
    vfio: ConnectionConfig,
    client: Option<Parked>,
}

/// Waits for a QEMU on `listener`; `None` once `stop` is readable.
fn accept_unless_stopped(listener: &UnixListener, stop: &EventFd, node: u16) -> Option<UnixStream> {
    loop {
        let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN), PollFd::new(stop.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => {
                warn!(node, "poll of the vfio-user socket: {e}");
                std::thread::sleep(ACCEPT_BACKOFF);
            }
        }
        if fds[1].revents().is_some_and(|r| !r.is_empty()) {
            return None;
        }
        if fds[0].revents().is_none_or(|r| r.is_empty()) {
            continue;
        }
        match listener.accept() {
            Ok((s, _)) => return Some(s),
            Err(e) => {
                warn!(node, "vfio-user accept failed: {e}");
                std::thread::sleep(ACCEPT_BACKOFF);
            }
        }
    }
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
    /// The interrupt capability offered (MSI on a hot-pluggable slot).
    pub interrupts: device::pci::Interrupts,
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
    ) -> Result<(), LocalError> {
        let node = cfg.node;
        let ports = self.shared.cfg.max_nodes;
        if node as usize >= ports {
            return Err(LocalError::OutOfRange { node, ports });
        }
        let mut adapter = Adapter::new(cfg.aspace).map_err(|source| LocalError::Adapter { node, source })?;
        adapter.set_interrupts(cfg.interrupts);
        adapter.plugged_in_at_power_on();
        self.start_local(cfg, listener, adapter, None, rt)
    }

    /// Serves parked ports again ([`Hub::park_locals`], here or in the
    /// process before `exec`): each adapter as its guest left it, each
    /// QEMU's connection where it stopped. Every port joins the cluster
    /// (its guest sees its link come back) before any serves a message,
    /// so no store one of them sent meanwhile misses another. Returns the
    /// ports that could not be served, and why.
    pub fn resume_locals(&self, ports: Vec<ParkedPort>, rt: tokio::runtime::Handle) -> Vec<(u16, LocalError)> {
        let mut failed = Vec::new();
        let mut ready = Vec::new();
        for p in ports {
            let node = p.node;
            // The adapter comes whole (its configuration space says which
            // interrupts it offers): size and interrupts are not read here.
            let cfg = LocalConfig { node, name: p.name, aspace: 0, interrupts: Default::default(), vfio: p.vfio };
            match self.install_local(cfg, p.listener, p.adapter, p.client, rt.clone()) {
                Ok(r) => ready.push(r),
                Err(e) => failed.push((node, e)),
            }
        }
        for r in ready {
            let node = r.port.node;
            if let Err(e) = self.spawn_local(r) {
                failed.push((node, e));
            }
        }
        failed
    }

    fn start_local(
        &self,
        cfg: LocalConfig,
        listener: UnixListener,
        adapter: Adapter,
        client: Option<Parked>,
        rt: tokio::runtime::Handle,
    ) -> Result<(), LocalError> {
        let r = self.install_local(cfg, listener, adapter, client, rt)?;
        self.spawn_local(r)
    }

    /// Makes the port and joins it to the cluster; [`Hub::spawn_local`]
    /// starts its thread.
    fn install_local(
        &self,
        cfg: LocalConfig,
        listener: UnixListener,
        mut adapter: Adapter,
        client: Option<Parked>,
        rt: tokio::runtime::Handle,
    ) -> Result<Installed, LocalError> {
        let node = cfg.node;
        let ports = self.shared.cfg.max_nodes;
        if node as usize >= ports {
            return Err(LocalError::OutOfRange { node, ports });
        }
        let stop = EventFd::from_flags(EfdFlags::EFD_CLOEXEC)
            .map_err(|e| LocalError::Thread { node, source: io::Error::from(e) })?;
        let port = Arc::new(LocalPort {
            node,
            name: cfg.name.clone(),
            dev: adapter.downlink(),
            client: Mutex::new(if client.is_some() { Client::Connected } else { Client::Waiting }),
            rt: rt.clone(),
            counters: adapter.counters(),
            stop,
            thread: Mutex::new(None),
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
        self.rejoin_local(node);
        Ok(Installed { port, listener, adapter, vfio: cfg.vfio, client })
    }

    /// Starts the thread of a port [`Hub::install_local`] made.
    fn spawn_local(&self, r: Installed) -> Result<(), LocalError> {
        let Installed { port, listener, adapter, vfio, client } = r;
        let node = port.node;
        let hub = self.clone();
        let p = port.clone();
        let t = std::thread::Builder::new()
            .name(format!("vfio-node{node}"))
            .spawn(move || hub.serve_local(p, listener, adapter, vfio, client))
            .map_err(|source| LocalError::Thread { node, source })?;
        *port.thread.lock().unwrap() = Some(t);
        Ok(())
    }

    /// The port's thread: serves `client` first (a resumed connection),
    /// then each QEMU that connects, until its stop eventfd parks it.
    fn serve_local(
        &self,
        port: Arc<LocalPort>,
        listener: UnixListener,
        mut adapter: Adapter,
        vfio: ConnectionConfig,
        mut client: Option<Parked>,
    ) -> Option<ParkedPort> {
        let node = port.node;
        let park = |listener, adapter, client| ParkedPort {
            node,
            name: port.name.clone(),
            listener,
            adapter,
            client,
            vfio: vfio.clone(),
        };
        loop {
            let conn = match client.take() {
                Some(p) => match Connection::resume(p, &mut adapter) {
                    Ok(c) => c,
                    Err(e) => {
                        warn!(node, "the handed-over connection cannot be resumed: {e}");
                        *port.client.lock().unwrap() = Client::Gone;
                        self.leave_local(node, "its QEMU's connection was lost in the restart");
                        continue;
                    }
                },
                None => {
                    let Some(stream) = accept_unless_stopped(&listener, &port.stop, node) else {
                        return Some(park(listener, adapter, None));
                    };
                    info!(node, name = %port.name, "QEMU connected");
                    *port.client.lock().unwrap() = Client::Connected;
                    self.rejoin_local(node);
                    Connection::with_config(stream, &mut adapter, vfio.clone())
                }
            };
            match conn.stop_on(port.stop.as_fd()).run_until_parked() {
                Ok(Ended::Parked(p)) => return Some(park(listener, adapter, Some(p))),
                Ok(Ended::Closed) => info!(node, "QEMU disconnected"),
                Err(e) => warn!(node, "vfio-user connection closed: {e}"),
            }
            *port.client.lock().unwrap() = Client::Gone;
            self.leave_local(node, "its QEMU went away");
        }
    }

    /// The register trace of local port `node`'s adapter, if it has one.
    pub fn local_tracer(&self, node: u16) -> Option<Arc<device::adapter::trace::Tracer>> {
        let ctl = self.shared.ctl.lock().unwrap();
        ctl.local.get(node as usize)?.as_ref().map(|p| p.counters.tracer())
    }

    /// Parks every local port's thread (see the module header) and takes
    /// the ports out of the hub. All threads stop first, the transmit DMA
    /// engines finish what their guests posted, and only then do the ports
    /// leave (the others see them go, each guest sees its link go down):
    /// every store a guest made before is delivered to every other.
    pub fn park_locals(&self) -> Vec<ParkedPort> {
        let ports: Vec<Arc<LocalPort>> = self.shared.ctl.lock().unwrap().local.iter().flatten().cloned().collect();
        for p in &ports {
            let _ = p.stop.write(1);
        }
        let mut parked = Vec::new();
        for p in &ports {
            let Some(t) = p.thread.lock().unwrap().take() else { continue };
            match t.join() {
                Ok(Some(pp)) => parked.push(pp),
                _ => warn!(node = p.node, "local port's thread had ended; not handed over"),
            }
        }
        for p in &parked {
            p.adapter.wait_tx_idle();
        }
        for p in &parked {
            self.leave_local(p.node, "the hub is restarting");
            self.shared.ctl.lock().unwrap().local[p.node as usize] = None;
        }
        parked
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
