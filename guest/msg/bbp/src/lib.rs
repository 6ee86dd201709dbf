//! BBP, the Billboard Protocol of SCRAMNet (seed 002, section 3) on
//! MEMORY CHANNEL: zero copy at the receiver, lock-free (every word has
//! one writer), and multicast at the cost of point-to-point plus one word
//! per extra receiver. docs/bbp.md has the protocol, the layout, where it
//! relies on MEMORY CHANNEL's total order, the fault behaviour and the
//! limits; `include/bbp.h` is the C API.
//!
//! # Layout
//! - [`layout`]: where the shares, flags, descriptors and buffers are.
//! - [`proto`]: the protocol over a [`proto::Bus`] (send, multicast,
//!   receive, buffer collection, barrier, repair of lost stores).
//! - [`mc`]: the bus on MEMORY CHANNEL (a region per job, through imcd),
//!   with the error count and a prober of the other processes.
//! - [`shm`]: the bus in a shared file on one machine (`BBP_SHM`).
//! - [`capi`]: the C functions of `bbp.h`.
//!
//! This file: choosing the bus and the job's shape from the arguments or
//! the environment ([`Options`], [`init`]).

pub mod capi;
pub mod layout;
pub mod mc;
pub mod proto;
pub mod shm;

use std::path::PathBuf;

pub use layout::Geometry;
pub use proto::{BbpError, Bus, Endpoint, Received, Stats, Timing};

/// A process's end of a billboard, on whichever bus it was opened.
pub type Bbp = Endpoint<Box<dyn Bus>>;

impl Bus for Box<dyn Bus> {
    fn store(&self, w: usize, v: u64) {
        (**self).store(w, v)
    }
    fn load(&self, w: usize) -> u64 {
        (**self).load(w)
    }
    fn store_bytes(&self, w: usize, src: &[u8]) {
        (**self).store_bytes(w, src)
    }
    fn load_bytes(&self, w: usize, dst: &mut [u8]) {
        (**self).load_bytes(w, dst)
    }
    fn errors(&self) -> u64 {
        (**self).errors()
    }
    fn alive(&self, who: u64) -> Result<(), String> {
        (**self).alive(who)
    }
}

/// How to join a billboard. Fields left `None` come from the environment
/// our `mpiexec` sets (`MCMPI_RANK`, `MCMPI_SIZE`, `MCMPI_JOB`) and
/// `BBP_SHM`.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// This process's rank.
    pub rank: Option<usize>,
    /// Processes in the job.
    pub nprocs: Option<usize>,
    /// The job (processes of one job share one billboard).
    pub job: Option<u64>,
    /// Bytes of each data partition (default [`layout::DEFAULT_DATA_BYTES`]).
    pub data_bytes: Option<usize>,
    /// A file to put the billboard in instead of MEMORY CHANNEL.
    pub shm: Option<PathBuf>,
}

fn env_num(name: &str) -> Result<Option<u64>, BbpError> {
    match std::env::var(name) {
        Ok(v) => v.trim().parse().map(Some).map_err(|_| BbpError::Arg(format!("{name}={v:?} is not a number"))),
        Err(_) => Ok(None),
    }
}

/// Joins the billboard `opts` describes.
pub fn init(opts: Options) -> Result<Bbp, BbpError> {
    let rank = match opts.rank {
        Some(r) => r,
        None => env_num("MCMPI_RANK")?
            .ok_or_else(|| BbpError::Arg("no rank: pass one, or start under mpiexec (MCMPI_RANK)".into()))?
            as usize,
    };
    let nprocs = match opts.nprocs {
        Some(n) => n,
        None => env_num("MCMPI_SIZE")?
            .ok_or_else(|| BbpError::Arg("no process count: pass one, or start under mpiexec (MCMPI_SIZE)".into()))?
            as usize,
    };
    let job = match opts.job {
        Some(j) => j,
        None => env_num("MCMPI_JOB")?.unwrap_or(0),
    };
    if job > imc_client::keys::PAYLOAD_MASK {
        return Err(BbpError::Arg(format!("job {job} does not fit a region key (56 bits)")));
    }
    let data_bytes = opts.data_bytes.unwrap_or(layout::DEFAULT_DATA_BYTES);
    if data_bytes == 0 || data_bytes > layout::MAX_DATA_BYTES || data_bytes % 8 != 0 {
        return Err(BbpError::Arg(format!(
            "a data partition of {data_bytes} bytes (a multiple of 8, 8..={} bytes)",
            layout::MAX_DATA_BYTES
        )));
    }
    if nprocs == 0 || nprocs > layout::MAX_PROCS {
        return Err(BbpError::Arg(format!("{nprocs} processes (1..={} processes)", layout::MAX_PROCS)));
    }
    if rank >= nprocs {
        return Err(BbpError::Rank { rank: rank as i64, nprocs, me: rank });
    }
    let geo = Geometry { nprocs, data_bytes };
    let shm = opts.shm.or_else(|| std::env::var_os("BBP_SHM").map(PathBuf::from));
    let pid = u64::from(std::process::id());
    let (bus, who): (Box<dyn Bus>, u64) = match shm {
        Some(p) => (Box::new(shm::ShmBus::open(&p, &geo)?), pid),
        None => {
            let (bus, node) = mc::McBus::open(job, &geo)?;
            (Box::new(bus), u64::from(node) << 32 | pid)
        }
    };
    Endpoint::new(bus, geo, rank, who, Timing::default())
}
