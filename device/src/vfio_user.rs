//! A vfio-user server: the protocol QEMU's `vfio-user-pci` speaks to a PCI
//! device emulated out of process.
//!
//! Written for this project rather than taken from the `vfio_user` crate,
//! which is blocking, single-connection, advertises fixed capabilities and
//! lacks `REGION_WRITE_MULTI`. This module owns the socket and
//! the wire format; the device behind it implements [`Device`] and never sees
//! a message.
//!
//! Messages are handled strictly in order, one at a time. Posted writes
//! (`NO_REPLY`) get no reply. When no further message is waiting on the
//! socket, [`Device::idle`] runs, so the device can flush work it batched
//! (the adapter coalesces transmit-window writes there) without ever waiting
//! for more input.
//!
//! The messages themselves (header, bodies, flag words) are typed structs
//! in the `vfio-user-wire` protocol crate; this module decodes each request
//! into them and checks it before the device sees it.

use std::io::{self, IoSliceMut, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
use thiserror::Error;
use tracing::{debug, info, warn};
use vm_memory::ByteValued;

/// Largest data transfer in one region access; advertised as `max_data_xfer_size`.
pub const MAX_XFER: usize = 1 << 20;
/// Largest message accepted: a region write of [`MAX_XFER`] plus its headers,
/// or a full `REGION_WRITE_MULTI` (200 entries of 24 bytes).
pub const MAX_MSG: usize = MAX_XFER + 64;
/// Most fds accepted with one message; advertised as `max_msg_fds`.
pub const MAX_FDS: usize = 8;
/// Fds the receive buffer has room for: the kernel's `SCM_MAX_FD`, the most
/// one `SCM_RIGHTS` message can carry. A client that sends more than
/// [`MAX_FDS`] is refused, and the extra fds are closed, not leaked: a
/// truncated control message would leave the fds the kernel already
/// installed open with no way to name them.
const RECV_FDS: usize = 253;
/// Most messages handled back to back before [`Device::idle`] runs anyway:
/// bounds how long batched work can wait while the socket never drains.
/// 1024 eight-byte stores fill one MEMORY CHANNEL page, the largest packet,
/// so a steady store stream is not cut into smaller packets by this bound.
pub const MAX_BATCH: u32 = 1024;
pub use vfio_user_wire::{self as wire, Command, Header, HDR_LEN, MULTI_DATA, MULTI_MAX};
use wire::{DmaFlags, HeaderFlags, IrqSetFlags, RegionFlags};

// The VFIO numbers vfio-user reuses come from the kernel's header, through
// rust-vmm's vfio-bindings.
use v::{
    VFIO_DEVICE_FLAGS_PCI as DEVICE_FLAGS_PCI, VFIO_DEVICE_FLAGS_RESET as DEVICE_FLAGS_RESET,
    VFIO_IRQ_INFO_AUTOMASKED as IRQ_INFO_AUTOMASKED, VFIO_IRQ_INFO_EVENTFD as IRQ_INFO_EVENTFD,
    VFIO_IRQ_INFO_MASKABLE as IRQ_INFO_MASKABLE, VFIO_IRQ_INFO_NORESIZE as IRQ_INFO_NORESIZE,
};
use vfio_bindings::bindings::vfio as v;

/// Header flag bits, as words (the bits of [`wire::HeaderFlags`]).
pub mod flags {
    use super::HeaderFlags;
    /// Mask of the message type.
    pub const TYPE_MASK: u32 = super::wire::TYPE_MASK;
    /// Type: request.
    pub const REQUEST: u32 = 0;
    /// Type: reply.
    pub const REPLY: u32 = HeaderFlags::REPLY.bits();
    /// The sender wants no reply (posted write).
    pub const NO_REPLY: u32 = HeaderFlags::NO_REPLY.bits();
    /// The reply reports an error in the `error` field.
    pub const ERROR: u32 = HeaderFlags::ERROR.bits();
}

/// VFIO region indexes of a PCI device (`VFIO_PCI_*_REGION_INDEX`).
pub mod region {
    use super::v;
    /// BAR 0; BAR n is index n.
    pub const BAR0: u32 = v::VFIO_PCI_BAR0_REGION_INDEX;
    /// Expansion ROM.
    pub const ROM: u32 = v::VFIO_PCI_ROM_REGION_INDEX;
    /// PCI configuration space.
    pub const CONFIG: u32 = v::VFIO_PCI_CONFIG_REGION_INDEX;
    /// VGA (absent).
    pub const VGA: u32 = v::VFIO_PCI_VGA_REGION_INDEX;
    /// Number of region indexes.
    pub const COUNT: u32 = v::VFIO_PCI_NUM_REGIONS;
}

/// VFIO IRQ indexes of a PCI device (`VFIO_PCI_*_IRQ_INDEX`).
pub mod irq {
    use super::v;
    /// Legacy INTx.
    pub const INTX: u32 = v::VFIO_PCI_INTX_IRQ_INDEX;
    /// MSI.
    pub const MSI: u32 = v::VFIO_PCI_MSI_IRQ_INDEX;
    /// MSI-X.
    pub const MSIX: u32 = v::VFIO_PCI_MSIX_IRQ_INDEX;
    /// Error notification.
    pub const ERR: u32 = v::VFIO_PCI_ERR_IRQ_INDEX;
    /// Device request.
    pub const REQ: u32 = v::VFIO_PCI_REQ_IRQ_INDEX;
    /// Number of IRQ indexes.
    pub const COUNT: u32 = v::VFIO_PCI_NUM_IRQS;
    use super::IrqSetFlags;
    /// `SET_IRQS` flag: no data.
    pub const DATA_NONE: u32 = IrqSetFlags::DATA_NONE.bits();
    /// `SET_IRQS` flag: data is one bool per vector.
    pub const DATA_BOOL: u32 = IrqSetFlags::DATA_BOOL.bits();
    /// `SET_IRQS` flag: data is one eventfd per vector (passed as fds).
    pub const DATA_EVENTFD: u32 = IrqSetFlags::DATA_EVENTFD.bits();
    /// `SET_IRQS` action: mask.
    pub const ACTION_MASK: u32 = IrqSetFlags::ACTION_MASK.bits();
    /// `SET_IRQS` action: unmask.
    pub const ACTION_UNMASK: u32 = IrqSetFlags::ACTION_UNMASK.bits();
    /// `SET_IRQS` action: trigger / set trigger eventfds.
    pub const ACTION_TRIGGER: u32 = IrqSetFlags::ACTION_TRIGGER.bits();
}

/// `VFIO_REGION_INFO_FLAG_*`, as words (the bits of [`wire::RegionFlags`]).
pub mod region_flags {
    use super::RegionFlags;
    /// Readable.
    pub const READ: u32 = RegionFlags::READ.bits();
    /// Writable.
    pub const WRITE: u32 = RegionFlags::WRITE.bits();
    /// Mappable (never offered: it would turn off posted writes).
    pub const MMAP: u32 = RegionFlags::MMAP.bits();
}

/// `VFIO_DMA_MAP_FLAG_*` / `VFIO_DMA_UNMAP_FLAG_*`, as words (the bits of
/// [`wire::DmaFlags`]).
pub mod dma_flags {
    use super::DmaFlags;
    /// Device may read.
    pub const READ: u32 = DmaFlags::READ.bits();
    /// Device may write.
    pub const WRITE: u32 = DmaFlags::WRITE.bits();
    /// Unmap everything (`VFIO_DMA_UNMAP_FLAG_ALL`).
    pub const UNMAP_ALL: u32 = DmaFlags::UNMAP_ALL.bits();
}

/// A region as the device describes it.
#[derive(Debug, Clone, Copy, Default)]
pub struct RegionInfo {
    /// Size in bytes (0: absent).
    pub size: u64,
    /// `region_flags` bits.
    pub flags: u32,
}

/// What a [`Device`] call can fail with: an errno for the reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("errno {0}")]
pub struct Errno(pub i32);

/// A `SET_IRQS` request, validated.
#[derive(Debug)]
pub struct IrqSet {
    /// `irq::*` index.
    pub index: u32,
    /// `DATA_*` and `ACTION_*` bits.
    pub flags: u32,
    /// First vector.
    pub start: u32,
    /// Vector count.
    pub count: u32,
    /// Eventfds (with `DATA_EVENTFD`), one per vector; `None` de-assigns.
    pub fds: Vec<OwnedFd>,
    /// Bools (with `DATA_BOOL`).
    pub bools: Vec<bool>,
}

/// The device side of the protocol.
pub trait Device {
    /// Region `index` (BARs 0..5, ROM, config, VGA).
    fn region_info(&self, index: u32) -> RegionInfo;
    /// Vectors of IRQ type `index`.
    fn irq_count(&self, index: u32) -> u32;
    /// Reads `data.len()` bytes of region `index` at `offset` (bounds already checked).
    fn region_read(&mut self, index: u32, offset: u64, data: &mut [u8]) -> Result<(), Errno>;
    /// Writes region `index` at `offset` (bounds already checked).
    fn region_write(&mut self, index: u32, offset: u64, data: &[u8]) -> Result<(), Errno>;
    /// Maps guest memory.
    fn dma_map(&mut self, iova: u64, size: u64, fd: Option<OwnedFd>, offset: u64, flags: u32) -> Result<(), Errno>;
    /// Unmaps guest memory (`all`: everything).
    fn dma_unmap(&mut self, iova: u64, size: u64, all: bool) -> Result<(), Errno>;
    /// Interrupt setup (bounds of `start..start+count` already checked).
    fn set_irqs(&mut self, req: IrqSet) -> Result<(), Errno>;
    /// Device reset.
    fn reset(&mut self);
    /// No message is waiting on the socket: flush batched work now.
    fn idle(&mut self) {}
    /// [`MAX_BATCH`] messages went by without [`Device::idle`]: push out
    /// work that is complete, without cutting short what is still growing.
    fn batch_limit(&mut self) {
        self.idle()
    }
    /// The client went away: drop its DMA maps and interrupt fds.
    fn disconnected(&mut self) {}
}

/// Reasons a connection ends.
#[derive(Debug, Error)]
pub enum ServeError {
    /// Socket error or orderly close.
    #[error("socket: {0}")]
    Io(#[from] io::Error),
    /// The client sent something that cannot be framed (bad size, bad type).
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// The stop fd fired while the server waited for the client
    /// ([`Connection::stop_on`]); [`Connection::run_until_parked`] turns
    /// this into [`Ended::Parked`].
    #[error("stopped to be handed over")]
    Stopped,
}

/// How [`Connection::run_until_parked`] ended.
pub enum Ended {
    /// The client closed the connection (the device was told: disconnected).
    Closed,
    /// The stop fd fired: the connection, with what was received and not
    /// handled yet, for [`Connection::resume`] (in this process or, through
    /// `exec`, in the next one). The device was not told anything but
    /// [`Device::idle`]; its state stays the client's.
    Parked(Parked),
}

/// A connection stopped between two reads of its socket.
pub struct Parked {
    /// The client's socket.
    pub stream: UnixStream,
    /// Bytes received and not handled yet: the start of the next messages.
    pub buffered: Vec<u8>,
    /// Fds received with the message that starts `.0` bytes into `buffered`.
    pub fds: Option<(u64, Vec<OwnedFd>)>,
    /// Whether `write_multiple` was advertised to this client.
    pub multi: bool,
}

/// How the server presents itself to the client.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConnectionConfig {
    /// Whether to advertise `write_multiple`, which decides the path a
    /// guest's stores take through QEMU.
    pub write_multiple: WriteMultiple,
}

/// Advertising vfio-user `write_multiple`: the store path through QEMU.
///
/// QEMU 10.1 and 10.2 route every message through their vfio-user
/// iothread once `write_multiple` is advertised (their `VFIO_PROXY_USE_MULTI`
/// includes `VFIO_PROXY_FORCE_QUEUED`): one more thread wake-up per store,
/// but floods are packed 200 stores to a message. Without it the vCPU
/// thread sends each store itself (the direct path), which is safe only
/// while QEMU's socket never fills ([`crate::client_socket`]).
/// `docs/adapter.md`, "The store path", has the measurements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WriteMultiple {
    /// Advertise it: the queued path.
    On,
    /// Do not: the direct path, whether or not QEMU's send buffer could be
    /// enlarged.
    Off,
    /// The direct path when QEMU's send buffer could be enlarged, else the
    /// queued path.
    #[default]
    Auto,
}

impl std::str::FromStr for WriteMultiple {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "on" | "true" => Ok(WriteMultiple::On),
            "off" | "false" => Ok(WriteMultiple::Off),
            "auto" => Ok(WriteMultiple::Auto),
            _ => Err(format!("write_multiple is on, off or auto, not '{s}'")),
        }
    }
}

impl std::fmt::Display for WriteMultiple {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            WriteMultiple::On => "on",
            WriteMultiple::Off => "off",
            WriteMultiple::Auto => "auto",
        })
    }
}

/// The capabilities we answer `VERSION` with; `multi`: advertise
/// `write_multiple`.
pub fn capabilities_json(multi: bool) -> String {
    let mut caps = serde_json::json!({
        "max_msg_fds": MAX_FDS,
        "max_data_xfer_size": MAX_XFER,
        "pgsizes": 4096,
        "max_dma_maps": crate::dma::MAX_DMA_MAPS,
    });
    if multi {
        caps["write_multiple"] = serde_json::Value::Bool(true);
    }
    serde_json::json!({ "capabilities": caps }).to_string()
}

/// Outcome of handling one request.
enum Reply {
    /// Send this body (after the header) as a successful reply.
    Ok(Vec<u8>),
    /// Send an error reply with this errno.
    Err(i32),
}

/// Serves one connected client until it disconnects or breaks the protocol.
///
/// Messages are received in bulk: one `recvmsg` takes whatever the socket
/// holds into a buffer that fits any accepted message. File descriptors
/// still reach the right message: the kernel ends a read right after the
/// segment that carried them, and QEMU sends each message (with its fds)
/// in one `sendmsg`, so fds belong to the last message that starts in the
/// bytes just read.
pub struct Connection<'d, D: Device> {
    stream: UnixStream,
    dev: &'d mut D,
    rx: Vec<u8>,
    /// Unparsed bytes are `rx[start..end]`; `rx[start]` begins a message.
    start: usize,
    end: usize,
    /// Stream offset of `rx[start]`.
    offset: u64,
    /// Fds received, and the stream offset of the message they came with.
    fds: Option<(u64, Vec<OwnedFd>)>,
    out: Vec<u8>,
    idle_pending: bool,
    since_idle: u32,
    /// Advertise `write_multiple` (decided when the client connected).
    multi: bool,
    /// While the server waits for the client, this fd becoming readable
    /// parks the connection ([`Connection::run_until_parked`]).
    stop: Option<BorrowedFd<'d>>,
}

/// Receive buffer: the largest accepted message plus room for the next ones.
const RX_BUF: usize = MAX_MSG + 64 * 1024;

impl<'d, D: Device> Connection<'d, D> {
    /// Wraps an accepted stream (default settings).
    pub fn new(stream: UnixStream, dev: &'d mut D) -> Self {
        Self::with_config(stream, dev, ConnectionConfig::default())
    }

    /// Wraps an accepted stream. For the direct store path, enlarges the
    /// client's send buffer first; `Auto` takes the direct path only if that
    /// worked.
    pub fn with_config(stream: UnixStream, dev: &'d mut D, cfg: ConnectionConfig) -> Self {
        let multi = match cfg.write_multiple {
            WriteMultiple::On => {
                info!("store path: queued (write_multiple on)");
                true
            }
            mode => match crate::client_socket::widen_client_sndbuf(&stream, crate::client_socket::CLIENT_SNDBUF) {
                Ok(n) => {
                    info!("store path: direct (the client's send buffer is now {} MiB)", n >> 20);
                    false
                }
                Err(e) if mode == WriteMultiple::Auto => {
                    info!("store path: queued (write_multiple offered): {e}");
                    true
                }
                Err(e) => {
                    warn!("store path: direct as configured, but a flood of stores can overrun it: {e}");
                    false
                }
            },
        };
        Connection {
            multi,
            stream,
            dev,
            rx: vec![0; RX_BUF],
            start: 0,
            end: 0,
            offset: 0,
            fds: None,
            out: Vec::with_capacity(4096),
            idle_pending: false,
            since_idle: 0,
            stop: None,
        }
    }

    /// Carries on serving a client parked by [`Connection::run_until_parked`]
    /// (its socket, its unhandled bytes and fds, its store path).
    pub fn resume(p: Parked, dev: &'d mut D) -> Result<Self, ServeError> {
        if p.buffered.len() > RX_BUF {
            return Err(ServeError::Protocol(format!("{} parked bytes: more than a receive buffer", p.buffered.len())));
        }
        let mut rx = vec![0; RX_BUF];
        rx[..p.buffered.len()].copy_from_slice(&p.buffered);
        Ok(Connection {
            multi: p.multi,
            stream: p.stream,
            dev,
            rx,
            start: 0,
            end: p.buffered.len(),
            offset: 0,
            fds: p.fds,
            out: Vec::with_capacity(4096),
            // Unhandled messages were received before the park: the device
            // ran idle then, so it has nothing batched now.
            idle_pending: false,
            since_idle: 0,
            stop: None,
        })
    }

    /// Parks the connection when `stop` becomes readable while the server
    /// waits for the client (an eventfd, say). Messages already received
    /// are handled first, one whole message at a time.
    pub fn stop_on(mut self, stop: BorrowedFd<'d>) -> Self {
        self.stop = Some(stop);
        self
    }

    /// Runs until the client closes (Ok) or breaks the protocol (Err).
    pub fn run(self) -> Result<(), ServeError> {
        self.run_until_parked().map(|_| ())
    }

    /// Runs until the client closes ([`Ended::Closed`]), breaks the protocol
    /// (Err), or the stop fd fires ([`Ended::Parked`]).
    pub fn run_until_parked(mut self) -> Result<Ended, ServeError> {
        let r = loop {
            match self.one() {
                Ok(true) => {}
                Ok(false) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        self.dev.idle();
        if matches!(r, Err(ServeError::Stopped)) {
            let fds = self.fds.take().and_then(|(off, fds)| Some((off.checked_sub(self.offset)?, fds)));
            return Ok(Ended::Parked(Parked {
                buffered: self.rx[self.start..self.end].to_vec(),
                fds,
                multi: self.multi,
                stream: self.stream,
            }));
        }
        self.dev.disconnected();
        r.map(|()| Ended::Closed)
    }

    /// Waits until the socket or the stop fd is readable; Err(Stopped) for
    /// the stop fd (it wins when both are).
    fn wait_unless_stopped(&self) -> Result<(), ServeError> {
        let Some(stop) = self.stop else { return Ok(()) };
        let mut fds = [PollFd::new(self.stream.as_fd(), PollFlags::POLLIN), PollFd::new(stop, PollFlags::POLLIN)];
        loop {
            match poll(&mut fds, PollTimeout::NONE) {
                Ok(_) => break,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(ServeError::Io(e.into())),
            }
        }
        if fds[1].revents().is_some_and(|r| !r.is_empty()) {
            return Err(ServeError::Stopped);
        }
        Ok(())
    }

    /// True when another message is already waiting on the socket.
    fn readable(&self) -> bool {
        let mut n: libc::c_int = 0;
        // SAFETY: FIONREAD writes one c_int into `n`.
        let rc = unsafe { libc::ioctl(self.stream.as_raw_fd(), libc::FIONREAD, &mut n) };
        rc == 0 && n > 0
    }

    /// Reads what the socket holds (blocking for at least one byte).
    /// Returns the number of bytes read (0 on end of stream).
    fn fill(&mut self) -> Result<usize, ServeError> {
        if self.start > 0 && (self.end == self.rx.len() || self.start == self.end) {
            self.rx.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let old_end = self.end;
        self.wait_unless_stopped()?;
        let (n, fds) = loop {
            let mut iov = [IoSliceMut::new(&mut self.rx[self.end..])];
            let mut cmsg = nix::cmsg_space!([std::os::fd::RawFd; RECV_FDS]);
            let msg =
                match recvmsg::<()>(self.stream.as_raw_fd(), &mut iov, Some(&mut cmsg), MsgFlags::MSG_CMSG_CLOEXEC) {
                    Ok(m) => m,
                    Err(nix::errno::Errno::EINTR) => continue,
                    Err(e) => return Err(ServeError::Io(e.into())),
                };
            if msg.flags.contains(MsgFlags::MSG_CTRUNC) {
                // Only several SCM_RIGHTS in one message get here: hostile.
                return Err(ServeError::Protocol(format!("more than {RECV_FDS} fds with one message")));
            }
            let mut fds = Vec::new();
            for c in msg.cmsgs().map_err(|e| ServeError::Io(e.into()))? {
                if let ControlMessageOwned::ScmRights(raw) = c {
                    // SAFETY: the kernel just installed these fds for us.
                    fds.extend(raw.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
                }
            }
            break (msg.bytes, fds);
        };
        self.end += n;
        if !fds.is_empty() {
            // The message the fds came with: the last one starting in the new bytes.
            let mut pos = self.start;
            let mut owner = None;
            while pos < self.end {
                if pos >= old_end {
                    owner = Some(pos);
                }
                if pos + HDR_LEN > self.end {
                    break;
                }
                let size = u32::from_le_bytes(self.rx[pos + 4..pos + 8].try_into().unwrap()) as usize;
                if size < HDR_LEN {
                    break;
                }
                pos += size;
            }
            match owner {
                Some(pos) => self.fds = Some((self.offset + (pos - self.start) as u64, fds)),
                None => warn!("fds arrived in the middle of a message; closed"),
            }
        }
        Ok(n)
    }

    fn run_idle(&mut self) {
        self.dev.idle();
        self.idle_pending = false;
        self.since_idle = 0;
    }

    /// Fds that came with the message at the current position, if any.
    fn take_fds(&mut self) -> Vec<OwnedFd> {
        match self.fds.take() {
            Some((off, fds)) if off == self.offset => fds,
            Some((off, fds)) if off > self.offset => {
                self.fds = Some((off, fds));
                Vec::new()
            }
            _ => Vec::new(),
        }
    }

    /// Consumes `n` bytes at the current position (some may still be in the socket).
    fn consume(&mut self, n: usize) -> io::Result<()> {
        let buffered = n.min(self.end - self.start);
        self.start += buffered;
        self.offset += n as u64;
        if n > buffered {
            io::copy(&mut (&self.stream).take((n - buffered) as u64), &mut io::sink())?;
        }
        Ok(())
    }

    /// Handles one message. Ok(false) when the client closed the connection.
    fn one(&mut self) -> Result<bool, ServeError> {
        // Batched work waits for at most MAX_BATCH messages, even when the
        // buffer holds many more.
        if self.idle_pending && self.since_idle >= MAX_BATCH {
            self.dev.batch_limit();
            self.since_idle = 0;
        }
        // A header.
        while self.end - self.start < HDR_LEN {
            if self.idle_pending && !self.readable() {
                self.run_idle();
            }
            if self.fill()? == 0 {
                if self.start == self.end {
                    return Ok(false);
                }
                return Err(ServeError::Protocol("connection closed inside a header".into()));
            }
        }
        let hdr: Header = wire::read(&self.rx[self.start..self.end]).expect("a whole header is buffered");
        let size = hdr.size as usize;
        if !hdr.is_valid() {
            return Err(ServeError::Protocol(format!("message size {size} is smaller than a header")));
        }
        if hdr.kind() != flags::REQUEST {
            return Err(ServeError::Protocol(format!(
                "unexpected message type {} (the server sends no requests)",
                hdr.kind()
            )));
        }
        if size > MAX_MSG {
            // Too big to take, but still framed: drain it and say so.
            warn!(id = hdr.id, command = hdr.command, size, "message over {MAX_MSG} bytes refused");
            drop(self.take_fds());
            self.consume(size)?;
            if !hdr.flags().contains(HeaderFlags::NO_REPLY) {
                self.reply(&hdr, Reply::Err(libc::E2BIG))?;
            }
            return Ok(true);
        }
        // The whole message.
        while self.end - self.start < size {
            if self.fill()? == 0 {
                return Err(ServeError::Protocol("connection closed inside a message".into()));
            }
        }
        let fds = self.take_fds();
        let body = self.start + HDR_LEN..self.start + size;
        let reply = self.dispatch(&hdr, body, fds);
        self.consume(size)?;
        self.idle_pending = true;
        self.since_idle += 1;
        if hdr.flags().contains(HeaderFlags::NO_REPLY) {
            if let Reply::Err(e) = reply {
                debug!(id = hdr.id, command = hdr.command, errno = e, "posted request failed");
            }
        } else {
            self.reply(&hdr, reply)?;
        }
        Ok(true)
    }

    fn reply(&mut self, req: &Header, reply: Reply) -> io::Result<()> {
        let (body, errno) = match reply {
            Reply::Ok(b) => (b, None),
            Reply::Err(e) => (Vec::new(), Some(e)),
        };
        self.out.clear();
        self.out.extend_from_slice(req.reply(body.len(), errno).as_slice());
        self.out.extend_from_slice(&body);
        self.stream.write_all(&self.out)
    }

    fn dispatch(&mut self, hdr: &Header, body: std::ops::Range<usize>, fds: Vec<OwnedFd>) -> Reply {
        let cmd = match Command::try_from(hdr.command) {
            Ok(c) => c,
            Err(n) => {
                warn!(command = n, "unknown vfio-user command");
                return Reply::Err(libc::ENOSYS);
            }
        };
        // Only DMA_MAP and SET_IRQS take fds; any other fds are closed on drop.
        // The body stays in the receive buffer, lent to the handler.
        let rx = std::mem::take(&mut self.rx);
        let r = self.handle(cmd, &rx[body], fds);
        self.rx = rx;
        match r {
            Ok(body) => Reply::Ok(body),
            Err(Errno(e)) => {
                debug!(?cmd, errno = e, "request failed");
                Reply::Err(e)
            }
        }
    }

    /// An access of a region that exists, of 1 to [`MAX_XFER`] bytes,
    /// all inside the region.
    fn region_bounds(&self, a: &wire::RegionAccess) -> Result<(), Errno> {
        let info = self.dev.region_info(a.region);
        // `is_valid` rules out a wrapping end before it is computed.
        if a.region >= region::COUNT || !a.is_valid(MAX_XFER) || a.offset + a.count as u64 > info.size {
            return Err(Errno(libc::EINVAL));
        }
        Ok(())
    }

    fn handle(&mut self, cmd: Command, b: &[u8], fds: Vec<OwnedFd>) -> Result<Vec<u8>, Errno> {
        // The fixed part of a body, or EINVAL when the body is shorter.
        fn body<T: ByteValued + Default>(b: &[u8]) -> Result<T, Errno> {
            wire::read(b).ok_or(Errno(libc::EINVAL))
        }
        match cmd {
            Command::Version => {
                let ver: wire::Version = body(b)?;
                if ver.major != 0 {
                    return Err(Errno(libc::ENOTSUP));
                }
                let mut out = wire::Version::default().as_slice().to_vec();
                out.extend_from_slice(capabilities_json(self.multi).as_bytes());
                out.push(0);
                Ok(out)
            }
            Command::DmaMap => {
                let m: wire::DmaMap = body(b)?;
                if fds.len() > 1 {
                    return Err(Errno(libc::EINVAL));
                }
                self.dev.dma_map(m.addr, m.size, fds.into_iter().next(), m.offset, m.flags)?;
                Ok(Vec::new())
            }
            Command::DmaUnmap => {
                let u: wire::DmaUnmap = body(b)?;
                self.dev.dma_unmap(u.addr, u.size, u.flags().contains(DmaFlags::UNMAP_ALL))?;
                Ok(u.as_slice().to_vec())
            }
            Command::DeviceGetInfo => {
                // Only argsz is read.
                let _: u32 = body(b)?;
                let info = wire::DeviceInfo {
                    argsz: std::mem::size_of::<wire::DeviceInfo>() as u32,
                    flags: DEVICE_FLAGS_RESET | DEVICE_FLAGS_PCI,
                    num_regions: region::COUNT,
                    num_irqs: irq::COUNT,
                };
                Ok(info.as_slice().to_vec())
            }
            Command::DeviceGetRegionInfo => {
                let req: wire::InfoRequest = body(b)?;
                let index = req.index;
                if index >= region::COUNT {
                    return Err(Errno(libc::EINVAL));
                }
                let info = self.dev.region_info(index);
                let reply = wire::RegionInfo {
                    argsz: std::mem::size_of::<wire::RegionInfo>() as u32,
                    flags: info.flags,
                    index,
                    cap_offset: 0,
                    size: info.size,
                    offset: 0, // nothing is mappable
                };
                Ok(reply.as_slice().to_vec())
            }
            Command::DeviceGetIrqInfo => {
                let req: wire::InfoRequest = body(b)?;
                let index = req.index;
                if index >= irq::COUNT {
                    return Err(Errno(libc::EINVAL));
                }
                let count = self.dev.irq_count(index);
                let flags = match (count, index) {
                    (0, _) => 0,
                    (_, irq::INTX) => IRQ_INFO_EVENTFD | IRQ_INFO_MASKABLE | IRQ_INFO_AUTOMASKED,
                    _ => IRQ_INFO_EVENTFD | IRQ_INFO_NORESIZE,
                };
                let argsz = std::mem::size_of::<wire::IrqInfo>() as u32;
                Ok(wire::IrqInfo { argsz, flags, index, count }.as_slice().to_vec())
            }
            Command::DeviceSetIrqs => {
                let set: wire::IrqSet = body(b)?;
                let (index, start, count) = (set.index, set.start, set.count);
                if index >= irq::COUNT
                    || start.checked_add(count).is_none_or(|e| e > self.dev.irq_count(index)) && count != 0
                {
                    return Err(Errno(libc::EINVAL));
                }
                if !set.is_valid() {
                    return Err(Errno(libc::EINVAL));
                }
                let data = &b[std::mem::size_of::<wire::IrqSet>()..];
                let mut bools = Vec::new();
                if set.flags().contains(IrqSetFlags::DATA_BOOL) {
                    let given = data.get(..count as usize).ok_or(Errno(libc::EINVAL))?;
                    bools = given.iter().map(|&x| x != 0).collect();
                }
                if set.flags().contains(IrqSetFlags::DATA_EVENTFD) && !fds.is_empty() && fds.len() != count as usize {
                    return Err(Errno(libc::EINVAL));
                }
                self.dev.set_irqs(IrqSet { index, flags: set.flags, start, count, fds, bools })?;
                Ok(Vec::new())
            }
            Command::RegionRead => {
                let a: wire::RegionAccess = body(b)?;
                let count = a.count as usize;
                self.region_bounds(&a)?;
                let mut out = a.as_slice().to_vec();
                out.resize(HEAD + count, 0);
                self.dev.region_read(a.region, a.offset, &mut out[HEAD..])?;
                Ok(out)
            }
            Command::RegionWrite => {
                let a: wire::RegionAccess = body(b)?;
                if b.len() != HEAD + a.count as usize {
                    return Err(Errno(libc::EINVAL));
                }
                self.region_bounds(&a)?;
                self.dev.region_write(a.region, a.offset, &b[HEAD..])?;
                Ok(a.as_slice().to_vec())
            }
            Command::RegionWriteMulti => {
                let m: wire::WriteMulti = body(b)?;
                let skip = std::mem::size_of::<wire::WriteMulti>();
                if m.count > MULTI_MAX as u64
                    || b.len() < skip + m.count as usize * std::mem::size_of::<wire::WriteMultiEntry>()
                {
                    return Err(Errno(libc::EINVAL));
                }
                for i in 0..m.count as usize {
                    let e: wire::WriteMultiEntry = wire::read_at(b, skip, i).ok_or(Errno(libc::EINVAL))?;
                    if !e.is_valid() {
                        return Err(Errno(libc::EINVAL));
                    }
                    self.region_bounds(&e.access())?;
                    self.dev.region_write(e.region, e.offset, &e.data[..e.count as usize])?;
                }
                Ok(Vec::new())
            }
            Command::DeviceReset => {
                self.dev.reset();
                Ok(Vec::new())
            }
            Command::DeviceGetRegionIoFds | Command::DmaRead | Command::DmaWrite | Command::DirtyPages => {
                Err(Errno(libc::ENOTSUP))
            }
        }
    }
}

/// Bytes of a region access before its data.
const HEAD: usize = std::mem::size_of::<wire::RegionAccess>();

/// Accepts clients on `listener` one after the other and serves each until
/// it leaves. Returns only when accepting fails.
pub fn serve<D: Device>(listener: &UnixListener, dev: &mut D) -> io::Result<()> {
    serve_with(listener, dev, &ConnectionConfig::default())
}

/// [`serve`] with the given settings.
pub fn serve_with<D: Device>(listener: &UnixListener, dev: &mut D, cfg: &ConnectionConfig) -> io::Result<()> {
    loop {
        let (stream, _) = listener.accept()?;
        info!("vfio-user client connected");
        match Connection::with_config(stream, dev, cfg.clone()).run() {
            Ok(()) => info!("vfio-user client disconnected"),
            Err(e) => warn!("vfio-user connection closed: {e}"),
        }
    }
}
