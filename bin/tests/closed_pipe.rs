//! End to end: every command whose standard output is a pipe nobody reads any more (`pinring
//! config check | head -c1`) ends quietly with its own exit code: no panic, no "Broken pipe".
//! docs/RELIABILITY.md, "Output files".

mod common;

use common::*;
use std::os::fd::OwnedFd;
use std::process::{Command, Stdio};

/// Runs `pinring ARGS` twice: with stdout a pipe that is read, and with stdout a pipe whose
/// reading end is already closed. Returns both exit codes and the second run's stderr.
fn both_ways(args: &[&str]) -> (Option<i32>, Option<i32>, String) {
    let open = Command::new(exe(CLI))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (read, write): (OwnedFd, OwnedFd) = nix::unistd::pipe().unwrap();
    drop(read);
    let closed = Command::new(exe(CLI))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::from(write))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (status, err) = wait_for(closed, "pinring with a closed stdout", LONG);
    (open.status.code(), status.code(), err)
}

#[test]
fn every_command_ends_quietly_on_a_closed_pipe_with_its_own_exit_code() {
    let fx = Fixture::small("epipe");
    let config = fx.config.display().to_string();
    let absent = format!("it-epipe-absent-{}", std::process::id());
    let cases: Vec<Vec<&str>> = vec![
        vec!["config", "check"],
        vec!["config", "check", &config],
        vec!["--help"],
        vec!["--version"],
        vec!["status", "--help"],
        vec!["status", &absent, "--json"],
        vec!["clean", &absent],
        vec![
            "run",
            "--config",
            &config,
            "--ring",
            &fx.ring,
            "--backend",
            "host",
            "--quiet",
            "--loaders",
            "1",
            "--epochs",
            "1",
        ],
        vec!["consume", "--ring", &absent, "--timeout-secs", "0.2"],
    ];
    for args in cases {
        let (open, closed, err) = both_ways(&args);
        assert_eq!(open, closed, "{args:?}: {err}");
        assert!(
            !err.contains("panicked") && !err.contains("Broken pipe"),
            "{args:?}: {err}"
        );
    }
}
