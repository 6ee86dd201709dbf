//! The time machine: a capture (`--pcap`, `capture-start`) read back as
//! the history of MEMORY CHANNEL space. The hub puts every write in one
//! order, so replaying a capture's writes up to a sequence number gives
//! what the space held at that point, and the questions a student or a
//! driver writer asks have exact answers: a page's contents at a point,
//! who wrote a word, what changed between two points, one node's writes,
//! joins and leaves. `mc-trace` (`src/bin/mc-trace.rs`) is the command.
//!
//! "Contents" are the global view: the last write in the order to each
//! byte, as a node that receives the page with loopback holds it. A node
//! that did not receive a page, or was not a member at the time, holds
//! less (the per-node answer is its receive enables, which a capture does
//! not record). Bytes nobody wrote read as zero.
//!
//! Reads files only; no threads.

use std::collections::BTreeMap;
use std::path::Path;

use link::{Msg, BROADCAST};
use thiserror::Error;

use crate::capture::{CaptureReader, Next, ReadError, DEST_TRAILER};

/// Bytes in a MEMORY CHANNEL page.
pub const PAGE_SIZE: u64 = 8192;

/// Why a capture could not be read or a question answered.
#[derive(Debug, Error)]
pub enum HistoryError {
    /// The file could not be opened.
    #[error("{0}: {1}")]
    Open(String, std::io::Error),
    /// Not a pcap file, or not the hub's link type.
    #[error("{0}: not a MEMORY CHANNEL capture ({1})")]
    NotCapture(String, String),
    /// A record in the middle of the file is damaged.
    #[error("{file}: record {record}: {why}")]
    Corrupt {
        /// The file.
        file: String,
        /// Its number, from 1.
        record: usize,
        /// What is wrong.
        why: String,
    },
    /// A range whose start is after its end.
    #[error("sequence range {0}..{1} is empty (the start is after the end)")]
    BadRange(u64, u64),
}

/// What one ordered frame was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum What {
    /// A write: writer, destination (`None`: broadcast), flags, address,
    /// and its bytes (at `data` in [`History`]'s store).
    Write {
        /// The writing node.
        src: u16,
        /// The one receiving node of a point-to-point write.
        dest: Option<u16>,
        /// Link flags (loopback, ACK, ACK answer).
        flags: u16,
        /// MEMORY CHANNEL address of the first byte.
        addr: u64,
        /// Where its bytes are in the history's store.
        data: std::ops::Range<usize>,
    },
    /// A node joined (`up`) or left.
    Member {
        /// The node.
        node: u16,
        /// Joined (true) or left.
        up: bool,
    },
}

/// One ordered frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Its place in the global order.
    pub seq: u64,
    /// When the hub ordered it (seconds since the epoch, microseconds).
    pub time: (u64, u32),
    /// The frame.
    pub what: What,
}

/// A capture, read whole.
pub struct History {
    events: Vec<Event>,
    bytes: Vec<u8>,
    /// A note about the file's end (a last record cut short).
    pub warning: Option<String>,
}

/// One write to a word, for [`History::who_wrote`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WordWrite {
    /// The write's sequence number.
    pub seq: u64,
    /// The writer.
    pub src: u16,
    /// Point-to-point destination.
    pub dest: Option<u16>,
    /// The write's address and length.
    pub addr: u64,
    /// Its length.
    pub len: usize,
    /// The word's 8 bytes after it (bytes of the word it did not cover as before).
    pub word_after: [u8; 8],
}

/// A region or lock set imcd's directory held during the capture, for
/// [`History::regions`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionSpan {
    /// The directory entry and what it held.
    pub entry: imc_proto::layout::DirEntry,
    /// Every node that held it at some point.
    pub hosts: u64,
    /// The write that put it in the directory.
    pub from: u64,
    /// The write that took it out (None: still there at the end).
    pub to: Option<u64>,
}

/// One changed word, for [`History::diff`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The word's address (8-byte aligned).
    pub addr: u64,
    /// Before and after.
    pub before: [u8; 8],
    /// After.
    pub after: [u8; 8],
    /// The last write in the range that touched it: (seq, node).
    pub last: (u64, u16),
}

impl History {
    /// Reads a capture. A last record cut short (a capture still being
    /// written) is left out with a [`History::warning`]; damage anywhere
    /// else is an error.
    pub fn read(path: &Path) -> Result<History, HistoryError> {
        let name = path.display().to_string();
        let mut r = CaptureReader::open(path).map_err(|e| match e {
            ReadError::Open(e) => HistoryError::Open(name.clone(), e),
            e => HistoryError::NotCapture(name.clone(), e.to_string()),
        })?;
        let mut h = History { events: Vec::new(), bytes: Vec::new(), warning: None };
        let mut record = 0;
        loop {
            record += 1;
            let corrupt = |why: String| HistoryError::Corrupt { file: name.clone(), record, why };
            let (timestamp, data) = match r.next_record() {
                Next::Record { time, data } => (time, data),
                Next::End => break,
                Next::Incomplete => {
                    h.warning =
                        Some(format!("{name}: record {record} is incomplete (still being written, or cut short)"));
                    break;
                }
                Next::Corrupt(why) => return Err(corrupt(why)),
            };
            let frame = &data[..];
            if frame.len() < link::HEADER_LEN {
                return Err(corrupt(format!("{} bytes, shorter than a frame header", frame.len())));
            }
            let hdr = link::Header::parse(frame[..link::HEADER_LEN].try_into().unwrap())
                .map_err(|e| corrupt(e.to_string()))?;
            let rest = &frame[link::HEADER_LEN..];
            if rest.len() < hdr.len {
                return Err(corrupt(format!("payload of {} bytes announced, {} recorded", hdr.len, rest.len())));
            }
            let (payload, trailer) = rest.split_at(hdr.len);
            let time = (timestamp.as_secs(), timestamp.subsec_micros());
            let event = match Msg::parse(&hdr, payload).map_err(|e| corrupt(e.to_string()))? {
                Msg::Deliver { seq, src, flags, addr, data } => {
                    let dest = match trailer {
                        [] => None,
                        t if t.len() == DEST_TRAILER => {
                            Some(u16::from_le_bytes([t[0], t[1]])).filter(|&d| d != BROADCAST)
                        }
                        t => return Err(corrupt(format!("{} bytes after the frame", t.len()))),
                    };
                    let at = h.bytes.len();
                    h.bytes.extend_from_slice(data);
                    Event { seq, time, what: What::Write { src, dest, flags, addr, data: at..h.bytes.len() } }
                }
                Msg::Member { seq, node, up } => Event { seq, time, what: What::Member { node, up } },
                other => return Err(corrupt(format!("not an ordered frame: {other:?}"))),
            };
            if let Some(last) = h.events.last() {
                if event.seq <= last.seq {
                    return Err(corrupt(format!("sequence {} after {}: not in the global order", event.seq, last.seq)));
                }
            }
            h.events.push(event);
        }
        Ok(h)
    }

    /// Every frame, in the order.
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// The bytes of a write.
    pub fn data(&self, e: &Event) -> &[u8] {
        match &e.what {
            What::Write { data, .. } => &self.bytes[data.clone()],
            What::Member { .. } => &[],
        }
    }

    /// The first and last sequence numbers (None for an empty capture).
    pub fn span(&self) -> Option<(u64, u64)> {
        Some((self.events.first()?.seq, self.events.last()?.seq))
    }

    /// The writes with sequence numbers in `from..=to`, with their bytes.
    fn writes(&self, from: u64, to: u64) -> impl Iterator<Item = (&Event, u16, u64, &[u8])> {
        self.events.iter().filter(move |e| e.seq >= from && e.seq <= to).filter_map(|e| match &e.what {
            What::Write { src, addr, data, .. } => Some((e, *src, *addr, &self.bytes[data.clone()])),
            What::Member { .. } => None,
        })
    }

    /// Page `page` as the writes up to and including `at` left it.
    pub fn page_at(&self, page: u64, at: u64) -> Vec<u8> {
        let mut out = vec![0u8; PAGE_SIZE as usize];
        let (lo, hi) = (page * PAGE_SIZE, (page + 1) * PAGE_SIZE);
        for (_, _, addr, data) in self.writes(0, at) {
            apply(&mut out, lo, hi, addr, data);
        }
        out
    }

    /// How many writes up to and including `at` touched page `page`.
    pub fn who_wrote_page(&self, page: u64, at: u64) -> usize {
        let (lo, hi) = (page * PAGE_SIZE, (page + 1) * PAGE_SIZE);
        self.writes(0, at).filter(|(_, _, addr, data)| *addr < hi && addr + data.len() as u64 > lo).count()
    }

    /// Every write, in `from..=to`, that touched the 8-byte word holding
    /// `addr`, with the word after it.
    pub fn who_wrote(&self, addr: u64, from: u64, to: u64) -> Result<Vec<WordWrite>, HistoryError> {
        if from > to {
            return Err(HistoryError::BadRange(from, to));
        }
        let lo = addr & !7;
        let mut word = [0u8; 8];
        let mut out = Vec::new();
        for (e, src, a, data) in self.writes(0, to) {
            if !apply(&mut word, lo, lo + 8, a, data) || e.seq < from {
                continue;
            }
            let dest = match e.what {
                What::Write { dest, .. } => dest,
                What::Member { .. } => None,
            };
            out.push(WordWrite { seq: e.seq, src, dest, addr: a, len: data.len(), word_after: word });
        }
        Ok(out)
    }

    /// Every 8-byte word whose contents differ between the points `from`
    /// and `to` (after the writes up to each), with the last write in
    /// between that touched it.
    pub fn diff(&self, from: u64, to: u64) -> Result<Vec<Change>, HistoryError> {
        if from > to {
            return Err(HistoryError::BadRange(from, to));
        }
        // The words written in between, with their last writer.
        let mut touched: BTreeMap<u64, (u64, u16)> = BTreeMap::new();
        for (e, src, addr, data) in self.writes(from + 1, to) {
            let end = addr + data.len() as u64;
            let mut w = addr & !7;
            while w < end {
                touched.insert(w, (e.seq, src));
                w += 8;
            }
        }
        let mut pages: BTreeMap<u64, (Vec<u8>, Vec<u8>)> = BTreeMap::new();
        let mut out = Vec::new();
        for (&w, &last) in &touched {
            let page = w / PAGE_SIZE;
            let (before, after) =
                pages.entry(page).or_insert_with(|| (self.page_at(page, from), self.page_at(page, to)));
            let off = (w % PAGE_SIZE) as usize;
            let (b, a): ([u8; 8], [u8; 8]) =
                (before[off..off + 8].try_into().unwrap(), after[off..off + 8].try_into().unwrap());
            if a != b {
                out.push(Change { addr: w, before: b, after: a, last });
            }
        }
        Ok(out)
    }

    /// Every region and lock set imcd's directory held while the capture
    /// ran, in the order they appeared: the directory pages replayed,
    /// each entry decoded after every write to it. A capture started while
    /// the cluster ran knows only the entries written since.
    pub fn regions(&self) -> Vec<RegionSpan> {
        use imc_proto::layout::{dir_entry, entry_of_word, DIR_WORDS};
        let dir_end = DIR_WORDS as u64 * 8;
        let mut bytes = vec![0u8; DIR_WORDS * 8];
        let mut words = vec![0u64; DIR_WORDS];
        let mut open: std::collections::HashMap<usize, usize> = std::collections::HashMap::new();
        let mut spans: Vec<RegionSpan> = Vec::new();
        for (e, _, addr, data) in self.writes(0, u64::MAX) {
            if !apply(&mut bytes, 0, dir_end, addr, data) {
                continue;
            }
            let (first, last) = (addr / 8, ((addr + data.len() as u64).min(dir_end) - 1) / 8);
            let mut touched = std::collections::BTreeSet::new();
            for w in first..=last {
                let w = w as usize;
                words[w] = u64::from_le_bytes(bytes[w * 8..w * 8 + 8].try_into().unwrap());
                touched.extend(entry_of_word(w));
            }
            for entry in touched {
                let now = dir_entry(&words, entry);
                let cur = open.get(&entry).copied();
                let same = |i: usize, d: &imc_proto::layout::DirEntry| {
                    let s = &spans[i].entry;
                    (s.key, s.first_page, s.ctime) == (d.key, d.first_page, d.ctime)
                };
                match (cur, now) {
                    (Some(i), Some(d)) if same(i, &d) => {
                        spans[i].hosts |= d.hosts;
                        spans[i].entry.hosts = d.hosts;
                    }
                    (cur, now) => {
                        if let Some(i) = cur {
                            spans[i].to = Some(e.seq);
                            open.remove(&entry);
                        }
                        if let Some(d) = now {
                            open.insert(entry, spans.len());
                            spans.push(RegionSpan { entry: d, hosts: d.hosts, from: e.seq, to: None });
                        }
                    }
                }
            }
        }
        spans
    }

    /// Node `node`'s writes, joins and leaves.
    pub fn timeline(&self, node: u16) -> Vec<&Event> {
        self.events
            .iter()
            .filter(|e| match e.what {
                What::Write { src, .. } => src == node,
                What::Member { node: n, .. } => n == node,
            })
            .collect()
    }
}

/// Applies a write of `data` at `addr` to `buf`, which holds the addresses
/// `lo..hi`; true when it touched any of them.
fn apply(buf: &mut [u8], lo: u64, hi: u64, addr: u64, data: &[u8]) -> bool {
    let (s, e) = (addr.max(lo), (addr + data.len() as u64).min(hi));
    if s >= e {
        return false;
    }
    buf[(s - lo) as usize..(e - lo) as usize].copy_from_slice(&data[(s - addr) as usize..(e - addr) as usize]);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_lands_where_it_overlaps() {
        let mut b = [0u8; 8];
        assert!(!apply(&mut b, 16, 24, 0, &[1; 16]), "ends where the word starts");
        assert!(apply(&mut b, 16, 24, 12, &[2; 8]));
        assert_eq!(b, [2, 2, 2, 2, 0, 0, 0, 0]);
        assert!(apply(&mut b, 16, 24, 22, &[3; 8]));
        assert_eq!(b, [2, 2, 2, 2, 0, 0, 3, 3]);
        assert!(!apply(&mut b, 16, 24, 24, &[4; 1]));
    }
}
