//! QEMU tier for guests that run what users build: the shared folder
//! (virtio-9p at /share), `mc-cluster exec` with standard input,
//! `mc-cluster cp` both ways, and a C program compiled on the host with
//! plain `gcc`, linked dynamically against `libimc.so`, run from the shared
//! folder.

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use tests::{launcher, root, Cluster};

/// A C program against `<sys/imc.h>`. `put KEY V`: stores V*1000+i into
/// word i of a coherent 8 KiB region (transmit with loopback) and waits
/// until its own receive copy shows them. `get KEY V`: waits until every
/// word of its receive copy holds what `put` stores, then prints the sum.
/// Both print the hosts imcd knows.
const PROGRAM: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/imc.h>

#define WORDS 2048
static int wait_all(volatile int *rx, int v, int secs) {
    time_t end = time(NULL) + secs;
    for (;;) {
        int i;
        for (i = 0; i < WORDS && rx[i] == v * 1000 + i; i++) {}
        if (i == WORDS) return 0;
        if (time(NULL) > end) return -1;
    }
}

int main(int argc, char **argv) {
    imc_asid_t id;
    caddr_t rx = 0, tx = 0;
    imc_host_t hosts[16];
    if (argc != 4) { fprintf(stderr, "usage: %s put|get KEY VALUE\n", argv[0]); return 2; }
    long key = atol(argv[2]);
    int v = atoi(argv[3]);
    int put = strcmp(argv[1], "put") == 0;
    int st = imc_asalloc(key, WORDS * sizeof(int), IMC_URW, IMC_COHERENT, &id);
    if (st != IMC_SUCCESS) { printf("imc_asalloc: %d %s\n", st, imc_errmsg()); return 1; }
    st = imc_asattach(id, IMC_RECEIVE, IMC_SHARED, 0, &rx);
    if (st != IMC_SUCCESS) { printf("imc_asattach rx: %d %s\n", st, imc_errmsg()); return 1; }
    int n = imc_gethosts(hosts, 16);
    printf("hosts %d:", n);
    for (int i = 0; i < n && i < 16; i++) printf(" %d=%s", hosts[i].node, hosts[i].name);
    printf("\n");
    fflush(stdout);
    if (put) {
        st = imc_asattach(id, IMC_TRANSMIT, IMC_SHARED, IMC_LOOPBACK, &tx);
        if (st != IMC_SUCCESS) { printf("imc_asattach tx: %d %s\n", st, imc_errmsg()); return 1; }
        for (int i = 0; i < WORDS; i++) ((volatile int *)tx)[i] = v * 1000 + i;
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        if (wait_all((volatile int *)rx, v, 60)) { printf("loopback never showed the stores\n"); return 1; }
        printf("put %d words\n", WORDS);
        return 0;
    }
    if (wait_all((volatile int *)rx, v, 120)) { printf("the region never filled\n"); return 1; }
    long long sum = 0;
    for (int i = 0; i < WORDS; i++) sum += ((volatile int *)rx)[i];
    printf("got sum %lld\n", sum);
    return 0;
}
"#;

fn mc(c: &Cluster, args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut child = Command::new(launcher())
        .args(["--name", &c.name])
        .args(args)
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(data) = stdin {
        let mut si = child.stdin.take().unwrap();
        let data = data.to_vec();
        // Written from a thread: the guest's output comes back meanwhile.
        // (A command that stops reading closes the pipe early: not an error here.)
        std::thread::spawn(move || {
            let _ = si.write_all(&data);
        });
    }
    child.wait_with_output().unwrap()
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
}

/// Bytes of every value, from a seed that changes per run.
fn noise(n: usize) -> Vec<u8> {
    let mut x = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u8
        })
        .collect()
}

/// Compiles [`PROGRAM`] with plain gcc, dynamically against the host build
/// of libimc.so, into `out`.
fn compile(out: &Path) {
    let src = out.with_extension("c");
    fs::write(&src, PROGRAM).unwrap();
    let r = root();
    let o = Command::new("gcc")
        .arg("-O2")
        .arg("-o")
        .arg(out)
        .arg(&src)
        .arg(format!("-I{}", r.join("guest/client/libimc/include").display()))
        .arg(format!("-L{}", r.join("target/release").display()))
        .arg("-limc")
        .output()
        .expect("gcc");
    assert!(o.status.success(), "gcc failed:\n{}", text(&o));
}

/// A C program built on the host, dynamically linked against libimc.so,
/// runs in two guests straight from the shared folder: one stores through
/// MEMORY CHANNEL, the other reads every word back, and both list the
/// cluster's hosts as imcd knows them.
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn dynamic_c_program_runs_from_the_share_against_imcd() {
    let c = Cluster::up("t-share-c", 2);
    c.imcd_ready();
    let share = c.run_dir().join("share");
    compile(&share.join("imcprobe"));
    // Dynamically linked: the guest's loader resolves libimc.so itself.
    let deps = String::from_utf8(c.run(0, &["/lib64/ld-linux-x86-64.so.2", "--list", "/share/imcprobe"])).unwrap();
    assert!(deps.contains("libimc.so => /usr/local/lib/libimc.so"), "{deps}");
    assert!(deps.contains("libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6"), "{deps}");

    let v = 100 + (noise(1)[0] as i64);
    let key = 7000 + v;
    c.background(1, "get", &format!("/share/imcprobe get {key} {v}"));
    c.poll_until(1, &["cat", "/tmp/get.log"], 30, |o| o.contains("hosts"));
    let put = String::from_utf8(c.run(0, &["/share/imcprobe", "put", &key.to_string(), &v.to_string()])).unwrap();
    assert!(put.contains("hosts 2: 0=node0 1=node1") && put.contains("put 2048 words"), "{put}");
    let (rc, log) = c.background_result(1, "get", 150);
    assert_eq!(rc, "0", "{log}");
    let want: i64 = (0..2048).map(|i| v * 1000 + i).sum();
    assert!(log.contains("hosts 2: 0=node0 1=node1"), "{log}");
    assert!(log.contains(&format!("got sum {want}\n")), "expected sum {want}:\n{log}");
}

/// `exec` streams standard input (binary, a few hundred KiB) into a guest
/// command; `cp` brings the file back byte for byte, and takes one in with
/// its mode. Errors name what is wrong.
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn exec_stdin_and_cp_both_ways() {
    let c = Cluster::up("t-share-io", 1);
    let data = noise(300 << 10);
    let o = mc(&c, &["exec", "0", "--", "sh", "-c", "cat > /tmp/x && wc -c < /tmp/x"], Some(&data));
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), data.len().to_string());
    let dir = tempfile::tempdir().unwrap();
    let back = dir.path().join("x");
    let o = mc(&c, &["cp", "0:/tmp/x", back.to_str().unwrap()], None);
    assert!(o.status.success(), "{}", text(&o));
    assert!(fs::read(&back).unwrap() == data, "the file that came back differs from what went in");

    // Host to guest: bytes and mode bits.
    let exe = dir.path().join("tool");
    let small = noise(70 << 10);
    fs::write(&exe, &small).unwrap();
    fs::set_permissions(&exe, fs::Permissions::from_mode(0o750)).unwrap();
    let o = mc(&c, &["cp", exe.to_str().unwrap(), "0:/tmp/"], None);
    assert!(o.status.success(), "{}", text(&o));
    let st = String::from_utf8(c.run(0, &["stat", "-c", "%a %s", "/tmp/tool"])).unwrap();
    assert_eq!(st.trim(), format!("750 {}", small.len()));
    let sum = String::from_utf8(c.run(0, &["md5sum", "/tmp/tool"])).unwrap();
    let host = Command::new("md5sum").arg(&exe).output().unwrap();
    assert_eq!(sum.split_whitespace().next(), String::from_utf8_lossy(&host.stdout).split_whitespace().next());

    // Clear errors, non-zero exit, nothing left behind.
    for (args, says) in [
        (vec!["cp", "/no/such/host/file", "0:/tmp/"], "/no/such/host/file: no such file"),
        (vec!["cp", "0:/no/such/file", dir.path().to_str().unwrap()], "/no/such/file: no such file in the guest"),
        (vec!["cp", exe.to_str().unwrap(), "0:/no/such/dir/f"], "guest folder /no/such/dir does not exist"),
        (vec!["cp", exe.to_str().unwrap(), "5:/tmp/"], "node 5 does not exist"),
        (vec!["cp", exe.to_str().unwrap(), back.to_str().unwrap()], "exactly one side must be NODE:/PATH"),
    ] {
        let o = mc(&c, &args, None);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(text(&o).contains(says), "{args:?}: expected '{says}' in:\n{}", text(&o));
    }
    // No stdin forwarded with -n; the command reads end of file.
    let o = mc(&c, &["exec", "-n", "0", "--", "wc", "-c"], Some(b"ignored"));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "0", "{}", text(&o));
}

/// The shared folder is one folder: what a guest writes there the host and
/// the other guests see, and what the host puts there the guests see.
#[test]
#[ignore = "QEMU tier: run scripts/test.sh"]
fn guests_and_host_share_a_folder() {
    let c = Cluster::up("t-share-fs", 2);
    let share = c.run_dir().join("share");
    let mounts = String::from_utf8(c.run(0, &["cat", "/proc/mounts"])).unwrap();
    assert!(mounts.lines().any(|l| l.starts_with("mcshare /share 9p ")), "{mounts}");
    let boot_id =
        String::from_utf8(c.run(1, &["sh", "-c", "cat /proc/sys/kernel/random/boot_id | tee /share/from1"])).unwrap();
    assert_eq!(boot_id.trim().len(), 36, "{boot_id}");
    assert_eq!(fs::read_to_string(share.join("from1")).unwrap(), boot_id, "the host sees node 1's file");
    assert_eq!(String::from_utf8(c.run(0, &["cat", "/share/from1"])).unwrap(), boot_id, "node 0 sees it too");
    let data = noise(100 << 10);
    fs::write(share.join("from-host"), &data).unwrap();
    let o = mc(&c, &["exec", "1", "--", "cat", "/share/from-host"], None);
    assert!(o.status.success() && o.stdout == data, "node 1 reads the host's file: {}", text(&o));
    // The status line names the folder.
    let st = text(&mc(&c, &["status"], None));
    assert!(st.contains(&format!("share    {} is /share", share.display())), "{st}");
}
