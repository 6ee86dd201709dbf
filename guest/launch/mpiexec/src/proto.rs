//! The launch protocol between `mpiexec` and `mpid`: the UMP handles they
//! use and the messages they exchange, one JSON object per UMP message.
//! Pure data and encoding: no I/O, no threads.
//!
//! Handles (all under the MPI tag `0x4D50 << 48`, apart from the ranks'):
//!
//! | handle                                  | who                          |
//! |-----------------------------------------|------------------------------|
//! | `0x4D50_FFFF_0000_0000 \| node`          | `mpid` of node `node`        |
//! | `0x4D50_FFFE_0000_0000 \| job`           | the `mpiexec` of job `job`   |
//! | `0x4D50 << 48 \| job << 16 \| rank`      | rank `rank` of job `job` (`mpi::launch`) |
//!
//! Job ids are below [`JOB_LIMIT`], so a rank's handle never equals a
//! launcher's.

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// `mpid`'s handle on node 0; node `n` listens on `MPID_BASE | n`.
pub const MPID_BASE: u64 = 0x4D50_FFFF_0000_0000;

/// High bits of an `mpiexec`'s handle (the job id is the low 32 bits).
pub const CLIENT_BASE: u64 = 0x4D50_FFFE_0000_0000;

/// Job ids are 1 to `JOB_LIMIT - 1`: rank handles of larger ones would
/// reach into the launchers' handles.
pub const JOB_LIMIT: u32 = 0xFFFE_0000;

/// The most ranks a job may have (the handle encoding leaves 16 bits).
pub const MAX_RANKS: u32 = 1 << 16;

/// The largest message either side sends or accepts.
pub const MAX_MESSAGE: usize = 256 << 10;

/// Output is forwarded in pieces of at most this many bytes (a line, or
/// part of a longer one).
pub const OUTPUT_PIECE: usize = 8 << 10;

/// Environment variable that moves every `mpid` handle (tests run
/// several independent sets of daemons on one machine): a handle with
/// the low 16 bits clear, under `0x4D50_FFFF_0000_0000`.
pub const BASE_VAR: &str = "MCMPI_MPID_BASE";

/// A bad handle setting or message.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ProtoError {
    /// `MCMPI_MPID_BASE` is not a usable handle.
    #[error("{BASE_VAR}={0:?}: a handle 0x4D50FFFFxxxx0000 (hexadecimal)")]
    BadBase(String),
    /// A message that does not decode.
    #[error("bad message: {0}")]
    Decode(String),
    /// A message too long to send.
    #[error("message of {0} bytes is longer than {MAX_MESSAGE}")]
    TooLong(usize),
}

/// The `mpid` handle base: [`MPID_BASE`] or `$MCMPI_MPID_BASE`.
pub fn mpid_base() -> Result<u64, ProtoError> {
    match std::env::var(BASE_VAR) {
        Err(_) => Ok(MPID_BASE),
        Ok(s) => parse_base(&s),
    }
}

/// Parses a handle base (hexadecimal, `0x` optional).
pub fn parse_base(s: &str) -> Result<u64, ProtoError> {
    let t = s.trim();
    let t = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")).unwrap_or(t);
    match u64::from_str_radix(t, 16) {
        Ok(b) if b >> 32 == MPID_BASE >> 32 && b & 0xFFFF == 0 => Ok(b),
        _ => Err(ProtoError::BadBase(s.to_string())),
    }
}

/// The handle `mpid` of `node` listens on, with handle base `base`.
pub fn mpid_handle(base: u64, node: u32) -> u64 {
    base | u64::from(node & 0xFFFF)
}

/// The handle of the `mpiexec` of job `job`.
pub fn client_handle(job: u32) -> u64 {
    CLIENT_BASE | u64::from(job)
}

/// What `mpiexec` sends `mpid`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Start these ranks of a job (one `Start` per channel).
    Start(Start),
    /// End every rank of this channel's job (SIGTERM, then SIGKILL).
    Kill,
    /// `mpiexec` is still there (the lease, see `daemon`).
    Ping,
}

/// The ranks of a job to start on one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Start {
    /// Job id (1 to [`JOB_LIMIT`] - 1).
    pub job: u32,
    /// Ranks in the job.
    pub size: u32,
    /// The ranks to start here.
    pub ranks: Vec<u32>,
    /// Program and arguments (the program is looked up in `PATH` unless it
    /// has a slash; a relative path is relative to `cwd`).
    pub argv: Vec<String>,
    /// Variables set on top of `mpid`'s own environment.
    pub env: Vec<(String, String)>,
    /// Working folder of the ranks.
    pub cwd: String,
    /// When `cwd` does not exist: fail (true) or use `/` (false: `mpiexec`'s
    /// own folder, which another guest may not have).
    pub cwd_required: bool,
}

/// What `mpid` sends back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Reply {
    /// A rank runs, as process `pid` (its own process group).
    Started {
        /// Rank.
        rank: u32,
        /// Its process id on that node.
        pid: u32,
    },
    /// A piece of a rank's output: a line with its newline, part of a
    /// longer line, or the unterminated end of the output.
    Output {
        /// Rank.
        rank: u32,
        /// 1 (standard output) or 2 (standard error).
        fd: u8,
        /// The text (invalid UTF-8 replaced).
        data: String,
    },
    /// A rank ended.
    Exited {
        /// Rank.
        rank: u32,
        /// Its exit code, when it exited.
        code: Option<i32>,
        /// The signal that killed it, when one did.
        signal: Option<i32>,
    },
    /// The request failed. With a rank: that rank could not be started,
    /// the ranks after it in the request were not, and the ones before it
    /// are being ended. Without: nothing of the request runs.
    Error {
        /// The rank that could not start, if the error is about one.
        rank: Option<u32>,
        /// What went wrong.
        message: String,
    },
}

/// Encodes a message.
pub fn encode<T: Serialize>(m: &T) -> Result<Vec<u8>, ProtoError> {
    let v = serde_json::to_vec(m).map_err(|e| ProtoError::Decode(e.to_string()))?;
    if v.len() > MAX_MESSAGE {
        return Err(ProtoError::TooLong(v.len()));
    }
    Ok(v)
}

/// Decodes a message.
pub fn decode<'a, T: Deserialize<'a>>(b: &'a [u8]) -> Result<T, ProtoError> {
    serde_json::from_slice(b).map_err(|e| ProtoError::Decode(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_stay_apart_from_rank_handles() {
        let base = parse_base("0x4D50FFFF00000000").unwrap();
        assert_eq!(mpid_handle(base, 3), 0x4D50_FFFF_0000_0003);
        assert_eq!(client_handle(7), 0x4D50_FFFE_0000_0007);
        // The largest job's last rank is below every launcher handle.
        let rank_handle = 0x4D50u64 << 48 | u64::from(JOB_LIMIT - 1) << 16 | 0xFFFF;
        assert!(rank_handle < CLIENT_BASE);
        assert_eq!(parse_base("4d50ffff00070000"), Ok(0x4D50_FFFF_0007_0000));
        for bad in ["", "12", "0x4D50FFFF00000001", "0x4D50FFFE00000000", "zz"] {
            assert!(parse_base(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn messages_round_trip_and_bad_ones_are_errors() {
        let s = Request::Start(Start {
            job: 5,
            size: 2,
            ranks: vec![0, 1],
            argv: vec!["/bin/true".into()],
            env: vec![("A".into(), "b c".into())],
            cwd: "/".into(),
            cwd_required: false,
        });
        assert_eq!(decode::<Request>(&encode(&s).unwrap()).unwrap(), s);
        let r = Reply::Exited { rank: 1, code: None, signal: Some(9) };
        assert_eq!(decode::<Reply>(&encode(&r).unwrap()).unwrap(), r);
        assert!(decode::<Request>(b"{\"op\":\"launch\"}").is_err());
        assert!(decode::<Request>(b"\xff\xfe").is_err());
        assert!(decode::<Request>(b"{\"op\":\"start\",\"job\":-1}").is_err());
    }
}
