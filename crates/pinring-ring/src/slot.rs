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
