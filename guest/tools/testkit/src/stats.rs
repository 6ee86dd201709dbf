//! Latency statistics from raw samples: sorted, nearest-rank percentiles.
//!
//! Every measuring tool in the guest (`mctool pingpong` over each wire,
//! `mctool lock-test`, `imc-bench`) reports through [`Summary`], so a p99
//! means the same thing everywhere: the smallest sample that at least 99 %
//! of the samples do not exceed.

use std::time::Duration;

/// The nearest-rank percentile of `sorted` (ascending), in parts per
/// thousand (`500` is the median, `990` p99, `999` p99.9): the sample of
/// rank ⌈per_mille × n / 1000⌉. `None` for no samples or `per_mille` outside
/// 1..=1000. Integer ranks, so p99.9 of 2000 samples is exactly the 1998th.
pub fn nearest_rank<T: Copy>(sorted: &[T], per_mille: u32) -> Option<T> {
    if sorted.is_empty() || !(1..=1000).contains(&per_mille) {
        return None;
    }
    let rank = (per_mille as usize * sorted.len()).div_ceil(1000);
    Some(sorted[rank.max(1) - 1])
}

/// Percentiles and extremes of a set of durations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// Samples.
    pub n: usize,
    /// Smallest.
    pub min: Duration,
    /// Median (nearest rank).
    pub p50: Duration,
    /// 99th percentile (nearest rank).
    pub p99: Duration,
    /// 99.9th percentile (nearest rank).
    pub p999: Duration,
    /// Largest.
    pub max: Duration,
}

impl Summary {
    /// Sorts `samples` in place and summarizes them; `None` when empty.
    pub fn of(samples: &mut [Duration]) -> Option<Summary> {
        samples.sort_unstable();
        let q = |pm| nearest_rank(samples, pm);
        Some(Summary {
            n: samples.len(),
            min: *samples.first()?,
            p50: q(500)?,
            p99: q(990)?,
            p999: q(999)?,
            max: *samples.last()?,
        })
    }

    /// Every figure divided by `d` (a round trip's summary halved is the
    /// one-way summary: halving keeps the order of the samples).
    pub fn div(&self, d: u32) -> Summary {
        Summary {
            n: self.n,
            min: self.min / d,
            p50: self.p50 / d,
            p99: self.p99 / d,
            p999: self.p999 / d,
            max: self.max / d,
        }
    }

    /// `PREFIX_min_us=… PREFIX_p50_us=… PREFIX_p99_us=… PREFIX_p999_us=… PREFIX_max_us=…`,
    /// in microseconds with two decimals (for scripts to pick up).
    pub fn fields(&self, prefix: &str) -> String {
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        format!(
            "{prefix}_min_us={:.2} {prefix}_p50_us={:.2} {prefix}_p99_us={:.2} {prefix}_p999_us={:.2} {prefix}_max_us={:.2}",
            us(self.min),
            us(self.p50),
            us(self.p99),
            us(self.p999),
            us(self.max)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_by_definition() {
        let v: Vec<u32> = (1..=1000).collect();
        assert_eq!(nearest_rank(&v, 500), Some(500));
        assert_eq!(nearest_rank(&v, 990), Some(990));
        assert_eq!(nearest_rank(&v, 999), Some(999));
        assert_eq!(nearest_rank(&v, 1000), Some(1000));
        assert_eq!(nearest_rank(&v, 1), Some(1));
        let v: Vec<u32> = (1..=2000).collect();
        assert_eq!(nearest_rank(&v, 999), Some(1998));
        // Fewer samples than the percentile resolves: the top sample.
        let v = [10, 20, 30];
        assert_eq!(nearest_rank(&v, 500), Some(20));
        assert_eq!(nearest_rank(&v, 990), Some(30));
        assert_eq!(nearest_rank(&[7], 999), Some(7));
    }

    #[test]
    fn nearest_rank_rejects_nonsense() {
        assert_eq!(nearest_rank::<u32>(&[], 500), None);
        assert_eq!(nearest_rank(&[1], 0), None);
        assert_eq!(nearest_rank(&[1], 1001), None);
    }

    #[test]
    fn summary_sorts_and_halves() {
        let mut s: Vec<Duration> = (1..=1000).rev().map(|us| Duration::from_micros(us * 2)).collect();
        let rtt = Summary::of(&mut s).unwrap();
        assert_eq!((rtt.n, rtt.min, rtt.max), (1000, Duration::from_micros(2), Duration::from_micros(2000)));
        assert_eq!(rtt.p50, Duration::from_micros(1000));
        let one_way = rtt.div(2);
        assert_eq!(one_way.p99, Duration::from_micros(990));
        assert_eq!(one_way.p999, Duration::from_micros(999));
        assert!(one_way.fields("one_way").contains("one_way_p999_us=999.00"), "{}", one_way.fields("one_way"));
        assert_eq!(Summary::of(&mut []), None);
    }
}
