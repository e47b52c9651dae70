//! The `pinring` command's own subcommands above the daemon: `pinring run` (a daemon and N
//! loaders as child processes, a progress bar, a human summary) and `pinring consume`. The
//! children and their restart policy are pinring-runtime's (`children`), which `pinring bench`
//! and the Python package share. These commands live apart from pinring-runtime so that their
//! dependencies (the progress bar) are linked into the `pinring` binary only, never into
//! `pinring-daemon` or `pinring-loader`.

#![forbid(unsafe_code)]

pub mod consume;
pub mod runner;

use pinring_exit::Coded;
use pinring_exit::Exit;
use pinring_runtime::installed;
use pinring_runtime::shutdown::Shutdown;

/// Body of `pinring run`.
pub fn main_run(args: &runner::RunArgs, shutdown: std::io::Result<Shutdown>) -> Exit {
    let shutdown = match installed(shutdown) {
        Ok(s) => s,
        Err(e) => return e,
    };
    match runner::run(args, &shutdown) {
        Ok(exit) => exit,
        Err(e) => {
            pinring_runtime::logging::fail(&e);
            e.exit()
        }
    }
}

/// Body of `pinring consume`: prints the resume state as one JSON line on stdout.
pub fn main_consume(args: &consume::ConsumeArgs, shutdown: std::io::Result<Shutdown>) -> Exit {
    let shutdown = match installed(shutdown) {
        Ok(s) => s,
        Err(e) => return e,
    };
    match consume::run(args, &shutdown) {
        Ok(None) => {
            tracing::info!(ring = %args.ring, "stopped before the ring was attached");
            Exit::Ok
        }
        Ok(Some(done)) => match serde_json::to_string(&done) {
            Ok(line) => {
                pinring_runtime::outln!("{line}");
                Exit::Ok
            }
            Err(e) => {
                pinring_runtime::logging::fail(&format!("cannot print the consume result: {e}"));
                Exit::Output
            }
        },
        Err(e) => {
            pinring_runtime::logging::fail(&e);
            e.exit()
        }
    }
}
