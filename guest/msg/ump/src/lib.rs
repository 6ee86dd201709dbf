//! UMP, Universal Message Passing (seed 000, "Universal Message Passing",
//! Table 3): duplex channels between 64-bit endpoint handles, over shared
//! memory inside a guest or MEMORY CHANNEL between guests, with the same
//! calls for both. The C library (`libump`, `ump.h`) is [`capi`].
//!
//! - [`ring`]: the lockless single-producer single-consumer buffer.
//! - [`mem`]: the memory under it (shared memory, MEMORY CHANNEL windows).
//! - [`channel`]: opening handshake, streaming, close and peer death.
//! - [`config`], [`error`]: `ump_init`'s settings, what calls return.
//! - [`shm`], [`mc`]: the two transports.
//! - [`listen`]: `ump_listen`; [`waker`]: sleeping until a listener may
//!   have a new channel; [`outbuf`]: `ump_mcast`;
//!   [`nb`]: `ump_nbread` / `ump_nbwrite`; [`events`]: `ump_wait`;
//!   [`backoff`]: how the layers above wait (spins, yields, naps).
//! - this module: the process's channel table (one lock, `STATE`) and the
//!   blocking calls.
//!
//! The data path (`write`, `read`) makes no system call while data moves;
//! a side that has to wait spins, then yields, and now and then checks that
//! the other side is still alive.

#![warn(missing_docs)]

/// The waiting policy UMP shares with the layers above it (and with BBP).
pub use imc_client::backoff;
pub mod capi;
pub mod channel;
pub mod config;
pub mod error;
pub mod events;
pub mod listen;
pub mod mc;
pub mod mem;
pub mod nb;
pub mod outbuf;
mod probe;
pub mod ring;
pub mod shm;
mod trace;
pub mod waker;

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub use channel::{ChanError, Channel, Transport};
pub use config::{parse_size, Config, ConfigError, DMA_SPARE_MAX, MAX_BUFFER, OUTBUF_DEFAULT};
pub use error::UmpError;
pub use events::{wait, Event};
pub use listen::listen;
pub use nb::{nbread, nbread_result, nbwrite, nbwrite_result};
pub use outbuf::{mcast, mcast_timeout};
pub use waker::{listen_waker, ListenWaker};

use listen::{listen_dir, marker, marker_alive, notify_listener, Inbox};
use mc::{open_mc, OutbufsIn};
use nb::{busy_nb, Nb, Worker};
use shm::{open_shm, shm_path};

/// Transport choice of `open`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// Where the other side is: shared memory on this guest, MEMORY CHANNEL otherwise.
    Any,
    /// Shared memory.
    Shm,
    /// MEMORY CHANNEL.
    Mc,
}

/// One channel of the process.
struct Entry {
    ch: Arc<Channel>,
    want: Want,
    /// Background threads of the non-blocking calls (started by the first).
    writer: Option<Worker>,
    reader: Option<Worker>,
    reported_open: bool,
    reported_closed: bool,
    nbwrite: Option<Nb>,
    nbread: Option<Nb>,
}

impl Entry {
    fn new(ch: Arc<Channel>, want: Want) -> Entry {
        Entry {
            ch,
            want,
            writer: None,
            reader: None,
            reported_open: false,
            reported_closed: false,
            nbwrite: None,
            nbread: None,
        }
    }
}

struct State {
    cfg: Config,
    next: i32,
    chans: HashMap<i32, Entry>,
    /// Handles listening (`ump_listen`) and the peers already accepted.
    listening: HashMap<u64, HashSet<u64>>,
    /// Per listening handle, the modification time of its folder of
    /// notices when a look last left it empty (`listen::accept`).
    listen_quiet: HashMap<u64, std::time::SystemTime>,
    imc: Option<Arc<Mutex<imc_client::Imc>>>,
    node: u32,
    stats: (u64, u64),
    /// The channel `wait` last reported a message on.
    last_message: i32,
    /// Our outbuf (made by the first multicast over MEMORY CHANNEL).
    outbuf: Option<Arc<Mutex<outbuf::Outbuf>>>,
    /// Other processes' outbufs we have mapped for receive, by key.
    outbufs_in: OutbufsIn,
    /// Inboxes of our listening handles (MEMORY CHANNEL), by handle.
    inboxes: HashMap<u64, Inbox>,
    /// The transmit DMA source area MEMORY CHANNEL rings are copied into
    /// (opened with the first such channel): Err says why there is none.
    dma: Arc<mc::LazyArea>,
    /// Finds out whether MEMORY CHANNEL peers are alive (started with the
    /// first such channel).
    prober: Option<probe::Prober>,
}

impl State {
    /// The channel between `local` and `remote` that is not closed, if
    /// this process has one.
    fn find(&self, local: u64, remote: u64) -> Option<i32> {
        self.chans
            .iter()
            .find(|(_, e)| e.ch.local == local && e.ch.remote == remote && !e.ch.is_closed())
            .map(|(&id, _)| id)
    }

    /// Adds a channel; returns its id.
    fn add(&mut self, e: Entry) -> i32 {
        let id = self.next;
        self.next += 1;
        self.chans.insert(id, e);
        id
    }
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

fn state() -> Result<MutexGuard<'static, Option<State>>, UmpError> {
    let g = STATE.lock().unwrap_or_else(|e| e.into_inner());
    if g.is_none() {
        return Err(UmpError::NotInitialized);
    }
    Ok(g)
}

fn with<T>(f: impl FnOnce(&mut State) -> Result<T, UmpError>) -> Result<T, UmpError> {
    let mut g = state()?;
    match g.as_mut() {
        Some(st) => f(st),
        None => Err(UmpError::NotInitialized),
    }
}

/// This guest's MEMORY CHANNEL node (0 off a cluster).
fn my_node() -> u32 {
    std::fs::read_to_string("/run/mc-node").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0)
}

/// `ump_init`: sets UMP up for this process.
pub fn init(cfg: Config) -> Result<(), UmpError> {
    cfg.check()?;
    let mut g = STATE.lock().unwrap_or_else(|e| e.into_inner());
    if g.is_some() {
        return Err(UmpError::Busy("ump_init was called already".into()));
    }
    let imc = imc_client::Imc::connect().ok().map(|i| Arc::new(Mutex::new(i)));
    let dma = mc::LazyArea::new(&cfg);
    *g = Some(State {
        cfg,
        next: 1,
        chans: HashMap::default(),
        listening: HashMap::default(),
        listen_quiet: HashMap::default(),
        imc,
        node: my_node(),
        stats: (0, 0),
        last_message: 0,
        outbuf: None,
        outbufs_in: Arc::new(Mutex::new(HashMap::default())),
        inboxes: HashMap::default(),
        dma,
        prober: None,
    });
    Ok(())
}

/// `ump_exit`: closes every channel and frees what UMP holds.
pub fn exit() -> Result<(), UmpError> {
    let mut g = state()?;
    let Some(st) = g.take() else { return Err(UmpError::NotInitialized) };
    let mut handles: HashSet<u64> = st.chans.values().map(|e| e.ch.local).collect();
    for (_, e) in st.chans {
        finish(e);
    }
    handles.extend(st.listening.keys());
    for h in handles {
        let _ = std::fs::remove_file(marker(h));
    }
    for h in st.listening.keys() {
        let _ = std::fs::remove_dir_all(listen_dir(*h));
    }
    Ok(())
}

/// Closes a channel and joins its background threads.
fn finish(mut e: Entry) {
    e.ch.close();
    for w in [e.writer.take(), e.reader.take()].into_iter().flatten() {
        w.stop();
    }
}

/// Where to open (local, remote) with `want`, deciding UMP_ANY: an
/// existing shared-memory channel, else the other side's marker on this
/// guest, else MEMORY CHANNEL (or shared memory when there is no imcd).
fn choose(st: &State, local: u64, remote: u64, want: Want) -> Transport {
    match want {
        Want::Shm => Transport::Shm,
        Want::Mc => Transport::Mc,
        Want::Any => {
            let (lo, hi) = (local.min(remote), local.max(remote));
            if shm_path(lo, hi).exists() || marker_alive(remote) || st.imc.is_none() {
                Transport::Shm
            } else {
                Transport::Mc
            }
        }
    }
}

/// `ump_open`: opens (our side of) the channel between `local` and
/// `remote`; it is complete once the other side opens it too (`wait`
/// reports [`Event::Open`]; `read` and `write` wait for it).
pub fn open(local: u64, remote: u64, want: Want) -> Result<i32, UmpError> {
    with(|st| {
        if st.find(local, remote).is_some() {
            return Err(UmpError::Busy(format!("channel {local:#x}->{remote:#x} is open in this process")));
        }
        open_locked(st, local, remote, want)
    })
}

/// [`open`], or the channel between `local` and `remote` this process
/// has already (opened by it, or accepted for a listener) if it is not
/// closed: for a layer that opens channels on first use from either side
/// (MPI), where the other side may have opened first.
pub fn open_or_join(local: u64, remote: u64, want: Want) -> Result<i32, UmpError> {
    with(|st| match st.find(local, remote) {
        Some(id) => Ok(id),
        None => open_locked(st, local, remote, want),
    })
}

fn open_locked(st: &mut State, local: u64, remote: u64, want: Want) -> Result<i32, UmpError> {
    if local == remote {
        return Err(UmpError::Invalid(format!("both ends are handle {local:#x}")));
    }
    if st.chans.len() >= st.cfg.max_channels {
        return Err(UmpError::TooMany(st.chans.len()));
    }
    let mut steps = trace::Steps::new();
    listen::announce(local);
    let ch = match choose(st, local, remote, want) {
        Transport::Shm => open_shm(st, local, remote)?,
        Transport::Mc => open_mc(st, local, remote)?,
    };
    steps.step("our side");
    tell_listener(st, &ch, &mut steps)?;
    steps.done(&format!("ump_open {local:#x} -> {remote:#x}"));
    Ok(st.add(Entry::new(ch, want)))
}

/// Tells a listener on the other handle that channel `ch` is open on our
/// side: over MEMORY CHANNEL through its inbox, on this guest through its
/// folder, once our half exists (the notice names the transport).
fn tell_listener(st: &State, ch: &Channel, steps: &mut trace::Steps) -> Result<(), UmpError> {
    let (local, remote) = (ch.local, ch.remote);
    if ch.transport == Transport::Mc {
        notify_listener(st, local, remote)?;
        steps.step("listener told");
    }
    if listen_dir(remote).is_dir() {
        let kind = if ch.transport == Transport::Shm { "shm" } else { "mc" };
        let tmp = listen_dir(remote).join(format!(".{local:016x}"));
        if std::fs::write(&tmp, kind).is_ok() {
            let _ = std::fs::rename(&tmp, listen_dir(remote).join(format!("{local:016x}")));
        }
    }
    Ok(())
}

/// Tells the other side's listener again about channel `id` while it is
/// not complete: a listener that started listening after our open (its
/// inbox or folder did not exist yet) learns of it now. Nothing to do
/// for a complete channel.
pub fn renotify(id: i32) -> Result<(), UmpError> {
    with(|st| {
        let ch = st.chans.get(&id).map(|e| e.ch.clone()).ok_or(UmpError::NoChannel(id))?;
        if ch.is_complete() {
            return Ok(());
        }
        tell_listener(st, &ch, &mut trace::Steps::new())
    })
}

/// Channels a listening handle of this process accepted since the last
/// look (`ump_wait` accepts them too, and reports them as
/// [`Event::Open`]): their ids and the other side's handle. For a layer
/// that polls its channels itself instead of calling `wait`.
pub fn accept_new() -> Result<Vec<(i32, u64)>, UmpError> {
    with(|st| {
        let ids = listen::accept(st);
        Ok(ids.into_iter().filter_map(|id| st.chans.get(&id).map(|e| (id, e.ch.remote))).collect())
    })
}

/// UMP_ANY, both sides first at once: one may have chosen MEMORY CHANNEL
/// before the other's marker appeared while the other chose shared memory
/// (or both may have). Until a channel is complete, shared memory wins: a
/// side on MEMORY CHANNEL that sees the shared-memory channel appear, or
/// the other handle announced on this guest, moves there (and its
/// shared-memory half then draws the other side too).
fn converge(st: &State, e: &mut Entry) {
    if e.want != Want::Any || e.ch.transport != Transport::Mc || e.ch.is_complete() {
        return;
    }
    let (lo, hi) = (e.ch.local.min(e.ch.remote), e.ch.local.max(e.ch.remote));
    if shm_path(lo, hi).exists() || marker_alive(e.ch.remote) {
        if let Ok(ch) = open_shm(st, e.ch.local, e.ch.remote) {
            e.ch.close();
            e.ch = ch;
        }
    }
}

/// `ump_close`: closes a channel (a non-blocking write still streaming
/// stops; the other side gets an error for that message, never half of it).
pub fn close(id: i32) -> Result<(), UmpError> {
    let e = with(|st| st.chans.remove(&id).ok_or(UmpError::NoChannel(id)))?;
    finish(e);
    Ok(())
}

fn channel(id: i32) -> Result<Arc<Channel>, UmpError> {
    with(|st| st.chans.get(&id).map(|e| e.ch.clone()).ok_or(UmpError::NoChannel(id)))
}

/// The channel behind `id`, for a layer above UMP that polls many
/// channels itself (MPI's progress engine): its non-blocking
/// [`Channel::writable`] and [`Channel::pending`], and blocking
/// [`Channel::write`] and [`Channel::read`] that return at once when
/// those said so. Take it once the channel is complete (`wait` reported
/// [`Event::Open`]): before that, `UMP_ANY` may still move the channel to
/// shared memory.
pub fn chan(id: i32) -> Result<Arc<Channel>, UmpError> {
    channel(id)
}

/// `ump_write`: writes a whole message; returns when all of it is in the
/// channel buffer (large ones stream through it while the reader reads).
pub fn write(id: i32, msg: &[u8]) -> Result<(), UmpError> {
    busy_nb(id, true)?;
    let ch = channel(id)?;
    ch.write(msg, None)?;
    let _ = with(|st| {
        st.stats.0 += msg.len() as u64;
        Ok(())
    });
    Ok(())
}

/// `ump_write` with a deadline: fails with a timeout when the message is
/// not all in the channel buffer by then (the reader is not reading, or
/// its progress is not reaching us).
pub fn write_timeout(id: i32, msg: &[u8], timeout: Duration) -> Result<(), UmpError> {
    busy_nb(id, true)?;
    let ch = channel(id)?;
    ch.write(msg, Some(Instant::now() + timeout))?;
    let _ = with(|st| {
        st.stats.0 += msg.len() as u64;
        Ok(())
    });
    Ok(())
}

/// `ump_read`: reads the next message into `buf` (waits for it); returns
/// its length. A message longer than `buf` is left in the channel
/// ([`ChanError::TooBig`] says how long it is).
pub fn read(id: i32, buf: &mut [u8]) -> Result<usize, UmpError> {
    busy_nb(id, false)?;
    let ch = channel(id)?;
    let n = ch.read(buf, None)?;
    let _ = with(|st| {
        st.stats.1 += n as u64;
        Ok(())
    });
    Ok(n)
}

/// `ump_read` with a deadline.
pub fn read_timeout(id: i32, buf: &mut [u8], timeout: Duration) -> Result<usize, UmpError> {
    busy_nb(id, false)?;
    Ok(channel(id)?.read(buf, Some(Instant::now() + timeout))?)
}

/// What `ump_info` reports.
#[derive(Debug, Clone, Default)]
pub struct Info {
    /// Channels open.
    pub channels: usize,
    /// Of them over MEMORY CHANNEL.
    pub mc_channels: usize,
    /// Shared-memory ring bytes.
    pub shm_buffer: usize,
    /// MEMORY CHANNEL ring bytes.
    pub mc_buffer: usize,
    /// Channel limit.
    pub max_channels: usize,
    /// This guest's node.
    pub node: u32,
    /// imcd reachable (MEMORY CHANNEL transport available).
    pub mc_available: bool,
    /// imcd was reachable at [`init`] and its connection is still open:
    /// false once it has gone away, after which MEMORY CHANNEL channels
    /// cannot be opened and the caller should [`exit`] and start again.
    pub imcd_alive: bool,
    /// Bytes written by blocking writes.
    pub bytes_written: u64,
    /// Bytes read by blocking reads.
    pub bytes_read: u64,
    /// Pieces of at least this many bytes go by DMA (0: never).
    pub dma_threshold: usize,
    /// The DMA engine in use: Ok once opened (at a channel's first piece
    /// big enough for DMA, or for the spare), Err why not, None before.
    pub dma: Option<Result<(), String>>,
    /// Bytes the open channels' writers sent by DMA.
    pub dma_bytes: u64,
}

/// `ump_info`.
pub fn info() -> Result<Info, UmpError> {
    with(|st| {
        Ok(Info {
            channels: st.chans.len(),
            mc_channels: st.chans.values().filter(|e| e.ch.transport == Transport::Mc).count(),
            shm_buffer: st.cfg.shm_buffer,
            mc_buffer: st.cfg.mc_buffer,
            max_channels: st.cfg.max_channels,
            node: st.node,
            mc_available: st.imc.is_some(),
            imcd_alive: st.imc.as_ref().is_some_and(|i| i.lock().map(|i| i.daemon_alive()).unwrap_or(false)),
            bytes_written: st.stats.0,
            bytes_read: st.stats.1,
            dma_threshold: st.cfg.dma_threshold,
            dma: st.dma.state(),
            dma_bytes: st.chans.values().map(|e| e.ch.dma_bytes()).sum(),
        })
    })
}

/// The spare of this process's transmit DMA source area
/// ([`Config::dma_spare`]), opening the area if no MEMORY CHANNEL channel
/// has yet. An error when none was asked for, or there is no engine.
pub fn dma_spare() -> Result<mc::DmaSpare, UmpError> {
    with(mc::spare)
}

/// The transport a channel ended up on.
pub fn transport(id: i32) -> Result<Transport, UmpError> {
    Ok(channel(id)?.transport)
}
