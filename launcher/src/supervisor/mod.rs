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
//!
//! Modules: [`state`] (plan and state files), [`qemu_args`] (QEMU's command
//! line), [`process`] (children), [`start`] (bringing the cluster up),
//! [`policy`] (what follows an exit), [`requests`] (the request socket's
//! client); this file holds the loop that watches the cluster.

mod policy;
mod process;
mod qemu_args;
mod requests;
mod start;
mod state;

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

pub use policy::{reaction, Exited, Reaction, MAX_AUTO_RESTARTS};
pub use process::tail;
pub use qemu_args::{adapter_device, ivshmem_path, qemu_argv, qmp_socket, ADAPTER_ID};
pub use requests::{request, request_sock};
pub use state::{agent_sock, node_dir, NodeState, Plan, State, Status};

use crate::lan::Lan;
use process::stop_child;

struct Events(File);

impl Events {
    fn say(&mut self, msg: &str) {
        let _ = writeln!(self.0, "{msg}");
        let _ = self.0.flush();
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
        let _ = fs::remove_file(nd.join("adapter.sock.trace"));
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
    /// In-hub mode: asks the running hub to restart in place (`mc-hub ctl
    /// restart`, `docs/hub.md`, "Hub restart"): the same process, every
    /// guest keeps running and sees a link flap. Done once the new process
    /// lists every node whose QEMU runs.
    fn restart_hub_in_place(&mut self) -> Result<String> {
        let alive = self.hub.as_mut().is_some_and(|h| matches!(h.try_wait(), Ok(None)));
        if !alive {
            bail!("the hub is not running");
        }
        let control = self.plan.run_dir.join("hub.ctl");
        let ctl = |req: &str| -> Result<String> {
            let out = std::process::Command::new(&self.plan.hub_bin)
                .arg("ctl")
                .arg("--control")
                .arg(&control)
                .arg(req)
                .output()
                .context("cannot run mc-hub ctl")?;
            if !out.status.success() {
                bail!("{}", String::from_utf8_lossy(&out.stderr).trim());
            }
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        };
        let t0 = Instant::now();
        ctl("restart")?;
        let running: Vec<usize> = (0..self.plan.nodes).filter(|&n| self.state.nodes[n].qemu_pid != 0).collect();
        let listed = |stats: &str| {
            let v: serde_json::Value = serde_json::from_str(stats).unwrap_or_default();
            let nodes = v["nodes"].as_array().cloned().unwrap_or_default();
            running.iter().all(|&n| nodes.iter().any(|s| s["node"].as_u64() == Some(n as u64)))
        };
        loop {
            if ctl("stats").is_ok_and(|s| listed(&s)) {
                break;
            }
            if self.hub.as_mut().is_some_and(|h| !matches!(h.try_wait(), Ok(None))) {
                bail!("the hub exited during its restart in place (see hub.log)");
            }
            if t0.elapsed() > Duration::from_secs(10) {
                bail!("the hub did not list nodes {running:?} within 10 s of its restart in place");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let took = t0.elapsed();
        let pid = self.state.hub_pid;
        self.state.hub_restarted(pid, true);
        self.save()?;
        let msg = format!(
            "hub restarted in place: pid {pid}, every guest kept running (local ports back {} ms after the request)",
            took.as_millis()
        );
        self.ev.say(&msg);
        Ok(msg)
    }

    fn restart_hub(&mut self) -> Result<String> {
        let in_hub = self.in_hub();
        if in_hub && self.hub.is_some() {
            match self.restart_hub_in_place() {
                Ok(msg) => return Ok(msg),
                Err(e) => self.ev.say(&format!("hub: restart in place failed ({e:#}); restarting with every guest")),
            }
        }
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

/// Test fixtures shared by the submodules' tests.
#[cfg(test)]
pub(crate) mod fixtures {
    use std::path::PathBuf;

    use super::*;
    use crate::config::Config;
    pub fn plan(config: &str) -> Plan {
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
    pub fn no_lan() -> Lan {
        Lan::plain(crate::lan::Backend::Off)
    }
    pub fn state(nodes: usize) -> State {
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
}
