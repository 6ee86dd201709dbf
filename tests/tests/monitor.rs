//! `mc-cluster monitor`'s server in process, against a real hub with two
//! adapters: every route refuses a request without the token (403); the
//! JSON document shows the nodes' counters moving, the pages written and
//! by whom, and a region that node A wrote into imcd's directory pages;
//! the server-sent events carry the same document; a fault button takes
//! B's link down and the timeline says so.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::*;
use device::regs::{pct, BAR_TX, PAGE_SIZE};
use imc_proto::layout::{ENTRY_WORDS, LOCK_SLOTS};
use launcher::monitor::{serve, Options};

const IOVA: u64 = 0x10000;
const TOKEN: &str = "0123456789abcdef0123456789abcdef";

/// One HTTP/1.1 request; (status, body).
fn http(addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

fn state(addr: &str) -> serde_json::Value {
    let (code, body) = http(addr, "GET", &format!("/api/state?token={TOKEN}"), "");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

fn until(addr: &str, what: &str, ok: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let t0 = Instant::now();
    loop {
        let v = state(addr);
        if ok(&v) {
            return v;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "{what}: {v}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn the_monitor_serves_live_state_behind_its_token() {
    let hub = Hub::start();
    let control = hub.listen_control();
    let mut a = Node::start(&hub, "a", IOVA, 0, 2 * PAGE_SIZE);
    let mut b = Node::start(&hub, "b", IOVA, 0, 2 * PAGE_SIZE);
    let (na, nb) = (a.adapter.node, b.adapter.node);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let opts = Options {
            control,
            events_log: None,
            port: 0,
            interval: Duration::from_millis(100),
            token: Some(TOKEN.into()),
        };
        serve(opts, |addr| tx.send(addr.to_string()).unwrap()).unwrap();
    });
    let url = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(url.starts_with("http://127.0.0.1:") && url.ends_with(&format!("/?token={TOKEN}")), "{url}");
    let addr = url.trim_start_matches("http://").split('/').next().unwrap().to_string();

    // No token, a wrong one, a truncated one: 403 on every route.
    for path in ["/", "/api/state", "/api/events", "/?token=0123", &format!("/api/state?token={}", &TOKEN[1..])] {
        let (code, body) = http(&addr, "GET", path, "");
        assert_eq!(code, 403, "{path}: {body}");
        assert!(body.contains("access token"), "{body}");
    }
    assert_eq!(http(&addr, "POST", "/api/fault", r#"{"op":"link-down","node":0}"#).0, 403);
    let (code, page) = http(&addr, "GET", &format!("/?token={TOKEN}"), "");
    assert_eq!(code, 200);
    assert!(page.contains("MEMORY CHANNEL monitor") && page.contains("EventSource"));

    // The first sample has been taken (from then on the hub keeps the tail).
    until(&addr, "a first sample", |v| v.get("error").is_none());

    // A stores a region record into imcd's directory (entry 3, copy 0:
    // key 0x7b at page 60, one page, held by A and B), then writes page 60
    // (stores 16 bytes apart, non-posted: one packet each).
    let data = 60u64;
    b.vfio.set_pct(data, pct::RX, IOVA);
    a.vfio.set_pct(0, pct::TX, 0);
    a.vfio.set_pct(data, pct::TX, 0);
    let at = (LOCK_SLOTS + 3 * ENTRY_WORDS) as u64 * 8;
    let rec = [0x7b, 60, 1, 0o666, 0, 0, 1, 1 << na | 1 << nb];
    for (i, w) in rec.iter().enumerate() {
        a.vfio.region_write(BAR_TX, at + 8 + 8 * i as u64, &u64::to_le_bytes(*w), false);
    }
    for k in 0..50u64 {
        a.vfio.region_write(BAR_TX, data * PAGE_SIZE + 16 * k, &k.to_le_bytes(), false);
    }
    let v = until(&addr, "A's writes, the region", |v| {
        v["nodes"].as_array().is_some_and(|n| n.iter().any(|n| n["node"] == na && n["writes"].as_u64() >= Some(51)))
            && v["regions"].as_array().is_some_and(|r| !r.is_empty())
    });
    assert_eq!(v["regions"][0]["entry"], 3);
    assert_eq!(v["nodes"][0]["dma_descs"], 0, "local ports report their adapter's DMA counters: {v}");
    assert_eq!(v["regions"][0]["key"], "0x7b");
    assert_eq!(v["regions"][0]["hosts"], serde_json::json!([na.min(nb), na.max(nb)]));
    assert_eq!(v["regions"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v["regions"][0]["writers"], serde_json::json!([na]), "A wrote the region's page");
    let hot = v["heat"].as_array().unwrap().iter().find(|p| p["page"] == data).expect("page 60 in the heat map");
    assert_eq!(hot["writes"], 50);
    assert_eq!(hot["writers"], serde_json::json!([na]));
    assert!(v["seq"].as_u64() >= Some(51), "{v}");
    assert!(v["step_ns"].as_array().is_some_and(|s| !s.is_empty()), "step times");
    // The tail, decoded: A's last store to page 60, and a directory word named.
    let v = until(&addr, "the tail", |v| v["tail"].as_array().is_some_and(|t| !t.is_empty()));
    let tail: Vec<&str> = v["tail"].as_array().unwrap().iter().filter_map(|l| l.as_str()).collect();
    assert!(tail.iter().all(|l| l.starts_with("seq ") && l.contains(" write ")), "{tail:?}");
    assert!(
        tail.iter().any(|l| l.contains(&format!("write {na} -> all page 60 +0x310 len 8"))),
        "A's last store: {tail:?}"
    );
    let joins = v["timeline"].as_array().unwrap().iter().filter(|e| e["kind"] == "join").count();
    assert_eq!(joins, 2);
    // Rates: B writes steadily; its writes/s shows up.
    b.vfio.set_pct(data, pct::TX, 0);
    let t0 = Instant::now();
    let v = loop {
        b.vfio.region_write(BAR_TX, data * PAGE_SIZE, &[1; 8], false);
        std::thread::sleep(Duration::from_millis(5));
        let v = state(&addr);
        let n = v["nodes"].as_array().unwrap().iter().find(|n| n["node"] == nb).unwrap().clone();
        if n["writes_per_s"].as_f64() > Some(0.0) {
            break v;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "no rate for B: {v}");
    };
    assert!(v["seq_per_s"].as_f64() > Some(0.0));

    // Server-sent events carry the document.
    let mut s = TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET /api/events?token={TOKEN} HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("\"regions\"") {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "the event stream ended: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&got);
    assert!(text.contains("text/event-stream") && text.contains("data: {"), "{text}");

    // A fault button: B's link down, seen on the node and the timeline.
    let (code, body) =
        http(&addr, "POST", &format!("/api/fault?token={TOKEN}"), &format!(r#"{{"op":"link-down","node":{nb}}}"#));
    assert_eq!(code, 200, "{body}");
    let v = until(&addr, "B held down", |v| {
        v["nodes"].as_array().is_some_and(|n| n.iter().any(|n| n["node"] == nb && n["link"] == "held down"))
    });
    let kinds: Vec<&str> = v["timeline"].as_array().unwrap().iter().filter_map(|e| e["kind"].as_str()).collect();
    assert!(kinds.contains(&"fault") && kinds.contains(&"down"), "{kinds:?}");
    let (code, body) = http(&addr, "POST", &format!("/api/fault?token={TOKEN}"), r#"{"op":"reboot","node":0}"#);
    assert_eq!(code, 400);
    assert!(body.contains("unknown fault"), "{body}");
    let (code, body) = http(&addr, "POST", &format!("/api/fault?token={TOKEN}"), r#"{"op":"corrupt","node":900}"#);
    assert_eq!(code, 400, "the hub's refusal comes back: {body}");
    assert!(body.contains("outside"), "{body}");
}
