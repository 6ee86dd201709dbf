//! The Direct Deposit protocol (`dd::proto`) on the simulated ordered bus
//! (`dd::sim`): deposits at the sender's offsets up to the buffer's edges,
//! a note ring that wraps, several connections on one queue, releases of
//! buffer space, every refusal, and faults that show as errors, never as
//! wrong data.

use dd::layout::{Note, NOTES, NOTE_BYTES};
use dd::proto::{Inbound, Queue, Sender};
use dd::sim::{SimBus, SimRx, SimTx};
use dd::DdError;

const BUF: usize = 4 * 8192;
/// Bytes of address space one connection takes: notes, buffer, back page.
const SPAN: usize = 8192 + BUF + 8192;

/// Connection `c` from node `from` to node `to` on `bus`: its sender and
/// the receiving end to put on a queue.
fn connection(bus: &SimBus, c: u32, from: usize, to: usize) -> (Sender<SimTx, SimRx>, Inbound<SimRx, SimTx>) {
    let base = c as usize * SPAN;
    let (notes, buf, back) = (base, base + 8192, base + 8192 + BUF);
    let s =
        Sender::new(c, bus.tx(from, notes, 8192, Some(to)), bus.tx(from, buf, BUF, Some(to)), bus.rx(from, back, 8192));
    let r = Inbound::new(c, bus.rx(to, notes, 8192), bus.rx(to, buf, BUF), bus.tx(to, back, 8192, Some(from)));
    (s, r)
}

fn pattern(seed: u32, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u32).wrapping_mul(31).wrapping_add(seed * 7) as u8).collect()
}

/// Polls until a note (or an error) comes, settling the node at the end.
fn next(q: &mut Queue<SimRx, SimTx>, bus: &SimBus, node: usize) -> Result<Note, DdError> {
    for i in 0..10_000 {
        if i == 9_000 {
            bus.settle(node);
        }
        if let Some(n) = q.poll()? {
            return Ok(n);
        }
    }
    panic!("no note arrived");
}

#[test]
fn deposits_land_at_the_senders_offsets_up_to_the_buffers_edges() {
    let bus = SimBus::new(2, SPAN, 1);
    let (mut s, r) = connection(&bus, 0, 0, 1);
    let mut q = Queue::new();
    q.add(r).unwrap();
    let cases: [(u64, usize); 5] = [(0, 1), (8, 13), (BUF as u64 - 8, 8), (BUF as u64 - 16, 11), (4096, 0)];
    for (i, &(off, len)) in cases.iter().enumerate() {
        let data = pattern(i as u32, len);
        let sent = s.send(off, &data).unwrap();
        let got = next(&mut q, &bus, 1).unwrap();
        assert_eq!(got, sent);
        assert_eq!((got.offset as u64, got.len as usize, got.seq), (off, len, i as u64 + 1));
        assert_eq!(q.last_bytes(), &data[..]);
        let mut back = vec![0u8; len];
        q.read(&got, &mut back).unwrap();
        assert_eq!(back, data, "message {i} at {off}");
        q.release(&got).unwrap();
        bus.settle(0);
    }
    // The whole buffer in one message.
    let whole = pattern(99, BUF);
    let n = s.send(0, &whole).unwrap();
    assert_eq!(next(&mut q, &bus, 1).unwrap(), n);
    assert_eq!(q.last_bytes(), &whole[..]);
}

#[test]
fn a_send_past_the_buffer_or_misaligned_is_refused_and_writes_nothing() {
    let bus = SimBus::new(2, SPAN, 2);
    let (mut s, _r) = connection(&bus, 0, 0, 1);
    let before = bus.writes();
    for (off, len) in [(BUF as u64, 1usize), (BUF as u64 - 8, 9), (0, BUF + 1), (u64::MAX - 3, 8)] {
        match s.send(off, &vec![1; len]) {
            Err(DdError::OutOfBuffer { offset, len: l, size }) => {
                assert_eq!((offset, l as usize, size), (off, len, BUF as u64))
            }
            other => panic!("{len} bytes at {off}: {other:?}"),
        }
    }
    assert!(matches!(s.send(4, &[1; 4]), Err(DdError::Misaligned(4))));
    assert_eq!(bus.writes(), before, "a refused send wrote something");
    // The same sender still sends.
    s.send(BUF as u64 - 8, &[7; 8]).unwrap();
    assert!(bus.writes() > before);
}

#[test]
fn the_note_ring_wraps_and_notes_arrive_in_order() {
    let bus = SimBus::new(2, 6 * SPAN, 3);
    let (mut s, r) = connection(&bus, 5, 0, 1);
    let mut q = Queue::new();
    q.add(r).unwrap();
    let total = 3 * NOTES + 7;
    let mut sent = 0u64;
    let mut got = 0u64;
    while got < total {
        // Keep up to 40 messages in flight, at rotating offsets.
        while sent < total && sent - got < 40 {
            let off = (sent % 64) * 256;
            let data = pattern(sent as u32, 200);
            s.send(off, &data).unwrap();
            sent += 1;
        }
        let n = next(&mut q, &bus, 1).unwrap();
        got += 1;
        assert_eq!(n.seq, got, "notes in the order sent");
        assert_eq!(n.offset as u64, ((got - 1) % 64) * 256);
        assert_eq!(q.last_bytes(), &pattern(got as u32 - 1, 200)[..]);
        q.release(&n).unwrap();
    }
    assert!(total > 3 * NOTES, "the ring went round three times");
}

#[test]
fn several_connections_share_one_queue_each_in_its_own_order() {
    // Node 0 receives from nodes 1, 2 and 3; node 3 opens two connections.
    let bus = SimBus::new(4, 4 * SPAN, 4);
    let conns = [(0u32, 1usize), (1, 2), (2, 3), (3, 3)];
    let mut q = Queue::new();
    let mut senders = Vec::new();
    for &(c, from) in &conns {
        let (s, r) = connection(&bus, c, from, 0);
        q.add(r).unwrap();
        senders.push(s);
    }
    let (_, dup) = connection(&bus, 1, 2, 0);
    assert!(matches!(q.add(dup), Err(DdError::Invalid(m)) if m.contains("already")));
    let per = 50u64;
    for k in 0..per {
        for (c, s) in senders.iter_mut().enumerate() {
            let data = pattern(c as u32 * 1000 + k as u32, 40 + c);
            s.send(k * 64, &data).unwrap();
        }
    }
    let mut last = [0u64; 4];
    for _ in 0..per * 4 {
        let n = next(&mut q, &bus, 0).unwrap();
        let c = n.conn as usize;
        assert_eq!(n.seq, last[c] + 1, "connection {c}'s notes in order");
        last[c] = n.seq;
        assert_eq!(q.last_bytes(), &pattern(c as u32 * 1000 + n.seq as u32 - 1, 40 + c)[..]);
        q.release(&n).unwrap();
    }
    assert_eq!(last, [per; 4]);
    bus.settle(0);
    assert_eq!(q.poll().unwrap(), None, "nothing more");
}

#[test]
fn buffer_space_comes_back_only_when_the_receiver_releases_it() {
    let bus = SimBus::new(2, SPAN, 5);
    let (mut s, r) = connection(&bus, 0, 0, 1);
    let mut q = Queue::new();
    q.add(r).unwrap();
    let a = s.send(0, &[1; 100]).unwrap();
    let b = s.send(128, &[2; 100]).unwrap();
    let before = bus.writes();
    // Overlapping an unreleased message is refused, and writes nothing.
    assert!(matches!(s.send(96, &[3; 8]), Err(DdError::Busy { seq: 1, .. })));
    assert!(matches!(s.send(200, &[3; 8]), Err(DdError::Busy { seq: 2, .. })));
    assert_eq!(bus.writes(), before);
    let na = next(&mut q, &bus, 1).unwrap();
    let nb = next(&mut q, &bus, 1).unwrap();
    assert_eq!((na, nb), (a, b));
    // Released out of order: nothing comes back until the first is too.
    q.release(&nb).unwrap();
    assert!(matches!(q.release(&nb), Err(DdError::NotOutstanding { seq: 2, .. })));
    bus.settle(0);
    assert_eq!(s.outstanding(), 2);
    assert!(matches!(s.send(200, &[3; 8]), Err(DdError::Busy { seq: 2, .. })));
    q.release(&na).unwrap();
    bus.settle(0);
    assert_eq!(s.outstanding(), 0);
    s.send(96, &[3; 8]).unwrap();
    // The ring holds NOTES unreleased messages, no more.
    let s2_bus = SimBus::new(2, SPAN, 6);
    let (mut s2, _r2) = connection(&s2_bus, 0, 0, 1);
    for i in 0..NOTES {
        s2.send((i % 8) * 8, &[]).unwrap();
    }
    let w = s2_bus.writes();
    assert!(matches!(s2.send(0, &[]), Err(DdError::NotesFull)));
    assert_eq!(s2_bus.writes(), w);
    assert_eq!(NOTE_BYTES * (NOTES as usize + 1), 8192, "one page of notes and the head");
}

#[test]
fn p2p_keeps_a_connections_bytes_from_other_nodes() {
    let bus = SimBus::new(3, SPAN, 7);
    let (mut s, r) = connection(&bus, 0, 0, 1);
    let mut q = Queue::new();
    q.add(r).unwrap();
    s.send(64, &[0xAB; 64]).unwrap();
    next(&mut q, &bus, 1).unwrap();
    bus.settle(2);
    let mut third = vec![0u8; 64];
    use dd::proto::Rx;
    bus.rx(2, 8192 + 64, 64).read(0, &mut third);
    assert_eq!(third, vec![0; 64], "node 2 received a point-to-point connection's bytes");
}

#[test]
fn lost_and_corrupted_writes_show_as_errors_never_as_wrong_data() {
    let bus = SimBus::new(2, SPAN, 8);
    let (mut s, r) = connection(&bus, 0, 0, 1);
    let mut q = Queue::new();
    q.add(r).unwrap();
    // A data word dropped as corrupt: the note arrives, the CRC tells.
    bus.corrupt(1);
    s.send(0, &pattern(1, 64)).unwrap();
    assert!(matches!(next(&mut q, &bus, 1), Err(DdError::Damaged { seq: 1, .. })));
    // Whole messages lost while the link was down: the head tells, one
    // error per lost note.
    bus.link_down(0);
    s.send(64, &pattern(2, 64)).unwrap();
    s.send(192, &pattern(20, 64)).unwrap();
    bus.link_up(0);
    let third = s.send(128, &pattern(4, 64)).unwrap();
    assert!(matches!(next(&mut q, &bus, 1), Err(DdError::Lost { seq: 2, .. })));
    assert!(matches!(next(&mut q, &bus, 1), Err(DdError::Lost { seq: 3, .. })));
    let n = next(&mut q, &bus, 1).unwrap();
    assert_eq!(n, third);
    assert_eq!(q.last_bytes(), &pattern(4, 64)[..]);
    q.release(&n).unwrap();
    // What failed was handed back: the sender may reuse all of it.
    bus.settle(0);
    assert_eq!(s.outstanding(), 0);
    // Random bursts: every message is either right or an error.
    let mut right = 0;
    for k in 0..200u32 {
        if k % 17 == 3 {
            bus.corrupt(1 + (k as usize % 5));
        }
        s.send((k as u64 % 8) * 256, &pattern(k, 100 + k as usize % 50)).unwrap();
        bus.settle(1);
        loop {
            match q.poll() {
                Ok(Some(n)) => {
                    // Message k went as note k + 5.
                    let k = n.seq as usize - 5;
                    assert_eq!(q.last_bytes(), &pattern(k as u32, 100 + k % 50)[..]);
                    q.release(&n).unwrap();
                    right += 1;
                }
                Ok(None) => break,
                Err(_) => {}
            }
        }
        bus.settle(0);
    }
    assert!(right > 100, "only {right} messages of 200 came through");
}

#[test]
fn a_note_arriving_between_the_look_and_the_head_is_not_taken_for_lost() {
    // Many seeds: the receiver's loads apply the sender's writes at random
    // points, so some polls see the head of a note whose word 3 they
    // missed a moment before.
    for seed in 0..200 {
        let bus = SimBus::new(2, SPAN, seed);
        let (mut s, r) = connection(&bus, 0, 0, 1);
        let mut q = Queue::new();
        q.add(r).unwrap();
        for k in 0..20u64 {
            s.send(k * 64, &pattern(k as u32, 40)).unwrap();
            let n = next(&mut q, &bus, 1).unwrap_or_else(|e| panic!("seed {seed}, message {k}: {e}"));
            assert_eq!(n.seq, k + 1);
        }
    }
}
