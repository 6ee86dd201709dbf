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
fn add_comm(st: &mut State, c: Comm) -> MPI_Comm {
    let h = st.handle();
    st.comms.insert(h, c);
    h
}

entry!(MPI_Comm_dup / PMPI_Comm_dup(comm: MPI_Comm, newcomm: *mut MPI_Comm) comm(comm) {
    let h = with(|st| {
        let ctx = st.agree_ctx(comm)?;
        let mut c = st.comm(comm)?.clone();
        c.ctx = ctx;
        c.name = String::new();
        Ok(add_comm(st, c))
    })?;
    put(newcomm, h, "newcomm")
});

entry!(MPI_Comm_split / PMPI_Comm_split(comm: MPI_Comm, color: c_int, key: c_int, newcomm: *mut MPI_Comm) comm(comm) {
    if color < 0 && color != MPI_UNDEFINED {
        return err(MPI_ERR_ARG, format!("color {color} is negative"));
    }
    let h = with(|st| {
        let parent = st.comm(comm)?.clone();
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
        Ok(add_comm(st, Comm { ctx, ranks, rank, errhandler: parent.errhandler, name: String::new() }))
    })?;
    put(newcomm, h, "newcomm")
});

entry!(MPI_Comm_free / PMPI_Comm_free(comm: *mut MPI_Comm) comm(MPI_COMM_WORLD) {
    let c = array(comm as *const MPI_Comm, 1, "comm")?[0];
    if c == MPI_COMM_WORLD || c == MPI_COMM_SELF {
        return err(MPI_ERR_COMM, "a predefined communicator cannot be freed");
    }
    with(|st| {
        st.comm(c)?;
        st.comms.remove(&c);
        Ok(())
    })?;
    put(comm, MPI_COMM_NULL, "comm")
});

entry!(MPI_Comm_compare / PMPI_Comm_compare(a: MPI_Comm, b: MPI_Comm, result: *mut c_int) comm(a) {
    let r = with(|st| {
        let (x, y) = (st.comm(a)?, st.comm(b)?);
        Ok(if a == b {
            MPI_IDENT
        } else if x.ranks == y.ranks {
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
    st.groups.get(&g).cloned().ok_or(MpiErr { class: MPI_ERR_GROUP, msg: format!("{g:#x} is not a group") })
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
            let w = *a.get(r as usize).ok_or(MpiErr { class: MPI_ERR_RANK, msg: format!("rank {r} is not in group 1") })?;
            b.iter().position(|&x| x == w).map_or(MPI_UNDEFINED, |p| p as c_int)
        };
        // SAFETY: the caller passes an array of n ints for the result.
        put(unsafe { ranks2.add(i) }, t, "ranks2")?;
    }
    Ok(())
});

entry!(MPI_Comm_set_errhandler / PMPI_Comm_set_errhandler(comm: MPI_Comm, h: MPI_Errhandler) comm(comm) {
    with(|st| {
        let known = [MPI_ERRORS_ARE_FATAL, MPI_ERRORS_RETURN, MPI_ERRORS_ABORT].contains(&h) || st.errhandlers.contains_key(&h);
        if !known {
            return err(MPI_ERR_ARG, format!("{h:#x} is not an error handler"));
        }
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
    let Some(f) = f else { return err(MPI_ERR_ARG, "the handler function is NULL") };
    let e = with(|st| {
        let e = st.handle();
        st.errhandlers.insert(e, f);
        Ok(e)
    })?;
    put(h, e, "errhandler")
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
