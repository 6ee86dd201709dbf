//! `mpid`: the MPI launch daemon of one guest (see `mpiexec::daemon`).
//! Started at boot by `/etc/rc.mc`.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use mpiexec::{daemon, hosts, proto};

const USAGE: &str = "usage: mpid [--node N] [--wait-imcd SECS]
  --node N          this node (default: $MCMPI_NODE, imcd, /run/mc-node, else 0)
  --wait-imcd SECS  wait up to SECS for imcd before listening (boot)
The handle is 0x4D50FFFF00000000 | node ($MCMPI_MPID_BASE moves the base).";

fn parse() -> Result<daemon::Options, String> {
    let mut node = None;
    let mut wait = 0u64;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--node" => {
                let v = it.next().ok_or("--node needs a number")?;
                node = Some(v.parse::<u16>().map_err(|_| format!("--node {v}: not a node number"))?);
            }
            "--wait-imcd" => {
                let v = it.next().ok_or("--wait-imcd needs a number of seconds")?;
                wait = v.parse().map_err(|_| format!("--wait-imcd {v}: not a number"))?;
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    let node = match node {
        Some(n) => u32::from(n),
        None => hosts::local_node().map_err(|e| e.to_string())?,
    };
    let base = proto::mpid_base().map_err(|e| e.to_string())?;
    Ok(daemon::Options { node, base, wait_imcd: Duration::from_secs(wait) })
}

fn main() {
    let opts = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("mpid: {e}");
            std::process::exit(2);
        }
    };
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT, signal_hook::consts::SIGHUP] {
        if let Err(e) = signal_hook::flag::register(sig, stop.clone()) {
            eprintln!("mpid: cannot handle signal {sig}: {e}");
            std::process::exit(1);
        }
    }
    if let Err(e) = daemon::run(&opts, &stop) {
        eprintln!("mpid: {e}");
        std::process::exit(1);
    }
}
