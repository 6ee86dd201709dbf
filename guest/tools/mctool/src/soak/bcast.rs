//! The `bcast` thread: sequenced broadcast writes. Every node writes
//! numbered records into its slot of one region and checks every other
//! node's for order, completeness and contents; a writer whose own link
//! went down sends its last ring of records again.

use std::time::{Duration, Instant};

use anyhow::Result;
use serde::Serialize;
use testkit::soak::{classify, pack, payload, unpack, Next, RING};

use super::{open_retrying, Region, Shared, HANG, KEY};

/// This workload's figures in the status file.
#[derive(Debug, Default, Clone, Serialize)]
pub(super) struct Bcast {
    written: u64,
    retransmits: u64,
    setups: u64,
    /// Records read and found right.
    checked: u64,
    /// Records that arrived only after being sent again.
    recovered: u64,
    lost_announced: u64,
    lost_unannounced: u64,
    /// A head that went back, or a record from later than expected.
    reorders: u64,
    /// A record with the wrong contents.
    corrupt: u64,
    /// New incarnations of writers adopted.
    joins: u64,
    /// Per writer: (incarnation, last sequence read) as packed words.
    seen: Vec<u64>,
    /// This node's own head (incarnation, last sequence written).
    head: u64,
}

/// Bytes per node slot: a header page (head, acks) and a ring page.
const SLOT: usize = 2 * regs::PAGE_SIZE as usize;
/// A writer never runs more than this many records ahead of the slowest
/// reader that follows it.
const WINDOW: u64 = RING - 16;
/// Offset of reader acks in a slot header: word w is this node's ack of writer w.
const ACKS: usize = 64;
/// How far a reader may lag behind what has arrived, in ms.
const LAG_MS: u64 = 5000;
/// How long a reader waits for a record lost in the writer's announced
/// outage to be sent again.
const ANNOUNCED_WAIT: Duration = Duration::from_secs(5);
/// How long a reader waits for a missing record to be sent again.
const RETRANSMIT_WAIT: Duration = Duration::from_secs(25);

/// A reader's view of one writer.
#[derive(Default, Clone)]
struct Follow {
    inc: u16,
    seq: u64,
    /// When the last record was read right (ms since start).
    good_ms: u64,
    /// Since when the next record has been missing.
    missing_since: Option<Instant>,
    /// The writer's head as last seen, and when it was last seen so.
    head: u64,
    head_ms: u64,
    /// Heads seen and not yet read up to, each with when the head before
    /// it was last seen: a record up to that head was stored after then.
    batches: std::collections::VecDeque<(u64, u64)>,
}

pub(super) fn bcast(sh: &Shared, rate: u64, tick: impl Fn()) -> Result<()> {
    let me = sh.node;
    let size = (sh.nodes * SLOT) as u64;
    let open = || Region::open(KEY, size, false, false);
    let Some(mut r) = open_retrying(sh, "bcast", open) else { return Ok(()) };
    let mine = me * SLOT;
    let mut seq = 0u64;
    let mut follow = vec![Follow::default(); sh.nodes];
    let mut st = Bcast { seen: vec![0; sh.nodes], ..Bcast::default() };
    let mut own_seen = sh.own();
    let period = Duration::from_micros(1_000_000 / rate);
    let mut next_write = Instant::now();
    let mut last_ack_refresh = Instant::now();
    let mut blocked_since: Option<Instant> = None;
    let mut drain: Option<(Instant, Vec<u64>, Instant)> = None;
    // A new incarnation follows nobody yet: clear what an earlier one
    // acknowledged, or writers would wait for it.
    for w in 0..sh.nodes {
        r.store(mine + ACKS + 8 * w, 0);
    }
    let write_record = |r: &Region, s: u64| {
        let slot = mine + regs::PAGE_SIZE as usize + (s % RING) as usize * 16;
        r.store(slot + 8, payload(me, sh.inc, s));
        r.store(slot, pack(sh.inc, s));
    };
    loop {
        // Our own link went down: what we stored meanwhile may be lost, and
        // after a long outage our attachments were revoked. Map again and
        // send the last window again.
        if sh.own() != own_seen {
            if !sh.wait_link() {
                break;
            }
            std::thread::sleep(Duration::from_millis(300));
            own_seen = sh.own();
            // Mapped anew before the old mapping goes, so that a receive
            // buffer that survived the outage is kept.
            let Some(nr) = open_retrying(sh, "bcast", open) else { break };
            r = nr;
            st.setups += 1;
            for s in seq.saturating_sub(WINDOW - 1).max(1)..=seq {
                write_record(&r, s);
            }
            if seq > 0 {
                r.store(mine, pack(sh.inc, seq));
            }
            st.retransmits += 1;
            for f in follow.iter_mut() {
                // Everything we missed while down is an announced loss.
                f.missing_since = None;
            }
        }
        let stopping = sh.stopping();
        // Write the next record when the readers that follow us keep up.
        if !stopping && Instant::now() >= next_write {
            let ahead = (0..sh.nodes).filter(|&n| n != me && sh.up(n)).any(|n| {
                let (ai, aseq) = unpack(r.load(n * SLOT + ACKS + 8 * me));
                ai == sh.inc && seq + 1 > aseq + WINDOW
            });
            if ahead {
                let since = *blocked_since.get_or_insert_with(Instant::now);
                if since.elapsed() > HANG {
                    sh.with(|s| s.stalls.push("bcast: held back 90 s by a reader that does not acknowledge".into()));
                    blocked_since = Some(Instant::now());
                }
            } else {
                blocked_since = None;
                seq += 1;
                write_record(&r, seq);
                r.store(mine, pack(sh.inc, seq));
                st.written += 1;
                next_write += period;
                if next_write + period * 100 < Instant::now() {
                    next_write = Instant::now();
                }
                tick();
            }
        }
        // Read every other writer.
        for w in (0..sh.nodes).filter(|&w| w != me) {
            let f = &mut follow[w];
            let (hi, hs) = unpack(r.load(w * SLOT));
            if hi == 0 {
                continue;
            }
            if hi != f.inc {
                if hi > f.inc {
                    let now = sh.now_ms();
                    *f = Follow { inc: hi, seq: hs, good_ms: now, head: hs, head_ms: now, ..Follow::default() };
                    st.joins += 1;
                } else {
                    st.reorders += 1;
                    sh.error(format!("bcast: writer {w}'s head went back from incarnation {} to {hi}", f.inc));
                }
                continue;
            }
            if hs < f.head {
                st.reorders += 1;
                sh.error(format!("bcast: writer {w}'s head went back from {} to {hs}", f.head));
                f.head = hs;
                f.seq = f.seq.min(hs);
                continue;
            }
            let now = sh.now_ms();
            if hs > f.head {
                f.batches.push_back((hs, f.head_ms));
                f.head = hs;
            }
            f.head_ms = now;
            while f.seq < hs {
                let t = f.seq + 1;
                while f.batches.front().is_some_and(|b| b.0 < t) {
                    f.batches.pop_front();
                }
                // Record t was stored after the writer's earlier head was
                // last seen here; a loss is explained by an outage since
                // then (give or take the gap between its two stores).
                let stored_after = f.batches.front().map_or(f.good_ms, |b| b.1).min(f.good_ms);
                let slot = w * SLOT + regs::PAGE_SIZE as usize + (t % RING) as usize * 16;
                // A record read now may have arrived a while ago: an outage up
                // to LAG before the last good read may still explain a loss.
                let announced = sh.announced_since(w, stored_after.saturating_sub(LAG_MS));
                match classify(r.load(slot), r.load(slot + 8), w, hi, t) {
                    Next::Good => {
                        st.checked += 1;
                        if f.missing_since.take().is_some() {
                            st.recovered += 1;
                        }
                        // Later losses are excused only by outages after this.
                        f.good_ms = sh.now_ms();
                    }
                    // Its tag arrived but its payload store did not (a
                    // frame dropped as corrupt, say): a loss, announced.
                    Next::Corrupt | Next::Later if announced => st.lost_announced += 1,
                    // The watch thread may not have seen the error count move
                    // yet (it looks every 10 ms): judge a second later.
                    Next::Corrupt | Next::Later if !judged(&mut f.missing_since) => break,
                    Next::Corrupt => {
                        st.corrupt += 1;
                        sh.error(format!("bcast: writer {w} record {t}: wrong contents"));
                    }
                    Next::Later => {
                        st.reorders += 1;
                        sh.error(format!("bcast: writer {w} record {t}: a later record in its slot"));
                    }
                    Next::Missing => {
                        // Lost while our own link was down: nobody sends it
                        // again. Lost while the writer's was: it sends its
                        // last ring again once back. Otherwise: wait long.
                        let since = *f.missing_since.get_or_insert_with(Instant::now);
                        let from = stored_after.saturating_sub(LAG_MS);
                        let wait = if sh.own_since(from) {
                            Duration::ZERO
                        } else if announced {
                            ANNOUNCED_WAIT
                        } else {
                            RETRANSMIT_WAIT
                        };
                        if since.elapsed() < wait && !(stopping && drain_over(&drain)) {
                            break;
                        }
                        if sh.announced_since(w, from) {
                            st.lost_announced += 1;
                        } else {
                            st.lost_unannounced += 1;
                            sh.error(format!(
                                "bcast: writer {w} record {t} never arrived, and no outage was announced"
                            ));
                        }
                    }
                }
                f.seq = t;
                f.missing_since = None;
                tick();
            }
            st.seen[w] = pack(f.inc, f.seq);
        }
        // Acknowledge (and now and then again, for a writer whose copy is stale).
        let refresh = last_ack_refresh.elapsed() > Duration::from_secs(1);
        if refresh && seq > 0 {
            // The head again too: a reader that joined while we were held
            // back still learns where we are.
            r.store(mine, pack(sh.inc, seq));
        }
        for w in (0..sh.nodes).filter(|&w| w != me) {
            let off = mine + ACKS + 8 * w;
            let v = pack(follow[w].inc, follow[w].seq);
            if follow[w].inc != 0 && (refresh || r.load(off) != v) {
                r.store(off, v);
            }
        }
        if refresh {
            last_ack_refresh = Instant::now();
        }
        st.head = pack(sh.inc, seq);
        sh.with(|s| s.bcast = st.clone());
        if stopping {
            // Drain: send our last window once more, then read until every
            // writer's head stays put for 3 s (at most 40 s).
            let heads: Vec<u64> = (0..sh.nodes).map(|w| r.load(w * SLOT)).collect();
            match &mut drain {
                None => {
                    for s in seq.saturating_sub(WINDOW - 1).max(1)..=seq {
                        write_record(&r, s);
                    }
                    if seq > 0 {
                        r.store(mine, pack(sh.inc, seq));
                    }
                    drain = Some((Instant::now(), heads, Instant::now()));
                }
                Some((start, last, since)) => {
                    if *last != heads {
                        *last = heads;
                        *since = Instant::now();
                    }
                    let caught_up = follow.iter().all(|f| f.missing_since.is_none());
                    if (since.elapsed() > Duration::from_secs(3) && caught_up)
                        || start.elapsed() > Duration::from_secs(40)
                    {
                        break;
                    }
                }
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(())
}

/// Whether a record that looks wrong has looked so for a second (the
/// first look starts the clock).
pub(super) fn judged(since: &mut Option<Instant>) -> bool {
    since.get_or_insert_with(Instant::now).elapsed() > Duration::from_secs(1)
}

/// During the drain, missing records stop waiting for retransmission once
/// the drain has run half its course.
pub(super) fn drain_over(drain: &Option<(Instant, Vec<u64>, Instant)>) -> bool {
    drain.as_ref().is_some_and(|(start, ..)| start.elapsed() > Duration::from_secs(30))
}
