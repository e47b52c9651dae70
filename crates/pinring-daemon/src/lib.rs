//! The GPU daemon: creates the ring, registers it with the backend, hands out seqs, uploads
//! committed batches (in seq order by default), frees slots, feeds the sink, takes slots back
//! from dead loaders, and drains cleanly on SIGTERM/SIGINT.
//!
//! Threads: the main loop (this module), the backend's upload/completion thread (which rings the
//! doorbell after sending completions), and the sink thread (verify, compute). The main loop owns
//! every slot transition the daemon makes, so the protocol needs no locks.
//!
//! Files: `args.rs` (the command line), `start.rs` (ring, registration, upload engine, sink
//! thread), `sequencer.rs` (the books of seqs and slots, no I/O), the stages the main loop runs,
//! each owning its state: `intake.rs` (taking READY slots, checking them against the plan),
//! `uploads.rs` (submissions and completions), `delivery.rs` and `handoff.rs` (the sink, the
//! consumer), `drain.rs` (a stop request), `recovery.rs` (dead and hung loaders, quarantine,
//! re-issue, bad batches, the descriptor audit), `publish.rs` (the tally and the header's
//! counters); `finish.rs` (the summary and its verdict). This module holds the error type, the
//! daemon's state and its main loop. docs/ARCHITECTURE.md, "The daemon's stages", has the
//! order of a pass.
//!
//! Beside the main loop, the parts only the daemon runs: the sink thread (`sink`), the doorbell
//! the completion thread rings (`ring_wake`), the latency histograms (`histogram`), the run
//! summary (`summary`), the service side under systemd and the metrics endpoint (`service`,
//! `metrics`). The metrics read a ring's counters through pinring-observe, as `pinring status` and
//! the Python consumer do. An embedded daemon (pinring-client's `EmbeddedDaemon`) is
//! this main loop on a thread of the training process.

pub mod histogram;
pub mod metrics;
pub mod ring_wake;
pub mod service;
pub mod sink;
pub mod summary;

use crate::sink::SinkKind;
use crate::summary::Summary;
use pinring_backend::Uploader;
use pinring_data::{BatchLayout, Config, Plan};
use pinring_exit::{Coded, Exit};
use pinring_ring::{DaemonRing, RingError};
use pinring_runtime::settings::{self, Overrides, Spelling};
use pinring_runtime::shutdown::Shutdown;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod args;
mod delivery;
mod drain;
mod finish;
mod handoff;
mod intake;
mod publish;
mod recovery;
mod reorder;
mod sequencer;
mod start;
mod uploads;

pub use args::{parse_backend_kind, DaemonArgs, RunOptions};
use delivery::Delivery;
pub use drain::DRAIN_DEADLINE;
pub use finish::cpu_seconds;
pub use finish::{failed_at_start, judge, Known};
use publish::{Tally, Unpublished};
use sequencer::{HandOut, Sequencer};
pub use start::default_upload_buffers;
use uploads::{Assembly, Uploads};

/// Body of `pinring-daemon` / `pinring daemon`: runs, writes the summary (also when start-up
/// failed: with `error` and `exit_code`), logs the outcome.
pub fn main(args: &DaemonArgs, shutdown: std::io::Result<Shutdown>) -> Exit {
    let outcome = match shutdown {
        Ok(shutdown) => run(args, &shutdown),
        Err(e) => failed_at_start(
            &args.options(),
            Known::Flags(&args.overrides()),
            DaemonError::Internal {
                ring: args.ring.clone().unwrap_or_default(),
                what: format!("cannot install the SIGTERM/SIGINT handlers: {e}"),
            },
        ),
    };
    let Outcome {
        summary: mut s,
        started,
        mut result,
    } = outcome;
    if started && result.is_ok() {
        result = judge(&s, args.sink);
    }
    if let Err(e) = &result {
        s.error = Some(e.to_string());
        s.exit_code = e.exit().code();
    }
    if started {
        tracing::info!(
            ring = %s.ring,
            batches = s.batches_delivered,
            verified = s.batches_verified,
            gbps = format!("{:.2}", s.gbps),
            bound = %s.bound,
            "run finished"
        );
    }
    let mut exit = Exit::Ok;
    if let Some(path) = &args.summary {
        if let Err(e) = s.write(path) {
            tracing::error!("{e}");
            exit = e.exit();
        }
    }
    match result {
        Ok(()) => exit,
        Err(e) if started => {
            tracing::error!(
                "{e}; resume with --start-seq {} (the summary's resume_seq)",
                s.resume_seq
            );
            e.exit()
        }
        Err(e) => {
            tracing::error!("{e}");
            e.exit()
        }
    }
}

/// Longest single futex wait of the main loop.
const MAX_WAIT: Duration = Duration::from_millis(100);
/// Payload bytes in flight from which the main loop sleeps without being woken by commits
/// (`DaemonRing::wait_doorbell_quiet`), unless the device buffers hold less
/// ([`quiet_in_flight`]): at least two of the completion thread's waits (4 MiB each), so
/// when the next completion wakes the loop the copy engine still has work queued while the loop
/// takes every part committed meanwhile. Below it each commit wakes the loop at once.
const QUIET_IN_FLIGHT: usize = 8 << 20;

/// Why the daemon stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// Bad config.
    #[error(transparent)]
    Config(#[from] pinring_data::ConfigError),
    /// The config does not resolve (its files, the plan, `ring.group`: `Spec::resolve`).
    #[error(transparent)]
    Resolve(#[from] pinring_data::ResolveError),
    /// The spec cannot be stored in the ring (a consumer's ring stores it).
    #[error(transparent)]
    StoredSpec(#[from] pinring_data::StoredSpecError),
    /// `--start-seq` lies past the end of the plan.
    #[error("ring {ring:?}: {given} is past the end of the plan ({end_seq} seqs, 0 to {last}, one per batch part, from {source_name}); pass a {option} of at most {end_seq} (a summary's resume_seq), or run more epochs ({epochs})", given = .spelling.set("start-seq", .start_seq), option = .spelling.option("start-seq"), epochs = .spelling.option("epochs"), last = .end_seq.saturating_sub(1))]
    StartSeq {
        /// Ring name.
        ring: String,
        /// The flag's value.
        start_seq: u64,
        /// One past the plan's last seq.
        end_seq: u64,
        /// Config source.
        source_name: String,
        /// How the options are named: the daemon's flags, or an embedded daemon's keywords.
        spelling: Spelling,
    },
    /// Ring error.
    /// `--start-seq` falls inside a batch that spans slots.
    #[error("ring {ring:?}: {given} is part {part} of a batch cut into {parts} parts (seqs count parts); pass the first part of a batch, a multiple of {parts} such as {down} (a summary's resume_seq always is one)", given = .spelling.set("start-seq", .start_seq), part = .start_seq % .parts, down = .start_seq / .parts * .parts)]
    StartSeqInBatch {
        /// Ring name.
        ring: String,
        /// The requested start.
        start_seq: u64,
        /// Parts per batch.
        parts: u64,
        /// How the options are named: the daemon's flags, or an embedded daemon's keywords.
        spelling: Spelling,
    },
    /// A `--prefetch` a consumer cannot be handed (the config's `daemon.prefetch` is a
    /// `Config` error: `Config::check_consumer_prefetch`).
    #[error("ring {ring:?}: --prefetch = {value} is not allowed: {rule}; pass a --prefetch within that range", rule = pinring_data::config::consumer_prefetch_rule())]
    Prefetch {
        /// Ring name.
        ring: String,
        /// The value.
        value: u32,
    },
    #[error(transparent)]
    Ring(#[from] RingError),
    /// Backend error.
    #[error(transparent)]
    Backend(#[from] pinring_backend::BackendError),
    /// A slot held something the daemon must not upload.
    #[error("ring {ring:?}: {what}; stopping (run with a fixed loader, or report the bug)")]
    BadBatch {
        /// Ring name.
        ring: String,
        /// What was wrong.
        what: String,
    },
    /// A loader could not read a sample of the plan (`dataset.on_bad_sample = "fail"`).
    #[error("ring {ring:?}: a loader cannot make seq {seq} from the dataset: {message}; the run stops (resume at the summary's resume_seq once the data is fixed, or set dataset.on_bad_sample = \"skip\" to substitute zeros)")]
    DataFailed {
        /// Ring name.
        ring: String,
        /// The part's seq.
        seq: u64,
        /// The loader's message, as it wrote it into the slot (sanitised).
        message: String,
    },
    /// A sample carried encoded did not decode (`dataset.on_bad_sample = "fail"`).
    #[error("ring {ring:?}: sample {sample} of seq {seq} did not decode ({origin}): {problem}; the run stops (resume at the summary's resume_seq once the data is fixed, or set dataset.on_bad_sample = \"skip\" to substitute zeros)")]
    DecodeFailed {
        /// Ring name.
        ring: String,
        /// The part's seq.
        seq: u64,
        /// The sample's index in its part.
        sample: u32,
        /// Its file and member, as its entry names them.
        origin: String,
        /// What failed.
        problem: String,
    },
    /// Verification failed.
    #[error("ring {ring:?}: verification failed: {first} ({failures} batches failed, {duplicates} duplicates, {out_of_order} out of order, {missing} missing)")]
    Verify {
        /// Ring name.
        ring: String,
        /// First failure message.
        first: String,
        /// Failures.
        failures: u64,
        /// Duplicates.
        duplicates: u64,
        /// Out of order.
        out_of_order: u64,
        /// Missing.
        missing: u64,
    },
    /// The service layer (metrics endpoint) could not start.
    #[error("ring {ring:?}: {source}")]
    Service {
        /// Ring name.
        ring: String,
        /// The error.
        #[source]
        source: crate::service::ServiceError,
    },
    /// A daemon thread died.
    #[error("ring {ring:?}: internal error: {what}")]
    Internal {
        /// Ring name.
        ring: String,
        /// What happened.
        what: String,
    },
}

impl pinring_exit::Coded for DaemonError {
    fn exit(&self) -> pinring_exit::Exit {
        match self {
            DaemonError::Config(_)
            | DaemonError::Prefetch { .. }
            | DaemonError::DataFailed { .. }
            | DaemonError::DecodeFailed { .. } => Exit::Config,
            DaemonError::Resolve(e) => e.exit(),
            DaemonError::StoredSpec(e) => e.exit(),
            DaemonError::StartSeq { .. } | DaemonError::StartSeqInBatch { .. } => Exit::Usage,
            DaemonError::Ring(e) => e.exit(),
            DaemonError::Service { .. } => Exit::Config,
            DaemonError::BadBatch { .. } => Exit::Ring,
            DaemonError::Backend(_) => Exit::Backend,
            DaemonError::Verify { .. } => Exit::Verify,
            DaemonError::Internal { .. } => Exit::Internal,
        }
    }
}

/// How a daemon run ended: always with a summary (for `--summary`), and the error, if any.
#[derive(Debug)]
pub struct Outcome {
    /// What the run did; for a start-up failure, what was known (ring, sink, seqs), zero
    /// counters, `bound` "none". `error` and `exit_code` are filled by [`crate::main`].
    pub summary: Summary,
    /// Whether the ring was made and the main loop ran (false: start-up failed).
    pub started: bool,
    /// The error that ended the run.
    pub result: Result<(), DaemonError>,
}

/// Runs the daemon of `pinring-daemon`'s flags to completion: its spec resolved from the
/// config file and the flags ([`resolve`]), then [`serve`]d.
pub fn run(args: &DaemonArgs, shutdown: &Shutdown) -> Outcome {
    let opts = args.options();
    let overrides = args.overrides();
    let spec = match resolve(args.config.as_deref(), &overrides, false) {
        Ok(spec) => spec,
        Err(n) => {
            let known = n
                .known
                .as_ref()
                .map_or(Known::Flags(&overrides), Known::Config);
            return failed_at_start(&opts, known, n.error);
        }
    };
    let cfg = spec.config();
    if args.sink == SinkKind::Verify && cfg.dataset.kind != pinring_data::DatasetKind::Synthetic {
        let e = pinring_data::ConfigError::Invalid {
            source_name: cfg.source.clone(),
            key: "dataset.kind",
            value: format!("\"{}\"", cfg.dataset.kind),
            allowed: format!(
                "--sink verify checks synthetic samples against their generator; the samples \
                 of other kinds have no reference here: use --sink discard, or --sink consumer \
                 and attach a trainer (pinring consume --ring {0} or pinring.Loader(ring=\"{0}\"))",
                cfg.ring.name
            ),
        };
        return failed_at_start(&opts, Known::Config(cfg), e.into());
    }
    serve(spec, &opts, shutdown)
}

/// Why [`resolve`] gave no spec: the error, and the settings with their overrides applied
/// where those are valid (what the summary of a daemon that failed at start reports).
#[derive(Debug)]
pub struct NotResolved {
    /// The error.
    pub error: DaemonError,
    /// The settings with the overrides applied; `None` where they could not be read or the
    /// overrides make them invalid.
    pub known: Option<Config>,
}

/// Resolves the spec a daemon runs, once, at start: the settings of the config file found by
/// the lookup (`config`, else `$PINRING_CONFIG`, ...), with `overrides` and the environment's,
/// resolved by [`pinring_data::Spec::resolve`] (the one resolution that `pinring config check`
/// and Python's `check_config` make too): a file kind's source is opened once, here, and its
/// length becomes dataset.samples (in the fingerprint, and in the config stored for consumers;
/// each loader opens its own and must find the same); "auto" is resolved for this host's cache,
/// once, and published in the ring header (loaders adopt it from there instead of reading their
/// own host's cache); every rule is checked. Unreadable or mismatched files stop the start.
///
/// `paths_absolute`: an anonymous ring's loaders are given the config the ring holds, written
/// elsewhere (`pinring.Loader(loaders=N)`), not this file, so its paths are stored absolute.
pub fn resolve(
    config: Option<&std::path::Path>,
    overrides: &Overrides,
    paths_absolute: bool,
) -> Result<pinring_data::Spec, Box<NotResolved>> {
    let found = settings::find(config, overrides).map_err(|e| {
        Box::new(NotResolved {
            error: e.into(),
            known: None,
        })
    })?;
    resolve_found(found, paths_absolute)
}

/// [`resolve`] of settings already found (a file's, or those an embedding program gives as
/// data: [`settings::given`]).
pub fn resolve_found(
    found: settings::Found,
    paths_absolute: bool,
) -> Result<pinring_data::Spec, Box<NotResolved>> {
    let warn_sets_nothing = |ring: &str| {
        if let Some(w) = found.settings.sets_nothing_warning() {
            tracing::warn!(ring = %ring, "{w}");
        }
    };
    let failed = |error: DaemonError| {
        let mut known = found.applied().ok();
        if let Some(cfg) = &mut known {
            warn_sets_nothing(&cfg.ring.name);
            if paths_absolute {
                let _ = cfg.make_paths_absolute();
            }
        }
        Box::new(NotResolved { error, known })
    };
    let mut given = found.settings.clone();
    if paths_absolute {
        if let Err(e) = given.make_paths_absolute() {
            return Err(failed(e.into()));
        }
    }
    let host = pinring_runtime::host_memory::HostMemory::read();
    let facts = pinring_data::HostFacts {
        gpu_decode: found
            .applied()
            .is_ok_and(|c| pinring_backend::cuda::decode_auto_on_gpu(&c)),
        ..host.facts()
    };
    let spec =
        pinring_data::Spec::resolve(given, &found.overrides, &facts, &pinring_sources::Files)
            .map_err(|e| failed(e.into()))?;
    let cfg = spec.config();
    warn_sets_nothing(&cfg.ring.name);
    if let Some(n) = spec.source_len() {
        tracing::info!(ring = %cfg.ring.name, kind = %cfg.dataset.kind, samples = n, "dataset opened");
    }
    if let Some(a) = spec.auto() {
        tracing::info!(ring = %cfg.ring.name, "{}", a.line(cfg, &host.cache_origin()));
    }
    Ok(spec)
}

/// Runs the daemon on a resolved spec to completion: start-up ([`RunOptions`] say how), the
/// main loop until the plan ends or `shutdown` is requested, the summary. The daemon's binary
/// and an embedded daemon (pinring-client) both run this.
pub fn serve(spec: pinring_data::Spec, opts: &RunOptions, shutdown: &Shutdown) -> Outcome {
    let cfg = spec.config().clone();
    match Daemon::start(opts, spec) {
        Ok(mut d) => {
            let result = d.main_loop(shutdown);
            d.core.publish_counters();
            let summary = d.finish(&result);
            Outcome {
                summary,
                started: true,
                result,
            }
        }
        Err(e) => failed_at_start(opts, Known::Config(&cfg), e),
    }
}

/// The clock of one main-loop pass, read once at its start: the pass stamps every slot it frees
/// or takes, and every batch it sees land or deliver, with it, instead of reading the clock for
/// each (at 64 KiB slots the reads were a tenth of the loop's time). A pass lasts microseconds,
/// a long dispatch pass a millisecond at most; what these stamps feed (statistics, status,
/// informational descriptor words) is coarser than that.
#[derive(Debug, Clone, Copy)]
struct PassClock {
    at: Instant,
    ns: u64,
}

impl PassClock {
    fn read() -> PassClock {
        PassClock {
            at: Instant::now(),
            ns: pinring_ring::clock::monotonic_ns(),
        }
    }

    /// `t` on the monotonic clock loaders stamp commits with (`pinring_ring::clock`).
    fn ns_of(&self, t: Instant) -> u64 {
        match t.checked_duration_since(self.at) {
            Some(after) => self.ns.saturating_add(after.as_nanos() as u64),
            None => self
                .ns
                .saturating_sub(self.at.duration_since(t).as_nanos() as u64),
        }
    }
}

/// What a run is, fixed when the daemon starts: the settings, the plan and the batch layout,
/// what they work out to per part, and how the backend and the sink take the batches. Read by
/// every part of the main loop, written by none.
struct Run {
    cfg: Config,
    /// The backend in use and why it was chosen (for the summary).
    backend_name: String,
    backend_reason: String,
    plan: Plan,
    /// Where each field of a batch goes in its device buffer.
    layout: BatchLayout,
    /// The config's metadata reserve and first field's bytes per sample, worked out once: every
    /// taken part's metadata is decoded within the one and checked against the other.
    meta_reserve: usize,
    sample_bytes: u64,
    /// Parts (seqs) per batch.
    parts: u64,
    zero_copy: bool,
    /// The consumer copies each batch out of its slots (`daemon.copies = "consumer"`): the
    /// daemon uploads nothing, lists each batch's slots in the part table, and holds them until
    /// the batch's buffer comes back.
    consumer_copies: bool,
    /// In order: how many waiting parts past one not READY the daemon looks at for one to
    /// take ahead (`--look-ahead`; 0 where batches are taken in seq order only).
    look_ahead: usize,
    /// The consumer runs in this process (embedded) and keeps the memory of the batches it
    /// holds alive itself (it holds the upload engine, or the ring's mapping): a drain does not
    /// wait for them.
    holds_own_buffers: bool,
    /// Payload bytes in flight from which the main loop sleeps quietly ([`quiet_in_flight`]).
    quiet_in_flight: usize,
}

impl Run {
    /// Whether this daemon's engine decodes the ring's images (carried encoded, and copied by
    /// the daemon rather than by the trainer's copier).
    fn decodes(&self) -> bool {
        self.layout.encoded_field().is_some() && !self.consumer_copies
    }
}

/// Payload bytes in flight from which the main loop sleeps without being woken by commits:
/// [`QUIET_IN_FLIGHT`], or half of what the device buffers hold when that is less. Small batches
/// in 128 buffers of 64 KiB hold 8 MiB in all, so the fixed 8 MiB was reached only with every
/// buffer in flight, and each commit woke the loop; with half the buffers in flight the next
/// completion (an event covers at most half the buffers) still leaves copies queued.
/// Never 0: with nothing in flight no completion would come to wake the loop (an engine with no
/// buffers, as when the consumer copies, never sleeps quietly).
fn quiet_in_flight(buffers: usize, buffer_bytes: usize) -> usize {
    QUIET_IN_FLIGHT
        .min(buffers.saturating_mul(buffer_bytes) / 2)
        .max(1)
}

/// What the stages share, owned by the main loop and lent to each stage's entry point: the
/// ring handle, what the run is, the service, the sequencer's books, what the run did and what
/// is not published yet, the pass clock, and the upload engine.
struct Core {
    // Fields drop top to bottom, and these three must go in this order: the upload engine first
    // (its drop waits for copies still running), then the registration (unregistering memory no
    // copy reads any more), then this handle on the ring's mapping.
    uploader: Arc<dyn Uploader>,
    /// The ring's registration with the backend (None: --no-register).
    registration: Option<pinring_backend::Registration>,
    ring: Arc<DaemonRing>,
    /// What this run is: its settings, plan and layout, fixed at start.
    run: Run,
    service: crate::service::DaemonService,
    // Protocol state, owned by the main loop.
    /// Which seq each slot carries, what comes next, what was delivered (daemon/sequencer.rs).
    sequencer: Sequencer,
    /// What the run did, for the summary.
    tally: Tally,
    /// The header's counters not yet published (`Core::publish_counters`).
    unpublished: Unpublished,
    /// This pass's clock (`PassClock`).
    now: PassClock,
    /// Spare sample-id vectors, reused by every stage (daemon/intake.rs).
    ids: intake::SpareIds,
}

/// The daemon: the shared core and the stages' states side by side. The core comes first, so
/// that it drops first: the upload engine, the registration and the ring handle in its order.
struct Daemon {
    core: Core,
    /// The sink thread and the channels to it, and the batches handed to a consumer
    /// (daemon/delivery.rs, daemon/handoff.rs).
    delivery: Delivery,
    /// Parts on their way to the device (or, when the consumer copies, to the consumer) and the
    /// batch buffers they go to.
    up: Uploads,
    /// The intake stage's own buffer (daemon/intake.rs).
    intake: intake::Intake,
    /// The drain, once one began (daemon/drain.rs).
    drain: drain::Drain,
    /// Fault handling and when it runs (daemon/recovery.rs).
    recovery: recovery::Recovery,
}

impl Core {
    /// Gives `slot` its next seq (a seq that lost its slot first), or parks it when the plan is
    /// handed out or the daemon drains. A quarantined slot stays out of use.
    fn hand_out(&mut self, slot: u32) {
        let next = self.sequencer.hand_out(slot);
        self.apply_hand_out(slot, next);
    }

    /// Does in the ring what the sequencer answered for `slot`.
    fn apply_hand_out(&mut self, slot: u32, next: HandOut) {
        match next {
            HandOut::Assign(seq) => {
                self.ring.publish_next_assign(self.sequencer.next_assign());
                self.ring.assign_at(slot, seq, self.now.ns);
            }
            HandOut::Park => self.ring.park(slot),
            HandOut::Quarantined => {}
        }
    }
}

impl Daemon {
    /// The main loop: each pass runs the stages in the order a part travels back from the
    /// device (so that what a pass frees is reused in the same pass), then the drain, the
    /// recovery's chores and publishing, and sleeps on the doorbell when no stage moved. Each
    /// stage is given the core and, where it hands work on, the stage downstream.
    fn main_loop(&mut self, shutdown: &Shutdown) -> Result<(), DaemonError> {
        let Daemon {
            core,
            delivery,
            up,
            intake,
            drain,
            recovery,
        } = self;
        loop {
            // A ring after this load is never lost: the wait below returns at once.
            let seen = core.ring.doorbell_seen();
            core.tally.passes += 1;
            core.now = PassClock::read();
            core.service.tick(&core.ring, core.now.at);
            // Uploads: completions free slots and pass whole batches on to delivery.
            let mut progressed = up.poll(core, delivery, recovery)?;
            // Delivery: batches back from the sink thread, buffers back from the consumer.
            progressed |= delivery.poll(core, up, recovery)?;
            // Intake: READY slots taken, checked and submitted.
            progressed |= intake.poll(core, up, delivery, recovery)?;

            if core.sequencer.complete() && up.inflight.is_empty() && delivery.sink.pending == 0 {
                return Ok(());
            }
            if shutdown.requested() && !drain.started() {
                drain.begin(core, delivery, up);
            }
            if drain.started() && drain.may_end_now(core, delivery, up) {
                return drain.end(core, delivery, up, recovery);
            }
            // Recovery: a reap every reap interval, the live loaders counted between.
            recovery.poll(core)?;
            // Publishing, once a pass, after its reap; a pass that returns above leaves it to
            // `run`.
            core.publish_counters();
            if !progressed {
                sleep(core, up, drain, seen)?;
            }
        }
    }
}

/// Sleeps on the doorbell (rung since `seen`: at once) for at most [`MAX_WAIT`], or what is
/// left of a drain; quietly (not woken by commits) while enough is in flight
/// ([`quiet_in_flight`]). The time counts as the daemon's wait where it could have uploaded.
fn sleep(
    core: &mut Core,
    up: &Uploads,
    drain: &drain::Drain,
    seen: u32,
) -> Result<(), DaemonError> {
    let could_upload = (!up.free_buffers.is_empty() || up.assemblies.any_open_for_parts())
        && core.sequencer.any_waiting();
    let wait = drain.longest_wait(MAX_WAIT, Instant::now);
    // Parts submitted deferred get their upload signal now: their completions are
    // what may wake this wait.
    let t = Instant::now();
    let flushed = core.uploader.flush();
    core.tally.submit_ns += t.elapsed().as_nanos() as u64;
    flushed?;
    let t = Instant::now();
    let woke = if up.inflight_bytes >= core.run.quiet_in_flight {
        core.ring.wait_doorbell_quiet(seen, wait)
    } else {
        core.ring.wait_doorbell(seen, wait)
    };
    if woke != pinring_ring::futex::Wake::Changed {
        core.tally.sleeps += 1;
    }
    let ns = t.elapsed().as_nanos() as u64;
    core.tally.doorbell_ns += ns;
    if could_upload {
        core.tally.daemon_wait_ns += ns;
        core.ring.add_daemon_wait(ns);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_loop_sleeps_quietly_from_half_the_buffers_or_8_mib_and_never_with_nothing_in_flight() {
        use super::{quiet_in_flight, QUIET_IN_FLIGHT};
        // 64 KiB batches in 128 buffers: 8 MiB in all, quiet from half of it.
        assert_eq!(quiet_in_flight(128, 64 << 10), 4 << 20);
        // Larger buffers keep the fixed threshold.
        assert_eq!(quiet_in_flight(128, 256 << 10), QUIET_IN_FLIGHT);
        assert_eq!(quiet_in_flight(16, 4 << 20), QUIET_IN_FLIGHT);
        // No buffers (the consumer copies): commits always wake the loop.
        assert_eq!(quiet_in_flight(0, 0), 1);
        assert_eq!(quiet_in_flight(0, 64 << 10), 1);
    }
}
