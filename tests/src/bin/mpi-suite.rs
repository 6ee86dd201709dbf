//! `mpi-suite`: builds a chosen list of programs from MPICH's test suite
//! (`test/mpi`, fetched into the cache by `scripts/setup.sh --only
//! mpich-suite`) with our `mpicc`, runs each with its rank count and a time
//! limit, and prints one table with the pass count at the end.
//!
//! The list (default `tests/mpich-suite.list`) has one test a line:
//! `dir/name nprocs [args...]  # status`, where a status starting with
//! `pass` says the test passes today, one starting with `skip` says it is
//! not run (it needs what a host run cannot give, e.g. many GB of memory),
//! and anything else is the reason it cannot pass yet. A pass is the suite's own rule: every rank exits 0 and
//! the output holds " No Errors" (or " No errors", which the suite's
//! runner accepts too and a few of its programs print). The exit code is non-zero when a test
//! listed as passing does not pass.
//!
//! Built programs, the suite's helper library (`util/mtest.c` and friends)
//! and our own `mpitestconf.h` (the suite's configure would generate it)
//! live in the build folder in the cache.
//!
//! The suite's helpers (`mtest.c`) call functions our library may not have
//! yet, so a program would not link at all. The programs are therefore
//! also linked with `libmpi_missing.so`, built here from the functions
//! `mpi.h` declares and `libmpi_abi.so.1` does not export: each of them
//! prints "mpi-suite: MPI_X is not in the MPI library" and exits 86. The
//! real library comes first in the search order, so it wins whenever it
//! has the function; a test that calls a missing one is reported as
//! needing it, with its name. The final summary counts, for the tests
//! that do not pass, which missing functions their own source calls (the
//! library's list of those it exports but does not implement yet is
//! `guest/msg/mpi/src/ffi/missing.rs`).
//!
//! Ranks are started by this
//! program on the host (`MCMPI_JOB`, `MCMPI_RANK`, `MCMPI_SIZE`: shared
//! memory between the ranks) or, with `--mpiexec`, by a launcher; with
//! `--share` too, in guests: `--mpiexec "mc-cluster --name C mpirun"
//! --share .run/C/share/suite=/share/suite` runs each program across the
//! cluster's guests (the QEMU tier's `mpi_suite_qemu`).
//! Single-threaded.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;

#[derive(Parser)]
#[command(about = "Build and run a list of MPICH test-suite programs against our MPI library")]
struct Args {
    /// The list of tests (`dir/name nprocs [args]  # status`).
    #[arg(long)]
    list: Option<PathBuf>,
    /// MPICH's source (with `test/mpi`), as set-up unpacks it.
    #[arg(long)]
    src: Option<PathBuf>,
    /// Where the helper library and the test programs are built.
    #[arg(long)]
    build: Option<PathBuf>,
    /// The compiler wrapper.
    #[arg(long)]
    mpicc: Option<PathBuf>,
    /// The folder with libmpi_abi.so.1 (LD_LIBRARY_PATH of the ranks).
    #[arg(long)]
    lib: Option<PathBuf>,
    /// Seconds a test may run before all its ranks are killed (a list line's
    /// `timeLimit=N` raises it for that test).
    #[arg(long, default_value_t = 60)]
    timeout: u64,
    /// Start ranks with this launcher command instead of starting them here
    /// on the host: its words, then `-n N prog args`. A word `{timeout}` is
    /// replaced by the test's time limit in seconds (for the launcher's own
    /// limit); this runner then waits 20 s longer before it kills the launcher.
    #[arg(long)]
    mpiexec: Option<String>,
    /// With `--mpiexec`: the ranks run where the programs are seen under
    /// another path, `HOST=GUEST` (a cluster's shared folder). Each
    /// program and the stand-in library are copied into HOST, and the
    /// launcher is given `--env LD_LIBRARY_PATH=...` (as `mc-cluster
    /// mpirun` takes it).
    #[arg(long, requires = "mpiexec")]
    share: Option<String>,
    /// Run only the tests whose `dir/name` contains one of these strings.
    filter: Vec<String>,
    /// Build only, do not run.
    #[arg(long)]
    build_only: bool,
    /// Print the output of tests that do not pass.
    #[arg(long, short)]
    verbose: bool,
}

/// One line of the list.
#[derive(Debug, Clone)]
struct Entry {
    /// `dir/name` under `test/mpi`.
    name: String,
    /// Rank count.
    nprocs: u32,
    /// Command-line arguments of the program.
    args: Vec<String>,
    /// Its own time limit in seconds (`timeLimit=N`, as in the suite's
    /// testlist files), when longer than the run's.
    time_limit: Option<u64>,
    /// The list's comment: `pass`, or why the test cannot pass yet.
    status: String,
}

impl Entry {
    /// Seconds this test may run in a run whose limit is `timeout`.
    fn limit(&self, timeout: u64) -> u64 {
        self.time_limit.map_or(timeout, |t| t.max(timeout))
    }

    /// Whether the list says not to run this test.
    fn skipped(&self) -> bool {
        self.status.starts_with("skip")
    }

    /// Whether the list says this test passes today.
    fn expected_pass(&self) -> bool {
        self.status == "pass" || self.status.starts_with("pass ") || self.status.starts_with("pass;")
    }
}

/// How one test went.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    /// Exit 0 on every rank and " No Errors" in the output.
    Pass,
    /// It did not compile or link (the first error line).
    Build(String),
    /// It ran and failed (what was seen).
    Fail(String),
    /// Killed at the time limit.
    Timeout,
    /// It called a function the library does not have (its name).
    Missing(String),
    /// Not run (the list says why).
    Skipped,
}

impl Outcome {
    fn word(&self) -> &'static str {
        match self {
            Outcome::Pass => "pass",
            Outcome::Build(_) => "BUILD",
            Outcome::Fail(_) => "FAIL",
            Outcome::Timeout => "TIMEOUT",
            Outcome::Missing(_) => "MISSING",
            Outcome::Skipped => "skip",
        }
    }
}

fn parse_list(text: &str) -> Result<Vec<Entry>> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let (body, comment) = match raw.split_once('#') {
            Some((b, c)) => (b, c.trim()),
            None => (raw, ""),
        };
        let mut words = body.split_whitespace();
        let Some(name) = words.next() else { continue };
        let nprocs: u32 = words
            .next()
            .with_context(|| format!("line {}: '{name}' has no rank count", i + 1))?
            .parse()
            .with_context(|| format!("line {}: bad rank count", i + 1))?;
        if nprocs == 0 || !name.contains('/') {
            bail!("line {}: expected 'dir/name nprocs [args]'", i + 1);
        }
        let mut args = Vec::new();
        let mut time_limit = None;
        for w in words {
            match w.strip_prefix("timeLimit=") {
                Some(v) => {
                    let secs: u64 = v.parse().with_context(|| format!("line {}: bad timeLimit '{v}'", i + 1))?;
                    if secs == 0 {
                        bail!("line {}: timeLimit must be at least 1 s", i + 1);
                    }
                    time_limit = Some(secs);
                }
                None => args.push(w.to_string()),
            }
        }
        out.push(Entry { name: name.to_string(), nprocs, args, time_limit, status: comment.to_string() });
    }
    Ok(out)
}

/// Our own configuration header for the suite: what its configure would
/// find on Linux x86_64 with glibc and POSIX threads.
const CONF_H: &str = "\
/* mpitestconf.h for building MPICH's test suite against our MPI library
   (written by tests/src/bin/mpi-suite.rs: Linux x86_64, glibc, pthreads) */
#ifndef MPITESTCONF_H_INCLUDED
#define MPITESTCONF_H_INCLUDED
#define STDC_HEADERS 1
#define HAVE_STDARG_H 1
#define HAVE_STDLIB_H 1
#define HAVE_STRING_H 1
#define HAVE_STRINGS_H 1
#define HAVE_STDINT_H 1
#define HAVE_INTTYPES_H 1
#define HAVE_UNISTD_H 1
#define HAVE_PTHREAD_H 1
#define HAVE_SYS_TIME_H 1
#define HAVE_SYS_TYPES_H 1
#define HAVE_SYS_STAT_H 1
#define HAVE_SYS_RESOURCE_H 1
#define HAVE_GETRUSAGE 1
#define HAVE_USLEEP 1
#define HAVE_STRDUP 1
#define HAVE_LONG_LONG 1
#define HAVE_LONG_DOUBLE 1
#define HAVE__BOOL 1
#define HAVE_FLOAT__COMPLEX 1
#define HAVE_DOUBLE__COMPLEX 1
#define HAVE_LONG_DOUBLE__COMPLEX 1
#define SIZEOF_SHORT 2
#define SIZEOF_INT 4
#define SIZEOF_LONG 8
#define SIZEOF_LONG_LONG 8
#define SIZEOF_VOID_P 8
#define SIZEOF_MPI_OFFSET 8
#define POINTERINT_t long
#define THREAD_PACKAGE_NAME THREAD_PACKAGE_POSIX
#define HAVE_MPI_WIN_CREATE 1
#endif
";

/// Helper sources of the suite, compiled into `libmtest.a`.
const HELPERS: [&str; 4] = ["mtest.c", "mtest_common.c", "mtest_single.c", "dtypes.c"];

struct Paths {
    suite: PathBuf,
    build: PathBuf,
    mpicc: PathBuf,
    lib: PathBuf,
}

impl Paths {
    fn cflags(&self) -> Vec<String> {
        vec![
            "-O1".into(),
            "-w".into(),
            format!("-I{}", self.build.join("include").display()),
            format!("-I{}", self.suite.join("include").display()),
            format!("-I{}", self.suite.join("dtpools/include").display()),
        ]
    }

    /// Compiles `src` into object `obj` with our mpicc; on failure, the
    /// compiler's first error.
    fn compile_object(&self, src: &Path, obj: &Path) -> std::result::Result<(), String> {
        self.compile_with(src, obj, &[])
    }

    /// As [`Paths::compile_object`], with extra preprocessor flags.
    fn compile_with(&self, src: &Path, obj: &Path, extra: &[String]) -> std::result::Result<(), String> {
        let out = Command::new(&self.mpicc)
            .args(self.cflags())
            .args(extra)
            .arg("-c")
            .arg(src)
            .arg("-o")
            .arg(obj)
            .output()
            .map_err(|err| format!("running {}: {err}", self.mpicc.display()))?;
        if !out.status.success() {
            return Err(first_error(&String::from_utf8_lossy(&out.stderr)));
        }
        Ok(())
    }
}

/// The first line of compiler output naming an undefined symbol or saying
/// "error", else the last.
fn first_error(text: &str) -> String {
    text.lines()
        .find(|l| l.contains("undefined reference"))
        .or_else(|| text.lines().find(|l| l.contains("error")))
        .or_else(|| text.lines().last())
        .unwrap_or("no output")
        .trim()
        .to_string()
}

fn newer(src: &Path, out: &Path) -> bool {
    let m = |p: &Path| fs::metadata(p).and_then(|m| m.modified()).ok();
    match (m(src), m(out)) {
        (Some(s), Some(o)) => s > o,
        _ => true,
    }
}

/// Compiles the helper library once (again when a source is newer).
fn build_helpers(p: &Paths) -> Result<PathBuf> {
    let inc = p.build.join("include");
    fs::create_dir_all(&inc)?;
    let conf = inc.join("mpitestconf.h");
    if fs::read_to_string(&conf).ok().as_deref() != Some(CONF_H) {
        fs::write(&conf, CONF_H)?;
    }
    let lib = p.build.join("libmtest.a");
    let mut objs = Vec::new();
    let mut stale = !lib.exists();
    for h in HELPERS {
        let src = p.suite.join("util").join(h);
        let obj = p.build.join(h.replace(".c", ".o"));
        if newer(&src, &obj) || newer(&conf, &obj) {
            if let Err(e) = p.compile_object(&src, &obj) {
                bail!("compiling {}: {e}", src.display());
            }
            stale = true;
        }
        objs.push(obj);
    }
    if stale {
        let _ = fs::remove_file(&lib);
        let st = Command::new("ar").arg("rcs").arg(&lib).args(&objs).status()?;
        if !st.success() {
            bail!("ar rcs {} failed", lib.display());
        }
    }
    Ok(lib)
}

/// The exit code and message of a function `libmpi_missing.so` stands in for.
const MISSING_EXIT: i32 = 86;
const MISSING_MARK: &str = "mpi-suite: ";
const MISSING_TAIL: &str = " is not in the MPI library";
/// How the library's error message ends for a function it does not implement.
const UNSUPPORTED_TAIL: &str = " is not implemented by this library yet";

/// Functions `mpi.h` declares (`MCMPI_FN_(type, Name, ...)`), without prefix.
fn declared(header: &str) -> Vec<String> {
    let mut out = Vec::new();
    for part in header.split("MCMPI_FN_(").skip(1) {
        let mut fields = part.splitn(3, ',');
        let (Some(_), Some(name)) = (fields.next(), fields.next()) else { continue };
        let name = name.trim();
        if !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') && name != "name" {
            out.push(name.to_string());
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Names `so` exports (defined dynamic symbols).
fn exported(so: &Path) -> Result<std::collections::BTreeSet<String>> {
    let out = Command::new("nm").args(["-D", "--defined-only"]).arg(so).output().context("running nm")?;
    if !out.status.success() {
        bail!("nm -D {} failed", so.display());
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_string))
        .collect())
}

/// Builds `libmpi_missing.so` (see the module header); returns the names
/// (with `MPI_` prefix) it stands in for.
fn build_missing(p: &Paths, header: &Path) -> Result<std::collections::BTreeSet<String>> {
    let text = fs::read_to_string(header).with_context(|| format!("reading {}", header.display()))?;
    let have = exported(&p.lib.join("libmpi_abi.so.1"))?;
    let missing: std::collections::BTreeSet<String> =
        declared(&text).into_iter().map(|n| format!("MPI_{n}")).filter(|n| !have.contains(n)).collect();
    let dir = p.build.join("missing");
    fs::create_dir_all(&dir)?;
    let mut c = String::from(
        "/* Stand-ins for the MPI functions libmpi_abi.so.1 does not have (mpi-suite): each\n   \
         says which one was called and ends the process. */\n#include <stdio.h>\n#include <unistd.h>\n\
         static void mpi_suite_missing(const char *name)\n{\n",
    );
    let _ = writeln!(
        c,
        "    fprintf(stderr, \"{MISSING_MARK}%s{MISSING_TAIL}\\n\", name);\n    fflush(stderr);\n    \
         _exit({MISSING_EXIT});\n}}"
    );
    for n in &missing {
        let _ = writeln!(c, "void {n}(void) {{ mpi_suite_missing(\"{n}\"); }}");
        let _ = writeln!(c, "void P{n}(void) {{ mpi_suite_missing(\"{n}\"); }}");
    }
    let src = dir.join("missing.c");
    let so = dir.join("libmpi_missing.so");
    if fs::read_to_string(&src).ok().as_deref() != Some(c.as_str()) || !so.exists() {
        fs::write(&src, &c)?;
        let out = Command::new("cc")
            .args(["-O1", "-shared", "-fPIC", "-o"])
            .arg(&so)
            .arg(&src)
            .output()
            .context("running cc")?;
        if !out.status.success() {
            bail!("building {}: {}", so.display(), first_error(&String::from_utf8_lossy(&out.stderr)));
        }
    }
    Ok(missing)
}

/// A built test: its program and the missing functions its own source calls.
struct Built {
    exe: PathBuf,
    own_missing: Vec<String>,
}

/// Builds one test program; returns it or the build error.
fn build_test(
    p: &Paths,
    helpers: &Path,
    missing: &std::collections::BTreeSet<String>,
    e: &Entry,
) -> std::result::Result<Built, String> {
    let (dir, prog) = e.name.rsplit_once('/').unwrap_or(("", e.name.as_str()));
    let (sources, flags) = variant(&p.suite.join(dir), prog);
    let exe = p.build.join("bin").join(&e.name);
    let mut objs = Vec::new();
    let mut undefined = String::new();
    for (i, name) in sources.iter().enumerate() {
        let src = p.suite.join(dir).join(name);
        if !src.exists() {
            return Err(format!("no source {}", src.display()));
        }
        let tail = if i == 0 { String::new() } else { format!(".{i}") };
        let obj = p.build.join("obj").join(format!("{}{tail}.o", e.name));
        for f in [&exe, &obj] {
            if let Some(dir) = f.parent() {
                fs::create_dir_all(dir).map_err(|e| e.to_string())?;
            }
        }
        if newer(&src, &obj) {
            if let Err(e) = p.compile_with(&src, &obj, &flags) {
                let _ = fs::remove_file(&obj);
                return Err(e);
            }
        }
        if i == 0 {
            undefined = Command::new("nm")
                .arg("-u")
                .arg(&obj)
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
        }
        objs.push(obj);
    }
    let sh = p.build.join("missing/libmpi_missing.so");
    let own_missing = undefined
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .filter(|n| missing.contains(*n))
        .map(str::to_string)
        .collect();
    if objs.iter().any(|o| newer(o, &exe)) || newer(helpers, &exe) || newer(&sh, &exe) {
        let out = Command::new(&p.mpicc)
            .args(&objs)
            .arg(helpers)
            .arg(format!("-L{}", p.build.join("missing").display()))
            .args(["-Wl,--no-as-needed", "-lmpi_missing", "-lm", "-o"])
            .arg(&exe)
            .output()
            .map_err(|err| format!("running {}: {err}", p.mpicc.display()))?;
        if !out.status.success() {
            let _ = fs::remove_file(&exe);
            return Err(first_error(&String::from_utf8_lossy(&out.stderr)));
        }
    }
    Ok(Built { exe, own_missing })
}

/// The C sources and extra preprocessor flags of program `prog` of the
/// suite folder `dir`, as its `Makefile.am` gives them
/// (`prog_SOURCES`, `prog_CPPFLAGS`: one source built several ways, or a
/// program of several sources); `prog.c` and no flags otherwise.
fn variant(dir: &Path, prog: &str) -> (Vec<String>, Vec<String>) {
    let text = fs::read_to_string(dir.join("Makefile.am")).unwrap_or_default().replace("\\\n", " ");
    let field = |what: &str| {
        text.lines().find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == format!("{prog}_{what}")).then(|| v.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        })
    };
    let sources: Vec<String> = field("SOURCES")
        .map(|v| v.into_iter().filter(|f| f.ends_with(".c")).collect())
        .filter(|v: &Vec<String>| !v.is_empty())
        .unwrap_or_else(|| vec![format!("{prog}.c")]);
    let flags = field("CPPFLAGS").unwrap_or_default().into_iter().filter(|f| !f.starts_with("$(")).collect();
    (sources, flags)
}

/// A job id for the launch environment: nonzero, unique per run.
fn job_id(counter: u32) -> u32 {
    let pid = std::process::id() & 0xfff;
    0x5e00_0000 | pid << 12 | (counter & 0xfff)
}

/// Removes what the ranks of `job` left in /dev/shm (a killed rank
/// leaves its endpoint files).
fn clean_shm(job: u32) {
    let mark = format!("4d50{job:08x}");
    if let Ok(rd) = fs::read_dir("/dev/shm") {
        for f in rd.flatten() {
            if f.file_name().to_string_lossy().contains(&mark) {
                let p = f.path();
                let _ = if p.is_dir() { fs::remove_dir_all(&p) } else { fs::remove_file(&p) };
            }
        }
    }
}

fn kill_all(children: &mut [Child]) {
    for c in children.iter_mut() {
        let _ = c.kill();
    }
    for c in children.iter_mut() {
        let _ = c.wait();
    }
}

/// Copies program `exe` and the stand-in library into the shared folder
/// `share` (`HOST=GUEST`), points the launcher's ranks at the library, and
/// returns the program's path as the ranks see it.
fn shared(p: &Paths, share: &str, exe: &Path, cmd: &mut Command) -> Result<PathBuf> {
    let (host, guest) = share.split_once('=').context("--share wants HOST=GUEST")?;
    let (host, guest) = (Path::new(host), Path::new(guest));
    fs::create_dir_all(host.join("missing"))?;
    let lib = "libmpi_missing.so";
    fs::copy(p.build.join("missing").join(lib), host.join("missing").join(lib))
        .with_context(|| format!("copying {lib} into {}", host.display()))?;
    // dir-name: the suite has programs of one name in several folders.
    let part = |q: Option<&Path>| q.and_then(Path::file_name).map(|s| s.to_string_lossy().into_owned());
    let name = match (part(exe.parent()), part(Some(exe))) {
        (Some(dir), Some(file)) => format!("{dir}-{file}"),
        _ => bail!("{} is not dir/name", exe.display()),
    };
    fs::copy(exe, host.join(&name)).with_context(|| format!("copying {} into {}", exe.display(), host.display()))?;
    cmd.arg("--env").arg(format!("LD_LIBRARY_PATH=/usr/local/lib:{}", guest.join("missing").display()));
    Ok(guest.join(name))
}

/// Runs one built test; returns the outcome and the ranks' output.
fn run_test(p: &Paths, args: &Args, e: &Entry, exe: &Path, job: u32) -> Result<(Outcome, String)> {
    let logs = p.build.join("logs").join(&e.name);
    fs::create_dir_all(&logs)?;
    let rundir = p.build.join("run");
    fs::create_dir_all(&rundir)?;
    let mut children = Vec::new();
    let mut files = Vec::new();
    let launch = |cmd: &mut Command, log: &Path| -> Result<Child> {
        let f = fs::File::create(log)?;
        let g = f.try_clone()?;
        Ok(cmd.current_dir(&rundir).stdin(Stdio::null()).stdout(f).stderr(g).spawn()?)
    };
    if let Some(mpiexec) = &args.mpiexec {
        let log = logs.join("out");
        let limit = e.limit(args.timeout).to_string();
        let mut words = mpiexec.split_whitespace().map(|w| if w == "{timeout}" { limit.as_str() } else { w });
        let mut cmd = Command::new(words.next().context("--mpiexec is empty")?);
        cmd.args(words);
        let prog = match &args.share {
            Some(share) => shared(p, share, exe, &mut cmd)?,
            None => exe.to_path_buf(),
        };
        cmd.arg("-n").arg(e.nprocs.to_string()).arg(prog).args(&e.args);
        children.push(launch(&mut cmd, &log)?);
        files.push(log);
    } else {
        for r in 0..e.nprocs {
            let log = logs.join(format!("rank{r}"));
            let mut cmd = Command::new(exe);
            cmd.args(&e.args)
                .env("MCMPI_JOB", job.to_string())
                .env("MCMPI_RANK", r.to_string())
                .env("MCMPI_SIZE", e.nprocs.to_string())
                .env("LD_LIBRARY_PATH", format!("{}:{}", p.lib.display(), p.build.join("missing").display()));
            children.push(launch(&mut cmd, &log)?);
            files.push(log);
        }
    }
    let launcher_limits = args.mpiexec.as_deref().is_some_and(|m| m.split_whitespace().any(|w| w == "{timeout}"));
    let deadline = Instant::now() + Duration::from_secs(e.limit(args.timeout) + if launcher_limits { 20 } else { 0 });
    let mut codes: Vec<Option<std::process::ExitStatus>> = vec![None; children.len()];
    let mut first_bad: Option<Instant> = None;
    let timed_out = loop {
        for (i, c) in children.iter_mut().enumerate() {
            if codes[i].is_none() {
                if let Some(st) = c.try_wait()? {
                    if !st.success() && first_bad.is_none() {
                        first_bad = Some(Instant::now());
                    }
                    codes[i] = Some(st);
                }
            }
        }
        if codes.iter().all(Option::is_some) {
            break false;
        }
        // A rank that failed: the others get a few seconds, then are ended.
        let grace = first_bad.is_some_and(|t| t.elapsed() > Duration::from_secs(5));
        if Instant::now() >= deadline || grace {
            kill_all(&mut children);
            break !grace;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    if args.mpiexec.is_none() {
        clean_shm(job);
    }
    let mut output = String::new();
    for (i, f) in files.iter().enumerate() {
        let text = fs::read_to_string(f).unwrap_or_default();
        if !text.is_empty() {
            for line in text.lines() {
                let _ = writeln!(output, "[{i}] {line}");
            }
        }
    }
    if timed_out {
        return Ok((Outcome::Timeout, output));
    }
    // "rank 0: exit status: 1; ranks 1-3: ended after another rank failed"
    let mut bad: Vec<(String, Vec<usize>)> = Vec::new();
    for (i, c) in codes.iter().enumerate() {
        let what = match c {
            Some(st) if st.success() => continue,
            Some(st) => st.to_string(),
            None => "ended after another rank failed".to_string(),
        };
        match bad.iter_mut().find(|b| b.0 == what) {
            Some(b) => b.1.push(i),
            None => bad.push((what, vec![i])),
        }
    }
    let bad: Vec<String> = bad
        .into_iter()
        .map(|(what, ranks)| match ranks.as_slice() {
            [one] => format!("rank {one}: {what}"),
            many => format!("{} ranks: {what}", many.len()),
        })
        .collect();
    // A function the library lacks: our stand-in's message, or the
    // library's own MPI_ERR_UNSUPPORTED_OPERATION message naming it.
    let called_missing: Vec<&str> = output
        .lines()
        .filter_map(|l| {
            let named = l.split_once(MISSING_MARK).and_then(|x| x.1.strip_suffix(MISSING_TAIL));
            named.or_else(|| {
                let (_, rest) = l.split_once("): ")?;
                let (name, _) = rest.split_once(UNSUPPORTED_TAIL)?;
                Some(name.trim())
            })
        })
        .collect();
    let outcome = if let Some(f) = called_missing.first() {
        Outcome::Missing(f.to_string())
    } else if !bad.is_empty() {
        let why = output
            .lines()
            .find(|l| l.contains("MPI error"))
            .or_else(|| output.lines().find(|l| l.contains("rror") || l.contains("panicked")))
            .map(|l| format!(": {}", l.trim()))
            .unwrap_or_default();
        Outcome::Fail(format!("{}{why}", bad.join("; ")))
    } else if !output.contains(" No Errors") && !output.contains(" No errors") {
        let hint = output
            .lines()
            .find(|l| l.contains("rror"))
            .or_else(|| output.lines().next())
            .unwrap_or("no output")
            .trim()
            .to_string();
        Outcome::Fail(format!("exit 0 but no \" No Errors\": {hint}"))
    } else {
        Outcome::Pass
    };
    Ok((outcome, output))
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("mpi-suite: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<bool> {
    let args = Args::parse();
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let repo = repo.canonicalize().unwrap_or(repo);
    let cache = std::env::var_os("MC_CACHE").map_or_else(|| repo.join(".cache"), PathBuf::from);
    let src = args.src.clone().unwrap_or_else(|| cache.join("mpich-src"));
    let suite = src.join("test/mpi");
    if !suite.join("util/mtest.c").exists() {
        bail!("MPICH's test suite is not at {} (run scripts/setup.sh --only mpich-suite)", suite.display());
    }
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| repo.join("target"), PathBuf::from);
    let p = Paths {
        suite,
        build: args.build.clone().unwrap_or_else(|| cache.join("mpich-suite-build")),
        mpicc: args.mpicc.clone().unwrap_or_else(|| repo.join("guest/msg/mpi/mpicc")),
        lib: args.lib.clone().unwrap_or_else(|| target.join("release")),
    };
    if !p.lib.join("libmpi_abi.so.1").exists() {
        bail!("{} has no libmpi_abi.so.1 (run scripts/build-mpi.sh)", p.lib.display());
    }
    let list_path = args.list.clone().unwrap_or_else(|| repo.join("tests/mpich-suite.list"));
    let text = fs::read_to_string(&list_path).with_context(|| format!("reading {}", list_path.display()))?;
    let entries: Vec<Entry> = parse_list(&text)?
        .into_iter()
        .filter(|e| args.filter.is_empty() || args.filter.iter().any(|f| e.name.contains(f.as_str())))
        .collect();
    if entries.is_empty() {
        bail!("no tests selected");
    }
    fs::create_dir_all(&p.build)?;
    let helpers = build_helpers(&p)?;
    let mut missing = build_missing(&p, &repo.join("guest/msg/mpi/include/mpi.h"))?;
    // The functions the library exports but does not implement yet
    // (each fails with MPI_ERR_UNSUPPORTED_OPERATION), one "MPI_X / PMPI_X," a line.
    let unsupported = fs::read_to_string(repo.join("guest/msg/mpi/src/ffi/missing.rs")).unwrap_or_default();
    missing.extend(unsupported.lines().filter_map(|l| {
        let (name, rest) = l.trim().split_once(" / ")?;
        (name.starts_with("MPI_") && rest.starts_with('P')).then(|| name.to_string())
    }));
    println!(
        "mpi-suite: {} tests from {} (MPICH {}), built in {}",
        entries.len(),
        list_path.display(),
        fs::read_to_string(src.join(".done")).unwrap_or_default().trim(),
        p.build.display()
    );
    let total = entries.len();
    let mut rows = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        let label = format!("{} {}", e.name, e.args.join(" "));
        print!("[{:>3}/{total}] {:<40} {:>2} ranks ... ", i + 1, label.trim(), e.nprocs);
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
        let t0 = Instant::now();
        let mut own = Vec::new();
        let built = if e.skipped() { Err(String::new()) } else { build_test(&p, &helpers, &missing, e) };
        let (outcome, output) = match built {
            Err(_) if e.skipped() => (Outcome::Skipped, String::new()),
            Err(msg) => (Outcome::Build(msg), String::new()),
            Ok(b) if args.build_only => {
                own = b.own_missing;
                (Outcome::Pass, String::new())
            }
            Ok(b) => {
                own = b.own_missing;
                run_test(&p, &args, e, &b.exe, job_id(i as u32 + 1))?
            }
        };
        let secs = t0.elapsed().as_secs_f64();
        let detail = match &outcome {
            Outcome::Pass => String::new(),
            Outcome::Build(m) | Outcome::Fail(m) => m.clone(),
            Outcome::Timeout => format!("killed after {} s", e.limit(args.timeout)),
            Outcome::Missing(f) => format!("needs {f}"),
            Outcome::Skipped => e.status.clone(),
        };
        println!("{} ({secs:.1} s) {detail}", outcome.word());
        if args.verbose && outcome != Outcome::Pass && !output.is_empty() {
            for line in output.lines().take(30) {
                println!("        {line}");
            }
        }
        rows.push((e.clone(), outcome, secs, own));
    }
    if args.build_only {
        let built = rows.iter().filter(|r| r.1 == Outcome::Pass).count();
        println!("\nmpi-suite: built {built} of {total}");
        return Ok(built == total);
    }
    println!();
    println!("{:<36} {:>5}  {:<8} {:>7}  listed as", "test", "ranks", "result", "secs");
    println!("{}", "-".repeat(96));
    let mut regressions = Vec::new();
    let mut newly = Vec::new();
    let mut needed: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
    let mut blocking: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
    for (e, o, secs, own) in &rows {
        if *o != Outcome::Pass {
            for f in own {
                *needed.entry(f.as_str()).or_default() += 1;
            }
        }
        if let Outcome::Missing(f) = o {
            *blocking.entry(f.as_str()).or_default() += 1;
        }
        let label = format!("{} {}", e.name, e.args.join(" "));
        println!("{:<36} {:>5}  {:<8} {:>7.1}  {}", label.trim(), e.nprocs, o.word(), secs, e.status);
        match (e.expected_pass(), *o == Outcome::Pass) {
            (true, false) => regressions.push(e.name.clone()),
            (false, true) => newly.push(e.name.clone()),
            _ => {}
        }
    }
    let passed = rows.iter().filter(|r| r.1 == Outcome::Pass).count();
    let skipped = rows.iter().filter(|r| r.1 == Outcome::Skipped).count();
    println!("{}", "-".repeat(96));
    println!("mpi-suite: {passed} of {total} passed ({skipped} not run)");
    let by_count = |m: std::collections::BTreeMap<&str, usize>| {
        let mut by: Vec<(&str, usize)> = m.into_iter().collect();
        by.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        by.iter().map(|(f, n)| format!("{f} {n}")).collect::<Vec<String>>().join(", ")
    };
    if !blocking.is_empty() {
        println!("mpi-suite: first missing function each test stopped at (tests): {}", by_count(blocking));
    }
    if !needed.is_empty() {
        println!("mpi-suite: missing functions the failing tests' own sources call (tests): {}", by_count(needed));
    }
    if !newly.is_empty() {
        println!("mpi-suite: listed as not passing but passed: {}", newly.join(" "));
    }
    if !regressions.is_empty() {
        println!("mpi-suite: listed as passing but did not pass: {}", regressions.join(" "));
    }
    Ok(regressions.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_lines_parse() {
        let l = parse_list("# c\n\npt2pt/sendrecv2 2  # pass\ncoll/allred 4 -count=10 # needs X\n").unwrap();
        assert_eq!(l.len(), 2);
        assert_eq!(l[1].args, vec!["-count=10"]);
        assert!(l[0].expected_pass());
        assert!(!l[1].expected_pass());
        assert!(parse_list("pt2pt/x\n").is_err());
        assert!(parse_list("x 2\n").is_err());
    }

    #[test]
    fn a_time_limit_is_taken_out_of_the_arguments_and_only_raises_the_runs() {
        let l = parse_list("comm/ctxsplit 4 timeLimit=300 --loopcount 9 # pass\npt2pt/a 2 # pass\n").unwrap();
        assert_eq!(l[0].args, vec!["--loopcount", "9"]);
        assert_eq!((l[0].time_limit, l[0].limit(60), l[0].limit(400)), (Some(300), 300, 400));
        assert_eq!((l[1].time_limit, l[1].limit(60)), (None, 60));
        let e = parse_list("comm/x 4 timeLimit=soon\n").unwrap_err();
        assert!(format!("{e:#}").contains("bad timeLimit 'soon'"), "{e:#}");
        assert!(parse_list("comm/x 4 timeLimit=0\n").is_err());
    }
}
