//! End to end: `pinring run` and its children (a daemon and loaders, started from its own
//! executable). A daemon child killed mid-run is named with its signal, its stale segment is
//! removed and its loaders are stopped; a `pinring run` killed outright takes its children with
//! it (they get SIGTERM from the kernel), and the daemon still removes its segment.

mod common;

use common::*;
use nix::sys::signal::Signal;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A process identified by pid and start time (clock ticks since boot), so that a reused pid is
/// never mistaken for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Proc {
    pid: u32,
    start: u64,
}

/// State, parent pid and start time from /proc/PID/stat; None when there is no such process.
fn stat(pid: u32) -> Option<(char, u32, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses: fields after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    let ppid = fields.get(1)?.parse().ok()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((state, ppid, start))
}

impl Proc {
    fn of(pid: u32) -> Option<Proc> {
        stat(pid).map(|(_, _, start)| Proc { pid, start })
    }

    /// Still running: the same process (pid and start time), not a zombie.
    fn running(self) -> bool {
        matches!(stat(self.pid), Some((state, _, start)) if start == self.start && state != 'Z')
    }
}

/// Every running process whose parent is `parent`.
fn children_of(parent: u32) -> Vec<Proc> {
    let mut kids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        if let Some((state, ppid, start)) = stat(pid) {
            if ppid == parent && state != 'Z' {
                kids.push(Proc { pid, start });
            }
        }
    }
    kids
}

/// SIGKILLs, at the end of a test, the processes it recorded that still run (a failed test
/// leaves no daemon or loader behind).
struct KillLeftovers(Vec<Proc>);

impl Drop for KillLeftovers {
    fn drop(&mut self) {
        for p in &self.0 {
            if p.running() {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(p.pid as i32),
                    Signal::SIGKILL,
                );
            }
        }
    }
}

/// `pinring run` on the fixture's config with `loaders` loaders, long enough (thousands of
/// epochs) that it is still running whenever the test acts.
fn start_run(fx: &Fixture, loaders: usize, stderr: Stdio) -> Child {
    Command::new(exe(CLI))
        .args(["run", "--ring", &fx.ring, "--backend", "host", "--quiet"])
        .args(["--loaders", &loaders.to_string(), "--epochs", "100000"])
        .arg("--config")
        .arg(&fx.config)
        .arg("--summary")
        .arg(fx.dir.path().join("run-summary.json"))
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap()
}

/// Waits until `run`'s daemon has its ring READY, all `loaders` loaders run and batches flow;
/// returns the ring (mapped read-only) and the daemon and loader processes.
fn wait_flowing(
    fx: &Fixture,
    run: &mut Child,
    loaders: usize,
) -> (pinring_ring::Ring, Proc, Vec<Proc>) {
    let start = Instant::now();
    loop {
        if let Some(status) = run.try_wait().unwrap() {
            panic!("pinring run exited ({status}) before batches flowed");
        }
        assert!(
            start.elapsed() < LONG,
            "pinring run's ring never delivered batches with {loaders} loaders"
        );
        let kids = children_of(run.id());
        let attached = pinring_ring::attach(
            &fx.ring,
            pinring_ring::Access::ReadOnly,
            Duration::from_millis(200),
        );
        if let Ok(ring) = attached {
            let daemon_pid = ring.daemon().pid;
            let daemon = kids.iter().copied().find(|k| k.pid == daemon_pid);
            if let Some(daemon) = daemon {
                if kids.len() == loaders + 1 && delivered(&ring) >= 20 {
                    let others = kids.into_iter().filter(|k| *k != daemon).collect();
                    return (ring, daemon, others);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_daemon_child_killed_mid_run_is_named_with_its_signal_and_its_segment_removed() {
    let fx = Fixture::small("rundk");
    let mut run = start_run(&fx, 2, Stdio::piped());
    let (ring, daemon, loaders) = wait_flowing(&fx, &mut run, 2);
    let _leftovers = KillLeftovers(loaders.iter().copied().chain([daemon]).collect());
    drop(ring);
    assert!(Proc::of(daemon.pid).is_some());

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon.pid as i32),
        Signal::SIGKILL,
    )
    .unwrap();
    let (status, log) = wait_for(run, "pinring run", LONG);

    assert_eq!(status.code(), Some(5), "exit 5 (peer-died):\n{log}");
    assert!(
        log.contains(&format!("pid {}", daemon.pid)) && log.contains("SIGKILL"),
        "names the daemon and the signal:\n{log}"
    );
    assert!(
        log.contains("had been running for"),
        "says the ring was running, not that it never became ready:\n{log}"
    );
    assert!(
        !log.contains("before ring"),
        "does not claim the ring was never ready:\n{log}"
    );
    assert!(
        log.contains(&fx.segment().display().to_string()) && log.contains("removed"),
        "says the stale segment was removed:\n{log}"
    );
    assert!(
        !fx.segment().exists(),
        "the dead daemon's segment is removed"
    );
    for l in loaders {
        assert!(
            !l.running(),
            "loader {} was stopped and reaped before run exited",
            l.pid
        );
    }
}

#[test]
fn killing_pinring_run_stops_its_daemon_and_loaders_and_the_segment_is_removed() {
    let fx = Fixture::small("runrk");
    // Not piped: children that outlived run would hold the pipe open.
    let mut run = start_run(&fx, 2, Stdio::null());
    let (ring, daemon, loaders) = wait_flowing(&fx, &mut run, 2);
    drop(ring);
    let kids: Vec<Proc> = loaders.iter().copied().chain([daemon]).collect();
    let _leftovers = KillLeftovers(kids.clone());

    signal(&run, Signal::SIGKILL);
    let status = run.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9)
    );

    wait_until(
        "the daemon and loaders of the killed pinring run to exit",
        Duration::from_secs(10),
        || kids.iter().all(|k| !k.running()),
    );
    wait_until(
        "the daemon to remove its segment",
        Duration::from_secs(10),
        || !fx.segment().exists(),
    );
}

#[test]
fn killing_pinring_bench_stops_its_daemon_and_loaders_and_the_segment_is_removed() {
    let out = tempfile::tempdir().unwrap();
    let mut bench = Command::new(exe(CLI))
        .args(["bench", "--backend", "host", "--slot-sizes", "1MiB"])
        .args(["--loaders", "2", "--run-bytes", "1TiB", "--skip-modes"])
        .args(["--register-bytes", "0", "--out"])
        .arg(out.path())
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let ring_name = format!("bench-{}", bench.id());
    // The bench measures the engine alone and a warm-up run before its pipeline: a fixed amount
    // of work, whose time grows with the machine's load. The event to wait for is the pipeline
    // table's header; only from there does the wait for a flowing pipeline count.
    let (started, pipeline) = std::sync::mpsc::channel();
    let stdout = bench.stdout.take().unwrap();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if line.starts_with("pipeline (") {
                let _ = started.send(());
            }
        }
    });
    // A guard against a hang only (the measurements before the pipeline take 30-40 s on two
    // idle cores).
    if pipeline.recv_timeout(LONG * 6).is_err() {
        panic!(
            "pinring bench printed no pipeline table within {:?} (exited: {:?})",
            LONG * 6,
            bench.try_wait().unwrap()
        );
    }
    let start = Instant::now();
    let kids = loop {
        if let Some(status) = bench.try_wait().unwrap() {
            panic!("pinring bench exited ({status}) before its pipeline ran");
        }
        assert!(start.elapsed() < LONG, "pinring bench never ran a pipeline");
        let kids = children_of(bench.id());
        let flowing = pinring_ring::Ring::open(
            &ring_name,
            pinring_ring::Access::ReadOnly,
            Duration::from_millis(200),
        )
        .is_ok_and(|ring| delivered(&ring) >= 5);
        if kids.len() == 3 && flowing {
            break kids;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let _leftovers = KillLeftovers(kids.clone());
    signal(&bench, Signal::SIGKILL);
    bench.wait().unwrap();
    wait_until(
        "the daemon and loaders of the killed pinring bench to exit",
        Duration::from_secs(10),
        || kids.iter().all(|k| !k.running()),
    );
    wait_until(
        "the daemon to remove its segment",
        Duration::from_secs(10),
        || !pinring_ring::object_path(&ring_name).exists(),
    );
}

#[test]
fn sigterm_stops_pinring_bench_at_once_and_writes_the_points_done() {
    bench_stopped_by(Signal::SIGTERM, false);
}

#[test]
fn ctrl_c_to_the_process_group_stops_pinring_bench_at_once_and_writes_the_points_done() {
    // A terminal's Ctrl-C signals every process of the foreground group: the bench's children
    // get SIGINT too, and their runs end under it before the bench looks at its flag.
    bench_stopped_by(Signal::SIGINT, true);
}

/// Starts a bench of several short points, signals it (or its whole process group) once its
/// first point is printed, and checks that it stops within a second or so (3 s allowed on a
/// loaded machine), exits 0 saying it was interrupted, writes the point done to its CSV, and
/// leaves no child and no segment behind.
fn bench_stopped_by(sig: Signal, group: bool) {
    use std::io::BufRead;
    use std::os::unix::process::CommandExt;
    let out = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(exe(CLI));
    cmd.args(["bench", "--backend", "host", "--slot-sizes", "64KiB"])
        .args(["--loaders", "1,1,1,1,1,1,1,1", "--run-bytes", "256MiB"])
        .args(["--skip-modes", "--register-bytes", "0", "--out"])
        .arg(out.path())
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if group {
        cmd.process_group(0);
    }
    let mut bench = cmd.spawn().unwrap();
    let pid = nix::unistd::Pid::from_raw(bench.id() as i32);
    let ring_name = format!("bench-{}", bench.id());
    let mut lines = std::io::BufReader::new(bench.stdout.take().unwrap()).lines();
    let mut text = String::new();
    // A guard against a hang only: the engine alone and the warm-up run come first.
    let deadline = Instant::now() + LONG * 6;
    loop {
        let line = lines
            .next()
            .unwrap_or_else(|| panic!("pinring bench ended before a point:\n{text}"))
            .unwrap();
        text.push_str(&line);
        text.push('\n');
        if line.contains("[1/8 points") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no point within {:?}:\n{text}",
            LONG * 6
        );
    }
    let kids = children_of(bench.id());
    let _leftovers = KillLeftovers(kids.clone());
    let signalled = Instant::now();
    if group {
        nix::sys::signal::killpg(pid, sig).unwrap();
    } else {
        nix::sys::signal::kill(pid, sig).unwrap();
    }
    for line in lines.map_while(Result::ok) {
        text.push_str(&line);
        text.push('\n');
    }
    let status = bench.wait().unwrap();
    let took = signalled.elapsed();
    assert!(status.success(), "{status}:\n{text}");
    assert!(
        took < Duration::from_secs(3),
        "stopped {took:?} after {sig}:\n{text}"
    );
    assert!(text.contains("interrupted (SIGTERM or SIGINT)"), "{text}");
    assert!(!text.contains("report it"), "{text}");
    let csv = std::fs::read_to_string(out.path().join("bench.csv")).unwrap();
    let points = csv
        .lines()
        .filter(|l| l.starts_with("host,pipeline,") && l.split(',').nth(5) == Some("median"))
        .count();
    assert!((1..8).contains(&points), "{points} points in:\n{csv}");
    assert!(
        kids.iter().all(|k| !k.running()),
        "a child outlived the bench"
    );
    assert!(!pinring_ring::object_path(&ring_name).exists());
}
