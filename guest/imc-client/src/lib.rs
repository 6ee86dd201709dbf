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
//! - [`cluster_lock`]: cluster spinlocks from the total order and loopback
//!   (the algorithm `imc_lkacquire` runs in the caller's process, and imcd's
//!   region directory is built on).
#![warn(missing_docs)]

pub mod cluster_lock;

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;

use thiserror::Error;

use regs::PAGE_SIZE;

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
    /// `imcd` answered something unexpected.
    #[error("unexpected answer from imcd: {0}")]
    Protocol(String),
}

/// Room for one control message carrying one fd.
fn one_fd_space() -> usize {
    // SAFETY: CMSG_SPACE is a pure computation.
    unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) as usize }
}

/// A msghdr over one iovec and a control buffer; both must outlive its use.
fn msghdr(iov: &mut libc::iovec, control: &mut [u8]) -> libc::msghdr {
    // SAFETY: msghdr is plain data; all-zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = control.len();
    msg
}

/// Sends `line` with an optional fd attached to its first byte.
pub fn send_with_fd(sock: &UnixStream, line: &[u8], fd: Option<RawFd>) -> std::io::Result<()> {
    let Some(fd) = fd else {
        return (&*sock).write_all(line);
    };
    let mut iov = libc::iovec { iov_base: line.as_ptr() as *mut libc::c_void, iov_len: line.len() };
    let mut cbuf = vec![0u8; one_fd_space()];
    let msg = msghdr(&mut iov, &mut cbuf);
    // SAFETY: the control buffer has room for one cmsg with one fd (CMSG_SPACE).
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), fd);
    }
    // SAFETY: a valid msghdr on a connected socket.
    let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, 0) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if (n as usize) < line.len() {
        (&*sock).write_all(&line[n as usize..])?;
    }
    Ok(())
}

/// Receives one line, with the fd that came with it (if any).
fn recv_line_with_fd(sock: &UnixStream) -> std::io::Result<(String, Option<OwnedFd>)> {
    let mut first = [0u8; 1];
    let mut iov = libc::iovec { iov_base: first.as_mut_ptr().cast(), iov_len: 1 };
    let mut cbuf = vec![0u8; one_fd_space()];
    let mut msg = msghdr(&mut iov, &mut cbuf);
    // SAFETY: a valid msghdr; the kernel fills at most `space` control bytes.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if n == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    let mut fd = None;
    // SAFETY: walking the control messages the kernel wrote.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        if !c.is_null() && (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
            fd = Some(OwnedFd::from_raw_fd(std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<RawFd>())));
        }
    }
    // The rest of the line, a byte at a time: a buffered reader could take
    // bytes (and the fd) of the next message.
    let mut line = vec![first[0]];
    let mut b = [0u8; 1];
    while line.last() != Some(&b'\n') {
        if line.len() > MAX_LINE {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "reply line too long"));
        }
        match (&*sock).read(&mut b)? {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            _ => line.push(b[0]),
        }
    }
    String::from_utf8(line).map(|l| (l, fd)).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// A connection to `imcd`.
pub struct Imc {
    sock: UnixStream,
}

/// A mapped region: transmit (stores go to the cluster) or receive (loads
/// see what the cluster wrote).
pub struct Attached {
    ptr: *mut u8,
    len: usize,
}

impl Attached {
    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing is mapped.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// 8-byte store at `off` (transmit mappings).
    pub fn store64(&self, off: usize, v: u64) {
        assert!(off % 8 == 0 && off + 8 <= self.len, "store at {off} outside {} bytes", self.len);
        // SAFETY: in bounds and aligned (asserted); the mapping lives as long as self.
        unsafe { std::ptr::write_volatile(self.ptr.add(off).cast::<u64>(), v) }
    }

    /// 4-byte store at `off` (transmit mappings).
    pub fn store32(&self, off: usize, v: u32) {
        assert!(off % 4 == 0 && off + 4 <= self.len, "store at {off} outside {} bytes", self.len);
        // SAFETY: in bounds and aligned (asserted); the mapping lives as long as self.
        unsafe { std::ptr::write_volatile(self.ptr.add(off).cast::<u32>(), v) }
    }

    /// 4-byte load at `off` (receive mappings).
    pub fn load32(&self, off: usize) -> u32 {
        assert!(off % 4 == 0 && off + 4 <= self.len, "load at {off} outside {} bytes", self.len);
        // SAFETY: as in `store32`.
        unsafe { std::ptr::read_volatile(self.ptr.add(off).cast::<u32>()) }
    }

    /// 8-byte load at `off` (receive mappings).
    pub fn load64(&self, off: usize) -> u64 {
        assert!(off % 8 == 0 && off + 8 <= self.len, "load at {off} outside {} bytes", self.len);
        // SAFETY: as in `store64`.
        unsafe { std::ptr::read_volatile(self.ptr.add(off).cast::<u64>()) }
    }
}

// SAFETY: an Attached owns its mapping (unmapped once, on drop) and only
// does volatile loads and stores through it; moving it to another thread is
// like moving a file descriptor.
unsafe impl Send for Attached {}
// SAFETY: every method takes &self and does one volatile access in bounds;
// there is no interior state to race on.
unsafe impl Sync for Attached {}

impl Attached {
    /// The mapping's address (for C callers, who use it directly).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        // SAFETY: ptr/len come from the mmap in `Imc::asattach`.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
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
        Ok(Imc { sock })
    }

    fn call(&self, req: &Request) -> Result<(Reply, Option<OwnedFd>), ImcError> {
        (&self.sock).write_all(&encode_line(req))?;
        let (text, fd) = recv_line_with_fd(&self.sock)?;
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
        let reply = self.call(&Request::Asattach { id, transmit, loopback })?;
        let m = self.map_reply(reply, if transmit { libc::PROT_WRITE } else { libc::PROT_READ })?;
        debug_assert!(m.len as u64 % PAGE_SIZE == 0);
        Ok(m)
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
        self.set.tx.store64((self.lock as usize * LOCK_SLOTS + slot) * 8, v)
    }
    fn load(&self, slot: usize) -> u64 {
        self.set.rx.load64((self.lock as usize * LOCK_SLOTS + slot) * 8)
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
    tx: Attached,
    rx: Attached,
    /// Per lock: the local file whose flock orders this node's processes.
    local: Vec<std::fs::File>,
    /// Next bid base (pid << 32, 2^16 bids per acquire).
    bids: std::cell::Cell<u64>,
    /// Lock 0 is held through the bid imcd placed at creation.
    placed: std::cell::Cell<u64>,
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
    /// clusterwide.
    pub fn acquire(&self, lock: u32, timeout: std::time::Duration) -> Result<(), ImcError> {
        self.check(lock)?;
        self.flock(lock, libc::LOCK_EX)?;
        let base = self.bids.get();
        self.bids.set(base + (1 << 16));
        let cl = crate::cluster_lock::ClusterLock::with_bid_base(LockBus { set: self, lock }, base);
        if let Err(e) = cl.acquire(timeout) {
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

/// The error counts, read from user space with no call to imcd after the
/// first (seed 000, "Error Management"):
/// - `rderrcnt` loads imcd's copy of the clusterwide count (every node's
///   imcd publishes its adapter's count in MEMORY CHANNEL space on each
///   error interrupt; the copy is the sum over the members, so not
///   guaranteed current);
/// - `ckerrcnt` asks every node, through the ACK page, for errors its imcd
///   has not counted yet, and adds them.
pub struct Regs {
    map: Attached,
    count: Option<Attached>,
    /// ACK page: transmit mapping, answers (read-write), the node's lock.
    ack: Option<(Attached, Attached, std::fs::File)>,
}

impl Regs {
    fn reg(&self, off: usize) -> u32 {
        assert!(off % 4 == 0 && off + 4 <= self.map.len);
        // SAFETY: in bounds and aligned; a read-only mapping of BAR 0.
        unsafe { std::ptr::read_volatile(self.map.ptr.add(off).cast::<u32>()) }
    }

    /// `imc_rderrcnt`: the error count as imcd last saw it (one load), or
    /// the register when imcd keeps no copy.
    pub fn rderrcnt(&self) -> u32 {
        match &self.count {
            Some(c) => c.load64(0) as u32,
            None => self.hw_errcnt(),
        }
    }

    /// The adapter's error count register (a device read).
    pub fn hw_errcnt(&self) -> u32 {
        self.reg(regs::reg::ERR_COUNT as usize)
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
    /// member that does not answer within a second counts too).
    fn outstanding(&self) -> u32 {
        let me = self.reg(regs::reg::NODE as usize) & 0xFFFF;
        let mine = (self.reg(regs::reg::ERR_STATUS as usize) != 0) as u32;
        let Some((tx, rx, lock)) = &self.ack else { return mine };
        // SAFETY: flock(2) on a file we hold open.
        unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) };
        let byte = |n: usize| {
            // SAFETY: n < 64 <= the mapping's length; imcd's answers file.
            unsafe { std::ptr::read_volatile(rx.ptr.add(n)) }
        };
        for n in 0..64 {
            // SAFETY: as above; the answers file is mapped writable.
            unsafe { std::ptr::write_volatile(rx.ptr.add(n), 0) };
        }
        tx.store64(0, 1);
        let members: Vec<usize> = self.members().into_iter().map(usize::from).filter(|&n| n as u32 != me).collect();
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

    /// The nodes the hub counts as up (whether or not they run imcd).
    pub fn members(&self) -> Vec<u16> {
        let m =
            (self.reg(regs::reg::MEMBERS_HI as usize) as u64) << 32 | self.reg(regs::reg::MEMBERS_LO as usize) as u64;
        (0..64).filter(|i| m & (1 << i) != 0).collect()
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
        let tx = self.asattach(id, true, true)?;
        let rx = self.asattach(id, false, false)?;
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

    /// Maps the fd of a [`Reply::Mapping`] (`prot`: PROT_READ or PROT_WRITE).
    fn map_reply(&self, reply: (Reply, Option<OwnedFd>), prot: libc::c_int) -> Result<Attached, ImcError> {
        let Reply::Mapping { offset, len } = reply.0 else { return Err(ImcError::Protocol(format!("{:?}", reply.0))) };
        let fd = reply.1.ok_or_else(|| ImcError::Protocol("imcd sent no fd with the mapping".into()))?;
        // SAFETY: a shared mapping of the fd imcd gave us, at the offset it named; checked below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len as usize,
                prot,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                offset as libc::off_t,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(ImcError::Io(std::io::Error::last_os_error()));
        }
        Ok(Attached { ptr: ptr.cast(), len: len as usize })
    }

    /// The adapter's registers, read-only, and imcd's copy of the error count.
    pub fn regs(&self) -> Result<Regs, ImcError> {
        let map = self.map_reply(self.call(&Request::Regs)?, libc::PROT_READ)?;
        let count = self.call(&Request::ErrCount).and_then(|r| self.map_reply(r, libc::PROT_READ)).ok();
        let ack = (|| -> Result<_, ImcError> {
            let tx = self.map_reply(self.call(&Request::AckPage { transmit: true })?, libc::PROT_WRITE)?;
            let rx =
                self.map_reply(self.call(&Request::AckPage { transmit: false })?, libc::PROT_READ | libc::PROT_WRITE)?;
            let lock = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(ACK_LOCK)
                .map_err(ImcError::Io)?;
            Ok((tx, rx, lock))
        })()
        .ok();
        Ok(Regs { map, count, ack })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_carry_fds() {
        let (a, b) = UnixStream::pair().unwrap();
        let f = std::fs::File::open("/dev/null").unwrap();
        send_with_fd(&a, b"{\"x\":1}\n", Some(f.as_raw_fd())).unwrap();
        send_with_fd(&a, b"{\"y\":2}\n", None).unwrap();
        let (l1, fd1) = recv_line_with_fd(&b).unwrap();
        assert_eq!(l1, "{\"x\":1}\n");
        assert!(fd1.is_some());
        let (l2, fd2) = recv_line_with_fd(&b).unwrap();
        assert_eq!(l2, "{\"y\":2}\n");
        assert!(fd2.is_none());
    }
}
