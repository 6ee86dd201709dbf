//! `docs/adapter.md` and the register constants must agree: every register,
//! error bit, interrupt bit and PCT bit in the doc's tables has a constant
//! with the same value, and every constant is in the doc; so do the
//! registers' documented reset values.

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
        ("CAPS", reg::CAPS),
        ("DMA_RING_LO", reg::DMA_RING_LO),
        ("DMA_RING_HI", reg::DMA_RING_HI),
        ("DMA_RING_SIZE", reg::DMA_RING_SIZE),
        ("DMA_TAIL", reg::DMA_TAIL),
        ("DMA_HEAD", reg::DMA_HEAD),
        ("DMA_STATUS", reg::DMA_STATUS),
        ("DMA_DESCS", reg::DMA_DESCS),
        ("DMA_BYTES", reg::DMA_BYTES),
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
        ("TX_LINK_DOWN", err::TX_LINK_DOWN as u64),
        ("DMA", err::DMA as u64),
    ];
    check(&rows, &consts, |c| 1 << num(c), "error bit");
    assert_eq!(
        consts.iter().fold(0, |a, (_, v)| a | v),
        err::ALL as u64,
        "err::ALL covers exactly the documented bits"
    );
}

/// The reset-value cell (fourth column) of each register row: its first
/// `code` span as a number, or None when the cell has no literal value.
fn reset_values(doc: &str) -> BTreeMap<String, Option<u64>> {
    let start = doc.find("## Registers (BAR 0)").expect("register table");
    let mut rows = BTreeMap::new();
    for line in doc[start..].lines().skip(1).skip_while(|l| !l.starts_with('|')).take_while(|l| l.starts_with('|')) {
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        if cells.len() < 4 || cells[0] == "offset" || cells[0].starts_with("---") {
            continue;
        }
        let literal = cells[3].split('`').nth(1).map(num);
        rows.insert(cells[1].to_string(), literal);
    }
    rows
}

#[test]
fn reset_values_match() {
    let rows = reset_values(&doc());
    let want: [(&str, Option<u64>); 29] = [
        ("ID", Some(regs::ID_VALUE as u64)),
        ("NODE", Some(regs::NODE_RESET as u64)),
        ("LINK", None),
        ("PAGE_SIZE", Some(regs::PAGE_SIZE)),
        ("ASPACE_PAGES", None),
        ("ERR_STATUS", Some(0)),
        ("ERR_COUNT", Some(0)),
        ("CTRL", Some(0)),
        ("MEMBERS_LO", None),
        ("MEMBERS_HI", None),
        ("INT_CAUSE", Some(0)),
        ("INT_MASK", Some(0)),
        ("NOTIFY_FIFO", Some(regs::NOTIFY_EMPTY as u64)),
        ("NOTIFY_COUNT", Some(0)),
        ("TX_PACKETS", Some(0)),
        ("RX_PACKETS", Some(0)),
        ("RX_DROPPED", Some(0)),
        ("NOTIFY_LOST", Some(0)),
        ("LINK_EVENTS", Some(0)),
        ("LAST_SEQ", Some(0)),
        ("CAPS", Some(regs::caps::ALL as u64)),
        ("DMA_RING_LO", Some(0)),
        ("DMA_RING_HI", Some(0)),
        ("DMA_RING_SIZE", Some(0)),
        ("DMA_TAIL", Some(0)),
        ("DMA_HEAD", Some(0)),
        ("DMA_STATUS", Some(0)),
        ("DMA_DESCS", Some(0)),
        ("DMA_BYTES", Some(0)),
    ];
    for (name, v) in want {
        assert_eq!(rows.get(name), Some(&v), "reset value of {name} in docs/adapter.md");
    }
    assert_eq!(rows.len(), want.len(), "registers in the table: {:?}", rows.keys());
    // NODE before the first join: no node id, no ports.
    assert_eq!(regs::NODE_RESET & 0xFFFF, regs::NO_NODE);
    assert_eq!(regs::NODE_RESET >> 16, 0);
}

#[test]
fn receive_address_and_ack_bits_match() {
    let d = doc().replace('\n', " ");
    let reserved = !pct::WORD1_MASK;
    assert_eq!(reserved, 0x7, "word 1's reserved bits are the low ones");
    let needle = format!("Its bits 0–{} are reserved and read as zero", reserved.count_ones() - 1);
    assert!(d.contains(&needle), "docs/adapter.md does not say '{needle}'");
    // An ACK answer carries the ERR_STATUS bits below ACK_VALID.
    let top = regs::ACK_VALID.trailing_zeros();
    let needle = format!("its ERR_STATUS bits 0–{} with bit {top}", top - 1);
    assert!(d.contains(&needle), "docs/adapter.md does not say '{needle}'");
}

#[test]
fn interrupt_bits_match() {
    let rows = table(&doc(), "### INT_CAUSE and INT_MASK bits");
    let consts = [
        ("NOTIFY", int::NOTIFY as u64),
        ("LINK", int::LINK as u64),
        ("ERROR", int::ERROR as u64),
        ("DMA", int::DMA as u64),
    ];
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

#[test]
fn dma_layout_and_codes_match() {
    use regs::dma::{self, status};
    let d = doc();
    let sec = &d[d.find("## Transmit DMA").expect("a Transmit DMA section")..];
    // Status codes: the table's rows are (code, name).
    let mut rows = table(sec, "Status codes");
    rows.remove("name"); // the header row
    let names: Vec<(u32, String)> =
        status::NAMES.iter().map(|(c, n)| (*c, n.to_uppercase().replace('-', "_"))).collect();
    for (code, name) in &names {
        let cell = rows.get(name).unwrap_or_else(|| panic!("DMA status {name} is not documented"));
        assert_eq!(num(cell), *code as u64, "DMA status {name}");
    }
    assert_eq!(rows.len(), names.len(), "DMA status codes in the doc: {:?}", rows.keys());
    // The descriptor picture and the limits.
    let flat = sec.replace('\n', " ");
    for needle in [
        format!("ring of {}-byte descriptors", dma::DESC_SIZE),
        format!("a power of two, 1 to {}", dma::MAX_RING),
        format!("bit {} INT", dma::flags::INT.trailing_zeros()),
        format!("bit {} DONE", dma::DONE.trailing_zeros()),
    ] {
        assert!(flat.contains(&needle), "the Transmit DMA section does not say '{needle}'");
    }
    assert_eq!((dma::SRC, dma::DEST, dma::LEN, dma::FLAGS, dma::BYTES, dma::STATUS), (0, 8, 16, 20, 24, 28));
    assert_eq!(dma::STATUS + 4, dma::DESC_SIZE);
}
