//! UMP between real processes over the shared-memory transport
//! (`ump-tool`, the same binary the QEMU tier runs in guests).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn tool() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ump-tool"))
}

/// Handles no other test (or run) uses.
fn handles() -> (String, String) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(1);
    let base = (std::process::id() as u64) << 20 | N.fetch_add(2, Ordering::Relaxed) << 1;
    (base.to_string(), (base + 1).to_string())
}

#[test]
fn streaming_1_byte_to_16_mib_through_a_small_buffer() {
    let (a, b) = handles();
    let serve = tool()
        .args(["serve", "--me", &a, "--peer", &b, "--transport", "shm"])
        .env("UMP_SHM_BUFFER", "64K")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = tool()
        .args(["pingpong", "--me", &b, "--peer", &a, "--transport", "shm", "--rounds", "2"])
        .args(["--sizes", "1,2,3,4,5,8,100,4095,4096,4097,65535,65536,65537,1M,16M"])
        .env("UMP_SHM_BUFFER", "64K")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("size 16777216 ok") && text.contains("pingpong ok: 15 sizes"), "{text}");
    let served = serve.wait_with_output().unwrap();
    assert!(String::from_utf8_lossy(&served.stdout).contains("served 30 messages"));
}

#[test]
fn a_dead_writer_is_an_error_for_the_reader_not_a_hang() {
    let (a, b) = handles();
    // The writer streams 16 MiB through a 64 KiB buffer nobody reads yet...
    let mut send = tool()
        .args(["send", "--me", &a, "--peer", &b, "--transport", "shm", "--size", "16M"])
        .env("UMP_SHM_BUFFER", "64K")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let recv = tool()
        .args(["recv", "--me", &b, "--peer", &a, "--transport", "shm", "--delay-ms", "1500"])
        .env("UMP_SHM_BUFFER", "64K")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // ...and dies while it waits for room.
    std::thread::sleep(Duration::from_millis(800));
    send.kill().unwrap();
    send.wait().unwrap();
    let t0 = Instant::now();
    let out = recv.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the reader must not report a message");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("received"));
    assert!(err.contains("has exited") || err.contains("gone"), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(10), "the reader noticed only after {:?}", t0.elapsed());
}

#[test]
fn nonblocking_write_completes_with_an_event() {
    let (a, b) = handles();
    let recv = tool()
        .args(["recv", "--me", &b, "--peer", &a, "--delay-ms", "300"])
        .env("UMP_SHM_BUFFER", "64K")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let send = tool()
        .args(["send", "--me", &a, "--peer", &b, "--size", "3M", "--nb"])
        .env("UMP_SHM_BUFFER", "64K")
        .output()
        .unwrap();
    let sent = String::from_utf8_lossy(&send.stdout);
    assert!(send.status.success(), "{sent}{}", String::from_utf8_lossy(&send.stderr));
    assert!(sent.contains("nbwrite started") && sent.contains("sent 3145728 bytes"), "{sent}");
    let got = recv.wait_with_output().unwrap();
    assert!(String::from_utf8_lossy(&got.stdout).contains("received 3145728 bytes intact"));
}

#[test]
fn buffer_sizes_that_cannot_work_are_refused() {
    let (a, b) = handles();
    for bad in ["100", "12", "65M", "lots"] {
        let out = tool().args(["serve", "--me", &a, "--peer", &b]).env("UMP_SHM_BUFFER", bad).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "UMP_SHM_BUFFER={bad} accepted");
        assert!(err.contains("UMP_SHM_BUFFER") || err.contains("4 KiB to 64 MiB"), "{bad}: {err}");
    }
}

#[test]
fn four_processes_every_pair_at_once() {
    let base = (std::process::id() as u64) << 20 | 0xF0000;
    let hs: Vec<u64> = (1..=4).map(|i| base + i).collect();
    let kids: Vec<_> = hs
        .iter()
        .map(|&h| {
            let peers: Vec<String> = hs.iter().filter(|&&p| p != h).map(|p| p.to_string()).collect();
            tool()
                .args(["mesh", "--me", &h.to_string(), "--peers", &peers.join(","), "--rounds", "25"])
                .env("UMP_SHM_BUFFER", "16K")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for k in kids {
        let out = k.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
        assert!(text.contains("mesh ok: 25 rounds with 3 peers"), "{text}");
    }
}

/// Runs `cmd` to its end, killing it (and failing) after `limit`: a tool
/// that hangs fails the test instead of hanging it.
fn run_within(mut cmd: Command, limit: Duration) -> (bool, String, String, Duration) {
    use std::io::Read;
    let t0 = Instant::now();
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t0.elapsed() > limit {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("{cmd:?} still waiting after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (mut out, mut err) = (String::new(), String::new());
    child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    (status.success(), out, err, t0.elapsed())
}

#[test]
fn bench_gives_up_on_an_echo_process_that_never_opens() {
    let (a, b) = handles();
    let dir = tempfile::tempdir().unwrap();
    let mut bench = tool();
    bench.args(["bench", "--me", &a, "--shm-peer", &b, "--timeout", "2", "--sizes", "8"]);
    bench.arg("--svg-dir").arg(dir.path());
    let (ok, _, err, took) = run_within(bench, Duration::from_secs(30));
    assert!(!ok);
    assert!(err.contains("did not open the channel within 2 s") && err.contains(&format!("handle {b}")), "{err}");
    assert!(took < Duration::from_secs(15), "{took:?}");
}

#[test]
fn a_reader_waits_for_a_message_no_longer_than_its_timeout() {
    // Both sides open, both wait to read: nobody will ever send.
    let (a, b) = handles();
    let serve = tool()
        .args(["serve", "--me", &a, "--peer", &b, "--idle", "30"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut recv = tool();
    recv.args(["recv", "--me", &b, "--peer", &a, "--timeout", "2"]);
    let (ok, out, err, took) = run_within(recv, Duration::from_secs(30));
    assert!(!ok, "{out}");
    assert!(err.contains(&format!("a message from handle {a}: nothing within 2 s")), "{err}");
    assert!(took < Duration::from_secs(15), "{took:?}");
    // The reader is gone: the echo process notices and ends, saying so.
    let served = serve.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&served.stdout) + String::from_utf8_lossy(&served.stderr);
    assert!(said.contains("served 0 messages") || said.contains("gone"), "{said}");
}

#[test]
fn an_echo_process_nobody_opens_gives_up_after_its_idle_limit() {
    let (a, b) = handles();
    let mut serve = tool();
    serve.args(["serve", "--me", &a, "--peer", &b, "--idle", "1"]);
    let (ok, _, err, took) = run_within(serve, Duration::from_secs(30));
    assert!(!ok);
    assert!(err.contains("--idle") && err.contains("did not open the channel within 1 s"), "{err}");
    assert!(took < Duration::from_secs(10), "{took:?}");
}

#[test]
fn bench_prints_each_figure_as_measured_and_the_plots() {
    let (a, b) = handles();
    let dir = tempfile::tempdir().unwrap();
    let serve = tool()
        .args(["serve", "--me", &b, "--peer", &a])
        .env("UMP_SHM_BUFFER", "64K")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut bench = tool();
    bench.args(["bench", "--me", &a, "--shm-peer", &b, "--sizes", "8,4K", "--volume", "16K"]);
    bench.arg("--svg-dir").arg(dir.path()).env("UMP_SHM_BUFFER", "64K");
    let (ok, out, err, _) = run_within(bench, Duration::from_secs(60));
    assert!(ok, "{out}{err}");
    for series in ["this guest (Shm), blocking", "this guest (Shm), non-blocking"] {
        for size in [8, 4096] {
            let row = format!("{size:>10} bytes");
            assert!(out.lines().any(|l| l.starts_with(series) && l.contains(&row)), "{series} {size}: {out}");
        }
    }
    assert!(dir.path().join("fig8-latency.svg").exists() && dir.path().join("fig9-bandwidth.svg").exists());
    assert!(serve.wait_with_output().unwrap().status.success());
}
