//! Names for what a driver reads and writes: every register of BAR 0 with
//! its bits, and page control table entries, built from this crate's
//! constants so they cannot drift from the datasheet (`docs/adapter.md`).
//! The adapter's register trace and the tools print these; a test reads
//! this crate's source and checks that every register constant is named.
//!
//! Bit names are the constants' names (`RX_DMA`, `TX`, `RESET`), derived
//! from the short names the `NAMES` tables give (`rx-dma`).

use crate::{caps, ctrl, dma, err, int, pct, reg, NO_NODE};

/// Every BAR 0 register: offset and name (the constant's name in [`reg`]).
pub const REGISTERS: [(u64, &str); 30] = [
    (reg::ID, "ID"),
    (reg::NODE, "NODE"),
    (reg::LINK, "LINK"),
    (reg::PAGE_SIZE, "PAGE_SIZE"),
    (reg::ASPACE_PAGES, "ASPACE_PAGES"),
    (reg::ERR_STATUS, "ERR_STATUS"),
    (reg::ERR_COUNT, "ERR_COUNT"),
    (reg::CTRL, "CTRL"),
    (reg::MEMBERS_LO, "MEMBERS_LO"),
    (reg::MEMBERS_HI, "MEMBERS_HI"),
    (reg::INT_CAUSE, "INT_CAUSE"),
    (reg::INT_MASK, "INT_MASK"),
    (reg::NOTIFY_FIFO, "NOTIFY_FIFO"),
    (reg::NOTIFY_COUNT, "NOTIFY_COUNT"),
    (reg::TX_PACKETS, "TX_PACKETS"),
    (reg::RX_PACKETS, "RX_PACKETS"),
    (reg::RX_DROPPED, "RX_DROPPED"),
    (reg::NOTIFY_LOST, "NOTIFY_LOST"),
    (reg::LINK_EVENTS, "LINK_EVENTS"),
    (reg::LAST_SEQ, "LAST_SEQ"),
    (reg::CAPS, "CAPS"),
    (reg::DMA_RING_LO, "DMA_RING_LO"),
    (reg::DMA_RING_HI, "DMA_RING_HI"),
    (reg::DMA_RING_SIZE, "DMA_RING_SIZE"),
    (reg::DMA_TAIL, "DMA_TAIL"),
    (reg::DMA_HEAD, "DMA_HEAD"),
    (reg::DMA_STATUS, "DMA_STATUS"),
    (reg::DMA_DESCS, "DMA_DESCS"),
    (reg::DMA_BYTES, "DMA_BYTES"),
    (reg::MSIX_TABLE, "MSIX_TABLE"),
];

/// The register at offset `off` of BAR 0 by name: its constant's name, an
/// offset into the MSI-X table or PBA (`MSIX_TABLE+0x8`), or `None`.
pub fn reg_name(off: u64) -> Option<String> {
    if let Some((_, n)) = REGISTERS.iter().find(|(o, _)| *o == off) {
        return Some((*n).to_string());
    }
    if (reg::MSIX_PBA..crate::REGS_SIZE).contains(&off) {
        return Some(format!("MSIX_PBA+{:#x}", off - reg::MSIX_PBA));
    }
    if (reg::MSIX_TABLE..reg::MSIX_PBA).contains(&off) {
        return Some(format!("MSIX_TABLE+{:#x}", off - reg::MSIX_TABLE));
    }
    None
}

/// The register named `name` (as [`reg_name`] prints it, any case).
pub fn reg_offset(name: &str) -> Option<u64> {
    REGISTERS.iter().find(|(_, n)| n.eq_ignore_ascii_case(name)).map(|(o, _)| *o)
}

/// `rx-dma` → `RX_DMA`.
fn constant(short: &str) -> String {
    short.to_ascii_uppercase().replace('-', "_")
}

/// Names of the bits set in `value`; a set bit outside `names` as `bit N`.
fn flags(value: u64, names: &[(u64, &str)]) -> Vec<String> {
    (0..64)
        .map(|b| 1u64 << b)
        .filter(|bit| value & bit != 0)
        .map(|bit| {
            names
                .iter()
                .find(|(v, _)| *v == bit)
                .map_or_else(|| format!("bit {}", bit.trailing_zeros()), |(_, n)| constant(n))
        })
        .collect()
}

fn widen<'a>(names: &[(u32, &'a str)]) -> Vec<(u64, &'a str)> {
    names.iter().map(|&(v, n)| (v as u64, n)).collect()
}

/// What `value` in register `off` means, as words: the bits set for
/// registers of bits (`ERR_STATUS`, `INT_CAUSE`, `INT_MASK`, `CTRL`,
/// `CAPS`, `LINK`), the parts of `NODE` and `DMA_STATUS`; empty for
/// registers that hold a number.
pub fn reg_bits(off: u64, value: u32) -> Vec<String> {
    let v = value as u64;
    match off {
        reg::ERR_STATUS => flags(v, &widen(&err::NAMES)),
        reg::INT_CAUSE | reg::INT_MASK => flags(v, &widen(&int::NAMES)),
        reg::CTRL => flags(v, &widen(&ctrl::NAMES)),
        reg::CAPS => flags(v, &widen(&caps::NAMES)),
        reg::LINK => flags(v, &[(1, "up")]),
        reg::NODE => {
            let ports = value >> 16;
            match value & 0xFFFF {
                NO_NODE => vec!["not joined".into(), format!("{ports} ports")],
                n => vec![format!("node {n}"), format!("{ports} ports")],
            }
        }
        reg::DMA_STATUS => {
            let mut w = flags(v & dma::BUSY as u64, &[(dma::BUSY as u64, "busy")]);
            w.push(constant(dma::status::name(value & 0xFF)));
            w
        }
        _ => Vec::new(),
    }
}

/// What PCT word 0 `word0` says: its flags, and the destination of a
/// point-to-point page.
pub fn pct_bits(word0: u64) -> Vec<String> {
    let mut w = flags(word0 & 0x3F, &pct::NAMES);
    if word0 & pct::P2P != 0 {
        w.push(format!("dest {}", (word0 >> pct::DEST_SHIFT) & pct::DEST_MASK));
    }
    w.extend(flags(word0 & !pct::WORD0_MASK, &[]));
    w
}

fn bracket(words: &[String]) -> String {
    if words.is_empty() {
        String::new()
    } else {
        format!(" [{}]", words.join(" "))
    }
}

/// One register access as a line: `W CTRL = 0x1 [RESET]`,
/// `R ERR_STATUS -> 0x4 [RX_DMA]`.
pub fn describe_reg(write: bool, off: u64, value: u32) -> String {
    let name = reg_name(off).unwrap_or_else(|| format!("REG+{off:#x}"));
    let (d, op) = if write { ('W', '=') } else { ('R', '>') };
    let op = if write { op.to_string() } else { format!("-{op}") };
    format!("{d} {name} {op} {value:#x}{}", bracket(&reg_bits(off, value)))
}

/// One PCT access as a line: `W PCT[16].0 = 0x13 [TX RX ACK]` (word 1,
/// the receive address, has no bits to name).
pub fn describe_pct(write: bool, page: u64, word: u64, value: u64) -> String {
    let (d, op) = if write { ('W', "=") } else { ('R', "->") };
    let bits = if word == 0 { bracket(&pct_bits(value)) } else { String::new() };
    format!("{d} PCT[{page}].{word} {op} {value:#x}{bits}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `pub const NAME: u64` of module `reg` in this crate's source.
    fn register_constants() -> Vec<(String, String)> {
        let src = include_str!("lib.rs");
        let body = src.split("pub mod reg {").nth(1).unwrap().split("\n}\n").next().unwrap();
        body.lines()
            .filter_map(|l| l.trim().strip_prefix("pub const "))
            .filter_map(|l| {
                let (name, rest) = l.split_once(": u64 = ")?;
                Some((name.to_string(), rest.trim_end_matches(';').to_string()))
            })
            .collect()
    }

    #[test]
    fn every_register_constant_has_its_name_and_every_bit_a_name() {
        let consts = register_constants();
        assert!(consts.len() >= 30, "{consts:?}");
        for (name, value) in &consts {
            let off = u64::from_str_radix(value.trim_start_matches("0x"), 16).unwrap();
            if name == "MSIX_PBA" {
                assert_eq!(reg_name(off).as_deref(), Some("MSIX_PBA+0x0"));
                continue;
            }
            assert_eq!(reg_name(off).as_deref(), Some(name.as_str()), "register {name} at {off:#x}");
            assert_eq!(reg_offset(name), Some(off));
        }
        assert_eq!(REGISTERS.len(), consts.len() - 1, "a name for a register that is not a constant");
        let all = |n: &[(u32, &str)]| n.iter().fold(0, |a, (b, _)| a | b);
        assert_eq!(all(&err::NAMES), err::ALL);
        assert_eq!(all(&int::NAMES), int::ALL);
        assert_eq!(all(&caps::NAMES), caps::ALL);
        assert_eq!(all(&ctrl::NAMES), ctrl::RESET);
        assert_eq!(pct::NAMES.iter().fold(0, |a, (b, _)| a | b), pct::WORD0_MASK & 0x3F);
        for code in 0..=dma::status::OVERFLOW {
            assert_ne!(dma::status::name(code), "unknown", "DMA status {code}");
        }
    }

    #[test]
    fn accesses_read_as_the_datasheet_names_them() {
        assert_eq!(describe_reg(true, reg::CTRL, 1), "W CTRL = 0x1 [RESET]");
        assert_eq!(describe_reg(false, reg::ERR_STATUS, 4), "R ERR_STATUS -> 0x4 [RX_DMA]");
        assert_eq!(describe_reg(false, reg::ERR_STATUS, 0x408), "R ERR_STATUS -> 0x408 [LINK_DOWN bit 10]");
        assert_eq!(describe_reg(true, reg::INT_MASK, 0xF), "W INT_MASK = 0xf [NOTIFY LINK ERROR DMA]");
        assert_eq!(describe_reg(false, reg::NODE, 8 << 16 | 2), "R NODE -> 0x80002 [node 2 8 ports]");
        assert_eq!(describe_reg(false, reg::NODE, NO_NODE), "R NODE -> 0xffff [not joined 0 ports]");
        assert_eq!(describe_reg(false, reg::DMA_STATUS, dma::BUSY | 6), "R DMA_STATUS -> 0x80000006 [BUSY LINK_DOWN]");
        assert_eq!(describe_reg(false, reg::TX_PACKETS, 7), "R TX_PACKETS -> 0x7");
        assert_eq!(describe_reg(true, 0x808, 0), "W MSIX_TABLE+0x8 = 0x0");
        assert_eq!(describe_reg(true, 0x3FC, 1), "W REG+0x3fc = 0x1");
        assert_eq!(describe_pct(true, 16, 0, 0x13), "W PCT[16].0 = 0x13 [TX RX ACK]");
        assert_eq!(describe_pct(true, 3, 0, pct::P2P | pct::TX | 5 << 16), "W PCT[3].0 = 0x50021 [TX P2P dest 5]");
        assert_eq!(describe_pct(false, 3, 1, 0x10000), "R PCT[3].1 -> 0x10000");
    }
}
