//! The handoff: whole batches the daemon hands to one training process (the consumer).
//!
//! A ring created with a [`HandoffSpec`] carries, after its data area, a *handoff area*: one
//! [`BufferDesc`] per batch buffer (the daemon's device buffers, or, on the host backend, buffers
//! inside this area), the daemon's resolved spec as a binary value (pinring-data's
//! `Spec::to_stored`, from which the consumer derives the batch's fields and the plan), and on the host backend the buffers' bytes. The
//! [`HandoffBlock`] in the header page says where all of it lies.
//!
//! A buffer's word holds its state (low byte) and the round (high 32 bits, bumped at each fill):
//!
//! ```text
//!            daemon: fill (seq, fields)        consumer: CAS take
//!   EMPTY ─────────────────────────► FILLED ─────────────────────► TAKEN
//!     ▲  ◄───────────────────────────  │                            │ │
//!     │    daemon: withdraw (drain)                consumer: release │ │ whoever finds the
//!     │                                       (event recorded first) │ │ consumer lock free
//!     │                                                              ▼ ▼
//!     └───────────────────────────────────────────────── RELEASED  RECLAIMED
//!        daemon: (wait on the release event,) reuse
//! ```
//!
//! Orderings, referred to at each site:
//! * (H1) Fill: the daemon writes the batch's fields (Relaxed) after its copies completed, then
//!   stores FILLED with Release; the consumer's take CAS is Acquire, so it reads what was written.
//! * (H2) Release: the consumer has recorded its release event (CUDA) or finished reading the
//!   buffer (host) before its Release CAS to RELEASED; the daemon loads the word with Acquire
//!   before it reuses the buffer.
//! * The consumer is alive exactly while it holds [`crate::lock::CONSUMER_LOCK`]; a TAKEN buffer
//!   whose consumer lock is free was taken by a dead consumer and becomes RECLAIMED (nobody will
//!   record its release event).

use crate::layout::align_up;
use crate::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use crate::sync::atomic::{AtomicU32, AtomicU64};

/// Most batch buffers one ring can hand over.
pub const MAX_BUFFERS: u32 = 64;
/// Bytes of one [`BufferDesc`].
pub const BUFFER_DESC_BYTES: usize = 256;
/// Byte offset of the [`HandoffBlock`] in the header page.
pub const HANDOFF_OFFSET: usize = 512;
/// Longest stored spec a ring carries.
pub const MAX_SPEC_BYTES: u64 = 64 << 10;
/// Most parts a batch handed over by its slots may have (the part table's row length).
pub const MAX_PART_SLOTS: u32 = 1 << 16;
/// Alignment of the host buffers (the first; the daemon makes their size a multiple of it) and
/// of the handoff area's end.
pub const HOST_BUFFER_ALIGN: u64 = 4096;
/// Bytes of one exported handle (a CUDA IPC memory or event handle).
pub const HANDLE_BYTES: usize = 64;

/// Where the batch buffers live ([`HandoffBlock::backend`]).
pub mod backend_code {
    /// Host memory: the buffers lie in the handoff area, readable by mapping the ring.
    pub const HOST: u32 = 1;
    /// CUDA device memory: the descriptors carry IPC handles.
    pub const CUDA: u32 = 2;
}

/// States of a batch buffer (low byte of [`BufferDesc::word`]).
pub mod buffer_state {
    /// The daemon's: being filled, or free.
    pub const EMPTY: u8 = 0;
    /// Holds a whole batch, offered to the consumer.
    pub const FILLED: u8 = 1;
    /// The consumer's.
    pub const TAKEN: u8 = 2;
    /// Given back by the consumer; reused once its release event has fired.
    pub const RELEASED: u8 = 3;
    /// Taken back from a dead consumer; reused at once.
    pub const RECLAIMED: u8 = 4;

    /// Name of a state for messages.
    pub fn name(state: u8) -> &'static str {
        match state {
            EMPTY => "EMPTY",
            FILLED => "FILLED",
            TAKEN => "TAKEN",
            RELEASED => "RELEASED",
            RECLAIMED => "RECLAIMED",
            _ => "INVALID",
        }
    }
}

/// The handoff's control block, in the header page at [`HANDOFF_OFFSET`].
#[repr(C)]
#[derive(Debug)]
pub struct HandoffBlock {
    // --- line 0: written once by the creator ---
    /// Offset of the handoff area from the segment start; 0: the ring hands nothing over.
    pub area_offset: AtomicU64,
    /// Bytes of the handoff area.
    pub area_bytes: AtomicU64,
    /// Number of batch buffers (1..=[`MAX_BUFFERS`]).
    pub buffers: AtomicU32,
    /// [`BUFFER_DESC_BYTES`].
    pub desc_bytes: AtomicU32,
    /// Bytes of one batch buffer.
    pub buffer_bytes: AtomicU64,
    /// Offset of the stored spec from the segment start.
    pub spec_offset: AtomicU64,
    /// Bytes of the stored spec (1..=[`MAX_SPEC_BYTES`]).
    pub spec_len: AtomicU32,
    /// [`backend_code`].
    pub backend: AtomicU32,
    /// Host backend: offset of buffer 0's bytes from the segment start (0 for CUDA).
    pub host_offset: AtomicU64,
    /// CUDA device ordinal of the buffers.
    pub device: AtomicU32,
    /// Slots listed per buffer in the part table; nonzero: the consumer copies each batch out of
    /// its slots itself (the daemon only lists them), 0: the daemon copies into the buffers.
    pub part_slots: AtomicU32,
    // --- line 1: written by the daemon ---
    /// 1 once every descriptor's handles are written (Release; before the ring is READY).
    pub exported: AtomicU32,
    _pad1: u32,
    /// Batches handed over (filled).
    pub filled: AtomicU64,
    /// Buffers taken back from dead consumers.
    pub reclaimed: AtomicU64,
    /// One past the seqs of the last batch filled (Release, after the fill): every batch below
    /// it was handed over, so a consumer resuming can tell what it can still get.
    pub filled_next: AtomicU64,
    _pad1b: [u64; 4],
    // --- line 2: written by consumers ---
    /// Pid of the consumer in its own PID namespace (informational: liveness is its lock).
    pub consumer_pid: AtomicU32,
    /// When the consumer copies: its own buffers holding a batch (being copied, or with a lease
    /// alive); the descriptors do not show them. Informational.
    pub own_held: AtomicU32,
    /// Consumers that attached so far.
    pub attaches: AtomicU64,
    /// Batches taken.
    pub taken: AtomicU64,
    /// One past the seqs of the last batch taken (informational).
    pub taken_next: AtomicU64,
    _pad2b: [u64; 4],
    // --- line 3: the futex word the consumer waits on ---
    /// Bumped by the daemon at each fill and state change.
    pub deliver_futex: AtomicU32,
    /// Consumers sleeping (or about to sleep) on `deliver_futex`.
    pub deliver_waiters: AtomicU32,
    _pad3: [u32; 14],
}

/// One batch buffer's descriptor in the handoff area.
#[repr(C)]
#[derive(Debug)]
pub struct BufferDesc {
    /// State (low byte, [`buffer_state`]) and round (high 32 bits).
    pub word: AtomicU64,
    /// First seq of the batch (its part 0).
    pub seq: AtomicU64,
    /// Batch number (seq / parts per batch).
    pub batch: AtomicU64,
    /// Bytes of the batch in the buffer.
    pub bytes: AtomicU64,
    /// Index of the batch in its epoch.
    pub index_in_epoch: AtomicU64,
    /// Samples in the batch.
    pub samples: AtomicU32,
    /// Epoch of the batch.
    pub epoch: AtomicU32,
    /// CLOCK_MONOTONIC ns of the fill.
    pub filled_ns: AtomicU64,
    /// CLOCK_MONOTONIC ns of the take.
    pub taken_ns: AtomicU64,
    /// CUDA IPC memory handle of the buffer.
    pub mem_handle: [AtomicU64; 8],
    /// CUDA IPC handle of the buffer's ready event (recorded after the batch's last copy).
    pub ready_event: [AtomicU64; 8],
    /// CUDA IPC handle of the buffer's release event (recorded by the consumer).
    pub release_event: [AtomicU64; 8],
}

#[cfg(not(loom))]
mod pinned {
    use super::*;
    use std::mem::{offset_of, size_of};
    const _: () = assert!(size_of::<HandoffBlock>() == 256);
    const _: () =
        assert!(HANDOFF_OFFSET + size_of::<HandoffBlock>() <= crate::layout::LOADER_TABLE_OFFSET);
    const _: () =
        assert!(HANDOFF_OFFSET + size_of::<HandoffBlock>() <= crate::layout::SETTINGS_OFFSET);
    const _: () = assert!(HANDOFF_OFFSET >= crate::layout::HEALTH_OFFSET + 128);
    const _: () = assert!(offset_of!(HandoffBlock, exported) == 64);
    const _: () = assert!(offset_of!(HandoffBlock, consumer_pid) == 128);
    const _: () = assert!(offset_of!(HandoffBlock, deliver_futex) == 192);
    const _: () = assert!(offset_of!(HandoffBlock, host_offset) == 48);
    const _: () = assert!(size_of::<BufferDesc>() == BUFFER_DESC_BYTES);
    const _: () = assert!(offset_of!(BufferDesc, samples) == 40);
    const _: () = assert!(offset_of!(BufferDesc, mem_handle) == 64);
    const _: () = assert!(offset_of!(BufferDesc, ready_event) == 128);
    const _: () = assert!(offset_of!(BufferDesc, release_event) == 192);
}

/// What the daemon asks for when its ring hands batches over.
#[derive(Debug, Clone)]
pub struct HandoffSpec {
    /// Batch buffers (the prefetch depth).
    pub buffers: u32,
    /// Bytes of one buffer (a whole batch).
    pub buffer_bytes: u64,
    /// The daemon's resolved spec, in its stored form (pinring-data's `Spec::to_stored`):
    /// bytes the ring carries without reading them.
    pub spec: Vec<u8>,
    /// Whether the buffers lie in the handoff area (host backend) rather than in device memory.
    pub host: bool,
    /// CUDA device ordinal (0 for host).
    pub device: u32,
    /// Nonzero: the consumer copies each batch out of its slots (the parts per batch; each
    /// buffer's row of the part table lists the slot of each part). 0: the daemon copies into
    /// its buffers.
    pub part_slots: u32,
}

/// Where the parts of a handoff area lie, computed from its parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandoffGeometry {
    /// Start of the area (page aligned).
    pub area_offset: u64,
    /// Bytes of the area.
    pub area_bytes: u64,
    /// Number of buffers.
    pub buffers: u32,
    /// Bytes of one buffer.
    pub buffer_bytes: u64,
    /// Start of the stored spec.
    pub spec_offset: u64,
    /// Bytes of the stored spec.
    pub spec_len: u64,
    /// Host backend: start of buffer 0's bytes; 0 when the buffers are device memory (or the
    /// consumer's own).
    pub host_offset: u64,
    /// Slots listed per buffer (0: no part table).
    pub part_slots: u32,
    /// Start of the part table (right after the descriptors): buffer `i`'s row of
    /// `part_slots` u32 slot indices.
    pub parts_offset: u64,
}

impl HandoffGeometry {
    /// Lays out a handoff area at `area_offset`; `None` when a value is out of range. With
    /// `part_slots > 0` the buffers are the consumer's own: the area holds a part table and no
    /// host buffers, whatever `host` says.
    pub fn new(
        area_offset: u64,
        buffers: u32,
        buffer_bytes: u64,
        spec_len: u64,
        host: bool,
        part_slots: u32,
    ) -> Option<HandoffGeometry> {
        if buffers == 0
            || buffers > MAX_BUFFERS
            || buffer_bytes == 0
            || spec_len == 0
            || spec_len > MAX_SPEC_BYTES
            || part_slots > MAX_PART_SLOTS
            || area_offset % HOST_BUFFER_ALIGN != 0
        {
            return None;
        }
        let host = host && part_slots == 0;
        let parts_offset =
            area_offset.checked_add(u64::from(buffers) * BUFFER_DESC_BYTES as u64)?;
        let table = (u64::from(buffers) * u64::from(part_slots) * 4).next_multiple_of(8);
        let spec_offset = parts_offset.checked_add(table)?;
        let spec_end = spec_offset.checked_add(spec_len)?;
        let (host_offset, end) = if host {
            let host_offset = align_up(spec_end, HOST_BUFFER_ALIGN)?;
            let bytes = buffer_bytes.checked_mul(u64::from(buffers))?;
            let end = align_up(host_offset.checked_add(bytes)?, HOST_BUFFER_ALIGN)?;
            (host_offset, end)
        } else {
            (0, align_up(spec_end, HOST_BUFFER_ALIGN)?)
        };
        Some(HandoffGeometry {
            area_offset,
            area_bytes: end - area_offset,
            buffers,
            buffer_bytes,
            spec_offset,
            spec_len,
            host_offset,
            part_slots,
            parts_offset,
        })
    }

    /// Offset of the part table's entry for part `part` of buffer `i`.
    pub fn part_slot_offset(&self, i: u32, part: u32) -> u64 {
        self.parts_offset + (u64::from(i) * u64::from(self.part_slots) + u64::from(part)) * 4
    }

    /// End of the area: the segment's size.
    pub fn end(&self) -> u64 {
        self.area_offset + self.area_bytes
    }

    /// Offset of buffer `i`'s descriptor.
    pub fn desc_offset(&self, i: u32) -> u64 {
        self.area_offset + u64::from(i) * BUFFER_DESC_BYTES as u64
    }

    /// Host backend: offset of buffer `i`'s bytes (`None` for device buffers).
    pub fn host_buffer_offset(&self, i: u32) -> Option<u64> {
        (self.host_offset != 0).then(|| self.host_offset + u64::from(i) * self.host_stride())
    }

    /// Distance between two host buffers: they lie side by side.
    pub fn host_stride(&self) -> u64 {
        self.buffer_bytes
    }
}

/// Round and state of a buffer word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferWord {
    /// [`buffer_state`].
    pub state: u8,
    /// Bumped at each fill.
    pub round: u32,
}

impl BufferWord {
    /// Packs a word.
    pub const fn pack(state: u8, round: u32) -> u64 {
        ((round as u64) << 32) | state as u64
    }

    /// Unpacks a word.
    pub const fn unpack(w: u64) -> BufferWord {
        BufferWord {
            state: (w & 0xff) as u8,
            round: (w >> 32) as u32,
        }
    }
}

/// A filled batch as its descriptor says (values from shared memory: the taker validates them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Filled {
    /// The round of the fill.
    pub round: u32,
    /// First seq.
    pub seq: u64,
    /// Batch number.
    pub batch: u64,
    /// Bytes in the buffer.
    pub bytes: u64,
    /// Samples.
    pub samples: u32,
    /// Epoch.
    pub epoch: u32,
    /// Index in the epoch.
    pub index_in_epoch: u64,
}

/// What came back to the daemon from a buffer it had filled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Returned {
    /// Still FILLED: nobody took it yet.
    Waiting,
    /// TAKEN: the consumer holds it.
    Held,
    /// RELEASED: the consumer is done (after its release event).
    Released,
    /// RECLAIMED: its consumer died.
    Reclaimed,
    /// A state the daemon never leaves a filled buffer in (scribbled).
    Corrupt(u8),
}

impl BufferDesc {
    /// The word, unpacked (Acquire: see (H1), (H2)).
    pub fn load_word(&self) -> BufferWord {
        BufferWord::unpack(self.word.load(Acquire))
    }

    /// Daemon: publishes a whole batch in an EMPTY buffer; returns the new round.
    pub(crate) fn fill(&self, f: &Filled) -> u32 {
        let round = self.load_word().round.wrapping_add(1);
        self.seq.store(f.seq, Relaxed);
        self.batch.store(f.batch, Relaxed);
        self.bytes.store(f.bytes, Relaxed);
        self.samples.store(f.samples, Relaxed);
        self.epoch.store(f.epoch, Relaxed);
        self.index_in_epoch.store(f.index_in_epoch, Relaxed);
        self.filled_ns.store(crate::clock::monotonic_ns(), Relaxed);
        // (H1): the fields above are published by this Release store.
        self.word
            .store(BufferWord::pack(buffer_state::FILLED, round), Release);
        round
    }

    /// Daemon: what became of a buffer it filled in `round`.
    pub(crate) fn returned(&self, round: u32) -> Returned {
        let w = self.load_word();
        if w.round != round {
            return Returned::Corrupt(w.state);
        }
        match w.state {
            buffer_state::FILLED => Returned::Waiting,
            buffer_state::TAKEN => Returned::Held,
            buffer_state::RELEASED => Returned::Released,
            buffer_state::RECLAIMED => Returned::Reclaimed,
            other => Returned::Corrupt(other),
        }
    }

    /// Daemon: marks a returned buffer EMPTY (its own again).
    pub(crate) fn reset(&self, round: u32) {
        self.word
            .store(BufferWord::pack(buffer_state::EMPTY, round), Relaxed);
    }

    /// Daemon (drain): takes back a FILLED buffer nobody took; false if the consumer took it
    /// first.
    pub(crate) fn withdraw(&self, round: u32) -> bool {
        self.word
            .compare_exchange(
                BufferWord::pack(buffer_state::FILLED, round),
                BufferWord::pack(buffer_state::EMPTY, round),
                AcqRel,
                Acquire,
            )
            .is_ok()
    }

    /// Consumer: takes a FILLED buffer of `round`; returns what the descriptor says it holds.
    pub(crate) fn take(&self, round: u32) -> Option<Filled> {
        // (H1): Acquire pairs with the daemon's Release store of FILLED.
        self.word
            .compare_exchange(
                BufferWord::pack(buffer_state::FILLED, round),
                BufferWord::pack(buffer_state::TAKEN, round),
                AcqRel,
                Acquire,
            )
            .ok()?;
        self.taken_ns.store(crate::clock::monotonic_ns(), Relaxed);
        Some(self.filled_fields(round))
    }

    /// What the descriptor says (for a FILLED or TAKEN buffer; values unchecked).
    pub fn filled_fields(&self, round: u32) -> Filled {
        Filled {
            round,
            seq: self.seq.load(Relaxed),
            batch: self.batch.load(Relaxed),
            bytes: self.bytes.load(Relaxed),
            samples: self.samples.load(Relaxed),
            epoch: self.epoch.load(Relaxed),
            index_in_epoch: self.index_in_epoch.load(Relaxed),
        }
    }

    /// Consumer: gives a TAKEN buffer of `round` back; false if it was not TAKEN in that round
    /// (a successor reclaimed it).
    pub(crate) fn release(&self, round: u32) -> bool {
        // (H2): everything this consumer did with the buffer happens before this Release.
        self.word
            .compare_exchange(
                BufferWord::pack(buffer_state::TAKEN, round),
                BufferWord::pack(buffer_state::RELEASED, round),
                Release,
                Relaxed,
            )
            .is_ok()
    }

    /// Whoever found the consumer lock free: marks a TAKEN buffer RECLAIMED. True if it did.
    pub(crate) fn reclaim(&self) -> bool {
        let w = self.load_word();
        w.state == buffer_state::TAKEN
            && self
                .word
                .compare_exchange(
                    BufferWord::pack(buffer_state::TAKEN, w.round),
                    BufferWord::pack(buffer_state::RECLAIMED, w.round),
                    AcqRel,
                    Relaxed,
                )
                .is_ok()
    }

    /// Writes one exported handle (daemon, before the ring is READY).
    pub fn store_handle(which: &[AtomicU64; 8], bytes: &[u8; HANDLE_BYTES]) {
        for (w, chunk) in which.iter().zip(bytes.chunks_exact(8)) {
            let mut b = [0u8; 8];
            b.copy_from_slice(chunk);
            w.store(u64::from_le_bytes(b), Relaxed);
        }
    }

    /// Reads one exported handle.
    pub fn load_handle(which: &[AtomicU64; 8]) -> [u8; HANDLE_BYTES] {
        let mut out = [0u8; HANDLE_BYTES];
        for (w, chunk) in which.iter().zip(out.chunks_exact_mut(8)) {
            chunk.copy_from_slice(&w.load(Relaxed).to_le_bytes());
        }
        out
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn desc() -> Box<BufferDesc> {
        // SAFETY: BufferDesc is atomics only, for which all-zero bytes are a valid value.
        Box::new(unsafe { std::mem::zeroed() })
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
    fn a_buffer_goes_round_fill_take_release() {
        let d = desc();
        let r = d.fill(&batch(7));
        assert_eq!(d.returned(r), Returned::Waiting);
        let got = d.take(r).unwrap();
        assert_eq!((got.seq, got.samples, got.round), (7, 4, r));
        assert!(d.take(r).is_none(), "taken twice");
        assert_eq!(d.returned(r), Returned::Held);
        assert!(d.release(r));
        assert!(!d.release(r), "released twice");
        assert_eq!(d.returned(r), Returned::Released);
        d.reset(r);
        let r2 = d.fill(&batch(8));
        assert_eq!(r2, r + 1);
        assert!(d.take(r).is_none(), "an old round is never taken");
    }

    #[test]
    fn reclaim_only_takes_held_buffers_and_beats_a_late_release() {
        let d = desc();
        let r = d.fill(&batch(1));
        assert!(!d.reclaim(), "a FILLED buffer stays for the next consumer");
        d.take(r).unwrap();
        assert!(d.reclaim());
        assert!(!d.release(r), "a dead consumer's release lands nowhere");
        assert_eq!(d.returned(r), Returned::Reclaimed);
    }

    #[test]
    fn withdraw_loses_to_a_take() {
        let d = desc();
        let r = d.fill(&batch(1));
        d.take(r).unwrap();
        assert!(!d.withdraw(r));
        let d = desc();
        let r = d.fill(&batch(1));
        assert!(d.withdraw(r));
        assert!(d.take(r).is_none());
    }

    #[test]
    fn handles_round_trip() {
        let d = desc();
        let h: [u8; HANDLE_BYTES] = std::array::from_fn(|i| i as u8 * 3);
        BufferDesc::store_handle(&d.ready_event, &h);
        assert_eq!(BufferDesc::load_handle(&d.ready_event), h);
    }

    #[test]
    fn geometry_places_buffers_on_pages() {
        let g = HandoffGeometry::new(1 << 20, 4, 10_000, 300, true, 0).unwrap();
        assert_eq!(g.spec_offset, (1 << 20) + 4 * 256);
        assert_eq!(g.host_offset % 4096, 0);
        assert!(g.host_offset >= g.spec_offset + 300);
        assert_eq!(g.host_stride(), 10_000);
        assert_eq!(g.end(), (g.host_offset + 40_000).next_multiple_of(4096));
        assert_eq!(g.host_buffer_offset(1), Some(g.host_offset + 10_000));
        let d = HandoffGeometry::new(1 << 20, 4, 10_000, 300, false, 0).unwrap();
        assert_eq!(d.host_offset, 0);
        assert_eq!(d.host_buffer_offset(0), None);
        assert_eq!(d.end() % 4096, 0);
        assert!(HandoffGeometry::new(1 << 20, 0, 1, 1, true, 0).is_none());
        assert!(HandoffGeometry::new(1 << 20, MAX_BUFFERS + 1, 1, 1, true, 0).is_none());
        assert!(HandoffGeometry::new(1 << 20, 1, 1, MAX_SPEC_BYTES + 1, true, 0).is_none());
        assert!(HandoffGeometry::new(100, 1, 1, 1, true, 0).is_none());
        assert!(HandoffGeometry::new(u64::MAX - 4095, 64, u64::MAX / 2, 1, true, 0).is_none());
    }

    #[test]
    fn a_part_table_lies_between_the_descriptors_and_the_spec_and_drops_host_buffers() {
        let g = HandoffGeometry::new(1 << 20, 3, 10_000, 300, true, 5).unwrap();
        assert_eq!(g.parts_offset, (1 << 20) + 3 * 256);
        assert_eq!(g.part_slot_offset(0, 0), g.parts_offset);
        assert_eq!(g.part_slot_offset(1, 2), g.parts_offset + (5 + 2) * 4);
        assert_eq!(
            g.spec_offset,
            g.parts_offset + (3 * 5 * 4u64).next_multiple_of(8)
        );
        assert_eq!(g.host_offset, 0, "the consumer's buffers are its own");
        assert_eq!(g.end() % 4096, 0);
        assert!(g.end() >= g.spec_offset + 300);
        assert!(HandoffGeometry::new(1 << 20, 3, 1, 1, false, MAX_PART_SLOTS + 1).is_none());
    }
}
