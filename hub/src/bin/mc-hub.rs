//! `mc-hub`: runs a MEMORY CHANNEL hub on a Unix socket, or talks to a
//! running hub's control socket (`mc-hub ctl …`).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use mc_hub::hub::{Control, ControlReply, Hub, HubConfig};
use mc_hub::link::MAX_NODES;

/// The MEMORY CHANNEL hub: one global order for every write of every node.
#[derive(Parser, Debug)]
#[command(version, args_conflicts_with_subcommands = true)]
struct Args {
    /// Unix socket adapters connect to (created; a stale socket is replaced).
    #[arg(long, required = true)]
    socket: Option<PathBuf>,
    /// Control socket for `mc-hub ctl` (fault injection, counters).
    #[arg(long)]
    control: Option<PathBuf>,
    /// Number of ports (node ids 0..N). The original hub had 8.
    #[arg(long, default_value_t = 8)]
    max_nodes: usize,
    /// Frames queued per receiving node before senders are held back.
    #[arg(long, default_value_t = 4096)]
    queue_depth: usize,
    #[command(subcommand)]
    ctl: Option<Ctl>,
}

#[derive(Subcommand, Debug)]
enum Ctl {
    /// Send a control request to a running hub.
    Ctl {
        /// The hub's control socket.
        #[arg(long)]
        control: PathBuf,
        #[command(subcommand)]
        req: Req,
    },
}

#[derive(Subcommand, Debug)]
enum Req {
    /// Per-node packet counters and queue depths (JSON).
    Stats,
    /// Take NODE's link down and keep it down until link-up.
    LinkDown {
        /// Node id.
        node: u16,
    },
    /// Let NODE rejoin.
    LinkUp {
        /// Node id.
        node: u16,
    },
    /// Corrupt the next COUNT packets to NODE (its adapter counts CRC errors).
    Corrupt {
        /// Node id.
        node: u16,
        /// Packets.
        #[arg(default_value_t = 1)]
        count: u32,
    },
}

fn ctl(control: PathBuf, req: Req) -> anyhow::Result<()> {
    let c = match req {
        Req::Stats => Control::Stats,
        Req::LinkDown { node } => Control::LinkDown { node },
        Req::LinkUp { node } => Control::LinkUp { node },
        Req::Corrupt { node, count } => Control::Corrupt { node, count },
    };
    let mut s = UnixStream::connect(&control)
        .map_err(|e| anyhow::anyhow!("cannot reach the hub at {}: {e}", control.display()))?;
    let mut line = serde_json::to_vec(&c)?;
    line.push(b'\n');
    s.write_all(&line)?;
    let mut reply = String::new();
    BufReader::new(s).read_line(&mut reply)?;
    match serde_json::from_str::<ControlReply>(&reply)? {
        ControlReply::Error { message } => anyhow::bail!("{message}"),
        ControlReply::Ok => println!("ok"),
        stats => println!("{}", serde_json::to_string_pretty(&stats)?),
    }
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("mc-hub: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(Ctl::Ctl { control, req }) = args.ctl {
        return ctl(control, req);
    }
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("MC_LOG").unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    let socket = args.socket.expect("clap requires --socket");
    if args.max_nodes == 0 || args.max_nodes > MAX_NODES {
        anyhow::bail!("--max-nodes must be between 1 and {MAX_NODES}, not {}", args.max_nodes);
    }
    for p in [Some(&socket), args.control.as_ref()].into_iter().flatten() {
        if p.exists() {
            std::fs::remove_file(p)?;
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async {
        let listener = tokio::net::UnixListener::bind(&socket)
            .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", socket.display()))?;
        let hub = Hub::new(HubConfig { max_nodes: args.max_nodes, queue_depth: args.queue_depth });
        if let Some(c) = &args.control {
            let cl = tokio::net::UnixListener::bind(c)
                .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", c.display()))?;
            let h = hub.clone();
            tokio::spawn(async move { h.serve_control(cl, std::future::pending()).await });
        }
        tracing::info!(socket = %socket.display(), max_nodes = args.max_nodes, "hub listening");
        let shutdown = async {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
            tokio::select! { _ = tokio::signal::ctrl_c() => {}, _ = term.recv() => {} }
        };
        hub.serve(listener, shutdown).await?;
        Ok::<_, anyhow::Error>(())
    })?;
    let _ = std::fs::remove_file(&socket);
    if let Some(c) = &args.control {
        let _ = std::fs::remove_file(c);
    }
    Ok(())
}
