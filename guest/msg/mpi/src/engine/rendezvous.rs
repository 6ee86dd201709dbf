//! Rendezvous: a receive that matched an announced message answers
//! `CTS`, and the sender streams `DATA` straight into the posted buffer
//! (or, after a zero-copy offer that cannot be trusted, streams instead).

use super::*;

impl Engine {
    /// A `CTS` for send `sreq` of ours, to `from`'s receive `rreq`; with
    /// `landing`, where the posted buffer is in `from`'s landing memory.
    pub(super) fn clear_to_send(
        &mut self,
        from: u32,
        sreq: u64,
        rreq: u64,
        landing: Option<u64>,
    ) -> Result<(), EngineError> {
        let resend = self.direct_sends.iter().position(|z| z.sreq == sreq && z.to == from);
        match self.reqs.get_mut(&sreq) {
            Some(Req { kind: Kind::Send { dest, waiting, .. }, .. }) if *dest == from && *waiting => {
                *waiting = false;
            }
            // Asked again after a zero-copy transfer the receiver could
            // not trust: the message goes as DATA.
            Some(Req { kind: Kind::Send { dest, .. }, .. }) if *dest == from && landing.is_none() => {
                let Some(i) = resend else {
                    return Err(EngineError::Protocol { from, what: format!("clear-to-send for unknown send {sreq}") });
                };
                self.direct_sends.remove(i);
                return self.stream_instead(from, sreq, rreq);
            }
            _ => return Err(EngineError::Protocol { from, what: format!("clear-to-send for unknown send {sreq}") }),
        }
        if let (Some(off), Some(d)) = (landing, self.direct.as_deref_mut()) {
            if let Some(Req { kind: Kind::Send { data: SendBuf::Borrowed(Lent { ptr, len }), .. }, .. }) =
                self.reqs.get(&sreq)
            {
                if let Some(token) = d.start(from, off, *ptr, *len) {
                    self.direct_sends.push(DirectSend { sreq, rreq, to: from, token: Some(token) });
                    return Ok(());
                }
            }
            return self.stream_instead(from, sreq, rreq);
        }
        self.out[from as usize].push_back(Out::Stream { sreq, rreq, off: 0 });
        self.flush(from as usize)
    }

    /// A zero-copy offer for send `sreq` that ends as `DATA` frames to
    /// `to`'s receive `rreq`, from the first byte.
    pub(super) fn stream_instead(&mut self, to: u32, sreq: ReqId, rreq: u64) -> Result<(), EngineError> {
        self.stats.zero_copy_streamed += 1;
        self.out[to as usize].push_back(Out::Stream { sreq, rreq, off: 0 });
        self.flush(to as usize)
    }

    /// Copies `chunk` to offset `off` of receive `id` (what fits).
    pub(super) fn write_into(&mut self, id: ReqId, off: usize, chunk: &[u8], total: usize) -> Result<(), EngineError> {
        let r = self.req(id)?;
        let Kind::Recv { into, packed, got, .. } = &mut r.kind else {
            return Err(EngineError::NoRequest(id));
        };
        let cap = into.cap();
        let keep = cap.saturating_sub(off).min(chunk.len());
        match *into {
            RecvBuf::Contig(Posted { ptr, .. }) => {
                if keep > 0 {
                    // SAFETY: the receive buffer holds `cap` bytes at `ptr`
                    // (the caller's promise, kept until the receive
                    // completes); off + keep <= cap.
                    unsafe { std::ptr::copy_nonoverlapping(chunk.as_ptr(), ptr.add(off), keep) };
                }
            }
            RecvBuf::Packed { .. } => {
                if packed.len() < total.min(cap) {
                    packed.resize(total.min(cap), 0);
                }
                packed[off..off + keep].copy_from_slice(&chunk[..keep]);
            }
        }
        *got += chunk.len();
        Ok(())
    }

    /// `n` more bytes of receive `id`'s rendezvous data are in place
    /// (counted by the caller when 0); completes it when all are.
    pub(super) fn data_landed(&mut self, id: ReqId, n: usize) {
        let Some(Req { kind: Kind::Recv { got, total, .. }, status, .. }) = self.reqs.get_mut(&id) else { return };
        *got += n;
        if *got == *total {
            let (src, tag, total) = (status.source, status.tag, *total);
            self.complete_recv(id, src, tag, total);
        }
    }
}
