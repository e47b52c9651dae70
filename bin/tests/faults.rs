//! Faults end to end (docs/RELIABILITY.md lists which test proves which row): dead and hung
//! daemons, resource faults, foreign segments, access by another user, too many loaders, an
//! unwritable summary.

mod common;

use common::*;
use nix::sys::signal::Signal;
use pinring_daemon::summary::Summary;
use pinring_ring::{Access, LoaderRing, ProcessId, Ring, SlotState};
use std::collections::BTreeSet;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Child, Command};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

const RING_ERROR: i32 = 4;
const PEER_DIED: i32 = 5;
const REFUSED: i32 = 8;
const OUTPUT: i32 = 9;

#[test]
fn loaders_notice_a_dead_daemon_within_a_second_and_exit_5() {
    let fx = Fixture::small("ddead");
    let mut daemon = fx.daemon(&["--epochs", "1000"]);
    let ring = fx.wait_ready(&mut daemon);
    // Every loader attached before the kill: one still starting would wait for a live ring.
    let loaders = loaders_attached(&fx, &daemon, &ring, 3);
    wait_until("deliveries", LONG, || delivered(&ring) >= 10);
    daemon.kill().unwrap();
    daemon.wait().unwrap();
    let killed = Instant::now();
    for l in loaders {
        let (st, log) = wait_for(l, "loader", LONG);
        assert_eq!(st.code(), Some(PEER_DIED), "{log}");
        assert!(log.contains("daemon") && log.contains("is gone"), "{log}");
    }
    // Each loader looks at its daemon every 250 ms (100 ms when idle); 10 s for the three
    // allows a loaded machine, and an unnoticed death would be never.
    assert!(
        killed.elapsed() < Duration::from_secs(10),
        "loaders took {:?} to notice",
        killed.elapsed()
    );
}

#[test]
fn a_waiting_loader_reattaches_to_the_next_daemon_which_resumes_from_the_last_delivered_seq() {
    let fx = Fixture::small("reattach");
    // A plan the first daemon cannot finish before it is killed, however fast the machine.
    let mut first = fx.daemon(&["--epochs", "100000"]);
    let ring = fx.wait_ready(&mut first);
    let loader = fx.loader_with(&fx.config, &["--wait-for-daemon"]);
    wait_until("deliveries", LONG, || delivered(&ring) >= 20);
    first.kill().unwrap();
    first.wait().unwrap();
    // Status of the dead daemon's ring: every seq below next_deliver was delivered in order.
    let resume = next_deliver(&ring);
    assert!(resume >= 20);
    drop(ring);
    assert!(fx.segment().exists(), "the killed daemon left its segment");
    // The next daemon resumes there and runs to the end of two more epochs (64 batches each).
    let epochs = (resume / 64 + 2).to_string();
    let resume_arg = resume.to_string();
    let second = fx.daemon(&["--epochs", &epochs, "--start-seq", &resume_arg]);
    let (st, log) = wait_for(second, "second daemon", LONG);
    assert!(st.success(), "{log}");
    assert!(log.contains("stale segment"), "{log}");
    let (st, log) = wait_for(loader, "loader", LONG);
    assert!(st.success(), "{log}");
    assert!(log.contains("--wait-for-daemon"), "{log}");
    let s = fx.summary();
    assert_eq!(s.start_seq, resume);
    assert_eq!(s.end_seq, (resume / 64 + 2) * 64);
    assert_complete(&s, true);
}

/// Waits for a daemon started with [`Fixture::daemon_logged`] and its loaders; all must exit 0.
fn wait_run(daemon: Child, log: &Path, loaders: Vec<Child>) {
    let (st, _) = wait_for(daemon, "daemon", LONG);
    assert!(
        st.success(),
        "daemon: {st}\n{}",
        std::fs::read_to_string(log).unwrap()
    );
    loaders_exit_cleanly(loaders);
}

/// Stops `loader` inside a claim (its seq held back while others go on); returns the pause
/// (dropping it resumes the loader) and the held seq.
fn paused_in_a_claim(ring: &pinring_ring::Ring, loader: &Child) -> (Paused, u64) {
    loop {
        let paused = Paused::new(loader);
        if let Some((_, seq)) = claim_of(ring, loader.id()) {
            return (paused, seq);
        }
        drop(paused); // not inside a claim: resume it, try again after the next delivery
        wait_progress(ring, 1);
    }
}

/// Drains a run with a loader paused inside a claim: SIGTERM to the daemon, which must end
/// well; then the loader resumes and every loader must end well.
fn drain_with_a_paused_loader(daemon: Child, log: &Path, paused: Paused, loaders: Vec<Child>) {
    signal(&daemon, Signal::SIGTERM);
    let (st, _) = wait_for(daemon, "daemon", LONG);
    assert!(st.success(), "{}", std::fs::read_to_string(log).unwrap());
    drop(paused);
    loaders_exit_cleanly(loaders);
}

/// The seqs a stopped run delivered, from its log, checked against its summary: none twice,
/// every seq below `resume_seq` delivered, `resume_seq` itself not, and exactly
/// `delivered_past_resume` above it.
fn delivered_by_stopped_run(s: &Summary, log: &Path) -> BTreeSet<u64> {
    let seqs = delivered_seqs(log);
    let set: BTreeSet<u64> = seqs.iter().copied().collect();
    assert_eq!(set.len(), seqs.len(), "a seq delivered twice in one run");
    assert_eq!(seqs.len() as u64, s.batches_delivered, "{s:#?}");
    let below: Vec<u64> = (s.start_seq..s.resume_seq)
        .filter(|q| !set.contains(q))
        .collect();
    assert!(
        below.is_empty(),
        "below resume_seq, never delivered: {below:?}; {s:#?}"
    );
    assert!(!set.contains(&s.resume_seq), "{s:#?}");
    assert_eq!(
        set.range(s.resume_seq..).count() as u64,
        s.delivered_past_resume,
        "{s:#?}"
    );
    set
}

/// Resumes a stopped run at `resume_seq` (`--start-seq`), through two more epochs (64 batches
/// each); returns its summary and the seqs it delivered, in order. One loader: the daemon
/// cannot finish without it, so it never arrives after the end (a second loader could, and
/// would wait for a ring that is gone).
fn resume_run(fx: &Fixture, resume_seq: u64, extra: &[&str]) -> (Summary, Vec<u64>) {
    let log = fx.dir.path().join("resumed.log");
    let end_seq = (resume_seq / 64 + 2) * 64;
    let (epochs, start) = ((end_seq / 64).to_string(), resume_seq.to_string());
    let mut args = vec!["--epochs", &epochs, "--start-seq", &start];
    args.extend(extra);
    let daemon = fx.daemon_logged(&args, &log);
    let loader = fx.loader(&fx.config);
    wait_run(daemon, &log, vec![loader]);
    let s = fx.summary();
    assert_eq!((s.start_seq, s.end_seq), (resume_seq, end_seq), "{s:#?}");
    (s, delivered_seqs(&log))
}

#[test]
fn an_unordered_run_stopped_with_sigterm_resumes_at_its_lowest_undelivered_seq() {
    let fx = Fixture::small("resume-unordered");
    let log = fx.dir.path().join("first.log");
    // A plan the first daemon cannot finish before it is stopped, however fast the machine.
    let mut daemon = fx.daemon_logged(&["--unordered", "--epochs", "100000"], &log);
    let ring = fx.wait_ready(&mut daemon);
    let loaders: Vec<Child> = (0..3).map(|_| fx.loader(&fx.config)).collect();
    for l in &loaders {
        wait_attached(&ring, l);
    }
    wait_progress(&ring, 10);
    // A loader stopped inside a claim holds its seq back while the others deliver past it.
    let (paused, held) = paused_in_a_claim(&ring, &loaders[0]);
    // More seqs delivered than there are below the held one: some delivered seq lies above it.
    wait_until("deliveries past the held seq", LONG, || {
        delivered(&ring) > held + 1
    });
    // Status shows where to resume: at or below the held seq, whatever was delivered above.
    assert!(
        next_deliver(&ring) <= held,
        "{} > {held}",
        next_deliver(&ring)
    );
    drain_with_a_paused_loader(daemon, &log, paused, loaders);
    let first_summary = fx.summary();
    let s = &first_summary;
    assert!(s.interrupted && !s.in_order, "{s:#?}");
    assert_eq!((s.exit_code, s.error.as_deref()), (0, None), "{s:#?}");
    assert_eq!((s.duplicates, s.verify_failures), (0, 0), "{s:#?}");
    assert!(s.resume_seq <= held, "{s:#?}");
    assert!(s.delivered_past_resume >= 1, "{s:#?}");
    let first = delivered_by_stopped_run(s, &log);
    // The header said the same when the daemon stopped.
    assert_eq!(next_deliver(&ring), s.resume_seq);
    drop(ring);

    let resume = s.resume_seq;
    let (s2, second) = resume_run(&fx, resume, &["--unordered"]);
    assert_complete(&s2, false);
    let second: BTreeSet<u64> = second.into_iter().collect();
    assert_eq!(second, (resume..s2.end_seq).collect::<BTreeSet<u64>>());
    // Across both runs: every seq of the plan delivered; none below resume_seq twice; the ones
    // delivered twice are those the first run delivered past resume_seq.
    for q in 0..s2.end_seq {
        assert!(
            first.contains(&q) || second.contains(&q),
            "seq {q} never delivered"
        );
    }
    let twice: BTreeSet<u64> = first.intersection(&second).copied().collect();
    assert!(twice.iter().all(|&q| q >= resume), "{twice:?}");
    assert_eq!(
        twice,
        first
            .range(resume..s2.end_seq)
            .copied()
            .collect::<BTreeSet<u64>>()
    );
}

#[test]
fn an_ordered_run_stopped_with_sigterm_resumes_where_it_stopped_and_delivers_nothing_twice() {
    let fx = Fixture::small("resume-ordered");
    let log = fx.dir.path().join("first.log");
    let mut daemon = fx.daemon_logged(&["--epochs", "100000"], &log);
    let ring = fx.wait_ready(&mut daemon);
    let loaders: Vec<Child> = (0..3).map(|_| fx.loader(&fx.config)).collect();
    for l in &loaders {
        wait_attached(&ring, l);
    }
    wait_until("deliveries", LONG, || delivered(&ring) >= 20);
    drop(ring);
    signal(&daemon, Signal::SIGTERM);
    wait_run(daemon, &log, loaders);
    let s = fx.summary();
    assert_drained(&s);
    assert_eq!(s.delivered_past_resume, 0, "{s:#?}");
    delivered_by_stopped_run(&s, &log);
    // In order: exactly the seqs below resume_seq, in seq order.
    let first = delivered_seqs(&log);
    assert_eq!(first, (s.start_seq..s.resume_seq).collect::<Vec<u64>>());

    let (s2, second) = resume_run(&fx, s.resume_seq, &[]);
    assert_complete(&s2, true);
    assert_eq!(second, (s.resume_seq..s2.end_seq).collect::<Vec<u64>>());
}

#[test]
fn in_order_parts_go_up_ahead_of_a_held_one_and_nothing_past_it_is_delivered() {
    let fx = Fixture::small("ahead");
    let log = fx.dir.path().join("first.log");
    let mut daemon = fx.daemon_logged(&["--epochs", "100000", "--look-ahead", "8"], &log);
    let ring = fx.wait_ready(&mut daemon);
    let slots = u64::from(ring.geometry().slot_count);
    let loaders: Vec<Child> = (0..3).map(|_| fx.loader(&fx.config)).collect();
    for l in &loaders {
        wait_attached(&ring, l);
    }
    wait_progress(&ring, 10);
    // A loader stopped inside a claim holds its seq back.
    let (paused, held) = paused_in_a_claim(&ring, &loaders[0]);
    // Taken in seq order only, no slot would carry a seq past `held + slots`: none after
    // `held` would be uploaded, so no slot would be freed for one. Uploaded ahead, the slots
    // of later parts come back and carry later seqs.
    wait_until("parts uploaded ahead of the held seq", LONG, || {
        ring.header()
            .next_assign
            .load(std::sync::atomic::Ordering::Relaxed)
            > held + slots
    });
    assert!(
        next_deliver(&ring) <= held,
        "{} > {held}",
        next_deliver(&ring)
    );
    drain_with_a_paused_loader(daemon, &log, paused, loaders);
    let s = fx.summary();
    assert_drained(&s);
    assert!(s.parts_taken_ahead >= 1, "{s:#?}");
    // Batches that landed ahead of the held one were held back, never delivered.
    assert_eq!((s.resume_seq, s.delivered_past_resume), (held, 0), "{s:#?}");
    let first = delivered_seqs(&log);
    assert_eq!(first, (s.start_seq..held).collect::<Vec<u64>>());
    drop(ring);

    let (s2, second) = resume_run(&fx, held, &["--look-ahead", "8"]);
    assert_complete(&s2, true);
    assert_eq!(second, (held..s2.end_seq).collect::<Vec<u64>>());
}

#[test]
fn a_scribbled_next_deliver_in_the_header_does_not_move_the_summarys_resume_seq() {
    let fx = Fixture::small("resume-scribble");
    let mut daemon = fx.daemon(&["--epochs", "100000"]);
    let ring = fx.wait_ready(&mut daemon);
    let loaders: Vec<Child> = (0..3).map(|_| fx.loader(&fx.config)).collect();
    for l in &loaders {
        wait_attached(&ring, l);
    }
    wait_progress(&ring, 10);
    // Loaders stopped, and every committed batch delivered or READY behind the next seq due,
    // which no READY slot holds: the daemon delivers nothing more, so no delivery rewrites the
    // header's resume point after the scribble below.
    let paused: Vec<Paused> = loaders.iter().map(Paused::new).collect();
    let slots = ring.geometry().slot_count;
    wait_until("the daemon to have nothing left to deliver", LONG, || {
        let due = next_deliver(&ring);
        let (mut ready, mut stuck) = (0, true);
        for i in 0..slots {
            let v = ring.slot_view(i);
            match v.state {
                Some(SlotState::Ready) => {
                    ready += 1;
                    stuck &= v.seq != due;
                }
                Some(SlotState::Uploading) => stuck = false,
                _ => {}
            }
        }
        stuck && delivered(&ring) + ready >= ring.header().committed.load(Relaxed)
    });
    let published = next_deliver(&ring);
    // Another process writes a resume point of its own into the header while the daemon is
    // stopped; then the daemon is told to stop.
    let rogue = Ring::open(&fx.ring, Access::ReadWrite, Duration::from_secs(5)).unwrap();
    let scribbled = published + 1000;
    {
        let _daemon_stopped = Paused::new(&daemon);
        rogue.header().next_deliver.store(scribbled, Relaxed);
        signal(&daemon, Signal::SIGTERM);
    }
    let (st, log) = wait_for(daemon, "daemon", LONG);
    assert!(st.success(), "{log}");
    let s = fx.summary();
    // The daemon's books win: every seq below resume_seq delivered once, in order.
    assert_drained(&s);
    assert_eq!(s.resume_seq, published, "{s:#?}");
    // And the daemon published its own value again, which status shows.
    assert_eq!(next_deliver(&ring), published);
    drop(paused);
    loaders_exit_cleanly(loaders);
}

#[test]
fn a_ring_larger_than_dev_shm_fails_at_start_without_touching_memory() {
    // 4096 slots of 1 GiB: 4 TiB, more than any /dev/shm here; refused before allocating.
    let fx = Fixture::new(
        "nospace",
        &format!("{SMALL}\n").replace("slots = 8", "slots = 4096\nslot_bytes = \"1GiB\""),
    );
    let (st, log) = wait_for(fx.daemon(&[]), "daemon", LONG);
    assert_eq!(st.code(), Some(RING_ERROR), "{log}");
    assert!(
        log.contains(&fx.ring) && log.contains("/dev/shm") && log.contains("asked for"),
        "{log}"
    );
    // Warned before it tried.
    assert!(log.contains("more than the available memory"), "{log}");
    assert!(!fx.segment().exists());
}

#[test]
fn a_segment_replaced_behind_the_daemons_back_stops_it() {
    let fx = Fixture::small("replaced");
    let mut daemon = fx.daemon(&["--epochs", "1000"]);
    let ring = fx.wait_ready(&mut daemon);
    let size = std::fs::metadata(fx.segment()).unwrap().len();
    // Same name, same size, another file.
    std::fs::remove_file(fx.segment()).unwrap();
    let f = std::fs::File::create(fx.segment()).unwrap();
    f.set_len(size).unwrap();
    let ino = f.metadata().unwrap().ino();
    drop(ring);
    let (st, log) = wait_for(daemon, "daemon", LONG);
    assert_eq!(st.code(), Some(RING_ERROR), "{log}");
    assert!(log.contains("replaced") && log.contains(&fx.ring), "{log}");
    // The daemon must not remove the file that replaced its segment.
    assert_eq!(std::fs::metadata(fx.segment()).unwrap().ino(), ino);
}

#[test]
fn a_loader_beyond_the_loader_table_is_refused_with_exit_8() {
    let fx = Fixture::small("full");
    let mut daemon = fx.daemon(&["--epochs", "1000"]);
    fx.wait_ready(&mut daemon);
    // Fill the table with entries held by this (live) test process, as 48 idle loaders would:
    // one handle per seat, as one loader process each.
    let ring = Ring::open(&fx.ring, Access::ReadWrite, Duration::from_secs(5)).unwrap();
    let me = ProcessId::current();
    let mut taken: Vec<(LoaderRing, pinring_ring::Seat)> = (0..pinring_ring::MAX_LOADERS)
        .map(|_| {
            let r = LoaderRing::join(
                Ring::open(&fx.ring, Access::ReadWrite, Duration::from_secs(5)).unwrap(),
            )
            .unwrap();
            let seat = r.attach_loader(me).unwrap();
            (r, seat)
        })
        .collect();
    let (st, log) = wait_for(fx.loader(&fx.config), "loader", LONG);
    assert_eq!(st.code(), Some(REFUSED), "{log}");
    assert!(
        log.contains(&fx.ring) && log.contains("48 loaders") && log.contains("stop a loader"),
        "{log}"
    );
    // A place freed is a place taken.
    let (first, seat) = taken.remove(0);
    first.detach_loader(seat);
    let loader = fx.loader(&fx.config);
    wait_until("the new loader's deliveries", LONG, || {
        delivered(&ring) >= 5
    });
    signal(&daemon, Signal::SIGTERM);
    let (st, log) = wait_for(daemon, "daemon", LONG);
    assert!(st.success(), "{log}");
    let (st, log) = wait_for(loader, "loader", LONG);
    assert!(st.success(), "{log}");
}

#[test]
fn an_unwritable_summary_path_exits_9_after_a_complete_run() {
    let fx = Fixture::small("nosummary");
    let bad = fx.dir.path().join("no-such-dir").join("summary.json");
    let daemon = std::process::Command::new(DAEMON)
        .args(["--ring", &fx.ring, "--backend", "host", "--sink", "verify"])
        .arg("--config")
        .arg(&fx.config)
        .arg("--summary")
        .arg(&bad)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let loader = fx.loader(&fx.config);
    let (st, log) = wait_for(daemon, "daemon", LONG);
    assert_eq!(st.code(), Some(OUTPUT), "{log}");
    assert!(
        log.contains("cannot write the summary") && log.contains("no-such-dir"),
        "{log}"
    );
    // The data path was not affected: every batch delivered and verified.
    assert!(
        log.contains("batches=128") && log.contains("verified=128"),
        "{log}"
    );
    let (st, log) = wait_for(loader, "loader", LONG);
    assert!(st.success(), "{log}");
}

#[test]
fn a_segment_owned_by_another_user_is_never_replaced() {
    let fx = Fixture::small("foreign");
    std::fs::write(fx.segment(), vec![0u8; 8192]).unwrap();
    nix::unistd::chown(&fx.segment(), Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
    let (st, log) = wait_for(fx.daemon(&[]), "daemon", LONG);
    assert_eq!(st.code(), Some(RING_ERROR), "{log}");
    assert!(log.contains("owned by uid 65534"), "{log}");
    assert_eq!(std::fs::metadata(fx.segment()).unwrap().uid(), 65534);
}

/// Runs the loader binary as uid/gid 65534 (nobody) with no supplementary groups.
fn loader_as_nobody(fx: &Fixture) -> Option<std::process::Child> {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: switching users needs root");
        return None;
    }
    // The binary and the config must be reachable by that user.
    std::fs::set_permissions(fx.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&fx.config, std::fs::Permissions::from_mode(0o644)).unwrap();
    Some(
        Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                LOADER,
                "--ring",
                &fx.ring,
                "--wait-secs",
                "5",
            ])
            .arg("--config")
            .arg(&fx.config)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("setpriv (util-linux) runs"),
    )
}

#[test]
fn another_user_cannot_open_the_segment_and_nothing_is_world_writable() {
    let fx = Fixture::small("access");
    let mut daemon = fx.daemon(&["--epochs", "1000"]);
    fx.wait_ready(&mut daemon);
    let mode = std::fs::metadata(fx.segment()).unwrap().mode() & 0o777;
    assert_eq!(mode, 0o600, "default mode");
    if let Some(child) = loader_as_nobody(&fx) {
        let (st, log) = wait_for(child, "loader as nobody", LONG);
        assert_eq!(st.code(), Some(RING_ERROR), "{log}");
        assert!(
            log.contains("permission denied for uid 65534") && log.contains(&fx.ring),
            "{log}"
        );
    }
    signal(&daemon, Signal::SIGTERM);
    let (st, log) = wait_for(daemon, "daemon", LONG);
    assert!(st.success(), "{log}");
}

#[test]
fn group_mode_gives_the_configured_group_access() {
    // Group 65534 (nogroup/nobody) exists on every Linux; name it as the system does.
    let Some(group) = nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(65534))
        .ok()
        .flatten()
    else {
        eprintln!("skipped: no group with gid 65534 on this machine");
        return;
    };
    let fx = Fixture::new(
        "group",
        &SMALL.replace(
            "slots = 8",
            &format!("slots = 8\nmode = \"0660\"\ngroup = \"{}\"", group.name),
        ),
    );
    let mut daemon = fx.daemon(&[]);
    fx.wait_ready(&mut daemon);
    let meta = std::fs::metadata(fx.segment()).unwrap();
    assert_eq!(meta.mode() & 0o777, 0o660);
    assert_eq!(meta.gid(), 65534);
    // nobody is in that group: it may attach and work.
    if let Some(child) = loader_as_nobody(&fx) {
        let (st, log) = wait_for(child, "loader as nobody", LONG);
        assert!(st.success(), "{log}");
    }
    let (st, log) = wait_for(daemon, "daemon", LONG);
    assert!(st.success(), "{log}");
    assert_complete(&fx.summary(), true);
}

#[test]
fn an_unknown_group_is_a_clear_error() {
    let fx = Fixture::new(
        "nogroup",
        &SMALL.replace(
            "slots = 8",
            "slots = 8\nmode = \"0660\"\ngroup = \"no-such-group-pinring\"",
        ),
    );
    let (st, log) = wait_for(fx.daemon(&[]), "daemon", LONG);
    assert_eq!(st.code(), Some(3), "{log}");
    assert!(
        log.contains("no-such-group-pinring") && log.contains("groupadd"),
        "{log}"
    );
    assert!(!fx.segment().exists());
}

#[test]
fn counters_scribbled_in_the_segment_never_reach_the_summary() {
    let fx = Fixture::small("scribcount");
    let mut daemon = fx.daemon(&["--epochs", "20"]);
    fx.wait_ready(&mut daemon);
    let ring = Ring::open(&fx.ring, Access::ReadWrite, Duration::from_secs(5)).unwrap();
    let loader = fx.loader(&fx.config);
    // Another process writes nonsense into every fault counter of the header and the health
    // block while the run goes on, over and over, until the daemon has finished.
    const JUNK: u64 = 4_702_111_234_474_983_745;
    let (h, health) = (ring.header(), ring.health());
    while daemon.try_wait().unwrap().is_none() {
        for c in [
            &h.rejected,
            &h.reclaimed,
            &health.leases_expired,
            &health.bad_batches_skipped,
            &health.reissued,
            &health.corrupt_descriptors,
            &h.bad_samples_skipped,
            &h.loader_wait_ns,
            &h.loader_busy_ns,
        ] {
            c.store(JUNK, Relaxed);
        }
        std::thread::yield_now();
    }
    let (st, log) = wait_for(daemon, "daemon", LONG);
    assert!(st.success(), "{log}");
    let _ = wait_for(loader, "loader", LONG);
    let s = fx.summary();
    assert_complete(&s, true);
    assert_eq!(
        (
            s.rejected,
            s.reclaimed,
            s.leases_expired,
            s.bad_batches_skipped,
            s.reissued,
            s.corrupt_descriptors
        ),
        (0, 0, 0, 0, 0, 0),
        "{s:#?}"
    );
    // What only loaders know is cut to what could be true.
    let samples = s.parts_delivered * 8;
    assert!(s.bad_samples_skipped <= samples, "{s:#?}");
    assert!(s.loader_wait_seconds <= s.seconds.max(1.0) * 1e3, "{s:#?}");
}

/// `pinring clean ARGS` run as uid/gid 65534 (nobody): its exit code and output.
fn clean_as_nobody(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            CLI,
            "clean",
        ])
        .args(args)
        .output()
        .expect("setpriv (util-linux) runs");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code(), text)
}

#[test]
fn clean_by_a_user_who_cannot_open_a_live_ring_does_not_call_it_stale() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: switching users needs root");
        return;
    }
    let fx = Fixture::small("clean-unreadable");
    let mut daemon = fx.daemon(&["--epochs", "1000"]);
    fx.wait_ready(&mut daemon);
    let path = fx.segment().display().to_string();
    // Named: it cannot be checked, which is an error, and it is kept.
    let (code, out) = clean_as_nobody(&[&fx.ring]);
    assert_eq!(code, Some(RING_ERROR), "{out}");
    let line = out
        .lines()
        .find(|l| l.contains(&path))
        .expect("a line for the ring");
    assert!(
        line.starts_with("unknown") && line.contains("owned by uid 0 (root) with mode 0600"),
        "{out}"
    );
    assert!(!out.contains("stale"), "{out}");
    assert!(out.contains("could not be checked"), "{out}");
    // Every ring: another user's is listed, not a failure.
    let (code, out) = clean_as_nobody(&[]);
    assert_eq!(code, Some(0), "{out}");
    let line = out
        .lines()
        .find(|l| l.contains(&path))
        .expect("a line for the ring");
    assert!(line.starts_with("unknown"), "{out}");
    assert!(fx.segment().exists());
    signal(&daemon, Signal::SIGTERM);
    let (st, log) = wait_for(daemon, "daemon", LONG);
    assert!(st.success(), "{log}");
}

#[test]
fn roots_clean_says_whose_stale_ring_it_removed() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: only root removes another user's ring");
        return;
    }
    let fx = Fixture::small("clean-whose");
    let mut daemon = fx.daemon(&["--epochs", "1000"]);
    fx.wait_ready(&mut daemon);
    signal(&daemon, Signal::SIGKILL);
    let _ = daemon.wait();
    nix::unistd::chown(&fx.segment(), Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
    let (st, out) = wait_for(cli(&["clean", &fx.ring]), "pinring clean", LONG);
    assert!(st.success(), "{out}");
    let line = out
        .lines()
        .find(|l| l.starts_with("removed"))
        .expect("a removed line");
    assert!(line.contains("(it belonged to uid 65534"), "{out}");
    assert!(!fx.segment().exists());
}

#[test]
fn a_stale_ring_of_the_wrong_size_is_replaced_saying_so() {
    let fx = Fixture::small("stale-size");
    let mut first = fx.daemon(&["--epochs", "1000"]);
    fx.wait_ready(&mut first);
    signal(&first, Signal::SIGKILL);
    let _ = first.wait();
    // A copy grown by a page: a ring's magic and version, but not the file its daemon left.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(fx.segment())
        .unwrap();
    let size = f.metadata().unwrap().len();
    f.set_len(size + 4096).unwrap();
    drop(f);
    let mut daemon = fx.daemon(&["--epochs", "1000"]);
    fx.wait_ready(&mut daemon);
    signal(&daemon, Signal::SIGTERM);
    let (st, log) = wait_for(daemon, "daemon", LONG);
    assert!(st.success(), "{log}");
    assert!(
        log.contains("replaced a stale segment")
            && log.contains(&format!(
                "total_bytes is {size}, the file has {}",
                size + 4096
            )),
        "{log}"
    );
}

#[test]
fn loader_figures_scribbled_into_the_ring_are_flagged_untrusted_in_the_summary() {
    let fx = Fixture::small("untrusted");
    let listen = free_local_addr();
    let mut daemon = fx.daemon(&["--epochs", "1000", "--metrics-listen", &listen]);
    let ring = fx.wait_ready(&mut daemon);
    let loader = fx.loader(&fx.config);
    wait_progress(&ring, 5);
    // Another process writes the loaders' counters: 162 s of waiting and of work, and every
    // sample skipped on a synthetic ring, which never skips; and 162 s of waiting into the
    // loader's own entry.
    let rogue = Ring::open(&fx.ring, Access::ReadWrite, Duration::from_secs(5)).unwrap();
    let h = rogue.header();
    h.loader_wait_ns.store(162_000_000_000, Relaxed);
    h.loader_busy_ns.store(162_000_000_000, Relaxed);
    h.bad_samples_skipped.store(163_840, Relaxed);
    let entry = rogue.loaders()[0].index;
    rogue.loader(entry).wait_ns.store(162_000_000_000, Relaxed);
    let figures = [
        "loader_wait_seconds",
        "loader_busy_seconds",
        "bad_samples_skipped",
    ];
    // An operator's status view flags them, shows them bounded, and gives no verdict.
    let v = status_json(&fx.ring, "0.1");
    let snap = &v[0]["snapshot"];
    assert_eq!(snap["untrusted"], serde_json::json!(figures), "{v:#}");
    assert_eq!(v[0]["rates"]["bound"], "unknown", "{v:#}");
    assert_eq!(snap["bad_samples_skipped"], 0, "{v:#}");
    assert!(
        snap["loader_wait_seconds"].as_f64().unwrap() < 162.0,
        "{v:#}"
    );
    assert!(
        snap["loader_busy_seconds"].as_f64().unwrap() < 162.0,
        "{v:#}"
    );
    let l = &snap["loaders"][0];
    assert_eq!(l["untrusted"], true, "{v:#}");
    assert!(l["wait_seconds"].as_f64().unwrap() < 162.0, "{v:#}");
    let text = Command::new(exe(CLI))
        .args(["status", &fx.ring, "--once", "--interval", "0.1"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("untrusted: loader_wait_seconds"), "{text}");
    assert!(text.contains("bound by: unknown"), "{text}");
    // So does a monitoring system.
    let metrics = http_get(&listen, "/metrics");
    for f in figures {
        let series = format!(
            "pinring_untrusted_figure{{ring=\"{}\",figure=\"{f}\"}} 1",
            fx.ring
        );
        assert!(metrics.contains(&series), "no {series} in:\n{metrics}");
    }
    let skipped = format!(
        "pinring_bad_samples_skipped_total{{ring=\"{}\"}} 0",
        fx.ring
    );
    assert!(metrics.contains(&skipped), "no {skipped} in:\n{metrics}");
    signal(&daemon, Signal::SIGTERM);
    let log = all_exit_cleanly(daemon, vec![loader]);
    let s = fx.summary();
    assert_eq!(
        s.untrusted,
        [
            "loader_wait_seconds",
            "loader_busy_seconds",
            "bad_samples_skipped"
        ],
        "{s:#?}"
    );
    assert_eq!(s.bound, "unknown", "{s:#?}");
    assert_eq!(s.bad_samples_skipped, 0, "{s:#?}");
    assert!(
        s.loader_wait_seconds < 162.0 && s.loader_busy_seconds < 162.0,
        "{s:#?}"
    );
    assert!(log.contains("untrusted"), "{log}");
    // The run itself was not disturbed.
    assert_drained(&s);
}

#[test]
fn loader_figures_of_a_plain_run_are_trusted() {
    let fx = Fixture::small("trusted");
    let mut daemon = fx.daemon(&["--epochs", "50"]);
    let ring = fx.wait_ready(&mut daemon);
    let loaders: Vec<_> = (0..3).map(|_| fx.loader(&fx.config)).collect();
    wait_progress(&ring, 5);
    // A status view mid-run believes them too.
    let v = status_json(&fx.ring, "0.1");
    assert!(v[0]["snapshot"].get("untrusted").is_none(), "{v:#}");
    assert_ne!(v[0]["rates"]["bound"], "unknown", "{v:#}");
    all_exit_cleanly(daemon, loaders);
    let s = fx.summary();
    assert!(s.untrusted.is_empty(), "{s:#?}");
    assert_ne!(s.bound, "unknown", "{s:#?}");
    assert!(s.loader_busy_seconds > 0.0, "{s:#?}");
}
