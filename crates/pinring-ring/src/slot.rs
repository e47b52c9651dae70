//! The slot state machine.
//!
//! A slot's state, owner and ticket are packed into one 64-bit word so that a loader claims a slot
//! *and* records itself as its owner with a single compare-and-swap:
//!
//! ```text
//!  63            32 31          16 15     8 7      0
//! +----------------+--------------+--------+--------+
//! |     ticket     |    tenure    | owner  | state  |
//! +----------------+--------------+--------+--------+
//! ```
//!
//! * `state`: [`SlotState`].
//! * `owner`: loader-table index of the claimant, [`NO_OWNER`] when unowned.
//! * `tenure`: the claimant's tenure of that table entry. Whether the claimant lives is the lock
//!   [`crate::lock::tenure_lock`]`(owner, tenure)`, so a loader that later takes over the same
//!   entry never makes a dead predecessor's claim look alive.
//! * `ticket`: bumped by the daemon every time it hands the slot out (FREE). A loader's commit is
//!   a CAS that expects its own ticket, so a loader whose slot was taken back (it hung, the daemon
//!   reclaimed and re-issued the slot) can never publish into the new round.
//!
//! ```text
//!            daemon: assign seq          loader: CAS claim
//!   IDLE ───────────────────────► FREE ─────────────────────► CLAIMED
//!    ▲                              ▲  ◄─────────────────────    │
//!    │ daemon: no more work         │   daemon: reclaim          │ loader: CAS commit
//!    │                              │   (owner dead, same seq)   ▼
//!  UPLOADING ───────────────────────┘ ◄───────────────────────  READY
//!       daemon: upload done, next seq        daemon: CAS take
//! ```
//!
//! The transitions are methods of [`SlotDesc`] (here, and the lease expiry in
//! [`crate::recovery`]): pure operations on the descriptor's atomics, with no segment, file or
//! lock behind them. [`crate::ring::Ring`] calls them on descriptors in the mapping, with the
//! kernel's answers (is the claimant alive?) passed in; the model checker (src/loom_tests.rs) calls
//! the same code on `loom`'s atomics (see [`crate::sync`]).
//!
//! Orderings, stated once and referred to at each site:
//! * (B) Hand-out: the daemon writes `seq` (Relaxed), then stores the slot word FREE with Release;
//!   a loader's successful claim CAS is Acquire, so it reads the seq the daemon wrote.
//! * (B') Claim: the claim CAS is also Release, so a daemon that loads the CLAIMED word with
//!   Acquire sees everything the loader did before claiming, in particular the abandon word of
//!   the slot it held before (recovery.rs relies on it to tell an old acknowledgement from a new
//!   one).
//! * (C) Commit: the loader writes payload, metadata and lengths, then CASes the word
//!   CLAIMED→READY with Release; the daemon loads the word with Acquire before reading lengths or
//!   bytes, so it sees everything the loader wrote.
//! * (D) Release: the daemon finishes reading a slot (upload complete) before its Release store of
//!   FREE, so a loader that claims it next cannot overwrite bytes still being read.

use crate::clock::monotonic_ns;
use crate::error::SlotFault;
use crate::layout::{align_up, SlotDesc, META_ALIGN};
use crate::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};

/// States of a slot (low byte of the slot word).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum SlotState {
    /// No work assigned (end of plan, or draining).
    Idle = 0,
    /// Carries a seq; waiting for a loader.
    Free = 1,
    /// A loader is producing the batch.
    Claimed = 2,
    /// The batch is complete; waiting for the daemon.
    Ready = 3,
    /// The daemon is uploading from the slot.
    Uploading = 4,
}

impl SlotState {
    /// Decodes a state byte; `None` for a value no valid writer produces.
    pub fn from_u8(v: u8) -> Option<SlotState> {
        Some(match v {
            0 => SlotState::Idle,
            1 => SlotState::Free,
            2 => SlotState::Claimed,
            3 => SlotState::Ready,
            4 => SlotState::Uploading,
            _ => return None,
        })
    }

    /// Name for messages and status output.
    pub fn name(self) -> &'static str {
        match self {
            SlotState::Idle => "IDLE",
            SlotState::Free => "FREE",
            SlotState::Claimed => "CLAIMED",
            SlotState::Ready => "READY",
            SlotState::Uploading => "UPLOADING",
        }
    }
}

/// Owner value of an unowned slot.
pub const NO_OWNER: u16 = 0xff;

/// A decoded slot word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotWord {
    /// The state, or `None` if the state byte is garbage.
    pub state: Option<SlotState>,
    /// Loader-table index of the owner, [`NO_OWNER`] if none.
    pub owner: u16,
    /// The owner's tenure of its table entry (0 when unowned).
    pub tenure: u16,
    /// Round counter, bumped each time the slot is handed out.
    pub ticket: u32,
    /// The raw word (for CAS).
    pub raw: u64,
}

impl SlotWord {
    /// Packs a word with no owner.
    pub const fn pack(state: SlotState, ticket: u32) -> u64 {
        Self::pack_owned(state, NO_OWNER, 0, ticket)
    }

    /// Packs a word owned by (`owner`, `tenure`). `owner` must be below 256 (the table holds
    /// [`crate::layout::MAX_LOADERS`]).
    pub const fn pack_owned(state: SlotState, owner: u16, tenure: u16, ticket: u32) -> u64 {
        (state as u64)
            | (((owner & 0xff) as u64) << 8)
            | ((tenure as u64) << 16)
            | ((ticket as u64) << 32)
    }

    /// Unpacks a word read from shared memory. Never fails: garbage gives `state: None`.
    pub fn unpack(raw: u64) -> SlotWord {
        SlotWord {
            state: SlotState::from_u8((raw & 0xff) as u8),
            owner: ((raw >> 8) & 0xff) as u16,
            tenure: ((raw >> 16) & 0xffff) as u16,
            ticket: (raw >> 32) as u32,
            raw,
        }
    }
}

/// A loader's place in the loader table: its entry and its tenure of that entry, both held as
/// kernel locks on the segment file for as long as the loader is attached (see `crate::lock`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seat {
    /// Loader-table index.
    pub index: u16,
    /// Tenure of the entry.
    pub tenure: u16,
}

/// The round of a slot a loader won with its claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Round {
    /// Seq of the batch to make (the one the daemon published with FREE).
    pub seq: u64,
    /// Ticket of the round: the commit CAS expects it, an abandon names it.
    pub ticket: u32,
}

/// What a loader publishes with its commit (lengths already checked against the slot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batch {
    /// Payload bytes.
    pub payload_len: u64,
    /// Metadata bytes.
    pub meta_len: u32,
    /// Samples in the batch.
    pub sample_count: u32,
    /// Loader error code (0 = none).
    pub error: u32,
}

/// A committed batch, taken by the daemon (slot now UPLOADING).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Taken {
    /// Slot index.
    pub slot: u32,
    /// Seq of the batch.
    pub seq: u64,
    /// Payload bytes (validated to fit the slot).
    pub payload_len: u64,
    /// Offset of the metadata within the slot.
    pub meta_offset: u64,
    /// Metadata bytes (validated to fit the slot).
    pub meta_len: u64,
    /// Loader-reported sample count (informational; the metadata is checked separately).
    pub sample_count: u32,
    /// Loader-table index of the committer.
    pub owner: u16,
    /// CLOCK_MONOTONIC ns of the commit.
    pub commit_ns: u64,
}

/// Where the metadata of a batch with these lengths starts, if payload and metadata both fit in a
/// slot of `slot_bytes`; `None` if any byte would lie outside the slot (or a sum overflows). The
/// one check that keeps every read of a committed slot inside it.
pub fn fit_in_slot(payload_len: u64, meta_len: u64, slot_bytes: u64) -> Option<u64> {
    let meta_offset = align_up(payload_len, META_ALIGN)?;
    let end = meta_offset.checked_add(meta_len)?;
    (payload_len <= slot_bytes && end <= slot_bytes).then_some(meta_offset)
}

impl SlotDesc {
    /// The state word (Acquire: whatever the writer of this word published before it is visible).
    pub fn word_acquire(&self) -> SlotWord {
        SlotWord::unpack(self.word.load(Acquire))
    }

    /// Loader: claims the slot if it is FREE (FREE → CLAIMED by `seat`, one CAS that also records
    /// the owner). `None`: not FREE, or another loader won the CAS.
    pub(crate) fn try_claim(&self, seat: Seat) -> Option<Round> {
        let w = SlotWord::unpack(self.word.load(Relaxed));
        if w.state != Some(SlotState::Free) {
            return None;
        }
        self.claim_word(seat, w)
    }

    /// Loader: the seq this slot is handed out for while it is FREE, with the word seen (for
    /// [`SlotDesc::try_claim_seen`]); `None` if it is not FREE. A look, not a claim: the slot
    /// may be claimed by another loader the moment after.
    pub(crate) fn free_seq(&self) -> Option<(u64, SlotWord)> {
        // Acquire pairs with the daemon's Release store of FREE: the seq stored before it is
        // the one of this round (the ticket in `w` names the round; a later round bumps it).
        let w = SlotWord::unpack(self.word.load(Acquire));
        (w.state == Some(SlotState::Free)).then(|| (self.seq.load(Relaxed), w))
    }

    /// Loader: claims the slot in the round `seen` (from [`SlotDesc::free_seq`]): the CAS
    /// expects exactly that word, so a slot handed out again since (another ticket, another seq)
    /// is not taken. `None`: another loader won, or the round moved on.
    pub(crate) fn try_claim_seen(&self, seat: Seat, seen: SlotWord) -> Option<Round> {
        self.claim_word(seat, seen)
    }

    fn claim_word(&self, seat: Seat, w: SlotWord) -> Option<Round> {
        let claimed = SlotWord::pack_owned(SlotState::Claimed, seat.index, seat.tenure, w.ticket);
        // (B): Acquire pairs with the daemon's Release store of FREE: the seq is visible.
        // (B'): Release publishes this loader's earlier writes (its last abandon word) to a
        // daemon that sees the claim.
        self.word
            .compare_exchange(w.raw, claimed, AcqRel, Relaxed)
            .ok()?;
        self.owner_pid.store(std::process::id(), Relaxed);
        self.claim_ns.store(monotonic_ns(), Relaxed);
        Some(Round {
            seq: self.seq.load(Relaxed),
            ticket: w.ticket,
        })
    }

    /// Loader: publishes `batch` in the round `ticket` that `seat` claimed (CLAIMED → READY, a
    /// CAS expecting exactly that claim). False: the slot was taken back (the ticket moved on),
    /// and the batch is not published.
    pub(crate) fn commit(&self, seat: Seat, ticket: u32, batch: Batch) -> bool {
        self.payload_len.store(batch.payload_len, Relaxed);
        self.meta_len.store(batch.meta_len, Relaxed);
        self.sample_count.store(batch.sample_count, Relaxed);
        self.error.store(batch.error, Relaxed);
        self.commit_ns.store(monotonic_ns(), Relaxed);
        let expected = SlotWord::pack_owned(SlotState::Claimed, seat.index, seat.tenure, ticket);
        let ready = SlotWord::pack_owned(SlotState::Ready, seat.index, seat.tenure, ticket);
        // (C): Release publishes the payload, metadata and lengths written above.
        self.word
            .compare_exchange(expected, ready, Release, Relaxed)
            .is_ok()
    }

    /// Daemon: hands the slot out for `seq` (from IDLE or UPLOADING, both the daemon's), at
    /// `free_ns` on the monotonic clock (informational: `free_ns`). Returns the new ticket.
    pub(crate) fn assign(&self, seq: u64, free_ns: u64) -> u32 {
        let ticket = SlotWord::unpack(self.word.load(Relaxed))
            .ticket
            .wrapping_add(1);
        self.seq.store(seq, Relaxed);
        self.payload_len.store(0, Relaxed);
        self.meta_len.store(0, Relaxed);
        self.error.store(0, Relaxed);
        self.owner_pid.store(0, Relaxed);
        self.free_ns.store(free_ns, Relaxed);
        // (B)/(D): Release publishes the seq, and orders every read of the slot's previous
        // contents (the upload finished before this call) before a loader may overwrite it.
        self.word
            .store(SlotWord::pack(SlotState::Free, ticket), Release);
        ticket
    }

    /// Daemon: parks the slot with no work (end of plan, or draining).
    pub(crate) fn park(&self) {
        let ticket = SlotWord::unpack(self.word.load(Relaxed))
            .ticket
            .wrapping_add(1);
        self.seq.store(u64::MAX, Relaxed);
        self.word
            .store(SlotWord::pack(SlotState::Idle, ticket), Release);
    }

    /// Daemon, draining: takes a FREE slot back (FREE → IDLE, new ticket) so no loader claims
    /// it. True if it was FREE and no claim beat the CAS.
    pub(crate) fn unassign_if_free(&self) -> bool {
        let w = SlotWord::unpack(self.word.load(Acquire));
        if w.state != Some(SlotState::Free) {
            return false;
        }
        let idle = SlotWord::pack(SlotState::Idle, w.ticket.wrapping_add(1));
        self.word
            .compare_exchange(w.raw, idle, AcqRel, Relaxed)
            .is_ok()
    }

    /// Daemon: if the slot (index `slot`) is READY, validates the descriptor against the seq the
    /// daemon assigned and takes it (READY → UPLOADING). `Ok(None)`: not ready yet.
    pub(crate) fn take_ready(
        &self,
        slot: u32,
        assigned_seq: u64,
        slot_bytes: u64,
    ) -> Result<Option<Taken>, SlotFault> {
        // (C): Acquire pairs with the loader's Release commit.
        let w = SlotWord::unpack(self.word.load(Acquire));
        if w.state != Some(SlotState::Ready) {
            return Ok(None);
        }
        let seq = self.seq.load(Relaxed);
        let payload_len = self.payload_len.load(Relaxed);
        let meta_len = u64::from(self.meta_len.load(Relaxed));
        let error = self.error.load(Relaxed);
        // Whatever the outcome, the slot now belongs to the daemon.
        let uploading = SlotWord::pack_owned(SlotState::Uploading, w.owner, w.tenure, w.ticket);
        if self
            .word
            .compare_exchange(w.raw, uploading, AcqRel, Relaxed)
            .is_err()
        {
            return Err(SlotFault::Raced { slot, raw: w.raw });
        }
        if seq != assigned_seq {
            return Err(SlotFault::WrongSeq {
                slot,
                expected: assigned_seq,
                found: seq,
            });
        }
        if error != 0 {
            return Err(SlotFault::LoaderError {
                slot,
                seq,
                code: error,
            });
        }
        let Some(meta_offset) = fit_in_slot(payload_len, meta_len, slot_bytes) else {
            return Err(SlotFault::BadLength {
                slot,
                seq,
                payload: payload_len,
                meta: meta_len,
                slot_bytes,
            });
        };
        Ok(Some(Taken {
            slot,
            seq,
            payload_len,
            meta_offset,
            meta_len,
            sample_count: self.sample_count.load(Relaxed),
            owner: w.owner,
            commit_ns: self.commit_ns.load(Relaxed),
        }))
    }

    /// Daemon: if the slot is CLAIMED by a claimant that `alive(owner, tenure)` says is gone
    /// (`Some(false)`; `None`, "could not ask", counts as alive), puts it back to FREE with the
    /// same seq and a new ticket, so the dead owner's commit could never land. Returns the seq.
    pub(crate) fn reclaim_if_owner_dead(
        &self,
        alive: impl FnOnce(u16, u16) -> Option<bool>,
    ) -> Option<u64> {
        let w = SlotWord::unpack(self.word.load(Acquire));
        if w.state != Some(SlotState::Claimed) {
            return None;
        }
        if alive(w.owner, w.tenure).unwrap_or(true) {
            return None;
        }
        let seq = self.seq.load(Relaxed);
        let free = SlotWord::pack(SlotState::Free, w.ticket.wrapping_add(1));
        self.word
            .compare_exchange(w.raw, free, AcqRel, Relaxed)
            .ok()
            .map(|_| seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn pack_unpack_roundtrip() {
        for state in [
            SlotState::Idle,
            SlotState::Free,
            SlotState::Claimed,
            SlotState::Ready,
            SlotState::Uploading,
        ] {
            let w = SlotWord::unpack(SlotWord::pack_owned(state, 7, 0xbeef, 0xdead_beef));
            assert_eq!(w.state, Some(state));
            assert_eq!((w.owner, w.tenure), (7, 0xbeef));
            assert_eq!(w.ticket, 0xdead_beef);
            let w = SlotWord::unpack(SlotWord::pack(state, 3));
            assert_eq!((w.owner, w.tenure, w.ticket), (NO_OWNER, 0, 3));
        }
    }

    #[test]
    fn garbage_state_is_rejected() {
        assert_eq!(SlotWord::unpack(5).state, None);
        assert_eq!(SlotWord::unpack(0xff).state, None);
    }

    proptest! {
        #[test]
        fn unpack_never_panics_and_repacks(raw in any::<u64>()) {
            let w = SlotWord::unpack(raw);
            if let Some(state) = w.state {
                prop_assert_eq!(SlotWord::pack_owned(state, w.owner, w.tenure, w.ticket), raw);
            }
        }
    }
}
