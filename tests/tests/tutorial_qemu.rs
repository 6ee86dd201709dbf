//! QEMU tier: the lab course (`docs/tutorial/`) run as written. Every line
//! of a ```console block that starts with `$ ` is run, in order across the
//! chapters, in a fresh `bash` in the repository's root with
//! `target/release` on PATH; the lines under it are what the text says the
//! student sees, and each must appear in the command's output. A chapter
//! that goes stale fails here.

use std::path::Path;
use std::process::Command;

use tests::{root, serial};

/// One command of the course and what the text says it prints.
struct Step {
    chapter: String,
    command: String,
    expect: Vec<String>,
}

/// The steps of one chapter's text.
fn steps(chapter: &str, text: &str) -> Vec<Step> {
    let mut out: Vec<Step> = Vec::new();
    let mut in_block = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block && line.trim() == "```console";
            continue;
        }
        if !in_block {
            continue;
        }
        if let Some(cmd) = line.strip_prefix("$ ") {
            out.push(Step { chapter: chapter.into(), command: cmd.into(), expect: Vec::new() });
        } else if !line.trim().is_empty() {
            let last = out.last_mut().unwrap_or_else(|| panic!("{chapter}: output before any command: {line:?}"));
            last.expect.push(line.trim().to_string());
        }
    }
    out
}

/// Takes the course's clusters down (before, and after even a failure).
struct Down;

impl Drop for Down {
    fn drop(&mut self) {
        let bin = root().join("target/release/mc-cluster");
        let _ = Command::new("pkill").args(["-f", "name lab monitor"]).status();
        for name in ["lab", "lab-raw"] {
            let _ = Command::new(&bin).args(["--name", name, "down"]).output();
        }
    }
}

#[test]
fn the_steps_are_found() {
    let text = "intro\n```console\n$ echo a\na\n\n$ true\n```\n```sh\n$ not run\n```\n";
    let s = steps("x", text);
    assert_eq!(s.len(), 2);
    assert_eq!((s[0].command.as_str(), s[0].expect.as_slice()), ("echo a", &["a".to_string()][..]));
    assert!(s[1].expect.is_empty());
}

#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn the_tutorial_runs_as_written() {
    let _serial = serial();
    let dir = root().join("docs/tutorial");
    let mut chapters: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md") && n != "README.md")
        .collect();
    chapters.sort();
    assert!(chapters.len() >= 6, "{chapters:?}");
    let all: Vec<Step> =
        chapters.iter().flat_map(|c| steps(c, &std::fs::read_to_string(dir.join(c)).unwrap())).collect();
    assert!(all.len() >= 20, "{} steps", all.len());
    drop(Down);
    let _down = Down;
    let bin = root().join("target/release");
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    for s in &all {
        let out = Command::new("timeout")
            .args(["300", "bash", "-c", &format!("{} 2>&1", s.command)])
            .current_dir(root())
            .env("PATH", &path)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{}: `{}` failed ({}):\n{text}", s.chapter, s.command, out.status);
        for e in &s.expect {
            assert!(
                text.contains(e.as_str()),
                "{}: `{}` should print {e:?}; it printed:\n{text}",
                s.chapter,
                s.command
            );
        }
    }
    assert!(Path::new("/tmp/fig6.pcap").exists());
}
