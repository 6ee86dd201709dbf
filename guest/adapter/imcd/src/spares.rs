//! Spare receive buffers: made and mapped for the adapter's DMA ahead of
//! need, so that attaching a channel's region for receive does not wait
//! for the DMA map. Mapping a buffer costs about 40–90 ms a MiB under TCG
//! (QEMU sends the device one map message per 4 KiB page), three times per
//! rank of a 4-guest MPI job in `MPI_Init`; taking a spare costs a rename.
//!
//! Policy: the size wanted is that of the last region received with
//! [`MIN_PAGES`] to [`MAX_PAGES`] pages (smaller ones map quickly, larger
//! ones are rare); [`COUNT`] spares of that size are kept ready, made once
//! no spare has been asked for during [`QUIET`] (a job's start-up takes
//! several at once and should not share its vCPU with their replacement).
//! Spares of another size are dropped when the wanted size changes. Each
//! buffer has a slot (its IOVA and file name), held by the spare and then
//! by the region that took it, until the region's buffer is dropped.
//! Nothing is made before the first region of a suitable size, so a node
//! that runs no jobs keeps no spare memory.
//!
//! This module owns the policy and the slots; the buffers themselves are
//! made and dropped by the caller's functions (`crate::adapter` on the real
//! adapter). Threads: imcd's main thread and mapper take spares and give
//! slots back (under the mutex); the `spares` thread ([`Spares::run`])
//! makes and drops them, with the mutex released while it does.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Spares kept ready.
pub const COUNT: usize = 4;
/// Smallest region (pages) whose size is kept in spares.
pub const MIN_PAGES: u64 = 16;
/// Largest region (pages, 16 MiB) whose size is kept in spares: a slot's span.
pub const MAX_PAGES: u64 = 2048;
/// Slots: spares and the regions that took one, at most.
pub const SLOTS: usize = 64;
/// No spare is made until none was asked for for this long.
pub const QUIET: Duration = Duration::from_millis(500);
/// How often the maker looks at the stop flag while it has nothing to do.
const LOOK: Duration = Duration::from_millis(200);

/// One spare buffer: `pages` pages in slot `slot`.
#[derive(Debug)]
pub struct Spare<B> {
    /// The buffer, mapped for DMA.
    pub buf: B,
    /// Its slot (IOVA and file name).
    pub slot: usize,
    /// Its size in MEMORY CHANNEL pages.
    pub pages: u64,
}

struct Inner<B> {
    /// The size to keep spares of.
    want: Option<u64>,
    ready: Vec<Spare<B>>,
    /// Slots in use (by a spare, one being made, or a region).
    used: [bool; SLOTS],
    /// When a spare was last asked for.
    asked: Option<Instant>,
}

/// The spares of one node.
pub struct Spares<B> {
    inner: Mutex<Inner<B>>,
    changed: Condvar,
}

impl<B> Default for Spares<B> {
    fn default() -> Self {
        Spares {
            inner: Mutex::new(Inner { want: None, ready: Vec::new(), used: [false; SLOTS], asked: None }),
            changed: Condvar::new(),
        }
    }
}

/// What the maker does next.
enum Work<B> {
    Make { slot: usize, pages: u64 },
    Drop(Spare<B>),
}

impl<B> Spares<B> {
    fn lock(&self) -> MutexGuard<'_, Inner<B>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A spare of `pages` pages, if one is ready. Whether or not, a size in
    /// range becomes the size spares are made of.
    pub fn take(&self, pages: u64) -> Option<Spare<B>> {
        if !(MIN_PAGES..=MAX_PAGES).contains(&pages) {
            return None;
        }
        let mut g = self.lock();
        g.want = Some(pages);
        g.asked = Some(Instant::now());
        let got = g.ready.iter().position(|s| s.pages == pages).map(|i| g.ready.swap_remove(i));
        drop(g);
        self.changed.notify_all();
        got
    }

    /// The buffer that took slot `slot` is gone: the slot is free again.
    pub fn free(&self, slot: usize) {
        if let Some(u) = self.lock().used.get_mut(slot) {
            *u = false;
        }
        self.changed.notify_all();
    }

    /// Spares ready now.
    pub fn ready(&self) -> usize {
        self.lock().ready.len()
    }

    /// The next piece of work, if any is due now: a spare of another size
    /// to drop first, then one to make (its slot taken).
    fn next_work(g: &mut Inner<B>, now: Instant) -> Option<Work<B>> {
        let want = g.want?;
        if let Some(i) = g.ready.iter().position(|s| s.pages != want) {
            return Some(Work::Drop(g.ready.swap_remove(i)));
        }
        if g.ready.len() >= COUNT || g.asked.is_some_and(|t| now.duration_since(t) < QUIET) {
            return None;
        }
        let slot = g.used.iter().position(|u| !u)?;
        g.used[slot] = true;
        Some(Work::Make { slot, pages: want })
    }

    /// Makes and drops spares until `stop`: `make(slot, pages)` makes one
    /// (a failure is logged and the slot given back; the next try waits a
    /// quiet period), `drop_spare` undoes one. Spares still ready at the
    /// end stay ([`Spares::drain`]).
    pub fn run(
        &self,
        stop: &AtomicBool,
        make: impl Fn(usize, u64) -> Result<B, String>,
        drop_spare: impl Fn(Spare<B>),
    ) {
        while !stop.load(Ordering::Relaxed) {
            let mut g = self.lock();
            let work = Self::next_work(&mut g, Instant::now());
            let Some(work) = work else {
                // Asleep until asked, given a slot back or the quiet period is over.
                let _ = self.changed.wait_timeout(g, LOOK);
                continue;
            };
            drop(g);
            match work {
                Work::Drop(s) => {
                    let slot = s.slot;
                    drop_spare(s);
                    self.free(slot);
                }
                Work::Make { slot, pages } => match make(slot, pages) {
                    Ok(buf) => self.lock().ready.push(Spare { buf, slot, pages }),
                    Err(e) => {
                        eprintln!("imcd: cannot make a spare receive buffer of {pages} pages: {e}");
                        let mut g = self.lock();
                        g.used[slot] = false;
                        g.asked = Some(Instant::now());
                    }
                },
            }
        }
    }

    /// Takes every spare ready (at the end: to drop them).
    pub fn drain(&self) -> Vec<Spare<B>> {
        std::mem::take(&mut self.lock().ready)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready_of<B>(s: &Spares<B>) -> Vec<(usize, u64)> {
        let mut v: Vec<_> = s.lock().ready.iter().map(|x| (x.slot, x.pages)).collect();
        v.sort_unstable();
        v
    }

    /// Runs the maker until `done` holds (or 5 s), with buffers that are
    /// their slot numbers; returns what it made and dropped.
    fn drive(s: &Spares<usize>, done: impl Fn(&Spares<usize>) -> bool) -> (Vec<usize>, Vec<usize>) {
        let stop = AtomicBool::new(false);
        let made = Mutex::new(Vec::new());
        let dropped = Mutex::new(Vec::new());
        std::thread::scope(|sc| {
            sc.spawn(|| {
                s.run(
                    &stop,
                    |slot, _| {
                        made.lock().unwrap().push(slot);
                        Ok(slot)
                    },
                    |sp| dropped.lock().unwrap().push(sp.buf),
                )
            });
            let t0 = Instant::now();
            while !done(s) && t0.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(10));
            }
            stop.store(true, Ordering::Relaxed);
        });
        (made.into_inner().unwrap(), dropped.into_inner().unwrap())
    }

    #[test]
    fn nothing_is_made_before_a_region_of_a_size_in_range() {
        let s = Spares::<usize>::default();
        assert!(s.take(4).is_none(), "too small to keep");
        assert!(s.take(MAX_PAGES + 1).is_none(), "too large to keep");
        let mut g = s.lock();
        assert!(g.want.is_none());
        assert!(Spares::next_work(&mut g, Instant::now() + QUIET).is_none());
    }

    #[test]
    fn spares_of_the_wanted_size_are_made_after_a_quiet_period_and_taken() {
        let s = Spares::<usize>::default();
        let t0 = Instant::now();
        assert!(s.take(129).is_none(), "none ready yet");
        {
            let mut g = s.lock();
            assert!(Spares::next_work(&mut g, t0).is_none(), "not during the start-up burst");
        }
        let (made, dropped) = drive(&s, |s| s.ready() == COUNT);
        assert!(t0.elapsed() >= QUIET, "made only after the quiet period");
        assert_eq!(ready_of(&s), (0..COUNT).map(|i| (i, 129)).collect::<Vec<_>>());
        assert_eq!((made.len(), dropped.len()), (COUNT, 0));
        // Taken: a buffer of the size asked for; its slot stays used.
        let sp = s.take(129).expect("a spare");
        assert_eq!(sp.pages, 129);
        assert!(s.lock().used[sp.slot]);
        assert!(s.take(200).is_none(), "no spare of another size");
        s.free(sp.slot);
        assert!(!s.lock().used[sp.slot]);
    }

    #[test]
    fn a_new_size_drops_the_old_spares_and_slots_are_reused() {
        let s = Spares::<usize>::default();
        s.take(129);
        drive(&s, |s| s.ready() == COUNT);
        s.take(300);
        let (made, dropped) = drive(&s, |s| ready_of(s).iter().filter(|r| r.1 == 300).count() == COUNT);
        let mut dropped = dropped;
        dropped.sort_unstable();
        assert_eq!(dropped, (0..COUNT).collect::<Vec<_>>(), "every spare of the old size dropped");
        assert_eq!(made.len(), COUNT);
        assert!(ready_of(&s).iter().all(|r| r.1 == 300 && r.0 < COUNT), "{:?}: the freed slots again", ready_of(&s));
    }

    #[test]
    fn slots_run_out_and_a_failed_make_gives_its_slot_back() {
        let s = Spares::<usize>::default();
        {
            let mut g = s.lock();
            g.used = [true; SLOTS];
            g.want = Some(64);
        }
        let mut g = s.lock();
        assert!(Spares::next_work(&mut g, Instant::now()).is_none(), "no slot free");
        g.used[7] = false;
        assert!(matches!(Spares::next_work(&mut g, Instant::now()), Some(Work::Make { slot: 7, pages: 64 })));
        g.used[7] = false;
        drop(g);
        let stop = AtomicBool::new(false);
        std::thread::scope(|sc| {
            sc.spawn(|| s.run(&stop, |_, _| Err("no memory".into()), |_| {}));
            std::thread::sleep(Duration::from_millis(100));
            stop.store(true, Ordering::Relaxed);
        });
        assert!(!s.lock().used[7], "the slot of the failed spare is free");
        assert_eq!(s.ready(), 0);
    }
}
