//! What every pinring program runs on, whatever its role: the SIGTERM/SIGINT flag
//! (`shutdown`), child processes and their restart policy (`children`), logging, crash reports and the panic guard (`crash`), the program's own path
//! for re-spawning itself (`this_program`), stdout and output files (`output`), the config file
//! and its overrides (`settings`, `config_lookup`), the host's memory, caches and NUMA nodes
//! (`host_memory`, `numa`) and the systemd notifier and watchdog (`service`). The roles are the
//! crates above it: the daemon (pinring-daemon), the loader (pinring-producer), the operator
//! tools (pinring-ops) and `pinring run` and `pinring bench` (pinring-cli, pinring-bench).

pub mod children;
pub mod config_lookup;
pub mod crash;
pub mod host_memory;
pub mod logging;
pub mod numa;
pub mod output;
pub mod service;
pub mod settings;
pub mod shutdown;
pub mod this_program;

use pinring_exit::Exit;
use shutdown::Shutdown;

/// The SIGTERM/SIGINT handlers, or (after logging why they could not be installed) the exit code.
pub fn installed(shutdown: std::io::Result<Shutdown>) -> Result<Shutdown, Exit> {
    shutdown.map_err(|e| {
        tracing::error!("cannot install the SIGTERM/SIGINT handlers: {e}");
        Exit::Internal
    })
}
