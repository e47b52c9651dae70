//! Refusals and failures: each a clear message naming the object and a documented exit code.

mod common;

use common::*;
use nix::sys::signal::Signal;
use std::process::Command;
use std::time::{Duration, Instant};

const USAGE: i32 = 2;
const CONFIG: i32 = 3;
const RING_ERROR: i32 = 4;
const BACKEND: i32 = 7;

#[test]
fn a_loader_with_another_config_is_refused() {
    let fx = Fixture::small("mismatch");
    let mut daemon = fx.daemon(&["--epochs", "1000"]);
    fx.wait_ready(&mut daemon);
    let other = fx.dir.path().join("other.toml");
    std::fs::write(&other, SMALL.replace("batch_size = 8", "batch_size = 4")).unwrap();
    let (st, log) = wait_for(fx.loader(&other), "loader", LONG);
    assert_eq!(st.code(), Some(8), "{log}");
    assert!(
        log.contains("fingerprint") && log.contains(&fx.ring),
        "{log}"
    );
    // The message names the setting that differs, with both values.
    assert!(
        log.contains("plan.batch_size (the daemon's 8, this loader's 4)"),
        "{log}"
    );
    // Two at once, and the sample shape; each still exit 8.
    for (edit, needles) in [
        (
            SMALL.replace("epochs = 2", "epochs = 2\nshuffle = false\nseed = 5"),
            &[
                "plan.seed (the daemon's 0, this loader's 5)",
                "plan.shuffle (the daemon's true, this loader's false)",
            ][..],
        ),
        (
            SMALL.replace("[64, 64]", "[64, 32]"),
            &["the sample's fields (dataset.sample_shape, dataset.dtype"],
        ),
        (
            SMALL.replace("seed = 7", "seed = 8"),
            &["another dataset or plan setting"],
        ),
    ] {
        std::fs::write(&other, edit).unwrap();
        let (st, log) = wait_for(fx.loader(&other), "loader", LONG);
        assert_eq!(st.code(), Some(8), "{log}");
        for n in needles {
            assert!(log.contains(n), "{log} lacks {n:?}");
        }
    }
    signal(&daemon, Signal::SIGTERM);
    let (st, _) = wait_for(daemon, "daemon", LONG);
    assert!(st.success());
}

#[test]
fn opening_a_ring_that_does_not_exist_fails_clearly() {
    let out = Command::new(LOADER)
        .args(["--ring", "it-nothing-here", "--wait-secs", "0.2"])
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(RING_ERROR), "{log}");
    assert!(
        log.contains("it-nothing-here") && log.contains("does not exist"),
        "{log}"
    );
}

#[test]
fn a_segment_of_another_layout_version_is_refused() {
    let fx = Fixture::small("ver");
    let mut bytes = vec![0u8; 8192];
    bytes[..8].copy_from_slice(b"PINRING\0");
    bytes[8..12].copy_from_slice(&99u32.to_le_bytes());
    std::fs::write(fx.segment(), bytes).unwrap();
    let (st, log) = wait_for(fx.loader(&fx.config), "loader", LONG);
    assert_eq!(st.code(), Some(RING_ERROR), "{log}");
    assert!(
        log.contains("layout version 99") && log.contains(&fx.ring),
        "{log}"
    );
}

#[test]
fn a_truncated_segment_is_refused_and_stops_the_daemon() {
    let fx = Fixture::small("trunc");
    let mut daemon = fx.daemon(&["--epochs", "1000"]);
    fx.wait_ready(&mut daemon);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(fx.segment())
        .unwrap();
    f.set_len(4096 * 3).unwrap();
    let (st, log) = wait_for(fx.loader(&fx.config), "loader", LONG);
    assert_eq!(st.code(), Some(RING_ERROR), "{log}");
    assert!(log.contains("truncated"), "{log}");
    // The daemon stops rather than upload from a file that changed under it.
    let (st, log) = wait_for(daemon, "daemon", LONG);
    assert_eq!(st.code(), Some(RING_ERROR), "{log}");
    assert!(log.contains("truncated"), "{log}");
}

#[test]
fn a_live_daemons_ring_is_refused_and_a_dead_ones_replaced() {
    let fx = Fixture::small("held");
    let mut first = fx.daemon(&["--epochs", "1000"]);
    fx.wait_ready(&mut first);
    let (st, log) = wait_for(fx.daemon(&[]), "second daemon", LONG);
    assert_eq!(st.code(), Some(RING_ERROR), "{log}");
    assert!(log.contains("held by a running daemon"), "{log}");
    // Kill the owner without letting it clean up: the segment stays behind.
    first.kill().unwrap();
    first.wait().unwrap();
    assert!(fx.segment().exists());
    let mut daemon = fx.daemon(&[]);
    fx.wait_ready(&mut daemon);
    let loader = fx.loader(&fx.config);
    let (st, log) = wait_for(daemon, "replacing daemon", LONG);
    assert!(st.success(), "{log}");
    assert!(log.contains("stale segment"), "{log}");
    let (st, _) = wait_for(loader, "loader", LONG);
    assert!(st.success());
    assert_complete(&fx.summary(), true);
}

#[test]
fn a_start_seq_past_the_plans_end_is_a_usage_error_naming_the_end() {
    // SMALL's plan has 128 batches: seqs 0 to 127; 128 would resume a finished run.
    let fx = Fixture::small("startseq");
    let (st, log) = wait_for(
        fx.daemon(&["--start-seq", "1000"]),
        "daemon",
        Duration::from_secs(10),
    );
    assert_eq!(st.code(), Some(USAGE), "{log}");
    assert!(
        log.contains(&fx.ring)
            && log.contains("--start-seq 1000 is past the end of the plan")
            && log.contains("128 seqs")
            && log.contains("at most 128"),
        "{log}"
    );
    assert!(!log.contains("report the bug"), "{log}");
    assert!(!fx.segment().exists(), "refused before the ring was made");
}

#[test]
fn a_start_seq_inside_a_batch_that_spans_slots_is_a_usage_error_naming_a_batch_start() {
    // spanning() cuts each batch into 4 parts: seq 6 is part 2 of batch 1, which starts at 4.
    let fx = Fixture::new("startpart", &spanning());
    let (st, log) = wait_for(
        fx.daemon(&["--start-seq", "6"]),
        "daemon",
        Duration::from_secs(10),
    );
    assert_eq!(st.code(), Some(USAGE), "{log}");
    assert!(
        log.contains("--start-seq 6 is part 2 of a batch cut into 4 parts")
            && log.contains("such as 4"),
        "{log}"
    );
    assert!(!fx.segment().exists(), "refused before the ring was made");
}

#[test]
fn zero_copy_with_batches_that_span_slots_is_a_config_error() {
    let fx = Fixture::new("zcspan", &spanning());
    let (st, log) = wait_for(
        fx.daemon(&["--zero-copy"]),
        "daemon",
        Duration::from_secs(10),
    );
    assert_eq!(st.code(), Some(3), "{log}");
    assert!(
        log.contains("--zero-copy") && log.contains("4 parts") && log.contains("ring.slot_bytes"),
        "{log}"
    );
    assert!(!fx.segment().exists(), "refused before the ring was made");
}

#[test]
fn a_prefetch_a_consumer_cannot_be_handed_is_a_config_error_naming_where_it_came_from() {
    // The flag (and its former name) and the config key are one setting: the batch buffers.
    for (config, flags, key, value) in [
        (
            "",
            &["--sink", "consumer", "--prefetch", "65"][..],
            "--prefetch",
            "65",
        ),
        (
            "",
            &["--sink", "consumer", "--upload-buffers", "1"][..],
            "--prefetch",
            "1",
        ),
        (
            "[daemon]\nprefetch = 1\n",
            &["--sink", "consumer"][..],
            "daemon.prefetch",
            "1",
        ),
    ] {
        let fx = Fixture::new("prefetch", config);
        let (st, log) = wait_for(fx.daemon(flags), "daemon", Duration::from_secs(10));
        assert_eq!(st.code(), Some(CONFIG), "{flags:?}: {log}");
        assert!(
            log.contains(&format!("{key} = {value}")) && log.contains("2 to 64"),
            "{flags:?}: {log}"
        );
        assert!(!fx.segment().exists(), "refused before the ring was made");
    }
    // Outside the range of any sink, the flag is refused by the parser.
    let fx = Fixture::new("prefetch-range", "");
    let (st, log) = wait_for(
        fx.daemon(&["--prefetch", "0"]),
        "daemon",
        Duration::from_secs(10),
    );
    assert_eq!(st.code(), Some(USAGE), "{log}");
    assert!(log.contains("--prefetch"), "{log}");
}

/// Runs a daemon for `fx`'s ring with `extra` flags and its summary at `summary`.
fn daemon_with_summary(
    fx: &Fixture,
    config: &std::path::Path,
    summary: &std::path::Path,
    extra: &[&str],
) -> (std::process::ExitStatus, String) {
    let child = Command::new(exe(DAEMON))
        .args(["--ring", &fx.ring, "--sink", "verify"])
        .arg("--config")
        .arg(config)
        .arg("--summary")
        .arg(summary)
        .args(extra)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for(child, "daemon", Duration::from_secs(30))
}

#[test]
fn a_daemon_that_fails_at_start_still_writes_its_summary_with_the_error_and_exit_code() {
    let fx = Fixture::small("startfail");
    let mut live = fx.daemon(&["--epochs", "1000"]);
    fx.wait_ready(&mut live);
    let bad_config = fx.dir.path().join("bad.toml");
    std::fs::write(&bad_config, "[plan]\nbatch_size = 0\n").unwrap();
    // (flags, config, exit code, text the error must hold)
    let cases: [(&[&str], &std::path::Path, i32, &str); 4] = [
        // The ring is held by the live daemon above.
        (
            &["--backend", "host"],
            &fx.config,
            RING_ERROR,
            "held by a running daemon",
        ),
        // No such GPU (on a host without a driver: no driver); refused before the ring is made.
        (
            &["--backend", "cuda", "--device", "99"],
            &fx.config,
            BACKEND,
            "",
        ),
        (
            &["--backend", "host"],
            &bad_config,
            CONFIG,
            "plan.batch_size",
        ),
        (
            &["--backend", "host", "--start-seq", "999"],
            &fx.config,
            USAGE,
            "--start-seq 999",
        ),
    ];
    for (i, (flags, config, code, text)) in cases.into_iter().enumerate() {
        let path = fx.dir.path().join(format!("summary-{i}.json"));
        let (st, log) = daemon_with_summary(&fx, config, &path, flags);
        assert_eq!(st.code(), Some(code), "{flags:?}: {log}");
        let s = pinring_daemon::summary::Summary::read(&path)
            .unwrap_or_else(|e| panic!("{flags:?}: no summary ({e}): {log}"));
        assert_eq!(i32::from(s.exit_code), code, "{flags:?}: {s:#?}");
        let error = s.error.as_deref().unwrap_or_default();
        assert!(
            !error.is_empty() && error.contains(text),
            "{flags:?}: {s:#?}"
        );
        assert!(
            log.contains(error),
            "the summary's error is the logged one: {log}"
        );
        assert_eq!(s.ring, fx.ring, "{s:#?}");
        assert_eq!((s.batches_delivered, s.bytes), (0, 0), "{s:#?}");
        assert_eq!(s.bound, "none", "{s:#?}");
    }
    signal(&live, Signal::SIGTERM);
    let (st, log) = wait_for(live, "live daemon", LONG);
    assert!(
        st.success(),
        "the failed starts left the live ring alone: {log}"
    );
}

#[test]
fn an_unknown_config_key_names_file_and_key() {
    let fx = Fixture::new("badkey", "[ring]\nslotz = 4\n");
    let (st, log) = wait_for(fx.daemon(&[]), "daemon", LONG);
    assert_eq!(st.code(), Some(3), "{log}");
    assert!(
        log.contains("pinring.toml") && log.contains("slotz"),
        "{log}"
    );
}

#[test]
fn an_out_of_range_value_names_the_key_and_what_is_allowed() {
    let fx = Fixture::new("badval", "[plan]\nrank = 3\nworld_size = 2\n");
    let (st, log) = wait_for(fx.daemon(&[]), "daemon", LONG);
    assert_eq!(st.code(), Some(3), "{log}");
    assert!(log.contains("plan.rank"), "{log}");
}

#[test]
fn pinring_run_verifies_and_prints_a_summary() {
    let fx = Fixture::small("run");
    let out = Command::new(CLI)
        .args([
            "run",
            "--quiet",
            "--loaders",
            "3",
            "--backend",
            "host",
            "--ring",
            &fx.ring,
        ])
        .arg("--config")
        .arg(&fx.config)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("128 delivered of 128 (128 verified, 0 failed"),
        "{text}"
    );
    assert!(text.contains("GB/s") && text.contains("verdict"), "{text}");
    assert!(!fx.segment().exists());
}

#[test]
fn a_kind_that_cannot_cut_a_sample_refuses_a_slot_smaller_than_one() {
    // Python producers (kind = "external") write whole samples: a 64 KiB sample in 16 KiB slots
    // is refused at the daemon's start, naming the sample's size, what the slot holds and the
    // fixes; nothing is made.
    let toml = "[ring]\nslot_bytes = 16384\n[dataset]\nkind = \"external\"\n\
                fields = [{ name = \"images\", dtype = \"f32\", shape = [128, 128] }, \
                { name = \"labels\", dtype = \"i64\" }]\n[plan]\nbatch_size = 4\n";
    let fx = Fixture::new("nocut", toml);
    let (st, log) = wait_for(fx.daemon(&[]), "daemon", LONG);
    assert_eq!(st.code(), Some(CONFIG), "{log}");
    assert!(
        log.contains("ring.slot_bytes")
            && log.contains("one sample of 65544 bytes")
            && log.contains("kind = \"external\" cannot make part of a sample")
            && log.contains("at least 69632")
            && log.contains("smaller samples"),
        "{log}"
    );
    assert!(!fx.segment().exists());
}

/// The stderr of a one-shot command that failed: its last line is the error, plain
/// (`error: ...`, no timestamp, level or target), and no line is a log line. Returns the
/// error line.
fn plain_error(stderr: &[u8]) -> String {
    let err = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = err.lines().collect();
    let last = lines.last().copied().unwrap_or_default();
    assert!(
        last.starts_with("error: "),
        "the last line is the error:\n{err}"
    );
    for l in &lines {
        assert!(
            !looks_logged(l),
            "a log line where a plain one belongs:\n{err}"
        );
    }
    last.to_string()
}

/// `pinring ARGS` run to its end: (exit code, stderr).
fn pinring(args: &[&str]) -> (Option<i32>, Vec<u8>) {
    let out = Command::new(CLI)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    (out.status.code(), out.stderr)
}

#[test]
fn a_one_shot_commands_usage_error_is_one_plain_line_and_its_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.toml");
    let missing = missing.to_str().unwrap();
    // `config check` takes the file as --config FILE, as every other command does, or as FILE.
    for args in [
        &["config", "check", "--config", missing][..],
        &["config", "check", missing][..],
    ] {
        let (code, err) = pinring(args);
        let line = plain_error(&err);
        assert_eq!(code, Some(CONFIG), "{args:?}: {line}");
        assert_eq!(err.iter().filter(|&&b| b == b'\n').count(), 1, "{line}");
        assert!(
            line.contains(missing) && line.contains("No such file"),
            "{args:?}: {line}"
        );
    }

    let ring = format!("it-plain-nosuch-{}", std::process::id());
    let (code, err) = pinring(&["status", &ring, "--once"]);
    let line = plain_error(&err);
    assert_eq!(code, Some(RING_ERROR), "{line}");
    assert_eq!(err.iter().filter(|&&b| b == b'\n').count(), 1, "{line}");
    assert!(
        line.contains(&ring) && line.contains("does not exist") && line.contains("pinring-daemon"),
        "{line}"
    );

    let (code, err) = pinring(&["clean", "bad/name"]);
    let line = plain_error(&err);
    assert_eq!(code, Some(RING_ERROR), "{line}");
    assert!(
        line.contains("\"bad/name\"") && line.contains("is invalid: use 1-64 characters"),
        "{line}"
    );

    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[ring]\nslots = 1\n").unwrap();
    let (code, err) = pinring(&[
        "run",
        "--backend",
        "host",
        "--config",
        bad.to_str().unwrap(),
    ]);
    let line = plain_error(&err);
    assert_eq!(code, Some(CONFIG), "{line}");
    assert_eq!(err.iter().filter(|&&b| b == b'\n').count(), 1, "{line}");
    assert!(
        line.contains("ring.slots") && line.contains("between 2 and 4096"),
        "{line}"
    );

    // Before attaching: the wait is said first (a plain line too), then the error.
    let (code, err) = pinring(&["consume", "--ring", &ring, "--timeout-secs", "0.3"]);
    let line = plain_error(&err);
    assert_eq!(code, Some(RING_ERROR), "{line}");
    assert!(line.contains(&ring), "{line}");
}

/// A command waiting for a ring that does not exist says so at once, and its final error names
/// the same ring, path and wait.
fn says_what_it_waits_for(mut child: std::process::Child, ring: &str, wait: &str, plain: bool) {
    let start = Instant::now();
    let lines = stderr_lines(&mut child);
    let mut before = Vec::new();
    let (first, at) = loop {
        let (line, at) = lines.recv_timeout(LONG).expect("a waiting line on stderr");
        if line.contains("waiting for ring") {
            break (line, at);
        }
        before.push(line);
    };
    // The line came while the process was still waiting, not with its error at the end.
    assert!(
        child.try_wait().unwrap().is_none(),
        "the waiting line came only at the exit: {first}"
    );
    if plain {
        assert!(
            before.is_empty(),
            "the waiting line comes first: {before:?}"
        );
    }
    assert!(
        at - start < Duration::from_secs(5),
        "the waiting line came after {:?}",
        at - start
    );
    let path = pinring_ring::object_path(ring).display().to_string();
    let waiting = format!("waiting for ring \"{ring}\" ({path}) to appear: start its daemon");
    assert!(first.contains(&waiting), "{first}");
    assert!(
        first.contains(&format!("pinring-daemon --ring {ring}"))
            && first.contains(&format!("giving up in {wait}")),
        "{first}"
    );
    assert_eq!(looks_logged(&first), !plain, "{first}");
    let status = child.wait().unwrap();
    let rest: Vec<String> = lines.iter().map(|(l, _)| l).collect();
    assert_eq!(status.code(), Some(RING_ERROR), "{rest:?}");
    assert!(
        !rest.iter().any(|l| l.contains("waiting for ring")),
        "said once: {rest:?}"
    );
    let last = if plain {
        rest.last().cloned().unwrap_or_default()
    } else {
        rest.iter()
            .find(|l| l.contains("does not exist"))
            .cloned()
            .unwrap_or_default()
    };
    assert!(
        last.contains(&format!("ring \"{ring}\" does not exist ({path})"))
            && last.contains(&format!("waited {wait} for it to appear"))
            && last.contains(&format!("pinring-daemon --ring {ring}")),
        "{last}"
    );
    if plain {
        assert!(last.starts_with("error: "), "{last}");
    }
}

#[test]
fn consume_and_a_loader_say_at_once_which_ring_they_wait_for() {
    let ring = format!("it-waitsay-{}", std::process::id());
    let consume = cli(&["consume", "--ring", &ring, "--timeout-secs", "8"]);
    says_what_it_waits_for(consume, &ring, "8 s", true);
    // A loader logs (it is a service): the same words, as a log line.
    let loader = Command::new(LOADER)
        .args(["--ring", &ring, "--wait-secs", "8", "--log-level", "info"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    says_what_it_waits_for(loader, &ring, "8 s", false);
}
