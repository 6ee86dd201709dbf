//! `bbp-dd-plot`: the table and the SVG figures of `scripts/bbp-dd-bench.sh`,
//! from the `BENCH SERIES X VALUE UNIT` lines that `bbp-tool bench`,
//! `dd-tool bench` and the script (for UMP and MPI) print. It prints one
//! table of the figures the goals and the papers name, with the
//! papers' numbers beside, and the goal ratios; and it writes
//! - `bbp-latency.svg`: BBP one-way time by size, with UMP and MPI (the
//!   Billboard paper's Figure 1);
//! - `bbp-broadcast.svg`: point-to-point against a broadcast to 4 nodes
//!   (its Figure 4);
//! - `bbp-barrier.svg`: the barrier by node count (its Figure 6);
//! - `dd-latency.svg` and `dd-bandwidth.svg`: Direct Deposit by stores and
//!   by DMA, with UMP and the DMA engine's own rate (Avalanche's Figure 1).
//!
//! A figure none of whose own series was measured is left out and named.
//! Single-threaded; reads and writes files only.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::Parser;
use testkit::plot::{svg, Series};

#[derive(Parser)]
#[command(
    about = "Draws the BBP and Direct Deposit benchmark's figures from BENCH lines",
    after_help = "Example:\n  bbp-dd-plot --out bench-out/bbp-dd --note \"4 TCG guests\" bench-out/bbp-dd/*.txt"
)]
struct Args {
    /// Folder the SVG files go to.
    #[arg(long)]
    out: PathBuf,
    /// What the figures were measured on, added to every title.
    #[arg(long, default_value = "")]
    note: String,
    /// Files holding `BENCH SERIES X VALUE UNIT` lines (other lines are skipped).
    #[arg(required = true)]
    files: Vec<PathBuf>,
}

/// Every series the benchmark prints: (name, unit, legend).
const SERIES: [(&str, &str, &str); 12] = [
    ("bbp-oneway", "us", "BBP"),
    ("bbp-p2p", "us", "BBP point-to-point"),
    ("bbp-bcast4", "us", "BBP broadcast to 4 nodes"),
    ("bbp-barrier", "us", "BBP barrier"),
    ("dd-stores-oneway", "us", "DD by stores"),
    ("dd-dma-oneway", "us", "DD by DMA"),
    ("dd-stores-bw", "MB/s", "DD by stores"),
    ("dd-dma-bw", "MB/s", "DD by DMA"),
    ("dma-engine-bw", "MB/s", "the DMA engine alone"),
    ("ump-oneway", "us", "UMP"),
    ("mpi-oneway", "us", "our MPI"),
    ("ump-bw", "MB/s", "UMP"),
];

/// One figure: file, title, paper's figure, axes, series.
struct Figure {
    file: &'static str,
    title: &'static str,
    paper: &'static str,
    x: &'static str,
    y: &'static str,
    series: &'static [&'static str],
    /// How many of `series`, from the first, are the figure's own (the
    /// rest are references, drawn only beside one of them).
    own: usize,
}

const FIGURES: [Figure; 5] = [
    Figure {
        file: "bbp-latency.svg",
        title: "BBP one-way time",
        paper: "paper: BBP 7.8 us at 4 bytes",
        x: "message size (bytes)",
        y: "one-way time (us)",
        series: &["bbp-oneway", "ump-oneway", "mpi-oneway"],
        own: 1,
    },
    Figure {
        file: "bbp-broadcast.svg",
        title: "BBP point-to-point and broadcast to 4 nodes",
        paper: "paper: 10.1 us for a 4-node broadcast",
        x: "message size (bytes)",
        y: "time (us)",
        series: &["bbp-p2p", "bbp-bcast4"],
        own: 2,
    },
    Figure {
        file: "bbp-barrier.svg",
        title: "BBP barrier",
        paper: "paper: 37 us on 4 nodes",
        x: "nodes",
        y: "time per barrier (us)",
        series: &["bbp-barrier"],
        own: 1,
    },
    Figure {
        file: "dd-latency.svg",
        title: "Direct Deposit one-way time",
        paper: "paper: about 3.5 us",
        x: "message size (bytes)",
        y: "one-way time (us)",
        series: &["dd-stores-oneway", "dd-dma-oneway", "ump-oneway"],
        own: 2,
    },
    Figure {
        file: "dd-bandwidth.svg",
        title: "Direct Deposit bandwidth",
        paper: "Avalanche's Figure 1",
        x: "message size (bytes)",
        y: "MB/s",
        series: &["dd-stores-bw", "dd-dma-bw", "dma-engine-bw", "ump-bw"],
        own: 2,
    },
];

/// Measurements by series: x -> value (a later line for the same x wins).
type Figures = BTreeMap<String, BTreeMap<u64, f64>>;

/// The `BENCH` lines of one file, added to `into`.
fn parse(text: &str, file: &Path, into: &mut Figures) -> Result<()> {
    for (i, line) in text.lines().enumerate() {
        let w: Vec<&str> = line.split_whitespace().collect();
        if w.first() != Some(&"BENCH") {
            continue;
        }
        let at = || format!("{}:{}", file.display(), i + 1);
        let [_, name, x, v, unit] = w[..] else {
            bail!("{}: not a BENCH line (BENCH SERIES X VALUE UNIT): {line:?}", at());
        };
        let Some(&(_, want, _)) = SERIES.iter().find(|s| s.0 == name) else {
            let known: Vec<&str> = SERIES.iter().map(|s| s.0).collect();
            bail!("{}: unknown series {name:?} (known: {})", at(), known.join(", "));
        };
        if unit != want {
            bail!("{}: series {name} is in {want}, not {unit:?}", at());
        }
        let (Ok(x), Ok(v)) = (x.parse::<u64>(), v.parse::<f64>()) else {
            bail!("{}: X must be a whole number and VALUE a number: {line:?}", at());
        };
        if !v.is_finite() || v < 0.0 {
            bail!("{}: VALUE {v} is not a measurement", at());
        }
        into.entry(name.to_string()).or_default().insert(x, v);
    }
    Ok(())
}

fn read_all(files: &[PathBuf]) -> Result<Figures> {
    let mut all = Figures::new();
    for f in files {
        let text = std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        parse(&text, f, &mut all)?;
    }
    if all.is_empty() {
        bail!("no BENCH lines in {} file(s): did the benchmark run?", files.len());
    }
    Ok(all)
}

/// The value of `series` at `x`, or at its smallest x when `x` is None.
fn at(all: &Figures, series: &str, x: Option<u64>) -> Option<(u64, f64)> {
    let s = all.get(series)?;
    match x {
        Some(x) => s.get(&x).map(|&v| (x, v)),
        None => s.iter().next().map(|(&x, &v)| (x, v)),
    }
}

/// The table: the figures the papers and the goals name, then the ratios.
fn table(all: &Figures) -> String {
    let mut t = String::new();
    let cell = |s: &str, x: Option<u64>| match at(all, s, x) {
        Some((x, v)) => format!("{v:>10.1} at {x}"),
        None => format!("{:>10}", "-"),
    };
    /// (label, series, at which x or the smallest, the paper's figure)
    type Row = (&'static str, &'static str, Option<u64>, &'static str);
    let rows: [Row; 10] = [
        ("BBP one way, us (bytes)", "bbp-oneway", Some(4), "7.8 us (SCRAMNet, 4 bytes)"),
        ("BBP point-to-point, us", "bbp-p2p", None, ""),
        ("BBP broadcast to 4 nodes, us", "bbp-bcast4", None, "10.1 us"),
        ("BBP barrier, us (nodes)", "bbp-barrier", Some(4), "37 us on 4 nodes"),
        ("DD by stores one way, us", "dd-stores-oneway", None, "about 3.5 us (Avalanche)"),
        ("DD by DMA one way, us", "dd-dma-oneway", None, ""),
        ("DD by DMA, MB/s", "dd-dma-bw", Some(1 << 20), ""),
        ("DMA engine alone, MB/s", "dma-engine-bw", Some(1 << 20), ""),
        ("UMP one way, us", "ump-oneway", Some(8), ""),
        ("our MPI one way, us", "mpi-oneway", Some(8), ""),
    ];
    t.push_str(&format!("{:<32} {:>18}   {}\n", "", "ours", "paper"));
    for (label, s, x, paper) in rows {
        t.push_str(&format!("{label:<32} {:>18}   {paper}\n", cell(s, x)));
    }
    for (s, x) in [("bbp-barrier", 2), ("bbp-barrier", 3)] {
        if let Some((_, v)) = at(all, s, Some(x)) {
            t.push_str(&format!("{:<32} {v:>10.1} at {x}\n", "BBP barrier, us (nodes)"));
        }
    }
    let ratio = |a: Option<(u64, f64)>, b: Option<(u64, f64)>| match (a, b) {
        (Some((_, a)), Some((_, b))) if b > 0.0 => format!("{:.2}", a / b),
        _ => "-".into(),
    };
    let ump8 = at(all, "ump-oneway", Some(8));
    let p2p = at(all, "bbp-p2p", None);
    let bcast = p2p.and_then(|(x, _)| at(all, "bbp-bcast4", Some(x)));
    t.push_str("goals:\n");
    t.push_str(&format!(
        "  BBP 4-byte one way / UMP 8-byte one way     {:>6}  (goal <= 1)\n",
        ratio(at(all, "bbp-oneway", Some(4)), ump8)
    ));
    t.push_str(&format!("  BBP broadcast to 4 / BBP point-to-point     {:>6}  (goal <= 1.3)\n", ratio(bcast, p2p)));
    t.push_str(&format!(
        "  DD smallest one way / UMP 8-byte one way    {:>6}  (goal <= 1)\n",
        ratio(at(all, "dd-stores-oneway", None), ump8)
    ));
    t.push_str(&format!(
        "  DD by DMA / the DMA engine alone, 1 MiB     {:>6}  (goal >= 0.8)\n",
        ratio(at(all, "dd-dma-bw", Some(1 << 20)), at(all, "dma-engine-bw", Some(1 << 20)))
    ));
    t
}

/// SVG documents by file name.
type Drawn = Vec<(String, String)>;

/// The figures as (file name, SVG document), and the names of those left out.
fn figures(all: &Figures, note: &str) -> Result<(Drawn, Vec<&'static str>)> {
    let note = if note.is_empty() { String::new() } else { format!(" ({note})") };
    let (mut out, mut missing) = (Vec::new(), Vec::new());
    for f in &FIGURES {
        let series: Vec<Series> = f
            .series
            .iter()
            .filter_map(|&s| {
                let pts = all.get(s)?;
                let legend = SERIES.iter().find(|d| d.0 == s).map_or(s, |d| d.2);
                Some(Series { name: legend.into(), points: pts.iter().map(|(&x, &v)| (x as f64, v)).collect() })
            })
            .collect();
        if !f.series[..f.own].iter().any(|s| all.contains_key(*s)) {
            missing.push(f.file);
            continue;
        }
        let title = format!("{}{note}; {}", f.title, f.paper);
        out.push((f.file.to_string(), svg(&title, f.x, f.y, &series).with_context(|| f.file)?));
    }
    Ok((out, missing))
}

fn main() -> ExitCode {
    let a = Args::parse();
    let run = || -> Result<()> {
        let all = read_all(&a.files)?;
        print!("{}", table(&all));
        std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
        let (figs, missing) = figures(&all, &a.note)?;
        let mut written = Vec::new();
        for (name, doc) in figs {
            let p = a.out.join(name);
            std::fs::write(&p, doc).with_context(|| format!("writing {}", p.display()))?;
            written.push(p.display().to_string());
        }
        println!("plots: {}", written.join(" "));
        if !missing.is_empty() {
            println!("not drawn (nothing measured): {}", missing.join(" "));
        }
        Ok(())
    };
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bbp-dd-plot: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RUN: &str = "progress on stderr is not here\n\
        BENCH bbp-oneway 4 20.0 us\nBENCH bbp-oneway 4096 60.0 us\n\
        BENCH bbp-p2p 4 22.0 us\nBENCH bbp-bcast4 4 26.4 us\n\
        BENCH bbp-barrier 2 50 us\nBENCH bbp-barrier 4 90 us\n\
        BENCH ump-oneway 8 40.0 us\n\
        BENCH dd-dma-bw 1048576 90 MB/s\nBENCH dma-engine-bw 1048576 100 MB/s\n";

    fn parsed(text: &str) -> Result<Figures> {
        let mut all = Figures::new();
        parse(text, Path::new("run.txt"), &mut all)?;
        Ok(all)
    }

    #[test]
    fn bench_lines_become_the_table_and_the_figures() {
        let all = parsed(RUN).unwrap();
        assert_eq!(all["bbp-oneway"], BTreeMap::from([(4, 20.0), (4096, 60.0)]));
        let t = table(&all);
        // 20 / 40, 26.4 / 22, 90 / 100; DD by stores was not measured.
        for want in ["0.50  (goal <= 1)", "1.20  (goal <= 1.3)", "0.90  (goal >= 0.8)", "-  (goal <= 1)"] {
            assert!(t.contains(want), "no {want:?} in\n{t}");
        }
        assert!(t.contains("90.0 at 4") && t.contains("50.0 at 2"), "{t}");
        let (figs, missing) = figures(&all, "4 guests").unwrap();
        let names: Vec<&str> = figs.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["bbp-latency.svg", "bbp-broadcast.svg", "bbp-barrier.svg", "dd-bandwidth.svg"]);
        assert_eq!(missing, ["dd-latency.svg"]);
        let lat = &figs[0].1;
        assert!(lat.contains("BBP") && lat.contains("UMP") && lat.contains("4 guests") && lat.contains("7.8 us"));
        assert!(!lat.contains("our MPI"), "MPI was not measured, so it has no legend");
    }

    #[test]
    fn bad_lines_are_clear_errors() {
        let e = |t: &str| format!("{:#}", parsed(t).unwrap_err());
        assert!(e("BENCH bbp-oneway 4 us\n").contains("run.txt:1: not a BENCH line"));
        assert!(e("x\nBENCH bbp-onewya 4 1 us\n").contains("run.txt:2: unknown series \"bbp-onewya\""));
        assert!(e("BENCH dd-dma-bw 4 1 us\n").contains("is in MB/s"));
        assert!(e("BENCH bbp-oneway four 1 us\n").contains("whole number"));
        assert!(e("BENCH bbp-oneway 4 NaN us\n").contains("not a measurement"));
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("empty.txt");
        std::fs::write(&f, "no figures\n").unwrap();
        assert!(format!("{:#}", read_all(&[f]).unwrap_err()).contains("no BENCH lines in 1 file"));
        let gone = dir.path().join("gone.txt");
        assert!(format!("{:#}", read_all(&[gone]).unwrap_err()).contains("reading"));
    }
}
