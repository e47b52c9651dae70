//! Consumer copies (`daemon.copies = "consumer"`, the default for an attached trainer): this
//! process copies each batch out of the ring's slots into batch buffers of its own, with an
//! upload engine of its own, in its own CUDA context (the device's primary context, torch's).
//!
//! The daemon lists each batch's slots in its buffer's row of the part table and holds them
//! (UPLOADING) from the fill until the buffer's descriptor comes back. The consumer takes the
//! descriptor, copies every part into one of its own buffers, and gives the descriptor back
//! (RELEASED) as soon as the copies have completed: the slots go back to the loaders then, not
//! when the trainer is done with the batch. Its own buffer stays the trainer's while a lease on
//! it lives, exactly as a daemon's buffer would.
//!
//! Each batch has a ready event of its own (the trainer's stream waits for it), but the batches
//! taken in a row share one completion event, as the daemon's parts do: it is recorded after a
//! quarter of the ring's slots or 8 MiB of copies (the engine's bound), before the consumer
//! waits for the daemon, or by the release thread [`FLUSH_AFTER`] after the oldest copy
//! without one. The release thread gives back every descriptor the event completes and rings
//! the daemon's doorbell once for them.
//!
//! Why: two CUDA contexts on one GPU are time-sliced, so a daemon copying in its context while
//! the trainer computes in its own cost the trainer a third of the copy rate
//! (docs/ARCHITECTURE.md, "Who copies for an attached trainer"). Here only the trainer's
//! context works on the GPU.

use crate::{ClientError, Location};
use pinring_backend::{BackendKind, Completion, Registration, UploadJob, Uploader};
use pinring_data::{BatchLayout, Plan};
use pinring_ring::{ConsumerRing, SlotState};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Longest wait of the release thread before it looks at its stop flag again.
const RELEASE_POLL: Duration = Duration::from_millis(100);
/// Batches copied without a completion event of their own wait at most this long for one: the
/// release thread then flushes them, so a trainer that takes a batch and computes for a while
/// still gives its slots back within this time. A trainer taking batches faster shares one event
/// among every batch it took in this time (or in a quarter of the ring, whichever comes first).
const FLUSH_AFTER: Duration = Duration::from_micros(200);
/// How long dropping a consumer waits for its copies in flight to finish.
const DRAIN_ON_DROP: Duration = Duration::from_secs(5);

/// The copies in flight, shared with the release thread.
#[derive(Debug, Default)]
struct Books {
    /// By descriptor: the batch being copied out of its slots.
    copying: Vec<Option<Copying>>,
    /// The first copy that failed.
    failed: Option<String>,
    /// Slots read by copies queued since the last flush (no completion event after them yet).
    unflushed_parts: usize,
    /// When the first of those copies was queued.
    unflushed_since: Option<Instant>,
    /// Threads waiting on `copied` (the host backend's copy_batch): completions notify only
    /// when one does, which saves a system call per batch on CUDA.
    waiters: usize,
}

/// A batch whose copies are in flight.
#[derive(Debug, Clone, Copy)]
struct Copying {
    /// Round of the descriptor's fill (its release names it).
    round: u32,
    /// Completions the engine announced (`None` until the submit returned).
    announced: Option<usize>,
    /// Completions arrived.
    arrived: usize,
}

/// What one batch's copies are worked out with (reused).
#[derive(Debug)]
struct Scratch {
    /// The ring's plan: which samples, and so which bytes, each part holds.
    plan: Plan,
    /// A part's sample ids (unused: the plan fills them).
    samples: Vec<u64>,
    /// The jobs of the batch being submitted.
    jobs: Vec<UploadJob>,
}

/// A ring that carries its images encoded (`[dataset.image] decode = "gpu"`): the spec its
/// samples are decoded to, and whether a sample that does not decode ends the run
/// (`dataset.on_bad_sample = "fail"`) rather than being delivered as zeros with a warning.
#[derive(Debug, Clone)]
pub(crate) struct DecodeOnCopy {
    pub(crate) spec: pinring_backend::decode::SampleSpec,
    pub(crate) fail: bool,
    /// The ring's config, which names a sample's file (`Config::describe_origin`).
    pub(crate) cfg: pinring_data::Config,
}

/// This process's copies out of the ring.
pub struct Copier {
    engine: Arc<dyn Uploader>,
    /// The ring's slots, registered with this process's context (CUDA); dropped before the
    /// engine's buffers and the ring's mapping (the `Shared` field order).
    registration: Option<Registration>,
    location: Location,
    /// Own buffers whose last lease dropped (their release recorded), oldest first.
    free: Mutex<VecDeque<u32>>,
    books: Mutex<Books>,
    copied: Condvar,
    /// Where each field of a batch lies in a buffer (and each part's chunks in its slot).
    layout: BatchLayout,
    /// Whether a sample that does not decode fails the run, and the config that names its
    /// file (`DecodeOnCopy`); `None` for a ring of pixels.
    decoding: Option<(bool, pinring_data::Config)>,
    scratch: Mutex<Scratch>,
    /// Slots whose copies may share one completion event: a quarter of the ring
    /// (`pinring_backend::SIGNAL_SPAN_DIVISOR`), so the loaders always have the rest to fill.
    flush_parts: usize,
}

impl std::fmt::Debug for Copier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Copier")
            .field("location", &self.location)
            .field("buffers", &self.engine.buffer_count())
            .field("registered", &self.registration.is_some())
            .finish()
    }
}

impl Copier {
    /// Opens an engine of `buffers` buffers of `buffer_bytes` on the ring's device (host
    /// memory on the host backend) and registers the ring's slots with it; `plan` and `layout`
    /// (the ring's) say where each part's bytes lie.
    pub(crate) fn open(
        ring: &ConsumerRing,
        cuda: Option<u32>,
        buffers: u32,
        buffer_bytes: u64,
        plan: &Plan,
        layout: &BatchLayout,
        decoder: Option<DecodeOnCopy>,
    ) -> Result<Copier, ClientError> {
        let backend_err = |source| ClientError::Backend {
            ring: ring.name().into(),
            source,
        };
        let (kind, device) = match cuda {
            Some(d) => (BackendKind::Cuda, d),
            None => (BackendKind::Host, 0),
        };
        let selected = pinring_backend::select(kind, device as usize).map_err(backend_err)?;
        let span = ring.registration_span();
        // SAFETY: the data area is the ring's live shared mapping; the registration is dropped
        // before the mapping (Shared's field order puts the memory before the ring).
        let registration =
            unsafe { selected.backend.register(span.0, span.1, false) }.map_err(backend_err)?;
        let engine: Arc<dyn Uploader> = Arc::from(
            selected
                .backend
                .uploader(
                    buffers as usize,
                    buffer_bytes as usize,
                    pinring_backend::Placement::Contiguous,
                )
                .map_err(backend_err)?,
        );
        engine.set_source_ring(ring.geometry().slot_count as usize);
        if let Some(d) = &decoder {
            // The ring carries its images encoded: this engine decodes them as it copies.
            engine.set_decoder(d.spec).map_err(backend_err)?;
        }
        for i in 0..buffers as usize {
            engine.share_local(i).map_err(backend_err)?;
        }
        let descs = ring.geometry().handoff.map_or(0, |h| h.buffers) as usize;
        Ok(Copier {
            engine,
            registration: Some(registration),
            location: cuda.map_or(Location::Host, Location::Cuda),
            free: Mutex::new((0..buffers).collect()),
            books: Mutex::new(Books {
                copying: vec![None; descs],
                failed: None,
                unflushed_parts: 0,
                unflushed_since: None,
                waiters: 0,
            }),
            copied: Condvar::new(),
            layout: layout.clone(),
            decoding: decoder.map(|d| (d.fail, d.cfg)),
            scratch: Mutex::new(Scratch {
                plan: plan.clone(),
                samples: Vec::new(),
                jobs: Vec::new(),
            }),
            flush_parts: (ring.geometry().slot_count as usize
                / pinring_backend::SIGNAL_SPAN_DIVISOR)
                .max(1),
        })
    }

    /// The engine (its buffers' addresses and events).
    pub(crate) fn engine(&self) -> &dyn Uploader {
        &*self.engine
    }

    /// Where the buffers are.
    pub(crate) fn location(&self) -> Location {
        self.location
    }

    /// An own buffer free for the next batch, if any.
    pub(crate) fn take_free(&self, ring: &ConsumerRing) -> Option<u32> {
        let mut free = lock(&self.free);
        let got = free.pop_front();
        self.publish_held(ring, free.len());
        got
    }

    /// Shows `pinring status` how many own buffers hold a batch.
    fn publish_held(&self, ring: &ConsumerRing, free: usize) {
        let held = self.engine.buffer_count().saturating_sub(free);
        ring.set_own_held(held as u32);
    }

    /// Own buffers free now.
    pub(crate) fn free_count(&self) -> usize {
        lock(&self.free).len()
    }

    /// A lease on own buffer `i` dropped (its release already recorded on the trainer's stream).
    pub(crate) fn give_back(&self, ring: &ConsumerRing, i: u32) {
        let mut free = lock(&self.free);
        free.push_back(i);
        self.publish_held(ring, free.len());
    }

    /// The first copy that failed, as the error to report.
    pub(crate) fn failure(&self) -> Option<String> {
        lock(&self.books).failed.clone()
    }

    /// The copies of the batch that descriptor `desc` lists (its first part `seq`) into own
    /// buffer `local`, made into `scratch.jobs`: each part's from the slot the part table names,
    /// after checking that the daemon holds that slot for that part's seq and that every copy
    /// lies inside it. Returns the batch's parts.
    fn batch_jobs(
        &self,
        ring: &ConsumerRing,
        desc: u32,
        seq: u64,
        local: u32,
        scratch: &mut Scratch,
    ) -> Result<u64, ClientError> {
        let corrupt = |what: String| ClientError::Corrupt {
            ring: ring.name().into(),
            what: format!("batch buffer {desc}: {what}"),
        };
        let g = ring.geometry();
        let Scratch {
            plan,
            samples,
            jobs,
        } = scratch;
        let parts = plan.parts_per_batch();
        jobs.clear();
        for p in 0..parts {
            let part_seq = seq + p;
            let part = plan
                .part_into(part_seq, samples)
                .map_err(|e| corrupt(format!("seq {part_seq} is not in the plan: {e}")))?;
            let slot = ring.part_slot(desc, p as u32).ok_or_else(|| {
                corrupt(format!(
                    "part {p} has no entry in the part table ({parts} parts per batch)"
                ))
            })?;
            if slot >= g.slot_count {
                return Err(corrupt(format!(
                    "part {p} names slot {slot}, the ring has {}",
                    g.slot_count
                )));
            }
            let view = ring.slot_view(slot);
            if view.state != Some(SlotState::Uploading) || view.seq != part_seq {
                return Err(corrupt(format!(
                    "part {p} names slot {slot}, which holds seq {} in state {:?}, not seq \
                     {part_seq} held by the daemon",
                    view.seq, view.state
                )));
            }
            let base = ring.copy_source(slot);
            for c in self
                .layout
                .part_copies(part.samples, part.first_in_batch, part.bytes)
            {
                if c.len == 0 {
                    continue;
                }
                if c.src_offset.saturating_add(c.len) > g.slot_bytes {
                    return Err(corrupt(format!(
                        "part {p}'s field {} would be read past its slot's {} bytes",
                        c.field, g.slot_bytes
                    )));
                }
                jobs.push(UploadJob {
                    tag: u64::from(desc),
                    // Inside the slot: checked against the slot size just above.
                    src: base.wrapping_add(c.src_offset as usize),
                    len: c.len as usize,
                    buffer: local as usize,
                    dst_offset: c.dst_offset as usize,
                    decode: pinring_backend::Decode::of(&c, &self.layout),
                });
            }
        }
        Ok(parts)
    }

    /// Copies the batch that descriptor `desc` (taken in `round`) lists into own buffer `local`:
    /// every part from the slot the part table names, after checking that the daemon holds that
    /// slot for that part's seq. The descriptor goes back to the daemon when the copies are done
    /// (the release thread). Returns once the copies are queued; on the host backend, once they
    /// are done.
    pub(crate) fn copy_batch(
        &self,
        ring: &ConsumerRing,
        desc: u32,
        round: u32,
        seq: u64,
        local: u32,
    ) -> Result<(), ClientError> {
        let backend_err = |source| ClientError::Backend {
            ring: ring.name().into(),
            source,
        };
        let mut scratch = lock(&self.scratch);
        let parts = self.batch_jobs(ring, desc, seq, local, &mut scratch)?;
        lock(&self.books).copying[desc as usize] = Some(Copying {
            round,
            announced: None,
            arrived: 0,
        });
        // The next copies into the buffer wait (on the device) for the trainer's last use of it.
        self.engine
            .wait_release(local as usize, true)
            .map_err(backend_err)?;
        // SAFETY: every source lies inside a slot the daemon holds for this batch (checked by
        // batch_jobs) and does not hand out again until this descriptor is released, which the
        // release thread does only after every completion announced here has arrived. The
        // mapping outlives the engine (Shared's field order).
        let announced = unsafe { self.engine.submit_group_deferred(&scratch.jobs) };
        drop(scratch);
        let announced = announced.map_err(backend_err)?;
        self.engine
            .record_ready(local as usize)
            .map_err(backend_err)?;
        // The completion event that gives the descriptor back is shared with the batches taken
        // next: the engine records one per quarter of the ring or 8 MiB of copies, this thread
        // before it waits for the daemon, the release thread after FLUSH_AFTER. The ready event
        // above is the batch's own, so the trainer never waits for a later batch.
        let (flush, notify) = {
            let mut books = lock(&self.books);
            if let Some(c) = books.copying[desc as usize].as_mut() {
                c.announced = Some(announced);
            }
            // The host engine signals every copy as it completes: nothing waits for a flush.
            if self.location != Location::Host {
                books.unflushed_parts += parts as usize;
                books.unflushed_since.get_or_insert_with(Instant::now);
            }
            let done = finish_if_done(&mut books, ring, desc);
            (
                books.unflushed_parts >= self.flush_parts,
                done && books.waiters > 0,
            )
        };
        if notify {
            self.copied.notify_all();
        }
        if flush {
            self.flush(ring)?;
        }
        if self.location == Location::Host {
            self.wait_copied(ring, desc)?;
        }
        Ok(())
    }

    /// Gives every copy queued so far a completion event, so that its descriptor comes back
    /// once it is done.
    pub(crate) fn flush(&self, ring: &ConsumerRing) -> Result<(), ClientError> {
        {
            let mut books = lock(&self.books);
            if books.unflushed_since.take().is_none() {
                return Ok(());
            }
            books.unflushed_parts = 0;
        }
        // Every copy counted before the reset above was queued before it, so this flush
        // signals it; one counted after is flushed later.
        self.engine.flush().map_err(|source| ClientError::Backend {
            ring: ring.name().into(),
            source,
        })
    }

    /// When the oldest copy without a completion event was queued.
    fn unflushed_since(&self) -> Option<Instant> {
        lock(&self.books).unflushed_since
    }

    /// Waits until the copies out of descriptor `desc` are done.
    fn wait_copied(&self, ring: &ConsumerRing, desc: u32) -> Result<(), ClientError> {
        let mut books = lock(&self.books);
        while books.copying[desc as usize].is_some() {
            if let Some(f) = &books.failed {
                return Err(ClientError::Copy {
                    ring: ring.name().into(),
                    what: f.clone(),
                });
            }
            books.waiters += 1;
            books = self
                .copied
                .wait_timeout(books, RELEASE_POLL)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
            books.waiters -= 1;
        }
        Ok(())
    }

    /// Books the completions that arrived: the last of a batch gives its descriptor back, and
    /// the daemon is rung once for all of them.
    fn arrived(&self, ring: &ConsumerRing, arrived: &mut Vec<Completion>) {
        let (released, notify) = {
            let mut books = lock(&self.books);
            let mut released = false;
            for c in arrived.drain(..) {
                let desc = c.tag as u32;
                if let Err(e) = &c.result {
                    books.failed.get_or_insert_with(|| {
                        format!("copying a batch out of the ring's slots failed: {e}")
                    });
                    released = true;
                }
                let Some(copying) = books
                    .copying
                    .get_mut(desc as usize)
                    .and_then(Option::as_mut)
                else {
                    continue;
                };
                copying.arrived += 1;
                released |= finish_if_done(&mut books, ring, desc);
            }
            (released, released && books.waiters > 0)
        };
        if released {
            ring.ring_doorbell();
        }
        if notify {
            self.copied.notify_all();
        }
    }

    /// Samples carried encoded that did not decode (zeros in their place): each a warning; with
    /// `dataset.on_bad_sample = "fail"` the first is this copier's failure, which the batch's
    /// wait reports (its completions are booked after this).
    fn decode_faults(&self, ring: &ConsumerRing, faults: Vec<pinring_backend::DecodeFault>) {
        let Some((fail, cfg)) = &self.decoding else {
            return;
        };
        for f in faults {
            let what = format!(
                "sample {} of a part of descriptor {} did not decode ({}): {}",
                f.sample,
                f.tag,
                cfg.describe_origin(f.at),
                f.problem
            );
            if *fail {
                lock(&self.books).failed.get_or_insert_with(|| {
                    format!(
                        "{what}; dataset.on_bad_sample = \"fail\" stops the run (set it to \
                         \"skip\" to train on with zeros in its place)"
                    )
                });
                continue;
            }
            tracing::warn!(ring = %ring.name(), sample = f.sample, "{what}; written as zeros (dataset.on_bad_sample = \"skip\")");
        }
    }

    /// Whether the ring carries images encoded, which this copier decodes.
    pub(crate) fn decodes(&self) -> bool {
        self.layout.encoded_field().is_some()
    }

    /// How this process's engine decoded the samples it copied, per way.
    pub(crate) fn decode_counts(&self) -> pinring_backend::DecodeCounts {
        self.engine.decode_counts()
    }

    /// Whether no copy is in flight.
    fn idle(&self) -> bool {
        lock(&self.books).copying.iter().all(Option::is_none)
    }
}

/// Gives descriptor `desc` back once every completion its copies announced has arrived;
/// whether it did (the caller rings the daemon's doorbell).
fn finish_if_done(books: &mut Books, ring: &ConsumerRing, desc: u32) -> bool {
    let Some(c) = books.copying[desc as usize] else {
        return false;
    };
    if c.announced != Some(c.arrived) {
        return false;
    }
    books.copying[desc as usize] = None;
    if !ring.release_buffer(desc, c.round) {
        tracing::warn!(ring = %ring.name(), buffer = desc,
            "batch buffer was taken back before its copies were done (the ring thought this \
             consumer dead)");
    }
    true
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Each critical section leaves the books consistent; a panic in one leaves them usable.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The release thread: takes the engine's completions and gives each batch's descriptor back
/// to the daemon as soon as its copies are done, whatever the trainer is doing meanwhile. It
/// stops when `stop` is set and no copy is in flight (or `DRAIN_ON_DROP` after `stop`).
pub(crate) fn run_releaser(shared: Arc<crate::Shared>, stop: Arc<AtomicBool>) {
    let crate::Memory::Own(copier) = &shared.memory else {
        return;
    };
    let ring = &shared.ring;
    let completions = copier.engine.completions();
    let mut stopping: Option<Instant> = None;
    let mut arrived = Vec::new();
    loop {
        // Copies without a completion event yet are flushed once FLUSH_AFTER old.
        let wait = match copier.unflushed_since() {
            Some(since) => FLUSH_AFTER.saturating_sub(since.elapsed()),
            None => RELEASE_POLL,
        };
        match completions.recv_timeout(wait) {
            Ok(c) => {
                arrived.push(c);
                // The rest of the run that came with it, and any other run already there.
                let _ = completions.drain_into(&mut arrived);
                // Samples carried encoded that did not decode: zeros in their place, told here.
                let faults = if copier.layout.encoded_field().is_some() {
                    copier.engine.take_decode_faults()
                } else {
                    Vec::new()
                };
                copier.decode_faults(ring, faults);
                copier.arrived(ring, &mut arrived);
            }
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return,
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
        }
        let stopping_now = stop.load(Relaxed);
        let due = copier
            .unflushed_since()
            .is_some_and(|since| stopping_now || since.elapsed() >= FLUSH_AFTER);
        if due {
            if let Err(e) = copier.flush(ring) {
                lock(&copier.books)
                    .failed
                    .get_or_insert_with(|| e.to_string());
            }
        }
        if stopping_now {
            let since = *stopping.get_or_insert_with(Instant::now);
            if copier.idle() || since.elapsed() >= DRAIN_ON_DROP {
                return;
            }
        }
    }
}
