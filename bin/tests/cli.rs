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
    let out = Command::new(exe(CLI))
        .args(["status", &fx.ring, "--json", "--interval", "0.2"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let report = &v[0];
    assert_eq!(report["ring"], fx.ring.as_str(), "{v:#}");
    let snap = &report["snapshot"];
    assert_eq!(snap["state"], "READY", "{v:#}");
    assert_eq!(snap["daemon_pid"], daemon.id(), "{v:#}");
    assert_eq!(snap["loaders"].as_array().map(Vec::len), Some(1), "{v:#}");
    assert!(
        report["rates"]["batches_per_second"].as_f64().unwrap() > 0.0,
        "{v:#}"
    );
    // The run goes on and ends cleanly: status only read the segment.
    signal(&daemon, Signal::SIGTERM);
    let (st, log) = wait_for(daemon, "daemon", Duration::from_secs(10));
    assert!(st.success(), "{log}");
    let (st, _) = wait_for(loader, "loader", Duration::from_secs(10));
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
    let (st, log) = wait_for(a, "daemon", Duration::from_secs(10));
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
            // A batch larger than a slot is cut into parts, but one sample is never split.
            "huge-sample.toml",
            "[dataset]\nsample_shape = [1073741824]\ndtype = \"u8\"\n",
            "dataset.sample_shape = [1073741824] x u8",
            "more than the largest slot",
            "not split across slots",
        ),
        (
            // The default 64 KiB sample with its metadata needs 65664 bytes.
            "tiny-slot.toml",
            "[ring]\nslot_bytes = 4096\n",
            "ring.slot_bytes = 4096",
            "too small",
            "at least 69632",
        ),
        (
            "slots.toml",
            "[ring]\nslots = 5000\n",
            "ring.slots = 5000",
            "between 2 and 4096",
            "fix it in the config file",
        ),
    ] {
        let (code, _, err) = config_check(&fx, name, toml);
        assert_eq!(code, Some(3), "{name}: {err}");
        for text in [name, key, problem, fix] {
            assert!(err.contains(text), "{name}: no {text:?} in: {err}");
        }
    }
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
    let ring = pinring_runtime::loader::attach(
        &fx.ring,
        pinring_ring::Access::ReadOnly,
        Duration::from_secs(20),
    )
    .expect("the run's ring");
    wait_delivered(&ring, 10);
    signal(&run, Signal::SIGTERM);
    let t = Instant::now();
    let (st, text) = wait_for(run, "pinring run", Duration::from_secs(10));
    assert!(st.success(), "{text}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert!(text.contains("resume with --start-seq"), "{text}");
    assert!(
        text.contains("0 failed, 0 duplicates, 0 out of order"),
        "{text}"
    );
    assert!(!fx.segment().exists());
}
