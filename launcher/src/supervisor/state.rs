//! The cluster's plan (`plan.json`, what to start, written by `up`) and
//! state (`state.json`, status and pids, rewritten at every change), and
//! the per-node paths of the run folder. Read by the CLI's commands and
//! written only by the supervisor's one thread.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::config::Config;

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

    pub(super) fn save(&self, run_dir: &Path) -> Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::supervisor::fixtures::state;

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
}
