//! `UMP_TRACE=1`: how long the steps of opening a channel take, one line
//! on stderr per open (the imcd requests of a MEMORY CHANNEL open, each
//! with its time). Nothing is timed or printed without it. The caller's
//! thread.

use std::sync::OnceLock;
use std::time::Instant;

/// Whether `UMP_TRACE` is set (read once).
pub fn on() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("UMP_TRACE").is_some_and(|v| v != "0"))
}

/// The steps of one operation, each with the time since the one before.
pub struct Steps {
    t0: Option<Instant>,
    last: Option<Instant>,
    steps: Vec<(&'static str, f64)>,
}

impl Steps {
    /// Starts timing (a no-op without `UMP_TRACE`).
    pub fn new() -> Steps {
        let now = on().then(Instant::now);
        Steps { t0: now, last: now, steps: Vec::new() }
    }

    /// Ends step `what`.
    pub fn step(&mut self, what: &'static str) {
        if let Some(last) = self.last {
            let now = Instant::now();
            self.steps.push((what, (now - last).as_secs_f64() * 1e3));
            self.last = Some(now);
        }
    }

    /// Prints the line for operation `what`.
    pub fn done(&self, what: &str) {
        if let Some(t0) = self.t0 {
            let each: Vec<String> = self.steps.iter().map(|(s, ms)| format!("{s} +{ms:.1} ms")).collect();
            eprintln!(
                "ump: pid {}: {what}: {:.1} ms ({})",
                std::process::id(),
                t0.elapsed().as_secs_f64() * 1e3,
                each.join(", ")
            );
        }
    }
}

impl Default for Steps {
    fn default() -> Steps {
        Steps::new()
    }
}
