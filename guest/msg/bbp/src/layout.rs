//! Where everything lives on the billboard: the shares of the processes
//! and, inside a share, the header, the control partition and the data
//! partition (docs/bbp.md, "Memory layout"). Offsets are in 8-byte words
//! from the start of the billboard. Pure arithmetic: no memory is touched
//! here.
//!
//! ```text
//! billboard:  | share 0 | share 1 | ... | share N-1 |      (N = nprocs)
//!
//! share p (written only by process p, read by every process):
//!   word 0            HEADER   magic << 32 | nprocs << 16 | p
//!   word 1            WHO      node << 32 | pid (0 until p started)
//!   word 2            STATE    1 running, 2 finalized
//!   words 3 ..        MSG[r]   one per receiver r: bit b toggles when p
//!                              posts its buffer b to r
//!   then              ACK[s]   one per sender s: bit b toggles when p has
//!                              read s's buffer b
//!   then              DESC[b]  4 words per buffer: offset | length << 32,
//!                              seq << 8 | kind, receiver mask, check
//!   then              DATA     the data partition (message buffers)
//! ```

/// The most processes a billboard holds (a receiver mask is one word).
pub const MAX_PROCS: usize = 64;
/// Buffers per process (a MESSAGE or ACK word has one bit per buffer).
pub const BUFFERS: usize = 64;
/// `magic` in a header word.
pub const MAGIC: u64 = 0x0BB9;
/// Words of the header.
pub const HEADER_WORDS: usize = 3;
/// Words of one buffer descriptor.
pub const DESC_WORDS: usize = 4;
/// STATE: the process runs.
pub const RUNNING: u64 = 1;
/// STATE: the process called `bbp_finalize`.
pub const FINALIZED: u64 = 2;
/// The data partition of a share on MEMORY CHANNEL by default: 56 KiB,
/// so that a share of up to 64 processes is 64 KiB (8 MEMORY CHANNEL pages).
pub const DEFAULT_DATA_BYTES: usize = 56 << 10;
/// The largest data partition asked for (a billboard of 64 such shares is
/// 64 MiB, as much region as a node's receive memory should give one job).
pub const MAX_DATA_BYTES: usize = 1 << 20;

/// The shape of one billboard: how many processes, and the bytes of a
/// data partition (a multiple of 8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Processes.
    pub nprocs: usize,
    /// Bytes of each data partition.
    pub data_bytes: usize,
}

impl Geometry {
    /// Words of the control partition (header, flags, descriptors).
    pub fn control_words(&self) -> usize {
        HEADER_WORDS + 2 * self.nprocs + DESC_WORDS * BUFFERS
    }

    /// Words of one share, rounded up to a 64-byte line.
    pub fn share_words(&self) -> usize {
        (self.control_words() + self.data_bytes / 8).next_multiple_of(8)
    }

    /// Words of the whole billboard.
    pub fn words(&self) -> usize {
        self.nprocs * self.share_words()
    }

    /// Bytes of the whole billboard.
    pub fn bytes(&self) -> usize {
        self.words() * 8
    }

    /// First word of `p`'s share.
    pub fn share(&self, p: usize) -> usize {
        p * self.share_words()
    }

    /// `p`'s header word.
    pub fn header(&self, p: usize) -> usize {
        self.share(p)
    }

    /// `p`'s WHO word.
    pub fn who(&self, p: usize) -> usize {
        self.share(p) + 1
    }

    /// `p`'s STATE word.
    pub fn state(&self, p: usize) -> usize {
        self.share(p) + 2
    }

    /// The MESSAGE word sender `s` keeps for receiver `r`.
    pub fn msg(&self, s: usize, r: usize) -> usize {
        self.share(s) + HEADER_WORDS + r
    }

    /// The ACK word receiver `r` keeps for sender `s`.
    pub fn ack(&self, r: usize, s: usize) -> usize {
        self.share(r) + HEADER_WORDS + self.nprocs + s
    }

    /// First word of the descriptor of `s`'s buffer `b`.
    pub fn desc(&self, s: usize, b: usize) -> usize {
        self.share(s) + HEADER_WORDS + 2 * self.nprocs + DESC_WORDS * b
    }

    /// First word of `s`'s data partition.
    pub fn data(&self, s: usize) -> usize {
        self.share(s) + self.control_words()
    }

    /// The header word of process `p`.
    pub fn header_word(&self, p: usize) -> u64 {
        MAGIC << 32 | (self.nprocs as u64) << 16 | p as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_word_of_a_share_has_one_purpose_and_shares_do_not_overlap() {
        let g = Geometry { nprocs: 5, data_bytes: 1024 };
        let mut owner = vec![None; g.words()];
        let mut claim = |w: usize, who: usize, what: &str| {
            assert!(owner[w].is_none(), "word {w} ({what}) claimed twice");
            owner[w] = Some(who);
        };
        for p in 0..g.nprocs {
            claim(g.header(p), p, "header");
            claim(g.who(p), p, "who");
            claim(g.state(p), p, "state");
            for r in 0..g.nprocs {
                claim(g.msg(p, r), p, "msg");
                claim(g.ack(p, r), p, "ack");
            }
            for b in 0..BUFFERS {
                for k in 0..DESC_WORDS {
                    claim(g.desc(p, b) + k, p, "desc");
                }
            }
            for k in 0..g.data_bytes / 8 {
                claim(g.data(p) + k, p, "data");
            }
        }
        // Each share's words are its owner's, and only padding is unclaimed.
        for (w, o) in owner.iter().enumerate() {
            let p = w / g.share_words();
            assert!(o.is_none_or(|o| o == p), "word {w} in share {p} belongs to {o:?}");
        }
        assert!(owner.iter().filter(|o| o.is_none()).count() < 8 * g.nprocs);
    }

    #[test]
    fn the_default_share_of_64_processes_is_64_kib() {
        let g = Geometry { nprocs: MAX_PROCS, data_bytes: DEFAULT_DATA_BYTES };
        assert!(g.share_words() * 8 <= 64 << 10, "{} bytes", g.share_words() * 8);
    }
}
