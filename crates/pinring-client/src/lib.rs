//! pinring-client: the trainer's end of a ring.
//!
//! A daemon started with `--sink consumer` hands every whole batch (all its parts uploaded) to
//! one training process through the ring's handoff area. [`Consumer::attach`] joins a ring by
//! name; [`Consumer::next_batch`] yields [`Batch`]es in seq order, each a set of named fields
//! (dtype, shape, address) in one device buffer (or, on the host backend, in host memory inside
//! the ring). A batch's buffer goes back to the daemon when the last [`Lease`] on it drops: on
//! CUDA the release is an event recorded on the consumer's stream after its last use, which the
//! daemon's copy stream waits on before it overwrites the buffer, so neither a slow trainer nor a
//! tensor it keeps for a while ever sees its memory overwritten.
//!
//! ```no_run
//! use pinring_client::{AttachOptions, Consumer};
//! let mut c = Consumer::attach("default", &AttachOptions::default())?;
//! for batch in c.batches(None) {
//!     let batch = batch?;
//!     let images = batch.field("images").unwrap();
//!     // ... images.ptr, images.shape, images.dtype; batch.lease.use_on_stream(stream) ...
//! } // each batch's buffer goes back to the daemon when the batch (its last lease) drops
//! # Ok::<(), pinring_client::ClientError>(())
//! ```
//!
//! docs/CONSUMER.md draws the protocol.

mod copier;
#[cfg(feature = "embedded")]
mod embedded;
mod error;
mod fields;
mod memory;

#[cfg(feature = "embedded")]
pub use embedded::{
    resolve as resolve_embedded, resolve_found as resolve_embedded_found, EmbeddedDaemon,
    EmbeddedOptions,
};
pub use error::ClientError;
pub use fields::{FieldView, Location};
pub use memory::Memory;

use pinring_data::{Config, Spec};
use pinring_ring::handoff::{buffer_state, Filled};
use pinring_ring::{ring_state, Access, ConsumerRing, ProcessId};
use std::sync::atomic::Ordering::{Acquire, Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest single futex wait; liveness and state are checked between waits.
const MAX_WAIT: Duration = Duration::from_millis(100);

/// How to attach.
#[derive(Debug, Clone)]
pub struct AttachOptions {
    /// Resume at this seq (a [`ConsumerState::seq`]); `None`: at the first batch not yet taken.
    pub start_seq: Option<u64>,
    /// The plan fingerprint the resume state was saved under ([`ConsumerState::fingerprint`]);
    /// a ring running another plan is refused.
    pub fingerprint: Option<u64>,
    /// How long to wait for the ring to exist and be READY.
    pub wait_for_ring: Duration,
    /// Where an anonymous ring is (its daemon's `/proc/<pid>/fd/<fd>`, as
    /// [`EmbeddedDaemon::path`] gives it); `None`: the ring named in /dev/shm.
    pub path: Option<std::path::PathBuf>,
}

impl Default for AttachOptions {
    fn default() -> Self {
        AttachOptions {
            start_seq: None,
            fingerprint: None,
            wait_for_ring: Duration::from_secs(30),
            path: None,
        }
    }
}

/// Where a consumer stands: the seq of the next batch it will yield and the plan it belongs to.
/// Loading it into a consumer of a ring with another plan is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsumerState {
    /// First seq of the next batch.
    pub seq: u64,
    /// The plan's fingerprint (dataset and plan settings).
    pub fingerprint: u64,
}

/// The one consumer of a ring.
#[derive(Debug)]
pub struct Consumer {
    shared: Arc<Shared>,
    /// First seq of the next batch to yield (in order).
    next: u64,
    /// One past the plan's last seq.
    end_seq: u64,
    parts: u64,
    batches_per_epoch: u64,
    in_order: bool,
    fingerprint: u64,
    /// Seqs of the ring's run (for counting the unordered end).
    run_batches: u64,
    /// Batch buffers of the ring.
    buffers: u32,
    /// In order: the descriptor looked at first for the next batch, the one after the last
    /// taken. The daemon hands buffers out again in the order they come back, which for a
    /// consumer taking in order is the order it took them, so the next batch is usually there
    /// and one load finds it where a scan of every descriptor read up to 64 lines the daemon
    /// writes.
    hint: u32,
    /// The consumer copies: the thread that gives descriptors back as their copies complete,
    /// and its stop flag.
    releaser: Option<(
        std::thread::JoinHandle<()>,
        Arc<std::sync::atomic::AtomicBool>,
    )>,
}

/// What every lease of a consumer shares: the memory and the ring handle (its consumer lock).
/// The memory is declared first, so it drops first: an engine of this process waits for its
/// copies out of the ring's slots, and unregisters them, before the ring is unmapped.
#[derive(Debug)]
struct Shared {
    memory: Memory,
    ring: ConsumerRing,
    /// The daemon's spec, adopted from the ring.
    spec: Spec,
    fields: fields::Fields,
}

impl Consumer {
    /// Attaches to ring `name` as its one consumer.
    ///
    /// Waits up to `opts.wait_for_ring` for the ring to exist and be READY. Fails if the ring's
    /// daemon hands nothing over (`--sink consumer` missing), if another consumer is attached,
    /// or if `opts.start_seq` is a batch this ring can no longer give (already taken, or not the
    /// first seq of a batch).
    pub fn attach(name: &str, opts: &AttachOptions) -> Result<Consumer, ClientError> {
        Consumer::attach_until(name, opts, &|| false)
    }

    /// [`Consumer::attach`], giving up with [`ClientError::Interrupted`] as soon as `stop` says
    /// so while it waits for the ring: `stop` is asked at least every 100 ms (a command's
    /// SIGTERM flag; Python's `PyErr_CheckSignals`).
    pub fn attach_until(
        name: &str,
        opts: &AttachOptions,
        stop: &dyn Fn() -> bool,
    ) -> Result<Consumer, ClientError> {
        Consumer::attach_telling(
            name,
            opts,
            stop,
            &mut |w| tracing::info!(ring = %w.name, "{w}"),
        )
    }

    /// [`Consumer::attach_until`], telling `waiting` what it waits for, once, when the ring does
    /// not exist yet (or its daemon is gone) as the wait starts: a command prints it for the
    /// person who started it, Python logs it. [`Consumer::attach_until`] logs it at info level.
    pub fn attach_telling(
        name: &str,
        opts: &AttachOptions,
        stop: &dyn Fn() -> bool,
        waiting: &mut dyn FnMut(&pinring_ring::Waiting),
    ) -> Result<Consumer, ClientError> {
        let ring = open_ready(
            name,
            opts.path.as_deref(),
            opts.wait_for_ring,
            stop,
            waiting,
        )?;
        // The daemon's own spec, checked against this ring's header (`Spec::adopt`).
        let spec = ring_spec(&ring)?;
        let (cfg, plan) = (spec.config(), spec.plan());
        let fields = fields::Fields::of(cfg).map_err(|what| ClientError::Corrupt {
            ring: name.into(),
            what,
        })?;
        let fingerprint = ring.fingerprint();
        if let Some(saved) = opts.fingerprint.filter(|&f| f != fingerprint) {
            return Err(ClientError::OtherPlan {
                ring: name.into(),
                saved,
                ring_fingerprint: fingerprint,
            });
        }
        let parts = plan.parts_per_batch();
        let (start, end_seq) = (ring.start_seq(), ring.end_seq());
        ring.attach_consumer(ProcessId::current())?;
        // When this process copies, its engine reads each part from its slot by the plan.
        let decoder = cfg.decoder_spec().map(|spec| copier::DecodeOnCopy {
            spec,
            fail: cfg.dataset.on_bad_sample == pinring_data::OnBadSample::Fail,
            cfg: cfg.clone(),
        });
        let memory = Memory::open(&ring, plan, fields.layout(), decoder)?;
        let in_order = ring.in_order();
        let available = first_available(&ring);
        let next = match opts.start_seq {
            None => available,
            Some(seq) => {
                check_resume(name, seq, available, parts, end_seq, in_order)?;
                seq
            }
        };
        ring.set_taken_next(next);
        let buffers = ring.geometry().handoff.map_or(0, |h| h.buffers);
        let copies = matches!(memory, Memory::Own(_));
        let batches_per_epoch = plan.batches_per_epoch();
        let shared = Arc::new(Shared {
            memory,
            ring,
            spec,
            fields,
        });
        let releaser = if copies {
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let (sh, st) = (Arc::clone(&shared), Arc::clone(&stop));
            let handle = std::thread::Builder::new()
                .name("pinring-release".into())
                .spawn(move || copier::run_releaser(sh, st))
                .map_err(|e| ClientError::Copy {
                    ring: name.into(),
                    what: format!("cannot start the thread that gives copied batches back: {e}"),
                })?;
            Some((handle, stop))
        } else {
            None
        };
        Ok(Consumer {
            shared,
            releaser,
            next,
            end_seq,
            parts,
            batches_per_epoch,
            in_order,
            fingerprint,
            run_batches: end_seq.saturating_sub(start) / parts.max(1),
            buffers,
            hint: 0,
        })
    }

    /// The next batch: in seq order (unordered rings: the lowest handed over). `Ok(None)` at
    /// the end of the plan. Waits for it up to `timeout` (`None`: as long as the daemon lives);
    /// fails if the daemon dies or stops first.
    pub fn next_batch(&mut self, timeout: Option<Duration>) -> Result<Option<Batch>, ClientError> {
        self.next_batch_until(timeout, &|| false)
    }

    /// [`Consumer::next_batch`], giving up with [`ClientError::Interrupted`] as soon as `stop`
    /// says so: it is asked before every wait, at least every 100 ms.
    pub fn next_batch_until(
        &mut self,
        timeout: Option<Duration>,
        stop: &dyn Fn() -> bool,
    ) -> Result<Option<Batch>, ClientError> {
        let start = Instant::now();
        let shared = Arc::clone(&self.shared);
        let ring = &shared.ring;
        loop {
            if let Memory::Own(c) = &shared.memory {
                if let Some(what) = c.failure() {
                    return Err(ClientError::Copy {
                        ring: ring.name().into(),
                        what,
                    });
                }
            }
            if self.in_order && self.next >= self.end_seq {
                return Ok(None);
            }
            if !self.in_order && ring.taken() >= self.run_batches {
                return Ok(None);
            }
            // Acquire: pairs with the daemon's bump after a fill, so a fill after this load
            // makes the wait below return at once.
            let seen = ring.delivery_seen();
            if let Some(batch) = self.try_take()? {
                return Ok(Some(batch));
            }
            if let Memory::Own(c) = &shared.memory {
                // Nothing to take: the batches copied so far get their completion event now,
                // so their slots go back to the loaders while this thread waits.
                c.flush(ring)?;
            }
            let held = self.held();
            if held == self.buffers {
                return Err(ClientError::AllHeld {
                    ring: ring.name().into(),
                    buffers: held,
                    seq: self.next,
                });
            }
            let state = ring.state();
            if state == ring_state::DRAINING || state == ring_state::CLOSED {
                return Err(ClientError::Stopped {
                    ring: ring.name().into(),
                    state: ring_state::name(state),
                    seq: self.next,
                });
            }
            if !ring.daemon_alive()? {
                return Err(ClientError::DaemonGone {
                    ring: ring.name().into(),
                    pid: ring.daemon().pid,
                    seq: self.next,
                });
            }
            if stop() {
                return Err(ClientError::Interrupted {
                    ring: ring.name().into(),
                });
            }
            let mut wait = MAX_WAIT;
            if let Some(t) = timeout {
                let left = t.saturating_sub(start.elapsed());
                if left.is_zero() {
                    return Err(ClientError::Timeout {
                        ring: ring.name().into(),
                        seq: self.next,
                        waited_ms: start.elapsed().as_millis() as u64,
                    });
                }
                wait = wait.min(left);
            }
            ring.wait_delivery(seen, wait);
        }
    }

    /// Takes the next batch if it is handed over; batches below a named resume seq are given
    /// straight back.
    fn try_take(&mut self) -> Result<Option<Batch>, ClientError> {
        let shared = Arc::clone(&self.shared);
        let ring = &shared.ring;
        // The FILLED buffer to take: in order, the one holding `next` (lower ones are skipped);
        // unordered, the lowest seq. In order the hinted descriptor is looked at first; only
        // when it does not hold `next` are they all.
        let mut best: Option<(u32, u32, u64)> = None;
        if self.in_order && self.hint < self.buffers {
            let w = ring.buffer_word(self.hint);
            if w.state == buffer_state::FILLED && ring.buffer_seq(self.hint) == self.next {
                best = Some((self.hint, w.round, self.next));
            }
        }
        let scan = if best.is_none() { self.buffers } else { 0 };
        for i in 0..scan {
            let w = ring.buffer_word(i);
            if w.state != buffer_state::FILLED {
                continue;
            }
            let seq = ring.buffer_seq(i);
            if self.in_order && seq < self.next {
                // Below a named resume point: give it straight back.
                if ring.take_buffer(i, w.round).is_some() {
                    self.count_take(seq);
                    ring.release_buffer(i, w.round);
                    ring.ring_doorbell();
                }
                continue;
            }
            if best.is_none_or(|(_, _, s)| seq < s) {
                best = Some((i, w.round, seq));
            }
        }
        let Some((i, round, seq)) = best else {
            return Ok(None);
        };
        if self.in_order && seq != self.next {
            // The batch we wait for is not handed over yet.
            return Ok(None);
        }
        self.hint = (i + 1) % self.buffers;
        let Memory::Own(copier) = &shared.memory else {
            let Some(f) = ring.take_buffer(i, round) else {
                return Ok(None);
            };
            let batch = self.validated(i, i, f)?;
            self.count_take(f.seq);
            return Ok(Some(batch));
        };
        // The consumer copies: into one of its own buffers, free once its last lease dropped.
        let Some(local) = copier.take_free(ring) else {
            return Ok(None);
        };
        let Some(f) = ring.take_buffer(i, round) else {
            copier.give_back(ring, local);
            return Ok(None);
        };
        // Taken: the daemon books it delivered from now on, whatever happens below.
        self.count_take(f.seq);
        // Checked before any copy: the seq decides which parts are read.
        let batch = match self.validated(i, local, f) {
            Ok(b) => b,
            Err(e) => {
                copier.give_back(ring, local);
                return Err(e);
            }
        };
        // On an error the batch drops, and its lease gives the buffer back.
        copier.copy_batch(ring, i, round, f.seq, local)?;
        Ok(Some(batch))
    }

    /// `(held, buffers)`: the batch buffers this consumer holds now (batches, or tensors made
    /// from them, still alive), and how many there are. A `next_batch` while it holds all of
    /// them is [`ClientError::AllHeld`].
    pub fn buffers_held(&self) -> (u32, u32) {
        (self.held(), self.buffers)
    }

    /// Buffers this consumer holds now (taken, not released; the consumer copies: its own
    /// buffers with a lease alive).
    fn held(&self) -> u32 {
        if let Memory::Own(c) = &self.shared.memory {
            return self.buffers - c.free_count() as u32;
        }
        let ring = &self.shared.ring;
        (0..self.buffers)
            .filter(|&i| ring.buffer_word(i).state == buffer_state::TAKEN)
            .count() as u32
    }

    fn count_take(&mut self, seq: u64) {
        if seq + self.parts > self.next {
            self.next = seq + self.parts;
        }
        self.shared.ring.count_taken(self.next);
    }

    /// Checks what taken descriptor `desc` says against the plan, and makes the batch in
    /// `buffer` (the descriptor's own, or, when the consumer copies, one of its own buffers).
    fn validated(&self, desc: u32, buffer: u32, f: Filled) -> Result<Batch, ClientError> {
        let s = &self.shared;
        let corrupt = |what: String| ClientError::Corrupt {
            ring: s.ring.name().into(),
            what: format!("batch buffer {desc}: {what}"),
        };
        let batch_size = u64::from(s.spec.config().plan.batch_size);
        if f.seq % self.parts != 0 || f.seq >= self.end_seq || f.batch != f.seq / self.parts {
            return Err(corrupt(format!(
                "seq {} / batch {} is not a batch of this plan ({} parts per batch, {} seqs)",
                f.seq, f.batch, self.parts, self.end_seq
            )));
        }
        if f.samples == 0 || u64::from(f.samples) > batch_size {
            return Err(corrupt(format!(
                "{} samples, the plan's batches have 1 to {batch_size}",
                f.samples
            )));
        }
        let views = s
            .fields
            .views(f.samples, &s.memory, buffer)
            .map_err(corrupt)?;
        if f.bytes > s.memory.buffer_bytes() {
            return Err(corrupt(format!(
                "{} bytes, the buffers hold {}",
                f.bytes,
                s.memory.buffer_bytes()
            )));
        }
        Ok(Batch {
            seq: f.seq,
            batch: f.batch,
            epoch: f.epoch,
            index_in_epoch: f.index_in_epoch,
            samples: f.samples,
            fields: views,
            lease: Arc::new(Lease {
                shared: Arc::clone(&self.shared),
                buffer,
                round: f.round,
                stream: std::sync::atomic::AtomicU64::new(0),
                waited: std::sync::atomic::AtomicU64::new(u64::MAX),
            }),
        })
    }

    /// The batches to the end of the plan, as an iterator: each item is a batch, or the error
    /// that ended the stream (the iterator ends after it). Each wait lasts up to `timeout`.
    pub fn batches(&mut self, timeout: Option<Duration>) -> Batches<'_> {
        Batches {
            consumer: self,
            timeout,
            done: false,
        }
    }

    /// Where this consumer stands (for a checkpoint).
    pub fn state(&self) -> ConsumerState {
        ConsumerState {
            seq: self.next,
            fingerprint: self.fingerprint,
        }
    }

    /// Batches per epoch of the plan.
    pub fn batches_per_epoch(&self) -> u64 {
        self.batches_per_epoch
    }

    /// Seqs per batch (a batch's seq is its first part's).
    pub fn parts_per_batch(&self) -> u64 {
        self.parts
    }

    /// One past the plan's last seq.
    pub fn end_seq(&self) -> u64 {
        self.end_seq
    }

    /// The ring's config, as its daemon resolved it.
    pub fn config(&self) -> &Config {
        self.shared.spec.config()
    }

    /// The ring's spec, as its daemon resolved and stored it.
    pub fn spec(&self) -> &Spec {
        &self.shared.spec
    }

    /// How this process's copier decoded the images its ring carries encoded
    /// (`[dataset.image] decode = "gpu"`), per way; `None` where this process decodes none (a
    /// ring of pixels, or one whose daemon copies: its summary and /metrics count them).
    pub fn decode_counts(&self) -> Option<pinring_backend::DecodeCounts> {
        match &self.shared.memory {
            Memory::Own(c) if c.decodes() => Some(c.decode_counts()),
            _ => None,
        }
    }

    /// The ring this consumer reads.
    pub fn ring(&self) -> &ConsumerRing {
        &self.shared.ring
    }

    /// The memory the batches live in (host, or a CUDA device).
    pub fn location(&self) -> Location {
        self.shared.memory.location()
    }
}

/// [`Consumer::batches`].
#[derive(Debug)]
pub struct Batches<'a> {
    consumer: &'a mut Consumer,
    timeout: Option<Duration>,
    done: bool,
}

impl Iterator for Batches<'_> {
    type Item = Result<Batch, ClientError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let got = self.consumer.next_batch(self.timeout).transpose();
        self.done = !matches!(got, Some(Ok(_)));
        got
    }
}

/// One whole batch, taken from the daemon; its buffer stays the consumer's while any clone of
/// its [`Lease`] lives.
#[derive(Debug)]
pub struct Batch {
    /// First seq of the batch (its part 0).
    pub seq: u64,
    /// Batch number.
    pub batch: u64,
    /// Epoch.
    pub epoch: u32,
    /// Index in the epoch.
    pub index_in_epoch: u64,
    /// Samples in the batch.
    pub samples: u32,
    /// The batch's fields.
    pub fields: Vec<FieldView>,
    /// The batch's hold on its buffer.
    pub lease: Arc<Lease>,
}

impl Batch {
    /// The field called `name`.
    pub fn field(&self, name: &str) -> Option<&FieldView> {
        self.fields.iter().find(|f| f.name == name)
    }

    /// The bytes of field `name` when the batch is in host memory (`None` for device memory or
    /// an unknown name). Borrowed from the batch, whose lease keeps the buffer this consumer's.
    pub fn host_bytes(&self, name: &str) -> Option<&[u8]> {
        let f = self.field(name)?;
        if f.location != Location::Host {
            return None;
        }
        // SAFETY: a host field's range lies inside its buffer (checked against the buffer size
        // when the batch was taken), and the buffer inside the ring's mapping, which the lease's
        // Arc keeps mapped for at least as long as `self` lives. The buffer is TAKEN by this
        // consumer, so no conforming process writes it until the lease drops. Any byte is a
        // valid u8.
        Some(unsafe { std::slice::from_raw_parts(f.ptr as *const u8, f.bytes as usize) })
    }
}

/// A hold on one batch buffer: when the last clone drops, the buffer goes back to the daemon
/// (CUDA: after a release event recorded on the stream last given to [`Lease::use_on_stream`]).
#[derive(Debug)]
pub struct Lease {
    shared: Arc<Shared>,
    buffer: u32,
    round: u32,
    /// The stream of the batch's last use (raw CUstream; 0 = the legacy default stream).
    stream: std::sync::atomic::AtomicU64,
    /// The last stream made to wait for the batch (`u64::MAX`: none yet): a batch's fields are
    /// each asked for the same stream, and one wait orders everything after it on that stream.
    waited: std::sync::atomic::AtomicU64,
}

impl Lease {
    /// Makes `stream` wait (on the device) until the batch is in its buffer, and records it as
    /// the stream the release is ordered after. Host memory: nothing to wait for.
    pub fn use_on_stream(&self, stream: u64) -> Result<(), ClientError> {
        self.stream.store(stream, Relaxed);
        // Recorded only once the wait is queued: a thread that finds it has its stream ordered
        // after the batch's copies already.
        if self.waited.load(Acquire) == stream {
            return Ok(());
        }
        self.shared
            .memory
            .wait_ready(self.buffer, stream)
            .map_err(|source| ClientError::Backend {
                ring: self.shared.ring.name().into(),
                source,
            })?;
        self.waited
            .store(stream, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    /// The buffer index (for messages and tests).
    pub fn buffer(&self) -> u32 {
        self.buffer
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let ring = &self.shared.ring;
        let stream = self.stream.load(Relaxed);
        let released = self.shared.memory.record_release(self.buffer, stream);
        if let (Memory::Own(c), Ok(())) = (&self.shared.memory, &released) {
            // The consumer's own buffer: the next copy into it waits for that release.
            c.give_back(ring, self.buffer);
            return;
        }
        if let Err(e) = released {
            // The daemon would wait on an event that was never recorded, which fires at once:
            // the buffer could be overwritten while the stream still reads it. Keep the buffer.
            tracing::error!(ring = %ring.name(), buffer = self.buffer, error = %e,
                "cannot record the release event of a batch buffer; keeping the buffer");
            return;
        }
        if !ring.release_buffer(self.buffer, self.round) {
            tracing::warn!(ring = %ring.name(), buffer = self.buffer,
                "batch buffer was taken back before its release (the ring thought this \
                 consumer dead)");
        }
        ring.ring_doorbell();
    }
}

/// Opens ring `name` once it exists, is READY and has a live daemon (the loaders' own attach,
/// waiting up to `wait`, telling `waiting` what it waits for), and checks that it hands
/// batches over.
fn open_ready(
    name: &str,
    at: Option<&std::path::Path>,
    wait: Duration,
    stop: &dyn Fn() -> bool,
    waiting: &mut dyn FnMut(&pinring_ring::Waiting),
) -> Result<ConsumerRing, ClientError> {
    let Some(ring) =
        pinring_ring::attach_at_unless(name, at, Access::ReadWrite, wait, stop, |w| waiting(w))?
    else {
        return Err(ClientError::Interrupted { ring: name.into() });
    };
    Ok(ConsumerRing::attach(ring)?)
}

/// The spec the daemon stored in the ring, adopted: decoded and checked against the ring's
/// header.
fn ring_spec(ring: &ConsumerRing) -> Result<Spec, ClientError> {
    let adopted = Spec::adopt_from(ring).ok_or_else(|| {
        ClientError::Ring(pinring_ring::RingError::NoHandoff {
            name: ring.name().into(),
        })
    })?;
    Ok(adopted?)
}

/// The lowest seq a consumer attaching now can still get: the lowest handed over and not taken,
/// else the next the daemon will hand over.
fn first_available(ring: &ConsumerRing) -> u64 {
    // Acquire: pairs with the daemon's Release of filled_next, so every batch below it is seen
    // FILLED (or taken: by nobody now, this consumer holds the lock).
    let mut low = ring.filled_next();
    for i in 0..ring.geometry().handoff.map_or(0, |h| h.buffers) {
        if ring.buffer_word(i).state == buffer_state::FILLED {
            low = low.min(ring.buffer_seq(i));
        }
    }
    low
}

fn check_resume(
    ring: &str,
    seq: u64,
    available: u64,
    parts: u64,
    end_seq: u64,
    in_order: bool,
) -> Result<(), ClientError> {
    let bad = |why: String| ClientError::Resume {
        ring: ring.into(),
        seq,
        why,
    };
    if !in_order {
        return Err(bad(
            "the ring delivers unordered (ring.in_order = false), so a seq does not say which \
             batches came before; resume needs an in-order ring"
                .into(),
        ));
    }
    if seq % parts != 0 {
        return Err(bad(format!(
            "it is part {} of a batch cut into {parts} parts; a consumer state's seq is always \
             a batch's first part",
            seq % parts
        )));
    }
    if seq > end_seq {
        return Err(bad(format!("the plan ends at seq {end_seq}")));
    }
    if seq < available {
        return Err(bad(format!(
            "this ring has already handed over every batch below seq {available}; restart its \
             daemon with --start-seq {seq} to go back"
        )));
    }
    Ok(())
}

impl Drop for Consumer {
    fn drop(&mut self) {
        self.shared.ring.set_taken_next(self.next);
        if let Some((handle, stop)) = self.releaser.take() {
            // It gives back what is still being copied, then stops.
            stop.store(true, Relaxed);
            let _ = handle.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resume_checks_name_the_problem_and_the_fix() {
        let e = check_resume("r", 8, 16, 4, 100, true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--start-seq 8"), "{e}");
        let e = check_resume("r", 18, 16, 4, 100, true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("part 2"), "{e}");
        let e = check_resume("r", 16, 16, 4, 100, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unordered"), "{e}");
        let e = check_resume("r", 104, 16, 4, 100, true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("ends at seq 100"), "{e}");
        check_resume("r", 16, 16, 4, 100, true).unwrap();
        check_resume("r", 40, 16, 4, 100, true).unwrap();
    }
}
