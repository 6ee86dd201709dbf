//! QEMU's `ivshmem-plain` device (PCI `1af4:1110`) from user space: its
//! BAR 2 is memory shared with every other guest that maps the same host
//! backend (`[guest] ivshmem = true` in a cluster config). No driver is
//! needed: the BAR is mapped through sysfs (`resource2`).
//!
//! Plain shared memory between two VMs, polled by both, is the floor a
//! guest-to-guest interconnect is measured against.

use std::fs;
use std::io;
use std::path::PathBuf;

use guest_mem::{Mapping, MemError, ReadWrite};

/// PCI vendor id of QEMU's virtio and ivshmem devices (Red Hat).
pub const VENDOR_ID: u16 = 0x1af4;
/// PCI device id of `ivshmem-plain` (and `ivshmem-doorbell`).
pub const DEVICE_ID: u16 = 0x1110;
/// The BAR that holds the shared memory.
pub const SHARED_BAR: u32 = 2;

/// Why the shared memory could not be mapped.
#[derive(Debug, thiserror::Error)]
pub enum IvshmemError {
    /// No such PCI function in this guest.
    #[error(
        "no ivshmem device (PCI {VENDOR_ID:04x}:{DEVICE_ID:04x}) in /sys/bus/pci/devices: \
         start the cluster with [guest] ivshmem = true (qemu-configs/latency-bench.toml)"
    )]
    NotFound,
    /// A sysfs step failed.
    #[error("{what}: {err}")]
    Os {
        /// The step.
        what: String,
        /// The OS error.
        err: io::Error,
    },
    /// Mapping the BAR failed.
    #[error("mapping BAR {SHARED_BAR} of the ivshmem device: {0}")]
    Map(#[from] MemError),
    /// The BAR is not what the device should have.
    #[error("{0}")]
    Unexpected(String),
}

fn os(what: impl Into<String>) -> impl FnOnce(io::Error) -> IvshmemError {
    let what = what.into();
    move |err| IvshmemError::Os { what, err }
}

/// The shared memory of the guest's `ivshmem-plain` device, mapped.
pub struct Ivshmem {
    /// PCI address of the device (`0000:00:05.0`).
    pub bdf: String,
    /// The BAR, mapped shared, read and write through its sysfs resource
    /// file: checked volatile accesses, unmapped on drop.
    pub mem: Mapping<ReadWrite>,
}

impl Ivshmem {
    /// Finds the device, enables its memory decoding if nothing has, and
    /// maps BAR 2 shared, read and write.
    pub fn open() -> Result<Ivshmem, IvshmemError> {
        let bdf = match crate::vfio::find_pci(VENDOR_ID, DEVICE_ID) {
            Ok(b) => b,
            Err(crate::vfio::VfioError::NotFound(_)) => return Err(IvshmemError::NotFound),
            Err(e) => return Err(IvshmemError::Unexpected(e.to_string())),
        };
        let dir = PathBuf::from("/sys/bus/pci/devices").join(&bdf);
        // No driver binds this device: make sure the BAR decodes (PCI
        // command register bit 1) before touching it.
        let config = fs::read(dir.join("config")).map_err(os(format!("reading the config space of {bdf}")))?;
        if config.len() < 6 {
            return Err(IvshmemError::Unexpected(format!("config space of {bdf} is only {} bytes", config.len())));
        }
        if config[4] & 0x2 == 0 {
            fs::write(dir.join("enable"), "1").map_err(os(format!("enabling {bdf}")))?;
        }
        // sysfs checks the range of a resource file mapping.
        let mem = Mapping::pci_resource(&bdf, SHARED_BAR)?;
        if mem.len() < 8 {
            return Err(IvshmemError::Unexpected(format!("BAR {SHARED_BAR} of {bdf} is {} bytes", mem.len())));
        }
        Ok(Ivshmem { bdf, mem })
    }
}
