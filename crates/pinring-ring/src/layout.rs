//! The byte layout of a ring segment: header, loader table, slot descriptors, data area.
//!
//! Every struct here lives in shared memory that other processes (possibly buggy or hostile ones)
//! can write at any time. The rules, stated once:
//!
//! * `#[repr(C)]`, no pointers, no `bool`, no enums: only atomics of fixed width, so any bit
//!   pattern is a valid value and concurrent writers can never cause undefined behaviour in the
//!   reader; they can only produce wrong *values*, which the reader validates before use.
//! * Sizes and offsets are pinned by the compile-time asserts at the bottom of this file;
//!   docs/PROTOCOL.md draws the same table. Changing either requires bumping [`LAYOUT_VERSION`].
//!   The atomics come from [`crate::sync`]: std's in every build that maps a segment; the
//!   model-checking build (`cfg(loom)`) swaps in larger ones, has no segment, and drops the
//!   asserts.
//! * Fields that are written once at creation (sizes, offsets, plan) are read with `Relaxed`
//!   loads after an `Acquire` load of [`Header::version`], which pairs with the creator's
//!   `Release` store of the version after everything else was written.

use crate::sync::atomic::{AtomicU16, AtomicU32, AtomicU64};
use std::mem::offset_of;

/// `b"PINRING\0"` as a little-endian u64.
pub const MAGIC: u64 = u64::from_le_bytes(*b"PINRING\0");
/// Version of this layout. A segment whose version differs is refused.
pub const LAYOUT_VERSION: u32 = 4;
/// Bytes of the header page (header + loader table).
pub const HEADER_BYTES: usize = 4096;
/// Bytes of one slot descriptor (two cache lines).
pub const DESC_BYTES: usize = 128;
/// Byte offset of the [`Health`] block inside the header page.
pub const HEALTH_OFFSET: usize = 384;
/// Byte offset of [`Header::daemon_pid`] (read with `pread` by a daemon judging an old file).
pub const DAEMON_PID_OFFSET: usize = offset_of!(Header, daemon_pid);
/// Byte offset of the [`Settings`] record inside the header page (after the handoff block).
pub const SETTINGS_OFFSET: usize = 768;
/// Words of the [`Settings`] record.
pub const SETTINGS_WORDS: usize = 32;
/// Byte offset of the loader table inside the header page.
pub const LOADER_TABLE_OFFSET: usize = 1024;
/// Bytes of one loader table entry.
pub const LOADER_ENTRY_BYTES: usize = 64;
/// Number of loaders that can be attached to one ring at once.
pub const MAX_LOADERS: usize = (HEADER_BYTES - LOADER_TABLE_OFFSET) / LOADER_ENTRY_BYTES;
/// Alignment of every slot's data (and of the data area): one page.
pub const SLOT_ALIGN: usize = 4096;
/// Most slots a ring may have.
pub const MAX_SLOTS: u32 = 4096;
/// Largest slot (1 GiB): bigger batches belong in several slots.
pub const MAX_SLOT_BYTES: u64 = 1 << 30;
/// Payloads start at offset 0 of the slot; the batch metadata follows at this alignment.
pub const META_ALIGN: u64 = 64;

/// Ring states (the value of [`Header::state`]).
pub mod ring_state {
    /// Created, not yet accepting loaders.
    pub const INIT: u32 = 0;
    /// Running: loaders may claim slots.
    pub const READY: u32 = 1;
    /// Stopping: no new work is handed out; in-flight batches are finished.
    pub const DRAINING: u32 = 2;
    /// Finished: every process detaches.
    pub const CLOSED: u32 = 3;

    /// Name of a state for messages.
    pub fn name(state: u32) -> &'static str {
        match state {
            INIT => "INIT",
            READY => "READY",
            DRAINING => "DRAINING",
            CLOSED => "CLOSED",
            _ => "INVALID",
        }
    }
}

/// Bit flags in [`Header::flags`].
pub mod header_flags {
    /// Batches are delivered in seq order.
    pub const IN_ORDER: u32 = 1;
}

/// The segment header (first 1024 bytes of the header page).
#[repr(C)]
#[derive(Debug)]
pub struct Header {
    // --- cache line 0: identity, written once at creation ---
    /// [`MAGIC`].
    pub magic: AtomicU64,
    /// [`LAYOUT_VERSION`], stored last (Release) when the segment is fully built; 0 before.
    pub version: AtomicU32,
    /// [`HEADER_BYTES`].
    pub header_bytes: AtomicU32,
    /// Size of the whole segment in bytes (must equal the file size).
    pub total_bytes: AtomicU64,
    /// Number of slots.
    pub slot_count: AtomicU32,
    /// [`DESC_BYTES`].
    pub desc_bytes: AtomicU32,
    /// Bytes of one slot's data.
    pub slot_bytes: AtomicU64,
    /// Offset of the descriptor array from the segment start.
    pub desc_offset: AtomicU64,
    /// Offset of the data area from the segment start.
    pub data_offset: AtomicU64,
    /// Random id drawn at each daemon start; a segment's generation never changes.
    pub generation: AtomicU64,

    // --- cache line 1: owner and plan, written once at creation (state changes) ---
    /// One of [`ring_state`].
    pub state: AtomicU32,
    /// [`header_flags`].
    pub flags: AtomicU32,
    /// Pid of the daemon that owns the segment, in its own PID namespace (informational: the
    /// daemon's liveness is its lock, see [`crate::lock`]).
    pub daemon_pid: AtomicU32,
    /// [`MAX_LOADERS`].
    pub max_loaders: AtomicU32,
    /// Start time of the daemon process (clock ticks since boot, /proc/PID/stat field 22;
    /// informational).
    pub daemon_start_time: AtomicU64,
    /// Fingerprint of the dataset/plan config; loaders with another fingerprint are refused.
    pub fingerprint: AtomicU64,
    /// First seq of this run.
    pub start_seq: AtomicU64,
    /// One past the last seq of this run.
    pub end_seq: AtomicU64,
    /// Wall-clock creation time, ns since the Unix epoch.
    pub created_unix_ns: AtomicU64,
    _pad1: [u64; 1],

    // --- cache line 2: counters written by the daemon ---
    /// Batches delivered to the sink.
    pub delivered: AtomicU64,
    /// Payload bytes uploaded.
    pub bytes_delivered: AtomicU64,
    /// Next seq the daemon will hand out.
    pub next_assign: AtomicU64,
    /// Lowest seq not yet delivered (in order mode), or the count delivered from start_seq.
    pub next_deliver: AtomicU64,
    /// Nanoseconds the daemon waited with a free upload buffer and no ready slot.
    pub daemon_wait_ns: AtomicU64,
    /// Nanoseconds uploads were in flight (sum over uploads).
    pub upload_ns: AtomicU64,
    /// Slots taken back from dead or hung loaders.
    pub reclaimed: AtomicU64,
    /// Batches rejected (invalid descriptor or metadata, verification failures).
    pub rejected: AtomicU64,

    // --- cache line 3: counters written by loaders ---
    /// Batches committed by loaders.
    pub committed: AtomicU64,
    /// Payload bytes committed by loaders.
    pub bytes_committed: AtomicU64,
    /// Nanoseconds loaders waited for a free slot (summed over loaders).
    pub loader_wait_ns: AtomicU64,
    /// Nanoseconds loaders spent producing batches (summed over loaders).
    pub loader_busy_ns: AtomicU64,
    /// Samples loaders could not read and replaced with zeros (`dataset.on_bad_sample =
    /// "skip"`), summed over loaders. (Formerly padding: zero in segments of older builds.)
    pub bad_samples_skipped: AtomicU64,
    _pad3: [u64; 3],

    // --- cache line 4: futex word loaders wait on ---
    /// Bumped by the daemon whenever a slot becomes FREE or the state changes.
    pub work_futex: AtomicU32,
    /// Loaders sleeping (or about to sleep) on `work_futex`; wakes are skipped when 0.
    pub work_waiters: AtomicU32,
    _pad4: [u32; 14],

    // --- cache line 5: futex word the daemon waits on ---
    /// Bumped by loaders on commit and by the daemon's own threads on completions.
    pub doorbell_futex: AtomicU32,
    /// Daemon threads sleeping (or about to sleep) on `doorbell_futex`; rings skip the wake when 0.
    pub doorbell_waiters: AtomicU32,
    _pad5: [u32; 14],
}

/// One entry of the loader table (index = loader id, stored in slot owners).
#[repr(C)]
#[derive(Debug)]
pub struct LoaderEntry {
    /// Pid of the attached loader in its own PID namespace (informational: the entry's owner is
    /// whoever holds its lock, see [`crate::lock`]); 0 = entry empty.
    pub pid: AtomicU32,
    /// 0 = empty, 1 = attaching, 2 = active.
    pub state: AtomicU16,
    /// The current occupant's tenure of this entry: bumped by each loader that takes the entry,
    /// and recorded in the words of the slots it claims, so a claim of a former occupant is
    /// never mistaken for one of the current occupant.
    pub tenure: AtomicU16,
    /// Process start time of the loader (clock ticks since boot; informational).
    pub start_time: AtomicU64,
    /// Batches committed by this loader.
    pub batches: AtomicU64,
    /// Nanoseconds spent producing batches.
    pub busy_ns: AtomicU64,
    /// Nanoseconds spent waiting for a free slot.
    pub wait_ns: AtomicU64,
    /// CLOCK_MONOTONIC ns of the loader's last sign of life.
    pub heartbeat_ns: AtomicU64,
    /// Payload bytes committed.
    pub bytes: AtomicU64,
    /// Written by the loader when its commit was refused because the daemon took the slot back:
    /// [`abandon_word`]`(slot, ticket)`. Until then the daemon keeps that slot out of use (the
    /// loader might still be writing into it). 0 = nothing abandoned.
    pub abandoned: AtomicU64,
}

/// Bit set in every [`LoaderEntry::abandoned`] value, so 0 means "none".
pub const ABANDON_VALID: u64 = 1 << 63;

/// The [`LoaderEntry::abandoned`] value saying "I will never touch `slot` of round `ticket`".
pub const fn abandon_word(slot: u32, ticket: u32) -> u64 {
    ABANDON_VALID | ((slot as u64) << 32) | ticket as u64
}

/// Fault-handling counters and gauges the daemon publishes for status views (in the header
/// page's formerly reserved space at [`HEALTH_OFFSET`]). Written by the daemon only.
#[repr(C)]
#[derive(Debug)]
pub struct Health {
    /// Slots taken back from loaders that were alive but held them past the lease.
    pub leases_expired: AtomicU64,
    /// Slots now held out of use because a hung loader may still write into them (gauge).
    pub quarantined: AtomicU64,
    /// Live loaders now holding a slot past the lease, or a quarantined one (gauge).
    pub hung_loaders: AtomicU64,
    /// Pid of the loader most recently declared hung (0 = none yet).
    pub last_hung_pid: AtomicU64,
    /// Bad batches skipped under `on_bad_batch = "skip"` (their seq was made again).
    pub bad_batches_skipped: AtomicU64,
    /// Seqs moved to another slot because their slot was quarantined.
    pub reissued: AtomicU64,
    /// CLOCK_MONOTONIC ns of the daemon's last fault check (a status view sees it stall).
    pub daemon_heartbeat_ns: AtomicU64,
    /// Slot descriptors found in a state the daemon never left them in (scribbled).
    pub corrupt_descriptors: AtomicU64,
    /// Times the daemon found its own header fields changed by another process and restored
    /// them.
    pub header_repairs: AtomicU64,
    /// CLOCK_MONOTONIC ns since when the ring has had work left and no loader attached, once
    /// that has lasted `daemon.idle_warn_ms` (0 = not stalled; `pinring status` shows it).
    pub stalled_since_ns: AtomicU64,
    /// The lowest undelivered seq while stalled: the one that waits for a loader.
    pub stalled_seq: AtomicU64,
    /// Loader-seconds (in ns) the daemon counted itself: the live loaders integrated over the
    /// run, updated at every reap. Views check the loaders' own wait figures against it.
    pub loader_ns_seen: AtomicU64,
    /// Samples a batch may have replaced with zeros: the batch size where the dataset kind
    /// reads files and `dataset.on_bad_sample = "skip"`, else 0. Views check the loaders'
    /// `bad_samples_skipped` against it.
    pub skippable_per_batch: AtomicU64,
    _reserved: [u64; 3],
}

/// The settings record: the values (and hashes) of the dataset and plan settings the ring's
/// fingerprint covers, written once by the creator (pinring-data's `Config::settings_record`
/// says what each word is), so that a loader refused for another fingerprint can name the
/// setting that differs. Informational: the fingerprint alone decides; all zero in a ring
/// whose creator wrote none (the formerly reserved space of the header page).
#[repr(C)]
#[derive(Debug)]
pub struct Settings {
    /// The record's words.
    pub words: [AtomicU64; SETTINGS_WORDS],
}

/// Loader table entry states.
pub mod loader_state {
    /// Entry unused.
    pub const EMPTY: u16 = 0;
    /// Pid claimed, start time being written.
    pub const ATTACHING: u16 = 1;
    /// Loader attached and working.
    pub const ACTIVE: u16 = 2;
}

/// A slot descriptor. The slot's data lives in the data area at `data_offset + i * slot_bytes`.
#[repr(C)]
#[derive(Debug)]
pub struct SlotDesc {
    /// State word: see [`crate::slot::SlotWord`] (state, owner, ticket packed in one u64 so that
    /// claiming a slot and recording its owner is one CAS).
    pub word: AtomicU64,
    /// Seq of the batch this slot is to carry (written by the daemon before it publishes FREE).
    pub seq: AtomicU64,
    /// Payload length in bytes (written by the loader before it publishes READY).
    pub payload_len: AtomicU64,
    /// Encoded metadata length in bytes; the metadata starts at `align_up(payload_len, 64)`.
    pub meta_len: AtomicU32,
    /// Loader error code (0 = none): a loader that cannot make a batch commits it with an error.
    pub error: AtomicU32,
    /// Samples in the batch.
    pub sample_count: AtomicU32,
    /// Pid of the loader that claimed the slot (informational; ownership is in `word`).
    pub owner_pid: AtomicU32,
    /// CLOCK_MONOTONIC ns when the slot was claimed.
    pub claim_ns: AtomicU64,
    /// CLOCK_MONOTONIC ns when the slot was committed.
    pub commit_ns: AtomicU64,
    /// CLOCK_MONOTONIC ns when the upload was submitted (informational; the daemon stamps every
    /// slot of one pass of its loop with the pass's start).
    pub upload_ns: AtomicU64,
    /// CLOCK_MONOTONIC ns when the slot was last freed (informational; as `upload_ns`).
    pub free_ns: AtomicU64,
    _pad: [u64; 7],
}

/// The layout, pinned: sizes and offsets as docs/PROTOCOL.md draws them. (Only where the
/// atomics are std's: the model checker's are larger and never lie in a segment.)
#[cfg(not(loom))]
mod pinned {
    use super::*;
    use std::mem::size_of;

    const _: () = assert!(size_of::<Header>() <= HEALTH_OFFSET);
    const _: () = assert!(size_of::<Health>() == 128);
    const _: () = assert!(offset_of!(Health, header_repairs) == 64);
    const _: () = assert!(offset_of!(Health, stalled_since_ns) == 72);
    const _: () = assert!(offset_of!(Health, stalled_seq) == 80);
    const _: () = assert!(offset_of!(Health, loader_ns_seen) == 88);
    const _: () = assert!(offset_of!(Health, skippable_per_batch) == 96);
    const _: () = assert!(DAEMON_PID_OFFSET == 72);
    const _: () = assert!(offset_of!(LoaderEntry, state) == 4);
    const _: () = assert!(offset_of!(LoaderEntry, tenure) == 6);
    const _: () = assert!(HEALTH_OFFSET + size_of::<Health>() <= LOADER_TABLE_OFFSET);
    const _: () = assert!(size_of::<Settings>() == 256);
    const _: () = assert!(SETTINGS_OFFSET % 64 == 0);
    const _: () = assert!(SETTINGS_OFFSET + size_of::<Settings>() <= LOADER_TABLE_OFFSET);
    const _: () = assert!(HEALTH_OFFSET % 64 == 0);
    const _: () = assert!(offset_of!(Health, leases_expired) == 0);
    const _: () = assert!(offset_of!(Health, bad_batches_skipped) == 32);
    const _: () = assert!(offset_of!(Health, corrupt_descriptors) == 56);
    const _: () = assert!(offset_of!(LoaderEntry, abandoned) == 56);
    const _: () = assert!(size_of::<Header>() == 384);
    const _: () = assert!(offset_of!(Header, magic) == 0);
    const _: () = assert!(offset_of!(Header, version) == 8);
    const _: () = assert!(offset_of!(Header, total_bytes) == 16);
    const _: () = assert!(offset_of!(Header, slot_count) == 24);
    const _: () = assert!(offset_of!(Header, slot_bytes) == 32);
    const _: () = assert!(offset_of!(Header, generation) == 56);
    const _: () = assert!(offset_of!(Header, state) == 64);
    const _: () = assert!(offset_of!(Header, fingerprint) == 88);
    const _: () = assert!(offset_of!(Header, delivered) == 128);
    const _: () = assert!(offset_of!(Header, committed) == 192);
    const _: () = assert!(offset_of!(Header, work_futex) == 256);
    const _: () = assert!(offset_of!(Header, work_waiters) == 260);
    const _: () = assert!(offset_of!(Header, doorbell_futex) == 320);
    const _: () = assert!(offset_of!(Header, doorbell_waiters) == 324);
    const _: () = assert!(size_of::<LoaderEntry>() == LOADER_ENTRY_BYTES);
    const _: () = assert!(offset_of!(LoaderEntry, start_time) == 8);
    const _: () = assert!(offset_of!(LoaderEntry, heartbeat_ns) == 40);
    const _: () = assert!(MAX_LOADERS == 48);
    const _: () = assert!(size_of::<SlotDesc>() == DESC_BYTES);
    const _: () = assert!(offset_of!(SlotDesc, word) == 0);
    const _: () = assert!(offset_of!(SlotDesc, seq) == 8);
    const _: () = assert!(offset_of!(SlotDesc, payload_len) == 16);
    const _: () = assert!(offset_of!(SlotDesc, meta_len) == 24);
    const _: () = assert!(offset_of!(SlotDesc, error) == 28);
    const _: () = assert!(offset_of!(SlotDesc, sample_count) == 32);
    const _: () = assert!(offset_of!(SlotDesc, claim_ns) == 40);
    const _: () = assert!(offset_of!(SlotDesc, free_ns) == 64);
    const _: () = assert!(std::mem::align_of::<Header>() == 8);
    const _: () = assert!(std::mem::align_of::<SlotDesc>() == 8);
}

/// The model checker's stand-ins for a descriptor and a loader-table entry: in that build there
/// is no segment to find them in, so a model makes them as a fresh segment would hold them.
#[cfg(loom)]
mod model {
    use super::*;

    impl SlotDesc {
        /// A descriptor as [`crate::ring::DaemonRing::create`] leaves it: IDLE, ticket 0, no seq.
        pub fn new_idle() -> SlotDesc {
            let zero = || AtomicU64::new(0);
            SlotDesc {
                word: AtomicU64::new(crate::slot::SlotWord::pack(crate::slot::SlotState::Idle, 0)),
                seq: AtomicU64::new(u64::MAX),
                payload_len: zero(),
                meta_len: AtomicU32::new(0),
                error: AtomicU32::new(0),
                sample_count: AtomicU32::new(0),
                owner_pid: AtomicU32::new(0),
                claim_ns: zero(),
                commit_ns: zero(),
                upload_ns: zero(),
                free_ns: zero(),
                _pad: [0; 7],
            }
        }
    }

    impl LoaderEntry {
        /// An active entry in its `tenure`, as `attach_loader` leaves it, nothing abandoned.
        pub fn new_active(tenure: u16) -> LoaderEntry {
            let zero = || AtomicU64::new(0);
            LoaderEntry {
                pid: AtomicU32::new(1),
                state: AtomicU16::new(loader_state::ACTIVE),
                tenure: AtomicU16::new(tenure),
                start_time: zero(),
                batches: zero(),
                busy_ns: zero(),
                wait_ns: zero(),
                heartbeat_ns: zero(),
                bytes: zero(),
                abandoned: zero(),
            }
        }
    }
}

/// Where each part of a segment lies, computed from (slot_count, slot_bytes) and, for a ring
/// that hands batches to a consumer, the handoff area's parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Number of slots.
    pub slot_count: u32,
    /// Bytes of one slot (a multiple of [`SLOT_ALIGN`]).
    pub slot_bytes: u64,
    /// Offset of the descriptor array.
    pub desc_offset: u64,
    /// Offset of the data area (page aligned).
    pub data_offset: u64,
    /// Total segment size.
    pub total_bytes: u64,
    /// The handoff area after the data area, if the ring has one.
    pub handoff: Option<crate::handoff::HandoffGeometry>,
}

impl Geometry {
    /// Computes the geometry; `None` if a value is out of range or the size overflows.
    pub fn new(slot_count: u32, slot_bytes: u64) -> Option<Geometry> {
        if slot_count == 0
            || slot_count > MAX_SLOTS
            || slot_bytes == 0
            || slot_bytes > MAX_SLOT_BYTES
            || slot_bytes % SLOT_ALIGN as u64 != 0
        {
            return None;
        }
        let desc_offset = HEADER_BYTES as u64;
        let desc_end = desc_offset.checked_add(u64::from(slot_count) * DESC_BYTES as u64)?;
        let data_offset = align_up(desc_end, SLOT_ALIGN as u64)?;
        let total_bytes =
            data_offset.checked_add(u64::from(slot_count).checked_mul(slot_bytes)?)?;
        Some(Geometry {
            slot_count,
            slot_bytes,
            desc_offset,
            data_offset,
            total_bytes,
            handoff: None,
        })
    }

    /// The same ring with a handoff area of `buffers` buffers of `buffer_bytes` and a stored spec
    /// of `spec_len` bytes after its data area (page aligned), with a part table of
    /// `part_slots` slots per buffer when the consumer copies ([`crate::handoff::HandoffGeometry`]);
    /// `None` if out of range.
    pub fn with_handoff(
        self,
        buffers: u32,
        buffer_bytes: u64,
        spec_len: u64,
        host: bool,
        part_slots: u32,
    ) -> Option<Geometry> {
        let area_offset = align_up(self.data_offset + self.data_bytes(), SLOT_ALIGN as u64)?;
        let h = crate::handoff::HandoffGeometry::new(
            area_offset,
            buffers,
            buffer_bytes,
            spec_len,
            host,
            part_slots,
        )?;
        Some(Geometry {
            total_bytes: h.end(),
            handoff: Some(h),
            ..self
        })
    }

    /// Bytes of the data area (what gets registered with the GPU).
    pub fn data_bytes(&self) -> u64 {
        u64::from(self.slot_count) * self.slot_bytes
    }
}

/// Rounds `v` up to a multiple of `align` (a power of two); `None` on overflow.
pub fn align_up(v: u64, align: u64) -> Option<u64> {
    debug_assert!(align.is_power_of_two());
    Some(v.checked_add(align - 1)? & !(align - 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_places_data_on_a_page_boundary() {
        let g = Geometry::new(16, 4 << 20).unwrap();
        assert_eq!(g.desc_offset, 4096);
        assert_eq!(g.data_offset, 8192);
        assert_eq!(g.total_bytes, 8192 + 16 * (4 << 20));
        assert_eq!(g.data_bytes(), 16 * (4 << 20));
        let g = Geometry::new(100, 4096).unwrap();
        assert_eq!(g.data_offset % 4096, 0);
        assert!(g.data_offset >= 4096 + 100 * 128);
    }

    #[test]
    fn geometry_rejects_out_of_range_values() {
        assert!(Geometry::new(0, 4096).is_none());
        assert!(Geometry::new(MAX_SLOTS + 1, 4096).is_none());
        assert!(Geometry::new(4, 4095).is_none());
        assert!(Geometry::new(4, 0).is_none());
        assert!(Geometry::new(4, MAX_SLOT_BYTES + 4096).is_none());
    }
}
