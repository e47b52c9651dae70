//! `pinring-loader`: any number per ring. See `pinring_runtime::loader`.

use clap::Parser;
use pinring_runtime::{crash, loader, logging, shutdown::Shutdown};
use std::process::ExitCode;

/// A pinring loader: fills slots of a ring with the batches its daemon assigns.
#[derive(Debug, Parser)]
#[command(name = "pinring-loader", version, about)]
struct Cli {
    #[command(flatten)]
    args: loader::LoaderArgs,
}

fn main() -> ExitCode {
    crash::guard(|| {
        let cli = Cli::parse();
        logging::init_with("loader", cli.args.service.log_level.as_deref());
        pinring_runtime::main_loader(&cli.args, Shutdown::install())
    })
}
