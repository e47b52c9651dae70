//! Logging through `tracing`, journald-friendly: plain text to stderr, no colour unless stderr is
//! a terminal, level from `RUST_LOG` (default `info`).

use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;

/// Installs the global subscriber once; later calls are no-ops. `tag` names the process kind.
pub fn init(tag: &'static str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let ansi = std::io::stderr().is_terminal();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .with_target(false)
        .try_init();
    tracing::debug!(process = tag, pid = std::process::id(), "logging started");
}
