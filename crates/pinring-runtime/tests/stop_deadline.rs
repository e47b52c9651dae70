//! `exit_if_stuck`: a process blocked in a system call that no signal interrupts still ends on
//! SIGTERM or SIGINT, with the code it was given, shortly after its grace.
//!
//! The test binary re-executes itself as the child (selected by an environment variable): the
//! child installs the flag handler and the deadline as a loader does, then blocks in `open()` of
//! a FIFO nobody writes to, which `SA_RESTART` restarts after every signal.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use pinring_runtime::shutdown::{exit_if_stuck, Shutdown};

const CHILD: &str = "PINRING_STOP_DEADLINE_CHILD";
const GRACE: Duration = Duration::from_millis(300);

/// The child: blocks forever unless the deadline ends it.
fn child(fifo: &Path) -> ! {
    let shutdown = Shutdown::install().expect("install the flag handler");
    exit_if_stuck(GRACE, 7, "test child").expect("start the deadline thread");
    println!("ready");
    // Blocks in open() until a writer comes, which none does; the flag is never looked at.
    let _ = std::fs::File::open(fifo);
    let _ = shutdown.requested();
    unreachable!("the FIFO had no writer");
}

fn stops_within(sig: Signal) {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("pipe");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let mut c = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_entry", "--nocapture"])
        .env(CHILD, &fifo)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(c.stdout.take().unwrap());
    let mut line = String::new();
    // Blocks until the child has its handlers; it prints "ready" after both are installed.
    loop {
        line.clear();
        assert_ne!(
            out.read_line(&mut line).unwrap(),
            0,
            "the child exited early"
        );
        if line.trim() == "ready" {
            break;
        }
    }
    let pid = Pid::from_raw(c.id() as i32);
    let t = Instant::now();
    kill(pid, sig).unwrap();
    // Generous bound: a missing deadline would leave the child blocked for ever.
    let limit = Duration::from_secs(20);
    let status = loop {
        if let Some(s) = c.try_wait().unwrap() {
            break s;
        }
        if t.elapsed() > limit {
            let _ = kill(pid, Signal::SIGKILL);
            let _ = c.wait();
            panic!("the child was still blocked {limit:?} after {sig}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(
        t.elapsed() >= GRACE,
        "it exited before its grace: {:?}",
        t.elapsed()
    );
    assert_eq!(status.code(), Some(7), "{status:?}");
}

#[test]
fn child_entry() {
    if let Some(fifo) = std::env::var_os(CHILD) {
        child(Path::new(&fifo));
    }
}

#[test]
fn a_process_blocked_in_open_ends_on_sigterm_after_its_grace() {
    stops_within(Signal::SIGTERM);
}

#[test]
fn a_process_blocked_in_open_ends_on_sigint_after_its_grace() {
    stops_within(Signal::SIGINT);
}
