//! SIGTERM/SIGINT handling: a flag set from the signal handler (signal-hook), read by the main
//! loops. Every futex wait in pinring has a deadline of at most 100 ms, so a signal is noticed
//! within that time even though the kernel restarts FUTEX_WAIT after an SA_RESTART handler.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

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

/// Ends the process with `code` if it is still running `grace` after the first SIGTERM or
/// SIGINT: the promise that a stop request is honoured even where the main loop cannot look at
/// [`Shutdown::requested`], because it is blocked in a system call that no signal interrupts
/// (an `open()` of a FIFO, a read from a hung network file system, a page fault on a stalled
/// mount; the handlers are installed with `SA_RESTART`).
///
/// A thread of its own waits for the signal (signal-hook's self-pipe, beside the flag handler),
/// then for `grace`, then logs what happened and exits. Only for processes whose state another
/// process recovers when they vanish: a loader's claimed slot is put back by its daemon, which
/// sees its owner gone, exactly as after a SIGKILL.
pub fn exit_if_stuck(grace: Duration, code: u8, what: &'static str) -> std::io::Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])?;
    std::thread::Builder::new()
        .name("stop-deadline".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                // A deadline, not a synchronisation: the process normally exits well before it.
                std::thread::sleep(grace);
                tracing::warn!(
                    signal = sig,
                    "the {what} did not stop within {} ms of the stop signal (blocked in a \
                     system call); exiting now",
                    grace.as_millis()
                );
                std::process::exit(i32::from(code));
            }
        })?;
    Ok(())
}
