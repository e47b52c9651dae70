//! `pinring bench`: the measurements (the pipeline at each slot size and loader count, the
//! modes side by side, the upload engine alone), their table, CSV and SVG plot, and the
//! reference pipeline each run is compared with (N writer processes and the same upload engine,
//! no protocol: `reference.rs`, whose writers are the hidden `pinring bench-writer`). Its own
//! crate, so the plotting library is linked into the `pinring` binary only, and the bench's
//! own ring header and raw slot writes stay out of the crates the pipeline is made of.

pub mod bench;
pub mod reference;
pub mod stats;

use pinring_exit::{Coded, Exit};
use pinring_runtime::installed;
use pinring_runtime::shutdown::Shutdown;

/// Body of `pinring bench`.
pub fn main_bench(args: &bench::BenchArgs, shutdown: std::io::Result<Shutdown>) -> Exit {
    let shutdown = match installed(shutdown) {
        Ok(s) => s,
        Err(e) => return e,
    };
    match bench::run(args, &shutdown) {
        Ok(_) => Exit::Ok,
        Err(e) => {
            pinring_runtime::logging::fail(&e);
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
