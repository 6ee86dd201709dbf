//! The C face of UMP (`ump.h`): the twelve functions of Table 3. Each
//! returns `UMP_SUCCESS` (0) or a `UMP_E*` status; `ump_errmsg()` says
//! what went wrong in words.

use std::ffi::{c_char, c_int, c_long, CString};
use std::sync::Mutex;
use std::time::Duration;

use crate::{ChanError, Config, Event, Transport, UmpError, Want};

/// Status codes (`ump.h`).
pub mod status {
    #![allow(missing_docs)]
    pub const UMP_SUCCESS: i32 = 0;
    pub const UMP_EINIT: i32 = 1;
    pub const UMP_EINVAL: i32 = 2;
    pub const UMP_ECHANNEL: i32 = 3;
    pub const UMP_ETOOMANY: i32 = 4;
    pub const UMP_EBUSY: i32 = 5;
    pub const UMP_ENOTRANSPORT: i32 = 6;
    pub const UMP_ECLOSED: i32 = 7;
    pub const UMP_EPEERDEAD: i32 = 8;
    pub const UMP_ETOOBIG: i32 = 9;
    pub const UMP_ECORRUPT: i32 = 10;
    pub const UMP_ETIMEOUT: i32 = 11;
    pub const UMP_EOS: i32 = 12;
    pub const UMP_ENOTOPEN: i32 = 13;
}

/// Transports and events (`ump.h`).
pub mod consts {
    #![allow(missing_docs)]
    pub const UMP_ANY: i32 = 0;
    pub const UMP_SHM: i32 = 1;
    pub const UMP_MC: i32 = 2;
    pub const UMP_ALL: i32 = -1;
    pub const UMP_EV_NONE: i32 = 0;
    pub const UMP_EV_OPEN: i32 = 1;
    pub const UMP_EV_MESSAGE: i32 = 2;
    pub const UMP_EV_WRITE_DONE: i32 = 3;
    pub const UMP_EV_READ_DONE: i32 = 4;
    pub const UMP_EV_CLOSED: i32 = 5;
}

use consts::*;
use status::*;

/// `ump_event_t`.
#[repr(C)]
pub struct UmpEvent {
    /// `UMP_EV_*`.
    pub kind: c_int,
    /// The channel.
    pub channel: c_int,
}

/// `ump_info_t`.
#[repr(C)]
pub struct UmpInfo {
    /// Channels open.
    pub channels: c_int,
    /// Of them over MEMORY CHANNEL.
    pub mc_channels: c_int,
    /// Ring bytes, shared memory.
    pub shm_buffer: c_long,
    /// Ring bytes, MEMORY CHANNEL.
    pub mc_buffer: c_long,
    /// Channel limit.
    pub max_channels: c_int,
    /// This guest's node.
    pub node: c_int,
    /// 1 when imcd is reachable.
    pub mc_available: c_int,
}

static ERRMSG: Mutex<Option<CString>> = Mutex::new(None);

fn code(e: &UmpError) -> i32 {
    match e {
        UmpError::NotInitialized => UMP_EINIT,
        UmpError::Invalid(_) => UMP_EINVAL,
        UmpError::NoChannel(_) => UMP_ECHANNEL,
        UmpError::TooMany(_) => UMP_ETOOMANY,
        UmpError::Busy(_) => UMP_EBUSY,
        UmpError::NoTransport(_) => UMP_ENOTRANSPORT,
        UmpError::Os { .. } | UmpError::Mem { .. } => UMP_EOS,
        UmpError::Channel(c) => match c {
            ChanError::Closed(_) | ChanError::ClosedHere => UMP_ECLOSED,
            ChanError::PeerDead(_) => UMP_EPEERDEAD,
            ChanError::TooBig(_) => UMP_ETOOBIG,
            ChanError::Corrupt(_) => UMP_ECORRUPT,
            ChanError::Timeout => UMP_ETIMEOUT,
            ChanError::NotOpen => UMP_ENOTOPEN,
        },
    }
}

fn rc<T>(r: Result<T, UmpError>) -> c_int {
    match r {
        Ok(_) => UMP_SUCCESS,
        Err(e) => {
            *ERRMSG.lock().unwrap_or_else(|p| p.into_inner()) = CString::new(e.to_string().replace('\0', " ")).ok();
            code(&e)
        }
    }
}

/// The caller's message: `len` readable bytes at `buf` (NULL only when empty).
///
/// # Safety
/// `buf` must point to `len` readable bytes that outlive the returned slice.
unsafe fn message<'a>(buf: *const u8, len: usize, what: &str) -> Result<&'a [u8], UmpError> {
    if len == 0 {
        return Ok(&[]);
    }
    if buf.is_null() {
        return Err(UmpError::Invalid(format!("{what}: buf is NULL")));
    }
    // SAFETY: the caller's promise (see above).
    Ok(unsafe { std::slice::from_raw_parts(buf, len) })
}

/// `ump_init`: configuration from the environment (`UMP_SHM_BUFFER`,
/// `UMP_MC_BUFFER`, `UMP_MAX_CHANNELS`).
#[no_mangle]
pub extern "C" fn ump_init() -> c_int {
    rc(Config::from_env().map_err(UmpError::from).and_then(crate::init))
}

/// `ump_exit`.
#[no_mangle]
pub extern "C" fn ump_exit() -> c_int {
    rc(crate::exit())
}

/// `ump_open`: our side of the channel `local` ↔ `remote` over `transport`
/// (`UMP_ANY`, `UMP_SHM`, `UMP_MC`); `*channel` gets its descriptor.
///
/// # Safety
/// `channel` is NULL (refused with `UMP_EINVAL`) or points to an `int`
/// the call may write.
#[no_mangle]
pub unsafe extern "C" fn ump_open(local: u64, remote: u64, transport: c_int, channel: *mut c_int) -> c_int {
    rc((|| {
        if channel.is_null() {
            return Err(UmpError::Invalid("ump_open: channel is NULL".into()));
        }
        let want = match transport {
            UMP_ANY => Want::Any,
            UMP_SHM => Want::Shm,
            UMP_MC => Want::Mc,
            t => return Err(UmpError::Invalid(format!("ump_open: transport {t}"))),
        };
        let id = crate::open(local, remote, want)?;
        // SAFETY: checked non-null.
        unsafe { *channel = id };
        Ok(())
    })())
}

/// `ump_close`.
#[no_mangle]
pub extern "C" fn ump_close(channel: c_int) -> c_int {
    rc(crate::close(channel))
}

/// `ump_listen`: `local` accepts channels from handles it does not know,
/// on this guest (`UMP_SHM`), from other guests (`UMP_MC`), or both (`UMP_ANY`).
#[no_mangle]
pub extern "C" fn ump_listen(local: u64, transport: c_int) -> c_int {
    rc(match transport {
        UMP_ANY => crate::listen(local, Want::Any),
        UMP_SHM => crate::listen(local, Want::Shm),
        UMP_MC => crate::listen(local, Want::Mc),
        t => Err(UmpError::Invalid(format!("ump_listen: transport {t}"))),
    })
}

/// `ump_wait`: waits for an event on `channel` (or `UMP_ALL`) for up to
/// `timeout_ms` (-1: for ever); `ev->kind` is `UMP_EV_NONE` on timeout.
///
/// # Safety
/// `ev` is NULL (refused with `UMP_EINVAL`) or points to a `ump_event_t`
/// the call may write.
#[no_mangle]
pub unsafe extern "C" fn ump_wait(channel: c_int, timeout_ms: c_int, ev: *mut UmpEvent) -> c_int {
    rc((|| {
        if ev.is_null() {
            return Err(UmpError::Invalid("ump_wait: ev is NULL".into()));
        }
        let t = (timeout_ms >= 0).then(|| Duration::from_millis(timeout_ms as u64));
        let which = (channel != UMP_ALL).then_some(channel);
        let (kind, ch) = match crate::wait(which, t)? {
            None => (UMP_EV_NONE, -1),
            Some(Event::Open(c)) => (UMP_EV_OPEN, c),
            Some(Event::Message(c)) => (UMP_EV_MESSAGE, c),
            Some(Event::WriteDone(c)) => (UMP_EV_WRITE_DONE, c),
            Some(Event::ReadDone(c)) => (UMP_EV_READ_DONE, c),
            Some(Event::Closed(c)) => (UMP_EV_CLOSED, c),
        };
        // SAFETY: checked non-null.
        unsafe { *ev = UmpEvent { kind, channel: ch } };
        Ok(())
    })())
}

/// `ump_read`: the next message into `buf` (`size` bytes); `*len` gets its
/// length (also when it is too big: `UMP_ETOOBIG`, nothing consumed).
///
/// # Safety
/// `buf` is NULL (refused) or points to `size` writable bytes; `len` is
/// NULL (refused) or points to a `size_t` the call may write.
#[no_mangle]
pub unsafe extern "C" fn ump_read(channel: c_int, buf: *mut u8, size: usize, len: *mut usize) -> c_int {
    rc((|| {
        if (buf.is_null() && size > 0) || len.is_null() {
            return Err(UmpError::Invalid("ump_read: buf or len is NULL".into()));
        }
        let slice = if size == 0 {
            &mut [][..]
        } else {
            // SAFETY: the caller gives `size` writable bytes at `buf`.
            unsafe { std::slice::from_raw_parts_mut(buf, size) }
        };
        let r = crate::read(channel, slice);
        let n = match &r {
            Ok(n) => *n,
            Err(UmpError::Channel(ChanError::TooBig(n))) => *n,
            Err(_) => 0,
        };
        // SAFETY: checked non-null.
        unsafe { *len = n };
        r.map(|_| ())
    })())
}

/// `ump_write`: the whole message; returns when all of it is in the channel.
///
/// # Safety
/// With `len` > 0, `buf` is NULL (refused with `UMP_EINVAL`) or points
/// to `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn ump_write(channel: c_int, buf: *const u8, len: usize) -> c_int {
    rc((|| {
        // SAFETY: the caller's buffer, as ump.h describes it.
        crate::write(channel, unsafe { message(buf, len, "ump_write") }?)
    })())
}

/// `ump_nbread`: starts reading the next message into `buf`; returns once
/// `min` bytes (or all) are in, `*got` says how many. `buf` must stay
/// valid until `UMP_EV_READ_DONE`; then `ump_nbread_done` gives the length.
///
/// # Safety
/// `buf` is NULL (refused) or points to `size` writable bytes that stay
/// valid, and are not otherwise touched, until `UMP_EV_READ_DONE` (the
/// channel's reader thread writes them); `got` is NULL (refused) or points
/// to a `size_t` the call may write.
#[no_mangle]
pub unsafe extern "C" fn ump_nbread(channel: c_int, buf: *mut u8, size: usize, min: usize, got: *mut usize) -> c_int {
    rc((|| {
        if buf.is_null() || got.is_null() {
            return Err(UmpError::Invalid("ump_nbread: buf or got is NULL".into()));
        }
        // SAFETY: the caller's promise, documented in ump.h.
        let n = unsafe { crate::nbread(channel, buf, size, min)? };
        // SAFETY: checked non-null.
        unsafe { *got = n };
        Ok(())
    })())
}

/// The outcome of the last `ump_nbread` of `channel`: `UMP_SUCCESS` and
/// `*len` when done, `UMP_EBUSY` while it runs, or its error.
///
/// # Safety
/// `len` is NULL (refused with `UMP_EINVAL`) or points to a `size_t` the
/// call may write.
#[no_mangle]
pub unsafe extern "C" fn ump_nbread_done(channel: c_int, len: *mut usize) -> c_int {
    rc((|| match crate::nbread_result(channel)? {
        Some(n) => {
            if !len.is_null() {
                // SAFETY: checked non-null.
                unsafe { *len = n };
            }
            Ok(())
        }
        None => Err(UmpError::Busy("the read is still running".into())),
    })())
}

/// `ump_nbwrite`: starts writing the message (copied at once) and returns.
///
/// # Safety
/// With `len` > 0, `buf` is NULL (refused with `UMP_EINVAL`) or points
/// to `len` readable bytes (copied before the call returns).
#[no_mangle]
pub unsafe extern "C" fn ump_nbwrite(channel: c_int, buf: *const u8, len: usize) -> c_int {
    rc((|| {
        // SAFETY: the caller's buffer, as ump.h describes it.
        crate::nbwrite(channel, unsafe { message(buf, len, "ump_nbwrite") }?)
    })())
}

/// The outcome of the last `ump_nbwrite`: `UMP_SUCCESS` when done,
/// `UMP_EBUSY` while it runs, or its error.
#[no_mangle]
pub extern "C" fn ump_nbwrite_done(channel: c_int) -> c_int {
    rc(crate::nbwrite_result(channel)
        .and_then(|r| r.ok_or_else(|| UmpError::Busy("the write is still running".into()))))
}

/// `ump_mcast`: one message to `n` channels.
///
/// # Safety
/// `channels` is NULL (refused) or points to `n` `int`s; with `len` > 0,
/// `buf` is NULL (refused) or points to `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn ump_mcast(channels: *const c_int, n: c_int, buf: *const u8, len: usize) -> c_int {
    rc((|| {
        if channels.is_null() || n < 0 || (buf.is_null() && len > 0) {
            return Err(UmpError::Invalid("ump_mcast: bad channel list or buffer".into()));
        }
        // SAFETY: the caller gives `n` channel descriptors and `len` bytes.
        let (ids, msg) = unsafe {
            (
                std::slice::from_raw_parts(channels, n as usize),
                if len == 0 { &[][..] } else { std::slice::from_raw_parts(buf, len) },
            )
        };
        crate::mcast(ids, msg)
    })())
}

/// `ump_info`.
///
/// # Safety
/// `info` is NULL (refused with `UMP_EINVAL`) or points to a
/// `ump_info_t` the call may write.
#[no_mangle]
pub unsafe extern "C" fn ump_info(info: *mut UmpInfo) -> c_int {
    rc((|| {
        if info.is_null() {
            return Err(UmpError::Invalid("ump_info: info is NULL".into()));
        }
        let i = crate::info()?;
        // SAFETY: checked non-null.
        unsafe {
            *info = UmpInfo {
                channels: i.channels as c_int,
                mc_channels: i.mc_channels as c_int,
                shm_buffer: i.shm_buffer as c_long,
                mc_buffer: i.mc_buffer as c_long,
                max_channels: i.max_channels as c_int,
                node: i.node as c_int,
                mc_available: i.mc_available as c_int,
            }
        };
        Ok(())
    })())
}

/// The transport of a channel (`UMP_SHM` or `UMP_MC`), or -1.
#[no_mangle]
pub extern "C" fn ump_transport(channel: c_int) -> c_int {
    match crate::transport(channel) {
        Ok(Transport::Shm) => UMP_SHM,
        Ok(Transport::Mc) => UMP_MC,
        Err(e) => {
            rc::<()>(Err(e));
            -1
        }
    }
}

/// The last failure of this process's ump_* calls, in words.
#[no_mangle]
pub extern "C" fn ump_errmsg() -> *const c_char {
    static EMPTY: &std::ffi::CStr = c"";
    let g = ERRMSG.lock().unwrap_or_else(|p| p.into_inner());
    // The string lives in the static until the next failure.
    g.as_ref().map(|s| s.as_ptr()).unwrap_or(EMPTY.as_ptr())
}
