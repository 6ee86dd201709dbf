//! The C face of BBP: `bbp.h` agrees with the library's constants, and
//! the C program the QEMU tier runs across guests (`tests/bbp/pingmcast.c`),
//! compiled with gcc against `libbbp.a`, passes as four processes of one
//! host sharing a billboard file (`BBP_SHM`).

use std::path::PathBuf;
use std::process::Command;

use bbp::capi::consts::*;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn header_constants_match_the_library() {
    let text = std::fs::read_to_string(dir().join("include/bbp.h")).unwrap();
    let header: Vec<(String, i64)> = text
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            (w.next()? == "#define").then_some(())?;
            let name = w.next()?;
            let v = w.next()?.trim_matches(|c| c == '(' || c == ')');
            name.starts_with("BBP_").then(|| Some((name.to_string(), v.parse().ok()?)))?
        })
        .collect();
    let rust = [
        ("BBP_OK", BBP_OK),
        ("BBP_ETOOBIG", BBP_ETOOBIG),
        ("BBP_ERANK", BBP_ERANK),
        ("BBP_EINVAL", BBP_EINVAL),
        ("BBP_ETRUNC", BBP_ETRUNC),
        ("BBP_EPEER", BBP_EPEER),
        ("BBP_ESETUP", BBP_ESETUP),
        ("BBP_EAGAIN", BBP_EAGAIN),
        ("BBP_EINIT", BBP_EINIT),
        ("BBP_ANY", BBP_ANY),
        ("BBP_ALL", BBP_ALL),
    ];
    for (name, v) in &rust {
        let h = header.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("{name} missing from bbp.h"));
        assert_eq!(h.1, *v as i64, "{name}");
    }
    for (name, _) in &header {
        assert!(rust.iter().any(|(n, _)| n == name), "bbp.h defines {name}, the library does not");
    }
}

#[test]
fn c_program_as_four_processes_over_a_shared_file() {
    let release = !cfg!(debug_assertions);
    let st = Command::new(env!("CARGO"))
        .args(["build", "-q", "-p", "bbp", "--lib"])
        .args(release.then_some("--release"))
        .current_dir(dir())
        .status()
        .unwrap();
    assert!(st.success());
    let lib = dir().join(if release { "../../../target/release/libbbp.a" } else { "../../../target/debug/libbbp.a" });
    let tmp = tempfile::tempdir().unwrap();
    let exe = tmp.path().join("pingmcast");
    let out = Command::new("gcc")
        .args(["-std=c11", "-Wall", "-Werror", "-O1", "-o"])
        .arg(&exe)
        .arg(dir().join("../../../tests/bbp/pingmcast.c"))
        .arg("-I")
        .arg(dir().join("include"))
        .arg(&lib)
        .args(["-lpthread", "-ldl", "-lm"])
        .output()
        .unwrap();
    assert!(out.status.success(), "gcc:\n{}", String::from_utf8_lossy(&out.stderr));
    let board = tmp.path().join("board");
    let ranks: Vec<_> = (0..4)
        .map(|r| {
            Command::new(&exe)
                .args([r.to_string(), "4".into(), "7".into()])
                .env("BBP_SHM", &board)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for (r, c) in ranks.into_iter().enumerate() {
        let o = c.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "rank {r}: {text}{}", String::from_utf8_lossy(&o.stderr));
        assert!(text.contains(&format!("OK rank {r} of 4")), "{text}");
    }
}
