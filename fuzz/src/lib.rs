//! Seed inputs for the fuzz targets, made by the encoders of the crates
//! under test (nothing binary is committed), and the one call that writes
//! them into a corpus folder.
//!
//! Each target calls [`write_seeds`] from its `init` block, once, on
//! libFuzzer's thread, before the corpus is read: when `FUZZ_SEED_DIR` is
//! set (by `scripts/fuzz.sh`), the seeds land in that folder and are read
//! with the rest of the corpus.

use std::path::Path;

use device::vfio_user::{irq, region, Command};
use vfio_user_wire::{self as wire, DmaFlags, IrqSetFlags};
use vm_memory::ByteValued;
use hub::hub::{Control, ControlReply, NodeStats};
use imc_proto::{encode_line, Reply, Request, Status};
use link::{Kind, Msg, AUTH_LEN, BROADCAST, FLAG_ACK, FLAG_LOOPBACK, HEADER_LEN};

/// Writes `seeds` as `seed-N` files into `$FUZZ_SEED_DIR`, when it is set.
pub fn write_seeds(seeds: Vec<Vec<u8>>) {
    let Some(dir) = std::env::var_os("FUZZ_SEED_DIR") else { return };
    let dir = Path::new(&dir);
    if let Err(e) = std::fs::create_dir_all(dir) {
        eprintln!("fuzz: cannot create seed folder {}: {e}", dir.display());
        return;
    }
    for (i, s) in seeds.iter().enumerate() {
        let path = dir.join(format!("seed-{i}"));
        if let Err(e) = std::fs::write(&path, s) {
            eprintln!("fuzz: cannot write {}: {e}", path.display());
        }
    }
}

/// One vfio-user request: header and body.
fn vfio_msg(id: u16, cmd: Command, body: &[u8]) -> Vec<u8> {
    wire::request(id, cmd, wire::HeaderFlags::empty(), &[body])
}

fn le(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// `vfio_user` seeds: byte 0 = fds, byte 1 = where they ride, then one
/// request of every command (and all of them in a row).
pub fn vfio_user() -> Vec<Vec<u8>> {
    let region_access = |offset: u64, region: u32, count: u32| wire::RegionAccess { offset, region, count };
    let set_irqs = |flags: IrqSetFlags, index: u32, start: u32, count: u32| wire::IrqSet {
        argsz: 20,
        flags: flags.bits(),
        index,
        start,
        count,
    };
    let info = |index: u32| wire::InfoRequest { argsz: 32, flags: 0, index };
    let write = le(&[region_access(8, region::BAR0 + 2, 4).as_slice(), &[1, 2, 3, 4]]);
    let mut multi = wire::WriteMulti { count: 2 }.as_slice().to_vec();
    for i in 0..2u64 {
        let e = wire::WriteMultiEntry { offset: i * 8, region: region::BAR0 + 2, count: 8, data: [0x5A; 8] };
        multi.extend_from_slice(e.as_slice());
    }
    let bools = le(&[set_irqs(IrqSetFlags::DATA_BOOL | IrqSetFlags::ACTION_TRIGGER, irq::MSI, 0, 2).as_slice(), &[1, 0]]);
    let eventfd = set_irqs(IrqSetFlags::DATA_EVENTFD | IrqSetFlags::ACTION_TRIGGER, irq::INTX, 0, 1);
    let rw = (DmaFlags::READ | DmaFlags::WRITE).bits();
    let map = wire::DmaMap { argsz: 32, flags: rw, offset: 0, addr: 0x10000, size: 0x1000 };
    let unmap = wire::DmaUnmap { argsz: 24, flags: 0, addr: 0x10000, size: 0x1000 };
    let version = le(&[wire::Version::default().as_slice(), b"{}\0"]);
    let msgs: Vec<(u8, Vec<u8>)> = vec![
        (0, vfio_msg(1, Command::Version, &version)),
        (0, vfio_msg(2, Command::DeviceGetInfo, &16u32.to_le_bytes())),
        (0, vfio_msg(3, Command::DeviceGetRegionInfo, info(region::CONFIG).as_slice())),
        (0, vfio_msg(4, Command::DeviceGetIrqInfo, info(irq::MSI).as_slice())),
        (0, vfio_msg(5, Command::RegionRead, region_access(0, region::CONFIG, 4).as_slice())),
        (0, vfio_msg(6, Command::RegionWrite, &write)),
        (0, vfio_msg(7, Command::RegionWriteMulti, &multi)),
        (0, vfio_msg(8, Command::DeviceSetIrqs, &bools)),
        (1, vfio_msg(9, Command::DeviceSetIrqs, eventfd.as_slice())),
        (1, vfio_msg(10, Command::DmaMap, map.as_slice())),
        (0, vfio_msg(11, Command::DmaUnmap, unmap.as_slice())),
        (0, vfio_msg(12, Command::DeviceReset, &[])),
        (0, vfio_msg(13, Command::DirtyPages, &[])),
    ];
    let mut seeds: Vec<Vec<u8>> = msgs.iter().map(|(fds, m)| le(&[&[*fds, 0], m])).collect();
    seeds.push(le(&[&[1, 128], &msgs.iter().flat_map(|(_, m)| m.clone()).collect::<Vec<u8>>()]));
    seeds
}

/// `link_frame` seeds: a frame of every kind (as a stream), and the same
/// payloads after a kind byte (the target seals them).
pub fn link_frame() -> Vec<Vec<u8>> {
    let data = [0xC3u8; 24];
    let msgs = [
        Msg::Hello { want_node: 1, page_size: 8192, aspace_pages: 64, auth: Some([7; AUTH_LEN]), name: "node1", keepalive: true },
        Msg::Hello { want_node: link::ANY_NODE, page_size: 4096, aspace_pages: 8, auth: None, name: "", keepalive: false },
        Msg::Welcome { node: 1, max_nodes: 4, next_seq: 9, members: vec![0, 1] },
        Msg::Write { dest: BROADCAST, flags: FLAG_LOOPBACK, addr: 0x2000, data: &data },
        Msg::Deliver { seq: 10, src: 0, flags: FLAG_ACK, addr: 0x4000, data: &data[..8] },
        Msg::Member { seq: 11, node: 2, up: true },
        Msg::Refuse { reason: "hub full" },
        Msg::Challenge { nonce: [3; AUTH_LEN] },
    ];
    let mut seeds = Vec::new();
    let mut stream = Vec::new();
    for m in &msgs {
        let f = m.encode();
        let kind = Kind::try_from(f[5]).expect("an encoded kind");
        seeds.push(f.clone());
        seeds.push(le(&[&[kind as u8], &f[HEADER_LEN..]]));
        stream.extend_from_slice(&f);
    }
    seeds.push(stream);
    seeds
}

/// `control_line` seeds: every request and every reply, as JSON lines.
pub fn control_line() -> Vec<Vec<u8>> {
    let reqs = [
        Control::Stats,
        Control::LinkDown { node: 1 },
        Control::LinkUp { node: 1 },
        Control::Corrupt { node: 2, count: 3 },
        Control::Delay { node: 0, micros: 500 },
    ];
    let replies = [
        ControlReply::Ok,
        ControlReply::Error { message: "node 9 is not connected".into() },
        ControlReply::Stats {
            next_seq: 5,
            nodes: vec![NodeStats {
                node: 0,
                name: "node0".into(),
                writes_in: 1,
                bytes_in: 8,
                frames_out: 2,
                queued: 0,
                corrupted: 0,
                dropped: 0,
                link_gaps: 0,
                dma_descs: Some(3),
                dma_bytes: None,
                faults: None,
            }],
            held_down: vec![1],
            rejected: 0,
            stalled: 0,
            unauthenticated: 1,
            unauthenticated_closed: 0,
            auth_timeouts: 0,
            control_connections: 1,
            control_closed: 0,
            control_idle_closed: 0,
        },
    ];
    let mut seeds: Vec<Vec<u8>> = reqs.iter().map(|r| serde_json::to_vec(r).expect("encodes")).collect();
    seeds.extend(replies.iter().map(|r| serde_json::to_vec(r).expect("encodes")));
    seeds
}

/// `imc_line` seeds: every request and every reply, as lines without
/// their newline.
pub fn imc_line() -> Vec<Vec<u8>> {
    let reqs = [
        Request::Asalloc { key: 55, size: 16384, mode: 0o666, exclusive: true, coherent: true },
        Request::Lkalloc { key: 7, nlocks: 4, mode: 0o600, creator: true },
        Request::Regs,
        Request::ErrCount,
        Request::AckPage { transmit: true },
        Request::Dealloc { id: 3 },
        Request::Find { key: 55 },
        Request::Hosts,
        Request::Kill { host: "node1".into(), pid: 42, sig: 15 },
        Request::AbandonUpdate { id: 1 },
        Request::Asattach { id: 3, transmit: false, loopback: true, p2p: None },
    ];
    let replies = [
        Reply::Done,
        Reply::Region { id: 3, first_page: 16, pages: 2, created: true },
        Reply::LockSet { id: 4, nlocks: 4, node: 1, created: false, placed_bid: 9 },
        Reply::Hosts { hosts: vec![(0, "node0".into()), (1, "node1".into())] },
        Reply::Mapping { offset: 0x2000, len: 0x4000 },
        Reply::error(Status::NotFound, "no region with key 55"),
    ];
    let line = |mut v: Vec<u8>| {
        v.pop();
        v
    };
    let mut seeds: Vec<Vec<u8>> = reqs.iter().map(|r| line(encode_line(r))).collect();
    seeds.extend(replies.iter().map(|r| line(encode_line(r))));
    seeds
}
