//! What a launcher (`mpiexec` in a guest, `mc-cluster mpirun` on the host)
//! hands each rank, in its environment, and the UMP handles ranks derive
//! from it. Read once by `MPI_Init` on the application's thread.
//!
//! | variable      | meaning                                        |
//! |---------------|------------------------------------------------|
//! | `MCMPI_JOB`   | job id, decimal, 1 to 2^32-1, unique per launch |
//! | `MCMPI_RANK`  | this process's rank in `MPI_COMM_WORLD`         |
//! | `MCMPI_SIZE`  | the number of ranks                             |
//!
//! A program started without them is a singleton: rank 0 of 1.
//!
//! Also how big the rank's UMP rings are ([`ump_config`]): MEMORY
//! CHANNEL rings are sized from the job, since a rendezvous streams one
//! ring-full per round trip of the reader's index.

use thiserror::Error;

/// The largest job the handle encoding leaves room for.
pub const MAX_RANKS: u32 = 1 << 16;

/// High bits of every MPI rank's UMP handle ("MP"), apart from other UMP
/// users' handles.
pub const HANDLE_TAG: u64 = 0x4D50 << 48;

/// A bad launch environment.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum LaunchError {
    /// A variable is not a number in range.
    #[error("{var}={value:?}: {why}")]
    Bad {
        /// The variable.
        var: &'static str,
        /// What it held.
        value: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// Some of the variables are set and some not.
    #[error("MCMPI_JOB, MCMPI_RANK and MCMPI_SIZE must be set together (missing {0})")]
    Partial(&'static str),
}

/// This process's place in its job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    /// Job id (0 for a singleton).
    pub job: u32,
    /// Rank in `MPI_COMM_WORLD`.
    pub rank: u32,
    /// Ranks in `MPI_COMM_WORLD`.
    pub size: u32,
}

impl Place {
    /// From the environment (see the module header).
    pub fn from_env() -> Result<Place, LaunchError> {
        Place::from_vars(|v| std::env::var(v).ok())
    }

    /// From variables looked up by `var`.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Place, LaunchError> {
        let names = ["MCMPI_JOB", "MCMPI_RANK", "MCMPI_SIZE"];
        let vals: Vec<Option<String>> = names.iter().map(|n| var(n)).collect();
        if vals.iter().all(Option::is_none) {
            return Ok(Place { job: 0, rank: 0, size: 1 });
        }
        if let Some(i) = vals.iter().position(Option::is_none) {
            return Err(LaunchError::Partial(names[i]));
        }
        let num = |i: usize| -> Result<u32, LaunchError> {
            let value = vals[i].clone().unwrap_or_default();
            value.trim().parse::<u32>().map_err(|_| LaunchError::Bad { var: names[i], value, why: "not a number" })
        };
        let (job, rank, size) = (num(0)?, num(1)?, num(2)?);
        let bad = |i: usize, why| LaunchError::Bad { var: names[i], value: vals[i].clone().unwrap_or_default(), why };
        if job == 0 {
            return Err(bad(0, "job 0 is the singleton's"));
        }
        if size == 0 || size > MAX_RANKS {
            return Err(bad(2, "must be 1 to 65536"));
        }
        if rank >= size {
            return Err(bad(1, "must be below MCMPI_SIZE"));
        }
        Ok(Place { job, rank, size })
    }

    /// The UMP handle of rank `rank` of this job.
    pub fn handle(&self, rank: u32) -> u64 {
        HANDLE_TAG | (self.job as u64) << 16 | rank as u64
    }
}

/// MEMORY CHANNEL ring bytes a rank may spread over its channels when
/// `UMP_MC_BUFFER` does not say (`MCMPI_MC_RINGS` changes it).
pub const MC_RINGS_DEFAULT: usize = 4 << 20;
/// The largest MEMORY CHANNEL ring MPI picks by itself: larger ones
/// measured no faster (NPmpi at 1 MiB: 217 MB/s with 1 MiB, 184 with 4 MiB).
pub const MC_RING_MAX: usize = 1 << 20;
/// The smallest (UMP's own default, the paper's 32 KiB).
pub const MC_RING_MIN: usize = 32 << 10;

/// Bytes of zero-copy memory a rank has for `MPI_Alloc_mem`
/// (`MCMPI_ALLOC_MEM`, a multiple of 8 KiB up to 8 MiB; 0 turns zero copy
/// off): what UMP keeps spare in its DMA source area.
pub fn alloc_mem_bytes(var: impl Fn(&str) -> Option<String>) -> Result<usize, ump::ConfigError> {
    let Some(s) = var("MCMPI_ALLOC_MEM") else { return Ok(crate::zcopy::ALLOC_MEM_DEFAULT) };
    match ump::parse_size(&s) {
        Some(n) if n <= ump::DMA_SPARE_MAX && n % 8192 == 0 => Ok(n),
        _ => Err(ump::ConfigError(format!(
            "MCMPI_ALLOC_MEM={s:?}: a size up to {}M in whole 8K pages, like 4M (0: no zero copy)",
            ump::DMA_SPARE_MAX >> 20
        ))),
    }
}

/// The UMP configuration of a rank of a job of `size` ranks, from the
/// variables `var` gives: UMP's own (`UMP_*`, which win), else MEMORY
/// CHANNEL rings of `MCMPI_MC_RINGS` (default 4 MiB) shared among the
/// other ranks, a power of two from 32 KiB to 1 MiB, room for a
/// channel to every other rank, and [`alloc_mem_bytes`] of spare DMA
/// memory.
pub fn ump_config(size: u32, var: impl Fn(&str) -> Option<String>) -> Result<ump::Config, ump::ConfigError> {
    let mut c = ump::Config::from_vars(&var)?;
    let peers = (size as usize).saturating_sub(1).max(1);
    if var("UMP_MC_BUFFER").is_none() {
        let budget = match var("MCMPI_MC_RINGS") {
            Some(s) => {
                ump::parse_size(&s).ok_or_else(|| ump::ConfigError(format!("MCMPI_MC_RINGS={s:?}: a size like 4M")))?
            }
            None => MC_RINGS_DEFAULT,
        };
        let share = (budget / peers).clamp(MC_RING_MIN, MC_RING_MAX);
        // The largest power of two not above the share.
        c.mc_buffer = 1 << (usize::BITS - 1 - share.leading_zeros());
    }
    if var("UMP_MAX_CHANNELS").is_none() {
        c.max_channels = c.max_channels.max(peers + 8);
    }
    if var("UMP_DMA_SPARE").is_none() {
        c.dma_spare = alloc_mem_bytes(&var)?;
    }
    c.check()?;
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(size: u32, vars: &[(&str, &str)]) -> Result<ump::Config, ump::ConfigError> {
        ump_config(size, |n| vars.iter().find(|(k, _)| *k == n).map(|(_, v)| v.to_string()))
    }

    #[test]
    fn mc_rings_are_sized_from_the_job_unless_ump_says() {
        assert_eq!(cfg(2, &[]).unwrap().mc_buffer, 1 << 20);
        assert_eq!(cfg(5, &[]).unwrap().mc_buffer, 1 << 20);
        assert_eq!(cfg(8, &[]).unwrap().mc_buffer, 512 << 10, "4 MiB / 7 = 585 KiB, down to 512");
        assert_eq!(cfg(16, &[]).unwrap().mc_buffer, 256 << 10);
        assert_eq!(cfg(1000, &[]).unwrap().mc_buffer, 32 << 10, "never below 32 KiB");
        assert_eq!(cfg(8, &[("MCMPI_MC_RINGS", "64M")]).unwrap().mc_buffer, 1 << 20, "never above 1 MiB");
        assert_eq!(cfg(3, &[("MCMPI_MC_RINGS", "256K")]).unwrap().mc_buffer, 128 << 10);
        assert_eq!(cfg(16, &[("UMP_MC_BUFFER", "64K")]).unwrap().mc_buffer, 64 << 10, "UMP's variable wins");
        assert!(cfg(4, &[("MCMPI_MC_RINGS", "lots")]).unwrap_err().0.contains("MCMPI_MC_RINGS"));
        assert!(cfg(4, &[("UMP_MC_BUFFER", "1")]).is_err());
        assert_eq!(cfg(200, &[]).unwrap().max_channels, 207, "a channel to every other rank");
        assert_eq!(cfg(200, &[("UMP_MAX_CHANNELS", "300")]).unwrap().max_channels, 300);
        assert_eq!(cfg(4, &[]).unwrap().max_channels, ump::Config::default().max_channels);
    }

    #[test]
    fn zero_copy_memory_is_ump_spare_unless_ump_says() {
        assert_eq!(cfg(4, &[]).unwrap().dma_spare, crate::zcopy::ALLOC_MEM_DEFAULT);
        assert_eq!(cfg(4, &[("MCMPI_ALLOC_MEM", "2M")]).unwrap().dma_spare, 2 << 20);
        assert_eq!(cfg(4, &[("MCMPI_ALLOC_MEM", "0")]).unwrap().dma_spare, 0, "off");
        assert_eq!(cfg(4, &[("MCMPI_ALLOC_MEM", "2M"), ("UMP_DMA_SPARE", "1M")]).unwrap().dma_spare, 1 << 20);
        for bad in ["9M", "100", "much"] {
            assert!(cfg(4, &[("MCMPI_ALLOC_MEM", bad)]).unwrap_err().0.contains("MCMPI_ALLOC_MEM"), "{bad}");
        }
    }

    fn place(vars: &[(&str, &str)]) -> Result<Place, LaunchError> {
        Place::from_vars(|n| vars.iter().find(|(k, _)| *k == n).map(|(_, v)| v.to_string()))
    }

    #[test]
    fn singleton_partial_and_bad_values() {
        assert_eq!(place(&[]), Ok(Place { job: 0, rank: 0, size: 1 }));
        let p = place(&[("MCMPI_JOB", "7"), ("MCMPI_RANK", "3"), ("MCMPI_SIZE", "4")]).unwrap();
        assert_eq!((p.job, p.rank, p.size), (7, 3, 4));
        assert_eq!(p.handle(3), 0x4D50_0000_0007_0003);
        assert_eq!(place(&[("MCMPI_JOB", "7")]), Err(LaunchError::Partial("MCMPI_RANK")));
        assert!(matches!(
            place(&[("MCMPI_JOB", "7"), ("MCMPI_RANK", "4"), ("MCMPI_SIZE", "4")]),
            Err(LaunchError::Bad { var: "MCMPI_RANK", .. })
        ));
        assert!(matches!(
            place(&[("MCMPI_JOB", "x"), ("MCMPI_RANK", "0"), ("MCMPI_SIZE", "1")]),
            Err(LaunchError::Bad { var: "MCMPI_JOB", .. })
        ));
    }
}
