//! Fuzz target: the vfio-user server (`device::vfio_user::Connection`), fed
//! a byte stream (and some fds) over a real socket pair, as QEMU would.
//!
//! Input: byte 0 = fds to attach (0..=15), byte 1 = where in the stream
//! they ride (a fraction of its length), the rest = the stream. The device
//! behind the server checks the promises the server makes it (bounds of
//! region accesses and of interrupt ranges checked before the call); the
//! run checks that no fd is leaked and that the server ends when the client
//! closes.
#![no_main]

use std::io::{IoSlice, Read};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

use device::vfio_user::{irq, region, region_flags, Connection, Device, Errno, Header, IrqSet, RegionInfo, HDR_LEN};
use libfuzzer_sys::fuzz_target;
use vm_memory::ByteValued;
use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};

/// Region sizes by index (BAR0..BAR5, ROM, config, VGA).
const REGIONS: [u64; 9] = [64, 0, 256, 0, 0, 0, 0, 256, 0];
/// Vectors by IRQ index (INTx, MSI, MSI-X, ERR, REQ).
const IRQS: [u32; 5] = [1, 4, 0, 1, 1];

struct Fake {
    bar2: Vec<u8>,
}

impl Fake {
    fn size(index: u32) -> u64 {
        REGIONS.get(index as usize).copied().unwrap_or(0)
    }
    fn in_bounds(index: u32, offset: u64, len: usize) {
        assert!(index < region::COUNT, "region {index} reached the device");
        assert!(len > 0, "empty access reached the device");
        let end = offset.checked_add(len as u64).expect("access wraps");
        assert!(end <= Self::size(index), "access {offset:#x}+{len} past region {index}");
    }
}

impl Device for Fake {
    fn region_info(&self, index: u32) -> RegionInfo {
        RegionInfo { size: Self::size(index), flags: region_flags::READ | region_flags::WRITE }
    }
    fn irq_count(&self, index: u32) -> u32 {
        IRQS.get(index as usize).copied().unwrap_or(0)
    }
    fn region_read(&mut self, index: u32, offset: u64, data: &mut [u8]) -> Result<(), Errno> {
        Self::in_bounds(index, offset, data.len());
        match index {
            2 => data.copy_from_slice(&self.bar2[offset as usize..offset as usize + data.len()]),
            region::CONFIG => return Err(Errno(libc::EIO)),
            _ => data.fill(0xA5),
        }
        Ok(())
    }
    fn region_write(&mut self, index: u32, offset: u64, data: &[u8]) -> Result<(), Errno> {
        Self::in_bounds(index, offset, data.len());
        if index == 2 {
            self.bar2[offset as usize..offset as usize + data.len()].copy_from_slice(data);
        }
        Ok(())
    }
    fn dma_map(&mut self, _iova: u64, size: u64, _fd: Option<OwnedFd>, _offset: u64, _flags: u32) -> Result<(), Errno> {
        if size == 0 {
            return Err(Errno(libc::EINVAL));
        }
        Ok(())
    }
    fn dma_unmap(&mut self, _iova: u64, _size: u64, _all: bool) -> Result<(), Errno> {
        Ok(())
    }
    fn set_irqs(&mut self, req: IrqSet) -> Result<(), Errno> {
        assert!(req.index < irq::COUNT, "IRQ index {} reached the device", req.index);
        if req.count != 0 {
            let end = req.start.checked_add(req.count).expect("IRQ range wraps");
            assert!(end <= self.irq_count(req.index), "IRQ range {}+{} past index {}", req.start, req.count, req.index);
        }
        if req.flags & irq::DATA_BOOL != 0 {
            assert_eq!(req.bools.len(), req.count as usize, "one bool per vector");
        }
        if req.flags & irq::DATA_EVENTFD != 0 {
            assert!(req.fds.is_empty() || req.fds.len() == req.count as usize, "one fd per vector");
        }
        Ok(())
    }
    fn reset(&mut self) {
        self.bar2.fill(0);
    }
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0)
}

/// Queues `bytes` with `fds` attached on the socket, without blocking
/// (what does not fit is dropped) and without SIGPIPE.
fn send(sock: &UnixStream, bytes: &[u8], fds: &[OwnedFd]) {
    let raw: Vec<i32> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let mut sent = 0;
    while sent < bytes.len() {
        let iov = [IoSlice::new(&bytes[sent..])];
        let cmsg = [ControlMessage::ScmRights(&raw)];
        let cmsgs: &[ControlMessage] = if sent == 0 && !raw.is_empty() { &cmsg } else { &[] };
        match sendmsg::<()>(sock.as_raw_fd(), &iov, cmsgs, MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT, None) {
            Ok(n) => sent += n,
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return,
        }
    }
}

fuzz_target!(init: fuzz::write_seeds(fuzz::vfio_user()), |data: &[u8]| {
    // Header decoding is total and round-trips.
    if let Some(h) = data.get(..HDR_LEN) {
        let parsed: Header = vfio_user_wire::read(h).expect("a header's bytes");
        assert_eq!(parsed.as_slice(), h);
    }
    let (nfds, split, stream) = match data {
        [a, b, rest @ ..] => ((a % 16) as usize, *b as usize * rest.len() / 256, rest),
        _ => return,
    };
    let before = open_fds();
    {
        let (client, server) = UnixStream::pair().unwrap();
        let devnull = std::fs::File::open("/dev/null").unwrap();
        let fds: Vec<OwnedFd> = (0..nfds).map(|_| OwnedFd::from(devnull.try_clone().unwrap())).collect();
        let mut dev = Fake { bar2: vec![0; REGIONS[2] as usize] };
        // The whole stream is queued before the server starts (inputs are
        // far smaller than the socket buffer); one thread drains the replies.
        let (head, tail) = stream.split_at(split);
        send(&client, head, &[]);
        send(&client, tail, &fds);
        drop(fds);
        client.shutdown(std::net::Shutdown::Write).unwrap();
        std::thread::scope(|s| {
            let drain = s.spawn(move || {
                let mut replies = Vec::new();
                let _ = (&client).read_to_end(&mut replies);
            });
            let _ = Connection::new(server, &mut dev).run();
            // Joined, not just waited for: the thread has exited (its
            // thread-local destructors ran) before the leak check.
            drain.join().unwrap();
        });
    }
    assert_eq!(open_fds(), before, "fds leaked");
});
