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
    shards_with(dir, sizes, |k| {
        (corrupt == Some(k)).then(|| (jpeg(40, 30, k)[..40].to_vec(), "jpg"))
    })
}

/// [`shards`] with sample `k`'s file and extension from `replace(k)` where it gives one.
fn shards_with(
    dir: &Path,
    sizes: &[u64],
    replace: impl Fn(u64) -> Option<(Vec<u8>, &'static str)>,
) -> Vec<Sample> {
    std::fs::create_dir_all(dir.join("wds")).unwrap();
    let mut out = Vec::new();
    let mut k = 0;
    for (s, &n) in sizes.iter().enumerate() {
        let file = std::fs::File::create(dir.join(format!("wds/shard-{s}.tar"))).unwrap();
        let mut b = tar::Builder::new(file);
        for _ in 0..n {
            let (bytes, ext) = replace(k).unwrap_or_else(|| image(k));
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

/// What the CPU path makes of a sample: its image (`Pipeline::process` for its file bytes and
/// the plan's key) and its label's bytes, as the ring's fields carry them.
struct CpuPath {
    seed: u64,
    spec: pinring_image::SampleSpec,
    pipeline: RefCell<Pipeline>,
}

impl CpuPath {
    fn new(fx: &Fixture) -> CpuPath {
        let cfg = pinring_data::Config::load(&fx.config).unwrap();
        let spec = pinring_sources_spec(cfg.dataset.image.as_ref().unwrap());
        CpuPath {
            seed: cfg.plan.seed,
            spec,
            pipeline: RefCell::new(Pipeline::new(spec).unwrap()),
        }
    }

    /// Sample `id` (`s`) of `epoch`.
    fn sample(&self, s: &Sample, epoch: u32, id: u64) -> Vec<Vec<u8>> {
        let mut image = vec![0u8; self.spec.sample_bytes()];
        let key = SampleKey {
            seed: self.seed,
            epoch: u64::from(epoch),
            sample_id: id,
        };
        self.pipeline
            .borrow_mut()
            .process(&s.bytes, key, &mut image)
            .unwrap();
        vec![image, s.label.to_le_bytes().to_vec()]
    }

    /// A loader's substitute: zeros in every field.
    fn zeros(&self) -> Vec<Vec<u8>> {
        vec![vec![0u8; self.spec.sample_bytes()], vec![0u8; 8]]
    }
}

/// Runs the daemon and `loaders` loaders and checks every batch (`run_checked`): each sample's
/// image is what `Pipeline::process` makes here for its file bytes and key (zeros for `bad`),
/// its label exact, and every sample written is delivered. Returns the loaders' logs.
fn run_images(fx: &Fixture, loaders: usize, samples: &[Sample], bad: Option<u64>) -> Vec<String> {
    let cpu = CpuPath::new(fx);
    let delivered = RefCell::new(HashSet::new());
    let expect = |epoch: u32, id: u64| {
        delivered.borrow_mut().insert(id);
        if bad == Some(id) {
            return cpu.zeros();
        }
        cpu.sample(&samples[id as usize], epoch, id)
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

/// A shard whose sample `bad` is a PNG with intact headers and corrupt image data: the
/// loaders (decode = "gpu") read its headers and carry it, and it fails only where the batch
/// is copied and decoded.
fn shards_with_undecodable(dir: &Path, sizes: &[u64], bad: u64) -> Vec<Sample> {
    shards_with(dir, sizes, |k| {
        (k == bad).then(|| {
            let (mut bytes, ext) = image(k);
            assert_eq!(ext, "png", "sample {k} must be a PNG");
            let mid = bytes.len() / 2;
            bytes[mid..mid + 16].iter_mut().for_each(|b| *b ^= 0x5a);
            (bytes, "png")
        })
    })
}

fn decode_fault_config(policy: &str, copies: &str) -> String {
    format!(
        "[ring]\nslots = 4\n[daemon]\ncopies = \"{copies}\"\n[dataset]\nkind = \"webdataset\"\n\
         on_bad_sample = \"{policy}\"\n\
         [dataset.webdataset]\nshards = [\"wds/shard-0.tar\", \"wds/shard-1.tar\"]\n\
         [dataset.image]\ntransform = \"eval\"\ncrop = 16\nresize = 20\ndecode = \"gpu\"\n\
         encoded_bytes = \"96KiB\"\n[plan]\nbatch_size = 3\nepochs = 2\n"
    )
}

/// decode = "gpu", a file that fails only at the decoder, `on_bad_sample = "skip"`, the daemon
/// copying: zeros in its place, every other sample the CPU path's, and the daemon's summary
/// counts each image by the way it was decoded (the host engine: all on the CPU, the bad one
/// failed once an epoch).
#[test]
fn a_file_that_fails_at_the_decoder_is_zeros_with_skip_and_counted() {
    let fx = Fixture::new("img-dec-skip", &decode_fault_config("skip", "daemon"));
    let samples = shards_with_undecodable(fx.dir.path(), &[5, 4], 5);
    run_images(&fx, 2, &samples, Some(5));
    let s = fx.summary();
    let n = samples.len() as u64;
    assert_eq!(s.images_decoded.get("failed"), Some(&2), "{s:#?}");
    assert_eq!(s.images_decoded.get("cpu"), Some(&(2 * (n - 1))), "{s:#?}");
}

/// The same file with `on_bad_sample = "fail"`: the daemon that decodes it stops (exit 3)
/// naming the shard and the member's offset (sample 5 is shard 1's first member, whose data
/// follows its 512-byte tar header); a trainer's copier that decodes it fails the batch's wait with
/// the same names and the setting.
#[test]
fn a_file_that_fails_at_the_decoder_stops_the_run_with_fail() {
    for copies in ["daemon", "consumer"] {
        let fx = Fixture::new(
            &format!("img-dec-fail-{copies}"),
            &decode_fault_config("fail", copies),
        );
        shards_with_undecodable(fx.dir.path(), &[5, 4], 5);
        let mut daemon = fx.daemon(&["--sink", "consumer"]);
        let ring = fx.wait_ready(&mut daemon);
        let kids = loaders_attached(&fx, &daemon, &ring, 1);
        // A daemon that decodes may fail the run before this consumer attaches.
        let err = match pinring_client::Consumer::attach(
            &fx.ring,
            &pinring_client::AttachOptions::default(),
        ) {
            Err(e) => e.to_string(),
            Ok(mut c) => loop {
                match c.next_batch(Some(LONG)) {
                    Ok(Some(_)) => continue,
                    Ok(None) => panic!("{copies}: the run ended without the decode failure"),
                    Err(e) => break e.to_string(),
                }
            },
        };
        assert!(
            copies == "daemon" || err.contains("did not decode"),
            "{copies}: {err}"
        );
        if copies == "consumer" {
            let _ = daemon.kill();
        }
        let (status, log) = wait_for(daemon, "daemon", LONG);
        if copies == "daemon" {
            assert_eq!(status.code(), Some(3), "{log}");
            assert!(log.contains("shard-1.tar, member at byte 512"), "{log}");
        } else {
            assert!(
                err.contains("shard-1.tar, member at byte 512") && err.contains("on_bad_sample"),
                "{err}"
            );
        }
        for k in kids {
            let _ = wait_for(k, "loader", LONG);
        }
    }
}

/// A daemon that decodes serves its counts per way on /metrics while the run goes on.
#[test]
fn a_daemon_that_decodes_serves_its_counts_on_metrics() {
    let fx = Fixture::new("img-dec-metrics", &decode_fault_config("skip", "daemon"));
    shards(fx.dir.path(), &[5, 4], None);
    let listen = free_local_addr();
    let mut daemon = fx.daemon(&["--sink", "consumer", "--metrics-listen", &listen]);
    let ring = fx.wait_ready(&mut daemon);
    let kids = loaders_attached(&fx, &daemon, &ring, 1);
    let mut c =
        pinring_client::Consumer::attach(&fx.ring, &pinring_client::AttachOptions::default())
            .unwrap();
    for _ in 0..2 {
        c.next_batch(Some(LONG)).unwrap().unwrap();
    }
    let metrics = http_get(&listen, "/metrics");
    let cpu = format!(
        "pinring_images_decoded_total{{ring=\"{}\",way=\"cpu\"}} ",
        fx.ring
    );
    let line = metrics
        .lines()
        .find(|l| l.starts_with(&cpu))
        .unwrap_or_else(|| panic!("no {cpu} in:\n{metrics}"));
    let n: u64 = line[cpu.len()..].parse().unwrap();
    assert!(n >= 6, "two batches of 3 decoded at least: {line}");
    let failed = format!(
        "pinring_images_decoded_total{{ring=\"{}\",way=\"failed\"}} 0",
        fx.ring
    );
    assert!(metrics.contains(&failed), "{metrics}");
    while c.next_batch(Some(LONG)).unwrap().is_some() {}
    drop(c);
    let (status, log) = wait_for(daemon, "daemon", LONG);
    assert!(status.success(), "{log}");
    for k in kids {
        let _ = wait_for(k, "loader", LONG);
    }
}

/// A ring of `epochs` epochs of the two shards (13 samples: 3 batches an epoch) whose images the
/// trainer's copier decodes (decode = "gpu", daemon.copies = "consumer").
fn copier_decodes(epochs: u32, seed: u64) -> String {
    format!(
        "[ring]\nslots = 4\n[daemon]\ncopies = \"consumer\"\n[dataset]\nkind = \"webdataset\"\n\
         [dataset.webdataset]\nshards = [\"wds/shard-0.tar\", \"wds/shard-1.tar\"]\n\
         [dataset.image]\ntransform = \"train\"\ncrop = 16\ndecode = \"gpu\"\n\
         encoded_bytes = \"96KiB\"\n\
         [plan]\nbatch_size = 5\nepochs = {epochs}\nshuffle = true\nseed = {seed}\n"
    )
}

/// decode = "gpu" while loaders are SIGKILLed and replaced mid-run: every batch the consumer
/// (the trainer's copier, decoding) takes is the CPU path's, in order, each sample once an
/// epoch (`consume_checked`), as the hostile rounds proved for pixels.
#[test]
fn sigkilled_loaders_lose_and_repeat_no_encoded_image() {
    let fx = Fixture::new("img-wds-gpu-kill", &copier_decodes(100, 11));
    let samples = shards(fx.dir.path(), &[7, 6], None);
    let cpu = CpuPath::new(&fx);
    let expect = |epoch: u32, id: u64| cpu.sample(&samples[id as usize], epoch, id);
    let mut daemon = fx.daemon(&["--sink", "consumer"]);
    let ring = fx.wait_ready(&mut daemon);
    let loaders: Vec<std::process::Child> = (0..3).map(|_| fx.loader(&fx.config)).collect();
    for l in &loaders {
        wait_attached(&ring, l);
    }
    let done = std::sync::atomic::AtomicBool::new(false);
    let kills = std::thread::scope(|s| {
        let killer = s.spawn(|| {
            let mut loaders = loaders;
            let mut kills = 0;
            // A kill after every few deliveries, while the run lasts.
            while kills < 12 {
                let target = delivered(&ring) + 3;
                wait_until("deliveries or the end", LONG, || {
                    delivered(&ring) >= target || done.load(std::sync::atomic::Ordering::Relaxed)
                });
                if done.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                let i = kills % loaders.len();
                loaders[i].kill().unwrap();
                loaders[i].wait().unwrap();
                loaders[i] = fx.loader(&fx.config);
                kills += 1;
            }
            (kills, loaders)
        });
        let taken = consume_checked(&fx, &["images", "labels"], &expect);
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        let (kills, loaders) = killer.join().unwrap();
        assert_eq!(
            taken,
            100 * 3,
            "every batch of 100 epochs (13 samples: 3 batches each)"
        );
        for l in loaders {
            let _ = wait_for(l, "loader", LONG);
        }
        kills
    });
    assert!(kills >= 3, "loaders were killed mid-run: {kills}");
    let (status, log) = wait_for(daemon, "daemon", LONG);
    assert!(status.success(), "{log}");
    let s = fx.summary();
    assert_eq!(
        (s.duplicates, s.out_of_order, s.missing),
        (0, 0, 0),
        "{s:#?}"
    );
}

/// decode = "gpu" and the trainer's copier decoding: a trainer SIGKILLed while it holds
/// batches is replaced, and the new one resumes right after the batches the dead one took, each
/// the CPU path's, in order; the daemon's books show nothing lost or repeated.
#[test]
fn a_killed_trainer_that_decodes_is_replaced_and_nothing_is_lost_or_repeated() {
    let fx = Fixture::new("img-wds-gpu-trainer", &copier_decodes(200, 4));
    let samples = shards(fx.dir.path(), &[7, 6], None);
    let cpu = CpuPath::new(&fx);
    let expect = |epoch: u32, id: u64| cpu.sample(&samples[id as usize], epoch, id);
    let mut daemon = fx.daemon(&["--sink", "consumer"]);
    let ring = fx.wait_ready(&mut daemon);
    let kids = loaders_attached(&fx, &daemon, &ring, 2);
    let taken = || {
        ring.handoff()
            .taken
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let victim = std::process::Command::new(exe(CLI))
        .args([
            "consume",
            "--ring",
            &fx.ring,
            "--hold",
            "2",
            "--timeout-secs",
            "60",
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_until("the trainer takes batches", LONG, || taken() >= 5);
    signal(&victim, nix::sys::signal::Signal::SIGKILL);
    let _ = victim.wait_with_output();
    let before = taken();
    // The replacement resumes right after the dead trainer's takes; each batch is the CPU
    // path's, in order.
    let mut c =
        pinring_client::Consumer::attach(&fx.ring, &pinring_client::AttachOptions::default())
            .unwrap();
    assert_eq!(
        c.state().seq,
        before,
        "one seq per batch here: resume after the takes"
    );
    let mut plan = c.config().plan().unwrap();
    let mut ids = Vec::new();
    let mut after = 0;
    loop {
        let seq = c.state().seq;
        let Some(b) = c.next_batch(Some(LONG)).unwrap() else {
            break;
        };
        assert_eq!(b.seq, seq, "in order, none skipped");
        plan.batch_into(b.batch, &mut ids).unwrap();
        for (k, name) in ["images", "labels"].into_iter().enumerate() {
            let want: Vec<u8> = ids
                .iter()
                .flat_map(|&id| expect(b.epoch, id).swap_remove(k))
                .collect();
            assert!(
                b.host_bytes(name).unwrap() == want.as_slice(),
                "batch {} {name}",
                b.batch
            );
        }
        after += 1;
    }
    drop(c);
    // 200 epochs of 3 batches: long enough that the kill lands mid-run.
    assert!(before < 200 * 3, "the kill landed before the end");
    assert_eq!(
        before + after,
        200 * 3,
        "the two trainers took every batch once"
    );
    let (status, log) = wait_for(daemon, "daemon", LONG);
    assert!(status.success(), "{log}");
    let s = fx.summary();
    assert_eq!(
        (s.duplicates, s.out_of_order, s.missing),
        (0, 0, 0),
        "{s:#?}"
    );
    for k in kids {
        let _ = wait_for(k, "loader", LONG);
    }
}
