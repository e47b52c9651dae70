//! End to end: logging never takes a pinring process down. A daemon or loader whose stderr is a
//! pipe nobody reads any more (`pinring daemon 2>&1 | head -c 10`) loses its log lines and
//! nothing else: it runs its plan to the end, exits 0 and removes its segment.

mod common;

use common::*;
use std::process::{Command, Stdio};

#[test]
fn a_daemon_and_a_loader_whose_stderr_pipe_was_closed_finish_the_plan_and_exit_0() {
    let fx = Fixture::small("epipe");
    // `info` so that both write log lines (the ring is ready, attached, run finished, detached)
    // into their closed pipes, whatever RUST_LOG the test runs under.
    let mut daemon = fx.daemon(&["--log-level", "info"]);
    drop(daemon.stderr.take());
    drop(daemon.stdout.take());
    fx.wait_ready(&mut daemon);
    let mut loader = fx.loader_with(&fx.config, &["--log-level", "info"]);
    drop(loader.stderr.take());
    drop(loader.stdout.take());

    let (status, _) = wait_for(daemon, "daemon", LONG);
    assert_eq!(
        status.code(),
        Some(0),
        "the daemon must finish its plan although its stderr pipe is closed: {status}"
    );
    let (status, _) = wait_for(loader, "loader", LONG);
    assert_eq!(
        status.code(),
        Some(0),
        "the loader must finish although its stderr pipe is closed: {status}"
    );
    assert_complete(&fx.summary(), true);
    assert!(
        !fx.segment().exists(),
        "the daemon removes its segment at exit"
    );
}

#[test]
fn pinring_run_with_closed_stdout_and_stderr_pipes_finishes_and_exits_0() {
    let fx = Fixture::small("runpipe");
    let summary = fx.dir.path().join("run-summary.json");
    // RUST_LOG=info: the children log their info lines too (run quiets them to warnings only
    // when RUST_LOG is unset), all into the same closed pipe.
    let mut run = Command::new(exe(CLI))
        .args([
            "run",
            "--ring",
            &fx.ring,
            "--backend",
            "host",
            "--loaders",
            "2",
        ])
        .arg("--config")
        .arg(&fx.config)
        .arg("--summary")
        .arg(&summary)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(run.stdout.take());
    drop(run.stderr.take());
    let (status, _) = wait_for(run, "pinring run", LONG);
    assert_eq!(
        status.code(),
        Some(0),
        "pinring run must finish although nobody reads its output: {status}"
    );
    let s = pinring_daemon::summary::Summary::read(&summary).expect("summary written");
    assert_complete(&s, true);
    assert!(!fx.segment().exists(), "the segment is removed at exit");
}
