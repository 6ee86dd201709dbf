//! UMP, Universal Message Passing (seed 000, "Universal Message Passing",
//! Table 3): duplex channels between 64-bit endpoint handles, over shared
//! memory inside a guest or MEMORY CHANNEL between guests, with the same
//! calls for both. The C library (`libump`, `ump.h`) is [`capi`].
//!
//! - [`ring`]: the lockless single-producer single-consumer buffer.
//! - [`mem`]: the two kinds of memory under it.
//! - [`channel`]: opening handshake, streaming, close and peer death.
//! - this module: the process's channels, the transports, events.
//!
//! The data path (`write`, `read`) makes no system call while data moves;
//! a side that has to wait spins, then yields, and now and then checks that
//! the other side is still alive.

#![warn(missing_docs)]

pub mod capi;
pub mod channel;
pub mod mem;
pub mod plot;
pub mod ring;

use imc_client::keys::Namespace;
use std::collections::{HashMap, HashSet};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub use channel::{ChanError, Channel, Transport};
use mem::{Local, Mem, Raw, Window};

/// Configuration (`ump_init`).
#[derive(Debug, Clone)]
pub struct Config {
    /// Ring bytes per direction, shared-memory channels.
    pub shm_buffer: usize,
    /// Ring bytes per direction, MEMORY CHANNEL channels.
    pub mc_buffer: usize,
    /// Channels this process may have open (buffers are allocated as
    /// channels open, up to this).
    pub max_channels: usize,
    /// Bytes of this process's multicast outbuf (a multiple of 8 KiB).
    pub outbuf: usize,
}

impl Default for Config {
    fn default() -> Self {
        // The paper's non-blocking runs: 256 KiB (shared memory), 32 KiB
        // (MEMORY CHANNEL).
        Config { shm_buffer: 256 << 10, mc_buffer: 32 << 10, max_channels: 64, outbuf: OUTBUF_DEFAULT }
    }
}

/// Largest ring: what one MEMORY CHANNEL region or shm file may hold.
pub const MAX_BUFFER: usize = 64 << 20;

impl Config {
    /// From the environment: `UMP_SHM_BUFFER`, `UMP_MC_BUFFER` (bytes, or
    /// with a K/M suffix), `UMP_MAX_CHANNELS`.
    pub fn from_env() -> Result<Config, UmpError> {
        let mut c = Config::default();
        let size = |name: &str, v: &mut usize| -> Result<(), UmpError> {
            if let Ok(s) = std::env::var(name) {
                *v = parse_size(&s)
                    .ok_or_else(|| UmpError::Invalid(format!("{name}={s:?}: a size like 65536 or 64K")))?;
            }
            Ok(())
        };
        size("UMP_SHM_BUFFER", &mut c.shm_buffer)?;
        size("UMP_MC_BUFFER", &mut c.mc_buffer)?;
        size("UMP_OUTBUF", &mut c.outbuf)?;
        if let Ok(s) = std::env::var("UMP_MAX_CHANNELS") {
            c.max_channels = s.parse().map_err(|_| UmpError::Invalid(format!("UMP_MAX_CHANNELS={s:?}")))?;
        }
        c.check()?;
        Ok(c)
    }

    /// Rejects sizes that cannot work.
    pub fn check(&self) -> Result<(), UmpError> {
        for (what, v) in [("shared-memory", self.shm_buffer), ("MEMORY CHANNEL", self.mc_buffer)] {
            if !(4096..=MAX_BUFFER).contains(&v) || v % 8 != 0 {
                return Err(UmpError::Invalid(format!(
                    "{what} buffer of {v} bytes: 4 KiB to {} MiB, a multiple of 8",
                    MAX_BUFFER >> 20
                )));
            }
        }
        if !(8192..=MAX_BUFFER).contains(&self.outbuf) || self.outbuf % 8192 != 0 {
            return Err(UmpError::Invalid(format!(
                "outbuf of {} bytes: 8 KiB to {} MiB, a multiple of 8 KiB (UMP_OUTBUF)",
                self.outbuf,
                MAX_BUFFER >> 20
            )));
        }
        if self.max_channels == 0 {
            return Err(UmpError::Invalid("max_channels must be at least 1".into()));
        }
        Ok(())
    }
}

fn parse_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (n, mul) = match s.as_bytes().last()? {
        b'k' | b'K' => (&s[..s.len() - 1], 1 << 10),
        b'm' | b'M' => (&s[..s.len() - 1], 1 << 20),
        _ => (s, 1),
    };
    n.parse::<usize>().ok()?.checked_mul(mul)
}

/// Why a UMP call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UmpError {
    /// `init` was not called (or `exit` was).
    NotInitialized,
    /// A bad argument.
    Invalid(String),
    /// No such channel.
    NoChannel(i32),
    /// Too many channels.
    TooMany(usize),
    /// A channel with these handles is open in this process already, or
    /// the other side's half is held by a live process.
    Busy(String),
    /// The transport is not available (MEMORY CHANNEL without imcd).
    NoTransport(String),
    /// The channel failed.
    Channel(ChanError),
    /// The operating system said no.
    Os(String),
}

impl std::fmt::Display for UmpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UmpError::NotInitialized => write!(f, "ump_init has not been called"),
            UmpError::Invalid(s) => write!(f, "invalid argument: {s}"),
            UmpError::NoChannel(c) => write!(f, "no channel {c}"),
            UmpError::TooMany(n) => write!(f, "{n} channels open already (UMP_MAX_CHANNELS)"),
            UmpError::Busy(s) => write!(f, "busy: {s}"),
            UmpError::NoTransport(s) => write!(f, "transport not available: {s}"),
            UmpError::Channel(e) => write!(f, "{e}"),
            UmpError::Os(s) => write!(f, "{s}"),
        }
    }
}

impl From<ChanError> for UmpError {
    fn from(e: ChanError) -> Self {
        UmpError::Channel(e)
    }
}

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

/// What `wait` reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The channel is complete (both sides opened it); for a listener, a
    /// new channel.
    Open(i32),
    /// A message (or its start) is there to read.
    Message(i32),
    /// A non-blocking write finished.
    WriteDone(i32),
    /// A non-blocking read finished.
    ReadDone(i32),
    /// The other side closed the channel or died.
    Closed(i32),
}

/// A non-blocking operation in progress.
struct Nb {
    done: Arc<AtomicBool>,
    result: Arc<Mutex<Option<Result<usize, ChanError>>>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Its completion event was reported.
    reported: bool,
}

/// A message for a channel's background writer, with where to say it is done.
type Job = (Vec<u8>, Arc<AtomicBool>, Arc<Mutex<Option<Result<usize, ChanError>>>>);

/// The background thread that finishes a channel's non-blocking writes
/// (started by the first one, kept for the next).
struct Writer {
    jobs: std::sync::mpsc::Sender<Job>,
    thread: std::thread::JoinHandle<()>,
}

impl Writer {
    fn start(ch: Arc<Channel>) -> Writer {
        let (jobs, rx) = std::sync::mpsc::channel::<Job>();
        let thread = std::thread::spawn(move || {
            for (msg, done, result) in rx {
                let out = ch.write(&msg, None).map(|()| msg.len());
                *result.lock().unwrap_or_else(|e| e.into_inner()) = Some(out);
                done.store(true, Ordering::Release);
            }
        });
        Writer { jobs, thread }
    }
}

struct Entry {
    ch: Arc<Channel>,
    want: Want,
    writer: Option<Writer>,
    reported_open: bool,
    reported_closed: bool,
    nbwrite: Option<Nb>,
    nbread: Option<Nb>,
}

impl Entry {
    fn new(ch: Arc<Channel>, want: Want) -> Entry {
        Entry { ch, want, writer: None, reported_open: false, reported_closed: false, nbwrite: None, nbread: None }
    }
}

struct State {
    cfg: Config,
    next: i32,
    chans: HashMap<i32, Entry>,
    /// Handles listening (`ump_listen`) and the peers already accepted.
    listening: HashMap<u64, HashSet<u64>>,
    imc: Option<Arc<Mutex<imc_client::Imc>>>,
    node: u32,
    stats: (u64, u64),
    /// The channel `wait` last reported a message on.
    last_message: i32,
    /// Our outbuf (made by the first multicast over MEMORY CHANNEL).
    outbuf: Option<Arc<Mutex<Outbuf>>>,
    /// Other processes' outbufs we have mapped for receive, by key.
    outbufs_in: Arc<Mutex<HashMap<u64, OutbufIn>>>,
    /// Inboxes of our listening handles (MEMORY CHANNEL), by handle.
    inboxes: HashMap<u64, Inbox>,
}

/// A listening handle's inbox in MEMORY CHANNEL space: one coherent page
/// of 1024 words, 16 per node. An opener on node n writes its handle into
/// a free word of n's part (processes of one node take turns under a
/// flock, so no two openers ever write one word at once); the listener
/// reads the handles, opens the channels and clears the words.
struct Inbox {
    rx: Window,
    tx: Window,
    _maps: (imc_client::Attached, imc_client::Attached),
}

/// Words of an inbox per node.
const INBOX_PER_NODE: usize = 16;

/// MEMORY CHANNEL key of handle `h`'s listen area (namespace registry:
/// `imc_proto::keys`).
fn listen_key(h: u64) -> u64 {
    Namespace::UmpListen.key(h)
}

/// Maps listening handle `h`'s inbox (receive and transmit), creating it if `create`.
fn map_inbox(imc: &imc_client::Imc, h: u64, create: bool) -> Result<Option<(Inbox, u32)>, UmpError> {
    let err = |e: imc_client::ImcError| UmpError::NoTransport(format!("imcd: inbox: {e}"));
    if !create && imc.find(listen_key(h)).map_err(err)?.is_none() {
        return Ok(None);
    }
    let (id, ..) = imc.asalloc_flags(listen_key(h), 8192, 0o666, false, true).map_err(err)?;
    let rx = imc.asattach(id, false, false).map_err(err)?;
    let tx = imc.asattach(id, true, false).map_err(err)?;
    let inbox = Inbox {
        rx: Window(Raw { ptr: rx.as_ptr(), len: rx.len() }),
        tx: Window(Raw { ptr: tx.as_ptr(), len: tx.len() }),
        _maps: (rx, tx),
    };
    Ok(Some((inbox, id)))
}

/// Tells a listener on another guest that `local` opened a channel to it
/// (if `remote` listens there).
fn notify_listener(st: &State, local: u64, remote: u64) -> Result<(), UmpError> {
    let Some(imc) = st.imc.clone() else { return Ok(()) };
    let i = imc.lock().unwrap_or_else(|e| e.into_inner());
    let Some((inbox, id)) = map_inbox(&i, remote, false)? else { return Ok(()) };
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(format!("/run/ump-inbox-{remote:016x}.lock"))
        .map_err(|e| UmpError::Os(e.to_string()))?;
    // SAFETY: flock(2) on a file we hold open.
    unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) };
    let base = (st.node as usize % 64) * INBOX_PER_NODE;
    let slots: Vec<usize> = (base..base + INBOX_PER_NODE).collect();
    let r = match slots
        .iter()
        .find(|&&w| inbox.rx.load(w * 8) == local)
        .or_else(|| slots.iter().find(|&&w| inbox.rx.load(w * 8) == 0))
    {
        Some(&w) => {
            inbox.tx.store(w * 8, local);
            // Wait until it is in our copy too: the next opener here must see the word taken.
            let t0 = Instant::now();
            while inbox.rx.load(w * 8) != local && t0.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_micros(100));
            }
            Ok(())
        }
        None => Err(UmpError::Busy(format!("the inbox of listener {remote:#x} is full for this node"))),
    };
    // SAFETY: as above.
    unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_UN) };
    drop(inbox);
    let _ = i.asdealloc(id);
    r
}

/// A sender's outbuf, mapped for receive here.
struct OutbufIn {
    mem: Arc<dyn Mem>,
    _rx: imc_client::Attached,
    _id: u32,
}

/// This process's outbuf: one region, written only by us and mapped for
/// transmit to every node (the SCRAMNet billboard idea, seed 002, and the
/// outbufs seed 000 designed but never shipped). It is allocated
/// coherently, so every node receives it from the start and a receiver
/// that maps it when the first record arrives sees every message in it.
struct Outbuf {
    key: u64,
    size: u64,
    tx: Window,
    _attached: imc_client::Attached,
    /// Bytes used so far (messages start on 8-byte boundaries and never wrap).
    head: u64,
    /// Records not yet consumed: (channel, our index after the record,
    /// outbuf offset of its message).
    pending: Vec<(Arc<Channel>, u64, u64)>,
}

/// Default outbuf bytes (`UMP_OUTBUF`).
pub const OUTBUF_DEFAULT: usize = 1 << 20;

impl Outbuf {
    /// Drops records their readers have consumed (or can no longer).
    fn reclaim(&mut self) {
        self.pending.retain(|(ch, after, _)| !ch.is_closed() && !ch.peer_closed() && ch.consumed() < *after);
    }

    /// The oldest byte still needed.
    fn oldest(&self) -> u64 {
        self.pending.iter().map(|p| p.2).min().unwrap_or(self.head)
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
    f(g.as_mut().expect("checked"))
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
    *g = Some(State {
        cfg,
        next: 1,
        chans: HashMap::new(),
        listening: HashMap::new(),
        imc,
        node: my_node(),
        stats: (0, 0),
        last_message: 0,
        outbuf: None,
        outbufs_in: Arc::new(Mutex::new(HashMap::new())),
        inboxes: HashMap::new(),
    });
    Ok(())
}

/// `ump_exit`: closes every channel and frees what UMP holds.
pub fn exit() -> Result<(), UmpError> {
    let mut g = state()?;
    let st = g.take().expect("checked");
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

fn finish(mut e: Entry) {
    e.ch.close();
    if let Some(w) = e.writer.take() {
        drop(w.jobs);
        let _ = w.thread.join();
    }
    for nb in [e.nbwrite.take(), e.nbread.take()].into_iter().flatten() {
        if let Some(t) = nb.thread {
            let _ = t.join();
        }
    }
}

/// Where a handle announces that it lives on this guest.
fn marker(h: u64) -> PathBuf {
    PathBuf::from(format!("/dev/shm/ump-ep-{h:016x}"))
}

/// Whether a live process on this guest has announced handle `h` (a
/// marker left by a process that died does not count).
fn marker_alive(h: u64) -> bool {
    std::fs::read_to_string(marker(h)).ok().and_then(|s| s.trim().parse::<u32>().ok()).is_some_and(pid_alive)
}

fn listen_dir(h: u64) -> PathBuf {
    PathBuf::from(format!("/dev/shm/ump-listen-{h:016x}"))
}

fn shm_path(lo: u64, hi: u64) -> PathBuf {
    PathBuf::from(format!("/dev/shm/ump-ch-{lo:016x}-{hi:016x}"))
}

/// MEMORY CHANNEL key of half `side` of the channel (lo, hi): a hash of
/// the pair in UMP's channel namespace (`imc_proto::keys`).
fn mc_key(lo: u64, hi: u64, side: u64) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for b in lo.to_le_bytes().into_iter().chain(hi.to_le_bytes()) {
        h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
    }
    Namespace::UmpChannel.key(h & !1 | side & 1)
}

fn pid_alive(pid: u32) -> bool {
    // SAFETY: kill(2) with signal 0 only checks.
    pid != 0
        && (unsafe { libc::kill(pid as i32, 0) } == 0
            || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH))
}

/// A shared mapping of a file we keep open.
struct FileMap {
    raw: Raw,
    _file: std::fs::File,
}

impl Drop for FileMap {
    fn drop(&mut self) {
        // SAFETY: from the mmap in `map_file`, unmapped once.
        unsafe { libc::munmap(self.raw.ptr.cast(), self.raw.len) };
    }
}

// SAFETY: see `Raw`: the mapping lives as long as the FileMap.
unsafe impl Send for FileMap {}
// SAFETY: as for Send.
unsafe impl Sync for FileMap {}

fn map_file(f: std::fs::File, len: usize) -> Result<FileMap, UmpError> {
    // SAFETY: a shared read-write mapping of a file of at least `len` bytes; checked below.
    let p = unsafe {
        libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, f.as_raw_fd(), 0)
    };
    if p == libc::MAP_FAILED {
        return Err(UmpError::Os(format!("mmap: {}", std::io::Error::last_os_error())));
    }
    Ok(FileMap { raw: Raw { ptr: p.cast(), len }, _file: f })
}

/// The sub-range of a mapping one half takes.
fn half(raw: Raw, index: usize, half_len: usize) -> Raw {
    // SAFETY: the caller mapped 2 * half_len bytes.
    Raw { ptr: unsafe { raw.ptr.add(index * half_len) }, len: half_len }
}

fn open_shm(st: &State, local: u64, remote: u64) -> Result<Arc<Channel>, UmpError> {
    let (lo, hi) = (local.min(remote), local.max(remote));
    let side = usize::from(local > remote);
    let size = st.cfg.shm_buffer;
    let half_len = ring::half_len(size);
    let path = shm_path(lo, hi);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| UmpError::Os(format!("{}: {e}", path.display())))?;
    // SAFETY: flock(2) on a file we hold open: the two openers set up one at a time.
    unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
    let len = f.metadata().map_err(|e| UmpError::Os(e.to_string()))?.len() as usize;
    let fresh = len == 0;
    if fresh {
        f.set_len((2 * half_len) as u64).map_err(|e| UmpError::Os(e.to_string()))?;
    } else if len != 2 * half_len {
        return Err(UmpError::Invalid(format!(
            "the other side opened this channel with a {} byte buffer, this process uses {size} (UMP_SHM_BUFFER)",
            len / 2 - ring::RING
        )));
    }
    let map = map_file(f, 2 * half_len)?;
    let mine = Local(half(map.raw, side, half_len));
    let theirs = Local(half(map.raw, 1 - side, half_len));
    if !fresh {
        let open = mine.load(ring::OPEN);
        let who = mine.load(ring::WHO);
        if open != 0 && open != ring::CLOSED && pid_alive(who as u32) {
            return Err(UmpError::Busy(format!("channel {local:#x}->{remote:#x} is open in process {}", who as u32)));
        }
        // Whatever an earlier process left in our half goes.
        let zero = vec![0u8; half_len];
        mine.write(0, &zero);
        let them = theirs.load(ring::WHO) as u32;
        if theirs.load(ring::OPEN) == ring::CLOSED || (them != 0 && !pid_alive(them)) {
            theirs.write(0, &zero);
        }
    }
    // SAFETY: as above.
    unsafe { libc::flock(map._file.as_raw_fd(), libc::LOCK_UN) };
    let (out, peer): (Arc<dyn Mem>, Arc<dyn Mem>) = (Arc::new(mine), Arc::new(theirs));
    let alive: channel::Liveness = Box::new(|who| {
        let pid = who as u32;
        if pid == 0 || pid_alive(pid) {
            Ok(())
        } else {
            Err(format!("process {pid} has exited"))
        }
    });
    let who = (st.node as u64) << 32 | std::process::id() as u64;
    let keep = ShmKeep { map, path, peer_open: (1 - side) * half_len + ring::OPEN };
    Ok(Channel::new(local, remote, Transport::Shm, size, out, peer, who, alive, Box::new(keep)))
}

/// Keeps a shared-memory channel's file mapped; the side that closes last
/// (the other side's OPEN reads CLOSED, or it never came) removes the file.
struct ShmKeep {
    map: FileMap,
    path: PathBuf,
    peer_open: usize,
}

impl Drop for ShmKeep {
    fn drop(&mut self) {
        let other = Local(self.map.raw).load(self.peer_open);
        if other == ring::CLOSED || other == 0 {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Keeps the channel's regions: attachments, then the allocations.
struct McKeep {
    _tx: imc_client::Attached,
    _rx: imc_client::Attached,
    imc: Arc<Mutex<imc_client::Imc>>,
    ids: [u32; 2],
}

impl Drop for McKeep {
    fn drop(&mut self) {
        let imc = self.imc.lock().unwrap_or_else(|e| e.into_inner());
        for id in self.ids {
            let _ = imc.asdealloc(id);
        }
    }
}

fn open_mc(st: &State, local: u64, remote: u64) -> Result<Arc<Channel>, UmpError> {
    let imc =
        st.imc.clone().ok_or_else(|| UmpError::NoTransport("MEMORY CHANNEL needs imcd (not reachable)".into()))?;
    let (lo, hi) = (local.min(remote), local.max(remote));
    let side = u64::from(local > remote);
    let size = st.cfg.mc_buffer;
    let bytes = ring::half_len(size) as u64;
    let c = imc.lock().unwrap_or_else(|e| e.into_inner());
    let err = |e: imc_client::ImcError| UmpError::NoTransport(format!("imcd: {e}"));
    let (mine, ..) = c.asalloc(mc_key(lo, hi, side), bytes, 0o666, false).map_err(err)?;
    let (theirs, ..) = c.asalloc(mc_key(lo, hi, 1 - side), bytes, 0o666, false).map_err(err)?;
    // Receive first: the other side's first writes must land here.
    let rx = c.asattach(theirs, false, false).map_err(err)?;
    let tx = c.asattach(mine, true, false).map_err(err)?;
    drop(c);
    let (out, peer): (Arc<dyn Mem>, Arc<dyn Mem>) = (
        Arc::new(Window(Raw { ptr: tx.as_ptr(), len: tx.len() })),
        Arc::new(Window(Raw { ptr: rx.as_ptr(), len: rx.len() })),
    );
    let probe = imc.clone();
    let alive: channel::Liveness = Box::new(move |who| {
        let (node, pid) = ((who >> 32) as u32, who as u32);
        if pid == 0 {
            return Ok(());
        }
        match probe.lock().unwrap_or_else(|e| e.into_inner()).kill(&node.to_string(), pid as i32, 0) {
            Ok(()) => Ok(()),
            Err(imc_client::ImcError::Refused { code, message })
                if code == imc_client::Status::NoHost || code == imc_client::Status::Errno =>
            {
                Err(format!("process {pid} on node {node}: {message}"))
            }
            Err(_) => Ok(()), // imcd busy or gone: do not guess
        }
    });
    let who = (st.node as u64) << 32 | std::process::id() as u64;
    let keep = McKeep { _tx: tx, _rx: rx, imc: imc.clone(), ids: [mine, theirs] };
    let ch = Channel::new(local, remote, Transport::Mc, size, out, peer, who, alive, Box::new(keep));
    install_resolver(st, &ch);
    Ok(ch)
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
    if local == remote {
        return Err(UmpError::Invalid(format!("both ends are handle {local:#x}")));
    }
    with(|st| {
        if st.chans.len() >= st.cfg.max_channels {
            return Err(UmpError::TooMany(st.chans.len()));
        }
        if st.chans.values().any(|e| e.ch.local == local && e.ch.remote == remote && !e.ch.is_closed()) {
            return Err(UmpError::Busy(format!("channel {local:#x}->{remote:#x} is open in this process")));
        }
        let _ = std::fs::write(marker(local), format!("{}\n", std::process::id()));
        let ch = match choose(st, local, remote, want) {
            Transport::Shm => open_shm(st, local, remote)?,
            Transport::Mc => open_mc(st, local, remote)?,
        };
        if ch.transport == Transport::Mc {
            notify_listener(st, local, remote)?;
        }
        // A listener on this guest learns of us through its folder, once our
        // half exists (the notice names the transport).
        if listen_dir(remote).is_dir() {
            let kind = if ch.transport == Transport::Shm { "shm" } else { "mc" };
            let tmp = listen_dir(remote).join(format!(".{local:016x}"));
            if std::fs::write(&tmp, kind).is_ok() {
                let _ = std::fs::rename(&tmp, listen_dir(remote).join(format!("{local:016x}")));
            }
        }
        let id = st.next;
        st.next += 1;
        st.chans.insert(id, Entry::new(ch, want));
        Ok(id)
    })
}

/// Lets a channel's reads follow multicast records into the senders'
/// outbufs, mapping each outbuf (for receive) the first time.
fn install_resolver(st: &State, ch: &Channel) {
    let (Some(imc), cache) = (st.imc.clone(), st.outbufs_in.clone()) else { return };
    ch.set_resolver(Arc::new(move |key, size| {
        let mut c = cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(o) = c.get(&key) {
            return Some(o.mem.clone());
        }
        let i = imc.lock().unwrap_or_else(|e| e.into_inner());
        // The outbuf exists (its record came after it); finding it by key
        // also holds it for us while we read from it.
        let (id, ..) = i.asalloc_flags(key, size, 0o666, false, true).ok()?;
        let rx = i.asattach(id, false, false).ok()?;
        let mem: Arc<dyn Mem> = Arc::new(Window(Raw { ptr: rx.as_ptr(), len: rx.len() }));
        c.insert(key, OutbufIn { mem: mem.clone(), _rx: rx, _id: id });
        Some(mem)
    }));
}

/// UMP_ANY, both sides first at once: one may have chosen MEMORY CHANNEL
/// before the other's marker appeared while the other chose shared memory.
/// Until a channel is complete, shared memory wins: a side on MEMORY
/// CHANNEL that sees the shared-memory channel appear moves there.
fn converge(st: &State, e: &mut Entry) {
    if e.want != Want::Any || e.ch.transport != Transport::Mc || e.ch.is_complete() {
        return;
    }
    let (lo, hi) = (e.ch.local.min(e.ch.remote), e.ch.local.max(e.ch.remote));
    if shm_path(lo, hi).exists() {
        if let Ok(ch) = open_shm(st, e.ch.local, e.ch.remote) {
            e.ch.close();
            e.ch = ch;
        }
    }
}

/// `ump_listen`: `local` accepts channels from handles it does not know:
/// `wait` reports each as [`Event::Open`] of a new channel. On this guest
/// through a folder in `/dev/shm`; from other guests (`want` Any or Mc,
/// with imcd) through an inbox in MEMORY CHANNEL space.
pub fn listen(local: u64, want: Want) -> Result<(), UmpError> {
    with(|st| {
        if want != Want::Mc {
            std::fs::create_dir_all(listen_dir(local)).map_err(|e| UmpError::Os(e.to_string()))?;
            let _ = std::fs::write(marker(local), format!("{}\n", std::process::id()));
        }
        if want != Want::Shm {
            match st.imc.clone() {
                Some(imc) => {
                    let i = imc.lock().unwrap_or_else(|e| e.into_inner());
                    let (inbox, _) = map_inbox(&i, local, true)?.expect("created");
                    st.inboxes.insert(local, inbox);
                }
                None if want == Want::Mc => {
                    return Err(UmpError::NoTransport("listening over MEMORY CHANNEL needs imcd".into()))
                }
                None => {}
            }
        }
        st.listening.entry(local).or_default();
        Ok(())
    })
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

fn busy_nb(id: i32, write: bool) -> Result<(), UmpError> {
    with(|st| {
        let e = st.chans.get_mut(&id).ok_or(UmpError::NoChannel(id))?;
        let nb = if write { &mut e.nbwrite } else { &mut e.nbread };
        if nb.as_ref().is_some_and(|n| !n.done.load(Ordering::Acquire)) {
            return Err(UmpError::Busy(format!(
                "a non-blocking {} on channel {id} is still running",
                if write { "write" } else { "read" }
            )));
        }
        *nb = None;
        Ok(())
    })
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

/// `ump_nbwrite`: starts writing a message and returns; a background thread
/// finishes it ([`Event::WriteDone`]). The message is copied first, so the
/// caller's buffer is free at once.
pub fn nbwrite(id: i32, msg: &[u8]) -> Result<(), UmpError> {
    busy_nb(id, true)?;
    let msg = msg.to_vec();
    let done = Arc::new(AtomicBool::new(false));
    let result = Arc::new(Mutex::new(None));
    with(|st| {
        let e = st.chans.get_mut(&id).ok_or(UmpError::NoChannel(id))?;
        let w = e.writer.get_or_insert_with(|| Writer::start(e.ch.clone()));
        w.jobs.send((msg, done.clone(), result.clone())).map_err(|_| UmpError::Channel(ChanError::ClosedHere))?;
        e.nbwrite = Some(Nb { done, result, thread: None, reported: false });
        Ok(())
    })
}

/// A buffer a background read fills (C callers keep it alive until done).
#[derive(Clone, Copy)]
struct UserBuf(*mut u8, usize);
// SAFETY: the caller of `nbread` promises the buffer outlives the read
// (ump.h says so); only the background thread writes it meanwhile.
unsafe impl Send for UserBuf {}

/// `ump_nbread`: starts reading the next message into `buf` and returns
/// once `min` bytes of it (or all of it) are in; a background thread reads
/// the rest ([`Event::ReadDone`], then [`nbread_result`]).
///
/// # Safety
/// `buf` must stay valid, and untouched by the caller, until the read is done.
pub unsafe fn nbread(id: i32, buf: *mut u8, size: usize, min: usize) -> Result<usize, UmpError> {
    busy_nb(id, false)?;
    let ch = channel(id)?;
    let progress = ch.rx.lock().unwrap_or_else(|e| e.into_inner()).progress();
    progress.store(0, Ordering::Release);
    let done = Arc::new(AtomicBool::new(false));
    let result = Arc::new(Mutex::new(None));
    let (d, r, b) = (done.clone(), result.clone(), UserBuf(buf, size));
    let chr = ch.clone();
    let thread = std::thread::spawn(move || {
        let b = b;
        // SAFETY: the caller's promise (see above).
        let slice = unsafe { std::slice::from_raw_parts_mut(b.0, b.1) };
        let out = chr.read(slice, None);
        *r.lock().unwrap_or_else(|e| e.into_inner()) = Some(out);
        d.store(true, Ordering::Release);
    });
    with(|st| {
        let e = st.chans.get_mut(&id).ok_or(UmpError::NoChannel(id))?;
        e.nbread = Some(Nb { done: done.clone(), result, thread: Some(thread), reported: false });
        Ok(())
    })?;
    let mut spins = 0u32;
    loop {
        let got = progress.load(Ordering::Acquire);
        if done.load(Ordering::Acquire) || got >= min {
            return Ok(got);
        }
        spins += 1;
        if spins < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

/// The outcome of a channel's last non-blocking read or write (`None`
/// while it runs): the message length.
fn nb_result(id: i32, write: bool) -> Result<Option<usize>, UmpError> {
    with(|st| {
        let e = st.chans.get_mut(&id).ok_or(UmpError::NoChannel(id))?;
        let (nb, what) = if write { (&mut e.nbwrite, "write") } else { (&mut e.nbread, "read") };
        let Some(nb) = nb else { return Err(UmpError::Invalid(format!("no {what} on channel {id}"))) };
        if !nb.done.load(Ordering::Acquire) {
            return Ok(None);
        }
        if let Some(t) = nb.thread.take() {
            let _ = t.join();
        }
        let r = nb.result.lock().unwrap_or_else(|e| e.into_inner()).clone();
        r.transpose().map_err(UmpError::Channel)
    })
}

/// The outcome of the last non-blocking read (`None` while it runs).
pub fn nbread_result(id: i32) -> Result<Option<usize>, UmpError> {
    nb_result(id, false)
}

/// The outcome of the last non-blocking write (`None` while it runs).
pub fn nbwrite_result(id: i32) -> Result<Option<()>, UmpError> {
    Ok(nb_result(id, true)?.map(|_| ()))
}

/// The bytes of test message `seq` of `len` bytes (every byte depends on
/// both), as `ump-tool` sends and checks them.
pub fn pattern(seq: u64, len: usize) -> Vec<u8> {
    let mut x = seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ len as u64 | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// One look at a channel for `wait`: the one-time events (open, done,
/// closed) when `edges`, else whether a message waits. `wait` looks for
/// one-time events on every channel first, so a channel with messages
/// always waiting cannot hide the others' events.
fn look(id: i32, e: &mut Entry, edges: bool) -> Option<Event> {
    if !edges {
        let reading = e.nbread.as_ref().is_some_and(|n| !n.done.load(Ordering::Acquire));
        return (e.reported_open && !reading && e.ch.pending().is_some()).then_some(Event::Message(id));
    }
    if !e.reported_open {
        if e.ch.poll_open() {
            e.reported_open = true;
            return Some(Event::Open(id));
        }
        return None;
    }
    if let Some(nb) = &mut e.nbwrite {
        if nb.done.load(Ordering::Acquire) && !nb.reported {
            nb.reported = true;
            return Some(Event::WriteDone(id));
        }
    }
    if let Some(nb) = &mut e.nbread {
        if nb.done.load(Ordering::Acquire) && !nb.reported {
            nb.reported = true;
            return Some(Event::ReadDone(id));
        }
    }
    // Closed only once everything sent before the close was read.
    if !e.reported_closed && e.ch.peer_closed() && e.ch.pending().is_none() {
        e.reported_closed = true;
        return Some(Event::Closed(id));
    }
    None
}

/// New channels of listening handles (opened from our side too).
fn accept(st: &mut State) -> Vec<i32> {
    let mut new = Vec::new();
    // From other guests: handles in our inboxes.
    let mut found = Vec::new();
    for (&h, inbox) in &st.inboxes {
        for w in 0..64 * INBOX_PER_NODE {
            let peer = inbox.rx.load(w * 8);
            if peer != 0 {
                found.push((h, w, peer));
            }
        }
    }
    for (h, w, peer) in found {
        let fresh = !st.listening.get(&h).is_some_and(|s| s.contains(&peer));
        if fresh {
            match open_mc(st, h, peer) {
                Ok(ch) => {
                    st.listening.entry(h).or_default().insert(peer);
                    let id = st.next;
                    st.next += 1;
                    st.chans.insert(id, Entry::new(ch, Want::Mc));
                    new.push(id);
                }
                Err(_) => continue, // the word stays: the next wait tries again
            }
        }
        if let Some(inbox) = st.inboxes.get(&h) {
            inbox.tx.store(w * 8, 0);
        }
    }
    let handles: Vec<u64> = st.listening.keys().copied().collect();
    for h in handles {
        let Ok(dir) = std::fs::read_dir(listen_dir(h)) else { continue };
        for f in dir.flatten() {
            let Some(peer) = f.file_name().to_str().and_then(|s| u64::from_str_radix(s, 16).ok()) else { continue };
            let kind = std::fs::read_to_string(f.path()).unwrap_or_default();
            if st.listening.get(&h).is_some_and(|s| s.contains(&peer)) {
                let _ = std::fs::remove_file(f.path());
                continue;
            }
            // A notice stays until its channel could be opened (next wait retries).
            let ch = if kind == "mc" { open_mc(st, h, peer) } else { open_shm(st, h, peer) };
            if let Ok(ch) = ch {
                let _ = std::fs::remove_file(f.path());
                st.listening.entry(h).or_default().insert(peer);
                let id = st.next;
                st.next += 1;
                st.chans.insert(id, Entry::new(ch, Want::Any));
                new.push(id);
            }
        }
    }
    new
}

/// `ump_wait`: waits up to `timeout` (None: for ever) for an event on
/// channel `id`, or on any channel of this process (`id` None).
pub fn wait(id: Option<i32>, timeout: Option<Duration>) -> Result<Option<Event>, UmpError> {
    let deadline = timeout.map(|t| Instant::now() + t);
    let mut spins = 0u32;
    loop {
        let ev = with(|st| {
            if id.is_none() {
                accept(st);
            }
            let mut ids: Vec<i32> = match id {
                Some(i) if !st.chans.contains_key(&i) => return Err(UmpError::NoChannel(i)),
                Some(i) => vec![i],
                None => st.chans.keys().copied().collect(),
            };
            ids.sort_unstable();
            for &i in &ids {
                if let Some(mut e) = st.chans.remove(&i) {
                    converge(st, &mut e);
                    st.chans.insert(i, e);
                }
            }
            // One-time events first, then messages, starting after the
            // channel that had the last message (round robin).
            let start = ids.iter().position(|&i| i > st.last_message).unwrap_or(0);
            ids.rotate_left(start);
            for edges in [true, false] {
                for &i in &ids {
                    if let Some(ev) = st.chans.get_mut(&i).and_then(|e| look(i, e, edges)) {
                        if let Event::Message(m) = ev {
                            st.last_message = m;
                        }
                        return Ok(Some(ev));
                    }
                }
            }
            Ok(None)
        })?;
        if ev.is_some() {
            return Ok(ev);
        }
        if deadline.is_some_and(|d| Instant::now() > d) {
            return Ok(None);
        }
        spins += 1;
        if spins < 64 {
            std::hint::spin_loop();
        } else if spins < 4096 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// The outbuf's key: one per process (node and pid), in UMP's outbuf
/// namespace (`imc_proto::keys`).
fn outbuf_key(node: u32, pid: u32) -> u64 {
    Namespace::UmpOutbuf.key((node as u64) << 32 | pid as u64)
}

fn outbuf(st: &mut State) -> Result<Arc<Mutex<Outbuf>>, UmpError> {
    if let Some(o) = &st.outbuf {
        return Ok(o.clone());
    }
    let imc = st.imc.clone().ok_or_else(|| UmpError::NoTransport("MEMORY CHANNEL needs imcd".into()))?;
    let size = st.cfg.outbuf as u64;
    let key = outbuf_key(st.node, std::process::id());
    let i = imc.lock().unwrap_or_else(|e| e.into_inner());
    let err = |e: imc_client::ImcError| UmpError::NoTransport(format!("imcd: outbuf: {e}"));
    let (id, ..) = i.asalloc_flags(key, size, 0o666, false, true).map_err(err)?;
    let tx = i.asattach(id, true, false).map_err(err)?;
    let o = Outbuf {
        key,
        size,
        tx: Window(Raw { ptr: tx.as_ptr(), len: tx.len() }),
        _attached: tx,
        head: 0,
        pending: Vec::new(),
    };
    let o = Arc::new(Mutex::new(o));
    st.outbuf = Some(o.clone());
    Ok(o)
}

/// `ump_mcast`: writes one message to every channel in `ids`. Over
/// MEMORY CHANNEL the message is written once, into this process's outbuf
/// (received by every node), and each channel gets a 32-byte record
/// pointing at it; shared-memory channels (and messages larger than half
/// the outbuf) get an ordinary write. Order with the channel's other
/// messages is kept: the record sits in the channel's own ring.
pub fn mcast(ids: &[i32], msg: &[u8]) -> Result<(), UmpError> {
    let chans: Vec<Arc<Channel>> = ids.iter().map(|&i| channel(i)).collect::<Result<_, _>>()?;
    let mut seen = HashSet::new();
    if let Some(dup) = ids.iter().find(|i| !seen.insert(**i)) {
        return Err(UmpError::Invalid(format!("channel {dup} twice in the multicast list")));
    }
    let (mc, local): (Vec<_>, Vec<_>) = chans.into_iter().partition(|c| c.transport == Transport::Mc);
    for c in &local {
        c.write(msg, None)?;
    }
    if mc.is_empty() {
        return Ok(());
    }
    let ob = with(|st| if msg.len() as u64 <= st.cfg.outbuf as u64 / 2 { outbuf(st).map(Some) } else { Ok(None) })?;
    let Some(ob) = ob else {
        for c in &mc {
            c.write(msg, None)?;
        }
        return Ok(());
    };
    let mut o = ob.lock().unwrap_or_else(|e| e.into_inner());
    let padded = msg.len().div_ceil(8) as u64 * 8;
    let mut start = o.head;
    if start % o.size + padded > o.size {
        start = start.div_ceil(o.size) * o.size; // never wrap a message
    }
    let end = start + padded.max(8);
    // Room: the oldest message a reader may still copy must not be overwritten.
    let mut spins = 0u32;
    loop {
        o.reclaim();
        if end - o.oldest() <= o.size {
            break;
        }
        spins += 1;
        if spins % 4096 == 0 {
            // A reader that died never consumes its record: drop it.
            o.pending.retain(|(c, ..)| c.alive().is_ok());
        }
        if spins < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
    let pos = (start % o.size) as usize;
    let whole = msg.len() / 8 * 8;
    o.tx.write(pos, &msg[..whole]);
    if whole < msg.len() {
        let mut last = [0u8; 8];
        last[..msg.len() - whole].copy_from_slice(&msg[whole..]);
        o.tx.write(pos + whole, &last);
    }
    o.head = end;
    let (key, size) = (o.key, o.size);
    for c in mc {
        let after = c.write_record(msg.len(), key, start, size, None)?;
        o.pending.push((c, after, start));
    }
    Ok(())
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
    /// Bytes written by blocking writes.
    pub bytes_written: u64,
    /// Bytes read by blocking reads.
    pub bytes_read: u64,
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
            bytes_written: st.stats.0,
            bytes_read: st.stats.1,
        })
    })
}

/// The transport a channel ended up on.
pub fn transport(id: i32) -> Result<Transport, UmpError> {
    Ok(channel(id)?.transport)
}
