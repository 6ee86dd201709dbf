//! Device faults for a driver's error paths (`docs/adapter.md`, "Testing a
//! driver"), armed through the hub's control requests on local ports: each
//! gives the error bit, count and interrupt it promises, takes effect as
//! many times as armed, shows in `stats`, and bad requests are refused with
//! a reason.

mod common;

use std::os::fd::{AsFd, AsRawFd};
use std::time::Duration;

use common::*;
use device::regs::dma::DONE;
use device::regs::{self, dma, err, int, pct, reg, BAR_TX, ID_VALUE};
use device::vfio_user::irq;
use hub::hub::{Control, ControlReply};

const IOVA: u64 = 0x10000;
const RAM: u64 = 64 << 10;

fn fault(node: u16, kind: &str, count: u32) -> Control {
    Control::Fault { node, kind: kind.into(), count, bits: None, status: None, ms: None }
}

/// A fault request with its options (count 1).
fn with(node: u16, kind: &str, bits: Option<&str>, status: Option<&str>, ms: Option<u32>) -> Control {
    Control::Fault { node, kind: kind.into(), count: 1, bits: bits.map(Into::into), status: status.map(Into::into), ms }
}

/// A local-port node with its MSI-X vector on an eventfd and every cause enabled.
fn node(hub: &Hub, name: &str) -> (Node, nix::sys::eventfd::EventFd) {
    let mut n = Node::start_local(hub, name, IOVA, 0, RAM);
    let ev = eventfd();
    n.vfio.set_irqs(irq::MSIX, irq::DATA_EVENTFD | irq::ACTION_TRIGGER, 0, 1, &[ev.as_fd().as_raw_fd()]);
    n.vfio.set_reg(reg::INT_MASK, int::ALL);
    (n, ev)
}

fn drain(ev: &nix::sys::eventfd::EventFd) {
    while wait_eventfd(ev, Duration::from_millis(1)).is_some() {}
}

/// Clears what the last step left: error bits and causes, and the eventfd.
fn settle(n: &mut Node, ev: &nix::sys::eventfd::EventFd) {
    n.vfio.set_reg(reg::ERR_STATUS, err::ALL);
    n.vfio.set_reg(reg::INT_CAUSE, int::ALL);
    drain(ev);
}

#[test]
fn each_device_fault_gives_its_error_count_and_interrupt() {
    let hub = Hub::start();
    let (mut a, _ev_a) = node(&hub, "a");
    let (mut b, ev_b) = node(&hub, "b");
    let nb = b.adapter.node;
    a.vfio.set_pct(0, pct::TX, 0);
    b.vfio.set_pct(0, pct::RX, IOVA);
    settle(&mut b, &ev_b);

    // rx-dma x2: two stores fail at b as an unmapped IOVA would; the third lands.
    hub.control_ok(fault(nb, "rx-dma", 2));
    let errors = b.vfio.reg(reg::ERR_COUNT);
    for (i, v) in [11u64, 22, 33].into_iter().enumerate() {
        a.vfio.region_write(BAR_TX, i as u64 * 8, &v.to_le_bytes(), true);
        // A read ends the packet: one store, one packet, one receive DMA
        // (contiguous stores would be coalesced into one).
        a.vfio.reg(reg::ID);
    }
    poll("the third store at b", || (b.ram.read(16, 8) == 33u64.to_le_bytes()).then_some(()));
    assert_eq!(b.ram.read(0, 16), vec![0; 16], "a failed receive DMA wrote guest memory");
    assert!(b.vfio.reg(reg::ERR_STATUS) & err::RX_DMA != 0);
    assert_eq!(b.vfio.reg(reg::ERR_COUNT), errors + 2);
    assert!(wait_eventfd(&ev_b, Duration::from_secs(2)).is_some(), "no interrupt for the failed DMA");
    settle(&mut b, &ev_b);

    // error: bits of the driver's choice, now.
    hub.control_ok(with(nb, "error", Some("crc,seq-gap"), None, None));
    assert_eq!(b.vfio.reg(reg::ERR_STATUS) & (err::CRC | err::SEQ_GAP), err::CRC | err::SEQ_GAP);
    assert!(b.vfio.reg(reg::INT_CAUSE) & int::ERROR != 0);
    assert!(wait_eventfd(&ev_b, Duration::from_secs(2)).is_some(), "no interrupt for the raised bits");
    settle(&mut b, &ev_b);

    // drop-irq: the next interrupt never comes (the cause is still latched);
    // the one after does.
    hub.control_ok(fault(nb, "drop-irq", 1));
    hub.control_ok(with(nb, "error", Some("crc"), None, None));
    assert!(wait_eventfd(&ev_b, Duration::from_millis(300)).is_none(), "a dropped interrupt came");
    assert!(b.vfio.reg(reg::INT_CAUSE) & int::ERROR != 0, "the cause is latched though");
    settle(&mut b, &ev_b);
    hub.control_ok(with(nb, "error", Some("crc"), None, None));
    assert!(wait_eventfd(&ev_b, Duration::from_secs(2)).is_some());
    settle(&mut b, &ev_b);

    // delay-irq 400 ms: not within 150 ms, then it comes.
    hub.control_ok(with(nb, "delay-irq", None, None, Some(400)));
    hub.control_ok(with(nb, "error", Some("crc"), None, None));
    assert!(wait_eventfd(&ev_b, Duration::from_millis(150)).is_none(), "a delayed interrupt came early");
    assert!(wait_eventfd(&ev_b, Duration::from_secs(3)).is_some(), "a delayed interrupt never came");
    settle(&mut b, &ev_b);

    // dead-reads x2: all ones, then the device answers again.
    hub.control_ok(fault(nb, "dead-reads", 2));
    assert_eq!(b.vfio.reg(reg::ID), u32::MAX);
    assert_eq!(b.vfio.pct(0).0, u64::MAX);
    assert_eq!(b.vfio.reg(reg::ID), ID_VALUE);

    // dma-desc: the next descriptor completes with the status asked for,
    // nothing sent; the one after is sent.
    let na = a.adapter.node;
    a.vfio.set_reg(reg::DMA_RING_LO, IOVA as u32 + 0x8000);
    a.vfio.set_reg(reg::DMA_RING_HI, 0);
    a.vfio.set_reg(reg::DMA_RING_SIZE, 4);
    a.ram.write(0x100, &[0x5A; 64]);
    for i in 0..2u64 {
        let mut d = Vec::new();
        d.extend_from_slice(&(IOVA + 0x100).to_le_bytes());
        d.extend_from_slice(&(64 + i * 64).to_le_bytes());
        d.extend_from_slice(&64u32.to_le_bytes());
        d.extend_from_slice(&0u32.to_le_bytes());
        d.extend_from_slice(&[0; 8]);
        a.ram.write(0x8000 + i * dma::DESC_SIZE, &d);
    }
    hub.control_ok(with(na, "dma-desc", None, Some("src-unmapped"), None));
    a.vfio.region_write(regs::BAR_REGS, reg::DMA_TAIL, &2u32.to_le_bytes(), true);
    let back = |i: u64| {
        let b = a.ram.read(0x8000 + i * dma::DESC_SIZE + dma::BYTES, 8);
        let st = u32::from_le_bytes(b[4..].try_into().unwrap());
        (st & DONE != 0).then_some((st & 0xFF, u32::from_le_bytes(b[..4].try_into().unwrap())))
    };
    assert_eq!(poll("descriptor 0", || back(0)), (dma::status::SRC_UNMAPPED, 0));
    assert_eq!(poll("descriptor 1", || back(1)), (dma::status::OK, 64));
    assert!(a.vfio.reg(reg::ERR_STATUS) & err::DMA != 0);
    poll("the second descriptor's bytes at b", || (b.ram.read(128, 64) == [0x5A; 64]).then_some(()));
    assert_eq!(b.ram.read(64, 64), vec![0; 64], "a failed descriptor sent its bytes");

    // Counted in stats, per node.
    let s = hub.node_stats(nb).faults.expect("a local port's fault counts");
    assert_eq!((s.rx_dma, s.error, s.drop_irq, s.delay_irq, s.dead_reads), (2, 4, 1, 1, 2), "{s:?}");
    assert_eq!(hub.node_stats(na).faults.unwrap().dma_desc, 1);
}

#[test]
fn fault_requests_that_cannot_be_are_refused_with_a_reason() {
    let hub = Hub::start();
    let (b, _ev) = node(&hub, "b");
    let nb = b.adapter.node;
    let refused = |c: Control, why: &str| match hub.control(c.clone()) {
        ControlReply::Error { message } => assert!(message.contains(why), "{c:?}: {message}"),
        other => panic!("{c:?} was not refused: {other:?}"),
    };
    refused(fault(nb, "melt", 1), "no fault 'melt'");
    refused(fault(nb, "rx-dma", 0), "at least 1");
    refused(fault(nb, "error", 1), "needs --bits");
    refused(with(nb, "error", Some("nope"), None, None), "--bits nope: no such error bit");
    refused(fault(nb, "delay-irq", 1), "needs --ms");
    refused(with(nb, "delay-irq", None, None, Some(60_000)), "1 to 10000 ms");
    refused(with(nb, "dma-desc", None, Some("ok"), None), "failure code");
    refused(fault(7, "rx-dma", 1), "node 7 is not a local port");
    refused(fault(999, "rx-dma", 1), "outside this hub's");
    hub.control_ok(fault(nb, "clear", 1));
}
