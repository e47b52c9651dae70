//! A loader process: attaches to a ring by name, claims FREE slots, makes exactly the batch part
//! whose seq the slot carries (its payload, field-major: every sample's images, then every
//! sample's labels as little-endian i64, and its metadata, written straight into the slot; a
//! part is the whole batch when a batch fits one slot), commits it,
//! and repeats until the daemon closes the ring. Stateless: any number may run, join late, or
//! leave; the daemon's sequencer decides what each one makes.
//!
//! For a file kind (`dataset.kind = "tokens"`, `"npy"`, `"webdataset"`, `"imagefolder"`) the
//! loader opens the dataset's source once ([`pinring_sources::open_source`]); its length is `dataset.samples`,
//! which the daemon resolved the same way (the fingerprint covers it). Each sample of a part is
//! read into per-sample buffers (for the image kinds: decoded and transformed there by the
//! source's one `pinring_image::Pipeline`) and written at its field-major places; a sample that
//! cannot be read (or decoded) follows `dataset.on_bad_sample`.

use crate::{Failure, Joined, Next, PartBuffers, PartError, Session, SessionError};
use pinring_data::{
    ArenaCursor, BatchLayout, ByteRange, Config, DatasetKind, EncodedEntry, OnBadSample,
    ENTRY_BYTES, IMAGES,
};
use pinring_exit::{Coded, Exit};
use pinring_ring::{CommitError, LoaderRing, RingError, SlotWriter};
use pinring_runtime::settings::{self, Overrides};
use pinring_runtime::shutdown::Shutdown;
use pinring_sources::{FieldBuf, Source, SourceError};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub mod service;

/// Body of `pinring-loader` / `pinring loader`.
pub fn main(args: &LoaderArgs, shutdown: std::io::Result<Shutdown>) -> Exit {
    let shutdown = match pinring_runtime::installed(shutdown) {
        Ok(s) => s,
        Err(e) => return e,
    };
    // A loader blocked where it cannot look at the flag still ends on a stop signal: its
    // daemon puts back the slot it held, as after a SIGKILL (docs/RELIABILITY.md).
    if let Err(e) =
        pinring_runtime::shutdown::exit_if_stuck(STOP_DEADLINE, Exit::Ok.code(), "loader")
    {
        tracing::warn!("cannot watch for a stuck stop ({e}); SIGKILL ends a blocked loader");
    }
    match run(args, &shutdown) {
        Ok(r) => {
            tracing::info!(
                batches = r.batches,
                bytes = r.bytes,
                bad_samples = r.bad_samples,
                "loader finished"
            );
            Exit::Ok
        }
        Err(e) => {
            tracing::error!("{e}");
            e.exit()
        }
    }
}

/// How long after SIGTERM or SIGINT a loader that has not stopped by itself (blocked in a system
/// call) is ended anyway.
pub const STOP_DEADLINE: std::time::Duration = std::time::Duration::from_millis(900);

/// Loader settings (from flags).
#[derive(Debug, Clone, clap::Args)]
pub struct LoaderArgs {
    /// Config file (TOML); must describe the same dataset and plan as the daemon's. Without
    /// it, the loader adopts the spec the ring's daemon stored (a daemon with `--sink
    /// consumer` stores its resolved settings in the ring), and takes the config lookup's
    /// where the ring stores none.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Ring name (overrides ring.name).
    #[arg(long, value_name = "NAME")]
    pub ring: Option<String>,
    /// An anonymous ring, opened where its daemon holds it (`/proc/PID/fd/FD`) instead of by
    /// its name in /dev/shm: an embedded daemon's (`pinring.Loader(loaders=N)` passes it).
    #[arg(long, value_name = "PATH")]
    pub ring_path: Option<PathBuf>,
    /// How long to wait for the ring to exist and become ready, in seconds.
    #[arg(long, default_value_t = 30.0)]
    pub wait_secs: f64,
    /// When the daemon dies, wait for a new daemon on the same ring (up to --wait-secs) and
    /// attach to it instead of exiting with code 5.
    #[arg(long)]
    pub wait_for_daemon: bool,
    /// Running as a service: systemd instance, log level.
    #[command(flatten)]
    pub service: service::LoaderServiceArgs,
}

/// What a loader did.
#[derive(Debug, Default, Clone, Copy)]
pub struct LoaderReport {
    /// Batches committed.
    pub batches: u64,
    /// Payload bytes committed.
    pub bytes: u64,
    /// Commits refused because the slot had been reclaimed.
    pub reclaimed: u64,
    /// Samples of a file kind that could not be read and were replaced by zeros
    /// (`dataset.on_bad_sample = "skip"`).
    pub bad_samples: u64,
}

/// Why a loader stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum LoaderError {
    /// Bad config.
    #[error(transparent)]
    Config(#[from] pinring_data::ConfigError),
    /// Ring error.
    #[error(transparent)]
    Ring(#[from] RingError),
    /// Joining the ring, or the claim loop (pinring-producer).
    #[error(transparent)]
    Session(#[from] SessionError),
    /// A sample could not be read and `dataset.on_bad_sample` is `"fail"`.
    #[error("ring {ring:?}: sample {id} (epoch {epoch}, seq {seq}) cannot be read: {source}; dataset.on_bad_sample = \"fail\" stops the loader (\"skip\" substitutes zeros and goes on)")]
    BadSample {
        /// Ring name.
        ring: String,
        /// The part's seq.
        seq: u64,
        /// The sample id.
        id: u64,
        /// The epoch.
        epoch: u32,
        /// The reader's error (file, offset, problem).
        #[source]
        source: Box<SourceError>,
    },
    /// A part refused at its commit (a label outside the metadata's range).
    #[error(transparent)]
    Part(#[from] PartError),
}

impl LoaderError {
    /// For a [`LoaderError::BadSample`]: what the daemon reports of it (the sample, the part
    /// and the reader's error: file, member, offset), without the ring's name, which the
    /// daemon's message has.
    pub fn sample_message(&self) -> String {
        match self {
            LoaderError::BadSample {
                seq,
                id,
                epoch,
                source,
                ..
            } => format!(
                "sample {id} (epoch {epoch}, seq {seq}) cannot be read (loader pid {}): {source}",
                std::process::id()
            ),
            other => other.to_string(),
        }
    }
}

impl pinring_exit::Coded for LoaderError {
    fn exit(&self) -> pinring_exit::Exit {
        match self {
            LoaderError::Config(_) | LoaderError::BadSample { .. } => Exit::Config,
            LoaderError::Ring(e) => e.exit(),
            LoaderError::Session(e) => e.exit(),
            LoaderError::Part(e) => e.exit(),
        }
    }
}

/// Runs a loader until the ring closes or a stop is requested. With `--wait-for-daemon`, a
/// daemon that dies is waited for and replaced: the loader attaches to the next generation.
pub fn run(args: &LoaderArgs, shutdown: &Shutdown) -> Result<LoaderReport, LoaderError> {
    let overrides = Overrides {
        ring: args.ring.clone().or_else(|| args.service.instance_ring()),
        ..Default::default()
    };
    let mut joining = match (&args.config, &overrides.ring) {
        (None, Some(name)) => Joining::Adopt {
            name: name.clone(),
            opened: None,
        },
        _ => {
            let cfg = settings::load(args.config.as_deref(), &overrides)?;
            match args.config {
                Some(_) => Joining::own(cfg)?,
                None => Joining::Adopt {
                    name: cfg.ring.name.clone(),
                    opened: None,
                },
            }
        }
    };
    let wait = Duration::from_secs_f64(args.wait_secs.max(0.0));
    let mut service = service::LoaderService::waiting(joining.ring());
    let mut total = LoaderReport::default();
    loop {
        let outcome = run_attached(
            &mut joining,
            &overrides,
            args.ring_path.as_deref(),
            wait,
            shutdown,
            &mut service,
        );
        match outcome.map_err(|b| *b) {
            Ok(report) => {
                total.add(&report);
                return Ok(total);
            }
            Err((report, e @ LoaderError::Session(SessionError::DaemonGone { .. })))
                if args.wait_for_daemon && !shutdown.requested() =>
            {
                total.add(&report);
                tracing::warn!("{e}; waiting up to {wait:?} for a new daemon (--wait-for-daemon)");
            }
            Err((_, e)) => return Err(e),
        }
    }
}

/// The dataset's source of a joined loader (file kinds), borrowed from its [`Joining`].
type SourceRef<'a> = Option<&'a mut (dyn Source + 'static)>;

/// What a loader joins its ring with, and the dataset's source (file kinds), opened once per
/// process where it can be.
enum Joining {
    /// `--config`, or the lookup's config for a ring that stores no spec: the loader's own
    /// settings, its source opened before it joins (the fingerprint covers the source's length).
    Own {
        cfg: Box<Config>,
        source: Option<Box<dyn Source>>,
    },
    /// No `--config`: the spec ring `name`'s daemon stored (`Session::join_adopting`), and the
    /// source opened for the ring fingerprint it was adopted from (a new daemon with other
    /// settings has it opened again).
    Adopt {
        name: String,
        opened: Option<(u64, Option<Box<dyn Source>>)>,
    },
}

impl Joining {
    /// The loader's own config `cfg`, its source opened (a kind pinring-loader makes).
    fn own(mut cfg: Config) -> Result<Joining, LoaderError> {
        refuse_external(&cfg)?;
        let source = open_source_logged(&mut cfg)?;
        Ok(Joining::Own {
            cfg: Box::new(cfg),
            source,
        })
    }

    fn ring(&self) -> &str {
        match self {
            Joining::Own { cfg, .. } => &cfg.ring.name,
            Joining::Adopt { name, .. } => name,
        }
    }

    /// Joins the ring (at `at`): with the own config, or adopting the ring's spec; a ring that
    /// stores none turns an adopting loader to the lookup's config for good.
    fn join(
        &mut self,
        overrides: &Overrides,
        at: Option<&std::path::Path>,
        wait: Duration,
        stop: impl Fn() -> bool + Copy,
    ) -> Result<Option<(Session, SourceRef<'_>)>, LoaderError> {
        if let Joining::Adopt { name, .. } = self {
            match Session::join_adopting(name, at, wait, stop) {
                Err(SessionError::NoStoredSpec { ring }) => {
                    tracing::info!(ring = %ring, "the ring stores no spec (its daemon's sink is not a consumer): the config lookup's is used");
                    *self = Joining::own(settings::load(None, overrides)?)?;
                }
                other => {
                    let Some(session) = other? else {
                        return Ok(None);
                    };
                    refuse_external(session.config())?;
                    let Joining::Adopt { opened, .. } = self else {
                        unreachable!("matched above")
                    };
                    let fingerprint = session.ring().fingerprint();
                    if opened.as_ref().map(|(f, _)| *f) != Some(fingerprint) {
                        let source = open_source_logged(&mut session.config().clone())?;
                        *opened = Some((fingerprint, source));
                    }
                    let source = opened.as_mut().and_then(|(_, s)| s.as_deref_mut());
                    return Ok(Some((session, source)));
                }
            }
        }
        let Joining::Own { cfg, source } = self else {
            unreachable!("an adopting loader returned above or turned to its own config")
        };
        let Some(session) = Session::join_at(Config::clone(cfg), at, wait, stop)? else {
            return Ok(None);
        };
        // decode = "auto": the session took the daemon's resolution (`Session::check_ring`);
        // a ring that carries images encoded needs the source that writes them so.
        let auto = |c: &Config| c.dataset.image.as_ref().map(|i| i.decode);
        if auto(cfg) == Some(pinring_data::ImageDecode::Auto)
            && auto(session.config()) == Some(pinring_data::ImageDecode::Gpu)
            && source.as_ref().is_some()
        {
            *source = open_source_logged(&mut session.config().clone())?;
        }
        Ok(Some((session, source.as_deref_mut())))
    }
}

/// The dataset's source of `cfg` (file kinds; `None` for the synthetic kind), opened and logged.
fn open_source_logged(cfg: &mut Config) -> Result<Option<Box<dyn Source>>, LoaderError> {
    let source = pinring_sources::open_source(cfg)?;
    if let Some(src) = &source {
        tracing::info!(ring = %cfg.ring.name, kind = %cfg.dataset.kind, samples = src.len(), "dataset opened");
    }
    Ok(source)
}

/// pinring-loader makes synthetic samples and reads files; an external ring is Python's to fill.
fn refuse_external(cfg: &Config) -> Result<(), LoaderError> {
    if cfg.dataset.kind != DatasetKind::External {
        return Ok(());
    }
    Err(LoaderError::Config(pinring_data::ConfigError::Invalid {
        source_name: cfg.source.clone(),
        key: "dataset.kind",
        value: "\"external\"".to_string(),
        allowed: "pinring-loader makes kind = \"synthetic\" samples; an external ring is \
                  filled by Python producers (pinring.Producer, pinring.torch.DataLoader)"
            .to_string(),
    }))
}

impl LoaderReport {
    fn add(&mut self, other: &LoaderReport) {
        self.batches += other.batches;
        self.bytes += other.bytes;
        self.reclaimed += other.reclaimed;
        self.bad_samples += other.bad_samples;
    }
}

/// Runs this loader on `daemon.loader_cpus`, else on its daemon's CPUs where those are fewer
/// than its own (the GPU's NUMA node's, docs/ARCHITECTURE.md "NUMA placement"); logged.
fn place(ring: &LoaderRing, cfg: &Config) {
    let wanted = pinring_runtime::numa::cpus(cfg.daemon.loader_cpus.as_ref());
    match pinring_runtime::numa::follow(ring.daemon().pid as i32, wanted.as_deref()) {
        Ok(Some(cpus)) => {
            tracing::info!(ring = %cfg.ring.name, cpus = %pinring_runtime::numa::format_list(&cpus), "loader pinned")
        }
        Ok(None) => {}
        Err(e) => {
            tracing::warn!(ring = %cfg.ring.name, error = %e, "cannot pin this loader to its CPUs; it runs where the kernel puts it")
        }
    }
}

/// One attachment: attach to the ring's current daemon and work until the ring closes, a stop is
/// requested, or the daemon dies.
fn run_attached(
    joining: &mut Joining,
    overrides: &Overrides,
    at: Option<&std::path::Path>,
    wait: Duration,
    shutdown: &Shutdown,
    service: &mut service::LoaderService,
) -> Result<LoaderReport, Box<(LoaderReport, LoaderError)>> {
    let none = |e: LoaderError| Box::new((LoaderReport::default(), e));
    let name = joining.ring().to_string();
    let stop = || shutdown.requested();
    let (mut session, source) = match joining.join(overrides, at, wait, stop) {
        Ok(Some(joined)) => joined,
        Ok(None) => {
            tracing::info!(ring = %name, "stop requested while waiting for the ring: not attached");
            return Ok(LoaderReport::default());
        }
        Err(e) => return Err(none(e)),
    };
    let seat = session.seat();
    let index = seat.index;
    tracing::info!(ring = %name, loader = index, tenure = seat.tenure, pid = std::process::id(), "attached");
    service.attached(index);
    // The ring and config, shared with the session: the worker reads them while the session
    // claims.
    let joined = Arc::clone(session.joined());
    place(&joined.ring, &joined.cfg);
    let mut worker = Worker {
        joined: &joined,
        session: &mut session,
        bufs: PartBuffers::default(),
        field_buf: Vec::new(),
        report: LoaderReport::default(),
        service,
        source,
        sample_bufs: Vec::new(),
    };
    let result = worker.work(shutdown);
    let report = worker.report;
    worker.service.stopping(report.batches);
    session.leave();
    if report.bad_samples > 0 {
        tracing::warn!(ring = %name, loader = index, bad_samples = report.bad_samples, "{} samples could not be read and were replaced by zeros (dataset.on_bad_sample = \"skip\")", report.bad_samples);
    }
    tracing::info!(ring = %name, loader = index, batches = report.batches, bytes = report.bytes, bad_samples = report.bad_samples, "detached");
    result.map(|()| report).map_err(|e| Box::new((report, e)))
}

/// Fills a synthetic part into `slot`: a byte part of one sample (its range of the images, and
/// the sample's label in its first part), or a part of whole samples, field-major; the images
/// written straight into the slot, the other fields (the labels) made in `field_buf` first.
/// False if the payload does not fit the slot or a field cannot be made.
fn fill_synthetic(
    joined: &Joined,
    field_buf: &mut Vec<u8>,
    slot: &mut SlotWriter<'_>,
    samples: &[u64],
    range: Option<ByteRange>,
    payload_len: usize,
    seq: u64,
) -> bool {
    let (cfg, ring_name) = (&joined.cfg, &joined.cfg.ring.name);
    let synthetic = cfg.synthetic();
    let sample_bytes = cfg.sample_bytes() as usize;
    let layout = &joined.layout;
    // A field other than the images (the labels): made into `buf`, written at
    // byte `at` of the slot; false if it does not fit or cannot be made.
    let other_field = |name: &str,
                       buf: &mut Vec<u8>,
                       slot: &mut pinring_ring::SlotWriter<'_>,
                       at: usize,
                       len: usize| {
        buf.resize(len, 0);
        match synthetic.fill_field(name, samples, buf) {
            Ok(()) => slot.write(at, buf).is_ok(),
            Err(e) => {
                tracing::error!(ring = %ring_name, seq, "{e}");
                false
            }
        }
    };
    // A byte part of one sample (its range of the images, and the sample's label
    // in its first part), or a part of whole samples.
    if let Some(r) = range {
        let mut fits = payload_len <= slot.len() && samples.len() == 1;
        let id = samples.first().copied().unwrap_or(0);
        for copy in layout.part_copies(1, 0, Some(r)) {
            let field = &layout.fields[copy.field];
            let (at, len) = (copy.src_offset as usize, copy.len as usize);
            if len == 0 {
                continue;
            }
            if copy.field == layout.cut_field && field.name == IMAGES {
                // Straight into the slot from word offset / 8 of the sample on.
                if r.offset % 8 == 0 {
                    let mut words = synthetic.sample_words_from(id, r.offset / 8);
                    fits &= slot.write_words(at, len, || words.next_word()).is_ok();
                } else {
                    field_buf.resize(len, 0);
                    synthetic.fill_sample_range(id, r.offset, field_buf);
                    fits &= slot.write(at, field_buf).is_ok();
                }
                continue;
            }
            fits &= other_field(&field.name, field_buf, slot, at, len);
        }
        fits
    } else {
        let count = samples.len() as u64;
        let mut fits = payload_len <= slot.len();
        // Field-major: each field's chunk holds that field of every sample, in order.
        for field in &layout.fields {
            let (offset, len) = field.chunk_in_part(count);
            let offset = offset as usize;
            if field.name == IMAGES {
                // Straight into the slot: no intermediate payload buffer.
                for (n, &i) in samples.iter().enumerate() {
                    let mut words = synthetic.sample_words(i);
                    fits &= slot
                        .write_words(offset + n * sample_bytes, sample_bytes, || {
                            words.next_word()
                        })
                        .is_ok();
                }
                continue;
            }
            fits &= other_field(&field.name, field_buf, slot, offset, len as usize);
        }
        fits
    }
}

struct Worker<'a> {
    /// The ring, config and layout the session joined with.
    joined: &'a Joined,
    /// The seat and the claim loop.
    session: &'a mut Session,
    /// A part's sample ids, labels and encoded metadata, reused from part to part.
    bufs: PartBuffers,
    /// A field other than the images (the labels), made here and then copied into the slot.
    field_buf: Vec<u8>,
    report: LoaderReport,
    service: &'a mut service::LoaderService,
    /// The dataset's source (file kinds), opened once per process.
    source: Option<&'a mut (dyn Source + 'static)>,
    /// One sample's fields (file kinds), read here and then copied into the slot.
    sample_bufs: Vec<Vec<u8>>,
}

impl Worker<'_> {
    fn work(&mut self, shutdown: &Shutdown) -> Result<(), LoaderError> {
        let (cfg, ring_name) = (&self.joined.cfg, &self.joined.cfg.ring.name);
        let layout = &self.joined.layout;
        let policy = cfg.dataset.on_bad_sample;
        loop {
            if shutdown.requested() {
                return Ok(());
            }
            self.service.tick(self.report.batches);
            let (service, batches) = (&mut *self.service, self.report.batches);
            let mut stop = || {
                service.tick(batches);
                shutdown.requested()
            };
            let claim = match self.session.claim(None, &mut stop)? {
                Next::Part(claim) => claim,
                Next::Ended | Next::Stopped | Next::TimedOut => return Ok(()),
            };
            // The seq names one part of a batch: its samples, its metadata (the part's seq and
            // sample ids, the batch's epoch and index), into this slot. A seq the plan cannot
            // make is committed failed by the session.
            let bufs = std::mem::take(&mut self.bufs);
            let mut part = match self.session.part(self.joined, claim, bufs) {
                Ok(part) => part,
                Err(failed) => {
                    self.book(failed.committed.map(|()| 0).map_err(PartError::from));
                    continue;
                }
            };
            let seq = part.seq();
            let (epoch, range) = (part.part().epoch, part.part().bytes);
            let payload_len = part.payload_len() as usize;
            // A sample that cannot be read with on_bad_sample = "fail", or a label out of
            // range: the part is committed failed with its message, then the loader stops with
            // this error.
            let mut fatal = None;
            let fits = match self.source.as_deref_mut() {
                Some(src) => {
                    let (mut slot, samples) = part.writer_and_samples().expect("a live part");
                    let fits = payload_len <= slot.len();
                    let filled = fill_from_source(
                        src,
                        &mut FileFill {
                            slot: &mut slot,
                            layout,
                            samples,
                            epoch,
                            policy,
                            bufs: &mut self.sample_bufs,
                            bytes: range,
                            bad: &mut self.report.bad_samples,
                            counter: &self.joined.ring,
                            ring: ring_name,
                            seq,
                        },
                    );
                    match filled {
                        Ok(ok) => fits && ok,
                        Err((id, e)) => {
                            fatal = Some(LoaderError::BadSample {
                                ring: ring_name.clone(),
                                seq,
                                id,
                                epoch,
                                source: Box::new(e),
                            });
                            false
                        }
                    }
                }
                None => {
                    let (mut slot, samples) = part.writer_and_samples().expect("a live part");
                    fill_synthetic(
                        self.joined,
                        &mut self.field_buf,
                        &mut slot,
                        samples,
                        range,
                        payload_len,
                        seq,
                    )
                }
            };
            let done = match (&fatal, fits) {
                // The daemon ends the run with this message (exit 3).
                (Some(err), _) => part.fail(Failure::Sample(&err.sample_message())),
                (None, false) => part.fail(Failure::Unfit),
                (None, true) => match part.commit() {
                    Err(e @ PartError::Label { .. }) => {
                        let err = LoaderError::Part(e);
                        let done = part.fail(Failure::Sample(&err.sample_message()));
                        fatal = Some(err);
                        done
                    }
                    other => other,
                },
            };
            drop(part);
            let done = done.map(|d| {
                self.bufs = d.bufs;
                d.payload_len
            });
            self.book(done);
            if let Some(e) = fatal {
                return Err(e);
            }
        }
    }

    /// Books what a part's commit (or fail) published.
    fn book(&mut self, done: Result<u64, PartError>) {
        let ring = &self.joined.cfg.ring.name;
        match done {
            Ok(payload_len) => {
                self.report.batches += 1;
                self.report.bytes += payload_len;
            }
            Err(PartError::Commit(e @ CommitError::Reclaimed { .. })) => {
                self.report.reclaimed += 1;
                tracing::warn!(ring = %ring, "{e}");
            }
            // Cannot happen with a validated config; report and move on.
            Err(e) => tracing::error!(ring = %ring, "{e}"),
        }
    }
}

/// What [`fill_from_source`] fills, and with what.
struct FileFill<'s, 'w> {
    slot: &'s mut SlotWriter<'w>,
    layout: &'s BatchLayout,
    samples: &'s [u64],
    epoch: u32,
    policy: OnBadSample,
    bufs: &'s mut Vec<Vec<u8>>,
    /// A byte part's range of the sample's cut field (the part has one sample); `None`: whole
    /// samples.
    bytes: Option<ByteRange>,
    bad: &'s mut u64,
    /// The ring's count of skipped samples (all loaders'), for `pinring status` and the summary.
    counter: &'s LoaderRing,
    ring: &'s str,
    seq: u64,
}

impl FileFill<'_, '_> {
    /// Sample `id` (or its byte `range`) could not be read. Under `on_bad_sample = "fail"`, and
    /// for a caller's mistake (buffers, an id past the end: never a bad sample to skip), the
    /// error that ends the part. Under `"skip"`: counted, logged, and every field's buffer
    /// zeroed as the substitute.
    fn bad_read(
        &mut self,
        id: u64,
        e: SourceError,
        range: Option<ByteRange>,
    ) -> Result<(), (u64, SourceError)> {
        let data = !matches!(
            e,
            SourceError::Buffers { .. } | SourceError::OutOfRange { .. }
        );
        if self.policy == OnBadSample::Fail || !data {
            tracing::error!(ring = %self.ring, seq = self.seq, sample = id, epoch = self.epoch, "{e}");
            return Err((id, e));
        }
        *self.bad += 1;
        self.counter.count_bad_sample();
        let what = match range {
            Some(r) => format!("bytes {}..{} of sample {id}", r.offset, r.offset + r.len),
            None => format!("sample {id}"),
        };
        tracing::warn!(ring = %self.ring, seq = self.seq, sample = id, epoch = self.epoch, "{what} replaced by zeros (dataset.on_bad_sample = \"skip\"): {e}");
        for b in self.bufs.iter_mut() {
            b.fill(0);
        }
        Ok(())
    }
}

/// Reads the part's samples from `src`, each into per-sample buffers (one per field), and writes
/// every field at its field-major place in the slot: field `f` of sample `n` at
/// `chunk_in_part(count).0 + n × sample_bytes`. A sample
/// that cannot be read is, with `"skip"`, zeros in every field (counted, and logged naming the
/// sample and the file); with `"fail"`, the error (its sample id) ends the part. Returns whether
/// every write landed in the slot.
fn fill_from_source(
    src: &mut dyn Source,
    f: &mut FileFill<'_, '_>,
) -> Result<bool, (u64, SourceError)> {
    if let Some(r) = f.bytes {
        return fill_range_from_source(src, f, r);
    }
    let (layout, samples) = (f.layout, f.samples);
    let count = samples.len() as u64;
    let fields = &layout.fields;
    f.bufs.resize_with(fields.len(), Vec::new);
    for (buf, field) in f.bufs.iter_mut().zip(fields) {
        buf.resize(field.sample_bytes as usize, 0);
    }
    // An encoded images field (decode = "gpu"): entries and the part's arena (pinring-data's
    // `encoded`).
    let encoded = layout.encoded_field();
    let mut arena = encoded.map(|k| {
        ArenaCursor::new(
            samples.len(),
            fields[k].wire_bytes.saturating_sub(ENTRY_BYTES),
        )
    });
    let mut fits = true;
    for (n, &id) in samples.iter().enumerate() {
        let read = {
            let mut out: Vec<FieldBuf<'_>> = f
                .bufs
                .iter_mut()
                .enumerate()
                .map(|(k, b)| match encoded == Some(k) {
                    true => FieldBuf::Bytes(b),
                    false => FieldBuf::Fixed(b.as_mut_slice()),
                })
                .collect();
            src.read(f.epoch, id, &mut out)
        };
        if let Err(e) = read {
            f.bad_read(id, e, None)?;
            if let Some(k) = encoded {
                f.bufs[k].clear();
                f.bufs[k].extend_from_slice(&EncodedEntry::ZEROS.to_bytes());
            }
        }
        for (k, (buf, field)) in f.bufs.iter().zip(fields).enumerate() {
            let (offset, _) = field.chunk_in_part(count);
            if let (Some(arena), true) = (arena.as_mut(), encoded == Some(k)) {
                fits &= write_encoded(f.slot, offset, arena, n, buf).map_err(|e| {
                    let at = src.locate(id).unwrap_or_else(|| format!("sample {id}"));
                    let problem = format!(
                        "sample {id} ({at}): {e}; raise [dataset.image] encoded_bytes (the \
                         compressed bytes a batch may carry; now {} a sample)",
                        field.wire_bytes.saturating_sub(ENTRY_BYTES)
                    );
                    tracing::error!(ring = %f.ring, seq = f.seq, sample = id, "{problem}");
                    (id, SourceError::Declared { problem })
                })?;
                continue;
            }
            let at = offset as usize + n * field.sample_bytes as usize;
            fits &= f.slot.write(at, buf).is_ok();
        }
    }
    Ok(fits)
}

/// Writes sample `n` of an encoded chunk at `chunk` in the slot: `buf` is its compressed bytes
/// then its entry's [`ENTRY_BYTES`] ([`pinring_sources::Planned`]); the bytes go where
/// `arena` places them, the entry (with their place) at `n × ENTRY_BYTES`. Returns whether both
/// writes landed in the slot; the sample's bytes not fitting the arena is the error.
fn write_encoded(
    slot: &mut SlotWriter<'_>,
    chunk: u64,
    arena: &mut ArenaCursor,
    n: usize,
    buf: &[u8],
) -> Result<bool, pinring_data::ArenaFull> {
    const HEAD: usize = ENTRY_BYTES as usize;
    let split = buf.len().checked_sub(HEAD);
    let tail = split.and_then(|at| <&[u8; HEAD]>::try_from(&buf[at..]).ok());
    let (entry, bytes) = match (split, tail) {
        (Some(at), Some(t)) => (EncodedEntry::from_bytes(t), &buf[..at]),
        // Not what Planned gives (a source of another kind): a sample of zeros.
        _ => (EncodedEntry::ZEROS, &buf[..0]),
    };
    let p = arena.put(n, entry, bytes.len())?;
    let mut fits = slot.write((chunk + p.data_at) as usize, bytes).is_ok();
    fits &= slot.write((chunk + p.entry_at) as usize, &p.entry).is_ok();
    Ok(fits)
}

/// A byte part of one sample from `src`: its range `r` of the cut field, and in the sample's
/// first part the other fields whole, each read with [`Source::read_range`] (a `pread` of just
/// those bytes) and written where [`BatchLayout::part_copies`] puts it in the payload. A range
/// that cannot be read follows `on_bad_sample` like a whole sample: `"skip"` writes zeros for
/// this part (counted once per byte part), `"fail"` ends the part with the error.
fn fill_range_from_source(
    src: &mut dyn Source,
    f: &mut FileFill<'_, '_>,
    r: ByteRange,
) -> Result<bool, (u64, SourceError)> {
    let fields = &f.layout.fields;
    f.bufs.resize_with(fields.len(), Vec::new);
    let Some(&id) = f.samples.first() else {
        return Ok(true);
    };
    let mut read = Ok(());
    for copy in f.layout.part_copies(1, 0, Some(r)) {
        let buf = &mut f.bufs[copy.field];
        buf.resize(copy.len as usize, 0);
        if copy.len == 0 || read.is_err() {
            continue;
        }
        let at = if copy.field == f.layout.cut_field {
            r.offset
        } else {
            0
        };
        read = src.read_range(f.epoch, id, copy.field, at, buf);
    }
    if let Err(e) = read {
        f.bad_read(id, e, Some(r))?;
    }
    let mut fits = true;
    for copy in f.layout.part_copies(1, 0, Some(r)) {
        if copy.len == 0 {
            continue;
        }
        let buf = &f.bufs[copy.field];
        fits &= f.slot.write(copy.src_offset as usize, buf).is_ok();
    }
    Ok(fits)
}
