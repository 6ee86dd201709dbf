//! Restart in place (`mc-hub ctl restart`, `mc-cluster hub restart`): the
//! hub process replaces itself (`exec`, so the same process id, binary path
//! and arguments) without its local guests' QEMUs noticing more than a
//! link flap.
//!
//! QEMU's vfio-user client never reconnects, so a local port's QEMU
//! connection must outlive the process. Before `exec` every local port's
//! thread is parked ([`Hub::park_locals`]) between two reads of its socket,
//! the port leaves the cluster (its guest sees LINK_DOWN, the others see it
//! go), and its adapter is frozen ([`device::adapter::AdapterState`]).
//! What the next process needs goes into a [`Handover`]: JSON in a memfd,
//! with the fds it names (the vfio-user listener and connection, the
//! guest's memory and interrupt eventfds) left open across `exec`. The next
//! process finds it through `--resume-fd`, thaws each adapter, resumes each
//! connection where it stopped, and the ports join again. Link ports and
//! TCP adapters (per-guest mode, other hosts) are not handed over: their
//! connections close with the old process and their adapters rejoin by
//! themselves, as on any hub restart.
//!
//! Runs on the hub's main thread (parking waits for the port threads).

use std::ffi::{CString, OsString};
use std::fs::File;
use std::io::{Read, Seek, Write};
use std::os::fd::{IntoRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

use device::adapter::{Adapter, AdapterState};
use device::vfio_user::{ConnectionConfig, Parked, WriteMultiple};
use nix::fcntl::{fcntl, FcntlArg, FdFlag};
use serde::{Deserialize, Serialize};
use thiserror::Error;
use tracing::{info, warn};

use crate::hub::Hub;
use crate::local::ParkedPort;

/// Version of the [`Handover`] layout; another is refused.
pub const FORMAT: u32 = 1;

/// The flag that names the hand-over's fd to the next process.
pub const RESUME_FLAG: &str = "--resume-fd";

/// Why a restart in place failed.
#[derive(Debug, Error)]
pub enum RestartError {
    /// Writing or reading the hand-over failed.
    #[error("hand-over: {0}")]
    Io(#[from] std::io::Error),
    /// An fd could not be kept open across `exec`, or `exec` failed.
    #[error("{what}: {source}")]
    Sys {
        /// What was being done.
        what: String,
        /// Why it failed.
        source: nix::errno::Errno,
    },
    /// The hand-over is not one this binary can take.
    #[error("hand-over refused: {0}")]
    Refused(String),
}

/// A QEMU connection, as parked.
#[derive(Debug, Serialize, Deserialize)]
struct ClientHandover {
    stream: RawFd,
    buffered: Vec<u8>,
    fds: Option<(u64, Vec<RawFd>)>,
    multi: bool,
}

/// One local port.
#[derive(Debug, Serialize, Deserialize)]
struct PortHandover {
    node: u16,
    name: String,
    listener: RawFd,
    write_multiple: String,
    client: Option<ClientHandover>,
    adapter: AdapterState,
}

/// What one hub process hands the next (see the module header).
#[derive(Debug, Serialize, Deserialize)]
pub struct Handover {
    format: u32,
    ports: Vec<PortHandover>,
}

impl PortHandover {
    fn fds(&self) -> Vec<RawFd> {
        let client = self
            .client
            .iter()
            .flat_map(|c| std::iter::once(c.stream).chain(c.fds.iter().flat_map(|(_, fds)| fds.iter().copied())));
        std::iter::once(self.listener).chain(client).chain(self.adapter.fds()).collect()
    }
}

/// Takes ownership of fd `fd` named by a hand-over, after checking it is open.
fn own(fd: RawFd) -> Result<OwnedFd, RestartError> {
    // SAFETY: the hand-over owns `fd` (its ports gave their ownership up,
    // nothing else in this process knows the number), and `Handover::read`
    // refused hand-overs naming one twice.
    unsafe { device::adapter::own_fd(fd) }.ok_or_else(|| RestartError::Refused(format!("fd {fd} is not open")))
}

impl Hub {
    /// Lets `ctl restart` be asked for (a process that can exec itself).
    pub fn enable_restart(&self) {
        self.shared.restart_enabled.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Completes when `ctl restart` was asked for (and answered).
    pub async fn restart_requested(&self) {
        self.shared.restart.notified().await
    }

    /// Parks and freezes every local port (module header). A port whose
    /// adapter cannot be frozen is left out (its QEMU's connection closes).
    pub fn hand_over(&self) -> Handover {
        let mut ports = Vec::new();
        for p in self.park_locals() {
            let node = p.node;
            let client = p.client.map(|c| ClientHandover {
                stream: c.stream.into_raw_fd(),
                buffered: c.buffered,
                fds: c.fds.map(|(off, fds)| (off, fds.into_iter().map(IntoRawFd::into_raw_fd).collect())),
                multi: c.multi,
            });
            match p.adapter.freeze() {
                Ok(adapter) => ports.push(PortHandover {
                    node,
                    name: p.name,
                    listener: p.listener.into_raw_fd(),
                    write_multiple: p.vfio.write_multiple.to_string(),
                    client,
                    adapter,
                }),
                Err(e) => warn!(node, "adapter cannot be frozen, not handed over: {e}"),
            }
        }
        Handover { format: FORMAT, ports }
    }
}

impl Handover {
    /// Local ports handed over.
    pub fn nodes(&self) -> Vec<u16> {
        self.ports.iter().map(|p| p.node).collect()
    }

    /// Writes the hand-over to a memfd, keeps every fd it names open across
    /// `exec`, and execs `exe` with `args` (the program's arguments after
    /// its name) plus `--resume-fd`. Returns only if that failed.
    pub fn exec(self, exe: &Path, args: &[OsString]) -> RestartError {
        match self.try_exec(exe, args) {
            Ok(never) => match never {},
            Err(e) => e,
        }
    }

    fn try_exec(self, exe: &Path, args: &[OsString]) -> Result<std::convert::Infallible, RestartError> {
        fn sys(what: &str) -> impl FnOnce(nix::errno::Errno) -> RestartError + '_ {
            move |source| RestartError::Sys { what: what.to_string(), source }
        }
        let memfd = nix::sys::memfd::memfd_create(c"mc-hub-handover", nix::sys::memfd::MemFdCreateFlag::empty())
            .map_err(sys("memfd_create"))?;
        let mut f = File::from(memfd);
        f.write_all(&serde_json::to_vec(&self).map_err(|e| RestartError::Refused(e.to_string()))?)?;
        f.rewind()?;
        let fd = f.into_raw_fd();
        for n in self.ports.iter().flat_map(PortHandover::fds) {
            fcntl(n, FcntlArg::F_SETFD(FdFlag::empty())).map_err(sys(&format!("keep fd {n} open across exec")))?;
        }
        let c = |s: &[u8]| CString::new(s).map_err(|_| RestartError::Refused("an argument holds a NUL byte".into()));
        let mut argv = vec![c(exe.as_os_str().as_bytes())?];
        let mut skip = false;
        for a in args {
            let b = a.as_bytes();
            if std::mem::take(&mut skip) || b.starts_with(format!("{RESUME_FLAG}=").as_bytes()) {
                continue;
            }
            if b == RESUME_FLAG.as_bytes() {
                skip = true;
                continue;
            }
            argv.push(c(b)?);
        }
        argv.push(c(RESUME_FLAG.as_bytes())?);
        argv.push(c(fd.to_string().as_bytes())?);
        info!(ports = self.ports.len(), exe = %exe.display(), "restarting in place");
        nix::unistd::execv(&argv[0], &argv).map_err(sys(&format!("exec {}", exe.display())))
    }

    /// Reads the hand-over the previous process left in fd `fd` (closed).
    pub fn read(fd: RawFd) -> Result<Handover, RestartError> {
        let mut text = Vec::new();
        File::from(own(fd)?).read_to_end(&mut text)?;
        let h: Handover = serde_json::from_slice(&text).map_err(|e| RestartError::Refused(e.to_string()))?;
        if h.format != FORMAT {
            return Err(RestartError::Refused(format!("layout {} (this binary reads {FORMAT})", h.format)));
        }
        if let Some(fd) = device::adapter::named_twice(h.ports.iter().flat_map(PortHandover::fds)) {
            return Err(RestartError::Refused(format!("fd {fd} named twice")));
        }
        Ok(h)
    }

    /// The ports, thawed: each one this process can serve again, and for
    /// each that it cannot, the node and why (its fds are closed).
    pub fn into_ports(self) -> (Vec<ParkedPort>, Vec<(u16, RestartError)>) {
        let (mut ok, mut failed) = (Vec::new(), Vec::new());
        for p in self.ports {
            let node = p.node;
            match thaw_port(p) {
                Ok(p) => ok.push(p),
                Err(e) => failed.push((node, e)),
            }
        }
        (ok, failed)
    }
}

fn thaw_port(p: PortHandover) -> Result<ParkedPort, RestartError> {
    for fd in p.fds() {
        // Owned again: closed on the next exec, as every other fd.
        let _ = fcntl(fd, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC));
    }
    let listener = UnixListener::from(own(p.listener)?);
    let client = match p.client {
        None => None,
        Some(c) => {
            let stream = UnixStream::from(own(c.stream)?);
            let fds = match c.fds {
                None => None,
                Some((off, fds)) => Some((off, fds.into_iter().map(own).collect::<Result<Vec<_>, _>>()?)),
            };
            Some(Parked { stream, buffered: c.buffered, fds, multi: c.multi })
        }
    };
    let write_multiple: WriteMultiple = p.write_multiple.parse().map_err(RestartError::Refused)?;
    let adapter = Adapter::thaw(p.adapter).map_err(|e| RestartError::Refused(format!("node {}: {e}", p.node)))?;
    Ok(ParkedPort { node: p.node, name: p.name, listener, adapter, client, vfio: ConnectionConfig { write_multiple } })
}
