//! `pinring`: the command-line front end. `run` starts a daemon and loaders on one config;
//! `daemon` and `loader` are the same programs as `pinring-daemon` and `pinring-loader`.

use clap::{Parser, Subcommand};
use pinring_runtime::{daemon, loader, logging, runner, shutdown::Shutdown};
use std::process::ExitCode;

/// pinring: feed GPUs from a pinned shared-memory ring filled by loader processes.
#[derive(Debug, Parser)]
#[command(name = "pinring", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run a daemon and N loaders on one config, show progress, print a summary.
    Run(runner::RunArgs),
    /// Run the GPU daemon (same as pinring-daemon).
    Daemon(daemon::DaemonArgs),
    /// Run a loader (same as pinring-loader).
    Loader(loader::LoaderArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let shutdown = Shutdown::install();
    match cli.command {
        Cmd::Run(args) => {
            logging::init("run");
            pinring_runtime::main_run(&args, shutdown).into()
        }
        Cmd::Daemon(args) => {
            logging::init("daemon");
            pinring_runtime::main_daemon(&args, shutdown).into()
        }
        Cmd::Loader(args) => {
            logging::init("loader");
            pinring_runtime::main_loader(&args, shutdown).into()
        }
    }
}
