//! The words of the soak workload (`mctool soak` writes them in
//! MEMORY CHANNEL space; the `mc-soak` driver reads them from the nodes'
//! status files): sequence tags, record payloads, lock tallies, and how a
//! reader judges a ring slot.

use serde::{Deserialize, Serialize};

/// Records in a writer's ring (16 bytes each: tag, payload; one 8 KiB page).
pub const RING: u64 = 512;

/// `(incarnation, sequence)` packed in one 8-byte word (one store, so a
/// reader never sees half of it). Incarnations start at 1: 0 is "nothing".
pub fn pack(inc: u16, seq: u64) -> u64 {
    (u64::from(inc) << 48) | (seq & ((1 << 48) - 1))
}

/// The inverse of [`pack`].
pub fn unpack(w: u64) -> (u16, u64) {
    ((w >> 48) as u16, w & ((1 << 48) - 1))
}

/// The payload word of record `seq` of writer `node`, incarnation `inc`.
pub fn payload(node: usize, inc: u16, seq: u64) -> u64 {
    let mut z = (node as u64) << 56 ^ u64::from(inc) << 40 ^ seq;
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Tally words each node keeps in the counter region, one per incarnation
/// modulo this: a new incarnation does not overwrite the last one's word,
/// so the survivors still report a killed incarnation's final tally.
pub const TALLY_SLOTS: usize = 8;

/// Byte offset in the counter region of the tally word of `node`'s
/// incarnation `inc` (after the counter and the views; 16 nodes fill
/// 1 KiB).
pub fn tally_offset(node: usize, inc: u16) -> usize {
    TALLIES + 8 * (node * TALLY_SLOTS + usize::from(inc) % TALLY_SLOTS)
}

/// Byte offset of the first tally word.
pub const TALLIES: usize = 1024;

/// A lock tally: incarnation (12 bits), an increment in flight (1 bit),
/// increments in doubt (11 bits), confirmed increments (40 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tally {
    /// The incarnation (restarts of the workload on that node).
    pub inc: u16,
    /// An increment was stored and not yet seen back.
    pub pending: bool,
    /// Increments that did not come back within their deadline.
    pub doubt: u64,
    /// Increments seen back.
    pub confirmed: u64,
}

impl Tally {
    /// The tally as one word.
    pub fn word(&self) -> u64 {
        (u64::from(self.inc & 0xFFF) << 52)
            | (u64::from(self.pending) << 51)
            | ((self.doubt.min(0x7FF)) << 40)
            | (self.confirmed & ((1 << 40) - 1))
    }

    /// The inverse of [`Tally::word`].
    pub fn from_word(w: u64) -> Tally {
        Tally {
            inc: (w >> 52) as u16,
            pending: (w >> 51) & 1 == 1,
            doubt: (w >> 40) & 0x7FF,
            confirmed: w & ((1 << 40) - 1),
        }
    }
}

/// What a reader does with the next record of a writer.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// The record is there and right.
    Good,
    /// The record is there with the wrong payload.
    Corrupt,
    /// A later record sits in its slot: the writer lapped the reader.
    Later,
    /// Not there (yet).
    Missing,
}

/// Classifies the record in a ring slot against the one expected.
pub fn classify(tag: u64, data: u64, writer: usize, inc: u16, seq: u64) -> Next {
    let (ti, ts) = unpack(tag);
    if ti == inc && ts == seq {
        if data == payload(writer, inc, seq) {
            Next::Good
        } else {
            Next::Corrupt
        }
    } else if ti == inc && ts > seq || ti > inc {
        Next::Later
    } else {
        Next::Missing
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip() {
        assert_eq!(unpack(pack(7, 123_456)), (7, 123_456));
        assert_eq!(pack(0, 0), 0);
        let t = Tally { inc: 9, pending: true, doubt: 3, confirmed: 1 << 33 };
        assert_eq!(Tally::from_word(t.word()), t);
        assert_ne!(payload(1, 1, 5), payload(2, 1, 5));
        assert_ne!(payload(1, 1, 5), payload(1, 2, 5));
    }

    #[test]
    fn records_are_classified() {
        let seq = 10 + RING;
        let good = payload(3, 2, seq);
        assert_eq!(classify(pack(2, seq), good, 3, 2, seq), Next::Good);
        assert_eq!(classify(pack(2, seq), good ^ 1, 3, 2, seq), Next::Corrupt);
        assert_eq!(classify(pack(2, 10), 0, 3, 2, seq), Next::Missing);
        assert_eq!(classify(0, 0, 3, 2, seq), Next::Missing);
        assert_eq!(classify(pack(2, seq + RING), 0, 3, 2, seq), Next::Later);
        assert_eq!(classify(pack(3, 1), 0, 3, 2, seq), Next::Later);
        assert_eq!(classify(pack(1, 500), 0, 3, 2, seq), Next::Missing);
    }
}
