//! The client's end of a vfio-user socket: enlarging the send buffer of the
//! QEMU that connected, so its stores never find the socket full.
//!
//! QEMU 10.x sends a guest's posted store from the vCPU thread while its
//! outgoing queue is empty and the socket takes the message. When the socket
//! is full (the server was descheduled for a moment), QEMU queues the store,
//! and from then on queues every message behind it: the vCPU no longer pays
//! a system call per store, so a flooding guest outruns the server and the
//! queue grows without bound, with register reads waiting behind it until
//! they time out (`docs/adapter.md`, "The store path"). A unix stream socket
//! is full when the bytes the sender has in flight reach the *sender's*
//! `SO_SNDBUF` (212 KiB by default: about 250 small stores, under a
//! millisecond of server stall). Only QEMU's socket has that buffer, and
//! QEMU 10.2 only connects by path, so the server reaches across: the peer's
//! pid from `SO_PEERCRED`, its socket with `pidfd_getfd(2)` (needs ptrace
//! rights over QEMU: root, or CAP_SYS_PTRACE), then `SO_SNDBUFFORCE` (needs
//! CAP_NET_ADMIN) on that same socket. Memory is only charged for bytes
//! actually waiting, so a large buffer costs nothing while the server keeps
//! up.
//!
//! Touched by the thread that accepted the connection, once, before the
//! first message.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use nix::sys::socket::{getpeername, getsockopt, setsockopt, sockopt, UnixAddr};
use rustix::process::{pidfd_getfd, pidfd_open, Pid, PidfdFlags, PidfdGetfdFlags};
use thiserror::Error;

/// The send buffer asked for (the kernel doubles it for its bookkeeping):
/// 128 MiB, about 150,000 queued small stores, a third of a second of the
/// server's store rate.
pub const CLIENT_SNDBUF: usize = 64 << 20;

/// Why the client's send buffer could not be enlarged.
#[derive(Debug, Error)]
pub enum ClientSocketError {
    /// The socket has no peer credentials (not a connected unix socket).
    #[error("cannot read the client's credentials: {0}")]
    Credentials(nix::Error),
    /// The client's pid cannot be opened (it exited, or no rights).
    #[error("cannot open client process {pid}: {source}")]
    Process {
        /// The client's pid.
        pid: i32,
        /// What the kernel said.
        source: rustix::io::Errno,
    },
    /// Our end has no path, so the client's socket cannot be told apart.
    #[error("the server's socket has no path: the client's socket cannot be found")]
    Unnamed,
    /// Its fd table cannot be listed.
    #[error("cannot list the fds of client process {pid}: {source}")]
    Fds {
        /// The client's pid.
        pid: i32,
        /// What the kernel said.
        source: std::io::Error,
    },
    /// None of its sockets is connected to ours (or none could be taken:
    /// `pidfd_getfd` needs ptrace rights over the client).
    #[error("no socket of client process {pid} connected to {path} could be taken{}", last.as_ref().map(|e| format!(" ({e})")).unwrap_or_default())]
    NotFound {
        /// The client's pid.
        pid: i32,
        /// Our end's address.
        path: String,
        /// The last error taking one of its fds.
        last: Option<rustix::io::Errno>,
    },
    /// Setting the buffer was refused (no CAP_NET_ADMIN).
    #[error("cannot set SO_SNDBUFFORCE on the client's socket: {0}")]
    Set(nix::Error),
}

/// Enlarges the send buffer of the client connected to `stream` (an accepted
/// unix socket) to `bytes`. Returns the buffer size the kernel now reports.
pub fn widen_client_sndbuf(stream: &UnixStream, bytes: usize) -> Result<usize, ClientSocketError> {
    let cred = getsockopt(stream, sockopt::PeerCredentials).map_err(ClientSocketError::Credentials)?;
    let pid = cred.pid();
    // Only a listener bound to a path names its clients' sockets: an unnamed
    // one (a socketpair) cannot be told from the client's other sockets.
    let ours = stream.local_addr().ok().and_then(|a| a.as_pathname().map(Path::to_path_buf));
    let Some(ours) = ours else { return Err(ClientSocketError::Unnamed) };
    let pidfd = Pid::from_raw(pid).ok_or(nix::Error::ESRCH).map_err(ClientSocketError::Credentials).and_then(|p| {
        pidfd_open(p, PidfdFlags::empty()).map_err(|source| ClientSocketError::Process { pid, source })
    })?;
    let dir = PathBuf::from(format!("/proc/{pid}/fd"));
    let entries = std::fs::read_dir(&dir).map_err(|source| ClientSocketError::Fds { pid, source })?;
    let mut last = None;
    let mut size = None;
    for entry in entries.flatten() {
        let is_socket = std::fs::read_link(entry.path()).is_ok_and(|t| t.to_string_lossy().starts_with("socket:"));
        let Some(fd) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        if !is_socket {
            continue;
        }
        let theirs: OwnedFd = match pidfd_getfd(&pidfd, fd, PidfdGetfdFlags::empty()) {
            Ok(f) => f,
            Err(e) => {
                last = Some(e);
                continue;
            }
        };
        if !connected_to(&theirs, &ours) {
            continue;
        }
        setsockopt(&theirs, sockopt::SndBufForce, &bytes).map_err(ClientSocketError::Set)?;
        size = Some(getsockopt(&theirs, sockopt::SndBuf).unwrap_or(bytes));
    }
    size.ok_or_else(|| ClientSocketError::NotFound { pid, path: ours.display().to_string(), last })
}

/// True when `fd` is a unix socket connected to the socket bound at `ours`.
fn connected_to(fd: &impl AsFd, ours: &Path) -> bool {
    use std::os::fd::AsRawFd;
    let Ok(peer) = getpeername::<UnixAddr>(fd.as_fd().as_raw_fd()) else { return false };
    peer.path() == Some(ours)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    #[test]
    fn the_connected_clients_buffer_grows_and_only_its() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let other_path = dir.path().join("other");
        let listener = UnixListener::bind(&path).unwrap();
        let _other_listener = UnixListener::bind(&other_path).unwrap();
        let client = UnixStream::connect(&path).unwrap();
        let bystander = UnixStream::connect(&other_path).unwrap();
        let before = getsockopt(&bystander, sockopt::SndBuf).unwrap();
        let (server, _) = listener.accept().unwrap();
        match widen_client_sndbuf(&server, 8 << 20) {
            Ok(n) => {
                assert!(n >= 8 << 20, "reported {n}");
                assert!(getsockopt(&client, sockopt::SndBuf).unwrap() >= 8 << 20);
                assert_eq!(
                    getsockopt(&bystander, sockopt::SndBuf).unwrap(),
                    before,
                    "a socket to another path changed"
                );
            }
            // Root has the rights it takes; others get an error that says
            // what was refused.
            Err(e) if rustix::process::geteuid().is_root() => panic!("root could not widen: {e}"),
            Err(e) => {
                assert!(e.to_string().contains("SO_SNDBUFFORCE") || e.to_string().contains("could be taken"), "{e}")
            }
        }
    }

    #[test]
    fn a_socketpair_is_refused_not_guessed() {
        let (a, b) = UnixStream::pair().unwrap();
        let before = getsockopt(&b, sockopt::SndBuf).unwrap();
        let e = widen_client_sndbuf(&a, 4 << 20).unwrap_err();
        assert!(matches!(e, ClientSocketError::Unnamed), "{e}");
        assert_eq!(getsockopt(&b, sockopt::SndBuf).unwrap(), before);
    }
}
