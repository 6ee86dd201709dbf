//! The vfio-user decoder under random messages: one long-lived adapter, a
//! fresh connection per case. Whatever arrives, the server answers with a
//! well-formed reply or closes the connection, and the next client is served.

mod common;

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use common::*;
use device::regs::{self, int, pct, reg};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use vfio_user_wire as wire;
use vm_memory::ByteValued;

/// How the header's size field relates to the bytes sent.
#[derive(Debug, Clone, Copy)]
enum SizeMode {
    /// Header plus body.
    Consistent,
    /// `seed % (16 + body)`: shorter than the message, possibly shorter than a header.
    TooSmall(u32),
    /// Header plus body plus this many bytes that never come.
    Larger(u32),
}

#[derive(Debug, Clone)]
struct Case {
    id: u16,
    command: u16,
    flags: u32,
    size: SizeMode,
    body: Vec<u8>,
}

fn le(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

fn flags() -> impl Strategy<Value = u32> {
    prop_oneof![
        8 => Just(F_REQUEST),
        3 => Just(F_NO_REPLY),
        2 => (0u32..16, any::<bool>(), any::<bool>()).prop_map(|(t, nr, e)| {
            t | if nr { F_NO_REPLY } else { 0 } | if e { F_ERROR } else { 0 }
        }),
        1 => any::<u32>(),
    ]
}

fn u64_field() -> impl Strategy<Value = u64> {
    prop_oneof![Just(0u64), Just(0x1000), Just(0x10000), Just(u64::MAX), Just(u64::MAX - 0xFFF), any::<u64>()]
}

/// A `DMA_MAP` body (argsz, flags, offset, iova, size), sent without an fd.
fn dma_map() -> impl Strategy<Value = Vec<u8>> {
    (prop_oneof![Just(32u32), any::<u32>()], 0u32..4, u64_field(), u64_field(), u64_field(), vec(any::<u8>(), 0..8))
        .prop_map(|(argsz, flags, offset, addr, size, tail)| {
            le(&[wire::DmaMap { argsz, flags, offset, addr, size }.as_slice(), &tail])
        })
}

/// A `DMA_UNMAP` body (argsz, flags, iova, size).
fn dma_unmap() -> impl Strategy<Value = Vec<u8>> {
    (0u32..4, u64_field(), u64_field())
        .prop_map(|(flags, addr, size)| wire::DmaUnmap { argsz: 24, flags, addr, size }.as_slice().to_vec())
}

/// A `SET_IRQS` body (argsz, flags, index, start, count, data), sent without fds.
fn set_irqs() -> impl Strategy<Value = Vec<u8>> {
    (
        0u32..64,
        0u32..6,
        prop_oneof![0u32..3, Just(u32::MAX)],
        prop_oneof![0u32..3, Just(u32::MAX)],
        vec(any::<u8>(), 0..4),
    )
        .prop_map(|(flags, index, start, count, data)| {
            le(&[wire::IrqSet { argsz: 20, flags, index, start, count }.as_slice(), &data])
        })
}

fn offset() -> impl Strategy<Value = u64> {
    prop_oneof![3 => 0u64..0x80, 1 => 0u64..0x2_0000, 1 => u64_field()]
}

fn count() -> impl Strategy<Value = u32> {
    prop_oneof![4 => 0u32..16, 1 => 0u32..0x10_0001, 1 => any::<u32>()]
}

/// A `REGION_READ` body (offset, index, count).
fn region_read() -> impl Strategy<Value = Vec<u8>> {
    (offset(), 0u32..10, count())
        .prop_map(|(offset, region, count)| wire::RegionAccess { offset, region, count }.as_slice().to_vec())
}

/// A `REGION_WRITE` body (offset, index, count, data), count usually matching the data.
fn region_write() -> impl Strategy<Value = Vec<u8>> {
    (offset(), 0u32..10, vec(any::<u8>(), 0..16), prop_oneof![3 => Just(None), 1 => count().prop_map(Some)]).prop_map(
        |(offset, region, data, n)| {
            let count = n.unwrap_or(data.len() as u32);
            le(&[wire::RegionAccess { offset, region, count }.as_slice(), &data])
        },
    )
}

/// A `REGION_WRITE_MULTI` body: entry count, then 24-byte entries.
fn write_multi() -> impl Strategy<Value = Vec<u8>> {
    let entry = (offset(), 0u32..10, 0u32..10, any::<[u8; 8]>()).prop_map(|(offset, region, count, data)| {
        wire::WriteMultiEntry { offset, region, count, data }.as_slice().to_vec()
    });
    (vec(entry, 0..6), prop_oneof![3 => Just(None), 1 => any::<u64>().prop_map(Some)]).prop_map(|(entries, n)| {
        let count = n.unwrap_or(entries.len() as u64);
        le(&[wire::WriteMulti { count }.as_slice(), &entries.concat()])
    })
}

fn case() -> impl Strategy<Value = Case> {
    let body = prop_oneof![
        6 => (0u16..20, vec(any::<u8>(), 0..300)),
        2 => dma_map().prop_map(|b| (CMD_DMA_MAP, b)),
        1 => dma_unmap().prop_map(|b| (3, b)),
        2 => set_irqs().prop_map(|b| (CMD_DEVICE_SET_IRQS, b)),
        1 => region_read().prop_map(|b| (CMD_REGION_READ, b)),
        1 => region_write().prop_map(|b| (CMD_REGION_WRITE, b)),
        1 => write_multi().prop_map(|b| (CMD_REGION_WRITE_MULTI, b)),
    ];
    let size = prop_oneof![
        8 => Just(SizeMode::Consistent),
        2 => any::<u32>().prop_map(SizeMode::TooSmall),
        2 => (1u32..64).prop_map(SizeMode::Larger),
    ];
    (any::<u16>(), body, flags(), size).prop_map(|(id, (command, body), flags, size)| Case {
        id,
        command,
        flags,
        size,
        body,
    })
}

/// A reply as found on the wire.
#[derive(Debug)]
struct WireReply {
    id: u16,
    command: u16,
    flags: u32,
    error: u32,
    body_len: usize,
}

/// Reads until the server closes; fails if it neither closes nor stops within the timeout.
fn read_until_closed(s: &mut UnixStream) -> Result<Vec<u8>, TestCaseError> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Ok(out),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return Ok(out),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(TestCaseError::fail(format!("server neither answered nor closed: {e}"))),
        }
    }
}

/// Splits the bytes into replies; each must be a complete, well-formed reply.
fn parse_replies(mut b: &[u8]) -> Result<Vec<WireReply>, TestCaseError> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let h: wire::Header =
            wire::read(b).ok_or_else(|| TestCaseError::fail(format!("{} trailing bytes are not a header", b.len())))?;
        let size = h.size as usize;
        prop_assert!(h.is_valid() && size <= b.len(), "reply size {size} with {} bytes left", b.len());
        let r = WireReply { id: h.id, command: h.command, flags: h.flags, error: h.error, body_len: size - HDR };
        prop_assert_eq!(r.flags & !F_ERROR, F_REPLY, "reply flags {:#x}", r.flags);
        if r.flags & F_ERROR != 0 {
            prop_assert!(r.error != 0, "error reply without errno: {:?}", r);
            prop_assert_eq!(r.body_len, 0);
        } else {
            prop_assert_eq!(r.error, 0, "errno in a successful reply: {:?}", r);
        }
        out.push(r);
        b = &b[size..];
    }
    Ok(out)
}

/// What the cases ran into, to show the fuzzing is not one-sided.
#[derive(Debug, Default)]
struct Tally {
    ok_replies: usize,
    error_replies: usize,
    silent: usize,
}

fn run_case(adapter: &AdapterHandle, c: &Case, tally: &mut Tally) -> Result<(), TestCaseError> {
    let full = HDR + c.body.len();
    let size = match c.size {
        SizeMode::Consistent => full,
        SizeMode::TooSmall(seed) => seed as usize % full,
        SizeMode::Larger(extra) => full + extra as usize,
    };
    let mut msg = header(c.id, c.command, size as u32, c.flags, 0).to_vec();
    msg.extend_from_slice(&c.body);

    let mut s = UnixStream::connect(&adapter.sock).expect("connect");
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    // The server may hang up before taking everything: that is allowed.
    let _ = s.write_all(&msg);
    let _ = s.shutdown(Shutdown::Write);
    let replies = parse_replies(&read_until_closed(&mut s)?)?;
    match replies.first() {
        None => tally.silent += 1,
        Some(r) if r.flags & F_ERROR != 0 => tally.error_replies += 1,
        Some(_) => tally.ok_replies += 1,
    }

    let request = c.flags & F_TYPE_MASK == F_REQUEST;
    let wants_reply = c.flags & F_NO_REPLY == 0;
    if size < HDR || !request || size > full {
        // Unframeable, a non-request, or a body that never comes: hang up, say nothing.
        prop_assert!(replies.is_empty(), "replies to a message the server must drop: {:?}", replies);
    } else if size == full {
        if wants_reply {
            prop_assert_eq!(replies.len(), 1, "replies: {:?}", replies);
            let r = &replies[0];
            prop_assert_eq!((r.id, r.command), (c.id, c.command));
            if !(1..=15).contains(&c.command) {
                prop_assert_eq!((r.flags & F_ERROR, r.error), (F_ERROR, libc::ENOSYS as u32));
            }
        } else {
            prop_assert!(replies.is_empty(), "replies to a posted message: {:?}", replies);
        }
    } else if wants_reply {
        // The rest of the bytes are read as further messages; the first reply is ours.
        prop_assert!(!replies.is_empty());
        prop_assert_eq!((replies[0].id, replies[0].command), (c.id, c.command));
    }
    drop(s);

    // Still serving, and in a sane state.
    adapter.assert_alive();
    let mut v = adapter.client();
    prop_assert_eq!(v.reg(reg::ID), regs::ID_VALUE);
    Ok(())
}

#[test]
fn vfio_user_decoder_fuzz() {
    let hub = Hub::start();
    let fuzzed = AdapterHandle::start(&hub, "fuzzed");
    let mut runner = TestRunner::new(Config { cases: 200, failure_persistence: None, ..Config::default() });
    let tally = std::cell::RefCell::new(Tally::default());
    if let Err(e) = runner.run(&case(), |c| run_case(&fuzzed, &c, &mut tally.borrow_mut())) {
        panic!("{e}");
    }
    let tally = tally.into_inner();
    eprintln!("{tally:?}");
    assert_eq!(tally.ok_replies + tally.error_replies + tally.silent, 200);
    assert!(tally.ok_replies >= 5 && tally.error_replies >= 10 && tally.silent >= 10, "{tally:?}");

    // After all that, the adapter still works as a device: DMA maps,
    // interrupts, receive.
    const IOVA: u64 = 0x10000;
    const RAM: u64 = 0x4000;
    let mut peer = Node::start(&hub, "peer", IOVA, 0, RAM);
    let mut v = fuzzed.client();
    v.set_reg(reg::CTRL, regs::ctrl::RESET);
    let ram = GuestRam::new(RAM);
    v.dma_map(IOVA, RAM, &ram, 0);
    v.region_write(CONFIG_REGION, PCI_COMMAND, &PCI_COMMAND_MEMORY_MASTER.to_le_bytes(), false);
    let efd = eventfd();
    v.set_irqs(IRQ_MSIX, IRQ_DATA_EVENTFD | IRQ_ACTION_TRIGGER, 0, 1, &[efd.as_raw_fd()]);
    // What QEMU does when the guest unmasks the vector (a case may have masked it).
    v.set_irqs(IRQ_MSIX, IRQ_DATA_NONE | IRQ_ACTION_UNMASK, 0, 1, &[]);
    v.set_pct(0, pct::RX | pct::INT, IOVA);
    v.set_reg(reg::INT_CAUSE, int::ALL);
    v.set_reg(reg::INT_MASK, int::NOTIFY);
    peer.vfio.set_pct(0, pct::TX, 0);
    peer.vfio.region_write(regs::BAR_TX, 0x18, &0xF00D_F00Du64.to_le_bytes(), true);
    assert_eq!(wait_eventfd(&efd, Duration::from_secs(2)), Some(1), "no interrupt after the fuzzing");
    assert_eq!(ram.read(0x18, 8), 0xF00D_F00Du64.to_le_bytes());
    assert_eq!(v.reg(reg::NOTIFY_FIFO), 0);
    assert_eq!(v.reg(reg::ERR_STATUS), 0);
    fuzzed.assert_alive();
}
