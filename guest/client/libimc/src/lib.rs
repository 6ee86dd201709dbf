//! `libimc`: the TruCluster MEMORY CHANNEL API of seed 000 (Table 1) as a
//! C library (`libimc.a`, `libimc.so`, `<sys/imc.h>`), over the Rust client
//! in [`imc_client`].
//!
//! One connection to `imcd` per process, opened by the first call. The
//! process's allocations are that connection's: when the process exits,
//! imcd lets go of them (a region is freed once no process anywhere holds
//! it). The constants below are the header's; `tests/c_abi.rs` checks the
//! two agree.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_long, CStr, CString};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use imc_client::dma::{DmaError, DmaHandle, DmaPort, DmaTarget};
use imc_client::{Attached, Imc, ImcError, LockSet, Regs, Status};

/// Status codes (`IMC_*` in `<sys/imc.h>`).
pub mod status {
    #![allow(missing_docs)]
    pub const IMC_SUCCESS: i32 = 0;
    pub const IMC_EXISTS: i32 = 1;
    pub const IMC_PERMISSION: i32 = 2;
    pub const IMC_NOTALLOC: i32 = 3;
    pub const IMC_NOSPACE: i32 = 4;
    pub const IMC_TABLEFULL: i32 = 5;
    pub const IMC_SIZE: i32 = 6;
    pub const IMC_INVALID: i32 = 7;
    pub const IMC_NODAEMON: i32 = 8;
    pub const IMC_CLUSTER: i32 = 9;
    pub const IMC_LOCKBUSY: i32 = 10;
    pub const IMC_NOHOST: i32 = 11;
    pub const IMC_ERRNO: i32 = 12;
    pub const IMC_NOMEM: i32 = 13;
    pub const IMC_FAIL: i32 = 14;
    pub const IMC_DMA_PENDING: i32 = 15;
    pub const IMC_DMA_FAILED: i32 = 16;
    pub const IMC_DMA_FULL: i32 = 17;
}

/// Flags and permission bits (`IMC_*` in `<sys/imc.h>`).
pub mod flags {
    #![allow(missing_docs)]
    pub const IMC_URW: i32 = 0o600;
    pub const IMC_GRW: i32 = 0o060;
    pub const IMC_ORW: i32 = 0o006;
    pub const IMC_LKU: i32 = 0o600;
    pub const IMC_LKG: i32 = 0o060;
    pub const IMC_LKO: i32 = 0o006;
    pub const IMC_COHERENT: i32 = 0x1;
    pub const IMC_EXCL: i32 = 0x2;
    pub const IMC_CREATOR: i32 = 0x4;
    pub const IMC_TRANSMIT: i32 = 1;
    pub const IMC_RECEIVE: i32 = 2;
    pub const IMC_SHARED: i32 = 0;
    pub const IMC_LOOPBACK: i32 = 0x1;
    pub const IMC_LOCKNOWAIT: i32 = 0;
    pub const IMC_LOCKWAIT: i32 = 1;
    pub const IMC_HOSTNAME_LEN: i32 = 32;
}

use flags::*;
use status::*;

/// `imc_host_t`.
#[repr(C)]
pub struct ImcHost {
    /// Node id.
    pub node: c_int,
    /// Host name, NUL-terminated.
    pub name: [c_char; IMC_HOSTNAME_LEN as usize],
}

#[derive(Default)]
struct State {
    imc: Option<Imc>,
    /// Attachments per region id.
    maps: HashMap<i32, Vec<Attached>>,
    locks: HashMap<i32, LockSet>,
    regs: Option<Regs>,
    /// Transmit DMA (extension): the port, and the regions imcd accepted
    /// as destinations.
    dma: Option<DmaPort>,
    targets: HashMap<i32, DmaTarget>,
    errmsg: CString,
    /// The process the state belongs to (a child of fork() starts afresh).
    pid: u32,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

/// Maps an imcd status onto its `IMC_*` code.
pub fn code_of(status: Status) -> i32 {
    match status {
        Status::Exists => IMC_EXISTS,
        Status::Permission => IMC_PERMISSION,
        Status::NotAlloc | Status::NotFound => IMC_NOTALLOC,
        Status::NoSpace => IMC_NOSPACE,
        Status::TableFull => IMC_TABLEFULL,
        Status::Size => IMC_SIZE,
        Status::Invalid => IMC_INVALID,
        Status::Cluster | Status::Timeout => IMC_CLUSTER,
        Status::NoHost => IMC_NOHOST,
        Status::Errno => IMC_ERRNO,
        Status::NoMem => IMC_NOMEM,
        Status::NoDev => IMC_FAIL,
    }
}

/// Runs `f` with this process's state (connecting on first use); records
/// the message of a failure for `imc_errmsg`.
fn with<T>(f: impl FnOnce(&mut State, &Imc) -> Result<T, Failure>) -> Result<T, i32> {
    let mut guard = STATE.lock().unwrap_or_else(|e| e.into_inner());
    let st = guard.get_or_insert_with(State::default);
    if st.pid != std::process::id() {
        // New, or inherited through fork(): the parent's connection,
        // mappings and locks are the parent's.
        *st = State { pid: std::process::id(), ..State::default() };
    }
    if st.imc.is_none() {
        match Imc::connect() {
            Ok(c) => st.imc = Some(c),
            Err(e) => {
                st.errmsg = CString::new(e.to_string()).unwrap_or_default();
                return Err(IMC_NODAEMON);
            }
        }
    }
    let imc = st.imc.take().expect("connected above");
    let r = f(st, &imc);
    st.imc = Some(imc);
    r.map_err(|e| {
        st.errmsg = CString::new(e.to_string().replace('\0', " ")).unwrap_or_default();
        e.code()
    })
}

/// Why a call failed: [`Failure::code`] is what it returns, the text what
/// `imc_errmsg` gives afterwards.
#[derive(Debug, thiserror::Error)]
enum Failure {
    /// imcd refused, or could not be reached.
    #[error(transparent)]
    Imc(#[from] ImcError),
    /// A transmit DMA could not be started or failed.
    #[error(transparent)]
    Dma(#[from] DmaError),
    /// An argument the call does not take (the text says which).
    #[error("{0}")]
    Invalid(String),
    /// `imc_asdetach` of a region this process has not attached.
    #[error("imc_asdetach: region {0} is not attached")]
    NotAttached(c_int),
    /// A lock call on a set this process has not allocated.
    #[error("{call}: no lock set {id} here")]
    NoLockSet { call: &'static str, id: c_int },
    /// The lock stayed held by another process.
    #[error("imc_lkacquire: lock {lock} of set {id} is held{}: {last}", gave_up(.waited))]
    LockBusy { lock: c_int, id: c_int, waited: Option<Duration>, last: String },
    /// `imc_dma_test` of a transfer still in flight.
    #[error("imc_dma_test: the transfer is in flight")]
    InFlight,
}

fn gave_up(waited: &Option<Duration>) -> String {
    waited.map(|w| format!(" (gave up after {w:?})")).unwrap_or_default()
}

impl Failure {
    /// The call's return code.
    fn code(&self) -> i32 {
        match self {
            Failure::Imc(ImcError::Refused { code, .. }) => code_of(*code),
            Failure::Imc(ImcError::NoDaemon(..)) => IMC_NODAEMON,
            Failure::Imc(_) => IMC_FAIL,
            Failure::Dma(e) => match e {
                DmaError::Range { .. } | DmaError::BadLength(_) | DmaError::NotInArea => IMC_INVALID,
                DmaError::Full(_) => IMC_DMA_FULL,
                DmaError::Failed { .. } | DmaError::Dropped { .. } | DmaError::Overwritten(_) => IMC_DMA_FAILED,
                DmaError::Timeout { .. } => IMC_DMA_PENDING,
                DmaError::Lock(_) | DmaError::Mem(_) | DmaError::Ring(_) => IMC_FAIL,
            },
            Failure::Invalid(_) => IMC_INVALID,
            Failure::NotAttached(_) | Failure::NoLockSet { .. } => IMC_NOTALLOC,
            Failure::LockBusy { .. } => IMC_LOCKBUSY,
            Failure::InFlight => IMC_DMA_PENDING,
        }
    }
}

fn invalid(msg: impl Into<String>) -> Failure {
    Failure::Invalid(msg.into())
}

fn rc(r: Result<(), i32>) -> c_int {
    r.err().unwrap_or(IMC_SUCCESS)
}

/// `imc_asalloc`: finds or creates the region `key` of `size` bytes.
///
/// # Safety
/// `id` is NULL (refused with IMC_INVALID) or points to an `int` the
/// call may write.
#[no_mangle]
pub unsafe extern "C" fn imc_asalloc(key: c_long, size: usize, perm: c_int, flag: c_int, id: *mut c_int) -> c_int {
    rc(with(|_, imc| {
        if id.is_null() {
            return Err(invalid("imc_asalloc: id is NULL"));
        }
        if size == 0 || flag & !(IMC_COHERENT | IMC_EXCL) != 0 {
            return Err(invalid(format!("imc_asalloc: size {size}, flag {flag:#x}")));
        }
        let (rid, ..) = imc.asalloc_flags(
            key as u64,
            size as u64,
            perm as u32 & 0o777,
            flag & IMC_EXCL != 0,
            flag & IMC_COHERENT != 0,
        )?;
        // SAFETY: checked non-null; the caller passes a pointer to an imc_asid_t.
        unsafe { *id = rid as c_int };
        Ok(())
    }))
}

/// `imc_asattach`: maps region `id` for transmit or receive; `*addr` gets the address.
///
/// # Safety
/// `addr` is NULL (refused with IMC_INVALID) or points to a `char *`
/// the call may write.
#[no_mangle]
pub unsafe extern "C" fn imc_asattach(
    id: c_int,
    dir: c_int,
    share: c_int,
    flag: c_int,
    addr: *mut *mut c_char,
) -> c_int {
    rc(with(|st, imc| {
        if addr.is_null() || id < 0 {
            return Err(invalid(format!("imc_asattach: region {id}, addr {addr:?}")));
        }
        let transmit = match dir {
            IMC_TRANSMIT => true,
            IMC_RECEIVE => false,
            _ => return Err(invalid(format!("imc_asattach: direction {dir} (IMC_TRANSMIT or IMC_RECEIVE)"))),
        };
        if share != IMC_SHARED || flag & !IMC_LOOPBACK != 0 || (!transmit && flag != 0) {
            return Err(invalid(format!("imc_asattach: share {share}, flag {flag:#x}")));
        }
        let m = imc.asattach(id as u32, transmit, flag & IMC_LOOPBACK != 0)?;
        // SAFETY: checked non-null; the caller passes a pointer to a caddr_t.
        unsafe { *addr = m.as_ptr().cast() };
        st.maps.entry(id).or_default().push(m);
        Ok(())
    }))
}

/// `imc_asdetach`: unmaps this process's attachments of region `id`.
#[no_mangle]
pub extern "C" fn imc_asdetach(id: c_int) -> c_int {
    rc(with(|st, _| match st.maps.remove(&id) {
        Some(_) => {
            st.targets.remove(&id);
            Ok(())
        }
        None => Err(Failure::NotAttached(id)),
    }))
}

/// `imc_asdealloc`: this process lets go of region `id` (detaching it); the
/// last holder in the cluster frees it.
#[no_mangle]
pub extern "C" fn imc_asdealloc(id: c_int) -> c_int {
    rc(with(|st, imc| {
        st.maps.remove(&id);
        st.targets.remove(&id);
        imc.asdealloc(id as u32).map_err(Failure::from)
    }))
}

/// `imc_lkalloc`: finds or creates the spinlock set `key` of `*nlocks` locks.
/// With IMC_CREATOR it must be new (else IMC_EXISTS) and lock 0 is held on return.
///
/// # Safety
/// `nlocks` and `id` are NULL (refused with IMC_INVALID) or point to
/// `int`s the call may read and write.
#[no_mangle]
pub unsafe extern "C" fn imc_lkalloc(
    key: c_long,
    nlocks: *mut c_int,
    perm: c_int,
    flag: c_int,
    id: *mut c_int,
) -> c_int {
    rc(with(|st, imc| {
        if nlocks.is_null() || id.is_null() {
            return Err(invalid("imc_lkalloc: nlocks or id is NULL"));
        }
        // SAFETY: checked non-null.
        let n = unsafe { *nlocks };
        if n <= 0 || flag & !(IMC_CREATOR | IMC_EXCL) != 0 {
            return Err(invalid(format!("imc_lkalloc: {n} locks, flag {flag:#x}")));
        }
        if flag & IMC_EXCL != 0 && flag & IMC_CREATOR == 0 {
            return Err(invalid("imc_lkalloc: exclusive creation is IMC_CREATOR"));
        }
        let (set, _) = imc.lkalloc(key as u64, n as u32, perm as u32 & 0o777, flag & IMC_CREATOR != 0)?;
        // SAFETY: checked non-null.
        unsafe {
            *nlocks = set.nlocks as c_int;
            *id = set.id as c_int;
        }
        st.locks.insert(set.id as i32, set);
        Ok(())
    }))
}

/// Longest an `IMC_LOCKWAIT` acquire waits, unless `IMC_LOCKWAIT_SECONDS`
/// in the environment says otherwise: a lock whose holder's release was
/// lost (its node's link went down) would otherwise be waited on for ever.
const LOCKWAIT_LIMIT: Duration = Duration::from_secs(120);

fn lockwait_limit() -> Duration {
    std::env::var("IMC_LOCKWAIT_SECONDS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&s| s > 0)
        .map(Duration::from_secs)
        .unwrap_or(LOCKWAIT_LIMIT)
}

/// `imc_lkacquire`: takes lock `lock` of set `id`. IMC_LOCKWAIT waits up to
/// [`LOCKWAIT_LIMIT`] (or `IMC_LOCKWAIT_SECONDS`); otherwise 1 + `retries`
/// attempts. Either way a lock not taken is IMC_LOCKBUSY.
#[no_mangle]
pub extern "C" fn imc_lkacquire(id: c_int, lock: c_int, retries: c_int, flag: c_int) -> c_int {
    rc(with(|st, _| {
        let set = st.locks.get(&id).ok_or(Failure::NoLockSet { call: "imc_lkacquire", id })?;
        if lock < 0 {
            return Err(invalid(format!("imc_lkacquire: lock {lock}")));
        }
        let wait = flag & IMC_LOCKWAIT != 0;
        let deadline = wait.then(|| Instant::now() + lockwait_limit());
        let attempts = if wait { u32::MAX } else { 1 + retries.max(0) as u32 };
        let per_try = if wait { Duration::from_secs(10) } else { Duration::from_millis(50) };
        let mut last = String::new();
        for _ in 0..attempts {
            let try_for = match deadline {
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => left.min(per_try),
                    _ => break,
                },
                None => per_try,
            };
            match set.acquire(lock as u32, try_for) {
                Ok(()) => return Ok(()),
                Err(ImcError::Refused { code: Status::Timeout, message }) => last = message,
                Err(e) => return Err(e.into()),
            }
        }
        Err(Failure::LockBusy { lock, id, waited: wait.then(lockwait_limit), last })
    }))
}

/// `imc_lkrelease`.
#[no_mangle]
pub extern "C" fn imc_lkrelease(id: c_int, lock: c_int) -> c_int {
    rc(with(|st, _| {
        let set = st.locks.get(&id).ok_or(Failure::NoLockSet { call: "imc_lkrelease", id })?;
        if lock < 0 {
            return Err(invalid(format!("imc_lkrelease: lock {lock}")));
        }
        set.release(lock as u32).map_err(Failure::from)
    }))
}

/// `imc_lkdealloc`: this process lets go of the set; the last holder frees it.
#[no_mangle]
pub extern "C" fn imc_lkdealloc(id: c_int) -> c_int {
    rc(with(|st, imc| {
        let set = st.locks.remove(&id).ok_or(Failure::NoLockSet { call: "imc_lkdealloc", id })?;
        imc.lkdealloc(set).map_err(Failure::from)
    }))
}

fn regs(st: &mut State, imc: &Imc) -> Result<(), Failure> {
    if st.regs.is_none() {
        st.regs = Some(imc.regs()?);
    }
    Ok(())
}

/// `imc_rderrcnt`: the adapter's error count (mapped on the first call;
/// later calls are one load), or -1.
#[no_mangle]
pub extern "C" fn imc_rderrcnt() -> c_int {
    with(|st, imc| {
        regs(st, imc)?;
        Ok(st.regs.as_ref().map(|r| r.rderrcnt() as c_int).unwrap_or(-1))
    })
    .unwrap_or(-1)
}

/// `imc_ckerrcnt`: asks every node (through the ACK page) for errors not
/// yet in the clusterwide count; nonzero when the count moved since
/// `*errors` or errors are outstanding (`*errors` is updated). -1 on failure.
///
/// # Safety
/// `errors` is NULL (refused) or points to an `int` the call may read
/// and write.
#[no_mangle]
pub unsafe extern "C" fn imc_ckerrcnt(errors: *mut c_int) -> c_int {
    with(|st, imc| {
        if errors.is_null() {
            return Err(invalid("imc_ckerrcnt: errors is NULL"));
        }
        regs(st, imc)?;
        let r = st.regs.as_ref().expect("mapped above");
        // SAFETY: checked non-null.
        let e = unsafe { &mut *errors };
        let mut count = *e as u32;
        let moved = r.ckerrcnt(&mut count);
        *e = count as c_int;
        Ok(moved as c_int)
    })
    .unwrap_or(-1)
}

/// `imc_kill`: sends `sig` to `pid` on `host` (host name or node number).
///
/// # Safety
/// `host` is NULL (refused with IMC_INVALID) or points to a
/// NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn imc_kill(host: *const c_char, pid: libc::pid_t, sig: c_int) -> c_int {
    rc(with(|_, imc| {
        if host.is_null() {
            return Err(invalid("imc_kill: host is NULL"));
        }
        // SAFETY: non-null, and the caller passes a NUL-terminated string.
        let h = unsafe { CStr::from_ptr(host) }.to_string_lossy().into_owned();
        imc.kill(&h, pid, sig).map_err(Failure::from)
    }))
}

/// `imc_gethosts`: fills up to `max` entries; returns the number of hosts, or -1.
///
/// # Safety
/// `hosts` points to `max` `imc_host_t`s the call may write, or is NULL
/// with `max` 0 or less (only the count comes back; NULL with `max` > 0
/// is refused with IMC_INVALID).
#[no_mangle]
pub unsafe extern "C" fn imc_gethosts(hosts: *mut ImcHost, max: c_int) -> c_int {
    with(|_, imc| {
        if hosts.is_null() && max > 0 {
            return Err(invalid("imc_gethosts: hosts is NULL"));
        }
        let list = imc.gethosts()?;
        for (i, (node, name)) in list.iter().take(max.max(0) as usize).enumerate() {
            let mut h = ImcHost { node: *node as c_int, name: [0; IMC_HOSTNAME_LEN as usize] };
            for (d, s) in h.name.iter_mut().zip(name.bytes().take(IMC_HOSTNAME_LEN as usize - 1)) {
                *d = s as c_char;
            }
            // SAFETY: the caller gives room for `max` entries; i < max.
            unsafe { hosts.add(i).write(h) };
        }
        Ok(list.len() as c_int)
    })
    .unwrap_or(-1)
}

/// `imc_errmsg`: the last failure of this process's calls, in words.
#[no_mangle]
pub extern "C" fn imc_errmsg() -> *const c_char {
    static EMPTY: &CStr = c"";
    let guard = STATE.lock().unwrap_or_else(|e| e.into_inner());
    match guard.as_ref() {
        // The message lives in the process-wide state until the next failure.
        Some(st) => st.errmsg.as_ptr(),
        None => EMPTY.as_ptr(),
    }
}

// Extensions: not in the paper's Table 1. Transmit DMA (`docs/imc.md`,
// "Transmit DMA"): set up through imcd, transfers without it.

/// `imc_dma_t`: a transfer in flight (opaque to C).
#[repr(C)]
pub struct ImcDma {
    /// The handle's words.
    pub w: [u64; 3],
}

/// `imc_dma_open` (extension): sets up transmit DMA for this process with
/// a buffer of `size` bytes; `*addr` and `*len` get the buffer. Transfers
/// start from bytes in it.
///
/// # Safety
/// `addr` and `len` are NULL (refused with IMC_INVALID) or point to a
/// `char *` and a `size_t` the call may write.
#[no_mangle]
pub unsafe extern "C" fn imc_dma_open(size: usize, addr: *mut *mut c_char, len: *mut usize) -> c_int {
    rc(with(|st, imc| {
        if addr.is_null() || len.is_null() {
            return Err(invalid("imc_dma_open: addr or len is NULL"));
        }
        if st.dma.is_none() {
            st.dma = Some(imc.dma_open(size as u64)?);
        }
        let buf = st.dma.as_ref().expect("set above").buffer();
        // SAFETY: checked non-null; the caller passes a caddr_t * and a size_t *.
        unsafe {
            *addr = buf.as_ptr().cast();
            *len = buf.len();
        }
        Ok(())
    }))
}

/// `imc_dma_start` (extension): starts copying `len` bytes at `src` (inside
/// the buffer of `imc_dma_open`) into region `id` at byte `offset`; the
/// region must be attached for transmit by this process. Returns at once;
/// `*handle` is for `imc_dma_test` / `imc_dma_wait`.
///
/// # Safety
/// `handle` is NULL (refused with IMC_INVALID) or points to an
/// `imc_dma_t` the call may write. `src` is only compared with the buffer
/// of `imc_dma_open` (a range outside it is refused), never read here.
#[no_mangle]
pub unsafe extern "C" fn imc_dma_start(
    id: c_int,
    offset: usize,
    src: *const libc::c_void,
    len: usize,
    handle: *mut ImcDma,
) -> c_int {
    rc(with(|st, imc| {
        if handle.is_null() || id < 0 {
            return Err(invalid(format!("imc_dma_start: region {id}, handle {handle:?}")));
        }
        let Some(port) = st.dma.as_ref() else {
            return Err(invalid("imc_dma_start: call imc_dma_open first"));
        };
        let src_off = port.offset_of(src.cast(), len as u64)?;
        let t = match st.targets.get(&id) {
            Some(t) => *t,
            None => {
                let t = imc.dma_target(id as u32)?;
                *st.targets.entry(id).or_insert(t)
            }
        };
        let h = port.start(&t, offset as u64, src_off, len as u64)?;
        // SAFETY: checked non-null; the caller passes an imc_dma_t *.
        unsafe { (*handle).w = h.to_words() };
        Ok(())
    }))
}

fn dma_handle(st: &State, handle: *const ImcDma, what: &str) -> Result<DmaHandle, Failure> {
    if handle.is_null() {
        return Err(invalid(format!("{what}: handle is NULL")));
    }
    if st.dma.is_none() {
        return Err(invalid(format!("{what}: call imc_dma_open first")));
    }
    // SAFETY: checked non-null; the caller passes an imc_dma_t * from imc_dma_start.
    Ok(DmaHandle::from_words(unsafe { (*handle).w }))
}

/// `imc_dma_test` (extension): IMC_SUCCESS once the transfer was sent
/// whole, IMC_DMA_PENDING while it is in flight, IMC_DMA_FAILED if the
/// adapter stopped it (imc_errmsg says why).
///
/// # Safety
/// `handle` is NULL (refused with IMC_INVALID) or points to an
/// `imc_dma_t` that `imc_dma_start` filled in.
#[no_mangle]
pub unsafe extern "C" fn imc_dma_test(handle: *const ImcDma) -> c_int {
    rc(with(|st, _| {
        let h = dma_handle(st, handle, "imc_dma_test")?;
        match st.dma.as_ref().expect("checked").test(&h)? {
            Some(_) => Ok(()),
            None => Err(Failure::InFlight),
        }
    }))
}

/// `imc_dma_wait` (extension): waits up to `timeout_ms` for the transfer;
/// what `imc_dma_test` answers then.
///
/// # Safety
/// `handle` is NULL (refused with IMC_INVALID) or points to an
/// `imc_dma_t` that `imc_dma_start` filled in.
#[no_mangle]
pub unsafe extern "C" fn imc_dma_wait(handle: *const ImcDma, timeout_ms: c_int) -> c_int {
    rc(with(|st, _| {
        let h = dma_handle(st, handle, "imc_dma_wait")?;
        let limit = Duration::from_millis(timeout_ms.max(0) as u64);
        st.dma.as_ref().expect("checked").wait(&h, limit).map(|_| ()).map_err(Failure::from)
    }))
}
