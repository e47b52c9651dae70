//! SIGTERM/SIGINT handling: a flag set from the signal handler (signal-hook), read by the main
//! loops. Every futex wait in pinring has a deadline of at most 100 ms, so a signal is noticed
//! within that time even though the kernel restarts FUTEX_WAIT after an SA_RESTART handler.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Set once SIGTERM or SIGINT arrived.
#[derive(Debug, Clone)]
pub struct Shutdown(Arc<AtomicBool>);

impl Shutdown {
    /// Registers handlers for SIGTERM and SIGINT.
    pub fn install() -> std::io::Result<Shutdown> {
        let flag = Arc::new(AtomicBool::new(false));
        for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
            signal_hook::flag::register(sig, Arc::clone(&flag))?;
        }
        Ok(Shutdown(flag))
    }

    /// A flag no signal sets (tests).
    pub fn never() -> Shutdown {
        Shutdown(Arc::new(AtomicBool::new(false)))
    }

    /// Whether a stop was requested.
    pub fn requested(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// Requests a stop from inside the process.
    pub fn request(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
}
