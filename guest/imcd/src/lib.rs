//! `imcd` as a library: the node logic of the guest daemon that plays
//! TruCluster's kernel subsystem. The binary (`src/main.rs`) is the
//! command line around it.
//!
//! - [`bus`]: the cluster lock's ordered bus on the real adapter.
//! - [`toggled`]: two-copy records (the clusterwide descriptors) that survive
//!   a writer dying mid-update.
//! - [`regions`]: the clusterwide region directory (keys to pages) built on
//!   the cluster lock and toggled records.
#![warn(missing_docs)]

pub mod bus;
pub mod regions;
pub mod toggled;
