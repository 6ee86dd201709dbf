//! Point-to-point: sends in every mode, receives, probes, requests and
//! their completion (wait, test and their families), persistent requests
//! and statuses.

use std::ffi::{c_int, c_void};

use super::*;
use crate::engine::{backoff, Lent, Pattern, Posted, RecvBuf, SendBuf, Status};
use crate::entry;

/// How a persistent request starts again.
#[derive(Debug, Clone, Copy)]
pub enum Recipe {
    /// A send: buffer, count, type, dest, tag, comm, synchronous.
    Send(usize, c_int, MPI_Datatype, c_int, c_int, MPI_Comm, bool),
    /// A buffered send (`MPI_Bsend_init`): buffer, count, type, dest,
    /// tag, comm.
    Bsend(usize, c_int, MPI_Datatype, c_int, c_int, MPI_Comm),
    /// A receive: buffer, count, type, source, tag, comm.
    Recv(usize, c_int, MPI_Datatype, c_int, c_int, MPI_Comm),
    /// A collective: its recipe is in [`State::coll_recipes`].
    Coll,
}

/// The largest tag (`MPI_TAG_UB`).
pub const TAG_UB: c_int = i32::MAX;

fn check_tag(tag: c_int, any_ok: bool) -> R<()> {
    if tag < 0 && !(any_ok && tag == MPI_ANY_TAG) {
        return err(MPI_ERR_TAG, format!("tag {tag} is invalid"));
    }
    Ok(())
}

/// The bytes of `count` items of type `t` at `buf`, for a send: the
/// caller's memory when contiguous, else packed.
fn send_from(st: &State, buf: usize, count: c_int, t: MPI_Datatype) -> R<SendBuf> {
    let n = count_ok(count)?;
    let dt = st.dtype(t)?;
    let size = dt.size() * n;
    if size == 0 {
        return Ok(SendBuf::Owned(Vec::new()));
    }
    if dt.is_contiguous() && dt.extent() as u64 == dt.size() {
        let ptr = buf.wrapping_add_signed(dt.true_lb() as isize) as *const u8;
        // SAFETY: MPI's rule for send buffers: the caller keeps `count`
        // items at `buf` valid and unchanged until the send completes.
        return Ok(SendBuf::Borrowed(unsafe { Lent::new(ptr, size as usize) }));
    }
    let mut out = vec![0u8; size as usize];
    // SAFETY: the caller's buffer holds `count` items of this type (MPI's
    // rule for send buffers).
    unsafe { dt.pack(n, buf as *const u8, &mut out) };
    Ok(SendBuf::Owned(out))
}

/// Where a receive of `count` items of type `t` at `buf` goes, and what
/// to unpack on completion.
fn recv_into(st: &State, buf: usize, count: c_int, t: MPI_Datatype) -> R<(RecvBuf, Option<Unpack>)> {
    let n = count_ok(count)?;
    let dt = st.dtype(t)?;
    let cap = (dt.size() * n) as usize;
    if cap == 0 || (dt.is_contiguous() && dt.extent() as u64 == dt.size()) {
        let ptr = buf.wrapping_add_signed(dt.true_lb() as isize) as *mut u8;
        // SAFETY: MPI's rule for receive buffers: the caller keeps room
        // for `count` items at `buf`, untouched, until the receive completes.
        return Ok((RecvBuf::Contig(unsafe { Posted::new(ptr, cap) }), None));
    }
    Ok((RecvBuf::Packed { cap }, Some((buf, n, dt))))
}

/// The world rank of `rank` in communicator `c` (`None` for `MPI_PROC_NULL`).
fn peer(c: &Comm, rank: c_int) -> R<Option<u32>> {
    if rank == MPI_PROC_NULL {
        return Ok(None);
    }
    match usize::try_from(rank).ok().and_then(|r| c.peers().get(r)) {
        Some(&w) => Ok(Some(w)),
        None => err(MPI_ERR_RANK, format!("rank {rank} is not in a group of {}", c.peers().len())),
    }
}

fn null_status() -> MPI_Status {
    MPI_Status { MPI_SOURCE: MPI_PROC_NULL, MPI_TAG: MPI_ANY_TAG, MPI_ERROR: MPI_SUCCESS, MPI_internal: [0; 5] }
}

/// The status MPI reports for an engine status on communicator `c`.
fn to_status(st: &State, c: MPI_Comm, s: &Status) -> MPI_Status {
    let source = st.comms.get(&c).and_then(|x| x.rank_of(s.source)).map_or(s.source as c_int, |r| r as c_int);
    let bytes = s.bytes as u64;
    MPI_Status {
        MPI_SOURCE: source,
        MPI_TAG: s.tag,
        MPI_ERROR: if s.truncated { MPI_ERR_TRUNCATE } else { MPI_SUCCESS },
        MPI_internal: [bytes as u32 as c_int, (bytes >> 32) as c_int, s.cancelled as c_int, 0, 0],
    }
}

/// Bytes a status says were received.
fn status_bytes(s: &MPI_Status) -> u64 {
    s.MPI_internal[0] as u32 as u64 | (s.MPI_internal[1] as u32 as u64) << 32
}

/// Starts a send; returns the request handle.
fn start_send(st: &mut State, r: Recipe) -> R<MPI_Request> {
    let Recipe::Send(buf, count, t, dest, tag, comm, sync) = r else { return err(MPI_ERR_INTERN, "not a send") };
    check_tag(tag, false)?;
    let c = st.comm(comm)?.clone();
    let h = st.handle();
    let Some(to) = peer(&c, dest)? else {
        st.reqs.insert(h, Pending::new(None, comm, None, Some(null_status())));
        return Ok(h);
    };
    let data = send_from(st, buf, count, t)?;
    let id = st.eng.isend(to, c.ctx, tag, data, sync)?;
    st.reqs.insert(h, Pending::new(Some(id), comm, None, None));
    Ok(h)
}

/// Starts a receive; returns the request handle.
fn start_recv(st: &mut State, r: Recipe) -> R<MPI_Request> {
    let Recipe::Recv(buf, count, t, source, tag, comm) = r else { return err(MPI_ERR_INTERN, "not a receive") };
    check_tag(tag, true)?;
    let c = st.comm(comm)?.clone();
    let h = st.handle();
    let src = if source == MPI_ANY_SOURCE { None } else { Some(peer(&c, source)?) };
    if src == Some(None) {
        st.reqs.insert(h, Pending::new(None, comm, None, Some(null_status())));
        return Ok(h);
    }
    let (into, unpack) = recv_into(st, buf, count, t)?;
    let pattern = Pattern { ctx: c.ctx, src: src.flatten(), tag: (tag != MPI_ANY_TAG).then_some(tag) };
    let id = st.eng.irecv(pattern, into)?;
    st.reqs.insert(h, Pending::new(Some(id), comm, unpack, None));
    Ok(h)
}

/// Whether request `h` is complete (no progress made).
fn done(st: &State, h: MPI_Request) -> R<bool> {
    let p =
        st.reqs.get(&h).ok_or_else(|| MpiErr { class: MPI_ERR_REQUEST, msg: format!("{h:#x} is not a request") })?;
    if let Some(l) = p.linked {
        if !done(st, l)? {
            return Ok(false);
        }
    }
    if let Some(r) = p.rma {
        return Ok(st.eng.rma_ref().reply_done(r));
    }
    match (p.status, p.id) {
        _ if p.coll => Ok(false),
        (Some(_), _) | (None, None) => Ok(true),
        (None, Some(id)) => Ok(st.eng.is_done(id)?),
    }
}

/// Completes request `h` (which must be done): unpacks, frees or resets
/// it, and returns its status.
fn complete(st: &mut State, h: MPI_Request) -> R<MPI_Status> {
    let p = st
        .reqs
        .get_mut(&h)
        .ok_or_else(|| MpiErr { class: MPI_ERR_REQUEST, msg: format!("{h:#x} is not a request") })?;
    if let Some(e) = p.failed.take() {
        st.reqs.remove(&h);
        return Err(e);
    }
    if let Some(l) = p.linked.take() {
        complete(st, l)?;
    }
    let p = st
        .reqs
        .get_mut(&h)
        .ok_or_else(|| MpiErr { class: MPI_ERR_REQUEST, msg: format!("{h:#x} is not a request") })?;
    let status = match (p.status.take(), p.id.take()) {
        (Some(s), _) => s,
        (None, None) => null_status(),
        (None, Some(id)) => {
            let (s, packed) = st.eng.finish(id)?;
            let p = st.reqs.get_mut(&h).expect("looked up above");
            if let Some((buf, n, dt)) = p.unpack.take() {
                // SAFETY: the receive buffer holds `n` items of this type
                // (MPI's rule for receive buffers); `packed` holds at most
                // their packed size.
                unsafe { dt.unpack(n, buf as *mut u8, &packed) };
            }
            let comm = p.comm;
            to_status(st, comm, &s)
        }
    };
    let persistent = st.reqs.get(&h).and_then(|p| p.persistent);
    if persistent.is_none() {
        st.reqs.remove(&h);
    }
    Ok(status)
}

/// Progress until request `h` is done.
fn wait_one(st: &mut State, h: MPI_Request) -> R<MPI_Status> {
    let mut idle = 0;
    let mut watch = sched::StallWatch::default();
    while !done(st, h)? {
        if sched::progress(st)? {
            idle = 0;
        } else {
            watch.check(st, |st| match st.reqs.get(&h).and_then(|p| p.id) {
                Some(id) => format!("a wait; {}", st.eng.describe_request(id)),
                None => format!("a wait for request {h}"),
            });
            if let Some(id) = st.reqs.get(&h).and_then(|p| p.id) {
                st.eng.check_needed(id)?;
            }
            if let Some(s) = st.scheds.get(&h) {
                s.check(st)?;
            }
            backoff(&mut idle);
        }
    }
    complete(st, h)
}

/// Stores a status unless the caller passed `MPI_STATUS_IGNORE`.
///
/// # Safety
/// Every pointer argument is null or points to what the MPI standard
/// requires of the argument of the same name in the calling function
/// (see [`put`](crate::ffi::put) and [`array`](crate::ffi::array)).
unsafe fn put_status(p: *mut MPI_Status, s: MPI_Status) -> R<()> {
    if p as usize == MPI_STATUS_IGNORE {
        return Ok(());
    }
    // SAFETY: the pointers are as this function's contract requires.
    unsafe { put(p, s, "status") }
}

/// Requests whose handle is inactive (null, or a persistent one not started).
fn inactive(st: &State, h: MPI_Request) -> bool {
    h == MPI_REQUEST_NULL
        || st.reqs.get(&h).is_some_and(|p| p.persistent.is_some() && p.id.is_none() && p.status.is_none() && !p.coll)
}

pub(crate) fn empty_status() -> MPI_Status {
    MPI_Status { MPI_SOURCE: MPI_ANY_SOURCE, MPI_TAG: MPI_ANY_TAG, MPI_ERROR: MPI_SUCCESS, MPI_internal: [0; 5] }
}

/// Drops finished detached requests (`MPI_Request_free`, buffered sends).
fn reap(st: &mut State) -> R<()> {
    let gone: Vec<MPI_Request> = st.reqs.iter().filter(|(_, p)| p.detached).map(|(&h, _)| h).collect();
    for h in gone {
        if done(st, h)? {
            let _ = complete(st, h);
            st.reqs.remove(&h);
        }
    }
    Ok(())
}

/// Blocking send in any mode.
fn send(
    buf: *const c_void,
    count: c_int,
    t: MPI_Datatype,
    dest: c_int,
    tag: c_int,
    comm: MPI_Comm,
    sync: bool,
) -> R<()> {
    with(|st| {
        let h = start_send(st, Recipe::Send(buf as usize, count, t, dest, tag, comm, sync))?;
        wait_one(st, h)?;
        reap(st)
    })
}

entry!(MPI_Send / PMPI_Send(buf: *const c_void, count: c_int, t: MPI_Datatype, dest: c_int, tag: c_int, comm: MPI_Comm) comm(comm) {
    send(buf, count, t, dest, tag, comm, false)
});

entry!(MPI_Ssend / PMPI_Ssend(buf: *const c_void, count: c_int, t: MPI_Datatype, dest: c_int, tag: c_int, comm: MPI_Comm) comm(comm) {
    send(buf, count, t, dest, tag, comm, true)
});

entry!(MPI_Rsend / PMPI_Rsend(buf: *const c_void, count: c_int, t: MPI_Datatype, dest: c_int, tag: c_int, comm: MPI_Comm) comm(comm) {
    send(buf, count, t, dest, tag, comm, false)
});

/// A buffered send: the data is copied now and the send goes on in the
/// background (the copy counts against the attached buffer's size).
fn bsend(
    st: &mut State,
    buf: usize,
    count: c_int,
    t: MPI_Datatype,
    dest: c_int,
    tag: c_int,
    comm: MPI_Comm,
) -> R<MPI_Request> {
    let Some((_, cap)) = st.buffer else {
        return err(MPI_ERR_BUFFER, "MPI_Bsend without an attached buffer (MPI_Buffer_attach)");
    };
    let dt = st.dtype(t)?;
    let need = (dt.size() * count_ok(count)?) as usize + MPI_BSEND_OVERHEAD as usize;
    if need > cap {
        return err(MPI_ERR_BUFFER, format!("a buffered send of {need} bytes exceeds the attached {cap}"));
    }
    let data = send_from(st, buf, count, t)?.into_owned();
    check_tag(tag, false)?;
    let c = st.comm(comm)?.clone();
    let h = st.handle();
    match peer(&c, dest)? {
        None => {
            st.reqs.insert(h, Pending::new(None, comm, None, Some(null_status())));
        }
        Some(to) => {
            let id = st.eng.isend(to, c.ctx, tag, data, false)?;
            st.reqs.insert(h, Pending::new(Some(id), comm, None, None));
        }
    }
    Ok(h)
}

entry!(MPI_Bsend / PMPI_Bsend(buf: *const c_void, count: c_int, t: MPI_Datatype, dest: c_int, tag: c_int, comm: MPI_Comm) comm(comm) {
    with(|st| {
        let h = bsend(st, buf as usize, count, t, dest, tag, comm)?;
        if let Some(p) = st.reqs.get_mut(&h) {
            p.detached = true;
        }
        sched::progress(st)?;
        reap(st)
    })
});

entry!(MPI_Ibsend / PMPI_Ibsend(buf: *const c_void, count: c_int, t: MPI_Datatype, dest: c_int, tag: c_int, comm: MPI_Comm, req: *mut MPI_Request) comm(comm) {
    let h = with(|st| bsend(st, buf as usize, count, t, dest, tag, comm))?;
    put(req, h, "request")
});

entry!(MPI_Buffer_attach / PMPI_Buffer_attach(buf: *mut c_void, size: c_int) comm(MPI_COMM_WORLD) {
    let n = count_ok(size)? as usize;
    with(|st| {
        if st.buffer.is_some() {
            return err(MPI_ERR_BUFFER, "a buffer is attached already");
        }
        st.buffer = Some((buf as usize, n));
        Ok(())
    })
});

entry!(MPI_Buffer_detach / PMPI_Buffer_detach(buf: *mut c_void, size: *mut c_int) comm(MPI_COMM_WORLD) {
    // Buffered sends still going are finished first, as the standard says.
    let (b, n) = with(|st| {
        let mut idle = 0;
        while st.reqs.values().any(|p| p.detached) {
            reap(st)?;
            if !sched::progress(st)? {
                backoff(&mut idle);
            }
        }
        Ok(st.buffer.take().unwrap_or((0, 0)))
    })?;
    put(buf as *mut usize, b, "buffer")?;
    put(size, n as c_int, "size")
});

/// # Safety
/// Every pointer argument is null or points to what the MPI standard
/// requires of the argument of the same name in the calling function
/// (see [`put`](crate::ffi::put) and [`array`](crate::ffi::array)).
unsafe fn isend(
    buf: *const c_void,
    count: c_int,
    t: MPI_Datatype,
    dest: c_int,
    tag: c_int,
    comm: MPI_Comm,
    sync: bool,
    req: *mut MPI_Request,
) -> R<()> {
    nonnull(req, "request")?;
    let h = with(|st| start_send(st, Recipe::Send(buf as usize, count, t, dest, tag, comm, sync)))?;
    // SAFETY: the pointers are as this function's contract requires.
    unsafe { put(req, h, "request") }
}

entry!(MPI_Isend / PMPI_Isend(buf: *const c_void, count: c_int, t: MPI_Datatype, dest: c_int, tag: c_int, comm: MPI_Comm, req: *mut MPI_Request) comm(comm) {
    isend(buf, count, t, dest, tag, comm, false, req)
});

entry!(MPI_Issend / PMPI_Issend(buf: *const c_void, count: c_int, t: MPI_Datatype, dest: c_int, tag: c_int, comm: MPI_Comm, req: *mut MPI_Request) comm(comm) {
    isend(buf, count, t, dest, tag, comm, true, req)
});

entry!(MPI_Irsend / PMPI_Irsend(buf: *const c_void, count: c_int, t: MPI_Datatype, dest: c_int, tag: c_int, comm: MPI_Comm, req: *mut MPI_Request) comm(comm) {
    isend(buf, count, t, dest, tag, comm, false, req)
});

entry!(MPI_Recv / PMPI_Recv(buf: *mut c_void, count: c_int, t: MPI_Datatype, source: c_int, tag: c_int, comm: MPI_Comm, status: *mut MPI_Status) comm(comm) {
    let s = with(|st| {
        let h = start_recv(st, Recipe::Recv(buf as usize, count, t, source, tag, comm))?;
        wait_one(st, h)
    })?;
    put_status(status, s)?;
    if s.MPI_ERROR == MPI_ERR_TRUNCATE {
        return err(MPI_ERR_TRUNCATE, format!("a message of {} bytes does not fit the receive buffer", status_bytes(&s)));
    }
    Ok(())
});

entry!(MPI_Irecv / PMPI_Irecv(buf: *mut c_void, count: c_int, t: MPI_Datatype, source: c_int, tag: c_int, comm: MPI_Comm, req: *mut MPI_Request) comm(comm) {
    nonnull(req, "request")?;
    let h = with(|st| start_recv(st, Recipe::Recv(buf as usize, count, t, source, tag, comm)))?;
    put(req, h, "request")
});

entry!(MPI_Sendrecv / PMPI_Sendrecv(sbuf: *const c_void, scount: c_int, stype: MPI_Datatype, dest: c_int, stag: c_int,
        rbuf: *mut c_void, rcount: c_int, rtype: MPI_Datatype, source: c_int, rtag: c_int, comm: MPI_Comm, status: *mut MPI_Status) comm(comm) {
    let s = with(|st| {
        let r = start_recv(st, Recipe::Recv(rbuf as usize, rcount, rtype, source, rtag, comm))?;
        let w = start_send(st, Recipe::Send(sbuf as usize, scount, stype, dest, stag, comm, false))?;
        wait_one(st, w)?;
        wait_one(st, r)
    })?;
    put_status(status, s)
});

/// `MPI_Isendrecv`'s request: the receive's, with the send linked to it.
fn link(st: &mut State, recv: MPI_Request, send: MPI_Request) -> MPI_Request {
    if let Some(p) = st.reqs.get_mut(&recv) {
        p.linked = Some(send);
    }
    recv
}

entry!(MPI_Isendrecv / PMPI_Isendrecv(sbuf: *const c_void, scount: c_int, stype: MPI_Datatype, dest: c_int, stag: c_int,
        rbuf: *mut c_void, rcount: c_int, rtype: MPI_Datatype, source: c_int, rtag: c_int, comm: MPI_Comm, req: *mut MPI_Request) comm(comm) {
    nonnull(req, "request")?;
    let h = with(|st| {
        let r = start_recv(st, Recipe::Recv(rbuf as usize, rcount, rtype, source, rtag, comm))?;
        let w = start_send(st, Recipe::Send(sbuf as usize, scount, stype, dest, stag, comm, false))?;
        Ok(link(st, r, w))
    })?;
    put(req, h, "request")
});

/// Starts a send of `buf` and a receive into it: the receive's request,
/// with the send linked to it. The outgoing copy is taken before anything
/// can arrive.
fn start_sendrecv_replace(
    st: &mut State,
    buf: usize,
    count: c_int,
    t: MPI_Datatype,
    dest: c_int,
    stag: c_int,
    source: c_int,
    rtag: c_int,
    comm: MPI_Comm,
) -> R<MPI_Request> {
    let data = send_from(st, buf, count, t)?.into_owned();
    let c = st.comm(comm)?.clone();
    check_tag(stag, false)?;
    let w = st.handle();
    match peer(&c, dest)? {
        Some(to) => {
            let id = st.eng.isend(to, c.ctx, stag, data, false)?;
            st.reqs.insert(w, Pending::new(Some(id), comm, None, None));
        }
        None => {
            st.reqs.insert(w, Pending::new(None, comm, None, Some(null_status())));
        }
    }
    let r = start_recv(st, Recipe::Recv(buf, count, t, source, rtag, comm))?;
    Ok(link(st, r, w))
}

entry!(MPI_Isendrecv_replace / PMPI_Isendrecv_replace(buf: *mut c_void, count: c_int, t: MPI_Datatype, dest: c_int, stag: c_int,
        source: c_int, rtag: c_int, comm: MPI_Comm, req: *mut MPI_Request) comm(comm) {
    nonnull(req, "request")?;
    let h = with(|st| start_sendrecv_replace(st, buf as usize, count, t, dest, stag, source, rtag, comm))?;
    put(req, h, "request")
});

entry!(MPI_Sendrecv_replace / PMPI_Sendrecv_replace(buf: *mut c_void, count: c_int, t: MPI_Datatype, dest: c_int, stag: c_int,
        source: c_int, rtag: c_int, comm: MPI_Comm, status: *mut MPI_Status) comm(comm) {
    let s = with(|st| {
        let h = start_sendrecv_replace(st, buf as usize, count, t, dest, stag, source, rtag, comm)?;
        wait_one(st, h)
    })?;
    put_status(status, s)
});

fn probe_pattern(st: &State, source: c_int, tag: c_int, comm: MPI_Comm) -> R<Option<Pattern>> {
    check_tag(tag, true)?;
    let c = st.comm(comm)?;
    let src = if source == MPI_ANY_SOURCE { None } else { Some(peer(c, source)?) };
    if src == Some(None) {
        return Ok(None);
    }
    Ok(Some(Pattern { ctx: c.ctx, src: src.flatten(), tag: (tag != MPI_ANY_TAG).then_some(tag) }))
}

entry!(MPI_Iprobe / PMPI_Iprobe(source: c_int, tag: c_int, comm: MPI_Comm, flag: *mut c_int, status: *mut MPI_Status) comm(comm) {
    let found = with(|st| {
        let Some(p) = probe_pattern(st, source, tag, comm)? else { return Ok(Some(null_status())) };
        Ok(st.eng.iprobe(p)?.map(|s| to_status(st, comm, &s)))
    })?;
    put(flag, found.is_some() as c_int, "flag")?;
    match found {
        Some(s) => put_status(status, s),
        None => Ok(()),
    }
});

entry!(MPI_Probe / PMPI_Probe(source: c_int, tag: c_int, comm: MPI_Comm, status: *mut MPI_Status) comm(comm) {
    let s = with(|st| {
        let Some(p) = probe_pattern(st, source, tag, comm)? else { return Ok(null_status()) };
        let mut idle = 0;
        loop {
            if let Some(s) = st.eng.iprobe(p)? {
                return Ok(to_status(st, comm, &s));
            }
            backoff(&mut idle);
        }
    })?;
    put_status(status, s)
});

entry!(MPI_Wait / PMPI_Wait(req: *mut MPI_Request, status: *mut MPI_Status) comm(MPI_COMM_WORLD) {
    let h = array(req as *const MPI_Request, 1, "request")?[0];
    let s = with(|st| finish_handle(st, h, true))?;
    put(req, s.1, "request")?;
    put_status(status, s.0)
});

entry!(MPI_Test / PMPI_Test(req: *mut MPI_Request, flag: *mut c_int, status: *mut MPI_Status) comm(MPI_COMM_WORLD) {
    let h = array(req as *const MPI_Request, 1, "request")?[0];
    let r = with(|st| {
        if inactive(st, h) {
            return Ok(Some((empty_status(), h)));
        }
        sched::progress(st)?;
        if !done(st, h)? {
            return Ok(None);
        }
        let s = complete(st, h)?;
        let keep = st.reqs.contains_key(&h);
        Ok(Some((s, if keep { h } else { MPI_REQUEST_NULL })))
    })?;
    put(flag, r.is_some() as c_int, "flag")?;
    if let Some((s, nh)) = r {
        put(req, nh, "request")?;
        put_status(status, s)?;
    }
    Ok(())
});

/// Completes request `h` (waiting for it when `wait`, else it must be
/// done): its status and what its handle becomes (null unless persistent).
/// An inactive request gives the empty status and keeps its handle.
fn finish_handle(st: &mut State, h: MPI_Request, wait: bool) -> R<(MPI_Status, MPI_Request)> {
    if inactive(st, h) {
        return Ok((empty_status(), h));
    }
    let s = if wait { wait_one(st, h)? } else { complete(st, h)? };
    Ok((s, if st.reqs.contains_key(&h) { h } else { MPI_REQUEST_NULL }))
}

/// Stores status `i` of an array unless `MPI_STATUSES_IGNORE`.
///
/// # Safety
/// Every pointer argument is null or points to what the MPI standard
/// requires of the argument of the same name in the calling function
/// (see [`put`](crate::ffi::put) and [`array`](crate::ffi::array)).
unsafe fn put_status_at(p: *mut MPI_Status, i: usize, s: MPI_Status) -> R<()> {
    if p as usize == MPI_STATUSES_IGNORE {
        return Ok(());
    }
    // SAFETY: the pointers are as this function's contract requires.
    unsafe { put(p.wrapping_add(i), s, "statuses") }
}

entry!(MPI_Waitall / PMPI_Waitall(n: c_int, reqs: *mut MPI_Request, statuses: *mut MPI_Status) comm(MPI_COMM_WORLD) {
    let n = count_ok(n)? as usize;
    let hs = array(reqs as *const MPI_Request, n, "requests")?;
    for (i, &h) in hs.iter().enumerate() {
        let (s, nh) = with(|st| finish_handle(st, h, true))?;
        put(reqs.wrapping_add(i), nh, "requests")?;
        put_status_at(statuses, i, s)?;
    }
    Ok(())
});

entry!(MPI_Testall / PMPI_Testall(n: c_int, reqs: *mut MPI_Request, flag: *mut c_int, statuses: *mut MPI_Status) comm(MPI_COMM_WORLD) {
    let n = count_ok(n)? as usize;
    let hs = array(reqs as *const MPI_Request, n, "requests")?;
    let all = with(|st| {
        sched::progress(st)?;
        for &h in &hs {
            if !inactive(st, h) && !done(st, h)? {
                return Ok(false);
            }
        }
        Ok(true)
    })?;
    put(flag, all as c_int, "flag")?;
    if all {
        for (i, &h) in hs.iter().enumerate() {
            let (s, nh) = with(|st| finish_handle(st, h, false))?;
            put(reqs.wrapping_add(i), nh, "requests")?;
            put_status_at(statuses, i, s)?;
        }
    }
    Ok(())
});

/// The first complete active request of `hs`, completed; `Ok(None)` when
/// none is, `Some(None)` when all are inactive.
fn any_done(st: &mut State, hs: &[MPI_Request]) -> R<Option<Option<(usize, MPI_Status, MPI_Request)>>> {
    if hs.iter().all(|&h| inactive(st, h)) {
        return Ok(Some(None));
    }
    for (i, &h) in hs.iter().enumerate() {
        if !inactive(st, h) && done(st, h)? {
            let s = complete(st, h)?;
            return Ok(Some(Some((i, s, if st.reqs.contains_key(&h) { h } else { MPI_REQUEST_NULL }))));
        }
    }
    Ok(None)
}

entry!(MPI_Waitany / PMPI_Waitany(n: c_int, reqs: *mut MPI_Request, index: *mut c_int, status: *mut MPI_Status) comm(MPI_COMM_WORLD) {
    let n = count_ok(n)? as usize;
    let hs = array(reqs as *const MPI_Request, n, "requests")?;
    let r = with(|st| {
        let mut idle = 0;
        let mut watch = sched::StallWatch::default();
        loop {
            if let Some(x) = any_done(st, &hs)? {
                return Ok(x);
            }
            if !sched::progress(st)? {
                watch.check(st, |st| {
                    let ids = hs.iter().filter_map(|h| st.reqs.get(h).and_then(|p| p.id));
                    let each: Vec<String> = ids.map(|id| st.eng.describe_request(id)).collect();
                    format!("MPI_Waitany over {} requests; {}", hs.len(), each.join("; "))
                });
                backoff(&mut idle);
            }
        }
    })?;
    match r {
        None => {
            put(index, MPI_UNDEFINED, "index")?;
            put_status(status, empty_status())
        }
        Some((i, s, nh)) => {
            put(reqs.wrapping_add(i), nh, "requests")?;
            put(index, i as c_int, "index")?;
            put_status(status, s)
        }
    }
});

entry!(MPI_Testany / PMPI_Testany(n: c_int, reqs: *mut MPI_Request, index: *mut c_int, flag: *mut c_int, status: *mut MPI_Status) comm(MPI_COMM_WORLD) {
    let n = count_ok(n)? as usize;
    let hs = array(reqs as *const MPI_Request, n, "requests")?;
    let r = with(|st| {
        sched::progress(st)?;
        any_done(st, &hs)
    })?;
    match r {
        None => put(flag, 0, "flag"),
        Some(None) => {
            put(flag, 1, "flag")?;
            put(index, MPI_UNDEFINED, "index")?;
            put_status(status, empty_status())
        }
        Some(Some((i, s, nh))) => {
            put(flag, 1, "flag")?;
            put(reqs.wrapping_add(i), nh, "requests")?;
            put(index, i as c_int, "index")?;
            put_status(status, s)
        }
    }
});

/// # Safety
/// Every pointer argument is null or points to what the MPI standard
/// requires of the argument of the same name in the calling function
/// (see [`put`](crate::ffi::put) and [`array`](crate::ffi::array)).
unsafe fn some(
    n: c_int,
    reqs: *mut MPI_Request,
    outcount: *mut c_int,
    indices: *mut c_int,
    statuses: *mut MPI_Status,
    block: bool,
) -> R<()> {
    let n = count_ok(n)? as usize;
    // SAFETY: the pointers are as this function's contract requires.
    let hs = unsafe { array(reqs as *const MPI_Request, n, "requests") }?;
    let got = with(|st| {
        let mut idle = 0;
        loop {
            sched::progress(st)?;
            if hs.iter().all(|&h| inactive(st, h)) {
                return Ok(None);
            }
            let mut got = Vec::new();
            for (i, &h) in hs.iter().enumerate() {
                if !inactive(st, h) && done(st, h)? {
                    let s = complete(st, h)?;
                    got.push((i, s, if st.reqs.contains_key(&h) { h } else { MPI_REQUEST_NULL }));
                }
            }
            if !got.is_empty() || !block {
                return Ok(Some(got));
            }
            backoff(&mut idle);
        }
    })?;
    // SAFETY: the pointers are as this function's contract requires.
    let Some(got) = got else { return unsafe { put(outcount, MPI_UNDEFINED, "outcount") } };
    // SAFETY: the pointers are as this function's contract requires.
    unsafe { put(outcount, got.len() as c_int, "outcount") }?;
    for (k, (i, s, nh)) in got.into_iter().enumerate() {
        // SAFETY: the pointers are as this function's contract requires.
        unsafe { put(reqs.wrapping_add(i), nh, "requests") }?;
        // SAFETY: the pointers are as this function's contract requires.
        unsafe { put(indices.wrapping_add(k), i as c_int, "indices") }?;
        // SAFETY: the pointers are as this function's contract requires.
        unsafe { put_status_at(statuses, k, s) }?;
    }
    Ok(())
}

entry!(MPI_Waitsome / PMPI_Waitsome(n: c_int, reqs: *mut MPI_Request, outcount: *mut c_int, indices: *mut c_int, statuses: *mut MPI_Status) comm(MPI_COMM_WORLD) {
    some(n, reqs, outcount, indices, statuses, true)
});

entry!(MPI_Testsome / PMPI_Testsome(n: c_int, reqs: *mut MPI_Request, outcount: *mut c_int, indices: *mut c_int, statuses: *mut MPI_Status) comm(MPI_COMM_WORLD) {
    some(n, reqs, outcount, indices, statuses, false)
});

entry!(MPI_Request_free / PMPI_Request_free(req: *mut MPI_Request) comm(MPI_COMM_WORLD) {
    let h = array(req as *const MPI_Request, 1, "request")?[0];
    with(|st| {
        let Some(p) = st.reqs.get_mut(&h) else { return err(MPI_ERR_REQUEST, format!("{h:#x} is not a request")) };
        if p.id.is_none() {
            st.reqs.remove(&h);
            st.coll_recipes.remove(&h);
        } else {
            p.persistent = None;
            st.kept_types.remove(&h);
            p.detached = true;
        }
        reap(st)
    })?;
    put(req, MPI_REQUEST_NULL, "request")
});

entry!(MPI_Cancel / PMPI_Cancel(req: *mut MPI_Request) comm(MPI_COMM_WORLD) {
    let h = array(req as *const MPI_Request, 1, "request")?[0];
    with(|st| {
        let p = st.reqs.get(&h).ok_or_else(|| MpiErr { class: MPI_ERR_REQUEST, msg: format!("{h:#x} is not a request") })?;
        if let Some(id) = p.id {
            st.eng.cancel(id)?;
        }
        Ok(())
    })
});

entry!(MPI_Test_cancelled / PMPI_Test_cancelled(status: *const MPI_Status, flag: *mut c_int) comm(MPI_COMM_WORLD) {
    let s = array(status, 1, "status")?[0];
    put(flag, (s.MPI_internal[2] != 0) as c_int, "flag")
});

entry!(MPI_Get_count / PMPI_Get_count(status: *const MPI_Status, t: MPI_Datatype, count: *mut c_int) comm(MPI_COMM_WORLD) {
    let s = array(status, 1, "status")?[0];
    let dt = with(|st| st.dtype(t))?;
    let bytes = status_bytes(&s);
    let n = dt.get_count(bytes).map_or(MPI_UNDEFINED, |n| n.min(i32::MAX as u64) as c_int);
    put(count, n, "count")
});

entry!(MPI_Get_elements / PMPI_Get_elements(status: *const MPI_Status, t: MPI_Datatype, count: *mut c_int) comm(MPI_COMM_WORLD) {
    let s = array(status, 1, "status")?[0];
    let dt = with(|st| st.dtype(t))?;
    let n = dt.get_elements(status_bytes(&s)).map_or(MPI_UNDEFINED, |n| n.min(i32::MAX as u64) as c_int);
    put(count, n, "count")
});

/// # Safety
/// Every pointer argument is null or points to what the MPI standard
/// requires of the argument of the same name in the calling function
/// (see [`put`](crate::ffi::put) and [`array`](crate::ffi::array)).
unsafe fn persistent(req: *mut MPI_Request, r: Recipe) -> R<()> {
    nonnull(req, "request")?;
    let h = with(|st| {
        let h = st.handle();
        let (t, comm) = match r {
            Recipe::Send(_, _, t, _, _, c, _) | Recipe::Bsend(_, _, t, _, _, c) | Recipe::Recv(_, _, t, _, _, c) => {
                (t, c)
            }
            Recipe::Coll => return err(MPI_ERR_INTERN, "a collective's recipe is not a point-to-point one"),
        };
        st.comm(comm)?;
        let dt = st.dtype(t)?;
        st.kept_types.insert(h, dt);
        st.reqs.insert(h, Pending { persistent: Some(r), ..Pending::new(None, comm, None, None) });
        Ok(h)
    })?;
    // SAFETY: the pointers are as this function's contract requires.
    unsafe { put(req, h, "request") }
}

entry!(MPI_Send_init / PMPI_Send_init(buf: *const c_void, count: c_int, t: MPI_Datatype, dest: c_int, tag: c_int, comm: MPI_Comm, req: *mut MPI_Request) comm(comm) {
    persistent(req, Recipe::Send(buf as usize, count, t, dest, tag, comm, false))
});

entry!(MPI_Ssend_init / PMPI_Ssend_init(buf: *const c_void, count: c_int, t: MPI_Datatype, dest: c_int, tag: c_int, comm: MPI_Comm, req: *mut MPI_Request) comm(comm) {
    persistent(req, Recipe::Send(buf as usize, count, t, dest, tag, comm, true))
});

entry!(MPI_Bsend_init / PMPI_Bsend_init(buf: *const c_void, count: c_int, t: MPI_Datatype, dest: c_int, tag: c_int, comm: MPI_Comm, req: *mut MPI_Request) comm(comm) {
    persistent(req, Recipe::Bsend(buf as usize, count, t, dest, tag, comm))
});

entry!(MPI_Recv_init / PMPI_Recv_init(buf: *mut c_void, count: c_int, t: MPI_Datatype, source: c_int, tag: c_int, comm: MPI_Comm, req: *mut MPI_Request) comm(comm) {
    persistent(req, Recipe::Recv(buf as usize, count, t, source, tag, comm))
});

fn start(st: &mut State, h: MPI_Request) -> R<()> {
    let r = st
        .reqs
        .get(&h)
        .and_then(|p| p.persistent)
        .ok_or_else(|| MpiErr { class: MPI_ERR_REQUEST, msg: format!("{h:#x} is not a persistent request") })?;
    // The request keeps its datatype even if the user freed the handle
    // meanwhile (handles are never reused, so it is put back for the start).
    let (Recipe::Send(_, _, t, ..) | Recipe::Bsend(_, _, t, ..) | Recipe::Recv(_, _, t, ..)) = r else {
        return start_coll(st, h);
    };
    let restored = match st.kept_types.get(&h).cloned() {
        Some(dt) if !st.types.contains_key(&t) => st.types.insert(t, dt).is_none(),
        _ => false,
    };
    let tmp = match r {
        Recipe::Send(..) => start_send(st, r),
        Recipe::Bsend(buf, count, t, dest, tag, comm) => bsend(st, buf, count, t, dest, tag, comm),
        Recipe::Recv(..) | Recipe::Coll => start_recv(st, r),
    };
    if restored {
        st.types.remove(&t);
    }
    let tmp = tmp?;
    // Move the started request's state under the persistent handle.
    let mut started = st.reqs.remove(&tmp).expect("just started");
    started.persistent = Some(r);
    st.reqs.insert(h, started);
    Ok(())
}

/// Starts persistent collective `h`: a new schedule from its recipe.
fn start_coll(st: &mut State, h: MPI_Request) -> R<()> {
    if st.reqs.get(&h).is_some_and(|p| p.coll || p.status.is_some()) {
        return err(MPI_ERR_REQUEST, "the persistent collective is still active (complete it before MPI_Start)");
    }
    let p = st.coll_recipes.remove(&h).ok_or_else(|| MpiErr { class: MPI_ERR_REQUEST, msg: "no recipe".into() })?;
    let s = p.build(st);
    st.coll_recipes.insert(h, p);
    let s = s?;
    if let Some(p) = st.reqs.get_mut(&h) {
        p.coll = true;
    }
    sched::start(st, h, s)
}

entry!(MPI_Start / PMPI_Start(req: *mut MPI_Request) comm(MPI_COMM_WORLD) {
    let h = array(req as *const MPI_Request, 1, "request")?[0];
    with(|st| start(st, h))
});

entry!(MPI_Startall / PMPI_Startall(n: c_int, reqs: *mut MPI_Request) comm(MPI_COMM_WORLD) {
    let n = count_ok(n)? as usize;
    let hs = array(reqs as *const MPI_Request, n, "requests")?;
    with(|st| hs.iter().try_for_each(|&h| start(st, h)))
});

/// A matched probe: the message taken out of the queue, under a handle.
fn mprobe(
    st: &mut State,
    source: c_int,
    tag: c_int,
    comm: MPI_Comm,
    block: bool,
) -> R<Option<(MPI_Message, MPI_Status)>> {
    let Some(p) = probe_pattern(st, source, tag, comm)? else { return Ok(Some((MPI_MESSAGE_NO_PROC, null_status()))) };
    let mut idle = 0;
    loop {
        if let Some(m) = st.eng.improbe(p)? {
            let s = to_status(st, comm, &m.status());
            let h = st.handle();
            st.messages.insert(h, (m, comm));
            return Ok(Some((h, s)));
        }
        if !block {
            return Ok(None);
        }
        backoff(&mut idle);
    }
}

entry!(MPI_Mprobe / PMPI_Mprobe(source: c_int, tag: c_int, comm: MPI_Comm, message: *mut MPI_Message, status: *mut MPI_Status) comm(comm) {
    let (h, s) = with(|st| mprobe(st, source, tag, comm, true))?.expect("a blocking probe returns a message");
    put(message, h, "message")?;
    put_status(status, s)
});

entry!(MPI_Improbe / PMPI_Improbe(source: c_int, tag: c_int, comm: MPI_Comm, flag: *mut c_int, message: *mut MPI_Message, status: *mut MPI_Status) comm(comm) {
    let r = with(|st| mprobe(st, source, tag, comm, false))?;
    put(flag, r.is_some() as c_int, "flag")?;
    if let Some((h, s)) = r {
        put(message, h, "message")?;
        put_status(status, s)?;
    }
    Ok(())
});

/// Starts the receive of a matched message; the request handle.
fn start_mrecv(st: &mut State, buf: usize, count: c_int, t: MPI_Datatype, message: MPI_Message) -> R<MPI_Request> {
    let h = st.handle();
    if message == MPI_MESSAGE_NO_PROC {
        st.reqs.insert(h, Pending::new(None, MPI_COMM_WORLD, None, Some(null_status())));
        return Ok(h);
    }
    let (m, comm) = st
        .messages
        .remove(&message)
        .ok_or_else(|| MpiErr { class: MPI_ERR_REQUEST, msg: format!("{message:#x} is not a matched message") })?;
    let (into, unpack) = recv_into(st, buf, count, t)?;
    let id = st.eng.imrecv(m, into)?;
    st.reqs.insert(h, Pending::new(Some(id), comm, unpack, None));
    Ok(h)
}

entry!(MPI_Mrecv / PMPI_Mrecv(buf: *mut c_void, count: c_int, t: MPI_Datatype, message: *mut MPI_Message, status: *mut MPI_Status) comm(MPI_COMM_WORLD) {
    let m = array(message as *const MPI_Message, 1, "message")?[0];
    let s = with(|st| {
        let h = start_mrecv(st, buf as usize, count, t, m)?;
        wait_one(st, h)
    })?;
    put(message, MPI_MESSAGE_NULL, "message")?;
    put_status(status, s)
});

entry!(MPI_Imrecv / PMPI_Imrecv(buf: *mut c_void, count: c_int, t: MPI_Datatype, message: *mut MPI_Message, req: *mut MPI_Request) comm(MPI_COMM_WORLD) {
    let m = array(message as *const MPI_Message, 1, "message")?[0];
    let h = with(|st| start_mrecv(st, buf as usize, count, t, m))?;
    put(message, MPI_MESSAGE_NULL, "message")?;
    put(req, h, "request")
});
