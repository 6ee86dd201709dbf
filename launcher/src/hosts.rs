//! Hosts: the machines a cluster's processes run on, and how a command gets
//! there.
//!
//! A cluster definition may name other hosts (`[hosts.NAME]`, each with a
//! `way_in`: the command prefix that runs a command there, such as
//! `ssh user@host` or `ip netns exec NS`), place nodes on them
//! (`[cluster] placement`) and put the hub on one (`[hub] host`). The hub
//! then listens on TCP, every node's `mc-adapter` runs beside its QEMU on
//! the node's host and joins over TCP with the cluster's secret, and the
//! supervisor on this machine starts and watches all of them through their
//! way in. A process started through `ip netns exec` or `ssh` is that
//! command's child, so an exit over there is an exit here.
//!
//! Before anything starts, [`check`] asks every host named by the plan,
//! through its way in, whether it answers, whether it sees this machine's
//! run folder (the agent sockets, the logs and the secret live there) and
//! whether it has the binaries, the guest image and the firmware at the
//! plan's paths; every failure is an error naming the host and what is
//! missing.
//!
//! Threads: called from `up` (the check) and the supervisor's one thread.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::config::{Config, LOCAL_HOST};
use crate::supervisor::Plan;

/// How long a host has to answer the check through its way in.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(20);

/// What can be wrong with a host.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The way in could not be started at all.
    #[error("host {host}: cannot run its way in `{way_in}`: {err}")]
    Spawn {
        /// The host.
        host: String,
        /// Its way in, as a command line.
        way_in: String,
        /// Why.
        err: std::io::Error,
    },
    /// The check did not finish in time.
    #[error("host {host} did not answer within {secs} s through its way in `{way_in}`")]
    Timeout {
        /// The host.
        host: String,
        /// Its way in.
        way_in: String,
        /// The time it had.
        secs: u64,
    },
    /// The way in ran and failed.
    #[error("host {host}: its way in `{way_in}` failed ({status}): {stderr}")]
    Failed {
        /// The host.
        host: String,
        /// Its way in.
        way_in: String,
        /// How it ended.
        status: String,
        /// What it printed on stderr.
        stderr: String,
    },
    /// The host does not see the run folder.
    #[error(
        "host {host} does not see this machine's run folder {run_dir}: a cluster across hosts keeps its agent \
         sockets, logs and secret there, so every host needs it at the same path (a network namespace does; \
         over ssh, a shared file system)"
    )]
    NoRunDir {
        /// The host.
        host: String,
        /// The run folder.
        run_dir: PathBuf,
    },
    /// Files the host's processes need are not there.
    #[error("host {host} lacks {}: run scripts/setup.sh there, with the same paths", .missing.join(", "))]
    Missing {
        /// The host.
        host: String,
        /// The paths it lacks.
        missing: Vec<String>,
    },
}

/// `argv` prefixed with the way in of `host` (unchanged for this machine).
pub fn on(cfg: &Config, host: &str, argv: &[String]) -> Vec<String> {
    let mut v = cfg.way_in(host).to_vec();
    v.extend_from_slice(argv);
    v
}

/// The hosts the plan uses other than this machine, each with the files
/// its processes need there.
pub fn needs(plan: &Plan) -> Vec<(String, Vec<PathBuf>)> {
    let c = &plan.config;
    let mut out: Vec<(String, Vec<PathBuf>)> = Vec::new();
    let mut add = |host: &str, files: Vec<PathBuf>| {
        if host == LOCAL_HOST {
            return;
        }
        let i = match out.iter().position(|(h, _)| h == host) {
            Some(i) => i,
            None => {
                out.push((host.to_string(), Vec::new()));
                out.len() - 1
            }
        };
        for f in files {
            if !out[i].1.contains(&f) {
                out[i].1.push(f);
            }
        }
    };
    add(c.hub_host(), vec![plan.hub_bin.clone()]);
    for n in 0..plan.nodes {
        let mut files = vec![plan.adapter_bin.clone(), plan.qemu.clone(), plan.kernel.clone(), plan.initrd.clone()];
        files.extend(c.qemu.firmware_dirs.iter().map(PathBuf::from));
        files.push(plan.share.clone());
        add(c.node_host(n), files);
    }
    out
}

/// The shell script of the check: prints the probe file's contents (or
/// nothing), then `missing PATH` for every path that is not there.
const CHECK_SCRIPT: &str =
    "p=$1; shift; [ -r \"$p\" ] && cat \"$p\"; echo; for f; do [ -e \"$f\" ] || echo \"missing $f\"; done";

/// Checks every other host of `plan` (see the module doc); `run_dir`
/// exists and is the plan's.
pub fn check(plan: &Plan) -> Result<(), HostError> {
    let hosts = needs(plan);
    if hosts.is_empty() {
        return Ok(());
    }
    let probe = plan.run_dir.join(".host-check");
    let token = format!("mc-cluster {} {}", plan.name, std::process::id());
    let _ = std::fs::write(&probe, &token);
    let r = hosts.iter().try_for_each(|(host, files)| check_one(plan, host, files, &probe, &token));
    let _ = std::fs::remove_file(&probe);
    r
}

fn check_one(plan: &Plan, host: &str, files: &[PathBuf], probe: &Path, token: &str) -> Result<(), HostError> {
    let way_in = plan.config.way_in(host).join(" ");
    let mut argv = vec!["sh".to_string(), "-c".into(), CHECK_SCRIPT.into(), "mc-check".into()];
    argv.push(probe.display().to_string());
    argv.extend(files.iter().map(|f| f.display().to_string()));
    let argv = on(&plan.config, host, &argv);
    let (status, out, err) = run_with_timeout(&argv, CHECK_TIMEOUT).map_err(|e| match e {
        None => HostError::Timeout { host: host.into(), way_in: way_in.clone(), secs: CHECK_TIMEOUT.as_secs() },
        Some(err) => HostError::Spawn { host: host.into(), way_in: way_in.clone(), err },
    })?;
    if !status.success() {
        let stderr = err.trim().to_string();
        return Err(HostError::Failed { host: host.into(), way_in, status: status.to_string(), stderr });
    }
    verdict(host, &out, token, &plan.run_dir)
}

/// What the check's output `out` on `host` says: the probe's `token`
/// first, then a line per missing path.
fn verdict(host: &str, out: &str, token: &str, run_dir: &Path) -> Result<(), HostError> {
    let mut lines = out.lines();
    if lines.next().map(str::trim) != Some(token) {
        return Err(HostError::NoRunDir { host: host.into(), run_dir: run_dir.to_path_buf() });
    }
    let missing: Vec<String> = lines.filter_map(|l| l.strip_prefix("missing ")).map(String::from).collect();
    if !missing.is_empty() {
        return Err(HostError::Missing { host: host.into(), missing });
    }
    Ok(())
}

/// Runs `argv` to its end or for `timeout` at most (then kills it);
/// returns its status, stdout and stderr. `Err(None)`: it timed out.
fn run_with_timeout(
    argv: &[String],
    timeout: Duration,
) -> Result<(std::process::ExitStatus, String, String), Option<std::io::Error>> {
    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(Some)?;
    let (mut so, mut se) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let reader = std::thread::spawn(move || {
        let (mut o, mut e) = (String::new(), String::new());
        let _ = so.read_to_string(&mut o);
        let _ = se.read_to_string(&mut e);
        (o, e)
    });
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().map_err(Some)? {
            break st;
        }
        if t0.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            return Err(None);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (o, e) = reader.join().unwrap_or_default();
    Ok((status, o, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::supervisor::fixtures::plan;

    const TWO_HOSTS: &str = "[cluster]\nadapters = \"per-guest\"\nplacement = [\"a\", \"b\"]\n\
        [hub]\ntransport = \"tcp\"\ntcp_listen = \"10.1.0.1:7400\"\nhost = \"a\"\n\
        [guest]\nlan = \"off\"\n\
        [hosts.a]\nway_in = [\"env\", \"MC_HOST=a\"]\n[hosts.b]\nway_in = [\"env\", \"MC_HOST=b\"]\n";

    #[test]
    fn commands_get_their_hosts_way_in() {
        let p = plan(TWO_HOSTS);
        let argv = vec!["mc-adapter".to_string(), "--node".into(), "1".into()];
        assert_eq!(on(&p.config, "b", &argv), ["env", "MC_HOST=b", "mc-adapter", "--node", "1"]);
        assert_eq!(on(&p.config, LOCAL_HOST, &argv), argv);
        let needs = needs(&p);
        assert_eq!(needs.iter().map(|(h, _)| h.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        // The hub's host needs the hub; both need the adapter and QEMU.
        assert!(needs[0].1.contains(&p.hub_bin) && !needs[1].1.contains(&p.hub_bin));
        assert!(needs.iter().all(|(_, f)| f.contains(&p.adapter_bin) && f.contains(&p.qemu)));
    }

    #[test]
    fn the_check_finds_the_run_folder_and_names_what_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = plan(TWO_HOSTS);
        p.run_dir = dir.path().to_path_buf();
        for f in ["mc-hub", "mc-adapter", "qemu", "k", "i"] {
            std::fs::write(dir.path().join(f), b"").unwrap();
        }
        p.hub_bin = dir.path().join("mc-hub");
        p.adapter_bin = dir.path().join("mc-adapter");
        p.qemu = dir.path().join("qemu");
        p.kernel = dir.path().join("k");
        p.initrd = dir.path().join("i");
        p.share = dir.path().to_path_buf();
        p.config.qemu.firmware_dirs = vec![dir.path().display().to_string()];
        check(&p).unwrap();
        // Something missing on one host.
        p.initrd = dir.path().join("gone.cpio");
        let e = check(&p).unwrap_err().to_string();
        assert!(e.starts_with("host a lacks") && e.contains("gone.cpio"), "{e}");
        // A host that does not see the run folder reads no probe.
        let e = verdict("b", "\nmissing /x\n", "tok", dir.path()).unwrap_err().to_string();
        assert!(e.starts_with("host b does not see this machine's run folder"), "{e}");
        verdict("b", "tok\n", "tok", dir.path()).unwrap();
        // A way in that fails, and one that cannot start.
        p.initrd = dir.path().join("i");
        p.config.hosts.get_mut("b").unwrap().way_in = vec!["false".into()];
        let e = check(&p).unwrap_err().to_string();
        assert!(e.starts_with("host b: its way in `false` failed"), "{e}");
        p.config.hosts.get_mut("b").unwrap().way_in = vec!["/no/such/ssh".into()];
        let e = check(&p).unwrap_err().to_string();
        assert!(e.starts_with("host b: cannot run its way in `/no/such/ssh`"), "{e}");
    }

    #[test]
    fn host_settings_are_checked() {
        use crate::config::Config;
        Config::parse(TWO_HOSTS).unwrap();
        let bad = |from: &str, to: &str, want: &str| {
            let text = TWO_HOSTS.replace(from, to);
            let e = Config::parse(&text).unwrap_err().to_string();
            assert!(e.contains(want), "{to}: {e}");
        };
        bad(
            "placement = [\"a\", \"b\"]",
            "placement = [\"a\", \"c\"]",
            "cluster.placement[1] = \"c\": there is no [hosts.c]",
        );
        bad("host = \"a\"", "host = \"z\"", "hub.host = \"z\"");
        bad("adapters = \"per-guest\"", "adapters = \"in-hub\"", "cluster.adapters = \"per-guest\"");
        bad("10.1.0.1:7400", "127.0.0.1:0", "not an address the other hosts can dial");
        bad("10.1.0.1:7400", "0.0.0.0:7400", "not an address the other hosts can dial");
        bad("lan = \"off\"", "lan = \"tap\"", "set guest.lan = \"off\"");
        bad("way_in = [\"env\", \"MC_HOST=a\"]", "way_in = []", "hosts.a.way_in is empty");
        bad("[hosts.b]", "[hosts.local]", "hosts.local is the name of this machine");
        bad("way_in = [\"env\", \"MC_HOST=a\"]", "way_in = [\"env\"]\nport = 22", "port");
        let c = Config::parse(TWO_HOSTS).unwrap();
        let e = c.check_nodes(3).unwrap_err().to_string();
        assert!(e.contains("placement names a host for 2 nodes"), "{e}");
        c.check_nodes(1).unwrap();
        assert_eq!((c.node_host(1), c.hub_host()), ("b", "a"));
        // No placement: one machine, whatever the hosts table says.
        let one = Config::parse("").unwrap();
        assert!(!one.spans_hosts() && one.node_host(5) == LOCAL_HOST);
    }
}
