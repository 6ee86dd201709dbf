//! The Wireshark dissector (`hub/wireshark/mc.lua`) on Debian's `tshark`:
//! a capture made by a real in-process hub (three adapters, broadcast,
//! point-to-point and ACK-page stores, a store into imcd's host table, a
//! node leaving) decodes field by field; the filters a student uses
//! select what they say; a capture with every record cut short is flagged
//! malformed record by record, and garbage never makes a Lua error; the
//! layout constants the script keeps are the Rust ones.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use device::regs::{pct, BAR_TX, PAGE_SIZE};
use imc_proto::layout;

const IOVA: u64 = 0x10000;
const RAM: u64 = 4 * PAGE_SIZE;

fn script() -> PathBuf {
    tests::root().join("hub/wireshark/mc.lua")
}

/// tshark with the dissector and `args`; its standard output.
fn tshark(args: &[&str]) -> String {
    let s = script();
    let out = Command::new("tshark")
        .arg("-X")
        .arg(format!("lua_script:{}", s.display()))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running tshark ({e}): scripts/setup.sh installs it (step tshark)"));
    let (text, err) = (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "tshark {args:?} failed: {err}");
    assert!(!text.contains("Lua Error") && !err.contains("Lua Error"), "a Lua error: {text}{err}");
    text
}

/// The rows of `-T fields` for `fields`, filtered by `filter`.
fn fields(file: &Path, filter: &str, fields: &[&str]) -> Vec<Vec<String>> {
    let f = file.to_str().unwrap();
    let mut args = vec!["-r", f, "-T", "fields", "-E", "separator=|"];
    if !filter.is_empty() {
        args.extend(["-Y", filter]);
    }
    for x in fields {
        args.extend(["-e", x]);
    }
    tshark(&args).lines().map(|l| l.split('|').map(str::to_string).collect()).collect()
}

/// A pcap file's records: (global header, [(record header, data)]).
type Records = (Vec<u8>, Vec<([u8; 16], Vec<u8>)>);

/// Whether a pcap file is big-endian (its magic as written).
fn big_endian(head: &[u8]) -> bool {
    head[..4] == [0xa1, 0xb2, 0xc3, 0xd4]
}

fn records(bytes: &[u8]) -> Records {
    let be = big_endian(bytes);
    let mut at = 24;
    let mut out = Vec::new();
    while at + 16 <= bytes.len() {
        let hdr: [u8; 16] = bytes[at..at + 16].try_into().unwrap();
        let n = hdr[8..12].try_into().unwrap();
        let n = if be { u32::from_be_bytes(n) } else { u32::from_le_bytes(n) } as usize;
        out.push((hdr, bytes[at + 16..at + 16 + n].to_vec()));
        at += 16 + n;
    }
    (bytes[..24].to_vec(), out)
}

fn write_records(path: &Path, (head, recs): &Records) {
    let mut out = head.clone();
    for (hdr, data) in recs {
        let mut h = *hdr;
        let n = data.len() as u32;
        let n = if big_endian(head) { n.to_be_bytes() } else { n.to_le_bytes() };
        h[8..12].copy_from_slice(&n);
        h[12..16].copy_from_slice(&n);
        out.extend_from_slice(&h);
        out.extend_from_slice(data);
    }
    std::fs::write(path, out).unwrap();
}

#[test]
fn tshark_decodes_a_real_hub_capture() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("trace.pcap");
    let hub = Hub::start();
    hub.hub.capture_to(&file).unwrap();
    let mut a = Node::start(&hub, "a", IOVA, 0, RAM);
    let mut b = Node::start(&hub, "b", IOVA, 0, RAM);
    let c = Node::start(&hub, "c", IOVA, 0, RAM);
    let (na, nb, nc) = (a.adapter.node, b.adapter.node, c.adapter.node);
    let (data_page, p2p_page, ack_page) = (60u64, 61u64, 62u64);
    let host = layout::HOST_PAGE;
    // B receives all four pages; A transmits: a broadcast page, a page P2P
    // to B, an ACK page and imcd's host-table page.
    for (i, p) in [data_page, p2p_page, ack_page, host].into_iter().enumerate() {
        b.vfio.set_pct(p, pct::RX, IOVA + i as u64 * PAGE_SIZE);
    }
    a.vfio.set_pct(data_page, pct::TX, 0);
    a.vfio.set_pct(p2p_page, pct::TX | pct::P2P | (nb as u64) << pct::DEST_SHIFT, 0);
    a.vfio.set_pct(ack_page, pct::TX | pct::ACK, 0);
    a.vfio.set_pct(host, pct::TX, 0);
    a.vfio.region_write(BAR_TX, data_page * PAGE_SIZE + 8, &0x1111_2222_3333_4444u64.to_le_bytes(), false);
    a.vfio.region_write(BAR_TX, p2p_page * PAGE_SIZE + 16, &[0xAB; 4], false);
    a.vfio.region_write(BAR_TX, ack_page * PAGE_SIZE, &[1; 8], false);
    // Host row 1, word 0: imcd's token.
    a.vfio.region_write(BAR_TX, host * PAGE_SIZE + 8 * 8, &7u64.to_le_bytes(), false);
    poll("B to receive the host-table store", || {
        (b.ram.read(3 * PAGE_SIZE + 64, 8) == [7, 0, 0, 0, 0, 0, 0, 0]).then_some(())
    });
    drop(c);
    // 3 joins, 4 writes (and the ACK answers), 1 leave: wait for the leave.
    let all = poll("the capture to hold the leave", || {
        let rows = fields(
            &file,
            "",
            &[
                "mc.seq",
                "mc.kind",
                "mc.node",
                "mc.dest",
                "mc.p2p",
                "mc.page",
                "mc.offset",
                "mc.len",
                "mc.up",
                "mc.imcd",
                "mc.data",
            ],
        );
        rows.iter().any(|r| r[1] == "member" && r[8] == "0").then_some(rows)
    });
    let seqs: Vec<u64> = all.iter().map(|r| r[0].parse().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[1] > w[0]), "the global order, increasing: {seqs:?}");
    let members: Vec<(String, String)> =
        all.iter().filter(|r| r[1] == "member").map(|r| (r[2].clone(), r[8].clone())).collect();
    let want: Vec<(String, String)> =
        [(na, "1"), (nb, "1"), (nc, "1"), (nc, "0")].iter().map(|(n, u)| (n.to_string(), u.to_string())).collect();
    assert_eq!(members, want, "{all:?}");
    let writes: Vec<&Vec<String>> = all.iter().filter(|r| r[1] == "write" && r[2] == na.to_string()).collect();
    assert_eq!(writes.len(), 4, "A's four stores: {all:?}");
    // The broadcast: page, offset, length, data; no destination.
    assert_eq!(writes[0][3..8], ["", "0", &data_page.to_string(), "0x00000008", "8"], "{:?}", writes[0]);
    assert_eq!(writes[0][10], "4444333322221111");
    // The P2P store names B.
    assert_eq!(writes[1][3..8], [&nb.to_string(), "1", &p2p_page.to_string(), "0x00000010", "4"], "{:?}", writes[1]);
    // imcd's page is named.
    assert_eq!(writes[3][5], host.to_string());
    assert_eq!(writes[3][9], "host row 1, imcd token");
    // The ACK store carries the ACK flag, and answers come back flagged.
    let acks = fields(&file, "mc.flags.ack == 1", &["mc.page"]);
    assert_eq!(acks, [vec![ack_page.to_string()]]);
    let answers = fields(&file, "mc.flags.ack_answer == 1", &["mc.node", "mc.dest"]);
    assert!(answers.iter().any(|r| r[0] == nb.to_string() && r[1] == na.to_string()), "B answered A: {answers:?}");
    // The filters a student writes.
    let f = |expr: &str| fields(&file, expr, &["mc.seq"]).len();
    assert_eq!(f(&format!("mc.page == {data_page}")), 1);
    assert_eq!(f("mc.kind == \"member\""), 4);
    assert_eq!(f(&format!("mc.node == {na} && mc.kind == \"write\"")), 4);
    assert_eq!(f(&format!("mc.seq > {}", seqs[seqs.len() - 2])), 1);
    assert_eq!(f("mc.p2p == 1"), 1 + answers.len());
    // imcd's names can be turned off (a raw cluster).
    assert_eq!(f("mc.imcd"), 1);
    let raw = tshark(&["-r", file.to_str().unwrap(), "-o", "mc.imcd_pages:FALSE", "-Y", "mc.imcd"]);
    assert_eq!(raw.trim(), "", "no imcd names with the preference off");
    // Nothing malformed in a good capture.
    assert_eq!(f("_ws.malformed || _ws.expert.severity == error"), 0);

    // Every record cut in half: each one flagged.
    let mut recs = records(&std::fs::read(&file).unwrap());
    let n = recs.1.len();
    for (_, d) in recs.1.iter_mut() {
        d.truncate(d.len() / 2);
    }
    let cut = dir.path().join("cut.pcap");
    write_records(&cut, &recs);
    assert_eq!(fields(&cut, "_ws.malformed", &["mc.kind"]).len(), n, "every cut record is malformed");
    // Garbage of every length, and bytes flipped in good frames: flagged or
    // decoded, never a Lua error (tshark() checks), and the CRC catches the flips.
    let mut junk = records(&std::fs::read(&file).unwrap());
    let good = junk.1.clone();
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut rnd = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    junk.1.clear();
    for len in 0..80 {
        let mut d: Vec<u8> = (0..len).map(|_| rnd() as u8).collect();
        if len >= 6 {
            d[..6].copy_from_slice(&[b'M', b'C', b'L', b'K', 1, (len % 8) as u8]);
        }
        junk.1.push((good[0].0, d));
    }
    for (h, d) in &good {
        let mut d = d.clone();
        let i = 16 + rnd() as usize % (d.len() - 16);
        d[i] ^= 0x40;
        junk.1.push((*h, d));
    }
    let bad = dir.path().join("junk.pcap");
    write_records(&bad, &junk);
    let crc = fields(&bad, "_ws.expert.message contains \"CRC\"", &["frame.number"]);
    assert!(crc.len() >= good.len() / 2, "flipped payload bytes fail the CRC: {} of {}", crc.len(), good.len());
    assert!(fields(&bad, "_ws.malformed", &["frame.number"]).len() >= 16, "short garbage is flagged");
}

/// The dissector names imcd's fields as `imc_proto::layout::describe`
/// does (the monitor's tail uses that), word for word, at addresses all
/// over imcd's pages.
#[test]
fn the_dissector_names_imcd_fields_as_the_rust_layout_does() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("imcd.pcap");
    let mut out = Vec::new();
    for v in [0xa1b2_c3d4u32.to_le_bytes().as_slice(), &2u16.to_le_bytes(), &4u16.to_le_bytes(), &[0; 8]] {
        out.extend_from_slice(v);
    }
    out.extend_from_slice(&65535u32.to_le_bytes());
    out.extend_from_slice(&147u32.to_le_bytes());
    let mut addrs = Vec::new();
    for page in 0..layout::DATA_FIRST + 1 {
        for off in [0u64, 8, 56, 64, 512, 4096, 4104, 8184] {
            addrs.push(page * PAGE_SIZE + off);
        }
    }
    for (seq, &addr) in addrs.iter().enumerate() {
        let mut f = link::Msg::Deliver { seq: seq as u64, src: 0, flags: 0, addr, data: &[1; 8] }.encode();
        f.extend_from_slice(&link::BROADCAST.to_le_bytes());
        for v in [1u32, 0, f.len() as u32, f.len() as u32] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&f);
    }
    std::fs::write(&file, out).unwrap();
    let rows = fields(&file, "", &["mc.page", "mc.offset", "mc.imcd"]);
    assert_eq!(rows.len(), addrs.len());
    for (row, addr) in rows.iter().zip(&addrs) {
        let want = layout::describe(addr / PAGE_SIZE, addr % PAGE_SIZE).unwrap_or_default();
        assert_eq!(row[2], want, "address {addr:#x} (page {} offset {})", row[0], row[1]);
    }
}

/// The constants the script keeps by hand are the Rust ones.
#[test]
fn the_dissector_keeps_the_rust_layout() {
    let text = std::fs::read_to_string(script()).unwrap();
    let value = |name: &str| -> u64 {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("local {name} = ")))
            .unwrap_or_else(|| panic!("no `local {name} = ` in mc.lua"));
        let v = line.split('=').nth(1).unwrap().split("--").next().unwrap().trim();
        match v.strip_prefix("0x") {
            Some(h) => u64::from_str_radix(h, 16).unwrap(),
            None => v.parse().unwrap(),
        }
    };
    let want: [(&str, u64); 22] = [
        ("MAGIC", link::MAGIC as u64),
        ("VERSION", link::VERSION as u64),
        ("HEADER_LEN", link::HEADER_LEN as u64),
        ("MAX_DATA", link::MAX_DATA as u64),
        ("BROADCAST", link::BROADCAST as u64),
        ("DEST_TRAILER", hub::hub::DEST_TRAILER as u64),
        ("FLAG_LOOPBACK", link::FLAG_LOOPBACK as u64),
        ("FLAG_ACK", link::FLAG_ACK as u64),
        ("FLAG_ACK_REPLY", link::FLAG_ACK_REPLY as u64),
        ("PAGE_SIZE", PAGE_SIZE),
        ("DIR_PAGE", layout::DIR_PAGE),
        ("DIR_PAGES", layout::DIR_PAGES),
        ("LOCK_SLOTS", layout::LOCK_SLOTS as u64),
        ("ENTRY_WORDS", layout::ENTRY_WORDS as u64),
        ("ENTRIES", layout::ENTRIES as u64),
        ("ACK_PAGE", layout::ACK_PAGE),
        ("ACK_PAGES", layout::ACK_PAGES),
        ("HOST_PAGE", layout::HOST_PAGE),
        ("RELAY_PAGE", layout::RELAY_PAGE),
        ("ERRCNT_PAGE", layout::ERRCNT_PAGE),
        ("ACK_Q_PAGE", layout::ACK_Q_PAGE),
        ("DATA_FIRST", layout::DATA_FIRST),
    ];
    // The hub copies imcd's pages for the monitor: all of them.
    assert_eq!(hub::hub::SHADOW_PAGES, layout::DATA_FIRST);
    for (name, v) in want {
        assert_eq!(value(name), v, "mc.lua's {name}");
    }
    for (name, v) in [
        ("MAX_NODES", layout::MAX_NODES as u64),
        ("HOST_ROW", layout::host::ROW as u64),
        ("RELAY_ROW", layout::relay::ROW as u64),
        ("RELAY_RESPONSES", layout::relay::RESPONSES as u64),
    ] {
        assert_eq!(value(name), v, "mc.lua's {name}");
    }
    // tshark lists the protocol.
    let out = Command::new("tshark")
        .args(["-G", "protocols", "-X"])
        .arg(format!("lua_script:{}", script().display()))
        .output()
        .expect("tshark (scripts/setup.sh installs it)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.lines().any(|l| l == "MEMORY CHANNEL\tMC\tmc"), "tshark -G protocols has no mc");
}
