//! The mailbox: PVM 3.4's message mailbox (`pvm_putinfo`,
//! `pvm_recvinfo`, `pvm_delinfo`, `pvm_getmboxinfo`, and 3.3's
//! `pvm_insert`, `pvm_lookup`, `pvm_delete` on the same classes) as a
//! table of the virtual machine, kept without a daemon like the others.
//!
//! A class is a name with entries by index; an entry is a packed message
//! with its owner (the task that put it, 0 once a persistent entry's
//! owner has gone) and the flags it was put with. The rules are PVM's:
//!
//! - put: at index 0 (or the direct index in the flags; 3.3's insert
//!   names an index or -1). An entry there is replaced if it is
//!   overwritable or ours, else `PvmDenied`; with `PvmMboxMultiInstance`
//!   the entry goes to the first free index from there instead (3.3's
//!   insert at a taken index is `PvmDenied`). Returns the index.
//! - get: the entry at the index, or with `PvmMboxFirstAvail` the first
//!   at or above it; `PvmNotFound` if none. `PvmMboxReadAndDelete`
//!   removes it too, if it is overwritable or ours, else `PvmDenied`.
//! - delete: the entry at the index, if overwritable or ours.
//! - Entries of a task that is gone are removed at the next look, but
//!   persistent ones, which stay with owner 0.
//!
//! Limits: [`MAX_ENTRIES`] entries, class names of [`NAME_MAX`] bytes,
//! and the whole table (JSON, message bodies in hex) within
//! [`IMAGE`] bytes; past them a put is `PvmOutOfRes` or `PvmNoMem` with
//! an error naming the limit.
//!
//! Stored as JSON ([`crate::store`]: MEMORY CHANNEL space under its own
//! cluster lock in a cluster, else `$PVM_TMP/pvmmc.<uid>/mbox` under
//! `flock`). Touched by the thread calling PVM (under the C layer's
//! lock).

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::consts::{self, err};
use crate::store::{Store, StoreError};

/// Entries one virtual machine's mailbox holds, over all classes.
pub const MAX_ENTRIES: usize = 1024;
/// Bytes of a class name, at most.
pub const NAME_MAX: usize = 255;
/// Bytes of the mailbox's image (its region in MEMORY CHANNEL space).
pub const IMAGE: usize = 256 << 10;

/// `pvm3.h`'s mailbox flags.
pub const PERSISTENT: i32 = 1;
pub const MULTI_INSTANCE: i32 = 2;
pub const OVERWRITABLE: i32 = 4;
pub const FIRST_AVAIL: i32 = 8;
pub const READ_AND_DELETE: i32 = 16;
pub const WAIT_FOR_INFO: i32 = 32;
/// Shift and width of the direct index in the flags
/// (`PvmMboxDirectIndexShift`, `PvmMboxMaxDirectIndex`).
const DIRECT_SHIFT: u32 = 10;
const DIRECT_MAX: u32 = 1 << (31 - DIRECT_SHIFT);

/// The direct index encoded in `flags` (`PvmMboxDirectIndexOf`).
pub fn direct_index(flags: i32) -> i32 {
    ((flags as u32 & ((DIRECT_MAX - 1) << DIRECT_SHIFT)) >> DIRECT_SHIFT) as i32
}

/// What went wrong with a mailbox call.
#[derive(Debug, Error)]
pub enum MboxError {
    /// PVM's own answer (`PvmDenied`, `PvmNotFound`, `PvmBadParam`).
    #[error("{}", consts::message(*.0))]
    Pvm(i32),
    #[error("the mailbox is full: {MAX_ENTRIES} entries (mbox::MAX_ENTRIES)")]
    Full,
    #[error("the mailbox would grow to {0} bytes, more than its {IMAGE} (mbox::IMAGE)")]
    TooBig(usize),
    #[error("the mailbox: {0}")]
    Store(#[from] StoreError),
    #[error("the mailbox's table cannot be read: {0}")]
    Corrupt(String),
}

impl MboxError {
    /// The PVM error code to return.
    pub fn code(&self) -> i32 {
        match self {
            MboxError::Pvm(c) => *c,
            MboxError::Full => err::OUT_OF_RES,
            MboxError::TooBig(_) => err::NO_MEM,
            MboxError::Store(_) | MboxError::Corrupt(_) => err::SYS_ERR,
        }
    }

    /// Whether the error is a limit or a fault worth a line of its own
    /// (PVM's answers are reported by their code alone).
    pub fn is_limit_or_fault(&self) -> bool {
        !matches!(self, MboxError::Pvm(_))
    }
}

/// A message kept in the mailbox: its encoding and packed bytes, and who
/// put it in which context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub enc: i32,
    pub data: Vec<u8>,
    pub src: i32,
    pub ctx: i32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Entry {
    index: i32,
    owner: i32,
    flags: i32,
    enc: i32,
    src: i32,
    ctx: i32,
    /// The packed bytes, in hex.
    body: String,
}

impl Entry {
    fn message(&self) -> Result<Message, MboxError> {
        Ok(Message { enc: self.enc, data: unhex(&self.body)?, src: self.src, ctx: self.ctx })
    }

    /// Whether task `tid` may replace or remove it.
    fn open_to(&self, tid: i32) -> bool {
        self.flags & OVERWRITABLE != 0 || self.owner == tid
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Class {
    name: String,
    /// By ascending index.
    entries: Vec<Entry>,
}

/// The classes, in the order they were made.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Classes {
    classes: Vec<Class>,
}

/// One class as `pvm_getmboxinfo` lists it: its name and each entry's
/// (index, owner, flags).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassInfo {
    pub name: String,
    pub entries: Vec<(i32, i32, i32)>,
}

fn hex(data: &[u8]) -> String {
    const D: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(data.len() * 2);
    for b in data {
        s.push(D[usize::from(b >> 4)] as char);
        s.push(D[usize::from(b & 15)] as char);
    }
    s
}

fn unhex(s: &str) -> Result<Vec<u8>, MboxError> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Ok(c - b'0'),
        b'a'..=b'f' => Ok(c - b'a' + 10),
        _ => Err(MboxError::Corrupt(format!("'{}' in a message body", c as char))),
    };
    let b = s.as_bytes();
    if b.len() % 2 != 0 {
        return Err(MboxError::Corrupt("a message body of odd length".into()));
    }
    b.chunks_exact(2).map(|p| Ok(digit(p[0])? << 4 | digit(p[1])?)).collect()
}

/// Whether `name` matches `pattern`: `*` stands for any run of
/// characters, everything else for itself; an empty pattern matches all
/// (as `pvm_getmboxinfo` with no pattern).
pub fn glob(pattern: &str, name: &str) -> bool {
    if pattern.is_empty() {
        return true;
    }
    let (p, n) = (pattern.as_bytes(), name.as_bytes());
    // Greedy matching with one backtrack point: the last star.
    let (mut i, mut j) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while j < n.len() {
        if i < p.len() && p[i] == b'*' {
            star = Some((i, j));
            i += 1;
        } else if i < p.len() && p[i] == n[j] {
            i += 1;
            j += 1;
        } else if let Some((si, sj)) = star {
            i = si + 1;
            j = sj + 1;
            star = Some((si, sj + 1));
        } else {
            return false;
        }
    }
    p[i..].iter().all(|&c| c == b'*')
}

/// A class name, checked.
pub fn name(n: &str) -> Result<&str, MboxError> {
    if n.is_empty() || n.len() > NAME_MAX {
        return Err(MboxError::Pvm(err::BAD_PARAM));
    }
    Ok(n)
}

impl Classes {
    fn class_mut(&mut self, name: &str) -> Option<&mut Class> {
        self.classes.iter_mut().find(|c| c.name == name)
    }

    fn count(&self) -> usize {
        self.classes.iter().map(|c| c.entries.len()).sum()
    }

    /// Drops entries of tasks that are gone (persistent ones lose their
    /// owner instead), and classes left empty.
    fn tidy(&mut self, alive: &dyn Fn(i32) -> bool) {
        for c in &mut self.classes {
            c.entries.retain_mut(|e| {
                if e.owner == 0 || alive(e.owner) {
                    return true;
                }
                if e.flags & PERSISTENT != 0 {
                    e.owner = 0;
                    return true;
                }
                false
            });
        }
        self.classes.retain(|c| !c.entries.is_empty());
    }

    fn put(&mut self, tid: i32, name: &str, req: i32, flags: i32, m: &Message) -> Result<i32, MboxError> {
        let want = if req == -1 { direct_index(flags) } else { req };
        if want < 0 {
            return Err(MboxError::Pvm(err::BAD_PARAM));
        }
        let entry = |index| Entry {
            index,
            owner: tid,
            flags: flags & (PERSISTENT | MULTI_INSTANCE | OVERWRITABLE),
            enc: m.enc,
            src: m.src,
            ctx: m.ctx,
            body: hex(&m.data),
        };
        let total = self.count();
        let Some(c) = self.class_mut(name) else {
            if total >= MAX_ENTRIES {
                return Err(MboxError::Full);
            }
            self.classes.push(Class { name: name.to_string(), entries: vec![entry(want)] });
            return Ok(want);
        };
        let at = c.entries.iter().position(|e| e.index >= want).unwrap_or(c.entries.len());
        let taken = c.entries.get(at).is_some_and(|e| e.index == want);
        if !taken || flags & MULTI_INSTANCE != 0 {
            if taken && req != -1 {
                // 3.3's insert at a taken index.
                return Err(MboxError::Pvm(err::DENIED));
            }
            if total >= MAX_ENTRIES {
                return Err(MboxError::Full);
            }
            // The first free index from `want` up.
            let mut index = want;
            let mut at = at;
            while c.entries.get(at).is_some_and(|e| e.index == index) {
                index = index.checked_add(1).ok_or(MboxError::Full)?;
                at += 1;
            }
            c.entries.insert(at, entry(index));
            return Ok(index);
        }
        if !c.entries[at].open_to(tid) {
            return Err(MboxError::Pvm(err::DENIED));
        }
        c.entries[at] = entry(want);
        Ok(want)
    }

    fn get(&mut self, tid: i32, name: &str, index: i32, flags: i32) -> Result<(i32, Message), MboxError> {
        let not_found = MboxError::Pvm(err::NOT_FOUND);
        let c = self.class_mut(name).ok_or(MboxError::Pvm(err::NOT_FOUND))?;
        let at = c.entries.iter().position(|e| e.index >= index).ok_or(not_found)?;
        if flags & FIRST_AVAIL == 0 && c.entries[at].index != index {
            return Err(MboxError::Pvm(err::NOT_FOUND));
        }
        let e = &c.entries[at];
        let got = (e.index, e.message()?);
        if flags & READ_AND_DELETE != 0 {
            if !e.open_to(tid) {
                return Err(MboxError::Pvm(err::DENIED));
            }
            c.entries.remove(at);
            self.classes.retain(|c| !c.entries.is_empty());
        }
        Ok(got)
    }

    fn delete(&mut self, tid: i32, name: &str, index: i32) -> Result<(), MboxError> {
        let c = self.class_mut(name).ok_or(MboxError::Pvm(err::NOT_FOUND))?;
        let at = c.entries.iter().position(|e| e.index == index).ok_or(MboxError::Pvm(err::NOT_FOUND))?;
        if !c.entries[at].open_to(tid) {
            return Err(MboxError::Pvm(err::DENIED));
        }
        c.entries.remove(at);
        self.classes.retain(|c| !c.entries.is_empty());
        Ok(())
    }

    fn names(&self, pattern: &str) -> Vec<ClassInfo> {
        self.classes
            .iter()
            .filter(|c| glob(pattern, &c.name))
            .map(|c| ClassInfo {
                name: c.name.clone(),
                entries: c.entries.iter().map(|e| (e.index, e.owner, e.flags)).collect(),
            })
            .collect()
    }
}

/// The mailbox of a virtual machine.
pub struct Mailbox {
    store: Store,
}

impl Mailbox {
    /// Its store (to be stored again in full for a node that came back).
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The mailbox in `store`.
    pub fn open(store: Store) -> Mailbox {
        Mailbox { store }
    }

    /// Runs `f` on the classes under the table's lock, after dropping the
    /// entries of tasks `alive` says are gone. What `f` changed is stored
    /// only if it succeeded and the table still fits in [`IMAGE`].
    fn with<R>(
        &self,
        alive: &dyn Fn(i32) -> bool,
        f: impl FnOnce(&mut Classes) -> Result<R, MboxError>,
    ) -> Result<R, MboxError> {
        self.store.update(|raw| {
            let mut c: Classes = if raw.is_empty() {
                Classes::default()
            } else {
                serde_json::from_slice(raw).map_err(|e| MboxError::Corrupt(e.to_string()))?
            };
            c.tidy(alive);
            let tidied = serde_json::to_vec(&c).map_err(|e| MboxError::Corrupt(e.to_string()))?;
            let r = f(&mut c);
            let out =
                if r.is_ok() { serde_json::to_vec(&c).map_err(|e| MboxError::Corrupt(e.to_string()))? } else { tidied };
            if out.len() > IMAGE {
                return Err(MboxError::TooBig(out.len()));
            }
            *raw = out;
            r
        })?
    }

    /// `pvm_putinfo` (`req` -1) and 3.3's `pvm_insert` (`req` an index,
    /// or -1 for the first free): stores `m` in class `name` for task
    /// `tid`; returns the index.
    pub fn put(
        &self,
        tid: i32,
        name: &str,
        req: i32,
        flags: i32,
        m: &Message,
        alive: &dyn Fn(i32) -> bool,
    ) -> Result<i32, MboxError> {
        let name = self::name(name)?;
        if req < -1 {
            return Err(MboxError::Pvm(err::BAD_PARAM));
        }
        // A message that cannot fit is refused before the lock is taken.
        if m.data.len() * 2 > IMAGE {
            return Err(MboxError::TooBig(m.data.len() * 2));
        }
        self.with(alive, |c| c.put(tid, name, req, flags, m))
    }

    /// `pvm_recvinfo`: the entry of class `name` at `index` (with
    /// `PvmMboxFirstAvail`: the first at or above it); its index and
    /// message.
    pub fn get(
        &self,
        tid: i32,
        name: &str,
        index: i32,
        flags: i32,
        alive: &dyn Fn(i32) -> bool,
    ) -> Result<(i32, Message), MboxError> {
        let name = self::name(name)?;
        if index < 0 {
            return Err(MboxError::Pvm(err::BAD_PARAM));
        }
        self.with(alive, |c| c.get(tid, name, index, flags))
    }

    /// `pvm_delinfo`: removes the entry of class `name` at `index`.
    pub fn delete(&self, tid: i32, name: &str, index: i32, alive: &dyn Fn(i32) -> bool) -> Result<(), MboxError> {
        let name = self::name(name)?;
        if index < 0 {
            return Err(MboxError::Pvm(err::BAD_PARAM));
        }
        self.with(alive, |c| c.delete(tid, name, index))
    }

    /// `pvm_getmboxinfo`: the classes whose name matches `pattern`.
    pub fn names(&self, pattern: &str, alive: &dyn Fn(i32) -> bool) -> Result<Vec<ClassInfo>, MboxError> {
        self.with(alive, |c| Ok(c.names(pattern)))
    }

    /// `pvmreset` (the console's `reset`): removes the orphaned entries
    /// (persistent ones whose owner left, owner 0) of class `class` (None:
    /// every class) at `index` (-1: every index); returns how many.
    pub fn reset(&self, class: Option<&str>, index: i32, alive: &dyn Fn(i32) -> bool) -> Result<usize, MboxError> {
        self.with(alive, |c| {
            let mut n = 0;
            for k in c.classes.iter_mut().filter(|k| class.is_none_or(|name| k.name == name)) {
                let before = k.entries.len();
                k.entries.retain(|e| !(e.owner == 0 && (index < 0 || e.index == index)));
                n += before - k.entries.len();
            }
            c.classes.retain(|k| !k.entries.is_empty());
            Ok(n)
        })
    }

    /// Task `tid` leaves (`pvm_exit`): its entries go, but persistent
    /// ones, which lose their owner.
    pub fn leave(&self, tid: i32, alive: &dyn Fn(i32) -> bool) -> Result<(), MboxError> {
        self.with(&|t| t != tid && alive(t), |_| Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mb() -> (tempfile::TempDir, Mailbox) {
        let dir = tempfile::tempdir().unwrap();
        let m = Mailbox::open(Store::file(dir.path(), crate::store::Kind::Mbox).unwrap());
        (dir, m)
    }

    fn msg(b: &[u8]) -> Message {
        Message { enc: 0, data: b.to_vec(), src: 7, ctx: 0 }
    }

    #[test]
    fn reset_removes_orphaned_persistent_entries_only() {
        let (_d, m) = mb();
        let all = |_: i32| true;
        m.put(5, "a", -1, PERSISTENT, &msg(b"x"), &all).unwrap();
        m.put(5, "b", -1, PERSISTENT, &msg(b"y"), &all).unwrap();
        m.put(6, "c", -1, 0, &msg(b"z"), &all).unwrap();
        // Task 5 leaves: its persistent entries stay, owned by nobody.
        m.leave(5, &all).unwrap();
        assert_eq!(m.reset(Some("a"), 3, &all).unwrap(), 0);
        assert_eq!(m.reset(Some("a"), -1, &all).unwrap(), 1);
        let names = |m: &Mailbox| m.names("", &all).unwrap().into_iter().map(|c| c.name).collect::<Vec<_>>();
        assert_eq!(names(&m), ["b", "c"]);
        assert_eq!(m.reset(None, -1, &all).unwrap(), 1);
        assert_eq!(names(&m), ["c"]);
    }

    const ALL: &dyn Fn(i32) -> bool = &|_| true;

    fn code<T: std::fmt::Debug>(r: Result<T, MboxError>) -> i32 {
        r.unwrap_err().code()
    }

    #[test]
    fn a_default_entry_is_locked_to_its_owner() {
        let (_d, m) = mb();
        assert_eq!(m.put(1, "svc", -1, 0, &msg(b"a"), ALL).unwrap(), 0);
        assert_eq!(code(m.put(2, "svc", -1, 0, &msg(b"b"), ALL)), err::DENIED);
        // The owner may replace it.
        assert_eq!(m.put(1, "svc", -1, 0, &msg(b"c"), ALL).unwrap(), 0);
        assert_eq!(m.get(2, "svc", 0, 0, ALL).unwrap(), (0, msg(b"c")));
        assert_eq!(code(m.delete(2, "svc", 0, ALL)), err::DENIED);
        assert_eq!(code(m.get(2, "svc", 0, READ_AND_DELETE, ALL)), err::DENIED);
        assert_eq!(code(m.delete(1, "svc", 1, ALL)), err::NOT_FOUND);
        m.delete(1, "svc", 0, ALL).unwrap();
        assert_eq!(code(m.get(1, "svc", 0, 0, ALL)), err::NOT_FOUND);
        assert_eq!(m.names("*", ALL).unwrap(), vec![], "an empty class goes");
        // Overwritable entries are open to anyone.
        m.put(1, "o", -1, OVERWRITABLE, &msg(b"x"), ALL).unwrap();
        assert_eq!(m.put(2, "o", -1, 0, &msg(b"y"), ALL).unwrap(), 0);
        assert_eq!(code(m.put(3, "o", -1, 0, &msg(b"z"), ALL)), err::DENIED, "now task 2's, locked");
    }

    #[test]
    fn multiple_instances_take_the_first_free_index() {
        let (_d, m) = mb();
        for want in 0..4 {
            assert_eq!(m.put(1, "m", -1, MULTI_INSTANCE, &msg(&[want as u8]), ALL).unwrap(), want);
        }
        m.delete(1, "m", 1, ALL).unwrap();
        assert_eq!(m.put(2, "m", -1, MULTI_INSTANCE, &msg(b"new"), ALL).unwrap(), 1);
        assert_eq!(m.put(2, "m", -1, MULTI_INSTANCE, &msg(b"new"), ALL).unwrap(), 4);
        // A direct index in the flags starts the search there.
        assert_eq!(m.put(2, "m", -1, MULTI_INSTANCE | 10 << DIRECT_SHIFT, &msg(b"d"), ALL).unwrap(), 10);
        // First available: the first at or above the index asked.
        assert_eq!(m.get(3, "m", 5, FIRST_AVAIL, ALL).unwrap().0, 10);
        assert_eq!(code(m.get(3, "m", 5, 0, ALL)), err::NOT_FOUND);
        assert_eq!(code(m.get(3, "m", 11, FIRST_AVAIL, ALL)), err::NOT_FOUND);
        // Read and delete, by the owner.
        assert_eq!(m.get(2, "m", 10, READ_AND_DELETE, ALL).unwrap(), (10, msg(b"d")));
        assert_eq!(code(m.get(2, "m", 10, 0, ALL)), err::NOT_FOUND);
        let info = m.names("m", ALL).unwrap();
        assert_eq!(info.len(), 1);
        let idx: Vec<i32> = info[0].entries.iter().map(|e| e.0).collect();
        assert_eq!(idx, vec![0, 1, 2, 3, 4]);
        assert_eq!(info[0].entries[1], (1, 2, MULTI_INSTANCE));
    }

    #[test]
    fn the_33_calls_insert_at_a_free_index_only() {
        let (_d, m) = mb();
        let f = MULTI_INSTANCE | PERSISTENT;
        assert_eq!(m.put(1, "old", 3, f, &msg(b"3"), ALL).unwrap(), 3);
        assert_eq!(code(m.put(1, "old", 3, f, &msg(b"3"), ALL)), err::DENIED);
        assert_eq!(m.put(1, "old", -1, f, &msg(b"0"), ALL).unwrap(), 0);
        assert_eq!(m.get(1, "old", 0, FIRST_AVAIL, ALL).unwrap().0, 0);
        assert_eq!(m.get(1, "old", 1, FIRST_AVAIL, ALL).unwrap().0, 3);
        assert_eq!(code(m.put(1, "old", -2, f, &msg(b"x"), ALL)), err::BAD_PARAM);
        assert_eq!(code(m.put(1, "", -1, 0, &msg(b"x"), ALL)), err::BAD_PARAM);
        assert_eq!(code(m.get(1, "old", -1, 0, ALL)), err::BAD_PARAM);
    }

    #[test]
    fn entries_of_a_task_that_is_gone_go_but_persistent_ones() {
        let (_d, m) = mb();
        m.put(1, "a", -1, 0, &msg(b"1"), ALL).unwrap();
        m.put(1, "b", -1, PERSISTENT, &msg(b"2"), ALL).unwrap();
        m.put(2, "c", -1, 0, &msg(b"3"), ALL).unwrap();
        // Task 1 exits.
        m.leave(1, ALL).unwrap();
        let info = m.names("*", ALL).unwrap();
        let names: Vec<&str> = info.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, vec!["b", "c"]);
        assert_eq!(info[0].entries, vec![(0, 0, PERSISTENT)], "persistent, no owner now");
        // Task 2 is killed: gone at the next look.
        let info = m.names("*", &|t| t != 2).unwrap();
        assert_eq!(info.len(), 1);
        // An entry without owner is open to no one but overwritable ones.
        assert_eq!(code(m.delete(3, "b", 0, ALL)), err::DENIED);
    }

    #[test]
    fn a_task_that_enrolls_while_another_looks_keeps_its_entry() {
        use crate::table::{State, Table};
        let (d, m) = mb();
        let t = Table::open(Store::file(d.path(), crate::store::Kind::Tasks).unwrap(), 1);
        let me = std::process::id() as i32;
        // A reader gets ready to look (gmbi polling) ...
        let reader = t.live();
        // ... while a new task enrolls and puts its entry.
        let a = t.add(0, me, 0, State::Running, "a").unwrap();
        let mine = t.live();
        m.put(a, "svc", -1, 0, &msg(b"x"), &|x| mine.contains(x)).unwrap();
        // The reader's look, taken under the mailbox's lock, sees the task.
        let info = m.names("*", &|x| reader.contains(x)).unwrap();
        assert_eq!(info.len(), 1, "the new task's entry was dropped as if it were gone");
        // Once the task is gone, its entry goes at the next look.
        t.remove(a).unwrap();
        assert!(m.names("*", &|x| t.live().contains(x)).unwrap().is_empty());
    }

    #[test]
    fn patterns_match_with_stars() {
        assert!(glob("*", "anything"));
        assert!(glob("", "anything"));
        assert!(glob("ra*ts", "rats"));
        assert!(glob("ra*ts", "ra123ts"));
        assert!(!glob("ra*ts", "rat"));
        assert!(glob("t*lmbi*", "t40001lmbi3"));
        assert!(glob("*b*", "abc"));
        assert!(!glob("abc", "abcd"));
        assert!(glob("a*b*c", "aXbYbZc"));
    }

    #[test]
    fn the_limits_are_errors_that_name_them() {
        let (_d, m) = mb();
        for i in 0..MAX_ENTRIES {
            m.put(1, &format!("c{}", i % 3), -1, MULTI_INSTANCE, &msg(b""), ALL).unwrap();
        }
        let e = m.put(1, "c0", -1, MULTI_INSTANCE, &msg(b""), ALL).unwrap_err();
        assert_eq!(e.code(), err::OUT_OF_RES);
        assert!(e.to_string().contains("MAX_ENTRIES"), "{e}");
        let e = m.put(1, "new", -1, 0, &msg(b""), ALL).unwrap_err();
        assert_eq!(e.code(), err::OUT_OF_RES);
        let (_d, m) = mb();
        let big = vec![0u8; IMAGE / 2 + 1];
        let e = m.put(1, "big", -1, 0, &msg(&big), ALL).unwrap_err();
        assert_eq!(e.code(), err::NO_MEM);
        assert!(e.to_string().contains("mbox::IMAGE"), "{e}");
        // Two halves fit each alone, not together; the first stays.
        let half = vec![0u8; IMAGE / 4 + 100];
        m.put(1, "h1", -1, 0, &msg(&half), ALL).unwrap();
        m.put(1, "h2", -1, 0, &msg(&half), ALL).unwrap_err();
        assert_eq!(m.names("*", ALL).unwrap().len(), 1);
        assert_eq!(m.get(1, "h1", 0, 0, ALL).unwrap().1.data.len(), half.len());
    }
}
