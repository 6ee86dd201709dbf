//! `imcd` as a library: the node logic of the guest daemon that plays
//! TruCluster's kernel subsystem (seed 000, "TruCluster MEMORY CHANNEL
//! Software"). The binary (`src/main.rs`) is the command line and the
//! client socket around it. What imcd and its clients agree on (requests,
//! page layout, key namespaces) is the `imc-proto` crate.
//!
//! # By job
//! - [`hw`]: the adapter as the node logic sees it ([`hw::Hw`]); the logic
//!   is generic over it.
//! - [`adapter`]: [`hw::Hw`] on the real adapter (VFIO, receive buffers, PCT).
//! - [`spares`]: receive buffers mapped ahead of need (the `spares` thread).
//! - [`sim`]: [`hw::Hw`] on a simulated cluster, for in-process tests.
//! - [`node`]: imcd's own pages (host table, acks, error counts) and the
//!   start-up join.
//! - [`mapper`]: the mapper thread (coherent regions, stale buffers, relay).
//! - [`relay`]: the command relay (`imc_kill`).
//! - [`watch`]: processes woken by stores to a region (an extension).
//! - [`daemon`]: the main thread's requests, failure repair and late-join
//!   service.
//! - [`regions`]: the clusterwide region directory, built on the cluster
//!   lock and [`toggled`] records.
//! - [`bus`]: the cluster lock's ordered bus on the real adapter.
//!
//! # Threads
//!
//! The main thread serves clients and does everything that takes the
//! directory lock (allocation, release, late-join service, failure
//! repair). The mapper thread (the paper's mapper process) never takes it,
//! so a node blocked on the directory lock still acks the coherent
//! allocation holding it.
#![warn(missing_docs)]

pub mod adapter;
pub mod bus;
pub mod daemon;
pub mod hw;
pub mod mapper;
pub mod node;
pub mod regions;
pub mod relay;
pub mod sim;
pub mod spares;
pub mod toggled;
pub mod watch;
