//! PVM 3.4's numbers, as `include/pvm3.h` declares them for C: error
//! codes and their messages, data encodings, packing type codes, spawn
//! flags, options and notification kinds. Pure data; no thread touches
//! anything here.

/// Error codes (`pvm3.h`: `PvmOk` ... `PvmIPLoopback`).
pub mod err {
    pub const OK: i32 = 0;
    pub const BAD_PARAM: i32 = -2;
    pub const MISMATCH: i32 = -3;
    pub const OVERFLOW: i32 = -4;
    pub const NO_DATA: i32 = -5;
    pub const NO_HOST: i32 = -6;
    pub const NO_FILE: i32 = -7;
    pub const DENIED: i32 = -8;
    pub const NO_MEM: i32 = -10;
    pub const BAD_MSG: i32 = -12;
    pub const SYS_ERR: i32 = -14;
    pub const NO_BUF: i32 = -15;
    pub const NO_SUCH_BUF: i32 = -16;
    pub const NULL_GROUP: i32 = -17;
    pub const DUP_GROUP: i32 = -18;
    pub const NO_GROUP: i32 = -19;
    pub const NOT_IN_GROUP: i32 = -20;
    pub const NO_INST: i32 = -21;
    pub const HOST_FAIL: i32 = -22;
    pub const NO_PARENT: i32 = -23;
    pub const NOT_IMPL: i32 = -24;
    pub const D_SYS_ERR: i32 = -25;
    pub const BAD_VERSION: i32 = -26;
    pub const OUT_OF_RES: i32 = -27;
    pub const DUP_HOST: i32 = -28;
    pub const CANT_START: i32 = -29;
    pub const ALREADY: i32 = -30;
    pub const NO_TASK: i32 = -31;
    pub const NOT_FOUND: i32 = -32;
    pub const EXISTS: i32 = -33;
    pub const HOSTR_N_MSTR: i32 = -34;
    pub const PARENT_NOT_SET: i32 = -35;
    pub const IP_LOOPBACK: i32 = -36;
}

/// The message of error code `-i` (index `i` of `pvm_errlist`, which C
/// programs read), in PVM's words; codes PVM does not use say so.
pub const ERRLIST: [&std::ffi::CStr; 37] = [
    c"Error 0",
    c"Error 1",
    c"Bad parameter",
    c"Count mismatch",
    c"Value too large",
    c"End of buffer",
    c"No such host",
    c"No such file",
    c"Permission denied",
    c"Error 9",
    c"Malloc failed",
    c"Error 11",
    c"Can't decode message",
    c"Error 13",
    c"Can't contact local daemon",
    c"No current buffer",
    c"No such buffer",
    c"Null group name",
    c"Already in group",
    c"No such group",
    c"Not in group",
    c"No such instance",
    c"Host failed",
    c"No parent task",
    c"Not implemented",
    c"Pvmd system error",
    c"Version mismatch",
    c"Out of resources",
    c"Duplicate host",
    c"Can't start pvmd",
    c"Already in progress",
    c"No such task",
    c"Not Found",
    c"Already exists",
    c"Host not in master",
    c"Parent not set",
    c"IP address is loopback",
];

/// The message of error code `code` (negative), or "Unknown error".
pub fn message(code: i32) -> &'static str {
    match code.checked_neg().and_then(|i| usize::try_from(i).ok()) {
        Some(i) if i < ERRLIST.len() => ERRLIST[i].to_str().unwrap_or("Unknown error"),
        _ => "Unknown error",
    }
}

/// Message encodings (`pvm_initsend`, `pvm_mkbuf`).
pub const DATA_DEFAULT: i32 = 0;
pub const DATA_RAW: i32 = 1;
pub const DATA_IN_PLACE: i32 = 2;
pub const DATA_TRACE: i32 = 4;

/// `pvm_spawn` flags.
pub const TASK_HOST: i32 = 1;
pub const TASK_ARCH: i32 = 2;
pub const TASK_DEBUG: i32 = 4;
pub const TASK_TRACE: i32 = 8;
pub const MPP_FRONT: i32 = 16;
pub const HOST_COMPL: i32 = 32;
pub const NO_SPAWN_PARENT: i32 = 64;

/// `pvm_notify` kinds, and the flag that cancels one.
pub const TASK_EXIT: i32 = 1;
pub const HOST_DELETE: i32 = 2;
pub const HOST_ADD: i32 = 3;
pub const NOTIFY_CANCEL: i32 = 256;

/// `pvm_setopt` / `pvm_getopt` options.
pub mod opt {
    pub const ROUTE: i32 = 1;
    pub const DEBUG_MASK: i32 = 2;
    pub const AUTO_ERR: i32 = 3;
    pub const OUTPUT_TID: i32 = 4;
    pub const OUTPUT_CODE: i32 = 5;
    pub const TRACE_TID: i32 = 6;
    pub const TRACE_CODE: i32 = 7;
    pub const TRACE_BUFFER: i32 = 8;
    pub const TRACE_OPTIONS: i32 = 9;
    pub const FRAG_SIZE: i32 = 10;
    pub const RESV_TIDS: i32 = 11;
    pub const SELF_OUTPUT_TID: i32 = 12;
    pub const SELF_OUTPUT_CODE: i32 = 13;
    pub const SELF_TRACE_TID: i32 = 14;
    pub const SELF_TRACE_CODE: i32 = 15;
    pub const SELF_TRACE_BUFFER: i32 = 16;
    pub const SELF_TRACE_OPTIONS: i32 = 17;
    pub const SHOW_TIDS: i32 = 18;
    pub const POLL_TYPE: i32 = 19;
    pub const POLL_TIME: i32 = 20;
    pub const OUTPUT_CONTEXT: i32 = 21;
    pub const TRACE_CONTEXT: i32 = 22;
    pub const SELF_OUTPUT_CONTEXT: i32 = 23;
    pub const SELF_TRACE_CONTEXT: i32 = 24;
    pub const NO_RESET: i32 = 25;
    /// The highest option number.
    pub const LAST: i32 = NO_RESET;
}

/// `PvmRoute` values.
pub const DONT_ROUTE: i32 = 1;
pub const ALLOW_DIRECT: i32 = 2;
pub const ROUTE_DIRECT: i32 = 3;

/// The bytes of one item of PVM type code `ty`.
pub fn type_size(ty: i32) -> Option<usize> {
    Some(match ty {
        0 | 1 => 1, // PVM_STR, PVM_BYTE
        2 | 9 => 2,
        3 | 10 | 4 => 4,
        5 | 6 | 8 | 11 => 8,
        7 => 16,
        _ => return None,
    })
}

/// The architecture name every guest reports (x86_64 Linux).
pub const ARCH: &str = "LINUX64";
/// The data signature of `ARCH` (`pvmhostinfo.hi_dsig`): little-endian,
/// IEEE floating point, 4-byte int, 8-byte long.
pub const DSIG: i32 = 0x0040_8841;
/// What `pvm_version` returns.
pub const VERSION: &str = "3.4.6";
