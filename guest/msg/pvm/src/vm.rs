//! Which virtual machine a task belongs to and where its tables (tasks,
//! groups, notifications, mailbox) live: in
//! a guest with imcd, the cluster's one virtual machine per user, its
//! tables in MEMORY CHANNEL space; elsewhere (the host, a guest without
//! imcd) this machine's, in files under `$PVM_TMP/pvmmc.<uid>/`
//! ([`crate::store`]). Made once per task, at enrollment, on the thread
//! calling PVM.

use crate::group::GroupTable;
use crate::mbox::Mailbox;
use crate::notify::Notify;
use crate::store::{Kind, McTables, Store, StoreError};
use crate::table::{self, Table, TableError};

/// A task's view of its virtual machine.
pub struct Vm {
    pub tasks: Table,
    pub groups: GroupTable,
    pub notify: Notify,
    pub mbox: Mailbox,
    /// The 16-bit number in every UMP handle of the virtual machine.
    pub id: u16,
}

impl Vm {
    /// Stores every table again in full from this node's copy, for nodes
    /// that came back ([`Store::refresh`]); the first error stops it.
    pub fn refresh(&self) -> Result<(), StoreError> {
        for s in [self.tasks.store(), self.groups.store(), self.notify.store(), self.mbox.store()] {
            s.refresh()?;
        }
        Ok(())
    }
}

/// How long a task waits for the task table's first word in its copy
/// (written by the task that made the table, with its first entry).
const COPY_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// This guest's MEMORY CHANNEL node, if it is in a cluster.
pub fn node() -> Option<u32> {
    std::fs::read_to_string("/run/mc-node").ok().and_then(|s| s.trim().parse().ok())
}

/// The host number of a node (host numbers start at 1, as in PVM).
pub fn host_of_node(node: u32) -> u32 {
    node + 1
}

/// The node of a host number.
pub fn node_of_host(host: u32) -> u32 {
    host.saturating_sub(1)
}

/// The virtual machine of this process. `PVM_MC_FILES=1` keeps the
/// tables in files even in a cluster (one virtual machine per guest).
pub fn open() -> Result<Vm, String> {
    let node = node();
    let host = host_of_node(node.unwrap_or(0));
    let files = std::env::var("PVM_MC_FILES").is_ok_and(|v| v == "1");
    if let (Some(_), false) = (node, files) {
        let id = 0x4000 | (u32::from(nix::unistd::getuid()) & 0x3fff) as u16;
        let mc = McTables::open(id).map_err(|e| format!("the tables in MEMORY CHANNEL space: {e}"))?;
        let t = |k| mc.table(k).map_err(|e: StoreError| format!("the {k:?} table in MEMORY CHANNEL space: {e}"));
        let tasks = t(Kind::Tasks)?;
        // The task table's first word (its magic) is written with its
        // first entry, by whoever made it; a copy that lacks it for long
        // is a restarted guest's, which must not change the tables.
        let t0 = std::time::Instant::now();
        if tasks.copy_lacks_first_word() {
            // Ask the other nodes' daemons for the tables in full.
            let when = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            let v = (u64::from(std::process::id()) << 32 | u64::from(when.subsec_nanos())) | 1;
            let _ = tasks.request_refresh(v);
        }
        while tasks.copy_lacks_first_word() {
            if t0.elapsed() > COPY_WAIT {
                return Err(String::from(
                    "this guest's copy of the PVM tables is empty though they exist: the guest joined a running \
                     cluster, and a newcomer is not sent what was written before it came (docs/pvm.md, \
                     \"Not implemented yet\")",
                ));
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        return Ok(Vm {
            tasks: Table::open(tasks, host),
            groups: GroupTable::open(t(Kind::Groups)?),
            notify: Notify::open(t(Kind::Notify)?),
            mbox: Mailbox::open(t(Kind::Mbox)?),
            id,
        });
    }
    let dir = table::vm_dir();
    let f = |k| Store::file(&dir, k).map_err(|e| e.to_string());
    let tasks = Table::open(f(Kind::Tasks)?, host);
    let id = tasks.file_vm_id().map_err(|e: TableError| e.to_string())?.unwrap_or(0);
    Ok(Vm {
        tasks,
        groups: GroupTable::open(f(Kind::Groups)?),
        notify: Notify::open(f(Kind::Notify)?),
        mbox: Mailbox::open(f(Kind::Mbox)?),
        id,
    })
}
