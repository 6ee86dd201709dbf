//! The task table: every task of the virtual machine with its TID,
//! parent, process, flags and program, in a file every task maps under a
//! lock (seed 000, "PVM": operations run in-line; `pvm_mytid` takes a lock
//! on the global task table, takes a TID and releases the lock; no daemon
//! is involved). Also the TID layout PVM programs rely on.
//!
//! The file is `$PVM_TMP/pvmmc.<uid>/tasks` (`PVM_TMP` defaults to `/tmp`):
//! one virtual machine per user and folder. Entries of processes that are
//! gone (or zombies) are freed by whoever looks next.
//!
//! Touched by the thread calling PVM in each task (under the C layer's
//! lock); tasks exclude each other with `flock`.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use thiserror::Error;

use crate::store::{Store, StoreError};

/// TID bits: the host field (PVM's `TIDHOST`).
pub const TID_HOST: i32 = 0x3ffc_0000;
/// TID bits: the task's number on its host (`TIDLOCAL`).
pub const TID_LOCAL: i32 = 0x0003_ffff;
/// Shift of the host field.
pub const HOST_SHIFT: u32 = 18;

/// The TID of task `local` on host `host` (host numbers start at 1).
pub fn tid(host: u32, local: u32) -> i32 {
    ((host << HOST_SHIFT) as i32 & TID_HOST) | (local as i32 & TID_LOCAL)
}

/// The host number of a TID.
pub fn host_of(tid: i32) -> u32 {
    ((tid & TID_HOST) >> HOST_SHIFT) as u32
}

/// Tasks one table holds.
pub const MAX_TASKS: usize = 1024;
/// Bytes of a program name kept per task.
pub const NAME_MAX: usize = 104;

const MAGIC: u64 = u64::from_le_bytes(*b"PVMMCTB1");
const HEADER: usize = 64;
const ENTRY: usize = 128;
/// Bytes of the table's image.
pub const IMAGE: usize = HEADER + MAX_TASKS * ENTRY;
const _: () = assert!(IMAGE == crate::store::TASKS_IMAGE);

/// What went wrong with the table.
#[derive(Debug, Error)]
pub enum TableError {
    #[error("the task table: {0}")]
    Store(#[from] StoreError),
    #[error("the task table is not one of ours (bad magic); remove {0}")]
    Foreign(String),
    #[error("the task table is full: {MAX_TASKS} tasks (table::MAX_TASKS)")]
    Full,
    #[error("no task t{0:x} in the table")]
    NoTask(i32),
}

/// A task's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Spawned: its TID is taken, the process has not enrolled yet.
    Starting,
    /// Enrolled.
    Running,
}

/// One task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Task {
    pub tid: i32,
    pub ptid: i32,
    pub pid: i32,
    pub flag: i32,
    pub state: State,
    pub name: String,
}

impl Task {
    fn encode(&self, out: &mut [u8]) {
        out.fill(0);
        out[0..4].copy_from_slice(&self.tid.to_le_bytes());
        out[4..8].copy_from_slice(&self.ptid.to_le_bytes());
        out[8..12].copy_from_slice(&self.pid.to_le_bytes());
        out[12..16].copy_from_slice(&self.flag.to_le_bytes());
        out[16] = match self.state {
            State::Starting => 1,
            State::Running => 2,
        };
        let name = self.name.as_bytes();
        let n = name.len().min(NAME_MAX - 1);
        out[24..24 + n].copy_from_slice(&name[..n]);
    }

    fn decode(e: &[u8]) -> Option<Task> {
        let int = |at: usize| i32::from_le_bytes([e[at], e[at + 1], e[at + 2], e[at + 3]]);
        let state = match e[16] {
            1 => State::Starting,
            2 => State::Running,
            _ => return None,
        };
        let name = &e[24..24 + NAME_MAX];
        let end = name.iter().position(|&b| b == 0).unwrap_or(NAME_MAX);
        Some(Task {
            tid: int(0),
            ptid: int(4),
            pid: int(8),
            flag: int(12),
            state,
            name: String::from_utf8_lossy(&name[..end]).into_owned(),
        })
    }
}

/// Whether process `pid` of this machine is alive (a zombie is not).
pub fn alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name's closing parenthesis.
        Ok(s) => s.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

/// The table of one virtual machine.
pub struct Table {
    store: Store,
    host: u32,
}

/// The folder of this user's virtual machine: `$PVM_TMP/pvmmc.<uid>`.
pub fn vm_dir() -> PathBuf {
    let tmp = std::env::var_os("PVM_TMP").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/tmp"));
    tmp.join(format!("pvmmc.{}", nix::unistd::getuid()))
}

/// Which tasks are there, for dropping what gone tasks left in the other
/// tables (group members, mailbox entries, notify requests). The task
/// table is read at the first question, not before: asked from inside
/// another table's critical section, it is read under that table's lock.
/// A task enrolls before it joins a group, puts an entry or asks for a
/// notification, so whatever is in that table when its lock is taken
/// belongs to a task this read sees (unless it is really gone). A read
/// taken before the lock would miss a task that enrolled and joined in
/// between, and drop its entry.
pub struct Live<'a> {
    table: &'a Table,
    tids: std::cell::OnceCell<Option<std::collections::HashSet<i32>>>,
}

impl Live<'_> {
    /// Whether task `tid` is there. A table that cannot be read says
    /// nothing is gone.
    pub fn contains(&self, tid: i32) -> bool {
        self.tids
            .get_or_init(|| self.table.tasks().ok().map(|t| t.into_iter().map(|t| t.tid).collect()))
            .as_ref()
            .is_none_or(|s| s.contains(&tid))
    }
}

/// A table's contents, read under its lock.
struct Locked {
    next: u32,
    tasks: Vec<Option<Task>>,
}

impl Table {
    /// Its store (to be stored again in full for a node that came back).
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The table in `store`, for a task of host `host`.
    pub fn open(store: Store, host: u32) -> Table {
        Table { store, host }
    }

    /// Whether the imcd behind the table is still there (always, for a
    /// file).
    pub fn imcd_alive(&self) -> bool {
        self.store.imcd_alive()
    }

    /// This task's host number.
    pub fn host(&self) -> u32 {
        self.host
    }

    /// A 16-bit number naming a virtual machine kept in files (its table
    /// file), so that two on one machine never share a UMP handle.
    pub fn file_vm_id(&self) -> Result<Option<u16>, TableError> {
        let Some(path) = self.store.path() else { return Ok(None) };
        self.with(|_| Ok(()))?;
        let m = std::fs::metadata(path)
            .map_err(|err| StoreError::File(crate::locked::LockedError { path: path.to_path_buf(), err }))?;
        let h = (m.dev() ^ m.ino().rotate_left(17)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        Ok(Some((h >> 48) as u16))
    }

    /// Runs `f` on the table under its lock, storing what it changed.
    fn with<R>(&self, f: impl FnOnce(&mut Locked) -> Result<R, TableError>) -> Result<R, TableError> {
        let where_ =
            || self.store.path().map_or_else(|| "the MEMORY CHANNEL region".to_string(), |p| p.display().to_string());
        self.store.update(|raw| {
            // An image shorter than the table (a region read up to its
            // last non-zero byte) is zeros to the end.
            // A first word of zero is a table not made yet, whatever else
            // is there (a node with an empty copy may have asked for the
            // tables in the header: store::REFRESH_WORD).
            let first = raw.get(..8).map_or(0, |w| u64::from_le_bytes(w.try_into().unwrap_or_default()));
            let mut l = if first == 0 && raw.len() <= HEADER {
                Locked { next: 1, tasks: vec![None; MAX_TASKS] }
            } else if raw.len() > IMAGE || first != MAGIC {
                return Err(TableError::Foreign(where_()));
            } else {
                raw.resize(IMAGE, 0);
                Locked {
                    next: u32::from_le_bytes([raw[8], raw[9], raw[10], raw[11]]),
                    tasks: raw[HEADER..].chunks_exact(ENTRY).map(Task::decode).collect(),
                }
            };
            let r = f(&mut l)?;
            raw.clear();
            raw.resize(IMAGE, 0);
            raw[..8].copy_from_slice(&MAGIC.to_le_bytes());
            raw[8..12].copy_from_slice(&l.next.to_le_bytes());
            for (t, e) in l.tasks.iter().zip(raw[HEADER..].chunks_exact_mut(ENTRY)) {
                if let Some(t) = t {
                    t.encode(e);
                }
            }
            Ok(r)
        })?
    }

    /// Frees the entries of this host's processes that are gone (only
    /// this host can tell); returns their tasks.
    fn reap(l: &mut Locked, host: u32) -> Vec<Task> {
        let mut gone = Vec::new();
        for e in l.tasks.iter_mut() {
            if e.as_ref().is_some_and(|t| host_of(t.tid) == host && t.pid != 0 && !alive(t.pid)) {
                gone.extend(e.take());
            }
        }
        gone
    }

    /// Takes a TID for a new task (state `Starting` with `pid` 0 until
    /// [`Table::set_pid`], or `Running` for the calling process).
    pub fn add(&self, ptid: i32, pid: i32, flag: i32, state: State, name: &str) -> Result<i32, TableError> {
        self.add_on(self.host, ptid, pid, flag, state, name)
    }

    /// [`Table::add`] for a task of host `host` (spawned there by its
    /// daemon).
    pub fn add_on(
        &self,
        host: u32,
        ptid: i32,
        pid: i32,
        flag: i32,
        state: State,
        name: &str,
    ) -> Result<i32, TableError> {
        let me = self.host;
        self.with(|l| {
            Self::reap(l, me);
            Self::reap(l, host);
            let slot = l.tasks.iter().position(Option::is_none).ok_or(TableError::Full)?;
            // The next local number not in use (PVM counts up, then wraps).
            let used: std::collections::HashSet<i32> = l.tasks.iter().flatten().map(|t| t.tid & TID_LOCAL).collect();
            let mut local = l.next.max(1);
            while used.contains(&(local as i32)) {
                local = if local as i32 >= TID_LOCAL { 1 } else { local + 1 };
            }
            l.next = if local as i32 >= TID_LOCAL { 1 } else { local + 1 };
            let t = tid(host, local);
            l.tasks[slot] = Some(Task { tid: t, ptid, pid, flag, state, name: name.into() });
            Ok(t)
        })
    }

    /// Puts a host's daemon entry (task number 0) in the table, replacing
    /// an old one of a daemon that is gone. Returns whether the host is
    /// new to the virtual machine (it had no entry: first start, or back
    /// after it was repaired out).
    pub fn put(&self, daemon: i32, pid: i32, name: &str) -> Result<bool, TableError> {
        self.with(|l| {
            let mut new = true;
            for e in l.tasks.iter_mut() {
                if e.as_ref().is_some_and(|t| t.tid == daemon) {
                    *e = None;
                    new = false;
                }
            }
            let slot = l.tasks.iter().position(Option::is_none).ok_or(TableError::Full)?;
            l.tasks[slot] = Some(Task { tid: daemon, ptid: 0, pid, flag: 0, state: State::Running, name: name.into() });
            Ok(new)
        })
    }

    /// Frees every entry of host `host`, its daemon's included (the host
    /// failed and imcd repaired it out); returns them. Removing what is
    /// already gone changes nothing, so daemons doing it at once are
    /// harmless: each change is one critical section.
    pub fn remove_host(&self, host: u32) -> Result<Vec<Task>, TableError> {
        self.with(|l| {
            let mut gone = Vec::new();
            for e in l.tasks.iter_mut() {
                if e.as_ref().is_some_and(|t| host_of(t.tid) == host) {
                    gone.extend(e.take());
                }
            }
            Ok(gone)
        })
    }

    /// Records the process of a spawned task.
    pub fn set_pid(&self, tid: i32, pid: i32) -> Result<(), TableError> {
        self.update(tid, |t| t.pid = pid).map(drop)
    }

    /// A spawned task enrolls: its process, now running. Returns its entry.
    pub fn enroll(&self, tid: i32, pid: i32) -> Result<Task, TableError> {
        self.update(tid, |t| {
            t.pid = pid;
            t.state = State::Running;
        })
    }

    /// Changes task `tid` with `f`; returns it as changed.
    fn update(&self, tid: i32, f: impl FnOnce(&mut Task)) -> Result<Task, TableError> {
        self.with(|l| {
            let t = l.tasks.iter_mut().flatten().find(|t| t.tid == tid).ok_or(TableError::NoTask(tid))?;
            f(t);
            Ok(t.clone())
        })
    }

    /// Removes a task (it exits, or its spawn failed).
    pub fn remove(&self, tid: i32) -> Result<(), TableError> {
        self.with(|l| {
            for e in l.tasks.iter_mut() {
                if e.as_ref().is_some_and(|t| t.tid == tid) {
                    *e = None;
                }
            }
            Ok(())
        })
    }

    /// Every task, after freeing those whose process is gone.
    pub fn tasks(&self) -> Result<Vec<Task>, TableError> {
        let host = self.host;
        self.with(|l| {
            Self::reap(l, host);
            Ok(l.tasks.iter().flatten().cloned().collect())
        })
    }

    /// The tasks there, read when first asked ([`Live`]).
    pub fn live(&self) -> Live<'_> {
        Live { table: self, tids: std::cell::OnceCell::new() }
    }

    /// The task with TID `tid`, if it is there.
    pub fn find(&self, tid: i32) -> Result<Option<Task>, TableError> {
        Ok(self.tasks()?.into_iter().find(|t| t.tid == tid))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tids_have_pvms_layout() {
        assert_eq!(tid(1, 1), 0x40001);
        assert_eq!(tid(4, 0x3ffff), 0x13ffff);
        assert_eq!(host_of(0x80002), 2);
        assert_eq!(format!("t{:x}", tid(1, 2)), "t40002");
    }

    #[test]
    fn tids_are_unique_reused_and_freed_with_their_process() {
        let dir = tempfile::tempdir().unwrap();
        let t = Table::open(Store::file(dir.path(), crate::store::Kind::Tasks).unwrap(), 1);
        let me = std::process::id() as i32;
        let a = t.add(-23, me, 0, State::Running, "a").unwrap();
        let b = t.add(a, 0, 0, State::Starting, "b").unwrap();
        assert_eq!((a, b), (0x40001, 0x40002));
        // A process that is gone loses its entry at the next look.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        child.wait().unwrap();
        t.set_pid(b, pid).unwrap();
        let tasks = t.tasks().unwrap();
        assert_eq!(tasks.len(), 1);
        assert_eq!(tasks[0].name, "a");
        assert_eq!(tasks[0].state, State::Running);
        // Numbers go on counting before they are reused.
        let c = t.add(a, me, 0, State::Running, "c").unwrap();
        assert_eq!(c, 0x40003);
        t.remove(a).unwrap();
        assert_eq!(t.find(a).unwrap(), None);
        assert!(matches!(t.enroll(b, me), Err(TableError::NoTask(_))));
        // A failed host's entries go at once, its daemon's too; twice is
        // harmless.
        let d2 = tid(2, 0);
        assert!(t.put(d2, me, "node1").unwrap(), "new host");
        assert!(!t.put(d2, me, "node1").unwrap(), "the same host again");
        let x = t.add_on(2, c, 0, 0, State::Starting, "x").unwrap();
        let gone: Vec<i32> = t.remove_host(2).unwrap().into_iter().map(|t| t.tid).collect();
        assert_eq!(gone, vec![d2, x]);
        assert_eq!(t.remove_host(2).unwrap(), vec![]);
        assert_eq!(t.tasks().unwrap().iter().map(|t| t.tid).collect::<Vec<_>>(), vec![c]);
        let other = tempfile::tempdir().unwrap();
        let other = Table::open(Store::file(other.path(), crate::store::Kind::Tasks).unwrap(), 1);
        assert_ne!(t.file_vm_id().unwrap(), other.file_vm_id().unwrap());
    }

    #[test]
    fn a_full_table_names_its_limit() {
        let dir = tempfile::tempdir().unwrap();
        let t = Table::open(Store::file(dir.path(), crate::store::Kind::Tasks).unwrap(), 2);
        let me = std::process::id() as i32;
        for _ in 0..MAX_TASKS {
            t.add(-23, me, 0, State::Running, "x").unwrap();
        }
        let e = t.add(-23, me, 0, State::Running, "x").unwrap_err();
        assert!(e.to_string().contains("MAX_TASKS"), "{e}");
    }
}
