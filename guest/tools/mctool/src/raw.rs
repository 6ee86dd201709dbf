//! The raw-adapter commands: the adapter's registers, the page control
//! table, the receive buffer and the transmit window, straight through the
//! guest driver (no imcd). One process at a time can own the adapter (VFIO
//! groups are exclusive): `mctool rx` keeps it until `mctool stop`; `dump`
//! and `wait` read the receive buffer file and need no device.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use guest_driver::guest_mem::{Access, Mapping, ReadOnly, ReadWrite};
use guest_driver::{rx_buffer, Adapter, Interrupt, RX_IOVA_BASE};
use regs::{err, int, pct, reg, ACK_VALID, NOTIFY_DEPTH, NOTIFY_EMPTY, PAGE_SIZE};
use testkit::pattern;

use crate::signals::{stop_on_signals, STOP};

pub(crate) const DEFAULT_BUFFER: &str = "/dev/shm/mc-rx";

/// Holds the receive setup until SIGTERM/SIGINT, then turns receive off on
/// `pages` before the buffer's DMA map goes away with the process: a PCT
/// entry must never point at memory that is no longer mapped.
pub(crate) fn hold_until_stopped(a: &Adapter, pages: &[u64]) {
    stop_on_signals();
    while !STOP.load(std::sync::atomic::Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(20));
    }
    for &p in pages {
        disable_rx(a, p);
    }
}
pub(crate) const PID_FILE: &str = "/run/mctool-rx.pid";

/// Longest wait for the background receiver to say its setup is done.
const RX_SETUP_WAIT: Duration = Duration::from_secs(30);

pub(crate) fn parse_pages(s: &str) -> Result<Vec<u64>> {
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

pub(crate) fn check_page(a: &Adapter, page: u64) -> Result<()> {
    if page >= a.pages() {
        bail!("page {page} is outside the {}-page address space", a.pages());
    }
    Ok(())
}

/// The adapter's state as `mctool info` shows it.
#[derive(Debug, serde::Serialize)]
pub(crate) struct Info {
    pci: String,
    id: u32,
    /// None: not joined.
    node: Option<u16>,
    ports: u32,
    link_up: bool,
    members: Vec<usize>,
    pages: u64,
    page_size: u64,
    err_status: u32,
    errors: Vec<&'static str>,
    err_count: u32,
    int_cause: u32,
    int_mask: u32,
    notify_queued: u32,
    notify_lost: u32,
    link_events: u32,
    last_seq: u32,
    tx_packets: u32,
    rx_packets: u32,
    rx_dropped: u32,
    /// The transmit DMA engine is there (CAPS.TX_DMA).
    tx_dma: bool,
    /// Descriptors the engine retired, bytes it sent (low 32 bits).
    dma_descs: u32,
    dma_bytes: u32,
}

impl Info {
    /// From the registers as `reg` reads them, of the adapter at `pci`.
    fn read(pci: String, reg: impl Fn(u64) -> u32) -> Info {
        let a = Regs(reg);
        let es = a.reg(reg::ERR_STATUS);
        Info {
            pci,
            id: a.reg(reg::ID),
            node: regs::node_id(a.reg(reg::NODE)),
            ports: a.reg(reg::NODE) >> 16,
            link_up: a.reg(reg::LINK) & 1 != 0,
            members: regs::members(a.reg(reg::MEMBERS_LO), a.reg(reg::MEMBERS_HI)).collect(),
            pages: a.reg(reg::ASPACE_PAGES) as u64,
            page_size: PAGE_SIZE,
            err_status: es,
            errors: err::NAMES.iter().filter(|(b, _)| es & b != 0).map(|(_, n)| *n).collect(),
            err_count: a.reg(reg::ERR_COUNT),
            int_cause: a.reg(reg::INT_CAUSE),
            int_mask: a.reg(reg::INT_MASK),
            notify_queued: a.reg(reg::NOTIFY_COUNT),
            notify_lost: a.reg(reg::NOTIFY_LOST),
            link_events: a.reg(reg::LINK_EVENTS),
            last_seq: a.reg(reg::LAST_SEQ),
            tx_packets: a.reg(reg::TX_PACKETS),
            rx_packets: a.reg(reg::RX_PACKETS),
            rx_dropped: a.reg(reg::RX_DROPPED),
            tx_dma: a.reg(reg::CAPS) & regs::caps::TX_DMA != 0,
            dma_descs: a.reg(reg::DMA_DESCS),
            dma_bytes: a.reg(reg::DMA_BYTES),
        }
    }
}

/// Register reads, by whichever way the adapter is reachable.
struct Regs<F: Fn(u64) -> u32>(F);

impl<F: Fn(u64) -> u32> Regs<F> {
    fn reg(&self, off: u64) -> u32 {
        (self.0)(off)
    }
}

/// `mctool info`: the adapter's identity, node, link, members and counters,
/// as a table or (`json`) one JSON object. Read from the device, or
/// through imcd's read-only mapping of the registers when imcd owns it.
pub(crate) fn info(json: bool) -> Result<()> {
    let i = match Adapter::open() {
        Ok(a) => Info::read(a.dev.bdf.clone(), |off| a.reg(off)),
        Err(direct) => {
            let imc = imc_client::Imc::connect().map_err(|e| anyhow::anyhow!("{direct:#}; and through imcd: {e}"))?;
            let r = imc.regs().map_err(|e| anyhow::anyhow!("{direct:#}; and through imcd: {e}"))?;
            Info::read("(through imcd)".into(), |off| r.view().raw(off))
        }
    };
    if json {
        println!("{}", serde_json::to_string(&i)?);
        return Ok(());
    }
    println!("pci        {}", i.pci);
    println!("id         {:#010x}", i.id);
    match i.node {
        Some(n) => println!("node       {n} of {} ports", i.ports),
        None => println!("node       none (not joined)"),
    }
    println!("link       {}", if i.link_up { "up" } else { "down" });
    let list: Vec<String> = i.members.iter().map(|m| m.to_string()).collect();
    println!("members    {}", list.join(","));
    println!("pages      {} x {} bytes", i.pages, i.page_size);
    println!("errors     {:#x} [{}] count {}", i.err_status, i.errors.join(" "), i.err_count);
    println!(
        "interrupts cause {:#x} mask {:#x} notify-queued {} notify-lost {}",
        i.int_cause, i.int_mask, i.notify_queued, i.notify_lost
    );
    println!("link-events {} last-seq {}", i.link_events, i.last_seq);
    println!("packets    tx {} rx {} rx-dropped {}", i.tx_packets, i.rx_packets, i.rx_dropped);
    if i.tx_dma {
        println!("dma        descriptors {} bytes {}", i.dma_descs, i.dma_bytes);
    }
    Ok(())
}

pub(crate) fn setup_rx(pages: &[u64], buffer: &Path) -> Result<(Adapter, Mapping<ReadWrite>)> {
    let a = Adapter::open()?;
    for &p in pages {
        check_page(&a, p)?;
    }
    let n = pages.iter().max().unwrap() + 1;
    let buf = rx_buffer(buffer, n).with_context(|| format!("creating receive buffer {}", buffer.display()))?;
    a.dev.map_dma(&buf, RX_IOVA_BASE)?;
    for &p in pages {
        let (bits, _) = a.page(p);
        a.set_page(p, bits | pct::RX, RX_IOVA_BASE + p * PAGE_SIZE);
    }
    Ok((a, buf))
}

pub(crate) fn rx(pages: &str, buffer: &Path, foreground: bool) -> Result<()> {
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
        let deadline = Instant::now() + RX_SETUP_WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let mut pfd = libc::pollfd { fd: fds[0], events: libc::POLLIN, revents: 0 };
            // SAFETY: poll(2) on one pollfd on our stack.
            let ready = unsafe { libc::poll(&mut pfd, 1, left.as_millis() as libc::c_int) };
            if ready == 0 {
                // SAFETY: kill(2), no memory; the child is ours.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                bail!("the receiver (pid {pid}) did not finish its setup within {RX_SETUP_WAIT:?}");
            }
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

pub(crate) fn stop() -> Result<()> {
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
    let alive = || unsafe { libc::kill(pid, 0) } == 0;
    while alive() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    if alive() {
        bail!("the background receiver (pid {pid}) did not exit within 5 s of SIGTERM; it still holds the adapter");
    }
    let _ = std::fs::remove_file(PID_FILE);
    Ok(())
}

pub(crate) fn disable_rx(a: &Adapter, page: u64) {
    let (bits, iova) = a.page(page);
    a.set_page(page, bits & !pct::RX, iova);
}

pub(crate) fn tx_page(a: &Adapter, page: u64) -> Result<()> {
    check_page(a, page)?;
    let (bits, iova) = a.page(page);
    a.set_page(page, bits | pct::TX, iova);
    Ok(())
}

/// The word at `off` of a receive buffer; offsets are checked against the
/// buffer before polling starts, so a failure here is a bug.
pub(crate) fn load64<A: Access>(buf: &Mapping<A>, off: usize) -> u64 {
    buf.load::<u64>(off).unwrap_or_else(|e| panic!("receive buffer: {e}"))
}

pub(crate) fn wait_value<A: Access>(buf: &Mapping<A>, off: usize, value: u64, timeout: Duration) -> Result<Duration> {
    let t0 = Instant::now();
    while buf.load::<u64>(off)? != value {
        if t0.elapsed() > timeout {
            bail!("timed out after {timeout:?}: offset {off:#x} holds {:#x}, not {value:#x}", load64(buf, off));
        }
        std::hint::spin_loop();
    }
    Ok(t0.elapsed())
}

pub(crate) fn notify_wait(page: u64, timeout: u64) -> Result<()> {
    let buffer = PathBuf::from(format!("/dev/shm/mc-notify-{page}"));
    let (a, _buf) = setup_rx(&[page], &buffer)?;
    let irq = Interrupt::msix(&a.dev)?;
    let (bits, iova) = a.page(page);
    a.set_page(page, bits | pct::INT, iova);
    // Start clean: drop old notifications, then enable the cause.
    a.set_reg(reg::INT_CAUSE, int::ALL);
    // The FIFO holds NOTIFY_DEPTH entries; one that never empties is a
    // writer notifying faster than we read, or a device that is gone.
    let mut drained = 0;
    while a.reg(reg::NOTIFY_FIFO) != NOTIFY_EMPTY {
        drained += 1;
        if drained > 4 * NOTIFY_DEPTH {
            let (bits, iova) = a.page(page);
            a.set_page(page, bits & !(pct::INT | pct::RX), iova);
            bail!("the notification FIFO did not empty after {drained} reads (a flood of notifications, or no device)");
        }
    }
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
        // At most one FIFO's worth per interrupt (the rest raises another).
        let mut pages = Vec::new();
        while pages.len() < NOTIFY_DEPTH {
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

pub(crate) fn ack(page: u64, timeout: u64) -> Result<()> {
    let buffer = PathBuf::from(format!("/dev/shm/mc-ack-{page}"));
    let (a, buf) = setup_rx(&[page], &buffer)?;
    let me = a.node().context("not joined to a hub")?;
    let (bits, iova) = a.page(page);
    a.set_page(page, bits | pct::TX | pct::ACK, iova);
    let others: Vec<u64> = regs::members(a.reg(reg::MEMBERS_LO), a.reg(reg::MEMBERS_HI))
        .map(|n| n as u64)
        .filter(|&n| n != me as u64)
        .collect();
    a.store64(page * PAGE_SIZE, 1);
    let off = (page * PAGE_SIZE) as usize;
    let t0 = Instant::now();
    let answered = |n: u64| buf.load::<u8>(off + n as usize).unwrap_or(0) & ACK_VALID != 0;
    while !others.iter().all(|&n| answered(n)) && t0.elapsed() < Duration::from_secs(timeout) {
        std::thread::sleep(Duration::from_micros(100));
    }
    let mut missing = 0;
    for &n in &others {
        let b = buf.load::<u8>(off + n as usize)?;
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

pub(crate) fn lock_test(nodes: usize, rounds: u64, page: u64, timeout: u64) -> Result<()> {
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
    let ready = |i: usize| load64(&buf, word(barrier_page, i)) == 1;
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
        let c = buf.load::<u64>(counter_addr as usize)?;
        a.store64(counter_addr, c + 1);
        let ts = Instant::now();
        while load64(&buf, counter_addr as usize) != c + 1 {
            if ts.elapsed() > limit {
                lock.release();
                for p in [lock_page, counter_page, barrier_page] {
                    disable_rx(&a, p);
                }
                bail!("our increment of the counter ({c} -> {}) did not come back within {limit:?}: link down?", c + 1);
            }
            std::hint::spin_loop();
        }
        lock.release();
    }
    let total = rounds * nodes as u64;
    while load64(&buf, counter_addr as usize) < total && t0.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(1));
    }
    let seen = buf.load::<u64>(counter_addr as usize)?;
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

/// Clears every error status bit (ERR_STATUS is write-1-to-clear).
pub(crate) fn clear_errors() -> Result<()> {
    let a = Adapter::open()?;
    a.set_reg(reg::ERR_STATUS, err::ALL);
    println!("error status now {:#x}", a.reg(reg::ERR_STATUS));
    Ok(())
}

/// Stores the test pattern into `page` (8-byte stores).
pub(crate) fn fill(page: u64, seed: u64) -> Result<()> {
    let a = Adapter::open()?;
    tx_page(&a, page)?;
    a.store(page * PAGE_SIZE, &pattern(seed, page, PAGE_SIZE as usize))?;
    Ok(())
}

fn check_offset(offset: u64) -> Result<()> {
    if offset % 8 != 0 || offset >= PAGE_SIZE {
        bail!("--offset must be a multiple of 8 below {PAGE_SIZE}");
    }
    Ok(())
}

/// One 8-byte store of `value` at `page` + `offset`.
pub(crate) fn poke(page: u64, offset: u64, value: u64) -> Result<()> {
    check_offset(offset)?;
    let a = Adapter::open()?;
    tx_page(&a, page)?;
    a.store64(page * PAGE_SIZE + offset, value);
    Ok(())
}

fn open_buffer(buffer: &Path) -> Result<Mapping<ReadOnly>> {
    Mapping::open(buffer).with_context(|| format!("opening {} (is 'mctool rx' running?)", buffer.display()))
}

/// Waits until the receive buffer holds `value` at `page` + `offset`.
pub(crate) fn wait(page: u64, offset: u64, value: u64, timeout: u64, buffer: &Path) -> Result<()> {
    check_offset(offset)?;
    let buf = open_buffer(buffer)?;
    let off = (page * PAGE_SIZE + offset) as usize;
    if off + 8 > buf.len() {
        bail!("page {page} is beyond the receive buffer");
    }
    let waited = wait_value(&buf, off, value, Duration::from_secs(timeout))?;
    println!("seen after {:.3} ms", waited.as_secs_f64() * 1e3);
    Ok(())
}

/// Writes one page of the receive buffer to stdout, raw.
pub(crate) fn dump(page: u64, buffer: &Path) -> Result<()> {
    let buf = open_buffer(buffer)?;
    let off = (page * PAGE_SIZE) as usize;
    if off + PAGE_SIZE as usize > buf.len() {
        bail!("page {page} is beyond the receive buffer");
    }
    std::io::stdout().write_all(&buf.read_vec(off, PAGE_SIZE as usize)?)?;
    Ok(())
}

/// 8-byte stores per second into the transmit window.
pub(crate) fn bench_tx(page: u64, stores: u64, stride: u64) -> Result<()> {
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
