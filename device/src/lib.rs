//! `mc-adapter`: the MEMORY CHANNEL for PCI adapter, emulated as a vfio-user
//! server that QEMU's `vfio-user-pci` device connects to.
//!
//! # Layout
//! - [`regs`] (crate `regs`, `protocol/regs/`): BARs, register offsets and bits, the page control table entry
//!   format — the adapter's datasheet in code (`docs/adapter.md` in prose).
//! - [`adapter`]: the device (`adapter/mod.rs`: its state and the vfio-user
//!   `Device` impl), with `registers` (BAR 0 and the PCT), `tx` (transmit
//!   window to write packets), `txdma` (the transmit DMA engine: descriptor
//!   ring, page-sized packets), `rx` (deliveries into guest memory, ACK
//!   answers) and `irq` (causes, FIFO, INTx and MSI-X).
//! - [`uplink`]: where an adapter's writes go (the contract with the hub).
//! - [`remote`]: a link port: the adapter's socket to a hub in another process.
//! - [`dma`]: guest memory through QEMU's DMA maps (interval map over
//!   vm-memory `MmapRegion`s of the memfds), and the ordered copy.
//! - [`link_client`]: a blocking client of the hub's link protocol (joining, streams).
//! - [`pci`]: PCI configuration space.
//! - [`vfio_user`]: the vfio-user protocol server (socket, framing, dispatch).
//! - [`client_socket`]: enlarging the connected QEMU's send buffer, which
//!   makes the direct store path safe against floods.
//! - [`fatal`]: a panic aborts the process (`mc-adapter`, `mc-hub`); the
//!   supervisor restarts it.
#![warn(missing_docs)]

pub mod adapter;
pub mod client_socket;
pub mod dma;
pub mod fatal;
pub mod link_client;
pub mod pci;
pub mod remote;
pub mod trace_socket;
pub mod uplink;
/// The register map, shared with the driver (crate `regs`).
pub use regs;
pub mod vfio_user;
