//! Our `mpi.h` against the MPI 5.0 standard ABI, and `libmpi_abi.so.1`
//! built from it. Fast tier (no guests).
//!
//! The reference is the standard ABI header MPICH's PyPI wheel ships,
//! `include/mpi_abi.h`, which `scripts/setup.sh` (step `mpich`) installs
//! into `.cache/mpich`. Without it the comparisons are skipped with a
//! message; the library checks run regardless.
//!
//! - Constants: a C program compiled once with each header prints every
//!   constant's value and C type, the size and alignment of every type and
//!   the offsets in `MPI_Status`; both outputs must be equal, name by name,
//!   both ways.
//! - Functions: `gcc -aux-info` writes each header's prototypes with the
//!   parameter names dropped and arrays as pointers; every function of
//!   theirs must be in ours with the same prototype, and ours declares no
//!   function theirs lacks. Families we leave out are listed in
//!   [`NOT_DECLARED`] with the reason.
//! - Types: a C++ program compiled with each header prints
//!   `typeid(T).name()` of every `typedef` (the mangled type: struct tags,
//!   callback parameters and all), which must be equal.
//! - Library: `scripts/build-mpi.sh` links `libmpi_abi.so.1`; `nm -D`
//!   shows the `MPI_` names weak and the `PMPI_` names strong and nothing
//!   else exported; the soname is `libmpi_abi.so.1`; `guest/msg/mpi/mpicc`
//!   builds a program that runs with it (and with MPICH's, the same binary).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use tests::run_ok as run;

fn our_header() -> PathBuf {
    tests::root().join("guest/msg/mpi/include/mpi.h")
}

/// The wheel's standard ABI header, when set-up has fetched it.
fn their_header() -> Option<PathBuf> {
    let p = tests::cache().join("mpich/include/mpi_abi.h");
    if p.is_file() {
        return Some(p);
    }
    eprintln!(
        "SKIPPED: {} is missing; run `scripts/setup.sh --only mpich` to fetch MPICH's wheel \
         (the reference for the standard ABI)",
        p.display()
    );
    None
}

/// Constants only MPICH's header has: its `MPIX_` extensions are not part
/// of the standard.
fn theirs_only_constant(name: &str) -> bool {
    name.starts_with("MPIX_")
}

/// Functions of the standard ABI header our `mpi.h` does not declare, by
/// family, with the reason. A name listed here that ours declares anyway
/// is fine; a missing name not listed fails the test.
const NOT_DECLARED: &[(&str, &str)] = &[("MPIX_", "MPICH's own extensions, not in the standard")];

fn not_declared(name: &str) -> bool {
    let base = name.strip_prefix('P').unwrap_or(name);
    NOT_DECLARED.iter().any(|(prefix, _)| base.starts_with(prefix))
}

/// Text with C comments removed.
fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("/*") {
        out.push_str(&rest[..i]);
        rest = rest[i..].find("*/").map_or("", |j| &rest[i + j + 2..]);
    }
    out.push_str(rest);
    out.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n")
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The names of the constants a header defines: object-like macros with a
/// value (include guards and names it `#undef`s again left out) and
/// enumerators.
fn constant_names(header: &Path) -> BTreeSet<String> {
    let text = strip_comments(&std::fs::read_to_string(header).unwrap());
    let mut names = BTreeSet::new();
    let mut undone = BTreeSet::new();
    for line in text.lines() {
        let l = line.trim_start();
        if let Some(rest) = l.strip_prefix("#define") {
            let rest = rest.trim_start();
            let name: String = rest.chars().take_while(|&c| is_ident(c)).collect();
            let after = &rest[name.len()..];
            if name.starts_with("MPI") && !after.starts_with('(') && !after.trim().is_empty() {
                names.insert(name);
            }
        } else if let Some(rest) = l.strip_prefix("#undef") {
            undone.insert(rest.trim().to_string());
        } else if !l.starts_with('#') {
            // enumerators: NAME = value, anywhere on the line
            let b = l.as_bytes();
            let mut i = 0;
            while i < b.len() {
                if l[i..].starts_with("MPI") && (i == 0 || !is_ident(b[i - 1] as char)) {
                    let name: String = l[i..].chars().take_while(|&c| is_ident(c)).collect();
                    let after = l[i + name.len()..].trim_start();
                    if after.starts_with('=') && !after.starts_with("==") {
                        names.insert(name.clone());
                    }
                    i += name.len();
                } else {
                    i += 1;
                }
            }
        }
    }
    names.retain(|n| !undone.contains(n));
    names
}

const HANDLE_TYPES: &[&str] = &[
    "MPI_Comm",
    "MPI_Datatype",
    "MPI_Op",
    "MPI_Group",
    "MPI_Request",
    "MPI_Errhandler",
    "MPI_Info",
    "MPI_Win",
    "MPI_File",
    "MPI_Message",
    "MPI_Session",
    "MPI_T_enum",
    "MPI_T_cvar_handle",
    "MPI_T_pvar_handle",
    "MPI_T_pvar_session",
    "MPI_T_event_registration",
    "MPI_T_event_instance",
];

/// Compiles and runs a program against `header` that prints, one a line,
/// `NAME TYPE VALUE` for each of `names`, `sizeof(T)`/`alignof(T)` of the
/// ABI's types and `offsetof(F)` of `MPI_Status`'s fields.
fn values(header: &Path, names: &BTreeSet<String>, scratch: &Path, tag: &str) -> BTreeMap<String, String> {
    let mut c = String::from("#include <stdio.h>\n#include <stddef.h>\n#include <stdint.h>\n");
    c.push_str(&format!("#include \"{}\"\n", header.display()));
    c.push_str("#define TYPE(x) _Generic((x), ");
    for t in HANDLE_TYPES {
        c.push_str(&format!("{t}: \"{t}\", "));
    }
    c.push_str(
        "MPI_Status *: \"MPI_Status*\", void *: \"void*\", int *: \"int*\", char **: \"char**\", \
         char ***: \"char***\", int: \"int\", long: \"long\", default: \"other\")\n",
    );
    c.push_str("#define P(x) printf(\"%s %s %lld\\n\", #x, TYPE(x), (long long)(intptr_t)(x))\n");
    c.push_str("#define S(t) printf(\"sizeof(%s) - %zu\\nalignof(%s) - %zu\\n\", #t, sizeof(t), #t, _Alignof(t))\n");
    c.push_str("int main(void) {\n");
    for n in names {
        c.push_str(&format!("    P({n});\n"));
    }
    for t in HANDLE_TYPES.iter().chain(&["MPI_Aint", "MPI_Offset", "MPI_Count", "MPI_Status"]) {
        c.push_str(&format!("    S({t});\n"));
    }
    for f in ["MPI_SOURCE", "MPI_TAG", "MPI_ERROR", "MPI_internal"] {
        c.push_str(&format!("    printf(\"offsetof({f}) - %zu\\n\", offsetof(MPI_Status, {f}));\n"));
    }
    c.push_str("    return 0;\n}\n");
    let src = scratch.join(format!("{tag}.c"));
    std::fs::write(&src, c).unwrap();
    let exe = scratch.join(tag);
    run(Command::new("cc").args(["-std=c11", "-Wall", "-Werror", "-o"]).arg(&exe).arg(&src));
    run(&mut Command::new(&exe))
        .lines()
        .map(|l| {
            let (name, rest) = l.split_once(' ').unwrap();
            (name.to_string(), rest.to_string())
        })
        .collect()
}

#[test]
fn constants_types_and_status_agree_with_the_standard_abi() {
    let Some(theirs_h) = their_header() else { return };
    let scratch = tempfile::tempdir().unwrap();
    let ours_n = constant_names(&our_header());
    let theirs_n = constant_names(&theirs_h);
    assert!(theirs_n.len() > 300 && ours_n.len() > 300, "{} and {} constants", theirs_n.len(), ours_n.len());
    let theirs_only: Vec<_> = theirs_n.difference(&ours_n).filter(|n| !theirs_only_constant(n)).collect();
    assert!(theirs_only.is_empty(), "the standard ABI defines these and our mpi.h does not: {theirs_only:?}");
    let ours_only: Vec<_> = ours_n.difference(&theirs_n).collect();
    assert!(ours_only.is_empty(), "our mpi.h defines these and the standard ABI does not: {ours_only:?}");

    let common: BTreeSet<String> = ours_n.intersection(&theirs_n).cloned().collect();
    let ours = values(&our_header(), &common, scratch.path(), "ours");
    let theirs = values(&theirs_h, &common, scratch.path(), "theirs");
    assert_eq!(ours.len(), theirs.len());
    let mut wrong = Vec::new();
    for (name, v) in &theirs {
        if ours.get(name) != Some(v) {
            wrong.push(format!("{name}: standard {v}, ours {:?}", ours.get(name)));
        }
    }
    assert!(wrong.is_empty(), "{} differences:\n{}", wrong.len(), wrong.join("\n"));
    // the facts the comparison rests on
    assert_eq!(ours["sizeof(MPI_Status)"], "- 32");
    assert_eq!(ours["MPI_COMM_WORLD"], "MPI_Comm 257");
    assert_eq!(ours["MPI_ANY_SOURCE"], "int -1");
    assert_eq!(ours["MPI_IN_PLACE"], "void* 1");
}

/// The names a header's `typedef`s declare.
fn typedef_names(header: &Path) -> BTreeSet<String> {
    let text = strip_comments(&std::fs::read_to_string(header).unwrap());
    let mut names = BTreeSet::new();
    let mut rest = text.as_str();
    while let Some(i) = rest.find("typedef ") {
        rest = &rest[i..];
        // the statement ends at the first ';' outside braces
        let mut depth = 0;
        let end = rest
            .char_indices()
            .find(|&(_, c)| {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    _ => {}
                }
                c == ';' && depth == 0
            })
            .map_or(rest.len(), |(j, _)| j);
        let stmt = &rest[..end];
        rest = &rest[end..];
        // `typedef ret (NAME)(params)` or `typedef ... NAME`
        let name = match (stmt.contains('{'), stmt.find('(')) {
            (false, Some(open)) => {
                stmt[open + 1..].trim_start_matches(['*', ' ']).chars().take_while(|&c| is_ident(c)).collect()
            }
            _ => {
                let t = stmt.trim_end();
                let n = t.chars().rev().take_while(|&c| is_ident(c)).count();
                t[t.len() - n..].to_string()
            }
        };
        if name.starts_with("MPI") {
            names.insert(name);
        }
    }
    names
}

/// C++'s name for each type in `names` under `header` (`typeid(T).name()`,
/// the Itanium mangling: struct tags and every parameter type included).
fn cxx_type_names(header: &Path, names: &BTreeSet<String>, scratch: &Path, tag: &str) -> BTreeMap<String, String> {
    let mut c = format!("#include \"{}\"\n#include <cstdio>\n#include <typeinfo>\nint main() {{\n", header.display());
    for n in names {
        c.push_str(&format!("    std::printf(\"%s %s\\n\", \"{n}\", typeid({n}).name());\n"));
    }
    c.push_str("    return 0;\n}\n");
    let src = scratch.join(format!("{tag}.cc"));
    std::fs::write(&src, c).unwrap();
    let exe = scratch.join(tag);
    run(Command::new("c++").args(["-Wall", "-Werror", "-o"]).arg(&exe).arg(&src));
    run(&mut Command::new(&exe))
        .lines()
        .map(|l| {
            let (n, t) = l.split_once(' ').unwrap();
            (n.to_string(), t.to_string())
        })
        .collect()
}

#[test]
fn types_and_callbacks_agree_with_the_standard_abi() {
    let Some(theirs_h) = their_header() else { return };
    if Command::new("c++").arg("--version").output().is_err() {
        eprintln!("SKIPPED: no C++ compiler (c++) to compare the types with");
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let ours_n = typedef_names(&our_header());
    let theirs_n = typedef_names(&theirs_h);
    assert!(ours_n.contains("MPI_Comm_copy_attr_function") && ours_n.contains("MPI_Status"), "{ours_n:?}");
    let theirs_only: Vec<_> = theirs_n.difference(&ours_n).filter(|n| !n.starts_with("MPIX_")).collect();
    assert!(theirs_only.is_empty(), "types of the standard ABI our mpi.h lacks: {theirs_only:?}");
    let ours_only: Vec<_> = ours_n.difference(&theirs_n).collect();
    assert!(ours_only.is_empty(), "types only our mpi.h has: {ours_only:?}");
    let common: BTreeSet<String> = ours_n.intersection(&theirs_n).cloned().collect();
    let ours = cxx_type_names(&our_header(), &common, scratch.path(), "ours");
    let theirs = cxx_type_names(&theirs_h, &common, scratch.path(), "theirs");
    let wrong: Vec<_> = theirs
        .iter()
        .filter(|(n, t)| ours.get(*n) != Some(t))
        .map(|(n, t)| format!("{n}: standard {t}, ours {:?}", ours.get(n)))
        .collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    assert_eq!(ours["MPI_Comm"], "P12MPI_ABI_Comm");
}

/// `name -> prototype` (return type and parameter types) of the functions
/// whose names start with `MPI`/`PMPI` in the header `header` declares.
fn prototypes(header: &Path, scratch: &Path, tag: &str) -> BTreeMap<String, String> {
    let src = scratch.join(format!("{tag}.c"));
    std::fs::write(&src, format!("#include \"{}\"\n", header.display())).unwrap();
    let aux = scratch.join(format!("{tag}.aux"));
    run(Command::new("gcc")
        .args(["-std=c11", "-c", "-o"])
        .arg(scratch.join(format!("{tag}.o")))
        .arg("-aux-info")
        .arg(&aux)
        .arg(&src));
    let mut out = BTreeMap::new();
    for line in std::fs::read_to_string(&aux).unwrap().lines() {
        // /* file:line:NC */ extern int MPI_Send (const void *, int, ...);
        let Some((_, decl)) = line.split_once("*/ ") else { continue };
        let decl = decl.trim_start_matches("extern ").trim_end_matches(';');
        let Some((head, params)) = decl.split_once(" (") else { continue };
        let name = head.rsplit([' ', '*']).next().unwrap();
        if name.starts_with("MPI") || name.starts_with("PMPI") {
            let ret = head[..head.len() - name.len()].trim();
            out.insert(name.to_string(), format!("{ret} ({params}"));
        }
    }
    out
}

#[test]
fn functions_agree_with_the_standard_abi() {
    let Some(theirs_h) = their_header() else { return };
    let scratch = tempfile::tempdir().unwrap();
    let ours = prototypes(&our_header(), scratch.path(), "ours");
    let theirs = prototypes(&theirs_h, scratch.path(), "theirs");
    assert!(theirs.len() > 1000, "only {} functions parsed from {}", theirs.len(), theirs_h.display());
    let mut missing = Vec::new();
    let mut differ = Vec::new();
    for (name, proto) in &theirs {
        match ours.get(name) {
            None if not_declared(name) => {}
            None => missing.push(name.as_str()),
            Some(p) if p != proto => {
                differ.push(format!("{name}: standard {proto}\n{:>w$}  ours {p}", "", w = name.len()))
            }
            Some(_) => {}
        }
    }
    assert!(differ.is_empty(), "{} prototypes differ:\n{}", differ.len(), differ.join("\n"));
    assert!(missing.is_empty(), "{} functions of the standard ABI missing from our mpi.h: {missing:?}", missing.len());
    let extra: Vec<_> = ours.keys().filter(|n| !theirs.contains_key(*n)).collect();
    assert!(extra.is_empty(), "our mpi.h declares functions the standard ABI does not: {extra:?}");
    for (name, proto) in &ours {
        if let Some(base) = name.strip_prefix("MPI_") {
            assert_eq!(ours.get(&format!("PMPI_{base}")), Some(proto), "PMPI_{base} must match {name}");
        }
    }
    assert!(ours.len() > 700, "{} functions", ours.len());
}

/// `(type, name)` of the symbols `lib` defines and exports.
fn exported(lib: &Path) -> Vec<(String, String)> {
    run(Command::new("nm").args(["-D", "--defined-only"]).arg(lib))
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace().rev();
            let name = w.next()?;
            let kind = w.next()?;
            Some((kind.to_string(), name.to_string()))
        })
        .collect()
}

#[test]
fn library_exports_weak_mpi_and_strong_pmpi_and_mpicc_links_against_it() {
    let scratch = tempfile::tempdir().unwrap();
    let lib_dir = scratch.path().join("lib");
    run(Command::new("nice").args(["-n", "19"]).arg(tests::root().join("scripts/build-mpi.sh")).arg(&lib_dir));
    let so = lib_dir.join("libmpi_abi.so.1");

    let syms = exported(&so);
    let kind = |n: &str| syms.iter().find(|s| s.1 == n).map(|s| s.0.as_str());
    assert_eq!(kind("MPI_Get_version"), Some("W"), "{syms:?}");
    assert_eq!(kind("PMPI_Get_version"), Some("T"), "{syms:?}");
    let stray: Vec<_> = syms.iter().filter(|s| !s.1.starts_with("MPI_") && !s.1.starts_with("PMPI_")).collect();
    assert!(stray.is_empty(), "exported besides MPI_* and PMPI_*: {stray:?}");
    for (k, name) in &syms {
        if let Some(base) = name.strip_prefix("MPI_") {
            assert_eq!(k, "W", "{name} must be weak");
            assert_eq!(kind(&format!("PMPI_{base}")), Some("T"), "{name} without a strong PMPI_{base}");
        }
    }
    let dynamic = run(Command::new("readelf").arg("-d").arg(&so));
    assert!(dynamic.contains("Library soname: [libmpi_abi.so.1]"), "{dynamic}");
    assert!(std::fs::read_link(lib_dir.join("libmpi_abi.so")).unwrap() == Path::new("libmpi_abi.so.1"));

    // mpicc with MCMPI_HOME (include/ and lib/ side by side)
    std::os::unix::fs::symlink(tests::root().join("guest/msg/mpi/include"), scratch.path().join("include")).unwrap();
    let src = scratch.path().join("version.c");
    std::fs::write(
        &src,
        "#include <mpi.h>\n#include <stdio.h>\nint main(void) {\n    int v = -1, s = -1;\n    \
         int rc = MPI_Get_version(&v, &s);\n    printf(\"MPI %d.%d rc %d\\n\", v, s, rc);\n    \
         return rc != MPI_SUCCESS;\n}\n",
    )
    .unwrap();
    let exe = scratch.path().join("version");
    let mpicc = tests::root().join("guest/msg/mpi/mpicc");
    let show = run(Command::new(&mpicc).env("MCMPI_HOME", scratch.path()).arg("-show").arg("-o").arg(&exe).arg(&src));
    assert!(show.contains("-lmpi_abi") && show.contains(&format!("-I{}/include", scratch.path().display())), "{show}");
    run(Command::new(&mpicc).env("MCMPI_HOME", scratch.path()).args(["-Wall", "-Werror", "-o"]).arg(&exe).arg(&src));
    let dynamic = run(Command::new("readelf").arg("-d").arg(&exe));
    assert!(dynamic.contains("Shared library: [libmpi_abi.so.1]"), "{dynamic}");
    assert!(!dynamic.contains("RUNPATH") && !dynamic.contains("RPATH"), "no run path wanted:\n{dynamic}");
    let out = run(Command::new(&exe).env("LD_LIBRARY_PATH", &lib_dir));
    assert_eq!(out.trim(), "MPI 5.0 rc 0");
    // without the library on the search path the loader refuses to start it
    let none = Command::new(&exe).env("LD_LIBRARY_PATH", scratch.path().join("nowhere")).output().unwrap();
    assert!(!none.status.success());

    // C++ through mpicxx, source-tree layout (no MCMPI_HOME): compile only
    let show = run(Command::new(tests::root().join("guest/msg/mpi/mpicxx"))
        .env_remove("MCMPI_HOME")
        .args(["-show", "-c", "x.cc"]));
    assert_eq!(show.trim(), format!("c++ -I{}/guest/msg/mpi/include -c x.cc", tests::root().display()));
    if Command::new("c++").arg("--version").output().is_ok() {
        let cc = scratch.path().join("version.cc");
        std::fs::copy(&src, &cc).unwrap();
        run(Command::new(tests::root().join("guest/msg/mpi/mpicxx"))
            .env("MCMPI_HOME", scratch.path())
            .args(["-Wall", "-Werror", "-o"])
            .arg(scratch.path().join("version-cxx"))
            .arg(&cc));
        let out = run(Command::new(scratch.path().join("version-cxx")).env("LD_LIBRARY_PATH", &lib_dir));
        assert_eq!(out.trim(), "MPI 5.0 rc 0");
    }

    // The same binary runs with MPICH's library of the same ABI.
    let mpich = tests::cache().join("mpich/lib");
    if mpich.join("libmpi_abi.so.1").is_file() {
        let out = run(Command::new(&exe).env("LD_LIBRARY_PATH", &mpich));
        assert_eq!(out.trim(), "MPI 5.0 rc 0", "with {}", mpich.display());
    } else {
        eprintln!("SKIPPED (MPICH run): {} has no libmpi_abi.so.1", mpich.display());
    }
}

#[test]
fn mpicc_without_a_compiler_says_so() {
    let out = Command::new(tests::root().join("guest/msg/mpi/mpicc"))
        .env("MCMPI_CC", "no-such-compiler-here")
        .arg("x.c")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(127));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no compiler 'no-such-compiler-here'"), "{err}");
}
