//! Does KVM work here? Opening `/dev/kvm` is not enough: on some hosts a VM
//! can be created but its vCPU never runs, and on others a few instructions
//! run but a Linux kernel never gets far (nested virtualisation without
//! hardware paging support). So there are two probes:
//! 1. [`probe`]: four instructions of real-mode code must reach their port
//!    write within [`PROBE_TIMEOUT`] (milliseconds when KVM works);
//! 2. [`probe_boot`]: the guest kernel itself, under KVM, must reach the
//!    point where it runs init within [`BOOT_PROBE_TIMEOUT`] (TCG gets there
//!    in about two seconds on these machines).
//!
//! The verdict of the second is cached by the caller, since it costs seconds.

use std::sync::mpsc;
use std::time::Duration;

use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::{Kvm, VcpuExit};

/// How long the probe vCPU may take to reach its port write.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

const GUEST_ADDR: u64 = 0x1000;
const PROBE_PORT: u16 = 0x3f8;
const PROBE_BYTE: u8 = 0x42;

fn probe_inner() -> Result<(), String> {
    let kvm = Kvm::new().map_err(|e| format!("/dev/kvm: {e}"))?;
    let vm = kvm.create_vm().map_err(|e| format!("KVM_CREATE_VM: {e}"))?;
    let size = 0x1000;
    // SAFETY: anonymous private mapping, checked below, handed to KVM and
    // deliberately leaked (the probe is one-shot and may leave a stuck vCPU).
    let mem = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_ANONYMOUS | libc::MAP_PRIVATE,
            -1,
            0,
        )
    };
    if mem == libc::MAP_FAILED {
        return Err("mmap failed".into());
    }
    // mov dx, 0x3f8; mov al, 0x42; out dx, al; hlt
    let code: [u8; 7] = [0xba, 0xf8, 0x03, 0xb0, PROBE_BYTE, 0xee, 0xf4];
    // SAFETY: `mem` is a fresh writable mapping of `size` > code.len() bytes.
    unsafe { std::ptr::copy_nonoverlapping(code.as_ptr(), mem.cast::<u8>(), code.len()) };
    let region = kvm_userspace_memory_region {
        slot: 0,
        guest_phys_addr: GUEST_ADDR,
        memory_size: size as u64,
        userspace_addr: mem as u64,
        flags: 0,
    };
    // SAFETY: the region points at our mapping, which is never unmapped.
    unsafe { vm.set_user_memory_region(region) }.map_err(|e| format!("KVM_SET_USER_MEMORY_REGION: {e}"))?;
    let mut vcpu = vm.create_vcpu(0).map_err(|e| format!("KVM_CREATE_VCPU: {e}"))?;
    let mut sregs = vcpu.get_sregs().map_err(|e| format!("KVM_GET_SREGS: {e}"))?;
    sregs.cs.base = 0;
    sregs.cs.selector = 0;
    vcpu.set_sregs(&sregs).map_err(|e| format!("KVM_SET_SREGS: {e}"))?;
    let mut regs = vcpu.get_regs().map_err(|e| format!("KVM_GET_REGS: {e}"))?;
    regs.rip = GUEST_ADDR;
    regs.rflags = 2;
    vcpu.set_regs(&regs).map_err(|e| format!("KVM_SET_REGS: {e}"))?;
    match vcpu.run().map_err(|e| format!("KVM_RUN: {e}"))? {
        VcpuExit::IoOut(PROBE_PORT, data) if data.first() == Some(&PROBE_BYTE) => Ok(()),
        other => Err(format!("probe vCPU exited with {other:?}")),
    }
}

/// `Ok` when KVM runs guest code; `Err` says why not.
pub fn probe() -> Result<(), String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(probe_inner());
    });
    match rx.recv_timeout(PROBE_TIMEOUT) {
        Ok(r) => r,
        Err(_) => Err(format!("a KVM vCPU did not run within {PROBE_TIMEOUT:?} (no usable hardware virtualisation)")),
    }
}

/// How long the guest kernel may take under KVM to reach init.
pub const BOOT_PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Boots `kernel` under KVM with `qemu` and waits for it to try running init.
pub fn probe_boot(qemu: &std::path::Path, kernel: &std::path::Path, firmware_dirs: &[String]) -> Result<(), String> {
    use std::io::Read;
    use std::process::{Command, Stdio};
    let mut cmd = Command::new(qemu);
    for d in firmware_dirs {
        cmd.arg("-L").arg(d);
    }
    cmd.args([
        "-accel",
        "kvm",
        "-cpu",
        "host",
        "-m",
        "128",
        "-nodefaults",
        "-display",
        "none",
        "-no-reboot",
        "-serial",
        "stdio",
    ])
    .arg("-kernel")
    .arg(kernel)
    .args(["-append", "console=ttyS0 panic=-1 rdinit=/mc-kvm-probe-no-init"])
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::null());
    let mut child = cmd.spawn().map_err(|e| format!("cannot run {}: {e}", qemu.display()))?;
    let mut out = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = out.read(&mut buf) {
            if n == 0 {
                break;
            }
            seen.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&seen);
            if text.contains("mc-kvm-probe-no-init") || text.contains("Kernel panic") {
                let _ = tx.send(());
                return;
            }
        }
    });
    let verdict = match rx.recv_timeout(BOOT_PROBE_TIMEOUT) {
        Ok(()) => Ok(()),
        Err(_) => Err(format!("the guest kernel did not reach init under KVM within {BOOT_PROBE_TIMEOUT:?}")),
    };
    let _ = child.kill();
    let _ = child.wait();
    verdict
}
