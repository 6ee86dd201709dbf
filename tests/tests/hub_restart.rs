//! `mc-hub ctl restart`: a real `mc-hub` process with two local ports
//! replaces itself in place while two vfio-user clients (standing in for
//! QEMU, with memfd guest memory and MSI-X eventfds) keep their
//! connections and stream stores through it. Nothing a guest stored is
//! lost, each guest sees an announced link flap, and the adapters' state
//! (PCT, configuration space, counters) is what it was.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use device::regs::{err, pct, reg, BAR_TX, PAGE_SIZE};
use device::vfio_user::irq;

const IOVA: u64 = 0x10000;
const RAM: u64 = 64 << 10;
/// Slots (8-byte words) node 0 stores, each once: half before the restart,
/// half while it happens.
const SLOTS: u64 = 1024;

struct HubProcess(Child);

impl Drop for HubProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn ctl(control: &Path, req: &str) -> String {
    let out = Command::new(tests::host_bin("mc-hub"))
        .args(["ctl", "--control"])
        .arg(control)
        .arg(req)
        .output()
        .expect("run mc-hub ctl");
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// A guest: connected, memory mapped, bus master on, MSI-X vector 0 on an
/// eventfd, every interrupt cause enabled.
fn guest(sock: &Path) -> (VfioClient, GuestRam, nix::sys::eventfd::EventFd) {
    let mut c = VfioClient::connect(sock);
    let ram = GuestRam::new(RAM);
    c.dma_map(IOVA, RAM, &ram, 0);
    c.region_write(CONFIG_REGION, PCI_COMMAND, &PCI_COMMAND_MEMORY_MASTER.to_le_bytes(), false);
    let ev = eventfd();
    use std::os::fd::{AsFd, AsRawFd};
    c.set_irqs(irq::MSIX, irq::DATA_EVENTFD | irq::ACTION_TRIGGER, 0, 1, &[ev.as_fd().as_raw_fd()]);
    c.set_reg(reg::INT_MASK, u32::MAX);
    (c, ram, ev)
}

fn slot_value(i: u64) -> u64 {
    0x5EED_0000_0000_0000 | i
}

#[test]
fn restart_in_place_keeps_local_guests_connected_and_loses_no_store() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let log = std::fs::File::create(d.join("hub.log")).unwrap();
    let mut cmd = Command::new(tests::host_bin("mc-hub"));
    cmd.arg("--socket").arg(d.join("hub.sock")).arg("--control").arg(d.join("hub.ctl"));
    cmd.args(["--max-nodes", "4", "--aspace-mib", "1"]);
    for (n, name) in [(0, "a"), (1, "b")] {
        cmd.arg("--local").arg(format!("{n}:{name}:{}", d.join(format!("n{n}.sock")).display()));
    }
    let hub = HubProcess(cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(log).spawn().expect("start mc-hub"));
    let pid = hub.0.id();
    poll("the hub's sockets", || (d.join("n1.sock").exists() && d.join("hub.ctl").exists()).then_some(()));

    let (mut a, _ram_a, _ev_a) = guest(&d.join("n0.sock"));
    let (mut b, ram_b, ev_b) = guest(&d.join("n1.sock"));
    assert_eq!(a.reg(reg::NODE) & 0xFFFF, 0);
    assert_eq!(b.reg(reg::NODE) & 0xFFFF, 1);
    // a transmits page 0; b receives it at IOVA.
    a.set_pct(0, pct::TX, 0);
    b.set_pct(0, pct::RX, IOVA);
    let store = |a: &mut VfioClient, i: u64| a.region_write(BAR_TX, i * 8, &slot_value(i).to_le_bytes(), true);
    for i in 0..SLOTS / 2 {
        store(&mut a, i);
    }
    assert_eq!(a.reg(reg::ERR_STATUS), 0);
    let b_errors = b.reg(reg::ERR_COUNT);
    let b_link_events = b.reg(reg::LINK_EVENTS);
    while wait_eventfd(&ev_b, Duration::from_millis(1)).is_some() {}

    let fds_before = open_fds(pid);
    for round in 1..=2 {
        let reply = ctl(&d.join("hub.ctl"), "restart");
        assert_eq!(reply.trim(), "ok", "restart {round}");
        let t0 = Instant::now();
        // Stores go on while the hub restarts: they wait in the socket.
        let (from, to) = if round == 1 { (SLOTS / 2, SLOTS) } else { (0, 0) };
        for i in from..to {
            store(&mut a, i);
        }
        // Both ports back: the control socket of the new process lists them.
        let back = poll("both local ports to rejoin", || {
            let s = ctl(&d.join("hub.ctl"), "stats");
            (s.contains("\"name\": \"a\"") && s.contains("\"name\": \"b\"")).then_some(t0.elapsed())
        });
        println!("restart {round}: both ports back {back:?} after the request");
        assert!(hub_alive(pid), "the hub process (pid {pid}) is gone after restart {round}");

        // The same connections answer, with the adapters as they were.
        assert_eq!(a.pct(0), (pct::TX, 0), "a's PCT after restart {round}");
        assert_eq!(b.pct(0), (pct::RX, IOVA), "b's PCT after restart {round}");
        let command = u16::from_le_bytes(b.region_read(CONFIG_REGION, PCI_COMMAND, 2).try_into().unwrap());
        assert_eq!(command & PCI_COMMAND_MEMORY_MASTER, PCI_COMMAND_MEMORY_MASTER, "b's PCI command register");
        assert_eq!(b.reg(reg::NODE) & 0xFFFF, 1, "b's node id after restart {round}");
        // The outage was announced: a link error counted, link events, an interrupt.
        assert!(b.reg(reg::ERR_STATUS) & err::LINK_DOWN != 0, "b was not told of the outage (round {round})");
        assert!(b.reg(reg::ERR_COUNT) > b_errors, "b counted no error for the outage (round {round})");
        assert!(b.reg(reg::LINK_EVENTS) >= b_link_events + 2 * round, "b saw no link down and up (round {round})");
        assert!(wait_eventfd(&ev_b, Duration::from_secs(2)).is_some(), "no interrupt at b (round {round})");
        // What b's driver does: clear what it was told, for the next round.
        b.set_reg(reg::ERR_STATUS, err::LINK_DOWN);
        b.set_reg(reg::INT_CAUSE, u32::MAX);
    }

    // Nothing leaked: the second process holds what the first did.
    assert_eq!(open_fds(pid), fds_before, "the hub's open fds before and after two restarts");

    // Every store, before and during the restart, reached b.
    let want: Vec<u8> = (0..SLOTS).flat_map(|i| slot_value(i).to_le_bytes()).collect();
    poll("every slot in b's memory", || (ram_b.read(IOVA - IOVA, want.len()) == want).then_some(()));
    let got = ram_b.read(0, want.len());
    let missing: Vec<u64> = (0..SLOTS).filter(|&i| got[i as usize * 8..][..8] != slot_value(i).to_le_bytes()).collect();
    assert!(missing.is_empty(), "slots lost in the restart: {missing:?}");

    // And traffic after it flows as before.
    a.region_write(BAR_TX, PAGE_SIZE - 8, &0xD0D0_u64.to_le_bytes(), true);
    poll("a store after the restarts", || (ram_b.read(PAGE_SIZE - 8, 8) == 0xD0D0_u64.to_le_bytes()).then_some(()));
    let log = std::fs::read_to_string(d.join("hub.log")).unwrap();
    assert_eq!(log.matches("local ports resumed after a restart in place").count(), 2, "{log}");
}

#[test]
fn a_hub_without_a_binary_to_exec_refuses_restart_and_bad_resume_fds_are_errors() {
    // The library hub (no exec) refuses.
    let hub = Hub::start();
    let reply = hub.control(hub::hub::Control::Restart);
    assert!(format!("{reply:?}").contains("cannot restart in place"), "{reply:?}");
    // A resume fd that is not a hand-over is refused with a clear error.
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(tests::host_bin("mc-hub"))
        .arg("--socket")
        .arg(dir.path().join("h.sock"))
        .args(["--resume-fd", "999"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("restart in place: hand-over refused: fd 999 is not open"), "{err}");
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

fn hub_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}
