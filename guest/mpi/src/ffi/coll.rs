//! The collectives, over the engine's point-to-point on each
//! communicator's collective context (`ctx + 1`): every rank calls them in
//! the same order, and messages between two ranks keep their order, so one
//! tag serves all. Algorithms: dissemination barrier, binomial broadcast,
//! reductions gathered in rank order (correct for every operation,
//! commutative or not), linear gathers and scatters, pairwise exchanges.
//! Data is packed into bytes at the edges, so any datatype works.

use std::ffi::{c_int, c_void};

use super::*;
use crate::engine::{From, Into, Pattern};
use crate::entry;

const TAG: i32 = 0;

/// Sends `bytes` to rank `to` of `comm` on its collective context.
fn csend(st: &mut State, comm: MPI_Comm, to: u32, bytes: Vec<u8>) -> R<()> {
    let c = st.comm(comm)?;
    let (w, ctx) = (c.ranks[to as usize], c.ctx + 1);
    let id = st.eng.isend(w, ctx, TAG, From::Owned(bytes), false)?;
    st.eng.wait(id)?;
    st.eng.finish(id)?;
    Ok(())
}

/// Posts a receive from rank `from` of `comm` of up to `cap` bytes.
fn cpost(st: &mut State, comm: MPI_Comm, from: u32, cap: usize) -> R<u64> {
    let c = st.comm(comm)?;
    let pattern = Pattern { ctx: c.ctx + 1, src: Some(c.ranks[from as usize]), tag: Some(TAG) };
    Ok(st.eng.irecv(pattern, Into::Packed { cap })?)
}

/// Waits for a posted collective receive; its bytes.
fn cwait(st: &mut State, id: u64) -> R<Vec<u8>> {
    st.eng.wait(id)?;
    Ok(st.eng.finish(id)?.1)
}

/// Receives up to `cap` bytes from rank `from` of `comm`.
fn crecv(st: &mut State, comm: MPI_Comm, from: u32, cap: usize) -> R<Vec<u8>> {
    let id = cpost(st, comm, from, cap)?;
    cwait(st, id)
}

/// Everyone's `mine` (the same length everywhere), in rank order.
pub fn allgather_u64(st: &mut State, comm: MPI_Comm, mine: &[u64]) -> R<Vec<u64>> {
    let bytes: Vec<u8> = mine.iter().flat_map(|w| w.to_ne_bytes()).collect();
    let all = allgather_bytes(st, comm, bytes)?;
    Ok(all.chunks_exact(8).map(|c| u64::from_ne_bytes(c.try_into().expect("8 bytes"))).collect())
}

/// Gathers equal-sized byte blocks at rank 0, then broadcasts them all.
fn allgather_bytes(st: &mut State, comm: MPI_Comm, mine: Vec<u8>) -> R<Vec<u8>> {
    let c = st.comm(comm)?;
    let (n, me) = (c.size(), c.rank);
    let len = mine.len();
    let mut all = Vec::new();
    if me == 0 {
        all.extend_from_slice(&mine);
        for r in 1..n {
            all.extend(crecv(st, comm, r, len)?);
        }
    } else {
        csend(st, comm, 0, mine)?;
    }
    bcast_bytes(st, comm, 0, &mut all, len * n as usize)?;
    Ok(all)
}

/// Binomial-tree broadcast of `len` bytes from `root`.
fn bcast_bytes(st: &mut State, comm: MPI_Comm, root: u32, data: &mut Vec<u8>, len: usize) -> R<()> {
    let c = st.comm(comm)?;
    let (n, me) = (c.size(), c.rank);
    let rel = (me + n - root) % n;
    let mut mask = 1;
    while mask < n {
        if rel & mask != 0 {
            let from = (me + n - mask) % n;
            *data = crecv(st, comm, from, len)?;
            break;
        }
        mask <<= 1;
    }
    mask >>= 1;
    while mask > 0 {
        if rel + mask < n {
            let to = (me + mask) % n;
            csend(st, comm, to, data.clone())?;
        }
        mask >>= 1;
    }
    Ok(())
}

/// Dissemination barrier.
pub fn barrier(st: &mut State, comm: MPI_Comm) -> R<()> {
    let c = st.comm(comm)?;
    let (n, me) = (c.size(), c.rank);
    let mut k = 1;
    while k < n {
        let id = cpost(st, comm, (me + n - k) % n, 0)?;
        csend(st, comm, (me + k) % n, Vec::new())?;
        cwait(st, id)?;
        k <<= 1;
    }
    Ok(())
}

/// Packs `count` items of type `t` at `buf`.
fn pack(st: &State, buf: usize, count: c_int, t: MPI_Datatype) -> R<Vec<u8>> {
    let dt = st.dtype(t)?;
    let n = count_ok(count)?;
    let mut out = vec![0u8; (dt.size() * n) as usize];
    if !out.is_empty() {
        nonnull(buf as *const u8, "buffer").or_else(|e| if buf == MPI_BOTTOM { Ok(()) } else { Err(e) })?;
        // SAFETY: the caller's buffer holds `count` items of this type.
        unsafe { dt.pack(n, buf as *const u8, &mut out) };
    }
    Ok(out)
}

/// Unpacks `bytes` into `count` items of type `t` at `buf`.
fn unpack(st: &State, buf: usize, count: c_int, t: MPI_Datatype, bytes: &[u8]) -> R<()> {
    let dt = st.dtype(t)?;
    let n = count_ok(count)?;
    if bytes.is_empty() {
        return Ok(());
    }
    // SAFETY: the caller's buffer holds `count` items of this type.
    unsafe { dt.unpack(n, buf as *mut u8, bytes) };
    Ok(())
}

fn root_ok(st: &State, comm: MPI_Comm, root: c_int) -> R<u32> {
    let n = st.comm(comm)?.size();
    match u32::try_from(root) {
        Ok(r) if r < n => Ok(r),
        _ => err(MPI_ERR_ROOT, format!("root {root} is not in a communicator of {n}")),
    }
}

entry!(MPI_Barrier / PMPI_Barrier(comm: MPI_Comm) comm(comm) {
    with(|st| barrier(st, comm))
});

entry!(MPI_Bcast / PMPI_Bcast(buf: *mut c_void, count: c_int, t: MPI_Datatype, root: c_int, comm: MPI_Comm) comm(comm) {
    with(|st| {
        let root = root_ok(st, comm, root)?;
        let me = st.comm(comm)?.rank;
        let mut data = if me == root { pack(st, buf as usize, count, t)? } else { Vec::new() };
        let len = (st.dtype(t)?.size() * count_ok(count)?) as usize;
        bcast_bytes(st, comm, root, &mut data, len)?;
        if me != root {
            unpack(st, buf as usize, count, t, &data)?;
        }
        Ok(())
    })
});

/// Reduces everyone's packed `mine` at `root` in rank order; the result
/// at the root, `None` elsewhere.
fn reduce_bytes(
    st: &mut State,
    comm: MPI_Comm,
    root: u32,
    mine: Vec<u8>,
    count: c_int,
    t: MPI_Datatype,
    op: MPI_Op,
) -> R<Option<Vec<u8>>> {
    let c = st.comm(comm)?;
    let (n, me) = (c.size(), c.rank);
    if me != root {
        csend(st, comm, root, mine)?;
        return Ok(None);
    }
    // In rank order, each contribution combined as it arrives:
    // next = acc op next (the operation's inout is its right operand).
    let len = mine.len();
    let mut mine = Some(mine);
    let mut acc: Option<Vec<u8>> = None;
    for r in 0..n {
        let mut next = if r == me { mine.take().unwrap_or_default() } else { crecv(st, comm, r, len)? };
        if let Some(a) = acc {
            types::apply(st, op, t, count, &a, &mut next)?;
        }
        acc = Some(next);
    }
    Ok(acc)
}

entry!(MPI_Reduce / PMPI_Reduce(sbuf: *const c_void, rbuf: *mut c_void, count: c_int, t: MPI_Datatype, op: MPI_Op, root: c_int, comm: MPI_Comm) comm(comm) {
    with(|st| {
        let root = root_ok(st, comm, root)?;
        let me = st.comm(comm)?.rank;
        let src = if sbuf as usize == MPI_IN_PLACE && me == root { rbuf as usize } else { sbuf as usize };
        let mine = pack(st, src, count, t)?;
        if let Some(res) = reduce_bytes(st, comm, root, mine, count, t, op)? {
            unpack(st, rbuf as usize, count, t, &res)?;
        }
        Ok(())
    })
});

entry!(MPI_Allreduce / PMPI_Allreduce(sbuf: *const c_void, rbuf: *mut c_void, count: c_int, t: MPI_Datatype, op: MPI_Op, comm: MPI_Comm) comm(comm) {
    with(|st| {
        let src = if sbuf as usize == MPI_IN_PLACE { rbuf as usize } else { sbuf as usize };
        let mine = pack(st, src, count, t)?;
        let len = mine.len();
        let mut res = reduce_bytes(st, comm, 0, mine, count, t, op)?.unwrap_or_default();
        bcast_bytes(st, comm, 0, &mut res, len)?;
        unpack(st, rbuf as usize, count, t, &res)
    })
});

/// Gathers blocks of `counts[r]` items of `rt` from each rank at `root`,
/// placed at `displs[r]` extents of `rt` in `rbuf`.
fn gatherv(
    st: &mut State,
    sbuf: usize,
    scount: c_int,
    stype: MPI_Datatype,
    rbuf: usize,
    counts: &[c_int],
    displs: &[c_int],
    rt: MPI_Datatype,
    root: u32,
    comm: MPI_Comm,
) -> R<()> {
    let c = st.comm(comm)?;
    let (n, me) = (c.size(), c.rank);
    if me != root {
        let mine = pack(st, sbuf, scount, stype)?;
        return csend(st, comm, root, mine);
    }
    let dt = st.dtype(rt)?;
    for r in 0..n {
        let at = rbuf.wrapping_add_signed(displs[r as usize] as isize * dt.extent() as isize);
        if r == me {
            if sbuf != MPI_IN_PLACE {
                let mine = pack(st, sbuf, scount, stype)?;
                unpack(st, at, counts[r as usize], rt, &mine)?;
            }
            continue;
        }
        let len = (dt.size() * count_ok(counts[r as usize])?) as usize;
        let got = crecv(st, comm, r, len)?;
        unpack(st, at, counts[r as usize], rt, &got)?;
    }
    Ok(())
}

/// Scatters blocks of `counts[r]` items of `st_` from `displs[r]` at the
/// root to each rank's `rbuf`.
fn scatterv(
    st: &mut State,
    sbuf: usize,
    counts: &[c_int],
    displs: &[c_int],
    stype: MPI_Datatype,
    rbuf: usize,
    rcount: c_int,
    rtype: MPI_Datatype,
    root: u32,
    comm: MPI_Comm,
) -> R<()> {
    let c = st.comm(comm)?;
    let (n, me) = (c.size(), c.rank);
    if me != root {
        let len = (st.dtype(rtype)?.size() * count_ok(rcount)?) as usize;
        let got = crecv(st, comm, root, len)?;
        return unpack(st, rbuf, rcount, rtype, &got);
    }
    let dt = st.dtype(stype)?;
    for r in 0..n {
        let at = sbuf.wrapping_add_signed(displs[r as usize] as isize * dt.extent() as isize);
        let block = pack(st, at, counts[r as usize], stype)?;
        if r == me {
            if rbuf != MPI_IN_PLACE {
                unpack(st, rbuf, rcount, rtype, &block)?;
            }
        } else {
            csend(st, comm, r, block)?;
        }
    }
    Ok(())
}

fn uniform(n: u32, count: c_int) -> (Vec<c_int>, Vec<c_int>) {
    ((0..n).map(|_| count).collect(), (0..n).map(|r| r as c_int * count).collect())
}

fn ints(p: *const c_int, n: u32, what: &str) -> R<Vec<c_int>> {
    array(p, n as usize, what)
}

entry!(MPI_Gather / PMPI_Gather(sbuf: *const c_void, scount: c_int, stype: MPI_Datatype, rbuf: *mut c_void, rcount: c_int, rtype: MPI_Datatype, root: c_int, comm: MPI_Comm) comm(comm) {
    with(|st| {
        let root = root_ok(st, comm, root)?;
        let (counts, displs) = uniform(st.comm(comm)?.size(), rcount);
        gatherv(st, sbuf as usize, scount, stype, rbuf as usize, &counts, &displs, rtype, root, comm)
    })
});

entry!(MPI_Gatherv / PMPI_Gatherv(sbuf: *const c_void, scount: c_int, stype: MPI_Datatype, rbuf: *mut c_void, rcounts: *const c_int, displs: *const c_int, rtype: MPI_Datatype, root: c_int, comm: MPI_Comm) comm(comm) {
    with(|st| {
        let root = root_ok(st, comm, root)?;
        let c = st.comm(comm)?;
        let (n, me) = (c.size(), c.rank);
        let (counts, displs) = if me == root { (ints(rcounts, n, "recvcounts")?, ints(displs, n, "displs")?) } else { (vec![0; n as usize], vec![0; n as usize]) };
        gatherv(st, sbuf as usize, scount, stype, rbuf as usize, &counts, &displs, rtype, root, comm)
    })
});

entry!(MPI_Scatter / PMPI_Scatter(sbuf: *const c_void, scount: c_int, stype: MPI_Datatype, rbuf: *mut c_void, rcount: c_int, rtype: MPI_Datatype, root: c_int, comm: MPI_Comm) comm(comm) {
    with(|st| {
        let root = root_ok(st, comm, root)?;
        let (counts, displs) = uniform(st.comm(comm)?.size(), scount);
        scatterv(st, sbuf as usize, &counts, &displs, stype, rbuf as usize, rcount, rtype, root, comm)
    })
});

entry!(MPI_Scatterv / PMPI_Scatterv(sbuf: *const c_void, scounts: *const c_int, displs: *const c_int, stype: MPI_Datatype, rbuf: *mut c_void, rcount: c_int, rtype: MPI_Datatype, root: c_int, comm: MPI_Comm) comm(comm) {
    with(|st| {
        let root = root_ok(st, comm, root)?;
        let c = st.comm(comm)?;
        let (n, me) = (c.size(), c.rank);
        let (counts, displs) = if me == root { (ints(scounts, n, "sendcounts")?, ints(displs, n, "displs")?) } else { (vec![0; n as usize], vec![0; n as usize]) };
        scatterv(st, sbuf as usize, &counts, &displs, stype, rbuf as usize, rcount, rtype, root, comm)
    })
});

/// Allgatherv: gather at 0, then broadcast rank 0's whole receive buffer
/// contents block by block.
fn allgatherv(
    st: &mut State,
    sbuf: usize,
    scount: c_int,
    stype: MPI_Datatype,
    rbuf: usize,
    counts: &[c_int],
    displs: &[c_int],
    rt: MPI_Datatype,
    comm: MPI_Comm,
) -> R<()> {
    let c = st.comm(comm)?;
    let me = c.rank;
    let (sbuf, scount, stype) = if sbuf == MPI_IN_PLACE {
        let ext = st.dtype(rt)?.extent() as isize;
        (rbuf.wrapping_add_signed(displs[me as usize] as isize * ext), counts[me as usize], rt)
    } else {
        (sbuf, scount, stype)
    };
    gatherv(st, sbuf, scount, stype, rbuf, counts, displs, rt, 0, comm)?;
    let dt = st.dtype(rt)?;
    for (&cnt, &d) in counts.iter().zip(displs) {
        let at = rbuf.wrapping_add_signed(d as isize * dt.extent() as isize);
        let len = (dt.size() * count_ok(cnt)?) as usize;
        let mut block = if me == 0 { pack(st, at, cnt, rt)? } else { Vec::new() };
        bcast_bytes(st, comm, 0, &mut block, len)?;
        if me != 0 {
            unpack(st, at, cnt, rt, &block)?;
        }
    }
    Ok(())
}

entry!(MPI_Allgather / PMPI_Allgather(sbuf: *const c_void, scount: c_int, stype: MPI_Datatype, rbuf: *mut c_void, rcount: c_int, rtype: MPI_Datatype, comm: MPI_Comm) comm(comm) {
    with(|st| {
        let (counts, displs) = uniform(st.comm(comm)?.size(), rcount);
        allgatherv(st, sbuf as usize, scount, stype, rbuf as usize, &counts, &displs, rtype, comm)
    })
});

entry!(MPI_Allgatherv / PMPI_Allgatherv(sbuf: *const c_void, scount: c_int, stype: MPI_Datatype, rbuf: *mut c_void, rcounts: *const c_int, displs: *const c_int, rtype: MPI_Datatype, comm: MPI_Comm) comm(comm) {
    with(|st| {
        let n = st.comm(comm)?.size();
        let (counts, displs) = (ints(rcounts, n, "recvcounts")?, ints(displs, n, "displs")?);
        allgatherv(st, sbuf as usize, scount, stype, rbuf as usize, &counts, &displs, rtype, comm)
    })
});

/// Every rank sends block r to rank r: all receives posted, then sends.
fn alltoallv(
    st: &mut State,
    sbuf: usize,
    scounts: &[c_int],
    sdispls: &[c_int],
    stype: MPI_Datatype,
    rbuf: usize,
    rcounts: &[c_int],
    rdispls: &[c_int],
    rtype: MPI_Datatype,
    comm: MPI_Comm,
) -> R<()> {
    // In place: each block goes out from where its answer will land. Every
    // block is packed before any answer is unpacked (receives complete
    // into the engine's buffers and are unpacked at the end), and our own
    // block stays where it is.
    let in_place = sbuf == MPI_IN_PLACE;
    let (sbuf, scounts, sdispls, stype) =
        if in_place { (rbuf, rcounts, rdispls, rtype) } else { (sbuf, scounts, sdispls, stype) };
    let c = st.comm(comm)?;
    let (n, me) = (c.size(), c.rank);
    let (sdt, rdt) = (st.dtype(stype)?, st.dtype(rtype)?);
    let mut posted = Vec::new();
    for r in 0..n {
        if r != me {
            let len = (rdt.size() * count_ok(rcounts[r as usize])?) as usize;
            posted.push((r, cpost(st, comm, r, len)?));
        }
    }
    for k in 1..=n {
        // Pairwise order spreads the load.
        let r = (me + k) % n;
        let at = sbuf.wrapping_add_signed(sdispls[r as usize] as isize * sdt.extent() as isize);
        let block = pack(st, at, scounts[r as usize], stype)?;
        if r == me {
            if !in_place {
                let to = rbuf.wrapping_add_signed(rdispls[r as usize] as isize * rdt.extent() as isize);
                unpack(st, to, rcounts[r as usize], rtype, &block)?;
            }
        } else {
            let c = st.comm(comm)?;
            let (w, ctx) = (c.ranks[r as usize], c.ctx + 1);
            let id = st.eng.isend(w, ctx, TAG, From::Owned(block), false)?;
            st.eng.wait(id)?;
            st.eng.finish(id)?;
        }
    }
    for (r, id) in posted {
        let got = cwait(st, id)?;
        let to = rbuf.wrapping_add_signed(rdispls[r as usize] as isize * rdt.extent() as isize);
        unpack(st, to, rcounts[r as usize], rtype, &got)?;
    }
    Ok(())
}

entry!(MPI_Alltoall / PMPI_Alltoall(sbuf: *const c_void, scount: c_int, stype: MPI_Datatype, rbuf: *mut c_void, rcount: c_int, rtype: MPI_Datatype, comm: MPI_Comm) comm(comm) {
    with(|st| {
        let n = st.comm(comm)?.size();
        let (sc, sd) = uniform(n, scount);
        let (rc, rd) = uniform(n, rcount);
        alltoallv(st, sbuf as usize, &sc, &sd, stype, rbuf as usize, &rc, &rd, rtype, comm)
    })
});

entry!(MPI_Alltoallv / PMPI_Alltoallv(sbuf: *const c_void, scounts: *const c_int, sdispls: *const c_int, stype: MPI_Datatype, rbuf: *mut c_void, rcounts: *const c_int, rdispls: *const c_int, rtype: MPI_Datatype, comm: MPI_Comm) comm(comm) {
    with(|st| {
        let n = st.comm(comm)?.size();
        let (sc, sd, rc, rd) = (ints(scounts, n, "sendcounts")?, ints(sdispls, n, "sdispls")?, ints(rcounts, n, "recvcounts")?, ints(rdispls, n, "rdispls")?);
        alltoallv(st, sbuf as usize, &sc, &sd, stype, rbuf as usize, &rc, &rd, rtype, comm)
    })
});

/// Inclusive (or exclusive) prefix reduction along the ranks.
fn scan(
    st: &mut State,
    sbuf: usize,
    rbuf: usize,
    count: c_int,
    t: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
    exclusive: bool,
) -> R<()> {
    let c = st.comm(comm)?;
    let (n, me) = (c.size(), c.rank);
    let src = if sbuf == MPI_IN_PLACE { rbuf } else { sbuf };
    let mut mine = pack(st, src, count, t)?;
    let len = mine.len();
    if me > 0 {
        let before = crecv(st, comm, me - 1, len)?;
        if exclusive {
            unpack(st, rbuf, count, t, &before)?;
        }
        // mine = before op mine.
        types::apply(st, op, t, count, &before, &mut mine)?;
    }
    if !exclusive {
        unpack(st, rbuf, count, t, &mine)?;
    }
    if me + 1 < n {
        csend(st, comm, me + 1, mine)?;
    }
    Ok(())
}

entry!(MPI_Scan / PMPI_Scan(sbuf: *const c_void, rbuf: *mut c_void, count: c_int, t: MPI_Datatype, op: MPI_Op, comm: MPI_Comm) comm(comm) {
    with(|st| scan(st, sbuf as usize, rbuf as usize, count, t, op, comm, false))
});

entry!(MPI_Exscan / PMPI_Exscan(sbuf: *const c_void, rbuf: *mut c_void, count: c_int, t: MPI_Datatype, op: MPI_Op, comm: MPI_Comm) comm(comm) {
    with(|st| scan(st, sbuf as usize, rbuf as usize, count, t, op, comm, true))
});

/// Reduce at rank 0, then scatter blocks of `counts`.
fn reduce_scatter(
    st: &mut State,
    sbuf: usize,
    rbuf: usize,
    counts: &[c_int],
    t: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
) -> R<()> {
    let total: c_int = counts.iter().sum();
    let src = if sbuf == MPI_IN_PLACE { rbuf } else { sbuf };
    let mine = pack(st, src, total, t)?;
    let res = reduce_bytes(st, comm, 0, mine, total, t, op)?;
    let dt = st.dtype(t)?;
    let me = st.comm(comm)?.rank;
    let n = counts.len() as u32;
    if me == 0 {
        let res = res.unwrap_or_default();
        let mut off = 0usize;
        for r in 0..n {
            let len = (dt.size() * count_ok(counts[r as usize])?) as usize;
            let block = res[off..off + len].to_vec();
            off += len;
            if r == 0 {
                unpack(st, rbuf, counts[0], t, &block)?;
            } else {
                csend(st, comm, r, block)?;
            }
        }
    } else {
        let len = (dt.size() * count_ok(counts[me as usize])?) as usize;
        let got = crecv(st, comm, 0, len)?;
        unpack(st, rbuf, counts[me as usize], t, &got)?;
    }
    Ok(())
}

entry!(MPI_Reduce_scatter_block / PMPI_Reduce_scatter_block(sbuf: *const c_void, rbuf: *mut c_void, count: c_int, t: MPI_Datatype, op: MPI_Op, comm: MPI_Comm) comm(comm) {
    with(|st| {
        let n = st.comm(comm)?.size();
        reduce_scatter(st, sbuf as usize, rbuf as usize, &vec![count; n as usize], t, op, comm)
    })
});

entry!(MPI_Reduce_scatter / PMPI_Reduce_scatter(sbuf: *const c_void, rbuf: *mut c_void, counts: *const c_int, t: MPI_Datatype, op: MPI_Op, comm: MPI_Comm) comm(comm) {
    with(|st| {
        let n = st.comm(comm)?.size();
        let counts = ints(counts, n, "recvcounts")?;
        reduce_scatter(st, sbuf as usize, rbuf as usize, &counts, t, op, comm)
    })
});
