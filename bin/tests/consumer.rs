//! The trainer's end on the host backend: a daemon with `--sink consumer`, real loaders, and a
//! consumer (in this process through pinring-client, or `pinring consume` as a child that gets
//! killed). Every byte of every batch is checked against the generator, in order, once.

mod common;

use common::*;
use nix::sys::signal::Signal;
use pinring_client::{AttachOptions, ClientError, Consumer};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering::Relaxed;

/// [`SMALL`] with a prefetch depth of 3 batch buffers.
fn config() -> String {
    copies_config("consumer")
}

/// The test ring with `daemon.copies = copies`: "consumer" (the default: the consumer copies out
/// of the slots) or "daemon" (into buffers the daemon hands over).
fn copies_config(copies: &str) -> String {
    format!("{SMALL}\n[daemon]\nprefetch = 3\ncopies = \"{copies}\"\n")
}

fn consumer_daemon(fx: &Fixture) -> (std::process::Child, pinring_ring::Ring) {
    let mut d = fx.daemon(&["--sink", "consumer"]);
    let ring = fx.wait_ready(&mut d);
    (d, ring)
}

fn attach(fx: &Fixture, start_seq: Option<u64>) -> Result<Consumer, ClientError> {
    attach_state(fx, start_seq, None)
}

/// Attaches resuming at `start_seq`, with the state's plan `fingerprint` when given.
fn attach_state(
    fx: &Fixture,
    start_seq: Option<u64>,
    fingerprint: Option<u64>,
) -> Result<Consumer, ClientError> {
    Consumer::attach(
        &fx.ring,
        &AttachOptions {
            start_seq,
            fingerprint,
            ..AttachOptions::default()
        },
    )
}

/// Checks a batch's fields against the generator, for the ring's own config and plan.
struct Checker {
    synthetic: pinring_data::Synthetic,
    plan: pinring_data::Plan,
    ids: Vec<u64>,
}

impl Checker {
    fn of(c: &Consumer) -> Checker {
        let cfg = c.config();
        Checker {
            synthetic: cfg.synthetic(),
            plan: cfg.plan().unwrap(),
            ids: Vec::new(),
        }
    }

    /// Every byte of images (64x64 f32 samples) and labels is the generator's.
    fn check(&mut self, b: &pinring_client::Batch) {
        self.plan.batch_into(b.batch, &mut self.ids).unwrap();
        let images = b.field("images").unwrap();
        assert_eq!(images.shape, vec![self.ids.len() as u64, 64, 64]);
        for field in ["images", "labels"] {
            self.synthetic
                .verify_field(field, &self.ids, b.host_bytes(field).unwrap())
                .unwrap_or_else(|e| panic!("seq {}, {field}: {e}", b.seq));
        }
    }
}

/// Takes `n` batches (or to the end), checking order and every byte; returns the batches taken.
fn take_verified(c: &mut Consumer, n: Option<u64>) -> u64 {
    let mut checker = Checker::of(c);
    let mut taken = 0;
    while n.is_none_or(|n| taken < n) {
        let expected = c.state().seq;
        let Some(b) = c.next_batch(Some(LONG)).unwrap() else {
            break;
        };
        assert_eq!(b.seq, expected, "batches come in order, none skipped");
        checker.check(&b);
        taken += 1;
    }
    taken
}

fn finish(fx: &Fixture, daemon: std::process::Child, loaders: Vec<std::process::Child>) {
    all_exit_cleanly(daemon, loaders);
    // The daemon's books: every batch delivered (taken) once, in order; the bytes were checked
    // on the consumer's side.
    let s = fx.summary();
    assert_eq!(s.sink, "consumer");
    assert_eq!(s.parts_delivered, s.end_seq - s.start_seq, "{s:#?}");
    assert_eq!(s.batches_delivered, 128, "{s:#?}");
    assert_eq!(
        (s.verify_failures, s.duplicates, s.out_of_order, s.missing),
        (0, 0, 0, 0),
        "{s:#?}"
    );
    assert!(
        !fx.segment().exists(),
        "the daemon removes its segment at exit"
    );
}

#[test]
fn the_consumer_gets_every_batch_once_in_order_byte_for_byte() {
    every_batch_once_in_order("cons-all", "consumer");
}

#[test]
fn a_daemon_that_copies_hands_every_batch_once_in_order_byte_for_byte() {
    every_batch_once_in_order("cons-all-d", "daemon");
}

fn every_batch_once_in_order(tag: &str, copies: &str) {
    let fx = Fixture::new(tag, &copies_config(copies));
    let (daemon, ring) = consumer_daemon(&fx);
    let kids = loaders_attached(&fx, &daemon, &ring, 4);
    let mut c = attach(&fx, None).unwrap();
    assert_eq!(c.batches_per_epoch(), 64);
    // The first epoch through the iterator (seqs in order), the rest verified byte for byte.
    let seqs: Vec<u64> = c
        .batches(Some(LONG))
        .take(64)
        .map(|b| b.unwrap().seq)
        .collect();
    assert_eq!(seqs, (0..64).collect::<Vec<_>>());
    assert_eq!(take_verified(&mut c, None), 64);
    assert!(
        c.next_batch(Some(LONG)).unwrap().is_none(),
        "the end stays the end"
    );
    drop(c);
    finish(&fx, daemon, kids);
}

#[test]
fn held_batches_are_never_overwritten() {
    held_never_overwritten("cons-hold", "consumer");
}

#[test]
fn held_batches_of_a_daemon_that_copies_are_never_overwritten() {
    held_never_overwritten("cons-hold-d", "daemon");
}

fn held_never_overwritten(tag: &str, copies: &str) {
    let fx = Fixture::new(tag, &copies_config(copies));
    let listen = free_local_addr();
    let mut daemon = fx.daemon(&["--sink", "consumer", "--metrics-listen", &listen]);
    let ring = fx.wait_ready(&mut daemon);
    let kids = loaders_attached(&fx, &daemon, &ring, 2);
    let mut c = attach(&fx, None).unwrap();
    let mut checker = Checker::of(&c);
    // Keep the first batch (as a trainer keeping a tensor would) while taking 20 more through
    // the remaining two buffers; then its bytes must still be the generator's.
    let kept = c.next_batch(Some(LONG)).unwrap().unwrap();
    let mut seen_buffers = std::collections::BTreeSet::new();
    for _ in 0..20 {
        let b = c.next_batch(Some(LONG)).unwrap().unwrap();
        assert_ne!(
            b.lease.buffer(),
            kept.lease.buffer(),
            "a held buffer was handed out again"
        );
        seen_buffers.insert(b.lease.buffer());
    }
    assert_eq!(
        seen_buffers.len(),
        2,
        "the other batches cycled through the free buffers"
    );
    // An operator sees the consumer and what it holds.
    let v = status_json(&fx.ring, "0.1");
    let cv = &v[0]["snapshot"]["consumer"];
    assert_eq!(cv["attached"], true, "{v:#}");
    assert_eq!(cv["pid"], std::process::id(), "{v:#}");
    assert_eq!(cv["buffers"], 3, "{v:#}");
    assert_eq!(cv["copies"], copies, "{v:#}");
    assert!(
        cv["held"].as_u64().unwrap() >= 1,
        "the kept batch is held: {v:#}"
    );
    // So does a monitoring system: who copies, and what the consumer holds.
    let metrics = http_get(&listen, "/metrics");
    let series = format!(
        "pinring_consumer_copies{{ring=\"{}\",copies=\"{copies}\"}} 1",
        fx.ring
    );
    assert!(metrics.contains(&series), "no {series} in:\n{metrics}");
    assert!(
        metrics.contains(&format!(
            "pinring_consumer_attached{{ring=\"{}\"}} 1",
            fx.ring
        )),
        "{metrics}"
    );
    checker.check(&kept); // the kept batch is intact
    drop(kept);
    assert_eq!(take_verified(&mut c, None), 107);
    drop(c);
    finish(&fx, daemon, kids);
}

#[test]
fn a_second_consumer_is_refused() {
    let fx = Fixture::new("cons-two", &config());
    let (mut daemon, _ring) = consumer_daemon(&fx);
    let _c = attach(&fx, None).unwrap();
    let e = attach(&fx, None).unwrap_err();
    assert!(
        matches!(
            e,
            ClientError::Ring(pinring_ring::RingError::ConsumerPresent { .. })
        ),
        "{e}"
    );
    assert!(e.to_string().contains("already has a consumer"), "{e}");
    daemon.kill().unwrap();
    let _ = daemon.wait();
}

#[test]
fn a_ring_without_a_consumer_sink_says_how_to_get_one() {
    let fx = Fixture::new("cons-none", SMALL);
    let mut daemon = fx.daemon(&[]);
    let _ring = fx.wait_ready(&mut daemon);
    let e = attach(&fx, None).unwrap_err().to_string();
    assert!(e.contains("--sink consumer"), "{e}");
    daemon.kill().unwrap();
    let _ = daemon.wait();
}

#[test]
fn a_loader_with_no_config_adopts_the_spec_only_a_consumer_sink_stores() {
    use pinring_producer::{Session, SessionError};
    // A daemon that hands batches to a consumer stores its spec: a loader joins with nothing
    // but the ring's name, and holds the daemon's settings as resolved.
    let fx = Fixture::new("cons-adopt", &config());
    let (mut daemon, ring) = consumer_daemon(&fx);
    let s = Session::join_adopting(&fx.ring, None, LONG, || false)
        .unwrap()
        .expect("the ring is there");
    assert_eq!(s.config().fingerprint(), ring.fingerprint());
    assert_eq!(
        s.config().daemon.prefetch,
        Some(3),
        "the file's own setting"
    );
    drop(s);
    daemon.kill().unwrap();
    let _ = daemon.wait();

    // Another sink stores none: the loader is told so (and takes a config of its own).
    let fx = Fixture::new("cons-adopt-none", SMALL);
    let mut daemon = fx.daemon(&[]);
    let _ring = fx.wait_ready(&mut daemon);
    let e = Session::join_adopting(&fx.ring, None, LONG, || false).unwrap_err();
    assert!(matches!(e, SessionError::NoStoredSpec { .. }), "{e}");
    daemon.kill().unwrap();
    let _ = daemon.wait();
}

#[test]
fn a_stored_spec_overwritten_in_shared_memory_is_refused_before_use() {
    use std::io::{Seek, SeekFrom, Write};
    let fx = Fixture::new("cons-spec-scribble", &config());
    let (mut daemon, ring) = consumer_daemon(&fx);
    let at = ring.geometry().handoff.unwrap().spec_offset;
    // Another process of the ring's owner writes over the spec's first bytes (its format tag).
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(fx.segment())
        .unwrap();
    f.seek(SeekFrom::Start(at)).unwrap();
    f.write_all(b"[ring]\n").unwrap();
    drop(f);
    let e = attach(&fx, None).unwrap_err();
    assert!(
        matches!(
            e,
            ClientError::Spec(pinring_data::StoredSpecError::Corrupt { .. })
        ),
        "{e}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains(&fx.ring) && msg.contains("restart its daemon"),
        "{msg}"
    );
    daemon.kill().unwrap();
    let _ = daemon.wait();
}

fn consume_child(fx: &Fixture, extra: &[&str]) -> std::process::Child {
    Command::new(exe(CLI))
        .args([
            "consume",
            "--ring",
            &fx.ring,
            "--verify",
            "--timeout-secs",
            "60",
        ])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn consumed(child: std::process::Child) -> serde_json::Value {
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "pinring consume failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn a_killed_consumer_is_replaced_and_nothing_is_lost_or_repeated() {
    killed_consumer_replaced("cons-kill", "consumer");
}

#[test]
fn a_killed_consumer_of_a_daemon_that_copies_is_replaced_and_nothing_is_lost_or_repeated() {
    killed_consumer_replaced("cons-kill-d", "daemon");
}

fn killed_consumer_replaced(tag: &str, copies: &str) {
    let fx = Fixture::new(tag, &copies_config(copies));
    let (daemon, ring) = consumer_daemon(&fx);
    let kids = loaders_attached(&fx, &daemon, &ring, 3);
    // A consumer that holds every batch it takes (so it dies holding buffers) is killed once it
    // has taken some: when it is attached and the ring's counters show its takes.
    let victim = consume_child(&fx, &["--hold", "2"]);
    wait_until("the consumer takes batches", LONG, || {
        ring.handoff()
            .taken
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 5
    });
    signal(&victim, nix::sys::signal::Signal::SIGKILL);
    let _ = victim.wait_with_output();
    // The next consumer resumes after what the dead one took, and the two cover the plan.
    let taken_before = ring
        .handoff()
        .taken
        .load(std::sync::atomic::Ordering::Relaxed);
    let mut c = attach(&fx, None).unwrap();
    let first = c.state().seq;
    assert_eq!(
        first, taken_before,
        "one seq per batch here: resume right after the takes"
    );
    assert_eq!(take_verified(&mut c, None), 128 - taken_before);
    drop(c);
    let reclaimed = ring
        .handoff()
        .reclaimed
        .load(std::sync::atomic::Ordering::Relaxed);
    if copies == "daemon" {
        assert!(
            reclaimed >= 1,
            "the dead consumer's held buffers were taken back"
        );
    }
    // A consumer that copies holds the daemon's descriptors only while its copies run: the
    // batches it kept were in its own memory, which died with it.
    finish(&fx, daemon, kids);
}

#[test]
fn state_resumes_where_it_was_saved_and_refuses_what_cannot_be() {
    let fx = Fixture::new("cons-state", &config());
    let (daemon, ring) = consumer_daemon(&fx);
    let kids = loaders_attached(&fx, &daemon, &ring, 2);
    let out = consumed(consume_child(&fx, &["--batches", "10"]));
    assert_eq!(out["seq"], 10, "{out}");
    assert_eq!(out["verified"], 10, "{out}");
    let fp = out["fingerprint"].as_str().unwrap().to_string();
    // Behind what the ring already handed over: refused, with the fix.
    let e = attach(&fx, Some(4)).unwrap_err().to_string();
    assert!(e.contains("--start-seq 4"), "{e}");
    // Another plan's state: refused.
    let e = attach_state(&fx, Some(10), Some(0x1234)).unwrap_err();
    assert!(matches!(e, ClientError::OtherPlan { .. }), "{e}");
    // Ahead: the batches in between are skipped, the consumer starts exactly there.
    let out = consumed(consume_child(
        &fx,
        &["--start-seq", "20", "--fingerprint", &fp, "--batches", "5"],
    ));
    assert_eq!(out["seq"], 25, "{out}");
    let mut c = attach(&fx, Some(25)).unwrap();
    assert_eq!(take_verified(&mut c, None), 128 - 25);
    drop(c);
    // The skipped batches count as delivered to the daemon (the consumer passed them over).
    finish(&fx, daemon, kids);
}

/// The daemon of `fx`'s ring on a thread of this process, host backend.
fn embedded_host_daemon(fx: &Fixture) -> pinring_client::EmbeddedDaemon {
    let overrides = pinring_runtime::settings::Overrides {
        ring: Some(fx.ring.clone()),
        ..Default::default()
    };
    let spec = pinring_client::resolve_embedded(Some(&fx.config), &overrides, false).unwrap();
    pinring_client::EmbeddedDaemon::start(
        spec,
        &pinring_client::EmbeddedOptions {
            backend: pinring_backend::BackendKind::Host,
            ..pinring_client::EmbeddedOptions::default()
        },
        LONG,
    )
    .unwrap()
}

#[test]
fn an_embedded_daemon_feeds_its_own_process() {
    let fx = Fixture::new("cons-emb", &config());
    let daemon = embedded_host_daemon(&fx);
    assert_eq!(daemon.ring(), fx.ring);
    let kids: Vec<_> = (0..3).map(|_| fx.loader(&fx.config)).collect();
    // Every loader attached before batches are taken: one still starting when the plan ends
    // would wait its whole --wait-secs for a ring that is gone.
    let view = pinring_ring::attach(&fx.ring, pinring_ring::Access::ReadOnly, LONG).unwrap();
    for k in &kids {
        wait_attached(&view, k);
    }
    drop(view);
    let mut c = attach(&fx, None).unwrap();
    assert_eq!(
        c.ring().daemon().pid,
        std::process::id(),
        "the daemon runs in this process"
    );
    assert_eq!(take_verified(&mut c, None), 128);
    drop(c);
    let (summary, result) = daemon.stop().expect("the daemon thread ran");
    result.unwrap();
    assert_eq!(summary.batches_delivered, 128, "{summary:#?}");
    assert_eq!(
        summary.duplicates + summary.out_of_order + summary.missing,
        0
    );
    loaders_exit_cleanly(kids);
    assert!(
        !fx.segment().exists(),
        "the embedded daemon removes its ring"
    );
}

/// A loader told how many loaders start with it keeps to its own share of the slots from its
/// first claim (a DataLoader's workers: which slots a worker writes decides which of the ring's
/// pages count in its memory); one not told takes the next free slot until it has counted the
/// others.
#[test]
fn a_loader_told_its_peers_keeps_to_its_share_from_its_first_claim() {
    use pinring_producer::{Next, Session};
    let fx = Fixture::new("cons-peers", &config());
    let daemon = embedded_host_daemon(&fx);
    let mut cfg = pinring_data::Config::load(&fx.config).unwrap();
    cfg.ring.name = fx.ring.clone();
    let claims = |s: &mut Session, n: usize| -> Vec<u32> {
        (0..n)
            .map(
                |_| match s.claim(Some(std::time::Instant::now() + LONG), &mut || false) {
                    Ok(Next::Part(c)) => c.slot(),
                    other => panic!("no part: {other:?}"),
                },
            )
            .collect()
    };
    // Told that 4 start together, though it is alone so far: slots of its own quarter of the 8
    // (its seat's index modulo 4), where alone and not told it would take the next free ones
    // (0 and 1).
    let mut told = Session::join(cfg.clone(), LONG, || false).unwrap().unwrap();
    told.expect_peers(4);
    let own = u32::from(told.seat().index) % 4;
    assert_eq!(claims(&mut told, 2), [own, own + 4]);
    // Not told, it counts the loaders attached when it joins: two, so every other slot.
    let mut counted = Session::join(cfg, LONG, || false).unwrap().unwrap();
    let own2 = u32::from(counted.seat().index) % 2;
    assert_ne!(own2, own % 2, "two seats, two halves");
    assert_eq!(claims(&mut counted, 2), [own2, own2 + 2]);
    drop((told, counted));
    let (_, result) = daemon.stop().expect("the daemon thread ran");
    result.expect("a daemon stopped mid-run drains and ends cleanly");
}

#[test]
fn an_embedded_daemon_that_cannot_start_says_why() {
    let fx = Fixture::new("cons-emb-bad", "[plan]\nbatch_size = 0\n");
    let overrides = pinring_runtime::settings::Overrides {
        ring: Some(fx.ring.clone()),
        ..Default::default()
    };
    let e = pinring_client::resolve_embedded(Some(&fx.config), &overrides, false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("batch_size"), "{e}");
}

#[test]
fn an_embedded_daemon_runs_the_spec_it_is_handed_without_a_config_file() {
    // Settings given as data (no file anywhere), resolved once here; the daemon's thread makes
    // its ring from that very spec: its geometry is the spec's, "auto" resolved by the caller.
    let ring = format!("cons-spec-{}", std::process::id());
    let settings = pinring_data::Config::from_toml_str(SMALL, "given as data").unwrap();
    assert_eq!(settings.ring.slot_bytes, pinring_data::SlotBytes::Auto);
    let overrides = pinring_runtime::settings::Overrides {
        ring: Some(ring.clone()),
        ..Default::default()
    };
    let spec = pinring_data::Spec::resolve(
        settings,
        &overrides,
        &pinring_runtime::settings::host_facts(),
        &pinring_data::NoFiles,
    )
    .unwrap();
    let (slots, slot_bytes) = (spec.slots(), spec.slot_bytes());
    assert!(spec.config().source.starts_with("given as data"));
    let daemon = pinring_client::EmbeddedDaemon::start(
        spec,
        &pinring_client::EmbeddedOptions {
            backend: pinring_backend::BackendKind::Host,
            ..Default::default()
        },
        LONG,
    )
    .unwrap();
    assert_eq!(daemon.ring(), ring);
    let view = pinring_ring::attach(&ring, pinring_ring::Access::ReadOnly, LONG).unwrap();
    let g = view.geometry();
    assert_eq!((g.slot_count, g.slot_bytes), (slots, slot_bytes));
    drop(view);
    let (_, result) = daemon.stop().expect("the daemon thread ran");
    result.expect("a daemon stopped before any loader came drains and ends cleanly");
}

#[test]
fn an_unordered_ring_hands_every_batch_over_once() {
    let fx = Fixture::new("cons-unord", &config());
    let mut daemon = fx.daemon(&["--sink", "consumer", "--unordered"]);
    let ring = fx.wait_ready(&mut daemon);
    let kids = loaders_attached(&fx, &daemon, &ring, 4);
    let e = attach(&fx, Some(8)).unwrap_err().to_string();
    assert!(e.contains("unordered"), "{e}");
    let mut c = attach(&fx, None).unwrap();
    let mut checker = Checker::of(&c);
    let mut seen = std::collections::BTreeSet::new();
    while let Some(b) = c.next_batch(Some(LONG)).unwrap() {
        assert!(seen.insert(b.batch), "batch {} handed over twice", b.batch);
        checker.check(&b);
    }
    assert_eq!(seen, (0..128).collect(), "every batch, once");
    drop(c);
    finish(&fx, daemon, kids);
}

#[test]
fn a_consumer_waiting_on_a_dead_daemon_is_told_where_to_restart() {
    let fx = Fixture::new("cons-dead", &config());
    let (mut daemon, _ring) = consumer_daemon(&fx);
    // No loaders: the consumer waits for batch 0; the daemon is then SIGKILLed.
    let mut c = attach(&fx, None).unwrap();
    let waiter = std::thread::spawn(move || c.next_batch(Some(LONG)));
    daemon.kill().unwrap();
    let _ = daemon.wait();
    let e = waiter.join().unwrap().unwrap_err();
    assert!(matches!(e, ClientError::DaemonGone { seq: 0, .. }), "{e}");
    assert!(e.to_string().contains("--start-seq 0"), "{e}");
}

#[test]
fn a_consumer_of_a_stopped_daemon_is_told_where_to_restart() {
    let fx = Fixture::new("cons-stop", &config());
    let (daemon, ring) = consumer_daemon(&fx);
    let kids = loaders_attached(&fx, &daemon, &ring, 2);
    let mut c = attach(&fx, None).unwrap();
    assert_eq!(take_verified(&mut c, Some(5)), 5);
    signal(&daemon, nix::sys::signal::Signal::SIGTERM);
    let (status, log) = wait_for(daemon, "daemon", LONG);
    assert!(
        status.success(),
        "a drained daemon exits 0: {status}\n{log}"
    );
    let e = c.next_batch(Some(LONG)).unwrap_err();
    assert!(
        matches!(
            e,
            ClientError::Stopped { seq: 5, .. } | ClientError::DaemonGone { seq: 5, .. }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("--start-seq 5"), "{e}");
    // The daemon's own resume point agrees: the first batch no consumer took.
    assert_eq!(fx.summary().resume_seq, 5);
    for k in kids {
        let _ = wait_for(k, "loader", LONG);
    }
}

#[test]
fn a_part_table_entry_naming_another_slot_is_refused_before_anything_is_read() {
    let fx = Fixture::new("cons-scribble", &config());
    let (mut daemon, ring) = consumer_daemon(&fx);
    let mut kids = loaders_attached(&fx, &daemon, &ring, 2);
    // The first batch handed over, before any consumer took it.
    let buffers = ring.geometry().handoff.unwrap().buffers;
    let mut first = None;
    wait_until("the first batch is handed over", LONG, || {
        first = (0..buffers).find(|&i| {
            let d = ring.buffer_desc(i);
            d.load_word().state == pinring_ring::handoff::buffer_state::FILLED
                && d.seq.load(std::sync::atomic::Ordering::Relaxed) == 0
        });
        first.is_some()
    });
    let i = first.unwrap();
    // Another process scribbles its part table: part 0 now names the next slot, which holds
    // another seq (or none).
    let rogue = pinring_ring::Ring::open(&fx.ring, pinring_ring::Access::ReadWrite, LONG).unwrap();
    let entry = rogue.part_slot(i, 0).unwrap();
    let listed = entry.load(std::sync::atomic::Ordering::Relaxed);
    let other = (listed + 1) % ring.geometry().slot_count;
    entry.store(other, std::sync::atomic::Ordering::Relaxed);
    let mut c = attach(&fx, None).unwrap();
    let e = c.next_batch(Some(LONG)).unwrap_err();
    assert!(matches!(e, ClientError::Corrupt { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains(&format!("names slot {other}")) && msg.contains("not seq 0"),
        "{msg}"
    );
    drop(c);
    drop(rogue);
    daemon.kill().unwrap();
    let _ = daemon.wait();
    for k in &mut kids {
        let _ = k.kill();
        let _ = k.wait();
    }
}

#[test]
fn a_run_no_consumer_attached_to_is_called_consumer_bound() {
    // The daemon hands batches to a consumer that never comes: the loaders fill the ring and
    // then wait for slots, the copy engine idle. The one verdict every view gives says the
    // consumer is the limit (it said "upload", and the run's text "balanced" when cut short).
    let fx = Fixture::new("cons-absent", &config());
    let (daemon, ring) = consumer_daemon(&fx);
    let kids = loaders_attached(&fx, &daemon, &ring, 2);
    let h = ring.header();
    wait_until(
        "the loaders to have waited for slots most of their time",
        LONG,
        || {
            let (wait, busy) = (
                h.loader_wait_ns.load(Relaxed),
                h.loader_busy_ns.load(Relaxed),
            );
            wait >= 300_000_000 && wait >= 3 * busy
        },
    );
    let v = status_json(&fx.ring, "0.3");
    assert_eq!(v[0]["rates"]["bound"], "consumer", "{v:#}");
    signal(&daemon, Signal::SIGTERM);
    let (st, log) = wait_for(daemon, "daemon", LONG);
    assert!(st.success(), "{log}");
    let s = fx.summary();
    assert_eq!(s.bound, "consumer", "{s:#?}");
    assert!(s.upload_seconds < s.loader_wait_seconds / 2.0, "{s:#?}");
    for k in kids {
        let _ = wait_for(k, "loader", LONG);
    }
}
