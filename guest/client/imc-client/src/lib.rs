//! The TruCluster MEMORY CHANNEL API as a client of `imcd` (seed 000,
//! Table 1): regions, spinlock sets, error counts, hosts and cluster
//! signals. The C library (`libimc`, `imc.h`) is a thin layer over this.
//!
//! Set-up goes through `imcd` over a Unix socket (the paper's kmodcall);
//! data transfer never does: `imcd` hands the process the adapter's VFIO
//! device fd (for the transmit window) or the region's receive buffer, and
//! the process maps them and uses plain stores and loads.
//!
//! Wire: one JSON object per line each way; a reply that carries an fd
//! sends it with SCM_RIGHTS on the reply's first byte.
//!
//! - [`fdpass`]: lines with an fd attached (SCM_RIGHTS), both sides.
//! - [`cluster_lock`]: cluster spinlocks from the total order and loopback
//!   (the algorithm `imc_lkacquire` runs in the caller's process, and imcd's
//!   region directory is built on).
//! - [`dma`]: transmit DMA from the process (an extension, not in Table 1).
//! - [`backoff`]: how every message-passing layer's waits give the CPU
//!   away (spins, yields, lengthening naps).
#![warn(missing_docs)]

pub mod backoff;
pub mod cluster_lock;
pub mod dma;
pub mod fdpass;

pub use fdpass::send_with_fd;
pub use guest_mem;

use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;

use thiserror::Error;

use guest_driver::view::AdapterView;
use guest_mem::{Access, Mapping, MemError, ReadOnly, ReadWrite};

/// What the fd of a [`Reply::Mapping`] is.
enum Source {
    /// The adapter's VFIO device fd (registers, transmit window).
    Device,
    /// A file (receive buffer, error count, ACK answers).
    File,
}

pub use imc_proto::{
    decode_reply, decode_request, encode_line, keys, layout, Reply, Request, Status, ACK_FILE, ERRCOUNT_FILE,
    IMCD_SOCKET, MAX_LINE,
};

/// Errors of the client library.
#[derive(Debug, Error)]
pub enum ImcError {
    /// `imcd` is not reachable.
    #[error("cannot reach imcd at {0} (is it running?): {1}")]
    NoDaemon(String, std::io::Error),
    /// `imcd` refused the request.
    #[error("{code}: {message}")]
    Refused {
        /// Status.
        code: Status,
        /// Detail.
        message: String,
    },
    /// Talking to `imcd` failed.
    #[error("imcd connection: {0}")]
    Io(#[from] std::io::Error),
    /// Mapping what `imcd` sent failed.
    #[error("mapping what imcd sent: {0}")]
    Map(#[from] MemError),
    /// `imcd` did not answer within the call timeout (this connection is
    /// no longer usable: connect again).
    #[error("imcd did not answer in time (connect again)")]
    Timeout,
    /// `imcd` answered something unexpected.
    #[error("unexpected answer from imcd: {0}")]
    Protocol(String),
}

fn recv_line_with_fd(sock: &UnixStream) -> std::io::Result<(String, Option<OwnedFd>)> {
    fdpass::recv_line_with_fd(sock, MAX_LINE)
}

/// A connection to `imcd`.
pub struct Imc {
    sock: UnixStream,
    /// Set when a call gave up waiting: its answer may still come, so the
    /// connection can no longer pair requests with answers.
    broken: std::cell::Cell<bool>,
}

/// How long a call waits for imcd's answer by default. imcd's own waits
/// (a coherent allocation asking every node, a repair) are bounded well
/// below this; [`Imc::set_call_timeout`] changes it.
pub const CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// A mapped region as `imc_asattach` returns it: transmit (stores go to
/// the cluster) or receive (loads see what the cluster wrote). Rust callers
/// that know which they want use [`Imc::asattach_tx`] / [`Imc::asattach_rx`].
#[derive(Debug)]
pub enum Attached {
    /// A transmit mapping (the adapter's window for the region's pages).
    Transmit(Mapping<ReadWrite>),
    /// A receive mapping (the region's receive buffer), read-only.
    Receive(Mapping<ReadOnly>),
}

impl Attached {
    /// Bytes mapped.
    pub fn len(&self) -> usize {
        match self {
            Attached::Transmit(m) => m.len(),
            Attached::Receive(m) => m.len(),
        }
    }

    /// True when nothing is mapped (never: empty mappings are refused).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The mapping's address (for C callers, who use it directly).
    pub fn as_ptr(&self) -> *mut u8 {
        match self {
            Attached::Transmit(m) => m.as_ptr(),
            Attached::Receive(m) => m.as_ptr(),
        }
    }
}

impl Imc {
    /// Connects to `imcd` at [`IMCD_SOCKET`] (or `$IMCD_SOCKET` when set).
    pub fn connect() -> Result<Imc, ImcError> {
        match std::env::var_os("IMCD_SOCKET") {
            Some(p) => Self::connect_to(Path::new(&p)),
            None => Self::connect_to(Path::new(IMCD_SOCKET)),
        }
    }

    /// Connects to `imcd` at `path`.
    pub fn connect_to(path: &Path) -> Result<Imc, ImcError> {
        let sock = UnixStream::connect(path).map_err(|e| ImcError::NoDaemon(path.display().to_string(), e))?;
        sock.set_read_timeout(Some(CALL_TIMEOUT))?;
        sock.set_write_timeout(Some(CALL_TIMEOUT))?;
        Ok(Imc { sock, broken: std::cell::Cell::new(false) })
    }

    /// How long each call waits for imcd's answer (default [`CALL_TIMEOUT`]).
    /// A call that gives up fails with [`ImcError::Timeout`], and so does
    /// every later call on this connection: connect again.
    pub fn set_call_timeout(&self, limit: std::time::Duration) -> Result<(), ImcError> {
        self.sock.set_read_timeout(Some(limit))?;
        self.sock.set_write_timeout(Some(limit))?;
        Ok(())
    }

    /// False once imcd has gone away (its end of the connection closed):
    /// the mappings it handed out no longer belong to a living directory,
    /// and the adapter stays busy for a new imcd until they are dropped.
    /// Does not wait and does not consume anything.
    pub fn daemon_alive(&self) -> bool {
        use nix::sys::socket::{recv, MsgFlags};
        use std::os::fd::AsRawFd;
        let mut b = [0u8; 1];
        match recv(self.sock.as_raw_fd(), &mut b, MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT) {
            Ok(0) => false,
            Ok(_) => true,
            Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => true,
            Err(_) => false,
        }
    }

    fn call(&self, req: &Request) -> Result<(Reply, Option<OwnedFd>), ImcError> {
        if self.broken.get() {
            return Err(ImcError::Timeout);
        }
        let timed_out = |e: std::io::Error| {
            if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) {
                self.broken.set(true);
                ImcError::Timeout
            } else {
                ImcError::Io(e)
            }
        };
        (&self.sock).write_all(&encode_line(req)).map_err(timed_out)?;
        let (text, fd) = recv_line_with_fd(&self.sock).map_err(timed_out)?;
        let text = text.trim_end_matches('\n');
        match decode_reply(text.as_bytes()).map_err(|e| ImcError::Protocol(format!("{e}: {text}")))? {
            Reply::Error { code, message } => Err(ImcError::Refused { code, message }),
            r => Ok((r, fd)),
        }
    }

    /// `imc_asalloc`: the region `key` of `size` bytes, created if needed.
    /// Returns (id, first page, pages, created).
    pub fn asalloc(&self, key: u64, size: u64, mode: u32, exclusive: bool) -> Result<(u32, u64, u64, bool), ImcError> {
        self.asalloc_flags(key, size, mode, exclusive, false)
    }

    /// `imc_asalloc` with `coherent` (IMC_COHERENT): when it returns, every
    /// node of the cluster receives the region, so a process that attaches
    /// for receive later, anywhere, sees every write made since.
    pub fn asalloc_flags(
        &self,
        key: u64,
        size: u64,
        mode: u32,
        exclusive: bool,
        coherent: bool,
    ) -> Result<(u32, u64, u64, bool), ImcError> {
        match self.call(&Request::Asalloc { key, size, mode, exclusive, coherent })?.0 {
            Reply::Region { id, first_page, pages, created } => Ok((id, first_page, pages, created)),
            other => Err(ImcError::Protocol(format!("{other:?}"))),
        }
    }

    /// `imc_asattach`: maps region `id` for transmit or receive.
    pub fn asattach(&self, id: u32, transmit: bool, loopback: bool) -> Result<Attached, ImcError> {
        Ok(if transmit {
            Attached::Transmit(self.asattach_tx(id, loopback)?)
        } else {
            Attached::Receive(self.asattach_rx(id)?)
        })
    }

    /// `imc_asattach` for transmit: the adapter's window for region `id`
    /// (with `loopback`, our own writes come back to this node too).
    pub fn asattach_tx(&self, id: u32, loopback: bool) -> Result<Mapping<ReadWrite>, ImcError> {
        let reply = self.call(&Request::Asattach { id, transmit: true, loopback, p2p: None })?;
        self.map_reply(reply, Source::Device)
    }

    /// Extension: `imc_asattach` for transmit, point-to-point: stores to
    /// region `id` reach node `dest` only (the page control table's P2P
    /// bit). This process becomes the region's only sender on this node;
    /// imcd refuses (`PERMISSION`) a second process, and for a Direct
    /// Deposit key any node or destination but the key's own.
    pub fn asattach_tx_p2p(&self, id: u32, dest: u32) -> Result<Mapping<ReadWrite>, ImcError> {
        let reply = self.call(&Request::Asattach { id, transmit: true, loopback: false, p2p: Some(dest) })?;
        self.map_reply(reply, Source::Device)
    }

    /// `imc_asattach` for receive: region `id`'s receive buffer, read-only.
    pub fn asattach_rx(&self, id: u32) -> Result<Mapping<ReadOnly>, ImcError> {
        let reply = self.call(&Request::Asattach { id, transmit: false, loopback: false, p2p: None })?;
        self.map_reply(reply, Source::File)
    }
}

/// The slots of one lock of a set, as an [`OrderedBus`](crate::cluster_lock::OrderedBus):
/// stores through this process's transmit mapping (with loopback), loads
/// from its receive mapping.
struct LockBus<'a> {
    set: &'a LockSet,
    lock: u32,
}

/// Slots per lock (one per possible node), as imcd lays lock sets out.
const LOCK_SLOTS: usize = 64;

impl crate::cluster_lock::OrderedBus for LockBus<'_> {
    fn node(&self) -> usize {
        self.set.node as usize
    }
    fn slots(&self) -> usize {
        LOCK_SLOTS
    }
    fn store(&self, slot: usize, v: u64) {
        // In bounds: imcd sized the region for the set's locks, and `lock`
        // and `slot` were checked against them.
        let off = (self.lock as usize * LOCK_SLOTS + slot) * 8;
        self.set.tx.store::<u64>(off, v).unwrap_or_else(|e| panic!("lock slot: {e}"))
    }
    fn load(&self, slot: usize) -> u64 {
        let off = (self.lock as usize * LOCK_SLOTS + slot) * 8;
        self.set.rx.load::<u64>(off).unwrap_or_else(|e| panic!("lock slot: {e}"))
    }
}

/// A spinlock set (`imc_lkalloc`): clusterwide locks, usable by several
/// processes on each node.
pub struct LockSet {
    /// Region holding the slots.
    pub id: u32,
    /// Locks in the set.
    pub nlocks: u32,
    node: u32,
    tx: Mapping<ReadWrite>,
    rx: Mapping<ReadOnly>,
    /// Per lock: the local file whose flock orders this node's processes.
    local: Vec<std::fs::File>,
    /// Next bid base (pid << 32, 2^16 bids per acquire).
    bids: std::cell::Cell<u64>,
    /// Lock 0 is held through the bid imcd placed at creation.
    placed: std::cell::Cell<u64>,
}

/// Takes an exclusive flock on `f` within `timeout`: true once held,
/// false if another holder kept it that long.
fn flock_within(f: &std::fs::File, timeout: std::time::Duration) -> Result<bool, ImcError> {
    let t0 = std::time::Instant::now();
    let mut pause = std::time::Duration::from_micros(50);
    loop {
        // SAFETY: flock(2) on a file we hold open.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(true);
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) && e.kind() != std::io::ErrorKind::Interrupted {
            return Err(ImcError::Io(e));
        }
        if t0.elapsed() >= timeout {
            return Ok(false);
        }
        std::thread::sleep(pause.min(timeout.saturating_sub(t0.elapsed())));
        pause = (pause * 2).min(std::time::Duration::from_millis(2));
    }
}

impl LockSet {
    fn flock(&self, lock: u32, op: libc::c_int) -> Result<(), ImcError> {
        // SAFETY: flock(2) on a file we hold open.
        if unsafe { libc::flock(self.local[lock as usize].as_raw_fd(), op) } != 0 {
            return Err(ImcError::Io(std::io::Error::last_os_error()));
        }
        Ok(())
    }

    fn check(&self, lock: u32) -> Result<(), ImcError> {
        if lock >= self.nlocks {
            return Err(ImcError::Refused {
                code: Status::Invalid,
                message: format!("lock {lock} of a set of {}", self.nlocks),
            });
        }
        Ok(())
    }

    /// `imc_lkacquire` (waiting): first among this node's processes, then
    /// clusterwide, both within `timeout`.
    pub fn acquire(&self, lock: u32, timeout: std::time::Duration) -> Result<(), ImcError> {
        self.check(lock)?;
        let t0 = std::time::Instant::now();
        if !flock_within(&self.local[lock as usize], timeout)? {
            return Err(ImcError::Refused {
                code: Status::Timeout,
                message: format!("lock {lock}: another process of this node held it for {timeout:?}"),
            });
        }
        let base = self.bids.get();
        self.bids.set(base + (1 << 16));
        let cl = crate::cluster_lock::ClusterLock::with_bid_base(LockBus { set: self, lock }, base);
        if let Err(e) = cl.acquire(timeout.saturating_sub(t0.elapsed())) {
            let _ = self.flock(lock, libc::LOCK_UN);
            return Err(ImcError::Refused { code: Status::Timeout, message: e.to_string() });
        }
        Ok(())
    }

    /// `imc_lkrelease`.
    pub fn release(&self, lock: u32) -> Result<(), ImcError> {
        self.check(lock)?;
        use crate::cluster_lock::OrderedBus;
        let bus = LockBus { set: self, lock };
        bus.store(bus.node(), 0);
        if lock == 0 && self.placed.get() != 0 {
            self.placed.set(0);
        }
        self.flock(lock, libc::LOCK_UN)
    }
}

/// Serializes `imc_ckerrcnt` among the processes of a node (one ACK page).
const ACK_LOCK: &str = "/run/imc-ack.lock";

/// Longest wait for [`ACK_LOCK`] (a holder keeps it for at most about a
/// second: the wait for the members' answers).
const ACK_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// The error counts, read from user space with no call to imcd after the
/// first (seed 000, "Error Management"):
/// - `rderrcnt` loads imcd's copy of the clusterwide count (every node's
///   imcd publishes its adapter's count in MEMORY CHANNEL space on each
///   error interrupt; the copy is the sum over the members, so not
///   guaranteed current);
/// - `ckerrcnt` asks every node, through the ACK page, for errors its imcd
///   has not counted yet, and adds them.
pub struct Regs {
    /// The adapter's identity and counters (the driver reads them).
    view: AdapterView,
    count: Option<Mapping<ReadOnly>>,
    /// ACK page: transmit mapping, answers (read-write), the node's lock.
    ack: Option<(Mapping<ReadWrite>, Mapping<ReadWrite>, std::fs::File)>,
}

impl Regs {
    /// `imc_rderrcnt`: the error count as imcd last saw it (one load), or
    /// the register when imcd keeps no copy.
    pub fn rderrcnt(&self) -> u32 {
        match self.count.as_ref().and_then(|c| c.load::<u64>(imc_proto::ERRCOUNT_SUM).ok()) {
            Some(c) => c as u32,
            None => self.hw_errcnt(),
        }
    }

    /// The adapter's identity and counters, as the driver reads them.
    pub fn view(&self) -> &AdapterView {
        &self.view
    }

    /// The adapter's error count register (a device read).
    pub fn hw_errcnt(&self) -> u32 {
        self.view.err_count()
    }

    /// The adapter's count of link and membership changes it saw,
    /// LINK_EVENTS (a device read): it moves when another node leaves or
    /// joins, as one whose link went down does.
    pub fn link_events(&self) -> u32 {
        self.view.link_events()
    }

    /// `imc_ckerrcnt`: true when errors happened anywhere in the cluster
    /// since `*errors` was read, which becomes the count now (imcd's count
    /// plus the errors nodes report as not yet counted).
    pub fn ckerrcnt(&self, errors: &mut u32) -> bool {
        let outstanding = self.outstanding();
        let now = self.rderrcnt().wrapping_add(outstanding);
        let moved = now != *errors || outstanding > 0;
        *errors = now;
        moved
    }

    /// Nodes with errors their imcd has not counted yet: this node's error
    /// bits, and every other member's answer to a store on the ACK page (a
    /// member that does not answer within a second counts too). When
    /// another process of this node keeps the ACK page longer than
    /// [`ACK_LOCK_WAIT`], the others cannot be asked: that counts as one
    /// (errors may be outstanding; the caller checks again).
    fn outstanding(&self) -> u32 {
        let me = self.view.node().map(usize::from);
        let mine = (self.view.err_status() != 0) as u32;
        let Some((tx, rx, lock)) = &self.ack else { return mine };
        if !matches!(flock_within(lock, ACK_LOCK_WAIT), Ok(true)) {
            return mine + 1;
        }
        // n < 64, inside the one-page answers file (checked when mapped).
        let byte = |n: usize| rx.load::<u8>(n).unwrap_or(0);
        let _ = rx.fill(0, 64, 0);
        let _ = tx.store::<u64>(0, 1);
        let members: Vec<usize> = self.members().into_iter().map(usize::from).filter(|&n| Some(n) != me).collect();
        let t0 = std::time::Instant::now();
        while !members.iter().all(|&n| byte(n) & regs::ACK_VALID != 0)
            && t0.elapsed() < std::time::Duration::from_secs(1)
        {
            std::hint::spin_loop();
        }
        let others = members.iter().filter(|&&n| byte(n) != regs::ACK_VALID).count() as u32;
        // SAFETY: as above.
        unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_UN) };
        mine + others
    }

    /// The adapter's error status bits (`regs::err`; a device read).
    pub fn err_status(&self) -> u32 {
        self.view.err_status()
    }

    /// This node's id (None while the adapter has none).
    pub fn node(&self) -> Option<u16> {
        self.view.node()
    }

    /// The nodes the hub counts as up (whether or not they run imcd).
    pub fn members(&self) -> Vec<u16> {
        self.view.members()
    }
}

impl Imc {
    /// `imc_lkalloc`: the spinlock set `key`; with `creator`, created
    /// exclusively (`IMC_EXISTS` otherwise) and returned with lock 0 held.
    pub fn lkalloc(&self, key: u64, nlocks: u32, mode: u32, creator: bool) -> Result<(LockSet, bool), ImcError> {
        let (id, node, created, placed_bid) = match self.call(&Request::Lkalloc { key, nlocks, mode, creator })?.0 {
            Reply::LockSet { id, node, created, placed_bid, .. } => (id, node, created, placed_bid),
            other => return Err(ImcError::Protocol(format!("{other:?}"))),
        };
        let tx = self.asattach_tx(id, true)?;
        let rx = self.asattach_rx(id)?;
        if rx.len() < nlocks as usize * LOCK_SLOTS * 8 || tx.len() < rx.len() {
            return Err(ImcError::Protocol(format!(
                "lock set {id} of {} bytes holds fewer than {nlocks} locks",
                rx.len()
            )));
        }
        let local = (0..nlocks)
            .map(|i| {
                std::fs::OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(format!("/run/imc-lock-{id}-{i}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let set = LockSet {
            id,
            nlocks,
            node,
            tx,
            rx,
            local,
            bids: std::cell::Cell::new((std::process::id() as u64) << 32),
            placed: std::cell::Cell::new(placed_bid),
        };
        if placed_bid != 0 {
            // We hold lock 0 clusterwide; hold it on this node too.
            set.flock(0, libc::LOCK_EX)?;
        }
        Ok((set, created))
    }

    /// `imc_asdetach`: unmaps this process's attachment (the region stays).
    pub fn asdetach(&self, a: Attached) {
        drop(a);
    }

    /// `imc_asdealloc`: frees region `id` clusterwide (its creator or root).
    /// Every node stops receiving it.
    pub fn asdealloc(&self, id: u32) -> Result<(), ImcError> {
        match self.call(&Request::Dealloc { id })?.0 {
            Reply::Done => Ok(()),
            other => Err(ImcError::Protocol(format!("{other:?}"))),
        }
    }

    /// `imc_lkdealloc`: frees a spinlock set.
    pub fn lkdealloc(&self, set: LockSet) -> Result<(), ImcError> {
        let id = set.id;
        drop(set);
        self.asdealloc(id)
    }

    /// Whether region `key` exists: its (id, pages), without allocating it.
    pub fn find(&self, key: u64) -> Result<Option<(u32, u64)>, ImcError> {
        match self.call(&Request::Find { key }) {
            Ok((Reply::Region { id, pages, .. }, _)) => Ok(Some((id, pages))),
            Ok((other, _)) => Err(ImcError::Protocol(format!("{other:?}"))),
            Err(ImcError::Refused { code: Status::NotFound, .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `imc_gethosts`: (node, host name) of every node running imcd.
    pub fn gethosts(&self) -> Result<Vec<(u32, String)>, ImcError> {
        match self.call(&Request::Hosts)?.0 {
            Reply::Hosts { hosts } => Ok(hosts),
            other => Err(ImcError::Protocol(format!("{other:?}"))),
        }
    }

    /// `imc_kill`: sends `sig` to process `pid` on `host` (host name or
    /// node number) through the command relay; the remote imcd checks that
    /// our uid may signal it.
    pub fn kill(&self, host: &str, pid: i32, sig: i32) -> Result<(), ImcError> {
        match self.call(&Request::Kill { host: host.into(), pid, sig })?.0 {
            Reply::Done => Ok(()),
            other => Err(ImcError::Protocol(format!("{other:?}"))),
        }
    }

    /// Failure drill: asks imcd (started with `--test-hooks`) to die
    /// mid-update of entry `id`. Never answered on success.
    pub fn abandon_update(&self, id: u32) -> Result<(), ImcError> {
        self.call(&Request::AbandonUpdate { id }).map(|_| ())
    }

    /// Maps the fd of a [`Reply::Mapping`]: a region of the device fd, or a file.
    fn map_reply<A: Access>(&self, reply: (Reply, Option<OwnedFd>), src: Source) -> Result<Mapping<A>, ImcError> {
        let Reply::Mapping { offset, len } = reply.0 else { return Err(ImcError::Protocol(format!("{:?}", reply.0))) };
        let fd = reply.1.ok_or_else(|| ImcError::Protocol("imcd sent no fd with the mapping".into()))?;
        let len = usize::try_from(len).map_err(|_| ImcError::Protocol(format!("a mapping of {len} bytes")))?;
        Ok(match src {
            Source::Device => Mapping::device_region(fd, offset, len)?,
            Source::File => Mapping::from_fd_populated(fd, offset, len)?,
        })
    }

    /// Extension (not in Table 1): sets up transmit DMA for this process
    /// with a source area of `size` bytes (once per connection). The set-up
    /// goes through imcd; transfers ([`dma::DmaPort::start`]) do not.
    pub fn dma_open(&self, size: u64) -> Result<dma::DmaPort, ImcError> {
        let (reply, fd) = self.call(&Request::DmaOpen { size })?;
        let Reply::DmaArea { iova, len, ring_entries } = reply else {
            return Err(ImcError::Protocol(format!("{reply:?}")));
        };
        let fd = fd.ok_or_else(|| ImcError::Protocol("imcd sent no fd with the DMA area".into()))?;
        let len = usize::try_from(len).map_err(|_| ImcError::Protocol(format!("a DMA area of {len} bytes")))?;
        let area = Mapping::<ReadWrite>::from_fd_populated(fd, 0, len)?;
        let ring = self.map_reply(self.call(&Request::DmaRing)?, Source::File)?;
        let regs = self.map_reply(self.call(&Request::Regs)?, Source::Device)?;
        Ok(dma::DmaPort::new(area, iova, ring, ring_entries, regs)?)
    }

    /// Extension: an eventfd that becomes readable when a store arrives
    /// on region `id` on this node ([`Request::Watch`]): a process sleeps
    /// in `poll` on it instead of polling the region. Read it (8 bytes) to
    /// re-arm it. Refused unless this process holds the region and may
    /// read it; it lasts while this connection does, or until the region
    /// is let go.
    pub fn watch(&self, id: u32) -> Result<OwnedFd, ImcError> {
        let (reply, fd) = self.call(&Request::Watch { id })?;
        let Reply::Watching { .. } = reply else {
            return Err(ImcError::Protocol(format!("{reply:?}")));
        };
        fd.ok_or_else(|| ImcError::Protocol("imcd sent no eventfd with the watch".into()))
    }

    /// Extension: region `id` as a transmit DMA destination. imcd refuses
    /// (`NOTALLOC`) unless this process attached it for transmit.
    pub fn dma_target(&self, id: u32) -> Result<dma::DmaTarget, ImcError> {
        match self.call(&Request::DmaTarget { id })?.0 {
            Reply::DmaTarget { id, first_page, pages } => Ok(dma::DmaTarget::new(id, first_page, pages)),
            other => Err(ImcError::Protocol(format!("{other:?}"))),
        }
    }

    /// Extension: region `id` (allocated by this process) lands at byte
    /// `offset` of this process's DMA source area from now on: what other
    /// nodes write to the region is written there, and no buffer of its own
    /// receives it on this node. imcd undoes it when the process lets go of
    /// the region or leaves.
    pub fn dma_land(&self, id: u32, offset: u64) -> Result<(), ImcError> {
        match self.call(&Request::DmaLand { id, offset })?.0 {
            Reply::Done => Ok(()),
            other => Err(ImcError::Protocol(format!("{other:?}"))),
        }
    }

    /// The adapter's registers, read-only, and imcd's copy of the error count.
    pub fn regs(&self) -> Result<Regs, ImcError> {
        let map = self.map_reply(self.call(&Request::Regs)?, Source::Device)?;
        let count = self.call(&Request::ErrCount).and_then(|r| self.map_reply(r, Source::File)).ok();
        let ack = (|| -> Result<_, ImcError> {
            let tx = self.map_reply(self.call(&Request::AckPage { transmit: true })?, Source::Device)?;
            let rx = self.map_reply(self.call(&Request::AckPage { transmit: false })?, Source::File)?;
            let lock = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(ACK_LOCK)
                .map_err(ImcError::Io)?;
            Ok((tx, rx, lock))
        })()
        .ok();
        Ok(Regs { view: AdapterView::new(map), count, ack })
    }
}

/// How many times this node left the cluster since the running imcd
/// started (an outage past the grace: every attachment of the processes
/// here was revoked, `docs/faults.md`), as imcd publishes it; 0 without
/// imcd. A process that serves others over MEMORY CHANNEL (mpid) sets up
/// again when it moves. Holds no file of imcd's open.
pub fn departures() -> u64 {
    use std::os::unix::fs::FileExt;
    let mut b = [0u8; 8];
    std::fs::File::open(imc_proto::ERRCOUNT_FILE)
        .and_then(|f| f.read_exact_at(&mut b, imc_proto::ERRCOUNT_LEFT as u64))
        .map_or(0, |()| u64::from_le_bytes(b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    /// A stand-in for imcd that answers `Regs` with a file of `len` bytes
    /// (as the device region), `ErrCount` and `Asattach` for receive with
    /// a one-page file, and refuses the rest.
    fn fake_imcd(dir: &Path, regs_len: u64) -> std::path::PathBuf {
        let sock = dir.join("imcd.sock");
        let listener = UnixListener::bind(&sock).unwrap();
        let regs = dir.join("regs");
        let mut f = std::fs::File::create(&regs).unwrap();
        let mut bytes = vec![0u8; regs_len as usize];
        bytes[regs::reg::ERR_COUNT as usize..][..4].copy_from_slice(&7u32.to_le_bytes());
        f.write_all(&bytes).unwrap();
        let page = dir.join("page");
        std::fs::write(&page, 5u64.to_le_bytes().repeat(1024)).unwrap();
        std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            while let Ok((line, _)) = fdpass::recv_line_with_fd(&s, MAX_LINE) {
                let (reply, file) = match decode_request(line.trim_end().as_bytes()).unwrap() {
                    Request::Regs => (Reply::Mapping { offset: 0, len: regs_len }, Some(&regs)),
                    Request::ErrCount | Request::Asattach { transmit: false, .. } => {
                        (Reply::Mapping { offset: 0, len: 8192 }, Some(&page))
                    }
                    _ => (Reply::Error { code: Status::Invalid, message: "not here".into() }, None),
                };
                let f = file.map(|p| std::fs::File::open(p).unwrap());
                send_with_fd(&s, &encode_line(&reply), f.as_ref().map(|f| f.as_raw_fd())).unwrap();
            }
        });
        sock
    }

    #[test]
    fn registers_and_receive_buffers_map_whatever_their_size() {
        let d = tempfile::tempdir().unwrap();
        // BAR 0 is 4 KiB, half a MEMORY CHANNEL page.
        let imc = Imc::connect_to(&fake_imcd(d.path(), 4096)).unwrap();
        let r = imc.regs().unwrap();
        assert_eq!(r.hw_errcnt(), 7, "the register, through the device mapping");
        assert_eq!(r.rderrcnt(), 5, "imcd's copy, through the error-count file");
        let rx = imc.asattach_rx(3).unwrap();
        assert_eq!((rx.len(), rx.load::<u64>(8184).unwrap()), (8192, 5));
        assert!(matches!(imc.asattach_tx(3, false), Err(ImcError::Refused { code: Status::Invalid, .. })));
    }

    #[test]
    fn a_mapping_larger_than_the_file_is_an_error_not_a_crash() {
        let d = tempfile::tempdir().unwrap();
        let sock = fake_imcd(d.path(), 4096);
        let imc = Imc::connect_to(&sock).unwrap();
        // The fake says 8192 bytes for the receive buffer, but imcd's file
        // could be shorter: mapping it must fail, not fault on a later load.
        std::fs::write(d.path().join("page"), [0u8; 100]).unwrap();
        assert!(matches!(imc.asattach_rx(1), Err(ImcError::Map(_))));
    }

    #[test]
    fn ckerrcnt_waits_for_a_busy_ack_page_no_longer_than_its_limit() {
        let d = tempfile::tempdir().unwrap();
        let file = |name: &str| {
            let p = d.path().join(name);
            std::fs::write(&p, [0u8; 4096]).unwrap();
            std::fs::OpenOptions::new().read(true).write(true).open(p).unwrap()
        };
        let lock = file("ack.lock");
        let holder = std::fs::File::open(d.path().join("ack.lock")).unwrap();
        // Another process of the node asks the members and never lets go.
        assert!(flock_within(&holder, std::time::Duration::ZERO).unwrap());
        let r = Regs {
            view: AdapterView::new(Mapping::from_file(file("regs"), 0, 4096).unwrap()),
            count: None,
            ack: Some((
                Mapping::from_file(file("ack-tx"), 0, 4096).unwrap(),
                Mapping::from_file(file("ack-rx"), 0, 4096).unwrap(),
                lock,
            )),
        };
        let (done, finished) = std::sync::mpsc::channel();
        let t0 = std::time::Instant::now();
        std::thread::spawn(move || {
            let mut errors = 0;
            let _ = done.send(r.ckerrcnt(&mut errors));
        });
        let moved = finished
            .recv_timeout(ACK_LOCK_WAIT + std::time::Duration::from_secs(10))
            .expect("imc_ckerrcnt still waiting for the ACK page's lock");
        assert!(moved, "errors may be outstanding: the other nodes could not be asked");
        assert!(t0.elapsed() >= ACK_LOCK_WAIT, "{:?}", t0.elapsed());
        drop(holder);
    }

    #[test]
    fn local_lock_wait_has_a_deadline() {
        let dir = std::env::temp_dir().join(format!("imc-flock-{}", std::process::id()));
        std::fs::write(&dir, b"").unwrap();
        let holder = std::fs::File::open(&dir).unwrap();
        let waiter = std::fs::File::open(&dir).unwrap();
        assert!(flock_within(&holder, std::time::Duration::ZERO).unwrap(), "a free lock is taken at once");
        let t0 = std::time::Instant::now();
        assert!(!flock_within(&waiter, std::time::Duration::from_millis(200)).unwrap());
        let waited = t0.elapsed();
        assert!(
            waited >= std::time::Duration::from_millis(200) && waited < std::time::Duration::from_secs(5),
            "{waited:?}"
        );
        // SAFETY: flock(2) on a file we hold open.
        unsafe { libc::flock(holder.as_raw_fd(), libc::LOCK_UN) };
        assert!(flock_within(&waiter, std::time::Duration::from_millis(200)).unwrap(), "taken once released");
        let _ = std::fs::remove_file(&dir);
    }
}
