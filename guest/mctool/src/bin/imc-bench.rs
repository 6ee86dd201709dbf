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
#[command(about = "Table 2 of the TruCluster MEMORY CHANNEL paper, measured between two guests")]
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
    /// Give up waiting for the peer after this many seconds.
    #[arg(long, default_value_t = 60)]
    timeout: u64,
    /// Also measure TCP to the echo process at this address (its LAN IP).
    #[arg(long)]
    tcp: Option<String>,
}

/// TCP port of the echo process.
const TCP_PORT: u16 = 5999;

/// TCP echo: frames of a 4-byte length and that many bytes, each answered
/// with its 4-byte length.
fn tcp_echo() -> Result<()> {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind(("0.0.0.0", TCP_PORT))?;
    for s in l.incoming() {
        let mut s = s?;
        s.set_nodelay(true)?;
        let mut buf = vec![0u8; DATA];
        loop {
            let mut len = [0u8; 4];
            if s.read_exact(&mut len).is_err() {
                break;
            }
            let n = u32::from_le_bytes(len) as usize;
            if n > buf.len() {
                break;
            }
            s.read_exact(&mut buf[..n])?;
            s.write_all(&len)?;
        }
    }
    Ok(())
}

/// TCP one-way latency (RTT / 2 of a 4-byte message, p50 and p99) and
/// bandwidth per block size.
fn tcp_measure(peer: &str, rounds: u32, volume: usize, sizes: &[usize]) -> Result<TcpFigures> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect((peer, TCP_PORT)).with_context(|| format!("TCP to {peer}:{TCP_PORT}"))?;
    s.set_nodelay(true)?;
    let frame = |s: &mut std::net::TcpStream, payload: &[u8]| -> Result<()> {
        s.write_all(&(payload.len() as u32).to_le_bytes())?;
        s.write_all(payload)?;
        let mut ack = [0u8; 4];
        s.read_exact(&mut ack)?;
        Ok(())
    };
    let mut rtts = Vec::with_capacity(rounds as usize);
    for _ in 0..rounds {
        let t0 = Instant::now();
        frame(&mut s, &[])?;
        rtts.push(t0.elapsed());
    }
    let one_way = Summary::of(&mut rtts).context("no round trips (--rounds 0)")?.div(2);
    let block = vec![0x5Au8; DATA];
    let mut bw = Vec::new();
    for &size in sizes {
        let reps = (volume / size).max(4);
        let t0 = Instant::now();
        for _ in 0..reps {
            frame(&mut s, &block[..size])?;
        }
        bw.push((size * reps) as f64 / t0.elapsed().as_secs_f64() / 1e6);
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
            std::thread::spawn(|| {
                if let Err(e) = tcp_echo() {
                    eprintln!("imc-bench: TCP echo: {e:#}");
                }
            });
            let rx = imc.asattach_rx(data)?;
            let tx = imc.asattach_tx(echo, false)?;
            println!("echo ready");
            use std::io::Write;
            std::io::stdout().flush()?;
            let mut last = rx.load::<u32>(CTL)?;
            let mut idle = Instant::now();
            loop {
                let v = rx.load::<u32>(CTL)?;
                if v != last {
                    if v == QUIT {
                        println!("echo done");
                        return Ok(());
                    }
                    tx.store::<u32>(0, v)?;
                    last = v;
                    idle = Instant::now();
                } else if idle.elapsed() > limit {
                    bail!("nothing to echo for {limit:?}");
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
        bw.push((size, (size * reps) as f64 / s / 1e6));
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
        Some(peer) => Some(tcp_measure(peer, cli.rounds, cli.volume, &sizes)?),
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
