//! Helpers for the QEMU tier: a running cluster driven through the real
//! `mc-cluster` binary, torn down when the test ends (even on panic).
//!
//! The binaries are the release builds `scripts/setup.sh` makes
//! (`target/release`); `MC_BIN_DIR` points elsewhere.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Condvar, Mutex, MutexGuard};

/// QEMU-tier tests boot guests: run them one at a time on this 2-core machine
/// even when the harness runs tests in parallel. True while one holds it.
static SERIAL: (Mutex<bool>, Condvar) = (Mutex::new(false), Condvar::new());

/// The one-cluster-at-a-time lock, held until dropped (a guard that may
/// move between threads, so that a shared [`Cluster`] can live in a static).
pub struct Serial(());

impl Drop for Serial {
    fn drop(&mut self) {
        *SERIAL.0.lock().unwrap_or_else(|e| e.into_inner()) = false;
        SERIAL.1.notify_one();
    }
}

/// Holds the one-cluster-at-a-time lock (for tests that drive `mc-cluster` by hand).
pub fn serial() -> Serial {
    assert!(
        SHARED.get().is_none(),
        "this test file shares one cluster (tests::shared): all its QEMU tests must use it"
    );
    let mut held = SERIAL.0.lock().unwrap_or_else(|e| e.into_inner());
    while *held {
        held = SERIAL.1.wait(held).unwrap_or_else(|e| e.into_inner());
    }
    *held = true;
    Serial(())
}

/// The cluster the tests of one file share ([`shared`]).
static SHARED: std::sync::OnceLock<Mutex<Cluster>> = std::sync::OnceLock::new();

/// Brought down when the test process exits (the harness exits through
/// `exit`, which runs this; statics are never dropped).
extern "C" fn down_shared() {
    if let Some(c) = SHARED.get() {
        c.lock().unwrap_or_else(|e| e.into_inner()).down();
    }
}

/// One cluster for all the QEMU tests of a file, booted by the first that
/// asks and brought down when the test process exits: each test holds it
/// while it runs. Tests of the same shape share it instead of each booting
/// its own (a 4-guest boot is a minute of CI under TCG); they must leave it
/// as they found it (links up, nothing running). Every QEMU test of such a
/// file must use it.
pub fn shared(name: &str, nodes: usize, extra: &[&str]) -> MutexGuard<'static, Cluster> {
    let c = SHARED.get_or_init(|| {
        let c = Cluster::up_with(name, nodes, extra);
        // SAFETY: registers a plain function taking no arguments to run at
        // exit; it only reads a static.
        unsafe { libc::atexit(down_shared) };
        Mutex::new(c)
    });
    let c = c.lock().unwrap_or_else(|e| e.into_inner());
    assert!(c.name == name && c.nodes == nodes, "one shared cluster per file: {} with {} nodes", c.name, c.nodes);
    c
}

/// Repository root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The set-up cache (`$MC_CACHE`, else `.cache` in the repository).
pub fn cache() -> PathBuf {
    std::env::var_os("MC_CACHE").map(PathBuf::from).unwrap_or_else(|| root().join(".cache"))
}

/// Host binary `name` (`mc-cluster`, `mc-hub`, `mc-adapter`): in
/// `$MC_BIN_DIR`, else `target/release`.
pub fn host_bin(name: &str) -> PathBuf {
    let dir = std::env::var_os("MC_BIN_DIR").map(PathBuf::from).unwrap_or_else(|| root().join("target/release"));
    let p = dir.join(name);
    assert!(p.exists(), "{} missing: run scripts/setup.sh (or scripts/test.sh)", p.display());
    p
}

/// The `mc-cluster` binary.
pub fn launcher() -> PathBuf {
    host_bin("mc-cluster")
}

/// A cluster that is up; `down` runs on drop.
pub struct Cluster {
    /// Cluster name (its run folder is `.run/<name>`).
    pub name: String,
    /// Node count.
    pub nodes: usize,
    /// Output of `up` (progress lines).
    pub up_output: String,
    _serial: Serial,
}

impl Cluster {
    /// Brings up `nodes` nodes under `name`; panics with the launcher's output on failure.
    pub fn up(name: &str, nodes: usize) -> Cluster {
        Self::up_with(name, nodes, &[])
    }

    /// Like [`Cluster::up`], without imcd in the guests: the device-level
    /// `mctool` commands own the adapter (`qemu-configs/raw-adapter.toml`).
    pub fn up_raw(name: &str, nodes: usize) -> Cluster {
        let cfg = root().join("qemu-configs/raw-adapter.toml");
        Self::up_with(name, nodes, &["--config", cfg.to_str().unwrap()])
    }

    /// Like [`Cluster::up`], as the cluster for MPI jobs
    /// (`qemu-configs/mpi.toml`, which `scripts/mpi-bench.sh` boots):
    /// stores sent from the vCPU thread, QEMU's I/O threads real-time.
    pub fn up_mpi(name: &str, nodes: usize) -> Cluster {
        let cfg = root().join("qemu-configs/mpi.toml");
        Self::up_with(name, nodes, &["--config", cfg.to_str().unwrap()])
    }

    /// Like [`Cluster::up`] with extra `up` arguments (`--config FILE`).
    /// `MC_TEST_ADAPTERS=per-guest` (or `in-hub`) chooses where the
    /// adapters run, for configs that leave it to the default.
    pub fn up_with(name: &str, nodes: usize, extra: &[&str]) -> Cluster {
        let serial = serial();
        let mut cmd = Command::new(launcher());
        cmd.args(["--name", name, "up", "--nodes", &nodes.to_string()]).args(extra);
        if let Ok(a) = std::env::var("MC_TEST_ADAPTERS") {
            cmd.args(["--adapters", &a]);
        }
        let out = cmd.output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        let c = Cluster { name: name.into(), nodes, up_output: text.clone(), _serial: serial };
        assert!(out.status.success(), "mc-cluster up failed:\n{text}");
        c
    }

    /// Run folder.
    pub fn run_dir(&self) -> PathBuf {
        let base = std::env::var_os("MC_RUN_DIR").map(PathBuf::from).unwrap_or_else(|| root().join(".run"));
        base.join(&self.name)
    }

    /// Runs a command in node `node` through `mc-cluster exec`.
    pub fn exec(&self, node: usize, argv: &[&str]) -> Output {
        let mut cmd = Command::new(launcher());
        cmd.args(["--name", &self.name, "exec", &node.to_string(), "--timeout", "120", "--"]).args(argv);
        cmd.output().unwrap()
    }

    /// Runs a command and insists on success; returns stdout.
    pub fn run(&self, node: usize, argv: &[&str]) -> Vec<u8> {
        let out = self.exec(node, argv);
        assert!(
            out.status.success(),
            "node {node}: {argv:?} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }

    /// `mc-cluster hub -- ARGS` (hub control: link-down, corrupt, stats…); panics on failure.
    pub fn hub(&self, args: &[&str]) -> String {
        let out = Command::new(launcher()).args(["--name", &self.name, "hub", "--"]).args(args).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "mc-cluster hub {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        text
    }

    /// Runs `argv` on `node` until its stdout satisfies `pred` (or panics after `secs`).
    pub fn poll_until(&self, node: usize, argv: &[&str], secs: u64, pred: impl Fn(&str) -> bool) -> String {
        let t0 = std::time::Instant::now();
        loop {
            let out = String::from_utf8_lossy(&self.exec(node, argv).stdout).into_owned();
            if pred(&out) {
                return out;
            }
            assert!(
                t0.elapsed().as_secs() < secs,
                "node {node}: {argv:?} never gave the expected output; last:\n{out}"
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }

    /// `mctool info --json` on `node`: the adapter's registers as one object.
    pub fn mctool_info(&self, node: usize) -> serde_json::Value {
        let out = self.run(node, &["mctool", "info", "--json"]);
        serde_json::from_slice(&out)
            .unwrap_or_else(|e| panic!("node {node}: mctool info --json: {e}: {}", String::from_utf8_lossy(&out)))
    }

    /// [`Cluster::mctool_info`] on `node` until `pred` holds (panics after 20 s).
    pub fn poll_info(&self, node: usize, pred: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
        let t0 = std::time::Instant::now();
        loop {
            let info = self.mctool_info(node);
            if pred(&info) {
                return info;
            }
            assert!(t0.elapsed().as_secs() < 20, "node {node}: mctool info never matched; last: {info}");
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }

    /// Starts shell command `cmd` in the background on `node`; its output
    /// goes to `/tmp/<tag>.log` and its exit code to `/tmp/<tag>.rc`.
    pub fn background(&self, node: usize, tag: &str, cmd: &str) {
        self.run(node, &["sh", "-c", &format!("({cmd} > /tmp/{tag}.log 2>&1; echo $? > /tmp/{tag}.rc) &")]);
    }

    /// The log so far of a [`Cluster::background`] command.
    pub fn background_log(&self, node: usize, tag: &str) -> String {
        String::from_utf8_lossy(&self.exec(node, &["cat", &format!("/tmp/{tag}.log")]).stdout).into_owned()
    }

    /// Waits (up to `secs`) for a [`Cluster::background`] command to end;
    /// returns its exit code (as written) and its log.
    pub fn background_result(&self, node: usize, tag: &str, secs: u64) -> (String, String) {
        let rc = self
            .poll_until(node, &["sh", "-c", &format!("cat /tmp/{tag}.rc 2>/dev/null")], secs, |o| !o.trim().is_empty());
        (rc.trim().to_string(), self.background_log(node, tag))
    }

    /// The last lines of every guest's imcd and mpid logs, the processes
    /// running there, and the supervisor's log: what a failed test prints
    /// so that a CI failure can be read without a rerun.
    pub fn guest_logs(&self) -> String {
        let mut out = String::new();
        for n in 0..self.nodes {
            let o = self.exec(
                n,
                &[
                    "sh",
                    "-c",
                    "tail -n 40 /var/log/imcd.log; echo '-- mpid'; tail -n 20 /var/log/mpid.log; echo '-- ps'; ps",
                ],
            );
            out += &format!(
                "==== node {n} ({}):\n{}{}\n",
                o.status,
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        let sup = std::fs::read_to_string(self.run_dir().join("supervisor.log")).unwrap_or_default();
        let tail: Vec<&str> = sup.lines().rev().take(30).collect();
        out += "==== supervisor.log\n";
        for l in tail.into_iter().rev() {
            out += l;
            out.push('\n');
        }
        out
    }

    /// Waits until imcd (started at boot) serves on every node.
    pub fn imcd_ready(&self) {
        for n in 0..self.nodes {
            self.poll_until(n, &["cat", "/var/log/imcd.log"], 60, |o| o.contains("listening"));
        }
    }

    /// `mc-cluster down`; returns its output.
    pub fn down(&self) -> String {
        let out = Command::new(launcher()).args(["--name", &self.name, "down"]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
    }

    /// Builds the C program `src` statically against the installed guest
    /// library `lib` (its `pkg-config` file; scripts/setup.sh installs the
    /// guest libraries in target/guest/c) into the cluster's shared folder;
    /// returns its path in the guests.
    pub fn share_c(&self, lib: &str, src: &Path) -> String {
        let prefix = root().join("target/guest/c");
        let pc = Command::new("pkg-config")
            .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig"))
            .args(["--static", "--cflags", "--libs", lib])
            .output()
            .unwrap();
        assert!(
            pc.status.success(),
            "pkg-config {lib} (run scripts/setup.sh): {}",
            String::from_utf8_lossy(&pc.stderr)
        );
        let flags = String::from_utf8_lossy(&pc.stdout).into_owned();
        let share = self.run_dir().join("share");
        std::fs::create_dir_all(&share).unwrap();
        let name = src.file_stem().unwrap().to_string_lossy().into_owned();
        let o = Command::new("gcc")
            .args(["-O2", "-Wall", "-static", "-Wl,--no-warnings", "-o"])
            .arg(share.join(&name))
            .arg(src)
            .args(flags.split_whitespace())
            .output()
            .unwrap();
        assert!(o.status.success(), "building {}: {}", src.display(), String::from_utf8_lossy(&o.stderr));
        format!("/share/{name}")
    }

    /// `state.json` of the running cluster.
    pub fn state(&self) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(self.run_dir().join("state.json")).unwrap()).unwrap()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.down();
    }
}

/// The value of `key=` in `line` (the `key=value` reports of `mctool`).
pub fn field(line: &str, key: &str) -> u64 {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key}= in: {line}"))
}

/// Checks the logs of an `mctool order-test` run of `plan` (block size,
/// rounds): the writer finished, the checker saw no flag before its
/// block, checked every size and saw every size's last flag.
pub fn assert_order_test(plan: &[(u64, u64)], (wrc, wlog): (&str, &str), (crc, clog): (&str, &str)) {
    assert_eq!(wrc, "0", "writer failed:\n{wlog}");
    let total = clog.lines().find(|l| l.starts_with("checker total")).unwrap_or_else(|| panic!("{clog}"));
    assert_eq!(field(total, "violations"), 0, "a flag was seen before the block stored ahead of it:\n{clog}");
    for &(size, rounds) in plan {
        let line = clog
            .lines()
            .find(|l| l.starts_with(&format!("checker size={size} ")))
            .unwrap_or_else(|| panic!("no result for size {size}:\n{clog}"));
        assert!(field(line, "checks") > 0, "size {size}: no flag observed and checked, nothing tested:\n{clog}");
        assert_eq!(field(line, "last_flag"), rounds, "size {size}: the last round's flag never arrived:\n{clog}");
    }
    assert_eq!(crc, "0", "checker failed:\n{clog}");
}

impl Cluster {
    /// Builds the C program `tests/mpi/NAME.c` with our `mpicc` into the
    /// shared folder (`/share/NAME` in the guests).
    pub fn mpicc(&self, name: &str) {
        let out = self.run_dir().join("share").join(name);
        let o = Command::new(root().join("guest/msg/mpi/mpicc"))
            .args(["-O1", "-o"])
            .arg(&out)
            .arg(root().join(format!("tests/mpi/{name}.c")))
            .output()
            .unwrap();
        assert!(o.status.success(), "mpicc {name}: {}", String::from_utf8_lossy(&o.stderr));
    }

    /// `mc-cluster mpirun ARGS` (at most 300 s): exit code and output.
    pub fn mpirun(&self, args: &[&str]) -> (Option<i32>, String) {
        let o = Command::new("timeout")
            .arg("300")
            .arg(launcher())
            .args(["--name", &self.name, "mpirun"])
            .args(args)
            .output()
            .unwrap();
        (o.status.code(), String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr))
    }
}

/// Runs `cmd`, panics with its status and output unless it succeeds;
/// its standard output.
pub fn run_ok(cmd: &mut std::process::Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
