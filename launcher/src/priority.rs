//! Which host threads run at real-time priority (`[qemu] io_realtime`,
//! `[qemu] qemu_realtime`).
//!
//! Under TCG a guest that waits for a message spins its vCPU thread, so
//! with two guests on two host cores both cores are busy. Every message
//! crosses other host threads too: the hub's (or the adapter's) threads,
//! and QEMU's main loop and vfio-user thread on the sender. A
//! normal-priority thread that wakes behind a spinning vCPU waits for the
//! scheduler's slice, about a millisecond, and that wait was most of a
//! small message's time (docs/adapter.md, "Host thread priority").
//!
//! - `io_realtime` (default on): the hub and the per-guest adapters run at
//!   SCHED_FIFO priority 1 from their start. They do microseconds of work
//!   per message and sleep again.
//! - `qemu_realtime` (default off): QEMU's threads other than its vCPUs
//!   too. Small messages gain again, but QEMU's vfio-user thread then wakes
//!   for every store and sends it alone, where at normal priority it packs
//!   the stores queued meanwhile into one message: a flood of stores ran
//!   about 20 times slower.
//!
//! vCPU threads always stay normal, so a spinning guest can never starve
//! the host. Without the right to do so (not root, no CAP_SYS_NICE)
//! everything stays normal; for QEMU the cluster's events say so.
//!
//! Threads: the supervisor's one thread, and `pre_exec` of its children.

use std::path::Path;

/// The real-time priority given (the lowest SCHED_FIFO one).
const PRIORITY: libc::c_int = 1;

/// Errors of raising a thread's priority.
#[derive(Debug, thiserror::Error)]
pub enum PriorityError {
    /// sched_setscheduler(2) refused.
    #[error("cannot make thread {tid} real-time: {err}")]
    Refused {
        /// The thread.
        tid: i32,
        /// Why.
        err: std::io::Error,
    },
    /// The process's threads could not be listed.
    #[error("cannot list the threads of process {pid}: {err}")]
    Threads {
        /// The process.
        pid: u32,
        /// Why.
        err: std::io::Error,
    },
}

/// Makes thread `tid` (0: the caller) SCHED_FIFO at [`PRIORITY`]; threads
/// it creates later inherit that. Async-signal-safe (one system call), so
/// it may run between fork and exec.
pub fn make_realtime(tid: i32) -> Result<(), std::io::Error> {
    let p = libc::sched_param { sched_priority: PRIORITY };
    // SAFETY: sched_setscheduler(2) with a valid sched_param on the stack.
    if unsafe { libc::sched_setscheduler(tid, libc::SCHED_FIFO, &p) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Whether a QEMU thread (named by `-name ...,debug-threads=on`) runs
/// guest code: `CPU 0/TCG`, `CPU 1/KVM`.
pub fn is_vcpu(comm: &str) -> bool {
    comm.starts_with("CPU ")
}

/// Makes every thread of QEMU process `pid` but its vCPU threads
/// real-time; returns how many it changed.
pub fn realtime_io_threads(pid: u32) -> Result<usize, PriorityError> {
    let dir = Path::new("/proc").join(pid.to_string()).join("task");
    let tasks = std::fs::read_dir(&dir).map_err(|err| PriorityError::Threads { pid, err })?;
    let mut n = 0;
    for t in tasks.flatten() {
        let Some(tid) = t.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if is_vcpu(comm.trim_end()) {
            continue;
        }
        match make_realtime(tid) {
            Ok(()) => n += 1,
            // The thread ended meanwhile.
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
            Err(err) => return Err(PriorityError::Refused { tid, err }),
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vcpu_threads_are_told_apart() {
        assert!(is_vcpu("CPU 0/TCG") && is_vcpu("CPU 3/KVM"));
        assert!(!is_vcpu("mc-node0") && !is_vcpu("vfio-user") && !is_vcpu("qemu-system-x86"));
    }

    /// A child made real-time with its vCPU-named thread left alone.
    #[test]
    fn io_threads_become_realtime_and_vcpus_do_not() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 5 & echo $!; wait"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        let r = realtime_io_threads(pid);
        let policy = |tid: u32| std::fs::read_to_string(format!("/proc/{tid}/stat")).unwrap();
        match r {
            Ok(n) => {
                assert_eq!(n, 1, "one thread in sh");
                // Field 41 of stat is the policy: 1 = SCHED_FIFO.
                let st = policy(pid);
                let after_comm = &st[st.rfind(')').unwrap() + 2..];
                let fields: Vec<&str> = after_comm.split(' ').collect();
                assert_eq!(fields[41 - 3], "1", "{st}");
            }
            Err(PriorityError::Refused { err, .. }) => assert_eq!(err.raw_os_error(), Some(libc::EPERM)),
            Err(e) => panic!("{e}"),
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}
