//! The `pinring` command's own subcommands: `pinring run` (a daemon and N loaders as child
//! processes, a progress bar, a human summary) and `pinring bench` (the measurements, a table,
//! CSV and an SVG plot, and the reference pipeline it compares with, whose writers are the hidden
//! `pinring bench-writer`). They live apart from pinring-runtime so that their dependencies (the
//! progress bar, the plotting library) are linked into the `pinring` binary only, never into
//! `pinring-daemon` or `pinring-loader`.

pub mod bench;
pub mod consume;
pub mod reference;
pub mod runner;
pub mod stats;

use pinring_exit::Coded;
use pinring_runtime::shutdown::Shutdown;
use pinring_runtime::{installed, Exit};

/// Body of `pinring run`.
pub fn main_run(args: &runner::RunArgs, shutdown: std::io::Result<Shutdown>) -> Exit {
    let shutdown = match installed(shutdown) {
        Ok(s) => s,
        Err(e) => return e,
    };
    match runner::run(args, &shutdown) {
        Ok(exit) => exit,
        Err(e) => {
            tracing::error!("{e}");
            e.exit()
        }
    }
}

/// Body of `pinring bench`.
pub fn main_bench(args: &bench::BenchArgs) -> Exit {
    match bench::run(args) {
        Ok(_) => Exit::Ok,
        Err(e) => {
            tracing::error!("{e}");
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
                tracing::error!("cannot print the consume result: {e}");
                Exit::Output
            }
        },
        Err(e) => {
            tracing::error!("{e}");
            e.exit()
        }
    }
}

/// Body of `pinring bench-writer` (hidden: `pinring bench` starts it for its reference pipeline).
pub fn main_bench_writer(
    args: &reference::WriterArgs,
    shutdown: std::io::Result<Shutdown>,
) -> Exit {
    let shutdown = match installed(shutdown) {
        Ok(s) => s,
        Err(e) => return e,
    };
    match reference::writer_main(args, &shutdown) {
        Ok(_) => Exit::Ok,
        Err(e) => {
            tracing::error!("{e}");
            e.exit()
        }
    }
}
