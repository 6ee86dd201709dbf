//! The mapper thread (the paper's mapper process): receives every coherent
//! region and acknowledges it, drops receive buffers of freed regions,
//! serves the command relay, publishes error counts and re-announces this
//! node's host row about once a second. It also watches this node's own
//! link ([`Node::watch_link`]): while it is down the mapper does nothing
//! else (what it would store is dropped), and it never re-announces a node
//! whose outage the main thread has not settled yet.
//!
//! It never takes the directory lock, so a node whose main thread waits for
//! that lock still acks the coherent allocation holding it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use imc_proto::layout::{DATA_FIRST, ENTRIES, LOCK_SLOTS, MAX_NODES};

use crate::hw::Hw;
use crate::node::{Link, Node};
use crate::regions::{RegionError, Regions};
use crate::relay;

/// How often the mapper looks at the directory, the relay and the link
/// when nothing wakes it earlier. Writes to the relay page, link changes
/// and errors interrupt it at once (with MSI-X); a new coherent region is
/// seen at the next tick, so a coherent allocation waits up to one tick
/// for the acks. Each tick costs the guest's one vCPU a timer wake-up and
/// a few register reads (several hundred µs under TCG): at 2 ms that was
/// over a third of an idle guest's CPU, taken from every process that
/// waits for a message.
pub const TICK: Duration = Duration::from_millis(20);
/// Ticks between re-announcements (about a second).
const REANNOUNCE_TICKS: u64 = 50;

/// The mapper's state between ticks.
pub struct Mapper<'a, H: Hw> {
    n: &'a Node<H>,
    reader: Regions<H::Bus>,
    served: [u64; MAX_NODES],
    published: Option<u64>,
    ticks: u64,
    grace: Duration,
}

impl<'a, H: Hw> Mapper<'a, H> {
    /// A mapper for node `n`; an outage of our link longer than `grace`
    /// revokes every attachment here.
    pub fn new(n: &'a Node<H>, grace: Duration) -> Result<Self, RegionError> {
        let reader = Regions::new(n.hw.dir_bus(), LOCK_SLOTS, ENTRIES, DATA_FIRST..n.hw.pages(), Duration::ZERO)?;
        Ok(Mapper { n, reader, served: [0; MAX_NODES], published: None, ticks: 0, grace })
    }

    /// One round of the mapper's work.
    pub fn tick(&mut self) {
        let n = self.n;
        self.ticks += 1;
        match n.watch_link(self.grace) {
            Link::Down => return,
            // What we published while down was dropped: publish again.
            Link::Back => self.published = None,
            Link::Up => {}
        }
        if self.ticks % REANNOUNCE_TICKS == 0 && n.unsettled().is_none() {
            n.reannounce();
        }
        n.publish_errcount(&mut self.published);
        let live = self.reader.list();
        // Buffers of regions freed (by any node), or whose entry now
        // describes another region, go.
        for (id, first, pages) in n.hw.received() {
            if !live.iter().any(|r| r.id == id && r.first_page == first && r.pages == pages) {
                n.hw.forget(id);
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
    }

    /// Runs until `stop`, waking on notifications or every [`TICK`].
    pub fn run(mut self, stop: &AtomicBool) {
        while !stop.load(Ordering::Relaxed) {
            self.n.hw.wait_event(TICK);
            self.tick();
        }
    }
}
