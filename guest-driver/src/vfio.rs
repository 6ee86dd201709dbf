//! The adapter's driver over Linux VFIO (type 1 IOMMU), from inside a guest.
//!
//! Binding, BAR mapping and DMA setup, in the order a driver does them:
//! 1. [`bind_vfio_pci`]: hand the PCI function to `vfio-pci`.
//! 2. [`VfioDevice::open`]: container, group, IOMMU type, device fd.
//! 3. [`VfioDevice::map_bar`]: mmap a BAR through the device fd.
//! 4. [`VfioDevice::map_dma`]: pin a buffer and map it at an IOVA, so the
//!    adapter's receive DMA lands in it.
//!
//! `unsafe` is confined to the ioctls here (mappings are `guest-mem`'s), each with its SAFETY note.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use guest_mem::{Mapping, MemError, ReadWrite};
use thiserror::Error;
use vfio_bindings::bindings::vfio::{
    vfio_group_status, vfio_iommu_type1_dma_map, vfio_iommu_type1_dma_unmap, vfio_region_info, VFIO_TYPE1v2_IOMMU,
    VFIO_API_VERSION, VFIO_BASE, VFIO_DMA_MAP_FLAG_READ, VFIO_DMA_MAP_FLAG_WRITE, VFIO_GROUP_FLAGS_VIABLE,
    VFIO_IRQ_SET_ACTION_TRIGGER, VFIO_IRQ_SET_DATA_EVENTFD, VFIO_PCI_CONFIG_REGION_INDEX as CONFIG_REGION_INDEX,
    VFIO_REGION_INFO_FLAG_MMAP, VFIO_TYPE, VFIO_TYPE1_IOMMU,
};

/// `VFIO_PCI_MSIX_IRQ_INDEX`: the IRQ index of MSI-X.
pub use vfio_bindings::bindings::vfio::VFIO_PCI_MSIX_IRQ_INDEX as MSIX_IRQ_INDEX;
/// `VFIO_PCI_MSI_IRQ_INDEX`: the IRQ index of MSI.
pub use vfio_bindings::bindings::vfio::VFIO_PCI_MSI_IRQ_INDEX as MSI_IRQ_INDEX;
/// `VFIO_PCI_REQ_IRQ_INDEX`: the guest kernel's request to let the device
/// go (it is being unplugged).
pub use vfio_bindings::bindings::vfio::VFIO_PCI_REQ_IRQ_INDEX as REQ_IRQ_INDEX;

/// Errors of the VFIO driver, each saying what to check.
#[derive(Debug, Error)]
pub enum VfioError {
    /// No PCI function with the adapter's ids.
    #[error("no MEMORY CHANNEL adapter (PCI {0}) found in /sys/bus/pci/devices")]
    NotFound(String),
    /// The device has no IOMMU group: the guest IOMMU is off.
    #[error("{0} has no IOMMU group: boot the guest with intel_iommu=on and an intel-iommu device")]
    NoGroup(String),
    /// The group is held by another process.
    #[error(
        "the adapter is in use by another process (VFIO group {0} busy): imcd owns it when the guest boots \
         with it ([guest] imcd = true); for raw access use a cluster with imcd = false \
         (--config qemu-configs/raw-adapter.toml), or stop the other process"
    )]
    Busy(u32),
    /// A sysfs or ioctl step failed.
    #[error("{what}: {err}")]
    Os {
        /// The step.
        what: String,
        /// The OS error.
        err: io::Error,
    },
    /// Mapping a BAR or a buffer failed.
    #[error("mapping {what}: {err}")]
    Map {
        /// What was mapped.
        what: String,
        /// Why it failed.
        err: MemError,
    },
    /// Something about the device is not what the driver expects.
    #[error("{0}")]
    Unexpected(String),
}

type Result<T> = std::result::Result<T, VfioError>;

fn os(what: impl Into<String>) -> impl FnOnce(io::Error) -> VfioError {
    let what = what.into();
    move |err| VfioError::Os { what, err }
}

/// `_IO(VFIO_TYPE, VFIO_BASE + nr)`: the kernel header defines the ioctl
/// numbers as macros, which the bindings do not carry.
const fn io_nr(nr: u32) -> libc::c_ulong {
    ((VFIO_TYPE << 8) | (VFIO_BASE + nr)) as libc::c_ulong
}
const VFIO_GET_API_VERSION: libc::c_ulong = io_nr(0);
const VFIO_CHECK_EXTENSION: libc::c_ulong = io_nr(1);
const VFIO_SET_IOMMU: libc::c_ulong = io_nr(2);
const VFIO_GROUP_GET_STATUS: libc::c_ulong = io_nr(3);
const VFIO_GROUP_SET_CONTAINER: libc::c_ulong = io_nr(4);
const VFIO_GROUP_GET_DEVICE_FD: libc::c_ulong = io_nr(6);
const VFIO_DEVICE_GET_REGION_INFO: libc::c_ulong = io_nr(8);
const VFIO_DEVICE_GET_IRQ_INFO: libc::c_ulong = io_nr(9);
const VFIO_DEVICE_SET_IRQS: libc::c_ulong = io_nr(10);
const PCI_COMMAND: u64 = 0x04;
const PCI_COMMAND_MEMORY: u16 = 1 << 1;
const PCI_COMMAND_MASTER: u16 = 1 << 2;
const VFIO_IOMMU_MAP_DMA: libc::c_ulong = io_nr(13);
const VFIO_IOMMU_UNMAP_DMA: libc::c_ulong = io_nr(14);

/// Finds the PCI address of the first function with `vendor:device`.
pub fn find_pci(vendor: u16, device: u16) -> Result<String> {
    let ids = format!("{vendor:04x}:{device:04x}");
    let mut found: Vec<String> = Vec::new();
    for e in fs::read_dir("/sys/bus/pci/devices").map_err(os("reading /sys/bus/pci/devices"))?.flatten() {
        let rd = |f: &str| fs::read_to_string(e.path().join(f)).unwrap_or_default();
        if rd("vendor").trim() == format!("0x{vendor:04x}") && rd("device").trim() == format!("0x{device:04x}") {
            found.push(e.file_name().to_string_lossy().into_owned());
        }
    }
    found.sort();
    found.into_iter().next().ok_or(VfioError::NotFound(ids))
}

fn sysfs(bdf: &str) -> PathBuf {
    Path::new("/sys/bus/pci/devices").join(bdf)
}

/// Binds `bdf` to `vfio-pci` (no-op when it already is).
pub fn bind_vfio_pci(bdf: &str) -> Result<()> {
    let dev = sysfs(bdf);
    let driver =
        fs::read_link(dev.join("driver")).ok().and_then(|p| p.file_name().map(|s| s.to_string_lossy().into_owned()));
    if driver.as_deref() == Some("vfio-pci") {
        return Ok(());
    }
    if !Path::new("/sys/bus/pci/drivers/vfio-pci").exists() {
        return Err(VfioError::Unexpected("vfio-pci driver not loaded: modprobe vfio-pci".into()));
    }
    fs::write(dev.join("driver_override"), "vfio-pci").map_err(os(format!("setting driver_override of {bdf}")))?;
    if driver.is_some() {
        fs::write(dev.join("driver/unbind"), bdf).map_err(os(format!("unbinding {bdf}")))?;
    }
    fs::write("/sys/bus/pci/drivers_probe", bdf).map_err(os(format!("probing {bdf}")))?;
    Ok(())
}

/// A region (BAR) of the device.
#[derive(Debug, Clone, Copy)]
pub struct Region {
    /// Offset of the region in the device fd.
    pub offset: u64,
    /// Size.
    pub size: u64,
    /// VFIO region flags.
    pub flags: u32,
}

/// A mapped BAR: a read-write [`Mapping`] of the device fd's region, so
/// every register access is a checked volatile load or store of one width.
pub type Bar = Mapping<ReadWrite>;

/// An open VFIO device with its own container.
pub struct VfioDevice {
    container: File,
    _group: File,
    device: OwnedFd,
    /// PCI address.
    pub bdf: String,
}

fn ioctl_ptr<T>(fd: &impl AsRawFd, req: libc::c_ulong, arg: &mut T, what: &str) -> Result<libc::c_int> {
    // SAFETY: `arg` is a properly sized, initialised struct of the type the
    // ioctl expects (callers pair each request with its struct).
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), req, arg as *mut T) };
    if rc < 0 {
        return Err(VfioError::Os { what: what.into(), err: io::Error::last_os_error() });
    }
    Ok(rc)
}

fn ioctl_val(fd: &impl AsRawFd, req: libc::c_ulong, arg: libc::c_ulong, what: &str) -> Result<libc::c_int> {
    // SAFETY: ioctls that take an integer argument, no memory.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), req, arg) };
    if rc < 0 {
        return Err(VfioError::Os { what: what.into(), err: io::Error::last_os_error() });
    }
    Ok(rc)
}

impl VfioDevice {
    /// Opens `bdf` (already bound to vfio-pci) in a fresh container.
    pub fn open(bdf: &str) -> Result<VfioDevice> {
        let group_link = fs::read_link(sysfs(bdf).join("iommu_group")).map_err(|_| VfioError::NoGroup(bdf.into()))?;
        let group_no: u32 = group_link
            .file_name()
            .and_then(|s| s.to_str())
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| VfioError::Unexpected(format!("odd iommu_group link {}", group_link.display())))?;
        let container =
            OpenOptions::new().read(true).write(true).open("/dev/vfio/vfio").map_err(os("opening /dev/vfio/vfio"))?;
        let api = ioctl_val(&container, VFIO_GET_API_VERSION, 0, "VFIO_GET_API_VERSION")?;
        if api != VFIO_API_VERSION as i32 {
            return Err(VfioError::Unexpected(format!("VFIO API version {api}, expected {VFIO_API_VERSION}")));
        }
        let group = match OpenOptions::new().read(true).write(true).open(format!("/dev/vfio/{group_no}")) {
            Ok(f) => f,
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => return Err(VfioError::Busy(group_no)),
            Err(e) => return Err(VfioError::Os { what: format!("opening /dev/vfio/{group_no}"), err: e }),
        };
        let mut status = vfio_group_status { argsz: std::mem::size_of::<vfio_group_status>() as u32, flags: 0 };
        ioctl_ptr(&group, VFIO_GROUP_GET_STATUS, &mut status, "VFIO_GROUP_GET_STATUS")?;
        if status.flags & VFIO_GROUP_FLAGS_VIABLE == 0 {
            return Err(VfioError::Unexpected(format!(
                "IOMMU group {group_no} is not viable: bind every device in it to vfio-pci"
            )));
        }
        let mut cfd = container.as_raw_fd();
        ioctl_ptr(&group, VFIO_GROUP_SET_CONTAINER, &mut cfd, "VFIO_GROUP_SET_CONTAINER")?;
        let iommu = if ioctl_val(&container, VFIO_CHECK_EXTENSION, VFIO_TYPE1v2_IOMMU as _, "VFIO_CHECK_EXTENSION")? > 0
        {
            VFIO_TYPE1v2_IOMMU
        } else {
            VFIO_TYPE1_IOMMU
        };
        ioctl_val(&container, VFIO_SET_IOMMU, iommu as _, "VFIO_SET_IOMMU")?;
        let name = std::ffi::CString::new(bdf).map_err(|_| VfioError::Unexpected("bad PCI address".into()))?;
        // SAFETY: the ioctl reads a NUL-terminated string and returns a new fd.
        let fd = unsafe { libc::ioctl(group.as_raw_fd(), VFIO_GROUP_GET_DEVICE_FD, name.as_ptr()) };
        if fd < 0 {
            return Err(VfioError::Os {
                what: format!("VFIO_GROUP_GET_DEVICE_FD {bdf}"),
                err: io::Error::last_os_error(),
            });
        }
        // SAFETY: `fd` is a fresh descriptor we own.
        let device = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(VfioDevice { container, _group: group, device, bdf: bdf.into() })
    }

    /// The device fd (what `imcd` hands to processes so they can map the
    /// transmit window themselves).
    pub fn device_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.device.as_fd()
    }

    /// Region `index` (BAR n is index n).
    pub fn region(&self, index: u32) -> Result<Region> {
        let mut info =
            vfio_region_info { argsz: std::mem::size_of::<vfio_region_info>() as u32, index, ..Default::default() };
        ioctl_ptr(&self.device, VFIO_DEVICE_GET_REGION_INFO, &mut info, "VFIO_DEVICE_GET_REGION_INFO")?;
        Ok(Region { offset: info.offset, size: info.size, flags: info.flags })
    }

    /// Maps BAR `index` into this process.
    pub fn map_bar(&self, index: u32) -> Result<Bar> {
        let r = self.region(index)?;
        if r.size == 0 {
            return Err(VfioError::Unexpected(format!("BAR {index} is not implemented by the device")));
        }
        if r.flags & VFIO_REGION_INFO_FLAG_MMAP == 0 {
            return Err(VfioError::Unexpected(format!("BAR {index} cannot be mmapped (region flags {:#x})", r.flags)));
        }
        let fd = self.device.try_clone().map_err(os(format!("dup of the device fd for BAR {index}")))?;
        Mapping::device_region(fd, r.offset, r.size as usize)
            .map_err(|e| VfioError::Map { what: format!("BAR {index}"), err: e })
    }

    /// Maps all of `mem` at `iova` for device DMA (read and write). The
    /// pages are pinned until unmapped or closed; the kernel keeps them
    /// even if `mem` is unmapped first.
    pub fn map_dma(&self, mem: &Mapping<ReadWrite>, iova: u64) -> Result<()> {
        let mut m = vfio_iommu_type1_dma_map {
            argsz: std::mem::size_of::<vfio_iommu_type1_dma_map>() as u32,
            flags: VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE,
            vaddr: mem.as_ptr() as u64,
            iova,
            size: mem.len() as u64,
        };
        ioctl_ptr(&self.container, VFIO_IOMMU_MAP_DMA, &mut m, "VFIO_IOMMU_MAP_DMA")?;
        Ok(())
    }

    /// Undoes [`VfioDevice::map_dma`].
    pub fn unmap_dma(&self, iova: u64, size: u64) -> Result<()> {
        let mut m = vfio_iommu_type1_dma_unmap {
            argsz: std::mem::size_of::<vfio_iommu_type1_dma_unmap>() as u32,
            flags: 0,
            iova,
            size,
        };
        ioctl_ptr(&self.container, VFIO_IOMMU_UNMAP_DMA, &mut m, "VFIO_IOMMU_UNMAP_DMA")?;
        Ok(())
    }

    /// Reads `buf.len()` bytes of PCI configuration space at `off`.
    pub fn config_read(&self, off: u64, buf: &mut [u8]) -> Result<()> {
        let r = self.region(CONFIG_REGION_INDEX)?;
        // SAFETY: pread into our own buffer.
        let n = unsafe {
            libc::pread(self.device.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), (r.offset + off) as libc::off_t)
        };
        if n != buf.len() as isize {
            return Err(VfioError::Os {
                what: format!("reading config space at {off:#x}"),
                err: io::Error::last_os_error(),
            });
        }
        Ok(())
    }

    /// Writes PCI configuration space at `off`.
    pub fn config_write(&self, off: u64, data: &[u8]) -> Result<()> {
        let r = self.region(CONFIG_REGION_INDEX)?;
        // SAFETY: pwrite from our own buffer.
        let n = unsafe {
            libc::pwrite(self.device.as_raw_fd(), data.as_ptr().cast(), data.len(), (r.offset + off) as libc::off_t)
        };
        if n != data.len() as isize {
            return Err(VfioError::Os {
                what: format!("writing config space at {off:#x}"),
                err: io::Error::last_os_error(),
            });
        }
        Ok(())
    }

    /// Turns on memory decoding and bus mastering (DMA and MSI-X need it;
    /// vfio-pci leaves it to the userspace driver).
    pub fn enable_bus_master(&self) -> Result<()> {
        let mut cmd = [0u8; 2];
        self.config_read(PCI_COMMAND, &mut cmd)?;
        let v = u16::from_le_bytes(cmd) | PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER;
        self.config_write(PCI_COMMAND, &v.to_le_bytes())
    }

    /// How many vectors interrupt `index` has (0: the device has none).
    pub fn irq_count(&self, index: u32) -> Result<u32> {
        // struct vfio_irq_info { argsz, flags, index, count }
        let mut info = [0u32; 4];
        info[0] = std::mem::size_of_val(&info) as u32;
        info[2] = index;
        ioctl_ptr(&self.device, VFIO_DEVICE_GET_IRQ_INFO, &mut info, "VFIO_DEVICE_GET_IRQ_INFO")?;
        Ok(info[3])
    }

    /// Routes interrupt `index` vector `vector` to `eventfd` (MSI-X: the
    /// guest kernel enables MSI-X on the device when the first vector is set).
    pub fn set_irq_eventfd(&self, index: u32, vector: u32, eventfd: &OwnedFd) -> Result<()> {
        // struct vfio_irq_set { argsz, flags, index, start, count; s32 data[count] }
        let mut buf = [0u32; 6];
        buf[0] = std::mem::size_of_val(&buf) as u32;
        buf[1] = VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER;
        buf[2] = index;
        buf[3] = vector;
        buf[4] = 1;
        buf[5] = eventfd.as_raw_fd() as u32;
        ioctl_ptr(&self.device, VFIO_DEVICE_SET_IRQS, &mut buf, "VFIO_DEVICE_SET_IRQS")?;
        Ok(())
    }
}
