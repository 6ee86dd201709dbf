//! The mapper thread (the paper's mapper process): receives every coherent
//! region and acknowledges it, drops receive buffers of freed regions,
//! serves the command relay, publishes error counts and re-announces this
//! node's host row about once a second, and wakes the processes watching
//! the pages a store arrived on ([`crate::watch`]). It runs when the adapter
//! interrupts (and tells the main thread, which may have work from the
//! same event), else once a [`TICK`]. It also watches this node's own
//! link ([`Node::watch_link`]): while it is down the mapper does nothing
//! else (what it would store is dropped), and it never re-announces a node
//! whose outage the main thread has not settled yet.
//!
//! It never takes the directory lock, so a node whose main thread waits for
//! that lock still acks the coherent allocation holding it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use imc_proto::layout::{DATA_FIRST, ENTRIES, LOCK_SLOTS, MAX_NODES};

use crate::hw::{Hw, Notified};
use crate::node::{Link, Node};
use crate::regions::{RegionError, Regions};
use crate::relay;

/// How often the mapper looks at the directory, the relay and the link
/// when no interrupt wakes it earlier. Everything it serves interrupts:
/// writes to the relay page (relay requests, and the kick a node sends
/// after a new coherent region's entry or a join request), to the error
/// counts page, link changes and errors. So the tick is only a guard
/// against a lost store. Each wake-up costs the guest's one vCPU a timer
/// interrupt and several register reads (several hundred µs under TCG):
/// ticking every 20 ms (with the main thread's) was 16% of an idle
/// guest's CPU.
pub const TICK: Duration = Duration::from_secs(1);
/// The tick while our own link is down (an outage longer than the grace
/// revokes every attachment: that is timed here).
const DOWN_TICK: Duration = Duration::from_millis(50);
/// The tick of an adapter without MSI-X (nothing interrupts).
pub const POLL_WITHOUT_IRQ: Duration = Duration::from_millis(20);
/// How often the host row is announced again.
const REANNOUNCE_EVERY: Duration = Duration::from_secs(1);
/// Re-announcements that store our error count too, after a node became
/// ready (or we started).
const ERRCOUNT_AGAIN: u32 = 3;

/// The mapper's state between ticks.
pub struct Mapper<'a, H: Hw> {
    n: &'a Node<H>,
    reader: Regions<H::Bus>,
    served: [u64; MAX_NODES],
    published: Option<u64>,
    announced: std::time::Instant,
    grace: Duration,
    /// Nodes whose host row said ready at the last re-announcement.
    ready_seen: u64,
    /// Re-announcements left that store our error count too.
    errcount_again: u32,
}

impl<'a, H: Hw> Mapper<'a, H> {
    /// A mapper for node `n`; an outage of our link longer than `grace`
    /// revokes every attachment here.
    pub fn new(n: &'a Node<H>, grace: Duration) -> Result<Self, RegionError> {
        let reader = Regions::new(n.hw.dir_bus(), LOCK_SLOTS, ENTRIES, DATA_FIRST..n.hw.pages(), Duration::ZERO)?;
        Ok(Mapper {
            n,
            reader,
            served: [0; MAX_NODES],
            published: None,
            announced: std::time::Instant::now(),
            grace,
            ready_seen: 0,
            errcount_again: ERRCOUNT_AGAIN,
        })
    }

    /// One round of the mapper's work; false while our link is down.
    pub fn tick(&mut self) -> bool {
        let n = self.n;
        match n.watch_link(self.grace) {
            Link::Down => return false,
            // What we published while down was dropped: publish again.
            Link::Back => self.published = None,
            Link::Up => {}
        }
        if self.announced.elapsed() >= REANNOUNCE_EVERY && n.unsettled().is_none() {
            self.announced = std::time::Instant::now();
            // Our error count again only for a while after a node became
            // ready (it may have missed it): a store to that page
            // interrupts every node, and once a second from each of 4
            // nodes was 4 wake-ups a second of every idle guest.
            let ready = n.ready_among(!0);
            if ready & !self.ready_seen != 0 {
                self.errcount_again = ERRCOUNT_AGAIN;
            }
            self.ready_seen = ready;
            n.reannounce(self.errcount_again > 0);
            self.errcount_again = self.errcount_again.saturating_sub(1);
        }
        n.publish_errcount(&mut self.published);
        // Buffers of regions freed (by any node), or whose entry now
        // describes another region, go. Our buffers are listed before the
        // directory is read: a buffer the daemon makes after the list was
        // read is for a region already in the directory, and the look
        // below must not take it (nor one it makes for the same id in
        // between: `forget_stale` drops only the buffer that was listed).
        let ours = n.hw.received();
        let live = self.reader.list();
        for (id, first, pages) in ours {
            if !live.iter().any(|r| r.id == id && r.first_page == first && r.pages == pages) {
                n.hw.forget_stale(id, first, pages);
            }
        }
        for r in live.iter().filter(|r| r.coherent()) {
            if let Err(e) = n.hw.receive(r) {
                eprintln!("imcd: cannot receive coherent region {}: {e}", r.id);
                continue;
            }
            if n.ack(r.id, n.me) != r.ctime {
                n.put_ack(r.id, r.ctime);
            }
        }
        relay::serve(n, &mut self.served);
        true
    }

    /// Runs until `stop`, waking on interrupts or every [`TICK`]; after
    /// each interrupt it calls `woken` (the main thread's wake-up).
    pub fn run(mut self, stop: &AtomicBool, woken: &dyn Fn()) {
        let mut up = true;
        while !stop.load(Ordering::Relaxed) {
            let mut notified = Notified::default();
            let event = self.n.hw.wait_event(if up { TICK } else { DOWN_TICK }, &mut notified);
            // Watchers first: they wait on nothing else.
            self.n.watches.wake(&notified);
            up = self.tick();
            if event {
                woken();
            }
        }
    }
}
