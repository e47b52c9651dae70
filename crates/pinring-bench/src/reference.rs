//! The reference pipeline of `pinring bench`: the least a loader-to-GPU pipeline through shared
//! memory can do, measured next to pinring at the same writers, slot size, ring size and bytes,
//! so that every bench row says how far the protocol is from it.
//!
//! N writer processes (this executable's hidden `bench-writer` subcommand) fill the slots of one
//! segment that the bench made and registered once with the backend; the bench's upload thread
//! uploads each filled slot with the backend's [`Uploader`](pinring_backend::Uploader) (as many device buffers as the
//! daemon uses) and hands the slot back when its copies have completed. A slot holds a batch
//! field-major, as a pinring slot does (the samples' images, then their labels as little-endian
//! i64). It is uploaded as one deferred group per slot, flushed before the upload thread sleeps,
//! as the daemon does, but always as two copies, one per field, the labels to their aligned
//! offset in the device buffer ([`pinring_data::BatchLayout`]); the daemon makes one copy of
//! fields that continue each other in the slot and the buffer. Each slot has one 32-bit flag word
//! (`EMPTY` → `FILLING` by the writer's CAS, `FULL` by its store, `UPLOADING` when the upload
//! thread submits the copy, `EMPTY` again once the copy has completed); slots are split
//! round-robin (writer `w` owns slots `w`, `w + N`, …), so no two writers ever race for a slot.
//! Writers fill with the synthetic generator, the same words the loaders write. Nothing else: no
//! sequencer, no batch metadata, no verification, no liveness locks or leases, no loader table.
//! It is the upper bound the protocol is compared to.
//!
//! Segment: one page-aligned header (the run's geometry, a phase word, the upload thread's
//! doorbell, then one cache line per slot holding its flag word and a waiter count), then the
//! slots, each `slot_bytes` apart (the pipeline's slot size, so the ring has the same size).
//! Waits are futex waits with deadlines and counted waiters, as in the ring: a writer sleeps
//! on its slot's flag word, the upload thread on the doorbell (rung by writers after each fill
//! and by the uploader's completion hook), and nobody makes a wake-up system call while the
//! other side is awake.
//!
//! The clock runs from the moment every writer has mapped the segment (the bench then sets the
//! phase word to GO) to the last completion: start-up and registration are outside it, as they
//! are outside the daemon's.

use pinring_backend::{Backend, BackendError, Placement, UploadJob};
use pinring_daemon::cpu_seconds;
use pinring_data::{Config, Synthetic, FIELD_ALIGN, LABEL_BYTES};
use pinring_exit::Exit;
use pinring_ring::futex::{self, Wake};
use pinring_ring::{Access, Segment};
use pinring_runtime::children::{Children, Ended};
use pinring_runtime::this_program::ThisProgram;
use std::process::Stdio;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// "pinrref1": marks a reference segment (a ring's magic differs).
const MAGIC: u64 = u64::from_le_bytes(*b"pinrref1");
/// Where the per-slot flag lines start in the header.
const FLAGS_OFFSET: usize = 128;
/// One cache line per slot flag, so that writers of neighbouring slots do not share a line.
const FLAG_BYTES: usize = 64;
/// Header and slots are page aligned.
const PAGE: u64 = 4096;
/// The most slots a reference segment has (the ring's own limit).
const MAX_SLOTS: u32 = pinring_ring::layout::MAX_SLOTS;

/// Slot flag values: a writer takes EMPTY → FILLING (CAS) → FULL, the upload thread FULL →
/// UPLOADING (when it submits the copy) → EMPTY (when the copy has completed).
const EMPTY: u32 = 0;
const FILLING: u32 = 1;
const FULL: u32 = 2;
const UPLOADING: u32 = 3;

/// Phase word values.
const SETUP: u32 = 0;
const GO: u32 = 1;
const DONE: u32 = 2;

/// Every wait sleeps at most this long before it looks at its deadline and its peers.
const WAIT_SLICE: Duration = Duration::from_millis(100);
/// No progress for this long is a stall (an error, not a hang).
const STALL: Duration = Duration::from_secs(60);

/// The header page of a reference segment. Only atomics: the writers and the bench access it
/// concurrently from several processes.
#[repr(C)]
struct Header {
    /// [`MAGIC`], stored last (Release) when the bench has written the rest.
    magic: AtomicU64,
    /// Bytes from one slot's start to the next (a multiple of [`PAGE`]).
    slot_bytes: AtomicU64,
    /// Bytes a writer fills and the upload thread uploads per slot.
    payload: AtomicU64,
    /// Bytes per synthetic sample.
    sample_bytes: AtomicU64,
    /// Batches (slot fills) in the whole run.
    batches: AtomicU64,
    /// Seed of the synthetic generator.
    seed: AtomicU64,
    /// Slots.
    slots: AtomicU32,
    /// Writers.
    writers: AtomicU32,
    /// Samples per batch.
    samples_per_batch: AtomicU32,
    /// Writers that have mapped the segment (each adds one, then wakes the bench).
    attached: AtomicU32,
    /// [`SETUP`], [`GO`] or [`DONE`].
    phase: AtomicU32,
    /// Bumped after every fill and by the completion hook; the upload thread sleeps on it.
    doorbell: AtomicU32,
    /// Upload threads that may sleep on the doorbell (0 or 1).
    doorbell_waiters: AtomicU32,
}

/// One slot's flag word and the writers that may sleep on it, alone in a cache line.
#[repr(C, align(64))]
struct SlotFlag {
    state: AtomicU32,
    waiters: AtomicU32,
}

const _: () = assert!(std::mem::size_of::<Header>() <= FLAGS_OFFSET);
const _: () = assert!(std::mem::size_of::<SlotFlag>() == FLAG_BYTES);

/// The shape of one reference run: the pipeline point's ring and plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Slots in the ring.
    pub slots: u32,
    /// Bytes per slot (the pipeline's slot, metadata room included).
    pub slot_bytes: u64,
    /// Bytes uploaded per slot (the pipeline's batch payload: images and labels).
    pub payload: u64,
    /// Bytes per sample's images (each sample also has an i64 label).
    pub sample_bytes: u64,
    /// Samples per batch.
    pub samples_per_batch: u32,
    /// Batches in the run.
    pub batches: u64,
    /// Seed of the synthetic generator.
    pub seed: u64,
}

impl Geometry {
    /// The reference run of a pipeline config: the same slots, slot size, batch payload and
    /// number of batches (one epoch), so it moves the same bytes.
    pub fn of(cfg: &Config) -> Geometry {
        let batch = u64::from(cfg.plan.batch_size.max(1));
        Geometry {
            slots: cfg.slots(),
            slot_bytes: cfg.slot_bytes(),
            payload: cfg.batch_payload_bytes_max(),
            sample_bytes: cfg.sample_bytes(),
            samples_per_batch: cfg.plan.batch_size,
            batches: cfg.dataset.samples / batch,
            seed: cfg.dataset.seed,
        }
    }

    /// Payload bytes the run moves.
    pub fn bytes(&self) -> u64 {
        self.batches * self.payload
    }

    /// Bytes of a batch's images: the first field of a slot and of a device buffer.
    fn images_bytes(&self) -> u64 {
        u64::from(self.samples_per_batch) * self.sample_bytes
    }

    /// Where a batch's labels go in its device buffer: after the images, at the next multiple
    /// of [`FIELD_ALIGN`], as the daemon places them.
    fn labels_offset(&self) -> u64 {
        self.images_bytes().next_multiple_of(FIELD_ALIGN)
    }

    /// Bytes of a batch's labels.
    fn labels_bytes(&self) -> u64 {
        u64::from(self.samples_per_batch) * LABEL_BYTES as u64
    }

    /// Bytes of a device buffer: the images, then the labels at their offset.
    fn buffer_bytes(&self) -> u64 {
        self.labels_offset() + self.labels_bytes()
    }

    /// Where the slots start: after the header and one flag line per slot, page aligned.
    fn data_offset(&self) -> u64 {
        (FLAGS_OFFSET as u64 + u64::from(self.slots) * FLAG_BYTES as u64).div_ceil(PAGE) * PAGE
    }

    /// Why this geometry cannot be a reference segment, if it cannot.
    fn problem(&self) -> Option<String> {
        let fill = (self.sample_bytes.checked_add(LABEL_BYTES as u64))
            .and_then(|record| record.checked_mul(u64::from(self.samples_per_batch)));
        if self.slots == 0 || self.slots > MAX_SLOTS {
            Some(format!("{} slots (1 to {MAX_SLOTS} expected)", self.slots))
        } else if self.slot_bytes == 0 || self.slot_bytes % PAGE != 0 {
            Some(format!(
                "a slot of {} bytes (a positive multiple of {PAGE} expected)",
                self.slot_bytes
            ))
        } else if self.payload == 0 || self.payload > self.slot_bytes {
            Some(format!(
                "a payload of {} bytes in {}-byte slots",
                self.payload, self.slot_bytes
            ))
        } else if fill != Some(self.payload) {
            Some(format!(
                "{} samples of {} bytes and a {LABEL_BYTES}-byte label each do not make the \
                 {}-byte payload",
                self.samples_per_batch, self.sample_bytes, self.payload
            ))
        } else if self.len().is_none_or(|len| usize::try_from(len).is_err()) {
            Some(format!(
                "{} slots of {} bytes: more bytes than this machine can map",
                self.slots, self.slot_bytes
            ))
        } else {
            None
        }
    }

    /// Bytes of the whole segment; `None` on overflow.
    fn len(&self) -> Option<u64> {
        u64::from(self.slots)
            .checked_mul(self.slot_bytes)?
            .checked_add(self.data_offset())
    }
}

/// What one reference run measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measured {
    /// Payload bytes whose uploads completed.
    pub bytes: u64,
    /// Uploads completed.
    pub batches: u64,
    /// From GO to the last completion.
    pub seconds: f64,
    /// `bytes / seconds`, in 10⁹ bytes per second.
    pub gbps: f64,
    /// Seconds the upload thread spent inside the backend's submit calls.
    pub submit_seconds: f64,
    /// CPU seconds of this process (upload thread, driver threads) during the run.
    pub cpu_seconds: f64,
}

/// Why the reference run (or one of its writers) failed.
#[derive(Debug, thiserror::Error)]
pub enum ReferenceError {
    /// The bench was asked to stop (SIGTERM or SIGINT) while this run went on.
    #[error("stopped by SIGTERM or SIGINT")]
    Interrupted,
    /// Creating, publishing or opening the segment failed.
    #[error("reference segment {name:?}: {source}")]
    Segment {
        /// Segment name.
        name: String,
        /// Cause.
        #[source]
        source: pinring_ring::RingError,
    },
    /// The segment's header does not describe a reference run this build can take part in.
    #[error(
        "reference segment {name:?}: {problem}; it is made by `pinring bench` for its own \
         writers: run `pinring bench` again rather than starting `pinring bench-writer` by hand"
    )]
    BadSegment {
        /// Segment name.
        name: String,
        /// What is wrong.
        problem: String,
    },
    /// A geometry the bench cannot run (a bug in the caller: the pipeline's config validated).
    #[error("reference run: cannot lay out {problem}; pick other --slot-sizes or --ring-bytes")]
    Geometry {
        /// What is wrong.
        problem: String,
    },
    /// A writer process could not be started.
    #[error(
        "cannot start reference writer {index} ({exe}): {source}; check that this pinring \
         executable still exists and that the process limit allows one more process"
    )]
    Spawn {
        /// Writer index.
        index: u32,
        /// Executable.
        exe: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A writer ended before the run did.
    #[error(
        "reference writer {index} {ended} before the run ended; its error is printed above \
         (rerun `pinring bench`; if it fails again, report it)"
    )]
    WriterDied {
        /// Writer index.
        index: u32,
        /// How it ended.
        ended: String,
    },
    /// Nothing moved for `STALL` (60 s).
    #[error(
        "reference run stalled: {what} for {secs} s; the host may be overloaded or a writer \
         stuck: rerun `pinring bench`, with fewer --loaders if it happens again"
    )]
    Stalled {
        /// What was awaited.
        what: String,
        /// How long.
        secs: u64,
    },
    /// Registration, the upload engine or an upload failed.
    #[error("reference run: {0}")]
    Backend(#[from] BackendError),
}

impl pinring_exit::Coded for ReferenceError {
    /// Exit code (of `pinring bench-writer`, and of `pinring bench` when its reference fails).
    fn exit(&self) -> pinring_exit::Exit {
        match self {
            ReferenceError::Segment { .. } | ReferenceError::BadSegment { .. } => Exit::Ring,
            ReferenceError::Backend(_) => Exit::Backend,
            ReferenceError::Geometry { .. } => Exit::Internal,
            ReferenceError::Spawn { .. }
            | ReferenceError::WriterDied { .. }
            | ReferenceError::Stalled { .. } => Exit::PeerDied,
            ReferenceError::Interrupted => Exit::Ok,
        }
    }
}

/// `pinring bench-writer` flags (a hidden subcommand: `pinring bench` starts it).
#[derive(Debug, Clone, clap::Args)]
pub struct WriterArgs {
    /// Name of the reference segment (`/dev/shm/pinring.NAME`), made by `pinring bench`.
    #[arg(long)]
    pub segment: String,
    /// This writer's index: it fills slots INDEX, INDEX + writers, INDEX + 2 × writers, …
    #[arg(long)]
    pub index: u32,
}

/// The header of a mapped reference segment.
fn header(seg: &Segment) -> &Header {
    // SAFETY: `Header` is `repr(C)` and made only of atomics; offset 0 of the mapping is page
    // aligned; every reference segment is at least one page long (`Geometry::len` adds a
    // page-rounded header, and a writer checks the length before calling this), and the header
    // is smaller than a page.
    unsafe { seg.at::<Header>(0) }
}

/// The flag line of slot `slot`; the caller has checked `slot` against a geometry that fits the
/// mapping ([`Geometry::len`] ≤ the segment's length).
fn flag(seg: &Segment, slot: u32) -> &SlotFlag {
    let offset = FLAGS_OFFSET + slot as usize * FLAG_BYTES;
    // SAFETY: `SlotFlag` is `repr(C)` and made only of atomics; `offset` is a multiple of 64
    // from a page-aligned base; for `slot` < slots it ends before the geometry's data offset,
    // which lies inside the mapping (checked by the caller).
    unsafe { seg.at::<SlotFlag>(offset) }
}

/// Start of slot `slot` (the caller has checked it against the mapped geometry).
fn slot_ptr(seg: &Segment, geom: &Geometry, slot: u32) -> *mut u8 {
    let offset = geom.data_offset() + u64::from(slot) * geom.slot_bytes;
    seg.base().wrapping_add(offset as usize)
}

/// A published reference segment: its name is removed when this drops, on every path.
struct Published(Arc<Segment>);

impl Drop for Published {
    fn drop(&mut self) {
        if let Err(e) = self.0.unlink_if_ours() {
            tracing::warn!("cannot remove the reference segment: {e}");
        }
    }
}

/// Sets the phase to DONE and wakes every writer when it drops, so writers stop on every path,
/// the error paths included.
struct Finish(Arc<Segment>);

impl Drop for Finish {
    fn drop(&mut self) {
        let h = header(&self.0);
        h.phase.store(DONE, SeqCst);
        futex::wake_all(&h.phase);
    }
}

/// How the writers run.
#[derive(Debug, Clone, Copy)]
pub enum Spawn<'a> {
    /// As processes of this program (`pinring bench-writer …`).
    Processes(&'a ThisProgram),
    /// As threads of this process (unit tests, whose executable is the test harness).
    #[cfg(test)]
    Threads,
}

/// The running writers.
enum Writers {
    Processes(Children),
    #[cfg(test)]
    Threads(Vec<Option<std::thread::JoinHandle<Result<u64, ReferenceError>>>>),
}

impl Writers {
    fn start(spawn: Spawn<'_>, name: &str, writers: u32) -> Result<Writers, ReferenceError> {
        match spawn {
            Spawn::Processes(exe) => {
                let mut kids = Children(Vec::new());
                for index in 0..writers {
                    let mut cmd = exe.command();
                    cmd.arg("bench-writer")
                        .args(["--segment", name, "--index", &index.to_string()])
                        .env("RUST_LOG", "warn")
                        .stdin(Stdio::null());
                    pinring_runtime::children::stop_with_parent(&mut cmd);
                    let child = cmd.spawn().map_err(|source| ReferenceError::Spawn {
                        index,
                        exe: exe.display(),
                        source,
                    })?;
                    kids.0.push(child);
                }
                Ok(Writers::Processes(kids))
            }
            #[cfg(test)]
            Spawn::Threads => Ok(Writers::Threads(
                (0..writers)
                    .map(|index| {
                        let name = name.to_string();
                        Some(std::thread::spawn(move || {
                            let seg =
                                Segment::open(&name, Access::ReadWrite).map_err(|source| {
                                    ReferenceError::Segment {
                                        name: name.clone(),
                                        source,
                                    }
                                })?;
                            write_share(&seg, index, &|| false)
                        }))
                    })
                    .collect(),
            )),
        }
    }

    /// An error if a writer has ended (before the run did).
    fn check_alive(&mut self) -> Result<(), ReferenceError> {
        match self {
            Writers::Processes(kids) => {
                for (index, c) in kids.0.iter_mut().enumerate() {
                    if let Ok(Some(status)) = c.try_wait() {
                        return Err(ReferenceError::WriterDied {
                            index: index as u32,
                            ended: Ended::of(status).to_string(),
                        });
                    }
                }
                Ok(())
            }
            #[cfg(test)]
            Writers::Threads(handles) => {
                for (index, h) in handles.iter_mut().enumerate() {
                    if h.as_ref().is_some_and(|h| h.is_finished()) {
                        let ended = match h.take().map(|h| h.join()) {
                            Some(Ok(Err(e))) => return Err(e),
                            Some(Err(_)) => "panicked".to_string(),
                            _ => "returned".to_string(),
                        };
                        return Err(ReferenceError::WriterDied {
                            index: index as u32,
                            ended,
                        });
                    }
                }
                Ok(())
            }
        }
    }

    /// Waits (up to [`STALL`]) for every writer to end after DONE; an error if one failed.
    fn finish(&mut self) -> Result<(), ReferenceError> {
        let start = Instant::now();
        match self {
            Writers::Processes(kids) => {
                for (index, c) in kids.0.iter_mut().enumerate() {
                    let status = loop {
                        match c.try_wait() {
                            Ok(Some(status)) => break status,
                            Ok(None) if start.elapsed() < STALL => {
                                std::thread::sleep(Duration::from_millis(2));
                            }
                            _ => {
                                return Err(ReferenceError::Stalled {
                                    what: format!("writer {index} exiting after the run"),
                                    secs: start.elapsed().as_secs(),
                                })
                            }
                        }
                    };
                    if !status.success() {
                        return Err(ReferenceError::WriterDied {
                            index: index as u32,
                            ended: Ended::of(status).to_string(),
                        });
                    }
                }
                Ok(())
            }
            #[cfg(test)]
            Writers::Threads(handles) => {
                for (index, h) in handles.iter_mut().enumerate() {
                    match h.take().map(|h| h.join()) {
                        Some(Ok(Ok(_))) | None => {}
                        Some(Ok(Err(e))) => return Err(e),
                        Some(Err(_)) => {
                            return Err(ReferenceError::WriterDied {
                                index: index as u32,
                                ended: "panicked".into(),
                            })
                        }
                    }
                }
                Ok(())
            }
        }
    }
}

/// Runs the reference pipeline once: makes the segment `name` (`/dev/shm/pinring.NAME`, removed
/// at the end on every path), registers its slots with `backend`, starts `writers` writers and
/// uploads `geom.batches` slots. With no writers it measures the upload engine alone: every slot
/// is full from the start and full again as soon as its upload completes.
pub fn run(
    backend: &dyn Backend,
    geom: &Geometry,
    writers: u32,
    name: &str,
    spawn: Spawn<'_>,
    stop: &dyn Fn() -> bool,
) -> Result<Measured, ReferenceError> {
    if let Some(problem) = geom.problem() {
        return Err(ReferenceError::Geometry { problem });
    }
    // No writers: the upload engine alone. Every slot starts FULL and is FULL again as soon as
    // its upload has read it, so the copy engine and the driver are measured with nothing
    // competing for cores or memory bandwidth.
    let alone = writers == 0;
    let seg = make_segment(geom, writers, name)?;
    let _published = Published(Arc::clone(&seg));
    let data = geom.data_offset() as usize;
    let data_len = (u64::from(geom.slots) * geom.slot_bytes) as usize;
    // SAFETY: the slots are a live shared mapping held by `seg` (an Arc this function keeps to
    // its end), and the guard is declared after it, so it is dropped (unregistered) first; the
    // range lies inside the mapping (`geom.len()` bytes were mapped).
    let _registration =
        unsafe { backend.register(seg.base().wrapping_add(data), data_len, false) }?;
    let buffers = pinring_daemon::default_upload_buffers(geom.buffer_bytes());
    // Buffers of their own, a copy per slot: the minimal pipeline does not gather runs of
    // slots into one copy as the daemon does (`Placement::Contiguous`).
    let uploader = backend.uploader(buffers, geom.buffer_bytes() as usize, Placement::Separate)?;
    uploader.set_source_ring(geom.slots as usize);
    {
        let seg = Arc::clone(&seg);
        uploader.set_completion_hook(Arc::new(move || {
            let h = header(&seg);
            futex::bump_and_wake_counted(&h.doorbell, &h.doorbell_waiters, 1);
        }));
    }
    if alone {
        for slot in 0..geom.slots {
            flag(&seg, slot).state.store(FULL, Relaxed);
        }
    }
    let mut kids = Writers::start(spawn, name, writers)?;
    // Declared after the writers: dropped first, so they are told to stop before being reaped.
    let finish = Finish(Arc::clone(&seg));
    let h = header(&seg);

    wait_for_writers(h, writers, &mut kids, stop)?;

    let cpu_at_start = cpu_seconds();
    let mut submit_seconds = 0.0;
    let start = Instant::now();
    h.phase.store(GO, SeqCst);
    futex::wake_all(&h.phase);
    let completions = uploader.completions();
    let mut books = Books {
        free: (0..buffers).rev().collect(),
        copies_left: vec![0u8; geom.slots as usize],
        done: 0,
        bytes: 0,
    };
    let mut next = 0u64;
    let mut last_progress = Instant::now();
    while books.done < geom.batches {
        if stop() {
            return Err(ReferenceError::Interrupted);
        }
        // Read before looking: a fill or a completion after this read changes the word, so the
        // wait below returns at once instead of sleeping through it.
        let seen = h.doorbell.load(SeqCst);
        let mut progressed = take_completions(completions, &seg, alone, &mut books)?;
        while next < geom.batches {
            let slot = (next % u64::from(geom.slots)) as u32;
            if books.free.is_empty() || flag(&seg, slot).state.load(Acquire) != FULL {
                break;
            }
            let buffer = books.free.pop().expect("checked non-empty");
            // Only this thread moves a slot on from FULL; UPLOADING keeps the next lap from
            // taking the slot for a new batch while this copy is in flight.
            flag(&seg, slot).state.store(UPLOADING, Relaxed);
            let t = Instant::now();
            let completions_due = submit_slot(&*uploader, &seg, geom, slot, buffer)?;
            submit_seconds += t.elapsed().as_secs_f64();
            books.copies_left[slot as usize] = completions_due as u8;
            next += 1;
            progressed = true;
        }
        if progressed {
            last_progress = Instant::now();
            continue;
        }
        if last_progress.elapsed() > STALL {
            return Err(stalled(
                &seg,
                geom,
                (next, books.done, books.free.len()),
                last_progress,
            ));
        }
        uploader.flush()?;
        if futex::wait_counted(&h.doorbell, &h.doorbell_waiters, seen, WAIT_SLICE) == Wake::TimedOut
        {
            kids.check_alive()?;
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let cpu_seconds = cpu_seconds() - cpu_at_start;
    drop(finish);
    kids.finish()?;
    Ok(Measured {
        bytes: books.bytes,
        batches: books.done,
        seconds,
        gbps: books.bytes as f64 / seconds.max(1e-9) / 1e9,
        submit_seconds,
        cpu_seconds,
    })
}

/// The reference loop's books: device buffers free, copies of each slot not completed yet (one
/// per field), batches done and bytes copied.
struct Books {
    free: Vec<usize>,
    copies_left: Vec<u8>,
    done: u64,
    bytes: u64,
}

/// Books the completions that arrived: a slot whose copies are all done is EMPTY again (FULL
/// again for the engine measured `alone`), its buffer free. Whether any arrived.
fn take_completions(
    completions: &pinring_backend::Completions,
    seg: &Segment,
    alone: bool,
    books: &mut Books,
) -> Result<bool, ReferenceError> {
    let mut progressed = false;
    while let Ok(c) = completions.try_recv() {
        c.result?;
        books.bytes += c.len as u64;
        progressed = true;
        // The tag is the slot (low half) and the field (high half).
        let slot = c.tag as u32;
        let left = &mut books.copies_left[slot as usize];
        *left = left.saturating_sub(1);
        if *left > 0 {
            continue;
        }
        let f = flag(seg, slot);
        // Release (and SeqCst against the waiter count): the copy has read the slot; its
        // writer may fill it again (the engine alone: it is full again at once).
        f.state.store(if alone { FULL } else { EMPTY }, SeqCst);
        if f.waiters.load(SeqCst) != 0 {
            futex::wake_all(&f.state);
        }
        books.free.push(c.buffer);
        books.done += 1;
    }
    Ok(progressed)
}

/// Makes the reference segment `name` for `geom` and `writers` (its header written, every flag
/// EMPTY, the phase SETUP) and publishes it.
fn make_segment(geom: &Geometry, writers: u32, name: &str) -> Result<Arc<Segment>, ReferenceError> {
    let seg_err = |source| ReferenceError::Segment {
        name: name.to_string(),
        source,
    };
    let len = geom.len().unwrap_or(u64::MAX);
    let mut seg = Segment::create_unnamed(name, len, 0o600, None).map_err(seg_err)?;
    {
        // A fresh segment reads as zeros: every flag is EMPTY, the phase SETUP.
        let h = header(&seg);
        h.slot_bytes.store(geom.slot_bytes, Relaxed);
        h.payload.store(geom.payload, Relaxed);
        h.sample_bytes.store(geom.sample_bytes, Relaxed);
        h.batches.store(geom.batches, Relaxed);
        h.seed.store(geom.seed, Relaxed);
        h.slots.store(geom.slots, Relaxed);
        h.writers.store(writers, Relaxed);
        h.samples_per_batch.store(geom.samples_per_batch, Relaxed);
        h.magic.store(MAGIC, Release);
    }
    // The name carries this process's pid: whatever is there is a leftover of an earlier
    // process with the same pid (a live daemon's ring or another user's file is still refused).
    seg.publish(true).map_err(seg_err)?;
    Ok(Arc::new(seg))
}

/// Waits until every one of the `writers` writers has mapped the segment.
fn wait_for_writers(
    h: &Header,
    writers: u32,
    kids: &mut Writers,
    stop: &dyn Fn() -> bool,
) -> Result<(), ReferenceError> {
    let waited = Instant::now();
    loop {
        let attached = h.attached.load(SeqCst);
        if attached >= writers {
            break;
        }
        if stop() {
            return Err(ReferenceError::Interrupted);
        }
        kids.check_alive()?;
        if waited.elapsed() > STALL {
            return Err(ReferenceError::Stalled {
                what: format!("{attached} of {writers} writers attached"),
                secs: waited.elapsed().as_secs(),
            });
        }
        futex::wait(&h.attached, attached, WAIT_SLICE);
    }
    Ok(())
}

/// Submits the copies of FULL slot `slot` (its images, then its labels) into device buffer
/// `buffer`, as one group, deferred, as the daemon submits a part; the completions that free it.
fn submit_slot(
    uploader: &dyn pinring_backend::Uploader,
    seg: &Segment,
    geom: &Geometry,
    slot: u32,
    buffer: usize,
) -> Result<usize, ReferenceError> {
    let base = slot_ptr(seg, geom, slot);
    let images = geom.images_bytes() as usize;
    // (source offset in the slot, length, destination offset in the buffer) per field.
    let fields = [
        (0, images, 0),
        (
            images,
            geom.labels_bytes() as usize,
            geom.labels_offset() as usize,
        ),
    ];
    let jobs = fields.map(|(src, len, dst_offset)| UploadJob {
        tag: u64::from(slot),
        src: base.wrapping_add(src),
        len,
        buffer,
        dst_offset,
        decode: None,
    });
    // One group per slot, deferred, as the daemon submits a part: the backend says how
    // many completions free it, and may signal several groups with one event (flushed
    // before the wait below).
    // SAFETY: the slot was FULL: its writer wrote it before that store (Release, seen by
    // the caller's Acquire load) and will not touch it again until `run` stores EMPTY,
    // which it does only after the completions of all the slot's jobs have arrived. The
    // job's source is inside the slot's payload (images, then labels: `payload` bytes, at
    // most `slot_bytes`, checked by `problem`). The mapping (held by `run`'s `seg`)
    // outlives the uploader, which `run` drops first.
    let completions_due = unsafe { uploader.submit_group_deferred(&jobs) }?;
    Ok(completions_due)
}

/// The error of a pipeline that made no progress for STALL since `since`: where the next slot
/// stands (`next`, `done`, device buffers free in `progress`).
fn stalled(
    seg: &Segment,
    geom: &Geometry,
    (next, done, free): (u64, u64, usize),
    since: Instant,
) -> ReferenceError {
    let slot = (next % u64::from(geom.slots)) as u32;
    let state = match flag(seg, slot).state.load(Relaxed) {
        EMPTY => "EMPTY",
        FILLING => "FILLING",
        FULL => "FULL",
        UPLOADING => "UPLOADING",
        _ => "garbage",
    };
    ReferenceError::Stalled {
        what: format!(
            "{done} of {} batches uploaded, the next (slot {slot}) is {state}, {} \
             device buffers free",
            geom.batches, free
        ),
        secs: since.elapsed().as_secs(),
    }
}

/// Reads and checks the geometry a reference segment's header describes, and the writers.
fn mapped_geometry(seg: &Segment) -> Result<(Geometry, u32), ReferenceError> {
    let bad = |problem: String| ReferenceError::BadSegment {
        name: seg.name().to_string(),
        problem,
    };
    if (seg.len() as u64) < PAGE {
        return Err(bad(format!("{} bytes, less than a header page", seg.len())));
    }
    let h = header(seg);
    let magic = h.magic.load(Acquire);
    if magic != MAGIC {
        return Err(bad(format!(
            "magic {magic:#018x}, not a reference segment of this pinring version"
        )));
    }
    let geom = Geometry {
        slots: h.slots.load(Relaxed),
        slot_bytes: h.slot_bytes.load(Relaxed),
        payload: h.payload.load(Relaxed),
        sample_bytes: h.sample_bytes.load(Relaxed),
        samples_per_batch: h.samples_per_batch.load(Relaxed),
        batches: h.batches.load(Relaxed),
        seed: h.seed.load(Relaxed),
    };
    if let Some(problem) = geom.problem() {
        return Err(bad(problem));
    }
    if geom.len().is_none_or(|len| len > seg.len() as u64) {
        return Err(bad(format!(
            "{} slots of {} bytes do not fit its {} bytes",
            geom.slots,
            geom.slot_bytes,
            seg.len()
        )));
    }
    Ok((geom, h.writers.load(Relaxed)))
}

/// Sleeps until the phase is past `SETUP` (`until_done`: is `DONE`); `Ok(false)` when `stop`
/// said to stop first.
fn wait_phase(
    seg: &Segment,
    until_done: bool,
    stop: &dyn Fn() -> bool,
) -> Result<bool, ReferenceError> {
    let h = header(seg);
    let start = Instant::now();
    loop {
        let phase = h.phase.load(SeqCst);
        if phase == DONE || (!until_done && phase != SETUP) {
            return Ok(true);
        }
        if stop() {
            return Ok(false);
        }
        if start.elapsed() > STALL {
            return Err(ReferenceError::Stalled {
                what: format!(
                    "this writer waiting for the bench to say {}",
                    if until_done { "DONE" } else { "GO" }
                ),
                secs: start.elapsed().as_secs(),
            });
        }
        futex::wait(&h.phase, phase, WAIT_SLICE);
    }
}

/// One writer's share of a reference run: fills slots `index`, `index + writers`, … with the
/// synthetic batches that fall on them, until the run's batches are made, then waits for DONE.
/// Returns the batches written. `stop` is asked whenever a wait times out.
fn write_share(seg: &Segment, index: u32, stop: &dyn Fn() -> bool) -> Result<u64, ReferenceError> {
    let (geom, writers) = mapped_geometry(seg)?;
    if index >= writers {
        return Err(ReferenceError::BadSegment {
            name: seg.name().to_string(),
            problem: format!("writer index {index}, but the run has {writers} writers"),
        });
    }
    let h = header(seg);
    h.attached.fetch_add(1, SeqCst);
    futex::wake_all(&h.attached);
    if !wait_phase(seg, false, stop)? || h.phase.load(SeqCst) == DONE {
        return Ok(0);
    }
    let synthetic = Synthetic::new(geom.seed, geom.sample_bytes as usize, 1);
    let sample = geom.sample_bytes as usize;
    let per_batch = u64::from(geom.samples_per_batch);
    let slots = u64::from(geom.slots);
    let mut written = 0u64;
    // Writers past the last slot own none.
    let mine: Vec<u32> = (index..geom.slots).step_by(writers as usize).collect();
    'laps: for lap in 0u64.. {
        if mine.is_empty() {
            break;
        }
        for &slot in &mine {
            let batch = lap * slots + u64::from(slot);
            if batch >= geom.batches {
                break 'laps;
            }
            let f = flag(seg, slot);
            let mut since = Instant::now();
            // Claim: EMPTY → FILLING. Acquire: the upload of the slot's previous batch (whose
            // completion preceded the EMPTY store) is over before these writes.
            while let Err(now) = f.state.compare_exchange(EMPTY, FILLING, Acquire, Relaxed) {
                if h.phase.load(Relaxed) == DONE {
                    return Ok(written);
                }
                match futex::wait_counted(&f.state, &f.waiters, now, WAIT_SLICE) {
                    Wake::TimedOut | Wake::Interrupted => {
                        if stop() {
                            return Ok(written);
                        }
                        if since.elapsed() > STALL {
                            return Err(ReferenceError::Stalled {
                                what: format!("writer {index} waiting for slot {slot} to empty"),
                                secs: since.elapsed().as_secs(),
                            });
                        }
                    }
                    Wake::Woken | Wake::Changed => since = Instant::now(),
                }
            }
            let base = slot_ptr(seg, &geom, slot);
            let first = batch * per_batch;
            for j in 0..per_batch {
                let mut words = synthetic.sample_words(first + j);
                // SAFETY: the slot lies inside the mapping (`mapped_geometry` checked the
                // geometry against its length) and samples_per_batch × sample_bytes = payload ≤
                // slot_bytes, so sample `j` is inside slot `slot`; the slot is FILLING, claimed
                // by this writer alone (round-robin ownership plus the CAS above), and the
                // upload thread does not read it until the FULL store below.
                unsafe {
                    pinring_ring::write_words_at(
                        base.wrapping_add(j as usize * sample),
                        sample,
                        || words.next_word(),
                    )
                };
            }
            // Then the labels, field-major, as a loader writes them.
            let mut label = first;
            // SAFETY: as above: the labels follow the images in the slot's payload
            // (samples_per_batch × (sample_bytes + 8) = payload ≤ slot_bytes), in the slot this
            // writer alone holds FILLING.
            unsafe {
                pinring_ring::write_words_at(
                    base.wrapping_add(per_batch as usize * sample),
                    per_batch as usize * LABEL_BYTES,
                    || {
                        label += 1;
                        u64::from_le_bytes(synthetic.label_le_bytes(label - 1))
                    },
                )
            };
            f.state.store(FULL, Release);
            futex::bump_and_wake_counted(&h.doorbell, &h.doorbell_waiters, 1);
            written += 1;
        }
    }
    wait_phase(seg, true, stop)?;
    Ok(written)
}

/// Body of `pinring bench-writer`: opens the segment `pinring bench` made and writes this
/// writer's share. Stops early on SIGTERM/SIGINT or when the bench that started it is gone.
pub fn writer_main(
    args: &WriterArgs,
    shutdown: &pinring_runtime::shutdown::Shutdown,
) -> Result<u64, ReferenceError> {
    let parent = std::os::unix::process::parent_id();
    let seg = Segment::open(&args.segment, Access::ReadWrite).map_err(|source| match source {
        // The ring's own advice (start a daemon) does not apply: only the bench makes these.
        pinring_ring::RingError::NotFound { path, .. } => ReferenceError::BadSegment {
            name: args.segment.clone(),
            problem: format!("there is no such segment ({})", path.display()),
        },
        source => ReferenceError::Segment {
            name: args.segment.clone(),
            source,
        },
    })?;
    let stop = || shutdown.requested() || std::os::unix::process::parent_id() != parent;
    write_share(&seg, args.index, &stop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pinring_backend::HostBackend;
    use pinring_exit::Coded;

    fn geometry(slots: u32, batches: u64) -> Geometry {
        Geometry {
            slots,
            slot_bytes: 3 * PAGE,
            // Two samples of 4100 bytes (a partial last word in each) and their labels.
            payload: 8216,
            sample_bytes: 4100,
            samples_per_batch: 2,
            batches,
            seed: 7,
        }
    }

    #[test]
    fn the_reference_of_a_pipeline_point_has_its_ring_and_moves_its_bytes() {
        let cfg = crate::bench::run_config(1 << 20, 64, 1 << 30, "ref-geom");
        let g = Geometry::of(&cfg);
        assert_eq!(g.slots, cfg.slots());
        assert_eq!(g.slot_bytes, cfg.slot_bytes());
        assert_eq!(g.payload, 1 << 20);
        assert_eq!(g.batches, 1024);
        assert_eq!(g.bytes(), 1 << 30);
        assert_eq!(g.problem(), None);
        // Header, then one 64-byte flag line per slot, page aligned: 128 + 64 × 64 bytes.
        assert_eq!(g.slots, 64);
        assert_eq!(g.data_offset(), 2 * PAGE);
        let many = Geometry {
            slots: 256,
            ..geometry(256, 1)
        };
        assert_eq!(many.data_offset(), 5 * PAGE);
        assert!(geometry(0, 1).problem().is_some());
        assert!(Geometry {
            payload: 9000,
            ..geometry(4, 1)
        }
        .problem()
        .is_some());
        // The images alone are not a payload: every sample has its label too.
        assert!(Geometry {
            payload: 8200,
            ..geometry(4, 1)
        }
        .problem()
        .is_some());
        // The device buffer: images, then the labels at the next multiple of 16, as the daemon
        // places them.
        let g = geometry(4, 1);
        assert_eq!((g.labels_offset(), g.buffer_bytes()), (8208, 8208 + 16));
        let layout = {
            let mut c = Config::default();
            c.dataset.sample_shape = vec![4100];
            c.dataset.dtype = pinring_data::Dtype::U8;
            c.plan.batch_size = 2;
            c.batch_layout()
        };
        assert_eq!(layout.fields[1].offset, g.labels_offset());
        assert_eq!(layout.total_bytes, g.buffer_bytes());
        assert_eq!(layout.payload_bytes(2), g.payload);
    }

    use pinring_backend::{
        BufferExport, BufferHandoff, CompletionHook, CopyEngine, DeviceKernels, Registration,
        Uploader,
    };
    use std::sync::Mutex;

    /// The host backend, recording the first word of every upload's source bytes: it names the
    /// batch the slot held when its copy was submitted.
    #[derive(Debug, Default)]
    struct Recording {
        host: HostBackend,
        firsts: Arc<Mutex<Vec<u64>>>,
    }

    struct RecordingUploader {
        inner: Box<dyn Uploader>,
        firsts: Arc<Mutex<Vec<u64>>>,
    }

    impl Backend for Recording {
        fn name(&self) -> &'static str {
            "host"
        }

        fn describe(&self) -> String {
            "host: recording uploads".into()
        }

        unsafe fn register(
            &self,
            base: *mut u8,
            len: usize,
            devicemap: bool,
        ) -> Result<Registration, BackendError> {
            // SAFETY: the caller's guarantee about the range is passed on unchanged.
            unsafe { self.host.register(base, len, devicemap) }
        }

        fn raw_copy_gbps(
            &self,
            bytes: usize,
            iters: usize,
            registered: bool,
        ) -> Result<f64, BackendError> {
            self.host.raw_copy_gbps(bytes, iters, registered)
        }

        fn uploader(
            &self,
            buffers: usize,
            buffer_bytes: usize,
            placement: Placement,
        ) -> Result<Box<dyn Uploader>, BackendError> {
            Ok(Box::new(RecordingUploader {
                inner: self.host.uploader(buffers, buffer_bytes, placement)?,
                firsts: Arc::clone(&self.firsts),
            }))
        }
    }

    impl CopyEngine for RecordingUploader {
        unsafe fn submit(&self, job: UploadJob) -> Result<(), BackendError> {
            let mut first = [0u8; 8];
            if job.len >= 8 {
                // SAFETY: the caller guarantees src..src+len is valid and unwritten until the
                // completion arrives; 8 <= len.
                unsafe { std::ptr::copy_nonoverlapping(job.src, first.as_mut_ptr(), 8) };
            }
            self.firsts.lock().unwrap().push(u64::from_le_bytes(first));
            // SAFETY: the caller's guarantee is passed on unchanged.
            unsafe { self.inner.submit(job) }
        }

        fn completions(&self) -> &pinring_backend::Completions {
            self.inner.completions()
        }

        fn set_completion_hook(&self, hook: CompletionHook) {
            self.inner.set_completion_hook(hook);
        }

        fn buffer_count(&self) -> usize {
            self.inner.buffer_count()
        }

        fn buffer_bytes(&self) -> usize {
            self.inner.buffer_bytes()
        }

        fn device_ptr(&self, buffer: usize) -> u64 {
            self.inner.device_ptr(buffer)
        }
    }

    impl BufferHandoff for RecordingUploader {
        fn export(&self, buffer: usize) -> Result<Option<BufferExport>, BackendError> {
            self.inner.export(buffer)
        }

        fn record_ready(&self, buffer: usize) -> Result<(), BackendError> {
            self.inner.record_ready(buffer)
        }

        fn wait_release(&self, buffer: usize, consumer_alive: bool) -> Result<(), BackendError> {
            self.inner.wait_release(buffer, consumer_alive)
        }
    }

    impl DeviceKernels for RecordingUploader {
        fn read_host(
            &self,
            buffer: usize,
            offset: usize,
            len: usize,
            f: &mut dyn FnMut(&[u8]),
        ) -> Result<bool, BackendError> {
            self.inner.read_host(buffer, offset, len, f)
        }

        fn checksum(&self, buffer: usize, offset: usize, len: usize) -> Result<u64, BackendError> {
            self.inner.checksum(buffer, offset, len)
        }

        fn compute(&self, buffer: usize, len: usize) -> Result<(), BackendError> {
            self.inner.compute(buffer, len)
        }

        unsafe fn checksum_mapped(
            &self,
            host_ptr: *const u8,
            len: usize,
        ) -> Result<u64, BackendError> {
            // SAFETY: the caller's guarantee is passed on unchanged.
            unsafe { self.inner.checksum_mapped(host_ptr, len) }
        }

        unsafe fn compute_mapped(&self, host_ptr: *mut u8, len: usize) -> Result<(), BackendError> {
            // SAFETY: the caller's guarantee is passed on unchanged.
            unsafe { self.inner.compute_mapped(host_ptr, len) }
        }
    }

    #[test]
    fn the_reference_uploads_every_batch_once_in_order_and_removes_its_segment() {
        let name = format!("test-ref-{}", std::process::id());
        // 3 writers over 8 slots (uneven shares), 50 batches: six laps and a bit.
        let geom = geometry(8, 50);
        let backend = Recording::default();
        let m = run(&backend, &geom, 3, &name, Spawn::Threads, &|| false).unwrap();
        assert_eq!(m.batches, 50);
        assert_eq!(m.bytes, 50 * 8216);
        assert_eq!(m.bytes, geom.bytes());
        assert!(m.seconds > 0.0 && m.gbps > 0.0, "{m:?}");
        assert!(!pinring_ring::object_path(&name).exists());
        // Each slot's two copies (images, labels) were submitted once, in batch order, from a
        // slot holding that batch: their first words are the first word of the batch's first
        // sample and its label.
        let synthetic = Synthetic::new(7, 4100, 1);
        let want: Vec<u64> = (0..50)
            .flat_map(|batch| {
                [
                    synthetic.sample_words(2 * batch).next_word(),
                    u64::from_le_bytes(synthetic.label_le_bytes(2 * batch)),
                ]
            })
            .collect();
        assert_eq!(*backend.firsts.lock().unwrap(), want);
    }

    #[test]
    fn more_writers_than_slots_leave_the_extra_ones_idle() {
        let name = format!("test-ref-idle-{}", std::process::id());
        let m = run(
            &HostBackend::new(),
            &geometry(2, 9),
            4,
            &name,
            Spawn::Threads,
            &|| false,
        )
        .unwrap();
        assert_eq!(m.batches, 9);
        assert!(!pinring_ring::object_path(&name).exists());
    }

    #[test]
    fn a_failed_run_names_the_writer_and_removes_its_segment_too() {
        let name = format!("test-ref-nospawn-{}", std::process::id());
        let missing = ThisProgram::at("/nonexistent/pinring".into());
        let e = run(
            &HostBackend::new(),
            &geometry(4, 8),
            2,
            &name,
            Spawn::Processes(&missing),
            &|| false,
        )
        .unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, ReferenceError::Spawn { index: 0, .. }), "{msg}");
        assert!(msg.contains("/nonexistent/pinring"), "{msg}");
        assert!(!pinring_ring::object_path(&name).exists());
        // A "writer" that exits at once, without attaching: the run says which one ended and how.
        let name = format!("test-ref-died-{}", std::process::id());
        let e = run(
            &HostBackend::new(),
            &geometry(4, 8),
            1,
            &name,
            Spawn::Processes(&ThisProgram::at("true".into())),
            &|| false,
        )
        .unwrap_err();
        let msg = e.to_string();
        assert!(
            matches!(e, ReferenceError::WriterDied { index: 0, .. }),
            "{msg}"
        );
        assert!(msg.contains("exited with code 0"), "{msg}");
        assert_eq!(e.exit(), Exit::PeerDied);
        assert!(!pinring_ring::object_path(&name).exists());
    }

    #[test]
    fn writers_fill_their_own_slots_with_the_generators_batches() {
        // One lap: 6 slots, 6 batches, 2 writers, no upload thread: this test plays the bench.
        let name = format!("test-ref-fill-{}", std::process::id());
        let geom = geometry(6, 6);
        let seg = make_segment(&geom, 2, &name).unwrap();
        let _published = Published(Arc::clone(&seg));
        let mut writers = Writers::start(Spawn::Threads, &name, 2).unwrap();
        let h = header(&seg);
        while h.attached.load(SeqCst) < 2 {
            futex::wait(&h.attached, h.attached.load(SeqCst), WAIT_SLICE);
        }
        h.phase.store(GO, SeqCst);
        futex::wake_all(&h.phase);
        // Each writer rings the doorbell after each fill: wait on it until all six are FULL.
        loop {
            let seen = h.doorbell.load(SeqCst);
            if (0..6).all(|s| flag(&seg, s).state.load(Acquire) == FULL) {
                break;
            }
            futex::wait_counted(&h.doorbell, &h.doorbell_waiters, seen, WAIT_SLICE);
        }
        let synthetic = Synthetic::new(7, 4100, 1);
        for slot in 0..6u32 {
            let mut got = vec![0u8; 8216];
            // SAFETY: slot `slot` lies inside the mapping and is FULL: no writer touches it.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    slot_ptr(&seg, &geom, slot),
                    got.as_mut_ptr(),
                    got.len(),
                )
            };
            let mut want = vec![0u8; 8216];
            synthetic.fill_part(&[2 * u64::from(slot), 2 * u64::from(slot) + 1], &mut want);
            assert!(got == want, "slot {slot} holds another batch");
        }
        drop(Finish(Arc::clone(&seg)));
        writers.finish().unwrap();
    }

    #[test]
    fn a_writer_refuses_a_segment_that_is_not_a_reference_one() {
        let name = format!("test-ref-bad-{}", std::process::id());
        let mut seg = Segment::create_unnamed(&name, PAGE, 0o600, None).unwrap();
        seg.publish(true).unwrap();
        let seg = Published(Arc::new(seg));
        let e = write_share(&seg.0, 0, &|| false).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, ReferenceError::BadSegment { .. }), "{msg}");
        assert!(
            msg.contains(&name) && msg.contains("run `pinring bench` again"),
            "{msg}"
        );
        assert_eq!(e.exit(), Exit::Ring);
    }
}
