//! The pinring processes as a library: the daemon and loader main loops, sinks, settings,
//! signals, exit codes, and the service side (systemd notifications, metrics, `status`,
//! `clean`, config lookup and `config check`). The binaries in bin/ are thin wrappers around
//! this crate; `pinring run` and `pinring bench` are in pinring-cli, which only the `pinring`
//! binary links.

pub mod clean;
pub mod config_check;
pub mod config_lookup;
pub mod crash;
pub mod daemon;
pub mod histogram;
pub mod host_memory;
pub mod loader;
pub mod logging;
pub mod metrics;
pub mod numa;
pub mod output;
pub mod ring_wake;
pub mod service;
pub mod settings;
pub mod shutdown;
pub mod sink;
pub mod status;
pub mod summary;
pub mod this_program;

/// The exit codes (pinring-exit), re-exported for the binaries.
pub use pinring_exit as exit;
pub use pinring_exit::{Coded, Exit};

use shutdown::Shutdown;

/// The SIGTERM/SIGINT handlers, or (after logging why they could not be installed) the exit code.
pub fn installed(shutdown: std::io::Result<Shutdown>) -> Result<Shutdown, Exit> {
    shutdown.map_err(|e| {
        tracing::error!("cannot install the SIGTERM/SIGINT handlers: {e}");
        Exit::Internal
    })
}

/// Body of `pinring-daemon` / `pinring daemon`: runs, writes the summary (also when start-up
/// failed: with `error` and `exit_code`), logs the outcome.
pub fn main_daemon(args: &daemon::DaemonArgs, shutdown: std::io::Result<Shutdown>) -> Exit {
    let outcome = match shutdown {
        Ok(shutdown) => daemon::run(args, &shutdown),
        Err(e) => daemon::failed_at_start(
            args,
            None,
            daemon::DaemonError::Internal {
                ring: args.ring.clone().unwrap_or_default(),
                what: format!("cannot install the SIGTERM/SIGINT handlers: {e}"),
            },
        ),
    };
    let daemon::Outcome {
        summary: mut s,
        started,
        mut result,
    } = outcome;
    if started && result.is_ok() {
        result = daemon::judge(&s, args.sink);
    }
    if let Err(e) = &result {
        s.error = Some(e.to_string());
        s.exit_code = e.exit().code();
    }
    if started {
        tracing::info!(
            ring = %s.ring,
            batches = s.batches_delivered,
            verified = s.batches_verified,
            gbps = format!("{:.2}", s.gbps),
            bound = %s.bound,
            "run finished"
        );
    }
    let mut exit = Exit::Ok;
    if let Some(path) = &args.summary {
        if let Err(e) = s.write(path) {
            tracing::error!("{e}");
            exit = e.exit();
        }
    }
    match result {
        Ok(()) => exit,
        Err(e) if started => {
            tracing::error!(
                "{e}; resume with --start-seq {} (the summary's resume_seq)",
                s.resume_seq
            );
            e.exit()
        }
        Err(e) => {
            tracing::error!("{e}");
            e.exit()
        }
    }
}

/// Body of `pinring-loader` / `pinring loader`.
pub fn main_loader(args: &loader::LoaderArgs, shutdown: std::io::Result<Shutdown>) -> Exit {
    let shutdown = match installed(shutdown) {
        Ok(s) => s,
        Err(e) => return e,
    };
    match loader::run(args, &shutdown) {
        Ok(r) => {
            tracing::info!(
                batches = r.batches,
                bytes = r.bytes,
                bad_samples = r.bad_samples,
                "loader finished"
            );
            Exit::Ok
        }
        Err(e) => {
            tracing::error!("{e}");
            e.exit()
        }
    }
}

/// Body of `pinring status`.
pub fn main_status(args: &status::StatusArgs, shutdown: std::io::Result<Shutdown>) -> Exit {
    let shutdown = match installed(shutdown) {
        Ok(s) => s,
        Err(e) => return e,
    };
    match status::run(args, &shutdown) {
        Ok(()) => Exit::Ok,
        Err(e) => {
            tracing::error!("{e}");
            e.exit()
        }
    }
}

/// Body of `pinring clean`.
pub fn main_clean(args: &clean::CleanArgs) -> Exit {
    match clean::run(args) {
        Ok(()) => Exit::Ok,
        Err(e) => {
            tracing::error!("{e}");
            e.exit()
        }
    }
}

/// Body of `pinring config check`.
pub fn main_config(cmd: &config_check::ConfigCmd) -> Exit {
    match cmd {
        config_check::ConfigCmd::Check(args) => match config_check::run(args) {
            Ok(()) => Exit::Ok,
            Err(e) => {
                tracing::error!("{e}");
                e.exit()
            }
        },
    }
}
