//! The link protocol between an adapter (`mc-adapter`) and the hub (`mc-hub`).
//!
//! This module is the one definition both sides use: the frame layout, the
//! message kinds and their validation. It owns no sockets; callers read a
//! [`HEADER_LEN`]-byte header, [`Header::parse`] it, read `len` payload bytes
//! and hand both to [`Msg::parse`]. Nothing in a frame is trusted before it
//! has been validated here.
//!
//! # Frame
//!
//! ```text
//!  0               4       5       6               8              12              16
//! +---------------+-------+-------+---------------+---------------+---------------+
//! | magic "MCLK"  | ver=1 | kind  | link seq      | payload len   | CRC-32 payload|
//! +---------------+-------+-------+---------------+---------------+---------------+
//! | payload (len bytes, little-endian fields, layout per kind)                    |
//! ```
//!
//! `link seq` counts the frames one side has sent on this connection, from 0
//! (the `Hello` or `Welcome`), wrapping at 2^16. The sender stamps it as the
//! frame goes out ([`write_stamped`]), so one encoded frame can be shared by
//! every receiver; the receiver checks it, so a lost frame on a link is
//! detected even though a node does not see every number of the global order.
//!
//! The CRC covers the payload. A receiver that finds a bad CRC on a `Deliver`
//! counts a CRC error and does not apply the data (the hub can corrupt frames
//! on purpose to test this); a bad CRC on anything else ends the link.
//!
//! # Kinds
//!
//! | kind | dir | payload |
//! |------|-----|---------|
//! | 7 `Challenge` | H→A | nonce [u8; 32] (TCP only: sent first, before the adapter's `Hello`) |
//! | 1 `Hello`   | A→H | want_node u16, flags u16 (bit 0: auth present), page_size u32, aspace_pages u32, auth [u8; 32], name (≤ 64 bytes UTF-8) |
//! | 2 `Welcome` | H→A | node u16, max_nodes u16, reserved u32, next_seq u64, members: u16 each |
//! | 3 `Write`   | A→H | dest u16 (0xFFFF = broadcast), flags u16, reserved u32, addr u64, data |
//! | 4 `Deliver` | H→A | seq u64, src u16, flags u16, reserved u32, addr u64, data |
//! | 5 `Member`  | H→A | seq u64, node u16, up u8, reserved [u8; 5] |
//! | 6 `Refuse`  | H→A | reason (UTF-8), then the hub closes the link |
//! | 8 `Idle`    | both | empty: "the link is alive" (see Liveness) |
//!
//! `data` is 1 to [`MAX_DATA`] bytes, a multiple of 4 bytes is not required.
//!
//! # Liveness
//!
//! An adapter that sets `Hello` flag bit 1 ([`HELLO_KEEPALIVE`]) asks for
//! a live link: from then on each side sends an `Idle` frame whenever it
//! has sent nothing for [`IDLE_EVERY_MS`], and a side that has received
//! nothing for [`DEAD_AFTER_MS`] takes the link for dead and closes it (the
//! hub announces the node gone; the adapter sees its link down and
//! rejoins). Over TCP this turns a partition, which TCP alone would hide
//! for as long as it lasts, into a link that goes down: shorter silences
//! (TCP retransmits within about 1.5 s of a 1 s outage) are ridden out
//! with nothing lost. Without the flag (older or simpler peers) no `Idle`
//! is sent and silence is never held against the link.
//!
//! # Authentication (TCP)
//!
//! On TCP the hub speaks first: a `Challenge` with 32 random bytes. The
//! adapter answers with a `Hello` whose `auth` is
//! HMAC-SHA256(cluster secret, "mc-link-v1" ‖ nonce) ([`auth_tag`]); the
//! secret itself never crosses the wire. A wrong or missing tag is refused.
//! Unix sockets rely on file permissions and carry no authentication.

use thiserror::Error;

/// Frame magic: ASCII "MCLK" read as a little-endian u32.
pub const MAGIC: u32 = u32::from_le_bytes(*b"MCLK");
/// Protocol version spoken by this build. Peers with another version are refused.
pub const VERSION: u8 = 1;
/// Bytes in a frame header.
pub const HEADER_LEN: usize = 16;
/// Largest data payload of one `Write` or `Deliver`: one MEMORY CHANNEL page.
/// The adapter never coalesces across a page boundary, so a page bounds it.
pub const MAX_DATA: usize = 8192;
/// Largest node name in `Hello`.
pub const MAX_NAME: usize = 64;
/// Most nodes a hub can be configured for (ids 0..MAX_NODES).
pub const MAX_NODES: usize = 1024;
/// Largest payload of any frame. `Welcome` with [`MAX_NODES`] members is the
/// biggest control frame; data frames are bounded by [`MAX_DATA`].
pub const MAX_PAYLOAD: usize = 24 + MAX_DATA;
/// Bytes of a challenge nonce and of an authenticator.
pub const AUTH_LEN: usize = 32;
/// Domain separation for [`auth_tag`].
const AUTH_CONTEXT: &[u8] = b"mc-link-v1";
const HELLO_FIXED: usize = 12 + AUTH_LEN;
/// Largest payload of a valid `Hello` (with the longest name): a peer that
/// announces more is not saying `Hello`, and is not given a bigger buffer.
pub const MAX_HELLO: usize = HELLO_FIXED + MAX_NAME;

/// The authenticator an adapter sends for `nonce`.
pub fn auth_tag(secret: &[u8], nonce: &[u8; AUTH_LEN]) -> [u8; AUTH_LEN] {
    use hmac::Mac;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(AUTH_CONTEXT);
    mac.update(nonce);
    mac.finalize().into_bytes().into()
}

/// Checks an authenticator in constant time.
pub fn auth_ok(secret: &[u8], nonce: &[u8; AUTH_LEN], tag: &[u8; AUTH_LEN]) -> bool {
    use hmac::Mac;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(AUTH_CONTEXT);
    mac.update(nonce);
    mac.verify_slice(tag).is_ok()
}

/// `Hello` flag: the adapter asks for a live link (module doc, "Liveness").
pub const HELLO_KEEPALIVE: u16 = 1 << 1;
/// `Hello` flag: an authenticator is present.
const HELLO_AUTH: u16 = 1 << 0;
/// A side of a live link sends `Idle` after this long without sending.
pub const IDLE_EVERY_MS: u64 = 250;
/// A side of a live link that has received nothing for this long closes it.
pub const DEAD_AFTER_MS: u64 = 3000;

/// `dest` value of a broadcast write (the original shared bus).
pub const BROADCAST: u16 = 0xFFFF;
/// `want_node` value in `Hello` when any free node id will do.
pub const ANY_NODE: u16 = 0xFFFF;

/// `Write`/`Deliver` flag: the sender also receives its own write (loopback).
pub const FLAG_LOOPBACK: u16 = 1 << 0;
/// `Write`/`Deliver` flag: a store to an ACK page; receivers answer with
/// their error status instead of applying the data.
pub const FLAG_ACK: u16 = 1 << 1;
/// `Write`/`Deliver` flag: an answer to an ACK store (one byte at
/// `page base + replying node`), sent point-to-point to the ACK's sender.
pub const FLAG_ACK_REPLY: u16 = 1 << 2;

/// Errors found while decoding a frame. Every one of them means the peer is
/// broken or hostile: the link is closed and the reason logged.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum LinkError {
    /// The first four bytes are not "MCLK".
    #[error("bad magic {0:#010x}: not a MEMORY CHANNEL link")]
    BadMagic(u32),
    /// The peer speaks another protocol version.
    #[error("protocol version {0} not supported (this side speaks {VERSION})")]
    BadVersion(u8),
    /// Unknown message kind.
    #[error("unknown frame kind {0}")]
    BadKind(u8),
    /// The payload length is over the limit or wrong for the kind.
    #[error("bad payload length {len} for {kind}")]
    BadLength {
        /// Message kind name.
        kind: &'static str,
        /// Length found.
        len: usize,
    },
    /// CRC-32 of the payload does not match the header.
    #[error("payload CRC mismatch")]
    BadCrc,
    /// A field has a value outside its range.
    #[error("bad field: {0}")]
    BadField(&'static str),
}

/// Message kinds on the wire. `Kind::try_from(u8)` refuses unknown kinds
/// with [`LinkError::BadKind`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, num_enum::TryFromPrimitive)]
#[num_enum(error_type(name = LinkError, constructor = LinkError::BadKind))]
#[repr(u8)]
pub enum Kind {
    /// Adapter introduces itself.
    Hello = 1,
    /// Hub accepts an adapter and tells it its node id.
    Welcome = 2,
    /// Adapter sends a write into the global order.
    Write = 3,
    /// Hub delivers an ordered write.
    Deliver = 4,
    /// Hub announces a node joining or leaving.
    Member = 5,
    /// Hub refuses the adapter and closes.
    Refuse = 6,
    /// Hub's authentication challenge (TCP).
    Challenge = 7,
    /// Either side: the link is alive (sent only on live links).
    Idle = 8,
}

/// A validated frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Message kind.
    pub kind: Kind,
    /// Payload length in bytes (already checked against [`MAX_PAYLOAD`]).
    pub len: usize,
    /// Per-connection frame counter (see the module doc).
    pub link_seq: u16,
    /// CRC-32 of the payload as sent.
    pub crc: u32,
}

impl Header {
    /// Validates and decodes a header. The payload is checked later by [`Msg::parse`].
    pub fn parse(b: &[u8; HEADER_LEN]) -> Result<Header, LinkError> {
        let magic = u32::from_le_bytes(b[0..4].try_into().unwrap());
        if magic != MAGIC {
            return Err(LinkError::BadMagic(magic));
        }
        if b[4] != VERSION {
            return Err(LinkError::BadVersion(b[4]));
        }
        let kind = Kind::try_from(b[5])?;
        let link_seq = u16::from_le_bytes([b[6], b[7]]);
        let len = u32::from_le_bytes(b[8..12].try_into().unwrap()) as usize;
        if len > MAX_PAYLOAD {
            return Err(LinkError::BadLength { kind: kind.name(), len });
        }
        let crc = u32::from_le_bytes(b[12..16].try_into().unwrap());
        Ok(Header { kind, len, link_seq, crc })
    }
}

impl Kind {
    /// Human name for logs.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Hello => "Hello",
            Kind::Welcome => "Welcome",
            Kind::Write => "Write",
            Kind::Deliver => "Deliver",
            Kind::Member => "Member",
            Kind::Refuse => "Refuse",
            Kind::Challenge => "Challenge",
            Kind::Idle => "Idle",
        }
    }
}

/// A decoded message. Data-carrying variants borrow the payload buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg<'a> {
    /// See the module table.
    Hello {
        /// Node id asked for, or [`ANY_NODE`].
        want_node: u16,
        /// Adapter page size in bytes.
        page_size: u32,
        /// Adapter address space in pages.
        aspace_pages: u32,
        /// Authenticator (see the module doc), when the hub challenged.
        auth: Option<[u8; AUTH_LEN]>,
        /// Free-form node name (for logs and stable ids).
        name: &'a str,
        /// The adapter asks for a live link ([`HELLO_KEEPALIVE`]).
        keepalive: bool,
    },
    /// See the module table.
    Welcome {
        /// Node id given to this adapter.
        node: u16,
        /// Ports on this hub.
        max_nodes: u16,
        /// Sequence number the next ordered event will carry.
        next_seq: u64,
        /// Nodes up at the time of joining (this one included).
        members: Vec<u16>,
    },
    /// See the module table.
    Write {
        /// Destination node or [`BROADCAST`].
        dest: u16,
        /// `FLAG_*` bits.
        flags: u16,
        /// Global MEMORY CHANNEL address.
        addr: u64,
        /// Bytes written.
        data: &'a [u8],
    },
    /// See the module table.
    Deliver {
        /// Position in the global order.
        seq: u64,
        /// Node that wrote.
        src: u16,
        /// `FLAG_*` bits.
        flags: u16,
        /// Global MEMORY CHANNEL address.
        addr: u64,
        /// Bytes written.
        data: &'a [u8],
    },
    /// See the module table.
    Member {
        /// Position in the global order.
        seq: u64,
        /// Node concerned.
        node: u16,
        /// True when it joined, false when its link went down.
        up: bool,
    },
    /// See the module table.
    Refuse {
        /// Why.
        reason: &'a str,
    },
    /// See the module table.
    Challenge {
        /// Random bytes to authenticate against.
        nonce: [u8; AUTH_LEN],
    },
    /// See the module table.
    Idle,
}

fn u16_at(p: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([p[o], p[o + 1]])
}
fn u32_at(p: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(p[o..o + 4].try_into().unwrap())
}
fn u64_at(p: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(p[o..o + 8].try_into().unwrap())
}

impl<'a> Msg<'a> {
    /// Validates `payload` against `hdr` (length, CRC, field ranges) and decodes it.
    pub fn parse(hdr: &Header, payload: &'a [u8]) -> Result<Msg<'a>, LinkError> {
        let len = payload.len();
        let bad_len = || LinkError::BadLength { kind: hdr.kind.name(), len };
        if len != hdr.len {
            return Err(bad_len());
        }
        if crc32fast::hash(payload) != hdr.crc {
            return Err(LinkError::BadCrc);
        }
        let p = payload;
        Ok(match hdr.kind {
            Kind::Hello => {
                if !(HELLO_FIXED..=HELLO_FIXED + MAX_NAME).contains(&len) {
                    return Err(bad_len());
                }
                let name = std::str::from_utf8(&p[HELLO_FIXED..])
                    .map_err(|_| LinkError::BadField("node name is not UTF-8"))?;
                let page_size = u32_at(p, 4);
                if !page_size.is_power_of_two() || page_size < 4096 {
                    return Err(LinkError::BadField("page size"));
                }
                let flags = u16_at(p, 2);
                if flags & !(HELLO_AUTH | HELLO_KEEPALIVE) != 0 {
                    return Err(LinkError::BadField("Hello flags"));
                }
                let auth = (flags & HELLO_AUTH != 0).then(|| p[12..HELLO_FIXED].try_into().unwrap());
                let keepalive = flags & HELLO_KEEPALIVE != 0;
                Msg::Hello { want_node: u16_at(p, 0), page_size, aspace_pages: u32_at(p, 8), auth, name, keepalive }
            }
            Kind::Challenge => {
                if len != AUTH_LEN {
                    return Err(bad_len());
                }
                Msg::Challenge { nonce: p.try_into().unwrap() }
            }
            Kind::Welcome => {
                if len < 16 || (len - 16) % 2 != 0 || (len - 16) / 2 > MAX_NODES {
                    return Err(bad_len());
                }
                let members = p[16..].chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
                Msg::Welcome { node: u16_at(p, 0), max_nodes: u16_at(p, 2), next_seq: u64_at(p, 8), members }
            }
            Kind::Write => {
                if len <= 16 || len - 16 > MAX_DATA {
                    return Err(bad_len());
                }
                Msg::Write { dest: u16_at(p, 0), flags: u16_at(p, 2), addr: u64_at(p, 8), data: &p[16..] }
            }
            Kind::Deliver => {
                if len <= 24 || len - 24 > MAX_DATA {
                    return Err(bad_len());
                }
                Msg::Deliver {
                    seq: u64_at(p, 0),
                    src: u16_at(p, 8),
                    flags: u16_at(p, 10),
                    addr: u64_at(p, 16),
                    data: &p[24..],
                }
            }
            Kind::Member => {
                if len != 16 {
                    return Err(bad_len());
                }
                let up = match p[10] {
                    0 => false,
                    1 => true,
                    _ => return Err(LinkError::BadField("member state")),
                };
                Msg::Member { seq: u64_at(p, 0), node: u16_at(p, 8), up }
            }
            Kind::Refuse => {
                if len > 512 {
                    return Err(bad_len());
                }
                Msg::Refuse { reason: std::str::from_utf8(p).unwrap_or("(reason not UTF-8)") }
            }
            Kind::Idle => {
                if len != 0 {
                    return Err(bad_len());
                }
                Msg::Idle
            }
        })
    }

    /// Encodes the message as a complete frame (header and payload).
    pub fn encode(&self) -> Vec<u8> {
        let data_len = match self {
            Msg::Write { data, .. } | Msg::Deliver { data, .. } => data.len(),
            _ => 0,
        };
        // One allocation: the hub encodes every ordered write it sends on.
        let mut out = Vec::with_capacity(HEADER_LEN + 24 + data_len.max(MAX_NAME + HELLO_FIXED));
        out.extend_from_slice(&[0u8; HEADER_LEN]);
        let kind = match self {
            Msg::Hello { want_node, page_size, aspace_pages, auth, name, keepalive } => {
                let flags = if auth.is_some() { HELLO_AUTH } else { 0 } | if *keepalive { HELLO_KEEPALIVE } else { 0 };
                out.extend_from_slice(&want_node.to_le_bytes());
                out.extend_from_slice(&flags.to_le_bytes());
                out.extend_from_slice(&page_size.to_le_bytes());
                out.extend_from_slice(&aspace_pages.to_le_bytes());
                out.extend_from_slice(&auth.unwrap_or([0; AUTH_LEN]));
                let n = name.as_bytes();
                out.extend_from_slice(&n[..n.len().min(MAX_NAME)]);
                Kind::Hello
            }
            Msg::Welcome { node, max_nodes, next_seq, members } => {
                out.extend_from_slice(&node.to_le_bytes());
                out.extend_from_slice(&max_nodes.to_le_bytes());
                out.extend_from_slice(&[0; 4]);
                out.extend_from_slice(&next_seq.to_le_bytes());
                for m in members.iter().take(MAX_NODES) {
                    out.extend_from_slice(&m.to_le_bytes());
                }
                Kind::Welcome
            }
            Msg::Write { dest, flags, addr, data } => {
                out.extend_from_slice(&dest.to_le_bytes());
                out.extend_from_slice(&flags.to_le_bytes());
                out.extend_from_slice(&[0; 4]);
                out.extend_from_slice(&addr.to_le_bytes());
                out.extend_from_slice(data);
                Kind::Write
            }
            Msg::Deliver { seq, src, flags, addr, data } => {
                out.extend_from_slice(&seq.to_le_bytes());
                out.extend_from_slice(&src.to_le_bytes());
                out.extend_from_slice(&flags.to_le_bytes());
                out.extend_from_slice(&[0; 4]);
                out.extend_from_slice(&addr.to_le_bytes());
                out.extend_from_slice(data);
                Kind::Deliver
            }
            Msg::Member { seq, node, up } => {
                out.extend_from_slice(&seq.to_le_bytes());
                out.extend_from_slice(&node.to_le_bytes());
                out.extend_from_slice(&[*up as u8, 0, 0, 0, 0, 0]);
                Kind::Member
            }
            Msg::Refuse { reason } => {
                let r = reason.as_bytes();
                out.extend_from_slice(&r[..r.len().min(512)]);
                Kind::Refuse
            }
            Msg::Challenge { nonce } => {
                out.extend_from_slice(nonce);
                Kind::Challenge
            }
            Msg::Idle => Kind::Idle,
        };
        seal(&mut out, kind);
        out
    }
}

/// Fills in the header of a frame whose payload already follows
/// [`HEADER_LEN`] placeholder bytes.
pub fn seal(frame: &mut [u8], kind: Kind) {
    let len = frame.len() - HEADER_LEN;
    let crc = crc32fast::hash(&frame[HEADER_LEN..]);
    frame[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    frame[4] = VERSION;
    frame[5] = kind as u8;
    frame[6..8].copy_from_slice(&0u16.to_le_bytes());
    frame[8..12].copy_from_slice(&(len as u32).to_le_bytes());
    frame[12..16].copy_from_slice(&crc.to_le_bytes());
}

/// Writes `frame` with its link sequence number set to `seq`, without
/// copying or modifying the (possibly shared) frame.
pub fn write_stamped<W: std::io::Write>(w: &mut W, frame: &[u8], seq: u16) -> std::io::Result<()> {
    w.write_all(&frame[..6])?;
    w.write_all(&seq.to_le_bytes())?;
    w.write_all(&frame[8..])
}

/// Checks a received frame's link sequence number against the expected one
/// and advances it. Returns how many frames were lost (0 when in order).
pub fn check_link_seq(expected: &mut u16, got: u16) -> u16 {
    let lost = got.wrapping_sub(*expected);
    *expected = got.wrapping_add(1);
    lost
}

/// Reads one frame from a blocking reader into `buf` and returns its header.
/// `buf` is reused by the caller to avoid an allocation per frame.
pub fn read_frame<R: std::io::Read>(r: &mut R, buf: &mut Vec<u8>) -> std::io::Result<Header> {
    let mut h = [0u8; HEADER_LEN];
    r.read_exact(&mut h)?;
    let hdr = Header::parse(&h).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    buf.resize(hdr.len, 0);
    r.read_exact(buf)?;
    Ok(hdr)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(m: Msg<'_>) {
        let f = m.encode();
        let h = Header::parse(f[..HEADER_LEN].try_into().unwrap()).unwrap();
        assert_eq!(Msg::parse(&h, &f[HEADER_LEN..]).unwrap(), m);
    }

    #[test]
    fn every_kind_roundtrips() {
        roundtrip(Msg::Hello {
            want_node: 3,
            page_size: 8192,
            aspace_pages: 65536,
            auth: None,
            name: "node3",
            keepalive: false,
        });
        roundtrip(Msg::Hello {
            want_node: 3,
            page_size: 8192,
            aspace_pages: 8,
            auth: Some([7; AUTH_LEN]),
            name: "",
            keepalive: true,
        });
        roundtrip(Msg::Idle);
        roundtrip(Msg::Challenge { nonce: [9; AUTH_LEN] });
        roundtrip(Msg::Welcome { node: 2, max_nodes: 8, next_seq: 77, members: vec![0, 2, 5] });
        roundtrip(Msg::Write { dest: BROADCAST, flags: FLAG_LOOPBACK, addr: 0x1234, data: &[1, 2, 3, 4] });
        roundtrip(Msg::Deliver { seq: 9, src: 1, flags: 0, addr: 0x2000, data: &[9; 100] });
        roundtrip(Msg::Member { seq: 10, node: 4, up: false });
        roundtrip(Msg::Refuse { reason: "full" });
    }

    #[test]
    fn garbage_is_rejected() {
        let mut f = Msg::Write { dest: 0, flags: 0, addr: 0, data: &[1; 8] }.encode();
        let mut h: [u8; HEADER_LEN] = f[..HEADER_LEN].try_into().unwrap();
        h[0] ^= 1;
        assert!(matches!(Header::parse(&h), Err(LinkError::BadMagic(_))));
        h[0] ^= 1;
        h[4] = 9;
        assert_eq!(Header::parse(&h), Err(LinkError::BadVersion(9)));
        h[4] = VERSION;
        h[5] = 42;
        assert_eq!(Header::parse(&h), Err(LinkError::BadKind(42)));
        h[5] = Kind::Write as u8;
        // bytes 6-7 are the link sequence: any value parses
        h[6] = 0xAB;
        assert_eq!(Header::parse(&h).unwrap().link_seq, 0xAB);
        h[8..12].copy_from_slice(&(MAX_PAYLOAD as u32 + 1).to_le_bytes());
        assert!(matches!(Header::parse(&h), Err(LinkError::BadLength { .. })));
        // corrupt payload: CRC catches it
        let hdr = Header::parse(f[..HEADER_LEN].try_into().unwrap()).unwrap();
        f[HEADER_LEN + 20] ^= 0x80;
        assert_eq!(Msg::parse(&hdr, &f[HEADER_LEN..]), Err(LinkError::BadCrc));
    }

    #[test]
    fn auth_tags_depend_on_secret_and_nonce() {
        let n1 = [1u8; AUTH_LEN];
        let n2 = [2u8; AUTH_LEN];
        let t = auth_tag(b"secret", &n1);
        assert!(auth_ok(b"secret", &n1, &t));
        assert!(!auth_ok(b"secreT", &n1, &t));
        assert!(!auth_ok(b"secret", &n2, &t));
        assert_ne!(auth_tag(b"secret", &n2), t);
    }

    #[test]
    fn link_seq_stamping_and_checking() {
        let f = Msg::Write { dest: 0, flags: 0, addr: 8, data: &[1; 8] }.encode();
        let mut out = Vec::new();
        write_stamped(&mut out, &f, 0xFFFF).unwrap();
        let h = Header::parse(out[..HEADER_LEN].try_into().unwrap()).unwrap();
        assert_eq!(h.link_seq, 0xFFFF);
        assert!(Msg::parse(&h, &out[HEADER_LEN..]).is_ok(), "stamping leaves the CRC valid");
        let mut expect = 0xFFFF;
        assert_eq!(check_link_seq(&mut expect, 0xFFFF), 0);
        assert_eq!(expect, 0, "wraps");
        assert_eq!(check_link_seq(&mut expect, 3), 3, "frames 0, 1, 2 lost");
        assert_eq!(expect, 4);
    }

    #[test]
    fn empty_and_oversized_writes_are_rejected() {
        let mut f = vec![0u8; HEADER_LEN + 16];
        seal(&mut f, Kind::Write);
        let h = Header::parse(f[..HEADER_LEN].try_into().unwrap()).unwrap();
        assert!(matches!(Msg::parse(&h, &f[HEADER_LEN..]), Err(LinkError::BadLength { .. })));
        let mut f = vec![0u8; HEADER_LEN + 16 + MAX_DATA + 1];
        seal(&mut f, Kind::Write);
        let h = Header::parse(f[..HEADER_LEN].try_into().unwrap()).unwrap();
        assert!(matches!(Msg::parse(&h, &f[HEADER_LEN..]), Err(LinkError::BadLength { .. })));
    }
}
