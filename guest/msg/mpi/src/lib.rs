//! MPI for the virtual cluster: the MPI 5.0 standard ABI (`mpi.h`,
//! `libmpi_abi.so.1`) over UMP, so ranks inside one guest talk through
//! shared memory and ranks on different guests through MEMORY CHANNEL, as
//! seed 000 ("MPI", Figure 1) layers it. The design is docs/mpi.md.
//!
//! # Layout
//! - [`abi`]: the standard ABI's C types, handle encodings and constants
//!   (the same values as `include/mpi.h`).
//! - [`datatype`]: type maps, constructors, extents, pack and unpack.
//! - [`op`]: the built-in reduction operations.
//! - [`launch`]: what the launcher hands a rank (job, rank, size).
//! - [`transport`]: framed messages to other ranks over UMP, never
//!   blocking the progress engine.
//! - [`engine`]: matching (posted and unexpected queues), the eager and
//!   rendezvous protocols, requests and progress.
//! - [`zcopy`]: `MPI_Alloc_mem`'s memory across guests, which DMA both
//!   comes from and lands in: rendezvous with no copy.
//! - [`rma`]: one-sided communication: windows, and the frames that
//!   carry puts, gets, accumulates and their synchronisation.
//! - [`board`]: the job's billboard in MEMORY CHANNEL, where the small
//!   collectives of `MPI_COMM_WORLD` take one round of stores.
//! - [`ffi`]: the C entry points (`PMPI_*`, with weak `MPI_*` aliases).

#![warn(missing_docs)]

pub mod abi;
pub mod board;
pub mod datatype;
pub mod engine;
pub mod ffi;
pub mod launch;
pub mod op;
pub mod rma;
pub mod transport;
pub mod zcopy;
