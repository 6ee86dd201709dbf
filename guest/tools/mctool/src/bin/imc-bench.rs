//! `imc-bench`: the paper's Table 2 (TruCluster MEMORY CHANNEL Software
//! performance), measured through libimc between two guests.
//!
//! Run `imc-bench --role echo` on one node, then `imc-bench` on another:
//! - latency: a 4-byte store into a region, seen by the echo process
//!   polling its receive mapping, which stores it back (one-way = RTT / 2);
//! - sustained bandwidth: S bytes of 8-byte stores, then a flag the echo
//!   answers (the total order puts the flag after the data), S = 8 KiB..1 MiB;
//! - `imc_rderrcnt`, `imc_ckerrcnt`: per call, from user space;
//! - an uncontended `imc_lkacquire` and `imc_lkrelease`;
//! - with `--tcp PEER_IP`, the same latency and bandwidth over TCP between
//!   the same two guests (virtio-net, the cluster LAN), in the same run: the
//!   echo process also serves TCP on port 5999.
//!
//! Every wait for the other process has a deadline (`--timeout` for the
//! measuring side; the echo process serves until told to stop, or until
//! nothing came for `--idle` seconds), and each figure is printed as soon
//! as it is measured, before the table.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use imc_client::guest_mem::{Mapping, ReadOnly};
use imc_client::Imc;
use testkit::stats::Summary;

/// A duration in microseconds.
fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Data pages plus one control page.
const DATA: usize = 1 << 20;
const KEY_DATA: u64 = 0x7AB1_E200;
const KEY_ECHO: u64 = 0x7AB1_E201;
const KEY_LOCK: u64 = 0x7AB1_E202;
/// The control word the echo process answers (after the data).
const CTL: usize = DATA;
const QUIT: u32 = u32::MAX;

#[derive(Parser)]
#[command(
    name = "imc-bench",
    version,
    about = "Table 2 of the TruCluster MEMORY CHANNEL paper, measured between two guests",
    after_help = "Examples (from the host):
  mc-cluster exec 1 -- sh -c 'imc-bench --role echo &'   the echo, first
  mc-cluster exec 0 -- imc-bench --tcp 10.0.0.2          measure, with TCP beside

Exit codes: 0 success; 1 an error (the message starts with \"Error:\"); 2 a
usage error."
)]
struct Cli {
    /// `echo` (start first, on the peer) or `measure`.
    #[arg(long, default_value = "measure")]
    role: String,
    /// Latency round trips.
    #[arg(long, default_value_t = 2000)]
    rounds: u32,
    /// Bytes per bandwidth size (each size repeats until this much was sent).
    #[arg(long, default_value_t = 8 << 20)]
    volume: usize,
    /// Measuring: give up waiting for one answer of the echo process (or
    /// a TCP connection) after this many seconds.
    #[arg(long, default_value_t = 60)]
    timeout: u64,
    /// Echo: give up after this many seconds with nothing to echo (the
    /// measuring side may spend a long while on other figures).
    #[arg(long, default_value_t = 3600)]
    idle: u64,
    /// Also measure TCP to the echo process at this address (its LAN IP).
    #[arg(long)]
    tcp: Option<String>,
}

/// TCP port of the echo process.
const TCP_PORT: u16 = 5999;

/// TCP echo: frames of a 4-byte length and that many bytes, each answered
/// with its 4-byte length. Each frame counts as activity (`active`, for
/// the echo's idle limit); a connection silent for `idle` is dropped.
fn tcp_echo(idle: Duration, active: Arc<Mutex<Instant>>) -> Result<()> {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind(("0.0.0.0", TCP_PORT))?;
    for s in l.incoming() {
        let Ok(mut s) = s else { continue };
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(idle))?;
        s.set_write_timeout(Some(idle))?;
        let mut buf = vec![0u8; DATA];
        loop {
            let mut len = [0u8; 4];
            if s.read_exact(&mut len).is_err() {
                break;
            }
            let n = u32::from_le_bytes(len) as usize;
            if n > buf.len() || s.read_exact(&mut buf[..n]).is_err() || s.write_all(&len).is_err() {
                break;
            }
            *active.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        }
    }
    Ok(())
}

/// Prints one measured figure at once.
fn report(what: &str, value: String) -> Result<()> {
    use std::io::Write;
    println!("measured: {what:<40} {value}");
    std::io::stdout().flush()?;
    Ok(())
}

/// TCP one-way latency (RTT / 2 of a 4-byte message, p50 and p99) and
/// bandwidth per block size.
fn tcp_measure(peer: &str, rounds: u32, volume: usize, sizes: &[usize], limit: Duration) -> Result<TcpFigures> {
    use std::io::{Read, Write};
    use std::net::ToSocketAddrs;
    let what = || format!("TCP to the echo process at {peer}:{TCP_PORT} (timeout {limit:?})");
    let to = (peer, TCP_PORT).to_socket_addrs().with_context(what)?.next().with_context(what)?;
    let mut s = std::net::TcpStream::connect_timeout(&to, limit).with_context(what)?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(limit))?;
    s.set_write_timeout(Some(limit))?;
    let frame = |s: &mut std::net::TcpStream, payload: &[u8]| -> Result<()> {
        s.write_all(&(payload.len() as u32).to_le_bytes()).with_context(what)?;
        s.write_all(payload).with_context(what)?;
        let mut ack = [0u8; 4];
        s.read_exact(&mut ack).with_context(|| format!("{}: the answer to a {}-byte frame", what(), payload.len()))?;
        Ok(())
    };
    let mut rtts = Vec::with_capacity(rounds as usize);
    for _ in 0..rounds {
        let t0 = Instant::now();
        frame(&mut s, &[])?;
        rtts.push(t0.elapsed());
    }
    let one_way = Summary::of(&mut rtts).context("no round trips (--rounds 0)")?.div(2);
    report("TCP latency, one way (p50, p99)", format!("{:.1} us, {:.1} us", us(one_way.p50), us(one_way.p99)))?;
    let block = vec![0x5Au8; DATA];
    let mut bw = Vec::new();
    for &size in sizes {
        let reps = (volume / size).max(4);
        let t0 = Instant::now();
        for _ in 0..reps {
            frame(&mut s, &block[..size])?;
        }
        let mbs = (size * reps) as f64 / t0.elapsed().as_secs_f64() / 1e6;
        report(&format!("TCP bandwidth, {} KiB blocks", size >> 10), format!("{mbs:.1} MB/s"))?;
        bw.push(mbs);
    }
    Ok(((us(one_way.p50), us(one_way.p99)), bw))
}

fn wait32(m: &Mapping<ReadOnly>, off: usize, v: u32, limit: Duration) -> Result<()> {
    let t0 = Instant::now();
    while m.load::<u32>(off)? != v {
        if t0.elapsed() > limit {
            bail!("no answer {v} from the echo process within {limit:?}");
        }
        std::hint::spin_loop();
    }
    Ok(())
}

/// TCP figures: one-way latency in µs (p50, p99), and MB/s per block size.
type TcpFigures = ((f64, f64), Vec<f64>);

fn main() -> Result<()> {
    let cli = Cli::parse();
    let limit = Duration::from_secs(cli.timeout);
    let imc = Imc::connect()?;
    let (data, ..) = imc.asalloc(KEY_DATA, (DATA + 8192) as u64, 0o666, false)?;
    let (echo, ..) = imc.asalloc(KEY_ECHO, 8192, 0o666, false)?;
    match cli.role.as_str() {
        "echo" => {
            let idle = Duration::from_secs(cli.idle);
            let active = Arc::new(Mutex::new(Instant::now()));
            let tcp_active = active.clone();
            std::thread::spawn(move || {
                if let Err(e) = tcp_echo(idle, tcp_active) {
                    eprintln!("imc-bench: TCP echo: {e:#}");
                }
            });
            let rx = imc.asattach_rx(data)?;
            let tx = imc.asattach_tx(echo, false)?;
            println!("echo ready");
            use std::io::Write;
            std::io::stdout().flush()?;
            let mut last = rx.load::<u32>(CTL)?;
            let mut spins = 0u32;
            loop {
                let v = rx.load::<u32>(CTL)?;
                if v != last {
                    if v == QUIT {
                        println!("echo done");
                        return Ok(());
                    }
                    tx.store::<u32>(0, v)?;
                    last = v;
                    *active.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
                }
                spins = spins.wrapping_add(1);
                // The clock (and the lock) now and then, not on every load.
                if spins % 4096 == 0 && active.lock().unwrap_or_else(|e| e.into_inner()).elapsed() > idle {
                    bail!("nothing to echo, over MEMORY CHANNEL or TCP, for {idle:?} (--idle)");
                }
                std::hint::spin_loop();
            }
        }
        "measure" => measure(&imc, data, echo, &cli, limit),
        other => bail!("--role must be echo or measure, not {other:?}"),
    }
}

fn measure(imc: &Imc, data: u32, echo: u32, cli: &Cli, limit: Duration) -> Result<()> {
    let tx = imc.asattach_tx(data, false)?;
    let rx = imc.asattach_rx(echo)?;
    // Fresh values: the echo page may hold an answer of an earlier run.
    let mut v = (std::process::id() << 12) & 0x7FFF_F000;
    let mut next = || {
        v = v.wrapping_add(1) & 0x7FFF_FFFF | 1;
        v
    };

    let mut rtts = Vec::with_capacity(cli.rounds as usize);
    for _ in 0..cli.rounds {
        let x = next();
        let t0 = Instant::now();
        tx.store::<u32>(CTL, x)?;
        wait32(&rx, 0, x, limit).context("latency")?;
        rtts.push(t0.elapsed());
    }
    let one_way = Summary::of(&mut rtts).context("no round trips (--rounds 0)")?.div(2);
    report("latency, one way (p50, p99)", format!("{:.1} us, {:.1} us", us(one_way.p50), us(one_way.p99)))?;

    let sizes = [8 << 10, 64 << 10, 256 << 10, 1 << 20];
    let mut bw = Vec::new();
    for size in sizes {
        let reps = (cli.volume / size).max(4);
        let t0 = Instant::now();
        for r in 0..reps {
            for off in (0..size).step_by(8) {
                tx.store::<u64>(off, r as u64)?;
            }
            // Wait for each block (a full buffer must not be overwritten
            // before the reader had it, as a message layer would).
            let x = next();
            tx.store::<u32>(CTL, x)?;
            wait32(&rx, 0, x, limit).context("bandwidth")?;
        }
        let s = t0.elapsed().as_secs_f64();
        let mbs = (size * reps) as f64 / s / 1e6;
        report(&format!("sustained bandwidth, {} KiB blocks", size >> 10), format!("{mbs:.1} MB/s"))?;
        bw.push((size, mbs));
    }

    let regs = imc.regs()?;
    let n = 100_000;
    let t0 = Instant::now();
    let mut sum = 0u64;
    for _ in 0..n {
        sum += regs.rderrcnt() as u64;
    }
    let rderr = t0.elapsed().as_secs_f64() * 1e6 / n as f64;
    let mut errors = regs.rderrcnt();
    let checks = 2000;
    let t0 = Instant::now();
    let mut moved = 0;
    for _ in 0..checks {
        moved += regs.ckerrcnt(&mut errors) as u32;
    }
    let ckerr = t0.elapsed().as_secs_f64() * 1e6 / checks as f64;

    let (set, _) = imc.lkalloc(KEY_LOCK, 1, 0o666, false)?;
    let (mut acq, mut rel) = (Duration::ZERO, Duration::ZERO);
    let locks = 200;
    for _ in 0..locks {
        let t0 = Instant::now();
        set.acquire(0, limit)?;
        let t1 = Instant::now();
        set.release(0)?;
        acq += t1 - t0;
        rel += t1.elapsed();
    }
    let tcp = match &cli.tcp {
        Some(peer) => Some(tcp_measure(peer, cli.rounds, cli.volume, &sizes, limit)?),
        None => None,
    };
    tx.store::<u32>(CTL, QUIT)?;

    let t = |f: &dyn Fn(&TcpFigures) -> f64, unit: &str| match &tcp {
        Some(x) => format!("{:.1} {unit}", f(x)),
        None => "-".into(),
    };
    println!("Table 2, TruCluster MEMORY CHANNEL Software performance (paper: AlphaServer 4100 5/300, MC 1.5)");
    println!("{:<40} {:>16} {:>18} {:>10}", "", "MEMORY CHANNEL", "TCP (virtio-net)", "paper");
    for (i, (size, mbs)) in bw.iter().enumerate() {
        let what = format!("sustained bandwidth, {} KiB blocks", size >> 10);
        println!("{what:<40} {mbs:>11.1} MB/s {:>18} {:>10}", t(&|x| x.1[i], "MB/s"), "64 MB/s");
    }
    let lat = |what: &str, v: f64, tcp: String, paper: &str| println!("{what:<40} {v:>13.1} us {tcp:>18} {paper:>10}");
    lat("latency, 4 bytes, one way (p50)", us(one_way.p50), t(&|x| x.0 .0, "us"), "2.9 us");
    lat("latency, one way (p99)", us(one_way.p99), t(&|x| x.0 .1, "us"), "");
    let row = |what: &str, v: f64, paper: &str| println!("{what:<40} {v:>13.3} us {:>18} {paper:>10}", "");
    row("read error count (imc_rderrcnt)", rderr, "< 1 us");
    row("check error count (imc_ckerrcnt)", ckerr, "< 5 us");
    row("uncontended imc_lkacquire", acq.as_secs_f64() * 1e6 / locks as f64, "130 us");
    row("uncontended imc_lkrelease", rel.as_secs_f64() * 1e6 / locks as f64, "120 us");
    println!("(error count {} over the run, {} changes seen)", sum / n, moved);
    Ok(())
}
