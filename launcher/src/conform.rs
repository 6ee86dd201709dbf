//! `mc-cluster conform`: the driver conformance suite's runner
//! (`docs/adapter.md`, "The conformance suite"). It owns the scenarios:
//! what the host does in each (device faults and links through the hub,
//! a peer's stores through `mctool`, unplug and plug through QMP), and the
//! checks of what the driver under test printed and of what its adapter's
//! register trace shows. The driver is any command run in the guest as
//! `DRIVER SCENARIO [ARGS]`, which prints one line per event.
//!
//! Threads: the caller's runs the scenarios; each driver run has a thread
//! that reads its output, and each traced scenario one that reads the
//! trace.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use regs::{err, reg, NOTIFY_DEPTH};
use serde::Serialize;

use crate::config::Paths;

/// The scenarios, in the order they run.
pub const SCENARIOS: [&str; 6] = ["reset", "errors", "link", "fifo", "dma", "removal"];
/// The page the `reset` scenario receives on.
pub const RESET_PAGE: u64 = 40;
/// The page the `fifo` scenario receives on.
pub const FIFO_PAGE: u64 = 41;
/// The page the `dma` scenario sends to.
pub const DMA_PAGE: u64 = 42;
/// Descriptors the `dma` scenario sends.
pub const DMA_COUNT: u32 = 64;
/// Separate stores the `fifo` scenario makes (more than the FIFO holds).
pub const FIFO_STORES: u32 = 300;
/// Longest wait for a driver's `ready`.
const READY_WAIT: Duration = Duration::from_secs(30);
/// Longest wait for one event the driver must report.
const EVENT_WAIT: Duration = Duration::from_secs(15);
/// Longest wait for a driver to end once its standard input is closed.
const END_WAIT: Duration = Duration::from_secs(10);

/// What to run.
pub struct Options {
    /// The driver command, run in the guest with the scenario appended.
    pub driver: String,
    /// The node whose adapter the driver drives.
    pub node: usize,
    /// Scenarios to run (all when empty).
    pub only: Vec<String>,
}

/// One scenario's result.
#[derive(Debug, Serialize)]
pub struct Outcome {
    /// Scenario name.
    pub scenario: &'static str,
    /// True when every check held.
    pub passed: bool,
    /// The driver said `unsupported`.
    pub unsupported: bool,
    /// What was checked, or what went wrong.
    pub detail: String,
    /// Seconds the scenario took.
    pub seconds: f64,
    /// Every line the driver printed, and its standard error.
    pub driver_output: Vec<String>,
}

/// A scenario's failure: what was expected and what came instead.
type Check<T> = std::result::Result<T, String>;

/// The cluster, as the scenarios reach it.
struct Cluster<'a> {
    paths: &'a Paths,
    name: &'a str,
    nodes: usize,
    node: usize,
    peer: usize,
    other: usize,
    driver: &'a str,
}

/// Runs the suite; `progress` gets each outcome as it is known.
pub fn run(paths: &Paths, name: &str, o: &Options, mut progress: impl FnMut(&Outcome)) -> Result<Vec<Outcome>> {
    let plan = crate::plan_of(paths, name)?;
    let nodes = plan.nodes;
    if o.node >= nodes {
        bail!("node {} does not exist: the cluster has nodes 0 to {}", o.node, nodes - 1);
    }
    for s in &o.only {
        if !SCENARIOS.contains(&s.as_str()) {
            bail!("no scenario '{s}': the scenarios are {}", SCENARIOS.join(", "));
        }
    }
    let chosen: Vec<&'static str> =
        SCENARIOS.into_iter().filter(|s| o.only.is_empty() || o.only.iter().any(|x| x == s)).collect();
    if nodes < 2 {
        bail!("the conformance suite needs a peer node: start at least 2 nodes (qemu-configs/conformance.toml has 3)");
    }
    if chosen.contains(&"link") && nodes < 3 {
        bail!(
            "scenario 'link' needs 3 nodes (one leaves and joins): the cluster has {nodes} (qemu-configs/conformance.toml), \
             or leave it out with --only"
        );
    }
    if chosen.contains(&"removal") && !plan.config.guest.hotplug {
        bail!(
            "scenario 'removal' needs the adapter on a hot-pluggable slot: start the cluster with [guest] hotplug = true \
             (qemu-configs/conformance.toml), or leave it out with --only"
        );
    }
    let peer = if o.node == 0 { 1 } else { 0 };
    let other = (0..nodes).find(|&n| n != o.node && n != peer).unwrap_or(peer);
    let c = Cluster { paths, name, nodes, node: o.node, peer, other, driver: &o.driver };
    let imcd = c.exec(o.node, "pidof imcd")?;
    if imcd.0 == 0 {
        bail!(
            "imcd owns node {}'s adapter (pid {}): the driver under test needs it, start the cluster with \
             [guest] imcd = false (qemu-configs/conformance.toml)",
            o.node,
            imcd.1.trim()
        );
    }
    let mut out = Vec::new();
    for s in chosen {
        let t0 = Instant::now();
        let mut lines = Vec::new();
        let result = match s {
            "reset" => c.reset(&mut lines),
            "errors" => c.errors(&mut lines),
            "link" => c.link(&mut lines),
            "fifo" => c.fifo(&mut lines),
            "dma" => c.dma(&mut lines),
            _ => c.removal(&mut lines),
        };
        let unsupported = lines.iter().any(|l| l.starts_with("unsupported"));
        let (passed, detail) = match result {
            Ok(d) => (true, d),
            Err(why) if unsupported => (false, format!("the driver does not do it: {why}")),
            Err(why) => (false, why),
        };
        let outcome = Outcome {
            scenario: s,
            passed,
            unsupported,
            detail,
            seconds: t0.elapsed().as_secs_f64(),
            driver_output: lines,
        };
        progress(&outcome);
        out.push(outcome);
    }
    Ok(out)
}

/// The driver under test, running in the guest.
struct Driver {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    stderr: Arc<Mutex<Vec<String>>>,
}

impl Driver {
    /// Waits for a line `pred` accepts; every line read goes to `seen`.
    fn expect(&self, seen: &mut Vec<String>, wait: Duration, what: &str, pred: impl Fn(&str) -> bool) -> Check<String> {
        let deadline = Instant::now() + wait;
        loop {
            match self.lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(l) => {
                    seen.push(l.clone());
                    if l.starts_with("unsupported") {
                        return Err(l);
                    }
                    if pred(&l) {
                        return Ok(l);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    return Err(format!("no `{what}` from the driver within {} s", wait.as_secs()))
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(format!("the driver ended before it printed `{what}`"));
                }
            }
        }
    }

    /// Every line that comes within `d`.
    fn during(&self, seen: &mut Vec<String>, d: Duration) -> Vec<String> {
        let deadline = Instant::now() + d;
        let mut got = Vec::new();
        while let Ok(l) = self.lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            seen.push(l.clone());
            got.push(l);
        }
        got
    }

    /// Writes one line to the driver's standard input.
    fn send(&mut self, line: &str) -> Check<()> {
        let s = self.stdin.as_mut().ok_or("the driver's standard input is closed")?;
        writeln!(s, "{line}").and_then(|()| s.flush()).map_err(|e| format!("writing `{line}` to the driver: {e}"))
    }

    /// Closes its standard input and waits for it to end; its exit code.
    fn finish(mut self, seen: &mut Vec<String>) -> Check<()> {
        drop(self.stdin.take());
        let deadline = Instant::now() + END_WAIT;
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(s)) => break Some(s),
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
                _ => break None,
            }
        };
        while let Ok(l) = self.lines.recv_timeout(Duration::from_millis(200)) {
            seen.push(l);
        }
        seen.extend(self.stderr.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|l| format!("stderr: {l}")));
        match status {
            Some(s) if s.success() => Ok(()),
            Some(s) => Err(format!("the driver ended with exit code {}", s.code().unwrap_or(-1))),
            None => {
                let _ = self.child.kill();
                let _ = self.child.wait();
                Err(format!("the driver did not end within {} s of its standard input closing", END_WAIT.as_secs()))
            }
        }
    }
}

impl Drop for Driver {
    /// A scenario that failed: the driver is told to stop (end of file)
    /// and given the time to, so that the guest's agent is done with it
    /// before the next request; killed only after that.
    fn drop(&mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + END_WAIT;
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The register trace of the driver's adapter, collected while it lives.
struct Trace {
    child: Child,
    events: Arc<Mutex<Vec<serde_json::Value>>>,
}

impl Trace {
    /// The events so far, after a moment for the last ones to arrive.
    fn stop(mut self) -> Vec<serde_json::Value> {
        std::thread::sleep(Duration::from_millis(300));
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::mem::take(&mut *self.events.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Cluster<'_> {
    fn mc_cluster(&self) -> Command {
        let mut c = Command::new(self.paths.bin_dir.join("mc-cluster"));
        c.args(["--name", self.name]);
        c
    }

    /// Runs a shell command in a guest; its exit code and standard output.
    fn exec(&self, node: usize, cmd: &str) -> Result<(i32, String)> {
        crate::guest_sh(self.paths, self.name, node, cmd)
    }

    /// A peer's command that must succeed.
    fn peer(&self, cmd: &str) -> Check<String> {
        match self.exec(self.peer, cmd) {
            Ok((0, out)) => Ok(out),
            Ok((code, out)) => Err(format!("node {}: `{cmd}` failed (exit {code}): {out}", self.peer)),
            Err(e) => Err(format!("node {}: `{cmd}`: {e:#}", self.peer)),
        }
    }

    /// A request to the hub that must succeed.
    fn hub(&self, args: &[&str]) -> Check<String> {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        crate::hub_ctl(self.paths, self.name, &args).map_err(|e| format!("hub {}: {e:#}", args.join(" ")))
    }

    /// The hub's per-node counters of the driver's node.
    fn node_stats(&self) -> Check<serde_json::Value> {
        let s = self.hub(&["stats"])?;
        let v: serde_json::Value = serde_json::from_str(&s).map_err(|e| format!("hub stats: {e}"))?;
        v["nodes"]
            .as_array()
            .and_then(|a| a.iter().find(|n| n["node"] == self.node))
            .cloned()
            .ok_or_else(|| format!("hub stats have no node {}", self.node))
    }

    /// Starts `DRIVER SCENARIO ARGS` on the node and waits for `ready`.
    fn start(&self, seen: &mut Vec<String>, args: &str) -> Check<Driver> {
        let mut child = self
            .mc_cluster()
            .args(["exec", "--timeout", "600", &self.node.to_string(), "--", "sh", "-c"])
            .arg(format!("exec {} {args}", self.driver))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("running mc-cluster exec: {e}"))?;
        let (tx, lines) = mpsc::channel();
        let out = child.stdout.take().ok_or("no driver stdout")?;
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let (err, keep) = (child.stderr.take().ok_or("no driver stderr")?, stderr.clone());
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                keep.lock().unwrap_or_else(|e| e.into_inner()).push(l);
            }
        });
        let stdin = child.stdin.take();
        let d = Driver { child, stdin, lines, stderr };
        if let Err(e) = d.expect(seen, READY_WAIT, "ready", |l| l == "ready") {
            // Its end and its standard error, for the report.
            let _ = d.finish(seen);
            return Err(e);
        }
        Ok(d)
    }

    /// Follows the node's register trace (JSON events of `kinds`).
    fn trace(&self, kinds: &str) -> Check<Trace> {
        let sock: PathBuf =
            crate::supervisor::node_dir(&self.paths.run_dir(self.name), self.node).join("adapter.sock.trace");
        let mut child = Command::new(self.paths.bin_dir.join("mc-hub"))
            .args(["trace", "--json", "--kind", kinds, "--socket"])
            .arg(&sock)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("running mc-hub trace: {e}"))?;
        let events = Arc::new(Mutex::new(Vec::new()));
        let (out, keep) = (child.stdout.take().ok_or("no trace output")?, events.clone());
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&l) {
                    keep.lock().unwrap_or_else(|e| e.into_inner()).push(v);
                }
            }
        });
        // The follower is attached once the adapter took its filter.
        std::thread::sleep(Duration::from_millis(500));
        Ok(Trace { child, events })
    }

    /// The members bitmap with every node up.
    fn all(&self) -> u64 {
        (1u64 << self.nodes) - 1
    }

    /// `reset`: an adapter holding errors, causes and link events from
    /// before the open, which the kernel did not reset.
    fn reset(&self, seen: &mut Vec<String>) -> Check<String> {
        let (_, dir) = self.exec(self.node, crate::FIND_ADAPTER).map_err(|e| format!("{e:#}"))?;
        let dir = dir.trim().to_string();
        if dir.is_empty() {
            return Err(format!("node {}: no adapter in sysfs (is it plugged in?)", self.node));
        }
        // A device without a reset method the kernel can use (an adapter
        // on the root bus here, like the original's) has no such file:
        // nothing resets it between opens anyway.
        let file = format!("{dir}/reset_method");
        let (_, before) = self.exec(self.node, &format!("cat {file} 2>/dev/null")).map_err(|e| format!("{e:#}"))?;
        let before = before.trim().to_string();
        let result = (|| {
            if !before.is_empty() {
                let (code, out) = self.exec(self.node, &format!("echo '' > {file}")).map_err(|e| format!("{e:#}"))?;
                if code != 0 {
                    return Err(format!("node {}: turning the kernel's reset of the adapter off: {out}", self.node));
                }
            }
            self.hub(&["fault", &self.node.to_string(), "error", "--bits", "crc,seq-gap"])?;
            self.hub(&["link-down", &self.other.to_string()])?;
            std::thread::sleep(Duration::from_millis(500));
            self.hub(&["link-up", &self.other.to_string()])?;
            std::thread::sleep(Duration::from_millis(500));
            let trace = self.trace("reg,pct")?;
            let d = self.start(seen, &format!("reset {RESET_PAGE}"))?;
            let stale = d.during(seen, Duration::from_secs(1));
            if !stale.is_empty() {
                return Err(format!(
                    "the driver reported state from before its open: {} (reset the adapter at bring-up: docs/adapter.md, \"Reset\")",
                    stale.join("; ")
                ));
            }
            self.peer(&format!("mctool poke --page {RESET_PAGE} --offset 0 --value 1"))?;
            let got = d.expect(seen, EVENT_WAIT, &format!("notify {RESET_PAGE}"), |l| l.starts_with("notify "))?;
            if got != format!("notify {RESET_PAGE}") {
                return Err(format!("expected `notify {RESET_PAGE}` first, the driver printed `{got}`"));
            }
            // The errors raised before the open are gone: a new one reads alone.
            let (bit, name) = (err::TX_READ, "tx-read");
            self.hub(&["fault", &self.node.to_string(), "error", "--bits", name])?;
            let got = d.expect(seen, EVENT_WAIT, &format!("error {bit:#x}"), |l| l.starts_with("error "))?;
            match hex(got.trim_start_matches("error ")) {
                Some(v) if v == bit as u64 => {}
                Some(v) => {
                    return Err(format!(
                        "raising {name} ({bit:#x}) the driver read ERR_STATUS {v:#x}: bits from before its open were \
                         still set (reset the adapter at bring-up: docs/adapter.md, \"Reset\")"
                    ))
                }
                None => return Err(format!("`{got}`: not `error 0xBITS`")),
            }
            d.finish(seen)?;
            let events = trace.stop();
            let reset = events.iter().position(|e| {
                e["kind"] == "reg"
                    && e["write"] == true
                    && e["off"] == reg::CTRL
                    && e["value"].as_u64().unwrap_or(0) & 1 == 1
            });
            let pct = events.iter().position(|e| e["kind"] == "pct" && e["write"] == true);
            match (reset, pct) {
                (Some(r), Some(p)) if r < p => Ok(format!(
                    "CTRL.RESET before the first PCT write; nothing from before the open reported; `notify {RESET_PAGE}` \
                     after node {}'s store; a new error bit read alone",
                    self.peer
                )),
                (_, None) => Err("the trace shows no PCT write: did the driver enable receive on the page?".into()),
                _ => Err("the trace shows no `W CTRL = 0x1 [RESET]` before the driver's first PCT write: state from \
                          before its open may survive (docs/adapter.md, \"Reset\")"
                    .into()),
            }
        })();
        if !before.is_empty() {
            let _ = self.exec(self.node, &format!("echo {before} > {file}"));
        }
        result
    }

    /// `errors`: each ERR_STATUS bit alone, each with its interrupt.
    fn errors(&self, seen: &mut Vec<String>) -> Check<String> {
        let faults = |s: &serde_json::Value| s["faults"]["error"].as_u64().unwrap_or(0);
        let before = faults(&self.node_stats()?);
        let d = self.start(seen, "errors")?;
        for (bit, name) in err::NAMES {
            self.hub(&["fault", &self.node.to_string(), "error", "--bits", name])?;
            let got = d.expect(seen, EVENT_WAIT, &format!("error {bit:#x}"), |l| l.starts_with("error "))?;
            let value = hex(got.trim_start_matches("error ")).ok_or_else(|| format!("`{got}`: not `error 0xBITS`"))?;
            if value != bit as u64 {
                return Err(format!(
                    "after raising {name} ({bit:#x}) alone the driver read {value:#x}: each bit must be cleared (write 1 to \
                     clear) before the next is raised"
                ));
            }
        }
        d.finish(seen)?;
        let raised = faults(&self.node_stats()?) - before;
        if raised != err::NAMES.len() as u64 {
            return Err(format!("the hub counted {raised} error faults, not {}", err::NAMES.len()));
        }
        Ok(format!("all {} error bits reported alone, each on its interrupt", err::NAMES.len()))
    }

    /// `link`: another node leaves and joins, then the driver's own link.
    fn link(&self, seen: &mut Vec<String>) -> Check<String> {
        let d = self.start(seen, "link")?;
        let (all, without) = (self.all(), self.all() & !(1 << self.other));
        let (n, o) = (self.node.to_string(), self.other.to_string());
        let steps: [(&str, &str, bool, Option<u64>); 4] = [
            ("link-down", &o, true, Some(without)),
            ("link-up", &o, true, Some(all)),
            ("link-down", &n, false, None),
            ("link-up", &n, true, Some(all)),
        ];
        for (req, node, up, members) in steps {
            self.hub(&[req, node])?;
            let want = match members {
                Some(m) => format!("link {} {m:#x}", up as u8),
                None => format!("link {} …", up as u8),
            };
            d.expect(seen, EVENT_WAIT, &want, |l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() == 3
                    && f[0] == "link"
                    && f[1] == (up as u8).to_string()
                    && members.is_none_or(|m| hex(f[2]) == Some(m))
            })
            .map_err(|e| format!("after `{req} {node}`: {e}"))?;
        }
        d.finish(seen)?;
        Ok(format!("node {} left and joined, then the driver's own link went down and up: each reported", self.other))
    }

    /// `fifo`: more notifications than the FIFO holds while the driver
    /// does not take them.
    fn fifo(&self, seen: &mut Vec<String>) -> Check<String> {
        let mut d = self.start(seen, &format!("fifo {FIFO_PAGE}"))?;
        let frames = |s: &serde_json::Value| (s["frames_out"].as_u64().unwrap_or(0), s["queued"].as_u64().unwrap_or(0));
        let (before, _) = frames(&self.node_stats()?);
        self.peer(&format!("mctool bench-tx --page {FIFO_PAGE} --stores {FIFO_STORES} --stride 16"))?;
        let deadline = Instant::now() + EVENT_WAIT;
        loop {
            let (now, queued) = frames(&self.node_stats()?);
            if now >= before + FIFO_STORES as u64 && queued == 0 {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!("the hub handed node {} {} of {FIFO_STORES} stores", self.node, now - before));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        std::thread::sleep(Duration::from_millis(300));
        d.send("drain")?;
        let got = d.expect(seen, EVENT_WAIT, "fifo COUNT LOST", |l| l.starts_with("fifo "))?;
        let lost = FIFO_STORES as usize - NOTIFY_DEPTH;
        if got != format!("fifo {NOTIFY_DEPTH} {lost}") {
            return Err(format!("expected `fifo {NOTIFY_DEPTH} {lost}` (the FIFO holds {NOTIFY_DEPTH}), got `{got}`"));
        }
        self.peer(&format!("mctool poke --page {FIFO_PAGE} --offset 0 --value 1"))?;
        let got = d.expect(seen, EVENT_WAIT, &format!("notify {FIFO_PAGE}"), |l| l.starts_with("notify "))?;
        if got != format!("notify {FIFO_PAGE}") {
            return Err(format!("after the drain expected `notify {FIFO_PAGE}`, got `{got}`"));
        }
        d.finish(seen)?;
        Ok(format!("{NOTIFY_DEPTH} held, {lost} counted lost, notifications again after the drain"))
    }

    /// `dma`: more descriptors than the ring holds, the first failing.
    fn dma(&self, seen: &mut Vec<String>) -> Check<String> {
        self.hub(&["fault", &self.node.to_string(), "dma-desc", "--count", "1", "--status", "src-unmapped"])?;
        let trace = self.trace("reg,dma_done")?;
        let result = (|| {
            let d = self.start(seen, &format!("dma {DMA_PAGE} {DMA_COUNT}"))?;
            let done = d.expect(seen, Duration::from_secs(120), "dma done", |l| l.starts_with("dma done "))?;
            let want = format!("dma done {DMA_COUNT} ok {} failed 1", DMA_COUNT - 1);
            if done != want {
                return Err(format!("expected `{want}`, got `{done}`"));
            }
            let failed: Vec<&String> = seen.iter().filter(|l| l.starts_with("dma failed ")).collect();
            if failed.len() != 1 || !failed[0].ends_with(" src-unmapped") {
                return Err(format!("expected one `dma failed I src-unmapped`, got {failed:?}"));
            }
            d.finish(seen)
        })();
        let events = trace.stop();
        let _ = self.hub(&["fault", &self.node.to_string(), "clear"]);
        if let Err(e) = result {
            return Err(match ring_walk(&events) {
                Ok(w) if w.most > w.size => format!(
                    "{e}; a doorbell posted {} descriptors beyond DMA_HEAD with a ring of {} (the engine ignores it: \
                     OVERFLOW)",
                    w.most, w.size
                ),
                _ => e,
            });
        }
        ring_checks(&events)
    }

    /// `removal`: unplug under the running driver, plug, and open again.
    fn removal(&self, seen: &mut Vec<String>) -> Check<String> {
        let d = self.start(seen, "removal")?;
        let unplugged = crate::unplug(self.paths, self.name, self.node).map_err(|e| format!("{e:#}"));
        let released = d.expect(seen, Duration::from_secs(5), "released", |l| l == "released");
        let ended = d.finish(seen);
        // Back in whatever happened, for the next scenario or run.
        let plugged = crate::plug(self.paths, self.name, self.node).map_err(|e| format!("{e:#}"));
        let how = unplugged?;
        released?;
        ended?;
        plugged?;
        seen.push("-- the adapter plugged in again --".into());
        let d = self.start(seen, "removal")?;
        d.finish(seen)?;
        Ok(format!("{how}; `released`, then `ready` on the new adapter"))
    }
}

/// What the trace of the `dma` scenario shows of the ring.
struct RingWalk {
    /// The ring size the driver set.
    size: u64,
    /// Descriptors retired, and how many of them failed.
    retired: u64,
    failed: u64,
    /// Most descriptors in flight at a doorbell.
    most: u64,
    /// The last doorbell.
    tail: u64,
}

fn ring_walk(events: &[serde_json::Value]) -> Check<RingWalk> {
    let w = |e: &serde_json::Value, off: u64| e["kind"] == "reg" && e["write"] == true && e["off"] == off;
    // The ring the driver set up (a driver may write 0 at the end to turn it off).
    let size = events
        .iter()
        .filter(|e| w(e, reg::DMA_RING_SIZE))
        .filter_map(|e| e["value"].as_u64())
        .find(|&v| v != 0)
        .ok_or("the trace shows no DMA_RING_SIZE write")?;
    let (mut retired, mut most, mut tail, mut failed) = (0u64, 0u64, 0u64, 0u64);
    for e in events {
        if e["kind"] == "dma_done" {
            retired += 1;
            failed += (e["status"] != 0) as u64;
        } else if w(e, reg::DMA_TAIL) {
            tail = e["value"].as_u64().unwrap_or(0);
            most = most.max(tail.saturating_sub(retired));
        }
    }
    Ok(RingWalk { size, retired, failed, most, tail })
}

/// The trace checks of the `dma` scenario: the ring size the driver set,
/// the ring full at some doorbell, never more, and at least two laps.
fn ring_checks(events: &[serde_json::Value]) -> Check<String> {
    let RingWalk { size, retired, failed, most, tail } = ring_walk(events)?;
    if size == 0 || size > DMA_COUNT as u64 / 2 {
        return Err(format!("a ring of {size} descriptors: at most {} (COUNT/2) for it to wrap", DMA_COUNT / 2));
    }
    if retired != DMA_COUNT as u64 || failed != 1 {
        return Err(format!(
            "the trace shows {retired} descriptors retired ({failed} failed), not {DMA_COUNT} (1 failed)"
        ));
    }
    if most < size {
        return Err(format!("the ring never filled: at most {most} of {size} descriptors in flight at a doorbell"));
    }
    if most > size {
        return Err(format!(
            "a doorbell posted {most} descriptors beyond DMA_HEAD with a ring of {size} (the engine ignores it: OVERFLOW)"
        ));
    }
    if tail < 2 * size {
        return Err(format!("the ring did not wrap twice: the last doorbell was {tail} for a ring of {size}"));
    }
    Ok(format!(
        "ring of {size}: full at a doorbell, {} laps, {DMA_COUNT} retired, the injected failure reported",
        tail / size
    ))
}

/// A hexadecimal number with or without `0x`.
fn hex(s: &str) -> Option<u64> {
    u64::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tail(t: u64) -> serde_json::Value {
        json!({"kind": "reg", "write": true, "off": reg::DMA_TAIL, "value": t})
    }
    fn done(status: u32) -> serde_json::Value {
        json!({"kind": "dma_done", "status": status})
    }
    fn ring(size: u64) -> serde_json::Value {
        json!({"kind": "reg", "write": true, "off": reg::DMA_RING_SIZE, "value": size})
    }

    /// A driver that keeps a ring of 8 full passes; one that posts one
    /// descriptor at a time, one whose ring is too big to wrap and one
    /// that lost a completion fail, each saying why.
    #[test]
    fn the_ring_checks_tell_a_full_ring_from_one_at_a_time() {
        let full: Vec<_> = std::iter::once(ring(8))
            .chain((0..8).flat_map(|lap| {
                std::iter::once(tail(8 * (lap + 1))).chain((0..8).map(move |i| done((lap == 0 && i == 0) as u32)))
            }))
            .collect();
        assert!(ring_checks(&full).unwrap().contains("ring of 8"), "{:?}", ring_checks(&full));
        let single: Vec<_> =
            std::iter::once(ring(8)).chain((0..64).flat_map(|i| [tail(i + 1), done((i == 0) as u32)])).collect();
        assert!(ring_checks(&single).unwrap_err().contains("never filled"), "{:?}", ring_checks(&single));
        let big: Vec<_> = std::iter::once(ring(64))
            .chain(std::iter::once(tail(64)))
            .chain((0..64).map(|i| done((i == 0) as u32)))
            .collect();
        assert!(ring_checks(&big).unwrap_err().contains("at most 32"));
        let lost: Vec<_> = full[..full.len() - 1].to_vec();
        assert!(ring_checks(&lost).unwrap_err().contains("63 descriptors retired"));
        // Nine posted on a ring of eight, even if everything then retired.
        let mut over = full.clone();
        over[1] = tail(9);
        assert!(ring_checks(&over).unwrap_err().contains("OVERFLOW"), "{:?}", ring_checks(&over));
    }

    #[test]
    fn hex_takes_both_forms() {
        assert_eq!(hex("0x1f"), Some(31));
        assert_eq!(hex("1f"), Some(31));
        assert_eq!(hex("zz"), None);
    }
}
