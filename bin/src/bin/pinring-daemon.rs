//! `pinring-daemon`: one per ring (usually one per GPU). See `pinring_runtime::daemon`.

use clap::Parser;
use pinring_runtime::{crash, daemon, logging, shutdown::Shutdown};
use std::process::ExitCode;

/// The pinring GPU daemon: creates the ring, registers it, uploads batches from its slots.
#[derive(Debug, Parser)]
#[command(name = "pinring-daemon", version, about)]
struct Cli {
    #[command(flatten)]
    args: daemon::DaemonArgs,
}

fn main() -> ExitCode {
    crash::guard(|| {
        let cli = Cli::parse();
        logging::init_with("daemon", cli.args.service.log_level.as_deref());
        pinring_runtime::main_daemon(&cli.args, Shutdown::install())
    })
}
