//! Non-blocking reads and writes (`ump_nbread`, `ump_nbwrite`): each
//! channel gets at most one background reader thread and one background
//! writer thread, started by its first non-blocking call and kept for the
//! next ones (joined when the channel closes), so many calls cost no
//! thread creation. The caller's thread queues a job and polls its
//! completion; `wait` reports it as [`crate::Event::ReadDone`] /
//! [`crate::Event::WriteDone`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::channel::{ChanError, Channel};
use crate::{channel, with, UmpError};

/// The outcome of one non-blocking operation, once it is done.
type Outcome = Arc<Mutex<Option<Result<usize, ChanError>>>>;

/// A non-blocking operation in progress (or done, not yet collected).
pub(crate) struct Nb {
    pub(crate) done: Arc<AtomicBool>,
    result: Outcome,
    /// Its completion event was reported.
    pub(crate) reported: bool,
}

/// Work for a channel's background thread.
type Job = Box<dyn FnOnce(&Channel) + Send>;

/// A channel's background thread: runs its jobs in order.
pub(crate) struct Worker {
    jobs: Sender<Job>,
    thread: JoinHandle<()>,
}

impl Worker {
    fn start(ch: Arc<Channel>) -> Worker {
        let (jobs, rx) = std::sync::mpsc::channel::<Job>();
        let thread = std::thread::spawn(move || {
            for job in rx {
                job(&ch);
            }
        });
        Worker { jobs, thread }
    }

    /// Lets the thread finish its jobs (the channel is closed first, so a
    /// job still waiting stops) and joins it.
    pub(crate) fn stop(self) {
        drop(self.jobs);
        let _ = self.thread.join();
    }
}

/// A caller's buffer a background read fills, as an address: the caller
/// of [`nbread`] promises it stays valid and untouched until the read is
/// done (ump.h says so), and only the background thread writes it meanwhile.
#[derive(Clone, Copy)]
struct UserBuf {
    addr: usize,
    len: usize,
}

/// Refuses a second non-blocking operation of the same kind while one
/// runs; forgets a finished one.
pub(crate) fn busy_nb(id: i32, write: bool) -> Result<(), UmpError> {
    with(|st| {
        let e = st.chans.get_mut(&id).ok_or(UmpError::NoChannel(id))?;
        let nb = if write { &mut e.nbwrite } else { &mut e.nbread };
        if nb.as_ref().is_some_and(|n| !n.done.load(Ordering::Acquire)) {
            return Err(UmpError::Busy(format!(
                "a non-blocking {} on channel {id} is still running",
                if write { "write" } else { "read" }
            )));
        }
        *nb = None;
        Ok(())
    })
}

/// Queues `job` on channel `id`'s reader (or writer) and records it as
/// the channel's non-blocking read (or write).
fn submit(
    id: i32,
    write: bool,
    job: impl FnOnce(&Channel) -> Result<usize, ChanError> + Send + 'static,
) -> Result<Arc<AtomicBool>, UmpError> {
    let done = Arc::new(AtomicBool::new(false));
    let result: Outcome = Arc::new(Mutex::new(None));
    let (d, r) = (done.clone(), result.clone());
    let job: Job = Box::new(move |ch| {
        let out = job(ch);
        *r.lock().unwrap_or_else(|e| e.into_inner()) = Some(out);
        d.store(true, Ordering::Release);
    });
    with(|st| {
        let e = st.chans.get_mut(&id).ok_or(UmpError::NoChannel(id))?;
        let worker = if write { &mut e.writer } else { &mut e.reader };
        let w = worker.get_or_insert_with(|| Worker::start(e.ch.clone()));
        w.jobs.send(job).map_err(|_| UmpError::Channel(ChanError::ClosedHere))?;
        let nb = Some(Nb { done: done.clone(), result, reported: false });
        if write {
            e.nbwrite = nb;
        } else {
            e.nbread = nb;
        }
        Ok(())
    })?;
    Ok(done)
}

/// `ump_nbwrite`: starts writing a message and returns; the channel's
/// writer thread finishes it ([`crate::Event::WriteDone`]). The message is
/// copied first, so the caller's buffer is free at once.
pub fn nbwrite(id: i32, msg: &[u8]) -> Result<(), UmpError> {
    busy_nb(id, true)?;
    let msg = msg.to_vec();
    submit(id, true, move |ch| ch.write(&msg, None).map(|()| msg.len()))?;
    Ok(())
}

/// `ump_nbread`: starts reading the next message into `buf` and returns
/// once `min` bytes of it (or all of it) are in; the channel's reader
/// thread reads the rest ([`crate::Event::ReadDone`], then [`nbread_result`]).
///
/// # Safety
/// `buf` must be valid for `size` bytes of writes, and stay valid and
/// untouched by the caller, until the read is done.
pub unsafe fn nbread(id: i32, buf: *mut u8, size: usize, min: usize) -> Result<usize, UmpError> {
    busy_nb(id, false)?;
    let ch = channel(id)?;
    let progress = ch.rx.lock().unwrap_or_else(|e| e.into_inner()).progress();
    progress.store(0, Ordering::Release);
    let b = UserBuf { addr: buf as usize, len: size };
    let done = submit(id, false, move |ch| {
        // SAFETY: the caller's promise (see above): `b` is valid for writes
        // of `b.len` bytes, and nothing else touches it until `done`.
        let slice = unsafe { std::slice::from_raw_parts_mut(b.addr as *mut u8, b.len) };
        ch.read(slice, None)
    })?;
    let mut spins = 0u32;
    loop {
        let got = progress.load(Ordering::Acquire);
        if done.load(Ordering::Acquire) || got >= min {
            return Ok(got);
        }
        spins += 1;
        if spins < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

/// The outcome of a channel's last non-blocking read or write (`None`
/// while it runs): the message length.
fn nb_result(id: i32, write: bool) -> Result<Option<usize>, UmpError> {
    with(|st| {
        let e = st.chans.get_mut(&id).ok_or(UmpError::NoChannel(id))?;
        let (nb, what) = if write { (&mut e.nbwrite, "write") } else { (&mut e.nbread, "read") };
        let Some(nb) = nb else { return Err(UmpError::Invalid(format!("no {what} on channel {id}"))) };
        if !nb.done.load(Ordering::Acquire) {
            return Ok(None);
        }
        let r = nb.result.lock().unwrap_or_else(|e| e.into_inner()).clone();
        r.transpose().map_err(UmpError::Channel)
    })
}

/// The outcome of the last non-blocking read (`None` while it runs).
pub fn nbread_result(id: i32) -> Result<Option<usize>, UmpError> {
    nb_result(id, false)
}

/// The outcome of the last non-blocking write (`None` while it runs).
pub fn nbwrite_result(id: i32) -> Result<Option<()>, UmpError> {
    Ok(nb_result(id, true)?.map(|_| ()))
}
