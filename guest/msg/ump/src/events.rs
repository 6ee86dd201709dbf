//! `ump_wait`: what happened on the process's channels. One-time events
//! (a channel completed, a non-blocking operation finished, the other
//! side closed) come before messages, and messages are reported round
//! robin, so a busy channel cannot hide the others. The caller's thread,
//! with the UMP state locked for each look.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::listen::accept;
use crate::{converge, with, Entry, UmpError};

/// What `wait` reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The channel is complete (both sides opened it); for a listener, a
    /// new channel.
    Open(i32),
    /// A message (or its start) is there to read.
    Message(i32),
    /// A non-blocking write finished.
    WriteDone(i32),
    /// A non-blocking read finished.
    ReadDone(i32),
    /// The other side closed the channel or died.
    Closed(i32),
}

/// One look at a channel for `wait`: the one-time events (open, done,
/// closed) when `edges`, else whether a message waits.
fn look(id: i32, e: &mut Entry, edges: bool) -> Option<Event> {
    if !edges {
        let reading = e.nbread.as_ref().is_some_and(|n| !n.done.load(Ordering::Acquire));
        return (e.reported_open && !reading && e.ch.pending().is_some()).then_some(Event::Message(id));
    }
    if !e.reported_open {
        if e.ch.poll_open() {
            e.reported_open = true;
            return Some(Event::Open(id));
        }
        return None;
    }
    if let Some(nb) = &mut e.nbwrite {
        if nb.done.load(Ordering::Acquire) && !nb.reported {
            nb.reported = true;
            return Some(Event::WriteDone(id));
        }
    }
    if let Some(nb) = &mut e.nbread {
        if nb.done.load(Ordering::Acquire) && !nb.reported {
            nb.reported = true;
            return Some(Event::ReadDone(id));
        }
    }
    // Closed only once everything sent before the close was read.
    if !e.reported_closed && e.ch.peer_closed() && e.ch.pending().is_none() {
        e.reported_closed = true;
        return Some(Event::Closed(id));
    }
    None
}

/// `ump_wait`: waits up to `timeout` (None: for ever) for an event on
/// channel `id`, or on any channel of this process (`id` None).
pub fn wait(id: Option<i32>, timeout: Option<Duration>) -> Result<Option<Event>, UmpError> {
    let deadline = timeout.map(|t| Instant::now() + t);
    let mut spins = 0u32;
    loop {
        let ev = with(|st| {
            if id.is_none() {
                accept(st);
            }
            let mut ids: Vec<i32> = match id {
                Some(i) if !st.chans.contains_key(&i) => return Err(UmpError::NoChannel(i)),
                Some(i) => vec![i],
                None => st.chans.keys().copied().collect(),
            };
            ids.sort_unstable();
            for &i in &ids {
                if let Some(mut e) = st.chans.remove(&i) {
                    converge(st, &mut e);
                    st.chans.insert(i, e);
                }
            }
            // One-time events first, then messages, starting after the
            // channel that had the last message (round robin).
            let start = ids.iter().position(|&i| i > st.last_message).unwrap_or(0);
            ids.rotate_left(start);
            for edges in [true, false] {
                for &i in &ids {
                    if let Some(ev) = st.chans.get_mut(&i).and_then(|e| look(i, e, edges)) {
                        if let Event::Message(m) = ev {
                            st.last_message = m;
                        }
                        return Ok(Some(ev));
                    }
                }
            }
            Ok(None)
        })?;
        if ev.is_some() {
            return Ok(ev);
        }
        if deadline.is_some_and(|d| Instant::now() > d) {
            return Ok(None);
        }
        spins += 1;
        if spins < 64 {
            std::hint::spin_loop();
        } else if spins < 4096 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}
