//! Hub benchmark: N simulated adapters (real link clients over Unix
//! sockets, one thread each for sending and receiving) all broadcast at
//! once. Prints, per N and payload size: writes accepted per second,
//! deliveries per second, and the latency from a sender handing the write to
//! its socket to a receiver decoding it (p50, p99). Asserts nothing about
//! speed.
//!
//! Run: `cargo bench -p hub --bench hub_bench` (`MC_BENCH_NODES=2,8` to
//! pick sizes, `MC_BENCH_DELIVERIES=N` for the work per run).

use std::io::{BufWriter, Write};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Instant;

use device::link_client as client;
use hub::hub::{Hub, HubConfig};
use link::{self as link, Msg, ANY_NODE, BROADCAST};

/// Writes between flushes of a sender's socket buffer.
const FLUSH_EVERY: usize = 32;

/// `pace`: pause between a sender's writes (flushing each one), for latency at
/// light load; `None`: as fast as possible (throughput).
fn run(nodes: usize, payload: usize, per_node: usize, pace: Option<std::time::Duration>) -> (f64, f64, f64, f64) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hub.sock");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let hub = Hub::new(HubConfig { max_nodes: nodes, ..HubConfig::default() });
    rt.block_on(async {
        let l = tokio::net::UnixListener::bind(&path).unwrap();
        let h = hub.clone();
        tokio::spawn(async move { h.serve(l, std::future::pending()).await });
    });
    let base = Instant::now();
    let clients: Vec<_> =
        (0..nodes).map(|i| client::join(&path, ANY_NODE, 8192, 1024, &format!("n{i}")).unwrap()).collect();
    let start = Arc::new(Barrier::new(nodes * 2 + 1));
    let expect = (nodes - 1) * per_node;
    let mut handles = Vec::new();
    for (joined, r, w) in clients {
        let start2 = start.clone();
        // Receivers read through a buffer, as the adapter does.
        let mut r = std::io::BufReader::with_capacity(64 * 1024, r);
        handles.push(thread::spawn(move || {
            let mut buf = Vec::new();
            let mut lat = Vec::with_capacity(expect / 8 + 1);
            start2.wait();
            let mut got = 0;
            while got < expect {
                let hdr = link::read_frame(&mut r, &mut buf).unwrap();
                if let Ok(Msg::Deliver { data, .. }) = Msg::parse(&hdr, &buf) {
                    got += 1;
                    if pace.is_some() || got % 8 == 0 {
                        let sent = u64::from_le_bytes(data[..8].try_into().unwrap());
                        lat.push(base.elapsed().as_nanos() as u64 - sent);
                    }
                }
            }
            lat
        }));
        let start3 = start.clone();
        let mut w: BufWriter<_> = w;
        let me = joined.node as u64;
        thread::spawn(move || {
            let mut data = vec![0u8; payload];
            start3.wait();
            for k in 0..per_node {
                data[..8].copy_from_slice(&(base.elapsed().as_nanos() as u64).to_le_bytes());
                let f = Msg::Write { dest: BROADCAST, flags: 0, addr: me << 32 | k as u64, data: &data }.encode();
                link::write_stamped(&mut w, &f, (k + 1) as u16).unwrap();
                if let Some(p) = pace {
                    w.flush().unwrap();
                    std::thread::sleep(p);
                } else if k % FLUSH_EVERY == 0 {
                    w.flush().unwrap();
                }
            }
            w.flush().unwrap();
            // Keep the link open until the receivers are done.
            std::thread::park();
        });
    }
    start.wait();
    let t0 = Instant::now();
    let mut lat: Vec<u64> = handles.into_iter().flat_map(|h| h.join().unwrap()).collect();
    let secs = t0.elapsed().as_secs_f64();
    lat.sort_unstable();
    let q = |p: f64| lat[((lat.len() - 1) as f64 * p) as usize] as f64 / 1e3;
    let writes = (nodes * per_node) as f64 / secs;
    let deliveries = (nodes * expect) as f64 / secs;
    rt.shutdown_background();
    (writes, deliveries, q(0.5), q(0.99))
}

fn main() {
    let sizes: Vec<usize> = std::env::var("MC_BENCH_NODES")
        .ok()
        .map(|s| s.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![2, 4, 8, 16, 32, 64]);
    let target: usize = std::env::var("MC_BENCH_DELIVERIES").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000_000);
    println!("hub: N nodes all broadcasting (no loopback) over Unix sockets");
    println!("saturated: senders write as fast as they can ({target} deliveries per run);");
    println!("paced: about 100k deliveries/s in total, latency = sender's socket to receiver's decode");
    println!(
        "{:>5} {:>7} | {:>12} {:>14} | {:>13} {:>13}",
        "nodes", "payload", "writes/s", "deliveries/s", "paced p50 us", "paced p99 us"
    );
    for &n in &sizes {
        for payload in [8usize, 32] {
            let per_node = (target / (n * (n - 1)).max(1)).clamp(200, 200_000);
            let (w, d, _, _) = run(n, payload, per_node, None);
            let pace = std::time::Duration::from_secs_f64((n * (n - 1)) as f64 / 100_000.0);
            let paced_per_node = ((1.0 / pace.as_secs_f64()) as usize).clamp(20, 2000);
            let (_, _, p50, p99) = run(n, payload, paced_per_node, Some(pace));
            println!("{n:>5} {payload:>6}B | {w:>12.0} {d:>14.0} | {p50:>13.1} {p99:>13.1}");
        }
    }
}
