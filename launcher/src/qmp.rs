//! A QMP client for one QEMU: the handshake, one command at a time, and
//! waiting for an event. `mc-cluster unplug` and `plug` take a guest's
//! adapter out and put it back with it (docs/adapter.md, "Surprise
//! removal"). QEMU listens on `<node dir>/qmp.sock` (`-qmp`).
//!
//! Threads: the caller's only; every read has a deadline.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use thiserror::Error;

/// What went wrong talking to QEMU.
#[derive(Debug, Error)]
pub enum QmpError {
    /// The socket could not be reached or broke.
    #[error("QMP socket {path}: {err}")]
    Io {
        /// The socket.
        path: String,
        /// Why.
        err: std::io::Error,
    },
    /// QEMU said something that is not QMP.
    #[error("QMP: unexpected {0}")]
    Protocol(String),
    /// QEMU refused the command.
    #[error("QEMU refused {command}: {desc}")]
    Refused {
        /// The command.
        command: String,
        /// QEMU's reason.
        desc: String,
    },
    /// Nothing came in time.
    #[error("QMP: no {what} within {secs} s")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long.
        secs: u64,
    },
}

/// A connection to one QEMU's QMP socket, past the handshake.
pub struct Qmp {
    path: String,
    out: UnixStream,
    input: BufReader<UnixStream>,
    /// Events read while waiting for a command's answer.
    events: Vec<Value>,
}

impl Qmp {
    /// Connects and leaves capabilities negotiation.
    pub fn connect(path: &Path) -> Result<Qmp, QmpError> {
        let p = path.display().to_string();
        let io = |err| QmpError::Io { path: p.clone(), err };
        let s = UnixStream::connect(path).map_err(io)?;
        let input = BufReader::new(s.try_clone().map_err(io)?);
        let mut q = Qmp { path: p.clone(), out: s, input, events: Vec::new() };
        let greeting = q.read(Instant::now() + Duration::from_secs(10), "greeting")?;
        if greeting.get("QMP").is_none() {
            return Err(QmpError::Protocol(format!("greeting {greeting}")));
        }
        q.execute("qmp_capabilities", json!({}))?;
        Ok(q)
    }

    fn read(&mut self, deadline: Instant, what: &str) -> Result<Value, QmpError> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(QmpError::Timeout { what: what.into(), secs: 0 });
        }
        let io = |err| QmpError::Io { path: self.path.clone(), err };
        self.out.set_read_timeout(Some(left)).map_err(io)?;
        let mut line = String::new();
        match self.input.read_line(&mut line) {
            Ok(0) => Err(QmpError::Io { path: self.path.clone(), err: std::io::ErrorKind::UnexpectedEof.into() }),
            Ok(_) => serde_json::from_str(&line).map_err(|e| QmpError::Protocol(format!("line {line:?}: {e}"))),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                Err(QmpError::Timeout { what: what.into(), secs: left.as_secs() })
            }
            Err(err) => Err(QmpError::Io { path: self.path.clone(), err }),
        }
    }

    /// Runs `command` with `arguments`; its `return` value.
    pub fn execute(&mut self, command: &str, arguments: Value) -> Result<Value, QmpError> {
        let msg = json!({"execute": command, "arguments": arguments});
        let io = |err| QmpError::Io { path: self.path.clone(), err };
        writeln!(self.out, "{msg}").map_err(io)?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let v = self.read(deadline, &format!("answer to {command}"))?;
            if let Some(r) = v.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = v.get("error") {
                let desc = e.get("desc").and_then(Value::as_str).unwrap_or("no reason given").to_string();
                return Err(QmpError::Refused { command: command.into(), desc });
            }
            if v.get("event").is_some() {
                self.events.push(v);
                continue;
            }
            return Err(QmpError::Protocol(format!("answer {v}")));
        }
    }

    /// Waits up to `timeout` for event `name` whose data satisfies `pred`
    /// (events that came with a command's answer count too).
    pub fn wait_event(
        &mut self,
        name: &str,
        timeout: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Result<Value, QmpError> {
        let matches = |v: &Value| v.get("event").and_then(Value::as_str) == Some(name) && pred(&v["data"]);
        if let Some(i) = self.events.iter().position(matches) {
            return Ok(self.events.remove(i));
        }
        let deadline = Instant::now() + timeout;
        loop {
            let v = self.read(deadline, &format!("{name} event")).map_err(|e| match e {
                QmpError::Timeout { what, .. } => QmpError::Timeout { what, secs: timeout.as_secs() },
                e => e,
            })?;
            if matches(&v) {
                return Ok(v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    /// A QEMU stand-in: greets, answers each command with `answer(cmd)`,
    /// and sends `events` after the second command.
    fn fake(dir: &Path, answer: fn(&str) -> Value, events: Vec<Value>) -> std::path::PathBuf {
        let path = dir.join("qmp.sock");
        let l = UnixListener::bind(&path).unwrap();
        std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let mut out = s.try_clone().unwrap();
            writeln!(out, "{}", json!({"QMP": {"version": {}, "capabilities": []}})).unwrap();
            let mut n = 0;
            for line in BufReader::new(s).lines() {
                let v: Value = serde_json::from_str(&line.unwrap()).unwrap();
                n += 1;
                writeln!(out, "{}", answer(v["execute"].as_str().unwrap())).unwrap();
                if n == 2 {
                    for e in &events {
                        writeln!(out, "{e}").unwrap();
                    }
                }
            }
        });
        path
    }

    #[test]
    fn commands_answers_refusals_and_events() {
        let dir = tempfile::tempdir().unwrap();
        let answer = |cmd: &str| match cmd {
            "device_add" => json!({"error": {"class": "GenericError", "desc": "Duplicate device ID 'mc'"}}),
            _ => json!({"return": {}}),
        };
        let deleted = |dev: &str| json!({"event": "DEVICE_DELETED", "data": {"device": dev, "path": "/x"}});
        let p = fake(dir.path(), answer, vec![deleted("other"), deleted("mc")]);
        let mut q = Qmp::connect(&p).unwrap();
        q.execute("device_del", json!({"id": "mc"})).unwrap();
        let e = q.wait_event("DEVICE_DELETED", Duration::from_secs(5), |d| d["device"] == "mc").unwrap();
        assert_eq!(e["data"]["device"], "mc");
        match q.execute("device_add", json!({"id": "mc"})) {
            Err(QmpError::Refused { command, desc }) => {
                assert_eq!((command.as_str(), desc.as_str()), ("device_add", "Duplicate device ID 'mc'"))
            }
            other => panic!("{other:?}"),
        }
        let t = q.wait_event("DEVICE_DELETED", Duration::from_millis(200), |_| true).unwrap_err();
        assert!(t.to_string().contains("no DEVICE_DELETED event"), "{t}");
    }

    #[test]
    fn a_socket_nobody_listens_on_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let e = Qmp::connect(&dir.path().join("none.sock")).err().unwrap().to_string();
        assert!(e.contains("none.sock"), "{e}");
    }
}
