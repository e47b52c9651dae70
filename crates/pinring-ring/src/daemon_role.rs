//! The daemon's handle ([`DaemonRing`]): what only the daemon does to its ring (hand slots
//! out, take committed parts, take slots back, change the ring's state, fill batch buffers,
//! reap the dead), what it reads (as values or named checks), and the counters it publishes,
//! each through a named method: like the loader's and the consumer's handles (`roles.rs`),
//! it does not dereference to [`Ring`], so no code outside this crate writes the header, the
//! health block or a descriptor field by hand.

use crate::clock::monotonic_ns;
use crate::error::{RingError, SlotFault};
use crate::futex;
use crate::handoff::{Filled, Returned};
use crate::layout::*;
use crate::ring::{sealed_fields, CreateOptions, DaemonRing, Ring};
#[cfg(doc)]
use crate::ring::{ConsumerRing, RingView};
use crate::slot::Taken;
use crate::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::time::Duration;

impl DaemonRing {
    /// Creates the ring: the daemon's handle ([`DaemonRing::create`]'s checks and publication).
    pub fn create(opts: &CreateOptions) -> Result<DaemonRing, RingError> {
        Ring::create(opts).map(DaemonRing)
    }

    /// The whole data area, to register with the backend for uploads: its start and length.
    /// The daemon reads a slot through it only while the slot is UPLOADING.
    pub fn registration_span(&self) -> (*mut u8, usize) {
        (self.0.data_base(), self.0.data_len())
    }

    /// Slot `i`'s first byte, as the source of an upload of the part it holds (within
    /// [`DaemonRing::registration_span`]; the slot taken, UPLOADING). Panics if out of range
    /// (caller bug).
    #[inline]
    pub fn upload_source(&self, i: u32) -> *mut u8 {
        self.0.slot_ptr(i)
    }

    /// Host backend: batch buffer `i`'s bytes in the mapping, which the daemon fills for the
    /// consumer (`None` for device buffers or a ring without a handoff). Panics if `i` is out
    /// of range (caller bug).
    pub fn host_buffer_ptr(&self, i: u32) -> Option<*mut u8> {
        self.0.host_buffer_ptr(i)
    }

    /// What the daemon's own status and metrics read of its ring, copied out as plain values
    /// (what a [`RingView`] reads from outside).
    pub fn snapshot(&self) -> crate::snapshot::RingSnapshot {
        self.0.snapshot()
    }

    /// Marks the handoff exported (every buffer's handles written, before the ring is READY):
    /// from now on a consumer may attach ([`ConsumerRing::attach`]).
    pub fn mark_exported(&self) {
        // Release: pairs with the consumer's Acquire load before it reads the handles.
        self.0.handoff().exported.store(1, Release);
    }

    /// Publishes a whole batch in EMPTY buffer `i` for the consumer; returns the new round.
    pub fn fill_buffer(&self, i: u32, f: &Filled) -> u32 {
        self.0.buffer_desc(i).fill(f)
    }

    /// What became of buffer `i`, filled in `round`: still FILLED or TAKEN, released, or
    /// reclaimed from a dead consumer.
    pub fn buffer_returned(&self, i: u32, round: u32) -> Returned {
        self.0.buffer_desc(i).returned(round)
    }

    /// Marks returned buffer `i` of `round` EMPTY: the daemon's to fill again.
    pub fn reset_buffer(&self, i: u32, round: u32) {
        self.0.buffer_desc(i).reset(round)
    }

    /// Drain: takes back FILLED buffer `i` of `round` that nobody took; false if the consumer took
    /// it first.
    pub fn withdraw_buffer(&self, i: u32, round: u32) -> bool {
        self.0.buffer_desc(i).withdraw(round)
    }

    /// Daemon side: compares the header with the daemon's own record of what it wrote, restores
    /// every field another process changed, and names them (empty: nothing was touched). A
    /// ring opened rather than created has no record and reports nothing.
    pub fn repair_header(&self) -> Vec<&'static str> {
        let Some(seal) = &self.0.seal else {
            return Vec::new();
        };
        let seal = seal.lock().unwrap_or_else(|p| p.into_inner());
        let h = self.0.header();
        let (f64s, f32s) = sealed_fields(h, self.0.handoff());
        let mut changed = Vec::new();
        for ((name, f), want) in f64s.into_iter().zip(seal.words64) {
            if f.swap(want, Relaxed) != want {
                changed.push(name);
            }
        }
        for ((name, f), want) in f32s.into_iter().zip(seal.words32) {
            if f.swap(want, Relaxed) != want {
                changed.push(name);
            }
        }
        if h.state.load(Acquire) != seal.state {
            changed.push("state");
            h.state.store(seal.state, Release);
            futex::bump_and_wake_all(&h.work_futex);
            futex::bump_and_wake_all(&h.doorbell_futex);
        }
        if !changed.is_empty() {
            self.0.health().header_repairs.fetch_add(1, Relaxed);
        }
        changed
    }

    /// Sets the ring state and wakes every waiter on both futex words.
    pub fn set_state(&self, state: u32) {
        if let Some(seal) = &self.0.seal {
            seal.lock().unwrap_or_else(|p| p.into_inner()).state = state;
        }
        self.0.header().state.store(state, Release);
        futex::bump_and_wake_all(&self.0.header().work_futex);
        futex::bump_and_wake_all(&self.0.header().doorbell_futex);
        futex::bump_and_wake_all(&self.0.handoff().deliver_futex);
    }

    /// Wakes up to `n` loaders waiting for a free slot (none if none waits).
    pub fn wake_loaders(&self, n: i32) {
        let h = self.0.header();
        futex::bump_and_wake_counted(&h.work_futex, &h.work_waiters, n);
    }

    /// The daemon's wait for its doorbell, from `seen` (loaded before it looked for work).
    pub fn wait_doorbell(&self, seen: u32, timeout: Duration) -> futex::Wake {
        let h = self.0.header();
        futex::wait_counted(&h.doorbell_futex, &h.doorbell_waiters, seen, timeout)
    }

    /// The daemon's wait for its doorbell that a loader's commit does not end: only
    /// [`Ring::ring_doorbell`] on this same handle does (the daemon's completion and sink
    /// threads), or the deadline. For a daemon with enough uploads in flight that the next
    /// completion comes before the copy engine runs dry: it then takes every part committed
    /// meanwhile in one pass, and loaders commit without a wake-up system call.
    pub fn wait_doorbell_quiet(&self, seen: u32, timeout: Duration) -> futex::Wake {
        let h = self.0.header();
        futex::wait_counted(&h.doorbell_futex, &self.0.quiet_waiters, seen, timeout)
    }

    /// Removes the segment's name (daemon, at exit), unless the name now refers to another
    /// file (a replacement is never removed by the daemon it replaced).
    pub fn unlink(&self) -> Result<(), RingError> {
        self.0.seg.unlink_if_ours().map(|_| ())
    }

    /// Daemon: if no consumer holds the ring, marks RECLAIMED every buffer a dead one still held;
    /// returns how many.
    pub fn reclaim_from_dead_consumer(&self) -> Result<u64, RingError> {
        let Some(hg) = self.0.geom.handoff else {
            return Ok(0);
        };
        if self.0.consumer_alive()? {
            return Ok(0);
        }
        let mut n = 0;
        for i in 0..hg.buffers {
            n += u64::from(self.0.buffer_desc(i).reclaim());
        }
        if n > 0 {
            self.0.handoff().reclaimed.fetch_add(n, Relaxed);
        }
        Ok(n)
    }

    /// Daemon: wakes the consumer waiting for a batch (a wake only if one sleeps); `all`: state
    /// changes, which wake unconditionally.
    pub fn wake_consumer(&self, all: bool) {
        let b = self.0.handoff();
        if all {
            futex::bump_and_wake_all(&b.deliver_futex);
        } else {
            futex::bump_and_wake_counted(&b.deliver_futex, &b.deliver_waiters, 1);
        }
    }

    /// Hands slot `i` out for `seq` (from IDLE or UPLOADING). Returns the new ticket.
    pub fn assign(&self, i: u32, seq: u64) -> u32 {
        self.assign_at(i, seq, monotonic_ns())
    }

    /// [`DaemonRing::assign`], with the time it is freed at (the slot's `free_ns`) read by the caller:
    /// a daemon that frees many slots in one pass reads the clock once.
    pub fn assign_at(&self, i: u32, seq: u64, free_ns: u64) -> u32 {
        self.0.desc(i).assign(seq, free_ns)
    }

    /// Parks slot `i` with no work (end of plan, or draining).
    pub fn park(&self, i: u32) {
        self.0.desc(i).park()
    }

    /// Takes a FREE slot back so no loader claims it (draining). True if it was FREE.
    pub fn unassign_if_free(&self, i: u32) -> bool {
        self.0.desc(i).unassign_if_free()
    }

    /// If slot `i` is READY, validates its descriptor against the seq the daemon assigned and
    /// takes it (READY → UPLOADING). `Ok(None)`: not ready yet.
    pub fn take_ready(&self, i: u32, assigned_seq: u64) -> Result<Option<Taken>, SlotFault> {
        self.0
            .desc(i)
            .take_ready(i, assigned_seq, self.0.geom.slot_bytes)
    }

    /// If slot `i` is CLAIMED by a loader that is no longer attached (its tenure lock is free:
    /// it exited or died, whatever pid namespace it ran in), puts it back to FREE with the same seq
    /// (a new ticket, so the dead owner's commit could never land). Returns the reclaimed seq.
    pub fn reclaim_if_owner_dead(&self, i: u32) -> Option<u64> {
        let seq = self
            .0
            .desc(i)
            .reclaim_if_owner_dead(|owner, tenure| self.0.claimant_alive(owner, tenure))?;
        self.0.header().reclaimed.fetch_add(1, Relaxed);
        Some(seq)
    }

    /// Clears loader-table entries whose occupant is gone (it died without detaching: its entry
    /// lock is free).
    pub fn reap_dead_loaders(&self) -> usize {
        let mut n = 0;
        for i in 0..MAX_LOADERS as u16 {
            let e = self.0.loader(i as usize);
            if e.state.load(Acquire) == loader_state::EMPTY {
                continue;
            }
            if self.0.entry_occupied(i) == Some(false) {
                e.state.store(loader_state::EMPTY, Release);
                e.pid.store(0, Release);
                n += 1;
            }
        }
        n
    }
}

/// What the daemon reads of its ring: each a value or a named check, none a field to write
/// through.
impl DaemonRing {
    /// The segment (its path, for the embedding process to open the ring there).
    pub fn segment(&self) -> &crate::segment::Segment {
        self.0.segment()
    }

    /// The loader table, as values.
    pub fn loaders(&self) -> Vec<crate::ring::LoaderView> {
        self.0.loaders()
    }

    /// Slot `i`'s descriptor, as values (untrusted: read for checks and messages).
    pub fn slot_view(&self, i: u32) -> crate::ring::SlotView {
        self.0.slot_view(i)
    }

    /// When a loader claimed slot `i` (its clock, written by the loader: untrusted, for
    /// statistics only).
    pub fn claim_ns(&self, i: u32) -> u64 {
        self.0.desc(i).claim_ns.load(Relaxed)
    }

    /// Copies `len` bytes at `offset` of slot `i` into `out` (a taken slot's metadata, decoded
    /// in private memory only).
    pub fn copy_out(&self, i: u32, offset: u64, len: u64, out: &mut Vec<u8>) {
        self.0.copy_out(i, offset, len, out)
    }

    /// The message a loader left in slot `i` with a failed part (`crate::failure`).
    pub fn read_failure(&self, i: u32) -> String {
        crate::failure::read_failure(&self.0, i)
    }

    /// Whether this process took a SIGBUS on the segment (it was truncated under it).
    pub fn truncated_here(&self) -> bool {
        self.0.truncated_here()
    }

    /// Checks the segment's file: still the daemon's, at its size.
    pub fn check_file(&self) -> Result<(), RingError> {
        self.0.check_file()
    }

    /// The doorbell's word now, to sleep on ([`DaemonRing::wait_doorbell`]) without missing a
    /// ring that comes after this load.
    pub fn doorbell_seen(&self) -> u32 {
        // Acquire: pairs with the Release bump of whoever rings (a loader's commit, the
        // completion thread, the sink), so a ring after this load makes the wait return at once.
        self.0.header().doorbell_futex.load(Acquire)
    }

    /// Rings the daemon's own doorbell (the completion thread and the sink, in its process).
    pub fn ring_doorbell(&self) {
        self.0.ring_doorbell()
    }

    /// Slot `i`'s state word (for the lease books).
    pub fn word(&self, i: u32) -> crate::slot::SlotWord {
        self.0.word(i)
    }

    /// Whether the owner of an expired claim can no longer write into its slot
    /// (`Ring::released_by`).
    pub fn released_by(&self, e: &crate::recovery::Expired) -> bool {
        self.0.released_by(e)
    }

    /// Whether the owner of an expired claim still runs (for the hung-loader gauge).
    pub fn expired_owner_alive(&self, e: &crate::recovery::Expired) -> bool {
        self.0.expired_owner_alive(e)
    }
}

/// The fault counters the daemon publishes for status views, each overwriting whatever
/// another process wrote there since ([`DaemonRing::publish_faults`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultCounts {
    /// Slots taken back from dead or hung loaders.
    pub reclaimed: u64,
    /// Parts refused at take (bad descriptor, bad metadata, failed part).
    pub rejected: u64,
    /// Slots taken back from live loaders past the lease.
    pub leases_expired: u64,
    /// Bad batches skipped under `on_bad_batch = "skip"`.
    pub bad_batches_skipped: u64,
    /// Seqs moved to another slot.
    pub reissued: u64,
    /// Descriptors (of slots or batch buffers) found in a state the daemon never left them in.
    pub corrupt_descriptors: u64,
}

/// What the daemon publishes: the header's and the health block's counters and gauges, each
/// through a named method (status views and the metrics read them).
impl DaemonRing {
    /// The next seq the daemon hands out (status only).
    pub fn publish_next_assign(&self, seq: u64) {
        self.0.header().next_assign.store(seq, Relaxed);
    }

    /// The resume point: the lowest seq not delivered (status only; never read back).
    pub fn publish_resume_seq(&self, seq: u64) {
        self.0.header().next_deliver.store(seq, Relaxed);
    }

    /// Adds batches delivered, their payload bytes and their upload time.
    pub fn add_deliveries(&self, batches: u64, bytes: u64, upload_ns: u64) {
        let h = self.0.header();
        if batches > 0 {
            h.delivered.fetch_add(batches, Relaxed);
        }
        if bytes > 0 {
            h.bytes_delivered.fetch_add(bytes, Relaxed);
        }
        if upload_ns > 0 {
            h.upload_ns.fetch_add(upload_ns, Relaxed);
        }
    }

    /// Adds time the daemon waited where it could have uploaded.
    pub fn add_daemon_wait(&self, ns: u64) {
        self.0.header().daemon_wait_ns.fetch_add(ns, Relaxed);
    }

    /// Stamps slot `i` with when its upload started (status only).
    pub fn stamp_upload(&self, i: u32, ns: u64) {
        self.0.desc(i).upload_ns.store(ns, Relaxed);
    }

    /// Lists `slot` as part `part` of batch buffer `buffer` in the part table (a consumer that
    /// copies reads the batch's parts there); nothing where the ring has no such entry.
    pub fn set_part_slot(&self, buffer: u32, part: u32, slot: u32) {
        if let Some(entry) = self.0.part_slot(buffer, part) {
            entry.store(slot, Relaxed);
        }
    }

    /// Writes batch buffer `i`'s handles for the consumer (before the handoff is exported).
    pub fn store_buffer_handles(
        &self,
        i: u32,
        mem: &[u8; crate::handoff::HANDLE_BYTES],
        ready_event: &[u8; crate::handoff::HANDLE_BYTES],
        release_event: &[u8; crate::handoff::HANDLE_BYTES],
    ) {
        let d = self.0.buffer_desc(i);
        crate::handoff::BufferDesc::store_handle(&d.mem_handle, mem);
        crate::handoff::BufferDesc::store_handle(&d.ready_event, ready_event);
        crate::handoff::BufferDesc::store_handle(&d.release_event, release_event);
    }

    /// Books a batch buffer filled ([`DaemonRing::fill_buffer`]) whose batch ends before
    /// `next_seq`: the consumer's count of filled buffers, and the seq below which every batch
    /// was filled.
    pub fn book_filled(&self, next_seq: u64) {
        let b = self.0.handoff();
        b.filled.fetch_add(1, Relaxed);
        // Release: a consumer that reads this sees the FILLED words of every batch below it.
        b.filled_next.fetch_max(next_seq, Release);
    }

    /// Publishes the fault counters (overwriting what another process wrote since).
    pub fn publish_faults(&self, c: &FaultCounts) {
        let (h, health) = (self.0.header(), self.0.health());
        h.reclaimed.store(c.reclaimed, Relaxed);
        h.rejected.store(c.rejected, Relaxed);
        health.leases_expired.store(c.leases_expired, Relaxed);
        health
            .bad_batches_skipped
            .store(c.bad_batches_skipped, Relaxed);
        health.reissued.store(c.reissued, Relaxed);
        health
            .corrupt_descriptors
            .store(c.corrupt_descriptors, Relaxed);
    }

    /// What views check the loaders' own figures against: the loader time the daemon saw, and
    /// the samples a batch may have replaced with zeros.
    pub fn publish_seen(&self, loader_ns_seen: u64, skippable_per_batch: u64) {
        let health = self.0.health();
        health.loader_ns_seen.store(loader_ns_seen, Relaxed);
        health
            .skippable_per_batch
            .store(skippable_per_batch, Relaxed);
    }

    /// Slots kept out of use, and claims past their lease whose owner still runs.
    pub fn publish_quarantine(&self, quarantined: u64, hung_loaders: u64) {
        let health = self.0.health();
        health.quarantined.store(quarantined, Relaxed);
        health.hung_loaders.store(hung_loaders, Relaxed);
    }

    /// The daemon's heartbeat: it ran a reap now (views tell a hung daemon by it).
    pub fn publish_heartbeat(&self) {
        self.0
            .health()
            .daemon_heartbeat_ns
            .store(monotonic_ns(), Relaxed);
    }

    /// The pid of the last loader declared hung.
    pub fn publish_hung_pid(&self, pid: u32) {
        self.0.health().last_hung_pid.store(u64::from(pid), Relaxed);
    }

    /// The stall: since when (monotonic ns, 0: none) and the seq that waits.
    pub fn publish_stall(&self, since_ns: u64, seq: u64) {
        let health = self.0.health();
        health.stalled_since_ns.store(since_ns, Relaxed);
        health.stalled_seq.store(seq, Relaxed);
    }
}
