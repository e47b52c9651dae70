//! The upload engine: [`CudaUploader`] owns the device buffers, the copy streams and the
//! per-buffer guards. `submit_group_deferred` is the hot path: each of a part's copies, one per
//! registered chunk its source touches (usually one), is held for the copy stream or, under
//! [`SMALL_COPY_BYTES`], the small-copy stream. Once [`EVENT_GROUPS`] groups or [`EVENT_BYTES`]
//! bytes are held ([`LARGE_EVENT_BYTES`] for groups of [`LARGE_GROUP_BYTES`] or more), or at
//! `flush`, each stream's held copies go to the driver in one `cuMemcpyBatchAsync` call, then
//! one event record covers every group before it, both streams' copies, and the groups enter the
//! completion queue. Where the driver lacks the batch call (before CUDA 12.8), each copy is a
//! `cuMemcpyHtoDAsync` of its own, issued at once. The completion thread (`completion.rs`) looks
//! at the events after naps timed by the copy engine's pace (no blocking-sync waits: see
//! `completion::wait_polling`). docs/ARCHITECTURE.md, "Upload signals", has the measurements
//! behind each of these.
//!
//! # The device-buffer guard
//! Each buffer is guarded by `crate::guard`, as on the host backend: a copy into a buffer and a
//! kernel over it are never in flight together, even if a caller got the protocol wrong. The
//! completion thread ends an upload only after the upload's event has completed, so a reader
//! that sees no pending upload launches its kernel after the copy has finished on the device. A
//! reader holds its count until its kernel has been waited for (if that wait itself fails, the
//! count is released with the error: the driver fails a wait for a broken context, in which no
//! later copy succeeds either). `read_host` reads nothing on this backend (the host cannot read
//! device memory), and the zero-copy calls read ring slots, not device buffers, so neither takes
//! a count.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};
use cudarc::driver::{sys, CudaContext, CudaSlice, CudaStream, DriverError};

use super::completion::{self, Group, InFlight};
use super::decoder::GpuDecoder;
use super::ipc::Exported;
use super::kernels::{KernelState, Span};
use super::{gib, raw, ChunkTable, CudaBackend};
use crate::decode::Decoder as _;
use crate::error::cuda_error;
use crate::guard::{check_job, Guards, Reading};
use crate::host::{check_checksum_offset, check_range};
use crate::{
    BackendError, BufferExport, BufferHandoff, CopyEngine, DeviceKernels, Placement, UploadJob,
};

/// Upload engine of the CUDA backend.
#[derive(Debug)]
pub struct CudaUploader {
    pub(super) ctx: Arc<CudaContext>,
    pub(super) device: usize,
    pub(super) sm_count: u32,
    pub(super) buffer_bytes: usize,
    pub(super) buffers: Vec<DeviceBuffer>,
    /// Device buffers an event's groups may copy into: half the buffers (an event over every
    /// buffer would leave none to fill while its copies run), at least one.
    pub(super) event_buffers: usize,
    /// Deferred groups an event may cover: [`EVENT_GROUPS`], or fewer for a small source ring
    /// (`CopyEngine::set_source_ring`).
    pub(super) event_groups: AtomicUsize,
    /// The backend's registered chunks: copies are split at their boundaries.
    pub(super) chunks: Arc<ChunkTable>,
    /// The per-buffer pending and reader counts (module docs); shared with the completion
    /// thread, which ends uploads.
    pub(super) guards: Arc<Guards>,
    pub(super) copy_stream: Arc<CudaStream>,
    /// Where copies under [`SMALL_COPY_BYTES`] go; the copy stream waits for it before each
    /// of its events, so an event covers the small copies queued before it too.
    pub(super) small_stream: Arc<CudaStream>,
    /// Recorded on the small-copy stream for the copy stream to wait on.
    small_mark: raw::Event,
    pub(super) kernel_stream: Arc<CudaStream>,
    pub(super) inflight: Option<Sender<InFlight>>,
    /// Events handed back by the completion thread for reuse (all to be looked at).
    pub(super) free_events: Receiver<raw::Event>,
    pub(super) completions: crate::Completions,
    pub(super) thread: Option<JoinHandle<()>>,
    pub(super) kernel_state: Mutex<KernelState>,
    /// Called by the completion thread after it sent completions.
    pub(super) hook: Arc<crate::HookCell>,
    /// Groups queued since the last event on the copy stream, and their held copies. Locked
    /// from a group's first copy to its entry in the completion queue, so the queue's order is
    /// the streams'.
    pub(super) unsignalled: Mutex<Unsignalled>,
    /// Whether the driver has `cuMemcpyBatchAsync`: copies are then held and issued together.
    batch_copies: bool,
    /// How the buffers lie in device memory.
    pub(super) placement: Placement,
    /// `Placement::Contiguous` with two buffers or more: the bytes from one buffer's start to
    /// the next's. Held copies into consecutive buffers from sources at a constant stride go to
    /// the driver as one two-dimensional copy (`issue_runs`).
    buffer_stride: Option<usize>,
    /// Each buffer's CUDA IPC handles and events, made by its first `export` (`ipc::export`).
    pub(super) ipc: Vec<OnceLock<Exported>>,
    /// Held while a buffer's IPC state is made, so it is made once.
    pub(super) ipc_init: Mutex<()>,
    /// The decoder of uploads marked `UploadJob::decode` (`CopyEngine::set_decoder`), and the
    /// samples it could not decode, not yet taken.
    decoder: Mutex<Option<GpuDecoder>>,
    decode_faults: Mutex<Vec<crate::DecodeFault>>,
}

impl CudaUploader {
    pub(super) fn new(
        backend: &CudaBackend,
        buffers: usize,
        buffer_bytes: usize,
        placement: Placement,
    ) -> Result<Self, BackendError> {
        if buffers == 0 || buffer_bytes == 0 {
            return Err(BackendError::InvalidArgument {
                call: "CudaBackend::uploader",
                what: format!(
                    "need at least one buffer of at least one byte, got {buffers} x {buffer_bytes} bytes"
                ),
            });
        }
        let ctx = Arc::clone(&backend.ctx);
        let device = backend.device;
        let copy_stream = backend.new_stream("copy")?;
        let small_stream = backend.new_stream("small copy")?;
        let kernel_stream = backend.new_stream("kernel")?;
        let object = || {
            format!(
                "{buffers} device buffers of {buffer_bytes} bytes ({placement:?}, {} GiB device) on device {device}",
                gib(backend.total_mem)
            )
        };
        // The constant distance between consecutive buffers (contiguous, two or more), for
        // copies in runs.
        let (bufs, buffer_stride) = match placement {
            Placement::Separate => (
                (0..buffers)
                    .map(|_| DeviceBuffer::alloc(&copy_stream, buffer_bytes))
                    .collect::<Result<Vec<_>, _>>(),
                None,
            ),
            Placement::Contiguous => {
                let stride = buffer_bytes
                    .checked_next_multiple_of(super::BUFFER_ALIGN)
                    .filter(|stride| stride.checked_mul(buffers).is_some())
                    .ok_or_else(|| BackendError::InvalidArgument {
                        call: "CudaBackend::uploader",
                        what: format!("{} do not fit the address space", object()),
                    })?;
                (
                    DeviceBuffer::carve(&copy_stream, buffers, buffer_bytes, stride),
                    (buffers > 1).then_some(stride),
                )
            }
        };
        let bufs = bufs.map_err(|e| cuda_error("cuMemAlloc", object(), e.0))?;
        // The buffers are zeroed on the copy stream: finish that before the kernel stream may
        // touch a buffer (event tracking is off, see `CudaBackend::new`). Once, at set-up.
        copy_stream.synchronize().map_err(|e| {
            cuda_error(
                "cuStreamSynchronize",
                format!("copy stream on device {device} after allocating {buffers} device buffers"),
                e.0,
            )
        })?;
        let result = kernel_stream.alloc_zeros::<u8>(8).map_err(|e| {
            cuda_error(
                alloc_call(&ctx),
                format!("8-byte checksum word on device {device}"),
                e.0,
            )
        })?;
        let done = raw::Event::new(&ctx)
            .map_err(|e| cuda_error("cuEventCreate", format!("device {device}"), e.0))?;
        let small_mark = raw::Event::new(&ctx)
            .map_err(|e| cuda_error("cuEventCreate", format!("device {device}"), e.0))?;
        let guards = Arc::new(Guards::new(buffers));
        let (inflight_tx, inflight_rx) = crossbeam_channel::unbounded::<InFlight>();
        let (done_tx, done_rx) = crate::Completions::channel();
        let (free_tx, free_rx) = crossbeam_channel::unbounded::<raw::Event>();
        let hook: Arc<crate::HookCell> = Arc::new(crate::HookCell::default());
        let thread =
            completion::spawn(&ctx, device, &guards, inflight_rx, done_tx, free_tx, &hook)?;
        Ok(Self {
            ctx,
            device,
            sm_count: backend.sm_count,
            buffer_bytes,
            event_buffers: (bufs.len() / 2).max(1),
            event_groups: AtomicUsize::new(EVENT_GROUPS),
            buffers: bufs,
            chunks: Arc::clone(&backend.chunks),
            guards,
            copy_stream,
            small_stream,
            small_mark,
            kernel_stream,
            inflight: Some(inflight_tx),
            free_events: free_rx,
            completions: done_rx,
            thread: Some(thread),
            kernel_state: Mutex::new(KernelState {
                kernels: None,
                result,
                done,
            }),
            hook,
            unsignalled: Mutex::new(Unsignalled::default()),
            batch_copies: raw::has_memcpy_batch(),
            placement,
            buffer_stride,
            ipc: (0..buffers).map(|_| OnceLock::new()).collect(),
            ipc_init: Mutex::new(()),
            decoder: Mutex::new(None),
            decode_faults: Mutex::new(Vec::new()),
        })
    }

    /// Every job of a group lies inside its buffer, decodes only with a decoder, and goes into
    /// `first`'s buffer.
    fn check_group(&self, first: &UploadJob, jobs: &[UploadJob]) -> Result<(), BackendError> {
        for job in jobs {
            check_job(job, self.buffers.len(), self.buffer_bytes)?;
            GpuDecoder::check_job(&lock_any(&self.decoder), job)?;
            if job.buffer != first.buffer {
                return Err(BackendError::InvalidArgument {
                    call: "submit_group",
                    what: format!(
                        "copies into device buffers {} and {} (tags {} and {}): one group's copies go into one buffer",
                        first.buffer, job.buffer, first.tag, job.tag
                    ),
                });
            }
        }
        Ok(())
    }

    /// Queues the decode of `job`'s chunk into device address `dst` on the copy stream; the
    /// samples that did not decode are kept for `take_decode_faults`.
    ///
    /// # Safety
    /// As `GpuDecoder::decode`, for the job's source and `dst..dst + d.dst_len`.
    unsafe fn enqueue_decode(
        &self,
        job: &UploadJob,
        d: crate::Decode,
        dst: u64,
    ) -> Result<(), BackendError> {
        let mut faults = Vec::new();
        let r = match lock_any(&self.decoder).as_mut() {
            // SAFETY: forwarded from our caller.
            Some(dec) => unsafe { dec.decode(job.tag, job.src, job.len, d, dst, &mut faults) },
            None => Ok(()),
        };
        if !faults.is_empty() {
            lock_any(&self.decode_faults).extend(faults);
        }
        r
    }

    /// Test hook: the decoder's kernels over one decoded RGB image (`rgb`, `w` × `h`) with
    /// box `crop`, into buffer 0 (device memory), read back.
    #[cfg(test)]
    pub(super) fn resample_raster(
        &self,
        rgb: &[u8],
        size: (u32, u32),
        crop: [f64; 4],
        flip: bool,
    ) -> Vec<u8> {
        let mut guard = lock_any(&self.decoder);
        let dec = guard.as_mut().expect("set_decoder first");
        let dst = self.buffers[0].ptr();
        let n = dec.resample_raster(rgb, size, crop, flip, dst).unwrap();
        let mut got = vec![0u8; n];
        let whole = self.buffers[0].slice().slice(0..n);
        self.copy_stream.memcpy_dtoh(&whole, &mut got).unwrap();
        self.copy_stream.synchronize().unwrap();
        got
    }

    /// The decoder's last failed batched decode, if any.
    pub fn last_decode_error(&self) -> Option<String> {
        lock_any(&self.decoder)
            .as_ref()
            .and_then(|d| d.last_batch_error.clone())
    }

    /// The device index.
    pub fn device(&self) -> usize {
        self.device
    }

    /// Device address of buffer `buffer` (for callers launching their own kernels).
    pub fn buffer_device_ptr(&self, buffer: usize) -> Option<u64> {
        self.buffers.get(buffer).map(|b| b.ptr())
    }

    /// Starts a read of bytes `offset..offset + len` of device buffer `buffer`: checks them,
    /// then takes the buffer as a reader (`BufferBusy` while an upload into it is pending;
    /// module docs). The read lasts until the returned [`Reading`] is dropped.
    pub(super) fn begin_read(
        &self,
        call: &'static str,
        buffer: usize,
        offset: usize,
        len: usize,
    ) -> Result<(&DeviceBuffer, Reading<'_>), BackendError> {
        check_range(
            call,
            buffer,
            offset,
            len,
            self.buffers.len(),
            self.buffer_bytes,
        )?;
        let reading = self.guards.begin_read(call, buffer)?;
        Ok((&self.buffers[buffer], reading))
    }
}

impl CudaUploader {
    /// The groups without an event and their held copies; a poisoned lock (a panic while holding
    /// it, such as a failed bounds assert) is taken over: a group pushed before the panic may lack
    /// copies, but the panic was in the thread that submits, the daemon's main loop, which is
    /// also the one that takes completions: none of that group's is taken for a landed batch.
    fn lock_unsignalled(&self) -> std::sync::MutexGuard<'_, Unsignalled> {
        self.unsignalled
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// An event (reused, or new) recorded on the copy stream now: after every copy queued so
    /// far, the small-copy stream's too when `small` (small copies since the last event). It is
    /// one to be looked at (`raw::Event::new_polled`). `object` names what it follows, for an
    /// error: called only when a call failed, so the hot path formats nothing.
    fn event_after(
        &self,
        object: impl Fn() -> String,
        small: bool,
    ) -> Result<raw::Event, BackendError> {
        if small {
            let mark = || format!("the small copies before {}", object());
            self.small_mark.record(&self.small_stream).map_err(|e| {
                cuda_error("cuEventRecord", format!("a mark after {}", mark()), e.0)
            })?;
            self.small_mark.wait_on(&self.copy_stream).map_err(|e| {
                cuda_error(
                    "cuStreamWaitEvent",
                    format!("the copy stream waiting for {}", mark()),
                    e.0,
                )
            })?;
        }
        let event = match self.free_events.try_recv() {
            Ok(e) => e,
            Err(_) => raw::Event::new_polled(&self.ctx)
                .map_err(|e| cuda_error("cuEventCreate", format!("device {}", self.device), e.0))?,
        };
        event
            .record(&self.copy_stream)
            .map_err(|e| cuda_error("cuEventRecord", object(), e.0))?;
        Ok(event)
    }

    /// Blocks until every copy queued on either copy stream has finished (error paths: no
    /// source may still be read when an error is returned).
    fn wait_for_streams(&self) {
        for stream in [&self.small_stream, &self.copy_stream] {
            if let Ok(ev) = raw::Event::new(&self.ctx) {
                let _ = ev.record(stream).and_then(|()| ev.synchronize());
            }
        }
    }

    /// `submit_group` (`deferred` false: an event after the group) and `submit_group_deferred`
    /// (an event only when [`EVENT_GROUPS`] or [`EVENT_BYTES`] is reached).
    ///
    /// # Safety
    /// As `CopyEngine::submit_group`.
    unsafe fn enqueue_group(
        &self,
        jobs: &[UploadJob],
        deferred: bool,
    ) -> Result<usize, BackendError> {
        let Some(first) = jobs.first() else {
            return Ok(0);
        };
        self.check_group(first, jobs)?;
        let device = self.device;
        let b = first.buffer;
        // Each length fits the buffer (checked), and a group is a part's few fields.
        let len = jobs.iter().fold(0usize, |sum, j| sum.saturating_add(j.len));
        let object = |i: usize| {
            let job = &jobs[i];
            format!(
                "{} bytes from host {:p} into device buffer {} at offset {} (tag {}, copy {} of {}) on device {device}",
                job.len,
                job.src,
                job.buffer,
                job.dst_offset,
                job.tag,
                i + 1,
                jobs.len()
            )
        };
        let mut unsignalled = self.lock_unsignalled();
        // Store-load against readers (module docs): announce the upload, then look for readers.
        self.guards.begin_upload(b)?;
        let u = &mut *unsignalled;
        if u.groups.last().map(|g| g.buffer) != Some(b) {
            u.buffers += 1;
        }
        u.groups.push(Group {
            tag: first.tag,
            buffer: b,
            len,
            submitted: Instant::now(),
        });
        u.bytes = u.bytes.saturating_add(len);
        let dst = self.buffers[b].ptr();
        for (i, job) in jobs.iter().enumerate() {
            if let Some(d) = job.decode {
                let at = dst + job.dst_offset as u64;
                // SAFETY: the job's source stays valid and unwritten until its group's
                // completion (the caller's promise), which comes only after an event recorded on
                // the copy stream after this decode's work (`signal`); the destination lies
                // inside buffer `b` (checked above).
                let decoded = unsafe { self.enqueue_decode(job, d, at) };
                u.issued.get_or_insert_with(Instant::now);
                match decoded {
                    Ok(()) => continue,
                    Err(err) => return Err(self.fail_held(u, err)),
                }
            }
            // One copy per registered chunk the source touches (usually exactly one).
            let start = job.src as usize;
            let end = start + job.len;
            let mut cur = start;
            while cur < end {
                let next = self.chunks.next_boundary(cur, end);
                let small = next - cur < SMALL_COPY_BYTES;
                u.small |= small;
                let at = job.dst_offset + (cur - start);
                if self.batch_copies {
                    u.held[usize::from(small)].push(dst + at as u64, cur, next - cur);
                    cur = next;
                    continue;
                }
                u.issued.get_or_insert_with(Instant::now);
                // SAFETY: [cur, next) is a piece of src..src+len, and at + (next - cur) <=
                // dst_offset + len <= buffer size (checked above); the caller guarantees
                // src..src+len stays valid and unwritten until the group's Completion is
                // received, and the completion thread sends it only after an event recorded on
                // the copy stream after every copy of the group has completed (`signal`; a copy
                // on the small-copy stream is joined into the copy stream before that event,
                // `event_after`). Device buffers are freed only after that thread has drained
                // (Drop).
                let r = unsafe {
                    self.buffers[b].copy_in_async(
                        at,
                        cur as *const u8,
                        next - cur,
                        if small {
                            &self.small_stream
                        } else {
                            &self.copy_stream
                        },
                    )
                };
                if let Err(e) = r {
                    let err = cuda_error("cuMemcpyHtoDAsync", object(i), e.0);
                    return Err(self.fail_held(u, err));
                }
                cur = next;
            }
        }
        let event_bytes = if u.large_parts() {
            LARGE_EVENT_BYTES
        } else {
            EVENT_BYTES
        };
        if !deferred
            || u.groups.len() >= self.event_groups.load(Relaxed)
            || u.buffers >= self.event_buffers
            || u.bytes >= event_bytes
        {
            self.signal(u, &|| object(jobs.len() - 1))?;
        }
        Ok(1)
    }

    /// Issues the held copies (one `cuMemcpyBatchAsync` per stream that has some), records one
    /// event after them and every copy before, and puts the unsignalled groups in the completion
    /// queue as one entry with the event. `object` names what the event follows, for an error.
    /// On an error no held group will complete (`fail_held`).
    fn signal(&self, u: &mut Unsignalled, object: &dyn Fn() -> String) -> Result<(), BackendError> {
        if u.groups.is_empty() {
            return Ok(());
        }
        let gone = |call| BackendError::WorkerGone {
            backend: "cuda",
            call,
        };
        let Some(tx) = self.inflight.as_ref() else {
            return Err(self.fail_held(u, gone("submit")));
        };
        if let Err(e) = self.issue_held(u, object) {
            return Err(self.fail_held(u, e));
        }
        let issued = u.issued.take().unwrap_or_else(Instant::now);
        let event = match self.event_after(object, u.small) {
            Ok(event) => event,
            Err(e) => return Err(self.fail_held(u, e)),
        };
        let flight = InFlight {
            groups: std::mem::replace(&mut u.groups, Vec::with_capacity(EVENT_GROUPS)),
            bytes: std::mem::take(&mut u.bytes),
            issued,
            event,
        };
        u.buffers = 0;
        u.small = false;
        if let Err(unsent) = tx.send(flight) {
            // Completion thread gone: wait for the copies ourselves, end the uploads it will
            // not end, and report.
            self.wait_for_streams();
            for group in unsent.into_inner().groups {
                self.guards.end_upload(group.buffer);
            }
            return Err(gone("submit"));
        }
        Ok(())
    }

    /// Gives the held copies to the driver: one `cuMemcpyBatchAsync` per stream that has some.
    /// `object` names what the last one follows, for an error.
    fn issue_held(
        &self,
        u: &mut Unsignalled,
        object: &dyn Fn() -> String,
    ) -> Result<(), BackendError> {
        for (held, stream, name) in [
            (0, &self.copy_stream, "copy"),
            (1, &self.small_stream, "small-copy"),
        ] {
            let runs = held == 0;
            let held = &mut u.held[held];
            if held.dsts.is_empty() {
                continue;
            }
            u.issued.get_or_insert_with(Instant::now);
            if runs {
                if let Some(stride) = self.buffer_stride {
                    self.issue_runs(held, stride, stream, object)?;
                    if held.dsts.is_empty() {
                        continue;
                    }
                }
            }
            // SAFETY: every held copy is a piece of a job checked by `enqueue_group` (inside
            // its device buffer, its source inside the caller's range, which stays valid and
            // unwritten until the group's completion: sent below only with or before an event
            // recorded after these copies). The driver has the call (`batch_copies`).
            let r = unsafe {
                raw::memcpy_htod_batch_async(
                    &mut held.dsts,
                    &mut held.srcs,
                    &mut held.sizes,
                    self.device as i32,
                    stream,
                )
            };
            if let Err((e, failed)) = r {
                let what = format!(
                    "{} held copies on the {name} stream of device {} (copy {failed} failed), issued for {}",
                    held.dsts.len(),
                    self.device,
                    object()
                );
                return Err(cuda_error("cuMemcpyBatchAsync", what, e.0));
            }
            held.clear();
        }
        Ok(())
    }

    /// Gives the driver each run of [`MIN_RUN`] or more held copies that are one
    /// two-dimensional copy (`HeldCopies::run_at`: equal lengths, sources a constant pitch
    /// apart, destinations `stride` apart: parts from consecutive slots into consecutive
    /// buffers) as one `cuMemcpy2DAsync` on `stream`, and keeps the other copies held, in their
    /// order, for the batch call. A run's sources lie in one registered chunk. `object` names
    /// what the copies were issued for, for an error.
    fn issue_runs(
        &self,
        held: &mut HeldCopies,
        stride: usize,
        stream: &CudaStream,
        object: &dyn Fn() -> String,
    ) -> Result<(), BackendError> {
        let mut kept = 0;
        let mut i = 0;
        while i < held.dsts.len() {
            let run = held.run_at(i, stride);
            let (src, len) = (held.srcs[i] as usize, held.sizes[i]);
            // Only a run long enough to go as one copy looks at the registered chunks.
            let one_copy = run.rows >= MIN_RUN
                && run
                    .pitch
                    .checked_mul(run.rows - 1)
                    .and_then(|s| s.checked_add(src + len))
                    .is_some_and(|end| self.chunks.next_boundary(src, end) == end);
            if !one_copy {
                // Held as single copies, moved down over the runs issued before them.
                for k in i..i + run.rows {
                    held.dsts[kept] = held.dsts[k];
                    held.srcs[kept] = held.srcs[k];
                    held.sizes[kept] = held.sizes[k];
                    kept += 1;
                }
                i += run.rows;
                continue;
            }
            // SAFETY: each row is a held copy (a piece of a job checked by `enqueue_group`:
            // inside its device buffer, its source inside the caller's range, which stays valid
            // and unwritten until the group's completion, sent only with or after an event
            // recorded after this copy); the rows are exactly those copies (`run_at`: row r is
            // copy i + r), and the whole source span lies in one registered chunk (above).
            let r = unsafe {
                raw::memcpy_htod_2d_async(
                    held.dsts[i],
                    src,
                    run.pitch,
                    stride,
                    len,
                    run.rows,
                    stream,
                )
            };
            if let Err(e) = r {
                let what = format!(
                    "{} copies of {len} bytes as one two-dimensional copy (source pitch {}, destination pitch {stride}) on device {}, issued for {}",
                    run.rows,
                    run.pitch,
                    self.device,
                    object()
                );
                return Err(cuda_error("cuMemcpy2DAsync", what, e.0));
            }
            i += run.rows;
        }
        held.dsts.truncate(kept);
        held.srcs.truncate(kept);
        held.sizes.truncate(kept);
        Ok(())
    }

    /// [`Self::issue_held`] under the lock, for the calls that order the streams' work against
    /// another event (`object` names it, for an error).
    fn issue_held_now(&self, object: impl Fn() -> String) -> Result<(), BackendError> {
        let mut unsignalled = self.lock_unsignalled();
        let u = &mut *unsignalled;
        match self.issue_held(u, &object) {
            Ok(()) => Ok(()),
            Err(e) => Err(self.fail_held(u, e)),
        }
    }

    /// After a failed driver call: waits until no copy already issued still reads a source,
    /// ends the unsignalled groups' uploads and drops them with their held copies (they will
    /// not complete: the caller treats the error as fatal), and returns `err`.
    fn fail_held(&self, u: &mut Unsignalled, err: BackendError) -> BackendError {
        self.wait_for_streams();
        for group in u.groups.drain(..) {
            self.guards.end_upload(group.buffer);
        }
        for held in &mut u.held {
            held.clear();
        }
        u.bytes = 0;
        u.buffers = 0;
        u.small = false;
        u.issued = None;
        err
    }
}

/// The driver call that allocates device memory through cudarc in `ctx` (for error messages).
fn alloc_call(ctx: &CudaContext) -> &'static str {
    if ctx.has_async_alloc() {
        "cuMemAllocAsync"
    } else {
        "cuMemAlloc"
    }
}

/// Deferred groups (`CopyEngine::submit_group_deferred`) share one event until this many are
/// queued after the last one (fewer in a ring of fewer than 256 slots: a quarter of its slots,
/// `CopyEngine::set_source_ring`), or groups into half the engine's buffers (the parts of a batch
/// share one; a batch per part, at small slots, is a buffer per group),
pub(super) const EVENT_GROUPS: usize = 64;
/// or until they copy this many bytes ([`LARGE_EVENT_BYTES`] for groups of 1 MiB or more). An
/// event stalls the copy engine between two copies for about 2 µs, about a 64 KiB copy's time at
/// PCIe Gen5 speed (docs/BENCHMARKS.md, "Upload signals"), and each one costs the completion
/// thread its looks and the daemon's main loop a wake-up. One event per 32 groups or 8 MiB took
/// 256 KiB slots × 8 loaders from 43.0-45.8 GB/s at 1.15-1.43 daemon cores (an event per 16
/// groups or 4 MiB) to 46.7-46.8 GB/s at 0.88-0.98 cores (docs/BENCHMARKS.md, "Completion waits
/// and fewer events", "Copies in batches"). With every event looked at, one per 64 groups took
/// 64 KiB slots with 128 buffers from 1.19-1.21 daemon cores (one per 32) to 0.99-1.01 at the
/// same 29-32 GB/s (docs/BENCHMARKS.md, "Every event looked at"); with 64 buffers an event
/// covered every buffer and throughput fell to 16-19 GB/s, hence the cap at half the buffers,
/// counted as buffers so that a batch of many small parts in few buffers still shares events.
/// At 256 KiB and larger the bytes decide first.
pub(super) const EVENT_BYTES: usize = 8 << 20;
/// The event bytes of groups of [`LARGE_GROUP_BYTES`] or more: 1 MiB parts are signalled four
/// at a time, and a 4 MiB part or larger has an event of its own, so that its slot comes back
/// as soon as it is copied.
pub(super) const LARGE_EVENT_BYTES: usize = 4 << 20;

/// Groups that average at least this many bytes get an event per [`LARGE_EVENT_BYTES`], not
/// per [`EVENT_BYTES`].
pub(super) const LARGE_GROUP_BYTES: usize = 1 << 20;

/// Copies shorter than this go on a stream of their own. On one stream, each tiny copy (a
/// batch's labels: 32 bytes) held the copy engine about 8 µs, as long as a 256 KiB copy: with
/// one per slot, 256 KiB slots reached 16 GB/s instead of 34, 1 MiB slots 34 instead of 48
/// (H200, docs/BENCHMARKS.md, "Upload signals"). On their own stream they overlap the large
/// copies.
pub(super) const SMALL_COPY_BYTES: usize = 16 << 10;

/// The groups queued since the copy stream's last event, their bytes, whether small copies were
/// among them, and the copies not yet issued (`cuMemcpyBatchAsync` drivers): for the copy
/// stream, then the small-copy stream.
#[derive(Debug, Default)]
pub(super) struct Unsignalled {
    groups: Vec<Group>,
    /// The device buffers they copy into (consecutive groups into one buffer, the parts of one
    /// batch, count once).
    buffers: usize,
    bytes: usize,
    small: bool,
    held: [HeldCopies; 2],
    /// When the first of these groups' copies went to the driver: the copy engine starts them
    /// no sooner (the completion thread's first look at their event counts from it).
    issued: Option<Instant>,
}

impl Unsignalled {
    /// Whether these groups average [`LARGE_GROUP_BYTES`] or more: their event is signalled
    /// per [`LARGE_EVENT_BYTES`]. False with no group.
    fn large_parts(&self) -> bool {
        self.bytes / self.groups.len().max(1) >= LARGE_GROUP_BYTES
    }
}

/// Copies held for one `cuMemcpyBatchAsync` call: destination, source and size of each.
#[derive(Debug, Default)]
struct HeldCopies {
    dsts: Vec<sys::CUdeviceptr>,
    srcs: Vec<sys::CUdeviceptr>,
    sizes: Vec<usize>,
}

impl HeldCopies {
    fn push(&mut self, dst: sys::CUdeviceptr, src: usize, len: usize) {
        self.dsts.push(dst);
        self.srcs.push(src as sys::CUdeviceptr);
        self.sizes.push(len);
    }

    fn clear(&mut self) {
        self.dsts.clear();
        self.srcs.clear();
        self.sizes.clear();
    }

    /// The run of copies from copy `i` on that one two-dimensional copy can make, with
    /// destinations `stride` apart: each of the same length as copy `i`, each source the same
    /// distance (`pitch`, at least the length) after the one before, each destination `stride`
    /// after the one before. One row (`rows == 1`) when copy `i + 1` does not continue it.
    ///
    /// # Panics
    /// If `i` is not a held copy.
    fn run_at(&self, i: usize, stride: usize) -> Run {
        let len = self.sizes[i];
        let mut run = Run { rows: 1, pitch: 0 };
        let next = i + 1;
        if next >= self.sizes.len() || stride < len {
            return run;
        }
        let pitch = self.srcs[next].wrapping_sub(self.srcs[i]) as usize;
        let continues = |k: usize| {
            self.sizes[k] == len
                && self.srcs[k].wrapping_sub(self.srcs[k - 1]) as usize == pitch
                && self.dsts[k].wrapping_sub(self.dsts[k - 1]) as usize == stride
        };
        if pitch < len || pitch > MAX_PITCH || stride > MAX_PITCH {
            return run;
        }
        while i + run.rows < self.sizes.len() && continues(i + run.rows) {
            run.rows += 1;
        }
        if run.rows > 1 {
            run.pitch = pitch;
        }
        run
    }
}

/// A run of held copies that one two-dimensional copy makes ([`HeldCopies::run_at`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    /// Copies in the run (rows of the 2D copy).
    rows: usize,
    /// Bytes from one row's source to the next's (0 for a single copy).
    pitch: usize,
}

/// The fewest held copies given to the driver as one two-dimensional copy rather than in the
/// batch call. 64 KiB rows from ring slots 68 KiB apart moved 17 GB/s as one copy per call, 36
/// as 2D copies of 4 rows, 48 of 16 and 53 of 64 (H200, docs/BENCHMARKS.md, "Runs of parts as
/// one copy").
const MIN_RUN: usize = 4;

/// The largest pitch a two-dimensional copy takes (`CU_DEVICE_ATTRIBUTE_MAX_PITCH` is 2^31 - 1
/// on the devices this runs on; larger strides are left to single copies).
const MAX_PITCH: usize = i32::MAX as usize;

/// One device buffer: a `cuMemAlloc` allocation ([`raw::DeviceAlloc`], which CUDA IPC can
/// export; cudarc's own allocations come from the stream-ordered pool, which it cannot), or a
/// stretch of one shared by every buffer of a [`Placement::Contiguous`] uploader, and a cudarc
/// [`CudaSlice`] view of it for cudarc's safe calls (read-backs). cudarc never frees the memory:
/// dropping the buffer takes the view back with [`CudaSlice::leak`] before the allocation is
/// released. The device address is read once, here, so `submit` hands it to the copy without
/// going through the slice.
#[derive(Debug)]
pub(super) struct DeviceBuffer {
    /// `Some` until dropped.
    view: Option<CudaSlice<u8>>,
    /// Device address of the buffer's first byte.
    ptr: sys::CUdeviceptr,
    /// Bytes of the buffer.
    bytes: usize,
    /// The allocation the buffer lies in. Declared after `view`: released after the view has
    /// been taken back (freed when the last buffer in it is dropped).
    _alloc: Arc<raw::DeviceAlloc>,
}

impl DeviceBuffer {
    /// `bytes` (at least 1) of device memory, an allocation of its own, zeroed on `stream` (the
    /// zeroing is stream-ordered: synchronize `stream` before another stream uses the buffer).
    pub(super) fn alloc(stream: &Arc<CudaStream>, bytes: usize) -> Result<Self, DriverError> {
        let alloc = Arc::new(raw::DeviceAlloc::new(stream.context(), bytes)?);
        let bytes = alloc.bytes();
        Self::view(stream, alloc, 0, bytes)
    }

    /// `count` buffers of `bytes` each (at least 1) in one allocation, buffer `i` at byte
    /// `i * stride`, zeroed on `stream` as [`DeviceBuffer::alloc`]'s.
    ///
    /// # Panics
    /// If `stride < bytes` or `count * stride` overflows (the caller checks both).
    pub(super) fn carve(
        stream: &Arc<CudaStream>,
        count: usize,
        bytes: usize,
        stride: usize,
    ) -> Result<Vec<Self>, DriverError> {
        assert!(
            stride >= bytes.max(1),
            "stride {stride} under the buffer's {bytes} bytes"
        );
        let total = count.checked_mul(stride).expect("checked by the caller");
        let alloc = Arc::new(raw::DeviceAlloc::new(stream.context(), total)?);
        (0..count)
            .map(|i| Self::view(stream, Arc::clone(&alloc), i * stride, bytes.max(1)))
            .collect()
    }

    /// The buffer of bytes `offset..offset + bytes` of `alloc`, zeroed on `stream`.
    fn view(
        stream: &Arc<CudaStream>,
        alloc: Arc<raw::DeviceAlloc>,
        offset: usize,
        bytes: usize,
    ) -> Result<Self, DriverError> {
        assert!(
            offset
                .checked_add(bytes)
                .is_some_and(|end| end <= alloc.bytes()),
            "buffer of {bytes} bytes at offset {offset} of a {}-byte allocation",
            alloc.bytes()
        );
        let ptr = alloc.ptr() + offset as u64;
        // SAFETY: `ptr..ptr + bytes` lies inside `alloc` (asserted), a live allocation in the
        // stream's context. The view never frees it (Drop leaks the view back first) and does
        // not outlive it (the buffer holds the allocation, and `view` is taken in Drop before
        // the buffer's handle on it is released). Event tracking is off in the backend's
        // context (`CudaBackend::new`), so no events are created for the view.
        let mut view = unsafe { stream.upgrade_device_ptr::<u8>(ptr, bytes) };
        if let Err(e) = stream.memset_zeros(&mut view) {
            view.leak();
            return Err(e);
        }
        Ok(Self {
            view: Some(view),
            ptr,
            bytes,
            _alloc: alloc,
        })
    }

    /// The allocation, for cudarc's safe calls (reading back).
    pub(super) fn slice(&self) -> &CudaSlice<u8> {
        match &self.view {
            Some(v) => v,
            None => unreachable!("the view is taken only in Drop"),
        }
    }

    /// Device address.
    pub(super) fn ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }

    /// Bytes `offset..offset + len` as a kernel's [`Span`].
    ///
    /// # Panics
    /// If the range passes the buffer's end.
    pub(super) fn span(&self, offset: usize, len: usize) -> Span {
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= self.bytes),
            "span of {len} bytes at offset {offset} of a {}-byte device buffer",
            self.bytes
        );
        Span {
            ptr: self.ptr() + offset as u64,
            bytes: len,
        }
    }

    /// Enqueues a copy of `len` bytes from host address `src` to byte `offset` of this buffer
    /// on `stream` ([`raw::memcpy_htod_async`]).
    ///
    /// # Safety
    /// `src..src+len` is valid for reads and is not written or unmapped until the copy has
    /// completed on `stream`; this buffer is not dropped before that either.
    ///
    /// # Panics
    /// If `offset + len` exceeds the buffer.
    pub(super) unsafe fn copy_in_async(
        &self,
        offset: usize,
        src: *const u8,
        len: usize,
        stream: &CudaStream,
    ) -> Result<(), DriverError> {
        let bytes = self.bytes;
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= bytes),
            "copy of {len} bytes at offset {offset} into a {bytes}-byte device buffer"
        );
        // SAFETY: the destination range lies inside this live allocation (asserted), which the
        // caller keeps alive until the copy completes, as it does the source range.
        unsafe { raw::memcpy_htod_async(self.ptr() + offset as u64, src, len, stream) }
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // cudarc must not free memory it did not allocate: take the view back; `_alloc`, dropped
        // next, frees it with cuMemFree once no buffer holds it.
        if let Some(v) = self.view.take() {
            v.leak();
        }
    }
}

impl CopyEngine for CudaUploader {
    fn set_decoder(&self, spec: pinring_image::SampleSpec) -> Result<(), BackendError> {
        GpuDecoder::install(&mut lock_any(&self.decoder), spec, || {
            GpuDecoder::new(&self.ctx, &self.copy_stream, spec, self.device)
        })
    }

    fn take_decode_faults(&self) -> Vec<crate::DecodeFault> {
        std::mem::take(&mut *lock_any(&self.decode_faults))
    }

    fn decode_counts(&self) -> crate::DecodeCounts {
        lock_any(&self.decoder)
            .as_ref()
            .map(GpuDecoder::counts)
            .unwrap_or_default()
    }

    unsafe fn submit(&self, job: UploadJob) -> Result<(), BackendError> {
        // SAFETY: forwarded from our caller (a group of one job, one completion).
        unsafe { self.submit_group(std::slice::from_ref(&job)) }.map(|_| ())
    }

    /// The jobs' copies, then one event after the last: one completion for the group, whose
    /// tag and buffer are `jobs[0]`'s and whose `len` is the jobs' sum. Every job must name the
    /// same device buffer (`InvalidArgument`, nothing queued, otherwise).
    unsafe fn submit_group(&self, jobs: &[UploadJob]) -> Result<usize, BackendError> {
        // SAFETY: forwarded from our caller.
        unsafe { self.enqueue_group(jobs, false) }
    }

    /// As `submit_group`, but the event is recorded only once `EVENT_GROUPS` groups or
    /// `EVENT_BYTES` bytes (`LARGE_EVENT_BYTES` for parts of 1 MiB or more) have been queued
    /// without one; `flush` records it otherwise.
    unsafe fn submit_group_deferred(&self, jobs: &[UploadJob]) -> Result<usize, BackendError> {
        // SAFETY: forwarded from our caller.
        unsafe { self.enqueue_group(jobs, true) }
    }

    fn set_source_ring(&self, slots: usize) {
        // Each group is one part, at most one slot: counting groups bounds the event's share of
        // the ring in bytes too.
        let groups = (slots / crate::SIGNAL_SPAN_DIVISOR).clamp(1, EVENT_GROUPS);
        self.event_groups.store(groups, Relaxed);
    }

    fn flush(&self) -> Result<(), BackendError> {
        let mut unsignalled = self.lock_unsignalled();
        let u = &mut *unsignalled;
        let (groups, bytes) = (u.groups.len(), u.bytes);
        self.signal(u, &|| {
            format!(
                "{groups} groups of copies ({bytes} bytes) on device {}",
                self.device
            )
        })
    }

    fn completions(&self) -> &crate::Completions {
        &self.completions
    }

    fn set_completion_hook(&self, hook: crate::CompletionHook) {
        self.hook.set(hook);
    }

    fn buffer_count(&self) -> usize {
        self.buffers.len()
    }

    fn buffer_bytes(&self) -> usize {
        self.buffer_bytes
    }

    fn device_ptr(&self, buffer: usize) -> u64 {
        let count = self.buffers.len();
        match self.buffers.get(buffer) {
            Some(b) => b.ptr(),
            None => panic!("device buffer {buffer} out of range: the uploader has {count}"),
        }
    }
}

impl BufferHandoff for CudaUploader {
    fn export(&self, buffer: usize) -> Result<Option<BufferExport>, BackendError> {
        if self.placement == Placement::Contiguous {
            return Err(BackendError::InvalidArgument {
                call: "export",
                what: format!(
                    "device buffer {buffer} shares one allocation with the upload engine's other \
                     buffers (Placement::Contiguous), and a CUDA IPC handle opens a whole \
                     allocation: make the engine with Placement::Separate to hand its buffers \
                     to another process"
                ),
            });
        }
        self.export_buffer(buffer).map(Some)
    }

    fn record_ready(&self, buffer: usize) -> Result<(), BackendError> {
        // The ready event follows every copy submitted so far: held ones go to the driver first.
        self.issue_held_now(|| format!("the ready event of device buffer {buffer}"))?;
        self.record_ready_on_copy_stream(buffer)
    }

    fn wait_release(&self, buffer: usize, consumer_alive: bool) -> Result<(), BackendError> {
        // Only copies submitted after this wait for the release: held ones go to the driver
        // before the wait.
        self.issue_held_now(|| format!("the wait for the release of device buffer {buffer}"))?;
        self.wait_release_on_copy_stream(buffer, consumer_alive)
    }

    fn share_local(&self, buffer: usize) -> Result<(), BackendError> {
        self.share_local_buffer(buffer)
    }

    unsafe fn local_wait_ready(&self, buffer: usize, stream: u64) -> Result<(), BackendError> {
        // SAFETY: forwarded from our caller (the trait's contract on `stream`).
        unsafe { CudaUploader::local_wait_ready(self, buffer, stream) }
    }

    unsafe fn local_record_release(&self, buffer: usize, stream: u64) -> Result<(), BackendError> {
        // SAFETY: forwarded from our caller (the trait's contract on `stream`).
        unsafe { CudaUploader::local_record_release(self, buffer, stream) }
    }
}

impl DeviceKernels for CudaUploader {
    fn read_host(
        &self,
        _buffer: usize,
        _offset: usize,
        _len: usize,
        _f: &mut dyn FnMut(&[u8]),
    ) -> Result<bool, BackendError> {
        // Device memory is not readable from the host: verifying sinks use `checksum`. Nothing
        // is read, so no reader count is taken (module docs).
        Ok(false)
    }

    fn checksum(&self, buffer: usize, offset: usize, len: usize) -> Result<u64, BackendError> {
        check_checksum_offset(buffer, offset)?;
        self.checksum_buffer(buffer, offset, len)
    }

    fn compute(&self, buffer: usize, len: usize) -> Result<(), BackendError> {
        self.compute_buffer(buffer, len)
    }

    unsafe fn checksum_mapped(&self, host_ptr: *const u8, len: usize) -> Result<u64, BackendError> {
        // SAFETY: forwarded from the caller of `DeviceKernels::checksum_mapped`.
        unsafe { self.checksum_mapped_range(host_ptr, len) }
    }

    unsafe fn compute_mapped(&self, host_ptr: *mut u8, len: usize) -> Result<(), BackendError> {
        // SAFETY: forwarded from the caller of `DeviceKernels::compute_mapped`.
        unsafe { self.compute_mapped_range(host_ptr, len) }
    }
}

impl Drop for CudaUploader {
    fn drop(&mut self) {
        // Deferred groups get their event, then closing the channel lets the completion thread
        // drain: it waits for every copy still in flight (the whole context, should this flush
        // have failed), so device buffers (freed after this) and callers' source ranges are safe.
        if let Err(e) = CopyEngine::flush(self) {
            tracing::warn!(
                device = self.device,
                "flushing the copy stream on drop: {e}"
            );
        }
        self.inflight.take();
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                tracing::error!(
                    device = self.device,
                    "pinring CUDA completion thread panicked"
                );
                // Make sure no copy is still running before the buffers are freed.
                self.wait_for_streams();
            }
        }
        // Kernels are waited for by the calls that launch them, except after a failed wait.
        // cudarc frees the buffers in the copy stream's order, which does not follow the kernel
        // stream, so make sure no kernel still uses one.
        if let Ok(ev) = raw::Event::new(&self.ctx) {
            let _ = ev
                .record(&self.kernel_stream)
                .and_then(|()| ev.synchronize());
        }
    }
}

/// A lock whose holder's panic leaves nothing half-written that matters here.
fn lock_any<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Held copies of `len` bytes, one per (source, destination).
    fn held(len: usize, copies: &[(u64, u64)]) -> HeldCopies {
        let mut h = HeldCopies::default();
        for &(src, dst) in copies {
            h.push(dst, src as usize, len);
        }
        h
    }

    #[test]
    fn a_run_is_copies_of_one_length_at_constant_source_and_destination_strides() {
        const SLOT: u64 = 68 << 10;
        const BUF: u64 = 64 << 10;
        // Five parts from consecutive slots into consecutive buffers, then a part whose buffer
        // wraps to the first.
        let mut copies: Vec<(u64, u64)> =
            (0..5).map(|k| (k * SLOT, (1 << 30) | (k * BUF))).collect();
        copies.push((5 * SLOT, 1 << 30));
        let h = held(BUF as usize, &copies);
        let run = h.run_at(0, BUF as usize);
        assert_eq!(
            run,
            Run {
                rows: 5,
                pitch: SLOT as usize
            }
        );
        // The wrapped part is a run of one, as is the last copy.
        assert_eq!(h.run_at(5, BUF as usize), Run { rows: 1, pitch: 0 });
        assert_eq!(h.run_at(3, BUF as usize).rows, 2);
        assert_eq!(h.run_at(4, BUF as usize).rows, 1);
        // Destinations must be exactly `stride` apart.
        assert_eq!(h.run_at(0, 2 * BUF as usize), Run { rows: 1, pitch: 0 });
    }

    #[test]
    fn a_run_ends_where_length_order_or_overlap_breaks_it() {
        const BUF: usize = 4096;
        // Descending sources (slots taken against the ring's order): no run.
        let h = held(
            BUF,
            &[
                (3 * 8192, 0),
                (2 * 8192, BUF as u64),
                (8192, 2 * BUF as u64),
            ],
        );
        assert_eq!(h.run_at(0, BUF), Run { rows: 1, pitch: 0 });
        // Sources closer than a copy's length would overlap as rows: no run.
        let h = held(BUF, &[(0, 0), (100, BUF as u64)]);
        assert_eq!(h.run_at(0, BUF), Run { rows: 1, pitch: 0 });
        // A shorter copy (a short last batch) ends the run before it.
        let mut h = held(BUF, &[(0, 0), (8192, BUF as u64), (16384, 2 * BUF as u64)]);
        h.sizes[2] = 100;
        assert_eq!(
            h.run_at(0, BUF),
            Run {
                rows: 2,
                pitch: 8192
            }
        );
        // A stride under the copy's length (buffers smaller than the copy) makes no run.
        let h = held(BUF, &[(0, 0), (8192, 100)]);
        assert_eq!(h.run_at(0, 100), Run { rows: 1, pitch: 0 });
        // Pitches past what a 2D copy takes are left to single copies.
        let far = MAX_PITCH as u64 + 1;
        let h = held(BUF, &[(0, 0), (far, BUF as u64), (2 * far, 2 * BUF as u64)]);
        assert_eq!(h.run_at(0, BUF), Run { rows: 1, pitch: 0 });
    }
}
