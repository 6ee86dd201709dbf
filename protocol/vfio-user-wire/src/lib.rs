//! vfio-user's wire format as types: the message header, the fixed part of
//! every request and reply body the adapter's server handles, and their
//! flag words, as `#[repr(C)]` structs with vm-memory's [`ByteValued`] (the
//! way rust-vmm's `vhost_user::message` does it). No I/O: the server
//! (`device/src/vfio_user.rs`), the in-process test client
//! (`tests/tests/common/mod.rs`) and the fuzz seeds (`fuzz/src/lib.rs`)
//! all encode and decode through this crate. Used by whichever thread
//! serves or drives a connection; it holds no state.
//!
//! vfio-user is little-endian; so are the hosts this builds for (checked at
//! compile time), so a struct's bytes are its wire bytes.
//!
//! # Header (16 bytes)
//!
//! ```text
//!  0        2         4              8              12             16
//! +--------+---------+--------------+--------------+--------------+
//! | msg id | command | size (total) | flags        | error (errno)|
//! +--------+---------+--------------+--------------+--------------+
//! flags: bits 0-3 type (0 request, 1 reply), bit 4 NO_REPLY, bit 5 ERROR
//! ```

use bitflags::bitflags;
use vfio_bindings::bindings::vfio as v;
use vm_memory::ByteValued;

#[cfg(target_endian = "big")]
compile_error!("vfio-user-wire maps structs onto little-endian wire bytes");

/// Header length.
pub const HDR_LEN: usize = std::mem::size_of::<Header>();
/// Entries in a `REGION_WRITE_MULTI` message, as QEMU defines it.
pub const MULTI_MAX: usize = 200;
/// Data bytes in one `REGION_WRITE_MULTI` entry.
pub const MULTI_DATA: usize = 8;

/// vfio-user commands (`Command::try_from(u16)` gives back unknown numbers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, num_enum::TryFromPrimitive)]
#[num_enum(error_type(name = u16, constructor = std::convert::identity))]
#[repr(u16)]
pub enum Command {
    /// Version and capability negotiation.
    Version = 1,
    /// Map guest memory for DMA.
    DmaMap = 2,
    /// Unmap guest memory.
    DmaUnmap = 3,
    /// Number of regions and IRQ types.
    DeviceGetInfo = 4,
    /// One region's size and flags.
    DeviceGetRegionInfo = 5,
    /// ioeventfd/ioregionfd setup (not offered).
    DeviceGetRegionIoFds = 6,
    /// One IRQ type's vector count.
    DeviceGetIrqInfo = 7,
    /// Set up, trigger, mask or unmask interrupts.
    DeviceSetIrqs = 8,
    /// Read a region.
    RegionRead = 9,
    /// Write a region.
    RegionWrite = 10,
    /// Server-initiated DMA read (not used: memory is shared).
    DmaRead = 11,
    /// Server-initiated DMA write (not used).
    DmaWrite = 12,
    /// Reset the device.
    DeviceReset = 13,
    /// Dirty page tracking (not offered).
    DirtyPages = 14,
    /// Several small posted region writes in one message.
    RegionWriteMulti = 15,
}

bitflags! {
    /// The header's flag word.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct HeaderFlags: u32 {
        /// Type: reply (a request has type 0).
        const REPLY = 1;
        /// The sender wants no reply (posted write).
        const NO_REPLY = 0x10;
        /// The reply reports an error in the `error` field.
        const ERROR = 0x20;
    }
}

/// Mask of the message type in [`HeaderFlags`].
pub const TYPE_MASK: u32 = 0xF;

bitflags! {
    /// `VFIO_DMA_MAP_FLAG_*` / `VFIO_DMA_UNMAP_FLAG_*`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct DmaFlags: u32 {
        /// Device may read.
        const READ = v::VFIO_DMA_MAP_FLAG_READ;
        /// Device may write.
        const WRITE = v::VFIO_DMA_MAP_FLAG_WRITE;
        /// Unmap everything (`VFIO_DMA_UNMAP_FLAG_ALL`, Linux 5.12; newer
        /// than the 5.0 header vfio-bindings carries).
        const UNMAP_ALL = 1 << 1;
    }
}

bitflags! {
    /// `VFIO_IRQ_SET_*`: one data kind and one action.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct IrqSetFlags: u32 {
        /// No data.
        const DATA_NONE = v::VFIO_IRQ_SET_DATA_NONE;
        /// One bool per vector follows.
        const DATA_BOOL = v::VFIO_IRQ_SET_DATA_BOOL;
        /// One eventfd per vector, passed as fds.
        const DATA_EVENTFD = v::VFIO_IRQ_SET_DATA_EVENTFD;
        /// Mask.
        const ACTION_MASK = v::VFIO_IRQ_SET_ACTION_MASK;
        /// Unmask.
        const ACTION_UNMASK = v::VFIO_IRQ_SET_ACTION_UNMASK;
        /// Trigger, or set the trigger eventfds.
        const ACTION_TRIGGER = v::VFIO_IRQ_SET_ACTION_TRIGGER;
    }
}

impl IrqSetFlags {
    /// The data-kind bits.
    pub const DATA: IrqSetFlags = IrqSetFlags::DATA_NONE.union(IrqSetFlags::DATA_BOOL).union(IrqSetFlags::DATA_EVENTFD);
    /// The action bits.
    pub const ACTION: IrqSetFlags =
        IrqSetFlags::ACTION_MASK.union(IrqSetFlags::ACTION_UNMASK).union(IrqSetFlags::ACTION_TRIGGER);
}

bitflags! {
    /// `VFIO_REGION_INFO_FLAG_*`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct RegionFlags: u32 {
        /// Readable.
        const READ = v::VFIO_REGION_INFO_FLAG_READ;
        /// Writable.
        const WRITE = v::VFIO_REGION_INFO_FLAG_WRITE;
        /// Mappable (never offered by the adapter: it would turn off
        /// posted writes).
        const MMAP = v::VFIO_REGION_INFO_FLAG_MMAP;
    }
}

/// A message header.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Header {
    /// Message id, echoed in the reply.
    pub id: u16,
    /// Raw command number ([`Command`]).
    pub command: u16,
    /// Total size including this header.
    pub size: u32,
    /// [`HeaderFlags`] and the type in [`TYPE_MASK`].
    pub flags: u32,
    /// errno in error replies.
    pub error: u32,
}

impl Header {
    /// A request of `command` with `body` bytes after the header.
    pub fn request(id: u16, command: Command, body: usize, flags: HeaderFlags) -> Header {
        Header { id, command: command as u16, size: (HDR_LEN + body) as u32, flags: flags.bits(), error: 0 }
    }

    /// The reply to `self` with `body` bytes, or an error reply with `errno`.
    pub fn reply(&self, body: usize, errno: Option<i32>) -> Header {
        let (flags, error) = match errno {
            None => (HeaderFlags::REPLY, 0),
            Some(e) => (HeaderFlags::REPLY | HeaderFlags::ERROR, e as u32),
        };
        Header { id: self.id, command: self.command, size: (HDR_LEN + body) as u32, flags: flags.bits(), error }
    }

    /// The flag bits (unknown ones kept).
    pub fn flags(&self) -> HeaderFlags {
        HeaderFlags::from_bits_retain(self.flags)
    }

    /// The message type (0 request, 1 reply).
    pub fn kind(&self) -> u32 {
        self.flags & TYPE_MASK
    }

    /// Whether it frames a message: at least a header long.
    pub fn is_valid(&self) -> bool {
        self.size as usize >= HDR_LEN
    }
}

/// `VERSION`'s fixed part; the capabilities (JSON, NUL-terminated) follow.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Version {
    /// Major version (0).
    pub major: u16,
    /// Minor version.
    pub minor: u16,
}

/// `DMA_MAP` (`struct vfio_user_dma_map`); the file arrives as an fd.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DmaMap {
    /// Size of this struct.
    pub argsz: u32,
    /// [`DmaFlags`].
    pub flags: u32,
    /// Offset of the memory in the fd.
    pub offset: u64,
    /// Guest (IO virtual) address.
    pub addr: u64,
    /// Bytes.
    pub size: u64,
}

impl DmaMap {
    /// The flag bits (unknown ones kept).
    pub fn flags(&self) -> DmaFlags {
        DmaFlags::from_bits_retain(self.flags)
    }
}

/// `DMA_UNMAP` (`struct vfio_user_dma_unmap`); its reply echoes it.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DmaUnmap {
    /// Size of this struct.
    pub argsz: u32,
    /// [`DmaFlags`] (`UNMAP_ALL`).
    pub flags: u32,
    /// Guest address.
    pub addr: u64,
    /// Bytes.
    pub size: u64,
}

impl DmaUnmap {
    /// The flag bits (unknown ones kept).
    pub fn flags(&self) -> DmaFlags {
        DmaFlags::from_bits_retain(self.flags)
    }
}

/// `DEVICE_GET_INFO` (`struct vfio_device_info`), request and reply.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Size of this struct.
    pub argsz: u32,
    /// `VFIO_DEVICE_FLAGS_*`.
    pub flags: u32,
    /// Region indexes.
    pub num_regions: u32,
    /// IRQ indexes.
    pub num_irqs: u32,
}

/// What a `DEVICE_GET_REGION_INFO` or `DEVICE_GET_IRQ_INFO` request must
/// carry: the head of [`RegionInfo`] or [`IrqInfo`], up to the index (the
/// rest of a request is not read).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InfoRequest {
    /// Size of the whole struct the client passes.
    pub argsz: u32,
    /// Unused in a request.
    pub flags: u32,
    /// Region or IRQ index.
    pub index: u32,
}

/// `DEVICE_GET_REGION_INFO` (`struct vfio_region_info`), request and reply.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RegionInfo {
    /// Size of this struct.
    pub argsz: u32,
    /// [`RegionFlags`].
    pub flags: u32,
    /// Region index.
    pub index: u32,
    /// Offset of the capability chain (0: none).
    pub cap_offset: u32,
    /// Bytes (0: absent).
    pub size: u64,
    /// Offset for mmap (unused: nothing is mappable).
    pub offset: u64,
}

/// `DEVICE_GET_IRQ_INFO` (`struct vfio_irq_info`), request and reply.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IrqInfo {
    /// Size of this struct.
    pub argsz: u32,
    /// `VFIO_IRQ_INFO_*`.
    pub flags: u32,
    /// IRQ index.
    pub index: u32,
    /// Vectors.
    pub count: u32,
}

/// `DEVICE_SET_IRQS` (`struct vfio_irq_set`); with `DATA_BOOL`, `count`
/// bools follow, with `DATA_EVENTFD` the fds come with the message.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IrqSet {
    /// Size of this struct and its data.
    pub argsz: u32,
    /// [`IrqSetFlags`].
    pub flags: u32,
    /// IRQ index.
    pub index: u32,
    /// First vector.
    pub start: u32,
    /// Vectors.
    pub count: u32,
}

impl IrqSet {
    /// The flag bits (unknown ones kept).
    pub fn flags(&self) -> IrqSetFlags {
        IrqSetFlags::from_bits_retain(self.flags)
    }

    /// Exactly one data kind and one action (other bits are the
    /// device's to judge).
    pub fn is_valid(&self) -> bool {
        let f = self.flags();
        f.intersection(IrqSetFlags::DATA).bits().count_ones() == 1
            && f.intersection(IrqSetFlags::ACTION).bits().count_ones() == 1
    }
}

/// `REGION_READ` and `REGION_WRITE`'s fixed part (`struct
/// vfio_user_region_access`); a write's data, and a read reply's, follow.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RegionAccess {
    /// Offset in the region.
    pub offset: u64,
    /// Region index.
    pub region: u32,
    /// Bytes.
    pub count: u32,
}

impl RegionAccess {
    /// At least one byte, at most `max` (the advertised
    /// `max_data_xfer_size`), and no wrap of the offset.
    pub fn is_valid(&self, max: usize) -> bool {
        self.count != 0 && self.count as usize <= max && self.offset.checked_add(self.count as u64).is_some()
    }
}

/// `REGION_WRITE_MULTI`'s count; [`WriteMultiEntry`]s follow.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteMulti {
    /// Entries that follow (at most [`MULTI_MAX`]).
    pub count: u64,
}

/// One posted write of a `REGION_WRITE_MULTI` (QEMU's
/// `VFIOUserRegionWriteMultiEntry`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteMultiEntry {
    /// Offset in the region.
    pub offset: u64,
    /// Region index.
    pub region: u32,
    /// Bytes of `data` used (1 to [`MULTI_DATA`]).
    pub count: u32,
    /// The bytes.
    pub data: [u8; MULTI_DATA],
}

impl WriteMultiEntry {
    /// The region access it makes (offset, region, bytes).
    pub fn access(&self) -> RegionAccess {
        RegionAccess { offset: self.offset, region: self.region, count: self.count }
    }

    /// Between 1 and [`MULTI_DATA`] bytes.
    pub fn is_valid(&self) -> bool {
        (1..=MULTI_DATA).contains(&(self.count as usize))
    }
}

/// Makes each wire struct `ByteValued`, with a compile-time check that
/// its size is the protocol's (the sum of its fields: no padding).
macro_rules! wire_structs {
    ($($t:ty = $size:expr),* $(,)?) => {
        $(
            const _: () = assert!(std::mem::size_of::<$t>() == $size);
            // SAFETY: the struct is `#[repr(C)]` and made only of integers
            // and byte arrays, and its size (asserted just above) is the sum
            // of its fields', so it has no padding: every byte pattern is a
            // valid value and none of its bytes is uninitialised.
            unsafe impl ByteValued for $t {}
        )*
    };
}

wire_structs!(
    Header = 16,
    Version = 4,
    DmaMap = 32,
    DmaUnmap = 24,
    DeviceInfo = 16,
    InfoRequest = 12,
    RegionInfo = 32,
    IrqInfo = 16,
    IrqSet = 20,
    RegionAccess = 16,
    WriteMulti = 8,
    WriteMultiEntry = 24,
);

/// The `T` at the start of `b`, copied out (a message body need not be
/// aligned); `None` if `b` is shorter than `T`.
pub fn read<T: ByteValued + Default>(b: &[u8]) -> Option<T> {
    let mut t = T::default();
    let n = std::mem::size_of::<T>();
    t.as_mut_slice().copy_from_slice(b.get(..n)?);
    Some(t)
}

/// The `i`th `T` after `skip` bytes of `b` (an array of entries after a
/// fixed part), or `None` if `b` is too short.
pub fn read_at<T: ByteValued + Default>(b: &[u8], skip: usize, i: usize) -> Option<T> {
    read(b.get(skip.checked_add(i.checked_mul(std::mem::size_of::<T>())?)?..)?)
}

/// A whole message: `header`, then each part's bytes.
pub fn message(header: Header, parts: &[&[u8]]) -> Vec<u8> {
    let mut m = Vec::with_capacity(header.size as usize);
    m.extend_from_slice(header.as_slice());
    for p in parts {
        m.extend_from_slice(p);
    }
    m
}

/// A request message: a header for `command` over `parts`.
pub fn request(id: u16, command: Command, flags: HeaderFlags, parts: &[&[u8]]) -> Vec<u8> {
    let body = parts.iter().map(|p| p.len()).sum();
    message(Header::request(id, command, body, flags), parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_is_its_wire_bytes() {
        let h = Header::request(0x0102, Command::RegionWrite, 24, HeaderFlags::NO_REPLY);
        assert_eq!(h.as_slice(), &[2, 1, 10, 0, 40, 0, 0, 0, 0x10, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(read::<Header>(h.as_slice()), Some(h));
        assert!(h.is_valid());
        assert!(!Header { size: 15, ..h }.is_valid());
        let r = h.reply(8, Some(22));
        assert_eq!(
            (r.id, r.kind(), r.flags().contains(HeaderFlags::ERROR), r.error, r.size),
            (0x0102, 1, true, 22, 24)
        );
    }

    #[test]
    fn short_bodies_do_not_decode_and_unaligned_ones_do() {
        let a = RegionAccess { offset: 0x1122_3344_5566_7788, region: 2, count: 8 };
        let mut b = vec![0xAAu8];
        b.extend_from_slice(a.as_slice());
        assert_eq!(read::<RegionAccess>(&b[1..]), Some(a));
        assert_eq!(read::<RegionAccess>(&b[1..16]), None);
        assert_eq!(read_at::<RegionAccess>(&b, 1, 0), Some(a));
        assert_eq!(read_at::<RegionAccess>(&b, 1, 1), None);
        assert_eq!(read_at::<RegionAccess>(&b, usize::MAX, 1), None);
    }

    #[test]
    fn irq_set_wants_one_data_kind_and_one_action() {
        let s = |f: IrqSetFlags| IrqSet { flags: f.bits(), ..Default::default() };
        assert!(s(IrqSetFlags::DATA_EVENTFD | IrqSetFlags::ACTION_TRIGGER).is_valid());
        assert!(s(IrqSetFlags::DATA_BOOL | IrqSetFlags::ACTION_MASK).is_valid());
        assert!(!s(IrqSetFlags::ACTION_TRIGGER).is_valid());
        assert!(!s(IrqSetFlags::DATA_NONE | IrqSetFlags::DATA_BOOL | IrqSetFlags::ACTION_MASK).is_valid());
        assert!(!s(IrqSetFlags::DATA_NONE | IrqSetFlags::ACTION_MASK | IrqSetFlags::ACTION_UNMASK).is_valid());
    }

    #[test]
    fn accesses_and_multi_entries_are_bounded() {
        let a = |offset, count| RegionAccess { offset, region: 0, count };
        assert!(a(0, 4).is_valid(1 << 20));
        assert!(!a(0, 0).is_valid(1 << 20));
        assert!(!a(0, (1 << 20) + 1).is_valid(1 << 20));
        assert!(!a(u64::MAX - 1, 4).is_valid(1 << 20));
        let e = |count| WriteMultiEntry { count, ..Default::default() };
        assert!(e(1).is_valid() && e(8).is_valid());
        assert!(!e(0).is_valid() && !e(9).is_valid());
    }

    #[test]
    fn a_request_is_header_then_parts() {
        let m = request(
            7,
            Command::DmaUnmap,
            HeaderFlags::empty(),
            &[DmaUnmap { argsz: 24, ..Default::default() }.as_slice()],
        );
        assert_eq!(m.len(), HDR_LEN + 24);
        let h: Header = read(&m).unwrap();
        assert_eq!((h.id, h.command, h.size as usize), (7, Command::DmaUnmap as u16, m.len()));
        assert_eq!(read::<DmaUnmap>(&m[HDR_LEN..]).unwrap().argsz, 24);
    }
}
