//! Lines with a file descriptor attached (SCM_RIGHTS over a Unix stream
//! socket): how `imcd` hands a process the adapter's device fd or a
//! region's receive buffer, and how the process receives it. Both sides
//! use this module (through `nix`); nothing else in the guest passes fds.
//!
//! Wire: one line per message; an fd travels with the line's first byte.
//! Threads: whoever owns the socket.

use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

/// Sends `line` with an optional fd attached to its first byte.
pub fn send_with_fd(sock: &UnixStream, line: &[u8], fd: Option<RawFd>) -> std::io::Result<()> {
    let Some(fd) = fd else {
        return (&*sock).write_all(line);
    };
    if line.is_empty() {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "an fd needs a byte to travel with"));
    }
    let fds = [fd];
    let cmsg = [ControlMessage::ScmRights(&fds)];
    let n = sendmsg::<()>(sock.as_raw_fd(), &[IoSlice::new(line)], &cmsg, MsgFlags::empty(), None)?;
    if n < line.len() {
        (&*sock).write_all(&line[n..])?;
    }
    Ok(())
}

/// Receives one line of at most `max` bytes, with the fd that came with
/// it (if any; extra fds are closed).
pub fn recv_line_with_fd(sock: &UnixStream, max: usize) -> std::io::Result<(String, Option<OwnedFd>)> {
    let mut first = [0u8; 1];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let mut fd = None;
    {
        let mut iov = [IoSliceMut::new(&mut first)];
        let msg = recvmsg::<()>(sock.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)?;
        if msg.bytes == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        for c in msg.cmsgs()? {
            if let ControlMessageOwned::ScmRights(fds) = c {
                for raw in fds {
                    // SAFETY: the kernel just installed `raw` in this
                    // process for us; nothing else owns it.
                    let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                    if fd.is_none() {
                        fd = Some(owned);
                    }
                }
            }
        }
    }
    // The rest of the line, a byte at a time: a buffered reader could take
    // bytes (and the fd) of the next message.
    let mut line = vec![first[0]];
    let mut b = [0u8; 1];
    while line.last() != Some(&b'\n') {
        if line.len() > max {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "line too long"));
        }
        match (&*sock).read(&mut b)? {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            _ => line.push(b[0]),
        }
    }
    String::from_utf8(line).map(|l| (l, fd)).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Seek;

    #[test]
    fn lines_carry_fds_and_the_fd_is_the_file_sent() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(b"behind the fd").unwrap();
        send_with_fd(&a, b"{\"x\":1}\n", Some(f.as_raw_fd())).unwrap();
        send_with_fd(&a, b"{\"y\":2}\n", None).unwrap();
        let (l1, fd1) = recv_line_with_fd(&b, 4096).unwrap();
        assert_eq!(l1, "{\"x\":1}\n");
        let mut got = std::fs::File::from(fd1.expect("an fd came with the first line"));
        got.rewind().unwrap();
        let mut s = String::new();
        got.read_to_string(&mut s).unwrap();
        assert_eq!(s, "behind the fd");
        let (l2, fd2) = recv_line_with_fd(&b, 4096).unwrap();
        assert_eq!(l2, "{\"y\":2}\n");
        assert!(fd2.is_none());
    }

    #[test]
    fn bad_lines_are_errors() {
        let (a, b) = UnixStream::pair().unwrap();
        (&a).write_all(&[b'x'; 100]).unwrap();
        assert_eq!(recv_line_with_fd(&b, 50).unwrap_err().kind(), std::io::ErrorKind::InvalidData);
        let (a, b) = UnixStream::pair().unwrap();
        (&a).write_all(b"half").unwrap();
        drop(a);
        assert_eq!(recv_line_with_fd(&b, 50).unwrap_err().kind(), std::io::ErrorKind::UnexpectedEof);
        let (a, _b) = UnixStream::pair().unwrap();
        let f = tempfile::tempfile().unwrap();
        assert!(send_with_fd(&a, b"", Some(f.as_raw_fd())).is_err());
    }
}
