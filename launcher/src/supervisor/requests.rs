//! The client side of the supervisor's request socket (`supervisor.sock`):
//! `mc-cluster restart` and `mc-cluster hub restart` send one line and
//! wait for `ok ...` or `error ...`. The supervisor's loop serves it
//! (`Sup::serve_requests`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};

/// The supervisor's request socket in a run folder.
pub fn request_sock(run_dir: &Path) -> PathBuf {
    run_dir.join("supervisor.sock")
}

/// Sends one request line (`restart-node N`, `restart-hub`) to the
/// supervisor of `run_dir` and returns its answer; waits up to `timeout`
/// (a restart waits for guests to boot).
pub fn request(run_dir: &Path, req: &str, timeout: Duration) -> Result<String> {
    use std::io::{BufRead, BufReader};
    let p = request_sock(run_dir);
    let mut s = std::os::unix::net::UnixStream::connect(&p)
        .with_context(|| format!("the supervisor does not answer at {}", p.display()))?;
    s.set_read_timeout(Some(timeout))?;
    writeln!(s, "{req}")?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).context("no answer from the supervisor")?;
    match line.trim_end().split_once(' ') {
        Some(("ok", msg)) => Ok(msg.to_string()),
        Some(("error", msg)) => bail!("{msg}"),
        _ => bail!("unexpected answer from the supervisor: {line:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_reach_the_supervisor_and_errors_come_back() {
        let dir = tempfile::tempdir().unwrap();
        let l = std::os::unix::net::UnixListener::bind(request_sock(dir.path())).unwrap();
        let t = std::thread::spawn(move || {
            use std::io::{BufRead, BufReader};
            for answer in ["ok node 1 restarted", "error node 9 does not exist"] {
                let (s, _) = l.accept().unwrap();
                let mut line = String::new();
                BufReader::new(&s).read_line(&mut line).unwrap();
                assert!(line.starts_with("restart-node "), "{line}");
                writeln!(&s, "{answer}").unwrap();
            }
        });
        let t5 = Duration::from_secs(5);
        assert_eq!(request(dir.path(), "restart-node 1", t5).unwrap(), "node 1 restarted");
        let e = request(dir.path(), "restart-node 9", t5).unwrap_err().to_string();
        assert_eq!(e, "node 9 does not exist");
        t.join().unwrap();
        let gone = tempfile::tempdir().unwrap();
        assert!(request(gone.path(), "restart-hub", t5).unwrap_err().to_string().contains("does not answer"));
    }
}
