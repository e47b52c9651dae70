//! Chaos: loaders killed, stopped past their lease, and the segment scribbled over while a run
//! goes on.
//!
//! Every test is driven by events it observes in the ring, never by how fast the machine is: the
//! daemon runs a plan far longer than any test ([`ENDLESS`] epochs) until the faults the test is
//! about have landed (a kill while the victim held a CLAIMED slot, a lease expired, a scribble
//! read by the daemon), then the test stops it with SIGTERM and checks the drained run: every
//! seq up to the summary's `resume_seq` delivered exactly once, in order, every byte verified.

mod common;

use common::*;
use nix::sys::signal::Signal;
use pinring_ring::{Access, Ring};
use std::process::Child;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

/// 512 samples of 128x128 f32 (64 KiB), batches of 32 (2 MiB): 16 batches per epoch.
/// Big batches keep loaders inside a claim for a good part of the time.
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

/// `--epochs` for a run that outlasts every test here (1.6 million batches): each test ends it
/// with SIGTERM once its faults have landed.
const ENDLESS: &str = "100000";

const LOADERS: usize = 6;

/// Kills that must land while the victim holds a CLAIMED slot.
const MID_BATCH_KILLS: u64 = 40;
/// Kills at any moment (waiting, claiming, filling, committing).
const ANY_MOMENT_KILLS: u64 = 400;

fn is_running(child: &mut Child) -> bool {
    child.try_wait().unwrap().is_none()
}

fn reclaimed(ring: &Ring) -> u64 {
    ring.header().reclaimed.load(Relaxed)
}

/// SIGTERMs the daemon, waits for it and the loaders (all must exit 0), returns the daemon's log.
fn drain(daemon: Child, loaders: Vec<Child>) -> String {
    signal(&daemon, Signal::SIGTERM);
    all_exit_cleanly(daemon, loaders)
}

/// [`CHAOS`] in slots of 516 KiB: each holds a part of 8 samples with its metadata, so every
/// batch spans 4 slots, filled by different loaders.
const CHAOS_SPANNING_SLOT_BYTES: u64 = 528384;

#[test]
fn sigkilled_loaders_lose_and_duplicate_nothing() {
    sigkill_loaders("chaos-kill", CHAOS, 1);
}

#[test]
fn sigkilled_loaders_lose_and_duplicate_no_part_of_a_batch_that_spans_slots() {
    sigkill_loaders(
        "chaos-kill-span",
        &in_slots_of(CHAOS, CHAOS_SPANNING_SLOT_BYTES),
        4,
    );
}

#[test]
fn sigkilled_loaders_lose_and_duplicate_no_byte_part_of_a_sample() {
    // Batches of 4 samples of 64 KiB in 16 KiB slots: each sample is cut into 6 byte parts (5 of
    // 12 KiB and one of 4 KiB), 24 parts a batch, filled by different loaders.
    let toml = CHAOS.replace("batch_size = 32", "batch_size = 4");
    // Fewer kills than the other two: each kill costs a loader start, and this test's point is
    // the byte parts, not the count.
    sigkill_loaders_n("chaos-kill-bytes", &in_slots_of(&toml, 16384), 24, 12, 40);
}

/// Kills loaders (mid-part and at any moment) while a run of `toml` goes on, drains it, and
/// checks every batch up to the resume point was delivered whole, once, in order, every byte
/// verified; `parts` is the config's parts per batch.
fn sigkill_loaders(tag: &str, toml: &str, parts: u64) {
    sigkill_loaders_n(tag, toml, parts, MID_BATCH_KILLS, ANY_MOMENT_KILLS);
}

/// [`sigkill_loaders`] with `mid_kills` kills inside a claim and `any_kills` at any moment.
fn sigkill_loaders_n(tag: &str, toml: &str, parts: u64, mid_kills: u64, any_kills: u64) {
    let fx = Fixture::new(tag, toml);
    let mut rng = Rng::from_env(tag);
    let mut daemon = fx.daemon(&["--epochs", ENDLESS]);
    let ring = fx.wait_ready(&mut daemon);
    let mut loaders: Vec<Child> = (0..LOADERS).map(|_| fx.loader(&fx.config)).collect();
    for l in &loaders {
        wait_attached(&ring, l);
    }
    let (mut mid_batch, mut any_moment) = (0, 0);
    // Driven by events, not by a time budget for the kills: each step waits for its own event
    // (deliveries, a loader stopped inside a claim, an attach), each with its deadline.
    while mid_batch < mid_kills || any_moment < any_kills {
        assert!(is_running(&mut daemon), "the daemon stopped during the run");
        // A few batches between kills: the run goes on with the replacements.
        wait_progress(&ring, rng.range(1, 4));
        let i = if mid_batch < mid_kills && rng.range(0, 2) == 0 {
            // Stopped, the victim cannot commit: if it holds a claim once stopped, the kill
            // lands mid-batch (mid-fill, or between fill and commit) for certain.
            // Every loader is stopped first and only then looked at: a claim seen on a stopped
            // loader cannot end, where one seen on a running loader (the parts of small slots
            // are filled in microseconds) has nearly always been committed by the time a
            // SIGSTOP lands, and a loaded machine then went 90 s without a catch.
            let mut caught = None;
            wait_until("a loader stopped inside a claim", LONG, || {
                let mut paused: Vec<Option<Paused>> =
                    loaders.iter().map(|l| Some(Paused::new(l))).collect();
                let Some(i) = (0..LOADERS).find(|&i| claim_of(&ring, loaders[i].id()).is_some())
                else {
                    return false; // none inside a claim: dropping `paused` resumes them all
                };
                caught = Some((i, paused[i].take().expect("each loader paused once")));
                true
            });
            let (i, paused) = caught.expect("wait_until returned: a loader was caught");
            loaders[i].kill().unwrap();
            std::mem::forget(paused); // dead: nothing to resume
            mid_batch += 1;
            i
        } else {
            let i = rng.range(0, LOADERS as u64) as usize;
            loaders[i].kill().unwrap();
            any_moment += 1;
            i
        };
        loaders[i].wait().unwrap();
        loaders[i] = fx.loader(&fx.config);
        wait_attached(&ring, &loaders[i]);
    }
    // Each mid-batch kill left a CLAIMED slot of a dead owner: the daemon takes it back with the
    // same seq (any-moment kills may add more).
    wait_until("the killed loaders' slots to be reclaimed", LONG, || {
        reclaimed(&ring) >= mid_batch
    });
    drop(ring);
    drain(daemon, loaders);
    let s = fx.summary();
    eprintln!(
        "{mid_batch} mid-batch and {any_moment} other kills, {} slots reclaimed, {} batches, {:.2} s",
        s.reclaimed, s.batches_delivered, s.seconds
    );
    assert_drained(&s);
    assert_eq!(s.parts_per_batch, parts, "{s:#?}");
    assert!(s.reclaimed >= mid_kills, "{s:#?}");
}

#[test]
fn a_loader_stopped_past_its_lease_is_declared_hung_and_its_late_writes_never_reach_the_consumer() {
    // A lease long enough that a loader merely descheduled on a loaded machine is not taken for
    // hung (the test waits for the expiry as an event, however long it is).
    let toml = format!("{CHAOS}\n[daemon]\nlease_ms = 2000\nreap_interval_ms = 50\n");
    let fx = Fixture::new("chaos-stop", &toml);
    let mut rng = Rng::from_env("chaos-stop");
    let mut daemon = fx.daemon(&["--epochs", ENDLESS]);
    let ring = fx.wait_ready(&mut daemon);
    let loaders: Vec<Child> = (0..LOADERS).map(|_| fx.loader(&fx.config)).collect();
    for l in &loaders {
        wait_attached(&ring, l);
    }
    let health = ring.health();
    let mut stops = 0;
    let start = Instant::now();
    // Stop a random loader while it holds a claim and keep it stopped until its slot was taken
    // and its seq delivered from another slot; then resume it: it goes on writing into the slot
    // it lost before its commit fails.
    while stops < 3 {
        assert!(start.elapsed() < LONG, "{stops} of 3 stops after {LONG:?}");
        assert!(is_running(&mut daemon), "the daemon stopped during the run");
        wait_progress(&ring, rng.range(1, 4));
        let victim = &loaders[rng.range(0, LOADERS as u64) as usize];
        let pid = victim.id();
        let paused = Paused::new(victim);
        let Some((slot, seq)) = claim_of(&ring, pid) else {
            continue; // not inside a claim: `paused` resumes it
        };
        let expired = health.leases_expired.load(Relaxed);
        let reclaimed_before = reclaimed(&ring);
        // Status shows it: a lease expired, a live loader is hung, a slot is quarantined.
        let asked = Instant::now();
        loop {
            let (now_expired, hung, quarantined) = (
                health.leases_expired.load(Relaxed),
                health.hung_loaders.load(Relaxed),
                health.quarantined.load(Relaxed),
            );
            if now_expired > expired && hung >= 1 && quarantined >= 1 {
                break;
            }
            assert!(
                is_running(&mut daemon),
                "the daemon stopped while loader {pid} was stopped in slot {slot}"
            );
            if asked.elapsed() >= LONG {
                let what = format!(
                    "the lease of loader {pid} (slot {slot}, seq {seq}) never expired: leases \
                     expired {now_expired} (was {expired}), hung {hung}, quarantined \
                     {quarantined}, reclaimed {} (was {reclaimed_before}), its claim now {:?}, \
                     slot word {:?}, daemon heartbeat age {} ms",
                    reclaimed(&ring),
                    claim_of(&ring, pid),
                    ring.word(slot),
                    pinring_ring::clock::monotonic_ns()
                        .saturating_sub(health.daemon_heartbeat_ns.load(Relaxed))
                        / 1_000_000
                );
                signal(&daemon, Signal::SIGKILL);
                let (_, log) = wait_for(daemon, "daemon", LONG);
                panic!("{what}; the daemon's log:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(health.last_hung_pid.load(Relaxed), u64::from(pid));
        // The run does not wait for it: its seq is made in another slot and delivered.
        wait_until(
            &format!("seq {seq} (slot {slot} of the stopped loader) to be delivered"),
            LONG,
            || next_deliver(&ring) > seq,
        );
        drop(paused);
        // Resumed, it finishes writing into the quarantined slot, its commit is refused, it
        // acknowledges, and the slot comes back into use.
        wait_until("the resumed loader's slot to come back", LONG, || {
            health.quarantined.load(Relaxed) == 0 && health.hung_loaders.load(Relaxed) == 0
        });
        stops += 1;
    }
    drop(ring);
    let log = drain(daemon, loaders);
    assert!(log.contains("declared hung"), "{log}");
    let s = fx.summary();
    // Every byte verified: the resumed loaders' late writes reached no consumer.
    assert_drained(&s);
    assert!(s.leases_expired >= 3, "{s:#?}");
    assert!(s.reclaimed >= s.leases_expired, "{s:#?}");
}

/// The rogue-writer tests: 3 loaders, audits every 50 ms, the default lease (30 s: the brief
/// stops of the daemon below never expire a loader's lease), `on_bad_batch` as given. One
/// upload buffer, so at most one slot is the daemon's at a time: with the daemon stopped, the
/// loaders soon leave a READY slot to scribble on.
fn rogue_run(tag: &str, on_bad_batch: &str) -> (Fixture, Child, Ring, Vec<Child>) {
    let toml =
        format!("{CHAOS}\n[daemon]\nreap_interval_ms = 50\non_bad_batch = \"{on_bad_batch}\"\n");
    let fx = Fixture::new(tag, &toml);
    let mut daemon = fx.daemon(&["--epochs", ENDLESS, "--upload-buffers", "1"]);
    let ring = fx.wait_ready(&mut daemon);
    let loaders: Vec<Child> = (0..3).map(|_| fx.loader(&fx.config)).collect();
    for l in &loaders {
        wait_attached(&ring, l);
    }
    wait_progress(&ring, 3);
    (fx, daemon, ring, loaders)
}

/// Stops the daemon and waits for a READY slot: while stopped it cannot take the slot, so a
/// scribble made before the returned guard drops is certain to be read by its next take.
fn ready_slot_with_daemon_stopped(ring: &Ring, daemon: &Child) -> (Paused, u32, u64) {
    let paused = Paused::new(daemon);
    let mut found = None;
    wait_until("a READY slot", LONG, || {
        found = ready_slot(ring);
        found.is_some()
    });
    let (slot, seq) = found.expect("found");
    (paused, slot, seq)
}

/// The health counters a scribble moves, in one snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Counts {
    rejected: u64,
    skipped: u64,
    corrupt: u64,
    reclaimed: u64,
}

fn counts(ring: &Ring) -> Counts {
    Counts {
        rejected: ring.header().rejected.load(Relaxed),
        skipped: ring.health().bad_batches_skipped.load(Relaxed),
        corrupt: ring.health().corrupt_descriptors.load(Relaxed),
        reclaimed: reclaimed(ring),
    }
}

/// Scribbles on one READY slot's descriptor, one field at a time.
#[derive(Debug, Clone, Copy)]
enum Scribble {
    /// A payload length beyond the slot.
    PayloadLen,
    /// A metadata length beyond the slot.
    MetaLen,
    /// Another seq than the one the daemon assigned.
    Seq,
    /// A loader error code.
    Error,
    /// A state byte no writer produces.
    GarbageState,
    /// The sample count: informational, never trusted (the daemon's plan says how many).
    SampleCount,
}

impl Scribble {
    fn apply(self, rogue: &Ring, slot: u32) {
        let d = rogue.desc(slot);
        match self {
            Scribble::PayloadLen => d
                .payload_len
                .store(rogue.geometry().slot_bytes + 1, Relaxed),
            Scribble::MetaLen => d.meta_len.store(u32::MAX, Relaxed),
            Scribble::Seq => {
                d.seq.fetch_add(1_000_000, Relaxed);
            }
            Scribble::Error => d.error.store(1, Relaxed),
            Scribble::GarbageState => {
                d.word.fetch_or(0xff, Relaxed);
            }
            Scribble::SampleCount => d.sample_count.store(u32::MAX, Relaxed),
        }
    }

    /// What the daemon must do when it reads the scribbled slot (under `on_bad_batch = "skip"`),
    /// as the change in the counters: the same seq is made again in every case.
    fn expected(self, before: Counts) -> Counts {
        match self {
            // Refused at take (lengths checked before any slice, seq and error compared):
            // a bad batch, skipped and made again.
            Scribble::PayloadLen | Scribble::MetaLen | Scribble::Seq | Scribble::Error => Counts {
                rejected: before.rejected + 1,
                skipped: before.skipped + 1,
                ..before
            },
            // Never READY again, so never taken: the audit finds the slot in a state the
            // daemon did not leave it in, counts it corrupt and has its seq made again.
            Scribble::GarbageState => Counts {
                rejected: before.rejected + 1,
                skipped: before.skipped + 1,
                corrupt: before.corrupt + 1,
                ..before
            },
            // No effect: the batch is uploaded and verified as it is.
            Scribble::SampleCount => before,
        }
    }
}

#[test]
fn a_rogue_writer_scribbling_over_ready_descriptors_makes_each_batch_be_made_again_under_skip() {
    let (fx, daemon, ring, mut loaders) = rogue_run("chaos-scribble", "skip");
    let mut rng = Rng::from_env("chaos-scribble");
    let rogue = Ring::open(&fx.ring, Access::ReadWrite, Duration::from_secs(5)).unwrap();
    for scribble in [
        Scribble::PayloadLen,
        Scribble::MetaLen,
        Scribble::Seq,
        Scribble::Error,
        Scribble::GarbageState,
        Scribble::SampleCount,
    ] {
        let before = counts(&ring);
        let (paused, slot, seq) = ready_slot_with_daemon_stopped(&ring, &daemon);
        scribble.apply(&rogue, slot);
        drop(paused);
        // Its seq is delivered once the daemon has dealt with the scribble (made again, or
        // uploaded as it was).
        wait_until(
            &format!("seq {seq} (slot {slot}, {scribble:?}) to be delivered"),
            LONG,
            || next_deliver(&ring) > seq,
        );
        // The ring's copies of the counts are published at the daemon's next reap.
        let want = scribble.expected(before);
        wait_until(&format!("{scribble:?}: the counts {want:?}"), LONG, || {
            counts(&ring) == want
        });
    }
    // A scribbled loader-table entry (pid, start time, state) fools nobody: liveness is the
    // loader's lock on the segment. The loader is stopped while it holds a slot, its entry is
    // scribbled, and the slot stays its own through several reap passes; once the loader is
    // killed (the kernel drops its lock), the slot is reclaimed with the same seq.
    let before = counts(&ring);
    let start = Instant::now();
    let (i, seq) = loop {
        assert!(start.elapsed() < LONG, "no loader was found inside a claim");
        let i = rng.range(0, loaders.len() as u64) as usize;
        let paused = Paused::new(&loaders[i]);
        if let Some((_, seq)) = claim_of(&ring, loaders[i].id()) {
            let entry = loader_index(&ring, loaders[i].id()).expect("attached");
            let e = rogue.loader(entry);
            e.start_time.fetch_add(1, Relaxed);
            e.pid.store(u32::MAX - 3, Relaxed);
            e.state.store(0, Relaxed);
            std::mem::forget(paused); // killed below, never resumed
            break (i, seq);
        }
        drop(paused);
        wait_progress(&ring, 1);
    };
    let health = ring.health();
    for _ in 0..3 {
        let beat = health.daemon_heartbeat_ns.load(Relaxed);
        wait_until("a reap pass", Duration::from_secs(10), || {
            health.daemon_heartbeat_ns.load(Relaxed) != beat
        });
    }
    assert_eq!(
        reclaimed(&ring),
        before.reclaimed,
        "a live loader's slot was taken because of a scribbled entry"
    );
    let mut killed = loaders.remove(i);
    killed.kill().unwrap();
    killed.wait().unwrap();
    wait_until("the dead loader's slot to be reclaimed", LONG, || {
        reclaimed(&ring) > before.reclaimed
    });
    wait_until(&format!("seq {seq} to be delivered"), LONG, || {
        next_deliver(&ring) > seq
    });
    assert_eq!(
        counts(&ring),
        Counts {
            reclaimed: before.reclaimed + 1,
            ..before
        }
    );
    drop((rogue, ring));
    drain(daemon, loaders);
    let s = fx.summary();
    assert_drained(&s);
    assert_eq!(
        (
            s.rejected,
            s.bad_batches_skipped,
            s.corrupt_descriptors,
            s.reclaimed
        ),
        (5, 5, 1, 1),
        "{s:#?}"
    );
}

#[test]
fn a_rogue_scribble_on_a_ready_descriptor_stops_the_daemon_with_exit_4_under_fail() {
    let (fx, daemon, ring, loaders) = rogue_run("chaos-scribble-fail", "fail");
    let rogue = Ring::open(&fx.ring, Access::ReadWrite, Duration::from_secs(5)).unwrap();
    let (paused, slot, seq) = ready_slot_with_daemon_stopped(&ring, &daemon);
    Scribble::PayloadLen.apply(&rogue, slot);
    drop(paused);
    drop((rogue, ring));
    let (st, log) = wait_for(daemon, "daemon", LONG);
    assert_eq!(st.code(), Some(4), "{log}");
    let what = format!("slot {slot} (seq {seq}): payload");
    assert!(
        log.contains(&fx.ring) && log.contains(&what) && log.contains("overflow"),
        "{what}: {log}"
    );
    let s = fx.summary();
    assert_eq!(s.exit_code, 4, "{s:#?}");
    assert!(
        s.error.as_deref().unwrap_or_default().contains(&what),
        "{s:#?}"
    );
    // Nothing wrong was delivered before the stop.
    assert_eq!((s.verify_failures, s.duplicates, s.out_of_order), (0, 0, 0));
    assert_eq!(s.batches_verified, s.batches_delivered, "{s:#?}");
    for l in loaders {
        // The ring closes as the daemon stops: loaders leave (0), or see it gone first (5).
        let (st, log) = wait_for(l, "loader", LONG);
        assert!(matches!(st.code(), Some(0 | 5)), "{st}\n{log}");
    }
}

#[test]
fn a_rogue_write_into_a_ready_payload_is_caught_by_the_verify_sink_with_exit_6() {
    let (fx, daemon, ring, loaders) = rogue_run("chaos-scribble-bytes", "skip");
    let rogue = Ring::open(&fx.ring, Access::ReadWrite, Duration::from_secs(5)).unwrap();
    let (paused, slot, seq) = ready_slot_with_daemon_stopped(&ring, &daemon);
    // The slot's first byte, found as any process that maps the file could (no role hands a
    // raw pointer into the data area out).
    let g = rogue.geometry();
    let byte = rogue
        .segment()
        .base()
        .wrapping_add(g.data_offset as usize + slot as usize * g.slot_bytes as usize);
    // SAFETY: `byte` is the first byte of slot `slot`, inside the read-write mapping `rogue`
    // holds for this whole block; any u8 value is valid. No loader writes a READY slot.
    let old = unsafe { byte.read_volatile() };
    // SAFETY: as above.
    unsafe { byte.write_volatile(!old) };
    drop(paused);
    wait_until(&format!("seq {seq} to be delivered"), LONG, || {
        next_deliver(&ring) > seq
    });
    drop((rogue, ring));
    signal(&daemon, Signal::SIGTERM);
    let (st, log) = wait_for(daemon, "daemon", LONG);
    assert_eq!(st.code(), Some(6), "{log}");
    assert!(
        log.contains("verification failed") && log.contains(&format!("seq {seq}")),
        "{log}"
    );
    let s = fx.summary();
    assert_eq!((s.exit_code, s.verify_failures), (6, 1), "{s:#?}");
    assert_eq!(s.batches_verified, s.batches_delivered - 1, "{s:#?}");
    assert_eq!((s.duplicates, s.out_of_order), (0, 0), "{s:#?}");
    loaders_exit_cleanly(loaders);
}
