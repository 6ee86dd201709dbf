//! One-sided communication's C entry points: windows (`MPI_Win_create`,
//! `_allocate`, `_allocate_shared`, `_create_dynamic` with attach and
//! detach), `MPI_Put`, `MPI_Get`, the accumulates, compare-and-swap and
//! their request forms, and the three synchronisations (fence; post,
//! start, complete, wait; lock, unlock, flush). The protocol is
//! [`crate::rma`]; this module maps handles, datatypes and groups onto it
//! and waits for it. The design is docs/mpi.md, "One-sided communication".
//!
//! Each window has a hidden duplicate of its communicator, whose context
//! id is also the window's id on the wire, and whose collectives serve
//! creation, fence-free freeing and `MPI_Win_get_group`.
//!
//! Touched by the application's threads, one at a time, under [`STATE`].

use std::ffi::{c_char, c_int, c_void};

use super::*;
use crate::entry;
use crate::rma::{Accum, Dest, Target, WinSpec};

/// Memory a window owns (`MPI_Win_allocate`, `MPI_Win_allocate_shared`).
#[derive(Debug)]
enum Owned {
    /// From the heap: its layout.
    Heap(usize, std::alloc::Layout),
    /// A shared mapping: address and length.
    Shared(usize, usize),
}

/// Where an origin is in an epoch with one target (passive target).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lock {
    /// Not locked.
    No,
    /// Locked (the target granted it).
    Held,
    /// Locked with `MPI_MODE_NOCHECK`: nothing was asked; the unlock
    /// flushes.
    Unchecked,
}

/// A window as the C layer tracks it.
#[derive(Debug)]
pub struct Window {
    /// The window's id on the wire (its hidden communicator's context).
    pub id: u32,
    /// The hidden communicator.
    pub comm: MPI_Comm,
    /// World rank of each rank of the window.
    pub ranks: Vec<u32>,
    /// Our rank in it.
    pub rank: u32,
    /// `MPI_WIN_FLAVOR_*`.
    pub flavor: c_int,
    /// Our window's base.
    pub base: usize,
    /// Its error handler.
    pub errhandler: MPI_Errhandler,
    /// Its name.
    pub name: String,
    /// Hints given at creation or by `MPI_Win_set_info`.
    pub info: Vec<(String, String)>,
    /// Every rank's displacement unit.
    units: Vec<u64>,
    /// Every rank's (base, size, displacement unit) for shared windows.
    shared: Vec<(usize, u64, u64)>,
    owned: Option<Owned>,
    /// The access epoch's group (`MPI_Win_start`), window ranks.
    start_group: Option<Vec<u32>>,
    /// The exposure epoch's group (`MPI_Win_post`), window ranks.
    post_group: Option<Vec<u32>>,
    /// Per target: the passive-target epoch.
    locks: Vec<Lock>,
    /// The predefined attributes' values, pointed to by `MPI_Win_get_attr`:
    /// size, displacement unit, flavor, memory model.
    attrs: Box<(MPI_Aint, c_int, c_int, c_int)>,
}

/// The window of handle `w`.
fn win(st: &State, w: MPI_Win) -> R<&Window> {
    match st.wins.get(&w) {
        Some(x) => Ok(x),
        None if w == MPI_WIN_NULL => err(MPI_ERR_WIN, "MPI_WIN_NULL"),
        None => err(MPI_ERR_WIN, format!("{w:#x} is not a window")),
    }
}

fn win_mut(st: &mut State, w: MPI_Win) -> R<&mut Window> {
    match st.wins.get_mut(&w) {
        Some(x) => Ok(x),
        None => err(MPI_ERR_WIN, format!("{w:#x} is not a window")),
    }
}

/// The error handler of window `w` (fatal when it is not one).
fn handler_of(w: MPI_Win) -> MPI_Errhandler {
    let g = STATE.lock().unwrap_or_else(|e| e.into_inner());
    g.as_ref().and_then(|s| s.wins.get(&w)).map_or(MPI_ERRORS_ARE_FATAL, |x| x.errhandler)
}

/// Turns a result into the C return code through window `w`'s error
/// handler.
pub fn ret_win(func: &str, w: MPI_Win, r: R<()>) -> c_int {
    match r {
        Ok(()) => MPI_SUCCESS,
        Err(e) => handle_error(func, handler_of(w), w, e),
    }
}

fn rma_err(e: EngineError) -> MpiErr {
    use crate::rma::RmaError as E;
    let class = match &e {
        EngineError::Rma(E::Range { .. }) => MPI_ERR_RMA_RANGE,
        EngineError::Rma(E::NoRank { .. }) => MPI_ERR_RANK,
        EngineError::Rma(E::Op(_)) => MPI_ERR_OP,
        EngineError::Rma(E::Refused { .. }) => MPI_ERR_RMA_RANGE,
        EngineError::Rma(E::NoWindow(_)) => MPI_ERR_WIN,
        _ => MPI_ERR_OTHER,
    };
    MpiErr { class, msg: e.to_string() }
}

/// Progress until `ready` says so; fails if a rank of `w` it may need
/// is gone. One round of progress comes first whatever `ready` says: a
/// rank that only ever locks and reads its own window (served without a
/// link) must still read the other ranks' lock requests, or they would
/// wait for it for ever (MPICH's `rma/linked_list` does this).
fn wait_for(st: &mut State, w: MPI_Win, mut ready: impl FnMut(&mut State) -> R<bool>) -> R<()> {
    sched::progress(st)?;
    let mut idle = 0;
    loop {
        if ready(st)? {
            return Ok(());
        }
        if sched::progress(st)? {
            idle = 0;
            continue;
        }
        for &p in &win(st, w)?.ranks {
            if let Some(e) = st.eng.peer_gone(p) {
                return Err(rma_err(e));
            }
        }
        crate::engine::backoff(&mut idle);
    }
}

/// Reports the first operation a target refused, if any.
fn check_refused(st: &mut State, w: MPI_Win) -> R<()> {
    let id = win(st, w)?.id;
    match st.eng.rma(|r| r.take_error(id)).map_err(rma_err)? {
        Some(e) => Err(rma_err(EngineError::Rma(e))),
        None => Ok(()),
    }
}

// ---------------------------------------------------------------------
// Creation and freeing
// ---------------------------------------------------------------------

/// What creation needs to know.
struct Make {
    base: usize,
    size: i64,
    unit: i64,
    flavor: c_int,
    info: MPI_Info,
}

/// The window hints MPI defines (MPI 4.0, 12.2.1), with their defaults
/// where the standard gives one; others are ignored, as it allows.
const HINTS: &[(&str, Option<&str>)] = &[
    ("no_locks", None),
    ("accumulate_ordering", Some("rar,raw,war,waw")),
    ("accumulate_ops", Some("same_op_no_op")),
    ("mpi_accumulate_granularity", None),
    ("same_size", None),
    ("same_disp_unit", None),
    ("alloc_shared_noncontig", None),
];

/// The hints in force: the defaults, then `given`.
fn hints(given: &[(String, String)]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> =
        HINTS.iter().filter_map(|(k, d)| d.map(|d| (k.to_string(), d.to_string()))).collect();
    set_hints(&mut v, given);
    v
}

/// Sets the known hints of `given` in `info`.
fn set_hints(info: &mut Vec<(String, String)>, given: &[(String, String)]) {
    for (k, val) in given {
        if HINTS.iter().any(|h| h.0 == k) {
            info.retain(|e| &e.0 != k);
            info.push((k.clone(), val.clone()));
        }
    }
}

/// Creates a window over `comm` (collective): agrees its id, exchanges
/// sizes and units, registers it, and waits until every rank has.
fn create(st: &mut State, comm: MPI_Comm, m: Make, shared: bool) -> R<MPI_Win> {
    if m.size < 0 {
        return err(MPI_ERR_SIZE, format!("window size {} is negative", m.size));
    }
    if m.unit <= 0 {
        return err(MPI_ERR_DISP, format!("displacement unit {} must be positive", m.unit));
    }
    let c = st.comm(comm)?.clone();
    if c.is_inter() {
        return err(MPI_ERR_COMM, "windows are created over intracommunicators");
    }
    let ctx = st.agree_ctx(comm)?;
    let node = if shared { comm::node_id() as u64 } else { 0 };
    let all = coll::allgather_u64(st, comm, &[m.size as u64, m.unit as u64, node])?;
    let n = c.size() as usize;
    let sizes: Vec<u64> = (0..n).map(|i| all[3 * i]).collect();
    let units: Vec<u64> = (0..n).map(|i| all[3 * i + 1]).collect();
    if shared && (0..n).any(|i| all[3 * i + 2] != node) {
        return err(
            MPI_ERR_RMA_SHARED,
            "MPI_Win_allocate_shared needs every rank on one guest (split with MPI_COMM_TYPE_SHARED)",
        );
    }
    let hidden = comm::add_comm(st, Comm::intra(ctx, c.ranks.clone(), c.rank, MPI_ERRORS_ARE_FATAL));
    let mut base = m.base;
    let mut owned = None;
    let mut shared_bases = Vec::new();
    if shared {
        let (addr, len, bases) = map_shared(st, hidden, ctx, &sizes)?;
        owned = Some(Owned::Shared(addr, len));
        base = bases[c.rank as usize];
        shared_bases = (0..n).map(|i| (bases[i], sizes[i], units[i])).collect();
    } else if m.flavor == MPI_WIN_FLAVOR_ALLOCATE {
        let layout = std::alloc::Layout::from_size_align((m.size as usize).max(1), 64)
            .map_err(|e| MpiErr { class: MPI_ERR_NO_MEM, msg: e.to_string() })?;
        // SAFETY: a layout of non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        if p.is_null() {
            return err(MPI_ERR_NO_MEM, format!("no memory for a window of {} bytes", m.size));
        }
        base = p as usize;
        owned = Some(Owned::Heap(base, layout));
    }
    let spec = WinSpec {
        ranks: c.ranks.clone(),
        me: c.rank,
        base,
        sizes,
        units: units.clone(),
        dynamic: m.flavor == MPI_WIN_FLAVOR_DYNAMIC,
    };
    st.eng
        .rma(|r| {
            r.create(ctx, spec);
            Ok(())
        })
        .map_err(rma_err)?;
    // Nobody sends to the window before every rank knows it.
    coll::barrier_now(st, hidden)?;
    let mut info = hints(&[]);
    set_hints(&mut info, st.infos.get(&m.info).map(|v| v.as_slice()).unwrap_or(&[]));
    let h = st.handle();
    let model = MPI_WIN_UNIFIED;
    st.wins.insert(
        h,
        Window {
            id: ctx,
            comm: hidden,
            ranks: c.ranks.clone(),
            rank: c.rank,
            flavor: m.flavor,
            base,
            errhandler: MPI_ERRORS_ARE_FATAL,
            name: String::new(),
            info,
            units,
            shared: shared_bases,
            owned,
            start_group: None,
            post_group: None,
            locks: vec![Lock::No; n],
            attrs: Box::new((m.size as MPI_Aint, m.unit as c_int, m.flavor, model)),
        },
    );
    Ok(h)
}

/// One shared mapping holding every rank's part, each rounded up to 64
/// bytes (rank 0 creates it in /dev/shm, the others open it, then it is
/// unlinked). Returns the mapping, its length and each rank's base.
fn map_shared(st: &mut State, comm: MPI_Comm, ctx: u32, sizes: &[u64]) -> R<(usize, usize, Vec<usize>)> {
    let round = |s: u64| s.div_ceil(64) * 64;
    let mut offs = Vec::with_capacity(sizes.len());
    let mut total = 0u64;
    for &s in sizes {
        offs.push(total);
        total += round(s);
    }
    let len = total.max(64) as usize;
    let me = st.comm(comm)?.rank;
    let owner = coll::bcast_u64(st, comm, 0, vec![std::process::id() as u64])?[0];
    let path = format!("/dev/shm/mcmpi-win-{}-{owner}-{ctx}", st.place.job);
    let fail = |what: &str, e: std::io::Error| MpiErr { class: MPI_ERR_NO_MEM, msg: format!("{what} {path}: {e}") };
    if me == 0 {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| fail("create", e))?;
        f.set_len(len as u64).map_err(|e| fail("size", e))?;
    }
    coll::barrier_now(st, comm)?;
    let f = std::fs::OpenOptions::new().read(true).write(true).open(&path).map_err(|e| fail("open", e))?;
    use std::os::fd::AsRawFd;
    // SAFETY: a new shared mapping of a file we hold open, of the length
    // rank 0 gave it; nothing else is mapped at the address the kernel picks.
    let p = unsafe {
        libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, f.as_raw_fd(), 0)
    };
    if p == libc::MAP_FAILED {
        return Err(fail("map", std::io::Error::last_os_error()));
    }
    coll::barrier_now(st, comm)?;
    if me == 0 {
        let _ = std::fs::remove_file(&path);
    }
    let base = p as usize;
    Ok((base, len, offs.iter().map(|&o| base + o as usize).collect()))
}

/// # Safety
/// Every pointer argument is null or points to what the MPI standard
/// requires of the argument of the same name in the calling function
/// (see [`put`](crate::ffi::put) and [`array`](crate::ffi::array)).
unsafe fn store_base(baseptr: *mut c_void, base: usize) -> R<()> {
    // SAFETY: the pointers are as this function's contract requires.
    unsafe { put(baseptr as *mut usize, base, "baseptr") }
}

/// # Safety
/// Every pointer argument is null or points to what the MPI standard
/// requires of the argument of the same name in the calling function
/// (see [`put`](crate::ffi::put) and [`array`](crate::ffi::array)).
unsafe fn new_window(comm: MPI_Comm, m: Make, shared: bool, win_out: *mut MPI_Win) -> R<usize> {
    nonnull(win_out, "win")?;
    let (h, base) = with(|st| {
        let h = create(st, comm, m, shared)?;
        Ok((h, win(st, h)?.base))
    })?;
    // SAFETY: the pointers are as this function's contract requires.
    unsafe { put(win_out, h, "win") }?;
    Ok(base)
}

entry!(MPI_Win_create / PMPI_Win_create(base: *mut c_void, size: MPI_Aint, unit: c_int, info: MPI_Info, comm: MPI_Comm, w: *mut MPI_Win) comm(comm) {
    new_window(comm, Make { base: base as usize, size: size as i64, unit: unit as i64, flavor: MPI_WIN_FLAVOR_CREATE, info }, false, w).map(|_| ())
});

entry!(MPI_Win_create_c / PMPI_Win_create_c(base: *mut c_void, size: MPI_Aint, unit: MPI_Aint, info: MPI_Info, comm: MPI_Comm, w: *mut MPI_Win) comm(comm) {
    new_window(comm, Make { base: base as usize, size: size as i64, unit: unit as i64, flavor: MPI_WIN_FLAVOR_CREATE, info }, false, w).map(|_| ())
});

entry!(MPI_Win_allocate / PMPI_Win_allocate(size: MPI_Aint, unit: c_int, info: MPI_Info, comm: MPI_Comm, baseptr: *mut c_void, w: *mut MPI_Win) comm(comm) {
    nonnull(baseptr, "baseptr")?;
    let b = new_window(comm, Make { base: 0, size: size as i64, unit: unit as i64, flavor: MPI_WIN_FLAVOR_ALLOCATE, info }, false, w)?;
    store_base(baseptr, b)
});

entry!(MPI_Win_allocate_c / PMPI_Win_allocate_c(size: MPI_Aint, unit: MPI_Aint, info: MPI_Info, comm: MPI_Comm, baseptr: *mut c_void, w: *mut MPI_Win) comm(comm) {
    nonnull(baseptr, "baseptr")?;
    let b = new_window(comm, Make { base: 0, size: size as i64, unit: unit as i64, flavor: MPI_WIN_FLAVOR_ALLOCATE, info }, false, w)?;
    store_base(baseptr, b)
});

entry!(MPI_Win_allocate_shared / PMPI_Win_allocate_shared(size: MPI_Aint, unit: c_int, info: MPI_Info, comm: MPI_Comm, baseptr: *mut c_void, w: *mut MPI_Win) comm(comm) {
    nonnull(baseptr, "baseptr")?;
    let b = new_window(comm, Make { base: 0, size: size as i64, unit: unit as i64, flavor: MPI_WIN_FLAVOR_SHARED, info }, true, w)?;
    store_base(baseptr, b)
});

entry!(MPI_Win_allocate_shared_c / PMPI_Win_allocate_shared_c(size: MPI_Aint, unit: MPI_Aint, info: MPI_Info, comm: MPI_Comm, baseptr: *mut c_void, w: *mut MPI_Win) comm(comm) {
    nonnull(baseptr, "baseptr")?;
    let b = new_window(comm, Make { base: 0, size: size as i64, unit: unit as i64, flavor: MPI_WIN_FLAVOR_SHARED, info }, true, w)?;
    store_base(baseptr, b)
});

entry!(MPI_Win_create_dynamic / PMPI_Win_create_dynamic(info: MPI_Info, comm: MPI_Comm, w: *mut MPI_Win) comm(comm) {
    new_window(comm, Make { base: 0, size: 0, unit: 1, flavor: MPI_WIN_FLAVOR_DYNAMIC, info }, false, w).map(|_| ())
});

fn shared_query(w: MPI_Win, rank: c_int) -> R<(u64, u64, usize)> {
    with(|st| {
        let x = win(st, w)?;
        if x.flavor != MPI_WIN_FLAVOR_SHARED {
            return err(MPI_ERR_RMA_FLAVOR, "MPI_Win_shared_query needs a window of MPI_Win_allocate_shared");
        }
        let pick = if rank == MPI_PROC_NULL {
            // The first rank with memory.
            x.shared.iter().find(|s| s.1 > 0).or_else(|| x.shared.first())
        } else {
            x.shared.get(usize::try_from(rank).unwrap_or(usize::MAX))
        };
        let Some(&(base, size, unit)) = pick else {
            return err(MPI_ERR_RANK, format!("rank {rank} is not in the window"));
        };
        // A rank with no memory has no base (NULL), as in MPICH.
        Ok((size, unit, if size == 0 { 0 } else { base }))
    })
}

entry!(MPI_Win_shared_query / PMPI_Win_shared_query(w: MPI_Win, rank: c_int, size: *mut MPI_Aint, unit: *mut c_int, baseptr: *mut c_void) win(w) {
    let (s, u, b) = shared_query(w, rank)?;
    put(size, s as MPI_Aint, "size")?;
    put(unit, u as c_int, "disp_unit")?;
    store_base(baseptr, b)
});

entry!(MPI_Win_shared_query_c / PMPI_Win_shared_query_c(w: MPI_Win, rank: c_int, size: *mut MPI_Aint, unit: *mut MPI_Aint, baseptr: *mut c_void) win(w) {
    let (s, u, b) = shared_query(w, rank)?;
    put(size, s as MPI_Aint, "size")?;
    put(unit, u as MPI_Aint, "disp_unit")?;
    store_base(baseptr, b)
});

entry!(MPI_Win_attach / PMPI_Win_attach(w: MPI_Win, base: *mut c_void, size: MPI_Aint) win(w) {
    with(|st| {
        let x = win(st, w)?;
        if x.flavor != MPI_WIN_FLAVOR_DYNAMIC {
            return err(MPI_ERR_RMA_FLAVOR, "MPI_Win_attach needs a window of MPI_Win_create_dynamic");
        }
        if size < 0 {
            return err(MPI_ERR_SIZE, format!("size {size} is negative"));
        }
        let id = x.id;
        st.eng.rma(|r| r.attach(id, base as usize, size as usize)).map_err(rma_err)
    })
});

entry!(MPI_Win_detach / PMPI_Win_detach(w: MPI_Win, base: *const c_void) win(w) {
    with(|st| {
        let id = win(st, w)?.id;
        if !st.eng.rma(|r| r.detach(id, base as usize)).map_err(rma_err)? {
            return err(MPI_ERR_RMA_ATTACH, format!("no memory at {base:p} is attached to the window"));
        }
        Ok(())
    })
});

entry!(MPI_Win_free / PMPI_Win_free(w: *mut MPI_Win) win(array(w as *const MPI_Win, 1, "win").map(|v| v[0]).unwrap_or(MPI_WIN_NULL)) {
    let h = array(w as *const MPI_Win, 1, "win")?[0];
    with(|st| {
        let x = win(st, h)?;
        if x.start_group.is_some() || x.post_group.is_some() || x.locks.iter().any(|&l| l != Lock::No) {
            return err(MPI_ERR_RMA_SYNC, "MPI_Win_free with an epoch still open (complete, wait or unlock first)");
        }
        let (id, comm) = (x.id, x.comm);
        // Every rank is done with the window before its memory goes.
        coll::barrier_now(st, comm)?;
        check_refused(st, h)?;
        st.eng.rma(|r| r.free(id)).map_err(rma_err)?;
        st.comms.remove(&comm);
        if let Some(x) = st.wins.remove(&h) {
            match x.owned {
                // SAFETY: memory this window allocated with this layout,
                // no longer reachable through the window.
                Some(Owned::Heap(p, layout)) => unsafe { std::alloc::dealloc(p as *mut u8, layout) },
                // SAFETY: the mapping this window made, of this length.
                Some(Owned::Shared(p, len)) => unsafe {
                    libc::munmap(p as *mut c_void, len);
                },
                None => {}
            }
        }
        Ok(())
    })?;
    super::attr::drop_all(h)?;
    put(w, MPI_WIN_NULL, "win")
});

// ---------------------------------------------------------------------
// Communication
// ---------------------------------------------------------------------

/// One operation's arguments, as the C calls give them.
struct Op {
    origin: usize,
    ocount: i64,
    otype: MPI_Datatype,
    result: usize,
    rcount: i64,
    rtype: MPI_Datatype,
    rank: c_int,
    disp: MPI_Aint,
    tcount: i64,
    ttype: MPI_Datatype,
    op: MPI_Op,
}

enum What {
    Put,
    Get,
    Acc,
    GetAcc,
}

fn count_of(n: i64) -> R<u64> {
    u64::try_from(n).map_err(|_| MpiErr { class: MPI_ERR_COUNT, msg: format!("count {n} is negative") })
}

/// The target of `o` in window `x`: `None` for `MPI_PROC_NULL`.
fn target_of(st: &State, x: &Window, o: &Op) -> R<Option<Target>> {
    if o.rank == MPI_PROC_NULL {
        return Ok(None);
    }
    let rank = u32::try_from(o.rank)
        .ok()
        .filter(|&r| (r as usize) < x.ranks.len())
        .ok_or_else(|| MpiErr { class: MPI_ERR_RANK, msg: format!("rank {} is not in the window", o.rank) })?;
    let dt = st.dtype(o.ttype)?;
    let unit = if x.flavor == MPI_WIN_FLAVOR_DYNAMIC { 1 } else { x.units[rank as usize] };
    if o.disp < 0 && x.flavor != MPI_WIN_FLAVOR_DYNAMIC {
        return err(MPI_ERR_DISP, format!("target displacement {} is negative", o.disp));
    }
    let addr = (o.disp as i64 as u64).wrapping_mul(unit);
    Ok(Some(Target { rank, addr, count: count_of(o.tcount)?, dt }))
}

/// The op of an accumulate: predefined only, as MPI requires.
fn builtin_op(op: MPI_Op) -> R<crate::op::Builtin> {
    super::types::builtin(op).ok_or_else(|| MpiErr {
        class: MPI_ERR_OP,
        msg: "one-sided accumulates take predefined operations only (MPI_SUM ... MPI_REPLACE, MPI_NO_OP)".into(),
    })
}

/// Packs `count` elements of `t` at `buf`.
fn pack(st: &State, buf: usize, count: u64, t: MPI_Datatype) -> R<Vec<u8>> {
    let dt = st.dtype(t)?;
    let n = dt.size().saturating_mul(count) as usize;
    let mut v = vec![0u8; n];
    if n > 0 {
        // (A null address is MPI_BOTTOM: the type's displacements are
        // absolute addresses.)
        // SAFETY: the origin buffer holds `count` elements of its type
        // (MPI's rule for origin buffers).
        unsafe { dt.pack(count, buf as *const u8, &mut v) };
    }
    Ok(v)
}

/// Issues one operation on window `w`; a reply id for those whose data
/// comes back.
fn issue(st: &mut State, w: MPI_Win, o: Op, what: What) -> R<Option<u64>> {
    let x = win(st, w)?;
    let Some(t) = target_of(st, x, &o)? else { return Ok(None) };
    let id = x.id;
    let max = st.eng.rma_frame();
    let tbytes = t.dt.size().saturating_mul(t.count);
    let ocount = count_of(o.ocount)?;
    if tbytes == 0 {
        // Nothing moves (MPI allows zero counts and empty types).
        return Ok(None);
    }
    let mismatch = |have: u64| MpiErr {
        class: MPI_ERR_TYPE,
        msg: format!("the origin has {have} bytes of data and the target {tbytes} (the type signatures must match)"),
    };
    let r = match what {
        What::Put => {
            let data = pack(st, o.origin, ocount, o.otype)?;
            if data.len() as u64 != tbytes {
                return Err(mismatch(data.len() as u64));
            }
            st.eng.rma(|r| r.put(id, &t, &data, max)).map(|_| None)
        }
        What::Get => {
            let dt = st.dtype(o.otype)?;
            if dt.size() * ocount != tbytes {
                return Err(mismatch(dt.size() * ocount));
            }
            let dest = Dest { ptr: o.origin, count: ocount, dt };
            st.eng.rma(|r| r.get(id, &t, dest, max)).map(Some)
        }
        What::Acc | What::GetAcc => {
            let bop = builtin_op(o.op)?;
            let kind = crate::op::kind_for(bop, &t.dt).map_err(|e| MpiErr { class: MPI_ERR_OP, msg: e.to_string() })?;
            let acc = Accum { op: bop, kind };
            let data = if bop == crate::op::Builtin::NoOp {
                vec![0u8; tbytes as usize]
            } else {
                pack(st, o.origin, ocount, o.otype)?
            };
            if data.len() as u64 != tbytes {
                return Err(mismatch(data.len() as u64));
            }
            if let What::Acc = what {
                st.eng.rma(|r| r.accumulate(id, &t, &data, acc, max)).map(|_| None)
            } else {
                let dt = st.dtype(o.rtype)?;
                let rcount = count_of(o.rcount)?;
                if dt.size() * rcount != tbytes {
                    return Err(mismatch(dt.size() * rcount));
                }
                let dest = Dest { ptr: o.result, count: rcount, dt };
                st.eng.rma(|r| r.get_accumulate(id, &t, &data, acc, dest, max)).map(Some)
            }
        }
    };
    r.map_err(rma_err)
}

/// An operation as a request (`MPI_Rput` ...): complete at once unless
/// data comes back.
fn request(st: &mut State, w: MPI_Win, reply: Option<u64>) -> R<MPI_Request> {
    let comm = win(st, w)?.comm;
    let h = st.handle();
    let mut p = Pending::new(None, comm, None, None);
    match reply {
        Some(r) => p.rma = Some(r),
        None => p.status = Some(super::p2p::empty_status()),
    }
    st.reqs.insert(h, p);
    Ok(h)
}

/// Frames an origin lets wait for room on one link before an operation
/// waits for them to drain (MPI lets a put block for local resources):
/// what queues for a slow target stays bounded.
const QUEUE_LIMIT: usize = 256;

/// # Safety
/// Every pointer argument is null or points to what the MPI standard
/// requires of the argument of the same name in the calling function
/// (see [`put`](crate::ffi::put) and [`array`](crate::ffi::array)).
unsafe fn op_put(o: Op, w: MPI_Win, req: Option<*mut MPI_Request>, what: What) -> R<()> {
    let h = with(|st| {
        let to = (o.rank >= 0).then(|| win(st, w).ok().and_then(|x| x.ranks.get(o.rank as usize).copied())).flatten();
        let r = issue(st, w, o, what)?;
        if let Some(to) = to {
            if st.eng.queued_frames(to) > QUEUE_LIMIT {
                wait_for(st, w, |st| Ok(st.eng.queued_frames(to) <= QUEUE_LIMIT / 2))?;
            }
        }
        match req {
            Some(_) => request(st, w, r).map(Some),
            None => Ok(None),
        }
    })?;
    match (req, h) {
        // SAFETY: the pointers are as this function's contract requires.
        (Some(p), Some(h)) => unsafe { put(p, h, "request") },
        _ => Ok(()),
    }
}

fn simple(
    origin: usize,
    ocount: i64,
    otype: MPI_Datatype,
    rank: c_int,
    disp: MPI_Aint,
    tcount: i64,
    ttype: MPI_Datatype,
    op: MPI_Op,
) -> Op {
    Op { origin, ocount, otype, result: 0, rcount: 0, rtype: MPI_DATATYPE_NULL, rank, disp, tcount, ttype, op }
}

macro_rules! put_get {
    ($($mpi:ident / $pmpi:ident, $cnt:ty, $what:ident;)*) => {$(
        entry!($mpi / $pmpi(origin: *const c_void, ocount: $cnt, otype: MPI_Datatype, rank: c_int, disp: MPI_Aint, tcount: $cnt, ttype: MPI_Datatype, w: MPI_Win) win(w) {
            op_put(simple(origin as usize, ocount as i64, otype, rank, disp, tcount as i64, ttype, MPI_OP_NULL), w, None, What::$what)
        });
    )*};
}

macro_rules! rput_get {
    ($($mpi:ident / $pmpi:ident, $cnt:ty, $what:ident;)*) => {$(
        entry!($mpi / $pmpi(origin: *const c_void, ocount: $cnt, otype: MPI_Datatype, rank: c_int, disp: MPI_Aint, tcount: $cnt, ttype: MPI_Datatype, w: MPI_Win, req: *mut MPI_Request) win(w) {
            nonnull(req, "request")?;
            op_put(simple(origin as usize, ocount as i64, otype, rank, disp, tcount as i64, ttype, MPI_OP_NULL), w, Some(req), What::$what)
        });
    )*};
}

put_get! {
    MPI_Put / PMPI_Put, c_int, Put;
    MPI_Put_c / PMPI_Put_c, MPI_Count, Put;
    MPI_Get / PMPI_Get, c_int, Get;
    MPI_Get_c / PMPI_Get_c, MPI_Count, Get;
}

rput_get! {
    MPI_Rput / PMPI_Rput, c_int, Put;
    MPI_Rput_c / PMPI_Rput_c, MPI_Count, Put;
    MPI_Rget / PMPI_Rget, c_int, Get;
    MPI_Rget_c / PMPI_Rget_c, MPI_Count, Get;
}

macro_rules! accumulate {
    ($($mpi:ident / $pmpi:ident, $cnt:ty;)*) => {$(
        entry!($mpi / $pmpi(origin: *const c_void, ocount: $cnt, otype: MPI_Datatype, rank: c_int, disp: MPI_Aint, tcount: $cnt, ttype: MPI_Datatype, op: MPI_Op, w: MPI_Win) win(w) {
            op_put(simple(origin as usize, ocount as i64, otype, rank, disp, tcount as i64, ttype, op), w, None, What::Acc)
        });
    )*};
}

macro_rules! raccumulate {
    ($($mpi:ident / $pmpi:ident, $cnt:ty;)*) => {$(
        entry!($mpi / $pmpi(origin: *const c_void, ocount: $cnt, otype: MPI_Datatype, rank: c_int, disp: MPI_Aint, tcount: $cnt, ttype: MPI_Datatype, op: MPI_Op, w: MPI_Win, req: *mut MPI_Request) win(w) {
            nonnull(req, "request")?;
            op_put(simple(origin as usize, ocount as i64, otype, rank, disp, tcount as i64, ttype, op), w, Some(req), What::Acc)
        });
    )*};
}

accumulate! {
    MPI_Accumulate / PMPI_Accumulate, c_int;
    MPI_Accumulate_c / PMPI_Accumulate_c, MPI_Count;
}

raccumulate! {
    MPI_Raccumulate / PMPI_Raccumulate, c_int;
    MPI_Raccumulate_c / PMPI_Raccumulate_c, MPI_Count;
}

macro_rules! get_accumulate {
    ($($mpi:ident / $pmpi:ident, $cnt:ty, $($req:ident)?;)*) => {$(
        entry!($mpi / $pmpi(origin: *const c_void, ocount: $cnt, otype: MPI_Datatype, result: *mut c_void, rcount: $cnt, rtype: MPI_Datatype,
                rank: c_int, disp: MPI_Aint, tcount: $cnt, ttype: MPI_Datatype, op: MPI_Op, w: MPI_Win $(, $req: *mut MPI_Request)?) win(w) {
            let o = Op { origin: origin as usize, ocount: ocount as i64, otype, result: result as usize, rcount: rcount as i64, rtype, rank, disp, tcount: tcount as i64, ttype, op };
            #[allow(unused_mut, unused_assignments)]
            let mut req: Option<*mut MPI_Request> = None;
            $( nonnull($req, "request")?; req = Some($req); )?
            op_put(o, w, req, What::GetAcc)
        });
    )*};
}

get_accumulate! {
    MPI_Get_accumulate / PMPI_Get_accumulate, c_int, ;
    MPI_Get_accumulate_c / PMPI_Get_accumulate_c, MPI_Count, ;
    MPI_Rget_accumulate / PMPI_Rget_accumulate, c_int, request;
    MPI_Rget_accumulate_c / PMPI_Rget_accumulate_c, MPI_Count, request;
}

entry!(MPI_Fetch_and_op / PMPI_Fetch_and_op(origin: *const c_void, result: *mut c_void, t: MPI_Datatype, rank: c_int, disp: MPI_Aint, op: MPI_Op, w: MPI_Win) win(w) {
    let o = Op { origin: origin as usize, ocount: 1, otype: t, result: result as usize, rcount: 1, rtype: t, rank, disp, tcount: 1, ttype: t, op };
    op_put(o, w, None, What::GetAcc)
});

entry!(MPI_Compare_and_swap / PMPI_Compare_and_swap(origin: *const c_void, compare: *const c_void, result: *mut c_void, t: MPI_Datatype, rank: c_int, disp: MPI_Aint, w: MPI_Win) win(w) {
    with(|st| {
        let o = simple(origin as usize, 1, t, rank, disp, 1, t, MPI_OP_NULL);
        let x = win(st, w)?;
        let Some(tg) = target_of(st, x, &o)? else { return Ok(()) };
        let id = x.id;
        let swap = pack(st, origin as usize, 1, t)?;
        let cmp = pack(st, compare as usize, 1, t)?;
        let dest = Dest { ptr: result as usize, count: 1, dt: st.dtype(t)? };
        st.eng.rma(|r| r.compare_and_swap(id, &tg, &cmp, &swap, dest)).map_err(rma_err)?;
        Ok(())
    })
});

// ---------------------------------------------------------------------
// Synchronisation
// ---------------------------------------------------------------------

entry!(MPI_Win_fence / PMPI_Win_fence(_assert: c_int, w: MPI_Win) win(w) {
    with(|st| {
        let id = win(st, w)?.id;
        let e = st.eng.rma(|r| r.fence_begin(id)).map_err(rma_err)?;
        wait_for(st, w, |st| st.eng.rma(|r| r.fence_done(id, e)).map_err(rma_err))?;
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        check_refused(st, w)
    })
});

/// The window ranks of group `g`'s members.
fn win_group(st: &State, x: &Window, g: MPI_Group) -> R<Vec<u32>> {
    let world = if g == MPI_GROUP_EMPTY {
        Vec::new()
    } else {
        st.groups
            .get(&g)
            .cloned()
            .ok_or_else(|| MpiErr { class: MPI_ERR_GROUP, msg: format!("{g:#x} is not a group") })?
    };
    world
        .iter()
        .map(|&p| {
            x.ranks.iter().position(|&r| r == p).map(|i| i as u32).ok_or_else(|| MpiErr {
                class: MPI_ERR_GROUP,
                msg: format!("world rank {p} of the group is not in the window"),
            })
        })
        .collect()
}

entry!(MPI_Win_post / PMPI_Win_post(g: MPI_Group, assert: c_int, w: MPI_Win) win(w) {
    with(|st| {
        let x = win(st, w)?;
        if x.post_group.is_some() {
            return err(MPI_ERR_RMA_SYNC, "MPI_Win_post while an exposure epoch is open (MPI_Win_wait first)");
        }
        let (id, grp) = (x.id, win_group(st, x, g)?);
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        if assert & MPI_MODE_NOCHECK == 0 {
            st.eng.rma(|r| r.post(id, &grp)).map_err(rma_err)?;
        }
        win_mut(st, w)?.post_group = Some(grp);
        Ok(())
    })
});

entry!(MPI_Win_start / PMPI_Win_start(g: MPI_Group, assert: c_int, w: MPI_Win) win(w) {
    with(|st| {
        let x = win(st, w)?;
        if x.start_group.is_some() {
            return err(MPI_ERR_RMA_SYNC, "MPI_Win_start while an access epoch is open (MPI_Win_complete first)");
        }
        let (id, grp) = (x.id, win_group(st, x, g)?);
        if assert & MPI_MODE_NOCHECK == 0 {
            wait_for(st, w, |st| st.eng.rma(|r| r.posted(id, &grp)).map_err(rma_err))?;
        }
        win_mut(st, w)?.start_group = Some(grp);
        Ok(())
    })
});

entry!(MPI_Win_complete / PMPI_Win_complete(w: MPI_Win) win(w) {
    with(|st| {
        let x = win_mut(st, w)?;
        let Some(grp) = x.start_group.take() else {
            return err(MPI_ERR_RMA_SYNC, "MPI_Win_complete without MPI_Win_start");
        };
        let id = x.id;
        st.eng.rma(|r| r.complete(id, &grp)).map_err(rma_err)?;
        wait_for(st, w, |st| Ok(!st.eng.rma_ref().replies_pending(id, None).map_err(|e| rma_err(e.into()))?))?;
        check_refused(st, w)
    })
});

fn exposure_done(st: &mut State, w: MPI_Win) -> R<bool> {
    let x = win(st, w)?;
    let Some(grp) = x.post_group.clone() else {
        return err(MPI_ERR_RMA_SYNC, "no exposure epoch is open (MPI_Win_post first)");
    };
    let id = x.id;
    let done = st.eng.rma(|r| r.completed(id, &grp)).map_err(rma_err)?;
    if done {
        win_mut(st, w)?.post_group = None;
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    }
    Ok(done)
}

entry!(MPI_Win_wait / PMPI_Win_wait(w: MPI_Win) win(w) {
    with(|st| {
        win(st, w)?;
        let mut first = Some(exposure_done(st, w)?);
        wait_for(st, w, |st| match first.take() {
            Some(d) => Ok(d),
            None => exposure_done(st, w),
        })
    })
});

entry!(MPI_Win_test / PMPI_Win_test(w: MPI_Win, flag: *mut c_int) win(w) {
    let done = with(|st| {
        if exposure_done(st, w)? {
            return Ok(true);
        }
        sched::progress(st)?;
        exposure_done(st, w)
    })?;
    put(flag, done as c_int, "flag")
});

/// The target rank of a passive-target call (`None`: `MPI_PROC_NULL`).
fn lock_target(x: &Window, rank: c_int) -> R<Option<u32>> {
    if rank == MPI_PROC_NULL {
        return Ok(None);
    }
    match u32::try_from(rank) {
        Ok(r) if (r as usize) < x.ranks.len() => Ok(Some(r)),
        _ => err(MPI_ERR_RANK, format!("rank {rank} is not in the window")),
    }
}

/// Locks `targets` (all asked first, then all awaited).
fn lock_many(st: &mut State, w: MPI_Win, targets: &[u32], exclusive: bool, nocheck: bool) -> R<()> {
    let x = win(st, w)?;
    let id = x.id;
    if let Some(&t) = targets.iter().find(|&&t| x.locks[t as usize] != Lock::No) {
        return err(MPI_ERR_RMA_SYNC, format!("rank {t} of the window is locked already"));
    }
    if nocheck {
        let x = win_mut(st, w)?;
        for &t in targets {
            x.locks[t as usize] = Lock::Unchecked;
        }
        return Ok(());
    }
    // Requests already here are queued before ours.
    sched::progress(st)?;
    for &t in targets {
        st.eng.rma(|r| r.lock(id, t, exclusive)).map_err(rma_err)?;
    }
    let mut waiting = targets.to_vec();
    wait_for(st, w, |st| {
        let mut left = Vec::new();
        for &t in &waiting {
            if !st.eng.rma(|r| r.granted(id, t)).map_err(rma_err)? {
                left.push(t);
            }
        }
        waiting = left;
        Ok(waiting.is_empty())
    })?;
    let x = win_mut(st, w)?;
    for &t in targets {
        x.locks[t as usize] = Lock::Held;
    }
    Ok(())
}

/// Unlocks (`release`) or flushes `targets`: every operation sent to them
/// is applied there, and every reply from them is in.
fn settle(st: &mut State, w: MPI_Win, targets: &[u32], release: bool) -> R<()> {
    let x = win(st, w)?;
    let id = x.id;
    let locks = x.locks.clone();
    for &t in targets {
        let held = locks[t as usize] == Lock::Held;
        if release && locks[t as usize] == Lock::No {
            return err(MPI_ERR_RMA_SYNC, format!("rank {t} of the window is not locked"));
        }
        if release && held {
            st.eng.rma(|r| r.unlock(id, t)).map_err(rma_err)?;
        } else {
            st.eng.rma(|r| r.flush(id, t)).map_err(rma_err)?;
        }
    }
    let mut waiting = targets.to_vec();
    wait_for(st, w, |st| {
        let mut left = Vec::new();
        for &t in &waiting {
            let acked = st.eng.rma(|r| r.acked(id, t)).map_err(rma_err)?;
            if !acked {
                left.push(t);
            }
        }
        waiting = left;
        Ok(waiting.is_empty() && !st.eng.rma_ref().replies_pending(id, None).map_err(|e| rma_err(e.into()))?)
    })?;
    if release {
        let x = win_mut(st, w)?;
        for &t in targets {
            x.locks[t as usize] = Lock::No;
        }
    }
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    check_refused(st, w)
}

entry!(MPI_Win_lock / PMPI_Win_lock(kind: c_int, rank: c_int, assert: c_int, w: MPI_Win) win(w) {
    if kind != MPI_LOCK_SHARED && kind != MPI_LOCK_EXCLUSIVE {
        return err(MPI_ERR_LOCKTYPE, format!("lock type {kind} (MPI_LOCK_SHARED or MPI_LOCK_EXCLUSIVE)"));
    }
    with(|st| match lock_target(win(st, w)?, rank)? {
        Some(t) => lock_many(st, w, &[t], kind == MPI_LOCK_EXCLUSIVE, assert & MPI_MODE_NOCHECK != 0),
        None => Ok(()),
    })
});

entry!(MPI_Win_unlock / PMPI_Win_unlock(rank: c_int, w: MPI_Win) win(w) {
    with(|st| match lock_target(win(st, w)?, rank)? {
        Some(t) => settle(st, w, &[t], true),
        None => Ok(()),
    })
});

entry!(MPI_Win_lock_all / PMPI_Win_lock_all(assert: c_int, w: MPI_Win) win(w) {
    with(|st| {
        let all: Vec<u32> = (0..win(st, w)?.ranks.len() as u32).collect();
        lock_many(st, w, &all, false, assert & MPI_MODE_NOCHECK != 0)
    })
});

entry!(MPI_Win_unlock_all / PMPI_Win_unlock_all(w: MPI_Win) win(w) {
    with(|st| {
        let all: Vec<u32> = (0..win(st, w)?.ranks.len() as u32).collect();
        settle(st, w, &all, true)
    })
});

entry!(MPI_Win_flush / PMPI_Win_flush(rank: c_int, w: MPI_Win) win(w) {
    with(|st| match lock_target(win(st, w)?, rank)? {
        Some(t) => settle(st, w, &[t], false),
        None => Ok(()),
    })
});

entry!(MPI_Win_flush_all / PMPI_Win_flush_all(w: MPI_Win) win(w) {
    with(|st| {
        let all: Vec<u32> = (0..win(st, w)?.ranks.len() as u32).collect();
        settle(st, w, &all, false)
    })
});

/// Local completion: puts and accumulates are copied when issued, so only
/// the replies of gets are waited for.
fn flush_local(st: &mut State, w: MPI_Win, target: Option<u32>) -> R<()> {
    let id = win(st, w)?.id;
    wait_for(st, w, |st| Ok(!st.eng.rma_ref().replies_pending(id, target).map_err(|e| rma_err(e.into()))?))
}

entry!(MPI_Win_flush_local / PMPI_Win_flush_local(rank: c_int, w: MPI_Win) win(w) {
    with(|st| match lock_target(win(st, w)?, rank)? {
        Some(t) => flush_local(st, w, Some(t)),
        None => Ok(()),
    })
});

entry!(MPI_Win_flush_local_all / PMPI_Win_flush_local_all(w: MPI_Win) win(w) {
    with(|st| flush_local(st, w, None))
});

entry!(MPI_Win_sync / PMPI_Win_sync(w: MPI_Win) win(w) {
    with(|st| {
        win(st, w)?;
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        sched::progress(st).map(|_| ())
    })
});

// ---------------------------------------------------------------------
// Groups, names, hints, error handlers, attributes
// ---------------------------------------------------------------------

entry!(MPI_Win_get_group / PMPI_Win_get_group(w: MPI_Win, g: *mut MPI_Group) win(w) {
    let h = with(|st| {
        let ranks = win(st, w)?.ranks.clone();
        let h = st.handle();
        st.groups.insert(h, ranks);
        Ok(h)
    })?;
    put(g, h, "group")
});

entry!(MPI_Win_set_name / PMPI_Win_set_name(w: MPI_Win, name: *const c_char) win(w) {
    nonnull(name, "name")?;
    // SAFETY: the caller passes a NUL-terminated string.
    let s = unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy().into_owned();
    with(|st| {
        win_mut(st, w)?.name = s;
        Ok(())
    })
});

entry!(MPI_Win_get_name / PMPI_Win_get_name(w: MPI_Win, name: *mut c_char, len: *mut c_int) win(w) {
    let s = with(|st| Ok(win(st, w)?.name.clone()))?;
    super::env::put_str(name, MPI_MAX_OBJECT_NAME as usize, &s, len)
});

entry!(MPI_Win_set_info / PMPI_Win_set_info(w: MPI_Win, info: MPI_Info) win(w) {
    with(|st| {
        let v = st.infos.get(&info).cloned().ok_or_else(|| MpiErr { class: MPI_ERR_INFO, msg: format!("{info:#x} is not an info object") })?;
        set_hints(&mut win_mut(st, w)?.info, &v);
        Ok(())
    })
});

entry!(MPI_Win_get_info / PMPI_Win_get_info(w: MPI_Win, info: *mut MPI_Info) win(w) {
    let h = with(|st| {
        let v = win(st, w)?.info.clone();
        let h = st.handle();
        st.infos.insert(h, v);
        Ok(h)
    })?;
    put(info, h, "info_used")
});

entry!(MPI_Win_create_errhandler / PMPI_Win_create_errhandler(f: Option<MPI_Comm_errhandler_function>, h: *mut MPI_Errhandler) comm(MPI_COMM_WORLD) {
    comm::create_errhandler(f, h)
});

entry!(MPI_Win_set_errhandler / PMPI_Win_set_errhandler(w: MPI_Win, h: MPI_Errhandler) win(w) {
    with(|st| {
        comm::errhandler_known(st, h)?;
        win_mut(st, w)?.errhandler = h;
        Ok(())
    })
});

entry!(MPI_Win_get_errhandler / PMPI_Win_get_errhandler(w: MPI_Win, h: *mut MPI_Errhandler) win(w) {
    let e = with(|st| Ok(win(st, w)?.errhandler))?;
    put(h, e, "errhandler")
});

/// `MPI_Win_call_errhandler`: calls `w`'s handler with `code`.
///
/// # Safety
/// As every entry point: `w` is a window handle.
#[no_mangle]
pub unsafe extern "C" fn PMPI_Win_call_errhandler(w: MPI_Win, code: c_int) -> c_int {
    let known = with(|st| win(st, w).map(|_| ()));
    if let Err(e) = known {
        return ret("MPI_Win_call_errhandler", MPI_COMM_WORLD, Err(e));
    }
    let h = handler_of(w);
    if h == MPI_ERRORS_RETURN {
        return MPI_SUCCESS;
    }
    handle_error(
        "MPI_Win_call_errhandler",
        h,
        w,
        MpiErr { class: code, msg: format!("error code {code} raised on a window") },
    );
    MPI_SUCCESS
}
crate::weak_alias!(MPI_Win_call_errhandler, PMPI_Win_call_errhandler);

/// The value of predefined window attribute `key` of `w` as
/// `MPI_Win_get_attr` hands it out, if `w` is a window and `key` one.
pub fn predefined(st: &State, w: MPI_Win, key: c_int) -> Option<usize> {
    let x = st.wins.get(&w)?;
    let a = &*x.attrs;
    match key {
        k if k == MPI_WIN_BASE => Some(x.base),
        k if k == MPI_WIN_SIZE => Some(&a.0 as *const MPI_Aint as usize),
        k if k == MPI_WIN_DISP_UNIT => Some(&a.1 as *const c_int as usize),
        k if k == MPI_WIN_CREATE_FLAVOR => Some(&a.2 as *const c_int as usize),
        k if k == MPI_WIN_MODEL => Some(&a.3 as *const c_int as usize),
        _ => None,
    }
}
