//! Hub benchmark: how the hub scales with the number of nodes, on both
//! kinds of port, and what memory a node costs. Prints figures; asserts
//! only that every write arrived (these machines are noisy).
//!
//! **Throughput and latency.** N simulated nodes all broadcast at once (no
//! loopback), on one kind of port:
//! - `link`: real link clients over Unix sockets (`device::link_client`),
//!   a sending and a receiving thread each, where `mc-adapter` processes
//!   would be;
//! - `tcp`: the same over TCP on loopback, with the cluster secret (how
//!   adapters on other hosts reach the hub);
//! - `local`: local ports (`hub::local`), each driven by a minimal
//!   vfio-user client (the fake QEMU below: VERSION, DMA_MAP of memfd guest
//!   RAM, region writes) from a sending thread of its own; the hub's
//!   `vfio-node<N>` thread orders every store and copies it into the other
//!   guests' RAM.
//!
//! Per configuration: saturated writes/s and deliveries/s (every sender as
//! fast as it can; every receiver is checked to have got every other
//! node's writes); then paced, about 100k deliveries/s in total with the
//! senders' starts staggered over one interval: the latency from a
//! sender's socket to the receiver (link: the receiving client decodes the
//! frame; local: a poll of the last node's guest RAM, the last receiver of
//! every step's fan-out), and the ordering step's time at that load (the
//! hub's own histogram, `observe`: how long one write holds the order
//! lock, to a power of two).
//!
//! **Memory.** Real processes, VmRSS and RssAnon of `/proc/PID/status`:
//! `mc-hub` (a child process) before and after N link ports join, after
//! traffic through each, and with every port's queue full (of broadcast
//! frames, shared by the queues; at the smallest N up to 16, also of
//! point-to-point frames, one per queue); `mc-hub` with N local ports,
//! idle, with a fake QEMU each, and after one QEMU's 1 MiB burst of stores;
//! `mc-adapter` processes (if built: `cargo build --release -p device --bin
//! mc-adapter`), joined, with a fake QEMU, and after a burst.
//!
//! Run: `cargo bench -p hub --bench hub_bench [-- OPTIONS]`, each option
//! also an environment variable:
//! `--nodes 8,64,256` (`MC_BENCH_NODES`), `--ports link,tcp,local`
//! (`MC_BENCH_PORTS`), `--payloads 8` (`MC_BENCH_PAYLOADS`), `--deliveries
//! 4000000` per saturated run (`MC_BENCH_DELIVERIES`), `--memory on|off`
//! (`MC_BENCH_MEMORY`), `--adapters 8` (`MC_BENCH_ADAPTERS`: `mc-adapter`
//! processes measured).

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use device::link_client::{self as client, HubAddr, Stream};
use device::regs::{pct, reg, BAR_PCT, BAR_REGS, BAR_TX, PAGE_SIZE};
use device::vfio_user::{self, wire};
use hub::hub::{Control, ControlReply, HubConfig};
use hub::testing::TestHub;
use link::{self as link, Msg, ANY_NODE, BROADCAST, MAX_NODES};

/// Writes between flushes of a link sender's socket buffer.
const FLUSH_EVERY: usize = 32;
/// Posted stores a fake QEMU hands its socket in one write(2).
const STORE_BATCH: usize = 256;
/// Total deliveries per second of the paced runs.
const PACED_RATE: f64 = 100_000.0;
/// How long a paced run lasts at least (each sender writes at least twice).
const PACED_SECS: f64 = 1.0;
/// Longest wait for a run's writes to arrive.
const RUN_TIMEOUT: Duration = Duration::from_secs(120);
/// Address space of the benchmark's local adapters (the smallest).
const LOCAL_ASPACE: u64 = 1 << 20;
/// Where the fake guests' RAM is mapped for DMA.
const IOVA: u64 = 0x10_0000;
/// Link port queue depth of the hubs measured (`--queue-depth`'s default).
const QUEUE_DEPTH: usize = 4096;
/// Frames a link port's queue keeps for membership events (`hub::port`):
/// writes wait once fewer are free.
const MEMBER_ROOM: usize = 64;
/// The cluster secret of the hubs measured (TCP links prove it).
const SECRET: &[u8] = b"hub-bench cluster secret";
/// Payload of the frames that fill the queues in the memory measurement.
const BIG: usize = link::MAX_DATA;

fn main() {
    let s = Settings::parse();
    println!(
        "hub scale benchmark: nodes {:?}, ports {:?}, payloads {:?} B, {} deliveries per saturated run",
        s.nodes,
        s.ports.iter().map(|k| k.name()).collect::<Vec<_>>(),
        s.payloads,
        s.deliveries
    );
    println!(
        "saturated: every node broadcasts (no loopback) as fast as it can; paced: about {PACED_RATE:.0} deliveries/s \
         in total, latency = sender's socket to the receiver"
    );
    let t0 = Instant::now();
    let mut results = Vec::new();
    for &n in &s.nodes {
        for &kind in &s.ports {
            for &payload in &s.payloads {
                let f = run_config(kind, n, payload, s.deliveries);
                println!(
                    "  done: {:<5} ports, {n:>4} nodes, {payload:>4} B: {:>10.0} writes/s {:>11.0} deliveries/s | \
                     paced p50 {:>7.1} us p99 {:>8.1} us ({} samples) | step p50 {} us | set-up {:.1} s, runs {:.1} s",
                    kind.name(),
                    f.writes,
                    f.deliveries,
                    f.p50,
                    f.p99,
                    f.samples,
                    bucket_us(f.step_p50),
                    f.setup_secs,
                    f.run_secs
                );
                results.push((kind, n, payload, f));
            }
        }
    }
    print_tables(&results);
    println!("throughput part: {:.0} s", t0.elapsed().as_secs_f64());
    if s.memory {
        let t1 = Instant::now();
        memory(&s);
        println!("memory part: {:.0} s", t1.elapsed().as_secs_f64());
    }
}

// ------------------------------------------------------------ settings ----

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Link,
    Tcp,
    Local,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Link => "link",
            Kind::Tcp => "tcp",
            Kind::Local => "local",
        }
    }
}

struct Settings {
    nodes: Vec<usize>,
    ports: Vec<Kind>,
    payloads: Vec<usize>,
    deliveries: usize,
    memory: bool,
    adapters: usize,
}

const USAGE: &str = "options: --nodes 8,64,256 --ports link,tcp,local --payloads 8 --deliveries 4000000 \
                     --memory on|off --adapters 8 (or MC_BENCH_NODES, MC_BENCH_PORTS, MC_BENCH_PAYLOADS, \
                     MC_BENCH_DELIVERIES, MC_BENCH_MEMORY, MC_BENCH_ADAPTERS)";

impl Settings {
    /// Defaults, then the environment, then the command line (cargo adds
    /// `--bench`, which is ignored).
    fn parse() -> Settings {
        let mut s = Settings {
            nodes: vec![8, 64, 256],
            ports: vec![Kind::Link, Kind::Tcp, Kind::Local],
            payloads: vec![8],
            deliveries: 4_000_000,
            memory: true,
            adapters: 8,
        };
        let keys = ["nodes", "ports", "payloads", "deliveries", "memory", "adapters"];
        for k in keys {
            if let Ok(v) = std::env::var(format!("MC_BENCH_{}", k.to_uppercase())) {
                s.set(k, &v);
            }
        }
        let args: Vec<String> = std::env::args().skip(1).collect();
        let mut i = 0;
        while i < args.len() {
            let a = &args[i];
            i += 1;
            if a == "--bench" {
                continue;
            }
            let Some(opt) = a.strip_prefix("--") else { usage(&format!("unexpected argument '{a}'")) };
            let (k, v) = match opt.split_once('=') {
                Some((k, v)) => (k.to_string(), v.to_string()),
                None if i < args.len() => {
                    i += 1;
                    (opt.to_string(), args[i - 1].clone())
                }
                None => usage(&format!("--{opt} needs a value")),
            };
            if !keys.contains(&k.as_str()) {
                usage(&format!("unknown option --{k}"));
            }
            s.set(&k, &v);
        }
        s
    }

    fn set(&mut self, key: &str, v: &str) {
        let list = |v: &str| -> Vec<usize> {
            v.split(',')
                .map(|x| x.trim().parse().unwrap_or_else(|_| usage(&format!("{key}: '{x}' is not a number"))))
                .collect()
        };
        match key {
            "nodes" => {
                self.nodes = list(v);
                if let Some(n) = self.nodes.iter().find(|&&n| !(2..=MAX_NODES).contains(&n)) {
                    usage(&format!("nodes: {n} is outside 2..={MAX_NODES}"));
                }
            }
            "ports" => {
                self.ports = v
                    .split(',')
                    .map(|p| match p.trim() {
                        "link" => Kind::Link,
                        "tcp" => Kind::Tcp,
                        "local" => Kind::Local,
                        other => usage(&format!("ports: '{other}' is not link, tcp or local")),
                    })
                    .collect()
            }
            "payloads" => {
                self.payloads = list(v);
                if let Some(p) = self.payloads.iter().find(|&&p| !(8..=1024).contains(&p)) {
                    usage(&format!("payloads: {p} is outside 8..=1024 (the first 8 bytes carry a stamp)"));
                }
            }
            "deliveries" => self.deliveries = list(v)[0],
            "memory" => self.memory = !matches!(v, "off" | "0" | "no"),
            "adapters" => self.adapters = list(v)[0],
            _ => unreachable!("checked by the caller"),
        }
    }
}

fn usage(why: &str) -> ! {
    eprintln!("hub_bench: {why}\n{USAGE}");
    std::process::exit(2)
}

// ---------------------------------------------------------- throughput ----

/// What one configuration measured.
struct Figures {
    writes: f64,
    deliveries: f64,
    p50: f64,
    p99: f64,
    samples: usize,
    /// Histogram buckets (2^i ns) of the paced run's ordering steps.
    step_p50: Option<usize>,
    step_p99: Option<usize>,
    setup_secs: f64,
    run_secs: f64,
}

/// Writes per node of a saturated run: about `target` deliveries in all.
fn saturated_per_node(n: usize, target: usize) -> usize {
    (target / (n * (n - 1))).clamp(200, 200_000)
}

/// The paced runs' interval between one sender's writes, and writes per sender.
fn paced(n: usize) -> (Duration, usize) {
    let pace = Duration::from_secs_f64((n * (n - 1)) as f64 / PACED_RATE);
    let per_node = ((PACED_SECS / pace.as_secs_f64()) as usize).clamp(2, 2000);
    (pace, per_node)
}

fn run_config(kind: Kind, n: usize, payload: usize, target: usize) -> Figures {
    let t0 = Instant::now();
    let hub = TestHub::start_with(HubConfig { max_nodes: n, secret: Some(SECRET.to_vec()), ..HubConfig::default() });
    let per_node = saturated_per_node(n, target);
    let (pace, paced_per_node) = paced(n);
    let (setup_secs, sat_secs, paced_lat, h0, h1);
    match kind {
        Kind::Link | Kind::Tcp => {
            let addr = match kind {
                Kind::Tcp => HubAddr::Tcp(hub.listen_tcp()),
                _ => HubAddr::Unix(hub.path.clone()),
            };
            let nodes = link_join(&addr, n);
            setup_secs = t0.elapsed().as_secs_f64();
            let (nodes, secs, _) = link_phase(nodes, payload, per_node, None);
            sat_secs = secs;
            h0 = step_histogram(&hub);
            let (nodes, _, lat) = link_phase(nodes, payload, paced_per_node, Some(pace));
            h1 = step_histogram(&hub);
            paced_lat = lat;
            drop(nodes);
        }
        Kind::Local => {
            let mut guests = local_join(&hub, n, payload);
            setup_secs = t0.elapsed().as_secs_f64();
            sat_secs = local_saturated(&hub, &mut guests, payload, per_node);
            h0 = step_histogram(&hub);
            paced_lat = local_paced(&guests, payload, paced_per_node, pace);
            h1 = step_histogram(&hub);
            drop(guests);
        }
    }
    let run_secs = t0.elapsed().as_secs_f64() - setup_secs;
    drop(hub);
    let mut lat = paced_lat;
    lat.sort_unstable();
    let q = |p: f64| if lat.is_empty() { f64::NAN } else { lat[((lat.len() - 1) as f64 * p) as usize] as f64 / 1e3 };
    let steps: Vec<u64> = h1.iter().zip(&h0).map(|(a, b)| a - b).collect();
    Figures {
        writes: (n * per_node) as f64 / sat_secs,
        deliveries: (n * (n - 1) * per_node) as f64 / sat_secs,
        p50: q(0.5),
        p99: q(0.99),
        samples: lat.len(),
        step_p50: bucket_at(&steps, 0.5),
        step_p99: bucket_at(&steps, 0.99),
        setup_secs,
        run_secs,
    }
}

/// The hub's histogram of ordering step times (bucket i: 2^i to 2^(i+1) ns).
fn step_histogram(hub: &TestHub) -> Vec<u64> {
    match hub.control(Control::Observe { first: 0, count: 0 }) {
        ControlReply::Observe(seen) => seen.step_ns,
        other => panic!("observe answered {other:?}"),
    }
}

/// The bucket holding quantile `q` of a histogram.
fn bucket_at(h: &[u64], q: f64) -> Option<usize> {
    let total: u64 = h.iter().sum();
    if total == 0 {
        return None;
    }
    let want = ((total as f64 * q).ceil() as u64).max(1);
    let mut seen = 0;
    h.iter().position(|&c| {
        seen += c;
        seen >= want
    })
}

/// A histogram bucket as a range of microseconds.
fn bucket_us(b: Option<usize>) -> String {
    match b {
        Some(i) => format!("{}-{}", fmt_us((1u64 << i) as f64 / 1e3), fmt_us((1u64 << (i + 1)) as f64 / 1e3)),
        None => "-".into(),
    }
}

fn fmt_us(us: f64) -> String {
    if us < 10.0 {
        format!("{us:.1}")
    } else {
        format!("{us:.0}")
    }
}

/// The hub's next sequence number.
fn next_seq(hub: &TestHub) -> u64 {
    match hub.control(Control::Stats) {
        ControlReply::Stats { next_seq, .. } => next_seq,
        other => panic!("stats answered {other:?}"),
    }
}

/// Nanoseconds since `base`, plus one (a stamp is never zero).
fn stamp(base: Instant) -> u64 {
    base.elapsed().as_nanos() as u64 + 1
}

// ---------------------------------------------------------- link ports ----

/// A node on a link port: the link protocol's client side.
struct LinkNode {
    r: BufReader<Stream>,
    w: BufWriter<Stream>,
    /// Link sequence number of its next frame.
    seq: u16,
}

fn link_join(addr: &HubAddr, n: usize) -> Vec<LinkNode> {
    (0..n)
        .map(|i| {
            let name = format!("n{i}");
            let hello = client::Hello {
                want_node: ANY_NODE,
                page_size: PAGE_SIZE as u32,
                aspace_pages: 1024,
                name: &name,
                secret: Some(SECRET),
                keepalive: false,
            };
            let (joined, r, w) = client::join_addr(addr, &hello).expect("join the hub");
            // Receivers read through a buffer, as the adapter does.
            LinkNode { r: BufReader::with_capacity(64 * 1024, r), w, seq: joined.next_link_seq }
        })
        .collect()
}

/// Every node broadcasts `per_node` writes of `payload` bytes (`pace`:
/// flushing each and pausing between them, the senders' starts spread over
/// one interval). Returns the nodes, the seconds until the last receiver
/// had all its writes, and latencies in ns (all when paced, every 8th
/// otherwise).
fn link_phase(
    nodes: Vec<LinkNode>,
    payload: usize,
    per_node: usize,
    pace: Option<Duration>,
) -> (Vec<LinkNode>, f64, Vec<u64>) {
    let n = nodes.len();
    let start = Arc::new(Barrier::new(2 * n + 1));
    let base = Instant::now();
    let expect = (n - 1) * per_node;
    let mut rxs = Vec::new();
    let mut txs = Vec::new();
    for (i, LinkNode { mut r, mut w, mut seq }) in nodes.into_iter().enumerate() {
        let go = start.clone();
        rxs.push(thread::spawn(move || {
            let mut buf = Vec::new();
            let mut lat = Vec::with_capacity(if pace.is_some() { expect } else { expect / 8 + 1 });
            go.wait();
            let mut got = 0;
            while got < expect {
                let hdr = link::read_frame(&mut r, &mut buf).expect("read a frame from the hub");
                // Membership events of later joins come first: not counted.
                if let Ok(Msg::Deliver { data, .. }) = Msg::parse(&hdr, &buf) {
                    got += 1;
                    if pace.is_some() || got % 8 == 0 {
                        let sent = u64::from_le_bytes(data[..8].try_into().unwrap());
                        lat.push(stamp(base).saturating_sub(sent));
                    }
                }
            }
            (r, lat)
        }));
        let go = start.clone();
        txs.push(thread::spawn(move || {
            let mut data = vec![0u8; payload];
            go.wait();
            if let Some(p) = pace {
                thread::sleep(p.mul_f64(i as f64 / n as f64));
            }
            for k in 0..per_node {
                data[..8].copy_from_slice(&stamp(base).to_le_bytes());
                let f =
                    Msg::Write { dest: BROADCAST, flags: 0, addr: (k as u64 * 16) % PAGE_SIZE, data: &data }.encode();
                link::write_stamped(&mut w, &f, seq).expect("write to the hub");
                seq = seq.wrapping_add(1);
                if let Some(p) = pace {
                    w.flush().expect("flush to the hub");
                    thread::sleep(p);
                } else if k % FLUSH_EVERY == 0 {
                    w.flush().expect("flush to the hub");
                }
            }
            w.flush().expect("flush to the hub");
            (w, seq)
        }));
    }
    start.wait();
    let t0 = Instant::now();
    let received: Vec<_> = rxs.into_iter().map(|h| h.join().expect("receiver")).collect();
    let secs = t0.elapsed().as_secs_f64();
    let mut lat = Vec::new();
    let nodes = received
        .into_iter()
        .zip(txs)
        .map(|((r, l), tx)| {
            lat.extend(l);
            let (w, seq) = tx.join().expect("sender");
            LinkNode { r, w, seq }
        })
        .collect();
    (nodes, secs, lat)
}

// --------------------------------------------------------- local ports ----

/// The bytes between a local sender's stores in the saturated runs (one
/// packet each: nothing contiguous to coalesce), and between the nodes'
/// slots on the latency pages.
fn slot(payload: usize) -> u64 {
    payload.next_power_of_two().max(8) as u64
}

/// Pages of the latency slots of `n` nodes (after page 0).
fn latency_pages(n: usize, payload: usize) -> u64 {
    (n as u64 * slot(payload)).div_ceil(PAGE_SIZE)
}

/// `n` local ports, each with a fake QEMU that maps RAM for page 0 (the
/// saturated runs' page) and the latency pages, all transmitting and
/// receiving.
fn local_join(hub: &TestHub, n: usize, payload: usize) -> Vec<Guest> {
    let pages = 1 + latency_pages(n, payload);
    (0..n)
        .map(|i| {
            let (sock, node) = hub.add_local(&format!("n{i}"), LOCAL_ASPACE);
            assert_eq!(node as usize, i, "local ports get node ids in order");
            Guest::start(&sock, pages).expect("fake QEMU on a local port")
        })
        .collect()
}

/// Every guest stores `per_node` times as fast as it can; returns the
/// seconds until the hub had ordered (and so delivered) them all. Checks
/// that every adapter received every other node's stores.
fn local_saturated(hub: &TestHub, guests: &mut [Guest], payload: usize, per_node: usize) -> f64 {
    let n = guests.len();
    let rx0: Vec<u32> = guests.iter_mut().map(|g| g.q.reg(reg::RX_PACKETS)).collect();
    let seq0 = next_seq(hub);
    let start = Arc::new(Barrier::new(n + 1));
    let senders: Vec<_> = guests
        .iter()
        .map(|g| {
            let mut s = g.q.s.try_clone().expect("clone the vfio-user socket");
            let go = start.clone();
            thread::spawn(move || {
                let mut data = vec![0u8; payload];
                let mut batch = Vec::with_capacity(STORE_BATCH * (32 + payload));
                go.wait();
                for k in 0..per_node {
                    data[..8].copy_from_slice(&(k as u64 + 1).to_le_bytes());
                    batch.extend_from_slice(&store(k as u64 * 2 * slot(payload) % PAGE_SIZE, &data));
                    if batch.len() >= STORE_BATCH * (32 + payload) || k + 1 == per_node {
                        s.write_all(&batch).expect("posted stores to the adapter");
                        batch.clear();
                    }
                }
            })
        })
        .collect();
    start.wait();
    let t0 = Instant::now();
    let want = seq0 + (n * per_node) as u64;
    while next_seq(hub) < want {
        assert!(t0.elapsed() < RUN_TIMEOUT, "the hub ordered {} of {} writes", next_seq(hub) - seq0, want - seq0);
        thread::sleep(Duration::from_micros(500));
    }
    let secs = t0.elapsed().as_secs_f64();
    for s in senders {
        s.join().expect("sender");
    }
    for (i, g) in guests.iter_mut().enumerate() {
        let got = g.q.reg(reg::RX_PACKETS).wrapping_sub(rx0[i]) as usize;
        assert_eq!(got, (n - 1) * per_node, "node {i} received {got} packets");
    }
    secs
}

/// Every guest stores a stamp into its own slot of the latency pages,
/// `per_node` times, `pace` apart; the last node's RAM is polled for them.
/// Returns the latencies in ns.
fn local_paced(guests: &[Guest], payload: usize, per_node: usize, pace: Duration) -> Vec<u64> {
    let n = guests.len();
    let stride = slot(payload);
    let base = Instant::now();
    let start = Arc::new(Barrier::new(n + 1));
    let senders: Vec<_> = guests
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let mut s = g.q.s.try_clone().expect("clone the vfio-user socket");
            let go = start.clone();
            thread::spawn(move || {
                let mut data = vec![0u8; payload];
                let at = PAGE_SIZE + i as u64 * stride;
                go.wait();
                thread::sleep(pace.mul_f64(i as f64 / n as f64));
                for _ in 0..per_node {
                    data[..8].copy_from_slice(&stamp(base).to_le_bytes());
                    s.write_all(&store(at, &data)).expect("posted store to the adapter");
                    thread::sleep(pace);
                }
            })
        })
        .collect();
    // The observer: the last node, the last receiver of every step.
    let ram = &guests[n - 1].ram;
    let mut seen = vec![0u64; n - 1];
    let mut buf = vec![0u8; (n - 1) * stride as usize];
    let expect = (n - 1) * per_node;
    let mut lat = Vec::with_capacity(expect);
    start.wait();
    let mut done_at = None;
    let t0 = Instant::now();
    while lat.len() < expect {
        ram.read_exact_at(&mut buf, PAGE_SIZE).expect("read guest RAM");
        let now = stamp(base);
        for (j, last) in seen.iter_mut().enumerate() {
            let off = j * stride as usize;
            let v = u64::from_le_bytes(buf[off..off + 8].try_into().unwrap());
            if v != *last {
                *last = v;
                lat.push(now.saturating_sub(v));
            }
        }
        // A store overwritten before it was seen is not waited for.
        if done_at.is_none() && senders.iter().all(|s| s.is_finished()) {
            done_at = Some(Instant::now());
        }
        if done_at.is_some_and(|d| d.elapsed() > Duration::from_millis(200)) || t0.elapsed() > RUN_TIMEOUT {
            break;
        }
        thread::yield_now();
    }
    for s in senders {
        s.join().expect("sender");
    }
    lat
}

// ----------------------------------------------------------- fake QEMU ----

/// A fake guest: a vfio-user client and its RAM.
struct Guest {
    q: Qemu,
    ram: File,
}

impl Guest {
    /// Connects to an adapter's socket, maps `pages` pages of memfd RAM at
    /// [`IOVA`], turns bus mastering on and makes pages `0..pages`
    /// transmit and receive (into the RAM, page for page).
    fn start(sock: &Path, pages: u64) -> std::io::Result<Guest> {
        let mut q = Qemu::connect(sock)?;
        let ram = sys::memfd(pages * PAGE_SIZE)?;
        q.dma_map(IOVA, pages * PAGE_SIZE, &ram)?;
        // PCI command: memory space and bus master.
        q.write(vfio_user::region::CONFIG, 0x04, &0x0006u16.to_le_bytes())?;
        for p in 0..pages {
            q.write(BAR_PCT, p * pct::ENTRY, &(pct::TX | pct::RX).to_le_bytes())?;
            q.write(BAR_PCT, p * pct::ENTRY + 8, &(IOVA + p * PAGE_SIZE).to_le_bytes())?;
        }
        Ok(Guest { q, ram })
    }
}

/// A minimal vfio-user client, as QEMU's `vfio-user-pci` speaks to the
/// adapter: requests one at a time, posted stores in batches.
struct Qemu {
    s: UnixStream,
    id: u16,
}

/// A message of `command` (`flags`: the header's flag word) with `parts` as body.
fn message(id: u16, command: wire::Command, flags: u32, parts: &[&[u8]]) -> Vec<u8> {
    let size = (wire::HDR_LEN + parts.iter().map(|p| p.len()).sum::<usize>()) as u32;
    wire::message(wire::Header { id, command: command as u16, size, flags, error: 0 }, parts)
}

/// `struct vfio_user_region_access`: offset, region, count.
fn access(region: u32, offset: u64, count: usize) -> [u8; 16] {
    let mut a = [0u8; 16];
    a[..8].copy_from_slice(&offset.to_le_bytes());
    a[8..12].copy_from_slice(&region.to_le_bytes());
    a[12..].copy_from_slice(&(count as u32).to_le_bytes());
    a
}

/// A posted store of `data` at `offset` of the transmit window (no reply).
fn store(offset: u64, data: &[u8]) -> Vec<u8> {
    message(0, wire::Command::RegionWrite, vfio_user::flags::NO_REPLY, &[&access(BAR_TX, offset, data.len()), data])
}

impl Qemu {
    /// Connects and negotiates the version.
    fn connect(path: &Path) -> std::io::Result<Qemu> {
        let s = UnixStream::connect(path)?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        let mut q = Qemu { s, id: 0 };
        let mut v = vec![0u8; 4]; // major 0, minor 0
        v.extend_from_slice(br#"{"capabilities":{"max_msg_fds":8,"max_data_xfer_size":1048576}}"#);
        v.push(0);
        q.call(wire::Command::Version, &[&v], None)?;
        Ok(q)
    }

    /// One request and its reply's body; `fd` goes with it.
    fn call(&mut self, command: wire::Command, parts: &[&[u8]], fd: Option<&File>) -> std::io::Result<Vec<u8>> {
        self.id = self.id.wrapping_add(1);
        let m = message(self.id, command, vfio_user::flags::REQUEST, parts);
        match fd {
            Some(f) => {
                let n = sys::send_with_fd(&self.s, &m, f)?;
                self.s.write_all(&m[n..])?;
            }
            None => self.s.write_all(&m)?,
        }
        let mut h = [0u8; wire::HDR_LEN];
        self.s.read_exact(&mut h)?;
        let size = u32::from_le_bytes(h[4..8].try_into().unwrap()) as usize;
        let flags = u32::from_le_bytes(h[8..12].try_into().unwrap());
        let mut body = vec![0u8; size.saturating_sub(wire::HDR_LEN)];
        self.s.read_exact(&mut body)?;
        if flags & vfio_user::flags::ERROR != 0 {
            let errno = u32::from_le_bytes(h[12..16].try_into().unwrap());
            return Err(std::io::Error::other(format!("{command:?} failed with errno {errno}")));
        }
        Ok(body)
    }

    /// DMA_MAP of all of `ram` at `iova`, read-write.
    fn dma_map(&mut self, iova: u64, size: u64, ram: &File) -> std::io::Result<()> {
        let mut m = [0u8; 32];
        m[..4].copy_from_slice(&32u32.to_le_bytes());
        let rw = vfio_user::dma_flags::READ | vfio_user::dma_flags::WRITE;
        m[4..8].copy_from_slice(&rw.to_le_bytes());
        // offset in the file: 0
        m[16..24].copy_from_slice(&iova.to_le_bytes());
        m[24..].copy_from_slice(&size.to_le_bytes());
        self.call(wire::Command::DmaMap, &[&m], Some(ram)).map(drop)
    }

    /// A region write that has taken effect on return.
    fn write(&mut self, region: u32, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.call(wire::Command::RegionWrite, &[&access(region, offset, data.len()), data], None).map(drop)
    }

    /// A 32-bit register of BAR 0.
    fn reg(&mut self, offset: u64) -> u32 {
        let r = self.call(wire::Command::RegionRead, &[&access(BAR_REGS, offset, 4)], None).expect("register read");
        u32::from_le_bytes(r[16..20].try_into().expect("4 bytes after the access"))
    }
}

/// Guest RAM (a memfd) and passing its descriptor with a message, which
/// the standard library does not offer: two libc calls, declared here.
/// The layouts are Linux's on 64-bit targets.
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
mod sys {
    use std::ffi::{c_char, c_int, c_uint, c_void};
    use std::fs::File;
    use std::io;
    use std::os::fd::{AsRawFd, FromRawFd};
    use std::os::unix::net::UnixStream;

    extern "C" {
        fn memfd_create(name: *const c_char, flags: c_uint) -> c_int;
        fn sendmsg(fd: c_int, msg: *const MsgHdr, flags: c_int) -> isize;
    }

    const MFD_CLOEXEC: c_uint = 1;
    const MFD_ALLOW_SEALING: c_uint = 2;
    const SOL_SOCKET: c_int = 1;
    const SCM_RIGHTS: c_int = 1;

    #[repr(C)]
    struct IoVec {
        base: *const c_void,
        len: usize,
    }

    #[repr(C)]
    struct MsgHdr {
        name: *mut c_void,
        namelen: u32,
        iov: *const IoVec,
        iovlen: usize,
        control: *mut c_void,
        controllen: usize,
        flags: c_int,
    }

    /// A control message carrying one descriptor: `struct cmsghdr` and its
    /// data, padded to `CMSG_SPACE(sizeof(int))`.
    #[repr(C)]
    struct FdCmsg {
        len: usize,
        level: c_int,
        kind: c_int,
        fd: c_int,
        pad: c_int,
    }

    const _: () = assert!(std::mem::size_of::<MsgHdr>() == 56 && std::mem::size_of::<FdCmsg>() == 24);

    /// A memfd of `size` bytes that can be sealed (what the adapter's
    /// DMA_MAP asks for, as QEMU's memory-backend-memfd gives it).
    pub fn memfd(size: u64) -> io::Result<File> {
        // SAFETY: the name is a NUL-terminated literal; nothing else is passed.
        let fd = unsafe { memfd_create(c"mc-bench-guest-ram".as_ptr(), MFD_CLOEXEC | MFD_ALLOW_SEALING) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and nothing else owns it.
        let f = unsafe { File::from_raw_fd(fd) };
        f.set_len(size)?;
        Ok(f)
    }

    /// Sends (the start of) `bytes` with `file`'s descriptor attached;
    /// returns how many bytes went.
    pub fn send_with_fd(s: &UnixStream, bytes: &[u8], file: &File) -> io::Result<usize> {
        let iov = IoVec { base: bytes.as_ptr().cast(), len: bytes.len() };
        // CMSG_LEN(sizeof(int)): the header and the descriptor, no padding.
        let len = std::mem::size_of::<usize>() + 3 * std::mem::size_of::<c_int>();
        let mut cmsg = FdCmsg { len, level: SOL_SOCKET, kind: SCM_RIGHTS, fd: file.as_raw_fd(), pad: 0 };
        let msg = MsgHdr {
            name: std::ptr::null_mut(),
            namelen: 0,
            iov: &iov,
            iovlen: 1,
            control: (&mut cmsg as *mut FdCmsg).cast(),
            controllen: std::mem::size_of::<FdCmsg>(),
            flags: 0,
        };
        // SAFETY: `msg` points at `iov`, `bytes` and `cmsg`, which outlive
        // the call; the kernel only reads them.
        let n = unsafe { sendmsg(s.as_raw_fd(), &msg, 0) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }
}

// -------------------------------------------------------------- tables ----

fn print_tables(results: &[(Kind, usize, usize, Figures)]) {
    let of = |k: Kind| results.iter().filter(move |r| r.0 == k);
    // Link ports over Unix sockets keep the rows of earlier versions of
    // this benchmark, which scripts read (`scripts/latency-bench.sh`: a
    // node count, then the payload and a bar); no other line starts so.
    if of(Kind::Link).next().is_some() {
        println!();
        println!("link ports: N link clients over Unix sockets (where mc-adapter processes would be)");
        println!(
            "{:>5} {:>7} | {:>12} {:>14} | {:>13} {:>13}",
            "nodes", "payload", "writes/s", "deliveries/s", "paced p50 us", "paced p99 us"
        );
        for (_, n, payload, f) in of(Kind::Link) {
            println!(
                "{n:>5} {payload:>6}B | {:>12.0} {:>14.0} | {:>13.1} {:>13.1}",
                f.writes, f.deliveries, f.p50, f.p99
            );
        }
    }
    if results.iter().any(|r| r.0 != Kind::Link) {
        println!();
        println!("tcp: link ports over TCP on loopback; local: the hub serves N adapters, each with a fake QEMU");
        println!(
            "{:<5} {:>5} {:>7} | {:>12} {:>14} | {:>13} {:>13}",
            "ports", "nodes", "payload", "writes/s", "deliveries/s", "paced p50 us", "paced p99 us"
        );
        for (k, n, payload, f) in results.iter().filter(|r| r.0 != Kind::Link) {
            println!(
                "{:<5} {n:>5} {payload:>6}B | {:>12.0} {:>14.0} | {:>13.1} {:>13.1}",
                k.name(),
                f.writes,
                f.deliveries,
                f.p50,
                f.p99
            );
        }
    }
    println!();
    println!("the order lock: one ordering step numbers a write and fans it out to the N-1 receivers");
    println!(
        "step: the hub's histogram of the paced runs' steps (power-of-two buckets); \
         ns per delivery: 1 / saturated deliveries/s"
    );
    println!(
        "{:<5} {:>5} {:>7} | {:>12} {:>12} | {:>12} {:>16}",
        "ports", "nodes", "payload", "step p50 us", "step p99 us", "writes/s", "ns per delivery"
    );
    for (k, n, payload, f) in results {
        println!(
            "{:<5} {n:>5} {payload:>6}B | {:>12} {:>12} | {:>12.0} {:>16.1}",
            k.name(),
            bucket_us(f.step_p50),
            bucket_us(f.step_p99),
            f.writes,
            1e9 / f.deliveries
        );
    }
    // Ratios of figures from this one run: the machine's load changes
    // from run to run, these less.
    let first_n = results.iter().map(|r| r.1).min();
    let get =
        |k: Kind, n: usize, p: usize| results.iter().find(|r| r.0 == k && r.1 == n && r.2 == p).map(|r| r.3.deliveries);
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) => format!("{:.2}", a / b),
        _ => "-".into(),
    };
    println!();
    println!("ratios of saturated deliveries/s in this run (first N: {})", first_n.unwrap_or(0));
    println!(
        "{:<11} {:>7} | {:>12} {:>12} | {:>14} {:>14} {:>15}",
        "nodes", "payload", "local / link", "tcp / link", "link / first N", "tcp / first N", "local / first N"
    );
    let mut seen = Vec::new();
    for (n, p) in results.iter().map(|r| (r.1, r.2)) {
        if seen.contains(&(n, p)) {
            continue;
        }
        seen.push((n, p));
        let base = |k: Kind| first_n.and_then(|f| get(k, f, p));
        println!(
            "{:<11} {p:>6}B | {:>12} {:>12} | {:>14} {:>14} {:>15}",
            format!("{n} nodes"),
            ratio(get(Kind::Local, n, p), get(Kind::Link, n, p)),
            ratio(get(Kind::Tcp, n, p), get(Kind::Link, n, p)),
            ratio(get(Kind::Link, n, p), base(Kind::Link)),
            ratio(get(Kind::Tcp, n, p), base(Kind::Tcp)),
            ratio(get(Kind::Local, n, p), base(Kind::Local))
        );
    }
}

// -------------------------------------------------------------- memory ----

/// What `/proc/PID/status` says of a process's memory, in KiB.
#[derive(Debug, Clone, Copy, Default)]
struct Mem {
    rss: u64,
    anon: u64,
    threads: u64,
}

fn mem_of(pid: u32) -> Mem {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc/PID/status");
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Mem { rss: field("VmRSS:"), anon: field("RssAnon:"), threads: field("Threads:") }
}

/// A child process, killed when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One line of the memory table: a process's memory before and after, per node.
struct MemRow {
    what: String,
    nodes: usize,
    before: Mem,
    after: Mem,
    /// What the difference is divided by.
    per: usize,
}

fn memory(s: &Settings) {
    let hub_exe = PathBuf::from(env!("CARGO_BIN_EXE_mc-hub"));
    let adapter_exe = hub_exe.with_file_name("mc-adapter");
    println!();
    println!("memory: real processes, /proc/PID/status (VmRSS, RssAnon: the process's own heap and stacks)");
    let mut rows = Vec::new();
    let smallest = s.nodes.iter().copied().min().unwrap_or(8);
    for &n in &s.nodes {
        let from = rows.len();
        let r = mem_link(&hub_exe, n, n == smallest && n <= 16);
        let base = r[0].before;
        rows.extend(r);
        rows.extend(mem_local(&hub_exe, n, base));
        print_mem(&rows[from..]);
    }
    if s.adapters >= 2 {
        if adapter_exe.exists() {
            let r = mem_adapters(&hub_exe, &adapter_exe, s.adapters);
            print_mem(&r);
            rows.extend(r);
        } else {
            println!(
                "  (no {}: build it with `cargo build --release -p device --bin mc-adapter` to measure it)",
                adapter_exe.display()
            );
        }
    }
    println!();
    println!(
        "memory in KiB: before (0), after (1), and (1 - 0) per node (per queue: over the N-1 full queues; \
         total, each: not divided); queues of {QUEUE_DEPTH} frames"
    );
    println!(
        "{:<70} {:>5} | {:>8} {:>8} {:>8} | {:>8} {:>8} {:>8} | {:>7}",
        "what", "nodes", "VmRSS 0", "VmRSS 1", "per node", "Anon 0", "Anon 1", "per node", "threads"
    );
    for r in &rows {
        println!(
            "{:<70} {:>5} | {:>8} {:>8} {:>8.0} | {:>8} {:>8} {:>8.0} | {:>7}",
            r.what,
            r.nodes,
            r.before.rss,
            r.after.rss,
            r.after.rss.saturating_sub(r.before.rss) as f64 / r.per as f64,
            r.before.anon,
            r.after.anon,
            r.after.anon.saturating_sub(r.before.anon) as f64 / r.per as f64,
            r.after.threads
        );
    }
}

fn print_mem(rows: &[MemRow]) {
    for r in rows {
        println!(
            "  done: {} ({} nodes): VmRSS {} -> {} KiB, RssAnon {} -> {} KiB ({:.0} KiB per node), {} threads",
            r.what,
            r.nodes,
            r.before.rss,
            r.after.rss,
            r.before.anon,
            r.after.anon,
            r.after.anon.saturating_sub(r.before.anon) as f64 / r.per as f64,
            r.after.threads
        );
    }
}

/// An `mc-hub` child on `dir/hub.sock` with control socket `dir/hub.ctl`,
/// once it answers `stats`.
fn start_hub(exe: &Path, dir: &Path, max_nodes: usize, extra: &[String]) -> Proc {
    let p = Proc(
        Command::new(exe)
            .arg("--socket")
            .arg(dir.join("hub.sock"))
            .arg("--control")
            .arg(dir.join("hub.ctl"))
            .args(["--max-nodes", &max_nodes.to_string(), "--stall-timeout", "120"])
            .args(extra)
            .env("MC_LOG", "error")
            .stdin(Stdio::null())
            .spawn()
            .expect("start mc-hub"),
    );
    let t0 = Instant::now();
    while ctl_stats(dir).is_none() {
        assert!(t0.elapsed() < Duration::from_secs(30), "mc-hub did not answer on its control socket");
        thread::sleep(Duration::from_millis(20));
    }
    p
}

/// `stats` from the hub in `dir`: next seq and (node, queued) of every node up.
fn ctl_stats(dir: &Path) -> Option<(u64, Vec<(u16, usize)>)> {
    let mut s = UnixStream::connect(dir.join("hub.ctl")).ok()?;
    s.write_all(b"{\"cmd\":\"stats\"}\n").ok()?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).ok()?;
    match serde_json::from_str(&line).ok()? {
        ControlReply::Stats { next_seq, nodes, .. } => {
            Some((next_seq, nodes.iter().map(|n| (n.node, n.queued)).collect()))
        }
        _ => None,
    }
}

/// Waits until `ok` holds of the hub's stats.
fn wait_stats(dir: &Path, what: &str, ok: impl Fn(u64, &[(u16, usize)]) -> bool) {
    let t0 = Instant::now();
    loop {
        if let Some((seq, nodes)) = ctl_stats(dir) {
            if ok(seq, &nodes) {
                return;
            }
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(10));
    }
}

/// Lets a process settle (allocator, lazily started threads) before a reading.
fn settle() {
    thread::sleep(Duration::from_millis(300));
}

/// `mc-hub` with N link ports: idle, after 64 KiB each way through every
/// link, with every queue full of broadcast frames (shared between the
/// queues), and (`p2p`) full of point-to-point frames (one per queue).
fn mem_link(exe: &Path, n: usize, p2p: bool) -> Vec<MemRow> {
    let dir = tempfile::tempdir().expect("temp dir");
    let hub = start_hub(exe, dir.path(), n, &[]);
    settle();
    let m0 = mem_of(hub.0.id());
    let mut nodes = link_join(&HubAddr::Unix(dir.path().join("hub.sock")), n);
    wait_stats(dir.path(), "the link ports to join", |_, up| up.len() == n);
    settle();
    let m1 = mem_of(hub.0.id());
    // Traffic: 8 frames of 8 KiB from each node to the next, so each
    // link's read and write buffers (64 KiB each) are used once.
    let data = vec![0u8; BIG];
    for (i, node) in nodes.iter_mut().enumerate() {
        for k in 0..8u64 {
            let f = Msg::Write { dest: ((i + 1) % n) as u16, flags: 0, addr: k * PAGE_SIZE, data: &data }.encode();
            link::write_stamped(&mut node.w, &f, node.seq).expect("write to mc-hub");
            node.seq = node.seq.wrapping_add(1);
        }
        node.w.flush().expect("flush to mc-hub");
    }
    let mut buf = Vec::new();
    for node in &mut nodes {
        let mut got = 0;
        while got < 8 {
            let hdr = link::read_frame(&mut node.r, &mut buf).expect("read from mc-hub");
            if matches!(Msg::parse(&hdr, &buf), Ok(Msg::Deliver { .. })) {
                got += 1;
            }
        }
    }
    settle();
    let m2 = mem_of(hub.0.id());
    let full = QUEUE_DEPTH - MEMBER_ROOM;
    let mut rows = vec![
        MemRow { what: "mc-hub, link ports joined, idle".into(), nodes: n, before: m0, after: m1, per: n },
        MemRow { what: "mc-hub, link ports after 64 KiB each way".into(), nodes: n, before: m0, after: m2, per: n },
    ];
    // Node 0 broadcasts and nobody reads: every other node's queue fills
    // with the same frames.
    let filler = fill_queues(dir.path(), &nodes[0], |_| BROADCAST);
    let m3 = mem_of(hub.0.id());
    rows.push(MemRow {
        what: format!("mc-hub, link queues full: {full} broadcast 8 KiB frames (total)"),
        nodes: n,
        before: m2,
        after: m3,
        per: 1,
    });
    drop(hub);
    filler.join().expect("filler");
    drop(nodes);
    if p2p {
        rows.push(mem_p2p(exe, n));
    }
    rows
}

/// Writes 8 KiB frames from `node` (the k-th to `dest(k)`), nobody reading,
/// until every other node's queue in the hub in `dir` is full; returns
/// the writing thread, which ends when `mc-hub` is killed.
fn fill_queues(dir: &Path, node: &LinkNode, dest: impl Fn(u64) -> u16 + Send + 'static) -> thread::JoinHandle<()> {
    let mut w = node.w.get_ref().try_clone().expect("clone the link socket");
    let mut seq = node.seq;
    let filler = thread::spawn(move || {
        let data = vec![0u8; BIG];
        for k in 0.. {
            let f = Msg::Write { dest: dest(k), flags: 0, addr: 0, data: &data }.encode();
            if link::write_stamped(&mut w, &f, seq).is_err() {
                break;
            }
            seq = seq.wrapping_add(1);
        }
    });
    let full = QUEUE_DEPTH - MEMBER_ROOM;
    wait_stats(dir, "the queues to fill", |_, up| up.iter().filter(|(id, _)| *id != 0).all(|(_, q)| *q >= full));
    settle();
    filler
}

/// `mc-hub` whose N-1 link queues fill with point-to-point 8 KiB frames
/// from node 0: no frame is shared, the worst case of the bound.
fn mem_p2p(exe: &Path, n: usize) -> MemRow {
    let dir = tempfile::tempdir().expect("temp dir");
    let hub = start_hub(exe, dir.path(), n, &[]);
    let nodes = link_join(&HubAddr::Unix(dir.path().join("hub.sock")), n);
    wait_stats(dir.path(), "the link ports to join", |_, up| up.len() == n);
    settle();
    let m0 = mem_of(hub.0.id());
    // Joined in order, the nodes are 0..n: node 0 writes to 1, 2, ... in turn.
    let filler = fill_queues(dir.path(), &nodes[0], move |k| (1 + k % (n as u64 - 1)) as u16);
    let m1 = mem_of(hub.0.id());
    let full = QUEUE_DEPTH - MEMBER_ROOM;
    drop(hub);
    filler.join().expect("filler");
    MemRow {
        what: format!("mc-hub, link queues full: {full} point-to-point 8 KiB frames (per queue)"),
        nodes: n,
        before: m0,
        after: m1,
        per: n - 1,
    }
}

/// `mc-hub` with N local ports (512 MiB address space each, `mc-hub`'s
/// default): idle, then with a fake QEMU each (2 pages of RAM mapped),
/// then after 64 stores from each guest. `base`: `mc-hub` without ports.
fn mem_local(exe: &Path, n: usize, base: Mem) -> Vec<MemRow> {
    let dir = tempfile::tempdir().expect("temp dir");
    let socks: Vec<PathBuf> = (0..n).map(|i| dir.path().join(format!("l{i}.sock"))).collect();
    let mut args = vec!["--aspace-mib".to_string(), "512".to_string()];
    for (i, s) in socks.iter().enumerate() {
        args.push("--local".into());
        args.push(format!("{i}:l{i}:{}", s.display()));
    }
    let hub = start_hub(exe, dir.path(), n, &args);
    wait_stats(dir.path(), "the local ports", |_, up| up.len() == n);
    settle();
    let m1 = mem_of(hub.0.id());
    let mut guests: Vec<Guest> =
        socks.iter().map(|s| Guest::start(s, 2).expect("fake QEMU on an mc-hub local port")).collect();
    settle();
    let m2 = mem_of(hub.0.id());
    let (seq0, _) = ctl_stats(dir.path()).expect("stats");
    for g in &mut guests {
        let batch: Vec<u8> = (0..64u64).flat_map(|k| store(k * 16, &(k + 1).to_le_bytes())).collect();
        g.q.s.write_all(&batch).expect("posted stores");
    }
    wait_stats(dir.path(), "the stores to be ordered", |seq, _| seq >= seq0 + 64 * n as u64);
    settle();
    let m3 = mem_of(hub.0.id());
    // One QEMU's burst as large as the vfio-user receive buffer: what a
    // flooding guest makes its port hold.
    let (b, stores) = burst();
    guests[0].q.s.write_all(&b).expect("posted stores");
    wait_stats(dir.path(), "the burst to be ordered", |seq, _| seq >= seq0 + (64 * n + stores) as u64);
    settle();
    let m4 = mem_of(hub.0.id());
    drop(guests);
    drop(hub);
    vec![
        MemRow {
            what: "mc-hub, local ports (512 MiB aspace), no QEMU".into(),
            nodes: n,
            before: base,
            after: m1,
            per: n,
        },
        MemRow { what: "mc-hub, local ports, a fake QEMU each".into(), nodes: n, before: base, after: m2, per: n },
        MemRow {
            what: "mc-hub, local ports, after 64 stores from each".into(),
            nodes: n,
            before: base,
            after: m3,
            per: n,
        },
        MemRow {
            what: "mc-hub, local ports, then one QEMU's 1 MiB burst (that port)".into(),
            nodes: n,
            before: m3,
            after: m4,
            per: 1,
        },
    ]
}

/// About 1 MiB of posted 8-byte stores (one packet each) in one buffer,
/// and how many stores that is.
fn burst() -> (Vec<u8>, usize) {
    let one = store(0, &[0; 8]).len();
    let stores = (1 << 20) / one;
    ((0..stores as u64).flat_map(|k| store(k * 16 % PAGE_SIZE, &(k + 1).to_le_bytes())).collect(), stores)
}

/// `a` `mc-adapter` processes (512 MiB address space, their default) on
/// one `mc-hub`: joined with no QEMU, then with a fake QEMU each after 64
/// stores from each. Rows give one adapter's memory (the mean).
fn mem_adapters(hub_exe: &Path, exe: &Path, a: usize) -> Vec<MemRow> {
    let dir = tempfile::tempdir().expect("temp dir");
    let hub = start_hub(hub_exe, dir.path(), a, &[]);
    let socks: Vec<PathBuf> = (0..a).map(|i| dir.path().join(format!("a{i}.sock"))).collect();
    let adapters: Vec<Proc> = socks
        .iter()
        .enumerate()
        .map(|(i, s)| {
            Proc(
                Command::new(exe)
                    .arg("--socket")
                    .arg(s)
                    .arg("--hub")
                    .arg(dir.path().join("hub.sock"))
                    .args(["--name", &format!("a{i}"), "--node", &i.to_string()])
                    .env("MC_LOG", "error")
                    .stdin(Stdio::null())
                    .spawn()
                    .expect("start mc-adapter"),
            )
        })
        .collect();
    wait_stats(dir.path(), "the adapters to join", |_, up| up.len() == a);
    let t0 = Instant::now();
    while !socks.iter().all(|s| s.exists()) {
        assert!(t0.elapsed() < Duration::from_secs(30), "mc-adapter sockets");
        thread::sleep(Duration::from_millis(10));
    }
    settle();
    let mean = |ms: Vec<Mem>| Mem {
        rss: ms.iter().map(|m| m.rss).sum::<u64>() / ms.len() as u64,
        anon: ms.iter().map(|m| m.anon).sum::<u64>() / ms.len() as u64,
        threads: ms.iter().map(|m| m.threads).sum::<u64>() / ms.len() as u64,
    };
    let m1 = mean(adapters.iter().map(|p| mem_of(p.0.id())).collect());
    let mut guests: Vec<Guest> = socks.iter().map(|s| Guest::start(s, 2).expect("fake QEMU on mc-adapter")).collect();
    let rx0: Vec<u32> = guests.iter_mut().map(|g| g.q.reg(reg::RX_PACKETS)).collect();
    for g in &mut guests {
        let batch: Vec<u8> = (0..64u64).flat_map(|k| store(k * 16, &(k + 1).to_le_bytes())).collect();
        g.q.s.write_all(&batch).expect("posted stores");
    }
    for (i, g) in guests.iter_mut().enumerate() {
        let t0 = Instant::now();
        while (g.q.reg(reg::RX_PACKETS).wrapping_sub(rx0[i]) as usize) < 64 * (a - 1) {
            assert!(t0.elapsed() < Duration::from_secs(30), "adapter {i} did not receive every store");
            thread::sleep(Duration::from_millis(5));
        }
    }
    settle();
    let m2 = mean(adapters.iter().map(|p| mem_of(p.0.id())).collect());
    // Adapter 0's QEMU floods it; adapter 1 counts the stores arriving.
    let (b, stores) = burst();
    let rx1 = guests[1].q.reg(reg::RX_PACKETS);
    guests[0].q.s.write_all(&b).expect("posted stores");
    let t0 = Instant::now();
    while (guests[1].q.reg(reg::RX_PACKETS).wrapping_sub(rx1) as usize) < stores {
        assert!(t0.elapsed() < Duration::from_secs(60), "adapter 1 did not receive the burst");
        thread::sleep(Duration::from_millis(5));
    }
    settle();
    let m3 = mem_of(adapters[0].0.id());
    drop(guests);
    drop(adapters);
    drop(hub);
    let zero = Mem::default();
    vec![
        MemRow {
            what: "mc-adapter (512 MiB aspace), joined, no QEMU (each)".into(),
            nodes: a,
            before: zero,
            after: m1,
            per: 1,
        },
        MemRow {
            what: "mc-adapter, fake QEMU, after 64 stores each way (each)".into(),
            nodes: a,
            before: zero,
            after: m2,
            per: 1,
        },
        MemRow {
            what: "mc-adapter, then a 1 MiB burst from its QEMU (that one)".into(),
            nodes: a,
            before: zero,
            after: m3,
            per: 1,
        },
    ]
}
