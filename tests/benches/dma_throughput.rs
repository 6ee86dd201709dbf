//! Host-only benchmark of transmit DMA against the store path, no QEMU:
//! adapter A sends a buffer from its memfd guest RAM to adapter B on the
//! same real hub, once by one DMA descriptor, once by posted 8-byte
//! REGION_WRITEs into the transmit window (what a guest's stores become).
//! The clock runs from the doorbell (or the first store) until the last
//! word is in B's memory. Prints MB/s per size; asserts nothing about speed.
//!
//! Run: `cargo bench -p tests --bench dma_throughput` (`MC_TEST_PORTS=link`
//! for per-guest adapters on link ports; local ports of the hub otherwise).

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::*;
use device::regs::dma::{self, DONE};
use device::regs::{pct, reg, BAR_REGS, BAR_TX, PAGE_SIZE};

const IOVA: u64 = 0x10_0000;
/// The largest transfer; also the MEMORY CHANNEL span used.
const SPAN: u64 = 4 << 20;
/// Ring at 0, source at SRC, receive buffers at RX.
const SRC: u64 = 0x1_0000;
const RX: u64 = SRC + SPAN;
const RING: u32 = 64;
/// Messages handed to the socket in one write(2), as a busy QEMU pipelines them.
const BATCH: usize = 4096;

fn setup() -> (Hub, Node, Node) {
    let hub = Hub::start();
    let ram = RX + SPAN;
    let mut a = Node::start_aspace(&hub, "a", 8 << 20, IOVA, 0, ram);
    let mut b = Node::start_aspace(&hub, "b", 8 << 20, IOVA, 0, ram);
    for p in 0..SPAN / PAGE_SIZE {
        a.vfio.set_pct(p, pct::TX, 0);
        b.vfio.set_pct(p, pct::RX, IOVA + RX + p * PAGE_SIZE);
    }
    a.vfio.set_reg(reg::DMA_RING_LO, IOVA as u32);
    a.vfio.set_reg(reg::DMA_RING_HI, 0);
    a.vfio.set_reg(reg::DMA_RING_SIZE, RING);
    let src: Vec<u8> = (0..SPAN).map(|i| (i % 251) as u8).collect();
    a.ram.write(SRC, &src);
    (hub, a, b)
}

/// Waits until B holds `marker` in the last 8 bytes of `[0, len)`.
fn wait_landed(b: &Node, len: u64, marker: u64, t0: Instant) {
    while b.ram.read(RX + len - 8, 8) != marker.to_le_bytes() {
        std::hint::spin_loop();
        assert!(t0.elapsed() < Duration::from_secs(60), "transfer never arrived");
    }
}

/// One DMA of `len` bytes; returns seconds from the doorbell to B's last word.
fn dma_once(a: &mut Node, b: &Node, idx: u32, len: u64) -> f64 {
    let marker = 0xD0A0_0000_0000_0000 | idx as u64;
    a.ram.write(SRC + len - 8, &marker.to_le_bytes());
    let at = (idx % RING) as u64 * dma::DESC_SIZE;
    let mut d = Vec::with_capacity(32);
    d.extend_from_slice(&(IOVA + SRC).to_le_bytes());
    d.extend_from_slice(&0u64.to_le_bytes());
    d.extend_from_slice(&(len as u32).to_le_bytes());
    d.extend_from_slice(&[0; 12]);
    a.ram.write(at, &d);
    let t0 = Instant::now();
    a.vfio.region_write(BAR_REGS, reg::DMA_TAIL, &(idx + 1).to_le_bytes(), true);
    wait_landed(b, len, marker, t0);
    let secs = t0.elapsed().as_secs_f64();
    let st = u32::from_le_bytes(a.ram.read(at + dma::STATUS, 4).try_into().unwrap());
    while st & DONE == 0 && u32::from_le_bytes(a.ram.read(at + dma::STATUS, 4).try_into().unwrap()) & DONE == 0 {
        std::hint::spin_loop();
    }
    secs
}

/// `len` bytes as posted 8-byte stores; seconds until B's last word.
fn stores_once(a: &mut Node, b: &Node, round: u64, len: u64) -> f64 {
    let marker = 0x5707_0000_0000_0000 | round;
    let t0 = Instant::now();
    let n = len / 8;
    let mut i = 0;
    while i < n {
        let end = (i + BATCH as u64).min(n);
        let writes: Vec<(u32, u64, Vec<u8>)> =
            (i..end).map(|k| (BAR_TX, k * 8, if k == n - 1 { marker } else { k }.to_le_bytes().to_vec())).collect();
        a.vfio.region_writes_posted_batch(&writes);
        i = end;
    }
    wait_landed(b, len, marker, t0);
    t0.elapsed().as_secs_f64()
}

fn main() {
    let (_hub, mut a, b) = setup();
    println!("A --transmit DMA or posted 8-byte stores--> hub --> B --> memfd RAM ({:?} ports)", ports());
    println!("{:>9} {:>12} {:>12} {:>12}", "size", "DMA MB/s", "DMA us/xfer", "stores MB/s");
    let mut idx = 0u32;
    let mut round = 0u64;
    // Warm-up.
    for _ in 0..4 {
        dma_once(&mut a, &b, idx, SPAN);
        idx += 1;
    }
    let mut size = 4u64 << 10;
    while size <= SPAN {
        // About 64 MiB (at least 8 transfers) per size for DMA, 4 MiB for stores.
        let reps = ((64 << 20) / size).clamp(8, 2000);
        let mut secs = 0.0;
        for _ in 0..reps {
            secs += dma_once(&mut a, &b, idx, size);
            idx += 1;
        }
        let dma_mbs = (reps * size) as f64 / secs / 1e6;
        let sreps = ((4 << 20) / size).clamp(1, 64);
        let mut ssecs = 0.0;
        for _ in 0..sreps {
            round += 1;
            ssecs += stores_once(&mut a, &b, round, size);
        }
        let st_mbs = (sreps * size) as f64 / ssecs / 1e6;
        println!("{:>8}K {:>12.0} {:>12.1} {:>12.1}", size >> 10, dma_mbs, secs / reps as f64 * 1e6, st_mbs);
        size *= 4;
    }
    assert_eq!(a.vfio.reg(reg::ERR_COUNT), 0, "errors during the benchmark");
}
