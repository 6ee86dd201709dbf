//! Where the virtual machine's tables live, and the lock that makes each
//! change one critical section: read the whole table, change it, write
//! back what changed.
//!
//! - In a guest with imcd: in MEMORY CHANNEL space (seed 000, "PVM": a
//!   global task table in MEMORY CHANNEL space, under a cluster lock).
//!   Each table is a coherent region (every node receives it from its
//!   allocation, so a task that attaches later sees every write made
//!   before) and lock `i` of one cluster lock set. A change stores only
//!   the 8-byte words that differ, in ascending order through the
//!   transmit mapping with loopback, and waits until the last of them is
//!   back in this node's copy before it lets go of the lock: stores from
//!   one node arrive everywhere in the order made, and the next holder,
//!   on any node, takes the lock after they did.
//! - Elsewhere (the host, a guest without imcd): a file in
//!   `$PVM_TMP/pvmmc.<uid>/` under `flock` ([`crate::locked`]).
//!
//! A table's image is at most [`Kind::size`] bytes; an empty (all-zero)
//! region reads as an empty image. Touched by the thread calling PVM.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use imc_client::guest_mem::{Mapping, ReadOnly, ReadWrite};
use thiserror::Error;

use crate::locked;

/// Bytes of the task table's image (`table::IMAGE`, checked there).
pub const TASKS_IMAGE: usize = 64 + 1024 * 128;
/// The task table's header word (unused by the table, cleared by its
/// changes) where a node with an empty copy asks for the tables in full.
pub const REFRESH_WORD: usize = 56;

/// Locks in a virtual machine's lock set: one per table.
pub const LOCKS: u32 = 4;

/// The tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Tasks,
    Groups,
    Notify,
    Mbox,
}

impl Kind {
    /// The table's number: its lock in the set, and its key's low bits.
    fn index(self) -> u32 {
        match self {
            Kind::Tasks => 0,
            Kind::Groups => 1,
            Kind::Notify => 2,
            Kind::Mbox => 3,
        }
    }

    /// Its file's name.
    fn file(self) -> &'static str {
        match self {
            Kind::Tasks => "tasks",
            Kind::Groups => "groups",
            Kind::Notify => "notify",
            Kind::Mbox => "mbox",
        }
    }

    /// The largest image, in bytes (the region's size).
    pub fn size(self) -> usize {
        match self {
            Kind::Tasks => TASKS_IMAGE,
            Kind::Groups => 64 << 10,
            Kind::Notify => 64 << 10,
            Kind::Mbox => crate::mbox::IMAGE,
        }
    }
}

/// What went wrong with a table's storage.
#[derive(Debug, Error)]
pub enum StoreError {
    #[error("{0}")]
    File(#[from] locked::LockedError),
    #[error("imcd: {0}")]
    Imc(#[from] imc_client::ImcError),
    #[error("MEMORY CHANNEL mapping: {0}")]
    Map(String),
    #[error("the {0:?} table's region holds {1} bytes, fewer than {2}")]
    Small(Kind, usize, usize),
    #[error("the {what:?} table grew to {len} bytes, more than its {max} (store::Kind::size)")]
    Full { what: Kind, len: usize, max: usize },
    #[error("{0}'s cluster lock was not free within {1} s")]
    Lock(&'static str, u64),
    #[error("our own stores to the {0:?} table did not come back within {1} s")]
    NoLoopback(Kind, u64),
}

/// How long a change waits for the table's lock, and for its own stores
/// to come back.
const LOCK_WAIT: Duration = Duration::from_secs(20);

/// A table's storage.
pub enum Store {
    File(PathBuf),
    Mc(McTable),
}

/// A table in MEMORY CHANNEL space.
pub struct McTable {
    kind: Kind,
    tx: Mapping<ReadWrite>,
    rx: Mapping<ReadOnly>,
    locks: std::rc::Rc<imc_client::LockSet>,
    _imc: std::rc::Rc<imc_client::Imc>,
    /// Whether this process allocated the region (else it existed).
    created: bool,
}

/// The region key of virtual machine `vm`'s table `kind` (the user
/// namespace, with PVM's tag in the payload).
fn key(vm: u16, kind: Kind) -> u64 {
    0x0050_564d_0000_0000 | u64::from(vm) << 8 | u64::from(kind.index())
}

/// The tables of one virtual machine in MEMORY CHANNEL space: one
/// connection to imcd and one lock set for all.
pub struct McTables {
    imc: std::rc::Rc<imc_client::Imc>,
    locks: std::rc::Rc<imc_client::LockSet>,
    vm: u16,
}

impl McTables {
    /// Connects to imcd and joins (or makes) virtual machine `vm`'s locks.
    pub fn open(vm: u16) -> Result<McTables, StoreError> {
        let imc = imc_client::Imc::connect()?;
        let (locks, _) = imc.lkalloc(key(vm, Kind::Tasks), LOCKS, 0o600, false)?;
        Ok(McTables { imc: std::rc::Rc::new(imc), locks: std::rc::Rc::new(locks), vm })
    }

    /// Table `kind`, allocated coherently on first use.
    pub fn table(&self, kind: Kind) -> Result<Store, StoreError> {
        let want = kind.size();
        let (id, _, _, created) = self.imc.asalloc_flags(key(self.vm, kind), want as u64, 0o600, false, true)?;
        let tx = self.imc.asattach_tx(id, true)?;
        let rx = self.imc.asattach_rx(id)?;
        let got = tx.len().min(rx.len());
        if got < want {
            return Err(StoreError::Small(kind, got, want));
        }
        Ok(Store::Mc(McTable { kind, tx, rx, locks: self.locks.clone(), _imc: self.imc.clone(), created }))
    }
}

impl Store {
    /// Table `kind` as a file in folder `dir`.
    pub fn file(dir: &Path, kind: Kind) -> Result<Store, StoreError> {
        std::fs::create_dir_all(dir).map_err(|err| locked::LockedError { path: dir.to_path_buf(), err })?;
        Ok(Store::File(dir.join(kind.file())))
    }

    /// Whether the table is in MEMORY CHANNEL space.
    pub fn is_mc(&self) -> bool {
        matches!(self, Store::Mc(_))
    }

    /// Runs `f` on the table's image under its lock, storing what `f`
    /// changed.
    pub fn update<R>(&self, f: impl FnOnce(&mut Vec<u8>) -> R) -> Result<R, StoreError> {
        match self {
            Store::File(path) => Ok(locked::update(path, f)?),
            Store::Mc(t) => t.update(f),
        }
    }

    /// False once the imcd that handed out this table's mappings has gone
    /// away: they must be dropped before a new imcd can own the adapter.
    pub fn imcd_alive(&self) -> bool {
        match self {
            Store::File(_) => true,
            Store::Mc(t) => t._imc.daemon_alive(),
        }
    }

    /// Whether this node's copy of a table that existed before it was
    /// attached reads an empty first word. Only the copy of a node that
    /// joined a running cluster (a guest restarted) can, for a table whose
    /// first word is never zero once written: imcd does not send a
    /// newcomer the contents of a coherent region made before it came
    /// (docs/hub.md, "Membership"), so its copy lacks what was written
    /// before, and a change made from it would overwrite the others'.
    pub fn copy_lacks_first_word(&self) -> bool {
        match self {
            Store::File(_) => false,
            Store::Mc(t) => !t.created && t.rx.load::<u64>(0).map_or(true, |w| w == 0),
        }
    }

    /// Stores this node's copy of the table again, every word of it that
    /// is not zero, under the table's lock: a node that came back (its
    /// imcd restarted, or the guest rebooted into the cluster) receives
    /// the whole table, which imcd does not send it. Harmless when
    /// repeated or done by two nodes at once. Nothing to do for a file.
    pub fn refresh(&self) -> Result<(), StoreError> {
        match self {
            Store::File(_) => Ok(()),
            Store::Mc(t) => t.refresh(),
        }
    }

    /// Asks the daemons of the other nodes to store the tables again in
    /// full (a node whose copy is empty, [`Store::copy_lacks_first_word`]):
    /// writes `v` (not zero, different each time) into the task table's
    /// request word, which every node's daemon looks at once a second
    /// ([`Store::refresh_request`]). The table's next change clears it.
    pub fn request_refresh(&self, v: u64) -> Result<(), StoreError> {
        match self {
            Store::File(_) => Ok(()),
            Store::Mc(t) => t.tx.store(REFRESH_WORD, v).map_err(|e| StoreError::Map(e.to_string())),
        }
    }

    /// The task table's request word in this node's copy (0: none).
    pub fn refresh_request(&self) -> u64 {
        match self {
            Store::File(_) => 0,
            Store::Mc(t) => t.rx.load::<u64>(REFRESH_WORD).unwrap_or(0),
        }
    }

    /// The file's path, or None in MEMORY CHANNEL space.
    pub fn path(&self) -> Option<&Path> {
        match self {
            Store::File(p) => Some(p),
            Store::Mc(_) => None,
        }
    }
}

impl McTable {
    fn update<R>(&self, f: impl FnOnce(&mut Vec<u8>) -> R) -> Result<R, StoreError> {
        self.under_lock(|| self.locked(f))
    }

    fn refresh(&self) -> Result<(), StoreError> {
        self.under_lock(|| self.store_all())
    }

    /// Runs `f` holding the table's cluster lock.
    fn under_lock<R>(&self, f: impl FnOnce() -> Result<R, StoreError>) -> Result<R, StoreError> {
        let lock = self.kind.index();
        let name = self.kind.file();
        self.locks.acquire(lock, LOCK_WAIT).map_err(|e| match e {
            imc_client::ImcError::Refused { .. } | imc_client::ImcError::Protocol(_) => StoreError::Imc(e),
            _ => StoreError::Lock(name, LOCK_WAIT.as_secs()),
        })?;
        let r = f();
        let released = self.locks.release(lock);
        let r = r?;
        released?;
        Ok(r)
    }

    /// Every non-zero word of this node's copy, stored again; waits until
    /// the last is back (loopback).
    fn store_all(&self) -> Result<(), StoreError> {
        let image = self.rx.read_vec(0, self.kind.size()).map_err(|e| StoreError::Map(e.to_string()))?;
        let mut last = None;
        for (w, word) in image.chunks_exact(8).enumerate() {
            let v = u64::from_ne_bytes(word.try_into().unwrap_or_default());
            if v != 0 {
                self.tx.store(w * 8, v).map_err(|e| StoreError::Map(e.to_string()))?;
                last = Some((w * 8, v));
            }
        }
        self.wait_back(last)
    }

    /// Waits until the store `last` (offset, value) is in this node's copy.
    fn wait_back(&self, last: Option<(usize, u64)>) -> Result<(), StoreError> {
        if let Some((off, v)) = last {
            let t0 = Instant::now();
            while self.rx.load::<u64>(off).map_err(|e| StoreError::Map(e.to_string()))? != v {
                if t0.elapsed() > LOCK_WAIT {
                    return Err(StoreError::NoLoopback(self.kind, LOCK_WAIT.as_secs()));
                }
                std::thread::yield_now();
            }
        }
        Ok(())
    }

    fn locked<R>(&self, f: impl FnOnce(&mut Vec<u8>) -> R) -> Result<R, StoreError> {
        let size = self.kind.size();
        let before = self.rx.read_vec(0, size).map_err(|e| StoreError::Map(e.to_string()))?;
        // The image is the region up to its last non-zero byte.
        let used = before.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        let mut image = before[..used].to_vec();
        let r = f(&mut image);
        if image.len() > size {
            return Err(StoreError::Full { what: self.kind, len: image.len(), max: size });
        }
        image.resize(size, 0);
        let mut last = None;
        for (w, (new, old)) in image.chunks_exact(8).zip(before.chunks_exact(8)).enumerate() {
            if new != old {
                let v = u64::from_ne_bytes(new.try_into().unwrap_or_default());
                self.tx.store(w * 8, v).map_err(|e| StoreError::Map(e.to_string()))?;
                last = Some((w * 8, v));
            }
        }
        self.wait_back(last)?;
        Ok(r)
    }
}
