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

#[cfg(test)]
mod tests {
    use super::*;

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
