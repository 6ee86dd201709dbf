//! A file of the virtual machine read and rewritten whole under an
//! exclusive `flock`: what the task table and the group table are stored
//! in on one machine (`$PVM_TMP/pvmmc.<uid>/`). One call is one critical
//! section: read, change, write back if changed.
//!
//! Called on the thread calling PVM (under the C layer's lock); tasks
//! exclude each other with the lock.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use thiserror::Error;

/// A file that could not be used.
#[derive(Debug, Error)]
#[error("{path}: {err}")]
pub struct LockedError {
    pub path: PathBuf,
    pub err: std::io::Error,
}

/// Runs `f` on the contents of `path` (empty if the file is new) with the
/// file locked; writes the contents back when `f` changed them.
pub fn update<R>(path: &Path, f: impl FnOnce(&mut Vec<u8>) -> R) -> Result<R, LockedError> {
    let io = |err| LockedError { path: path.to_path_buf(), err };
    let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path).map_err(io)?;
    let mut file: Flock<File> = Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, e)| io(e.into()))?;
    let mut raw = Vec::new();
    file.read_to_end(&mut raw).map_err(io)?;
    let before = raw.clone();
    let r = f(&mut raw);
    if raw != before {
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        file.write_all(&raw).map_err(io)?;
        file.set_len(raw.len() as u64).map_err(io)?;
    }
    Ok(r)
}
