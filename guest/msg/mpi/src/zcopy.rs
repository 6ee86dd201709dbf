//! Zero-copy memory (docs/mpi.md, "Zero copy"): what `MPI_Alloc_mem` hands
//! out when the job spans guests, and the engine's [`Direct`] transfers
//! from one such buffer straight into another.
//!
//! The memory is the spare of UMP's transmit DMA source area
//! ([`ump::dma_spare`], `MCMPI_ALLOC_MEM` bytes): the adapter's engine can
//! send from it, and this rank's landing region (a MEMORY CHANNEL region
//! keyed by job and rank, as big as the spare) is received into the spare
//! itself (imcd's `DmaLand`), so what other ranks send to that region is
//! written straight into it. A receive posted there is the target of the
//! sender's DMA; a send from there is the DMA's source: no copy on either
//! side, and no ring.
//!
//! Owns: the pool `MPI_Alloc_mem` carves (first fit, 64-byte aligned),
//! the landing region, the other ranks' landing regions as DMA targets
//! (attached the first time one is sent to), the transfers in flight, and
//! the adapter's loss stamp (its error count and link events, as
//! `Direct::losses` reads them). Everything is set up at the first
//! `MPI_Alloc_mem`; a rank that never calls it (or whose set-up failed:
//! `why_not`) gets `malloc` memory and the usual protocol.
//!
//! Touched by the thread that calls MPI (under the C layer's lock).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use imc_client::dma::{DmaHandle, DmaTarget};
use imc_client::guest_mem::{Mapping, ReadWrite};
use imc_client::keys::Namespace;
use imc_client::Regs;
use rustc_hash::FxHashMap as HashMap;
use thiserror::Error;

use crate::engine::Direct;

/// Why there is no zero-copy memory.
#[derive(Debug, Error)]
pub enum ZcopyError {
    /// UMP has no spare DMA memory (no engine, no imcd, none asked for).
    #[error("UMP: {0}")]
    Ump(#[from] ump::UmpError),
    /// imcd refused a step of the set-up.
    #[error("imcd: {0}")]
    Imc(#[from] imc_client::ImcError),
    /// No rank of the job is on another guest: nothing to send by DMA.
    #[error("every rank is on this guest")]
    AllLocal,
}

/// How long a transfer may be in flight before its poll also asks the
/// engine whether it is still busy.
const DROPPED_AFTER: Duration = Duration::from_millis(50);

/// Alignment of what the pool hands out.
const ALIGN: usize = 64;

/// Default bytes of zero-copy memory per rank (`MCMPI_ALLOC_MEM`): UMP's
/// largest spare.
pub const ALLOC_MEM_DEFAULT: usize = ump::DMA_SPARE_MAX;

/// The key of rank `rank`'s landing region in job `job`.
fn landing_key(job: u32, rank: u32) -> u64 {
    Namespace::MpiLanding.key((job as u64) << 32 | rank as u64)
}

/// First-fit blocks over `len` bytes: offsets only, no memory.
#[derive(Debug)]
struct Blocks {
    /// Bytes in all.
    len: usize,
    /// Free ranges, by offset.
    free: BTreeMap<usize, usize>,
    /// Blocks handed out, by offset: their sizes.
    used: HashMap<usize, usize>,
}

impl Blocks {
    fn new(len: usize) -> Blocks {
        Blocks { len, free: BTreeMap::from([(0, len)]), used: HashMap::default() }
    }

    fn alloc(&mut self, size: usize) -> Option<usize> {
        let size = size.max(1).checked_next_multiple_of(ALIGN)?;
        let (&off, &len) = self.free.iter().find(|(_, &len)| len >= size)?;
        self.free.remove(&off);
        if len > size {
            self.free.insert(off + size, len - size);
        }
        self.used.insert(off, size);
        Some(off)
    }

    /// Gives back the block at `off`; false if there is none.
    fn free(&mut self, off: usize) -> bool {
        let Some(size) = self.used.remove(&off) else { return false };
        let (mut start, mut end) = (off, off + size);
        if let Some((&p, &plen)) = self.free.range(..off).next_back() {
            if p + plen == off {
                self.free.remove(&p);
                start = p;
            }
        }
        if let Some(next) = self.free.remove(&end) {
            end += next;
        }
        self.free.insert(start, end - start);
        true
    }
}

/// The set-up that works: the spare, this rank's landing region, and the
/// adapter's registers (for its loss stamp).
struct Pool {
    spare: ump::mc::DmaSpare,
    blocks: Blocks,
    regs: Regs,
}

/// Another rank's landing region, attached for transmit.
struct Target {
    target: DmaTarget,
    _window: Mapping<ReadWrite>,
}

/// This rank's zero-copy memory and transfers.
pub struct Zcopy {
    job: u32,
    /// Per rank: on another guest (a peer DMA can reach).
    remote: Vec<bool>,
    bytes: usize,
    pool: Option<Result<Pool, String>>,
    /// Other ranks' landing regions; `None` where attaching failed.
    targets: HashMap<u32, Option<Target>>,
    /// Transfers in flight, and when each started.
    flying: HashMap<u64, (DmaHandle, Instant)>,
    next: u64,
    /// The adapter's loss stamp as last read (`Direct::losses`).
    losses: Option<u64>,
}

impl Zcopy {
    /// For rank of job `job` whose peers on other guests are `remote`,
    /// with `bytes` of memory (nothing is set up yet).
    pub fn new(job: u32, remote: Vec<bool>, bytes: usize) -> Zcopy {
        Zcopy {
            job,
            remote,
            bytes,
            pool: None,
            targets: HashMap::default(),
            flying: HashMap::default(),
            next: 1,
            losses: None,
        }
    }

    fn open(&self, me: u32) -> Result<Pool, ZcopyError> {
        if !self.remote.iter().any(|&r| r) {
            return Err(ZcopyError::AllLocal);
        }
        let spare = ump::dma_spare()?;
        let len = spare.len().min(self.bytes);
        let (id, ..) = spare.imc().asalloc(landing_key(self.job, me), len as u64, 0o666, false)?;
        spare.land(id)?;
        let regs = spare.imc().regs()?;
        Ok(Pool { spare, blocks: Blocks::new(len), regs })
    }

    /// Rank `to`'s landing region as a DMA target, attached the first time.
    fn target(&mut self, to: u32) -> Option<DmaTarget> {
        let Some(Ok(p)) = self.pool.as_ref() else { return None };
        let job = self.job;
        let len = p.blocks.len;
        let t = self.targets.entry(to).or_insert_with(|| {
            let attach = || -> Result<Target, imc_client::ImcError> {
                let imc = p.spare.imc();
                let (id, ..) = imc.asalloc(landing_key(job, to), len as u64, 0o666, false)?;
                let window = imc.asattach_tx(id, false)?;
                let target = imc.dma_target(id)?;
                Ok(Target { target, _window: window })
            };
            attach().map_err(|e| eprintln!("mcmpi: no zero copy to rank {to}: {e}")).ok()
        });
        t.as_ref().map(|t| t.target)
    }
}

impl Direct for Zcopy {
    fn landing(&self, peer: u32, ptr: *const u8, len: usize) -> Option<u64> {
        let Some(Ok(p)) = self.pool.as_ref() else { return None };
        if !self.remote.get(peer as usize).copied().unwrap_or(false) {
            return None;
        }
        let off = (ptr as usize).checked_sub(p.spare.as_ptr() as usize)?;
        (off.checked_add(len)? <= p.blocks.len).then_some(off as u64)
    }

    fn start(&mut self, to: u32, off: u64, src: *const u8, len: usize) -> Option<u64> {
        if !self.remote.get(to as usize).copied().unwrap_or(false) {
            return None;
        }
        let target = self.target(to)?;
        let Some(Ok(p)) = self.pool.as_ref() else { return None };
        let h = p.spare.start(&target, off, src, len as u64).ok()?;
        let token = self.next;
        self.next += 1;
        self.flying.insert(token, (h, Instant::now()));
        Some(token)
    }

    fn poll(&mut self, token: u64) -> Option<bool> {
        let Some(Ok(p)) = self.pool.as_ref() else { return Some(false) };
        let (h, since) = self.flying.get(&token)?;
        // A transfer takes milliseconds; one still in flight after
        // DROPPED_AFTER is checked against the engine (a register read),
        // in case it stopped without retiring it (a reset).
        let outcome = if since.elapsed() < DROPPED_AFTER { p.spare.test(h) } else { p.spare.check(h) };
        let done = match outcome {
            Ok(None) => return None,
            Ok(Some(_)) => true,
            Err(_) => false,
        };
        self.flying.remove(&token);
        Some(done)
    }

    fn losses(&mut self, fresh: bool) -> u64 {
        let Some(Ok(p)) = self.pool.as_ref() else { return 0 };
        if fresh || self.losses.is_none() {
            // Two trapped loads.
            self.losses = Some((p.regs.hw_errcnt() as u64) << 32 | p.regs.link_events() as u64);
        }
        self.losses.unwrap_or(0)
    }

    /// `len` bytes of zero-copy memory, setting it up the first time;
    /// `None` when there is none (or no room: the caller uses `malloc`).
    fn alloc(&mut self, me: u32, len: usize) -> Option<*mut u8> {
        if self.pool.is_none() {
            self.pool = Some(self.open(me).map_err(|e| e.to_string()));
        }
        let p = self.pool.as_mut()?.as_mut().ok()?;
        let off = p.blocks.alloc(len)?;
        Some(p.spare.as_ptr().wrapping_add(off))
    }

    /// Gives back memory [`Zcopy::alloc`] returned; false if `ptr` is not
    /// such memory (the caller frees it its own way).
    fn free(&mut self, ptr: *mut u8) -> bool {
        let Some(Ok(p)) = self.pool.as_mut() else { return false };
        let Some(off) = (ptr as usize).checked_sub(p.spare.as_ptr() as usize) else { return false };
        p.blocks.free(off)
    }

    fn why_not(&self) -> Option<String> {
        match &self.pool {
            Some(Err(e)) => Some(e.clone()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_aligned_first_fit_and_coalesce_when_freed() {
        let mut b = Blocks::new(1024);
        let a = b.alloc(100).unwrap();
        let c = b.alloc(1).unwrap();
        let d = b.alloc(64).unwrap();
        assert_eq!((a, c, d), (0, 128, 192), "64-byte aligned, one after another");
        assert_eq!(b.alloc(1024), None, "no room");
        assert!(b.free(c));
        assert!(!b.free(c), "freed twice");
        assert!(!b.free(5), "not a block");
        assert_eq!(b.alloc(64), Some(128), "the hole is reused");
        assert!(b.free(128) && b.free(a) && b.free(d));
        assert_eq!(b.free.len(), 1, "everything coalesced: {:?}", b.free);
        assert_eq!(b.alloc(1024), Some(0), "the whole range again");
    }

    #[test]
    fn landing_keys_are_per_job_and_rank() {
        assert_ne!(landing_key(1, 2), landing_key(2, 1));
        assert_eq!(Namespace::of(landing_key(u32::MAX, u32::MAX)), Some(Namespace::MpiLanding));
    }
}
