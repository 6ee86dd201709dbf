//! The host ⇄ guest agent protocol, shared by `mc-agent` (in the guest) and
//! `mc-cluster` (on the host); [`server`] is the guest's side of it.
//!
//! Transport: a virtio-serial port named [`PORT_NAME`], a Unix socket on the
//! host side. Framing: a little-endian u32 length, then that many bytes of
//! JSON ([`Request`] host→guest, [`Response`] guest→host), each wrapped in an
//! [`Envelope`] carrying the request id. One operation at a time:
//!
//! - `Ping` → `Pong`.
//! - `Exec` → any number of `Output` chunks while the command runs, then
//!   `Exited` (or `Error` if it could not start). With `stdin: true` the host
//!   streams `Stdin` chunks and then `StdinEnd` (the command's end of file)
//!   while it reads the answers; chunks the command no longer wants are
//!   dropped, and those still arriving after `Exited` are ignored. The
//!   stream ends early when the host goes away: the port reads as hung up
//!   for 2 s ([`server`]: a hang-up that clears sooner is an earlier
//!   client's, seen late), or a frame of another operation arrives.
//! - `Put` → `Ready` (the file is open), then the host sends the bytes as
//!   `Stdin` chunks and `StdinEnd` → `Done` (or `Error` at either step).
//! - `Get` → `Data` chunks, then `Done` (or `Error`).
//!
//! Binary data (stdin, output, file bytes) travels base64-encoded, in chunks
//! of at most [`CHUNK`] bytes, so neither side ever holds more than a few
//! chunks of a stream in memory.
#![warn(missing_docs)]

pub mod server;

use std::io::{self, Read, Write};

use base64::Engine;
use serde::{Deserialize, Serialize};

/// Name of the virtio-serial port (`-device virtserialport,name=…`).
pub const PORT_NAME: &str = "mc.agent";
/// Largest frame either side accepts: bounds memory on a corrupt length.
pub const MAX_FRAME: usize = 1 << 20;
/// Most bytes of stdin, output or file data in one frame.
pub const CHUNK: usize = 64 << 10;

/// A request from the host.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Liveness check.
    Ping,
    /// Run `argv` (no shell unless argv asks for one), streaming its output.
    Exec {
        /// Program and arguments.
        argv: Vec<String>,
        /// The command's stdin is fed by `Stdin` frames that follow (else
        /// it reads /dev/null).
        #[serde(default)]
        stdin: bool,
        /// Kill the command after this many seconds (0: no limit).
        #[serde(default)]
        timeout_s: u64,
    },
    /// A chunk of the stream that follows `Exec { stdin: true }` or `Put`.
    Stdin {
        /// At most [`CHUNK`] bytes, base64.
        data: String,
    },
    /// End of that stream.
    StdinEnd,
    /// Write a file in the guest from the `Stdin` chunks that follow.
    Put {
        /// Guest path; an existing folder means `path/name`.
        path: String,
        /// Permission bits of the new file.
        mode: u32,
        /// File name to use when `path` is a folder.
        #[serde(default)]
        name: String,
    },
    /// Read a file of the guest.
    Get {
        /// Guest path.
        path: String,
    },
}

/// The agent's answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Response {
    /// Answer to `Ping`.
    Pong {
        /// Guest hostname.
        hostname: String,
        /// Seconds since guest boot.
        uptime_s: f64,
    },
    /// Output of a running command.
    Output {
        /// 1 for stdout, 2 for stderr.
        fd: u8,
        /// At most [`CHUNK`] bytes, base64.
        data: String,
    },
    /// A command ended: the last answer to `Exec`.
    Exited {
        /// Exit code, or 128 + signal when killed by a signal.
        code: i32,
        /// True when the timeout killed the command.
        timed_out: bool,
    },
    /// `Put`: the file is open; send its bytes.
    Ready {
        /// The path being written (the folder resolved).
        path: String,
    },
    /// `Get`: a chunk of the file.
    Data {
        /// At most [`CHUNK`] bytes, base64.
        data: String,
    },
    /// `Put` or `Get` finished.
    Done {
        /// The guest file.
        path: String,
        /// Bytes copied.
        bytes: u64,
        /// Its permission bits.
        mode: u32,
    },
    /// The request could not be carried out (bad frame, program or file not found).
    Error {
        /// What went wrong.
        message: String,
    },
}

/// A request or response with the id that pairs them: the agent echoes the
/// request's id, so a client can skip an answer left over from a client that
/// went away before reading it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Envelope<T> {
    /// Request id chosen by the host.
    pub id: u64,
    /// The message.
    #[serde(flatten)]
    pub body: T,
}

/// Base64 for binary fields.
pub fn b64_encode(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

/// Base64 decoding for binary fields.
pub fn b64_decode(s: &str) -> io::Result<Vec<u8>> {
    base64::engine::general_purpose::STANDARD.decode(s).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Writes one frame.
pub fn write_frame<W: Write, T: Serialize>(w: &mut W, msg: &T) -> io::Result<()> {
    let body = serde_json::to_vec(msg)?;
    let mut buf = Vec::with_capacity(4 + body.len());
    buf.extend_from_slice(&(body.len() as u32).to_le_bytes());
    buf.extend_from_slice(&body);
    w.write_all(&buf)?;
    w.flush()
}

/// Reads one frame. `Ok(None)` on a clean end of stream before a frame starts.
pub fn read_frame<R: Read, T: for<'de> Deserialize<'de>>(r: &mut R) -> io::Result<Option<T>> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut len[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {len} bytes is over the {MAX_FRAME}-byte limit"),
        ));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    serde_json::from_slice(&body).map(Some).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_roundtrip_and_oversize_is_refused() {
        let req = Request::Exec { argv: vec!["echo".into(), "hi".into()], stdin: true, timeout_s: 3 };
        let mut buf = Vec::new();
        write_frame(&mut buf, &req).unwrap();
        let back: Request = read_frame(&mut &buf[..]).unwrap().unwrap();
        assert_eq!(back, req);
        let empty: Option<Request> = read_frame(&mut &[][..]).unwrap();
        assert!(empty.is_none());
        let huge = ((MAX_FRAME + 1) as u32).to_le_bytes();
        assert!(read_frame::<_, Request>(&mut &huge[..]).is_err());
    }
}
