//! The host processes' panic policy (`device/src/fatal.rs`): a panic in any
//! thread of `mc-hub` or `mc-adapter`, a tokio task's included, aborts the
//! whole process at once, so that nothing carries on past a poisoned lock
//! and the supervisor's restart takes over. The test runs itself as a
//! child process that installs the policy, as both binaries do first
//! thing, and then panics inside a task of a multi-threaded runtime (which
//! tokio would otherwise catch, leaving the process half alive).

use std::os::unix::process::ExitStatusExt;
use std::process::Command;
use std::time::Duration;

const CHILD: &str = "MC_PANIC_POLICY_CHILD";

fn child() -> ! {
    device::fatal::abort_on_panic();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let task = tokio::spawn(async { panic!("a port's task failed on purpose") });
        // Without the policy tokio catches the panic: the task ends with an
        // error and everything else goes on.
        let caught = task.await.is_err();
        tokio::time::sleep(Duration::from_secs(2)).await;
        println!("still running after the panic (caught by tokio: {caught})");
    });
    std::process::exit(0)
}

#[test]
fn a_panic_in_any_thread_aborts_the_whole_process() {
    if std::env::var_os(CHILD).is_some() {
        child();
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "a_panic_in_any_thread_aborts_the_whole_process", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGABRT),
        "the child should die of SIGABRT, not {:?}\nstdout: {stdout}\nstderr: {stderr}",
        out.status
    );
    assert!(!stdout.contains("still running"), "it went on after the panic: {stdout}");
    assert!(stderr.contains("a port's task failed on purpose"), "the panic's own message is printed: {stderr}");
    assert!(stderr.contains("aborting the whole process"), "and why it aborts: {stderr}");
}
