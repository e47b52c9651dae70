//! The host backend: no GPU. "Device buffers" are page-aligned heap allocations, or ranges of
//! the caller's memory such as a shared-memory segment a consumer in another process maps
//! ([`HostBackend::uploader_in`]), and an upload is a `memcpy` done by a background thread, so
//! the whole pipeline (ring, loaders, daemon, sinks) can run and be verified on any machine.
//!
//! # Soundness of [`DeviceKernels::read_host`]
//! Each buffer is guarded by `crate::guard` (a `pending` count of uploads queued or running, a
//! `readers` count, and the store-load argument for why a copy into a buffer and a read of it
//! never overlap). Here the upload thread ends an upload right after its copy, so a reader that
//! sees no pending upload also sees every byte copied. `read_host`, `checksum` and `compute` hold
//! the reader count only for the duration of the call, so no slice outlives it.

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};

use crate::buf::AlignedBuf;
use crate::checksum::checksum;
use crate::decode::{CpuDecoder, Decoder as _};
use crate::guard::{check_job, Guards};
use crate::{
    Backend, BackendError, BufferExport, BufferHandoff, Completion, CopyEngine, DeviceKernels,
    Placement, Registration, UploadJob, Uploader,
};

/// The backend without a GPU.
#[derive(Debug, Default, Clone)]
pub struct HostBackend;

impl HostBackend {
    /// A new host backend.
    pub fn new() -> Self {
        Self
    }

    /// An upload engine whose `buffers` device buffers of `buffer_bytes` each live in the
    /// caller's memory at `base` instead of on the heap, so that another process that maps the
    /// same memory (a shared-memory segment) can read the batches in place. Buffer `i` occupies
    /// `base + i * buffer_bytes .. base + (i + 1) * buffer_bytes`
    /// ([`HostBackend::placement_bytes`] in all); [`CopyEngine::device_ptr`] gives its address.
    /// The memory is not zeroed. Reads of such buffers in this process (`read_host`,
    /// `checksum`, `compute`) copy the bytes out first, so no Rust reference to them is made.
    ///
    /// # Safety
    /// `base .. base + placement_bytes(buffers, buffer_bytes)` is a live mapping, valid for
    /// reads and writes, that stays mapped until the returned uploader has been dropped (its
    /// drop waits for the last copy). Nothing in this process accesses it meanwhile except
    /// through the uploader. Other processes may read it; one that writes it breaks the
    /// protocol and gets, like the uploader's reads, unspecified byte values (never a Rust
    /// reference is made to those bytes here).
    pub unsafe fn uploader_in(
        &self,
        base: *mut u8,
        buffers: usize,
        buffer_bytes: usize,
    ) -> Result<Box<dyn Uploader>, BackendError> {
        // SAFETY: forwarded from our caller.
        Ok(Box::new(unsafe {
            HostUploader::new_in(base, buffers, buffer_bytes)
        }?))
    }

    /// Bytes that `buffers` device buffers of `buffer_bytes` each take in caller-provided memory
    /// ([`HostBackend::uploader_in`]); `None` if that overflows.
    pub const fn placement_bytes(buffers: usize, buffer_bytes: usize) -> Option<usize> {
        buffers.checked_mul(buffer_bytes)
    }
}

impl Backend for HostBackend {
    fn name(&self) -> &'static str {
        "host"
    }

    fn describe(&self) -> String {
        "host: memcpy into page-aligned heap buffers (no GPU)".to_string()
    }

    unsafe fn register(
        &self,
        base: *mut u8,
        len: usize,
        _devicemap: bool,
    ) -> Result<Registration, BackendError> {
        let start = Instant::now();
        Ok(Registration::unregistered(
            base as usize,
            len,
            start.elapsed().as_secs_f64(),
        ))
    }

    fn uploader(
        &self,
        buffers: usize,
        buffer_bytes: usize,
        _placement: Placement,
    ) -> Result<Box<dyn Uploader>, BackendError> {
        Ok(Box::new(HostUploader::new(buffers, buffer_bytes)?))
    }

    fn raw_copy_gbps(
        &self,
        bytes: usize,
        iters: usize,
        _registered: bool,
    ) -> Result<f64, BackendError> {
        if bytes == 0 || iters == 0 {
            return Err(BackendError::InvalidArgument {
                call: "raw_copy_gbps",
                what: format!("need bytes > 0 and iters > 0, got {bytes} bytes x {iters}"),
            });
        }
        let src = vec![0x5au8; bytes];
        let mut dst = vec![0u8; bytes];
        dst.copy_from_slice(&src); // warm: fault the pages in
        let start = Instant::now();
        for _ in 0..iters {
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&mut dst);
        }
        let secs = start.elapsed().as_secs_f64().max(1e-9);
        Ok((bytes as f64 * iters as f64) / secs / 1e9)
    }
}

/// State shared between the uploader and its upload thread.
#[derive(Debug)]
struct Shared {
    buffers: Vec<AlignedBuf>,
    /// Uploads into each buffer not yet copied, and calls reading it now (`crate::guard`).
    guards: Guards,
    /// Called after each completion is sent.
    hook: crate::HookCell,
    /// The samples' spec of decoding uploads ([`CopyEngine::set_decoder`]).
    decoder: Mutex<Option<CpuDecoder>>,
    /// Samples that did not decode, not yet taken.
    faults: Mutex<Vec<crate::DecodeFault>>,
}

/// A job as queued for the upload thread.
#[derive(Debug)]
struct Queued {
    job: UploadJob,
    submitted: Instant,
}

/// Upload engine of the host backend (see the module docs for the soundness argument).
#[derive(Debug)]
pub struct HostUploader {
    shared: Arc<Shared>,
    buffer_bytes: usize,
    jobs: Option<Sender<Queued>>,
    completions: crate::Completions,
    thread: Option<JoinHandle<()>>,
    /// Output of `compute` (the buffers themselves are never written through `&self`).
    scratch: Mutex<Vec<f32>>,
}

impl HostUploader {
    /// `buffers` heap buffers of `buffer_bytes` each and a running upload thread.
    pub fn new(buffers: usize, buffer_bytes: usize) -> Result<Self, BackendError> {
        check_geometry("HostBackend::uploader", buffers, buffer_bytes)?;
        let bufs = (0..buffers)
            .map(|_| AlignedBuf::new(buffer_bytes, "host device buffer"))
            .collect::<Result<Vec<_>, _>>()?;
        Self::with_buffers(bufs, buffer_bytes)
    }

    /// `buffers` buffers of `buffer_bytes` each in the caller's memory at `base`, and a running
    /// upload thread ([`HostBackend::uploader_in`]).
    ///
    /// # Safety
    /// As for [`HostBackend::uploader_in`].
    pub unsafe fn new_in(
        base: *mut u8,
        buffers: usize,
        buffer_bytes: usize,
    ) -> Result<Self, BackendError> {
        let call = "HostBackend::uploader_in";
        check_geometry(call, buffers, buffer_bytes)?;
        let Some(total) = HostBackend::placement_bytes(buffers, buffer_bytes) else {
            return Err(BackendError::InvalidArgument {
                call,
                what: format!(
                    "{buffers} buffers x {buffer_bytes} bytes overflow the address space"
                ),
            });
        };
        let Some(base) = std::ptr::NonNull::new(base) else {
            return Err(BackendError::InvalidArgument {
                call,
                what: format!("null base address for {buffers} buffers x {buffer_bytes} bytes"),
            });
        };
        if (base.as_ptr() as usize).checked_add(total).is_none() {
            return Err(BackendError::InvalidArgument {
                call,
                what: format!(
                    "{total} bytes from {:p} run past the end of the address space",
                    base.as_ptr()
                ),
            });
        }
        let bufs = (0..buffers)
            .map(|i| {
                // SAFETY: i * buffer_bytes < total, inside the caller's live range (checked not
                // to wrap above), so the offset pointer stays in bounds and non-null.
                let at = unsafe { base.add(i * buffer_bytes) };
                // SAFETY: `at..at+buffer_bytes` is this buffer's share of the caller's range,
                // which stays valid for the uploader's lifetime and is used only through it.
                unsafe { AlignedBuf::placed(at, buffer_bytes) }
            })
            .collect();
        Self::with_buffers(bufs, buffer_bytes)
    }

    fn with_buffers(bufs: Vec<AlignedBuf>, buffer_bytes: usize) -> Result<Self, BackendError> {
        let buffers = bufs.len();
        let shared = Arc::new(Shared {
            guards: Guards::new(buffers),
            hook: crate::HookCell::default(),
            decoder: Mutex::new(None),
            faults: Mutex::new(Vec::new()),
            buffers: bufs,
        });
        let (jobs_tx, jobs_rx) = crossbeam_channel::unbounded::<Queued>();
        let (done_tx, done_rx) = crate::Completions::channel();
        let worker_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("pinring-host-upload".into())
            .spawn(move || upload_loop(&worker_shared, &jobs_rx, &done_tx))
            .map_err(|_| BackendError::WorkerGone {
                backend: "host",
                call: "spawning the upload thread",
            })?;
        Ok(Self {
            shared,
            buffer_bytes,
            jobs: Some(jobs_tx),
            completions: done_rx,
            thread: Some(thread),
            scratch: Mutex::new(Vec::new()),
        })
    }
}

/// At least one buffer of at least one byte.
fn check_geometry(
    call: &'static str,
    buffers: usize,
    buffer_bytes: usize,
) -> Result<(), BackendError> {
    if buffers == 0 || buffer_bytes == 0 {
        return Err(BackendError::InvalidArgument {
            call,
            what: format!(
                "need at least one buffer of at least one byte, got {buffers} x {buffer_bytes} bytes"
            ),
        });
    }
    Ok(())
}

/// A private copy of a zero-copy range (the ring's shared memory is never viewed through a Rust
/// reference: another process could write it).
///
/// # Safety
/// `ptr..ptr+len` is a live mapping.
unsafe fn mapped_copy(ptr: *const u8, len: usize) -> Result<Vec<u8>, BackendError> {
    if ptr.is_null() && len > 0 {
        return Err(BackendError::InvalidArgument {
            call: "checksum_mapped/compute_mapped",
            what: format!("null host pointer for {len} bytes"),
        });
    }
    let mut out = Vec::with_capacity(len);
    // SAFETY: the caller guarantees a live range of `len` readable bytes (non-null when len > 0,
    // checked above); `out` has capacity for `len` bytes and is private, so they cannot overlap.
    unsafe { std::ptr::copy_nonoverlapping(ptr, out.as_mut_ptr(), len) };
    // SAFETY: the copy above initialised the first `len` bytes, within the capacity.
    unsafe { out.set_len(len) };
    Ok(out)
}

/// Validates a buffer index and the byte range `offset..offset + len` against the uploader's
/// geometry.
pub(crate) fn check_range(
    call: &'static str,
    buffer: usize,
    offset: usize,
    len: usize,
    count: usize,
    buffer_bytes: usize,
) -> Result<(), BackendError> {
    if buffer >= count {
        return Err(BackendError::InvalidArgument {
            call,
            what: format!("buffer index {buffer} out of range (uploader has {count} buffers)"),
        });
    }
    if offset.checked_add(len).is_none_or(|end| end > buffer_bytes) {
        return Err(BackendError::InvalidArgument {
            call,
            what: format!(
                "{len} bytes at offset {offset} exceed the device buffer size of {buffer_bytes} \
                 bytes (buffer {buffer}); read a range inside the buffer"
            ),
        });
    }
    Ok(())
}

/// [`DeviceKernels::checksum`]'s range must start at a whole word (the CUDA kernel reads aligned
/// 8-byte words; the host backend refuses the same ranges, so code tested here runs there).
pub(crate) fn check_checksum_offset(buffer: usize, offset: usize) -> Result<(), BackendError> {
    if offset % 8 != 0 {
        return Err(BackendError::InvalidArgument {
            call: "checksum",
            what: format!(
                "offset {offset} in buffer {buffer} is not a multiple of 8 (the checksum reads \
                 whole 8-byte words); checksum from an aligned offset, such as a field's start"
            ),
        });
    }
    Ok(())
}

/// The faults' lock; a panic while it was held poisons nothing that matters (a list).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn upload_loop(shared: &Shared, jobs: &Receiver<Queued>, done: &crate::CompletionSender) {
    for Queued { job, submitted } in jobs.iter() {
        let buf = &shared.buffers[job.buffer];
        if let Some(d) = job.decode {
            let mut dec = lock(&shared.decoder);
            // `submit` refused a decode without a decoder.
            if let Some(dec) = dec.as_mut() {
                let chunk = dec.chunk_mut(job.len);
                // SAFETY: as for the copy below: `submit`'s contract keeps src..src+len valid and
                // unwritten until the completion is received; `chunk` is our own memory.
                unsafe { std::ptr::copy_nonoverlapping(job.src, chunk.as_mut_ptr(), job.len) };
                let (samples, faults) = dec.decode(job.tag, d.samples);
                if !faults.is_empty() {
                    lock(&shared.faults).extend(faults);
                }
                // SAFETY: `submit` checked dst_offset + dst_len <= buffer size and that dst_len is
                // `samples` samples (what `decode` returned); the rest as for the copy below.
                unsafe { buf.write_from(job.dst_offset, samples.as_ptr(), samples.len()) };
            }
        } else if job.len > 0 {
            // SAFETY: `submit` checked dst_offset + len <= buffer size and (by its own contract)
            // that src..src+len stays valid and unwritten until the completion is received, and
            // it lies outside our heap buffer. No reader touches this buffer now: its pending
            // counter is > 0 until the fetch_sub below, and readers require it to be 0; readers
            // announced before this job are excluded by submit's reader check (module docs).
            unsafe { buf.write_from(job.dst_offset, job.src, job.len) };
        }
        shared.guards.end_upload(job.buffer);
        let completion = Completion {
            tag: job.tag,
            buffer: job.buffer,
            len: job.len,
            result: Ok(()),
            submitted,
            completed: Instant::now(),
        };
        if done.send(vec![completion]).is_err() {
            // The uploader (holding the receiver) is gone; nothing left to report to.
            break;
        }
        shared.hook.call();
    }
}

impl CopyEngine for HostUploader {
    unsafe fn submit(&self, job: UploadJob) -> Result<(), BackendError> {
        check_job(&job, self.shared.buffers.len(), self.buffer_bytes)?;
        CpuDecoder::check_job(&lock(&self.shared.decoder), &job)?;
        let Some(jobs) = self.jobs.as_ref() else {
            return Err(BackendError::WorkerGone {
                backend: "host",
                call: "submit",
            });
        };
        let buffer = job.buffer;
        // Store-load against readers (module docs): announce the upload, then look for readers.
        self.shared.guards.begin_upload(buffer)?;
        let queued = Queued {
            job,
            submitted: Instant::now(),
        };
        if jobs.send(queued).is_err() {
            self.shared.guards.end_upload(buffer);
            return Err(BackendError::WorkerGone {
                backend: "host",
                call: "submit",
            });
        }
        Ok(())
    }

    fn set_decoder(&self, spec: pinring_image::SampleSpec) -> Result<(), BackendError> {
        CpuDecoder::install(&mut lock(&self.shared.decoder), spec, || {
            CpuDecoder::new(spec)
        })
    }

    fn take_decode_faults(&self) -> Vec<crate::DecodeFault> {
        std::mem::take(&mut *lock(&self.shared.faults))
    }

    fn decode_counts(&self) -> crate::DecodeCounts {
        lock(&self.shared.decoder)
            .as_ref()
            .map_or_else(Default::default, CpuDecoder::counts)
    }

    fn completions(&self) -> &crate::Completions {
        &self.completions
    }

    fn set_completion_hook(&self, hook: crate::CompletionHook) {
        self.shared.hook.set(hook);
    }

    fn buffer_count(&self) -> usize {
        self.shared.buffers.len()
    }

    fn buffer_bytes(&self) -> usize {
        self.buffer_bytes
    }

    fn device_ptr(&self, buffer: usize) -> u64 {
        let count = self.shared.buffers.len();
        match self.shared.buffers.get(buffer) {
            Some(b) => b.as_ptr() as u64,
            None => panic!("device buffer {buffer} out of range: the uploader has {count}"),
        }
    }
}

impl BufferHandoff for HostUploader {
    fn export(&self, buffer: usize) -> Result<Option<BufferExport>, BackendError> {
        self.check_buffer("export", buffer)?;
        Ok(None)
    }

    fn record_ready(&self, buffer: usize) -> Result<(), BackendError> {
        // A copy is complete when its Completion is sent: nothing to record.
        self.check_buffer("record_ready", buffer)
    }

    fn wait_release(&self, buffer: usize, _consumer_alive: bool) -> Result<(), BackendError> {
        // The daemon hands a buffer out again only after the consumer gave it back (ring
        // protocol): there is no device-side queue to order.
        self.check_buffer("wait_release", buffer)
    }
}

impl DeviceKernels for HostUploader {
    fn read_host(
        &self,
        buffer: usize,
        offset: usize,
        len: usize,
        f: &mut dyn FnMut(&[u8]),
    ) -> Result<bool, BackendError> {
        self.read("read_host", buffer, offset, len, |bytes| f(bytes))?;
        Ok(true)
    }

    fn checksum(&self, buffer: usize, offset: usize, len: usize) -> Result<u64, BackendError> {
        check_checksum_offset(buffer, offset)?;
        self.read("checksum", buffer, offset, len, checksum)
    }

    fn compute(&self, buffer: usize, len: usize) -> Result<(), BackendError> {
        self.read("compute", buffer, 0, len, |bytes| {
            self.sin_into_scratch(bytes)
        })
    }

    unsafe fn checksum_mapped(&self, host_ptr: *const u8, len: usize) -> Result<u64, BackendError> {
        // SAFETY: the caller guarantees a live range of `len` bytes.
        let bytes = unsafe { mapped_copy(host_ptr, len) }?;
        Ok(checksum(&bytes))
    }

    unsafe fn compute_mapped(&self, host_ptr: *mut u8, len: usize) -> Result<(), BackendError> {
        // SAFETY: the caller guarantees a live range of `len` bytes.
        let bytes = unsafe { mapped_copy(host_ptr, len) }?;
        self.sin_into_scratch(&bytes);
        Ok(())
    }
}

impl HostUploader {
    fn check_buffer(&self, call: &'static str, buffer: usize) -> Result<(), BackendError> {
        check_range(
            call,
            buffer,
            0,
            0,
            self.shared.buffers.len(),
            self.buffer_bytes,
        )
    }

    /// Runs `f` over bytes `offset..offset + len` of an idle buffer while holding it as a
    /// reader.
    fn read<R>(
        &self,
        call: &'static str,
        buffer: usize,
        offset: usize,
        len: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, BackendError> {
        check_range(
            call,
            buffer,
            offset,
            len,
            self.shared.buffers.len(),
            self.buffer_bytes,
        )?;
        let buf = &self.shared.buffers[buffer];
        let reading = self.shared.guards.begin_read(call, buffer)?;
        let r = if buf.is_placed() {
            // Memory other processes map is copied out, never referenced (AlignedBuf::placed).
            let mut copy = vec![0u8; len];
            // SAFETY: offset + len <= buffer size (checked above); as below, no copy into the
            // buffer runs while `reading` is held and every earlier one happened-before.
            unsafe { buf.copy_to(offset, &mut copy) };
            f(&copy)
        } else {
            // SAFETY: the buffer is our own heap allocation and offset + len <= its size (checked
            // above). This thread holds the buffer as a reader and saw no pending upload after
            // announcing itself (SeqCst): no copy into it runs until `reading` drops
            // (crate::guard), and every earlier copy happened-before. The slice does not outlive
            // `f`, which returns before `reading` drops.
            f(unsafe { buf.slice(offset, len) })
        };
        drop(reading);
        Ok(r)
    }

    fn sin_into_scratch(&self, bytes: &[u8]) {
        let mut out = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        out.clear();
        out.extend(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]).sin()),
        );
        std::hint::black_box(&*out);
    }
}

impl HostUploader {
    /// The result of the last `compute` call (sin of each f32), for tests and verification.
    pub fn last_compute(&self) -> Vec<f32> {
        self.scratch
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl Drop for HostUploader {
    fn drop(&mut self) {
        // Closing the job channel ends the loop after the queued jobs are copied.
        self.jobs.take();
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                tracing::error!("pinring host upload thread panicked");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn pattern(seed: u8, n: usize) -> Vec<u8> {
        (0..n)
            .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
            .collect()
    }

    #[test]
    fn uploads_complete_in_order_with_right_bytes() {
        let up = HostUploader::new(3, 4096).unwrap();
        let srcs: Vec<Vec<u8>> = (0..3).map(|i| pattern(i as u8, 1000 + i * 1000)).collect();
        for (i, s) in srcs.iter().enumerate() {
            let job = UploadJob {
                tag: 100 + i as u64,
                src: s.as_ptr(),
                len: s.len(),
                buffer: i,
                dst_offset: 0,
                decode: None,
            };
            // SAFETY: `srcs` outlives the completions received below and is not written.
            unsafe { up.submit(job) }.unwrap();
        }
        for (i, s) in srcs.iter().enumerate() {
            let c = up
                .completions()
                .recv_timeout(Duration::from_secs(10))
                .unwrap();
            assert_eq!(c.tag, 100 + i as u64);
            assert_eq!(c.buffer, i);
            assert_eq!(c.len, s.len());
            assert!(c.result.is_ok());
            assert!(c.completed >= c.submitted);
            assert_eq!(view(&up, i, s.len()), s[..]);
            assert_eq!(up.checksum(i, 0, s.len()).unwrap(), checksum(s));
        }
    }

    #[test]
    fn a_group_of_copies_is_one_completion_per_copy_on_the_host() {
        let up = HostUploader::new(1, 4096).unwrap();
        let s = pattern(4, 3000);
        let jobs = [(0, 1000, 0), (1000, 2000, 1024)].map(|(from, len, dst_offset)| UploadJob {
            tag: from as u64,
            src: s[from..].as_ptr(),
            len,
            buffer: 0,
            dst_offset,
            decode: None,
        });
        // SAFETY: `s` outlives the completions received below and is not written.
        assert_eq!(unsafe { up.submit_group(&jobs) }.unwrap(), 2);
        for (tag, len) in [(0, 1000), (1000, 2000)] {
            let c = up
                .completions()
                .recv_timeout(Duration::from_secs(10))
                .unwrap();
            assert_eq!((c.tag, c.len), (tag, len));
            c.result.unwrap();
        }
        assert_eq!(view(&up, 0, 1000), s[..1000]);
        assert_eq!(up.checksum(0, 1024, 2000).unwrap(), checksum(&s[1000..]));
    }

    #[test]
    fn many_jobs_reusing_buffers() {
        let up = HostUploader::new(2, 256).unwrap();
        let srcs: Vec<Vec<u8>> = (0..50).map(|i| pattern(i as u8, 256)).collect();
        for (i, s) in srcs.iter().enumerate() {
            let job = UploadJob {
                tag: i as u64,
                src: s.as_ptr(),
                len: s.len(),
                buffer: i % 2,
                dst_offset: 0,
                decode: None,
            };
            // SAFETY: `srcs` outlives all completions (received below or at drop).
            unsafe { up.submit(job) }.unwrap();
        }
        for i in 0..50u64 {
            let c = up
                .completions()
                .recv_timeout(Duration::from_secs(10))
                .unwrap();
            assert_eq!(c.tag, i);
        }
        assert_eq!(view(&up, 0, 256), srcs[48][..]);
        assert_eq!(view(&up, 1, 256), srcs[49][..]);
    }

    #[test]
    fn rejects_bad_jobs() {
        let up = HostUploader::new(1, 16).unwrap();
        let s = [0u8; 32];
        let too_long = UploadJob {
            tag: 0,
            src: s.as_ptr(),
            len: 32,
            buffer: 0,
            dst_offset: 0,
            decode: None,
        };
        // SAFETY: rejected before any copy is queued.
        let e = unsafe { up.submit(too_long) }.unwrap_err();
        assert!(
            e.to_string()
                .contains("end past the device buffer size of 16 bytes"),
            "{e}"
        );
        let bad_index = UploadJob {
            tag: 0,
            src: s.as_ptr(),
            len: 8,
            buffer: 1,
            dst_offset: 0,
            decode: None,
        };
        // SAFETY: rejected before any copy is queued.
        let e = unsafe { up.submit(bad_index) }.unwrap_err();
        assert!(e.to_string().contains("out of range"), "{e}");
        assert!(up.read_host(0, 0, 17, &mut |_| ()).is_err());
        let e = up.read_host(0, 10, 7, &mut |_| ()).unwrap_err();
        assert!(e.to_string().contains("7 bytes at offset 10 exceed"), "{e}");
        assert!(up.read_host(0, usize::MAX, 1, &mut |_| ()).is_err());
        assert!(up.checksum(0, 12, 4).is_err());
    }

    #[test]
    fn parts_land_at_their_offsets_in_one_buffer() {
        // A 3-part "batch" of 300 bytes into a 512-byte buffer, the parts submitted out of order.
        let up = HostUploader::new(1, 512).unwrap();
        let parts: Vec<Vec<u8>> = (0..3).map(|i| pattern(i as u8 + 1, 100)).collect();
        for &i in &[2usize, 0, 1] {
            let job = UploadJob {
                tag: i as u64,
                src: parts[i].as_ptr(),
                len: parts[i].len(),
                buffer: 0,
                dst_offset: i * 100,
                decode: None,
            };
            // SAFETY: `parts` outlives the completions received below and is not written.
            unsafe { up.submit(job) }.unwrap();
        }
        for _ in 0..3 {
            let c = up
                .completions()
                .recv_timeout(Duration::from_secs(10))
                .unwrap();
            assert!(c.result.is_ok());
        }
        let whole: Vec<u8> = parts.concat();
        assert_eq!(view(&up, 0, 300), whole);
        assert_eq!(up.checksum(0, 0, 300).unwrap(), checksum(&whole));
        // A range inside the buffer: read and checksummed on its own (word indices from 0).
        let mut middle = Vec::new();
        assert!(up
            .read_host(0, 104, 150, &mut |b| middle.extend_from_slice(b))
            .unwrap());
        assert_eq!(middle, whole[104..254]);
        assert_eq!(
            up.checksum(0, 104, 150).unwrap(),
            checksum(&whole[104..254])
        );
        let e = up.checksum(0, 100, 8).unwrap_err();
        assert!(e.to_string().contains("not a multiple of 8"), "{e}");
    }

    #[test]
    fn an_upload_past_the_buffer_end_is_refused() {
        let up = HostUploader::new(1, 64).unwrap();
        let s = [1u8; 32];
        let job = |dst_offset: usize, len: usize| UploadJob {
            tag: 0,
            src: s.as_ptr(),
            len,
            buffer: 0,
            dst_offset,
            decode: None,
        };
        // SAFETY: rejected before any copy is queued.
        let e = unsafe { up.submit(job(40, 32)) }.unwrap_err();
        assert!(
            e.to_string()
                .contains("32 bytes at offset 40 end past the device buffer size of 64 bytes"),
            "{e}"
        );
        // SAFETY: rejected before any copy is queued (the end overflows).
        assert!(unsafe { up.submit(job(usize::MAX, 1)) }.is_err());
        // Exactly to the end is fine.
        // SAFETY: `s` outlives the completion received below.
        unsafe { up.submit(job(32, 32)) }.unwrap();
        up.completions()
            .recv_timeout(Duration::from_secs(10))
            .unwrap();
        assert_eq!(view(&up, 0, 64)[32..], s[..]);
    }

    fn view(up: &HostUploader, buffer: usize, len: usize) -> Vec<u8> {
        let mut out = Vec::new();
        assert!(up
            .read_host(buffer, 0, len, &mut |b| out.extend_from_slice(b))
            .unwrap());
        out
    }

    #[test]
    fn a_buffer_being_read_refuses_uploads() {
        let up = HostUploader::new(1, 64).unwrap();
        let src = [7u8; 8];
        let mut refused = None;
        up.read_host(0, 0, 8, &mut |_| {
            let job = UploadJob {
                tag: 0,
                src: src.as_ptr(),
                len: 8,
                buffer: 0,
                dst_offset: 0,
                decode: None,
            };
            // SAFETY: refused before any copy is queued (the buffer is being read).
            refused = Some(unsafe { up.submit(job) });
        })
        .unwrap();
        let err = refused.unwrap().unwrap_err();
        assert!(matches!(err, BackendError::BufferBusy { .. }), "{err}");
    }

    #[test]
    fn compute_is_sin() {
        let up = HostUploader::new(1, 64).unwrap();
        let xs: Vec<f32> = (0..16).map(|i| i as f32 * 0.25).collect();
        let bytes: Vec<u8> = xs.iter().flat_map(|x| x.to_le_bytes()).collect();
        let job = UploadJob {
            tag: 1,
            src: bytes.as_ptr(),
            len: bytes.len(),
            buffer: 0,
            dst_offset: 0,
            decode: None,
        };
        // SAFETY: `bytes` outlives the completion received below.
        unsafe { up.submit(job) }.unwrap();
        up.completions()
            .recv_timeout(Duration::from_secs(10))
            .unwrap();
        up.compute(0, bytes.len()).unwrap();
        let ys = up.last_compute();
        assert_eq!(ys.len(), 16);
        for (x, y) in xs.iter().zip(ys) {
            assert!((x.sin() - y).abs() < 1e-6);
        }
    }

    #[test]
    fn buffers_in_caller_memory_hold_the_uploads_in_place() {
        // Three 1000-byte buffers (not a multiple of anything) in a "segment" with a margin.
        let (n, bytes) = (3usize, 1000usize);
        let total = HostBackend::placement_bytes(n, bytes).unwrap();
        assert_eq!(total, 3000);
        let segment = AlignedBuf::new(total + 96, "test segment").unwrap();
        let base = segment.as_mut_ptr().wrapping_add(64);
        // SAFETY: base..base+3000 lies inside `segment`, which outlives `up` (dropped first) and
        // is only read below, after the uploads' completions.
        let up = unsafe { HostBackend::new().uploader_in(base, n, bytes) }.unwrap();
        assert_eq!((up.buffer_count(), up.buffer_bytes()), (n, bytes));
        let srcs: Vec<Vec<u8>> = (0..n).map(|i| pattern(i as u8 + 40, bytes)).collect();
        for (i, s) in srcs.iter().enumerate() {
            assert_eq!(up.device_ptr(i), base as u64 + (i * bytes) as u64);
            // Nothing to share through CUDA IPC, nothing to order: the calls do nothing.
            assert_eq!(up.export(i).unwrap(), None);
            up.wait_release(i, true).unwrap();
            let job = UploadJob {
                tag: i as u64,
                src: s.as_ptr(),
                len: s.len(),
                buffer: i,
                dst_offset: 0,
                decode: None,
            };
            // SAFETY: `srcs` outlives the completions received below.
            unsafe { up.submit(job) }.unwrap();
            up.record_ready(i).unwrap();
        }
        for _ in 0..n {
            let c = up
                .completions()
                .recv_timeout(Duration::from_secs(10))
                .unwrap();
            assert!(c.result.is_ok());
        }
        // Read through the uploader (a copy of the placed bytes) and straight from the memory.
        for (i, s) in srcs.iter().enumerate() {
            let mut seen = Vec::new();
            assert!(up
                .read_host(i, 0, bytes, &mut |b| seen.extend_from_slice(b))
                .unwrap());
            assert_eq!(seen, *s);
            assert_eq!(up.checksum(i, 0, bytes).unwrap(), checksum(s));
        }
        up.compute(2, 400).unwrap();
        drop(up);
        let mut whole = vec![0u8; total + 96];
        // SAFETY: the uploader is gone; nothing else writes `segment`.
        unsafe { segment.copy_to(0, &mut whole) };
        assert!(whole[..64].iter().all(|&b| b == 0), "nothing before base");
        assert_eq!(whole[64..64 + total], srcs.concat()[..]);
        assert!(
            whole[64 + total..].iter().all(|&b| b == 0),
            "nothing past the end"
        );
    }

    fn refused(r: Result<Box<dyn Uploader>, BackendError>) -> BackendError {
        match r {
            Ok(_) => panic!("the placement was accepted"),
            Err(e) => e,
        }
    }

    #[test]
    fn placed_buffers_are_checked() {
        let b = HostBackend::new();
        let mut mem = [0u8; 16];
        // SAFETY: refused before any memory is touched (the same for each call below).
        let e = refused(unsafe { b.uploader_in(std::ptr::null_mut(), 2, 8) });
        assert!(e.to_string().contains("null base address"), "{e}");
        // SAFETY: as above.
        let e = refused(unsafe { b.uploader_in(mem.as_mut_ptr(), 0, 8) });
        assert!(e.to_string().contains("at least one buffer"), "{e}");
        // SAFETY: as above.
        let e = refused(unsafe { b.uploader_in(mem.as_mut_ptr(), usize::MAX, 2) });
        assert!(e.to_string().contains("overflow"), "{e}");
        assert_eq!(HostBackend::placement_bytes(usize::MAX, 2), None);
        // SAFETY: `mem` (16 bytes) outlives the uploader, which is not used to copy anything.
        let up = unsafe { b.uploader_in(mem.as_mut_ptr(), 2, 8) }.unwrap();
        for call in [
            up.export(2).map(|_| ()),
            up.record_ready(2),
            up.wait_release(2, false),
        ] {
            let e = call.unwrap_err();
            assert!(e.to_string().contains("out of range"), "{e}");
        }
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| up.device_ptr(2)));
        assert!(r.is_err(), "device_ptr of a buffer out of range panics");
    }

    #[test]
    fn heap_buffers_have_no_export_either() {
        let up = HostUploader::new(2, 64).unwrap();
        assert_eq!(up.export(1).unwrap(), None);
        up.record_ready(1).unwrap();
        up.wait_release(1, true).unwrap();
        assert_ne!(up.device_ptr(0), up.device_ptr(1));
        assert_eq!(up.device_ptr(0) % crate::buf::PAGE as u64, 0);
    }

    #[test]
    fn drop_with_jobs_in_flight_joins() {
        let src = vec![7u8; 1 << 20];
        let up = HostUploader::new(4, 1 << 20).unwrap();
        for i in 0..16 {
            let job = UploadJob {
                tag: i,
                src: src.as_ptr(),
                len: src.len(),
                buffer: (i % 4) as usize,
                dst_offset: 0,
                decode: None,
            };
            // SAFETY: `src` outlives `up`, whose drop joins the thread after all copies.
            unsafe { up.submit(job) }.unwrap();
        }
        drop(up);
    }
}
