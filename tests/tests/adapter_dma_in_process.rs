//! The adapter's transmit DMA engine (`docs/adapter.md`, "Transmit DMA"),
//! driven in process the way QEMU drives it: a real hub, real vfio-user
//! sockets, descriptor rings and source buffers in memfd guest RAM that the
//! adapter maps, receivers' memory written by their adapters.
//!
//! Every node maps `ram(span)` bytes of its memfd at [`IOVA`], starting at
//! [`RAM_OFF`] in the file:
//!
//! ```text
//! 0            RING_BYTES        SRC_OFF             SRC_OFF + span      SRC_OFF + 2 span
//! | ring          | (unused)        | source buffer     | receive buffers   |
//! ```
//!
//! MEMORY CHANNEL page `p` is received at `SRC_OFF + span + p * 8 KiB`.

mod common;

use common::*;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use device::regs::dma::{self, status, DONE};
use device::regs::{caps, err, int, pct, reg, BAR_TX, NOTIFY_EMPTY, PAGE_SIZE};
use hub::hub::Control;

const IOVA: u64 = 0x10_0000;
const RAM_OFF: u64 = 0x2000;
const SRC_OFF: u64 = 0x1_0000;
const RING_SIZE: u32 = 16;
const PAGE: u64 = PAGE_SIZE;

/// The part of a node's memory a test uses: `span` bytes of MEMORY
/// CHANNEL space (from address 0), as much source buffer.
#[derive(Clone, Copy)]
struct Layout {
    span: u64,
}

impl Layout {
    fn ram(self) -> u64 {
        SRC_OFF + 2 * self.span
    }
    fn pages(self) -> u64 {
        self.span / PAGE_SIZE
    }
    fn src_iova(self, off: u64) -> u64 {
        IOVA + SRC_OFF + off
    }
    fn src_file(self, off: u64) -> u64 {
        RAM_OFF + SRC_OFF + off
    }
    fn rx_iova(self, page: u64) -> u64 {
        IOVA + SRC_OFF + self.span + page * PAGE_SIZE
    }
    /// File offset where MEMORY CHANNEL address `addr` lands in a receiver.
    fn rx_file(self, addr: u64) -> u64 {
        RAM_OFF + SRC_OFF + self.span + addr
    }
    fn start(self, hub: &Hub, name: &str, aspace: u64) -> Node {
        Node::start_aspace(hub, name, aspace, IOVA, RAM_OFF, self.ram())
    }
    /// On a local port whatever `MC_TEST_PORTS` says: the hub's delay
    /// slows every delivery to a local port (a link port's writer holds
    /// back a batch, not each frame).
    fn start_local(self, hub: &Hub, name: &str, aspace: u64) -> Node {
        Node::start_local_aspace(hub, name, aspace, IOVA, RAM_OFF, self.ram())
    }
}

const SMALL: Layout = Layout { span: ASPACE };

/// A descriptor as the driver writes it.
#[derive(Clone, Copy, Debug)]
struct Desc {
    src: u64,
    dest: u64,
    len: u32,
    flags: u32,
}

fn ring_setup(n: &mut Node, size: u32) {
    n.vfio.set_reg(reg::DMA_RING_LO, IOVA as u32);
    n.vfio.set_reg(reg::DMA_RING_HI, (IOVA >> 32) as u32);
    n.vfio.set_reg(reg::DMA_RING_SIZE, size);
}

fn desc_file(idx: u32, size: u32) -> u64 {
    RAM_OFF + (idx % size) as u64 * dma::DESC_SIZE
}

/// Writes descriptor `idx` (status 0) into the ring in the node's memory.
fn post(n: &Node, idx: u32, size: u32, d: Desc) {
    let mut b = Vec::with_capacity(32);
    b.extend_from_slice(&d.src.to_le_bytes());
    b.extend_from_slice(&d.dest.to_le_bytes());
    b.extend_from_slice(&d.len.to_le_bytes());
    b.extend_from_slice(&d.flags.to_le_bytes());
    b.extend_from_slice(&[0; 8]);
    n.ram.write(desc_file(idx, size), &b);
}

/// Rings the doorbell with a posted write, as a guest's MMIO store is.
fn doorbell(n: &mut Node, tail: u32) {
    n.vfio.region_write(device::regs::BAR_REGS, reg::DMA_TAIL, &tail.to_le_bytes(), true);
}

/// (status, bytes) written back into descriptor `idx`, if retired.
fn written_back(n: &Node, idx: u32, size: u32) -> Option<(u32, u32)> {
    let b = n.ram.read(desc_file(idx, size) + dma::BYTES, 8);
    let bytes = u32::from_le_bytes(b[..4].try_into().unwrap());
    let st = u32::from_le_bytes(b[4..].try_into().unwrap());
    (st & DONE != 0).then_some((st & 0xFF, bytes))
}

fn wait_retired(n: &Node, idx: u32, size: u32) -> (u32, u32) {
    poll(&format!("descriptor {idx} to be retired"), || written_back(n, idx, size))
}

/// Deterministic bytes for round `r`.
fn pattern(r: u64, len: usize) -> Vec<u8> {
    (0..len as u64).map(|i| (i.wrapping_mul(31).wrapping_add(r.wrapping_mul(131)) % 251) as u8).collect()
}

/// A sender with TX on every page of `l` and a receiver with RX on every page.
fn pair(hub: &Hub, l: Layout, aspace: u64) -> (Node, Node) {
    let mut a = l.start(hub, "a", aspace);
    let mut b = l.start(hub, "b", aspace);
    for p in 0..l.pages() {
        a.vfio.set_pct(p, pct::TX, 0);
        b.vfio.set_pct(p, pct::RX, l.rx_iova(p));
    }
    (a, b)
}

#[test]
fn dma_ring_sends_descriptors_in_order_and_wraps() {
    let hub = Hub::start();
    let l = SMALL;
    let (mut a, mut b) = pair(&hub, l, ASPACE);
    assert_eq!(a.vfio.reg(reg::CAPS), caps::TX_DMA);
    assert_eq!(a.vfio.reg(reg::ID), device::regs::ID_VALUE, "ID unchanged by the extension");
    let efd = eventfd();
    a.vfio.set_irqs(IRQ_MSIX, IRQ_DATA_EVENTFD | IRQ_ACTION_TRIGGER, 0, 1, &[std::os::fd::AsRawFd::as_raw_fd(&efd)]);
    a.vfio.set_reg(reg::INT_MASK, int::DMA);

    let src = pattern(1, 64 << 10);
    a.ram.write(l.src_file(0), &src);
    ring_setup(&mut a, 4);
    assert_eq!(a.vfio.reg(reg::DMA_RING_LO), IOVA as u32);
    assert_eq!(a.vfio.reg(reg::DMA_RING_SIZE), 4);
    // Six descriptors through a ring of four: unaligned sources,
    // destinations and lengths, page crossings, in two doorbells.
    let descs = [
        (0u64, 0u64, 1u32),
        (1, 3, 100),
        (5000, 8190, 20),              // crosses a page boundary
        (7, 3 * PAGE_SIZE + 1, 20000), // three pages
        (40000, 10 * PAGE_SIZE, 8192),
        (123, 20 * PAGE_SIZE + 4096, 10000),
    ];
    for (i, &(s, d, n)) in descs.iter().enumerate().take(4) {
        let flags = if i == 3 { dma::flags::INT } else { 0 };
        post(&a, i as u32, 4, Desc { src: l.src_iova(s), dest: d, len: n, flags });
    }
    doorbell(&mut a, 4);
    for i in 0..4 {
        assert_eq!(wait_retired(&a, i, 4), (status::OK, descs[i as usize].2), "descriptor {i}");
    }
    assert!(wait_eventfd(&efd, Duration::from_secs(5)).is_some(), "no MSI-X for a descriptor with INT");
    assert_eq!(a.vfio.reg(reg::INT_CAUSE) & int::DMA, int::DMA);
    a.vfio.set_reg(reg::INT_CAUSE, int::DMA);
    for (i, &(s, d, n)) in descs.iter().enumerate().skip(4) {
        post(&a, i as u32, 4, Desc { src: l.src_iova(s), dest: d, len: n, flags: 0 });
    }
    doorbell(&mut a, 6);
    for i in 4..6 {
        assert_eq!(wait_retired(&a, i, 4), (status::OK, descs[i as usize].2), "descriptor {i}");
    }
    poll("DMA_HEAD to reach 6", || (a.vfio.reg(reg::DMA_HEAD) == 6).then_some(()));
    assert_eq!(a.vfio.reg(reg::DMA_TAIL), 6);
    assert_eq!(a.vfio.reg(reg::DMA_DESCS), 6);
    let total: u32 = descs.iter().map(|d| d.2).sum();
    assert_eq!(a.vfio.reg(reg::DMA_BYTES), total);
    // One packet per page touched.
    let packets: u64 = descs.iter().map(|&(_, d, n)| (d + n as u64 - 1) / PAGE_SIZE - d / PAGE_SIZE + 1).sum();
    assert_eq!(a.vfio.reg(reg::TX_PACKETS) as u64, packets);
    assert_eq!(a.vfio.reg(reg::DMA_STATUS), 0, "idle, no error");
    assert_eq!(a.vfio.reg(reg::ERR_STATUS), 0);
    assert_eq!(a.vfio.reg(reg::INT_CAUSE) & int::DMA, 0, "only descriptors with INT raise DMA");

    poll("B to apply every packet", || (b.vfio.reg(reg::RX_PACKETS) as u64 == packets).then_some(()));
    let all = b.ram.all();
    let mut keep = Vec::new();
    for &(s, d, n) in &descs {
        let at = l.rx_file(d) as usize;
        assert_eq!(&all[at..at + n as usize], &src[s as usize..s as usize + n as usize], "descriptor to {d:#x}");
        keep.push((at, n as usize));
    }
    for (i, x) in all.iter().enumerate() {
        assert!(*x == 0 || keep.iter().any(|&(s, n)| (s..s + n).contains(&i)), "B's byte {i:#x} written");
    }
    assert_eq!(b.vfio.reg(reg::ERR_COUNT), 0);
}

/// B receives every page of `l` and has INT on `int_pages`.
fn int_pages(b: &mut Node, l: Layout, pages: &[u64]) {
    for &p in pages {
        b.vfio.set_pct(p, pct::RX | pct::INT, l.rx_iova(p));
    }
}

fn drain_fifo(n: &mut Node) -> Vec<u32> {
    let mut v = Vec::new();
    loop {
        let p = n.vfio.reg(reg::NOTIFY_FIFO);
        if p == NOTIFY_EMPTY {
            return v;
        }
        v.push(p);
    }
}

/// Stores before the doorbell reach receivers before the DMA's packets,
/// stores after it after them: B's notification FIFO lists the pages in
/// the global order, and a word written by a store and then by the DMA
/// (or the other way round) holds the later one.
#[test]
fn dma_doorbell_is_ordered_between_the_stores_around_it() {
    let hub = Hub::start();
    let l = SMALL;
    let (mut a, mut b) = pair(&hub, l, ASPACE);
    // Page 1: a store; pages 2..10: the DMA (64 KiB); page 10: a store.
    int_pages(&mut b, l, &(1..=10).collect::<Vec<_>>());
    ring_setup(&mut a, RING_SIZE);
    let data = pattern(7, 64 << 10);
    a.ram.write(l.src_file(0), &data);
    for round in 0..10u32 {
        let before = 0x1111_0000_0000_0000u64 | round as u64;
        let after = 0x2222_0000_0000_0000u64 | round as u64;
        post(&a, round, RING_SIZE, Desc { src: l.src_iova(0), dest: 2 * PAGE_SIZE, len: 64 << 10, flags: 0 });
        // All posted, back to back, as a guest's stores are.
        a.vfio.region_write(BAR_TX, PAGE_SIZE, &before.to_le_bytes(), true);
        a.vfio.region_write(BAR_TX, 2 * PAGE_SIZE, &before.to_le_bytes(), true); // overwritten by the DMA
        doorbell(&mut a, round + 1);
        a.vfio.region_write(BAR_TX, 9 * PAGE_SIZE + 8, &after.to_le_bytes(), true); // overwrites the DMA
        a.vfio.region_write(BAR_TX, 10 * PAGE_SIZE, &after.to_le_bytes(), true);
        assert_eq!(wait_retired(&a, round, RING_SIZE).0, status::OK);
        poll("the last store to reach B", || {
            (b.ram.read(l.rx_file(10 * PAGE_SIZE), 8) == after.to_le_bytes()).then_some(())
        });
        let fifo = drain_fifo(&mut b);
        assert_eq!(fifo, vec![1, 2, 2, 3, 4, 5, 6, 7, 8, 9, 9, 10], "round {round}: B's notifications out of order");
        assert_eq!(
            b.ram.read(l.rx_file(2 * PAGE_SIZE), 8),
            data[..8],
            "the store before the doorbell came after the DMA"
        );
        assert_eq!(
            b.ram.read(l.rx_file(9 * PAGE_SIZE + 8), 8),
            after.to_le_bytes(),
            "the store after the doorbell came before the DMA"
        );
        // The rest of the DMA's data, up to the word the later store replaced.
        let rest = 7 * PAGE as usize;
        assert!(b.ram.read(l.rx_file(2 * PAGE_SIZE + 8), rest) == data[8..8 + rest], "round {round}: DMA data");
    }
    assert_eq!(a.vfio.reg(reg::ERR_COUNT), 0);
    assert_eq!(b.vfio.reg(reg::ERR_COUNT), 0);
}

/// A receiver that sees a flag stored after the doorbell sees all of the
/// DMA's data: a reader thread polls B's memory for the flag of each round
/// and then checks the data, while A goes on with the next round.
#[test]
fn dma_data_is_visible_to_whoever_sees_a_later_flag() {
    let hub = Hub::start();
    let l = SMALL;
    let (mut a, b) = pair(&hub, l, ASPACE);
    ring_setup(&mut a, RING_SIZE);
    const LEN: usize = 96 << 10;
    const ROUNDS: u64 = 24;
    let flag_addr = 15 * PAGE_SIZE;
    let (tx, rx) = mpsc::channel::<u64>();
    let ram = b.ram.file.try_clone().unwrap();
    let reader = std::thread::spawn(move || {
        use std::os::unix::fs::FileExt;
        let mut seen = 0;
        let t0 = Instant::now();
        while seen < ROUNDS {
            let mut f = [0u8; 8];
            ram.read_exact_at(&mut f, l.rx_file(flag_addr)).unwrap();
            let r = u64::from_le_bytes(f);
            if r > seen {
                let mut d = vec![0u8; LEN];
                ram.read_exact_at(&mut d, l.rx_file(0)).unwrap();
                // Rounds only move forward: the data is round r's or later's.
                let ok = (r..=ROUNDS).any(|k| d == pattern(k, LEN));
                assert!(ok, "B saw flag {r} without the data of round {r}");
                seen = r;
                tx.send(r).unwrap();
            }
            assert!(t0.elapsed() < Duration::from_secs(60), "reader saw only {seen} rounds");
        }
    });
    for r in 1..=ROUNDS {
        // The source is rewritten only after the previous round was retired.
        a.ram.write(l.src_file(0), &pattern(r, LEN));
        let idx = (r - 1) as u32;
        post(&a, idx, RING_SIZE, Desc { src: l.src_iova(0), dest: 0, len: LEN as u32, flags: 0 });
        doorbell(&mut a, idx + 1);
        a.vfio.region_write(BAR_TX, flag_addr, &r.to_le_bytes(), true);
        assert_eq!(wait_retired(&a, idx, RING_SIZE).0, status::OK);
        // Next round once the reader has checked this one (its data is not
        // overwritten under it).
        loop {
            let got = rx.recv_timeout(Duration::from_secs(10)).expect("reader checked the round");
            if got >= r {
                break;
            }
        }
    }
    reader.join().expect("reader");
}

/// Every kind of bad input gets an error status, the DMA error bit and one
/// count in ERR_COUNT, and nothing reaches anybody's memory.
#[test]
fn dma_bad_input_gets_errors_not_memory() {
    let hub = Hub::start();
    let l = SMALL;
    let (mut a, mut b) = pair(&hub, l, ASPACE);
    // Page 10: no TX; page 11: P2P to a node outside the ports; page 12: ACK.
    a.vfio.set_pct(10, 0, 0);
    a.vfio.set_pct(11, pct::TX | pct::P2P | (0xFFFF << pct::DEST_SHIFT), 0);
    a.vfio.set_pct(12, pct::TX | pct::ACK, 0);
    a.ram.write(l.src_file(0), &pattern(3, 64 << 10));
    let a_before = a.ram.all();
    ring_setup(&mut a, RING_SIZE);
    let ram_end = IOVA + l.ram();
    let cases: [(&str, Desc, u32); 11] = [
        ("unmapped source", Desc { src: 0x7000_0000, dest: 0, len: 64, flags: 0 }, status::SRC_UNMAPPED),
        ("source past its map", Desc { src: ram_end - 100, dest: 0, len: 200, flags: 0 }, status::SRC_UNMAPPED),
        ("source wraps", Desc { src: u64::MAX - 10, dest: 0, len: 64, flags: 0 }, status::SRC_UNMAPPED),
        ("past the address space", Desc { src: l.src_iova(0), dest: ASPACE - 8, len: 16, flags: 0 }, status::RANGE),
        ("address wraps", Desc { src: l.src_iova(0), dest: u64::MAX - 4, len: 16, flags: 0 }, status::RANGE),
        // The first page is fine: nothing is sent, not even it.
        (
            "into a page without TX",
            Desc { src: l.src_iova(0), dest: 10 * PAGE_SIZE - 8, len: 16, flags: 0 },
            status::TX_DISABLED,
        ),
        ("P2P outside the ports", Desc { src: l.src_iova(0), dest: 11 * PAGE_SIZE, len: 8, flags: 0 }, status::TX_DEST),
        ("ACK page", Desc { src: l.src_iova(0), dest: 12 * PAGE_SIZE, len: 8, flags: 0 }, status::ACK_PAGE),
        ("zero length", Desc { src: l.src_iova(0), dest: 0, len: 0, flags: 0 }, status::BAD_DESC),
        ("undefined flags", Desc { src: l.src_iova(0), dest: 0, len: 8, flags: 0x8000 }, status::BAD_DESC),
        ("4 GiB - 1 bytes", Desc { src: l.src_iova(0), dest: 0, len: u32::MAX, flags: 0 }, status::RANGE),
    ];
    let mut count = 0;
    for (i, (what, d, code)) in cases.iter().enumerate() {
        post(&a, i as u32, RING_SIZE, *d);
        doorbell(&mut a, i as u32 + 1);
        assert_eq!(wait_retired(&a, i as u32, RING_SIZE), (*code, 0), "{what}");
        count += 1;
        assert_eq!(a.vfio.reg(reg::ERR_STATUS), err::DMA, "{what}");
        assert_eq!(a.vfio.reg(reg::ERR_COUNT), count, "{what}: one error");
        assert_eq!(a.vfio.reg(reg::DMA_STATUS), *code, "{what}");
        a.vfio.set_reg(reg::ERR_STATUS, err::DMA);
    }
    assert_eq!(a.vfio.reg(reg::DMA_DESCS), cases.len() as u32);
    assert_eq!(a.vfio.reg(reg::DMA_BYTES), 0);
    assert_eq!(a.vfio.reg(reg::TX_PACKETS), 0);
    let mut next = cases.len() as u32;

    // A doorbell that posts more than the ring holds, or goes backwards.
    doorbell(&mut a, next + RING_SIZE + 1);
    assert_eq!(a.vfio.reg(reg::DMA_STATUS), status::OVERFLOW);
    count += 1;
    assert_eq!(a.vfio.reg(reg::ERR_COUNT), count);
    doorbell(&mut a, next - 1);
    assert_eq!(a.vfio.reg(reg::DMA_STATUS), status::OVERFLOW);
    count += 1;
    assert_eq!(a.vfio.reg(reg::ERR_COUNT), count);
    assert_eq!(a.vfio.reg(reg::DMA_TAIL), next, "a bad doorbell is ignored");
    assert_eq!(a.vfio.reg(reg::DMA_HEAD), next);

    // A ring outside guest memory: nothing to read, nothing written.
    a.vfio.set_reg(reg::DMA_RING_LO, 0x7000_0000);
    a.vfio.set_reg(reg::DMA_RING_SIZE, RING_SIZE);
    doorbell(&mut a, 1);
    poll("the ring fault", || (a.vfio.reg(reg::DMA_STATUS) == status::RING).then_some(()));
    count += 1;
    assert_eq!(a.vfio.reg(reg::ERR_COUNT), count);
    assert_eq!((a.vfio.reg(reg::DMA_HEAD), a.vfio.reg(reg::DMA_TAIL)), (0, 0), "posted descriptors dropped");
    // A ring straddling the end of guest memory: the first descriptors are
    // read, the one past the end is a fault.
    ring_setup(&mut a, RING_SIZE);
    a.vfio.set_reg(reg::DMA_RING_LO, (ram_end - 32) as u32);
    doorbell(&mut a, 2);
    // Descriptor 0 there is all zero (BAD_DESC, written back in the map's
    // last 8 bytes); descriptor 1 is past the end (RING).
    poll("the second ring fault", || (a.vfio.reg(reg::ERR_COUNT) == count + 2).then_some(()));
    assert_eq!(a.vfio.reg(reg::DMA_STATUS), status::RING);
    assert_eq!(a.vfio.reg(reg::DMA_HEAD), 1);
    count += 2;
    // Bad ring sizes and a doorbell on a ring that is off.
    a.vfio.set_reg(reg::DMA_RING_SIZE, 3);
    assert_eq!(a.vfio.reg(reg::DMA_RING_SIZE), 0);
    assert_eq!(a.vfio.reg(reg::DMA_STATUS), status::RING);
    a.vfio.set_reg(reg::DMA_RING_SIZE, dma::MAX_RING * 2);
    doorbell(&mut a, 1);
    assert_eq!(a.vfio.reg(reg::DMA_STATUS), status::RING);
    assert!(a.vfio.reg(reg::ERR_COUNT) >= count + 3, "bad ring sizes and the doorbell counted");
    count = a.vfio.reg(reg::ERR_COUNT);

    // Bus mastering off: the engine cannot even read the ring.
    ring_setup(&mut a, RING_SIZE);
    next = 0;
    post(&a, next, RING_SIZE, Desc { src: l.src_iova(0), dest: 0, len: 8, flags: 0 });
    a.vfio.region_write(CONFIG_REGION, PCI_COMMAND, &0u16.to_le_bytes(), false);
    doorbell(&mut a, next + 1);
    poll("NO_BUS_MASTER", || (a.vfio.reg(reg::DMA_STATUS) == status::NO_BUS_MASTER).then_some(()));
    assert_eq!(a.vfio.reg(reg::ERR_COUNT), count + 1);
    assert_eq!(written_back(&a, next, RING_SIZE), None, "nothing written without bus mastering");
    a.vfio.region_write(CONFIG_REGION, PCI_COMMAND, &PCI_COMMAND_MEMORY_MASTER.to_le_bytes(), false);
    // And the engine works again afterwards, from where it stopped.
    doorbell(&mut a, next + 1);
    assert_eq!(wait_retired(&a, next, RING_SIZE), (status::OK, 8));

    // Nobody's memory was touched but by that last descriptor; A's memory only in its ring.
    poll("B to receive the good descriptor", || (b.vfio.reg(reg::RX_PACKETS) == 1).then_some(()));
    let all = b.ram.all();
    for (i, x) in all.iter().enumerate() {
        let at = l.rx_file(0) as usize;
        assert!(*x == 0 || (at..at + 8).contains(&i), "B's byte {i:#x} was written");
    }
    let a_after = a.ram.all();
    let ring_bytes = RAM_OFF as usize..(RAM_OFF + RING_SIZE as u64 * dma::DESC_SIZE) as usize;
    let ram_tail = (RAM_OFF + l.ram() - 8) as usize..(RAM_OFF + l.ram()) as usize;
    for i in 0..a_after.len() {
        if a_after[i] != a_before[i] {
            assert!(ring_bytes.contains(&i) || ram_tail.contains(&i), "A's byte {i:#x} changed outside its ring");
        }
    }
    assert_eq!(b.vfio.reg(reg::ERR_COUNT), 0);
    a.adapter.assert_alive();
}

/// A hub whose ports hold few frames: a delayed receiver holds its senders
/// back after 16 (as a slow receiver on the shared bus does), instead of
/// taking a whole transfer into its queue.
fn slow_hub() -> Hub {
    Hub::start_with(hub::hub::HubConfig { queue_depth: 16, ..Default::default() })
}

/// A transfer long enough to be interrupted: B's local port delays every
/// delivery, so 4 MiB in 512 packets take about 0.5 s (on a [`slow_hub`]).
fn slow_transfer(hub: &Hub) -> (Layout, Node, Node) {
    let l = Layout { span: 4 << 20 };
    let mut a = l.start(hub, "a", 8 << 20);
    let mut b = l.start_local(hub, "b", 8 << 20);
    for p in 0..l.pages() {
        a.vfio.set_pct(p, pct::TX, 0);
        b.vfio.set_pct(p, pct::RX, l.rx_iova(p));
    }
    a.ram.write(l.src_file(0), &pattern(5, l.span as usize));
    hub.control_ok(Control::Delay { node: b.adapter.node, micros: 1000 });
    ring_setup(&mut a, RING_SIZE);
    post(&a, 0, RING_SIZE, Desc { src: l.src_iova(0), dest: 0, len: l.span as u32, flags: 0 });
    post(&a, 1, RING_SIZE, Desc { src: l.src_iova(0), dest: 0, len: 8, flags: 0 });
    (l, a, b)
}

#[test]
fn dma_reset_in_the_middle_aborts_with_an_error() {
    let hub = slow_hub();
    let (l, mut a, mut b) = slow_transfer(&hub);
    doorbell(&mut a, 2);
    poll("the transfer to start", || (a.vfio.reg(reg::DMA_BYTES) > 0).then_some(()));
    assert_ne!(a.vfio.reg(reg::DMA_STATUS) & dma::BUSY, 0, "busy while sending");
    a.vfio.set_reg(reg::CTRL, device::regs::ctrl::RESET);
    let (code, bytes) = written_back(&a, 0, RING_SIZE).expect("the descriptor in progress is written back");
    assert_eq!(code, status::ABORTED);
    assert!(bytes > 0 && (bytes as u64) < l.span && bytes as u64 % PAGE_SIZE == 0, "{bytes} bytes sent");
    assert_eq!(written_back(&a, 1, RING_SIZE), None, "the next descriptor is dropped, not written");
    assert_eq!(a.vfio.reg(reg::ERR_STATUS), err::DMA);
    assert_eq!(a.vfio.reg(reg::ERR_COUNT), 1);
    assert_eq!(a.vfio.reg(reg::DMA_STATUS), status::ABORTED);
    assert_eq!(a.vfio.reg(reg::DMA_RING_SIZE), 0, "the reset turned the ring off");
    assert_eq!(a.vfio.reg(reg::DMA_BYTES), 0);
    // B received exactly the pages sent before the abort, and nothing else.
    hub.control_ok(Control::Delay { node: b.adapter.node, micros: 0 });
    let pages = bytes as u64 / PAGE_SIZE;
    poll("B to apply what was sent", || (b.vfio.reg(reg::RX_PACKETS) as u64 == pages).then_some(()));
    let got = b.ram.read(l.rx_file(0), l.span as usize);
    let want = pattern(5, l.span as usize);
    assert_eq!(&got[..bytes as usize], &want[..bytes as usize]);
    assert!(got[bytes as usize..].iter().all(|&x| x == 0), "B received past the abort");
}

#[test]
fn dma_client_gone_in_the_middle_aborts_with_an_error() {
    let hub = slow_hub();
    let (l, mut a, b) = slow_transfer(&hub);
    doorbell(&mut a, 2);
    poll("the transfer to start", || (a.vfio.reg(reg::DMA_BYTES) > 0).then_some(()));
    // QEMU exits; a new one connects (the adapter keeps its state).
    a.reconnect(IOVA, RAM_OFF, l.ram());
    let (code, bytes) = poll("descriptor 0 written back", || written_back(&a, 0, RING_SIZE));
    assert_eq!(code, status::ABORTED);
    assert!((bytes as u64) < l.span, "{bytes} bytes sent");
    assert_eq!(written_back(&a, 1, RING_SIZE), None);
    let es = a.vfio.reg(reg::ERR_STATUS);
    assert_ne!(es & err::DMA, 0, "ERR_STATUS {es:#x}");
    assert_eq!(a.vfio.reg(reg::DMA_STATUS), status::ABORTED);
    assert_eq!(a.vfio.reg(reg::DMA_HEAD), 1);
    assert_eq!(a.vfio.reg(reg::DMA_TAIL), 1, "the rest was dropped");
    hub.control_ok(Control::Delay { node: b.adapter.node, micros: 0 });
    let got = b.ram.read(l.rx_file(0), l.span as usize);
    assert!(got[bytes as usize..].iter().all(|&x| x == 0), "B received past the abort");
    // The adapter goes on: a new transfer after a reset.
    a.vfio.set_reg(reg::CTRL, device::regs::ctrl::RESET);
    a.vfio.region_write(CONFIG_REGION, PCI_COMMAND, &PCI_COMMAND_MEMORY_MASTER.to_le_bytes(), false);
    for p in 0..l.pages() {
        a.vfio.set_pct(p, pct::TX, 0);
    }
    ring_setup(&mut a, RING_SIZE);
    post(&a, 0, RING_SIZE, Desc { src: l.src_iova(0), dest: 0, len: 16 << 10, flags: 0 });
    doorbell(&mut a, 1);
    assert_eq!(wait_retired(&a, 0, RING_SIZE), (status::OK, 16 << 10));
    a.adapter.assert_alive();
}

/// 4 MiB from A arrive intact at B and C, and the counters show the
/// engine moved them: 512 packets of 8 KiB.
#[test]
fn dma_4mib_reaches_two_receivers_intact() {
    let hub = Hub::start();
    let l = Layout { span: 4 << 20 };
    let (mut a, mut b) = pair(&hub, l, 8 << 20);
    let mut c = l.start(&hub, "c", 8 << 20);
    for p in 0..l.pages() {
        c.vfio.set_pct(p, pct::RX, l.rx_iova(p));
    }
    let data = pattern(9, l.span as usize);
    a.ram.write(l.src_file(0), &data);
    ring_setup(&mut a, RING_SIZE);
    post(&a, 0, RING_SIZE, Desc { src: l.src_iova(0), dest: 0, len: l.span as u32, flags: 0 });
    doorbell(&mut a, 1);
    assert_eq!(wait_retired(&a, 0, RING_SIZE), (status::OK, l.span as u32));
    assert_eq!(a.vfio.reg(reg::DMA_BYTES) as u64, l.span);
    assert_eq!(a.vfio.reg(reg::DMA_DESCS), 1);
    assert_eq!(a.vfio.reg(reg::TX_PACKETS) as u64, l.pages());
    for (name, n) in [("B", &mut b), ("C", &mut c)] {
        poll("every packet applied", || (n.vfio.reg(reg::RX_PACKETS) as u64 == l.pages()).then_some(()));
        assert!(n.ram.read(l.rx_file(0), l.span as usize) == data, "{name}'s copy differs");
        assert_eq!(n.vfio.reg(reg::ERR_COUNT), 0);
    }
}

/// While A's long transfer runs, C's small stores still get through to B:
/// each packet of the transfer is ordered on its own.
#[test]
fn dma_large_transfer_does_not_starve_other_stores() {
    let hub = slow_hub();
    let (l, mut a, mut b) = slow_transfer(&hub);
    let mut c = l.start(&hub, "c", 8 << 20);
    let flag_page = l.pages() - 1; // the transfer's last page; C stores into it first
    c.vfio.set_pct(flag_page, pct::TX, 0);
    b.vfio.set_pct(flag_page, pct::RX, l.rx_iova(flag_page));
    doorbell(&mut a, 1);
    poll("the transfer to start", || (a.vfio.reg(reg::DMA_BYTES) > 0).then_some(()));
    let mut landed = 0;
    for k in 1..=5u64 {
        let addr = flag_page * PAGE_SIZE + 8 * k;
        let v = 0xC0C0_0000_0000_0000 | k;
        let t0 = Instant::now();
        c.vfio.region_write(BAR_TX, addr, &v.to_le_bytes(), true);
        poll("C's store to reach B", || (b.ram.read(l.rx_file(addr), 8) == v.to_le_bytes()).then_some(()));
        let dt = t0.elapsed();
        if written_back(&a, 0, RING_SIZE).is_none() {
            landed += 1;
        }
        eprintln!("C's store {k} reached B in {dt:?}, A had sent {} bytes", a.vfio.reg(reg::DMA_BYTES));
    }
    assert_eq!(landed, 5, "C's stores waited for A's transfer to end");
    assert_eq!(wait_retired_long(&a, 0), (status::OK, l.span as u32));
    // The transfer ended last on that page: its data, not C's, is there now.
    let want = pattern(5, l.span as usize);
    poll("B to apply the whole transfer", || (b.ram.read(l.rx_file(0), l.span as usize) == want).then_some(()));
}

fn wait_retired_long(n: &Node, idx: u32) -> (u32, u32) {
    let t0 = Instant::now();
    loop {
        if let Some(r) = written_back(n, idx, RING_SIZE) {
            return r;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "descriptor {idx} never retired");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The link going down during a transfer ends the descriptor with
/// LINK_DOWN: one error, the bytes sent so far in the write-back.
#[test]
fn dma_link_down_in_the_middle_ends_the_descriptor() {
    let hub = slow_hub();
    let (l, mut a, _b) = slow_transfer(&hub);
    doorbell(&mut a, 1);
    poll("the transfer to start", || (a.vfio.reg(reg::DMA_BYTES) > 0).then_some(()));
    hub.control_ok(Control::LinkDown { node: a.adapter.node });
    let (code, bytes) = wait_retired_long(&a, 0);
    assert_eq!(code, status::LINK_DOWN);
    assert!((bytes as u64) < l.span, "{bytes} bytes sent");
    assert_eq!(a.vfio.reg(reg::DMA_STATUS), status::LINK_DOWN);
    assert_ne!(a.vfio.reg(reg::ERR_STATUS) & err::DMA, 0);
    hub.control_ok(Control::LinkUp { node: a.adapter.node });
}

/// A slot whose written-back status says DONE is free: a driver that posts
/// into it and rings the doorbell at once must not get OVERFLOW, however
/// soon after the write-back it does (the engine moves DMA_HEAD with the
/// write-back, not after it). A ring of one descriptor, each asking for
/// the interrupt (the longest step after the write-back), 2,000 times.
#[test]
fn dma_a_slot_is_free_once_its_status_says_done() {
    let hub = Hub::start();
    let l = SMALL;
    let (mut a, _b) = pair(&hub, l, ASPACE);
    let efd = eventfd();
    a.vfio.set_irqs(IRQ_MSIX, IRQ_DATA_EVENTFD | IRQ_ACTION_TRIGGER, 0, 1, &[std::os::fd::AsRawFd::as_raw_fd(&efd)]);
    a.vfio.set_reg(reg::INT_MASK, int::DMA);
    ring_setup(&mut a, 1);
    let d = Desc { src: l.src_iova(0), dest: 0, len: 8, flags: dma::flags::INT };
    for i in 0..2000u32 {
        post(&a, i, 1, d);
        doorbell(&mut a, i + 1);
        let t0 = Instant::now();
        while written_back(&a, i, 1).is_none() {
            let st = a.vfio.reg(reg::DMA_STATUS);
            assert_eq!(st & 0xFF, 0, "descriptor {i}: DMA_STATUS {st:#x} ({})", status::name(st & 0xFF));
            assert!(t0.elapsed() < Duration::from_secs(10), "descriptor {i} never retired");
            std::hint::spin_loop();
        }
        assert_eq!(written_back(&a, i, 1), Some((status::OK, 8)), "descriptor {i}");
    }
    let st = a.vfio.reg(reg::DMA_STATUS);
    assert_eq!(st & 0xFF, 0, "DMA_STATUS {st:#x} ({})", status::name(st & 0xFF));
    assert_eq!(a.vfio.reg(reg::DMA_DESCS), 2000);
    assert_eq!(a.vfio.reg(reg::ERR_STATUS) & err::DMA, 0);
}
