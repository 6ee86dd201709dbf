//! Test harness for driving `mc-adapter` in process the way QEMU does.
//!
//! - [`Hub`]: a real `mc-hub` on a Unix socket in a temporary directory,
//!   served by a tokio runtime the test owns, stopped on drop; its control
//!   requests (link down/up, corrupt, stats) are made with [`Hub::control`].
//! - [`AdapterHandle`]: a real [`Adapter`] on that hub, on the kind of port
//!   [`ports`] says: a local port (the hub serves the adapter's vfio-user
//!   socket itself) or a link port (an adapter joined by `attach_link`, or by
//!   `connect` so that it rejoins after a link loss, serving vfio-user on its
//!   own Unix socket from a background thread). `scripts/test.sh` runs the
//!   in-process suites once with each (`MC_TEST_PORTS=local|link`).
//! - [`VfioClient`]: a minimal vfio-user client ("fake QEMU"): VERSION,
//!   DMA_MAP with the guest RAM memfd passed by SCM_RIGHTS, REGION_READ,
//!   REGION_WRITE (posted or not), REGION_WRITE_MULTI, SET_IRQS with
//!   eventfds, and raw messages for malformed-input tests.
//! - [`GuestRam`]: guest memory in a real memfd, read back with `pread`.
//! - [`eventfd`] and [`wait_eventfd`]: interrupts as QEMU receives them.
#![allow(dead_code)]

use device::vfio_user::{dma_flags, flags, irq, region, Command};
use std::fs::File;
use std::io::{self, IoSlice, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use vfio_user_wire as wire;
use vm_memory::ByteValued;

use device::adapter::{Adapter, AdapterConfig};
use device::link_client as client;
use device::regs::{self, PAGE_SIZE};
use link::ANY_NODE;
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};

/// vfio-user header length.
pub const HDR: usize = wire::HDR_LEN;
/// Command numbers (the device's own enum).
pub const CMD_VERSION: u16 = Command::Version as u16;
pub const CMD_DMA_MAP: u16 = Command::DmaMap as u16;
pub const CMD_DEVICE_GET_REGION_INFO: u16 = Command::DeviceGetRegionInfo as u16;
pub const CMD_DEVICE_SET_IRQS: u16 = Command::DeviceSetIrqs as u16;
pub const CMD_REGION_READ: u16 = Command::RegionRead as u16;
pub const CMD_REGION_WRITE: u16 = Command::RegionWrite as u16;
pub const CMD_DEVICE_RESET: u16 = Command::DeviceReset as u16;
pub const CMD_REGION_WRITE_MULTI: u16 = Command::RegionWriteMulti as u16;
/// Header flag bits.
pub const F_REQUEST: u32 = flags::REQUEST;
pub const F_REPLY: u32 = flags::REPLY;
pub const F_TYPE_MASK: u32 = flags::TYPE_MASK;
pub const F_NO_REPLY: u32 = flags::NO_REPLY;
pub const F_ERROR: u32 = flags::ERROR;
/// `VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE`.
pub const DMA_RW: u32 = dma_flags::READ | dma_flags::WRITE;
/// `VFIO_PCI_*_IRQ_INDEX`.
pub const IRQ_INTX: u32 = irq::INTX;
pub const IRQ_MSIX: u32 = irq::MSIX;
/// `VFIO_IRQ_SET_*` flags.
pub const IRQ_DATA_NONE: u32 = irq::DATA_NONE;
pub const IRQ_DATA_EVENTFD: u32 = irq::DATA_EVENTFD;
pub const IRQ_ACTION_MASK: u32 = irq::ACTION_MASK;
pub const IRQ_ACTION_UNMASK: u32 = irq::ACTION_UNMASK;
pub const IRQ_ACTION_TRIGGER: u32 = irq::ACTION_TRIGGER;

/// How long any single blocking socket read in a test may take.
pub const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// How long tests poll for a delivery to show up.
pub const POLL_TIMEOUT: Duration = Duration::from_secs(5);

/// Encodes a vfio-user header (any field, malformed ones included).
pub fn header(id: u16, command: u16, size: u32, flags: u32, error: u32) -> [u8; HDR] {
    let mut h = [0u8; HDR];
    h.copy_from_slice(wire::Header { id, command, size, flags, error }.as_slice());
    h
}

/// A decoded reply.
#[derive(Debug, Clone)]
pub struct Reply {
    pub id: u16,
    pub command: u16,
    pub flags: u32,
    pub error: u32,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn is_error(&self) -> bool {
        self.flags & F_ERROR != 0
    }
}

/// The fixed part of a REGION_READ / REGION_WRITE body.
fn region_access(region: u32, offset: u64, count: u32) -> Vec<u8> {
    wire::RegionAccess { offset, region, count }.as_slice().to_vec()
}

/// A vfio-user client speaking to the adapter like QEMU's `vfio-user-pci`.
pub struct VfioClient {
    pub stream: UnixStream,
    next_id: u16,
}

impl VfioClient {
    /// Connects without negotiating (for malformed-input tests).
    pub fn connect_raw(path: &Path) -> VfioClient {
        let stream = UnixStream::connect(path).unwrap_or_else(|e| panic!("connect {}: {e}", path.display()));
        stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        stream.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
        VfioClient { stream, next_id: 1 }
    }

    /// Connects and negotiates the version, like QEMU does first.
    pub fn connect(path: &Path) -> VfioClient {
        let mut c = Self::connect_raw(path);
        c.version();
        c
    }

    fn id(&mut self) -> u16 {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        id
    }

    /// Encodes one request message (header + body) with a fresh id.
    pub fn encode(&mut self, command: u16, flags: u32, body: &[u8]) -> (u16, Vec<u8>) {
        let id = self.id();
        let h = wire::Header { id, command, size: (HDR + body.len()) as u32, flags, error: 0 };
        (id, wire::message(h, &[body]))
    }

    /// Sends raw bytes.
    pub fn send_bytes(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("send to adapter");
    }

    /// Sends a request; returns its id.
    pub fn send(&mut self, command: u16, flags: u32, body: &[u8]) -> u16 {
        let (id, m) = self.encode(command, flags, body);
        self.send_bytes(&m);
        id
    }

    /// Receives one reply message.
    pub fn recv(&mut self) -> io::Result<Reply> {
        let mut h = wire::Header::default();
        self.stream.read_exact(h.as_mut_slice())?;
        assert!(h.is_valid(), "reply size {} smaller than a header", h.size);
        let mut body = vec![0u8; h.size as usize - HDR];
        self.stream.read_exact(&mut body)?;
        Ok(Reply { id: h.id, command: h.command, flags: h.flags, error: h.error, body })
    }

    /// Receives the reply to request `id`/`command` and checks it is one.
    pub fn recv_reply(&mut self, id: u16, command: u16) -> Reply {
        let r = self.recv().expect("reply from adapter");
        assert_eq!(r.id, id, "reply id");
        assert_eq!(r.command, command, "reply command");
        assert_eq!(r.flags & F_TYPE_MASK, F_REPLY, "reply type");
        assert_eq!(r.flags & F_NO_REPLY, 0);
        r
    }

    /// Sends a request and waits for its reply (success or error).
    pub fn request(&mut self, command: u16, body: &[u8]) -> Reply {
        let id = self.send(command, F_REQUEST, body);
        self.recv_reply(id, command)
    }

    /// Sends a request that must succeed; returns the reply body.
    pub fn request_ok(&mut self, command: u16, body: &[u8]) -> Vec<u8> {
        let r = self.request(command, body);
        assert!(!r.is_error(), "command {command} failed with errno {}", r.error);
        assert_eq!(r.error, 0);
        r.body
    }

    /// VERSION: major 0, minor 0, JSON capabilities NUL-terminated.
    pub fn version(&mut self) -> serde_json::Value {
        let mut body = wire::Version { major: 0, minor: 0 }.as_slice().to_vec();
        body.extend_from_slice(br#"{"capabilities":{"max_msg_fds":8,"max_data_xfer_size":1048576}}"#);
        body.push(0);
        let r = self.request_ok(CMD_VERSION, &body);
        assert!(r.len() > 5, "VERSION reply too short: {r:?}");
        assert_eq!(wire::read::<wire::Version>(&r).map(|v| v.major), Some(0), "server major version");
        assert_eq!(*r.last().unwrap(), 0, "capabilities must be NUL-terminated");
        let json: serde_json::Value = serde_json::from_slice(&r[4..r.len() - 1]).expect("capabilities are JSON");
        let caps = &json["capabilities"];
        assert!(caps["max_msg_fds"].as_u64().unwrap() >= 1, "{json}");
        assert!(caps["max_data_xfer_size"].as_u64().unwrap() >= 8, "{json}");
        json
    }

    /// DMA_MAP with `fd` passed as SCM_RIGHTS; must succeed.
    pub fn dma_map(&mut self, iova: u64, size: u64, fd: &impl AsRawFd, offset: u64) {
        let r = self.try_dma_map(iova, size, fd, offset);
        assert!(!r.is_error(), "DMA_MAP iova {iova:#x} size {size:#x} failed with errno {}", r.error);
    }

    /// DMA_MAP, returning the reply whatever it is.
    pub fn try_dma_map(&mut self, iova: u64, size: u64, fd: &impl AsRawFd, offset: u64) -> Reply {
        let map = wire::DmaMap { argsz: 32, flags: DMA_RW, offset, addr: iova, size };
        let (id, m) = self.encode(CMD_DMA_MAP, F_REQUEST, map.as_slice());
        let fds = [fd.as_raw_fd()];
        let cmsg = [ControlMessage::ScmRights(&fds)];
        let n = sendmsg::<()>(self.stream.as_raw_fd(), &[IoSlice::new(&m)], &cmsg, MsgFlags::empty(), None)
            .expect("sendmsg DMA_MAP");
        if n < m.len() {
            self.send_bytes(&m[n..]);
        }
        self.recv_reply(id, CMD_DMA_MAP)
    }

    /// REGION_READ that may fail: Ok(data) or Err(errno).
    pub fn try_region_read(&mut self, region: u32, offset: u64, count: u32) -> Result<Vec<u8>, u32> {
        let r = self.request(CMD_REGION_READ, &region_access(region, offset, count));
        if r.is_error() {
            assert!(r.error != 0, "error reply without errno");
            return Err(r.error);
        }
        assert_eq!(r.body.len(), 16 + count as usize, "REGION_READ reply length");
        assert_eq!(&r.body[..16], &region_access(region, offset, count)[..], "REGION_READ reply echo");
        Ok(r.body[16..].to_vec())
    }

    /// REGION_READ that must succeed.
    pub fn region_read(&mut self, region: u32, offset: u64, count: u32) -> Vec<u8> {
        self.try_region_read(region, offset, count)
            .unwrap_or_else(|e| panic!("REGION_READ region {region} offset {offset:#x} count {count}: errno {e}"))
    }

    /// Encodes a REGION_WRITE body.
    pub fn region_write_body(region: u32, offset: u64, data: &[u8]) -> Vec<u8> {
        let mut b = region_access(region, offset, data.len() as u32);
        b.extend_from_slice(data);
        b
    }

    /// REGION_WRITE. `posted`: NO_REPLY set, no reply expected (as QEMU does for
    /// MMIO writes); otherwise the reply is checked for success.
    pub fn region_write(&mut self, region: u32, offset: u64, data: &[u8], posted: bool) {
        let body = Self::region_write_body(region, offset, data);
        if posted {
            self.send(CMD_REGION_WRITE, F_NO_REPLY, &body);
        } else {
            let r = self.request_ok(CMD_REGION_WRITE, &body);
            assert_eq!(&r[..], &body[..16], "REGION_WRITE reply echo");
        }
    }

    /// Many posted REGION_WRITEs sent with one `write` syscall, as a busy QEMU
    /// pipelines them: the server sees the next message already waiting.
    pub fn region_writes_posted_batch(&mut self, writes: &[(u32, u64, Vec<u8>)]) {
        let mut all = Vec::new();
        for (region, offset, data) in writes {
            let (_, m) = self.encode(CMD_REGION_WRITE, F_NO_REPLY, &Self::region_write_body(*region, *offset, data));
            all.extend_from_slice(&m);
        }
        self.send_bytes(&all);
    }

    /// REGION_WRITE_MULTI (command 15): up to 200 entries of at most 8 bytes.
    /// QEMU sends it posted; `posted == false` asks for a reply and checks it.
    pub fn write_multi(&mut self, entries: &[(u32, u64, &[u8])], posted: bool) {
        assert!(entries.len() <= 200);
        let mut body = wire::WriteMulti { count: entries.len() as u64 }.as_slice().to_vec();
        for &(region, offset, data) in entries {
            let mut e = wire::WriteMultiEntry { offset, region, count: data.len() as u32, data: [0; wire::MULTI_DATA] };
            e.data[..data.len()].copy_from_slice(data);
            body.extend_from_slice(e.as_slice());
        }
        if posted {
            self.send(CMD_REGION_WRITE_MULTI, F_NO_REPLY, &body);
        } else {
            self.request_ok(CMD_REGION_WRITE_MULTI, &body);
        }
    }

    /// Sends `m` with `fds` attached as SCM_RIGHTS (to the first byte).
    pub fn send_with_fds(&mut self, m: &[u8], fds: &[RawFd]) {
        if fds.is_empty() {
            return self.send_bytes(m);
        }
        let cmsg = [ControlMessage::ScmRights(fds)];
        let n = sendmsg::<()>(self.stream.as_raw_fd(), &[IoSlice::new(m)], &cmsg, MsgFlags::empty(), None)
            .expect("sendmsg with fds");
        if n < m.len() {
            self.send_bytes(&m[n..]);
        }
    }

    /// DEVICE_SET_IRQS (argsz, flags, index, start, count), with eventfds
    /// passed as SCM_RIGHTS; returns the reply whatever it is.
    pub fn try_set_irqs(&mut self, index: u32, flags: u32, start: u32, count: u32, fds: &[RawFd]) -> Reply {
        let set = wire::IrqSet { argsz: 20, flags, index, start, count };
        let (id, m) = self.encode(CMD_DEVICE_SET_IRQS, F_REQUEST, set.as_slice());
        self.send_with_fds(&m, fds);
        self.recv_reply(id, CMD_DEVICE_SET_IRQS)
    }

    /// DEVICE_SET_IRQS that must succeed.
    pub fn set_irqs(&mut self, index: u32, flags: u32, start: u32, count: u32, fds: &[RawFd]) {
        let r = self.try_set_irqs(index, flags, start, count, fds);
        assert!(!r.is_error(), "SET_IRQS index {index} flags {flags:#x} failed with errno {}", r.error);
        assert!(r.body.is_empty(), "SET_IRQS reply carries a body: {:?}", r.body);
    }

    /// DEVICE_GET_REGION_INFO: (flags, size) of region `index`.
    pub fn region_info(&mut self, index: u32) -> (u32, u64) {
        let req = wire::RegionInfo { argsz: 32, index, ..Default::default() };
        let r = self.request_ok(CMD_DEVICE_GET_REGION_INFO, req.as_slice());
        assert_eq!(r.len(), 32, "region info reply length");
        let info: wire::RegionInfo = wire::read(&r).unwrap();
        assert_eq!(info.index, index, "region info index");
        (info.flags, info.size)
    }

    /// Reads a 32-bit register of BAR 0.
    pub fn reg(&mut self, off: u64) -> u32 {
        u32::from_le_bytes(self.region_read(regs::BAR_REGS, off, 4).try_into().unwrap())
    }

    /// Writes a 32-bit register of BAR 0 (non-posted, so it has taken effect on return).
    pub fn set_reg(&mut self, off: u64, v: u32) {
        self.region_write(regs::BAR_REGS, off, &v.to_le_bytes(), false);
    }

    /// Programs PCT entry `page`: word 0 (control) and word 1 (receive DMA
    /// address), with 8-byte non-posted writes to BAR 2.
    pub fn set_pct(&mut self, page: u64, word0: u64, word1: u64) {
        self.region_write(regs::BAR_PCT, page * 16, &word0.to_le_bytes(), false);
        self.region_write(regs::BAR_PCT, page * 16 + 8, &word1.to_le_bytes(), false);
    }

    /// Reads PCT entry `page` back as (word 0, word 1).
    pub fn pct(&mut self, page: u64) -> (u64, u64) {
        let b = self.region_read(regs::BAR_PCT, page * 16, 16);
        (u64::from_le_bytes(b[..8].try_into().unwrap()), u64::from_le_bytes(b[8..].try_into().unwrap()))
    }

    /// True when the server closed the connection (EOF or reset) within the timeout.
    pub fn closed_by_server(&mut self) -> bool {
        let mut b = [0u8; 64];
        match self.stream.read(&mut b) {
            Ok(0) => true,
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => true,
            Ok(n) => panic!("expected EOF, got {n} bytes: {:?}", &b[..n]),
            Err(e) => panic!("expected EOF, got {e}"),
        }
    }
}

/// Guest RAM in a memfd (what QEMU's memory backend gives the device).
pub struct GuestRam {
    pub file: File,
    pub size: u64,
}

impl GuestRam {
    pub fn new(size: u64) -> GuestRam {
        let fd: OwnedFd = nix::sys::memfd::memfd_create(
            c"mc-test-guest-ram",
            nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC | nix::sys::memfd::MemFdCreateFlag::MFD_ALLOW_SEALING,
        )
        .expect("memfd_create");
        nix::unistd::ftruncate(&fd, size as i64).expect("ftruncate");
        GuestRam { file: File::from(fd), size }
    }

    /// Reads `len` bytes at file offset `off` (pread).
    pub fn read(&self, off: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        self.file.read_exact_at(&mut b, off).expect("pread guest RAM");
        b
    }

    /// Writes at file offset `off` (pwrite).
    pub fn write(&self, off: u64, data: &[u8]) {
        self.file.write_all_at(data, off).expect("pwrite guest RAM");
    }

    /// Everything.
    pub fn all(&self) -> Vec<u8> {
        self.read(0, self.size as usize)
    }
}

impl AsRawFd for GuestRam {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.file.as_raw_fd()
    }
}

/// A real hub on a Unix socket, served by a tokio runtime owned by the test
/// (shared with the hub's own tests).
pub use hub::testing::TestHub as Hub;

/// Which kind of hub port the in-process tests put adapters on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ports {
    /// The hub serves the adapter (the default; the fast path).
    Local,
    /// A separate adapter joined over the link protocol (per-guest adapters).
    Link,
}

/// The port kind from `MC_TEST_PORTS` (`local`, the default, or `link`).
pub fn ports() -> Ports {
    match std::env::var("MC_TEST_PORTS").as_deref() {
        Ok("link") => Ports::Link,
        Ok("local") | Err(_) => Ports::Local,
        Ok(other) => panic!("MC_TEST_PORTS must be local or link, not '{other}'"),
    }
}

/// An adapter on a hub, serving vfio-user on a socket.
pub struct AdapterHandle {
    /// vfio-user socket.
    pub sock: PathBuf,
    /// Node id the hub gave it.
    pub node: u16,
    /// Ports of the hub.
    pub max_nodes: u16,
    /// The serving thread of a link-port adapter (a local port's thread is the hub's).
    thread: Option<JoinHandle<io::Result<()>>>,
    _dir: Option<tempfile::TempDir>,
}

/// Address space of the test adapters: 1 MiB = 128 pages.
pub const ASPACE: u64 = 1 << 20;

impl AdapterHandle {
    /// Creates an adapter with a 1 MiB address space on `hub`, on the kind
    /// of port [`ports`] says.
    pub fn start(hub: &Hub, name: &str) -> AdapterHandle {
        Self::start_with(hub, name, ASPACE)
    }

    /// Like [`AdapterHandle::start`] with an address space of `aspace` bytes.
    pub fn start_with(hub: &Hub, name: &str, aspace: u64) -> AdapterHandle {
        match ports() {
            Ports::Local => Self::start_local(hub, name, aspace),
            Ports::Link => Self::start_link(hub, name, aspace),
        }
    }

    /// A local port: the hub serves the adapter (its writes are ordered and
    /// delivered by its own vfio-user thread).
    pub fn start_local(hub: &Hub, name: &str, aspace: u64) -> AdapterHandle {
        let (sock, node) = hub.add_local(name, aspace);
        let max_nodes = hub.hub.max_nodes() as u16;
        AdapterHandle { sock, node, max_nodes, thread: None, _dir: None }
    }

    /// A link port: joins with [`client::join`] and [`Adapter::attach_link`];
    /// no rejoin after a link loss.
    pub fn start_link(hub: &Hub, name: &str, aspace: u64) -> AdapterHandle {
        let mut adapter = Adapter::new(aspace).expect("Adapter::new");
        let (joined, reader, writer) =
            client::join(&hub.path, ANY_NODE, PAGE_SIZE as u32, (aspace / PAGE_SIZE) as u32, name).expect("join hub");
        let (node, max_nodes) = (joined.node, joined.max_nodes);
        adapter.attach_link(joined, reader, writer);
        Self::serve(adapter, name, node, max_nodes)
    }

    /// Joins with [`Adapter::connect`], as `mc-adapter` does: the adapter
    /// rejoins the hub by itself after a link loss.
    pub fn start_connected(hub: &Hub, name: &str) -> AdapterHandle {
        let mut adapter = Adapter::new(ASPACE).expect("Adapter::new");
        let cfg = AdapterConfig {
            aspace: ASPACE,
            hub: device::link_client::HubAddr::Unix(hub.path.clone()),
            secret: None,
            want_node: ANY_NODE,
            name: name.to_string(),
            hub_wait: Duration::from_secs(2),
        };
        adapter.connect(&cfg).expect("Adapter::connect");
        let mut h = Self::serve(adapter, name, 0, 0);
        // The node id is only known to the adapter: ask it like a driver does.
        let node = h.client().reg(regs::reg::NODE);
        assert_ne!(node & 0xFFFF, 0xFFFF, "connected adapter has no node id");
        h.node = (node & 0xFFFF) as u16;
        h.max_nodes = (node >> 16) as u16;
        h
    }

    /// Serves an adapter the caller joined itself.
    pub fn serve(mut adapter: Adapter, name: &str, node: u16, max_nodes: u16) -> AdapterHandle {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("vfio-user.sock");
        let listener = UnixListener::bind(&sock).unwrap();
        let thread = std::thread::Builder::new()
            .name(format!("vfio-user-{name}"))
            .spawn(move || device::vfio_user::serve(&listener, &mut adapter))
            .unwrap();
        AdapterHandle { sock, node, max_nodes, thread: Some(thread), _dir: Some(dir) }
    }

    /// Connects a fresh fake QEMU (VERSION negotiated).
    pub fn client(&self) -> VfioClient {
        VfioClient::connect(&self.sock)
    }

    /// The server thread must still be running (no panic, no accept failure).
    pub fn assert_alive(&self) {
        if let Some(t) = &self.thread {
            assert!(!t.is_finished(), "vfio-user server thread of the adapter has exited");
        }
    }
}

/// A node as a guest sees it: its adapter, a connected fake QEMU and its RAM.
/// vfio region index of PCI configuration space.
pub const CONFIG_REGION: u32 = region::CONFIG;
/// PCI command register offset.
pub const PCI_COMMAND: u64 = 0x04;
/// Memory space and bus master enable bits.
pub const PCI_COMMAND_MEMORY_MASTER: u16 = 0x0006;

/// An adapter with a connected fake QEMU and memfd guest RAM mapped for DMA.
pub struct Node {
    pub adapter: AdapterHandle,
    pub vfio: VfioClient,
    pub ram: GuestRam,
}

impl Node {
    /// Starts an adapter on `hub`, connects to it and maps `ram_size` bytes of
    /// memfd RAM at `iova`, starting at `ram_offset` in the file (the file is
    /// `ram_offset + ram_size` bytes long).
    pub fn start(hub: &Hub, name: &str, iova: u64, ram_offset: u64, ram_size: u64) -> Node {
        Self::with_adapter(AdapterHandle::start(hub, name), iova, ram_offset, ram_size)
    }

    /// Like [`Node::start`], with an adapter that rejoins after a link loss.
    pub fn start_connected(hub: &Hub, name: &str, iova: u64, ram_offset: u64, ram_size: u64) -> Node {
        Self::with_adapter(AdapterHandle::start_connected(hub, name), iova, ram_offset, ram_size)
    }

    /// A node that comes back after a link loss by itself: a local port
    /// (the hub plugs it back in) or, with link ports, an adapter that
    /// rejoins ([`Node::start_connected`]).
    pub fn start_rejoining(hub: &Hub, name: &str, iova: u64, ram_offset: u64, ram_size: u64) -> Node {
        match ports() {
            Ports::Local => Self::start(hub, name, iova, ram_offset, ram_size),
            Ports::Link => Self::start_connected(hub, name, iova, ram_offset, ram_size),
        }
    }

    /// Like [`Node::start`] with an address space of `aspace` bytes.
    pub fn start_aspace(hub: &Hub, name: &str, aspace: u64, iova: u64, ram_offset: u64, ram_size: u64) -> Node {
        Self::with_adapter(AdapterHandle::start_with(hub, name, aspace), iova, ram_offset, ram_size)
    }

    /// [`Node::start_local`] with an address space of `aspace` bytes.
    pub fn start_local_aspace(hub: &Hub, name: &str, aspace: u64, iova: u64, ram_offset: u64, ram_size: u64) -> Node {
        Self::with_adapter(AdapterHandle::start_local(hub, name, aspace), iova, ram_offset, ram_size)
    }

    /// A node on a local port, whatever [`ports`] says.
    pub fn start_local(hub: &Hub, name: &str, iova: u64, ram_offset: u64, ram_size: u64) -> Node {
        Self::with_adapter(AdapterHandle::start_local(hub, name, ASPACE), iova, ram_offset, ram_size)
    }

    /// A node on a link port, whatever [`ports`] says.
    pub fn start_link(hub: &Hub, name: &str, iova: u64, ram_offset: u64, ram_size: u64) -> Node {
        Self::with_adapter(AdapterHandle::start_link(hub, name, ASPACE), iova, ram_offset, ram_size)
    }

    /// QEMU goes away and a new one connects, as after the guest's QEMU
    /// restarted without a device reset: the old connection is closed, a new
    /// client negotiates and maps the same RAM again (the adapter forgets
    /// DMA maps on disconnect). Nothing else is set up.
    pub fn reconnect(&mut self, iova: u64, ram_offset: u64, ram_size: u64) {
        self.vfio.stream.shutdown(std::net::Shutdown::Both).expect("shutdown vfio-user socket");
        self.vfio = self.adapter.client();
        self.vfio.dma_map(iova, ram_size, &self.ram, ram_offset);
    }

    /// The PCI command register.
    pub fn pci_command(&mut self) -> u16 {
        u16::from_le_bytes(self.vfio.region_read(CONFIG_REGION, PCI_COMMAND, 2).try_into().unwrap())
    }

    fn with_adapter(adapter: AdapterHandle, iova: u64, ram_offset: u64, ram_size: u64) -> Node {
        let mut vfio = adapter.client();
        let ram = GuestRam::new(ram_offset + ram_size);
        vfio.dma_map(iova, ram_size, &ram, ram_offset);
        // What a driver does first: memory decoding and bus mastering on.
        vfio.region_write(CONFIG_REGION, PCI_COMMAND, &PCI_COMMAND_MEMORY_MASTER.to_le_bytes(), false);
        Node { adapter, vfio, ram }
    }
}

/// Polls `f` until it returns `Some`, or panics with `what` after [`POLL_TIMEOUT`].
pub fn poll<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + POLL_TIMEOUT;
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() > deadline {
            panic!("timed out after {POLL_TIMEOUT:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A non-blocking eventfd, as QEMU hands the device for an interrupt.
pub fn eventfd() -> EventFd {
    EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC).expect("eventfd")
}

/// Waits up to `timeout` for `efd` to be signalled; returns its counter
/// (reading resets it to 0), or None if it stayed quiet.
pub fn wait_eventfd(efd: &EventFd, timeout: Duration) -> Option<u64> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let ms = PollTimeout::from(left.as_millis().min(10_000) as u16);
        let mut fds = [PollFd::new(efd.as_fd(), PollFlags::POLLIN)];
        match nix::poll::poll(&mut fds, ms) {
            Ok(0) => return None,
            Ok(_) => {
                return match efd.read() {
                    Ok(v) => Some(v),
                    Err(nix::errno::Errno::EAGAIN) => None,
                    Err(e) => panic!("read eventfd: {e}"),
                }
            }
            Err(nix::errno::Errno::EINTR) if Instant::now() < deadline => continue,
            Err(e) => panic!("poll eventfd: {e}"),
        }
    }
}
