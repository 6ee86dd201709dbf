//! What a launcher (`mpiexec` in a guest, `mc-cluster mpirun` on the host)
//! hands each rank, in its environment, and the UMP handles ranks derive
//! from it. Read once by `MPI_Init` on the application's thread.
//!
//! | variable      | meaning                                        |
//! |---------------|------------------------------------------------|
//! | `MCMPI_JOB`   | job id, decimal, 1 to 2^32-1, unique per launch |
//! | `MCMPI_RANK`  | this process's rank in `MPI_COMM_WORLD`         |
//! | `MCMPI_SIZE`  | the number of ranks                             |
//! | `MCMPI_LOCAL_SIZE` | ranks of the job on this guest (optional, default 1) |
//!
//! A program started without them is a singleton: rank 0 of 1.
//!
//! Also how big the rank's UMP rings are ([`ump_config`]): MEMORY
//! CHANNEL rings are sized from the job, since a rendezvous streams one
//! ring-full per round trip of the reader's index, and everything a rank
//! takes (rings, DMA slots, zero-copy memory) fits a share of the guest's
//! memory ([`Guest`]), or `MPI_Init` says which limit it meets.

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

/// Each rank's node from `MCMPI_NODES` (runs of `NODE*COUNT` separated by
/// commas, in rank order, as `mpiexec` sets it) for a job of `size`
/// ranks. Ranks on one node share a guest (their channels are shared
/// memory), the others are across MEMORY CHANNEL.
pub fn nodes_from_var(value: &str, size: u32) -> Result<Vec<u32>, LaunchError> {
    let bad = |why| LaunchError::Bad { var: "MCMPI_NODES", value: value.to_string(), why };
    let mut nodes = Vec::new();
    for run in value.split(',') {
        let (n, c) = run.trim().split_once('*').ok_or_else(|| bad("runs of NODE*COUNT, like 0*4,1*4"))?;
        let n: u32 = n.parse().map_err(|_| bad("a node is not a number"))?;
        let c: u32 = c.parse().map_err(|_| bad("a count is not a number"))?;
        if c == 0 || nodes.len() as u64 + u64::from(c) > u64::from(size) {
            return Err(bad("the counts must add up to MCMPI_SIZE"));
        }
        nodes.extend(std::iter::repeat_n(n, c as usize));
    }
    if nodes.len() != size as usize {
        return Err(bad("the counts must add up to MCMPI_SIZE"));
    }
    Ok(nodes)
}

/// Whether a job placed by `nodes` (each rank's node) opens its channels
/// on first use rather than all in `MPI_Init` (docs/ump.md, "Channels of
/// a job"). `MCMPI_LAZY` (`lazy`) `1` or `0` decides; unset, only when a
/// channel between every two ranks on different guests (two regions of
/// imcd's directory each) would take more than half of the directory
/// (`directory` entries): opening all at once starts a job sooner, but
/// grows with the square of its ranks.
pub fn opens_on_first_use(nodes: &[u32], lazy: Option<&str>, directory: usize) -> Result<bool, LaunchError> {
    match lazy.map(str::trim) {
        Some("1") => return Ok(true),
        Some("0") => return Ok(false),
        Some(v) => return Err(LaunchError::Bad { var: "MCMPI_LAZY", value: v.to_string(), why: "1 or 0" }),
        None => {}
    }
    let mut per_node: std::collections::BTreeMap<u32, u64> = std::collections::BTreeMap::new();
    for &n in nodes {
        *per_node.entry(n).or_default() += 1;
    }
    let r = nodes.len() as u64;
    let pairs = r * r.saturating_sub(1) / 2 - per_node.values().map(|c| c * (c - 1) / 2).sum::<u64>();
    Ok(2 * pairs > directory as u64 / 2)
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

/// The guest a rank runs on, as far as its memory goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Guest {
    /// The guest's memory, bytes (`MemTotal`).
    pub memory: usize,
    /// Ranks of the job on this guest, this one included.
    pub ranks: u32,
}

impl Guest {
    /// This guest: `MemTotal` from `/proc/meminfo` and `MCMPI_LOCAL_SIZE`
    /// (which `mpid` sets; 1 when unset).
    pub fn from_system(var: impl Fn(&str) -> Option<String>) -> Result<Guest, ump::ConfigError> {
        let ranks =
            match var("MCMPI_LOCAL_SIZE") {
                None => 1,
                Some(s) => s.parse::<u32>().ok().filter(|&n| n >= 1).ok_or_else(|| {
                    ump::ConfigError(format!("MCMPI_LOCAL_SIZE={s:?}: a number of ranks, at least 1"))
                })?,
            };
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let kib = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:")?.trim().strip_suffix("kB")?.trim().parse::<usize>().ok());
        // Without /proc (never in our guests), assume 1 GiB.
        Ok(Guest { memory: kib.map_or(1 << 30, |k| k << 10), ranks })
    }
}

/// The share of a guest's memory that the MPI buffers of all the ranks on
/// it may take by default (`MCMPI_MEM` sets a rank's own budget): 3/8,
/// which leaves the kernel, the image (about 50 MB of a 256 MiB guest),
/// imcd, mpid and the programs' own data the rest.
pub const MEMORY_SHARE: (usize, usize) = (3, 8);

/// The smallest shared-memory ring MPI shrinks to by itself.
pub const SHM_RING_MIN: usize = 32 << 10;

/// Zero-copy memory below this is not worth keeping: it is given up
/// before the rings shrink further.
const ALLOC_MEM_MIN: usize = 256 << 10;

/// Bytes of a rank's budget its buffers take: per rank on another guest,
/// the receive buffer of the other side's half (whole 8 KiB pages) and
/// the writer's copy of our ring; per rank on this guest, one
/// shared-memory half (each pair's file holds two, one per side); the
/// zero-copy memory when any rank is on another guest.
pub fn memory_needed(c: &ump::Config, remote: usize, local_peers: usize) -> usize {
    let spare = if remote > 0 { c.dma_spare } else { 0 };
    let mc_half = ump::ring::half_len(c.mc_buffer).next_multiple_of(8192);
    remote * (mc_half + c.mc_buffer) + local_peers * ump::ring::half_len(c.shm_buffer) + spare
}

/// The UMP configuration of a rank of a job of `size` ranks on `guest`,
/// from the variables `var` gives: UMP's own (`UMP_*`, which win), else
/// MEMORY CHANNEL rings of `MCMPI_MC_RINGS` (default 4 MiB) shared among
/// the other ranks, a power of two from 32 KiB to 1 MiB, room for a
/// channel to every other rank, a DMA slot for each rank on another
/// guest, and [`alloc_mem_bytes`] of spare DMA memory. Then all of it is
/// fitted to the rank's memory budget (`MCMPI_MEM`, else
/// [`MEMORY_SHARE`] of the guest's memory over its ranks): the zero-copy
/// memory halves first (and goes below 256 KiB), then the MEMORY CHANNEL
/// rings, then the shared-memory rings, each only where no variable set
/// it. A budget that the smallest sizes do not fit is an error that names
/// it and the ways out.
pub fn ump_config(
    size: u32,
    guest: Guest,
    var: impl Fn(&str) -> Option<String>,
) -> Result<ump::Config, ump::ConfigError> {
    let mut c = ump::Config::from_vars(&var)?;
    let peers = (size as usize).saturating_sub(1).max(1);
    let local = guest.ranks.clamp(1, size.max(1)) as usize;
    let remote = size as usize - local;
    let local_peers = local - 1;
    // Sizes a variable set are kept as given, here and when fitting.
    let (ring_set, ump_spare_set, shm_set) =
        (var("UMP_MC_BUFFER").is_some(), var("UMP_DMA_SPARE").is_some(), var("UMP_SHM_BUFFER").is_some());
    let spare_set = ump_spare_set || var("MCMPI_ALLOC_MEM").is_some();
    if !ring_set {
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
    if !ump_spare_set {
        c.dma_spare = alloc_mem_bytes(&var)?;
    }
    if var("UMP_DMA_SLOTS").is_none() {
        c.dma_slots = Some(remote);
    }
    let budget = match var("MCMPI_MEM") {
        Some(s) => {
            ump::parse_size(&s).ok_or_else(|| ump::ConfigError(format!("MCMPI_MEM={s:?}: bytes per rank, like 16M")))?
        }
        None => guest.memory / MEMORY_SHARE.1 * MEMORY_SHARE.0 / local,
    };
    while memory_needed(&c, remote, local_peers) > budget {
        if !spare_set && remote > 0 && c.dma_spare > 0 {
            let half = c.dma_spare / 2 / 8192 * 8192;
            c.dma_spare = if half < ALLOC_MEM_MIN { 0 } else { half };
        } else if !ring_set && remote > 0 && c.mc_buffer > MC_RING_MIN {
            c.mc_buffer /= 2;
        } else if !shm_set && local_peers > 0 && c.shm_buffer > SHM_RING_MIN {
            c.shm_buffer /= 2;
        } else {
            let mib = |b: usize| format!("{:.1} MiB", b as f64 / f64::from(1 << 20));
            let given = match var("MCMPI_MEM") {
                Some(s) => format!("MCMPI_MEM={s} gives it {}", mib(budget)),
                None => format!(
                    "the guest has {} for {local} ranks of this job, and MPI's buffers may take {}/{} of it: {} per rank",
                    mib(guest.memory),
                    MEMORY_SHARE.0,
                    MEMORY_SHARE.1,
                    mib(budget)
                ),
            };
            return Err(ump::ConfigError(format!(
                "not enough memory for MPI's buffers: this rank needs {} at the least (rings of {} bytes to {remote} \
                 ranks on other guests, of {} bytes to {local_peers} on this one, {} of zero-copy memory), and \
                 {given}. Put fewer \
                 ranks on each guest, give the guests more memory ([guest] memory_mib in the cluster's config), \
                 or set MCMPI_MEM to the bytes a rank may take",
                mib(memory_needed(&c, remote, local_peers)),
                c.mc_buffer,
                c.shm_buffer,
                mib(if remote > 0 { c.dma_spare } else { 0 }),
            )));
        }
    }
    c.check()?;
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A guest as large as the old fixed sizes ever needed, all ranks but
    /// this one elsewhere.
    const ROOMY: Guest = Guest { memory: 4 << 30, ranks: 1 };

    fn cfg(size: u32, vars: &[(&str, &str)]) -> Result<ump::Config, ump::ConfigError> {
        cfg_on(size, ROOMY, vars)
    }

    fn cfg_on(size: u32, guest: Guest, vars: &[(&str, &str)]) -> Result<ump::Config, ump::ConfigError> {
        ump_config(size, guest, |n| vars.iter().find(|(k, _)| *k == n).map(|(_, v)| v.to_string()))
    }

    /// What a rank of `size` with `local` on a guest of `mib` MiB gets,
    /// and what that takes.
    fn fitted(size: u32, local: u32, mib: usize, vars: &[(&str, &str)]) -> (ump::Config, usize) {
        let c = cfg_on(size, Guest { memory: mib << 20, ranks: local }, vars).unwrap();
        let need = memory_needed(&c, (size - local) as usize, local as usize - 1);
        (c, need)
    }

    #[test]
    fn the_placement_is_read_from_runs() {
        assert_eq!(nodes_from_var("0*2,1*3,0*1", 6).unwrap(), [0, 0, 1, 1, 1, 0]);
        assert_eq!(nodes_from_var("7*1", 1).unwrap(), [7]);
        for (v, size, why) in [
            ("0*2,1*3", 6, "add up"),
            ("0*4,1*4", 6, "add up"),
            ("0*0,1*2", 2, "add up"),
            ("0:2", 2, "NODE*COUNT"),
            ("x*2", 2, "node"),
            ("0*y", 2, "count"),
            ("", 2, "NODE*COUNT"),
        ] {
            let e = nodes_from_var(v, size).unwrap_err().to_string();
            assert!(e.contains("MCMPI_NODES") && e.contains(why), "{v}: {e}");
        }
    }

    #[test]
    fn channels_open_on_first_use_when_all_would_fill_the_directory() {
        let on = |ranks: u32, nodes: u32| -> Vec<u32> { (0..ranks).map(|r| r * nodes / ranks).collect() };
        let dir = imc_client::layout::ENTRIES;
        // 16 ranks on 4 guests: 96 pairs across guests, 192 regions of 478.
        assert!(!opens_on_first_use(&on(16, 4), None, dir).unwrap());
        // 24 on 4: 216 pairs, 432 regions: on first use.
        assert!(opens_on_first_use(&on(24, 4), None, dir).unwrap());
        // Any number on one guest: no regions at all.
        assert!(!opens_on_first_use(&on(64, 1), None, dir).unwrap());
        assert!(opens_on_first_use(&on(2, 2), Some("1"), dir).unwrap());
        assert!(!opens_on_first_use(&on(24, 4), Some(" 0"), dir).unwrap());
        let e = opens_on_first_use(&on(2, 2), Some("yes"), dir).unwrap_err().to_string();
        assert!(e.contains("MCMPI_LAZY"), "{e}");
    }

    #[test]
    fn a_rank_fits_its_share_of_the_guest() {
        // 8 ranks on a 256 MiB guest (16 on 2 guests): 12 MiB each.
        let (c, need) = fitted(16, 8, 256, &[]);
        assert!(need <= (256 << 20) * 3 / 8 / 8, "{need}");
        assert_eq!(c.dma_slots, Some(8), "a DMA slot per rank on another guest");
        assert!(c.dma_spare >= 1 << 20 && c.mc_buffer >= 128 << 10, "{c:?}");
        // All 8 on one guest: no MEMORY CHANNEL rings, no zero copy.
        let (c, need) = fitted(8, 8, 256, &[]);
        assert_eq!(c.dma_slots, Some(0));
        assert!(need <= (256 << 20) * 3 / 8 / 8 && c.shm_buffer == 256 << 10, "{need} {c:?}");
        // 2 ranks on a 256 MiB guest keep every default size.
        let (c, _) = fitted(4, 2, 256, &[]);
        assert_eq!((c.dma_spare, c.mc_buffer, c.shm_buffer), (crate::zcopy::ALLOC_MEM_DEFAULT, 1 << 20, 256 << 10));
        // 8 ranks of 32 on a 64 MiB guest shrink to the smallest rings.
        let (c, need) = fitted(32, 8, 64, &[]);
        assert!(need <= (64 << 20) * 3 / 8 / 8, "{need}");
        assert_eq!((c.dma_spare, c.mc_buffer), (0, MC_RING_MIN), "{c:?}");
        assert!(c.shm_buffer < 256 << 10, "{c:?}");
    }

    #[test]
    fn too_little_memory_is_an_error_that_names_the_limit_and_the_ways_out() {
        let e = cfg_on(512, Guest { memory: 64 << 20, ranks: 32 }, &[]).unwrap_err().0;
        for want in [
            "not enough memory",
            "32 ranks of this job",
            "[guest] memory_mib",
            "MCMPI_MEM",
            "480 ranks on other guests",
        ] {
            assert!(e.contains(want), "{want}: {e}");
        }
        // A budget of one's own, and sizes one set, are kept as given.
        let e = cfg_on(4, Guest { memory: 4 << 30, ranks: 1 }, &[("MCMPI_MEM", "1M"), ("MCMPI_ALLOC_MEM", "4M")])
            .unwrap_err()
            .0;
        assert!(e.contains("MCMPI_MEM=1M gives it 1.0 MiB"), "{e}");
        let c = cfg_on(4, Guest { memory: 4 << 30, ranks: 1 }, &[("MCMPI_MEM", "2M")]).unwrap();
        assert!(memory_needed(&c, 3, 0) <= 2 << 20, "{c:?}");
        assert!(cfg_on(4, ROOMY, &[("MCMPI_MEM", "lots")]).unwrap_err().0.contains("MCMPI_MEM"));
    }

    #[test]
    fn the_guest_is_read_from_the_system() {
        let g = Guest::from_system(|n| (n == "MCMPI_LOCAL_SIZE").then(|| "3".to_string())).unwrap();
        assert_eq!(g.ranks, 3);
        assert!(g.memory > 16 << 20, "MemTotal of this machine: {}", g.memory);
        assert_eq!(Guest::from_system(|_| None).unwrap().ranks, 1);
        assert!(Guest::from_system(|_| Some("none".into())).unwrap_err().0.contains("MCMPI_LOCAL_SIZE"));
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
