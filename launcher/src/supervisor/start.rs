//! Bringing the cluster up: the hub's and the adapters' arguments, starting
//! the hub, each node's adapter (per-guest) and QEMU, giving the I/O
//! threads real-time priority, and waiting for every guest's agent and
//! `mpid`. Methods of the supervisor, run on its one thread (at start and
//! for a restart).

use std::fs;
use std::process::Child;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::process::{spawn, tail, wait_for_path, write_secret};
use super::qemu_args::{create_ivshmem, qemu_argv};
use super::state::{agent_sock, node_dir};
use super::Sup;
use crate::agent::{self, Streams};
use crate::lan::Lan;

/// Run in a guest until it succeeds: prints `mpid`'s "listening" line, or
/// nothing for an image without `mpid`.
const MPID_PROBE: &str = "[ -x /bin/mpid ] || exit 0; grep -m1 'listening on handle' /var/log/mpid.log";

impl Sup {
    /// The hub's arguments; `tcp_listen` is where it listens with the TCP
    /// transport (a restarted hub keeps the address the adapters were given).
    pub(super) fn hub_argv(&self, tcp_listen: &str) -> Vec<String> {
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
            if c.guest.hotplug {
                argv.extend(["--interrupts".into(), "msi".into()]);
            }
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
    pub(super) fn start_hub(&mut self, first: bool) -> Result<()> {
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
        let argv = crate::hosts::on(&self.plan.config, self.plan.config.hub_host(), &self.hub_argv(&listen));
        let mut hub = spawn(&argv, &log, None, self.plan.config.qemu.io_realtime)?;
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

    /// What node `n`'s adapter is told: the socket, or the TCP address
    /// (its host's `hub_address` if it has one) and the secret.
    pub(super) fn adapter_hub_args(&self, n: usize) -> Result<Vec<String>> {
        let rd = &self.plan.run_dir;
        let c = &self.plan.config;
        let mut a = vec!["--hub".to_string()];
        if c.hub.transport == "tcp" {
            let via = c.hosts.get(c.node_host(n)).map(|h| h.hub_address.clone()).unwrap_or_default();
            let addr = if via.is_empty() { fs::read_to_string(rd.join("hub.tcp"))? } else { via };
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
    pub(super) fn start_adapter(&mut self, n: usize) -> Result<u32> {
        let (plan, c) = (&self.plan, &self.plan.config);
        let nd = node_dir(&plan.run_dir, n);
        fs::create_dir_all(&nd)?;
        let sock = nd.join("adapter.sock");
        let _ = fs::remove_file(&sock);
        let log = nd.join("adapter.log");
        let mut argv = vec![plan.adapter_bin.display().to_string(), "--socket".into(), sock.display().to_string()];
        argv.extend(self.adapter_hub_args(n)?);
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
        let argv = crate::hosts::on(c, c.node_host(n), &argv);
        let mut ad = spawn(&argv, &log, None, self.plan.config.qemu.io_realtime)?;
        let pid = ad.id();
        let r = wait_for_path(&sock, &mut ad, &format!("mc-adapter of node {n}"), Duration::from_secs(15), &log);
        self.adapters[n] = Some(ad);
        r.map(|()| pid)
    }

    pub(super) fn start_qemu(&mut self, n: usize) -> Result<u32> {
        let log = node_dir(&self.plan.run_dir, n).join("qemu.log");
        let lan = self.lan.as_ref().context("the LAN is not set up")?;
        let c = &self.plan.config;
        let q = spawn(&crate::hosts::on(c, c.node_host(n), &qemu_argv(&self.plan, n, lan)), &log, lan.netns(), false)?;
        let pid = q.id();
        self.qemus[n] = Some(q);
        Ok(pid)
    }

    /// Node `n`'s QEMU threads other than its vCPUs go real-time
    /// (`[qemu] qemu_realtime`); by the time its agent answers, QEMU has made
    /// every thread it keeps.
    pub(super) fn realtime_io(&mut self, n: usize) {
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
    pub(super) fn wait_ready(&mut self, nodes: &[usize], t0: Instant) -> Result<()> {
        self.wait_agents(nodes, t0)?;
        self.wait_mpid(nodes, t0)
    }

    /// Waits until every `mpid` of `nodes` has logged that it listens
    /// (`guest/launch/mpiexec/src/daemon.rs`, `serve`). A guest image without
    /// `mpid` counts as ready. With imcd, an `mpid` that gave up waiting for
    /// it (listening on shared memory only) is reported.
    pub(super) fn wait_mpid(&mut self, nodes: &[usize], t0: Instant) -> Result<()> {
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
    pub(super) fn wait_agents(&mut self, nodes: &[usize], t0: Instant) -> Result<()> {
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

    pub(super) fn start(&mut self) -> Result<()> {
        let c = self.plan.config.clone();
        self.start_hub(true)?;
        if c.hub.transport == "tcp" {
            let addr = fs::read_to_string(self.plan.run_dir.join("hub.tcp"))?;
            self.ev.say(&format!("hub listening ({} ports) on tcp:{}", c.cluster.hub_ports, addr.trim()));
        } else {
            self.ev.say(&format!("hub listening ({} ports)", c.cluster.hub_ports));
        }
        if c.spans_hosts() {
            let hosts: Vec<String> = (0..self.plan.nodes).map(|n| format!("{n}@{}", c.node_host(n))).collect();
            self.ev.say(&format!("across hosts: hub@{}, nodes {}", c.hub_host(), hosts.join(" ")));
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
        // A LAN joins the guests of one host: across hosts there is none
        // (the config check refuses tap and mcast there).
        let setting = if c.spans_hosts() { "off" } else { c.guest.lan.as_str() };
        let lan = Lan::set_up(setting, &self.plan.run_dir)?;
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
}

#[cfg(test)]
mod tests {
    use std::fs::File;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    use super::*;
    use crate::supervisor::fixtures::{plan, state};
    use crate::supervisor::Events;

    /// A supervisor of `p` with nothing running, its events in `dir`.
    fn sup_for(p: crate::supervisor::Plan, dir: &std::path::Path) -> Sup {
        Sup {
            state: state(2),
            ev: Events(File::create(dir.join("events.log")).unwrap()),
            stop: Arc::new(AtomicBool::new(false)),
            hub: None,
            adapters: vec![],
            qemus: vec![],
            lan: None,
            rt_warned: false,
            plan: p,
        }
    }

    #[test]
    fn a_restarted_hub_keeps_its_arguments_and_tcp_address() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = plan("[cluster]\nadapters = \"per-guest\"\n[hub]\ntransport = \"tcp\"");
        p.run_dir = dir.path().to_path_buf();
        let sup = sup_for(p, dir.path());
        let first = sup.hub_argv("127.0.0.1:0");
        let again = sup.hub_argv("127.0.0.1:4711");
        let diff: Vec<_> = first.iter().zip(&again).filter(|(a, b)| a != b).collect();
        assert_eq!(diff, vec![(&"127.0.0.1:0".to_string(), &"127.0.0.1:4711".to_string())]);
        assert!(!first.iter().any(|a| a == "--local"), "{first:?}");
    }

    #[test]
    fn adapters_dial_their_hosts_hub_address() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = plan(
            "[cluster]\nadapters = \"per-guest\"\nplacement = [\"a\", \"b\"]\n[guest]\nlan = \"off\"\n\
             [hub]\ntransport = \"tcp\"\ntcp_listen = \"10.1.0.1:7400\"\n\
             [hosts.a]\nway_in = [\"env\"]\n[hosts.b]\nway_in = [\"env\"]\nhub_address = \"127.0.0.1:7401\"\n",
        );
        p.run_dir = dir.path().to_path_buf();
        std::fs::write(dir.path().join("hub.tcp"), "10.1.0.1:7400\n").unwrap();
        let sup = sup_for(p, dir.path());
        assert_eq!(sup.adapter_hub_args(0).unwrap()[1], "tcp:10.1.0.1:7400");
        assert_eq!(sup.adapter_hub_args(1).unwrap()[1], "tcp:127.0.0.1:7401");
        let e = crate::config::Config::parse("[hosts.b]\nway_in = [\"env\"]\nhub_address = \"nowhere\"").unwrap_err();
        assert!(e.to_string().contains("hosts.b.hub_address must be HOST:PORT"), "{e}");
    }
}
