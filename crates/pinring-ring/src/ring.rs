//! A ring: the validated segment plus the protocol operations of each role.
//!
//! Orderings: (A) creation: every header/descriptor field is written, then `version` is stored
//! with Release; openers load `version` with Acquire before reading any other field. The slot
//! transitions themselves, with orderings (B) to (D), are [`SlotDesc`]'s methods in
//! [`crate::slot`]; this module finds the descriptor, asks the kernel what they need to know
//! (whether a claimant lives), and keeps the counters and wake-ups around them.

use crate::clock::{monotonic_ns, unix_ns};
use crate::error::RingError;
use crate::futex;
use crate::handoff::{BufferDesc, HandoffBlock, HandoffSpec, HANDOFF_OFFSET};
use crate::layout::*;
use crate::lock;
use crate::process::ProcessId;
use crate::segment::{object_path, Access, Segment};
pub use crate::slot::{fit_in_slot, Seat, Taken};
use crate::slot::{SlotState, SlotWord};
use crate::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use crate::sync::atomic::{AtomicU32, AtomicU64};
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
    /// The settings record beside it ([`crate::layout::Settings`]; all zero: none).
    pub settings: [u64; crate::layout::SETTINGS_WORDS],
    /// First seq of the run.
    pub start_seq: u64,
    /// One past the last seq.
    pub end_seq: u64,
    /// Deliver in seq order.
    pub in_order: bool,
    /// Replace whatever file is at the ring's path if it is not a live daemon's ring (another
    /// user's file is refused even then).
    pub replace: bool,
    /// Hand whole batches to a consumer through a handoff area (`None`: the daemon's own sink
    /// takes every batch).
    pub handoff: Option<HandoffSpec>,
    /// Make the segment anonymous ([`Segment::create_anonymous`]: a memfd, never named in
    /// /dev/shm, gone with the last process that holds it); `mode`, `group` and `replace` do
    /// not apply.
    pub anonymous: bool,
}

/// Error code published for a commit whose lengths did not fit the slot.
pub const ERR_TOO_LARGE: u32 = 0xffff_0001;

/// A mapped, validated ring.
#[derive(Debug)]
pub struct Ring {
    pub(crate) seg: Segment,
    pub(crate) geom: Geometry,
    /// The creator's record of its header (None for openers).
    pub(crate) seal: Option<std::sync::Mutex<HeaderSeal>>,
    /// The loader seat this handle holds, if any: locks belong to the open file description, so
    /// one handle can hold one seat (a second would re-take its own locks and share an entry).
    pub(crate) seat: std::sync::Mutex<Option<Seat>>,
    /// Waiters on the doorbell that only this handle's [`Ring::ring_doorbell`] wakes, not a
    /// loader's commit ([`DaemonRing::wait_doorbell_quiet`]); in this process's memory, not the
    /// segment's.
    pub(crate) quiet_waiters: crate::sync::atomic::AtomicU32,
}

/// The daemon's handle on its ring, made only by [`DaemonRing::create`]: the one role that
/// hands slots out, takes committed ones, frees and takes them back, changes the ring's state,
/// reaps dead loaders and consumers, and removes the ring's name. Like the other roles it does
/// not dereference to [`Ring`]: what it reads comes as values, and what it publishes (the
/// header's counters, the health block's gauges) goes through named methods
/// (`daemon_role.rs`), so no field is written by hand outside this crate:
///
/// ```compile_fail,E0599
/// fn close_by_hand(ring: &pinring_ring::DaemonRing) {
///     use std::sync::atomic::Ordering::Release;
///     ring.header().state.store(pinring_ring::ring_state::CLOSED, Release); // set_state only
/// }
/// ```
///
/// ```compile_fail,E0599
/// fn forge_a_word(ring: &pinring_ring::DaemonRing) {
///     ring.desc(0).word.store(0, std::sync::atomic::Ordering::Relaxed); // assign, take_ready, ...
/// }
/// ```
///
/// ```compile_fail,E0599
/// fn bump(ring: &pinring_ring::DaemonRing) {
///     ring.health().quarantined.store(0, std::sync::atomic::Ordering::Relaxed); // publish_quarantine
/// }
/// ```
///
/// ```compile_fail,E0599
/// fn raw_data(ring: &pinring_ring::DaemonRing) -> *mut u8 {
///     ring.data_base() // registration_span and upload_source only
/// }
/// ```
///
/// What it may do compiles:
///
/// ```
/// fn publish(ring: &pinring_ring::DaemonRing) {
///     ring.publish_resume_seq(17);
///     ring.add_deliveries(1, 4096, 1000);
/// }
/// ```
#[derive(Debug)]
pub struct DaemonRing(pub(crate) Ring);

/// A loader's handle: takes a seat in the loader table, claims FREE slots, writes a claimed
/// slot and commits it, and abandons a claim taken back. It cannot hand out, take, free or
/// take back a slot, nor change the ring's state: those are [`DaemonRing`]'s, and the compiler
/// refuses them here:
///
/// ```compile_fail,E0599
/// fn free_a_slot(ring: &pinring_ring::LoaderRing) {
///     ring.assign(0, 1); // only the daemon hands slots out
/// }
/// ```
///
/// ```compile_fail,E0599
/// fn close(ring: &pinring_ring::LoaderRing) {
///     ring.set_state(pinring_ring::ring_state::CLOSED); // only the daemon ends a run
/// }
/// ```
///
/// ```compile_fail,E0624
/// fn free_through_the_descriptor(ring: &pinring_ring::LoaderRing) {
///     ring.desc(0).assign(1, 0); // the slot transitions are the role handles' only
/// }
/// ```
///
/// Nor can it write the ring's memory outside its claimed slot and its own counters: it has no
/// header, no descriptor, no loader-table entry and no raw pointer into the data area to write
/// through:
///
/// ```compile_fail,E0599
/// fn close_by_hand(ring: &pinring_ring::LoaderRing) {
///     use std::sync::atomic::Ordering::Release;
///     ring.header().state.store(pinring_ring::ring_state::CLOSED, Release); // the daemon's field
/// }
/// ```
///
/// ```compile_fail,E0599
/// fn forge_a_word(ring: &pinring_ring::LoaderRing) {
///     ring.desc(0).word.store(0, std::sync::atomic::Ordering::Relaxed); // the slot's state word
/// }
/// ```
///
/// ```compile_fail,E0599
/// fn bump_another(ring: &pinring_ring::LoaderRing) {
///     ring.loader(3).batches.fetch_add(1, std::sync::atomic::Ordering::Relaxed); // not its entry
/// }
/// ```
///
/// ```compile_fail,E0599
/// fn raw_data(ring: &pinring_ring::LoaderRing) -> *mut u8 {
///     ring.data_base() // slot bytes come out only through a claim's SlotWriter
/// }
/// ```
///
/// ```compile_fail,E0599
/// fn raw_slot(ring: &pinring_ring::LoaderRing) -> *mut u8 {
///     ring.slot_ptr(0)
/// }
/// ```
///
/// And it is made only by [`LoaderRing::join`], which checks admission, never from any opened
/// ring:
///
/// ```compile_fail,E0277
/// fn take_the_role(ring: pinring_ring::Ring) -> pinring_ring::LoaderRing {
///     pinring_ring::LoaderRing::from(ring)
/// }
/// ```
///
/// What it may do compiles:
///
/// ```
/// fn claim_one(ring: &pinring_ring::LoaderRing, seat: pinring_ring::Seat) -> Option<u32> {
///     ring.try_claim(seat, 0).map(|c| c.slot())
/// }
/// ```
///
/// ```
/// fn fill_and_commit(ring: &pinring_ring::LoaderRing, mut claim: pinring_ring::Claim) {
///     let mut w = ring.slot_writer(&mut claim);
///     w.write(0, b"part").unwrap();
///     let _ = ring.commit(claim, 4, 0, 1, 0);
/// }
/// ```
#[derive(Debug)]
pub struct LoaderRing(pub(crate) Ring);

/// The consumer's handle (a trainer attached to a daemon's ring): becomes the ring's one
/// consumer and waits for batches; the buffers it takes and releases are the handoff's. Neither
/// a slot's nor a loader's transitions are its:
///
/// ```compile_fail,E0599
/// fn claim(ring: &pinring_ring::ConsumerRing, seat: pinring_ring::Seat) {
///     ring.try_claim(seat, 0);
/// }
/// ```
///
/// ```compile_fail,E0599
/// fn hand_over(ring: &pinring_ring::ConsumerRing, f: &pinring_ring::handoff::Filled) {
///     ring.fill_buffer(0, f); // only the daemon fills a batch buffer
/// }
/// ```
///
/// Nor can it write the ring's memory beyond its buffers' transitions and its own handoff
/// fields, which it changes through named methods: it has no descriptor, header or handoff
/// block to write through.
///
/// ```compile_fail,E0599
/// fn forge_a_word(ring: &pinring_ring::ConsumerRing) {
///     ring.desc(0).word.store(0, std::sync::atomic::Ordering::Relaxed); // a slot's word
/// }
/// ```
///
/// ```compile_fail,E0599
/// fn reset_the_count(ring: &pinring_ring::ConsumerRing) {
///     ring.handoff().taken.store(0, std::sync::atomic::Ordering::Relaxed); // count_taken only
/// }
/// ```
///
/// ```compile_fail,E0599
/// fn close_by_hand(ring: &pinring_ring::ConsumerRing) {
///     use std::sync::atomic::Ordering::Release;
///     ring.header().state.store(pinring_ring::ring_state::CLOSED, Release);
/// }
/// ```
///
/// It is made only by [`ConsumerRing::attach`], which checks admission and that the ring hands
/// batches over:
///
/// ```compile_fail,E0277
/// fn take_the_role(ring: pinring_ring::Ring) -> pinring_ring::ConsumerRing {
///     pinring_ring::ConsumerRing::from(ring)
/// }
/// ```
///
/// ```compile_fail,E0624
/// fn release_for_it(ring: &pinring_ring::LoaderRing) {
///     ring.buffer_desc(0).release(1); // a buffer's transitions are the role handles' only
/// }
/// ```
#[derive(Debug)]
pub struct ConsumerRing(pub(crate) Ring);

/// A read-only view (`pinring status`, the metrics): the segment mapped read-only, so no write
/// through it can reach the ring, and none of the roles' calls. It reads the ring as a
/// [`RingView::snapshot`] of plain values (header counters, health, loader table, slot states,
/// handoff), and has no header, block or descriptor to write through:
///
/// ```compile_fail,E0599
/// fn bump(view: &pinring_ring::RingView) {
///     view.header().committed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
/// }
/// ```
///
/// ```compile_fail,E0599
/// fn scribble(view: &pinring_ring::RingView) {
///     view.health().quarantined.store(0, std::sync::atomic::Ordering::Relaxed);
/// }
/// ```
///
/// What it reads compiles:
///
/// ```
/// fn delivered(view: &pinring_ring::RingView) -> (u64, usize) {
///     let s = view.snapshot();
///     (s.header.delivered, s.loaders.len())
/// }
/// ```
///
/// No handle gives out a general raw pointer into the data area (each role has only its
/// narrowly named ones: the daemon's
/// `registration_span` and `upload_source`, the consumer's `host_buffer_ptr`,
/// `registration_span` and `copy_source`, the loader's claim's `SlotWriter`):
///
/// ```compile_fail,E0599
/// fn raw_data(view: &pinring_ring::RingView) -> *mut u8 {
///     view.data_base()
/// }
/// ```
///
/// ```compile_fail,E0599
/// fn raw_slot(view: &pinring_ring::RingView) -> *mut u8 {
///     view.slot_ptr(0)
/// }
/// ```
#[derive(Debug)]
pub struct RingView(pub(crate) Ring);

impl RingView {
    /// Opens ring `name` read-only ([`Access::ReadOnly`]), where it is named in /dev/shm or, with
    /// `at`, where its daemon holds an anonymous one; waits up to `timeout` for one still being
    /// created.
    pub fn open(
        name: &str,
        at: Option<&std::path::Path>,
        timeout: Duration,
    ) -> Result<RingView, RingError> {
        Ring::open_at(name, at, Access::ReadOnly, timeout).map(RingView)
    }

    /// What `pinring status`, the metrics and the tests read of the ring, copied out as plain
    /// values.
    pub fn snapshot(&self) -> crate::snapshot::RingSnapshot {
        self.0.snapshot()
    }
}

/// The header fields a daemon wrote and expects to find unchanged (its own record, in private
/// memory), so that a write by another process is noticed and undone.
#[derive(Debug, Clone)]
pub(crate) struct HeaderSeal {
    pub(crate) words64: [u64; 15],
    pub(crate) words32: [u32; 13],
    pub(crate) state: u32,
}

/// The header fields only the daemon writes, which it watches for changes by others.
pub(crate) type SealedFields<'a> = (
    [(&'static str, &'a AtomicU64); 15],
    [(&'static str, &'a AtomicU32); 13],
);

pub(crate) fn sealed_fields<'a>(h: &'a Header, b: &'a HandoffBlock) -> SealedFields<'a> {
    (
        [
            ("magic", &h.magic),
            ("total_bytes", &h.total_bytes),
            ("slot_bytes", &h.slot_bytes),
            ("desc_offset", &h.desc_offset),
            ("data_offset", &h.data_offset),
            ("generation", &h.generation),
            ("daemon_start_time", &h.daemon_start_time),
            ("fingerprint", &h.fingerprint),
            ("start_seq", &h.start_seq),
            ("end_seq", &h.end_seq),
            ("handoff.area_offset", &b.area_offset),
            ("handoff.area_bytes", &b.area_bytes),
            ("handoff.buffer_bytes", &b.buffer_bytes),
            ("handoff.spec_offset", &b.spec_offset),
            ("handoff.host_offset", &b.host_offset),
        ],
        [
            ("version", &h.version),
            ("header_bytes", &h.header_bytes),
            ("slot_count", &h.slot_count),
            ("desc_bytes", &h.desc_bytes),
            ("flags", &h.flags),
            ("daemon_pid", &h.daemon_pid),
            ("max_loaders", &h.max_loaders),
            ("handoff.buffers", &b.buffers),
            ("handoff.desc_bytes", &b.desc_bytes),
            ("handoff.spec_len", &b.spec_len),
            ("handoff.backend", &b.backend),
            ("handoff.device", &b.device),
            ("handoff.part_slots", &b.part_slots),
        ],
    )
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
    /// The loader's error code (0: none; meaningful in READY).
    pub error: u32,
}

/// A snapshot of one loader-table entry.
#[derive(Debug, Clone, Copy)]
pub struct LoaderView {
    /// Table index.
    pub index: usize,
    /// Pid (in the loader's own PID namespace).
    pub pid: u32,
    /// Whether it is still attached (its entry lock is held).
    pub alive: bool,
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

    /// Creates the ring (daemon). The segment is built unnamed and locked, then published under
    /// its name ([`Segment::publish`]): a file already there is replaced only if no daemon holds
    /// it and it is a ring of this layout (or `replace` is set); a live daemon's ring, another
    /// user's file, or (without `replace`) anything that is not a stale ring, is refused.
    pub(crate) fn create(opts: &CreateOptions) -> Result<Ring, RingError> {
        let invalid = || RingError::InvalidGeometry {
            name: opts.name.clone(),
            slots: opts.slots,
            slot_bytes: opts.slot_bytes,
            max_slots: MAX_SLOTS,
        };
        let mut geom = Geometry::new(opts.slots, opts.slot_bytes).ok_or_else(invalid)?;
        if let Some(h) = &opts.handoff {
            geom = geom
                .with_handoff(
                    h.buffers,
                    h.buffer_bytes,
                    h.spec.len() as u64,
                    h.host,
                    h.part_slots,
                )
                .ok_or_else(|| RingError::InvalidHandoff {
                    name: opts.name.clone(),
                    buffers: h.buffers,
                    buffer_bytes: h.buffer_bytes,
                    spec_len: h.spec.len() as u64,
                })?;
        }
        let gid = opts
            .group
            .as_deref()
            .map(|g| resolve_group(&opts.name, g))
            .transpose()?;
        let seg = if opts.anonymous {
            Segment::create_anonymous(&opts.name, geom.total_bytes)?
        } else {
            Segment::create_unnamed(&opts.name, geom.total_bytes, opts.mode, gid)?
        };
        let mut ring = Ring {
            seg,
            geom,
            seal: None,
            seat: std::sync::Mutex::new(None),
            quiet_waiters: crate::sync::atomic::AtomicU32::new(0),
        };
        ring.initialise(opts);
        if opts.anonymous {
            return Ok(ring);
        }
        let replaced = ring.seg.publish(opts.replace)?;
        if let Some(what) = replaced {
            tracing::warn!(ring = %opts.name, path = %object_path(&opts.name).display(),
                "replaced {what}");
        }
        Ok(ring)
    }

    /// Whether a live daemon holds this ring: the kernel's word (its lock), never a header field.
    /// Always false when asked through the daemon's own handle.
    pub fn daemon_alive(&self) -> Result<bool, RingError> {
        lock::holder(self.seg.file(), lock::DAEMON_LOCK)
            .map(|h| h == lock::Holder::Writer)
            .map_err(|e| self.sys("fcntl(F_OFD_GETLK) on the daemon byte", e))
    }

    /// Whether this handle may take a writing role (`role`, for the message): opened
    /// read-write, and this process admitted to the ring ([`check_admitted`]).
    pub(crate) fn admit(&self, role: &'static str) -> Result<(), RingError> {
        if self.seg.access() != Access::ReadWrite {
            return Err(RingError::ReadOnlyRole {
                name: self.name().into(),
                role,
            });
        }
        check_admitted(&self.seg)
    }

    /// The fingerprint of the daemon's dataset and plan config.
    pub fn fingerprint(&self) -> u64 {
        self.header().fingerprint.load(Relaxed)
    }

    /// One past the run's last seq.
    pub fn end_seq(&self) -> u64 {
        self.header().end_seq.load(Relaxed)
    }

    /// The run's first seq.
    pub fn start_seq(&self) -> u64 {
        self.header().start_seq.load(Relaxed)
    }

    pub(crate) fn sys(&self, call: &'static str, source: nix::Error) -> RingError {
        RingError::Sys {
            name: self.name().to_string(),
            path: self.seg.path(),
            call,
            source,
        }
    }

    fn initialise(&mut self, opts: &CreateOptions) {
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
        for (w, &v) in self.settings().words.iter().zip(&opts.settings) {
            w.store(v, Relaxed);
        }
        h.start_seq.store(opts.start_seq, Relaxed);
        h.end_seq.store(opts.end_seq, Relaxed);
        h.next_assign.store(opts.start_seq, Relaxed);
        h.next_deliver.store(opts.start_seq, Relaxed);
        h.created_unix_ns.store(unix_ns(), Relaxed);
        for i in 0..g.slot_count {
            let d = self.desc(i);
            d.word.store(SlotWord::pack(SlotState::Idle, 0), Relaxed);
            d.seq.store(u64::MAX, Relaxed);
        }
        if let (Some(spec), Some(hg)) = (&opts.handoff, g.handoff) {
            let b = self.handoff();
            b.area_offset.store(hg.area_offset, Relaxed);
            b.area_bytes.store(hg.area_bytes, Relaxed);
            b.buffers.store(hg.buffers, Relaxed);
            b.desc_bytes
                .store(crate::handoff::BUFFER_DESC_BYTES as u32, Relaxed);
            b.buffer_bytes.store(hg.buffer_bytes, Relaxed);
            b.spec_offset.store(hg.spec_offset, Relaxed);
            b.spec_len.store(hg.spec_len as u32, Relaxed);
            b.backend.store(
                if spec.host {
                    crate::handoff::backend_code::HOST
                } else {
                    crate::handoff::backend_code::CUDA
                },
                Relaxed,
            );
            b.host_offset.store(hg.host_offset, Relaxed);
            b.device.store(spec.device, Relaxed);
            b.part_slots.store(hg.part_slots, Relaxed);
            b.taken_next.store(opts.start_seq, Relaxed);
            b.filled_next.store(opts.start_seq, Relaxed);
            // SAFETY: spec_offset lies inside the handoff area, inside the mapping (the
            // geometry sized the file), so the pointer stays in bounds.
            let dst = unsafe { self.seg.base().add(hg.spec_offset as usize) };
            // SAFETY: [dst, +len) is the config range of the area, private to this process (the
            // segment has no name yet, so this plain write races with nothing), and the source
            // is a distinct heap buffer of that length.
            unsafe { std::ptr::copy_nonoverlapping(spec.spec.as_ptr(), dst, spec.spec.len()) };
        }
        h.version.store(LAYOUT_VERSION, Release);
        // Openers wait on the version word (they cannot, in practice: the segment gets its name
        // only after this, see `Segment::publish`; a scribbled version sends them here too).
        futex::wake_all(&h.version);
        futex::bump_and_wake_all(&h.work_futex);
        self.seal = Some(std::sync::Mutex::new(self.make_seal()));
    }

    fn make_seal(&self) -> HeaderSeal {
        let (f64s, f32s) = sealed_fields(self.header(), self.handoff());
        HeaderSeal {
            words64: f64s.map(|(_, f)| f.load(Relaxed)),
            words32: f32s.map(|(_, f)| f.load(Relaxed)),
            state: self.header().state.load(Relaxed),
        }
    }

    /// Opens an existing ring (loader: read-write; status: read-only) and validates its header
    /// against the file. Waits up to `timeout` for a ring that is still initialising.
    pub fn open(name: &str, access: Access, timeout: Duration) -> Result<Ring, RingError> {
        Ring::open_at(name, None, access, timeout)
    }

    /// [`Ring::open`]; with `at`, the anonymous ring there ([`Segment::open_at`]) instead of
    /// the one named in /dev/shm.
    pub fn open_at(
        name: &str,
        at: Option<&std::path::Path>,
        access: Access,
        timeout: Duration,
    ) -> Result<Ring, RingError> {
        let start = Instant::now();
        let seg = match at {
            Some(path) => Segment::open_at(name, path, access)?,
            None => Segment::open(name, access)?,
        };
        let path = seg.path();
        // SAFETY: open checked the mapping holds at least HEADER_BYTES; offset 0 is page-aligned;
        // Header is atomics only.
        let h: &Header = unsafe { seg.at(0) };
        wait_for_layout(h, name, &path, timeout, start)?;
        let corrupt = |what: String| RingError::CorruptHeader {
            name: name.into(),
            path: path.clone(),
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
        let mut geom = Geometry::new(slots, slot_bytes).ok_or_else(|| {
            corrupt(format!(
                "slot_count {slots} / slot_bytes {slot_bytes} out of range"
            ))
        })?;
        // SAFETY: the handoff block lies inside the header page (const-asserted in handoff.rs),
        // which open checked the mapping holds; it is 64-byte aligned and atomics only.
        let hb: &HandoffBlock = unsafe { seg.at(HANDOFF_OFFSET) };
        if hb.area_offset.load(Relaxed) != 0 {
            geom = with_handoff(hb, geom, &corrupt)?;
        }
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
                path: path.clone(),
                expected: geom.total_bytes,
                actual: seg.len() as u64,
            });
        }
        if access == Access::ReadWrite {
            check_admitted(&seg)?;
        }
        Ok(Ring {
            seg,
            geom,
            seal: None,
            seat: std::sync::Mutex::new(None),
            quiet_waiters: crate::sync::atomic::AtomicU32::new(0),
        })
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

    /// The settings record (in the header page; all zero where the creator wrote none).
    pub fn settings(&self) -> &crate::layout::Settings {
        // SAFETY: SETTINGS_OFFSET + size_of::<Settings>() <= LOADER_TABLE_OFFSET < HEADER_BYTES
        // (const-asserted in layout.rs) and the mapping holds at least HEADER_BYTES; the offset
        // is 64-byte aligned; Settings is atomics only.
        unsafe { self.seg.at(crate::layout::SETTINGS_OFFSET) }
    }

    /// A copy of the settings record's words (untrusted values: for messages only).
    pub fn settings_record(&self) -> [u64; crate::layout::SETTINGS_WORDS] {
        std::array::from_fn(|i| self.settings().words[i].load(Relaxed))
    }

    /// The handoff control block (in the header page; all zero for a ring without a handoff).
    pub fn handoff(&self) -> &HandoffBlock {
        // SAFETY: the block lies inside the header page (const-asserted in handoff.rs) and the
        // mapping holds at least HEADER_BYTES; the offset is 64-byte aligned; atomics only.
        unsafe { self.seg.at(HANDOFF_OFFSET) }
    }

    /// Descriptor of batch buffer `i`. Panics if the ring has no handoff or `i` is out of range
    /// (a caller bug: indices come from this process's own loops over the validated count).
    pub fn buffer_desc(&self, i: u32) -> &BufferDesc {
        let hg = self.geom.handoff.expect("the ring has a handoff area");
        assert!(i < hg.buffers, "buffer index {i} out of range");
        // SAFETY: the descriptor lies inside the handoff area, inside the mapping (geometry
        // validated against the file size); the area is page aligned and descriptors are 256
        // bytes; BufferDesc is atomics only.
        unsafe { self.seg.at(hg.desc_offset(i) as usize) }
    }

    /// The spec the daemon stored in the handoff area (pinring-data's `Spec::to_stored`), copied
    /// out of shared memory;
    /// `None` for a ring without a handoff. The bytes are untrusted: `Spec::adopt` checks them.
    pub fn handoff_spec(&self) -> Option<Vec<u8>> {
        let hg = self.geom.handoff?;
        let mut out = vec![0u8; hg.spec_len as usize];
        // SAFETY: spec_offset lies inside the validated handoff area, inside the mapping.
        let src = unsafe { self.seg.base().add(hg.spec_offset as usize) };
        // SAFETY: [spec_offset, +spec_len) lies inside the validated handoff area and the
        // destination is private memory of that length, so the ranges do not overlap. The copy
        // reads the bytes as untrusted data (any value is a valid u8, which the parser judges);
        // only the creator writes them, before the ring is published.
        unsafe { std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), out.len()) };
        Some(out)
    }

    /// The part table's entry for part `part` of batch buffer `i`: the slot the daemon lists for
    /// it (an untrusted value: check it before use). `None` for a ring whose daemon copies, or a
    /// part past the table's row. Panics if `i` is out of range (caller bug).
    pub fn part_slot(&self, i: u32, part: u32) -> Option<&AtomicU32> {
        let hg = self.geom.handoff?;
        assert!(i < hg.buffers, "buffer index {i} out of range");
        if part >= hg.part_slots {
            return None;
        }
        // SAFETY: the entry lies in the part table, inside the validated handoff area, inside
        // the mapping; it is 4-aligned (the table starts after whole 256-byte descriptors); an
        // AtomicU32 accepts any bits.
        Some(unsafe { self.seg.at(hg.part_slot_offset(i, part) as usize) })
    }

    /// Host backend: start of batch buffer `i`'s bytes in the mapping (`None` for device buffers
    /// or a ring without a handoff). Panics if `i` is out of range (caller bug).
    pub(crate) fn host_buffer_ptr(&self, i: u32) -> Option<*mut u8> {
        let hg = self.geom.handoff?;
        assert!(i < hg.buffers, "buffer index {i} out of range");
        let off = hg.host_buffer_offset(i)?;
        // SAFETY: the buffer lies inside the validated handoff area, inside the mapping.
        Some(unsafe { self.seg.base().add(off as usize) })
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

    /// Rings the daemon's doorbell (commits, completions): a wake only if a daemon thread sleeps.
    pub fn ring_doorbell(&self) {
        let h = self.header();
        futex::bump_and_wake_counted_either(
            &h.doorbell_futex,
            &h.doorbell_waiters,
            &self.quiet_waiters,
            1,
        );
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

    /// Base of the data area (the roles' registration spans).
    pub(crate) fn data_base(&self) -> *mut u8 {
        // SAFETY: data_offset <= mapping length (validated geometry), so the pointer stays
        // within (or one past) the mapping.
        unsafe { self.seg.base().add(self.geom.data_offset as usize) }
    }

    /// Bytes of the data area.
    pub(crate) fn data_len(&self) -> usize {
        self.geom.data_bytes() as usize
    }

    /// Start of slot `i`'s data. Panics if out of range (caller bug).
    pub(crate) fn slot_ptr(&self, i: u32) -> *mut u8 {
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
        if self.seg.faulted() {
            return Err(RingError::SizeMismatch {
                name: self.name().into(),
                path: self.seg.path(),
                expected: self.geom.total_bytes,
                actual: self.seg.file_size().unwrap_or(0),
            });
        }
        if !self.seg.still_named()? {
            return Err(RingError::Replaced {
                name: self.name().into(),
                path: self.seg.path(),
            });
        }
        let actual = self.seg.file_size()?;
        if actual != self.geom.total_bytes {
            return Err(RingError::SizeMismatch {
                name: self.name().into(),
                path: self.seg.path(),
                expected: self.geom.total_bytes,
                actual,
            });
        }
        Ok(())
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
            error: d.error.load(Relaxed),
        }
    }

    /// Whether the segment was truncated under this process (the daemon's: its mapping now
    /// holds zero pages, [`crate::fault`]); one atomic load. [`Ring::check_file`] returns the
    /// error.
    pub fn truncated_here(&self) -> bool {
        self.seg.faulted()
    }

    /// Snapshots of every attached loader.
    pub fn loaders(&self) -> Vec<LoaderView> {
        (0..MAX_LOADERS)
            .filter_map(|i| {
                let e = self.loader(i);
                (e.state.load(Acquire) == loader_state::ACTIVE).then(|| LoaderView {
                    index: i,
                    pid: e.pid.load(Relaxed),
                    alive: self.entry_occupied(i as u16).unwrap_or(true),
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

    /// Daemon: whether a consumer is attached (the kernel's word: its lock).
    pub fn consumer_alive(&self) -> Result<bool, RingError> {
        lock::holder(self.seg.file(), lock::CONSUMER_LOCK)
            .map(|h| h == lock::Holder::Writer)
            .map_err(|e| self.sys("fcntl(F_OFD_GETLK) on the consumer byte", e))
    }

    /// Whether the loader that claimed a slot as (`owner`, `tenure`) is still attached: the
    /// kernel's word (its tenure lock). `None` if the kernel could not be asked; callers then
    /// assume it lives (the lease still catches a loader that never finishes).
    pub fn claimant_alive(&self, owner: u16, tenure: u16) -> Option<bool> {
        if owner as usize >= MAX_LOADERS {
            return Some(false);
        }
        lock::holder(self.seg.file(), lock::tenure_lock(owner, tenure))
            .ok()
            .map(|h| h == lock::Holder::Writer)
    }

    /// Whether loader-table entry `index` has a live occupant (its entry lock is held).
    pub fn entry_occupied(&self, index: u16) -> Option<bool> {
        lock::holder(self.seg.file(), lock::entry_lock(index))
            .ok()
            .map(|h| h == lock::Holder::Writer)
    }

    /// How many loaders are attached (loader-table entries ACTIVE): a count of atomic loads,
    /// no system call.
    pub fn attached_loaders(&self) -> u32 {
        (0..MAX_LOADERS)
            .filter(|&i| self.loader(i).state.load(Acquire) == loader_state::ACTIVE)
            .count() as u32
    }

    /// Copies bytes `[offset, offset+len)` of slot `i` (a taken slot's metadata) into `out`
    /// (replacing its contents), so they can be decoded in private memory: no Rust reference is
    /// ever formed over bytes another process can write. Panics if the range leaves the slot (a
    /// caller bug: lengths from the segment are checked by `take_ready` first).
    pub fn copy_out(&self, i: u32, offset: u64, len: u64, out: &mut Vec<u8>) {
        let sb = self.geom.slot_bytes;
        assert!(offset <= sb && len <= sb - offset, "range outside slot {i}");
        out.clear();
        out.reserve(len as usize);
        // SAFETY: offset <= slot_bytes (asserted above), so the pointer stays inside slot i.
        let src = unsafe { self.slot_ptr(i).add(offset as usize) };
        // SAFETY: the source range lies inside slot i, inside the mapping; the destination has
        // capacity for `len` bytes and is private memory, so the ranges do not overlap. The copy
        // reads the bytes as untrusted data (any value is a valid u8); the daemon reads a slot
        // only while it is UPLOADING, when no conforming process writes it.
        unsafe { std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), len as usize) };
        // SAFETY: the copy above initialised the first `len` bytes, within the capacity.
        unsafe { out.set_len(len as usize) };
    }
}

/// Checks that the segment `h` heads is a ring of this layout, waiting up to `timeout` (from
/// `start`) for a ring still initialising (version 0).
fn wait_for_layout(
    h: &Header,
    name: &str,
    path: &std::path::Path,
    timeout: Duration,
    start: Instant,
) -> Result<(), RingError> {
    let path = path.to_path_buf();
    let magic = h.magic.load(Relaxed);
    if magic != MAGIC && magic != 0 {
        return Err(RingError::NotARing {
            name: name.into(),
            path: path.clone(),
            found: magic,
            fix: "remove the file or pick another ring name",
        });
    }
    // (A): Acquire pairs with the creator's Release store of the version.
    let mut version = h.version.load(Acquire);
    while version == 0 {
        let left = timeout.saturating_sub(start.elapsed());
        if left.is_zero() {
            return Err(RingError::NotInitialised {
                name: name.into(),
                path: path.clone(),
                waited_ms: start.elapsed().as_millis() as u64,
            });
        }
        futex::wait(&h.version, 0, left.min(Duration::from_millis(20)));
        version = h.version.load(Acquire);
    }
    if h.magic.load(Relaxed) != MAGIC {
        return Err(RingError::NotARing {
            name: name.into(),
            path: path.clone(),
            found: h.magic.load(Relaxed),
            fix: "remove the file or pick another ring name",
        });
    }
    if version != LAYOUT_VERSION {
        return Err(RingError::VersionMismatch {
            name: name.into(),
            path: path.clone(),
            found: version,
            expected: LAYOUT_VERSION,
        });
    }
    Ok(())
}

/// `geom` with the handoff area the block `hb` describes, each of its values checked against
/// the geometry they make (`corrupt` says what is wrong).
fn with_handoff(
    hb: &HandoffBlock,
    geom: Geometry,
    corrupt: &dyn Fn(String) -> RingError,
) -> Result<Geometry, RingError> {
    let (buffers, buffer_bytes, spec_len, backend, part_slots) = (
        hb.buffers.load(Relaxed),
        hb.buffer_bytes.load(Relaxed),
        u64::from(hb.spec_len.load(Relaxed)),
        hb.backend.load(Relaxed),
        hb.part_slots.load(Relaxed),
    );
    let host = match backend {
        crate::handoff::backend_code::HOST => true,
        crate::handoff::backend_code::CUDA => false,
        other => return Err(corrupt(format!("handoff backend code {other} is unknown"))),
    };
    let geom = geom
        .with_handoff(buffers, buffer_bytes, spec_len, host, part_slots)
        .ok_or_else(|| {
            corrupt(format!(
                "handoff of {buffers} buffers of {buffer_bytes} bytes, a part table of \
                     {part_slots} slots per buffer and a stored spec of {spec_len} bytes is out \
                     of range"
            ))
        })?;
    let hg = geom.handoff.expect("with_handoff sets it");
    let found = (
        hb.area_offset.load(Relaxed),
        hb.area_bytes.load(Relaxed),
        hb.spec_offset.load(Relaxed),
        hb.host_offset.load(Relaxed),
        hb.desc_bytes.load(Relaxed) as usize,
    );
    let want = (
        hg.area_offset,
        hg.area_bytes,
        hg.spec_offset,
        hg.host_offset,
        crate::handoff::BUFFER_DESC_BYTES,
    );
    if found != want {
        return Err(corrupt(format!(
            "handoff offsets (area, bytes, config, host buffers, descriptor size) \
                 {found:?} do not match its geometry {want:?}"
        )));
    }
    Ok(geom)
}

/// A loader writes into a ring only if it is the ring's owner, or the ring's mode gives its group
/// read and write access and this process is in that group (the daemon's `ring.mode = "0660"`
/// with `ring.group`). Root is no exception: a root loader filling another user's ring would
/// feed that user's trainer with data it never asked for.
fn check_admitted(seg: &Segment) -> Result<(), RingError> {
    let (owner, gid, mode) = seg.owner_group_mode()?;
    let me = nix::unistd::geteuid();
    if owner == me.as_raw() {
        return Ok(());
    }
    let in_group = nix::unistd::getegid().as_raw() == gid
        || nix::unistd::getgroups()
            .map(|g| g.iter().any(|g| g.as_raw() == gid))
            .unwrap_or(false);
    if mode & 0o060 == 0o060 && in_group {
        return Ok(());
    }
    Err(RingError::ForeignRing {
        name: seg.name().to_string(),
        path: seg.path(),
        owner,
        gid,
        mode,
        me: me.as_raw(),
    })
}

/// The gid of `ring.group` `group` for ring `ring`, or the error the daemon starts with
/// (`pinring config check` runs the same check).
pub fn resolve_group(ring: &str, group: &str) -> Result<u32, RingError> {
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
