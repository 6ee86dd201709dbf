//! The C face of UMP: `ump.h` agrees with the library's constants, and a C
//! program (two processes after fork) compiled with gcc against `libump.a`
//! moves messages of every size intact.

use std::path::PathBuf;
use std::process::Command;

use ump::capi::{consts, status};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn header_constants_match_the_library() {
    let text = std::fs::read_to_string(dir().join("include/ump.h")).unwrap();
    let header: Vec<(String, i64)> = text
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            (w.next()? == "#define").then_some(())?;
            let name = w.next()?;
            let v = w.next()?.trim_matches(|c| c == '(' || c == ')');
            name.starts_with("UMP_").then(|| Some((name.to_string(), v.parse().ok()?)))?
        })
        .collect();
    use consts::*;
    use status::*;
    let rust: Vec<(&str, i32)> = vec![
        ("UMP_SUCCESS", UMP_SUCCESS),
        ("UMP_EINIT", UMP_EINIT),
        ("UMP_EINVAL", UMP_EINVAL),
        ("UMP_ECHANNEL", UMP_ECHANNEL),
        ("UMP_ETOOMANY", UMP_ETOOMANY),
        ("UMP_EBUSY", UMP_EBUSY),
        ("UMP_ENOTRANSPORT", UMP_ENOTRANSPORT),
        ("UMP_ECLOSED", UMP_ECLOSED),
        ("UMP_EPEERDEAD", UMP_EPEERDEAD),
        ("UMP_ETOOBIG", UMP_ETOOBIG),
        ("UMP_ECORRUPT", UMP_ECORRUPT),
        ("UMP_ETIMEOUT", UMP_ETIMEOUT),
        ("UMP_EOS", UMP_EOS),
        ("UMP_ENOTOPEN", UMP_ENOTOPEN),
        ("UMP_ANY", UMP_ANY),
        ("UMP_SHM", UMP_SHM),
        ("UMP_MC", UMP_MC),
        ("UMP_ALL", UMP_ALL),
        ("UMP_EV_NONE", UMP_EV_NONE),
        ("UMP_EV_OPEN", UMP_EV_OPEN),
        ("UMP_EV_MESSAGE", UMP_EV_MESSAGE),
        ("UMP_EV_WRITE_DONE", UMP_EV_WRITE_DONE),
        ("UMP_EV_READ_DONE", UMP_EV_READ_DONE),
        ("UMP_EV_CLOSED", UMP_EV_CLOSED),
    ];
    for (name, v) in &rust {
        let h = header.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("{name} missing from ump.h"));
        assert_eq!(h.1, *v as i64, "{name}");
    }
    for (name, _) in &header {
        assert!(rust.iter().any(|(n, _)| n == name), "ump.h defines {name}, the library does not");
    }
}

#[test]
fn c_program_over_shared_memory() {
    let release = !cfg!(debug_assertions);
    let st = Command::new(env!("CARGO"))
        .args(["build", "-q", "-p", "ump", "--lib"])
        .args(release.then_some("--release"))
        .current_dir(dir())
        .status()
        .unwrap();
    assert!(st.success());
    let lib = dir().join(if release { "../../../target/release/libump.a" } else { "../../../target/debug/libump.a" });
    let tmp = std::env::temp_dir().join(format!("ump-c-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let exe = tmp.join("pingpong");
    let out = Command::new("gcc")
        .args(["-std=c11", "-D_DEFAULT_SOURCE", "-Wall", "-Werror", "-O1", "-o"])
        .arg(&exe)
        .arg(dir().join("tests/c/pingpong.c"))
        .arg("-I")
        .arg(dir().join("include"))
        .arg(&lib)
        .args(["-lpthread", "-ldl", "-lm"])
        .output()
        .unwrap();
    assert!(out.status.success(), "gcc:\n{}", String::from_utf8_lossy(&out.stderr));
    let base = ((std::process::id() as u64) << 24 | 0xC0000).to_string();
    let run = Command::new(&exe).arg(&base).env("UMP_SHM_BUFFER", "64K").output().unwrap();
    let text = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{text}{}", String::from_utf8_lossy(&run.stderr));
    assert!(text.contains("echoed 10 sizes intact") && text.contains("all checks passed"), "{text}");
    let _ = std::fs::remove_dir_all(&tmp);
}
