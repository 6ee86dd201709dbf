//! What the live monitor (`mc-cluster monitor`) reads of the order: how
//! many writes each page took and which nodes wrote it (the heat map), how
//! long ordering steps take (a histogram), and a copy of the first pages
//! of MEMORY CHANNEL space, where imcd keeps its directory, host table and
//! lock slots (`protocol/imc-proto`'s layout), so the monitor can show
//! regions and lock holders without asking a guest.
//!
//! Written by the ordering step (`Order::try_order`, under the order lock:
//! one writer at a time) and read by the control request `observe`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Pages copied from the start of MEMORY CHANNEL space: imcd keeps its own
/// pages below this (`imc_proto::layout::DATA_FIRST`; a test checks).
pub const SHADOW_PAGES: u64 = 48;
/// Pages the heat map counts one by one (128 MiB of MEMORY CHANNEL space);
/// writes above are counted together as page [`PAGES`].
pub const PAGES: u64 = 16384;
/// Bytes of a page.
const PAGE: u64 = 8192;
/// Buckets of the step-time histogram: bucket `i` counts steps that took
/// from 2^i to 2^(i+1) - 1 nanoseconds (the last one, longer).
pub const BUCKETS: usize = 32;
/// One step in this many is timed (reading the clock twice per write
/// costs a tenth of a saturated hub's step).
pub const TIME_EVERY: u64 = 8;
/// Frames the tail keeps.
pub const TAIL: usize = 32;
/// The tail is kept while someone asked for the view this recently (a
/// monitor is watching); otherwise writes skip it.
pub const TAIL_FOR: Duration = Duration::from_secs(10);
/// Bytes of a write the tail keeps.
const TAIL_BYTES: usize = 16;

/// The monitor's view; see the module doc. Counters are atomics (the
/// ordering step is their one writer, under the order lock); the copy of
/// imcd's pages has its own lock, taken only by writes to those pages.
pub(crate) struct Observe {
    /// Writes per page (the last entry: every page from [`PAGES`] up).
    writes: Box<[AtomicU64]>,
    /// Bitmask of each page's writers (node 63 and up share bit 63).
    writers: Box<[AtomicU64]>,
    steps: [AtomicU64; BUCKETS],
    shadow: Mutex<Vec<u8>>,
    /// The last frames, while a monitor is watching.
    tail: Mutex<VecDeque<Frame>>,
    /// Whether writes go into the tail.
    tail_on: AtomicBool,
    /// Until when (ms since `born`) the tail is kept.
    tail_until: AtomicU64,
    born: Instant,
}

/// One ordered write as the tail keeps it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Frame {
    /// Its place in the order.
    pub seq: u64,
    /// The writer.
    pub src: u16,
    /// Destination (0xFFFF: broadcast).
    pub dest: u16,
    /// Link flags (loopback, ACK, ACK answer).
    pub flags: u16,
    /// Address.
    pub addr: u64,
    /// Length.
    pub len: usize,
    /// Its first bytes, hex.
    pub head: String,
}

/// A copy of the view, as `observe` returns it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Seen {
    /// (page, writes, writers bitmask) of every page written, by page
    /// ([`PAGES`] stands for every page from there up).
    pub pages: Vec<(u64, u64, u64)>,
    /// Timed ordering steps (one in [`TIME_EVERY`]) by time taken: entry
    /// `i` counts 2^i to 2^(i+1) - 1 ns.
    pub step_ns: Vec<u64>,
    /// Pages `first..first + count` of the copy, hex (empty when none asked for).
    pub shadow: String,
    /// The last writes, oldest first (kept from the first `observe` on,
    /// while they keep coming).
    #[serde(default)]
    pub tail: Vec<Frame>,
}

impl Observe {
    pub(crate) fn new() -> Observe {
        let zeros = || (0..=PAGES).map(|_| AtomicU64::new(0)).collect::<Vec<_>>().into_boxed_slice();
        Observe {
            writes: zeros(),
            writers: zeros(),
            steps: std::array::from_fn(|_| AtomicU64::new(0)),
            shadow: Mutex::new(vec![0; (SHADOW_PAGES * PAGE) as usize]),
            tail: Mutex::new(VecDeque::with_capacity(TAIL)),
            tail_on: AtomicBool::new(false),
            tail_until: AtomicU64::new(0),
            born: Instant::now(),
        }
    }

    /// Whether the step of write `seq` is to be timed.
    pub(crate) fn timed(seq: u64) -> bool {
        seq % TIME_EVERY == 0
    }

    /// Ordered write `seq` of `data` at `addr` by `src` to `dest`; `since`:
    /// when its step began, if it was timed.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn write(
        &self,
        seq: u64,
        src: u16,
        dest: u16,
        flags: u16,
        addr: u64,
        data: &[u8],
        since: Option<Instant>,
    ) {
        let page = (addr / PAGE).min(PAGES) as usize;
        self.writes[page].fetch_add(1, Relaxed);
        let bit = 1u64 << src.min(63);
        if self.writers[page].load(Relaxed) & bit == 0 {
            self.writers[page].fetch_or(bit, Relaxed);
        }
        if let Some(t) = since {
            self.step(t.elapsed());
            // Timed steps read the clock anyway: the tail stops here once
            // nobody has asked for a while.
            if self.tail_on.load(Relaxed) && self.ms() >= self.tail_until.load(Relaxed) {
                self.tail_on.store(false, Relaxed);
            }
        }
        if self.tail_on.load(Relaxed) {
            let head = data.iter().take(TAIL_BYTES).map(|b| format!("{b:02x}")).collect();
            let mut t = self.tail.lock().unwrap_or_else(|e| e.into_inner());
            if t.len() == TAIL {
                t.pop_front();
            }
            t.push_back(Frame { seq, src, dest, flags, addr, len: data.len(), head });
        }
        if addr < SHADOW_PAGES * PAGE {
            let stop = addr.saturating_add(data.len() as u64).min(SHADOW_PAGES * PAGE);
            let mut sh = self.shadow.lock().unwrap_or_else(|e| e.into_inner());
            sh[addr as usize..stop as usize].copy_from_slice(&data[..(stop - addr) as usize]);
        }
    }

    fn ms(&self) -> u64 {
        self.born.elapsed().as_millis() as u64
    }

    fn step(&self, took: Duration) {
        let ns = took.as_nanos().clamp(1, u64::MAX as u128) as u64;
        self.steps[(63 - ns.leading_zeros() as usize).min(BUCKETS - 1)].fetch_add(1, Relaxed);
    }

    /// The view, with pages `first..first + count` of the copy.
    pub(crate) fn seen(&self, first: u64, count: u64) -> Result<Seen, String> {
        if first.saturating_add(count) > SHADOW_PAGES {
            return Err(format!("pages {first}..{} are past the {SHADOW_PAGES} pages the hub copies", first + count));
        }
        let pages = (0..=PAGES as usize)
            .filter_map(|p| {
                let n = self.writes[p].load(Relaxed);
                (n > 0).then(|| (p as u64, n, self.writers[p].load(Relaxed)))
            })
            .collect();
        let shadow = {
            let sh = self.shadow.lock().unwrap_or_else(|e| e.into_inner());
            sh[(first * PAGE) as usize..((first + count) * PAGE) as usize].iter().map(|b| format!("{b:02x}")).collect()
        };
        self.tail_until.store(self.ms() + TAIL_FOR.as_millis() as u64, Relaxed);
        self.tail_on.store(true, Relaxed);
        let tail = self.tail.lock().unwrap_or_else(|e| e.into_inner()).iter().cloned().collect();
        Ok(Seen { pages, step_ns: self.steps.iter().map(|s| s.load(Relaxed)).collect(), shadow, tail })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_writers_times_and_copies_the_first_pages() {
        let o = Observe::new();
        let w = |src: u16, addr: u64, data: &[u8], t: Option<Instant>| o.write(0, src, 0xffff, 0, addr, data, t);
        w(1, 60 * PAGE + 8, &[1; 8], None);
        w(3, 60 * PAGE, &[2; 8], None);
        w(70, 61 * PAGE, &[3; 8], None);
        w(2, (PAGES + 5) * PAGE, &[3; 8], None);
        w(2, u64::MAX - 3, &[3; 8], None);
        // Straddles the end of the copy: the part inside is kept.
        w(0, SHADOW_PAGES * PAGE - 4, &[9; 8], None);
        w(0, 38 * PAGE + 16, &[7, 7], Some(Instant::now()));
        for ns in [1500, 1024, 3, 0] {
            o.step(Duration::from_nanos(ns));
        }
        o.step(Duration::from_secs(100));
        let s = o.seen(38, 1).unwrap();
        assert_eq!(s.pages, [(38, 1, 1), (47, 1, 1), (60, 2, 0b1010), (61, 1, 1 << 63), (PAGES, 2, 0b100)]);
        assert_eq!(s.step_ns[10], 2, "1024 and 1500 ns");
        assert_eq!(s.step_ns[1], 1, "3 ns");
        assert_eq!(s.step_ns[0], 1, "0 ns counts as the first bucket");
        assert_eq!(s.step_ns[BUCKETS - 1], 1, "100 s is in the last");
        assert_eq!(s.step_ns.iter().sum::<u64>(), 6, "five by hand, one timed write");
        assert!(Observe::timed(0) && !Observe::timed(1) && Observe::timed(TIME_EVERY));
        assert_eq!(s.shadow.len(), 2 * PAGE as usize);
        assert_eq!(&s.shadow[32..36], "0707");
        let last = o.seen(SHADOW_PAGES - 1, 1).unwrap().shadow;
        assert!(last.ends_with("09090909") && !last.ends_with("0909090909"));
        assert!(o.seen(40, 9).unwrap_err().contains("past the 48 pages"));
        assert_eq!(o.seen(0, 0).unwrap().shadow, "");
        assert!(s.tail.is_empty(), "no tail before anyone asked");
    }

    #[test]
    fn the_tail_keeps_the_last_frames_while_watched() {
        let o = Observe::new();
        o.seen(0, 0).unwrap();
        for seq in 0..(TAIL as u64 + 5) {
            o.write(seq, 2, 1, 0x2, 60 * PAGE + seq, &[0xab; 20], None);
        }
        let t = o.seen(0, 0).unwrap().tail;
        assert_eq!(t.len(), TAIL);
        assert_eq!((t[0].seq, t[TAIL - 1].seq), (5, TAIL as u64 + 4), "the newest, oldest first");
        assert_eq!((t[0].src, t[0].dest, t[0].flags, t[0].len), (2, 1, 0x2, 20));
        assert_eq!(t[0].head, "ab".repeat(16), "the first 16 bytes");
        // Nobody asked for longer than TAIL_FOR: a timed step stops the tail.
        o.tail_until.store(0, Relaxed);
        o.write(100, 2, 1, 0, 0, &[1], Some(Instant::now()));
        o.write(101, 2, 1, 0, 0, &[1], None);
        assert!(!o.tail_on.load(Relaxed));
        assert_eq!(o.tail.lock().unwrap().back().unwrap().seq, TAIL as u64 + 4);
    }
}
