//! `mpiexec` and `mpirun` (the same program): starts an MPI job's ranks
//! through the `mpid` of each host (see `mpiexec::client`, `mpiexec -h`).

use std::io::Read;
use std::sync::atomic::Ordering;

use mpiexec::args::{self, USAGE};
use mpiexec::client::{self, Plan, Settings, Stops, EXIT_LAUNCH_FAILED};
use mpiexec::{hosts, place, proto};

/// How long each mpid gets to answer ($MCMPI_CONNECT_TIMEOUT seconds).
const CONNECT_WAIT_S: u64 = 10;

fn fail(me: &str, msg: impl std::fmt::Display) -> ! {
    eprintln!("{me}: {msg}");
    std::process::exit(EXIT_LAUNCH_FAILED);
}

fn main() {
    let argv: Vec<String> = std::env::args().collect();
    let me = argv
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "mpiexec".into());
    let timeout_var = std::env::var("MPIEXEC_TIMEOUT").ok();
    let a = match args::parse(argv.get(1..).unwrap_or(&[]), timeout_var.as_deref()) {
        Ok(a) => a,
        Err(e) => fail(&me, e),
    };
    if a.help {
        println!("{USAGE}");
        return;
    }
    if a.version {
        // The name it was run as: mpiexec or mpirun.
        println!("{me} {}", env!("CARGO_PKG_VERSION"));
        return;
    }
    let cluster = hosts::Cluster::discover().unwrap_or_else(|e| fail(&me, e));
    let hosts = match &a.hosts {
        Some(list) => cluster.resolve_list(list).unwrap_or_else(|e| fail(&me, e)),
        None => vec![cluster.me],
    };
    let slots = place::place(a.n, hosts.len(), a.ppn).unwrap_or_else(|e| fail(&me, e));
    let node_of: Vec<u32> = slots.iter().map(|&h| hosts[h]).collect();
    let base = proto::mpid_base().unwrap_or_else(|e| fail(&me, e));
    let connect_s = std::env::var("MCMPI_CONNECT_TIMEOUT").ok().and_then(|s| s.parse().ok()).unwrap_or(CONNECT_WAIT_S);

    let mut env: Vec<(String, String)> = Vec::new();
    if a.env_all {
        // Our own launch variables (mpiexec run by an MPI rank) are not the job's.
        env.extend(std::env::vars().filter(|(k, _)| !k.starts_with("MCMPI_")));
    }
    env.extend(a.env.iter().cloned());
    let (cwd, cwd_required) = match &a.wdir {
        Some(d) => {
            let abs = if d.starts_with('/') {
                d.clone()
            } else {
                std::env::current_dir().map(|c| c.join(d).to_string_lossy().into_owned()).unwrap_or_else(|_| d.clone())
            };
            (abs, true)
        }
        None => {
            (std::env::current_dir().map(|c| c.to_string_lossy().into_owned()).unwrap_or_else(|_| "/".into()), false)
        }
    };
    let plan = Plan { job: client::fresh_job_id(), node_of, argv: a.argv.clone(), env, cwd, cwd_required };
    let set = Settings {
        base,
        connect_wait: std::time::Duration::from_secs(connect_s),
        prepend_rank: a.prepend_rank,
        timeout: a.timeout,
    };

    let stops = Stops::default();
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM, signal_hook::consts::SIGHUP] {
        if let Err(e) = signal_hook::flag::register_usize(sig, stops.signal.clone(), sig as usize) {
            fail(&me, format!("cannot handle signal {sig}: {e}"));
        }
    }
    if a.end_on_stdin_eof {
        let eof = stops.stdin_eof.clone();
        // Not joined: it sits in a read until standard input ends.
        std::thread::spawn(move || {
            let mut sink = [0u8; 4096];
            let mut si = std::io::stdin();
            loop {
                match si.read(&mut sink) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    // Unreadable standard input ends like an empty one.
                    Err(_) => break,
                }
            }
            eof.store(true, Ordering::Relaxed);
        });
    }
    match client::run(&plan, &set, &stops) {
        Ok(code) => std::process::exit(code),
        Err(client::ClientError::Signal(s)) => {
            eprintln!("{me}: {}", client::ClientError::Signal(s));
            std::process::exit(128 + s as i32);
        }
        Err(e) => fail(&me, e),
    }
}
