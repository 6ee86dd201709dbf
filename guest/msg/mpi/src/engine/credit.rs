//! Credits (see the engine's "Protocols"): what each sender may have sent
//! eagerly to a rank and not yet matched there, and giving it back as
//! receives take the messages.

use super::*;

/// What an unexpected message costs a receiver beyond its payload (its
/// queue entry), in credit.
pub const ENTRY_COST: usize = 64;

/// Eager bytes a rank may have waiting unmatched at it, from all other
/// ranks together, unless `MCMPI_UNEXPECTED` says: the credit of each
/// sender is this much over the other ranks, and at least
/// [`CREDIT_MIN_MESSAGES`] eager messages of the largest size.
pub const UNEXPECTED_DEFAULT: usize = 16 << 20;

/// Largest eager messages a sender's credit always covers.
pub const CREDIT_MIN_MESSAGES: usize = 2;

/// Credit a message of `len` bytes costs.
pub(super) fn cost(len: usize) -> usize {
    len + ENTRY_COST
}

impl Engine {
    /// Every sender's credit: the unexpected limit over the other ranks,
    /// at least [`CREDIT_MIN_MESSAGES`] eager messages of the largest size.
    pub fn credit_limit(&self) -> usize {
        let others = self.links.len().saturating_sub(1).max(1);
        (self.unexpected_limit / others).max(CREDIT_MIN_MESSAGES * cost(self.eager_limit))
    }

    /// Sets the eager bytes this rank may hold unmatched from all others
    /// together (`MCMPI_UNEXPECTED`). Every rank of a job must set the
    /// same, before any message.
    pub fn set_unexpected_limit(&mut self, n: usize) {
        self.unexpected_limit = n;
        self.reset_credit();
    }

    pub(super) fn reset_credit(&mut self) {
        let c = self.credit_limit();
        self.credit.iter_mut().for_each(|x| *x = c);
    }

    /// Eager bytes (with [`ENTRY_COST`] each) waiting unmatched here now.
    pub fn unexpected_bytes(&self) -> usize {
        self.unexpected_bytes
    }

    /// An eager message of `len` bytes from `src` left the unexpected
    /// state (matched, or cancelled): its credit is owed to `src`, and
    /// given back once a quarter of the limit is.
    pub(super) fn consumed(&mut self, src: u32, len: usize) -> Result<(), EngineError> {
        if src == self.me {
            return Ok(());
        }
        let p = src as usize;
        self.unexpected_bytes = self.unexpected_bytes.saturating_sub(cost(len));
        self.owed[p] += cost(len);
        if self.owed[p] >= self.credit_limit() / 4 {
            let owed = std::mem::take(&mut self.owed[p]);
            self.out[p].push_back(Out::Frame(header(CREDIT, 0, 0, 0, 0, owed as u64, 0).to_vec()));
            self.flush(p)?;
        }
        Ok(())
    }

    /// Credit `n` given back by rank `from`.
    pub(super) fn credit_back(&mut self, from: u32, n: u64) -> Result<(), EngineError> {
        let limit = self.credit_limit();
        let c = &mut self.credit[from as usize];
        match usize::try_from(n).ok().and_then(|n| c.checked_add(n)).filter(|&t| t <= limit) {
            Some(t) => {
                *c = t;
                Ok(())
            }
            None => Err(EngineError::Protocol {
                from,
                what: format!("{n} bytes of credit given back, with {c} of {limit} still held here"),
            }),
        }
    }
}
