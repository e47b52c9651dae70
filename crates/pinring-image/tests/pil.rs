//! Cross-check against PIL: decode output and the resampled crop, within tolerance.
//! Runs where `$PINRING_TEST_PYTHON` (default `python3`) imports PIL; otherwise prints why and
//! passes, unless `PINRING_TEST_PYTHON` is set (scripts/test sets it): then it is required.

use std::io::Write;
use std::process::{Command, Stdio};

use jpeg_encoder::{ColorType, Encoder, SamplingFactor};
use pinring_image::{synth, Decoder, Output, Pipeline, SampleKey, SampleSpec, Transform};

const SCRIPT: &str = r#"
import io, sys
from PIL import Image
img = Image.open(io.BytesIO(sys.stdin.buffer.read())).convert("RGB")
if len(sys.argv) > 1:
    l, t, w, h = map(float, sys.argv[1:5])
    img = img.resize((int(sys.argv[5]), int(sys.argv[5])), Image.BILINEAR, box=(l, t, l + w, t + h))
    if sys.argv[6] == "1":
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
sys.stdout.buffer.write(img.tobytes())
"#;

/// The interpreter: `PINRING_TEST_PYTHON` (scripts/test names its venv's, which has Pillow),
/// else `python3`.
fn python() -> String {
    std::env::var("PINRING_TEST_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn have_pil() -> bool {
    let ok = Command::new(python())
        .args(["-c", "import PIL"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    // An interpreter named on purpose must have Pillow: the comparison is then required.
    assert!(
        ok || std::env::var_os("PINRING_TEST_PYTHON").is_none(),
        "PINRING_TEST_PYTHON={} cannot import PIL",
        python()
    );
    if !ok {
        println!("skipped: {} with PIL is not available", python());
    }
    ok
}

fn pil(file: &[u8], args: &[String]) -> Vec<u8> {
    let mut child = Command::new(python())
        .arg("-c")
        .arg(SCRIPT)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run python3");
    child.stdin.take().unwrap().write_all(file).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "PIL failed");
    out.stdout
}

fn jpeg(w: u32, h: u32) -> Vec<u8> {
    let rgb = synth::photo(w, h, 11, 6);
    let mut buf = Vec::new();
    let mut enc = Encoder::new(&mut buf, 90);
    enc.set_sampling_factor(SamplingFactor::F_2_2);
    enc.encode(&rgb, w as u16, h as u16, ColorType::Rgb)
        .unwrap();
    buf
}

fn mae(a: &[u8], b: &[u8]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| x.abs_diff(*y) as f64)
        .sum::<f64>()
        / a.len() as f64
}

/// zune-jpeg and libjpeg-turbo (inside PIL) differ in IDCT and chroma upsampling rounding:
/// mean absolute difference below 0.75 levels (0.24 measured).
#[test]
fn decode_matches_pil() {
    if !have_pil() {
        return;
    }
    let file = jpeg(500, 375);
    let mut d = Decoder::new();
    let ours = d.decode(&file, 1).unwrap().rgb.to_vec();
    let theirs = pil(&file, &[]);
    let e = mae(&ours, &theirs);
    println!("decode: mean abs difference to PIL {e:.3}");
    assert!(e < 0.75, "{e}");
}

/// The same crop box resampled by PIL's `resize(BILINEAR, box=...)` and by the pipeline:
/// mean absolute difference below 1 level (0.3 measured: decoder difference plus resampler
/// rounding).
#[test]
fn crops_match_pil() {
    if !have_pil() {
        return;
    }
    let file = jpeg(500, 375);
    for (transform, id) in [
        (Transform::EVAL_DEFAULT, 0),
        (Transform::TRAIN_DEFAULT, 1),
        (Transform::TRAIN_DEFAULT, 2),
        (Transform::TRAIN_DEFAULT, 3),
        (Transform::TRAIN_DEFAULT, 4),
    ] {
        let spec = SampleSpec {
            transform,
            output: Output::U8Hwc,
            reduced_decode: true,
        };
        let mut p = Pipeline::new(spec).unwrap();
        let mut ours = vec![0u8; spec.sample_bytes()];
        let a = p
            .process(
                &file,
                SampleKey {
                    seed: 5,
                    epoch: 0,
                    sample_id: id,
                },
                &mut ours,
            )
            .unwrap();
        let c = a.crop;
        let args: Vec<String> = [c.left, c.top, c.width, c.height]
            .iter()
            .map(|v| format!("{v:.17}"))
            .chain([transform.crop().to_string(), (a.flipped as u8).to_string()])
            .collect();
        let theirs = pil(&file, &args);
        let e = mae(&ours, &theirs);
        println!(
            "{transform:?} id {id}: box {c:?} flipped {}: mean abs difference to PIL {e:.3}",
            a.flipped
        );
        assert!(e < 1.0, "{e}");
    }
}
