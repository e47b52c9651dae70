//! `pinring bench --decode`: JPEG decoding side by side, on the same WebDataset shards, in one
//! run: `[dataset.image] decode = "cpu"` (the loaders decode) against `decode = "gpu"` (the
//! loaders write the compressed bytes, the daemon's engine decodes as it copies: nvJPEG and
//! pinring's kernels on the cuda backend, the loaders' pipeline on the host backend), at each
//! loader count of `--decode-loaders`, `--repeat` times alternating. Each run is a daemon
//! (`--sink discard`, its own engine copying) and its loaders, as the pipeline points are; a
//! row gives images/s from the daemon's summary (first to last delivery), the CPU cores the
//! daemon and its loaders used over the run's wall time (their rusage, start-up included), and
//! the engine's decode counts per way. Writes `decode.csv` in `--out`.

use super::{io, stopped, BenchArgs, BenchError};
use pinring_daemon::summary::Summary;
use pinring_runtime::children::Children;
use pinring_runtime::output::write_file;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Side of the synthetic JPEGs' crop, and their size (ImageNet's typical photo).
const CROP: u32 = 224;
const SYNTH_W: u32 = 500;
const SYNTH_H: u32 = 375;
const SHARDS: u32 = 8;

/// One run of the decode comparison.
#[derive(Debug, Clone)]
pub struct DecodeRun {
    /// "cpu" or "gpu".
    pub decode: &'static str,
    /// Loader processes.
    pub loaders: usize,
    /// Which of the `--repeat` runs.
    pub index: u32,
    /// Images delivered per second, first to last delivery.
    pub images_per_s: f64,
    /// CPU seconds of the daemon and its loaders over the run's wall seconds.
    pub cores: f64,
    /// Images delivered.
    pub images: u64,
    /// Parts (slots) a batch spans: the decoder's batches are parts.
    pub parts_per_batch: u64,
    /// The daemon engine's decode counts (decode = "gpu").
    pub decoded: std::collections::BTreeMap<String, u64>,
}

/// Runs the decode comparison; prints each run and a table of medians.
pub fn run(
    args: &BenchArgs,
    stop: &pinring_runtime::shutdown::Shutdown,
) -> Result<Vec<DecodeRun>, BenchError> {
    let shards = shards(args)?;
    let exe =
        pinring_runtime::this_program::get().map_err(io(Path::new("<current executable>")))?;
    pinring_runtime::outln!(
        "pinring bench --decode: {} shard(s), batch {}, crop {CROP}, {} epoch(s) a run, backend {}",
        shards.len(),
        args.decode_batch,
        args.decode_epochs,
        args.backend
    );
    let mut runs = Vec::new();
    for &loaders in &args.decode_loaders {
        for index in 0..args.repeat {
            for decode in ["cpu", "gpu"] {
                stopped(stop)?;
                let r = one(args, &exe, stop, &shards, decode, loaders, index)?;
                pinring_runtime::outln!(
                    "  decode = {decode:3}, {loaders:2} loaders, run {index}: {:8.0} images/s, {:5.2} CPU cores, {} parts a batch{}",
                    r.images_per_s,
                    r.cores,
                    r.parts_per_batch,
                    if r.decoded.is_empty() {
                        String::new()
                    } else {
                        let ways: Vec<String> = r
                            .decoded
                            .iter()
                            .filter(|(_, n)| **n > 0)
                            .map(|(w, n)| format!("{w} {n}"))
                            .collect();
                        format!(", decoded: {}", ways.join(", "))
                    }
                );
                runs.push(r);
            }
        }
    }
    table(&runs, &args.decode_loaders);
    let csv = args.out.join("decode.csv");
    write_file("the decode bench's CSV", &csv, to_csv(&runs).as_bytes())?;
    pinring_runtime::outln!("\nwrote {}", csv.display());
    Ok(runs)
}

/// The shards given, or synthetic ones made once in `--out/decode-shards`.
fn shards(args: &BenchArgs) -> Result<Vec<PathBuf>, BenchError> {
    if !args.decode_shards.is_empty() {
        return args
            .decode_shards
            .iter()
            .map(|p| std::path::absolute(p).map_err(io(p)))
            .collect();
    }
    let dir = std::path::absolute(args.out.join("decode-shards")).map_err(io(&args.out))?;
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    let per = args.decode_images.div_ceil(SHARDS);
    let mut out = Vec::new();
    let mut k = 0u64;
    for s in 0..SHARDS {
        let path = dir.join(format!("shard-{s:02}.tar"));
        let marker = dir.join(format!("shard-{s:02}.tar.{per}"));
        if !marker.exists() {
            write_shard(&path, per, &mut k)?;
            std::fs::write(&marker, b"").map_err(io(&marker))?;
        } else {
            k += u64::from(per);
        }
        out.push(path);
    }
    Ok(out)
}

/// A shard of `n` synthetic 500×375 JPEGs (quality 90, 4:2:0), labels `k % 1000`.
fn write_shard(path: &Path, n: u32, k: &mut u64) -> Result<(), BenchError> {
    let file = std::fs::File::create(path).map_err(io(path))?;
    let mut b = tar::Builder::new(std::io::BufWriter::new(file));
    for _ in 0..n {
        let pixels = pinring_image::synth::photo(SYNTH_W, SYNTH_H, *k, 8);
        let mut jpeg = Vec::new();
        jpeg_encoder::Encoder::new(&mut jpeg, 90)
            .encode(
                &pixels,
                SYNTH_W as u16,
                SYNTH_H as u16,
                jpeg_encoder::ColorType::Rgb,
            )
            .map_err(|e| BenchError::Run {
                what: "a synthetic JPEG".into(),
                why: e.to_string(),
            })?;
        let label = (*k % 1000).to_string().into_bytes();
        for (name, data) in [
            (format!("{k:08}.jpg"), jpeg),
            (format!("{k:08}.cls"), label),
        ] {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, &name, data.as_slice())
                .map_err(io(path))?;
        }
        *k += 1;
    }
    b.into_inner()
        .and_then(|mut w| std::io::Write::flush(&mut w))
        .map_err(io(path))
}

/// One run's config: the shards, train crops of 224 (u8), `decode`, batches of
/// `--decode-batch`, `--decode-epochs` epochs, the ring sized by "auto".
fn config(args: &BenchArgs, shards: &[PathBuf], decode: &str, name: &str) -> String {
    let list: Vec<String> = shards
        .iter()
        .map(|p| format!("{:?}", p.display().to_string()))
        .collect();
    let slot = args
        .decode_slot_bytes
        .map_or("auto".to_string(), |b| b.bytes().to_string());
    let encoded = match args.decode_encoded_bytes {
        Some(b) if decode == "gpu" => format!("encoded_bytes = {}\n", b.bytes()),
        _ => String::new(),
    };
    format!(
        "[ring]\nname = \"{name}\"\nslot_bytes = {}\n\
         [dataset]\nkind = \"webdataset\"\non_bad_sample = \"skip\"\n\
         [dataset.webdataset]\nshards = [{}]\n\
         [dataset.image]\ntransform = \"train\"\ncrop = {CROP}\noutput = \"u8\"\ndecode = \"{decode}\"\n{encoded}\
         [plan]\nbatch_size = {}\nepochs = {}\nshuffle = true\ndrop_last = true\n",
        if slot == "auto" { "\"auto\"".to_string() } else { slot },
        list.join(", "),
        args.decode_batch,
        args.decode_epochs
    )
}

fn children_cpu_seconds() -> f64 {
    use nix::sys::resource::{getrusage, UsageWho};
    getrusage(UsageWho::RUSAGE_CHILDREN).map_or(0.0, |u| {
        let t = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
        t(u.user_time()) + t(u.system_time())
    })
}

/// One daemon and `loaders` loaders over the shards with `decode`; waits for the daemon, reaps
/// every child, and reads the summary.
fn one(
    args: &BenchArgs,
    exe: &pinring_runtime::this_program::ThisProgram,
    stop: &pinring_runtime::shutdown::Shutdown,
    shards: &[PathBuf],
    decode: &'static str,
    loaders: usize,
    index: u32,
) -> Result<DecodeRun, BenchError> {
    let what = format!("decode = {decode}, {loaders} loaders, run {index}");
    let fail = |why: String| BenchError::Run {
        what: what.clone(),
        why,
    };
    let name = format!("bench-decode-{}", std::process::id());
    let tag = format!("decode-{decode}-{loaders}-{index}");
    let cfg_path = args.out.join(format!("run-{tag}.toml"));
    write_file(
        "a decode run's config",
        &cfg_path,
        config(args, shards, decode, &name).as_bytes(),
    )?;
    let summary_path = args.out.join(format!("run-{tag}.json"));
    let _ = std::fs::remove_file(&summary_path);
    let cpu0 = children_cpu_seconds();
    let start = Instant::now();
    let mut daemon_cmd = exe.command();
    daemon_cmd
        .arg("daemon")
        .arg("--config")
        .arg(&cfg_path)
        .args(["--sink", "discard", "--backend", &args.backend.to_string()])
        .args(["--device", &args.device.to_string()])
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
        let mut cmd = exe.command();
        cmd.arg("loader")
            .arg("--config")
            .arg(&cfg_path)
            .args(["--ring", &name, "--wait-secs", "60"])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null());
        pinring_runtime::children::stop_with_parent(&mut cmd);
        kids.0.push(
            cmd.spawn()
                .map_err(|e| fail(format!("cannot start a loader: {e}")))?,
        );
    }
    let status = super::wait_daemon(&mut kids, stop, Duration::from_secs(600), &fail)?;
    // The loaders leave when the daemon closes the ring: reaped here, so their CPU counts.
    for k in kids.0.iter_mut().skip(1) {
        let _ = k.wait();
    }
    let wall = start.elapsed().as_secs_f64();
    let cpu = children_cpu_seconds() - cpu0;
    if !status.success() {
        return Err(fail(format!("the daemon exited with {status}")));
    }
    let s = Summary::read(&summary_path).map_err(|e| fail(format!("no summary: {e}")))?;
    let images = s.batches_delivered * u64::from(args.decode_batch);
    Ok(DecodeRun {
        decode,
        loaders,
        index,
        images_per_s: if s.seconds > 0.0 {
            images as f64 / s.seconds
        } else {
            0.0
        },
        cores: if wall > 0.0 { cpu / wall } else { 0.0 },
        images,
        parts_per_batch: s.parts_per_batch,
        decoded: s.images_decoded,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Medians per loader count: each way's images/s and cores, and gpu over cpu.
fn table(runs: &[DecodeRun], loaders: &[usize]) {
    pinring_runtime::outln!(
        "\n{:>7} {:>14} {:>9} {:>14} {:>9} {:>8}",
        "loaders",
        "cpu images/s",
        "cores",
        "gpu images/s",
        "cores",
        "gpu/cpu"
    );
    for &n in loaders {
        let of = |d: &str, f: fn(&DecodeRun) -> f64| {
            median(
                runs.iter()
                    .filter(|r| r.loaders == n && r.decode == d)
                    .map(f)
                    .collect(),
            )
        };
        let (c, g) = (of("cpu", |r| r.images_per_s), of("gpu", |r| r.images_per_s));
        pinring_runtime::outln!(
            "{n:>7} {c:>14.0} {:>9.2} {g:>14.0} {:>9.2} {:>8.2}",
            of("cpu", |r| r.cores),
            of("gpu", |r| r.cores),
            if c > 0.0 { g / c } else { 0.0 }
        );
    }
}

fn to_csv(runs: &[DecodeRun]) -> String {
    let mut out =
        String::from("decode,loaders,run,images,parts_per_batch,images_per_s,cores,decoded\n");
    for r in runs {
        let decoded: Vec<String> = r.decoded.iter().map(|(k, v)| format!("{k}={v}")).collect();
        out.push_str(&format!(
            "{},{},{},{},{},{:.1},{:.3},{}\n",
            r.decode,
            r.loaders,
            r.index,
            r.images,
            r.parts_per_batch,
            r.images_per_s,
            r.cores,
            decoded.join(" ")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run's config is one a daemon takes: the shards, the decode way, the plan.
    #[test]
    fn decode_run_configs_are_valid() {
        let args = <crate::bench::BenchArgs as clap::FromArgMatches>::from_arg_matches(
            &<crate::bench::BenchArgs as clap::Args>::augment_args(clap::Command::new("b"))
                .get_matches_from(["b", "--decode"]),
        )
        .unwrap();
        for decode in ["cpu", "gpu"] {
            let text = config(&args, &[PathBuf::from("/d/s0.tar")], decode, "r");
            let cfg = pinring_data::Config::from_toml_str(&text, "t").unwrap();
            assert_eq!(cfg.decodes_on_copy(), decode == "gpu");
            assert_eq!(cfg.plan.batch_size, 256);
        }
    }
}
