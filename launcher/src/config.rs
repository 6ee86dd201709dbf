//! Cluster definitions (`qemu-configs/*.toml`) and where things live on disk.
//!
//! A config file names the cluster's shape and the QEMU arguments; unknown
//! keys are errors, so a typo never silently falls back to a default.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

/// A cluster definition.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Shape of the cluster.
    pub cluster: ClusterSection,
    /// The hub.
    pub hub: HubSection,
    /// The guests.
    pub guest: GuestSection,
    /// QEMU binary and extra arguments.
    pub qemu: QemuSection,
    /// Other machines the hub or nodes run on, by name (`[hosts.NAME]`);
    /// [`LOCAL_HOST`] is this one. `launcher/src/hosts.rs`.
    pub hosts: BTreeMap<String, HostSection>,
}

/// The host name that means the machine `mc-cluster` runs on.
pub const LOCAL_HOST: &str = "local";

/// `[hosts.NAME]`: a machine the cluster's processes can run on.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HostSection {
    /// The command prefix that runs a command there, as separate words:
    /// `["ssh", "user@host"]`, or `["ip", "netns", "exec", "NS"]` for a
    /// network namespace standing in for a host.
    pub way_in: Vec<String>,
    /// The address (`IP:PORT`) the adapters on this host dial for the hub,
    /// when it is not the hub's own (a relay such as `mc-netem`, NAT);
    /// empty: the address the hub bound.
    #[serde(default)]
    pub hub_address: String,
}

/// `[cluster]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterSection {
    /// Nodes started by `up` when `--nodes` is not given.
    pub nodes: usize,
    /// Ports on the hub: the most nodes this cluster can have.
    pub hub_ports: usize,
    /// MEMORY CHANNEL address space in MiB (power of two).
    pub aspace_mib: u64,
    /// Where the guests' adapters run: `in-hub` (local ports of the hub: a
    /// store reaches the other guests in one hop) or `per-guest` (one
    /// `mc-adapter` process per guest on a link port: fault isolation, and
    /// the TCP transport).
    pub adapters: String,
    /// The host of each node, by name (`[hosts.NAME]` or [`LOCAL_HOST`]);
    /// empty: every node on this machine. Node N runs where entry N says.
    pub placement: Vec<String>,
}

impl Default for ClusterSection {
    fn default() -> Self {
        ClusterSection { nodes: 2, hub_ports: 8, aspace_mib: 512, adapters: "in-hub".into(), placement: Vec::new() }
    }
}

impl ClusterSection {
    /// True when the hub serves the guests' adapters itself.
    pub fn in_hub(&self) -> bool {
        self.adapters == "in-hub"
    }
}

/// `[hub]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HubSection {
    /// Frames queued per node before senders are held back.
    pub queue_depth: usize,
    /// Seconds a receiver may keep its queue full before it is cut off.
    pub stall_timeout_s: f64,
    /// Write every ordered frame to `<run>/hub.pcap`.
    pub pcap: bool,
    /// How adapters reach the hub: `unix` (a socket in the run folder) or
    /// `tcp` (with a secret generated for the cluster).
    pub transport: String,
    /// Address the hub binds with `transport = "tcp"` (port 0: any free port).
    pub tcp_listen: String,
    /// The hub's host (`[hosts.NAME]`); empty or [`LOCAL_HOST`]: this machine.
    pub host: String,
}

impl Default for HubSection {
    fn default() -> Self {
        HubSection {
            queue_depth: 4096,
            stall_timeout_s: 10.0,
            pcap: false,
            transport: "unix".into(),
            tcp_listen: "127.0.0.1:0".into(),
            host: String::new(),
        }
    }
}

/// Where the shared host folder (`[guest] share`, `mc-cluster up --share`)
/// is mounted in every guest (virtio-9p, tag [`SHARE_TAG`]).
pub const GUEST_SHARE: &str = "/share";
/// The virtio-9p mount tag of the shared folder (the guest's init mounts it).
pub const SHARE_TAG: &str = "mcshare";

/// Size of the shared memory behind `[guest] ivshmem` (a power of two, as
/// `ivshmem-plain` requires for its BAR).
pub const IVSHMEM_MIB: u64 = 1;

/// `[guest]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GuestSection {
    /// RAM per guest in MiB.
    pub memory_mib: u64,
    /// vCPUs per guest.
    pub cpus: u32,
    /// Kernel command line (the launcher appends `mc.node=N mc.imcd=0|1`).
    pub cmdline: String,
    /// Start imcd at boot (it then owns the adapter; the device-level
    /// `mctool` commands need `false`).
    pub imcd: bool,
    /// A virtio-net LAN between the guests (10.0.x.y/16, node N at
    /// 10.0.0.N+1, named nodeN), for comparing MEMORY CHANNEL with TCP in
    /// the same run: `auto` (tap where the host allows it, else mcast),
    /// `tap`, `mcast` or `off` (`true` is `auto`, `false` is `off`). The
    /// backends are in `launcher/src/lan.rs`.
    #[serde(deserialize_with = "lan_setting")]
    pub lan: String,
    /// QEMU's `ivshmem-plain` device in every guest, all backed by one
    /// shared file (`<run>/ivshmem`, [`IVSHMEM_MIB`] MiB): plain shared
    /// memory between the guests, the floor MEMORY CHANNEL is compared with.
    pub ivshmem: bool,
    /// Host folder shared read-write into every guest at [`GUEST_SHARE`]
    /// (virtio-9p); empty: `<run>/share`. A relative path is relative to
    /// the config file's folder. `mc-cluster up --share` overrides it.
    pub share: String,
    /// Kernel image; empty: the one `scripts/setup.sh` fetched.
    pub kernel: String,
    /// Initramfs; empty: the one `scripts/setup.sh` built.
    pub initrd: String,
    /// The adapter on a hot-pluggable PCIe slot, offering MSI instead of
    /// MSI-X (QEMU 10.2 aborts unplugging a vfio-user device with MSI-X),
    /// so `mc-cluster unplug` and `plug` can take it out of a running
    /// guest and put it back (docs/adapter.md, "Surprise removal").
    /// In-hub adapters only.
    pub hotplug: bool,
}

/// `[guest] lan` as a setting name, or as the boolean it was before there
/// were several backends.
fn lan_setting<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Lan {
        On(bool),
        Name(String),
    }
    Ok(match Lan::deserialize(d)? {
        Lan::On(true) => "auto".into(),
        Lan::On(false) => "off".into(),
        Lan::Name(s) => s,
    })
}

impl Default for GuestSection {
    fn default() -> Self {
        GuestSection {
            memory_mib: 256,
            cpus: 1,
            cmdline: "console=ttyS0 intel_iommu=on panic=-1 no_timer_check tsc=reliable quiet cryptomgr.notests=1 initcall_blacklist=crypto_kdf108_init".into(),
            imcd: true,
            lan: "auto".into(),
            ivshmem: false,
            share: String::new(),
            kernel: String::new(),
            initrd: String::new(),
            hotplug: false,
        }
    }
}

/// `[qemu]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QemuSection {
    /// QEMU binary; empty: the cached build, then `qemu-system-x86_64` on PATH.
    pub binary: String,
    /// `auto` (KVM when it works, else TCG), `kvm` or `tcg`.
    pub accel: String,
    /// Firmware search directories (`-L`).
    pub firmware_dirs: Vec<String>,
    /// Appended to every guest's command line.
    pub extra_args: Vec<String>,
    /// Seconds to wait for every guest agent to answer.
    pub boot_timeout_s: u64,
    /// Offer vfio-user `write_multiple` to QEMU: `auto` (the default), `on`
    /// or `off`. Off takes QEMU 10.x's vfio-user thread out of every store's
    /// path (the direct path: a sixth of the latency), which is safe against
    /// floods only once the adapter has enlarged QEMU's socket send buffer
    /// (device/src/client_socket.rs; needs root). `auto` is off when that
    /// worked and on otherwise. docs/adapter.md, "The store path", has the
    /// measurements.
    pub write_multiple: String,
    /// The guests' CPU model (`-cpu`); empty: [`TCG_CPU`] under TCG,
    /// `host` under KVM.
    pub cpu: String,
    /// Run the hub's and the adapters' threads at SCHED_FIFO priority 1, so
    /// a spinning vCPU never delays a message in them by a scheduler slice
    /// (`launcher/src/priority.rs`). Needs root or CAP_SYS_NICE; without,
    /// they run at normal priority.
    pub io_realtime: bool,
    /// QEMU's threads other than its vCPUs real-time too: small messages
    /// take half the time again, but QEMU's vfio-user thread then sends each
    /// store as soon as it is made instead of packing the ones queued
    /// meanwhile, and a flood of stores runs many times slower
    /// (docs/adapter.md, "Host thread priority"). For latency-bound work.
    pub qemu_realtime: bool,
}

/// The guests' CPU model under TCG: QEMU's `max` without the fast string
/// copy features. With ERMS or FSRM, glibc's `memcpy` (and the guest
/// kernel's copies) use `rep movsb` for mid-sized copies, and TCG runs
/// that one byte per iteration: 4 KiB to 64 KiB copies in a guest ran at
/// about 260 MB/s with them and several times faster without them
/// (docs/adapter.md, "Guest CPU model").
pub const TCG_CPU: &str = "max,-erms,-fsrm";

impl Default for QemuSection {
    fn default() -> Self {
        QemuSection {
            binary: String::new(),
            accel: "auto".into(),
            firmware_dirs: vec!["/usr/share/qemu".into(), "/usr/share/seabios".into()],
            extra_args: Vec::new(),
            boot_timeout_s: 180,
            write_multiple: "auto".into(),
            cpu: String::new(),
            io_realtime: true,
            qemu_realtime: false,
        }
    }
}

impl Config {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read config {}", path.display()))?;
        Self::parse(&text).map_err(|e| anyhow::anyhow!("config {}: {e}", path.display()))
    }

    /// Parses and validates config text. Errors are one line.
    pub fn parse(text: &str) -> Result<Config> {
        let cfg: Config = toml::from_str(text).map_err(|e| {
            let msg = e.message().replace('\n', " ");
            match e.span() {
                Some(span) => {
                    let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
                    anyhow::anyhow!("line {line}: {msg}")
                }
                None => anyhow::anyhow!("{msg}"),
            }
        })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks every value (after parsing, and after command-line overrides).
    pub fn validate(&self) -> Result<()> {
        let c = &self.cluster;
        if c.hub_ports == 0 || c.hub_ports > link::MAX_NODES {
            bail!("cluster.hub_ports must be between 1 and {}, not {}", link::MAX_NODES, c.hub_ports);
        }
        if !c.aspace_mib.is_power_of_two() || !(1..=4096).contains(&c.aspace_mib) {
            bail!("cluster.aspace_mib must be a power of two from 1 to 4096, not {}", c.aspace_mib);
        }
        if !["in-hub", "per-guest"].contains(&c.adapters.as_str()) {
            bail!("cluster.adapters must be in-hub or per-guest, not '{}'", c.adapters);
        }
        if self.guest.hotplug && !c.in_hub() {
            bail!(
                "guest.hotplug needs cluster.adapters = \"in-hub\": a per-guest mc-adapter serves one QEMU connection"
            );
        }
        if c.in_hub() && self.hub.transport == "tcp" {
            bail!("hub.transport = \"tcp\" is for per-guest adapters: set cluster.adapters = \"per-guest\"");
        }
        if !["on", "off", "auto"].contains(&self.qemu.write_multiple.as_str()) {
            bail!("qemu.write_multiple must be on, off or auto, not '{}'", self.qemu.write_multiple);
        }
        if self.hub.queue_depth < 2 {
            bail!("hub.queue_depth must be at least 2, not {}", self.hub.queue_depth);
        }
        if !(self.hub.stall_timeout_s > 0.0 && self.hub.stall_timeout_s.is_finite()) {
            bail!("hub.stall_timeout_s must be a positive number of seconds");
        }
        if !["unix", "tcp"].contains(&self.hub.transport.as_str()) {
            bail!("hub.transport must be unix or tcp, not '{}'", self.hub.transport);
        }
        if self.hub.tcp_listen.parse::<std::net::SocketAddr>().is_err() {
            bail!("hub.tcp_listen must be IP:PORT, not '{}'", self.hub.tcp_listen);
        }
        if self.guest.memory_mib < 64 {
            bail!("guest.memory_mib must be at least 64, not {}", self.guest.memory_mib);
        }
        if self.guest.cpus == 0 {
            bail!("guest.cpus must be at least 1");
        }
        crate::lan::check_setting(&self.guest.lan)?;
        if !["auto", "kvm", "tcg"].contains(&self.qemu.accel.as_str()) {
            bail!("qemu.accel must be auto, kvm or tcg, not '{}'", self.qemu.accel);
        }
        self.validate_hosts()
    }

    /// The host of node `n` ([`LOCAL_HOST`] when the placement says nothing).
    pub fn node_host(&self, n: usize) -> &str {
        match self.cluster.placement.get(n).map(String::as_str) {
            None | Some("") => LOCAL_HOST,
            Some(h) => h,
        }
    }

    /// The hub's host.
    pub fn hub_host(&self) -> &str {
        if self.hub.host.is_empty() {
            LOCAL_HOST
        } else {
            &self.hub.host
        }
    }

    /// The command prefix that runs a command on `host` (empty: here).
    pub fn way_in(&self, host: &str) -> &[String] {
        self.hosts.get(host).map(|h| h.way_in.as_slice()).unwrap_or(&[])
    }

    /// True when the hub or any node runs on another host.
    pub fn spans_hosts(&self) -> bool {
        self.hub_host() != LOCAL_HOST || self.cluster.placement.iter().any(|h| !h.is_empty() && h != LOCAL_HOST)
    }

    /// `[hosts]`, `cluster.placement` and `hub.host`, and what a cluster
    /// across hosts needs of the other settings.
    fn validate_hosts(&self) -> Result<()> {
        for (name, h) in &self.hosts {
            if name == LOCAL_HOST {
                bail!("hosts.{LOCAL_HOST} is the name of this machine: give the host another name");
            }
            if !h.hub_address.is_empty()
                && h.hub_address.rsplit_once(':').and_then(|(_, p)| p.parse::<u16>().ok()).is_none()
            {
                bail!("hosts.{name}.hub_address must be HOST:PORT, not '{}'", h.hub_address);
            }
            if h.way_in.is_empty() || h.way_in[0].is_empty() {
                bail!("hosts.{name}.way_in is empty: give the command prefix that runs a command there (e.g. [\"ssh\", \"user@{name}\"])");
            }
        }
        let known = |h: &str| h.is_empty() || h == LOCAL_HOST || self.hosts.contains_key(h);
        for (i, h) in self.cluster.placement.iter().enumerate() {
            if !known(h) {
                bail!("cluster.placement[{i}] = \"{h}\": there is no [hosts.{h}]");
            }
        }
        if !known(&self.hub.host) {
            bail!("hub.host = \"{}\": there is no [hosts.{}]", self.hub.host, self.hub.host);
        }
        if !self.spans_hosts() {
            return Ok(());
        }
        if self.cluster.in_hub() || self.hub.transport != "tcp" {
            bail!(
                "a cluster across hosts needs cluster.adapters = \"per-guest\" (each guest's adapter runs beside it) and hub.transport = \"tcp\""
            );
        }
        let ip = self.hub.tcp_listen.parse::<std::net::SocketAddr>().map(|a| a.ip());
        if ip.is_ok_and(|ip| ip.is_loopback() || ip.is_unspecified()) {
            bail!(
                "hub.tcp_listen = \"{}\" is not an address the other hosts can dial: give an address of the hub's host",
                self.hub.tcp_listen
            );
        }
        if ["tap", "mcast"].contains(&self.guest.lan.as_str()) {
            bail!(
                "guest.lan = \"{}\" joins the guests of one host only: set guest.lan = \"off\" for a cluster across hosts",
                self.guest.lan
            );
        }
        Ok(())
    }

    /// Checks a node count against this cluster's hub.
    pub fn check_nodes(&self, nodes: usize) -> Result<()> {
        if nodes == 0 {
            bail!("--nodes must be at least 1");
        }
        if nodes > self.cluster.hub_ports {
            bail!(
                "--nodes {nodes} is more than the hub's {} ports: raise cluster.hub_ports in the config (up to {})",
                self.cluster.hub_ports,
                link::MAX_NODES
            );
        }
        let placed = self.cluster.placement.len();
        if placed > 0 && nodes > placed {
            bail!("cluster.placement names a host for {placed} nodes: --nodes {nodes} needs one for every node");
        }
        Ok(())
    }
}

/// Where the project's files are.
#[derive(Debug, Clone)]
pub struct Paths {
    /// Repository root (has `qemu-configs/`).
    pub root: PathBuf,
    /// Cache of built artifacts (`$MC_CACHE`, default `<root>/.cache`).
    pub cache: PathBuf,
    /// Folder of the `mc-hub` and `mc-adapter` binaries (ours).
    pub bin_dir: PathBuf,
}

impl Paths {
    /// Finds the repository from `$MC_HOME` or from this executable's location.
    pub fn discover() -> Result<Paths> {
        let exe = std::env::current_exe().context("cannot find the mc-cluster executable")?;
        let bin_dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
        let root = match std::env::var_os("MC_HOME") {
            Some(h) => PathBuf::from(h),
            None => exe
                .ancestors()
                .find(|p| p.join("qemu-configs").is_dir())
                .map(Path::to_path_buf)
                .or_else(|| std::env::current_dir().ok().filter(|d| d.join("qemu-configs").is_dir()))
                .context("cannot find the repository (no qemu-configs/ above the executable): set MC_HOME")?,
        };
        let cache = std::env::var_os("MC_CACHE").map(PathBuf::from).unwrap_or_else(|| root.join(".cache"));
        Ok(Paths { root, cache, bin_dir })
    }

    /// The default config file.
    pub fn default_config(&self) -> PathBuf {
        self.root.join("qemu-configs/default.toml")
    }

    /// Run folder of cluster `name` (`$MC_RUN_DIR` overrides).
    pub fn run_dir(&self, name: &str) -> PathBuf {
        match std::env::var_os("MC_RUN_DIR") {
            Some(d) => PathBuf::from(d).join(name),
            None => self.root.join(".run").join(name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_checked_files() {
        let c = Config::parse("").unwrap();
        assert_eq!(c.cluster.hub_ports, 8);
        let shipped =
            Config::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../qemu-configs/default.toml")).unwrap();
        assert_eq!(shipped.cluster.hub_ports, 8);
    }

    #[test]
    fn unknown_key_is_one_line_error() {
        let e = Config::parse("[cluster]\nnodes = 2\nnodez = 3\n").unwrap_err().to_string();
        assert!(e.contains("nodez") && e.contains("line 3") && !e.contains('\n'), "{e}");
        let e = Config::parse("[clusterr]\n").unwrap_err().to_string();
        assert!(e.contains("clusterr"), "{e}");
    }

    #[test]
    fn node_counts_are_checked() {
        let c = Config::parse("").unwrap();
        assert!(c.check_nodes(0).unwrap_err().to_string().contains("at least 1"));
        assert!(c.check_nodes(9).unwrap_err().to_string().contains("hub_ports"));
        c.check_nodes(8).unwrap();
        assert!(Config::parse("[cluster]\nhub_ports = 0").is_err());
        assert!(Config::parse("[qemu]\naccel = \"fast\"").is_err());
        assert!(Config::parse("[cluster]\naspace_mib = 3").is_err());
    }

    #[test]
    fn ivshmem_is_off_by_default_and_checked() {
        assert!(!Config::parse("").unwrap().guest.ivshmem);
        assert!(Config::parse("[guest]\nivshmem = true").unwrap().guest.ivshmem);
        assert!(Config::parse("[guest]\nivshmem = 1").is_err());
        let e = Config::parse("[guest]\nivshmm = true").unwrap_err().to_string();
        assert!(e.contains("ivshmm") && e.contains("line 2"), "{e}");
        for f in ["default.toml", "latency-bench.toml"] {
            let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../qemu-configs").join(f);
            Config::load(&path).unwrap();
        }
        let bench = Path::new(env!("CARGO_MANIFEST_DIR")).join("../qemu-configs/latency-bench.toml");
        let c = Config::load(&bench).unwrap();
        assert!(c.guest.ivshmem && !c.guest.imcd);
    }

    /// Every cluster definition in the repository loads, and the one for
    /// MPI jobs changes the two store-path settings it documents.
    #[test]
    fn every_shipped_config_loads() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../qemu-configs");
        let mut n = 0;
        for e in std::fs::read_dir(&dir).unwrap() {
            let path = e.unwrap().path();
            if path.extension().is_some_and(|x| x == "toml") {
                Config::load(&path).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
                n += 1;
            }
        }
        assert!(n >= 6, "{n} configs in {}", dir.display());
        let mpi = Config::load(&dir.join("mpi.toml")).unwrap();
        let default = Config::load(&dir.join("default.toml")).unwrap();
        assert_eq!((mpi.qemu.write_multiple.as_str(), mpi.qemu.qemu_realtime), ("off", true));
        assert_eq!((default.qemu.write_multiple.as_str(), default.qemu.qemu_realtime), ("auto", false));
        assert!(mpi.guest.imcd && mpi.guest.lan == "auto");
    }

    #[test]
    fn lan_takes_a_backend_or_the_old_boolean() {
        assert_eq!(Config::parse("").unwrap().guest.lan, "auto");
        assert_eq!(Config::parse("[guest]\nlan = true").unwrap().guest.lan, "auto");
        assert_eq!(Config::parse("[guest]\nlan = false").unwrap().guest.lan, "off");
        for l in crate::lan::SETTINGS {
            assert_eq!(Config::parse(&format!("[guest]\nlan = \"{l}\"")).unwrap().guest.lan, l);
        }
        let e = Config::parse("[guest]\nlan = \"ethernet\"").unwrap_err().to_string();
        assert!(e.contains("auto, tap, mcast, off") && e.contains("ethernet"), "{e}");
        assert!(Config::parse("[guest]\nlan = 3").is_err());
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
}
