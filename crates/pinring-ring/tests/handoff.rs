//! The handoff area between two handles on one ring, as a daemon and a consumer see it.

mod common;

use common::*;
use pinring_ring::handoff::{buffer_state, Filled, HandoffSpec, Returned};
use pinring_ring::{Access, ConsumerRing, DaemonRing, ProcessId, Ring, RingError};
use std::sync::atomic::Ordering::Relaxed;

fn with_handoff(tag: &str) -> (DaemonRing, Unlink) {
    let (mut o, u) = opts(tag, 100);
    o.handoff = Some(HandoffSpec {
        buffers: 3,
        buffer_bytes: 8192,
        spec: b"opaque spec bytes".to_vec(),
        host: true,
        device: 0,
        part_slots: 0,
    });
    let daemon = DaemonRing::create(&o).unwrap();
    // What a daemon does once its buffers' handles are written: consumers may attach.
    daemon.mark_exported();
    (daemon, u)
}

fn batch(seq: u64) -> Filled {
    Filled {
        round: 0,
        seq,
        batch: seq,
        bytes: 100,
        samples: 4,
        epoch: 0,
        index_in_epoch: seq,
    }
}

#[test]
fn an_opener_sees_the_config_and_the_host_buffers() {
    let (daemon, _u) = with_handoff("ho-open");
    let c = ConsumerRing::attach(Ring::open(daemon.name(), Access::ReadWrite, T).unwrap()).unwrap();
    assert_eq!(c.handoff_spec().unwrap(), b"opaque spec bytes");
    let g = c.geometry().handoff.unwrap();
    assert_eq!(g.buffers, 3);
    assert_eq!(c.geometry(), daemon.geometry());
    let p0 = c.host_buffer_ptr(0).unwrap() as usize;
    let p1 = c.host_buffer_ptr(1).unwrap() as usize;
    assert_eq!(p0 % 4096, 0);
    assert_eq!(p1 - p0, 8192);
    let file = Ring::open(daemon.name(), Access::ReadOnly, T).unwrap();
    assert_eq!(
        file.segment().len() as u64,
        c.geometry().total_bytes,
        "the file holds the area"
    );
}

#[test]
fn one_consumer_at_a_time_and_a_dead_ones_buffers_come_back() {
    let (daemon, _u) = with_handoff("ho-one");
    let first =
        ConsumerRing::attach(Ring::open(daemon.name(), Access::ReadWrite, T).unwrap()).unwrap();
    first.attach_consumer(ProcessId::current()).unwrap();
    assert!(forger(&daemon).consumer_alive().unwrap());
    let second =
        ConsumerRing::attach(Ring::open(daemon.name(), Access::ReadWrite, T).unwrap()).unwrap();
    let e = second.attach_consumer(ProcessId::current()).unwrap_err();
    assert!(matches!(e, RingError::ConsumerPresent { .. }), "{e}");

    let r = daemon.fill_buffer(1, &batch(7));
    let taken = first.take_buffer(1, r).unwrap();
    assert_eq!(taken.seq, 7);
    assert_eq!(
        daemon.reclaim_from_dead_consumer().unwrap(),
        0,
        "the consumer lives"
    );
    // The consumer's handle goes (as at its death): its lock with it.
    drop(first);
    assert!(!forger(&daemon).consumer_alive().unwrap());
    assert_eq!(daemon.reclaim_from_dead_consumer().unwrap(), 1);
    assert_eq!(daemon.buffer_returned(1, r), Returned::Reclaimed);
    assert_eq!(forger(&daemon).handoff().reclaimed.load(Relaxed), 1);
    // Now the second one may attach.
    second.attach_consumer(ProcessId::current()).unwrap();
}

#[test]
fn a_new_consumer_reclaims_what_its_dead_predecessor_held() {
    let (daemon, _u) = with_handoff("ho-succ");
    let first =
        ConsumerRing::attach(Ring::open(daemon.name(), Access::ReadWrite, T).unwrap()).unwrap();
    first.attach_consumer(ProcessId::current()).unwrap();
    let r = daemon.fill_buffer(0, &batch(3));
    first.take_buffer(0, r).unwrap();
    let r2 = daemon.fill_buffer(2, &batch(4));
    drop(first);
    let next =
        ConsumerRing::attach(Ring::open(daemon.name(), Access::ReadWrite, T).unwrap()).unwrap();
    next.attach_consumer(ProcessId::current()).unwrap();
    assert_eq!(daemon.buffer_returned(0, r), Returned::Reclaimed);
    assert_eq!(
        forger(&daemon).buffer_desc(2).load_word().state,
        buffer_state::FILLED,
        "a batch nobody took waits for the next consumer"
    );
    assert_eq!(next.take_buffer(2, r2).unwrap().seq, 4);
}

#[test]
fn a_ring_without_a_handoff_refuses_consumers() {
    let (o, _u) = opts("ho-none", 10);
    let daemon = DaemonRing::create(&o).unwrap();
    // The consumer's role is refused when it is taken.
    let ring = Ring::open(daemon.name(), Access::ReadWrite, T).unwrap();
    assert!(ring.geometry().handoff.is_none());
    assert!(ring.handoff_spec().is_none());
    let e = ConsumerRing::attach(ring).unwrap_err();
    assert!(matches!(e, RingError::NoHandoff { .. }), "{e}");
    assert!(e.to_string().contains("--sink consumer"), "{e}");
}

#[test]
fn scribbled_handoff_offsets_are_refused_at_open() {
    let (daemon, _u) = with_handoff("ho-bad");
    // Opened before the scribbles: a later open is refused.
    let scribbler = forger(&daemon);
    scribbler.handoff().host_offset.fetch_add(4096, Relaxed);
    let e = Ring::open(daemon.name(), Access::ReadOnly, T).unwrap_err();
    assert!(matches!(e, RingError::CorruptHeader { .. }), "{e}");
    scribbler.handoff().host_offset.fetch_sub(4096, Relaxed);
    scribbler.handoff().buffers.store(1000, Relaxed);
    let e = Ring::open(daemon.name(), Access::ReadOnly, T).unwrap_err();
    assert!(e.to_string().contains("out of range"), "{e}");
}

#[test]
fn the_daemon_restores_scribbled_handoff_fields() {
    let (daemon, _u) = with_handoff("ho-seal");
    // A rogue: another process's raw read-write mapping (no role writes these fields).
    let other = Ring::open(daemon.name(), Access::ReadWrite, T).unwrap();
    other.handoff().buffers.store(64, Relaxed);
    other.handoff().host_offset.store(0, Relaxed);
    let changed = daemon.repair_header();
    assert!(changed.contains(&"handoff.buffers"), "{changed:?}");
    assert!(changed.contains(&"handoff.host_offset"), "{changed:?}");
    assert_eq!(other.handoff().buffers.load(Relaxed), 3);
    Ring::open(daemon.name(), Access::ReadOnly, T).expect("opens again once restored");
}

/// A ring whose consumer copies: 3 buffers, a part table of 5 slots each.
fn with_part_table(tag: &str, host: bool) -> (DaemonRing, Unlink) {
    let (mut o, u) = opts(tag, 100);
    o.handoff = Some(HandoffSpec {
        buffers: 3,
        buffer_bytes: 8192,
        spec: b"opaque spec bytes".to_vec(),
        host,
        device: 0,
        part_slots: 5,
    });
    let daemon = DaemonRing::create(&o).unwrap();
    daemon.mark_exported();
    (daemon, u)
}

#[test]
fn a_ring_whose_consumer_copies_lists_each_batchs_slots_for_an_opener() {
    let (daemon, _u) = with_part_table("ho-parts", true);
    let c = ConsumerRing::attach(Ring::open(daemon.name(), Access::ReadWrite, T).unwrap()).unwrap();
    assert_eq!(c.geometry(), daemon.geometry());
    let g = c.geometry().handoff.unwrap();
    assert_eq!(g.part_slots, 5);
    let raw = Ring::open(daemon.name(), Access::ReadOnly, T).unwrap();
    assert_eq!(raw.handoff().part_slots.load(Relaxed), 5);
    // The consumer's buffers are its own: none lies in the ring.
    assert_eq!(c.host_buffer_ptr(0), None);
    assert_eq!(c.handoff_spec().unwrap(), b"opaque spec bytes");
    let writer = forger(&daemon);
    writer.part_slot(2, 4).unwrap().store(77, Relaxed);
    writer.part_slot(0, 0).unwrap().store(3, Relaxed);
    assert_eq!(c.part_slot(2, 4), Some(77));
    assert_eq!(c.part_slot(0, 0), Some(3));
    assert!(c.part_slot(0, 5).is_none(), "past the row");
    // A ring whose daemon copies has no table.
    let (plain, _u2) = with_handoff("ho-noparts");
    assert!(forger(&plain).part_slot(0, 0).is_none());
}

#[test]
fn a_part_table_size_changed_under_the_ring_is_refused_at_open() {
    let (daemon, _u) = with_part_table("ho-parts-bad", false);
    // Another row length moves the config: the stored offsets no longer match.
    forger(&daemon).handoff().part_slots.store(6, Relaxed);
    let e = Ring::open(daemon.name(), Access::ReadWrite, T).unwrap_err();
    assert!(matches!(e, RingError::CorruptHeader { .. }), "{e}");
    assert!(e.to_string().contains("do not match"), "{e}");
}

#[test]
fn a_consumer_reads_its_ring_through_a_read_only_view_of_its_own() {
    let (daemon, _u) = with_handoff("ho-view");
    let c = ConsumerRing::attach(Ring::open(daemon.name(), Access::ReadWrite, T).unwrap()).unwrap();
    let v = c.view().unwrap();
    assert_eq!(v.geometry(), c.geometry());
    daemon.fill_buffer(1, &batch(0));
    let snap = v.snapshot();
    assert_eq!(snap.geometry, c.geometry());
    let words = snap.handoff.expect("a handoff").buffers;
    assert_eq!(words.len(), 3);
    assert_eq!(
        words[1].state,
        buffer_state::FILLED,
        "the daemon's fill, seen by the view"
    );
    assert_eq!(words[1], c.buffer_word(1));
}
