//! The command relay (seed 000: `imc_kill`): a request goes into the
//! sender's mailbox on imcd's relay page, the destination's imcd (woken by
//! the page's interrupt) runs the service and answers in the sender's
//! response row. Words: `imc_proto::layout::relay`.
//!
//! [`serve`] runs on the mapper thread; [`request`] on the main thread.

use std::time::{Duration, Instant};

use imc_proto::layout::{relay, MAX_NODES, RELAY_PAGE};

use crate::hw::Hw;
use crate::node::Node;

/// A relay request that got no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoAnswer;

/// Answers relay requests addressed to this node. `served[src]` is the
/// last sequence number served for `src`.
pub fn serve<H: Hw>(n: &Node<H>, served: &mut [u64; MAX_NODES]) {
    for src in (0..MAX_NODES).filter(|&s| s != n.me) {
        let w = |i: usize| n.word(RELAY_PAGE, src * relay::ROW + i);
        let seq = w(relay::SEQ);
        if seq == 0 || seq == served[src] || w(relay::DEST) != n.me as u64 {
            continue;
        }
        served[src] = seq;
        let status = match w(relay::SERVICE) {
            relay::SIGNAL => n.hw.signal(w(relay::PID), w(relay::SIG), w(relay::UID)),
            _ => libc::ENOSYS as u64,
        };
        let resp = relay::RESPONSES + src * relay::ROW;
        n.put(RELAY_PAGE, resp + relay::STATUS, status);
        n.put(RELAY_PAGE, resp + relay::SEQ, seq);
    }
}

/// Sends signal `sig` to `pid` on node `dest` for a sender with uid `uid`,
/// with sequence number `seq` (increasing, nonzero); returns the errno the
/// destination answered (0 = delivered), or [`NoAnswer`] if it did not
/// answer within `timeout` or left the cluster.
pub fn request<H: Hw>(
    n: &Node<H>,
    dest: usize,
    seq: u64,
    (pid, sig, uid): (u64, u64, u64),
    timeout: Duration,
) -> Result<u64, NoAnswer> {
    let row = n.me * relay::ROW;
    n.put(RELAY_PAGE, row + relay::DEST, dest as u64);
    n.put(RELAY_PAGE, row + relay::SERVICE, relay::SIGNAL);
    n.put(RELAY_PAGE, row + relay::PID, pid);
    n.put(RELAY_PAGE, row + relay::SIG, sig);
    n.put(RELAY_PAGE, row + relay::UID, uid);
    n.put(RELAY_PAGE, row + relay::SEQ, seq);
    let resp = relay::RESPONSES + row;
    let t0 = Instant::now();
    while n.word(RELAY_PAGE, resp + relay::SEQ) != seq {
        if t0.elapsed() > timeout || n.members() & (1 << dest) == 0 {
            return Err(NoAnswer);
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    Ok(n.word(RELAY_PAGE, resp + relay::STATUS))
}

/// The real cluster-signal service: kill(2) with the sender's uid checked
/// the way the local kernel would (root, or the same real uid).
pub fn deliver_signal(pid: u64, sig: u64, uid: u64) -> u64 {
    let (Ok(pid), Ok(sig)) = (libc::pid_t::try_from(pid), libc::c_int::try_from(sig)) else {
        return libc::EINVAL as u64;
    };
    if pid <= 0 {
        return libc::EINVAL as u64; // no process groups or broadcast across the cluster
    }
    if uid != 0 {
        let owner = std::fs::read_to_string(format!("/proc/{pid}/status")).ok().and_then(|s| {
            s.lines().find(|l| l.starts_with("Uid:")).and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        });
        match owner {
            None => return libc::ESRCH as u64,
            Some(o) if o != uid => return libc::EPERM as u64,
            _ => {}
        }
    }
    // SAFETY: kill(2) with checked arguments.
    if unsafe { libc::kill(pid, sig) } == 0 {
        0
    } else {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO) as u64
    }
}
