//! A blocking client for the link protocol: what an adapter uses to join the
//! hub, send writes and receive ordered deliveries, over a Unix socket or
//! TCP (with the cluster secret).

use std::fmt;
use std::io::{self, BufWriter, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use link::{self as link, Msg, AUTH_LEN};

/// Where a hub listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HubAddr {
    /// A Unix socket path (`unix:PATH`, or any string without a scheme).
    Unix(PathBuf),
    /// A TCP address (`tcp:HOST:PORT`).
    Tcp(String),
}

/// Why a hub address does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddrError {
    /// `tcp:` without a `HOST:PORT` after it.
    #[error("'{0}' is not tcp:HOST:PORT")]
    NotHostPort(String),
    /// Nothing (or only `unix:`).
    #[error("empty hub address")]
    Empty,
}

impl HubAddr {
    /// Parses `unix:PATH`, `tcp:HOST:PORT` or a bare path.
    pub fn parse(s: &str) -> Result<HubAddr, AddrError> {
        if let Some(a) = s.strip_prefix("tcp:") {
            if a.rsplit_once(':').and_then(|(_, p)| p.parse::<u16>().ok()).is_none() {
                return Err(AddrError::NotHostPort(s.to_string()));
            }
            return Ok(HubAddr::Tcp(a.to_string()));
        }
        let p = s.strip_prefix("unix:").unwrap_or(s);
        if p.is_empty() {
            return Err(AddrError::Empty);
        }
        Ok(HubAddr::Unix(PathBuf::from(p)))
    }
}

impl fmt::Display for HubAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HubAddr::Unix(p) => write!(f, "unix:{}", p.display()),
            HubAddr::Tcp(a) => write!(f, "tcp:{a}"),
        }
    }
}

/// A connected link: Unix or TCP.
#[derive(Debug)]
pub enum Stream {
    /// Unix socket.
    Unix(UnixStream),
    /// TCP connection.
    Tcp(TcpStream),
}

impl Stream {
    /// Another handle to the same connection (one reads, one writes).
    pub fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
        })
    }

    /// Shuts both directions down: the peer and our own reader see the end.
    pub fn shutdown(&self) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.shutdown(std::net::Shutdown::Both),
            Stream::Tcp(s) => s.shutdown(std::net::Shutdown::Both),
        }
    }

    /// Sets how long a read may wait (None: for ever).
    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_read_timeout(t),
            Stream::Tcp(s) => s.set_read_timeout(t),
        }
    }

    /// Sets how long a write may wait (None: for ever).
    pub fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_write_timeout(t),
            Stream::Tcp(s) => s.set_write_timeout(t),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            Stream::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(buf),
            Stream::Tcp(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.flush(),
            Stream::Tcp(s) => s.flush(),
        }
    }
}

/// What the hub answered to our `Hello`.
#[derive(Debug, Clone)]
pub struct Joined {
    /// Our node id.
    pub node: u16,
    /// Ports on the hub.
    pub max_nodes: u16,
    /// Sequence number of the next ordered event.
    pub next_seq: u64,
    /// Nodes up when we joined, ourselves included.
    pub members: Vec<u16>,
    /// Link sequence number the hub's next frame must carry.
    pub next_link_seq: u16,
}

/// How long the hub may take to answer a `Hello`.
const JOIN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a TCP connect may take: past it the attempt is given up (the
/// caller retries), instead of waiting out the kernel's SYN retries (two
/// minutes) while the network to the hub is cut.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Connects to `addr` (`HOST:PORT`), each of its addresses in turn, with
/// [`CONNECT_TIMEOUT`].
fn connect_tcp(addr: &str) -> io::Result<TcpStream> {
    use std::net::ToSocketAddrs;
    let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{addr} has no address"));
    for a in addr.to_socket_addrs()? {
        match TcpStream::connect_timeout(&a, CONNECT_TIMEOUT) {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// How to introduce ourselves.
#[derive(Debug, Clone)]
pub struct Hello<'a> {
    /// Node id asked for, or `ANY_NODE`.
    pub want_node: u16,
    /// Page size in bytes.
    pub page_size: u32,
    /// Address space in pages.
    pub aspace_pages: u32,
    /// Name (logs, sticky node ids).
    pub name: &'a str,
    /// Cluster secret (required by TCP hubs).
    pub secret: Option<&'a [u8]>,
    /// Ask for a live link (`link` crate, "Liveness"): the caller then
    /// sends `Idle` frames when it has nothing else to send and takes a
    /// silent hub for gone.
    pub keepalive: bool,
}

/// Connects to the hub at `addr` and joins it.
///
/// Returns the join answer, a reading half and a buffered writing half. Our
/// `Hello` was link frame 0: the next frame sent must carry link sequence 1
/// ([`link::write_stamped`]).
pub fn join_addr(addr: &HubAddr, hello: &Hello<'_>) -> io::Result<(Joined, Stream, BufWriter<Stream>)> {
    let mut stream = match addr {
        HubAddr::Unix(p) => Stream::Unix(UnixStream::connect(p)?),
        HubAddr::Tcp(a) => {
            let s = connect_tcp(a)?;
            s.set_nodelay(true)?;
            Stream::Tcp(s)
        }
    };
    stream.set_read_timeout(Some(JOIN_TIMEOUT))?;
    let mut buf = Vec::new();
    let invalid = |e: String| io::Error::new(io::ErrorKind::InvalidData, e);
    let auth = match addr {
        HubAddr::Unix(_) => None,
        HubAddr::Tcp(_) => {
            let hdr = link::read_frame(&mut stream, &mut buf)?;
            let nonce: [u8; AUTH_LEN] = match Msg::parse(&hdr, &buf).map_err(|e| invalid(e.to_string()))? {
                Msg::Challenge { nonce } => nonce,
                Msg::Refuse { reason } => {
                    return Err(io::Error::new(io::ErrorKind::ConnectionRefused, format!("hub refused: {reason}")))
                }
                other => return Err(invalid(format!("hub opened with {other:?} instead of a challenge"))),
            };
            let secret = hello.secret.ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    "the hub at a TCP address needs the cluster secret (--secret-file)",
                )
            })?;
            Some(link::auth_tag(secret, &nonce))
        }
    };
    let h = Msg::Hello {
        want_node: hello.want_node,
        page_size: hello.page_size,
        aspace_pages: hello.aspace_pages,
        auth,
        name: hello.name,
        keepalive: hello.keepalive,
    };
    stream.write_all(&h.encode())?;
    let hdr = link::read_frame(&mut stream, &mut buf)?;
    let joined = match Msg::parse(&hdr, &buf).map_err(|e| invalid(e.to_string()))? {
        Msg::Welcome { node, max_nodes, next_seq, members } => {
            Joined { node, max_nodes, next_seq, members, next_link_seq: hdr.link_seq.wrapping_add(1) }
        }
        Msg::Refuse { reason } => {
            return Err(io::Error::new(io::ErrorKind::ConnectionRefused, format!("hub refused: {reason}")))
        }
        other => return Err(invalid(format!("hub answered Hello with {other:?}"))),
    };
    stream.set_read_timeout(None)?;
    let writer = BufWriter::with_capacity(64 * 1024, stream.try_clone()?);
    Ok((joined, stream, writer))
}

/// Joins the hub on the Unix socket at `path` (no authentication).
pub fn join(
    path: &Path,
    want_node: u16,
    page_size: u32,
    aspace_pages: u32,
    name: &str,
) -> io::Result<(Joined, UnixStream, BufWriter<UnixStream>)> {
    let hello = Hello { want_node, page_size, aspace_pages, name, secret: None, keepalive: false };
    let (joined, r, w) = join_addr(&HubAddr::Unix(path.to_path_buf()), &hello)?;
    let (Stream::Unix(r), Stream::Unix(w)) = (r, w.into_inner().map_err(|e| e.into_error())?) else {
        unreachable!("a Unix address gives Unix streams")
    };
    Ok((joined, r, BufWriter::with_capacity(64 * 1024, w)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse() {
        assert_eq!(HubAddr::parse("/run/hub.sock").unwrap(), HubAddr::Unix("/run/hub.sock".into()));
        assert_eq!(HubAddr::parse("unix:/x").unwrap(), HubAddr::Unix("/x".into()));
        assert_eq!(HubAddr::parse("tcp:127.0.0.1:7000").unwrap(), HubAddr::Tcp("127.0.0.1:7000".into()));
        assert_eq!(HubAddr::parse("tcp:127.0.0.1"), Err(AddrError::NotHostPort("tcp:127.0.0.1".into())));
        assert!(matches!(HubAddr::parse("tcp:host:notaport"), Err(AddrError::NotHostPort(_))));
        assert_eq!(HubAddr::parse(""), Err(AddrError::Empty));
        assert_eq!(HubAddr::parse("unix:"), Err(AddrError::Empty));
        assert_eq!(HubAddr::parse("tcp:[::1]:9").unwrap().to_string(), "tcp:[::1]:9");
    }
}
