//! `mc-cluster`: brings up a virtual MEMORY CHANNEL cluster (hub, one
//! adapter and one QEMU guest per node), runs commands in its guests and
//! tears it down without leaving a process or a socket behind.
//!
//! # Layout
//! - [`config`]: cluster definitions (`qemu-configs/*.toml`) and paths.
//! - [`supervisor`]: the background process that owns a running cluster.
//! - [`agent`]: talking to the guest agents.
//! - [`hosts`]: the machines the processes run on, and their ways in.
//! - [`kvm`]: whether KVM really runs guests here.
//! - [`lan`]: the guests' LAN (tap on a bridge, or a multicast group).
//! - [`monitor`]: the live page in the browser (`mc-cluster monitor`).
//! - [`priority`]: which host threads run at real-time priority.
//! - [`qmp`]: talking to a guest's QEMU (`unplug`, `plug`).
//! - this file: the `up`, `down`, `status`, `restart`, `exec`, `cp`,
//!   `mpirun`, `unplug` and `plug` operations.
#![warn(missing_docs)]

pub mod agent;
pub mod config;
pub mod conform;
pub mod hosts;
pub mod kvm;
pub mod lan;
pub mod monitor;
pub mod priority;
pub mod qmp;
pub mod supervisor;

use std::fs;
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use config::{Config, Paths};
use supervisor::{Plan, State, Status};

/// Options of `up`.
#[derive(Debug, Clone)]
pub struct UpOptions {
    /// Cluster name (run folder `.run/<name>`).
    pub name: String,
    /// Node count (default: the config's).
    pub nodes: Option<usize>,
    /// Config file (default: `qemu-configs/default.toml`).
    pub config: Option<PathBuf>,
    /// Overrides `[cluster] adapters` (`in-hub` or `per-guest`).
    pub adapters: Option<String>,
    /// Host folder shared into every guest at [`config::GUEST_SHARE`]
    /// (overrides `[guest] share`; default `<run>/share`).
    pub share: Option<PathBuf>,
}

/// True when `pid` runs (a zombie, exited but not yet reaped, does not count).
pub fn pid_alive(pid: u32) -> bool {
    if pid == 0 {
        return false;
    }
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

/// Pids of every process whose command line mentions `dir` (our children all
/// take their sockets under the run folder, so this finds them all).
pub fn processes_mentioning(dir: &Path) -> Vec<u32> {
    let needle = dir.as_os_str().as_encoded_bytes();
    let me = std::process::id();
    let mut out = Vec::new();
    for e in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        if pid == me {
            continue;
        }
        let Ok(cmd) = fs::read(e.path().join("cmdline")) else { continue };
        if cmd.windows(needle.len()).any(|w| w == needle) {
            out.push(pid);
        }
    }
    out
}

/// Runs `mc-hub ctl --control <run>/hub.ctl ARGS…` for cluster `name`
/// (fault injection and counters); returns the hub's answer.
pub fn hub_ctl(paths: &Paths, name: &str, args: &[String]) -> Result<String> {
    let rd = paths.run_dir(name);
    let st = State::load(&rd).map_err(|_| anyhow::anyhow!("cluster '{name}' is not up (run 'mc-cluster up' first)"))?;
    if !pid_alive(st.hub_pid) {
        match &st.hub_exit {
            Some(how) => bail!("the hub of cluster '{name}' is not running (it exited: {how}; see events.log)"),
            None => bail!("the hub of cluster '{name}' is not running"),
        }
    }
    let out = Command::new(paths.bin_dir.join("mc-hub"))
        .arg("ctl")
        .arg("--control")
        .arg(rd.join("hub.ctl"))
        .args(args)
        .output()
        .context("cannot run mc-hub")?;
    if !out.status.success() {
        bail!("{}", String::from_utf8_lossy(&out.stderr).trim().trim_start_matches("mc-hub: "));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Asks the supervisor of cluster `name` to carry out `req` (`restart-hub`,
/// `restart-node N`); returns its answer once done.
pub fn restart(paths: &Paths, name: &str, req: &str) -> Result<String> {
    let rd = paths.run_dir(name);
    let st = State::load(&rd).map_err(|_| anyhow::anyhow!("cluster '{name}' is not up (run 'mc-cluster up' first)"))?;
    if st.status != Status::Up || !pid_alive(st.supervisor_pid) {
        bail!("cluster '{name}' is not up (status {:?}; run 'mc-cluster up')", st.status);
    }
    let plan: Plan = serde_json::from_slice(&fs::read(rd.join("plan.json")).context("reading plan.json")?)?;
    // A restart waits for guests to boot (all of them for an in-hub hub restart).
    let timeout = Duration::from_secs(plan.config.qemu.boot_timeout_s + 60);
    supervisor::request(&rd, req, timeout)
}

/// Sockets left in a run folder.
pub fn sockets_in(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "sock" || x == "ctl") {
                out.push(p);
            }
        }
    }
    out
}

fn find_qemu(cfg: &Config, paths: &Paths) -> Result<PathBuf> {
    if !cfg.qemu.binary.is_empty() {
        let p = PathBuf::from(&cfg.qemu.binary);
        if !p.exists() {
            bail!("QEMU not found at {} (qemu.binary in the config): fix the path or leave it empty", p.display());
        }
        return Ok(p);
    }
    let cached = paths.cache.join("qemu-system-x86_64");
    if cached.exists() {
        return Ok(cached);
    }
    if let Some(p) = std::env::var_os("PATH")
        .and_then(|path| std::env::split_paths(&path).map(|d| d.join("qemu-system-x86_64")).find(|p| p.exists()))
    {
        return Ok(p);
    }
    bail!("QEMU not found (no {} and no qemu-system-x86_64 on PATH): run scripts/setup.sh", cached.display())
}

/// Whether KVM runs our guest kernel here; the answer is cached in
/// `<cache>/kvm-probe` per QEMU and kernel, since finding out takes seconds.
fn kvm_works(paths: &Paths, cfg: &Config, qemu: &Path, kernel: &Path) -> Result<(), String> {
    kvm::probe()?;
    let key = format!("{} {}", qemu.display(), kernel.display());
    let cache = paths.cache.join("kvm-probe");
    if let Ok(text) = fs::read_to_string(&cache) {
        if let Some(verdict) = text.strip_prefix(&format!("{key}\n")) {
            return if verdict.trim() == "ok" { Ok(()) } else { Err(verdict.trim().to_string()) };
        }
    }
    eprintln!("checking whether KVM can run the guest kernel (once, up to {:?})...", kvm::BOOT_PROBE_TIMEOUT);
    let r = kvm::probe_boot(qemu, kernel, &cfg.qemu.firmware_dirs);
    let verdict = match &r {
        Ok(()) => "ok".to_string(),
        Err(e) => e.clone(),
    };
    let _ = fs::create_dir_all(&paths.cache);
    let _ = fs::write(&cache, format!("{key}\n{verdict}\n"));
    r
}

/// QEMU's version as (major, minor), from `qemu --version`.
pub fn qemu_version(qemu: &Path) -> Result<(u32, u32)> {
    let out = Command::new(qemu).arg("--version").output().with_context(|| format!("cannot run {}", qemu.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    parse_qemu_version(&text).with_context(|| format!("{} --version said: {}", qemu.display(), text.trim()))
}

/// Parses the first line of `qemu --version` ("QEMU emulator version 10.2.2 (…)").
pub fn parse_qemu_version(text: &str) -> Result<(u32, u32)> {
    let v = text
        .lines()
        .next()
        .and_then(|l| l.split("version ").nth(1))
        .and_then(|v| v.split_whitespace().next())
        .context("no version in the output")?;
    let mut it = v.split('.').map(|x| x.parse::<u32>());
    match (it.next(), it.next()) {
        (Some(Ok(a)), Some(Ok(b))) => Ok((a, b)),
        _ => bail!("cannot read version '{v}'"),
    }
}

fn choose_accel(paths: &Paths, cfg: &Config, qemu: &Path, kernel: &Path) -> Result<String> {
    match cfg.qemu.accel.as_str() {
        "tcg" => Ok("tcg".into()),
        "kvm" => match kvm_works(paths, cfg, qemu, kernel) {
            Ok(()) => Ok("kvm".into()),
            Err(e) => bail!("qemu.accel is kvm but KVM does not work here: {e}; use accel = \"auto\" or \"tcg\""),
        },
        _ => Ok(if kvm_works(paths, cfg, qemu, kernel).is_ok() { "kvm".into() } else { "tcg".into() }),
    }
}

/// The host folder shared into the guests: `--share` (relative to the
/// current folder), else `[guest] share` (relative to the config file's
/// folder), else `<run>/share`. Made absolute; created by `up`.
pub fn share_dir(run_dir: &Path, cli: Option<&Path>, configured: &str, cfg_path: &Path) -> Result<PathBuf> {
    let p = match cli {
        Some(p) => std::env::current_dir()?.join(p),
        None if !configured.is_empty() => {
            cfg_path.parent().map(|d| d.join(configured)).unwrap_or_else(|| PathBuf::from(configured))
        }
        None => run_dir.join(SHARE_DEFAULT),
    };
    if p.exists() && !p.is_dir() {
        bail!("the shared folder {} is not a folder", p.display());
    }
    Ok(p)
}

/// Name of the default shared folder in the run folder; `up` keeps it when
/// it clears the rest.
pub const SHARE_DEFAULT: &str = "share";

/// Builds the plan for `up` and checks every input before anything starts.
pub fn plan(paths: &Paths, opts: &UpOptions) -> Result<Plan> {
    let cfg_path = opts.config.clone().unwrap_or_else(|| paths.default_config());
    let mut cfg = Config::load(&cfg_path)?;
    if let Some(a) = &opts.adapters {
        cfg.cluster.adapters = a.clone();
        cfg.validate().map_err(|e| anyhow::anyhow!("--adapters {a}: {e}"))?;
    }
    let nodes = opts.nodes.unwrap_or(cfg.cluster.nodes);
    cfg.check_nodes(nodes)?;
    let run_dir = paths.run_dir(&opts.name);
    let share = share_dir(&run_dir, opts.share.as_deref(), &cfg.guest.share, &cfg_path)?;
    let qemu = find_qemu(&cfg, paths)?;
    let pick = |configured: &str, default: PathBuf, what: &str| -> Result<PathBuf> {
        let p = if configured.is_empty() { default } else { PathBuf::from(configured) };
        if !p.exists() {
            bail!("guest {what} not found at {}: run scripts/setup.sh", p.display());
        }
        Ok(p)
    };
    // The uncompressed kernel boots through its PVH entry point: under TCG
    // the bzImage's own XZ decompression was 5-6 s of every guest's boot.
    let unpacked = paths.cache.join("kernel/vmlinux");
    let kernel_default = if unpacked.is_file() { unpacked } else { paths.cache.join("kernel/vmlinuz") };
    let kernel = pick(&cfg.guest.kernel, kernel_default, "kernel")?;
    let initrd = pick(&cfg.guest.initrd, paths.cache.join("initramfs.cpio"), "initramfs")?;
    let bin = |name: &str| -> Result<PathBuf> {
        let p = paths.bin_dir.join(name);
        if !p.exists() {
            bail!("{name} not found next to mc-cluster ({}): run scripts/setup.sh", p.display());
        }
        Ok(p)
    };
    let qemu_version = qemu_version(&qemu)?;
    if qemu_version < (10, 1) {
        bail!(
            "{} is QEMU {}.{}: vfio-user-pci needs 10.1 or newer (scripts/setup.sh builds one)",
            qemu.display(),
            qemu_version.0,
            qemu_version.1
        );
    }
    Ok(Plan {
        name: opts.name.clone(),
        nodes,
        run_dir,
        share,
        hub_bin: bin("mc-hub")?,
        adapter_bin: bin("mc-adapter")?,
        accel: choose_accel(paths, &cfg, &qemu, &kernel)?,
        qemu,
        kernel,
        initrd,
        config: cfg,
        host_cpus: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
    })
}

/// Brings a cluster up and returns once every guest answers (printing
/// progress), or tears it down and fails.
pub fn up(paths: &Paths, opts: &UpOptions) -> Result<State> {
    let plan = plan(paths, opts)?;
    let rd = plan.run_dir.clone();
    if let Ok(st) = State::load(&rd) {
        if pid_alive(st.supervisor_pid) && matches!(st.status, Status::Starting | Status::Up) {
            bail!("cluster '{}' is already up (run 'mc-cluster down' first)", opts.name);
        }
    }
    // Anything left from an earlier run that died hard goes first; the
    // default shared folder (files put there for the guests) stays.
    down_dir(&rd)?;
    for e in fs::read_dir(&rd).into_iter().flatten().flatten() {
        let p = e.path();
        if e.file_name() == SHARE_DEFAULT && p.is_dir() {
            continue;
        }
        let r = if p.is_dir() && !p.is_symlink() { fs::remove_dir_all(&p) } else { fs::remove_file(&p) };
        r.with_context(|| format!("cannot clear {}", p.display()))?;
    }
    fs::create_dir_all(&rd).with_context(|| format!("cannot create {}", rd.display()))?;
    fs::create_dir_all(&plan.share)
        .with_context(|| format!("cannot create the shared folder {}", plan.share.display()))?;
    hosts::check(&plan)?;
    fs::write(rd.join("plan.json"), serde_json::to_vec_pretty(&plan)?)?;
    fs::write(rd.join("events.log"), b"")?;
    println!("starting cluster '{}': {} nodes, {} ({})", plan.name, plan.nodes, plan.accel, rd.display());
    println!("  shared folder {} is {} in every guest", plan.share.display(), config::GUEST_SHARE);

    let exe = std::env::current_exe()?;
    let log = fs::File::create(rd.join("supervisor.log"))?;
    let mut cmd = Command::new(exe);
    cmd.arg("supervise").arg("--run-dir").arg(&rd).stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log);
    // SAFETY: setsid(2) between fork and exec: the supervisor gets its own
    // session so a Ctrl-C in this terminal reaches it only through us.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut sup = cmd.spawn().context("cannot start the supervisor")?;

    let interrupted = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGINT, interrupted.clone())?;
    signal_hook::flag::register(signal_hook::consts::SIGTERM, interrupted.clone())?;
    let mut events = BufReader::new(fs::File::open(rd.join("events.log"))?);
    let mut line = String::new();
    let t0 = Instant::now();
    loop {
        line.clear();
        let pos = events.stream_position()?;
        if events.read_line(&mut line)? > 0 && line.ends_with('\n') {
            let l = line.trim_end();
            println!("  [{:5.1}s] {l}", t0.elapsed().as_secs_f64());
            if l == "up" {
                return State::load(&rd);
            }
            if l.starts_with("failed:") {
                let _ = sup.wait();
                bail!("cluster '{}' failed to start: {}", plan.name, l.trim_start_matches("failed: "));
            }
            continue;
        }
        events.seek(SeekFrom::Start(pos))?;
        if interrupted.load(Ordering::SeqCst) {
            eprintln!("interrupted: tearing the cluster down");
            down_dir(&rd)?;
            bail!("interrupted");
        }
        if let Some(st) = sup.try_wait()? {
            let _ = down_dir(&rd);
            bail!(
                "the supervisor exited ({st}) before the cluster was up: {}",
                supervisor::tail(&rd.join("supervisor.log"), 5)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What `down` found and did.
#[derive(Debug, Default)]
pub struct DownReport {
    /// The supervisor was running and stopped.
    pub stopped_supervisor: bool,
    /// Processes killed by force.
    pub killed: Vec<u32>,
    /// Sockets removed.
    pub removed_sockets: usize,
}

/// Tears down whatever runs under `rd`: asks the supervisor, then kills
/// stragglers and removes sockets. Safe to run on a dead or absent cluster.
pub fn down_dir(rd: &Path) -> Result<DownReport> {
    let mut rep = DownReport::default();
    if !rd.exists() {
        return Ok(rep);
    }
    if let Ok(st) = State::load(rd) {
        if pid_alive(st.supervisor_pid) && processes_mentioning(rd).contains(&st.supervisor_pid) {
            // SAFETY: kill(2) on the supervisor we started (checked by its command line).
            unsafe { libc::kill(st.supervisor_pid as i32, libc::SIGTERM) };
            let t0 = Instant::now();
            while pid_alive(st.supervisor_pid) && t0.elapsed() < Duration::from_secs(30) {
                std::thread::sleep(Duration::from_millis(50));
            }
            rep.stopped_supervisor = true;
        }
    }
    // Anything still mentioning the run folder is ours and must go.
    for _ in 0..50 {
        let left = processes_mentioning(rd);
        if left.is_empty() {
            break;
        }
        for pid in left {
            // SAFETY: kill(2) on a process whose command line names our run folder.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            if !rep.killed.contains(&pid) {
                rep.killed.push(pid);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for s in sockets_in(rd) {
        if fs::remove_file(&s).is_ok() {
            rep.removed_sockets += 1;
        }
    }
    Ok(rep)
}

/// The agent socket of node `node` of cluster `name`, once the cluster and
/// the node are up.
pub fn node_agent(paths: &Paths, name: &str, node: usize) -> Result<PathBuf> {
    let rd = paths.run_dir(name);
    let st = State::load(&rd).map_err(|_| anyhow::anyhow!("cluster '{name}' is not up (run 'mc-cluster up' first)"))?;
    if st.status != Status::Up || !pid_alive(st.supervisor_pid) {
        bail!("cluster '{name}' is not up (status {:?}; run 'mc-cluster up')", st.status);
    }
    if node >= st.nodes.len() {
        bail!("node {node} does not exist: cluster '{name}' has nodes 0 to {}", st.nodes.len() - 1);
    }
    if let Some(how) = &st.nodes[node].qemu_exit {
        bail!("node {node} is down (its QEMU exited: {how})");
    }
    Ok(supervisor::agent_sock(&rd, node))
}

/// How long `unplug` waits for the guest to let its adapter go.
pub const UNPLUG_WAIT: Duration = Duration::from_secs(60);
/// How long `plug` waits for the guest to take its adapter (imcd serving again).
pub const PLUG_WAIT: Duration = Duration::from_secs(60);

/// A shell command that prints the adapter's folder in a guest's sysfs
/// (nothing when it has none).
pub const FIND_ADAPTER: &str = "for d in /sys/bus/pci/devices/*; do \
    if [ \"$(cat $d/vendor)\" = 0x1011 ] && [ \"$(cat $d/device)\" = 0x0018 ]; then echo $d; fi; done";

/// Runs `cmd` with `sh -c` in node `node`; its exit code and standard output.
///
/// A client that left in the middle of a command with standard input
/// (killed) leaves the agent finishing that stream: the next request is
/// refused once as "busy". That is tried again.
pub fn guest_sh(paths: &Paths, name: &str, node: usize, cmd: &str) -> Result<(i32, String)> {
    let argv = ["sh", "-c", cmd].map(String::from);
    let mut tries = 0;
    loop {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        match exec(paths, name, node, &argv, agent::Streams { stdin: None, out: &mut out, err: &mut err }, 60) {
            Ok(exit) => return Ok((exit.code, String::from_utf8_lossy(&out).into_owned())),
            Err(e) if tries < 5 && format!("{e:#}").contains("busy with another operation") => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => return Err(e),
        }
    }
}

/// The plan running cluster `name` was started from (its nodes and config).
pub fn plan_of(paths: &Paths, name: &str) -> Result<Plan> {
    let rd = paths.run_dir(name);
    let bytes = fs::read(rd.join("plan.json"))
        .map_err(|_| anyhow::anyhow!("cluster '{name}' is not up (run 'mc-cluster up' first)"))?;
    serde_json::from_slice(&bytes).context("reading plan.json")
}

/// QMP to node `node` of cluster `name`, whose adapter sits in a
/// hot-pluggable slot; the node's folder, and the cluster's plan.
fn hotplug_qmp(paths: &Paths, name: &str, node: usize) -> Result<(qmp::Qmp, PathBuf, Plan)> {
    node_agent(paths, name, node)?;
    let rd = paths.run_dir(name);
    let plan = plan_of(paths, name)?;
    if !plan.config.guest.hotplug {
        bail!(
            "cluster '{name}' was started without a hot-pluggable slot for the adapter: set [guest] hotplug = true \
             in its config (docs/adapter.md, \"Surprise removal\")"
        );
    }
    let nd = supervisor::node_dir(&rd, node);
    Ok((qmp::Qmp::connect(&supervisor::qmp_socket(&nd))?, nd, plan))
}

/// Takes node `node`'s adapter out of its running guest (QMP `device_del`)
/// and waits until the guest let it go and QEMU removed it. Returns what
/// to print.
pub fn unplug(paths: &Paths, name: &str, node: usize) -> Result<String> {
    let (mut q, ..) = hotplug_qmp(paths, name, node)?;
    let t0 = Instant::now();
    q.execute("device_del", serde_json::json!({"id": supervisor::ADAPTER_ID}))
        .map_err(|e| anyhow::anyhow!("node {node}: {e} (is the adapter plugged in?)"))?;
    q.wait_event("DEVICE_DELETED", UNPLUG_WAIT, |d| d["device"] == supervisor::ADAPTER_ID).map_err(|e| {
        anyhow::anyhow!(
            "node {node}: {e}: the guest has not let the adapter go (a process there still holds its device \
             files: the guest kernel logs 'blocked until released by user')"
        )
    })?;
    Ok(format!("node {node}: adapter unplugged ({:.1} s for the guest to let it go)", t0.elapsed().as_secs_f64()))
}

/// Plugs node `node`'s adapter back into its running guest (QMP
/// `device_add`): a new vfio-user connection to the same port of the hub.
pub fn plug(paths: &Paths, name: &str, node: usize) -> Result<String> {
    let (mut q, nd, plan) = hotplug_qmp(paths, name, node)?;
    let imcd = plan.config.guest.imcd;
    // imcd says it listens once per start: one more such line is the new one.
    let starts = || -> Result<usize> {
        let log = guest_sh(paths, name, node, "cat /var/log/imcd.log")?.1;
        Ok(log.lines().filter(|l| l.contains("listening on")).count())
    };
    let before = if imcd { starts()? } else { 0 };
    let t0 = Instant::now();
    q.execute("device_add", supervisor::adapter_device(&nd, true))
        .map_err(|e| anyhow::anyhow!("node {node}: {e} (is the adapter unplugged?)"))?;
    loop {
        let back = if imcd { starts()? > before } else { guest_sh(paths, name, node, FIND_ADAPTER)?.1.trim() != "" };
        if back {
            break;
        }
        if t0.elapsed() > PLUG_WAIT {
            bail!(
                "node {node}: the adapter is plugged in, but {} within {} s (see the guest's /var/log/imcd.log)",
                if imcd { "imcd has not taken it" } else { "the guest has not found it" },
                PLUG_WAIT.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let what = if imcd { "imcd there took it and rejoined the cluster" } else { "the guest found it" };
    Ok(format!("node {node}: adapter plugged in ({what} in {:.1} s)", t0.elapsed().as_secs_f64()))
}

/// Runs `argv` on node `node` of cluster `name` with `io` as its standard
/// streams.
pub fn exec(
    paths: &Paths,
    name: &str,
    node: usize,
    argv: &[String],
    io: agent::Streams<'_>,
    timeout_s: u64,
) -> Result<agent::Exit> {
    if argv.is_empty() {
        bail!("no command given: mc-cluster exec NODE -- COMMAND [ARGS...]");
    }
    let sock = node_agent(paths, name, node)?;
    agent::exec(&sock, argv, io, timeout_s).with_context(|| format!("node {node}"))
}

/// What `mc-cluster mpirun` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpirunOptions {
    /// Ranks.
    pub n: u32,
    /// Ranks per node (None: spread evenly, in blocks).
    pub ppn: Option<u32>,
    /// `NAME=VALUE` settings for every rank.
    pub env: Vec<String>,
    /// The program (a path inside the guests, or a command on their `PATH`)
    /// and its arguments.
    pub argv: Vec<String>,
}

/// The `mpiexec` command line `mc-cluster mpirun` runs in guest 0 of a
/// cluster of `nodes` nodes: every node is a host, and the job ends when
/// the agent connection (its standard input) goes away.
pub fn mpirun_argv(nodes: usize, o: &MpirunOptions) -> Result<Vec<String>> {
    if o.n == 0 {
        bail!("-n must be at least 1");
    }
    if o.ppn == Some(0) {
        bail!("--ppn must be at least 1");
    }
    if nodes == 0 {
        bail!("the cluster has no nodes");
    }
    let Some(prog) = o.argv.first().filter(|p| !p.is_empty()) else {
        bail!("no program given: mc-cluster mpirun -n N PROG [ARGS...]");
    };
    let hosts: Vec<String> = (0..nodes).map(|n| format!("node{n}")).collect();
    let mut argv: Vec<String> = Vec::new();
    // `--env MPIEXEC_TRACE=1` traces mpiexec itself too, not only the ranks.
    if let Some(t) = o.env.iter().find(|e| e.starts_with("MPIEXEC_TRACE=")) {
        argv.extend(["env".to_string(), t.clone()]);
    }
    argv.extend(["mpiexec", "-end-on-stdin-eof", "-n"].map(String::from));
    argv.push(o.n.to_string());
    argv.push("-hosts".into());
    argv.push(hosts.join(","));
    if let Some(k) = o.ppn {
        argv.push("-ppn".into());
        argv.push(k.to_string());
    }
    for e in &o.env {
        let Some((k, v)) = e.split_once('=').filter(|(k, _)| !k.is_empty()) else {
            bail!("--env {e}: NAME=VALUE expected");
        };
        argv.extend(["-genv".to_string(), k.to_string(), v.to_string()]);
    }
    argv.push("--".into());
    argv.push(prog.clone());
    argv.extend(o.argv[1..].iter().cloned());
    Ok(argv)
}

/// Standard input for `mpiexec -end-on-stdin-eof` in the guest: it never
/// ends while this process lives, so the job ends when we do (the agent
/// closes the command's standard input when our connection closes).
struct HeldOpen;

impl std::io::Read for HeldOpen {
    fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
}

/// `mc-cluster mpirun`: runs `mpiexec` in guest 0 over every node of
/// cluster `name`, with the command's output on `out` and `err`; returns
/// its exit (`mpiexec`'s code: the first failing rank's, see docs/mpi.md).
pub fn mpirun(
    paths: &Paths,
    name: &str,
    o: &MpirunOptions,
    out: &mut dyn std::io::Write,
    err: &mut dyn std::io::Write,
    timeout_s: u64,
) -> Result<agent::Exit> {
    let sock = node_agent(paths, name, 0)?;
    let st = State::load(&paths.run_dir(name)).map_err(|_| anyhow::anyhow!("cluster '{name}' is not up"))?;
    let argv = mpirun_argv(st.nodes.len(), o)?;
    let io = agent::Streams { stdin: Some(Box::new(HeldOpen)), out, err };
    agent::exec(&sock, &argv, io, timeout_s).context("node 0")
}

/// The command `mc-cluster pvm` runs in guest 0: the PVM program `argv[0]`
/// (a name without `/` is looked up in `$PVM_ROOT/bin/LINUX64`, where PVM
/// looks for spawned programs) with its arguments, in `/tmp`, with
/// `PVM_ROOT=/share/pvm` unless `env` says otherwise, the `NAME=VALUE`
/// settings of `env`, and `PVM_MC_CATCHOUT=1`: the program (started from
/// the shell, so without a PVM parent) prints every task's output as it
/// comes, each line after its task's TID, and its `pvm_exit` waits for the
/// end of it (docs/pvm.md, "mc-cluster pvm").
pub fn pvm_argv(env: &[String], argv: &[String]) -> Result<Vec<String>> {
    let Some(prog) = argv.first().filter(|p| !p.is_empty()) else {
        bail!("no program given: mc-cluster pvm PROG [ARGS...]");
    };
    let mut out: Vec<String> = ["env", "PVM_ROOT=/share/pvm", "PVM_ARCH=LINUX64"].map(String::from).into();
    for e in env {
        if e.split_once('=').is_none_or(|(k, _)| k.is_empty()) {
            bail!("--env {e}: NAME=VALUE expected");
        }
        out.push(e.clone());
    }
    out.push("PVM_MC_CATCHOUT=1".into());
    out.extend(["sh", "-c"].map(String::from));
    out.push(
        r#"p=$0; case $p in */*) ;; *) p=$PVM_ROOT/bin/$PVM_ARCH/$p ;; esac
[ -x "$p" ] || { echo "mc-cluster pvm: $p: no such program (put it in the shared folder's pvm/bin/LINUX64)" >&2; exit 127; }
cd /tmp && exec "$p" "$@""#
            .into(),
    );
    out.push(prog.clone());
    out.extend(argv[1..].iter().cloned());
    Ok(out)
}

/// One side of `mc-cluster cp`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A host path.
    Host(PathBuf),
    /// `NODE:PATH`: an absolute path in a guest.
    Guest {
        /// Node id.
        node: usize,
        /// Guest path.
        path: String,
    },
}

impl Endpoint {
    /// `NODE:PATH` (decimal node, absolute guest path) or a host path. A
    /// host path that starts with digits and a colon is written `./12:x`.
    pub fn parse(s: &str) -> Result<Endpoint> {
        if let Some((n, p)) = s.split_once(':') {
            if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) {
                let node = n.parse().map_err(|_| anyhow::anyhow!("'{s}': node {n} is out of range"))?;
                if !p.starts_with('/') {
                    bail!("'{s}': the guest path must be absolute (NODE:/path)");
                }
                return Ok(Endpoint::Guest { node, path: p.to_string() });
            }
        }
        if s.is_empty() {
            bail!("empty path");
        }
        Ok(Endpoint::Host(PathBuf::from(s)))
    }
}

/// `mc-cluster cp SRC DST`: one of the two is `NODE:PATH`. Returns a line
/// saying what was copied.
pub fn cp(paths: &Paths, name: &str, src: &str, dst: &str) -> Result<String> {
    let timeout = Duration::from_secs(600);
    match (Endpoint::parse(src)?, Endpoint::parse(dst)?) {
        (Endpoint::Host(h), Endpoint::Guest { node, path }) => {
            let sock = node_agent(paths, name, node)?;
            let c = agent::put(&sock, &h, &path, timeout).with_context(|| format!("node {node}"))?;
            Ok(format!("{} -> {node}:{} ({} bytes, mode {:o})", h.display(), c.guest_path, c.bytes, c.mode))
        }
        (Endpoint::Guest { node, path }, Endpoint::Host(h)) => {
            let sock = node_agent(paths, name, node)?;
            let (to, c) = agent::get(&sock, &path, &h, timeout).with_context(|| format!("node {node}"))?;
            Ok(format!("{node}:{} -> {} ({} bytes, mode {:o})", c.guest_path, to.display(), c.bytes, c.mode))
        }
        _ => bail!("cp copies between the host and a guest: exactly one side must be NODE:/PATH"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mpirun_runs_mpiexec_over_every_node() {
        let o = |n, ppn, env: &[&str], argv: &[&str]| MpirunOptions {
            n,
            ppn,
            env: env.iter().map(|s| s.to_string()).collect(),
            argv: argv.iter().map(|s| s.to_string()).collect(),
        };
        let a = mpirun_argv(3, &o(4, Some(2), &["A=1=2"], &["/share/prog", "-x", "y"])).unwrap();
        assert_eq!(
            a.join(" "),
            "mpiexec -end-on-stdin-eof -n 4 -hosts node0,node1,node2 -ppn 2 -genv A 1=2 -- /share/prog -x y"
        );
        let a = mpirun_argv(2, &o(2, None, &["MPIEXEC_TRACE=1"], &["/share/p"])).unwrap();
        assert_eq!(
            a.join(" "),
            "env MPIEXEC_TRACE=1 mpiexec -end-on-stdin-eof -n 2 -hosts node0,node1 -genv MPIEXEC_TRACE 1 -- /share/p"
        );
        let a = mpirun_argv(1, &o(2, None, &[], &["hostname"])).unwrap();
        assert_eq!(a.join(" "), "mpiexec -end-on-stdin-eof -n 2 -hosts node0 -- hostname");
        assert!(mpirun_argv(2, &o(0, None, &[], &["p"])).unwrap_err().to_string().contains("-n must be"));
        assert!(mpirun_argv(2, &o(1, Some(0), &[], &["p"])).unwrap_err().to_string().contains("--ppn"));
        assert!(mpirun_argv(2, &o(1, None, &["NOVALUE"], &["p"])).unwrap_err().to_string().contains("NAME=VALUE"));
        assert!(mpirun_argv(2, &o(1, None, &[], &[])).unwrap_err().to_string().contains("no program"));
    }

    #[test]
    fn pvm_runs_the_program_catching_every_tasks_output() {
        let v = |x: &[&str]| x.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let a = pvm_argv(&v(&["PVM_ROOT=/share/x"]), &v(&["master1", "-v"])).unwrap();
        assert_eq!(
            a[..5],
            v(&["env", "PVM_ROOT=/share/pvm", "PVM_ARCH=LINUX64", "PVM_ROOT=/share/x", "PVM_MC_CATCHOUT=1"])
        );
        assert_eq!(a[5..7], v(&["sh", "-c"]));
        assert!(a[7].contains("$PVM_ROOT/bin/$PVM_ARCH/$p") && a[7].contains("exec \"$p\" \"$@\""), "{}", a[7]);
        assert_eq!(a[8..], v(&["master1", "-v"]));
        assert!(pvm_argv(&v(&["NOVALUE"]), &v(&["p"])).unwrap_err().to_string().contains("NAME=VALUE"));
        assert!(pvm_argv(&[], &[]).unwrap_err().to_string().contains("no program"));
    }

    #[test]
    fn cp_endpoints_parse() {
        assert_eq!(Endpoint::parse("1:/tmp/x").unwrap(), Endpoint::Guest { node: 1, path: "/tmp/x".into() });
        assert_eq!(Endpoint::parse("a.out").unwrap(), Endpoint::Host("a.out".into()));
        assert_eq!(Endpoint::parse("./3:x").unwrap(), Endpoint::Host("./3:x".into()));
        assert_eq!(Endpoint::parse("x:/y").unwrap(), Endpoint::Host("x:/y".into()));
        assert!(Endpoint::parse("0:tmp/x").unwrap_err().to_string().contains("absolute"));
        assert!(Endpoint::parse("99999999999999999999999:/x").unwrap_err().to_string().contains("out of range"));
        assert!(Endpoint::parse("").is_err());
    }

    #[test]
    fn share_folder_defaults_and_overrides() {
        let run = Path::new("/r/.run/c");
        let cfg = Path::new("/repo/qemu-configs/x.toml");
        assert_eq!(share_dir(run, None, "", cfg).unwrap(), PathBuf::from("/r/.run/c/share"));
        assert_eq!(share_dir(run, None, "../work", cfg).unwrap(), PathBuf::from("/repo/qemu-configs/../work"));
        assert_eq!(share_dir(run, None, "/abs", cfg).unwrap(), PathBuf::from("/abs"));
        assert_eq!(share_dir(run, Some(Path::new("/d")), "/abs", cfg).unwrap(), PathBuf::from("/d"));
        let rel = share_dir(run, Some(Path::new("d")), "", cfg).unwrap();
        assert_eq!(rel, std::env::current_dir().unwrap().join("d"));
        let f = tempfile::NamedTempFile::new().unwrap();
        let e = share_dir(run, Some(f.path()), "", cfg).unwrap_err().to_string();
        assert!(e.contains("is not a folder"), "{e}");
    }

    #[test]
    fn qemu_versions_parse() {
        let v = parse_qemu_version("QEMU emulator version 10.2.2 (Debian 1:10.2.2+ds-1)\nCopyright").unwrap();
        assert_eq!(v, (10, 2));
        assert!(parse_qemu_version("no version here").is_err());
        assert!(parse_qemu_version("QEMU emulator version x.y").is_err());
    }
}
