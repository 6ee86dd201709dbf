//! Cartesian and graph topologies (`MPI_Cart_*`, `MPI_Graph_*`,
//! `MPI_Dims_create`, `MPI_Topo_test`). Ranks are never reordered.

use std::ffi::c_int;

use super::*;
use crate::entry;

/// A communicator's topology.
#[derive(Debug, Clone)]
pub enum Topo {
    /// Dimensions and periodicity.
    Cart {
        /// Extent of each dimension.
        dims: Vec<c_int>,
        /// Whether each wraps around.
        periods: Vec<bool>,
    },
    /// `index` and `edges` as `MPI_Graph_create` takes them.
    Graph {
        /// Cumulative degrees.
        index: Vec<c_int>,
        /// Neighbours.
        edges: Vec<c_int>,
    },
}

fn topo(c: MPI_Comm) -> R<Topo> {
    with(|st| {
        st.comm(c)?;
        st.topos
            .get(&c)
            .cloned()
            .ok_or_else(|| MpiErr { class: MPI_ERR_TOPOLOGY, msg: "the communicator has no topology".into() })
    })
}

fn cart(c: MPI_Comm) -> R<(Vec<c_int>, Vec<bool>)> {
    match topo(c)? {
        Topo::Cart { dims, periods } => Ok((dims, periods)),
        Topo::Graph { .. } => err(MPI_ERR_TOPOLOGY, "not a Cartesian communicator"),
    }
}

/// Row-major coordinates of `rank`.
fn coords_of(dims: &[c_int], mut rank: c_int) -> Vec<c_int> {
    let mut c = vec![0; dims.len()];
    for i in (0..dims.len()).rev() {
        c[i] = rank % dims[i];
        rank /= dims[i];
    }
    c
}

/// Creates a communicator over the first `n` ranks of `comm` (collective).
fn sub_comm(comm: MPI_Comm, n: u32, t: Option<Topo>) -> R<MPI_Comm> {
    let me = with(|st| Ok(st.comm(comm)?.rank))?;
    let color = if me < n { 0 } else { MPI_UNDEFINED };
    let mut out = MPI_COMM_NULL;
    // SAFETY: a valid place for the new handle.
    let rc = unsafe { super::comm::PMPI_Comm_split(comm, color, me as c_int, &mut out) };
    if rc != MPI_SUCCESS {
        return err(rc, "splitting the communicator failed");
    }
    if out != MPI_COMM_NULL {
        if let Some(t) = t {
            with(|st| {
                st.topos.insert(out, t);
                Ok(())
            })?;
        }
    }
    Ok(out)
}

entry!(MPI_Cart_create / PMPI_Cart_create(comm: MPI_Comm, ndims: c_int, dims: *const c_int, periods: *const c_int, _reorder: c_int, out: *mut MPI_Comm) comm(comm) {
    let nd = count_ok(ndims)? as usize;
    let dims = array(dims, nd, "dims")?;
    let periods: Vec<bool> = array(periods, nd, "periods")?.into_iter().map(|p| p != 0).collect();
    if dims.iter().any(|&d| d <= 0) {
        return err(MPI_ERR_DIMS, format!("dimensions {dims:?} must be positive"));
    }
    let n: i64 = dims.iter().map(|&d| d as i64).product();
    let size = with(|st| Ok(st.comm(comm)?.size()))? as i64;
    if n > size {
        return err(MPI_ERR_DIMS, format!("a grid of {n} does not fit a communicator of {size}"));
    }
    let h = sub_comm(comm, n as u32, Some(Topo::Cart { dims, periods }))?;
    put(out, h, "comm_cart")
});

entry!(MPI_Dims_create / PMPI_Dims_create(nnodes: c_int, ndims: c_int, dims: *mut c_int) comm(MPI_COMM_WORLD) {
    let nd = count_ok(ndims)? as usize;
    let mut d = array(dims as *const c_int, nd, "dims")?;
    if d.iter().any(|&x| x < 0) {
        return err(MPI_ERR_DIMS, "negative dimension");
    }
    let fixed: i64 = d.iter().filter(|&&x| x > 0).map(|&x| x as i64).product();
    if nnodes < 0 || fixed == 0 || nnodes as i64 % fixed != 0 {
        return err(MPI_ERR_DIMS, format!("{nnodes} nodes cannot be split with the fixed dimensions {d:?}"));
    }
    let free: Vec<usize> = (0..nd).filter(|&i| d[i] == 0).collect();
    let mut left = nnodes as i64 / fixed;
    // Prime factors, largest first, each to the currently smallest free dimension.
    let mut factors = Vec::new();
    let mut p = 2;
    while left > 1 {
        while left % p == 0 {
            factors.push(p);
            left /= p;
        }
        p += 1;
    }
    factors.reverse();
    let mut sizes = vec![1i64; free.len()];
    if free.is_empty() && !factors.is_empty() {
        return err(MPI_ERR_DIMS, "no free dimension for the remaining factor");
    }
    for f in factors {
        let i = (0..sizes.len()).min_by_key(|&i| sizes[i]).unwrap_or(0);
        sizes[i] *= f;
    }
    sizes.sort_by(|a, b| b.cmp(a));
    for (k, &i) in free.iter().enumerate() {
        d[i] = sizes[k] as c_int;
    }
    for (i, v) in d.into_iter().enumerate() {
        put(dims.wrapping_add(i), v, "dims")?;
    }
    Ok(())
});

entry!(MPI_Cartdim_get / PMPI_Cartdim_get(comm: MPI_Comm, ndims: *mut c_int) comm(comm) {
    put(ndims, cart(comm)?.0.len() as c_int, "ndims")
});

entry!(MPI_Cart_get / PMPI_Cart_get(comm: MPI_Comm, maxdims: c_int, dims: *mut c_int, periods: *mut c_int, coords: *mut c_int) comm(comm) {
    let (d, p) = cart(comm)?;
    let me = with(|st| Ok(st.comm(comm)?.rank))? as c_int;
    let c = coords_of(&d, me);
    for i in 0..d.len().min(count_ok(maxdims)? as usize) {
        put(dims.wrapping_add(i), d[i], "dims")?;
        put(periods.wrapping_add(i), p[i] as c_int, "periods")?;
        put(coords.wrapping_add(i), c[i], "coords")?;
    }
    Ok(())
});

entry!(MPI_Cart_rank / PMPI_Cart_rank(comm: MPI_Comm, coords: *const c_int, rank: *mut c_int) comm(comm) {
    let (d, p) = cart(comm)?;
    let c = array(coords, d.len(), "coords")?;
    let mut r = 0;
    for i in 0..d.len() {
        let mut x = c[i];
        if p[i] {
            x = x.rem_euclid(d[i]);
        } else if x < 0 || x >= d[i] {
            return err(MPI_ERR_ARG, format!("coordinate {x} is outside dimension {i} of {}", d[i]));
        }
        r = r * d[i] + x;
    }
    put(rank, r, "rank")
});

entry!(MPI_Cart_coords / PMPI_Cart_coords(comm: MPI_Comm, rank: c_int, maxdims: c_int, coords: *mut c_int) comm(comm) {
    let (d, _) = cart(comm)?;
    let n: c_int = d.iter().product();
    if rank < 0 || rank >= n {
        return err(MPI_ERR_RANK, format!("rank {rank} is not in the grid of {n}"));
    }
    let c = coords_of(&d, rank);
    for (i, v) in c.into_iter().enumerate().take(count_ok(maxdims)? as usize) {
        put(coords.wrapping_add(i), v, "coords")?;
    }
    Ok(())
});

entry!(MPI_Cart_shift / PMPI_Cart_shift(comm: MPI_Comm, direction: c_int, disp: c_int, source: *mut c_int, dest: *mut c_int) comm(comm) {
    let (d, p) = cart(comm)?;
    let dir = usize::try_from(direction).ok().filter(|&i| i < d.len())
        .ok_or_else(|| MpiErr { class: MPI_ERR_ARG, msg: format!("direction {direction} of {} dimensions", d.len()) })?;
    let me = with(|st| Ok(st.comm(comm)?.rank))? as c_int;
    let c = coords_of(&d, me);
    let at = |delta: c_int| -> c_int {
        let mut x = c.clone();
        x[dir] += delta;
        if p[dir] {
            x[dir] = x[dir].rem_euclid(d[dir]);
        } else if x[dir] < 0 || x[dir] >= d[dir] {
            return MPI_PROC_NULL;
        }
        x.iter().zip(&d).fold(0, |r, (&xi, &di)| r * di + xi)
    };
    put(source, at(-disp), "rank_source")?;
    put(dest, at(disp), "rank_dest")
});

entry!(MPI_Cart_sub / PMPI_Cart_sub(comm: MPI_Comm, remain: *const c_int, out: *mut MPI_Comm) comm(comm) {
    let (d, p) = cart(comm)?;
    let keep: Vec<bool> = array(remain, d.len(), "remain_dims")?.into_iter().map(|x| x != 0).collect();
    let me = with(|st| Ok(st.comm(comm)?.rank))? as c_int;
    let c = coords_of(&d, me);
    // Color: the coordinates dropped; key: the ones kept.
    let (mut color, mut key) = (0, 0);
    for i in 0..d.len() {
        if keep[i] {
            key = key * d[i] + c[i];
        } else {
            color = color * d[i] + c[i];
        }
    }
    let mut h = MPI_COMM_NULL;
    // SAFETY: a valid place for the new handle.
    let rc = unsafe { super::comm::PMPI_Comm_split(comm, color, key, &mut h) };
    if rc != MPI_SUCCESS {
        return err(rc, "splitting the grid failed");
    }
    let dims: Vec<c_int> = (0..d.len()).filter(|&i| keep[i]).map(|i| d[i]).collect();
    let periods: Vec<bool> = (0..d.len()).filter(|&i| keep[i]).map(|i| p[i]).collect();
    with(|st| {
        st.topos.insert(h, Topo::Cart { dims, periods });
        Ok(())
    })?;
    put(out, h, "newcomm")
});

entry!(MPI_Graph_create / PMPI_Graph_create(comm: MPI_Comm, nnodes: c_int, index: *const c_int, edges: *const c_int, _reorder: c_int, out: *mut MPI_Comm) comm(comm) {
    let n = count_ok(nnodes)? as usize;
    let index = array(index, n, "index")?;
    let ne = index.last().copied().unwrap_or(0);
    let edges = array(edges, count_ok(ne)? as usize, "edges")?;
    if edges.iter().any(|&e| e < 0 || e as usize >= n) {
        return err(MPI_ERR_ARG, "an edge names a node outside the graph");
    }
    let h = sub_comm(comm, n as u32, Some(Topo::Graph { index, edges }))?;
    put(out, h, "comm_graph")
});

fn graph(c: MPI_Comm) -> R<(Vec<c_int>, Vec<c_int>)> {
    match topo(c)? {
        Topo::Graph { index, edges } => Ok((index, edges)),
        Topo::Cart { .. } => err(MPI_ERR_TOPOLOGY, "not a graph communicator"),
    }
}

entry!(MPI_Graphdims_get / PMPI_Graphdims_get(comm: MPI_Comm, nnodes: *mut c_int, nedges: *mut c_int) comm(comm) {
    let (i, e) = graph(comm)?;
    put(nnodes, i.len() as c_int, "nnodes")?;
    put(nedges, e.len() as c_int, "nedges")
});

entry!(MPI_Graph_get / PMPI_Graph_get(comm: MPI_Comm, maxindex: c_int, maxedges: c_int, index: *mut c_int, edges: *mut c_int) comm(comm) {
    let (i, e) = graph(comm)?;
    for (k, v) in i.into_iter().enumerate().take(count_ok(maxindex)? as usize) {
        put(index.wrapping_add(k), v, "index")?;
    }
    for (k, v) in e.into_iter().enumerate().take(count_ok(maxedges)? as usize) {
        put(edges.wrapping_add(k), v, "edges")?;
    }
    Ok(())
});

fn neighbours(comm: MPI_Comm, rank: c_int) -> R<Vec<c_int>> {
    let (i, e) = graph(comm)?;
    let r = usize::try_from(rank)
        .ok()
        .filter(|&r| r < i.len())
        .ok_or_else(|| MpiErr { class: MPI_ERR_RANK, msg: format!("rank {rank} is not a node") })?;
    let start = if r == 0 { 0 } else { i[r - 1] as usize };
    Ok(e[start..i[r] as usize].to_vec())
}

entry!(MPI_Graph_neighbors_count / PMPI_Graph_neighbors_count(comm: MPI_Comm, rank: c_int, n: *mut c_int) comm(comm) {
    put(n, neighbours(comm, rank)?.len() as c_int, "nneighbors")
});

entry!(MPI_Graph_neighbors / PMPI_Graph_neighbors(comm: MPI_Comm, rank: c_int, max: c_int, out: *mut c_int) comm(comm) {
    for (k, v) in neighbours(comm, rank)?.into_iter().enumerate().take(count_ok(max)? as usize) {
        put(out.wrapping_add(k), v, "neighbors")?;
    }
    Ok(())
});

entry!(MPI_Topo_test / PMPI_Topo_test(comm: MPI_Comm, status: *mut c_int) comm(comm) {
    let t = with(|st| {
        st.comm(comm)?;
        Ok(st.topos.get(&comm).cloned())
    })?;
    let v = match t {
        None => MPI_UNDEFINED,
        Some(Topo::Cart { .. }) => MPI_CART,
        Some(Topo::Graph { .. }) => MPI_GRAPH,
    };
    put(status, v, "status")
});
