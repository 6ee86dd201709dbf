//! `ump_nbread` and `ump_nbwrite` reuse one background thread per channel
//! and direction: many calls create no more threads. Both ends of a
//! shared-memory channel are in this process. (One test: UMP state is
//! per process.)

use std::collections::HashSet;
use std::time::Duration;

use ump::{Config, Event, Want};

/// The ids of this process's threads now.
fn threads() -> HashSet<u64> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok()))
        .collect()
}

#[test]
fn many_non_blocking_calls_reuse_one_thread_each() {
    let base = (std::process::id() as u64) << 24;
    ump::init(Config { shm_buffer: 64 << 10, ..Config::default() }).unwrap();
    let (a, b) = (ump::open(base + 1, base + 2, Want::Shm).unwrap(), ump::open(base + 2, base + 1, Want::Shm).unwrap());
    for ch in [a, b] {
        assert_eq!(ump::wait(Some(ch), Some(Duration::from_secs(10))).unwrap(), Some(Event::Open(ch)));
    }
    let before = threads();
    let mut seen = HashSet::new();
    let mut buf = vec![0u8; 4096];
    for i in 0..40u64 {
        let msg = testkit_message(i);
        // The read starts first and waits for the message in the
        // background: its thread is alive when we look.
        // SAFETY: `buf` outlives the read: we wait for its result below.
        let got = unsafe { ump::nbread(a, buf.as_mut_ptr(), buf.len(), 0) }.unwrap();
        assert_eq!(got, 0, "nothing was sent yet");
        seen.extend(threads().difference(&before).copied());
        ump::nbwrite(b, &msg).unwrap();
        seen.extend(threads().difference(&before).copied());
        let n = loop {
            if let Some(n) = ump::nbread_result(a).unwrap() {
                break n;
            }
            std::thread::yield_now();
        };
        assert_eq!(buf[..n], msg[..], "message {i}");
        while ump::nbwrite_result(b).unwrap().is_none() {
            std::thread::yield_now();
        }
    }
    assert!(
        seen.len() <= 2,
        "40 non-blocking reads and writes ran on {} threads; one reader and one writer were expected",
        seen.len()
    );
    assert!(!seen.is_empty(), "no background thread was ever seen: the test checked nothing");
    ump::close(a).unwrap();
    ump::close(b).unwrap();
    assert!(threads().is_subset(&before), "closing the channels joins their threads");
    ump::exit().unwrap();
}

/// A message that differs per round (length and bytes).
fn testkit_message(i: u64) -> Vec<u8> {
    (0..100 + i as usize * 37).map(|k| (k as u64 * 31 + i) as u8).collect()
}
