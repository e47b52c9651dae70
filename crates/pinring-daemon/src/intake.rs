//! The intake stage: READY slots taken (in seq order, or any when unordered), each part checked
//! against the daemon's own plan (its metadata, its payload's length) before the uploads stage
//! gets it; a part that fails goes to the bad-batch policy (recovery), a loader's data error
//! ends the run. Its rules are pure: which waiting part is looked at next ([`Look`]) and whether
//! a taken part is the one the plan says ([`check_part`]).
//!
//! Entry point: [`Intake::poll`], once a pass, given the daemon's [`Core`], which takes parts
//! until none is due and hands each to the uploads ([`Uploads::start_upload`]).

use super::delivery::Delivery;
use super::recovery::Recovery;
use super::{Core, DaemonError, Uploads};
use pinring_data::{BatchIndices, BatchMeta, ByteRange, Part};
use pinring_ring::failure::ERR_SAMPLE;
use pinring_ring::{SlotFault, SlotState, Taken};

/// Intake's own state: the buffer a part's metadata is copied into, reused from part to part,
/// so that taking a part allocates nothing.
#[derive(Debug, Default)]
pub(super) struct Intake {
    /// A taken part's metadata, copied out of its slot before it is decoded.
    meta_buf: Vec<u8>,
}

/// Sample-id vectors given back once their batch is delivered (or dropped), for the next
/// parts' ids: the intake takes one per part, the uploads one per batch of several parts, and
/// delivery (or a drain) gives them back, so taking a part allocates nothing. Kept in the
/// daemon's `Core`, since every stage touches it.
#[derive(Debug, Default)]
pub(super) struct SpareIds {
    spare_samples: Vec<Vec<u64>>,
}

impl SpareIds {
    /// An empty vector for a part's or a batch's sample ids (one given back, when there is one).
    pub(super) fn samples(&mut self) -> Vec<u64> {
        self.spare_samples.pop().unwrap_or_default()
    }

    /// Gives back a vector of sample ids for reuse.
    pub(super) fn give_back(&mut self, mut samples: Vec<u64>) {
        samples.clear();
        self.spare_samples.push(samples);
    }
}

/// Which waiting part one pass looks at next, in order: the lowest seq not taken, and, with a
/// look-ahead (`--look-ahead`), up to `look_ahead` later ones past parts that are not READY
/// yet (daemon/reorder.rs holds a batch taken ahead back for its turn).
#[derive(Debug, Clone, Copy)]
pub(super) struct Look {
    look_ahead: usize,
    /// Waiting parts passed over in this pass because they were not READY.
    passed: usize,
}

impl Look {
    /// A pass's look, `look_ahead` parts past the first.
    pub(super) fn new(look_ahead: usize) -> Look {
        Look {
            look_ahead,
            passed: 0,
        }
    }

    /// Whether later seqs than the lowest are offered at all.
    pub(super) fn ahead(&self) -> bool {
        self.look_ahead > 0
    }

    /// In order: the position, among the seqs offered, of the one to look at next; None once
    /// the look is over.
    pub(super) fn position(&self) -> Option<usize> {
        (self.passed <= self.look_ahead).then_some(self.passed)
    }

    /// The part looked at was not READY: whether to look at the next one.
    pub(super) fn pass_over(&mut self) -> bool {
        if self.ahead() {
            self.passed += 1;
        }
        self.ahead()
    }

    /// Whether a part taken now is taken ahead of one that is not READY.
    pub(super) fn taken_ahead(&self) -> bool {
        self.passed > 0
    }
}

/// What the plan says a part is, to check a taken one against.
#[derive(Debug, Clone, Copy)]
pub(super) struct Expected<'a> {
    /// Its seq, epoch, index and sample ids.
    pub(super) indices: &'a BatchIndices,
    /// For a byte part, its range of the cut field.
    pub(super) range: Option<ByteRange>,
    /// The metadata reserve: the metadata is decoded within it.
    pub(super) meta_reserve: usize,
    /// The first field's bytes per sample.
    pub(super) sample_bytes: u64,
    /// Its payload's length.
    pub(super) payload_len: u64,
}

/// Whether the part a loader committed in `slot` for `seq`, with metadata `meta` (copied out
/// of the slot) and `payload_len` bytes of payload, is the one the plan says; if not, what is
/// wrong, naming the slot and the seq. The metadata is untrusted: it is decoded within the
/// reserve and compared with the plan, never used.
pub(super) fn check_part(
    slot: u32,
    seq: u64,
    meta: &[u8],
    payload_len: u64,
    e: &Expected<'_>,
) -> Result<(), String> {
    BatchMeta::check_encoded(
        meta,
        e.meta_reserve,
        e.indices,
        e.range,
        e.sample_bytes,
        e.payload_len,
    )
    .map_err(|err| format!("slot {slot}, seq {seq}: bad batch metadata: {err}"))?;
    if payload_len != e.payload_len {
        return Err(format!(
            "slot {slot}, seq {seq}: payload is {payload_len} bytes, the plan says {}",
            e.payload_len
        ));
    }
    Ok(())
}

/// What intake found.
pub(super) enum Found {
    /// A part taken and checked, for the uploads stage.
    Part(TakenPart),
    /// A part taken and refused (the bad-batch policy skipped it).
    Refused,
    /// No part is due.
    Nothing,
}

/// A part taken from its slot (now UPLOADING, the daemon's) and checked against the plan.
pub(super) struct TakenPart {
    pub(super) slot: u32,
    pub(super) seq: u64,
    /// Where it lies in the plan.
    pub(super) part: Part,
    /// What the slot's descriptor said of it.
    pub(super) taken: Taken,
    /// Its sample ids, from the daemon's plan.
    pub(super) samples: Vec<u64>,
}

impl Intake {
    /// The intake's entry point: takes READY slots (in seq order, or any when unordered) and
    /// starts their uploads, until no part is due. True if anything was taken.
    /// The parts go to `up` (which hands whole batches to `delivery`); a refused part to
    /// `recovery`'s bad-batch policy.
    pub(super) fn poll(
        &mut self,
        core: &mut Core,
        up: &mut Uploads,
        delivery: &mut Delivery,
        recovery: &mut Recovery,
    ) -> Result<bool, DaemonError> {
        let mut progressed = false;
        let mut look = Look::new(core.run.look_ahead);
        loop {
            match self.take_next(core, up, recovery, &mut look)? {
                Found::Part(part) => {
                    progressed = true;
                    up.start_upload(core, delivery, recovery, part)?;
                }
                Found::Refused => progressed = true,
                Found::Nothing => return Ok(progressed),
            }
        }
    }

    /// Takes the next due part, if one is READY, and checks it.
    fn take_next(
        &mut self,
        core: &mut Core,
        up: &Uploads,
        recovery: &mut Recovery,
        look: &mut Look,
    ) -> Result<Found, DaemonError> {
        loop {
            let Some((seq, slot)) = Self::next_candidate(core, up, look) else {
                return Ok(Found::Nothing);
            };
            let taken = match core.ring.take_ready(slot, seq) {
                Ok(Some(t)) => t,
                Ok(None) if look.pass_over() => continue,
                Ok(None) => return Ok(Found::Nothing),
                Err(SlotFault::LoaderError { code, .. }) if code == ERR_SAMPLE => {
                    return Err(recovery.data_failed(core, slot, seq));
                }
                Err(fault) => {
                    recovery.bad_batch(core, slot, seq, fault.to_string())?;
                    return Ok(Found::Refused);
                }
            };
            core.sequencer.taken(slot, seq);
            if look.taken_ahead() {
                core.tally.taken_ahead += 1;
            }
            return self.check_taken(core, recovery, slot, seq, taken);
        }
    }

    /// The waiting part to look at next, and its slot. A part can go up if its batch already
    /// has a device buffer, or may take a free one. In order the sequencer offers the lowest
    /// seq not taken (none while an earlier seq waits for a slot), and with a look-ahead the
    /// later ones too; unordered, every waiting seq: the first that is READY.
    fn next_candidate(core: &Core, up: &Uploads, look: &Look) -> Option<(u64, u32)> {
        let parts = core.run.parts;
        let has_buffer = |seq: u64| {
            up.assemblies.buffer_of(seq / parts).is_some()
                || up.order.may_open(seq / parts, up.free_buffers.len())
        };
        if core.run.cfg.ring.in_order {
            // A later seq's batch needs at least as many buffers: the first that may not take
            // one ends the look.
            let n = look.position()?;
            core.sequencer
                .dispatchable(look.ahead())
                .nth(n)
                .filter(|&(seq, _)| has_buffer(seq))
        } else {
            let ring = &core.ring;
            core.sequencer.dispatchable(false).find(|&(seq, sl)| {
                has_buffer(seq) && ring.slot_view(sl).state == Some(SlotState::Ready)
            })
        }
    }

    /// Checks the part taken from `slot` against the plan ([`check_part`]): the part for the
    /// uploads stage, or refused by the bad-batch policy.
    fn check_taken(
        &mut self,
        core: &mut Core,
        recovery: &mut Recovery,
        slot: u32,
        seq: u64,
        taken: Taken,
    ) -> Result<Found, DaemonError> {
        let mut samples = core.ids.samples();
        let part =
            core.run
                .plan
                .part_into(seq, &mut samples)
                .map_err(|e| DaemonError::Internal {
                    ring: core.run.cfg.ring.name.clone(),
                    what: format!("plan has no part {seq}: {e}"),
                })?;
        // Copied out of shared memory first: decoded in private memory only.
        core.ring
            .copy_out(slot, taken.meta_offset, taken.meta_len, &mut self.meta_buf);
        let indices = BatchIndices {
            seq,
            epoch: part.epoch,
            index_in_epoch: part.index_in_epoch,
            samples,
        };
        // Every field of every sample, field-major; for a byte part its range of the cut
        // field (and the sample's other fields in its first part). The daemon's own plan
        // decides it: the metadata's range is only compared with it, never used.
        let expected = Expected {
            indices: &indices,
            range: part.bytes,
            meta_reserve: core.run.meta_reserve,
            sample_bytes: core.run.sample_bytes,
            payload_len: core
                .run
                .layout
                .part_payload_bytes(indices.samples.len() as u64, part.bytes),
        };
        let verdict = check_part(slot, seq, &self.meta_buf, taken.payload_len, &expected);
        match verdict {
            Ok(()) => Ok(Found::Part(TakenPart {
                slot,
                seq,
                part,
                taken,
                samples: indices.samples,
            })),
            Err(what) => {
                core.ids.give_back(indices.samples);
                recovery.bad_batch(core, slot, seq, what)?;
                Ok(Found::Refused)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pinring_data::Dtype;

    #[test]
    fn in_order_the_look_passes_over_at_most_look_ahead_parts_not_ready() {
        let mut look = Look::new(2);
        assert!(look.ahead());
        assert_eq!(look.position(), Some(0));
        assert!(!look.taken_ahead());
        assert!(look.pass_over());
        assert_eq!(look.position(), Some(1));
        assert!(look.taken_ahead(), "a part taken now is taken ahead");
        assert!(look.pass_over());
        assert_eq!(look.position(), Some(2));
        assert!(look.pass_over());
        assert_eq!(
            look.position(),
            None,
            "three parts not READY: the look is over"
        );
    }

    #[test]
    fn without_a_look_ahead_the_first_part_not_ready_ends_the_look() {
        let mut look = Look::new(0);
        assert!(!look.ahead());
        assert_eq!(look.position(), Some(0));
        assert!(!look.pass_over());
        assert_eq!(look.position(), Some(0));
        assert!(!look.taken_ahead());
    }

    fn planned(n: u64) -> (BatchMeta, BatchIndices) {
        let indices = BatchIndices {
            seq: 7,
            epoch: 1,
            index_in_epoch: 3,
            samples: (0..n).map(|i| i * 13).collect(),
        };
        let labels = (0..n as u32).collect();
        // 3 x 4 f32 images (48 bytes) and 8 more bytes of other fields per sample.
        let meta = BatchMeta::new(&indices, labels, vec![3, 4], Dtype::F32, 56);
        (meta, indices)
    }

    #[test]
    fn a_part_is_taken_only_as_the_plan_says_it_and_a_refusal_names_slot_seq_and_fault() {
        let (meta, indices) = planned(4);
        let mut buf = vec![0u8; 1024];
        meta.encode_into(&mut buf).unwrap();
        let expected = Expected {
            indices: &indices,
            range: None,
            meta_reserve: 1024,
            sample_bytes: 48,
            payload_len: 56 * 4,
        };
        assert_eq!(check_part(5, 7, &buf, 56 * 4, &expected), Ok(()));
        // A payload of another length than the plan's.
        assert_eq!(
            check_part(5, 7, &buf, 56 * 3, &expected),
            Err("slot 5, seq 7: payload is 168 bytes, the plan says 224".to_string())
        );
        // Metadata of another part (a sample id the plan does not have).
        let mut other = meta.clone();
        other.sample_ids[2] += 1;
        other.encode_into(&mut buf).unwrap();
        let e = check_part(5, 7, &buf, 56 * 4, &expected).unwrap_err();
        assert!(
            e.starts_with("slot 5, seq 7: bad batch metadata: ") && e.contains("sample_ids[2]"),
            "{e}"
        );
        // Metadata that does not fit the reserve is not decoded past it.
        meta.encode_into(&mut buf).unwrap();
        let cut = Expected {
            meta_reserve: 8,
            ..expected
        };
        let e = check_part(5, 7, &buf, 56 * 4, &cut).unwrap_err();
        assert!(e.starts_with("slot 5, seq 7: bad batch metadata: "), "{e}");
    }
}
