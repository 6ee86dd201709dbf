//! The MEMORY CHANNEL adapter's register map: BAR layout, register offsets and bits, and the
//! page control table (PCT) entry format.
//!
//! Source: seed 000 "MEMORY CHANNEL Overview" (PCT per page, transmit and
//! receive windows, loopback, ACK, error registers) and `docs/adapter.md`,
//! which is the contract for everything the paper leaves open.
//!
//! One crate so that the device model (`mc-adapter`) and the driver
//! (`guest-driver`) share one definition, like a hardware header file.
//!
//! # BARs
//!
//! | BAR | size | contents |
//! |-----|------|----------|
//! | 0   | 4 KiB, 32-bit memory | control and status registers (this module) |
//! | 2   | 16 bytes × pages, 64-bit memory | page control table |
//! | 4   | the address space (512 MiB default), 64-bit prefetchable | transmit window |

/// PCI vendor id: Digital Equipment Corporation.
pub const VENDOR_ID: u16 = 0x1011;
/// PCI device id: "Memory Channel interface".
pub const DEVICE_ID: u16 = 0x0018;
/// Register BAR.
pub const BAR_REGS: u32 = 0;
/// Page control table BAR.
pub const BAR_PCT: u32 = 2;
/// Transmit window BAR.
pub const BAR_TX: u32 = 4;
/// Size of the register BAR.
pub const REGS_SIZE: u64 = 4096;

/// MEMORY CHANNEL page size (8 KiB, as on the Alpha).
pub const PAGE_SIZE: u64 = 8192;
/// Default address space: 512 MiB.
pub const DEFAULT_ASPACE: u64 = 512 << 20;
/// Smallest address space accepted (the first adapters had 128 MiB; smaller
/// spaces are allowed for tests).
pub const MIN_ASPACE: u64 = 1 << 20;
/// Largest address space accepted: 4 GiB keeps the PCT BAR at 8 MiB.
pub const MAX_ASPACE: u64 = 4 << 30;

/// Register offsets in BAR 0. All registers are 32 bits wide.
pub mod reg {
    /// RO. Identification: `0x4D43_0001` ("MC", register layout revision 1).
    pub const ID: u64 = 0x00;
    /// RO. Bits 0-15: this node's id ([`super::NO_NODE`] while not joined).
    /// Bits 16-31: the hub's ports (0 until the first join, kept while the
    /// link is down). Reset value [`super::NODE_RESET`].
    pub const NODE: u64 = 0x04;
    /// RO. Bit 0: link up.
    pub const LINK: u64 = 0x08;
    /// RO. Page size in bytes (8192).
    pub const PAGE_SIZE: u64 = 0x0C;
    /// RO. Address space size in pages.
    pub const ASPACE_PAGES: u64 = 0x10;
    /// W1C. Error status, see [`super::err`].
    pub const ERR_STATUS: u64 = 0x14;
    /// RO. Errors counted since reset (saturates).
    pub const ERR_COUNT: u64 = 0x18;
    /// RW. Control, see [`super::ctrl`].
    pub const CTRL: u64 = 0x1C;
    /// RO. Bitmap of nodes 0-31 that are up.
    pub const MEMBERS_LO: u64 = 0x20;
    /// RO. Bitmap of nodes 32-63 that are up.
    pub const MEMBERS_HI: u64 = 0x24;
    /// W1C. Interrupt causes, see [`super::int`].
    pub const INT_CAUSE: u64 = 0x28;
    /// RW. Interrupt enables, same bits as `INT_CAUSE`.
    pub const INT_MASK: u64 = 0x2C;
    /// RO, reading pops. Page number of the oldest notification (a receive on
    /// a page with `pct::INT`), or [`super::NOTIFY_EMPTY`].
    pub const NOTIFY_FIFO: u64 = 0x30;
    /// RO. Notifications waiting in the FIFO.
    pub const NOTIFY_COUNT: u64 = 0x34;
    /// RO. Packets sent to the hub (low 32 bits).
    pub const TX_PACKETS: u64 = 0x40;
    /// RO. Packets applied to guest memory (low 32 bits).
    pub const RX_PACKETS: u64 = 0x44;
    /// RO. Packets received for pages not enabled for receive (low 32 bits).
    pub const RX_DROPPED: u64 = 0x48;
    /// RO. Notifications lost because the FIFO was full.
    pub const NOTIFY_LOST: u64 = 0x4C;
    /// RO. Link and membership changes seen since reset.
    pub const LINK_EVENTS: u64 = 0x50;
    /// RO. Low 32 bits of the global sequence number of the last write
    /// delivered to this node (0 before the first); not cleared by a reset.
    pub const LAST_SEQ: u64 = 0x54;
    /// RO. Extensions beyond the original adapter, see [`super::caps`]
    /// (0 on an adapter without any: software for the original register
    /// set never reads it).
    pub const CAPS: u64 = 0x58;
    /// RW. Transmit DMA ring base IOVA, low 32 bits (bits 0-4 read as
    /// zero: the ring is 32-byte aligned). See [`super::dma`].
    pub const DMA_RING_LO: u64 = 0x60;
    /// RW. Transmit DMA ring base IOVA, high 32 bits.
    pub const DMA_RING_HI: u64 = 0x64;
    /// RW. Descriptors in the ring (a power of two up to
    /// [`super::dma::MAX_RING`]; 0 turns the engine off). Writing it
    /// (re)starts the ring: `DMA_HEAD` and `DMA_TAIL` become 0.
    pub const DMA_RING_SIZE: u64 = 0x68;
    /// RW, doorbell. Free-running index one past the last descriptor posted.
    pub const DMA_TAIL: u64 = 0x6C;
    /// RO. Free-running index of the next descriptor the engine retires.
    pub const DMA_HEAD: u64 = 0x70;
    /// RO. Bit 31 busy; bits 0-7 the last error code ([`super::dma::status`]).
    pub const DMA_STATUS: u64 = 0x74;
    /// RO. Descriptors retired (status written back), low 32 bits.
    pub const DMA_DESCS: u64 = 0x78;
    /// RO. Bytes the engine sent to the hub, low 32 bits.
    pub const DMA_BYTES: u64 = 0x7C;
    /// Start of the MSI-X table (emulated by QEMU; one vector).
    pub const MSIX_TABLE: u64 = 0x800;
    /// Start of the MSI-X pending bit array.
    pub const MSIX_PBA: u64 = 0xC00;
}

/// The node id in a NODE register value, or `None` while the adapter is
/// not joined ([`NO_NODE`]; the port count stays in bits 16–31).
pub const fn node_id(node_reg: u32) -> Option<u16> {
    let n = node_reg & 0xFFFF;
    if n == NO_NODE {
        None
    } else {
        Some(n as u16)
    }
}

/// The members bitmap (bit `n` = node `n` is up) from MEMBERS_LO and MEMBERS_HI.
pub const fn members_bitmap(lo: u32, hi: u32) -> u64 {
    (hi as u64) << 32 | lo as u64
}

/// The node ids that are up, ascending, from MEMBERS_LO and MEMBERS_HI.
pub fn members(lo: u32, hi: u32) -> impl Iterator<Item = usize> {
    let bits = members_bitmap(lo, hi);
    (0..64).filter(move |n| bits & (1 << n) != 0)
}

/// Value `NOTIFY_FIFO` reads when empty.
pub const NOTIFY_EMPTY: u32 = 0xFFFF_FFFF;
/// Depth of the notification FIFO.
pub const NOTIFY_DEPTH: usize = 256;
/// MSI-X vectors (all causes share vector 0).
pub const MSIX_VECTORS: u32 = 1;

/// Bits of `INT_CAUSE` and `INT_MASK`.
pub mod int {
    /// A write arrived on a page with `pct::INT` (its page is in `NOTIFY_FIFO`).
    pub const NOTIFY: u32 = 1 << 0;
    /// The link went up or down, or a node joined or left.
    pub const LINK: u32 = 1 << 1;
    /// An error bit was set in `ERR_STATUS`.
    pub const ERROR: u32 = 1 << 2;
    /// A transmit DMA descriptor with [`super::dma::flags::INT`] was retired.
    pub const DMA: u32 = 1 << 3;
    /// All defined bits.
    pub const ALL: u32 = 0xF;
    /// Every bit with its short name, as tools print them.
    pub const NAMES: [(u32, &str); 4] = [(NOTIFY, "notify"), (LINK, "link"), (ERROR, "error"), (DMA, "dma")];
}

/// Reset value of `ID`.
pub const ID_VALUE: u32 = 0x4D43_0001;

/// Node id field of `NODE` (bits 0-15) while the adapter is not joined.
pub const NO_NODE: u32 = 0xFFFF;
/// `NODE` before the first join: no node id, no ports known yet.
pub const NODE_RESET: u32 = NO_NODE;

/// Bits of `ERR_STATUS` (write 1 to clear).
pub mod err {
    /// A store hit a page not enabled for transmit; it was dropped.
    pub const TX_DISABLED: u32 = 1 << 0;
    /// The transmit window was read (master abort: all ones returned).
    pub const TX_READ: u32 = 1 << 1;
    /// A received write's DMA address is outside mapped guest memory; not applied.
    pub const RX_DMA: u32 = 1 << 2;
    /// The link to the hub is down.
    pub const LINK_DOWN: u32 = 1 << 3;
    /// A received packet failed its CRC; not applied.
    pub const CRC: u32 = 1 << 4;
    /// A received packet's address is outside the address space.
    pub const RX_RANGE: u32 = 1 << 5;
    /// A point-to-point page names a destination outside the hub's ports; the store was dropped.
    pub const TX_DEST: u32 = 1 << 6;
    /// A frame from the hub was lost (the link sequence skipped), or the
    /// global order went backwards.
    pub const SEQ_GAP: u32 = 1 << 7;
    /// A packet was dropped at the sender because the link was down.
    pub const TX_LINK_DOWN: u32 = 1 << 8;
    /// A transmit DMA descriptor or doorbell failed (the code is in the
    /// descriptor's status and in `DMA_STATUS`).
    pub const DMA: u32 = 1 << 9;
    /// All defined bits.
    pub const ALL: u32 = 0x3FF;
    /// Every bit with its short name, as tools print them.
    pub const NAMES: [(u32, &str); 10] = [
        (TX_DISABLED, "tx-disabled"),
        (TX_READ, "tx-read"),
        (RX_DMA, "rx-dma"),
        (LINK_DOWN, "link-down"),
        (CRC, "crc"),
        (RX_RANGE, "rx-range"),
        (TX_DEST, "tx-dest"),
        (SEQ_GAP, "seq-gap"),
        (TX_LINK_DOWN, "tx-link-down"),
        (DMA, "dma"),
    ];
}

/// Byte an ACK reply carries: the replying node's `ERR_STATUS` bits 0-6
/// with this bit set, so "answered, no error" reads `0x80` and "no answer" 0.
/// Error bits 7 and up do not show in an answer (ERR_COUNT counts them).
pub const ACK_VALID: u8 = 0x80;

/// Bits of `CTRL`.
pub mod ctrl {
    /// Write 1: reset the adapter (self-clearing).
    pub const RESET: u32 = 1 << 0;
    /// Every bit with its short name, as tools print them.
    pub const NAMES: [(u32, &str); 1] = [(RESET, "reset")];
}

/// Bits of `CAPS`: extensions beyond the original adapter.
pub mod caps {
    /// The transmit DMA engine ([`super::dma`], registers `DMA_*`).
    pub const TX_DMA: u32 = 1 << 0;
    /// All defined bits.
    pub const ALL: u32 = TX_DMA;
    /// Every bit with its short name, as tools print them.
    pub const NAMES: [(u32, &str); 1] = [(TX_DMA, "tx-dma")];
}

/// The transmit DMA engine (an extension; [`caps::TX_DMA`]): a ring of
/// 32-byte descriptors in guest memory, read through the adapter's DMA maps.
///
/// ```text
///  0                8                16       20       24        28       32
/// +----------------+----------------+--------+--------+---------+--------+
/// | source IOVA    | MC address     | length | flags  | bytes   | status |
/// +----------------+----------------+--------+--------+---------+--------+
///   written by the driver                              written back by the engine
/// ```
///
/// The driver writes a descriptor with `status` 0, then rings the doorbell
/// (`DMA_TAIL`). The engine sends the bytes as page-sized write packets
/// and writes `bytes` (sent) and `status` ([`DONE`] with a [`status`]
/// code) back as one 8-byte store.
pub mod dma {
    /// Bytes per descriptor (and the ring's alignment).
    pub const DESC_SIZE: u64 = 32;
    /// Most descriptors in a ring.
    pub const MAX_RING: u32 = 4096;
    /// Descriptor field offsets.
    pub const SRC: u64 = 0;
    /// MEMORY CHANNEL (global) address of the first byte.
    pub const DEST: u64 = 8;
    /// Length in bytes (1 to 2^32-1).
    pub const LEN: u64 = 16;
    /// [`flags`] bits.
    pub const FLAGS: u64 = 20;
    /// Bytes sent, written back.
    pub const BYTES: u64 = 24;
    /// Status, written back (with `BYTES`, as one 8-byte store).
    pub const STATUS: u64 = 28;
    /// Set in a written-back status: the descriptor is retired.
    pub const DONE: u32 = 1 << 31;
    /// Bit 31 of `DMA_STATUS`: the engine has descriptors to retire.
    pub const BUSY: u32 = 1 << 31;

    /// Descriptor flags.
    pub mod flags {
        /// Raise the DMA interrupt cause when the descriptor is retired.
        pub const INT: u32 = 1 << 0;
        /// All defined bits (others make the descriptor BAD_DESC).
        pub const ALL: u32 = INT;
    }

    /// Status codes: bits 0-7 of a written-back status and of `DMA_STATUS`.
    pub mod status {
        /// Sent whole.
        pub const OK: u32 = 0;
        /// The source is not (wholly) in readable mapped guest memory.
        pub const SRC_UNMAPPED: u32 = 1;
        /// The MEMORY CHANNEL range runs past the address space.
        pub const RANGE: u32 = 2;
        /// A page of the range has no TX in the PCT.
        pub const TX_DISABLED: u32 = 3;
        /// A page is point-to-point to a node outside the hub's ports.
        pub const TX_DEST: u32 = 4;
        /// A page is an ACK page (not for DMA).
        pub const ACK_PAGE: u32 = 5;
        /// The link went down: the rest was not sent.
        pub const LINK_DOWN: u32 = 6;
        /// A reset or the client's disconnect stopped the transfer.
        pub const ABORTED: u32 = 7;
        /// Zero length or undefined flags.
        pub const BAD_DESC: u32 = 8;
        /// Bus mastering is off: the adapter cannot read guest memory.
        pub const NO_BUS_MASTER: u32 = 9;
        /// `DMA_STATUS` only: the ring is not set up, or a descriptor could
        /// not be read or written back (ring outside mapped guest memory).
        /// The posted descriptors are dropped.
        pub const RING: u32 = 10;
        /// `DMA_STATUS` only: a doorbell posted more than the ring holds or
        /// moved backwards; ignored.
        pub const OVERFLOW: u32 = 11;
        /// Every code with its short name, as tools print them.
        pub const NAMES: [(u32, &str); 12] = [
            (OK, "ok"),
            (SRC_UNMAPPED, "src-unmapped"),
            (RANGE, "range"),
            (TX_DISABLED, "tx-disabled"),
            (TX_DEST, "tx-dest"),
            (ACK_PAGE, "ack-page"),
            (LINK_DOWN, "link-down"),
            (ABORTED, "aborted"),
            (BAD_DESC, "bad-desc"),
            (NO_BUS_MASTER, "no-bus-master"),
            (RING, "ring"),
            (OVERFLOW, "overflow"),
        ];

        /// The short name of status `code` ("unknown" for a code not in [`NAMES`]).
        pub fn name(code: u32) -> &'static str {
            NAMES.iter().find(|(c, _)| *c == code).map_or("unknown", |(_, n)| n)
        }
    }
}

/// Page control table entry: 16 bytes per page at `page * PCT_ENTRY` in BAR 2.
///
/// ```text
///  63            32 31       16 15        6   5   4   3   2   1   0
/// +----------------+-----------+-----------+---+---+---+---+---+---+
/// | reserved       | dest node | reserved  |P2P|ACK|INT|LB |RX |TX |   word 0 (+0)
/// +----------------+-----------+-----------+---+---+---+---+---+---+
/// | receive DMA address (IOVA of this page's receive buffer)       |   word 1 (+8)
/// +----------------------------------------------------------------+
/// ```
pub mod pct {
    /// Bytes per entry.
    pub const ENTRY: u64 = 16;
    /// Transmit enable: stores to this page are sent.
    pub const TX: u64 = 1 << 0;
    /// Receive enable: writes to this page are applied to guest memory.
    pub const RX: u64 = 1 << 1;
    /// Loopback: this node's own writes to the page come back through the hub.
    pub const LOOPBACK: u64 = 1 << 2;
    /// Interrupt on receive (the notification channel).
    pub const INT: u64 = 1 << 3;
    /// ACK page: a store asks every receiving node for its error status,
    /// which comes back into byte `node` of this page's receive buffer.
    pub const ACK: u64 = 1 << 4;
    /// Point-to-point: send to `dest` only instead of broadcasting.
    pub const P2P: u64 = 1 << 5;
    /// Shift of the destination node field.
    pub const DEST_SHIFT: u32 = 16;
    /// Mask of the destination node field (after shifting).
    pub const DEST_MASK: u64 = 0xFFFF;
    /// Bits of word 0 that hold state; the rest read as zero.
    pub const WORD0_MASK: u64 = 0x3F | (DEST_MASK << DEST_SHIFT);
    /// Bits of word 1 (the receive address) that hold state: bits 0-2 are
    /// reserved and read as zero, so a receive buffer is 8-byte aligned.
    pub const WORD1_MASK: u64 = !0x7;
    /// Every flag bit of word 0 with its short name, as tools print them.
    pub const NAMES: [(u64, &str); 6] =
        [(TX, "tx"), (RX, "rx"), (LOOPBACK, "loopback"), (INT, "int"), (ACK, "ack"), (P2P, "p2p")];
}

pub mod decode;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_and_members_decode() {
        assert_eq!(node_id(8 << 16 | NO_NODE), None);
        assert_eq!(node_id(8 << 16 | 3), Some(3));
        assert_eq!(members_bitmap(0b101, 1), 1 << 32 | 0b101);
        assert_eq!(members(0b101, 1).collect::<Vec<_>>(), vec![0, 2, 32]);
        assert_eq!(members(0, 0).count(), 0);
        assert_eq!(err::NAMES.iter().fold(0, |a, (b, _)| a | b), err::ALL, "every error bit has a name");
    }
}
