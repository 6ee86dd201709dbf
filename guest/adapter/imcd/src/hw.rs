//! [`Hw`]: the adapter as imcd's node logic sees it. The node logic
//! ([`crate::node`], [`crate::mapper`], [`crate::daemon`]) is generic over
//! it, so it runs unchanged on the real adapter ([`crate::adapter`]) and on
//! the simulated cluster its tests use ([`crate::sim`]).
//!
//! Implementations are shared by imcd's two threads (the main thread and
//! the mapper), hence `Sync`.

use std::fs::File;
use std::time::Duration;

use imc_client::cluster_lock::OrderedBus;
use thiserror::Error;

use crate::regions::RegionDesc;

/// What the node logic needs from the adapter.
pub trait Hw: Sync {
    /// The ordered bus the region directory lives on (its pages from
    /// `DIR_PAGE`; every node receives them, loopback on).
    type Bus: OrderedBus + Clone + Send + Sync;

    /// This node's id.
    fn me(&self) -> usize;
    /// MEMORY CHANNEL pages the hub offers.
    fn pages(&self) -> u64;
    /// Nodes the hub counts as up (bit `n` = node `n`).
    fn members(&self) -> u64;
    /// Transmits the 8-byte word `v` to MEMORY CHANNEL byte address `addr`.
    fn store64(&self, addr: u64, v: u64);
    /// Word `idx` of imcd's own page `page`, as this node received it.
    fn meta(&self, page: u64, idx: usize) -> u64;
    /// The directory's bus.
    fn dir_bus(&self) -> Self::Bus;
    /// The adapter's error bits and error count.
    fn errors(&self) -> (u32, u64);
    /// Clears error bits that were counted.
    fn clear_errors(&self, bits: u32);
    /// Publishes the clusterwide error count processes read.
    fn set_error_sum(&self, sum: u64);
    /// Publishes that this node left the cluster once more (every
    /// attachment here revoked): processes that serve others over MEMORY
    /// CHANNEL (mpid) see it and set up again.
    fn count_departure(&self);
    /// Waits up to `timeout` for an interrupt (a write to the relay or
    /// error-count page or to a watched page, a link change, an error),
    /// acknowledging it; true when one came. The pages the notifications
    /// named go into `notified`.
    fn wait_event(&self, timeout: Duration, notified: &mut Notified) -> bool;
    /// Sets (or clears) the page control table's INT bit on `pages` pages
    /// from `first`: a store arriving there interrupts and names its page
    /// ([`crate::watch`]).
    fn set_notify(&self, first: u64, pages: u64, on: bool);
    /// Makes sure this node receives region `r` (a buffer mapped for DMA,
    /// RX on its pages).
    fn receive(&self, r: &RegionDesc) -> Result<(), HwError>;
    /// Word at byte `off` of region `id`'s receive buffer.
    fn region_word(&self, id: u32, off: u64) -> Option<u64>;
    /// The regions this node receives: (id, first page, pages).
    fn received(&self) -> Vec<(u32, u64, u64)>;
    /// Stops receiving and transmitting region `id` here.
    fn forget(&self, id: u32);
    /// Stops receiving (and transmitting) region `id` here only if this
    /// node's buffer of it is still the one at `first` of `pages` pages:
    /// the mapper's cleanup of a region it saw freed must not take a
    /// buffer the daemon made meanwhile for a new region with the same id.
    fn forget_stale(&self, id: u32, first: u64, pages: u64);
    /// Stops receiving and transmitting every region here: what a node
    /// that has left the cluster does, so its processes can no longer write
    /// pages the others may give to a new region (imcd's own pages stay).
    fn forget_all(&self);
    /// Zeroes `words` of this node's own copy of imcd page `page` (local
    /// memory only: nothing is transmitted).
    fn clear_meta(&self, page: u64, words: std::ops::Range<usize>);
    /// Enables transmit (and loopback) on the pages of `r`: broadcast, or
    /// point-to-point to node `p2p` only (PCT P2P bit and dest node).
    fn transmit(&self, r: &RegionDesc, loopback: bool, p2p: Option<u16>);
    /// The cluster-signal service: delivers `sig` to `pid` for a sender
    /// with real uid `uid`; returns 0 or an errno.
    fn signal(&self, pid: u64, sig: u64, uid: u64) -> u64;
    /// What a process maps for `what`: (offset, length, fd to map).
    fn handout(&self, what: Handout) -> Result<(u64, u64, Option<File>), HwError>;
    /// Transmit DMA (an extension): sets up the node's descriptor ring if
    /// needed and a source area of `size` bytes for client `client`,
    /// mapped for the adapter. Returns its IOVA, its length, its file and
    /// the ring's descriptors. Without an engine: [`HwError::NoDma`].
    fn dma_open(&self, _client: u64, _size: u64) -> Result<DmaArea, HwError> {
        Err(HwError::NoDma)
    }
    /// Unmaps and frees client `client`'s source area (it left), and stops
    /// receiving the regions landed in it.
    fn dma_close(&self, _client: u64) {}
    /// Receives region `r` into client `client`'s source area at byte
    /// `offset` ([`imc_proto::Request::DmaLand`]): the pages' receive
    /// addresses point into the area. The caller checked that the client
    /// holds the region; this checks the rest.
    fn dma_land(&self, _client: u64, _r: &RegionDesc, _offset: u64) -> Result<(), HwError> {
        Err(HwError::NoDma)
    }
    /// Stops receiving region `id` into client `client`'s area, if it did.
    fn dma_unland(&self, _client: u64, _id: u32) {}
}

/// What the notifications of an interrupt named ([`Hw::wait_event`]).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Notified {
    /// The pages, in the order the stores arrived (repeats kept).
    pub pages: Vec<u64>,
    /// Notifications were lost (the adapter's FIFO was full): any watched
    /// page may have been written.
    pub lost: bool,
}

/// A client's transmit DMA source area, as [`Hw::dma_open`] set it up.
#[derive(Debug)]
pub struct DmaArea {
    /// IOVA of byte 0.
    pub iova: u64,
    /// Bytes.
    pub len: u64,
    /// The area's file, for the client to map.
    pub file: File,
    /// Descriptors in the node's ring.
    pub ring_entries: u32,
}

/// Something a process maps, handed out by imcd with an fd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handout {
    /// The adapter's registers (read-only use).
    Regs,
    /// imcd's copy of the clusterwide error count.
    ErrCount,
    /// The transmit page of `imc_ckerrcnt`'s ACK stores.
    AckTransmit,
    /// Where the ACK answers land.
    AckAnswers,
    /// The transmit window over `pages` pages from `first_page`.
    Transmit {
        /// First MEMORY CHANNEL page.
        first_page: u64,
        /// Pages.
        pages: u64,
    },
    /// Region `id`'s receive buffer (the node must receive it already).
    Receive {
        /// Region id.
        id: u32,
    },
    /// The transmit DMA descriptor ring (after [`Hw::dma_open`]), in a new
    /// open file description, so each process's `flock` on it excludes the
    /// others.
    DmaRing,
}

/// Errors of the adapter underneath.
#[derive(Debug, Error)]
pub enum HwError {
    /// A system call failed.
    #[error("{what}: {err}")]
    Os {
        /// What was being done.
        what: String,
        /// The error.
        err: std::io::Error,
    },
    /// The adapter refused or is not there.
    #[error("adapter: {0}")]
    Device(String),
    /// The region has no receive buffer on this node.
    #[error("region {0} is not received on this node")]
    NotReceived(u32),
    /// The adapter has no transmit DMA engine (CAPS.TX_DMA clear).
    #[error("the adapter has no transmit DMA engine")]
    NoDma,
    /// A DMA source area this size is not offered.
    #[error("a DMA source area of {0} bytes: 8 KiB to {max} MiB", max = DMA_AREA_MAX >> 20)]
    DmaSize(u64),
    /// Every DMA source area slot is taken.
    #[error("all {0} DMA source areas of this node are in use")]
    DmaFull(usize),
    /// A region cannot land in a source area ([`Hw::dma_land`]): why.
    #[error("landing region {id} in a DMA source area: {why}")]
    Landing {
        /// Region id.
        id: u32,
        /// Why not.
        why: String,
    },
}

/// Largest transmit DMA source area per process.
pub const DMA_AREA_MAX: u64 = 16 << 20;

impl<T: Hw + Send> Hw for std::sync::Arc<T> {
    type Bus = T::Bus;
    fn me(&self) -> usize {
        (**self).me()
    }
    fn pages(&self) -> u64 {
        (**self).pages()
    }
    fn members(&self) -> u64 {
        (**self).members()
    }
    fn store64(&self, addr: u64, v: u64) {
        (**self).store64(addr, v)
    }
    fn meta(&self, page: u64, idx: usize) -> u64 {
        (**self).meta(page, idx)
    }
    fn dir_bus(&self) -> Self::Bus {
        (**self).dir_bus()
    }
    fn errors(&self) -> (u32, u64) {
        (**self).errors()
    }
    fn clear_errors(&self, bits: u32) {
        (**self).clear_errors(bits)
    }
    fn set_error_sum(&self, sum: u64) {
        (**self).set_error_sum(sum)
    }
    fn count_departure(&self) {
        (**self).count_departure()
    }
    fn wait_event(&self, timeout: Duration, notified: &mut Notified) -> bool {
        (**self).wait_event(timeout, notified)
    }
    fn set_notify(&self, first: u64, pages: u64, on: bool) {
        (**self).set_notify(first, pages, on)
    }
    fn receive(&self, r: &RegionDesc) -> Result<(), HwError> {
        (**self).receive(r)
    }
    fn region_word(&self, id: u32, off: u64) -> Option<u64> {
        (**self).region_word(id, off)
    }
    fn received(&self) -> Vec<(u32, u64, u64)> {
        (**self).received()
    }
    fn forget(&self, id: u32) {
        (**self).forget(id)
    }
    fn forget_stale(&self, id: u32, first: u64, pages: u64) {
        (**self).forget_stale(id, first, pages)
    }
    fn forget_all(&self) {
        (**self).forget_all()
    }
    fn clear_meta(&self, page: u64, words: std::ops::Range<usize>) {
        (**self).clear_meta(page, words)
    }
    fn transmit(&self, r: &RegionDesc, loopback: bool, p2p: Option<u16>) {
        (**self).transmit(r, loopback, p2p)
    }
    fn signal(&self, pid: u64, sig: u64, uid: u64) -> u64 {
        (**self).signal(pid, sig, uid)
    }
    fn handout(&self, what: Handout) -> Result<(u64, u64, Option<File>), HwError> {
        (**self).handout(what)
    }
    fn dma_open(&self, client: u64, size: u64) -> Result<DmaArea, HwError> {
        (**self).dma_open(client, size)
    }
    fn dma_close(&self, client: u64) {
        (**self).dma_close(client)
    }
    fn dma_land(&self, client: u64, r: &RegionDesc, offset: u64) -> Result<(), HwError> {
        (**self).dma_land(client, r, offset)
    }
    fn dma_unland(&self, client: u64, id: u32) {
        (**self).dma_unland(client, id)
    }
}
