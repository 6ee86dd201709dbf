//! `mc-cluster`: up, exec, cp, mpirun, status, down for a virtual MEMORY CHANNEL cluster.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use launcher::config::Paths;
use launcher::config::GUEST_SHARE;
use launcher::supervisor::{self, State, Status};
use launcher::{agent, cp, down_dir, exec, hub_ctl, mpirun, pid_alive as alive, restart, up, MpirunOptions, UpOptions};

/// `println!` that ends the program quietly with 141 (as a shell reports
/// SIGPIPE) when standard output is a closed pipe (`status | head -1`).
macro_rules! outln {
    ($($t:tt)*) => {
        out!("{}\n", format_args!($($t)*))
    };
}

/// `print!`, as [`outln!`].
macro_rules! out {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let r = write!(std::io::stdout(), $($t)*).and_then(|()| std::io::stdout().flush());
        quiet_on_broken_pipe(r);
    }};
}

/// Ctrl-C (SIGINT), SIGTERM or SIGHUP end this process, and with it the
/// agent connection, which ends the job in the guests. Handled explicitly:
/// a process started in the background by a shell inherits SIGINT
/// ignored, and `mpirun` must end on it all the same.
fn end_on_signals() -> Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])?;
    std::thread::spawn(move || {
        if let Some(sig) = signals.forever().next() {
            eprintln!("mc-cluster: signal {sig}: ending the job");
            std::process::exit(128 + sig);
        }
    });
    Ok(())
}

fn quiet_on_broken_pipe(r: std::io::Result<()>) {
    if let Err(e) = r {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(141);
        }
    }
}

#[derive(Parser)]
#[command(
    name = "mc-cluster",
    version,
    about = "Run a virtual MEMORY CHANNEL cluster of QEMU guests",
    long_about = "Run a virtual MEMORY CHANNEL cluster of QEMU guests.\n\n\
                  `up` starts a hub, the adapters and one QEMU per guest (qemu-configs/default.toml, \
                  or --config FILE) and a supervisor that keeps them running; the other commands \
                  work on a cluster that is up: run commands and MPI or PVM programs in the guests, \
                  copy files, talk to the hub, restart a node, stop it all. Logs, sockets and the \
                  shared folder are in .run/NAME/ (README, \"Troubleshooting\").",
    after_help = "Examples:
  mc-cluster up --nodes 4                      boot 4 guests (qemu-configs/default.toml)
  mc-cluster exec 0 -- mctool info             run a command in guest 0
  mc-cluster cp a.out 1:/tmp/                  copy a file into guest 1
  mc-cluster --name m up --config qemu-configs/mpi.toml
  mc-cluster --name m mpirun -n 4 /share/prog  an MPI job on every guest
  mc-cluster --name m pvm master1              a PVM program (share/pvm/bin/LINUX64)
  mc-cluster down

Exit codes: 0 success; 1 an error (the message starts with \"mc-cluster:\");
2 a usage error; exec, mpirun and pvm return the command's own code; status
returns 3 when the cluster is not running; 141 when standard output is a
closed pipe."
)]
struct Cli {
    /// Cluster name: several clusters can run side by side.
    #[arg(long, global = true, default_value = "default")]
    name: String,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start the hub, the adapters and the guests; return when every guest answers.
    ///
    /// A host folder is shared read-write into every guest at /share
    /// (virtio-9p): --share DIR, else `[guest] share` in the config, else
    /// the run folder's share/ (.run/NAME/share, kept from one `up` to the
    /// next). Files the guests write there are plain files of the host.
    Up {
        /// Number of nodes [default: from the config].
        #[arg(long)]
        nodes: Option<usize>,
        /// Cluster definition [default: qemu-configs/default.toml].
        #[arg(long)]
        config: Option<PathBuf>,
        /// Where the adapters run, overriding the config: in-hub (local
        /// ports of the hub, one hop per store) or per-guest (one mc-adapter
        /// process per guest).
        #[arg(long, value_parser = ["in-hub", "per-guest"])]
        adapters: Option<String>,
        /// Host folder to share into every guest at /share (created if missing).
        #[arg(long, value_name = "DIR")]
        share: Option<PathBuf>,
    },
    /// Run a command in a guest.
    ///
    /// Its output is printed as it comes, this command's standard input is
    /// its standard input, and the exit code is its exit code.
    Exec {
        /// Node id.
        node: usize,
        /// Kill the command after this many seconds (0: no limit).
        #[arg(long, default_value_t = 300)]
        timeout: u64,
        /// Give the command /dev/null as standard input instead of ours
        /// (for loops that read their own standard input).
        #[arg(short = 'n', long)]
        no_stdin: bool,
        /// The command and its arguments (after --).
        #[arg(last = true, required = true)]
        argv: Vec<String>,
    },
    /// Copy a file between the host and a guest.
    ///
    /// Byte for byte and with its permission bits: `cp FILE NODE:/PATH` or
    /// `cp NODE:/PATH FILE`. A folder as the destination keeps the file's
    /// name.
    Cp {
        /// Source: a host file or NODE:/PATH.
        src: String,
        /// Destination: NODE:/PATH or a host path.
        dst: String,
    },
    /// Run an MPI program on every guest.
    ///
    /// `mpiexec` runs in guest 0 with every node as a host (node0,node1,...),
    /// its output streamed here, its exit code ours (0, or the first failing
    /// rank's). PROG is a path inside the guests: put programs in the shared
    /// folder (the host's .run/NAME/share is /share in every guest). Ending
    /// this command (Ctrl-C) ends the job.
    Mpirun {
        /// Number of ranks.
        #[arg(short = 'n', long = "np", value_parser = clap::value_parser!(u32).range(1..=65536))]
        n: u32,
        /// Ranks per node, block-wise [default: spread evenly, in blocks].
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        ppn: Option<u32>,
        /// Set NAME=VALUE for every rank (repeatable). `MPIEXEC_TRACE=1`
        /// also makes mpiexec print each phase of the start-up.
        #[arg(long = "env", value_name = "NAME=VALUE")]
        env: Vec<String>,
        /// Kill the job after this many seconds (0: no limit).
        #[arg(long, default_value_t = 0)]
        timeout: u64,
        /// The program (a path inside the guests) and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "PROG [ARGS]")]
        argv: Vec<String>,
    },
    /// Run a PVM program in guest 0, with every task's output.
    ///
    /// The program starts in guest 0 on our PVM (`PVM_ROOT=/share/pvm`: put
    /// programs in the host's .run/NAME/share/pvm/bin/LINUX64, where PVM
    /// looks for spawned ones; a PROG without `/` is found there). Every
    /// task it spawns, on any guest, has its output streamed here, each
    /// line after the task's TID, as PVM's catchout; standard input goes
    /// to the program; the exit code is the program's.
    Pvm {
        /// Set NAME=VALUE for the program (repeatable; spawned tasks
        /// inherit PVM's own variables).
        #[arg(long = "env", value_name = "NAME=VALUE")]
        env: Vec<String>,
        /// Kill the program after this many seconds (0: no limit).
        #[arg(long, default_value_t = 0)]
        timeout: u64,
        /// The program and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "PROG [ARGS]")]
        argv: Vec<String>,
    },
    /// Show the cluster's processes and whether each guest answers.
    Status,
    /// Talk to the hub: counters, faults, or a restart.
    ///
    /// `hub -- stats`, `hub -- link-down NODE`, `link-up NODE`, `corrupt
    /// NODE [COUNT]`, `delay NODE MICROS`, `fault NODE KIND`; or `hub
    /// restart`: a new hub with the same arguments (in-hub mode, the
    /// default, restarts it in place and the guests keep running;
    /// per-guest, the adapters rejoin).
    Hub {
        /// `restart`, or nothing (then a request after --).
        action: Option<String>,
        /// The request and its arguments (after --), as for `mc-hub ctl`.
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Take a node's adapter out of its running guest (surprise removal).
    ///
    /// QMP `device_del` on the adapter's hot-pluggable slot (`[guest]
    /// hotplug = true`); returns once the guest let it go (imcd ends, the
    /// processes holding its files let go) and QEMU removed it, or fails
    /// after 60 s. The others see the node leave (docs/adapter.md,
    /// "Surprise removal").
    Unplug {
        /// The node.
        node: usize,
    },
    /// Plug a node's adapter back into its running guest (QMP `device_add`).
    ///
    /// The guest finds a new adapter; imcd takes it and joins the cluster
    /// again as a restarted node. Returns once imcd serves again (without
    /// imcd: once the guest lists the device), or fails after 60 s.
    Plug {
        /// The node.
        node: usize,
    },
    /// Run the driver conformance suite against a driver in a guest.
    ///
    /// Runs `DRIVER SCENARIO [ARGS]` on the node once per scenario (reset,
    /// errors, link, fifo, dma, removal), does what each scenario does to
    /// the adapter from the host, and checks what the driver printed and
    /// the adapter's register trace (docs/adapter.md, "The conformance
    /// suite"). On a cluster of qemu-configs/conformance.toml. Exit code 0
    /// when every scenario passed.
    Conform {
        /// The driver: a command in the guest that takes a scenario
        /// (`mctool conform`, or `/share/conform` for a program of yours).
        #[arg(long)]
        driver: String,
        /// The node whose adapter it drives.
        #[arg(long, default_value_t = 1)]
        node: usize,
        /// Only these scenarios (comma-separated).
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
        /// One JSON object a scenario.
        #[arg(long)]
        json: bool,
    },
    /// Follow a node's register trace, decoded, live.
    ///
    /// Every access the guest makes to its adapter, with registers and bits
    /// by name (docs/adapter.md, "Testing a driver").
    Trace {
        /// The node.
        node: usize,
        /// Only these kinds (comma-separated): reg, pct, tx, dma_map,
        /// dma_unmap, irq, irq_mask, dma_desc, dma_done, reset.
        #[arg(long)]
        kind: Option<String>,
        /// Only these registers, by name (comma-separated: CTRL,INT_MASK).
        #[arg(long)]
        reg: Option<String>,
        /// Only pages FIRST-LAST (or one page) for PCT, transmit and DMA events.
        #[arg(long, value_name = "FIRST[-LAST]")]
        pages: Option<String>,
        /// Only reads (`r`) or only writes (`w`).
        #[arg(long, value_name = "r|w")]
        dir: Option<String>,
        /// One JSON object a line.
        #[arg(long)]
        json: bool,
    },
    /// Serve a live page of the cluster on 127.0.0.1 (prints its address).
    ///
    /// The page shows every node's link, writes and bytes per second,
    /// deliveries, errors and drops; the global sequence number and its
    /// rate; joins, leaves and faults as a timeline; which pages are
    /// written, by whom, how often; imcd's region directory; the hub's
    /// ordering step times. Buttons take a link down or up, corrupt frames
    /// or delay them. The address carries a random token: requests without
    /// it are refused (403). Runs until interrupted.
    Monitor {
        /// Port on 127.0.0.1 (0: a free one).
        #[arg(long, default_value_t = 0)]
        port: u16,
        /// Milliseconds between samples of the hub.
        #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(50..=60000))]
        interval_ms: u64,
    },
    /// Record every ordered frame to a pcap file, or stop recording.
    ///
    /// `capture start FILE` makes the hub write every write and membership
    /// event it orders from now on to FILE (created or truncated; a capture
    /// already running stops); `capture stop` ends it. Read the file with
    /// `mc-trace FILE` or Wireshark (`hub/wireshark/mc.lua`, docs/hub.md).
    /// A hub restart ends a capture.
    Capture {
        /// `start` or `stop`.
        #[arg(value_parser = ["start", "stop"])]
        action: String,
        /// The capture file (for start).
        file: Option<PathBuf>,
    },
    /// Restart one node (its guest reboots).
    ///
    /// Its QEMU (and, per-guest, its adapter) are stopped and started again;
    /// returns when its agent answers. imcd joins the running cluster.
    Restart {
        /// Node id.
        node: usize,
    },
    /// Stop everything and remove the sockets.
    Down,
    /// (internal) The background process that owns a cluster.
    #[command(hide = true)]
    Supervise {
        #[arg(long)]
        run_dir: PathBuf,
    },
}

fn status(paths: &Paths, name: &str) -> Result<i32> {
    let rd = paths.run_dir(name);
    let Ok(st) = State::load(&rd) else {
        outln!("cluster '{name}': not running");
        return Ok(3);
    };
    let up = st.status == Status::Up && alive(st.supervisor_pid);
    outln!(
        "cluster '{name}': {} ({} nodes, {}, supervisor pid {})",
        if up { "up".to_string() } else { format!("{:?}", st.status).to_lowercase() },
        st.nodes.len(),
        st.accel,
        st.supervisor_pid
    );
    if !up {
        return Ok(3);
    }
    let hub = match (&st.hub_exit, alive(st.hub_pid)) {
        (_, true) => "running".to_string(),
        (Some(how), false) => format!("exited ({how})"),
        (None, false) => "gone".to_string(),
    };
    let restarts = if st.hub_restarts > 0 { format!(", restarted {} time(s)", st.hub_restarts) } else { String::new() };
    outln!("  hub      pid {:<8} {hub}{restarts}", st.hub_pid);
    outln!("  share    {} is {GUEST_SHARE} in every guest", st.share.display());
    let mut all = true;
    for (n, ns) in st.nodes.iter().enumerate() {
        let agent = match agent::ping(&supervisor::agent_sock(&rd, n), Duration::from_secs(2)) {
            Ok(u) => format!("agent answers (uptime {u:.0} s)"),
            Err(_) => {
                all = false;
                "agent does not answer".into()
            }
        };
        let q = match &ns.qemu_exit {
            Some(how) => format!("qemu pid {} exited ({how})", ns.qemu_pid),
            None if alive(ns.qemu_pid) => format!("qemu pid {}", ns.qemu_pid),
            None => format!("qemu pid {} gone", ns.qemu_pid),
        };
        let a = match &ns.adapter_exit {
            Some(how) => format!("adapter pid {} exited ({how})", ns.adapter_pid),
            None if alive(ns.adapter_pid) => format!("adapter pid {}", ns.adapter_pid),
            None => format!("adapter pid {} gone", ns.adapter_pid),
        };
        let r = if ns.restarts > 0 { format!(", restarted {} time(s)", ns.restarts) } else { String::new() };
        outln!("  node {n:<3} {q}, {a}, {agent}{r}");
    }
    Ok(if all { 0 } else { 1 })
}

fn run() -> Result<i32> {
    let cli = Cli::parse();
    if let Cmd::Supervise { run_dir } = &cli.cmd {
        supervisor::run(run_dir)?;
        return Ok(0);
    }
    let paths = Paths::discover()?;
    match cli.cmd {
        Cmd::Up { nodes, config, adapters, share } => {
            let st = up(&paths, &UpOptions { name: cli.name.clone(), nodes, config, adapters, share })?;
            outln!("cluster '{}' is up: {} nodes ({})", cli.name, st.nodes.len(), st.accel);
            Ok(0)
        }
        Cmd::Exec { node, timeout, no_stdin, argv } => {
            let stdin: Option<Box<dyn std::io::Read + Send>> =
                if no_stdin { None } else { Some(Box::new(std::io::stdin())) };
            let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
            let io = agent::Streams { stdin, out: &mut out, err: &mut err };
            let r = exec(&paths, &cli.name, node, &argv, io, timeout)?;
            quiet_on_broken_pipe(out.flush());
            if r.timed_out {
                eprintln!("mc-cluster: command killed after {timeout} s");
            }
            Ok(r.code)
        }
        Cmd::Mpirun { n, ppn, env, timeout, argv } => {
            end_on_signals()?;
            let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
            let r = mpirun(&paths, &cli.name, &MpirunOptions { n, ppn, env, argv }, &mut out, &mut err, timeout)?;
            quiet_on_broken_pipe(out.flush());
            if r.timed_out {
                eprintln!("mc-cluster: mpiexec killed after {timeout} s");
            }
            Ok(r.code)
        }
        Cmd::Pvm { env, timeout, argv } => {
            let argv = launcher::pvm_argv(&env, &argv)?;
            let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
            let io = agent::Streams { stdin: Some(Box::new(std::io::stdin())), out: &mut out, err: &mut err };
            let r = exec(&paths, &cli.name, 0, &argv, io, timeout)?;
            quiet_on_broken_pipe(out.flush());
            if r.timed_out {
                eprintln!("mc-cluster: PVM program killed after {timeout} s");
            }
            Ok(r.code)
        }
        Cmd::Cp { src, dst } => {
            outln!("{}", cp(&paths, &cli.name, &src, &dst)?);
            Ok(0)
        }
        Cmd::Status => status(&paths, &cli.name),
        Cmd::Hub { action: Some(a), .. } if a != "restart" => {
            anyhow::bail!(
                "hub {a}: a request to the hub goes after --: mc-cluster hub -- {a} (or: mc-cluster hub restart)"
            )
        }
        Cmd::Hub { action: Some(_), args } if !args.is_empty() => {
            anyhow::bail!("hub restart takes no request after --")
        }
        Cmd::Hub { action: Some(_), .. } => {
            outln!("{}", restart(&paths, &cli.name, "restart-hub")?);
            Ok(0)
        }
        Cmd::Hub { action: None, args } if args.is_empty() => {
            anyhow::bail!("give a request after -- (mc-cluster hub -- stats) or restart")
        }
        Cmd::Hub { action: None, args } => {
            out!("{}", hub_ctl(&paths, &cli.name, &args)?);
            Ok(0)
        }
        Cmd::Unplug { node } => {
            out!("{}", launcher::unplug(&paths, &cli.name, node)?);
            Ok(0)
        }
        Cmd::Plug { node } => {
            out!("{}", launcher::plug(&paths, &cli.name, node)?);
            Ok(0)
        }
        Cmd::Conform { driver, node, only, json } => {
            let o = launcher::conform::Options { driver, node, only };
            let outcomes = launcher::conform::run(&paths, &cli.name, &o, |r| {
                if json {
                    outln!("{}", serde_json::to_string(r).unwrap_or_default());
                    return;
                }
                let verdict = match (r.passed, r.unsupported) {
                    (true, _) => "PASS",
                    (false, true) => "UNSUPPORTED",
                    (false, false) => "FAIL",
                };
                outln!("{verdict:<5} {:<8} {:>5.1} s  {}", r.scenario, r.seconds, r.detail);
                if !r.passed {
                    for l in &r.driver_output {
                        outln!("        | {l}");
                    }
                }
            })?;
            let passed = outcomes.iter().filter(|r| r.passed).count();
            if !json {
                outln!("{passed} of {} scenarios passed", outcomes.len());
            }
            Ok(if passed == outcomes.len() { 0 } else { 1 })
        }
        Cmd::Trace { node, kind, reg, pages, dir, json } => {
            let flags = [("--kind", kind), ("--reg", reg), ("--pages", pages), ("--dir", dir)];
            let mut args: Vec<String> =
                flags.into_iter().filter_map(|(f, v)| Some([f.to_string(), v?])).flatten().collect();
            if json {
                args.push("--json".into());
            }
            let rd = paths.run_dir(&cli.name);
            let st = State::load(&rd)
                .map_err(|_| anyhow::anyhow!("cluster '{}' is not up (run 'mc-cluster up' first)", cli.name))?;
            if node >= st.nodes.len() {
                anyhow::bail!("node {node} does not exist: the cluster has nodes 0 to {}", st.nodes.len() - 1);
            }
            let sock = launcher::supervisor::node_dir(&rd, node).join("adapter.sock.trace");
            // Replaced by the follower itself: stopping this command stops it.
            use std::os::unix::process::CommandExt;
            let e = std::process::Command::new(paths.bin_dir.join("mc-hub"))
                .arg("trace")
                .arg("--socket")
                .arg(&sock)
                .args(&args)
                .exec();
            Err(anyhow::anyhow!("cannot run mc-hub trace: {e}"))
        }
        Cmd::Monitor { port, interval_ms } => {
            let rd = paths.run_dir(&cli.name);
            if !rd.join("hub.ctl").exists() {
                anyhow::bail!("cluster '{}' is not up (run 'mc-cluster up' first)", cli.name);
            }
            let opts = launcher::monitor::Options {
                control: rd.join("hub.ctl"),
                events_log: Some(rd.join("events.log")),
                port,
                interval: Duration::from_millis(interval_ms),
                token: None,
            };
            launcher::monitor::serve(opts, |addr| {
                outln!("monitor: {addr}");
            })?;
            Ok(0)
        }
        Cmd::Capture { action, file } => {
            let args = match (action.as_str(), file) {
                ("start", Some(f)) => {
                    let f = std::path::absolute(&f).with_context(|| format!("capture file {}", f.display()))?;
                    vec!["capture-start".to_string(), f.display().to_string()]
                }
                ("start", None) => anyhow::bail!("capture start needs a FILE: mc-cluster capture start trace.pcap"),
                (_, Some(_)) => anyhow::bail!("capture stop takes no FILE"),
                _ => vec!["capture-stop".to_string()],
            };
            hub_ctl(&paths, &cli.name, &args)?;
            outln!("capture {}", if args.len() == 2 { format!("started: {}", args[1]) } else { "stopped".into() });
            Ok(0)
        }
        Cmd::Restart { node } => {
            outln!("{}", restart(&paths, &cli.name, &format!("restart-node {node}"))?);
            Ok(0)
        }
        Cmd::Down => {
            let rd = paths.run_dir(&cli.name);
            let rep = down_dir(&rd)?;
            let mut what = Vec::new();
            if rep.stopped_supervisor {
                what.push("stopped".to_string());
            }
            if !rep.killed.is_empty() {
                what.push(format!("killed {} stray process(es)", rep.killed.len()));
            }
            if rep.removed_sockets > 0 {
                what.push(format!("removed {} stale socket(s)", rep.removed_sockets));
            }
            if what.is_empty() {
                outln!("cluster '{}': nothing was running", cli.name);
            } else {
                outln!("cluster '{}' is down ({})", cli.name, what.join(", "));
            }
            Ok(0)
        }
        Cmd::Supervise { .. } => unreachable!(),
    }
}

fn main() {
    match run() {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("mc-cluster: {e:#}");
            std::process::exit(1);
        }
    }
}
