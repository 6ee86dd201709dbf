//! `ivshmem-floor`: the memory-copy floor under guest-to-guest bulk data
//! through shared memory. A transport over QEMU's `ivshmem-plain` device
//! (one file mapped by every guest, BAR 2) moves a message by a copy into
//! the shared memory in the sender and a copy out of it in the receiver.
//! This times both copies for each size, in one guest and with nothing
//! else between them (no flag, no polling, no other guest), so no
//! transport through that memory can be faster. Messages larger than the
//! BAR go through it in pieces of the BAR's size. Every copy out is checked
//! once against what went in.
//!
//! Threads: the calling one only.

use std::io::Write;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use testkit::pattern;

/// Prints the copy-in plus copy-out bandwidth through ivshmem for each
/// size, moving about `volume` bytes per size (at least 3 rounds).
pub fn floor(sizes: &[usize], volume: usize) -> Result<()> {
    let shm = guest_driver::ivshmem::Ivshmem::open()
        .context("ivshmem (a cluster with `[guest] ivshmem = true`; scripts/dma-bench.sh boots one)")?;
    let bar = shm.mem.len();
    println!("ivshmem memory-copy floor: a copy into the shared memory and one out of it ({}, {bar} bytes)", shm.bdf);
    for &size in sizes {
        if size == 0 {
            bail!("a size of 0 bytes");
        }
        let src = pattern(size as u64, 0, size);
        let mut dst = vec![0u8; size];
        let through = |dst: &mut [u8]| -> Result<()> {
            for (i, piece) in src.chunks(bar).enumerate() {
                shm.mem.write(0, piece)?;
                shm.mem.read(0, &mut dst[i * bar..i * bar + piece.len()])?;
            }
            Ok(())
        };
        through(&mut dst)?;
        if dst != src {
            bail!("{size} bytes came out of ivshmem different from what went in");
        }
        let rounds = (volume / size).max(3);
        let t0 = Instant::now();
        for _ in 0..rounds {
            through(std::hint::black_box(&mut dst))?;
        }
        let secs = t0.elapsed().as_secs_f64();
        println!(
            "ivshmem floor {size:>10} bytes: {:>9.1} us per message, {:>9.1} MB/s",
            secs / rounds as f64 * 1e6,
            (size * rounds) as f64 / secs / 1e6
        );
        std::io::stdout().flush()?;
    }
    Ok(())
}
