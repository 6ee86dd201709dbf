//! The host ⇄ guest agent protocol, shared by `mc-agent` (in the guest) and
//! `mc-cluster` (on the host).
//!
//! Transport: a virtio-serial port named [`PORT_NAME`], a Unix socket on the
//! host side. Framing: a little-endian u32 length, then that many bytes of
//! JSON ([`Request`] host→guest, [`Response`] guest→host). One request at a
//! time; the agent answers each before reading the next.
#![warn(missing_docs)]

use std::io::{self, Read, Write};

use base64::Engine;
use serde::{Deserialize, Serialize};

/// Name of the virtio-serial port (`-device virtserialport,name=…`).
pub const PORT_NAME: &str = "mc.agent";
/// Largest frame either side accepts: bounds memory on a corrupt length.
pub const MAX_FRAME: usize = 64 << 20;
/// Most bytes of stdout or stderr returned per command; the rest is cut and flagged.
pub const MAX_OUTPUT: usize = 16 << 20;

/// A request from the host.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Liveness check.
    Ping,
    /// Run `argv` (no shell unless argv asks for one) and return its result.
    Exec {
        /// Program and arguments.
        argv: Vec<String>,
        /// Bytes for stdin, base64.
        #[serde(default)]
        stdin: String,
        /// Kill the command after this many seconds (0: no limit).
        #[serde(default)]
        timeout_s: u64,
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
    /// Answer to `Exec`.
    Exited {
        /// Exit code, or 128 + signal when killed by a signal.
        code: i32,
        /// stdout, base64.
        stdout: String,
        /// stderr, base64.
        stderr: String,
        /// True when the timeout killed the command.
        timed_out: bool,
    },
    /// The request could not be carried out (bad frame, program not found).
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
        let req = Request::Exec { argv: vec!["echo".into(), "hi".into()], stdin: b64_encode(b"x"), timeout_s: 3 };
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
