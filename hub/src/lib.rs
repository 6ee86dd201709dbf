//! `mc-hub`: the MEMORY CHANNEL hub and the link protocol adapters speak to it.
//!
//! # Layout
//! - [`link`]: the wire format shared by hub and adapters (frames, kinds, validation).
//! - [`hub`]: the server: node ids, the global order, fan-out, flow control.
//! - [`client`]: a blocking link client, used by `mc-adapter` and by tests.
//! - `testing` (feature `testing`): a real hub on its own runtime, for tests.
#![warn(missing_docs)]

pub mod client;
pub mod hub;
pub mod link;
#[cfg(feature = "testing")]
pub mod testing;
