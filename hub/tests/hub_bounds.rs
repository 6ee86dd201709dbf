//! Resource bounds against hostile clients: connections that never say
//! `Hello` are capped and time out, idle control connections are capped and
//! closed, a hub out of file descriptors logs and goes on (never panics),
//! and memory after a flood of half-open connections returns to its bound.
//!
//! The last two run `mc-hub` as a subprocess (a lowered fd limit, RSS read
//! from /proc); the others a hub in this process.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use device::link_client::{self as client, HubAddr, Joined, Stream};
use hub::hub::HubConfig;
use hub::testing::{read_event, Seen, TestHub};
use link::{self as link, Msg, ANY_NODE};

const SECRET: &[u8] = b"correct horse battery staple";

fn tcp_join(addr: &str) -> io::Result<(Joined, Stream, io::BufWriter<Stream>)> {
    client::join_addr(
        &HubAddr::Tcp(addr.into()),
        &client::Hello {
            want_node: ANY_NODE,
            page_size: 8192,
            aspace_pages: 64,
            name: "remote",
            secret: Some(SECRET),
            keepalive: false,
        },
    )
}

/// Waits up to `within` for the peer to close `s`; returns how long that took.
fn closed_within(s: &mut impl Read, within: Duration) -> Option<Duration> {
    let t0 = Instant::now();
    let mut b = [0u8; 256];
    loop {
        match s.read(&mut b) {
            Ok(0) => return Some(t0.elapsed()),
            Ok(_) => {}
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
            Err(_) => return Some(t0.elapsed()),
        }
        if t0.elapsed() >= within {
            return None;
        }
    }
}

/// Polls `f` every 20 ms for up to 5 s.
fn eventually(what: &str, f: impl FnMut() -> bool) {
    eventually_within(what, Duration::from_secs(5), f)
}

/// Polls `f` every 20 ms for up to `limit`.
fn eventually_within(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < limit, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A TCP adapter proves the secret, joins, and its write reaches a node on
/// the Unix socket at `unix`.
fn adapter_joins_and_talks(unix: &Path, tcp: &str) {
    let (local, mut lr, _lw) = client::join(unix, ANY_NODE, 8192, 64, "local").expect("Unix adapter joins");
    lr.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let (joined, _r, mut w) = tcp_join(tcp).expect("TCP adapter joins");
    let f = Msg::Write { dest: local.node, flags: 0, addr: 0x40, data: &[7; 8] }.encode();
    link::write_stamped(&mut w, &f, 1).unwrap();
    w.flush().unwrap();
    let mut buf = Vec::new();
    loop {
        match read_event(&mut lr, &mut buf).1 {
            Seen::Member { .. } => continue,
            Seen::Deliver { src, addr, data, .. } => {
                assert_eq!((src, addr, data), (joined.node, 0x40, vec![7; 8]));
                break;
            }
        }
    }
}

/// Beyond `max_unauthenticated` connections that have not said `Hello`, a
/// new one is closed at once and counted; a real adapter joins once the
/// idle ones are gone, and traffic flows.
#[test]
fn hub_caps_unauthenticated_connections() {
    let cap = 8;
    let hub = TestHub::start_with(HubConfig {
        secret: Some(SECRET.to_vec()),
        max_unauthenticated: cap,
        auth_timeout: Duration::from_secs(30),
        ..HubConfig::default()
    });
    let addr = hub.listen_tcp();
    let mut idle = Vec::new();
    let mut buf = Vec::new();
    for _ in 0..cap {
        let mut s = TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        // Admitted: the hub speaks first with its challenge.
        let h = link::read_frame(&mut s, &mut buf).expect("an admitted connection gets a challenge");
        assert!(matches!(Msg::parse(&h, &buf).unwrap(), Msg::Challenge { .. }));
        idle.push(s);
    }
    for i in 0..10 {
        let mut s = TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let took = closed_within(&mut s, Duration::from_secs(2));
        assert!(took.is_some(), "connection {} over the cap of {cap} was not closed", cap + i);
    }
    let st = hub.stats_json();
    assert_eq!((st["unauthenticated"].as_u64(), st["unauthenticated_closed"].as_u64()), (Some(8), Some(10)), "{st}");

    drop(idle);
    eventually("the idle connections are gone", || hub.stats_json()["unauthenticated"] == 0);
    adapter_joins_and_talks(&hub.path, &addr);
    assert_eq!(hub.stats_json()["unauthenticated"], 0, "a joined adapter still holds a place");
}

/// A connection that has not completed its `Hello` by the authentication
/// deadline is closed and counted, on TCP and on the Unix socket.
#[test]
fn hub_drops_connections_without_hello_at_the_deadline() {
    let deadline = Duration::from_millis(300);
    let hub = TestHub::start_with(HubConfig {
        secret: Some(SECRET.to_vec()),
        auth_timeout: deadline,
        ..HubConfig::default()
    });
    let addr = hub.listen_tcp();
    let t0 = Instant::now();
    let mut tcp = TcpStream::connect(&addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    // Half a header: a slow peer is held to the same deadline.
    let mut unix = UnixStream::connect(&hub.path).unwrap();
    unix.write_all(&[0u8; 7]).unwrap();
    unix.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    closed_within(&mut tcp, Duration::from_secs(3)).expect("TCP connection without Hello not closed");
    closed_within(&mut unix, Duration::from_secs(3)).expect("Unix connection without Hello not closed");
    // Both were open for most of the deadline (the TCP one got its
    // challenge, which a read here counts as data, not as the close).
    assert!(t0.elapsed() >= deadline * 3 / 4, "closed before the deadline: {:?}", t0.elapsed());
    assert_eq!(hub.stats_json()["auth_timeouts"], 2);
    adapter_joins_and_talks(&hub.path, &addr);
}

fn control_request(s: &mut UnixStream, r: &mut BufReader<UnixStream>, req: &str) -> serde_json::Value {
    s.write_all(req.as_bytes()).unwrap();
    s.write_all(b"\n").unwrap();
    let mut line = String::new();
    r.read_line(&mut line).expect("control answers");
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("answer {line:?}: {e}"))
}

fn control_conn(path: &Path) -> (UnixStream, BufReader<UnixStream>) {
    let s = UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let r = BufReader::new(s.try_clone().unwrap());
    (s, r)
}

/// Control connections are capped (one more gets an error and is closed)
/// and closed after the idle timeout; control answers new ones afterwards.
#[test]
fn hub_caps_and_times_out_control_connections() {
    let idle_timeout = Duration::from_millis(1000);
    let hub =
        TestHub::start_with(HubConfig { max_control: 4, control_idle_timeout: idle_timeout, ..HubConfig::default() });
    let ctl = hub.listen_control();
    let mut conns: Vec<_> = (0..4).map(|_| control_conn(&ctl)).collect();
    let (s, r) = &mut conns[0];
    // connect() returns once the kernel queued the connection, before the
    // hub accepted it: ask until the hub has all four.
    let t0 = Instant::now();
    loop {
        let st = control_request(s, r, r#"{"cmd":"stats"}"#);
        if st["control_connections"] == 4 {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "the hub did not take 4 control connections: {st}");
        std::thread::sleep(Duration::from_millis(20));
    }

    // One over the cap: told why, then closed.
    let (_s5, mut r5) = control_conn(&ctl);
    let mut line = String::new();
    r5.read_line(&mut line).expect("an answer before the close");
    assert!(line.contains("too many control connections"), "{line}");
    assert!(closed_within(&mut r5, Duration::from_secs(2)).is_some(), "connection over the cap stays open");

    // All four idle ones are closed after the idle timeout, not before.
    let t0 = Instant::now();
    for (_, r) in &mut conns {
        r.get_ref().set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        assert!(closed_within(r, Duration::from_secs(5)).is_some(), "idle control connection still open");
    }
    assert!(t0.elapsed() >= idle_timeout / 2, "closed too early: {:?}", t0.elapsed());
    // Their places are given back just after the close.
    eventually("no control connection left", || hub.stats_json()["control_connections"] == 0);

    let (mut s, mut r) = control_conn(&ctl);
    let st = control_request(&mut s, &mut r, r#"{"cmd":"stats"}"#);
    assert_eq!(
        (&st["control_connections"], &st["control_closed"], &st["control_idle_closed"]),
        (&serde_json::json!(1), &serde_json::json!(1), &serde_json::json!(4)),
        "{st}"
    );
}

/// An `mc-hub` subprocess, with its log in a file.
struct HubProc {
    child: Child,
    dir: tempfile::TempDir,
    tcp: String,
}

impl HubProc {
    /// Starts `mc-hub` on TCP with a control socket, under `ulimit -n nofile`.
    fn start(nofile: u32, extra: &[&str]) -> HubProc {
        let dir = tempfile::tempdir().unwrap();
        let p = |n: &str| dir.path().join(n);
        std::fs::write(p("secret"), SECRET).unwrap();
        let log = std::fs::File::create(p("hub.log")).unwrap();
        let child = Command::new("sh")
            .arg("-c")
            .arg(format!("ulimit -n {nofile} && exec \"$0\" \"$@\""))
            .arg(env!("CARGO_BIN_EXE_mc-hub"))
            .arg("--socket")
            .arg(p("hub.sock"))
            .arg("--control")
            .arg(p("hub.ctl"))
            .args(["--tcp", "127.0.0.1:0", "--tcp-addr-file"])
            .arg(p("tcp.addr"))
            .arg("--secret-file")
            .arg(p("secret"))
            .args(extra)
            .env("MC_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start mc-hub");
        let mut h = HubProc { child, dir, tcp: String::new() };
        eventually("mc-hub listens", || h.path("tcp.addr").exists() && h.path("hub.ctl").exists());
        h.tcp = std::fs::read_to_string(h.path("tcp.addr")).unwrap();
        h
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.path("hub.log")).unwrap()
    }

    fn stats(&self) -> serde_json::Value {
        let (mut s, mut r) = control_conn(&self.path("hub.ctl"));
        control_request(&mut s, &mut r, r#"{"cmd":"stats"}"#)
    }

    /// Resident memory of the hub in KiB (VmRSS).
    fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS line");
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    /// Opens `n` TCP connections that send nothing, holds them for `hold`,
    /// then closes them all.
    fn flood(&self, n: usize, hold: Duration) {
        let conns: Vec<TcpStream> = (0..n).filter_map(|_| TcpStream::connect(&self.tcp).ok()).collect();
        assert!(conns.len() >= n / 2, "only {} of {n} connections could be opened", conns.len());
        std::thread::sleep(hold);
        drop(conns);
    }
}

impl Drop for HubProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Out of file descriptors (`ulimit -n 48`, 200 connections that send
/// nothing): the hub logs the failed accepts and refuses connections, never
/// panics; once the flood closes, control answers and an adapter joins.
#[test]
fn hub_out_of_fds_logs_and_recovers() {
    let hub = HubProc::start(48, &["--auth-timeout", "1"]);
    hub.flood(200, Duration::from_millis(1500));
    // The flood is gone: control answers again and an adapter joins.
    eventually("control answers and no connection is left half-open", || {
        hub.stats()["unauthenticated"].as_u64().unwrap_or(0) == 0
    });
    adapter_joins_and_talks(&hub.path("hub.sock"), &hub.tcp);
    let log = hub.log();
    assert!(log.contains("accept failed"), "the flood did not exhaust the fds; log:\n{log}");
    assert!(!log.contains("panicked"), "the hub panicked; log:\n{log}");
}

/// Connections in one wave of a flood: within the listener's backlog (1024),
/// so that a busy machine does not drop SYNs and slow the flood to a crawl.
const WAVE: usize = 1000;
/// Waves of a flood.
const WAVES: usize = 2;

/// [`WAVES`] waves of [`WAVE`] half-open TCP connections against a hub
/// started with `extra` flags: VmRSS in KiB before, at the fullest (with
/// how many connections the hub held open then) and after the waves closed.
fn flood_rss(extra: &[&str]) -> (u64, (u64, u64), u64) {
    let hub = HubProc::start(8192, extra);
    adapter_joins_and_talks(&hub.path("hub.sock"), &hub.tcp);
    let before = hub.rss_kib();
    let mut peak = (0, 0);
    for _ in 0..WAVES {
        let t0 = Instant::now();
        let conns: Vec<TcpStream> = (0..WAVE).filter_map(|_| TcpStream::connect(&hub.tcp).ok()).collect();
        assert!(conns.len() >= WAVE / 2, "only {} connections could be opened", conns.len());
        println!("{} connections opened in {:?}", conns.len(), t0.elapsed());
        std::thread::sleep(Duration::from_millis(500));
        let open = hub.stats()["unauthenticated"].as_u64().unwrap();
        peak = peak.max((hub.rss_kib(), open));
        drop(conns);
        // Connections the client closed while the kernel still queued them
        // can reach the hub looking alive: the deadline ends those.
        eventually_within("the wave's connections are closed", Duration::from_secs(20), || {
            hub.stats()["unauthenticated"] == 0
        });
    }
    let after = hub.rss_kib();
    let st = hub.stats();
    println!(
        "mc-hub {extra:?}: VmRSS before {before} KiB, fullest {} KiB with {} connections open, \
         after {WAVES} waves of {WAVE} half-open connections {after} KiB; {st}",
        peak.0, peak.1
    );
    (before, peak, after)
}

/// Memory after waves of half-open TCP connections returns to its bound,
/// with the default cap and with the cap raised above the wave (every
/// connection admitted, each holding its greeting state until it closes).
/// Prints the figures: `cargo test -p hub --test hub_bounds memory -- --nocapture`.
#[test]
fn hub_memory_after_half_open_flood_returns() {
    let (before, _, after) = flood_rss(&["--auth-timeout", "2"]);
    assert!(after < before + 20 * 1024, "default cap: RSS {before} KiB -> {after} KiB after the floods closed");
    let (before, (peak, open), after) = flood_rss(&["--max-unauthenticated", "4096", "--auth-timeout", "15"]);
    assert!(after < before + 20 * 1024, "cap 4096: RSS {before} KiB -> {after} KiB after the floods closed");
    // Not trusted yet costs little: well under 16 KiB a connection.
    assert!(open >= WAVE as u64 / 2, "cap 4096: only {open} connections were open at once");
    assert!(peak < before + open * 16, "cap 4096: RSS {before} KiB -> {peak} KiB with {open} connections open");
}
