//! What Debian's PVM console (`pvm`) needs beyond `pvm3.h`: the calls
//! that reach into PVM's daemon (`pvm_halt`, `pvm_start_pvmd`) and the
//! internal ones it imports (`pvmreset`, `pvmendtask`, `pvmputenv`,
//! `pvmstrtoi`, `i_dump`). Here there is no master daemon: halting the
//! virtual machine is ending every task of it, in-line in the caller; the
//! guests' daemons stay (they are part of the guest, and the tables are
//! made again on demand).
//!
//! Called on the thread calling PVM, under the C layer's state lock.

use std::ffi::{c_char, c_int, c_long, CStr};
use std::time::Duration;

use thiserror::Error;

use crate::consts::err;
use crate::ffi::{self, Pvm};
use crate::table;

/// What went wrong with a console call's argument.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ConsoleError {
    #[error("pvmputenv: '{0}' is not NAME=VALUE")]
    NotAnAssignment(String),
}

impl Pvm {
    /// Ends every task of the virtual machine but this one and `spare`
    /// (SIGTERM, on any guest), and takes them off the task table (those
    /// who asked hear of it, as with `pvm_kill`); the daemons stay.
    /// Returns how many.
    pub(crate) fn end_all_tasks(&mut self, spare: i32) -> Result<usize, c_int> {
        let tasks = self.table.tasks().map_err(|_| err::SYS_ERR)?;
        let mut n = 0;
        for t in tasks.iter().filter(|t| t.tid & table::TID_LOCAL != 0 && t.tid != self.me && t.tid != spare) {
            if t.pid > 0 {
                // One already gone is ended all the same.
                let _ = ffi::signal(self, t, libc::SIGTERM);
            }
            let _ = self.table.remove(t.tid);
            n += 1;
        }
        Ok(n)
    }

    /// Removes the mailbox's orphaned entries (`reset` and `halt`).
    fn reset_mailbox(&mut self, class: Option<&str>, index: i32) -> Result<usize, c_int> {
        let table = &self.table;
        let alive = |t: i32| table.find(t).map(|x| x.is_some()).unwrap_or(true);
        self.mbox.reset(class, index, &alive).map_err(|e| e.code())
    }
}

/// `pvm_halt`: ends every task of the virtual machine but the caller and
/// clears the mailbox (PVM's halt stops every daemon, which takes the
/// tasks and the mailbox with it; ours stay, part of their guests). The
/// caller goes on; the console then exits itself.
#[no_mangle]
pub extern "C" fn pvm_halt() -> c_int {
    ffi::with("pvm_halt", |p| {
        p.end_all_tasks(p.me)?;
        p.reset_mailbox(None, -1)?;
        Ok(0)
    })
}

/// `pvm_start_pvmd`: the virtual machine is always there (its tables are
/// made on demand, the guests' daemons start at boot), so this is
/// `PvmDupHost`, PVM's answer when its daemon already runs (the console
/// says "pvmd already running.").
#[no_mangle]
pub extern "C" fn pvm_start_pvmd(argc: c_int, argv: *const *const c_char, block: c_int) -> c_int {
    let _ = (argc, argv, block);
    ffi::with("pvm_start_pvmd", |_| Err(err::DUP_HOST))
}

/// `pvmreset(tid, killtasks, class, index)`: the console's `reset`. With
/// `killtasks`, ends every task but the caller and `tid`; then removes
/// the mailbox's orphaned entries (persistent ones whose owner left) of
/// class `class` (null: all) at `index` (-1: all).
///
/// # Safety
/// `class` is null or a C string.
#[no_mangle]
pub unsafe extern "C" fn pvmreset(tid: c_int, killtasks: c_int, class: *const c_char, index: c_int) -> c_int {
    ffi::with("pvmreset", |p| {
        // SAFETY: the caller's contract.
        let class = if class.is_null() { None } else { Some(unsafe { ffi::cstr(class) }?) };
        if killtasks != 0 {
            p.end_all_tasks(tid)?;
        }
        p.reset_mailbox(class, index)?;
        Ok(0)
    })
}

/// `pvmendtask`: leaves PVM at once (the console calls it after
/// `pvm_halt`, just before it exits): as `pvm_exit`, but without waiting
/// for what it sent to be read or for its children's output.
#[no_mangle]
pub extern "C" fn pvmendtask() -> c_int {
    let mut g = ffi::STATE.lock().unwrap_or_else(|e| e.into_inner());
    let Some(p) = g.take() else { return 0 };
    p.out.close();
    let _ = p.groups.leave_all(p.me, &|_| true);
    let _ = p.mbox.leave(p.me, &|_| true);
    let _ = p.table.remove(p.me);
    let Pvm { table, notify, mut eng, me, .. } = p;
    let _ = crate::daemon::send_notifications(&table, &notify, &mut eng, me);
    eng.finish(Duration::ZERO, &mut |_| false);
    0
}

/// Splits `NAME=VALUE`.
pub fn assignment(s: &str) -> Result<(&str, &str), ConsoleError> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() && !k.contains('\0') && !v.contains('\0') => Ok((k, v)),
        _ => Err(ConsoleError::NotAnAssignment(s.to_string())),
    }
}

/// `pvmputenv("NAME=VALUE")`: sets an environment variable (the
/// console's `setenv`; spawned tasks get it). 0, or -1 for a string
/// that is not an assignment.
///
/// # Safety
/// `s` is null or a C string.
#[no_mangle]
pub unsafe extern "C" fn pvmputenv(s: *const c_char) -> c_int {
    if s.is_null() {
        return -1;
    }
    // SAFETY: the caller's contract.
    let s = unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned();
    match assignment(&s) {
        Ok((k, v)) => {
            std::env::set_var(k, v);
            0
        }
        Err(e) => {
            eprintln!("libpvm: {e}");
            -1
        }
    }
}

/// `pvmstrtoi`: a number as C writes it (`0x` hex, leading `0` octal,
/// else decimal), as `strtol(s, 0, 0)`; 0 for null.
///
/// # Safety
/// `s` is null or a C string.
#[no_mangle]
pub unsafe extern "C" fn pvmstrtoi(s: *const c_char) -> c_int {
    if s.is_null() {
        return 0;
    }
    // SAFETY: the caller's contract; strtol reads up to the NUL.
    let v: c_long = unsafe { libc::strtol(s, std::ptr::null_mut(), 0) };
    v as c_int
}

/// `i_dump`: PVM's dump of its debugging allocator's heap (the console's
/// `idump`); this library has none, and says so.
#[no_mangle]
pub extern "C" fn i_dump(how: c_int) -> c_int {
    let _ = how;
    // Through C's stdout, in order with what the console prints.
    // SAFETY: a C string literal.
    unsafe {
        libc::puts(c"i_dump: this libpvm keeps no allocation trace (PVM's debugging allocator is not used)".as_ptr())
    };
    0
}

// ------------------------------------------------------------- tracing --

/// PVM's trace event names, by event number (`TEV_ADDHOSTS` 0 to
/// `TEV_USER_DEFINED` 108): each is the name of its `TEV_` constant in
/// lower case, which the console's `trace` command matches (with or
/// without `pvm_`).
const TEV_NAMES: [&CStr; 109] = [
    c"addhosts",
    c"barrier",
    c"bcast",
    c"bufinfo",
    c"config",
    c"delete",
    c"delhosts",
    c"exit",
    c"freebuf",
    c"getfds",
    c"getinst",
    c"getopt",
    c"getrbuf",
    c"getsbuf",
    c"gettid",
    c"gsize",
    c"halt",
    c"initsend",
    c"insert",
    c"joingroup",
    c"kill",
    c"lookup",
    c"lvgroup",
    c"mcast",
    c"mkbuf",
    c"mstat",
    c"mytid",
    c"notify",
    c"nrecv",
    c"parent",
    c"perror",
    c"pkbyte",
    c"pkcplx",
    c"pkdcplx",
    c"pkdouble",
    c"pkfloat",
    c"pkint",
    c"pkuint",
    c"pklong",
    c"pkulong",
    c"pkshort",
    c"pkushort",
    c"pkstr",
    c"probe",
    c"pstat",
    c"recv",
    c"recvf",
    c"send",
    c"sendsig",
    c"setopt",
    c"setrbuf",
    c"setsbuf",
    c"spawn",
    c"start_pvmd",
    c"tasks",
    c"tickle",
    c"tidtohost",
    c"trecv",
    c"upkbyte",
    c"upkcplx",
    c"upkdcplx",
    c"upkdouble",
    c"upkfloat",
    c"upkint",
    c"upkuint",
    c"upklong",
    c"upkulong",
    c"upkshort",
    c"upkushort",
    c"upkstr",
    c"version",
    c"reg_hoster",
    c"reg_rm",
    c"reg_tasker",
    c"reg_tracer",
    c"newtask",
    c"endtask",
    c"spntask",
    c"archcode",
    c"catchout",
    c"getmwid",
    c"gettmask",
    c"hostsync",
    c"packf",
    c"precv",
    c"psend",
    c"reduce",
    c"setmwid",
    c"settmask",
    c"unpackf",
    c"gather",
    c"scatter",
    c"putinfo",
    c"getinfo",
    c"delinfo",
    c"getmboxinfo",
    c"newcontext",
    c"freecontext",
    c"setcontext",
    c"getcontext",
    c"siblings",
    c"getminfo",
    c"setminfo",
    c"addmhf",
    c"delmhf",
    c"mhf_invoke",
    c"timing",
    c"profiling",
    c"user_defined",
];

/// `struct Pvmtevinfo` of `pvmtev.h`.
#[repr(C)]
pub struct TevInfo {
    pub name: *const c_char,
    pub desc_status: c_int,
    pub mark: libc::timeval,
    pub total: libc::timeval,
    pub count: c_int,
}

const ZERO_TV: libc::timeval = libc::timeval { tv_sec: 0, tv_usec: 0 };

const fn tev_table() -> [TevInfo; 109] {
    let mut t =
        [const { TevInfo { name: std::ptr::null(), desc_status: 0, mark: ZERO_TV, total: ZERO_TV, count: 0 } }; 109];
    let mut i = 0;
    while i < 109 {
        t[i].name = TEV_NAMES[i].as_ptr();
        i += 1;
    }
    t
}

/// The trace event table (`pvmtevinfo`): the events' names (the console
/// lists and matches them); no events are ever traced, so the counts
/// stay zero. Debian's size: 109 entries of 56 bytes.
// SAFETY (for C): programs read the names and may write the counters, as
// PVM's ABI has them; this library never writes it.
#[no_mangle]
pub static mut pvmtevinfo: [TevInfo; 109] = tev_table();
const _: () = assert!(std::mem::size_of::<[TevInfo; 109]>() == 6104);

/// PVM's semantic data IDs of trace events, by number (`TEV_DID_AN` 0 to
/// `TEV_DID_WID` 122): each is its `TEV_DID_` constant's suffix.
const TEV_DIDS: [&CStr; 123] = [
    c"AN", c"AC", c"AS", c"BF", c"CC", c"CN", c"CI", c"CF", c"CD", c"CR", c"CL", c"CDA", c"CDT", c"CDX", c"CDC",
    c"CGI", c"CRF", c"CXC", c"CXF", c"CXN", c"CXS", c"ERI", c"ERR", c"FDS", c"FP", c"GN", c"GI", c"GT", c"GS", c"GBC",
    c"HN", c"HNL", c"HNA", c"HPT", c"HA", c"HSP", c"HIS", c"HCS", c"HCU", c"HDS", c"HDU", c"HS", c"INB", c"IMC",
    c"IST", c"MC", c"MCX", c"MB", c"MNB", c"SRC", c"DST", c"MDL", c"MTS", c"MTU", c"MRF", c"MRB", c"MSB", c"ME",
    c"MHI", c"AST", c"AMC", c"AML", c"NE", c"NMC", c"NCT", c"NTL", c"NH", c"NA", c"OPT", c"OPV", c"OS", c"PDA", c"PDT",
    c"PC", c"PSD", c"PSG", c"PF", c"PRF", c"RST", c"RMC", c"RCX", c"SN", c"SE", c"SF", c"SW", c"SC", c"STL", c"SIB",
    c"TID", c"PT", c"MT", c"TF", c"TN", c"PID", c"TT", c"TW", c"TIS", c"TNT", c"TST", c"TUS", c"TUU", c"TSS", c"TSU",
    c"TES", c"TA", c"TR", c"TS", c"TU", c"TGS", c"TGU", c"TMW", c"TM", c"TRC", c"TRT", c"TRX", c"TRO", c"TRM", c"TRB",
    c"TRL", c"VER", c"VCT", c"VID", c"WID",
];

/// `struct Pvmtevdid` of `pvmtev.h`.
#[repr(C)]
pub struct TevDid {
    pub did: *const c_char,
    pub desc: *const c_char,
}

const fn tev_dids() -> [TevDid; 123] {
    let mut t = [const { TevDid { did: std::ptr::null(), desc: std::ptr::null() } }; 123];
    let mut i = 0;
    while i < 123 {
        // No descriptions are kept: the ID describes itself.
        t[i] = TevDid { did: TEV_DIDS[i].as_ptr(), desc: TEV_DIDS[i].as_ptr() };
        i += 1;
    }
    t
}

/// The trace data IDs (`pvmtevdidlist`), which the console's tracer
/// reads at start. Debian's size: 123 entries of 16 bytes.
#[no_mangle]
pub static mut pvmtevdidlist: [TevDid; 123] = tev_dids();
const _: () = assert!(std::mem::size_of::<[TevDid; 123]>() == 1968);

/// Bytes of a `Pvmtmask` (`TEV_MASK_LENGTH`).
const TMASK: usize = 36;

/// An empty trace mask (`TEV_MASK_INIT`: '@' in every place, then NUL).
const fn empty_mask() -> [u8; TMASK] {
    let mut m = [b'@'; TMASK];
    m[TMASK - 1] = 0;
    m
}

/// This task's trace masks: its own (`PvmTaskSelf`) and its children's
/// (`PvmTaskChild`).
static TMASKS: std::sync::Mutex<[[u8; TMASK]; 2]> = std::sync::Mutex::new([empty_mask(), empty_mask()]);

/// `pvm_settmask`: keeps the trace mask of this task (`PvmTaskSelf`, 0)
/// or its children (`PvmTaskChild`, 1), for `pvm_gettmask`. No trace
/// events are generated (tracing is not implemented; docs/pvm.md).
///
/// # Safety
/// `mask` is null or points to a `Pvmtmask` (36 bytes).
#[no_mangle]
pub unsafe extern "C" fn pvm_settmask(who: c_int, mask: *const c_char) -> c_int {
    ffi::with("pvm_settmask", |_| {
        if mask.is_null() || !(0..=1).contains(&who) {
            return Err(err::BAD_PARAM);
        }
        // SAFETY: the caller's contract.
        let m = unsafe { std::slice::from_raw_parts(mask as *const u8, TMASK) };
        let mut t = TMASKS.lock().unwrap_or_else(|e| e.into_inner());
        t[who as usize].copy_from_slice(m);
        t[who as usize][TMASK - 1] = 0;
        Ok(0)
    })
}

/// `pvm_gettmask`: the mask `pvm_settmask` kept (empty at first).
///
/// # Safety
/// `mask` is null or points to 36 writable bytes.
#[no_mangle]
pub unsafe extern "C" fn pvm_gettmask(who: c_int, mask: *mut c_char) -> c_int {
    ffi::with("pvm_gettmask", |_| {
        if mask.is_null() || !(0..=1).contains(&who) {
            return Err(err::BAD_PARAM);
        }
        let t = TMASKS.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(t[who as usize].as_ptr(), mask as *mut u8, TMASK) };
        Ok(0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assignments_are_split_and_bad_ones_refused() {
        assert_eq!(assignment("A=b=c"), Ok(("A", "b=c")));
        assert_eq!(assignment("A="), Ok(("A", "")));
        assert!(assignment("=x").is_err());
        assert!(assignment("nothing").is_err());
    }

    #[test]
    fn numbers_are_read_as_c_reads_them() {
        // SAFETY: C string literals.
        unsafe {
            assert_eq!(pvmstrtoi(c"0x1f".as_ptr()), 31);
            assert_eq!(pvmstrtoi(c"010".as_ptr()), 8);
            assert_eq!(pvmstrtoi(c"-12".as_ptr()), -12);
            assert_eq!(pvmstrtoi(std::ptr::null()), 0);
        }
    }
}
