//! `ump_listen`: a handle that accepts channels from handles it does not
//! know. On this guest, openers drop a notice in the listener's folder in
//! `/dev/shm`; from other guests, they write their handle into the
//! listener's inbox in MEMORY CHANNEL space. Also the markers by which a
//! handle says it lives on this guest. Called with the UMP state locked.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use imc_client::keys::Namespace;
use imc_client::{Imc, ImcError};

use crate::mc::open_mc;
use crate::mem::{RxWindow, Sink, Source, TxWindow};
use crate::shm::{lock_file, open_shm, pid_alive};
use crate::{with, Entry, State, UmpError, Want};

/// A listening handle's inbox in MEMORY CHANNEL space: one coherent page
/// of 1024 words, 16 per node. An opener on node n writes its handle into
/// a free word of n's part (processes of one node take turns under a
/// flock, so no two openers ever write one word at once); the listener
/// reads the handles, opens the channels and clears the words.
pub(crate) struct Inbox {
    rx: RxWindow,
    tx: TxWindow,
    /// Its region (the listener's [`crate::waker`] watches it).
    pub(crate) id: u32,
}

/// Words of an inbox per node.
const INBOX_PER_NODE: usize = 16;

/// MEMORY CHANNEL key of handle `h`'s listen area (namespace registry:
/// `imc_proto::keys`).
fn listen_key(h: u64) -> u64 {
    Namespace::UmpListen.key(h)
}

/// Where a handle announces that it lives on this guest.
pub(crate) fn marker(h: u64) -> PathBuf {
    PathBuf::from(format!("/dev/shm/ump-ep-{h:016x}"))
}

/// Announces that handle `h` lives in this process on this guest. The
/// marker is replaced whole (written aside, then renamed), and only when
/// it does not already name us: a process opening its channels rewrote it
/// in place at every open, and a peer on the same guest choosing its
/// transport at that moment read an empty file, took the handle for one
/// on another guest and chose MEMORY CHANNEL; when both sides did, the
/// channel never completed (`ump_mixed_transports`, 1 QEMU-tier run in
/// 2; MPI's "rank N's channel did not open" between ranks of one guest).
pub(crate) fn announce(h: u64) {
    let me = format!("{}\n", std::process::id());
    if std::fs::read_to_string(marker(h)).is_ok_and(|s| s == me) {
        return;
    }
    let tmp = PathBuf::from(format!("/dev/shm/.ump-ep-{h:016x}.{}", std::process::id()));
    if std::fs::write(&tmp, &me).is_ok() && std::fs::rename(&tmp, marker(h)).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// Whether a live process on this guest has announced handle `h` (a
/// marker left by a process that died does not count).
pub(crate) fn marker_alive(h: u64) -> bool {
    std::fs::read_to_string(marker(h)).ok().and_then(|s| s.trim().parse::<u32>().ok()).is_some_and(pid_alive)
}

/// The folder where openers on this guest leave notices for listener `h`.
pub(crate) fn listen_dir(h: u64) -> PathBuf {
    PathBuf::from(format!("/dev/shm/ump-listen-{h:016x}"))
}

/// Maps listening handle `h`'s inbox (receive and transmit), creating it if `create`.
fn map_inbox(imc: &Imc, h: u64, create: bool) -> Result<Option<(Inbox, u32)>, UmpError> {
    let err = |e: ImcError| UmpError::NoTransport(format!("imcd: inbox: {e}"));
    if !create && imc.find(listen_key(h)).map_err(err)?.is_none() {
        return Ok(None);
    }
    let (id, ..) = imc.asalloc_flags(listen_key(h), 8192, 0o666, false, true).map_err(err)?;
    let rx = imc.asattach_rx(id).map_err(err)?;
    // With loopback: an opener waits until its own copy of the inbox shows
    // the word it stored (the global order then has it), which without
    // loopback never happens and cost every open 5 s.
    let tx = imc.asattach_tx(id, true).map_err(err)?;
    Ok(Some((Inbox { rx: RxWindow::new(Arc::new(rx)), tx: TxWindow::new(Arc::new(tx)), id }, id)))
}

/// Tells a listener on another guest that `local` opened a channel to it
/// (if `remote` listens there).
pub(crate) fn notify_listener(st: &State, local: u64, remote: u64) -> Result<(), UmpError> {
    let Some(imc) = st.imc.clone() else { return Ok(()) };
    let i = imc.lock().unwrap_or_else(|e| e.into_inner());
    let Some((inbox, id)) = map_inbox(&i, remote, false)? else { return Ok(()) };
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(format!("/run/ump-inbox-{remote:016x}.lock"))
        .map_err(|e| UmpError::os(format!("/run/ump-inbox-{remote:016x}.lock"), e))?;
    let held = lock_file(&lock)?;
    let base = (st.node as usize % 64) * INBOX_PER_NODE;
    let slots: Vec<usize> = (base..base + INBOX_PER_NODE).collect();
    let r = match slots
        .iter()
        .find(|&&w| inbox.rx.load(w * 8) == local)
        .or_else(|| slots.iter().find(|&&w| inbox.rx.load(w * 8) == 0))
    {
        Some(&w) => {
            inbox.tx.store(w * 8, local);
            // Wait until it is in our copy too: the next opener here must
            // see the word taken. The listener may have taken the handle
            // and cleared the word again before we look (it reads 0 then,
            // as before our store came back), so only for a while: a
            // store comes back within milliseconds.
            let t0 = Instant::now();
            while inbox.rx.load(w * 8) != local && t0.elapsed() < INBOX_ECHO_WAIT {
                std::thread::sleep(Duration::from_micros(100));
            }
            Ok(())
        }
        None => Err(UmpError::Busy(format!("the inbox of listener {remote:#x} is full for this node"))),
    };
    drop(held);
    drop(inbox);
    let _ = i.asdealloc(id);
    r
}

/// How long an opener waits to see its handle come back in the inbox.
const INBOX_ECHO_WAIT: Duration = Duration::from_millis(200);

/// `ump_listen`: `local` accepts channels from handles it does not know:
/// `wait` reports each as [`crate::Event::Open`] of a new channel. On
/// this guest through a folder in `/dev/shm`; from other guests (`want`
/// Any or Mc, with imcd) through an inbox in MEMORY CHANNEL space.
pub fn listen(local: u64, want: Want) -> Result<(), UmpError> {
    with(|st| {
        if want != Want::Mc {
            std::fs::create_dir_all(listen_dir(local)).map_err(|e| UmpError::os(listen_dir(local).display(), e))?;
            announce(local);
        }
        if want != Want::Shm {
            match st.imc.clone() {
                Some(imc) => {
                    let i = imc.lock().unwrap_or_else(|e| e.into_inner());
                    let (inbox, _) = map_inbox(&i, local, true)?
                        .ok_or_else(|| UmpError::NoTransport("imcd did not create the inbox".into()))?;
                    st.inboxes.insert(local, inbox);
                }
                None if want == Want::Mc => {
                    return Err(UmpError::NoTransport("listening over MEMORY CHANNEL needs imcd".into()))
                }
                None => {}
            }
        }
        st.listening.entry(local).or_default();
        Ok(())
    })
}

/// Whether listening handle `h` already has its channel from `peer`: it
/// accepted it, or this process opened that channel itself (both sides
/// opening at once: that one is the channel, no second one). Recorded.
/// Once this process has closed that channel, it is not known any more:
/// a new notice from `peer` is a new channel (PVM's spawn requests open
/// one per request).
fn known(st: &mut State, h: u64, peer: u64) -> bool {
    if st.find(h, peer).is_some() {
        st.listening.entry(h).or_default().insert(peer);
        return true;
    }
    if let Some(s) = st.listening.get_mut(&h) {
        s.remove(&peer);
    }
    false
}

/// New channels of listening handles (opened from our side too).
pub(crate) fn accept(st: &mut State) -> Vec<i32> {
    let mut new = Vec::new();
    // From other guests: handles in our inboxes.
    let mut found = Vec::new();
    for (&h, inbox) in &st.inboxes {
        for w in 0..64 * INBOX_PER_NODE {
            let peer = inbox.rx.load(w * 8);
            if peer != 0 {
                found.push((h, w, peer));
            }
        }
    }
    for (h, w, peer) in found {
        if !known(st, h, peer) {
            match open_mc(st, h, peer) {
                Ok(ch) => {
                    st.listening.entry(h).or_default().insert(peer);
                    new.push(st.add(Entry::new(ch, Want::Mc)));
                }
                Err(_) => continue, // the word stays: the next wait tries again
            }
        }
        if let Some(inbox) = st.inboxes.get(&h) {
            inbox.tx.store(w * 8, 0);
        }
    }
    let handles: Vec<u64> = st.listening.keys().copied().collect();
    for h in handles {
        let folder = listen_dir(h);
        // A folder unchanged since a look that left it empty holds no
        // notice: one stat, no open. (An idle listener looks 20 times a
        // second; opening the folder each time kept a 1-vCPU guest's RCU
        // thread waking as often.) Timestamps are coarse (a clock tick),
        // so a folder changed within QUIET_AGE is read whatever it says.
        let mtime = std::fs::metadata(&folder).and_then(|m| m.modified()).ok();
        let settled = mtime.filter(|m| SystemTime::now().duration_since(*m).is_ok_and(|age| age > QUIET_AGE));
        if settled.is_some() && st.listen_quiet.get(&h) == settled.as_ref() {
            continue;
        }
        let Ok(dir) = std::fs::read_dir(&folder) else { continue };
        let mut left = false;
        for f in dir.flatten() {
            let Some(peer) = f.file_name().to_str().and_then(|s| u64::from_str_radix(s, 16).ok()) else {
                left |= !f.file_name().to_string_lossy().starts_with('.');
                continue;
            };
            let kind = std::fs::read_to_string(f.path()).unwrap_or_default();
            if known(st, h, peer) {
                let _ = std::fs::remove_file(f.path());
                continue;
            }
            // A notice stays until its channel could be opened (next wait retries).
            let ch = if kind == "mc" { open_mc(st, h, peer) } else { open_shm(st, h, peer) };
            if let Ok(ch) = ch {
                let _ = std::fs::remove_file(f.path());
                st.listening.entry(h).or_default().insert(peer);
                new.push(st.add(Entry::new(ch, Want::Any)));
            } else {
                left = true;
            }
        }
        // Removing notices changed the time: the next look reads once more.
        match settled {
            Some(m) if !left => st.listen_quiet.insert(h, m),
            _ => st.listen_quiet.remove(&h),
        };
    }
    new
}

/// How old a folder's modification time must be before `accept` trusts
/// it (tmpfs stamps with the coarse clock, one tick of up to 10 ms).
const QUIET_AGE: Duration = Duration::from_millis(50);

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer choosing its transport while this process announces the
    /// same handle again and again (as each open does) always finds the
    /// marker alive: it is never empty or missing mid-write.
    #[test]
    fn a_marker_being_announced_again_always_reads_alive() {
        let h = 0x7e57_0000_0000_0000 | u64::from(std::process::id());
        announce(h);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut n = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    // Alternate contents, so that every call replaces it.
                    if n % 2 == 0 {
                        let _ = std::fs::write(marker(h).with_extension("x"), "");
                        let tmp = PathBuf::from(format!("/dev/shm/.ump-ep-{h:016x}.{}", std::process::id()));
                        let _ = std::fs::write(&tmp, "1\n");
                        let _ = std::fs::rename(&tmp, marker(h));
                    }
                    announce(h);
                    n += 1;
                }
            })
        };
        let mut dead = 0;
        for _ in 0..20_000 {
            let s = std::fs::read_to_string(marker(h)).unwrap_or_default();
            if s.is_empty() {
                dead += 1;
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        writer.join().unwrap();
        let _ = std::fs::remove_file(marker(h));
        let _ = std::fs::remove_file(marker(h).with_extension("x"));
        assert_eq!(dead, 0, "the marker read empty {dead} times in 20,000");
        assert!(!marker_alive(h), "gone once removed");
    }
}
