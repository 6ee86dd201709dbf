//! The adapter offering MSI instead of MSI-X (docs/adapter.md, "Surprise
//! removal"): the capability QEMU reads, the vector counts a driver is
//! told, and an interrupt reaching the MSI eventfd.

mod common;

use std::os::fd::{AsFd, AsRawFd};
use std::time::Duration;

use common::*;
use device::adapter::Adapter;
use device::link_client as client;
use device::pci::Interrupts;
use device::regs::{int, reg, PAGE_SIZE};
use device::vfio_user::{irq, Command};
use link::ANY_NODE;
use vfio_user_wire as wire;
use vm_memory::ByteValued;

/// `DEVICE_GET_IRQ_INFO` of `index`: its vector count.
fn irq_count(c: &mut VfioClient, index: u32) -> u32 {
    let req = wire::IrqInfo { argsz: 16, index, ..Default::default() };
    let r = c.request_ok(Command::DeviceGetIrqInfo as u16, req.as_slice());
    let info: wire::IrqInfo = wire::read(&r).unwrap();
    assert_eq!(info.index, index);
    info.count
}

#[test]
fn an_msi_adapter_interrupts_through_its_msi_vector() {
    let hub = Hub::start();
    let mut adapter = Adapter::new(ASPACE).unwrap();
    adapter.set_interrupts(Interrupts::Msi);
    assert_eq!(adapter.interrupts(), Interrupts::Msi);
    let (joined, reader, writer) =
        client::join(&hub.path, ANY_NODE, PAGE_SIZE as u32, (ASPACE / PAGE_SIZE) as u32, "msi").unwrap();
    let (node, max_nodes) = (joined.node, joined.max_nodes);
    adapter.attach_link(joined, reader, writer);
    let h = AdapterHandle::serve(adapter, "msi", node, max_nodes);
    let mut c = h.client();

    // The capability QEMU reads: MSI (id 5), 64-bit, one vector.
    let cap = c.region_read(CONFIG_REGION, 0x40, 4);
    assert_eq!(u32::from_le_bytes(cap.try_into().unwrap()), 0x0080_0005);
    assert_eq!(irq_count(&mut c, irq::MSI), 1);
    assert_eq!(irq_count(&mut c, irq::MSIX), 0, "no MSI-X beside MSI");
    let r = c.try_set_irqs(irq::MSIX, irq::DATA_EVENTFD | irq::ACTION_TRIGGER, 0, 1, &[eventfd().as_fd().as_raw_fd()]);
    assert!(r.is_error(), "an MSI-X vector the adapter does not offer was accepted");

    let ev = eventfd();
    c.set_irqs(irq::MSI, irq::DATA_EVENTFD | irq::ACTION_TRIGGER, 0, 1, &[ev.as_fd().as_raw_fd()]);
    c.set_reg(reg::INT_CAUSE, int::ALL);
    c.set_reg(reg::INT_MASK, int::LINK);
    while wait_eventfd(&ev, Duration::from_millis(20)).is_some() {}
    // Another node joins: the membership changes, LINK is raised.
    let _other = AdapterHandle::start(&hub, "other");
    assert!(wait_eventfd(&ev, Duration::from_secs(5)).is_some(), "no MSI for the membership change");
    assert_ne!(c.reg(reg::INT_CAUSE) & int::LINK, 0);
    h.assert_alive();
}

#[test]
fn interrupts_setting_round_trips_and_names_its_choices() {
    let mut a = Adapter::new(ASPACE).unwrap();
    assert_eq!(a.interrupts(), Interrupts::MsiX, "MSI-X by default");
    a.set_interrupts(Interrupts::Msi);
    let frozen = a.freeze().unwrap();
    let thawed = Adapter::thaw(frozen).unwrap();
    assert_eq!(thawed.interrupts(), Interrupts::Msi, "a restart in place keeps MSI");
    assert_eq!("msix".parse::<Interrupts>().unwrap().to_string(), "msix");
    assert!("msi-x".parse::<Interrupts>().unwrap_err().contains("msix or msi"));
}
