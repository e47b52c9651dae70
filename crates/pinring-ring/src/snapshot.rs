//! [`RingSnapshot`]: what a status view reads of a ring, copied out as plain values (each field
//! one atomic load: the snapshot is not one instant, but each value is exact), so a reader holds
//! no reference into shared memory and has nothing it could write through.

use crate::handoff::BufferWord;
use crate::layout::Geometry;
use crate::process::ProcessId;
use crate::ring::{LoaderView, Ring, SlotView};
use crate::sync::atomic::Ordering::{Acquire, Relaxed};

/// The header's counters and sequencing, as values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeaderCounters {
    /// The daemon's random generation.
    pub generation: u64,
    /// Fingerprint of the daemon's dataset and plan config.
    pub fingerprint: u64,
    /// First seq of the run.
    pub start_seq: u64,
    /// One past the last seq.
    pub end_seq: u64,
    /// When the ring was created (CLOCK_REALTIME ns).
    pub created_unix_ns: u64,
    /// Batches delivered.
    pub delivered: u64,
    /// Payload bytes delivered.
    pub bytes_delivered: u64,
    /// The next seq to deliver (the resume point).
    pub next_deliver: u64,
    /// ns the daemon waited for its doorbell.
    pub daemon_wait_ns: u64,
    /// ns of uploads.
    pub upload_ns: u64,
    /// Claims taken back from dead loaders.
    pub reclaimed: u64,
    /// Parts refused.
    pub rejected: u64,
    /// Parts committed by loaders.
    pub committed: u64,
    /// Payload bytes committed.
    pub bytes_committed: u64,
    /// ns loaders waited for a free slot (their own report).
    pub loader_wait_ns: u64,
    /// ns loaders spent making parts (their own report).
    pub loader_busy_ns: u64,
    /// Samples replaced by zeros (the loaders' own report).
    pub bad_samples_skipped: u64,
}

/// The daemon's health block, as values ([`crate::layout::Health`] names each).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HealthCounters {
    /// Claims taken back from live loaders past the lease.
    pub leases_expired: u64,
    /// Slots held out of use (gauge).
    pub quarantined: u64,
    /// Live loaders holding a slot past the lease (gauge).
    pub hung_loaders: u64,
    /// Pid of the last loader declared hung.
    pub last_hung_pid: u64,
    /// Bad batches skipped.
    pub bad_batches_skipped: u64,
    /// Seqs moved to another slot.
    pub reissued: u64,
    /// The daemon's last fault check (CLOCK_MONOTONIC ns).
    pub daemon_heartbeat_ns: u64,
    /// Descriptors found scribbled.
    pub corrupt_descriptors: u64,
    /// Times the daemon restored its header.
    pub header_repairs: u64,
    /// Since when the ring has waited for a loader (0: not stalled).
    pub stalled_since_ns: u64,
    /// The seq it waits for.
    pub stalled_seq: u64,
    /// Live loaders integrated over the run, ns.
    pub loader_ns_seen: u64,
    /// Samples a batch may substitute (0: none).
    pub skippable_per_batch: u64,
}

/// The handoff area, as values (a ring whose daemon hands batches to a consumer).
#[derive(Debug, Clone)]
pub struct HandoffView {
    /// Each batch buffer's word.
    pub buffers: Vec<BufferWord>,
    /// Whether a consumer is attached (its lock is held).
    pub consumer_alive: bool,
    /// The last consumer's pid, as it recorded it.
    pub consumer_pid: u32,
    /// Own buffers holding a batch (a consumer that copies).
    pub own_held: u32,
    /// Batches taken.
    pub taken: u64,
    /// Buffers taken back from dead consumers.
    pub reclaimed: u64,
    /// Backend code ([`crate::handoff::backend_code`]).
    pub backend: u32,
    /// Device ordinal.
    pub device: u32,
}

/// A ring as a status view reads it: every value copied out.
#[derive(Debug, Clone)]
pub struct RingSnapshot {
    /// Ring name.
    pub name: String,
    /// Geometry (validated).
    pub geometry: Geometry,
    /// Ring state ([`crate::ring_state`]).
    pub state: u32,
    /// The daemon, as the header records it.
    pub daemon: ProcessId,
    /// Whether a live daemon holds the ring (the kernel's word: its lock).
    pub daemon_alive: bool,
    /// The header's counters.
    pub header: HeaderCounters,
    /// The health block.
    pub health: HealthCounters,
    /// Every slot.
    pub slots: Vec<SlotView>,
    /// Every attached loader.
    pub loaders: Vec<LoaderView>,
    /// Loader-table entries ACTIVE.
    pub attached_loaders: u32,
    /// The handoff, for a ring that has one.
    pub handoff: Option<HandoffView>,
}

impl Ring {
    /// Copies out what a status view reads.
    pub fn snapshot(&self) -> RingSnapshot {
        let h = self.header();
        let header = HeaderCounters {
            generation: h.generation.load(Relaxed),
            fingerprint: h.fingerprint.load(Relaxed),
            start_seq: h.start_seq.load(Relaxed),
            end_seq: h.end_seq.load(Relaxed),
            created_unix_ns: h.created_unix_ns.load(Relaxed),
            delivered: h.delivered.load(Relaxed),
            bytes_delivered: h.bytes_delivered.load(Relaxed),
            next_deliver: h.next_deliver.load(Relaxed),
            daemon_wait_ns: h.daemon_wait_ns.load(Relaxed),
            upload_ns: h.upload_ns.load(Relaxed),
            reclaimed: h.reclaimed.load(Relaxed),
            rejected: h.rejected.load(Relaxed),
            committed: h.committed.load(Relaxed),
            bytes_committed: h.bytes_committed.load(Relaxed),
            loader_wait_ns: h.loader_wait_ns.load(Relaxed),
            loader_busy_ns: h.loader_busy_ns.load(Relaxed),
            bad_samples_skipped: h.bad_samples_skipped.load(Relaxed),
        };
        let x = self.health();
        let health = HealthCounters {
            leases_expired: x.leases_expired.load(Relaxed),
            quarantined: x.quarantined.load(Relaxed),
            hung_loaders: x.hung_loaders.load(Relaxed),
            last_hung_pid: x.last_hung_pid.load(Relaxed),
            bad_batches_skipped: x.bad_batches_skipped.load(Relaxed),
            reissued: x.reissued.load(Relaxed),
            daemon_heartbeat_ns: x.daemon_heartbeat_ns.load(Relaxed),
            corrupt_descriptors: x.corrupt_descriptors.load(Relaxed),
            header_repairs: x.header_repairs.load(Relaxed),
            stalled_since_ns: x.stalled_since_ns.load(Relaxed),
            stalled_seq: x.stalled_seq.load(Relaxed),
            loader_ns_seen: x.loader_ns_seen.load(Relaxed),
            skippable_per_batch: x.skippable_per_batch.load(Relaxed),
        };
        let g = self.geometry();
        let handoff = g.handoff.map(|hg| {
            let b = self.handoff();
            HandoffView {
                buffers: (0..hg.buffers)
                    .map(|i| self.buffer_desc(i).load_word())
                    .collect(),
                consumer_alive: self.consumer_alive().unwrap_or(false),
                consumer_pid: b.consumer_pid.load(Relaxed),
                own_held: b.own_held.load(Relaxed),
                taken: b.taken.load(Relaxed),
                reclaimed: b.reclaimed.load(Relaxed),
                backend: b.backend.load(Relaxed),
                device: b.device.load(Relaxed),
            }
        });
        RingSnapshot {
            name: self.name().to_string(),
            geometry: g,
            state: h.state.load(Acquire),
            daemon: self.daemon(),
            daemon_alive: self.daemon_alive().unwrap_or(false),
            header,
            health,
            slots: (0..g.slot_count).map(|i| self.slot_view(i)).collect(),
            loaders: self.loaders(),
            attached_loaders: self.attached_loaders(),
            handoff,
        }
    }
}
