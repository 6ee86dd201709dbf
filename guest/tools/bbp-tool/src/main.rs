//! `bbp-tool`: BBP from a shell, for tests and measurements. Every rank of
//! a job runs it (under our `mpiexec`, which sets rank, size and job).
//!
//! - `check`: pingpong between rank 0 and every other rank, multicast to
//!   every subset, barriers; contents checked;
//! - `barrier`: barriers, each checked: a message sent before a barrier
//!   is there after it;
//! - `stream`: rank 0 streams messages (point-to-point and multicast) to
//!   the others, who check every byte (the fault test's workload);
//! - `bench`: the paper's Figures 1, 4 and 6 as `BENCH <series> <x>
//!   <value> <unit>` lines on stdout (rank 0), progress on stderr.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use bbp::{Bbp, Options};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "The Billboard Protocol from a shell (run every rank under mpiexec)")]
struct Cli {
    /// Rank (default: mpiexec's MCMPI_RANK).
    #[arg(long, global = true)]
    rank: Option<usize>,
    /// Processes (default: MCMPI_SIZE).
    #[arg(long, global = true)]
    nprocs: Option<usize>,
    /// Job (default: MCMPI_JOB).
    #[arg(long, global = true)]
    job: Option<u64>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Pingpong between rank 0 and every other rank, multicast to every
    /// subset of the ranks, barriers; contents checked.
    Check {
        /// Rounds of the whole check.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
    },
    /// Barriers; before each, every rank sends its right neighbour the
    /// barrier's number, which must be there right after it.
    Barrier {
        /// Barriers.
        #[arg(long, default_value_t = 100)]
        rounds: usize,
    },
    /// Rank 0 streams messages to the others (every other one multicast to
    /// all), of sizes up to --max; receivers check every byte.
    Stream {
        /// Messages.
        #[arg(long, default_value_t = 2000)]
        count: usize,
        /// Largest message.
        #[arg(long, default_value_t = 4096)]
        max: usize,
    },
    /// The paper's Figures 1, 4 and 6: BENCH lines on rank 0's stdout.
    Bench {
        /// Round trips per point.
        #[arg(long, default_value_t = 200)]
        iters: usize,
        /// Message sizes (bytes) of the one-way and broadcast series.
        #[arg(long, default_value = "4,16,64,256,1024,4096")]
        sizes: String,
    },
}

/// A message whose bytes say who sent it, which it is and how long it is.
fn pattern(from: usize, tag: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (from * 131 + tag * 17 + i * 7 + len) as u8).collect()
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let mut ep = bbp::init(Options { rank: cli.rank, nprocs: cli.nprocs, job: cli.job, ..Options::default() })
        .context("bbp_init")?;
    let r = match cli.cmd {
        Cmd::Check { rounds } => check(&mut ep, rounds),
        Cmd::Barrier { rounds } => barrier(&mut ep, rounds),
        Cmd::Stream { count, max } => stream(&mut ep, count, max),
        Cmd::Bench { iters, sizes } => bench(&mut ep, iters, &sizes),
    };
    let s = ep.stats;
    eprintln!(
        "rank {}: sent {} received {} collected {} reposts {} not-intact {}",
        ep.rank(),
        s.sent,
        s.received,
        s.collected,
        s.reposts,
        s.not_intact
    );
    r?;
    ep.finalize(Duration::from_secs(20)).context("bbp_finalize")?;
    Ok(())
}

fn recv_checked(ep: &mut Bbp, from: usize, want: &[u8], what: &str) -> Result<()> {
    let mut buf = vec![0u8; ep.max_message()];
    let got = ep.recv(Some(from as i64), &mut buf).with_context(|| format!("receiving {what}"))?;
    ensure!(
        got.from == from && got.len == want.len(),
        "{what}: {} bytes from {}, expected {}",
        got.len,
        got.from,
        want.len()
    );
    ensure!(buf[..got.len] == *want, "{what}: contents differ");
    Ok(())
}

fn check(ep: &mut Bbp, rounds: usize) -> Result<()> {
    let (me, n) = (ep.rank(), ep.nprocs());
    ensure!(n >= 2, "check needs 2 ranks or more");
    for round in 0..rounds {
        for other in 1..n {
            for len in [0usize, 1, 4, 9, 100, 4096] {
                let tag = round * 1000 + other * 10 + len % 10;
                if me == 0 {
                    ep.send(other as i64, &pattern(0, tag, len))?;
                    recv_checked(ep, other, &pattern(other, tag, len), "pong")?;
                } else if me == other {
                    recv_checked(ep, 0, &pattern(0, tag, len), "ping")?;
                    ep.send(0, &pattern(me, tag, len))?;
                }
            }
        }
        // Each rank multicasts to every nonempty subset of the others.
        let subsets = 1usize << (n - 1);
        for s in 0..n {
            let others: Vec<usize> = (0..n).filter(|&r| r != s).collect();
            for bits in 1..subsets {
                let list: Vec<usize> = (0..n - 1).filter(|i| bits & 1 << i != 0).map(|i| others[i]).collect();
                let msg = pattern(s, round * 100 + bits, 8 + bits * 3);
                if me == s {
                    let l: Vec<i64> = list.iter().map(|&r| r as i64).collect();
                    ep.mcast(Some(&l), &msg)?;
                } else if list.contains(&me) {
                    recv_checked(ep, s, &msg, &format!("multicast from {s} to {list:?}"))?;
                }
            }
        }
        ensure!(!ep.msgavail(None)?, "a message nobody sent");
        ep.barrier()?;
        eprintln!("rank {me}: round {round} checked");
    }
    println!("OK rank {me} of {n}: pingpong, multicast to every subset, barrier, {rounds} rounds");
    Ok(())
}

fn barrier(ep: &mut Bbp, rounds: usize) -> Result<()> {
    let (me, n) = (ep.rank(), ep.nprocs());
    let (right, left) = ((me + 1) % n, (me + n - 1) % n);
    let mut times = Vec::with_capacity(rounds);
    for k in 0..rounds {
        if n > 1 {
            ep.send(right as i64, &(k as u64).to_le_bytes())?;
        }
        let t0 = Instant::now();
        ep.barrier().with_context(|| format!("barrier {k}"))?;
        times.push(t0.elapsed());
        if n > 1 {
            ensure!(ep.msgavail(Some(left as i64))?, "barrier {k}: the message rank {left} sent before it is not here");
            let mut b = [0u8; 8];
            ep.recv(Some(left as i64), &mut b)?;
            ensure!(u64::from_le_bytes(b) == k as u64, "barrier {k}: got {} from {left}", u64::from_le_bytes(b));
        }
    }
    times.sort();
    println!("OK rank {me} of {n}: {rounds} barriers, median {:.1} us", us(times[rounds / 2]));
    Ok(())
}

fn stream(ep: &mut Bbp, count: usize, max: usize) -> Result<()> {
    let (me, n) = (ep.rank(), ep.nprocs());
    ensure!(n >= 2 && max <= ep.max_message(), "stream needs 2 ranks and --max ≤ {}", ep.max_message());
    let size = |k: usize| 1 + k * 997 % max;
    // Message k goes to rank 1 + k/2 % (n-1) when k is even, to all when odd.
    let to = |k: usize| if k % 2 == 1 { None } else { Some(1 + k / 2 % (n - 1)) };
    let t0 = Instant::now();
    if me == 0 {
        for k in 0..count {
            let msg = pattern(0, k, size(k));
            match to(k) {
                Some(r) => ep.send(r as i64, &msg),
                None => ep.mcast(None, &msg),
            }
            .with_context(|| format!("sending message {k}"))?;
            if k % 500 == 0 {
                eprintln!("rank 0: {k} sent");
            }
        }
    } else {
        let mut got = 0;
        for k in (0..count).filter(|&k| to(k).is_none_or(|r| r == me)) {
            recv_checked(ep, 0, &pattern(0, k, size(k)), &format!("message {k}"))?;
            got += 1;
        }
        println!("OK rank {me}: {got} messages intact in {:.1} s", t0.elapsed().as_secs_f64());
    }
    ep.barrier()?;
    Ok(())
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn parse_sizes(s: &str) -> Result<Vec<usize>> {
    s.split(',').map(|x| x.trim().parse().with_context(|| format!("size {x:?}"))).collect()
}

fn bench(ep: &mut Bbp, iters: usize, sizes: &str) -> Result<()> {
    let (me, n) = (ep.rank(), ep.nprocs());
    let sizes = parse_sizes(sizes)?;
    ensure!(n >= 2, "bench needs 2 ranks or more");
    ensure!(iters >= 1, "--iters must be at least 1");
    if let Some(&s) = sizes.iter().find(|&&s| s > ep.max_message()) {
        bail!("size {s} is larger than a message can be ({})", ep.max_message());
    }
    let mut buf = vec![0u8; ep.max_message()];
    let warm = iters / 10 + 1;
    // Figure 1: one-way time (half a round trip) between ranks 0 and 1.
    ep.barrier()?;
    for &len in &sizes {
        let msg = pattern(me, len, len);
        let mut times = Vec::with_capacity(iters);
        for i in 0..warm + iters {
            let t0 = Instant::now();
            if me == 0 {
                ep.send(1, &msg)?;
                ep.recv(Some(1), &mut buf)?;
            } else if me == 1 {
                ep.recv(Some(0), &mut buf)?;
                ep.send(0, &msg)?;
            }
            if i >= warm {
                times.push(t0.elapsed());
            }
        }
        if me == 0 {
            println!("BENCH bbp-oneway {len} {:.2} us", us(median(times)) / 2.0);
            eprintln!("bbp-oneway {len} done");
        }
    }
    ep.barrier()?;
    // Figure 4: a message to one rank, and to all, until the last
    // receiver has it: rank 0 sends, each receiver answers with a null
    // message, rank 0 stops the clock at the last answer.
    for (series, dests) in
        [("bbp-p2p", vec![1usize]), (if n == 4 { "bbp-bcast4" } else { "bbp-bcast" }, (1..n).collect())]
    {
        for &len in &sizes {
            let msg = pattern(0, len, len);
            let mut times = Vec::with_capacity(iters);
            for i in 0..warm + iters {
                let t0 = Instant::now();
                if me == 0 {
                    if dests.len() == 1 {
                        ep.send(dests[0] as i64, &msg)?;
                    } else {
                        ep.mcast(None, &msg)?;
                    }
                    for &d in &dests {
                        ep.recv(Some(d as i64), &mut buf)?;
                    }
                } else if dests.contains(&me) {
                    ep.recv(Some(0), &mut buf)?;
                    ep.send(0, &[])?;
                }
                if i >= warm {
                    times.push(t0.elapsed());
                }
            }
            if me == 0 {
                println!("BENCH {series} {len} {:.2} us", us(median(times)));
                eprintln!("{series} {len} done");
            }
            ep.barrier()?;
        }
    }
    // Figure 6: barriers among the first k ranks.
    for k in 2..=n {
        let group: Vec<usize> = (0..k).collect();
        if me < k {
            let mut times = Vec::with_capacity(iters);
            for i in 0..warm + iters {
                let t0 = Instant::now();
                ep.barrier_group(&group)?;
                if i >= warm {
                    times.push(t0.elapsed());
                }
            }
            if me == 0 {
                println!("BENCH bbp-barrier {k} {:.2} us", us(median(times)));
                eprintln!("bbp-barrier {k} done");
            }
        }
        ep.barrier()?;
    }
    Ok(())
}
