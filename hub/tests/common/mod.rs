//! What the hub's integration tests share: a simulated adapter, a raw
//! link client on a real hub's socket. Each test file uses part of it.
#![allow(dead_code)]

use std::io::{BufWriter, Write};
use std::path::Path;

use device::link_client::{self as client, Joined};
use link::{self as link, Msg, ANY_NODE};

/// A simulated adapter: a raw link client.
pub struct Sim {
    pub joined: Joined,
    pub r: std::os::unix::net::UnixStream,
    pub w: BufWriter<std::os::unix::net::UnixStream>,
    pub seq: u16,
    pub expect: u16,
    pub buf: Vec<u8>,
}

impl Sim {
    pub fn join(path: &Path, name: &str) -> Sim {
        Self::join_as(path, ANY_NODE, name)
    }

    pub fn join_as(path: &Path, want: u16, name: &str) -> Sim {
        let (joined, r, w) = client::join(path, want, 8192, 1024, name).expect("join");
        let expect = joined.next_link_seq;
        Sim { joined, r, w, seq: 1, expect, buf: Vec::new() }
    }

    pub fn write(&mut self, dest: u16, flags: u16, addr: u64, data: &[u8]) {
        let f = Msg::Write { dest, flags, addr, data }.encode();
        link::write_stamped(&mut self.w, &f, self.seq).unwrap();
        self.seq = self.seq.wrapping_add(1);
    }

    pub fn flush(&mut self) {
        self.w.flush().unwrap();
    }

    /// Next (seq, src, addr, data) delivery, skipping membership events;
    /// checks the link sequence on every frame.
    pub fn next_delivery(&mut self) -> (u64, u16, u64, Vec<u8>) {
        loop {
            let hdr = link::read_frame(&mut self.r, &mut self.buf).expect("read frame");
            assert_eq!(link::check_link_seq(&mut self.expect, hdr.link_seq), 0, "a frame went missing");
            match Msg::parse(&hdr, &self.buf).expect("valid frame") {
                Msg::Deliver { seq, src, addr, data, .. } => return (seq, src, addr, data.to_vec()),
                Msg::Member { .. } => continue,
                other => panic!("unexpected {other:?}"),
            }
        }
    }
}
