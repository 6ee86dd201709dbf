//! `mc-hub`: the MEMORY CHANNEL hub.
//!
//! # Layout
//! - [`hub`]: the server: node ids, the global order, fan-out, flow control,
//!   control requests, capture.
//! - [`local`]: local ports: the adapters of guests on this host, served
//!   over vfio-user by the hub itself, so a store reaches the other guests'
//!   memory in the thread that received it.
//! - [`link`] (crate `mc-link`, `hub/link/`): the wire format link ports speak.
//! - `testing` (feature `testing`): a real hub on its own runtime, for tests.
#![warn(missing_docs)]

pub mod hub;
pub mod local;
/// The link protocol (crate `mc-link`).
pub use mc_link as link;
#[cfg(feature = "testing")]
pub mod testing;
