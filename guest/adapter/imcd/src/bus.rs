//! [`AdapterBus`]: the cluster lock's ordered bus on the real adapter.
//! Used by imcd's threads (directory and lock sets) and by `mctool lock-test`.

use std::sync::Arc;

use guest_driver::guest_mem::{Mapping, ReadWrite};
use guest_driver::Adapter;
use imc_client::cluster_lock::OrderedBus;
use regs::PAGE_SIZE;

/// The real [`OrderedBus`]: the lock's slots are 8-byte words
/// of one page, stored through the transmit window (the page has TX, RX and
/// LOOPBACK) and loaded from this node's receive buffer.
#[derive(Clone)]
pub struct AdapterBus {
    /// The adapter.
    pub adapter: Arc<Adapter>,
    /// The receive buffer holding the page.
    pub buf: Arc<Mapping<ReadWrite>>,
    /// The lock's page.
    pub page: u64,
    /// This node's id.
    pub node: usize,
    /// Slots: the hub's ports.
    pub slots: usize,
}

impl OrderedBus for AdapterBus {
    fn node(&self) -> usize {
        self.node
    }
    fn slots(&self) -> usize {
        self.slots
    }
    fn store(&self, slot: usize, v: u64) {
        self.adapter.store64(self.page * PAGE_SIZE + 8 * slot as u64, v);
    }
    fn load(&self, slot: usize) -> u64 {
        let off = (self.page * PAGE_SIZE) as usize + 8 * slot;
        self.buf.load::<u64>(off).unwrap_or_else(|e| panic!("lock slot {slot}: {e}"))
    }
}
