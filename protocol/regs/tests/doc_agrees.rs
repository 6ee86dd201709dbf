//! `docs/adapter.md` and the register constants must agree: every register,
//! error bit, interrupt bit and PCT bit in the doc's tables has a constant
//! with the same value, and every constant is in the doc.

use std::collections::BTreeMap;

use regs::{err, int, pct, reg};

fn doc() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/adapter.md")).expect("docs/adapter.md")
}

/// Rows of the first table after `heading`: first two cells of each row.
fn table(doc: &str, heading: &str) -> BTreeMap<String, String> {
    let start = doc.find(heading).unwrap_or_else(|| panic!("no '{heading}' in docs/adapter.md"));
    let mut rows = BTreeMap::new();
    let mut in_table = false;
    for line in doc[start..].lines().skip(1) {
        let l = line.trim();
        if l.starts_with('|') {
            in_table = true;
            let cells: Vec<&str> = l.trim_matches('|').split('|').map(|c| c.trim().trim_matches('`')).collect();
            if cells.len() >= 2 && !cells[0].starts_with("---") && cells[0] != "offset" && cells[0] != "bit" {
                rows.insert(cells[1].to_string(), cells[0].to_string());
            }
        } else if in_table {
            break;
        }
    }
    assert!(!rows.is_empty(), "table after '{heading}' is empty");
    rows
}

fn num(s: &str) -> u64 {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).unwrap(),
        None => s.parse().unwrap_or_else(|_| panic!("'{s}' is not a number")),
    }
}

fn check(rows: &BTreeMap<String, String>, consts: &[(&str, u64)], value: impl Fn(&str) -> u64, what: &str) {
    for (name, v) in consts {
        let cell = rows.get(*name).unwrap_or_else(|| panic!("{what} {name} is not documented"));
        assert_eq!(value(cell), *v, "{what} {name}: doc says {cell}, code says {v:#x}");
    }
    let names: Vec<&str> = consts.iter().map(|(n, _)| *n).collect();
    for doc_name in rows.keys() {
        assert!(
            names.contains(&doc_name.as_str()),
            "{what} {doc_name} is documented but has no constant in this check"
        );
    }
}

#[test]
fn registers_match() {
    let rows = table(&doc(), "## Registers (BAR 0)");
    let consts = [
        ("ID", reg::ID),
        ("NODE", reg::NODE),
        ("LINK", reg::LINK),
        ("PAGE_SIZE", reg::PAGE_SIZE),
        ("ASPACE_PAGES", reg::ASPACE_PAGES),
        ("ERR_STATUS", reg::ERR_STATUS),
        ("ERR_COUNT", reg::ERR_COUNT),
        ("CTRL", reg::CTRL),
        ("MEMBERS_LO", reg::MEMBERS_LO),
        ("MEMBERS_HI", reg::MEMBERS_HI),
        ("INT_CAUSE", reg::INT_CAUSE),
        ("INT_MASK", reg::INT_MASK),
        ("NOTIFY_FIFO", reg::NOTIFY_FIFO),
        ("NOTIFY_COUNT", reg::NOTIFY_COUNT),
        ("TX_PACKETS", reg::TX_PACKETS),
        ("RX_PACKETS", reg::RX_PACKETS),
        ("RX_DROPPED", reg::RX_DROPPED),
        ("NOTIFY_LOST", reg::NOTIFY_LOST),
        ("LINK_EVENTS", reg::LINK_EVENTS),
        ("LAST_SEQ", reg::LAST_SEQ),
    ];
    check(&rows, &consts, num, "register");
    // Hex case does not matter; the values do.
    let d = doc().to_lowercase();
    for needle in [
        format!("| `{:#04x}` | id | ro | `{:#010x}`", reg::ID, regs::ID_VALUE),
        format!("table in bar 0 at `{:#x}`", reg::MSIX_TABLE),
        format!("pba in bar 0 at `{:#x}`", reg::MSIX_PBA),
        format!("(depth {})", regs::NOTIFY_DEPTH),
        format!("`{:#x}` (empty)", regs::NOTIFY_EMPTY),
    ] {
        assert!(d.contains(&needle), "docs/adapter.md does not say '{needle}'");
    }
}

#[test]
fn error_bits_match() {
    let rows = table(&doc(), "### ERR_STATUS bits");
    let consts = [
        ("TX_DISABLED", err::TX_DISABLED as u64),
        ("TX_READ", err::TX_READ as u64),
        ("RX_DMA", err::RX_DMA as u64),
        ("LINK_DOWN", err::LINK_DOWN as u64),
        ("CRC", err::CRC as u64),
        ("RX_RANGE", err::RX_RANGE as u64),
        ("TX_DEST", err::TX_DEST as u64),
        ("SEQ_GAP", err::SEQ_GAP as u64),
    ];
    check(&rows, &consts, |c| 1 << num(c), "error bit");
    assert_eq!(
        consts.iter().fold(0, |a, (_, v)| a | v),
        err::ALL as u64,
        "err::ALL covers exactly the documented bits"
    );
}

#[test]
fn interrupt_bits_match() {
    let rows = table(&doc(), "### INT_CAUSE and INT_MASK bits");
    let consts = [("NOTIFY", int::NOTIFY as u64), ("LINK", int::LINK as u64), ("ERROR", int::ERROR as u64)];
    check(&rows, &consts, |c| 1 << num(c), "interrupt bit");
    assert_eq!(consts.iter().fold(0, |a, (_, v)| a | v), int::ALL as u64);
}

#[test]
fn pct_bits_match() {
    let d = doc();
    let rows = table(&d[d.find("## Page control table").unwrap()..], "| bit | name | meaning |");
    let consts = [
        ("TX", pct::TX),
        ("RX", pct::RX),
        ("LOOPBACK", pct::LOOPBACK),
        ("INT", pct::INT),
        ("ACK", pct::ACK),
        ("P2P", pct::P2P),
        ("dest node", pct::DEST_MASK << pct::DEST_SHIFT),
    ];
    check(
        &rows,
        &consts,
        |c| match c.split_once('–') {
            Some((lo, hi)) => ((1u64 << (num(hi) - num(lo) + 1)) - 1) << num(lo),
            None => 1 << num(c),
        },
        "PCT bit",
    );
    assert_eq!(
        consts.iter().fold(0, |a, (_, v)| a | v),
        pct::WORD0_MASK,
        "WORD0_MASK covers exactly the documented bits"
    );
    assert!(d.contains(&format!("page `p` at offset `p × {}`", pct::ENTRY)));
}
