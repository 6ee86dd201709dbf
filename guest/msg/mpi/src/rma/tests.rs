//! The one-sided protocol between in-process engines joined by small
//! pipes (so that operations split into many frames): every
//! synchronisation mode, atomics under contention, and bad input.

#![allow(clippy::needless_range_loop)]

use std::sync::Arc;

use super::*;
use crate::datatype::Datatype;
use crate::engine::testkit::{engines, run};
use crate::engine::{Engine, EngineError};

const WIN: u32 = 77;

fn long() -> Arc<Datatype> {
    Datatype::shared_basic(Basic::Long)
}

fn bytes() -> Arc<Datatype> {
    Datatype::shared_basic(Basic::Byte)
}

/// `n` engines, each with a window of `size` bytes (returned, so the
/// memory outlives the test).
fn windows(n: usize, size: usize, cap: usize) -> (Vec<Engine>, Vec<Vec<u8>>) {
    let mut es = engines(n, cap);
    let mem: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; size]).collect();
    for (i, e) in es.iter_mut().enumerate() {
        let spec = WinSpec {
            ranks: (0..n as u32).collect(),
            me: i as u32,
            base: mem[i].as_ptr() as usize,
            sizes: vec![size as u64; n],
            units: vec![1; n],
            dynamic: false,
        };
        e.rma(|r| {
            r.create(WIN, spec);
            Ok(())
        })
        .unwrap();
    }
    (es, mem)
}

fn target(rank: u32, addr: u64, count: u64, dt: Arc<Datatype>) -> Target {
    Target { rank, addr, count, dt }
}

fn dest(buf: &mut [u8]) -> Dest {
    Dest { ptr: buf.as_mut_ptr() as usize, count: buf.len() as u64, dt: bytes() }
}

/// A fence on every engine, to completion.
fn fence(es: &mut [Engine]) {
    let epochs: Vec<u64> = es.iter_mut().map(|e| e.rma(|r| r.fence_begin(WIN)).unwrap()).collect();
    let mut done = vec![false; es.len()];
    run(es, |es| {
        for (i, e) in es.iter_mut().enumerate() {
            if !done[i] {
                done[i] = e.rma(|r| r.fence_done(WIN, epochs[i])).unwrap();
            }
        }
        done.iter().all(|&d| d)
    });
}

fn longs(v: &[u8]) -> Vec<i64> {
    v.chunks_exact(8).map(|c| i64::from_ne_bytes(c.try_into().unwrap())).collect()
}

fn frame(e: &Engine) -> usize {
    e.rma_frame()
}

#[test]
fn fence_epochs_carry_puts_gets_and_accumulates_split_into_many_frames() {
    let n = 4;
    let size = 64 << 10;
    let (mut es, mem) = windows(n, size, 4096);
    assert!(frame(&es[0]) < 4096, "the pipes must force splitting");
    // Epoch 1: each rank puts 20000 bytes into the next rank's window, and
    // a strided pattern (every other long) into the one after.
    let data: Vec<Vec<u8>> = (0..n).map(|i| (0..20000).map(|k| (k * 7 + i * 13) as u8).collect()).collect();
    let strided = Arc::new(Datatype::vector(500, 1, 2, &long()).unwrap());
    for i in 0..n {
        let max = frame(&es[i]);
        let next = ((i + 1) % n) as u32;
        let after = ((i + 2) % n) as u32;
        let vals: Vec<u8> = (0..500i64).flat_map(|k| (k * 1000 + i as i64).to_ne_bytes()).collect();
        es[i]
            .rma(|r| {
                r.put(WIN, &target(next, 0, 20000, bytes()), &data[i], max)?;
                r.put(WIN, &target(after, 32768, 1, strided.clone()), &vals, max)
            })
            .unwrap();
    }
    fence(&mut es);
    for i in 0..n {
        let from = (i + n - 1) % n;
        assert!(mem[i][..20000] == data[from][..], "rank {i}: the put from {from} differs");
        let got = longs(&mem[i][32768..32768 + 8000]);
        let by = (i + n - 2) % n;
        for k in 0..500 {
            assert_eq!(got[2 * k], k as i64 * 1000 + by as i64, "rank {i}, element {k}");
            assert_eq!(got[2 * k + 1], 0, "rank {i}: the gaps of the vector must stay untouched");
        }
    }
    // Epoch 2: every rank adds its rank + 1 to 1000 longs at rank 0 and
    // gets rank 1's first 20000 bytes.
    let mut got: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; 20000]).collect();
    for i in 0..n {
        let max = frame(&es[i]);
        let add: Vec<u8> = (0..1000).flat_map(|_| (i as i64 + 1).to_ne_bytes()).collect();
        let acc = Accum { op: Builtin::Sum, kind: Kind::Basic(Basic::Long) };
        let d = dest(&mut got[i]);
        es[i]
            .rma(|r| {
                r.accumulate(WIN, &target(0, 40960, 1000, long()), &add, acc, max)?;
                r.get(WIN, &target(1, 0, 20000, bytes()), d, max)
            })
            .unwrap();
    }
    fence(&mut es);
    assert!(longs(&mem[0][40960..40960 + 8000]).iter().all(|&v| v == 10), "1+2+3+4 at every element");
    for g in &got {
        assert!(g[..] == data[0][..], "a get of rank 1's window");
    }
}

#[test]
fn fetch_and_add_under_contention_hands_out_every_ticket_once() {
    let n = 4;
    let (mut es, mem) = windows(n, 64, 4096);
    let per = 100;
    let mut tickets: Vec<Vec<[u8; 8]>> = vec![vec![[0u8; 8]; per]; n];
    // Every rank locks rank 0 shared and fetch-and-adds 1, `per` times,
    // all in flight at once.
    for i in 0..n {
        es[i].rma(|r| r.lock(WIN, 0, false)).unwrap();
    }
    let mut granted = vec![false; n];
    run(&mut es, |es| {
        for i in 0..n {
            granted[i] |= es[i].rma(|r| r.granted(WIN, 0)).unwrap();
        }
        granted.iter().all(|&g| g)
    });
    let acc = Accum { op: Builtin::Sum, kind: Kind::Basic(Basic::Long) };
    for (i, t) in tickets.iter_mut().enumerate() {
        for slot in t.iter_mut() {
            let d = Dest { ptr: slot.as_mut_ptr() as usize, count: 1, dt: long() };
            es[i].rma(|r| r.get_accumulate(WIN, &target(0, 8, 1, long()), &1i64.to_ne_bytes(), acc, d, 4096)).unwrap();
        }
        es[i].rma(|r| r.unlock(WIN, 0)).unwrap();
    }
    let mut acked = vec![false; n];
    run(&mut es, |es| {
        for i in 0..n {
            acked[i] |= es[i].rma(|r| r.acked(WIN, 0)).unwrap();
        }
        acked.iter().all(|&a| a) && (0..n).all(|i| !es[i].rma_ref().replies_pending(WIN, None).unwrap())
    });
    let mut all: Vec<i64> = tickets.iter().flatten().map(|b| i64::from_ne_bytes(*b)).collect();
    all.sort();
    assert_eq!(all, (0..(n * per) as i64).collect::<Vec<_>>(), "each old value seen exactly once");
    assert_eq!(longs(&mem[0][8..16]), vec![(n * per) as i64]);
}

#[test]
fn exclusive_locks_serialise_read_modify_write_and_compare_and_swap() {
    let n = 4;
    let (mut es, mem) = windows(n, 64, 4096);
    let rounds = 25;
    // Each rank: lock exclusive, get the counter, wait for it, put it + 1,
    // unlock; lost updates would show if two held the lock at once.
    // (round, step, reply); the value read, apart (a get from the rank
    // itself lands during the call).
    let mut state = vec![(0usize, 0u8, 0u64); n];
    let mut vals = vec![[0u8; 8]; n];
    run(&mut es, |es| {
        for i in 0..n {
            let (round, step, reply) = state[i];
            if round == rounds {
                continue;
            }
            let e = &mut es[i];
            let next = match step {
                0 => {
                    e.rma(|r| r.lock(WIN, 2, true)).unwrap();
                    (round, 1, reply)
                }
                1 if e.rma(|r| r.granted(WIN, 2)).unwrap() => {
                    let d = Dest { ptr: vals[i].as_mut_ptr() as usize, count: 1, dt: long() };
                    let r = e.rma(|r| r.get(WIN, &target(2, 0, 1, long()), d, 4096)).unwrap();
                    (round, 2, r)
                }
                2 if e.rma_ref().reply_done(reply) => {
                    let val = (i64::from_ne_bytes(vals[i]) + 1).to_ne_bytes();
                    e.rma(|r| {
                        r.put(WIN, &target(2, 0, 1, long()), &val, 4096)?;
                        r.unlock(WIN, 2)
                    })
                    .unwrap();
                    (round, 3, reply)
                }
                3 if e.rma(|r| r.acked(WIN, 2)).unwrap() => (round + 1, 0, reply),
                _ => state[i],
            };
            state[i] = next;
        }
        state.iter().all(|s| s.0 == rounds)
    });
    assert_eq!(longs(&mem[2][..8]), vec![(n * rounds) as i64], "no update lost");
    // Compare-and-swap: every rank tries to swap 0 -> its rank + 1 at
    // rank 3; exactly one wins, and everyone sees the same winner after.
    let mut old = vec![[0u8; 8]; n];
    for (i, o) in old.iter_mut().enumerate() {
        let d = Dest { ptr: o.as_mut_ptr() as usize, count: 1, dt: long() };
        let swap = (i as i64 + 1).to_ne_bytes();
        es[i].rma(|r| r.compare_and_swap(WIN, &target(3, 16, 1, long()), &0i64.to_ne_bytes(), &swap, d)).unwrap();
    }
    fence(&mut es);
    let winner = longs(&mem[3][16..24])[0];
    let zeros = old.iter().filter(|o| i64::from_ne_bytes(**o) == 0).count();
    assert_eq!(zeros, 1, "exactly one compare-and-swap saw the initial 0");
    assert!(old.iter().all(|o| matches!(i64::from_ne_bytes(*o), 0) || i64::from_ne_bytes(*o) == winner));
}

#[test]
fn post_start_complete_wait_in_two_rounds() {
    let n = 3;
    let (mut es, mem) = windows(n, 256, 4096);
    for round in 0..2u8 {
        // Rank 0 exposes to 1 and 2; they put at their own offsets.
        es[0].rma(|r| r.post(WIN, &[1, 2])).unwrap();
        let mut started = [false; 3];
        run(&mut es, |es| {
            for i in 1..3 {
                started[i] |= es[i].rma(|r| r.posted(WIN, &[0])).unwrap();
            }
            started[1] && started[2]
        });
        for i in 1..3 {
            let v = [round * 10 + i as u8; 16];
            es[i]
                .rma(|r| {
                    r.put(WIN, &target(0, i as u64 * 16, 16, bytes()), &v, 4096)?;
                    r.complete(WIN, &[0])
                })
                .unwrap();
        }
        run(&mut es, |es| es[0].rma(|r| r.completed(WIN, &[1, 2])).unwrap());
        assert_eq!(mem[0][16..32], [round * 10 + 1; 16]);
        assert_eq!(mem[0][32..48], [round * 10 + 2; 16]);
        // A third complete was never sent: no stray wait succeeds.
        assert!(!es[0].rma(|r| r.completed(WIN, &[1, 2])).unwrap());
    }
}

#[test]
fn out_of_range_and_unattached_accesses_are_errors_and_write_nothing() {
    let (mut es, mem) = windows(2, 64, 4096);
    let e = es[0].rma(|r| r.put(WIN, &target(1, 60, 8, bytes()), &[1; 8], 4096)).unwrap_err();
    assert!(matches!(e, EngineError::Rma(RmaError::Range { rank: 1, at: 60, len: 8, size: 64 })), "{e}");
    let e = es[0].rma(|r| r.put(WIN, &target(5, 0, 1, bytes()), &[1], 4096)).unwrap_err();
    assert!(e.to_string().contains("rank 5 is not in the window"), "{e}");
    assert!(mem[1].iter().all(|&b| b == 0));

    // A dynamic window: only the target knows what is attached.
    let mut attached = vec![0u8; 32];
    for (i, e) in es.iter_mut().enumerate() {
        let spec =
            WinSpec { ranks: vec![0, 1], me: i as u32, base: 0, sizes: vec![0, 0], units: vec![1, 1], dynamic: true };
        e.rma(|r| {
            r.create(WIN + 1, spec);
            Ok(())
        })
        .unwrap();
    }
    let at = attached.as_mut_ptr() as u64;
    es[1].rma(|r| r.attach(WIN + 1, at as usize, 32)).unwrap();
    es[0].rma(|r| r.put(WIN + 1, &target(1, at + 8, 4, bytes()), &[9; 4], 4096)).unwrap();
    es[0].rma(|r| r.put(WIN + 1, &target(1, at + 30, 4, bytes()), &[7; 4], 4096)).unwrap();
    es[0].rma(|r| r.flush(WIN + 1, 1)).unwrap();
    run(&mut es, |es| es[0].rma(|r| r.acked(WIN + 1, 1)).unwrap());
    assert_eq!(attached[8..12], [9; 4]);
    assert_eq!(attached[28..32], [0; 4], "the refused put wrote nothing");
    let err = es[0].rma(|r| r.take_error(WIN + 1)).unwrap().expect("the refusal came back");
    assert!(err.to_string().contains("not in memory attached"), "{err}");
}

#[test]
fn garbage_frames_are_protocol_errors_not_panics() {
    let mut r = Rma::new();
    r.create(WIN, WinSpec { ranks: vec![0, 1], me: 0, base: 0, sizes: vec![0, 0], units: vec![1, 1], dynamic: false });
    let cases: Vec<(u32, u8, u32, Vec<u8>)> = vec![
        (1, PUT, WIN, vec![1, 2, 3]),
        (
            1,
            PUT,
            WIN,
            payload(0, &[(0, 8)], 0, 0, &[]).into_iter().chain([0xff; 3]).collect::<Vec<u8>>()[..SUB].to_vec(),
        ),
        (1, PUT, WIN + 9, payload(0, &[], 0, 0, &[])),
        (7, PUT, WIN, payload(0, &[], 0, 0, &[])),
        (1, ACC, WIN, payload(0, &[], 999, 0, &[])),
        (1, UNLOCK, WIN, Vec::new()),
        (1, 200, WIN, Vec::new()),
        (1, REPLY, WIN, vec![0; 8]),
    ];
    for (from, op, win, p) in cases {
        match r.arrive(from, op, win, 0, 0, &p) {
            Err(RmaError::Protocol { .. }) | Ok(()) => {}
            Err(e) => panic!("op {op}: {e}"),
        }
    }
    // A huge piece count does not allocate or read past the frame.
    let mut p = payload(0, &[], 0, 0, &[]);
    p[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(r.arrive(1, PUT, WIN, 0, 0, &p), Err(RmaError::Protocol { .. })));
}

#[test]
fn split_keeps_elements_whole_and_frames_in_bounds() {
    let dt = Arc::new(Datatype::vector(1000, 3, 5, &Datatype::shared_basic(Basic::Int)).unwrap());
    for max in [64usize, 100, 1000, 4096] {
        for elem in [1u64, 4, 12] {
            let total = dt.size();
            let chunks = split(total, elem, max, |s, l| dt.pieces(1, s, l));
            let mut at = 0;
            for (s, l, p) in &chunks {
                assert_eq!(*s, at);
                assert!(l % elem == 0 || s + l == total);
                assert!(SUB + p.len() * PIECE + *l as usize <= max.max(SUB + PIECE + elem as usize) || *l <= elem);
                assert_eq!(p.iter().map(|x| x.1).sum::<u64>(), *l);
                at += l;
            }
            assert_eq!(at, total);
        }
    }
}
