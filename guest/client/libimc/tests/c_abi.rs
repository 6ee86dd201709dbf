//! The C face of libimc: `<sys/imc.h>` agrees with the Rust constants, and
//! a C program compiled with gcc against `libimc.a` gets the right answers
//! from a (fake) imcd through the real socket protocol.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::Command;

use imc::{flags, status};
use imc_client::{Reply, Request};

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `#define IMC_X value` lines of the header.
fn header_defines() -> Vec<(String, i64)> {
    let text = std::fs::read_to_string(crate_dir().join("include/sys/imc.h")).unwrap();
    text.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            (w.next()? == "#define").then_some(())?;
            let name = w.next()?;
            let v = w.next()?;
            if !name.starts_with("IMC_") {
                return None;
            }
            let n = if let Some(h) = v.strip_prefix("0x") {
                i64::from_str_radix(h, 16).ok()?
            } else if v.len() > 1 && v.starts_with('0') {
                i64::from_str_radix(&v[1..], 8).ok()?
            } else {
                v.parse().ok()?
            };
            Some((name.to_string(), n))
        })
        .collect()
}

fn rust_constants() -> Vec<(&'static str, i64)> {
    use flags::*;
    use status::*;
    let v: Vec<(&str, i32)> = vec![
        ("IMC_SUCCESS", IMC_SUCCESS),
        ("IMC_EXISTS", IMC_EXISTS),
        ("IMC_PERMISSION", IMC_PERMISSION),
        ("IMC_NOTALLOC", IMC_NOTALLOC),
        ("IMC_NOSPACE", IMC_NOSPACE),
        ("IMC_TABLEFULL", IMC_TABLEFULL),
        ("IMC_SIZE", IMC_SIZE),
        ("IMC_INVALID", IMC_INVALID),
        ("IMC_NODAEMON", IMC_NODAEMON),
        ("IMC_CLUSTER", IMC_CLUSTER),
        ("IMC_LOCKBUSY", IMC_LOCKBUSY),
        ("IMC_NOHOST", IMC_NOHOST),
        ("IMC_ERRNO", IMC_ERRNO),
        ("IMC_NOMEM", IMC_NOMEM),
        ("IMC_FAIL", IMC_FAIL),
        ("IMC_DMA_PENDING", IMC_DMA_PENDING),
        ("IMC_DMA_FAILED", IMC_DMA_FAILED),
        ("IMC_DMA_FULL", IMC_DMA_FULL),
        ("IMC_URW", IMC_URW),
        ("IMC_GRW", IMC_GRW),
        ("IMC_ORW", IMC_ORW),
        ("IMC_LKU", IMC_LKU),
        ("IMC_LKG", IMC_LKG),
        ("IMC_LKO", IMC_LKO),
        ("IMC_COHERENT", IMC_COHERENT),
        ("IMC_EXCL", IMC_EXCL),
        ("IMC_CREATOR", IMC_CREATOR),
        ("IMC_TRANSMIT", IMC_TRANSMIT),
        ("IMC_RECEIVE", IMC_RECEIVE),
        ("IMC_SHARED", IMC_SHARED),
        ("IMC_LOOPBACK", IMC_LOOPBACK),
        ("IMC_LOCKNOWAIT", IMC_LOCKNOWAIT),
        ("IMC_LOCKWAIT", IMC_LOCKWAIT),
        ("IMC_HOSTNAME_LEN", IMC_HOSTNAME_LEN),
    ];
    v.into_iter().map(|(n, x)| (n, x as i64)).collect()
}

#[test]
fn header_constants_match_the_library() {
    let header = header_defines();
    let rust = rust_constants();
    for (name, v) in &rust {
        let h = header.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("{name} missing from imc.h"));
        assert_eq!(h.1, *v, "{name}: header {} library {v}", h.1);
    }
    for (name, _) in &header {
        assert!(rust.iter().any(|(n, _)| n == name), "imc.h defines {name}, the library does not");
    }
}

/// Where cargo put this crate's libimc.a (built for the test run if missing).
fn static_lib() -> PathBuf {
    let release = !cfg!(debug_assertions);
    let target = crate_dir().join(if release { "../../../target/release" } else { "../../../target/debug" });
    let status = Command::new(env!("CARGO"))
        .args(["build", "-q", "-p", "libimc", "--lib"])
        .args(release.then_some("--release"))
        .current_dir(crate_dir())
        .status()
        .unwrap();
    assert!(status.success(), "building libimc.a failed");
    let lib = target.join("libimc.a");
    assert!(lib.exists(), "{} missing", lib.display());
    lib
}

/// A fake imcd for one client: answers the requests abi.c makes.
fn fake_imcd(sock: &Path) -> std::thread::JoinHandle<Vec<Request>> {
    let l = UnixListener::bind(sock).unwrap();
    std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let mut r = BufReader::new(s.try_clone().unwrap());
        let mut seen = Vec::new();
        let mut held = std::collections::HashSet::new();
        let mut line = String::new();
        while r.read_line(&mut line).unwrap() > 0 {
            let req: Request = serde_json_line(&line);
            let reply = match &req {
                Request::Asalloc { key: 123, .. } => {
                    held.insert(5);
                    Reply::Region { id: 5, first_page: 16, pages: 1, created: true }
                }
                Request::Asalloc { exclusive: true, key, .. } => Reply::Error {
                    code: imc_client::Status::Exists,
                    message: format!("a region with key {key} exists already"),
                },
                Request::Hosts => Reply::Hosts { hosts: vec![(0, "node0".into()), (1, "node1".into())] },
                Request::Kill { host, .. } => {
                    Reply::Error { code: imc_client::Status::NoHost, message: format!("no host {host}") }
                }
                Request::Dealloc { id } if held.remove(id) => Reply::Done,
                _ => Reply::Error { code: imc_client::Status::NotAlloc, message: "not allocated".into() },
            };
            seen.push(req);
            let mut out = json(&reply);
            out.push('\n');
            (&s).write_all(out.as_bytes()).unwrap();
            line.clear();
        }
        seen
    })
}

fn serde_json_line(l: &str) -> Request {
    imc_client::decode_request(l.trim_end().as_bytes()).unwrap()
}

fn json(r: &Reply) -> String {
    let line = imc_client::encode_line(r);
    String::from_utf8_lossy(&line[..line.len() - 1]).into_owned()
}

#[test]
fn c_program_talks_to_imcd_through_libimc() {
    let lib = static_lib();
    let dir = std::env::temp_dir().join(format!("libimc-abi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("abi");
    let out = Command::new("gcc")
        .args(["-std=c99", "-Wall", "-Werror", "-D_DEFAULT_SOURCE", "-o"])
        .arg(&exe)
        .arg(crate_dir().join("tests/c/abi.c"))
        .arg("-I")
        .arg(crate_dir().join("include"))
        .arg(&lib)
        .args(["-lpthread", "-ldl", "-lm"])
        .output()
        .expect("gcc");
    assert!(out.status.success(), "gcc failed:\n{}", String::from_utf8_lossy(&out.stderr));

    // Without imcd: IMC_NODAEMON and a message naming the socket.
    let none = Command::new(&exe).env("IMCD_SOCKET", dir.join("absent.sock")).output().unwrap();
    let text = String::from_utf8_lossy(&none.stdout);
    assert!(!none.status.success());
    assert!(text.contains("status 8") && text.contains("absent.sock"), "{text}");

    let sock = dir.join("imcd.sock");
    let imcd = fake_imcd(&sock);
    let run = Command::new(&exe).env("IMCD_SOCKET", &sock).output().unwrap();
    let text = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{text}");
    assert!(text.contains("all checks passed"), "{text}");
    let seen = imcd.join().unwrap();
    assert!(
        matches!(seen[0], Request::Asalloc { key: 123, size: 8192, mode: 0o600, exclusive: false, coherent: true }),
        "{:?}",
        seen[0]
    );
    // Argument errors are caught in the library: imcd never saw them.
    assert_eq!(seen.len(), 6, "{seen:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
