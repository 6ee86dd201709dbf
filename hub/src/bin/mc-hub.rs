//! `mc-hub`: runs a MEMORY CHANNEL hub on a Unix socket.

use std::path::PathBuf;

use clap::Parser;
use mc_hub::hub::{serve, HubConfig};
use mc_hub::link::MAX_NODES;

/// The MEMORY CHANNEL hub: one global order for every write of every node.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Unix socket to listen on (created; an existing stale socket is replaced).
    #[arg(long)]
    socket: PathBuf,
    /// Number of ports (node ids 0..N). The original hub had 8.
    #[arg(long, default_value_t = 8)]
    max_nodes: usize,
    /// Frames queued per receiving node before senders are held back.
    #[arg(long, default_value_t = 4096)]
    queue_depth: usize,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("MC_LOG").unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    if args.max_nodes == 0 || args.max_nodes > MAX_NODES {
        anyhow::bail!("--max-nodes must be between 1 and {MAX_NODES}, not {}", args.max_nodes);
    }
    if args.socket.exists() {
        std::fs::remove_file(&args.socket)?;
    }
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async {
        let listener = tokio::net::UnixListener::bind(&args.socket)
            .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", args.socket.display()))?;
        tracing::info!(socket = %args.socket.display(), max_nodes = args.max_nodes, "hub listening");
        let shutdown = async {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
            tokio::select! { _ = tokio::signal::ctrl_c() => {}, _ = term.recv() => {} }
        };
        serve(listener, HubConfig { max_nodes: args.max_nodes, queue_depth: args.queue_depth }, shutdown).await?;
        Ok::<_, anyhow::Error>(())
    })?;
    let _ = std::fs::remove_file(&args.socket);
    Ok(())
}
