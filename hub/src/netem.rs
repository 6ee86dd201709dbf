//! A TCP relay that behaves like a slower network: every chunk of bytes it
//! carries, each way, arrives `delay` ± `jitter` (uniform) after it was
//! read, and never before the chunk read ahead of it (a TCP receiver sees
//! the same: a late segment holds back the ones behind it). `mc-netem`
//! puts it between an adapter and the hub, for clusters across hosts on
//! machines whose kernel has no `sch_netem` for `tc qdisc ... netem`.
//!
//! Threads: the accept loop on the caller's thread; per connection one
//! reader and one writer thread each way, joined by a bounded queue (a
//! slow receiver holds the sender back, as the network would). Delays are
//! kept with `thread::sleep` (microsecond resolution; the async runtime's
//! timers round to milliseconds).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Chunks in flight each way before the reader waits.
const IN_FLIGHT: usize = 1024;
/// Most bytes read at once.
const CHUNK: usize = 64 * 1024;

/// What can go wrong with the relay.
#[derive(Debug, thiserror::Error)]
pub enum NetemError {
    /// The listening address cannot be bound.
    #[error("cannot listen on {addr}: {err}")]
    Listen {
        /// The address.
        addr: String,
        /// Why.
        err: std::io::Error,
    },
    /// A delay or jitter that cannot be used.
    #[error("{0}")]
    Setting(String),
}

/// How the relay delays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Mean one-way delay added.
    pub delay: Duration,
    /// Half-width of the uniform spread around `delay` (at most `delay`).
    pub jitter: Duration,
    /// Seed of the jitter (each connection and direction derives its own).
    pub seed: u64,
}

impl Shape {
    /// Checks the shape: the jitter cannot exceed the delay (no chunk
    /// arrives before it was sent).
    pub fn new(delay: Duration, jitter: Duration, seed: u64) -> Result<Shape, NetemError> {
        if jitter > delay {
            return Err(NetemError::Setting(format!(
                "jitter {jitter:?} is more than the delay {delay:?}: a chunk would arrive before it left"
            )));
        }
        Ok(Shape { delay, jitter, seed })
    }

    /// The extra time for one chunk: `delay` ± `jitter`.
    fn draw(&self, rng: &mut fastrand::Rng) -> Duration {
        if self.jitter.is_zero() {
            return self.delay;
        }
        let j = self.jitter.as_nanos() as u64;
        let spread = rng.u64(0..=2 * j);
        (self.delay + Duration::from_nanos(spread)).saturating_sub(self.jitter)
    }
}

/// Parses `200us`, `1.5ms`, `2s` or a bare number of microseconds.
pub fn parse_duration(s: &str) -> Result<Duration, NetemError> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, "us"),
    };
    let v: f64 = num.parse().map_err(|_| NetemError::Setting(format!("'{s}' is not a duration (200us, 1.5ms, 2s)")))?;
    let scale = match unit {
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        _ => return Err(NetemError::Setting(format!("'{s}': the unit must be us, ms or s"))),
    };
    if !(v.is_finite() && v >= 0.0 && v * scale <= 60.0) {
        return Err(NetemError::Setting(format!("'{s}' must be between 0 and 60 s")));
    }
    Ok(Duration::from_secs_f64(v * scale))
}

/// Counters of a running relay.
#[derive(Debug, Default)]
pub struct Counters {
    /// Connections relayed.
    pub connections: AtomicU64,
    /// Bytes carried, both ways.
    pub bytes: AtomicU64,
}

/// Relays every connection to `listener` to `target`, shaped, until the
/// listener fails. Returns only on an accept error.
pub fn serve(listener: TcpListener, target: String, shape: Shape, counters: Arc<Counters>) -> std::io::Result<()> {
    for (n, conn) in listener.incoming().enumerate() {
        let a = conn?;
        let b = match target.to_socket_addrs().and_then(|mut it| {
            it.next()
                .ok_or_else(|| std::io::Error::other(format!("{target} has no address")))
                .and_then(|addr| TcpStream::connect_timeout(&addr, Duration::from_secs(5)))
        }) {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!("cannot reach {target}: {e}; closing the connection from {:?}", a.peer_addr());
                continue;
            }
        };
        let _ = a.set_nodelay(true);
        let _ = b.set_nodelay(true);
        counters.connections.fetch_add(1, Ordering::Relaxed);
        for (k, (from, to)) in [(a.try_clone()?, b.try_clone()?), (b, a)].into_iter().enumerate() {
            let seed = shape.seed ^ ((n as u64) << 1 | k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let (tx, rx) = sync_channel(IN_FLIGHT);
            let c = counters.clone();
            std::thread::Builder::new().name("netem-rd".into()).spawn(move || read_side(from, tx, shape, seed, &c))?;
            std::thread::Builder::new().name("netem-wr".into()).spawn(move || write_side(to, rx))?;
        }
    }
    Ok(())
}

/// Reads chunks and gives each its time of arrival.
fn read_side(mut from: TcpStream, tx: SyncSender<(Instant, Vec<u8>)>, shape: Shape, seed: u64, c: &Counters) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut last = Instant::now();
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        c.bytes.fetch_add(n as u64, Ordering::Relaxed);
        let due = (Instant::now() + shape.draw(&mut rng)).max(last);
        last = due;
        if tx.send((due, buf[..n].to_vec())).is_err() {
            break;
        }
    }
    // Dropping `tx` ends the writer once it has written what is queued.
}

/// Writes each chunk at its time; passes the end on.
fn write_side(mut to: TcpStream, rx: Receiver<(Instant, Vec<u8>)>) {
    for (due, data) in rx {
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        if to.write_all(&data).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_and_bad_ones_are_refused() {
        assert_eq!(parse_duration("200us").unwrap(), Duration::from_micros(200));
        assert_eq!(parse_duration("1.5ms").unwrap(), Duration::from_micros(1500));
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("150").unwrap(), Duration::from_micros(150));
        assert!(parse_duration("fast").unwrap_err().to_string().contains("not a duration"));
        assert!(parse_duration("3h").unwrap_err().to_string().contains("us, ms or s"));
        assert!(parse_duration("-1ms").is_err());
        assert!(parse_duration("61s").is_err());
        let e = Shape::new(Duration::from_micros(100), Duration::from_micros(200), 1).unwrap_err();
        assert!(e.to_string().contains("more than the delay"), "{e}");
    }

    #[test]
    fn jitter_stays_within_its_bounds_and_spreads() {
        let s = Shape::new(Duration::from_micros(200), Duration::from_micros(100), 7).unwrap();
        let mut rng = fastrand::Rng::with_seed(7);
        let d: Vec<Duration> = (0..10_000).map(|_| s.draw(&mut rng)).collect();
        let (lo, hi) = (d.iter().min().unwrap(), d.iter().max().unwrap());
        assert!(*lo >= Duration::from_micros(100) && *hi <= Duration::from_micros(300), "{lo:?} {hi:?}");
        assert!(*lo < Duration::from_micros(110) && *hi > Duration::from_micros(290), "{lo:?} {hi:?}");
    }

    /// Through the relay: everything arrives, in order, and a round trip
    /// takes at least twice the delay.
    #[test]
    fn bytes_arrive_whole_in_order_and_late() {
        let echo = TcpListener::bind("127.0.0.1:0").unwrap();
        let target = echo.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            for c in echo.incoming() {
                let mut c = c.unwrap();
                let mut r = c.try_clone().unwrap();
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut r, &mut c);
                });
            }
        });
        let relay = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = relay.local_addr().unwrap();
        let shape = Shape::new(Duration::from_millis(2), Duration::from_millis(1), 3).unwrap();
        let counters = Arc::new(Counters::default());
        let c2 = counters.clone();
        std::thread::spawn(move || serve(relay, target, shape, c2));
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_nodelay(true).unwrap();
        // A round trip of one byte: twice the delay at least, minus jitter.
        let t0 = Instant::now();
        s.write_all(b"x").unwrap();
        let mut one = [0u8; 1];
        s.read_exact(&mut one).unwrap();
        assert!(t0.elapsed() >= Duration::from_millis(2), "{:?}", t0.elapsed());
        // Many small writes: the bytes come back whole and in order.
        let sent: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let mut w = s.try_clone().unwrap();
        let tx = sent.clone();
        let writer = std::thread::spawn(move || {
            for c in tx.chunks(1000) {
                w.write_all(c).unwrap();
            }
        });
        let mut got = vec![0u8; sent.len()];
        s.read_exact(&mut got).unwrap();
        writer.join().unwrap();
        assert!(got == sent, "bytes lost or out of order");
        assert_eq!(counters.connections.load(Ordering::Relaxed), 1);
        assert_eq!(counters.bytes.load(Ordering::Relaxed), 2 * (1 + sent.len() as u64));
    }
}
