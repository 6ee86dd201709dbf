//! Info objects (`MPI_Info_*`: ordered key and value strings) and memory
//! (`MPI_Alloc_mem`, `MPI_Free_mem`).

use std::ffi::{c_char, c_int, c_void, CStr};

use super::*;
use crate::entry;

/// The caller's C string at `p` (an `MPI_ERR_ARG` if null).
///
/// # Safety
/// `p` is null or points to a NUL-terminated string.
unsafe fn text(p: *const c_char, what: &str) -> R<String> {
    nonnull(p, what)?;
    // SAFETY: `p` is not null and NUL-terminated (this function's contract).
    Ok(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

fn info(st: &State, h: MPI_Info) -> R<&Vec<(String, String)>> {
    st.infos.get(&h).ok_or_else(|| MpiErr { class: MPI_ERR_INFO, msg: format!("{h:#x} is not an info object") })
}

/// The hints set on communicator `comm` (`MPI_Comm_set_info`).
fn comm_hints(st: &mut State, comm: MPI_Comm) -> R<&mut Vec<(String, String)>> {
    st.comm(comm)?;
    Ok(st.comm_infos.entry(comm).or_default())
}

/// The communicator hints this library takes (MPI 4.0, 7.4.4): each only
/// allows an optimisation, so honouring one means nothing more than
/// keeping it. Other keys are ignored, as the standard asks, and
/// `MPI_Comm_get_info` does not return them.
const COMM_HINTS: [&str; 4] =
    ["mpi_assert_no_any_tag", "mpi_assert_no_any_source", "mpi_assert_exact_length", "mpi_assert_allow_overtaking"];

entry!(MPI_Comm_set_info / PMPI_Comm_set_info(comm: MPI_Comm, i: MPI_Info) comm(comm) {
    with(|st| {
        let v = if i == MPI_INFO_NULL { Vec::new() } else { info(st, i)?.clone() };
        let hints = comm_hints(st, comm)?;
        for (k, val) in v.into_iter().filter(|(k, _)| COMM_HINTS.contains(&k.as_str())) {
            hints.retain(|(x, _)| *x != k);
            hints.push((k, val));
        }
        Ok(())
    })
});

entry!(MPI_Comm_get_info / PMPI_Comm_get_info(comm: MPI_Comm, out: *mut MPI_Info) comm(comm) {
    let h = with(|st| {
        let v = comm_hints(st, comm)?.clone();
        let h = st.handle();
        st.infos.insert(h, v);
        Ok(h)
    })?;
    put(out, h, "info_used")
});

entry!(MPI_Info_create / PMPI_Info_create(out: *mut MPI_Info) comm(MPI_COMM_WORLD) {
    let h = with(|st| {
        let h = st.handle();
        st.infos.insert(h, Vec::new());
        Ok(h)
    })?;
    put(out, h, "info")
});

entry!(MPI_Info_dup / PMPI_Info_dup(i: MPI_Info, out: *mut MPI_Info) comm(MPI_COMM_WORLD) {
    let h = with(|st| {
        let v = info(st, i)?.clone();
        let h = st.handle();
        st.infos.insert(h, v);
        Ok(h)
    })?;
    put(out, h, "newinfo")
});

entry!(MPI_Info_free / PMPI_Info_free(i: *mut MPI_Info) comm(MPI_COMM_WORLD) {
    let h = array(i as *const MPI_Info, 1, "info")?[0];
    with(|st| st.infos.remove(&h).map(|_| ()).ok_or_else(|| MpiErr { class: MPI_ERR_INFO, msg: format!("{h:#x} is not an info object") }))?;
    put(i, MPI_INFO_NULL, "info")
});

entry!(MPI_Info_set / PMPI_Info_set(i: MPI_Info, key: *const c_char, value: *const c_char) comm(MPI_COMM_WORLD) {
    let (k, v) = (text(key, "key")?, text(value, "value")?);
    if k.len() >= MPI_MAX_INFO_KEY as usize {
        return err(MPI_ERR_INFO_KEY, format!("key {k:?} is longer than MPI_MAX_INFO_KEY"));
    }
    with(|st| {
        info(st, i)?;
        let l = st.infos.get_mut(&i).expect("checked");
        match l.iter_mut().find(|e| e.0 == k) {
            Some(e) => e.1 = v,
            None => l.push((k, v)),
        }
        Ok(())
    })
});

entry!(MPI_Info_delete / PMPI_Info_delete(i: MPI_Info, key: *const c_char) comm(MPI_COMM_WORLD) {
    let k = text(key, "key")?;
    with(|st| {
        info(st, i)?;
        let l = st.infos.get_mut(&i).expect("checked");
        let n = l.len();
        l.retain(|e| e.0 != k);
        if l.len() == n {
            return err(MPI_ERR_INFO_NOKEY, format!("no key {k:?}"));
        }
        Ok(())
    })
});

/// # Safety
/// Every pointer argument is null or points to what the MPI standard
/// requires of the argument of the same name in the calling function
/// (see [`put`](crate::ffi::put) and [`array`](crate::ffi::array)).
unsafe fn value_of(i: MPI_Info, key: *const c_char) -> R<Option<String>> {
    // SAFETY: the pointers are as this function's contract requires.
    let k = unsafe { text(key, "key") }?;
    with(|st| Ok(info(st, i)?.iter().find(|e| e.0 == k).map(|e| e.1.clone())))
}

entry!(MPI_Info_get / PMPI_Info_get(i: MPI_Info, key: *const c_char, valuelen: c_int, value: *mut c_char, flag: *mut c_int) comm(MPI_COMM_WORLD) {
    let v = value_of(i, key)?;
    put(flag, v.is_some() as c_int, "flag")?;
    if let Some(v) = v {
        super::env::put_str(value, count_ok(valuelen)? as usize + 1, &v, std::ptr::null_mut())?;
    }
    Ok(())
});

entry!(MPI_Info_get_valuelen / PMPI_Info_get_valuelen(i: MPI_Info, key: *const c_char, valuelen: *mut c_int, flag: *mut c_int) comm(MPI_COMM_WORLD) {
    let v = value_of(i, key)?;
    put(flag, v.is_some() as c_int, "flag")?;
    if let Some(v) = v {
        put(valuelen, v.len() as c_int, "valuelen")?;
    }
    Ok(())
});

entry!(MPI_Info_get_string / PMPI_Info_get_string(i: MPI_Info, key: *const c_char, buflen: *mut c_int, value: *mut c_char, flag: *mut c_int) comm(MPI_COMM_WORLD) {
    let v = value_of(i, key)?;
    put(flag, v.is_some() as c_int, "flag")?;
    if let Some(v) = v {
        let cap = array(buflen as *const c_int, 1, "buflen")?[0];
        if cap > 0 {
            super::env::put_str(value, cap as usize, &v, std::ptr::null_mut())?;
        }
        put(buflen, v.len() as c_int + 1, "buflen")?;
    }
    Ok(())
});

entry!(MPI_Info_get_nkeys / PMPI_Info_get_nkeys(i: MPI_Info, n: *mut c_int) comm(MPI_COMM_WORLD) {
    let k = with(|st| Ok(info(st, i)?.len()))?;
    put(n, k as c_int, "nkeys")
});

entry!(MPI_Info_get_nthkey / PMPI_Info_get_nthkey(i: MPI_Info, n: c_int, key: *mut c_char) comm(MPI_COMM_WORLD) {
    let k = with(|st| {
        let l = info(st, i)?;
        usize::try_from(n).ok().and_then(|n| l.get(n)).map(|e| e.0.clone())
            .ok_or_else(|| MpiErr { class: MPI_ERR_ARG, msg: format!("key {n} of {}", l.len()) })
    })?;
    super::env::put_str(key, MPI_MAX_INFO_KEY as usize, &k, std::ptr::null_mut())
});

entry!(MPI_Alloc_mem / PMPI_Alloc_mem(size: MPI_Aint, _info: MPI_Info, baseptr: *mut c_void) comm(MPI_COMM_WORLD) {
    if size < 0 {
        return err(MPI_ERR_SIZE, format!("size {size} is negative"));
    }
    // Across guests: memory a DMA comes from and lands in (zero copy),
    // while there is room; else the heap.
    let direct = with(|st| {
        let me = st.place.rank;
        Ok(st.eng.direct_mut().and_then(|d| d.alloc(me, size as usize)))
    })?;
    let p = match direct {
        Some(p) => p.cast::<c_void>(),
        // SAFETY: malloc of a positive size (1 for 0, so the pointer is unique).
        None => unsafe { libc::malloc((size as usize).max(1)) },
    };
    if p.is_null() {
        return err(MPI_ERR_NO_MEM, format!("no memory for {size} bytes"));
    }
    put(baseptr as *mut *mut c_void, p, "baseptr")
});

entry!(MPI_Free_mem / PMPI_Free_mem(base: *mut c_void) comm(MPI_COMM_WORLD) {
    let direct = with(|st| Ok(st.eng.direct_mut().is_some_and(|d| d.free(base.cast()))))?;
    if !direct {
        // SAFETY: memory MPI_Alloc_mem returned from the heap (or NULL),
        // freed once.
        unsafe { libc::free(base) };
    }
    Ok(())
});
