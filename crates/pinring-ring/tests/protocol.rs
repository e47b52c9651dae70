//! The slot state machine and segment validation, exercised in one process through two mappings
//! of the same segment (the daemon's and a loader's), as separate processes would.

use pinring_ring::layout::{ring_state, LAYOUT_VERSION};
use pinring_ring::{
    object_path, Access, CommitError, ConsumerRing, CreateOptions, DaemonRing, LoaderRing,
    ProcessId, Ring, RingError, SlotFault, SlotState,
};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

mod common;

use common::{forger, Unlink, T};

fn opts(tag: &str) -> (CreateOptions, Unlink) {
    common::opts(tag, 10)
}

#[test]
fn a_batch_goes_free_claimed_ready_uploading_free() {
    let (o, _u) = opts("cycle");
    let daemon = DaemonRing::create(&o).unwrap();
    let loader = LoaderRing::join(Ring::open(&o.name, Access::ReadWrite, T).unwrap()).unwrap();
    assert_eq!(loader.fingerprint(), 0xabc);

    // Nothing to claim before the daemon hands out work.
    let me = loader.attach_loader(ProcessId::current()).unwrap();
    assert!(loader.try_claim(me, 0).is_none());

    daemon.assign(2, 7);
    daemon.set_state(ring_state::READY);
    let mut claim = loader.try_claim(me, 0).expect("a FREE slot");
    assert_eq!((claim.slot(), claim.seq()), (2, 7));
    // A second claim finds nothing: the slot is taken.
    assert!(loader.try_claim(me, 0).is_none());
    assert_eq!(daemon.take_ready(2, 7), Ok(None), "not committed yet");

    let mut slot = loader.slot_writer(&mut claim);
    slot.write(0, b"hello").unwrap();
    slot.write(64, b"abc").unwrap();
    // Nothing is written outside the slot.
    let err = slot.write(8190, b"xyz").unwrap_err();
    assert_eq!((err.offset, err.len, err.slot_bytes), (8190, 3, 8192));
    assert!(slot.write_words(8188, 8, || 0).is_err());
    let mut k = 0;
    slot.write_words(100, 11, || {
        k += 1;
        0x0807_0605_0403_0200 + k
    })
    .unwrap();
    loader.commit(claim, 5, 3, 1, 0).unwrap();

    let taken = daemon.take_ready(2, 7).unwrap().expect("ready");
    assert_eq!(
        (taken.payload_len, taken.meta_offset, taken.meta_len),
        (5, 64, 3)
    );
    let mut out = Vec::new();
    daemon.copy_out(2, 0, 5, &mut out);
    assert_eq!(out, b"hello");
    daemon.copy_out(2, 64, 3, &mut out);
    assert_eq!(out, b"abc");
    daemon.copy_out(2, 100, 11, &mut out);
    assert_eq!(out, [1, 2, 3, 4, 5, 6, 7, 8, 2, 2, 3]);
    assert_eq!(daemon.slot_view(2).state, Some(SlotState::Uploading));

    daemon.assign(2, 8);
    let c = loader.try_claim(me, 0).unwrap();
    assert_eq!(c.seq(), 8);
}

#[test]
fn a_commit_after_reclaim_is_rejected() {
    let (o, _u) = opts("zombie");
    let daemon = DaemonRing::create(&o).unwrap();
    let loader = LoaderRing::join(Ring::open(&o.name, Access::ReadWrite, T).unwrap()).unwrap();
    // A loader that claims a slot and dies: its handle (and so its locks) goes away.
    let doomed = LoaderRing::join(Ring::open(&o.name, Access::ReadWrite, T).unwrap()).unwrap();
    let dead = doomed.attach_loader(ProcessId::current()).unwrap();
    daemon.assign(0, 3);
    let claim = doomed.try_claim(dead, 0).unwrap();
    assert_eq!(
        daemon.reclaim_if_owner_dead(0),
        None,
        "alive while attached"
    );
    drop(doomed);
    assert_eq!(daemon.reclaim_if_owner_dead(0), Some(3));
    assert_eq!(daemon.snapshot().header.reclaimed, 1);
    // Back to FREE with the same seq, and the zombie's commit cannot land.
    let err = loader.commit(claim, 10, 0, 1, 0).unwrap_err();
    assert!(matches!(err, CommitError::Reclaimed { slot: 0, seq: 3 }));
    let live = loader.attach_loader(ProcessId::current()).unwrap();
    let again = loader.try_claim(live, 0).unwrap();
    assert_eq!(again.seq(), 3);
    // A live owner's slot is never reclaimed.
    assert_eq!(daemon.reclaim_if_owner_dead(0), None);
}

#[test]
fn forged_descriptors_are_refused() {
    let (o, _u) = opts("forged");
    let daemon = DaemonRing::create(&o).unwrap();
    let loader = LoaderRing::join(Ring::open(&o.name, Access::ReadWrite, T).unwrap()).unwrap();
    let me = loader.attach_loader(ProcessId::current()).unwrap();

    daemon.assign(1, 4);
    let claim = loader.try_claim(me, 0).unwrap();
    // The commit path refuses lengths that do not fit, and publishes an error in their place.
    assert!(matches!(
        loader.commit(claim, 8192, 1, 1, 0),
        Err(CommitError::TooLarge { .. })
    ));
    assert!(matches!(
        daemon.take_ready(1, 4),
        Err(SlotFault::LoaderError {
            slot: 1,
            seq: 4,
            ..
        })
    ));
    daemon.assign(1, 4);
    let _claim = loader.try_claim(me, 0).unwrap();
    // A rogue writer forges a length past the slot and a seq outside the window (through no
    // role: a raw mapping of the ring).
    let rogue = Ring::open(&o.name, Access::ReadWrite, T).unwrap();
    let d = rogue.desc(1);
    d.payload_len.store(1 << 40, Relaxed);
    d.word.store(
        pinring_ring::SlotWord::pack_owned(SlotState::Ready, me.index, me.tenure, 2),
        Relaxed,
    );
    assert!(matches!(
        daemon.take_ready(1, 4),
        Err(SlotFault::BadLength { slot: 1, .. })
    ));
    daemon.assign(1, 5);
    d.seq.store(999, Relaxed);
    d.word.store(
        pinring_ring::SlotWord::pack_owned(SlotState::Ready, me.index, me.tenure, 3),
        Relaxed,
    );
    assert!(matches!(
        daemon.take_ready(1, 5),
        Err(SlotFault::WrongSeq {
            expected: 5,
            found: 999,
            ..
        })
    ));
}

#[test]
fn opening_a_missing_ring_names_it() {
    let err = Ring::open("t-does-not-exist", Access::ReadOnly, T).unwrap_err();
    assert!(matches!(err, RingError::NotFound { .. }));
    assert!(err.to_string().contains("t-does-not-exist"));
}

#[test]
fn another_layout_version_is_refused() {
    let (o, _u) = opts("version");
    let daemon = DaemonRing::create(&o).unwrap();
    forger(&daemon)
        .header()
        .version
        .store(LAYOUT_VERSION + 1, Relaxed);
    let err = Ring::open(&o.name, Access::ReadOnly, T).unwrap_err();
    assert!(matches!(err, RingError::VersionMismatch { .. }), "{err}");
    assert!(err.to_string().contains(&o.name));
}

#[test]
fn a_truncated_segment_is_refused() {
    let (o, _u) = opts("trunc");
    let daemon = DaemonRing::create(&o).unwrap();
    let path = object_path(&o.name);
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(4096 + 100).unwrap();
    let err = Ring::open(&o.name, Access::ReadOnly, T).unwrap_err();
    assert!(matches!(err, RingError::SizeMismatch { .. }), "{err}");
    // The daemon notices too.
    assert!(matches!(
        daemon.check_file(),
        Err(RingError::SizeMismatch { .. })
    ));
    f.set_len(10).unwrap();
    let err = Ring::open(&o.name, Access::ReadOnly, T).unwrap_err();
    assert!(matches!(err, RingError::SizeMismatch { .. }), "{err}");
}

#[test]
fn garbage_is_not_a_ring() {
    let (o, _u) = opts("garbage");
    let path = object_path(&o.name);
    std::fs::write(&path, vec![0x5au8; 16384]).unwrap();
    let err = Ring::open(&o.name, Access::ReadOnly, T).unwrap_err();
    assert!(matches!(err, RingError::NotARing { .. }), "{err}");
}

#[test]
fn a_live_daemon_keeps_its_ring_and_a_dead_ones_is_replaced() {
    let (o, _u) = opts("stale");
    let first = DaemonRing::create(&o).unwrap();
    let err = DaemonRing::create(&o).unwrap_err();
    assert!(matches!(err, RingError::HeldByLiveDaemon { .. }), "{err}");
    // Its header names a dead process: the lock still says it lives.
    let scribbler = forger(&first);
    scribbler.header().daemon_pid.store(u32::MAX - 1, Relaxed);
    scribbler.header().daemon_start_time.store(1, Relaxed);
    scribbler.header().state.store(ring_state::CLOSED, Relaxed);
    let err = DaemonRing::create(&o).unwrap_err();
    assert!(matches!(err, RingError::HeldByLiveDaemon { .. }), "{err}");
    // The owner dies (its handle, and so its lock, goes): the stale ring is replaced.
    let first_generation = first.generation();
    drop((first, scribbler));
    let second = DaemonRing::create(&o).unwrap();
    assert_ne!(first_generation, second.generation());
    assert!(second.segment().still_named().unwrap());
}

#[test]
fn a_ring_that_never_finishes_initialising_times_out() {
    let (o, _u) = opts("init");
    let daemon = DaemonRing::create(&o).unwrap();
    forger(&daemon).header().version.store(0, Relaxed);
    let err = Ring::open(&o.name, Access::ReadOnly, Duration::from_millis(50)).unwrap_err();
    assert!(matches!(err, RingError::NotInitialised { .. }), "{err}");
}

#[test]
fn the_loader_table_refuses_the_49th_loader() {
    let (o, _u) = opts("table");
    let _daemon = DaemonRing::create(&o).unwrap();
    let open = || LoaderRing::join(Ring::open(&o.name, Access::ReadWrite, T).unwrap()).unwrap();
    let mut seated = Vec::new();
    for i in 0..pinring_ring::MAX_LOADERS {
        let ring = open();
        let seat = ring.attach_loader(ProcessId::current()).unwrap();
        assert_eq!(seat.index as usize, i);
        seated.push(ring);
    }
    let ring = open();
    let err = ring.attach_loader(ProcessId::current()).unwrap_err();
    assert!(
        matches!(err, RingError::LoaderTableFull { max: 48, .. }),
        "{err}"
    );
}

#[test]
fn one_handle_holds_one_seat() {
    let (o, _u) = opts("oneseat");
    let _daemon = DaemonRing::create(&o).unwrap();
    let ring = LoaderRing::join(Ring::open(&o.name, Access::ReadWrite, T).unwrap()).unwrap();
    let seat = ring.attach_loader(ProcessId::current()).unwrap();
    let err = ring.attach_loader(ProcessId::current()).unwrap_err();
    assert!(matches!(err, RingError::AlreadyAttached { .. }), "{err}");
    ring.detach_loader(seat);
    ring.attach_loader(ProcessId::current()).unwrap();
}

#[test]
fn loaders_keep_to_their_own_share_of_the_slots_and_take_any_when_theirs_are_busy() {
    let (o, _u) = opts("share");
    let daemon = DaemonRing::create(&o).unwrap();
    daemon.set_state(ring_state::READY);
    let a = LoaderRing::join(Ring::open(&o.name, Access::ReadWrite, T).unwrap()).unwrap();
    let b = LoaderRing::join(Ring::open(&o.name, Access::ReadWrite, T).unwrap()).unwrap();
    let seat_a = a.attach_loader(ProcessId::current()).unwrap();
    let seat_b = b.attach_loader(ProcessId::current()).unwrap();
    assert_eq!(daemon.attached_loaders(), 2);
    let slots = daemon.geometry().slot_count;
    for slot in 0..slots {
        daemon.assign(slot, 100 + u64::from(slot));
    }
    let (own_a, own_b) = (u32::from(seat_a.index) % 2, u32::from(seat_b.index) % 2);
    assert_ne!(own_a, own_b, "two loaders, two shares");
    // A takes its own slots first, in turn from its hint (the slot after its last claim, as
    // the loader session passes it), wrapping round, each with the seq there: started at its
    // second own slot, the first comes last.
    let mine: Vec<u32> = (own_a..slots).step_by(2).collect();
    let mut hint = mine[1];
    let mut got = Vec::new();
    for _ in &mine {
        let c = a.try_claim_preferring(seat_a, 2, hint).unwrap();
        assert_eq!(c.seq(), 100 + u64::from(c.slot()));
        assert!(!c.foreign(), "slot {} is A's own", c.slot());
        got.push(c.slot());
        hint = (c.slot() + 1) % slots;
    }
    let mut want = mine[1..].to_vec();
    want.push(mine[0]);
    assert_eq!(got, want);
    // Its share all busy, A takes another free slot, from its hint.
    let hint = own_b + 2;
    let c = a.try_claim_preferring(seat_a, 2, hint).unwrap();
    assert_eq!(c.slot(), hint);
    assert!(c.foreign(), "slot {hint} is B's");
    // B keeps to its own share, less the slot A took.
    let mut got = Vec::new();
    while let Some(c) = b.try_claim_preferring(seat_b, 2, 0) {
        got.push(c.slot());
    }
    let rest: Vec<u32> = (own_b..slots).step_by(2).filter(|&s| s != hint).collect();
    assert_eq!(got, rest);
    b.detach_loader(seat_b);
    assert_eq!(daemon.attached_loaders(), 1);

    // One loader: no share, the next free slot from the hint.
    let (o, _u) = opts("share-one");
    let daemon = DaemonRing::create(&o).unwrap();
    daemon.set_state(ring_state::READY);
    let a = LoaderRing::join(Ring::open(&o.name, Access::ReadWrite, T).unwrap()).unwrap();
    let seat = a.attach_loader(ProcessId::current()).unwrap();
    daemon.assign(0, 7);
    daemon.assign(3, 8);
    let c = a.try_claim_preferring(seat, 1, 2).unwrap();
    assert_eq!((c.slot(), c.seq()), (3, 8));
    assert!(!c.foreign(), "one loader: every slot is its own");
}

/// Whether this process has the page at `addr` mapped (/proc/self/pagemap's present bit).
fn page_present(addr: *const u8) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open("/proc/self/pagemap").unwrap();
    f.seek(SeekFrom::Start(addr as u64 / 4096 * 8)).unwrap();
    let mut entry = [0u8; 8];
    f.read_exact(&mut entry).unwrap();
    u64::from_le_bytes(entry) >> 63 == 1
}

#[test]
fn a_slot_filled_for_another_loader_leaves_this_processs_resident_memory_and_keeps_its_bytes() {
    let (o, _u) = opts("forget");
    let daemon = DaemonRing::create(&o).unwrap();
    daemon.set_state(ring_state::READY);
    let loader = LoaderRing::join(Ring::open(&o.name, Access::ReadWrite, T).unwrap()).unwrap();
    let seat = loader.attach_loader(ProcessId::current()).unwrap();
    // The pages are dropped only outside the daemon's process (its mapping is the registered
    // one): as a loader process sees the ring, the daemon is another process (written through
    // a raw mapping: no role writes another's header fields).
    let raw = Ring::open(&o.name, Access::ReadWrite, T).unwrap();
    raw.header()
        .daemon_pid
        .store(std::process::id() + 1, Relaxed);
    let slot_bytes = loader.geometry().slot_bytes as usize;
    let fill = |slot: u32, seq: u64, forget: bool| {
        daemon.assign(slot, seq);
        let mut claim = loader.try_claim(seat, slot).expect("a FREE slot");
        assert_eq!(claim.slot(), slot);
        if forget {
            claim.forget_pages();
        }
        let mut w = loader.slot_writer(&mut claim);
        let bytes = vec![seq as u8; slot_bytes];
        w.write(0, &bytes).unwrap();
        let base = w.as_mut_ptr().cast_const();
        assert!(page_present(base) && page_present(base.wrapping_add(4096)));
        loader.commit(claim, slot_bytes as u64, 0, 1, 0).unwrap();
        (base, bytes)
    };
    // Kept: a slot committed without the ask stays mapped here.
    let (kept, _) = fill(0, 0, false);
    assert!(page_present(kept));
    // Forgotten: none of the slot's pages is mapped here after the commit, and the daemon reads
    // every byte the loader wrote, through its own mapping and through this one again.
    let (gone, bytes) = fill(1, 1, true);
    assert!(!page_present(gone) && !page_present(gone.wrapping_add(4096)));
    let taken = daemon.take_ready(1, 1).unwrap().expect("ready");
    assert_eq!(taken.payload_len, slot_bytes as u64);
    let mut out = Vec::new();
    daemon.copy_out(1, 0, slot_bytes as u64, &mut out);
    assert_eq!(out, bytes);
    // Through this process's mapping: the slot handed out again, claimed, and read back.
    daemon.assign(1, 3);
    let mut again = loader.try_claim(seat, 1).expect("slot 1 FREE again");
    assert_eq!(again.slot(), 1);
    let mut here = vec![0u8; slot_bytes];
    loader.slot_writer(&mut again).read(0, &mut here).unwrap();
    assert_eq!(here, bytes);
    loader.commit(again, 0, 0, 0, 0).unwrap();
    // In the daemon's own process the ask changes nothing (its mapping stays whole).
    raw.header().daemon_pid.store(std::process::id(), Relaxed);
    let (still, _) = fill(2, 2, true);
    assert!(page_present(still));
}

#[test]
fn a_ring_opened_read_only_takes_no_writing_role() {
    let (o, _u) = opts("ro-role");
    let _daemon = DaemonRing::create(&o).unwrap();
    for (role, e) in [
        (
            "a loader",
            LoaderRing::join(Ring::open(&o.name, Access::ReadOnly, T).unwrap()).unwrap_err(),
        ),
        (
            "a consumer",
            ConsumerRing::attach(Ring::open(&o.name, Access::ReadOnly, T).unwrap()).unwrap_err(),
        ),
    ] {
        assert!(matches!(e, RingError::ReadOnlyRole { .. }), "{e}");
        let text = e.to_string();
        assert!(
            text.contains(&o.name)
                && text.contains(&format!("read-only, so {role} cannot write"))
                && text.contains("Access::ReadWrite"),
            "{text}"
        );
    }
}

#[test]
fn a_claim_kept_to_some_seqs_takes_the_lowest_of_them_and_leaves_the_rest() {
    let (o, _u) = opts("where");
    let daemon = DaemonRing::create(&o).unwrap();
    let loader = LoaderRing::join(Ring::open(&o.name, Access::ReadWrite, T).unwrap()).unwrap();
    let me = loader.attach_loader(ProcessId::current()).unwrap();
    let odd = |seq: u64| seq % 2 == 1;
    assert!(
        loader.try_claim_where(me, &odd).is_none(),
        "nothing handed out yet"
    );
    // Seqs 10..13 in slots 3, 2, 1, 0: the lowest odd seq lies in a higher slot than the other.
    for (slot, seq) in (0..4u32).rev().zip(10u64..) {
        daemon.assign(slot, seq);
    }
    daemon.set_state(ring_state::READY);
    let mut got = Vec::new();
    while let Some(c) = loader.try_claim_where(me, &odd) {
        got.push((c.slot(), c.seq()));
        loader.commit(c, 0, 0, 0, 0).unwrap();
    }
    assert_eq!(got, [(2, 11), (0, 13)], "odd seqs, lowest first");
    // The even seqs are still free for others.
    let even: Vec<u64> = std::iter::from_fn(|| loader.try_claim(me, 0))
        .map(|c| c.seq())
        .collect();
    assert_eq!(even, [12, 10]);
    // A slot handed out again: taken in its new round, for its new seq.
    assert!(daemon.take_ready(2, 11).unwrap().is_some());
    daemon.assign(2, 21);
    let c = loader.try_claim_where(me, &odd).expect("seq 21");
    assert_eq!((c.slot(), c.seq()), (2, 21));
}
