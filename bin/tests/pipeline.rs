//! End to end: the real daemon and loader binaries on the host backend with the verify sink.

mod common;

use common::*;
use nix::sys::signal::Signal;
use std::time::{Duration, Instant};

fn run_with_loaders(tag: &str, loaders: usize, extra: &[&str], in_order: bool) {
    run_config(tag, SMALL, 1, loaders, extra, in_order);
}

/// Runs `toml` (2 epochs of 64 batches of `parts` parts each) with `loaders` loaders and checks
/// that every batch was delivered once (in order when `in_order`), every byte verified.
fn run_config(tag: &str, toml: &str, parts: u64, loaders: usize, extra: &[&str], in_order: bool) {
    run_batches(tag, toml, 128, parts, loaders, extra, in_order);
}

/// Runs `toml` (`batches` batches of `parts` parts each) with `loaders` loaders and checks that
/// every batch was delivered once (in order when `in_order`), every byte verified.
fn run_batches(
    tag: &str,
    toml: &str,
    batches: u64,
    parts: u64,
    loaders: usize,
    extra: &[&str],
    in_order: bool,
) -> pinring_daemon::summary::Summary {
    let fx = Fixture::new(tag, toml);
    let mut daemon = fx.daemon(extra);
    let ring = fx.wait_ready(&mut daemon);
    // Every loader attaches before the run can end, however fast the machine (see the helper).
    let kids = loaders_attached(&fx, &daemon, &ring, loaders);
    drop(ring);
    let (status, log) = wait_for(daemon, "daemon", LONG);
    assert!(status.success(), "daemon failed: {status}\n{log}");
    for (i, k) in kids.into_iter().enumerate() {
        let (st, log) = wait_for(k, "loader", LONG);
        assert!(st.success(), "loader {i} failed: {st}\n{log}");
    }
    let s = fx.summary();
    assert_complete(&s, in_order);
    assert_eq!(s.parts_per_batch, parts, "{s:#?}");
    assert_eq!(
        s.end_seq,
        batches * parts,
        "{batches} batches of {parts} parts"
    );
    assert_eq!(s.batches_delivered, batches, "{s:#?}");
    // The first batch's latency is reported, and lies within the run.
    let first = s
        .first_batch_seconds
        .expect("a run that delivered reports its first batch");
    assert!(first > 0.0 && first <= s.seconds, "{s:#?}");
    // The main loop's time inside submit calls is measured and lies within the run (zero-copy
    // runs submit nothing: the sink reads the slots in place).
    assert!(
        (s.zero_copy || s.submit_seconds > 0.0) && s.submit_seconds <= s.seconds,
        "{s:#?}"
    );
    assert!(
        !fx.segment().exists(),
        "the daemon removes its segment at exit"
    );
    s
}

/// 6 samples of 24 MiB (u8), one per batch, every slot setting automatic: over the 4 MiB part
/// limit, so each sample is cut into 6 byte parts of 4 MiB, in slots of 4 MiB + 4 KiB.
const ONE_HUGE_SAMPLE: &str = r#"
[dataset]
samples = 6
sample_shape = [24, 1048576]
dtype = "u8"
seed = 5
[plan]
batch_size = 1
epochs = 2
"#;

#[test]
fn a_sample_cut_into_byte_parts_by_several_loaders_is_delivered_whole_once_in_order() {
    let s = run_batches("bytes1", ONE_HUGE_SAMPLE, 12, 6, 4, &[], true);
    // Every byte of every sample and its label, once.
    assert_eq!(s.bytes, 12 * ((24 << 20) + 8), "{s:#?}");
}

#[test]
fn samples_cut_into_byte_parts_unordered_are_delivered_whole_exactly_once() {
    run_batches("bytesu", ONE_HUGE_SAMPLE, 12, 6, 4, &["--unordered"], false);
}

#[test]
fn batches_of_several_cut_samples_and_a_short_last_batch_are_delivered_whole() {
    // 5 samples of 5 MiB in batches of 2: each sample in a 4 MiB and a 1 MiB byte part, 4 parts
    // a batch; the last batch of each epoch has one sample and 2 empty parts.
    let toml = ONE_HUGE_SAMPLE
        .replace("samples = 6", "samples = 5")
        .replace("[24, 1048576]", "[5, 1048576]")
        .replace("batch_size = 1", "batch_size = 2");
    let s = run_batches("bytesb", &toml, 6, 4, 3, &[], true);
    assert_eq!(s.bytes, 2 * 5 * ((5 << 20) + 8), "{s:#?}");
}

#[test]
fn one_loader_delivers_every_batch_once_in_order() {
    run_with_loaders("l1", 1, &[], true);
}

#[test]
fn four_loaders_deliver_every_batch_once_in_order() {
    run_with_loaders("l4", 4, &[], true);
}

#[test]
fn eight_loaders_deliver_every_batch_once_in_order() {
    run_with_loaders("l8", 8, &[], true);
}

#[test]
fn unordered_mode_delivers_every_batch_exactly_once() {
    run_with_loaders("unord", 4, &["--unordered"], false);
}

#[test]
fn batches_spanning_four_slots_with_one_loader_are_delivered_whole_once_in_order() {
    run_config("span1", &spanning(), 4, 1, &[], true);
}

#[test]
fn batches_spanning_four_slots_with_four_loaders_are_delivered_whole_once_in_order() {
    run_config("span4", &spanning(), 4, 4, &[], true);
}

#[test]
fn batches_spanning_four_slots_with_eight_loaders_are_delivered_whole_once_in_order() {
    run_config("span8", &spanning(), 4, 8, &[], true);
}

#[test]
fn batches_spanning_four_slots_unordered_are_delivered_whole_exactly_once() {
    run_config("spanu", &spanning(), 4, 4, &["--unordered"], false);
}

#[test]
fn batches_spanning_four_slots_uploaded_ahead_are_delivered_whole_once_in_order() {
    // Slots below 256 KiB do not look ahead by default: asked for, parts of later batches go
    // up while an earlier part is still being made, and their batches wait for their turn.
    run_config(
        "spanahead",
        &spanning(),
        4,
        8,
        &["--look-ahead", "16"],
        true,
    );
    run_with_loaders("ahead8", 8, &["--look-ahead", "16"], true);
}

#[test]
fn a_short_last_batch_spanning_slots_commits_its_empty_parts_and_is_delivered_whole() {
    // 509 samples: the last batch of each epoch has 5 samples, in parts of 2, 2, 1 and 0.
    let toml = spanning().replace("samples = 512", "samples = 509");
    run_config("spanshort", &toml, 4, 4, &[], true);
}

/// 512 samples of 640 KiB (u8), batches of 8 (5 MiB) with every slot setting automatic: over
/// 4 MiB, so "auto" cuts each batch into 2 parts of 4 samples in slots of 2.5 MiB + 4 KiB.
const AUTO_SPANNING: &str = r#"
[dataset]
samples = 512
sample_shape = [1024, 640]
dtype = "u8"
seed = 7
[plan]
batch_size = 8
epochs = 2
"#;

#[test]
fn loaders_with_auto_slots_adopt_the_daemons_resolved_layout_and_deliver_every_byte() {
    let fx = Fixture::new("autoslots", AUTO_SPANNING);
    // The daemon resolves "auto" for a 200 MiB cache: a ring of about 100 MiB. The loaders,
    // with the same "auto" config, never see that cache size: they adopt the ring's layout.
    let mut daemon = fx.daemon_env("host", &[], &[("PINRING_LLC_BYTES", "200MiB")]);
    let ring = fx.wait_ready(&mut daemon);
    let slot = (5 << 19) + 4096;
    assert_eq!(ring.geometry().slot_bytes, slot);
    assert_eq!(
        ring.geometry().slot_count,
        40,
        "100 MiB / (2.5 MiB + 4 KiB), rounded"
    );
    let kids = loaders_attached(&fx, &daemon, &ring, 3);
    drop(ring);
    let (status, log) = wait_for(daemon, "daemon", LONG);
    assert!(status.success(), "daemon failed: {status}\n{log}");
    assert!(log.contains("resolved to 40 slots"), "{log}");
    for (i, k) in kids.into_iter().enumerate() {
        let (st, log) = wait_for(k, "loader", LONG);
        assert!(st.success(), "loader {i} failed: {st}\n{log}");
    }
    let s = fx.summary();
    assert_complete(&s, true);
    assert_eq!(s.parts_per_batch, 2, "{s:#?}");
    assert_eq!(s.end_seq, 256, "2 epochs of 64 batches of 2 parts");
    assert_eq!(s.batches_delivered, 128, "{s:#?}");
    assert_eq!(s.batches_verified, 128, "every byte verified: {s:#?}");
    // Every sample's images and its 8-byte label.
    assert_eq!(s.bytes, 128 * 8 * (640 * 1024 + 8), "{s:#?}");
}

#[test]
fn a_loader_with_auto_slots_adopts_the_explicit_slot_size_of_its_daemon() {
    // The daemon runs an explicit 1 MiB + 4 KiB slot (one sample per part); a loader whose config
    // says "auto" adopts that slot size and so the same layout: it attaches and works.
    let explicit = format!("[ring]\nslot_bytes = {}\n{AUTO_SPANNING}", (1 << 20) + 4096);
    let fx = Fixture::new("autoadopt", &explicit);
    let mut daemon = fx.daemon(&["--epochs", "1"]);
    let ring = fx.wait_ready(&mut daemon);
    let auto = fx.dir.path().join("auto.toml");
    std::fs::write(&auto, AUTO_SPANNING).unwrap();
    let kid = {
        let _held = Paused::new(&daemon);
        let k = fx.loader(&auto);
        wait_attached(&ring, &k);
        k
    };
    drop(ring);
    let (status, log) = wait_for(daemon, "daemon", LONG);
    assert!(status.success(), "daemon failed: {status}\n{log}");
    let (st, log) = wait_for(kid, "loader", LONG);
    assert!(st.success(), "loader failed: {st}\n{log}");
    let s = fx.summary();
    assert_complete(&s, true);
    assert_eq!(s.parts_per_batch, 8, "{s:#?}");
    assert_eq!(s.batches_verified, 64, "{s:#?}");
}

#[test]
fn a_loader_that_joins_late_takes_work() {
    // A plan longer than the test: the late loader joins while most of it is still ahead, and
    // the run is drained once it has made batches.
    let fx = Fixture::small("late");
    let mut daemon = fx.daemon(&["--epochs", "100000"]);
    let ring = fx.wait_ready(&mut daemon);
    let first = fx.loader(&fx.config);
    wait_until("deliveries with one loader", LONG, || {
        delivered(&ring) >= 10
    });
    let late = fx.loader(&fx.config);
    wait_until("the late loader to commit batches", LONG, || {
        ring.loaders()
            .iter()
            .any(|l| l.pid == late.id() && l.batches >= 3)
    });
    drop(ring);
    signal(&daemon, Signal::SIGTERM);
    let (status, log) = wait_for(daemon, "daemon", LONG);
    assert!(status.success(), "{log}");
    let (st1, _) = wait_for(first, "first loader", LONG);
    let (st2, log2) = wait_for(late, "late loader", LONG);
    assert!(st1.success() && st2.success(), "{log2}");
    let made: u64 = log2
        .split("batches=")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("the loader logs its batch count");
    assert!(made >= 3, "the late loader made {made} batches:\n{log2}");
    assert_drained(&fx.summary());
}

#[test]
fn sigterm_drains_and_leaves_no_segment() {
    let fx = Fixture::small("term");
    let mut daemon = fx.daemon(&["--epochs", "1000"]);
    let ring = fx.wait_ready(&mut daemon);
    let loaders: Vec<_> = (0..2).map(|_| fx.loader(&fx.config)).collect();
    // Both loaders joined before the stop (on a loaded machine one may start after the other
    // made 20 batches, and a loader that finds its ring already gone exits 4, rightly).
    for l in &loaders {
        wait_attached(&ring, l);
    }
    let start = Instant::now();
    while ring
        .header()
        .delivered
        .load(std::sync::atomic::Ordering::Relaxed)
        < 20
    {
        assert!(start.elapsed() < LONG, "no progress");
        std::thread::sleep(Duration::from_millis(5));
    }
    signal(&daemon, Signal::SIGTERM);
    let t = Instant::now();
    let (status, log) = wait_for(daemon, "daemon", LONG);
    // The drain takes at most DRAIN_DEADLINE (1.5 s); 20 s allows a loaded machine.
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "drain took {:?}",
        t.elapsed()
    );
    assert!(status.success(), "{log}");
    loaders_exit_cleanly(loaders);
    assert!(!fx.segment().exists());
    let s = fx.summary();
    assert!(s.interrupted);
    assert_eq!(
        (s.verify_failures, s.duplicates, s.out_of_order),
        (0, 0, 0),
        "{s:#?}"
    );
    assert!(s.batches_delivered >= 20);
    assert_eq!(
        s.resume_seq, s.batches_delivered,
        "in order: resume right after the last"
    );
}

#[test]
fn sigint_to_a_loader_makes_it_exit_cleanly() {
    let fx = Fixture::small("lint");
    let mut daemon = fx.daemon(&["--epochs", "1000"]);
    let ring = fx.wait_ready(&mut daemon);
    let loader = fx.loader(&fx.config);
    let start = Instant::now();
    while ring
        .header()
        .delivered
        .load(std::sync::atomic::Ordering::Relaxed)
        < 5
    {
        assert!(start.elapsed() < LONG, "no progress");
        std::thread::sleep(Duration::from_millis(5));
    }
    signal(&loader, Signal::SIGINT);
    let (st, log) = wait_for(loader, "loader", LONG);
    assert!(st.success(), "{log}");
    signal(&daemon, Signal::SIGTERM);
    let (st, log) = wait_for(daemon, "daemon", LONG);
    assert!(st.success(), "{log}");
}

/// Whether `child` has a handler installed for `sig` (/proc/PID/status, SigCgt).
fn catches(child: &std::process::Child, sig: Signal) -> bool {
    let status =
        std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (sig as u64 - 1)) != 0)
}

#[test]
fn sigterm_to_a_loader_waiting_for_its_ring_makes_it_exit_at_once() {
    // Two rings a loader waits for: one that does not exist yet, and one whose daemon was
    // SIGKILLed (the segment stays, the loader waits for the next daemon).
    let absent = Fixture::small("lwait");
    let stale = Fixture::small("lstale");
    let mut daemon = stale.daemon(&["--epochs", "1000"]);
    stale.wait_ready(&mut daemon);
    signal(&daemon, Signal::SIGKILL);
    let _ = daemon.wait();
    assert!(stale.segment().exists());

    for fx in [&absent, &stale] {
        // --wait-secs 20: far longer than the deadline below.
        let loader = fx.loader(&fx.config);
        wait_until(
            "the loader's SIGTERM handler",
            Duration::from_secs(10),
            || catches(&loader, Signal::SIGTERM),
        );
        signal(&loader, Signal::SIGTERM);
        let (st, log) = wait_for(loader, "waiting loader", LONG);
        assert_eq!(st.code(), Some(0), "{}: {log}", fx.ring);
    }
}

#[test]
fn zero_copy_mode_verifies_every_batch_in_its_slot() {
    run_with_loaders("zc", 3, &["--zero-copy"], true);
}

#[test]
fn the_compute_sink_and_the_pageable_mode_run_the_whole_plan() {
    for (tag, extra) in [
        ("compute", &["--sink", "compute"][..]),
        ("nreg", &["--no-register"][..]),
        ("zccomp", &["--zero-copy", "--sink", "compute"][..]),
    ] {
        let fx = Fixture::small(tag);
        let mut daemon = fx.daemon(extra);
        fx.wait_ready(&mut daemon);
        let loader = fx.loader(&fx.config);
        let (status, log) = wait_for(daemon, "daemon", LONG);
        assert!(status.success(), "{tag}: {log}");
        let (st, _) = wait_for(loader, "loader", LONG);
        assert!(st.success());
        let s = fx.summary();
        assert_eq!(s.batches_delivered, 128, "{tag}: {s:#?}");
        assert_eq!(
            (s.duplicates, s.out_of_order, s.missing),
            (0, 0, 0),
            "{tag}"
        );
        assert!(s.latency_p99_us >= s.latency_p50_us, "{tag}");
        // The main loop's books: it ran, and slept at most once a pass.
        assert!(
            s.main_loop_passes > 0 && s.main_loop_sleeps <= s.main_loop_passes,
            "{tag}: {} passes, {} sleeps",
            s.main_loop_passes,
            s.main_loop_sleeps
        );
    }
}
