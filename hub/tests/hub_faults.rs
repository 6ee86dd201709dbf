//! The hub with raw link clients: point-to-point delivery, dropped writes,
//! nodes failing and joining late, and the per-connection link sequence.

use std::io::{self, BufWriter, Read, Write};
use std::os::unix::net::UnixStream;

use std::time::Duration;

use device::link_client::{self as client, Joined};

use link::{self as link, Msg, ANY_NODE, BROADCAST, FLAG_LOOPBACK};

const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// How long "nothing arrives" is watched for.
const QUIET: Duration = Duration::from_millis(300);

use hub::testing::{read_event, Seen, TestHub as Hub};

/// A link client that stamps its frames and checks the hub's link sequence.
struct Client {
    joined: Joined,
    r: UnixStream,
    w: BufWriter<UnixStream>,
    /// Link sequence number of our next frame (the Hello was 0).
    tx_seq: u16,
    /// Link sequence number the hub's next frame must carry.
    rx_seq: u16,
    buf: Vec<u8>,
}

impl Client {
    fn join(hub: &Hub, name: &str) -> Client {
        let (joined, r, w) = client::join(&hub.path, ANY_NODE, 8192, 128, name).expect("join");
        r.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        assert_eq!(joined.next_link_seq, 1, "{name}: the Welcome is not link frame 0");
        let rx_seq = joined.next_link_seq;
        Client { joined, r, w, tx_seq: 1, rx_seq, buf: Vec::new() }
    }

    fn node(&self) -> u16 {
        self.joined.node
    }

    /// Sends a frame stamped with link sequence `seq`.
    fn send_stamped(&mut self, m: &Msg<'_>, seq: u16) {
        link::write_stamped(&mut self.w, &m.encode(), seq).unwrap();
        self.w.flush().unwrap();
        self.tx_seq = seq.wrapping_add(1);
    }

    fn write(&mut self, dest: u16, flags: u16, addr: u64, data: &[u8]) {
        self.send_stamped(&Msg::Write { dest, flags, addr, data }, self.tx_seq);
    }

    /// The next frame, which must carry the next link sequence number.
    fn recv(&mut self) -> Seen {
        let (link_seq, seen) = read_event(&mut self.r, &mut self.buf);
        assert_eq!(link_seq, self.rx_seq, "node {}: link sequence", self.node());
        self.rx_seq = self.rx_seq.wrapping_add(1);
        seen
    }

    /// Asserts that nothing arrives for [`QUIET`].
    fn assert_quiet(&mut self) {
        self.r.set_read_timeout(Some(QUIET)).unwrap();
        let mut one = [0u8; 1];
        match self.r.read(&mut one) {
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
            other => panic!("node {} received something: {other:?}", self.node()),
        }
        self.r.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    }
}

fn member(seq: u64, node: u16, up: bool) -> Seen {
    Seen::Member { seq, node, up }
}

fn deliver(seq: u64, src: u16, flags: u16, addr: u64, data: &[u8]) -> Seen {
    Seen::Deliver { seq, src, flags, addr, data: data.to_vec() }
}

/// Three clients joined one after the other, their join announcements consumed.
fn three(hub: &Hub) -> (Client, Client, Client) {
    let mut a = Client::join(hub, "a");
    let mut b = Client::join(hub, "b");
    let c = Client::join(hub, "c");
    assert_eq!((a.node(), b.node(), c.node()), (0, 1, 2));
    let s = a.joined.next_seq;
    assert_eq!(a.recv(), member(s, 1, true));
    assert_eq!(a.recv(), member(s + 1, 2, true));
    assert_eq!(b.recv(), member(s + 1, 2, true));
    assert_eq!(c.joined.next_seq, s + 2);
    (a, b, c)
}

#[test]
fn hub_point_to_point_delivers_only_to_destination() {
    let hub = Hub::start();
    let (mut a, mut b, mut c) = three(&hub);
    let s = c.joined.next_seq;

    a.write(c.node(), 0, 0x100, b"for-c-only");
    assert_eq!(c.recv(), deliver(s, 0, 0, 0x100, b"for-c-only"));
    b.assert_quiet();
    a.assert_quiet();

    // Node 200 on an 8-port hub: dropped and counted; the link stays up.
    a.write(200, 0, 0x200, b"nowhere");
    a.write(BROADCAST, 0, 0x300, b"everyone");
    // The dropped write took no place in the order: the broadcast is next,
    // and it is the first thing B gets.
    assert_eq!(b.recv(), deliver(s + 1, 0, 0, 0x300, b"everyone"));
    assert_eq!(c.recv(), deliver(s + 1, 0, 0, 0x300, b"everyone"));
    let sa = hub.node_stats(0);
    assert_eq!((sa.dropped, sa.writes_in, sa.bytes_in), (1, 2, 10 + 8));
    // Frames queued: B had C's join and the broadcast, C the two writes.
    assert_eq!(hub.node_stats(1).frames_out, 2);
    assert_eq!(hub.node_stats(2).frames_out, 2);
    assert_eq!(hub.node_stats(1).dropped, 0);

    // A still receives too.
    c.write(a.node(), 0, 0x400, b"back");
    assert_eq!(a.recv(), deliver(s + 2, 2, 0, 0x400, b"back"));
    b.assert_quiet();
    c.assert_quiet();
}

#[test]
fn hub_announces_node_failure() {
    let hub = Hub::start();
    let (mut a, mut b, mut c) = three(&hub);
    let s = c.joined.next_seq;

    a.write(BROADCAST, FLAG_LOOPBACK, 0x10, b"before");
    let w1 = deliver(s, 0, FLAG_LOOPBACK, 0x10, b"before");
    assert_eq!(c.recv(), w1);
    assert_eq!(a.recv(), w1);
    assert_eq!(b.recv(), w1);

    // C dies in the middle of sending a frame.
    let half = Msg::Write { dest: BROADCAST, flags: 0, addr: 0x20, data: b"never delivered" }.encode();
    link::write_stamped(&mut c.w, &half[..20], c.tx_seq).unwrap_or(());
    c.w.flush().unwrap();
    drop(c);

    let gone = member(s + 1, 2, false);
    assert_eq!(a.recv(), gone);
    assert_eq!(b.recv(), gone);
    a.write(BROADCAST, FLAG_LOOPBACK, 0x30, b"after");
    let w2 = deliver(s + 2, 0, FLAG_LOOPBACK, 0x30, b"after");
    assert_eq!(a.recv(), w2);
    assert_eq!(b.recv(), w2);
    assert_eq!(hub.stats().iter().map(|n| n.node).collect::<Vec<_>>(), vec![0, 1]);

    // Its port is free again: the next node gets it, and is announced in order.
    let d = Client::join(&hub, "d");
    assert_eq!(d.node(), 2);
    assert_eq!(d.joined.members, vec![0, 1, 2]);
    assert_eq!(d.joined.next_seq, s + 4);
    assert_eq!(a.recv(), member(s + 3, 2, true));
    assert_eq!(b.recv(), member(s + 3, 2, true));
    a.assert_quiet();
}

#[test]
fn hub_late_join_learns_membership() {
    let hub = Hub::start();
    let mut a = Client::join(&hub, "a");
    assert_eq!((a.node(), a.joined.members.clone(), a.joined.max_nodes), (0, vec![0], 8));
    let mut b = Client::join(&hub, "b");
    assert_eq!((b.node(), b.joined.members.clone()), (1, vec![0, 1]));
    assert_eq!(a.recv(), member(a.joined.next_seq, 1, true));
    assert_eq!(b.joined.next_seq, a.joined.next_seq + 1);

    // Writes before C joined are not C's to see.
    a.write(BROADCAST, 0, 0x40, b"early");
    assert_eq!(b.recv(), deliver(b.joined.next_seq, 0, 0, 0x40, b"early"));

    let mut c = Client::join(&hub, "c");
    assert_eq!(c.node(), 2);
    assert_eq!(c.joined.members, vec![0, 1, 2]);
    let joined_at = c.joined.next_seq - 1;
    assert_eq!(joined_at, b.joined.next_seq + 1);
    assert_eq!(a.recv(), member(joined_at, 2, true));
    assert_eq!(b.recv(), member(joined_at, 2, true));

    // C's first event is the first one after its join.
    b.write(BROADCAST, 0, 0x50, b"late");
    assert_eq!(c.recv(), deliver(c.joined.next_seq, 1, 0, 0x50, b"late"));
    assert_eq!(a.recv(), deliver(c.joined.next_seq, 1, 0, 0x50, b"late"));
    c.assert_quiet();
}

#[test]
fn hub_link_seq_counts_frames() {
    let hub = Hub::start();
    // Client::join checks the Welcome was link frame 0; recv checks every
    // later frame carries the next number.
    let mut a = Client::join(&hub, "a");
    let mut b = Client::join(&hub, "b");
    assert!(matches!(a.recv(), Seen::Member { node: 1, up: true, .. }));
    assert_eq!(a.rx_seq, 2);
    for i in 0..5u64 {
        b.write(a.node(), 0, 8 * i, &i.to_le_bytes());
    }
    for i in 0..5u64 {
        match a.recv() {
            Seen::Deliver { addr, data, .. } => assert_eq!((addr, data), (8 * i, i.to_le_bytes().to_vec())),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(a.rx_seq, 7, "Welcome, Member and five Delivers are frames 0-6");

    // B skips link sequence numbers 6-8: the hub notices (and logs), but
    // the frame is intact, so it is delivered and B stays joined.
    assert_eq!(b.tx_seq, 6);
    let first = a.joined.next_seq + 1;
    b.send_stamped(&Msg::Write { dest: a.node(), flags: 0, addr: 0x80, data: b"skipped" }, 9);
    match a.recv() {
        Seen::Deliver { seq, src, addr, data, .. } => {
            assert_eq!((seq, src, addr, &data[..]), (first + 5, 1, 0x80, &b"skipped"[..]))
        }
        other => panic!("unexpected {other:?}"),
    }
    b.write(a.node(), 0, 0x88, b"next");
    assert_eq!(b.tx_seq, 11);
    assert_eq!(a.recv().seq(), first + 6);
    assert_eq!(a.rx_seq, 9);
    let sb = hub.node_stats(1);
    assert_eq!((sb.writes_in, sb.dropped), (7, 0));
    assert_eq!(sb.link_gaps, 3, "link numbers 6, 7 and 8 never arrived");

    // The hub's own numbering toward B went on untouched: B gets frame 1 next.
    a.write(b.node(), 0, 0x90, b"to-b");
    assert_eq!(b.recv().seq(), first + 7);
    assert_eq!(b.rx_seq, 2);
}

/// `corrupt` counts add up without wrapping around, and a frame held back
/// by a `delay` goes out as soon as the delay is lifted.
#[test]
fn corrupt_counts_saturate_and_delays_release() {
    use hub::hub::Control;
    let hub = Hub::start();
    let mut a = Client::join(&hub, "a");
    let mut b = Client::join(&hub, "b");
    assert_eq!(a.recv(), member(b.joined.next_seq - 1, b.node(), true));
    // u32::MAX, then 2 more: a wrapping count would be 1 and stop after one frame.
    hub.control_ok(Control::Corrupt { node: b.node(), count: u32::MAX });
    hub.control_ok(Control::Corrupt { node: b.node(), count: 2 });
    for k in 0..3u64 {
        a.write(b.node(), 0, 8 * k, &k.to_le_bytes());
        let hdr = link::read_frame(&mut b.r, &mut b.buf).unwrap();
        b.rx_seq = b.rx_seq.wrapping_add(1);
        assert_eq!(Msg::parse(&hdr, &b.buf), Err(link::LinkError::BadCrc), "frame {k} should be corrupted");
    }
    assert_eq!(hub.node_stats(b.node()).corrupted, 3);
    // Stop corrupting: a fresh hub port is the only way to clear it; use A instead.
    hub.control_ok(Control::Delay { node: a.node(), micros: 900_000 });
    let t0 = std::time::Instant::now();
    b.write(a.node(), 0, 0x40, b"held");
    std::thread::sleep(Duration::from_millis(100));
    hub.control_ok(Control::Delay { node: a.node(), micros: 0 });
    assert!(matches!(a.recv(), Seen::Deliver { .. }));
    assert!(
        t0.elapsed() < Duration::from_millis(600),
        "the held frame waited {:?} after the delay was lifted",
        t0.elapsed()
    );
    match hub.control(Control::Delay { node: a.node(), micros: u64::MAX }) {
        hub::hub::ControlReply::Error { message } => assert!(message.contains("limit"), "{message}"),
        other => panic!("an endless delay was accepted: {other:?}"),
    }
}
