//! `imcd`: the guest daemon that plays the Tru64 kernel subsystem of
//! TruCluster MEMORY CHANNEL Software (seed 000). It owns the adapter,
//! keeps the clusterwide region directory in MEMORY CHANNEL page 0, and
//! answers `libimc` (`mc_guest::imc`) over `/run/imcd.sock`.
//!
//! Regions so far: `asalloc` (find or create a region by key, clusterwide)
//! and `asattach` (transmit: the process gets the VFIO device fd and maps
//! its pages of the transmit window itself; receive: the process gets the
//! region's receive buffer, which the adapter DMAs into).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use mc_guest::imc::{self, Reply, Request, IMCD_SOCKET, MAX_LINE};
use mc_guest::regions::{Access, Cred, RegionDesc, RegionError, Regions};
use mc_guest::regs::{pct, reg, BAR_TX, PAGE_SIZE};
use mc_guest::{Adapter, AdapterBus, RxBuffer, RX_IOVA_BASE};

/// MEMORY CHANNEL page holding the region directory.
const DIR_PAGE: u64 = 0;
/// First page handed out to regions (pages below are for imcd's own use).
const DATA_FIRST: u64 = 16;
/// Directory lock slots: one per possible node.
const LOCK_SLOTS: usize = 64;
/// Directory entries (regions in the cluster).
const ENTRIES: usize = 32;
/// How often imcd checks the directory for regions freed elsewhere.
const SYNC_EVERY_MS: libc::c_int = 20;

fn iova(page: u64) -> u64 {
    RX_IOVA_BASE + page * PAGE_SIZE
}

fn peer_cred(s: &UnixStream) -> Cred {
    let mut c = libc::ucred { pid: 0, uid: u32::MAX, gid: u32::MAX };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED fills one ucred.
    unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut c as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    Cred { uid: c.uid, gid: c.gid }
}

fn refusal(e: &RegionError) -> Reply {
    let code = match e {
        RegionError::Exists(_) => "EXISTS",
        RegionError::Permission(_) => "PERMISSION",
        RegionError::SizeMismatch { .. } => "SIZE",
        RegionError::NoSpace { .. } => "NOSPACE",
        RegionError::TableFull(_) => "TABLEFULL",
        RegionError::NotFound(_) => "NOTFOUND",
        RegionError::Empty => "INVALID",
        RegionError::Lock(_) | RegionError::Toggle(_) => "CLUSTER",
    };
    Reply::Error { code: code.into(), message: e.to_string() }
}

/// Key bit that puts spinlock sets in the region directory beside regions.
const LOCK_KEY: u64 = 1 << 63;
/// Slots per lock: one per possible node.
const LOCK_SLOTS_PER_LOCK: u64 = 64;
/// imcd's own bid values (processes use pid << 32, below this).
const IMCD_BID_BASE: u64 = 1 << 62;

struct Daemon<'a> {
    dir: Regions<AdapterBus<'a>>,
    io: Io<'a>,
}

/// Everything but the directory: the adapter and this node's buffers.
struct Io<'a> {
    a: &'a Adapter,
    node: u32,
    /// Receive buffers of regions attached for receive on this node, with
    /// their file and first page.
    rx: HashMap<u32, (RxBuffer, PathBuf, u64)>,
    tx_offset: u64,
    next_bid: u64,
}

impl Io<'_> {
    /// Receive buffer for `r`, mapped for DMA and enabled in the PCT.
    fn receive(&mut self, r: &RegionDesc) -> Result<&(RxBuffer, PathBuf, u64)> {
        if !self.rx.contains_key(&r.id) {
            let path = PathBuf::from(format!("/dev/shm/imc-region-{}", r.id));
            let buf = RxBuffer::create(&path, r.pages)?;
            buf.clear();
            buf.map_for_dma_at(&self.a.dev, iova(r.first_page))?;
            for p in r.first_page..r.first_page + r.pages {
                let (bits, _) = self.a.page(p);
                self.a.set_page(p, bits | pct::RX, iova(p));
            }
            self.rx.insert(r.id, (buf, path, r.first_page));
        }
        Ok(&self.rx[&r.id])
    }

    /// Stops receiving region `id` here: receive and transmit off on its
    /// pages, then the buffer (and its DMA map) goes.
    fn forget(&mut self, id: u32) {
        let Some((buf, path, base)) = self.rx.remove(&id) else { return };
        let pages = buf.len() as u64 / PAGE_SIZE;
        for p in base..base + pages {
            let (bits, iova) = self.a.page(p);
            self.a.set_page(p, bits & !(pct::RX | pct::TX | pct::LOOPBACK), iova);
        }
        let _ = self.a.dev.unmap_dma(iova(base), pages * PAGE_SIZE);
        drop(buf);
        let _ = std::fs::remove_file(path);
    }

    /// Enables transmit (and loopback) on the pages of `r`.
    fn transmit(&self, r: &RegionDesc, loopback: bool) {
        for p in r.first_page..r.first_page + r.pages {
            let (bits, iova) = self.a.page(p);
            let lb = if loopback { pct::LOOPBACK } else { 0 };
            self.a.set_page(p, bits | pct::TX | lb, iova);
        }
    }

    /// IMC_CREATOR: places a bid for our node in lock 0 of the new set `r`
    /// and waits for it to come back, all while the directory lock is held:
    /// nobody can see the set without seeing lock 0 taken.
    fn place_creator_bid(&mut self, r: &RegionDesc) -> Result<u64> {
        self.receive(r)?;
        self.transmit(r, true);
        self.next_bid += 1;
        let bid = IMCD_BID_BASE | self.next_bid;
        let slot = self.node as u64 * 8;
        self.a.store64(r.first_page * PAGE_SIZE + slot, bid);
        let t0 = std::time::Instant::now();
        while self.rx[&r.id].0.read64(slot as usize) != bid {
            anyhow::ensure!(t0.elapsed() < Duration::from_secs(10), "our bid did not come back: link down?");
            std::hint::spin_loop();
        }
        Ok(bid)
    }
}

impl Daemon<'_> {
    /// Stops receiving regions that were freed (by any node) or whose entry
    /// now describes another region.
    fn sync(&mut self) {
        let live = self.dir.list();
        let stale: Vec<u32> = self
            .io
            .rx
            .iter()
            .filter(|(id, (buf, _, first))| {
                !live.iter().any(|r| r.id == **id && r.first_page == *first && r.pages * PAGE_SIZE == buf.len() as u64)
            })
            .map(|(id, _)| *id)
            .collect();
        for id in stale {
            self.io.forget(id);
        }
    }

    fn region(&self, id: u32) -> Result<RegionDesc, RegionError> {
        self.dir.list().into_iter().find(|r| r.id == id).ok_or(RegionError::NotFound(id as u64))
    }

    fn handle(&mut self, req: Request, cred: Cred) -> (Reply, Option<std::fs::File>) {
        match req {
            Request::Asalloc { key, size, mode, exclusive } => {
                let pages = size.div_ceil(PAGE_SIZE);
                let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
                match self.dir.alloc(key, pages, mode, cred, now, exclusive) {
                    Ok((r, created)) => {
                        (Reply::Region { id: r.id, first_page: r.first_page, pages: r.pages, created }, None)
                    }
                    Err(e) => (refusal(&e), None),
                }
            }
            Request::Lkalloc { key, nlocks, mode, creator } => {
                if nlocks == 0 || nlocks > 1024 {
                    return (
                        Reply::Error { code: "INVALID".into(), message: format!("{nlocks} locks: 1 to 1024 per set") },
                        None,
                    );
                }
                let pages = (nlocks as u64 * LOCK_SLOTS_PER_LOCK * 8).div_ceil(PAGE_SIZE);
                let mut placed = 0;
                let io = &mut self.io;
                let r = self.dir.alloc_with(key | LOCK_KEY, pages, mode, cred, 0, creator, |r| {
                    if creator {
                        placed = io.place_creator_bid(r).map_err(|_| RegionError::NotFound(r.key))?;
                    }
                    Ok(())
                });
                match r {
                    Ok((r, created)) => {
                        (Reply::LockSet { id: r.id, nlocks, node: self.io.node, created, placed_bid: placed }, None)
                    }
                    Err(RegionError::Exists(_)) => (refusal(&RegionError::Exists(key)), None),
                    Err(e) => (refusal(&e), None),
                }
            }
            Request::Dealloc { id } => match self.dir.dealloc(id, cred) {
                Ok(()) => {
                    self.io.forget(id);
                    (Reply::Done, None)
                }
                Err(e) => (refusal(&e), None),
            },
            Request::Regs => {
                let fd = self.io.a.dev.device_fd().try_clone_to_owned().map(std::fs::File::from).ok();
                match self.io.a.dev.region(mc_guest::regs::BAR_REGS) {
                    Ok(r) => (Reply::Mapping { offset: r.offset, len: r.size }, fd),
                    Err(e) => (Reply::Error { code: "NODEV".into(), message: e.to_string() }, None),
                }
            }
            Request::Asattach { id, transmit, loopback } => {
                let r = match self.region(id) {
                    Ok(r) => r,
                    Err(e) => return (refusal(&e), None),
                };
                let want = if transmit { Access::Write } else { Access::Read };
                if !r.allows(cred, want) {
                    return (refusal(&RegionError::Permission(r.key)), None);
                }
                let len = r.pages * PAGE_SIZE;
                if transmit {
                    if loopback {
                        // Our own writes come back: they need somewhere to land here.
                        if let Err(e) = self.io.receive(&r) {
                            return (Reply::Error { code: "NOMEM".into(), message: format!("{e:#}") }, None);
                        }
                    }
                    self.io.transmit(&r, loopback);
                    let fd = self.io.a.dev.device_fd().try_clone_to_owned().map(std::fs::File::from).ok();
                    (Reply::Mapping { offset: self.io.tx_offset + r.first_page * PAGE_SIZE, len }, fd)
                } else {
                    match self.io.receive(&r).and_then(|(_, path, _)| Ok(std::fs::File::open(path)?)) {
                        Ok(f) => (Reply::Mapping { offset: 0, len }, Some(f)),
                        Err(e) => (Reply::Error { code: "NOMEM".into(), message: format!("{e:#}") }, None),
                    }
                }
            }
        }
    }
}

/// Reads one request line (None: the client left).
fn read_line(s: &mut UnixStream) -> std::io::Result<Option<Vec<u8>>> {
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    loop {
        match s.read(&mut b)? {
            0 if line.is_empty() => return Ok(None),
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            _ if b[0] == b'\n' => return Ok(Some(line)),
            _ if line.len() >= MAX_LINE => {
                return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "request too long"))
            }
            _ => line.push(b[0]),
        }
    }
}

fn run() -> Result<()> {
    let a = Adapter::open()?;
    let node = a.node().context("the adapter has not joined a hub")? as usize;
    let meta = RxBuffer::create(Path::new("/dev/shm/imcd-directory"), 1)?;
    meta.clear();
    meta.map_for_dma_at(&a.dev, iova(DIR_PAGE))?;
    a.set_page(DIR_PAGE, pct::TX | pct::RX | pct::LOOPBACK, iova(DIR_PAGE));
    let bus = AdapterBus { adapter: &a, buf: &meta, page: DIR_PAGE, node, slots: (PAGE_SIZE / 8) as usize };
    let dir = Regions::new(bus, LOCK_SLOTS, ENTRIES, DATA_FIRST..a.pages(), Duration::from_secs(10))?;
    let tx_offset = a.dev.region(BAR_TX)?.offset;
    let mut d = Daemon { dir, io: Io { a: &a, node: node as u32, rx: HashMap::new(), tx_offset, next_bid: 0 } };

    let _ = std::fs::remove_file(IMCD_SOCKET);
    let listener = UnixListener::bind(IMCD_SOCKET).with_context(|| format!("cannot listen on {IMCD_SOCKET}"))?;
    std::fs::set_permissions(IMCD_SOCKET, std::fs::Permissions::from_mode(0o666))?;
    eprintln!("imcd: node {node}, {} pages, listening on {IMCD_SOCKET}", a.pages());
    let _ = a.reg(reg::ERR_STATUS);
    let mut clients: Vec<UnixStream> = Vec::new();
    loop {
        let mut fds: Vec<libc::pollfd> = std::iter::once(listener.as_raw_fd())
            .chain(clients.iter().map(|c| c.as_raw_fd()))
            .map(|fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 })
            .collect();
        // SAFETY: a valid array of pollfds.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, SYNC_EVERY_MS) };
        d.sync();
        if ready <= 0 {
            continue;
        }
        if fds[0].revents & libc::POLLIN != 0 {
            if let Ok((s, _)) = listener.accept() {
                clients.push(s);
            }
        }
        let mut gone = Vec::new();
        for (i, pfd) in fds.iter().enumerate().skip(1) {
            if pfd.revents == 0 {
                continue;
            }
            let c = &mut clients[i - 1];
            let reply = match read_line(c) {
                Ok(None) | Err(_) => {
                    gone.push(i - 1);
                    continue;
                }
                Ok(Some(line)) => match serde_json::from_slice::<Request>(&line) {
                    Ok(req) => d.handle(req, peer_cred(c)),
                    Err(e) => (Reply::Error { code: "INVALID".into(), message: format!("bad request: {e}") }, None),
                },
            };
            let mut out = serde_json::to_vec(&reply.0)?;
            out.push(b'\n');
            if imc::send_with_fd(c, &out, reply.1.as_ref().map(|f| f.as_raw_fd())).is_err() {
                gone.push(i - 1);
            }
            let _ = c.flush();
        }
        for i in gone.into_iter().rev() {
            clients.remove(i);
        }
    }
}

fn main() {
    if let Err(e) = run() {
        eprintln!("imcd: {e:#}");
        std::process::exit(1);
    }
}
