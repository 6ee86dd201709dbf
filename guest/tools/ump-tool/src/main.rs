//! `ump-tool`: UMP from a shell, for tests and measurements.
//!
//! - `serve`: echo every message back until the other side closes;
//! - `pingpong`: messages of the given sizes there and back, contents checked;
//! - `send` / `recv`: one large message, checked byte for byte;
//! - `bench`: the paper's Figures 8 and 9, each figure printed as measured.
//!
//! Every wait for another process has a deadline (`--timeout`; for
//! `serve`, `--idle`) and fails naming what it waited for.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use testkit::message as pattern;
use testkit::plot;
use ump::{Config, Event, Want};

#[derive(Parser)]
#[command(
    version,
    about = "UMP channels from a shell",
    long_about = "UMP channels from a shell.\n\n\
                  Opens UMP channels between 64-bit handles (--me, --peer): over shared memory \
                  inside a guest, over MEMORY CHANNEL between guests (through imcd). Every wait for \
                  another process has a deadline (--timeout, serve --idle).",
    after_help = "Examples (from the host, mc-cluster exec N -- ...):
  ump-tool serve --me 1 --peer 2                    echo for a peer (start first)
  ump-tool pingpong --me 2 --peer 1 --sizes 0,8,1K,1M
  ump-tool bench --me 2 --mc-peer 1 --sizes 0,8,1K  Figures 8 and 9 against a serve

Exit codes: 0 success; 1 an error or a check that failed (the message starts
with \"Error:\"); 2 a usage error."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Args, Clone)]
struct Ends {
    /// Our handle.
    #[arg(long)]
    me: u64,
    /// The other side's handle.
    #[arg(long)]
    peer: u64,
    /// any, shm or mc.
    #[arg(long, default_value = "any")]
    transport: String,
    /// Longest wait, in seconds, for the other side: to open the channel,
    /// to send a message, to take one.
    #[arg(long, default_value_t = 60)]
    timeout: u64,
}

#[derive(Subcommand)]
enum Cmd {
    /// Echo every message back until the other side closes.
    ///
    /// Or, having sent at least one message, exits without a close reaching us.
    Serve {
        #[command(flatten)]
        ends: Ends,
        /// Also echo TCP frames (4-byte length, payload) on this port.
        #[arg(long)]
        tcp_port: Option<u16>,
        /// Give up after this many seconds with nothing to do: the other
        /// side not opening the channel yet, or sending nothing (a client
        /// may measure other things for a long while in between).
        #[arg(long, default_value_t = 3600)]
        idle: u64,
    },
    /// The paper's Figures 8 and 9: message time and bandwidth against size.
    ///
    /// One-way message time and bandwidth against size, blocking and
    /// non-blocking writes, over each channel given (each peer runs `serve`),
    /// and over TCP; prints a table and writes two SVG plots.
    Bench {
        /// Our handle.
        #[arg(long)]
        me: u64,
        /// A peer on another guest (MEMORY CHANNEL).
        #[arg(long)]
        mc_peer: Option<u64>,
        /// A peer on this guest (shared memory).
        #[arg(long)]
        shm_peer: Option<u64>,
        /// TCP echo of a peer (HOST:PORT), for comparison.
        #[arg(long)]
        tcp: Option<String>,
        /// Message sizes.
        #[arg(long, default_value = "0,8,64,512,4K,32K,256K,1M")]
        sizes: String,
        /// Bytes moved per size (rounds = this / size, at least 5).
        #[arg(long, default_value = "4M")]
        volume: String,
        /// Where to write fig8-latency.svg and fig9-bandwidth.svg.
        #[arg(long, default_value = "/tmp")]
        svg_dir: String,
        /// Longest wait, in seconds, for a peer: to open its channel, to
        /// answer one message, for a TCP connection or answer.
        #[arg(long, default_value_t = 60)]
        timeout: u64,
        /// Name of the MEMORY CHANNEL series (to tell runs with different
        /// settings apart).
        #[arg(long, default_value = "other guest")]
        mc_label: String,
        /// Blocking writes only (no non-blocking series).
        #[arg(long)]
        blocking_only: bool,
    },
    /// The guest's own copy speed: the floor under any message passing in it.
    ///
    /// A plain copy, and a copy followed by UMP's payload check (what each
    /// side of a MEMORY CHANNEL message does), for each size.
    Floor {
        /// Sizes.
        #[arg(long, default_value = "4K,64K,1M,4M")]
        sizes: String,
        /// Bytes copied per size.
        #[arg(long, default_value = "64M")]
        volume: String,
    },
    /// Send messages of each size, read the echo, check it.
    Pingpong {
        #[command(flatten)]
        ends: Ends,
        /// Message sizes, comma separated (bytes; K and M suffixes).
        #[arg(long, default_value = "0,1,7,8,9,1K,64K,1M")]
        sizes: String,
        /// Round trips per size.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Go over the sizes again and again until this file exists (for a
        /// run that must outlast something done beside it, such as faults
        /// injected at the hub), within --timeout of the start.
        #[arg(long)]
        until: Option<std::path::PathBuf>,
    },
    /// Send one message of SIZE bytes (a checkable pattern).
    Send {
        #[command(flatten)]
        ends: Ends,
        /// Bytes.
        #[arg(long)]
        size: String,
        /// Non-blocking write, then wait for its completion event.
        #[arg(long)]
        nb: bool,
    },
    /// Talk to every peer at once, every message checked.
    ///
    /// Each round, a message of varying size to each (non-blocking writes),
    /// then one from each, all checked.
    Mesh {
        /// Our handle.
        #[arg(long)]
        me: u64,
        /// The other handles, comma separated.
        #[arg(long)]
        peers: String,
        /// Rounds.
        #[arg(long, default_value_t = 20)]
        rounds: u64,
        /// Largest message.
        #[arg(long, default_value = "100K")]
        max: String,
        /// Longest wait, in seconds, for a peer (to open, to send, to take a message).
        #[arg(long, default_value_t = 60)]
        timeout: u64,
    },
    /// Listen on handle ME for COUNT channels from handles it does not know.
    ///
    /// From this guest and others; echo one message on each.
    Listen {
        /// Our handle.
        #[arg(long)]
        me: u64,
        /// Channels to accept.
        #[arg(long, default_value_t = 1)]
        count: usize,
        /// Longest wait, in seconds, for the channels to come.
        #[arg(long, default_value_t = 120)]
        timeout: u64,
    },
    /// Multicast COUNT messages to every peer with one ump_mcast each.
    ///
    /// Sizes up to MAX; waits until every peer has closed.
    McastSend {
        /// Our handle.
        #[arg(long)]
        me: u64,
        /// The receivers' handles, comma separated.
        #[arg(long)]
        peers: String,
        /// Messages.
        #[arg(long, default_value_t = 50)]
        count: u64,
        /// Largest message.
        #[arg(long, default_value = "64K")]
        max: String,
        /// Longest wait, in seconds, for the receivers (to open, to take
        /// each message, to finish and close).
        #[arg(long, default_value_t = 120)]
        timeout: u64,
    },
    /// Receive COUNT multicast messages from FROM and check each.
    McastRecv {
        /// Our handle.
        #[arg(long)]
        me: u64,
        /// The sender's handle.
        #[arg(long)]
        from: u64,
        /// Messages.
        #[arg(long, default_value_t = 50)]
        count: u64,
        /// Largest message (as the sender's --max).
        #[arg(long, default_value = "64K")]
        max: String,
        /// Longest wait, in seconds, for the sender (to open, for each message).
        #[arg(long, default_value_t = 120)]
        timeout: u64,
    },
    /// Receive one message and check it is the pattern `send` sends.
    Recv {
        #[command(flatten)]
        ends: Ends,
        /// Largest size expected.
        #[arg(long, default_value = "16M")]
        max: String,
        /// Wait this long before reading (lets the sender fill the buffer).
        #[arg(long, default_value_t = 0)]
        delay_ms: u64,
    },
}

fn want(s: &str) -> Result<Want> {
    Ok(match s {
        "any" => Want::Any,
        "shm" => Want::Shm,
        "mc" => Want::Mc,
        o => bail!("--transport {o:?}: any, shm or mc"),
    })
}

fn size(s: &str) -> Result<usize> {
    let s = s.trim();
    let (n, m) = match s.as_bytes().last() {
        Some(b'K' | b'k') => (&s[..s.len() - 1], 1 << 10),
        Some(b'M' | b'm') => (&s[..s.len() - 1], 1 << 20),
        _ => (s, 1),
    };
    Ok(n.parse::<usize>().with_context(|| format!("size {s:?}"))? * m)
}

/// Seconds as a duration.
fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// What a timed-out or failed channel call means, naming what we waited for.
fn waited(what: &str, limit: Duration, e: ump::UmpError) -> anyhow::Error {
    match e {
        ump::UmpError::Channel(ump::ChanError::Timeout | ump::ChanError::NotOpen) => {
            anyhow::anyhow!("{what}: nothing within {} s", limit.as_secs_f64())
        }
        e => anyhow::anyhow!("{what}: {e}"),
    }
}

/// `ump_read` waiting at most `limit` for the message.
fn read_within(ch: i32, buf: &mut [u8], limit: Duration, what: &str) -> Result<usize> {
    ump::read_timeout(ch, buf, limit).map_err(|e| waited(what, limit, e))
}

/// `ump_write` waiting at most `limit` for room (the reader to read).
fn write_within(ch: i32, msg: &[u8], limit: Duration, what: &str) -> Result<()> {
    ump::write_timeout(ch, msg, limit).map_err(|e| waited(what, limit, e))
}

/// Waits at most `limit` for channel `ch`'s non-blocking write to finish.
fn nbwrite_done(ch: i32, limit: Duration, what: &str) -> Result<()> {
    let t0 = Instant::now();
    let mut spins = 0u32;
    while ump::nbwrite_result(ch).map_err(|e| anyhow::anyhow!("{what}: {e}"))?.is_none() {
        if t0.elapsed() > limit {
            bail!("{what}: the non-blocking write did not finish within {} s", limit.as_secs_f64());
        }
        spins += 1;
        if spins < 1024 {
            std::hint::spin_loop();
        } else {
            std::thread::sleep(Duration::from_micros(100));
        }
    }
    Ok(())
}

/// TCP echo: frames of a 4-byte length and that many bytes, sent back
/// whole. A connection silent for `idle` is dropped.
fn tcp_echo(l: std::net::TcpListener, idle: Duration) {
    use std::io::{Read, Write};
    for s in l.incoming() {
        let Ok(mut s) = s else { continue };
        let _ = s.set_nodelay(true);
        let _ = s.set_read_timeout(Some(idle));
        let _ = s.set_write_timeout(Some(idle));
        let mut buf = vec![0u8; 16 << 20];
        loop {
            let mut len = [0u8; 4];
            if let Err(e) = s.read_exact(&mut len) {
                if e.kind() != std::io::ErrorKind::UnexpectedEof {
                    eprintln!("TCP echo: dropping the connection: {e} (idle limit {} s)", idle.as_secs());
                }
                break;
            }
            let n = u32::from_le_bytes(len) as usize;
            if n > buf.len() || s.read_exact(&mut buf[..n]).is_err() {
                break;
            }
            if s.write_all(&len).and_then(|_| s.write_all(&buf[..n])).is_err() {
                break;
            }
        }
    }
}

/// One-way time (half the median round trip) of `size`-byte messages,
/// over `rounds` timed trips after one untimed one (as NetPIPE and the OSU
/// benchmarks warm up): the first trip of a size touches fresh pages of
/// the message buffers, at a page fault per 4 KiB on each side.
fn time_round_trips(rounds: usize, mut trip: impl FnMut() -> Result<()>) -> Result<f64> {
    trip()?;
    let mut t = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t0 = Instant::now();
        trip()?;
        t.push(t0.elapsed());
    }
    let median = testkit::stats::Summary::of(&mut t).context("no round trips")?.p50;
    Ok(median.as_secs_f64() / 2.0)
}

/// Prints one figure of the benchmark at once (a long run shows its
/// progress, and what was measured survives a later failure).
fn print_point(series: &str, size: usize, one_way: f64) -> Result<()> {
    use std::io::Write;
    println!("{series:<40} {size:>10} bytes {:>12.1} us {:>11.2} MB/s", one_way * 1e6, size as f64 / one_way / 1e6);
    std::io::stdout().flush()?;
    Ok(())
}

/// Settings of `bench`.
struct BenchArgs<'a> {
    me: u64,
    peers: Vec<(&'a str, u64)>,
    tcp: Option<&'a str>,
    sizes: Vec<usize>,
    volume: usize,
    svg_dir: &'a str,
    limit: Duration,
    blocking_only: bool,
}

fn bench(a: &BenchArgs) -> Result<()> {
    use std::io::{Read, Write};
    let (me, sizes, volume, limit) = (a.me, &a.sizes, a.volume, a.limit);
    ump::init(Config::from_env()?)?;
    let mut series: Vec<(String, Vec<(usize, f64)>)> = Vec::new();
    let max = sizes.iter().copied().max().unwrap_or(0).max(1);
    let mut buf = vec![0u8; max];
    let mut opened = Vec::new();
    let mut moved = 0usize;
    println!("one-way time (half the median round trip) and bandwidth (size / time), each as measured:");
    std::io::stdout().flush()?;
    for &(name, peer) in &a.peers {
        let ch = ump::open(me, peer, Want::Any)?;
        opened.push(ch);
        wait_open(ch, limit).with_context(|| format!("{name}: the echo process (handle {peer}, `ump-tool serve`)"))?;
        let kind = format!("{:?}", ump::transport(ch)?);
        for nb in [false, true] {
            if nb && a.blocking_only {
                continue;
            }
            let label = format!("{name} ({kind}), {}", if nb { "non-blocking" } else { "blocking" });
            let mut pts = Vec::new();
            for &s in sizes {
                let msg = pattern(s as u64, s);
                let rounds = (volume / s.max(1024)).clamp(5, 400);
                let what = format!("{label}, {s} bytes, echo process {peer}");
                let one_way = time_round_trips(rounds, || {
                    if nb {
                        ump::nbwrite(ch, &msg)?;
                    } else {
                        write_within(ch, &msg, limit, &what)?;
                    }
                    let n = read_within(ch, &mut buf, limit, &format!("{what}: its echo"))?;
                    if nb {
                        nbwrite_done(ch, limit, &what)?;
                    }
                    anyhow::ensure!(n == s && buf[..n] == msg[..], "echo of {s} bytes differs");
                    Ok(())
                })?;
                print_point(&label, s, one_way)?;
                moved += 2 * s * (rounds + 1);
                pts.push((s, one_way));
            }
            series.push((label, pts));
        }
    }
    if let Some(addr) = a.tcp {
        use std::net::ToSocketAddrs;
        let to = addr.to_socket_addrs().with_context(|| format!("TCP {addr}"))?.next().context("no address")?;
        let mut s = std::net::TcpStream::connect_timeout(&to, limit)
            .with_context(|| format!("TCP connection to the echo process at {addr}"))?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(limit))?;
        s.set_write_timeout(Some(limit))?;
        let mut pts = Vec::new();
        for &size in sizes {
            let msg = pattern(size as u64, size);
            let rounds = (volume / size.max(1024)).clamp(5, 400);
            let one_way = time_round_trips(rounds, || {
                let what = || format!("TCP echo of {size} bytes from {addr} (timeout {} s)", limit.as_secs_f64());
                s.write_all(&(size as u32).to_le_bytes()).with_context(what)?;
                s.write_all(&msg).with_context(what)?;
                let mut len = [0u8; 4];
                s.read_exact(&mut len).with_context(what)?;
                s.read_exact(&mut buf[..size]).with_context(what)?;
                anyhow::ensure!(buf[..size] == msg[..], "TCP echo of {size} bytes differs");
                Ok(())
            })?;
            print_point("TCP", size, one_way)?;
            moved += 2 * size * (rounds + 1);
            pts.push((size, one_way));
        }
        series.push(("TCP".into(), pts));
    }
    // The echo processes serve TCP until their channel closes.
    for ch in opened {
        ump::close(ch)?;
    }
    println!("moved {moved} bytes in all (both ways)");
    println!();
    println!("UMP message time (one way, half the median round trip) and bandwidth (size / time)");
    print!("{:>10}", "bytes");
    for (name, _) in &series {
        print!(" | {name:>34}");
    }
    println!();
    for (i, &s) in sizes.iter().enumerate() {
        print!("{s:>10}");
        for (_, pts) in &series {
            let t = pts[i].1;
            print!(" | {:>12.1} us {:>11.2} MB/s", t * 1e6, s as f64 / t / 1e6);
        }
        println!();
    }
    let lat: Vec<plot::Series> = series
        .iter()
        .map(|(n, p)| plot::Series { name: n.clone(), points: p.iter().map(|&(s, t)| (s as f64, t * 1e6)).collect() })
        .collect();
    let bw: Vec<plot::Series> = series
        .iter()
        .map(|(n, p)| plot::Series {
            name: n.clone(),
            points: p.iter().map(|&(s, t)| (s as f64, s as f64 / t / 1e6)).collect(),
        })
        .collect();
    let f8 = format!("{}/fig8-latency.svg", a.svg_dir);
    let f9 = format!("{}/fig9-bandwidth.svg", a.svg_dir);
    // Only 0-byte messages (the latency benchmark's series) have nothing
    // to draw on log axes: the table above is the result.
    match plot::svg("UMP message transfer time (Figure 8)", "message size (bytes)", "one-way time (us)", &lat) {
        Err(plot::PlotError::NoPoints) => println!("plots: none (no size above 0 bytes)"),
        fig8 => {
            std::fs::write(&f8, fig8?)?;
            std::fs::write(&f9, plot::svg("UMP bandwidth (Figure 9)", "message size (bytes)", "MB/s", &bw)?)?;
            println!("plots: {f8} {f9}");
        }
    }
    ump::exit()?;
    Ok(())
}

/// Size of multicast message `i` (up to `max`).
fn mcast_len(i: u64, max: usize) -> usize {
    ((i * 7919 + 13) % (max as u64 + 1)) as usize
}

/// Opens a channel from `me` to each peer (UMP_ANY) and waits until all are complete.
fn open_all(me: u64, peers: &[u64], limit: Duration) -> Result<Vec<i32>> {
    let chans: Vec<i32> = peers.iter().map(|&p| ump::open(me, p, Want::Any)).collect::<Result<_, _>>()?;
    let mut open = std::collections::HashSet::new();
    let t0 = Instant::now();
    while open.len() < chans.len() {
        let left = limit.saturating_sub(t0.elapsed());
        match ump::wait(None, Some(left))? {
            Some(Event::Open(c)) => {
                open.insert(c);
            }
            Some(_) if t0.elapsed() <= limit => {}
            _ => {
                let missing: Vec<String> =
                    peers.iter().zip(&chans).filter(|(_, c)| !open.contains(*c)).map(|(p, _)| p.to_string()).collect();
                bail!(
                    "only {} of {} channels opened within {} s: handle(s) {} did not open theirs",
                    open.len(),
                    chans.len(),
                    limit.as_secs_f64(),
                    missing.join(",")
                )
            }
        }
    }
    Ok(chans)
}

/// Waits at most `limit` for channel `ch` to be complete (the other side
/// opened it too).
fn wait_open(ch: i32, limit: Duration) -> Result<()> {
    let t0 = Instant::now();
    loop {
        let left = limit.saturating_sub(t0.elapsed());
        match ump::wait(Some(ch), Some(left))? {
            Some(Event::Open(_)) => return Ok(()),
            Some(_) if t0.elapsed() <= limit => continue,
            _ => bail!("the other side did not open the channel within {} s", limit.as_secs_f64()),
        }
    }
}

/// What a channel did about bytes lost in transit, and what its writer
/// sent by DMA.
fn repairs(ch: i32) -> Result<String> {
    let c = ump::chan(ch)?;
    let (asked, served) = c.repairs();
    Ok(format!("repairs: asked {asked}, served {served}; dma: {} bytes", c.dma_bytes()))
}

/// `ump_init`, then opens the channel of `e` and waits at most `limit`
/// for the other side to open it.
fn open(e: &Ends, limit: Duration) -> Result<i32> {
    ump::init(Config::from_env()?)?;
    let ch = ump::open(e.me, e.peer, want(&e.transport)?).map_err(|e| anyhow::anyhow!("ump_open: {e}"))?;
    let t0 = Instant::now();
    wait_open(ch, limit).with_context(|| format!("channel {} <-> {}", e.me, e.peer))?;
    eprintln!(
        "channel {:#x} <-> {:#x} open over {:?} after {:.1} ms",
        e.me,
        e.peer,
        ump::transport(ch)?,
        t0.elapsed().as_secs_f64() * 1e3
    );
    Ok(ch)
}

fn main() -> std::process::ExitCode {
    testkit::exit::run_main(run)
}

fn run() -> Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Serve { ends, tcp_port, idle } => {
            let idle = secs(idle);
            if let Some(port) = tcp_port {
                let l = std::net::TcpListener::bind(("0.0.0.0", port)).with_context(|| format!("TCP port {port}"))?;
                std::thread::spawn(move || tcp_echo(l, idle));
            }
            let ch = open(&ends, idle).context("serve (--idle)")?;
            let mut buf = vec![0u8; 16 << 20];
            let mut n = 0u64;
            loop {
                match ump::read_timeout(ch, &mut buf, idle) {
                    Ok(len) => write_within(ch, &buf[..len], secs(ends.timeout), "serve: echoing a message")?,
                    Err(ump::UmpError::Channel(ump::ChanError::Closed(_))) => break,
                    // A client that exited after its last echo, whose close
                    // did not reach us (a store lost to a link flap or a
                    // corrupt frame): the end of its session, not an error.
                    // Whether it got every echo is for the client to say.
                    Err(ump::UmpError::Channel(ump::ChanError::PeerDead(why))) if n > 0 => {
                        println!("the other side exited without a close reaching us ({why})");
                        break;
                    }
                    Err(ump::UmpError::Channel(ump::ChanError::Timeout)) => {
                        bail!("serve: no message from handle {} for {} s (--idle)", ends.peer, idle.as_secs())
                    }
                    Err(e) => bail!("serve: {e}"),
                }
                n += 1;
            }
            println!("served {n} messages; {}", repairs(ch)?);
            ump::exit()?;
        }
        Cmd::Pingpong { ends, sizes, rounds, until } => {
            let limit = secs(ends.timeout);
            let started = Instant::now();
            let ch = open(&ends, limit)?;
            let sizes: Vec<usize> = sizes.split(',').map(size).collect::<Result<_>>()?;
            let mut buf = vec![0u8; sizes.iter().copied().max().unwrap_or(0).max(1)];
            let mut seq = 0u64;
            let mut passes = 0u64;
            loop {
                passes += 1;
                for &s in &sizes {
                    let mut times = Vec::with_capacity(rounds);
                    for _ in 0..rounds {
                        seq += 1;
                        let msg = pattern(seq, s);
                        let t0 = Instant::now();
                        write_within(ch, &msg, limit, &format!("sending {s} bytes to handle {}", ends.peer))?;
                        let n = read_within(
                            ch,
                            &mut buf,
                            limit,
                            &format!("the echo of {s} bytes from handle {}", ends.peer),
                        )?;
                        times.push(t0.elapsed().as_secs_f64());
                        if n != s || buf[..n] != msg[..] {
                            bail!("size {s}: echo of {n} bytes differs from what was sent");
                        }
                    }
                    times.sort_by(f64::total_cmp);
                    let at = |q: f64| {
                        times.get(((times.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(0.0) * 1e6
                    };
                    let mean = times.iter().sum::<f64>() / times.len().max(1) as f64 * 1e6;
                    println!(
                        "size {s} ok: best round trip {:.1} us; median {:.1}, p90 {:.1}, mean {mean:.1} us ({} rounds)",
                        at(0.0),
                        at(0.5),
                        at(0.9),
                        times.len()
                    );
                }
                match &until {
                    None => break,
                    Some(file) if file.exists() => break,
                    Some(file) if started.elapsed() > limit => {
                        bail!("{} did not appear within {} s ({passes} passes)", file.display(), ends.timeout)
                    }
                    Some(_) => {}
                }
            }
            println!("{}", repairs(ch)?);
            ump::close(ch)?;
            ump::exit()?;
            let over = if passes > 1 { format!(", {passes} passes") } else { String::new() };
            println!("pingpong ok: {} sizes{over}", sizes.len());
        }
        Cmd::Send { ends, size: s, nb } => {
            let limit = secs(ends.timeout);
            let ch = open(&ends, limit)?;
            let msg = pattern(7, size(&s)?);
            let t0 = Instant::now();
            let what = format!("sending {} bytes to handle {}", msg.len(), ends.peer);
            if nb {
                ump::nbwrite(ch, &msg)?;
                println!("nbwrite started");
                loop {
                    match ump::wait(Some(ch), Some(limit))? {
                        Some(Event::WriteDone(_)) => break,
                        Some(_) if t0.elapsed() <= limit => std::thread::sleep(Duration::from_millis(1)),
                        _ => bail!("{what}: no WriteDone event within {} s", limit.as_secs()),
                    }
                }
                ump::nbwrite_result(ch)?;
            } else {
                write_within(ch, &msg, limit, &what)?;
            }
            println!("sent {} bytes in {:.1} ms", msg.len(), t0.elapsed().as_secs_f64() * 1e3);
            // Stay until the reader closes: it checks we are alive while it reads.
            let t1 = Instant::now();
            while !matches!(ump::wait(Some(ch), Some(limit)), Ok(Some(Event::Closed(_)))) && t1.elapsed() < limit {
                std::thread::sleep(Duration::from_millis(1));
            }
            ump::close(ch)?;
            ump::exit()?;
        }
        Cmd::Mesh { me, peers, rounds, max, timeout } => {
            let limit = secs(timeout);
            let peers: Vec<u64> = peers.split(',').map(|p| p.trim().parse()).collect::<Result<_, _>>()?;
            let max = size(&max)?;
            ump::init(Config::from_env()?)?;
            let chans = open_all(me, &peers, limit)?;
            let len = |from: u64, to: u64, r: u64| ((r * 7919 + from * 104_729 + to * 13) % max as u64) as usize;
            let mut buf = vec![0u8; max];
            for r in 0..rounds {
                for (&p, &c) in peers.iter().zip(&chans) {
                    ump::nbwrite(c, &pattern(me * 1_000_003 + r, len(me, p, r)))
                        .with_context(|| format!("round {r}: starting the write to handle {p}"))?;
                }
                for (&p, &c) in peers.iter().zip(&chans) {
                    let n = read_within(c, &mut buf, limit, &format!("round {r}: the message from handle {p}"))?;
                    let want = pattern(p * 1_000_003 + r, len(p, me, r));
                    if buf[..n] != want[..] {
                        bail!("round {r}: the message from {p} ({n} bytes) is not what it sent");
                    }
                }
                for (&p, &c) in peers.iter().zip(&chans) {
                    nbwrite_done(c, limit, &format!("round {r}: writing to handle {p}"))?;
                }
            }
            let kinds: Vec<String> =
                peers.iter().zip(&chans).map(|(p, &c)| format!("{p}:{:?}", ump::transport(c).unwrap())).collect();
            // A last empty message each way: once every peer's has come,
            // every peer has read all it wanted from us, and ours to them
            // are whole in their rings (read without waiting, so without
            // asking whether we are still alive). Then we may go.
            for &c in &chans {
                ump::nbwrite(c, &[])?;
            }
            for (&p, &c) in peers.iter().zip(&chans) {
                let n = read_within(c, &mut buf, limit, &format!("the last (empty) message from handle {p}"))?;
                if n != 0 {
                    bail!("handle {p} sent {n} bytes where its last, empty message belongs");
                }
            }
            for (&p, &c) in peers.iter().zip(&chans) {
                nbwrite_done(c, limit, &format!("the last (empty) message to handle {p}"))?;
            }
            println!("mesh ok: {rounds} rounds with {} peers, transports {}", peers.len(), kinds.join(","));
            ump::exit()?;
        }
        Cmd::Floor { sizes, volume } => {
            let volume = size(&volume)?;
            println!("guest copy speed (the floor under message passing in this guest):");
            for s in sizes.split(',').map(size) {
                let s = s?.max(8);
                let (src, mut dst) = (pattern(1, s), vec![0u8; s]);
                let rounds = (volume / s).max(3);
                let t0 = Instant::now();
                for _ in 0..rounds {
                    dst.copy_from_slice(std::hint::black_box(&src));
                    std::hint::black_box(&mut dst);
                }
                let copy = (s * rounds) as f64 / t0.elapsed().as_secs_f64() / 1e6;
                let t0 = Instant::now();
                for _ in 0..rounds {
                    dst.copy_from_slice(std::hint::black_box(&src));
                    std::hint::black_box(ump::ring::payload_check(&dst));
                }
                let checked = (s * rounds) as f64 / t0.elapsed().as_secs_f64() / 1e6;
                println!("floor {s:>10} bytes: copy {copy:>9.1} MB/s, copy and check {checked:>9.1} MB/s");
                use std::io::Write;
                std::io::stdout().flush()?;
            }
        }
        Cmd::Bench { me, mc_peer, shm_peer, tcp, sizes, volume, svg_dir, timeout, mc_label, blocking_only } => {
            let mut peers = Vec::new();
            if let Some(p) = mc_peer {
                peers.push((mc_label.as_str(), p));
            }
            if let Some(p) = shm_peer {
                peers.push(("this guest", p));
            }
            bench(&BenchArgs {
                me,
                peers,
                tcp: tcp.as_deref(),
                sizes: sizes.split(',').map(size).collect::<Result<_>>()?,
                volume: size(&volume)?,
                svg_dir: &svg_dir,
                limit: secs(timeout),
                blocking_only,
            })?;
        }
        Cmd::Listen { me, count, timeout } => {
            let limit = secs(timeout);
            ump::init(Config::from_env()?)?;
            ump::listen(me, Want::Any)?;
            println!("listening on {me}");
            use std::io::Write;
            std::io::stdout().flush()?;
            let mut served = std::collections::HashSet::new();
            let mut buf = vec![0u8; 1 << 20];
            let t0 = Instant::now();
            while served.len() < count {
                let left = limit.saturating_sub(t0.elapsed());
                match ump::wait(None, Some(left))? {
                    Some(Event::Message(c)) => {
                        let n = read_within(c, &mut buf, limit, "a message announced by ump_wait")?;
                        write_within(c, &buf[..n], limit, "echoing a message")?;
                        served.insert(c);
                        println!("echoed {n} bytes on a {:?} channel", ump::transport(c)?);
                    }
                    Some(_) if t0.elapsed() <= limit => {}
                    _ => bail!("only {} of {count} channels within {timeout} s", served.len()),
                }
            }
            std::thread::sleep(Duration::from_millis(500));
            ump::exit()?;
        }
        Cmd::McastSend { me, peers, count, max, timeout } => {
            let limit = secs(timeout);
            let peers: Vec<u64> = peers.split(',').map(|p| p.trim().parse()).collect::<Result<_, _>>()?;
            let max = size(&max)?;
            ump::init(Config::from_env()?)?;
            let chans = open_all(me, &peers, limit)?;
            let t0 = Instant::now();
            let mut bytes = 0;
            for i in 0..count {
                let m = pattern(me * 1_000_003 + i, mcast_len(i, max));
                bytes += m.len();
                ump::mcast_timeout(&chans, &m, limit)
                    .map_err(|e| waited(&format!("multicast message {i}: the receivers taking it"), limit, e))?;
            }
            println!(
                "multicast {count} messages, {bytes} bytes, to {} peers in {:.1} ms",
                chans.len(),
                t0.elapsed().as_secs_f64() * 1e3
            );
            let mut closed = 0;
            let t1 = Instant::now();
            while closed < chans.len() {
                let left = limit.saturating_sub(t1.elapsed());
                match ump::wait(None, Some(left))? {
                    Some(Event::Closed(_)) => closed += 1,
                    Some(_) if t1.elapsed() <= limit => {}
                    _ => bail!("only {closed} of {} receivers finished and closed within {timeout} s", chans.len()),
                }
            }
            ump::exit()?;
        }
        Cmd::McastRecv { me, from, count, max, timeout } => {
            let limit = secs(timeout);
            let max = size(&max)?;
            let ch = open(&Ends { me, peer: from, transport: "any".into(), timeout }, limit)?;
            let mut buf = vec![0u8; max.max(1)];
            for i in 0..count {
                let n = read_within(ch, &mut buf, limit, &format!("multicast message {i} from handle {from}"))?;
                if buf[..n] != pattern(from * 1_000_003 + i, mcast_len(i, max))[..] {
                    bail!("multicast message {i} ({n} bytes) is not what was sent");
                }
            }
            println!("received {count} multicast messages intact");
            ump::close(ch)?;
            ump::exit()?;
        }
        Cmd::Recv { ends, max, delay_ms } => {
            let limit = secs(ends.timeout);
            let ch = open(&ends, limit)?;
            std::thread::sleep(Duration::from_millis(delay_ms));
            let mut buf = vec![0u8; size(&max)?];
            let t0 = Instant::now();
            let n = read_within(ch, &mut buf, limit, &format!("recv: a message from handle {}", ends.peer))?;
            if buf[..n] != pattern(7, n)[..] {
                bail!("received {n} bytes that are not what was sent");
            }
            println!("received {n} bytes intact in {:.1} ms", t0.elapsed().as_secs_f64() * 1e3);
            ump::close(ch)?;
            ump::exit()?;
        }
    }
    Ok(())
}
