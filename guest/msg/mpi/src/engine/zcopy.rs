//! Zero copy (see the engine's "Protocols" and docs/mpi.md, "Zero copy"):
//! the [`Direct`] memory a DMA comes from and lands in, and the sends
//! moving by one DMA until the receiver took them.

use super::*;

/// Zero-copy transfers between guests ([`crate::zcopy`] is the real one):
/// memory a DMA can both come from and land in.
pub trait Direct: Send {
    /// Where `len` bytes at `ptr` are in this rank's landing memory, if
    /// they are there and rank `peer` can send to it by DMA.
    fn landing(&self, peer: u32, ptr: *const u8, len: usize) -> Option<u64>;
    /// Starts sending `len` bytes at `src` to byte `off` of rank `to`'s
    /// landing memory; `None` when that cannot be done (the bytes are not
    /// in this rank's memory, or the engine refused).
    fn start(&mut self, to: u32, off: u64, src: *const u8, len: usize) -> Option<u64>;
    /// A transfer's outcome: `Some(true)` sent whole, `Some(false)` failed,
    /// `None` in flight.
    fn poll(&mut self, token: u64) -> Option<bool>;
    /// A stamp of what this node's adapter saw that may have lost a write
    /// to it: its error count and its link events (another node leaving,
    /// as a sender whose link went down with packets in flight does), both
    /// only ever growing. With `fresh`, read now from the adapter (trapped
    /// loads); without, the last one read (reading it the first time): an
    /// older stamp only makes a comparison more cautious.
    fn losses(&mut self, fresh: bool) -> u64;
    /// `len` bytes of landing memory for rank `me` (`MPI_Alloc_mem`), if
    /// there is any.
    fn alloc(&mut self, _me: u32, _len: usize) -> Option<*mut u8> {
        None
    }
    /// Gives back memory [`Direct::alloc`] returned; false if `ptr` is not
    /// such memory.
    fn free(&mut self, _ptr: *mut u8) -> bool {
        false
    }
    /// Why there is no landing memory, once it was asked for.
    fn why_not(&self) -> Option<String> {
        None
    }
}

/// A send moving by zero copy.
#[derive(Debug)]
pub(super) struct DirectSend {
    pub(super) sreq: ReqId,
    pub(super) rreq: u64,
    pub(super) to: u32,
    /// The transfer in flight; `None` once `DONE` is queued.
    pub(super) token: Option<u64>,
}

impl Engine {
    /// Gives the engine zero-copy transfers ([`Direct`]).
    pub fn set_direct(&mut self, d: Box<dyn Direct>) {
        self.direct = Some(d);
    }

    /// Per rank: whether it is on another guest.
    pub fn remote_ranks(&self) -> Vec<bool> {
        self.links.iter().map(|l| l.as_ref().is_some_and(|l| l.remote())).collect()
    }

    /// Why this rank has no zero-copy memory, once it was asked for (or
    /// was never given any).
    pub fn direct_why_not(&self) -> Option<String> {
        match &self.direct {
            Some(d) => d.why_not(),
            None => Some("off, or every rank on this guest".into()),
        }
    }

    /// The zero-copy transfers, if set.
    pub fn direct_mut(&mut self) -> Option<&mut (dyn Direct + 'static)> {
        self.direct.as_deref_mut()
    }

    /// Moves zero-copy sends whose DMA finished: `DONE` when it was sent
    /// whole, else the message goes as `DATA` (whatever was lost on the way
    /// shows in the receiver's loss stamp). Returns whether anything moved.
    pub(super) fn poll_direct(&mut self) -> Result<bool, EngineError> {
        let Some(d) = self.direct.as_deref_mut() else { return Ok(false) };
        if self.direct_sends.iter().all(|z| z.token.is_none()) {
            return Ok(false);
        }
        // (index, sent whole)
        let mut ended = Vec::new();
        for (i, z) in self.direct_sends.iter().enumerate() {
            if let Some(ok) = z.token.and_then(|t| d.poll(t)) {
                ended.push((i, ok));
            }
        }
        for &(i, good) in ended.iter().rev() {
            let (sreq, rreq, to) = (self.direct_sends[i].sreq, self.direct_sends[i].rreq, self.direct_sends[i].to);
            if good {
                let len = match self.reqs.get(&sreq) {
                    Some(Req { kind: Kind::Send { data, .. }, .. }) => data.len(),
                    _ => 0,
                };
                self.direct_sends[i].token = None;
                self.out[to as usize].push_back(Out::Frame(header(DONE, 0, 0, 0, len as u64, sreq, rreq).to_vec()));
                self.stats.zero_copy.0 += 1;
                self.stats.zero_copy.1 += len as u64;
                self.stats.bytes_out += len as u64;
                self.flush(to as usize)?;
            } else {
                self.direct_sends.remove(i);
                self.stream_instead(to, sreq, rreq)?;
            }
        }
        Ok(!ended.is_empty())
    }
}
