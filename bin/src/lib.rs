//! The `pinring`, `pinring-daemon` and `pinring-loader` programs as a library: the binaries in
//! src/bin are each one call of [`main`], and so are the Python package's console scripts
//! (`pinring` on PATH after `pip install`, through pinring-python), which run the same code
//! inside the interpreter.
//!
//! `pinring`: the command-line front end. `run` starts a daemon and loaders on one config;
//! `daemon` and `loader` are the same programs as `pinring-daemon` and `pinring-loader`;
//! `status`, `clean` and `config check` are the operator's tools.

#![forbid(unsafe_code)]

use clap::{Parser, Subcommand};
use pinring_bench::{bench, reference};
use pinring_cli::{consume, runner};
use pinring_exit::Exit;
use pinring_ops::{clean, config_check, status};
use pinring_producer::loader;
use pinring_runtime::{crash, logging, shutdown::Shutdown};
use std::ffi::OsString;

/// One of the three programs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Program {
    /// `pinring` and its subcommands.
    Pinring,
    /// `pinring-daemon` (`pinring daemon`).
    Daemon,
    /// `pinring-loader` (`pinring loader`).
    Loader,
}

impl Program {
    /// The program by its name (`pinring`, `pinring-daemon`, `pinring-loader`).
    pub fn named(name: &str) -> Option<Program> {
        match name {
            "pinring" => Some(Program::Pinring),
            "pinring-daemon" => Some(Program::Daemon),
            "pinring-loader" => Some(Program::Loader),
            _ => None,
        }
    }
}

/// Runs `program` on its command line `args` (the first is the program's name, as in
/// `std::env::args_os`): parses it (`--help` and `--version` print and end with 0, a bad
/// argument prints clap's message and ends with [`Exit::Usage`]), runs it with the panic guard,
/// and returns its exit code.
pub fn main(program: Program, args: Vec<OsString>) -> Exit {
    crash::guarded(|| match program {
        Program::Pinring => parsed::<Cli>(args).map_or_else(|e| e, dispatch),
        Program::Daemon => parsed::<DaemonCli>(args).map_or_else(
            |e| e,
            |cli| {
                logging::init_with("daemon", cli.args.service.log_level.as_deref());
                pinring_daemon::main(&cli.args, Shutdown::install())
            },
        ),
        Program::Loader => parsed::<LoaderCli>(args).map_or_else(
            |e| e,
            |cli| {
                logging::init_with("loader", cli.args.service.log_level.as_deref());
                pinring_producer::loader::main(&cli.args, Shutdown::install())
            },
        ),
    })
}

/// The parsed command line, or (after clap printed its help, version or error) the exit code.
fn parsed<C: Parser>(args: Vec<OsString>) -> Result<C, Exit> {
    C::try_parse_from(args).map_err(|e| {
        let _ = e.print();
        if e.use_stderr() {
            Exit::Usage
        } else {
            Exit::Ok
        }
    })
}

/// The pinring GPU daemon: creates the ring, registers it, uploads batches from its slots.
#[derive(Debug, Parser)]
#[command(name = "pinring-daemon", version, about)]
struct DaemonCli {
    #[command(flatten)]
    args: pinring_daemon::DaemonArgs,
}

/// A pinring loader: fills slots of a ring with the batches its daemon assigns.
#[derive(Debug, Parser)]
#[command(name = "pinring-loader", version, about)]
struct LoaderCli {
    #[command(flatten)]
    args: loader::LoaderArgs,
}

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
    Daemon(pinring_daemon::DaemonArgs),
    /// Run a loader (same as pinring-loader).
    Loader(loader::LoaderArgs),
    /// Be the trainer's end of a ring (its daemon runs --sink consumer): take its batches in
    /// order, optionally verify and hold them, print the resume state as JSON.
    Consume(consume::ConsumeArgs),
    /// Live view of one ring or of every ring on this host (read-only).
    Status(status::StatusArgs),
    /// Remove rings whose daemon is gone; never touches a live one.
    Clean(clean::CleanArgs),
    /// Measure: raw and pageable ceilings, the pipeline over slot sizes and loader counts, and
    /// the modes side by side; prints a table, writes CSV and an SVG plot.
    Bench(bench::BenchArgs),
    /// One writer of `pinring bench`'s reference pipeline (started by the bench, not by hand).
    #[command(name = "bench-writer", hide = true)]
    BenchWriter(reference::WriterArgs),
    /// Config files: check one and print the resolved settings.
    #[command(subcommand)]
    Config(config_check::ConfigCmd),
}

/// Runs the subcommand; its exit code.
fn dispatch(cli: Cli) -> Exit {
    let shutdown = Shutdown::install();
    match cli.command {
        Cmd::Run(args) => {
            logging::init_command("run");
            pinring_cli::main_run(&args, shutdown)
        }
        Cmd::Consume(args) => {
            logging::init_command("consume");
            pinring_cli::main_consume(&args, shutdown)
        }
        Cmd::Bench(args) => {
            logging::init_command("bench");
            pinring_bench::main_bench(&args, shutdown)
        }
        Cmd::BenchWriter(args) => {
            logging::init("bench-writer");
            pinring_bench::main_bench_writer(&args, shutdown)
        }
        Cmd::Daemon(args) => {
            logging::init_with("daemon", args.service.log_level.as_deref());
            #[cfg(feature = "profile")]
            let _profile = profile::Profile::start();
            pinring_daemon::main(&args, shutdown)
        }
        Cmd::Loader(args) => {
            logging::init_with("loader", args.service.log_level.as_deref());
            pinring_producer::loader::main(&args, shutdown)
        }
        Cmd::Status(args) => {
            logging::init_command("status");
            pinring_ops::main_status(&args, shutdown)
        }
        Cmd::Clean(args) => {
            logging::init_command("clean");
            pinring_ops::main_clean(&args)
        }
        Cmd::Config(cmd) => {
            logging::init_command("config");
            pinring_ops::main_config(&cmd)
        }
    }
}

/// The developers' sampling profile (`--features profile`, `PINRING_PROF=FILE`): 2,000 samples a
/// second of every thread; when the daemon ends, FILE gets one line per distinct stack, "COUNT
/// THREAD;OUTERMOST;...;INNERMOST" (the folded format flame-graph tools read).
#[cfg(feature = "profile")]
mod profile {
    use std::io::Write;

    pub struct Profile {
        guard: pprof::ProfilerGuard<'static>,
        path: std::path::PathBuf,
    }

    impl Profile {
        pub fn start() -> Option<Profile> {
            let path = std::env::var_os("PINRING_PROF")?.into();
            match pprof::ProfilerGuardBuilder::default()
                .frequency(2000)
                .build()
            {
                Ok(guard) => Some(Profile { guard, path }),
                Err(e) => {
                    eprintln!("PINRING_PROF: the profiler did not start: {e}");
                    None
                }
            }
        }
    }

    impl Drop for Profile {
        fn drop(&mut self) {
            let write = || -> Result<(), Box<dyn std::error::Error>> {
                let report = self.guard.report().build()?;
                let mut out = Vec::new();
                for (frames, count) in &report.data {
                    let stack: Vec<String> = frames
                        .frames
                        .iter()
                        .rev()
                        .flat_map(|f| f.iter().rev().map(|s| s.name()))
                        .collect();
                    writeln!(out, "{count} {};{}", frames.thread_name, stack.join(";"))?;
                }
                pinring_runtime::output::write_file("the profile", &self.path, &out)?;
                Ok(())
            };
            if let Err(e) = write() {
                eprintln!("PINRING_PROF {}: {e}", self.path.display());
            }
        }
    }
}
