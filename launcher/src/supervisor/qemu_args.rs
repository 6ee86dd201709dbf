//! QEMU's command line for a node: machine, accelerator and CPU model,
//! memory, the vfio-user adapter, kernel and its command line, the LAN,
//! ivshmem for comparisons, the shared folder, console and agent port;
//! and the ivshmem file every guest maps. Pure functions of the plan.

use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::state::{node_dir, Plan};
use crate::config::{IVSHMEM_MIB, SHARE_TAG};
use crate::lan::Lan;

/// The file behind every guest's `ivshmem-plain` device (`[guest] ivshmem`).
pub fn ivshmem_path(run_dir: &Path) -> PathBuf {
    run_dir.join("ivshmem")
}

/// Creates the zeroed shared file every guest's `ivshmem-plain` maps, at its
/// full size before any QEMU starts (so none of them races to create it).
pub(super) fn create_ivshmem(run_dir: &Path) -> Result<()> {
    let p = ivshmem_path(run_dir);
    let f = File::create(&p).with_context(|| format!("creating {}", p.display()))?;
    f.set_len(IVSHMEM_MIB << 20).with_context(|| format!("sizing {}", p.display()))?;
    Ok(())
}

/// QEMU's id of the adapter device (QMP `device_del`).
pub const ADAPTER_ID: &str = "mc";
/// QEMU's id of the hot-pluggable slot the adapter sits in with
/// `[guest] hotplug`.
pub const ADAPTER_SLOT: &str = "mc-slot";

/// The adapter's `-device` (and QMP `device_add`) arguments for node dir
/// `nd`: the vfio-user client of its socket, in the hot-pluggable slot
/// when `hotplug`.
pub fn adapter_device(nd: &Path, hotplug: bool) -> serde_json::Value {
    let mut d = serde_json::json!({
        "driver": "vfio-user-pci",
        "id": ADAPTER_ID,
        "socket": {"type": "unix", "path": nd.join("adapter.sock")},
    });
    if hotplug {
        d["bus"] = ADAPTER_SLOT.into();
    }
    d
}

/// Node dir `nd`'s QMP socket.
pub fn qmp_socket(nd: &Path) -> PathBuf {
    nd.join("qmp.sock")
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
    if c.guest.hotplug {
        push("-device");
        push(&format!("pcie-root-port,id={ADAPTER_SLOT},chassis=1,slot=1"));
    }
    push("-device");
    push(&adapter_device(&nd, c.guest.hotplug).to_string());
    push("-qmp");
    push(&format!("unix:{},server=on,wait=off", qmp_socket(&nd).display().to_string().replace(',', ",,")));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::supervisor::fixtures::{no_lan, plan};

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
}
