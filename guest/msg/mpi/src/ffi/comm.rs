//! Communicators, groups and error handlers.

use std::ffi::{c_char, c_int};

use super::*;
use crate::entry;

/// A user error handler (`MPI_Comm_create_errhandler`).
pub type UserErrhandler = MPI_Comm_errhandler_function;

/// The user function behind error handler `h`, if it is one.
pub fn user_handler(h: MPI_Errhandler) -> Option<UserErrhandler> {
    STATE.lock().unwrap_or_else(|e| e.into_inner()).as_ref().and_then(|s| s.errhandlers.get(&h).copied())
}

entry!(MPI_Comm_rank / PMPI_Comm_rank(comm: MPI_Comm, rank: *mut c_int) comm(comm) {
    let r = with(|st| Ok(st.comm(comm)?.rank))?;
    put(rank, r as c_int, "rank")
});

entry!(MPI_Comm_size / PMPI_Comm_size(comm: MPI_Comm, size: *mut c_int) comm(comm) {
    let n = with(|st| Ok(st.comm(comm)?.size()))?;
    put(size, n as c_int, "size")
});

/// Registers communicator `c` under a fresh handle.
pub(crate) fn add_comm(st: &mut State, c: Comm) -> MPI_Comm {
    let h = st.handle();
    st.comms.insert(h, c);
    h
}

/// An intercommunicator on context block `ctx`, its hidden local
/// intracommunicator registered.
fn inter_comm(st: &mut State, ctx: u32, ranks: Vec<u32>, rank: u32, remote: Vec<u32>, eh: MPI_Errhandler) -> Comm {
    let local = add_comm(st, Comm::intra(ctx + 2, ranks.clone(), rank, eh));
    Comm { remote: Some(remote), local, ..Comm::intra(ctx, ranks, rank, eh) }
}

/// Registers an intercommunicator (see [`inter_comm`]).
fn add_inter(st: &mut State, ctx: u32, ranks: Vec<u32>, rank: u32, remote: Vec<u32>, eh: MPI_Errhandler) -> MPI_Comm {
    let c = inter_comm(st, ctx, ranks, rank, remote, eh);
    add_comm(st, c)
}

/// `MPI_Comm_idup`: the new handle at once, its context by a non-blocking
/// agreement (each member reserves its proposal, so nothing else this
/// process creates meanwhile proposes it); the communicator exists once
/// the request completes.
///
/// # Safety
/// Every pointer argument is null or points to what the MPI standard
/// requires of the argument of the same name in the calling function
/// (see [`put`](crate::ffi::put) and [`array`](crate::ffi::array)).
unsafe fn idup(comm: MPI_Comm, newcomm: *mut MPI_Comm, req: *mut MPI_Request) -> R<()> {
    nonnull(newcomm, "newcomm")?;
    nonnull(req, "request")?;
    let (h, r) = with(|st| {
        let c = st.comm(comm)?.clone();
        let topo = st.topos.get(&comm).cloned();
        let mine = st.next_ctx as u64;
        st.next_ctx += CTX_BLOCK;
        let h = st.handle();
        let (s, agreed) = coll::max_sched(st, comm, mine)?;
        let s = s.then(move |st| {
            let ctx = *agreed.lock().unwrap_or_else(|e| e.into_inner()) as u32;
            st.next_ctx = st.next_ctx.max(ctx + CTX_BLOCK);
            let new = match c.remote {
                Some(remote) => inter_comm(st, ctx, c.ranks, c.rank, remote, c.errhandler),
                None => Comm::intra(ctx, c.ranks, c.rank, c.errhandler),
            };
            st.comms.insert(h, new);
            if let Some(t) = topo {
                st.topos.insert(h, t);
            }
        });
        Ok((h, coll::nonblocking(st, comm, s)?))
    })?;
    super::attr::copy_all(comm, h)?;
    // SAFETY: the pointers are as this function's contract requires.
    unsafe { put(newcomm, h, "newcomm") }?;
    // SAFETY: the pointers are as this function's contract requires.
    unsafe { put(req, r, "request") }
}

entry!(MPI_Comm_idup / PMPI_Comm_idup(comm: MPI_Comm, newcomm: *mut MPI_Comm, req: *mut MPI_Request) comm(comm) {
    idup(comm, newcomm, req)
});

entry!(MPI_Comm_idup_with_info / PMPI_Comm_idup_with_info(comm: MPI_Comm, _info: MPI_Info, newcomm: *mut MPI_Comm, req: *mut MPI_Request) comm(comm) {
    idup(comm, newcomm, req)
});

entry!(MPI_Comm_dup_with_info / PMPI_Comm_dup_with_info(comm: MPI_Comm, _info: MPI_Info, newcomm: *mut MPI_Comm) comm(comm) {
    // SAFETY: forwarding our own caller's arguments.
    let rc = unsafe { PMPI_Comm_dup(comm, newcomm) };
    if rc != MPI_SUCCESS {
        return err(rc, "MPI_Comm_dup failed");
    }
    Ok(())
});

entry!(MPI_Comm_dup / PMPI_Comm_dup(comm: MPI_Comm, newcomm: *mut MPI_Comm) comm(comm) {
    let h = with(|st| {
        let ctx = st.agree_ctx(comm)?;
        let mut c = st.comm(comm)?.clone();
        if let Some(remote) = c.remote {
            return Ok(add_inter(st, ctx, c.ranks, c.rank, remote, c.errhandler));
        }
        c.ctx = ctx;
        c.name = String::new();
        let t = st.topos.get(&comm).cloned();
        let h = add_comm(st, c);
        if let Some(t) = t {
            st.topos.insert(h, t);
        }
        Ok(h)
    })?;
    super::attr::copy_all(comm, h)?;
    put(newcomm, h, "newcomm")
});

entry!(MPI_Comm_split / PMPI_Comm_split(comm: MPI_Comm, color: c_int, key: c_int, newcomm: *mut MPI_Comm) comm(comm) {
    if color < 0 && color != MPI_UNDEFINED {
        return err(MPI_ERR_ARG, format!("color {color} is negative"));
    }
    let h = with(|st| {
        let parent = st.comm(comm)?.clone();
        if parent.is_inter() {
            return split_inter(st, comm, color, key);
        }
        // Everyone's (color, key), by parent rank.
        let mine = [color as u32 as u64, key as u32 as u64];
        let all = coll::allgather_u64(st, comm, &mine)?;
        let ctx = st.agree_ctx(comm)?;
        if color == MPI_UNDEFINED {
            return Ok(MPI_COMM_NULL);
        }
        let mut members: Vec<(i32, u32)> = (0..parent.size())
            .filter(|&r| all[2 * r as usize] as u32 as i32 == color)
            .map(|r| (all[2 * r as usize + 1] as u32 as i32, r))
            .collect();
        members.sort();
        let ranks: Vec<u32> = members.iter().map(|&(_, r)| parent.ranks[r as usize]).collect();
        let rank = members.iter().position(|&(_, r)| r == parent.rank).unwrap_or(0) as u32;
        Ok(add_comm(st, Comm::intra(ctx, ranks, rank, parent.errhandler)))
    })?;
    put(newcomm, h, "newcomm")
});

/// The members of `group` (world ranks) whose (color, key) in `all` (two
/// words a member) has `color`, in key order (ties by rank).
fn by_key(group: &[u32], all: &[u64], color: c_int) -> Vec<u32> {
    let mut members: Vec<(i32, usize)> = (0..group.len())
        .filter(|&r| all.get(2 * r).is_some_and(|&c| c as u32 as i32 == color))
        .map(|r| (all[2 * r + 1] as u32 as i32, r))
        .collect();
    members.sort();
    members.into_iter().map(|(_, r)| group[r]).collect()
}

/// `MPI_Comm_split` of an intercommunicator: each color's local members
/// and remote members make a new intercommunicator (none where either
/// side has nobody of that color).
fn split_inter(st: &mut State, comm: MPI_Comm, color: c_int, key: c_int) -> R<MPI_Comm> {
    let c = st.comm(comm)?.clone();
    let ours = coll::allgather_u64(st, c.local, &[color as u32 as u64, key as u32 as u64])?;
    let theirs = coll::inter_exchange(st, comm, ours.clone())?;
    let ctx = st.agree_ctx(comm)?;
    if color == MPI_UNDEFINED {
        return Ok(MPI_COMM_NULL);
    }
    let local = by_key(&c.ranks, &ours, color);
    let remote = by_key(c.peers(), &theirs, color);
    let me = st.place.rank;
    match local.iter().position(|&w| w == me) {
        Some(rank) if !remote.is_empty() => Ok(add_inter(st, ctx, local, rank as u32, remote, c.errhandler)),
        _ => Ok(MPI_COMM_NULL),
    }
}

entry!(MPI_Intercomm_create / PMPI_Intercomm_create(local_comm: MPI_Comm, local_leader: c_int, peer_comm: MPI_Comm, remote_leader: c_int, tag: c_int, newintercomm: *mut MPI_Comm) comm(local_comm) {
    nonnull(newintercomm, "newintercomm")?;
    let h = with(|st| {
        let lc = st.comm(local_comm)?.clone();
        if lc.is_inter() {
            return err(MPI_ERR_COMM, "the local communicator of MPI_Intercomm_create is an intercommunicator");
        }
        let leader = match u32::try_from(local_leader) {
            Ok(l) if l < lc.size() => l,
            _ => return err(MPI_ERR_RANK, format!("local leader {local_leader} is not in a communicator of {}", lc.size())),
        };
        // The local group's largest next context, then the leaders swap
        // it and their groups over the peer communicator, and each leader
        // tells its group.
        let mine = st.next_ctx as u64;
        let local_max = coll::allgather_u64(st, local_comm, &[mine])?.into_iter().max().unwrap_or(mine);
        let theirs = if lc.rank == leader {
            let msg: Vec<u64> = std::iter::once(local_max).chain(lc.ranks.iter().map(|&w| w as u64)).collect();
            leaders_swap(st, peer_comm, remote_leader, tag, msg)?
        } else {
            Vec::new()
        };
        let theirs = coll::bcast_u64(st, local_comm, leader, theirs)?;
        let Some((&their_max, remote)) = theirs.split_first() else {
            return err(MPI_ERR_INTERN, "the remote leader sent no group");
        };
        let remote: Vec<u32> = remote.iter().map(|&w| w as u32).collect();
        if remote.iter().any(|w| lc.ranks.contains(w)) {
            return err(MPI_ERR_COMM, "the local and remote groups of MPI_Intercomm_create overlap");
        }
        let ctx = local_max.max(their_max) as u32;
        st.next_ctx = ctx + CTX_BLOCK;
        Ok(add_inter(st, ctx, lc.ranks, lc.rank, remote, lc.errhandler))
    })?;
    put(newintercomm, h, "newintercomm")
});

/// The local leader's half of `MPI_Intercomm_create`: `msg` to the remote
/// leader over the peer communicator (with the caller's tag), its message
/// back.
fn leaders_swap(st: &mut State, peer_comm: MPI_Comm, remote_leader: c_int, tag: c_int, msg: Vec<u64>) -> R<Vec<u64>> {
    let pc = st.comm(peer_comm)?;
    let to = match usize::try_from(remote_leader).ok().and_then(|r| pc.peers().get(r)) {
        Some(&w) => w,
        None => return err(MPI_ERR_RANK, format!("remote leader {remote_leader} is not in the peer communicator")),
    };
    let ctx = pc.ctx;
    let cap = 8 * (1 + st.place.size as usize);
    let bytes = coll::to_bytes(&msg);
    use crate::engine::{Pattern, RecvBuf, SendBuf};
    let r = st.eng.irecv(Pattern { ctx, src: Some(to), tag: Some(tag) }, RecvBuf::Packed { cap })?;
    let s = st.eng.isend(to, ctx, tag, SendBuf::Owned(bytes), false)?;
    st.eng.wait(s)?;
    st.eng.finish(s)?;
    st.eng.wait(r)?;
    let (_, got) = st.eng.finish(r)?;
    Ok(coll::words(&got))
}

entry!(MPI_Intercomm_merge / PMPI_Intercomm_merge(intercomm: MPI_Comm, high: c_int, newintracomm: *mut MPI_Comm) comm(intercomm) {
    nonnull(newintracomm, "newintracomm")?;
    let h = with(|st| {
        let c = st.comm(intercomm)?.clone();
        let Some(remote) = c.remote.clone() else {
            return err(MPI_ERR_COMM, "MPI_Intercomm_merge needs an intercommunicator");
        };
        // The group that passed high = false comes first; on a tie, the
        // group whose leader has the lower world rank.
        let theirs = coll::inter_exchange(st, intercomm, vec![(high != 0) as u64, c.ranks[0] as u64])?;
        let (their_high, their_leader) = (theirs.first().copied().unwrap_or(0) != 0, theirs.get(1).copied().unwrap_or(0));
        let first = if (high != 0) != their_high { high == 0 } else { (c.ranks[0] as u64) < their_leader };
        let ranks: Vec<u32> = if first { [c.ranks.clone(), remote].concat() } else { [remote, c.ranks.clone()].concat() };
        let ctx = st.agree_ctx(intercomm)?;
        let me = st.place.rank;
        let rank = ranks.iter().position(|&w| w == me).unwrap_or(0) as u32;
        Ok(add_comm(st, Comm::intra(ctx, ranks, rank, c.errhandler)))
    })?;
    put(newintracomm, h, "newintracomm")
});

entry!(MPI_Comm_remote_size / PMPI_Comm_remote_size(comm: MPI_Comm, size: *mut c_int) comm(comm) {
    let n = with(|st| match &st.comm(comm)?.remote {
        Some(r) => Ok(r.len()),
        None => err(MPI_ERR_COMM, "not an intercommunicator"),
    })?;
    put(size, n as c_int, "size")
});

entry!(MPI_Comm_remote_group / PMPI_Comm_remote_group(comm: MPI_Comm, group: *mut MPI_Group) comm(comm) {
    let ranks = with(|st| match &st.comm(comm)?.remote {
        Some(r) => Ok(r.clone()),
        None => err(MPI_ERR_COMM, "not an intercommunicator"),
    })?;
    add_group(ranks, group)
});

entry!(MPI_Comm_free / PMPI_Comm_free(comm: *mut MPI_Comm) comm(MPI_COMM_WORLD) {
    let c = array(comm as *const MPI_Comm, 1, "comm")?[0];
    if c == MPI_COMM_WORLD || c == MPI_COMM_SELF {
        return err(MPI_ERR_COMM, "a predefined communicator cannot be freed");
    }
    with(|st| st.comm(c).map(|_| ()))?;
    super::attr::drop_all(c)?;
    with(|st| {
        if let Some(x) = st.comms.remove(&c) {
            st.comms.remove(&x.local);
            // Its collective contexts (its own and its local group's).
            for ctx in [x.ctx + 1, x.ctx + 3] {
                st.coll_seq.remove(&ctx);
            }
        }
        st.topos.remove(&c);
        Ok(())
    })?;
    put(comm, MPI_COMM_NULL, "comm")
});

entry!(MPI_Comm_compare / PMPI_Comm_compare(a: MPI_Comm, b: MPI_Comm, result: *mut c_int) comm(a) {
    let r = with(|st| {
        let (x, y) = (st.comm(a)?, st.comm(b)?);
        Ok(if a == b {
            MPI_IDENT
        } else if x.is_inter() != y.is_inter() {
            MPI_UNEQUAL
        } else if x.ranks == y.ranks && x.remote == y.remote {
            MPI_CONGRUENT
        } else {
            let (mut p, mut q) = (x.ranks.clone(), y.ranks.clone());
            p.sort();
            q.sort();
            if p == q { MPI_SIMILAR } else { MPI_UNEQUAL }
        })
    })?;
    put(result, r, "result")
});

entry!(MPI_Comm_group / PMPI_Comm_group(comm: MPI_Comm, group: *mut MPI_Group) comm(comm) {
    let h = with(|st| {
        let ranks = st.comm(comm)?.ranks.clone();
        let h = st.handle();
        st.groups.insert(h, ranks);
        Ok(h)
    })?;
    put(group, h, "group")
});

fn group(st: &State, g: MPI_Group) -> R<Vec<u32>> {
    if g == MPI_GROUP_EMPTY {
        return Ok(Vec::new());
    }
    st.groups.get(&g).cloned().ok_or_else(|| MpiErr { class: MPI_ERR_GROUP, msg: format!("{g:#x} is not a group") })
}

entry!(MPI_Group_size / PMPI_Group_size(g: MPI_Group, size: *mut c_int) comm(MPI_COMM_WORLD) {
    let n = with(|st| group(st, g))?.len();
    put(size, n as c_int, "size")
});

entry!(MPI_Group_rank / PMPI_Group_rank(g: MPI_Group, rank: *mut c_int) comm(MPI_COMM_WORLD) {
    let (ranks, me) = with(|st| Ok((group(st, g)?, st.place.rank)))?;
    let r = ranks.iter().position(|&w| w == me).map_or(MPI_UNDEFINED, |i| i as c_int);
    put(rank, r, "rank")
});

entry!(MPI_Group_free / PMPI_Group_free(g: *mut MPI_Group) comm(MPI_COMM_WORLD) {
    let h = array(g as *const MPI_Group, 1, "group")?[0];
    with(|st| {
        if h != MPI_GROUP_EMPTY && st.groups.remove(&h).is_none() {
            return err(MPI_ERR_GROUP, format!("{h:#x} is not a group"));
        }
        Ok(())
    })?;
    put(g, MPI_GROUP_NULL, "group")
});

entry!(MPI_Group_translate_ranks / PMPI_Group_translate_ranks(g1: MPI_Group, n: c_int, ranks1: *const c_int, g2: MPI_Group, ranks2: *mut c_int) comm(MPI_COMM_WORLD) {
    let n = count_ok(n)? as usize;
    let r1 = array(ranks1, n, "ranks1")?;
    let (a, b) = with(|st| Ok((group(st, g1)?, group(st, g2)?)))?;
    for (i, &r) in r1.iter().enumerate() {
        let t = if r == MPI_PROC_NULL {
            MPI_PROC_NULL
        } else {
            let w = *a.get(r as usize).ok_or_else(|| MpiErr { class: MPI_ERR_RANK, msg: format!("rank {r} is not in group 1") })?;
            b.iter().position(|&x| x == w).map_or(MPI_UNDEFINED, |p| p as c_int)
        };
        // SAFETY: the caller passes an array of n ints for the result.
        put(unsafe { ranks2.add(i) }, t, "ranks2")?;
    }
    Ok(())
});

/// Checks that `h` is a predefined or user error handler (of
/// communicators and windows alike).
pub(crate) fn errhandler_known(st: &State, h: MPI_Errhandler) -> R<()> {
    let known =
        [MPI_ERRORS_ARE_FATAL, MPI_ERRORS_RETURN, MPI_ERRORS_ABORT].contains(&h) || st.errhandlers.contains_key(&h);
    if !known {
        return err(MPI_ERR_ARG, format!("{h:#x} is not an error handler"));
    }
    Ok(())
}

/// Registers user error handler `f` and stores its handle in `h`
/// (`MPI_Comm_create_errhandler`, `MPI_Win_create_errhandler`: the two
/// function types have the same shape).
///
/// # Safety
/// Every pointer argument is null or points to what the MPI standard
/// requires of the argument of the same name in the calling function
/// (see [`put`](crate::ffi::put) and [`array`](crate::ffi::array)).
pub(crate) unsafe fn create_errhandler(f: Option<MPI_Comm_errhandler_function>, h: *mut MPI_Errhandler) -> R<()> {
    let Some(f) = f else { return err(MPI_ERR_ARG, "the handler function is NULL") };
    let e = with(|st| {
        let e = st.handle();
        st.errhandlers.insert(e, f);
        Ok(e)
    })?;
    // SAFETY: the pointers are as this function's contract requires.
    unsafe { put(h, e, "errhandler") }
}

entry!(MPI_Comm_set_errhandler / PMPI_Comm_set_errhandler(comm: MPI_Comm, h: MPI_Errhandler) comm(comm) {
    with(|st| {
        errhandler_known(st, h)?;
        st.comm(comm)?;
        if let Some(c) = st.comms.get_mut(&comm) {
            c.errhandler = h;
        }
        Ok(())
    })
});

entry!(MPI_Comm_get_errhandler / PMPI_Comm_get_errhandler(comm: MPI_Comm, h: *mut MPI_Errhandler) comm(comm) {
    let e = with(|st| Ok(st.comm(comm)?.errhandler))?;
    put(h, e, "errhandler")
});

entry!(MPI_Comm_create_errhandler / PMPI_Comm_create_errhandler(f: Option<MPI_Comm_errhandler_function>, h: *mut MPI_Errhandler) comm(MPI_COMM_WORLD) {
    create_errhandler(f, h)
});

entry!(MPI_Errhandler_free / PMPI_Errhandler_free(h: *mut MPI_Errhandler) comm(MPI_COMM_WORLD) {
    let e = array(h as *const MPI_Errhandler, 1, "errhandler")?[0];
    with(|st| {
        st.errhandlers.remove(&e);
        Ok(())
    })?;
    put(h, MPI_ERRHANDLER_NULL, "errhandler")
});

entry!(MPI_Comm_set_name / PMPI_Comm_set_name(comm: MPI_Comm, name: *const c_char) comm(comm) {
    nonnull(name, "name")?;
    // SAFETY: the caller passes a NUL-terminated string.
    let s = unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy().into_owned();
    with(|st| {
        st.comm(comm)?;
        if let Some(c) = st.comms.get_mut(&comm) {
            c.name = s;
        }
        Ok(())
    })
});

entry!(MPI_Comm_get_name / PMPI_Comm_get_name(comm: MPI_Comm, name: *mut c_char, len: *mut c_int) comm(comm) {
    let s = with(|st| Ok(st.comm(comm)?.name.clone()))?;
    super::env::put_str(name, MPI_MAX_OBJECT_NAME as usize, &s, len)
});

/// # Safety
/// Every pointer argument is null or points to what the MPI standard
/// requires of the argument of the same name in the calling function
/// (see [`put`](crate::ffi::put) and [`array`](crate::ffi::array)).
unsafe fn add_group(ranks: Vec<u32>, out: *mut MPI_Group) -> R<()> {
    let h = with(|st| {
        if ranks.is_empty() {
            return Ok(MPI_GROUP_EMPTY);
        }
        let h = st.handle();
        st.groups.insert(h, ranks);
        Ok(h)
    })?;
    // SAFETY: the pointers are as this function's contract requires.
    unsafe { put(out, h, "newgroup") }
}

fn group_of(g: MPI_Group) -> R<Vec<u32>> {
    with(|st| group(st, g))
}

/// Ranks `ranks` of group `g`, checked (in range, no repeats).
fn pick(g: &[u32], ranks: &[c_int]) -> R<Vec<u32>> {
    let mut seen = std::collections::HashSet::new();
    ranks
        .iter()
        .map(|&r| {
            let w = usize::try_from(r).ok().and_then(|i| g.get(i)).copied();
            match w {
                Some(w) if seen.insert(r) => Ok(w),
                Some(_) => err(MPI_ERR_RANK, format!("rank {r} is named twice")),
                None => err(MPI_ERR_RANK, format!("rank {r} is not in a group of {}", g.len())),
            }
        })
        .collect()
}

/// The ranks of `n` (first, last, stride) triplets.
///
/// # Safety
/// Every pointer argument is null or points to what the MPI standard
/// requires of the argument of the same name in the calling function
/// (see [`put`](crate::ffi::put) and [`array`](crate::ffi::array)).
unsafe fn ranges(p: *const [c_int; 3], n: c_int) -> R<Vec<c_int>> {
    let mut out = Vec::new();
    // SAFETY: the pointers are as this function's contract requires.
    for [first, last, stride] in unsafe { array(p, count_ok(n)? as usize, "ranges") }? {
        if stride == 0 {
            return err(MPI_ERR_ARG, "a range with stride 0");
        }
        let mut r = first;
        while (stride > 0 && r <= last) || (stride < 0 && r >= last) {
            out.push(r);
            r += stride;
        }
    }
    Ok(out)
}

entry!(MPI_Group_incl / PMPI_Group_incl(g: MPI_Group, n: c_int, ranks: *const c_int, out: *mut MPI_Group) comm(MPI_COMM_WORLD) {
    let g = group_of(g)?;
    add_group(pick(&g, &array(ranks, count_ok(n)? as usize, "ranks")?)?, out)
});

entry!(MPI_Group_excl / PMPI_Group_excl(g: MPI_Group, n: c_int, ranks: *const c_int, out: *mut MPI_Group) comm(MPI_COMM_WORLD) {
    let g = group_of(g)?;
    let gone = pick(&g, &array(ranks, count_ok(n)? as usize, "ranks")?)?;
    add_group(g.into_iter().filter(|w| !gone.contains(w)).collect(), out)
});

entry!(MPI_Group_range_incl / PMPI_Group_range_incl(g: MPI_Group, n: c_int, r: *const [c_int; 3], out: *mut MPI_Group) comm(MPI_COMM_WORLD) {
    let g = group_of(g)?;
    add_group(pick(&g, &ranges(r, n)?)?, out)
});

entry!(MPI_Group_range_excl / PMPI_Group_range_excl(g: MPI_Group, n: c_int, r: *const [c_int; 3], out: *mut MPI_Group) comm(MPI_COMM_WORLD) {
    let g = group_of(g)?;
    let gone = pick(&g, &ranges(r, n)?)?;
    add_group(g.into_iter().filter(|w| !gone.contains(w)).collect(), out)
});

entry!(MPI_Group_union / PMPI_Group_union(a: MPI_Group, b: MPI_Group, out: *mut MPI_Group) comm(MPI_COMM_WORLD) {
    let (mut x, y) = (group_of(a)?, group_of(b)?);
    for w in y {
        if !x.contains(&w) {
            x.push(w);
        }
    }
    add_group(x, out)
});

entry!(MPI_Group_intersection / PMPI_Group_intersection(a: MPI_Group, b: MPI_Group, out: *mut MPI_Group) comm(MPI_COMM_WORLD) {
    let (x, y) = (group_of(a)?, group_of(b)?);
    add_group(x.into_iter().filter(|w| y.contains(w)).collect(), out)
});

entry!(MPI_Group_difference / PMPI_Group_difference(a: MPI_Group, b: MPI_Group, out: *mut MPI_Group) comm(MPI_COMM_WORLD) {
    let (x, y) = (group_of(a)?, group_of(b)?);
    add_group(x.into_iter().filter(|w| !y.contains(w)).collect(), out)
});

entry!(MPI_Group_compare / PMPI_Group_compare(a: MPI_Group, b: MPI_Group, result: *mut c_int) comm(MPI_COMM_WORLD) {
    let (x, y) = (group_of(a)?, group_of(b)?);
    let r = if x == y {
        MPI_IDENT
    } else {
        let (mut p, mut q) = (x, y);
        p.sort();
        q.sort();
        if p == q { MPI_SIMILAR } else { MPI_UNEQUAL }
    };
    put(result, r, "result")
});

/// A communicator of the members of `ranks` (world ranks) made from
/// `parent`: collective over `parent` when `over_parent`, else over the
/// new group only (`MPI_Comm_create_group`).
fn create(parent: MPI_Comm, ranks: Vec<u32>, over_parent: bool, tag: c_int) -> R<MPI_Comm> {
    with(|st| {
        let p = st.comm(parent)?.clone();
        let me = st.place.rank;
        if p.is_inter() {
            // Each group names a subgroup of its own; both must be
            // non-empty for the new intercommunicator to exist.
            let theirs = coll::inter_exchange(st, parent, ranks.iter().map(|&w| w as u64).collect())?;
            let ctx = st.agree_ctx(parent)?;
            let remote: Vec<u32> = theirs.into_iter().map(|w| w as u32).collect();
            return match ranks.iter().position(|&w| w == me) {
                Some(rank) if !remote.is_empty() => Ok(add_inter(st, ctx, ranks, rank as u32, remote, p.errhandler)),
                _ => Ok(MPI_COMM_NULL),
            };
        }
        if over_parent {
            let ctx = st.agree_ctx(parent)?;
            let Some(rank) = ranks.iter().position(|&w| w == me) else { return Ok(MPI_COMM_NULL) };
            return Ok(add_comm(st, Comm::intra(ctx, ranks, rank as u32, p.errhandler)));
        }
        let Some(rank) = ranks.iter().position(|&w| w == me) else {
            return err(MPI_ERR_GROUP, "MPI_Comm_create_group called by a process outside the group");
        };
        // Agree on a context among the group only, through a temporary
        // communicator on a context derived from the parent's and the tag.
        let tmp_ctx = 0x8000_0000 | (p.ctx.wrapping_mul(65599) ^ tag as u32) & 0x7FFF_FFFE;
        let tmp = Comm::intra(tmp_ctx, ranks.clone(), rank as u32, p.errhandler);
        let th = add_comm(st, tmp);
        // The temporary context comes back with the next call of this
        // kind, which other members may not have made: its collective
        // tags start afresh each time.
        st.coll_seq.remove(&(tmp_ctx + 1));
        let ctx = st.agree_ctx(th);
        st.comms.remove(&th);
        st.coll_seq.remove(&(tmp_ctx + 1));
        let ctx = ctx?;
        Ok(add_comm(st, Comm::intra(ctx, ranks, rank as u32, p.errhandler)))
    })
}

entry!(MPI_Comm_create / PMPI_Comm_create(comm: MPI_Comm, g: MPI_Group, newcomm: *mut MPI_Comm) comm(comm) {
    let ranks = group_of(g)?;
    let h = create(comm, ranks, true, 0)?;
    put(newcomm, h, "newcomm")
});

entry!(MPI_Comm_create_group / PMPI_Comm_create_group(comm: MPI_Comm, g: MPI_Group, tag: c_int, newcomm: *mut MPI_Comm) comm(comm) {
    let ranks = group_of(g)?;
    let h = create(comm, ranks, false, tag)?;
    put(newcomm, h, "newcomm")
});

entry!(MPI_Comm_split_type / PMPI_Comm_split_type(comm: MPI_Comm, split_type: c_int, key: c_int, _info: MPI_Info, newcomm: *mut MPI_Comm) comm(comm) {
    // Shared memory: the ranks of one guest, told apart by node id.
    let color = if split_type == MPI_UNDEFINED {
        MPI_UNDEFINED
    } else if split_type == MPI_COMM_TYPE_SHARED {
        node_id() as c_int
    } else {
        return err(MPI_ERR_ARG, format!("split type {split_type} is not supported (MPI_COMM_TYPE_SHARED is)"));
    };
    // SAFETY: forwarding our own caller's arguments.
    let rc = unsafe { PMPI_Comm_split(comm, color, key, newcomm) };
    if rc != MPI_SUCCESS {
        return err(rc, "MPI_Comm_split failed");
    }
    Ok(())
});

/// This guest's node id (0 without imcd), the unit of shared memory.
pub(crate) fn node_id() -> u32 {
    ump::info().map(|i| i.node).unwrap_or(0)
}

entry!(MPI_Comm_test_inter / PMPI_Comm_test_inter(comm: MPI_Comm, flag: *mut c_int) comm(comm) {
    let inter = with(|st| Ok(st.comm(comm)?.is_inter()))?;
    put(flag, inter as c_int, "flag")
});
