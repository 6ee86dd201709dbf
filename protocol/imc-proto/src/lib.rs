//! What `imcd` and its clients agree on, like a header file of the kernel
//! subsystem it plays (seed 000, "TruCluster MEMORY CHANNEL Software"). No
//! I/O: the daemon (`guest/adapter/imcd`) and the clients (`guest/client/imc-client`,
//! `libimc`, `ump`) both depend on this crate.
//!
//! - [`Request`], [`Reply`] and [`Status`]: the requests processes send imcd
//!   over its Unix socket ([`IMCD_SOCKET`]), one JSON object per line each
//!   way, and the typed status a refusal carries (the `IMC_*` codes of
//!   `<sys/imc.h>`).
//! - [`layout`]: the MEMORY CHANNEL pages imcd keeps for itself, the words
//!   of its host table and command relay, and the lock-slot geometry.
//! - [`keys`]: the one registry of region-key namespaces (user keys, UMP's
//!   channels, listen areas and outbufs, imcd's lock sets), so two layers
//!   never pick overlapping keys.
#![warn(missing_docs)]

pub mod keys;
pub mod layout;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Longest request or reply line, newline excluded.
pub const MAX_LINE: usize = 4096;

/// Where `imcd` listens.
pub const IMCD_SOCKET: &str = "/run/imcd.sock";

/// imcd's copy of the clusterwide error count (`imc_rderrcnt` maps it):
/// the count in word 0 ([`ERRCOUNT_SUM`]), and in word 1 ([`ERRCOUNT_LEFT`])
/// how many times this node left the cluster since imcd started (an outage
/// past the grace: every attachment of the processes here was revoked).
pub const ERRCOUNT_FILE: &str = "/dev/shm/imcd-errcount";
/// Byte offset of the error count in [`ERRCOUNT_FILE`].
pub const ERRCOUNT_SUM: usize = 0;
/// Byte offset of the count of departures in [`ERRCOUNT_FILE`].
pub const ERRCOUNT_LEFT: usize = 8;

/// Where the answers to `imc_ckerrcnt`'s ACK-page stores land.
pub const ACK_FILE: &str = "/dev/shm/imcd-ack";

/// Why imcd refused a request: the `IMC_*` status a C caller gets (the
/// wire name is the C name without `IMC_`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "UPPERCASE")]
pub enum Status {
    /// The key exists (exclusive allocation).
    Exists,
    /// The caller's credentials do not allow the access.
    Permission,
    /// This process has not allocated the region.
    NotAlloc,
    /// No such region or lock set.
    NotFound,
    /// No free MEMORY CHANNEL pages of that size.
    NoSpace,
    /// The region directory is full.
    TableFull,
    /// The key exists with another size.
    Size,
    /// A malformed or out-of-range request.
    Invalid,
    /// The cluster did not answer (a node holds the directory lock or does
    /// not acknowledge a coherent region).
    Cluster,
    /// A wait of the client library ran out of time.
    Timeout,
    /// No such host runs imcd, or it did not answer.
    NoHost,
    /// The remote operation failed with an errno (in the message).
    Errno,
    /// imcd could not set up memory for the request.
    NoMem,
    /// The adapter is not available.
    NoDev,
}

impl Status {
    /// The name on the wire and in messages (`EXISTS`, `NOTFOUND`, …).
    pub fn name(self) -> &'static str {
        match self {
            Status::Exists => "EXISTS",
            Status::Permission => "PERMISSION",
            Status::NotAlloc => "NOTALLOC",
            Status::NotFound => "NOTFOUND",
            Status::NoSpace => "NOSPACE",
            Status::TableFull => "TABLEFULL",
            Status::Size => "SIZE",
            Status::Invalid => "INVALID",
            Status::Cluster => "CLUSTER",
            Status::Timeout => "TIMEOUT",
            Status::NoHost => "NOHOST",
            Status::Errno => "ERRNO",
            Status::NoMem => "NOMEM",
            Status::NoDev => "NODEV",
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A request to `imcd`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// `imc_asalloc`: find or create the region `key` of `size` bytes.
    Asalloc {
        /// Clusterwide key.
        key: u64,
        /// Bytes (rounded up to whole 8 KiB pages).
        size: u64,
        /// Permission bits (0o666 style).
        mode: u32,
        /// Fail if the key exists.
        exclusive: bool,
        /// IMC_COHERENT: every node receives the region from its creation.
        #[serde(default)]
        coherent: bool,
    },
    /// `imc_lkalloc`: find or create the spinlock set `key` of `nlocks` locks.
    /// `creator`: create it exclusively and hold lock 0 when it returns.
    Lkalloc {
        /// Clusterwide key.
        key: u64,
        /// Locks in the set.
        nlocks: u32,
        /// Permission bits.
        mode: u32,
        /// IMC_CREATOR.
        creator: bool,
    },
    /// The adapter's registers, read-only (error counts, membership).
    Regs,
    /// imcd's copy of the error count (a file it keeps current), read-only.
    ErrCount,
    /// The ACK page of `imc_ckerrcnt`: its transmit window page (device
    /// fd), or the file its answers land in.
    AckPage {
        /// Transmit page (true) or answers (false).
        transmit: bool,
    },
    /// `imc_asdealloc` / `imc_lkdealloc`: free region (or lock set) `id`.
    Dealloc {
        /// Region id.
        id: u32,
    },
    /// Whether region `key` exists (without allocating or holding it).
    Find {
        /// Clusterwide key.
        key: u64,
    },
    /// `imc_gethosts`: the nodes running imcd, with their host names.
    Hosts,
    /// `imc_kill`: send signal `sig` to process `pid` on `host` (a host
    /// name or a node number), through the command relay.
    Kill {
        /// Host name or node number.
        host: String,
        /// Process id there.
        pid: i32,
        /// Signal number.
        sig: i32,
    },
    /// Failure drill (imcd started with `--test-hooks` only): abandon an
    /// update of directory entry `id` with the directory lock held, and
    /// stop serving, as a node dying mid-update would.
    AbandonUpdate {
        /// Directory entry.
        id: u32,
    },
    /// Extension (not in the paper's Table 1): set up transmit DMA for this
    /// process: a source area of `size` bytes (the fd sent with the
    /// [`Reply::DmaArea`]), mapped for the adapter's DMA. Once per process.
    DmaOpen {
        /// Bytes of source area (rounded up to whole 8 KiB pages).
        size: u64,
    },
    /// Extension: the node's transmit DMA descriptor ring (a
    /// [`Reply::Mapping`] of a file; after [`Request::DmaOpen`]).
    DmaRing,
    /// Extension: region `id` as a DMA destination; refused unless this
    /// process attached it for transmit.
    DmaTarget {
        /// Region id.
        id: u32,
    },
    /// Extension: receive region `id` into this process's DMA source area
    /// at byte `offset` (a whole page) instead of a buffer of its own: the
    /// adapter writes what arrives for the region straight into the area,
    /// which the process maps read-write and may also send from by DMA
    /// (registered memory, as VIA's `VipRegisterMem`). Refused unless this
    /// process holds the region, has a source area it fits in, and no one
    /// on this node receives the region already. Undone when the process
    /// lets go of the region or leaves.
    DmaLand {
        /// Region id.
        id: u32,
        /// Byte of the source area where the region's first byte lands.
        offset: u64,
    },
    /// Extension: wake this process when a store arrives on region `id`
    /// here. imcd sets the page control table's INT bit on the region's
    /// pages and sends an eventfd ([`Reply::Watching`]) that it adds 1 to
    /// at every notification for those pages (or when notifications were
    /// lost). Refused unless this process holds the region and may read
    /// it. Undone when the process lets go of the region or leaves.
    Watch {
        /// Region id.
        id: u32,
    },
    /// `imc_asattach`: map region `id` for transmit or receive.
    Asattach {
        /// Region id from `Asalloc`.
        id: u32,
        /// Transmit (true) or receive.
        transmit: bool,
        /// Writes come back to this node too.
        loopback: bool,
        /// Extension: transmit point-to-point to this node only (the page
        /// control table's P2P bit and destination node, `docs/adapter.md`)
        /// instead of broadcasting. The process that attaches a region so
        /// becomes its only sender on this node; for a Direct Deposit key
        /// ([`keys::Namespace::DdWire`]) only the key's sending node may
        /// attach it for transmit at all, and only to its receiving node.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        p2p: Option<u32>,
    },
}

/// `imcd`'s answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Reply {
    /// Done.
    Done,
    /// A region.
    Region {
        /// Region id.
        id: u32,
        /// First MEMORY CHANNEL page.
        first_page: u64,
        /// Pages.
        pages: u64,
        /// This call created it.
        created: bool,
    },
    /// A spinlock set (its slots are region `id`).
    LockSet {
        /// Region holding the slots.
        id: u32,
        /// Locks.
        nlocks: u32,
        /// This node's slot in each lock.
        node: u32,
        /// This call created it.
        created: bool,
        /// With IMC_CREATOR: the bid imcd placed in lock 0 for the caller.
        placed_bid: u64,
    },
    /// The hosts: (node, host name).
    Hosts {
        /// Nodes running imcd, in node order.
        hosts: Vec<(u32, String)>,
    },
    /// An attachment: the fd sent with this reply, mapped at `offset` for `len` bytes.
    Mapping {
        /// Offset to mmap the fd at.
        offset: u64,
        /// Bytes.
        len: u64,
    },
    /// A transmit DMA source area (its file is the fd sent with this reply).
    DmaArea {
        /// IOVA at which the adapter reads byte 0 of the area.
        iova: u64,
        /// Bytes.
        len: u64,
        /// Descriptors in the node's ring ([`Request::DmaRing`]).
        ring_entries: u32,
    },
    /// A DMA destination: a region this process attached for transmit.
    DmaTarget {
        /// Region id.
        id: u32,
        /// First MEMORY CHANNEL page.
        first_page: u64,
        /// Pages.
        pages: u64,
    },
    /// A watch ([`Request::Watch`]): the eventfd sent with this reply
    /// becomes readable when a store arrives on the region's pages.
    Watching {
        /// First MEMORY CHANNEL page watched.
        first_page: u64,
        /// Pages.
        pages: u64,
    },
    /// The request failed.
    Error {
        /// Why, as an `IMC_*` status.
        code: Status,
        /// What went wrong.
        message: String,
    },
}

impl Reply {
    /// A refusal with `code` and a message in words.
    pub fn error(code: Status, message: impl std::fmt::Display) -> Reply {
        Reply::Error { code, message: message.to_string() }
    }
}

/// Errors decoding a line of the protocol.
#[derive(Debug, Error)]
pub enum ProtoError {
    /// Longer than [`MAX_LINE`].
    #[error("line of {0} bytes is longer than {MAX_LINE}")]
    TooLong(usize),
    /// Not a request or reply this version knows.
    #[error("malformed line: {0}")]
    Malformed(#[from] serde_json::Error),
}

/// Decodes one request line (without its newline), as imcd does.
pub fn decode_request(line: &[u8]) -> Result<Request, ProtoError> {
    if line.len() > MAX_LINE {
        return Err(ProtoError::TooLong(line.len()));
    }
    Ok(serde_json::from_slice(line)?)
}

/// Decodes one reply line (without its newline), as clients do.
pub fn decode_reply(line: &[u8]) -> Result<Reply, ProtoError> {
    if line.len() > MAX_LINE {
        return Err(ProtoError::TooLong(line.len()));
    }
    Ok(serde_json::from_slice(line)?)
}

/// Encodes a request or reply as one line, newline included.
pub fn encode_line<T: Serialize>(msg: &T) -> Vec<u8> {
    // Requests and replies are plain data: encoding cannot fail.
    let mut v = serde_json::to_vec(msg).unwrap_or_default();
    v.push(b'\n');
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_names_are_the_wire_names() {
        let all = [
            Status::Exists,
            Status::Permission,
            Status::NotAlloc,
            Status::NotFound,
            Status::NoSpace,
            Status::TableFull,
            Status::Size,
            Status::Invalid,
            Status::Cluster,
            Status::Timeout,
            Status::NoHost,
            Status::Errno,
            Status::NoMem,
            Status::NoDev,
        ];
        for s in all {
            let wire = serde_json::to_string(&s).unwrap();
            assert_eq!(wire, format!("\"{}\"", s.name()));
            assert_eq!(serde_json::from_str::<Status>(&wire).unwrap(), s);
        }
    }

    #[test]
    fn requests_and_replies_round_trip_as_lines() {
        let req = Request::Asalloc { key: 55, size: 16384, mode: 0o666, exclusive: true, coherent: false };
        let line = encode_line(&req);
        assert_eq!(line.last(), Some(&b'\n'));
        assert_eq!(decode_request(&line[..line.len() - 1]).unwrap(), req);
        let p2p = Request::Asattach { id: 3, transmit: true, loopback: false, p2p: Some(2) };
        let line = encode_line(&p2p);
        assert_eq!(decode_request(&line[..line.len() - 1]).unwrap(), p2p);
        // An attach from a client that predates P2P is a broadcast attach.
        let old = br#"{"op":"asattach","id":3,"transmit":true,"loopback":false}"#;
        assert_eq!(
            decode_request(old).unwrap(),
            Request::Asattach { id: 3, transmit: true, loopback: false, p2p: None }
        );
        let rep = Reply::error(Status::Exists, "key 55 exists");
        let line = encode_line(&rep);
        assert_eq!(decode_reply(&line[..line.len() - 1]).unwrap(), rep);
        assert!(String::from_utf8(line).unwrap().contains("\"code\":\"EXISTS\""));
    }

    #[test]
    fn bad_lines_are_errors_not_panics() {
        assert!(matches!(decode_request(b"{\"op\":\"no_such_op\"}"), Err(ProtoError::Malformed(_))));
        assert!(matches!(decode_request(b"\xff\xfe"), Err(ProtoError::Malformed(_))));
        assert!(matches!(decode_request(&vec![b' '; MAX_LINE + 1]), Err(ProtoError::TooLong(_))));
        assert!(decode_reply(b"{\"status\":\"error\",\"code\":\"BOGUS\",\"message\":\"\"}").is_err());
    }
}
