//! The billboard in a shared file on one machine (`BBP_SHM`, a file in
//! `/dev/shm` that every process of the job maps): the same protocol
//! without MEMORY CHANNEL, so that programs and the C library run and are
//! tested where there is no adapter. x86's store order gives what the
//! protocol needs (one writer's stores are seen in order); nothing is ever
//! lost, so there is no error count. A process is alive while
//! `/proc/<pid>` exists.
//!
//! Touched by the thread that owns the endpoint.

use std::path::{Path, PathBuf};

use guest_mem::{Mapping, ReadWrite};

use crate::layout::Geometry;
use crate::proto::{BbpError, Bus};

/// The billboard in a file.
pub struct ShmBus {
    map: Mapping<ReadWrite>,
    path: PathBuf,
}

impl ShmBus {
    /// Maps (creating it if needed) the file `path`, sized for `geo`.
    pub fn open(path: &Path, geo: &Geometry) -> Result<ShmBus, BbpError> {
        let map = Mapping::create(path, geo.bytes())
            .map_err(|e| BbpError::Setup(format!("the billboard file {}: {e}", path.display())))?;
        Ok(ShmBus { map, path: path.to_owned() })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Bus for ShmBus {
    fn store(&self, w: usize, v: u64) {
        // In bounds: the file was sized for the geometry.
        let _ = self.map.store_release::<u64>(w * 8, v);
    }
    fn load(&self, w: usize) -> u64 {
        self.map.load_acquire::<u64>(w * 8).unwrap_or(0)
    }
    fn store_bytes(&self, w: usize, src: &[u8]) {
        // Published by the release store of the MESSAGE flag that follows.
        let _ = self.map.write(w * 8, src);
    }
    fn load_bytes(&self, w: usize, dst: &mut [u8]) {
        let _ = self.map.read(w * 8, dst);
    }
    fn alive(&self, who: u64) -> Result<(), String> {
        let pid = who as u32;
        if Path::new(&format!("/proc/{pid}")).exists() {
            Ok(())
        } else {
            Err(format!("process {pid} exited"))
        }
    }
}
