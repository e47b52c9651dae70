//! Helpers for tests that spawn the real binaries: unique ring names, small configs, bounded
//! waits for child processes.

#![allow(dead_code)]

use pinring_daemon::summary::Summary;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

pub const DAEMON: &str = env!("CARGO_BIN_EXE_pinring-daemon");
pub const LOADER: &str = env!("CARGO_BIN_EXE_pinring-loader");
pub const CLI: &str = env!("CARGO_BIN_EXE_pinring");

/// A binary of this package: from `$PINRING_BIN_DIR` when set (test executables copied to a GPU
/// host together with the release binaries), else the one cargo built for this test.
pub fn exe(built: &'static str) -> PathBuf {
    match std::env::var_os("PINRING_BIN_DIR") {
        Some(dir) => Path::new(&dir).join(Path::new(built).file_name().unwrap_or_default()),
        None => PathBuf::from(built),
    }
}

/// `pinring ARGS`, its output piped (read it with [`wait_for`]).
pub fn cli(args: &[&str]) -> Child {
    Command::new(exe(CLI))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// A test's private ring name, config file and scratch dir; removes the segment at the end.
pub struct Fixture {
    pub ring: String,
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
}

impl Fixture {
    /// `tag` must be unique per test. `extra` is TOML appended to a small synthetic config.
    pub fn new(tag: &str, toml: &str) -> Fixture {
        let ring = format!("it-{tag}-{}", std::process::id());
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("pinring.toml");
        std::fs::write(&config, toml).unwrap();
        Fixture { ring, dir, config }
    }

    pub fn small(tag: &str) -> Fixture {
        Fixture::new(tag, SMALL)
    }

    pub fn summary_path(&self) -> PathBuf {
        self.dir.path().join("summary.json")
    }

    pub fn segment(&self) -> PathBuf {
        pinring_ring::object_path(&self.ring)
    }

    /// The daemon on the host backend with the verify sink (unless `extra` names a sink).
    pub fn daemon(&self, extra: &[&str]) -> Child {
        self.daemon_on("host", extra)
    }

    /// The daemon on `backend` with the verify sink (unless `extra` names a sink).
    pub fn daemon_on(&self, backend: &str, extra: &[&str]) -> Child {
        self.daemon_env(backend, extra, &[])
    }

    /// [`Fixture::daemon_on`] with `env` added to the daemon's environment.
    pub fn daemon_env(&self, backend: &str, extra: &[&str], env: &[(&str, &str)]) -> Child {
        let sink: &[&str] = if extra.contains(&"--sink") {
            &[]
        } else {
            &["--sink", "verify"]
        };
        Command::new(exe(DAEMON))
            .envs(env.iter().copied())
            .args(["--ring", &self.ring, "--backend", backend])
            .args(sink)
            .arg("--config")
            .arg(&self.config)
            .arg("--summary")
            .arg(self.summary_path())
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    pub fn loader(&self, config: &Path) -> Child {
        self.loader_with(config, &[])
    }

    pub fn loader_with(&self, config: &Path, extra: &[&str]) -> Child {
        Command::new(exe(LOADER))
            .args(["--ring", &self.ring, "--wait-secs", "20"])
            .arg("--config")
            .arg(config)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// Waits until the ring of `daemon` (not a stale one of the same name) is READY; fails with
    /// the daemon's output if it exits first.
    pub fn wait_ready(&self, daemon: &mut Child) -> pinring_ring::Ring {
        let start = Instant::now();
        loop {
            if let Some(status) = daemon.try_wait().unwrap() {
                let mut err = String::new();
                if let Some(mut e) = daemon.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut err);
                }
                panic!("the daemon exited ({status}) before its ring was ready:\n{err}");
            }
            let attached = pinring_ring::attach(
                &self.ring,
                pinring_ring::Access::ReadOnly,
                Duration::from_millis(200),
            );
            if let Ok(ring) = attached {
                if ring.daemon().pid == daemon.id() {
                    return ring;
                }
            }
            assert!(start.elapsed() < LONG, "daemon never made its ring");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The daemon as [`Fixture::daemon`], logging at debug level (a line per delivered batch,
    /// read back with [`delivered_seqs`]) into the file `log`: a pipe would fill and stall a
    /// long run.
    pub fn daemon_logged(&self, extra: &[&str], log: &Path) -> Child {
        Command::new(exe(DAEMON))
            .args([
                "--ring",
                &self.ring,
                "--backend",
                "host",
                "--sink",
                "verify",
            ])
            .args(["--log-level", "debug"])
            .arg("--config")
            .arg(&self.config)
            .arg("--summary")
            .arg(self.summary_path())
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap()
    }

    pub fn summary(&self) -> Summary {
        Summary::read(&self.summary_path()).expect("summary written")
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = pinring_ring::Segment::unlink(&self.ring);
    }
}

/// 512 samples of 64x64 f32 (16 KiB), batches of 8 (128 KiB): 64 batches per epoch.
pub const SMALL: &str = r#"
[ring]
slots = 8
[dataset]
samples = 512
sample_shape = [64, 64]
dtype = "f32"
seed = 7
[plan]
batch_size = 8
epochs = 2
"#;

/// Waits for a child with a deadline; kills it (and fails) if it does not exit.
pub fn wait_for(child: Child, what: &str, limit: Duration) -> (ExitStatus, String) {
    let mut child = child;
    let start = Instant::now();
    loop {
        if let Some(_status) = child.try_wait().unwrap() {
            let out: Output = child.wait_with_output().unwrap();
            let text = String::from_utf8_lossy(&out.stderr).to_string()
                + &String::from_utf8_lossy(&out.stdout);
            return (out.status, text);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{what} did not exit within {limit:?}; output:\n{}{}",
                String::from_utf8_lossy(&out.stderr),
                String::from_utf8_lossy(&out.stdout)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits for the daemon, then every loader, each to exit 0 within [`LONG`] (a failure shows
/// the process's output); returns the daemon's output.
pub fn all_exit_cleanly(daemon: Child, loaders: Vec<Child>) -> String {
    let (status, log) = wait_for(daemon, "daemon", LONG);
    assert!(status.success(), "daemon failed: {status}\n{log}");
    loaders_exit_cleanly(loaders);
    log
}

/// Waits for every loader to exit 0 within [`LONG`] (a failure shows the loader's output).
pub fn loaders_exit_cleanly(loaders: Vec<Child>) {
    for l in loaders {
        let (st, out) = wait_for(l, "loader", LONG);
        assert!(st.success(), "loader failed: {st}\n{out}");
    }
}

pub fn signal(child: &Child, sig: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), sig).unwrap();
}

pub const LONG: Duration = Duration::from_secs(90);

/// `toml` (a config with a `[ring]` table) with its slots set to `slot_bytes`: the same dataset
/// and plan, cut into parts of that size.
pub fn in_slots_of(toml: &str, slot_bytes: u64) -> String {
    assert!(toml.contains("[ring]\n"), "the config needs a [ring] table");
    toml.replacen(
        "[ring]\n",
        &format!("[ring]\nslot_bytes = {slot_bytes}\n"),
        1,
    )
}

/// [`SMALL`] with batches that span 4 slots: batches of 8 samples of 16 KiB (128 KiB) in 40 KiB
/// slots, each holding a part of 2 samples with its metadata; 64 batches per epoch, 256 seqs.
pub fn spanning() -> String {
    in_slots_of(SMALL, 40960)
}

/// Asserts a verify run delivered every batch exactly once with every byte right: every seq
/// (part) of the plan delivered once, with its batch, and every batch verified whole.
pub fn assert_complete(s: &Summary, in_order: bool) {
    let parts = s.end_seq - s.start_seq;
    let per_batch = s.parts_per_batch.max(1);
    assert_eq!(parts % per_batch, 0, "{s:#?}");
    let total = parts / per_batch;
    assert_eq!(s.parts_delivered, parts, "{s:#?}");
    assert_eq!(s.batches_delivered, total, "{s:#?}");
    assert_eq!(s.batches_verified, total, "{s:#?}");
    assert_eq!(s.verify_failures, 0, "{s:#?}");
    assert_eq!(s.duplicates, 0, "{s:#?}");
    assert_eq!(s.out_of_order, 0, "{s:#?}");
    assert_eq!(s.missing, 0, "{s:#?}");
    assert_eq!(s.in_order, in_order);
    assert!(s.bytes > 0);
}

/// A small deterministic PRNG for tests (xorshift64*), seeded from the clock and pid so runs
/// differ; the seed is printed so a failure can be replayed.
pub struct Rng(u64);

impl Rng {
    pub fn from_env(what: &str) -> Rng {
        let seed = std::env::var("PINRING_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
                    ^ u64::from(std::process::id()) << 32
            });
        eprintln!("{what}: PINRING_TEST_SEED={seed}");
        Rng(seed | 1)
    }

    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `lo..hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo)
    }
}

/// Waits until `f` is true, polling, with a deadline.
pub fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Batches delivered so far, from a ring's header.
pub fn delivered(ring: &pinring_ring::Ring) -> u64 {
    ring.header()
        .delivered
        .load(std::sync::atomic::Ordering::Relaxed)
}

/// Asserts a verify run stopped by SIGTERM drained cleanly: every seq from the start up to the
/// summary's `resume_seq` delivered exactly once, in order, every byte verified; the rest of the
/// plan counted missing, which a drain is allowed.
pub fn assert_drained(s: &Summary) {
    assert!(s.interrupted, "the run ended before the drain: {s:#?}");
    assert!(s.in_order, "{s:#?}");
    assert_eq!((s.exit_code, s.error.as_deref()), (0, None), "{s:#?}");
    let prefix = s.resume_seq - s.start_seq;
    assert!(prefix > 0, "nothing delivered: {s:#?}");
    // In order, with no duplicate and nothing out of order, `prefix` deliveries are exactly the
    // seqs start..resume: the sink's count and the header's next_deliver agree. Seqs are parts,
    // delivered with their batches, so the resume point is a batch's first part.
    let per_batch = s.parts_per_batch.max(1);
    assert_eq!(prefix % per_batch, 0, "{s:#?}");
    assert_eq!(s.parts_delivered, prefix, "{s:#?}");
    assert_eq!(s.batches_delivered, prefix / per_batch, "{s:#?}");
    assert_eq!(s.batches_verified, prefix / per_batch, "{s:#?}");
    assert_eq!(s.verify_failures, 0, "{s:#?}");
    assert_eq!(s.duplicates, 0, "{s:#?}");
    assert_eq!(s.out_of_order, 0, "{s:#?}");
    assert_eq!(s.missing, s.end_seq - s.resume_seq, "{s:#?}");
}

/// A child stopped with SIGSTOP, resumed (SIGCONT) when dropped, so a failing test never leaves
/// a stopped process behind.
pub struct Paused(u32);

impl Paused {
    /// Stops `child` and waits until every one of its threads is stopped (the signal is
    /// delivered asynchronously: until then it may still run).
    pub fn new(child: &Child) -> Paused {
        signal(child, nix::sys::signal::Signal::SIGSTOP);
        let pid = child.id();
        wait_until("the process to stop", LONG, || all_threads_stopped(pid));
        Paused(pid)
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0 as i32),
            nix::sys::signal::Signal::SIGCONT,
        );
    }
}

/// Whether every thread of `pid` is stopped (state `T`), from /proc.
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|t| {
        std::fs::read_to_string(t.path().join("stat"))
            .ok()
            .and_then(|text| pinring_ring::process::parse_stat(&text))
            .is_some_and(|s| s.state == 'T')
    })
}

/// The loader-table index of the attached loader `pid`.
pub fn loader_index(ring: &pinring_ring::Ring, pid: u32) -> Option<usize> {
    ring.loaders()
        .into_iter()
        .find(|l| l.pid == pid)
        .map(|l| l.index)
}

/// The slot (and its seq) that loader `pid` holds CLAIMED: the slot word names its loader-table
/// entry and a tenure whose lock is held. A dead predecessor in the same entry may have left a
/// claim the daemon has not reclaimed yet; its tenure lock is free, so it is not this loader's.
/// Stable only while that loader is stopped: a running one may commit at any moment.
pub fn claim_of(ring: &pinring_ring::Ring, pid: u32) -> Option<(u32, u64)> {
    let index = loader_index(ring, pid)?;
    (0..ring.geometry().slot_count).find_map(|i| {
        let w = ring.word(i);
        let mine = w.state == Some(pinring_ring::SlotState::Claimed)
            && usize::from(w.owner) == index
            && ring.claimant_alive(w.owner, w.tenure) == Some(true);
        mine.then(|| (i, ring.slot_view(i).seq))
    })
}

/// Starts `n` loaders and returns once every one is attached. The daemon is held stopped
/// meanwhile: otherwise a fast machine may finish a short plan before the last loader starts,
/// and that loader would wait for a ring that is gone.
pub fn loaders_attached(
    fx: &Fixture,
    daemon: &Child,
    ring: &pinring_ring::Ring,
    n: usize,
) -> Vec<Child> {
    let _held = Paused::new(daemon);
    let loaders: Vec<Child> = (0..n).map(|_| fx.loader(&fx.config)).collect();
    for l in &loaders {
        wait_attached(ring, l);
    }
    loaders
}

/// Waits until loader `child` is in the ring's loader table.
pub fn wait_attached(ring: &pinring_ring::Ring, child: &Child) {
    let pid = child.id();
    wait_until("the loader to attach", LONG, || {
        loader_index(ring, pid).is_some()
    });
}

/// The first slot found READY, with its seq.
pub fn ready_slot(ring: &pinring_ring::Ring) -> Option<(u32, u64)> {
    (0..ring.geometry().slot_count).find_map(|i| {
        let v = ring.slot_view(i);
        (v.state == Some(pinring_ring::SlotState::Ready)).then_some((i, v.seq))
    })
}

/// The seqs a daemon started with [`Fixture::daemon_logged`] delivered, in delivery order.
pub fn delivered_seqs(log: &Path) -> Vec<u64> {
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .filter(|l| l.contains("batch delivered"))
        .map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("seq="))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no seq in the log line {l:?}"))
        })
        .collect()
}

/// The daemon's published resume point, from a ring's header: the lowest seq not delivered,
/// every seq below it delivered.
pub fn next_deliver(ring: &pinring_ring::Ring) -> u64 {
    ring.header()
        .next_deliver
        .load(std::sync::atomic::Ordering::Relaxed)
}

/// Waits until `n` more batches than now were delivered: the run goes on.
pub fn wait_progress(ring: &pinring_ring::Ring, n: u64) {
    let target = delivered(ring) + n;
    wait_until("more deliveries", LONG, || delivered(ring) >= target);
}

/// The body of `GET path` from `addr` (HTTP/1.0, the whole answer read).
pub fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    write!(conn, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).unwrap();
    answer
}

/// A port free a moment ago, as `127.0.0.1:PORT`, for a daemon's `--metrics-listen`.
pub fn free_local_addr() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("127.0.0.1:{port}")
}

/// `pinring status RING --json` (one measurement over `interval` seconds), parsed.
pub fn status_json(ring: &str, interval: &str) -> serde_json::Value {
    let out = Command::new(exe(CLI))
        .args(["status", ring, "--json", "--interval", interval])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("status --json prints JSON")
}

/// The samples loaders replaced with zeros (`dataset.on_bad_sample = "skip"`), summed over the
/// `bad_samples=N` of their `loader finished` lines.
pub fn bad_samples_logged(logs: &[String]) -> u64 {
    logs.iter()
        .flat_map(|l| l.lines())
        .filter(|l| l.contains("loader finished"))
        .map(|l| {
            let v = l.split("bad_samples=").nth(1).unwrap_or("0");
            v.split(|c: char| !c.is_ascii_digit())
                .next()
                .unwrap_or("0")
                .parse::<u64>()
                .unwrap_or(0)
        })
        .sum()
}

/// What a dataset's files hold for sample `id` of `epoch`: each field's bytes, in field order.
pub type Expect<'a> = &'a dyn Fn(u32, u64) -> Vec<Vec<u8>>;

/// Takes every batch of the ring through a consumer and checks each against `expect`: seqs in
/// order, each batch once, every field byte for byte, every sample once per epoch. Returns the
/// batches taken.
pub fn consume_checked(fx: &Fixture, fields: &[&str], expect: Expect<'_>) -> u64 {
    let mut c =
        pinring_client::Consumer::attach(&fx.ring, &pinring_client::AttachOptions::default())
            .unwrap();
    let cfg = c.config().clone();
    let mut plan = cfg.plan().unwrap();
    let names: Vec<String> = cfg.fields().into_iter().map(|f| f.name).collect();
    assert_eq!(names, fields);
    let mut ids = Vec::new();
    let mut seen: std::collections::HashSet<(u32, u64)> = std::collections::HashSet::new();
    let mut taken = 0;
    loop {
        let expected_seq = c.state().seq;
        let Some(b) = c.next_batch(Some(LONG)).unwrap() else {
            break;
        };
        assert_eq!(b.seq, expected_seq, "batches come in order, none skipped");
        plan.batch_into(b.batch, &mut ids).unwrap();
        assert_eq!(b.samples as usize, ids.len());
        for (k, name) in fields.iter().enumerate() {
            let want: Vec<u8> = ids
                .iter()
                .flat_map(|&id| expect(b.epoch, id).swap_remove(k))
                .collect();
            let got = b.host_bytes(name).unwrap();
            if got != want.as_slice() {
                let per = want.len() / ids.len();
                let n = (0..ids.len())
                    .find(|&n| got[n * per..(n + 1) * per] != want[n * per..(n + 1) * per])
                    .unwrap_or(0);
                panic!(
                    "batch {} (epoch {}), field {name}: sample {} (position {n}) differs",
                    b.batch, b.epoch, ids[n]
                );
            }
        }
        for &id in &ids {
            assert!(
                seen.insert((b.epoch, id)),
                "sample {id} twice in epoch {}",
                b.epoch
            );
        }
        taken += 1;
    }
    let epochs = u64::from(cfg.plan.epochs);
    assert_eq!(
        seen.len() as u64,
        epochs * cfg.dataset.samples,
        "every sample once per epoch"
    );
    taken
}

/// Runs the daemon (`--sink consumer`) and `loaders` loaders on `fx`'s config, checks every
/// batch, and returns the loaders' output after a clean end.
pub fn run_checked(
    fx: &Fixture,
    loaders: usize,
    fields: &[&str],
    expect: Expect<'_>,
) -> Vec<String> {
    let mut daemon = fx.daemon(&["--sink", "consumer"]);
    let ring = fx.wait_ready(&mut daemon);
    let kids = loaders_attached(fx, &daemon, &ring, loaders);
    let taken = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        consume_checked(fx, fields, expect)
    }));
    let taken = match taken {
        Ok(t) => t,
        Err(p) => {
            // The daemon's own account of why, beside the consumer's panic.
            let _ = daemon.kill();
            let (_, log) = wait_for(daemon, "daemon", LONG);
            eprintln!("daemon log:\n{log}");
            std::panic::resume_unwind(p);
        }
    };
    assert!(taken > 0);
    let (status, log) = wait_for(daemon, "daemon", LONG);
    assert!(status.success(), "daemon failed: {status}\n{log}");
    let s = fx.summary();
    assert_eq!(s.batches_delivered, taken, "{s:#?}");
    assert_eq!(
        (s.verify_failures, s.duplicates, s.out_of_order, s.missing),
        (0, 0, 0, 0),
        "{s:#?}"
    );
    kids.into_iter()
        .map(|k| {
            let (st, log) = wait_for(k, "loader", Duration::from_secs(10));
            assert!(st.success(), "loader failed: {st}\n{log}");
            log
        })
        .collect()
}

/// pinring-data's mapping of `[dataset.image]` to a `SampleSpec` (`ImageDataset::sample_spec`),
/// restated here so that the test checks it too: eval/train with the config's values, u8 HWC or
/// normalised CHW.
pub fn pinring_sources_spec(i: &pinring_data::ImageDataset) -> pinring_image::SampleSpec {
    use pinring_data::{ImageOutput, ImageTransform};
    use pinring_image::{Float, Output, SampleSpec, Transform};
    SampleSpec {
        transform: match i.transform {
            ImageTransform::Eval => Transform::Eval {
                resize: i.resize(),
                crop: i.crop(),
            },
            ImageTransform::Train => Transform::Train {
                crop: i.crop(),
                scale: (i.scale()[0], i.scale()[1]),
                ratio: (i.ratio()[0], i.ratio()[1]),
                flip_p: if i.flip() { 0.5 } else { 0.0 },
            },
        },
        output: match i.output {
            ImageOutput::U8 => Output::U8Hwc,
            o => Output::Normalized {
                dtype: match o {
                    ImageOutput::F16 => Float::F16,
                    ImageOutput::Bf16 => Float::Bf16,
                    _ => Float::F32,
                },
                mean: i.mean(),
                std: i.std(),
            },
        },
        reduced_decode: i.reduced_decode,
    }
}

/// The interpreter named by `PINRING_TEST_PYTHON` (default `python3`) if it imports numpy and
/// PIL; otherwise `None` after printing why the test is skipped. An interpreter named on purpose
/// (scripts/test names its venv's) must import them: the test is then required, not skipped.
pub fn python_numpy(test: &str) -> Option<String> {
    let named = std::env::var("PINRING_TEST_PYTHON").ok();
    let py = named.clone().unwrap_or_else(|| "python3".into());
    let probe = "import numpy, PIL, tarfile";
    match Command::new(&py).args(["-c", probe]).output() {
        Ok(o) if o.status.success() => Some(py),
        _ if named.is_some() => panic!("{test}: PINRING_TEST_PYTHON={py} cannot run {probe:?}"),
        _ => {
            println!(
                "{test}: skipped: {py} cannot run {probe:?} (set PINRING_TEST_PYTHON to an \
                 interpreter with numpy and Pillow)"
            );
            None
        }
    }
}

/// Runs `script` with `py` and arguments `args`; panics with its stderr on failure.
pub fn run_python(py: &str, script: &str, args: &[&str]) {
    let out = Command::new(py)
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether `line` carries a log line's ISO timestamp (`2026-01-01T...`) or level word.
pub fn looks_logged(line: &str) -> bool {
    let b = line.as_bytes();
    let stamped = b.windows(11).any(|w| {
        let d = |i: usize| w[i].is_ascii_digit();
        d(0) && d(1)
            && d(2)
            && d(3)
            && w[4] == b'-'
            && d(5)
            && d(6)
            && w[7] == b'-'
            && d(8)
            && d(9)
            && w[10] == b'T'
    });
    stamped
        || [" ERROR ", " WARN ", " INFO "]
            .iter()
            .any(|l| line.contains(l))
}

/// Lines of a child's stderr as they arrive, each with the time it came.
pub fn stderr_lines(
    child: &mut std::process::Child,
) -> std::sync::mpsc::Receiver<(String, std::time::Instant)> {
    use std::io::BufRead;
    let err = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(err).lines() {
            let Ok(line) = line else { break };
            if tx.send((line, std::time::Instant::now())).is_err() {
                break;
            }
        }
    });
    rx
}
