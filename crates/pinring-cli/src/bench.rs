//! `pinring bench`: one command that measures, in one run, the raw copy ceiling (registered
//! memory, no pipeline), the pageable ceiling, and the full pipeline (a daemon and N loader
//! processes) over slot sizes and loader counts, plus a few modes side by side (pageable ring,
//! upload + compute, zero-copy compute, verify). Prints a table and writes `bench.csv` and
//! `bench.svg`. Without a GPU it runs the host backend and says so: those numbers measure the
//! protocol and memory bandwidth, not PCIe.

use crate::runner::Children;
use pinring_backend::BackendKind;
use pinring_data::{ByteSize, Config, DatasetConfig, Dtype, PlanConfig, RingConfig, SlotBytes};
use pinring_runtime::daemon::parse_backend_kind;
use pinring_runtime::summary::Summary;
use pinring_runtime::Exit;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "64KiB,256KiB,1MiB,4MiB,16MiB,64MiB"
    )]
    pub slot_sizes: Vec<ByteSize>,
    /// Loader process counts, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,12")]
    pub loaders: Vec<usize>,
    /// Payload bytes each pipeline run moves (fewer for small slots: at most 100000 batches).
    #[arg(long, default_value = "16GiB")]
    pub run_bytes: ByteSize,
    /// Target ring size: slots = ring_bytes / slot size, clamped to 8..=256. The default keeps
    /// the ring in a server's last-level cache.
    #[arg(long, default_value = "64MiB")]
    pub ring_bytes: ByteSize,
    /// Slot size and loader count of the side-by-side mode comparison.
    #[arg(long, default_value = "4MiB")]
    pub mode_slot: ByteSize,
    /// Loader count of the mode comparison.
    #[arg(long, default_value_t = 8)]
    pub mode_loaders: usize,
    /// Deliver in any order (the daemon's --unordered) in every pipeline run.
    #[arg(long)]
    pub unordered: bool,
    /// Skip the side-by-side mode comparison.
    #[arg(long)]
    pub skip_modes: bool,
    /// Size of the ring registered once to time registration (0: skip).
    #[arg(long, default_value = "4GiB")]
    pub register_bytes: ByteSize,
    /// Measure nothing: redraw `bench.svg` in --out from a `bench.csv` written earlier.
    #[arg(long, value_name = "CSV")]
    pub replot: Option<PathBuf>,
    /// Directory for bench.csv, bench.svg and the per-run configs and summaries.
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
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
    /// The plot could not be drawn.
    #[error("cannot draw {path}: {why}")]
    Plot {
        /// Path.
        path: String,
        /// Cause.
        why: String,
    },
}

impl BenchError {
    /// Exit code.
    pub fn exit(&self) -> Exit {
        match self {
            BenchError::Backend(_) => Exit::Backend,
            BenchError::Io { .. } | BenchError::Plot { .. } => Exit::Output,
            BenchError::Run { .. } => Exit::PeerDied,
        }
    }
}

/// One pipeline measurement.
#[derive(Debug, Clone)]
pub struct Row {
    /// What ran ("pipeline", "pageable ring", "zero-copy compute", ...).
    pub mode: String,
    /// Payload bytes per batch.
    pub slot: u64,
    /// Loader processes.
    pub loaders: usize,
    /// Payload GB/s.
    pub gbps: f64,
    /// Raw registered ceiling at this size, GB/s.
    pub raw_gbps: f64,
    /// Batches per second.
    pub batches_per_s: f64,
    /// Daemon CPU seconds per GB moved.
    pub cpu_s_per_gb: f64,
    /// Commit-to-on-device latency, p50 and p99, microseconds.
    pub p50_us: u32,
    /// p99.
    pub p99_us: u32,
    /// Where the run was bound.
    pub bound: String,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BenchError + '_ {
    move |source| BenchError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Runs the benchmark; prints as it goes.
pub fn run(args: &BenchArgs) -> Result<Vec<Row>, BenchError> {
    std::fs::create_dir_all(&args.out).map_err(io(&args.out))?;
    if let Some(csv) = &args.replot {
        return replot(csv, &args.out);
    }
    let selected = pinring_backend::select(args.backend, args.device)?;
    let backend = selected.backend;
    let kind = backend.name();
    println!("pinring bench: backend {kind} ({})", selected.reason);
    if kind == "host" {
        println!("  no GPU in use: device memory is host memory, an upload is a memcpy; these numbers measure the protocol and memory bandwidth, not PCIe");
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("  host: {cores} CPUs; date {}", now_utc());

    let gen = pinring_data::generator_throughput(1 << 20, 0.5);
    println!("  synthetic generator alone: {gen:.1} GB/s on one core (1 MiB samples)");

    if args.register_bytes.bytes() > 0 {
        let (secs, what) = time_registration(&*backend, args.register_bytes.bytes())?;
        let gib = args.register_bytes.bytes() as f64 / (1u64 << 30) as f64;
        println!(
            "  registration of a prefaulted {} ring segment: {secs:.3} s = {:.3} s/GiB ({what})",
            args.register_bytes,
            secs / gib
        );
    }

    // Ceilings per slot size.
    let mut ceilings = Vec::new();
    println!("\nceilings (one stream, no pipeline):");
    println!(
        "{:>10} {:>16} {:>16}",
        "slot", "registered GB/s", "pageable GB/s"
    );
    for size in &args.slot_sizes {
        let bytes = size.bytes() as usize;
        let iters = ((4u64 << 30) / size.bytes().max(1)).clamp(20, 20_000) as usize;
        let reg = backend.raw_copy_gbps(bytes, iters, true)?;
        let page = backend.raw_copy_gbps(bytes, (iters / 4).max(10), false)?;
        println!("{:>10} {:>16.2} {:>16.2}", size.to_string(), reg, page);
        ceilings.push((size.bytes(), reg, page));
    }
    drop(backend);

    let exe = std::env::current_exe().map_err(io(Path::new("<current executable>")))?;
    let mut rows = Vec::new();
    // The first pipeline run after the GPU sat idle is slower (seen on the H200: 36 GB/s, then
    // 43-44 GB/s for the same point): run one, unreported, so every reported run starts warm.
    if let (Some(&(slot, raw, _)), Some(&n)) = (ceilings.first(), args.loaders.iter().max()) {
        let warm = pipeline(args, &exe, "warm-up", slot, n, raw, &[])?;
        println!("\nwarm-up run (not reported): {:.2} GB/s", warm.gbps);
    }
    println!("\npipeline (daemon + N loader processes, discard sink):");
    print_header();
    for (slot, raw, _) in &ceilings {
        for &n in &args.loaders {
            let row = pipeline(args, &exe, "pipeline", *slot, n, *raw, &[])?;
            print_row(&row);
            rows.push(row);
        }
    }

    if args.skip_modes {
        return finish(args, kind, &ceilings, rows);
    }
    let mode_slot = args.mode_slot.bytes();
    let mode_raw = ceilings
        .iter()
        .find(|(s, _, _)| *s == mode_slot)
        .map_or_else(
            || {
                pinring_backend::select(args.backend, args.device)
                    .and_then(|s| s.backend.raw_copy_gbps(mode_slot as usize, 200, true))
            },
            |c| Ok(c.1),
        )?;
    println!(
        "\nmodes side by side ({}, {} loaders):",
        args.mode_slot, args.mode_loaders
    );
    print_header();
    let modes: [(&str, &[&str]); 5] = [
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
    for (mode, extra) in modes {
        let row = pipeline(
            args,
            &exe,
            mode,
            mode_slot,
            args.mode_loaders,
            mode_raw,
            extra,
        )?;
        print_row(&row);
        rows.push(row);
    }

    finish(args, kind, &ceilings, rows)
}

fn finish(
    args: &BenchArgs,
    kind: &str,
    ceilings: &[(u64, f64, f64)],
    rows: Vec<Row>,
) -> Result<Vec<Row>, BenchError> {
    let csv = args.out.join("bench.csv");
    std::fs::write(&csv, to_csv(kind, ceilings, &rows)).map_err(io(&csv))?;
    let svg = args.out.join("bench.svg");
    plot(&svg, kind, ceilings, &rows, &args.loaders)?;
    println!("\nwrote {} and {}", csv.display(), svg.display());
    Ok(rows)
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
    println!(
        "{:<30} {:>9} {:>7} {:>8} {:>7} {:>10} {:>9} {:>9} {:>9} {:>9}",
        "mode",
        "slot",
        "loaders",
        "GB/s",
        "of raw",
        "batches/s",
        "cpu s/GB",
        "p50 us",
        "p99 us",
        "bound"
    );
}

fn print_row(r: &Row) {
    println!(
        "{:<30} {:>9} {:>7} {:>8.2} {:>6.0}% {:>10.0} {:>9.3} {:>9} {:>9} {:>9}",
        r.mode,
        ByteSize(r.slot).to_string(),
        r.loaders,
        r.gbps,
        100.0 * r.gbps / r.raw_gbps.max(1e-9),
        r.batches_per_s,
        r.cpu_s_per_gb,
        r.p50_us,
        r.p99_us,
        r.bound
    );
}

/// The config of one run: `slot` payload bytes per batch in 4 samples, enough batches for
/// `run_bytes` (64 to 100000), a ring of about `ring_bytes`.
pub fn run_config(slot: u64, ring_bytes: u64, run_bytes: u64, name: &str) -> Config {
    let batch = 4u64;
    let sample = (slot / batch).max(1);
    let batches = (run_bytes / slot.max(1)).clamp(64, 100_000);
    let slots = (ring_bytes / slot.max(1)).clamp(8, 256) as u32;
    Config {
        ring: RingConfig {
            name: name.to_string(),
            slots,
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
    }
}

fn pipeline(
    args: &BenchArgs,
    exe: &Path,
    mode: &str,
    slot: u64,
    loaders: usize,
    raw: f64,
    extra: &[&str],
) -> Result<Row, BenchError> {
    let what = format!("{mode}, {} slots, {loaders} loaders", ByteSize(slot));
    let fail = |why: String| BenchError::Run {
        what: what.clone(),
        why,
    };
    let name = format!("bench-{}", std::process::id());
    let cfg = run_config(slot, args.ring_bytes.bytes(), args.run_bytes.bytes(), &name);
    let mode_tag: String = mode
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let tag = format!("{slot}-{loaders}-{mode_tag}");
    let cfg_path = args.out.join(format!("run-{tag}.toml"));
    std::fs::write(&cfg_path, cfg.to_toml()).map_err(io(&cfg_path))?;
    let summary_path = args.out.join(format!("run-{tag}.json"));
    let _ = std::fs::remove_file(&summary_path);
    let mut extra: Vec<&str> = extra.to_vec();
    if !extra.contains(&"--sink") {
        extra.extend(["--sink", "discard"]);
    }
    if args.unordered {
        extra.push("--unordered");
    }
    let backend = args.backend.to_string();
    let device = args.device.to_string();
    let daemon = Command::new(exe)
        .arg("daemon")
        .arg("--config")
        .arg(&cfg_path)
        .args(["--ring", &name, "--backend", &backend, "--device", &device])
        .args(&extra)
        .arg("--summary")
        .arg(&summary_path)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .spawn()
        .map_err(|e| fail(format!("cannot start the daemon: {e}")))?;
    let mut kids = Children(vec![daemon]);
    for _ in 0..loaders {
        let l = Command::new(exe)
            .arg("loader")
            .arg("--config")
            .arg(&cfg_path)
            .args(["--ring", &name, "--wait-secs", "60"])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .map_err(|e| fail(format!("cannot start a loader: {e}")))?;
        kids.0.push(l);
    }
    let start = Instant::now();
    let status = loop {
        if let Some(st) = kids.0[0].try_wait().map_err(|e| fail(e.to_string()))? {
            break st;
        }
        if start.elapsed() > Duration::from_secs(300) {
            return Err(fail("did not finish within 300 s".into()));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // Loaders exit when the daemon closes the ring; `kids` reaps them (and stops any straggler)
    // when it goes out of scope.
    if !status.success() {
        return Err(fail(format!("the daemon exited with {status}")));
    }
    let s = Summary::read(&summary_path).map_err(|e| fail(format!("no summary: {e}")))?;
    Ok(row(mode, slot, loaders, raw, &s))
}

fn row(mode: &str, slot: u64, loaders: usize, raw: f64, s: &Summary) -> Row {
    let gb = s.bytes as f64 / 1e9;
    Row {
        mode: mode.to_string(),
        slot,
        loaders,
        gbps: s.gbps,
        raw_gbps: raw,
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
    }
}

fn to_csv(kind: &str, ceilings: &[(u64, f64, f64)], rows: &[Row]) -> String {
    let mut out = String::from(
        "backend,mode,slot_bytes,loaders,gbps,raw_gbps,ratio_to_raw,batches_per_s,daemon_cpu_s_per_gb,latency_p50_us,latency_p99_us,bound\n",
    );
    for (slot, reg, page) in ceilings {
        let _ = writeln!(
            out,
            "{kind},raw registered,{slot},0,{reg:.3},{reg:.3},1.000,,,,,"
        );
        let _ = writeln!(
            out,
            "{kind},raw pageable,{slot},0,{page:.3},{reg:.3},{:.3},,,,,",
            page / reg.max(1e-9)
        );
    }
    for r in rows {
        let _ = writeln!(
            out,
            "{kind},{},{},{},{:.3},{:.3},{:.3},{:.1},{:.4},{},{},{}",
            r.mode,
            r.slot,
            r.loaders,
            r.gbps,
            r.raw_gbps,
            r.gbps / r.raw_gbps.max(1e-9),
            r.batches_per_s,
            r.cpu_s_per_gb,
            r.p50_us,
            r.p99_us,
            r.bound
        );
    }
    out
}

/// Redraws the plot from a CSV written by [`to_csv`].
fn replot(csv: &Path, out: &Path) -> Result<Vec<Row>, BenchError> {
    let text = std::fs::read_to_string(csv).map_err(io(csv))?;
    let bad = |line: usize, why: &str| BenchError::Run {
        what: format!("reading {} line {line}", csv.display()),
        why: why.to_string(),
    };
    let mut kind = String::from("?");
    let mut ceilings: Vec<(u64, f64, f64)> = Vec::new();
    let mut rows = Vec::new();
    for (n, line) in text.lines().enumerate().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        if f.len() != 12 {
            return Err(bad(n + 1, "expected 12 comma-separated fields"));
        }
        let num = |i: usize| f[i].parse::<f64>().map_err(|_| bad(n + 1, "not a number"));
        let slot: u64 = f[2]
            .parse()
            .map_err(|_| bad(n + 1, "slot_bytes is not a number"))?;
        kind = f[0].to_string();
        match f[1] {
            "raw registered" => ceilings.push((slot, num(4)?, 0.0)),
            "raw pageable" => {
                if let Some(c) = ceilings.iter_mut().find(|c| c.0 == slot) {
                    c.2 = num(4)?;
                }
            }
            mode => rows.push(Row {
                mode: mode.to_string(),
                slot,
                loaders: f[3]
                    .parse()
                    .map_err(|_| bad(n + 1, "loaders is not a number"))?,
                gbps: num(4)?,
                raw_gbps: num(5)?,
                batches_per_s: num(7)?,
                cpu_s_per_gb: num(8)?,
                p50_us: f[9].parse().unwrap_or(0),
                p99_us: f[10].parse().unwrap_or(0),
                bound: f[11].to_string(),
            }),
        }
    }
    let mut loaders: Vec<usize> = rows
        .iter()
        .filter(|r| r.mode == "pipeline")
        .map(|r| r.loaders)
        .collect();
    loaders.sort_unstable();
    loaders.dedup();
    let svg = out.join("bench.svg");
    plot(&svg, &kind, &ceilings, &rows, &loaders)?;
    println!("wrote {}", svg.display());
    Ok(rows)
}

fn plot(
    path: &Path,
    kind: &str,
    ceilings: &[(u64, f64, f64)],
    rows: &[Row],
    loaders: &[usize],
) -> Result<(), BenchError> {
    use plotters::prelude::*;
    let err = |e: String| BenchError::Plot {
        path: path.display().to_string(),
        why: e,
    };
    let root = SVGBackend::new(path, (960, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
    // x is log2 of the slot size, so each power of two gets a tick labelled with its size.
    let lg = |bytes: u64| (bytes.max(1) as f64).log2();
    let xmin = ceilings
        .iter()
        .map(|c| lg(c.0))
        .fold(f64::INFINITY, f64::min);
    let xmax = ceilings
        .iter()
        .map(|c| lg(c.0))
        .fold(f64::NEG_INFINITY, f64::max);
    let (xmin, xmax) = if xmin.is_finite() && xmax.is_finite() {
        (xmin.floor() - 0.3, xmax.ceil() + 0.3)
    } else {
        (15.7, 26.3)
    };
    let ymax = ceilings
        .iter()
        .map(|c| c.1.max(c.2))
        .chain(rows.iter().map(|r| r.gbps))
        .fold(1.0f64, f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("pinring bench ({kind} backend): GB/s by slot size"),
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(55)
        .build_cartesian_2d(xmin..xmax, 0.0..ymax)
        .map_err(|e| err(e.to_string()))?;
    chart
        .configure_mesh()
        .x_desc("slot (batch payload) size")
        .y_desc("GB/s")
        .x_labels(((xmax - xmin).round() as usize).max(2) + 1)
        .x_label_formatter(&|v| {
            if (v - v.round()).abs() < 0.05 {
                ByteSize(2f64.powf(v.round()) as u64).to_string()
            } else {
                String::new()
            }
        })
        .draw()
        .map_err(|e| err(e.to_string()))?;
    let series: Vec<(String, Vec<(f64, f64)>)> = std::iter::once((
        "raw ceiling (registered)".to_string(),
        ceilings.iter().map(|c| (lg(c.0), c.1)).collect(),
    ))
    .chain(std::iter::once((
        "pageable ceiling".to_string(),
        ceilings.iter().map(|c| (lg(c.0), c.2)).collect(),
    )))
    .chain(loaders.iter().map(|&n| {
        (
            format!("pipeline, {n} loaders"),
            rows.iter()
                .filter(|r| r.mode == "pipeline" && r.loaders == n)
                .map(|r| (lg(r.slot), r.gbps))
                .collect(),
        )
    }))
    .collect();
    for (i, (label, pts)) in series.into_iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let style = if i < 2 {
            color.stroke_width(3)
        } else {
            color.stroke_width(2)
        };
        chart
            .draw_series(LineSeries::new(pts.clone(), style))
            .map_err(|e| err(e.to_string()))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart
            .draw_series(pts.into_iter().map(|p| Circle::new(p, 3, color.filled())))
            .map_err(|e| err(e.to_string()))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(e.to_string()))?;
    root.present().map_err(|e| err(e.to_string()))
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
    use super::*;

    #[test]
    fn run_configs_are_valid_and_sized_as_asked() {
        for slot in [64 << 10, 1 << 20, 64 << 20] {
            let c = run_config(slot, 64 << 20, 16 << 30, "bench-test");
            c.validate().unwrap();
            assert_eq!(c.batch_payload_bytes_max(), slot);
            assert!(c.slot_bytes() >= slot && c.slot_bytes() < slot + (8 << 10));
            assert!((8..=256).contains(&c.ring.slots));
        }
    }

    #[test]
    fn dates_are_civil() {
        assert_eq!(now_utc().len(), 10);
    }
}
