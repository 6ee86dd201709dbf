//! mpid answers malformed and impossible requests with an error reply and
//! keeps serving. This test talks UMP to it directly (one test in this
//! file: UMP's state is per process).

mod common;

use std::time::Duration;

use common::*;
use mpiexec::proto::{self, Reply, Request, Start};
use ump::{Event, Want};

fn open(me: u64, peer: u64) -> i32 {
    let id = ump::open(me, peer, Want::Any).unwrap();
    let t0 = std::time::Instant::now();
    loop {
        if let Some(Event::Open(i)) = ump::wait(Some(id), Some(Duration::from_millis(100))).unwrap() {
            assert_eq!(i, id);
            return id;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "mpid did not answer");
    }
}

fn ask(id: i32, msg: &[u8]) -> Reply {
    ump::write_timeout(id, msg, Duration::from_secs(5)).unwrap();
    let mut buf = vec![0u8; proto::MAX_MESSAGE];
    let n = ump::read_timeout(id, &mut buf, Duration::from_secs(10)).unwrap();
    proto::decode(&buf[..n]).unwrap()
}

fn start(job: u32, size: u32, ranks: Vec<u32>, argv: &[&str]) -> Vec<u8> {
    proto::encode(&Request::Start(Start {
        job,
        size,
        ranks,
        argv: argv.iter().map(|s| s.to_string()).collect(),
        env: vec![],
        cwd: "/".into(),
        cwd_required: true,
    }))
    .unwrap()
}

fn error_says(r: Reply, says: &str) {
    match r {
        Reply::Error { rank: None, message } => assert!(message.contains(says), "expected '{says}' in '{message}'"),
        other => panic!("expected an error saying '{says}', got {other:?}"),
    }
}

#[test]
fn bad_requests_get_error_replies_and_mpid_keeps_serving() {
    let d = Mpid::start(base(9), 0);
    ump::init(ump::Config::default()).unwrap();
    let mpid = proto::mpid_handle(d.base, 0);
    let mut me = proto::client_handle(0x1234_0000 | (std::process::id() & 0xFFFF));
    for (msg, says) in [
        (b"not json at all".to_vec(), "bad message"),
        (b"{\"op\":\"launch\"}".to_vec(), "bad message"),
        (start(0, 1, vec![0], &["/bin/true"]), "job id 0 is out of range"),
        (start(7, 0, vec![0], &["/bin/true"]), "job size 0 is out of range"),
        (start(7, 2, vec![2], &["/bin/true"]), "rank 2 is not below the job size 2"),
        (start(7, 2, vec![1, 1], &["/bin/true"]), "rank 1 is listed twice"),
        (start(7, 2, vec![], &["/bin/true"]), "no ranks to start"),
        (start(7, 1, vec![0], &[]), "no program to run"),
    ] {
        // A fresh channel per request (one job per channel).
        me += 1 << 20;
        let id = open(me, mpid);
        error_says(ask(id, &msg), says);
        ump::close(id).unwrap();
    }
    // The same channel cannot start twice.
    me += 1 << 20;
    let id = open(me, mpid);
    let job = 0x0077_0000 | (std::process::id() & 0xFFFF);
    match ask(id, &start(job, 1, vec![0], &["/bin/sleep", "30"])) {
        Reply::Started { rank: 0, pid } => assert!(alive(pid)),
        other => panic!("{other:?}"),
    }
    error_says(ask(id, &start(job, 1, vec![0], &["/bin/true"])), "started its job already");
    // Kill ends the rank: SIGTERM to its process group.
    ump::write_timeout(id, &proto::encode(&Request::Kill).unwrap(), Duration::from_secs(5)).unwrap();
    let mut buf = vec![0u8; proto::MAX_MESSAGE];
    let n = ump::read_timeout(id, &mut buf, Duration::from_secs(10)).unwrap();
    match proto::decode::<Reply>(&buf[..n]).unwrap() {
        Reply::Exited { rank: 0, code: None, signal: Some(15) } => {}
        other => panic!("Kill: {other:?}"),
    }
    ump::close(id).unwrap();
    assert!(alive(d.pid()), "mpid died");
    ump::exit().unwrap();
}
