//! A blocking client for the link protocol: what an adapter uses to join the
//! hub, send writes and receive ordered deliveries.

use std::io::{self, BufWriter, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

use crate::link::{self, Msg};

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

/// Connects to the hub at `path` and joins it.
///
/// Returns the join answer, a reading half and a buffered writing half. Our
/// `Hello` was link frame 0: the next frame sent must carry link sequence 1
/// ([`link::write_stamped`]).
pub fn join(
    path: &Path,
    want_node: u16,
    page_size: u32,
    aspace_pages: u32,
    name: &str,
) -> io::Result<(Joined, UnixStream, BufWriter<UnixStream>)> {
    let mut stream = UnixStream::connect(path)?;
    stream.write_all(&Msg::Hello { want_node, page_size, aspace_pages, name }.encode())?;
    let mut buf = Vec::new();
    let hdr = link::read_frame(&mut stream, &mut buf)?;
    let joined = match Msg::parse(&hdr, &buf).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))? {
        Msg::Welcome { node, max_nodes, next_seq, members } => {
            Joined { node, max_nodes, next_seq, members, next_link_seq: hdr.link_seq.wrapping_add(1) }
        }
        Msg::Refuse { reason } => {
            return Err(io::Error::new(io::ErrorKind::ConnectionRefused, format!("hub refused: {reason}")))
        }
        other => return Err(io::Error::new(io::ErrorKind::InvalidData, format!("hub answered Hello with {other:?}"))),
    };
    let writer = BufWriter::with_capacity(64 * 1024, stream.try_clone()?);
    Ok((joined, stream, writer))
}
