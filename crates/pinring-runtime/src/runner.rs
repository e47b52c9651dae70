//! `pinring run`: one daemon and N loaders as child processes on one config, a progress bar, and a
//! human summary at the end. Children are this same executable started with its `daemon` and
//! `loader` subcommands, so `cargo run --bin pinring -- run` needs no other binary built.

use crate::daemon::parse_backend_kind;
use crate::exit::Exit;
use crate::loader::attach;
use crate::settings::{self, Overrides};
use crate::shutdown::Shutdown;
use crate::sink::SinkKind;
use crate::summary::Summary;
use pinring_backend::BackendKind;
use pinring_ring::{ring_state, Access};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

/// `pinring run` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Config file (TOML). Without it, the built-in synthetic config.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Ring name (overrides ring.name).
    #[arg(long, value_name = "NAME")]
    pub ring: Option<String>,
    /// Number of loader processes.
    #[arg(long, default_value_t = 4)]
    pub loaders: usize,
    /// Epochs to run (overrides plan.epochs).
    #[arg(long)]
    pub epochs: Option<u32>,
    /// What consumes uploaded batches.
    #[arg(long, value_enum, default_value = "verify")]
    pub sink: SinkKind,
    /// GPU backend: auto, cuda or host.
    #[arg(long, default_value = "auto", value_parser = parse_backend_kind)]
    pub backend: BackendKind,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// Deliver batches in any order.
    #[arg(long)]
    pub unordered: bool,
    /// Also write the daemon's JSON summary here.
    #[arg(long, value_name = "PATH")]
    pub summary: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

/// Why `pinring run` failed before it had a summary.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Bad config.
    #[error(transparent)]
    Config(#[from] pinring_data::ConfigError),
    /// A child could not be started.
    #[error("cannot start {what} ({exe}): {source}")]
    Spawn {
        /// Which child.
        what: &'static str,
        /// Executable.
        exe: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The daemon exited before its ring was ready.
    #[error("the daemon exited with code {code} before ring {ring:?} was ready (its error is printed above)")]
    DaemonFailed {
        /// Ring name.
        ring: String,
        /// Its exit code.
        code: i32,
    },
    /// The ring never became ready.
    #[error(transparent)]
    Ring(#[from] pinring_ring::RingError),
    /// The summary could not be read.
    #[error("cannot read the daemon's summary {path}: {source}")]
    Summary {
        /// Path.
        path: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

impl RunError {
    /// Exit code.
    pub fn exit(&self) -> Exit {
        match self {
            RunError::Config(_) => Exit::Config,
            RunError::Spawn { .. } => Exit::Internal,
            RunError::DaemonFailed { code, .. } => Exit::from_code(*code).unwrap_or(Exit::PeerDied),
            RunError::Ring(_) => Exit::Ring,
            RunError::Summary { .. } => Exit::PeerDied,
        }
    }
}

/// Child processes that are stopped (SIGTERM, which every pinring process handles within
/// 100 ms) and reaped when this goes out of scope, on every path.
pub(crate) struct Children(pub(crate) Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            if matches!(c.try_wait(), Ok(None)) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(c.id() as i32),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
        }
        for c in &mut self.0 {
            let _ = c.wait();
        }
    }
}

/// Runs the pipeline and prints the summary; returns the exit code.
pub fn run(args: &RunArgs, shutdown: &Shutdown) -> Result<Exit, RunError> {
    let overrides = Overrides {
        ring: args.ring.clone(),
        epochs: args.epochs,
        unordered: args.unordered,
    };
    let cfg = settings::load(args.config.as_deref(), &overrides)?;
    let exe = std::env::current_exe().map_err(|source| RunError::Spawn {
        what: "the daemon",
        exe: "<current executable>".into(),
        source,
    })?;
    let summary_path = args.summary.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("pinring-run-{}.json", std::process::id()))
    });
    let _ = std::fs::remove_file(&summary_path);
    let mut common: Vec<String> = vec!["--ring".into(), cfg.ring.name.clone()];
    // The children get the file this process found, so that their own lookup (which also sees
    // --ring) cannot pick another one.
    let origin = settings::locate(args.config.as_deref(), args.ring.as_deref())?;
    if let Some(c) = origin.path() {
        common.extend(["--config".into(), c.display().to_string()]);
    }
    // The children's info lines would scroll the progress bar away: unless the user chose a log
    // level, they log warnings and errors only, and the summary tells the rest.
    let quiet_children = std::env::var_os("RUST_LOG").is_none();
    let child_env = |cmd: &mut Command| {
        if quiet_children {
            cmd.env("RUST_LOG", "warn");
        }
    };
    let mut daemon_cmd = Command::new(&exe);
    child_env(&mut daemon_cmd);
    daemon_cmd
        .arg("daemon")
        .args(&common)
        .args(["--sink", args.sink.name()])
        .args(["--backend", &args.backend.to_string()])
        .args(["--device", &args.device.to_string()])
        .args(["--epochs", &cfg.plan.epochs.to_string()])
        .arg("--summary")
        .arg(&summary_path)
        .stdin(Stdio::null());
    if !cfg.ring.in_order {
        daemon_cmd.arg("--unordered");
    }
    let daemon = daemon_cmd.spawn().map_err(|source| RunError::Spawn {
        what: "the daemon",
        exe: exe.display().to_string(),
        source,
    })?;
    let daemon_pid = daemon.id();
    let mut children = Children(vec![daemon]);

    // Wait for *our* daemon's ring (a stale segment of the same name may exist until the daemon
    // replaces it).
    let start = Instant::now();
    let ring = loop {
        if let Ok(Some(status)) = children.0[0].try_wait() {
            return Err(RunError::DaemonFailed {
                ring: cfg.ring.name.clone(),
                code: status.code().unwrap_or(-1),
            });
        }
        match attach(&cfg.ring.name, Access::ReadOnly, Duration::from_millis(200)) {
            Ok(r) if r.daemon().pid == daemon_pid => break r,
            Ok(_) | Err(_) if start.elapsed() < Duration::from_secs(60) => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(_) => {
                return Err(RunError::DaemonFailed {
                    ring: cfg.ring.name.clone(),
                    code: -1,
                })
            }
            Err(e) => return Err(e.into()),
        }
    };
    for _ in 0..args.loaders {
        let mut cmd = Command::new(&exe);
        child_env(&mut cmd);
        let child = cmd
            .arg("loader")
            .args(&common)
            .stdin(Stdio::null())
            .spawn()
            .map_err(|source| RunError::Spawn {
                what: "a loader",
                exe: exe.display().to_string(),
                source,
            })?;
        children.0.push(child);
    }

    let h = ring.header();
    let total = h.end_seq.load(Relaxed) - h.start_seq.load(Relaxed);
    let bar = if args.quiet {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new(total)
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} batches {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let t0 = Instant::now();
    let status = loop {
        // The daemon drains on its own SIGINT/SIGTERM (a terminal's Ctrl-C reaches the whole
        // process group); this loop only watches.
        if let Ok(Some(status)) = children.0[0].try_wait() {
            break status;
        }
        let delivered = h.delivered.load(Relaxed);
        let gb = h.bytes_delivered.load(Relaxed) as f64 / 1e9;
        bar.set_position(delivered);
        bar.set_message(format!(
            "{:.2} GB/s, {} loaders",
            gb / t0.elapsed().as_secs_f64().max(1e-9),
            ring.loaders().len()
        ));
        if shutdown.requested() && ring.state() < ring_state::DRAINING {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(daemon_pid as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    bar.finish_and_clear();
    drop(children);
    let code = status.code().unwrap_or(-1);
    let summary = match Summary::read(&summary_path) {
        Ok(s) => s,
        Err(source) => {
            if code != 0 {
                return Err(RunError::DaemonFailed {
                    ring: cfg.ring.name.clone(),
                    code,
                });
            }
            return Err(RunError::Summary {
                path: summary_path.display().to_string(),
                source,
            });
        }
    };
    if args.summary.is_none() {
        let _ = std::fs::remove_file(&summary_path);
    }
    print_summary(&summary, args.loaders);
    Ok(Exit::from_code(code).unwrap_or(Exit::PeerDied))
}

/// Prints the human summary of a run.
pub fn print_summary(s: &Summary, loaders: usize) {
    let gb = s.bytes as f64 / 1e9;
    println!(
        "pinring run: ring {:?}, backend {} ({}), sink {}, {loaders} loaders",
        s.ring, s.backend, s.backend_reason, s.sink
    );
    println!(
        "  batches   {} delivered of {} ({} verified, {} failed, {} duplicates, {} out of order, {} missing)",
        s.batches_delivered,
        s.end_seq - s.start_seq,
        s.batches_verified,
        s.verify_failures,
        s.duplicates,
        s.out_of_order,
        s.missing
    );
    println!(
        "  moved     {gb:.3} GB in {:.3} s = {:.2} GB/s",
        s.seconds, s.gbps
    );
    println!(
        "  time      daemon waited for loaders {:.3} s; loaders waited for slots {:.3} s, worked {:.3} s (summed); sink busy {:.3} s",
        s.daemon_wait_seconds, s.loader_wait_seconds, s.loader_busy_seconds, s.sink_busy_seconds
    );
    let verdict = match s.bound.as_str() {
        "loaders" => {
            "loader-bound: the GPU side waited for batches; add loaders or make them faster"
        }
        "upload" => {
            "upload-bound: loaders waited for free slots; the copy to the device is the limit"
        }
        "consumer" => "consumer-bound: the sink is the limit",
        _ => "balanced: neither side waited much",
    };
    println!("  verdict   {verdict}");
    if s.interrupted {
        println!("  stopped early; resume with --start-seq {}", s.resume_seq);
        if s.delivered_past_resume > 0 {
            println!(
                "            ({} batches at or above it were delivered already and will be delivered again)",
                s.delivered_past_resume
            );
        }
    }
    if let Some(e) = &s.error {
        println!("  error     {e}");
    }
}
