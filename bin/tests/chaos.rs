//! Chaos: loaders killed, stopped past their lease, and descriptors scribbled over while a run
//! goes on. At the end every batch was delivered exactly once, in order, every byte verified.

mod common;

use common::*;
use nix::sys::signal::Signal;
use pinring_ring::{Access, Ring, SlotState};
use std::process::Child;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

/// 512 samples of 128x128 f32 (64 KiB), batches of 32 (2 MiB): 16 batches per epoch, 40 epochs.
/// Big batches keep loaders inside a claim for a good part of the time, so kills land mid-batch.
const CHAOS: &str = r#"
[ring]
slots = 8
[dataset]
samples = 512
sample_shape = [128, 128]
dtype = "f32"
seed = 11
[plan]
batch_size = 32
epochs = 40
"#;

const LOADERS: usize = 6;

fn is_running(child: &mut Child) -> bool {
    child.try_wait().unwrap().is_none()
}

/// Pids of the loaders that hold a CLAIMED slot right now (descriptors' informational owner pid).
fn claimants(ring: &Ring) -> Vec<u32> {
    (0..ring.geometry().slot_count)
        .map(|i| ring.slot_view(i))
        .filter(|v| v.state == Some(SlotState::Claimed))
        .map(|v| v.owner_pid)
        .collect()
}

#[test]
fn sigkilled_loaders_lose_and_duplicate_nothing() {
    let fx = Fixture::new("chaos-kill", CHAOS);
    let mut rng = Rng::from_env("chaos-kill");
    let mut daemon = fx.daemon(&[]);
    let ring = fx.wait_ready(&mut daemon);
    let mut loaders: Vec<Child> = (0..LOADERS).map(|_| fx.loader(&fx.config)).collect();
    let mut kills = 0;
    let start = Instant::now();
    while is_running(&mut daemon) {
        assert!(start.elapsed() < LONG, "the chaos run did not finish");
        std::thread::sleep(Duration::from_millis(rng.range(20, 100)));
        // Half the kills pick any loader (it may be waiting, claiming, filling or committing);
        // the other half pick among those holding a claim at this instant, so that kills land
        // mid-batch often whatever the machine's speed (they may still commit first: that is
        // the "between fill and commit" case).
        let mut busy: Vec<usize> = Vec::new();
        let looking = Instant::now();
        let targeted = rng.range(0, 2) == 0;
        while targeted && busy.is_empty() && looking.elapsed() < Duration::from_millis(20) {
            let pids = claimants(&ring);
            busy = (0..LOADERS)
                .filter(|&i| pids.contains(&loaders[i].id()))
                .collect();
            std::thread::yield_now();
        }
        let i = if busy.is_empty() {
            rng.range(0, LOADERS as u64) as usize
        } else {
            busy[rng.range(0, busy.len() as u64) as usize]
        };
        let _ = loaders[i].kill();
        loaders[i].wait().unwrap();
        kills += 1;
        if is_running(&mut daemon) {
            loaders[i] = fx.loader(&fx.config);
        }
    }
    drop(ring);
    let (st, log) = wait_for(daemon, "daemon", Duration::from_secs(5));
    assert!(st.success(), "{log}");
    for l in loaders {
        // Loaders started just before the end may find the ring gone and wait: stop them.
        let mut l = l;
        let _ = l.kill();
        let _ = l.wait();
    }
    let s = fx.summary();
    eprintln!(
        "{kills} kills, {} slots reclaimed, {:.2} s",
        s.reclaimed, s.seconds
    );
    assert_complete(&s, true);
    assert_eq!(s.end_seq, 640, "40 epochs of 16 batches");
    assert!(s.reclaimed > 0, "no kill landed mid-batch: {s:#?}");
}

#[test]
fn a_loader_stopped_past_its_lease_is_declared_hung_and_its_late_writes_never_reach_the_consumer() {
    let toml = format!("{CHAOS}\n[daemon]\nlease_ms = 300\nreap_interval_ms = 50\n");
    let fx = Fixture::new("chaos-stop", &toml);
    let mut rng = Rng::from_env("chaos-stop");
    // Long enough a plan that the run outlasts the three stops.
    let mut daemon = fx.daemon(&["--epochs", "80"]);
    let ring = fx.wait_ready(&mut daemon);
    let mut loaders: Vec<Child> = (0..LOADERS).map(|_| fx.loader(&fx.config)).collect();
    let mut stops = 0;
    let start = Instant::now();
    // Stop a random loader while it holds a claim, keep it stopped past the lease, resume it:
    // it goes on writing into the slot it lost before its commit fails.
    while stops < 3 {
        assert!(start.elapsed() < LONG, "no progress");
        assert!(
            delivered(&ring) < 1260,
            "the run ended before three loaders could be stopped"
        );
        std::thread::sleep(Duration::from_millis(rng.range(5, 30)));
        let victim = &loaders[rng.range(0, LOADERS as u64) as usize];
        signal(victim, Signal::SIGSTOP);
        let pid = victim.id();
        let holds_claim = (0..ring.geometry().slot_count).any(|i| {
            let v = ring.slot_view(i);
            v.state == Some(SlotState::Claimed) && v.owner_pid == pid
        });
        if !holds_claim {
            signal(victim, Signal::SIGCONT);
            continue;
        }
        let expired = ring.health().leases_expired.load(Relaxed);
        // Status shows it: a lease expired, a live loader is hung, and which one.
        wait_until("the lease to expire", Duration::from_secs(10), || {
            ring.health().leases_expired.load(Relaxed) > expired
                && ring.health().hung_loaders.load(Relaxed) >= 1
                && ring.health().quarantined.load(Relaxed) >= 1
        });
        assert_eq!(ring.health().last_hung_pid.load(Relaxed), u64::from(pid));
        std::thread::sleep(Duration::from_millis(rng.range(20, 150)));
        signal(victim, Signal::SIGCONT);
        stops += 1;
    }
    drop(ring);
    let (st, log) = wait_for(daemon, "daemon", LONG);
    assert!(st.success(), "{log}");
    assert!(log.contains("declared hung"), "{log}");
    for l in loaders.drain(..) {
        let (st, log) = wait_for(l, "loader", Duration::from_secs(10));
        assert!(st.success(), "{log}");
    }
    let s = fx.summary();
    assert_complete(&s, true);
    assert_eq!(s.end_seq, 1280);
    assert!(s.leases_expired >= 3, "{s:#?}");
    assert!(s.reclaimed >= s.leases_expired, "{s:#?}");
}

#[test]
fn a_rogue_writer_scribbling_over_descriptors_and_the_loader_table_never_crashes_the_daemon() {
    let toml = format!(
        "{CHAOS}\n[daemon]\nlease_ms = 300\nreap_interval_ms = 50\non_bad_batch = \"skip\"\n"
    );
    let fx = Fixture::new("chaos-scribble", &toml);
    let mut rng = Rng::from_env("chaos-scribble");
    let mut daemon = fx.daemon(&[]);
    fx.wait_ready(&mut daemon);
    let loaders: Vec<Child> = (0..3).map(|_| fx.loader(&fx.config)).collect();
    let rogue = Ring::open(&fx.ring, Access::ReadWrite, Duration::from_secs(5)).unwrap();
    let slots = rogue.geometry().slot_count;
    let start = Instant::now();
    let mut scribbles = 0;
    while start.elapsed() < Duration::from_millis(1500) {
        std::thread::sleep(Duration::from_millis(rng.range(1, 10)));
        let d = rogue.desc(rng.range(0, u64::from(slots)) as u32);
        let v = rng.next();
        match rng.range(0, 8) {
            0 => d.word.store(v, Relaxed),
            1 => d.word.store(v & 0xff, Relaxed),
            2 => d.seq.store(v % 400, Relaxed),
            3 => d.payload_len.store(v, Relaxed),
            4 => d.meta_len.store(v as u32, Relaxed),
            5 => d.error.store(v as u32 & 3, Relaxed),
            6 => d.sample_count.store(v as u32, Relaxed),
            _ => {
                let e = rogue.loader(rng.range(0, pinring_ring::MAX_LOADERS as u64) as usize);
                e.start_time.store(v, Relaxed);
            }
        }
        scribbles += 1;
    }
    eprintln!("{scribbles} scribbles");
    drop(rogue);
    let (st, log) = wait_for(daemon, "daemon", LONG);
    assert!(!log.contains("panicked"), "{log}");
    eprintln!("daemon ended with {st}");
    // Either it recovered and delivered everything right, or it stopped with a documented code
    // and a clear message; never a signal (a fault outside the segment), a panic or a hang.
    match st.code() {
        Some(0) => {
            let s = fx.summary();
            assert_complete(&s, true);
            assert!(s.rejected + s.corrupt_descriptors > 0, "{s:#?}");
        }
        Some(4) => assert!(log.contains(&fx.ring) && log.contains("slot"), "{log}"),
        Some(6) => assert!(log.contains("verification failed"), "{log}"),
        other => panic!("daemon ended with {other:?} ({st}):\n{log}"),
    }
    for l in loaders {
        let (st, log) = wait_for(l, "loader", Duration::from_secs(10));
        assert!(!log.contains("panicked"), "{log}");
        assert!(matches!(st.code(), Some(0 | 5)), "{st}\n{log}");
    }
}
