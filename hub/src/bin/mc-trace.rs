//! `mc-trace`: the time machine for the global order. Reads a hub capture
//! (`mc-hub --pcap`, `mc-cluster capture start`) and answers what MEMORY
//! CHANNEL space held and who wrote it, at any point of the order
//! (`hub::history`). Single-threaded; reads the file only.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use hub::history::{Event, History, What, PAGE_SIZE};
use serde_json::json;

#[derive(Parser)]
#[command(
    name = "mc-trace",
    version,
    about = "The global order's time machine: what MEMORY CHANNEL space held, and who wrote it",
    long_about = "The global order's time machine: what MEMORY CHANNEL space held, and who wrote it.\n\n\
                  Reads a capture of the hub (mc-hub --pcap FILE, mc-cluster capture start FILE) and answers \
                  questions about any point of the global order. Contents are the global view: the last write in \
                  the order to each byte; bytes nobody wrote read as zero. Addresses are byte addresses in \
                  MEMORY CHANNEL space (decimal or 0x hex), PAGE:OFFSET, or region:KEY:OFFSET for a region imcd's \
                  directory held during the capture.",
    after_help = "Examples:\n  mc-trace trace.pcap summary\n  mc-trace trace.pcap state --page 60 --at 1200\n  \
                  mc-trace trace.pcap who-wrote 60:0x8 --between 1000 2000\n  mc-trace trace.pcap diff --from 1000 \
                  --to 1010\n  mc-trace trace.pcap timeline --node 1\n  mc-trace trace.pcap regions --key 123\n\nExit codes: 0 \
                  answered (also when standard output is a closed pipe), 1 an error (unreadable capture, a bad \
                  question), 2 a usage error."
)]
struct Args {
    /// The capture file.
    file: PathBuf,
    /// One JSON object per line instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// The capture's span: first and last sequence numbers, writes, joins and leaves, nodes.
    Summary,
    /// A page's contents at a point of the order (after the write with that sequence number).
    State {
        /// The page.
        #[arg(long)]
        page: u64,
        /// The point [default: the end of the capture].
        #[arg(long)]
        at: Option<u64>,
        /// Write the page's 8192 bytes to standard output instead of a dump.
        #[arg(long, conflicts_with = "json")]
        raw: bool,
    },
    /// Every write to the 8-byte word holding ADDR, with the word after it.
    WhoWrote {
        /// A byte address, PAGE:OFFSET, or region:KEY:OFFSET (a region of imcd's directory).
        addr: String,
        /// Only writes with sequence numbers from A to B.
        #[arg(long, num_args = 2, value_names = ["A", "B"])]
        between: Option<Vec<u64>>,
    },
    /// The words that differ between two points, with their last writer in between.
    Diff {
        /// The earlier point.
        #[arg(long)]
        from: u64,
        /// The later point.
        #[arg(long)]
        to: u64,
    },
    /// The regions and lock sets imcd's directory held during the capture.
    ///
    /// Each with its key, pages and holders, and from and to which write.
    Regions {
        /// Only the one with this key (decimal or 0x hex).
        #[arg(long)]
        key: Option<String>,
    },
    /// A node's writes, joins and leaves.
    Timeline {
        /// The node.
        #[arg(long)]
        node: u16,
    },
}

/// A number in decimal or 0x hex.
fn number(s: &str) -> Result<u64> {
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.with_context(|| format!("{s:?} is not a number (decimal or 0x hex)"))
}

/// A byte address, PAGE:OFFSET, or region:KEY:OFFSET (the region with
/// that key in imcd's directory during the capture; the last one if the
/// key was allocated more than once).
fn address(h: &History, s: &str) -> Result<u64> {
    if let Some(rest) = s.strip_prefix("region:") {
        let (k, o) = rest.split_once(':').with_context(|| format!("{s}: expected region:KEY:OFFSET"))?;
        let (key, off) = (number(k)?, number(o)?);
        let r = h
            .regions()
            .into_iter()
            .rev()
            .find(|r| r.entry.key == key)
            .with_context(|| format!("no region with key {key:#x} in imcd's directory during this capture"))?;
        if off >= r.entry.pages * PAGE_SIZE {
            bail!("offset {off:#x} is past the end of region {key:#x} ({} pages)", r.entry.pages);
        }
        return Ok(r.entry.first_page * PAGE_SIZE + off);
    }
    match s.split_once(':') {
        Some((p, o)) => {
            let (p, o) = (number(p)?, number(o)?);
            if o >= PAGE_SIZE {
                bail!("offset {o:#x} is past the end of a {PAGE_SIZE}-byte page");
            }
            p.checked_mul(PAGE_SIZE).and_then(|a| a.checked_add(o)).with_context(|| format!("{s}: out of range"))
        }
        None => number(s),
    }
}

fn word(b: [u8; 8]) -> String {
    format!("{:#018x}", u64::from_le_bytes(b))
}

fn to(dest: Option<u16>) -> String {
    dest.map_or_else(|| "all".to_string(), |d| d.to_string())
}

fn where_(addr: u64) -> String {
    format!("page {} +{:#x}", addr / PAGE_SIZE, addr % PAGE_SIZE)
}

/// One event as text and as JSON.
fn event(h: &History, e: &Event) -> (String, serde_json::Value) {
    match &e.what {
        What::Write { src, dest, flags, addr, .. } => {
            let d = h.data(e);
            let head: String = d.iter().take(16).map(|b| format!("{b:02x}")).collect();
            (
                format!("seq {:<8} write {src} -> {:<3} {} len {} {head}", e.seq, to(*dest), where_(*addr), d.len()),
                json!({"seq": e.seq, "kind": "write", "node": src, "dest": dest, "flags": flags, "addr": addr,
                       "page": addr / PAGE_SIZE, "offset": addr % PAGE_SIZE, "len": d.len(), "data": head}),
            )
        }
        What::Member { node, up } => (
            format!("seq {:<8} node {node} {}", e.seq, if *up { "joined" } else { "left" }),
            json!({"seq": e.seq, "kind": "member", "node": node, "up": up}),
        ),
    }
}

fn run(a: &Args) -> Result<()> {
    let h = History::read(&a.file)?;
    if let Some(w) = &h.warning {
        eprintln!("mc-trace: {w}");
    }
    let out = std::io::stdout();
    let mut out = out.lock();
    let mut line = |text: String, j: serde_json::Value| -> std::io::Result<()> {
        if a.json {
            writeln!(out, "{j}")
        } else {
            writeln!(out, "{text}")
        }
    };
    match &a.cmd {
        Cmd::Summary => {
            let mut nodes = std::collections::BTreeSet::new();
            let (mut writes, mut joins, mut leaves, mut bytes) = (0u64, 0u64, 0u64, 0u64);
            for e in h.events() {
                match e.what {
                    What::Write { src, .. } => {
                        writes += 1;
                        bytes += h.data(e).len() as u64;
                        nodes.insert(src);
                    }
                    What::Member { node, up } => {
                        nodes.insert(node);
                        if up {
                            joins += 1
                        } else {
                            leaves += 1
                        }
                    }
                }
            }
            let (first, last) = h.span().unzip();
            line(
                format!(
                    "sequence {} to {}: {writes} writes ({bytes} bytes), {joins} joins, {leaves} leaves; nodes {:?}",
                    first.map_or_else(|| "-".into(), |v| v.to_string()),
                    last.map_or_else(|| "-".into(), |v| v.to_string()),
                    nodes
                ),
                json!({"first": first, "last": last, "writes": writes, "bytes": bytes, "joins": joins,
                       "leaves": leaves, "nodes": nodes}),
            )?;
        }
        Cmd::State { page, at, raw } => {
            let at = at.or(h.span().map(|s| s.1)).unwrap_or(0);
            let p = h.page_at(*page, at);
            if *raw {
                out.write_all(&p)?;
                return Ok(());
            }
            let written = h.who_wrote_page(*page, at);
            line(
                format!("page {page} at seq {at}, after {written} write(s) to it; its nonzero 16-byte lines (the rest is zero):"),
                json!({"page": page, "at": at, "writes": written}),
            )?;
            for (i, chunk) in p.chunks(16).enumerate() {
                if chunk.iter().all(|&b| b == 0) {
                    continue;
                }
                let hex: Vec<String> = chunk.iter().map(|b| format!("{b:02x}")).collect();
                let text: String =
                    chunk.iter().map(|&b| if b.is_ascii_graphic() || b == b' ' { b as char } else { '.' }).collect();
                line(
                    format!("  +{:#06x}  {}  |{text}|", i * 16, hex.join(" ")),
                    json!({"offset": i * 16, "bytes": hex.concat()}),
                )?;
            }
        }
        Cmd::WhoWrote { addr, between } => {
            let addr = address(&h, addr)?;
            let (from, until) = match between.as_deref() {
                Some([a, b]) => (*a, *b),
                _ => (0, u64::MAX),
            };
            let ws = h.who_wrote(addr, from, until)?;
            if ws.is_empty() && !a.json {
                line(format!("nobody wrote the word at {addr:#x} ({})", where_(addr & !7)), json!({}))?;
            }
            for w in ws {
                line(
                    format!(
                        "seq {:<8} node {} -> {:<3} wrote {} bytes at {:#x}; word {:#x} ({}) is then {}",
                        w.seq,
                        w.src,
                        to(w.dest),
                        w.len,
                        w.addr,
                        addr & !7,
                        where_(addr & !7),
                        word(w.word_after)
                    ),
                    json!({"seq": w.seq, "node": w.src, "dest": w.dest, "addr": w.addr, "len": w.len,
                           "word": addr & !7, "after": word(w.word_after)}),
                )?;
            }
        }
        Cmd::Diff { from, to: until } => {
            let changes = h.diff(*from, *until)?;
            if changes.is_empty() && !a.json {
                line(format!("nothing changed between seq {from} and seq {until}"), json!({}))?;
            }
            for c in changes {
                line(
                    format!(
                        "{:#010x} ({}): {} -> {}  last by node {} at seq {}",
                        c.addr,
                        where_(c.addr),
                        word(c.before),
                        word(c.after),
                        c.last.1,
                        c.last.0
                    ),
                    json!({"addr": c.addr, "page": c.addr / PAGE_SIZE, "offset": c.addr % PAGE_SIZE,
                           "before": word(c.before), "after": word(c.after), "seq": c.last.0, "node": c.last.1}),
                )?;
            }
        }
        Cmd::Regions { key } => {
            let key = key.as_deref().map(number).transpose()?;
            let spans: Vec<_> = h.regions().into_iter().filter(|r| key.is_none_or(|k| r.entry.key == k)).collect();
            if spans.is_empty() && !a.json {
                line("no region was written into imcd's directory during this capture".into(), json!({}))?;
            }
            for r in spans {
                let d = r.entry;
                let lock = d.key & imc_proto::layout::LOCK_KEY != 0;
                let key = if lock { d.key & !imc_proto::layout::LOCK_KEY } else { d.key };
                let holders: Vec<String> =
                    (0..64).filter(|i| r.hosts & (1 << i) != 0).map(|i: u64| i.to_string()).collect();
                let until = r.to.map_or_else(|| "the end".to_string(), |t| format!("seq {t}"));
                line(
                    format!(
                        "entry {:<3} {} key {key:#x} pages {}..{} held by {} from seq {} to {until}",
                        d.entry,
                        if lock { "lock set" } else { "region  " },
                        d.first_page,
                        d.first_page + d.pages.max(1) - 1,
                        holders.join(","),
                        r.from
                    ),
                    json!({"entry": d.entry, "lock_set": lock, "key": key, "first_page": d.first_page, "pages": d.pages,
                           "hosts": r.hosts, "from": r.from, "to": r.to}),
                )?;
            }
        }
        Cmd::Timeline { node } => {
            let t = h.timeline(*node);
            if t.is_empty() && !a.json {
                line(format!("node {node} neither wrote, joined nor left in this capture"), json!({}))?;
            }
            for e in t {
                let (text, j) = event(&h, e);
                line(text, j)?;
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let a = Args::parse();
    match run(&a) {
        Ok(()) => ExitCode::SUCCESS,
        // A closed pipe (`| head`) ends quietly.
        Err(e) if e.downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) => {
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("mc-trace: {e:#}");
            ExitCode::FAILURE
        }
    }
}
