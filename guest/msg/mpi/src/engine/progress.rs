//! Progress: writing queued frames as the links take them, reading and
//! dispatching arriving frames, one-sided frames, and parting (a rank that
//! left, the job's goodbyes).

use super::*;

impl Engine {
    pub(super) fn send_rma(&mut self) -> Result<(), EngineError> {
        loop {
            let out = self.rma.take_out();
            if out.is_empty() {
                return Ok(());
            }
            for m in out {
                if m.to == self.me {
                    self.rma.arrive(self.me, m.op, m.win, m.a, m.b, &m.payload)?;
                    continue;
                }
                if m.to >= self.size() {
                    return Err(EngineError::NoRank(m.to));
                }
                let mut f = header(RMA, 0, m.win, m.op as i32, m.payload.len() as u64, m.a, m.b).to_vec();
                f.extend_from_slice(&m.payload);
                self.stats.bytes_out += m.payload.len() as u64;
                self.out[m.to as usize].push_back(Out::Frame(f));
                self.flush(m.to as usize)?;
            }
        }
    }

    /// Writes what fits of link `p`'s queue.
    pub(super) fn flush(&mut self, p: usize) -> Result<(), EngineError> {
        let Some(link) = self.links[p].as_ref() else { return Ok(()) };
        while let Some(o) = self.out[p].front_mut() {
            match o {
                Out::Frame(f) => {
                    if link.room()? < f.len() {
                        return Ok(());
                    }
                    link.send(f)?;
                    self.out[p].pop_front();
                }
                Out::Stream { sreq, rreq, off } => {
                    let (sreq, rreq) = (*sreq, *rreq);
                    let Some(Req { kind: Kind::Send { data, .. }, .. }) = self.reqs.get(&sreq) else {
                        return Err(EngineError::NoRequest(sreq));
                    };
                    let total = data.len();
                    let room = link.room()?;
                    let left = total - *off;
                    // Not worth a frame: wait for a useful amount of room.
                    let want = left.min(4096).min(link.max_frame() / 2);
                    if room < HDR + want {
                        return Ok(());
                    }
                    let n = left.min(room - HDR);
                    let t0 = Instant::now();
                    link.send_parts(&[&header(DATA, 0, 0, 0, *off as u64, rreq, 0), data.bytes(*off, n)])?;
                    self.stats.data_out.0 += n as u64;
                    self.stats.data_out.1 += t0.elapsed();
                    self.stats.bytes_out += n as u64;
                    *off += n;
                    if *off == total {
                        self.out[p].pop_front();
                        if let Some(r) = self.reqs.get_mut(&sreq) {
                            r.done = true;
                            if let Kind::Send { data, .. } = &mut r.kind {
                                *data = SendBuf::Owned(Vec::new());
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// One round of progress: writes what fits, reads what arrived.
    /// Returns whether anything moved.
    pub fn progress(&mut self) -> Result<bool, EngineError> {
        let mut moved = self.poll_direct()?;
        for p in 0..self.links.len() {
            if self.links[p].is_none() {
                continue;
            }
            if self.leaving && !self.bye_sent[p] && self.links[p].as_deref().is_some_and(|l| l.in_use(false)) {
                self.say_bye(p)?;
            }
            let before = self.out[p].len();
            self.flush_or_part(p)?;
            if self.links[p].is_none() {
                continue;
            }
            moved |= self.out[p].len() != before;
            // A bounded number of frames per link and round, for fairness.
            for _ in 0..64 {
                let Some(link) = self.links[p].as_ref() else { break };
                let n = match link.next_len() {
                    Ok(Some(n)) => n,
                    Ok(None) => break,
                    Err(e) if self.out[p].is_empty() || self.leaving => {
                        // Everything it sent has been read: it finished (or
                        // died); only a request that needs it fails.
                        self.left(p, e);
                        break;
                    }
                    Err(e) => return Err(e.into()),
                };
                if n >= HDR + SPLIT_MIN {
                    // A DATA frame's payload straight into the posted buffer.
                    let mut head = [0u8; HDR];
                    let reqs = &self.reqs;
                    let t0 = Instant::now();
                    let got = link.recv_split(&mut head, &mut |h, rest| data_place(reqs, h, rest))?;
                    if let Some(len) = got {
                        self.stats.data_in.0 += (len - HDR) as u64;
                        self.stats.data_in.1 += t0.elapsed();
                        self.data_landed(word(&head, 24), len - HDR);
                        self.stats.direct += 1;
                        moved = true;
                        continue;
                    }
                }
                let mut buf = std::mem::take(&mut self.scratch);
                if buf.len() < n {
                    buf.resize(n, 0);
                }
                let r =
                    link.recv(&mut buf[..n]).map_err(EngineError::from).and_then(|n| self.frame(p as u32, &buf[..n]));
                self.scratch = buf;
                r?;
                moved = true;
            }
        }
        Ok(moved)
    }

    pub(super) fn frame(&mut self, from: u32, f: &[u8]) -> Result<(), EngineError> {
        let bad = |what: String| EngineError::Protocol { from, what };
        if f.len() >= HDR8 && f[0] == EAGER8 {
            let ctx = u32::from_le_bytes([f[1], f[2], f[3], 0]);
            let tag = i32::from_ne_bytes([f[4], f[5], f[6], f[7]]);
            // Known for a cancel by its number from this sender.
            self.short_seen[from as usize] += 1;
            let wire = SHORT_ID | self.short_seen[from as usize];
            return self.arrive_eager(from, ctx, tag, f[HDR8..].to_vec(), None, wire);
        }
        if f.len() < HDR {
            return Err(bad(format!("a frame of {} bytes", f.len())));
        }
        let (kind, flags) = (f[0], f[1]);
        let ctx = u32::from_ne_bytes([f[4], f[5], f[6], f[7]]);
        let tag = i32::from_ne_bytes([f[8], f[9], f[10], f[11]]);
        let (len, a, b) = (word(f, 16), word(f, 24), word(f, 32));
        let payload = &f[HDR..];
        match kind {
            EAGER => {
                if payload.len() as u64 != len {
                    return Err(bad(format!("eager frame says {len} bytes, carries {}", payload.len())));
                }
                let sync = (flags & FLAG_SYNC != 0).then_some(a);
                self.arrive_eager(from, ctx, tag, payload.to_vec(), sync, a)
            }
            RTS => self.arrive(Unexpected { ctx, src: from, tag, len: len as usize, kind: Arrived::Rts { sreq: a } }),
            CTS => {
                if len > 0 {
                    self.credit_back(from, len)?;
                }
                let landing = (flags & FLAG_DIRECT != 0).then(|| word(f, 8));
                self.clear_to_send(from, a, b, landing)
            }
            DONE => {
                let ours = match self.reqs.get_mut(&b) {
                    Some(Req { kind: Kind::Recv { total, got, direct, .. }, done: false, .. })
                        if *got == 0 && *total as u64 == len && direct.is_some_and(|(s, _)| s == a) =>
                    {
                        direct.take()
                    }
                    _ => None,
                };
                let Some((_, before)) = ours else {
                    return Err(bad(format!("zero-copy data for receive {b}, which expects none")));
                };
                if self.direct.as_deref_mut().is_some_and(|d| d.losses(true) == before) {
                    self.stats.zero_copy_in += 1;
                    self.data_landed(b, len as usize);
                    self.out[from as usize].push_back(Out::Frame(header(TAKEN, 0, 0, 0, 0, a, 0).to_vec()));
                } else {
                    // This adapter counted an error or saw a node leave or
                    // join since the offer: the bytes may be incomplete.
                    // Again, as DATA.
                    self.out[from as usize].push_back(Out::Frame(header(CTS, 0, 0, 0, 0, a, b).to_vec()));
                }
                self.flush(from as usize)
            }
            TAKEN => match self.direct_sends.iter().position(|z| z.sreq == a && z.to == from && z.token.is_none()) {
                Some(i) => {
                    self.direct_sends.remove(i);
                    self.finish_send(a);
                    Ok(())
                }
                None => Err(bad(format!("zero-copy acknowledgement of unknown send {a}"))),
            },
            DATA => {
                let total = match self.reqs.get(&a) {
                    Some(Req { kind: Kind::Recv { total, got, .. }, done: false, .. })
                        if (*got as u64) == len && *got + payload.len() <= *total =>
                    {
                        *total
                    }
                    _ => return Err(bad(format!("data for unknown receive {a} at offset {len}"))),
                };
                self.write_into(a, len as usize, payload, total)?;
                self.data_landed(a, 0);
                Ok(())
            }
            ACK => match self.reqs.get(&a) {
                Some(Req { kind: Kind::Send { dest, .. }, .. }) if *dest == from => {
                    self.finish_send(a);
                    Ok(())
                }
                _ => Err(bad(format!("acknowledgement of unknown send {a}"))),
            },
            CANCEL => {
                // `b`: the message's number when it came short, else 0.
                let key = if b != 0 { b } else { a };
                let taken = match self.unexpected.iter().position(|u| u.src == from && u.sent_by(key)) {
                    Some(i) => {
                        let u = self.unexpected.remove(i).expect("position is in range");
                        if let Arrived::Eager { .. } = u.kind {
                            self.consumed(from, u.len)?;
                        }
                        true
                    }
                    None => false,
                };
                self.out[from as usize].push_back(Out::Frame(header(CANCELLED, 0, 0, 0, 0, a, taken as u64).to_vec()));
                self.flush(from as usize)
            }
            CANCELLED => {
                // A send finished meanwhile (its data went or its ACK came,
                // and the caller took it) needs nothing.
                let Some(Req { kind: Kind::Send { dest, cancelling, .. }, done, .. }) = self.reqs.get_mut(&a) else {
                    return Ok(());
                };
                let Some(was_done) = cancelling.take().filter(|_| *dest == from) else {
                    return Err(bad(format!("a cancel answer for send {a}, which asked rank {from} none")));
                };
                if b == 1 {
                    self.cancelled_send(a);
                } else if was_done {
                    // Refused: complete again, as before the cancel.
                    *done = true;
                }
                Ok(())
            }
            CREDIT => self.credit_back(from, a),
            REPOST => {
                self.repost_asked = true;
                Ok(())
            }
            BYE => {
                self.bye[from as usize] = true;
                Ok(())
            }
            RMA => {
                if payload.len() as u64 != len {
                    return Err(bad(format!("one-sided frame says {len} bytes, carries {}", payload.len())));
                }
                self.rma.arrive(from, tag as u8, ctx, a, b, payload)?;
                self.send_rma()
            }
            k => Err(bad(format!("unknown frame kind {k}"))),
        }
    }

    /// Rank `p` closed its end (`e`): only a request that needs it fails
    /// from now on. While leaving, what was still queued for it goes too.
    pub(super) fn left(&mut self, p: usize, e: TransportError) {
        self.used_gone[p] = self.links[p].as_deref().is_some_and(|l| l.in_use(false));
        self.links[p] = None;
        self.gone[p] = Some(e);
        if self.leaving {
            self.out[p].clear();
        }
    }

    /// The job's last barrier is behind this rank (`MPI_Finalize`): every
    /// rank has entered it, so all the job's messages were sent. Says
    /// goodbye to every rank still there; [`Engine::parted`] says when
    /// this rank may close its channels.
    ///
    /// # Goodbyes
    /// A rank that closes its end can no longer serve anything: a repair
    /// of a frame lost on the way, or a board slot a rank still in the
    /// barrier asks to be stored again (under faults a rank can finish
    /// the barrier while another still waits for a lost store). So a rank
    /// closes only once every other rank has said goodbye, which each says
    /// only past the barrier, and has taken everything sent to it
    /// (goodbye included). Until then it keeps serving. From `leave` on,
    /// a rank that closed is not an error, and what was still queued for
    /// it (credits, reposts) is dropped: it needed nothing more.
    ///
    /// A link opened on first use that neither rank used
    /// ([`Link::in_use`]) needs no goodbye: nothing went over it, so
    /// nothing on it can need repairing. One the other rank opens while we
    /// wait gets its goodbye then ([`Engine::progress`]).
    pub fn leave(&mut self) -> Result<(), EngineError> {
        self.leaving = true;
        for p in 0..self.links.len() {
            if self.links[p].as_deref().is_some_and(|l| l.in_use(true)) {
                self.say_bye(p)?;
            }
        }
        Ok(())
    }

    /// Queues our goodbye to rank `p` and sends what fits.
    fn say_bye(&mut self, p: usize) -> Result<(), EngineError> {
        self.bye_sent[p] = true;
        self.out[p].push_back(Out::Frame(header(BYE, 0, 0, 0, 0, 0, 0).to_vec()));
        self.flush_or_part(p)
    }

    /// [`Engine::flush`]; once leaving, a rank that has gone is marked
    /// left ([`Engine::left`]) instead of failing the flush.
    pub(super) fn flush_or_part(&mut self, p: usize) -> Result<(), EngineError> {
        match self.flush(p) {
            Err(EngineError::Link(e @ TransportError::PeerGone(..))) if self.leaving => {
                self.left(p, e);
                Ok(())
            }
            r => r,
        }
    }

    /// Whether a leaving rank still waits for rank `p`: it is there and
    /// has not said goodbye or not taken everything we sent.
    pub(super) fn waits_for(&self, p: usize) -> bool {
        self.links[p]
            .as_deref()
            .is_some_and(|l| l.in_use(false) && !(self.bye[p] && self.out[p].is_empty() && l.delivered()))
    }

    /// Links to other ranks that were ever opened or sent on (those
    /// opened on first use that neither rank used do not count).
    pub fn links_in_use(&self) -> usize {
        (0..self.links.len())
            .filter(|&p| self.used_gone[p] || self.links[p].as_deref().is_some_and(|l| l.in_use(false)))
            .count()
    }

    /// Whether this rank, leaving, may close its channels: every other
    /// rank has gone, or has said goodbye and taken everything we sent.
    pub fn parted(&self) -> bool {
        self.leaving && !(0..self.links.len()).any(|p| self.waits_for(p))
    }

    /// The ranks still there that a leaving rank waits for (see
    /// [`Engine::parted`]).
    pub fn parting_from(&self) -> Vec<u32> {
        (0..self.links.len()).filter(|&p| self.waits_for(p)).map(|p| p as u32).collect()
    }

    /// Sends whatever is still queued, waiting for room (before finalize).
    pub fn drain(&mut self) -> Result<(), EngineError> {
        let mut idle = 0u32;
        while self.out.iter().zip(&self.links).any(|(q, l)| l.is_some() && !q.is_empty())
            || self.direct_sends.iter().any(|z| z.token.is_some())
        {
            if self.progress()? {
                idle = 0;
            } else {
                backoff(&mut idle);
            }
        }
        Ok(())
    }
}
