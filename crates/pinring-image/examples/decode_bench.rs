//! Decoder and pipeline speed against PIL, on generated ImageNet-like JPEGs.
//!
//! ```text
//! cargo run --release -p pinring-image --example decode_bench [--features bench-turbojpeg] -- [SECONDS] [DIR]
//! ```
//!
//! Writes 8 JPEGs of 500×375 (smooth gradients + noise, quality 90, 4:2:0) into DIR
//! (default `target/decode_bench`), then in each of 5 rounds times each Rust candidate, on
//! one thread, for SECONDS (default 1), right after timing PIL (in a `python3` child) on the
//! same task for as long; prints the median images/s and the median of the paired ratios. Then the same for 2000×1500
//! JPEGs, where a reduced-size decode pays, against zune-jpeg at full size; and the stages
//! of the u8 train pipeline timed one by one. Compare ratios, not absolute figures, across
//! machines.

use std::hint::black_box;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use jpeg_encoder::{ColorType, Encoder, SamplingFactor};
use pinring_image::{synth, Decoder, Float, Output, Pipeline, SampleKey, SampleSpec, Transform};
use zune_core::bytestream::ZCursor;
use zune_core::colorspace::ColorSpace;
use zune_core::options::DecoderOptions;

const W: u32 = 500;
const H: u32 = 375;
const N: usize = 8;

const PIL_SCRIPT: &str = r#"
import math, random, sys, time
from PIL import Image
files = sys.argv[1:]
datas = [open(f, "rb").read() for f in files]
import io
def rrc_box(w, h, rnd):
    area = w * h
    lr = (math.log(3 / 4), math.log(4 / 3))
    for _ in range(10):
        ta = area * rnd.uniform(0.08, 1.0)
        ar = math.exp(rnd.uniform(*lr))
        cw = int(round(math.sqrt(ta * ar))); ch = int(round(math.sqrt(ta / ar)))
        if 0 < cw <= w and 0 < ch <= h:
            i = rnd.randint(0, h - ch); j = rnd.randint(0, w - cw)
            return (j, i, j + cw, i + ch)
    return (0, 0, w, h)  # torchvision's fallback for ratios in range, as for 500x375
def decode(d, rnd=None):
    return Image.open(io.BytesIO(d)).convert("RGB")
def train(d, rnd):
    img = decode(d)
    out = img.resize((224, 224), Image.BILINEAR, box=rrc_box(img.width, img.height, rnd))
    if rnd.random() < 0.5:
        out = out.transpose(Image.FLIP_LEFT_RIGHT)
    return out.tobytes()
def evalt(d, rnd):
    img = decode(d)
    w, h = img.size
    if w <= h: rw, rh = 256, int(256 * h / w)
    else: rw, rh = int(256 * w / h), 256
    l = int(round((rw - 224) / 2.0)); t = int(round((rh - 224) / 2.0))
    sx, sy = w / rw, h / rh
    return img.resize((224, 224), Image.BILINEAR, box=(l * sx, t * sy, (l + 224) * sx, (t + 224) * sy)).tobytes()
tasks = {"decode": decode, "train": train, "eval": evalt}
rnd = random.Random(0)
for line in sys.stdin:
    name, secs = line.split()
    f = tasks[name]; secs = float(secs); n = 0; t0 = time.perf_counter()
    while time.perf_counter() - t0 < secs:
        f(datas[n % len(datas)], rnd); n += 1
    print(n / (time.perf_counter() - t0), flush=True)
"#;

type Task = Box<dyn FnMut(&[u8])>;
type Stage<'a> = Box<dyn FnMut(usize) + 'a>;
type Candidate = (String, &'static str, Task);

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let secs: f64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1.0);
    let dir = PathBuf::from(
        args.get(2)
            .cloned()
            .unwrap_or_else(|| "target/decode_bench".into()),
    );
    std::fs::create_dir_all(&dir).expect("create the output directory");
    let mut files = Vec::new();
    let mut jpegs = Vec::new();
    for i in 0..N {
        let buf = jpeg(W, H, i as u64);
        let path = dir.join(format!("img{i}.jpg"));
        std::fs::write(&path, &buf).expect("write a JPEG");
        files.push(path);
        jpegs.push(buf);
    }
    let big: Vec<Vec<u8>> = (0..2).map(|i| jpeg(BIG_W, BIG_H, 100 + i)).collect();
    let mean_kib = jpegs.iter().map(Vec::len).sum::<usize>() as f64 / N as f64 / 1024.0;
    println!(
        "{N} JPEGs of {W}x{H}, quality 90, 4:2:0, {mean_kib:.0} KiB on average; {ROUNDS} rounds of {secs} s per candidate and per PIL pairing, one thread\n"
    );

    let mut cands = candidates();
    let mut big_cands = big_candidates();

    // Each Rust measurement is paired with a PIL measurement of the same task just before it,
    // so that both see the same machine; the ratio reported is the median of the pairs'.
    let mut pil = Pil::start(&files);
    let mut rates = vec![Vec::new(); cands.len()];
    let mut pil_rates = vec![Vec::new(); cands.len()];
    let mut big_rates = vec![Vec::new(); big_cands.len()];
    for _ in 0..ROUNDS {
        for (i, c) in cands.iter_mut().enumerate() {
            pil_rates[i].push(pil.rate(c.1, secs));
            rates[i].push(rate(secs, &jpegs, &mut c.2));
        }
        for (i, c) in big_cands.iter_mut().enumerate() {
            big_rates[i].push(rate(secs, &big, &mut c.2));
        }
    }
    println!("| candidate ({W}x{H}) | images/s | PIL, same task, images/s | ratio to PIL (median of {ROUNDS} pairs) |");
    println!("| --- | ---: | ---: | ---: |");
    for (i, (name, task, _)) in cands.iter().enumerate() {
        let ratios: Vec<f64> = rates[i]
            .iter()
            .zip(&pil_rates[i])
            .map(|(r, p)| r / p)
            .collect();
        println!(
            "| {name} | {:.0} | {:.0} ({task}) | {:.2} |",
            median(&rates[i]),
            median(&pil_rates[i]),
            median(&ratios)
        );
    }
    stages(secs, &jpegs);
    let big_base = median(&big_rates[0]);
    println!("\n| candidate ({BIG_W}x{BIG_H}) | images/s | vs zune-jpeg full |");
    println!("| --- | ---: | ---: |");
    for ((name, _, _), r) in big_cands.iter().zip(&big_rates) {
        println!(
            "| {name} | {:.0} | {:.2} |",
            median(r),
            median(r) / big_base
        );
    }
}

/// The decoders and pipelines measured on the 500x375 files, each with the PIL task it pairs
/// with.
fn candidates() -> Vec<Candidate> {
    let mut cands: Vec<Candidate> = Vec::new();
    let mut add = |name: &str, base: &'static str, f: Task| cands.push((name.to_string(), base, f));
    add("zune-jpeg 0.5", "decode", Box::new(zune));
    for r in [1u16, 2, 4] {
        add(
            &format!("jpeg-decoder 0.3, 1/{r}"),
            "decode",
            Box::new(move |d| jpeg_decoder_scaled(d, r)),
        );
    }
    add(
        "image 0.25 (zune-jpeg inside)",
        "decode",
        Box::new(|d| {
            let img =
                image::load_from_memory_with_format(d, image::ImageFormat::Jpeg).expect("image");
            black_box(img.into_rgb8());
        }),
    );
    #[cfg(feature = "bench-turbojpeg")]
    for r in [1usize, 2, 4] {
        add(
            &format!("turbojpeg 1.x (libjpeg-turbo 3), 1/{r}"),
            "decode",
            Box::new(turbo(r)),
        );
    }
    let mut dec = Decoder::new();
    add(
        "pinring-image Decoder (zune-jpeg), full size",
        "decode",
        Box::new(move |d| {
            black_box(dec.decode(d, 1).expect("decode").rgb.len());
        }),
    );
    add(
        "pinring-image train (RRC 224 + flip), u8 HWC",
        "train",
        pipeline(Transform::TRAIN_DEFAULT, Output::U8Hwc),
    );
    add(
        "pinring-image train, bf16 CHW normalised",
        "train",
        pipeline(Transform::TRAIN_DEFAULT, Output::imagenet(Float::Bf16)),
    );
    add(
        "pinring-image train, f32 CHW normalised",
        "train",
        pipeline(Transform::TRAIN_DEFAULT, Output::imagenet(Float::F32)),
    );
    add(
        "pinring-image eval (256 + centre 224), u8 HWC",
        "eval",
        pipeline(Transform::EVAL_DEFAULT, Output::U8Hwc),
    );
    cands
}

/// The decoders and pipelines measured on the large photos, where a reduced-size decode pays.
fn big_candidates() -> Vec<Candidate> {
    let mut big_cands: Vec<Candidate> = Vec::new();
    let mut add = |name: &str, f: Task| big_cands.push((name.to_string(), "big", f));
    add("zune-jpeg 0.5, full", Box::new(zune));
    for r in [4u16, 8] {
        add(
            &format!("jpeg-decoder 0.3, 1/{r}"),
            Box::new(move |d| jpeg_decoder_scaled(d, r)),
        );
    }
    #[cfg(feature = "bench-turbojpeg")]
    for r in [1usize, 4, 8] {
        add(
            &format!("turbojpeg (libjpeg-turbo 3), 1/{r}"),
            Box::new(turbo(r)),
        );
    }
    let mut eval_full = pipeline_with(Transform::EVAL_DEFAULT, Output::U8Hwc, false);
    add(
        "pinring-image eval, full-size decode",
        Box::new(move |d| eval_full(d)),
    );
    let mut eval_red = pipeline_with(Transform::EVAL_DEFAULT, Output::U8Hwc, true);
    add(
        "pinring-image eval, reduced decode allowed",
        Box::new(move |d| eval_red(d)),
    );
    big_cands
}

const ROUNDS: usize = 5;

/// The u8 train pipeline's stages, each timed alone on the same files and keys: microseconds
/// an image, median of the rounds.
fn stages(secs: f64, jpegs: &[Vec<u8>]) {
    use fast_image_resize as fir;
    let mut dec = Decoder::new();
    let keys = |n: usize| SampleKey {
        seed: 1,
        epoch: 0,
        sample_id: n as u64,
    };
    // The decoded images as RGBX, the pipeline's layout for colour JPEGs.
    let rgbx: Vec<Vec<u8>> = jpegs
        .iter()
        .map(|d| {
            let img = dec.decode(d, 1).expect("decode");
            img.rgb
                .chunks_exact(3)
                .flat_map(|p| [p[0], p[1], p[2], 255])
                .collect()
        })
        .collect();
    let mut resizer = fir::Resizer::new();
    let mut dst = vec![0u8; 224 * 224 * 4];
    let mut p = Pipeline::new(SampleSpec {
        transform: Transform::TRAIN_DEFAULT,
        output: Output::U8Hwc,
        reduced_decode: true,
    })
    .expect("spec");
    let mut sample = vec![0u8; p.spec().sample_bytes()];
    let mut rows: Vec<(&str, Stage<'_>)> = vec![
        (
            "headers (Decoder::info)",
            Box::new(|n| {
                black_box(Decoder::new().info(&jpegs[n % N]).expect("info"));
            }),
        ),
        (
            "whole decode to RGB (Decoder::decode)",
            Box::new(move |n| {
                black_box(dec.decode(&jpegs[n % N], 1).expect("decode").rgb.len());
            }),
        ),
        (
            "resample the box, RGBX (fast_image_resize U8x4)",
            Box::new(|n| {
                let (b, _) = Transform::TRAIN_DEFAULT.plan(W, H, keys(n));
                let src = fir::images::ImageRef::new(W, H, &rgbx[n % N], fir::PixelType::U8x4)
                    .expect("src");
                let mut d =
                    fir::images::Image::from_slice_u8(224, 224, &mut dst, fir::PixelType::U8x4)
                        .expect("dst");
                let o = fir::ResizeOptions::new()
                    .resize_alg(fir::ResizeAlg::Convolution(fir::FilterType::Bilinear))
                    .use_alpha(false)
                    .crop(b.left, b.top, b.width, b.height);
                resizer.resize(&src, &mut d, &o).expect("resize");
            }),
        ),
        (
            "whole pipeline (train, u8 HWC)",
            Box::new(|n| {
                black_box(
                    p.process(&jpegs[n % N], keys(n), &mut sample)
                        .expect("process"),
                );
            }),
        ),
    ];
    let mut us = vec![Vec::new(); rows.len()];
    for _ in 0..ROUNDS {
        for (i, (_, f)) in rows.iter_mut().enumerate() {
            let (mut n, t0) = (0usize, Instant::now());
            while t0.elapsed() < Duration::from_secs_f64(secs) {
                f(n);
                n += 1;
            }
            us[i].push(t0.elapsed().as_secs_f64() * 1e6 / n as f64);
        }
    }
    println!("\n| stage of the u8 train pipeline ({W}x{H}) | µs per image (median of {ROUNDS}) |");
    println!("| --- | ---: |");
    for ((name, _), u) in rows.iter().zip(&us) {
        println!("| {name} | {:.0} |", median(u));
    }
}
const BIG_W: u32 = 2000;
const BIG_H: u32 = 1500;

fn jpeg(w: u32, h: u32, seed: u64) -> Vec<u8> {
    let rgb = synth::photo(w, h, seed, 6);
    let mut buf = Vec::new();
    let mut enc = Encoder::new(&mut buf, 90);
    enc.set_sampling_factor(SamplingFactor::F_2_2);
    enc.encode(&rgb, w as u16, h as u16, ColorType::Rgb)
        .expect("encode");
    buf
}

fn rate(secs: f64, inputs: &[Vec<u8>], f: &mut dyn FnMut(&[u8])) -> f64 {
    let (mut n, t0) = (0usize, Instant::now());
    while t0.elapsed() < Duration::from_secs_f64(secs) {
        f(&inputs[n % inputs.len()]);
        n += 1;
    }
    n as f64 / t0.elapsed().as_secs_f64()
}

fn zune(d: &[u8]) {
    let opts = DecoderOptions::default().jpeg_set_out_colorspace(ColorSpace::RGB);
    let mut dec = zune_jpeg::JpegDecoder::new_with_options(ZCursor::new(d), opts);
    black_box(dec.decode().expect("zune-jpeg"));
}

fn jpeg_decoder_scaled(d: &[u8], r: u16) {
    let mut dec = jpeg_decoder::Decoder::new(d);
    dec.read_info().expect("header");
    let info = dec.info().expect("info");
    if r > 1 {
        dec.scale(info.width.div_ceil(r), info.height.div_ceil(r))
            .expect("scale");
    }
    black_box(dec.decode().expect("jpeg-decoder"));
}

#[cfg(feature = "bench-turbojpeg")]
fn turbo(r: usize) -> impl FnMut(&[u8]) {
    let mut tj = turbojpeg::Decompressor::new().expect("turbojpeg");
    let f = turbojpeg::ScalingFactor::new(1, r);
    tj.set_scaling_factor(f).expect("scaling factor");
    let mut out = Vec::new();
    move |d| {
        let hdr = tj.read_header(d).expect("header").scaled(f);
        out.resize(hdr.width * hdr.height * 3, 0);
        let img = turbojpeg::Image {
            pixels: &mut out[..],
            width: hdr.width,
            pitch: hdr.width * 3,
            height: hdr.height,
            format: turbojpeg::PixelFormat::RGB,
        };
        tj.decompress(d, img).expect("turbojpeg");
        black_box(&out);
    }
}

fn pipeline(transform: Transform, output: Output) -> Task {
    Box::new(pipeline_with(transform, output, true))
}

fn pipeline_with(transform: Transform, output: Output, reduced_decode: bool) -> impl FnMut(&[u8]) {
    let spec = SampleSpec {
        transform,
        output,
        reduced_decode,
    };
    let mut p = Pipeline::new(spec).expect("spec");
    let mut sample = vec![0u8; spec.sample_bytes()];
    let mut id = 0;
    move |d| {
        id += 1;
        let key = SampleKey {
            seed: 1,
            epoch: 0,
            sample_id: id,
        };
        black_box(p.process(d, key, &mut sample).expect("process"));
    }
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// A `python3` child that times PIL on request: one line "TASK SECONDS" in, images/s out.
struct Pil {
    child: Option<(std::process::Child, BufReader<std::process::ChildStdout>)>,
}

impl Pil {
    fn start(files: &[PathBuf]) -> Pil {
        let child = Command::new("python3")
            .arg("-c")
            .arg(PIL_SCRIPT)
            .args(files)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn();
        match child {
            Ok(mut c) => {
                let out = BufReader::new(c.stdout.take().expect("child stdout"));
                Pil {
                    child: Some((c, out)),
                }
            }
            Err(e) => {
                eprintln!("cannot run python3: {e}; the PIL columns are NaN");
                Pil { child: None }
            }
        }
    }

    fn rate(&mut self, task: &str, secs: f64) -> f64 {
        let Some((child, out)) = self.child.as_mut() else {
            return f64::NAN;
        };
        let stdin = child.stdin.as_mut().expect("child stdin");
        if writeln!(stdin, "{task} {secs}")
            .and_then(|_| stdin.flush())
            .is_err()
        {
            return f64::NAN;
        }
        let mut line = String::new();
        match out.read_line(&mut line) {
            Ok(n) if n > 0 => line.trim().parse().unwrap_or(f64::NAN),
            _ => f64::NAN,
        }
    }
}
