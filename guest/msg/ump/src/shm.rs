//! The shared-memory transport: both halves of a channel in one
//! `/dev/shm/ump-ch-<lo>-<hi>` file, mapped by the two processes.
//! Called with the process's UMP state locked (open, accept, converge).

use std::path::PathBuf;
use std::sync::Arc;

use guest_mem::{Mapping, ReadWrite};

use crate::channel::{self, Channel, Transport};
use crate::mem::{Local, Sink, Source};
use crate::{ring, State, UmpError};

/// The file of channel (lo, hi).
pub(crate) fn shm_path(lo: u64, hi: u64) -> PathBuf {
    PathBuf::from(format!("/dev/shm/ump-ch-{lo:016x}-{hi:016x}"))
}

/// Whether process `pid` exists (on this guest).
pub(crate) fn pid_alive(pid: u32) -> bool {
    pid != 0
        && match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None) {
            Ok(()) => true,
            Err(e) => e != nix::errno::Errno::ESRCH,
        }
}

/// An exclusive `flock` on `f` (on its open file description), held
/// until the returned guard drops.
pub(crate) fn lock_file(f: &std::fs::File) -> Result<nix::fcntl::Flock<std::fs::File>, UmpError> {
    let dup = f.try_clone().map_err(|e| UmpError::os("flock", e))?;
    nix::fcntl::Flock::lock(dup, nix::fcntl::FlockArg::LockExclusive).map_err(|(_, e)| UmpError::os("flock", e))
}

fn os(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> UmpError {
    move |e| UmpError::os(what, e)
}

/// Opens our side of the shared-memory channel (local, remote).
pub(crate) fn open_shm(st: &State, local: u64, remote: u64) -> Result<Arc<Channel>, UmpError> {
    let (lo, hi) = (local.min(remote), local.max(remote));
    let side = usize::from(local > remote);
    let size = st.cfg.shm_buffer;
    let half_len = ring::half_len(size);
    let path = shm_path(lo, hi);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(os(path.display()))?;
    // The two openers set up one at a time.
    let lock = lock_file(&f)?;
    let len = f.metadata().map_err(os(path.display()))?.len() as usize;
    let fresh = len == 0;
    if fresh {
        f.set_len((2 * half_len) as u64).map_err(os(path.display()))?;
    } else if len != 2 * half_len {
        return Err(UmpError::Invalid(format!(
            "the other side opened this channel with a {} byte buffer, this process uses {size} (UMP_SHM_BUFFER)",
            len / 2 - ring::RING
        )));
    }
    let map = Arc::new(
        Mapping::<ReadWrite>::from_file(f.try_clone().map_err(os(path.display()))?, 0, 2 * half_len)
            .map_err(|e| UmpError::Mem { what: path.display().to_string(), source: e })?,
    );
    let bad = |e| UmpError::Mem { what: path.display().to_string(), source: e };
    let mine = Local::new(map.clone(), side * half_len, half_len).map_err(bad)?;
    let theirs = Local::new(map.clone(), (1 - side) * half_len, half_len).map_err(bad)?;
    if !fresh {
        let open = Source::load(&mine, ring::OPEN);
        let who = Source::load(&mine, ring::WHO);
        if open != 0 && open != ring::CLOSED && pid_alive(who as u32) {
            return Err(UmpError::Busy(format!("channel {local:#x}->{remote:#x} is open in process {}", who as u32)));
        }
        // Whatever an earlier process left in our half goes.
        let zero = vec![0u8; half_len];
        Sink::write(&mine, 0, &zero);
        let them = Source::load(&theirs, ring::WHO) as u32;
        if Source::load(&theirs, ring::OPEN) == ring::CLOSED || (them != 0 && !pid_alive(them)) {
            Sink::write(&theirs, 0, &zero);
        }
    }
    drop(lock);
    let peer_open = Local::new(map.clone(), (1 - side) * half_len, half_len).map_err(bad)?;
    let (out, peer): (Arc<dyn Sink>, Arc<dyn Source>) = (Arc::new(mine), Arc::new(theirs));
    let alive: channel::Liveness = Box::new(|who| {
        let pid = who as u32;
        if pid == 0 || pid_alive(pid) {
            Ok(())
        } else {
            Err(format!("process {pid} has exited"))
        }
    });
    let who = (st.node as u64) << 32 | std::process::id() as u64;
    let keep = ShmKeep { peer: peer_open, path };
    Ok(Channel::new(local, remote, Transport::Shm, size, out, peer, who, alive, Box::new(keep), None))
}

/// Keeps a shared-memory channel's file mapped; the side that closes last
/// (the other side's OPEN reads CLOSED, or it never came) removes the file.
struct ShmKeep {
    peer: Local,
    path: PathBuf,
}

impl Drop for ShmKeep {
    fn drop(&mut self) {
        let other = Source::load(&self.peer, ring::OPEN);
        if other == ring::CLOSED || other == 0 {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}
