use super::testkit::{engines, run};
use super::*;

fn any(ctx: u32) -> Pattern {
    Pattern { ctx, src: None, tag: None }
}

fn recv_vec(e: &mut Engine, p: Pattern, cap: usize) -> ReqId {
    e.irecv(p, RecvBuf::Packed { cap }).unwrap()
}

#[test]
fn eager_and_rendezvous_arrive_intact_posted_or_not() {
    let mut es = engines(2, 4096);
    for len in [0usize, 1, 100, 1000, 1500, 5000, 100_000] {
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
        // Unexpected first, then posted first.
        for posted_first in [false, true] {
            let mut r = 0;
            if posted_first {
                r = recv_vec(&mut es[1], any(1), len);
            }
            let s = es[0].isend(1, 1, 5, SendBuf::Owned(data.clone()), false).unwrap();
            if !posted_first {
                run(&mut es, |es| es[1].iprobe(any(1)).unwrap().is_some());
                r = recv_vec(&mut es[1], any(1), len);
            }
            run(&mut es, |es| es[0].is_done(s).unwrap() && es[1].is_done(r).unwrap());
            let (st, got) = es[1].finish(r).unwrap();
            assert_eq!((st.source, st.tag, st.bytes, st.truncated), (0, 5, len, false));
            assert!(got == data, "{len} bytes, posted first {posted_first}: contents differ");
            es[0].finish(s).unwrap();
        }
    }
    assert!(es[0].stats.rendezvous > 0 && es[0].stats.eager > 0);
}

/// A sender that floods a rank which receives nothing: what waits
/// unmatched there never passes the sender's credit, the messages past
/// it go by rendezvous, and when the receives come (in reverse order)
/// every message arrives intact and the credit comes back, so eager
/// sends resume.
#[test]
fn credit_bounds_what_waits_unmatched_at_a_receiver() {
    let mut es = engines(3, 64 << 10);
    for e in es.iter_mut() {
        e.set_unexpected_limit(80 << 10);
    }
    let limit = es[1].credit_limit();
    assert_eq!(limit, 40 << 10, "80 KiB over the 2 other ranks");
    let msg = |from: usize, i: usize| -> Vec<u8> { (0..1000 + i).map(|j| (j * 31 + i * 7 + from) as u8).collect() };
    // Ranks 0 and 2 each send 200 messages of ~1 KiB, tags 0..200,
    // standard and synchronous mixed.
    let mut sends = Vec::new();
    for i in 0..200 {
        for from in [0, 2] {
            let s = es[from].isend(1, 1, i as i32, SendBuf::Owned(msg(from, i)), i % 7 == 3).unwrap();
            sends.push((from, s));
        }
    }
    // Let everything that can move, move.
    for _ in 0..2000 {
        for e in es.iter_mut() {
            e.progress().unwrap();
        }
    }
    let held = es[1].unexpected_bytes();
    assert!(held <= 2 * limit, "{held} bytes wait unmatched at rank 1, more than the 2 senders' credit");
    assert!(held >= limit, "{held} bytes: the senders' credit was not used");
    assert!(es[0].stats.no_credit > 100 && es[2].stats.no_credit > 100, "past the credit, rendezvous");
    assert_eq!(es[1].unexpected.len(), 400, "every message is known at rank 1, most by envelope only");
    // Receives in reverse tag order, from each sender.
    let mut recvs = Vec::new();
    for i in (0..200).rev() {
        for from in [0u32, 2] {
            let p = Pattern { ctx: 1, src: Some(from), tag: Some(i) };
            recvs.push((from, i, recv_vec(&mut es[1], p, 2000)));
        }
    }
    run(&mut es, |es| {
        recvs.iter().all(|&(_, _, r)| es[1].is_done(r).unwrap())
            && sends.iter().all(|&(f, s)| es[f].is_done(s).unwrap())
    });
    for (from, i, r) in recvs {
        let (st, got) = es[1].finish(r).unwrap();
        assert_eq!((st.source, st.tag), (from, i));
        assert!(got == msg(from as usize, i as usize), "message {i} from {from} differs");
    }
    assert_eq!(es[1].unexpected_bytes(), 0);
    assert!(es[1].stats.unexpected_bytes_peak <= 2 * limit, "peak {}", es[1].stats.unexpected_bytes_peak);
    // The credit came back: the next message is eager again.
    for _ in 0..100 {
        for e in es.iter_mut() {
            e.progress().unwrap();
        }
    }
    assert!(es[0].credit[1] >= limit - limit / 4, "credit {} of {limit} back", es[0].credit[1]);
    let (eager, r) = (es[0].stats.eager, es[0].stats.rendezvous);
    let s = es[0].isend(1, 1, 9, SendBuf::Owned(vec![5; 1000]), false).unwrap();
    assert_eq!((es[0].stats.eager, es[0].stats.rendezvous), (eager + 1, r));
    es[0].finish(s).unwrap();
}

/// Credit given back that was never lent is a protocol error, not a
/// larger allowance.
#[test]
fn credit_never_lent_is_refused() {
    let mut es = engines(2, 64 << 10);
    let f = header(CREDIT, 0, 0, 0, 0, 64, 0);
    let e = es[0].frame(1, &f).unwrap_err();
    assert!(matches!(&e, EngineError::Protocol { from: 1, what } if what.contains("credit")), "{e}");
}

/// The eager limit is a quarter of the smallest ring's largest frame, from 16 KiB to
/// 256 KiB, and always leaves an eager frame room in the ring.
#[test]
fn the_eager_limit_follows_the_smallest_ring() {
    let limit = |cap: usize| engines(2, cap)[0].eager_limit();
    // A pipe's largest frame is its ring less 16 bytes, as UMP's.
    assert_eq!(limit(1 << 20), ((1 << 20) - 16) / 4);
    assert_eq!(limit(4 << 20), 256 << 10, "never above 256 KiB");
    assert_eq!(limit(256 << 10), ((256 << 10) - 16) / 4);
    assert_eq!(limit(64 << 10), 16 << 10, "never below 16 KiB while the ring allows");
    assert_eq!(limit(4096), (4096 - 16 - HDR) / 2, "half a small ring");
}

/// Rendezvous data for a contiguous posted buffer is read straight
/// into it; a buffer too short for the message (truncation) takes the
/// frames the ordinary way. Both arrive intact.
#[test]
fn rendezvous_data_lands_straight_in_a_contiguous_buffer() {
    let mut es = engines(2, 64 << 10);
    let len = 300_000;
    let data: Vec<u8> = (0..len).map(|i| (i * 13 + 1) as u8).collect();
    let mut direct = Vec::new();
    for cap in [len, len - 5000] {
        let mut buf = vec![0u8; cap];
        let before = es[1].stats.direct;
        // SAFETY: `buf` outlives the receive (run until it is done).
        let r = es[1].irecv(any(1), RecvBuf::Contig(unsafe { Posted::new(buf.as_mut_ptr(), cap) })).unwrap();
        let s = es[0].isend(1, 1, 9, SendBuf::Owned(data.clone()), false).unwrap();
        run(&mut es, |es| es[0].is_done(s).unwrap() && es[1].is_done(r).unwrap());
        let (st, _) = es[1].finish(r).unwrap();
        es[0].finish(s).unwrap();
        assert_eq!((st.bytes, st.truncated), (cap, cap < len));
        assert!(buf[..] == data[..cap], "cap {cap}: contents differ");
        direct.push(es[1].stats.direct - before);
    }
    // 300,000 bytes in frames of under 64 KiB: at least 5, all straight
    // in; with the short buffer, the one across its end is not.
    assert!(direct[0] >= 5, "only {} frames straight into the buffer", direct[0]);
    assert_eq!(es[0].stats.data_out.0, 2 * len as u64, "every DATA byte written is counted");
    assert!(es[1].stats.data_in.0 > len as u64 && es[1].stats.data_in.0 < 2 * len as u64);
    assert!(direct[1] < direct[0], "{direct:?}: the short buffer's last frame went straight in");
}

/// A standard eager send carries the one-word envelope (8 bytes of
/// data make a 16-byte frame); a synchronous one, or one on a context
/// the short envelope cannot carry, the full header. Both arrive with
/// their context, tag (negative ones too) and bytes.
#[test]
fn standard_small_sends_have_the_one_word_envelope() {
    let mut es = engines(2, 4096);
    let data = 0x1122_3344_5566_7788u64.to_le_bytes().to_vec();
    for (ctx, tag, sync, frame) in [
        (3, 7, false, HDR8 + 8),
        (CTX8_LIMIT - 1, -9, false, HDR8 + 8),
        (3, 7, true, HDR + 8),
        (CTX8_LIMIT, 1, false, HDR + 8),
    ] {
        let s = es[0].isend(1, ctx, tag, SendBuf::Owned(data.clone()), sync).unwrap();
        es[0].progress().unwrap();
        let sent = es[1].links[0].as_ref().unwrap().next_len().unwrap();
        assert_eq!(sent, Some(frame), "ctx {ctx} sync {sync}");
        let r = recv_vec(&mut es[1], Pattern { ctx, src: Some(0), tag: Some(tag) }, 8);
        run(&mut es, |es| es[0].is_done(s).unwrap() && es[1].is_done(r).unwrap());
        let (st, got) = es[1].finish(r).unwrap();
        assert_eq!((st.source, st.tag, st.bytes, got), (0, tag, 8, data.clone()), "ctx {ctx} sync {sync}");
        es[0].finish(s).unwrap();
    }
}

#[test]
fn a_send_is_cancelled_until_its_receiver_matched_it() {
    let mut es = engines(2, 4096);
    // A rendezvous, a synchronous and a plain eager send nobody has
    // received: all come back cancelled and leave nothing at the
    // receiver. The eager one, complete at once, is held incomplete
    // until the receiver answers.
    let big = es[0].isend(1, 1, 5, SendBuf::Owned(vec![7; 100_000]), false).unwrap();
    let sync = es[0].isend(1, 1, 6, SendBuf::Owned(vec![8; 10]), true).unwrap();
    let eager = es[0].isend(1, 1, 7, SendBuf::Owned(vec![6; 10]), false).unwrap();
    assert!(es[0].is_done(eager).unwrap());
    run(&mut es, |es| es[1].unexpected.len() == 3);
    for s in [big, sync, eager] {
        assert!(!es[0].cancel(s).unwrap(), "a send is not cancelled on the spot");
    }
    assert!(!es[0].is_done(eager).unwrap());
    run(&mut es, |es| [big, sync, eager].iter().all(|&s| es[0].is_done(s).unwrap()));
    for s in [big, sync, eager] {
        assert!(es[0].finish(s).unwrap().0.cancelled);
    }
    assert!(es[1].unexpected.is_empty());
    // Matched first (the receiver's CTS is on its way when the sender
    // asks): the cancel is refused and the data arrives.
    let s = es[0].isend(1, 1, 5, SendBuf::Owned(vec![9; 100_000]), false).unwrap();
    run(&mut es, |es| es[1].unexpected.len() == 1);
    let r = recv_vec(&mut es[1], any(1), 100_000);
    assert!(matches!(es[0].reqs[&s].kind, Kind::Send { waiting: true, .. }));
    es[0].cancel(s).unwrap();
    run(&mut es, |es| es[0].is_done(s).unwrap() && es[1].is_done(r).unwrap());
    assert!(!es[0].finish(s).unwrap().0.cancelled);
    assert_eq!(es[1].finish(r).unwrap().1, vec![9; 100_000]);
    // To itself: taken back from its own queue at once.
    let own = es[0].isend(0, 1, 3, SendBuf::Owned(vec![1]), true).unwrap();
    es[0].cancel(own).unwrap();
    assert!(es[0].is_done(own).unwrap() && es[0].finish(own).unwrap().0.cancelled);
}

#[test]
fn order_wildcards_and_contexts() {
    let mut es = engines(3, 8192);
    // Rank 0 sends tags 1, 2, 1 on context 7 and one on context 8.
    for (tag, ctx) in [(1, 7), (2, 7), (1, 7), (1, 8)] {
        let s = es[0].isend(2, ctx, tag, SendBuf::Owned(vec![tag as u8, ctx as u8]), false).unwrap();
        es[0].finish(s).unwrap();
    }
    let s = es[1].isend(2, 7, 9, SendBuf::Owned(vec![9]), false).unwrap();
    es[1].finish(s).unwrap();
    run(&mut es, |es| es[2].unexpected.len() == 5);
    // Tag 2 first: it overtakes nothing of its own tag.
    let r = es[2].irecv(Pattern { ctx: 7, src: Some(0), tag: Some(2) }, RecvBuf::Packed { cap: 8 }).unwrap();
    assert_eq!(es[2].finish(r).unwrap().1, vec![2, 7]);
    // Context 8 is apart from 7.
    let r = es[2].irecv(Pattern { ctx: 8, src: None, tag: None }, RecvBuf::Packed { cap: 8 }).unwrap();
    assert_eq!(es[2].finish(r).unwrap().1, vec![1, 8]);
    // Any source, any tag: arrival order among what is left of ctx 7.
    let mut seen = Vec::new();
    for _ in 0..3 {
        let r = es[2].irecv(any(7), RecvBuf::Packed { cap: 8 }).unwrap();
        let (st, b) = es[2].finish(r).unwrap();
        seen.push((st.source, st.tag, b[0]));
    }
    seen.sort();
    assert_eq!(seen, vec![(0, 1, 1), (0, 1, 1), (1, 9, 9)]);
    // From one sender, same tag: in the order sent.
    let a = es[0].isend(1, 3, 4, SendBuf::Owned(vec![1; 20_000]), false).unwrap();
    let b = es[0].isend(1, 3, 4, SendBuf::Owned(vec![2; 10]), false).unwrap();
    let r1 = recv_vec(&mut es[1], any(3), 20_000);
    let r2 = recv_vec(&mut es[1], any(3), 20_000);
    run(&mut es, |es| es[1].is_done(r1).unwrap() && es[1].is_done(r2).unwrap() && es[0].is_done(a).unwrap());
    assert_eq!(es[1].finish(r1).unwrap().0.bytes, 20_000);
    assert_eq!(es[1].finish(r2).unwrap().1, vec![2; 10]);
    let _ = es[0].finish(b);
}

#[test]
fn exchange_of_large_messages_both_ways_does_not_deadlock() {
    let mut es = engines(2, 2048);
    let n = 300_000;
    let s0 = es[0].isend(1, 1, 0, SendBuf::Owned(vec![0xA; n]), false).unwrap();
    let s1 = es[1].isend(0, 1, 0, SendBuf::Owned(vec![0xB; n]), false).unwrap();
    let r0 = recv_vec(&mut es[0], any(1), n);
    let r1 = recv_vec(&mut es[1], any(1), n);
    run(&mut es, |es| {
        [s0, r0].iter().all(|&r| es[0].is_done(r).unwrap()) && [s1, r1].iter().all(|&r| es[1].is_done(r).unwrap())
    });
    assert!(es[0].finish(r0).unwrap().1.iter().all(|&b| b == 0xB));
    assert!(es[1].finish(r1).unwrap().1.iter().all(|&b| b == 0xA));
}

#[test]
fn sync_send_completes_only_once_matched() {
    let mut es = engines(2, 4096);
    for len in [10usize, 50_000] {
        let s = es[0].isend(1, 1, 0, SendBuf::Owned(vec![1; len]), true).unwrap();
        for _ in 0..200 {
            es[0].progress().unwrap();
            es[1].progress().unwrap();
        }
        assert!(!es[0].is_done(s).unwrap(), "ssend of {len} bytes completed before a receive");
        let r = recv_vec(&mut es[1], any(1), len);
        run(&mut es, |es| es[0].is_done(s).unwrap() && es[1].is_done(r).unwrap());
    }
    // To ourselves too.
    let s = es[0].isend(0, 2, 0, SendBuf::Owned(vec![3]), true).unwrap();
    assert!(!es[0].is_done(s).unwrap());
    let r = recv_vec(&mut es[0], any(2), 1);
    assert!(es[0].is_done(s).unwrap() && es[0].is_done(r).unwrap());
}

#[test]
fn truncation_cancel_and_matched_probe() {
    let mut es = engines(2, 4096);
    let mut small = [0u8; 4];
    // SAFETY: `small` outlives the receive (run until it is done).
    let r = es[1].irecv(any(1), RecvBuf::Contig(unsafe { Posted::new(small.as_mut_ptr(), 4) })).unwrap();
    es[0].isend(1, 1, 0, SendBuf::Owned(vec![1, 2, 3, 4, 5, 6]), false).unwrap();
    run(&mut es, |es| es[1].is_done(r).unwrap());
    let st = es[1].finish(r).unwrap().0;
    assert!(st.truncated && st.bytes == 4);
    assert_eq!(small, [1, 2, 3, 4]);
    // A posted receive cancels; nothing arrives in it.
    let r = recv_vec(&mut es[1], any(9), 8);
    assert!(es[1].cancel(r).unwrap());
    assert!(es[1].finish(r).unwrap().0.cancelled);
    // Mprobe takes the message away from other receives.
    es[0].isend(1, 3, 1, SendBuf::Owned(vec![7; 3]), false).unwrap();
    let mut m = None;
    run(&mut es, |es| {
        m = es[1].improbe(any(3)).unwrap();
        m.is_some()
    });
    let m = m.unwrap();
    assert_eq!(m.status().bytes, 3);
    assert!(es[1].iprobe(any(3)).unwrap().is_none());
    let r = es[1].imrecv(m, RecvBuf::Packed { cap: 3 }).unwrap();
    assert_eq!(es[1].finish(r).unwrap().1, vec![7; 3]);
}

#[test]
fn a_dead_peer_is_an_error_not_a_hang() {
    let mut es = engines(2, 4096);
    let r = recv_vec(&mut es[0], any(1), 8);
    let dead = es.pop().unwrap();
    drop(dead);
    assert!(matches!(es[0].wait(r), Err(EngineError::Link(_))));
}

/// Frames still queued for a rank that has closed its end: an error
/// while the job runs, dropped once this rank is leaving (past the
/// last barrier), where waiting for them would hang and failing would
/// fail a finished job.
#[test]
fn frames_for_a_rank_that_left_are_dropped_only_when_leaving() {
    for leaving in [false, true] {
        let mut es = engines(2, 4096);
        for _ in 0..10 {
            es[0].isend(1, 1, 5, SendBuf::Owned(vec![7; 1000]), false).unwrap();
        }
        assert!(!es[0].out[1].is_empty(), "the pipe is full and frames wait");
        drop(es.pop());
        if leaving {
            es[0].leave().unwrap();
        }
        match es[0].drain() {
            Ok(()) => assert!(leaving && es[0].out[1].is_empty() && es[0].gone[1].is_some()),
            Err(e) => assert!(!leaving && matches!(e, EngineError::Link(TransportError::PeerGone(..))), "{e}"),
        }
    }
}

/// A rank past the last barrier says goodbye and stays, serving, until
/// every rank has said goodbye and taken what it sent: a rank still in
/// the barrier can ask it for its board slot again, and nobody sees a
/// closed channel before it is leaving too.
#[test]
fn a_leaving_rank_stays_until_everyone_said_goodbye() {
    let mut es = engines(3, 4096);
    let rounds = |es: &mut [Engine]| {
        for _ in 0..100 {
            for e in es.iter_mut() {
                e.progress().unwrap();
            }
        }
    };
    es[0].leave().unwrap();
    rounds(&mut es);
    assert!(!es[0].parted());
    assert_eq!(es[0].parting_from(), vec![1, 2]);
    es[1].ask_repost(0).unwrap();
    run(&mut es, |es| es[0].take_repost_asked());
    es[1].leave().unwrap();
    rounds(&mut es);
    assert_eq!(es[0].parting_from(), vec![2]);
    assert!(!es[1].parted() && !es[2].parted());
    es[2].leave().unwrap();
    run(&mut es, |es| es.iter().all(|e| e.parted()));
    // The first to close is no error for the others.
    drop(es.remove(0));
    rounds(&mut es);
    assert!(es.iter().all(|e| e.parted()));
}

/// Landing memory and a DMA engine shared by the engines of a test:
/// each rank's memory, each node's error count, and what the next
/// transfers do.
#[derive(Default)]
struct Fabric {
    mem: Vec<Vec<u8>>,
    errors: Vec<u64>,
    /// Transfers started and not yet polled: (token, to, off, bytes).
    flying: Vec<(u64, u32, u64, Vec<u8>)>,
    /// The next transfer fails.
    fail_next: bool,
    /// The next transfer lands, but a piece is lost and rank `.0`'s
    /// adapter counts it.
    error_at: Option<u32>,
    /// Each rank's stamp as it last read it.
    read: Vec<u64>,
    started: u64,
}

struct FakeDirect {
    me: u32,
    f: std::sync::Arc<std::sync::Mutex<Fabric>>,
}

impl Direct for FakeDirect {
    fn landing(&self, _peer: u32, ptr: *const u8, len: usize) -> Option<u64> {
        let f = self.f.lock().unwrap();
        let m = &f.mem[self.me as usize];
        let off = (ptr as usize).checked_sub(m.as_ptr() as usize)?;
        (off + len <= m.len()).then_some(off as u64)
    }
    fn start(&mut self, to: u32, off: u64, src: *const u8, len: usize) -> Option<u64> {
        let off_here = self.landing(to, src, len)?;
        let mut f = self.f.lock().unwrap();
        let bytes = f.mem[self.me as usize][off_here as usize..][..len].to_vec();
        f.started += 1;
        let token = f.started;
        f.flying.push((token, to, off, bytes));
        Some(token)
    }
    fn poll(&mut self, token: u64) -> Option<bool> {
        let mut f = self.f.lock().unwrap();
        let i = f.flying.iter().position(|t| t.0 == token)?;
        let (_, to, off, bytes) = f.flying.remove(i);
        if std::mem::take(&mut f.fail_next) {
            return Some(false);
        }
        f.mem[to as usize][off as usize..][..bytes.len()].copy_from_slice(&bytes);
        if let Some(r) = f.error_at.take() {
            // A lost piece: the receiver's memory is not all there.
            f.mem[to as usize][off as usize] ^= 0xFF;
            f.errors[r as usize] += 1;
        }
        Some(true)
    }
    fn losses(&mut self, fresh: bool) -> u64 {
        let mut f = self.f.lock().unwrap();
        let me = self.me as usize;
        if fresh || f.read[me] == u64::MAX {
            f.read[me] = f.errors[me];
        }
        f.read[me]
    }
}

#[test]
fn zero_copy_lands_in_the_posted_buffer_and_falls_back_to_data_when_it_cannot_be_trusted() {
    let len = 50_000;
    let f = std::sync::Arc::new(std::sync::Mutex::new(Fabric {
        mem: vec![vec![0u8; 2 * len]; 2],
        errors: vec![0; 2],
        read: vec![u64::MAX; 2],
        ..Fabric::default()
    }));
    let mut es = engines(2, 4096);
    for (i, e) in es.iter_mut().enumerate() {
        e.set_direct(Box::new(FakeDirect { me: i as u32, f: f.clone() }));
    }
    let base = |r: usize| f.lock().unwrap().mem[r].as_mut_ptr();
    // (what happens, sender's buffer in its landing memory, DMAs, messages streamed)
    let cases: [(&str, bool, u64, u64); 6] = [
        ("clean", true, 1, 0),
        ("send buffer elsewhere", false, 0, 1),
        ("transfer failed", true, 1, 1),
        ("a piece lost, the receiver's stamp moved", true, 1, 1),
        ("an error counted before the offer", true, 1, 1),
        ("clean again", true, 1, 0),
    ];
    for (n, (what, registered, dmas, streamed)) in cases.into_iter().enumerate() {
        let data: Vec<u8> = (0..len).map(|i| (i * 13 + n) as u8).collect();
        let outside = data.clone();
        {
            let mut g = f.lock().unwrap();
            g.mem[0][len..].copy_from_slice(&data);
            g.mem[1].iter_mut().for_each(|b| *b = 0);
            g.fail_next = what == "transfer failed";
            g.error_at = (what == "a piece lost, the receiver's stamp moved").then_some(1);
            if what == "an error counted before the offer" {
                // Counted after the receiver last read its stamp, before
                // this offer: the offer uses the older stamp, so the
                // (whole) transfer is not trusted, and goes again.
                g.errors[1] += 1;
            }
        }
        let (zc, st, started) = (es[0].stats.zero_copy.0, es[0].stats.zero_copy_streamed, f.lock().unwrap().started);
        let dst = base(1).wrapping_add(len / 2);
        // SAFETY: `dst` is in engine 1's landing memory, which outlives the receive.
        let r = es[1].irecv(any(1), RecvBuf::Contig(unsafe { Posted::new(dst, len) })).unwrap();
        let src = if registered { base(0).wrapping_add(len).cast_const() } else { outside.as_ptr() };
        // SAFETY: `src` is in engine 0's memory or `outside`, both of which outlive the send.
        let s = es[0].isend(1, 1, 9, SendBuf::Borrowed(unsafe { Lent::new(src, len) }), false).unwrap();
        run(&mut es, |es| es[0].is_done(s).unwrap() && es[1].is_done(r).unwrap());
        let (status, _) = es[1].finish(r).unwrap();
        es[0].finish(s).unwrap();
        assert_eq!((status.bytes, status.truncated), (len, false), "{what}");
        let got = f.lock().unwrap().mem[1][len / 2..][..len].to_vec();
        assert!(got == data, "{what}: the posted buffer's contents differ");
        assert_eq!(f.lock().unwrap().started - started, dmas, "{what}: transfers started");
        assert_eq!(es[0].stats.zero_copy_streamed - st, streamed, "{what}: messages streamed as DATA");
        // DONE went out for every transfer that was sent whole.
        let whole = u64::from(dmas == 1 && what != "transfer failed");
        assert_eq!(es[0].stats.zero_copy.0 - zc, whole, "{what}");
        assert!(es[0].direct_sends.is_empty() && es[1].reqs.is_empty(), "{what}: nothing left behind");
    }
    assert_eq!(es[1].stats.zero_copy_in, 2, "only the clean transfers were taken as they landed");
}
