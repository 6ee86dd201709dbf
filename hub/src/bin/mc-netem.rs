//! `mc-netem`: a TCP relay that adds delay and jitter each way
//! (`hub::netem`), to put a slower network between an adapter and the hub
//! where the kernel has no `netem` queueing discipline. Runs until killed.

use std::net::TcpListener;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use hub::netem::{parse_duration, serve, Counters, NetemError, Shape};

#[derive(Parser)]
#[command(
    name = "mc-netem",
    version,
    about = "A TCP relay that adds delay and jitter, each way, between an adapter and the hub",
    long_about = "A TCP relay that adds delay and jitter, each way, between an adapter and the hub.\n\n\
                  Every chunk of bytes read from one side is written to the other DELAY +- JITTER (uniform) later, \
                  never before the chunk ahead of it: the stream stays whole and in order, as TCP over a slower \
                  network delivers it. For clusters across hosts on machines whose kernel lacks sch_netem \
                  (tc qdisc ... netem).",
    after_help = "Examples:\n  mc-netem --listen 127.0.0.1:7401 --to 10.77.0.1:7400 --delay 200us --jitter 100us\n  \
                  ip netns exec demo-h1 mc-netem --listen 127.0.0.1:7401 --to 10.77.0.1:7400 --delay 1ms\n\n\
                  Then give the adapters the relay's address ([hosts.NAME] hub_address in a cluster definition, or \
                  mc-adapter --hub tcp:127.0.0.1:7401).\n\nExit codes: 0 never (it runs until killed), 1 an error \
                  (cannot listen, accept failed), 2 a usage error (a bad duration, jitter above the delay)."
)]
struct Args {
    /// Where to listen (IP:PORT).
    #[arg(long)]
    listen: String,
    /// Where to relay to (HOST:PORT): the hub.
    #[arg(long)]
    to: String,
    /// Added one-way delay: 200us, 1.5ms, 2s (a bare number is microseconds).
    #[arg(long, default_value = "0", value_parser = parse_duration)]
    delay: std::time::Duration,
    /// Uniform spread around the delay, at most the delay.
    #[arg(long, default_value = "0", value_parser = parse_duration)]
    jitter: std::time::Duration,
    /// Seed of the jitter (the same seed, the same draws).
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let shape = match Shape::new(args.delay, args.jitter, args.seed) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("mc-netem: {e}");
            return ExitCode::from(2);
        }
    };
    let listener = match TcpListener::bind(&args.listen) {
        Ok(l) => l,
        Err(err) => {
            eprintln!("mc-netem: {}", NetemError::Listen { addr: args.listen, err });
            return ExitCode::from(1);
        }
    };
    eprintln!("mc-netem: {} -> {}, {:?} +- {:?}", args.listen, args.to, shape.delay, shape.jitter);
    match serve(listener, args.to, shape, Arc::new(Counters::default())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mc-netem: {e}");
            ExitCode::from(1)
        }
    }
}
