//! File datasets end to end: `dataset.kind = "tokens"` and `"npy"` files written here, a daemon
//! with `--sink consumer` on the host backend, real loaders reading the files into the ring, and
//! a consumer in this process that takes every batch and compares every byte of every field with
//! what the files hold for the plan's sample ids, in order, each once. Bad per-sample files with
//! `dataset.on_bad_sample = "fail"` and `"skip"`. WebDataset shards on two ranks: each delivers
//! its shard order, and the ranks are disjoint and cover the dataset. WebDataset shards written
//! by Python (`tarfile`, `numpy.save`, Pillow's JPEG) whose `.npy` members are a declared field
//! (`[dataset.webdataset] npy`), with images and without (`images = false`), a wrong-shape member
//! skipped as zeros.

mod common;

use common::*;
use pinring_data::plan::mix64;
use pinring_data::shard_order::epoch_order_for;
use std::collections::HashSet;
use std::path::Path;

/// A `.npy` file (version 1.0) of `descr` and `shape` holding `data`.
fn npy_bytes(descr: &str, shape: &[u64], data: &[u8]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + dict.len() + 1) % 64 != 0 {
        dict.push(' ');
    }
    dict.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out.extend_from_slice(data);
    out
}

/// `n` pseudo-random bytes from `seed`.
fn bytes(seed: u64, n: usize) -> Vec<u8> {
    (0..n as u64)
        .map(|i| (mix64(seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15)) >> 24) as u8)
        .collect()
}

/// The tokens' window start of epoch `e` with `shift`: `mix64(seed ^ mix64(e ^ C)) % stride`.
fn offset(seed: u64, epoch: u32, stride: u64) -> u64 {
    mix64(seed ^ mix64(u64::from(epoch) ^ 0x746f_6b65_6e73_6f66)) % stride
}

/// Token files of `sizes` tokens of `token_bytes` bytes each (in a subdirectory, named
/// relatively in the config); returns the whole stream as u64 values.
fn token_files(dir: &Path, sizes: &[usize], token_bytes: usize, vocab: u64) -> Vec<u64> {
    std::fs::create_dir_all(dir.join("tok")).unwrap();
    let mut stream = Vec::new();
    for (k, &n) in sizes.iter().enumerate() {
        let mut raw = Vec::new();
        for i in 0..n {
            let t = mix64((k as u64) << 32 | i as u64) % vocab;
            raw.extend_from_slice(&t.to_le_bytes()[..token_bytes]);
            stream.push(t);
        }
        std::fs::write(dir.join(format!("tok/part-{k}.bin")), raw).unwrap();
    }
    stream
}

/// A tokens run: `seq_len`, `stride`, files of `sizes` tokens of `token_dtype`, fields of
/// `dtype`, shift on; every window checked against the stream.
#[allow(clippy::too_many_arguments)]
fn tokens_run(
    tag: &str,
    token_dtype: &str,
    dtype: &str,
    seq_len: u64,
    stride: u64,
    sizes: &[usize],
    slot_bytes: Option<u64>,
    loaders: usize,
) {
    let token_bytes = if token_dtype == "u16" { 2 } else { 4 };
    let vocab = if token_dtype == "u16" {
        50257
    } else {
        3_000_000_000
    };
    let seed = 11;
    let config = format!(
        "[ring]\nslots = 8\n{}[dataset]\nkind = \"tokens\"\n[dataset.tokens]\n\
         files = [\"tok/part-0.bin\", \"tok/part-1.bin\"]\ntoken_dtype = \"{token_dtype}\"\n\
         seq_len = {seq_len}\nstride = {stride}\nshift = true\ndtype = \"{dtype}\"\n\
         [plan]\nbatch_size = 8\nepochs = 2\nseed = {seed}\n[daemon]\nprefetch = 3\n",
        slot_bytes.map_or(String::new(), |b| format!("slot_bytes = {b}\n")),
    );
    let fx = Fixture::new(tag, &config);
    let stream = token_files(fx.dir.path(), sizes, token_bytes, vocab);
    let total = stream.len() as u64;
    let len = (total - (stride - 1) - (seq_len + 1)) / stride + 1;
    let expect = |epoch: u32, id: u64| {
        assert!(id < len, "sample {id} of {len}");
        let start = (offset(seed, epoch, stride) + id * stride) as usize;
        let window = &stream[start..start + seq_len as usize + 1];
        let enc = |ts: &[u64]| -> Vec<u8> {
            ts.iter()
                .flat_map(|&t| {
                    if dtype == "i64" {
                        (t as i64).to_le_bytes().to_vec()
                    } else {
                        (t as i32).to_le_bytes().to_vec()
                    }
                })
                .collect()
        };
        vec![enc(&window[..seq_len as usize]), enc(&window[1..])]
    };
    // Relative file names: resolved against the config file's directory, whatever the cwd.
    run_checked(&fx, loaders, &["input_ids", "targets"], &expect);
    let cfg = pinring_data::Config::load(&fx.config).unwrap();
    assert_eq!(cfg.dataset.samples, 0, "the length comes from the files");
}

#[test]
fn tokens_u16_across_two_files_shifted_in_parts() {
    // 512-token windows of i32 (2 KiB per field and sample): batches of 8 cut into parts of 2
    // samples in 12 KiB slots; windows span the two files.
    tokens_run(
        "files-tok16",
        "u16",
        "i32",
        512,
        512,
        &[9000, 7001],
        Some(12288),
        3,
    );
}

#[test]
fn tokens_u32_across_two_files_shifted_overlapping() {
    // Overlapping windows (stride < seq_len), u32 tokens up to 3e9 as i64.
    tokens_run("files-tok32", "u32", "i64", 33, 20, &[700, 555], None, 2);
}

/// 37 samples of 3x5 f32 with i32 labels, in one array (labels in 0..2^32, which a part's
/// metadata records: one outside is refused, `an_npy_label_out_of_range_stops_the_loader`).
#[test]
fn npy_one_array_with_labels() {
    let config = "[ring]\nslots = 8\n[dataset]\nkind = \"npy\"\n[dataset.npy]\n\
                  path = \"x.npy\"\nfield = \"x\"\ndtype = \"f32\"\nshape = [3, 5]\n\
                  labels = \"y.npy\"\nlabels_dtype = \"i32\"\n\
                  [plan]\nbatch_size = 6\nepochs = 2\n[daemon]\nprefetch = 3\n";
    let fx = Fixture::new("files-npy1", config);
    let n = 37usize;
    let x = bytes(1, n * 15 * 4);
    let y: Vec<u8> = (0..n as i32)
        .flat_map(|i| (i * 7 + 100).to_le_bytes())
        .collect();
    std::fs::write(
        fx.dir.path().join("x.npy"),
        npy_bytes("<f4", &[n as u64, 3, 5], &x),
    )
    .unwrap();
    std::fs::write(
        fx.dir.path().join("y.npy"),
        npy_bytes("<i4", &[n as u64], &y),
    )
    .unwrap();
    let expect = |_: u32, id: u64| {
        let i = id as usize;
        vec![
            x[i * 60..(i + 1) * 60].to_vec(),
            y[i * 4..(i + 1) * 4].to_vec(),
        ]
    };
    run_checked(&fx, 2, &["x", "labels"], &expect);
}

/// 7 samples of 3000 f32 (12000 bytes) with i32 labels in 8 KiB slots: no slot holds a sample,
/// so each is cut into byte parts (4096, 4096 and 3808 bytes, the label in the first), which the
/// loaders read with a `pread` each; batches of 2 are 6 parts, the last batch of an epoch one
/// sample and 3 empty parts.
#[test]
fn npy_samples_larger_than_a_slot_are_cut_into_byte_parts() {
    let config = "[ring]\nslots = 8\nslot_bytes = 8192\n[dataset]\nkind = \"npy\"\n[dataset.npy]\n\
                  path = \"x.npy\"\nfield = \"x\"\ndtype = \"f32\"\nshape = [3000]\n\
                  labels = \"y.npy\"\nlabels_dtype = \"i32\"\n\
                  [plan]\nbatch_size = 2\nepochs = 2\n[daemon]\nprefetch = 3\n";
    let fx = Fixture::new("files-npybytes", config);
    let n = 7usize;
    let x = bytes(3, n * 12000);
    let y: Vec<u8> = (0..n as i32)
        .flat_map(|i| (i * 3 + 1).to_le_bytes())
        .collect();
    std::fs::write(
        fx.dir.path().join("x.npy"),
        npy_bytes("<f4", &[n as u64, 3000], &x),
    )
    .unwrap();
    std::fs::write(
        fx.dir.path().join("y.npy"),
        npy_bytes("<i4", &[n as u64], &y),
    )
    .unwrap();
    let mut cfg = pinring_data::Config::load(&fx.config).unwrap();
    cfg.set_source_len(n as u64).unwrap();
    let layout = cfg.part_layout();
    assert_eq!(
        (layout.parts_per_batch, layout.cut.unwrap().chunk_bytes),
        (6, 4096)
    );
    let expect = |_: u32, id: u64| {
        let i = id as usize;
        vec![
            x[i * 12000..(i + 1) * 12000].to_vec(),
            y[i * 4..(i + 1) * 4].to_vec(),
        ]
    };
    run_checked(&fx, 3, &["x", "labels"], &expect);
    let s = fx.summary();
    assert_eq!(s.parts_per_batch, 6, "{s:#?}");
    assert_eq!(s.batches_delivered, 8, "{s:#?}");
}

/// Writes `n` per-sample files of 2x3 u16 into `dir/samples` (names sorted = sample order);
/// returns each sample's bytes.
fn per_sample_files(dir: &Path, n: usize) -> Vec<Vec<u8>> {
    let d = dir.join("samples");
    std::fs::create_dir_all(&d).unwrap();
    (0..n)
        .map(|k| {
            let data = bytes(100 + k as u64, 12);
            std::fs::write(
                d.join(format!("{k:04}.npy")),
                npy_bytes("<u2", &[2, 3], &data),
            )
            .unwrap();
            data
        })
        .collect()
}

fn dir_config(policy: Option<&str>, shuffle: bool) -> String {
    format!(
        "[ring]\nslots = 8\n[dataset]\nkind = \"npy\"\n{}[dataset.npy]\npath = \"samples\"\n\
         dtype = \"u16\"\nshape = [2, 3]\n[plan]\nbatch_size = 4\nepochs = 2\nshuffle = {shuffle}\n\
         [daemon]\nprefetch = 3\n",
        policy.map_or(String::new(), |p| format!("on_bad_sample = \"{p}\"\n"))
    )
}

#[test]
fn npy_directory_of_per_sample_files() {
    let fx = Fixture::new("files-npydir", &dir_config(None, true));
    let samples = per_sample_files(fx.dir.path(), 23);
    let expect = |_: u32, id: u64| vec![samples[id as usize].clone()];
    run_checked(&fx, 3, &["data"], &expect);
}

/// The labels rule (docs/FORMATS.md, "A part's labels"): an i32 label of -100 is outside the
/// metadata's u32 range, so the loader that makes its part commits it failed and exits 3, and
/// the daemon stops the run, both naming the sample, the label and the range.
#[test]
fn an_npy_label_out_of_range_stops_the_loader() {
    let config = "[ring]\nslots = 8\n[dataset]\nkind = \"npy\"\n[dataset.npy]\n\
                  path = \"x.npy\"\nfield = \"x\"\ndtype = \"f32\"\nshape = [4]\n\
                  labels = \"y.npy\"\nlabels_dtype = \"i32\"\n\
                  [plan]\nbatch_size = 4\nshuffle = false\nepochs = 1\n[daemon]\nprefetch = 2\n";
    let fx = Fixture::new("files-npylabel", config);
    let n = 8usize;
    std::fs::write(
        fx.dir.path().join("x.npy"),
        npy_bytes("<f4", &[n as u64, 4], &bytes(1, n * 16)),
    )
    .unwrap();
    let y: Vec<u8> = (0..n as i32)
        .flat_map(|i| if i == 5 { -100 } else { i }.to_le_bytes())
        .collect();
    std::fs::write(
        fx.dir.path().join("y.npy"),
        npy_bytes("<i4", &[n as u64], &y),
    )
    .unwrap();
    let mut daemon = fx.daemon(&["--sink", "consumer"]);
    fx.wait_ready(&mut daemon);
    let (status, log) = wait_for(fx.loader(&fx.config), "loader", LONG);
    assert_eq!(status.code(), Some(3), "{log}");
    let named = |log: &str| {
        log.contains("label -100 of sample 5") && log.contains("outside 0..=4294967295")
    };
    assert!(named(&log) && !log.contains("panicked"), "{log}");
    let (status, daemon_log) = wait_for(daemon, "daemon", LONG);
    assert_eq!(status.code(), Some(3), "{daemon_log}");
    assert!(named(&daemon_log), "{daemon_log}");
}

/// Per-sample file 0005.npy cut one byte short.
fn truncate_sample_5(dir: &Path) {
    let p = dir.join("samples/0005.npy");
    let len = std::fs::metadata(&p).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(len - 1)
        .unwrap();
}

#[test]
fn a_truncated_per_sample_file_stops_the_loader_with_fail() {
    let fx = Fixture::new("files-badfail", &dir_config(Some("fail"), false));
    per_sample_files(fx.dir.path(), 12);
    truncate_sample_5(fx.dir.path());
    // The daemon starts (one bad sample is not a bad dataset); the loader that reads sample 5
    // (batch 1 without shuffle) stops with exit 3, naming the file and the problem.
    let mut daemon = fx.daemon(&["--sink", "consumer"]);
    fx.wait_ready(&mut daemon);
    let (status, log) = wait_for(fx.loader(&fx.config), "loader", LONG);
    assert_eq!(status.code(), Some(3), "{log}");
    assert!(
        log.contains("0005.npy") && log.contains("truncated") && log.contains("sample 5"),
        "{log}"
    );
    assert!(!log.contains("panicked"), "{log}");
    // The part committed with the error stops the daemon with the loader's exit code and its
    // message (the file, the problem), and the summary keeps the resume point.
    let (status, daemon_log) = wait_for(daemon, "daemon", LONG);
    assert_eq!(status.code(), Some(3), "{daemon_log}");
    assert!(
        daemon_log.contains("0005.npy") && daemon_log.contains("sample 5"),
        "{daemon_log}"
    );
    assert!(daemon_log.contains("dataset.on_bad_sample"), "{daemon_log}");
    let s = fx.summary();
    assert_eq!(s.exit_code, 3, "{s:#?}");
    assert!(
        s.error.as_deref().unwrap_or("").contains("0005.npy"),
        "{s:#?}"
    );
    assert_eq!(s.resume_seq, s.start_seq + s.parts_delivered, "{s:#?}");
}

#[test]
fn a_truncated_per_sample_file_is_zeros_with_skip() {
    let fx = Fixture::new("files-badskip", &dir_config(Some("skip"), true));
    let samples = per_sample_files(fx.dir.path(), 12);
    truncate_sample_5(fx.dir.path());
    let expect = |_: u32, id: u64| {
        if id == 5 {
            vec![vec![0u8; 12]]
        } else {
            vec![samples[id as usize].clone()]
        }
    };
    let logs = run_checked(&fx, 2, &["data"], &expect);
    // Read once per epoch, by whichever loader: counted and logged, naming the sample and file.
    let counted = bad_samples_logged(&logs);
    assert_eq!(counted, 2, "{logs:#?}");
    // The ring counts them too, for `pinring status`, the metrics and the daemon's summary.
    assert_eq!(fx.summary().bad_samples_skipped, 2);
    let all = logs.concat();
    assert!(
        all.contains("sample 5 replaced by zeros") && all.contains("0005.npy"),
        "{all}"
    );
}

/// A small tokens config (relative file names) and its two files, in `fx`'s directory.
fn small_tokens(tag: &str, sizes: &[usize]) -> Fixture {
    let config = "[ring]\nslots = 4\n[dataset]\nkind = \"tokens\"\n[dataset.tokens]\n\
                  files = [\"tok/part-0.bin\", \"tok/part-1.bin\"]\nseq_len = 8\n\
                  [plan]\nbatch_size = 4\nepochs = 1\n";
    let fx = Fixture::new(tag, config);
    token_files(fx.dir.path(), sizes, 2, 1000);
    fx
}

#[test]
fn config_check_opens_the_files_and_shows_their_length() {
    let fx = small_tokens("files-check", &[50, 31]);
    let out = std::process::Command::new(exe(CLI))
        .args(["config", "check"])
        .arg(&fx.config)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    // 81 tokens, windows of 9 every 8: 10 samples.
    assert!(text.contains("samples = 10"), "{text}");
    assert!(
        text.contains("input_ids i64 [4, 8]") && text.contains("targets i64 [4, 8]"),
        "{text}"
    );
    // A missing file: exit 3, naming it.
    std::fs::remove_file(fx.dir.path().join("tok/part-1.bin")).unwrap();
    let out = std::process::Command::new(exe(CLI))
        .args(["config", "check"])
        .arg(&fx.config)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(3), "{text}");
    assert!(text.contains("part-1.bin"), "{text}");
}

#[test]
fn a_fifo_or_a_directory_as_a_token_file_is_refused_at_once_by_check_and_daemon() {
    let fx = small_tokens("files-fifo", &[50, 31]);
    let part = fx.dir.path().join("tok/part-1.bin");
    std::fs::remove_file(&part).unwrap();
    // A FIFO blocked a plain open() until a writer came, and only SIGKILL ended the wait.
    nix::unistd::mkfifo(&part, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let check = std::process::Command::new(exe(CLI))
        .args(["config", "check"])
        .arg(&fx.config)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (status, text) = wait_for(check, "config check", LONG);
    assert_eq!(status.code(), Some(3), "{text}");
    assert!(
        text.contains("part-1.bin") && text.contains("named pipe (FIFO), not a regular file"),
        "{text}"
    );
    let (status, log) = wait_for(fx.daemon(&["--sink", "consumer"]), "daemon", LONG);
    assert_eq!(status.code(), Some(3), "{log}");
    assert!(log.contains("named pipe (FIFO)"), "{log}");

    // A directory passed the check as 255 samples (its st_size, 4096 bytes) before.
    std::fs::remove_file(&part).unwrap();
    std::fs::create_dir(&part).unwrap();
    let check = std::process::Command::new(exe(CLI))
        .args(["config", "check"])
        .arg(&fx.config)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (status, text) = wait_for(check, "config check", LONG);
    assert_eq!(status.code(), Some(3), "{text}");
    assert!(
        text.contains("part-1.bin") && text.contains("a directory, not a regular file"),
        "{text}"
    );
}

#[test]
fn the_daemon_does_not_start_on_missing_files() {
    let fx = small_tokens("files-missing", &[50, 31]);
    std::fs::remove_file(fx.dir.path().join("tok/part-0.bin")).unwrap();
    let (status, log) = wait_for(fx.daemon(&["--sink", "consumer"]), "daemon", LONG);
    assert_eq!(status.code(), Some(3), "{log}");
    assert!(
        log.contains("part-0.bin") && log.contains("kind = \"tokens\""),
        "{log}"
    );
    assert!(!fx.segment().exists(), "no ring is made");
}

#[test]
fn the_verify_sink_refuses_file_kinds() {
    let fx = small_tokens("files-verify", &[50, 31]);
    let (status, log) = wait_for(fx.daemon(&[]), "daemon", LONG);
    assert_eq!(status.code(), Some(3), "{log}");
    assert!(
        log.contains("--sink verify") && log.contains("\"tokens\""),
        "{log}"
    );
}

#[test]
fn a_loader_whose_files_have_another_length_is_refused_naming_both() {
    let fx = small_tokens("files-len", &[50, 31]);
    // The same config next to shorter files: same fingerprint inputs but the length.
    let other = tempfile::tempdir().unwrap();
    let other_cfg = other.path().join("pinring.toml");
    std::fs::copy(&fx.config, &other_cfg).unwrap();
    token_files(other.path(), &[50, 20], 2, 1000);
    let mut daemon = fx.daemon(&["--sink", "consumer"]);
    fx.wait_ready(&mut daemon);
    let (status, log) = wait_for(fx.loader(&other_cfg), "loader", LONG);
    assert_eq!(status.code(), Some(8), "{log}");
    assert!(
        log.contains("10 samples") && log.contains("have 8"),
        "{log}"
    );
    signal(&daemon, nix::sys::signal::Signal::SIGTERM);
    let _ = wait_for(daemon, "daemon", LONG);
}

/// Tar shards `wds/shard-<i>.tar` of `sizes` samples each: sample `k` (ids in shard, then member
/// order) is an 8x8 PNG and the label `k`, so a delivered label names its sample.
fn labelled_shards(dir: &Path, sizes: &[u64]) {
    std::fs::create_dir_all(dir.join("wds")).unwrap();
    let mut k = 0u64;
    for (s, &n) in sizes.iter().enumerate() {
        let file = std::fs::File::create(dir.join(format!("wds/shard-{s}.tar"))).unwrap();
        let mut b = tar::Builder::new(file);
        for _ in 0..n {
            let mut image = Vec::new();
            {
                let mut enc = png::Encoder::new(&mut image, 8, 8);
                enc.set_color(png::ColorType::Rgb);
                enc.set_depth(png::BitDepth::Eight);
                let mut w = enc.write_header().unwrap();
                w.write_image_data(&bytes(k, 8 * 8 * 3)).unwrap();
            }
            let key = format!("s{k:04}");
            for (name, data) in [
                (format!("{key}.png"), image),
                (format!("{key}.cls"), k.to_string().into_bytes()),
            ] {
                let mut h = tar::Header::new_gnu();
                h.set_size(data.len() as u64);
                h.set_mode(0o644);
                h.set_cksum();
                b.append_data(&mut h, &name, data.as_slice()).unwrap();
            }
            k += 1;
        }
        b.into_inner().unwrap();
    }
}

/// Runs the daemon (`--sink consumer`) and two loaders on `fx` and returns the labels of every
/// batch taken, per epoch, in delivery order.
fn delivered_labels(fx: &Fixture, epochs: u32) -> Vec<Vec<u64>> {
    let mut daemon = fx.daemon(&["--sink", "consumer"]);
    let ring = fx.wait_ready(&mut daemon);
    let kids = loaders_attached(fx, &daemon, &ring, 2);
    let mut c =
        pinring_client::Consumer::attach(&fx.ring, &pinring_client::AttachOptions::default())
            .unwrap();
    let mut out = vec![Vec::new(); epochs as usize];
    while let Some(b) = c.next_batch(Some(LONG)).unwrap() {
        let labels = b.host_bytes("labels").unwrap();
        out[b.epoch as usize].extend(
            labels
                .chunks_exact(8)
                .map(|l| i64::from_le_bytes(l.try_into().unwrap()) as u64),
        );
    }
    drop(c);
    all_exit_cleanly(daemon, kids);
    out
}

#[test]
fn webdataset_ranks_deliver_their_shard_orders_disjoint_and_covering() {
    // Rank 0 of 2 has shards 0, 2, 4 (5 + 6 + 2 = 13 samples), rank 1 shards 1, 3 (3 + 4 = 7),
    // padded to 13 by repeating from the start of its own order.
    let sizes = [5u64, 3, 6, 4, 2];
    let total: u64 = sizes.iter().sum();
    let (seed, buffer, epochs) = (9u64, 4usize, 2u32);
    let mut firsts: Vec<Vec<u64>> = Vec::new();
    for rank in 0..2u32 {
        let config = format!(
            "[ring]\nslots = 4\n[dataset]\nkind = \"webdataset\"\n[dataset.webdataset]\n\
             shards = [\"wds/shard-0.tar\", \"wds/shard-1.tar\", \"wds/shard-2.tar\", \
             \"wds/shard-3.tar\", \"wds/shard-4.tar\"]\nshuffle_buffer = {buffer}\n\
             [dataset.image]\ntransform = \"eval\"\ncrop = 8\nresize = 8\n\
             [plan]\nbatch_size = 3\nepochs = {epochs}\nshuffle = true\nseed = {seed}\n\
             world_size = 2\nrank = {rank}\n"
        );
        let fx = Fixture::new(&format!("files-wds-r{rank}"), &config);
        labelled_shards(fx.dir.path(), &sizes);
        // config check reports the evened-out counts: 13 samples, 5 batches of 3, on both ranks.
        let out = std::process::Command::new(exe(CLI))
            .args(["config", "check"])
            .arg(&fx.config)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}");
        let held = if rank == 0 {
            "13 samples in 3"
        } else {
            "7 samples in 2"
        };
        for needle in [
            "# plan: 5 batches per epoch",
            &format!("rank {rank} of 2 holds {held} of the 5 shards"),
            "every rank delivers 13 samples per epoch",
        ] {
            assert!(text.contains(needle), "{text} lacks {needle:?}");
        }
        let got = delivered_labels(&fx, epochs);
        for (e, labels) in got.iter().enumerate() {
            let order = epoch_order_for(&sizes, seed, e as u32, rank, 2, buffer);
            let want: Vec<u64> = (0..13).map(|k| order[k % order.len()]).collect();
            assert_eq!(labels, &want, "rank {rank}, epoch {e}: the shard order");
        }
        assert_ne!(got[0], got[1], "the epochs are shuffled differently");
        firsts.push(got.into_iter().next().unwrap());
    }
    // Disjoint and covering (rank 1's padding repeats its own samples only).
    let r0: HashSet<u64> = firsts[0].iter().copied().collect();
    let r1: HashSet<u64> = firsts[1].iter().copied().collect();
    assert_eq!((r0.len(), r1.len()), (13, 7));
    assert!(r0.is_disjoint(&r1), "{r0:?} and {r1:?} share samples");
    assert_eq!(r0.len() + r1.len(), total as usize);
}

#[test]
fn webdataset_shards_given_as_a_glob_run_as_the_listed_shards() {
    // The daemon and each loader expand the glob themselves: the same sorted list, so the same
    // fingerprint, and the run delivers the shard order of the shards it matched.
    let sizes = [4u64, 3, 5];
    let (seed, buffer, epochs) = (3u64, 2usize, 2u32);
    let config = format!(
        "[ring]\nslots = 4\n[dataset]\nkind = \"webdataset\"\n[dataset.webdataset]\n\
         shards = \"wds/shard-*.tar\"\nshuffle_buffer = {buffer}\n\
         [dataset.image]\ntransform = \"eval\"\ncrop = 8\nresize = 8\n\
         [plan]\nbatch_size = 3\nepochs = {epochs}\nshuffle = true\nseed = {seed}\n"
    );
    let fx = Fixture::new("files-wds-glob", &config);
    labelled_shards(fx.dir.path(), &sizes);
    let got = delivered_labels(&fx, epochs);
    for (e, labels) in got.iter().enumerate() {
        let order = epoch_order_for(&sizes, seed, e as u32, 0, 1, buffer);
        assert_eq!(
            labels, &order,
            "epoch {e}: the shard order of the matched shards"
        );
    }
}

/// Writes `wds/shard-<i>.tar` of `sizes` samples with Python: sample `k` (the global position,
/// so its id) is `sample<k>.jpg` (an 8x8 JPEG, with `images`), `.cls` (`1000 + k`), `.npy` (a
/// float32 array of shape (4, 3) saved by `numpy.save`; sample `bad`'s transposed to (3, 4))
/// and `.json` (ignored). `features.bin` holds numpy's bytes of every sample's (4, 3) array, in
/// id order.
fn python_npy_shards(py: &str, dir: &Path, sizes: &[u64], bad: Option<u64>, images: bool) {
    let sizes: Vec<String> = sizes.iter().map(u64::to_string).collect();
    let bad = bad.map_or("-1".to_string(), |b| b.to_string());
    let dir = dir.display().to_string();
    let images = if images { "1" } else { "0" };
    run_python(
        py,
        r#"
import io, os, sys, tarfile
import numpy as np
from PIL import Image
d, sizes, bad, images = sys.argv[1], [int(x) for x in sys.argv[2].split(',')], int(sys.argv[3]), sys.argv[4] == '1'
rng = np.random.default_rng(7)
os.makedirs(os.path.join(d, 'wds'), exist_ok=True)
def add(t, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    t.addfile(info, io.BytesIO(data))
feats, k = [], 0
for s, n in enumerate(sizes):
    with tarfile.open(os.path.join(d, f'wds/shard-{s}.tar'), 'w') as t:
        for _ in range(n):
            key = f'sample{k:05d}'
            if images:
                b = io.BytesIO()
                Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(b, format='JPEG', quality=90)
                add(t, key + '.jpg', b.getvalue())
            add(t, key + '.cls', str(1000 + k).encode())
            arr = rng.standard_normal((4, 3)).astype(np.float32)
            feats.append(arr)
            b = io.BytesIO()
            np.save(b, np.ascontiguousarray(arr.T) if k == bad else arr)
            add(t, key + '.npy', b.getvalue())
            add(t, key + '.json', b'{"k": %d}' % k)
            k += 1
np.stack(feats).tofile(os.path.join(d, 'features.bin'))
"#,
        &[&dir, &sizes.join(","), &bad, images],
    );
}

/// The `.jpg` members of the shards `wds/shard-<i>.tar`, by sample id (`sample<k>.jpg`).
fn jpegs_of_shards(dir: &Path, shards: usize) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for s in 0..shards {
        let file = std::fs::File::open(dir.join(format!("wds/shard-{s}.tar"))).unwrap();
        for e in tar::Archive::new(file).entries().unwrap() {
            let mut e = e.unwrap();
            let path = e.path().unwrap().display().to_string();
            if let Some(k) = path
                .strip_prefix("sample")
                .and_then(|p| p.strip_suffix(".jpg"))
            {
                assert_eq!(
                    k.parse::<usize>().unwrap(),
                    out.len(),
                    "ids in member order"
                );
                let mut data = Vec::new();
                std::io::Read::read_to_end(&mut e, &mut data).unwrap();
                out.push(data);
            }
        }
    }
    out
}

const WDS_NPY_CONFIG: &str = "[ring]\nslots = 8\n[dataset]\nkind = \"webdataset\"\n\
     [dataset.webdataset]\nshards = [\"wds/shard-0.tar\", \"wds/shard-1.tar\"]\nshuffle_buffer = 4\n\
     npy = { field = \"features\", dtype = \"f32\", shape = [4, 3] }\n";

#[test]
fn webdataset_npy_members_reach_the_batch_as_numpy_wrote_them() {
    let Some(py) = python_numpy("webdataset_npy_members_reach_the_batch_as_numpy_wrote_them")
    else {
        return;
    };
    let config = format!(
        "{WDS_NPY_CONFIG}[dataset.image]\ntransform = \"eval\"\ncrop = 8\nresize = 8\n\
         [plan]\nbatch_size = 5\nepochs = 2\nshuffle = true\nseed = 3\n[daemon]\nprefetch = 3\n"
    );
    let fx = Fixture::new("files-wds-npy", &config);
    python_npy_shards(&py, fx.dir.path(), &[7, 6], None, true);
    let features = std::fs::read(fx.dir.path().join("features.bin")).unwrap();
    assert_eq!(features.len(), 13 * 48);
    let jpegs = jpegs_of_shards(fx.dir.path(), 2);
    assert_eq!(jpegs.len(), 13);
    let cfg = pinring_data::Config::load(&fx.config).unwrap();
    let spec = pinring_sources_spec(cfg.dataset.image.as_ref().unwrap());
    let pipeline = std::cell::RefCell::new(pinring_image::Pipeline::new(spec).unwrap());
    let expect = |epoch: u32, id: u64| {
        let i = id as usize;
        let mut image = vec![0u8; spec.sample_bytes()];
        let key = pinring_image::SampleKey {
            seed: cfg.plan.seed,
            epoch: u64::from(epoch),
            sample_id: id,
        };
        pipeline
            .borrow_mut()
            .process(&jpegs[i], key, &mut image)
            .unwrap();
        vec![
            image,
            (1000 + id as i64).to_le_bytes().to_vec(),
            features[i * 48..(i + 1) * 48].to_vec(),
        ]
    };
    run_checked(&fx, 2, &["images", "labels", "features"], &expect);
}

#[test]
fn webdataset_npy_features_only_with_a_wrong_shape_member_is_zeros_with_skip() {
    let Some(py) =
        python_numpy("webdataset_npy_features_only_with_a_wrong_shape_member_is_zeros_with_skip")
    else {
        return;
    };
    // No image member and no [dataset.image]: labels and features only.
    let config = WDS_NPY_CONFIG
        .replace("[dataset]\n", "[dataset]\non_bad_sample = \"skip\"\n")
        .replace("shards =", "images = false\nshards =")
        + "[plan]\nbatch_size = 4\nepochs = 2\nshuffle = true\nseed = 5\n[daemon]\nprefetch = 3\n";
    let fx = Fixture::new("files-wds-npy-skip", &config);
    python_npy_shards(&py, fx.dir.path(), &[5, 6], Some(3), false);
    let features = std::fs::read(fx.dir.path().join("features.bin")).unwrap();
    let expect = |_: u32, id: u64| {
        let i = id as usize;
        if id == 3 {
            return vec![vec![0u8; 8], vec![0u8; 48]];
        }
        vec![
            (1000 + id as i64).to_le_bytes().to_vec(),
            features[i * 48..(i + 1) * 48].to_vec(),
        ]
    };
    let logs = run_checked(&fx, 2, &["labels", "features"], &expect);
    // Read once per epoch, by whichever loader: counted, and logged naming the member, its
    // offset, the shape found and the shape expected.
    assert_eq!(bad_samples_logged(&logs), 2, "{logs:#?}");
    assert_eq!(fx.summary().bad_samples_skipped, 2);
    let all = logs.concat();
    for needle in [
        "sample 3 replaced by zeros",
        "shard-0.tar",
        "\"sample00003.npy\" at byte offset",
        "shape [3, 4], expected [4, 3]",
    ] {
        assert!(all.contains(needle), "{all} lacks {needle:?}");
    }
}
