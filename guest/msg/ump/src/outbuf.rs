//! Multicast (`ump_mcast`) and this process's outbuf: one region, written
//! only by us and mapped for transmit to every node (the SCRAMNet
//! billboard idea, seed 002, and the outbufs seed 000 designed but never
//! shipped). It is allocated coherently, so every node receives it from
//! the start and a receiver that maps it when the first record arrives
//! sees every message in it. Used by the caller's thread, under the
//! outbuf's own lock.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use imc_client::keys::Namespace;
use imc_client::ImcError;

use crate::channel::{ChanError, Channel, Transport};
use crate::mem::{Sink, TxWindow};
use crate::{channel, with, State, UmpError};

pub use crate::config::OUTBUF_DEFAULT;

/// This process's outbuf.
pub(crate) struct Outbuf {
    key: u64,
    size: u64,
    tx: TxWindow,
    /// Bytes used so far (messages start on 8-byte boundaries and never wrap).
    head: u64,
    /// Records not yet consumed: (channel, our index after the record,
    /// outbuf offset of its message).
    pending: Vec<(Arc<Channel>, u64, u64)>,
}

impl Outbuf {
    /// Drops records their readers have consumed (or can no longer).
    fn reclaim(&mut self) {
        self.pending.retain(|(ch, after, _)| !ch.is_closed() && !ch.peer_closed() && ch.consumed() < *after);
    }

    /// The oldest byte still needed.
    fn oldest(&self) -> u64 {
        self.pending.iter().map(|p| p.2).min().unwrap_or(self.head)
    }
}

/// The outbuf's key: one per process (node and pid), in UMP's outbuf
/// namespace (`imc_proto::keys`).
fn outbuf_key(node: u32, pid: u32) -> u64 {
    Namespace::UmpOutbuf.key((node as u64) << 32 | pid as u64)
}

fn outbuf(st: &mut State) -> Result<Arc<Mutex<Outbuf>>, UmpError> {
    if let Some(o) = &st.outbuf {
        return Ok(o.clone());
    }
    let imc = st.imc.clone().ok_or_else(|| UmpError::NoTransport("MEMORY CHANNEL needs imcd".into()))?;
    let size = st.cfg.outbuf as u64;
    let key = outbuf_key(st.node, std::process::id());
    let i = imc.lock().unwrap_or_else(|e| e.into_inner());
    let err = |e: ImcError| UmpError::NoTransport(format!("imcd: outbuf: {e}"));
    let (id, ..) = i.asalloc_flags(key, size, 0o666, false, true).map_err(err)?;
    let tx = i.asattach_tx(id, false).map_err(err)?;
    let o = Outbuf { key, size, tx: TxWindow::new(Arc::new(tx)), head: 0, pending: Vec::new() };
    let o = Arc::new(Mutex::new(o));
    st.outbuf = Some(o.clone());
    Ok(o)
}

/// `ump_mcast`: writes one message to every channel in `ids`. Over
/// MEMORY CHANNEL the message is written once, into this process's outbuf
/// (received by every node), and each channel gets a 32-byte record
/// pointing at it; shared-memory channels (and messages larger than half
/// the outbuf) get an ordinary write. Order with the channel's other
/// messages is kept: the record sits in the channel's own ring.
pub fn mcast(ids: &[i32], msg: &[u8]) -> Result<(), UmpError> {
    mcast_until(ids, msg, None)
}

/// `ump_mcast` with a deadline: fails with a timeout when a receiver has
/// not taken enough of what it was sent (its ring, or our outbuf, stays
/// full) by then.
pub fn mcast_timeout(ids: &[i32], msg: &[u8], timeout: Duration) -> Result<(), UmpError> {
    mcast_until(ids, msg, Some(Instant::now() + timeout))
}

fn mcast_until(ids: &[i32], msg: &[u8], deadline: Option<Instant>) -> Result<(), UmpError> {
    let chans: Vec<Arc<Channel>> = ids.iter().map(|&i| channel(i)).collect::<Result<_, _>>()?;
    let mut seen = HashSet::new();
    if let Some(dup) = ids.iter().find(|i| !seen.insert(**i)) {
        return Err(UmpError::Invalid(format!("channel {dup} twice in the multicast list")));
    }
    let (mc, local): (Vec<_>, Vec<_>) = chans.into_iter().partition(|c| c.transport == Transport::Mc);
    for c in &local {
        c.write(msg, deadline)?;
    }
    if mc.is_empty() {
        return Ok(());
    }
    let ob = with(|st| if msg.len() as u64 <= st.cfg.outbuf as u64 / 2 { outbuf(st).map(Some) } else { Ok(None) })?;
    let Some(ob) = ob else {
        for c in &mc {
            c.write(msg, deadline)?;
        }
        return Ok(());
    };
    let mut o = ob.lock().unwrap_or_else(|e| e.into_inner());
    let padded = msg.len().div_ceil(8) as u64 * 8;
    let mut start = o.head;
    if start % o.size + padded > o.size {
        start = start.div_ceil(o.size) * o.size; // never wrap a message
    }
    let end = start + padded.max(8);
    // Room: the oldest message a reader may still copy must not be overwritten.
    let mut spins = 0u32;
    loop {
        o.reclaim();
        if end - o.oldest() <= o.size {
            break;
        }
        spins += 1;
        if spins % 4096 == 0 {
            // A reader that died never consumes its record: drop it.
            o.pending.retain(|(c, ..)| c.alive().is_ok());
            if deadline.is_some_and(|d| Instant::now() > d) {
                return Err(ChanError::Timeout.into());
            }
        }
        if spins < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
    let pos = (start % o.size) as usize;
    let whole = msg.len() / 8 * 8;
    o.tx.write(pos, &msg[..whole]);
    if whole < msg.len() {
        let mut last = [0u8; 8];
        last[..msg.len() - whole].copy_from_slice(&msg[whole..]);
        o.tx.write(pos + whole, &last);
    }
    o.head = end;
    let (key, size) = (o.key, o.size);
    for c in mc {
        let after = c.write_record(msg, key, start, size, deadline)?;
        o.pending.push((c, after, start));
    }
    Ok(())
}
