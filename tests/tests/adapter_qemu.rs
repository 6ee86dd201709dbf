//! QEMU tier for the adapter: interrupts and injected errors as a guest
//! driver sees them, through the guest kernel's VFIO and MSI-X.

use serde_json::json;
use tests::Cluster;

/// A guest process sleeping on the adapter's interrupt (MSI-X through VFIO)
/// is woken by a write from another node to a page with interrupt-on-receive.
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn notification_wakes_waiting_guest_process() {
    let c = Cluster::up_raw("t-notify", 2);
    c.background(1, "nw", "mctool notify-wait --page 5 --timeout 60");
    c.poll_until(1, &["cat", "/tmp/nw.log"], 30, |o| o.contains("armed"));
    // Armed and sleeping: nothing has woken it yet.
    std::thread::sleep(std::time::Duration::from_secs(1));
    let early =
        String::from_utf8_lossy(&c.exec(1, &["sh", "-c", "cat /tmp/nw.log; cat /tmp/nw.rc 2>/dev/null"]).stdout)
            .into_owned();
    assert!(!early.contains("woke"), "woke before any write:\n{early}");

    c.run(0, &["mctool", "poke", "--page", "5", "--value", "99"]);
    let (rc, log) = c.background_result(1, "nw", 30);
    assert_eq!(rc, "0", "notify-wait failed:\n{log}");
    assert!(log.contains("woke") && log.contains("cause 0x1") && log.contains("notified pages [5]"), "{log}");
}

/// Errors injected at the hub show in the guest's error registers: a link
/// taken down (and the rejoin after it), and corrupted packets (counted as
/// CRC errors, never applied).
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn injected_link_and_crc_errors_reach_the_guest() {
    let c = Cluster::up_raw("t-errors", 2);
    let info = c.mctool_info(1);
    assert!(info["link_up"] == true && info["err_status"] == 0 && info["errors"] == json!([]), "{info}");

    c.hub(&["link-down", "1"]);
    let info = c.poll_info(1, |i| i["link_up"] == false);
    assert!(info["node"].is_null() && info["errors"] == json!(["link-down"]), "{info}");
    let info0 = c.poll_info(0, |i| i["members"] == json!([0]));
    assert_eq!(info0["link_up"], true, "node 0 keeps its link: {info0}");

    c.hub(&["link-up", "1"]);
    let info = c.poll_info(1, |i| i["link_up"] == true);
    assert!(info["node"] == 1 && info["ports"] == 8, "rejoins as the same node: {info}");
    assert_eq!(info["errors"], json!(["link-down"]), "LINK_DOWN stays latched until cleared: {info}");
    let cleared = String::from_utf8(c.run(1, &["mctool", "clear-errors"])).unwrap();
    assert!(cleared.contains("error status now 0x0"), "{cleared}");

    // Corrupt the next packet to node 1: counted, not applied.
    c.run(1, &["mctool", "rx", "--pages", "3"]);
    c.hub(&["corrupt", "1", "1"]);
    c.run(0, &["mctool", "poke", "--page", "3", "--offset", "0", "--value", "5"]);
    c.run(0, &["mctool", "poke", "--page", "3", "--offset", "8", "--value", "6"]);
    c.run(1, &["mctool", "wait", "--page", "3", "--offset", "8", "--value", "6", "--timeout", "20"]);
    let page = c.run(1, &["mctool", "dump", "--page", "3"]);
    assert_eq!(&page[..8], &[0u8; 8], "the corrupted packet must not be applied");
    assert_eq!(&page[8..16], &6u64.to_le_bytes());
    c.run(1, &["mctool", "stop"]);
    let info = c.mctool_info(1);
    // ERR_COUNT counts since reset: the link-down error and this one.
    assert!(info["errors"] == json!(["crc"]) && info["err_count"] == 2, "{info}");
    let stats = c.hub(&["stats"]);
    assert!(stats.contains("\"corrupted\": 1"), "{stats}");
}
