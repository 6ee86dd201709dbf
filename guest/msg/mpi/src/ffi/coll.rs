//! The collectives, blocking (`MPI_Bcast`) and non-blocking (`MPI_Ibcast`)
//! alike: each is one algorithm, an `async` function over a
//! [`sched::Io`], built by one function here and either run to its end or
//! left in flight as a request ([`super::sched`]). They travel on each
//! communicator's collective context (`ctx + 1`), one tag per call.
//!
//! On `MPI_COMM_WORLD`, `Barrier` and the `Bcast`, `Allreduce`,
//! `Allgather(v)` of at most [`crate::board::DATA_MAX`] bytes per rank
//! run on the job's billboard ([`crate::board`], [`Turn`]): every rank
//! writes its slot once and reads everyone's, in one round of stores.
//!
//! Otherwise: dissemination barrier, binomial broadcast, reductions
//! combined at the root in rank order (correct for every operation,
//! commutative or not), linear gathers and scatters, pairwise exchanges.
//! Data is packed into bytes at the edges, so any datatype works.

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use super::sched::{self, Io, Sched, Turn};
use super::types::Reducer;
use super::*;
use crate::datatype::Datatype;
use crate::entry;

mod inter;
pub use inter::exchange as inter_exchange;
use inter::{is_inter, remote_size, Role};

/// `count` items of a datatype at an address: one buffer, or one rank's
/// block of a gather, scatter or exchange.
#[derive(Clone)]
struct Buf {
    at: usize,
    count: u64,
    dt: Arc<Datatype>,
}

impl Buf {
    fn new(st: &State, at: usize, count: c_int, t: MPI_Datatype) -> R<Buf> {
        Ok(Buf { at, count: count_ok(count)?, dt: st.dtype(t)? })
    }

    /// Block `i` of a layout: `counts[i]` items at `displs[i]` extents.
    fn blocks(st: &State, at: usize, counts: &[c_int], displs: &[c_int], t: MPI_Datatype) -> R<Vec<Buf>> {
        let dt = st.dtype(t)?;
        let ext = dt.extent() as isize;
        counts
            .iter()
            .zip(displs)
            .map(|(&c, &d)| {
                Ok(Buf { at: at.wrapping_add_signed(d as isize * ext), count: count_ok(c)?, dt: dt.clone() })
            })
            .collect()
    }

    /// Packed bytes.
    fn len(&self) -> usize {
        (self.dt.size() * self.count) as usize
    }

    fn pack(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.len()];
        if !out.is_empty() {
            // SAFETY: the caller's buffer holds `count` items of this type
            // (the standard's rule for collective buffers).
            unsafe { self.dt.pack(self.count, self.at as *const u8, &mut out) };
        }
        out
    }

    fn unpack(&self, bytes: &[u8]) {
        if !bytes.is_empty() {
            // SAFETY: the caller's buffer holds `count` items of this type;
            // `bytes` holds at most their packed size.
            unsafe { self.dt.unpack(self.count, self.at as *mut u8, bytes) };
        }
    }
}

fn root_ok(st: &State, comm: MPI_Comm, root: c_int) -> R<u32> {
    let n = st.comm(comm)?.size();
    match u32::try_from(root) {
        Ok(r) if r < n => Ok(r),
        _ => err(MPI_ERR_ROOT, format!("root {root} is not in a communicator of {n}")),
    }
}

/// # Safety
/// Every pointer argument is null or points to what the MPI standard
/// requires of the argument of the same name in the calling function
/// (see [`put`](crate::ffi::put) and [`array`](crate::ffi::array)).
unsafe fn ints(p: *const c_int, n: u32, what: &str) -> R<Vec<c_int>> {
    // SAFETY: the pointers are as this function's contract requires.
    unsafe { array(p, n as usize, what) }
}

fn uniform(n: u32, count: c_int) -> (Vec<c_int>, Vec<c_int>) {
    ((0..n).map(|_| count).collect(), (0..n).map(|r| r as c_int * count).collect())
}

// ---- the algorithms ----

/// Dissemination barrier.
async fn barrier_alg(io: &Io) -> R<()> {
    let (n, me) = (io.size(), io.rank());
    let mut k = 1;
    while k < n {
        let r = io.recv((me + n - k) % n, 0);
        let s = io.send((me + k) % n, Vec::new());
        io.wait(s).await?;
        io.wait(r).await?;
        k <<= 1;
    }
    Ok(())
}

/// Binomial-tree broadcast of `len` bytes from `root` (`data` is the
/// root's); everyone's copy.
async fn bcast_alg(io: &Io, root: u32, mut data: Vec<u8>, len: usize) -> R<Vec<u8>> {
    let (n, me) = (io.size(), io.rank());
    let rel = (me + n - root) % n;
    let mut mask = 1;
    while mask < n {
        if rel & mask != 0 {
            data = io.recv_now((me + n - mask) % n, len).await?;
            break;
        }
        mask <<= 1;
    }
    mask >>= 1;
    let mut sent = Vec::new();
    while mask > 0 {
        if rel + mask < n {
            sent.push(io.send((me + mask) % n, data.clone()));
        }
        mask >>= 1;
    }
    for k in sent {
        io.wait(k).await?;
    }
    Ok(data)
}

/// Reduces everyone's packed `mine` at `root` in rank order; the result
/// at the root, `None` elsewhere. The root combines each contribution as
/// it arrives: next = acc op next (the operation's inout is its right
/// operand).
async fn reduce_alg(io: &Io, root: u32, mine: Vec<u8>, red: &Reducer, count: c_int) -> R<Option<Vec<u8>>> {
    let (n, me) = (io.size(), io.rank());
    if me != root {
        io.send_now(root, mine).await?;
        return Ok(None);
    }
    let len = mine.len();
    let posted: Vec<_> = (0..n).map(|r| (r != me).then(|| io.recv(r, len))).collect();
    let mut mine = Some(mine);
    let mut acc: Option<Vec<u8>> = None;
    for k in posted {
        let next = match k {
            Some(k) => io.wait(k).await?,
            None => mine.take().unwrap_or_default(),
        };
        acc = Some(combine(red, count, acc, next)?);
    }
    Ok(acc)
}

/// One step of a reduction in rank order: `acc op next` (the operation's
/// inout is its right operand), or `next` itself first.
fn combine(red: &Reducer, count: c_int, acc: Option<Vec<u8>>, mut next: Vec<u8>) -> R<Vec<u8>> {
    if let Some(a) = acc {
        red.apply(count, &a, &mut next)?;
    }
    Ok(next)
}

/// Gathers each rank's `send` into block r of `recv` at `root` (`None`:
/// the root's own block is in place).
async fn gather_alg(io: &Io, root: u32, send: Option<Buf>, recv: Vec<Buf>) -> R<()> {
    let (n, me) = (io.size(), io.rank());
    if me != root {
        let bytes = send.map(|b| b.pack()).unwrap_or_default();
        return io.send_now(root, bytes).await;
    }
    let posted: Vec<_> = (0..n).map(|r| (r != me).then(|| io.recv(r, recv[r as usize].len()))).collect();
    if let Some(s) = send {
        recv[me as usize].unpack(&s.pack());
    }
    for (r, k) in posted.into_iter().enumerate() {
        if let Some(k) = k {
            recv[r].unpack(&io.wait(k).await?);
        }
    }
    Ok(())
}

/// Scatters block r of `send` at `root` to each rank's `recv` (`None`:
/// the root's own block stays in place).
async fn scatter_alg(io: &Io, root: u32, send: Vec<Buf>, recv: Option<Buf>) -> R<()> {
    let (n, me) = (io.size(), io.rank());
    if me != root {
        let Some(b) = recv else { return Ok(()) };
        let got = io.recv_now(root, b.len()).await?;
        b.unpack(&got);
        return Ok(());
    }
    let mut sent = Vec::new();
    for r in 0..n {
        let block = send[r as usize].pack();
        if r == me {
            if let Some(b) = &recv {
                b.unpack(&block);
            }
        } else {
            sent.push(io.send(r, block));
        }
    }
    for k in sent {
        io.wait(k).await?;
    }
    Ok(())
}

/// Gathers every block at rank 0, which broadcasts them all in one message.
async fn allgather_alg(io: &Io, send: Option<Buf>, recv: Vec<Buf>) -> R<()> {
    let me = io.rank();
    gather_alg(io, 0, send, recv.clone()).await?;
    let total = recv.iter().map(Buf::len).sum();
    let all = if me == 0 { recv.iter().flat_map(|b| b.pack()).collect() } else { Vec::new() };
    let all = bcast_alg(io, 0, all, total).await?;
    if me != 0 {
        let mut off = 0;
        for b in &recv {
            b.unpack(&all[off..off + b.len()]);
            off += b.len();
        }
    }
    Ok(())
}

/// Every rank sends block r of `send` to rank r, into block `me` of its
/// `recv`. Every block is packed before any answer is unpacked, so
/// `MPI_IN_PLACE` (`send` is `recv`, and our own block stays) is safe.
async fn alltoall_alg(io: &Io, send: Vec<Buf>, recv: Vec<Buf>, in_place: bool) -> R<()> {
    let (n, me) = (io.size(), io.rank());
    let posted: Vec<_> = (0..n).map(|r| (r != me).then(|| io.recv(r, recv[r as usize].len()))).collect();
    let mut sent = Vec::new();
    for k in 1..=n {
        // Pairwise order spreads the load.
        let r = (me + k) % n;
        let block = send[r as usize].pack();
        if r != me {
            sent.push(io.send(r, block));
        } else if !in_place {
            recv[r as usize].unpack(&block);
        }
    }
    for k in sent {
        io.wait(k).await?;
    }
    for (r, k) in posted.into_iter().enumerate() {
        if let Some(k) = k {
            recv[r].unpack(&io.wait(k).await?);
        }
    }
    Ok(())
}

/// Inclusive (or exclusive) prefix reduction along the ranks.
async fn scan_alg(io: &Io, src: Buf, out: Buf, red: &Reducer, count: c_int, exclusive: bool) -> R<()> {
    let (n, me) = (io.size(), io.rank());
    let mut mine = src.pack();
    if me > 0 {
        let before = io.recv_now(me - 1, mine.len()).await?;
        if exclusive {
            out.unpack(&before);
        }
        // mine = before op mine.
        red.apply(count, &before, &mut mine)?;
    }
    if !exclusive {
        out.unpack(&mine);
    }
    if me + 1 < n {
        io.send_now(me + 1, mine).await?;
    }
    Ok(())
}

// ---- the calls: each builds its schedule ----

/// Starts `s` as a non-blocking collective's request.
pub fn nonblocking(st: &mut State, comm: MPI_Comm, s: Sched) -> R<MPI_Request> {
    let h = st.handle();
    st.reqs.insert(h, Pending::collective(comm));
    sched::start(st, h, s)?;
    Ok(h)
}

/// An argument of a collective, kept by a persistent request for its
/// restarts: addresses as plain numbers, handles and counts as they are.
trait Keep: Sized {
    type Kept: Copy + Send + 'static;
    fn keep(self) -> Self::Kept;
    fn back(k: Self::Kept) -> Self;
}

impl<T> Keep for *const T {
    type Kept = usize;
    fn keep(self) -> usize {
        self as usize
    }
    fn back(k: usize) -> Self {
        k as *const T
    }
}

impl<T> Keep for *mut T {
    type Kept = usize;
    fn keep(self) -> usize {
        self as usize
    }
    fn back(k: usize) -> Self {
        k as *mut T
    }
}

impl Keep for usize {
    type Kept = usize;
    fn keep(self) -> usize {
        self
    }
    fn back(k: usize) -> usize {
        k
    }
}

impl Keep for c_int {
    type Kept = c_int;
    fn keep(self) -> c_int {
        self
    }
    fn back(k: c_int) -> c_int {
        k
    }
}

/// Declares a collective's three forms from one schedule builder: the
/// blocking call, the non-blocking one (a request in flight) and the
/// persistent one (a request whose every `MPI_Start` builds the schedule
/// anew from the arguments given here).
macro_rules! collective {
    ($b:ident / $pb:ident, $i:ident / $pi:ident, $p:ident / $pp:ident,
     $build:ident ( $($a:ident : $t:ty),* ) comm($c:ident)) => {
        entry!($b / $pb ($($a: $t),*) comm($c) {
            with(|st| {
                let s = $build(st, $($a),*)?;
                sched::run(st, s)
            })
        });
        entry!($i / $pi ($($a: $t,)* req: *mut MPI_Request) comm($c) {
            let h = with(|st| {
                let s = $build(st, $($a),*)?;
                nonblocking(st, $c, s)
            })?;
            put(req, h, "request")
        });
        entry!($p / $pp ($($a: $t,)* info: MPI_Info, req: *mut MPI_Request) comm($c) {
            let _ = info;
            let kept = ($(<$t as Keep>::keep($a),)*);
            let h = with(|st| {
                st.comm($c)?;
                let recipe = move |st: &mut State| {
                    let ($($a,)*) = kept;
                    $build(st, $(<$t as Keep>::back($a)),*)
                };
                persistent(st, $c, Box::new(recipe))
            })?;
            put(req, h, "request")
        });
    };
}

/// A new persistent collective request, inactive until `MPI_Start`.
fn persistent(st: &mut State, comm: MPI_Comm, recipe: Box<sched::Recipe>) -> R<MPI_Request> {
    let p = sched::Persistent::new(st, recipe)?;
    let h = st.handle();
    st.coll_recipes.insert(h, p);
    st.reqs.insert(h, Pending { persistent: Some(p2p::Recipe::Coll), ..Pending::new(None, comm, None, None) });
    Ok(h)
}

fn barrier(st: &mut State, comm: MPI_Comm) -> R<Sched> {
    if is_inter(st, comm)? {
        return inter::barrier(st, comm);
    }
    let io = Io::new(st, comm)?;
    if let Some(t) = Turn::take(st, comm, 0) {
        return Ok(Sched::on_board(io, t.clone(), async move {
            t.post(&[]).await;
            t.all().await;
            t.finish();
            Ok(())
        }));
    }
    Ok(Sched::new(io.clone(), async move { barrier_alg(&io).await }))
}

collective!(MPI_Barrier / PMPI_Barrier, MPI_Ibarrier / PMPI_Ibarrier, MPI_Barrier_init / PMPI_Barrier_init, barrier(comm: MPI_Comm) comm(comm));

/// A barrier by messages, run to its end (`MPI_Finalize` uses it). Not on
/// the board: after the last collective a rank leaves, and a rank that
/// lost one of its board stores could not ask it to store its slot again
/// (`crate::board`, "Lost stores"); messages repair their own losses.
pub fn barrier_now(st: &mut State, comm: MPI_Comm) -> R<()> {
    if is_inter(st, comm)? {
        let s = inter::barrier(st, comm)?;
        return sched::run(st, s);
    }
    let io = Io::new(st, comm)?;
    let s = Sched::new(io.clone(), async move { barrier_alg(&io).await });
    sched::run(st, s)
}

/// Everyone's `mine` (the same length everywhere), in rank order.
pub fn allgather_u64(st: &mut State, comm: MPI_Comm, mine: &[u64]) -> R<Vec<u64>> {
    let n = st.comm(comm)?.size() as usize;
    let mut all = vec![0u64; mine.len() * n];
    let t = MPI_UINT64_T;
    let count = mine.len() as c_int;
    let send = Buf::new(st, mine.as_ptr() as usize, count, t)?;
    let (counts, displs) = uniform(n as u32, count);
    let recv = Buf::blocks(st, all.as_mut_ptr() as usize, &counts, &displs, t)?;
    let io = Io::new(st, comm)?;
    let s = Sched::new(io.clone(), async move { allgather_alg(&io, Some(send), recv).await });
    sched::run(st, s)?;
    Ok(all)
}

/// The largest of the members' `mine` at rank 0, then given to everyone.
async fn max_alg(io: &Io, mine: u64) -> R<u64> {
    let (n, me) = (io.size(), io.rank());
    let mut max = mine;
    if me == 0 {
        let posted: Vec<_> = (1..n).map(|r| io.recv(r, 8)).collect();
        for k in posted {
            max = max.max(word(&io.wait(k).await?));
        }
    } else {
        io.send_now(0, mine.to_ne_bytes().to_vec()).await?;
    }
    Ok(word(&bcast_alg(io, 0, max.to_ne_bytes().to_vec(), 8).await?))
}

/// The first word of a message of words (0 if it is shorter).
fn word(b: &[u8]) -> u64 {
    u64::from_ne_bytes(b.get(..8).and_then(|b| b.try_into().ok()).unwrap_or_default())
}

/// Words as a message (native order): how constructors exchange numbers.
pub(crate) fn to_bytes(w: &[u64]) -> Vec<u8> {
    w.iter().flat_map(|w| w.to_ne_bytes()).collect()
}

/// A message of words back as words.
pub(crate) fn words(b: &[u8]) -> Vec<u64> {
    b.chunks_exact(8).map(word).collect()
}

/// The schedule of agreeing on the largest of everyone's `mine` over
/// `comm` (over both groups of an intercommunicator), and where its answer
/// lands: how `MPI_Comm_idup` picks a context without blocking.
pub fn max_sched(st: &mut State, comm: MPI_Comm, mine: u64) -> R<(Sched, Arc<std::sync::Mutex<u64>>)> {
    let out = Arc::new(std::sync::Mutex::new(0));
    let put = out.clone();
    let keep = move |v: u64| *put.lock().unwrap_or_else(|e| e.into_inner()) = v;
    if is_inter(st, comm)? {
        let (rio, lio) = inter::ios(st, comm)?;
        let s = Sched::new(rio.clone(), async move {
            let ours = max_alg(&lio, mine).await?;
            let theirs = inter::leaders_swap(&rio, &lio, ours.to_ne_bytes().to_vec()).await?;
            keep(ours.max(word(&theirs)));
            Ok(())
        });
        return Ok((s, out));
    }
    let io = Io::new(st, comm)?;
    let s = Sched::new(io.clone(), async move {
        keep(max_alg(&io, mine).await?);
        Ok(())
    });
    Ok((s, out))
}

/// Root's `data` (any length), given to every member: run to its end.
pub fn bcast_u64(st: &mut State, comm: MPI_Comm, root: u32, data: Vec<u64>) -> R<Vec<u64>> {
    let io = Io::new(st, comm)?;
    let out = Arc::new(std::sync::Mutex::new(Vec::new()));
    let put = out.clone();
    let s = Sched::new(io.clone(), async move {
        let n = bcast_alg(&io, root, (data.len() as u64).to_ne_bytes().to_vec(), 8).await?;
        let n = word(&n) as usize;
        let bytes = to_bytes(&data);
        *put.lock().unwrap_or_else(|e| e.into_inner()) = bcast_alg(&io, root, bytes, n * 8).await?;
        Ok(())
    });
    sched::run(st, s)?;
    let got = std::mem::take(&mut *out.lock().unwrap_or_else(|e| e.into_inner()));
    Ok(words(&got))
}

fn bcast(st: &mut State, buf: *mut c_void, count: c_int, t: MPI_Datatype, root: c_int, comm: MPI_Comm) -> R<Sched> {
    let b = Buf::new(st, buf as usize, count, t)?;
    if is_inter(st, comm)? {
        let role = inter::role(st, comm, root)?;
        return inter::bcast(st, comm, role, b);
    }
    let root = root_ok(st, comm, root)?;
    let io = Io::new(st, comm)?;
    if let Some(t) = Turn::take(st, comm, b.len()) {
        let me = io.rank();
        return Ok(Sched::on_board(io, t.clone(), async move {
            if me == root {
                t.post(&b.pack()).await;
            } else {
                t.post(&[]).await;
                t.from(root).await;
                b.unpack(&t.data(root, b.len()));
            }
            t.finish();
            Ok(())
        }));
    }
    Ok(Sched::new(io.clone(), async move {
        let me = io.rank();
        let data = if me == root { b.pack() } else { Vec::new() };
        let got = bcast_alg(&io, root, data, b.len()).await?;
        if me != root {
            b.unpack(&got);
        }
        Ok(())
    }))
}

collective!(MPI_Bcast / PMPI_Bcast, MPI_Ibcast / PMPI_Ibcast, MPI_Bcast_init / PMPI_Bcast_init,
    bcast(buf: *mut c_void, count: c_int, t: MPI_Datatype, root: c_int, comm: MPI_Comm) comm(comm));

fn reduce(
    st: &mut State,
    sbuf: *const c_void,
    rbuf: *mut c_void,
    count: c_int,
    t: MPI_Datatype,
    op: MPI_Op,
    root: c_int,
    comm: MPI_Comm,
) -> R<Sched> {
    if is_inter(st, comm)? {
        let role = inter::role(st, comm, root)?;
        let (src, out) = (Buf::new(st, sbuf as usize, count, t)?, Buf::new(st, rbuf as usize, count, t)?);
        let red = Reducer::new(st, op, t)?;
        return inter::reduce(st, comm, role, src, out, red, count);
    }
    let root = root_ok(st, comm, root)?;
    let me = st.comm(comm)?.rank;
    let src = if sbuf as usize == MPI_IN_PLACE && me == root { rbuf as usize } else { sbuf as usize };
    let (src, out) = (Buf::new(st, src, count, t)?, Buf::new(st, rbuf as usize, count, t)?);
    let red = Reducer::new(st, op, t)?;
    let io = Io::new(st, comm)?;
    Ok(Sched::new(io.clone(), async move {
        if let Some(res) = reduce_alg(&io, root, src.pack(), &red, count).await? {
            out.unpack(&res);
        }
        Ok(())
    }))
}

collective!(MPI_Reduce / PMPI_Reduce, MPI_Ireduce / PMPI_Ireduce, MPI_Reduce_init / PMPI_Reduce_init,
    reduce(sbuf: *const c_void, rbuf: *mut c_void, count: c_int, t: MPI_Datatype, op: MPI_Op, root: c_int, comm: MPI_Comm) comm(comm));

fn allreduce(
    st: &mut State,
    sbuf: *const c_void,
    rbuf: *mut c_void,
    count: c_int,
    t: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
) -> R<Sched> {
    let src = if sbuf as usize == MPI_IN_PLACE { rbuf as usize } else { sbuf as usize };
    let (src, out) = (Buf::new(st, src, count, t)?, Buf::new(st, rbuf as usize, count, t)?);
    let red = Reducer::new(st, op, t)?;
    if is_inter(st, comm)? {
        return inter::allreduce(st, comm, src, out, red, count);
    }
    let io = Io::new(st, comm)?;
    if let Some(t) = Turn::take(st, comm, out.len()) {
        let n = io.size();
        return Ok(Sched::on_board(io, t.clone(), async move {
            t.post(&src.pack()).await;
            t.all().await;
            let all: Vec<Vec<u8>> = (0..n).map(|r| t.data(r, out.len())).collect();
            t.finish();
            let mut acc: Option<Vec<u8>> = None;
            for next in all {
                acc = Some(combine(&red, count, acc, next)?);
            }
            out.unpack(&acc.unwrap_or_default());
            Ok(())
        }));
    }
    Ok(Sched::new(io.clone(), async move {
        let res = reduce_alg(&io, 0, src.pack(), &red, count).await?.unwrap_or_default();
        let res = bcast_alg(&io, 0, res, out.len()).await?;
        out.unpack(&res);
        Ok(())
    }))
}

collective!(MPI_Allreduce / PMPI_Allreduce, MPI_Iallreduce / PMPI_Iallreduce, MPI_Allreduce_init / PMPI_Allreduce_init,
    allreduce(sbuf: *const c_void, rbuf: *mut c_void, count: c_int, t: MPI_Datatype, op: MPI_Op, comm: MPI_Comm) comm(comm));

/// Who the root of a rooted collective is.
#[derive(Clone, Copy)]
enum Rooted {
    /// Rank `.0` of an intracommunicator.
    Intra(u32),
    /// On an intercommunicator.
    Inter(Role),
}

impl Rooted {
    fn new(st: &State, comm: MPI_Comm, root: c_int) -> R<Rooted> {
        if is_inter(st, comm)? {
            Ok(Rooted::Inter(inter::role(st, comm, root)?))
        } else {
            Ok(Rooted::Intra(root_ok(st, comm, root)?))
        }
    }

    /// Whether this process is the root.
    fn here(self, st: &State, comm: MPI_Comm) -> R<bool> {
        Ok(match self {
            Rooted::Intra(r) => st.comm(comm)?.rank == r,
            Rooted::Inter(role) => matches!(role, Role::Root),
        })
    }
}

/// The root's layout for a gather or a scatter (counts and displacements
/// in items, one block per rank it exchanges with), empty elsewhere.
fn root_layout(
    st: &State,
    comm: MPI_Comm,
    root: Rooted,
    buf: usize,
    counts: impl FnOnce(u32) -> R<(Vec<c_int>, Vec<c_int>)>,
    t: MPI_Datatype,
) -> R<Vec<Buf>> {
    if !root.here(st, comm)? {
        return Ok(Vec::new());
    }
    let (counts, displs) = counts(st.comm(comm)?.peers().len() as u32)?;
    Buf::blocks(st, buf, &counts, &displs, t)
}

fn gather_sched(
    st: &mut State,
    comm: MPI_Comm,
    root: Rooted,
    sbuf: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    recv: Vec<Buf>,
) -> R<Sched> {
    let send = if sbuf as usize == MPI_IN_PLACE { None } else { Some(Buf::new(st, sbuf as usize, scount, stype)?) };
    let root = match root {
        Rooted::Inter(role) => return inter::gather(st, comm, role, send, recv),
        Rooted::Intra(r) => r,
    };
    let io = Io::new(st, comm)?;
    Ok(Sched::new(io.clone(), async move { gather_alg(&io, root, send, recv).await }))
}

fn gather(
    st: &mut State,
    sbuf: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    rbuf: *mut c_void,
    rcount: c_int,
    rtype: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
) -> R<Sched> {
    let root = Rooted::new(st, comm, root)?;
    let recv = root_layout(st, comm, root, rbuf as usize, |n| Ok(uniform(n, rcount)), rtype)?;
    gather_sched(st, comm, root, sbuf, scount, stype, recv)
}

collective!(MPI_Gather / PMPI_Gather, MPI_Igather / PMPI_Igather, MPI_Gather_init / PMPI_Gather_init,
    gather(sbuf: *const c_void, scount: c_int, stype: MPI_Datatype, rbuf: *mut c_void, rcount: c_int, rtype: MPI_Datatype, root: c_int, comm: MPI_Comm) comm(comm));

/// # Safety
/// Every pointer argument is null or points to what the MPI standard
/// requires of the argument of the same name in the calling function
/// (see [`put`](crate::ffi::put) and [`array`](crate::ffi::array)).
unsafe fn gatherv(
    st: &mut State,
    sbuf: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    rbuf: *mut c_void,
    rcounts: *const c_int,
    displs: *const c_int,
    rtype: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
) -> R<Sched> {
    let root = Rooted::new(st, comm, root)?;
    // SAFETY: the pointers are as this function's contract requires.
    let layout = |n| Ok((unsafe { ints(rcounts, n, "recvcounts") }?, unsafe { ints(displs, n, "displs") }?));
    let recv = root_layout(st, comm, root, rbuf as usize, layout, rtype)?;
    gather_sched(st, comm, root, sbuf, scount, stype, recv)
}

collective!(MPI_Gatherv / PMPI_Gatherv, MPI_Igatherv / PMPI_Igatherv, MPI_Gatherv_init / PMPI_Gatherv_init,
    gatherv(sbuf: *const c_void, scount: c_int, stype: MPI_Datatype, rbuf: *mut c_void, rcounts: *const c_int, displs: *const c_int, rtype: MPI_Datatype, root: c_int, comm: MPI_Comm) comm(comm));

fn scatter_sched(
    st: &mut State,
    comm: MPI_Comm,
    root: Rooted,
    send: Vec<Buf>,
    rbuf: *mut c_void,
    rcount: c_int,
    rtype: MPI_Datatype,
) -> R<Sched> {
    let recv = if rbuf as usize == MPI_IN_PLACE { None } else { Some(Buf::new(st, rbuf as usize, rcount, rtype)?) };
    let root = match root {
        Rooted::Inter(role) => return inter::scatter(st, comm, role, send, recv),
        Rooted::Intra(r) => r,
    };
    let io = Io::new(st, comm)?;
    Ok(Sched::new(io.clone(), async move { scatter_alg(&io, root, send, recv).await }))
}

fn scatter(
    st: &mut State,
    sbuf: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    rbuf: *mut c_void,
    rcount: c_int,
    rtype: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
) -> R<Sched> {
    let root = Rooted::new(st, comm, root)?;
    let send = root_layout(st, comm, root, sbuf as usize, |n| Ok(uniform(n, scount)), stype)?;
    scatter_sched(st, comm, root, send, rbuf, rcount, rtype)
}

collective!(MPI_Scatter / PMPI_Scatter, MPI_Iscatter / PMPI_Iscatter, MPI_Scatter_init / PMPI_Scatter_init,
    scatter(sbuf: *const c_void, scount: c_int, stype: MPI_Datatype, rbuf: *mut c_void, rcount: c_int, rtype: MPI_Datatype, root: c_int, comm: MPI_Comm) comm(comm));

/// # Safety
/// Every pointer argument is null or points to what the MPI standard
/// requires of the argument of the same name in the calling function
/// (see [`put`](crate::ffi::put) and [`array`](crate::ffi::array)).
unsafe fn scatterv(
    st: &mut State,
    sbuf: *const c_void,
    scounts: *const c_int,
    displs: *const c_int,
    stype: MPI_Datatype,
    rbuf: *mut c_void,
    rcount: c_int,
    rtype: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
) -> R<Sched> {
    let root = Rooted::new(st, comm, root)?;
    // SAFETY: the pointers are as this function's contract requires.
    let layout = |n| Ok((unsafe { ints(scounts, n, "sendcounts") }?, unsafe { ints(displs, n, "displs") }?));
    let send = root_layout(st, comm, root, sbuf as usize, layout, stype)?;
    scatter_sched(st, comm, root, send, rbuf, rcount, rtype)
}

collective!(MPI_Scatterv / PMPI_Scatterv, MPI_Iscatterv / PMPI_Iscatterv, MPI_Scatterv_init / PMPI_Scatterv_init,
    scatterv(sbuf: *const c_void, scounts: *const c_int, displs: *const c_int, stype: MPI_Datatype, rbuf: *mut c_void, rcount: c_int, rtype: MPI_Datatype, root: c_int, comm: MPI_Comm) comm(comm));

fn allgather_sched(
    st: &mut State,
    comm: MPI_Comm,
    sbuf: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    rbuf: *mut c_void,
    counts: &[c_int],
    displs: &[c_int],
    rtype: MPI_Datatype,
) -> R<Sched> {
    let recv = Buf::blocks(st, rbuf as usize, counts, displs, rtype)?;
    if is_inter(st, comm)? {
        let send = Buf::new(st, sbuf as usize, scount, stype)?;
        return inter::exchange_all(st, comm, vec![send; recv.len()], recv);
    }
    let me = st.comm(comm)?.rank as usize;
    // In place: our block is already where it goes.
    let send =
        if sbuf as usize == MPI_IN_PLACE { recv[me].clone() } else { Buf::new(st, sbuf as usize, scount, stype)? };
    let io = Io::new(st, comm)?;
    let widest = recv.iter().map(Buf::len).max().unwrap_or(0);
    if let Some(t) = Turn::take(st, comm, widest) {
        return Ok(Sched::on_board(io, t.clone(), async move {
            t.post(&send.pack()).await;
            t.all().await;
            let all: Vec<Vec<u8>> = recv.iter().enumerate().map(|(r, b)| t.data(r as u32, b.len())).collect();
            t.finish();
            for (b, bytes) in recv.iter().zip(&all) {
                b.unpack(bytes);
            }
            Ok(())
        }));
    }
    Ok(Sched::new(io.clone(), async move { allgather_alg(&io, Some(send), recv).await }))
}

fn allgather(
    st: &mut State,
    sbuf: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    rbuf: *mut c_void,
    rcount: c_int,
    rtype: MPI_Datatype,
    comm: MPI_Comm,
) -> R<Sched> {
    let (counts, displs) = uniform(remote_size(st, comm)?, rcount);
    allgather_sched(st, comm, sbuf, scount, stype, rbuf, &counts, &displs, rtype)
}

collective!(MPI_Allgather / PMPI_Allgather, MPI_Iallgather / PMPI_Iallgather, MPI_Allgather_init / PMPI_Allgather_init,
    allgather(sbuf: *const c_void, scount: c_int, stype: MPI_Datatype, rbuf: *mut c_void, rcount: c_int, rtype: MPI_Datatype, comm: MPI_Comm) comm(comm));

/// # Safety
/// Every pointer argument is null or points to what the MPI standard
/// requires of the argument of the same name in the calling function
/// (see [`put`](crate::ffi::put) and [`array`](crate::ffi::array)).
unsafe fn allgatherv(
    st: &mut State,
    sbuf: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    rbuf: *mut c_void,
    rcounts: *const c_int,
    displs: *const c_int,
    rtype: MPI_Datatype,
    comm: MPI_Comm,
) -> R<Sched> {
    let n = remote_size(st, comm)?;
    // SAFETY: the pointers are as this function's contract requires.
    let (counts, displs) = (unsafe { ints(rcounts, n, "recvcounts") }?, unsafe { ints(displs, n, "displs") }?);
    allgather_sched(st, comm, sbuf, scount, stype, rbuf, &counts, &displs, rtype)
}

collective!(MPI_Allgatherv / PMPI_Allgatherv, MPI_Iallgatherv / PMPI_Iallgatherv, MPI_Allgatherv_init / PMPI_Allgatherv_init,
    allgatherv(sbuf: *const c_void, scount: c_int, stype: MPI_Datatype, rbuf: *mut c_void, rcounts: *const c_int, displs: *const c_int, rtype: MPI_Datatype, comm: MPI_Comm) comm(comm));

fn alltoall_sched(st: &mut State, comm: MPI_Comm, send: Option<Vec<Buf>>, recv: Vec<Buf>) -> R<Sched> {
    if is_inter(st, comm)? {
        let Some(send) = send else { return err(MPI_ERR_BUFFER, "MPI_IN_PLACE on an intercommunicator") };
        return inter::exchange_all(st, comm, send, recv);
    }
    let in_place = send.is_none();
    let send = send.unwrap_or_else(|| recv.clone());
    let io = Io::new(st, comm)?;
    Ok(Sched::new(io.clone(), async move { alltoall_alg(&io, send, recv, in_place).await }))
}

fn alltoall(
    st: &mut State,
    sbuf: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    rbuf: *mut c_void,
    rcount: c_int,
    rtype: MPI_Datatype,
    comm: MPI_Comm,
) -> R<Sched> {
    let n = remote_size(st, comm)?;
    let recv = {
        let (c, d) = uniform(n, rcount);
        Buf::blocks(st, rbuf as usize, &c, &d, rtype)?
    };
    let send = if sbuf as usize == MPI_IN_PLACE {
        None
    } else {
        let (c, d) = uniform(n, scount);
        Some(Buf::blocks(st, sbuf as usize, &c, &d, stype)?)
    };
    alltoall_sched(st, comm, send, recv)
}

collective!(MPI_Alltoall / PMPI_Alltoall, MPI_Ialltoall / PMPI_Ialltoall, MPI_Alltoall_init / PMPI_Alltoall_init,
    alltoall(sbuf: *const c_void, scount: c_int, stype: MPI_Datatype, rbuf: *mut c_void, rcount: c_int, rtype: MPI_Datatype, comm: MPI_Comm) comm(comm));

/// # Safety
/// Every pointer argument is null or points to what the MPI standard
/// requires of the argument of the same name in the calling function
/// (see [`put`](crate::ffi::put) and [`array`](crate::ffi::array)).
unsafe fn alltoallv(
    st: &mut State,
    sbuf: *const c_void,
    scounts: *const c_int,
    sdispls: *const c_int,
    stype: MPI_Datatype,
    rbuf: *mut c_void,
    rcounts: *const c_int,
    rdispls: *const c_int,
    rtype: MPI_Datatype,
    comm: MPI_Comm,
) -> R<Sched> {
    let n = remote_size(st, comm)?;
    // SAFETY: the pointers are as this function's contract requires.
    let recv = Buf::blocks(
        st,
        rbuf as usize,
        &unsafe { ints(rcounts, n, "recvcounts") }?,
        &unsafe { ints(rdispls, n, "rdispls") }?,
        rtype,
    )?;
    let send = if sbuf as usize == MPI_IN_PLACE {
        None
    } else {
        // SAFETY: the pointers are as this function's contract requires.
        Some(Buf::blocks(
            st,
            sbuf as usize,
            &unsafe { ints(scounts, n, "sendcounts") }?,
            &unsafe { ints(sdispls, n, "sdispls") }?,
            stype,
        )?)
    };
    alltoall_sched(st, comm, send, recv)
}

collective!(MPI_Alltoallv / PMPI_Alltoallv, MPI_Ialltoallv / PMPI_Ialltoallv, MPI_Alltoallv_init / PMPI_Alltoallv_init,
    alltoallv(sbuf: *const c_void, scounts: *const c_int, sdispls: *const c_int, stype: MPI_Datatype, rbuf: *mut c_void, rcounts: *const c_int, rdispls: *const c_int, rtype: MPI_Datatype, comm: MPI_Comm) comm(comm));

/// Blocks of `counts[r]` items of `types[r]` at `displs[r]` bytes.
///
/// # Safety
/// Every pointer argument is null or points to what the MPI standard
/// requires of the argument of the same name in the calling function
/// (see [`put`](crate::ffi::put) and [`array`](crate::ffi::array)).
unsafe fn wblocks(
    st: &State,
    at: usize,
    n: u32,
    counts: *const c_int,
    displs: *const c_int,
    types: *const MPI_Datatype,
    what: &str,
) -> R<Vec<Buf>> {
    // SAFETY: the pointers are as this function's contract requires.
    let counts = unsafe { ints(counts, n, &format!("{what}counts")) }?;
    // SAFETY: the pointers are as this function's contract requires.
    let displs = unsafe { ints(displs, n, &format!("{what}displs")) }?;
    // SAFETY: the pointers are as this function's contract requires.
    let types = unsafe { array(types, n as usize, &format!("{what}types")) }?;
    (0..n as usize).map(|r| Buf::new(st, at.wrapping_add_signed(displs[r] as isize), counts[r], types[r])).collect()
}

/// # Safety
/// Every pointer argument is null or points to what the MPI standard
/// requires of the argument of the same name in the calling function
/// (see [`put`](crate::ffi::put) and [`array`](crate::ffi::array)).
unsafe fn alltoallw(
    st: &mut State,
    sbuf: *const c_void,
    scounts: *const c_int,
    sdispls: *const c_int,
    stypes: *const MPI_Datatype,
    rbuf: *mut c_void,
    rcounts: *const c_int,
    rdispls: *const c_int,
    rtypes: *const MPI_Datatype,
    comm: MPI_Comm,
) -> R<Sched> {
    let n = remote_size(st, comm)?;
    // SAFETY: the pointers are as this function's contract requires.
    let recv = unsafe { wblocks(st, rbuf as usize, n, rcounts, rdispls, rtypes, "recv") }?;
    let send = if sbuf as usize == MPI_IN_PLACE {
        None
    } else {
        // SAFETY: the pointers are as this function's contract requires.
        Some(unsafe { wblocks(st, sbuf as usize, n, scounts, sdispls, stypes, "send") }?)
    };
    alltoall_sched(st, comm, send, recv)
}

collective!(MPI_Alltoallw / PMPI_Alltoallw, MPI_Ialltoallw / PMPI_Ialltoallw, MPI_Alltoallw_init / PMPI_Alltoallw_init,
    alltoallw(sbuf: *const c_void, scounts: *const c_int, sdispls: *const c_int, stypes: *const MPI_Datatype, rbuf: *mut c_void, rcounts: *const c_int, rdispls: *const c_int, rtypes: *const MPI_Datatype, comm: MPI_Comm) comm(comm));

fn scan_sched(
    st: &mut State,
    sbuf: *const c_void,
    rbuf: *mut c_void,
    count: c_int,
    t: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
    exclusive: bool,
) -> R<Sched> {
    if is_inter(st, comm)? {
        return err(MPI_ERR_COMM, "prefix reductions are not defined on intercommunicators");
    }
    let src = if sbuf as usize == MPI_IN_PLACE { rbuf as usize } else { sbuf as usize };
    let (src, out) = (Buf::new(st, src, count, t)?, Buf::new(st, rbuf as usize, count, t)?);
    let red = Reducer::new(st, op, t)?;
    let io = Io::new(st, comm)?;
    Ok(Sched::new(io.clone(), async move { scan_alg(&io, src, out, &red, count, exclusive).await }))
}

fn scan(
    st: &mut State,
    sbuf: *const c_void,
    rbuf: *mut c_void,
    count: c_int,
    t: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
) -> R<Sched> {
    scan_sched(st, sbuf, rbuf, count, t, op, comm, false)
}

fn exscan(
    st: &mut State,
    sbuf: *const c_void,
    rbuf: *mut c_void,
    count: c_int,
    t: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
) -> R<Sched> {
    scan_sched(st, sbuf, rbuf, count, t, op, comm, true)
}

collective!(MPI_Scan / PMPI_Scan, MPI_Iscan / PMPI_Iscan, MPI_Scan_init / PMPI_Scan_init,
    scan(sbuf: *const c_void, rbuf: *mut c_void, count: c_int, t: MPI_Datatype, op: MPI_Op, comm: MPI_Comm) comm(comm));

collective!(MPI_Exscan / PMPI_Exscan, MPI_Iexscan / PMPI_Iexscan, MPI_Exscan_init / PMPI_Exscan_init,
    exscan(sbuf: *const c_void, rbuf: *mut c_void, count: c_int, t: MPI_Datatype, op: MPI_Op, comm: MPI_Comm) comm(comm));

/// Reduce at rank 0, then scatter blocks of `counts` items.
fn reduce_scatter_sched(
    st: &mut State,
    sbuf: *const c_void,
    rbuf: *mut c_void,
    counts: Vec<c_int>,
    t: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
) -> R<Sched> {
    let total: c_int = counts.iter().sum();
    let src = if sbuf as usize == MPI_IN_PLACE { rbuf as usize } else { sbuf as usize };
    let src = Buf::new(st, src, total, t)?;
    let me = st.comm(comm)?.rank as usize;
    let out = Buf::new(st, rbuf as usize, counts[me], t)?;
    let lens = counts.iter().map(|&c| Ok((st.dtype(t)?.size() * count_ok(c)?) as usize)).collect::<R<Vec<_>>>()?;
    let red = Reducer::new(st, op, t)?;
    if is_inter(st, comm)? {
        let offset = lens[..me].iter().sum();
        return inter::reduce_scatter(st, comm, src, out, offset, red, total);
    }
    let io = Io::new(st, comm)?;
    Ok(Sched::new(io.clone(), async move {
        let res = reduce_alg(&io, 0, src.pack(), &red, total).await?;
        match res {
            Some(res) => {
                let mut off = 0;
                let mut sent = Vec::new();
                for (r, &len) in lens.iter().enumerate() {
                    let block = res[off..off + len].to_vec();
                    off += len;
                    if r == me {
                        out.unpack(&block);
                    } else {
                        sent.push(io.send(r as u32, block));
                    }
                }
                for k in sent {
                    io.wait(k).await?;
                }
            }
            None => out.unpack(&io.recv_now(0, lens[me]).await?),
        }
        Ok(())
    }))
}

fn reduce_scatter_block(
    st: &mut State,
    sbuf: *const c_void,
    rbuf: *mut c_void,
    count: c_int,
    t: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
) -> R<Sched> {
    let n = st.comm(comm)?.size();
    reduce_scatter_sched(st, sbuf, rbuf, vec![count; n as usize], t, op, comm)
}

collective!(MPI_Reduce_scatter_block / PMPI_Reduce_scatter_block, MPI_Ireduce_scatter_block / PMPI_Ireduce_scatter_block, MPI_Reduce_scatter_block_init / PMPI_Reduce_scatter_block_init,
    reduce_scatter_block(sbuf: *const c_void, rbuf: *mut c_void, count: c_int, t: MPI_Datatype, op: MPI_Op, comm: MPI_Comm) comm(comm));

/// # Safety
/// Every pointer argument is null or points to what the MPI standard
/// requires of the argument of the same name in the calling function
/// (see [`put`](crate::ffi::put) and [`array`](crate::ffi::array)).
unsafe fn reduce_scatter(
    st: &mut State,
    sbuf: *const c_void,
    rbuf: *mut c_void,
    counts: *const c_int,
    t: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
) -> R<Sched> {
    let n = st.comm(comm)?.size();
    // SAFETY: the pointers are as this function's contract requires.
    let counts = unsafe { ints(counts, n, "recvcounts") }?;
    reduce_scatter_sched(st, sbuf, rbuf, counts, t, op, comm)
}

collective!(MPI_Reduce_scatter / PMPI_Reduce_scatter, MPI_Ireduce_scatter / PMPI_Ireduce_scatter, MPI_Reduce_scatter_init / PMPI_Reduce_scatter_init,
    reduce_scatter(sbuf: *const c_void, rbuf: *mut c_void, counts: *const c_int, t: MPI_Datatype, op: MPI_Op, comm: MPI_Comm) comm(comm));

entry!(MPI_Reduce_local / PMPI_Reduce_local(inbuf: *const c_void, inoutbuf: *mut c_void, count: c_int, t: MPI_Datatype, op: MPI_Op) comm(MPI_COMM_WORLD) {
    with(|st| {
        let (a, b) = (Buf::new(st, inbuf as usize, count, t)?, Buf::new(st, inoutbuf as usize, count, t)?);
        let red = Reducer::new(st, op, t)?;
        let mut out = b.pack();
        red.apply(count, &a.pack(), &mut out)?;
        b.unpack(&out);
        Ok(())
    })
});
