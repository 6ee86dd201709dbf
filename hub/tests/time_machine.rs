//! `mc-trace`, the time machine, against a capture whose contents the test
//! knows: a scripted run of three simulated adapters on a real hub
//! (overlapping writes, a point-to-point write, a node leaving), asked
//! every question the command answers, and its refusals.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use hub::testing::TestHub;
use link::BROADCAST;

mod common;
use common::Sim;

fn trace(file: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mc-trace")).arg(file).args(args).output().unwrap()
}

fn ok(file: &Path, args: &[&str]) -> String {
    let out = trace(file, args);
    assert!(out.status.success(), "mc-trace {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn json(file: &Path, args: &[&str]) -> Vec<serde_json::Value> {
    let mut a = vec!["--json"];
    a.extend_from_slice(args);
    ok(file, &a).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn the_time_machine_answers_from_a_known_capture() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("trace.pcap");
    let hub = TestHub::start();
    hub.hub.capture_to(&file).unwrap();
    let mut a = Sim::join(&hub.path, "a");
    let mut b = Sim::join(&hub.path, "b");
    let mut c = Sim::join(&hub.path, "c");
    let (na, nb, nc) = (a.joined.node, b.joined.node, c.joined.node);
    let page = 60u64;
    let base = page * 8192;
    // Each write is delivered before the next is sent, so the order is the script's.
    a.write(BROADCAST, 0, base, &1u64.to_le_bytes());
    a.flush();
    let s1 = b.next_delivery().0;
    assert_eq!(c.next_delivery().0, s1);
    b.write(BROADCAST, 0, base, &2u64.to_le_bytes());
    b.flush();
    let s2 = a.next_delivery().0;
    c.next_delivery();
    a.write(BROADCAST, 0, base + 4, &[0xaa; 8]);
    a.flush();
    let s3 = b.next_delivery().0;
    c.next_delivery();
    c.write(na, 0, base + 8192 + 16, b"hello!!!");
    c.flush();
    let s4 = a.next_delivery().0;
    drop(c);
    // The leave is recorded after the writes.
    let t0 = Instant::now();
    let summary = loop {
        let s = json(&file, &["summary"]);
        if s[0]["leaves"] == 1 {
            break s;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "no leave in the capture: {s:?}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(summary[0]["writes"], 4, "{summary:?}");
    assert_eq!(summary[0]["joins"], 3);
    assert_eq!(summary[0]["bytes"], 8 + 8 + 8 + 8);

    // state: the page after the first write, after the second, at the end.
    let dump = |at: u64| -> Vec<u8> {
        let out = trace(&file, &["state", "--page", &page.to_string(), "--at", &at.to_string(), "--raw"]);
        assert!(out.status.success());
        out.stdout
    };
    assert_eq!(dump(s1)[..16], [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(dump(s2)[..16], [2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    let end = dump(s4);
    assert_eq!(end[..16], [2, 0, 0, 0, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0, 0, 0, 0]);
    assert!(end[16..].iter().all(|&x| x == 0) && end.len() == 8192);
    assert!(dump(s1 - 1).iter().all(|&x| x == 0), "before the first write the page is zero");
    let text = ok(&file, &["state", "--page", "61"]);
    assert!(
        text.contains("after 1 write(s)")
            && text.contains("+0x0010  68 65 6c 6c 6f 21 21 21")
            && text.contains("|hello!!!"),
        "{text}"
    );

    // who-wrote: word 0 of the page, all three writes; then a range.
    let w = json(&file, &["who-wrote", &format!("{page}:0")]);
    let who: Vec<(u64, u64, String)> = w
        .iter()
        .map(|x| (x["seq"].as_u64().unwrap(), x["node"].as_u64().unwrap(), x["after"].as_str().unwrap().to_string()))
        .collect();
    assert_eq!(
        who,
        [
            (s1, na as u64, "0x0000000000000001".to_string()),
            (s2, nb as u64, "0x0000000000000002".to_string()),
            (s3, na as u64, "0xaaaaaaaa00000002".to_string()),
        ]
    );
    let w = json(&file, &["who-wrote", &format!("{:#x}", base + 12), "--between", &s2.to_string(), &s4.to_string()]);
    assert_eq!(w.len(), 1, "word 1: the third write only: {w:?}");
    assert_eq!(w[0]["after"], "0x00000000aaaaaaaa");
    let p2p = json(&file, &["who-wrote", "61:16"]);
    assert_eq!((p2p[0]["node"].as_u64(), p2p[0]["dest"].as_u64()), (Some(nc as u64), Some(na as u64)));
    assert!(ok(&file, &["who-wrote", "62:0"]).contains("nobody wrote"));

    // diff: from the first write to the end, words 0 and 1 of the page and the P2P word.
    let d = json(&file, &["diff", "--from", &s1.to_string(), "--to", &s4.to_string()]);
    let changed: Vec<(u64, String, String, u64)> = d
        .iter()
        .map(|x| {
            let s = |k: &str| x[k].as_str().unwrap().to_string();
            (x["addr"].as_u64().unwrap(), s("before"), s("after"), x["node"].as_u64().unwrap())
        })
        .collect();
    let hello = format!("{:#018x}", u64::from_le_bytes(*b"hello!!!"));
    let zero = "0x0000000000000000".to_string();
    assert_eq!(
        changed,
        [
            (base, "0x0000000000000001".to_string(), "0xaaaaaaaa00000002".to_string(), na as u64),
            (base + 8, zero.clone(), "0x00000000aaaaaaaa".to_string(), na as u64),
            (base + 8192 + 16, zero, hello, nc as u64),
        ]
    );
    assert!(ok(&file, &["diff", "--from", &s4.to_string(), "--to", &s4.to_string()]).contains("nothing changed"));

    // timeline: c joined, wrote to a, left.
    let t = json(&file, &["timeline", "--node", &nc.to_string()]);
    let kinds: Vec<(String, Option<bool>)> =
        t.iter().map(|x| (x["kind"].as_str().unwrap().to_string(), x["up"].as_bool())).collect();
    assert_eq!(
        kinds,
        [("member".to_string(), Some(true)), ("write".to_string(), None), ("member".to_string(), Some(false))]
    );
    assert_eq!(t[1]["dest"], na);
    let text = ok(&file, &["timeline", "--node", &nc.to_string()]);
    assert!(text.contains(&format!("write {nc} -> {na}")) && text.contains("left"), "{text}");

    // regions: A writes a directory record into entry 2's copy 1, flips the
    // toggle to it (the record appears), then clears its holders (gone).
    let mut c2 = Sim::join(&hub.path, "c2");
    let at = ((imc_proto::layout::LOCK_SLOTS + 2 * imc_proto::layout::ENTRY_WORDS) * 8) as u64;
    let rec: Vec<u8> = [123u64, 70, 2, 0o666, 0, 0, 5, 0b11].iter().flat_map(|w| w.to_le_bytes()).collect();
    a.write(BROADCAST, 0, at + 8 + 64, &rec);
    a.flush();
    c2.next_delivery();
    a.write(BROADCAST, 0, at, &1u64.to_le_bytes());
    a.flush();
    let s_in = c2.next_delivery().0;
    a.write(BROADCAST, 0, at + 8 + 64 + 56, &0u64.to_le_bytes());
    a.flush();
    let s_out = c2.next_delivery().0;
    let r = json(&file, &["regions", "--key", "123"]);
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(
        (r[0]["first_page"].as_u64(), r[0]["pages"].as_u64(), r[0]["hosts"].as_u64()),
        (Some(70), Some(2), Some(3))
    );
    assert_eq!((r[0]["from"].as_u64(), r[0]["to"].as_u64()), (Some(s_in), Some(s_out)));
    assert!(ok(&file, &["regions"]).contains("key 0x7b pages 70..71 held by 0,1"), "{}", ok(&file, &["regions"]));
    assert!(ok(&file, &["regions", "--key", "5"]).contains("no region"));
    // An address in it by key: page 70 (nobody wrote it), and past its end.
    assert!(ok(&file, &["who-wrote", "region:123:8"]).contains("nobody wrote the word at 0x8c008"));
    assert!(String::from_utf8_lossy(&trace(&file, &["who-wrote", "region:123:0x4000"]).stderr)
        .contains("past the end of region 0x7b"));
    assert!(String::from_utf8_lossy(&trace(&file, &["who-wrote", "region:99:0"]).stderr)
        .contains("no region with key 0x63"));

    // Refusals: a clear error and exit code 1.
    let err = |args: &[&str]| {
        let out = trace(&file, args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert!(err(&["diff", "--from", "9", "--to", "3"]).contains("is empty"));
    assert!(err(&["who-wrote", "60:9000"]).contains("past the end"));
    assert!(err(&["who-wrote", "sixty"]).contains("not a number"));
    std::fs::write(dir.path().join("junk"), b"not a capture at all, not at all").unwrap();
    let out = trace(&dir.path().join("junk"), &["summary"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a MEMORY CHANNEL capture"));
    // A capture cut short in its last record: the rest, and a warning.
    let whole = std::fs::read(&file).unwrap();
    std::fs::write(dir.path().join("cut"), &whole[..whole.len() - 3]).unwrap();
    let out = trace(&dir.path().join("cut"), &["--json", "summary"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("incomplete"));
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((s["writes"].as_u64(), s["leaves"].as_u64()), (Some(6), Some(1)), "the last write was cut: {s}");
}
