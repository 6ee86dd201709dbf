//! Transmit DMA through imcd (`imc-client`'s [`imc_client::dma`], the
//! extension calls of libimc): `imc-dma` sends a test pattern into a region
//! by DMA, `imc-dma-check` checks it on a receiver, `imc-dma-bench`
//! compares DMA with stores through the transmit window between two nodes,
//! `imc-dma-land` receives a region into a process's own DMA area.
//!
//! Regions: the data is at the start of region KEY; the last page holds the
//! flag word (`--flag`: stored through the transmit window right after the
//! doorbell). The bench's acknowledgements travel in region KEY + 1.

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use imc_client::dma::DmaHandle;
use imc_client::Imc;
use regs::PAGE_SIZE;
use testkit::pattern;

use crate::imc::imc_status;
use crate::raw::load64;

/// Bytes of region for `size` bytes of data at `offset` plus the flag page.
pub(crate) fn region_size(offset: u64, size: u64) -> u64 {
    (offset + size).div_ceil(PAGE_SIZE) * PAGE_SIZE + PAGE_SIZE
}

/// What `imc-dma` does.
pub(crate) struct SendArgs {
    pub key: u64,
    pub size: u64,
    pub offset: u64,
    pub region_size: Option<u64>,
    pub seed: u64,
    pub flag: Option<u64>,
    pub no_attach: bool,
    pub attach_only: bool,
    pub hold: u64,
}

/// `imc-dma`: allocates region KEY, attaches it for transmit (unless
/// `--no-attach`), fills the DMA buffer with the pattern of SEED and sends
/// SIZE bytes of it to OFFSET by DMA; with `--flag V`, stores V into the
/// flag word right after the doorbell, then waits for the transfer.
pub(crate) fn send(a: SendArgs) -> Result<()> {
    let imc = Imc::connect()?;
    let rsize = a.region_size.unwrap_or_else(|| region_size(a.offset, a.size));
    let (id, first, pages, _) = imc.asalloc(a.key, rsize, 0o666, false).map_err(imc_status)?;
    let tx = if a.no_attach { None } else { Some(imc.asattach_tx(id, false).map_err(imc_status)?) };
    if a.attach_only {
        println!("IMC_SUCCESS region {id} (key {}, pages {first}..{}) attached for transmit", a.key, first + pages);
        return hold(a.hold);
    }
    let port = imc.dma_open(a.size.max(PAGE_SIZE)).map_err(imc_status)?;
    let data = pattern(a.seed, 0, a.size as usize);
    port.buffer().write(0, &data)?;
    println!(
        "region {id} (key {}, pages {first}..{}): DMA of {} bytes to offset {}",
        a.key,
        first + pages,
        a.size,
        a.offset
    );
    std::io::stdout().flush()?;
    let target = imc.dma_target(id).map_err(imc_status)?;
    let t0 = Instant::now();
    let h = port.start(&target, a.offset, 0, a.size).context("imc_dma_start")?;
    if let (Some(v), Some(tx)) = (a.flag, &tx) {
        tx.store_release::<u64>((pages - 1) as usize * PAGE_SIZE as usize, v)?;
    }
    let bytes = port.wait(&h, Duration::from_secs(120)).context("imc_dma_wait")?;
    let secs = t0.elapsed().as_secs_f64();
    println!("IMC_SUCCESS sent {bytes} bytes in {:.2} ms ({:.1} MB/s)", secs * 1e3, bytes as f64 / secs / 1e6);
    hold(a.hold)
}

/// Keeps the process (and its regions) for `secs` seconds or until SIGTERM.
fn hold(secs: u64) -> Result<()> {
    std::io::stdout().flush()?;
    crate::signals::stop_on_signals();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(secs) && !crate::signals::STOP.load(std::sync::atomic::Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// What `imc-dma-land` does.
pub(crate) struct LandArgs {
    pub key: u64,
    pub size: u64,
    pub offset: u64,
    pub area: Option<u64>,
    pub seed: u64,
    pub find_only: bool,
    pub timeout: u64,
}

/// `imc-dma-land`: region KEY lands at OFFSET of this process's DMA area;
/// waits until SIZE bytes there read the pattern of SEED.
pub(crate) fn land(a: LandArgs) -> Result<()> {
    let imc = Imc::connect()?;
    let rsize = region_size(0, a.size);
    let id = if a.find_only {
        imc.find(a.key).map_err(imc_status)?.with_context(|| format!("no region has key {}", a.key))?.0
    } else {
        imc.asalloc(a.key, rsize, 0o666, false).map_err(imc_status)?.0
    };
    let port = imc.dma_open(a.area.unwrap_or(a.offset + rsize)).map_err(imc_status)?;
    imc.dma_land(id, a.offset).map_err(imc_status)?;
    println!("region {id} (key {}) lands at byte {} of this process's DMA area: waiting", a.key, a.offset);
    std::io::stdout().flush()?;
    let want = pattern(a.seed, 0, a.size as usize);
    let mut got = vec![0u8; a.size as usize];
    let t0 = Instant::now();
    loop {
        port.buffer().read(a.offset as usize, &mut got)?;
        if got == want {
            break;
        }
        if t0.elapsed() > Duration::from_secs(a.timeout) {
            let i = got.iter().zip(&want).position(|(g, w)| g != w).unwrap_or(0);
            bail!(
                "after {} s, byte {i} of the area's {} bytes at {} is still not the pattern",
                a.timeout,
                a.size,
                a.offset
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    println!(
        "IMC_SUCCESS all {} bytes landed in the DMA area after {:.1} ms",
        a.size,
        t0.elapsed().as_secs_f64() * 1e3
    );
    Ok(())
}

/// `imc-dma-check`: attaches region KEY for receive and waits until SIZE
/// bytes at OFFSET read the pattern of SEED. With `--flag V`, waits for the
/// flag word to read V instead and then checks the data once: seeing the
/// flag must mean seeing the data. With `--expect-zero`, waits SECONDS and
/// checks that nothing was written.
pub(crate) fn check(
    key: u64,
    size: u64,
    offset: u64,
    seed: u64,
    flag: Option<u64>,
    expect_zero: bool,
    timeout: u64,
) -> Result<()> {
    let imc = Imc::connect()?;
    let (id, first, pages, _) = imc.asalloc(key, region_size(offset, size), 0o666, false).map_err(imc_status)?;
    let rx = imc.asattach_rx(id).map_err(imc_status)?;
    println!("region {id} (key {key}, pages {first}..{}): waiting", first + pages);
    std::io::stdout().flush()?;
    let want = if expect_zero { vec![0u8; size as usize] } else { pattern(seed, 0, size as usize) };
    let flag_off = (pages - 1) as usize * PAGE_SIZE as usize;
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(timeout);
    let mut got = vec![0u8; size as usize];
    if expect_zero {
        std::thread::sleep(Duration::from_secs(timeout));
        rx.read(offset as usize, &mut got)?;
        if let Some(i) = got.iter().position(|&b| b != 0) {
            bail!("byte {} of region {id} was written ({:#x}): the DMA reached it", offset as usize + i, got[i]);
        }
        println!("IMC_SUCCESS nothing written to the {size} bytes after {timeout} s");
        return Ok(());
    }
    if let Some(v) = flag {
        while load64(&rx, flag_off) != v {
            if Instant::now() > deadline {
                bail!("the flag did not read {v} within {timeout} s");
            }
            std::hint::spin_loop();
        }
        rx.read(offset as usize, &mut got)?;
        if let Some(i) = got.iter().zip(&want).position(|(g, w)| g != w) {
            bail!("flag {v} seen, but byte {i} of the DMA's data is not there yet (ordering broken)");
        }
        println!(
            "IMC_SUCCESS flag {v} seen after {:.1} ms and all {size} bytes with it",
            t0.elapsed().as_secs_f64() * 1e3
        );
        return Ok(());
    }
    loop {
        rx.read(offset as usize, &mut got)?;
        if got == want {
            break;
        }
        if Instant::now() > deadline {
            let i = got.iter().zip(&want).position(|(g, w)| g != w).unwrap_or(0);
            bail!("region {id}: byte {i} of {size} differs after {timeout} s");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    println!("IMC_SUCCESS all {size} bytes match after {:.1} ms", t0.elapsed().as_secs_f64() * 1e3);
    Ok(())
}

/// Role in `imc-dma-bench`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Role {
    /// Sends and times.
    Send,
    /// Acknowledges every flag.
    Recv,
}

/// How the bench's sender moves the data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Via {
    /// Transmit DMA.
    Dma,
    /// Stores through the transmit window.
    Store,
    /// Both, one after the other for each size.
    Both,
}

/// `imc-dma-bench`: the sender sends each size repeatedly (for about
/// `secs` seconds, at least twice), then a flag (sequence number) the
/// receiver acknowledges in region KEY + 1: bytes / time until the
/// acknowledgement. The flag is stored after the last doorbell, so it
/// arrives after all the data.
pub(crate) fn bench(role: Role, via: Via, key: u64, sizes: &[u64], secs: f64, timeout: u64) -> Result<()> {
    let imc = Imc::connect()?;
    let max = sizes.iter().copied().max().unwrap_or(PAGE_SIZE);
    let (data_id, _, pages, _) = imc.asalloc(key, region_size(0, max), 0o666, false).map_err(imc_status)?;
    let (ack_id, ..) = imc.asalloc(key + 1, PAGE_SIZE, 0o666, false).map_err(imc_status)?;
    let flag_off = (pages - 1) as usize * PAGE_SIZE as usize;
    let limit = Duration::from_secs(timeout);
    match role {
        Role::Recv => {
            let rx = imc.asattach_rx(data_id).map_err(imc_status)?;
            let ack = imc.asattach_tx(ack_id, false).map_err(imc_status)?;
            println!("receiver ready");
            std::io::stdout().flush()?;
            let mut last = 0;
            let mut t = Instant::now();
            loop {
                let f = load64(&rx, flag_off);
                if f != last {
                    ack.store_release::<u64>(0, f)?;
                    if f == u64::MAX {
                        println!("IMC_SUCCESS receiver done");
                        return Ok(());
                    }
                    last = f;
                    t = Instant::now();
                }
                if t.elapsed() > limit {
                    bail!("no flag for {timeout} s");
                }
                std::hint::spin_loop();
            }
        }
        Role::Send => {
            let tx = imc.asattach_tx(data_id, false).map_err(imc_status)?;
            let ack = imc.asattach_rx(ack_id).map_err(imc_status)?;
            let port = imc.dma_open(max).map_err(imc_status)?;
            let target = imc.dma_target(data_id).map_err(imc_status)?;
            let src = pattern(1, 0, max as usize);
            port.buffer().write(0, &src)?;
            // What validating every descriptor in imcd would add: one call.
            let n = 200;
            let t0 = Instant::now();
            for _ in 0..n {
                imc.find(key).map_err(imc_status)?;
            }
            let call_us = t0.elapsed().as_secs_f64() * 1e6 / n as f64;
            println!("imcd round trip (one call): {call_us:.1} us");
            let mut seq = 0u64;
            let mut round = |size: u64, dma: bool| -> Result<(u64, f64)> {
                let t0 = Instant::now();
                let mut reps = 0u64;
                let mut handles: Vec<DmaHandle> = Vec::new();
                loop {
                    if dma {
                        handles.push(port.start(&target, 0, 0, size)?);
                    } else {
                        tx.write(0, &src[..size as usize])?;
                    }
                    reps += 1;
                    if reps >= 2 && t0.elapsed().as_secs_f64() >= secs {
                        break;
                    }
                    if handles.len() >= 256 {
                        for h in handles.drain(..) {
                            port.wait(&h, limit)?;
                        }
                    }
                }
                seq += 1;
                tx.store_release::<u64>(flag_off, seq)?;
                let tw = Instant::now();
                while load64(&ack, 0) != seq {
                    if tw.elapsed() > limit {
                        bail!("no acknowledgement of flag {seq} within {timeout} s");
                    }
                    std::hint::spin_loop();
                }
                let elapsed = t0.elapsed().as_secs_f64();
                for h in handles {
                    port.wait(&h, limit)?;
                }
                Ok((reps, elapsed))
            };
            println!("{:>9} {:>6} {:>10} {:>10}", "bytes", "via", "transfers", "MB/s");
            for &size in sizes {
                let vias: &[bool] = match via {
                    Via::Dma => &[true],
                    Via::Store => &[false],
                    Via::Both => &[true, false],
                };
                for &dma in vias {
                    let (reps, elapsed) = round(size, dma)?;
                    let mbs = (reps * size) as f64 / elapsed / 1e6;
                    let name = if dma { "dma" } else { "store" };
                    println!("{size:>9} {name:>6} {reps:>10} {mbs:>10.2}");
                    std::io::stdout().flush()?;
                }
            }
            tx.store_release::<u64>(flag_off, u64::MAX)?;
            println!("IMC_SUCCESS bench done");
            Ok(())
        }
    }
}
