//! `mctool order-test`: store ordering between two nodes (a writer stores
//! blocks then flags; a checker fails if it ever sees a block word older
//! than the flag it read).

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use guest_driver::Adapter;
use regs::{reg, PAGE_SIZE};

use crate::raw::{disable_rx, load64, setup_rx, tx_page};
use crate::OrderRole;

/// One block size of `order-test`: the block at global address `base` (page
/// `page`), the flag word right after it at `base + size`.
pub(crate) struct OrderSize {
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
pub(crate) fn order_plan(sizes: &str, rounds: &str, first_page: u64) -> Result<Vec<OrderSize>> {
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

pub(crate) fn order_test(role: OrderRole, sizes: &str, rounds: &str, first_page: u64, timeout: u64) -> Result<()> {
    let plan = order_plan(sizes, rounds, first_page)?;
    let pages: Vec<u64> = plan.iter().flat_map(|s| [s.page, s.page + 1]).collect();
    if role == OrderRole::Writer {
        order_writer(&plan, &pages)
    } else {
        order_checker(&plan, &pages, Duration::from_secs(timeout))
    }
}

/// Size after size, `rounds` times: every word of the block gets the round
/// number (8-byte stores in address order), then the flag does.
pub(crate) fn order_writer(plan: &[OrderSize], pages: &[u64]) -> Result<()> {
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
pub(crate) struct OrderSeen {
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
pub(crate) fn order_checker(plan: &[OrderSize], pages: &[u64], limit: Duration) -> Result<()> {
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
            let f = load64(&buf, s.flag() as usize);
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
                let v = load64(&buf, (s.base + off) as usize);
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
        if spins % 1024 == 0 && t0.elapsed() > limit {
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
    }
}
