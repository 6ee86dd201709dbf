//! [`UmpError`]: why a UMP call failed (what the C API turns into its
//! `UMP_E*` codes).

use thiserror::Error;

use crate::channel::ChanError;
use crate::config::ConfigError;

/// Why a UMP call failed.
#[derive(Debug, Error)]
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
    /// The operating system said no (`what` we asked it for).
    #[error("{what}: {source}")]
    Os {
        /// What was asked (a path, a call).
        what: String,
        /// What it said.
        source: std::io::Error,
    },
    /// A mapping of shared memory failed (`what`: the file mapped).
    #[error("{what}: {source}")]
    Mem {
        /// The file mapped.
        what: String,
        /// Why.
        source: guest_mem::MemError,
    },
}

impl UmpError {
    /// An operating system error while doing `what`.
    pub fn os(what: impl std::fmt::Display, source: impl Into<std::io::Error>) -> UmpError {
        UmpError::Os { what: what.to_string(), source: source.into() }
    }
}

impl From<ConfigError> for UmpError {
    fn from(e: ConfigError) -> Self {
        UmpError::Invalid(e.0)
    }
}
