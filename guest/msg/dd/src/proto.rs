//! The protocol of Direct Deposit, apart from its transport: a
//! [`Sender`] places messages at the offsets it chooses and posts notes;
//! a [`Queue`] polls the notes of its connections and hands buffer space
//! back. Both are generic over [`Tx`] and [`Rx`], the ordered stores and
//! the loads of MEMORY CHANNEL, so the same code runs on the adapter's
//! mappings (`crate::mc`) and on the simulated ordered bus of the tests
//! (`crate::sim`).
//!
//! Ordering (`docs/dd.md`, "Ordering"): the sender writes a message's
//! bytes, then words 0 to 2 of its note, then word 3; the hub orders them
//! and the receiving adapter applies them in that order, so a receiver
//! that sees word 3 of note `s` sees the rest of the note and every byte
//! of the message. A connection's notes arrive in the order they were
//! sent; a queue polls its connections round-robin.
//!
//! Not thread-safe by itself: each endpoint is used by one thread at a
//! time (`&mut self`).

use std::collections::{BTreeSet, VecDeque};

use crate::error::DdError;
use crate::layout::{crc, padded, Note, ALIGN, BACK_RELEASED, HEAD, MAX_MESSAGE, NOTES, NOTE_BYTES};

/// The transmit side of a region: stores that go through the total order.
pub trait Tx {
    /// Bytes of the region.
    fn len(&self) -> usize;
    /// True for a region of no bytes (never: regions have pages).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// One 8-byte store at `off` (a multiple of 8), after every earlier one.
    fn store(&self, off: usize, v: u64);
    /// Copies `src` to `off` (a multiple of 8) in ascending 8-byte
    /// stores, the last word padded with zeros; `off + padded(len)` must be
    /// inside the region.
    fn write(&self, off: usize, src: &[u8]);
}

/// The receive side of a region: this node's copy.
pub trait Rx {
    /// Bytes of the region.
    fn len(&self) -> usize;
    /// True for a region of no bytes (never: regions have pages).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The 8-byte word at `off`.
    fn load(&self, off: usize) -> u64;
    /// Copies bytes at `off` into `dst`.
    fn read(&self, off: usize, dst: &mut [u8]);
}

/// A message posted and not yet released by the receiver.
#[derive(Debug, Clone, Copy)]
struct Posted {
    seq: u64,
    start: u64,
    end: u64,
}

/// The sending end of one connection.
pub struct Sender<T: Tx, R: Rx> {
    conn: u32,
    notes: T,
    buffer: T,
    back: R,
    /// Sequence number of the next note.
    next: u64,
    /// Posted and not released, oldest first.
    posted: VecDeque<Posted>,
}

impl<T: Tx, R: Rx> Sender<T, R> {
    /// The sender of connection `conn` over its note ring, buffer and
    /// back page.
    pub fn new(conn: u32, notes: T, buffer: T, back: R) -> Sender<T, R> {
        Sender { conn, notes, buffer, back, next: 1, posted: VecDeque::new() }
    }

    /// The connection id.
    pub fn conn(&self) -> u32 {
        self.conn
    }

    /// Bytes of the receive buffer.
    pub fn buffer_len(&self) -> u64 {
        self.buffer.len() as u64
    }

    /// Messages posted and not yet released.
    pub fn outstanding(&mut self) -> usize {
        self.reclaim();
        self.posted.len()
    }

    /// Takes back what the receiver released.
    pub fn reclaim(&mut self) {
        let released = self.back.load(BACK_RELEASED);
        while self.posted.front().is_some_and(|p| p.seq <= released) {
            self.posted.pop_front();
        }
    }

    /// Checks that `len` bytes may go at `offset` now (every refusal of a
    /// send, before anything is written); the sequence number they get.
    pub fn check(&mut self, offset: u64, len: u64) -> Result<u64, DdError> {
        let size = self.buffer_len();
        if len > MAX_MESSAGE || offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(DdError::OutOfBuffer { offset, len, size });
        }
        if offset % ALIGN != 0 {
            return Err(DdError::Misaligned(offset));
        }
        self.reclaim();
        let end = offset + padded(len);
        if let Some(p) = self.posted.iter().find(|p| len > 0 && p.start < end && offset < p.end) {
            return Err(DdError::Busy { offset, end, seq: p.seq });
        }
        if self.posted.len() as u64 >= NOTES {
            return Err(DdError::NotesFull);
        }
        Ok(self.next)
    }

    /// Sends `data` to `offset` by stores (the paper's DIO): the bytes,
    /// then the note. Returns the note.
    pub fn send(&mut self, offset: u64, data: &[u8]) -> Result<Note, DdError> {
        let seq = self.check(offset, data.len() as u64)?;
        if !data.is_empty() {
            self.buffer.write(offset as usize, data);
        }
        Ok(self.post(offset, data.len() as u32, crc(data, offset as u32, seq, self.conn), 0))
    }

    /// Posts the note of a message whose bytes are on their way (stored,
    /// or a DMA transfer started) after [`Sender::check`] passed; `crc` is
    /// [`crc`] of them with the sequence number `check` returned.
    pub fn post(&mut self, offset: u64, len: u32, crc: u32, flags: u32) -> Note {
        let seq = self.next;
        self.next += 1;
        let note = Note { conn: self.conn, seq, offset: offset as u32, len, crc, flags };
        let w = note.words();
        let slot = Note::slot(seq);
        // Word 2 is reserved: not stored (one store less per message).
        for i in [0, 1, 3] {
            self.notes.store(slot + i * 8, w[i]);
        }
        self.notes.store(HEAD, seq);
        self.posted.push_back(Posted { seq, start: offset, end: offset + padded(len as u64) });
        note
    }
}

/// The receiving end of one connection, on a [`Queue`].
pub struct Inbound<R: Rx, T: Tx> {
    conn: u32,
    notes: R,
    buffer: R,
    back: T,
    /// Sequence number of the next note expected.
    expect: u64,
    /// Everything up to this is released (published on the back page).
    released_upto: u64,
    /// Received, not released.
    outstanding: BTreeSet<u64>,
}

impl<R: Rx, T: Tx> Inbound<R, T> {
    /// The receiving end of connection `conn` over its note ring, buffer
    /// and back page.
    pub fn new(conn: u32, notes: R, buffer: R, back: T) -> Inbound<R, T> {
        Inbound { conn, notes, buffer, back, expect: 1, released_upto: 0, outstanding: BTreeSet::new() }
    }

    fn note_at(&self, seq: u64) -> Option<Note> {
        let slot = Note::slot(seq);
        let w3 = self.notes.load(slot + 3 * 8);
        if w3 as u32 != seq as u32 {
            return None;
        }
        let w = [self.notes.load(slot), self.notes.load(slot + 8), self.notes.load(slot + 16), w3];
        Note::parse(w, seq)
    }

    /// Publishes every release up to the first note still outstanding.
    fn publish(&mut self) {
        let upto = match self.outstanding.first() {
            Some(&s) => s - 1,
            None => self.expect - 1,
        };
        if upto != self.released_upto {
            self.released_upto = upto;
            self.back.store(BACK_RELEASED, upto);
        }
    }

    /// Skips note `seq`, which never reaches the caller, and frees its space.
    fn skip(&mut self) {
        self.expect += 1;
        self.publish();
    }

    /// The next note, checked: Some once it arrived whole.
    fn poll(&mut self, scratch: &mut Vec<u8>) -> Result<Option<Note>, DdError> {
        let seq = self.expect;
        let note = match self.note_at(seq) {
            Some(n) => n,
            None => {
                // The head is stored after each note's last word. Seen at
                // or past `seq`, every word of note `seq` sent before it has
                // arrived too: look again (it may have come since the first
                // look); still not there, it was lost.
                if self.notes.load(HEAD) < seq {
                    return Ok(None);
                }
                match self.note_at(seq) {
                    Some(n) => n,
                    None => {
                        self.skip();
                        return Err(DdError::Lost { conn: self.conn, seq });
                    }
                }
            }
        };
        let bad = |why: String| DdError::BadNote { conn: self.conn, seq, why };
        let err = if note.conn != self.conn {
            Some(bad(format!("it names connection {}", note.conn)))
        } else if note.offset as u64 % ALIGN != 0
            || note.offset as u64 + padded(note.len as u64) > self.buffer.len() as u64
        {
            Some(bad(format!("{} bytes at {} are outside the buffer of {}", note.len, note.offset, self.buffer.len())))
        } else {
            scratch.resize(note.len as usize, 0);
            self.buffer.read(note.offset as usize, scratch);
            let got = crc(scratch, note.offset, seq, self.conn);
            (got != note.crc).then_some(DdError::Damaged { conn: self.conn, seq, want: note.crc, got })
        };
        if let Some(e) = err {
            self.skip();
            return Err(e);
        }
        self.expect += 1;
        self.outstanding.insert(seq);
        Ok(Some(note))
    }

    fn release(&mut self, seq: u64) -> Result<(), DdError> {
        if !self.outstanding.remove(&seq) {
            return Err(DdError::NotOutstanding { conn: self.conn, seq });
        }
        self.publish();
        Ok(())
    }
}

/// A notification queue: the notes of one or more connections, polled as
/// one (each connection's ring is its own region, written by its sender
/// alone: see `docs/dd.md`, "Protection").
pub struct Queue<R: Rx, T: Tx> {
    conns: Vec<Inbound<R, T>>,
    /// Where the next poll starts (round-robin).
    next: usize,
    /// The bytes of the last note polled (checked against its CRC).
    scratch: Vec<u8>,
}

impl<R: Rx, T: Tx> Default for Queue<R, T> {
    fn default() -> Self {
        Queue { conns: Vec::new(), next: 0, scratch: Vec::new() }
    }
}

impl<R: Rx, T: Tx> Queue<R, T> {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a connection; its id must be new on this queue.
    pub fn add(&mut self, inbound: Inbound<R, T>) -> Result<(), DdError> {
        if self.conns.iter().any(|c| c.conn == inbound.conn) {
            return Err(DdError::Invalid(format!("connection {} is on this queue already", inbound.conn)));
        }
        if inbound.notes.len() < NOTES as usize * NOTE_BYTES {
            return Err(DdError::Invalid(format!(
                "a note ring of {} bytes holds no {NOTES} notes",
                inbound.notes.len()
            )));
        }
        self.conns.push(inbound);
        Ok(())
    }

    /// The connections' ids.
    pub fn conns(&self) -> Vec<u32> {
        self.conns.iter().map(|c| c.conn).collect()
    }

    /// The user-level receive: checks the valid flag of each connection's
    /// next note, round-robin; the first that arrived (its bytes checked
    /// against its CRC), or None. An error names a note that will never
    /// come whole (lost, damaged, malformed); the next poll goes on.
    pub fn poll(&mut self) -> Result<Option<Note>, DdError> {
        let n = self.conns.len();
        for k in 0..n {
            let i = (self.next + k) % n;
            let r = self.conns[i].poll(&mut self.scratch);
            if !matches!(r, Ok(None)) {
                self.next = (i + 1) % n;
                return r;
            }
        }
        Ok(None)
    }

    /// The bytes of the note [`Queue::poll`] returned last.
    pub fn last_bytes(&self) -> &[u8] {
        &self.scratch
    }

    /// Copies the bytes of received note `note` (not released) into `dst`.
    pub fn read(&self, note: &Note, dst: &mut [u8]) -> Result<(), DdError> {
        let c = self.conn(note.conn)?;
        if !c.outstanding.contains(&note.seq) {
            return Err(DdError::NotOutstanding { conn: note.conn, seq: note.seq });
        }
        let n = dst.len().min(note.len as usize);
        c.buffer.read(note.offset as usize, &mut dst[..n]);
        Ok(())
    }

    fn conn(&self, id: u32) -> Result<&Inbound<R, T>, DdError> {
        self.conns.iter().find(|c| c.conn == id).ok_or(DdError::NoConnection(id))
    }

    /// Hands the space of received note `note` back to its sender (the
    /// sender may reuse it once every earlier note of the connection is
    /// released too).
    pub fn release(&mut self, note: &Note) -> Result<(), DdError> {
        let c = self.conns.iter_mut().find(|c| c.conn == note.conn).ok_or(DdError::NoConnection(note.conn))?;
        c.release(note.seq)
    }
}
