//! `mctool conform SCENARIO`: the project's own driver (`guest-driver`,
//! the library imcd runs on) taking part in the driver conformance suite
//! (`docs/adapter.md`, "The conformance suite"). The host's runner
//! (`mc-cluster conform`) starts it once per scenario, reads the lines it
//! prints (`ready`, `notify PAGE`, `error 0xBITS`, `link UP 0xMEMBERS`,
//! `fifo COUNT LOST`, `dma …`, `released`) and writes `drain` or closes
//! its standard input.
//!
//! Threads: the main thread owns the adapter and runs the event loop; one
//! thread reads standard input into a channel.

use std::cell::Cell;
use std::io::{BufRead, Write};
use std::path::Path;
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use guest_driver::guest_mem::{Mapping, ReadWrite};
use guest_driver::txdma::{Descriptor, DmaRing, DMA_RING_IOVA};
use guest_driver::{rx_buffer, Adapter, Interrupt, RX_IOVA_BASE};
use regs::{dma, int, pct, reg, NOTIFY_EMPTY, PAGE_SIZE};

use crate::raw::{check_page, tx_page};

/// The scenarios, with the arguments the runner gives them.
#[derive(Subcommand, Clone, Copy, Debug)]
pub(crate) enum Scenario {
    /// Bring-up from whatever state the adapter is in; receive with interrupt on PAGE.
    Reset {
        /// The page to receive on.
        page: u64,
    },
    /// Report and clear every error the adapter raises.
    Errors,
    /// Report link and membership changes.
    Link,
    /// Receive with interrupt on PAGE, notification interrupts off until `drain`.
    Fifo {
        /// The page to receive on.
        page: u64,
    },
    /// COUNT one-page transmit DMA descriptors to PAGE, keeping the ring full.
    Dma {
        /// The destination page.
        page: u64,
        /// Descriptors to send.
        count: u32,
    },
    /// Let go of the adapter when the kernel asks for it back.
    Removal,
}

/// Where the DMA scenario's source page is mapped for the adapter.
const SRC_IOVA: u64 = 0x0C00_0000;
/// Longest wait for one interrupt before looking at standard input again.
const TICK: Duration = Duration::from_millis(20);
/// Most descriptors in the DMA scenario's ring.
const MAX_RING: u32 = 8;

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    // The runner reads these as they come; a closed stdout ends us anyway.
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

/// Standard input's lines; `None` once it reaches end of file.
fn stdin_lines() -> Receiver<Option<String>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            match line {
                Ok(l) => {
                    if tx.send(Some(l.trim().to_string())).is_err() {
                        return;
                    }
                }
                Err(_) => break,
            }
        }
        let _ = tx.send(None);
    });
    rx
}

/// What one look at standard input found.
enum Input {
    Nothing,
    Line(String),
    End,
}

fn input(rx: &Receiver<Option<String>>) -> Input {
    match rx.try_recv() {
        Ok(Some(l)) => Input::Line(l),
        Ok(None) | Err(TryRecvError::Disconnected) => Input::End,
        Err(TryRecvError::Empty) => Input::Nothing,
    }
}

/// The adapter, its interrupts and the memory it may reach, for one run.
struct Driver {
    a: Adapter,
    irq: Interrupt,
    release: Interrupt,
    /// Interrupt causes enabled (INT_MASK).
    mask: Cell<u32>,
    /// Receive memory, kept mapped while the PCT points at it.
    _rx: Option<Mapping<ReadWrite>>,
}

impl Driver {
    /// Opens the adapter (bus mastering on: vfio-pci turns it off at every
    /// open), resets it, whatever an earlier user left in it, and routes
    /// its interrupt and the kernel's release request to eventfds.
    fn open() -> Result<Driver> {
        let a = Adapter::open().context("opening the adapter")?;
        a.reset();
        let irq = Interrupt::msix(&a.dev).context("routing the adapter's interrupt")?;
        let release = Interrupt::release_request(&a.dev).context("registering the release request")?;
        Ok(Driver { a, irq, release, mask: Cell::new(0), _rx: None })
    }

    /// Receive (with interrupt) on `page` into a buffer mapped for DMA.
    fn receive(&mut self, page: u64) -> Result<()> {
        check_page(&self.a, page)?;
        let buf = rx_buffer(Path::new(&format!("/dev/shm/mc-conform-{page}")), 1)?;
        self.a.dev.map_dma(&buf, RX_IOVA_BASE)?;
        self.a.set_page(page, pct::RX | pct::INT, RX_IOVA_BASE);
        self._rx = Some(buf);
        Ok(())
    }

    /// Clears every cause latched so far, then enables `mask`.
    fn enable(&self, mask: u32) {
        self.mask.set(mask);
        self.a.set_reg(reg::INT_CAUSE, int::ALL);
        self.a.set_reg(reg::INT_MASK, mask);
    }

    /// Waits up to a tick for the interrupt; handles the enabled causes
    /// that are pending and returns them (0: none).
    fn service(&self) -> Result<u32> {
        if self.irq.wait(TICK)? == 0 {
            return Ok(0);
        }
        let cause = self.a.reg(reg::INT_CAUSE) & self.mask.get();
        self.a.set_reg(reg::INT_CAUSE, cause);
        if cause & int::NOTIFY != 0 {
            // Bounded: a FIFO that never empties is a device that is gone.
            for _ in 0..2 * regs::NOTIFY_DEPTH {
                match self.a.reg(reg::NOTIFY_FIFO) {
                    NOTIFY_EMPTY => break,
                    p => say(&format!("notify {p}")),
                }
            }
        }
        if cause & int::LINK != 0 {
            let members = regs::members_bitmap(self.a.reg(reg::MEMBERS_LO), self.a.reg(reg::MEMBERS_HI));
            say(&format!("link {} {members:#x}", self.a.reg(reg::LINK) & 1));
        }
        if cause & int::ERROR != 0 {
            let e = self.a.reg(reg::ERR_STATUS);
            self.a.set_reg(reg::ERR_STATUS, e);
            say(&format!("error {e:#x}"));
        }
        Ok(cause)
    }

    /// True once the kernel asked for the device back.
    fn released(&self) -> Result<bool> {
        Ok(self.release.wait(Duration::ZERO)? > 0)
    }

    /// Turns everything off before the maps go with the process.
    fn close(self) {
        self.a.set_reg(reg::INT_MASK, 0);
        self.a.reset();
    }
}

/// Runs one scenario until standard input ends (or, for every scenario,
/// the kernel asks for the adapter back).
pub(crate) fn run(s: Scenario) -> Result<()> {
    let stdin = stdin_lines();
    let mut d = Driver::open()?;
    let all = int::NOTIFY | int::LINK | int::ERROR;
    let mut ring = None;
    match s {
        Scenario::Reset { page } => {
            d.receive(page)?;
            d.enable(all);
        }
        Scenario::Errors | Scenario::Link | Scenario::Removal => d.enable(all),
        Scenario::Fifo { page } => {
            d.receive(page)?;
            d.enable(int::LINK | int::ERROR);
        }
        Scenario::Dma { page, count } => {
            if !d.a.has_tx_dma() {
                say("unsupported the adapter has no transmit DMA engine (CAPS)");
                d.close();
                return Ok(());
            }
            tx_page(&d.a, page)?;
            d.enable(all | int::DMA);
            ring = Some(Sending::new(&d.a, page, count)?);
        }
    }
    say("ready");
    loop {
        if d.released()? {
            say("released");
            break;
        }
        match input(&stdin) {
            Input::End => break,
            Input::Line(l) if l == "drain" => drain(&d)?,
            Input::Line(_) | Input::Nothing => {}
        }
        let cause = d.service()?;
        if let Some(r) = ring.as_mut() {
            if r.step(cause)? {
                say(&format!("dma done {} ok {} failed {}", r.count, r.ok, r.failed));
                ring = None;
            }
        }
    }
    drop(ring);
    d.close();
    Ok(())
}

/// `fifo`: pop every notification the FIFO holds, report how many and how
/// many it lost, then take notifications by interrupt.
fn drain(d: &Driver) -> Result<()> {
    let mut n = 0u32;
    while d.a.reg(reg::NOTIFY_FIFO) != NOTIFY_EMPTY {
        n += 1;
        if n as usize > 2 * regs::NOTIFY_DEPTH {
            bail!("the notification FIFO did not empty after {n} reads");
        }
    }
    say(&format!("fifo {n} {}", d.a.reg(reg::NOTIFY_LOST)));
    d.a.set_reg(reg::INT_CAUSE, int::NOTIFY);
    d.mask.set(d.mask.get() | int::NOTIFY);
    d.a.set_reg(reg::INT_MASK, d.mask.get());
    Ok(())
}

/// `dma`: COUNT one-page descriptors through a small ring, kept full.
struct Sending<'a> {
    ring: DmaRing<&'a Adapter>,
    size: u32,
    desc: Descriptor,
    count: u32,
    posted: u32,
    /// Descriptors whose written-back status this driver has read: a slot
    /// is posted again only after that, never as soon as DMA_HEAD moves.
    read: u32,
    ok: u32,
    failed: u32,
    _src: Mapping<ReadWrite>,
}

impl<'a> Sending<'a> {
    fn new(a: &'a Adapter, page: u64, count: u32) -> Result<Sending<'a>> {
        if count < 2 {
            bail!("dma: COUNT must be at least 2 (the ring holds at most COUNT/2)");
        }
        // The largest power of two up to COUNT/2, at most MAX_RING.
        let size = (1u32 << (31 - (count / 2).leading_zeros())).min(MAX_RING);
        let src = rx_buffer(Path::new("/dev/shm/mc-conform-src"), 1)?;
        src.fill(0, PAGE_SIZE as usize, 0x5a)?;
        a.dev.map_dma(&src, SRC_IOVA)?;
        let ring = a.dma_ring(Path::new("/dev/shm/mc-conform-ring"), DMA_RING_IOVA, size)?;
        let desc = Descriptor { src: SRC_IOVA, mc_addr: page * PAGE_SIZE, len: PAGE_SIZE, interrupt: true };
        let mut s = Sending { ring, size, desc, count, posted: 0, read: 0, ok: 0, failed: 0, _src: src };
        s.fill()?;
        Ok(s)
    }

    /// Posts while the ring has room, then rings the doorbell once.
    fn fill(&mut self) -> Result<()> {
        while self.posted < self.count && self.posted - self.read < self.size {
            self.ring.post(&self.desc)?;
            self.posted += 1;
        }
        self.ring.ring();
        Ok(())
    }

    /// Reads the retired descriptors in order and posts more; true once
    /// every one is retired.
    fn step(&mut self, _cause: u32) -> Result<bool> {
        let before = self.read;
        while self.read < self.posted {
            let Some((code, _bytes)) = self.ring.completion(self.read)? else { break };
            if code == dma::status::OK {
                self.ok += 1;
            } else {
                self.failed += 1;
                say(&format!("dma failed {} {}", self.read, dma::status::name(code)));
            }
            self.read += 1;
        }
        if self.read != before {
            self.fill()?;
        }
        Ok(self.read == self.count)
    }
}
