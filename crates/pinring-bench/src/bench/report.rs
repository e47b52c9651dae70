//! `bench.csv` and the plots: the CSV written from the points and read back (`--replot`), and
//! `bench.svg` / `bench-rings.svg` drawn from them.

use super::*;

/// The columns of `bench.csv`. A point has one row per run (`run` = 1, 2, …) and a summary row
/// (`run` = `median`: medians of the runs, GB/s with its min, max and spread, `flagged` 1 when
/// either spread exceeds 10%); the ceilings have one row each, `run` empty.
pub const CSV_COLUMNS: [&str; 23] = [
    "backend",
    "mode",
    "slot_bytes",
    "slots",
    "loaders",
    "run",
    "gbps",
    "gbps_min",
    "gbps_max",
    "spread",
    "ref_gbps",
    "ref_spread",
    "ratio_to_ref",
    "flagged",
    "raw_gbps",
    "ratio_to_raw",
    "batches_per_s",
    "daemon_cpu_s_per_gb",
    "latency_p50_us",
    "latency_p99_us",
    "bound",
    "bytes",
    "ref_bytes",
];

/// One CSV record from (column, value) pairs, in [`CSV_COLUMNS`]' order; columns not given are
/// empty. The `csv` writer quotes a value only when it needs it (a comma, a quote, a line end).
fn csv_line(out: &mut csv::Writer<Vec<u8>>, fields: &[(&str, String)]) {
    debug_assert!(fields.iter().all(|(k, _)| CSV_COLUMNS.contains(k)));
    let record = CSV_COLUMNS.iter().map(|c| {
        fields
            .iter()
            .find(|(k, _)| k == c)
            .map_or("", |(_, v)| v.as_str())
    });
    // Writing into memory fails only when a record's length differs from the header's, which
    // this record's cannot.
    out.write_record(record)
        .expect("a bench.csv record is CSV_COLUMNS long");
}

/// A number for the CSV: empty when it is not one (a ratio to a zero reference).
fn num(v: Option<f64>, decimals: usize) -> String {
    v.filter(|v| v.is_finite())
        .map_or_else(String::new, |v| format!("{v:.decimals$}"))
}

pub(super) fn to_csv(kind: &str, ceilings: &[(u64, f64, f64)], points: &[Point]) -> String {
    let mut out = csv::WriterBuilder::new()
        .terminator(csv::Terminator::Any(b'\n'))
        .from_writer(Vec::new());
    out.write_record(CSV_COLUMNS)
        .expect("the header is CSV_COLUMNS long");
    for &(slot, reg, page) in ceilings {
        for (mode, gbps) in [("raw registered", reg), ("raw pageable", page)] {
            csv_line(
                &mut out,
                &[
                    ("backend", kind.to_string()),
                    ("mode", mode.to_string()),
                    ("slot_bytes", slot.to_string()),
                    ("loaders", "0".into()),
                    ("gbps", num(Some(gbps), 3)),
                    ("raw_gbps", num(Some(reg), 3)),
                    ("ratio_to_raw", num(Some(gbps / reg.max(1e-9)), 3)),
                ],
            );
        }
    }
    for p in points {
        let point = [
            ("backend", kind.to_string()),
            ("mode", p.mode.clone()),
            ("slot_bytes", p.slot.to_string()),
            ("slots", p.slots.to_string()),
            ("loaders", p.loaders.to_string()),
            ("raw_gbps", num(Some(p.raw_gbps), 3)),
        ];
        for r in &p.runs {
            let mut fields = point.to_vec();
            fields.extend([
                ("run", r.index.to_string()),
                ("gbps", num(Some(r.gbps), 3)),
                ("ref_gbps", num(Some(r.ref_gbps), 3)),
                ("ratio_to_ref", num(Some(r.ratio_to_ref()), 3)),
                ("ratio_to_raw", num(Some(r.gbps / p.raw_gbps.max(1e-9)), 3)),
                ("batches_per_s", num(Some(r.batches_per_s), 1)),
                ("daemon_cpu_s_per_gb", num(Some(r.cpu_s_per_gb), 4)),
                ("latency_p50_us", r.p50_us.to_string()),
                ("latency_p99_us", r.p99_us.to_string()),
                ("bound", r.bound.clone()),
                ("bytes", r.bytes.to_string()),
                ("ref_bytes", r.ref_bytes.to_string()),
            ]);
            csv_line(&mut out, &fields);
        }
        let (gbps, reference) = (p.gbps(), p.reference());
        let median = gbps.map(|s| s.median);
        let mut fields = point.to_vec();
        fields.extend([
            ("run", "median".to_string()),
            ("gbps", num(median, 3)),
            ("gbps_min", num(gbps.map(|s| s.min), 3)),
            ("gbps_max", num(gbps.map(|s| s.max), 3)),
            ("spread", num(gbps.and_then(|s| s.spread()), 3)),
            ("ref_gbps", num(reference.map(|s| s.median), 3)),
            ("ref_spread", num(reference.and_then(|s| s.spread()), 3)),
            ("ratio_to_ref", num(p.ratio_to_ref(), 3)),
            ("flagged", u8::from(p.flagged()).to_string()),
            (
                "ratio_to_raw",
                num(median.map(|m| m / p.raw_gbps.max(1e-9)), 3),
            ),
            (
                "batches_per_s",
                num(Some(p.median_of(|r| r.batches_per_s)), 1),
            ),
            (
                "daemon_cpu_s_per_gb",
                num(Some(p.median_of(|r| r.cpu_s_per_gb)), 4),
            ),
            (
                "latency_p50_us",
                num(Some(p.median_of(|r| f64::from(r.p50_us))), 0),
            ),
            (
                "latency_p99_us",
                num(Some(p.median_of(|r| f64::from(r.p99_us))), 0),
            ),
            ("bound", p.bound().to_string()),
        ]);
        csv_line(&mut out, &fields);
    }
    let bytes = out.into_inner().expect("writing into memory cannot fail");
    String::from_utf8(bytes).expect("every field is a String")
}

/// Rebuilds the points from a CSV written by [`to_csv`] (from its per-run rows; the summary rows
/// are recomputed) or by an older `pinring bench` (one row per point, no `run` column, no
/// reference), and redraws the plot.
pub(super) fn replot(csv: &Path, out: &Path) -> Result<Vec<Point>, BenchError> {
    let text = std::fs::read_to_string(csv).map_err(io(csv))?;
    let (kind, ceilings, points) = parse_csv(&text).map_err(|(line, why)| BenchError::Run {
        what: format!("reading {} line {line}", csv.display()),
        why,
    })?;
    let mut loaders: Vec<usize> = points
        .iter()
        .filter(|p| p.mode == "pipeline")
        .map(|p| p.loaders)
        .collect();
    loaders.sort_unstable();
    loaders.dedup();
    let svg = out.join("bench.svg");
    plot(&svg, &kind, &ceilings, &points, &loaders)?;
    pinring_runtime::outln!("wrote {}", svg.display());
    // A CSV holds no ring list: it swept rings if a slot size ran at more than one slot count.
    let mut geometries: Vec<(u64, u32)> = points
        .iter()
        .filter(|p| p.mode == "pipeline" && p.slots > 0)
        .map(|p| (p.slot, p.slots))
        .collect();
    geometries.sort_unstable();
    geometries.dedup();
    let swept = geometries.windows(2).any(|w| w[0].0 == w[1].0);
    plot_rings_if(swept, out, &kind, &points)?;
    Ok(points)
}

/// The ceilings and points of a bench CSV; an error is (line number, what is wrong). Fields are
/// read as CSV is written (a quoted field may hold a comma, a quote or a line end; CRLF or LF).
#[allow(clippy::type_complexity)]
pub(super) fn parse_csv(
    text: &str,
) -> Result<(String, Vec<(u64, f64, f64)>, Vec<Point>), (usize, String)> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .from_reader(text.as_bytes());
    let mut records = reader.records();
    let line_of = |e: &csv::Error| e.position().map_or(1, |p| p.line() as usize);
    let header = records
        .next()
        .ok_or((1, "empty file".to_string()))?
        .map_err(|e| (line_of(&e), e.to_string()))?;
    let header: Vec<&str> = header.iter().collect();
    let col = |name: &str| header.iter().position(|h| *h == name);
    let required = |name: &str| col(name).ok_or((1, format!("no {name} column")));
    let (c_backend, c_mode, c_slot, c_loaders, c_gbps) = (
        required("backend")?,
        required("mode")?,
        required("slot_bytes")?,
        required("loaders")?,
        required("gbps")?,
    );
    let mut kind = String::from("?");
    let mut ceilings: Vec<(u64, f64, f64)> = Vec::new();
    let mut points: Vec<Point> = Vec::new();
    for record in records {
        let record = record.map_err(|e| (line_of(&e), e.to_string()))?;
        let line_no = record.position().map_or(0, |p| p.line() as usize);
        let f: Vec<&str> = record.iter().collect();
        if f.len() != header.len() {
            return Err((
                line_no,
                format!("{} fields, the header has {}", f.len(), header.len()),
            ));
        }
        let field = |c: Option<usize>| c.map_or("", |c| f[c]);
        let number = |c: usize, what: &str| {
            f[c].parse::<f64>()
                .map_err(|_| (line_no, format!("{what} {:?} is not a number", f[c])))
        };
        let optional = |name: &str| field(col(name)).parse::<f64>().ok();
        let slot: u64 = f[c_slot].parse().map_err(|_| {
            (
                line_no,
                format!("slot_bytes {:?} is not a number", f[c_slot]),
            )
        })?;
        kind = f[c_backend].to_string();
        match f[c_mode] {
            "raw registered" => ceilings.push((slot, number(c_gbps, "gbps")?, 0.0)),
            "raw pageable" => {
                if let Some(c) = ceilings.iter_mut().find(|c| c.0 == slot) {
                    c.2 = number(c_gbps, "gbps")?;
                }
            }
            _ if field(col("run")) == "median" => {}
            mode => {
                let loaders: usize = f[c_loaders].parse().map_err(|_| {
                    (
                        line_no,
                        format!("loaders {:?} is not a number", f[c_loaders]),
                    )
                })?;
                let run = Run {
                    index: field(col("run")).parse().unwrap_or(1),
                    gbps: number(c_gbps, "gbps")?,
                    bytes: field(col("bytes")).parse().unwrap_or(0),
                    batches_per_s: optional("batches_per_s").unwrap_or(0.0),
                    cpu_s_per_gb: optional("daemon_cpu_s_per_gb").unwrap_or(0.0),
                    p50_us: field(col("latency_p50_us")).parse().unwrap_or(0),
                    p99_us: field(col("latency_p99_us")).parse().unwrap_or(0),
                    bound: field(col("bound")).to_string(),
                    ref_gbps: optional("ref_gbps").unwrap_or(f64::NAN),
                    ref_bytes: field(col("ref_bytes")).parse().unwrap_or(0),
                };
                let raw = optional("raw_gbps").unwrap_or(0.0);
                let slots: u32 = field(col("slots")).parse().unwrap_or(0);
                match points.iter_mut().find(|p| {
                    p.mode == mode && p.slot == slot && p.slots == slots && p.loaders == loaders
                }) {
                    Some(p) => p.runs.push(run),
                    None => points.push(Point {
                        mode: mode.to_string(),
                        slot,
                        slots,
                        loaders,
                        raw_gbps: raw,
                        runs: vec![run],
                    }),
                }
            }
        }
    }
    Ok((kind, ceilings, points))
}

pub(super) fn plot(
    path: &Path,
    kind: &str,
    ceilings: &[(u64, f64, f64)],
    points: &[Point],
    loaders: &[usize],
) -> Result<(), BenchError> {
    use plotters::prelude::*;
    let err = |e: String| BenchError::Plot {
        path: path.display().to_string(),
        why: e,
    };
    // Drawn into memory, then written through `output::write_file` (no link followed, no
    // special file replaced).
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (960, 600)).into_drawing_area();
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
        // Medians: the lines go through the value the table reports.
        let (median, ref_median) = (Point::median_gbps, Point::reference_median);
        let ymax = ceilings
            .iter()
            .map(|c| c.1.max(c.2))
            .chain(points.iter().map(median))
            .chain(points.iter().filter_map(ref_median))
            .fold(1.0f64, f64::max)
            * 1.1;
        let mut chart = bytes_chart(
            &root,
            format!("pinring bench ({kind} backend): GB/s by slot size"),
            "slot (batch payload) size",
            (xmin, xmax),
            ymax,
        )
        .map_err(err)?;
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
                points
                    .iter()
                    .filter(|p| p.mode == "pipeline" && p.loaders == n)
                    .map(|p| (lg(p.slot), median(p)))
                    .collect(),
            )
        }))
        // The reference at the most loaders only: one line per loader count would hide the rest.
        .chain(loaders.iter().max().map(|&n| {
            (
                format!("reference (no protocol), {n} writers"),
                points
                    .iter()
                    .filter(|p| p.mode == "pipeline" && p.loaders == n)
                    .filter_map(|p| Some((lg(p.slot), ref_median(p)?)))
                    .collect(),
            )
        }))
        .filter(|(_, pts): &(String, Vec<(f64, f64)>)| !pts.is_empty())
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
        root.present().map_err(|e| err(e.to_string()))?;
    }
    write_file("the bench's plot", path, svg.as_bytes())?;
    Ok(())
}

/// A chart of GB/s (0 to `ymax`) against a size on a log2 axis (`x`: its range in log2 of
/// bytes), each power of two ticked with its size: the frame both plots draw into.
fn bytes_chart<'a, 'b>(
    root: &'a plotters::drawing::DrawingArea<
        plotters::prelude::SVGBackend<'b>,
        plotters::coord::Shift,
    >,
    caption: String,
    x_desc: &str,
    x: (f64, f64),
    ymax: f64,
) -> Result<
    plotters::chart::ChartContext<
        'a,
        plotters::prelude::SVGBackend<'b>,
        plotters::coord::cartesian::Cartesian2d<
            plotters::coord::types::RangedCoordf64,
            plotters::coord::types::RangedCoordf64,
        >,
    >,
    String,
> {
    use plotters::prelude::*;
    let (xmin, xmax) = x;
    let mut chart = ChartBuilder::on(root)
        .caption(caption, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(55)
        .build_cartesian_2d(xmin..xmax, 0.0..ymax)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
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
        .map_err(|e| e.to_string())?;
    Ok(chart)
}

/// Draws `bench-rings.svg` in `out` when the run `swept` ring sizes, and says so.
pub(super) fn plot_rings_if(
    swept: bool,
    out: &Path,
    kind: &str,
    points: &[Point],
) -> Result<(), BenchError> {
    if swept {
        let rings = out.join("bench-rings.svg");
        plot_rings(&rings, kind, points)?;
        pinring_runtime::outln!("wrote {}", rings.display());
    }
    Ok(())
}

/// `bench-rings.svg`: the pipeline's GB/s (median) against the ring's size, one line per slot
/// size and loader count, with the reference's median beside each as a thin line of the same
/// colour. Points of an older CSV (no slot count) are left out.
fn plot_rings(path: &Path, kind: &str, points: &[Point]) -> Result<(), BenchError> {
    use plotters::prelude::*;
    let err = |e: String| BenchError::Plot {
        path: path.display().to_string(),
        why: e,
    };
    let pipeline: Vec<&Point> = points
        .iter()
        .filter(|p| p.mode == "pipeline" && p.slots > 0)
        .collect();
    let ring = |p: &Point| p.slot.saturating_mul(u64::from(p.slots));
    let lg = |bytes: u64| (bytes.max(1) as f64).log2();
    let (xmin, xmax) = pipeline
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| {
            (a.min(lg(ring(p))), b.max(lg(ring(p))))
        });
    let (xmin, xmax) = if xmin.is_finite() {
        (xmin.floor() - 0.3, xmax.ceil() + 0.3)
    } else {
        (20.7, 30.3)
    };
    let (median, ref_median) = (Point::median_gbps, Point::reference_median);
    let ymax = pipeline
        .iter()
        .map(|p| median(p).max(ref_median(p).unwrap_or(0.0)))
        .fold(1.0f64, f64::max)
        * 1.1;
    let mut lines: Vec<(u64, usize)> = pipeline.iter().map(|p| (p.slot, p.loaders)).collect();
    lines.sort_unstable();
    lines.dedup();
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (960, 600)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
        let mut chart = bytes_chart(
            &root,
            format!("pinring bench ({kind} backend): GB/s by ring size"),
            "ring size (slots x slot size)",
            (xmin, xmax),
            ymax,
        )
        .map_err(err)?;
        for (i, &(slot, loaders)) in lines.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let mut of_line: Vec<&&Point> = pipeline
                .iter()
                .filter(|p| p.slot == slot && p.loaders == loaders)
                .collect();
            of_line.sort_by_key(|p| ring(p));
            let ours: Vec<(f64, f64)> = of_line.iter().map(|p| (lg(ring(p)), median(p))).collect();
            let theirs: Vec<(f64, f64)> = of_line
                .iter()
                .filter_map(|p| Some((lg(ring(p)), ref_median(p)?)))
                .collect();
            chart
                .draw_series(LineSeries::new(ours.clone(), color.stroke_width(2)))
                .map_err(|e| err(e.to_string()))?
                .label(format!("{} slots, {loaders} loaders", ByteSize(slot)))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
            chart
                .draw_series(ours.into_iter().map(|p| Circle::new(p, 3, color.filled())))
                .map_err(|e| err(e.to_string()))?;
            chart
                .draw_series(LineSeries::new(theirs, color.mix(0.5).stroke_width(1)))
                .map_err(|e| err(e.to_string()))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(|e| err(e.to_string()))?;
        root.draw(&Text::new(
            "thin lines: the reference pipeline (no protocol) at the same geometry",
            (70, 40),
            ("sans-serif", 14),
        ))
        .map_err(|e| err(e.to_string()))?;
        root.present().map_err(|e| err(e.to_string()))?;
    }
    write_file("the bench's ring plot", path, svg.as_bytes())?;
    Ok(())
}
