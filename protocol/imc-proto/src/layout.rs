//! imcd's MEMORY CHANNEL page layout: which pages it keeps for itself, what
//! each word of them means, and the geometry of lock sets. imcd writes these
//! pages; client libraries read some of them (lock slots, error counts).
//!
//! | pages | contents |
//! |---|---|
//! | [`DIR_PAGE`] 0–7 ([`DIR_PAGES`]) | the region directory: its cluster lock ([`LOCK_SLOTS`] words), then [`ENTRIES`] cluster region descriptors of [`ENTRY_WORDS`] words each, one after the other (an entry may straddle two pages) |
//! | [`ACK_PAGE`] 8–37 ([`ACK_PAGES`]) | coherency acks: word `entry * MAX_NODES + node` = the entry's ctime once `node` receives it |
//! | [`HOST_PAGE`] 38 | host table: row `n` ([`host::ROW`] words) = imcd token, host name, join request, join served, ready |
//! | [`RELAY_PAGE`] 39 | command relay: request mailbox of node `n` at word `n * relay::ROW`, its response at `relay::RESPONSES + n * relay::ROW` |
//! | [`ERRCNT_PAGE`] 40 | error counts: word `n` = node `n`'s adapter error count, as its imcd last published it |
//! | [`ACK_Q_PAGE`] 41 | the ACK page `imc_ckerrcnt` stores to |
//!
//! Pages 0–40 ([`META_PAGES`]) are transmitted with loopback and received
//! by every imcd into one buffer; the relay page raises a notification
//! interrupt. Every page of the directory is received with loopback and
//! the hub orders all writes, so a record that straddles two pages is
//! read and written like one in a single page. Regions get pages from
//! [`DATA_FIRST`] up.
//!
//! The directory's size: a UMP channel between two guests takes two
//! entries, so a job whose every rank talks to every rank on other guests
//! takes about R² (1 − 1/N) entries for R ranks on N guests (`docs/imc.md`,
//! "Limits"): 16 ranks on 4 guests take about 220 with MPI's other
//! regions, within [`ENTRIES`] (478); one page held 56.

/// First page of the region directory.
pub const DIR_PAGE: u64 = 0;
/// Pages of the region directory.
pub const DIR_PAGES: u64 = 8;
/// First of the coherency-ack pages.
pub const ACK_PAGE: u64 = DIR_PAGE + DIR_PAGES;
/// Pages of coherency acks: a word per entry and node.
pub const ACK_PAGES: u64 = ((ENTRIES * MAX_NODES) as u64).div_ceil(PAGE_WORDS as u64);
/// The host table.
pub const HOST_PAGE: u64 = ACK_PAGE + ACK_PAGES;
/// The command relay's mailboxes.
pub const RELAY_PAGE: u64 = HOST_PAGE + 1;
/// Every node's published error count.
pub const ERRCNT_PAGE: u64 = RELAY_PAGE + 1;
/// imcd's own pages received by every node (the ACK page is apart).
pub const META_PAGES: u64 = ERRCNT_PAGE + 1;
/// The ACK page of `imc_ckerrcnt`.
pub const ACK_Q_PAGE: u64 = META_PAGES;
/// First page handed out to regions.
pub const DATA_FIRST: u64 = 48;
/// Nodes imcd keeps rows for (the hub's ports beyond this get no imcd).
pub const MAX_NODES: usize = 64;
/// Slots of a cluster lock (the directory's, and each lock of a set): one
/// per possible node.
pub const LOCK_SLOTS: usize = MAX_NODES;
/// Words of one directory entry: a toggle word and two copies of an
/// 8-word record (key, first page, pages, mode and flags, uid, gid, ctime,
/// hosts).
pub const ENTRY_WORDS: usize = 1 + 2 * 8;
/// Directory entries (regions and lock sets in the cluster): as many as
/// fit in the directory's pages beside the lock
/// (64 + 478 * 17 = 8190 of 8192 words).
pub const ENTRIES: usize = (DIR_PAGES as usize * PAGE_WORDS - LOCK_SLOTS) / ENTRY_WORDS;
/// Key bit that puts spinlock sets in the region directory beside regions
/// (see [`crate::keys`]).
pub const LOCK_KEY: u64 = 1 << 63;
/// imcd's own lock bids (processes bid `pid << 32 | n`, below this).
pub const IMCD_BID_BASE: u64 = 1 << 62;
/// Most locks in one set.
pub const MAX_LOCKS: u32 = 1024;

/// Byte offset of node `node`'s slot of lock `lock` in a lock set's region.
pub const fn lock_slot_offset(lock: u64, node: u64) -> u64 {
    (lock * LOCK_SLOTS as u64 + node) * 8
}

/// Pages a set of `nlocks` locks takes.
pub const fn lock_set_pages(nlocks: u32, page_size: u64) -> u64 {
    (nlocks as u64 * LOCK_SLOTS as u64 * 8).div_ceil(page_size)
}

/// Words of a host-table row.
pub mod host {
    /// The running imcd's token (nonzero, unique per start).
    pub const TOKEN: usize = 0;
    /// First of [`NAME_WORDS`] words of host name (NUL-padded UTF-8).
    pub const NAME: usize = 1;
    /// Words of host name.
    pub const NAME_WORDS: usize = 4;
    /// A newcomer's request to be sent the directory (its token).
    pub const JOIN_REQ: usize = 5;
    /// The join request a running node served.
    pub const JOIN_SERVED: usize = 6;
    /// Nonzero (the token) once this node's imcd serves.
    pub const READY: usize = 7;
    /// Words per row.
    pub const ROW: usize = 8;
}

/// Words of a relay mailbox (request row; the response row is
/// `[SEQ, STATUS]`).
pub mod relay {
    /// Request sequence (nonzero, increasing).
    pub const SEQ: usize = 0;
    /// Destination node.
    pub const DEST: usize = 1;
    /// Service ([`SIGNAL`]).
    pub const SERVICE: usize = 2;
    /// Target process.
    pub const PID: usize = 3;
    /// Signal number.
    pub const SIG: usize = 4;
    /// The sender's uid.
    pub const UID: usize = 5;
    /// A counter a node bumps to wake every node's mapper at once (the
    /// relay page interrupts): a new coherent region, a join request.
    pub const KICK: usize = 7;
    /// Response: the errno (0 = done).
    pub const STATUS: usize = 1;
    /// Words per mailbox row.
    pub const ROW: usize = 8;
    /// First word of the response rows.
    pub const RESPONSES: usize = 512;
    /// Service: deliver a UNIX signal (`imc_kill`).
    pub const SIGNAL: u64 = 1;
}

/// 64-bit words in a MEMORY CHANNEL page (8 KiB).
const PAGE_WORDS: usize = 1024;

/// One region or lock set of imcd's directory, as a copy of the directory
/// pages reads (the valid copy of an entry, by its toggle word).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirEntry {
    /// Its index (the region id).
    pub entry: usize,
    /// The key ([`LOCK_KEY`] set for a lock set).
    pub key: u64,
    /// First MEMORY CHANNEL page.
    pub first_page: u64,
    /// Pages.
    pub pages: u64,
    /// Permission bits.
    pub mode: u32,
    /// Flags (bit 0: coherent).
    pub flags: u32,
    /// Creation time.
    pub ctime: u64,
    /// Nodes that hold it (bit n: node n).
    pub hosts: u64,
}

/// Words of the directory pages ([`DIR_PAGES`] pages).
pub const DIR_WORDS: usize = DIR_PAGES as usize * PAGE_WORDS;

/// Entry `e` of a directory whose words are `words` (at least
/// [`DIR_WORDS`]), if it is in use (held by some node).
pub fn dir_entry(words: &[u64], e: usize) -> Option<DirEntry> {
    if e >= ENTRIES || words.len() < DIR_WORDS {
        return None;
    }
    let at = LOCK_SLOTS + e * ENTRY_WORDS;
    let c = at + 1 + (words[at] & 1) as usize * 8;
    let r = &words[c..c + 8];
    (r[7] != 0).then(|| DirEntry {
        entry: e,
        key: r[0],
        first_page: r[1],
        pages: r[2],
        mode: r[3] as u32,
        flags: (r[3] >> 32) as u32,
        ctime: r[6],
        hosts: r[7],
    })
}

/// The directory entry a word of the directory pages belongs to (None for
/// the lock's slots and past the last entry).
pub fn entry_of_word(word: usize) -> Option<usize> {
    let e = word.checked_sub(LOCK_SLOTS)? / ENTRY_WORDS;
    (e < ENTRIES).then_some(e)
}

/// What imcd keeps at byte `offset` of page `page`, in words a student
/// reads ("directory entry 5, copy 0, hosts"), or None above imcd's pages.
/// The Wireshark dissector (`hub/wireshark/mc.lua`) names fields the same
/// way; a test compares the two.
pub fn describe(page: u64, offset: u64) -> Option<String> {
    let word = (offset / 8) as usize;
    const RECORD: [&str; 8] = ["key", "first page", "pages", "mode and flags", "uid", "gid", "ctime", "hosts"];
    Some(if (DIR_PAGE..DIR_PAGE + DIR_PAGES).contains(&page) {
        let w = (page - DIR_PAGE) as usize * PAGE_WORDS + word;
        if w < LOCK_SLOTS {
            return Some(format!("directory lock, slot of node {w}"));
        }
        let (e, i) = ((w - LOCK_SLOTS) / ENTRY_WORDS, (w - LOCK_SLOTS) % ENTRY_WORDS);
        if e >= ENTRIES {
            return Some("directory, past the last entry".into());
        }
        match i {
            0 => format!("directory entry {e}, toggle word"),
            i => format!("directory entry {e}, copy {}, {}", (i - 1) / 8, RECORD[(i - 1) % 8]),
        }
    } else if (ACK_PAGE..ACK_PAGE + ACK_PAGES).contains(&page) {
        let w = (page - ACK_PAGE) as usize * PAGE_WORDS + word;
        format!("coherency ack of entry {} by node {}", w / MAX_NODES, w % MAX_NODES)
    } else if page == HOST_PAGE {
        const NAMES: [&str; 8] =
            ["imcd token", "host name", "host name", "host name", "host name", "join request", "join served", "ready"];
        format!("host row {}, {}", word / host::ROW, NAMES[word % host::ROW])
    } else if page == RELAY_PAGE {
        const NAMES: [&str; 8] = ["sequence", "destination", "service", "pid", "signal", "uid", "word 6", "kick"];
        if word < relay::RESPONSES {
            format!("relay request of node {}, {}", word / relay::ROW, NAMES[word % relay::ROW])
        } else {
            let (row, i) = ((word - relay::RESPONSES) / relay::ROW, (word - relay::RESPONSES) % relay::ROW);
            let what = match i {
                0 => "sequence".to_string(),
                1 => "status".to_string(),
                i => format!("word {i}"),
            };
            format!("relay response to node {row}, {what}")
        }
    } else if page == ERRCNT_PAGE {
        format!("error count of node {word}")
    } else if page == ACK_Q_PAGE {
        "imc_ckerrcnt's ACK page".into()
    } else if page < DATA_FIRST {
        "imcd's reserved pages".into()
    } else {
        return None;
    })
}

// The rows fit their pages, checked when the crate compiles.
const _: () = assert!(MAX_NODES * host::ROW <= PAGE_WORDS, "host table fits its page");
const _: () = assert!(MAX_NODES * relay::ROW <= relay::RESPONSES, "requests stay below the responses");
const _: () = assert!(relay::RESPONSES + MAX_NODES * relay::ROW <= PAGE_WORDS, "relay fits its page");
const _: () = assert!(ENTRIES * MAX_NODES <= ACK_PAGES as usize * PAGE_WORDS, "acks fit their pages");
const _: () =
    assert!(LOCK_SLOTS + ENTRIES * ENTRY_WORDS <= DIR_PAGES as usize * PAGE_WORDS, "directory fits its pages");
const _: () = assert!(ACK_Q_PAGE >= META_PAGES && ACK_Q_PAGE < DATA_FIRST, "ACK page between imcd's and regions");
const _: () = assert!(ENTRIES == 478 && META_PAGES == 41, "the table in the module header");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_sets_are_whole_pages_of_slots() {
        assert_eq!(lock_set_pages(1, 8192), 1);
        assert_eq!(lock_set_pages(16, 8192), 1);
        assert_eq!(lock_set_pages(17, 8192), 2);
        assert_eq!(lock_slot_offset(1, 3), (64 + 3) * 8);
    }
}
