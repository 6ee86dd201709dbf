//! The one registry of region-key namespaces. A region key is 64 bits; the
//! top byte says whose it is, so the layers on MEMORY CHANNEL (user
//! programs, UMP, and those to come) can never pick the same key by chance.
//!
//! | top byte | namespace | rest of the key |
//! |---|---|---|
//! | `0x00` | [`Namespace::User`]: keys programs pass to `imc_asalloc` | any 56 bits |
//! | `0x48` | [`Namespace::Bbp`]: a job's Billboard Protocol region | the job id |
//! | `0x50` | [`Namespace::UmpChannel`]: one half of a UMP channel over MEMORY CHANNEL | hash of the endpoint pair, low bit = side |
//! | `0x58` | [`Namespace::UmpListen`]: a UMP endpoint's listen area | the handle's low 56 bits |
//! | `0x60` | [`Namespace::UmpOutbuf`]: a process's multicast outbuf | node << 32 \| pid |
//! | `0x68` | [`Namespace::MpiBoard`]: an MPI job's billboard | the job id |
//! | `0x70` | [`Namespace::MpiLanding`]: an MPI rank's landing memory (zero copy) | job << 32 \| rank |
//! | `0x7C` | [`Namespace::DdWire`]: one direction of a Direct Deposit connection | [`dd_wire`]: from << 48 \| to << 40 \| tag |
//! | bit 63 | lock sets: imcd files `imc_lkalloc` keys under `key \| LOCK_KEY` | the user's key |
//!
//! imcd refuses user keys with bit 63 set. Keys from 2^56 up with bit 63
//! clear and an unregistered top byte are free for future layers: add them
//! here.

use crate::layout::LOCK_KEY;

/// Bits below the namespace byte.
pub const PAYLOAD_BITS: u32 = 56;
/// Mask of the payload.
pub const PAYLOAD_MASK: u64 = (1 << PAYLOAD_BITS) - 1;

/// Who a region key belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Namespace {
    /// Keys programs choose (`imc_asalloc`, `imc_lkalloc`).
    User,
    /// A UMP channel half.
    UmpChannel,
    /// A UMP endpoint's listen area.
    UmpListen,
    /// A UMP process's multicast outbuf.
    UmpOutbuf,
    /// An MPI job's billboard (its small collectives).
    MpiBoard,
    /// An MPI rank's landing memory: received into its DMA source area,
    /// the target of other ranks' zero-copy transfers.
    MpiLanding,
    /// One direction of a Direct Deposit connection (`guest/msg/dd`): only
    /// node `from` may transmit to it, only point-to-point to node `to`,
    /// and only one process there (imcd enforces it; see [`dd_wire`]).
    DdWire,
    /// A job's billboard for BBP (guest/msg/bbp).
    Bbp,
}

impl Namespace {
    /// Every namespace, for checks.
    pub const ALL: [Namespace; 8] = [
        Namespace::User,
        Namespace::UmpChannel,
        Namespace::UmpListen,
        Namespace::UmpOutbuf,
        Namespace::MpiBoard,
        Namespace::MpiLanding,
        Namespace::DdWire,
        Namespace::Bbp,
    ];

    /// The top byte of this namespace's keys.
    pub const fn tag(self) -> u8 {
        match self {
            Namespace::User => 0x00,
            Namespace::UmpChannel => 0x50,
            Namespace::UmpListen => 0x58,
            Namespace::UmpOutbuf => 0x60,
            Namespace::MpiBoard => 0x68,
            Namespace::MpiLanding => 0x70,
            Namespace::DdWire => 0x7C,
            Namespace::Bbp => 0x48,
        }
    }

    /// The key of `payload` (its low 56 bits) in this namespace.
    pub const fn key(self, payload: u64) -> u64 {
        (self.tag() as u64) << PAYLOAD_BITS | (payload & PAYLOAD_MASK)
    }

    /// The namespace `key` belongs to, if it is a registered one (lock-set
    /// keys answer for the key under the lock bit).
    pub fn of(key: u64) -> Option<Namespace> {
        let tag = ((key & !LOCK_KEY) >> PAYLOAD_BITS) as u8;
        Namespace::ALL.into_iter().find(|n| n.tag() == tag)
    }
}

/// Bits of a [`dd_wire`] key's tag.
pub const DD_TAG_BITS: u32 = 40;

/// The key of one direction of a Direct Deposit connection: written only
/// by node `from`, point-to-point to node `to`; `tag` (its low
/// [`DD_TAG_BITS`] bits) tells the connections between two nodes apart.
pub const fn dd_wire(from: u8, to: u8, tag: u64) -> u64 {
    Namespace::DdWire.key((from as u64) << 48 | (to as u64) << DD_TAG_BITS | (tag & ((1 << DD_TAG_BITS) - 1)))
}

/// The (from, to) nodes of a [`dd_wire`] key, or None for another key.
pub fn dd_wire_nodes(key: u64) -> Option<(u8, u8)> {
    (key & LOCK_KEY == 0 && Namespace::of(key) == Some(Namespace::DdWire))
        .then_some(((key >> 48) as u8, (key >> DD_TAG_BITS) as u8))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_are_disjoint_and_clear_of_the_lock_bit() {
        for a in Namespace::ALL {
            assert_eq!(a.key(u64::MAX) & LOCK_KEY, 0, "{a:?} reaches the lock bit");
            assert_eq!(Namespace::of(a.key(0)), Some(a));
            assert_eq!(Namespace::of(a.key(u64::MAX)), Some(a));
            for b in Namespace::ALL.into_iter().filter(|b| *b != a) {
                let (a0, a1) = (a.key(0), a.key(u64::MAX));
                let (b0, b1) = (b.key(0), b.key(u64::MAX));
                assert!(a1 < b0 || b1 < a0, "{a:?} [{a0:#x}, {a1:#x}] overlaps {b:?} [{b0:#x}, {b1:#x}]");
            }
        }
    }

    #[test]
    fn dd_wire_keys_name_their_nodes() {
        let k = dd_wire(3, 1, 0xAB_CDEF_0123);
        assert_eq!(Namespace::of(k), Some(Namespace::DdWire));
        assert_eq!(dd_wire_nodes(k), Some((3, 1)));
        assert_eq!(dd_wire_nodes(dd_wire(63, 0, u64::MAX)), Some((63, 0)));
        assert_ne!(dd_wire(3, 1, 1), dd_wire(1, 3, 1));
        assert_eq!(dd_wire_nodes(55), None);
        assert_eq!(dd_wire_nodes(k | LOCK_KEY), None, "a lock set is not a connection");
    }

    #[test]
    fn small_user_keys_stay_user_keys() {
        assert_eq!(Namespace::of(55), Some(Namespace::User));
        assert_eq!(Namespace::of(55 | LOCK_KEY), Some(Namespace::User));
        assert_eq!(Namespace::of(0x7AB1_E200), Some(Namespace::User));
        assert_eq!(Namespace::of(0x7800_0000_0000_0000), None);
    }
}
