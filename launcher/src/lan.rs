//! The guests' LAN (`[guest] lan`): which QEMU network backend joins the
//! guests' virtio-net devices, and the host side that backend needs.
//!
//! The LAN is there for comparisons: TCP, and MPICH over TCP, between the
//! same guests that run MEMORY CHANNEL traffic. So it should be the fastest
//! guest network this host allows (docs/mpi.md, "The LAN").
//!
//! - `tap`: one tap device per guest on a Linux bridge, all inside a network
//!   namespace of the cluster's own. The tap's virtio-net header gives the
//!   guests checksum and segmentation offloads (64 KiB TCP segments). The
//!   supervisor holds the namespace's file descriptor; when the supervisor
//!   and its QEMUs are gone, the kernel removes the namespace, the bridge and
//!   the taps, so nothing is left on the host even after a crash. Needs
//!   `/dev/net/tun`, the right to create a network namespace (root or
//!   CAP_SYS_ADMIN) and `ip` (iproute2).
//! - `mcast`: QEMU's socket netdev on a loopback multicast group of the
//!   cluster (every frame reaches every guest), with a 65000-byte MTU. Needs
//!   nothing from the host.
//! - `auto` (the default): `tap` where the host allows it, else `mcast`,
//!   with the reason written to the cluster's events.
//! - `off`: no LAN.
//!
//! Threads: the supervisor's one thread; the namespace is made on a
//! short-lived thread of its own, because `unshare` moves only the calling
//! thread into the new namespace.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use nix::sched::{setns, unshare, CloneFlags};

/// The settings `[guest] lan` takes.
pub const SETTINGS: [&str; 4] = ["auto", "tap", "mcast", "off"];

/// The bridge's name inside the namespace.
const BRIDGE: &str = "mcbr0";

/// The MTU of the `mcast` backend's devices: the socket backends have no
/// offloads, so larger frames are what makes bulk TCP faster on them.
pub const MCAST_MTU: u32 = 65000;

/// Errors of setting the LAN up.
#[derive(Debug, thiserror::Error)]
pub enum LanError {
    /// `[guest] lan` has a value it does not take.
    #[error("guest.lan must be one of {all} (or true/false), not '{0}'", all = SETTINGS.join(", "))]
    Setting(String),
    /// The tap backend's device file cannot be opened.
    #[error("cannot open /dev/net/tun: {0}")]
    Tun(std::io::Error),
    /// No network namespace could be made.
    #[error("cannot create a network namespace: {0}")]
    Netns(String),
    /// iproute2's `ip` is not installed.
    #[error(
        "`ip` (iproute2) not found in /usr/sbin, /sbin, /usr/bin or /bin: install iproute2 (scripts/setup.sh does)"
    )]
    NoIp,
    /// A command run inside the namespace failed.
    #[error("`{cmd}` in the LAN's namespace failed: {out}")]
    Ip {
        /// The command line.
        cmd: String,
        /// Its exit status and output.
        out: String,
    },
    /// The tap's interface script could not be written.
    #[error("cannot write {path}: {err}")]
    Script {
        /// The script's path.
        path: PathBuf,
        /// Why.
        err: std::io::Error,
    },
}

/// The backend in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Taps on a bridge in the cluster's network namespace.
    Tap,
    /// QEMU's socket netdev on a loopback multicast group.
    Mcast,
    /// No LAN.
    Off,
}

/// The cluster's LAN, set up.
#[derive(Debug)]
pub struct Lan {
    backend: Backend,
    /// With `Tap`: the namespace the QEMUs run in (held open here).
    netns: Option<OwnedFd>,
    /// With `Tap`: the script QEMU runs to put its tap on the bridge.
    ifup: PathBuf,
    /// Why `auto` did not get `tap` (empty otherwise).
    fallback: String,
}

/// Checks a `[guest] lan` value: one of [`SETTINGS`].
pub fn check_setting(setting: &str) -> Result<(), LanError> {
    if SETTINGS.contains(&setting) {
        Ok(())
    } else {
        Err(LanError::Setting(setting.to_string()))
    }
}

impl Lan {
    /// A LAN that needs nothing set up: `mcast` or `off`.
    pub fn plain(backend: Backend) -> Lan {
        assert!(backend != Backend::Tap, "the tap backend is made by Lan::set_up");
        Lan { backend, netns: None, ifup: PathBuf::new(), fallback: String::new() }
    }

    /// Sets the LAN of the cluster in `run_dir` up, as `setting` asks.
    pub fn set_up(setting: &str, run_dir: &Path) -> Result<Lan, LanError> {
        match setting {
            "off" => Ok(Lan::plain(Backend::Off)),
            "mcast" => Ok(Lan::plain(Backend::Mcast)),
            "tap" => tap(run_dir),
            "auto" => {
                Ok(tap(run_dir).unwrap_or_else(|e| Lan { fallback: e.to_string(), ..Lan::plain(Backend::Mcast) }))
            }
            other => Err(LanError::Setting(other.to_string())),
        }
    }

    /// The backend in use.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The namespace QEMU must run in, if any.
    pub fn netns(&self) -> Option<BorrowedFd<'_>> {
        self.netns.as_ref().map(|f| f.as_fd())
    }

    /// One line for people: which LAN, and why when `auto` fell back.
    pub fn describe(&self) -> String {
        let what = match self.backend {
            Backend::Tap => {
                format!("tap: one tap per guest on bridge {BRIDGE} in the cluster's network namespace (virtio-net offloads)")
            }
            Backend::Mcast => format!("mcast: QEMU socket netdev on a loopback multicast group, MTU {MCAST_MTU}"),
            Backend::Off => "off".to_string(),
        };
        if self.fallback.is_empty() {
            what
        } else {
            format!("{what} (tap not possible: {})", self.fallback)
        }
    }

    /// The short name of the backend (`tap`, `mcast`, `off`).
    pub fn name(&self) -> &'static str {
        match self.backend {
            Backend::Tap => "tap",
            Backend::Mcast => "mcast",
            Backend::Off => "off",
        }
    }

    /// QEMU's `-netdev` and `-device` arguments for node `n`.
    pub fn qemu_args(&self, run_dir: &Path, n: usize) -> Vec<String> {
        qemu_args(self.backend, run_dir, &self.ifup, n)
    }
}

/// QEMU's `-netdev` and `-device` arguments for node `n` on backend `b`
/// (`ifup`: the tap backend's interface script).
pub fn qemu_args(b: Backend, run_dir: &Path, ifup: &Path, n: usize) -> Vec<String> {
    let mac = format!("mac=52:54:00:4d:{:02x}:{:02x}", n >> 8 & 0xFF, n & 0xFF);
    let (netdev, device) = match b {
        Backend::Off => return Vec::new(),
        Backend::Tap => (
            format!(
                "tap,id=lan,ifname=mctap{n},script={},downscript=no,vhost=off",
                ifup.display().to_string().replace(',', ",,")
            ),
            format!("virtio-net-pci,netdev=lan,romfile=,{mac}"),
        ),
        Backend::Mcast => (
            format!("socket,id=lan,mcast=230.0.0.1:{},localaddr=127.0.0.1", lan_port(run_dir)),
            format!("virtio-net-pci,netdev=lan,romfile=,{mac},host_mtu={MCAST_MTU}"),
        ),
    };
    vec!["-netdev".into(), netdev, "-device".into(), device]
}

/// The UDP port of the `mcast` backend's group: one per run folder, so
/// clusters side by side do not hear each other.
pub fn lan_port(run_dir: &Path) -> u16 {
    let h = run_dir
        .as_os_str()
        .as_encoded_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
    20000 + (h % 40000) as u16
}

/// iproute2's `ip`, looked up where Debian puts it (the supervisor's PATH
/// may lack the sbin folders).
fn find_ip() -> Result<PathBuf, LanError> {
    ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .ok_or(LanError::NoIp)
}

/// Makes a network namespace and returns its descriptor. The namespace
/// lives as long as the descriptor or a process inside it.
fn new_netns() -> Result<OwnedFd, LanError> {
    std::thread::spawn(|| -> Result<OwnedFd, LanError> {
        unshare(CloneFlags::CLONE_NEWNET).map_err(|e| LanError::Netns(format!("unshare: {e}")))?;
        let f = File::open("/proc/thread-self/ns/net")
            .map_err(|e| LanError::Netns(format!("/proc/thread-self/ns/net: {e}")))?;
        Ok(OwnedFd::from(f))
    })
    .join()
    .map_err(|_| LanError::Netns("the namespace thread panicked".into()))?
}

/// Makes `cmd` start inside the network namespace `ns`.
pub fn enter_netns(cmd: &mut Command, ns: BorrowedFd<'_>) {
    let fd = ns.as_raw_fd();
    // SAFETY: setns(2) only, between fork and exec; `fd` stays open in the
    // parent (it owns it) until the child has exec'd.
    unsafe {
        cmd.pre_exec(move || {
            // SAFETY: `fd` is the namespace descriptor the parent holds.
            let ns = BorrowedFd::borrow_raw(fd);
            setns(ns, CloneFlags::CLONE_NEWNET).map_err(std::io::Error::from)
        });
    }
}

/// Runs `ip ARGS` inside `ns`.
fn ip_in(ip: &Path, ns: BorrowedFd<'_>, args: &[&str]) -> Result<(), LanError> {
    let mut cmd = Command::new(ip);
    cmd.args(args).stdin(Stdio::null());
    enter_netns(&mut cmd, ns);
    let line = format!("ip {}", args.join(" "));
    let out = cmd.output().map_err(|e| LanError::Ip { cmd: line.clone(), out: e.to_string() })?;
    if !out.status.success() {
        let text = String::from_utf8_lossy(&out.stderr).trim().to_string();
        return Err(LanError::Ip { cmd: line, out: format!("{}: {text}", out.status) });
    }
    Ok(())
}

/// The tap backend: namespace, bridge, and the script that puts each
/// QEMU's tap on the bridge.
fn tap(run_dir: &Path) -> Result<Lan, LanError> {
    std::fs::OpenOptions::new().read(true).write(true).open("/dev/net/tun").map_err(LanError::Tun)?;
    let ip = find_ip()?;
    let ns = new_netns()?;
    ip_in(&ip, ns.as_fd(), &["link", "add", BRIDGE, "type", "bridge"])?;
    ip_in(&ip, ns.as_fd(), &["link", "set", BRIDGE, "up"])?;
    let ifup = run_dir.join("lan-ifup");
    let script = format!(
        "#!/bin/sh\n# Run by QEMU (in the cluster's network namespace) with its new tap's name.\n\
         exec {ip} link set \"$1\" master {BRIDGE} up\n",
        ip = ip.display()
    );
    std::fs::write(&ifup, script)
        .and_then(|()| std::fs::set_permissions(&ifup, std::fs::Permissions::from_mode(0o755)))
        .map_err(|err| LanError::Script { path: ifup.clone(), err })?;
    Ok(Lan { backend: Backend::Tap, netns: Some(ns), ifup, fallback: String::new() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_per_backend() {
        let rd = Path::new("/r");
        assert!(qemu_args(Backend::Off, rd, Path::new(""), 0).is_empty());
        let t = qemu_args(Backend::Tap, rd, Path::new("/r/lan-ifup"), 3).join(" ");
        assert!(t.contains("-netdev tap,id=lan,ifname=mctap3,script=/r/lan-ifup,downscript=no"), "{t}");
        assert!(t.contains("mac=52:54:00:4d:00:03"), "{t}");
        let m = qemu_args(Backend::Mcast, rd, Path::new(""), 258).join(" ");
        assert!(m.contains(&format!("mcast=230.0.0.1:{}", lan_port(rd))), "{m}");
        assert!(m.contains("host_mtu=65000") && m.contains("mac=52:54:00:4d:01:02"), "{m}");
    }

    #[test]
    fn bad_setting_is_an_error() {
        let e = Lan::set_up("ethernet", Path::new("/nonexistent")).unwrap_err();
        assert!(e.to_string().contains("auto, tap, mcast, off"), "{e}");
    }

    /// Where the host allows it (root, /dev/net/tun, iproute2), `tap` makes
    /// a namespace with the bridge in it and nothing in the host's own.
    #[test]
    fn tap_makes_a_bridge_in_its_own_namespace() {
        let dir = tempfile::tempdir().unwrap();
        let lan = match Lan::set_up("tap", dir.path()) {
            Ok(l) => l,
            Err(e) => {
                // Not an error of ours: `auto` falls back, and says why.
                let auto = Lan::set_up("auto", dir.path()).unwrap();
                assert_eq!(auto.backend(), Backend::Mcast);
                assert!(auto.describe().contains(&e.to_string()), "{}", auto.describe());
                return;
            }
        };
        assert_eq!(lan.backend(), Backend::Tap);
        let ip = find_ip().unwrap();
        let mut cmd = Command::new(&ip);
        cmd.args(["-o", "link", "show", BRIDGE]);
        enter_netns(&mut cmd, lan.netns().unwrap());
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stdout).contains("UP"));
        let host = Command::new(&ip).args(["-o", "link", "show", BRIDGE]).output().unwrap();
        assert!(!host.status.success(), "the bridge leaked into the host's namespace");
        let script = std::fs::read_to_string(dir.path().join("lan-ifup")).unwrap();
        assert!(script.contains(&format!("master {BRIDGE} up")), "{script}");
    }
}
