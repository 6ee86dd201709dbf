//! `mc-hub`: the MEMORY CHANNEL hub.
//!
//! # Layout
//! - [`hub`]: the server's handle and settings; the module doc has the
//!   ordering, the lock order and flow control.
//! - `order`: the global order: the ordering step, membership events.
//! - `port`: what a port is: its kinds, counters and faults' settings.
//! - `link_port`: link ports (remote adapters over sockets).
//! - `control`: control requests (counters, faults on purpose).
//! - `capture`: the pcap capture of every ordered frame.
//! - `observe`: what the live monitor reads (heat map, step times, a copy
//!   of imcd's pages).
//! - [`history`]: a capture read back as the history of MEMORY CHANNEL
//!   space (`mc-trace`, the time machine).
//! - `bounds`: caps on connections not trusted yet (before `Hello`, control).
//! - [`local`]: local ports: the adapters of guests on this host, served
//!   over vfio-user by the hub itself, so a store reaches the other guests'
//!   memory in the thread that received it.
//! - `faulty`: a local port's faults on purpose (corruption, delay), a
//!   decorator over its adapter's receiving side.
//! - [`netem`]: a TCP relay that adds delay and jitter (`mc-netem`), a
//!   slower network between an adapter and the hub.
//! - crate `link` (`protocol/link/`): the wire format link ports speak.
//! - `testing` (feature `testing`): a real hub on its own runtime, for tests.
#![warn(missing_docs)]

mod bounds;
mod capture;
mod control;
mod faulty;
pub mod history;
pub mod hub;
mod link_port;
pub mod local;
pub mod netem;
mod observe;
mod order;
mod port;
pub mod restart;
#[cfg(feature = "testing")]
pub mod testing;
