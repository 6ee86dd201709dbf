//! Host-only benchmark of the transmit → hub → receive path, no QEMU:
//! a fake QEMU (the test harness's vfio-user client) pipelines posted 8-byte
//! region writes into adapter A's transmit window; adapter B, on the same
//! real hub, DMAs them into memfd guest RAM. Prints figures; asserts nothing
//! about speed (these machines are noisy).
//!
//! Run: `cargo bench -p tests --bench adapter_throughput` (`MC_TEST_PORTS=link`
//! for per-guest adapters on link ports; local ports of the hub otherwise)
//! (`MC_BENCH_WRITES=N` changes the number of writes per run).
//!
//! The original MEMORY CHANNEL moved 64 MB/s in 32-byte packets: about two
//! million packets a second.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::*;
use device::regs::{pct, reg, BAR_TX, PAGE_SIZE};

const IOVA: u64 = 0x10_0000;
const PAGES: u64 = 64;
const RAM: u64 = PAGES * PAGE_SIZE;
/// Messages handed to the socket in one write(2), as a busy QEMU pipelines them.
const BATCH: usize = 4096;

fn setup() -> (Hub, Node, Node) {
    let hub = Hub::start();
    let mut a = Node::start(&hub, "a", IOVA, 0, RAM);
    let mut b = Node::start(&hub, "b", IOVA, 0, RAM);
    for p in 0..PAGES {
        a.vfio.set_pct(p, pct::TX, 0);
        b.vfio.set_pct(p, pct::RX, IOVA + p * PAGE_SIZE);
    }
    (hub, a, b)
}

/// Sends `n` posted 8-byte writes at addresses `addr(i)` with value i+1 and
/// waits until the last one is in B's memory. Returns (seconds, packets sent).
fn run(a: &mut Node, b: &Node, n: u64, addr: impl Fn(u64) -> u64) -> (f64, u64) {
    let tx0 = a.vfio.reg(reg::TX_PACKETS) as u64;
    let t0 = Instant::now();
    let mut i = 0;
    while i < n {
        let end = (i + BATCH as u64).min(n);
        let writes: Vec<(u32, u64, Vec<u8>)> =
            (i..end).map(|k| (BAR_TX, addr(k), (k + 1).to_le_bytes().to_vec())).collect();
        a.vfio.region_writes_posted_batch(&writes);
        i = end;
    }
    let last = addr(n - 1);
    let want = n.to_le_bytes();
    while b.ram.read(last, 8) != want {
        std::hint::spin_loop();
        assert!(t0.elapsed() < Duration::from_secs(120), "writes never arrived");
    }
    let secs = t0.elapsed().as_secs_f64();
    (secs, a.vfio.reg(reg::TX_PACKETS) as u64 - tx0)
}

fn report(what: &str, n: u64, secs: f64, packets: u64) {
    println!(
        "{what:<44} {:>10.0} writes/s {:>8.1} MB/s {:>10.0} packets/s  ({} packets, {:.0} B avg)",
        n as f64 / secs,
        n as f64 * 8.0 / secs / 1e6,
        packets as f64 / secs,
        packets,
        n as f64 * 8.0 / packets.max(1) as f64
    );
}

fn main() {
    let n: u64 = std::env::var("MC_BENCH_WRITES").ok().and_then(|v| v.parse().ok()).unwrap_or(400_000);
    let (_hub, mut a, b) = setup();
    println!("adapter A --posted 8-byte REGION_WRITEs--> hub --> adapter B --> memfd RAM ({n} writes per run)");
    println!("reference: original MEMORY CHANNEL 64 MB/s in 32-byte packets = 2,000,000 packets/s");

    // Warm-up.
    run(&mut a, &b, 20_000, |k| (k * 8) % RAM);

    // Sequential stores: the adapter coalesces them into page-sized packets.
    let (s, p) = run(&mut a, &b, n, |k| (k * 8) % RAM);
    report("sequential (coalesced into packets)", n, s, p);

    // Every other word: nothing is contiguous, one packet per store.
    let (s, p) = run(&mut a, &b, n, |k| (k * 16) % RAM);
    report("strided (one packet per store)", n, s, p);

    // Latency: one store, then spin on B's memory until it lands.
    let mut lat = Vec::with_capacity(2000);
    for i in 0..2000u64 {
        let v = 0xABCD_0000_0000 + i;
        let addr = (i % PAGES) * PAGE_SIZE + 64;
        let t0 = Instant::now();
        a.vfio.region_write(BAR_TX, addr, &v.to_le_bytes(), true);
        while b.ram.read(addr, 8) != v.to_le_bytes() {
            std::hint::spin_loop();
        }
        lat.push(t0.elapsed());
    }
    lat.sort();
    let q = |p: f64| lat[((lat.len() - 1) as f64 * p) as usize].as_secs_f64() * 1e6;
    println!(
        "latency, one store from the socket to peer memory (2000 samples): p50 {:.1} us, p99 {:.1} us, max {:.1} us",
        q(0.5),
        q(0.99),
        q(1.0)
    );
}
