//! dd-tool: Direct Deposit (`guest/msg/dd`) from a shell, for the QEMU
//! tests and for measurements.
//!
//! - `recv`: accept a connection and receive messages, checking each
//!   one's bytes against the pattern `send` puts in them;
//! - `send`: connect and send patterned messages at chosen offsets;
//! - `serve` and `bench`: the two halves of the benchmark (Avalanche's
//!   Figure 1): `dd-tool serve --peer A` on guest B, then
//!   `dd-tool bench --peer B` on guest A, which prints one line per figure,
//!   `BENCH <series> <x> <value> <unit>`, progress on stderr.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use dd::layout::FLAG_DMA;
use dd::{Conn, DdError, Queue};

#[derive(Parser)]
#[command(name = "dd-tool", about = "Direct Deposit from a shell: recv, send, serve, bench")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// By stores into the transmit window.
    Stores,
    /// By the transmit DMA engine.
    Dma,
    /// By the threshold (DD_DMA_THRESHOLD).
    Auto,
}

#[derive(Subcommand)]
enum Cmd {
    /// Accept connection TAG from node PEER and receive COUNT messages,
    /// checking their bytes; prints a NOTE line per message, an ERROR line
    /// per fault, and a summary with the process's CPU time. Exits 1 on
    /// wrong bytes, 3 when no message came within the timeout.
    Recv {
        /// The sending node.
        #[arg(long)]
        peer: u8,
        /// Connection tag.
        #[arg(long, default_value_t = 1)]
        tag: u32,
        /// Bytes of receive buffer.
        #[arg(long, default_value_t = 1 << 20)]
        bytes: u64,
        /// Messages to receive (errors count too).
        #[arg(long, default_value_t = 1)]
        count: u64,
        /// Sleep in the blocking receive instead of polling.
        #[arg(long)]
        blocking: bool,
        /// Give up after this long without a message.
        #[arg(long, default_value_t = 60_000)]
        timeout_ms: u64,
    },
    /// Connect to connection TAG on node PEER and send COUNT patterned
    /// messages of SIZE bytes at OFFSET, OFFSET + STEP, ... (modulo the
    /// buffer), waiting for released space when needed.
    Send {
        /// The receiving node.
        #[arg(long)]
        peer: u8,
        /// Connection tag.
        #[arg(long, default_value_t = 1)]
        tag: u32,
        /// Messages.
        #[arg(long, default_value_t = 1)]
        count: u64,
        /// Bytes per message.
        #[arg(long, default_value_t = 64)]
        size: usize,
        /// Offset of the first.
        #[arg(long, default_value_t = 0)]
        offset: u64,
        /// Offset step (default: the size rounded up to 8).
        #[arg(long)]
        step: Option<u64>,
        /// How the bytes go.
        #[arg(long, value_enum, default_value_t = Mode::Auto)]
        mode: Mode,
        /// Pause between messages.
        #[arg(long, default_value_t = 0)]
        delay_ms: u64,
        /// Stay connected this long after the last send (a receiver still
        /// reading the connection's pages needs it held).
        #[arg(long, default_value_t = 0)]
        linger_ms: u64,
        /// Before sending, try OFFSET:SIZE (repeatable), which must be
        /// refused; prints a REFUSED line with the adapter's transmitted
        /// packets before and after the attempt.
        #[arg(long = "try", value_name = "OFFSET:SIZE")]
        tries: Vec<String>,
    },
    /// The far half of `bench`: echo what `bench` sends until it says stop.
    Serve {
        /// The node `bench` runs on.
        #[arg(long)]
        peer: u8,
    },
    /// The benchmark (with `serve` on PEER): one-way latency by stores and
    /// by DMA for 4 B to 64 KiB, bandwidth to 4 MiB, and the DMA engine's
    /// own rate at 1 MiB.
    Bench {
        /// The node `serve` runs on.
        #[arg(long)]
        peer: u8,
        /// Round trips per latency point.
        #[arg(long, default_value_t = 200)]
        trips: usize,
        /// Bytes per bandwidth point.
        #[arg(long, default_value_t = 16 << 20)]
        volume: usize,
    },
}

/// Byte `i` of message `seq`.
fn pattern(seq: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u64).wrapping_mul(31).wrapping_add(seq.wrapping_mul(7)) as u8).collect()
}

/// User and system CPU time of this process, in microseconds.
fn cpu_us() -> u64 {
    // SAFETY: getrusage fills the struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF with a valid pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    us(ru.ru_utime) + us(ru.ru_stime)
}

fn recv(peer: u8, tag: u32, bytes: u64, count: u64, blocking: bool, timeout: Duration) -> Result<()> {
    let mut q = Queue::open().context("opening the queue")?;
    let conn = q.accept(peer, tag as u64, bytes).context("accepting")?;
    eprintln!("dd-tool: accepted connection {conn} from node {peer} ({bytes} bytes)");
    println!("ACCEPTED {conn}");
    let (cpu0, t0) = (cpu_us(), Instant::now());
    let (mut ok, mut errors) = (0u64, 0u64);
    let mut last = Instant::now();
    while ok + errors < count {
        let r = if blocking {
            q.recv(Some(timeout))
        } else {
            match q.poll() {
                Ok(Some(n)) => Ok(n),
                Ok(None) if last.elapsed() > timeout => Err(DdError::Timeout(format!("no note within {timeout:?}"))),
                Ok(None) => continue,
                Err(e) => Err(e),
            }
        };
        last = Instant::now();
        match r {
            Ok(n) => {
                let want = pattern(n.seq, n.len as usize);
                let good = q.last_bytes() == &want[..];
                println!(
                    "NOTE conn={} seq={} offset={} len={} dma={} {}",
                    n.conn,
                    n.seq,
                    n.offset,
                    n.len,
                    (n.flags & FLAG_DMA != 0) as u8,
                    if good { "ok" } else { "WRONG" }
                );
                if !good {
                    bail!("message {} holds wrong bytes", n.seq);
                }
                q.release(&n)?;
                ok += 1;
            }
            Err(DdError::Timeout(why)) => {
                println!("TIMEOUT {why}");
                println!(
                    "RECEIVED {ok} ERRORS {errors} CPU_US {} WALL_US {}",
                    cpu_us() - cpu0,
                    t0.elapsed().as_micros()
                );
                std::process::exit(3);
            }
            Err(e @ (DdError::Imc(_) | DdError::Os(..))) => return Err(e.into()),
            Err(e) => {
                println!("ERROR {e}");
                errors += 1;
            }
        }
    }
    println!("RECEIVED {ok} ERRORS {errors} CPU_US {} WALL_US {}", cpu_us() - cpu0, t0.elapsed().as_micros());
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn send(
    peer: u8,
    tag: u32,
    count: u64,
    size: usize,
    offset: u64,
    step: Option<u64>,
    mode: Mode,
    delay: Duration,
    linger: Duration,
    tries: &[String],
) -> Result<()> {
    let mut c = Conn::connect(peer, tag as u64, Duration::from_secs(60)).context("connecting")?;
    let buf = c.buffer_len();
    if !tries.is_empty() {
        let regs = imc_client::Imc::connect()?.regs()?;
        let tx = || regs.view().raw(regs::reg::TX_PACKETS);
        for t in tries {
            let (o, n) = t.split_once(':').with_context(|| format!("--try {t}: OFFSET:SIZE"))?;
            let (off, size): (u64, usize) = (o.parse()?, n.parse()?);
            let before = tx();
            match c.send(off, &pattern(0, size)) {
                Ok(t) => bail!("{size} bytes at offset {off} were sent (message {})", t.seq),
                Err(e) => println!("REFUSED offset={off} len={size} tx_packets={before}->{} : {e}", tx()),
            }
        }
    }
    let step = step.unwrap_or_else(|| (size as u64).next_multiple_of(8));
    let mut tickets = Vec::new();
    for i in 0..count {
        let off = if count == 1 { offset } else { (offset + i * step) % buf };
        let data = pattern(i + 1, size);
        let t0 = Instant::now();
        let t = loop {
            let r = match mode {
                Mode::Stores => c.send_stores(off, &data),
                Mode::Dma => c.send_dma(off, &data),
                Mode::Auto => c.send(off, &data),
            };
            match r {
                Err(DdError::Busy { .. } | DdError::NotesFull) if t0.elapsed() < Duration::from_secs(30) => {
                    std::thread::sleep(Duration::from_micros(200))
                }
                r => break r.with_context(|| format!("sending {size} bytes at offset {off}"))?,
            }
        };
        println!("SENT seq={} offset={off} len={size} dma={}", t.seq, t.by_dma() as u8);
        tickets.push(t);
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
    }
    for t in &tickets {
        let mut polls = 0u64;
        while !c.test(t).with_context(|| format!("testing send {}", t.seq))? {
            polls += 1;
            if polls > 50_000_000 {
                bail!("send {} never completed", t.seq);
            }
            std::hint::spin_loop();
        }
        println!("DONE seq={} dma={} status=ok", t.seq, t.by_dma() as u8);
    }
    std::thread::sleep(linger);
    Ok(())
}

/// Offsets the benchmark uses in the serving side's buffer.
mod bench_layout {
    /// Ping-pong messages (up to 64 KiB) go here; serve echoes them.
    pub const PING: u64 = 0;
    /// A message here (0 bytes) stops serve.
    pub const STOP: u64 = (1 << 20) - 8;
    /// Bandwidth messages go here and at `BULK + BULK_HALF`; serve only
    /// releases them.
    pub const BULK: u64 = 1 << 20;
    /// Half of the bulk area.
    pub const BULK_HALF: u64 = 8 << 20;
    /// The serving side's buffer.
    pub const SERVE_BUFFER: u64 = BULK + 2 * BULK_HALF;
    /// The bench side's buffer (echoes).
    pub const BENCH_BUFFER: u64 = 1 << 20;
    /// Connection tags: bench to serve, serve to bench.
    pub const TAG_OUT: u64 = 0xBE01;
    pub const TAG_BACK: u64 = 0xBE02;
}
use bench_layout::*;

fn serve(peer: u8) -> Result<()> {
    let mut q = Queue::open()?;
    q.accept(peer, TAG_OUT, SERVE_BUFFER)?;
    let mut back = Conn::connect(peer, TAG_BACK, Duration::from_secs(120))?;
    back.set_dma_threshold(0);
    eprintln!("dd-tool serve: connected to node {peer}");
    loop {
        let n = loop {
            match q.poll() {
                Ok(Some(n)) => break n,
                Ok(None) => std::hint::spin_loop(),
                Err(e) => eprintln!("dd-tool serve: {e}"),
            }
        };
        if n.offset as u64 == STOP {
            return Ok(());
        }
        if (n.offset as u64) < BULK {
            // Echo in the mode it came in.
            let data = q.last_bytes().to_vec();
            q.release(&n)?;
            if n.flags & FLAG_DMA != 0 {
                back.send_when_free_dma(PING, &data)?;
            } else {
                back.send_when_free_stores(PING, &data)?;
            }
        } else {
            q.release(&n)?;
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn bench(peer: u8, trips: usize, volume: usize) -> Result<()> {
    let mut q = Queue::open()?;
    q.accept(peer, TAG_BACK, BENCH_BUFFER)?;
    let mut out = Conn::connect(peer, TAG_OUT, Duration::from_secs(120))?;
    eprintln!("dd-tool bench: connected to node {peer}");
    let wait_echo = |q: &mut Queue| -> Result<()> {
        let t0 = Instant::now();
        loop {
            match q.poll() {
                Ok(Some(n)) => {
                    q.release(&n)?;
                    return Ok(());
                }
                Ok(None) if t0.elapsed() > Duration::from_secs(30) => bail!("no echo in 30 s"),
                Ok(None) => std::hint::spin_loop(),
                Err(e) => bail!("echo: {e}"),
            }
        }
    };
    for (series, dma) in [("dd-stores-oneway", false), ("dd-dma-oneway", true)] {
        let mut size = 4usize;
        while size <= 64 << 10 {
            let data = pattern(size as u64, size);
            let n = if size >= 16 << 10 { trips.div_ceil(4) } else { trips };
            let mut times = Vec::with_capacity(n);
            for i in 0..n + 5 {
                let t0 = Instant::now();
                if dma {
                    out.send_when_free_dma(PING, &data)?;
                } else {
                    out.send_when_free_stores(PING, &data)?;
                }
                wait_echo(&mut q)?;
                if i >= 5 {
                    times.push(t0.elapsed().as_secs_f64() * 1e6 / 2.0);
                }
            }
            println!("BENCH {series} {size} {:.1} us", median(times));
            eprintln!("dd-tool bench: {series} {size} done");
            size *= 2;
        }
    }
    for (series, dma) in [("dd-stores-bw", false), ("dd-dma-bw", true)] {
        let mut size = 4usize << 10;
        while size <= 4 << 20 {
            let data = pattern(size as u64, size);
            let msgs = (volume / size).max(4);
            let t0 = Instant::now();
            for i in 0..msgs {
                let off = BULK + (i as u64 % 2) * BULK_HALF;
                if dma {
                    out.send_when_free_dma(off, &data)?;
                } else {
                    out.send_when_free_stores(off, &data)?;
                }
            }
            // The echo of a small ping ends the run: it comes after every
            // byte sent before it.
            out.send_when_free_stores(PING, &[0u8; 8])?;
            wait_echo(&mut q)?;
            let secs = t0.elapsed().as_secs_f64();
            println!("BENCH {series} {size} {:.1} MB/s", (msgs * size) as f64 / secs / 1e6);
            eprintln!("dd-tool bench: {series} {size} done");
            size *= 4;
        }
    }
    // Everything released (the last echo came after the serve side
    // released the bulk messages): the engine alone, 1 MiB at a time.
    let t0 = Instant::now();
    while out.outstanding() > 0 {
        if t0.elapsed() > Duration::from_secs(30) {
            bail!("the serve side never released its messages");
        }
        std::hint::spin_loop();
    }
    let len = 1 << 20;
    let reps = (volume / len).max(4);
    let took = out.engine_time(len, reps)?;
    println!("BENCH dma-engine-bw {len} {:.1} MB/s", (reps * len) as f64 / took.as_secs_f64() / 1e6);
    out.send_when_free_stores(STOP, &[])?;
    Ok(())
}

fn main() -> Result<()> {
    match Cli::parse().cmd {
        Cmd::Recv { peer, tag, bytes, count, blocking, timeout_ms } => {
            recv(peer, tag, bytes, count, blocking, Duration::from_millis(timeout_ms))
        }
        Cmd::Send { peer, tag, count, size, offset, step, mode, delay_ms, linger_ms, tries } => send(
            peer,
            tag,
            count,
            size,
            offset,
            step,
            mode,
            Duration::from_millis(delay_ms),
            Duration::from_millis(linger_ms),
            &tries,
        ),
        Cmd::Serve { peer } => serve(peer),
        Cmd::Bench { peer, trips, volume } => bench(peer, trips, volume),
    }
}
