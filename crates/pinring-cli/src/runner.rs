//! `pinring run`: one daemon and N loaders as child processes on one config, a progress bar, and a
//! human summary at the end. Children are this same executable started with its `daemon` and
//! `loader` subcommands, so `cargo run --bin pinring -- run` needs no other binary built.
//!
//! The children live and die with `run`: each is started with a parent-death signal (SIGTERM,
//! `stop_with_parent`), so a `run` killed outright (SIGKILL, OOM killer) leaves no daemon or
//! loader behind: the daemon drains and removes its segment, the loaders detach. A daemon child
//! that dies under `run` is named with its signal or exit code, its loaders are stopped, and the
//! segment it left behind is removed through `pinring clean`'s check ([`clean::clean_one`]).

use pinring_backend::BackendKind;
use pinring_daemon::parse_backend_kind;
use pinring_daemon::sink::SinkKind;
use pinring_daemon::summary::Summary;
use pinring_exit::Coded;
use pinring_exit::Exit;
use pinring_ops::clean::{self, Cleaned};
use pinring_ring::attach;
use pinring_ring::{ring_state, Access};
use pinring_runtime::children::{stop_with_parent, Children, Ended, Next, Supervisor};
use pinring_runtime::outln;
use pinring_runtime::settings::{self, Overrides};
use pinring_runtime::shutdown::Shutdown;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
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
    /// Epochs to run (overrides plan.epochs); 0: every epoch until stopped.
    #[arg(long)]
    pub epochs: Option<u32>,
    /// What consumes uploaded batches.
    #[arg(long, value_enum, default_value = "verify")]
    pub sink: SinkKind,
    /// GPU backend: auto, cuda or host.
    #[arg(long, default_value = "auto", value_parser = parse_backend_kind)]
    pub backend: BackendKind,
    /// CUDA device ordinal (default: the config's daemon.device, else 0).
    #[arg(long)]
    pub device: Option<usize>,
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
    /// The default sink (verify) on a dataset with nothing to verify against: said before
    /// anything is started, with the two sinks that work from `pinring run`.
    #[error(
        "{source_name}: dataset.kind = \"{kind}\" has no reference to verify its samples \
         against, and pinring run verifies by default: measure the pipeline with `pinring run \
         --sink discard`, or feed a trainer with `pinring run --sink consumer` and attach one \
         (`pinring consume --ring {ring}` or pinring.Loader(ring=\"{ring}\"))"
    )]
    NothingToVerify {
        /// Where the config came from.
        source_name: String,
        /// Its dataset kind.
        kind: String,
        /// The ring.
        ring: String,
    },
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
    /// The daemon ended before its ring was ready.
    #[error(
        "the daemon (pid {pid}) {ended} before ring {ring:?} was ready{}{}",
        ended.hint(),
        segment_note(.ring, .segment.as_deref())
    )]
    DaemonFailed {
        /// Ring name.
        ring: String,
        /// Its pid.
        pid: u32,
        /// How it ended.
        ended: Ended,
        /// What became of a segment it left (looked at only when it was killed by a signal:
        /// a daemon that exits on an error removes its own segment).
        segment: Option<Box<Cleaned>>,
    },
    /// The daemon did not make its ring ready in time; it was stopped.
    #[error(
        "the daemon (pid {pid}) did not make ring {ring:?} ready within {} s and was stopped; \
         run `pinring daemon --ring {ring} --log-level debug` alone to see where it waits",
        .waited.as_secs()
    )]
    NotReady {
        /// Ring name.
        ring: String,
        /// Its pid.
        pid: u32,
        /// How long run waited.
        waited: Duration,
    },
    /// The daemon ended while the ring was running, without a summary.
    #[error(
        "the daemon (pid {pid}) {ended} after ring {ring:?} had been running for {:.1} s{}; \
         its loaders were stopped{}",
        .running.as_secs_f64(),
        ended.hint(),
        segment_note(.ring, Some(&**.segment))
    )]
    DaemonDied {
        /// Ring name.
        ring: String,
        /// Its pid.
        pid: u32,
        /// How it ended.
        ended: Ended,
        /// How long the ring had been ready.
        running: Duration,
        /// What became of the segment it left.
        segment: Box<Cleaned>,
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

impl pinring_exit::Coded for RunError {
    /// Exit code.
    fn exit(&self) -> pinring_exit::Exit {
        match self {
            RunError::Config(_) | RunError::NothingToVerify { .. } => Exit::Config,
            RunError::Spawn { .. } => Exit::Internal,
            RunError::DaemonFailed { ended, .. } | RunError::DaemonDied { ended, .. } => {
                ended.exit()
            }
            RunError::NotReady { .. } => Exit::PeerDied,
            RunError::Ring(_) => Exit::Ring,
            RunError::Summary { .. } => Exit::PeerDied,
        }
    }
}

/// What became of a dead daemon's segment, as the tail of a sentence ("" when nothing is worth
/// saying: there was none, or a live daemon owns the name now).
fn segment_note(ring: &str, segment: Option<&Cleaned>) -> String {
    let path = pinring_ring::object_path(ring);
    let path = path.display();
    match segment {
        None | Some(Cleaned::Absent) | Some(Cleaned::Live { .. }) => String::new(),
        Some(Cleaned::Removed { .. }) => {
            format!("; the segment {path} it left behind was removed")
        }
        Some(Cleaned::Failed { error }) => format!(
            "; the segment {path} it left behind could not be removed ({error}); remove it with \
             `pinring clean {ring}` as its owner or as root"
        ),
        Some(Cleaned::Kept(why)) => {
            format!("; the file {path} was kept ({why}); remove it by hand once nothing uses it")
        }
    }
}

/// Runs the pipeline and prints the summary; returns the exit code.
///
/// Call it from a thread that lives as long as the process (`pinring run` calls it from its main
/// thread): the children's parent-death signal is tied to the thread that spawned them.
pub fn run(args: &RunArgs, shutdown: &Shutdown) -> Result<Exit, RunError> {
    let overrides = Overrides {
        ring: args.ring.clone(),
        epochs: args.epochs,
        unordered: args.unordered,
        ..Default::default()
    };
    let cfg = settings::load(args.config.as_deref(), &overrides)?;
    if args.sink == SinkKind::Verify && cfg.dataset.kind != pinring_data::DatasetKind::Synthetic {
        return Err(RunError::NothingToVerify {
            source_name: cfg.source.clone(),
            kind: cfg.dataset.kind.to_string(),
            ring: cfg.ring.name.clone(),
        });
    }
    let exe = pinring_runtime::this_program::get().map_err(|source| RunError::Spawn {
        what: "the daemon",
        exe: "<current executable>".into(),
        source,
    })?;
    // The daemon child writes its summary into a directory private to this run (mode 0700, a
    // random name): nobody else can plant a file or a link there. The user's --summary path is
    // written by this process afterwards, through `output::write_file`.
    let private = tempfile::Builder::new()
        .prefix("pinring-run-")
        .tempdir()
        .map_err(|source| RunError::Spawn {
            what: "the daemon",
            exe: "<a private directory for its summary>".into(),
            source,
        })?;
    let summary_path = private.path().join("summary.json");
    let mut common: Vec<String> = vec!["--ring".into(), cfg.ring.name.clone()];
    // The children get the file this process found, so that their own lookup (which also sees
    // --ring) cannot pick another one.
    let origin = settings::locate(args.config.as_deref(), args.ring.as_deref())?;
    if let Some(c) = origin.path() {
        common.extend(["--config".into(), c.display().to_string()]);
    }
    let spawner = Spawner {
        exe,
        common,
        // The children's info lines would scroll the progress bar away: unless the user chose
        // a log level, they log warnings and errors only, and the summary tells the rest.
        quiet: std::env::var_os("RUST_LOG").is_none(),
    };
    let daemon = spawner.daemon(args, &cfg, &summary_path)?;
    let daemon_pid = daemon.id();
    let mut children = Children(vec![daemon]);
    let ring = wait_for_ring(&mut children, &cfg.ring.name, daemon_pid)?;
    let ready_at = Instant::now();
    for _ in 0..args.loaders {
        children.0.push(spawner.loader()?);
    }
    let mut supervisor = Supervisor::new(args.loaders);
    let status = supervise(
        args,
        &cfg.ring.name,
        &ring,
        &mut children,
        &mut supervisor,
        &spawner,
        shutdown,
    )?;
    let running = ready_at.elapsed();
    drop(ring);
    // Stops (SIGTERM) and reaps the loaders; the daemon is reaped already.
    drop(children);
    let ended = Ended::of(status);
    let summary = Summary::read(&summary_path);
    let summary = match (ended, summary) {
        (Ended::Code(_), Ok(s)) => s,
        (Ended::Code(0), Err(source)) => {
            return Err(RunError::Summary {
                path: summary_path.display().to_string(),
                source,
            })
        }
        // Killed, or exited without a summary (a panic): it may have left its segment.
        (ended, _) => {
            return Err(RunError::DaemonDied {
                ring: cfg.ring.name.clone(),
                pid: daemon_pid,
                ended,
                running,
                segment: Box::new(clean::clean_one(&cfg.ring.name)),
            })
        }
    };
    Ok(finish(args, &summary, ended, &supervisor))
}

/// How the run's children are started: this program with the arguments they share.
struct Spawner {
    exe: pinring_runtime::this_program::ThisProgram,
    common: Vec<String>,
    /// Children log warnings and errors only (RUST_LOG unset).
    quiet: bool,
}

impl Spawner {
    /// A command of this program that stops with this thread, quiet where asked.
    fn command(&self) -> Command {
        let mut cmd = self.exe.command();
        if self.quiet {
            cmd.env("RUST_LOG", "warn");
        }
        // Every child is spawned from the thread that called `run`, which returns only after
        // every child has been reaped: their parent-death signal is tied to it.
        stop_with_parent(&mut cmd);
        cmd
    }

    /// Starts the daemon child, which writes its summary to `summary_path`.
    fn daemon(
        &self,
        args: &RunArgs,
        cfg: &pinring_data::Config,
        summary_path: &std::path::Path,
    ) -> Result<Child, RunError> {
        let mut cmd = self.command();
        cmd.arg("daemon")
            .args(&self.common)
            .args(["--sink", args.sink.name()])
            .args(["--backend", &args.backend.to_string()])
            .args(args.device.map(|d| format!("--device={d}")))
            .args(["--epochs", &cfg.plan.epochs.to_string()])
            .arg("--summary")
            .arg(summary_path)
            .stdin(Stdio::null());
        if !cfg.ring.in_order {
            cmd.arg("--unordered");
        }
        cmd.spawn().map_err(|source| RunError::Spawn {
            what: "the daemon",
            exe: self.exe.display(),
            source,
        })
    }

    /// Starts a loader child.
    fn loader(&self) -> Result<Child, RunError> {
        self.command()
            .arg("loader")
            .args(&self.common)
            .stdin(Stdio::null())
            .spawn()
            .map_err(|source| RunError::Spawn {
                what: "a loader",
                exe: self.exe.display(),
                source,
            })
    }
}

/// Waits for *our* daemon's ring `name` (a stale segment of the same name may exist until the
/// daemon replaces it), or for the daemon (`children.0[0]`, pid `daemon_pid`) to end.
fn wait_for_ring(
    children: &mut Children,
    name: &str,
    daemon_pid: u32,
) -> Result<pinring_ring::Ring, RunError> {
    let start = Instant::now();
    let ready_limit = Duration::from_secs(60);
    loop {
        if let Ok(Some(status)) = children.0[0].try_wait() {
            let ended = Ended::of(status);
            // A daemon that exits on an error removes its own segment; one killed by a signal
            // may leave it behind.
            let segment =
                matches!(ended, Ended::Signal { .. }).then(|| Box::new(clean::clean_one(name)));
            return Err(RunError::DaemonFailed {
                ring: name.into(),
                pid: daemon_pid,
                ended,
                segment,
            });
        }
        match attach(name, Access::ReadOnly, Duration::from_millis(200)) {
            Ok(r) if r.daemon().pid == daemon_pid => return Ok(r),
            Ok(_) | Err(_) if start.elapsed() < ready_limit => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(_) => {
                return Err(RunError::NotReady {
                    ring: name.into(),
                    pid: daemon_pid,
                    waited: ready_limit,
                })
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Watches the daemon until it ends, and supervises the loaders meanwhile (restarting those
/// that die, stopping the run when one fails); shows the progress bar. The daemon's status.
fn supervise(
    args: &RunArgs,
    name: &str,
    ring: &pinring_ring::Ring,
    children: &mut Children,
    supervisor: &mut Supervisor,
    spawner: &Spawner,
    shutdown: &Shutdown,
) -> Result<ExitStatus, RunError> {
    let daemon_pid = children.0[0].id();
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
    // With the consumer sink the batches wait for a training process: until one attaches, say
    // so, and how, at once and then every few seconds (the run would otherwise sit silent).
    let mut consumer_told: Option<Instant> = None;
    let status = loop {
        if args.sink == SinkKind::Consumer
            && consumer_told.is_none_or(|t| t.elapsed() >= TELL_CONSUMER_EVERY)
            && !ring.consumer_alive().unwrap_or(true)
        {
            bar.suspend(|| {
                pinring_runtime::logging::say(&format!(
                    "waiting for a consumer on ring {name:?}: attach one with `pinring consume \
                     --ring {name}` or pinring.Loader(ring=\"{name}\")"
                ))
            });
            consumer_told = Some(Instant::now());
        }
        // The daemon drains on its own SIGINT/SIGTERM (a terminal's Ctrl-C reaches the whole
        // process group); this loop watches it and supervises the loaders.
        if let Ok(Some(status)) = children.0[0].try_wait() {
            break status;
        }
        for i in 0..args.loaders {
            let Ok(Some(status)) = children.0[i + 1].try_wait() else {
                continue;
            };
            let pid = children.0[i + 1].id();
            match supervisor.ended(i, pid, Ended::of(status), Instant::now()) {
                Next::Restart => {
                    let child = spawner.loader()?;
                    tracing::warn!(
                        ring = %name, loader = i, old_pid = pid, pid = child.id(),
                        "loader {i} (pid {pid}) {}: restarted", Ended::of(status)
                    );
                    children.0[i + 1] = child;
                }
                Next::Leave => {}
                Next::StopRun => {
                    // The failure itself is printed once, in the summary's error line, with
                    // the resume point the drain gives.
                    tracing::warn!(ring = %name, loader = i, pid,
                        "loader {i} (pid {pid}) failed: stopping the run (the daemon drains; \
                         the summary says why)");
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(daemon_pid as i32),
                        nix::sys::signal::Signal::SIGTERM,
                    );
                }
            }
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
        // The daemon and every loader are looked at ten times a second: a child that ends is
        // reaped (no zombie) and acted on within 100 ms.
        std::thread::sleep(SUPERVISE_EVERY);
    };
    bar.finish_and_clear();
    Ok(status)
}

/// Prints the summary, writes it where --summary says; the run's exit code.
fn finish(args: &RunArgs, summary: &Summary, ended: Ended, supervisor: &Supervisor) -> Exit {
    print_summary(summary, args.loaders);
    // The run's code: the daemon's own when it failed; else that of a loader that failed (the
    // daemon then drained on the SIGTERM this loop sent it, and its summary has the resume
    // point).
    let mut exit = ended.exit();
    if let (Exit::Ok, Some(f)) = (exit, supervisor.failure()) {
        outln!(
            "  error     {f}; the run was stopped (resume with --start-seq {})",
            summary.resume_seq
        );
        exit = f.exit();
    }
    if let Some(path) = &args.summary {
        if let Err(e) = summary.write(path) {
            pinring_runtime::logging::fail(&e);
            if exit == Exit::Ok {
                exit = e.exit();
            }
        }
    }
    exit
}

/// How often `run --sink consumer` says it waits for a consumer while none is attached.
const TELL_CONSUMER_EVERY: Duration = Duration::from_secs(5);
/// How often `run` looks at its children.
const SUPERVISE_EVERY: Duration = Duration::from_millis(100);
/// Prints the human summary of a run on stdout; a stdout that cannot be written (a closed pipe)
/// loses the text, never the exit code.
pub fn print_summary(s: &Summary, loaders: usize) {
    pinring_runtime::out!("{}", summary_text(s, loaders));
}

/// The human summary of a run.
fn summary_text(s: &Summary, loaders: usize) -> String {
    // Writing into a String cannot fail.
    let mut out = String::new();
    let gb = s.bytes as f64 / 1e9;
    let _ = writeln!(
        out,
        "pinring run: ring {:?}, backend {} ({}), sink {}, {loaders} loaders",
        s.ring, s.backend, s.backend_reason, s.sink
    );
    let _ = writeln!(
        out,
        "  batches   {} delivered of {} ({} verified, {} failed, {} duplicates, {} out of order, {} missing)",
        s.batches_delivered,
        (s.end_seq - s.start_seq).div_ceil(s.parts_per_batch.max(1)),
        s.batches_verified,
        s.verify_failures,
        s.duplicates,
        s.out_of_order,
        s.missing
    );
    let _ = writeln!(
        out,
        "  moved     {gb:.3} GB in {:.3} s = {:.2} GB/s",
        s.seconds, s.gbps
    );
    if let Some(first) = s.first_batch_seconds {
        let _ = writeln!(
            out,
            "  first     batch delivered {:.1} ms after the ring was ready ({})",
            first * 1e3,
            match s.parts_per_batch {
                0 | 1 => "one slot".to_string(),
                n => format!("{n} parts, filled in parallel"),
            }
        );
    }
    let flag = |name: &str| {
        if s.untrusted.iter().any(|u| u == name) {
            " (untrusted)"
        } else {
            ""
        }
    };
    let _ = writeln!(
        out,
        "  time      daemon waited for loaders {:.3} s; loaders waited for slots {:.3} s{}, worked {:.3} s{} (summed); sink busy {:.3} s",
        s.daemon_wait_seconds,
        s.loader_wait_seconds,
        flag("loader_wait_seconds"),
        s.loader_busy_seconds,
        flag("loader_busy_seconds"),
        s.sink_busy_seconds
    );
    if !s.untrusted.is_empty() {
        let _ = writeln!(
            out,
            "  untrusted {}: what the ring's loader table said is impossible for this run (another \
             process wrote into it?); shown bounded to what could be true, not as reported",
            s.untrusted.join(", ")
        );
    }
    let verdict = pinring_observe::explain(&s.bound);
    let _ = writeln!(out, "  verdict   {verdict}");
    if s.interrupted {
        let _ = writeln!(
            out,
            "  stopped early; resume with --start-seq {}",
            s.resume_seq
        );
        if s.delivered_past_resume > 0 {
            let _ = writeln!(
                out,
                "            ({} batches at or above it were delivered already and will be delivered again)",
                s.delivered_past_resume
            );
        }
    }
    if let Some(e) = &s.error {
        let _ = writeln!(out, "  error     {e}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_names_the_first_batchs_latency_and_layout_when_one_was_delivered() {
        let mut s = Summary {
            first_batch_seconds: Some(0.0123),
            parts_per_batch: 8,
            ..Summary::default()
        };
        let text = summary_text(&s, 8);
        assert!(
            text.contains("first     batch delivered 12.3 ms after the ring was ready (8 parts, filled in parallel)"),
            "{text}"
        );
        s.parts_per_batch = 1;
        assert!(summary_text(&s, 8).contains("ready (one slot)"));
        s.first_batch_seconds = None;
        assert!(!summary_text(&s, 8).contains("first "));
    }

    #[test]
    fn the_message_for_a_daemon_killed_while_running_names_pid_signal_time_and_segment() {
        let e = RunError::DaemonDied {
            ring: "r0".into(),
            pid: 4242,
            ended: Ended::Signal {
                signal: 9,
                core: false,
            },
            running: Duration::from_millis(2_140),
            segment: Box::new(Cleaned::Removed { daemon_pid: 4242 }),
        };
        assert_eq!(
            e.to_string(),
            "the daemon (pid 4242) was killed by signal 9 (SIGKILL) after ring \"r0\" had been \
             running for 2.1 s; its loaders were stopped; the segment /dev/shm/pinring.r0 it \
             left behind was removed"
        );
        assert_eq!(e.exit(), Exit::PeerDied);
    }
}
