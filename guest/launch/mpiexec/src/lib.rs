//! MPI launchers for the virtual cluster: `mpid`, one per guest, starts
//! ranks when asked over UMP; `mpiexec` (also `mpirun`) places a job's
//! ranks on hosts and asks each host's `mpid` for them. See `docs/mpi.md`,
//! "Launching".
//!
//! - [`proto`]: handles and messages between the two.
//! - [`hosts`]: this node, and what a host name means.
//! - [`args`]: `mpiexec`'s command line; [`place`]: ranks to hosts.
//! - [`client`]: one job as `mpiexec` runs it.
//! - [`daemon`]: `mpid`'s loop; [`ranks`]: its rank processes.

#![warn(missing_docs)]

pub mod args;
pub mod client;
pub mod daemon;
pub mod hosts;
pub mod place;
pub mod proto;
pub mod ranks;
