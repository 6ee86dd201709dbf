//! `mc-adapter`: one emulated MEMORY CHANNEL adapter, served over vfio-user.

use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use device::adapter::{Adapter, AdapterConfig};
use device::link_client::HubAddr;
use device::vfio_user;
use link::ANY_NODE;

/// A MEMORY CHANNEL for PCI adapter for one QEMU guest.
#[derive(Parser, Debug)]
#[command(
    name = "mc-adapter",
    version,
    long_about = "A MEMORY CHANNEL for PCI adapter for one QEMU guest.\n\n\
                  Serves the adapter model (PCI 1011:0018: registers, page control table, \
                  transmit window, receive DMA into guest memory) over vfio-user to QEMU's \
                  vfio-user-pci device, and joins a hub (mc-hub) over the link protocol, on a \
                  Unix socket or over TCP with a shared secret. Runs until QEMU disconnects or \
                  the hub goes away.",
    after_help = "Examples:
  mc-adapter --socket /run/mc/node0-adapter.sock --hub /run/mc/hub.sock --name node0
                       then QEMU: -device '{\"driver\":\"vfio-user-pci\",
                       \"socket\":{\"type\":\"unix\",\"path\":\"/run/mc/node0-adapter.sock\"}}'
  mc-adapter --socket /run/mc/a.sock --hub tcp:10.0.0.1:7400 --secret-file /etc/mc/secret

mc-cluster starts one per guest with [cluster] adapters = \"per-guest\" (docs/adapter.md).

Exit codes: 0 when QEMU closes the connection; 1 an error (the message starts with
\"mc-adapter:\"); 2 a usage error."
)]
struct Args {
    /// vfio-user socket QEMU connects to (created; a stale one is replaced).
    #[arg(long)]
    socket: PathBuf,
    /// Hub to join: a Unix socket path (or unix:PATH), or tcp:HOST:PORT.
    #[arg(long)]
    hub: String,
    /// File holding the cluster secret (required for a TCP hub).
    #[arg(long)]
    secret_file: Option<PathBuf>,
    /// Node id to ask the hub for [default: any free port].
    #[arg(long)]
    node: Option<u16>,
    /// Name announced to the hub.
    #[arg(long, default_value = "adapter")]
    name: String,
    /// MEMORY CHANNEL address space in MiB (power of two, 1 to 4096).
    #[arg(long, default_value_t = 512)]
    aspace_mib: u64,
    /// Interrupt capability: `msix`, or `msi` for a guest that unplugs and
    /// replugs the adapter (docs/adapter.md, "Surprise removal").
    #[arg(long, default_value = "msix", value_name = "msix|msi")]
    interrupts: device::pci::Interrupts,
    /// Seconds to keep trying to reach the hub at start.
    #[arg(long, default_value_t = 10)]
    hub_wait: u64,
    /// vfio-user `write_multiple`: `on` (QEMU's queued store path), `off`
    /// (the direct path) or `auto` (direct when QEMU's send buffer could be
    /// enlarged, which needs root). docs/adapter.md, "The store path", has
    /// the measurements.
    #[arg(long, default_value = "auto", value_name = "on|off|auto")]
    write_multiple: device::vfio_user::WriteMultiple,
}

fn main() {
    device::fatal::abort_on_panic();
    if let Err(e) = run() {
        eprintln!("mc-adapter: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("MC_LOG").unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = Args::parse();
    let hub = HubAddr::parse(&args.hub).map_err(|e| anyhow::anyhow!("--hub: {e}"))?;
    let secret = match &args.secret_file {
        Some(p) => Some(
            std::fs::read(p)
                .map_err(|e| anyhow::anyhow!("cannot read the secret file {}: {e}", p.display()))?
                .trim_ascii()
                .to_vec(),
        ),
        None => None,
    };
    if matches!(hub, HubAddr::Tcp(_)) && secret.is_none() {
        anyhow::bail!("a TCP hub needs the cluster secret: add --secret-file");
    }
    let cfg = AdapterConfig {
        aspace: args.aspace_mib << 20,
        hub,
        secret,
        want_node: args.node.unwrap_or(ANY_NODE),
        name: args.name,
        hub_wait: Duration::from_secs(args.hub_wait),
    };
    let mut adapter = Adapter::new(cfg.aspace)?;
    adapter.set_interrupts(args.interrupts);
    adapter.connect(&cfg)?;
    if args.socket.exists() {
        std::fs::remove_file(&args.socket)?;
    }
    let listener = UnixListener::bind(&args.socket)
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", args.socket.display()))?;
    tracing::info!(socket = %args.socket.display(), "vfio-user server listening");
    let trace = device::trace_socket::bind_and_serve(&args.socket, adapter.tracer())?;
    tracing::info!(socket = %trace.display(), "register trace socket");
    let vfio = vfio_user::ConnectionConfig { write_multiple: args.write_multiple };
    vfio_user::serve_with(&listener, &mut adapter, &vfio)?;
    Ok(())
}
