//! `mc-agent`: the guest side of `mc-cluster exec` and `mc-cluster cp`.
//!
//! Finds the virtio-serial port named `mc.agent`, then answers requests one
//! at a time ([`agent::server`]). Started (and restarted if it dies) by the
//! guest's init. Between hosts it sleeps until the port says one connected
//! ([`HostWatch`]): an idle guest's agent takes no CPU.

use std::fs::{self, File, OpenOptions};
use std::os::fd::{AsFd, AsRawFd};
use std::path::PathBuf;
use std::thread;
use std::time::Duration;

use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

use agent::PORT_NAME;

/// The longest the agent waits for a host before it looks at the port
/// again anyway (a lost wake-up costs at most this).
const NO_HOST_WAIT: Duration = Duration::from_secs(1);

/// Waits for a host to connect to the port. With no host connected a
/// virtio-serial port reads as end of file and polls as hung up at once,
/// so neither can be waited on; but the port sends SIGIO to its owner on
/// every open and close of the host side (and on data). SIGIO is blocked
/// in every thread (commands start with a clean mask) and read from a
/// signalfd, so one that comes between the end of file and the wait is
/// not lost. Polling every 20 ms instead took 6% of an idle guest's CPU
/// under TCG.
struct HostWatch {
    sfd: SignalFd,
}

impl HostWatch {
    /// Asks `port` for SIGIO; None when it cannot (then the agent polls).
    fn new(port: &File) -> Option<HostWatch> {
        let mut set = SigSet::empty();
        set.add(Signal::SIGIO);
        set.thread_block().ok()?;
        let sfd = SignalFd::with_flags(&set, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC).ok()?;
        // SAFETY: F_SETOWN on a descriptor we own, with our own pid (nix has
        // no wrapper for F_SETOWN).
        if unsafe { libc::fcntl(port.as_raw_fd(), libc::F_SETOWN, std::process::id() as libc::c_int) } != 0 {
            return None;
        }
        let flags = OFlag::from_bits_retain(fcntl(port.as_raw_fd(), FcntlArg::F_GETFL).ok()?);
        fcntl(port.as_raw_fd(), FcntlArg::F_SETFL(flags | OFlag::O_ASYNC)).ok()?;
        Some(HostWatch { sfd })
    }

    /// Returns after a SIGIO (or `NO_HOST_WAIT`), with every one pending
    /// taken.
    fn wait(&self) {
        let mut fds = [PollFd::new(self.sfd.as_fd(), PollFlags::POLLIN)];
        let _ = nix::poll::poll(&mut fds, PollTimeout::try_from(NO_HOST_WAIT).unwrap_or(PollTimeout::MAX));
        while let Ok(Some(_)) = self.sfd.read_signal() {}
    }
}

fn find_port() -> Option<PathBuf> {
    for e in fs::read_dir("/sys/class/virtio-ports").ok()?.flatten() {
        let name = fs::read_to_string(e.path().join("name")).unwrap_or_default();
        if name.trim() == PORT_NAME {
            return Some(PathBuf::from("/dev").join(e.file_name()));
        }
    }
    None
}

fn main() {
    let port = loop {
        match find_port() {
            Some(p) => break p,
            None => thread::sleep(Duration::from_millis(100)),
        }
    };
    eprintln!("mc-agent: serving on {}", port.display());
    let mut f = match OpenOptions::new().read(true).write(true).open(&port) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("mc-agent: {}: {e}", port.display());
            std::process::exit(1);
        }
    };
    let watch = HostWatch::new(&f);
    if watch.is_none() {
        eprintln!("mc-agent: {}: no SIGIO from the port; polling for a host every 20 ms", port.display());
    }
    loop {
        // `serve` returns when the port reads as end of file: no host is
        // connected. Wait for one.
        if let Err(e) = agent::server::serve(&mut f) {
            eprintln!("mc-agent: {}: {e}", port.display());
            std::process::exit(1);
        }
        match &watch {
            Some(w) => w.wait(),
            None => thread::sleep(Duration::from_millis(20)),
        }
    }
}
