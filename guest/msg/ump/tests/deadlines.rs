//! The blocking calls the tools use stop at their deadline when the other
//! side, alive, does not do its part. Both ends of a shared-memory channel
//! are in this process. (One test: UMP state is per process.)

use std::time::{Duration, Instant};

use ump::{ChanError, Config, Event, UmpError, Want};

fn timed_out<T: std::fmt::Debug>(r: Result<T, UmpError>) -> bool {
    matches!(r, Err(UmpError::Channel(ChanError::Timeout)))
}

#[test]
fn writes_reads_and_multicasts_to_a_peer_that_does_nothing_time_out() {
    let base = (std::process::id() as u64) << 24;
    ump::init(Config { shm_buffer: 64 << 10, ..Config::default() }).unwrap();
    let a = ump::open(base + 1, base + 2, Want::Shm).unwrap();
    let b = ump::open(base + 2, base + 1, Want::Shm).unwrap();
    for ch in [a, b] {
        assert_eq!(ump::wait(Some(ch), Some(Duration::from_secs(10))).unwrap(), Some(Event::Open(ch)));
    }
    let limit = Duration::from_millis(300);
    let mut buf = vec![0u8; 64 << 10];

    // Nothing sent: the read stops at its deadline.
    let t0 = Instant::now();
    assert!(timed_out(ump::read_timeout(b, &mut buf, limit)));
    assert!(t0.elapsed() >= limit && t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());

    // b never reads: a multicast that fits goes through, the next one
    // waits for room that never comes and stops at its deadline.
    let msg = vec![7u8; 40 << 10];
    ump::mcast_timeout(&[a], &msg, limit).unwrap();
    let t0 = Instant::now();
    assert!(timed_out(ump::mcast_timeout(&[a], &msg, limit)));
    assert!(t0.elapsed() >= limit && t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());

    // The same for a plain write.
    let t0 = Instant::now();
    assert!(timed_out(ump::write_timeout(a, &msg, limit)));
    assert!(t0.elapsed() >= limit && t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());

    // What went in whole is intact.
    assert_eq!(ump::read_timeout(b, &mut buf, limit).unwrap(), msg.len());
    assert!(buf[..msg.len()] == msg[..]);
    ump::exit().unwrap();
}
