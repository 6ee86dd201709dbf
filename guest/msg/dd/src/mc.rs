//! Direct Deposit on MEMORY CHANNEL: [`Queue`] (the receiving process: a
//! notification queue and the connections it accepted) and [`Conn`] (the
//! sending process's end of one connection). Set-up goes through imcd,
//! the paper's trusted party: it allocates the connection's regions
//! (`crate::layout`), programs the sender's pages point-to-point to the
//! receiver and hands their transmit mapping to the sending process only
//! (`Request::Asattach` with `p2p`). Data never goes through imcd: sends
//! are stores into the transmit window (the paper's DIO) or transfers of
//! the transmit DMA engine (its DMA mode), receives are loads.
//!
//! A blocking receive sleeps in `poll(2)` on imcd's watch of each note
//! ring (INT pages: the adapter interrupts, imcd bumps an eventfd); the
//! watches begin at the first blocking receive, so a queue that only
//! polls takes no interrupts.
//!
//! Each endpoint is used by one thread at a time (`&mut self`).

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use guest_mem::{Mapping, ReadOnly, ReadWrite};
use imc_client::dma::{DmaHandle, DmaPort, DmaTarget};
use imc_client::Imc;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use regs::PAGE_SIZE;

use crate::error::DdError;
use crate::layout::{crc, key, Note, Part, FLAG_DMA, MAX_BUFFER};
use crate::proto::{self, Inbound, Rx, Sender, Tx};

/// Default of the DMA threshold (`DD_DMA_THRESHOLD`): messages of at
/// least this many bytes go by DMA. From `dd-tool bench` (`docs/dd.md`,
/// "Threshold").
pub const DMA_THRESHOLD_DEFAULT: usize = 256;

/// Bytes of the DMA source area a connection asks imcd for (messages
/// sent by DMA are at most this long).
pub const DMA_AREA: usize = 8 << 20;

/// How long [`Conn::send_when_free`] waits for the receiver's releases.
pub const FREE_WAIT: Duration = Duration::from_secs(30);

/// How long a DMA send waits for source space held by earlier transfers.
const DMA_SPACE_WAIT: Duration = Duration::from_secs(10);

/// A transmit mapping as [`Tx`]: ordered 8-byte stores.
pub struct McTx(Arc<Mapping<ReadWrite>>);

impl Tx for McTx {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn store(&self, off: usize, v: u64) {
        // In bounds: the protocol checked every offset against the region.
        if let Err(e) = self.0.store_release(off, v) {
            panic!("transmit store at {off}: {e}")
        }
    }
    fn write(&self, off: usize, src: &[u8]) {
        let whole = src.len() / 8 * 8;
        let r = self.0.write_ordered(off, &src[..whole]).and_then(|()| {
            if whole == src.len() {
                return Ok(());
            }
            let mut w = [0u8; 8];
            w[..src.len() - whole].copy_from_slice(&src[whole..]);
            self.0.store_release(off + whole, u64::from_le_bytes(w))
        });
        if let Err(e) = r {
            panic!("transmit copy at {off}: {e}")
        }
    }
}

/// A receive mapping as [`Rx`].
pub struct McRx(Mapping<ReadOnly>);

impl Rx for McRx {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn load(&self, off: usize) -> u64 {
        self.0.load_acquire(off).unwrap_or_else(|e| panic!("receive load at {off}: {e}"))
    }
    fn read(&self, off: usize, dst: &mut [u8]) {
        if let Err(e) = self.0.read(off, dst) {
            panic!("receive copy at {off}: {e}")
        }
    }
}

/// This node's MEMORY CHANNEL node number.
pub fn this_node(imc: &Imc) -> Result<u8, DdError> {
    let node = imc.regs()?.node().ok_or_else(|| DdError::Invalid("the adapter has no node id (link down?)".into()))?;
    u8::try_from(node).map_err(|_| DdError::Invalid(format!("node {node} is past 255")))
}

/// Checks a connection tag (it is the connection's id in notes).
fn check_tag(tag: u64) -> Result<u32, DdError> {
    u32::try_from(tag).map_err(|_| DdError::Invalid(format!("connection tag {tag}: 0 to {}", u32::MAX)))
}

/// The receiving process's notification queue and its connections.
pub struct Queue {
    imc: Imc,
    me: u8,
    q: proto::Queue<McRx, McTx>,
    /// Each connection's note ring (region id).
    notes: Vec<u32>,
    /// imcd's watch of each connection's note ring, made at the first
    /// blocking receive: a watched page interrupts at every store, which
    /// a queue that only polls has no use for.
    watches: Vec<OwnedFd>,
}

impl Queue {
    /// Opens an empty queue (connects to imcd).
    pub fn open() -> Result<Queue, DdError> {
        let imc = Imc::connect()?;
        let me = this_node(&imc)?;
        Ok(Queue { imc, me, q: proto::Queue::new(), notes: Vec::new(), watches: Vec::new() })
    }

    /// This node's number.
    pub fn node(&self) -> u8 {
        self.me
    }

    /// Reserves a receive buffer of `buffer` bytes (whole pages) for
    /// connection `tag` from the process on node `sender` that will
    /// [`Conn::connect`], and puts its notes on this queue. Returns the
    /// connection id (the tag).
    pub fn accept(&mut self, sender: u8, tag: u64, buffer: u64) -> Result<u32, DdError> {
        let conn = check_tag(tag)?;
        if buffer == 0 || buffer > MAX_BUFFER {
            return Err(DdError::BufferSize(buffer));
        }
        if sender == self.me {
            return Err(DdError::Invalid(format!("node {sender} is this node: Direct Deposit connects two nodes")));
        }
        if self.q.conns().contains(&conn) {
            return Err(DdError::Invalid(format!("connection {conn} is on this queue already")));
        }
        let imc = &self.imc;
        let alloc = |part: Part, size: u64| -> Result<u32, DdError> {
            Ok(imc.asalloc(key(sender, self.me, tag, part), size, 0o600, true)?.0)
        };
        // The back page is made last: the sender waits for it, and by
        // then this node receives the notes and the buffer.
        let notes = alloc(Part::Notes, PAGE_SIZE)?;
        let buf = alloc(Part::Buffer, buffer)?;
        let notes_rx = McRx(imc.asattach_rx(notes)?);
        let buf_rx = McRx(imc.asattach_rx(buf)?);
        let back = alloc(Part::Back, PAGE_SIZE)?;
        let back_tx = McTx(Arc::new(imc.asattach_tx_p2p(back, sender as u32)?));
        self.q.add(Inbound::new(conn, notes_rx, buf_rx, back_tx))?;
        self.notes.push(notes);
        Ok(conn)
    }

    /// The user-level receive: the next note that arrived, or None.
    pub fn poll(&mut self) -> Result<Option<Note>, DdError> {
        self.q.poll()
    }

    /// The bytes of the note [`Queue::poll`] or [`Queue::recv`] returned last.
    pub fn last_bytes(&self) -> &[u8] {
        self.q.last_bytes()
    }

    /// The blocking receive: the next note, sleeping until the adapter's
    /// interrupt says one may have come; None waits for ever.
    pub fn recv(&mut self, timeout: Option<Duration>) -> Result<Note, DdError> {
        let t0 = Instant::now();
        loop {
            if let Some(n) = self.q.poll()? {
                return Ok(n);
            }
            let left = match timeout {
                Some(t) => match t.checked_sub(t0.elapsed()) {
                    Some(l) => PollTimeout::try_from(l).unwrap_or(PollTimeout::MAX),
                    None => return Err(DdError::Timeout(format!("no note within {t:?}"))),
                },
                None => PollTimeout::NONE,
            };
            if self.notes.is_empty() {
                return Err(DdError::Invalid("the queue has no connection".into()));
            }
            if self.watches.len() < self.notes.len() {
                // Watch the rings not watched yet, then look again before
                // sleeping: a note stored before the watch began did not
                // interrupt.
                for &id in &self.notes[self.watches.len()..] {
                    let w = self.imc.watch(id)?;
                    self.watches.push(w);
                }
                continue;
            }
            let mut fds: Vec<PollFd> = self.watches.iter().map(|w| PollFd::new(w.as_fd(), PollFlags::POLLIN)).collect();
            match poll(&mut fds, left) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(DdError::Os("poll on the note rings' watches", e)),
            }
            let ready: Vec<bool> = fds.iter().map(|f| f.any().unwrap_or(false)).collect();
            drop(fds);
            for (w, r) in self.watches.iter().zip(ready) {
                if r {
                    let _ = nix::unistd::read(w.as_raw_fd(), &mut [0u8; 8]);
                }
            }
        }
    }

    /// Copies the bytes of received note `note` into `dst`.
    pub fn read(&self, note: &Note, dst: &mut [u8]) -> Result<(), DdError> {
        self.q.read(note, dst)
    }

    /// Hands note `note`'s buffer space back to its sender.
    pub fn release(&mut self, note: &Note) -> Result<(), DdError> {
        self.q.release(note)
    }
}

/// What a send returns: its sequence number and, for a DMA send, the
/// transfer to test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    /// The message's sequence number on its connection.
    pub seq: u64,
    dma: Option<DmaHandle>,
}

impl Ticket {
    /// Whether the bytes went by DMA.
    pub fn by_dma(&self) -> bool {
        self.dma.is_some()
    }
}

/// The transmit DMA engine for one connection: the source area as a ring
/// of copies, each kept until its transfer is done.
struct Dma {
    port: DmaPort,
    target: DmaTarget,
    /// Transfers that may still read the area: (start, end, handle).
    inflight: VecDeque<(usize, usize, DmaHandle)>,
    head: usize,
}

impl Dma {
    /// Room for `len` bytes in the area, waiting for the transfers that
    /// read it to finish.
    fn room(&mut self, len: usize) -> Result<usize, DdError> {
        let size = self.port.buffer().len();
        if len > size {
            return Err(DdError::Invalid(format!("a DMA send of {len} bytes: the DMA area holds {size}")));
        }
        let at = if self.head + len > size { 0 } else { self.head };
        while let Some(&(s, e, h)) = self.inflight.front() {
            let overlaps = s < at + len && at < e;
            if !overlaps && self.inflight.len() < 1024 {
                break;
            }
            self.port.wait(&h, DMA_SPACE_WAIT)?;
            self.inflight.pop_front();
        }
        self.head = at + len;
        Ok(at)
    }
}

/// The sending process's end of one connection.
pub struct Conn {
    imc: Imc,
    s: Sender<McTx, McRx>,
    buffer_id: u32,
    dma: Option<Dma>,
    threshold: usize,
    /// DMA transfers whose tickets were not yet seen done, by sequence.
    pending: HashMap<u64, DmaHandle>,
}

/// The DMA threshold from `DD_DMA_THRESHOLD` (bytes; 0 turns DMA off).
fn threshold_from_env() -> Result<usize, DdError> {
    match std::env::var("DD_DMA_THRESHOLD") {
        Err(_) => Ok(DMA_THRESHOLD_DEFAULT),
        Ok(v) => v.trim().parse().map_err(|_| DdError::Invalid(format!("DD_DMA_THRESHOLD={v}: not a number of bytes"))),
    }
}

impl Conn {
    /// Connects to connection `tag` that the process on node `receiver`
    /// accepted (waiting up to `timeout` for it to exist).
    pub fn connect(receiver: u8, tag: u64, timeout: Duration) -> Result<Conn, DdError> {
        let conn = check_tag(tag)?;
        let threshold = threshold_from_env()?;
        let imc = Imc::connect()?;
        let me = this_node(&imc)?;
        if receiver == me {
            return Err(DdError::Invalid(format!("node {receiver} is this node: Direct Deposit connects two nodes")));
        }
        let t0 = Instant::now();
        while imc.find(key(me, receiver, tag, Part::Back))?.is_none() {
            if t0.elapsed() > timeout {
                return Err(DdError::Timeout(format!("connection {tag} was not accepted on node {receiver}")));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let hold = |part: Part| -> Result<u32, DdError> {
            let k = key(me, receiver, tag, part);
            let (_, pages) = imc.find(k)?.ok_or_else(|| DdError::Invalid(format!("connection {tag} went away")))?;
            Ok(imc.asalloc(k, pages * PAGE_SIZE, 0o600, false)?.0)
        };
        let (notes, buffer, back) = (hold(Part::Notes)?, hold(Part::Buffer)?, hold(Part::Back)?);
        let back_rx = McRx(imc.asattach_rx(back)?);
        let notes_tx = McTx(Arc::new(imc.asattach_tx_p2p(notes, receiver as u32)?));
        let buf_tx = McTx(Arc::new(imc.asattach_tx_p2p(buffer, receiver as u32)?));
        Ok(Conn {
            imc,
            s: Sender::new(conn, notes_tx, buf_tx, back_rx),
            buffer_id: buffer,
            dma: None,
            threshold,
            pending: HashMap::new(),
        })
    }

    /// Bytes of the receiver's buffer.
    pub fn buffer_len(&self) -> u64 {
        self.s.buffer_len()
    }

    /// Messages of at least `bytes` go by DMA (0: never).
    pub fn set_dma_threshold(&mut self, bytes: usize) {
        self.threshold = bytes;
    }

    /// The DMA threshold in force.
    pub fn dma_threshold(&self) -> usize {
        self.threshold
    }

    /// Messages sent and not yet released by the receiver.
    pub fn outstanding(&mut self) -> usize {
        self.s.outstanding()
    }

    /// Sends `data` to `offset` of the receiver's buffer: by DMA from the
    /// threshold up, by stores below it.
    pub fn send(&mut self, offset: u64, data: &[u8]) -> Result<Ticket, DdError> {
        if self.threshold > 0 && data.len() >= self.threshold {
            self.send_dma(offset, data)
        } else {
            self.send_stores(offset, data)
        }
    }

    /// Sends by stores into the transmit window (done when it returns).
    pub fn send_stores(&mut self, offset: u64, data: &[u8]) -> Result<Ticket, DdError> {
        let note = self.s.send(offset, data)?;
        Ok(Ticket { seq: note.seq, dma: None })
    }

    /// Sends by the transmit DMA engine: the bytes are copied into this
    /// process's DMA area, the transfer is started and the note stored
    /// after it (the adapter orders the note after the transfer's bytes).
    /// [`Conn::test`] says when the transfer is done and how it ended.
    pub fn send_dma(&mut self, offset: u64, data: &[u8]) -> Result<Ticket, DdError> {
        if data.is_empty() {
            return self.send_stores(offset, data);
        }
        let seq = self.s.check(offset, data.len() as u64)?;
        self.open_dma()?;
        let Some(dma) = self.dma.as_mut() else { return Err(DdError::Invalid("no DMA".into())) };
        let at = dma.room(data.len())?;
        dma.port.buffer().write(at, data)?;
        let h = dma.port.start(&dma.target, offset, at as u64, data.len() as u64)?;
        dma.inflight.push_back((at, at + data.len(), h));
        let note = self.s.post(offset, data.len() as u32, crc(data, offset as u32, seq, self.s.conn()), FLAG_DMA);
        self.pending.insert(note.seq, h);
        Ok(Ticket { seq: note.seq, dma: Some(h) })
    }

    /// Whether the send of `t` is done: true once its bytes are on their
    /// way whole (at once for stores), false while its transfer is in
    /// flight, or the engine's error.
    pub fn test(&mut self, t: &Ticket) -> Result<bool, DdError> {
        let (Some(h), Some(dma)) = (t.dma, self.dma.as_ref()) else { return Ok(true) };
        match dma.port.test(&h)? {
            Some(_) => {
                self.pending.remove(&t.seq);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Waits up to `timeout` for the send of `t` to be done.
    pub fn wait(&mut self, t: &Ticket, timeout: Duration) -> Result<(), DdError> {
        let (Some(h), Some(dma)) = (t.dma, self.dma.as_ref()) else { return Ok(()) };
        dma.port.wait(&h, timeout)?;
        self.pending.remove(&t.seq);
        Ok(())
    }

    /// The ticket of a DMA send still pending, by sequence number (the C
    /// API's tickets are sequence numbers).
    pub fn ticket(&self, seq: u64) -> Ticket {
        Ticket { seq, dma: self.pending.get(&seq).copied() }
    }

    /// The transmit DMA engine's own rate: `reps` transfers of `len` bytes
    /// from this process's DMA area into the receiver's buffer at offset
    /// 0, each waited for, with no note (so only while nothing is
    /// outstanding: the receiver has nothing there to read). Returns the
    /// time they took.
    pub fn engine_time(&mut self, len: usize, reps: usize) -> Result<Duration, DdError> {
        let s = self.s.check(0, len as u64)?;
        if self.s.outstanding() > 0 {
            return Err(DdError::Busy { offset: 0, end: len as u64, seq: s - 1 });
        }
        self.open_dma()?;
        let Some(dma) = self.dma.as_mut() else { return Err(DdError::Invalid("no DMA".into())) };
        let at = dma.room(len)?;
        let t0 = Instant::now();
        for _ in 0..reps {
            let h = dma.port.start(&dma.target, 0, at as u64, len as u64)?;
            dma.port.wait(&h, DMA_SPACE_WAIT)?;
        }
        Ok(t0.elapsed())
    }

    fn open_dma(&mut self) -> Result<(), DdError> {
        if self.dma.is_none() {
            let port = self.imc.dma_open(DMA_AREA as u64)?;
            let target = self.imc.dma_target(self.buffer_id)?;
            self.dma = Some(Dma { port, target, inflight: VecDeque::new(), head: 0 });
        }
        Ok(())
    }

    /// Waits up to [`FREE_WAIT`] until `data` may go at `offset` (the
    /// receiver released what was there), then sends it by the threshold.
    pub fn send_when_free(&mut self, offset: u64, data: &[u8]) -> Result<Ticket, DdError> {
        self.when_free(offset, data.len(), |c| c.send(offset, data))
    }

    /// [`Conn::send_when_free`] by stores.
    pub fn send_when_free_stores(&mut self, offset: u64, data: &[u8]) -> Result<Ticket, DdError> {
        self.when_free(offset, data.len(), |c| c.send_stores(offset, data))
    }

    /// [`Conn::send_when_free`] by DMA.
    pub fn send_when_free_dma(&mut self, offset: u64, data: &[u8]) -> Result<Ticket, DdError> {
        self.when_free(offset, data.len(), |c| c.send_dma(offset, data))
    }

    fn when_free(
        &mut self,
        offset: u64,
        len: usize,
        send: impl FnOnce(&mut Conn) -> Result<Ticket, DdError>,
    ) -> Result<Ticket, DdError> {
        let t0 = Instant::now();
        loop {
            match self.s.check(offset, len as u64) {
                Err(DdError::Busy { .. } | DdError::NotesFull) if t0.elapsed() < FREE_WAIT => std::hint::spin_loop(),
                Err(e) => return Err(e),
                Ok(_) => return send(self),
            }
        }
    }
}
