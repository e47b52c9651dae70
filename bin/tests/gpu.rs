//! The cuda backend, end to end: registration, uploads from the slots, the device-side verify
//! sink, zero-copy, the pageable baseline, device selection. Where no NVIDIA driver and device are
//! present each test prints `SKIPPED: <reason>` and passes; with `PINRING_REQUIRE_GPU=1` (set by
//! scripts/gpu-host-check.sh) it fails instead. On a GPU host: see docs/BENCHMARKS.md (the test
//! executables run there with `PINRING_BIN_DIR` pointing at the release binaries).

mod common;

use common::*;
use std::process::Command;
use std::time::Duration;

/// The GPU, or `None` after printing `SKIPPED: <reason>` (a failure with
/// `PINRING_REQUIRE_GPU=1`).
fn gpu() -> Option<String> {
    pinring_backend::testing::gpu()
}

fn cuda_run(tag: &str, extra: &[&str]) -> pinring_daemon::summary::Summary {
    let fx = Fixture::small(tag);
    let mut daemon = fx.daemon_on("cuda", extra);
    let ring = fx.wait_ready(&mut daemon);
    let loaders = loaders_attached(&fx, &daemon, &ring, 4);
    drop(ring);
    all_exit_cleanly(daemon, loaders);
    let s = fx.summary();
    assert_eq!(s.backend, "cuda", "{s:#?}");
    s
}

#[test]
fn cuda_uploads_from_registered_slots_and_the_device_copy_verifies() {
    if gpu().is_none() {
        return;
    }
    let s = cuda_run("gpu-verify", &[]);
    assert_complete(&s, true);
    assert!(s.registered);
    assert!(s.registration_seconds > 0.0, "{s:#?}");
}

#[test]
fn cuda_zero_copy_verifies_every_batch_through_the_mapped_slot() {
    if gpu().is_none() {
        return;
    }
    let s = cuda_run("gpu-zc", &["--zero-copy"]);
    assert_complete(&s, true);
    assert!(s.zero_copy);
}

#[test]
fn cuda_pageable_baseline_still_delivers_every_byte() {
    if gpu().is_none() {
        return;
    }
    let s = cuda_run("gpu-page", &["--no-register"]);
    assert_complete(&s, true);
    assert!(!s.registered);
}

#[test]
fn cuda_compute_sink_runs_over_every_batch() {
    if gpu().is_none() {
        return;
    }
    for (tag, extra) in [
        ("gpu-comp", &["--sink", "compute"][..]),
        ("gpu-zccomp", &["--sink", "compute", "--zero-copy"][..]),
    ] {
        let s = cuda_run(tag, extra);
        assert_eq!(s.batches_delivered, 128, "{tag}");
        assert_eq!(
            (s.duplicates, s.out_of_order, s.missing),
            (0, 0, 0),
            "{tag}"
        );
    }
}

#[test]
fn a_missing_device_is_a_backend_error_naming_it() {
    if gpu().is_none() {
        return;
    }
    let fx = Fixture::small("gpu-dev");
    let (st, log) = wait_for(
        fx.daemon_on("cuda", &["--device", "99"]),
        "daemon",
        Duration::from_secs(30),
    );
    assert_eq!(st.code(), Some(7), "{log}");
    assert!(log.contains("99"), "{log}");
    assert!(!fx.segment().exists(), "no ring is left behind");
}

#[test]
fn backend_cuda_without_a_gpu_fails_clearly_and_auto_falls_back() {
    if !pinring_backend::testing::no_gpu() {
        return;
    }
    let fx = Fixture::small("nogpu");
    let (st, log) = wait_for(fx.daemon_on("cuda", &[]), "daemon", Duration::from_secs(30));
    assert_eq!(st.code(), Some(7), "{log}");
    assert!(
        log.contains("driver") && log.contains("--backend host"),
        "{log}"
    );
    assert!(!fx.segment().exists());
    // auto picks host and says why.
    let out = Command::new(exe(CLI))
        .args(["run", "--quiet", "--loaders", "2", "--ring", &fx.ring])
        .arg("--config")
        .arg(&fx.config)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("backend host (host: no NVIDIA driver"),
        "{text}"
    );
}

/// A trainer that copies (`daemon.copies = "consumer"`) shares one completion event among the
/// batches it takes in a row; one that takes a batch and then computes without asking for the
/// next must still get the batch's slots back, from its release thread, not at its next call.
#[test]
fn a_trainer_holding_one_batch_gives_its_slots_back_without_asking_for_another() {
    if gpu().is_none() {
        return;
    }
    use pinring_client::{AttachOptions, Consumer};
    use pinring_ring::handoff::buffer_state;
    let fx = Fixture::new(
        "gpu-hold1",
        &format!("{SMALL}\n[daemon]\nprefetch = 4\ncopies = \"consumer\"\n"),
    );
    let mut daemon = fx.daemon_on("cuda", &["--sink", "consumer"]);
    let ring = fx.wait_ready(&mut daemon);
    let loaders = loaders_attached(&fx, &daemon, &ring, 4);
    let mut c = Consumer::attach(&fx.ring, &AttachOptions::default()).unwrap();
    let buffers = ring.geometry().handoff.unwrap().buffers;
    let taken = |c: &Consumer| {
        (0..buffers)
            .filter(|&i| c.ring().buffer_word(i).state == buffer_state::TAKEN)
            .count()
    };
    // Three times: take one batch, keep it, ask for nothing: its descriptor comes back.
    let mut held = Vec::new();
    for _ in 0..3 {
        let b = c.next_batch(Some(LONG)).unwrap().expect("a batch");
        wait_until(
            "the held batch's descriptor to be given back",
            Duration::from_secs(5),
            || taken(&c) == 0,
        );
        held.push(b);
    }
    drop(held);
    let mut n = 3;
    while let Some(b) = c.next_batch(Some(LONG)).unwrap() {
        drop(b);
        n += 1;
    }
    assert_eq!(n, 128);
    drop(c);
    drop(ring);
    all_exit_cleanly(daemon, loaders);
    let s = fx.summary();
    assert_eq!(
        (s.batches_delivered, s.duplicates, s.out_of_order, s.missing),
        (128, 0, 0, 0),
        "{s:#?}"
    );
}
