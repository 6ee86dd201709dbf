//! `pvm_notify`'s requests: who wants a message with which tag when a
//! task exits (`PvmTaskExit`), a host leaves (`PvmHostDelete`) or one is
//! added (`PvmHostAdd`). No daemon has to send them: the task that exits
//! sends those about itself at `pvm_exit`, and any task or daemon that
//! looks ([`Notify::due`], from waits about once a second and from
//! `pvm_notify`) sends those about tasks and hosts no longer in the task
//! table (a task killed; a host that failed, whose entries the surviving
//! daemons freed, `crate::repair`). A task that asks about a task already
//! gone gets its message at once, as in PVM. A daemon that comes up on a
//! host new to the virtual machine sends the `PvmHostAdd` ones
//! ([`Notify::host_added`]).
//!
//! Stored as JSON ([`crate::store`]: MEMORY CHANNEL space in a cluster,
//! else `$PVM_TMP/pvmmc.<uid>/notify`). Touched
//! by the thread calling PVM (under the C layer's lock).

use serde::{Deserialize, Serialize};

use crate::consts::err;
use crate::store::Store;

/// Requests one virtual machine holds.
pub const MAX_REQUESTS: usize = 4096;

/// One request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// What is watched: `PvmTaskExit`, `PvmHostDelete`, `PvmHostAdd`.
    pub what: i32,
    /// The TID (task exit) or host TID (host delete) watched; 0 for
    /// host additions.
    pub on: i32,
    /// Who gets the message, with which tag and context.
    pub to: i32,
    pub tag: i32,
    pub ctx: i32,
    /// `PvmHostAdd`: messages still to send (-1: for ever).
    #[serde(default)]
    pub left: i32,
}

/// A message to send: to whom, tag, context, and the TID it reports.
pub type Due = (i32, i32, i32, i32);

#[derive(Debug, Default, Serialize, Deserialize)]
struct Requests {
    list: Vec<Request>,
}

/// The requests of a virtual machine.
pub struct Notify {
    store: Store,
}

impl Notify {
    /// Its store (to be stored again in full for a node that came back).
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The requests in `store`.
    pub fn open(store: Store) -> Notify {
        Notify { store }
    }

    fn with<R>(&self, f: impl FnOnce(&mut Requests) -> Result<R, i32>) -> Result<R, i32> {
        self.store
            .update(|raw| {
                let mut r: Requests = if raw.is_empty() {
                    Requests::default()
                } else {
                    serde_json::from_slice(raw).map_err(|_| err::SYS_ERR)?
                };
                let out = f(&mut r);
                *raw = serde_json::to_vec(&r).map_err(|_| err::SYS_ERR)?;
                out
            })
            .map_err(|_| err::SYS_ERR)?
    }

    /// Adds requests (`cancel`: removes the matching ones instead).
    pub fn add(&self, reqs: &[Request], cancel: bool) -> Result<(), i32> {
        self.with(|r| {
            if cancel {
                r.list.retain(|x| {
                    !reqs.iter().any(|q| q.what == x.what && q.on == x.on && q.to == x.to && q.tag == x.tag)
                });
                return Ok(());
            }
            if r.list.len() + reqs.len() > MAX_REQUESTS {
                return Err(err::OUT_OF_RES);
            }
            r.list.extend_from_slice(reqs);
            Ok(())
        })
    }

    /// Takes the task-exit requests about tasks not in `live` and the
    /// host-delete requests about daemons not in `live`, and drops every
    /// request of a task not in `live`: the messages to send now. Each
    /// request is taken once, under the table's lock, so two daemons or
    /// tasks looking at once send it once.
    pub fn due(&self, live: &dyn Fn(i32) -> bool) -> Result<Vec<Due>, i32> {
        self.with(|r| {
            let mut out = Vec::new();
            r.list.retain(|q| {
                if !live(q.to) {
                    return false;
                }
                let watched = q.what == crate::consts::TASK_EXIT || q.what == crate::consts::HOST_DELETE;
                if watched && !live(q.on) {
                    out.push((q.to, q.tag, q.ctx, q.on));
                    return false;
                }
                true
            });
            Ok(out)
        })
    }

    /// The host-add messages due now that the daemon `dtid` came up on a
    /// host new to the virtual machine: (to, tag, context) of each
    /// request of a task in `live` with messages left; each counts one.
    pub fn host_added(&self, live: &dyn Fn(i32) -> bool) -> Result<Vec<(i32, i32, i32)>, i32> {
        self.with(|r| {
            let mut out = Vec::new();
            r.list.retain_mut(|q| {
                if q.what != crate::consts::HOST_ADD {
                    return true;
                }
                if !live(q.to) || q.left == 0 {
                    return false;
                }
                out.push((q.to, q.tag, q.ctx));
                if q.left > 0 {
                    q.left -= 1;
                }
                q.left != 0
            });
            Ok(out)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consts::{HOST_ADD, HOST_DELETE, TASK_EXIT};
    use std::collections::HashSet;

    fn req(what: i32, on: i32, to: i32, tag: i32) -> Request {
        Request { what, on, to, tag, ctx: 0, left: 0 }
    }

    #[test]
    fn an_exit_is_reported_once_to_each_watcher_that_is_still_there() {
        let dir = tempfile::tempdir().unwrap();
        let n = Notify::open(Store::file(dir.path(), crate::store::Kind::Notify).unwrap());
        n.add(
            &[
                req(TASK_EXIT, 5, 1, 9),
                req(TASK_EXIT, 6, 1, 9),
                req(TASK_EXIT, 5, 2, 7),
                req(HOST_DELETE, 0x80000, 1, 3),
            ],
            false,
        )
        .unwrap();
        n.add(&[req(TASK_EXIT, 5, 3, 1)], false).unwrap();
        n.add(&[req(TASK_EXIT, 6, 1, 9)], true).unwrap();
        let live: HashSet<i32> = [1, 2, 6, 0x80000].into_iter().collect();
        let mut due = n.due(&|t| live.contains(&t)).unwrap();
        due.sort();
        assert_eq!(due, vec![(1, 9, 0, 5), (2, 7, 0, 5)], "task 3 is gone and gets nothing");
        // The host's daemon leaves the table (the host was repaired out).
        let live: HashSet<i32> = [1, 2, 6].into_iter().collect();
        assert_eq!(n.due(&|t| live.contains(&t)).unwrap(), vec![(1, 3, 0, 0x80000)]);
        assert_eq!(n.due(&|t| live.contains(&t)).unwrap(), vec![], "each once");
        assert_eq!(n.due(&|t| t == 1).unwrap(), vec![], "the cancelled request stays cancelled");
    }

    #[test]
    fn host_additions_are_counted_down_per_request() {
        let dir = tempfile::tempdir().unwrap();
        let n = Notify::open(Store::file(dir.path(), crate::store::Kind::Notify).unwrap());
        let add = |to, tag, left| Request { left, ..req(HOST_ADD, 0, to, tag) };
        n.add(&[add(1, 4, 2), add(2, 5, -1), add(3, 6, 1)], false).unwrap();
        let live: HashSet<i32> = [1, 2].into_iter().collect();
        assert_eq!(n.host_added(&|t| live.contains(&t)).unwrap(), vec![(1, 4, 0), (2, 5, 0)], "task 3 is gone");
        assert_eq!(n.host_added(&|t| live.contains(&t)).unwrap(), vec![(1, 4, 0), (2, 5, 0)]);
        assert_eq!(n.host_added(&|t| live.contains(&t)).unwrap(), vec![(2, 5, 0)], "task 1 asked for two");
        assert_eq!(n.due(&|t| live.contains(&t)).unwrap(), vec![], "host additions are not due on exits");
    }
}
