//! Datatype and operation handles: the type constructors, queries, pack
//! and unpack, user operations, and [`apply`], which every reduction uses.

use std::ffi::{c_char, c_int, c_void};
use std::sync::Arc;

use super::*;
use crate::datatype::{Datatype, DatatypeError};
use crate::entry;
use crate::op::{self, Builtin};

/// A user operation (`MPI_Op_create`).
#[derive(Debug, Clone, Copy)]
pub struct UserOp {
    /// The function.
    pub f: MPI_User_function,
    /// Whether it commutes.
    pub commute: bool,
}

pub(crate) fn builtin(h: MPI_Op) -> Option<Builtin> {
    let name = OPS.iter().find(|e| e.1 == h)?.0;
    Builtin::ALL.iter().copied().find(|b| b.name() == name)
}

/// `inout = input op inout` over `count` packed items of type `t`.
pub fn apply(st: &State, op: MPI_Op, t: MPI_Datatype, count: c_int, input: &[u8], inout: &mut [u8]) -> R<()> {
    Reducer::new(st, op, t)?.apply(count, input, inout)
}

/// An operation on a datatype, looked up once: what a reduction in flight
/// keeps, so that it needs no handle lookups later.
#[derive(Clone)]
pub struct Reducer {
    how: How,
    dt: Arc<Datatype>,
    t: MPI_Datatype,
}

#[derive(Clone)]
enum How {
    Builtin(Builtin, op::Kind),
    User(UserOp),
}

impl Reducer {
    /// Operation `op` on type `t` (an `MPI_ERR_OP` if it is not defined there).
    pub fn new(st: &State, op: MPI_Op, t: MPI_Datatype) -> R<Reducer> {
        let dt = st.dtype(t)?;
        let how = if let Some(b) = builtin(op) {
            let kind = op::kind_for(b, &dt).map_err(|e| MpiErr { class: MPI_ERR_OP, msg: e.to_string() })?;
            How::Builtin(b, kind)
        } else {
            match st.ops.get(&op) {
                Some(u) => How::User(*u),
                None => return err(MPI_ERR_OP, format!("{op:#x} is not an operation")),
            }
        };
        Ok(Reducer { how, dt, t })
    }

    /// Whether the operation commutes.
    pub fn commutes(&self) -> bool {
        match &self.how {
            How::Builtin(b, _) => b.is_commutative(),
            How::User(u) => u.commute,
        }
    }

    /// `inout = input op inout` over `count` packed items.
    pub fn apply(&self, count: c_int, input: &[u8], inout: &mut [u8]) -> R<()> {
        let u = match &self.how {
            How::Builtin(b, kind) => {
                return op::reduce(*b, *kind, input, inout)
                    .map_err(|e| MpiErr { class: MPI_ERR_OP, msg: e.to_string() })
            }
            How::User(u) => *u,
        };
        let dt = &self.dt;
        // The user function sees the type's own layout: unpack both sides
        // into scratch buffers of that layout, call, pack the result back.
        let n = count_ok(count)?;
        let span = (dt.extent().max(0) as u64 * n) as usize + dt.true_extent().max(0) as usize;
        let base = (-dt.lb().min(dt.true_lb())).max(0) as usize;
        let mut a = vec![0u8; span + base + 16];
        let mut b = vec![0u8; span + base + 16];
        // SAFETY: both scratch buffers are large enough for `n` items of the
        // type placed at `base` (extent times count plus the true extent).
        unsafe {
            dt.unpack(n, a.as_mut_ptr().add(base), input);
            dt.unpack(n, b.as_mut_ptr().add(base), inout);
        }
        let mut len = count;
        let mut th = self.t;
        // SAFETY: a function the user registered with MPI_Op_create, called
        // as the standard says, on buffers of `count` items of type `t`.
        unsafe {
            (u.f)(a.as_mut_ptr().add(base) as *mut c_void, b.as_mut_ptr().add(base) as *mut c_void, &mut len, &mut th)
        };
        // SAFETY: as above, `b` holds `n` items at `base`.
        unsafe { dt.pack(n, b.as_ptr().add(base), inout) };
        Ok(())
    }
}

entry!(MPI_Op_create / PMPI_Op_create(f: Option<MPI_User_function>, commute: c_int, op: *mut MPI_Op) comm(MPI_COMM_WORLD) {
    let Some(f) = f else { return err(MPI_ERR_ARG, "the operation's function is NULL") };
    let h = with(|st| {
        let h = st.handle();
        st.ops.insert(h, UserOp { f, commute: commute != 0 });
        Ok(h)
    })?;
    put(op, h, "op")
});

entry!(MPI_Op_free / PMPI_Op_free(op: *mut MPI_Op) comm(MPI_COMM_WORLD) {
    let h = array(op as *const MPI_Op, 1, "op")?[0];
    with(|st| match st.ops.remove(&h) {
        Some(_) => Ok(()),
        None => err(MPI_ERR_OP, format!("{h:#x} is not a user operation")),
    })?;
    put(op, MPI_OP_NULL, "op")
});

entry!(MPI_Op_commutative / PMPI_Op_commutative(op: MPI_Op, commute: *mut c_int) comm(MPI_COMM_WORLD) {
    let c = match builtin(op) {
        Some(b) => b.is_commutative(),
        None => with(|st| st.ops.get(&op).map(|u| u.commute).ok_or_else(|| MpiErr { class: MPI_ERR_OP, msg: format!("{op:#x} is not an operation") }))?,
    };
    put(commute, c as c_int, "commute")
});

fn type_err(e: DatatypeError) -> MpiErr {
    MpiErr { class: MPI_ERR_TYPE, msg: e.to_string() }
}

/// Registers a new datatype and stores its handle.
///
/// # Safety
/// Every pointer argument is null or points to what the MPI standard
/// requires of the argument of the same name in the calling function
/// (see [`put`](crate::ffi::put) and [`array`](crate::ffi::array)).
unsafe fn add(out: *mut MPI_Datatype, t: Result<Datatype, DatatypeError>) -> R<()> {
    nonnull(out, "newtype")?;
    let t = t.map_err(type_err)?;
    let h = with(|st| {
        let h = st.handle();
        st.types.insert(h, Arc::new(t));
        Ok(h)
    })?;
    // SAFETY: the pointers are as this function's contract requires.
    unsafe { put(out, h, "newtype") }
}

fn old(t: MPI_Datatype) -> R<Arc<Datatype>> {
    with(|st| st.dtype(t))
}

/// # Safety
/// Every pointer argument is null or points to what the MPI standard
/// requires of the argument of the same name in the calling function
/// (see [`put`](crate::ffi::put) and [`array`](crate::ffi::array)).
unsafe fn i64s(p: *const c_int, n: c_int, what: &str) -> R<Vec<i64>> {
    // SAFETY: the pointers are as this function's contract requires.
    Ok(unsafe { array(p, count_ok(n)? as usize, what) }?.into_iter().map(i64::from).collect())
}

/// # Safety
/// Every pointer argument is null or points to what the MPI standard
/// requires of the argument of the same name in the calling function
/// (see [`put`](crate::ffi::put) and [`array`](crate::ffi::array)).
unsafe fn aints(p: *const MPI_Aint, n: c_int, what: &str) -> R<Vec<i64>> {
    // SAFETY: the pointers are as this function's contract requires.
    Ok(unsafe { array(p, count_ok(n)? as usize, what) }?.into_iter().map(|x| x as i64).collect())
}

entry!(MPI_Type_contiguous / PMPI_Type_contiguous(count: c_int, t: MPI_Datatype, newtype: *mut MPI_Datatype) comm(MPI_COMM_WORLD) {
    add(newtype, Datatype::contiguous(count as i64, &old(t)?))
});

entry!(MPI_Type_vector / PMPI_Type_vector(count: c_int, bl: c_int, stride: c_int, t: MPI_Datatype, newtype: *mut MPI_Datatype) comm(MPI_COMM_WORLD) {
    add(newtype, Datatype::vector(count as i64, bl as i64, stride as i64, &old(t)?))
});

entry!(MPI_Type_create_hvector / PMPI_Type_create_hvector(count: c_int, bl: c_int, stride: MPI_Aint, t: MPI_Datatype, newtype: *mut MPI_Datatype) comm(MPI_COMM_WORLD) {
    add(newtype, Datatype::hvector(count as i64, bl as i64, stride as i64, &old(t)?))
});

entry!(MPI_Type_indexed / PMPI_Type_indexed(count: c_int, bls: *const c_int, displs: *const c_int, t: MPI_Datatype, newtype: *mut MPI_Datatype) comm(MPI_COMM_WORLD) {
    add(newtype, Datatype::indexed(&i64s(bls, count, "blocklengths")?, &i64s(displs, count, "displacements")?, &old(t)?))
});

entry!(MPI_Type_create_hindexed / PMPI_Type_create_hindexed(count: c_int, bls: *const c_int, displs: *const MPI_Aint, t: MPI_Datatype, newtype: *mut MPI_Datatype) comm(MPI_COMM_WORLD) {
    add(newtype, Datatype::hindexed(&i64s(bls, count, "blocklengths")?, &aints(displs, count, "displacements")?, &old(t)?))
});

entry!(MPI_Type_create_indexed_block / PMPI_Type_create_indexed_block(count: c_int, bl: c_int, displs: *const c_int, t: MPI_Datatype, newtype: *mut MPI_Datatype) comm(MPI_COMM_WORLD) {
    add(newtype, Datatype::indexed_block(bl as i64, &i64s(displs, count, "displacements")?, &old(t)?))
});

entry!(MPI_Type_create_hindexed_block / PMPI_Type_create_hindexed_block(count: c_int, bl: c_int, displs: *const MPI_Aint, t: MPI_Datatype, newtype: *mut MPI_Datatype) comm(MPI_COMM_WORLD) {
    add(newtype, Datatype::hindexed_block(bl as i64, &aints(displs, count, "displacements")?, &old(t)?))
});

entry!(MPI_Type_create_struct / PMPI_Type_create_struct(count: c_int, bls: *const c_int, displs: *const MPI_Aint, ts: *const MPI_Datatype, newtype: *mut MPI_Datatype) comm(MPI_COMM_WORLD) {
    let hs = array(ts, count_ok(count)? as usize, "types")?;
    let types = hs.into_iter().map(old).collect::<R<Vec<_>>>()?;
    add(newtype, Datatype::structure(&i64s(bls, count, "blocklengths")?, &aints(displs, count, "displacements")?, &types))
});

entry!(MPI_Type_create_resized / PMPI_Type_create_resized(t: MPI_Datatype, lb: MPI_Aint, extent: MPI_Aint, newtype: *mut MPI_Datatype) comm(MPI_COMM_WORLD) {
    add(newtype, Datatype::resized(&old(t)?, lb as i64, extent as i64))
});

entry!(MPI_Type_dup / PMPI_Type_dup(t: MPI_Datatype, newtype: *mut MPI_Datatype) comm(MPI_COMM_WORLD) {
    add(newtype, Ok(Datatype::dup(&old(t)?)))?;
    let h = array(newtype as *const MPI_Datatype, 1, "newtype")?[0];
    super::attr::copy_all(t, h)
});

entry!(MPI_Type_commit / PMPI_Type_commit(t: *mut MPI_Datatype) comm(MPI_COMM_WORLD) {
    let h = array(t as *const MPI_Datatype, 1, "datatype")?[0];
    old(h)?.commit();
    Ok(())
});

entry!(MPI_Type_free / PMPI_Type_free(t: *mut MPI_Datatype) comm(MPI_COMM_WORLD) {
    let h = array(t as *const MPI_Datatype, 1, "datatype")?[0];
    if is_predefined_datatype(h) {
        return err(MPI_ERR_TYPE, "a predefined datatype cannot be freed");
    }
    super::attr::drop_all(h)?;
    with(|st| match st.types.remove(&h) {
        Some(_) => Ok(()),
        None => err(MPI_ERR_TYPE, format!("{h:#x} is not a datatype")),
    })?;
    put(t, MPI_DATATYPE_NULL, "datatype")
});

entry!(MPI_Type_size / PMPI_Type_size(t: MPI_Datatype, size: *mut c_int) comm(MPI_COMM_WORLD) {
    let s = old(t)?.size();
    put(size, i32::try_from(s).unwrap_or(MPI_UNDEFINED), "size")
});

entry!(MPI_Type_size_x / PMPI_Type_size_x(t: MPI_Datatype, size: *mut MPI_Count) comm(MPI_COMM_WORLD) {
    put(size, old(t)?.size() as MPI_Count, "size")
});

entry!(MPI_Type_get_extent / PMPI_Type_get_extent(t: MPI_Datatype, lb: *mut MPI_Aint, extent: *mut MPI_Aint) comm(MPI_COMM_WORLD) {
    let d = old(t)?;
    put(lb, d.lb() as MPI_Aint, "lb")?;
    put(extent, d.extent() as MPI_Aint, "extent")
});

entry!(MPI_Type_get_true_extent / PMPI_Type_get_true_extent(t: MPI_Datatype, lb: *mut MPI_Aint, extent: *mut MPI_Aint) comm(MPI_COMM_WORLD) {
    let d = old(t)?;
    put(lb, d.true_lb() as MPI_Aint, "true_lb")?;
    put(extent, d.true_extent() as MPI_Aint, "true_extent")
});

entry!(MPI_Type_get_name / PMPI_Type_get_name(t: MPI_Datatype, name: *mut c_char, len: *mut c_int) comm(MPI_COMM_WORLD) {
    super::env::put_str(name, MPI_MAX_OBJECT_NAME as usize, &old(t)?.name(), len)
});

entry!(MPI_Type_set_name / PMPI_Type_set_name(t: MPI_Datatype, name: *const c_char) comm(MPI_COMM_WORLD) {
    nonnull(name, "name")?;
    // SAFETY: the caller passes a NUL-terminated string.
    let s = unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy().into_owned();
    old(t)?.set_name(&s);
    Ok(())
});

entry!(MPI_Get_address / PMPI_Get_address(location: *const c_void, address: *mut MPI_Aint) comm(MPI_COMM_WORLD) {
    put(address, location as MPI_Aint, "address")
});

entry!(MPI_Pack_size / PMPI_Pack_size(count: c_int, t: MPI_Datatype, _comm: MPI_Comm, size: *mut c_int) comm(MPI_COMM_WORLD) {
    let n = old(t)?.pack_size(count_ok(count)?).ok_or_else(|| MpiErr { class: MPI_ERR_COUNT, msg: "too large".into() })?;
    put(size, i32::try_from(n).unwrap_or(i32::MAX), "size")
});

entry!(MPI_Pack / PMPI_Pack(inbuf: *const c_void, count: c_int, t: MPI_Datatype, outbuf: *mut c_void, outsize: c_int, position: *mut c_int, _comm: MPI_Comm) comm(MPI_COMM_WORLD) {
    let d = old(t)?;
    let n = count_ok(count)?;
    let pos = array(position as *const c_int, 1, "position")?[0];
    let need = (d.size() * n) as usize;
    let (pos, cap) = (count_ok(pos)? as usize, count_ok(outsize)? as usize);
    if pos + need > cap {
        return err(MPI_ERR_TRUNCATE, format!("packing {need} bytes at {pos} overflows the {cap}-byte buffer"));
    }
    if need > 0 {
        nonnull(outbuf, "outbuf")?;
        // SAFETY: `outbuf` holds `outsize` bytes (checked above to fit) and
        // `inbuf` holds `count` items of the type.
        unsafe {
            let out = std::slice::from_raw_parts_mut((outbuf as *mut u8).add(pos), need);
            d.pack(n, inbuf as *const u8, out);
        }
    }
    put(position, (pos + need) as c_int, "position")
});

entry!(MPI_Unpack / PMPI_Unpack(inbuf: *const c_void, insize: c_int, position: *mut c_int, outbuf: *mut c_void, count: c_int, t: MPI_Datatype, _comm: MPI_Comm) comm(MPI_COMM_WORLD) {
    let d = old(t)?;
    let n = count_ok(count)?;
    let pos = array(position as *const c_int, 1, "position")?[0];
    let need = (d.size() * n) as usize;
    let (pos, cap) = (count_ok(pos)? as usize, count_ok(insize)? as usize);
    if pos + need > cap {
        return err(MPI_ERR_TRUNCATE, format!("unpacking {need} bytes at {pos} reads past the {cap}-byte buffer"));
    }
    if need > 0 {
        nonnull(inbuf, "inbuf")?;
        // SAFETY: `inbuf` holds `insize` bytes (checked above) and
        // `outbuf` holds `count` items of the type.
        unsafe {
            let input = std::slice::from_raw_parts((inbuf as *const u8).add(pos), need);
            d.unpack(n, outbuf as *mut u8, input);
        }
    }
    put(position, (pos + need) as c_int, "position")
});

entry!(MPI_Type_create_subarray / PMPI_Type_create_subarray(ndims: c_int, sizes: *const c_int, subsizes: *const c_int, starts: *const c_int, order: c_int, t: MPI_Datatype, newtype: *mut MPI_Datatype) comm(MPI_COMM_WORLD) {
    let order = match order {
        o if o == MPI_ORDER_C => crate::datatype::Order::C,
        o if o == MPI_ORDER_FORTRAN => crate::datatype::Order::Fortran,
        o => return err(MPI_ERR_ARG, format!("order {o} is neither MPI_ORDER_C nor MPI_ORDER_FORTRAN")),
    };
    let (a, b, c) = (i64s(sizes, ndims, "sizes")?, i64s(subsizes, ndims, "subsizes")?, i64s(starts, ndims, "starts")?);
    add(newtype, Datatype::subarray(&a, &b, &c, order, &old(t)?))
});

/// The envelope of type `t` with the ABI's codes.
fn envelope_of(t: MPI_Datatype) -> R<crate::datatype::Envelope> {
    let codes = crate::datatype::Codes {
        order_c: MPI_ORDER_C as i64,
        order_fortran: MPI_ORDER_FORTRAN as i64,
        distribute_block: MPI_DISTRIBUTE_BLOCK as i64,
        distribute_cyclic: MPI_DISTRIBUTE_CYCLIC as i64,
        distribute_none: MPI_DISTRIBUTE_NONE as i64,
        distribute_dflt_darg: MPI_DISTRIBUTE_DFLT_DARG as i64,
    };
    Ok(old(t)?.envelope(&codes))
}

fn combiner_code(c: crate::datatype::Combiner) -> c_int {
    use crate::datatype::Combiner::*;
    match c {
        Named => MPI_COMBINER_NAMED,
        Dup => MPI_COMBINER_DUP,
        Contiguous => MPI_COMBINER_CONTIGUOUS,
        Vector => MPI_COMBINER_VECTOR,
        Hvector => MPI_COMBINER_HVECTOR,
        Indexed => MPI_COMBINER_INDEXED,
        Hindexed => MPI_COMBINER_HINDEXED,
        IndexedBlock => MPI_COMBINER_INDEXED_BLOCK,
        HindexedBlock => MPI_COMBINER_HINDEXED_BLOCK,
        Struct => MPI_COMBINER_STRUCT,
        Subarray => MPI_COMBINER_SUBARRAY,
        Darray => MPI_COMBINER_DARRAY,
        Resized => MPI_COMBINER_RESIZED,
    }
}

entry!(MPI_Type_get_envelope / PMPI_Type_get_envelope(t: MPI_Datatype, ni: *mut c_int, na: *mut c_int, nd: *mut c_int, combiner: *mut c_int) comm(MPI_COMM_WORLD) {
    let e = envelope_of(t)?;
    put(ni, e.integers.len() as c_int, "num_integers")?;
    put(na, e.addresses.len() as c_int, "num_addresses")?;
    put(nd, e.datatypes.len() as c_int, "num_datatypes")?;
    put(combiner, combiner_code(e.combiner), "combiner")
});

entry!(MPI_Type_get_contents / PMPI_Type_get_contents(t: MPI_Datatype, max_i: c_int, max_a: c_int, max_d: c_int, ints: *mut c_int, addrs: *mut MPI_Aint, types: *mut MPI_Datatype) comm(MPI_COMM_WORLD) {
    let e = envelope_of(t)?;
    if e.combiner == crate::datatype::Combiner::Named {
        return err(MPI_ERR_TYPE, "MPI_Type_get_contents of a predefined datatype");
    }
    let fits = |n: usize, max: c_int| usize::try_from(max).is_ok_and(|m| n <= m);
    if !fits(e.integers.len(), max_i) || !fits(e.addresses.len(), max_a) || !fits(e.datatypes.len(), max_d) {
        return err(MPI_ERR_ARG, "the arrays are shorter than MPI_Type_get_envelope said they must be");
    }
    for (i, &v) in e.integers.iter().enumerate() {
        put(ints.wrapping_add(i), v as c_int, "array_of_integers")?;
    }
    for (i, &v) in e.addresses.iter().enumerate() {
        put(addrs.wrapping_add(i), v as MPI_Aint, "array_of_addresses")?;
    }
    // Predefined types come back as themselves; derived ones as new
    // handles to the same type, which the caller frees.
    let hs = with(|st| {
        Ok(e.datatypes
            .iter()
            .map(|d| {
                let named = st.types.iter().find(|(&h, x)| h < FIRST_RUNTIME_HANDLE && Arc::ptr_eq(x, d)).map(|(&h, _)| h);
                named.unwrap_or_else(|| {
                    let h = st.handle();
                    st.types.insert(h, d.clone());
                    h
                })
            })
            .collect::<Vec<_>>())
    })?;
    for (i, h) in hs.into_iter().enumerate() {
        put(types.wrapping_add(i), h, "array_of_datatypes")?;
    }
    Ok(())
});
