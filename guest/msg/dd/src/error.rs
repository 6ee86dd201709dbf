//! [`DdError`]: every way a Direct Deposit call fails. Each limit is an
//! error that names it; a refused send has written nothing.

use thiserror::Error;

use crate::layout::{ALIGN, MAX_BUFFER, NOTES};

/// Why a Direct Deposit call failed.
#[derive(Debug, Error)]
pub enum DdError {
    /// The message does not fit the receive buffer at that offset; nothing
    /// was written.
    #[error("{len} bytes at offset {offset} do not fit the connection's buffer of {size} bytes")]
    OutOfBuffer {
        /// Offset asked.
        offset: u64,
        /// Bytes asked.
        len: u64,
        /// The buffer's size.
        size: u64,
    },
    /// The offset is not a multiple of [`ALIGN`]; nothing was written.
    #[error("offset {0} is not a multiple of {ALIGN} (MEMORY CHANNEL stores whole 8-byte words)")]
    Misaligned(u64),
    /// The bytes would overwrite a message the receiver has not released;
    /// nothing was written (try again after it releases).
    #[error("bytes {offset}..{end} overlap message {seq}, which the receiver has not released")]
    Busy {
        /// Offset asked.
        offset: u64,
        /// End asked (padded).
        end: u64,
        /// The unreleased message's sequence number.
        seq: u64,
    },
    /// Every note of the ring holds a message not released; nothing was
    /// written.
    #[error("all {NOTES} notes of the connection hold unreleased messages")]
    NotesFull,
    /// A buffer of 0 bytes or more than [`MAX_BUFFER`].
    #[error("a buffer of {0} bytes: 1 to {MAX_BUFFER}")]
    BufferSize(u64),
    /// A connection's note was lost (the ring's head shows a later one
    /// was posted): a fault on the path; the message is gone.
    #[error("connection {conn}: note {seq} was lost (a later note was posted)")]
    Lost {
        /// Connection.
        conn: u32,
        /// The lost note's sequence number.
        seq: u64,
    },
    /// The message's bytes do not match its note's CRC: some of them were
    /// lost on the way (never handed out as data).
    #[error("connection {conn}: message {seq} arrived damaged (CRC {got:#010x}, sent {want:#010x})")]
    Damaged {
        /// Connection.
        conn: u32,
        /// Sequence number.
        seq: u64,
        /// CRC in the note.
        want: u32,
        /// CRC of what arrived.
        got: u32,
    },
    /// A note that cannot be (wrong connection id, outside the buffer).
    #[error("connection {conn}: note {seq} is malformed: {why}")]
    BadNote {
        /// Connection.
        conn: u32,
        /// Sequence number.
        seq: u64,
        /// What is wrong.
        why: String,
    },
    /// Release of a note that is not outstanding.
    #[error("connection {conn}: note {seq} is not outstanding (not received, or released already)")]
    NotOutstanding {
        /// Connection.
        conn: u32,
        /// Sequence number.
        seq: u64,
    },
    /// No such connection on this queue or endpoint.
    #[error("no connection {0} here")]
    NoConnection(u32),
    /// A bad argument (the message says which).
    #[error("{0}")]
    Invalid(String),
    /// A wait ran out of time.
    #[error("{0}: timed out")]
    Timeout(String),
    /// imcd refused or could not be reached.
    #[error("imcd: {0}")]
    Imc(#[from] imc_client::ImcError),
    /// The transmit DMA engine failed or refused.
    #[error("DMA: {0}")]
    Dma(#[from] imc_client::dma::DmaError),
    /// A mapping refused an access.
    #[error("memory: {0}")]
    Mem(#[from] guest_mem::MemError),
    /// A system call failed.
    #[error("{0}: {1}")]
    Os(&'static str, nix::Error),
}

impl DdError {
    /// The C API's code for this error (`dd.h`, `DD_E*`, negative).
    pub fn code(&self) -> i32 {
        match self {
            DdError::OutOfBuffer { .. } => -1,
            DdError::Misaligned(_) => -2,
            DdError::Busy { .. } => -3,
            DdError::NotesFull => -4,
            DdError::BufferSize(_) => -5,
            DdError::Lost { .. } => -6,
            DdError::Damaged { .. } => -7,
            DdError::BadNote { .. } => -8,
            DdError::NotOutstanding { .. } => -9,
            DdError::NoConnection(_) => -10,
            DdError::Invalid(_) => -11,
            DdError::Timeout(_) => -12,
            DdError::Imc(imc_client::ImcError::Refused { code: imc_client::Status::Permission, .. }) => -14,
            DdError::Imc(_) => -13,
            DdError::Dma(_) => -15,
            DdError::Mem(_) | DdError::Os(..) => -16,
        }
    }
}
