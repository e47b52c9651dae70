//! Logging through `tracing`, journald-friendly: plain text to stderr, no colour unless stderr is
//! a terminal, level from `--log-level` (daemon and loaders), else `RUST_LOG`, else `info`.

use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;

/// Installs the global subscriber once; later calls are no-ops. `tag` names the process kind.
pub fn init(tag: &'static str) {
    init_with(tag, None);
}

/// [`init`] with an explicit level or filter (already checked by the flag's parser) that takes
/// precedence over `RUST_LOG`.
pub fn init_with(tag: &'static str, level: Option<&str>) {
    let filter = level
        .and_then(|l| EnvFilter::try_new(l).ok())
        .or_else(|| EnvFilter::try_from_default_env().ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    let ansi = std::io::stderr().is_terminal();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .with_target(false)
        .try_init();
    tracing::debug!(process = tag, pid = std::process::id(), "logging started");
}
