//! [`Watches`]: which client of this node waits for stores on which
//! region ([`imc_proto::Request::Watch`]), and the eventfd that wakes it.
//! A watched region's pages have the page control table's INT bit set, so
//! a store arriving there interrupts; the mapper then adds 1 to the
//! eventfd of every watch on the pages the notifications named. This is
//! how a process sleeps until someone writes to it (UMP's listeners:
//! `docs/imc.md`, "Watching a region") instead of polling.
//!
//! The main thread adds and removes watches ([`crate::daemon`]); the
//! mapper wakes them ([`crate::mapper`]). Both go through one mutex.

use std::fs::File;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::sync::{Mutex, MutexGuard};

use nix::sys::eventfd::{EfdFlags, EventFd};
use thiserror::Error;

use crate::hw::Notified;
use crate::regions::RegionDesc;

/// Watches a node keeps at most (each holds an eventfd open in imcd).
pub const MAX_WATCHES: usize = 256;

/// Why a watch cannot be made.
#[derive(Debug, Error)]
pub enum WatchError {
    /// [`MAX_WATCHES`] watches exist on this node.
    #[error("this node has {MAX_WATCHES} watches already (imcd's limit, MAX_WATCHES)")]
    Full,
    /// The eventfd could not be made.
    #[error("eventfd: {0}")]
    Os(#[from] nix::Error),
    /// The eventfd could not be duplicated for the client.
    #[error("eventfd: {0}")]
    Io(#[from] std::io::Error),
}

/// One client waiting on one region's pages.
struct Watch {
    client: u64,
    id: u32,
    first: u64,
    pages: u64,
    /// imcd's end of the eventfd (the client holds a duplicate).
    fd: File,
}

impl Watch {
    fn covers(&self, page: u64) -> bool {
        (self.first..self.first + self.pages).contains(&page)
    }

    /// Adds 1 to the eventfd. A full counter (the client never reads it)
    /// refuses the write, and the client is woken anyway.
    fn wake(&self) {
        let _ = (&self.fd).write(&1u64.to_ne_bytes());
    }
}

/// The node's watches.
#[derive(Default)]
pub struct Watches {
    list: Mutex<Vec<Watch>>,
}

impl Watches {
    fn list(&self) -> MutexGuard<'_, Vec<Watch>> {
        self.list.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Client `client` watches region `r`: the eventfd for the client (a
    /// second watch of the same region by the same client shares the
    /// first one's). The caller sets INT on the pages.
    pub fn add(&self, client: u64, r: &RegionDesc) -> Result<File, WatchError> {
        self.add_pages(client, r.id, r.first_page, r.pages)
    }

    fn add_pages(&self, client: u64, id: u32, first: u64, pages: u64) -> Result<File, WatchError> {
        let mut list = self.list();
        if let Some(w) = list.iter().find(|w| w.client == client && w.id == id && w.first == first) {
            return Ok(w.fd.try_clone()?);
        }
        if list.len() >= MAX_WATCHES {
            return Err(WatchError::Full);
        }
        let efd = EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)?;
        let fd = File::from(OwnedFd::from(efd));
        let theirs = fd.try_clone()?;
        list.push(Watch { client, id, first, pages, fd });
        Ok(theirs)
    }

    /// Ends client `client`'s watches: of region `id`, or all of them
    /// (`None`: the client left). Returns the pages no watch covers any
    /// more, for the caller to clear INT on.
    pub fn remove(&self, client: u64, id: Option<u32>) -> Vec<u64> {
        let mut list = self.list();
        let (gone, kept): (Vec<Watch>, Vec<Watch>) =
            list.drain(..).partition(|w| w.client == client && id.is_none_or(|id| w.id == id));
        *list = kept;
        let mut free: Vec<u64> = gone
            .iter()
            .flat_map(|w| w.first..w.first + w.pages)
            .filter(|&p| !list.iter().any(|w| w.covers(p)))
            .collect();
        free.sort_unstable();
        free.dedup();
        free
    }

    /// Wakes the watches on the pages `n` names (every watch when
    /// notifications were lost). Returns how many were woken.
    pub fn wake(&self, n: &Notified) -> usize {
        if n.pages.is_empty() && !n.lost {
            return 0;
        }
        let list = self.list();
        let mut woken = 0;
        for w in list.iter() {
            if n.lost || n.pages.iter().any(|&p| w.covers(p)) {
                w.wake();
                woken += 1;
            }
        }
        woken
    }

    /// Watches in place.
    pub fn len(&self) -> usize {
        self.list().len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// Client `c` watches region `id` of `pages` pages from `first`.
    fn add(w: &Watches, c: u64, (id, first, pages): (u32, u64, u64)) -> File {
        w.add_pages(c, id, first, pages).unwrap()
    }

    fn count(f: &File) -> u64 {
        let mut b = [0u8; 8];
        match (&*f).read(&mut b) {
            Ok(8) => u64::from_ne_bytes(b),
            _ => 0,
        }
    }

    #[test]
    fn a_store_wakes_the_watches_on_its_page_only() {
        let w = Watches::default();
        let a = add(&w, 1, (3, 100, 2));
        let b = add(&w, 2, (4, 102, 1));
        assert_eq!(w.wake(&Notified { pages: vec![101, 101], lost: false }), 1);
        assert_eq!((count(&a), count(&b)), (1, 0));
        assert_eq!(w.wake(&Notified { pages: vec![7], lost: false }), 0);
        assert_eq!(w.wake(&Notified { pages: vec![], lost: true }), 2, "lost notifications wake everyone");
        assert_eq!((count(&a), count(&b)), (1, 1));
    }

    #[test]
    fn removing_returns_only_pages_nobody_watches() {
        let w = Watches::default();
        let _a = add(&w, 1, (3, 100, 2));
        let _b = add(&w, 2, (3, 100, 2));
        let _c = add(&w, 1, (5, 200, 1));
        assert_eq!(w.remove(1, Some(3)), Vec::<u64>::new(), "client 2 still watches region 3");
        assert_eq!(w.remove(1, None), vec![200]);
        assert_eq!(w.remove(2, None), vec![100, 101]);
        assert!(w.is_empty());
    }

    #[test]
    fn the_same_watch_twice_shares_one_eventfd_and_the_limit_is_an_error() {
        let w = Watches::default();
        let a = add(&w, 1, (3, 100, 1));
        let a2 = add(&w, 1, (3, 100, 1));
        assert_eq!(w.len(), 1);
        w.wake(&Notified { pages: vec![100], lost: false });
        assert_eq!(count(&a2), 1);
        assert_eq!(count(&a), 0, "one counter, read through either fd");
        for c in 2..=MAX_WATCHES as u64 {
            add(&w, c, (3, 100, 1));
        }
        let e = w.add_pages(9999, 3, 100, 1).unwrap_err();
        assert!(e.to_string().contains("MAX_WATCHES"), "{e}");
    }
}
