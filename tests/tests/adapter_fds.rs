//! The adapter closes every file descriptor it refuses. This counts the
//! whole process's open fds (`/proc/self/fd`), so it is the only test in
//! its binary: another test on another thread opens and closes sockets
//! and files, and a count of the process would measure those too. Run on
//! both kinds of port (`MC_TEST_PORTS`, see `common::ports`).

mod common;

use common::*;
use std::os::fd::AsRawFd;

use device::regs::{self, reg};

const EINVAL: u32 = libc::EINVAL as u32;

/// Open fds of this process.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// More fds with one message than the adapter takes (`max_msg_fds`): the
/// request is refused and every one of them is closed, message after
/// message; the connection goes on.
#[test]
fn extra_fds_are_refused_and_closed() {
    let hub = Hub::start();
    let a = AdapterHandle::start(&hub, "a");
    let mut c = a.client();
    let files: Vec<std::fs::File> = (0..12).map(|_| std::fs::File::open("/dev/null").unwrap()).collect();
    let raw: Vec<i32> = files.iter().map(|f| f.as_raw_fd()).collect();
    let mut body = Vec::with_capacity(32);
    body.extend_from_slice(&32u32.to_le_bytes());
    body.extend_from_slice(&3u32.to_le_bytes());
    body.extend_from_slice(&0u64.to_le_bytes());
    body.extend_from_slice(&0x10_0000u64.to_le_bytes());
    body.extend_from_slice(&0x1000u64.to_le_bytes());
    let before = open_fds();
    for _ in 0..50 {
        let (id, m) = c.encode(CMD_DMA_MAP, F_REQUEST, &body);
        c.send_with_fds(&m, &raw);
        let r = c.recv_reply(id, CMD_DMA_MAP);
        assert!(r.is_error() && r.error == EINVAL, "12 fds with one DMA_MAP: errno {}", r.error);
    }
    assert_eq!(c.reg(reg::ID), regs::ID_VALUE, "the connection goes on");
    let after = open_fds();
    assert!(after <= before + 2, "fds leaked: {before} open before, {after} after 50 messages of 12 fds");
    a.assert_alive();
}
