//! The clusterwide region directory: which MEMORY CHANNEL pages belong to
//! which key, kept in MEMORY CHANNEL space itself (seed 000, Figure 4a: the
//! cluster region descriptors, CRDs), so every node agrees without a server.
//!
//! # Layout (words of one [`OrderedBus`])
//!
//! ```text
//! [0, L)                      lock slots of the directory's ClusterLock
//! [L + i*(1+2W), ...)         entry i: a Toggled record of W = 8 words
//!                             key, first page, pages, mode | flags << 32, uid, gid,
//!                             ctime, hosts
//! ```
//!
//! `hosts` is the entry's host region descriptor (the paper's HRD): one bit
//! per node on which some process has the region allocated. An entry is in
//! use while any bit is set; the last node to let go frees it, and a node
//! that fails has its bit cleared by the survivors ([`Regions::clear_host`]).
//! Which processes on a node hold it (the PRD) is that node's own business
//! (`imcd` tracks it per client).
//!
//! Every change (allocate, free) happens under the directory's cluster lock
//! and writes one entry as a toggled record, so a node that dies mid-update
//! leaves the entry as it was. Lookups read this node's copy without the
//! lock: after any allocation returns on one node, the entry is ordered
//! before that node's release, so the next holder anywhere sees it.
//!
//! Permissions follow System V IPC, as the paper's API does: the owner, the
//! owner's group and others get the read (4) and write (2) bits of their
//! part of `mode`; uid 0 may do anything.

use std::ops::Range;
use std::time::Duration;

use thiserror::Error;

use crate::toggled::{ToggleError, Toggled};
use imc_client::cluster_lock::{ClusterLock, LockError, OrderedBus, Window, RESEND};
use imc_proto::layout::ENTRY_WORDS;

/// Words per entry record.
const W: usize = 8;
// Bus words one entry takes: imc_proto::layout::ENTRY_WORDS.
const _: () = assert!(ENTRY_WORDS == 1 + 2 * W, "an entry is a toggle and two copies of a record");

/// Who is asking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cred {
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
}

/// One allocated region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionDesc {
    /// Clusterwide region id (the entry's index).
    pub id: u32,
    /// The key it was allocated with.
    pub key: u64,
    /// First MEMORY CHANNEL page.
    pub first_page: u64,
    /// Pages.
    pub pages: u64,
    /// Permission bits (0o666 style).
    pub mode: u32,
    /// Creator's uid.
    pub uid: u32,
    /// Creator's gid.
    pub gid: u32,
    /// Creation time (nanoseconds since the epoch, as given by the creator;
    /// unique enough to tell two allocations of one entry apart).
    pub ctime: u64,
    /// [`FLAG_COHERENT`] and friends.
    pub flags: u32,
    /// Nodes that have it allocated (bit n: node n).
    pub hosts: u64,
}

/// Every node receives the region from its creation (`IMC_COHERENT`).
pub const FLAG_COHERENT: u32 = 1;

/// What an access wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Receive (read) the region.
    Read,
    /// Transmit (write) to the region.
    Write,
}

impl RegionDesc {
    /// Whether `cred` may access the region as `want`.
    pub fn allows(&self, cred: Cred, want: Access) -> bool {
        if cred.uid == 0 {
            return true;
        }
        let bits = if cred.uid == self.uid {
            self.mode >> 6
        } else if cred.gid == self.gid {
            self.mode >> 3
        } else {
            self.mode
        };
        match want {
            Access::Read => bits & 4 != 0,
            Access::Write => bits & 2 != 0,
        }
    }

    fn to_words(&self) -> [u64; W] {
        let mode = self.mode as u64 | (self.flags as u64) << 32;
        [self.key, self.first_page, self.pages, mode, self.uid as u64, self.gid as u64, self.ctime, self.hosts]
    }

    fn from_words(id: u32, w: &[u64]) -> Option<RegionDesc> {
        (w[7] != 0).then(|| RegionDesc {
            id,
            key: w[0],
            first_page: w[1],
            pages: w[2],
            mode: w[3] as u32,
            flags: (w[3] >> 32) as u32,
            uid: w[4] as u32,
            gid: w[5] as u32,
            ctime: w[6],
            hosts: w[7],
        })
    }

    /// Allocated coherently: every node receives it.
    pub fn coherent(&self) -> bool {
        self.flags & FLAG_COHERENT != 0
    }
}

/// Why a directory operation failed. Each maps onto an `imc_*` status.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RegionError {
    /// Exclusive creation, but the key exists.
    #[error("a region with key {0} exists already")]
    Exists(u64),
    /// The caller's uid/gid and the region's mode do not allow it.
    #[error("permission denied for region {0}")]
    Permission(u64),
    /// The key exists with another size.
    #[error("region {key} has {existing} pages, not {asked}")]
    SizeMismatch {
        /// Key.
        key: u64,
        /// Its size.
        existing: u64,
        /// Size asked for.
        asked: u64,
    },
    /// No run of free pages is long enough.
    #[error("no {asked} free contiguous pages (largest free run: {largest})")]
    NoSpace {
        /// Pages asked for.
        asked: u64,
        /// Largest free run.
        largest: u64,
    },
    /// Every directory entry is in use.
    #[error("the region directory is full: all {0} entries are in use (docs/imc.md, \"Limits\")")]
    TableFull(usize),
    /// The address space ends before the first page regions may have.
    #[error("the MEMORY CHANNEL address space has {pages} pages; imcd keeps the first {first} for itself (give the hub a larger address space)")]
    AddressSpaceTooSmall {
        /// Pages the hub offers.
        pages: u64,
        /// The first page handed out to regions.
        first: u64,
    },
    /// No such region.
    #[error("no region {0}")]
    NotFound(u64),
    /// Nodes that are up did not receive a coherent region in time.
    #[error("nodes {nodes:?} did not receive region {key:#x} in time")]
    Unanswered {
        /// The region's key.
        key: u64,
        /// The nodes that did not answer.
        nodes: Vec<usize>,
    },
    /// The size asked for is zero.
    #[error("a region needs at least one page")]
    Empty,
    /// The directory lock could not be taken.
    #[error("directory lock: {0}")]
    Lock(#[from] LockError),
    /// An entry update did not complete.
    #[error("directory entry: {0}")]
    Toggle(#[from] ToggleError),
}

/// The directory over one bus.
pub struct Regions<B: OrderedBus + Clone> {
    lock: ClusterLock<Window<B>>,
    entries: Vec<Toggled<Window<B>>>,
    data: Range<u64>,
    timeout: Duration,
}

impl<B: OrderedBus + Clone> Regions<B> {
    /// Bus words a directory with `lock_slots` lock slots and `entries` entries needs.
    pub fn words_needed(lock_slots: usize, entries: usize) -> usize {
        lock_slots + entries * ENTRY_WORDS
    }

    /// A directory on `bus` (which must have [`Regions::words_needed`]
    /// words) handing out pages from `data`.
    pub fn new(
        bus: B,
        lock_slots: usize,
        entries: usize,
        data: Range<u64>,
        timeout: Duration,
    ) -> Result<Self, RegionError> {
        if data.is_empty() {
            return Err(RegionError::AddressSpaceTooSmall { pages: data.end, first: data.start });
        }
        // imcd's own pages are never revoked: a bid lost to us alone is
        // sent again (see RESEND).
        let lock = ClusterLock::new(Window::new(bus.clone(), 0, lock_slots)).resending(RESEND);
        let entries = (0..entries)
            .map(|i| Toggled::new(Window::new(bus.clone(), lock_slots + i * ENTRY_WORDS, ENTRY_WORDS), W))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Regions { lock, entries, data, timeout })
    }

    /// Every region, as this node sees it now.
    pub fn list(&self) -> Vec<RegionDesc> {
        // An entry never written (generation 0) is empty: one load instead
        // of a record's (the mapper lists the directory every tick).
        self.entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.generation() != 0)
            .filter_map(|(i, e)| RegionDesc::from_words(i as u32, &e.read()))
            .collect()
    }

    /// The region in entry `id`, as this node sees it now (one entry read,
    /// not the whole directory).
    pub fn get(&self, id: u32) -> Option<RegionDesc> {
        RegionDesc::from_words(id, &self.entries.get(id as usize)?.read())
    }

    /// The region with `key`, as this node sees it now.
    pub fn find(&self, key: u64) -> Option<RegionDesc> {
        self.list().into_iter().find(|r| r.key == key)
    }

    /// Runs `f` with the directory lock held.
    fn locked<T>(&self, f: impl FnOnce() -> Result<T, RegionError>) -> Result<T, RegionError> {
        self.lock.acquire(self.timeout)?;
        let r = f();
        self.lock.release();
        r
    }

    /// Finds or creates the region `key` of `pages` pages. Returns it and
    /// whether this call created it. `exclusive`: fail if it exists.
    pub fn alloc(
        &self,
        key: u64,
        pages: u64,
        mode: u32,
        cred: Cred,
        ctime: u64,
        exclusive: bool,
    ) -> Result<(RegionDesc, bool), RegionError> {
        self.alloc_with(key, pages, mode, 0, cred, ctime, exclusive, |_| Ok(()))
    }

    /// Like [`Regions::alloc`], with `flags` ([`FLAG_COHERENT`]) for a new
    /// region; `on_create` runs on a new region while the directory lock is
    /// still held (so nobody else uses the region before it did its work,
    /// e.g. waited for every node to receive it, or took the first lock of
    /// a new lock set).
    ///
    /// Either way this node's bit is set in the region's `hosts`.
    #[allow(clippy::too_many_arguments)]
    pub fn alloc_with(
        &self,
        key: u64,
        pages: u64,
        mode: u32,
        flags: u32,
        cred: Cred,
        ctime: u64,
        exclusive: bool,
        on_create: impl FnOnce(&RegionDesc) -> Result<(), RegionError>,
    ) -> Result<(RegionDesc, bool), RegionError> {
        if pages == 0 {
            return Err(RegionError::Empty);
        }
        self.locked(|| {
            let all = self.list();
            if let Some(r) = all.iter().find(|r| r.key == key) {
                if exclusive {
                    return Err(RegionError::Exists(key));
                }
                if !r.allows(cred, Access::Read) {
                    return Err(RegionError::Permission(key));
                }
                if r.pages != pages {
                    return Err(RegionError::SizeMismatch { key, existing: r.pages, asked: pages });
                }
                let mut r = r.clone();
                if r.hosts & self.me() == 0 {
                    r.hosts |= self.me();
                    self.entries[r.id as usize].write(&r.to_words(), self.timeout)?;
                }
                return Ok((r, false));
            }
            let slot = (0..self.entries.len())
                .find(|&i| all.iter().all(|r| r.id as usize != i))
                .ok_or(RegionError::TableFull(self.entries.len()))?;
            let first_page = self.first_fit(&all, pages)?;
            let r = RegionDesc {
                id: slot as u32,
                key,
                first_page,
                pages,
                mode,
                flags,
                uid: cred.uid,
                gid: cred.gid,
                ctime,
                hosts: self.me(),
            };
            self.entries[slot].write(&r.to_words(), self.timeout)?;
            if let Err(e) = on_create(&r) {
                // Nobody else can have it yet: take it back.
                self.entries[slot].write(&[0; W], self.timeout)?;
                return Err(e);
            }
            Ok((r, true))
        })
    }

    fn me(&self) -> u64 {
        1 << (self.lock.bus().node() % 64)
    }

    /// This node lets go of region `id` (no process here has it any more).
    /// The last node to let go frees it. Returns whether it was freed.
    pub fn release(&self, id: u32) -> Result<bool, RegionError> {
        self.locked(|| {
            let e = self.entries.get(id as usize).ok_or(RegionError::NotFound(id as u64))?;
            let mut r = RegionDesc::from_words(id, &e.read()).ok_or(RegionError::NotFound(id as u64))?;
            r.hosts &= !self.me();
            e.write(&if r.hosts == 0 { [0; W] } else { r.to_words() }, self.timeout)?;
            Ok(r.hosts == 0)
        })
    }

    /// Node-failure repair, by the node elected to do it: clears the dead
    /// node's slot in the directory lock, makes both copies of every entry
    /// equal again (the dead node may have been half-way through an
    /// update), and takes the dead node's bit out of every entry, freeing
    /// the ones nobody else holds. Returns the ids of the freed regions.
    pub fn clear_host(&self, dead: usize) -> Result<Vec<u32>, RegionError> {
        self.lock.clear_failed(dead);
        self.locked(|| {
            let mut freed = Vec::new();
            for (i, e) in self.entries.iter().enumerate() {
                e.repair();
                let Some(mut r) = RegionDesc::from_words(i as u32, &e.read()) else { continue };
                if r.hosts & (1 << (dead % 64)) == 0 {
                    continue;
                }
                r.hosts &= !(1 << (dead % 64));
                e.write(&if r.hosts == 0 { [0; W] } else { r.to_words() }, self.timeout)?;
                if r.hosts == 0 {
                    freed.push(r.id);
                }
            }
            Ok(freed)
        })
    }

    /// A failure drill: takes the directory lock and writes half of a new
    /// copy of entry `id`, then returns with the lock still held and the
    /// toggle untouched: what a node that dies mid-update leaves behind.
    /// Only good for testing the survivors' repair.
    pub fn abandon_update(&self, id: u32) -> Result<(), RegionError> {
        let e = self.entries.get(id as usize).ok_or(RegionError::NotFound(id as u64))?;
        self.lock.acquire(self.timeout)?;
        e.write_half_for_drill();
        Ok(())
    }

    /// Late join, by the node elected to serve it: with the directory lock
    /// held, stores our lock slot and every entry again, so a node whose
    /// copy started empty gets the whole directory. `then` runs before the
    /// lock is released (to tell the newcomer it is served: ordered after
    /// the entries, and before our release).
    pub fn restore(&self, then: impl FnOnce()) -> Result<(), RegionError> {
        self.locked(|| {
            let bus = self.lock.bus();
            bus.store(bus.node(), bus.load(bus.node()));
            // An entry never written anywhere is zero in every copy, the
            // newcomer's fresh one included.
            for e in self.entries.iter().filter(|e| e.generation() != 0) {
                e.write(&e.read(), self.timeout)?;
            }
            then();
            Ok(())
        })
    }

    fn first_fit(&self, all: &[RegionDesc], pages: u64) -> Result<u64, RegionError> {
        let mut used: Vec<(u64, u64)> = all.iter().map(|r| (r.first_page, r.first_page + r.pages)).collect();
        used.sort_unstable();
        let mut at = self.data.start;
        let mut largest = 0;
        for (s, e) in used.into_iter().chain([(self.data.end, self.data.end)]) {
            if s >= at {
                if s - at >= pages {
                    return Ok(at);
                }
                largest = largest.max(s - at);
            }
            at = at.max(e);
        }
        Err(RegionError::NoSpace { asked: pages, largest })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::thread;
    use std::time::Instant;

    use super::*;
    use imc_client::cluster_lock::sim::{SimCluster, SimNode};

    const NODES: usize = 4;
    const ENTRIES: usize = 16;
    const ME: Cred = Cred { uid: 1000, gid: 100 };

    fn cluster(seed: u64) -> Arc<SimCluster> {
        Arc::new(SimCluster::with_slots(
            NODES,
            Regions::<SimNode>::words_needed(NODES, ENTRIES),
            Duration::from_micros(50),
            seed,
        ))
    }

    fn dir(c: &SimCluster, n: usize) -> Regions<SimNode> {
        Regions::new(c.node(n), NODES, ENTRIES, 100..164, Duration::from_secs(20)).unwrap()
    }

    /// Waits until every node lists the same regions; returns them.
    fn settled(c: &SimCluster) -> Vec<RegionDesc> {
        let t0 = Instant::now();
        loop {
            let lists: Vec<_> = (0..NODES).map(|n| dir(c, n).list()).collect();
            if lists.iter().all(|l| *l == lists[0]) {
                return lists[0].clone();
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "nodes never agreed: {lists:?}");
            thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn same_key_from_every_node_is_one_region() {
        let c = cluster(1);
        let hs: Vec<_> = (0..NODES)
            .map(|n| {
                let c = c.clone();
                thread::spawn(move || dir(&c, n).alloc(123, 4, 0o666, ME, 1, false).unwrap())
            })
            .collect();
        let got: Vec<(RegionDesc, bool)> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(got.iter().filter(|(_, created)| *created).count(), 1, "exactly one creator");
        assert!(got.iter().all(|(r, _)| (r.id, r.key, r.first_page) == (got[0].0.id, 123, got[0].0.first_page)));
        let all = settled(&c);
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].hosts, 0b1111, "every node holds it");
    }

    #[test]
    fn concurrent_keys_get_disjoint_pages_everyone_agrees_on() {
        let c = cluster(2);
        let hs: Vec<_> = (0..NODES)
            .map(|n| {
                let c = c.clone();
                thread::spawn(move || {
                    let d = dir(&c, n);
                    (0..3u64)
                        .map(|k| d.alloc(1000 * n as u64 + k, 1 + k, 0o600, ME, 7, true).unwrap().0)
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut all: Vec<RegionDesc> = hs.into_iter().flat_map(|h| h.join().unwrap()).collect();
        all.sort_by_key(|r| r.id);
        assert_eq!(settled(&c), all);
        let mut ranges: Vec<(u64, u64)> = all.iter().map(|r| (r.first_page, r.first_page + r.pages)).collect();
        ranges.sort_unstable();
        assert!(ranges.iter().all(|&(s, e)| s >= 100 && e <= 164));
        assert!(ranges.windows(2).all(|w| w[0].1 <= w[1].0), "overlapping regions: {ranges:?}");
    }

    #[test]
    fn errors_say_what_went_wrong() {
        let c = cluster(3);
        let d0 = dir(&c, 0);
        let d1 = dir(&c, 1);
        let (r, created) = d0.alloc(5, 8, 0o600, ME, 1, false).unwrap();
        assert!(created);
        assert_eq!(d1.alloc(5, 8, 0o600, ME, 1, true), Err(RegionError::Exists(5)));
        assert_eq!(
            d1.alloc(5, 9, 0o600, ME, 1, false),
            Err(RegionError::SizeMismatch { key: 5, existing: 8, asked: 9 })
        );
        let stranger = Cred { uid: 2000, gid: 200 };
        assert_eq!(d1.alloc(5, 8, 0o600, stranger, 1, false), Err(RegionError::Permission(5)));
        assert!(d1.alloc(5, 8, 0o600, Cred { uid: 0, gid: 0 }, 1, false).is_ok(), "root may");
        assert_eq!(d1.alloc(6, 0, 0o600, ME, 1, false), Err(RegionError::Empty));
        assert_eq!(d1.alloc(7, 57, 0o600, ME, 1, false), Err(RegionError::NoSpace { asked: 57, largest: 56 }));
        // Freeing makes room again once both holders let go; the freed pages are reused.
        assert_eq!(r.hosts, 0b01);
        assert!(!d0.release(r.id).unwrap(), "node 1 still has it (root's alloc above)");
        assert!(d1.release(r.id).unwrap(), "the last holder frees it");
        let (big, _) = d0.alloc(7, 64, 0o666, ME, 2, false).unwrap();
        assert_eq!((big.first_page, big.pages), (100, 64));
        assert_eq!(d0.release(99), Err(RegionError::NotFound(99)));
    }

    #[test]
    fn permissions_follow_system_v() {
        let r = RegionDesc {
            id: 0,
            key: 1,
            first_page: 0,
            pages: 1,
            mode: 0o640,
            flags: 0,
            uid: 10,
            gid: 20,
            ctime: 0,
            hosts: 1,
        };
        assert!(r.allows(Cred { uid: 10, gid: 99 }, Access::Write));
        assert!(r.allows(Cred { uid: 11, gid: 20 }, Access::Read));
        assert!(!r.allows(Cred { uid: 11, gid: 20 }, Access::Write));
        assert!(!r.allows(Cred { uid: 11, gid: 21 }, Access::Read));
        assert!(r.allows(Cred { uid: 0, gid: 0 }, Access::Write));
    }

    #[test]
    fn table_full_is_reported() {
        let c = cluster(4);
        let d = dir(&c, 2);
        for k in 0..ENTRIES as u64 {
            d.alloc(k, 1, 0o600, ME, 0, true).unwrap();
        }
        assert_eq!(d.alloc(99, 1, 0o600, ME, 0, true), Err(RegionError::TableFull(ENTRIES)));
    }

    /// The real directory (imc_proto's layout: eight pages, entries
    /// straddling page boundaries) fills to its last entry from one node,
    /// every other node reads every entry the same, the full directory
    /// names its size, and a freed entry is taken again.
    #[test]
    fn the_multi_page_directory_fills_and_every_node_reads_it() {
        use imc_proto::layout::{DIR_PAGES, ENTRIES as DIR_ENTRIES, LOCK_SLOTS};
        let words = Regions::<SimNode>::words_needed(LOCK_SLOTS, DIR_ENTRIES);
        assert!(words <= DIR_PAGES as usize * 1024, "{words} words fit the directory's pages");
        let c = Arc::new(SimCluster::with_slots(3, words, Duration::from_micros(5), 9));
        let data = 48..48 + 2 * DIR_ENTRIES as u64;
        let d: Vec<_> = (0..3)
            .map(|n| Regions::new(c.node(n), LOCK_SLOTS, DIR_ENTRIES, data.clone(), Duration::from_secs(20)).unwrap())
            .collect();
        for k in 0..DIR_ENTRIES as u64 {
            let (r, created) = d[0].alloc(1000 + k, 2, 0o600, ME, 0, true).unwrap();
            assert!(created && r.id as u64 == k, "entry {k}");
        }
        assert_eq!(d[0].alloc(1, 1, 0o600, ME, 0, true), Err(RegionError::TableFull(DIR_ENTRIES)));
        let t0 = Instant::now();
        while d[2].list().len() < DIR_ENTRIES {
            assert!(t0.elapsed() < Duration::from_secs(20), "node 2 sees {} entries", d[2].list().len());
            thread::sleep(Duration::from_millis(5));
        }
        let (a, b) = (d[1].list(), d[2].list());
        assert_eq!(a, b);
        for (i, r) in a.iter().enumerate() {
            assert_eq!((r.key, r.first_page, r.pages), (1000 + i as u64, 48 + 2 * i as u64, 2), "entry {i}");
        }
        // Entry 56 straddles pages 0 and 1 (words 1016..1033).
        const _: () = assert!(LOCK_SLOTS + 56 * ENTRY_WORDS < 1024 && LOCK_SLOTS + 57 * ENTRY_WORDS > 1024);
        assert_eq!(d[2].get(56).map(|r| r.key), Some(1056));
        assert!(d[0].release(56).unwrap(), "node 0 was the last holder");
        let (r, _) = d[1].alloc(7, 1, 0o600, ME, 0, true).unwrap();
        assert_eq!(r.id, 56, "the freed entry is taken again");
    }

    #[test]
    fn hosts_track_who_holds_a_region() {
        let c = cluster(5);
        let (r, _) = dir(&c, 0).alloc(9, 2, 0o666, ME, 1, false).unwrap();
        let (r2, created) = dir(&c, 3).alloc(9, 2, 0o666, ME, 1, false).unwrap();
        assert!(!created);
        assert_eq!(r2.hosts, 0b1001);
        assert!(!dir(&c, 0).release(r.id).unwrap());
        assert_eq!(settled(&c)[0].hosts, 0b1000);
        assert!(dir(&c, 3).release(r.id).unwrap());
        assert_eq!(settled(&c), vec![]);
    }

    #[test]
    fn failed_node_is_cleared_and_half_updates_repaired() {
        let c = cluster(6);
        let (shared, _) = dir(&c, 1).alloc(1, 1, 0o666, ME, 1, false).unwrap();
        dir(&c, 2).alloc(1, 1, 0o666, ME, 1, false).unwrap();
        let (only2, _) = dir(&c, 2).alloc(2, 1, 0o666, ME, 1, false).unwrap();
        let (only1, _) = dir(&c, 1).alloc(3, 1, 0o666, ME, 1, false).unwrap();
        settled(&c);
        // Node 2 dies holding the directory lock, half-way through an update
        // of the entry of `only1`: it bid, wrote half of the new copy, no toggle.
        let n2 = c.node(2);
        n2.store(2, 77);
        let e0 = NODES + only1.id as usize * ENTRY_WORDS; // the entry's toggle word; its copies follow
        let valid = n2.load(e0) & 1;
        let half = e0 + 1 + ((valid ^ 1) as usize) * W;
        for i in 0..W / 2 {
            n2.store(half + i, 0xdead);
        }
        let freed = dir(&c, 0).clear_host(2).unwrap();
        assert_eq!(freed, vec![only2.id], "what only node 2 held is freed");
        let after = settled(&c);
        assert_eq!(after.len(), 2);
        assert_eq!((after[0].id, after[0].hosts), (shared.id, 0b010));
        assert_eq!(after[1], only1, "the half-updated entry reads as before");
        // Both copies agree again, and the lock is free: node 3 allocates at once.
        let e = Toggled::new(Window::new(c.node(3), e0, ENTRY_WORDS), W).unwrap();
        let t0 = Instant::now();
        while e.read() != e.shadow() {
            assert!(t0.elapsed() < Duration::from_secs(5), "copies never agreed");
            thread::sleep(Duration::from_millis(1));
        }
        assert!(dir(&c, 3).alloc(30, 1, 0o666, ME, 1, false).unwrap().1);
    }

    #[test]
    fn restore_gives_a_late_joiner_the_directory() {
        let c = cluster(7);
        dir(&c, 0).alloc(1, 2, 0o666, ME, 1, false).unwrap();
        dir(&c, 1).alloc(2, 3, 0o600, ME, 1, false).unwrap();
        let before = settled(&c);
        c.wipe(3);
        assert_eq!(dir(&c, 3).list(), vec![], "node 3 starts with nothing");
        let served = std::sync::atomic::AtomicBool::new(false);
        dir(&c, 0).restore(|| served.store(true, std::sync::atomic::Ordering::SeqCst)).unwrap();
        assert!(served.into_inner());
        assert_eq!(settled(&c), before, "node 3 has the whole directory");
        // And it can use the lock and the entries like everyone else.
        assert!(dir(&c, 3).alloc(4, 1, 0o666, ME, 1, false).unwrap().1);
        assert_eq!(settled(&c).len(), 3);
    }
}
