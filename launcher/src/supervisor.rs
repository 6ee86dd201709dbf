//! The supervisor: the one background process that owns a running cluster.
//!
//! `mc-cluster up` starts it detached (its own session) and returns once it
//! reports the cluster up. It starts the hub, one adapter per node and one
//! QEMU per node, every child with `PR_SET_PDEATHSIG`, so nothing outlives it;
//! it waits for every guest agent, then watches the children until
//! `mc-cluster down` (SIGTERM) tells it to tear everything down.
//!
//! Run folder (`.run/<name>/`): `plan.json` (what to start), `state.json`
//! (status and pids), `events.log` (progress lines `up` prints),
//! `supervisor.log`, `hub.log`, `hub.sock`, `hub.ctl` (control), with the TCP
//! transport `hub.tcp` (address) and `hub.secret`, and `node<N>/` with
//! `adapter.{sock,log}`, `qemu.log`, `console.log`, `agent.sock`; with
//! `[guest] ivshmem`, `ivshmem` (the guests' shared memory, removed at the end);
//! `share/`, the default folder shared into the guests (kept by `up`).

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::agent;
use crate::config::{Config, IVSHMEM_MIB, SHARE_TAG};

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
    /// Offer vfio-user `write_multiple` to QEMU (`qemu.write_multiple`).
    pub write_multiple: bool,
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
}

impl State {
    /// Reads `state.json` from a run folder.
    pub fn load(run_dir: &Path) -> Result<State> {
        let p = run_dir.join("state.json");
        let text = fs::read_to_string(&p).with_context(|| format!("no cluster state at {}", p.display()))?;
        serde_json::from_str(&text).with_context(|| format!("corrupt {}", p.display()))
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

fn spawn(argv: &[String], log: &Path) -> Result<Child> {
    let out = File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let mut cmd = Command::new(&argv[0]);
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

/// The UDP port of the cluster's LAN multicast group: one per run folder,
/// so clusters side by side do not hear each other.
pub fn lan_port(run_dir: &Path) -> u16 {
    let h = run_dir
        .as_os_str()
        .as_encoded_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
    20000 + (h % 40000) as u16
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

/// QEMU's argument list for node `n`.
pub fn qemu_argv(plan: &Plan, n: usize) -> Vec<String> {
    let c = &plan.config;
    let nd = node_dir(&plan.run_dir, n);
    let mut a: Vec<String> = vec![plan.qemu.display().to_string()];
    let mut push = |s: &str| a.push(s.to_string());
    push("-name");
    push(&format!("mc-node{n},process=mc-node{n}"));
    for d in &c.qemu.firmware_dirs {
        push("-L");
        push(d);
    }
    push("-machine");
    push("q35,memory-backend=mem");
    push("-accel");
    push(&plan.accel);
    push("-cpu");
    push(if plan.accel == "kvm" { "host" } else { "max" });
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
    push(&format!("{} mc.node={n} mc.imcd={}", c.guest.cmdline, u8::from(c.guest.imcd)));
    if c.guest.lan {
        push("-netdev");
        push(&format!("socket,id=lan,mcast=230.0.0.1:{},localaddr=127.0.0.1", lan_port(&plan.run_dir)));
        push("-device");
        push(&format!("virtio-net-pci,netdev=lan,romfile=,mac=52:54:00:4d:{:02x}:{:02x}", n >> 8 & 0xFF, n & 0xFF));
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

/// Runs the supervisor for the plan in `run_dir` until SIGTERM.
pub fn run(run_dir: &Path) -> Result<()> {
    let plan: Plan = serde_json::from_slice(&fs::read(run_dir.join("plan.json")).context("reading plan.json")?)?;
    let stop = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGTERM, stop.clone())?;
    signal_hook::flag::register(signal_hook::consts::SIGINT, stop.clone())?;
    let mut events = Events(OpenOptions::new().create(true).append(true).open(run_dir.join("events.log"))?);
    let mut state = State {
        status: Status::Starting,
        supervisor_pid: std::process::id(),
        hub_pid: 0,
        nodes: vec![NodeState::default(); plan.nodes],
        message: String::new(),
        accel: plan.accel.clone(),
        share: plan.share.clone(),
    };
    state.save(run_dir)?;
    let mut children: Vec<(String, Child)> = Vec::new();
    let result = start(&plan, &mut state, &mut children, &mut events, &stop);
    match result {
        Ok(()) => {
            state.status = Status::Up;
            state.save(run_dir)?;
            events.say("up");
            watch(&plan, &mut state, &mut children, &mut events, &stop)?;
        }
        Err(e) => {
            state.message = format!("{e:#}");
            events.say(&format!("failed: {}", state.message));
        }
    }
    let failed = state.status != Status::Up;
    state.status = Status::Stopping;
    state.save(run_dir)?;
    teardown(&mut children);
    for n in 0..plan.nodes {
        let nd = node_dir(run_dir, n);
        let _ = fs::remove_file(nd.join("adapter.sock"));
        let _ = fs::remove_file(nd.join("agent.sock"));
    }
    let _ = fs::remove_file(run_dir.join("hub.sock"));
    let _ = fs::remove_file(run_dir.join("hub.ctl"));
    let _ = fs::remove_file(run_dir.join("hub.secret"));
    let _ = fs::remove_file(run_dir.join("hub.tcp"));
    let _ = fs::remove_file(ivshmem_path(run_dir));
    state.status = if failed { Status::Failed } else { Status::Down };
    state.save(run_dir)?;
    events.say(if failed { "torn down after failure" } else { "down" });
    Ok(())
}

fn start(
    plan: &Plan,
    state: &mut State,
    children: &mut Vec<(String, Child)>,
    ev: &mut Events,
    stop: &AtomicBool,
) -> Result<()> {
    let rd = &plan.run_dir;
    let c = &plan.config;
    let hub_sock = rd.join("hub.sock");
    let hub_log = rd.join("hub.log");
    let mut argv = vec![
        plan.hub_bin.display().to_string(),
        "--socket".into(),
        hub_sock.display().to_string(),
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
    let wm = if plan.write_multiple { "true" } else { "false" };
    if c.cluster.in_hub() {
        // The hub serves every guest's adapter: one local port per node.
        argv.extend(["--aspace-mib".into(), c.cluster.aspace_mib.to_string(), "--write-multiple".into(), wm.into()]);
        for n in 0..plan.nodes {
            let nd = node_dir(rd, n);
            fs::create_dir_all(&nd)?;
            argv.extend(["--local".into(), format!("{n}:{}-node{n}:{}", plan.name, nd.join("adapter.sock").display())]);
        }
    }
    let tcp = c.hub.transport == "tcp";
    let secret_file = rd.join("hub.secret");
    let addr_file = rd.join("hub.tcp");
    if tcp {
        write_secret(&secret_file)?;
        argv.extend([
            "--tcp".into(),
            c.hub.tcp_listen.clone(),
            "--tcp-addr-file".into(),
            addr_file.display().to_string(),
            "--secret-file".into(),
            secret_file.display().to_string(),
        ]);
    }
    let mut hub = spawn(&argv, &hub_log)?;
    state.hub_pid = hub.id();
    let ready = if tcp { &addr_file } else { &hub_sock };
    let mut r = wait_for_path(ready, &mut hub, "mc-hub", Duration::from_secs(10), &hub_log);
    if c.cluster.in_hub() {
        for n in 0..plan.nodes {
            if r.is_ok() {
                let sock = node_dir(rd, n).join("adapter.sock");
                r = wait_for_path(
                    &sock,
                    &mut hub,
                    &format!("local port of node {n}"),
                    Duration::from_secs(10),
                    &hub_log,
                );
            }
            state.nodes[n].adapter_pid = hub.id();
        }
    }
    children.push(("hub".into(), hub));
    r?;
    // What adapters are told: the socket, or the TCP address and the secret.
    let mut hub_args = vec!["--hub".to_string()];
    if tcp {
        let addr = fs::read_to_string(&addr_file)?;
        hub_args.extend([format!("tcp:{}", addr.trim()), "--secret-file".into(), secret_file.display().to_string()]);
        ev.say(&format!("hub listening ({} ports) on tcp:{}", c.cluster.hub_ports, addr.trim()));
    } else {
        hub_args.push(hub_sock.display().to_string());
        ev.say(&format!("hub listening ({} ports)", c.cluster.hub_ports));
    }

    for n in (0..plan.nodes).filter(|_| !c.cluster.in_hub()) {
        let nd = node_dir(rd, n);
        fs::create_dir_all(&nd)?;
        let sock = nd.join("adapter.sock");
        let log = nd.join("adapter.log");
        let mut argv = vec![plan.adapter_bin.display().to_string(), "--socket".into(), sock.display().to_string()];
        argv.extend(hub_args.iter().cloned());
        argv.extend([
            "--node".into(),
            n.to_string(),
            "--name".into(),
            format!("{}-node{n}", plan.name),
            "--aspace-mib".into(),
            c.cluster.aspace_mib.to_string(),
            "--write-multiple".into(),
            wm.into(),
        ]);
        let mut ad = spawn(&argv, &log)?;
        state.nodes[n].adapter_pid = ad.id();
        let r = wait_for_path(&sock, &mut ad, &format!("mc-adapter of node {n}"), Duration::from_secs(15), &log);
        children.push((format!("adapter{n}"), ad));
        r?;
    }
    if c.cluster.in_hub() {
        ev.say(&format!("{} adapters on local ports of the hub", plan.nodes));
    } else {
        ev.say(&format!("{} adapters joined the hub", plan.nodes));
    }

    if c.guest.ivshmem {
        create_ivshmem(rd)?;
    }
    let t0 = Instant::now();
    let mut qemu_idx = Vec::new();
    for n in 0..plan.nodes {
        let log = node_dir(rd, n).join("qemu.log");
        let q = spawn(&qemu_argv(plan, n), &log)?;
        state.nodes[n].qemu_pid = q.id();
        qemu_idx.push(children.len());
        children.push((format!("qemu{n}"), q));
    }
    state.save(rd)?;
    ev.say(&format!("{} guests booting ({})", plan.nodes, plan.accel));

    let deadline = t0 + Duration::from_secs(c.qemu.boot_timeout_s);
    let mut ready = vec![false; plan.nodes];
    while ready.iter().any(|r| !r) {
        if stop.load(Ordering::SeqCst) {
            bail!("interrupted while guests were booting");
        }
        for n in 0..plan.nodes {
            if ready[n] {
                continue;
            }
            let log = node_dir(rd, n).join("qemu.log");
            if let Some(st) = children[qemu_idx[n]].1.try_wait()? {
                bail!("QEMU of node {n} exited ({st}) during boot: {}", tail(&log, 3));
            }
            if agent::ping(&agent_sock(rd, n), Duration::from_millis(500)).is_ok() {
                ready[n] = true;
                let s = t0.elapsed().as_secs_f64();
                state.nodes[n].ready_s = Some(s);
                ev.say(&format!("node {n} ready after {s:.1} s"));
            }
        }
        if Instant::now() > deadline {
            let late: Vec<String> = (0..plan.nodes).filter(|&n| !ready[n]).map(|n| n.to_string()).collect();
            bail!(
                "node(s) {} did not answer within {} s (console: {})",
                late.join(","),
                c.qemu.boot_timeout_s,
                node_dir(rd, 0).join("console.log").display()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

fn watch(
    plan: &Plan,
    state: &mut State,
    children: &mut [(String, Child)],
    ev: &mut Events,
    stop: &AtomicBool,
) -> Result<()> {
    while !stop.load(Ordering::SeqCst) {
        for (name, child) in children.iter_mut() {
            if let Some(n) = name.strip_prefix("qemu").and_then(|s| s.parse::<usize>().ok()) {
                if state.nodes[n].qemu_exit.is_none() {
                    if let Some(st) = child.try_wait()? {
                        state.nodes[n].qemu_exit = Some(st.to_string());
                        state.save(&plan.run_dir)?;
                        ev.say(&format!("node {n}: QEMU exited ({st})"));
                    }
                }
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

fn teardown(children: &mut [(String, Child)]) {
    // Guests first, then adapters, then the hub: each layer sees its peer go
    // in the order a real cluster would be powered down.
    for prefix in ["qemu", "adapter", "hub"] {
        for (_, c) in children.iter_mut().filter(|(n, _)| n.starts_with(prefix)) {
            if c.try_wait().ok().flatten().is_none() {
                // SAFETY: kill(2) on our own child.
                unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            }
        }
        let t0 = Instant::now();
        for (_, c) in children.iter_mut().filter(|(n, _)| n.starts_with(prefix)) {
            while c.try_wait().ok().flatten().is_none() {
                if t0.elapsed() > Duration::from_secs(5) {
                    let _ = c.kill();
                    let _ = c.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
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
            write_multiple: false,
        }
    }

    #[test]
    fn ivshmem_device_only_when_asked() {
        let off = qemu_argv(&plan(""), 1).join(" ");
        assert!(!off.contains("ivshmem"), "{off}");
        let on = qemu_argv(&plan("[guest]\nivshmem = true"), 1).join(" ");
        assert!(
            on.contains("-object memory-backend-file,id=ivsh,share=on,mem-path=/r/ivshmem,size=1M")
                && on.contains("-device ivshmem-plain,memdev=ivsh"),
            "{on}"
        );
    }

    #[test]
    fn every_guest_gets_the_shared_folder() {
        for n in 0..2 {
            let a = qemu_argv(&plan(""), n).join(" ");
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
        assert!(e.contains("on or off"), "{e}");
        assert!(!Config::parse("[qemu]\nwrite_multiple = \"off\"").unwrap().qemu.write_multiple.contains("on"));
    }
}
