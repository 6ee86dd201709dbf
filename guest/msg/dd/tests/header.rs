//! `include/dd.h` and the library agree: every `DD_E*` code the header
//! defines is the code of the error it describes, and every function the
//! header declares is defined by the C API (`src/capi.rs`) and the other
//! way round.

use dd::DdError;

fn header() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/include/dd.h")).unwrap()
}

/// `#define DD_EX (-N)` lines: (name, N).
fn codes(h: &str) -> Vec<(String, i32)> {
    h.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some("#define")).then_some(())?;
            let name = w.next()?.to_string();
            let v = w.next()?.trim_matches(|c| c == '(' || c == ')').parse().ok()?;
            name.starts_with("DD_E").then_some((name, v))
        })
        .collect()
}

#[test]
fn error_codes_match_the_header() {
    let imc = |code| DdError::Imc(imc_client::ImcError::Refused { code, message: String::new() });
    let samples = [
        ("DD_EOUTOFBUFFER", DdError::OutOfBuffer { offset: 0, len: 1, size: 0 }),
        ("DD_EMISALIGNED", DdError::Misaligned(1)),
        ("DD_EBUSY", DdError::Busy { offset: 0, end: 8, seq: 1 }),
        ("DD_ENOTESFULL", DdError::NotesFull),
        ("DD_EBUFFERSIZE", DdError::BufferSize(0)),
        ("DD_ELOST", DdError::Lost { conn: 0, seq: 1 }),
        ("DD_EDAMAGED", DdError::Damaged { conn: 0, seq: 1, want: 0, got: 1 }),
        ("DD_EBADNOTE", DdError::BadNote { conn: 0, seq: 1, why: String::new() }),
        ("DD_ENOTOUTSTANDING", DdError::NotOutstanding { conn: 0, seq: 1 }),
        ("DD_ENOCONN", DdError::NoConnection(0)),
        ("DD_EINVAL", DdError::Invalid(String::new())),
        ("DD_ETIMEOUT", DdError::Timeout(String::new())),
        ("DD_EIMC", imc(imc_client::Status::NotFound)),
        ("DD_EPERM", imc(imc_client::Status::Permission)),
        ("DD_EDMA", DdError::Dma(imc_client::dma::DmaError::BadLength(0))),
        ("DD_EOS", DdError::Os("poll", nix::errno::Errno::EIO)),
    ];
    let h = codes(&header());
    assert_eq!(h.len(), samples.len(), "the header's codes: {h:?}");
    for (name, e) in samples {
        let want = h.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("{name} is not in dd.h")).1;
        assert_eq!(e.code(), want, "{name}: {e}");
    }
}

#[test]
fn the_header_declares_what_the_library_defines() {
    let h = header();
    let declared: std::collections::BTreeSet<String> = h
        .lines()
        .filter(|l| !l.trim_start().starts_with('*') && !l.trim_start().starts_with("/*"))
        .filter_map(|l| l.split('(').next()?.split_whitespace().last().map(|s| s.trim_start_matches('*').to_string()))
        .filter(|n| n.starts_with("dd_") && !n.ends_with(';'))
        .collect();
    let capi = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/capi.rs")).unwrap();
    let defined: std::collections::BTreeSet<String> = capi
        .lines()
        .filter_map(|l| l.split("extern \"C\" fn ").nth(1))
        .filter_map(|r| r.split('(').next().map(String::from))
        .collect();
    assert_eq!(declared, defined);
    assert!(defined.len() >= 17, "{defined:?}");
}
