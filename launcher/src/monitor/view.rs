//! The monitor's one JSON document ([`View`]), built from two answers of
//! the hub's control socket: `stats` (per-node counters, the sequence
//! number, nodes held down) and `observe` (writes and writers per page,
//! ordering step times, the hub's copy of imcd's pages). From successive
//! samples it works out rates and a timeline of joins, leaves, links held
//! down and corrupted frames; from the copy of imcd's pages it decodes the
//! region directory (`protocol/imc-proto`'s layout) and the directory
//! lock's bids. Pure: no I/O, no threads (the server's sampling task owns
//! the [`Tracker`]).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use imc_proto::keys::Namespace;
use imc_proto::layout::{dir_entry, DIR_PAGES, ENTRIES, LOCK_KEY, LOCK_SLOTS};
use serde::Serialize;
use serde_json::Value;
use thiserror::Error;

/// Bytes of a page.
const PAGE: u64 = 8192;
/// Timeline entries kept.
pub const TIMELINE: usize = 200;
/// Pages imcd's directory takes, asked of the hub's copy.
pub const DIR_COPY_PAGES: u64 = DIR_PAGES;

/// Why a sample could not be read.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ViewError {
    /// A field the hub always sends is missing or of another type.
    #[error("the hub's {what} answer has no usable {field}")]
    Missing {
        /// `stats` or `observe`.
        what: &'static str,
        /// The field.
        field: &'static str,
    },
    /// The copy of imcd's pages is not hex of the size asked for.
    #[error("the hub's copy of imcd's pages is {0} hex digits, not {1}")]
    BadCopy(usize, usize),
}

/// One sample of the hub: when (seconds since the monitor started) and
/// its two answers.
pub struct Sample {
    /// Seconds since the monitor started.
    pub t: f64,
    /// The `stats` answer.
    pub stats: Value,
    /// The `observe` answer, with [`DIR_COPY_PAGES`] pages of the copy from page 0.
    pub observe: Value,
}

/// One node's line.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct NodeView {
    /// Node id.
    pub node: u16,
    /// Its name (the guest's).
    pub name: String,
    /// Link state: "up", or "held down" by the hub's control.
    pub link: String,
    /// Writes it made, bytes, deliveries to it, frames corrupted on
    /// purpose, writes dropped, link sequence gaps, frames queued to it.
    pub writes: u64,
    /// Bytes it wrote.
    pub bytes: u64,
    /// Frames delivered to it.
    pub deliveries: u64,
    /// Frames to it corrupted on purpose.
    pub corrupted: u64,
    /// Its writes dropped (point-to-point to a node that is not up).
    pub dropped: u64,
    /// Frames lost on its link.
    pub link_gaps: u64,
    /// Frames waiting for it.
    pub queued: u64,
    /// Transmit DMA descriptors its adapter retired and bytes it sent,
    /// since the adapter's last reset (None: the hub does not serve its
    /// adapter, as with per-guest adapters).
    pub dma_descs: Option<u64>,
    /// Bytes its DMA engine sent.
    pub dma_bytes: Option<u64>,
    /// Writes per second since the last sample.
    pub writes_per_s: f64,
    /// Bytes per second since the last sample.
    pub bytes_per_s: f64,
}

/// One page of the heat map.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PageView {
    /// The page (the hub counts pages from 16384 up together, as 16384).
    pub page: u64,
    /// Writes to it so far.
    pub writes: u64,
    /// Writes per second since the last sample.
    pub per_s: f64,
    /// Nodes that wrote it (63 stands for 63 and up).
    pub writers: Vec<u16>,
}

/// One entry of imcd's region directory.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct RegionView {
    /// Directory entry (the region id).
    pub entry: usize,
    /// The key, hex.
    pub key: String,
    /// Whose key it is (its namespace), or "lock set".
    pub kind: String,
    /// First MEMORY CHANNEL page.
    pub first_page: u64,
    /// Pages.
    pub pages: u64,
    /// Every node receives it (IMC_COHERENT).
    pub coherent: bool,
    /// Nodes that hold it (allocated it; they receive it).
    pub hosts: Vec<u16>,
    /// Nodes that wrote any of its pages (from the heat map).
    pub writers: Vec<u16>,
}

/// A timeline entry.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Event {
    /// Seconds since the monitor started.
    pub t: f64,
    /// "join", "leave", "down", "up", "corrupt", "fault".
    pub kind: String,
    /// What happened.
    pub text: String,
}

/// The whole document the page shows.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct View {
    /// Seconds since the monitor started.
    pub t: f64,
    /// The global sequence number (the next to be given).
    pub seq: u64,
    /// Its rate since the last sample.
    pub seq_per_s: f64,
    /// Every node that is up or held down.
    pub nodes: Vec<NodeView>,
    /// Pages written, hottest first.
    pub heat: Vec<PageView>,
    /// imcd's region directory.
    pub regions: Vec<RegionView>,
    /// Bids in the directory's cluster lock: (node, bid); one bid is the holder.
    pub dir_lock: Vec<(u16, u64)>,
    /// Ordering step times: (from ns, steps) per non-empty bucket.
    pub step_ns: Vec<(u64, u64)>,
    /// Joins, leaves, links down and up, corruption and faults asked for, newest last.
    pub timeline: Vec<Event>,
    /// The last writes, decoded as the Wireshark dissector's summary line
    /// decodes them, oldest first.
    pub tail: Vec<String>,
}

/// The last sample's counts, for rates.
struct Last {
    t: f64,
    /// Node -> (writes, bytes).
    nodes: BTreeMap<u16, (u64, u64)>,
    seq: u64,
    /// Page -> writes.
    pages: BTreeMap<u64, u64>,
}

/// Keeps what rates and the timeline need between samples.
#[derive(Default)]
pub struct Tracker {
    last: Option<Last>,
    /// Each node's last line, shown while its link is held down.
    views: BTreeMap<u16, NodeView>,
    nodes: BTreeMap<u16, (String, bool, u64)>,
    timeline: VecDeque<Event>,
}

fn field<'a>(v: &'a Value, what: &'static str, f: &'static str) -> Result<&'a Value, ViewError> {
    v.get(f).ok_or(ViewError::Missing { what, field: f })
}

fn u(v: &Value, f: &'static str) -> u64 {
    v.get(f).and_then(Value::as_u64).unwrap_or(0)
}

fn nodes_of(mask: u64) -> Vec<u16> {
    (0..64).filter(|i| mask & (1 << i) != 0).collect()
}

impl Tracker {
    /// Adds a timeline entry (a fault asked for from the page, a line of
    /// the supervisor's log).
    pub fn note(&mut self, t: f64, kind: &str, text: String) {
        self.timeline.push_back(Event { t, kind: kind.into(), text });
        while self.timeline.len() > TIMELINE {
            self.timeline.pop_front();
        }
    }

    /// The view after sample `s`.
    pub fn update(&mut self, s: &Sample) -> Result<View, ViewError> {
        let st = &s.stats;
        let seq =
            field(st, "stats", "next_seq")?.as_u64().ok_or(ViewError::Missing { what: "stats", field: "next_seq" })?;
        let held: BTreeSet<u16> = field(st, "stats", "held_down")?
            .as_array()
            .ok_or(ViewError::Missing { what: "stats", field: "held_down" })?
            .iter()
            .filter_map(|v| v.as_u64().map(|n| n as u16))
            .collect();
        let list =
            field(st, "stats", "nodes")?.as_array().ok_or(ViewError::Missing { what: "stats", field: "nodes" })?;
        let dt = self.last.as_ref().map(|l| s.t - l.t).filter(|&d| d > 0.0);
        let rate = |now: u64, then: Option<u64>| match (dt, then) {
            (Some(d), Some(b)) => now.saturating_sub(b) as f64 / d,
            _ => 0.0,
        };
        let mut nodes = Vec::new();
        let mut counts = BTreeMap::new();
        let mut up_now = BTreeSet::new();
        for n in list {
            let node = u(n, "node") as u16;
            let name = n.get("name").and_then(Value::as_str).unwrap_or("").to_string();
            let (writes, bytes) = (u(n, "writes_in"), u(n, "bytes_in"));
            let before = self.last.as_ref().and_then(|l| l.nodes.get(&node).copied());
            counts.insert(node, (writes, bytes));
            up_now.insert(node);
            let corrupted = u(n, "corrupted");
            match self.nodes.get(&node) {
                None => self.note(s.t, "join", format!("node {node} ({name}) joined")),
                Some((_, _, c)) if corrupted > *c => {
                    self.note(s.t, "corrupt", format!("{} frames to node {node} corrupted", corrupted - c))
                }
                _ => {}
            }
            // The held flag changes below, where a change is noted.
            let was_held = self.nodes.get(&node).is_some_and(|v| v.1);
            self.nodes.insert(node, (name.clone(), was_held, corrupted));
            nodes.push(NodeView {
                node,
                name,
                link: if held.contains(&node) { "held down".into() } else { "up".into() },
                writes,
                bytes,
                deliveries: u(n, "frames_out"),
                corrupted,
                dropped: u(n, "dropped"),
                link_gaps: u(n, "link_gaps"),
                queued: u(n, "queued"),
                dma_descs: n.get("dma_descs").and_then(Value::as_u64),
                dma_bytes: n.get("dma_bytes").and_then(Value::as_u64),
                writes_per_s: rate(writes, before.map(|b| b.0)),
                bytes_per_s: rate(bytes, before.map(|b| b.1)),
            });
        }
        // Links released (whether or not the node is back yet), nodes gone
        // since the last sample, links held down.
        let released: Vec<u16> = self.nodes.iter().filter(|(n, v)| v.1 && !held.contains(n)).map(|(n, _)| *n).collect();
        for n in released {
            self.note(s.t, "up", format!("node {n}: link released"));
            if let Some(v) = self.nodes.get_mut(&n) {
                v.1 = false;
            }
        }
        let gone: Vec<(u16, String)> = self
            .nodes
            .iter()
            .filter(|(n, _)| !up_now.contains(n) && !held.contains(n))
            .map(|(n, v)| (*n, v.0.clone()))
            .collect();
        for (n, name) in gone {
            self.nodes.remove(&n);
            self.note(s.t, "leave", format!("node {n} ({name}) left"));
        }
        for &n in &held {
            let was = self.nodes.get(&n).map(|v| v.1);
            if was != Some(true) {
                self.note(s.t, "down", format!("node {n}: link held down"));
                let e = self.nodes.entry(n).or_insert((String::new(), true, 0));
                e.1 = true;
            }
        }
        for &n in &held {
            if !nodes.iter().any(|v| v.node == n) {
                // Its last counts, no rates: it is not writing.
                let mut v = self.views.get(&n).cloned().unwrap_or(NodeView {
                    node: n,
                    name: String::new(),
                    link: String::new(),
                    writes: 0,
                    bytes: 0,
                    deliveries: 0,
                    corrupted: 0,
                    dropped: 0,
                    link_gaps: 0,
                    queued: 0,
                    dma_descs: None,
                    dma_bytes: None,
                    writes_per_s: 0.0,
                    bytes_per_s: 0.0,
                });
                v.link = "held down".into();
                (v.writes_per_s, v.bytes_per_s) = (0.0, 0.0);
                nodes.push(v);
            }
        }
        nodes.sort_by_key(|n| n.node);
        self.views = nodes.iter().map(|v| (v.node, v.clone())).collect();

        // The heat map.
        let ob = &s.observe;
        let pages =
            field(ob, "observe", "pages")?.as_array().ok_or(ViewError::Missing { what: "observe", field: "pages" })?;
        let mut page_counts = BTreeMap::new();
        let mut heat = Vec::new();
        let mut writers_of = BTreeMap::new();
        for p in pages {
            let Some([page, writes, writers]) = p.as_array().and_then(|a| {
                let v: Vec<u64> = a.iter().filter_map(Value::as_u64).collect();
                <[u64; 3]>::try_from(v).ok()
            }) else {
                return Err(ViewError::Missing { what: "observe", field: "pages" });
            };
            let before = self.last.as_ref().and_then(|l| l.pages.get(&page).copied());
            page_counts.insert(page, writes);
            writers_of.insert(page, writers);
            heat.push(PageView { page, writes, per_s: rate(writes, before), writers: nodes_of(writers) });
        }
        heat.sort_by(|a, b| b.per_s.total_cmp(&a.per_s).then(b.writes.cmp(&a.writes)).then(a.page.cmp(&b.page)));
        let steps = field(ob, "observe", "step_ns")?
            .as_array()
            .ok_or(ViewError::Missing { what: "observe", field: "step_ns" })?;
        let step_ns = steps
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.as_u64().filter(|&c| c > 0).map(|c| (1u64 << i, c)))
            .collect();
        let hex =
            field(ob, "observe", "shadow")?.as_str().ok_or(ViewError::Missing { what: "observe", field: "shadow" })?;
        let want = (DIR_COPY_PAGES * PAGE * 2) as usize;
        if hex.len() != want {
            return Err(ViewError::BadCopy(hex.len(), want));
        }
        let words: Vec<u64> = hex
            .as_bytes()
            .chunks(16)
            .map(|w| {
                let mut b = [0u8; 8];
                for (i, pair) in w.chunks(2).enumerate() {
                    b[i] = u8::from_str_radix(std::str::from_utf8(pair).unwrap_or("00"), 16).unwrap_or(0);
                }
                u64::from_le_bytes(b)
            })
            .collect();
        let (regions, dir_lock) = directory(&words, &writers_of);
        let tail =
            ob.get("tail").and_then(Value::as_array).map(|t| t.iter().map(frame_line).collect()).unwrap_or_default();

        let t = s.t;
        let seq_per_s = rate(seq, self.last.as_ref().map(|l| l.seq));
        self.last = Some(Last { t, nodes: counts, seq, pages: page_counts });
        Ok(View {
            t,
            seq,
            seq_per_s,
            nodes,
            heat,
            regions,
            dir_lock,
            step_ns,
            timeline: self.timeline.iter().cloned().collect(),
            tail,
        })
    }
}

/// One frame of the hub's tail as the dissector's summary line writes it:
/// `seq 17 write 0 -> all page 60 +0x8 len 8 (imcd field) 0100...`.
fn frame_line(f: &Value) -> String {
    let addr = u(f, "addr");
    let (page, offset) = (addr / PAGE, addr % PAGE);
    let dest = u(f, "dest");
    let to = if dest == 0xffff { "all".to_string() } else { dest.to_string() };
    let flags = u(f, "flags");
    let ack = if flags & 4 != 0 {
        " ACK-answer"
    } else if flags & 2 != 0 {
        " ACK"
    } else {
        ""
    };
    let what = imc_proto::layout::describe(page, offset).map(|d| format!(" ({d})")).unwrap_or_default();
    format!(
        "seq {} write {} -> {to} page {page} +{offset:#x} len {}{ack}{what} {}",
        u(f, "seq"),
        u(f, "src"),
        u(f, "len"),
        f.get("head").and_then(Value::as_str).unwrap_or("")
    )
}

/// imcd's directory from the words of its pages: every entry in use, with
/// the writers of its pages, and the bids in the directory lock.
fn directory(words: &[u64], writers_of: &BTreeMap<u64, u64>) -> (Vec<RegionView>, Vec<(u16, u64)>) {
    let dir_lock = (0..LOCK_SLOTS).filter(|&n| words[n] != 0).map(|n| (n as u16, words[n])).collect();
    let regions = (0..ENTRIES)
        .filter_map(|e| dir_entry(words, e))
        .map(|d| {
            let kind = if d.key & LOCK_KEY != 0 {
                "lock set".to_string()
            } else {
                Namespace::of(d.key).map_or_else(|| "unregistered".to_string(), |n| format!("{n:?}"))
            };
            let writers = (d.first_page..d.first_page.saturating_add(d.pages).min(d.first_page + 4096))
                .filter_map(|p| writers_of.get(&p))
                .fold(0, |a, w| a | w);
            RegionView {
                entry: d.entry,
                key: format!("{:#x}", d.key),
                kind,
                first_page: d.first_page,
                pages: d.pages,
                coherent: d.flags & 1 != 0,
                hosts: nodes_of(d.hosts),
                writers: nodes_of(writers),
            }
        })
        .collect();
    (regions, dir_lock)
}

#[cfg(test)]
mod tests {
    use super::*;
    use imc_proto::layout::ENTRY_WORDS;
    use serde_json::json;

    fn copy(entries: &[(usize, u64, [u64; 8])], lock: &[(usize, u64)]) -> String {
        let mut w = vec![0u64; (DIR_COPY_PAGES * PAGE / 8) as usize];
        for &(n, bid) in lock {
            w[n] = bid;
        }
        for &(e, toggle, rec) in entries {
            let at = LOCK_SLOTS + e * ENTRY_WORDS;
            w[at] = toggle;
            let c = (toggle & 1) as usize;
            w[at + 1 + c * 8..at + 9 + c * 8].copy_from_slice(&rec);
            // The other copy holds garbage that must not be read.
            w[at + 1 + (1 - c) * 8] = 0xdead;
        }
        w.iter().flat_map(|x| x.to_le_bytes()).map(|b| format!("{b:02x}")).collect()
    }

    fn sample(t: f64, seq: u64, nodes: Value, held: Value, pages: Value, shadow: String) -> Sample {
        Sample {
            t,
            stats: json!({"reply": "stats", "next_seq": seq, "nodes": nodes, "held_down": held}),
            observe: json!({"reply": "observe", "pages": pages, "step_ns": [0, 0, 3, 0, 1], "shadow": shadow}),
        }
    }

    #[test]
    fn rates_timeline_heat_map_and_directory() {
        let ump = Namespace::UmpChannel.key(5);
        let dir = copy(
            &[
                (0, 3, [123, 48, 1, 0o666 | 1 << 32, 0, 0, 7, 0b111]),
                (4, 0, [ump, 50, 2, 0o600, 0, 0, 9, 0b10]),
                (7, 1, [LOCK_KEY | 456, 52, 1, 0o666, 0, 0, 9, 0]),
            ],
            &[(1, 77)],
        );
        let mut t = Tracker::default();
        let n = |node: u64, w: u64, c: u64| json!({"node": node, "name": format!("node{node}"), "writes_in": w, "bytes_in": 8 * w, "frames_out": 2 * w, "corrupted": c, "dropped": 0, "link_gaps": 0, "queued": 0, "dma_descs": w / 5, "dma_bytes": 1024 * w});
        let v = t
            .update(&sample(
                0.0,
                10,
                json!([n(0, 5, 0), n(1, 1, 0)]),
                json!([]),
                json!([[48, 4, 3], [50, 1, 2]]),
                dir.clone(),
            ))
            .unwrap();
        assert_eq!(v.nodes.len(), 2);
        assert_eq!(v.nodes[0].writes_per_s, 0.0, "no rate from one sample");
        assert_eq!((v.nodes[0].dma_descs, v.nodes[0].dma_bytes), (Some(1), Some(5120)));
        assert_eq!(v.timeline.iter().filter(|e| e.kind == "join").count(), 2);
        assert_eq!(v.step_ns, [(4, 3), (16, 1)]);
        // Entry 0 (copy 1), entry 4 (copy 0); entry 7 has no hosts: free.
        assert_eq!(v.regions.len(), 2, "{:?}", v.regions);
        assert_eq!(
            v.regions[0],
            RegionView {
                entry: 0,
                key: "0x7b".into(),
                kind: "User".into(),
                first_page: 48,
                pages: 1,
                coherent: true,
                hosts: vec![0, 1, 2],
                writers: vec![0, 1],
            }
        );
        assert_eq!(
            (v.regions[1].kind.as_str(), v.regions[1].pages, &v.regions[1].writers[..]),
            ("UmpChannel", 2, &[1u16][..])
        );
        assert_eq!(v.dir_lock, [(1, 77)]);

        // Two seconds later: node 0 wrote 20 more, node 1 is held down, frames to 0 were corrupted.
        let v = t
            .update(&sample(2.0, 50, json!([n(0, 25, 3)]), json!([1]), json!([[48, 44, 3], [50, 1, 2]]), dir.clone()))
            .unwrap();
        assert_eq!(v.nodes[0].writes_per_s, 10.0);
        assert_eq!(v.nodes[0].bytes_per_s, 80.0);
        assert_eq!(v.seq_per_s, 20.0);
        assert_eq!((v.nodes[1].node, v.nodes[1].link.as_str()), (1, "held down"));
        assert_eq!((v.nodes[1].writes, v.nodes[1].writes_per_s), (1, 0.0), "its last counts while held down");
        assert_eq!((v.heat[0].page, v.heat[0].per_s), (48, 20.0), "the hottest page first");
        let kinds: Vec<&str> = v.timeline.iter().map(|e| e.kind.as_str()).collect();
        assert_eq!(kinds, ["join", "join", "corrupt", "down"]);
        // Released, then node 1 leaves for good.
        let v =
            t.update(&sample(3.0, 51, json!([n(0, 25, 3), n(1, 1, 0)]), json!([]), json!([]), dir.clone())).unwrap();
        assert_eq!(v.timeline.last().unwrap().kind, "up");
        let v = t.update(&sample(4.0, 52, json!([n(0, 25, 3)]), json!([]), json!([]), dir)).unwrap();
        assert_eq!(v.timeline.last().unwrap().text, "node 1 (node1) left");
        for i in 0..TIMELINE + 5 {
            t.note(5.0, "fault", format!("press {i}"));
        }
        assert_eq!(t.timeline.len(), TIMELINE, "the timeline is bounded");
    }

    #[test]
    fn tail_frames_read_like_the_dissector() {
        let f = json!({"seq": 17, "src": 0, "dest": 65535, "flags": 0, "addr": 38 * 8192 + 64, "len": 8, "head": "07"});
        assert_eq!(frame_line(&f), "seq 17 write 0 -> all page 38 +0x40 len 8 (host row 1, imcd token) 07");
        let f = json!({"seq": 3, "src": 1, "dest": 0, "flags": 2, "addr": 62 * 8192, "len": 4, "head": "01010101"});
        assert_eq!(frame_line(&f), "seq 3 write 1 -> 0 page 62 +0x0 len 4 ACK 01010101");
    }

    #[test]
    fn a_malformed_answer_is_an_error() {
        let mut t = Tracker::default();
        let bad = Sample { t: 0.0, stats: json!({"reply": "error", "message": "x"}), observe: json!({}) };
        assert_eq!(t.update(&bad).unwrap_err(), ViewError::Missing { what: "stats", field: "next_seq" });
        let short = sample(0.0, 1, json!([]), json!([]), json!([]), "00".into());
        assert!(matches!(t.update(&short).unwrap_err(), ViewError::BadCopy(2, _)));
        let pages = sample(0.0, 1, json!([]), json!([]), json!([[1, 2]]), String::new());
        assert_eq!(t.update(&pages).unwrap_err(), ViewError::Missing { what: "observe", field: "pages" });
    }
}
