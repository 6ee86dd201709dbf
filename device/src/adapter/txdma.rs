//! The transmit DMA engine, an extension beyond the original adapter
//! (`docs/adapter.md`, "Transmit DMA"; layout in `regs::dma`): a ring of
//! descriptors in guest memory, each naming a source IOVA, a MEMORY
//! CHANNEL address, a length and flags. The engine reads the source through
//! the adapter's DMA maps and sends it as page-sized write packets into the
//! adapter's uplink, under the PCT rules stores follow, then writes the
//! descriptor's status back.
//!
//! Threads:
//! - the vfio-user thread programs the ring and rings the doorbell
//!   ([`TxDma::doorbell`]); it holds its later transmit stores, PCT writes
//!   and ring writes until the engine is idle ([`TxDma::wait_idle`]), which
//!   is what orders a doorbell before the stores after it; it stops the
//!   engine on a reset or a disconnect ([`TxDma::abort`]);
//! - the engine thread (`mc-txdma`, one per adapter, [`run`]) retires
//!   descriptors. It holds no lock while it reads guest memory or sends,
//!   and sends one packet per page, each ordered on its own by the hub, so
//!   a long transfer holds the hub's order for one page at a time.
//!
//! Registers are read from the vfio-user thread. The ring's indices are
//! behind one mutex ([`Ring`]), never held across guest memory or a send;
//! counters are atomics.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use tracing::debug;

use super::trace::Event;
use super::Shared;
use crate::regs::dma::{self, status, DESC_SIZE, DONE};
use crate::regs::{err, int, PAGE_SIZE};
use crate::uplink::{Unplugged, Uplink, WritePacket};

/// The ring as the driver programmed it, and the engine's position in it.
struct Ring {
    base: u64,
    /// Descriptors (a power of two), 0 while the engine is off.
    size: u32,
    /// Next descriptor to retire (free-running).
    head: u32,
    /// One past the last descriptor posted (free-running).
    tail: u32,
    uplink: Arc<dyn Uplink>,
    shutdown: bool,
    /// The engine dropped work because of an abort (taken by [`TxDma::abort`]).
    aborted: bool,
}

/// An idle engine's ring and counters, as a hand-over carries them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EngineState {
    base: u64,
    size: u32,
    head: u32,
    tail: u32,
    descs: u32,
    bytes: u64,
    last_error: u32,
}

/// The engine's state, in [`Shared`].
pub(super) struct TxDma {
    ring: Mutex<Ring>,
    /// Signalled when there is work (doorbell, abort, shutdown).
    work: Condvar,
    /// Signalled when the engine goes idle.
    idle: Condvar,
    /// From a doorbell that posts work until the engine has retired it and
    /// flushed the uplink: the vfio-user thread's fast check before a store.
    busy: AtomicBool,
    abort: AtomicBool,
    descs: AtomicU32,
    bytes: AtomicU64,
    /// Code of the last failure (`regs::dma::status`).
    last_error: AtomicU32,
}

impl TxDma {
    pub(super) fn new() -> TxDma {
        TxDma {
            ring: Mutex::new(Ring {
                base: 0,
                size: 0,
                head: 0,
                tail: 0,
                uplink: Arc::new(Unplugged),
                shutdown: false,
                aborted: false,
            }),
            work: Condvar::new(),
            idle: Condvar::new(),
            busy: AtomicBool::new(false),
            abort: AtomicBool::new(false),
            descs: AtomicU32::new(0),
            bytes: AtomicU64::new(0),
            last_error: AtomicU32::new(status::OK),
        }
    }

    /// Waits until every posted descriptor is retired and its packets are
    /// flushed to the uplink. Cheap when the engine is idle.
    pub(super) fn wait_idle(&self) {
        if !self.busy.load(Ordering::Acquire) {
            return;
        }
        let mut g = self.ring.lock().unwrap();
        while self.busy.load(Ordering::Acquire) {
            g = self.idle.wait(g).unwrap();
        }
    }

    /// Stops the engine at its next page: the descriptor in progress is
    /// retired with ABORTED, the rest of the posted ones are dropped. True
    /// when work was cut short.
    pub(super) fn abort(&self) -> bool {
        if !self.busy.load(Ordering::Acquire) {
            return false;
        }
        self.abort.store(true, Ordering::SeqCst);
        let mut g = self.ring.lock().unwrap();
        self.work.notify_all();
        while self.busy.load(Ordering::Acquire) {
            g = self.idle.wait(g).unwrap();
        }
        self.abort.store(false, Ordering::SeqCst);
        std::mem::take(&mut g.aborted)
    }

    /// The uplink packets go to (the vfio-user thread waits for idle first).
    pub(super) fn set_uplink(&self, uplink: Arc<dyn Uplink>) {
        self.wait_idle();
        self.ring.lock().unwrap().uplink = uplink;
    }

    /// Ends the engine thread (adapter dropped).
    pub(super) fn shutdown(&self) {
        self.abort.store(true, Ordering::SeqCst);
        self.ring.lock().unwrap().shutdown = true;
        self.work.notify_all();
    }

    /// DMA_RING_LO / DMA_RING_HI (after [`TxDma::wait_idle`]).
    pub(super) fn set_base(&self, hi: bool, v: u32) {
        let mut g = self.ring.lock().unwrap();
        g.base = if hi {
            (g.base & 0xFFFF_FFFF) | (v as u64) << 32
        } else {
            (g.base & !0xFFFF_FFFF) | (v as u64 & !(DESC_SIZE - 1))
        };
    }

    /// DMA_RING_SIZE (after [`TxDma::wait_idle`]): (re)starts the ring.
    /// False when `v` is not 0 or a power of two up to `MAX_RING` (the
    /// engine is then off).
    pub(super) fn set_size(&self, v: u32) -> bool {
        let ok = v == 0 || (v.is_power_of_two() && v <= dma::MAX_RING);
        let mut g = self.ring.lock().unwrap();
        g.size = if ok { v } else { 0 };
        g.head = 0;
        g.tail = 0;
        ok
    }

    /// DMA_TAIL: posts descriptors up to `tail`. The error code when the
    /// ring is off or `tail` would overflow it or move backwards (ignored).
    pub(super) fn doorbell(&self, tail: u32) -> Result<(), u32> {
        let mut g = self.ring.lock().unwrap();
        if g.size == 0 {
            return Err(status::RING);
        }
        let posted = tail.wrapping_sub(g.head);
        if posted > g.size || posted < g.tail.wrapping_sub(g.head) {
            return Err(status::OVERFLOW);
        }
        g.tail = tail;
        if posted > 0 {
            self.busy.store(true, Ordering::Release);
            self.work.notify_all();
        }
        Ok(())
    }

    /// The ring and counters of an idle engine, for a hand-over (after
    /// [`TxDma::wait_idle`]).
    pub(super) fn export(&self) -> EngineState {
        let g = self.ring.lock().unwrap();
        EngineState {
            base: g.base,
            size: g.size,
            head: g.head,
            tail: g.tail,
            descs: self.descs.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            last_error: self.last_error.load(Ordering::SeqCst),
        }
    }

    /// Takes an idle engine's state back ([`TxDma::export`]); refuses a ring
    /// the registers could not have set, or one with work posted.
    pub(super) fn import(&self, s: &EngineState) -> Result<(), String> {
        if !(s.size == 0 || (s.size.is_power_of_two() && s.size <= dma::MAX_RING)) {
            return Err(format!("transmit DMA ring of {} descriptors", s.size));
        }
        if s.head != s.tail {
            return Err(format!("transmit DMA engine not idle (head {}, tail {})", s.head, s.tail));
        }
        let mut g = self.ring.lock().unwrap();
        (g.base, g.size, g.head, g.tail) = (s.base & !(DESC_SIZE - 1), s.size, s.head, s.tail);
        self.descs.store(s.descs, Ordering::Relaxed);
        self.bytes.store(s.bytes, Ordering::Relaxed);
        self.last_error.store(s.last_error, Ordering::SeqCst);
        Ok(())
    }

    /// Descriptors retired and bytes sent since the last reset (what
    /// DMA_DESCS and DMA_BYTES read, the bytes whole).
    pub(super) fn totals(&self) -> (u32, u64) {
        (self.descs.load(Ordering::Relaxed), self.bytes.load(Ordering::Relaxed))
    }

    /// Reads a DMA register.
    pub(super) fn reg(&self, off: u64) -> u32 {
        use crate::regs::reg;
        match off {
            reg::DMA_RING_LO => self.ring.lock().unwrap().base as u32,
            reg::DMA_RING_HI => (self.ring.lock().unwrap().base >> 32) as u32,
            reg::DMA_RING_SIZE => self.ring.lock().unwrap().size,
            reg::DMA_TAIL => self.ring.lock().unwrap().tail,
            reg::DMA_HEAD => self.ring.lock().unwrap().head,
            reg::DMA_STATUS => {
                let busy = if self.busy.load(Ordering::Acquire) { dma::BUSY } else { 0 };
                busy | self.last_error.load(Ordering::SeqCst)
            }
            reg::DMA_DESCS => self.descs.load(Ordering::Relaxed),
            reg::DMA_BYTES => self.bytes.load(Ordering::Relaxed) as u32,
            _ => 0,
        }
    }

    /// Reset (after [`TxDma::abort`]): ring off, counters and status cleared.
    pub(super) fn reset(&self) {
        {
            let mut g = self.ring.lock().unwrap();
            g.base = 0;
            g.size = 0;
            g.head = 0;
            g.tail = 0;
            g.aborted = false;
        }
        self.descs.store(0, Ordering::Relaxed);
        self.bytes.store(0, Ordering::Relaxed);
        self.last_error.store(status::OK, Ordering::SeqCst);
    }
}

/// How a descriptor went.
enum Retired {
    /// Status written back with this code.
    Done(u32),
    /// The ring could not be read or written, or bus mastering is off:
    /// the engine stops and drops what was posted.
    Fault(u32),
}

impl Shared {
    /// A DMA failure: the code in DMA_STATUS, the DMA error bit, one error.
    pub(super) fn dma_failed(&self, code: u32) {
        debug!(code, "transmit DMA failed");
        self.txdma.last_error.store(code, Ordering::SeqCst);
        self.raise_error(err::DMA);
    }

    /// Retires descriptor `index`, at IOVA `at`.
    fn retire(&self, index: u32, at: u64, up: &dyn Uplink, buf: &mut [u8]) -> Retired {
        if !self.bus_master.load(Ordering::Acquire) {
            return Retired::Fault(status::NO_BUS_MASTER);
        }
        let mut d = [0u8; DESC_SIZE as usize];
        if self.dma.read(at, &mut d).is_err() {
            return Retired::Fault(status::RING);
        }
        let u64_at = |o: u64| u64::from_le_bytes(d[o as usize..o as usize + 8].try_into().unwrap());
        let u32_at = |o: u64| u32::from_le_bytes(d[o as usize..o as usize + 4].try_into().unwrap());
        let (src, dest, len, flags) = (u64_at(dma::SRC), u64_at(dma::DEST), u32_at(dma::LEN), u32_at(dma::FLAGS));
        self.trace.record(|| Event::DmaDesc { index, src, dest, len, flags });
        let (code, sent) = match self.faults.dma_desc() {
            Some(code) => (code, 0),
            None => self.transfer(src, dest, len as u64, flags, up, buf),
        };
        self.trace.record(|| Event::DmaDone { index, status: code, bytes: sent as u32 });
        // Bytes and status in one 8-byte store: a driver that sees DONE sees
        // the count. DMA_HEAD moves with it, under the ring's lock: a slot
        // whose status says DONE is free, and a doorbell that reuses it at
        // once must not find the engine a descriptor behind (OVERFLOW).
        let back = (sent as u32 as u64) | ((DONE | code) as u64) << 32;
        {
            let mut g = self.txdma.ring.lock().unwrap();
            if self.dma.write(at + dma::BYTES, &back.to_le_bytes()).is_err() {
                return Retired::Fault(status::RING);
            }
            if g.head == index {
                g.head = index.wrapping_add(1);
            }
        }
        self.txdma.descs.fetch_add(1, Ordering::Relaxed);
        // An abort is counted once by whoever aborted (after a reset's clearing).
        if code != status::OK && code != status::ABORTED {
            self.dma_failed(code);
        }
        if flags & dma::flags::INT != 0 {
            self.irq.lock().unwrap().raise(int::DMA);
        }
        Retired::Done(code)
    }

    /// Sends `len` bytes of guest memory at `src` to MEMORY CHANNEL address
    /// `dest`, one packet per page. Everything that can be checked is checked
    /// before the first packet; what can change meanwhile (PCT, maps, bus
    /// mastering, the link) is checked again per page. Returns the status
    /// code and the bytes sent.
    fn transfer(&self, src: u64, dest: u64, len: u64, flags: u32, up: &dyn Uplink, buf: &mut [u8]) -> (u32, u64) {
        if len == 0 || flags & !dma::flags::ALL != 0 {
            return (status::BAD_DESC, 0);
        }
        let end = match dest.checked_add(len) {
            Some(e) if e <= self.pages * PAGE_SIZE => e,
            _ => return (status::RANGE, 0),
        };
        if self.dma.check_readable(src, len).is_err() {
            return (status::SRC_UNMAPPED, 0);
        }
        for page in dest / PAGE_SIZE..=(end - 1) / PAGE_SIZE {
            if let Err(code) = self.dma_route(page) {
                return (code, 0);
            }
        }
        let mut sent = 0u64;
        while sent < len {
            if self.txdma.abort.load(Ordering::Relaxed) {
                return (status::ABORTED, sent);
            }
            let at = dest + sent;
            let n = (len - sent).min(PAGE_SIZE - at % PAGE_SIZE) as usize;
            let (to, pflags) = match self.dma_route(at / PAGE_SIZE) {
                Ok(r) => r,
                Err(code) => return (code, sent),
            };
            if !self.bus_master.load(Ordering::Acquire) {
                return (status::NO_BUS_MASTER, sent);
            }
            if self.dma.read(src + sent, &mut buf[..n]).is_err() {
                return (status::SRC_UNMAPPED, sent);
            }
            if up.send(&WritePacket { dest: to, flags: pflags, addr: at, data: &buf[..n] }).is_err() {
                return (status::LINK_DOWN, sent);
            }
            self.tx_packets.fetch_add(1, Ordering::Relaxed);
            self.txdma.bytes.fetch_add(n as u64, Ordering::Relaxed);
            sent += n as u64;
        }
        (status::OK, sent)
    }

    /// Where a DMA packet for `page` goes, under the rules stores follow;
    /// ACK pages are refused.
    fn dma_route(&self, page: u64) -> Result<(u16, u16), u32> {
        match self.route(page) {
            Ok((_, f)) if f & link::FLAG_ACK != 0 => Err(status::ACK_PAGE),
            Ok(r) => Ok(r),
            Err(e) if e == err::TX_DEST => Err(status::TX_DEST),
            Err(_) => Err(status::TX_DISABLED),
        }
    }
}

/// The engine thread: retires descriptors whenever some are posted, until
/// [`TxDma::shutdown`].
pub(super) fn run(shared: Arc<Shared>) {
    let e = &shared.txdma;
    let mut buf = vec![0u8; PAGE_SIZE as usize];
    let mut g = e.ring.lock().unwrap();
    loop {
        if g.shutdown {
            e.busy.store(false, Ordering::Release);
            e.idle.notify_all();
            return;
        }
        if g.head != g.tail && e.abort.load(Ordering::SeqCst) {
            // Posted but not started: dropped.
            g.tail = g.head;
            g.aborted = true;
        }
        if g.head == g.tail {
            if e.busy.load(Ordering::Acquire) {
                // Everything this doorbell posted goes out before the
                // vfio-user thread may store again.
                let up = g.uplink.clone();
                drop(g);
                up.flush();
                g = e.ring.lock().unwrap();
                if g.head != g.tail {
                    continue;
                }
                e.busy.store(false, Ordering::Release);
                e.idle.notify_all();
            }
            g = e.work.wait(g).unwrap();
            continue;
        }
        let (idx, at, up) = (g.head, g.base + (g.head & (g.size - 1)) as u64 * DESC_SIZE, g.uplink.clone());
        drop(g);
        let r = shared.retire(idx, at, &*up, &mut buf);
        g = e.ring.lock().unwrap();
        match r {
            Retired::Done(code) => {
                // DMA_HEAD moved with the write-back (`retire`).
                if code == status::ABORTED {
                    g.aborted = true;
                }
            }
            Retired::Fault(code) => {
                g.tail = g.head;
                drop(g);
                shared.dma_failed(code);
                g = e.ring.lock().unwrap();
            }
        }
    }
}
