//! The GPU daemon: creates the ring, registers it with the backend, hands out seqs, uploads
//! committed batches (in seq order by default), frees slots, feeds the sink, takes slots back
//! from dead loaders, and drains cleanly on SIGTERM/SIGINT.
//!
//! Threads: the main loop (this module), the backend's upload/completion thread (which rings the
//! doorbell after sending completions), and the sink thread (verify, compute). The main loop owns
//! every slot transition the daemon makes, so the protocol needs no locks.
//!
//! Files: `args.rs` (the command line), `start.rs` (ring, registration, upload engine, sink
//! thread), `sequencer.rs` (the books of seqs and slots, no I/O), `dispatch.rs` (taking READY slots, uploads, completions, the sink), `recovery.rs`
//! (dead and hung loaders, quarantine, re-issue, bad batches, the descriptor audit), `finish.rs`
//! (the summary and its verdict); this module holds the error type, the daemon's state and its
//! main loop.
//!
//! Beside the main loop, the parts only the daemon runs: the sink thread (`sink`), the doorbell
//! the completion thread rings (`ring_wake`), the latency histograms (`histogram`), the run
//! summary (`summary`), the service side under systemd and the metrics endpoint (`service`,
//! `metrics`), and the reading of a ring's counters that the metrics, `pinring status` and the
//! Python consumer share (`observe`). An embedded daemon (pinring-client's `EmbeddedDaemon`) is
//! this main loop on a thread of the training process.

pub mod histogram;
pub mod metrics;
pub mod observe;
pub mod ring_wake;
pub mod service;
pub mod sink;
pub mod summary;

use crate::sink::{SinkDone, SinkJob, SinkKind};
use crate::summary::Summary;
use crossbeam_channel::Receiver;
use pinring_backend::{Completion, Uploader};
use pinring_data::{BatchLayout, Config, Plan};
use pinring_exit::{Coded, Exit};
use pinring_ring::{ring_state, DaemonRing, RingError};
use pinring_runtime::settings::{self, Overrides, Spelling};
use pinring_runtime::shutdown::Shutdown;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering::{Acquire, Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod args;
mod dispatch;
mod finish;
mod handoff;
mod recovery;
mod reorder;
mod sequencer;
mod start;

pub use args::{parse_backend_kind, DaemonArgs, RunOptions};
pub use finish::cpu_seconds;
pub use finish::{failed_at_start, judge, Known};
use sequencer::{HandOut, Sequencer};
pub use start::default_upload_buffers;

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

/// How long a drain may take before the daemon closes the ring anyway.
pub const DRAIN_DEADLINE: Duration = Duration::from_millis(1500);
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
            | DaemonError::DataFailed { .. } => Exit::Config,
            DaemonError::Resolve(e) => e.exit(),
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
        cache_bytes: host.cache_bytes(),
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
        tracing::info!(ring = %cfg.ring.name, "{}", host.auto_line(cfg, a));
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
            d.publish_counters();
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

/// The daemon's end of its sink: which sink, the thread that runs it and the channels to it.
struct SinkLink {
    kind: SinkKind,
    /// Jobs to the sink thread (None once closed, at finish).
    tx: Option<crossbeam_channel::Sender<SinkJob>>,
    /// Its results.
    rx: Receiver<SinkDone>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Batches at the sink (or handed to a consumer) not yet back.
    pending: usize,
}

/// How often the main loop counts the live loaders between reaps ([`Tally::count_loaders`]).
const COUNT_LOADERS_EVERY: std::time::Duration = std::time::Duration::from_millis(10);

/// What a run did, for its summary: clocks, counts and times the main loop keeps. Only the
/// main loop writes it; nothing in it is read back from the segment.
struct Tally {
    started: Instant,
    /// CPU seconds used before the ring was ready (start-up, registration).
    cpu_at_ready: f64,
    /// Each thread's CPU seconds when the ring became ready (`finish::thread_cpu`).
    threads_at_ready: std::collections::BTreeMap<i32, (String, f64)>,
    last_delivery: Instant,
    /// When the first batch was delivered (the first batch's latency, from `started`).
    first_delivery: Option<Instant>,
    verified: u64,
    verify_failures: u64,
    first_failure: Option<String>,
    bytes: u64,
    sink_busy_ns: u64,
    /// Uploads in flight, summed over uploads (what the header's `upload_ns` gets).
    upload_ns: u64,
    daemon_wait_ns: u64,
    /// Time the main loop spent inside the backend's submit calls, and asleep on the doorbell.
    submit_ns: u64,
    doorbell_ns: u64,
    /// Parts taken while an earlier one was not READY yet (`--look-ahead`).
    taken_ahead: u64,
    /// Passes of the main loop, and its waits on the doorbell that slept (a wait that found
    /// the doorbell rung since the pass began returns at once and is not counted).
    passes: u64,
    sleeps: u64,
    /// The main loop thread's preemptions when the ring became ready (`finish::preemptions`;
    /// the daemon starts, runs and finishes on one thread).
    preempted_at_ready: Option<u64>,
    /// Commit-to-on-device latencies (bounded memory, however long the daemon runs).
    latencies: crate::histogram::Quantiles,
    /// Loader-seconds the daemon saw itself: the live loaders times the time since they were
    /// last counted, the larger of the two counts taken; counted at every reap (entries whose
    /// lock is held, after the dead ones are cleared: the kernel's word) and every 10 ms
    /// between (the table's ACTIVE entries). What the loaders report of their
    /// own time is checked against it ([`observe::checked_loader_figures`]).
    loader_seconds_seen: f64,
    /// When the live loaders were last counted, and how many there were.
    loaders_counted: Option<(Instant, u32)>,
}

impl Tally {
    fn new(now: Instant) -> Tally {
        Tally {
            started: now,
            cpu_at_ready: 0.0,
            threads_at_ready: Default::default(),
            last_delivery: now,
            first_delivery: None,
            verified: 0,
            verify_failures: 0,
            first_failure: None,
            bytes: 0,
            sink_busy_ns: 0,
            upload_ns: 0,
            daemon_wait_ns: 0,
            submit_ns: 0,
            doorbell_ns: 0,
            taken_ahead: 0,
            passes: 0,
            sleeps: 0,
            preempted_at_ready: None,
            latencies: crate::histogram::Quantiles::default(),
            loader_seconds_seen: 0.0,
            loaders_counted: None,
        }
    }

    /// Books `live` loaders counted at `now` (see [`Tally::loader_seconds_seen`]).
    fn count_loaders(&mut self, now: Instant, live: u32) {
        let (since, before) = self.loaders_counted.unwrap_or((self.started, live));
        let dt = now.saturating_duration_since(since).as_secs_f64();
        self.loader_seconds_seen += dt * f64::from(before.max(live));
        self.loaders_counted = Some((now, live));
    }
}

/// What the main loop added to the header's counters since it last wrote them: it adds once per
/// pass (`Daemon::publish_counters`), not once per part (each a locked instruction), so a reader
/// (`pinring status`, the service's status line, the metrics) sees them at most one pass late.
/// The seqs a restart reads (`next_deliver`, `next_assign`) are plain stores and stay immediate.
#[derive(Debug, Default)]
struct Unpublished {
    delivered: u64,
    bytes_delivered: u64,
    upload_ns: u64,
}

/// A part whose uploads (one per field of the batch layout) are in flight.
struct InFlight {
    /// The part's seq.
    seq: u64,
    /// The batch it belongs to.
    batch: u64,
    /// The batch's device buffer.
    buffer: usize,
    /// Payload bytes of the part (all fields).
    len: usize,
    /// When the loader committed it.
    commit_ns: u64,
    /// Completions still to come for the part's upload (as many as the backend announced for its
    /// group of copies, `CopyEngine::submit_group`); the slot is handed out again at 0.
    jobs_left: usize,
    /// When the part's first job was submitted (taken from its completion).
    submitted: Option<Instant>,
}

/// A batch whose parts are being uploaded into one device buffer, each field of each part at
/// its offset.
#[derive(Debug)]
struct Assembly {
    /// The batch's number.
    batch: u64,
    /// The batch's device buffer.
    buffer: usize,
    /// Parts whose upload has completed.
    landed: u64,
    /// The whole batch's sample ids, from the daemon's plan.
    samples: Vec<u64>,
    /// The whole batch's payload bytes (all fields).
    len: usize,
    /// The batch's epoch.
    epoch: u32,
    /// The batch's index in its epoch.
    index_in_epoch: u64,
}

/// The batches being assembled, each in the device buffer it holds: kept by buffer (a part in
/// flight names its buffer), and, for batches cut into parts, by batch number too (a part taken
/// finds the buffer its batch already holds). A batch of one part is never looked up by number,
/// so at small slots, a batch per part, this ordered map is not touched per part (ordered maps,
/// this one and the sequencer's, were 7.5% of the main loop's samples at 64 KiB slots).
#[derive(Debug)]
struct Assemblies {
    by_buffer: Vec<Option<Assembly>>,
    /// Batch number to buffer; only for batches of more than one part.
    by_batch: BTreeMap<u64, usize>,
    parts: u64,
}

impl Assemblies {
    fn new(buffers: usize, parts: u64) -> Self {
        Self {
            by_buffer: std::iter::repeat_with(|| None).take(buffers).collect(),
            by_batch: BTreeMap::new(),
            parts,
        }
    }

    /// The buffer batch `batch` holds, if it is being assembled from several parts.
    fn buffer_of(&self, batch: u64) -> Option<usize> {
        if self.parts == 1 {
            return None;
        }
        self.by_batch.get(&batch).copied()
    }

    /// Opens the books of a batch in its buffer.
    ///
    /// # Panics
    /// If the buffer is not one of the uploader's (the daemon only opens buffers it took from
    /// its free list).
    fn open(&mut self, assembly: Assembly) {
        if self.parts > 1 {
            self.by_batch.insert(assembly.batch, assembly.buffer);
        }
        let buffer = assembly.buffer;
        self.by_buffer[buffer] = Some(assembly);
    }

    /// The batch being assembled in `buffer`.
    fn get_mut(&mut self, buffer: usize) -> Option<&mut Assembly> {
        self.by_buffer.get_mut(buffer)?.as_mut()
    }

    /// Closes the books of the batch in `buffer` (all its parts landed).
    fn close(&mut self, buffer: usize) -> Option<Assembly> {
        let done = self.by_buffer.get_mut(buffer)?.take()?;
        if self.parts > 1 {
            self.by_batch.remove(&done.batch);
        }
        Some(done)
    }

    /// Whether a batch of several parts is open: a part of it could go up without a free buffer.
    fn any_open_for_parts(&self) -> bool {
        !self.by_batch.is_empty()
    }
}

/// A value per ring slot, for the few slots that have one: indexed by slot number, since the
/// main loop looks one up for every part it takes and every upload that completes.
#[derive(Debug)]
struct SlotTable<T> {
    by_slot: Vec<Option<T>>,
    len: usize,
}

impl<T> SlotTable<T> {
    fn new(slots: usize) -> Self {
        Self {
            by_slot: std::iter::repeat_with(|| None).take(slots).collect(),
            len: 0,
        }
    }

    fn get_mut(&mut self, slot: u32) -> Option<&mut T> {
        self.by_slot.get_mut(slot as usize)?.as_mut()
    }

    /// Stores `value` for `slot`, returning the value it replaces.
    ///
    /// # Panics
    /// If `slot` is not a slot of the ring (the daemon only stores slots it took from it).
    fn insert(&mut self, slot: u32, value: T) -> Option<T> {
        let old = self.by_slot[slot as usize].replace(value);
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    fn remove(&mut self, slot: u32) -> Option<T> {
        let old = self.by_slot.get_mut(slot as usize)?.take();
        if old.is_some() {
            self.len -= 1;
        }
        old
    }

    fn is_empty(&self) -> bool {
        self.len == 0
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

/// One submit call in this many is timed for `submit_ns` (the estimate counts it this many
/// times): two clock reads per part were more than the driver's share of a 64 KiB part.
const SUBMIT_TIMED_EVERY: u64 = 8;

/// The upload state: what is on its way out of the ring, and the batch buffers it goes to.
struct Uploads {
    /// Parts whose uploads are in flight, by slot (an upload's tag is its slot and field,
    /// `dispatch::upload_tag`).
    inflight: SlotTable<InFlight>,
    /// Their payload bytes.
    inflight_bytes: usize,
    /// Batches with parts on their way to the device.
    assemblies: Assemblies,
    /// Commit time of each zero-copy batch at the sink, by slot.
    zero_copy_commits: SlotTable<u64>,
    /// Consumer copies: the slots of the batch in each buffer, by buffer.
    lent: Vec<Vec<u32>>,
    /// Device buffers free for a batch, oldest freed first: batches delivered in order free
    /// their buffers in order, so the next batches take consecutive buffers, and parts from
    /// consecutive slots go up as one copy (`Placement::Contiguous`).
    free_buffers: std::collections::VecDeque<usize>,
    /// Submit calls made, for timing one in [`SUBMIT_TIMED_EVERY`].
    submits: u64,
    /// The upload jobs of the part being submitted (reused: no allocation per part).
    jobs_buf: Vec<pinring_backend::UploadJob>,
    /// The completions taken in a pass (reused: no allocation per pass).
    completion_buf: Vec<Completion>,
    /// Landed batches held back until every earlier one went to the sink, and which batch
    /// may take a buffer (daemon/reorder.rs).
    order: reorder::Reorder<Assembly>,
}

impl Uploads {
    /// Nothing on its way, `buffers` free batch buffers, books for `slots` slots and batches of
    /// `parts` parts from batch `first` on; `ahead`: batches may be taken ahead and are sent in
    /// order.
    fn new(slots: usize, buffers: usize, parts: u64, first: u64, ahead: bool) -> Uploads {
        Uploads {
            inflight: SlotTable::new(slots),
            inflight_bytes: 0,
            assemblies: Assemblies::new(buffers, parts),
            zero_copy_commits: SlotTable::new(slots),
            lent: vec![Vec::new(); buffers],
            free_buffers: (0..buffers).collect(),
            submits: 0,
            jobs_buf: Vec::new(),
            completion_buf: Vec::new(),
            order: reorder::Reorder::new(buffers, first, ahead),
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

struct Daemon {
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
    /// The sink thread and the channels to it.
    sink: SinkLink,
    // Protocol state, owned by the main loop.
    /// Which seq each slot carries, what comes next, what was delivered (daemon/sequencer.rs).
    sequencer: Sequencer,
    /// Parts on their way to the device (or, when the consumer copies, to the consumer) and the
    /// batch buffers they go to.
    up: Uploads,
    /// What the run did, for the summary.
    tally: Tally,
    /// The header's counters not yet published (`Daemon::publish_counters`).
    unpublished: Unpublished,
    interrupted: bool,
    /// This pass's clock (`PassClock`).
    now: PassClock,
    spare_samples: Vec<Vec<u64>>,
    /// A taken batch's metadata, copied out of its slot before it is decoded.
    meta_buf: Vec<u8>,
    /// Batches handed to a consumer (`--sink consumer`, daemon/handoff.rs).
    handoff_books: handoff::HandoffBooks,
    // Fault handling (daemon/recovery.rs).
    /// How often dead/hung loaders and the segment file are checked (`daemon.reap_interval_ms`).
    reap_every: Duration,
    recovery: recovery::Recovery,
}

impl Daemon {
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
                self.ring
                    .header()
                    .next_assign
                    .store(self.sequencer.next_assign(), Relaxed);
                self.ring.assign_at(slot, seq, self.now.ns);
            }
            HandOut::Park => self.ring.park(slot),
            HandOut::Quarantined => {}
        }
    }

    /// Writes the header's counters the main loop kept since it last did (`Unpublished`).
    fn publish_counters(&mut self) {
        let u = std::mem::take(&mut self.unpublished);
        let h = self.ring.header();
        if u.delivered > 0 {
            h.delivered.fetch_add(u.delivered, Relaxed);
        }
        if u.bytes_delivered > 0 {
            h.bytes_delivered.fetch_add(u.bytes_delivered, Relaxed);
        }
        if u.upload_ns > 0 {
            h.upload_ns.fetch_add(u.upload_ns, Relaxed);
        }
    }

    /// Whether no loader is attached that could still commit a part: the loader table is
    /// empty once the entries of dead loaders are cleared (their entry locks are free). Asked
    /// only while draining with seqs waiting.
    fn no_live_loader(&self) -> bool {
        self.ring.reap_dead_loaders();
        self.ring.attached_loaders() == 0
    }

    fn main_loop(&mut self, shutdown: &Shutdown) -> Result<(), DaemonError> {
        let mut last_reap = Instant::now();
        let mut drain_deadline: Option<Instant> = None;
        loop {
            // Acquire: pairs with the Release bump of whoever rings (loader commit, completion thread, sink),
            // so a ring after this load is never lost: the wait below returns at once.
            let seen = self.ring.header().doorbell_futex.load(Acquire);
            self.tally.passes += 1;
            self.now = PassClock::read();
            self.service.tick(&self.ring, self.now.at);
            let mut progressed = self.collect_completions()?;
            progressed |= self.collect_sink_results()?;
            progressed |= self.collect_returns()?;
            progressed |= self.dispatch()?;

            if self.sequencer.complete() && self.up.inflight.is_empty() && self.sink.pending == 0 {
                return Ok(());
            }
            if shutdown.requested() && drain_deadline.is_none() {
                tracing::info!(ring = %self.run.cfg.ring.name, "stop requested: draining");
                self.service.stopping("stop requested: draining");
                self.interrupted = true;
                drain_deadline = Some(Instant::now() + DRAIN_DEADLINE);
                self.ring.set_state(ring_state::DRAINING);
                // FREE slots are taken back (no new claim lands); their seqs are given up.
                let taken_back: Vec<u32> = (0..self.sequencer.slots())
                    .filter(|&slot| self.ring.unassign_if_free(slot))
                    .collect();
                self.sequencer.drain(&taken_back);
                // Batches handed over but not taken go back undelivered.
                self.withdraw_untaken();
            }
            if let Some(deadline) = drain_deadline {
                let past = Instant::now() >= deadline;
                // Batches a consumer still holds are waited for until the deadline only.
                let held = self.handoff_books.outstanding();
                let nothing_in_flight = self.up.inflight.is_empty()
                    && (self.sink.pending == 0
                        || ((past || self.run.holds_own_buffers) && self.sink.pending == held));
                // A seq waiting for its part is waited for only while a loader lives to
                // commit it: with every loader gone (detached, or dead: a trainer stopping its
                // workers kills the hung ones) nothing can come, so the drain ends at once
                // instead of at the deadline.
                if nothing_in_flight
                    && (!self.sequencer.any_waiting() || past || self.no_live_loader())
                {
                    self.settle_handoff()?;
                    let held = self.handoff_books.outstanding();
                    if held > 0 && !self.run.holds_own_buffers {
                        tracing::warn!(ring = %self.run.cfg.ring.name, buffers = held,
                            "stopping while the consumer still holds batch buffers: its tensors \
                             of those batches become invalid");
                    }
                    return Ok(());
                }
            }
            if self.now.at.saturating_duration_since(last_reap) >= self.reap_every {
                last_reap = self.now.at;
                self.reap()?;
            } else if self.tally.loaders_counted.is_none_or(|(at, _)| {
                self.now.at.saturating_duration_since(at) >= COUNT_LOADERS_EVERY
            }) {
                // Between reaps (which clear dead entries first), the table's ACTIVE entries:
                // loads only, so a short run is counted as finely as a long one.
                let live = self.ring.attached_loaders();
                self.tally.count_loaders(self.now.at, live);
            }
            // Once a pass, after its reap; a pass that returns above leaves it to `run`.
            self.publish_counters();
            if !progressed {
                let could_upload = (!self.up.free_buffers.is_empty()
                    || self.up.assemblies.any_open_for_parts())
                    && self.sequencer.any_waiting();
                let mut wait = MAX_WAIT;
                if let Some(deadline) = drain_deadline {
                    wait = wait.min(deadline.saturating_duration_since(Instant::now()));
                }
                // Parts submitted deferred get their upload signal now: their completions are
                // what may wake this wait.
                let t = Instant::now();
                let flushed = self.uploader.flush();
                self.tally.submit_ns += t.elapsed().as_nanos() as u64;
                flushed?;
                let t = Instant::now();
                let woke = if self.up.inflight_bytes >= self.run.quiet_in_flight {
                    self.ring.wait_doorbell_quiet(seen, wait)
                } else {
                    self.ring.wait_doorbell(seen, wait)
                };
                if woke != pinring_ring::futex::Wake::Changed {
                    self.tally.sleeps += 1;
                }
                let ns = t.elapsed().as_nanos() as u64;
                self.tally.doorbell_ns += ns;
                if could_upload {
                    self.tally.daemon_wait_ns += ns;
                    self.ring.header().daemon_wait_ns.fetch_add(ns, Relaxed);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Assemblies, Assembly, SlotTable};

    fn assembly(batch: u64, buffer: usize) -> Assembly {
        Assembly {
            batch,
            buffer,
            landed: 0,
            samples: vec![batch],
            len: 64,
            epoch: 0,
            index_in_epoch: batch,
        }
    }

    #[test]
    fn batches_of_several_parts_are_found_by_number_and_by_buffer() {
        let mut a = Assemblies::new(4, 3);
        assert!(!a.any_open_for_parts());
        a.open(assembly(7, 2));
        a.open(assembly(9, 0));
        // A part taken finds its batch's buffer; a part in flight its batch's books.
        assert_eq!(a.buffer_of(7), Some(2));
        assert_eq!(a.buffer_of(8), None);
        assert!(a.any_open_for_parts());
        a.get_mut(2).unwrap().landed += 1;
        assert_eq!(a.get_mut(2).map(|x| (x.batch, x.landed)), Some((7, 1)));
        assert!(a.get_mut(1).is_none());
        assert!(
            a.get_mut(4).is_none(),
            "a buffer past the uploader's holds nothing"
        );
        // Closing takes the batch out of both.
        assert_eq!(a.close(2).map(|x| x.batch), Some(7));
        assert_eq!(a.buffer_of(7), None);
        assert!(a.close(2).is_none());
        assert_eq!(a.close(0).map(|x| x.batch), Some(9));
        assert!(!a.any_open_for_parts());
    }

    #[test]
    fn batches_of_one_part_are_kept_by_buffer_only() {
        let mut a = Assemblies::new(2, 1);
        a.open(assembly(5, 1));
        // Nothing is ever looked up by number: every part is a batch of its own.
        assert_eq!(a.buffer_of(5), None);
        assert!(!a.any_open_for_parts());
        assert_eq!(a.get_mut(1).map(|x| x.batch), Some(5));
        assert_eq!(a.close(1).map(|x| x.samples.clone()), Some(vec![5]));
        assert!(a.get_mut(1).is_none());
    }

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

    #[test]
    fn a_slot_table_keeps_one_value_per_slot_and_counts_them() {
        let mut t = SlotTable::new(4);
        assert!(t.is_empty());
        assert_eq!(t.insert(3, "a"), None);
        assert_eq!(t.insert(0, "b"), None);
        assert!(!t.is_empty());
        // A second value for a slot replaces the first and counts once.
        assert_eq!(t.insert(3, "c"), Some("a"));
        assert_eq!(t.get_mut(3).map(|v| *v), Some("c"));
        assert_eq!(t.get_mut(1), None);
        // Slots outside the table hold nothing.
        assert_eq!(t.get_mut(4), None);
        assert_eq!(t.remove(9), None);
        assert_eq!(t.remove(3), Some("c"));
        assert_eq!(t.remove(3), None);
        assert!(!t.is_empty());
        assert_eq!(t.remove(0), Some("b"));
        assert!(t.is_empty());
    }
}
