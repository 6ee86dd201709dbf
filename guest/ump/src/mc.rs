//! The MEMORY CHANNEL transport: one region per half, keyed by the
//! handle pair; each side maps its own half for transmit only (no
//! loopback, as in the revised UMP) and the other half for receive.
//! Also the receive side of multicast: mapping senders' outbufs when a
//! record first points into one. Called with the UMP state locked
//! (open, accept), and from a channel's reader (the resolver).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use imc_client::keys::Namespace;
use imc_client::{Imc, ImcError, Status};

use crate::channel::{self, Channel, Transport};
use crate::mem::{RxWindow, Sink, Source, TxWindow};
use crate::{ring, State, UmpError};

/// MEMORY CHANNEL key of half `side` of the channel (lo, hi): a hash of
/// the pair in UMP's channel namespace (`imc_proto::keys`).
pub(crate) fn mc_key(lo: u64, hi: u64, side: u64) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for b in lo.to_le_bytes().into_iter().chain(hi.to_le_bytes()) {
        h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
    }
    Namespace::UmpChannel.key(h & !1 | side & 1)
}

/// A sender's outbuf, mapped for receive here.
pub(crate) struct OutbufIn {
    mem: Arc<dyn Source>,
    _id: u32,
}

/// Outbufs mapped for receive, by key (shared by the process's channels).
pub(crate) type OutbufsIn = Arc<Mutex<HashMap<u64, OutbufIn>>>;

/// Keeps the channel's regions: the attachments go with the windows, then
/// the allocations are released.
struct McKeep {
    imc: Arc<Mutex<Imc>>,
    ids: [u32; 2],
}

impl Drop for McKeep {
    fn drop(&mut self) {
        let imc = self.imc.lock().unwrap_or_else(|e| e.into_inner());
        for id in self.ids {
            let _ = imc.asdealloc(id);
        }
    }
}

/// Opens our side of the MEMORY CHANNEL channel (local, remote).
pub(crate) fn open_mc(st: &State, local: u64, remote: u64) -> Result<Arc<Channel>, UmpError> {
    let imc =
        st.imc.clone().ok_or_else(|| UmpError::NoTransport("MEMORY CHANNEL needs imcd (not reachable)".into()))?;
    let (lo, hi) = (local.min(remote), local.max(remote));
    let side = u64::from(local > remote);
    let size = st.cfg.mc_buffer;
    let bytes = ring::half_len(size) as u64;
    let c = imc.lock().unwrap_or_else(|e| e.into_inner());
    let err = |e: ImcError| UmpError::NoTransport(format!("imcd: {e}"));
    let (mine, ..) = c.asalloc(mc_key(lo, hi, side), bytes, 0o666, false).map_err(err)?;
    let (theirs, ..) = c.asalloc(mc_key(lo, hi, 1 - side), bytes, 0o666, false).map_err(err)?;
    // Receive first: the other side's first writes must land here.
    let rx = c.asattach_rx(theirs).map_err(err)?;
    let tx = c.asattach_tx(mine, false).map_err(err)?;
    drop(c);
    let (out, peer): (Arc<dyn Sink>, Arc<dyn Source>) =
        (Arc::new(TxWindow::new(Arc::new(tx))), Arc::new(RxWindow::new(Arc::new(rx))));
    let probe = imc.clone();
    let alive: channel::Liveness = Box::new(move |who| {
        let (node, pid) = ((who >> 32) as u32, who as u32);
        if pid == 0 {
            return Ok(());
        }
        match probe.lock().unwrap_or_else(|e| e.into_inner()).kill(&node.to_string(), pid as i32, 0) {
            Ok(()) => Ok(()),
            Err(ImcError::Refused { code, message }) if code == Status::NoHost || code == Status::Errno => {
                Err(format!("process {pid} on node {node}: {message}"))
            }
            Err(_) => Ok(()), // imcd busy or gone: do not guess
        }
    });
    let who = (st.node as u64) << 32 | std::process::id() as u64;
    let keep = McKeep { imc: imc.clone(), ids: [mine, theirs] };
    let ch = Channel::new(local, remote, Transport::Mc, size, out, peer, who, alive, Box::new(keep));
    install_resolver(st, &ch);
    Ok(ch)
}

/// Lets a channel's reads follow multicast records into the senders'
/// outbufs, mapping each outbuf (for receive) the first time.
fn install_resolver(st: &State, ch: &Channel) {
    let (Some(imc), cache) = (st.imc.clone(), st.outbufs_in.clone()) else { return };
    ch.set_resolver(Arc::new(move |key, size| {
        let mut c = cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(o) = c.get(&key) {
            return Some(o.mem.clone());
        }
        let i = imc.lock().unwrap_or_else(|e| e.into_inner());
        // The outbuf exists (its record came after it); finding it by key
        // also holds it for us while we read from it.
        let (id, ..) = i.asalloc_flags(key, size, 0o666, false, true).ok()?;
        let rx = i.asattach_rx(id).ok()?;
        let mem: Arc<dyn Source> = Arc::new(RxWindow::new(Arc::new(rx)));
        c.insert(key, OutbufIn { mem: mem.clone(), _id: id });
        Some(mem)
    }));
}
