//! Taking slots back from loaders that hang, and the handshake that makes that safe.
//!
//! A loader that was stopped (SIGSTOP, a stuck NFS read, a debugger) while it held a CLAIMED
//! slot is still alive: it can resume at any time and go on writing payload bytes into the slot
//! before its commit CAS fails. So a slot taken back from a *live* owner is not handed out again
//! at once. [`DaemonRing::reclaim_expired`] moves it CLAIMED → IDLE (new ticket: the late commit
//! fails) and the daemon keeps it out of use ("quarantined") until the old owner is dead or has
//! written [`abandon_word`] into its loader-table entry ([`LoaderRing::abandon`], done right after its
//! refused commit, after which it never touches the slot again). The seq it carried is made in
//! another slot meanwhile. A zombie's bytes therefore only ever land in a slot that nobody will
//! upload from, and the consumer can never see them.
//!
//! The transitions and the handshake are methods of [`SlotDesc`] and [`LoaderEntry`] (pure
//! operations on their atomics, which the model checker runs too, see src/loom_tests.rs); [`Ring`]'s
//! methods find the descriptor and the entry and add the kernel's word on liveness.
//!
//! No unsafe code here: everything goes through the typed views of [`Ring`].

use crate::layout::{abandon_word, LoaderEntry, SlotDesc};
#[cfg(not(loom))]
use crate::layout::{loader_state, MAX_LOADERS};
use crate::process::ProcessId;
#[cfg(not(loom))]
use crate::ring::{DaemonRing, LoaderRing, Ring};
use crate::slot::{SlotState, SlotWord};
use crate::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};

/// A slot taken back from a loader that held it past its lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expired {
    /// Slot index.
    pub slot: u32,
    /// Seq the slot carried (to be made elsewhere).
    pub seq: u64,
    /// Loader-table index of the owner.
    pub owner: u16,
    /// The owner's tenure of that entry.
    pub tenure: u16,
    /// Ticket of the round the owner claimed (its abandon word names it).
    pub ticket: u32,
    /// The owner process as the loader table named it, if the entry was valid.
    pub owner_id: Option<ProcessId>,
    /// The owner's abandon word when the slot was taken back. A loader holds one claim at a
    /// time, so any later abandon word from it means it is past this slot.
    pub abandoned_before: u64,
}

impl SlotDesc {
    /// Daemon: if the slot (index `slot`) still holds exactly the CLAIMED word `observed` (an
    /// Acquire load of it, [`SlotDesc::word_acquire`]; same owner, same ticket: the loader made no
    /// progress since), takes it back: CLAIMED → IDLE with a new ticket, so the owner's commit
    /// fails. `entry` is the owner's loader-table entry (`None` if the word names no valid one),
    /// `owner_id` its identity for messages. The caller keeps the slot out of use until
    /// [`LoaderEntry::has_abandoned`] (or the owner's exit) says the owner can no longer write
    /// into it.
    pub(crate) fn expire(
        &self,
        slot: u32,
        observed: u64,
        entry: Option<&LoaderEntry>,
        owner_id: Option<ProcessId>,
    ) -> Option<Expired> {
        let w = SlotWord::unpack(observed);
        if w.state != Some(SlotState::Claimed) {
            return None;
        }
        // The owner's abandon word as of its claim: `observed` was loaded with Acquire from the
        // claim CAS, which is Release (B' in slot.rs), so this load sees any abandon word the
        // owner wrote before claiming, and `has_abandoned` never takes that one for an answer.
        let abandoned_before = entry.map_or(0, |e| e.abandoned.load(Acquire));
        let seq = self.seq.load(Relaxed);
        let idle = SlotWord::pack(SlotState::Idle, w.ticket.wrapping_add(1));
        // AcqRel: the loss of ownership is ordered before anything the daemon does next with
        // the slot (nothing, until release); the Acquire side pairs with the claim.
        self.word
            .compare_exchange(observed, idle, AcqRel, Relaxed)
            .ok()?;
        Some(Expired {
            slot,
            seq,
            owner: w.owner,
            tenure: w.tenure,
            ticket: w.ticket,
            owner_id,
            abandoned_before,
        })
    }

    /// Daemon side: takes a FREE or READY slot back to IDLE (new ticket) so that it can carry
    /// another seq. Returns the state it was taken from; `None` if it was in neither (a loader
    /// claimed it meanwhile, or it is the daemon's). A READY batch taken back is simply made
    /// again later; its loader finished writing when it committed.
    pub(crate) fn take_back(&self) -> Option<SlotState> {
        let w = SlotWord::unpack(self.word.load(Acquire));
        let state = w.state?;
        if !matches!(state, SlotState::Free | SlotState::Ready) {
            return None;
        }
        let idle = SlotWord::pack(SlotState::Idle, w.ticket.wrapping_add(1));
        self.word
            .compare_exchange(w.raw, idle, AcqRel, Relaxed)
            .ok()
            .map(|_| state)
    }

    /// Daemon side: forces a slot whose descriptor holds a state the daemon never left it in
    /// (garbage, IDLE or UPLOADING while assigned) back to IDLE with a new ticket.
    pub(crate) fn reset_to_idle(&self) {
        let w = SlotWord::unpack(self.word.load(Acquire));
        self.word.store(
            SlotWord::pack(SlotState::Idle, w.ticket.wrapping_add(1)),
            Release,
        );
    }
}

impl LoaderEntry {
    /// Loader side: after a refused commit, promises never to touch `slot` of round `ticket`
    /// again, so the daemon may hand the slot out once more.
    pub(crate) fn abandon(&self, slot: u32, ticket: u32) {
        // Release: every write this loader made into the slot happens before the daemon, which
        // loads this word with Acquire, re-issues the slot.
        self.abandoned.store(abandon_word(slot, ticket), Release);
    }

    /// Daemon side: whether this entry's occupant, the owner of the expired claim `e`, has
    /// acknowledged it with `LoaderEntry::abandon` (this slot, or a later one: a loader holds
    /// one claim at a time, so it abandons slots in order). Liveness is the caller's business:
    /// an owner that is gone needs no acknowledgement.
    pub fn has_abandoned(&self, e: &Expired) -> bool {
        // Acquire pairs with the loader's Release store in `abandon`.
        let now = self.abandoned.load(Acquire);
        self.tenure.load(Acquire) == e.tenure
            && (now == abandon_word(e.slot, e.ticket) || (now != e.abandoned_before && now != 0))
    }
}

#[cfg(not(loom))]
impl Ring {
    /// The process in loader-table entry `owner` (for messages), if the index is in range and
    /// the entry active.
    pub fn owner_identity(&self, owner: u16) -> Option<ProcessId> {
        if owner as usize >= MAX_LOADERS {
            return None;
        }
        let e = self.loader(owner as usize);
        (e.state.load(Acquire) == loader_state::ACTIVE).then(|| ProcessId {
            pid: e.pid.load(Acquire),
            start_time: e.start_time.load(Relaxed),
        })
    }

    /// The raw state word of slot `i` (for the daemon's lease bookkeeping).
    pub fn word(&self, i: u32) -> SlotWord {
        self.desc(i).word_acquire()
    }

    /// Whether the owner of an expired claim can no longer write into the slot: its tenure lock
    /// is free (it exited or died), or it has acknowledged with [`LoaderRing::abandon`]
    /// ([`LoaderEntry::has_abandoned`]).
    pub fn released_by(&self, e: &Expired) -> bool {
        if e.owner as usize >= MAX_LOADERS {
            // The word named no valid entry: there is no process to wait for.
            return true;
        }
        if !self.claimant_alive(e.owner, e.tenure).unwrap_or(true) {
            return true;
        }
        self.loader(e.owner as usize).has_abandoned(e)
    }

    /// Whether the owner of an expired claim still runs (for the hung-loader gauge).
    pub fn expired_owner_alive(&self, e: &Expired) -> bool {
        self.claimant_alive(e.owner, e.tenure).unwrap_or(true)
    }
}

#[cfg(not(loom))]
impl DaemonRing {
    /// If slot `i` still holds exactly the CLAIMED word `observed` (from [`Ring::word`]), takes it
    /// back (`SlotDesc::expire`). The caller keeps the slot out of use until
    /// [`Ring::released_by`] says the owner can no longer write into it.
    pub fn reclaim_expired(&self, i: u32, observed: u64) -> Option<Expired> {
        let w = SlotWord::unpack(observed);
        if w.state != Some(SlotState::Claimed) {
            return None;
        }
        let owner_id = self.0.owner_identity(w.owner);
        let entry = ((w.owner as usize) < MAX_LOADERS).then(|| self.0.loader(w.owner as usize));
        let expired = self.0.desc(i).expire(i, observed, entry, owner_id)?;
        self.0.header().reclaimed.fetch_add(1, Relaxed);
        Some(expired)
    }

    /// Daemon side: takes a FREE or READY slot back to IDLE (`SlotDesc::take_back`).
    pub fn take_back(&self, i: u32) -> Option<SlotState> {
        self.0.desc(i).take_back()
    }

    /// Daemon side: forces slot `i` back to IDLE (`SlotDesc::reset_to_idle`).
    pub fn reset_to_idle(&self, i: u32) {
        self.0.desc(i).reset_to_idle()
    }
}

#[cfg(not(loom))]
impl LoaderRing {
    /// Loader side: after a refused commit, promises never to touch `slot` of round `ticket`
    /// again (`LoaderEntry::abandon`), and rings the daemon's doorbell.
    pub fn abandon(&self, seat: crate::slot::Seat, slot: u32, ticket: u32) {
        self.0.loader(seat.index as usize).abandon(slot, ticket);
        self.0.ring_doorbell();
    }
}
