//! The group table: PVM's dynamic groups without a group server (seed
//! 000, "PVM": a group table in shared space, under locks, serves
//! `pvm_joingroup`, `pvm_barrier`, `pvm_bcast` and the rest). Each group
//! has its members with their instance numbers, its frozen size, and its
//! barrier (who waits in it now).
//!
//! A barrier needs no server either: every task that reaches it adds
//! itself under the lock; the last one takes the list and sends each
//! waiter a release message (`ffi`), and the barrier starts afresh.
//!
//! Stored as JSON ([`crate::store`]: MEMORY CHANNEL space in a cluster,
//! else `$PVM_TMP/pvmmc.<uid>/groups`). Members
//! whose task is gone leave at the next look. Touched by the thread
//! calling PVM (under the C layer's lock).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::consts::err;
use crate::store::Store;

/// Bytes of a group name, at most.
pub const NAME_MAX: usize = 255;
/// Groups one virtual machine holds.
pub const MAX_GROUPS: usize = 1024;

#[derive(Debug, Default, Serialize, Deserialize)]
struct Group {
    /// (TID, instance), in joining order.
    members: Vec<(i32, i32)>,
    /// The size the group was frozen at.
    frozen: Option<i32>,
    /// Tasks waiting in the current barrier, and how many it waits for.
    waiting: Vec<i32>,
    count: i32,
    /// Barriers completed (the release message carries it).
    generation: u64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Groups {
    groups: BTreeMap<String, Group>,
}

/// What a task reaching a barrier does next.
#[derive(Debug, PartialEq, Eq)]
pub enum Arrival {
    /// Wait for a release message of this barrier (its generation).
    Wait(u64),
    /// It was the last: release these tasks (barrier `generation`).
    Release { waiting: Vec<i32>, generation: u64 },
}

/// The group table of a virtual machine.
pub struct GroupTable {
    store: Store,
}

/// A group name, checked: `PvmNullGroup` for none or an empty one.
pub fn name(n: Option<&str>) -> Result<&str, i32> {
    match n {
        Some(n) if !n.is_empty() && n.len() <= NAME_MAX => Ok(n),
        Some(n) if n.len() > NAME_MAX => Err(err::BAD_PARAM),
        _ => Err(err::NULL_GROUP),
    }
}

impl GroupTable {
    /// Its store (to be stored again in full for a node that came back).
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The table in `store`.
    pub fn open(store: Store) -> GroupTable {
        GroupTable { store }
    }

    /// Runs `f` on the table under its lock, after dropping members that
    /// `alive` says are gone (and groups left empty).
    fn with<R>(&self, alive: &dyn Fn(i32) -> bool, f: impl FnOnce(&mut Groups) -> Result<R, i32>) -> Result<R, i32> {
        self.store
            .update(|raw| {
                let mut g: Groups = if raw.is_empty() {
                    Groups::default()
                } else {
                    serde_json::from_slice(raw).map_err(|_| err::SYS_ERR)?
                };
                for grp in g.groups.values_mut() {
                    grp.members.retain(|&(t, _)| alive(t));
                    grp.waiting.retain(|&t| alive(t));
                }
                g.groups.retain(|_, grp| !grp.members.is_empty());
                let r = f(&mut g);
                *raw = serde_json::to_vec(&g).map_err(|_| err::SYS_ERR)?;
                r
            })
            .map_err(|_| err::SYS_ERR)?
    }

    /// `pvm_joingroup`: the lowest free instance number.
    pub fn join(&self, group: &str, tid: i32, alive: &dyn Fn(i32) -> bool) -> Result<i32, i32> {
        self.with(alive, |g| {
            if !g.groups.contains_key(group) && g.groups.len() >= MAX_GROUPS {
                return Err(err::OUT_OF_RES);
            }
            let grp = g.groups.entry(group.to_string()).or_default();
            if grp.members.iter().any(|&(t, _)| t == tid) {
                return Err(err::DUP_GROUP);
            }
            if grp.frozen.is_some() {
                return Err(err::DENIED);
            }
            let inst = (0..).find(|i| !grp.members.iter().any(|&(_, n)| n == *i)).unwrap_or(0);
            grp.members.push((tid, inst));
            Ok(inst)
        })
    }

    /// `pvm_lvgroup`.
    pub fn leave(&self, group: &str, tid: i32, alive: &dyn Fn(i32) -> bool) -> Result<(), i32> {
        self.with(alive, |g| {
            let grp = g.groups.get_mut(group).ok_or(err::NO_GROUP)?;
            let before = grp.members.len();
            grp.members.retain(|&(t, _)| t != tid);
            grp.waiting.retain(|&t| t != tid);
            if grp.members.len() == before {
                return Err(err::NOT_IN_GROUP);
            }
            if grp.members.is_empty() {
                g.groups.remove(group);
            }
            Ok(())
        })
    }

    /// Leaves every group (a task that exits).
    pub fn leave_all(&self, tid: i32, alive: &dyn Fn(i32) -> bool) -> Result<(), i32> {
        self.with(&|t| t != tid && alive(t), |_| Ok(()))
    }

    /// The members of a group: (TID, instance).
    pub fn members(&self, group: &str, alive: &dyn Fn(i32) -> bool) -> Result<Vec<(i32, i32)>, i32> {
        self.with(alive, |g| Ok(g.groups.get(group).ok_or(err::NO_GROUP)?.members.clone()))
    }

    /// `pvm_freezegroup`: no more joins once `size` tasks have joined
    /// (-1: the size now). Returns whether the group is frozen; the
    /// caller waits and asks again while it is not (PVM's call waits).
    pub fn freeze(&self, group: &str, tid: i32, size: i32, alive: &dyn Fn(i32) -> bool) -> Result<bool, i32> {
        self.with(alive, |g| {
            let grp = g.groups.get_mut(group).ok_or(err::NO_GROUP)?;
            if !grp.members.iter().any(|&(t, _)| t == tid) {
                return Err(err::NOT_IN_GROUP);
            }
            if size < -1 {
                return Err(err::BAD_PARAM);
            }
            if grp.frozen.is_some() {
                return Ok(true);
            }
            let size = if size == -1 { grp.members.len() as i32 } else { size };
            if (grp.members.len() as i32) < size {
                return Ok(false);
            }
            grp.frozen = Some(size);
            Ok(true)
        })
    }

    /// `pvm_barrier`: task `tid` reaches the barrier of `count` tasks (-1:
    /// every member).
    pub fn arrive(&self, group: &str, tid: i32, count: i32, alive: &dyn Fn(i32) -> bool) -> Result<Arrival, i32> {
        self.with(alive, |g| {
            let grp = g.groups.get_mut(group).ok_or(err::NO_GROUP)?;
            if !grp.members.iter().any(|&(t, _)| t == tid) {
                return Err(err::NOT_IN_GROUP);
            }
            let count = if count == -1 { grp.frozen.unwrap_or(grp.members.len() as i32) } else { count };
            if count < 1 {
                return Err(err::BAD_PARAM);
            }
            if grp.waiting.is_empty() {
                grp.count = count;
            } else if grp.count != count {
                return Err(err::MISMATCH);
            }
            if grp.waiting.contains(&tid) {
                return Err(err::DUP_GROUP);
            }
            grp.waiting.push(tid);
            if grp.waiting.len() as i32 >= grp.count {
                let waiting = std::mem::take(&mut grp.waiting);
                let generation = grp.generation;
                grp.generation += 1;
                Ok(Arrival::Release { waiting, generation })
            } else {
                Ok(Arrival::Wait(grp.generation))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instances_are_the_lowest_free_and_members_leave() {
        let dir = tempfile::tempdir().unwrap();
        let t = GroupTable::open(Store::file(dir.path(), crate::store::Kind::Groups).unwrap());
        let all = |_| true;
        assert_eq!(t.join("g", 10, &all), Ok(0));
        assert_eq!(t.join("g", 11, &all), Ok(1));
        assert_eq!(t.join("g", 12, &all), Ok(2));
        assert_eq!(t.join("g", 11, &all), Err(err::DUP_GROUP));
        assert_eq!(t.leave("g", 11, &all), Ok(()));
        assert_eq!(t.leave("g", 11, &all), Err(err::NOT_IN_GROUP));
        assert_eq!(t.join("g", 13, &all), Ok(1));
        assert_eq!(t.members("g", &all), Ok(vec![(10, 0), (12, 2), (13, 1)]));
        // A member whose task is gone leaves at the next look.
        assert_eq!(t.members("g", &|tid| tid != 12), Ok(vec![(10, 0), (13, 1)]));
        assert_eq!(t.members("h", &all), Err(err::NO_GROUP));
        t.leave_all(10, &all).unwrap();
        t.leave_all(13, &all).unwrap();
        assert_eq!(t.members("g", &all), Err(err::NO_GROUP));
        assert_eq!(name(Some("")), Err(err::NULL_GROUP));
        assert_eq!(name(None), Err(err::NULL_GROUP));
    }

    #[test]
    fn the_last_task_at_a_barrier_releases_the_others_and_it_starts_afresh() {
        let dir = tempfile::tempdir().unwrap();
        let t = GroupTable::open(Store::file(dir.path(), crate::store::Kind::Groups).unwrap());
        let all = |_| true;
        for tid in 1..=3 {
            t.join("b", tid, &all).unwrap();
        }
        assert_eq!(t.arrive("b", 1, 3, &all), Ok(Arrival::Wait(0)));
        assert_eq!(t.arrive("b", 2, 2, &all), Err(err::MISMATCH));
        assert_eq!(t.arrive("b", 1, 3, &all), Err(err::DUP_GROUP));
        assert_eq!(t.arrive("b", 2, 3, &all), Ok(Arrival::Wait(0)));
        assert_eq!(t.arrive("b", 3, -1, &all), Ok(Arrival::Release { waiting: vec![1, 2, 3], generation: 0 }));
        assert_eq!(t.arrive("b", 3, 2, &all), Ok(Arrival::Wait(1)));
        assert_eq!(t.arrive("b", 9, 2, &all), Err(err::NOT_IN_GROUP));
        // A group freezes once it has the size asked for; then it takes
        // nobody new, and -1 counts its frozen size.
        assert_eq!(t.freeze("b", 1, 4, &all), Ok(false));
        assert_eq!(t.freeze("b", 1, -1, &all), Ok(true));
        assert_eq!(t.join("b", 4, &all), Err(err::DENIED));
    }
}
