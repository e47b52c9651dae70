//! The operator commands against real rings: `pinring status`, `pinring clean`,
//! `pinring config check`, and SIGTERM to `pinring run`.

mod common;

use common::*;
use nix::sys::signal::Signal;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

fn wait_delivered(ring: &pinring_ring::Ring, n: u64) {
    let start = Instant::now();
    while ring.header().delivered.load(Relaxed) < n {
        assert!(start.elapsed() < LONG, "no progress");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn status_json_reports_a_running_ring_without_disturbing_it() {
    let fx = Fixture::small("status");
    let mut daemon = fx.daemon(&["--epochs", "1000"]);
    let ring = fx.wait_ready(&mut daemon);
    let loader = fx.loader(&fx.config);
    wait_delivered(&ring, 5);
    let v = status_json(&fx.ring, "0.2");
    let report = &v[0];
    assert_eq!(report["ring"], fx.ring.as_str(), "{v:#}");
    let snap = &report["snapshot"];
    assert_eq!(snap["state"], "READY", "{v:#}");
    assert_eq!(snap["daemon_pid"], daemon.id(), "{v:#}");
    assert_eq!(snap["loaders"].as_array().map(Vec::len), Some(1), "{v:#}");
    // The rate is measured over the interval: a loaded machine may deliver nothing in 0.2 s,
    // so only its being a number is asserted; the count shows the run is going.
    assert!(
        report["rates"]["batches_per_second"].as_f64().unwrap() >= 0.0,
        "{v:#}"
    );
    assert!(snap["delivered"].as_u64().unwrap() >= 5, "{v:#}");
    // The run goes on and ends cleanly: status only read the segment.
    signal(&daemon, Signal::SIGTERM);
    let (st, log) = wait_for(daemon, "daemon", LONG);
    assert!(st.success(), "{log}");
    let (st, _) = wait_for(loader, "loader", LONG);
    assert!(st.success());
    let s = fx.summary();
    assert_eq!((s.verify_failures, s.duplicates, s.out_of_order), (0, 0, 0));
}

#[test]
fn clean_removes_a_dead_daemons_ring_and_keeps_a_live_one() {
    let live = Fixture::small("clean-live");
    let dead = Fixture::small("clean-dead");
    let mut a = live.daemon(&["--epochs", "1000"]);
    live.wait_ready(&mut a);
    let mut b = dead.daemon(&["--epochs", "1000"]);
    dead.wait_ready(&mut b);
    b.kill().unwrap();
    b.wait().unwrap();
    assert!(dead.segment().exists());
    let out = Command::new(exe(CLI))
        .args(["clean", "--dry-run", &live.ring, &dead.ring])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("stale") && dead.segment().exists(),
        "dry run removes nothing: {text}"
    );
    let out = Command::new(exe(CLI))
        .args(["clean", &live.ring, &dead.ring])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(!dead.segment().exists(), "{text}");
    assert!(live.segment().exists(), "{text}");
    assert!(text.contains("removed") && text.contains("keep"), "{text}");
    signal(&a, Signal::SIGTERM);
    let (st, log) = wait_for(a, "daemon", LONG);
    assert!(st.success(), "{log}");
}

#[test]
fn config_check_validates_and_prints_the_resolved_settings() {
    let fx = Fixture::small("cfgcheck");
    let out = Command::new(exe(CLI))
        .args(["config", "check"])
        .arg(&fx.config)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("fingerprint"), "{text}");
    let bad = fx.dir.path().join("bad.toml");
    std::fs::write(&bad, "[plan]\nbatch_sise = 3\n").unwrap();
    let out = Command::new(exe(CLI))
        .args(["config", "check"])
        .arg(&bad)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(
        err.contains("bad.toml") && err.contains("batch_sise"),
        "{err}"
    );
}

/// `pinring config check` on `toml`: (exit code, stdout, stderr).
fn config_check(fx: &Fixture, name: &str, toml: &str) -> (Option<i32>, String, String) {
    let path = fx.dir.path().join(name);
    std::fs::write(&path, toml).unwrap();
    let out = Command::new(exe(CLI))
        .args(["config", "check"])
        .arg(&path)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[test]
fn config_check_refuses_a_ring_geometry_the_daemon_cannot_make_and_names_the_fix() {
    let fx = Fixture::small("cfggeom");
    for (name, toml, key, problem, fix) in [
        (
            "unaligned.toml",
            "[ring]\nslot_bytes = 3000000\n",
            "ring.slot_bytes = 3000000",
            "not a multiple of 4096",
            "use 2998272 or 3002368",
        ),
        (
            "huge-slot.toml",
            "[ring]\nslot_bytes = \"2GiB\"\n",
            "ring.slot_bytes = 2147483648",
            "more than the largest slot (1073741824 bytes",
            "a size up to 1073741824",
        ),
        (
            // A batch larger than a slot is cut into parts; a sample of a kind that cannot make
            // part of a sample (Python producers) is never split.
            "huge-sample.toml",
            "[dataset]\nkind = \"external\"\n\
             fields = [{ name = \"images\", dtype = \"u8\", shape = [1073741824] }]\n",
            "dataset.fields = 1073741824 bytes a sample",
            "more than the largest slot",
            "use smaller samples",
        ),
        (
            // A 64 KiB sample and its label with their metadata need 65664 bytes.
            "tiny-slot.toml",
            "[ring]\nslot_bytes = 4096\n[dataset]\nkind = \"external\"\n\
             fields = [{ name = \"images\", dtype = \"f32\", shape = [128, 128] }, \
             { name = \"labels\", dtype = \"i64\" }]\n",
            "ring.slot_bytes = 4096",
            "too small",
            "at least 69632",
        ),
        (
            "slots.toml",
            "[ring]\nslots = 5000\n",
            "ring.slots = 5000",
            "between 2 and 4096",
            "fix it in the config",
        ),
    ] {
        let (code, _, err) = config_check(&fx, name, toml);
        assert_eq!(code, Some(3), "{name}: {err}");
        for text in [name, key, problem, fix] {
            assert!(err.contains(text), "{name}: no {text:?} in: {err}");
        }
    }
    // A synthetic sample of 1 GiB in a batch of one is cut into 256 byte parts of 4 MiB.
    let (code, out, err) = config_check(
        &fx,
        "one-gib.toml",
        "[dataset]\nsample_shape = [1073741824]\ndtype = \"u8\"\nsamples = 8\n\
         [plan]\nbatch_size = 1\n",
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("256 byte parts per batch (256 per sample, 4194304 bytes")
            && out.contains(&format!("# slot bytes: {}", (4 << 20) + 4096)),
        "{out}"
    );
    // The daemon refuses the same configs at start with the same message, not a ring error.
    let (st, log) = wait_for(
        Command::new(exe(DAEMON))
            .args(["--ring", &fx.ring, "--backend", "host", "--config"])
            .arg(fx.dir.path().join("unaligned.toml"))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
        "daemon",
        Duration::from_secs(10),
    );
    assert_eq!(st.code(), Some(3), "{log}");
    assert!(log.contains("use 2998272 or 3002368"), "{log}");
    assert!(!fx.segment().exists());
}

#[test]
fn config_check_prints_the_resolved_auto_layout_and_where_the_cache_size_came_from() {
    let fx = Fixture::small("cfgauto");
    // 32 MiB batches of 32 samples of 1 MiB each (images of 1 MiB - 8 bytes and an 8-byte
    // label) on a 300 MiB cache: 8 parts of 4 samples in 32 slots of 4 MiB + 4 KiB.
    let toml = "[dataset]\nsample_shape = [1048568]\ndtype = \"u8\"\n";
    let path = fx.dir.path().join("auto.toml");
    std::fs::write(&path, toml).unwrap();
    let check = |llc: &str| {
        let out = Command::new(exe(CLI))
            .args(["config", "check"])
            .arg(&path)
            .env("PINRING_LLC_BYTES", llc)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(out.status.success(), "{text}");
        text
    };
    let out = check("300MiB");
    assert!(
        out.contains("# auto: ring.slot_bytes = \"auto\" resolved to 32 slots x 4.0 MiB")
            && out.contains("8 part(s) of up to 4 samples")
            && out.contains("from $PINRING_LLC_BYTES"),
        "{out}"
    );
    assert!(
        out.contains(&format!("slot_bytes = {}", (4 << 20) + 4096)),
        "{out}"
    );
    assert!(out.contains("slots = 32"), "{out}");
    // Where each field of a batch goes in its device buffer: labels after the images, aligned.
    assert!(
        out.contains(&format!(
            "# fields: images u8 [32, 1048568] at byte 0, labels i64 [32] at byte {} of a {}-byte \
             device buffer per batch; 1048576 bytes per sample",
            32 * 1048568,
            32 * 1048568 + 32 * 8
        )),
        "{out}"
    );
    // An explicit slot size and count are kept, and nothing says "auto".
    let (code, out, err) = config_check(
        &fx,
        "fixed.toml",
        &format!("[ring]\nslot_bytes = \"16MiB\"\nslots = 4\n{toml}"),
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(
        !out.contains("# auto:")
            && out.contains("slot_bytes = 16777216")
            && out.contains("slots = 4"),
        "{out}"
    );
    // An explicit slot size without a count gets the count "auto" gives that size, and the
    // check says so: 256 KiB slots in a ring aimed at 8 MiB (half a 16 MiB cache) are 32.
    std::fs::write(&path, format!("[ring]\nslot_bytes = \"256KiB\"\n{toml}")).unwrap();
    let out = check("16MiB");
    assert!(
        out.contains("# auto: ring.slots unset: the given slot size gets 32 slots x 256.0 KiB"),
        "{out}"
    );
    assert!(out.contains("slots = 32"), "{out}");
}

#[test]
fn config_check_warns_when_the_ring_is_larger_than_the_cache_or_the_memory() {
    let fx = Fixture::small("cfgwarn");
    // 4096 slots of 1 GiB: 4 TiB, more than any cache and any host's available memory.
    let (code, out, err) = config_check(
        &fx,
        "big.toml",
        "[ring]\nslots = 4096\nslot_bytes = \"1GiB\"\n",
    );
    assert_eq!(code, Some(0), "a warning, not an error: {err}");
    assert!(out.contains("# config OK"), "{out}");
    let host = pinring_runtime::host_memory::HostMemory::read();
    match host.last_level_cache {
        Some(c) => assert!(
            out.contains(&format!(
                "# warning: ring \"default\": its slots (4096 slots x 1.0 GiB = 4.0 TiB) are larger than the last-level cache (L{}",
                c.level
            )),
            "{out}"
        ),
        None => assert!(
            out.contains("last-level cache unknown") && !out.contains("last-level cache (L"),
            "{out}"
        ),
    }
    assert!(host.available.is_some(), "/proc/meminfo has MemAvailable");
    assert!(
        out.contains("# warning: ring \"default\": its slots (4096 slots x 1.0 GiB = 4.0 TiB) are more than the available memory (MemAvailable"),
        "{out}"
    );
    // A ring far below both: no warning.
    let (code, out, err) = config_check(&fx, "small.toml", SMALL);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("# host: ") && !out.contains("# warning"),
        "{out}"
    );
}

#[test]
fn sigterm_to_pinring_run_drains_and_tells_where_to_resume() {
    let fx = Fixture::small("runterm");
    let run = Command::new(exe(CLI))
        .args([
            "run",
            "--quiet",
            "--loaders",
            "2",
            "--backend",
            "host",
            "--epochs",
            "1000",
        ])
        .args(["--ring", &fx.ring])
        .arg("--config")
        .arg(&fx.config)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let ring = pinring_ring::attach(
        &fx.ring,
        pinring_ring::Access::ReadOnly,
        Duration::from_secs(20),
    )
    .expect("the run's ring");
    wait_delivered(&ring, 10);
    signal(&run, Signal::SIGTERM);
    let t = Instant::now();
    let (st, text) = wait_for(run, "pinring run", LONG);
    assert!(st.success(), "{text}");
    // The drain takes at most 1.5 s (DRAIN_DEADLINE); 20 s allows a loaded machine.
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    assert!(text.contains("resume with --start-seq"), "{text}");
    assert!(
        text.contains("0 failed, 0 duplicates, 0 out of order"),
        "{text}"
    );
    assert!(!fx.segment().exists());
}

/// The fields of a CSV line by column name.
fn csv_rows(text: &str) -> Vec<std::collections::HashMap<String, String>> {
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().expect("a header").split(',').collect();
    lines
        .map(|line| {
            let fields: Vec<&str> = line.split(',').collect();
            assert_eq!(fields.len(), header.len(), "{line}");
            header
                .iter()
                .zip(fields)
                .map(|(h, f)| (h.to_string(), f.to_string()))
                .collect()
        })
        .collect()
}

fn number(row: &std::collections::HashMap<String, String>, column: &str) -> f64 {
    row[column]
        .parse()
        .unwrap_or_else(|_| panic!("{column} is not a number in {row:?}"))
}

#[test]
fn bench_repeats_each_point_next_to_the_reference_and_keeps_every_run() {
    let out = tempfile::tempdir().unwrap();
    let bench = Command::new(exe(CLI))
        .args(["bench", "--backend", "host", "--slot-sizes", "64KiB"])
        .args([
            "--loaders",
            "1,2",
            "--run-bytes",
            "4MiB",
            "--ring-bytes",
            "512KiB",
        ])
        .args([
            "--register-bytes",
            "0",
            "--skip-modes",
            "--repeat",
            "2",
            "--out",
        ])
        .arg(out.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = bench.id();
    let (st, text) = wait_for(bench, "pinring bench", LONG);
    assert!(st.success(), "{text}");

    // The table: the reference's GB/s and spread, the ratio to it, the flag column; each run
    // of each point, then its summary row.
    let header = text
        .lines()
        .find(|l| l.starts_with("mode "))
        .unwrap_or_else(|| panic!("no table header in:\n{text}"));
    for column in [
        "GB/s",
        "min-max",
        "spread",
        "ref GB/s",
        "ref spread",
        "of ref",
        "of raw",
    ] {
        assert!(header.contains(column), "no {column:?} in {header:?}");
    }
    assert!(header.trim_end().ends_with('!'), "{header:?}");
    assert_eq!(text.matches("  run 1/2: pinring ").count(), 2, "{text}");
    assert_eq!(text.matches("  run 2/2: pinring ").count(), 2, "{text}");
    let points: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("pipeline ") && l.contains("64.0 KiB"))
        .collect();
    assert_eq!(points.len(), 2, "{text}");

    // The CSV: the ceilings, every run, and a summary row per point.
    let csv = std::fs::read_to_string(out.path().join("bench.csv")).unwrap();
    assert_eq!(
        csv.lines().next().unwrap(),
        pinring_bench::bench::CSV_COLUMNS.join(",")
    );
    let rows = csv_rows(&csv);
    let modes: Vec<(&str, &str, &str)> = rows
        .iter()
        .map(|r| (r["mode"].as_str(), r["loaders"].as_str(), r["run"].as_str()))
        .collect();
    assert_eq!(
        modes,
        [
            ("raw registered", "0", ""),
            ("raw pageable", "0", ""),
            ("pipeline", "1", "1"),
            ("pipeline", "1", "2"),
            ("pipeline", "1", "median"),
            ("pipeline", "2", "1"),
            ("pipeline", "2", "2"),
            ("pipeline", "2", "median"),
        ]
    );
    // 4 MiB in 64 KiB batches: both pipelines move exactly the asked bytes.
    for run in rows.iter().filter(|r| r["run"] == "1" || r["run"] == "2") {
        assert_eq!(run["bytes"], (4u64 << 20).to_string(), "{run:?}");
        assert_eq!(run["ref_bytes"], (4u64 << 20).to_string(), "{run:?}");
        let (gbps, reference) = (number(run, "gbps"), number(run, "ref_gbps"));
        assert!(gbps > 0.0 && reference > 0.0, "{run:?}");
        // Both GB/s are rounded to 3 decimals, and so is their ratio.
        let (low, high) = (
            (gbps - 5e-4) / (reference + 5e-4),
            (gbps + 5e-4) / (reference - 5e-4),
        );
        let ratio = number(run, "ratio_to_ref");
        assert!((low - 5e-4..=high + 5e-4).contains(&ratio), "{run:?}");
    }
    // Each summary is the statistics of its two runs (the CSV rounds to 3 decimals).
    for summary in rows.iter().filter(|r| r["run"] == "median") {
        let runs: Vec<_> = rows
            .iter()
            .filter(|r| r["loaders"] == summary["loaders"] && r["run"] != "median")
            .collect();
        let g: Vec<f64> = runs.iter().map(|r| number(r, "gbps")).collect();
        let near = |a: f64, b: f64| (a - b).abs() < 0.002;
        assert!(
            near(number(summary, "gbps"), (g[0] + g[1]) / 2.0),
            "{summary:?}"
        );
        assert!(
            near(number(summary, "gbps_min"), g[0].min(g[1])),
            "{summary:?}"
        );
        assert!(
            near(number(summary, "gbps_max"), g[0].max(g[1])),
            "{summary:?}"
        );
        let r: Vec<f64> = runs.iter().map(|r| number(r, "ref_gbps")).collect();
        assert!(
            near(number(summary, "ref_gbps"), (r[0] + r[1]) / 2.0),
            "{summary:?}"
        );
        // The flag: either spread over 10% (unless a spread rounds to the threshold itself).
        let spreads = [number(summary, "spread"), number(summary, "ref_spread")];
        if spreads.iter().all(|s| (s - 0.1).abs() > 0.001) {
            let flagged = spreads.iter().any(|&s| s > 0.1);
            assert_eq!(
                summary["flagged"],
                if flagged { "1" } else { "0" },
                "{summary:?}"
            );
        }
    }
    // Nothing left in /dev/shm: neither the pipeline's rings nor the reference's segment.
    for name in [format!("bench-{pid}"), format!("bench-ref-{pid}")] {
        assert!(
            !pinring_ring::object_path(&name).exists(),
            "{name} left behind"
        );
    }
    // The plot redraws from the CSV alone.
    let again = tempfile::tempdir().unwrap();
    let replot = Command::new(exe(CLI))
        .args(["bench", "--replot"])
        .arg(out.path().join("bench.csv"))
        .arg("--out")
        .arg(again.path())
        .output()
        .unwrap();
    assert!(replot.status.success(), "{replot:?}");
    let svg = std::fs::read_to_string(again.path().join("bench.svg")).unwrap();
    assert!(svg.contains("reference (no protocol), 2 writers"), "{svg}");
}

#[test]
fn the_reference_writer_is_hidden_and_refuses_a_segment_the_bench_did_not_make() {
    let help = Command::new(exe(CLI)).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.contains("bench") && !help.contains("bench-writer"),
        "{help}"
    );
    let name = format!("it-refmissing-{}", std::process::id());
    let out = Command::new(exe(CLI))
        .args(["bench-writer", "--segment", &name, "--index", "0"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(
        err.contains(&name) && err.contains("run `pinring bench` again"),
        "{err}"
    );
    // --repeat counts runs: zero is a usage error.
    let out = Command::new(exe(CLI))
        .args(["bench", "--repeat", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

#[test]
fn config_check_refuses_what_the_daemon_refuses_a_group_that_does_not_exist() {
    let fx = Fixture::small("cfg-group");
    let toml = format!("{SMALL}\n[ring]\nmode = \"0660\"\ngroup = \"nosuchgroup\"\n")
        .replacen("[ring]\nslots = 8\n", "", 1)
        .replace("[ring]\nmode", "[ring]\nslots = 8\nmode");
    let (code, _, err) = config_check(&fx, "group.toml", &toml);
    assert_eq!(code, Some(3), "{err}");
    assert!(
        err.contains("nosuchgroup") && err.contains("groupadd"),
        "{err}"
    );
    // The daemon refuses the same config with the same code and message.
    std::fs::write(&fx.config, &toml).unwrap();
    let (st, log) = wait_for(fx.daemon(&[]), "daemon", LONG);
    assert_eq!(st.code(), Some(3), "{log}");
    assert!(log.contains("nosuchgroup"), "{log}");
}

/// The CPUs process `pid` (its main thread) may run on, as /proc lists them.
fn cpus_allowed(pid: u32) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Waits (up to [`LONG`]) for process `pid` to be allowed exactly `want`.
fn wait_cpus(pid: u32, want: usize, what: &str) {
    let start = Instant::now();
    while cpus_allowed(pid) != want.to_string() {
        assert!(
            start.elapsed() < LONG,
            "{what} (pid {pid}) runs on {:?}, not CPU {want}",
            cpus_allowed(pid)
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn daemon_cpus_pin_the_daemon_and_its_loaders_follow_it_unless_told_otherwise() {
    let all = pinring_runtime::numa::cpus_of(0).unwrap();
    if all.len() < 2 {
        eprintln!("SKIPPED: this process may use one CPU; the test needs two");
        return;
    }
    let (a, b) = (all[0], all[1]);
    let fx = Fixture::new("cpus", &format!("{SMALL}[daemon]\ncpus = [{a}]\n"));
    let mut daemon = fx.daemon(&["--epochs", "100000"]);
    let _ring = fx.wait_ready(&mut daemon);
    wait_cpus(daemon.id(), a, "the daemon with daemon.cpus");
    // A loader of it follows its CPUs (fewer than its own) once attached.
    let mut follower = fx.loader(&fx.config);
    wait_cpus(follower.id(), a, "a loader with no loader_cpus");
    // daemon.loader_cpus in a loader's config is where it runs (the daemon section is not
    // part of the fingerprint: the loader is accepted).
    let told = fx.dir.path().join("told.toml");
    std::fs::write(
        &told,
        format!("{SMALL}[daemon]\ncpus = [{a}]\nloader_cpus = [{b}]\n"),
    )
    .unwrap();
    let mut loader = fx.loader(&told);
    wait_cpus(loader.id(), b, "a loader with daemon.loader_cpus");
    for c in [&mut follower, &mut loader, &mut daemon] {
        let _ = c.kill();
        let _ = c.wait();
    }
}

#[test]
fn status_live_view_into_a_pipe_writes_no_terminal_codes() {
    let fx = Fixture::small("status-pipe");
    let mut daemon = fx.daemon(&["--epochs", "1000"]);
    fx.wait_ready(&mut daemon);
    let mut view = Command::new(exe(CLI))
        .args(["status", &fx.ring, "--interval", "0.05"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdout = view.stdout.take().unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let reader = {
        let seen = std::sync::Arc::clone(&seen);
        std::thread::spawn(move || {
            use std::io::Read;
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = stdout.read(&mut buf) {
                seen.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        })
    };
    // Three views of the ring, one after the other.
    wait_until("three views", LONG, || {
        String::from_utf8_lossy(&seen.lock().unwrap())
            .matches(fx.ring.as_str())
            .count()
            >= 3
    });
    signal(&view, Signal::SIGTERM);
    let status = view.wait().unwrap();
    reader.join().unwrap();
    assert!(status.success(), "{status}");
    let text = String::from_utf8_lossy(&seen.lock().unwrap()).to_string();
    assert!(!text.contains('\x1b'), "{text:?}");
    signal(&daemon, Signal::SIGTERM);
    let (st, log) = wait_for(daemon, "daemon", LONG);
    assert!(st.success(), "{log}");
}

/// A token dataset of 4096 u16 tokens in `dir` (255 windows of 16: 32 batches of 8 per epoch).
fn token_config(dir: &std::path::Path) -> std::path::PathBuf {
    let tokens: Vec<u8> = (0..4096u16).flat_map(|t| t.to_le_bytes()).collect();
    std::fs::write(dir.join("tok.bin"), tokens).unwrap();
    let config = dir.join("train.toml");
    std::fs::write(
        &config,
        "[ring]\nslots = 8\n[dataset]\nkind = \"tokens\"\n[dataset.tokens]\nfiles = [\"tok.bin\"]\n\
         token_dtype = \"u16\"\nseq_len = 15\nstride = 16\n[plan]\nbatch_size = 8\nepochs = 1\n",
    )
    .unwrap();
    config
}

#[test]
fn run_on_a_file_dataset_says_which_sink_works_before_starting_anything() {
    let fx = Fixture::small("run-files-hint");
    let config = token_config(fx.dir.path());
    let out = Command::new(exe(CLI))
        .args(["run", "--quiet", "--backend", "host", "--ring", &fx.ring])
        .arg("--config")
        .arg(&config)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    // One plain line, from run itself: no daemon was started to fail.
    assert_eq!(err.lines().count(), 1, "{err}");
    let line = err.trim_end();
    assert!(line.starts_with("error: "), "{err}");
    assert!(
        line.contains("dataset.kind = \"tokens\"")
            && line.contains("pinring run --sink discard")
            && line.contains(&format!("pinring consume --ring {}", fx.ring))
            && line.contains(&format!("pinring.Loader(ring=\"{}\")", fx.ring)),
        "{line}"
    );
    assert!(!fx.segment().exists());
}

#[test]
fn run_with_the_consumer_sink_says_it_waits_for_a_consumer_until_one_attaches() {
    let fx = Fixture::small("run-consumer-wait");
    let config = token_config(fx.dir.path());
    let mut run = Command::new(exe(CLI))
        .args(["run", "--quiet", "--backend", "host", "--loaders", "2"])
        .args(["--sink", "consumer", "--ring", &fx.ring])
        .arg("--config")
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = stderr_lines(&mut run);
    let want = format!(
        "waiting for a consumer on ring \"{0}\": attach one with `pinring consume --ring {0}` \
         or pinring.Loader(ring=\"{0}\")",
        fx.ring
    );
    let start = Instant::now();
    let mut seen = Vec::new();
    let said = loop {
        let left = Duration::from_secs(30).saturating_sub(start.elapsed());
        match lines.recv_timeout(left) {
            Ok((line, _)) if line.contains(&want) => break true,
            Ok((line, _)) => seen.push(line),
            Err(_) => break false,
        }
    };
    if !said {
        let _ = run.kill();
        let _ = run.wait();
        panic!("no waiting line within 30 s; stderr: {seen:?}");
    }
    assert!(!looks_logged(&want), "a plain line");
    // Following the advice ends the run: the consumer takes the plan's 32 batches.
    let (st, out) = wait_for(cli(&["consume", "--ring", &fx.ring]), "consume", LONG);
    assert!(st.success(), "{out}");
    assert!(out.contains("\"batches\":32"), "{out}");
    let (st, text) = wait_for(run, "pinring run", LONG);
    assert!(st.success(), "{text}");
    assert!(text.contains("32 delivered of 32"), "{text}");
    assert!(!fx.segment().exists());
}

/// `pinring bench --decode`: decode = "cpu" and "gpu" side by side on synthetic shards (the
/// host backend's engine decodes the "gpu" runs on the CPU), every image delivered in each run
/// and the engine's counts in the CSV.
#[test]
fn bench_decode_runs_both_ways_on_the_same_shards() {
    let out = tempfile::tempdir().unwrap();
    let bench = Command::new(exe(CLI))
        .args([
            "bench",
            "--decode",
            "--backend",
            "host",
            "--decode-images",
            "64",
        ])
        .args([
            "--decode-batch",
            "8",
            "--decode-epochs",
            "1",
            "--decode-loaders",
            "1",
        ])
        .arg("--out")
        .arg(out.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (st, text) = wait_for(bench, "pinring bench --decode", LONG);
    assert!(st.success(), "{text}");
    assert!(text.contains("gpu/cpu"), "{text}");
    let csv = std::fs::read_to_string(out.path().join("decode.csv")).unwrap();
    let rows: Vec<&str> = csv.lines().skip(1).collect();
    assert_eq!(rows.len(), 2, "{csv}");
    assert!(rows[0].starts_with("cpu,1,0,64,"), "{csv}");
    assert!(rows[1].starts_with("gpu,1,0,64,"), "{csv}");
    assert!(
        rows[1].contains("cpu=64") && rows[1].contains("failed=0"),
        "{csv}"
    );
}
