//! `mctool`: drive the MEMORY CHANNEL adapter from a guest shell.
//!
//! One process at a time can own the adapter (VFIO groups are exclusive):
//! `mctool rx` keeps it (and the receive buffer's DMA map) until `mctool stop`;
//! `dump` and `wait` read the receive buffer file and need no device.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use guest_driver::{Adapter, Interrupt, RxBuffer, RX_IOVA_BASE};
use regs::{err, int, pct, reg, ACK_VALID, NOTIFY_EMPTY, PAGE_SIZE};
use testkit::pattern;

const DEFAULT_BUFFER: &str = "/dev/shm/mc-rx";

/// Set by SIGTERM/SIGINT: the receiver disables its pages, then exits.
static STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_stop(_: libc::c_int) {
    STOP.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// SIGTERM and SIGINT set [`STOP`].
fn stop_on_signals() {
    // SAFETY: installing an async-signal-safe handler (it only stores an atomic).
    unsafe {
        libc::signal(libc::SIGTERM, on_stop as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_stop as *const () as libc::sighandler_t);
    }
}

/// The last signal `wait-signal` caught.
static CAUGHT: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

extern "C" fn on_caught(sig: libc::c_int) {
    CAUGHT.store(sig, std::sync::atomic::Ordering::SeqCst);
}

/// Waits up to `timeout` s for SIGUSR1 or SIGUSR2 (the target of imc_kill tests).
fn wait_signal(timeout: u64) -> Result<()> {
    // SAFETY: installing an async-signal-safe handler (it only stores an atomic).
    unsafe {
        libc::signal(libc::SIGUSR1, on_caught as *const () as libc::sighandler_t);
        libc::signal(libc::SIGUSR2, on_caught as *const () as libc::sighandler_t);
    }
    println!("pid {} waiting for a signal", std::process::id());
    std::io::stdout().flush()?;
    let t0 = Instant::now();
    while CAUGHT.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        if t0.elapsed() > Duration::from_secs(timeout) {
            bail!("no signal within {timeout} s");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    println!("got signal {}", CAUGHT.load(std::sync::atomic::Ordering::SeqCst));
    Ok(())
}

/// Holds the receive setup until SIGTERM/SIGINT, then turns receive off on
/// `pages` before the buffer's DMA map goes away with the process: a PCT
/// entry must never point at memory that is no longer mapped.
fn hold_until_stopped(a: &Adapter, pages: &[u64]) {
    stop_on_signals();
    while !STOP.load(std::sync::atomic::Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(20));
    }
    for &p in pages {
        disable_rx(a, p);
    }
}
const PID_FILE: &str = "/run/mctool-rx.pid";

#[derive(Parser)]
#[command(version, about = "Drive the MEMORY CHANNEL adapter from inside a guest")]
struct Cli {
    /// Run as this user id (drops root first; for permission tests).
    #[arg(long, global = true)]
    uid: Option<u32>,
    /// Run as this group id (with --uid).
    #[arg(long, global = true)]
    gid: Option<u32>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Show the adapter's identity, node id, link, members and error registers.
    Info,
    /// Map a receive buffer and enable receive on pages; keeps running (in the
    /// background unless --foreground) so the DMA map stays in place.
    Rx {
        /// Pages to receive, e.g. "0,2,4-7".
        #[arg(long)]
        pages: String,
        /// Receive buffer file; MEMORY CHANNEL page p lands at offset p*8192.
        #[arg(long, default_value = DEFAULT_BUFFER)]
        buffer: PathBuf,
        /// Stay in the foreground.
        #[arg(long)]
        foreground: bool,
    },
    /// Stop a background `mctool rx`.
    Stop,
    /// Enable receive with interrupt on PAGE and sleep until a write to it
    /// raises the notification interrupt (MSI-X through VFIO).
    NotifyWait {
        /// Page to watch.
        #[arg(long)]
        page: u64,
        /// Give up after this many seconds (exit status 1).
        #[arg(long, default_value_t = 30)]
        timeout: u64,
    },
    /// Store to an ACK page and show each node's error status as it answers.
    Ack {
        /// The ACK page.
        #[arg(long, default_value_t = 48)]
        page: u64,
        /// Wait this long for every other member to answer.
        #[arg(long, default_value_t = 10)]
        timeout: u64,
    },
    /// Clear every error status bit (ERR_STATUS is write-1-to-clear).
    ClearErrors,
    /// Through imcd (libimc): PROCS processes increment a counter region under
    /// spinlock set KEY (imc_lkacquire), ROUNDS times each; succeeds when the
    /// counter reaches TOTAL exactly. Run with --setup on every node first.
    ImcLockTest {
        /// Spinlock set key (the counter region is KEY + 1000).
        #[arg(long, default_value_t = 456)]
        key: u64,
        /// Processes on this node.
        #[arg(long, default_value_t = 2)]
        procs: usize,
        /// Increments per process.
        #[arg(long, default_value_t = 100)]
        rounds: u64,
        /// Increments across the cluster.
        #[arg(long, default_value_t = 0)]
        total: u64,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 120)]
        timeout: u64,
    },
    /// Through imcd (libimc): the error count and the nodes that are up.
    ImcHosts,
    /// Through imcd (libimc): imc_kill, a signal to a process on another
    /// node through the command relay.
    ImcKill {
        /// Host name (node1) or node number.
        #[arg(long)]
        host: String,
        /// Process id on that host.
        #[arg(long)]
        pid: i32,
        /// Signal number.
        #[arg(long, default_value_t = libc::SIGUSR1)]
        sig: i32,
    },
    /// Wait for SIGUSR1/SIGUSR2 (prints its pid first; the target of imc-kill).
    WaitSignal {
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 60)]
        timeout: u64,
    },
    /// Failure drill: ask imcd (started with --test-hooks) to stop dead in
    /// the middle of an update of directory entry ID, holding the lock.
    ImcDrill {
        /// Directory entry.
        #[arg(long, default_value_t = 0)]
        id: u32,
    },
    /// Through imcd (libimc): read the error count, wait SECONDS, then report
    /// whether imc_ckerrcnt saw new errors (exit 0 when it did).
    ImcCheckErrors {
        /// Seconds to wait between reading and checking.
        #[arg(long, default_value_t = 5)]
        seconds: u64,
    },
    /// Through imcd (libimc): imc_asalloc of KEY with MODE; prints the
    /// status. The region lives while some process holds it: --hold keeps
    /// this one holding it (then imc_asdealloc).
    ImcAlloc {
        /// Region key.
        #[arg(long)]
        key: u64,
        /// Permission bits, octal.
        #[arg(long, default_value = "600")]
        mode: String,
        /// Region size in bytes.
        #[arg(long, default_value_t = 8192)]
        size: u64,
        /// IMC_COHERENT.
        #[arg(long)]
        coherent: bool,
        /// Hold the region this many seconds (or until SIGTERM) before letting go.
        #[arg(long, default_value_t = 0)]
        hold: u64,
    },
    /// Through imcd (libimc): allocate region KEY, attach it for transmit and
    /// store VALUE into every word.
    ImcPut {
        /// Region key.
        #[arg(long)]
        key: u64,
        /// Region size in bytes.
        #[arg(long, default_value_t = 8192)]
        size: u64,
        /// Value stored.
        #[arg(long)]
        value: u64,
    },
    /// Through imcd (libimc): allocate region KEY, attach it for receive and
    /// wait until every word reads VALUE.
    ImcGet {
        /// Region key.
        #[arg(long)]
        key: u64,
        /// Region size in bytes.
        #[arg(long, default_value_t = 8192)]
        size: u64,
        /// Value awaited.
        #[arg(long)]
        value: u64,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 30)]
        timeout: u64,
    },
    /// Run on NODES nodes at once: each increments a counter kept in
    /// MEMORY CHANNEL space ROUNDS times under a cluster spinlock; succeeds
    /// when every node sees the exact total.
    LockTest {
        /// Nodes taking part (all must run this).
        #[arg(long)]
        nodes: usize,
        /// Increments per node.
        #[arg(long, default_value_t = 200)]
        rounds: u64,
        /// First of the three pages used (lock slots, counter, start barrier).
        #[arg(long, default_value_t = 56)]
        page: u64,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 120)]
        timeout: u64,
    },
    /// Enable transmit on a page and store the test pattern into it (8-byte stores).
    Fill {
        /// Page to fill.
        #[arg(long)]
        page: u64,
        /// Pattern seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Write the test pattern `fill` stores to stdout, raw (to compare with `dump`).
    Pattern {
        /// Page.
        #[arg(long)]
        page: u64,
        /// Pattern seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// One 8-byte store of VALUE at PAGE+OFFSET (enables transmit on the page).
    Poke {
        /// Page.
        #[arg(long)]
        page: u64,
        /// Byte offset in the page (multiple of 8).
        #[arg(long, default_value_t = 0)]
        offset: u64,
        /// Value stored.
        #[arg(long)]
        value: u64,
    },
    /// Wait until the receive buffer holds VALUE at PAGE+OFFSET.
    Wait {
        /// Page.
        #[arg(long)]
        page: u64,
        /// Byte offset in the page (multiple of 8).
        #[arg(long, default_value_t = 0)]
        offset: u64,
        /// Value awaited.
        #[arg(long)]
        value: u64,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 10)]
        timeout: u64,
        /// Receive buffer file.
        #[arg(long, default_value = DEFAULT_BUFFER)]
        buffer: PathBuf,
    },
    /// Write one page of the receive buffer to stdout, raw.
    Dump {
        /// Page.
        #[arg(long)]
        page: u64,
        /// Receive buffer file.
        #[arg(long, default_value = DEFAULT_BUFFER)]
        buffer: PathBuf,
    },
    /// Measure 8-byte stores per second into the transmit window.
    BenchTx {
        /// Page to store into (transmit is enabled on it).
        #[arg(long, default_value_t = 16)]
        page: u64,
        /// Number of stores.
        #[arg(long, default_value_t = 100_000)]
        stores: u64,
        /// Bytes between consecutive stores: 8 is contiguous (coalesced into
        /// page-sized packets), 16 or more makes every store its own packet.
        #[arg(long, default_value_t = 8)]
        stride: u64,
    },
    /// Round trips of 8-byte values between two nodes: `pong` on one (it
    /// echoes), then `ping` on the other (it measures; one way = RTT / 2).
    /// Over MEMORY CHANNEL (stores into the transmit window, polled receive
    /// memory), TCP (the cluster LAN) or ivshmem (shared memory, polled).
    Pingpong {
        /// ping (measures) or pong (echoes).
        #[arg(long)]
        role: String,
        /// mc, tcp or ivshmem.
        #[arg(long, default_value = "mc")]
        via: String,
        /// Measured round trips.
        #[arg(long, default_value_t = 200)]
        rounds: u64,
        /// Round trips before the measured ones, not recorded (both sides
        /// must be given the same).
        #[arg(long, default_value_t = 0)]
        warmup: u64,
        /// mc: page ping writes and pong reads.
        #[arg(long, default_value_t = 32)]
        ping_page: u64,
        /// mc: page pong writes and ping reads.
        #[arg(long, default_value_t = 33)]
        pong_page: u64,
        /// tcp, ping: the pong node's address (its LAN IP).
        #[arg(long)]
        peer: Option<String>,
        /// tcp: the port pong listens on.
        #[arg(long, default_value_t = 5997)]
        port: u16,
        /// ping: also write every round trip, in nanoseconds, one a line, in
        /// the order measured.
        #[arg(long)]
        samples: Option<PathBuf>,
        /// Give up after this many seconds without an answer.
        #[arg(long, default_value_t = 60)]
        timeout: u64,
    },
    /// Store ordering between two nodes: `checker` on one, then `writer` on
    /// the other. For every block size the writer stores, round after round,
    /// a block whose words all hold the round number and then a flag word
    /// right after it holding the round number; the checker polls the flags
    /// and fails if it ever sees a block word below the flag it read first.
    OrderTest {
        /// writer (stores) or checker (polls and checks).
        #[arg(long)]
        role: String,
        /// Block sizes in bytes (multiples of 8, up to 8192).
        #[arg(long, default_value = "64,256,1024,2048,4096,8192")]
        sizes: String,
        /// Rounds per size: one count for every size, or one per size.
        #[arg(long, default_value = "400000,300000,120000,40000,30000,15000")]
        rounds: String,
        /// First page: size number i uses pages PAGE+2i (block, and the flag
        /// when the block is smaller than a page) and PAGE+2i+1 (the flag of
        /// an 8 KiB block).
        #[arg(long, default_value_t = 64)]
        page: u64,
        /// Give up after this many seconds (checker).
        #[arg(long, default_value_t = 300)]
        timeout: u64,
    },
}

fn parse_pages(s: &str) -> Result<Vec<u64>> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u64, u64) = (a.parse().context("page range")?, b.parse().context("page range")?);
                if a > b {
                    bail!("page range {part} is backwards");
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().with_context(|| format!("'{part}' is not a page number"))?),
        }
    }
    if out.is_empty() {
        bail!("no pages given");
    }
    Ok(out)
}

fn check_page(a: &Adapter, page: u64) -> Result<()> {
    if page >= a.pages() {
        bail!("page {page} is outside the {}-page address space", a.pages());
    }
    Ok(())
}

fn info() -> Result<()> {
    let a = Adapter::open()?;
    let node = a.reg(reg::NODE);
    println!("pci        {}", a.dev.bdf);
    println!("id         {:#010x}", a.reg(reg::ID));
    match a.node() {
        Some(n) => println!("node       {n} of {} ports", node >> 16),
        None => println!("node       none (not joined)"),
    }
    println!("link       {}", if a.reg(reg::LINK) & 1 != 0 { "up" } else { "down" });
    let members = (a.reg(reg::MEMBERS_HI) as u64) << 32 | a.reg(reg::MEMBERS_LO) as u64;
    let list: Vec<String> = (0..64).filter(|i| members & (1 << i) != 0).map(|i| i.to_string()).collect();
    println!("members    {}", list.join(","));
    println!("pages      {} x {} bytes", a.pages(), PAGE_SIZE);
    let es = a.reg(reg::ERR_STATUS);
    let names = [
        (err::TX_DISABLED, "tx-disabled"),
        (err::TX_READ, "tx-read"),
        (err::RX_DMA, "rx-dma"),
        (err::LINK_DOWN, "link-down"),
        (err::CRC, "crc"),
        (err::RX_RANGE, "rx-range"),
    ];
    let set: Vec<&str> = names.iter().filter(|(b, _)| es & b != 0).map(|(_, n)| *n).collect();
    println!("errors     {es:#x} [{}] count {}", set.join(" "), a.reg(reg::ERR_COUNT));
    println!(
        "interrupts cause {:#x} mask {:#x} notify-queued {} notify-lost {}",
        a.reg(reg::INT_CAUSE),
        a.reg(reg::INT_MASK),
        a.reg(reg::NOTIFY_COUNT),
        a.reg(reg::NOTIFY_LOST)
    );
    println!("link-events {} last-seq {}", a.reg(reg::LINK_EVENTS), a.reg(reg::LAST_SEQ));
    println!(
        "packets    tx {} rx {} rx-dropped {}",
        a.reg(reg::TX_PACKETS),
        a.reg(reg::RX_PACKETS),
        a.reg(reg::RX_DROPPED)
    );
    Ok(())
}

fn setup_rx(pages: &[u64], buffer: &Path) -> Result<(Adapter, RxBuffer)> {
    let a = Adapter::open()?;
    for &p in pages {
        check_page(&a, p)?;
    }
    let n = pages.iter().max().unwrap() + 1;
    let buf = RxBuffer::create(buffer, n).with_context(|| format!("creating receive buffer {}", buffer.display()))?;
    buf.clear();
    buf.map_for_dma(&a.dev)?;
    for &p in pages {
        let (bits, _) = a.page(p);
        a.set_page(p, bits | pct::RX, RX_IOVA_BASE + p * PAGE_SIZE);
    }
    Ok((a, buf))
}

fn rx(pages: &str, buffer: &Path, foreground: bool) -> Result<()> {
    let pages = parse_pages(pages)?;
    if foreground {
        let (a, _buf) = setup_rx(&pages, buffer)?;
        println!("receiving pages {pages:?} into {}", buffer.display());
        hold_until_stopped(&a, &pages);
        return Ok(());
    }
    let mut fds = [0; 2];
    // SAFETY: pipe(2) fills two fds.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        bail!("pipe: {}", std::io::Error::last_os_error());
    }
    // SAFETY: single-threaded at this point; the child only continues our code.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        bail!("fork: {}", std::io::Error::last_os_error());
    }
    if pid > 0 {
        // Parent: wait for the child's verdict.
        // SAFETY: closing our copy of the write end.
        unsafe { libc::close(fds[1]) };
        let mut msg = Vec::new();
        let mut b = [0u8; 512];
        loop {
            // SAFETY: reading into a local buffer.
            let n = unsafe { libc::read(fds[0], b.as_mut_ptr().cast(), b.len()) };
            if n <= 0 {
                break;
            }
            msg.extend_from_slice(&b[..n as usize]);
        }
        let msg = String::from_utf8_lossy(&msg);
        if let Some(err) = msg.strip_prefix("err:") {
            bail!("{err}");
        }
        if !msg.starts_with("ok") {
            bail!("receiver exited during setup");
        }
        println!("receiving pages {pages:?} into {} (pid {pid}; stop with 'mctool stop')", buffer.display());
        return Ok(());
    }
    // Child.
    // SAFETY: plain syscalls on our own fds.
    unsafe {
        libc::close(fds[0]);
        libc::setsid();
    }
    let report = |s: &str| {
        // SAFETY: writing a local buffer to our pipe end.
        unsafe { libc::write(fds[1], s.as_ptr().cast(), s.len()) };
    };
    match setup_rx(&pages, buffer) {
        Ok((a, buf)) => {
            let _ = std::fs::write(PID_FILE, format!("{}\n", std::process::id()));
            let null = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null")?;
            // SAFETY: redirecting our stdio to /dev/null so the caller's pipes close.
            unsafe {
                use std::os::fd::AsRawFd;
                libc::dup2(null.as_raw_fd(), 0);
                libc::dup2(null.as_raw_fd(), 1);
                libc::dup2(null.as_raw_fd(), 2);
            }
            report("ok");
            // SAFETY: closing the pipe end tells the parent we are done.
            unsafe { libc::close(fds[1]) };
            hold_until_stopped(&a, &pages);
            drop(buf);
            std::process::exit(0);
        }
        Err(e) => {
            report(&format!("err:{e:#}"));
            std::process::exit(1);
        }
    }
}

fn stop() -> Result<()> {
    let pid: i32 = std::fs::read_to_string(PID_FILE)
        .context("no background receiver (no pid file)")?
        .trim()
        .parse()
        .context("bad pid file")?;
    // SAFETY: kill(2), no memory.
    if unsafe { libc::kill(pid, libc::SIGTERM) } != 0 {
        bail!("cannot stop pid {pid}: {}", std::io::Error::last_os_error());
    }
    // Wait for it to go so the device is free when we return.
    let deadline = Instant::now() + Duration::from_secs(5);
    // SAFETY: signal 0 only checks existence.
    while unsafe { libc::kill(pid, 0) } == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = std::fs::remove_file(PID_FILE);
    Ok(())
}

fn disable_rx(a: &Adapter, page: u64) {
    let (bits, iova) = a.page(page);
    a.set_page(page, bits & !pct::RX, iova);
}

fn tx_page(a: &Adapter, page: u64) -> Result<()> {
    check_page(a, page)?;
    let (bits, iova) = a.page(page);
    a.set_page(page, bits | pct::TX, iova);
    Ok(())
}

fn wait_value(buf: &RxBuffer, off: usize, value: u64, timeout: Duration) -> Result<Duration> {
    let t0 = Instant::now();
    while buf.read64(off) != value {
        if t0.elapsed() > timeout {
            bail!("timed out after {timeout:?}: offset {off:#x} holds {:#x}, not {value:#x}", buf.read64(off));
        }
        std::hint::spin_loop();
    }
    Ok(t0.elapsed())
}

fn notify_wait(page: u64, timeout: u64) -> Result<()> {
    let buffer = PathBuf::from(format!("/dev/shm/mc-notify-{page}"));
    let (a, _buf) = setup_rx(&[page], &buffer)?;
    let irq = Interrupt::msix(&a.dev)?;
    let (bits, iova) = a.page(page);
    a.set_page(page, bits | pct::INT, iova);
    // Start clean: drop old notifications, then enable the cause.
    a.set_reg(reg::INT_CAUSE, int::ALL);
    while a.reg(reg::NOTIFY_FIFO) != NOTIFY_EMPTY {}
    a.set_reg(reg::INT_MASK, int::NOTIFY);
    println!("armed: waiting for a write to page {page}");
    std::io::stdout().flush()?;
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(timeout);
    let result = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break Err(anyhow::anyhow!("no notification for page {page} within {timeout} s"));
        }
        if irq.wait(left)? == 0 {
            continue;
        }
        let cause = a.reg(reg::INT_CAUSE);
        a.set_reg(reg::INT_CAUSE, cause);
        let mut pages = Vec::new();
        loop {
            let p = a.reg(reg::NOTIFY_FIFO);
            if p == NOTIFY_EMPTY {
                break;
            }
            pages.push(p as u64);
        }
        if pages.contains(&page) {
            break Ok((cause, pages));
        }
    };
    a.set_reg(reg::INT_MASK, 0);
    let (bits, iova) = a.page(page);
    a.set_page(page, bits & !(pct::INT | pct::RX), iova);
    let (cause, pages) = result?;
    println!(
        "woke: interrupt after {:.1} ms, cause {cause:#x}, notified pages {pages:?}",
        t0.elapsed().as_secs_f64() * 1e3
    );
    Ok(())
}

fn ack(page: u64, timeout: u64) -> Result<()> {
    let buffer = PathBuf::from(format!("/dev/shm/mc-ack-{page}"));
    let (a, buf) = setup_rx(&[page], &buffer)?;
    let me = a.node().context("not joined to a hub")?;
    let (bits, iova) = a.page(page);
    a.set_page(page, bits | pct::TX | pct::ACK, iova);
    let members = (a.reg(reg::MEMBERS_HI) as u64) << 32 | a.reg(reg::MEMBERS_LO) as u64;
    let others: Vec<u64> = (0..64).filter(|&n| members & (1 << n) != 0 && n != me as u64).collect();
    a.store64(page * PAGE_SIZE, 1);
    let off = (page * PAGE_SIZE) as usize;
    let t0 = Instant::now();
    let answered = |n: u64| buf.read(off + n as usize, 1)[0] & ACK_VALID != 0;
    while !others.iter().all(|&n| answered(n)) && t0.elapsed() < Duration::from_secs(timeout) {
        std::thread::sleep(Duration::from_micros(100));
    }
    let mut missing = 0;
    for &n in &others {
        let b = buf.read(off + n as usize, 1)[0];
        if b & ACK_VALID == 0 {
            missing += 1;
            println!("node {n}: no answer");
        } else {
            let status = b & !ACK_VALID;
            println!("node {n}: {} (status {status:#04x})", if status == 0 { "ok" } else { "errors" });
        }
    }
    let (bits, iova) = a.page(page);
    a.set_page(page, bits & !(pct::ACK | pct::RX), iova);
    if missing > 0 {
        bail!("{missing} node(s) did not answer within {timeout} s");
    }
    println!("all {} other node(s) answered in {:.2} ms", others.len(), t0.elapsed().as_secs_f64() * 1e3);
    Ok(())
}

fn lock_test(nodes: usize, rounds: u64, page: u64, timeout: u64) -> Result<()> {
    use imc_client::cluster_lock::ClusterLock;
    let (lock_page, counter_page, barrier_page) = (page, page + 1, page + 2);
    let buffer = PathBuf::from("/dev/shm/mc-lock-test");
    let (a, buf) = setup_rx(&[lock_page, counter_page, barrier_page], &buffer)?;
    for p in [lock_page, counter_page, barrier_page] {
        let (bits, iova) = a.page(p);
        a.set_page(p, bits | pct::TX | pct::LOOPBACK, iova);
    }
    let me = a.node().context("not joined to a hub")? as usize;
    let ports = (a.reg(reg::NODE) >> 16) as usize;
    if nodes == 0 || nodes > ports {
        bail!("--nodes must be between 1 and the hub's {ports} ports");
    }
    let limit = Duration::from_secs(timeout);
    let t0 = Instant::now();
    let word = |p: u64, i: usize| (p * PAGE_SIZE) as usize + 8 * i;
    // Start barrier: nobody increments before every node receives. Flags are
    // sent again until all are seen (a node that set up late missed earlier
    // ones), then once more, after which every node has them.
    let ready = |i: usize| buf.read64(word(barrier_page, i)) == 1;
    loop {
        a.store64(barrier_page * PAGE_SIZE + 8 * me as u64, 1);
        let seen = (0..ports).filter(|&i| ready(i)).count();
        if seen >= nodes {
            a.store64(barrier_page * PAGE_SIZE + 8 * me as u64, 1);
            break;
        }
        if t0.elapsed() > limit {
            bail!("only {seen} of {nodes} nodes reached the start barrier");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let (a, buf) = (std::sync::Arc::new(a), std::sync::Arc::new(buf));
    let bus = imcd::bus::AdapterBus { adapter: a.clone(), buf: buf.clone(), page: lock_page, node: me, slots: ports };
    let lock = ClusterLock::new(bus);
    let counter_addr = counter_page * PAGE_SIZE;
    let mut waits = Vec::with_capacity(rounds as usize);
    for _ in 0..rounds {
        let ta = Instant::now();
        lock.acquire(limit)?;
        waits.push(ta.elapsed());
        // Inside: a plain read-modify-write of the shared counter. Our store
        // is ordered before our release, so the next holder sees it.
        let c = buf.read64(counter_addr as usize);
        a.store64(counter_addr, c + 1);
        while buf.read64(counter_addr as usize) != c + 1 {
            std::hint::spin_loop();
        }
        lock.release();
    }
    let total = rounds * nodes as u64;
    while buf.read64(counter_addr as usize) < total && t0.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(1));
    }
    let seen = buf.read64(counter_addr as usize);
    // Leave the pages quiet for the next user.
    for p in [lock_page, counter_page, barrier_page] {
        disable_rx(&a, p);
    }
    let p50 = testkit::stats::Summary::of(&mut waits).map_or(0.0, |s| s.p50.as_secs_f64() * 1e6);
    if seen != total {
        bail!("node {me}: counter reads {seen}, expected {total}: updates were lost or never arrived");
    }
    println!("node {me}: counter {seen} of {total} exact; acquire p50 {p50:.0} us");
    Ok(())
}

fn imc_lock_test(key: u64, procs: usize, rounds: u64, total: u64, timeout: u64) -> Result<()> {
    use imc_client::Imc;
    let counter_key = key + 1000;
    let limit = Duration::from_secs(timeout);
    let mut children = Vec::new();
    for p in 0..procs {
        // SAFETY: fork before any threads; the child only runs the loop below.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            bail!("fork: {}", std::io::Error::last_os_error());
        }
        if pid > 0 {
            children.push(pid);
            continue;
        }
        let r = (|| -> Result<u64> {
            let imc = Imc::connect()?;
            let (set, _) = imc.lkalloc(key, 1, 0o666, false)?;
            // Coherent: every node has received the counter from the start.
            let (id, ..) = imc.asalloc_flags(counter_key, 8192, 0o666, false, true)?;
            let tx = imc.asattach(id, true, true)?;
            let rx = imc.asattach(id, false, false)?;
            for _ in 0..rounds {
                set.acquire(0, limit)?;
                // A plain read-modify-write, safe only under the lock.
                let c = rx.load64(0);
                tx.store64(0, c + 1);
                while rx.load64(0) != c + 1 {
                    std::hint::spin_loop();
                }
                set.release(0)?;
            }
            let t0 = Instant::now();
            while total > 0 && rx.load64(0) < total && t0.elapsed() < limit {
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok(rx.load64(0))
        })();
        match r {
            Ok(seen) if total == 0 || seen == total => {
                println!("process {p}: counter {seen} exact");
                std::process::exit(0)
            }
            Ok(seen) => {
                println!("process {p}: counter {seen}, expected {total}");
                std::process::exit(1)
            }
            Err(e) => {
                println!("process {p}: {e:#}");
                std::process::exit(1)
            }
        }
    }
    let mut failed = 0;
    for pid in children {
        let mut st = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(pid, &mut st, 0) };
        if st != 0 {
            failed += 1;
        }
    }
    if failed > 0 {
        bail!("{failed} of {procs} processes failed");
    }
    Ok(())
}

/// One end of a ping-pong: 8-byte values, never 0, sent and awaited.
trait Wire {
    /// Sends `v` to the other end.
    fn send(&mut self, v: u64) -> Result<()>;
    /// Pong: waits for the next value from the other end.
    fn next(&mut self, limit: Duration) -> Result<u64>;
    /// Ping: waits until the other end has sent `v` back.
    fn wait_for(&mut self, v: u64, limit: Duration) -> Result<()>;
    /// Leaves the device as it was found.
    fn finish(&mut self) {}
}

/// MEMORY CHANNEL: stores into our transmit page, polling our receive page.
struct McWire {
    a: Adapter,
    buf: RxBuffer,
    rx_page: u64,
    tx_page: u64,
    last: u64,
}

impl McWire {
    fn open(role: &str, rx_page: u64, tx_page_no: u64) -> Result<McWire> {
        let buffer = PathBuf::from(format!("/dev/shm/mc-pingpong-{role}"));
        let (a, buf) = setup_rx(&[rx_page], &buffer)?;
        tx_page(&a, tx_page_no)?;
        // setup_rx cleared the buffer: nothing has arrived yet.
        Ok(McWire { a, buf, rx_page, tx_page: tx_page_no, last: 0 })
    }

    fn rx_off(&self) -> usize {
        (self.rx_page * PAGE_SIZE) as usize
    }
}

impl Wire for McWire {
    fn send(&mut self, v: u64) -> Result<()> {
        self.a.store64(self.tx_page * PAGE_SIZE, v);
        Ok(())
    }
    fn next(&mut self, limit: Duration) -> Result<u64> {
        self.last = poll_change(|| self.buf.read64(self.rx_off()), self.last, limit)?;
        Ok(self.last)
    }
    fn wait_for(&mut self, v: u64, limit: Duration) -> Result<()> {
        wait_value(&self.buf, self.rx_off(), v, limit).map(|_| ())
    }
    fn finish(&mut self) {
        disable_rx(&self.a, self.rx_page);
        let (bits, iova) = self.a.page(self.tx_page);
        self.a.set_page(self.tx_page, bits & !pct::TX, iova);
    }
}

/// ivshmem: ping's word at offset 0, pong's at 64 (another cache line).
struct IvshmemWire {
    mem: guest_driver::ivshmem::Ivshmem,
    rx_off: usize,
    tx_off: usize,
    last: u64,
}

impl IvshmemWire {
    fn open(role: &str) -> Result<IvshmemWire> {
        let mem = guest_driver::ivshmem::Ivshmem::open()?;
        let (rx_off, tx_off) = if role == "ping" { (64, 0) } else { (0, 64) };
        if role == "pong" {
            // Clear our answer word; whatever ping's word holds (an earlier
            // run's value) is not a ping.
            mem.write64(tx_off, 0);
        }
        let last = mem.read64(rx_off);
        Ok(IvshmemWire { mem, rx_off, tx_off, last })
    }
}

impl Wire for IvshmemWire {
    fn send(&mut self, v: u64) -> Result<()> {
        self.mem.write64(self.tx_off, v);
        Ok(())
    }
    fn next(&mut self, limit: Duration) -> Result<u64> {
        self.last = poll_change(|| self.mem.read64(self.rx_off), self.last, limit)?;
        Ok(self.last)
    }
    fn wait_for(&mut self, v: u64, limit: Duration) -> Result<()> {
        let t0 = Instant::now();
        while self.mem.read64(self.rx_off) != v {
            if t0.elapsed() > limit {
                bail!("no echo of {v:#x} within {limit:?}");
            }
            std::hint::spin_loop();
        }
        Ok(())
    }
}

/// TCP: 8 bytes each way on one connection, Nagle off.
struct TcpWire {
    s: std::net::TcpStream,
}

impl TcpWire {
    /// Pong: listen on `port`, tell the caller we are ready, take one connection.
    fn accept(port: u16, limit: Duration) -> Result<TcpWire> {
        let l =
            std::net::TcpListener::bind(("0.0.0.0", port)).with_context(|| format!("listening on TCP port {port}"))?;
        l.set_nonblocking(true)?;
        println!("pong ready");
        std::io::stdout().flush()?;
        let t0 = Instant::now();
        let s = loop {
            match l.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if t0.elapsed() > limit {
                        bail!("no ping connected to TCP port {port} within {limit:?}");
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => return Err(e).context("accepting the ping connection"),
            }
        };
        s.set_nonblocking(false)?;
        Self::tune(s, limit)
    }

    /// Ping: connect to pong at `peer:port`.
    fn connect(peer: &str, port: u16, limit: Duration) -> Result<TcpWire> {
        let s =
            std::net::TcpStream::connect((peer, port)).with_context(|| format!("TCP connection to {peer}:{port}"))?;
        Self::tune(s, limit)
    }

    fn tune(s: std::net::TcpStream, limit: Duration) -> Result<TcpWire> {
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(limit))?;
        Ok(TcpWire { s })
    }
}

impl Wire for TcpWire {
    fn send(&mut self, v: u64) -> Result<()> {
        self.s.write_all(&v.to_le_bytes()).context("TCP send")
    }
    fn next(&mut self, _limit: Duration) -> Result<u64> {
        use std::io::Read;
        let mut b = [0u8; 8];
        self.s.read_exact(&mut b).context("TCP receive (read timeout is --timeout)")?;
        Ok(u64::from_le_bytes(b))
    }
    fn wait_for(&mut self, v: u64, limit: Duration) -> Result<()> {
        let got = self.next(limit)?;
        if got != v {
            bail!("TCP echo {got:#x} is not the {v:#x} sent");
        }
        Ok(())
    }
}

/// Polls `read` until it returns something other than `last` (and not 0).
fn poll_change(read: impl Fn() -> u64, last: u64, limit: Duration) -> Result<u64> {
    let t0 = Instant::now();
    loop {
        let v = read();
        if v != 0 && v != last {
            return Ok(v);
        }
        if t0.elapsed() > limit {
            bail!("no ping within {limit:?}");
        }
        std::hint::spin_loop();
    }
}

struct PingpongArgs {
    role: String,
    via: String,
    rounds: u64,
    warmup: u64,
    ping_page: u64,
    pong_page: u64,
    peer: Option<String>,
    port: u16,
    samples: Option<PathBuf>,
    timeout: u64,
}

fn pingpong(p: PingpongArgs) -> Result<()> {
    let ping = match p.role.as_str() {
        "ping" => true,
        "pong" => false,
        other => bail!("--role must be ping or pong, not '{other}'"),
    };
    if p.rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    let total = p.rounds.checked_add(p.warmup).filter(|&t| t <= u32::MAX as u64);
    let total = total.context("--rounds plus --warmup must be at most 2^32 - 1")?;
    if p.via != "tcp" && p.peer.is_some() {
        bail!("--peer is only for --via tcp");
    }
    let limit = Duration::from_secs(p.timeout);
    let mut wire: Box<dyn Wire> = match p.via.as_str() {
        "mc" => {
            let (rx, tx) = if ping { (p.pong_page, p.ping_page) } else { (p.ping_page, p.pong_page) };
            Box::new(McWire::open(&p.role, rx, tx)?)
        }
        "ivshmem" => Box::new(IvshmemWire::open(&p.role)?),
        "tcp" if ping => {
            let peer =
                p.peer.as_deref().context("--via tcp --role ping needs --peer IP (the pong node's LAN address)")?;
            Box::new(TcpWire::connect(peer, p.port, limit)?)
        }
        "tcp" => Box::new(TcpWire::accept(p.port, limit)?),
        other => bail!("--via must be mc, tcp or ivshmem, not '{other}'"),
    };
    if !ping {
        if p.via != "tcp" {
            println!("pong ready");
            std::io::stdout().flush()?;
        }
        let r = (0..total).try_for_each(|_| {
            let v = wire.next(limit)?;
            wire.send(v)
        });
        wire.finish();
        return r;
    }
    // Values never seen before on this wire: the clock in the high half.
    let nonce = (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos() as u64) << 32;
    let mut rtts = Vec::with_capacity(p.rounds as usize);
    let r = (1..=total).try_for_each(|i| {
        let v = nonce | i;
        let t0 = Instant::now();
        wire.send(v)?;
        wire.wait_for(v, limit)?;
        if i > p.warmup {
            rtts.push(t0.elapsed());
        }
        Ok::<(), anyhow::Error>(())
    });
    wire.finish();
    r?;
    if let Some(path) = &p.samples {
        let text: String = rtts.iter().map(|d| format!("{}\n", d.as_nanos())).collect();
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    let rtt = testkit::stats::Summary::of(&mut rtts).context("no samples")?;
    println!(
        "via={} rounds={} warmup={} {} {}",
        p.via,
        p.rounds,
        p.warmup,
        rtt.fields("rtt"),
        rtt.div(2).fields("one_way")
    );
    Ok(())
}

/// One block size of `order-test`: the block at global address `base` (page
/// `page`), the flag word right after it at `base + size`.
struct OrderSize {
    size: u64,
    rounds: u64,
    page: u64,
    base: u64,
}

impl OrderSize {
    fn flag(&self) -> u64 {
        self.base + self.size
    }
}

/// Parses `--sizes` and `--rounds` of `order-test` into one entry per size,
/// size number i on pages `first_page + 2i` and `first_page + 2i + 1`.
fn order_plan(sizes: &str, rounds: &str, first_page: u64) -> Result<Vec<OrderSize>> {
    let list = |s: &str, what: &str| -> Result<Vec<u64>> {
        s.split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(|p| p.parse::<u64>().with_context(|| format!("{what}: '{p}' is not a number")))
            .collect()
    };
    let sizes = list(sizes, "--sizes")?;
    if sizes.is_empty() {
        bail!("--sizes is empty: give block sizes in bytes, like 64,256,8192");
    }
    for &s in &sizes {
        if s == 0 || s % 8 != 0 || s > PAGE_SIZE {
            bail!("block size {s} must be a multiple of 8 from 8 to {PAGE_SIZE}");
        }
    }
    let mut rounds = list(rounds, "--rounds")?;
    if rounds.len() == 1 {
        rounds = vec![rounds[0]; sizes.len()];
    }
    if rounds.len() != sizes.len() {
        bail!("--rounds gives {} counts for {} sizes: give one count, or one per size", rounds.len(), sizes.len());
    }
    if let Some(r) = rounds.iter().find(|&&r| r < 2) {
        bail!("{r} rounds is too few: at least 2 per size (the first flag the checker sees only shows that receive is on)");
    }
    Ok(sizes
        .iter()
        .zip(&rounds)
        .enumerate()
        .map(|(i, (&size, &rounds))| {
            let page = first_page + 2 * i as u64;
            OrderSize { size, rounds, page, base: page * PAGE_SIZE }
        })
        .collect())
}

fn order_test(role: &str, sizes: &str, rounds: &str, first_page: u64, timeout: u64) -> Result<()> {
    if role != "writer" && role != "checker" {
        bail!("--role must be writer or checker, not '{role}'");
    }
    let plan = order_plan(sizes, rounds, first_page)?;
    let pages: Vec<u64> = plan.iter().flat_map(|s| [s.page, s.page + 1]).collect();
    if role == "writer" {
        order_writer(&plan, &pages)
    } else {
        order_checker(&plan, &pages, Duration::from_secs(timeout))
    }
}

/// Size after size, `rounds` times: every word of the block gets the round
/// number (8-byte stores in address order), then the flag does.
fn order_writer(plan: &[OrderSize], pages: &[u64]) -> Result<()> {
    let a = Adapter::open()?;
    for &p in pages {
        tx_page(&a, p)?;
    }
    let (mut all_rounds, mut all_bytes, mut all_secs) = (0u64, 0u64, 0f64);
    for s in plan {
        let tx0 = a.reg(reg::TX_PACKETS);
        let t0 = Instant::now();
        for r in 1..=s.rounds {
            for off in (0..s.size).step_by(8) {
                a.store64(s.base + off, r);
            }
            a.store64(s.flag(), r);
        }
        // A register read completes after every posted store before it.
        let packets = a.reg(reg::TX_PACKETS).wrapping_sub(tx0);
        let secs = t0.elapsed().as_secs_f64();
        let bytes = s.rounds * (s.size + 8);
        println!(
            "writer size={} rounds={} seconds={secs:.3} rounds_per_sec={:.0} bytes_per_sec={:.0} packets={packets} packets_per_round={:.2}",
            s.size,
            s.rounds,
            s.rounds as f64 / secs,
            bytes as f64 / secs,
            packets as f64 / s.rounds as f64
        );
        all_rounds += s.rounds;
        all_bytes += bytes;
        all_secs += secs;
    }
    println!(
        "writer total rounds={all_rounds} bytes={all_bytes} seconds={all_secs:.3} rounds_per_sec={:.0} bytes_per_sec={:.0}",
        all_rounds as f64 / all_secs,
        all_bytes as f64 / all_secs
    );
    Ok(())
}

/// What the checker saw of one size.
#[derive(Default)]
struct OrderSeen {
    /// First nonzero flag read: receive was on when it landed, but maybe not
    /// when its block did, so only later flags are checked.
    first: u64,
    /// Last flag read.
    last: u64,
    /// Flag reads.
    polls: u64,
    /// Distinct nonzero flag values read (the first one included).
    distinct: u64,
    /// Checks made: a flag value read for the first time, then every word
    /// of the block.
    checks: u64,
    /// Checks that found a block word below the flag, or a flag below the
    /// one read before it.
    violations: u64,
    /// Block words found below the flag, over all checks.
    bad_words: u64,
    /// The last round's flag was seen.
    done: bool,
    /// When the first and the last flag were read.
    span: Option<(Instant, Instant)>,
}

/// Polls every size's flag; for each new flag value f read (after the
/// first), reads the block and counts a violation when a word holds less
/// than f: the writer stored all of round f's block before its flag, and
/// rounds only increase, so every word already holds f or more. A flag read
/// again unchanged is not checked again (the words can only have grown
/// since): polling stays fast, which is what gives the checker a chance to
/// read a flag while the packet carrying it is still being written.
fn order_checker(plan: &[OrderSize], pages: &[u64], limit: Duration) -> Result<()> {
    let buffer = PathBuf::from("/dev/shm/mc-order-test");
    let (a, buf) = setup_rx(pages, &buffer)?;
    let mut seen: Vec<OrderSeen> = plan.iter().map(|_| OrderSeen::default()).collect();
    println!(
        "checker ready: {} sizes on pages {}..={}",
        plan.len(),
        pages.iter().min().unwrap(),
        pages.iter().max().unwrap()
    );
    std::io::stdout().flush()?;
    let t0 = Instant::now();
    let mut printed = 0;
    let mut timed_out = false;
    let mut spins = 0u64;
    while seen.iter().any(|st| !st.done) {
        for (s, st) in plan.iter().zip(seen.iter_mut()).filter(|(_, st)| !st.done) {
            let f = buf.read64(s.flag() as usize);
            st.polls += 1;
            if f == 0 || f == st.last {
                continue;
            }
            st.distinct += 1;
            if st.first == 0 {
                st.first = f;
                st.last = f;
                st.done = f >= s.rounds;
                continue;
            }
            if f < st.last {
                st.violations += 1;
                if printed < 20 {
                    printed += 1;
                    println!("VIOLATION size={} flag went back from {} to {f}", s.size, st.last);
                }
                st.last = f;
                continue;
            }
            if f <= st.first {
                st.last = f;
                continue;
            }
            let mut bad = 0u64;
            let mut first_bad = None;
            for off in (0..s.size).step_by(8) {
                let v = buf.read64((s.base + off) as usize);
                if v < f {
                    bad += 1;
                    first_bad.get_or_insert((off, v));
                }
            }
            let now = Instant::now();
            st.span = Some((st.span.map_or(now, |(a, _)| a), now));
            st.checks += 1;
            st.last = f;
            if let Some((off, v)) = first_bad {
                st.violations += 1;
                st.bad_words += bad;
                if printed < 20 {
                    printed += 1;
                    println!(
                        "VIOLATION size={} flag={f}: {bad} of {} words below it, first at byte {off} holds {v}",
                        s.size,
                        s.size / 8
                    );
                }
            }
            st.done = f >= s.rounds;
        }
        spins += 1;
        // Reading the clock can be slow in a guest: not on every pass.
        if spins.is_multiple_of(1024) && t0.elapsed() > limit {
            timed_out = true;
            break;
        }
    }
    for &p in pages {
        disable_rx(&a, p);
    }
    let (mut polls, mut checks, mut distinct, mut violations, mut bad_words) = (0, 0, 0, 0, 0);
    let mut blind = Vec::new();
    for (s, st) in plan.iter().zip(&seen) {
        let secs = st.span.map_or(0.0, |(a, b)| (b - a).as_secs_f64());
        println!(
            "checker size={} rounds={} first_flag={} last_flag={} polls={} checks={} distinct_flags={} violations={} bad_words={} seconds={secs:.3} checks_per_sec={:.0}",
            s.size,
            s.rounds,
            st.first,
            st.last,
            st.polls,
            st.checks,
            st.distinct,
            st.violations,
            st.bad_words,
            st.checks as f64 / secs.max(1e-9)
        );
        polls += st.polls;
        checks += st.checks;
        distinct += st.distinct;
        violations += st.violations;
        bad_words += st.bad_words;
        if st.checks == 0 {
            blind.push(s.size);
        }
    }
    println!(
        "checker total polls={polls} checks={checks} distinct_flags={distinct} violations={violations} bad_words={bad_words} seconds={:.3}",
        t0.elapsed().as_secs_f64()
    );
    if violations > 0 {
        bail!("{violations} ordering violations: a flag was visible before the block stored ahead of it");
    }
    if timed_out {
        let late: Vec<String> = plan
            .iter()
            .zip(&seen)
            .filter(|(_, st)| !st.done)
            .map(|(s, st)| format!("size {} at flag {} of {}", s.size, st.last, s.rounds))
            .collect();
        bail!("timed out after {limit:?}: {}", late.join(", "));
    }
    if !blind.is_empty() {
        bail!("no flag was observed and checked for block sizes {blind:?}: nothing was tested");
    }
    Ok(())
}

/// An imcd refusal as the `IMC_*` status a C program would see.
fn imc_status(e: imc_client::ImcError) -> anyhow::Error {
    match e {
        imc_client::ImcError::Refused { code, message } => anyhow::anyhow!("IMC_{code}: {message}"),
        e => e.into(),
    }
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    if let Some(uid) = cli.uid {
        let gid = cli.gid.unwrap_or(uid);
        // SAFETY: plain syscalls; group first, while we still may.
        if unsafe { libc::setgid(gid) } != 0 || unsafe { libc::setuid(uid) } != 0 {
            bail!("cannot become uid {uid} gid {gid}: {}", std::io::Error::last_os_error());
        }
    }
    match cli.cmd {
        Cmd::Info => info(),
        Cmd::Rx { pages, buffer, foreground } => rx(&pages, &buffer, foreground),
        Cmd::Stop => stop(),
        Cmd::NotifyWait { page, timeout } => notify_wait(page, timeout),
        Cmd::Ack { page, timeout } => ack(page, timeout),
        Cmd::LockTest { nodes, rounds, page, timeout } => lock_test(nodes, rounds, page, timeout),
        Cmd::ImcLockTest { key, procs, rounds, total, timeout } => imc_lock_test(key, procs, rounds, total, timeout),
        Cmd::ImcKill { host, pid, sig } => {
            let imc = imc_client::Imc::connect()?;
            imc.kill(&host, pid, sig).map_err(imc_status)?;
            println!("IMC_SUCCESS signal {sig} sent to pid {pid} on {host}");
            Ok(())
        }
        Cmd::WaitSignal { timeout } => wait_signal(timeout),
        Cmd::ImcDrill { id } => {
            let imc = imc_client::Imc::connect()?;
            imc.abandon_update(id).map_err(imc_status)?;
            bail!("imcd answered the drill: it should have stopped")
        }
        Cmd::ImcCheckErrors { seconds } => {
            let imc = imc_client::Imc::connect()?;
            let regs = imc.regs()?;
            let before = regs.rderrcnt();
            println!("error count {before}; waiting {seconds} s");
            std::io::stdout().flush()?;
            std::thread::sleep(Duration::from_secs(seconds));
            let mut errors = before;
            if regs.ckerrcnt(&mut errors) {
                println!("ckerrcnt: new errors (count now {errors})");
                Ok(())
            } else {
                bail!("ckerrcnt: no new errors");
            }
        }
        Cmd::ImcAlloc { key, mode, size, coherent, hold } => {
            let mode = u32::from_str_radix(&mode, 8).context("--mode is octal, like 600")?;
            let imc = imc_client::Imc::connect()?;
            let (id, first, pages, created) =
                imc.asalloc_flags(key, size, mode, false, coherent).map_err(imc_status)?;
            println!(
                "IMC_SUCCESS region {id} pages {first}..{} {}",
                first + pages,
                if created { "created" } else { "existing" }
            );
            if hold > 0 {
                std::io::stdout().flush()?;
                stop_on_signals();
                let t0 = Instant::now();
                while t0.elapsed() < Duration::from_secs(hold) && !STOP.load(std::sync::atomic::Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(10));
                }
                imc.asdealloc(id).map_err(imc_status)?;
                println!("let go of region {id}");
            }
            Ok(())
        }
        Cmd::ImcHosts => {
            let imc = imc_client::Imc::connect()?;
            let regs = imc.regs()?;
            let hosts = imc.gethosts()?;
            let names: Vec<String> = hosts.iter().map(|(n, h)| format!("{n}={h}")).collect();
            println!(
                "hosts {:?} errors {} names {}",
                hosts.iter().map(|h| h.0).collect::<Vec<_>>(),
                regs.rderrcnt(),
                names.join(",")
            );
            Ok(())
        }
        Cmd::ImcPut { key, size, value } => {
            let imc = imc_client::Imc::connect()?;
            let (id, first, pages, created) = imc.asalloc(key, size, 0o666, false)?;
            let tx = imc.asattach(id, true, false)?;
            for off in (0..tx.len()).step_by(8) {
                tx.store64(off, value);
            }
            println!(
                "region {id} (key {key}, pages {first}..{}, {}): stored {value} into {} words",
                first + pages,
                if created { "created" } else { "existing" },
                tx.len() / 8
            );
            Ok(())
        }
        Cmd::ImcGet { key, size, value, timeout } => {
            let imc = imc_client::Imc::connect()?;
            let (id, first, pages, created) = imc.asalloc(key, size, 0o666, false)?;
            let rx = imc.asattach(id, false, false)?;
            println!(
                "region {id} (key {key}, pages {first}..{}, {}): waiting",
                first + pages,
                if created { "created" } else { "existing" }
            );
            std::io::stdout().flush()?;
            let t0 = Instant::now();
            while (0..rx.len()).step_by(8).any(|off| rx.load64(off) != value) {
                if t0.elapsed() > Duration::from_secs(timeout) {
                    bail!("region {id} did not fill with {value} within {timeout} s");
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            println!("all {} words read {value} after {:.1} ms", rx.len() / 8, t0.elapsed().as_secs_f64() * 1e3);
            Ok(())
        }
        Cmd::ClearErrors => {
            let a = Adapter::open()?;
            a.set_reg(reg::ERR_STATUS, err::ALL);
            println!("error status now {:#x}", a.reg(reg::ERR_STATUS));
            Ok(())
        }
        Cmd::Fill { page, seed } => {
            let a = Adapter::open()?;
            tx_page(&a, page)?;
            a.store(page * PAGE_SIZE, &pattern(seed, page, PAGE_SIZE as usize));
            Ok(())
        }
        Cmd::Pattern { page, seed } => {
            std::io::stdout().write_all(&pattern(seed, page, PAGE_SIZE as usize))?;
            Ok(())
        }
        Cmd::Poke { page, offset, value } => {
            if offset % 8 != 0 || offset >= PAGE_SIZE {
                bail!("--offset must be a multiple of 8 below {PAGE_SIZE}");
            }
            let a = Adapter::open()?;
            tx_page(&a, page)?;
            a.store64(page * PAGE_SIZE + offset, value);
            Ok(())
        }
        Cmd::Wait { page, offset, value, timeout, buffer } => {
            if offset % 8 != 0 || offset >= PAGE_SIZE {
                bail!("--offset must be a multiple of 8 below {PAGE_SIZE}");
            }
            let buf = RxBuffer::open_ro(&buffer)
                .with_context(|| format!("opening {} (is 'mctool rx' running?)", buffer.display()))?;
            let off = (page * PAGE_SIZE + offset) as usize;
            if off + 8 > buf.len() {
                bail!("page {page} is beyond the receive buffer");
            }
            let waited = wait_value(&buf, off, value, Duration::from_secs(timeout))?;
            println!("seen after {:.3} ms", waited.as_secs_f64() * 1e3);
            Ok(())
        }
        Cmd::Dump { page, buffer } => {
            let buf = RxBuffer::open_ro(&buffer)
                .with_context(|| format!("opening {} (is 'mctool rx' running?)", buffer.display()))?;
            let off = (page * PAGE_SIZE) as usize;
            if off + PAGE_SIZE as usize > buf.len() {
                bail!("page {page} is beyond the receive buffer");
            }
            std::io::stdout().write_all(&buf.read(off, PAGE_SIZE as usize))?;
            Ok(())
        }
        Cmd::BenchTx { page, stores, stride } => {
            if stride < 8 || stride % 8 != 0 || stride > PAGE_SIZE {
                bail!("--stride must be a multiple of 8 from 8 to {PAGE_SIZE}");
            }
            let a = Adapter::open()?;
            tx_page(&a, page)?;
            let base = page * PAGE_SIZE;
            let tx0 = a.reg(reg::TX_PACKETS);
            let t0 = Instant::now();
            for i in 0..stores {
                a.store64(base + (i * stride) % PAGE_SIZE, i);
            }
            // A register read completes after every posted store before it.
            let packets = a.reg(reg::TX_PACKETS).wrapping_sub(tx0);
            let s = t0.elapsed().as_secs_f64();
            println!(
                "stores={stores} seconds={s:.3} stores_per_sec={:.0} bytes_per_sec={:.0} packets={packets} packets_per_sec={:.0}",
                stores as f64 / s,
                stores as f64 * 8.0 / s,
                packets as f64 / s
            );
            Ok(())
        }
        Cmd::Pingpong { role, via, rounds, warmup, ping_page, pong_page, peer, port, samples, timeout } => {
            pingpong(PingpongArgs { role, via, rounds, warmup, ping_page, pong_page, peer, port, samples, timeout })
        }
        Cmd::OrderTest { role, sizes, rounds, page, timeout } => order_test(&role, &sizes, &rounds, page, timeout),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_plan_lays_sizes_out_two_pages_apart() {
        let plan = order_plan("64, 8192", "10", 64).unwrap();
        assert_eq!(plan.len(), 2);
        assert_eq!((plan[0].size, plan[0].rounds, plan[0].page, plan[0].flag()), (64, 10, 64, 64 * PAGE_SIZE + 64));
        // An 8 KiB block's flag is the first word of the next page.
        assert_eq!((plan[1].page, plan[1].flag()), (66, 67 * PAGE_SIZE));
        let plan = order_plan("8,16", "5,7", 0).unwrap();
        assert_eq!((plan[0].rounds, plan[1].rounds), (5, 7));
    }

    #[test]
    fn order_plan_refuses_bad_input() {
        let err = |sizes: &str, rounds: &str| order_plan(sizes, rounds, 0).err().unwrap().to_string();
        assert!(err("", "10").contains("--sizes is empty"));
        assert!(err("12", "10").contains("multiple of 8"));
        assert!(err("0", "10").contains("multiple of 8"));
        assert!(err("16384", "10").contains("multiple of 8 from 8 to 8192"));
        assert!(err("64,x", "10").contains("'x' is not a number"));
        assert!(err("64,128", "1,2,3").contains("3 counts for 2 sizes"));
        assert!(err("64", "1").contains("too few"));
        assert!(order_test("reader", "64", "10", 0, 1).unwrap_err().to_string().contains("writer or checker"));
    }
}
