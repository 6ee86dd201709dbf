//! The supervisor: the one background process that owns a running cluster.
//!
//! `mc-cluster up` starts it detached (its own session) and returns once it
//! reports the cluster up. It starts the hub, one adapter per node and one
//! QEMU per node, every child with `PR_SET_PDEATHSIG`, so nothing outlives it;
//! it waits for every guest agent, then watches the children until
//! `mc-cluster down` (SIGTERM) tells it to tear everything down.
//!
//! While the cluster is up it keeps it whole (docs/faults.md, "Process
//! exits"): a QEMU that exits takes its node out (per-guest, its adapter is
//! stopped so the hub announces the node failed); an adapter that dies
//! (per-guest) restarts its node; a hub that dies is restarted with the same
//! arguments (in-hub, with every guest: their vfio-user clients never
//! reconnect). `mc-cluster restart NODE` and `mc-cluster hub restart` ask
//! it, over `supervisor.sock`, to do the same on purpose. Every change of a
//! pid is written to `state.json` at once.
//!
//! Single-threaded: one loop polls the children and the request socket;
//! a restart is carried out inside that loop (the requester waits).
//!
//! Run folder (`.run/<name>/`): `plan.json` (what to start), `state.json`
//! (status and pids), `supervisor.sock` (restart requests), `events.log` (progress lines `up` prints),
//! `supervisor.log`, `hub.log`, `hub.sock`, `hub.ctl` (control), with the TCP
//! transport `hub.tcp` (address) and `hub.secret`, and `node<N>/` with
//! `adapter.{sock,log}`, `qemu.log`, `console.log`, `agent.sock`; with
//! `[guest] ivshmem`, `ivshmem` (the guests' shared memory, removed at the end);
//! `share/`, the default folder shared into the guests (kept by `up`).

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::fd::BorrowedFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::agent::{self, Streams};
use crate::config::{Config, IVSHMEM_MIB, SHARE_TAG};
use crate::lan::Lan;

/// Everything the supervisor needs, written by `up` into `plan.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Plan {
    /// Cluster name.
    pub name: String,
    /// Number of nodes.
    pub nodes: usize,
    /// Run folder.
    pub run_dir: PathBuf,
    /// Host folder shared into every guest at [`crate::config::GUEST_SHARE`].
    pub share: PathBuf,
    /// `mc-hub` binary.
    pub hub_bin: PathBuf,
    /// `mc-adapter` binary.
    pub adapter_bin: PathBuf,
    /// QEMU binary.
    pub qemu: PathBuf,
    /// Guest kernel.
    pub kernel: PathBuf,
    /// Guest initramfs.
    pub initrd: PathBuf,
    /// `kvm` or `tcg`.
    pub accel: String,
    /// The cluster definition.
    pub config: Config,
    /// The host's CPUs (0: unknown). With fewer than the guests' vCPUs
    /// together, the guests learn it (`mc.oversubscribed=1`).
    #[serde(default)]
    pub host_cpus: usize,
}

/// Cluster status in `state.json`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Children being started.
    Starting,
    /// Every guest agent answered.
    Up,
    /// Start-up failed; everything was torn down.
    Failed,
    /// Tearing down.
    Stopping,
    /// Torn down.
    Down,
}

/// One node's processes.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct NodeState {
    /// Pid of the process serving the node's adapter (the hub's with
    /// `cluster.adapters = "in-hub"`).
    pub adapter_pid: u32,
    /// QEMU pid.
    pub qemu_pid: u32,
    /// Set when QEMU exited on its own (with how).
    pub qemu_exit: Option<String>,
    /// Seconds from QEMU start to the agent's first answer.
    pub ready_s: Option<f64>,
    /// Set when the node's own adapter process (per-guest mode) exited or
    /// was stopped (with how); `adapter_pid` is then no longer running.
    #[serde(default)]
    pub adapter_exit: Option<String>,
    /// Times the node was restarted (`mc-cluster restart`, or by the
    /// supervisor after its adapter died).
    #[serde(default)]
    pub restarts: u32,
}

/// `state.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct State {
    /// Where the cluster is.
    pub status: Status,
    /// Supervisor pid.
    pub supervisor_pid: u32,
    /// Hub pid.
    pub hub_pid: u32,
    /// Per node.
    pub nodes: Vec<NodeState>,
    /// Why start-up failed.
    pub message: String,
    /// Accelerator in use.
    pub accel: String,
    /// Host folder shared into every guest.
    #[serde(default)]
    pub share: PathBuf,
    /// Set while the hub is down after it exited on its own (with how).
    #[serde(default)]
    pub hub_exit: Option<String>,
    /// Times the hub was restarted (`mc-cluster hub restart`, or by the
    /// supervisor after it died).
    #[serde(default)]
    pub hub_restarts: u32,
    /// The guests' LAN backend (`tap`, `mcast` or `off`; launcher/src/lan.rs).
    #[serde(default)]
    pub lan: String,
}

impl State {
    /// Reads `state.json` from a run folder.
    pub fn load(run_dir: &Path) -> Result<State> {
        let p = run_dir.join("state.json");
        let text = fs::read_to_string(&p).with_context(|| format!("no cluster state at {}", p.display()))?;
        serde_json::from_str(&text).with_context(|| format!("corrupt {}", p.display()))
    }

    /// Node `n`'s QEMU exited (`how`).
    pub fn qemu_exited(&mut self, n: usize, how: &str) {
        self.nodes[n].qemu_exit = Some(how.to_string());
        self.nodes[n].ready_s = None;
    }

    /// Node `n`'s adapter process exited or was stopped (`how`).
    pub fn adapter_exited(&mut self, n: usize, how: &str) {
        self.nodes[n].adapter_exit = Some(how.to_string());
    }

    /// Node `n` runs again: a new QEMU (and, per-guest, a new adapter).
    pub fn node_restarted(&mut self, n: usize, adapter_pid: u32, qemu_pid: u32) {
        let ns = &mut self.nodes[n];
        ns.adapter_pid = adapter_pid;
        ns.qemu_pid = qemu_pid;
        ns.qemu_exit = None;
        ns.adapter_exit = None;
        ns.ready_s = None;
        ns.restarts += 1;
    }

    /// The hub exited on its own (`how`); in-hub, every node's adapter went with it.
    pub fn hub_exited(&mut self, how: &str, in_hub: bool) {
        self.hub_exit = Some(how.to_string());
        if in_hub {
            for ns in &mut self.nodes {
                ns.adapter_exit = Some(format!("the hub serving it exited ({how})"));
            }
        }
    }

    /// A new hub runs (pid `pid`); in-hub, it serves every node's adapter.
    pub fn hub_restarted(&mut self, pid: u32, in_hub: bool) {
        self.hub_pid = pid;
        self.hub_exit = None;
        self.hub_restarts += 1;
        if in_hub {
            for ns in &mut self.nodes {
                ns.adapter_pid = pid;
                ns.adapter_exit = None;
            }
        }
    }

    fn save(&self, run_dir: &Path) -> Result<()> {
        let tmp = run_dir.join("state.json.tmp");
        fs::write(&tmp, serde_json::to_vec_pretty(self)?)?;
        fs::rename(tmp, run_dir.join("state.json"))?;
        Ok(())
    }
}

/// Per-node paths.
pub fn node_dir(run_dir: &Path, n: usize) -> PathBuf {
    run_dir.join(format!("node{n}"))
}

/// The agent socket of node `n`.
pub fn agent_sock(run_dir: &Path, n: usize) -> PathBuf {
    node_dir(run_dir, n).join("agent.sock")
}

struct Events(File);

impl Events {
    fn say(&mut self, msg: &str) {
        let _ = writeln!(self.0, "{msg}");
        let _ = self.0.flush();
    }
}

/// Starts `argv` with its output in `log`, killed when the supervisor dies;
/// inside the network namespace `netns` when given; with `realtime` every
/// thread of the child runs at real-time priority (`crate::priority`; left
/// normal where not allowed).
fn spawn(argv: &[String], log: &Path, netns: Option<BorrowedFd<'_>>, realtime: bool) -> Result<Child> {
    let out = File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let mut cmd = Command::new(&argv[0]);
    if realtime {
        // SAFETY: sched_setscheduler(2) only, between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                // Not allowed: the child runs at normal priority.
                let _ = crate::priority::make_realtime(0);
                Ok(())
            });
        }
    }
    if let Some(ns) = netns {
        crate::lan::enter_netns(&mut cmd, ns);
    }
    cmd.args(&argv[1..]).stdin(Stdio::null()).stdout(out.try_clone()?).stderr(out);
    // SAFETY: prctl(2) only, between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn().with_context(|| format!("cannot start {}", argv[0]))
}

fn wait_for_path(p: &Path, child: &mut Child, what: &str, timeout: Duration, log: &Path) -> Result<()> {
    let t0 = Instant::now();
    while !p.exists() {
        if let Some(st) = child.try_wait()? {
            bail!("{what} exited ({st}) before it was ready: {}", tail(log, 3));
        }
        if t0.elapsed() > timeout {
            bail!("{what} not ready after {timeout:?}: {}", tail(log, 3));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// A fresh random cluster secret (hex), readable by its owner only.
fn write_secret(path: &Path) -> Result<()> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut raw = [0u8; 32];
    File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut raw)).context("reading /dev/urandom")?;
    let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    f.write_all(hex.as_bytes())?;
    Ok(())
}

/// Last `n` non-empty lines of a log, joined on one line.
pub fn tail(log: &Path, n: usize) -> String {
    let text = fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let start = lines.len().saturating_sub(n);
    let joined = lines[start..].join(" | ");
    if joined.is_empty() {
        format!("(nothing in {})", log.display())
    } else {
        format!("{joined} (see {})", log.display())
    }
}

/// The file behind every guest's `ivshmem-plain` device (`[guest] ivshmem`).
pub fn ivshmem_path(run_dir: &Path) -> PathBuf {
    run_dir.join("ivshmem")
}

/// Creates the zeroed shared file every guest's `ivshmem-plain` maps, at its
/// full size before any QEMU starts (so none of them races to create it).
fn create_ivshmem(run_dir: &Path) -> Result<()> {
    let p = ivshmem_path(run_dir);
    let f = File::create(&p).with_context(|| format!("creating {}", p.display()))?;
    f.set_len(IVSHMEM_MIB << 20).with_context(|| format!("sizing {}", p.display()))?;
    Ok(())
}

/// QEMU's argument list for node `n` on the cluster's LAN `lan`.
pub fn qemu_argv(plan: &Plan, n: usize, lan: &Lan) -> Vec<String> {
    let c = &plan.config;
    let nd = node_dir(&plan.run_dir, n);
    let mut a: Vec<String> = vec![plan.qemu.display().to_string()];
    let mut push = |s: &str| a.push(s.to_string());
    push("-name");
    // debug-threads: vCPU threads are named "CPU n/TCG", which is how
    // crate::priority leaves them at normal priority.
    push(&format!("mc-node{n},process=mc-node{n},debug-threads=on"));
    for d in &c.qemu.firmware_dirs {
        push("-L");
        push(d);
    }
    push("-machine");
    // No HPET: the guest keeps time with the TSC and the local APIC, but
    // Linux leaves the HPET's first comparator running after boot, and QEMU
    // then ran its HPET timer every 4 ms of an idle guest (2.4% of a host
    // core per guest, measured with scripts/idle-bench.sh; docs/guest.md).
    push("q35,memory-backend=mem,hpet=off");
    push("-accel");
    push(&plan.accel);
    push("-cpu");
    push(match (c.qemu.cpu.as_str(), plan.accel.as_str()) {
        ("", "kvm") => "host",
        ("", _) => crate::config::TCG_CPU,
        (cpu, _) => cpu,
    });
    push("-smp");
    push(&c.guest.cpus.to_string());
    push("-m");
    push(&format!("{}M", c.guest.memory_mib));
    push("-object");
    push(&format!("memory-backend-memfd,id=mem,size={}M,share=on", c.guest.memory_mib));
    push("-nodefaults");
    push("-display");
    push("none");
    push("-no-reboot");
    push("-device");
    push("intel-iommu,caching-mode=on");
    push("-device");
    push(
        &serde_json::json!({"driver": "vfio-user-pci", "socket": {"type": "unix", "path": nd.join("adapter.sock")}})
            .to_string(),
    );
    push("-kernel");
    push(&plan.kernel.display().to_string());
    push("-initrd");
    push(&plan.initrd.display().to_string());
    push("-append");
    // More vCPUs than host cores: a guest that spins keeps another from
    // running, and MPI's waiting ranks give their core up sooner
    // (docs/mpi.md, "Waiting").
    let oversubscribed = plan.host_cpus > 0 && plan.nodes * c.guest.cpus as usize > plan.host_cpus;
    push(&format!(
        "{} mc.node={n} mc.nodes={} mc.imcd={}{}",
        c.guest.cmdline,
        plan.nodes,
        u8::from(c.guest.imcd),
        if oversubscribed { " mc.oversubscribed=1" } else { "" }
    ));
    for arg in lan.qemu_args(&plan.run_dir, n) {
        push(&arg);
    }
    if c.guest.ivshmem {
        push("-object");
        push(&format!(
            "memory-backend-file,id=ivsh,share=on,mem-path={},size={IVSHMEM_MIB}M",
            ivshmem_path(&plan.run_dir).display()
        ));
        push("-device");
        push("ivshmem-plain,memdev=ivsh");
    }
    // The shared folder: virtio-9p with the `local` backend. security_model
    // none: guest files are plain host files owned by QEMU's user, with the
    // mode bits the guest gives them (guest chown is best effort).
    push("-fsdev");
    push(&format!("local,id=share,path={},security_model=none", plan.share.display().to_string().replace(',', ",,")));
    push("-device");
    push(&format!("virtio-9p-pci,fsdev=share,mount_tag={SHARE_TAG}"));
    push("-serial");
    push(&format!("file:{}", nd.join("console.log").display()));
    push("-device");
    push("virtio-serial-pci");
    push("-chardev");
    push(&format!("socket,id=agent,path={},server=on,wait=off", nd.join("agent.sock").display()));
    push("-device");
    push("virtserialport,chardev=agent,name=mc.agent");
    for e in &c.qemu.extra_args {
        push(e);
    }
    a
}

/// Automatic restarts of one node (after its adapter died) or of the hub
/// before the supervisor gives up on it: a process that dies again and
/// again is not fixed by restarting it.
pub const MAX_AUTO_RESTARTS: u32 = 3;

/// Run in a guest until it succeeds: prints `mpid`'s "listening" line, or
/// nothing for an image without `mpid`.
const MPID_PROBE: &str = "[ -x /bin/mpid ] || exit 0; grep -m1 'listening on handle' /var/log/mpid.log";

/// A process of the cluster that exited on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exited {
    /// The hub.
    Hub,
    /// Node `n`'s QEMU.
    Qemu(usize),
    /// Node `n`'s adapter process (per-guest mode).
    Adapter(usize),
}

/// What the supervisor does about an [`Exited`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reaction {
    /// Nothing more to stop: in-hub, the hub announced the node failed when
    /// its QEMU's socket closed. The node stays down until `restart`.
    NodeDown,
    /// Stop the node's adapter process, so the hub announces it failed and
    /// the others repair it out. The node stays down until `restart`.
    TakeOut(usize),
    /// Restart the node: adapter and QEMU (its guest reboots and late-joins).
    RestartNode(usize),
    /// Stop the node's QEMU and leave the node down (too many restarts).
    FailNode(usize),
    /// Restart the hub with the same arguments; the adapters rejoin.
    RestartHub,
    /// Restart the hub and every guest (in-hub: the guests' vfio-user
    /// clients never reconnect to a new hub).
    RebootCluster,
    /// Leave the hub down (too many restarts).
    GiveUpHub,
}

/// The policy: what follows `what` exiting, in-hub or per-guest, after
/// `restarts` earlier automatic restarts of the same thing.
pub fn reaction(in_hub: bool, what: Exited, restarts: u32) -> Reaction {
    match what {
        Exited::Qemu(_) if in_hub => Reaction::NodeDown,
        Exited::Qemu(n) => Reaction::TakeOut(n),
        Exited::Adapter(n) if restarts >= MAX_AUTO_RESTARTS => Reaction::FailNode(n),
        Exited::Adapter(n) => Reaction::RestartNode(n),
        Exited::Hub if restarts >= MAX_AUTO_RESTARTS => Reaction::GiveUpHub,
        Exited::Hub if in_hub => Reaction::RebootCluster,
        Exited::Hub => Reaction::RestartHub,
    }
}

/// The supervisor's request socket in a run folder.
pub fn request_sock(run_dir: &Path) -> PathBuf {
    run_dir.join("supervisor.sock")
}

/// Sends one request line (`restart-node N`, `restart-hub`) to the
/// supervisor of `run_dir` and returns its answer; waits up to `timeout`
/// (a restart waits for guests to boot).
pub fn request(run_dir: &Path, req: &str, timeout: Duration) -> Result<String> {
    use std::io::{BufRead, BufReader};
    let p = request_sock(run_dir);
    let mut s = std::os::unix::net::UnixStream::connect(&p)
        .with_context(|| format!("the supervisor does not answer at {}", p.display()))?;
    s.set_read_timeout(Some(timeout))?;
    writeln!(s, "{req}")?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).context("no answer from the supervisor")?;
    match line.trim_end().split_once(' ') {
        Some(("ok", msg)) => Ok(msg.to_string()),
        Some(("error", msg)) => bail!("{msg}"),
        _ => bail!("unexpected answer from the supervisor: {line:?}"),
    }
}

/// Runs the supervisor for the plan in `run_dir` until SIGTERM.
pub fn run(run_dir: &Path) -> Result<()> {
    let plan: Plan = serde_json::from_slice(&fs::read(run_dir.join("plan.json")).context("reading plan.json")?)?;
    let stop = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGTERM, stop.clone())?;
    signal_hook::flag::register(signal_hook::consts::SIGINT, stop.clone())?;
    let events = Events(OpenOptions::new().create(true).append(true).open(run_dir.join("events.log"))?);
    let state = State {
        status: Status::Starting,
        supervisor_pid: std::process::id(),
        hub_pid: 0,
        nodes: vec![NodeState::default(); plan.nodes],
        message: String::new(),
        accel: plan.accel.clone(),
        share: plan.share.clone(),
        hub_exit: None,
        hub_restarts: 0,
        lan: String::new(),
    };
    state.save(run_dir)?;
    let n = plan.nodes;
    let mut sup =
        Sup { plan, state, ev: events, stop, hub: None, adapters: vec![], qemus: vec![], lan: None, rt_warned: false };
    sup.adapters.resize_with(n, || None);
    sup.qemus.resize_with(n, || None);
    let result = sup.start();
    match result {
        Ok(()) => {
            sup.state.status = Status::Up;
            sup.state.save(run_dir)?;
            sup.ev.say("up");
            let _ = fs::remove_file(request_sock(run_dir));
            let listener = std::os::unix::net::UnixListener::bind(request_sock(run_dir))?;
            listener.set_nonblocking(true)?;
            sup.watch(&listener)?;
        }
        Err(e) => {
            sup.state.message = format!("{e:#}");
            sup.ev.say(&format!("failed: {}", sup.state.message));
        }
    }
    let failed = sup.state.status != Status::Up;
    sup.state.status = Status::Stopping;
    sup.state.save(run_dir)?;
    sup.teardown();
    for n in 0..sup.plan.nodes {
        let nd = node_dir(run_dir, n);
        let _ = fs::remove_file(nd.join("adapter.sock"));
        let _ = fs::remove_file(nd.join("agent.sock"));
    }
    for f in ["hub.sock", "hub.ctl", "hub.secret", "hub.tcp", "supervisor.sock"] {
        let _ = fs::remove_file(run_dir.join(f));
    }
    let _ = fs::remove_file(ivshmem_path(run_dir));
    sup.state.status = if failed { Status::Failed } else { Status::Down };
    sup.state.save(run_dir)?;
    sup.ev.say(if failed { "torn down after failure" } else { "down" });
    Ok(())
}

/// Stops a child: SIGTERM, then SIGKILL after 5 s; returns how it ended.
fn stop_child(c: &mut Child) -> String {
    if let Ok(Some(st)) = c.try_wait() {
        return st.to_string();
    }
    // SAFETY: kill(2) on our own child, not yet reaped.
    unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
    let t0 = Instant::now();
    loop {
        if let Ok(Some(st)) = c.try_wait() {
            return st.to_string();
        }
        if t0.elapsed() > Duration::from_secs(5) {
            let _ = c.kill();
            return c.wait().map(|s| s.to_string()).unwrap_or_else(|e| e.to_string());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The supervisor's children and bookkeeping.
struct Sup {
    plan: Plan,
    state: State,
    ev: Events,
    stop: Arc<AtomicBool>,
    hub: Option<Child>,
    /// Per-guest mode: each node's `mc-adapter`.
    adapters: Vec<Option<Child>>,
    qemus: Vec<Option<Child>>,
    /// The guests' LAN, set up before the first QEMU starts.
    lan: Option<Lan>,
    /// Whether the events already say real-time priority was refused.
    rt_warned: bool,
}

impl Sup {
    fn in_hub(&self) -> bool {
        self.plan.config.cluster.in_hub()
    }

    fn save(&self) -> Result<()> {
        self.state.save(&self.plan.run_dir)
    }

    /// The hub's arguments; `tcp_listen` is where it listens with the TCP
    /// transport (a restarted hub keeps the address the adapters were given).
    fn hub_argv(&self, tcp_listen: &str) -> Vec<String> {
        let (plan, rd, c) = (&self.plan, &self.plan.run_dir, &self.plan.config);
        let mut argv = vec![
            plan.hub_bin.display().to_string(),
            "--socket".into(),
            rd.join("hub.sock").display().to_string(),
            "--max-nodes".into(),
            c.cluster.hub_ports.to_string(),
            "--control".into(),
            rd.join("hub.ctl").display().to_string(),
            "--queue-depth".into(),
            c.hub.queue_depth.to_string(),
            "--stall-timeout".into(),
            c.hub.stall_timeout_s.to_string(),
        ];
        if c.hub.pcap {
            argv.extend(["--pcap".into(), rd.join("hub.pcap").display().to_string()]);
        }
        if c.cluster.in_hub() {
            // The hub serves every guest's adapter: one local port per node.
            argv.extend([
                "--aspace-mib".into(),
                c.cluster.aspace_mib.to_string(),
                "--write-multiple".into(),
                c.qemu.write_multiple.clone(),
            ]);
            for n in 0..plan.nodes {
                let sock = node_dir(rd, n).join("adapter.sock");
                argv.extend(["--local".into(), format!("{n}:{}-node{n}:{}", plan.name, sock.display())]);
            }
        }
        if c.hub.transport == "tcp" {
            argv.extend([
                "--tcp".into(),
                tcp_listen.to_string(),
                "--tcp-addr-file".into(),
                rd.join("hub.tcp").display().to_string(),
                "--secret-file".into(),
                rd.join("hub.secret").display().to_string(),
            ]);
        }
        argv
    }

    /// Starts the hub and waits until it (and every local port) listens.
    /// A restart (`first` false) reuses the secret and the TCP address.
    fn start_hub(&mut self, first: bool) -> Result<()> {
        let rd = self.plan.run_dir.clone();
        let tcp = self.plan.config.hub.transport == "tcp";
        let addr_file = rd.join("hub.tcp");
        let mut listen = self.plan.config.hub.tcp_listen.clone();
        if first {
            if tcp {
                write_secret(&rd.join("hub.secret"))?;
            }
        } else if let Ok(a) = fs::read_to_string(&addr_file) {
            listen = a.trim().to_string();
        }
        // Stale sockets of a hub killed hard would read as ready at once.
        let _ = fs::remove_file(rd.join("hub.sock"));
        let _ = fs::remove_file(&addr_file);
        for n in 0..self.plan.nodes {
            let nd = node_dir(&rd, n);
            fs::create_dir_all(&nd)?;
            if self.in_hub() {
                let _ = fs::remove_file(nd.join("adapter.sock"));
            }
        }
        let log = rd.join("hub.log");
        if !first {
            // Keep the dead hub's log next to the new one.
            let _ = fs::rename(&log, rd.join(format!("hub.log.{}", self.state.hub_restarts)));
        }
        let mut hub = spawn(&self.hub_argv(&listen), &log, None, self.plan.config.qemu.io_realtime)?;
        let pid = hub.id();
        let ready = if tcp { addr_file.clone() } else { rd.join("hub.sock") };
        let mut r = wait_for_path(&ready, &mut hub, "mc-hub", Duration::from_secs(10), &log);
        if self.in_hub() {
            for n in 0..self.plan.nodes {
                if r.is_ok() {
                    let sock = node_dir(&rd, n).join("adapter.sock");
                    let what = format!("local port of node {n}");
                    r = wait_for_path(&sock, &mut hub, &what, Duration::from_secs(10), &log);
                }
            }
        }
        self.hub = Some(hub);
        if first {
            self.state.hub_pid = pid;
            if self.in_hub() {
                self.state.nodes.iter_mut().for_each(|ns| ns.adapter_pid = pid);
            }
        } else {
            self.state.hub_restarted(pid, self.in_hub());
        }
        self.save()?;
        r
    }

    /// What adapters are told: the socket, or the TCP address and the secret.
    fn adapter_hub_args(&self) -> Result<Vec<String>> {
        let rd = &self.plan.run_dir;
        let mut a = vec!["--hub".to_string()];
        if self.plan.config.hub.transport == "tcp" {
            let addr = fs::read_to_string(rd.join("hub.tcp"))?;
            a.extend([
                format!("tcp:{}", addr.trim()),
                "--secret-file".into(),
                rd.join("hub.secret").display().to_string(),
            ]);
        } else {
            a.push(rd.join("hub.sock").display().to_string());
        }
        Ok(a)
    }

    /// Per-guest mode: starts node `n`'s adapter and waits until it listens.
    fn start_adapter(&mut self, n: usize) -> Result<u32> {
        let (plan, c) = (&self.plan, &self.plan.config);
        let nd = node_dir(&plan.run_dir, n);
        fs::create_dir_all(&nd)?;
        let sock = nd.join("adapter.sock");
        let _ = fs::remove_file(&sock);
        let log = nd.join("adapter.log");
        let mut argv = vec![plan.adapter_bin.display().to_string(), "--socket".into(), sock.display().to_string()];
        argv.extend(self.adapter_hub_args()?);
        argv.extend([
            "--node".into(),
            n.to_string(),
            "--name".into(),
            format!("{}-node{n}", plan.name),
            "--aspace-mib".into(),
            c.cluster.aspace_mib.to_string(),
            "--write-multiple".into(),
            c.qemu.write_multiple.clone(),
        ]);
        let mut ad = spawn(&argv, &log, None, self.plan.config.qemu.io_realtime)?;
        let pid = ad.id();
        let r = wait_for_path(&sock, &mut ad, &format!("mc-adapter of node {n}"), Duration::from_secs(15), &log);
        self.adapters[n] = Some(ad);
        r.map(|()| pid)
    }

    fn start_qemu(&mut self, n: usize) -> Result<u32> {
        let log = node_dir(&self.plan.run_dir, n).join("qemu.log");
        let lan = self.lan.as_ref().context("the LAN is not set up")?;
        let q = spawn(&qemu_argv(&self.plan, n, lan), &log, lan.netns(), false)?;
        let pid = q.id();
        self.qemus[n] = Some(q);
        Ok(pid)
    }

    /// Node `n`'s QEMU threads other than its vCPUs go real-time
    /// (`[qemu] qemu_realtime`); by the time its agent answers, QEMU has made
    /// every thread it keeps.
    fn realtime_io(&mut self, n: usize) {
        if !self.plan.config.qemu.qemu_realtime {
            return;
        }
        let Some(pid) = self.qemus[n].as_ref().map(Child::id) else { return };
        if let Err(e) = crate::priority::realtime_io_threads(pid) {
            if !self.rt_warned {
                self.rt_warned = true;
                self.ev.say(&format!("host I/O threads stay at normal priority: {e}"));
            }
        }
    }

    /// Waits until the agents of `nodes` answer (QEMUs started at `t0`),
    /// then until their `mpid` listens: a job started right after `up`
    /// finds every node's launch daemon.
    fn wait_ready(&mut self, nodes: &[usize], t0: Instant) -> Result<()> {
        self.wait_agents(nodes, t0)?;
        self.wait_mpid(nodes, t0)
    }

    /// Waits until every `mpid` of `nodes` has logged that it listens
    /// (`guest/mpiexec/src/daemon.rs`, `serve`). A guest image without
    /// `mpid` counts as ready. With imcd, an `mpid` that gave up waiting for
    /// it (listening on shared memory only) is reported.
    fn wait_mpid(&mut self, nodes: &[usize], t0: Instant) -> Result<()> {
        let rd = self.plan.run_dir.clone();
        let deadline = t0 + Duration::from_secs(self.plan.config.qemu.boot_timeout_s);
        let probe: Vec<String> = ["sh", "-c", MPID_PROBE].iter().map(|s| s.to_string()).collect();
        let mut pending: Vec<usize> = nodes.to_vec();
        while !pending.is_empty() {
            if self.stop.load(Ordering::SeqCst) {
                bail!("interrupted while waiting for mpid");
            }
            let mut still = Vec::new();
            for n in pending {
                let mut out = Vec::new();
                let io = Streams { stdin: None, out: &mut out, err: &mut std::io::sink() };
                match agent::exec(&agent_sock(&rd, n), &probe, io, 5) {
                    Ok(e) if e.code == 0 => {
                        let line = String::from_utf8_lossy(&out).trim().to_string();
                        if self.plan.config.guest.imcd && line.contains("shared memory only") {
                            self.ev
                                .say(&format!("node {n}: mpid serves this guest only (imcd did not answer): {line}"));
                        }
                        let s = t0.elapsed().as_secs_f64();
                        self.state.nodes[n].ready_s = Some(s);
                        let what = if line.is_empty() { "" } else { " (mpid listening)" };
                        self.ev.say(&format!("node {n} ready after {s:.1} s{what}"));
                    }
                    _ => still.push(n),
                }
            }
            pending = still;
            if pending.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                let late: Vec<String> = pending.iter().map(|n| n.to_string()).collect();
                bail!(
                    "mpid of node(s) {} not listening within {} s (in the guest: /var/log/mpid.log)",
                    late.join(","),
                    self.plan.config.qemu.boot_timeout_s
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        self.save()
    }

    /// Waits until the agents of `nodes` answer (QEMUs started at `t0`).
    fn wait_agents(&mut self, nodes: &[usize], t0: Instant) -> Result<()> {
        let rd = self.plan.run_dir.clone();
        let timeout = self.plan.config.qemu.boot_timeout_s;
        let deadline = t0 + Duration::from_secs(timeout);
        let mut ready: Vec<usize> = Vec::new();
        while ready.len() < nodes.len() {
            if self.stop.load(Ordering::SeqCst) {
                bail!("interrupted while guests were booting");
            }
            let pending: Vec<usize> = nodes.iter().copied().filter(|n| !ready.contains(n)).collect();
            for n in pending {
                let log = node_dir(&rd, n).join("qemu.log");
                if let Some(q) = self.qemus[n].as_mut() {
                    if let Some(st) = q.try_wait()? {
                        self.state.qemu_exited(n, &st.to_string());
                        self.save()?;
                        bail!("QEMU of node {n} exited ({st}) during boot: {}", tail(&log, 3));
                    }
                }
                if agent::ping(&agent_sock(&rd, n), Duration::from_millis(500)).is_ok() {
                    ready.push(n);
                    self.realtime_io(n);
                    self.ev.say(&format!("node {n}: agent answers after {:.1} s", t0.elapsed().as_secs_f64()));
                }
            }
            if Instant::now() > deadline {
                let late: Vec<String> = nodes.iter().filter(|n| !ready.contains(n)).map(|n| n.to_string()).collect();
                bail!(
                    "node(s) {} did not answer within {timeout} s (console: {})",
                    late.join(","),
                    node_dir(&rd, nodes[0]).join("console.log").display()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    fn start(&mut self) -> Result<()> {
        let c = self.plan.config.clone();
        self.start_hub(true)?;
        if c.hub.transport == "tcp" {
            let addr = fs::read_to_string(self.plan.run_dir.join("hub.tcp"))?;
            self.ev.say(&format!("hub listening ({} ports) on tcp:{}", c.cluster.hub_ports, addr.trim()));
        } else {
            self.ev.say(&format!("hub listening ({} ports)", c.cluster.hub_ports));
        }
        if self.in_hub() {
            self.ev.say(&format!("{} adapters on local ports of the hub", self.plan.nodes));
        } else {
            for n in 0..self.plan.nodes {
                let r = self.start_adapter(n);
                if let Some(a) = &self.adapters[n] {
                    self.state.nodes[n].adapter_pid = a.id();
                }
                r?;
            }
            self.ev.say(&format!("{} adapters joined the hub", self.plan.nodes));
        }
        if c.guest.ivshmem {
            create_ivshmem(&self.plan.run_dir)?;
        }
        let lan = Lan::set_up(&c.guest.lan, &self.plan.run_dir)?;
        self.ev.say(&format!("LAN: {}", lan.describe()));
        self.state.lan = lan.name().to_string();
        self.lan = Some(lan);
        let t0 = Instant::now();
        for n in 0..self.plan.nodes {
            self.state.nodes[n].qemu_pid = self.start_qemu(n)?;
        }
        self.save()?;
        self.ev.say(&format!("{} guests booting ({})", self.plan.nodes, self.plan.accel));
        let all: Vec<usize> = (0..self.plan.nodes).collect();
        self.wait_ready(&all, t0)
    }

    /// Stops node `n`'s QEMU (if it runs) and records how it ended.
    fn stop_qemu(&mut self, n: usize) {
        if let Some(mut q) = self.qemus[n].take() {
            let how = stop_child(&mut q);
            if self.state.nodes[n].qemu_exit.is_none() {
                self.state.qemu_exited(n, &format!("stopped by the supervisor: {how}"));
            }
        }
    }

    /// Per-guest: stops node `n`'s adapter (the hub announces the node failed).
    fn stop_adapter(&mut self, n: usize, why: &str) {
        if let Some(mut a) = self.adapters[n].take() {
            let how = stop_child(&mut a);
            if self.state.nodes[n].adapter_exit.is_none() {
                self.state.adapter_exited(n, &format!("stopped ({why}): {how}"));
            }
        }
    }

    /// Restarts node `n`: a new QEMU and, per-guest, a new adapter; returns
    /// once its agent answers.
    fn restart_node(&mut self, n: usize) -> Result<String> {
        self.ev.say(&format!("node {n}: restarting"));
        self.stop_qemu(n);
        if !self.in_hub() {
            self.stop_adapter(n, "node restart");
        }
        self.save()?;
        let adapter_pid = if self.in_hub() { self.state.hub_pid } else { self.start_adapter(n)? };
        let t0 = Instant::now();
        let qemu_pid = self.start_qemu(n)?;
        self.state.node_restarted(n, adapter_pid, qemu_pid);
        self.save()?;
        self.wait_ready(&[n], t0)?;
        let s = self.state.nodes[n].ready_s.unwrap_or_default();
        Ok(format!("node {n} restarted: qemu pid {qemu_pid}, adapter pid {adapter_pid}, ready after {s:.1} s"))
    }

    /// Restarts the hub with the same arguments. Per-guest, the adapters
    /// rejoin by themselves; in-hub, every guest is restarted too.
    fn restart_hub(&mut self) -> Result<String> {
        let in_hub = self.in_hub();
        self.ev.say(if in_hub { "hub: restarting with every guest (in-hub)" } else { "hub: restarting" });
        if in_hub {
            for n in 0..self.plan.nodes {
                self.stop_qemu(n);
            }
        }
        if let Some(mut h) = self.hub.take() {
            stop_child(&mut h);
        }
        self.start_hub(false)?;
        let pid = self.state.hub_pid;
        if !in_hub {
            self.ev.say(&format!("hub restarted (pid {pid}); the adapters rejoin"));
            return Ok(format!("hub restarted: pid {pid}; the adapters rejoin"));
        }
        let t0 = Instant::now();
        for n in 0..self.plan.nodes {
            let q = self.start_qemu(n)?;
            self.state.node_restarted(n, pid, q);
        }
        self.save()?;
        let all: Vec<usize> = (0..self.plan.nodes).collect();
        self.wait_ready(&all, t0)?;
        self.ev.say(&format!("hub restarted (pid {pid}) with every guest"));
        Ok(format!("hub restarted: pid {pid}; in-hub mode, so every guest was restarted too"))
    }

    /// Handles one request line from `mc-cluster`.
    fn handle(&mut self, req: &str) -> Result<String> {
        let words: Vec<&str> = req.split_whitespace().collect();
        match words.as_slice() {
            ["restart-hub"] => self.restart_hub(),
            ["restart-node", n] => {
                let n: usize = n.parse().map_err(|_| anyhow::anyhow!("bad node '{n}'"))?;
                if n >= self.plan.nodes {
                    bail!("node {n} does not exist: the cluster has nodes 0 to {}", self.plan.nodes - 1);
                }
                self.restart_node(n)
            }
            _ => bail!("unknown request '{req}'"),
        }
    }

    fn serve_requests(&mut self, listener: &std::os::unix::net::UnixListener) -> Result<()> {
        use std::io::{BufRead, BufReader};
        while let Ok((s, _)) = listener.accept() {
            s.set_nonblocking(false)?;
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            let mut line = String::new();
            if BufReader::new(&s).read_line(&mut line).is_err() {
                continue;
            }
            let answer = match self.handle(line.trim()) {
                Ok(msg) => format!("ok {msg}"),
                Err(e) => {
                    let msg = format!("{e:#}").replace('\n', " ");
                    self.ev.say(&format!("request '{}' failed: {msg}", line.trim()));
                    format!("error {msg}")
                }
            };
            let _ = writeln!(&s, "{answer}");
        }
        Ok(())
    }

    /// Carries out `r`; a failure is logged and left in `state.message`.
    fn react(&mut self, r: Reaction) {
        let res = match r {
            Reaction::NodeDown => Ok(()),
            Reaction::TakeOut(n) => {
                self.stop_adapter(n, "its QEMU exited");
                self.ev.say(&format!("node {n}: adapter stopped, the node is out of the cluster"));
                Ok(())
            }
            Reaction::RestartNode(n) => self.restart_node(n).map(|m| self.ev.say(&m)),
            Reaction::FailNode(n) => {
                self.stop_qemu(n);
                self.ev.say(&format!("node {n}: adapter died again; node left down (mc-cluster restart {n})"));
                Ok(())
            }
            Reaction::RestartHub | Reaction::RebootCluster => self.restart_hub().map(|_| ()),
            Reaction::GiveUpHub => {
                self.ev.say("hub died again; left down (mc-cluster hub restart)");
                Ok(())
            }
        };
        if let Err(e) = res {
            self.state.message = format!("{e:#}");
            self.ev.say(&format!("{r:?} failed: {}", self.state.message));
        }
        let _ = self.save();
    }

    /// The next child that exited on its own, recorded in the state.
    fn next_exit(&mut self) -> Result<Option<Exited>> {
        if let Some(h) = self.hub.as_mut() {
            if let Some(st) = h.try_wait()? {
                self.hub = None;
                self.state.hub_exited(&st.to_string(), self.in_hub());
                self.ev.say(&format!("hub exited ({st})"));
                return Ok(Some(Exited::Hub));
            }
        }
        for n in 0..self.plan.nodes {
            // The adapter first: its QEMU aborts within milliseconds of
            // losing it, and both may be seen dead in one poll; the cause is
            // the adapter (a QEMU that dies first is noticed while its
            // adapter still runs: the supervisor stops that one itself).
            if let Some(st) = self.adapters[n].as_mut().map(|a| a.try_wait()).transpose()?.flatten() {
                self.adapters[n] = None;
                self.state.adapter_exited(n, &st.to_string());
                self.ev.say(&format!("node {n}: adapter exited ({st})"));
                return Ok(Some(Exited::Adapter(n)));
            }
            if let Some(st) = self.qemus[n].as_mut().map(|q| q.try_wait()).transpose()?.flatten() {
                self.qemus[n] = None;
                self.state.qemu_exited(n, &st.to_string());
                self.ev.say(&format!("node {n}: QEMU exited ({st})"));
                return Ok(Some(Exited::Qemu(n)));
            }
        }
        Ok(None)
    }

    fn watch(&mut self, listener: &std::os::unix::net::UnixListener) -> Result<()> {
        let mut auto_node = vec![0u32; self.plan.nodes];
        let mut auto_hub = 0u32;
        while !self.stop.load(Ordering::SeqCst) {
            self.serve_requests(listener)?;
            while let Some(what) = self.next_exit()? {
                self.save()?;
                let r = match what {
                    Exited::Hub => {
                        auto_hub += 1;
                        reaction(self.in_hub(), what, auto_hub - 1)
                    }
                    Exited::Adapter(n) => {
                        auto_node[n] += 1;
                        reaction(self.in_hub(), what, auto_node[n] - 1)
                    }
                    Exited::Qemu(_) => reaction(self.in_hub(), what, 0),
                };
                self.react(r);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    fn teardown(&mut self) {
        // Guests first, then adapters, then the hub: each layer sees its peer
        // go in the order a real cluster would be powered down.
        let mut layers: Vec<Vec<Child>> = vec![
            self.qemus.iter_mut().filter_map(Option::take).collect(),
            self.adapters.iter_mut().filter_map(Option::take).collect(),
            self.hub.take().into_iter().collect(),
        ];
        for layer in &mut layers {
            for c in layer.iter_mut() {
                if c.try_wait().ok().flatten().is_none() {
                    // SAFETY: kill(2) on our own child, not yet reaped.
                    unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
                }
            }
            for c in layer.iter_mut() {
                stop_child(c);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(config: &str) -> Plan {
        Plan {
            name: "t".into(),
            nodes: 2,
            run_dir: PathBuf::from("/r"),
            share: PathBuf::from("/r/my,share"),
            hub_bin: PathBuf::from("mc-hub"),
            adapter_bin: PathBuf::from("mc-adapter"),
            qemu: PathBuf::from("qemu"),
            kernel: PathBuf::from("k"),
            initrd: PathBuf::from("i"),
            accel: "tcg".into(),
            config: Config::parse(config).unwrap(),
            host_cpus: 2,
        }
    }

    fn no_lan() -> Lan {
        Lan::plain(crate::lan::Backend::Off)
    }

    #[test]
    fn guests_get_their_lan_and_the_node_count() {
        let p = plan("");
        let mcast = Lan::plain(crate::lan::Backend::Mcast);
        let a = qemu_argv(&p, 1, &mcast).join(" ");
        assert!(a.contains("mc.node=1 mc.nodes=2 mc.imcd=1"), "{a}");
        assert!(!a.contains("oversubscribed"), "2 guests of 1 vCPU on 2 host cores: {a}");
        let four = Plan { nodes: 4, ..plan("") };
        let a = qemu_argv(&four, 3, &mcast).join(" ");
        assert!(a.contains("mc.node=3 mc.nodes=4 mc.imcd=1 mc.oversubscribed=1"), "{a}");
        let unknown = Plan { nodes: 4, host_cpus: 0, ..plan("") };
        assert!(!qemu_argv(&unknown, 3, &mcast).join(" ").contains("oversubscribed"));
        assert!(a.contains("-netdev socket,id=lan,mcast=230.0.0.1:") && a.contains("host_mtu=65000"), "{a}");
        let none = qemu_argv(&p, 1, &no_lan()).join(" ");
        assert!(!none.contains("-netdev"), "{none}");
    }

    #[test]
    fn ivshmem_device_only_when_asked() {
        let off = qemu_argv(&plan(""), 1, &no_lan()).join(" ");
        assert!(!off.contains("ivshmem"), "{off}");
        let on = qemu_argv(&plan("[guest]\nivshmem = true"), 1, &no_lan()).join(" ");
        assert!(
            on.contains("-object memory-backend-file,id=ivsh,share=on,mem-path=/r/ivshmem,size=1M")
                && on.contains("-device ivshmem-plain,memdev=ivsh"),
            "{on}"
        );
    }

    #[test]
    fn cpu_model_follows_the_accelerator_unless_set() {
        let cpu = |p: &Plan| {
            let a = qemu_argv(p, 0, &no_lan());
            a[a.iter().position(|s| s == "-cpu").unwrap() + 1].clone()
        };
        assert_eq!(cpu(&plan("")), "max,-erms,-fsrm");
        let mut kvm = plan("");
        kvm.accel = "kvm".into();
        assert_eq!(cpu(&kvm), "host");
        assert_eq!(cpu(&plan("[qemu]\ncpu = \"max\"")), "max");
    }

    #[test]
    fn every_guest_gets_the_shared_folder() {
        for n in 0..2 {
            let a = qemu_argv(&plan(""), n, &no_lan()).join(" ");
            assert!(
                a.contains("-fsdev local,id=share,path=/r/my,,share,security_model=none")
                    && a.contains("-device virtio-9p-pci,fsdev=share,mount_tag=mcshare"),
                "{a}"
            );
        }
    }

    #[test]
    fn qemu_versions_parse() {
        use crate::parse_qemu_version;
        let v = parse_qemu_version("QEMU emulator version 10.2.2 (Debian 1:10.2.2+ds-1)\nCopyright").unwrap();
        assert_eq!(v, (10, 2));
        assert!(parse_qemu_version("no version here").is_err());
        assert!(parse_qemu_version("QEMU emulator version x.y").is_err());
    }

    #[test]
    fn adapters_setting_is_checked() {
        assert!(Config::parse("[cluster]\nadapters = \"in-hub\"").unwrap().cluster.in_hub());
        assert!(!Config::parse("[cluster]\nadapters = \"per-guest\"").unwrap().cluster.in_hub());
        let e = Config::parse("[cluster]\nadapters = \"both\"").unwrap_err().to_string();
        assert!(e.contains("in-hub or per-guest"), "{e}");
        let e = Config::parse("[hub]\ntransport = \"tcp\"").unwrap_err().to_string();
        assert!(e.contains("per-guest"), "{e}");
        let e = Config::parse("[qemu]\nwrite_multiple = \"yes\"").unwrap_err().to_string();
        assert!(e.contains("on, off or auto"), "{e}");
        assert_eq!(Config::parse("[qemu]\nwrite_multiple = \"off\"").unwrap().qemu.write_multiple, "off");
        assert_eq!(Config::parse("").unwrap().qemu.write_multiple, "auto");
    }

    fn state(nodes: usize) -> State {
        State {
            status: Status::Up,
            supervisor_pid: 1,
            hub_pid: 10,
            nodes: (0..nodes)
                .map(|n| NodeState { adapter_pid: 20 + n as u32, qemu_pid: 30 + n as u32, ..Default::default() })
                .collect(),
            message: String::new(),
            accel: "tcg".into(),
            share: PathBuf::new(),
            hub_exit: None,
            hub_restarts: 0,
            lan: String::new(),
        }
    }

    #[test]
    fn exits_and_restarts_keep_the_pids_true() {
        let mut st = state(2);
        st.qemu_exited(1, "signal: 9 (SIGKILL)");
        st.adapter_exited(1, "stopped (its QEMU exited): exit status: 0");
        assert_eq!(st.nodes[1].qemu_exit.as_deref(), Some("signal: 9 (SIGKILL)"));
        assert!(st.nodes[0].qemu_exit.is_none() && st.nodes[0].adapter_exit.is_none());
        st.node_restarted(1, 41, 51);
        let n1 = &st.nodes[1];
        assert_eq!((n1.adapter_pid, n1.qemu_pid, n1.restarts), (41, 51, 1));
        assert!(n1.qemu_exit.is_none() && n1.adapter_exit.is_none() && n1.ready_s.is_none());
        // Per-guest: a new hub leaves the adapters' pids alone.
        st.hub_exited("signal: 9 (SIGKILL)", false);
        assert!(st.hub_exit.is_some() && st.nodes[0].adapter_exit.is_none());
        st.hub_restarted(11, false);
        assert_eq!((st.hub_pid, st.hub_restarts, st.nodes[0].adapter_pid), (11, 1, 20));
        assert!(st.hub_exit.is_none());
        // In-hub: the hub is every node's adapter.
        st.hub_exited("signal: 9 (SIGKILL)", true);
        assert!(st.nodes.iter().all(|n| n.adapter_exit.as_deref().is_some_and(|h| h.contains("hub"))));
        st.hub_restarted(12, true);
        assert!(st.nodes.iter().all(|n| n.adapter_pid == 12 && n.adapter_exit.is_none()));
        assert_eq!(st.hub_restarts, 2);
    }

    #[test]
    fn state_round_trips_and_old_files_still_load() {
        let dir = tempfile::tempdir().unwrap();
        let mut st = state(2);
        st.qemu_exited(0, "exit status: 1");
        st.save(dir.path()).unwrap();
        let back = State::load(dir.path()).unwrap();
        assert_eq!(back.nodes[0].qemu_exit.as_deref(), Some("exit status: 1"));
        assert_eq!(back.nodes[1].adapter_pid, 21);
        // A state.json written before the restart bookkeeping existed.
        let old = r#"{"status":"up","supervisor_pid":1,"hub_pid":2,"message":"","accel":"tcg",
            "nodes":[{"adapter_pid":3,"qemu_pid":4,"qemu_exit":null,"ready_s":1.0}]}"#;
        fs::write(dir.path().join("state.json"), old).unwrap();
        let st = State::load(dir.path()).unwrap();
        assert_eq!((st.hub_restarts, st.nodes[0].restarts), (0, 0));
        assert!(st.hub_exit.is_none() && st.nodes[0].adapter_exit.is_none());
    }

    #[test]
    fn exit_policy() {
        use Reaction::*;
        // A dead QEMU takes its node out: per-guest by stopping its adapter,
        // in-hub the hub already announced it.
        assert_eq!(reaction(false, Exited::Qemu(1), 0), TakeOut(1));
        assert_eq!(reaction(true, Exited::Qemu(1), 0), NodeDown);
        // A dead adapter restarts its node, up to the limit.
        assert_eq!(reaction(false, Exited::Adapter(0), 0), RestartNode(0));
        assert_eq!(reaction(false, Exited::Adapter(0), MAX_AUTO_RESTARTS - 1), RestartNode(0));
        assert_eq!(reaction(false, Exited::Adapter(0), MAX_AUTO_RESTARTS), FailNode(0));
        // A dead hub is restarted; in-hub that is a cluster reboot.
        assert_eq!(reaction(false, Exited::Hub, 0), RestartHub);
        assert_eq!(reaction(true, Exited::Hub, 0), RebootCluster);
        assert_eq!(reaction(true, Exited::Hub, MAX_AUTO_RESTARTS), GiveUpHub);
    }

    #[test]
    fn a_restarted_hub_keeps_its_arguments_and_tcp_address() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = plan("[cluster]\nadapters = \"per-guest\"\n[hub]\ntransport = \"tcp\"");
        p.run_dir = dir.path().to_path_buf();
        let sup = Sup {
            state: state(2),
            ev: Events(File::create(dir.path().join("events.log")).unwrap()),
            stop: Arc::new(AtomicBool::new(false)),
            hub: None,
            adapters: vec![],
            qemus: vec![],
            lan: None,
            rt_warned: false,
            plan: p,
        };
        let first = sup.hub_argv("127.0.0.1:0");
        let again = sup.hub_argv("127.0.0.1:4711");
        let diff: Vec<_> = first.iter().zip(&again).filter(|(a, b)| a != b).collect();
        assert_eq!(diff, vec![(&"127.0.0.1:0".to_string(), &"127.0.0.1:4711".to_string())]);
        assert!(!first.iter().any(|a| a == "--local"), "{first:?}");
    }

    #[test]
    fn requests_reach_the_supervisor_and_errors_come_back() {
        let dir = tempfile::tempdir().unwrap();
        let l = std::os::unix::net::UnixListener::bind(request_sock(dir.path())).unwrap();
        let t = std::thread::spawn(move || {
            use std::io::{BufRead, BufReader};
            for answer in ["ok node 1 restarted", "error node 9 does not exist"] {
                let (s, _) = l.accept().unwrap();
                let mut line = String::new();
                BufReader::new(&s).read_line(&mut line).unwrap();
                assert!(line.starts_with("restart-node "), "{line}");
                writeln!(&s, "{answer}").unwrap();
            }
        });
        let t5 = Duration::from_secs(5);
        assert_eq!(request(dir.path(), "restart-node 1", t5).unwrap(), "node 1 restarted");
        let e = request(dir.path(), "restart-node 9", t5).unwrap_err().to_string();
        assert_eq!(e, "node 9 does not exist");
        t.join().unwrap();
        let gone = tempfile::tempdir().unwrap();
        assert!(request(gone.path(), "restart-hub", t5).unwrap_err().to_string().contains("does not answer"));
    }
}
