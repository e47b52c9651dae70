//! A ring: the validated segment plus the protocol operations of each role.
//!
//! Orderings, stated once and referred to at each site:
//! * (A) Creation: every header/descriptor field is written, then `version` is stored with
//!   Release; openers load `version` with Acquire before reading any other field.
//! * (B) Hand-out: the daemon writes `seq` (Relaxed), then stores the slot word FREE with Release;
//!   a loader's successful claim CAS is Acquire, so it reads the seq the daemon wrote.
//! * (C) Commit: the loader writes payload, metadata and lengths, then CASes the word
//!   CLAIMED→READY with Release; the daemon loads the word with Acquire before reading lengths or
//!   bytes, so it sees everything the loader wrote.
//! * (D) Release: the daemon finishes reading a slot (upload complete) before its Release store of
//!   FREE, so a loader that claims it next cannot overwrite bytes still being read.

use crate::clock::{monotonic_ns, unix_ns};
use crate::error::{CommitError, RingError, SlotFault};
use crate::futex;
use crate::layout::*;
use crate::process::ProcessId;
use crate::segment::{object_path, Access, Segment};
use crate::slot::{SlotState, SlotWord, NO_OWNER};
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::time::{Duration, Instant};

/// What the daemon asks for when it creates a ring.
#[derive(Debug, Clone)]
pub struct CreateOptions {
    /// Ring name.
    pub name: String,
    /// Number of slots.
    pub slots: u32,
    /// Bytes per slot (multiple of 4096).
    pub slot_bytes: u64,
    /// File mode of the segment (0600 or 0660).
    pub mode: u32,
    /// Group to own the segment (with mode 0660); `None`: the creator's group.
    pub group: Option<String>,
    /// Fingerprint of the dataset/plan config.
    pub fingerprint: u64,
    /// First seq of the run.
    pub start_seq: u64,
    /// One past the last seq.
    pub end_seq: u64,
    /// Deliver in seq order.
    pub in_order: bool,
}

/// Error code published for a commit whose lengths did not fit the slot.
pub const ERR_TOO_LARGE: u32 = 0xffff_0001;

/// A mapped, validated ring.
#[derive(Debug)]
pub struct Ring {
    seg: Segment,
    geom: Geometry,
}

/// A slot claimed by a loader; only the claimant writes the slot's data until it commits.
#[derive(Debug)]
pub struct Claim {
    /// Slot index.
    pub slot: u32,
    /// Seq of the batch to make.
    pub seq: u64,
    /// Ticket of this round (the commit CAS expects it).
    pub ticket: u32,
    /// Loader-table index of the claimant.
    pub owner: u16,
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

/// A snapshot of one slot, for status views.
#[derive(Debug, Clone, Copy)]
pub struct SlotView {
    /// State (None = garbage).
    pub state: Option<SlotState>,
    /// Seq.
    pub seq: u64,
    /// Owner index.
    pub owner: u16,
    /// Owner pid.
    pub owner_pid: u32,
}

/// A snapshot of one loader-table entry.
#[derive(Debug, Clone, Copy)]
pub struct LoaderView {
    /// Table index.
    pub index: usize,
    /// Pid.
    pub pid: u32,
    /// Start time.
    pub start_time: u64,
    /// Batches committed.
    pub batches: u64,
    /// Payload bytes committed.
    pub bytes: u64,
    /// ns producing.
    pub busy_ns: u64,
    /// ns waiting for a slot.
    pub wait_ns: u64,
    /// Last heartbeat (CLOCK_MONOTONIC ns).
    pub heartbeat_ns: u64,
}

impl Ring {
    // ------------------------------------------------------------------ creation and opening

    /// Creates the ring (daemon). An existing segment of the same name is replaced if its daemon
    /// is dead; refused if a live daemon holds it or if another user owns it.
    pub fn create(opts: &CreateOptions) -> Result<Ring, RingError> {
        let geom = Geometry::new(opts.slots, opts.slot_bytes).ok_or_else(|| {
            RingError::InvalidGeometry {
                name: opts.name.clone(),
                slots: opts.slots,
                slot_bytes: opts.slot_bytes,
                max_slots: MAX_SLOTS,
            }
        })?;
        let gid = opts
            .group
            .as_deref()
            .map(|g| resolve_group(&opts.name, g))
            .transpose()?;
        let seg = match Segment::create(&opts.name, geom.total_bytes, opts.mode, gid)? {
            Some(seg) => seg,
            None => {
                Self::check_stale(&opts.name)?;
                tracing::warn!(ring = %opts.name, path = %object_path(&opts.name).display(),
                    "replacing a stale segment left by a daemon that is no longer running");
                Segment::unlink(&opts.name)?;
                Segment::create(&opts.name, geom.total_bytes, opts.mode, gid)?.ok_or_else(|| {
                    RingError::HeldByLiveDaemon {
                        name: opts.name.clone(),
                        path: object_path(&opts.name),
                        pid: 0,
                    }
                })?
            }
        };
        let ring = Ring { seg, geom };
        ring.initialise(opts);
        Ok(ring)
    }

    /// Decides whether an existing segment may be replaced.
    fn check_stale(name: &str) -> Result<(), RingError> {
        let seg = match Segment::open(name, Access::ReadOnly) {
            Ok(seg) => seg,
            // Vanished meanwhile, or too short to hold a header: nothing live owns it.
            Err(RingError::NotFound { .. }) | Err(RingError::SizeMismatch { .. }) => return Ok(()),
            Err(e) => return Err(e),
        };
        // Another user's segment is never replaced, not even by root: it may be a ring of another
        // service that happens to use the same name.
        let me = nix::unistd::geteuid().as_raw();
        let owner = seg.owner_uid()?;
        if owner != me {
            return Err(RingError::ForeignOwner {
                name: name.to_string(),
                path: object_path(name),
                owner,
                me,
            });
        }
        // SAFETY: the segment is at least HEADER_BYTES long (checked by open), offset 0 is
        // page-aligned, and Header consists of atomics only.
        let h: &Header = unsafe { seg.at(0) };
        if h.magic.load(Relaxed) == MAGIC {
            let daemon = ProcessId {
                pid: h.daemon_pid.load(Relaxed),
                start_time: h.daemon_start_time.load(Relaxed),
            };
            if daemon.is_alive() && h.state.load(Relaxed) != ring_state::CLOSED {
                return Err(RingError::HeldByLiveDaemon {
                    name: name.to_string(),
                    path: object_path(name),
                    pid: daemon.pid,
                });
            }
        }
        Ok(())
    }

    fn initialise(&self, opts: &CreateOptions) {
        let h = self.header();
        let g = &self.geom;
        let me = ProcessId::current();
        // (A): everything below is published by the Release store of `version` at the end.
        h.version.store(0, Relaxed);
        h.magic.store(MAGIC, Relaxed);
        h.header_bytes.store(HEADER_BYTES as u32, Relaxed);
        h.total_bytes.store(g.total_bytes, Relaxed);
        h.slot_count.store(g.slot_count, Relaxed);
        h.desc_bytes.store(DESC_BYTES as u32, Relaxed);
        h.slot_bytes.store(g.slot_bytes, Relaxed);
        h.desc_offset.store(g.desc_offset, Relaxed);
        h.data_offset.store(g.data_offset, Relaxed);
        h.generation.store(draw_generation(), Relaxed);
        h.state.store(ring_state::INIT, Relaxed);
        h.flags.store(
            if opts.in_order {
                header_flags::IN_ORDER
            } else {
                0
            },
            Relaxed,
        );
        h.daemon_pid.store(me.pid, Relaxed);
        h.daemon_start_time.store(me.start_time, Relaxed);
        h.max_loaders.store(MAX_LOADERS as u32, Relaxed);
        h.fingerprint.store(opts.fingerprint, Relaxed);
        h.start_seq.store(opts.start_seq, Relaxed);
        h.end_seq.store(opts.end_seq, Relaxed);
        h.next_assign.store(opts.start_seq, Relaxed);
        h.next_deliver.store(opts.start_seq, Relaxed);
        h.created_unix_ns.store(unix_ns(), Relaxed);
        for i in 0..g.slot_count {
            let d = self.desc(i);
            d.word
                .store(SlotWord::pack(SlotState::Idle, NO_OWNER, 0), Relaxed);
            d.seq.store(u64::MAX, Relaxed);
        }
        h.version.store(LAYOUT_VERSION, Release);
        futex::bump_and_wake_all(&h.work_futex);
    }

    /// Opens an existing ring (loader: read-write; status: read-only) and validates its header
    /// against the file. Waits up to `timeout` for a ring that is still initialising.
    pub fn open(name: &str, access: Access, timeout: Duration) -> Result<Ring, RingError> {
        let start = Instant::now();
        let seg = Segment::open(name, access)?;
        let path = object_path(name);
        // SAFETY: open checked the mapping holds at least HEADER_BYTES; offset 0 is page-aligned;
        // Header is atomics only.
        let h: &Header = unsafe { seg.at(0) };
        let magic = h.magic.load(Relaxed);
        if magic != MAGIC && magic != 0 {
            return Err(RingError::NotARing {
                name: name.into(),
                path,
                found: magic,
            });
        }
        // (A): Acquire pairs with the creator's Release store of the version.
        let mut version = h.version.load(Acquire);
        while version == 0 {
            let left = timeout.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Err(RingError::NotInitialised {
                    name: name.into(),
                    path,
                    waited_ms: start.elapsed().as_millis() as u64,
                });
            }
            futex::wait(&h.version, 0, left.min(Duration::from_millis(20)));
            version = h.version.load(Acquire);
        }
        if h.magic.load(Relaxed) != MAGIC {
            return Err(RingError::NotARing {
                name: name.into(),
                path,
                found: h.magic.load(Relaxed),
            });
        }
        if version != LAYOUT_VERSION {
            return Err(RingError::VersionMismatch {
                name: name.into(),
                path,
                found: version,
                expected: LAYOUT_VERSION,
            });
        }
        let corrupt = |what: String| RingError::CorruptHeader {
            name: name.into(),
            path: object_path(name),
            what,
        };
        let hb = h.header_bytes.load(Relaxed);
        if hb as usize != HEADER_BYTES {
            return Err(corrupt(format!(
                "header_bytes is {hb}, expected {HEADER_BYTES}"
            )));
        }
        let db = h.desc_bytes.load(Relaxed);
        if db as usize != DESC_BYTES {
            return Err(corrupt(format!(
                "desc_bytes is {db}, expected {DESC_BYTES}"
            )));
        }
        let ml = h.max_loaders.load(Relaxed);
        if ml as usize != MAX_LOADERS {
            return Err(corrupt(format!(
                "max_loaders is {ml}, expected {MAX_LOADERS}"
            )));
        }
        let slots = h.slot_count.load(Relaxed);
        let slot_bytes = h.slot_bytes.load(Relaxed);
        let geom = Geometry::new(slots, slot_bytes).ok_or_else(|| {
            corrupt(format!(
                "slot_count {slots} / slot_bytes {slot_bytes} out of range"
            ))
        })?;
        let (desc_offset, data_offset, total) = (
            h.desc_offset.load(Relaxed),
            h.data_offset.load(Relaxed),
            h.total_bytes.load(Relaxed),
        );
        if desc_offset != geom.desc_offset
            || data_offset != geom.data_offset
            || total != geom.total_bytes
        {
            return Err(corrupt(format!(
                "offsets (desc {desc_offset}, data {data_offset}, total {total}) do not match the geometry (desc {}, data {}, total {})",
                geom.desc_offset, geom.data_offset, geom.total_bytes
            )));
        }
        let (s, e) = (h.start_seq.load(Relaxed), h.end_seq.load(Relaxed));
        if s > e {
            return Err(corrupt(format!("start_seq {s} is after end_seq {e}")));
        }
        if seg.len() as u64 != geom.total_bytes {
            return Err(RingError::SizeMismatch {
                name: name.into(),
                path: object_path(name),
                expected: geom.total_bytes,
                actual: seg.len() as u64,
            });
        }
        Ok(Ring { seg, geom })
    }

    /// Waits until the ring is READY (or later). Returns the state seen.
    pub fn wait_ready(&self, timeout: Duration) -> Result<u32, RingError> {
        let start = Instant::now();
        loop {
            let seen = self.header().work_futex.load(Acquire);
            let state = self.state();
            if state != ring_state::INIT {
                return Ok(state);
            }
            let left = timeout.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Err(RingError::NotReady {
                    name: self.name().into(),
                    waited_ms: start.elapsed().as_millis() as u64,
                    state: ring_state::name(state),
                });
            }
            futex::wait(
                &self.header().work_futex,
                seen,
                left.min(Duration::from_millis(100)),
            );
        }
    }

    // ------------------------------------------------------------------ accessors

    /// Ring name.
    pub fn name(&self) -> &str {
        self.seg.name()
    }

    /// The segment.
    pub fn segment(&self) -> &Segment {
        &self.seg
    }

    /// Geometry (validated).
    pub fn geometry(&self) -> Geometry {
        self.geom
    }

    /// The header.
    pub fn header(&self) -> &Header {
        // SAFETY: the mapping is at least HEADER_BYTES (checked at create/open), offset 0 is
        // page-aligned, and Header is atomics only.
        unsafe { self.seg.at(0) }
    }

    /// The daemon's fault-handling counters (in the header page).
    pub fn health(&self) -> &Health {
        // SAFETY: HEALTH_OFFSET + size_of::<Health>() <= LOADER_TABLE_OFFSET < HEADER_BYTES
        // (const-asserted in layout.rs) and the mapping holds at least HEADER_BYTES; the offset
        // is 64-byte aligned; Health is atomics only.
        unsafe { self.seg.at(HEALTH_OFFSET) }
    }

    /// Descriptor of slot `i`. Panics if `i` is out of range (a caller bug, never a shared value:
    /// indices come from this process's own loops).
    pub fn desc(&self, i: u32) -> &SlotDesc {
        assert!(i < self.geom.slot_count, "slot index {i} out of range");
        let off = self.geom.desc_offset as usize + i as usize * DESC_BYTES;
        // SAFETY: i < slot_count, so off + DESC_BYTES <= data_offset <= mapping length (geometry
        // validated against the file size); desc_offset is page-aligned and DESC_BYTES a multiple
        // of 8; SlotDesc is atomics only.
        unsafe { self.seg.at(off) }
    }

    /// Loader-table entry `i`. Panics if out of range (caller bug).
    pub fn loader(&self, i: usize) -> &LoaderEntry {
        assert!(i < MAX_LOADERS, "loader index {i} out of range");
        let off = LOADER_TABLE_OFFSET + i * LOADER_ENTRY_BYTES;
        // SAFETY: the loader table lies inside the header page (const-asserted in layout.rs),
        // entries are 64-byte aligned, and LoaderEntry is atomics only.
        unsafe { self.seg.at(off) }
    }

    /// Current ring state.
    pub fn state(&self) -> u32 {
        self.header().state.load(Acquire)
    }

    /// Sets the ring state and wakes every waiter on both futex words.
    pub fn set_state(&self, state: u32) {
        self.header().state.store(state, Release);
        futex::bump_and_wake_all(&self.header().work_futex);
        futex::bump_and_wake_all(&self.header().doorbell_futex);
    }

    /// Rings the daemon's doorbell (commits, completions): a wake only if a daemon thread sleeps.
    pub fn ring_doorbell(&self) {
        let h = self.header();
        futex::bump_and_wake_counted(&h.doorbell_futex, &h.doorbell_waiters, 1);
    }

    /// The daemon's wait for its doorbell, from `seen` (loaded before it looked for work).
    pub fn wait_doorbell(&self, seen: u32, timeout: Duration) -> futex::Wake {
        let h = self.header();
        futex::wait_counted(&h.doorbell_futex, &h.doorbell_waiters, seen, timeout)
    }

    /// Wakes up to `n` loaders waiting for a free slot (none if none waits).
    pub fn wake_loaders(&self, n: i32) {
        let h = self.header();
        futex::bump_and_wake_counted(&h.work_futex, &h.work_waiters, n);
    }

    /// A loader's wait for a free slot, from `seen` (loaded before it looked for one).
    pub fn wait_for_work(&self, seen: u32, timeout: Duration) -> futex::Wake {
        let h = self.header();
        futex::wait_counted(&h.work_futex, &h.work_waiters, seen, timeout)
    }

    /// Whether batches are delivered in order.
    pub fn in_order(&self) -> bool {
        self.header().flags.load(Relaxed) & header_flags::IN_ORDER != 0
    }

    /// The daemon owning the ring.
    pub fn daemon(&self) -> ProcessId {
        let h = self.header();
        ProcessId {
            pid: h.daemon_pid.load(Relaxed),
            start_time: h.daemon_start_time.load(Relaxed),
        }
    }

    /// Base of the data area (for registration with the GPU).
    pub fn data_base(&self) -> *mut u8 {
        // SAFETY: data_offset <= mapping length (validated geometry), so the pointer stays
        // within (or one past) the mapping.
        unsafe { self.seg.base().add(self.geom.data_offset as usize) }
    }

    /// Bytes of the data area.
    pub fn data_len(&self) -> usize {
        self.geom.data_bytes() as usize
    }

    /// Start of slot `i`'s data. Panics if out of range (caller bug).
    pub fn slot_ptr(&self, i: u32) -> *mut u8 {
        assert!(i < self.geom.slot_count, "slot index {i} out of range");
        // SAFETY: i < slot_count so the slot lies inside the validated data area.
        unsafe {
            self.data_base()
                .add(i as usize * self.geom.slot_bytes as usize)
        }
    }

    /// Checks the segment file still has the size it had at open/create (the daemon must not
    /// upload from pages of a file that was truncated or replaced).
    pub fn check_file(&self) -> Result<(), RingError> {
        if !self.seg.still_named()? {
            return Err(RingError::Replaced {
                name: self.name().into(),
                path: object_path(self.name()),
            });
        }
        let actual = self.seg.file_size()?;
        if actual != self.geom.total_bytes {
            return Err(RingError::SizeMismatch {
                name: self.name().into(),
                path: object_path(self.name()),
                expected: self.geom.total_bytes,
                actual,
            });
        }
        Ok(())
    }

    /// Removes the segment's name (daemon, at exit), unless the name now refers to another
    /// file (a replacement is never removed by the daemon it replaced).
    pub fn unlink(&self) -> Result<(), RingError> {
        self.seg.unlink_if_ours().map(|_| ())
    }

    /// A snapshot of slot `i`.
    pub fn slot_view(&self, i: u32) -> SlotView {
        let d = self.desc(i);
        let w = SlotWord::unpack(d.word.load(Acquire));
        SlotView {
            state: w.state,
            seq: d.seq.load(Relaxed),
            owner: w.owner,
            owner_pid: d.owner_pid.load(Relaxed),
        }
    }

    /// Snapshots of every attached loader.
    pub fn loaders(&self) -> Vec<LoaderView> {
        (0..MAX_LOADERS)
            .filter_map(|i| {
                let e = self.loader(i);
                let pid = e.pid.load(Acquire);
                (pid != 0 && e.state.load(Acquire) == loader_state::ACTIVE).then(|| LoaderView {
                    index: i,
                    pid,
                    start_time: e.start_time.load(Relaxed),
                    batches: e.batches.load(Relaxed),
                    bytes: e.bytes.load(Relaxed),
                    busy_ns: e.busy_ns.load(Relaxed),
                    wait_ns: e.wait_ns.load(Relaxed),
                    heartbeat_ns: e.heartbeat_ns.load(Relaxed),
                })
            })
            .collect()
    }

    // ------------------------------------------------------------------ loader side

    /// Enters this process in the loader table. Returns its index.
    pub fn attach_loader(&self, me: ProcessId) -> Result<u16, RingError> {
        for i in 0..MAX_LOADERS {
            let e = self.loader(i);
            if e.pid.compare_exchange(0, me.pid, AcqRel, Relaxed).is_ok() {
                e.state.store(loader_state::ATTACHING, Relaxed);
                e.start_time.store(me.start_time, Relaxed);
                for c in [&e.batches, &e.busy_ns, &e.wait_ns, &e.bytes, &e.abandoned] {
                    c.store(0, Relaxed);
                }
                e.heartbeat_ns.store(monotonic_ns(), Relaxed);
                // Release: the start time is visible to whoever sees ACTIVE.
                e.state.store(loader_state::ACTIVE, Release);
                return Ok(i as u16);
            }
        }
        Err(RingError::LoaderTableFull {
            name: self.name().into(),
            max: MAX_LOADERS,
        })
    }

    /// Removes a loader from the table (at clean exit).
    pub fn detach_loader(&self, index: u16) {
        let e = self.loader(index as usize);
        e.state.store(loader_state::EMPTY, Release);
        e.pid.store(0, Release);
    }

    /// Tries to claim one FREE slot, scanning from `hint`. One CAS per candidate.
    pub fn try_claim(&self, owner: u16, hint: u32) -> Option<Claim> {
        let n = self.geom.slot_count;
        for k in 0..n {
            let i = (hint + k) % n;
            let d = self.desc(i);
            let w = SlotWord::unpack(d.word.load(Relaxed));
            if w.state != Some(SlotState::Free) {
                continue;
            }
            let claimed = SlotWord::pack(SlotState::Claimed, owner, w.ticket);
            // (B): Acquire pairs with the daemon's Release store of FREE: the seq is visible.
            if d.word
                .compare_exchange(w.raw, claimed, Acquire, Relaxed)
                .is_ok()
            {
                d.owner_pid.store(std::process::id(), Relaxed);
                d.claim_ns.store(monotonic_ns(), Relaxed);
                return Some(Claim {
                    slot: i,
                    seq: d.seq.load(Relaxed),
                    ticket: w.ticket,
                    owner,
                });
            }
        }
        None
    }

    /// The claimed slot's bytes, for the claimant to fill.
    pub fn claim_buffer<'a>(&'a self, claim: &'a mut Claim) -> &'a mut [u8] {
        let ptr = self.slot_ptr(claim.slot);
        // SAFETY: the slot lies inside the validated data area (slot_ptr checks the index) and
        // is slot_bytes long. The protocol gives the claimant sole write access to the slot
        // while it is CLAIMED: the daemon reads it only after READY, and other loaders' claim
        // CAS fails. `&mut Claim` keeps this process from taking two views of one claim. A rogue
        // process breaking the protocol can change byte values only, and every u8 is valid.
        unsafe { std::slice::from_raw_parts_mut(ptr, self.geom.slot_bytes as usize) }
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
        let slot_bytes = self.geom.slot_bytes;
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
        let d = self.desc(claim.slot);
        d.payload_len.store(payload_len, Relaxed);
        d.meta_len.store(meta_len as u32, Relaxed);
        d.sample_count.store(sample_count, Relaxed);
        d.error.store(error, Relaxed);
        d.commit_ns.store(monotonic_ns(), Relaxed);
        let expected = SlotWord::pack(SlotState::Claimed, claim.owner, claim.ticket);
        let ready = SlotWord::pack(SlotState::Ready, claim.owner, claim.ticket);
        // (C): Release publishes the payload, metadata and lengths written above.
        match d.word.compare_exchange(expected, ready, Release, Relaxed) {
            Ok(_) => {
                let h = self.header();
                h.committed.fetch_add(1, Relaxed);
                h.bytes_committed.fetch_add(payload_len, Relaxed);
                futex::bump_and_wake_counted(&h.doorbell_futex, &h.doorbell_waiters, 1);
                too_large.map_or(Ok(()), Err)
            }
            Err(_) => Err(CommitError::Reclaimed {
                slot: claim.slot,
                seq: claim.seq,
            }),
        }
    }

    // ------------------------------------------------------------------ daemon side

    /// Hands slot `i` out for `seq` (from IDLE or UPLOADING). Returns the new ticket.
    pub fn assign(&self, i: u32, seq: u64) -> u32 {
        let d = self.desc(i);
        let ticket = SlotWord::unpack(d.word.load(Relaxed))
            .ticket
            .wrapping_add(1);
        d.seq.store(seq, Relaxed);
        d.payload_len.store(0, Relaxed);
        d.meta_len.store(0, Relaxed);
        d.error.store(0, Relaxed);
        d.owner_pid.store(0, Relaxed);
        d.free_ns.store(monotonic_ns(), Relaxed);
        // (B)/(D): Release publishes the seq, and orders every read of the slot's previous
        // contents (the upload finished before this call) before a loader may overwrite it.
        d.word
            .store(SlotWord::pack(SlotState::Free, NO_OWNER, ticket), Release);
        ticket
    }

    /// Parks slot `i` with no work (end of plan, or draining).
    pub fn park(&self, i: u32) {
        let d = self.desc(i);
        let ticket = SlotWord::unpack(d.word.load(Relaxed))
            .ticket
            .wrapping_add(1);
        d.seq.store(u64::MAX, Relaxed);
        d.word
            .store(SlotWord::pack(SlotState::Idle, NO_OWNER, ticket), Release);
    }

    /// Takes a FREE slot back so no loader claims it (draining). True if it was FREE.
    pub fn unassign_if_free(&self, i: u32) -> bool {
        let d = self.desc(i);
        let w = SlotWord::unpack(d.word.load(Acquire));
        if w.state != Some(SlotState::Free) {
            return false;
        }
        let idle = SlotWord::pack(SlotState::Idle, NO_OWNER, w.ticket.wrapping_add(1));
        d.word
            .compare_exchange(w.raw, idle, AcqRel, Relaxed)
            .is_ok()
    }

    /// If slot `i` is READY, validates its descriptor against the seq the daemon assigned and
    /// takes it (READY → UPLOADING). `Ok(None)`: not ready yet.
    pub fn take_ready(&self, i: u32, assigned_seq: u64) -> Result<Option<Taken>, SlotFault> {
        let d = self.desc(i);
        // (C): Acquire pairs with the loader's Release commit.
        let w = SlotWord::unpack(d.word.load(Acquire));
        if w.state != Some(SlotState::Ready) {
            return Ok(None);
        }
        let seq = d.seq.load(Relaxed);
        let payload_len = d.payload_len.load(Relaxed);
        let meta_len = u64::from(d.meta_len.load(Relaxed));
        let error = d.error.load(Relaxed);
        let slot_bytes = self.geom.slot_bytes;
        // Whatever the outcome, the slot now belongs to the daemon.
        let uploading = SlotWord::pack(SlotState::Uploading, w.owner, w.ticket);
        if d.word
            .compare_exchange(w.raw, uploading, AcqRel, Relaxed)
            .is_err()
        {
            return Err(SlotFault::Raced {
                slot: i,
                raw: w.raw,
            });
        }
        if seq != assigned_seq {
            return Err(SlotFault::WrongSeq {
                slot: i,
                expected: assigned_seq,
                found: seq,
            });
        }
        if error != 0 {
            return Err(SlotFault::LoaderError {
                slot: i,
                seq,
                code: error,
            });
        }
        let Some(meta_offset) = fit_in_slot(payload_len, meta_len, slot_bytes) else {
            return Err(SlotFault::BadLength {
                slot: i,
                seq,
                payload: payload_len,
                meta: meta_len,
                slot_bytes,
            });
        };
        Ok(Some(Taken {
            slot: i,
            seq,
            payload_len,
            meta_offset,
            meta_len,
            sample_count: d.sample_count.load(Relaxed),
            owner: w.owner,
            commit_ns: d.commit_ns.load(Relaxed),
        }))
    }

    /// Bytes `[offset, offset+len)` of slot `i` (a taken slot's metadata or payload).
    pub fn slot_bytes(&self, i: u32, offset: u64, len: u64) -> &[u8] {
        let sb = self.geom.slot_bytes;
        assert!(offset <= sb && len <= sb - offset, "range outside slot {i}");
        // SAFETY: offset <= slot_bytes (asserted above), so the pointer stays inside slot i.
        let start = unsafe { self.slot_ptr(i).add(offset as usize) };
        // SAFETY: the range lies inside slot i (asserted above), inside the validated data area.
        // The daemon reads a slot only while it is UPLOADING (it owns it); a rogue writer can
        // only change byte values, and every u8 is valid.
        unsafe { std::slice::from_raw_parts(start, len as usize) }
    }

    /// If slot `i` is CLAIMED by a loader that is no longer running, puts it back to FREE with
    /// the same seq (a new ticket, so the dead owner's commit could never land). Returns the
    /// reclaimed seq.
    pub fn reclaim_if_owner_dead(&self, i: u32) -> Option<u64> {
        let d = self.desc(i);
        let w = SlotWord::unpack(d.word.load(Acquire));
        if w.state != Some(SlotState::Claimed) {
            return None;
        }
        let alive = (w.owner as usize) < MAX_LOADERS && {
            let e = self.loader(w.owner as usize);
            ProcessId {
                pid: e.pid.load(Acquire),
                start_time: e.start_time.load(Relaxed),
            }
            .is_alive()
        };
        if alive {
            return None;
        }
        let seq = d.seq.load(Relaxed);
        let free = SlotWord::pack(SlotState::Free, NO_OWNER, w.ticket.wrapping_add(1));
        if d.word
            .compare_exchange(w.raw, free, AcqRel, Relaxed)
            .is_ok()
        {
            self.header().reclaimed.fetch_add(1, Relaxed);
            Some(seq)
        } else {
            None
        }
    }

    /// Clears loader-table entries whose process is gone (it died without detaching).
    pub fn reap_dead_loaders(&self) -> usize {
        let mut n = 0;
        for i in 0..MAX_LOADERS {
            let e = self.loader(i);
            let pid = e.pid.load(Acquire);
            if pid == 0 || e.state.load(Acquire) != loader_state::ACTIVE {
                continue;
            }
            let id = ProcessId {
                pid,
                start_time: e.start_time.load(Relaxed),
            };
            if !id.is_alive() {
                e.state.store(loader_state::EMPTY, Release);
                let _ = e.pid.compare_exchange(pid, 0, AcqRel, Relaxed);
                n += 1;
            }
        }
        n
    }
}

/// Where the metadata of a batch with these lengths starts, if payload and metadata both fit in a
/// slot of `slot_bytes`; `None` if any byte would lie outside the slot (or a sum overflows). The
/// one check that keeps every read of a committed slot inside it.
pub fn fit_in_slot(payload_len: u64, meta_len: u64, slot_bytes: u64) -> Option<u64> {
    let meta_offset = align_up(payload_len, META_ALIGN)?;
    let end = meta_offset.checked_add(meta_len)?;
    (payload_len <= slot_bytes && end <= slot_bytes).then_some(meta_offset)
}

fn resolve_group(ring: &str, group: &str) -> Result<u32, RingError> {
    match nix::unistd::Group::from_name(group) {
        Ok(Some(g)) => Ok(g.gid.as_raw()),
        _ => Err(RingError::UnknownGroup {
            name: ring.to_string(),
            group: group.to_string(),
        }),
    }
}

fn draw_generation() -> u64 {
    // Unique enough per daemon start: wall clock, pid and a monotonic reading, mixed.
    let mut x = unix_ns() ^ (u64::from(std::process::id()) << 32) ^ monotonic_ns().rotate_left(17);
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x.max(1)
}
