//! The README and docs/*.md kept true: every repository path they write in
//! backticks exists, every `mc-cluster`, `mc-hub`, `mc-adapter`,
//! `mc-trace`, `mctool`, `ump-tool`, `imc-bench` and `mpiexec` command line
//! they show names a subcommand and flags that binary has, and every
//! `IMC_*`, `UMP_*` and `MPI_*` name they use is in our headers (or is a
//! setting the code reads). A doc that names something removed fails here.

use std::collections::{BTreeSet, HashMap};
use std::process::Command;

use tests::{host_bin, root};

/// The README and every doc, as (name, text).
fn docs() -> Vec<(String, String)> {
    let r = root();
    let mut v = vec![("README.md".to_string(), std::fs::read_to_string(r.join("README.md")).unwrap())];
    let mut names: Vec<_> = std::fs::read_dir(r.join("docs"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .collect();
    names.sort();
    for n in names {
        v.push((format!("docs/{n}"), std::fs::read_to_string(r.join("docs").join(&n)).unwrap()));
    }
    v
}

/// The text between backticks (inline code spans), in each paragraph
/// outside fenced code blocks: a span may wrap onto the next line.
fn spans(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    let mut para = String::new();
    let mut take = |para: &mut String| {
        let parts: Vec<&str> = para.split('`').collect();
        for (i, p) in parts.iter().enumerate() {
            if i % 2 == 1 && i + 1 < parts.len() {
                out.push(p.to_string());
            }
        }
        para.clear();
    };
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            take(&mut para);
        } else if fenced {
            continue;
        } else if line.trim().is_empty() || line.starts_with('|') || line.trim_start().starts_with("- ") {
            // A paragraph, a table row or a list item ends here.
            take(&mut para);
            para.push_str(line);
            para.push(' ');
        } else {
            para.push_str(line);
            para.push(' ');
        }
    }
    take(&mut para);
    out
}

/// Top-level folders of the repository: a span starting with one of them
/// and a slash is a repository path.
const TOP: &[&str] = &[
    "device/",
    "guest/",
    "guest-driver/",
    "hub/",
    "firmware/",
    "tests/",
    "qemu-configs/",
    "protocol/",
    "scripts/",
    "docs/",
    "launcher/",
    "fuzz/",
];

/// The repository path a span names, if it names one: `guest/msg/ump/src/mc.rs`,
/// `scripts/test.sh --fast` (the first word), `docs/mpi.md, "Zero copy"`.
/// Placeholders (`<name>`, `{a,b}`, `*`) are skipped.
fn repo_path(span: &str) -> Option<String> {
    let word = span.split_whitespace().next()?;
    let word = word.trim_end_matches([',', '.', ':', ';', ')']);
    let word = word.split("::").next()?;
    if !TOP.iter().any(|t| word.starts_with(t)) || word.contains(['<', '{', '*', '$', '[']) {
        return None;
    }
    Some(word.to_string())
}

/// Whether `p` is something the tools make (ignored by git: `fuzz/corpus/`).
fn generated(p: &str) -> bool {
    Command::new("git").arg("-C").arg(root()).args(["check-ignore", "-q", p]).status().is_ok_and(|s| s.success())
}

#[test]
fn every_backticked_repository_path_exists() {
    let r = root();
    let mut checked = 0;
    let mut missing = BTreeSet::new();
    for (doc, text) in docs() {
        for s in spans(&text) {
            if let Some(p) = repo_path(&s) {
                checked += 1;
                if !r.join(&p).exists() && !generated(&p) {
                    missing.insert(format!("{doc}: `{p}`"));
                }
            }
        }
    }
    verdict(checked, 100, "paths", missing, "paths named in the docs that do not exist");
}

/// Each test's end: it found at least `least` things to check (else its
/// extraction broke), and no `problems`.
fn verdict(checked: usize, least: usize, what: &str, problems: BTreeSet<String>, heading: &str) {
    assert!(checked >= least, "only {checked} {what} found: the extraction broke");
    assert!(problems.is_empty(), "{heading}:\n{}", Vec::from_iter(problems).join("\n"));
}

/// The binaries whose command lines the docs show: the host's, and the
/// guest tools (whose host builds answer --help the same).
const BINS: &[&str] = &["mc-cluster", "mc-hub", "mc-adapter", "mc-trace", "mctool", "ump-tool", "imc-bench", "mpiexec"];

/// Binaries with MPICH's single-dash options (`mpiexec -n 4 -hosts L`)
/// and no subcommands.
const SINGLE_DASH: &[&str] = &["mpiexec"];

/// Binaries whose first argument, a file, comes before the subcommand
/// (`mc-trace trace.pcap state --page 60`).
const FILE_FIRST: &[&str] = &["mc-trace"];

/// One command line a doc shows: the doc, the binary, its subcommand words
/// and the options given.
struct Line {
    doc: String,
    bin: String,
    subs: Vec<String>,
    flags: Vec<String>,
}

/// The single-dash options at the start of `rest` (an option, maybe its
/// value, the next option...; two words that are not options in a row end
/// them: the program and its arguments).
fn single_dash_flags(rest: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    let mut after_flag = false;
    for w in rest {
        if w.contains(['`', '"', '\'', '[', '(']) {
            break;
        }
        if w.starts_with('-') && w.len() > 1 && *w != "--" {
            out.push(w.to_string());
            after_flag = true;
        } else if after_flag {
            after_flag = false;
        } else {
            break;
        }
    }
    out
}

/// `BIN [SUB] [SUB]` and the options of each command line in the docs
/// (code blocks and spans) that runs one of [`BINS`]; a line may hold more
/// than one (`mc-cluster exec 0 -- mctool info`).
fn command_lines() -> Vec<Line> {
    let mut out = Vec::new();
    for (doc, text) in docs() {
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        lines.extend(spans(&text));
        for line in lines {
            let line = line.split(" # ").next().unwrap_or_default();
            let words: Vec<&str> = line.split_whitespace().collect();
            for (i, w) in words.iter().enumerate() {
                // `sh -c 'ump-tool serve ...'`: the command inside the quotes.
                let w = w.trim_start_matches(['\'', '"']);
                let name = w.rsplit('/').next().unwrap_or(w);
                if !BINS.contains(&name) || !(w == name || w.ends_with(&format!("target/release/{name}"))) {
                    continue;
                }
                if SINGLE_DASH.contains(&name) {
                    let flags = single_dash_flags(&words[i + 1..]);
                    out.push(Line { doc: doc.clone(), bin: name.to_string(), subs: Vec::new(), flags });
                    continue;
                }
                // Global options before the subcommand (--name N).
                let mut j = i + 1;
                let mut flags = Vec::new();
                while j < words.len() && words[j].starts_with("--") && words[j] != "--" {
                    flags.push(words[j].split('=').next().unwrap_or_default().to_string());
                    j += 2;
                }
                if FILE_FIRST.contains(&name) && j < words.len() && !words[j].starts_with('-') {
                    j += 1;
                }
                let mut subs = Vec::new();
                // Subcommands: lowercase words (mc-hub ctl stats); a node
                // number, a path or `--` ends them. A closing quote ends
                // the whole command: it was an argument of another
                // (--mpiexec "mc-cluster mpirun").
                let mut quoted_end = false;
                while j < words.len()
                    && subs.len() < 2
                    && !words[j].starts_with('-')
                    && words[j].trim_end_matches('"').chars().all(|c| c.is_ascii_lowercase() || c == '-')
                {
                    subs.push(words[j].trim_end_matches('"').to_string());
                    quoted_end = words[j].ends_with('"');
                    j += 1;
                    if quoted_end {
                        break;
                    }
                }
                let rest = if quoted_end { &[][..] } else { &words[j.min(words.len())..] };
                let sub_flags: Vec<String> = rest
                    .iter()
                    .take_while(|w| **w != "--" && !w.contains(['`', '"', '\'']))
                    // `[--stride 16]`: an optional flag is a flag too.
                    .map(|w| w.trim_start_matches('['))
                    .filter(|w| w.starts_with("--") && w.len() > 2)
                    .map(|w| w.split('=').next().unwrap_or_default().trim_end_matches([',', '.', ')', ']']).to_string())
                    .collect();
                flags.extend(sub_flags);
                out.push(Line { doc: doc.clone(), bin: name.to_string(), subs, flags });
            }
        }
    }
    out
}

/// `BIN SUBS... --help`, or `None` when that is not a command of BIN;
/// each asked once (`seen` keeps the answers).
fn help(seen: &mut HashMap<(String, Vec<String>), Option<String>>, bin: &str, subs: &[String]) -> Option<String> {
    seen.entry((bin.to_string(), subs.to_vec()))
        .or_insert_with(|| {
            let o = Command::new(host_bin(bin)).args(subs).arg("--help").output().ok()?;
            o.status.success().then(|| String::from_utf8_lossy(&o.stdout).into_owned())
        })
        .clone()
}

/// Whether `help` lists option `flag` in its options (as a word: `--me`
/// is not `--mem`; an example in the help text does not count).
fn lists(help: &str, flag: &str) -> bool {
    help.lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with('-'))
        // The option column ends at two spaces (clap's and mpiexec's layout).
        .flat_map(|l| l.split("  ").next().unwrap_or_default().split([' ', ',', '=', '[', ']']))
        .any(|w| w == flag)
}

#[test]
fn every_documented_command_line_has_its_subcommand_and_flags() {
    let mut seen = HashMap::new();
    let mut checked = HashMap::<String, usize>::new();
    let mut wrong = BTreeSet::new();
    for Line { doc, bin, subs, flags } in command_lines() {
        // The longest prefix of the words that is a command (the rest were
        // arguments: `mc-cluster exec 0`, `mc-hub ctl --control S stats`).
        let mut k = subs.len();
        let text = loop {
            if let Some(t) = help(&mut seen, &bin, &subs[..k]) {
                break t;
            }
            if k == 0 {
                wrong.insert(format!("{doc}: `{bin}` does not answer --help"));
                break String::new();
            }
            k -= 1;
        };
        let top = help(&mut seen, &bin, &[]).unwrap_or_default();
        *checked.entry(bin.clone()).or_default() += 1;
        for f in flags {
            if !lists(&text, &f) && !lists(&top, &f) {
                let cmd = std::iter::once(bin.as_str()).chain(subs[..k].iter().map(String::as_str));
                wrong.insert(format!("{doc}: `{}` has no {f}", Vec::from_iter(cmd).join(" ")));
            }
        }
    }
    // Every binary's command lines were found (else the extraction broke).
    for b in ["mc-cluster", "mc-hub", "mctool", "ump-tool", "mpiexec"] {
        assert!(checked.get(b).is_some_and(|n| *n >= 2), "too few `{b}` command lines found: {checked:?}");
    }
    verdict(checked.values().sum(), 40, "command lines", wrong, "command lines in the docs that the binaries refuse");
}

/// Every identifier of our C headers and of the settings the code reads.
fn known_names() -> BTreeSet<String> {
    let r = root();
    let mut text = String::new();
    for h in ["guest/client/libimc/include/sys/imc.h", "guest/msg/ump/include/ump.h", "guest/msg/mpi/include/mpi.h"] {
        text += &std::fs::read_to_string(r.join(h)).unwrap();
    }
    // Settings (environment variables) are read in the Rust sources.
    let mut stack = vec![r.join("guest")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() && !p.ends_with("target") {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                text += &std::fs::read_to_string(&p).unwrap_or_default();
            }
        }
    }
    idents(&text).into_iter().collect()
}

/// The `IMC_*`, `UMP_*` and `MPI_*` (and `PMPI_*`) identifiers in `text`.
fn idents(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let start = i;
        while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
            i += 1;
        }
        if i > start {
            let w = &text[start..i];
            let prefixed = ["IMC_", "UMP_", "MPI_", "PMPI_"].iter().any(|p| w.starts_with(p) && w.len() > p.len());
            if prefixed && (start == 0 || !(b[start - 1] == b'_' || b[start - 1].is_ascii_alphanumeric())) {
                out.push(w.to_string());
            }
        } else {
            i += 1;
        }
    }
    out
}

#[test]
fn every_imc_ump_and_mpi_name_in_the_docs_is_ours() {
    let known = known_names();
    let mut checked = 0;
    let mut unknown = BTreeSet::new();
    for (doc, text) in docs() {
        for s in spans(&text) {
            for w in idents(&s) {
                checked += 1;
                // `MPI_Win_*`, `MPI_T_*`: families, not names.
                if !known.contains(&w) && !w.ends_with('_') {
                    unknown.insert(format!("{doc}: {w}"));
                }
            }
        }
    }
    verdict(checked, 100, "names", unknown, "names in the docs that no header or setting has");
}
