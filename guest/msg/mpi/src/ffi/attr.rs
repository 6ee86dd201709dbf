//! Attribute caching (keyvals with copy and delete callbacks) on
//! communicators, datatypes and windows, and the predefined attributes of
//! `MPI_COMM_WORLD` (`MPI_TAG_UB`, `MPI_HOST`, `MPI_IO`,
//! `MPI_WTIME_IS_GLOBAL`, `MPI_UNIVERSE_SIZE`, `MPI_APPNUM`,
//! `MPI_LASTUSEDCODE`).
//!
//! Callbacks may call MPI, so they run with the state unlocked: each call
//! first collects what to run under the lock, then runs it.

use rustc_hash::FxHashMap as HashMap;
use std::ffi::{c_int, c_void};

use super::*;
use crate::entry;

/// A copy callback, as the three object kinds' signatures share it.
type CopyFn = unsafe extern "C" fn(usize, c_int, *mut c_void, *mut c_void, *mut c_void, *mut c_int) -> c_int;
/// A delete callback.
type DeleteFn = unsafe extern "C" fn(usize, c_int, *mut c_void, *mut c_void) -> c_int;

/// One keyval: its callbacks (0: none, 1: copy the value as is) and the
/// user's extra state.
#[derive(Debug, Clone, Copy)]
pub struct Keyval {
    copy: usize,
    delete: usize,
    extra: usize,
    /// Freed by the user while attributes still used it: it lives on
    /// for their deletes and copies, and goes with the last of them.
    freed: bool,
}

/// Keyvals and the attributes set on objects.
#[derive(Debug, Default)]
pub struct Attrs {
    keyvals: HashMap<c_int, Keyval>,
    next: c_int,
    /// Per object handle: keyval -> value.
    values: HashMap<usize, Vec<(c_int, usize)>>,
}

/// The predefined attributes' values, pointed to by `MPI_Comm_get_attr`.
struct Predefined {
    tag_ub: c_int,
    host: c_int,
    io: c_int,
    wtime_global: c_int,
    universe: c_int,
    appnum: c_int,
    lastused: c_int,
}

static PREDEFINED: std::sync::OnceLock<Predefined> = std::sync::OnceLock::new();

fn predefined(key: c_int, size: u32) -> Option<usize> {
    let p = PREDEFINED.get_or_init(|| Predefined {
        tag_ub: super::p2p::TAG_UB,
        host: MPI_PROC_NULL,
        io: MPI_ANY_SOURCE,
        wtime_global: 0,
        universe: size as c_int,
        appnum: 0,
        lastused: MPI_ERR_LASTCODE,
    });
    let r: &c_int = match key {
        k if k == MPI_TAG_UB => &p.tag_ub,
        k if k == MPI_HOST => &p.host,
        k if k == MPI_IO => &p.io,
        k if k == MPI_WTIME_IS_GLOBAL => &p.wtime_global,
        k if k == MPI_UNIVERSE_SIZE => &p.universe,
        k if k == MPI_APPNUM => &p.appnum,
        k if k == MPI_LASTUSEDCODE => &p.lastused,
        _ => return None,
    };
    Some(r as *const c_int as usize)
}

/// # Safety
/// Every pointer argument is null or points to what the MPI standard
/// requires of the argument of the same name in the calling function
/// (see [`put`](crate::ffi::put) and [`array`](crate::ffi::array)).
unsafe fn create_keyval(copy: usize, delete: usize, extra: usize, out: *mut c_int) -> R<()> {
    let k = with(|st| {
        st.attrs.next += 1;
        // Keyvals of our own start past the predefined attribute keys.
        let k = 1000 + st.attrs.next;
        st.attrs.keyvals.insert(k, Keyval { copy, delete, extra, freed: false });
        Ok(k)
    })?;
    // SAFETY: the pointers are as this function's contract requires.
    unsafe { put(out, k, "keyval") }
}

/// # Safety
/// Every pointer argument is null or points to what the MPI standard
/// requires of the argument of the same name in the calling function
/// (see [`put`](crate::ffi::put) and [`array`](crate::ffi::array)).
unsafe fn free_keyval(k: *mut c_int) -> R<()> {
    // SAFETY: the pointers are as this function's contract requires.
    let key = unsafe { array(k as *const c_int, 1, "keyval") }?[0];
    with(|st| {
        match st.attrs.keyvals.get_mut(&key) {
            Some(kv) if !kv.freed => kv.freed = true,
            _ => return err(MPI_ERR_KEYVAL, format!("keyval {key} is not known")),
        }
        forget_if_unused(st, key);
        Ok(())
    })?;
    // SAFETY: the pointers are as this function's contract requires.
    unsafe { put(k, MPI_KEYVAL_INVALID, "keyval") }
}

/// Drops freed keyval `key` once no attribute uses it.
fn forget_if_unused(st: &mut State, key: c_int) {
    let freed = st.attrs.keyvals.get(&key).is_some_and(|kv| kv.freed);
    if freed && !st.attrs.values.values().any(|l| l.iter().any(|e| e.0 == key)) {
        st.attrs.keyvals.remove(&key);
    }
}

/// Runs keyval `key`'s delete callback on `value` of object `obj`.
fn run_delete(obj: usize, key: c_int, kv: Keyval, value: usize) -> R<()> {
    if kv.delete > 1 {
        // SAFETY: a callback the user registered for this keyval, as a
        // function of the standard's delete-callback type.
        let f: DeleteFn = unsafe { std::mem::transmute::<usize, DeleteFn>(kv.delete) };
        // SAFETY: called as the standard says.
        let rc = unsafe { f(obj, key, value as *mut c_void, kv.extra as *mut c_void) };
        if rc != MPI_SUCCESS {
            return err(rc, format!("the delete callback of keyval {key} failed with {rc}"));
        }
    }
    Ok(())
}

/// Takes keyval `key`'s attribute off `obj`: the keyval and the old value.
fn take_attr(obj: usize, key: c_int) -> R<(Keyval, Option<usize>)> {
    with(|st| {
        let kv = *st
            .attrs
            .keyvals
            .get(&key)
            .ok_or_else(|| MpiErr { class: MPI_ERR_KEYVAL, msg: format!("keyval {key} is not known") })?;
        let list = st.attrs.values.entry(obj).or_default();
        let old = list.iter().position(|e| e.0 == key).map(|i| list.remove(i).1);
        Ok((kv, old))
    })
}

fn set_attr(obj: usize, key: c_int, value: usize) -> R<()> {
    if with(|st| Ok(st.attrs.keyvals.get(&key).is_some_and(|kv| kv.freed)))? {
        return err(MPI_ERR_KEYVAL, format!("keyval {key} has been freed"));
    }
    let (kv, old) = take_attr(obj, key)?;
    if let Some(v) = old {
        run_delete(obj, key, kv, v)?;
    }
    with(|st| {
        st.attrs.values.entry(obj).or_default().push((key, value));
        Ok(())
    })
}

/// # Safety
/// Every pointer argument is null or points to what the MPI standard
/// requires of the argument of the same name in the calling function
/// (see [`put`](crate::ffi::put) and [`array`](crate::ffi::array)).
unsafe fn get_attr(obj: usize, key: c_int, value: *mut c_void, flag: *mut c_int) -> R<()> {
    let found = with(|st| {
        if let Some(p) = super::win::predefined(st, obj, key) {
            return Ok(Some(p));
        }
        if obj == MPI_COMM_WORLD || obj == MPI_COMM_SELF || st.comms.contains_key(&obj) {
            if let Some(p) = predefined(key, st.place.size) {
                return Ok(Some(p));
            }
        }
        if !st.attrs.keyvals.contains_key(&key) {
            return err(MPI_ERR_KEYVAL, format!("keyval {key} is not known"));
        }
        Ok(st.attrs.values.get(&obj).and_then(|l| l.iter().find(|e| e.0 == key)).map(|e| e.1))
    })?;
    // SAFETY: the pointers are as this function's contract requires.
    unsafe { put(flag, found.is_some() as c_int, "flag") }?;
    if let Some(v) = found {
        // SAFETY: the pointers are as this function's contract requires.
        unsafe { put(value as *mut usize, v, "attribute_val") }?;
    }
    Ok(())
}

fn delete_attr(obj: usize, key: c_int) -> R<()> {
    let (kv, old) = take_attr(obj, key)?;
    with(|st| {
        forget_if_unused(st, key);
        Ok(())
    })?;
    match old {
        Some(v) => run_delete(obj, key, kv, v),
        None => err(MPI_ERR_KEYVAL, format!("no attribute for keyval {key}")),
    }
}

/// Deletes every attribute of `obj` (it is being freed), callbacks run.
pub fn drop_all(obj: usize) -> R<()> {
    let (list, kvs) = with(|st| {
        let list = st.attrs.values.remove(&obj).unwrap_or_default();
        Ok((list, st.attrs.keyvals.clone()))
    })?;
    for (key, v) in list {
        if let Some(kv) = kvs.get(&key) {
            run_delete(obj, key, *kv, v)?;
        }
        with(|st| {
            forget_if_unused(st, key);
            Ok(())
        })?;
    }
    Ok(())
}

/// Copies `old`'s attributes to `new` through their copy callbacks (dup).
pub fn copy_all(old: usize, new: usize) -> R<()> {
    let (list, kvs) =
        with(|st| Ok((st.attrs.values.get(&old).cloned().unwrap_or_default(), st.attrs.keyvals.clone())))?;
    let mut copied = Vec::new();
    for (key, v) in list {
        let Some(kv) = kvs.get(&key) else { continue };
        match kv.copy {
            0 => {}
            1 => copied.push((key, v)),
            f => {
                // SAFETY: a callback the user registered for this keyval,
                // as a function of the standard's copy-callback type.
                let f: CopyFn = unsafe { std::mem::transmute::<usize, CopyFn>(f) };
                let mut out: usize = 0;
                let mut flag: c_int = 0;
                // SAFETY: called as the standard says, with places for
                // the new value and the flag.
                let rc = unsafe {
                    f(
                        old,
                        key,
                        kv.extra as *mut c_void,
                        v as *mut c_void,
                        &mut out as *mut usize as *mut c_void,
                        &mut flag,
                    )
                };
                if rc != MPI_SUCCESS {
                    return err(rc, format!("the copy callback of keyval {key} failed with {rc}"));
                }
                if flag != 0 {
                    copied.push((key, out));
                }
            }
        }
    }
    with(|st| {
        st.attrs.values.insert(new, copied);
        Ok(())
    })
}

macro_rules! attr_family {
    ($obj:ty, $create:ident / $pcreate:ident, $free:ident / $pfree:ident, $set:ident / $pset:ident, $get:ident / $pget:ident, $del:ident / $pdel:ident) => {
        entry!($create / $pcreate(copy: usize, delete: usize, keyval: *mut c_int, extra: *mut c_void) comm(MPI_COMM_WORLD) {
            create_keyval(copy, delete, extra as usize, keyval)
        });
        entry!($free / $pfree(keyval: *mut c_int) comm(MPI_COMM_WORLD) {
            free_keyval(keyval)
        });
        entry!($set / $pset(obj: $obj, keyval: c_int, value: *mut c_void) comm(MPI_COMM_WORLD) {
            set_attr(obj, keyval, value as usize)
        });
        entry!($get / $pget(obj: $obj, keyval: c_int, value: *mut c_void, flag: *mut c_int) comm(MPI_COMM_WORLD) {
            get_attr(obj, keyval, value, flag)
        });
        entry!($del / $pdel(obj: $obj, keyval: c_int) comm(MPI_COMM_WORLD) {
            delete_attr(obj, keyval)
        });
    };
}

// The MPI-1 names of the communicator family (deprecated, still in the ABI).
attr_family!(
    MPI_Comm,
    MPI_Keyval_create / PMPI_Keyval_create,
    MPI_Keyval_free / PMPI_Keyval_free,
    MPI_Attr_put / PMPI_Attr_put,
    MPI_Attr_get / PMPI_Attr_get,
    MPI_Attr_delete / PMPI_Attr_delete
);
attr_family!(
    MPI_Comm,
    MPI_Comm_create_keyval / PMPI_Comm_create_keyval,
    MPI_Comm_free_keyval / PMPI_Comm_free_keyval,
    MPI_Comm_set_attr / PMPI_Comm_set_attr,
    MPI_Comm_get_attr / PMPI_Comm_get_attr,
    MPI_Comm_delete_attr / PMPI_Comm_delete_attr
);
attr_family!(
    MPI_Datatype,
    MPI_Type_create_keyval / PMPI_Type_create_keyval,
    MPI_Type_free_keyval / PMPI_Type_free_keyval,
    MPI_Type_set_attr / PMPI_Type_set_attr,
    MPI_Type_get_attr / PMPI_Type_get_attr,
    MPI_Type_delete_attr / PMPI_Type_delete_attr
);
attr_family!(
    MPI_Win,
    MPI_Win_create_keyval / PMPI_Win_create_keyval,
    MPI_Win_free_keyval / PMPI_Win_free_keyval,
    MPI_Win_set_attr / PMPI_Win_set_attr,
    MPI_Win_get_attr / PMPI_Win_get_attr,
    MPI_Win_delete_attr / PMPI_Win_delete_attr
);
