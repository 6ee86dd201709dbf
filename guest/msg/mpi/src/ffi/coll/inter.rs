//! The collectives on intercommunicators (MPI-2): data moves from one
//! group to the other. Each schedule has two views ([`Io::also`]): the
//! remote group, where the data crosses, and the local group (the
//! intercommunicator's hidden intracommunicator, [`Comm::local`]), where
//! each group gathers, reduces or spreads its part. The local leader
//! (rank 0) talks to the remote leader where one message per group is
//! enough.
//!
//! Rooted collectives name the root as `MPI_ROOT` in the root itself,
//! `MPI_PROC_NULL` in the rest of its group and the root's rank in the
//! other group ([`Role`]).

use super::*;

/// The part a process plays in a rooted collective.
#[derive(Clone, Copy)]
pub(super) enum Role {
    /// The root.
    Root,
    /// In the root's group, not the root: takes no part.
    Idle,
    /// In the other group; the root is this rank of the remote group.
    Leaf(u32),
}

/// Whether `comm` is an intercommunicator.
pub(super) fn is_inter(st: &State, comm: MPI_Comm) -> R<bool> {
    Ok(st.comm(comm)?.is_inter())
}

/// Members of the remote group.
pub(super) fn remote_size(st: &State, comm: MPI_Comm) -> R<u32> {
    Ok(st.comm(comm)?.peers().len() as u32)
}

pub(super) fn role(st: &State, comm: MPI_Comm, root: c_int) -> R<Role> {
    let n = remote_size(st, comm)?;
    match root {
        MPI_ROOT => Ok(Role::Root),
        MPI_PROC_NULL => Ok(Role::Idle),
        r if (0..n as c_int).contains(&r) => Ok(Role::Leaf(r as u32)),
        r => err(MPI_ERR_ROOT, format!("root {r} on an intercommunicator with a remote group of {n}")),
    }
}

/// The remote and the local view of intercommunicator `comm`, in one
/// schedule.
pub(super) fn ios(st: &mut State, comm: MPI_Comm) -> R<(Io, Io)> {
    let local = st.comm(comm)?.local;
    let rio = Io::new(st, comm)?;
    let lio = rio.also(st, local)?;
    Ok((rio, lio))
}

/// The local leader sends `mine` to the remote leader and receives the
/// remote group's bytes, of any length; every local member gets them.
pub(super) async fn leaders_swap(rio: &Io, lio: &Io, mine: Vec<u8>) -> R<Vec<u8>> {
    let theirs = if lio.rank() == 0 {
        let len = rio.recv(0, 8);
        let s1 = rio.send(0, (mine.len() as u64).to_ne_bytes().to_vec());
        let s2 = rio.send(0, mine);
        let n = rio.wait(len).await?;
        let n = word(&n) as usize;
        let data = rio.recv_now(0, n).await?;
        rio.wait(s1).await?;
        rio.wait(s2).await?;
        data
    } else {
        Vec::new()
    };
    let n = bcast_alg(lio, 0, (theirs.len() as u64).to_ne_bytes().to_vec(), 8).await?;
    let n = word(&n) as usize;
    bcast_alg(lio, 0, theirs, n).await
}

/// The remote group's `mine` (the same at every member of a group), over
/// intercommunicator `comm`: how its constructors agree.
pub fn exchange(st: &mut State, comm: MPI_Comm, mine: Vec<u64>) -> R<Vec<u64>> {
    let (rio, lio) = ios(st, comm)?;
    let bytes = to_bytes(&mine);
    let out = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let put = out.clone();
    let s = Sched::new(rio.clone(), async move {
        let got = leaders_swap(&rio, &lio, bytes).await?;
        *put.lock().unwrap_or_else(|e| e.into_inner()) = got;
        Ok(())
    });
    sched::run(st, s)?;
    let got = std::mem::take(&mut *out.lock().unwrap_or_else(|e| e.into_inner()));
    Ok(words(&got))
}

pub(super) fn barrier(st: &mut State, comm: MPI_Comm) -> R<Sched> {
    let (rio, lio) = ios(st, comm)?;
    Ok(Sched::new(rio.clone(), async move {
        // Every local member has arrived, then the leaders meet, then the
        // local broadcast lets everyone go.
        barrier_alg(&lio).await?;
        leaders_swap(&rio, &lio, Vec::new()).await.map(|_| ())
    }))
}

pub(super) fn bcast(st: &mut State, comm: MPI_Comm, role: Role, b: Buf) -> R<Sched> {
    let (rio, lio) = ios(st, comm)?;
    Ok(Sched::new(rio.clone(), async move {
        match role {
            Role::Root => rio.send_now(0, b.pack()).await,
            Role::Idle => Ok(()),
            Role::Leaf(root) => {
                let data = if lio.rank() == 0 { rio.recv_now(root, b.len()).await? } else { Vec::new() };
                let data = bcast_alg(&lio, 0, data, b.len()).await?;
                b.unpack(&data);
                Ok(())
            }
        }
    }))
}

pub(super) fn reduce(
    st: &mut State,
    comm: MPI_Comm,
    role: Role,
    src: Buf,
    out: Buf,
    red: Reducer,
    count: c_int,
) -> R<Sched> {
    let (rio, lio) = ios(st, comm)?;
    Ok(Sched::new(rio.clone(), async move {
        match role {
            Role::Root => {
                out.unpack(&rio.recv_now(0, out.len()).await?);
                Ok(())
            }
            Role::Idle => Ok(()),
            Role::Leaf(root) => match reduce_alg(&lio, 0, src.pack(), &red, count).await? {
                Some(res) => rio.send_now(root, res).await,
                None => Ok(()),
            },
        }
    }))
}

/// Each group's reduction, given to every member of the other group.
pub(super) fn allreduce(st: &mut State, comm: MPI_Comm, src: Buf, out: Buf, red: Reducer, count: c_int) -> R<Sched> {
    let (rio, lio) = ios(st, comm)?;
    Ok(Sched::new(rio.clone(), async move {
        let mine = reduce_alg(&lio, 0, src.pack(), &red, count).await?.unwrap_or_default();
        out.unpack(&leaders_swap(&rio, &lio, mine).await?);
        Ok(())
    }))
}

/// Each group's reduction of `counts.sum()` items, scattered over the
/// other group by its `counts` (this member's block into `out`).
pub(super) fn reduce_scatter(
    st: &mut State,
    comm: MPI_Comm,
    src: Buf,
    out: Buf,
    offset: usize,
    red: Reducer,
    total: c_int,
) -> R<Sched> {
    let (rio, lio) = ios(st, comm)?;
    Ok(Sched::new(rio.clone(), async move {
        let mine = reduce_alg(&lio, 0, src.pack(), &red, total).await?.unwrap_or_default();
        let all = leaders_swap(&rio, &lio, mine).await?;
        match all.get(offset..offset + out.len()) {
            Some(block) => out.unpack(block),
            None => return err(MPI_ERR_COUNT, "the groups' receive counts do not add up to the same total"),
        }
        Ok(())
    }))
}

/// The root receives block r of `recv` from remote rank r.
pub(super) fn gather(st: &mut State, comm: MPI_Comm, role: Role, send: Option<Buf>, recv: Vec<Buf>) -> R<Sched> {
    let (rio, _lio) = ios(st, comm)?;
    Ok(Sched::new(rio.clone(), async move {
        match role {
            Role::Root => {
                let posted: Vec<_> = recv.iter().enumerate().map(|(r, b)| rio.recv(r as u32, b.len())).collect();
                for (b, k) in recv.iter().zip(posted) {
                    b.unpack(&rio.wait(k).await?);
                }
                Ok(())
            }
            Role::Idle => Ok(()),
            Role::Leaf(root) => rio.send_now(root, send.map(|b| b.pack()).unwrap_or_default()).await,
        }
    }))
}

/// The root sends block r of `send` to remote rank r.
pub(super) fn scatter(st: &mut State, comm: MPI_Comm, role: Role, send: Vec<Buf>, recv: Option<Buf>) -> R<Sched> {
    let (rio, _lio) = ios(st, comm)?;
    Ok(Sched::new(rio.clone(), async move {
        match role {
            Role::Root => {
                let sent: Vec<_> = send.iter().enumerate().map(|(r, b)| rio.send(r as u32, b.pack())).collect();
                for k in sent {
                    rio.wait(k).await?;
                }
                Ok(())
            }
            Role::Idle => Ok(()),
            Role::Leaf(root) => {
                if let Some(b) = recv {
                    b.unpack(&rio.recv_now(root, b.len()).await?);
                }
                Ok(())
            }
        }
    }))
}

/// Every member sends `send[r]` to remote rank r and receives `recv[r]`
/// from it: all-to-all, and all-gather when every `send[r]` is the same
/// buffer.
pub(super) fn exchange_all(st: &mut State, comm: MPI_Comm, send: Vec<Buf>, recv: Vec<Buf>) -> R<Sched> {
    let (rio, _lio) = ios(st, comm)?;
    Ok(Sched::new(rio.clone(), async move {
        let posted: Vec<_> = recv.iter().enumerate().map(|(r, b)| rio.recv(r as u32, b.len())).collect();
        let sent: Vec<_> = send.iter().enumerate().map(|(r, b)| rio.send(r as u32, b.pack())).collect();
        for k in sent {
            rio.wait(k).await?;
        }
        for (b, k) in recv.iter().zip(posted) {
            b.unpack(&rio.wait(k).await?);
        }
        Ok(())
    }))
}
