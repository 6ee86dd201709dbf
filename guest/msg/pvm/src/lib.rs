//! PVM 3.4 on UMP and MEMORY CHANNEL, in the manner of Digital's PVM
//! (seed 000, "PVM"): operations run in-line in the calling task, tables
//! every task shares instead of a master daemon, messages over UMP. Built
//! into a drop-in `libpvm3.so.3` (and `libgpvm3.so.3`) for PVM programs
//! built against Debian's PVM 3.4.6 (`scripts/build-pvm.sh`, docs/pvm.md).
//!
//! - [`consts`]: `pvm3.h`'s numbers and error messages.
//! - [`pack`]: message buffers, packing and unpacking.
//! - [`table`]: the task table and the TID layout.
//! - [`engine`]: messages over UMP channels, and the queue of arrived ones.
//! - [`mbox`]: the mailbox (`pvm_putinfo` and the rest).
//! - [`mhf`]: message handlers (`pvm_addmhf`, `pvm_delmhf`).
//! - [`spawn`]: where a spawned program is found.
//! - [`output`]: spawned tasks' output sent as messages (`PvmOutputTid`).
//! - [`console`]: what Debian's console needs beyond `pvm3.h`
//!   (`pvm_halt`, `pvmreset`, ...).
//! - [`repair`]: hosts that fail, repaired out of the tables.
//! - [`ffi`]: the C interface.

pub mod console;
pub mod consts;
pub mod daemon;
pub mod engine;
pub mod ffi;
pub mod group;
pub mod locked;
pub mod mbox;
pub mod mhf;
pub mod notify;
pub mod output;
pub mod pack;
pub mod reduce;
pub mod repair;
pub mod spawn;
pub mod store;
pub mod table;
pub mod vm;
