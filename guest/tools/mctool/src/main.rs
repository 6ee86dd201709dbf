//! `mctool`: drive the MEMORY CHANNEL adapter and imcd from a guest shell.
//!
//! - [`raw`]: raw-adapter commands (registers, PCT, receive buffer,
//!   transmit window), straight through the guest driver.
//! - [`imc`]: commands through imcd (the TruCluster API, as `libimc` uses it).
//! - [`dma`]: transmit DMA through imcd (libimc's extension calls).
//! - [`pingpong`] and [`order`]: two-node measurements and checks.
//! - [`signals`]: clean stops and `wait-signal`.
//! - [`conform`]: the driver's side of the conformance suite (`mc-cluster conform`).
//! - [`soak`]: one node's share of the soak workload (`scripts/soak.sh`).

mod conform;
mod dma;
mod floor;
mod imc;
mod order;
mod pingpong;
mod raw;
mod signals;
mod soak;

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::{Parser, Subcommand, ValueEnum};
use regs::PAGE_SIZE;
use testkit::pattern;

use raw::DEFAULT_BUFFER;

#[derive(Parser)]
#[command(
    version,
    about = "Drive the MEMORY CHANNEL adapter from inside a guest",
    long_about = "Drive the MEMORY CHANNEL adapter from inside a guest.\n\n\
                  The raw commands (rx, fill, poke, wait, dump, bench-tx, pingpong, ...) open the \
                  adapter through VFIO, so they need a guest without imcd \
                  (qemu-configs/raw-adapter.toml); the imc-* commands go through imcd and the \
                  TruCluster MEMORY CHANNEL API, on the default cluster; info works either way.",
    after_help = "Examples (from the host, mc-cluster exec N -- ...):
  mctool info                                       node id, link, members, errors
  mctool imc-put --key 7 --value 42                 through imcd: store 42 into region 7
  mctool imc-get --key 7 --value 42                 on another node: wait until it arrives
  mctool imc-hosts                                  the nodes running imcd
  mctool bench-tx --stride 16                       raw: stores per second (raw-adapter.toml)

Exit codes: 0 success; 1 an error or a check that failed (the message starts
with \"Error:\"); 2 a usage error."
)]
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
    /// Raw: one scenario of the driver conformance suite (`mc-cluster conform`).
    ///
    /// Prints `ready`, then what the driver sees (`notify PAGE`, `error
    /// 0xBITS`, `link UP 0xMEMBERS`, ...) until standard input ends
    /// (docs/adapter.md, "The conformance suite").
    Conform {
        #[command(subcommand)]
        scenario: conform::Scenario,
    },
    /// Show the adapter's identity, node id, link, members and error registers.
    Info {
        /// Print one JSON object instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Map a receive buffer and enable receive on pages; keeps running.
    ///
    /// In the background unless --foreground, so the DMA map stays in place.
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
    /// Sleep until a write to PAGE raises the notification interrupt.
    ///
    /// Enables receive with interrupt on PAGE; the interrupt is MSI-X through VFIO.
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
    /// Through imcd: a counter incremented under a cluster spinlock must come out exact.
    ///
    /// PROCS processes increment a counter region under spinlock set KEY
    /// (imc_lkacquire, libimc), ROUNDS times each; succeeds when the counter
    /// reaches TOTAL exactly. Run with --setup on every node first.
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
    /// One node's share of the soak workload (`scripts/soak.sh`).
    ///
    /// It runs on every node: sequenced broadcast writes checked by every reader,
    /// increments under a cluster spinlock, a UMP ping-pong. Writes a JSON
    /// status to --status every second; stops when --stop exists.
    Soak {
        /// Nodes in the cluster (the broadcast region has a slot for each).
        #[arg(long)]
        nodes: usize,
        /// This run's incarnation on this node (1 the first time, one more
        /// after each restart).
        #[arg(long, default_value_t = 1)]
        incarnation: u16,
        /// Status file (JSON, replaced once a second).
        #[arg(long)]
        status: PathBuf,
        /// Stop when this file exists.
        #[arg(long)]
        stop: PathBuf,
        /// Stop after this many seconds as well (0: only on --stop).
        #[arg(long, default_value_t = 0)]
        seconds: u64,
        /// Broadcast records written per second.
        #[arg(long, default_value_t = 100)]
        rate: u64,
    },
    /// Through imcd: imc_kill, a signal to a process on another node.
    ///
    /// The signal goes through imcd's command relay (libimc).
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
    /// Failure drill: imcd stops dead in an update of directory entry ID.
    ///
    /// Asks imcd (started with --test-hooks) to stop dead in the middle of an
    /// update of directory entry ID, holding the lock.
    ImcDrill {
        /// Directory entry.
        #[arg(long, default_value_t = 0)]
        id: u32,
    },
    /// Through imcd: whether imc_ckerrcnt sees new errors after SECONDS.
    ///
    /// Reads the error count (libimc), waits SECONDS, then reports whether
    /// imc_ckerrcnt saw new errors (exit 0 when it did).
    ImcCheckErrors {
        /// Seconds to wait between reading and checking.
        #[arg(long, default_value_t = 5)]
        seconds: u64,
    },
    /// Through imcd: imc_asalloc of KEY with MODE; prints the status.
    ///
    /// The region lives while some process holds it: --hold keeps this one
    /// holding it (then imc_asdealloc).
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
    /// Through imcd: store VALUE into every word of region KEY.
    ///
    /// Allocates region KEY and attaches it for transmit (libimc).
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
    /// Through imcd: send SIZE bytes of a pattern into region KEY by transmit DMA.
    ///
    /// Allocates region KEY, attaches it for transmit and sends SIZE bytes of
    /// the pattern of SEED to OFFSET (libimc's DMA extension); with --flag V,
    /// stores V into the region's last page right after the doorbell.
    ImcDma {
        /// Region key.
        #[arg(long)]
        key: u64,
        /// Bytes to send.
        #[arg(long)]
        size: u64,
        /// Byte offset in the region.
        #[arg(long, default_value_t = 0)]
        offset: u64,
        /// Region size [default: offset + size, rounded up, plus a flag page].
        #[arg(long)]
        region_size: Option<u64>,
        /// Pattern seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Store this value into the flag word after the doorbell.
        #[arg(long)]
        flag: Option<u64>,
        /// Do not attach the region for transmit (the DMA must be refused).
        #[arg(long)]
        no_attach: bool,
        /// Only attach the region for transmit and hold it (no DMA).
        #[arg(long)]
        attach_only: bool,
        /// Keep holding the region this many seconds afterwards.
        #[arg(long, default_value_t = 0)]
        hold: u64,
    },
    /// Through imcd: land region KEY in a DMA source area and wait for a pattern.
    ///
    /// Allocates region KEY (SIZE bytes of data and a flag
    /// page), opens a DMA source area and lands the region in it at OFFSET
    /// (imcd's DmaLand), then wait until the SIZE bytes there read the
    /// pattern of SEED, as another node sends them (`imc-dma`).
    ImcDmaLand {
        /// Region key.
        #[arg(long)]
        key: u64,
        /// Bytes of data.
        #[arg(long)]
        size: u64,
        /// Byte of the DMA area where the region lands.
        #[arg(long, default_value_t = 0)]
        offset: u64,
        /// Bytes of DMA area [default: the offset plus the region].
        #[arg(long)]
        area: Option<u64>,
        /// Pattern seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Find the region without allocating it (imcd must refuse).
        #[arg(long)]
        find_only: bool,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 60)]
        timeout: u64,
    },
    /// Through imcd: wait until SIZE bytes of region KEY read a pattern.
    ///
    /// Attaches region KEY for receive and waits until SIZE
    /// bytes at OFFSET read the pattern of SEED (with --flag V: wait for
    /// the flag, then check the data once; with --expect-zero: wait
    /// TIMEOUT seconds and check nothing was written).
    ImcDmaCheck {
        /// Region key.
        #[arg(long)]
        key: u64,
        /// Bytes to check.
        #[arg(long)]
        size: u64,
        /// Byte offset in the region.
        #[arg(long, default_value_t = 0)]
        offset: u64,
        /// Pattern seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Wait for this flag value first.
        #[arg(long)]
        flag: Option<u64>,
        /// Check that the bytes stay zero.
        #[arg(long)]
        expect_zero: bool,
        /// Give up (or, with --expect-zero, stop watching) after this many seconds.
        #[arg(long, default_value_t = 60)]
        timeout: u64,
    },
    /// The memory-copy floor through QEMU ivshmem.
    ///
    /// For each size, a copy
    /// into the shared memory and one out of it, as a sender and a
    /// receiver over shared memory would make, timed in this guest with
    /// nothing between them (needs `[guest] ivshmem = true`).
    IvshmemFloor {
        /// Message sizes in bytes, comma-separated.
        #[arg(long, default_value = "4096,65536,262144,1048576,4194304", value_delimiter = ',')]
        sizes: Vec<usize>,
        /// Bytes to move per size (at least 3 messages).
        #[arg(long, default_value_t = 64 << 20)]
        volume: usize,
    },
    /// Bandwidth between two nodes through imcd: transmit DMA against stores.
    ///
    /// Through imcd's regions: transmit DMA against stores through the
    /// transmit window (start --role recv on the other node first).
    ImcDmaBench {
        /// send or recv.
        #[arg(long, value_enum)]
        role: dma::Role,
        /// dma, store or both.
        #[arg(long, value_enum, default_value = "both")]
        via: dma::Via,
        /// Region key (acknowledgements in KEY + 1).
        #[arg(long, default_value_t = 7700)]
        key: u64,
        /// Transfer sizes in bytes, comma-separated.
        #[arg(long, default_value = "4096,16384,65536,262144,1048576,4194304", value_delimiter = ',')]
        sizes: Vec<u64>,
        /// Seconds per size (at least two transfers).
        #[arg(long, default_value_t = 2.0)]
        secs: f64,
        /// Give up after this many seconds without progress.
        #[arg(long, default_value_t = 120)]
        timeout: u64,
    },
    /// Through imcd: wait until every word of region KEY reads VALUE.
    ///
    /// Allocates region KEY and attaches it for receive (libimc).
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
    /// Raw: a counter incremented under a cluster spinlock on NODES nodes.
    ///
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
    /// Round trips of 8-byte values between two nodes.
    ///
    /// `pong` on one (it echoes), then `ping` on the other (it measures; one
    /// way = RTT / 2).
    /// Over MEMORY CHANNEL (stores into the transmit window, polled receive
    /// memory), TCP (the cluster LAN) or ivshmem (shared memory, polled).
    Pingpong {
        /// ping (measures) or pong (echoes).
        #[arg(long, value_enum)]
        role: PingRole,
        /// The wire.
        #[arg(long, value_enum, default_value_t = Via::Mc)]
        via: Via,
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
    /// Store ordering between two nodes: a block, then its flag.
    ///
    /// `checker` on one, then `writer` on
    /// the other. For every block size the writer stores, round after round,
    /// a block whose words all hold the round number and then a flag word
    /// right after it holding the round number; the checker polls the flags
    /// and fails if it ever sees a block word below the flag it read first.
    OrderTest {
        /// writer (stores) or checker (polls and checks).
        #[arg(long, value_enum)]
        role: OrderRole,
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

/// The two ends of `pingpong`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum PingRole {
    /// Measures.
    Ping,
    /// Echoes.
    Pong,
}

/// What `pingpong` runs over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Via {
    /// Stores into the transmit window, polled receive memory.
    Mc,
    /// TCP over the cluster LAN.
    Tcp,
    /// ivshmem shared memory, polled.
    Ivshmem,
}

/// The two ends of `order-test`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum OrderRole {
    /// Stores blocks, then flags.
    Writer,
    /// Polls the flags and checks the blocks.
    Checker,
}

fn main() -> std::process::ExitCode {
    testkit::exit::run_main(run)
}

fn run() -> Result<()> {
    let cli = Cli::parse();
    if let Some(uid) = cli.uid {
        let gid = cli.gid.unwrap_or(uid);
        // SAFETY: plain syscalls; group first, while we still may.
        if unsafe { libc::setgid(gid) } != 0 || unsafe { libc::setuid(uid) } != 0 {
            bail!("cannot become uid {uid} gid {gid}: {}", std::io::Error::last_os_error());
        }
    }
    match cli.cmd {
        Cmd::Conform { scenario } => conform::run(scenario),
        Cmd::Info { json } => raw::info(json),
        Cmd::Rx { pages, buffer, foreground } => raw::rx(&pages, &buffer, foreground),
        Cmd::Stop => raw::stop(),
        Cmd::NotifyWait { page, timeout } => raw::notify_wait(page, timeout),
        Cmd::Ack { page, timeout } => raw::ack(page, timeout),
        Cmd::ClearErrors => raw::clear_errors(),
        Cmd::LockTest { nodes, rounds, page, timeout } => raw::lock_test(nodes, rounds, page, timeout),
        Cmd::Fill { page, seed } => raw::fill(page, seed),
        Cmd::Pattern { page, seed } => {
            std::io::stdout().write_all(&pattern(seed, page, PAGE_SIZE as usize))?;
            Ok(())
        }
        Cmd::Poke { page, offset, value } => raw::poke(page, offset, value),
        Cmd::Wait { page, offset, value, timeout, buffer } => raw::wait(page, offset, value, timeout, &buffer),
        Cmd::Dump { page, buffer } => raw::dump(page, &buffer),
        Cmd::BenchTx { page, stores, stride } => raw::bench_tx(page, stores, stride),
        Cmd::ImcLockTest { key, procs, rounds, total, timeout } => {
            imc::imc_lock_test(key, procs, rounds, total, timeout)
        }
        Cmd::ImcKill { host, pid, sig } => imc::kill(&host, pid, sig),
        Cmd::Soak { nodes, incarnation, status, stop, seconds, rate } => {
            soak::run(soak::Opts { nodes, incarnation, status, stop, seconds, rate })
        }
        Cmd::WaitSignal { timeout } => signals::wait_signal(timeout),
        Cmd::ImcDrill { id } => imc::drill(id),
        Cmd::ImcCheckErrors { seconds } => imc::check_errors(seconds),
        Cmd::ImcAlloc { key, mode, size, coherent, hold } => imc::alloc(key, &mode, size, coherent, hold),
        Cmd::ImcHosts => imc::hosts(),
        Cmd::ImcPut { key, size, value } => imc::put(key, size, value),
        Cmd::ImcGet { key, size, value, timeout } => imc::get(key, size, value, timeout),
        Cmd::ImcDma { key, size, offset, region_size, seed, flag, no_attach, attach_only, hold } => {
            dma::send(dma::SendArgs { key, size, offset, region_size, seed, flag, no_attach, attach_only, hold })
        }
        Cmd::ImcDmaLand { key, size, offset, area, seed, find_only, timeout } => {
            dma::land(dma::LandArgs { key, size, offset, area, seed, find_only, timeout })
        }
        Cmd::ImcDmaCheck { key, size, offset, seed, flag, expect_zero, timeout } => {
            dma::check(key, size, offset, seed, flag, expect_zero, timeout)
        }
        Cmd::ImcDmaBench { role, via, key, sizes, secs, timeout } => dma::bench(role, via, key, &sizes, secs, timeout),
        Cmd::IvshmemFloor { sizes, volume } => floor::floor(&sizes, volume),
        Cmd::Pingpong { role, via, rounds, warmup, ping_page, pong_page, peer, port, samples, timeout } => {
            pingpong::pingpong(pingpong::PingpongArgs {
                role,
                via,
                rounds,
                warmup,
                ping_page,
                pong_page,
                peer,
                port,
                samples,
                timeout,
            })
        }
        Cmd::OrderTest { role, sizes, rounds, page, timeout } => {
            order::order_test(role, &sizes, &rounds, page, timeout)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_are_checked_by_the_parser() {
        let cli = Cli::try_parse_from(["mctool", "pingpong", "--role", "pong", "--via", "tcp"]).unwrap();
        assert!(matches!(cli.cmd, Cmd::Pingpong { role: PingRole::Pong, via: Via::Tcp, .. }));
        let e = Cli::try_parse_from(["mctool", "pingpong", "--role", "reader"]).err().unwrap().to_string();
        assert!(e.contains("ping") && e.contains("pong"), "{e}");
        let e = Cli::try_parse_from(["mctool", "order-test", "--role", "reader"]).err().unwrap().to_string();
        assert!(e.contains("writer") && e.contains("checker"), "{e}");
        assert!(matches!(Cli::try_parse_from(["mctool", "info", "--json"]).unwrap().cmd, Cmd::Info { json: true }));
        let floor = Cli::try_parse_from(["mctool", "ivshmem-floor", "--sizes", "4096,1048576"]).unwrap().cmd;
        assert!(
            matches!(floor, Cmd::IvshmemFloor { ref sizes, volume } if sizes == &[4096, 1048576] && volume == 64 << 20)
        );
    }
}
