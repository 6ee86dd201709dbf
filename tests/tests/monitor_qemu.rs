//! QEMU tier for `mc-cluster monitor`: two guests storing (a UMP
//! ping-pong, a region held through imcd), the monitor's page driven in
//! Debian's headless chromium (`tests/monitor/drive.mjs`, playwright-core
//! from set-up's browser step): the counters move, the directory shows the
//! region, DMA transfers counted, "link down" for node 1 appears on the timeline and in its row,
//! and the address without its token is refused.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use tests::{cache, launcher, root, Cluster};

#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn monitor_page_shows_the_cluster_live_in_a_browser() {
    let c = Cluster::up("t-monitor", 2);
    c.imcd_ready();
    c.background(0, "hold", "mctool imc-alloc --key 4660 --coherent --hold 600");
    c.poll_until(0, &["cat", "/tmp/hold.log"], 30, |o| o.contains("IMC_"));
    c.background(1, "serve", "ump-tool serve --me 1 --peer 2");
    c.background(0, "pp", "ump-tool pingpong --me 2 --peer 1 --rounds 1000000 --sizes 4K");

    let mut mon = Command::new(launcher())
        .args(["--name", &c.name, "monitor", "--interval-ms", "300"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(mon.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let url = line.trim().strip_prefix("monitor: ").unwrap_or_else(|| panic!("no address: {line:?}")).to_string();
    assert!(url.starts_with("http://127.0.0.1:") && url.contains("?token="), "{url}");

    let shot = c.run_dir().join("monitor.png");
    let out = Command::new("node")
        .arg(root().join("tests/monitor/drive.mjs"))
        .args([&url, shot.to_str().unwrap(), "1"])
        .env("PW_DIR", cache().join("playwright/node_modules"))
        .output()
        .expect("node (scripts/setup.sh, step browser)");
    let _ = mon.kill();
    let _ = mon.wait();
    let (text, err) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the browser run failed:\n{text}{err}");
    let v: serde_json::Value = serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}{err}"));

    assert!(v["seq1"].as_u64() > v["seq0"].as_u64(), "the sequence number moved on the page: {v}");
    assert!(v["moved"].as_array().is_some_and(|m| !m.is_empty()), "some node's writes moved: {v}");
    let dma: Vec<u64> = v["dma"].as_array().unwrap().iter().filter_map(|d| d.as_str()?.parse().ok()).collect();
    assert!(dma.iter().any(|&d| d > 0), "4 KiB messages go by the DMA engine, counted on the page: {v}");
    let regions = v["regions"].as_array().unwrap();
    let held =
        regions.iter().find(|r| r["key"] == "0x1234").unwrap_or_else(|| panic!("region 0x1234 on the page: {v}"));
    assert_eq!(held["kind"], "User");
    assert!(held["hosts"].as_str().unwrap().contains('0'), "held by node 0: {held}");
    assert!(regions.iter().any(|r| r["kind"] == "UmpChannel"), "the ping-pong's channel halves: {v}");
    assert!(v["heat"].as_u64() > Some(0), "the heat map has pages: {v}");
    assert_eq!(v["link_after_down"], "held down");
    let timeline: Vec<&str> = v["timeline"].as_array().unwrap().iter().filter_map(|x| x.as_str()).collect();
    assert!(timeline.iter().any(|t| t.contains("link-down node 1 from the monitor")), "{timeline:?}");
    assert!(timeline.iter().any(|t| t.contains("node 1: link held down")), "{timeline:?}");
    assert_eq!(v["forbidden"], serde_json::json!([403, 403, 403, 403]), "without the token: 403");
    assert_eq!(v["with_token"], 200);
    let png = std::fs::read(&shot).unwrap();
    assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "a screenshot of the page");
}
