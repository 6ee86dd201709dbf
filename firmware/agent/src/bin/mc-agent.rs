//! `mc-agent`: the guest side of `mc-cluster exec` and `mc-cluster cp`.
//!
//! Finds the virtio-serial port named `mc.agent`, then answers requests one
//! at a time ([`agent::server`]). Started (and restarted if it dies) by the
//! guest's init.

use std::fs::{self, OpenOptions};
use std::path::PathBuf;
use std::thread;
use std::time::Duration;

use agent::PORT_NAME;

fn find_port() -> Option<PathBuf> {
    for e in fs::read_dir("/sys/class/virtio-ports").ok()?.flatten() {
        let name = fs::read_to_string(e.path().join("name")).unwrap_or_default();
        if name.trim() == PORT_NAME {
            return Some(PathBuf::from("/dev").join(e.file_name()));
        }
    }
    None
}

fn main() {
    let port = loop {
        match find_port() {
            Some(p) => break p,
            None => thread::sleep(Duration::from_millis(100)),
        }
    };
    eprintln!("mc-agent: serving on {}", port.display());
    let mut f = match OpenOptions::new().read(true).write(true).open(&port) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("mc-agent: {}: {e}", port.display());
            std::process::exit(1);
        }
    };
    loop {
        // `serve` returns when the port reads as end of file: no host is
        // connected. Wait for one.
        if let Err(e) = agent::server::serve(&mut f) {
            eprintln!("mc-agent: {}: {e}", port.display());
            std::process::exit(1);
        }
        thread::sleep(Duration::from_millis(20));
    }
}
