//! Hostile committed descriptors: whatever a writer puts into a READY slot's descriptor, the
//! daemon's take either refuses it or yields lengths that keep every read inside the slot.
//! Fuzzed with proptest, plus a replayed corpus (tests/corpus/descriptors.txt).

use pinring_ring::{fit_in_slot, Access, CreateOptions, DaemonRing, Ring, SlotState, SlotWord};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use std::sync::atomic::Ordering::Relaxed;

const SLOT_BYTES: u64 = 8192;
const SEQ: u64 = 5;

struct Unlink(String);
impl Drop for Unlink {
    fn drop(&mut self) {
        let _ = pinring_ring::Segment::unlink(&self.0);
    }
}

fn ring(tag: &str) -> (DaemonRing, Unlink) {
    let name = format!("t-hostile-{tag}-{}", std::process::id());
    let ring = DaemonRing::create(&CreateOptions {
        name: name.clone(),
        slots: 2,
        slot_bytes: SLOT_BYTES,
        mode: 0o600,
        group: None,
        fingerprint: 1,
        settings: [0; pinring_ring::layout::SETTINGS_WORDS],
        start_seq: 0,
        end_seq: 100,
        in_order: true,
        replace: false,
        handoff: None,
        anonymous: false,
    })
    .unwrap();
    (ring, Unlink(name))
}

#[derive(Debug, Clone, Copy)]
struct Desc {
    seq: u64,
    payload_len: u64,
    meta_len: u32,
    error: u32,
    owner: u16,
    ticket: u32,
}

/// Publishes `d` as a READY commit of slot 0 (assigned `SEQ`), takes it, and checks the outcome.
/// `forger` is the ring as a hostile process maps it (the daemon's handle has no way to a
/// descriptor's fields).
fn check(ring: &DaemonRing, forger: &Ring, d: Desc) -> Result<(), TestCaseError> {
    ring.assign(0, SEQ);
    let desc = forger.desc(0);
    desc.seq.store(d.seq, Relaxed);
    desc.payload_len.store(d.payload_len, Relaxed);
    desc.meta_len.store(d.meta_len, Relaxed);
    desc.error.store(d.error, Relaxed);
    desc.word.store(
        SlotWord::pack_owned(SlotState::Ready, d.owner, 0, d.ticket),
        std::sync::atomic::Ordering::Release,
    );
    let fits = fit_in_slot(d.payload_len, u64::from(d.meta_len), SLOT_BYTES);
    match ring.take_ready(0, SEQ) {
        Ok(Some(t)) => {
            prop_assert_eq!(t.seq, SEQ);
            prop_assert_eq!(d.seq, SEQ);
            prop_assert_eq!(d.error, 0);
            prop_assert!(t.payload_len <= SLOT_BYTES);
            prop_assert!(t.meta_offset <= SLOT_BYTES);
            prop_assert!(t.meta_len <= SLOT_BYTES - t.meta_offset);
            prop_assert_eq!(fits, Some(t.meta_offset));
            // The reads the daemon makes next stay inside the slot (they assert it).
            let mut out = Vec::new();
            ring.copy_out(0, 0, t.payload_len, &mut out);
            ring.copy_out(0, t.meta_offset, t.meta_len, &mut out);
        }
        Ok(None) => prop_assert!(false, "a READY slot was not taken"),
        Err(_) => prop_assert!(d.seq != SEQ || d.error != 0 || fits.is_none()),
    }
    Ok(())
}

#[test]
fn the_corpus_of_hostile_descriptors_is_refused_or_kept_inside_the_slot() {
    let (ring, _u) = ring("corpus");
    let forger = Ring::open(ring.name(), Access::ReadWrite, std::time::Duration::ZERO).unwrap();
    let text = include_str!("corpus/descriptors.txt");
    let mut n = 0;
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let v: Vec<u64> = line
            .split_whitespace()
            .map(|x| x.parse().unwrap())
            .collect();
        let d = Desc {
            seq: v[0],
            payload_len: v[1],
            meta_len: v[2] as u32,
            error: v[3] as u32,
            owner: 3,
            ticket: 9,
        };
        check(&ring, &forger, d).unwrap_or_else(|e| panic!("corpus line {line:?}: {e}"));
        n += 1;
    }
    assert!(n >= 15);
}

#[test]
fn fuzzed_descriptors_are_refused_or_kept_inside_the_slot() {
    let (ring, _u) = ring("fuzz");
    let forger = Ring::open(ring.name(), Access::ReadWrite, std::time::Duration::ZERO).unwrap();
    let len = prop_oneof![
        Just(0u64),
        0u64..=2 * SLOT_BYTES,
        (SLOT_BYTES - 128)..=(SLOT_BYTES + 128),
        any::<u64>(),
        (u64::MAX - 256)..=u64::MAX,
    ];
    let strategy = (
        prop_oneof![Just(SEQ), any::<u64>()],
        len,
        prop_oneof![0u32..=256, any::<u32>()],
        prop_oneof![Just(0u32), any::<u32>()],
        any::<u16>(),
        any::<u32>(),
    );
    let mut runner = TestRunner::new(Config {
        cases: 2000,
        ..Config::default()
    });
    runner
        .run(
            &strategy,
            |(seq, payload_len, meta_len, error, owner, ticket)| {
                check(
                    &ring,
                    &forger,
                    Desc {
                        seq,
                        payload_len,
                        meta_len,
                        error,
                        owner,
                        ticket,
                    },
                )
            },
        )
        .unwrap();
}

proptest! {
    #[test]
    fn fit_in_slot_never_admits_a_byte_outside(payload: u64, meta: u64, slot in 1u64..=(1 << 30)) {
        if let Some(off) = fit_in_slot(payload, meta, slot) {
            prop_assert!(payload <= off && off % 64 == 0);
            prop_assert!(off <= slot && meta <= slot - off);
        } else {
            prop_assert!(payload > slot || payload.div_ceil(64).saturating_mul(64).saturating_add(meta) > slot
                || payload > u64::MAX - 63);
        }
    }

    #[test]
    fn any_state_word_unpacks_without_panic_and_garbage_is_never_a_state(raw: u64) {
        let w = SlotWord::unpack(raw);
        if (raw & 0xff) > 4 {
            prop_assert_eq!(w.state, None);
        }
        // Owner indices outside the table are never a live claimant.
        prop_assert!(w.owner <= 0xff);
    }
}
