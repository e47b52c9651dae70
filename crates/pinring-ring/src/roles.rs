//! The loader's and the consumer's handles: what each may read of the ring (as values), the
//! constructors that check admission, and each role's calls. The handles themselves, with the
//! `compile_fail` doctests that pin what they cannot do, are in [`crate::ring`].

use crate::clock::monotonic_ns;
use crate::error::{CommitError, RingError};
use crate::futex;
use crate::handoff::{BufferDesc, Filled};
use crate::layout::*;
use crate::lock;
use crate::process::ProcessId;
use crate::ring::{ConsumerRing, DaemonRing, LoaderRing, Ring, RingView, SlotView, ERR_TOO_LARGE};
use crate::segment::Access;
use crate::slot::{Batch, Seat};
use crate::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use crate::writer::{Claim, SlotWriter};
use nix::sys::mman::{madvise, MmapAdvise};
use std::time::Duration;

/// What every role may read of the ring: its name, geometry, state and the daemon's identity,
/// as values (nothing that can be written through).
macro_rules! shared_reads {
    ($($role:ident),*) => {$(
        impl $role {
            /// Ring name.
            #[inline]
            pub fn name(&self) -> &str {
                self.0.name()
            }

            /// Geometry (validated).
            #[inline]
            pub fn geometry(&self) -> Geometry {
                self.0.geom
            }

            /// Current ring state ([`ring_state`]).
            #[inline]
            pub fn state(&self) -> u32 {
                self.0.state()
            }

            /// Whether batches are delivered in order.
            pub fn in_order(&self) -> bool {
                self.0.in_order()
            }

            /// The daemon owning the ring.
            pub fn daemon(&self) -> ProcessId {
                self.0.daemon()
            }

            /// Whether a live daemon holds this ring (the kernel's word: its lock).
            pub fn daemon_alive(&self) -> Result<bool, RingError> {
                self.0.daemon_alive()
            }

            /// How many loaders are attached (loader-table entries ACTIVE).
            pub fn attached_loaders(&self) -> u32 {
                self.0.attached_loaders()
            }

            /// The fingerprint of the daemon's dataset and plan config.
            pub fn fingerprint(&self) -> u64 {
                self.0.fingerprint()
            }

            /// One past the run's last seq.
            pub fn end_seq(&self) -> u64 {
                self.0.end_seq()
            }

            /// The run's first seq.
            pub fn start_seq(&self) -> u64 {
                self.0.start_seq()
            }

            /// The ring's generation (drawn by its daemon at creation).
            pub fn generation(&self) -> u64 {
                self.0.header().generation.load(Relaxed)
            }

            /// A copy of the settings record's words (untrusted values: for messages only).
            pub fn settings_record(&self) -> [u64; crate::layout::SETTINGS_WORDS] {
                self.0.settings_record()
            }

            /// The spec the daemon stored in the handoff area, copied out (untrusted: `Spec::adopt`
            /// checks it);
            /// `None` for a ring without a handoff.
            pub fn handoff_spec(&self) -> Option<Vec<u8>> {
                self.0.handoff_spec()
            }
        }
    )*};
}
shared_reads!(DaemonRing, LoaderRing, ConsumerRing, RingView);

impl LoaderRing {
    /// Takes the loader's role on an opened ring: refused for a ring opened read-only
    /// (`ReadOnlyRole`) and, where this process may not write into it, as at open
    /// (`ForeignRing`: the owner, or the group of a ring of mode 0660).
    pub fn join(ring: Ring) -> Result<LoaderRing, RingError> {
        ring.admit("a loader")?;
        Ok(LoaderRing(ring))
    }
}

impl ConsumerRing {
    /// Takes the consumer's role on an opened ring: refused as [`LoaderRing::join`] refuses,
    /// and with `NoHandoff` for a ring whose daemon hands no batches over (it runs another
    /// sink, or has not exported its buffers).
    pub fn attach(ring: Ring) -> Result<ConsumerRing, RingError> {
        ring.admit("a consumer")?;
        if ring.geom.handoff.is_none() || ring.handoff().exported.load(Acquire) != 1 {
            return Err(RingError::NoHandoff {
                name: ring.name().into(),
            });
        }
        Ok(ConsumerRing(ring))
    }
}

impl LoaderRing {
    /// Enters this process in the loader table: takes the lock of the first entry no live loader
    /// holds, then a lock for a new tenure of it, and records itself there. The locks are this
    /// handle's: they go when it drops or the process dies, which is how the daemon learns that
    /// the loader is gone ([`DaemonRing::reclaim_if_owner_dead`]). A ring opened read-only cannot take
    /// them.
    pub fn attach_loader(&self, me: ProcessId) -> Result<Seat, RingError> {
        let mut held = self.0.seat.lock().unwrap_or_else(|p| p.into_inner());
        if held.is_some() {
            return Err(RingError::AlreadyAttached {
                name: self.0.name().into(),
            });
        }
        let fd = self.0.seg.file();
        for i in 0..MAX_LOADERS as u16 {
            if !lock::try_lock_exclusive(fd, lock::entry_lock(i))
                .map_err(|e| self.0.sys("fcntl(F_OFD_SETLK) on a loader entry", e))?
            {
                continue;
            }
            let e = self.0.loader(i as usize);
            // Any former occupant is dead (it held this lock while alive). A tenure whose lock
            // someone still holds could only come from a scribbled `tenure`: skip past it.
            let mut tenure = e.tenure.load(Relaxed).wrapping_add(1);
            let mut taken = false;
            for _ in 0..16 {
                if lock::try_lock_exclusive(fd, lock::tenure_lock(i, tenure))
                    .map_err(|e| self.0.sys("fcntl(F_OFD_SETLK) on a tenure", e))?
                {
                    taken = true;
                    break;
                }
                tenure = tenure.wrapping_add(1);
            }
            if !taken {
                let _ = lock::unlock(fd, lock::entry_lock(i));
                continue;
            }
            e.state.store(loader_state::ATTACHING, Relaxed);
            e.tenure.store(tenure, Relaxed);
            e.pid.store(me.pid, Relaxed);
            e.start_time.store(me.start_time, Relaxed);
            for c in [&e.batches, &e.busy_ns, &e.wait_ns, &e.bytes, &e.abandoned] {
                c.store(0, Relaxed);
            }
            e.heartbeat_ns.store(monotonic_ns(), Relaxed);
            // Release: the fields above are visible to whoever sees ACTIVE.
            e.state.store(loader_state::ACTIVE, Release);
            let seat = Seat { index: i, tenure };
            *held = Some(seat);
            return Ok(seat);
        }
        Err(RingError::LoaderTableFull {
            name: self.0.name().into(),
            max: MAX_LOADERS,
        })
    }

    /// Removes a loader from the table (at clean exit) and releases its locks.
    pub fn detach_loader(&self, seat: Seat) {
        let e = self.0.loader(seat.index as usize);
        e.state.store(loader_state::EMPTY, Release);
        e.pid.store(0, Release);
        let fd = self.0.seg.file();
        let _ = lock::unlock(fd, lock::tenure_lock(seat.index, seat.tenure));
        let _ = lock::unlock(fd, lock::entry_lock(seat.index));
        let mut held = self.0.seat.lock().unwrap_or_else(|p| p.into_inner());
        if *held == Some(seat) {
            *held = None;
        }
    }

    /// Tries to claim one FREE slot, scanning from `hint`. One CAS per candidate
    /// (`SlotDesc::try_claim`).
    pub fn try_claim(&self, seat: Seat, hint: u32) -> Option<Claim> {
        let n = self.0.geom.slot_count;
        (0..n).find_map(|k| self.claim_slot(seat, (hint + k) % n))
    }

    /// Tries to claim one FREE slot: first among the slots this loader keeps to, those whose
    /// index is its seat's index modulo `share` (with `share` loaders attached, each keeps to
    /// its own `1 / share` of the ring), in turn from the first of them at or after `hint`
    /// (the slot after its last claim), then any ([`LoaderRing::try_claim`] from `hint`). The
    /// preference changes which free slot is taken, never whether one is: a loader whose own
    /// slots are all busy takes another's. With 8 loaders on 64 slots of 1 MiB this moved
    /// 51.5-52.2 GB/s to the GPU in ten runs, where taking the next free slot after the last
    /// moved 49.3-50.0 (docs/BENCHMARKS.md, "Loaders keep to their own slots").
    ///
    /// In turn, not lowest index first: the daemon hands slots out again in the order it takes
    /// them, which in order is seq order, so a loader that goes round its own slots fills them
    /// in seq order too. Lowest index first filled a later seq while an earlier one waited in a
    /// free slot further on; in a large ring the daemon, which takes seqs in order, then waited
    /// with the ring full: 1 MiB slots in a 1 GiB ring moved 24.6 GB/s in order against 44.1
    /// unordered (docs/BENCHMARKS.md, "Small rings, large rings").
    pub fn try_claim_preferring(&self, seat: Seat, share: u32, hint: u32) -> Option<Claim> {
        let n = self.0.geom.slot_count;
        let first = u32::from(seat.index) % share.max(1);
        let own = (share > 1 && first < n)
            .then(|| {
                // Own slots are first, first + share, ...: `count` of them, the k-th at
                // first + k * share; start at the first one at or after `hint`.
                let count = (n - first).div_ceil(share);
                let start = hint.saturating_sub(first).div_ceil(share) % count;
                (0..count)
                    .map(|k| first + (start + k) % count * share)
                    .find_map(|i| self.claim_slot(seat, i))
            })
            .flatten();
        own.or_else(|| {
            self.try_claim(seat, hint).map(|c| Claim {
                foreign: share > 1 && c.slot % share != first,
                ..c
            })
        })
    }

    /// Tries to claim the FREE slot with the lowest seq that `wanted` accepts (a loader that
    /// makes only some batches: an iterable dataset's worker makes every `n`-th). One pass over
    /// the slot words, then one CAS on the chosen slot, expecting the round seen; a lost race
    /// looks again, at most `slot_count` times. Lowest seq first, because the daemon takes
    /// parts in seq order: a later part filled first would wait for the earlier one anyway.
    pub fn try_claim_where(&self, seat: Seat, wanted: &dyn Fn(u64) -> bool) -> Option<Claim> {
        let n = self.0.geom.slot_count;
        for _ in 0..n {
            let best = (0..n)
                .filter_map(|i| self.0.desc(i).free_seq().map(|(seq, w)| (seq, i, w)))
                .filter(|&(seq, _, _)| wanted(seq))
                .min_by_key(|&(seq, _, _)| seq)?;
            let (seq, slot, seen) = best;
            if let Some(round) = self.0.desc(slot).try_claim_seen(seat, seen) {
                debug_assert_eq!(round.seq, seq);
                return Some(Claim {
                    slot,
                    seq: round.seq,
                    ticket: round.ticket,
                    seat,
                    foreign: false,
                    forget: false,
                });
            }
        }
        None
    }

    /// One CAS on slot `i` (`SlotDesc::try_claim`): the claim if it was FREE.
    fn claim_slot(&self, seat: Seat, i: u32) -> Option<Claim> {
        self.0.desc(i).try_claim(seat).map(|round| Claim {
            slot: i,
            seq: round.seq,
            ticket: round.ticket,
            seat,
            foreign: false,
            forget: false,
        })
    }

    /// Write access to the claimed slot's bytes, for the claimant to fill. The `&mut Claim`
    /// borrow keeps this process from taking two writers over one claim.
    pub fn slot_writer<'a>(&'a self, claim: &'a mut Claim) -> SlotWriter<'a> {
        SlotWriter {
            // slot_ptr checks the index; the result lies inside the mapping, so it is non-null.
            base: std::ptr::NonNull::new(self.0.slot_ptr(claim.slot)).expect("mapped"),
            len: self.0.geom.slot_bytes as usize,
            _claim: std::marker::PhantomData,
        }
    }

    /// Publishes a filled slot (CLAIMED → READY) and rings the daemon's doorbell. Lengths that do
    /// not fit the slot publish an error instead ([`ERR_TOO_LARGE`]) and return `TooLarge`.
    pub fn commit(
        &self,
        claim: Claim,
        payload_len: u64,
        meta_len: u64,
        sample_count: u32,
        error: u32,
    ) -> Result<(), CommitError> {
        let slot_bytes = self.0.geom.slot_bytes;
        let meta_offset = align_up(payload_len, META_ALIGN).unwrap_or(u64::MAX);
        let too_large = (meta_offset.saturating_add(meta_len) > slot_bytes
            || meta_len > u64::from(u32::MAX))
        .then_some(CommitError::TooLarge {
            slot: claim.slot,
            payload: payload_len,
            meta: meta_len,
            slot_bytes,
        });
        // A batch that does not fit is still published, as an error with no bytes, so the slot
        // never stays CLAIMED by a live loader that gave up on it.
        let (payload_len, meta_len, error) = if too_large.is_some() {
            (0, 0, ERR_TOO_LARGE)
        } else {
            (payload_len, meta_len, error)
        };
        let batch = Batch {
            payload_len,
            meta_len: meta_len as u32,
            sample_count,
            error,
        };
        if self
            .0
            .desc(claim.slot)
            .commit(claim.seat, claim.ticket, batch)
        {
            let h = self.0.header();
            h.committed.fetch_add(1, Relaxed);
            h.bytes_committed.fetch_add(payload_len, Relaxed);
            futex::bump_and_wake_counted(&h.doorbell_futex, &h.doorbell_waiters, 1);
            if claim.forget {
                self.forget_slot_pages(claim.slot);
            }
            too_large.map_or(Ok(()), Err)
        } else {
            Err(CommitError::Reclaimed {
                slot: claim.slot,
                seq: claim.seq,
            })
        }
    }

    /// Drops this process's page-table entries for slot `i`'s bytes (`MADV_DONTNEED` over the
    /// slot's whole pages): they stop counting in its resident memory (RSS, PSS), and the next
    /// access maps the same bytes again from the segment, which keeps them (the mapping is
    /// shared). Only this process's mapping changes: the daemon's registration and every other
    /// mapping are untouched. Skipped in the daemon's own process, whose mapping is the one
    /// registered for uploads, and for a read-only mapping. Best effort: a refusal is logged at
    /// debug level and changes nothing else.
    pub fn forget_slot_pages(&self, i: u32) {
        if self.0.seg.access() != Access::ReadWrite || self.0.daemon().pid == std::process::id() {
            return;
        }
        let ptr = self.0.slot_ptr(i);
        // Slots start on a page boundary (SLOT_ALIGN); only whole pages of the slot.
        let len = self.0.geom.slot_bytes as usize / SLOT_ALIGN * SLOT_ALIGN;
        let Some(addr) = std::ptr::NonNull::new(ptr.cast::<std::ffi::c_void>()) else {
            return;
        };
        if len == 0 {
            return;
        }
        // SAFETY: [addr, addr + len) lies inside this ring's mapping (slot_ptr checked the index,
        // the slot is slot_bytes long) and is a MAP_SHARED mapping of the segment file, so
        // MADV_DONTNEED only unmaps this process's pages: the bytes stay in the file and a later
        // access maps them again. No Rust reference into slot data exists (slot bytes are only
        // reached through raw pointers), so none can observe the pages go.
        let r = unsafe { madvise(addr, len, MmapAdvise::MADV_DONTNEED) };
        if let Err(e) = r {
            tracing::debug!(ring = %self.0.name(), slot = i, "cannot drop the slot's pages: {e}");
        }
    }

    /// Books a committed part in seat `seat`'s loader-table entry (batches, payload bytes, busy
    /// time, heartbeat) and the header's busy time: the loader's own counters, which `pinring
    /// status` and the daemon's summary read.
    #[inline]
    pub fn record_commit(&self, seat: Seat, payload_len: u64, busy_ns: u64) {
        let entry = self.0.loader(seat.index as usize);
        entry.batches.fetch_add(1, Relaxed);
        entry.bytes.fetch_add(payload_len, Relaxed);
        entry.busy_ns.fetch_add(busy_ns, Relaxed);
        entry.heartbeat_ns.store(monotonic_ns(), Relaxed);
        self.0.header().loader_busy_ns.fetch_add(busy_ns, Relaxed);
    }

    /// Books `ns` of waiting for a free slot in seat `seat`'s entry and the header, and
    /// refreshes the seat's heartbeat.
    #[inline]
    pub fn record_wait(&self, seat: Seat, ns: u64) {
        let entry = self.0.loader(seat.index as usize);
        entry.wait_ns.fetch_add(ns, Relaxed);
        self.0.header().loader_wait_ns.fetch_add(ns, Relaxed);
        entry.heartbeat_ns.store(monotonic_ns(), Relaxed);
    }

    /// Counts one sample replaced by zeros (`dataset.on_bad_sample = "skip"`) in the ring's
    /// count of skipped samples (all loaders').
    pub fn count_bad_sample(&self) {
        self.0.header().bad_samples_skipped.fetch_add(1, Relaxed);
    }

    /// The work futex's value, loaded (Acquire) before looking for a free slot: the `seen` of
    /// [`LoaderRing::wait_for_work`].
    #[inline]
    pub fn work_seen(&self) -> u32 {
        self.0.header().work_futex.load(Acquire)
    }

    /// A loader's wait for a free slot, from `seen` (loaded before it looked for one).
    pub fn wait_for_work(&self, seen: u32, timeout: Duration) -> futex::Wake {
        let h = self.0.header();
        futex::wait_counted(&h.work_futex, &h.work_waiters, seen, timeout)
    }
}

impl ConsumerRing {
    /// Buffer `i`'s word (state and round), loaded with Acquire.
    #[inline]
    pub fn buffer_word(&self, i: u32) -> crate::handoff::BufferWord {
        self.0.buffer_desc(i).load_word()
    }

    /// The seq buffer `i`'s descriptor names (untrusted: check it against the word's round).
    #[inline]
    pub fn buffer_seq(&self, i: u32) -> u64 {
        self.0.buffer_desc(i).seq.load(Relaxed)
    }

    /// Buffer `i`'s exported handles (CUDA IPC): its memory, its ready and its release event.
    pub fn buffer_handles(&self, i: u32) -> [[u8; crate::handoff::HANDLE_BYTES]; 3] {
        let d = self.0.buffer_desc(i);
        [
            BufferDesc::load_handle(&d.mem_handle),
            BufferDesc::load_handle(&d.ready_event),
            BufferDesc::load_handle(&d.release_event),
        ]
    }

    /// The handoff's backend code ([`crate::handoff::backend_code`]) and device ordinal.
    pub fn handoff_backend(&self) -> (u32, u32) {
        let b = self.0.handoff();
        (b.backend.load(Relaxed), b.device.load(Relaxed))
    }

    /// The next seq the daemon will hand over (Acquire: every batch below it is seen FILLED,
    /// or taken).
    pub fn filled_next(&self) -> u64 {
        self.0.handoff().filled_next.load(Acquire)
    }

    /// Batches this ring's consumers have taken, over the run.
    #[inline]
    pub fn taken(&self) -> u64 {
        self.0.handoff().taken.load(Relaxed)
    }

    /// The delivery futex's value, loaded (Acquire) before looking for a batch: the `seen` of
    /// [`ConsumerRing::wait_delivery`].
    #[inline]
    pub fn delivery_seen(&self) -> u32 {
        self.0.handoff().deliver_futex.load(Acquire)
    }

    /// Books one batch taken, the consumer's next seq now `next`.
    #[inline]
    pub fn count_taken(&self, next: u64) {
        let b = self.0.handoff();
        b.taken.fetch_add(1, Relaxed);
        b.taken_next.store(next, Relaxed);
    }

    /// Publishes the consumer's next seq (for `pinring status` and a later consumer).
    pub fn set_taken_next(&self, next: u64) {
        self.0.handoff().taken_next.store(next, Relaxed);
    }

    /// Publishes how many of its own buffers hold a batch (a consumer that copies).
    pub fn set_own_held(&self, held: u32) {
        self.0.handoff().own_held.store(held, Relaxed);
    }

    /// The part table's entry for part `part` of batch buffer `i`: the slot the daemon lists
    /// for it (untrusted: check it before use). `None` for a ring whose daemon copies, or a
    /// part past the table's row.
    #[inline]
    pub fn part_slot(&self, i: u32, part: u32) -> Option<u32> {
        self.0.part_slot(i, part).map(|e| e.load(Relaxed))
    }

    /// A snapshot of slot `i`.
    pub fn slot_view(&self, i: u32) -> SlotView {
        self.0.slot_view(i)
    }

    /// Slots the daemon has taken back because their loader held them past the lease, over
    /// the ring's life (the health block's count).
    pub fn leases_expired(&self) -> u64 {
        self.0.health().leases_expired.load(Relaxed)
    }

    /// The whole data area, for a consumer that copies parts out of their slots itself: its
    /// start and length, to register with the backend once. Reads through it only, and of a
    /// slot only while the daemon holds it UPLOADING for a batch this consumer took (the part
    /// table names it).
    pub fn registration_span(&self) -> (*mut u8, usize) {
        (self.0.data_base(), self.0.data_len())
    }

    /// Slot `i`'s first byte, as the source of a consumer's asynchronous copy of a part (within
    /// [`ConsumerRing::registration_span`]). Panics if out of range (caller bug).
    pub fn copy_source(&self, i: u32) -> *const u8 {
        self.0.slot_ptr(i).cast_const()
    }

    /// Host backend: batch buffer `i`'s bytes in the mapping, for the consumer's view of a
    /// batch it took (DLPack); `None` for device buffers or a ring without a handoff. Panics if
    /// `i` is out of range (caller bug).
    pub fn host_buffer_ptr(&self, i: u32) -> Option<*mut u8> {
        self.0.host_buffer_ptr(i)
    }

    /// Rings the daemon's doorbell (a release, a buffer given back).
    pub fn ring_doorbell(&self) {
        self.0.ring_doorbell()
    }

    /// A read-only view of the same ring (what `pinring status` reads, for the consumer's own
    /// status), through a mapping of its own, so this handle hands out no raw layout. Opens the
    /// ring again where this handle found it (its name in /dev/shm, or the anonymous ring's
    /// path): once the daemon has removed that, there is nothing to open (`NotFound`).
    pub fn view(&self) -> Result<RingView, RingError> {
        RingView::open(self.name(), self.0.seg.opened_at(), Duration::ZERO)
    }

    /// Takes FILLED buffer `i` of `round`; returns what its descriptor says it holds (values
    /// unchecked: the caller validates them), or None if it is not FILLED in that round.
    pub fn take_buffer(&self, i: u32, round: u32) -> Option<Filled> {
        self.0.buffer_desc(i).take(round)
    }

    /// Gives TAKEN buffer `i` of `round` back to the daemon; false if it was not TAKEN in that
    /// round (the daemon reclaimed it after this consumer was believed gone).
    pub fn release_buffer(&self, i: u32, round: u32) -> bool {
        self.0.buffer_desc(i).release(round)
    }

    /// Consumer: becomes the ring's one consumer. Takes [`lock::CONSUMER_LOCK`] (held until this
    /// handle drops or the process dies), marks RECLAIMED every buffer a dead predecessor still
    /// held, and records the pid. Fails with `NoHandoff` for a ring that hands nothing over and
    /// with `ConsumerPresent` while another consumer lives.
    pub fn attach_consumer(&self, me: ProcessId) -> Result<(), RingError> {
        let Some(hg) = self.0.geom.handoff else {
            return Err(RingError::NoHandoff {
                name: self.0.name().into(),
            });
        };
        if !lock::try_lock_exclusive(self.0.seg.file(), lock::CONSUMER_LOCK)
            .map_err(|e| self.0.sys("fcntl(F_OFD_SETLK) on the consumer byte", e))?
        {
            return Err(RingError::ConsumerPresent {
                name: self.0.name().into(),
                pid: self.0.handoff().consumer_pid.load(Relaxed),
            });
        }
        let b = self.0.handoff();
        let mut reclaimed = 0;
        for i in 0..hg.buffers {
            reclaimed += u64::from(self.0.buffer_desc(i).reclaim());
        }
        if reclaimed > 0 {
            b.reclaimed.fetch_add(reclaimed, Relaxed);
            self.0.ring_doorbell();
        }
        b.consumer_pid.store(me.pid, Relaxed);
        b.attaches.fetch_add(1, Relaxed);
        Ok(())
    }

    /// Consumer: waits for a fill or a state change, from `seen` (loaded before it looked).
    pub fn wait_delivery(&self, seen: u32, timeout: Duration) -> futex::Wake {
        let b = self.0.handoff();
        futex::wait_counted(&b.deliver_futex, &b.deliver_waiters, seen, timeout)
    }
}
