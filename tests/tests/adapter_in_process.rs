//! The adapter driven in process the way QEMU drives it: a real hub, real
//! Unix sockets, the vfio-user protocol on the wire and guest RAM in a memfd
//! that the adapter receives by SCM_RIGHTS and writes by DMA.

mod common;

use common::*;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use device::regs::{self, err, int, pct, reg, ACK_VALID, BAR_PCT, BAR_REGS, BAR_TX, NOTIFY_EMPTY, PAGE_SIZE};
use hub::hub::Control;

/// IOVA where every test node maps its guest RAM.
const IOVA: u64 = 0x10000;
/// Bytes of guest RAM mapped.
const RAM: u64 = 64 << 10;
/// Offset of the mapping in the memfd: the adapter must add it.
const RAM_OFF: u64 = 0x4000;
const PAGE: usize = PAGE_SIZE as usize;

const ENOSYS: u32 = libc::ENOSYS as u32;
const EINVAL: u32 = libc::EINVAL as u32;

/// A non-repeating 64-bit sequence (splitmix64).
fn pattern_word(i: u64) -> u64 {
    let mut z = i.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn u64s_to_bytes(v: &[u64]) -> Vec<u8> {
    v.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// Asserts that `bytes` is all zero outside `[keep.0, keep.0 + keep.1)`.
fn assert_zero_except(what: &str, bytes: &[u8], keep: &[(usize, usize)]) {
    for (i, b) in bytes.iter().enumerate() {
        if *b != 0 && !keep.iter().any(|&(s, n)| (s..s + n).contains(&i)) {
            panic!("{what}: byte at file offset {i:#x} is {b:#04x}, expected untouched (0)");
        }
    }
}

#[test]
fn adapter_store_reaches_peer_in_process() {
    let hub = Hub::start();
    let mut a = Node::start(&hub, "a", IOVA, RAM_OFF, RAM);
    let mut b = Node::start(&hub, "b", IOVA, RAM_OFF, RAM);
    assert_ne!(a.adapter.node, b.adapter.node);

    // B receives page 0 at IOVA; page 1 has a receive address but RX off.
    b.vfio.set_pct(0, pct::RX, IOVA);
    b.vfio.set_pct(1, 0, IOVA + PAGE_SIZE);
    assert_eq!(b.vfio.pct(0), (pct::RX, IOVA));
    assert_eq!(b.vfio.pct(1), (0, IOVA + PAGE_SIZE));
    // A transmits pages 0 and 1 (broadcast, no loopback).
    a.vfio.set_pct(0, pct::TX, 0);
    a.vfio.set_pct(1, pct::TX, 0);
    assert_eq!(a.vfio.pct(1), (pct::TX, 0));

    // 1024 posted 8-byte stores filling page 0 of the transmit window,
    // pipelined like QEMU does for a burst of MMIO writes.
    let words: Vec<u64> = (0..1024).map(pattern_word).collect();
    let writes: Vec<(u32, u64, Vec<u8>)> =
        words.iter().enumerate().map(|(i, w)| (BAR_TX, i as u64 * 8, w.to_le_bytes().to_vec())).collect();
    a.vfio.region_writes_posted_batch(&writes);
    // A non-posted read completes after the posted writes before it.
    assert_eq!(a.vfio.reg(reg::ERR_STATUS), 0, "A flagged an error for enabled stores");

    let expect = u64s_to_bytes(&words);
    assert_eq!(expect.len(), PAGE);
    poll("page 0 to land in B's RAM", || (b.ram.read(RAM_OFF, PAGE) == expect).then_some(()));
    // Every packet A sent for page 0 was applied by B, and nothing else.
    let tx0 = poll("B's RX_PACKETS to match A's TX_PACKETS", || {
        let (tx, rx) = (a.vfio.reg(reg::TX_PACKETS), b.vfio.reg(reg::RX_PACKETS));
        (tx == rx).then_some(tx)
    });
    assert!((1..=16).contains(&tx0), "1024 contiguous 8-byte stores went out as {tx0} packets: not coalesced");
    assert_eq!(b.vfio.reg(reg::RX_DROPPED), 0);

    // Now stores into page 1 (TX on at A, RX off at B): one REGION_WRITE_MULTI
    // of 32 contiguous stores (one packet: no idle point inside a message),
    // then one non-contiguous posted store (a second packet).
    let p1: Vec<[u8; 8]> = (0..32).map(|i| (0xA5A5_0000_0000_0000 | i as u64).to_le_bytes()).collect();
    let entries: Vec<(u32, u64, &[u8])> =
        p1.iter().enumerate().map(|(i, d)| (BAR_TX, PAGE_SIZE + i as u64 * 8, &d[..])).collect();
    a.vfio.write_multi(&entries, true);
    a.vfio.region_write(BAR_TX, PAGE_SIZE + 4096, &[0x5A; 8], true);
    assert_eq!(a.vfio.reg(reg::ERR_STATUS), 0);

    poll("A to send the two page-1 packets", || (a.vfio.reg(reg::TX_PACKETS) == tx0 + 2).then_some(()));
    poll("B to drop the two page-1 packets", || (b.vfio.reg(reg::RX_DROPPED) == 2).then_some(()));
    assert_eq!(b.vfio.reg(reg::RX_PACKETS), tx0, "B applied a packet for a page without RX");
    assert_eq!(b.vfio.reg(reg::ERR_STATUS), 0);
    assert_eq!(b.vfio.reg(reg::ERR_COUNT), 0);
    assert_eq!(a.vfio.reg(reg::ERR_COUNT), 0);

    // B's RAM: page 0 exactly, everything else (including where page 1 would
    // have landed, and the file below the mapping) untouched.
    let all = b.ram.all();
    assert_eq!(&all[RAM_OFF as usize..RAM_OFF as usize + PAGE], &expect[..]);
    assert_zero_except("B's RAM", &all, &[(RAM_OFF as usize, PAGE)]);
    // The sender gets nothing back (broadcast excludes the sender, A has no RX).
    assert_zero_except("A's RAM", &a.ram.all(), &[]);
    assert_eq!(a.vfio.reg(reg::RX_PACKETS), 0);
    a.adapter.assert_alive();
    b.adapter.assert_alive();
}

#[test]
fn adapter_tx_read_master_abort() {
    let hub = Hub::start();
    let a = AdapterHandle::start(&hub, "a");
    let mut c = a.client();
    assert_eq!(c.reg(reg::ERR_STATUS), 0);
    assert_eq!(c.reg(reg::ERR_COUNT), 0);

    assert_eq!(c.region_read(BAR_TX, 0, 8), vec![0xFF; 8]);
    assert_eq!(c.reg(reg::ERR_STATUS), err::TX_READ);
    assert_eq!(c.reg(reg::ERR_COUNT), 1);

    // Another read, in the last page with a odd size: all ones again, counted again.
    assert_eq!(c.region_read(BAR_TX, ASPACE - 3, 3), vec![0xFF; 3]);
    assert_eq!(c.reg(reg::ERR_STATUS), err::TX_READ);
    assert_eq!(c.reg(reg::ERR_COUNT), 2);

    // W1C: writing a bit that is not set changes nothing; writing 1 to TX_READ clears it.
    c.set_reg(reg::ERR_STATUS, err::TX_DISABLED);
    assert_eq!(c.reg(reg::ERR_STATUS), err::TX_READ);
    c.set_reg(reg::ERR_STATUS, err::TX_READ);
    assert_eq!(c.reg(reg::ERR_STATUS), 0);
    // The count is not cleared by W1C.
    assert_eq!(c.reg(reg::ERR_COUNT), 2);
    // A read sends nothing.
    assert_eq!(c.reg(reg::TX_PACKETS), 0);
    a.assert_alive();
}

#[test]
fn adapter_tx_disabled_page_flags_error() {
    let hub = Hub::start();
    let mut a = Node::start(&hub, "a", IOVA, RAM_OFF, RAM);
    let mut b = Node::start(&hub, "b", IOVA, RAM_OFF, RAM);
    b.vfio.set_pct(0, pct::RX, IOVA);
    b.vfio.set_pct(1, pct::RX, IOVA + PAGE_SIZE);
    // A: page 0 has every bit but TX; page 1 transmits.
    a.vfio.set_pct(0, pct::RX | pct::LOOPBACK, IOVA);
    a.vfio.set_pct(1, pct::TX, 0);

    a.vfio.region_write(BAR_TX, 16, &0x1122_3344_5566_7788u64.to_le_bytes(), true);
    assert_eq!(a.vfio.reg(reg::ERR_STATUS), err::TX_DISABLED);
    assert_eq!(a.vfio.reg(reg::ERR_COUNT), 1);

    // A store to an enabled page after it: once it has arrived, the dropped
    // store would have arrived too (the hub keeps one order).
    a.vfio.region_write(BAR_TX, PAGE_SIZE + 32, &0x0102_0304_0506_0708u64.to_le_bytes(), true);
    let at = (RAM_OFF + PAGE_SIZE + 32) as usize;
    poll("the page-1 store to reach B", || {
        (b.ram.read(at as u64, 8) == 0x0102_0304_0506_0708u64.to_le_bytes()).then_some(())
    });
    poll("B to count one packet", || (b.vfio.reg(reg::RX_PACKETS) == 1).then_some(()));
    assert_eq!(a.vfio.reg(reg::TX_PACKETS), 1, "the disabled store was sent");
    assert_eq!(b.vfio.reg(reg::RX_DROPPED), 0);
    assert_eq!(b.vfio.reg(reg::ERR_STATUS), 0);
    assert_zero_except("B's RAM", &b.ram.all(), &[(at, 8)]);
    // Loopback without TX sends nothing back either.
    assert_zero_except("A's RAM", &a.ram.all(), &[]);
    assert_eq!(a.vfio.reg(reg::ERR_STATUS), err::TX_DISABLED);
    assert_eq!(a.vfio.reg(reg::ERR_COUNT), 1);
}

#[test]
fn adapter_dma_out_of_range_sets_error() {
    let hub = Hub::start();
    let mut a = Node::start(&hub, "a", IOVA, RAM_OFF, RAM);
    let mut b = Node::start(&hub, "b", IOVA, RAM_OFF, RAM);
    // Page 0: an IOVA never mapped. Page 1: 8 bytes before the end of the
    // map, so a 16-byte write straddles it (must be refused as a whole).
    // Page 2: valid, used as a fence.
    b.vfio.set_pct(0, pct::RX, 0x8000_0000);
    b.vfio.set_pct(1, pct::RX, IOVA + RAM - 8);
    b.vfio.set_pct(2, pct::RX, IOVA);
    for p in 0..3 {
        a.vfio.set_pct(p, pct::TX, 0);
    }

    a.vfio.region_write(BAR_TX, 0, &[0xEE; 8], true);
    a.vfio.region_write(BAR_TX, PAGE_SIZE, &[0xDD; 16], true);
    poll("B to flag RX_DMA", || (b.vfio.reg(reg::ERR_STATUS) & err::RX_DMA != 0).then_some(()));
    a.vfio.region_write(BAR_TX, 2 * PAGE_SIZE + 8, &[0x77; 8], true);
    let at = RAM_OFF as usize + 8;
    poll("the valid page-2 store to reach B", || (b.ram.read(at as u64, 8) == [0x77; 8]).then_some(()));

    assert_eq!(b.vfio.reg(reg::ERR_STATUS), err::RX_DMA);
    assert_eq!(b.vfio.reg(reg::ERR_COUNT), 2, "both refused packets are counted");
    poll("B to count the page-2 packet", || (b.vfio.reg(reg::RX_PACKETS) == 1).then_some(()));
    assert_eq!(b.vfio.reg(reg::RX_DROPPED), 0);
    assert_zero_except("B's RAM", &b.ram.all(), &[(at, 8)]);
    assert_eq!(a.vfio.reg(reg::TX_PACKETS), 3);
    assert_eq!(a.vfio.reg(reg::ERR_STATUS), 0);

    // W1C clears it on the receiver.
    b.vfio.set_reg(reg::ERR_STATUS, err::RX_DMA);
    assert_eq!(b.vfio.reg(reg::ERR_STATUS), 0);
}

#[test]
fn adapter_register_reset_values() {
    let hub = Hub::start();
    let a = AdapterHandle::start(&hub, "a");
    let mut c = a.client();

    assert_eq!(c.reg(reg::ID), 0x4D43_0001);
    assert_eq!(c.reg(reg::PAGE_SIZE), 8192);
    assert_eq!(c.reg(reg::ASPACE_PAGES), (ASPACE / 8192) as u32);
    assert_eq!(c.reg(reg::ASPACE_PAGES), 128);
    let node = c.reg(reg::NODE);
    assert_eq!(node & 0xFFFF, a.node as u32);
    assert_eq!(node >> 16, a.max_nodes as u32);
    assert_eq!(c.reg(reg::LINK), 1);
    assert_eq!(c.reg(reg::MEMBERS_LO), 1 << a.node);
    assert_eq!(c.reg(reg::MEMBERS_HI), 0);
    assert_eq!(c.reg(reg::ERR_STATUS), 0);
    assert_eq!(c.reg(reg::ERR_COUNT), 0);
    assert_eq!(c.reg(reg::CTRL), 0);
    // Undefined offsets read as zero; an 8-byte read spans two registers.
    assert_eq!(c.reg(0x3C), 0);
    assert_eq!(c.region_read(BAR_REGS, reg::ID, 8), [0x4D43_0001u32.to_le_bytes(), node.to_le_bytes()].concat());

    // Region sizes as QEMU sees them.
    assert_eq!(c.region_info(BAR_REGS).1, 4096);
    assert_eq!(c.region_info(BAR_PCT).1, 4096, "128 entries of 16 bytes, rounded up to 4 KiB");
    assert_eq!(c.region_info(BAR_TX).1, ASPACE);
    assert_eq!(c.region_info(1).1, 0);

    // PCT: write, read back (reserved word-0 bits read as zero).
    c.set_pct(0, pct::TX, 0x1234_5000);
    c.set_pct(5, u64::MAX, u64::MAX);
    c.set_pct(127, pct::RX | pct::P2P | (3 << pct::DEST_SHIFT), 0xABCD_E000);
    assert_eq!(c.pct(0), (pct::TX, 0x1234_5000));
    assert_eq!(c.pct(5), (0xFFFF_003F, 0xFFFF_FFFF_FFFF_FFF8), "receive address bits 0-2 are reserved");
    assert_eq!(c.pct(127), (pct::RX | pct::P2P | (3 << pct::DEST_SHIFT), 0xABCD_E000));
    assert_eq!(c.pct(1), (0, 0));

    // Make some state: an error of each kind the guest can cause and a packet.
    assert_eq!(c.region_read(BAR_TX, 0, 4), vec![0xFF; 4]);
    c.region_write(BAR_TX, PAGE_SIZE, &[1; 8], true); // page 1: TX off
    c.region_write(BAR_TX, 0, &[2; 8], true); // page 0: TX on
    assert_eq!(c.reg(reg::ERR_STATUS), err::TX_READ | err::TX_DISABLED);
    assert_eq!(c.reg(reg::ERR_COUNT), 2);
    poll("TX_PACKETS to count the store", || (c.reg(reg::TX_PACKETS) == 1).then_some(()));

    // Reset through CTRL.
    c.set_reg(reg::CTRL, regs::ctrl::RESET);
    assert_eq!(c.region_read(BAR_PCT, 0, 4096), vec![0u8; 4096], "PCT not cleared by reset");
    assert_eq!(c.reg(reg::ERR_STATUS), 0);
    assert_eq!(c.reg(reg::ERR_COUNT), 0);
    assert_eq!(c.reg(reg::TX_PACKETS), 0);
    assert_eq!(c.reg(reg::RX_PACKETS), 0);
    assert_eq!(c.reg(reg::RX_DROPPED), 0);
    assert_eq!(c.reg(reg::CTRL), 0, "RESET is self-clearing");
    // Identity and link survive a reset.
    assert_eq!(c.reg(reg::ID), 0x4D43_0001);
    assert_eq!(c.reg(reg::NODE), node);
    assert_eq!(c.reg(reg::LINK), 1);
    // After reset the PCT is off: a store is a TX_DISABLED error again.
    c.region_write(BAR_TX, 0, &[3; 8], true);
    assert_eq!(c.reg(reg::ERR_STATUS), err::TX_DISABLED);
    assert_eq!(c.reg(reg::ERR_COUNT), 1);
    assert_eq!(c.reg(reg::TX_PACKETS), 0);

    // DEVICE_RESET (the vfio-user command) resets the same way.
    c.set_pct(3, pct::TX | pct::RX, 0x4000);
    c.request_ok(CMD_DEVICE_RESET, &[]);
    assert_eq!(c.pct(3), (0, 0));
    assert_eq!(c.reg(reg::ERR_STATUS), 0);
    assert_eq!(c.reg(reg::ERR_COUNT), 0);
    a.assert_alive();
}

#[test]
fn malformed_messages_get_errors_not_panics() {
    let hub = Hub::start();
    let a = AdapterHandle::start(&hub, "a");
    let mut c = a.client();

    // Unknown command: error reply, connection still usable.
    let r = c.request(99, &[1, 2, 3, 4]);
    assert!(r.is_error(), "unknown command answered without ERROR: {r:?}");
    assert_eq!(r.error, ENOSYS);
    assert!(r.body.is_empty());
    assert_eq!(c.reg(reg::ID), regs::ID_VALUE);

    // Reads beyond a region, of an absent region, of a bad index, of zero bytes.
    assert_eq!(c.try_region_read(BAR_REGS, 4096 - 2, 4), Err(EINVAL));
    assert_eq!(c.try_region_read(BAR_REGS, 4096, 4), Err(EINVAL));
    assert_eq!(c.try_region_read(BAR_TX, ASPACE, 8), Err(EINVAL));
    assert_eq!(c.try_region_read(BAR_REGS, u64::MAX - 1, 4), Err(EINVAL));
    assert_eq!(c.try_region_read(1, 0, 4), Err(EINVAL));
    assert_eq!(c.try_region_read(9, 0, 4), Err(EINVAL));
    assert_eq!(c.try_region_read(u32::MAX, 0, 4), Err(EINVAL));
    assert_eq!(c.try_region_read(BAR_REGS, 0, 0), Err(EINVAL));
    // A REGION_READ whose body is too short for its fields.
    let r = c.request(CMD_REGION_READ, &[0; 8]);
    assert!(r.is_error());
    assert_eq!(r.error, EINVAL);
    // A REGION_WRITE whose count does not match the data it carries.
    let mut body = VfioClient::region_write_body(BAR_PCT, 0, &[0xFF; 8]);
    body[12] = 16;
    let r = c.request(CMD_REGION_WRITE, &body);
    assert!(r.is_error());
    assert_eq!(r.error, EINVAL);
    assert_eq!(c.pct(0), (0, 0), "a refused write changed the PCT");
    // A DMA_MAP beyond the end of the file it passes.
    let ram = GuestRam::new(0x1000);
    let r = c.try_dma_map(0x10000, 0x2000, &ram, 0);
    assert!(r.is_error());
    assert_eq!(r.error, EINVAL);
    // A VERSION with another major version.
    let r = c.request(CMD_VERSION, &[1, 0, 0, 0, b'{', b'}', 0]);
    assert!(r.is_error());
    // Still alive and in sync: the next reply is for the next request.
    assert_eq!(c.reg(reg::PAGE_SIZE), 8192);

    // A header that claims to be smaller than a header: the server hangs up.
    let h = header(0x4242, CMD_REGION_READ, 8, F_REQUEST, 0);
    c.send_bytes(&h);
    assert!(c.closed_by_server());
    a.assert_alive();

    // A new client is served.
    let mut c2 = a.client();
    assert_eq!(c2.reg(reg::ID), regs::ID_VALUE);

    // A message typed as a reply: the server hangs up as well.
    let h = header(7, CMD_REGION_READ, 16, F_REPLY, 0);
    c2.send_bytes(&h);
    assert!(c2.closed_by_server());

    // A client that vanishes in the middle of a header, then one in the middle of a body.
    let mut c3 = VfioClient::connect_raw(&a.sock);
    c3.send_bytes(&header(1, CMD_VERSION, 64, F_REQUEST, 0)[..10]);
    drop(c3);
    let mut c4 = VfioClient::connect_raw(&a.sock);
    c4.send_bytes(&header(1, CMD_VERSION, 64, F_REQUEST, 0));
    c4.send_bytes(&[0; 10]);
    drop(c4);

    let mut c5 = a.client();
    assert_eq!(c5.reg(reg::ID), regs::ID_VALUE);
    a.assert_alive();
}

#[test]
fn adapter_loopback() {
    let hub = Hub::start();
    let mut a = Node::start(&hub, "a", IOVA, RAM_OFF, RAM);
    // Page 3 loops back into A's RAM at IOVA+0x2000; page 4 receives at
    // IOVA+0x4000 but has no LOOPBACK, so A's own stores to it stay away.
    a.vfio.set_pct(3, pct::TX | pct::RX | pct::LOOPBACK, IOVA + 0x2000);
    a.vfio.set_pct(4, pct::TX | pct::RX, IOVA + 0x4000);
    let p3 = 3 * PAGE_SIZE;

    a.vfio.region_write(BAR_TX, 4 * PAGE_SIZE, &[0xAA; 8], true);
    // 300 stores to the same word, one packet each: only the last may remain.
    for v in 1..=300u64 {
        a.vfio.region_write(BAR_TX, p3, &v.to_le_bytes(), true);
    }
    // Then the rest of the page, part by REGION_WRITE_MULTI (as QEMU batches).
    let words: Vec<u64> = (1..1023).map(pattern_word).collect();
    let bytes: Vec<[u8; 8]> = words.iter().map(|w| w.to_le_bytes()).collect();
    for (k, chunk) in bytes.chunks(200).enumerate() {
        let entries: Vec<(u32, u64, &[u8])> =
            chunk.iter().enumerate().map(|(i, d)| (BAR_TX, p3 + 8 + (k * 200 + i) as u64 * 8, &d[..])).collect();
        a.vfio.write_multi(&entries, true);
    }
    // And a marker in the last word, last.
    let marker = 0xC0FF_EE00_DEAD_BEEFu64;
    a.vfio.region_write(BAR_TX, p3 + PAGE_SIZE - 8, &marker.to_le_bytes(), true);
    assert_eq!(a.vfio.reg(reg::ERR_STATUS), 0);

    let base = RAM_OFF + 0x2000;
    poll("the marker to come back", || (a.ram.read(base + PAGE_SIZE - 8, 8) == marker.to_le_bytes()).then_some(()));
    let mut expect = 300u64.to_le_bytes().to_vec();
    expect.extend(u64s_to_bytes(&words));
    expect.extend(marker.to_le_bytes());
    let all = a.ram.all();
    assert_eq!(
        u64::from_le_bytes(all[base as usize..base as usize + 8].try_into().unwrap()),
        300,
        "the word written 300 times does not hold the last value: deliveries out of order"
    );
    assert_eq!(&all[base as usize..base as usize + PAGE], &expect[..]);
    assert_zero_except("A's RAM", &all, &[(base as usize, PAGE)]);
    // Every packet but the page-4 one came back and was applied.
    let tx = poll("RX_PACKETS to catch up", || {
        let (tx, rx) = (a.vfio.reg(reg::TX_PACKETS), a.vfio.reg(reg::RX_PACKETS));
        (rx + 1 == tx).then_some(tx)
    });
    // Page 4's store, then 300 same-address stores (they cannot coalesce); the
    // rest of page 3 is contiguous with the last of them and may join it.
    assert!(tx >= 301, "300 same-address stores cannot coalesce: got {tx} packets");
    assert_eq!(a.vfio.reg(reg::RX_DROPPED), 0);
    assert_eq!(a.vfio.reg(reg::ERR_STATUS), 0);
}

/// A device without bus mastering does no DMA: the packet is refused with
/// RX_DMA and guest memory stays untouched until the driver turns it on.
#[test]
fn adapter_rx_needs_bus_master() {
    let hub = Hub::start();
    let mut a = Node::start(&hub, "a", IOVA, RAM_OFF, RAM);
    let mut b = Node::start(&hub, "b", IOVA, RAM_OFF, RAM);
    b.vfio.region_write(CONFIG_REGION, PCI_COMMAND, &0x0002u16.to_le_bytes(), false);
    b.vfio.set_pct(0, pct::RX, IOVA);
    a.vfio.set_pct(0, pct::TX, 0);
    a.vfio.region_write(BAR_TX, 0, &[0x11; 8], true);
    poll("B to refuse the DMA", || (b.vfio.reg(reg::ERR_STATUS) & err::RX_DMA != 0).then_some(()));
    assert_zero_except("B's RAM", &b.ram.all(), &[]);
    b.vfio.region_write(CONFIG_REGION, PCI_COMMAND, &PCI_COMMAND_MEMORY_MASTER.to_le_bytes(), false);
    a.vfio.region_write(BAR_TX, 8, &[0x22; 8], true);
    let at = RAM_OFF as usize + 8;
    poll("the store to land once bus mastering is on", || (b.ram.read(at as u64, 8) == [0x22; 8]).then_some(()));
}

/// Receive buffer of page `p` in every node of the PCT tests: page `p` of the mapped RAM.
fn rx_buf(p: u64) -> u64 {
    IOVA + p * PAGE_SIZE
}

/// File offset in a node's RAM of byte `off` of page `p`'s receive buffer.
fn ram_at(p: u64, off: u64) -> u64 {
    RAM_OFF + p * PAGE_SIZE + off
}

/// Page the PCT tests use as an ordering fence: broadcast by the sender,
/// received with INT by everybody else.
const FENCE_PAGE: u64 = 4;

/// Sends a broadcast store on [`FENCE_PAGE`] from `sender` and waits until
/// every receiver has taken it out of its notification FIFO. The hub keeps
/// one order and the adapter applies it in order, and a notification is
/// queued after the packet was counted, so afterwards every packet sent
/// before the fence has been applied (or dropped) and counted by every
/// receiver.
fn fence(sender: &mut Node, receivers: &mut [&mut Node], k: u64) {
    sender.vfio.region_write(BAR_TX, FENCE_PAGE * PAGE_SIZE + 8 * k, &k.to_le_bytes(), true);
    for r in receivers.iter_mut() {
        poll("the fence notification", || (r.vfio.reg(reg::NOTIFY_FIFO) == FENCE_PAGE as u32).then_some(()));
        assert_eq!(r.vfio.reg(reg::NOTIFY_FIFO), NOTIFY_EMPTY, "one notification per fence");
        assert_eq!(r.ram.read(ram_at(FENCE_PAGE, 8 * k), 8), k.to_le_bytes());
    }
}

#[test]
fn adapter_pct_transmit_receive() {
    let hub = Hub::start();
    let mut a = Node::start(&hub, "a", IOVA, RAM_OFF, RAM);
    let mut b = Node::start(&hub, "b", IOVA, RAM_OFF, RAM);
    let mut c = Node::start(&hub, "c", IOVA, RAM_OFF, RAM);
    let nc = c.adapter.node;
    let ports = a.vfio.reg(reg::NODE) >> 16;
    assert_eq!(ports, 8);

    // PCT word 0 reads back exactly what it holds: the six enables and the
    // dest field; reserved bits (6-15, 32-63) read as zero.
    let enables = pct::TX | pct::RX | pct::LOOPBACK | pct::INT | pct::ACK | pct::P2P;
    assert_eq!(enables, 0x3F);
    a.vfio.set_pct(
        10,
        enables | (0xBEEF << pct::DEST_SHIFT) | 1 << 6 | 1 << 15 | 1 << 32 | 1 << 63,
        0x1234_5678_9ABC_D000,
    );
    assert_eq!(a.vfio.pct(10), (0xBEEF_003F, 0x1234_5678_9ABC_D000));
    for bit in 0..64 {
        a.vfio.region_write(BAR_PCT, 11 * 16, &(1u64 << bit).to_le_bytes(), false);
        let want = if bit < 6 || (16..32).contains(&bit) { 1u64 << bit } else { 0 };
        assert_eq!(a.vfio.pct(11), (want, 0), "PCT word 0 bit {bit}");
    }
    // A 2-byte store to the dest field alone changes only that field.
    a.vfio.region_write(BAR_PCT, 10 * 16 + 2, &[0x34, 0x12], false);
    assert_eq!(a.vfio.pct(10), (0x1234_003F, 0x1234_5678_9ABC_D000));
    // A 4-byte store to the high half of word 0 is all reserved.
    a.vfio.region_write(BAR_PCT, 10 * 16 + 4, &[0xFF; 4], false);
    assert_eq!(a.vfio.pct(10).0, 0x1234_003F);
    a.vfio.set_pct(10, 0, 0);
    a.vfio.set_pct(11, 0, 0);
    assert_eq!((a.vfio.pct(10), a.vfio.pct(11)), ((0, 0), (0, 0)));

    // A transmits pages 0-4: 0 broadcast, 1 point-to-point to C, 2
    // point-to-point to a port the hub does not have, 3 broadcast (not
    // received), 4 the fence (broadcast).
    a.vfio.set_pct(0, pct::TX, 0);
    a.vfio.set_pct(1, pct::TX | pct::P2P | (nc as u64) << pct::DEST_SHIFT, 0);
    a.vfio.set_pct(2, pct::TX | pct::P2P | (ports as u64) << pct::DEST_SHIFT, 0);
    a.vfio.set_pct(3, pct::TX, 0);
    a.vfio.set_pct(FENCE_PAGE, pct::TX, 0);
    assert_eq!(a.vfio.pct(1), (0x21 | (nc as u64) << 16, 0));
    assert_eq!(a.vfio.pct(2), (0x21 | 8 << 16, 0));
    // B and C receive pages 0-2 (so a misdelivered packet would land),
    // not page 3, and the fence with INT.
    for r in [&mut b, &mut c] {
        for p in 0..3 {
            r.vfio.set_pct(p, pct::RX, rx_buf(p));
        }
        r.vfio.set_pct(3, 0, rx_buf(3));
        r.vfio.set_pct(FENCE_PAGE, pct::RX | pct::INT, rx_buf(FENCE_PAGE));
    }

    // Broadcast: both others.
    a.vfio.region_write(BAR_TX, 0x10, &0x0102_0304_0506_0708u64.to_le_bytes(), true);
    fence(&mut a, &mut [&mut b, &mut c], 1);
    for r in [&mut b, &mut c] {
        assert_eq!(r.ram.read(ram_at(0, 0x10), 8), 0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(r.vfio.reg(reg::RX_PACKETS), 2);
    }

    // Point-to-point: C only. B receives page 1 too, but nothing arrives.
    a.vfio.region_write(BAR_TX, PAGE_SIZE + 0x20, &[0xC1; 8], true);
    fence(&mut a, &mut [&mut b, &mut c], 2);
    assert_eq!(c.ram.read(ram_at(1, 0x20), 8), [0xC1; 8]);
    assert_eq!(c.vfio.reg(reg::RX_PACKETS), 4);
    assert_eq!(b.ram.read(ram_at(1, 0), PAGE), vec![0u8; PAGE], "a point-to-point write to C reached B");
    assert_eq!(b.vfio.reg(reg::RX_PACKETS), 3, "B counted a packet that was not for it");
    assert_eq!(b.vfio.reg(reg::RX_DROPPED), 0, "B was sent a packet that was not for it");
    assert_eq!(a.vfio.reg(reg::ERR_STATUS), 0);
    assert_eq!(a.vfio.reg(reg::TX_PACKETS), 4);

    // Point-to-point to node 8 of an 8-port hub: dropped at the sender with TX_DEST.
    a.vfio.region_write(BAR_TX, 2 * PAGE_SIZE + 0x30, &[0xD2; 8], true);
    assert_eq!(a.vfio.reg(reg::ERR_STATUS), err::TX_DEST);
    assert_eq!(a.vfio.reg(reg::ERR_COUNT), 1);
    assert_eq!(a.vfio.reg(reg::TX_PACKETS), 4, "a store to a bad destination was sent");
    fence(&mut a, &mut [&mut b, &mut c], 3);
    for r in [&mut b, &mut c] {
        assert_eq!(r.ram.read(ram_at(2, 0), PAGE), vec![0u8; PAGE]);
        assert_eq!(r.vfio.reg(reg::RX_DROPPED), 0);
        assert_eq!(r.vfio.reg(reg::ERR_STATUS), 0);
    }
    assert_eq!(b.vfio.reg(reg::RX_PACKETS), 4);
    assert_eq!(c.vfio.reg(reg::RX_PACKETS), 5);
    a.vfio.set_reg(reg::ERR_STATUS, err::TX_DEST);
    assert_eq!(a.vfio.reg(reg::ERR_STATUS), 0);

    // Transmitted, but the receivers have no RX on page 3: counted as dropped.
    a.vfio.region_write(BAR_TX, 3 * PAGE_SIZE + 0x40, &[0xE3; 8], true);
    fence(&mut a, &mut [&mut b, &mut c], 4);
    for r in [&mut b, &mut c] {
        assert_eq!(r.vfio.reg(reg::RX_DROPPED), 1);
        assert_eq!(r.ram.read(ram_at(3, 0), PAGE), vec![0u8; PAGE]);
        assert_eq!(r.vfio.reg(reg::ERR_STATUS), 0);
        assert_eq!(r.vfio.reg(reg::ERR_COUNT), 0);
    }
    assert_eq!(b.vfio.reg(reg::RX_PACKETS), 5);
    assert_eq!(c.vfio.reg(reg::RX_PACKETS), 6);
    assert_eq!(a.vfio.reg(reg::TX_PACKETS), 7);

    // Nothing else anywhere; the sender got nothing back.
    let fence_bytes = (ram_at(FENCE_PAGE, 8) as usize, 32);
    assert_zero_except("B's RAM", &b.ram.all(), &[(ram_at(0, 0x10) as usize, 8), fence_bytes]);
    assert_zero_except(
        "C's RAM",
        &c.ram.all(),
        &[(ram_at(0, 0x10) as usize, 8), (ram_at(1, 0x20) as usize, 8), fence_bytes],
    );
    assert_zero_except("A's RAM", &a.ram.all(), &[]);
    assert_eq!(a.vfio.reg(reg::RX_PACKETS), 0);
    assert_eq!(a.vfio.reg(reg::RX_DROPPED), 0);
}

#[test]
fn adapter_ack_page() {
    let hub = Hub::start();
    let mut a = Node::start(&hub, "a", IOVA, RAM_OFF, RAM);
    let mut b = Node::start(&hub, "b", IOVA, RAM_OFF, RAM);
    let mut c = Node::start(&hub, "c", IOVA, RAM_OFF, RAM);
    let (na, nb, nc) = (a.adapter.node as u64, b.adapter.node as u64, c.adapter.node as u64);

    // C has an error latched: a read of its transmit window.
    assert_eq!(c.vfio.region_read(BAR_TX, 0, 8), vec![0xFF; 8]);
    assert_eq!(c.vfio.reg(reg::ERR_STATUS), err::TX_READ);

    // A's page 7 is an ACK page whose answers land in A's RAM at 0x2000.
    let buf = 0x2000;
    a.vfio.set_pct(7, pct::TX | pct::RX | pct::ACK, IOVA + buf);
    assert_eq!(a.vfio.pct(7), (0x13, IOVA + buf));
    // B and C receive page 7 too: if the ACK store's data were applied, it would land.
    b.vfio.set_pct(7, pct::RX, IOVA + buf);
    c.vfio.set_pct(7, pct::RX, IOVA + buf);

    a.vfio.region_write(BAR_TX, 7 * PAGE_SIZE + 0x100, &[0x5A; 8], true);
    let at = |n: u64| RAM_OFF + buf + n;
    poll("the ACK answers of B and C", || {
        (a.ram.read(at(nb), 1)[0] & ACK_VALID != 0 && a.ram.read(at(nc), 1)[0] & ACK_VALID != 0).then_some(())
    });
    assert_eq!(a.ram.read(at(nb), 1)[0], 0x80, "B has no error");
    assert_eq!(a.ram.read(at(nc), 1)[0], 0x80 | err::TX_READ as u8, "C's answer carries TX_READ");
    assert_eq!(a.ram.read(at(na), 1)[0], 0, "A answered its own ACK store (no loopback)");
    poll("A to count both answers", || (a.vfio.reg(reg::RX_PACKETS) == 2).then_some(()));
    assert_zero_except("A's RAM", &a.ram.all(), &[(at(nb) as usize, 1), (at(nc) as usize, 1)]);
    // The ACK store's data was applied nowhere.
    assert_zero_except("B's RAM", &b.ram.all(), &[]);
    assert_zero_except("C's RAM", &c.ram.all(), &[]);
    for r in [&mut b, &mut c] {
        assert_eq!(r.vfio.reg(reg::RX_PACKETS), 0);
        assert_eq!(r.vfio.reg(reg::RX_DROPPED), 0);
    }
    assert_eq!(a.vfio.reg(reg::TX_PACKETS), 1);
    assert_eq!(a.vfio.reg(reg::ERR_STATUS), 0);
    assert_eq!(b.vfio.reg(reg::ERR_STATUS), 0);
    assert_eq!(c.vfio.reg(reg::ERR_STATUS), err::TX_READ, "answering does not clear the error");

    // C clears its error, A clears its answer bytes and asks again.
    c.vfio.set_reg(reg::ERR_STATUS, err::TX_READ);
    a.ram.write(at(0), &[0; 8]);
    a.vfio.region_write(BAR_TX, 7 * PAGE_SIZE, &[0xA5; 4], true);
    poll("the second ACK answers", || (a.ram.read(at(nb), 1)[0] != 0 && a.ram.read(at(nc), 1)[0] != 0).then_some(()));
    assert_eq!(a.ram.read(at(nb), 1)[0], 0x80);
    assert_eq!(a.ram.read(at(nc), 1)[0], 0x80);
    assert_eq!(a.ram.read(at(na), 1)[0], 0);
    assert_zero_except("B's RAM", &b.ram.all(), &[]);
    assert_zero_except("C's RAM", &c.ram.all(), &[]);
}

/// Sets up B to receive page 5 with INT from A, with all causes cleared and
/// only NOTIFY enabled. Returns (A, B).
fn notify_pair(hub: &Hub) -> (Node, Node) {
    let mut a = Node::start(hub, "a", IOVA, RAM_OFF, RAM);
    let mut b = Node::start(hub, "b", IOVA, RAM_OFF, RAM);
    b.vfio.set_pct(5, pct::RX | pct::INT, rx_buf(5));
    a.vfio.set_pct(5, pct::TX, 0);
    // Joining raised LINK; start from nothing pending.
    b.vfio.set_reg(reg::INT_CAUSE, int::ALL);
    assert_eq!(b.vfio.reg(reg::INT_CAUSE), 0);
    (a, b)
}

/// A posted store of `v` to page 5 at `off`, flushed by a register read.
fn notify_store(a: &mut Node, off: u64, v: u64) {
    a.vfio.region_write(BAR_TX, 5 * PAGE_SIZE + off, &v.to_le_bytes(), true);
    assert_eq!(a.vfio.reg(reg::ERR_STATUS), 0);
}

const QUIET: Duration = Duration::from_millis(200);
const SIGNAL: Duration = Duration::from_secs(2);

#[test]
fn adapter_interrupt_msix_on_notify() {
    let hub = Hub::start();
    let (mut a, mut b) = notify_pair(&hub);
    let efd = eventfd();
    b.vfio.set_irqs(IRQ_MSIX, IRQ_DATA_EVENTFD | IRQ_ACTION_TRIGGER, 0, 1, &[efd.as_raw_fd()]);
    b.vfio.set_reg(reg::INT_MASK, int::NOTIFY);
    assert_eq!(b.vfio.reg(reg::INT_MASK), int::NOTIFY);
    assert_eq!(wait_eventfd(&efd, Duration::ZERO), None, "signalled with nothing pending");

    // A notification with NOTIFY enabled: one MSI-X message.
    notify_store(&mut a, 0x40, 0x1111);
    assert_eq!(wait_eventfd(&efd, SIGNAL), Some(1), "no MSI-X message for a notification");
    assert_eq!(b.ram.read(ram_at(5, 0x40), 8), 0x1111u64.to_le_bytes());
    assert_eq!(b.vfio.reg(reg::INT_CAUSE), int::NOTIFY);
    assert_eq!(b.vfio.reg(reg::NOTIFY_COUNT), 1);
    assert_eq!(b.vfio.reg(reg::NOTIFY_FIFO), 5);
    assert_eq!(b.vfio.reg(reg::NOTIFY_FIFO), NOTIFY_EMPTY);
    assert_eq!(b.vfio.reg(reg::NOTIFY_COUNT), 0);
    assert_eq!(b.vfio.reg(reg::NOTIFY_LOST), 0);
    b.vfio.set_reg(reg::INT_CAUSE, int::NOTIFY);
    assert_eq!(b.vfio.reg(reg::INT_CAUSE), 0);
    assert_eq!(wait_eventfd(&efd, Duration::ZERO), None, "clearing the cause signalled");

    // NOTIFY disabled: the notification is queued, no message.
    b.vfio.set_reg(reg::INT_MASK, 0);
    notify_store(&mut a, 0x48, 0x2222);
    poll("the second notification to be queued", || (b.vfio.reg(reg::NOTIFY_COUNT) == 1).then_some(()));
    assert_eq!(wait_eventfd(&efd, QUIET), None, "signalled while NOTIFY is masked");
    assert_eq!(b.vfio.reg(reg::INT_CAUSE), int::NOTIFY);
    // Enabling a pending cause sends the message.
    b.vfio.set_reg(reg::INT_MASK, int::NOTIFY);
    assert_eq!(wait_eventfd(&efd, SIGNAL), Some(1), "enabling a pending cause did not signal");

    // While NOTIFY is still pending, another notification sends no message
    // (a message goes out when a bit of INT_CAUSE & INT_MASK becomes set).
    notify_store(&mut a, 0x50, 0x3333);
    poll("the third notification to be queued", || (b.vfio.reg(reg::NOTIFY_COUNT) == 2).then_some(()));
    assert_eq!(wait_eventfd(&efd, QUIET), None);
    // The driver's loop: W1C, then drain until empty.
    b.vfio.set_reg(reg::INT_CAUSE, int::NOTIFY);
    assert_eq!(b.vfio.reg(reg::NOTIFY_FIFO), 5);
    assert_eq!(b.vfio.reg(reg::NOTIFY_FIFO), 5);
    assert_eq!(b.vfio.reg(reg::NOTIFY_FIFO), NOTIFY_EMPTY);
    assert_eq!(b.vfio.reg(reg::INT_CAUSE), 0);

    // The vector masked by the host: held pending, sent on unmask.
    b.vfio.set_irqs(IRQ_MSIX, IRQ_DATA_NONE | IRQ_ACTION_MASK, 0, 1, &[]);
    notify_store(&mut a, 0x58, 0x4444);
    poll("the fourth notification to be queued", || (b.vfio.reg(reg::NOTIFY_COUNT) == 1).then_some(()));
    assert_eq!(wait_eventfd(&efd, QUIET), None, "signalled while the vector is masked");
    b.vfio.set_irqs(IRQ_MSIX, IRQ_DATA_NONE | IRQ_ACTION_UNMASK, 0, 1, &[]);
    assert_eq!(wait_eventfd(&efd, SIGNAL), Some(1), "the pending message was not sent on unmask");
    assert_eq!(b.vfio.reg(reg::NOTIFY_FIFO), 5);
    assert_eq!(b.vfio.reg(reg::NOTIFY_LOST), 0);
    assert_eq!(b.vfio.reg(reg::RX_PACKETS), 4);
}

#[test]
fn adapter_interrupt_intx_automask() {
    let hub = Hub::start();
    let (mut a, mut b) = notify_pair(&hub);
    let efd = eventfd();
    b.vfio.set_irqs(IRQ_INTX, IRQ_DATA_EVENTFD | IRQ_ACTION_TRIGGER, 0, 1, &[efd.as_raw_fd()]);
    b.vfio.set_reg(reg::INT_MASK, int::NOTIFY);

    // Two notifications in a row: INTx is asserted once.
    notify_store(&mut a, 0x00, 1);
    notify_store(&mut a, 0x10, 2);
    poll("two notifications", || (b.vfio.reg(reg::NOTIFY_COUNT) == 2).then_some(()));
    assert_eq!(wait_eventfd(&efd, SIGNAL), Some(1), "INTx signalled other than once for two notifications");
    assert_eq!(wait_eventfd(&efd, QUIET), None);

    // Automasked: even a cause that is cleared and set again stays quiet
    // until the host unmasks.
    b.vfio.set_reg(reg::INT_CAUSE, int::NOTIFY);
    assert_eq!(b.vfio.reg(reg::NOTIFY_FIFO), 5);
    assert_eq!(b.vfio.reg(reg::NOTIFY_FIFO), 5);
    assert_eq!(b.vfio.reg(reg::NOTIFY_FIFO), NOTIFY_EMPTY);
    notify_store(&mut a, 0x20, 3);
    poll("the third notification", || (b.vfio.reg(reg::NOTIFY_COUNT) == 1).then_some(()));
    assert_eq!(b.vfio.reg(reg::INT_CAUSE), int::NOTIFY);
    assert_eq!(wait_eventfd(&efd, QUIET), None, "INTx signalled while automasked");

    // Unmask while the cause is pending: asserted again.
    b.vfio.set_irqs(IRQ_INTX, IRQ_DATA_NONE | IRQ_ACTION_UNMASK, 0, 1, &[]);
    assert_eq!(wait_eventfd(&efd, SIGNAL), Some(1), "unmask with a cause pending did not signal");

    // Handled: cleared and drained. Unmasking with nothing pending is quiet,
    // and the next notification asserts it again.
    b.vfio.set_reg(reg::INT_CAUSE, int::NOTIFY);
    assert_eq!(b.vfio.reg(reg::NOTIFY_FIFO), 5);
    assert_eq!(b.vfio.reg(reg::NOTIFY_FIFO), NOTIFY_EMPTY);
    b.vfio.set_irqs(IRQ_INTX, IRQ_DATA_NONE | IRQ_ACTION_UNMASK, 0, 1, &[]);
    assert_eq!(wait_eventfd(&efd, QUIET), None, "unmask with nothing pending signalled");
    notify_store(&mut a, 0x30, 4);
    assert_eq!(wait_eventfd(&efd, SIGNAL), Some(1));
    assert_eq!(b.vfio.reg(reg::INT_CAUSE), int::NOTIFY);
    assert_eq!(b.vfio.reg(reg::RX_PACKETS), 4);
    assert_eq!(b.ram.read(ram_at(5, 0x30), 8), 4u64.to_le_bytes());
}

#[test]
fn adapter_link_down_and_rejoin() {
    let hub = Hub::start();
    let mut a = Node::start_rejoining(&hub, "a", IOVA, RAM_OFF, RAM);
    let mut b = Node::start_rejoining(&hub, "b", IOVA, RAM_OFF, RAM);
    let (na, nb) = (a.adapter.node, b.adapter.node);
    let both = (1 << na) | (1 << nb);
    let ports = 8 << 16;
    poll("A to see B join", || (a.vfio.reg(reg::MEMBERS_LO) == both).then_some(()));
    assert_eq!(b.vfio.reg(reg::MEMBERS_LO), both);
    b.vfio.set_pct(0, pct::RX, rx_buf(0));
    a.vfio.set_pct(0, pct::TX, 0);
    b.vfio.set_pct(1, pct::TX, 0);
    a.vfio.region_write(BAR_TX, 0, &[0x11; 8], true);
    poll("a store before the link goes down", || (b.ram.read(ram_at(0, 0), 8) == [0x11; 8]).then_some(()));
    b.vfio.set_reg(reg::INT_CAUSE, int::ALL);
    assert_eq!(b.vfio.reg(reg::ERR_STATUS), 0);
    assert_eq!(b.vfio.reg(reg::LINK_EVENTS), 1, "B's own join");
    let a_events = a.vfio.reg(reg::LINK_EVENTS);
    assert_eq!(a_events, 2, "A's own join and B's");

    // The hub pulls B's cable.
    hub.control_ok(Control::LinkDown { node: nb });
    poll("B's link to go down", || (b.vfio.reg(reg::LINK) == 0).then_some(()));
    poll("B to raise LINK", || (b.vfio.reg(reg::INT_CAUSE) == int::LINK | int::ERROR).then_some(()));
    assert_eq!(b.vfio.reg(reg::NODE), ports | 0xFFFF);
    assert_eq!(b.vfio.reg(reg::ERR_STATUS), err::LINK_DOWN);
    assert_eq!(b.vfio.reg(reg::ERR_COUNT), 1);
    assert_eq!(b.vfio.reg(reg::MEMBERS_LO), 0);
    assert_eq!(b.vfio.reg(reg::LINK_EVENTS), 2);
    // LINK_DOWN cannot be cleared while the link is down.
    b.vfio.set_reg(reg::ERR_STATUS, err::LINK_DOWN);
    assert_eq!(b.vfio.reg(reg::ERR_STATUS), err::LINK_DOWN);
    // A sees B leave.
    poll("A to see B leave", || (a.vfio.reg(reg::MEMBERS_LO) == 1 << na).then_some(()));
    poll("A to count B leaving", || (a.vfio.reg(reg::LINK_EVENTS) == a_events + 1).then_some(()));
    assert_eq!(a.vfio.reg(reg::LINK), 1);
    assert_eq!(a.vfio.reg(reg::ERR_STATUS), 0);
    assert!(hub.stats().iter().all(|n| n.node != nb), "B still listed by the hub");
    assert_eq!(b.vfio.reg(reg::MEMBERS_HI), 0);
    // Stores from B while its link is down are dropped at B: one error and
    // TX_LINK_DOWN per packet. Two contiguous stores in one message are one
    // packet; a store elsewhere is another.
    let (w0, w1) = ([0x22u8; 8], [0x23u8; 8]);
    b.vfio.write_multi(&[(BAR_TX, PAGE_SIZE, &w0[..]), (BAR_TX, PAGE_SIZE + 8, &w1[..])], true);
    assert_eq!(b.vfio.reg(reg::ERR_COUNT), 2, "two coalesced stores are one dropped packet");
    assert_eq!(b.vfio.reg(reg::ERR_STATUS), err::LINK_DOWN | err::TX_LINK_DOWN);
    b.vfio.region_write(BAR_TX, PAGE_SIZE + 0x100, &[0x24; 8], true);
    assert_eq!(b.vfio.reg(reg::ERR_COUNT), 3);
    assert_eq!(b.vfio.reg(reg::TX_PACKETS), 0);
    // TX_LINK_DOWN is an ordinary W1C bit, even while the link is down.
    b.vfio.set_reg(reg::ERR_STATUS, err::TX_LINK_DOWN);
    assert_eq!(b.vfio.reg(reg::ERR_STATUS), err::LINK_DOWN);
    // Held down: B's rejoin attempts (every 200 ms) are refused.
    std::thread::sleep(Duration::from_millis(450));
    assert_eq!(b.vfio.reg(reg::LINK), 0, "B rejoined while held down");

    b.vfio.set_reg(reg::INT_CAUSE, int::ALL);
    hub.control_ok(Control::LinkUp { node: nb });
    let t = Instant::now();
    poll("B to rejoin", || (b.vfio.reg(reg::LINK) == 1).then_some(()));
    assert!(t.elapsed() < Duration::from_secs(2), "B took {:?} to rejoin", t.elapsed());
    assert_eq!(b.vfio.reg(reg::NODE), ports | nb as u32, "B rejoined as another node");
    assert_eq!(b.vfio.reg(reg::MEMBERS_LO), both);
    assert_eq!(b.vfio.reg(reg::LINK_EVENTS), 3);
    assert_eq!(b.vfio.reg(reg::INT_CAUSE), int::LINK);
    // LINK_DOWN stays latched until the driver clears it; now it can.
    assert_eq!(b.vfio.reg(reg::ERR_STATUS), err::LINK_DOWN);
    b.vfio.set_reg(reg::ERR_STATUS, err::LINK_DOWN);
    assert_eq!(b.vfio.reg(reg::ERR_STATUS), 0);
    poll("A to see B rejoin", || (a.vfio.reg(reg::MEMBERS_LO) == both).then_some(()));
    poll("A to count B rejoining", || (a.vfio.reg(reg::LINK_EVENTS) == a_events + 2).then_some(()));

    // Stores flow again, both ways.
    a.vfio.region_write(BAR_TX, 8, &[0x33; 8], true);
    poll("a store after the rejoin", || (b.ram.read(ram_at(0, 8), 8) == [0x33; 8]).then_some(()));
    // None of B's dropped stores reached A (it had no RX on page 1: they
    // would be counted there).
    assert_eq!(a.vfio.reg(reg::RX_DROPPED), 0);
    a.vfio.set_pct(1, pct::RX, rx_buf(1));
    b.vfio.region_write(BAR_TX, PAGE_SIZE + 16, &[0x44; 8], true);
    poll("B's store after the rejoin", || (a.ram.read(ram_at(1, 16), 8) == [0x44; 8]).then_some(()));
    assert_eq!(b.vfio.reg(reg::TX_PACKETS), 1);
    assert_eq!(b.vfio.reg(reg::RX_PACKETS), 2);
    assert_eq!(b.vfio.reg(reg::ERR_STATUS), 0);
    assert_eq!(b.vfio.reg(reg::ERR_COUNT), 3);
    assert_eq!(a.vfio.reg(reg::ERR_STATUS), 0);
    assert_zero_except("B's RAM", &b.ram.all(), &[(ram_at(0, 0) as usize, 16)]);
}

#[test]
fn adapter_corrupt_packet_counted_not_applied() {
    let hub = Hub::start();
    let mut a = Node::start(&hub, "a", IOVA, RAM_OFF, RAM);
    let mut b = Node::start(&hub, "b", IOVA, RAM_OFF, RAM);
    let (na, nb) = (a.adapter.node, b.adapter.node);
    b.vfio.set_pct(0, pct::RX, rx_buf(0));
    a.vfio.set_pct(0, pct::TX, 0);

    hub.control_ok(Control::Corrupt { node: nb, count: 2 });
    // Three separate packets (a register read between stores ends a packet).
    for (k, off) in [0x00u64, 0x40, 0x80].into_iter().enumerate() {
        a.vfio.region_write(BAR_TX, off, &[0x11 * (k as u8 + 1); 8], true);
        assert_eq!(a.vfio.reg(reg::ERR_STATUS), 0);
    }
    assert_eq!(a.vfio.reg(reg::TX_PACKETS), 3);
    poll("the third store to land", || (b.ram.read(ram_at(0, 0x80), 8) == [0x33; 8]).then_some(()));
    poll("B to count it", || (b.vfio.reg(reg::RX_PACKETS) == 1).then_some(()));
    assert_eq!(b.vfio.reg(reg::ERR_STATUS), err::CRC);
    assert_eq!(b.vfio.reg(reg::ERR_COUNT), 2);
    assert_eq!(b.vfio.reg(reg::RX_DROPPED), 0);
    assert_zero_except("B's RAM", &b.ram.all(), &[(ram_at(0, 0x80) as usize, 8)]);
    // The link stays up: a bad packet is dropped, not fatal.
    assert_eq!(b.vfio.reg(reg::LINK), 1);
    assert_eq!(b.vfio.reg(reg::NODE) & 0xFFFF, nb as u32);
    let sb = hub.node_stats(nb);
    assert_eq!((sb.corrupted, sb.frames_out), (2, 3));
    let sa = hub.node_stats(na);
    assert_eq!((sa.corrupted, sa.writes_in, sa.bytes_in, sa.dropped), (0, 3, 24, 0));

    // The budget is spent: the next packet is applied.
    a.vfio.region_write(BAR_TX, 0xC0, &[0x44; 8], true);
    poll("the fourth store to land", || (b.ram.read(ram_at(0, 0xC0), 8) == [0x44; 8]).then_some(()));
    poll("B to count it", || (b.vfio.reg(reg::RX_PACKETS) == 2).then_some(()));
    assert_eq!(b.vfio.reg(reg::ERR_COUNT), 2);
    assert_eq!(hub.node_stats(nb).corrupted, 2);
    b.vfio.set_reg(reg::ERR_STATUS, err::CRC);
    assert_eq!(b.vfio.reg(reg::ERR_STATUS), 0);
}

/// A delay on a local port holds that port's deliveries only: the other
/// receivers get the same writes at once, the held ones arrive in order
/// (through the port's corruption count) once the delay is lifted, and an
/// ACK store held at a delayed port is still answered.
#[test]
fn a_delayed_local_port_holds_only_its_own_deliveries() {
    let hub = Hub::start();
    let mut a = Node::start(&hub, "a", IOVA, RAM_OFF, RAM);
    let mut b = Node::start_local(&hub, "b", IOVA, RAM_OFF, RAM);
    let mut c = Node::start_local(&hub, "c", IOVA, RAM_OFF, RAM);
    let (nb, nc) = (b.adapter.node, c.adapter.node);
    a.vfio.set_pct(0, pct::TX, 0);
    for r in [&mut b, &mut c] {
        r.vfio.set_pct(0, pct::RX, rx_buf(0));
    }
    // Long enough that C's copies cannot be late by comparison.
    hub.control_ok(Control::Delay { node: nb, micros: 1_000_000 });
    hub.control_ok(Control::Corrupt { node: nb, count: 1 });
    for (k, off) in [0x00u64, 0x40, 0x80].into_iter().enumerate() {
        a.vfio.region_write(BAR_TX, off, &[0x11 * (k as u8 + 1); 8], true);
        assert_eq!(a.vfio.reg(reg::ERR_STATUS), 0);
    }
    poll("C to receive all three", || (c.vfio.reg(reg::RX_PACKETS) == 3).then_some(()));
    assert_eq!(b.vfio.reg(reg::RX_PACKETS), 0, "B's deliveries are held");
    assert_eq!(b.vfio.reg(reg::ERR_COUNT), 0, "nothing applied to B yet, not even the corruption");
    let held = hub.node_stats(nb).queued;
    assert!((2..=3).contains(&held), "B holds {held} frames");
    assert_eq!(hub.node_stats(nc).queued, 0);
    assert_eq!(c.vfio.reg(reg::ERR_COUNT), 0, "the corruption was B's alone");
    // Lifted: what is held goes out at once, in order, the first corrupted.
    hub.control_ok(Control::Delay { node: nb, micros: 0 });
    poll("B to apply the rest", || (b.vfio.reg(reg::RX_PACKETS) == 2).then_some(()));
    assert_eq!(b.vfio.reg(reg::ERR_COUNT), 1);
    assert_eq!(b.vfio.reg(reg::ERR_STATUS), err::CRC);
    assert_zero_except("B's RAM", &b.ram.all(), &[(ram_at(0, 0x40) as usize, 8), (ram_at(0, 0x80) as usize, 8)]);
    assert_eq!(b.ram.read(ram_at(0, 0x80), 8), vec![0x33; 8]);
    assert_eq!(hub.node_stats(nb).queued, 0);
    b.vfio.set_reg(reg::ERR_STATUS, err::CRC);

    // An ACK store held at B: B's port answers it once it is applied.
    let buf = 0x2000;
    a.vfio.set_pct(7, pct::TX | pct::RX | pct::ACK, IOVA + buf);
    hub.control_ok(Control::Delay { node: nb, micros: 200_000 });
    a.vfio.region_write(BAR_TX, 7 * PAGE_SIZE, &[0x5A; 8], true);
    let at = |n: u16| RAM_OFF + buf + n as u64;
    poll("C's answer", || (a.ram.read(at(nc), 1)[0] != 0).then_some(()));
    poll("B's answer, after its delay", || (a.ram.read(at(nb), 1)[0] != 0).then_some(()));
    assert_eq!(a.ram.read(at(nb), 1)[0], 0x80, "B has no error");
    assert_eq!(a.ram.read(at(nc), 1)[0], 0x80);
    hub.control_ok(Control::Delay { node: nb, micros: 0 });
}

/// xorshift64*: a tiny seeded generator, so a failure can be replayed.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(pattern_word(seed) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const ORDER_NODES: usize = 4;
/// Pages 0-3 take the random stores; page 4 the markers.
const ORDER_PAGES: u64 = 4;
/// The stores go to the first `HOT` bytes of each page, so they overlap a lot.
const HOT: u64 = 96;
const ORDER_OPS: usize = 300;

/// One random store or `REGION_WRITE_MULTI` batch: (offset in the transmit window, bytes).
fn random_store(rng: &mut Rng) -> (u64, Vec<u8>) {
    let size = [1u64, 2, 4, 8][rng.below(4) as usize];
    let off = rng.below(ORDER_PAGES) * PAGE_SIZE + rng.below(HOT - size + 1);
    let data = (0..size).map(|_| rng.next() as u8).collect();
    (off, data)
}

/// Four adapters, each storing concurrently into the same four pages with
/// loopback on: every node applies every write, its own included. If the hub
/// delivered overlapping writes to two nodes in different orders, their
/// memories would differ.
#[test]
fn adapter_total_order_property() {
    let hub = Hub::start();
    let nodes: Vec<Node> = (0..ORDER_NODES).map(|k| Node::start(&hub, &format!("n{k}"), IOVA, RAM_OFF, RAM)).collect();
    let start = Arc::new(Barrier::new(ORDER_NODES));
    let mut threads = Vec::new();
    let mut rams = Vec::new();
    for (k, node) in nodes.into_iter().enumerate() {
        let Node { adapter, mut vfio, ram } = node;
        rams.push(ram);
        for p in 0..=ORDER_PAGES {
            vfio.set_pct(p, pct::TX | pct::RX | pct::LOOPBACK, rx_buf(p));
        }
        let start = start.clone();
        threads.push(std::thread::spawn(move || {
            let mut rng = Rng::new(0x7A1_0000 + k as u64);
            // Every store this node made, in order: (window offset, bytes).
            let mut log: Vec<(u64, Vec<u8>)> = Vec::new();
            start.wait();
            for _ in 0..ORDER_OPS {
                if rng.below(8) == 0 {
                    let batch: Vec<(u64, Vec<u8>)> = (0..2 + rng.below(19)).map(|_| random_store(&mut rng)).collect();
                    let entries: Vec<(u32, u64, &[u8])> = batch.iter().map(|(o, d)| (BAR_TX, *o, &d[..])).collect();
                    vfio.write_multi(&entries, true);
                    log.extend(batch);
                } else {
                    let (off, data) = random_store(&mut rng);
                    vfio.region_write(BAR_TX, off, &data, true);
                    log.push((off, data));
                }
            }
            // Fence: the posted stores have all been taken by the adapter.
            assert_eq!(vfio.reg(reg::ERR_STATUS), 0, "node {k}: store flagged an error");
            // Marker, last: once a node has it, it has all of this node's stores.
            let marker = 0x4D41_524B_0000_0000u64 | (k as u64 + 1);
            vfio.region_write(BAR_TX, ORDER_PAGES * PAGE_SIZE + 8 * k as u64, &marker.to_le_bytes(), true);
            (adapter, vfio, log)
        }));
    }
    let results: Vec<_> = threads.into_iter().map(|t| t.join().expect("sender thread panicked")).collect();

    let markers: Vec<u8> =
        (0..ORDER_NODES as u64).flat_map(|k| (0x4D41_524B_0000_0000u64 | (k + 1)).to_le_bytes()).collect();
    for (k, ram) in rams.iter().enumerate() {
        poll(&format!("node {k} to see every marker"), || {
            (ram.read(ram_at(ORDER_PAGES, 0), markers.len()) == markers).then_some(())
        });
    }

    // Every node received every packet of every node, in one order.
    let (adapters, mut vfios, logs): (Vec<_>, Vec<_>, Vec<_>) = results.into_iter().fold(
        (Vec::new(), Vec::new(), Vec::new()),
        |(mut a, mut v, mut l), (adapter, vfio, log)| {
            a.push(adapter);
            v.push(vfio);
            l.push(log);
            (a, v, l)
        },
    );
    let sent: u32 = vfios.iter_mut().map(|v| v.reg(reg::TX_PACKETS)).sum();
    assert!(sent >= (ORDER_NODES * ORDER_OPS) as u32 / 2, "only {sent} packets were sent");
    for (k, v) in vfios.iter_mut().enumerate() {
        poll(&format!("node {k} to count every packet"), || (v.reg(reg::RX_PACKETS) == sent).then_some(()));
        assert_eq!(v.reg(reg::RX_DROPPED), 0);
        assert_eq!(v.reg(reg::ERR_STATUS), 0);
    }
    let last_seq: Vec<u32> = vfios.iter_mut().map(|v| v.reg(reg::LAST_SEQ)).collect();
    assert!(last_seq.iter().all(|s| *s == last_seq[0]), "LAST_SEQ differs: {last_seq:?}");

    let reference = rams[0].all();
    for (k, ram) in rams.iter().enumerate().skip(1) {
        let mine = ram.all();
        if let Some(i) = (0..mine.len()).find(|&i| mine[i] != reference[i]) {
            panic!(
                "node {k} applied the writes in another order than node 0: byte at file offset {i:#x} is {:#04x}, node 0 has {:#04x}",
                mine[i], reference[i]
            );
        }
    }

    // The test can tell orders apart: many bytes were written by several
    // nodes. And what every node holds is a legal outcome: each byte holds the
    // last value some node wrote to it (a node's stores stay in its order),
    // and bytes nobody wrote are zero.
    let mut last: Vec<Vec<Option<u8>>> = vec![vec![None; (ORDER_PAGES * PAGE_SIZE) as usize]; ORDER_NODES];
    for (k, log) in logs.iter().enumerate() {
        for (off, data) in log.iter() {
            for (i, b) in data.iter().enumerate() {
                last[k][*off as usize + i] = Some(*b);
            }
        }
    }
    let mut contested = 0;
    for at in 0..(ORDER_PAGES * PAGE_SIZE) as usize {
        let candidates: Vec<u8> = last.iter().filter_map(|l| l[at]).collect();
        let got = reference[RAM_OFF as usize + at];
        if candidates.is_empty() {
            assert_eq!(got, 0, "byte {at:#x} was written by nobody");
        } else {
            assert!(
                candidates.contains(&got),
                "byte {at:#x} is {got:#04x}, not the last value of any node: {candidates:?}"
            );
        }
        let mut distinct = candidates.clone();
        distinct.sort_unstable();
        distinct.dedup();
        if distinct.len() > 1 {
            contested += 1;
        }
    }
    eprintln!("{sent} packets, {contested} contested bytes, last seq {}", last_seq[0]);
    assert!(contested > 200, "only {contested} bytes were last written with different values by different nodes");
    assert_zero_except("node 0's RAM", &reference, &[(RAM_OFF as usize, (ORDER_PAGES * PAGE_SIZE) as usize + 32)]);
    for a in &adapters {
        a.assert_alive();
    }
}

/// A point-to-point page whose destination field is 0xFFFF (the link's
/// broadcast value) is a bad destination, not a broadcast.
#[test]
fn adapter_p2p_dest_ffff_is_not_broadcast() {
    let hub = Hub::start();
    let mut a = Node::start(&hub, "a", IOVA, RAM_OFF, RAM);
    let mut b = Node::start(&hub, "b", IOVA, RAM_OFF, RAM);
    b.vfio.set_pct(0, pct::RX, IOVA);
    a.vfio.set_pct(0, pct::TX | pct::P2P | (0xFFFF << pct::DEST_SHIFT), 0);
    a.vfio.region_write(BAR_TX, 0, &[0x33; 8], true);
    assert_eq!(a.vfio.reg(reg::ERR_STATUS), err::TX_DEST);
    assert_eq!(a.vfio.reg(reg::TX_PACKETS), 0);
    std::thread::sleep(QUIET);
    assert_eq!(b.vfio.reg(reg::RX_PACKETS), 0);
    assert_zero_except("B's RAM", &b.ram.all(), &[]);
}

/// A device reset (and a new client) forgets interrupt masks: a vector the
/// previous driver masked must not stay silent for the next one.
#[test]
fn adapter_reset_forgets_interrupt_masks() {
    let hub = Hub::start();
    let (mut a, mut b) = notify_pair(&hub);
    let efd = eventfd();
    b.vfio.set_irqs(IRQ_MSIX, IRQ_DATA_EVENTFD | IRQ_ACTION_TRIGGER, 0, 1, &[efd.as_raw_fd()]);
    b.vfio.set_irqs(IRQ_MSIX, IRQ_DATA_NONE | IRQ_ACTION_MASK, 0, 1, &[]);
    b.vfio.set_reg(reg::CTRL, regs::ctrl::RESET);
    // Reprogram after the reset, as a driver does; no UNMASK sent.
    b.vfio.set_pct(5, pct::RX | pct::INT, rx_buf(5));
    b.vfio.set_reg(reg::INT_MASK, int::NOTIFY);
    notify_store(&mut a, 0x40, 0x4444);
    assert_eq!(wait_eventfd(&efd, SIGNAL), Some(1), "the vector stayed masked across the reset");
}

/// The hub goes away and comes back (a restarted `mc-hub`): adapters see the
/// link error and an error count, never a hang, and rejoin by themselves as
/// the same nodes; stores flow again.
#[test]
fn hub_restart_adapters_reconnect() {
    let mut hub = Hub::start();
    let mut a = Node::start_connected(&hub, "a", IOVA, RAM_OFF, RAM);
    let mut b = Node::start_connected(&hub, "b", IOVA, RAM_OFF, RAM);
    let (na, nb) = (a.vfio.reg(reg::NODE), b.vfio.reg(reg::NODE));
    b.vfio.set_pct(0, pct::RX, IOVA);
    a.vfio.set_pct(0, pct::TX, 0);

    hub.restart(hub::hub::HubConfig::default());
    for n in [&mut a, &mut b] {
        poll("the link to go down", || (n.vfio.reg(reg::ERR_STATUS) & err::LINK_DOWN != 0).then_some(()));
        assert!(n.vfio.reg(reg::ERR_COUNT) >= 1);
    }
    // Rejoined as the same nodes, without anyone asking.
    poll("A to rejoin", || (a.vfio.reg(reg::LINK) == 1).then_some(()));
    poll("B to rejoin", || (b.vfio.reg(reg::LINK) == 1).then_some(()));
    assert_eq!((a.vfio.reg(reg::NODE), b.vfio.reg(reg::NODE)), (na, nb));
    poll("both to see each other", || {
        (a.vfio.reg(reg::MEMBERS_LO) == 0b11 && b.vfio.reg(reg::MEMBERS_LO) == 0b11).then_some(())
    });
    a.vfio.region_write(BAR_TX, 16, &0x77u64.to_le_bytes(), true);
    let at = RAM_OFF + 16;
    poll("a store after the restart to land", || (b.ram.read(at, 8) == 0x77u64.to_le_bytes()).then_some(()));
}

/// An adapter joins a hub over TCP with the cluster secret and exchanges
/// stores with a Unix-socket adapter; a wrong secret is refused at once with
/// a clear error.
#[test]
fn adapter_joins_over_tcp_with_secret() {
    use device::adapter::{Adapter, AdapterConfig};
    use device::link_client::HubAddr;
    let secret = b"a cluster secret of some length".to_vec();
    let hub = Hub::start_with(hub::hub::HubConfig { secret: Some(secret.clone()), ..Default::default() });
    let tcp = hub.listen_tcp();
    let cfg = |s: &[u8]| AdapterConfig {
        aspace: 1 << 20,
        hub: HubAddr::Tcp(tcp.clone()),
        secret: Some(s.to_vec()),
        want_node: link::ANY_NODE,
        name: "remote".into(),
        hub_wait: Duration::from_secs(2),
    };
    let e = Adapter::new(1 << 20).unwrap().connect(&cfg(b"not the cluster secret at all")).unwrap_err();
    assert!(e.to_string().contains("wrong cluster secret"), "{e}");

    let mut remote = Adapter::new(1 << 20).unwrap();
    remote.connect(&cfg(&secret)).unwrap();
    let r = AdapterHandle::serve(remote, "remote", 0, 0);
    let mut rc = r.client();
    let mut local = Node::start(&hub, "local", IOVA, RAM_OFF, RAM);
    local.vfio.set_pct(2, pct::RX, IOVA);
    rc.set_pct(2, pct::TX, 0);
    rc.region_write(BAR_TX, 2 * PAGE_SIZE, &0xBEEFu64.to_le_bytes(), true);
    poll("the TCP adapter's store to land", || (local.ram.read(RAM_OFF, 8) == 0xBEEFu64.to_le_bytes()).then_some(()));
    r.assert_alive();
}

/// DMA maps pipelined like QEMU's asynchronous map/unmap bursts: several
/// DMA_MAPs, each with its own memfd, sent back to back between posted
/// writes before the adapter reads any of them. Each map must get its own
/// fd: received stores land in the right file at the right offset.
#[test]
fn pipelined_dma_maps_keep_their_own_fds() {
    let hub = Hub::start();
    let mut a = Node::start(&hub, "a", IOVA, RAM_OFF, RAM);
    let mut b = Node::start(&hub, "b", IOVA, RAM_OFF, RAM);
    let files: Vec<GuestRam> = (0..4).map(|_| GuestRam::new(0x10000)).collect();
    let iova = |k: u64| 0x4000_0000 + k * 0x10000;
    b.vfio.set_pct(0, pct::TX, 0); // keeps B's store path busy with posted writes
    let mut ids = Vec::new();
    for (k, f) in files.iter().enumerate() {
        let mut body = Vec::new();
        body.extend_from_slice(&32u32.to_le_bytes());
        body.extend_from_slice(&DMA_RW.to_le_bytes());
        body.extend_from_slice(&(0x2000 * k as u64).to_le_bytes()); // file offset
        body.extend_from_slice(&iova(k as u64).to_le_bytes());
        body.extend_from_slice(&0x2000u64.to_le_bytes());
        let (id, m) = b.vfio.encode(CMD_DMA_MAP, F_REQUEST, &body);
        ids.push(id);
        // A posted write (no fd) before each map, so maps sit between fd-less messages.
        let (_, w) =
            b.vfio.encode(CMD_REGION_WRITE, F_REQUEST | F_NO_REPLY, &VfioClient::region_write_body(BAR_TX, 8, &[1; 8]));
        b.vfio.send_bytes(&w);
        b.vfio.send_with_fds(&m, &[f.as_raw_fd()]);
    }
    for id in ids {
        let r = b.vfio.recv_reply(id, CMD_DMA_MAP);
        assert!(!r.is_error(), "DMA_MAP failed: {r:?}");
    }
    // Page k of the address space lands in file k at offset 0x2000 * k.
    for k in 0..4u64 {
        b.vfio.set_pct(10 + k, pct::RX, iova(k));
        a.vfio.set_pct(10 + k, pct::TX, 0);
        a.vfio.region_write(BAR_TX, (10 + k) * PAGE_SIZE, &(0xF00D + k).to_le_bytes(), true);
    }
    for (k, f) in files.iter().enumerate() {
        let at = 0x2000 * k as u64;
        poll("each store in its own file", || (f.read(at, 8) == (0xF00D + k as u64).to_le_bytes()).then_some(()));
        let mut expect = vec![0u8; 0x10000];
        expect[at as usize..at as usize + 8].copy_from_slice(&(0xF00D + k as u64).to_le_bytes());
        assert_eq!(f.all(), expect, "file {k} holds exactly its one store");
    }
}

/// A local port whose QEMU goes away is announced as failed, like a node
/// that died; a new QEMU on the same socket brings the node back, as the
/// same node id.
#[test]
fn local_port_qemu_gone_is_announced_as_failed() {
    let hub = Hub::start();
    let mut a = Node::start_local(&hub, "a", IOVA, RAM_OFF, RAM);
    let b = Node::start_local(&hub, "b", IOVA, RAM_OFF, RAM);
    let (na, nb) = (a.adapter.node, b.adapter.node);
    let both = (1 << na) | (1 << nb);
    poll("A to see B", || (a.vfio.reg(reg::MEMBERS_LO) == both).then_some(()));
    let events = a.vfio.reg(reg::LINK_EVENTS);

    // B's QEMU dies: its socket closes.
    let sock = b.adapter.sock.clone();
    drop(b);
    poll("A to see B fail", || (a.vfio.reg(reg::MEMBERS_LO) == 1 << na).then_some(()));
    assert_eq!(a.vfio.reg(reg::LINK_EVENTS), events + 1);
    assert!(hub.stats().iter().all(|n| n.node != nb), "the hub still lists B");
    // A store to B point-to-point is dropped at the hub, nothing else breaks.
    a.vfio.set_pct(2, pct::TX | pct::P2P | ((nb as u64) << pct::DEST_SHIFT), 0);
    a.vfio.region_write(BAR_TX, 2 * PAGE_SIZE, &[1; 8], true);
    assert_eq!(a.vfio.reg(reg::ERR_STATUS), 0);
    poll("the hub to count the dropped write", || (hub.node_stats(na).dropped == 1).then_some(()));

    // A new QEMU for B: same node id, and stores reach it again.
    let mut vfio = VfioClient::connect(&sock);
    let ram = GuestRam::new(RAM_OFF + RAM);
    vfio.dma_map(IOVA, RAM, &ram, RAM_OFF);
    vfio.region_write(CONFIG_REGION, PCI_COMMAND, &PCI_COMMAND_MEMORY_MASTER.to_le_bytes(), false);
    poll("B to come back", || (vfio.reg(reg::NODE) & 0xFFFF == nb as u32).then_some(()));
    poll("A to see B back", || (a.vfio.reg(reg::MEMBERS_LO) == both).then_some(()));
    vfio.set_pct(2, pct::RX, rx_buf(2));
    a.vfio.region_write(BAR_TX, 2 * PAGE_SIZE + 8, &[7; 8], true);
    poll("the store to reach the new B", || (ram.read(ram_at(2, 8), 8) == [7; 8]).then_some(()));
}

/// ACK answers on a link port never wait behind the adapter's own
/// back-pressure. A floods stores that come back to itself (loopback) while
/// the hub's queue to it is tiny, and B asks A for its error status through
/// an ACK page in the middle of it. The answer must come, and the flood must
/// finish, without the hub cutting A off: a receive thread that waited for
/// the link's writer (held up by the hub, which waited for that receive
/// thread to drain) stalled until the hub's stall timeout.
#[test]
fn link_ack_answers_never_wait_behind_backpressure() {
    let hub = Hub::start_with(hub::hub::HubConfig {
        queue_depth: 2,
        stall_timeout: Duration::from_secs(60),
        ..Default::default()
    });
    let mut a = Node::start_link(&hub, "a", IOVA, RAM_OFF, RAM);
    let mut b = Node::start_link(&hub, "b", IOVA, RAM_OFF, RAM);
    let na = a.adapter.node as u64;
    a.vfio.set_pct(3, pct::TX | pct::RX | pct::LOOPBACK, rx_buf(3));
    b.vfio.set_pct(7, pct::TX | pct::RX | pct::ACK, rx_buf(7));
    const STORES: u64 = 200_000;
    const BATCH: u64 = 4096;
    let t0 = Instant::now();
    // A's fake QEMU pipelines the flood from its own thread, one packet per
    // store (stride 16), like a busy vCPU; B asks for ACKs meanwhile.
    let Node { adapter: a_adapter, vfio: mut a_vfio, ram: a_ram } = a;
    let flood = std::thread::spawn(move || {
        let mut i = 0;
        while i < STORES {
            let batch: Vec<(u32, u64, Vec<u8>)> = (i..(i + BATCH).min(STORES))
                .map(|k| (BAR_TX, 3 * PAGE_SIZE + (k * 16) % PAGE_SIZE, (k + 1).to_le_bytes().to_vec()))
                .collect();
            a_vfio.region_writes_posted_batch(&batch);
            i += BATCH;
        }
        a_vfio
    });
    let mut answers = 0;
    while !flood.is_finished() || answers == 0 {
        b.ram.write(ram_at(7, 0), &[0; 8]);
        b.vfio.region_write(BAR_TX, 7 * PAGE_SIZE, &[answers as u8; 8], true);
        poll("A's ACK answer during the flood", || (b.ram.read(ram_at(7, na), 1)[0] == 0x80).then_some(()));
        answers += 1;
    }
    let mut a_vfio = flood.join().unwrap();
    let at = RAM_OFF + 3 * PAGE_SIZE + ((STORES - 1) * 16) % PAGE_SIZE;
    poll("the flood to come back to A", || (a_ram.read(at, 8) == STORES.to_le_bytes()).then_some(()));
    eprintln!("{STORES} looped-back stores and {answers} ACK rounds in {:?}", t0.elapsed());
    a_adapter.assert_alive();
    assert_eq!(a_vfio.reg(reg::ERR_STATUS), 0);
    assert_eq!(a_vfio.reg(reg::LINK), 1);
    assert_eq!(hub.stats_json()["stalled"], 0, "the hub cut a node off");
}

/// Guest VFIO has no device reset: whatever the last user left carries over
/// to the next (here: a new vfio-user client without DEVICE_RESET), and
/// CTRL.RESET clears exactly what `docs/adapter.md` ("Reset") lists.
#[test]
fn adapter_state_survives_reconnect_until_ctrl_reset() {
    let hub = Hub::start();
    let mut a = Node::start(&hub, "a", IOVA, RAM_OFF, RAM);
    let mut b = Node::start(&hub, "b", IOVA, RAM_OFF, RAM);
    // A receives page 5 with INT from B, not page 6; transmits page 0.
    a.vfio.set_pct(5, pct::RX | pct::INT, rx_buf(5));
    a.vfio.set_pct(0, pct::TX, 0);
    b.vfio.set_pct(5, pct::TX, 0);
    b.vfio.set_pct(6, pct::TX, 0);
    b.vfio.set_pct(0, pct::RX, rx_buf(0));
    a.vfio.set_reg(reg::INT_MASK, int::NOTIFY | int::ERROR);
    b.vfio.region_write(BAR_TX, 5 * PAGE_SIZE, &[0x51; 8], true);
    b.vfio.region_write(BAR_TX, 5 * PAGE_SIZE + 0x100, &[0x52; 8], true);
    b.vfio.region_write(BAR_TX, 6 * PAGE_SIZE, &[0x61; 8], true);
    poll("A to queue two notifications and drop one", || {
        (a.vfio.reg(reg::NOTIFY_COUNT) == 2 && a.vfio.reg(reg::RX_DROPPED) == 1).then_some(())
    });
    a.vfio.region_write(BAR_TX, 0x20, &[0x0A; 8], true);
    poll("A's store to reach B", || (b.ram.read(ram_at(0, 0x20), 8) == [0x0A; 8]).then_some(()));
    assert_eq!(a.vfio.region_read(BAR_TX, 0, 4), vec![0xFF; 4]);

    let regs_of = |n: &mut Node| {
        [
            reg::ERR_STATUS,
            reg::ERR_COUNT,
            reg::INT_CAUSE,
            reg::INT_MASK,
            reg::NOTIFY_COUNT,
            reg::TX_PACKETS,
            reg::RX_PACKETS,
            reg::RX_DROPPED,
            reg::LINK_EVENTS,
            reg::LAST_SEQ,
            reg::NODE,
            reg::MEMBERS_LO,
        ]
        .map(|r| n.vfio.reg(r))
    };
    let before = regs_of(&mut a);
    let [err_status, err_count, cause, mask, queued, tx, rx, dropped, events, last_seq, node, members] = before;
    assert_eq!((err_status, err_count), (err::TX_READ, 1));
    assert_eq!((mask, queued, tx, rx, dropped), (int::NOTIFY | int::ERROR, 2, 1, 2, 1));
    assert_eq!(cause & (int::NOTIFY | int::ERROR), int::NOTIFY | int::ERROR);
    assert_ne!(last_seq, 0);
    let pct_before = a.vfio.region_read(BAR_PCT, 0, 4096);
    let command = a.pci_command();
    assert_eq!(command & PCI_COMMAND_MEMORY_MASTER, PCI_COMMAND_MEMORY_MASTER);

    // QEMU goes away; a new one connects and only maps RAM again.
    a.reconnect(IOVA, RAM_OFF, RAM);
    poll("A's link after the reconnect", || (a.vfio.reg(reg::LINK) == 1).then_some(()));
    assert_eq!(a.vfio.region_read(BAR_PCT, 0, 4096), pct_before, "the PCT carried over");
    assert_eq!(a.pci_command(), command, "configuration space (bus mastering) carried over");
    let after = regs_of(&mut a);
    let expect = match ports() {
        // QEMU gone took the node out of the cluster and back: one more
        // error (LINK_DOWN, latched), two more LINK events.
        Ports::Local => [
            err::TX_READ | err::LINK_DOWN,
            err_count + 1,
            cause | int::LINK | int::ERROR,
            mask,
            queued,
            tx,
            rx,
            dropped,
            events + 2,
            last_seq,
            node,
            members,
        ],
        // An mc-adapter keeps its link.
        Ports::Link => before,
    };
    assert_eq!(after, expect, "registers after a reconnect without reset ({:?} port)", ports());
    assert_eq!(a.vfio.reg(reg::NOTIFY_FIFO), 5, "the FIFO carried over");
    // The carried-over PCT still receives.
    b.vfio.region_write(BAR_TX, 5 * PAGE_SIZE + 0x200, &[0x53; 8], true);
    poll("a store after the reconnect", || (a.ram.read(ram_at(5, 0x200), 8) == [0x53; 8]).then_some(()));
    poll("its notification", || (a.vfio.reg(reg::NOTIFY_COUNT) == 2).then_some(()));
    let last_seq = a.vfio.reg(reg::LAST_SEQ);

    // CTRL.RESET: exactly the documented list.
    a.vfio.set_reg(reg::CTRL, regs::ctrl::RESET);
    assert_eq!(a.vfio.region_read(BAR_PCT, 0, 4096), vec![0u8; 4096], "PCT");
    for (r, name) in [
        (reg::ERR_STATUS, "ERR_STATUS"),
        (reg::ERR_COUNT, "ERR_COUNT"),
        (reg::INT_CAUSE, "INT_CAUSE"),
        (reg::INT_MASK, "INT_MASK"),
        (reg::NOTIFY_COUNT, "NOTIFY_COUNT"),
        (reg::NOTIFY_LOST, "NOTIFY_LOST"),
        (reg::TX_PACKETS, "TX_PACKETS"),
        (reg::RX_PACKETS, "RX_PACKETS"),
        (reg::RX_DROPPED, "RX_DROPPED"),
        (reg::LINK_EVENTS, "LINK_EVENTS"),
    ] {
        assert_eq!(a.vfio.reg(r), 0, "{name} after CTRL.RESET");
    }
    assert_eq!(a.vfio.reg(reg::NOTIFY_FIFO), NOTIFY_EMPTY);
    // Not reset: the cluster's state and configuration space.
    assert_eq!(a.vfio.reg(reg::NODE), node);
    assert_eq!(a.vfio.reg(reg::LINK), 1);
    assert_eq!(a.vfio.reg(reg::MEMBERS_LO), members);
    assert_eq!(a.vfio.reg(reg::LAST_SEQ), last_seq, "LAST_SEQ is not reset");
    assert_eq!(a.pci_command(), command, "CTRL.RESET left bus mastering alone");
    // Reprogramming the PCT is enough to receive again.
    a.vfio.set_pct(5, pct::RX, rx_buf(5));
    b.vfio.region_write(BAR_TX, 5 * PAGE_SIZE + 0x300, &[0x54; 8], true);
    poll("a store after the reset", || (a.ram.read(ram_at(5, 0x300), 8) == [0x54; 8]).then_some(()));
    assert_eq!(a.vfio.reg(reg::RX_PACKETS), 1);
    assert_ne!(a.vfio.reg(reg::LAST_SEQ), last_seq, "LAST_SEQ moves on from where it was");
}

/// The ACK page rules of `docs/adapter.md`: the sender's page needs TX; every
/// receiver answers whatever its PCT says; answering writes, counts and
/// notifies nothing there; each answer is a delivery at the sender (with INT,
/// one notification each; without RX, dropped); LOOPBACK makes the sender
/// answer itself; a P2P ACK page asks its destination only.
#[test]
fn adapter_ack_rules() {
    let hub = Hub::start();
    let mut a = Node::start(&hub, "a", IOVA, RAM_OFF, RAM);
    let mut b = Node::start(&hub, "b", IOVA, RAM_OFF, RAM);
    let mut c = Node::start(&hub, "c", IOVA, RAM_OFF, RAM);
    let mut d = Node::start(&hub, "d", IOVA, RAM_OFF, RAM);
    let (na, nb, nc, nd) = (a.adapter.node as u64, b.adapter.node as u64, c.adapter.node as u64, d.adapter.node as u64);
    let at = |p: u64, n: u64| ram_at(p, n);
    let answers = |n: &Node, p: u64| n.ram.read(at(p, 0), 8);

    // An ACK page needs TX: the store is dropped and nobody is asked.
    a.vfio.set_pct(7, pct::RX | pct::INT | pct::ACK, rx_buf(7));
    a.vfio.region_write(BAR_TX, 7 * PAGE_SIZE, &[1; 8], true);
    assert_eq!(a.vfio.reg(reg::ERR_STATUS), err::TX_DISABLED);
    assert_eq!(a.vfio.reg(reg::TX_PACKETS), 0, "an ACK store without TX was sent");
    // (A keeps TX_DISABLED latched: its own answer carries it below.)

    // Receivers' PCT for page 7: B RX and INT, C nothing at all, D RX.
    b.vfio.set_pct(7, pct::RX | pct::INT, rx_buf(7));
    d.vfio.set_pct(7, pct::RX, rx_buf(7));
    a.vfio.set_pct(7, pct::TX | pct::RX | pct::INT | pct::ACK, rx_buf(7));
    a.vfio.set_reg(reg::INT_CAUSE, int::ALL);
    a.vfio.region_write(BAR_TX, 7 * PAGE_SIZE + 0x100, &[0x5A; 8], true);
    poll("B, C and D to answer", || [nb, nc, nd].iter().all(|&n| a.ram.read(at(7, n), 1)[0] != 0).then_some(()));
    for n in [nb, nc, nd] {
        assert_eq!(a.ram.read(at(7, n), 1)[0], ACK_VALID, "node {n} answers, RX or not");
    }
    assert_eq!(a.ram.read(at(7, na), 1)[0], 0, "the sender answered itself without LOOPBACK");
    // At the sender, each answer is a delivery to an INT page.
    poll("A to count three answers", || (a.vfio.reg(reg::RX_PACKETS) == 3).then_some(()));
    assert_eq!(a.vfio.reg(reg::NOTIFY_COUNT), 3, "one notification per answer");
    for _ in 0..3 {
        assert_eq!(a.vfio.reg(reg::NOTIFY_FIFO), 7);
    }
    assert_eq!(a.vfio.reg(reg::NOTIFY_FIFO), NOTIFY_EMPTY);
    assert_eq!(a.vfio.reg(reg::INT_CAUSE) & int::NOTIFY, int::NOTIFY);
    // At the answering nodes: nothing written, counted or notified (B has INT).
    for r in [&mut b, &mut c, &mut d] {
        assert_eq!(r.vfio.reg(reg::RX_PACKETS), 0);
        assert_eq!(r.vfio.reg(reg::RX_DROPPED), 0);
        assert_eq!(r.vfio.reg(reg::NOTIFY_COUNT), 0);
        assert_eq!(r.vfio.reg(reg::INT_CAUSE) & int::NOTIFY, 0);
        assert_ne!(r.vfio.reg(reg::LAST_SEQ), 0, "the ACK store was delivered");
        assert_zero_except("an answering node's RAM", &r.ram.all(), &[]);
    }

    // LOOPBACK: the sender answers itself too, with its own error bits.
    a.ram.write(at(7, 0), &[0; 8]);
    a.vfio.set_pct(7, pct::TX | pct::RX | pct::ACK | pct::LOOPBACK, rx_buf(7));
    a.vfio.region_write(BAR_TX, 7 * PAGE_SIZE + 0x108, &[0x5B; 8], true);
    poll("all four answers", || [na, nb, nc, nd].iter().all(|&n| a.ram.read(at(7, n), 1)[0] != 0).then_some(()));
    assert_eq!(a.ram.read(at(7, na), 1)[0], ACK_VALID | err::TX_DISABLED as u8, "A's own answer");
    for n in [nb, nc, nd] {
        assert_eq!(a.ram.read(at(7, n), 1)[0], ACK_VALID);
    }
    poll("A to count seven answers", || (a.vfio.reg(reg::RX_PACKETS) == 7).then_some(()));

    // P2P to C: only C answers. A broadcast ACK on page 6 afterwards is the
    // fence: each node answers in the global order, so once B and D have
    // answered on page 6, any page-7 answer of theirs would have landed.
    a.ram.write(at(7, 0), &[0; 8]);
    a.vfio.set_pct(7, pct::TX | pct::RX | pct::ACK | pct::P2P | nc << pct::DEST_SHIFT, rx_buf(7));
    a.vfio.set_pct(6, pct::TX | pct::RX | pct::ACK, rx_buf(6));
    a.vfio.region_write(BAR_TX, 7 * PAGE_SIZE, &[0x5C; 8], true);
    a.vfio.region_write(BAR_TX, 6 * PAGE_SIZE, &[0x5D; 8], true);
    poll("the page-6 answers", || [nb, nc, nd].iter().all(|&n| a.ram.read(at(6, n), 1)[0] != 0).then_some(()));
    poll("C's page-7 answer", || (a.ram.read(at(7, nc), 1)[0] == ACK_VALID).then_some(()));
    let mut only_c = [0u8; 8];
    only_c[nc as usize] = ACK_VALID;
    assert_eq!(answers(&a, 7), only_c, "a P2P ACK asked someone else");

    // Without RX at the sender the answers are dropped there, and counted.
    a.vfio.set_pct(5, pct::TX | pct::ACK, rx_buf(5));
    let dropped = a.vfio.reg(reg::RX_DROPPED);
    a.vfio.region_write(BAR_TX, 5 * PAGE_SIZE, &[0x5E; 8], true);
    poll("three answers dropped at A", || (a.vfio.reg(reg::RX_DROPPED) == dropped + 3).then_some(()));
    assert_eq!(answers(&a, 5), [0; 8]);
    assert_eq!(a.vfio.reg(reg::TX_PACKETS), 5);
}

/// A node receives its own writes only with LOOPBACK, P2P to itself
/// included: without it such a write is sent and reaches nobody.
#[test]
fn adapter_p2p_to_self_needs_loopback() {
    let hub = Hub::start();
    let mut a = Node::start(&hub, "a", IOVA, RAM_OFF, RAM);
    let mut b = Node::start(&hub, "b", IOVA, RAM_OFF, RAM);
    let (na, nb) = (a.adapter.node as u64, b.adapter.node as u64);
    b.vfio.set_pct(2, pct::RX, rx_buf(2));
    b.vfio.set_pct(FENCE_PAGE, pct::RX | pct::INT, rx_buf(FENCE_PAGE));
    a.vfio.set_pct(FENCE_PAGE, pct::TX, 0);
    // Page 3 loops back into A: A's own fence.
    a.vfio.set_pct(3, pct::TX | pct::RX | pct::LOOPBACK, rx_buf(3));

    // P2P to itself, no LOOPBACK.
    a.vfio.set_pct(2, pct::TX | pct::RX | pct::P2P | na << pct::DEST_SHIFT, rx_buf(2));
    a.vfio.region_write(BAR_TX, 2 * PAGE_SIZE, &[0x11; 8], true);
    a.vfio.region_write(BAR_TX, 3 * PAGE_SIZE, &[0x33; 8], true);
    poll("A's looped-back fence", || (a.ram.read(ram_at(3, 0), 8) == [0x33; 8]).then_some(()));
    fence(&mut a, &mut [&mut b], 1);
    assert_eq!(a.ram.read(ram_at(2, 0), 8), [0; 8], "a P2P write to itself came back without LOOPBACK");
    assert_eq!(a.vfio.reg(reg::RX_PACKETS), 1, "only the page-3 loopback");
    assert_eq!(a.vfio.reg(reg::RX_DROPPED), 0);
    assert_eq!(a.vfio.reg(reg::TX_PACKETS), 3, "the P2P write to itself was sent");
    assert_eq!(a.vfio.reg(reg::ERR_STATUS), 0);
    assert_eq!(b.vfio.reg(reg::RX_PACKETS), 1, "only the fence");

    // With LOOPBACK it comes back, and still reaches nobody else.
    a.vfio.set_pct(2, pct::TX | pct::RX | pct::LOOPBACK | pct::P2P | na << pct::DEST_SHIFT, rx_buf(2));
    a.vfio.region_write(BAR_TX, 2 * PAGE_SIZE + 8, &[0x22; 8], true);
    poll("the P2P write to itself with LOOPBACK", || (a.ram.read(ram_at(2, 8), 8) == [0x22; 8]).then_some(()));
    fence(&mut a, &mut [&mut b], 2);
    assert_eq!(b.vfio.reg(reg::RX_PACKETS), 2, "only the fences");

    // P2P to another node with LOOPBACK: that node and the sender.
    a.vfio.set_pct(2, pct::TX | pct::RX | pct::LOOPBACK | pct::P2P | nb << pct::DEST_SHIFT, rx_buf(2));
    a.vfio.region_write(BAR_TX, 2 * PAGE_SIZE + 16, &[0x44; 8], true);
    poll("the loopback of a P2P write to B", || (a.ram.read(ram_at(2, 16), 8) == [0x44; 8]).then_some(()));
    poll("the P2P write at B", || (b.ram.read(ram_at(2, 16), 8) == [0x44; 8]).then_some(()));
    assert_eq!(b.ram.read(ram_at(2, 0), 16), [0; 16]);
    assert_zero_except("A's RAM", &a.ram.all(), &[(ram_at(2, 8) as usize, 16), (ram_at(3, 0) as usize, 8)]);
}

/// "Applied whole or not at all" is per delivery: a store across a page
/// boundary is one packet per page, each applied or refused on its own, and
/// a refused packet leaves earlier ones to the same page in place.
#[test]
fn adapter_applies_whole_per_delivery_not_per_page() {
    let hub = Hub::start();
    let mut a = Node::start(&hub, "a", IOVA, RAM_OFF, RAM);
    let mut b = Node::start(&hub, "b", IOVA, RAM_OFF, RAM);
    // B: page 0 mapped, page 1 at an IOVA never mapped, page 2's buffer
    // runs off the end of the map 0x100 bytes in.
    b.vfio.set_pct(0, pct::RX, rx_buf(0));
    b.vfio.set_pct(1, pct::RX, 0x8000_0000);
    let p2 = IOVA + RAM - 0x100;
    b.vfio.set_pct(2, pct::RX, p2);
    b.vfio.set_pct(FENCE_PAGE, pct::RX | pct::INT, rx_buf(FENCE_PAGE));
    for p in [0, 1, 2, FENCE_PAGE] {
        a.vfio.set_pct(p, pct::TX, 0);
    }

    // 16 bytes across the page 0 / page 1 boundary.
    let bytes: Vec<u8> = (1..=16).collect();
    a.vfio.region_write(BAR_TX, PAGE_SIZE - 8, &bytes, true);
    fence(&mut a, &mut [&mut b], 1);
    assert_eq!(a.vfio.reg(reg::TX_PACKETS), 3, "a store across two pages is two packets (plus the fence)");
    assert_eq!(b.ram.read(ram_at(0, PAGE_SIZE - 8), 8), bytes[..8], "the page-0 half was applied");
    assert_eq!(b.vfio.reg(reg::ERR_STATUS), err::RX_DMA, "the page-1 half was refused");
    assert_eq!(b.vfio.reg(reg::ERR_COUNT), 1);
    assert_eq!(b.vfio.reg(reg::RX_PACKETS), 2, "page 0 and the fence");

    // Page 2: one packet inside the map, then one straddling its end.
    let off = |o: u64| RAM_OFF + RAM - 0x100 + o;
    a.vfio.region_write(BAR_TX, 2 * PAGE_SIZE + 0x10, &[0x77; 8], true);
    a.vfio.region_write(BAR_TX, 2 * PAGE_SIZE + 0xF8, &[0x88; 16], true);
    fence(&mut a, &mut [&mut b], 2);
    assert_eq!(b.ram.read(off(0x10), 8), [0x77; 8], "a refused packet undid an earlier one on its page");
    assert_eq!(b.ram.read(off(0xF8), 8), [0; 8], "part of a refused packet was applied");
    assert_eq!(b.vfio.reg(reg::ERR_COUNT), 2);
    assert_eq!(b.vfio.reg(reg::RX_PACKETS), 4);
    let fences = (ram_at(FENCE_PAGE, 8) as usize, 16);
    assert_zero_except(
        "B's RAM",
        &b.ram.all(),
        &[(ram_at(0, PAGE_SIZE - 8) as usize, 8), (off(0x10) as usize, 8), fences],
    );
}

/// The default store path (`write_multiple` auto): run as root, the server
/// enlarges the connecting client's socket send buffer and then does not
/// offer `write_multiple`, so QEMU sends each store from its vCPU thread.
/// Not root: the buffer cannot be enlarged and the server offers it.
#[test]
fn default_store_path_enlarges_the_clients_send_buffer() {
    use nix::sys::socket::{getsockopt, sockopt};
    let hub = Hub::start();
    let a = AdapterHandle::start(&hub, "sndbuf");
    let mut c = VfioClient::connect_raw(&a.sock);
    let before = getsockopt(&c.stream, sockopt::SndBuf).unwrap();
    let caps = c.version();
    let after = getsockopt(&c.stream, sockopt::SndBuf).unwrap();
    let offered = caps["capabilities"]["write_multiple"].as_bool().unwrap_or(false);
    if nix::unistd::geteuid().is_root() {
        assert!(after >= device::client_socket::CLIENT_SNDBUF, "send buffer {before} -> {after}");
        assert!(!offered, "write_multiple offered although the direct path is safe: {caps}");
    } else {
        assert_eq!(after, before);
        assert!(offered, "the direct path without an enlarged buffer: {caps}");
    }
    assert_eq!(c.reg(reg::ID), regs::ID_VALUE);
    a.assert_alive();
}

/// A TCP relay that can be cut: while cut, nothing passes either way and
/// no connection is closed (a network partition: the kernel's buffers
/// hold what was sent, as a cut cable or a dropped route would).
struct Partition {
    addr: String,
    cut: Arc<std::sync::atomic::AtomicBool>,
}

impl Partition {
    fn to(target: &str) -> Partition {
        use std::io::{Read, Write};
        use std::sync::atomic::{AtomicBool, Ordering};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let cut = Arc::new(AtomicBool::new(false));
        let (c, target) = (cut.clone(), target.to_string());
        std::thread::spawn(move || {
            for a in l.incoming() {
                let Ok(a) = a else { return };
                let Ok(b) = std::net::TcpStream::connect(&target) else { continue };
                for (mut from, mut to) in [(a.try_clone().unwrap(), b.try_clone().unwrap()), (b, a)] {
                    let c = c.clone();
                    std::thread::spawn(move || {
                        let mut buf = vec![0u8; 64 * 1024];
                        loop {
                            while c.load(Ordering::SeqCst) {
                                std::thread::sleep(Duration::from_millis(5));
                            }
                            match from.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => {
                                    // What was read as the cut began waits for the heal.
                                    while c.load(Ordering::SeqCst) {
                                        std::thread::sleep(Duration::from_millis(5));
                                    }
                                    if to.write_all(&buf[..n]).is_err() {
                                        break;
                                    }
                                }
                            }
                        }
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        Partition { addr, cut }
    }

    fn set(&self, cut: bool) {
        self.cut.store(cut, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A live link over TCP through a partition: one of 1 s is ridden out
/// (the store made during it arrives after, the link never went down);
/// one of 5 s takes the link down within `DEAD_AFTER_MS` plus a second on
/// both sides (the hub drops the node, the adapter latches LINK_DOWN),
/// and after the heal the adapter rejoins as the same node by itself.
#[test]
fn a_partition_is_ridden_out_or_takes_the_link_down() {
    use device::adapter::{Adapter, AdapterConfig};
    use device::link_client::HubAddr;
    let secret = b"a cluster secret of some length".to_vec();
    let hub = Hub::start_with(hub::hub::HubConfig { secret: Some(secret.clone()), ..Default::default() });
    let net = Partition::to(&hub.listen_tcp());
    let mut remote = Adapter::new(1 << 20).unwrap();
    remote
        .connect(&AdapterConfig {
            aspace: 1 << 20,
            hub: HubAddr::Tcp(net.addr.clone()),
            secret: Some(secret),
            want_node: link::ANY_NODE,
            name: "remote".into(),
            hub_wait: Duration::from_secs(2),
        })
        .unwrap();
    let r = AdapterHandle::serve(remote, "remote", 0, 0);
    let mut rc = r.client();
    let me = rc.reg(reg::NODE) & 0xFFFF;
    let mut local = Node::start(&hub, "local", IOVA, RAM_OFF, RAM);
    local.vfio.set_pct(2, pct::RX, IOVA);
    rc.set_pct(2, pct::TX, 0);
    let sees_remote = |l: &mut Node| l.vfio.reg(reg::MEMBERS_LO) & (1 << me) != 0;
    poll("the local node to see the remote one", || sees_remote(&mut local).then_some(()));
    let other = 1 << (local.vfio.reg(reg::NODE) & 0xFFFF);
    poll("the remote node to see the local one", || (rc.reg(reg::MEMBERS_LO) & other != 0).then_some(()));

    // 1 s: a delay, nothing lost, no link event.
    let events = rc.reg(reg::LINK_EVENTS);
    net.set(true);
    rc.region_write(BAR_TX, 2 * PAGE_SIZE, &0x1111u64.to_le_bytes(), true);
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(1) {
        assert!(sees_remote(&mut local), "the hub dropped the node during a 1 s partition");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(local.ram.read(RAM_OFF, 8), [0; 8], "a store crossed the partition");
    net.set(false);
    poll("the store made during the partition", || {
        (local.ram.read(RAM_OFF, 8) == 0x1111u64.to_le_bytes()).then_some(())
    });
    assert_eq!(rc.reg(reg::LINK_EVENTS), events, "the link went down in a 1 s partition");
    assert_eq!(rc.reg(reg::ERR_STATUS) & err::LINK_DOWN, 0);

    // 5 s: the link goes down on both sides, then comes back by itself.
    net.set(true);
    let cut_at = Instant::now();
    poll("the hub to drop the partitioned node", || (!sees_remote(&mut local)).then_some(()));
    let hub_saw = cut_at.elapsed();
    poll("the adapter to see its link down", || (rc.reg(reg::LINK) & 1 == 0).then_some(()));
    let adapter_saw = cut_at.elapsed();
    eprintln!("link down after the cut: hub {hub_saw:?}, adapter {adapter_saw:?}");
    let dead = Duration::from_millis(link::DEAD_AFTER_MS);
    for (who, t) in [("hub", hub_saw), ("adapter", adapter_saw)] {
        assert!(t >= dead - Duration::from_millis(300) && t < dead + Duration::from_secs(2), "{who} after {t:?}");
    }
    assert_ne!(rc.reg(reg::ERR_STATUS) & err::LINK_DOWN, 0);
    std::thread::sleep(Duration::from_secs(5).saturating_sub(cut_at.elapsed()));
    net.set(false);
    poll("the node back", || sees_remote(&mut local).then_some(()));
    // The others may hear of the rejoin before the adapter has taken its
    // Welcome in.
    poll("the adapter's link up", || (rc.reg(reg::LINK) & 1 == 1).then_some(()));
    assert_eq!(rc.reg(reg::NODE) & 0xFFFF, me, "rejoined as another node");
    rc.region_write(BAR_TX, 2 * PAGE_SIZE, &0x2222u64.to_le_bytes(), true);
    poll("a store after the heal", || (local.ram.read(RAM_OFF, 8) == 0x2222u64.to_le_bytes()).then_some(()));
    r.assert_alive();
}
