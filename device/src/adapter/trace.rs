//! The adapter's register trace (`docs/adapter.md`, "Testing a driver"):
//! every access the guest makes to the adapter, and what the adapter does
//! on its own for the guest (interrupts, transmit DMA descriptors), as
//! [`Event`]s for whoever listens ([`Tracer::listen`]; served on a socket
//! by `crate::trace_socket`).
//!
//! Off, it costs one relaxed atomic load per access. On, events go through
//! a bounded channel: when the reader falls behind, events are dropped and
//! counted ([`Tracer::dropped`]), never waited for, so the trace never
//! slows the guest or the bus without saying so.
//!
//! Threads: the vfio-user thread (register, PCT, transmit-window accesses,
//! DMA maps, interrupt masks), deliverers and the DMA engine thread
//! (interrupts, descriptors) record; the trace socket's thread listens.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Mutex;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::regs::{decode, int, PAGE_SIZE};

/// Events a listener takes at most before the reader must catch up.
pub const DEFAULT_CAPACITY: usize = 65536;

/// One thing the trace shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Event {
    /// A BAR 0 register read (the value returned) or write.
    Reg {
        /// A write (else a read).
        write: bool,
        /// Offset in BAR 0.
        off: u64,
        /// The value.
        value: u32,
    },
    /// A PCT word read or written.
    Pct {
        /// A write (else a read).
        write: bool,
        /// The page.
        page: u64,
        /// Word 0 (flags) or 1 (receive address).
        word: u64,
        /// The value (of the bytes accessed).
        value: u64,
    },
    /// A store to the transmit window.
    Tx {
        /// The MEMORY CHANNEL page.
        page: u64,
        /// Offset in the page.
        off: u64,
        /// Bytes stored.
        len: u32,
        /// The bytes as a little-endian number, for stores of 8 bytes or less.
        value: Option<u64>,
    },
    /// QEMU mapped guest memory for the adapter.
    DmaMap {
        /// First IOVA.
        iova: u64,
        /// Bytes.
        size: u64,
        /// The device may write it.
        writable: bool,
    },
    /// QEMU unmapped guest memory (`all`: every map).
    DmaUnmap {
        /// First IOVA.
        iova: u64,
        /// Bytes.
        size: u64,
        /// Every map.
        all: bool,
    },
    /// The adapter signalled its interrupt (MSI-X or INTx), with these
    /// causes pending and enabled.
    Irq {
        /// `INT_CAUSE & INT_MASK` when it was signalled.
        cause: u32,
    },
    /// QEMU masked or unmasked interrupt `index` (a VFIO IRQ index).
    IrqMask {
        /// VFIO IRQ index.
        index: u32,
        /// Masked (else unmasked).
        masked: bool,
    },
    /// The DMA engine took a descriptor.
    DmaDesc {
        /// Its ring index (free-running).
        index: u32,
        /// Source IOVA.
        src: u64,
        /// MEMORY CHANNEL address.
        dest: u64,
        /// Bytes.
        len: u32,
        /// Flags.
        flags: u32,
    },
    /// The DMA engine retired a descriptor.
    DmaDone {
        /// Its ring index.
        index: u32,
        /// Status code (`regs::dma::status`).
        status: u32,
        /// Bytes sent.
        bytes: u32,
    },
    /// QEMU reset the device (vfio-user DEVICE_RESET; a CTRL.RESET shows as
    /// its register write only).
    Reset,
}

/// The kinds, as filters name them.
pub const KINDS: [&str; 10] =
    ["reg", "pct", "tx", "dma_map", "dma_unmap", "irq", "irq_mask", "dma_desc", "dma_done", "reset"];

impl Event {
    /// Its kind, as [`KINDS`] names it.
    pub fn kind(&self) -> &'static str {
        match self {
            Event::Reg { .. } => "reg",
            Event::Pct { .. } => "pct",
            Event::Tx { .. } => "tx",
            Event::DmaMap { .. } => "dma_map",
            Event::DmaUnmap { .. } => "dma_unmap",
            Event::Irq { .. } => "irq",
            Event::IrqMask { .. } => "irq_mask",
            Event::DmaDesc { .. } => "dma_desc",
            Event::DmaDone { .. } => "dma_done",
            Event::Reset => "reset",
        }
    }

    /// One line, with registers and bits by name (`regs::decode`).
    pub fn describe(&self) -> String {
        match *self {
            Event::Reg { write, off, value } => decode::describe_reg(write, off, value),
            Event::Pct { write, page, word, value } => decode::describe_pct(write, page, word, value),
            Event::Tx { page, off, len, value: Some(v) } => {
                format!("W TX page {page} +{off:#x} ({len} bytes) = {v:#x}")
            }
            Event::Tx { page, off, len, value: None } => format!("W TX page {page} +{off:#x} ({len} bytes)"),
            Event::DmaMap { iova, size, writable } => {
                format!("DMA map {iova:#x}..{:#x}{}", iova + size, if writable { "" } else { " (read-only)" })
            }
            Event::DmaUnmap { all: true, .. } => "DMA unmap all".to_string(),
            Event::DmaUnmap { iova, size, .. } => format!("DMA unmap {iova:#x}..{:#x}", iova + size),
            Event::Irq { cause } => {
                let names: Vec<String> = decode::reg_bits(crate::regs::reg::INT_CAUSE, cause & int::ALL);
                format!("IRQ [{}]", names.join(" "))
            }
            Event::IrqMask { index, masked } => {
                format!("IRQ index {index} {}", if masked { "masked" } else { "unmasked" })
            }
            Event::DmaDesc { index, src, dest, len, flags } => {
                format!(
                    "DMA desc {index}: {len} bytes from {src:#x} to MC {dest:#x} (page {}) flags {flags:#x}",
                    dest / PAGE_SIZE
                )
            }
            Event::DmaDone { index, status, bytes } => {
                format!(
                    "DMA done {index}: {} ({bytes} bytes)",
                    crate::regs::dma::status::name(status).to_ascii_uppercase()
                )
            }
            Event::Reset => "RESET".to_string(),
        }
    }

    /// The MEMORY CHANNEL page it concerns, if any.
    fn page(&self) -> Option<u64> {
        match *self {
            Event::Pct { page, .. } | Event::Tx { page, .. } => Some(page),
            Event::DmaDesc { dest, .. } => Some(dest / PAGE_SIZE),
            _ => None,
        }
    }

    /// A write (`Some(true)`), a read (`Some(false)`), or neither.
    fn write(&self) -> Option<bool> {
        match *self {
            Event::Reg { write, .. } | Event::Pct { write, .. } => Some(write),
            Event::Tx { .. } => Some(true),
            _ => None,
        }
    }
}

/// One event as the trace gives it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Events recorded by this adapter since it was created (dropped and
    /// filtered ones included: a gap shows where).
    pub seq: u64,
    /// Microseconds since the adapter was created.
    pub t_us: u64,
    /// What happened.
    #[serde(flatten)]
    pub event: Event,
}

/// What a listener wants; empty fields admit everything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Filter {
    /// Kinds ([`KINDS`]).
    #[serde(default)]
    pub kinds: Vec<String>,
    /// Register offsets (BAR 0); other register accesses are left out.
    #[serde(default)]
    pub regs: Vec<u64>,
    /// Pages `first..=last`; PCT, transmit and descriptor events outside are left out.
    #[serde(default)]
    pub pages: Option<(u64, u64)>,
    /// Only writes (`Some(true)`) or only reads (`Some(false)`); events
    /// that are neither pass.
    #[serde(default)]
    pub write: Option<bool>,
}

impl Filter {
    /// Checks the names it holds.
    pub fn check(&self) -> Result<(), String> {
        match self.kinds.iter().find(|k| !KINDS.contains(&k.as_str())) {
            Some(k) => Err(format!("unknown kind '{k}' (kinds: {})", KINDS.join(", "))),
            None => Ok(()),
        }
    }

    /// Whether `e` passes.
    pub fn admits(&self, e: &Event) -> bool {
        if !self.kinds.is_empty() && !self.kinds.iter().any(|k| k == e.kind()) {
            return false;
        }
        if let (false, Event::Reg { off, .. }) = (self.regs.is_empty(), e) {
            if !self.regs.contains(off) {
                return false;
            }
        }
        if let (Some((a, b)), Some(p)) = (self.pages, e.page()) {
            if p < a || p > b {
                return false;
            }
        }
        !matches!((self.write, e.write()), (Some(w), Some(x)) if w != x)
    }
}

struct Sink {
    tx: SyncSender<Record>,
    filter: Filter,
}

/// An adapter's trace point (see the module header).
pub struct Tracer {
    on: AtomicBool,
    sink: Mutex<Option<Sink>>,
    seq: AtomicU64,
    dropped: AtomicU64,
    t0: Instant,
}

impl Default for Tracer {
    fn default() -> Self {
        Tracer {
            on: AtomicBool::new(false),
            sink: Mutex::new(None),
            seq: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            t0: Instant::now(),
        }
    }
}

impl Tracer {
    /// Records the event `f` builds, if anyone listens.
    #[inline]
    pub fn record(&self, f: impl FnOnce() -> Event) {
        if self.on.load(Ordering::Relaxed) {
            self.send(f());
        }
    }

    #[cold]
    fn send(&self, event: Event) {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let mut g = self.sink.lock().unwrap();
        let Some(sink) = g.as_ref() else { return };
        if !sink.filter.admits(&event) {
            return;
        }
        let r = Record { seq, t_us: self.t0.elapsed().as_micros() as u64, event };
        match sink.tx.try_send(r) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
            Err(TrySendError::Disconnected(_)) => {
                *g = None;
                self.on.store(false, Ordering::Relaxed);
            }
        }
    }

    /// Starts a trace of what `filter` admits, at most `capacity` events
    /// ahead of the reader. A listener that was there is cut off (its
    /// receiver ends): one listener at a time.
    pub fn listen(&self, filter: Filter, capacity: usize) -> Receiver<Record> {
        let (tx, rx) = sync_channel(capacity.max(1));
        *self.sink.lock().unwrap() = Some(Sink { tx, filter });
        self.on.store(true, Ordering::Relaxed);
        rx
    }

    /// Stops the trace (the listener's receiver ends).
    pub fn stop(&self) {
        self.on.store(false, Ordering::Relaxed);
        *self.sink.lock().unwrap() = None;
    }

    /// Events dropped because a listener fell behind, since the adapter was created.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Whether anyone listens.
    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_is_bounded_and_counted_and_never_blocks() {
        let t = Tracer::default();
        // Off: nothing built, nothing counted.
        t.record(|| unreachable!("an event built while nobody listens"));
        let rx = t.listen(Filter::default(), 16);
        for i in 0..10_000 {
            t.record(|| Event::Reg { write: true, off: 0x2C, value: i });
        }
        assert_eq!(t.dropped(), 10_000 - 16);
        let got: Vec<Record> = rx.try_iter().collect();
        assert_eq!(got.len(), 16);
        assert_eq!(got[15].seq, 15);
        // The reader catches up: the next event is there, with the gap in seq.
        t.record(|| Event::Reset);
        assert_eq!(rx.try_recv().unwrap().seq, 10_000);
        // A listener that went away turns the trace off.
        drop(rx);
        t.record(|| Event::Reset);
        assert!(!t.is_on());
    }

    #[test]
    fn filters_take_kind_register_page_and_direction() {
        let f = Filter {
            kinds: vec!["reg".into(), "pct".into()],
            regs: vec![0x1C],
            pages: Some((4, 7)),
            write: Some(true),
        };
        assert!(f.admits(&Event::Reg { write: true, off: 0x1C, value: 1 }));
        assert!(!f.admits(&Event::Reg { write: false, off: 0x1C, value: 1 }));
        assert!(!f.admits(&Event::Reg { write: true, off: 0x2C, value: 1 }));
        assert!(f.admits(&Event::Pct { write: true, page: 4, word: 0, value: 1 }));
        assert!(!f.admits(&Event::Pct { write: true, page: 8, word: 0, value: 1 }));
        assert!(!f.admits(&Event::Tx { page: 5, off: 0, len: 8, value: Some(1) }));
        assert!(Filter::default().admits(&Event::Irq { cause: 1 }));
        assert!(Filter { kinds: vec!["bogus".into()], ..Filter::default() }.check().unwrap_err().contains("bogus"));
        let line =
            serde_json::to_string(&Record { seq: 3, t_us: 9, event: Event::Reg { write: true, off: 0x1C, value: 1 } })
                .unwrap();
        assert_eq!(line, r#"{"seq":3,"t_us":9,"kind":"reg","write":true,"off":28,"value":1}"#);
        assert_eq!(Event::Reg { write: true, off: 0x1C, value: 1 }.describe(), "W CTRL = 0x1 [RESET]");
        assert_eq!(Event::Irq { cause: 3 }.describe(), "IRQ [NOTIFY LINK]");
    }
}
