//! Opening channels on first use from either side (what MPI does): a
//! listener accepts a channel it did not ask for (`accept_new`), two sides
//! that open at once get one channel, not two (`open_or_join`, and the
//! listener skips a channel its process opened itself), and an opener whose
//! listener came later tells it again (`renotify`), and a channel both
//! sides closed can be opened again. Both ends of each
//! shared-memory channel are in this process. (One test: UMP state is per
//! process.)

use std::time::{Duration, Instant};

use ump::{Config, Want};

/// Waits until channel `id` is complete.
fn complete(id: i32) {
    let t0 = Instant::now();
    while !ump::chan(id).unwrap().poll_open() {
        assert!(t0.elapsed() < Duration::from_secs(10), "channel {id} did not complete");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Accepts until a channel from `peer` comes (or 5 s pass).
fn accepted_from(peer: u64) -> Option<i32> {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(5) {
        if let Some(&(id, _)) = ump::accept_new().unwrap().iter().find(|(_, r)| *r == peer) {
            return Some(id);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

#[test]
fn channels_open_on_first_use_from_either_side() {
    let base = (std::process::id() as u64) << 24;
    ump::init(Config { shm_buffer: 64 << 10, ..Config::default() }).unwrap();
    let h = |i: u64| base + i;
    for i in 1..=4 {
        ump::listen(h(i), Want::Shm).unwrap();
    }

    // 1. Only one side opens: the other side's listener accepts it, and the
    //    channel carries messages both ways.
    let a = ump::open_or_join(h(1), h(2), Want::Shm).unwrap();
    let b = accepted_from(h(1)).expect("the listener of handle 2 accepted nothing");
    complete(a);
    complete(b);
    ump::write(a, b"ping").unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(ump::read(b, &mut buf).unwrap(), 4);
    ump::write(b, b"pong!").unwrap();
    assert_eq!(ump::read(a, &mut buf).unwrap(), 5);
    assert_eq!(&buf[..5], b"pong!");
    // Opening it again from the accepting side joins the accepted channel.
    assert_eq!(ump::open_or_join(h(2), h(1), Want::Shm).unwrap(), b);
    assert!(matches!(ump::open(h(2), h(1), Want::Shm), Err(ump::UmpError::Busy(_))));

    // 2. Both sides open at once, before either listener looks: one
    //    channel each side, and the listeners accept nothing more.
    let before = ump::info().unwrap().channels;
    let c = ump::open_or_join(h(3), h(4), Want::Shm).unwrap();
    let d = ump::open_or_join(h(4), h(3), Want::Shm).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(ump::accept_new().unwrap(), vec![], "a second channel was accepted for a pair that has one");
    assert_eq!(ump::info().unwrap().channels, before + 2);
    complete(c);
    complete(d);
    ump::write(d, b"x").unwrap();
    assert_eq!(ump::read(c, &mut buf).unwrap(), 1);

    // 3. The listener comes after the open: nothing to accept until the
    //    opener tells it again.
    let e = ump::open_or_join(h(5), h(6), Want::Shm).unwrap();
    ump::listen(h(6), Want::Shm).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(ump::accept_new().unwrap(), vec![], "accepted a channel nobody announced to this listener");
    ump::renotify(e).unwrap();
    let f = accepted_from(h(5)).expect("the late listener did not accept after renotify");
    complete(e);
    complete(f);
    ump::renotify(e).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(ump::accept_new().unwrap(), vec![], "a renotify of a complete channel made another one");

    // 4. Both sides close a channel; the same opener opens again: the
    //    listener accepts the new channel (one request per channel, as PVM's
    //    daemon takes them).
    ump::close(a).unwrap();
    ump::close(b).unwrap();
    let g = ump::open_or_join(h(1), h(2), Want::Shm).unwrap();
    let k = accepted_from(h(1)).expect("the listener did not accept a channel reopened after both sides closed");
    complete(g);
    complete(k);
    ump::write(g, b"again").unwrap();
    assert_eq!(ump::read(k, &mut buf).unwrap(), 5);
    ump::exit().unwrap();
}
