//! `pinring bench`: one command that measures, in one run, the raw copy ceiling (registered
//! memory, no pipeline), the pageable ceiling, and the full pipeline (a daemon and N loader
//! processes) over slot sizes and loader counts, plus a few modes side by side (pageable ring,
//! upload + compute, zero-copy compute, verify). Prints a table and writes `bench.csv` and
//! `bench.svg`. Without a GPU it runs the host backend and says so: those numbers measure the
//! protocol and memory bandwidth, not PCIe.
//!
//! Every pipeline run is followed by a run of the reference pipeline ([`crate::reference`]) at
//! the same writers, slot size, ring size and bytes, so each row says how far pinring is from a
//! pipeline without its protocol. `--repeat N` measures each point N times, pipeline and
//! reference alternating, and reports the median and range ([`crate::stats`]); a point whose
//! runs spread by more than 10% is flagged. The CSV keeps every run and the per-point summary.

use crate::reference::{self, ReferenceError};
use crate::stats::{self, Stats, SPREAD_FLAG};
use pinring_backend::BackendKind;
use pinring_daemon::parse_backend_kind;
use pinring_daemon::summary::Summary;
use pinring_data::{ByteSize, Config, DatasetConfig, Dtype, PlanConfig, RingConfig, SlotBytes};
use pinring_exit::Exit;
use pinring_runtime::children::Children;
use pinring_runtime::output::write_file;
use pinring_runtime::shutdown::Shutdown;
use pinring_runtime::this_program::ThisProgram;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

pub mod decode;
mod report;
pub use report::CSV_COLUMNS;
use report::{plot, plot_rings_if, replot, to_csv};

/// `pinring bench` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// GPU backend: auto, cuda or host.
    #[arg(long, default_value = "auto", value_parser = parse_backend_kind)]
    pub backend: BackendKind,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// Payload bytes per batch (= per slot), comma separated.
    #[arg(long, value_delimiter = ',', default_value = "64KiB,1MiB,4MiB")]
    pub slot_sizes: Vec<ByteSize>,
    /// Loader process counts, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,4,8")]
    pub loaders: Vec<usize>,
    /// Payload bytes each pipeline run moves (fewer for small slots: at most 400000 batches).
    /// Default: what the slot size's registered ceiling moves in --run-seconds.
    #[arg(long)]
    pub run_bytes: Option<ByteSize>,
    /// Without --run-bytes, each run moves what the raw registered copy moves in this many
    /// seconds at its slot size (at least 64 batches): at the link's speed a run lasts about
    /// that long, so the ramp at its start (loaders attaching, the first fills) weighs little
    /// against the steady rate. The defaults (3 slot sizes, 3 loader counts, 5 modes) finish in
    /// about a minute on a GPU host; the time left is printed after each point.
    #[arg(long, default_value_t = 0.5)]
    pub run_seconds: f64,
    /// Ring sizes, comma separated: each slot size runs in a ring of ring_bytes / slot size
    /// slots, at least 8 and at most 4096 (a size that gives a slot count already run at that
    /// slot size is skipped). The default keeps the ring in a server's last-level cache. More
    /// than one size also draws `bench-rings.svg`: GB/s against ring size, a line per slot size.
    #[arg(long, value_delimiter = ',', default_value = "64MiB")]
    pub ring_bytes: Vec<ByteSize>,
    /// Slot size and loader count of the side-by-side mode comparison.
    #[arg(long, default_value = "4MiB")]
    pub mode_slot: ByteSize,
    /// Loader count of the mode comparison.
    #[arg(long, default_value_t = 8)]
    pub mode_loaders: usize,
    /// Deliver in any order (the daemon's --unordered) in every pipeline run.
    #[arg(long)]
    pub unordered: bool,
    /// The daemon's --look-ahead in every pipeline run (in order: parts looked at past one
    /// not READY yet; 0 uploads in seq order only). Default: the daemon's.
    #[arg(long, value_name = "N")]
    pub look_ahead: Option<u32>,
    /// Skip the side-by-side mode comparison.
    #[arg(long)]
    pub skip_modes: bool,
    /// Runs per point, each followed by a run of the reference pipeline; the table reports the
    /// median and min-max of GB/s and flags (`!`) a point whose runs spread more than 10%.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub repeat: u32,
    /// Size of the ring registered once to time registration (0: skip).
    #[arg(long, default_value = "1GiB")]
    pub register_bytes: ByteSize,
    /// Measure nothing: redraw `bench.svg` in --out from a `bench.csv` written earlier.
    #[arg(long, value_name = "CSV")]
    pub replot: Option<PathBuf>,
    /// Directory for bench.csv, bench.svg and the per-run configs and summaries.
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
    /// Decode mode, instead of the copy measurements: JPEG images/s and CPU cores of
    /// `[dataset.image] decode = "cpu"` (the loaders decode) and `"gpu"` (the daemon's engine
    /// decodes as it copies) side by side on the same WebDataset shards, each run a daemon and
    /// its loaders; writes decode.csv.
    #[arg(long)]
    pub decode: bool,
    /// Decode mode: the WebDataset shards (comma separated); none: synthetic 500x375 JPEGs
    /// (quality 90, 4:2:0) made once in --out/decode-shards.
    #[arg(long, value_delimiter = ',', value_name = "TAR")]
    pub decode_shards: Vec<PathBuf>,
    /// Decode mode: loader process counts, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "2")]
    pub decode_loaders: Vec<usize>,
    /// Decode mode: synthetic images to make when no shards are given.
    #[arg(long, default_value_t = 4096)]
    pub decode_images: u32,
    /// Decode mode: batch size.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    pub decode_batch: u32,
    /// Decode mode: `ring.slot_bytes` of the runs (default "auto").
    #[arg(long, value_name = "BYTES")]
    pub decode_slot_bytes: Option<ByteSize>,
    /// Decode mode: `[dataset.image] encoded_bytes` of the decode = "gpu" runs (default the
    /// config's: 256 KiB a sample).
    #[arg(long, value_name = "BYTES")]
    pub decode_encoded_bytes: Option<ByteSize>,
    /// Decode mode: epochs of a run.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    pub decode_epochs: u32,
}

/// Why the benchmark failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Backend selection or a raw measurement failed.
    #[error(transparent)]
    Backend(#[from] pinring_backend::BackendError),
    /// Files could not be written.
    #[error("bench output {path}: {source}")]
    Io {
        /// Path.
        path: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A pipeline run failed.
    #[error("pipeline run ({what}) failed: {why}")]
    Run {
        /// Which run.
        what: String,
        /// What happened.
        why: String,
    },
    /// An output file could not be written.
    #[error(transparent)]
    Output(#[from] pinring_runtime::output::OutputError),
    /// The plot could not be drawn.
    #[error("cannot draw {path}: {why}")]
    Plot {
        /// Path.
        path: String,
        /// Cause.
        why: String,
    },
    /// SIGTERM or SIGINT arrived: the bench stopped its runs and wrote what it had measured.
    #[error("stopped by SIGTERM or SIGINT")]
    Interrupted,
    /// A run of the reference pipeline failed.
    #[error("reference run ({what}) failed: {source}")]
    Reference {
        /// Which run.
        what: String,
        /// Cause.
        #[source]
        source: Box<ReferenceError>,
    },
}

impl pinring_exit::Coded for BenchError {
    /// Exit code.
    fn exit(&self) -> pinring_exit::Exit {
        match self {
            BenchError::Backend(_) => Exit::Backend,
            BenchError::Io { .. } | BenchError::Plot { .. } | BenchError::Output(_) => Exit::Output,
            BenchError::Run { .. } => Exit::PeerDied,
            BenchError::Reference { source, .. } => source.exit(),
            BenchError::Interrupted => Exit::Ok,
        }
    }
}

/// One pipeline run and the reference run measured right after it.
#[derive(Debug, Clone)]
pub struct Run {
    /// 1-based index of the run within its point.
    pub index: u32,
    /// Payload GB/s.
    pub gbps: f64,
    /// Payload bytes delivered.
    pub bytes: u64,
    /// Batches per second.
    pub batches_per_s: f64,
    /// Daemon CPU seconds per GB moved.
    pub cpu_s_per_gb: f64,
    /// Commit-to-on-device latency, p50, microseconds.
    pub p50_us: u32,
    /// p99.
    pub p99_us: u32,
    /// Where the run was bound.
    pub bound: String,
    /// The reference pipeline's GB/s at the same point (NaN when not measured: an old CSV).
    pub ref_gbps: f64,
    /// Payload bytes the reference moved.
    pub ref_bytes: u64,
}

impl Run {
    /// pinring's GB/s over the reference's.
    pub fn ratio_to_ref(&self) -> f64 {
        self.gbps / self.ref_gbps
    }
}

/// One point: a mode at one slot size and loader count, over its `--repeat` runs.
#[derive(Debug, Clone)]
pub struct Point {
    /// What ran ("pipeline", "pageable ring (--no-register)", ...).
    pub mode: String,
    /// Payload bytes per batch.
    pub slot: u64,
    /// Slots in the ring (0: not recorded, a CSV of an older bench).
    pub slots: u32,
    /// Loader processes (and reference writers).
    pub loaders: usize,
    /// Raw registered ceiling at this size, GB/s.
    pub raw_gbps: f64,
    /// The runs, in order.
    pub runs: Vec<Run>,
}

impl Point {
    /// Median and range of pinring's GB/s.
    pub fn gbps(&self) -> Option<Stats> {
        Stats::of(&self.runs.iter().map(|r| r.gbps).collect::<Vec<_>>())
    }

    /// Median and range of the reference's GB/s.
    pub fn reference(&self) -> Option<Stats> {
        Stats::of(&self.runs.iter().map(|r| r.ref_gbps).collect::<Vec<_>>())
    }

    /// pinring's median GB/s (0 with no run): what the table reports and the plots draw.
    pub fn median_gbps(&self) -> f64 {
        self.gbps().map_or(0.0, |s| s.median)
    }

    /// The reference's median GB/s, where it was measured (an older CSV has none).
    pub fn reference_median(&self) -> Option<f64> {
        self.reference().map(|s| s.median).filter(|m| m.is_finite())
    }

    /// Median pinring GB/s over median reference GB/s.
    pub fn ratio_to_ref(&self) -> Option<f64> {
        let (p, r) = (self.gbps()?, self.reference()?);
        (r.median > 0.0).then(|| p.median / r.median)
    }

    /// Whether pinring's or the reference's runs spread more than [`SPREAD_FLAG`].
    pub fn flagged(&self) -> bool {
        self.gbps().is_none_or(|s| s.flagged()) || self.reference().is_some_and(|s| s.flagged())
    }

    /// The median of one per-run value.
    fn median_of(&self, f: impl Fn(&Run) -> f64) -> f64 {
        stats::median(&self.runs.iter().map(f).collect::<Vec<_>>()).unwrap_or(0.0)
    }

    /// The verdict most runs gave.
    pub fn bound(&self) -> &str {
        stats::most_common(self.runs.iter().map(|r| r.bound.as_str())).unwrap_or("-")
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BenchError + '_ {
    move |source| BenchError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// What a bench measured: every point done, and whether SIGTERM or SIGINT cut it short.
#[derive(Debug, Clone)]
pub struct Measured {
    /// The points measured, in order.
    pub points: Vec<Point>,
    /// Whether the bench stopped early on SIGTERM or SIGINT (the CSV holds the points done).
    pub interrupted: bool,
}

/// Runs the benchmark; prints as it goes. SIGTERM or SIGINT (`stop`) ends the run in progress
/// within a second: its children are stopped, the CSV and plot are written with the points
/// done, and the result says it was interrupted.
pub fn run(args: &BenchArgs, stop: &Shutdown) -> Result<Measured, BenchError> {
    std::fs::create_dir_all(&args.out).map_err(io(&args.out))?;
    if let Some(csv) = &args.replot {
        return replot(csv, &args.out).map(|points| Measured {
            points,
            interrupted: false,
        });
    }
    if args.decode {
        return match decode::run(args, stop) {
            Ok(_) => Ok(Measured {
                points: Vec::new(),
                interrupted: false,
            }),
            Err(_) if stop.requested() => Ok(Measured {
                points: Vec::new(),
                interrupted: true,
            }),
            Err(e) => Err(e),
        };
    }
    let mut points = Vec::new();
    let mut ceilings = Vec::new();
    let mut kind = "host";
    let measured = measure(args, stop, &mut kind, &mut ceilings, &mut points);
    // A child killed by the same Ctrl-C (the terminal signals the whole process group) fails
    // its run before this process looks at its flag: that too is the stop, not a failure.
    let interrupted = match measured {
        Ok(()) => false,
        Err(_) if stop.requested() => true,
        Err(e) => return Err(e),
    };
    if interrupted {
        pinring_runtime::outln!(
            "\ninterrupted (SIGTERM or SIGINT): {} point(s) measured; writing them",
            points.len()
        );
    }
    let csv = args.out.join("bench.csv");
    write_file(
        "the bench's CSV",
        &csv,
        to_csv(kind, &ceilings, &points).as_bytes(),
    )?;
    let svg = args.out.join("bench.svg");
    plot(&svg, kind, &ceilings, &points, &args.loaders)?;
    pinring_runtime::outln!("\nwrote {} and {}", csv.display(), svg.display());
    plot_rings_if(args.ring_bytes.len() > 1, &args.out, kind, &points)?;
    Ok(Measured {
        points,
        interrupted,
    })
}

/// Measures into `points` (and `ceilings`, `kind`), so that what was done survives a stop: the
/// host and its ceilings, the upload engine alone, the warm-up, then every pipeline point and
/// the modes side by side.
fn measure(
    args: &BenchArgs,
    stop: &Shutdown,
    kind: &mut &'static str,
    ceilings: &mut Vec<(u64, f64, f64)>,
    points: &mut Vec<Point>,
) -> Result<(), BenchError> {
    let selected = pinring_backend::select(args.backend, args.device)?;
    let backend = selected.backend;
    *kind = backend.name();
    let kind = *kind;
    introduce(args, stop, &*backend, kind, &selected.reason)?;
    measure_ceilings(args, stop, &*backend, ceilings)?;
    drop(backend);
    let mode_raw = if args.skip_modes {
        0.0
    } else {
        match ceilings
            .iter()
            .find(|(s, _, _)| *s == args.mode_slot.bytes())
        {
            Some(c) => c.1,
            None => pinring_backend::select(args.backend, args.device)?
                .backend
                .raw_copy_gbps(args.mode_slot.bytes() as usize, 200, true)?,
        }
    };
    let mut run_bytes: Vec<(u64, u64)> = ceilings
        .iter()
        .map(|&(slot, raw, _)| (slot, args.run_bytes_at(raw)))
        .collect();
    if !args.skip_modes {
        run_bytes.push((args.mode_slot.bytes(), args.run_bytes_at(mode_raw)));
    }
    let total = ceilings
        .iter()
        .map(|&(slot, _, _)| geometries(slot, &args.ring_bytes).len() * args.loaders.len())
        .sum::<usize>()
        + if args.skip_modes { 0 } else { MODES.len() };
    // The reference runs in this process on the backend the daemons will pick: named, so that
    // `auto` is not resolved (and logged) again for every run.
    let bench = Bench {
        args,
        exe: pinring_runtime::this_program::get().map_err(io(Path::new("<current executable>")))?,
        backend: if kind == "cuda" {
            BackendKind::Cuda
        } else {
            BackendKind::Host
        },
        stop,
        run_bytes,
        progress: std::cell::Cell::new((0, total, Instant::now())),
    };
    bench.engine_alone(ceilings)?;
    bench.warm_up(ceilings)?;
    bench.pipeline_points(ceilings, points)?;
    if !args.skip_modes {
        bench.mode_points(mode_raw, points)?;
    }
    Ok(())
}

/// `Err(Interrupted)` once SIGTERM or SIGINT came.
fn stopped(stop: &Shutdown) -> Result<(), BenchError> {
    if stop.requested() {
        Err(BenchError::Interrupted)
    } else {
        Ok(())
    }
}

/// The lines that open the report: the backend, the host, the generator's speed alone, and
/// the registration's time when asked for.
fn introduce(
    args: &BenchArgs,
    stop: &Shutdown,
    backend: &dyn pinring_backend::Backend,
    kind: &str,
    reason: &str,
) -> Result<(), BenchError> {
    pinring_runtime::outln!("pinring bench: backend {kind} ({reason})");
    if kind == "host" {
        pinring_runtime::outln!("  no GPU in use: device memory is host memory, an upload is a memcpy; these numbers measure the protocol and memory bandwidth, not PCIe");
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    pinring_runtime::outln!("  host: {cores} CPUs; date {}", now_utc());

    let gen = pinring_data::generator_throughput(1 << 20, 0.5);
    pinring_runtime::outln!(
        "  synthetic generator alone: {gen:.1} GB/s on one core (1 MiB samples)"
    );

    stopped(stop)?;
    if args.register_bytes.bytes() > 0 {
        let (secs, what) = time_registration(backend, args.register_bytes.bytes())?;
        let gib = args.register_bytes.bytes() as f64 / (1u64 << 30) as f64;
        pinring_runtime::outln!(
            "  registration of a prefaulted {} ring segment: {secs:.3} s = {:.3} s/GiB ({what})",
            args.register_bytes,
            secs / gib
        );
    }
    Ok(())
}

/// The raw copy's ceilings at each slot size (one stream, no pipeline), registered and
/// pageable, into `ceilings`.
fn measure_ceilings(
    args: &BenchArgs,
    stop: &Shutdown,
    backend: &dyn pinring_backend::Backend,
    ceilings: &mut Vec<(u64, f64, f64)>,
) -> Result<(), BenchError> {
    pinring_runtime::outln!("\nceilings (one stream, no pipeline):");
    pinring_runtime::outln!(
        "{:>10} {:>16} {:>16}",
        "slot",
        "registered GB/s",
        "pageable GB/s"
    );
    for size in &args.slot_sizes {
        stopped(stop)?;
        let bytes = size.bytes() as usize;
        let iters = ((4u64 << 30) / size.bytes().max(1)).clamp(20, 20_000) as usize;
        let reg = backend.raw_copy_gbps(bytes, iters, true)?;
        let page = backend.raw_copy_gbps(bytes, (iters / 4).max(10), false)?;
        pinring_runtime::outln!("{:>10} {:>16.2} {:>16.2}", size.to_string(), reg, page);
        ceilings.push((size.bytes(), reg, page));
    }
    Ok(())
}

/// The modes measured side by side, and the daemon flags of each.
const MODES: [(&str, &[&str]); 5] = [
    ("registered (discard)", &["--sink", "discard"]),
    (
        "pageable ring (--no-register)",
        &["--sink", "discard", "--no-register"],
    ),
    ("upload + compute kernel", &["--sink", "compute"]),
    (
        "zero-copy compute kernel",
        &["--sink", "compute", "--zero-copy"],
    ),
    ("upload + verify", &["--sink", "verify"]),
];

impl BenchArgs {
    /// Payload bytes a run moves at a slot size whose registered ceiling is `raw_gbps`:
    /// `--run-bytes`, or what that ceiling moves in `--run-seconds`.
    pub fn run_bytes_at(&self, raw_gbps: f64) -> u64 {
        self.run_bytes.map_or_else(
            || (raw_gbps.max(0.0) * 1e9 * self.run_seconds.max(0.0)) as u64,
            |b| b.bytes(),
        )
    }
}

/// What every run of one bench shares.
struct Bench<'a> {
    args: &'a BenchArgs,
    /// This program: the daemon, the loaders and the reference writers are its subcommands.
    exe: ThisProgram,
    /// The backend the reference runs on (`cuda` or `host`, as resolved at the start).
    backend: BackendKind,
    /// Set by SIGTERM or SIGINT: every wait looks at it.
    stop: &'a Shutdown,
    /// Payload bytes a run moves, per slot size.
    run_bytes: Vec<(u64, u64)>,
    /// Points done, points in all, and when the first began: the time left after each.
    progress: std::cell::Cell<(usize, usize, Instant)>,
}

impl Bench<'_> {
    /// The slots of the first ring size asked, at `slot`: where the engine alone, the warm-up
    /// and the modes run.
    fn first_ring(&self, slot: u64) -> u32 {
        ring_slots(slot, self.args.ring_bytes[0].bytes())
    }

    /// The upload engine alone on each point's ring: no writers, no protocol, every slot full.
    fn engine_alone(&self, ceilings: &[(u64, f64, f64)]) -> Result<(), BenchError> {
        pinring_runtime::outln!(
            "\nupload engine alone (the pipeline's ring, device buffers and one upload group per \
             slot; no writers):"
        );
        pinring_runtime::outln!(
            "{:>10} {:>10} {:>8} {:>16} {:>8}",
            "slot",
            "GB/s",
            "of raw",
            "submit us/slot",
            "cores"
        );
        for (slot, raw, _) in ceilings {
            let m = self.reference(*slot, self.first_ring(*slot), 0)?;
            pinring_runtime::outln!(
                "{:>10} {:>10.2} {:>7.0}% {:>16.2} {:>8.2}",
                ByteSize(*slot).to_string(),
                m.gbps,
                100.0 * m.gbps / raw.max(1e-9),
                m.submit_seconds / m.batches.max(1) as f64 * 1e6,
                m.cpu_seconds / m.seconds.max(1e-9)
            );
        }
        Ok(())
    }

    /// The first pipeline run after the GPU sat idle is slower (seen on the H200: 36 GB/s, then
    /// 43-44 GB/s for the same point): one run, unreported, so every reported run starts warm.
    fn warm_up(&self, ceilings: &[(u64, f64, f64)]) -> Result<(), BenchError> {
        if let (Some(&(slot, _, _)), Some(&n)) = (ceilings.first(), self.args.loaders.iter().max())
        {
            let warm = self.pipeline("warm-up", slot, self.first_ring(slot), n, &[], 0)?;
            pinring_runtime::outln!("\nwarm-up run (not reported): {:.2} GB/s", warm.gbps);
        }
        Ok(())
    }

    /// Every (slot size, ring size, loaders) point of the pipeline, each beside the reference.
    fn pipeline_points(
        &self,
        ceilings: &[(u64, f64, f64)],
        points: &mut Vec<Point>,
    ) -> Result<(), BenchError> {
        let args = self.args;
        let runs = match args.repeat {
            1 => "1 run per point (--repeat N for more, with their spread)".to_string(),
            n => format!("{n} runs per point: median, min-max and spread"),
        };
        pinring_runtime::outln!(
            "\npipeline (daemon + N loader processes, discard sink) next to the reference (N \
             writer processes, no protocol); {runs}:"
        );
        print_header();
        self.restart_clock();
        let first = points.len();
        for (slot, raw, _) in ceilings {
            for slots in geometries(*slot, &args.ring_bytes) {
                for &n in &args.loaders {
                    let point = self.point("pipeline", *slot, slots, n, *raw, &[])?;
                    print_point(&point);
                    self.point_done();
                    points.push(point);
                }
            }
        }
        print_flag_note(&points[first..]);
        Ok(())
    }

    /// The modes side by side at `--mode-slot` (whose raw ceiling is `mode_raw`).
    fn mode_points(&self, mode_raw: f64, points: &mut Vec<Point>) -> Result<(), BenchError> {
        let args = self.args;
        let mode_slot = args.mode_slot.bytes();
        pinring_runtime::outln!(
            "\nmodes side by side ({}, {} loaders), each next to the reference:",
            args.mode_slot,
            args.mode_loaders
        );
        print_header();
        let first = points.len();
        for (mode, extra) in MODES {
            let slots = self.first_ring(mode_slot);
            let point = self.point(mode, mode_slot, slots, args.mode_loaders, mode_raw, extra)?;
            print_point(&point);
            self.point_done();
            points.push(point);
        }
        print_flag_note(&points[first..]);
        Ok(())
    }

    /// Bytes a run at `slot` moves.
    fn run_bytes(&self, slot: u64) -> u64 {
        self.run_bytes
            .iter()
            .find(|(s, _)| *s == slot)
            .map_or(0, |&(_, b)| b)
    }

    /// Starts the clock the time left is reckoned from (at the first reported point).
    fn restart_clock(&self) {
        let (done, total, _) = self.progress.get();
        self.progress.set((done, total, Instant::now()));
    }

    /// Counts a point done and prints how many are left and about how long they take.
    fn point_done(&self) {
        let (done, total, since) = self.progress.get();
        let done = done + 1;
        self.progress.set((done, total, since));
        let each = since.elapsed().as_secs_f64() / done as f64;
        pinring_runtime::outln!(
            "  [{done}/{total} points, about {:.0} s left]",
            each * total.saturating_sub(done) as f64
        );
    }

    /// `--repeat` runs of one point, each pipeline run followed by a reference run.
    fn point(
        &self,
        mode: &str,
        slot: u64,
        slots: u32,
        loaders: usize,
        raw: f64,
        extra: &[&str],
    ) -> Result<Point, BenchError> {
        let repeat = self.args.repeat;
        let mut runs = Vec::new();
        for index in 1..=repeat {
            let mut run = self.pipeline(mode, slot, slots, loaders, extra, index)?;
            let reference = self.reference(slot, slots, loaders)?;
            run.ref_gbps = reference.gbps;
            run.ref_bytes = reference.bytes;
            if repeat > 1 {
                pinring_runtime::outln!(
                    "  run {index}/{repeat}: pinring {:.2} GB/s, reference {:.2} GB/s ({:.0}% of it)",
                    run.gbps,
                    run.ref_gbps,
                    100.0 * run.ratio_to_ref()
                );
            }
            runs.push(run);
        }
        Ok(Point {
            mode: mode.to_string(),
            slot,
            slots,
            loaders,
            raw_gbps: raw,
            runs,
        })
    }

    /// One run of the reference pipeline at the pipeline point's ring, writers and bytes.
    fn reference(
        &self,
        slot: u64,
        slots: u32,
        writers: usize,
    ) -> Result<reference::Measured, BenchError> {
        let args = self.args;
        let what = match writers {
            0 => format!(
                "{slots} x {} slots, the upload engine alone",
                ByteSize(slot)
            ),
            n => format!("{slots} x {} slots, {n} writers", ByteSize(slot)),
        };
        let name = format!("bench-ref-{}", std::process::id());
        let cfg = run_config(slot, slots, self.run_bytes(slot), &name);
        let geom = reference::Geometry::of(&cfg);
        // A fresh backend per run, as each pipeline run's daemon has.
        let selected = pinring_backend::select(self.backend, args.device)?;
        reference::run(
            &*selected.backend,
            &geom,
            writers as u32,
            &name,
            reference::Spawn::Processes(&self.exe),
            &|| self.stop.requested(),
        )
        .map_err(|source| match source {
            reference::ReferenceError::Interrupted => BenchError::Interrupted,
            source => BenchError::Reference {
                what,
                source: Box::new(source),
            },
        })
    }

    /// One pipeline run: a daemon and `loaders` loader processes (`index` 0: the warm-up).
    fn pipeline(
        &self,
        mode: &str,
        slot: u64,
        slots: u32,
        loaders: usize,
        extra: &[&str],
        index: u32,
    ) -> Result<Run, BenchError> {
        let args = self.args;
        let exe = &self.exe;
        let what = format!(
            "{mode}, {slots} x {} slots, {loaders} loaders",
            ByteSize(slot)
        );
        let fail = |why: String| BenchError::Run {
            what: what.clone(),
            why,
        };
        let name = format!("bench-{}", std::process::id());
        let cfg = run_config(slot, slots, self.run_bytes(slot), &name);
        let mode_tag: String = mode
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let tag = format!("{slot}x{slots}-{loaders}-{mode_tag}-{index}");
        let cfg_path = args.out.join(format!("run-{tag}.toml"));
        write_file("a bench run's config", &cfg_path, cfg.to_toml().as_bytes())?;
        let summary_path = args.out.join(format!("run-{tag}.json"));
        let _ = std::fs::remove_file(&summary_path);
        let mut extra: Vec<&str> = extra.to_vec();
        if !extra.contains(&"--sink") {
            extra.extend(["--sink", "discard"]);
        }
        if args.unordered {
            extra.push("--unordered");
        }
        let look_ahead = args.look_ahead.map(|n| n.to_string());
        if let Some(n) = &look_ahead {
            extra.extend(["--look-ahead", n]);
        }
        let backend = args.backend.to_string();
        let device = args.device.to_string();
        // Every child stops with the bench, even one killed outright (see `stop_with_parent`).
        let mut daemon_cmd = exe.command();
        daemon_cmd
            .arg("daemon")
            .arg("--config")
            .arg(&cfg_path)
            .args(["--ring", &name, "--backend", &backend, "--device", &device])
            .args(&extra)
            .arg("--summary")
            .arg(&summary_path)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null());
        pinring_runtime::children::stop_with_parent(&mut daemon_cmd);
        let daemon = daemon_cmd
            .spawn()
            .map_err(|e| fail(format!("cannot start the daemon: {e}")))?;
        let mut kids = Children(vec![daemon]);
        for _ in 0..loaders {
            let mut loader_cmd = exe.command();
            loader_cmd
                .arg("loader")
                .arg("--config")
                .arg(&cfg_path)
                .args(["--ring", &name, "--wait-secs", "60"])
                .env("RUST_LOG", "warn")
                .stdin(Stdio::null());
            pinring_runtime::children::stop_with_parent(&mut loader_cmd);
            let l = loader_cmd
                .spawn()
                .map_err(|e| fail(format!("cannot start a loader: {e}")))?;
            kids.0.push(l);
        }
        let status = wait_daemon(&mut kids, self.stop, Duration::from_secs(300), &fail)?;
        // Loaders exit when the daemon closes the ring; `kids` reaps them (and stops any
        // straggler) when it goes out of scope.
        if !status.success() {
            return Err(fail(format!("the daemon exited with {status}")));
        }
        let s = Summary::read(&summary_path).map_err(|e| fail(format!("no summary: {e}")))?;
        Ok(run_of(index, &s))
    }
}

/// Waits for a run's daemon (`kids`' first child) to exit, at most `limit`; SIGTERM or SIGINT
/// (`stop`) ends the wait with `Interrupted` (dropping `kids` stops the daemon, which drains and
/// removes its ring, and the loaders).
fn wait_daemon(
    kids: &mut Children,
    stop: &Shutdown,
    limit: Duration,
    fail: &dyn Fn(String) -> BenchError,
) -> Result<std::process::ExitStatus, BenchError> {
    let start = Instant::now();
    loop {
        if let Some(st) = kids.0[0].try_wait().map_err(|e| fail(e.to_string()))? {
            return Ok(st);
        }
        if stop.requested() {
            return Err(BenchError::Interrupted);
        }
        if start.elapsed() > limit {
            return Err(fail(format!("did not finish within {} s", limit.as_secs())));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Creates a ring-sized shm segment the way the daemon does (fallocate, MAP_POPULATE) and times
/// registering it with the backend.
fn time_registration(
    backend: &dyn pinring_backend::Backend,
    bytes: u64,
) -> Result<(f64, String), BenchError> {
    let name = format!("bench-reg-{}", std::process::id());
    // Unnamed: never published, so nothing is left behind whatever happens.
    let seg = pinring_ring::Segment::create_unnamed(&name, bytes, 0o600, None).map_err(|e| {
        BenchError::Run {
            what: "registration timing".into(),
            why: e.to_string(),
        }
    })?;
    // SAFETY: the mapping is live for `bytes` bytes and outlives the registration guard, which
    // is dropped at the end of this block, before `seg`.
    let reg = unsafe { backend.register(seg.base(), seg.len(), false) }?;
    let what = format!(
        "{} chunk(s), registered: {}",
        reg.chunks(),
        reg.registered()
    );
    let secs = reg.seconds();
    drop(reg);
    drop(seg);
    Ok((secs, what))
}

fn print_header() {
    pinring_runtime::outln!(
        "{:<30} {:>9} {:>5} {:>7} {:>8} {:>13} {:>6} {:>8} {:>10} {:>6} {:>6} {:>10} {:>8} {:>8} {:>8} {:>9} !",
        "mode",
        "slot",
        "slots",
        "loaders",
        "GB/s",
        "min-max",
        "spread",
        "ref GB/s",
        "ref spread",
        "of ref",
        "of raw",
        "batches/s",
        "cpu s/GB",
        "p50 us",
        "p99 us",
        "bound"
    );
}

/// A fraction as a whole percentage, `-` when there is none.
fn percent(v: Option<f64>) -> String {
    v.filter(|v| v.is_finite())
        .map_or_else(|| "-".to_string(), |v| format!("{:.0}%", 100.0 * v))
}

fn print_point(p: &Point) {
    let gbps = p.gbps();
    let reference = p.reference();
    let median = gbps.map_or(0.0, |s| s.median);
    let range = gbps.map_or_else(|| "-".to_string(), |s| format!("{:.2}-{:.2}", s.min, s.max));
    pinring_runtime::outln!(
        "{:<30} {:>9} {:>5} {:>7} {:>8.2} {:>13} {:>6} {:>8} {:>10} {:>6} {:>6} {:>10.0} {:>8.3} {:>8.0} {:>8.0} {:>9} {}",
        p.mode,
        ByteSize(p.slot).to_string(),
        p.slots,
        p.loaders,
        median,
        range,
        percent(gbps.and_then(|s| s.spread())),
        reference.map_or_else(|| "-".to_string(), |s| format!("{:.2}", s.median)),
        percent(reference.and_then(|s| s.spread())),
        percent(p.ratio_to_ref()),
        percent(Some(median / p.raw_gbps.max(1e-9))),
        p.median_of(|r| r.batches_per_s),
        p.median_of(|r| r.cpu_s_per_gb),
        p.median_of(|r| f64::from(r.p50_us)),
        p.median_of(|r| f64::from(r.p99_us)),
        p.bound(),
        if p.flagged() { "!" } else { "" }
    );
}

/// Under a table: what `!` means, when a point has it.
fn print_flag_note(points: &[Point]) {
    if points.iter().any(Point::flagged) {
        pinring_runtime::outln!(
            "! marks a point whose runs (pinring's or the reference's) spread more than {:.0}% \
             ((max - min) / median): rerun it before quoting it",
            100.0 * SPREAD_FLAG
        );
    }
}

/// Fewest slots a bench ring has.
pub const MIN_RING_SLOTS: u32 = 8;

/// The slots of a ring of about `ring_bytes` in `slot`-byte slots: at least
/// [`MIN_RING_SLOTS`], at most the ring's own limit.
pub fn ring_slots(slot: u64, ring_bytes: u64) -> u32 {
    let most = u64::from(pinring_data::config::MAX_SLOTS);
    (ring_bytes / slot.max(1)).clamp(u64::from(MIN_RING_SLOTS), most) as u32
}

/// The slot counts that `slot`-byte slots run at for the asked ring sizes, in the order asked,
/// each once.
pub fn geometries(slot: u64, rings: &[ByteSize]) -> Vec<u32> {
    let mut out: Vec<u32> = Vec::new();
    for ring in rings {
        let slots = ring_slots(slot, ring.bytes());
        if !out.contains(&slots) {
            out.push(slots);
        }
    }
    out
}

/// The config of one run: `slot` payload bytes per batch in 4 samples (each its u8 images and
/// an 8-byte label), enough batches for `run_bytes` (64 to 400000), a ring of `slots` slots;
/// the slot holds a whole batch (an explicit size: `"auto"` would cut batches over 4 MiB into
/// parts).
pub fn run_config(slot: u64, slots: u32, run_bytes: u64, name: &str) -> Config {
    let batch = 4u64;
    let sample = (slot / batch)
        .saturating_sub(pinring_data::LABEL_BYTES as u64)
        .max(1);
    let batches = (run_bytes / slot.max(1)).clamp(64, 400_000);
    let mut cfg = Config {
        ring: RingConfig {
            name: name.to_string(),
            slots: Some(slots),
            slot_bytes: SlotBytes::Auto,
            ..RingConfig::default()
        },
        dataset: DatasetConfig {
            samples: batches * batch,
            sample_shape: vec![sample as u32],
            dtype: Dtype::U8,
            ..DatasetConfig::default()
        },
        plan: PlanConfig {
            batch_size: batch as u32,
            epochs: 1,
            ..PlanConfig::default()
        },
        source: format!("bench config ({name})"),
        ..Config::default()
    };
    let whole = cfg
        .min_slot_bytes()
        .next_multiple_of(pinring_data::config::SLOT_ALIGN);
    cfg.ring.slot_bytes = SlotBytes::Fixed(pinring_data::ByteSize(whole));
    cfg
}

fn run_of(index: u32, s: &Summary) -> Run {
    let gb = s.bytes as f64 / 1e9;
    Run {
        index,
        gbps: s.gbps,
        bytes: s.bytes,
        batches_per_s: if s.seconds > 0.0 {
            s.batches_delivered as f64 / s.seconds
        } else {
            0.0
        },
        cpu_s_per_gb: if gb > 0.0 {
            s.daemon_cpu_seconds / gb
        } else {
            0.0
        },
        p50_us: s.latency_p50_us,
        p99_us: s.latency_p99_us,
        bound: s.bound.clone(),
        ref_gbps: f64::NAN,
        ref_bytes: 0,
    }
}

fn now_utc() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    // Civil date from days since the epoch (Howard Hinnant's algorithm).
    let days = (secs / 86_400) as i64;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

#[cfg(test)]
mod tests {
    use super::report::parse_csv;
    use super::*;

    #[test]
    fn run_configs_are_valid_and_sized_as_asked() {
        for (slot, slots) in [(64 << 10, 1024), (1 << 20, 64), (64 << 20, 8)] {
            assert_eq!(ring_slots(slot, 64 << 20), slots);
            let c = run_config(slot, slots, 16 << 30, "bench-test");
            c.validate().unwrap();
            assert_eq!(c.batch_payload_bytes_max(), slot);
            assert!(c.slot_bytes() >= slot && c.slot_bytes() < slot + (8 << 10));
            assert_eq!(c.slots(), slots);
        }
    }

    #[test]
    fn a_ring_sweep_runs_each_slot_count_once_within_the_rings_limits() {
        let rings: Vec<ByteSize> = [2 << 20, 8 << 20, 8 << 20, 1 << 30, 4 << 30]
            .into_iter()
            .map(ByteSize)
            .collect();
        // 64 KiB: 32, 128, then 16384 and 65536 slots, both held to the ring's 4096.
        assert_eq!(geometries(64 << 10, &rings), vec![32, 128, 4096]);
        // 4 MiB: 0 and 2 slots, held to 8; then 256 and 1024.
        assert_eq!(geometries(4 << 20, &rings), vec![8, 256, 1024]);
    }

    #[test]
    fn dates_are_civil() {
        assert_eq!(now_utc().len(), 10);
    }

    fn run(index: u32, gbps: f64, ref_gbps: f64, bound: &str) -> Run {
        Run {
            index,
            gbps,
            bytes: 1 << 30,
            batches_per_s: 1000.0 * gbps,
            cpu_s_per_gb: 0.01 * f64::from(index),
            p50_us: 100 * index,
            p99_us: 1000 * index,
            bound: bound.into(),
            ref_gbps,
            ref_bytes: 1 << 30,
        }
    }

    /// A point of three runs: pinring 40, 44, 45 GB/s; the reference 52, 50, 50.
    fn point() -> Point {
        Point {
            mode: "pipeline".into(),
            slot: 1 << 20,
            slots: 64,
            loaders: 8,
            raw_gbps: 50.0,
            runs: vec![
                run(1, 40.0, 52.0, "upload"),
                run(2, 44.0, 50.0, "loaders"),
                run(3, 45.0, 50.0, "upload"),
            ],
        }
    }

    #[test]
    fn a_point_reports_the_median_range_spread_and_ratio_of_its_runs() {
        let p = point();
        let g = p.gbps().unwrap();
        assert_eq!((g.median, g.min, g.max), (44.0, 40.0, 45.0));
        assert_eq!(g.spread(), Some(5.0 / 44.0));
        let r = p.reference().unwrap();
        assert_eq!((r.median, r.min, r.max), (50.0, 50.0, 52.0));
        assert_eq!(r.spread(), Some(0.04));
        assert_eq!(p.ratio_to_ref(), Some(0.88));
        // pinring's runs spread 11.4%: flagged.
        assert!(p.flagged());
        assert_eq!(p.bound(), "upload");
        assert_eq!(p.median_of(|r| f64::from(r.p99_us)), 2000.0);
        // Within 10% on both sides: not flagged; the reference alone can flag a point.
        let mut calm = point();
        calm.runs[0].gbps = 42.0;
        assert!(!calm.flagged());
        calm.runs[0].ref_gbps = 56.0;
        assert!(calm.flagged());
    }

    #[test]
    fn the_csv_has_every_run_and_a_summary_row_per_point() {
        let csv = to_csv("host", &[(1 << 20, 50.0, 20.0)], &[point()]);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines[0], CSV_COLUMNS.join(","));
        assert!(lines
            .iter()
            .all(|l| l.split(',').count() == CSV_COLUMNS.len()));
        assert_eq!(
            &lines[1..],
            [
                "host,raw registered,1048576,,0,,50.000,,,,,,,,50.000,1.000,,,,,,,",
                "host,raw pageable,1048576,,0,,20.000,,,,,,,,50.000,0.400,,,,,,,",
                "host,pipeline,1048576,64,8,1,40.000,,,,52.000,,0.769,,50.000,0.800,40000.0,0.0100,100,1000,upload,1073741824,1073741824",
                "host,pipeline,1048576,64,8,2,44.000,,,,50.000,,0.880,,50.000,0.880,44000.0,0.0200,200,2000,loaders,1073741824,1073741824",
                "host,pipeline,1048576,64,8,3,45.000,,,,50.000,,0.900,,50.000,0.900,45000.0,0.0300,300,3000,upload,1073741824,1073741824",
                "host,pipeline,1048576,64,8,median,44.000,40.000,45.000,0.114,50.000,0.040,0.880,1,50.000,0.880,44000.0,0.0200,200,2000,upload,,",
            ]
        );
    }

    #[test]
    fn the_csv_reads_back_into_the_same_points() {
        let ceilings = [(1 << 20, 50.0, 20.0)];
        let csv = to_csv("cuda", &ceilings, &[point()]);
        let (kind, c, points) = parse_csv(&csv).unwrap();
        assert_eq!(kind, "cuda");
        assert_eq!(c, ceilings);
        assert_eq!(
            points.len(),
            1,
            "the summary row is recomputed, not a point"
        );
        let (p, q) = (&points[0], point());
        assert_eq!(p.runs.len(), 3);
        assert_eq!(p.gbps(), q.gbps());
        assert_eq!(p.reference(), q.reference());
        assert_eq!(p.bound(), "upload");
        assert_eq!(p.runs[1].index, 2);
    }

    #[test]
    fn a_field_with_a_comma_or_a_quote_is_quoted_and_reads_back() {
        let mut p = point();
        p.mode = "pipeline, \"pageable\"".to_string();
        let csv = to_csv("host", &[], &[p]);
        let lines: Vec<&str> = csv.lines().collect();
        assert!(
            lines[1].starts_with("host,\"pipeline, \"\"pageable\"\"\",1048576,64,8,1,40.000,"),
            "{}",
            lines[1]
        );
        let (_, _, points) = parse_csv(&csv).unwrap();
        assert_eq!(points.len(), 1);
        assert_eq!(points[0].mode, "pipeline, \"pageable\"");
        assert_eq!(points[0].runs.len(), 3);
        // A file a spreadsheet saved again (every field quoted, CRLF line ends) reads the same.
        let saved = "\"backend\",\"mode\",\"slot_bytes\",\"loaders\",\"gbps\"\r\n\
                     \"host\",\"pipeline\",\"65536\",\"2\",\"10.5\"\r\n";
        let (kind, _, points) = parse_csv(saved).unwrap();
        assert_eq!((kind.as_str(), points[0].loaders), ("host", 2));
        assert_eq!(points[0].median_gbps(), 10.5);
    }

    #[test]
    fn a_csv_of_an_older_bench_reads_as_one_run_per_point_without_a_reference() {
        let old = "backend,mode,slot_bytes,loaders,gbps,raw_gbps,ratio_to_raw,batches_per_s,daemon_cpu_s_per_gb,latency_p50_us,latency_p99_us,bound\n\
                   cuda,raw registered,65536,0,17.223,17.223,1.000,,,,,\n\
                   cuda,raw pageable,65536,0,8.705,17.223,0.505,,,,,\n\
                   cuda,pipeline,65536,1,10.630,17.223,0.617,162190.0,0.1780,1218,1542,balanced\n";
        let (kind, c, points) = parse_csv(old).unwrap();
        assert_eq!((kind.as_str(), c), ("cuda", vec![(65536, 17.223, 8.705)]));
        assert_eq!(points.len(), 1);
        let p = &points[0];
        assert_eq!(p.gbps().map(|s| s.median), Some(10.63));
        assert_eq!((p.reference(), p.ratio_to_ref()), (None, None));
        assert!(!p.flagged());
        assert_eq!((p.runs[0].p99_us, p.bound()), (1542, "balanced"));
        // A short line is refused with its number.
        let e = parse_csv("backend,mode,slot_bytes,loaders,gbps\nhost,pipeline,1\n").unwrap_err();
        assert_eq!(e.0, 2);
    }
}
