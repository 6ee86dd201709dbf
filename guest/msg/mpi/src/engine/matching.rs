//! Matching: posted receives against arriving messages in arrival order
//! (MPI's non-overtaking rule), the unexpected queue, probes and
//! cancelling.

use super::*;

/// Which messages a receive or probe takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pattern {
    /// Context id (the communicator's).
    pub ctx: u32,
    /// World rank, or any.
    pub src: Option<u32>,
    /// Tag, or any.
    pub tag: Option<i32>,
}

impl Pattern {
    pub(super) fn takes(&self, ctx: u32, src: u32, tag: i32) -> bool {
        self.ctx == ctx && self.src.is_none_or(|s| s == src) && self.tag.is_none_or(|t| t == tag)
    }
}

/// A message removed from the queue by a matched probe (`MPI_Mprobe`).
#[derive(Debug)]
pub struct Matched(Unexpected);

impl Matched {
    /// Its status (source, tag, bytes).
    pub fn status(&self) -> Status {
        Status { source: self.0.src, tag: self.0.tag, bytes: self.0.len, ..Status::default() }
    }
}

impl Engine {
    /// Posts a receive.
    pub fn irecv(&mut self, pattern: Pattern, into: RecvBuf) -> Result<ReqId, EngineError> {
        let id =
            self.add(Kind::Recv { pattern, into, total: 0, got: 0, packed: Vec::new(), posted: false, direct: None });
        if let Some(i) = self.unexpected.iter().position(|u| pattern.takes(u.ctx, u.src, u.tag)) {
            let u = self.unexpected.remove(i).expect("position is in range");
            self.deliver(id, u)?;
        } else {
            if let Kind::Recv { posted, .. } = &mut self.req(id)?.kind {
                *posted = true;
            }
            self.posted.push_back(id);
        }
        Ok(id)
    }

    /// Receives a message a matched probe took (`MPI_Mrecv`).
    pub fn imrecv(&mut self, m: Matched, into: RecvBuf) -> Result<ReqId, EngineError> {
        let pattern = Pattern { ctx: m.0.ctx, src: Some(m.0.src), tag: Some(m.0.tag) };
        let id =
            self.add(Kind::Recv { pattern, into, total: 0, got: 0, packed: Vec::new(), posted: false, direct: None });
        self.deliver(id, m.0)?;
        Ok(id)
    }

    /// Matches receive `id` with message `u`.
    pub(super) fn deliver(&mut self, id: ReqId, u: Unexpected) -> Result<(), EngineError> {
        let (src, tag, len) = (u.src, u.tag, u.len);
        match u.kind {
            Arrived::Eager { data, sync, .. } => {
                self.consumed(src, len)?;
                self.write_into(id, 0, &data, len)?;
                self.complete_recv(id, src, tag, len);
                if let Some(sreq) = sync {
                    self.ack(src, sreq)?;
                }
            }
            Arrived::Rts { sreq } => {
                let d = self.direct.as_deref_mut();
                let r = self.reqs.get_mut(&id).ok_or(EngineError::NoRequest(id))?;
                r.status.source = src;
                r.status.tag = tag;
                let mut landing = None;
                if let Kind::Recv { total, into, direct, .. } = &mut r.kind {
                    *total = len;
                    // The whole message into a posted buffer in landing memory.
                    if let (RecvBuf::Contig(Posted { ptr, cap }), Some(d)) = (*into, d) {
                        landing = (len > 0 && len <= cap).then(|| d.landing(src, ptr, len)).flatten();
                        if landing.is_some() {
                            *direct = Some((sreq, d.losses(false)));
                        }
                    }
                }
                // The credit owed to the sender goes with the answer.
                let owed = std::mem::take(&mut self.owed[src as usize]);
                let mut cts = header(CTS, 0, 0, 0, owed as u64, sreq, id);
                if let Some(off) = landing {
                    cts[1] = FLAG_DIRECT;
                    cts[8..16].copy_from_slice(&off.to_ne_bytes());
                }
                self.out[src as usize].push_back(Out::Frame(cts.to_vec()));
                self.flush(src as usize)?;
            }
        }
        Ok(())
    }

    pub(super) fn complete_recv(&mut self, id: ReqId, src: u32, tag: i32, len: usize) {
        if let Some(r) = self.reqs.get_mut(&id) {
            let cap = match &r.kind {
                Kind::Recv { into, .. } => into.cap(),
                Kind::Send { .. } => 0,
            };
            r.done = true;
            r.status = Status { source: src, tag, bytes: len.min(cap), truncated: len > cap, cancelled: false };
        }
    }

    /// A message that arrived eagerly (or from ourselves).
    pub(super) fn arrive_eager(
        &mut self,
        src: u32,
        ctx: u32,
        tag: i32,
        data: Vec<u8>,
        sync: Option<u64>,
        sreq: u64,
    ) -> Result<(), EngineError> {
        let len = data.len();
        if src != self.me {
            self.unexpected_bytes += cost(len);
        }
        let u = Unexpected { ctx, src, tag, len, kind: Arrived::Eager { data, sync, sreq } };
        self.arrive(u)?;
        self.stats.unexpected_bytes_peak = self.stats.unexpected_bytes_peak.max(self.unexpected_bytes);
        Ok(())
    }

    pub(super) fn arrive(&mut self, u: Unexpected) -> Result<(), EngineError> {
        let reqs = &self.reqs;
        let hit = self.posted.iter().position(|id| {
            matches!(reqs.get(id), Some(Req { kind: Kind::Recv { pattern, .. }, .. }) if pattern.takes(u.ctx, u.src, u.tag))
        });
        match hit {
            Some(i) => {
                let id = self.posted.remove(i).expect("position is in range");
                if let Kind::Recv { posted, .. } = &mut self.req(id)?.kind {
                    *posted = false;
                }
                self.deliver(id, u)
            }
            None => {
                self.unexpected.push_back(u);
                self.stats.unexpected_peak = self.stats.unexpected_peak.max(self.unexpected.len());
                Ok(())
            }
        }
    }

    /// Cancels a receive not yet matched (a matched one, or a send,
    /// completes normally: MPI lets a cancel fail). Returns whether it was
    /// cancelled.
    pub fn cancel(&mut self, id: ReqId) -> Result<bool, EngineError> {
        let Some(i) = self.posted.iter().position(|&p| p == id) else {
            // A send: its message may still sit unmatched at the receiver
            // (an eager one completed here at once). Ask the receiver; the
            // request is not complete until the answer comes.
            let me = self.me;
            let r = self.req(id)?;
            let Kind::Send { dest, cancelling: None, wire, .. } = r.kind else { return Ok(false) };
            if r.status.cancelled {
                return Ok(false);
            }
            if dest == me {
                if let Some(i) = self.unexpected.iter().position(|u| u.src == me && u.sent_by(id)) {
                    self.unexpected.remove(i);
                    self.cancelled_send(id);
                }
                return Ok(false);
            }
            // A complete send is held incomplete until the answer.
            let was_done = std::mem::replace(&mut r.done, false);
            if let Kind::Send { cancelling, .. } = &mut r.kind {
                *cancelling = Some(was_done);
            }
            self.out[dest as usize].push_back(Out::Frame(header(CANCEL, 0, 0, 0, 0, id, wire).to_vec()));
            self.flush(dest as usize)?;
            return Ok(false);
        };
        self.posted.remove(i);
        let r = self.req(id)?;
        r.done = true;
        r.status.cancelled = true;
        Ok(true)
    }

    /// Send `id` was taken back before its receiver matched it.
    pub(super) fn cancelled_send(&mut self, id: ReqId) {
        self.finish_send(id);
        if let Some(r) = self.reqs.get_mut(&id) {
            r.status.cancelled = true;
            if let Kind::Send { waiting, .. } = &mut r.kind {
                *waiting = false;
            }
        }
    }

    /// Looks for a matching message without receiving it (`MPI_Iprobe`).
    pub fn iprobe(&mut self, pattern: Pattern) -> Result<Option<Status>, EngineError> {
        self.progress()?;
        Ok(self.unexpected.iter().find(|u| pattern.takes(u.ctx, u.src, u.tag)).map(|u| Status {
            source: u.src,
            tag: u.tag,
            bytes: u.len,
            ..Status::default()
        }))
    }

    /// Takes a matching message out of the queue (`MPI_Improbe`).
    pub fn improbe(&mut self, pattern: Pattern) -> Result<Option<Matched>, EngineError> {
        self.progress()?;
        Ok(self
            .unexpected
            .iter()
            .position(|u| pattern.takes(u.ctx, u.src, u.tag))
            .map(|i| Matched(self.unexpected.remove(i).expect("position is in range"))))
    }
}
