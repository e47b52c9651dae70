//! Image datasets end to end: `dataset.kind = "imagefolder"` (a class directory per label) and
//! `"webdataset"` (two tar shards of `.jpg`/`.png` + `.cls` members) made of JPEG and PNG files
//! written here, a daemon with `--sink consumer` on the host backend, real loaders decoding and
//! transforming the images into the ring, and a consumer in this process that takes every batch
//! and compares each sample with what `pinring_image::Pipeline::process` makes in this process
//! for the same file bytes and key (bit for bit: same code, same key), the labels exactly, every
//! sample once per epoch, in the plan's order. A corrupt JPEG in a shard with
//! `dataset.on_bad_sample = "skip"` (zeros, counted) and `"fail"` (exit 3 naming the member).

mod common;

use common::*;
use pinring_image::{synth, Pipeline, SampleKey};
use std::cell::RefCell;
use std::collections::HashSet;
use std::path::Path;

/// One sample as written: its file bytes and label.
struct Sample {
    bytes: Vec<u8>,
    label: i64,
}

fn jpeg(w: u32, h: u32, seed: u64) -> Vec<u8> {
    let pixels = synth::photo(w, h, seed, 8);
    let mut buf = Vec::new();
    jpeg_encoder::Encoder::new(&mut buf, 90)
        .encode(&pixels, w as u16, h as u16, jpeg_encoder::ColorType::Rgb)
        .unwrap();
    buf
}

fn png(w: u32, h: u32, seed: u64) -> Vec<u8> {
    let pixels = synth::photo(w, h, seed, 8);
    let mut buf = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut buf, w, h);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut wr = enc.write_header().unwrap();
        wr.write_image_data(&pixels).unwrap();
    }
    buf
}

/// Image `k`: JPEG or PNG (every third one), of a size that varies with `k`.
fn image(k: u64) -> (Vec<u8>, &'static str) {
    let (w, h) = (40 + (k % 5) as u32 * 7, 30 + (k % 3) as u32 * 11);
    if k % 3 == 2 {
        (png(w, h, k), "png")
    } else {
        (jpeg(w, h, k), "jpg")
    }
}

/// `root/<class>/<name>` for 3 classes; returns the samples in ImageFolder's order (classes
/// sorted, files sorted by name).
fn image_folder(root: &Path, per_class: &[u64]) -> Vec<Sample> {
    let mut out = Vec::new();
    let mut k = 0;
    for (label, &n) in per_class.iter().enumerate() {
        let dir = root.join(format!("class-{label}"));
        std::fs::create_dir_all(&dir).unwrap();
        for i in 0..n {
            let (bytes, ext) = image(k);
            k += 1;
            std::fs::write(dir.join(format!("img-{i:03}.{ext}")), &bytes).unwrap();
            out.push(Sample {
                bytes,
                label: label as i64,
            });
        }
    }
    out
}

/// Tar shards `wds/shard-<i>.tar` of `sizes` samples each (`<key>.jpg|png` + `<key>.cls`);
/// returns the samples in shard then member order. `corrupt`: the sample whose image is cut
/// inside its JPEG headers.
fn shards(dir: &Path, sizes: &[u64], corrupt: Option<u64>) -> Vec<Sample> {
    std::fs::create_dir_all(dir.join("wds")).unwrap();
    let mut out = Vec::new();
    let mut k = 0;
    for (s, &n) in sizes.iter().enumerate() {
        let file = std::fs::File::create(dir.join(format!("wds/shard-{s}.tar"))).unwrap();
        let mut b = tar::Builder::new(file);
        for _ in 0..n {
            let (mut bytes, mut ext) = image(k);
            if corrupt == Some(k) {
                bytes = jpeg(40, 30, k)[..40].to_vec();
                ext = "jpg";
            }
            let label = (k * 7 % 5) as i64;
            let key = format!("sample{k:05}");
            for (name, data) in [
                (format!("{key}.{ext}"), bytes.clone()),
                (format!("{key}.cls"), label.to_string().into_bytes()),
            ] {
                let mut h = tar::Header::new_gnu();
                h.set_size(data.len() as u64);
                h.set_mode(0o644);
                h.set_cksum();
                b.append_data(&mut h, &name, data.as_slice()).unwrap();
            }
            out.push(Sample { bytes, label });
            k += 1;
        }
        b.into_inner().unwrap();
    }
    out
}

/// Runs the daemon and `loaders` loaders and checks every batch (`run_checked`): each sample's
/// image is what `Pipeline::process` makes here for its file bytes and key (zeros for `bad`),
/// its label exact, and every sample written is delivered. Returns the loaders' logs.
fn run_images(fx: &Fixture, loaders: usize, samples: &[Sample], bad: Option<u64>) -> Vec<String> {
    let cfg = pinring_data::Config::load(&fx.config).unwrap();
    let spec = pinring_sources_spec(cfg.dataset.image.as_ref().unwrap());
    let pipeline = RefCell::new(Pipeline::new(spec).unwrap());
    let delivered = RefCell::new(HashSet::new());
    let expect = |epoch: u32, id: u64| {
        delivered.borrow_mut().insert(id);
        let mut image = vec![0u8; spec.sample_bytes()];
        if bad == Some(id) {
            return vec![image, vec![0u8; 8]];
        }
        let s = &samples[id as usize];
        let key = SampleKey {
            seed: cfg.plan.seed,
            epoch: u64::from(epoch),
            sample_id: id,
        };
        pipeline
            .borrow_mut()
            .process(&s.bytes, key, &mut image)
            .unwrap();
        vec![image, s.label.to_le_bytes().to_vec()]
    };
    let logs = run_checked(fx, loaders, &["images", "labels"], &expect);
    assert_eq!(
        delivered.borrow().len(),
        samples.len(),
        "every sample written is delivered"
    );
    logs
}

#[test]
fn imagefolder_eval_u8() {
    let config = "[ring]\nslots = 4\n[dataset]\nkind = \"imagefolder\"\n\
                  [dataset.imagefolder]\nroot = \"train\"\n\
                  [dataset.image]\ntransform = \"eval\"\ncrop = 24\nresize = 28\n\
                  [plan]\nbatch_size = 4\nepochs = 2\nshuffle = true\nseed = 5\n";
    let fx = Fixture::new("img-folder", config);
    let samples = image_folder(&fx.dir.path().join("train"), &[4, 5, 3]);
    run_images(&fx, 2, &samples, None);
}

#[test]
fn webdataset_train_f32() {
    let config = "[ring]\nslots = 4\n[dataset]\nkind = \"webdataset\"\n\
                  [dataset.webdataset]\nshards = [\"wds/shard-0.tar\", \"wds/shard-1.tar\"]\n\
                  [dataset.image]\ntransform = \"train\"\ncrop = 16\noutput = \"f32\"\n\
                  [plan]\nbatch_size = 5\nepochs = 2\nshuffle = true\nseed = 11\n";
    let fx = Fixture::new("img-wds", config);
    let samples = shards(fx.dir.path(), &[7, 6], None);
    run_images(&fx, 2, &samples, None);
}

/// `[dataset.image] decode = "gpu"` on the host backend: the loaders write each JPEG's (and
/// PNG's) compressed bytes and drawn crop into the ring, and whoever copies the batch out
/// decodes them, on the CPU here: the pixels are the loaders' own, bit for bit, whether the
/// consumer's engine copies (the default) or the daemon's.
#[test]
fn webdataset_decoded_on_copy_is_the_cpu_path_bit_for_bit() {
    for (copies, output) in [("consumer", "bf16"), ("daemon", "u8")] {
        let config = format!(
            "[ring]\nslots = 4\n[daemon]\ncopies = \"{copies}\"\n[dataset]\nkind = \"webdataset\"\n\
             [dataset.webdataset]\nshards = [\"wds/shard-0.tar\", \"wds/shard-1.tar\"]\n\
             [dataset.image]\ntransform = \"train\"\ncrop = 16\noutput = \"{output}\"\n\
             decode = \"gpu\"\nencoded_bytes = \"96KiB\"\n\
             [plan]\nbatch_size = 5\nepochs = 2\nshuffle = true\nseed = 11\n"
        );
        let fx = Fixture::new(&format!("img-wds-gpu-{copies}"), &config);
        let samples = shards(fx.dir.path(), &[7, 6], None);
        run_images(&fx, 2, &samples, None);
    }
}

/// `decode = "auto"` resolves where the daemon starts (the GPU where its host can decode there,
/// else the loaders' CPU); loaders given the config file adopt the daemon's resolution from the
/// ring's fingerprint, and the pixels are the CPU path's either way on the host backend
/// (`encoded_bytes` is the budget if it resolves to the GPU, and goes if not).
#[test]
fn decode_auto_resolves_at_the_daemon_and_the_loaders_adopt_it() {
    let config = "[ring]\nslots = 4\n[dataset]\nkind = \"webdataset\"\n\
                  [dataset.webdataset]\nshards = [\"wds/shard-0.tar\", \"wds/shard-1.tar\"]\n\
                  [dataset.image]\ntransform = \"train\"\ncrop = 16\n\
                  decode = \"auto\"\nencoded_bytes = \"96KiB\"\n\
                  [plan]\nbatch_size = 5\nepochs = 1\nshuffle = true\nseed = 3\n";
    let fx = Fixture::new("img-wds-auto", config);
    let samples = shards(fx.dir.path(), &[7, 6], None);
    run_images(&fx, 2, &samples, None);
}

/// A JPEG larger than what its part's arena has left (`encoded_bytes` too small) stops the loader
/// with exit 3 naming the sample, its shard and member, and the setting to raise, whatever
/// `on_bad_sample` says (it is the config's limit, not a bad file); the daemon stops with it.
#[test]
fn a_jpeg_over_the_batch_budget_names_the_sample_and_encoded_bytes() {
    let config = "[ring]\nslots = 4\n[dataset]\nkind = \"webdataset\"\non_bad_sample = \"skip\"\n\
                  [dataset.webdataset]\nshards = [\"wds/shard-0.tar\"]\n\
                  [dataset.image]\ntransform = \"eval\"\ncrop = 16\nresize = 20\n\
                  decode = \"gpu\"\nencoded_bytes = \"3KiB\"\n\
                  [plan]\nbatch_size = 3\nepochs = 1\n";
    let fx = Fixture::new("img-budget", config);
    let wds = fx.dir.path().join("wds");
    std::fs::create_dir_all(&wds).unwrap();
    let file = std::fs::File::create(wds.join("shard-0.tar")).unwrap();
    let mut b = tar::Builder::new(file);
    for k in 0..3u64 {
        // Sample 1 is a 320 x 240 JPEG: tens of KiB, over the 3 KiB of its part.
        let bytes = if k == 1 {
            jpeg(320, 240, k)
        } else {
            jpeg(24, 20, k)
        };
        for (name, data) in [
            (format!("s{k}.jpg"), bytes),
            (format!("s{k}.cls"), b"1".to_vec()),
        ] {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, &name, data.as_slice()).unwrap();
        }
    }
    b.into_inner().unwrap();
    let mut daemon = fx.daemon(&["--sink", "consumer"]);
    fx.wait_ready(&mut daemon);
    let (status, log) = wait_for(fx.loader(&fx.config), "loader", LONG);
    assert_eq!(status.code(), Some(3), "{log}");
    assert!(
        log.contains("sample 1")
            && log.contains("shard-0.tar")
            && log.contains("s1.jpg")
            && log.contains("encoded_bytes"),
        "{log}"
    );
    let (status, daemon_log) = wait_for(daemon, "daemon", LONG);
    assert_eq!(status.code(), Some(3), "{daemon_log}");
    assert!(daemon_log.contains("encoded_bytes"), "{daemon_log}");
}

fn bad_shard_config(policy: &str) -> String {
    format!(
        "[ring]\nslots = 4\n[dataset]\nkind = \"webdataset\"\non_bad_sample = \"{policy}\"\n\
         [dataset.webdataset]\nshards = [\"wds/shard-0.tar\", \"wds/shard-1.tar\"]\n\
         [dataset.image]\ntransform = \"eval\"\ncrop = 16\nresize = 20\n\
         [plan]\nbatch_size = 3\nepochs = 2\n"
    )
}

#[test]
fn a_corrupt_jpeg_in_a_shard_is_zeros_with_skip() {
    let fx = Fixture::new("img-skip", &bad_shard_config("skip"));
    let samples = shards(fx.dir.path(), &[5, 4], Some(6));
    let logs = run_images(&fx, 2, &samples, Some(6));
    let counted = bad_samples_logged(&logs);
    assert_eq!(counted, 2, "once per epoch: {logs:#?}");
    // The ring counts them too, for `pinring status`, the metrics and the daemon's summary.
    assert_eq!(fx.summary().bad_samples_skipped, 2);
    let all = logs.concat();
    assert!(
        all.contains("sample 6 replaced by zeros")
            && all.contains("shard-1.tar")
            && all.contains("sample00006.jpg"),
        "{all}"
    );
}

#[test]
fn a_corrupt_jpeg_in_a_shard_stops_the_loader_with_fail() {
    let fx = Fixture::new("img-fail", &bad_shard_config("fail"));
    shards(fx.dir.path(), &[5, 4], Some(6));
    let mut daemon = fx.daemon(&["--sink", "consumer"]);
    fx.wait_ready(&mut daemon);
    let (status, log) = wait_for(fx.loader(&fx.config), "loader", LONG);
    assert_eq!(status.code(), Some(3), "{log}");
    assert!(
        log.contains("shard-1.tar")
            && log.contains("sample00006.jpg")
            && log.contains("byte offset")
            && log.contains("sample 6"),
        "{log}"
    );
    assert!(!log.contains("panicked"), "{log}");
    // The daemon stops on the failed part with the loader's code and message (file, member).
    let (status, daemon_log) = wait_for(daemon, "daemon", LONG);
    assert_eq!(status.code(), Some(3), "{daemon_log}");
    assert!(
        daemon_log.contains("shard-1.tar") && daemon_log.contains("sample00006.jpg"),
        "{daemon_log}"
    );
}
