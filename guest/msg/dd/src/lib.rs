//! Direct Deposit (seed 001, Avalanche, "Sender-Based Protocols"): the
//! sender places each message at an offset it chooses in a buffer the
//! receiver reserved when the connection was set up, and a note of it
//! (valid flag, offset, size, connection) appears in the receiver's
//! circular notification queue. Built on the TruCluster API (`imc_client`,
//! imcd) and the adapter's features: regions, point-to-point pages, INT
//! pages and the transmit DMA engine. `docs/dd.md` is the full text.
//!
//! # Layout
//!
//! - [`layout`]: the regions of a connection and the note's encoding.
//! - [`proto`]: the protocol over [`proto::Tx`] / [`proto::Rx`]: the
//!   sender's checks and notes, the queue's polling and releases.
//! - [`sim`]: a simulated ordered bus for the protocol's tests.
//! - [`mc`]: the protocol on MEMORY CHANNEL: connections set up through
//!   imcd, sends by stores or by DMA, blocking receives on the interrupt.
//! - `capi`: the C API (`include/dd.h`).
//! - [`error`]: the error type, [`DdError`].
#![warn(missing_docs)]

mod capi;
pub mod error;
pub mod layout;
pub mod mc;
pub mod proto;
pub mod sim;

pub use error::DdError;
pub use layout::Note;
pub use mc::{Conn, Queue, Ticket, DMA_THRESHOLD_DEFAULT};
