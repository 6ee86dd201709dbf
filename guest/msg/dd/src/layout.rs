//! The memory layout of a Direct Deposit connection (`docs/dd.md`,
//! "Memory layout"): three MEMORY CHANNEL regions per connection, each a
//! [`imc_proto::keys::dd_wire`] key, so imcd lets only the right node and
//! process transmit to it, point-to-point.
//!
//! ```text
//! notes  (sender -> receiver, 1 page, INT pages the receiver watches)
//!        NOTES (255) notes of 32 bytes, note s (from 1) in slot (s - 1) % NOTES;
//!        the last 32 bytes: word 0 = the last sequence number posted (HEAD)
//! buffer (sender -> receiver, the reserved receive buffer, whole pages)
//!        bytes the sender places at offsets it chooses
//! back   (receiver -> sender, 1 page)
//!        word 0: the receiver has released every note up to this sequence
//! ```
//!
//! One note, four little-endian words; word 3 is stored last and is the
//! valid flag (it holds the note's sequence number, so a slot that still
//! holds the previous lap's note is not valid):
//!
//! ```text
//!  63                             32 31                              0
//! +---------------------------------+---------------------------------+
//! | length in bytes                 | offset in the buffer            |  word 0
//! | flags (bit 0: sent by DMA)      | CRC-32 ([`crc`])                |  word 1
//! | reserved (not stored, ignored)                                    |  word 2
//! | connection id                   | sequence number (low 32 bits)   |  word 3
//! +---------------------------------+---------------------------------+
//! ```
//!
//! Owns the constants and the note's encoding; no I/O.

use imc_proto::keys::dd_wire;
use regs::PAGE_SIZE;

/// Bytes of one note.
pub const NOTE_BYTES: usize = 32;
/// Notes in a connection's note ring (one 8 KiB page, less the head).
pub const NOTES: u64 = PAGE_SIZE / NOTE_BYTES as u64 - 1;
/// Byte offset in the notes page of the head: the last sequence number
/// posted, stored after each note, so a receiver that sees it beyond a
/// note it never saw knows that note was lost.
pub const HEAD: usize = NOTES as usize * NOTE_BYTES;
/// Offsets in the buffer are multiples of this: MEMORY CHANNEL's transmit
/// window takes whole 8-byte stores only, so a message's last word is
/// padded and the bytes up to the next multiple of 8 belong to it.
pub const ALIGN: u64 = 8;
/// Largest receive buffer of one connection (imcd's regions are carved
/// from a 512 MiB space shared by the whole cluster).
pub const MAX_BUFFER: u64 = 64 << 20;
/// Largest message: the note's length field.
pub const MAX_MESSAGE: u64 = u32::MAX as u64;
/// Note flag: the bytes went by the transmit DMA engine.
pub const FLAG_DMA: u32 = 1;
/// Byte offset in the back page of the released sequence.
pub const BACK_RELEASED: usize = 0;

/// The three regions of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The note ring (sender to receiver).
    Notes = 0,
    /// The receive buffer (sender to receiver).
    Buffer = 1,
    /// The release word (receiver to sender).
    Back = 2,
}

/// Bits of a connection tag (the rest of a [`dd_wire`] key's tag holds
/// the [`Part`]).
pub const TAG_BITS: u32 = 36;

/// The region key of `part` of connection `tag` from node `sender` to
/// node `receiver`.
pub fn key(sender: u8, receiver: u8, tag: u64, part: Part) -> u64 {
    let t = (tag & ((1 << TAG_BITS) - 1)) << 2 | part as u64;
    match part {
        Part::Notes | Part::Buffer => dd_wire(sender, receiver, t),
        Part::Back => dd_wire(receiver, sender, t),
    }
}

/// One note: what arrived, where.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Note {
    /// The connection it arrived on.
    pub conn: u32,
    /// Its sequence number on that connection (from 1).
    pub seq: u64,
    /// Offset of its bytes in the connection's buffer.
    pub offset: u32,
    /// Bytes.
    pub len: u32,
    /// CRC-32 of the bytes.
    pub crc: u32,
    /// [`FLAG_DMA`].
    pub flags: u32,
}

impl Note {
    /// The four words, word 3 (the valid flag) last.
    pub fn words(&self) -> [u64; 4] {
        [
            self.offset as u64 | (self.len as u64) << 32,
            self.crc as u64 | (self.flags as u64) << 32,
            0,
            (self.seq as u32) as u64 | (self.conn as u64) << 32,
        ]
    }

    /// The note in `w` if it is note `seq` (low 32 bits) of a connection;
    /// None while the slot still holds something else.
    pub fn parse(w: [u64; 4], seq: u64) -> Option<Note> {
        (w[3] as u32 == seq as u32).then_some(Note {
            conn: (w[3] >> 32) as u32,
            seq,
            offset: w[0] as u32,
            len: (w[0] >> 32) as u32,
            crc: w[1] as u32,
            flags: (w[1] >> 32) as u32,
        })
    }

    /// Byte offset of note `seq`'s slot in the note ring.
    pub fn slot(seq: u64) -> usize {
        ((seq - 1) % NOTES) as usize * NOTE_BYTES
    }
}

/// The CRC-32 a note carries: of the message's bytes, then its offset,
/// length, sequence number and connection, so a note whose first words
/// are a previous lap's (a store lost on the way) does not check either.
pub fn crc(data: &[u8], offset: u32, seq: u64, conn: u32) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(data);
    h.update(&offset.to_le_bytes());
    h.update(&(data.len() as u32).to_le_bytes());
    h.update(&seq.to_le_bytes());
    h.update(&conn.to_le_bytes());
    h.finalize()
}

/// Bytes a message of `len` bytes occupies (padded to [`ALIGN`]).
pub fn padded(len: u64) -> u64 {
    len.next_multiple_of(ALIGN)
}

#[cfg(test)]
mod tests {
    use super::*;
    use imc_proto::keys::dd_wire_nodes;

    #[test]
    fn notes_round_trip_and_a_stale_slot_is_not_valid() {
        let n = Note { conn: 7, seq: NOTES + 3, offset: 4096, len: 13, crc: 0xDEAD_BEEF, flags: FLAG_DMA };
        assert_eq!(Note::parse(n.words(), n.seq), Some(n));
        assert_eq!(Note::parse(n.words(), 3), None, "the previous lap's note in the same slot");
        assert_eq!(Note::slot(n.seq), Note::slot(3));
        assert_eq!(Note::slot(1), 0);
        assert_eq!(Note::slot(NOTES), (NOTES as usize - 1) * NOTE_BYTES);
        assert_eq!(Note::parse([0; 4], 1), None, "an empty ring holds no note");
    }

    #[test]
    fn the_parts_of_a_connection_have_their_own_keys_and_directions() {
        let ks = [Part::Notes, Part::Buffer, Part::Back].map(|p| key(2, 5, 9, p));
        assert!(ks[0] != ks[1] && ks[1] != ks[2] && ks[0] != ks[2]);
        assert_eq!(dd_wire_nodes(ks[0]), Some((2, 5)));
        assert_eq!(dd_wire_nodes(ks[1]), Some((2, 5)));
        assert_eq!(dd_wire_nodes(ks[2]), Some((5, 2)), "releases go back to the sender");
        assert_ne!(key(2, 5, 9, Part::Notes), key(2, 5, 10, Part::Notes));
    }
}
