//! A simulated MEMORY CHANNEL for the protocol's tests: nodes with their
//! own copy of one address space, writes placed in one total order and
//! applied by each node in that order but late (each load first applies
//! a random number of the node's pending writes, seeded), point-to-point
//! or broadcast, with links that go down (writes from or to the node are
//! lost) and bursts of writes the hub drops as corrupt.
//!
//! Owned by the test thread that made it (a `Mutex` inside lets the
//! handles be shared).

use std::sync::{Arc, Mutex, MutexGuard};

use crate::proto::{Rx, Tx};

struct Write {
    /// Nodes that apply it (bit n: node n).
    to: u64,
    addr: usize,
    bytes: Vec<u8>,
}

struct Inner {
    mem: Vec<Vec<u8>>,
    log: Vec<Write>,
    applied: Vec<usize>,
    down: u64,
    /// Writes still to drop as corrupt.
    corrupt: usize,
    rng: u64,
}

impl Inner {
    fn rand(&mut self) -> u64 {
        // xorshift64*
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Node `n` applies some of its pending writes (all with `all`).
    fn catch_up(&mut self, n: usize, all: bool) {
        let pending = self.log.len() - self.applied[n];
        let k = if all || pending == 0 { pending } else { (self.rand() % (pending as u64 + 1)) as usize };
        for i in self.applied[n]..self.applied[n] + k {
            let w = &self.log[i];
            if w.to & (1 << n) != 0 {
                self.mem[n][w.addr..w.addr + w.bytes.len()].copy_from_slice(&w.bytes);
            }
        }
        self.applied[n] += k;
    }
}

/// The simulated cluster.
#[derive(Clone)]
pub struct SimBus(Arc<Mutex<Inner>>);

impl SimBus {
    /// `nodes` nodes sharing `bytes` bytes of address space; `seed` fixes
    /// the lags.
    pub fn new(nodes: usize, bytes: usize, seed: u64) -> SimBus {
        SimBus(Arc::new(Mutex::new(Inner {
            mem: vec![vec![0; bytes]; nodes],
            log: Vec::new(),
            applied: vec![0; nodes],
            down: 0,
            corrupt: 0,
            rng: seed | 1,
        })))
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A transmit mapping of `len` bytes at `base` for node `from`, to
    /// node `dest` only or (None) to every other node.
    pub fn tx(&self, from: usize, base: usize, len: usize, dest: Option<usize>) -> SimTx {
        SimTx { bus: self.clone(), from, base, len, dest }
    }

    /// Node `n`'s receive mapping of `len` bytes at `base`.
    pub fn rx(&self, n: usize, base: usize, len: usize) -> SimRx {
        SimRx { bus: self.clone(), n, base, len }
    }

    /// Node `n` applies everything ordered so far.
    pub fn settle(&self, n: usize) {
        self.lock().catch_up(n, true)
    }

    /// Node `n`'s link goes down: its writes and writes to it are lost.
    pub fn link_down(&self, n: usize) {
        self.lock().down |= 1 << n;
    }

    /// Node `n`'s link is back.
    pub fn link_up(&self, n: usize) {
        self.lock().down &= !(1 << n);
    }

    /// The hub drops the next `writes` writes as corrupt.
    pub fn corrupt(&self, writes: usize) {
        self.lock().corrupt = writes;
    }

    /// Writes ordered so far (dropped ones included).
    pub fn writes(&self) -> usize {
        self.lock().log.len()
    }

    fn push(&self, from: usize, dest: Option<usize>, addr: usize, bytes: Vec<u8>) {
        let mut g = self.lock();
        let all = (1u64 << g.mem.len()) - 1;
        let mut to = match dest {
            Some(d) if d != from => 1 << d,
            Some(_) => 0,
            None => all & !(1 << from),
        };
        if g.down & (1 << from) != 0 {
            to = 0;
        }
        to &= !g.down;
        if g.corrupt > 0 {
            g.corrupt -= 1;
            to = 0;
        }
        g.log.push(Write { to, addr, bytes });
    }
}

/// A transmit mapping on a [`SimBus`].
pub struct SimTx {
    bus: SimBus,
    from: usize,
    base: usize,
    len: usize,
    dest: Option<usize>,
}

impl Tx for SimTx {
    fn len(&self) -> usize {
        self.len
    }
    fn store(&self, off: usize, v: u64) {
        assert!(off % 8 == 0 && off + 8 <= self.len, "store at {off} of {}", self.len);
        self.bus.push(self.from, self.dest, self.base + off, v.to_le_bytes().to_vec());
    }
    fn write(&self, off: usize, src: &[u8]) {
        assert!(off % 8 == 0 && off + src.len().next_multiple_of(8) <= self.len, "write at {off} of {}", self.len);
        // One write per 8-byte word, as the adapter's window sees them.
        for (i, chunk) in src.chunks(8).enumerate() {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.bus.push(self.from, self.dest, self.base + off + i * 8, w.to_vec());
        }
    }
}

/// A receive mapping on a [`SimBus`].
pub struct SimRx {
    bus: SimBus,
    n: usize,
    base: usize,
    len: usize,
}

impl Rx for SimRx {
    fn len(&self) -> usize {
        self.len
    }
    fn load(&self, off: usize) -> u64 {
        let mut g = self.bus.lock();
        g.catch_up(self.n, false);
        let a = self.base + off;
        u64::from_le_bytes(g.mem[self.n][a..a + 8].try_into().unwrap_or([0; 8]))
    }
    fn read(&self, off: usize, dst: &mut [u8]) {
        let g = self.bus.lock();
        let a = self.base + off;
        dst.copy_from_slice(&g.mem[self.n][a..a + dst.len()]);
    }
}
