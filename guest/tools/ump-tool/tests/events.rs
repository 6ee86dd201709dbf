//! The UMP API in this process against `ump-tool` peers over shared
//! memory: `ump_listen`, `ump_wait` events, `ump_nbread`, and closing a
//! channel in the middle of a message. (One test: UMP state is per process.)

use std::process::{Command, Stdio};
use std::time::Duration;

use testkit::message as pattern;
use ump::{Config, Event, Want};

fn tool() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ump-tool"));
    c.env("UMP_SHM_BUFFER", "64K");
    c
}

fn next_event(ch: Option<i32>) -> Event {
    ump::wait(ch, Some(Duration::from_secs(30))).unwrap().expect("an event within 30 s")
}

#[test]
fn listen_wait_nbread_and_close_mid_message() {
    let base = (std::process::id() as u64) << 24;
    let cfg = Config { shm_buffer: 64 << 10, ..Config::default() };
    ump::init(cfg.clone()).unwrap();
    assert!(matches!(ump::init(cfg), Err(ump::UmpError::Busy(_))), "a second init is refused");

    // 1. A listener learns of a client it did not know, and sees its
    //    messages and its close as events.
    let server = base + 1;
    ump::listen(server, Want::Any).unwrap();
    let client = tool()
        .args(["pingpong", "--me", &(base + 2).to_string(), "--peer", &server.to_string()])
        .args(["--sizes", "8,100000", "--rounds", "1"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let Event::Open(ch) = next_event(None) else { panic!("expected Open") };
    let mut buf = vec![0u8; 200_000];
    for _ in 0..2 {
        assert_eq!(next_event(Some(ch)), Event::Message(ch));
        let n = ump::read(ch, &mut buf).unwrap();
        ump::write(ch, &buf[..n]).unwrap();
    }
    assert_eq!(next_event(Some(ch)), Event::Closed(ch));
    assert!(matches!(ump::read(ch, &mut buf), Err(ump::UmpError::Channel(ump::ChanError::Closed(_)))));
    let out = client.wait_with_output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("pingpong ok: 2 sizes"));
    ump::close(ch).unwrap();

    // 1b. A listener idle long enough that its folder of notices settled
    //     (it then only stats the folder) still sees the next client.
    let t0 = std::time::Instant::now();
    while t0.elapsed() < Duration::from_millis(400) {
        assert_eq!(ump::wait(None, Some(Duration::ZERO)).unwrap(), None, "nothing happens while nobody opens");
        std::thread::sleep(Duration::from_millis(20));
    }
    // (With UMP_TRACE: the client says how long its open took.)
    let client = tool()
        .args(["pingpong", "--me", &(base + 5).to_string(), "--peer", &server.to_string()])
        .args(["--sizes", "8", "--rounds", "1"])
        .env("UMP_TRACE", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let Event::Open(ch) = next_event(None) else { panic!("expected Open from the second client") };
    assert_eq!(next_event(Some(ch)), Event::Message(ch));
    let n = ump::read(ch, &mut buf).unwrap();
    ump::write(ch, &buf[..n]).unwrap();
    assert_eq!(next_event(Some(ch)), Event::Closed(ch));
    let out = client.wait_with_output().unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("ump_open {:#x} -> {server:#x}: ", base + 5)) && err.contains("(our side +"),
        "UMP_TRACE's line for the open:\n{err}"
    );
    ump::close(ch).unwrap();

    // 1c. A listener's waker sleeps while nobody opens, and wakes as soon
    //     as a client does (what an idle mpid sleeps on).
    assert!(
        matches!(ump::listen_waker(base + 99), Err(ump::UmpError::Invalid(_))),
        "a waker for a handle that does not listen"
    );
    let waker = ump::listen_waker(server).unwrap();
    assert!(!waker.sleep(Duration::from_millis(300)), "woken with nobody opening");
    let client = tool()
        .args(["pingpong", "--me", &(base + 6).to_string(), "--peer", &server.to_string()])
        .args(["--sizes", "8", "--rounds", "1"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    assert!(waker.sleep(Duration::from_secs(30)), "not woken by an opener");
    assert!(t0.elapsed() < Duration::from_secs(20), "woken only after {:?}", t0.elapsed());
    let Event::Open(ch) = next_event(None) else { panic!("expected Open from the third client") };
    assert_eq!(next_event(Some(ch)), Event::Message(ch));
    let n = ump::read(ch, &mut buf).unwrap();
    ump::write(ch, &buf[..n]).unwrap();
    assert_eq!(next_event(Some(ch)), Event::Closed(ch));
    assert!(client.wait_with_output().unwrap().status.success());
    ump::close(ch).unwrap();
    drop(waker);

    // 2. ump_nbread returns once `min` bytes are in; the rest arrives in
    //    the background and ReadDone says so.
    let (me, peer) = (base + 3, base + 4);
    let sender = tool()
        .args(["send", "--me", &peer.to_string(), "--peer", &me.to_string(), "--size", "2M"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let ch = ump::open(me, peer, Want::Any).unwrap();
    assert_eq!(ump::transport(ch).unwrap(), ump::Transport::Shm, "the peer is on this guest");
    assert_eq!(next_event(Some(ch)), Event::Open(ch));
    let mut big = vec![0u8; 2 << 20];
    // SAFETY: `big` outlives the read (we wait for ReadDone below).
    let got = unsafe { ump::nbread(ch, big.as_mut_ptr(), big.len(), 4096) }.unwrap();
    assert!(got >= 4096, "{got}");
    loop {
        match next_event(Some(ch)) {
            Event::ReadDone(c) => {
                assert_eq!(c, ch);
                break;
            }
            other => assert!(matches!(other, Event::Message(_)), "{other:?}"),
        }
    }
    assert_eq!(ump::nbread_result(ch).unwrap(), Some(2 << 20));
    assert!(big == pattern(7, 2 << 20), "the non-blocking read delivered the message intact");
    ump::close(ch).unwrap();
    assert!(sender.wait_with_output().unwrap().status.success());

    // 3. Closing a channel while a message is half-streamed: the reader
    //    gets an error, never half a message.
    let (me, peer) = (base + 5, base + 6);
    let reader = tool()
        .args(["recv", "--me", &peer.to_string(), "--peer", &me.to_string(), "--delay-ms", "1500"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let ch = ump::open(me, peer, Want::Shm).unwrap();
    assert_eq!(next_event(Some(ch)), Event::Open(ch));
    ump::nbwrite(ch, &vec![1u8; 16 << 20]).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(ump::nbwrite_result(ch).unwrap(), None, "16 MiB cannot be through a 64 KiB buffer yet");
    ump::close(ch).unwrap();
    let out = reader.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("in the middle of a message"), "{err}");
    assert!(matches!(ump::close(ch), Err(ump::UmpError::NoChannel(_))));

    // 4. ump_info and ump_exit.
    let info = ump::info().unwrap();
    assert_eq!((info.channels, info.shm_buffer), (0, 64 << 10));
    ump::exit().unwrap();
    assert!(matches!(ump::open(1, 2, Want::Shm), Err(ump::UmpError::NotInitialized)));
}
