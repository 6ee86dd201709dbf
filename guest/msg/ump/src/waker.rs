//! [`ListenWaker`]: sleeping until a listening handle may have a new
//! channel, instead of calling `wait` at intervals. An opener on this
//! guest drops a notice in the listener's folder (inotify sees it); an
//! opener on another guest stores its handle in the listener's inbox, a
//! page imcd watches for this process (the adapter interrupts, imcd adds
//! 1 to an eventfd: `docs/imc.md`, "Watching a region"). The waker polls
//! both fds.
//!
//! It says only that something may have arrived: [`crate::wait`] accepts
//! the channel. Made with the UMP state locked; [`ListenWaker::sleep`]
//! runs on the caller's thread without it.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::Duration;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

use crate::listen::listen_dir;
use crate::{with, UmpError};

/// Wakes a thread when a listener may have a new channel.
pub struct ListenWaker {
    /// The listener's folder of notices (openers on this guest).
    folder: Option<Inotify>,
    /// imcd's eventfd for the listener's inbox (openers on other guests).
    inbox: Option<OwnedFd>,
}

/// A waker for listening handle `local` (after [`crate::listen`]), made
/// once and slept on as often as needed. Without imcd it sees openers on
/// this guest only.
pub fn listen_waker(local: u64) -> Result<ListenWaker, UmpError> {
    with(|st| {
        if !st.listening.contains_key(&local) {
            return Err(UmpError::Invalid(format!("handle {local:#x} is not listening (call ump_listen first)")));
        }
        let os = |what: &str, e: nix::Error| UmpError::os(what, e);
        let folder = listen_dir(local);
        let folder = if folder.is_dir() {
            let ino = Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK).map_err(|e| os("inotify", e))?;
            ino.add_watch(&folder, AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO)
                .map_err(|e| os(&format!("inotify on {}", folder.display()), e))?;
            Some(ino)
        } else {
            None
        };
        let inbox = match (st.inboxes.get(&local), &st.imc) {
            (Some(inbox), Some(imc)) => Some(
                imc.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .watch(inbox.id)
                    .map_err(|e| UmpError::NoTransport(format!("imcd: watching the inbox: {e}")))?,
            ),
            _ => None,
        };
        Ok(ListenWaker { folder, inbox })
    })
}

impl ListenWaker {
    /// Sleeps until an opener may have come, or for `timeout`; true when
    /// something came. Takes what woke it, so the next sleep waits for
    /// something new.
    pub fn sleep(&self, timeout: Duration) -> bool {
        let mut fds = Vec::with_capacity(2);
        if let Some(f) = &self.folder {
            fds.push(PollFd::new(f.as_fd(), PollFlags::POLLIN));
        }
        if let Some(e) = &self.inbox {
            fds.push(PollFd::new(e.as_fd(), PollFlags::POLLIN));
        }
        if fds.is_empty() {
            std::thread::sleep(timeout);
            return false;
        }
        let ms = PollTimeout::try_from(timeout).unwrap_or(PollTimeout::MAX);
        if !matches!(poll(&mut fds, ms), Ok(n) if n > 0) {
            return false;
        }
        drop(fds);
        if let Some(f) = &self.folder {
            while f.read_events().is_ok_and(|e| !e.is_empty()) {}
        }
        if let Some(e) = &self.inbox {
            let _ = nix::unistd::read(e.as_raw_fd(), &mut [0u8; 8]);
        }
        true
    }
}
