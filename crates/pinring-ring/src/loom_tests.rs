//! Model checking of the slot protocol and of the counted futex wake-ups with `loom`. The
//! module is part of the crate (built only with `--cfg loom` for tests) because the transitions it
//! drives are the crate's own: no other crate can call them, only the role handles' methods.
//!
//! Each test runs two or three actors (the daemon and one or two loaders, or a waiter and a
//! waker) through every interleaving (within a preemption bound for the two three-actor models),
//! and lets every load return any value the memory model allows. The actors call the very code the ring runs on the segment:
//! `SlotDesc`'s and `LoaderEntry`'s transitions (slot.rs, recovery.rs) and futex.rs's
//! `wait_counted` / `bump_and_wake_counted`, here on `loom`'s atomics and over a stand-in for the
//! two futex system calls (crate::sync, crate::futex::model). What stays outside: the kernel
//! itself (its locks answer "is the claimant alive?", passed in here as a closure), the mapping,
//! and the timeouts (the model's futex wait has none, so a lost wake-up is a deadlock).
//!
//! A slot's bytes are a `loom::cell::UnsafeCell`: two accesses to them that the protocol does not
//! order, one of them a write, are reported as a data race. So "the daemon sees the bytes written
//! before the commit" and "nobody writes a slot that someone else may still read or write" are
//! checked, not assumed.
//!
//! ```text
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test -p pinring-ring --lib --release loom_tests
//! ```
//!
//! (`LOOM_MAX_PREEMPTIONS` overrides the bound; `LOOM_LOG=trace LOOM_LOCATION=1` explain a
//! failure.)
//!
//! Every actor is a spawned thread; the model's main thread only sets the scene and joins. After
//! a `yield_now`, loom never lets a thread read again a value it saw before it (its rule for
//! making spin loops progress), so an actor that had read values during the set-up could not
//! read them stale later, which would hide bugs; a fresh thread has read nothing.

use crate::futex;
use crate::layout::{abandon_word, LoaderEntry, SlotDesc};
use crate::slot::{Batch, Round, Seat, SlotState};
use crate::sync::atomic::AtomicU32;
use crate::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::thread;
use std::time::Duration;

/// Every interleaving of the model's actors.
const EXHAUSTIVE: Option<usize> = None;

/// Explores `model` with at most `preemption_bound` preemptions per execution (`None`: every
/// interleaving). The models with three busy actors take a minute or more unbounded, so they run
/// bounded (docs/ARCHITECTURE.md lists the bounds); `LOOM_MAX_PREEMPTIONS` overrides every bound.
fn check(preemption_bound: Option<usize>, model: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = preemption_bound;
    }
    b.check(model);
}

const SLOT_BYTES: u64 = 4096;
/// The batch a loader publishes: one payload word.
const BATCH: Batch = Batch {
    payload_len: 8,
    meta_len: 0,
    sample_count: 1,
    error: 0,
};
/// Bytes of the previous round, of a loader's batch, of the next round's claimant.
const OLD: u64 = 0x01d;
const MADE: u64 = 0xba7c;
const NEXT: u64 = 0x0e47;

/// One slot: its descriptor and its bytes (the payload word).
struct Slot {
    desc: SlotDesc,
    bytes: UnsafeCell<u64>,
}

impl Slot {
    fn new() -> Slot {
        Slot {
            desc: SlotDesc::new_idle(),
            bytes: UnsafeCell::new(OLD),
        }
    }

    fn write(&self, v: u64) {
        // SAFETY: loom checks that no other access to the cell races with this one; that is
        // what these tests are for.
        self.bytes.with_mut(|p| unsafe { *p = v })
    }

    fn read(&self) -> u64 {
        // SAFETY: as in `write`.
        self.bytes.with(|p| unsafe { *p })
    }

    /// The daemon's look at a slot it handed out, once a loader has touched it (for the lease
    /// bookkeeping): the word, CLAIMED or already past that (Acquire).
    fn word_after_claim(&self) -> u64 {
        loop {
            let w = self.desc.word_acquire();
            if w.state != Some(SlotState::Free) {
                return w.raw;
            }
            thread::yield_now();
        }
    }

    /// A loader's claim of this slot, which the daemon handed out before the loader started.
    fn claim(&self, seat: Seat) -> Round {
        self.desc
            .try_claim(seat)
            .expect("the only loader claims a FREE slot")
    }
}

/// (a) Two loaders race to claim one slot while the daemon hands it out: if either finds it FREE,
/// exactly one claim wins; the winner sees the seq the daemon published (B: Release store of
/// FREE, Acquire claim), and its writes into the slot come after the daemon's last read of the
/// previous round (D). (Each loader looks once: a loader that finds nothing sleeps on the work
/// futex in the ring, which (d) checks.)
#[test]
fn two_loaders_race_for_one_free_slot() {
    check(Some(3), || {
        let slot = Arc::new(Slot::new());
        let loaders: Vec<_> = (0..2u16)
            .map(|index| {
                let slot = Arc::clone(&slot);
                thread::spawn(move || {
                    let saw_free = slot.desc.word_acquire().state == Some(SlotState::Free);
                    let round = slot.desc.try_claim(Seat { index, tenure: 1 });
                    if round.is_some() {
                        slot.write(MADE);
                    }
                    (saw_free, round)
                })
            })
            .collect();
        // Daemon: the previous round's upload reads the bytes, then the slot is handed out.
        let daemon = {
            let slot = Arc::clone(&slot);
            thread::spawn(move || {
                assert_eq!(slot.read(), OLD);
                slot.desc.assign(7, 0)
            })
        };
        let ticket = daemon.join().unwrap();
        let seen: Vec<(bool, Option<Round>)> =
            loaders.into_iter().map(|l| l.join().unwrap()).collect();
        let won: Vec<Round> = seen.iter().filter_map(|&(_, r)| r).collect();
        let w = slot.desc.word_acquire();
        assert!(won.len() <= 1, "two claims won: {won:?}");
        if seen.iter().any(|&(saw_free, _)| saw_free) {
            assert_eq!(
                won.len(),
                1,
                "a loader found the slot FREE, yet no claim won"
            );
        }
        if let Some(&round) = won.first() {
            assert_eq!(round, Round { seq: 7, ticket });
            assert_eq!((w.state, w.ticket), (Some(SlotState::Claimed), ticket));
            assert_eq!(slot.read(), MADE);
        } else {
            assert_eq!(w.state, Some(SlotState::Free), "nobody claimed it");
        }
    });
}

/// (a') Draining: the daemon's unassign and a loader's claim race on a FREE slot; exactly one
/// wins.
#[test]
fn a_draining_unassign_and_a_claim_never_both_win() {
    check(EXHAUSTIVE, || {
        let slot = Arc::new(Slot::new());
        let ticket = slot.desc.assign(3, 0);
        let loader = {
            let slot = Arc::clone(&slot);
            thread::spawn(move || {
                slot.desc.try_claim(Seat {
                    index: 0,
                    tenure: 1,
                })
            })
        };
        let daemon = {
            let slot = Arc::clone(&slot);
            thread::spawn(move || slot.desc.unassign_if_free())
        };
        let unassigned = daemon.join().unwrap();
        let claimed = loader.join().unwrap();
        let w = slot.desc.word_acquire();
        match (unassigned, claimed) {
            (true, None) => assert_eq!((w.state, w.ticket), (Some(SlotState::Idle), ticket + 1)),
            (false, Some(round)) => {
                assert_eq!(round, Round { seq: 3, ticket });
                assert_eq!(w.state, Some(SlotState::Claimed));
            }
            other => panic!("unassign and claim: {other:?}"),
        }
    });
}

/// (b) A loader's commit races the daemon's reclaim of its slot, the kernel saying the claimant
/// is gone (the worst case: it answers so while the commit is still in flight). Either the commit
/// lands and the daemon takes the batch and sees the bytes written before it (C), or the reclaim
/// lands, the slot is FREE again with the same seq and a new ticket, and the commit fails.
#[test]
fn a_commit_and_a_dead_owner_reclaim_never_both_land() {
    check(EXHAUSTIVE, || {
        let slot = Arc::new(Slot::new());
        let ticket = slot.desc.assign(5, 0);
        let seat = Seat {
            index: 0,
            tenure: 1,
        };
        let loader = {
            let slot = Arc::clone(&slot);
            thread::spawn(move || {
                let round = slot.claim(seat);
                assert_eq!(round, Round { seq: 5, ticket });
                slot.write(MADE);
                slot.desc.commit(seat, round.ticket, BATCH)
            })
        };
        // Daemon: once the slot is claimed, its reap pass finds the claimant's lock free.
        let daemon = {
            let slot = Arc::clone(&slot);
            thread::spawn(move || {
                while slot.desc.word_acquire().state == Some(SlotState::Free) {
                    thread::yield_now();
                }
                let reclaimed = slot.desc.reclaim_if_owner_dead(|owner, tenure| {
                    assert_eq!((owner, tenure), (seat.index, seat.tenure));
                    Some(false)
                });
                let taken = slot.desc.take_ready(0, 5, SLOT_BYTES).unwrap();
                match (reclaimed, taken) {
                    (None, Some(t)) => {
                        assert_eq!((t.seq, t.payload_len, t.owner), (5, 8, 0));
                        assert_eq!(slot.read(), MADE, "the committed bytes");
                        true
                    }
                    (Some(seq), None) => {
                        assert_eq!(seq, 5);
                        // The next claimant gets the same seq in a new round.
                        let next = slot.desc.try_claim(Seat {
                            index: 1,
                            tenure: 1,
                        });
                        assert_eq!(
                            next,
                            Some(Round {
                                seq: 5,
                                ticket: ticket + 1
                            })
                        );
                        false
                    }
                    other => panic!("reclaim and take: {other:?}"),
                }
            })
        };
        let taken = daemon.join().unwrap();
        let committed = loader.join().unwrap();
        assert_eq!(
            committed, taken,
            "the commit lands exactly when the reclaim does not"
        );
    });
}

/// (c) A live loader hangs past its lease: the daemon takes the slot back (CLAIMED → IDLE,
/// quarantined) while the loader may still write into it and commit late. Either the commit came
/// first and the batch is taken as usual, or the late commit fails, and the slot is handed out
/// again only after the loader's abandon word, so the zombie's writes are ordered before the next
/// claimant's.
#[test]
fn a_quarantined_slot_is_released_only_by_the_abandon_word() {
    check(EXHAUSTIVE, || {
        let slot = Arc::new(Slot::new());
        let entry = Arc::new(LoaderEntry::new_active(1));
        slot.desc.assign(9, 0);
        let seat = Seat {
            index: 0,
            tenure: 1,
        };
        let loader = {
            let (slot, entry) = (Arc::clone(&slot), Arc::clone(&entry));
            thread::spawn(move || {
                let round = slot.claim(seat);
                slot.write(MADE);
                let committed = slot.desc.commit(seat, round.ticket, BATCH);
                if !committed {
                    entry.abandon(0, round.ticket);
                }
                committed
            })
        };
        // Daemon: the claim it saw has not changed within the lease (if the word is past CLAIMED,
        // `expire` declines).
        let daemon = {
            let (slot, entry) = (Arc::clone(&slot), Arc::clone(&entry));
            thread::spawn(move || {
                let observed = slot.word_after_claim();
                match slot.desc.expire(0, observed, Some(&entry), None) {
                    Some(e) => {
                        assert_eq!((e.seq, e.owner, e.tenure), (9, 0, 1));
                        // The loader's lock is held (it lives), so only its abandon word
                        // releases the slot.
                        while !entry.has_abandoned(&e) {
                            thread::yield_now();
                        }
                        assert_eq!(entry.abandoned.load(Relaxed), abandon_word(0, e.ticket));
                        // Released: handed out again; the next claimant writes into it.
                        let ticket = slot.desc.assign(9, 0);
                        let next = slot.desc.try_claim(Seat {
                            index: 1,
                            tenure: 1,
                        });
                        assert_eq!(next, Some(Round { seq: 9, ticket }));
                        slot.write(NEXT);
                        false
                    }
                    None => {
                        // The commit changed the word first: the batch is taken as usual.
                        let t = slot.desc.take_ready(0, 9, SLOT_BYTES).unwrap();
                        assert_eq!(t.map(|t| t.seq), Some(9));
                        assert_eq!(slot.read(), MADE);
                        true
                    }
                }
            })
        };
        let taken = daemon.join().unwrap();
        assert_eq!(loader.join().unwrap(), taken, "a late commit fails");
    });
}

/// (c') As (c), for a loader that had abandoned an earlier slot just before it claimed this one:
/// its earlier abandon word must not be taken for an acknowledgement of this slot. (This failed
/// while the claim CAS was Acquire only: see "Model checking" in docs/ARCHITECTURE.md.)
#[test]
fn an_earlier_abandon_word_does_not_release_a_later_slot() {
    check(EXHAUSTIVE, || {
        let earlier = Arc::new(Slot::new());
        let slot = Arc::new(Slot::new());
        let entry = Arc::new(LoaderEntry::new_active(1));
        let seat = Seat {
            index: 0,
            tenure: 1,
        };
        // Before: the loader claimed slot 0, and the daemon took it back when its lease ran out.
        earlier.desc.assign(3, 0);
        let stale = earlier.desc.try_claim(seat).unwrap();
        let w = earlier.desc.word_acquire().raw;
        earlier.desc.expire(0, w, Some(&entry), None).unwrap();
        slot.desc.assign(4, 0);
        let loader = {
            let (earlier, slot, entry) =
                (Arc::clone(&earlier), Arc::clone(&slot), Arc::clone(&entry));
            thread::spawn(move || {
                // Its late commit of slot 0 is refused: it abandons slot 0, and claims slot 1.
                assert!(!earlier.desc.commit(seat, stale.ticket, BATCH));
                entry.abandon(0, stale.ticket);
                let round = slot.claim(seat);
                slot.write(MADE);
                if !slot.desc.commit(seat, round.ticket, BATCH) {
                    entry.abandon(1, round.ticket);
                }
            })
        };
        // Daemon: slot 1's claim outlives its lease too.
        let daemon = {
            let (slot, entry) = (Arc::clone(&slot), Arc::clone(&entry));
            thread::spawn(move || {
                let observed = slot.word_after_claim();
                match slot.desc.expire(1, observed, Some(&entry), None) {
                    Some(e) => {
                        while !entry.has_abandoned(&e) {
                            thread::yield_now();
                        }
                        slot.desc.assign(4, 0);
                        slot.write(NEXT);
                    }
                    None => {
                        let t = slot.desc.take_ready(1, 4, SLOT_BYTES).unwrap();
                        assert_eq!(t.map(|t| t.seq), Some(4));
                        assert_eq!(slot.read(), MADE);
                    }
                }
            })
        };
        daemon.join().unwrap();
        loader.join().unwrap();
    });
}

/// (d) The counted wake-up, as a loader waits for a FREE slot and the daemon frees one: the
/// loader loads the futex word, finds no slot, and waits counted; the daemon hands the slot out,
/// bumps the word and makes the wake call only if it sees a waiter counted. The model's wait has
/// no deadline: a loader left asleep would be a deadlock.
#[test]
fn a_counted_wait_never_misses_the_wake_for_a_freed_slot() {
    check(EXHAUSTIVE, || {
        let slot = Arc::new(Slot::new());
        let word = Arc::new(AtomicU32::new(0));
        let waiters = Arc::new(AtomicU32::new(0));
        let loader = {
            let (slot, word, waiters) =
                (Arc::clone(&slot), Arc::clone(&word), Arc::clone(&waiters));
            thread::spawn(move || loop {
                let seen = word.load(Acquire);
                if let Some(round) = slot.desc.try_claim(Seat {
                    index: 0,
                    tenure: 1,
                }) {
                    return round;
                }
                futex::wait_counted(&word, &waiters, seen, Duration::from_millis(100));
            })
        };
        let daemon = {
            let (slot, word, waiters) =
                (Arc::clone(&slot), Arc::clone(&word), Arc::clone(&waiters));
            thread::spawn(move || {
                let ticket = slot.desc.assign(2, 0);
                futex::bump_and_wake_counted(&word, &waiters, 1);
                ticket
            })
        };
        let ticket = daemon.join().unwrap();
        assert_eq!(loader.join().unwrap(), Round { seq: 2, ticket });
        assert_eq!(waiters.load(Relaxed), 0);
    });
}

/// (d') Two loaders wait; the daemon frees two slots one after the other and wakes one loader
/// for each (as it does: one wake per freed slot, never all). Neither loader is left asleep.
#[test]
fn one_wake_per_freed_slot_leaves_no_loader_asleep() {
    check(Some(2), || {
        let slots = Arc::new([Slot::new(), Slot::new()]);
        let word = Arc::new(AtomicU32::new(0));
        let waiters = Arc::new(AtomicU32::new(0));
        let loaders: Vec<_> = (0..2u16)
            .map(|index| {
                let (slots, word, waiters) =
                    (Arc::clone(&slots), Arc::clone(&word), Arc::clone(&waiters));
                thread::spawn(move || loop {
                    let seen = word.load(Acquire);
                    let seat = Seat { index, tenure: 1 };
                    if let Some(round) = slots.iter().find_map(|s| s.desc.try_claim(seat)) {
                        return round.seq;
                    }
                    futex::wait_counted(&word, &waiters, seen, Duration::from_millis(100));
                })
            })
            .collect();
        let daemon = {
            let (slots, word, waiters) =
                (Arc::clone(&slots), Arc::clone(&word), Arc::clone(&waiters));
            thread::spawn(move || {
                for (i, slot) in slots.iter().enumerate() {
                    slot.desc.assign(i as u64, 0);
                    futex::bump_and_wake_counted(&word, &waiters, 1);
                }
            })
        };
        daemon.join().unwrap();
        let mut seqs: Vec<u64> = loaders.into_iter().map(|l| l.join().unwrap()).collect();
        seqs.sort();
        assert_eq!(seqs, [0, 1]);
    });
}

/// (d'') The daemon's quiet wait: with enough uploads in flight its main loop waits on the
/// doorbell counted only in a count of its own (`DaemonRing::wait_doorbell_quiet`), so a loader's
/// commit bumps the word without a wake call, while the completion thread's ring checks both
/// counts. The completion is never missed, the commit's bump notwithstanding.
#[test]
fn a_quiet_wait_never_misses_the_completion_that_ends_it() {
    check(Some(3), || {
        let word = Arc::new(AtomicU32::new(0));
        let shared = Arc::new(AtomicU32::new(0));
        let quiet = Arc::new(AtomicU32::new(0));
        let completed = Arc::new(AtomicU32::new(0));
        let main_loop = {
            let (word, quiet, completed) = (
                Arc::clone(&word),
                Arc::clone(&quiet),
                Arc::clone(&completed),
            );
            thread::spawn(move || loop {
                let seen = word.load(Acquire);
                if completed.load(Acquire) == 1 {
                    return;
                }
                futex::wait_counted(&word, &quiet, seen, Duration::from_millis(100));
            })
        };
        let loader = {
            let (word, shared) = (Arc::clone(&word), Arc::clone(&shared));
            thread::spawn(move || futex::bump_and_wake_counted(&word, &shared, 1))
        };
        let completion = {
            let (word, shared, quiet, completed) = (
                Arc::clone(&word),
                Arc::clone(&shared),
                Arc::clone(&quiet),
                Arc::clone(&completed),
            );
            thread::spawn(move || {
                completed.store(1, Release);
                futex::bump_and_wake_counted_either(&word, &shared, &quiet, 1);
            })
        };
        loader.join().unwrap();
        completion.join().unwrap();
        main_loop.join().unwrap();
        assert_eq!(quiet.load(Relaxed), 0);
    });
}
