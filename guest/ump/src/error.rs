//! [`UmpError`]: why a UMP call failed (what the C API turns into its
//! `UMP_E*` codes).

use thiserror::Error;

use crate::channel::ChanError;
use crate::config::ConfigError;

/// Why a UMP call failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum UmpError {
    /// `init` was not called (or `exit` was).
    #[error("ump_init has not been called")]
    NotInitialized,
    /// A bad argument.
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// No such channel.
    #[error("no channel {0}")]
    NoChannel(i32),
    /// Too many channels.
    #[error("{0} channels open already (UMP_MAX_CHANNELS)")]
    TooMany(usize),
    /// A channel with these handles is open in this process already, or
    /// the other side's half is held by a live process.
    #[error("busy: {0}")]
    Busy(String),
    /// The transport is not available (MEMORY CHANNEL without imcd).
    #[error("transport not available: {0}")]
    NoTransport(String),
    /// The channel failed.
    #[error(transparent)]
    Channel(#[from] ChanError),
    /// The operating system said no.
    #[error("{0}")]
    Os(String),
}

impl From<ConfigError> for UmpError {
    fn from(e: ConfigError) -> Self {
        UmpError::Invalid(e.0)
    }
}
