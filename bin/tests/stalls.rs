//! End to end: no run waits forever in silence. A loader that fails on the data ends the run
//! with its message wherever its part lies; `pinring run` reaps, restarts and stops with its
//! loaders; a ring with work left and no loader is warned about and shown stalled.
//! docs/RELIABILITY.md, "Stalls".

mod common;

use common::*;
use nix::sys::signal::Signal;
use pinring_ring::{Access, LoaderRing, ProcessId, Ring};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A part committed with the "sample cannot be read" code (3) and a message, by a loader that
/// then leaves, in the slot carrying `seq`.
fn commit_failed_part(ring_name: &str, seq: u64, message: &str) {
    let ring =
        LoaderRing::join(Ring::open(ring_name, Access::ReadWrite, Duration::from_secs(5)).unwrap())
            .unwrap();
    let seat = ring.attach_loader(ProcessId::current()).unwrap();
    let view = pinring_ring::RingView::open(ring_name, None, Duration::from_secs(5)).unwrap();
    let slots = view.snapshot().slots;
    let slot = (0..slots.len() as u32)
        .find(|&s| slots[s as usize].seq == seq)
        .expect("a slot carries the seq");
    let mut claim = ring.try_claim(seat, slot).expect("the slot is FREE");
    assert_eq!(claim.seq(), seq);
    let mut w = ring.slot_writer(&mut claim);
    let n = pinring_ring::failure::write_failure(&mut w, message);
    ring.commit(claim, 0, n, 0, pinring_ring::failure::ERR_SAMPLE)
        .unwrap();
    ring.detach_loader(seat);
}

#[test]
fn a_part_that_failed_on_the_data_above_a_seq_no_loader_makes_ends_the_run_with_exit_3() {
    let fx = Fixture::small("stall-data");
    let mut daemon = fx.daemon(&["--sink", "discard"]);
    let ring = fx.wait_ready(&mut daemon);
    // No loader ever makes seq 0; the part of seq 3 failed, as a loader on a truncated file
    // leaves it before it exits 3. In order, the daemon waits for seq 0 first.
    commit_failed_part(
        &fx.ring,
        3,
        "sample 27 (epoch 0, seq 3) cannot be read: shard-7.npy: truncated at byte 4096\u{1b}[2J",
    );
    let t = Instant::now();
    let (status, log) = wait_for(daemon, "daemon", LONG);
    assert_eq!(status.code(), Some(3), "{log}");
    // Found at the next reap (200 ms); 20 s allows a loaded machine (before: never).
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "took {:?}",
        t.elapsed()
    );
    assert!(
        log.contains("seq 3") && log.contains("shard-7.npy: truncated at byte 4096"),
        "{log}"
    );
    // Control characters from the segment never reach the log.
    assert!(!log.contains('\u{1b}'), "{log}");
    let s = fx.summary();
    assert_eq!(
        (s.exit_code, s.resume_seq, s.parts_delivered),
        (3, 0, 0),
        "{s:#?}"
    );
    assert!(s.error.unwrap().contains("shard-7.npy"));
    drop(ring);
}

/// `pinring run` on the fixture's config with `loaders` loaders.
fn run(fx: &Fixture, loaders: usize, extra: &[&str]) -> std::process::Child {
    Command::new(exe(CLI))
        .args(["run", "--ring", &fx.ring, "--backend", "host", "--quiet"])
        .args(["--loaders", &loaders.to_string()])
        .arg("--config")
        .arg(&fx.config)
        .arg("--summary")
        .arg(fx.summary_path())
        .args(extra)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Pids of `parent`'s children that are zombies (exited, not reaped).
fn zombies_of(parent: u32) -> Vec<u32> {
    let mut z = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some(rest) = text.rfind(')').map(|i| &text[i + 1..]) else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        if f.first() == Some(&"Z") && f.get(1).and_then(|p| p.parse::<u32>().ok()) == Some(parent) {
            z.push(pid);
        }
    }
    z
}

#[test]
fn pinring_run_restarts_killed_loaders_at_once_and_leaves_no_zombie() {
    let fx = Fixture::small("stall-restart");
    let mut child = run(&fx, 2, &["--epochs", "100000"]);
    let start = Instant::now();
    let ring = loop {
        if let Ok(r) = pinring_ring::attach(&fx.ring, Access::ReadOnly, Duration::from_millis(200))
        {
            break r;
        }
        assert!(child.try_wait().unwrap().is_none(), "pinring run ended");
        assert!(
            start.elapsed() < LONG,
            "pinring run's ring never became ready"
        );
    };
    wait_until("two loaders", LONG, || {
        ring.loaders().iter().filter(|l| l.alive).count() == 2
    });
    // Kill both loaders, twice: every time, two new loaders attach and the dead ones are
    // reaped (no zombie child of `run`).
    for round in 0..2 {
        let pids: Vec<u32> = ring
            .loaders()
            .iter()
            .filter(|l| l.alive)
            .map(|l| l.pid)
            .collect();
        for &pid in &pids {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
        wait_until("the loaders restarted", LONG, || {
            let live: Vec<u32> = ring
                .loaders()
                .iter()
                .filter(|l| l.alive)
                .map(|l| l.pid)
                .collect();
            live.len() == 2 && live.iter().all(|p| !pids.contains(p))
        });
        wait_until("the killed loaders reaped", LONG, || {
            zombies_of(child.id()).iter().all(|z| !pids.contains(z))
        });
        assert!(
            child.try_wait().unwrap().is_none(),
            "round {round}: run ended"
        );
    }
    let before = delivered(&ring);
    wait_until("deliveries after the restarts", LONG, || {
        delivered(&ring) > before + 10
    });
    signal(&child, Signal::SIGTERM);
    let (status, log) = wait_for(child, "pinring run", LONG);
    assert_eq!(status.code(), Some(0), "{log}");
    assert!(log.contains("restarted"), "{log}");
    let s = fx.summary();
    assert_eq!(
        (s.duplicates, s.out_of_order, s.verify_failures),
        (0, 0, 0),
        "{s:#?}"
    );
}

#[test]
fn pinring_run_gives_up_on_a_loader_killed_too_often_and_says_so_once() {
    let fx = Fixture::small("stall-giveup");
    let mut child = run(&fx, 1, &["--epochs", "100000"]);
    let start = Instant::now();
    let ring = loop {
        if let Ok(r) = pinring_ring::attach(&fx.ring, Access::ReadOnly, Duration::from_millis(200))
        {
            break r;
        }
        assert!(child.try_wait().unwrap().is_none(), "pinring run ended");
        assert!(
            start.elapsed() < LONG,
            "pinring run's ring never became ready"
        );
    };
    let live = || -> Vec<u32> {
        ring.loaders()
            .iter()
            .filter(|l| l.alive)
            .map(|l| l.pid)
            .collect()
    };
    // Five kills are restarted; the sixth within the minute is not, and the run stops.
    let mut killed = Vec::new();
    while child.try_wait().unwrap().is_none() && killed.len() < 6 {
        let Some(&pid) = live().iter().find(|p| !killed.contains(*p)) else {
            std::thread::sleep(Duration::from_millis(5));
            assert!(start.elapsed() < LONG, "no new loader attached");
            continue;
        };
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), Signal::SIGKILL);
        killed.push(pid);
    }
    let (status, log) = wait_for(child, "pinring run", LONG);
    assert_eq!(killed.len(), 6, "{log}");
    assert_eq!(status.code(), Some(5), "{log}");
    assert_eq!(log.matches("not restarted again").count(), 1, "{log}");
    assert!(log.contains("after 5 restarts within 60 s"), "{log}");
    assert_eq!(log.matches("restarted ring=").count(), 5, "{log}");
}

#[test]
fn pinring_run_stops_with_code_3_when_its_loaders_fail_on_the_data() {
    // An npy dataset whose per-sample file 5 is cut short, "fail" on a bad sample: the loader
    // that reads it exits 3; the run stops with code 3 and its summary has the resume point,
    // whichever of the daemon (which saw the failed part) or run (which saw the loader) acts.
    let fx = Fixture::new(
        "stall-runfail",
        "[ring]\nslots = 8\n[dataset]\nkind = \"npy\"\non_bad_sample = \"fail\"\n\
         [dataset.npy]\npath = \"samples\"\ndtype = \"u16\"\nshape = [2, 3]\n\
         [plan]\nbatch_size = 4\nepochs = 50\nshuffle = false\n",
    );
    let d = fx.dir.path().join("samples");
    std::fs::create_dir_all(&d).unwrap();
    for k in 0..12 {
        let mut npy = b"\x93NUMPY\x01\x00".to_vec();
        let mut header = "{'descr': '<u2', 'fortran_order': False, 'shape': (2, 3), }".to_string();
        while (10 + header.len() + 1) % 64 != 0 {
            header.push(' ');
        }
        header.push('\n');
        npy.extend((header.len() as u16).to_le_bytes());
        npy.extend(header.as_bytes());
        npy.extend([k as u8; 12]);
        if k == 5 {
            npy.truncate(npy.len() - 1);
        }
        std::fs::write(d.join(format!("{k:04}.npy")), npy).unwrap();
    }
    let child = run(&fx, 2, &["--sink", "discard"]);
    let (status, log) = wait_for(child, "pinring run", LONG);
    assert_eq!(status.code(), Some(3), "{log}");
    assert!(log.contains("0005.npy"), "{log}");
    let s = fx.summary();
    assert_eq!(s.exit_code, 3, "{s:#?}");
    // Batch 1 (seq 1) holds sample 5: the run stops there or before (seq 0 may not have been
    // delivered yet when the failed part was seen), and resumes at the first seq not delivered.
    assert!(s.resume_seq <= 1, "{s:#?}");
    assert_eq!(s.resume_seq, s.parts_delivered, "{s:#?}");
    assert!(s.error.unwrap_or_default().contains("0005.npy"));
}

#[test]
fn a_ring_with_work_left_and_no_loader_is_warned_about_and_shown_stalled() {
    let fx = Fixture::new(
        "stall-idle",
        &format!("{SMALL}[daemon]\nidle_warn_ms = 300\nreap_interval_ms = 20\n"),
    );
    let log = fx.dir.path().join("daemon.log");
    // A plan no loader finishes before the test is done with it; SIGTERM ends it.
    let mut daemon = fx.daemon_logged(&["--epochs", "100000"], &log);
    let ring = fx.wait_ready(&mut daemon);
    // Warned at least twice (the warning repeats), naming the ring and the seq that waits.
    wait_until("two stall warnings", LONG, || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        text.matches("no loader attached").count() >= 2
    });
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains(&fx.ring) && text.contains("seq 0"), "{text}");
    let st = status_json(&fx.ring, "0.05");
    assert_eq!(st[0]["snapshot"]["stalled"]["seq"], 0, "{st}");
    assert!(
        st[0]["snapshot"]["stalled"]["seconds"].as_f64().unwrap() >= 0.3,
        "{st}"
    );
    // A loader ends the stall.
    let loader = fx.loader(&fx.config);
    wait_until("the stall to clear", LONG, || {
        ring.health()
            .stalled_since_ns
            .load(std::sync::atomic::Ordering::Relaxed)
            == 0
    });
    let st = status_json(&fx.ring, "0.05");
    assert!(st[0]["snapshot"]["stalled"].is_null(), "{st}");
    signal(&daemon, Signal::SIGTERM);
    let (status, out) = wait_for(daemon, "daemon", LONG);
    assert!(status.success(), "{out}");
    let _ = wait_for(loader, "loader", LONG);
}

/// `pinring consume ARGS`.
fn consume(args: &[&str]) -> std::process::Child {
    cli(&[&["consume"], args].concat())
}

#[test]
fn consume_gives_up_on_a_missing_ring_after_its_timeout() {
    let t = Instant::now();
    let name = format!("it-stall-noring-{}", std::process::id());
    let (status, log) = wait_for(
        consume(&["--ring", &name, "--timeout-secs", "1"]),
        "consume",
        LONG,
    );
    let took = t.elapsed();
    assert!(!status.success(), "{log}");
    assert!(log.contains(&name), "{log}");
    // 1 s asked for; the old code waited 29 s.
    assert!(took < Duration::from_secs(20), "took {took:?}: {log}");
}

#[test]
fn consume_stops_on_sigterm_and_sigint_while_it_waits() {
    // Waiting for a ring that does not exist yet.
    let name = format!("it-stall-termring-{}", std::process::id());
    for sig in [Signal::SIGTERM, Signal::SIGINT] {
        let c = consume(&["--ring", &name]);
        // A signal before the handlers are installed would kill it by default: wait until the
        // process has them (its SigCgt mask in /proc shows the signal caught).
        wait_until("consume's handlers", LONG, || catches(c.id(), sig));
        let t = Instant::now();
        signal(&c, sig);
        let (status, log) = wait_for(c, "consume", LONG);
        assert_eq!(status.code(), Some(0), "{sig}: {log}");
        // It stops within 100 ms; 10 s allows a loaded machine (before, it never stopped).
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{sig}: {:?}",
            t.elapsed()
        );
    }
    // Attached, waiting for a batch no loader makes: stops, printing where it stopped.
    let fx = Fixture::small("stall-consume");
    let mut daemon = fx.daemon(&["--sink", "consumer"]);
    let ring = fx.wait_ready(&mut daemon);
    let c = consume(&["--ring", &fx.ring]);
    wait_until("the consumer attached", LONG, || {
        ring.consumer_alive().unwrap_or(false)
    });
    let t = Instant::now();
    signal(&c, Signal::SIGTERM);
    let (status, out) = wait_for(c, "consume", LONG);
    assert_eq!(status.code(), Some(0), "{out}");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    let line = out
        .lines()
        .find(|l| l.starts_with('{'))
        .expect("a JSON line");
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    assert_eq!(
        (v["seq"].as_u64(), v["finished"].as_bool()),
        (Some(0), Some(false)),
        "{v}"
    );
    signal(&daemon, Signal::SIGTERM);
    let _ = wait_for(daemon, "daemon", LONG);
}

/// Whether process `pid` has a handler for `sig` (its SigCgt mask).
fn catches(pid: u32, sig: Signal) -> bool {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    text.lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (sig as i32 - 1)) != 0)
}

#[test]
fn consume_stops_at_the_next_batch_on_sigterm_while_batches_flow() {
    // A plan longer than the test, so batches are always there to take.
    let toml = SMALL.replace("epochs = 2", "epochs = 100000");
    let fx = Fixture::new("stall-consume-flow", &toml);
    let mut daemon = fx.daemon(&["--sink", "consumer", "--prefetch", "6"]);
    let ring = fx.wait_ready(&mut daemon);
    let loaders: Vec<_> = (0..2).map(|_| fx.loader(&fx.config)).collect();
    let c = consume(&["--ring", &fx.ring]);
    let handoff = || ring.handoff();
    let taken = || handoff().taken.load(std::sync::atomic::Ordering::Relaxed);
    let filled = || handoff().filled.load(std::sync::atomic::Ordering::Relaxed);
    wait_until("batches taken", LONG, || taken() >= 20);
    // Stopped, the consumer takes nothing while the daemon fills every buffer it can: once it
    // runs again there are batches ready to take, and more keep coming.
    let paused = Paused::new(&c);
    let at_stop = taken();
    wait_until("batches waiting for the consumer", LONG, || {
        filled() >= at_stop + 3
    });
    // Pending while it is stopped, the signal is handled before it runs on.
    signal(&c, Signal::SIGTERM);
    drop(paused);
    let (status, out) = wait_for(c, "consume", LONG);
    assert_eq!(status.code(), Some(0), "{out}");
    let line = out
        .lines()
        .find(|l| l.starts_with('{'))
        .expect("a JSON line");
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    assert_eq!(v["finished"].as_bool(), Some(false), "{v}");
    // At most the batch it was taking when it was stopped; it used to take every ready batch
    // and stop only when none was there, which a fast stream made seconds.
    let batches = v["batches"].as_u64().unwrap();
    assert!(
        batches <= at_stop + 1,
        "took {batches}, {at_stop} at the signal: {v}"
    );
    signal(&daemon, Signal::SIGTERM);
    all_exit_cleanly(daemon, loaders);
}
