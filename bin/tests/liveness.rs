//! Liveness the kernel vouches for, end to end with the real binaries (docs/RELIABILITY.md,
//! "liveness"): a FIFO at a ring's path, header scribbles on a live ring, a loader in another PID
//! namespace, the segment truncated under load, and invalid names given to `pinring clean`.

mod common;

use common::*;
use nix::sys::signal::Signal;
use pinring_ring::layout::ring_state;
use pinring_ring::{Access, Ring};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

const RING_ERROR: i32 = 4;

#[test]
fn a_fifo_at_the_ring_path_stalls_no_tool_and_each_refuses_it_with_exit_4() {
    let fx = Fixture::small("fifo");
    nix::unistd::mkfifo(
        &fx.segment(),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    let quick = Duration::from_secs(10);
    let (st, log) = wait_for(
        cli(&["status", &fx.ring, "--once"]),
        "pinring status",
        quick,
    );
    assert_eq!(st.code(), Some(RING_ERROR), "{log}");
    assert!(log.contains("a FIFO"), "{log}");
    // Every ring: the FIFO is listed with its reason, not waited on.
    let (_, log) = wait_for(cli(&["status", "--once"]), "pinring status (all)", quick);
    assert!(log.contains(&fx.ring) && log.contains("a FIFO"), "{log}");
    let (st, log) = wait_for(cli(&["clean", &fx.ring]), "pinring clean", quick);
    assert_eq!(st.code(), Some(0), "{log}");
    assert!(log.contains("keep") && log.contains("a FIFO"), "{log}");
    let (st, log) = wait_for(fx.daemon(&[]), "pinring-daemon", quick);
    assert_eq!(st.code(), Some(RING_ERROR), "{log}");
    assert!(log.contains("a FIFO") && log.contains("--replace"), "{log}");
    let (st, log) = wait_for(fx.loader(&fx.config), "pinring-loader", quick);
    assert_eq!(st.code(), Some(RING_ERROR), "{log}");
    assert!(log.contains("a FIFO"), "{log}");
    // --replace takes the path over, and the run completes.
    let mut daemon = fx.daemon(&["--replace"]);
    fx.wait_ready(&mut daemon);
    let loader = fx.loader(&fx.config);
    let (st, log) = wait_for(daemon, "daemon", LONG);
    assert_eq!(st.code(), Some(0), "{log}");
    assert!(log.contains("replaced a FIFO"), "{log}");
    wait_for(loader, "loader", LONG);
    assert_complete(&fx.summary(), true);
}

#[test]
fn header_scribbles_on_a_live_ring_fool_no_loader_status_clean_or_second_daemon() {
    let fx = Fixture::small("scribble");
    let mut daemon = fx.daemon(&["--epochs", "100000"]);
    let ring = fx.wait_ready(&mut daemon);
    let loaders: Vec<_> = (0..2).map(|_| fx.loader(&fx.config)).collect();
    wait_until("deliveries", LONG, || delivered(&ring) >= 20);
    let daemon_pid = ring.daemon().pid;

    // One rogue write of each field the old liveness read: pid, start time, state.
    let rogue = Ring::open(&fx.ring, Access::ReadWrite, Duration::from_secs(5)).unwrap();
    let h = rogue.header();
    h.daemon_pid.store(0x7fff_fff0, Relaxed);
    h.daemon_start_time.store(1, Relaxed);
    h.state.store(ring_state::CLOSED, Relaxed);

    let (st, log) = wait_for(
        cli(&["status", &fx.ring, "--json"]),
        "status",
        Duration::from_secs(10),
    );
    assert_eq!(st.code(), Some(0), "{log}");
    let json: serde_json::Value =
        serde_json::from_str(log.trim_start_matches(|c| c != '[' && c != '{')).unwrap();
    let report = if json.is_array() { &json[0] } else { &json };
    assert_eq!(report["snapshot"]["daemon_alive"], true, "{log}");
    let (st, log) = wait_for(cli(&["clean", &fx.ring]), "clean", LONG);
    assert_eq!(st.code(), Some(0), "{log}");
    assert!(log.contains("keep"), "{log}");
    assert!(fx.segment().exists(), "clean kept the live ring");
    let (st, log) = wait_for(fx.daemon(&[]), "second daemon", LONG);
    assert_eq!(st.code(), Some(RING_ERROR), "{log}");
    assert!(log.contains("held by a running daemon"), "{log}");

    // The daemon restores its fields; loaders go on working; nobody exits.
    wait_until("the header restored", LONG, || {
        h.state.load(Relaxed) == ring_state::READY && h.daemon_pid.load(Relaxed) == daemon_pid
    });
    let before = delivered(&ring);
    wait_until("deliveries after the scribble", LONG, || {
        delivered(&ring) >= before + 20
    });
    assert!(daemon.try_wait().unwrap().is_none(), "the daemon runs on");
    assert!(ring.health().header_repairs.load(Relaxed) >= 1);

    signal(&daemon, Signal::SIGTERM);
    let (st, log) = wait_for(daemon, "daemon", LONG);
    assert_eq!(st.code(), Some(0), "{log}");
    assert!(log.contains("restored"), "the repair is logged: {log}");
    loaders_exit_cleanly(loaders);
    let s = fx.summary();
    assert_eq!((s.duplicates, s.verify_failures, s.out_of_order), (0, 0, 0));
}

#[test]
fn a_loader_in_another_pid_namespace_is_never_taken_for_dead() {
    if !nix::unistd::geteuid().is_root() || which("unshare").is_none() {
        eprintln!("SKIPPED: a new PID namespace needs root and unshare(1)");
        return;
    }
    // Frequent reaps: every pass would free the loader's claims if its pid (1 in its own
    // namespace) were looked up in /proc.
    let fx = Fixture::new(
        "pidns",
        &format!("{SMALL}\n[daemon]\nreap_interval_ms = 10\n"),
    );
    let mut daemon = fx.daemon(&["--epochs", "40"]);
    fx.wait_ready(&mut daemon);
    let loader = Command::new("unshare")
        .args(["--pid", "--fork", "--kill-child"])
        .arg(exe(LOADER))
        .args(["--ring", &fx.ring, "--wait-secs", "20", "--config"])
        .arg(&fx.config)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (st, log) = wait_for(daemon, "daemon", LONG);
    assert_eq!(st.code(), Some(0), "{log}");
    let (lst, llog) = wait_for(loader, "loader", LONG);
    assert_eq!(lst.code(), Some(0), "{llog}");
    assert!(llog.contains("pid=1"), "the loader ran as pid 1: {llog}");
    let s = fx.summary();
    assert_complete(&s, true);
    assert_eq!(s.reclaimed, 0, "a live loader's slot was reclaimed: {s:#?}");
    assert!(!llog.contains("reclaimed"), "{llog}");
}

#[test]
fn truncating_the_segment_under_load_ends_the_daemon_with_exit_4_and_removes_it() {
    let fx = Fixture::small("truncate");
    let mut daemon = fx.daemon(&["--epochs", "100000"]);
    let ring = fx.wait_ready(&mut daemon);
    let loaders: Vec<_> = (0..2).map(|_| fx.loader(&fx.config)).collect();
    wait_until("deliveries", LONG, || delivered(&ring) >= 20);
    // Both loaders attached before the fault: one that had not would wait for a ring that no
    // longer exists, for its whole --wait-secs, which this test does not mean to check.
    wait_until("both loaders attached", LONG, || {
        loaders
            .iter()
            .all(|l| loader_index(&ring, l.id()).is_some())
    });
    drop(ring);
    std::fs::OpenOptions::new()
        .write(true)
        .open(fx.segment())
        .unwrap()
        .set_len(4096)
        .unwrap();
    let (st, log) = wait_for(daemon, "daemon", LONG);
    assert_eq!(st.code(), Some(RING_ERROR), "{st:?}: {log}");
    assert!(
        log.contains("truncated"),
        "the message names the fault: {log}"
    );
    wait_until("the segment removed", Duration::from_secs(5), || {
        !fx.segment().exists()
    });
    // The run ended after the ring was ready: its summary is written, with the resume point,
    // and stderr says where to resume too.
    let s = fx.summary();
    assert_eq!(s.exit_code, RING_ERROR as u8, "{s:#?}");
    assert!(s.parts_delivered >= 20, "{s:#?}");
    assert_eq!(s.resume_seq, s.start_seq + s.parts_delivered, "{s:#?}");
    assert_eq!((s.duplicates, s.verify_failures), (0, 0), "{s:#?}");
    assert!(
        log.contains(&format!("resume with --start-seq {}", s.resume_seq)),
        "{log}"
    );
    for l in loaders {
        let (st, log) = wait_for(l, "loader", LONG);
        // A loader faults on the truncated pages itself (4) or sees its daemon gone first (5);
        // never a signal.
        assert!(matches!(st.code(), Some(4) | Some(5)), "{st:?}: {log}");
    }
}

#[test]
fn clean_refuses_invalid_names_with_exit_4() {
    for bad in ["a/b", "..", ""] {
        let (st, log) = wait_for(cli(&["clean", bad]), "clean", LONG);
        assert_eq!(st.code(), Some(RING_ERROR), "{bad:?}: {log}");
        assert!(log.contains("is invalid"), "{bad:?}: {log}");
    }
}

fn which(cmd: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| std::path::Path::new(d).join(cmd))
        .find(|p| p.exists())
}
