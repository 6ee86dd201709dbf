//! `pvmd`: the PVM daemon of a guest (started at boot by `/etc/rc.mc`);
//! what it does is `pvm::daemon`.

use std::time::Duration;

use clap::Parser;

/// The PVM daemon of this guest: spawns programs for tasks of other
/// guests and looks after this guest's tasks (docs/pvm.md, "The daemon").
#[derive(Parser)]
struct Args {
    /// Seconds to wait for imcd at start (the tables are in MEMORY CHANNEL
    /// space).
    #[arg(long, default_value_t = 120)]
    wait_imcd: u64,
}

fn main() {
    let a = Args::parse();
    if let Err(e) = pvm::daemon::run(Duration::from_secs(a.wait_imcd)) {
        eprintln!("pvmd: {e}");
        std::process::exit(1);
    }
}
