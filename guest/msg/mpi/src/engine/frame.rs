//! Framing: the header of every frame, the one-word envelope of a short
//! eager message, and where a `DATA` frame's payload can be read straight
//! into place. Used by the engine's thread only.
//!
//! # A frame
//!
//! ```text
//! 0  kind u8 | flags u8 | 0 u16 | ctx u32
//! 8  tag i32 | 0 u32
//! 16 len u64            message bytes (EAGER, RTS), chunk offset (DATA) or credit given back (CTS)
//! 24 a u64              sender's request (EAGER sync, RTS, CTS, ACK, CANCEL, CANCELLED), receiver's (DATA)
//!                       or credit given back (CREDIT)
//! 32 b u64              receiver's request (CTS, DONE); 1 if cancelled (CANCELLED); a short message's number (CANCEL)
//! 40 payload            EAGER, DATA
//! ```
//!
//! A `CTS` with `FLAG_DIRECT` carries in bytes 8..16 (where other frames
//! have the tag) the offset of the posted buffer in the receiver's landing
//! memory. `DONE` has the message's length in `len`, the sender's request
//! in `a` and the receiver's in `b`; `TAKEN` the sender's request in `a`.
//!
//! A standard eager send (not synchronous, context below 2^24) has the
//! short envelope instead, one word, its length the frame's:
//!
//! ```text
//! 0  EAGER8 u8 | ctx u24 | tag i32
//! 8  payload
//! ```
//!
//! Over MEMORY CHANNEL every 8 bytes of a frame is one trapped store, so
//! an 8-byte message costs 2 stores of envelope instead of 5.

use super::*;

/// Bytes of a frame header.
pub const HDR: usize = 40;

pub(super) const EAGER: u8 = 1;

pub(super) const RTS: u8 = 2;

pub(super) const CTS: u8 = 3;

pub(super) const DATA: u8 = 4;

pub(super) const ACK: u8 = 5;

pub(super) const CANCEL: u8 = 6;

pub(super) const CANCELLED: u8 = 7;

/// Credit given back: `a` bytes (see "Credits").
pub(super) const CREDIT: u8 = 9;

/// Zero copy: the DMA into the posted buffer is complete.
pub(super) const DONE: u8 = 10;

/// Zero copy: the receiver took the message (the send is complete).
pub(super) const TAKEN: u8 = 11;

/// Store your board slot again: a store of it may have been lost on the
/// way here (`crate::board`, "Lost stores").
pub(super) const REPOST: u8 = 12;

/// An eager message with the one-word envelope (see "A frame").
pub(super) const EAGER8: u8 = 8;

/// One-sided communication: `ctx` is the window, `tag` the operation
/// ([`crate::rma`], "A frame").
pub(super) const RMA: u8 = 13;

/// This rank has passed the job's last barrier and will close its end
/// once everyone has its goodbye ([`Engine::leave`]).
pub(super) const BYE: u8 = 14;

/// Bytes of the short envelope.
pub(super) const HDR8: usize = 8;

/// Contexts the short envelope can carry.
pub(super) const CTX8_LIMIT: u32 = 1 << 24;

/// A short eager message carries no sender's request: both sides number
/// them per pair of ranks, and a cancel names one as `SHORT_ID | number`
/// (request ids never have the top bit).
pub(super) const SHORT_ID: u64 = 1 << 63;

pub(super) const FLAG_SYNC: u8 = 1;

/// On a `CTS`: the posted buffer is in the receiver's landing memory.
pub(super) const FLAG_DIRECT: u8 = 2;

pub(super) fn header(kind: u8, flags: u8, ctx: u32, tag: i32, len: u64, a: u64, b: u64) -> [u8; HDR] {
    let mut h = [0u8; HDR];
    h[0] = kind;
    h[1] = flags;
    h[4..8].copy_from_slice(&ctx.to_ne_bytes());
    h[8..12].copy_from_slice(&tag.to_ne_bytes());
    h[16..24].copy_from_slice(&len.to_ne_bytes());
    h[24..32].copy_from_slice(&a.to_ne_bytes());
    h[32..40].copy_from_slice(&b.to_ne_bytes());
    h
}

/// The one-word envelope of a standard eager message (`ctx` < [`CTX8_LIMIT`]).
pub(super) fn short_header(ctx: u32, tag: i32) -> [u8; HDR8] {
    let mut h = [0u8; HDR8];
    h[0] = EAGER8;
    h[1..4].copy_from_slice(&ctx.to_le_bytes()[..3]);
    h[4..8].copy_from_slice(&tag.to_ne_bytes());
    h
}

/// `DATA` frames at least this much longer than a header are read
/// straight into the posted buffer when they can be ([`data_place`]).
pub(super) const SPLIT_MIN: usize = 1024;

/// Where the payload of a frame with header `h` and `rest` bytes after
/// it can go straight: the posted buffer of a contiguous receive, when the
/// frame is the `DATA` it expects next and all of it lands there.
pub(super) fn data_place<'d>(reqs: &HashMap<ReqId, Req>, h: &[u8], rest: usize) -> Option<&'d mut [u8]> {
    if h.len() < HDR || h[0] != DATA {
        return None;
    }
    let (off, id) = (word(h, 16) as usize, word(h, 24));
    match reqs.get(&id)? {
        Req {
            kind: Kind::Recv { into: RecvBuf::Contig(Posted { ptr, cap }), got, total, .. }, done: false, ..
        } if *got == off && off + rest <= *total && off + rest <= *cap => {
            // SAFETY: the receive buffer holds `cap` bytes at `ptr` (the
            // caller's promise, kept until the receive completes, which it
            // has not); off + rest <= cap; nothing else writes there while
            // this frame is read.
            Some(unsafe { std::slice::from_raw_parts_mut(ptr.add(off), rest) })
        }
        _ => None,
    }
}

pub(super) fn word(f: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&f[at..at + 8]);
    u64::from_ne_bytes(w)
}
