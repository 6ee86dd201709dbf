//! `mpi-bench-plot`: the SVG figures of `scripts/mpi-bench.sh`, drawn from
//! the files the benchmark keeps: NetPIPE's output files (one line per
//! size: bytes, Mbps, one-way seconds) and `collbench`'s lines
//! (`coll OP BYTES MICROSECONDS ITERATIONS`). It writes
//! - `mpi-latency.svg`: one-way time against size, one line per NetPIPE file;
//! - `mpi-bandwidth.svg`: MB/s against size, the same lines;
//! - `mpi-OP.svg` for every collective with sizes above 0 bytes: time per
//!   call against size, one line per collbench file.
//!
//! The paper's Digital MPI figures (6.9 µs, 61 MB/s on 1996 hardware) are
//! in the point-to-point titles. With `--layer pvm` (`scripts/pvm-bench.sh`)
//! the two point-to-point figures are `pvm-latency.svg` and
//! `pvm-bandwidth.svg`, with Digital PVM's figures (8–11 µs, 43 MB/s; PVM
//! 3.3.9 over FDDI 400 µs) in their titles, after the paper's Figures 11
//! and 12. Single-threaded; reads and writes files only.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::Parser;
use testkit::plot::{svg, Series};

#[derive(Parser)]
#[command(about = "Draws the MPI benchmark's SVG figures from NetPIPE and collbench output files")]
struct Args {
    /// Folder the SVG files go to.
    #[arg(long)]
    out: PathBuf,
    /// A NetPIPE output file and its legend: "LABEL=FILE" (repeat).
    #[arg(long = "np", value_name = "LABEL=FILE")]
    np: Vec<String>,
    /// A collbench output and its legend: "LABEL=FILE" (repeat).
    #[arg(long = "coll", value_name = "LABEL=FILE")]
    coll: Vec<String>,
    /// What the figures were measured on, added to every title.
    #[arg(long, default_value = "")]
    note: String,
    /// Whose figures: MPI's (mpi-*.svg) or PVM's (pvm-*.svg).
    #[arg(long, value_enum, default_value_t = Layer::Mpi)]
    layer: Layer,
}

/// The message-passing layer the figures are of.
#[derive(Clone, Copy, clap::ValueEnum)]
enum Layer {
    Mpi,
    Pvm,
}

impl Layer {
    /// The point-to-point figures' file names and titles (before the note
    /// and the paper's figures).
    fn point_to_point(self) -> [(&'static str, &'static str, &'static str); 2] {
        match self {
            Layer::Mpi => [
                ("mpi-latency.svg", "MPI one-way time, NetPIPE", "paper: Digital MPI 6.9 us"),
                ("mpi-bandwidth.svg", "MPI bandwidth, NetPIPE", "paper: Digital MPI 61 MB/s"),
            ],
            Layer::Pvm => [
                (
                    "pvm-latency.svg",
                    "PVM one-way time, ping-pong medians",
                    "paper: Digital PVM 8-11 us, PVM 3.3.9 400 us",
                ),
                ("pvm-bandwidth.svg", "PVM bandwidth, ping-pong medians", "paper: Digital PVM 43 MB/s"),
            ],
        }
    }
}

/// "LABEL=FILE" split in two.
fn labelled(arg: &str) -> Result<(String, PathBuf)> {
    match arg.split_once('=') {
        Some((l, f)) if !l.is_empty() && !f.is_empty() => Ok((l.to_string(), PathBuf::from(f))),
        _ => bail!("{arg:?}: expected LABEL=FILE"),
    }
}

/// NetPIPE's output: (bytes, MB/s, one-way µs) per line.
fn netpipe(text: &str, file: &Path) -> Result<Vec<(f64, f64, f64)>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let v: Vec<f64> = line.split_whitespace().map(str::parse).collect::<Result<_, _>>().map_err(|_| {
            anyhow::anyhow!("{}:{}: not a NetPIPE line (bytes Mbps seconds): {line:?}", file.display(), i + 1)
        })?;
        if v.len() < 3 {
            bail!("{}:{}: not a NetPIPE line (bytes Mbps seconds): {line:?}", file.display(), i + 1);
        }
        out.push((v[0], v[1] / 8.0, v[2] * 1e6));
    }
    if out.is_empty() {
        bail!("{}: no measurements", file.display());
    }
    Ok(out)
}

/// collbench's `coll OP BYTES US ITERS` lines: per op, (bytes, µs).
fn collbench(text: &str, file: &Path) -> Result<BTreeMap<String, Vec<(f64, f64)>>> {
    let mut ops: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let w: Vec<&str> = line.split_whitespace().collect();
        if w.first() != Some(&"coll") {
            continue;
        }
        let parsed = (w.len() >= 4).then(|| Some((w[2].parse::<f64>().ok()?, w[3].parse::<f64>().ok()?))).flatten();
        let Some(p) = parsed else {
            bail!("{}:{}: not a collbench line (coll OP BYTES US ITERS): {line:?}", file.display(), i + 1);
        };
        ops.entry(w[1].to_string()).or_default().push(p);
    }
    if ops.is_empty() {
        bail!("{}: no \"coll\" lines (did collbench run?)", file.display());
    }
    Ok(ops)
}

fn read(f: &Path) -> Result<String> {
    std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))
}

/// The figures as (file name, SVG document).
fn figures(a: &Args) -> Result<Vec<(String, String)>> {
    if a.np.is_empty() && a.coll.is_empty() {
        bail!("nothing to draw: give --np LABEL=FILE and/or --coll LABEL=FILE");
    }
    let note = if a.note.is_empty() { String::new() } else { format!(" ({})", a.note) };
    let mut out = Vec::new();
    let mut lat = Vec::new();
    let mut bw = Vec::new();
    for arg in &a.np {
        let (label, f) = labelled(arg)?;
        let pts = netpipe(&read(&f)?, &f)?;
        lat.push(Series { name: label.clone(), points: pts.iter().map(|&(b, _, us)| (b, us)).collect() });
        bw.push(Series { name: label, points: pts.iter().map(|&(b, mbs, _)| (b, mbs)).collect() });
    }
    if !lat.is_empty() {
        let [(lname, ltitle, lpaper), (bname, btitle, bpaper)] = a.layer.point_to_point();
        let t = format!("{ltitle}{note}; {lpaper}");
        out.push((lname.into(), svg(&t, "message size (bytes)", "one-way time (us)", &lat)?));
        let t = format!("{btitle}{note}; {bpaper}");
        out.push((bname.into(), svg(&t, "message size (bytes)", "MB/s", &bw)?));
    }
    let mut per_op: BTreeMap<String, Vec<Series>> = BTreeMap::new();
    for arg in &a.coll {
        let (label, f) = labelled(arg)?;
        for (op, pts) in collbench(&read(&f)?, &f)? {
            per_op.entry(op).or_default().push(Series { name: label.clone(), points: pts });
        }
    }
    for (op, series) in per_op {
        // A barrier has no size: it is in the benchmark's table only.
        if series.iter().all(|s| s.points.iter().all(|p| p.0 <= 0.0)) {
            continue;
        }
        let t = format!("MPI_{}{}{note}", op[..1].to_uppercase(), &op[1..]);
        out.push((format!("mpi-{op}.svg"), svg(&t, "message size (bytes)", "time per call (us)", &series)?));
    }
    Ok(out)
}

fn main() -> ExitCode {
    let a = Args::parse();
    let run = || -> Result<()> {
        std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
        let mut written = Vec::new();
        for (name, doc) in figures(&a)? {
            let p = a.out.join(name);
            std::fs::write(&p, doc).with_context(|| format!("writing {}", p.display()))?;
            written.push(p.display().to_string());
        }
        println!("plots: {}", written.join(" "));
        Ok(())
    };
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mpi-bench-plot: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(dir: &Path, np: &[(&str, &str)], coll: &[(&str, &str)]) -> Args {
        let put = |(label, text): &(&str, &str), i: usize, kind: &str| {
            let f = dir.join(format!("{kind}{i}"));
            std::fs::write(&f, text).unwrap();
            format!("{label}={}", f.display())
        };
        Args {
            out: dir.to_path_buf(),
            np: np.iter().enumerate().map(|(i, x)| put(x, i, "np")).collect(),
            coll: coll.iter().enumerate().map(|(i, x)| put(x, i, "coll")).collect(),
            note: "2 guests".into(),
            layer: Layer::Mpi,
        }
    }

    const NP: &str = "       1 0.001593   0.00478913\n    1024 1.5   0.005\n 1048576 80.0   0.1\n";
    const COLL: &str = "collbench on 4 ranks\ncoll barrier 0 46761.00 20\ncoll bcast 8 18214.00 40\n\
                        coll bcast 1024 20000.00 40\ncollbench ok 4\n";

    #[test]
    fn netpipe_and_collbench_files_become_figures() {
        let dir = tempfile::tempdir().unwrap();
        let a = args(dir.path(), &[("ours", NP), ("MPICH", NP)], &[("ours", COLL), ("MPICH", COLL)]);
        let figs = figures(&a).unwrap();
        let names: Vec<&str> = figs.iter().map(|(n, _)| n.as_str()).collect();
        // No barrier figure: it has no size above 0.
        assert_eq!(names, ["mpi-latency.svg", "mpi-bandwidth.svg", "mpi-bcast.svg"]);
        for (name, doc) in &figs {
            let texts: Vec<&str> = doc
                .split("<text")
                .skip(1)
                .filter_map(|t| t.split('>').nth(1)?.split('<').next())
                .map(str::trim)
                .collect();
            assert!(doc.starts_with("<svg"), "{name}");
            for want in ["ours", "MPICH"] {
                assert!(texts.contains(&want), "{name}: no legend {want:?} in {texts:?}");
            }
            assert!(texts.iter().any(|t| t.contains("2 guests")), "{name}: the note is in the title: {texts:?}");
        }
        // NetPIPE's seconds are one-way µs on the latency figure: 4789 µs
        // at 1 byte lies between the 1000 and 10000 ticks.
        assert_eq!(netpipe(NP, Path::new("x")).unwrap()[0], (1.0, 0.001593 / 8.0, 4789.13));
        assert_eq!(collbench(COLL, Path::new("x")).unwrap()["bcast"], vec![(8.0, 18214.0), (1024.0, 20000.0)]);
    }

    #[test]
    fn the_pvm_layer_has_its_own_files_and_titles() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = args(dir.path(), &[("ours", NP), ("Debian PVM", NP)], &[]);
        a.layer = Layer::Pvm;
        let figs = figures(&a).unwrap();
        let names: Vec<&str> = figs.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["pvm-latency.svg", "pvm-bandwidth.svg"]);
        assert!(figs[0].1.contains("PVM one-way time") && figs[0].1.contains("Digital PVM 8-11 us"), "{}", figs[0].1);
        assert!(figs[1].1.contains("Digital PVM 43 MB/s") && figs[1].1.contains("Debian PVM"), "{}", figs[1].1);
    }

    #[test]
    fn bad_input_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let e = |a: Args| format!("{:#}", figures(&a).unwrap_err());
        assert!(e(args(dir.path(), &[], &[])).contains("nothing to draw"));
        assert!(e(args(dir.path(), &[("x", "1 2 oops\n")], &[])).contains(":1: not a NetPIPE line"));
        assert!(e(args(dir.path(), &[("x", "")], &[])).contains("no measurements"));
        assert!(e(args(dir.path(), &[], &[("x", "hello\n")])).contains("no \"coll\" lines"));
        assert!(e(args(dir.path(), &[], &[("x", "coll bcast eight 1 1\n")])).contains(":1: not a collbench line"));
        let mut a = args(dir.path(), &[], &[]);
        a.np = vec!["no-label".into()];
        assert!(e(a).contains("expected LABEL=FILE"));
        let mut a = args(dir.path(), &[], &[]);
        a.np = vec![format!("x={}", dir.path().join("missing").display())];
        assert!(e(a).contains("reading"));
    }
}
