//! The GPU daemon: creates the ring, registers it with the backend, hands out seqs, uploads
//! committed batches (in seq order by default), frees slots, feeds the sink, takes slots back
//! from dead loaders, and drains cleanly on SIGTERM/SIGINT.
//!
//! Threads: the main loop (this file), the backend's upload/completion thread (which rings the
//! doorbell after sending completions), and the sink thread (verify, compute). The main loop owns
//! every slot transition the daemon makes, so the protocol needs no locks.

use crate::exit::Exit;
use crate::ring_wake::Doorbell;
use crate::settings::{self, Overrides};
use crate::shutdown::Shutdown;
use crate::sink::{self, OrderCheck, SinkDone, SinkJob, SinkKind};
use crate::summary::{verdict, Summary};
use crossbeam_channel::{unbounded, Receiver, TryRecvError};
use pinring_backend::{BackendKind, Completion, UploadJob, Uploader};
use pinring_data::{BatchMeta, Config, Plan};
use pinring_ring::{ring_state, CreateOptions, Ring, RingError};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering::{Acquire, Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod recovery;

/// How long a drain may take before the daemon closes the ring anyway.
pub const DRAIN_DEADLINE: Duration = Duration::from_millis(1500);
/// Longest single futex wait of the main loop.
const MAX_WAIT: Duration = Duration::from_millis(100);

/// Daemon settings (from flags).
#[derive(Debug, Clone, clap::Args)]
pub struct DaemonArgs {
    /// Config file (TOML). Without it, the built-in synthetic config.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Ring name (overrides ring.name).
    #[arg(long, value_name = "NAME")]
    pub ring: Option<String>,
    /// GPU backend: cuda, host (ordinary memory), or auto (cuda when a driver and device exist).
    #[arg(long, default_value = "auto", value_parser = parse_backend_kind)]
    pub backend: BackendKind,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// What consumes uploaded batches.
    #[arg(long, value_enum, default_value = "discard")]
    pub sink: SinkKind,
    /// Epochs to run (overrides plan.epochs).
    #[arg(long)]
    pub epochs: Option<u32>,
    /// Deliver batches in any order (overrides ring.in_order = true).
    #[arg(long)]
    pub unordered: bool,
    /// First seq to deliver (resume a run; the summary's resume_seq).
    #[arg(long, default_value_t = 0)]
    pub start_seq: u64,
    /// Device buffers (uploads in flight plus batches held by the sink). Default: enough for
    /// 64 MiB in flight, 4 to 64 buffers.
    #[arg(long)]
    pub upload_buffers: Option<usize>,
    /// Write a JSON summary here at exit.
    #[arg(long, value_name = "PATH")]
    pub summary: Option<PathBuf>,
    /// Replace whatever is at the ring's path unless a live daemon holds it: a file that is not
    /// a ring, a ring of another layout version, a FIFO or a link. Without it only a stale ring
    /// (its daemon gone) is replaced. Another user's file is never replaced.
    #[arg(long)]
    pub replace: bool,
    /// Leave the ring's memory unregistered (pageable baseline).
    #[arg(long, conflicts_with = "zero_copy")]
    pub no_register: bool,
    /// Zero-copy: register the ring with DEVICEMAP and let the sink's kernel read each batch in
    /// its slot through the mapped device address (no upload); the slot is freed after the sink.
    #[arg(long)]
    pub zero_copy: bool,
    /// Running as a service: metrics endpoint, log level.
    #[command(flatten)]
    pub service: crate::service::DaemonServiceArgs,
}

/// Device buffers the daemon uses without `--upload-buffers`: enough to keep 64 MiB of uploads
/// in flight (4 to 64 buffers of `slot_bytes`), so the copy engine stays busy while completions
/// travel back. `pinring bench`'s reference pipeline uses the same number.
pub fn default_upload_buffers(slot_bytes: u64) -> usize {
    (64u64 << 20).div_ceil(slot_bytes.max(1)).clamp(4, 64) as usize
}

/// Parses `--backend`.
pub fn parse_backend_kind(s: &str) -> Result<BackendKind, String> {
    s.parse::<BackendKind>().map_err(|e| e.to_string())
}

/// Why the daemon stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// Bad config.
    #[error(transparent)]
    Config(#[from] pinring_data::ConfigError),
    /// Bad plan parameters.
    #[error("config {source_name}: {source}")]
    Plan {
        /// Config source.
        source_name: String,
        /// The plan error.
        #[source]
        source: pinring_data::PlanError,
    },
    /// `--start-seq` lies past the end of the plan.
    #[error("ring {ring:?}: --start-seq {start_seq} is past the end of the plan ({end_seq} batches, seqs 0 to {last}, from {source_name}); pass a --start-seq of at most {end_seq} (a summary's resume_seq), or run more epochs (--epochs)", last = .end_seq.saturating_sub(1))]
    StartSeq {
        /// Ring name.
        ring: String,
        /// The flag's value.
        start_seq: u64,
        /// One past the plan's last seq.
        end_seq: u64,
        /// Config source.
        source_name: String,
    },
    /// Ring error.
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

impl DaemonError {
    /// The exit code for this error.
    pub fn exit(&self) -> Exit {
        match self {
            DaemonError::Config(_) | DaemonError::Plan { .. } => Exit::Config,
            DaemonError::StartSeq { .. } => Exit::Usage,
            DaemonError::Ring(RingError::UnknownGroup { .. }) => Exit::Config,
            DaemonError::Service { .. } => Exit::Config,
            DaemonError::Ring(_) | DaemonError::BadBatch { .. } => Exit::Ring,
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
    /// counters, `bound` "none". `error` and `exit_code` are filled by [`crate::main_daemon`].
    pub summary: Summary,
    /// Whether the ring was made and the main loop ran (false: start-up failed).
    pub started: bool,
    /// The error that ended the run.
    pub result: Result<(), DaemonError>,
}

/// Runs the daemon to completion.
pub fn run(args: &DaemonArgs, shutdown: &Shutdown) -> Outcome {
    let overrides = Overrides {
        ring: args.ring.clone(),
        epochs: args.epochs,
        unordered: args.unordered,
    };
    let cfg = match settings::load(args.config.as_deref(), &overrides) {
        Ok(c) => c,
        Err(e) => return failed_at_start(args, None, e.into()),
    };
    match Daemon::start(args, cfg.clone()) {
        Ok(mut d) => {
            let result = d.main_loop(shutdown);
            let summary = d.finish(&result);
            Outcome {
                summary,
                started: true,
                result,
            }
        }
        Err(e) => failed_at_start(args, Some(&cfg), e),
    }
}

/// The outcome of a daemon that stopped before its ring was ready: a summary with what is known
/// (the config when it loaded, else the flags), nothing delivered, and the error.
pub fn failed_at_start(args: &DaemonArgs, cfg: Option<&Config>, error: DaemonError) -> Outcome {
    let ring = match (cfg, &args.ring) {
        (Some(c), _) => c.ring.name.clone(),
        (None, Some(name)) => name.clone(),
        (None, None) => String::new(),
    };
    let end_seq = cfg
        .and_then(|c| c.plan().ok())
        .map_or(0, |p| p.total_batches());
    let summary = Summary {
        ring,
        backend: String::new(),
        backend_reason: format!("not started (--backend {})", args.backend),
        sink: args.sink.name().into(),
        in_order: cfg.map_or(!args.unordered, |c| c.ring.in_order),
        start_seq: args.start_seq,
        end_seq,
        missing: end_seq.saturating_sub(args.start_seq),
        resume_seq: args.start_seq,
        bound: "none".into(),
        zero_copy: args.zero_copy,
        ..Default::default()
    };
    Outcome {
        summary,
        started: false,
        result: Err(error),
    }
}

struct Daemon {
    // Fields drop top to bottom, and these three must go in this order: the upload engine first
    // (its drop waits for copies still running), then the registration (unregistering memory no
    // copy reads any more), then this handle on the ring's mapping.
    uploader: Arc<dyn Uploader>,
    /// The ring's registration with the backend (None: --no-register).
    registration: Option<pinring_backend::Registration>,
    ring: Arc<Ring>,
    cfg: Config,
    sink_kind: SinkKind,
    backend_name: String,
    backend_reason: String,
    plan: Plan,
    service: crate::service::DaemonService,
    completions: Receiver<Completion>,
    sink_tx: Option<crossbeam_channel::Sender<SinkJob>>,
    sink_rx: Receiver<SinkDone>,
    sink_thread: Option<std::thread::JoinHandle<()>>,
    // Protocol state, owned by the main loop.
    start_seq: u64,
    end_seq: u64,
    next_assign: u64,
    /// Seq assigned to each slot (None: parked).
    assigned: Vec<Option<u64>>,
    /// Assigned, not yet taken: seq -> slot.
    waiting: BTreeMap<u64, u32>,
    /// Uploads in flight: tag (slot) -> (seq, sample ids, length, commit time).
    inflight: BTreeMap<u64, (u64, Vec<u64>, usize, u64)>,
    /// Commit time of each zero-copy batch at the sink, by slot.
    zero_copy_commits: BTreeMap<u32, u64>,
    zero_copy: bool,
    /// Commit-to-on-device latencies (bounded memory, however long the daemon runs).
    latencies: crate::histogram::Quantiles,
    free_buffers: Vec<usize>,
    sink_pending: usize,
    order: OrderCheck,
    // Results.
    started: Instant,
    /// CPU seconds used before the ring was ready (start-up, registration).
    cpu_at_ready: f64,
    last_delivery: Instant,
    delivered: u64,
    verified: u64,
    verify_failures: u64,
    first_failure: Option<String>,
    bytes: u64,
    sink_busy_ns: u64,
    daemon_wait_ns: u64,
    interrupted: bool,
    spare_samples: Vec<Vec<u64>>,
    /// A taken batch's metadata, copied out of its slot before it is decoded.
    meta_buf: Vec<u8>,
    // Fault handling (daemon/recovery.rs).
    /// Stopping: no new seqs are handed out (the daemon's own record, never read from the ring).
    draining: bool,
    /// How often dead/hung loaders and the segment file are checked (`daemon.reap_interval_ms`).
    reap_every: Duration,
    recovery: recovery::Recovery,
}

impl Daemon {
    fn start(args: &DaemonArgs, cfg: Config) -> Result<Daemon, DaemonError> {
        let plan_err = |source| DaemonError::Plan {
            source_name: cfg.source.clone(),
            source,
        };
        let plan = cfg.plan().map_err(plan_err)?;
        let end_seq = plan.total_batches();
        if args.start_seq > end_seq {
            return Err(DaemonError::StartSeq {
                ring: cfg.ring.name.clone(),
                start_seq: args.start_seq,
                end_seq,
                source_name: cfg.source.clone(),
            });
        }
        let service =
            crate::service::DaemonService::start(&args.service, &cfg.ring.name, cfg.ring_bytes())
                .map_err(|source| DaemonError::Service {
                ring: cfg.ring.name.clone(),
                source,
            })?;
        for w in crate::host_memory::HostMemory::read().ring_warnings(
            &cfg.ring.name,
            cfg.ring.slots,
            cfg.slot_bytes(),
        ) {
            tracing::warn!("{w}");
        }
        let selected = pinring_backend::select(args.backend, args.device)?;
        tracing::info!(backend = selected.backend.name(), reason = %selected.reason, "backend selected");
        let ring = Arc::new(Ring::create(&CreateOptions {
            name: cfg.ring.name.clone(),
            slots: cfg.ring.slots,
            slot_bytes: cfg.slot_bytes(),
            mode: cfg.ring.mode.bits(),
            group: cfg.ring.group.clone(),
            fingerprint: cfg.fingerprint(),
            start_seq: args.start_seq,
            end_seq,
            in_order: cfg.ring.in_order,
            replace: args.replace,
        })?);
        let registration = if args.no_register {
            None
        } else {
            // SAFETY: the data area is a live shared mapping owned by `ring`, which outlives the
            // guard: here the guard drops first (declared later), and in `Daemon` the field
            // order drops the registration before the ring.
            let reg = unsafe {
                selected
                    .backend
                    .register(ring.data_base(), ring.data_len(), args.zero_copy)
            };
            match reg {
                Ok(r) => Some(r),
                Err(e) => {
                    let _ = ring.unlink();
                    return Err(e.into());
                }
            }
        };
        let registration_seconds = registration.as_ref().map_or(0.0, |r| r.seconds());
        if let Some(r) = &registration {
            tracing::info!(ring = %cfg.ring.name, bytes = r.bytes(), seconds = r.seconds(), registered = r.registered(), "ring memory registered");
        }
        // Enough buffers to keep the copy engine busy while completions travel back: with small
        // slots, a handful of uploads in flight drain faster than a completion round trip.
        let buffers = args
            .upload_buffers
            .unwrap_or_else(|| default_upload_buffers(cfg.slot_bytes()))
            .clamp(1, 256);
        let uploader: Arc<dyn Uploader> = match selected
            .backend
            .uploader(buffers, cfg.slot_bytes() as usize)
        {
            Ok(u) => Arc::from(u),
            Err(e) => {
                let _ = ring.unlink();
                return Err(e.into());
            }
        };
        let doorbell = Doorbell::new(Arc::clone(&ring));
        // The upload engine's completion thread rings the doorbell itself after sending
        // completions, so the main loop sleeps on one futex word for everything.
        let completions = uploader.completions().clone();
        {
            let bell = doorbell.clone();
            uploader.set_completion_hook(Arc::new(move || bell.ring()));
        }
        let (sink_tx, sink_jobs) = unbounded();
        let (sink_done_tx, sink_rx) = unbounded();
        let sink_thread = {
            let up = Arc::clone(&uploader);
            let synth = cfg.synthetic();
            let kind = args.sink;
            let bell = doorbell.clone();
            std::thread::Builder::new()
                .name("sink".into())
                .spawn(move || sink::run(kind, up, synth, sink_jobs, sink_done_tx, bell))
                .map_err(|e| DaemonError::Internal {
                    ring: cfg.ring.name.clone(),
                    what: format!("cannot start the sink thread: {e}"),
                })?
        };
        let slots = cfg.ring.slots as usize;
        let now = Instant::now();
        let mut d = Daemon {
            sink_kind: args.sink,
            backend_name: selected.backend.name().to_string(),
            backend_reason: selected.reason.clone(),
            plan,
            uploader,
            service,
            registration,
            completions,
            sink_tx: Some(sink_tx),
            sink_rx,
            sink_thread: Some(sink_thread),
            start_seq: args.start_seq,
            end_seq,
            next_assign: args.start_seq,
            assigned: vec![None; slots],
            waiting: BTreeMap::new(),
            inflight: BTreeMap::new(),
            zero_copy_commits: BTreeMap::new(),
            zero_copy: args.zero_copy,
            latencies: crate::histogram::Quantiles::default(),
            free_buffers: (0..buffers).rev().collect(),
            sink_pending: 0,
            order: OrderCheck::new(args.start_seq, end_seq, cfg.ring.in_order),
            started: now,
            cpu_at_ready: 0.0,
            last_delivery: now,
            delivered: 0,
            verified: 0,
            verify_failures: 0,
            first_failure: None,
            bytes: 0,
            sink_busy_ns: 0,
            daemon_wait_ns: 0,
            interrupted: false,
            spare_samples: Vec::new(),
            meta_buf: Vec::new(),
            draining: false,
            reap_every: Duration::from_millis(cfg.daemon.reap_interval_ms),
            recovery: recovery::Recovery::new(
                slots,
                Duration::from_millis(cfg.daemon.lease_ms),
                cfg.daemon.on_bad_batch,
            ),
            ring,
            cfg,
        };
        for slot in 0..slots as u32 {
            d.hand_out(slot);
        }
        d.started = Instant::now();
        d.cpu_at_ready = cpu_seconds();
        d.ring.set_state(ring_state::READY);
        tracing::info!(
            ring = %d.cfg.ring.name,
            path = %pinring_ring::object_path(&d.cfg.ring.name).display(),
            slots = slots,
            slot_bytes = d.cfg.slot_bytes(),
            batches = end_seq - d.start_seq,
            in_order = d.cfg.ring.in_order,
            sink = d.sink_kind.name(),
            "ring ready"
        );
        if let Err(source) = d.service.ready(&d.ring, registration_seconds) {
            let _ = d.ring.unlink();
            return Err(DaemonError::Service {
                ring: d.cfg.ring.name.clone(),
                source,
            });
        }
        Ok(d)
    }

    /// Assigns the next seq to `slot` (a seq that lost its slot first), or parks it when the plan
    /// is handed out. A quarantined slot stays out of use.
    fn hand_out(&mut self, slot: u32) {
        if self.recovery.is_quarantined(slot) {
            self.assigned[slot as usize] = None;
            return;
        }
        let reissued = if self.draining {
            None
        } else {
            self.recovery.take_reissue()
        };
        if reissued.is_some() || (self.next_assign < self.end_seq && !self.draining) {
            let seq = reissued.unwrap_or_else(|| {
                self.next_assign += 1;
                self.next_assign - 1
            });
            self.ring
                .header()
                .next_assign
                .store(self.next_assign, Relaxed);
            self.assigned[slot as usize] = Some(seq);
            self.waiting.insert(seq, slot);
            self.ring.assign(slot, seq);
        } else {
            self.assigned[slot as usize] = None;
            self.ring.park(slot);
        }
    }

    /// Every seq of the plan delivered at least once (duplicates are counted by the order
    /// check and do not stand in for a missing seq).
    fn all_delivered(&self) -> bool {
        self.delivered.saturating_sub(self.order.duplicates) >= self.end_seq - self.start_seq
    }

    fn main_loop(&mut self, shutdown: &Shutdown) -> Result<(), DaemonError> {
        let mut last_reap = Instant::now();
        let mut drain_deadline: Option<Instant> = None;
        loop {
            // Acquire: pairs with the Release bump of whoever rings (loader commit, completion thread, sink),
            // so a ring after this load is never lost: the wait below returns at once.
            let seen = self.ring.header().doorbell_futex.load(Acquire);
            self.service.tick(&self.ring);
            let mut progressed = self.collect_completions()?;
            progressed |= self.collect_sink_results();
            progressed |= self.dispatch()?;

            if self.all_delivered() && self.inflight.is_empty() && self.sink_pending == 0 {
                return Ok(());
            }
            if shutdown.requested() && drain_deadline.is_none() {
                tracing::info!(ring = %self.cfg.ring.name, "stop requested: draining");
                self.service.stopping("stop requested: draining");
                self.interrupted = true;
                self.draining = true;
                drain_deadline = Some(Instant::now() + DRAIN_DEADLINE);
                self.ring.set_state(ring_state::DRAINING);
                let mut first_gap = u64::MAX;
                for slot in 0..self.assigned.len() as u32 {
                    if self.ring.unassign_if_free(slot) {
                        if let Some(seq) = self.assigned[slot as usize].take() {
                            self.waiting.remove(&seq);
                            first_gap = first_gap.min(seq);
                        }
                    }
                }
                // In order, nothing past the first seq taken back can be delivered any more.
                if self.cfg.ring.in_order {
                    self.waiting.retain(|&seq, _| seq < first_gap);
                }
            }
            if let Some(deadline) = drain_deadline {
                let nothing_in_flight = self.inflight.is_empty() && self.sink_pending == 0;
                if nothing_in_flight && (self.waiting.is_empty() || Instant::now() >= deadline) {
                    return Ok(());
                }
            }
            if last_reap.elapsed() >= self.reap_every {
                last_reap = Instant::now();
                self.reap()?;
            }
            if !progressed {
                let could_upload = !self.free_buffers.is_empty() && !self.waiting.is_empty();
                let mut wait = MAX_WAIT;
                if let Some(deadline) = drain_deadline {
                    wait = wait.min(deadline.saturating_duration_since(Instant::now()));
                }
                let t = Instant::now();
                self.ring.wait_doorbell(seen, wait);
                if could_upload {
                    let ns = t.elapsed().as_nanos() as u64;
                    self.daemon_wait_ns += ns;
                    self.ring.header().daemon_wait_ns.fetch_add(ns, Relaxed);
                }
            }
        }
    }

    /// Upload completions: free the slot (next seq), pass the buffer to the sink.
    fn collect_completions(&mut self) -> Result<bool, DaemonError> {
        let mut progressed = false;
        // Loaders are woken once per pass, for all the slots it freed: one system call, not one
        // per batch.
        let mut freed = 0;
        loop {
            let c = match self.completions.try_recv() {
                Ok(c) => c,
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    return Err(DaemonError::Internal {
                        ring: self.cfg.ring.name.clone(),
                        what: "the upload thread stopped".into(),
                    })
                }
            };
            progressed = true;
            let slot = c.tag as u32;
            let (seq, samples, len, commit_ns) =
                self.inflight
                    .remove(&c.tag)
                    .ok_or_else(|| DaemonError::Internal {
                        ring: self.cfg.ring.name.clone(),
                        what: format!("completion for slot {slot} that had no upload in flight"),
                    })?;
            c.result?;
            let upload_ns = c
                .completed
                .saturating_duration_since(c.submitted)
                .as_nanos() as u64;
            self.ring.header().upload_ns.fetch_add(upload_ns, Relaxed);
            // When the batch was on the device, on the clock loaders stamp commits with.
            let on_device_ns = pinring_ring::clock::monotonic_ns()
                .saturating_sub(c.completed.elapsed().as_nanos() as u64);
            self.record_latency(commit_ns, on_device_ns);
            self.service
                .upload_done(&self.ring, slot, upload_ns, commit_ns, on_device_ns);
            // (D): the upload has finished reading the slot; hand it out again.
            self.hand_out(slot);
            freed += 1;
            let job = SinkJob {
                seq,
                source: sink::Source::Buffer(c.buffer),
                buffer: c.buffer,
                len,
                samples,
            };
            self.send_to_sink(job)?;
        }
        if freed > 0 {
            self.ring.wake_loaders(freed);
        }
        Ok(progressed)
    }

    /// Hands a batch to the sink thread; the discard sink is done at once, here, which saves a
    /// thread round trip per batch.
    fn send_to_sink(&mut self, job: SinkJob) -> Result<(), DaemonError> {
        self.sink_pending += 1;
        if self.sink_kind == SinkKind::Discard {
            let done = SinkDone {
                seq: job.seq,
                source: job.source,
                done_ns: pinring_ring::clock::monotonic_ns(),
                buffer: job.buffer,
                verified: false,
                failure: None,
                busy_ns: 0,
                samples: job.samples,
            };
            self.deliver(done);
            return Ok(());
        }
        match &self.sink_tx {
            Some(tx) => tx.send(job).map_err(|_| DaemonError::Internal {
                ring: self.cfg.ring.name.clone(),
                what: "the sink thread stopped".into(),
            }),
            None => Ok(()),
        }
    }

    fn collect_sink_results(&mut self) -> bool {
        let mut progressed = false;
        while let Ok(done) = self.sink_rx.try_recv() {
            progressed = true;
            self.deliver(done);
        }
        progressed
    }

    /// A batch the sink is done with: its buffer (or zero-copy slot) is free again, and it
    /// counts as delivered.
    fn deliver(&mut self, done: SinkDone) {
        {
            self.sink_pending -= 1;
            self.free_buffers.push(done.buffer);
            if let sink::Source::Mapped { slot, .. } = done.source {
                // Zero-copy: the sink's kernel has finished reading the slot; hand it out again.
                if let Some(commit_ns) = self.zero_copy_commits.remove(&slot) {
                    self.record_latency(commit_ns, done.done_ns);
                }
                self.hand_out(slot);
                self.ring.wake_loaders(1);
            }
            self.sink_busy_ns += done.busy_ns;
            let order_problem = self.order.record(done.seq);
            let problem = done.failure.or(order_problem);
            if let Some(msg) = problem {
                self.verify_failures += 1;
                tracing::error!(ring = %self.cfg.ring.name, seq = done.seq, "{msg}");
                self.first_failure.get_or_insert(msg);
            } else if done.verified {
                self.verified += 1;
            }
            self.delivered += 1;
            self.last_delivery = Instant::now();
            let h = self.ring.header();
            h.delivered.fetch_add(1, Relaxed);
            if self.cfg.ring.in_order {
                h.next_deliver.store(done.seq + 1, Relaxed);
            }
            let mut samples = done.samples;
            samples.clear();
            self.spare_samples.push(samples);
        }
    }

    /// Takes READY slots (in seq order, or any when unordered) and starts their uploads.
    fn dispatch(&mut self) -> Result<bool, DaemonError> {
        let mut progressed = false;
        while !self.free_buffers.is_empty() {
            let candidate = if self.cfg.ring.in_order {
                self.waiting.iter().next().map(|(&s, &sl)| (s, sl))
            } else {
                self.waiting
                    .iter()
                    .find(|(_, &sl)| {
                        self.ring.slot_view(sl).state == Some(pinring_ring::SlotState::Ready)
                    })
                    .map(|(&s, &sl)| (s, sl))
            };
            let Some((seq, slot)) = candidate else { break };
            if self.cfg.ring.in_order && self.recovery.first_reissue().is_some_and(|r| r < seq) {
                break; // an earlier seq lost its slot and must be made first
            }
            let taken = match self.ring.take_ready(slot, seq) {
                Ok(Some(t)) => t,
                Ok(None) => break,
                Err(fault) => {
                    self.bad_batch(slot, seq, fault.to_string())?;
                    progressed = true;
                    continue;
                }
            };
            self.waiting.remove(&seq);
            let mut samples = self.spare_samples.pop().unwrap_or_default();
            let (epoch, index_in_epoch) =
                self.plan
                    .batch_into(seq, &mut samples)
                    .map_err(|e| DaemonError::Internal {
                        ring: self.cfg.ring.name.clone(),
                        what: format!("plan has no batch {seq}: {e}"),
                    })?;
            // The metadata is untrusted: decode with a bound, then compare with our own plan.
            // Copied out of shared memory first: decoded in private memory only.
            self.ring
                .copy_out(slot, taken.meta_offset, taken.meta_len, &mut self.meta_buf);
            let expected = pinring_data::BatchIndices {
                seq,
                epoch,
                index_in_epoch,
                samples,
            };
            let meta_ok = BatchMeta::decode(&self.meta_buf, self.cfg.meta_reserve_bytes() as usize)
                .and_then(|m| m.validate_against(&expected, self.cfg.sample_bytes()));
            if let Err(e) = meta_ok {
                self.spare_samples.push(expected.samples);
                self.bad_batch(
                    slot,
                    seq,
                    format!("slot {slot}, seq {seq}: bad batch metadata: {e}"),
                )?;
                progressed = true;
                continue;
            }
            let samples = expected.samples;
            let expected_len = samples.len() as u64 * self.cfg.sample_bytes();
            if taken.payload_len != expected_len {
                let what = format!(
                    "slot {slot}, seq {seq}: payload is {} bytes, the plan says {expected_len}",
                    taken.payload_len
                );
                self.spare_samples.push(samples);
                self.bad_batch(slot, seq, what)?;
                progressed = true;
                continue;
            }
            let buffer = self.free_buffers.pop().expect("checked non-empty");
            let len = taken.payload_len as usize;
            self.bytes += taken.payload_len;
            self.ring
                .header()
                .bytes_delivered
                .fetch_add(taken.payload_len, Relaxed);
            self.ring
                .desc(slot)
                .upload_ns
                .store(pinring_ring::clock::monotonic_ns(), Relaxed);
            progressed = true;
            if self.zero_copy {
                // No upload: the sink reads the slot in place; the slot stays UPLOADING (owned
                // by the daemon) until the sink reports back.
                self.zero_copy_commits.insert(slot, taken.commit_ns);

                let job = SinkJob {
                    seq,
                    source: sink::Source::Mapped {
                        slot,
                        ptr: sink::SlotPtr(self.ring.slot_ptr(slot)),
                    },
                    buffer,
                    len,
                    samples,
                };
                self.send_to_sink(job)?;
                continue;
            }
            self.inflight
                .insert(u64::from(slot), (seq, samples, len, taken.commit_ns));
            let job = UploadJob {
                tag: u64::from(slot),
                src: self.ring.slot_ptr(slot),
                len,
                buffer,
            };
            // SAFETY: the slot is UPLOADING, owned by this loop: no loader may claim it until
            // `hand_out` runs for it, which happens only after this job's completion arrives.
            // The mapping outlives the uploader (the ring Arc is held by self and the sink's doorbell).
            unsafe { self.uploader.submit(job) }?;
        }
        Ok(progressed)
    }

    fn record_latency(&mut self, commit_ns: u64, on_device_ns: u64) {
        if commit_ns != 0 && on_device_ns >= commit_ns {
            self.latencies.record_us((on_device_ns - commit_ns) / 1000);
        }
    }

    fn reap(&mut self) -> Result<(), DaemonError> {
        self.ring.check_file()?;
        let changed = self.ring.repair_header();
        if !changed.is_empty() {
            tracing::error!(ring = %self.cfg.ring.name, fields = %changed.join(", "),
                "another process changed this daemon's header fields; restored them (the daemon's \
                 liveness is its lock on the segment, so this fooled nobody, but find who writes \
                 into the ring)");
        }
        for slot in 0..self.assigned.len() as u32 {
            if let Some(seq) = self.ring.reclaim_if_owner_dead(slot) {
                tracing::warn!(ring = %self.cfg.ring.name, slot, seq, "loader died holding a slot: slot handed out again with the same seq");
                self.ring.wake_loaders(1);
            }
        }
        let reaped = self.ring.reap_dead_loaders();
        if reaped > 0 {
            tracing::warn!(ring = %self.cfg.ring.name, loaders = reaped, "removed dead loaders from the table");
        }
        self.recover()
    }

    fn finish(&mut self, result: &Result<(), DaemonError>) -> Summary {
        self.service.stopping("run finished: closing the ring");
        self.ring.set_state(ring_state::CLOSED);
        if let Err(e) = self.ring.unlink() {
            tracing::warn!("{e}");
        }
        // Stop the sink (joined below); the uploader's own thread stops when the last Arc is
        // dropped with the Daemon.
        self.sink_tx = None;
        let h = self.ring.header();
        let seconds = self
            .last_delivery
            .saturating_duration_since(self.started)
            .as_secs_f64();
        let missing = self.order.missing(self.end_seq);
        let last_delivered_seq = if self.delivered == 0 {
            None
        } else if self.cfg.ring.in_order {
            Some(h.next_deliver.load(Relaxed).saturating_sub(1))
        } else {
            None
        };
        let resume_seq = last_delivered_seq.map_or(self.start_seq, |s| s + 1);
        let loader_wait = h.loader_wait_ns.load(Relaxed) as f64 / 1e9;
        let loader_busy = h.loader_busy_ns.load(Relaxed) as f64 / 1e9;
        let daemon_wait = self.daemon_wait_ns as f64 / 1e9;
        let sink_busy = self.sink_busy_ns as f64 / 1e9;
        let mut summary = Summary {
            ring: self.cfg.ring.name.clone(),
            backend: self.backend_name.clone(),
            backend_reason: self.backend_reason.clone(),
            sink: self.sink_kind.name().into(),
            in_order: self.cfg.ring.in_order,
            start_seq: self.start_seq,
            end_seq: self.end_seq,
            batches_delivered: self.delivered,
            batches_verified: self.verified,
            verify_failures: self.verify_failures,
            duplicates: self.order.duplicates,
            out_of_order: self.order.out_of_order,
            missing,
            bytes: self.bytes,
            seconds,
            gbps: if seconds > 0.0 {
                self.bytes as f64 / seconds / 1e9
            } else {
                0.0
            },
            last_delivered_seq,
            resume_seq,
            reclaimed: h.reclaimed.load(Relaxed),
            rejected: h.rejected.load(Relaxed),
            leases_expired: self.ring.health().leases_expired.load(Relaxed),
            bad_batches_skipped: self.ring.health().bad_batches_skipped.load(Relaxed),
            reissued: self.ring.health().reissued.load(Relaxed),
            corrupt_descriptors: self.ring.health().corrupt_descriptors.load(Relaxed),
            registration_seconds: self.registration.as_ref().map_or(0.0, |r| r.seconds()),
            daemon_wait_seconds: daemon_wait,
            loader_wait_seconds: loader_wait,
            loader_busy_seconds: loader_busy,
            sink_busy_seconds: sink_busy,
            bound: verdict(seconds, daemon_wait, loader_wait, loader_busy, sink_busy).into(),
            interrupted: self.interrupted,
            zero_copy: self.zero_copy,
            registered: self.registration.is_some(),
            latency_p50_us: self.latencies.quantile_us(0.50),
            latency_p99_us: self.latencies.quantile_us(0.99),
            daemon_cpu_seconds: (cpu_seconds() - self.cpu_at_ready).max(0.0),
            thread_cpu_seconds: thread_cpu_seconds(),
            error: result.as_ref().err().map(|e| e.to_string()),
            exit_code: 0,
        };
        if let Some(t) = self.sink_thread.take() {
            let _ = t.join();
        }
        summary.exit_code = match result {
            Err(e) => e.exit().code(),
            Ok(()) => 0,
        };
        summary
    }
}

/// CPU seconds (user + system) this process has used so far.
fn cpu_seconds() -> f64 {
    use nix::sys::resource::{getrusage, UsageWho};
    match getrusage(UsageWho::RUSAGE_SELF) {
        Ok(u) => {
            let t = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
            t(u.user_time()) + t(u.system_time())
        }
        Err(_) => 0.0,
    }
}

/// CPU seconds (user + system) of each thread of this process, by thread name, from
/// /proc/self/task: where the daemon's CPU goes (its own threads and the GPU driver's).
fn thread_cpu_seconds() -> std::collections::BTreeMap<String, f64> {
    let mut out = std::collections::BTreeMap::new();
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for entry in dir.flatten() {
        let Some(stat) = std::fs::read_to_string(entry.path().join("stat"))
            .ok()
            .and_then(|text| pinring_ring::process::parse_stat(&text))
        else {
            continue;
        };
        *out.entry(stat.comm).or_insert(0.0) += (stat.utime + stat.stime) as f64 / ticks;
    }
    out
}

/// Turns a finished run into the final result: a verification problem found in the summary is an
/// error even if the loop itself ended cleanly.
pub fn judge(summary: &Summary, sink: SinkKind) -> Result<(), DaemonError> {
    let failed = summary.verify_failures > 0
        || summary.duplicates > 0
        || summary.out_of_order > 0
        || (sink == SinkKind::Verify && !summary.interrupted && summary.missing > 0);
    if failed {
        return Err(DaemonError::Verify {
            ring: summary.ring.clone(),
            first: summary
                .error
                .clone()
                .unwrap_or_else(|| "see the log for each failed batch".into()),
            failures: summary.verify_failures,
            duplicates: summary.duplicates,
            out_of_order: summary.out_of_order,
            missing: summary.missing,
        });
    }
    Ok(())
}
