//! The C face of BBP (`bbp.h`): `bbp_init`, `bbp_send`, `bbp_recv`,
//! `bbp_mcast` and `bbp_msgavail` from the paper, with `bbp_tryrecv`,
//! `bbp_barrier`, `bbp_finalize` and the queries. Each call returns
//! `BBP_OK` (0, or a count) or a negative `BBP_E*` status;
//! `bbp_errmsg()` says what went wrong in words.
//!
//! The process's one endpoint lives in a global under a lock: calls from
//! several threads are serialized.

use std::ffi::{c_char, c_int, c_long, CString};
use std::sync::Mutex;
use std::time::Duration;

use crate::{init, Bbp, BbpError, Options};

/// Status codes and constants (`bbp.h`).
pub mod consts {
    #![allow(missing_docs)]
    pub const BBP_OK: i32 = 0;
    pub const BBP_ETOOBIG: i32 = -1;
    pub const BBP_ERANK: i32 = -2;
    pub const BBP_EINVAL: i32 = -3;
    pub const BBP_ETRUNC: i32 = -4;
    pub const BBP_EPEER: i32 = -5;
    pub const BBP_ESETUP: i32 = -6;
    pub const BBP_EAGAIN: i32 = -7;
    pub const BBP_EINIT: i32 = -8;
    pub const BBP_ANY: i32 = -1;
    pub const BBP_ALL: i32 = -1;
}

use consts::*;

/// How long `bbp_finalize` waits for receivers to read what we sent.
const FINALIZE_LINGER: Duration = Duration::from_secs(10);

static STATE: Mutex<Option<Bbp>> = Mutex::new(None);
static ERRMSG: Mutex<Option<CString>> = Mutex::new(None);

fn code(e: &BbpError) -> i32 {
    match e {
        BbpError::TooBig { .. } => BBP_ETOOBIG,
        BbpError::Rank { .. } => BBP_ERANK,
        BbpError::Arg(_) => BBP_EINVAL,
        BbpError::Truncated { .. } => BBP_ETRUNC,
        BbpError::Peer { .. } => BBP_EPEER,
        BbpError::Setup(_) => BBP_ESETUP,
        BbpError::Again => BBP_EAGAIN,
        BbpError::NotInit => BBP_EINIT,
    }
}

fn fail(e: BbpError) -> i32 {
    let msg = CString::new(e.to_string().replace('\0', " ")).unwrap_or_default();
    *ERRMSG.lock().unwrap_or_else(|e| e.into_inner()) = Some(msg);
    code(&e)
}

/// Runs `f` on the endpoint; a status or the value.
fn with<T>(f: impl FnOnce(&mut Bbp) -> Result<T, BbpError>) -> Result<T, i32> {
    let mut st = STATE.lock().unwrap_or_else(|e| e.into_inner());
    let Some(ep) = st.as_mut() else { return Err(fail(BbpError::NotInit)) };
    f(ep).map_err(fail)
}

fn src_of(src: c_int) -> Result<Option<i64>, BbpError> {
    match src {
        BBP_ANY => Ok(None),
        s => Ok(Some(i64::from(s))),
    }
}

/// Checks a (pointer, length) pair from C.
fn bytes<'a>(buf: *const u8, len: usize) -> Result<&'a [u8], BbpError> {
    if len == 0 {
        return Ok(&[]);
    }
    if buf.is_null() {
        return Err(BbpError::Arg("a NULL buffer of nonzero length".into()));
    }
    // SAFETY: the caller promises `len` readable bytes at `buf` (bbp.h),
    // not written by anyone during the call.
    Ok(unsafe { std::slice::from_raw_parts(buf, len) })
}

/// `bbp_init`: joins the job's billboard. `rank` < 0 and `nprocs` ≤ 0
/// take them from mpiexec's environment; `job` < 0 from `MCMPI_JOB`.
#[no_mangle]
pub extern "C" fn bbp_init(rank: c_int, nprocs: c_int, job: c_long) -> c_int {
    let mut st = STATE.lock().unwrap_or_else(|e| e.into_inner());
    if st.is_some() {
        return fail(BbpError::Arg("bbp_init called twice (bbp_finalize first)".into()));
    }
    let opts = Options {
        rank: (rank >= 0).then_some(rank as usize),
        nprocs: (nprocs > 0).then_some(nprocs as usize),
        job: (job >= 0).then_some(job as u64),
        ..Options::default()
    };
    match init(opts) {
        Ok(ep) => {
            *st = Some(ep);
            BBP_OK
        }
        Err(e) => fail(e),
    }
}

/// `bbp_rank`: this process's rank, or a status.
#[no_mangle]
pub extern "C" fn bbp_rank() -> c_int {
    with(|ep| Ok(ep.rank() as c_int)).unwrap_or_else(|e| e)
}

/// `bbp_nprocs`: processes in the job, or a status.
#[no_mangle]
pub extern "C" fn bbp_nprocs() -> c_int {
    with(|ep| Ok(ep.nprocs() as c_int)).unwrap_or_else(|e| e)
}

/// `bbp_max_message`: the largest message in bytes, or a status.
#[no_mangle]
pub extern "C" fn bbp_max_message() -> c_long {
    with(|ep| Ok(ep.max_message() as c_long)).unwrap_or_else(|e| e as c_long)
}

/// `bbp_send`: sends `len` bytes at `buf` to `dest`.
///
/// # Safety
/// `buf` points to `len` readable bytes (or `len` is 0).
#[no_mangle]
pub unsafe extern "C" fn bbp_send(dest: c_int, buf: *const u8, len: usize) -> c_int {
    with(|ep| ep.send(i64::from(dest), bytes(buf, len)?)).map_or_else(|e| e, |()| BBP_OK)
}

/// `bbp_mcast`: sends `len` bytes at `buf` to the `ndests` ranks at
/// `dests`, or to every other rank when `ndests` is `BBP_ALL`.
///
/// # Safety
/// `buf` points to `len` readable bytes; `dests` to `ndests` ints unless
/// `ndests` is `BBP_ALL`.
#[no_mangle]
pub unsafe extern "C" fn bbp_mcast(dests: *const c_int, ndests: c_int, buf: *const u8, len: usize) -> c_int {
    with(|ep| {
        let data = bytes(buf, len)?;
        if ndests == BBP_ALL {
            return ep.mcast(None, data);
        }
        if ndests < 0 {
            return Err(BbpError::Arg(format!("{ndests} destinations")));
        }
        if ndests > 0 && dests.is_null() {
            return Err(BbpError::Arg("a NULL list of destinations".into()));
        }
        let list: Vec<i64> = if ndests == 0 {
            Vec::new()
        } else {
            // SAFETY: the caller promises `ndests` ints at `dests` (bbp.h).
            unsafe { std::slice::from_raw_parts(dests, ndests as usize) }.iter().map(|&r| i64::from(r)).collect()
        };
        ep.mcast(Some(&list), data)
    })
    .map_or_else(|e| e, |()| BBP_OK)
}

/// The receives: a message's length, or a status; `*from` its sender.
///
/// # Safety
/// As `bbp_recv`.
unsafe fn recv_common(src: c_int, buf: *mut u8, cap: usize, from: *mut c_int, block: bool) -> c_long {
    let r = with(|ep| {
        let src = src_of(src)?;
        if cap > 0 && buf.is_null() {
            return Err(BbpError::Arg("a NULL buffer of nonzero capacity".into()));
        }
        let out: &mut [u8] = if cap == 0 {
            &mut []
        } else {
            // SAFETY: the caller promises `cap` writable bytes at `buf` (bbp.h).
            unsafe { std::slice::from_raw_parts_mut(buf, cap) }
        };
        if block {
            ep.recv(src, out)
        } else {
            ep.try_recv(src, out)
        }
    });
    match r {
        Ok(got) => {
            if !from.is_null() {
                // SAFETY: the caller passes NULL or a writable int (bbp.h).
                unsafe { *from = got.from as c_int };
            }
            got.len as c_long
        }
        Err(e) => e as c_long,
    }
}

/// `bbp_recv`: waits for the oldest message from `src` (or `BBP_ANY`)
/// and copies it into `buf`; returns its length.
///
/// # Safety
/// `buf` points to `cap` writable bytes (or `cap` is 0); `from` is NULL
/// or points to a writable int.
#[no_mangle]
pub unsafe extern "C" fn bbp_recv(src: c_int, buf: *mut u8, cap: usize, from: *mut c_int) -> c_long {
    // SAFETY: as this function's.
    unsafe { recv_common(src, buf, cap, from, true) }
}

/// `bbp_tryrecv`: as `bbp_recv`, but `BBP_EAGAIN` when nothing waits.
///
/// # Safety
/// As `bbp_recv`.
#[no_mangle]
pub unsafe extern "C" fn bbp_tryrecv(src: c_int, buf: *mut u8, cap: usize, from: *mut c_int) -> c_long {
    // SAFETY: as this function's.
    unsafe { recv_common(src, buf, cap, from, false) }
}

/// `bbp_msgavail`: 1 when a message from `src` (or `BBP_ANY`) waits, 0
/// when none does, or a status.
#[no_mangle]
pub extern "C" fn bbp_msgavail(src: c_int) -> c_int {
    with(|ep| ep.msgavail(src_of(src)?)).map_or_else(|e| e, c_int::from)
}

/// `bbp_barrier`: returns when every rank has called it.
#[no_mangle]
pub extern "C" fn bbp_barrier() -> c_int {
    with(|ep| ep.barrier()).map_or_else(|e| e, |()| BBP_OK)
}

/// `bbp_finalize`: waits (up to 10 s) until our messages were read,
/// then leaves the billboard; `bbp_init` may be called again.
#[no_mangle]
pub extern "C" fn bbp_finalize() -> c_int {
    let mut st = STATE.lock().unwrap_or_else(|e| e.into_inner());
    let Some(mut ep) = st.take() else { return fail(BbpError::NotInit) };
    drop(st);
    ep.finalize(FINALIZE_LINGER).map_or_else(fail, |()| BBP_OK)
}

/// `bbp_errmsg`: the last error in words (valid until the next error).
#[no_mangle]
pub extern "C" fn bbp_errmsg() -> *const c_char {
    let m = ERRMSG.lock().unwrap_or_else(|e| e.into_inner());
    match m.as_ref() {
        Some(s) => s.as_ptr(),
        None => c"no error".as_ptr(),
    }
}

/// `bbp_stats`: counters of this process (`out` holds 5: sent, received,
/// collected, reposts, not intact).
///
/// # Safety
/// `out` points to 5 writable `unsigned long`s.
#[no_mangle]
pub unsafe extern "C" fn bbp_stats(out: *mut u64) -> c_int {
    with(|ep| {
        if out.is_null() {
            return Err(BbpError::Arg("a NULL stats array".into()));
        }
        let s = ep.stats;
        let v = [s.sent, s.received, s.collected, s.reposts, s.not_intact];
        // SAFETY: the caller promises 5 writable words at `out` (bbp.h).
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), out, v.len()) };
        Ok(())
    })
    .map_or_else(|e| e, |()| BBP_OK)
}
