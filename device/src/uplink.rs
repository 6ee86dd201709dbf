//! The adapter's side of the cable, whatever is at the other end.
//!
//! An adapter hands every write packet it builds to an [`Uplink`]. Two kinds
//! exist:
//! - a local port of a hub in the same process (`hub::local`): the write
//!   is numbered and applied to every local receiver's guest memory by the
//!   calling thread (the guest's vfio-user thread), one hop in all;
//! - a link to a hub in another process ([`crate::remote::RemoteLink`]),
//!   over a Unix socket or TCP.
//!
//! The receive side is the other direction, a [`Downlink`]: whoever
//! delivers ordered writes (a hub's ordering step for a local port, a link's
//! receive thread) hands them to the adapter through it. The two traits are
//! the whole port API between a hub and an adapter. Nothing here does I/O;
//! this module only names the contract.

use thiserror::Error;

/// One write packet leaving the adapter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WritePacket<'a> {
    /// Destination node, or `link::BROADCAST`.
    pub dest: u16,
    /// `link::FLAG_*` bits.
    pub flags: u16,
    /// Global MEMORY CHANNEL address.
    pub addr: u64,
    /// The bytes (1 to `link::MAX_DATA`, inside one page).
    pub data: &'a [u8],
}

/// Why a write could not leave.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum UplinkError {
    /// The link is down: the write is lost, as on an unplugged cable.
    #[error("link to the hub is down")]
    Down,
}

/// Where an adapter's writes go.
pub trait Uplink: Send + Sync {
    /// Puts one write into the global order, or queues it for the link.
    /// Fails only when the link is down (the write is then lost).
    fn send(&self, w: &WritePacket<'_>) -> Result<(), UplinkError>;
    /// The adapter is idle: whatever was queued goes out now.
    fn flush(&self) {}
}

/// The receiving side of an adapter's cable: what a deliverer may do to it.
/// Calls come in the global order, from one deliverer at a time.
pub trait Downlink: Send + Sync {
    /// Applies one ordered write. A store to an ACK page is not applied: the
    /// answer is returned, for the deliverer to put into the global order as
    /// a write of this node.
    fn deliver(&self, seq: u64, src: u16, flags: u16, addr: u64, data: &[u8]) -> Option<AckReply>;
    /// A frame for this adapter failed its CRC on the way: counted by the
    /// adapter, never applied.
    fn bad_crc(&self);
    /// Node `node` joined (`up`) or left, at `seq` in the global order.
    fn member(&self, seq: u64, node: u16, up: bool);
    /// The link came up (first join or rejoin).
    fn link_up(&self, info: &LinkInfo);
    /// The link went down, for `reason`.
    fn link_down(&self, reason: &str);
}

/// The uplink of an adapter that never joined a hub: every write is lost.
pub struct Unplugged;

impl Uplink for Unplugged {
    fn send(&self, _: &WritePacket<'_>) -> Result<(), UplinkError> {
        Err(UplinkError::Down)
    }
}

/// What a node learns when its link comes up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkInfo {
    /// Its node id.
    pub node: u16,
    /// Ports on the hub.
    pub max_nodes: u16,
    /// Nodes up now (this one included).
    pub members: Vec<u16>,
    /// Sequence number of the next ordered event.
    pub next_seq: u64,
}

/// The answer an adapter gives to an ACK store: one byte, point-to-point
/// to the sender, at `addr`. The deliverer puts it into the global order
/// with `flags`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckReply {
    /// The node that made the ACK store.
    pub dest: u16,
    /// `link::FLAG_ACK_REPLY`, plus `link::FLAG_LOOPBACK` when the answering
    /// node is the sender itself (an ACK page with LOOPBACK): a node's own
    /// write reaches it only as a loopback.
    pub flags: u16,
    /// Where the answer lands: the ACK page's base plus the answering node.
    pub addr: u64,
    /// Error status bits 0–6 with bit 7 set.
    pub status: u8,
}

impl AckReply {
    /// The answer as the write it is, from the answering node: one byte,
    /// point-to-point to the ACK's sender, with the flags the answering
    /// adapter chose (a sender answering itself sets loopback).
    pub fn write(&self) -> WritePacket<'_> {
        WritePacket { dest: self.dest, flags: self.flags, addr: self.addr, data: std::slice::from_ref(&self.status) }
    }
}
