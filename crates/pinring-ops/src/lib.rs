//! The operator's tools: `pinring status` (a live view of every ring on the host, read-only),
//! `pinring clean` (removes the segments of rings whose daemon is gone) and `pinring config
//! check` (resolves a config as the daemon would and says what it would run). They sit beside
//! the daemon and the loader, link neither, and change neither: status reads a ring through
//! pinring-observe, clean only removes what no live process holds, and config check calls the same
//! `Spec::resolve` the daemon calls.

#![forbid(unsafe_code)]

pub mod clean;
pub mod config_check;
pub mod status;

use pinring_exit::{Coded, Exit};
use pinring_runtime::shutdown::Shutdown;

/// Body of `pinring status`.
pub fn main_status(args: &status::StatusArgs, shutdown: std::io::Result<Shutdown>) -> Exit {
    let shutdown = match pinring_runtime::installed(shutdown) {
        Ok(s) => s,
        Err(e) => return e,
    };
    match status::run(args, &shutdown) {
        Ok(()) => Exit::Ok,
        Err(e) => {
            pinring_runtime::logging::fail(&e);
            e.exit()
        }
    }
}

/// Body of `pinring clean`.
pub fn main_clean(args: &clean::CleanArgs) -> Exit {
    match clean::run(args) {
        Ok(()) => Exit::Ok,
        Err(e) => {
            pinring_runtime::logging::fail(&e);
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
                pinring_runtime::logging::fail(&e);
                e.exit()
            }
        },
    }
}
