//! How a tool's `main` ends, the same for every tool: a closed standard
//! output (`| head`) ends it quietly with 141, as a shell reports SIGPIPE
//! (a `println!` that fails there would panic, and a write that fails
//! would end in an error message); any other error is printed as Rust
//! prints an error returned from `main`, with exit code 1. Touched by the
//! tool's main thread (and its panic hook, on any thread).

use std::process::ExitCode;

/// Runs `run` as the tool's body and turns its outcome into the exit code.
pub fn run_main(run: impl FnOnce() -> anyhow::Result<()>) -> ExitCode {
    quiet_on_broken_pipe();
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e)
            if e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
            }) =>
        {
            ExitCode::from(141)
        }
        Err(e) => {
            eprintln!("Error: {e:?}");
            ExitCode::FAILURE
        }
    }
}

/// A panic of `println!` on a closed standard output exits with 141.
fn quiet_on_broken_pipe() {
    let next = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let p = info.payload();
        let msg = p
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| p.downcast_ref::<&str>().copied())
            .unwrap_or_default();
        if msg.starts_with("failed printing to stdout") && msg.contains("Broken pipe") {
            std::process::exit(141);
        }
        next(info)
    }));
}
