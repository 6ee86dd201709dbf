//! `mc-hub`: runs a MEMORY CHANNEL hub, talks to a running hub's control
//! socket (`mc-hub ctl …`), or decodes a capture (`mc-hub pcap FILE`).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Parser, Subcommand};
use device::vfio_user::ConnectionConfig;
use hub::hub::{
    CaptureNext, CaptureReadError, CaptureReader, Control, ControlReply, Hub, HubConfig, DEST_TRAILER, PCAP_DATALINK,
};
use hub::local::LocalConfig;
use link::{self as link, Msg, MAX_NODES};

/// The MEMORY CHANNEL hub: one global order for every write of every node.
#[derive(Parser, Debug)]
#[command(
    name = "mc-hub",
    version,
    long_about = "The MEMORY CHANNEL hub: one global order for every write of every node.\n\n\
                  Adapters join it over link ports (mc-adapter processes, on a Unix socket or \
                  TCP with a shared secret), or it serves guests' adapters itself (--local: QEMU \
                  connects straight to the hub). Every write gets a global sequence number and \
                  reaches every receiving node in that order. `mc-hub ctl` talks to a running \
                  hub (counters, fault injection, captures); `mc-hub pcap` prints a capture.",
    args_conflicts_with_subcommands = true,
    after_help = "Examples:
  mc-hub --socket /run/mc/hub.sock --control /run/mc/hub.ctl
                       a hub for mc-adapter processes (link ports)
  mc-hub --socket /run/mc/hub.sock --control /run/mc/hub.ctl \\
         --local 0:node0:/run/mc/node0.sock --local 1:node1:/run/mc/node1.sock
                       two guests' adapters in the hub: QEMU connects to nodeN.sock
  mc-hub ctl --control /run/mc/hub.ctl stats
  mc-hub ctl --control /run/mc/hub.ctl link-down 1
  mc-hub pcap trace.pcap

mc-cluster starts a hub for each cluster (docs/hub.md).

Exit codes: 0 success (the hub itself runs until killed); 1 an error (the
message starts with \"mc-hub:\"); 2 a usage error; 141 when standard output
is a closed pipe."
)]
struct Args {
    /// Unix socket adapters connect to (created; a stale socket is replaced).
    #[arg(long, required = true)]
    socket: Option<PathBuf>,
    /// Also accept adapters over TCP at HOST:PORT (needs --secret-file).
    #[arg(long)]
    tcp: Option<String>,
    /// Write the TCP address actually bound (useful with port 0) to this file.
    #[arg(long, requires = "tcp")]
    tcp_addr_file: Option<PathBuf>,
    /// File holding the cluster secret TCP adapters must prove.
    #[arg(long)]
    secret_file: Option<PathBuf>,
    /// Control socket for `mc-hub ctl` (fault injection, counters).
    #[arg(long)]
    control: Option<PathBuf>,
    /// Number of ports (node ids 0..N). The original hub had 8.
    #[arg(long, default_value_t = 8)]
    max_nodes: usize,
    /// Frames queued per receiving node before senders are held back.
    #[arg(long, default_value_t = 4096)]
    queue_depth: usize,
    /// Seconds a receiver may keep its queue full before it is cut off as failed.
    #[arg(long, default_value_t = 10.0)]
    stall_timeout: f64,
    /// Link connections (Unix and TCP) that have not completed their Hello
    /// and authentication yet, at most; more are closed at once and counted
    /// (stats: unauthenticated_closed).
    #[arg(long, default_value_t = 64)]
    max_unauthenticated: usize,
    /// Seconds a new link connection has to send its Hello (and prove the
    /// secret on TCP) before it is closed.
    #[arg(long, default_value_t = 5.0)]
    auth_timeout: f64,
    /// Control connections open at once, at most; one more gets an error and is closed.
    #[arg(long, default_value_t = 16)]
    max_control: usize,
    /// Seconds a control connection may stay open without sending a request.
    #[arg(long, default_value_t = 60.0)]
    control_idle_timeout: f64,
    /// Write every ordered frame to this pcap file (see docs/hub.md).
    #[arg(long)]
    pcap: Option<PathBuf>,
    /// Serve a local guest's adapter: NODE:NAME:SOCKET (repeatable). QEMU's
    /// vfio-user-pci connects to SOCKET; the guest's stores reach the other
    /// local guests in one hop (see docs/hub.md, "Ports").
    #[arg(long = "local", value_name = "NODE:NAME:SOCKET")]
    locals: Vec<String>,
    /// MEMORY CHANNEL address space of local adapters, in MiB (power of two, 1 to 4096).
    #[arg(long, default_value_t = 512)]
    aspace_mib: u64,
    /// vfio-user `write_multiple` on local ports: `on` (QEMU's queued store
    /// path), `off` (the direct path) or `auto` (direct when QEMU's send
    /// buffer could be enlarged, which needs root). docs/adapter.md, "The
    /// store path", has the measurements.
    #[arg(long, default_value = "auto", value_name = "on|off|auto")]
    write_multiple: device::vfio_user::WriteMultiple,
    /// Interrupt capability of local adapters: `msix`, or `msi` for guests
    /// that unplug and replug the adapter (docs/adapter.md, "Surprise
    /// removal").
    #[arg(long, default_value = "msix", value_name = "msix|msi")]
    interrupts: device::pci::Interrupts,
    /// The hand-over of the process this one replaced (`ctl restart`;
    /// docs/hub.md, "Hub restart"). Set by the hub itself.
    #[arg(long = "resume-fd", hide = true)]
    resume_fd: Option<i32>,
    #[command(subcommand)]
    cmd: Option<Cmd>,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Send a control request to a running hub.
    Ctl {
        /// The hub's control socket.
        #[arg(long)]
        control: PathBuf,
        #[command(subcommand)]
        req: Control,
    },
    /// Follow an adapter's register trace, decoded, live.
    ///
    /// Every access its guest makes (docs/adapter.md, "Testing a driver").
    Trace {
        /// The trace socket: the adapter's vfio-user socket with `.trace`
        /// appended (a `--local` port's or `mc-adapter --socket`'s).
        #[arg(long)]
        socket: PathBuf,
        #[command(flatten)]
        filter: device::trace_socket::FilterArgs,
    },
    /// Print the frames of a capture made with --pcap, one per line.
    Pcap {
        /// The capture file.
        file: PathBuf,
    },
}

/// Parses `NODE:NAME:SOCKET`.
fn parse_local(s: &str) -> anyhow::Result<(u16, String, PathBuf)> {
    let mut it = s.splitn(3, ':');
    let (Some(n), Some(name), Some(path)) = (it.next(), it.next(), it.next()) else {
        anyhow::bail!("--local '{s}' is not NODE:NAME:SOCKET");
    };
    let node = n.parse::<u16>().map_err(|_| anyhow::anyhow!("--local '{s}': '{n}' is not a node id"))?;
    if path.is_empty() {
        anyhow::bail!("--local '{s}': empty socket path");
    }
    Ok((node, name.to_string(), PathBuf::from(path)))
}

fn ctl(control: PathBuf, c: Control) -> anyhow::Result<()> {
    let mut s = UnixStream::connect(&control)
        .map_err(|e| anyhow::anyhow!("cannot reach the hub at {}: {e}", control.display()))?;
    let mut line = serde_json::to_vec(&c)?;
    line.push(b'\n');
    s.write_all(&line)?;
    let mut reply = String::new();
    BufReader::new(s).read_line(&mut reply)?;
    match serde_json::from_str::<ControlReply>(&reply)? {
        ControlReply::Error { message } => anyhow::bail!("{message}"),
        ControlReply::Ok => writeln!(std::io::stdout(), "ok")?,
        stats => writeln!(std::io::stdout(), "{}", serde_json::to_string_pretty(&stats)?)?,
    }
    Ok(())
}

/// Decodes a capture: one line per frame.
fn pcap(file: &Path) -> anyhow::Result<()> {
    let mut capture = CaptureReader::open(file).map_err(|e| match e {
        CaptureReadError::Open(e) => anyhow::anyhow!("{}: {e}", file.display()),
        CaptureReadError::NotPcap(e) => {
            anyhow::anyhow!("{}: not a MEMORY CHANNEL capture (not a pcap file: {e})", file.display())
        }
        CaptureReadError::LinkType(_) => {
            anyhow::anyhow!("{}: not a MEMORY CHANNEL capture (pcap, link type {PCAP_DATALINK:?})", file.display())
        }
    })?;
    let out = std::io::stdout();
    let mut out = out.lock();
    loop {
        let (timestamp, data) = match capture.next_record() {
            CaptureNext::Record { time, data } => (time, data),
            CaptureNext::End => break,
            CaptureNext::Incomplete => {
                eprintln!(
                    "mc-hub: {}: the last record is incomplete (still being written, or cut short)",
                    file.display()
                );
                break;
            }
            CaptureNext::Corrupt(e) => anyhow::bail!("{}: corrupt record ({e})", file.display()),
        };
        let frame = &data[..];
        let len = frame.len();
        if !(link::HEADER_LEN..=link::HEADER_LEN + link::MAX_PAYLOAD + DEST_TRAILER).contains(&len) {
            anyhow::bail!("{}: corrupt record ({len} bytes)", file.display());
        }
        let (secs, usecs) = (timestamp.as_secs(), timestamp.subsec_micros());
        let hdr = link::Header::parse(frame[..link::HEADER_LEN].try_into().unwrap())?;
        // The frame, then (after a Deliver) the destination trailer.
        let (payload, trailer) = frame[link::HEADER_LEN..].split_at(hdr.len.min(len - link::HEADER_LEN));
        let what = match Msg::parse(&hdr, payload) {
            Ok(Msg::Deliver { seq, src, flags, addr, data }) => {
                let head: Vec<String> = data.iter().take(8).map(|b| format!("{b:02x}")).collect();
                let to = match trailer {
                    [a, b] if u16::from_le_bytes([*a, *b]) == link::BROADCAST => "all".to_string(),
                    [a, b] => u16::from_le_bytes([*a, *b]).to_string(),
                    _ => "?".to_string(),
                };
                format!(
                    "seq {seq:<8} write  src {src:<3} to {to:<3} flags {flags:#x} addr {addr:#010x} len {:<5} {}",
                    data.len(),
                    head.join("")
                )
            }
            Ok(Msg::Member { seq, node, up }) => {
                format!("seq {seq:<8} member node {node} {}", if up { "up" } else { "down" })
            }
            Ok(other) => format!("{other:?}"),
            Err(e) => format!("undecodable: {e}"),
        };
        writeln!(out, "{secs}.{usecs:06} {what}")?;
    }
    Ok(())
}

fn main() {
    device::fatal::abort_on_panic();
    if let Err(e) = run() {
        if e.downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) {
            // Nobody reads our output (`mc-hub pcap FILE | head`): 128 +
            // SIGPIPE, as a shell reports it.
            std::process::exit(141);
        }
        eprintln!("mc-hub: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> anyhow::Result<()> {
    // What a restart in place execs again.
    let exe = std::env::current_exe();
    let argv: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let args = Args::parse();
    match args.cmd {
        Some(Cmd::Ctl { control, req }) => return ctl(control, req),
        Some(Cmd::Pcap { file }) => return pcap(&file),
        Some(Cmd::Trace { socket, filter }) => {
            let (f, json) = filter.filter().map_err(anyhow::Error::msg)?;
            return Ok(device::trace_socket::follow(&socket, &f, json, &mut std::io::stdout())?);
        }
        None => {}
    }
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("MC_LOG").unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let socket = args.socket.expect("clap requires --socket");
    if args.max_nodes == 0 || args.max_nodes > MAX_NODES {
        anyhow::bail!("--max-nodes must be between 1 and {MAX_NODES}, not {}", args.max_nodes);
    }
    let secs = |v: f64, flag: &str| {
        if v > 0.0 && v.is_finite() && v < 1e9 {
            Ok(Duration::from_secs_f64(v))
        } else {
            Err(anyhow::anyhow!("--{flag} must be a positive number of seconds"))
        }
    };
    let stall_timeout = secs(args.stall_timeout, "stall-timeout")?;
    let auth_timeout = secs(args.auth_timeout, "auth-timeout")?;
    let control_idle_timeout = secs(args.control_idle_timeout, "control-idle-timeout")?;
    if args.max_unauthenticated == 0 || args.max_control == 0 {
        anyhow::bail!("--max-unauthenticated and --max-control must be at least 1");
    }
    let secret = match &args.secret_file {
        Some(p) => {
            let s =
                std::fs::read(p).map_err(|e| anyhow::anyhow!("cannot read the secret file {}: {e}", p.display()))?;
            let s = s.trim_ascii().to_vec();
            if s.len() < 16 {
                anyhow::bail!("the cluster secret in {} is shorter than 16 bytes", p.display());
            }
            Some(s)
        }
        None => None,
    };
    if args.tcp.is_some() && secret.is_none() {
        anyhow::bail!("--tcp needs --secret-file: adapters on other hosts must prove the cluster secret");
    }
    for p in [Some(&socket), args.control.as_ref()].into_iter().flatten() {
        if p.exists() {
            std::fs::remove_file(p)?;
        }
    }
    let locals = args.locals.iter().map(|s| parse_local(s)).collect::<anyhow::Result<Vec<_>>>()?;
    // A restart in place: the ports the previous process handed over are
    // served again with their QEMUs' connections; nothing else is kept.
    let handover = match args.resume_fd {
        None => None,
        Some(fd) => {
            Some(hub::restart::Handover::read(fd).map_err(|e| anyhow::anyhow!("restart in place: {e}"))?.into_ports())
        }
    };
    let resumed: Vec<u16> = handover.as_ref().map(|(ok, _)| ok.iter().map(|p| p.node).collect()).unwrap_or_default();
    let aspace = args.aspace_mib.checked_shl(20).filter(|_| args.aspace_mib <= 4096).unwrap_or(0);
    let cfg = HubConfig {
        max_nodes: args.max_nodes,
        queue_depth: args.queue_depth,
        stall_timeout,
        secret,
        max_unauthenticated: args.max_unauthenticated,
        auth_timeout,
        max_control: args.max_control,
        control_idle_timeout,
    };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async {
        let listener = tokio::net::UnixListener::bind(&socket)
            .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", socket.display()))?;
        let hub = Hub::new(cfg);
        if let Some(p) = &args.pcap {
            hub.capture_to(p).map_err(|e| anyhow::anyhow!("cannot write the capture {}: {e}", p.display()))?;
        }
        if let Some((ports, failed)) = handover {
            for (node, e) in failed {
                tracing::error!(node, "not resumed after the restart: {e}");
            }
            let nodes: Vec<u16> = ports.iter().map(|p| p.node).collect();
            for (node, e) in hub.resume_locals(ports, tokio::runtime::Handle::current()) {
                tracing::error!(node, "not resumed after the restart: {e}");
            }
            tracing::info!(?nodes, "local ports resumed after a restart in place");
        }
        for (node, name, path) in &locals {
            if resumed.contains(node) {
                continue;
            }
            if path.exists() {
                std::fs::remove_file(path)?;
            }
            let l = std::os::unix::net::UnixListener::bind(path)
                .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", path.display()))?;
            let lc = LocalConfig {
                node: *node,
                name: name.clone(),
                aspace,
                interrupts: args.interrupts,
                vfio: ConnectionConfig { write_multiple: args.write_multiple },
            };
            hub.add_local(lc, l, tokio::runtime::Handle::current()).map_err(|e| anyhow::anyhow!("--local: {e}"))?;
            tracing::info!(node, name, socket = %path.display(), "local port serving vfio-user");
        }
        // Each local adapter's register trace, next to its vfio-user socket.
        for (node, _, path) in &locals {
            if let Some(t) = hub.local_tracer(*node) {
                device::trace_socket::bind_and_serve(path, t)?;
            }
        }
        if let Some(c) = &args.control {
            let cl = tokio::net::UnixListener::bind(c)
                .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", c.display()))?;
            let h = hub.clone();
            tokio::spawn(async move { h.serve_control(cl, std::future::pending()).await });
        }
        if let Some(addr) = &args.tcp {
            let tl = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| anyhow::anyhow!("cannot listen on tcp:{addr}: {e}"))?;
            let bound = tl.local_addr()?;
            tracing::info!(addr = %bound, "hub listening on TCP");
            if let Some(f) = &args.tcp_addr_file {
                let tmp = f.with_extension("tmp");
                std::fs::write(&tmp, bound.to_string())?;
                std::fs::rename(&tmp, f)?;
            }
            let h = hub.clone();
            tokio::spawn(async move {
                if let Err(e) = h.serve_tcp(tl, std::future::pending()).await {
                    tracing::error!("TCP listener: {e}");
                }
            });
        }
        tracing::info!(socket = %socket.display(), max_nodes = args.max_nodes, "hub listening");
        if let Ok(exe) = &exe {
            hub.enable_restart();
            tracing::debug!(exe = %exe.display(), "restart in place available");
        }
        let restart = std::sync::atomic::AtomicBool::new(false);
        let shutdown = async {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {},
                _ = term.recv() => {},
                _ = hub.restart_requested() => restart.store(true, std::sync::atomic::Ordering::SeqCst),
            }
        };
        hub.serve(listener, shutdown).await?;
        if restart.load(std::sync::atomic::Ordering::SeqCst) {
            let exe = exe.as_ref().map_err(|e| anyhow::anyhow!("restart in place: no binary to exec: {e}"))?;
            let t0 = std::time::Instant::now();
            let h = hub.hand_over();
            tracing::info!(ports = ?h.nodes(), took = ?t0.elapsed(), "local ports parked and frozen");
            let e = h.exec(exe, &argv);
            anyhow::bail!("restart in place failed: {e}");
        }
        Ok::<_, anyhow::Error>(())
    })?;
    let _ = std::fs::remove_file(&socket);
    for (_, _, p) in &locals {
        let _ = std::fs::remove_file(p);
        let _ = std::fs::remove_file(device::trace_socket::socket_for(p));
    }
    if let Some(c) = &args.control {
        let _ = std::fs::remove_file(c);
    }
    Ok(())
}
