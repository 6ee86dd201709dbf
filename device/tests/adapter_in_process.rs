//! The adapter driven in process the way QEMU drives it: a real hub, real
//! Unix sockets, the vfio-user protocol on the wire and guest RAM in a memfd
//! that the adapter receives by SCM_RIGHTS and writes by DMA.

mod common;

use common::*;
use mc_adapter::regs::{self, err, pct, reg, BAR_PCT, BAR_REGS, BAR_TX, PAGE_SIZE};

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
    assert_eq!(c.pct(5), (0xFFFF_003F, u64::MAX));
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
fn loopback_page_comes_back_in_order() {
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
