//! The pinring ring protocol: one POSIX shared-memory segment per ring, holding a header, a
//! loader table, slot descriptors and a data area of page-aligned slots; the slot state machine
//! and the sequencer; cross-process futex wake-ups. No CUDA in here.
//!
//! Roles:
//! * the daemon [`DaemonRing::create`]s the ring, [`DaemonRing::assign`]s seqs to slots, [`DaemonRing::take_ready`]s
//!   committed batches, and assigns the next seq when an upload is done;
//! * loaders [`Ring::open`] it, take the loader's role ([`LoaderRing::join`], which checks
//!   admission), [`LoaderRing::attach_loader`], [`LoaderRing::try_claim`] a FREE slot, fill
//!   [`LoaderRing::slot_writer`], and [`LoaderRing::commit`];
//! * a consumer takes its role with [`ConsumerRing::attach`];
//! * status views open it read-only.
//!
//! docs/PROTOCOL.md draws the layout and the state machine.
//!
//! The model-checking build (`RUSTFLAGS="--cfg loom"`, src/loom_tests.rs) keeps only what the
//! checker runs: the slot transitions ([`slot`], [`recovery`]) and the counted futex wake-ups
//! ([`futex`]) on `loom`'s atomics ([`sync`]). The segment and everything mapped from it
//! (segment, ring, lock, fault) exist only in the normal build.

#[cfg(not(loom))]
pub mod attach;
pub mod clock;
#[cfg(not(loom))]
mod daemon_role;
pub mod error;
#[cfg(not(loom))]
pub mod failure;
#[cfg(not(loom))]
pub mod fault;
pub mod futex;
pub mod handoff;
pub mod layout;
#[cfg(not(loom))]
pub mod lock;
#[cfg(all(test, loom))]
mod loom_tests;
pub mod process;
pub mod recovery;
#[cfg(not(loom))]
pub mod ring;
#[cfg(not(loom))]
mod roles;
#[cfg(not(loom))]
pub mod segment;
pub mod slot;
#[cfg(not(loom))]
pub mod snapshot;
pub mod sync;
#[cfg(not(loom))]
pub mod writer;

#[cfg(not(loom))]
pub use attach::{attach, attach_at_unless, attach_unless, Waiting};
#[cfg(not(loom))]
pub use daemon_role::FaultCounts;
pub use error::{CommitError, RingError, SlotFault};
pub use layout::{ring_state, Geometry, Header, MAX_LOADERS};
pub use process::ProcessId;
pub use recovery::Expired;
#[cfg(not(loom))]
pub use ring::resolve_group;
#[cfg(not(loom))]
pub use ring::{
    ConsumerRing, CreateOptions, DaemonRing, LoaderRing, LoaderView, Ring, RingView, SlotView,
};
#[cfg(not(loom))]
pub use segment::{find_anonymous, object_path, validate_name, Access, AnonymousRing, Segment};
pub use slot::{fit_in_slot, Seat, SlotState, SlotWord, Taken};
#[cfg(not(loom))]
pub use snapshot::{HandoffView, HeaderCounters, HealthCounters, RingSnapshot};
#[cfg(not(loom))]
pub use writer::{write_words_at, Claim, OutOfSlot, SlotWriter};
