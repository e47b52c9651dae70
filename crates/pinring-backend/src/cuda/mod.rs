//! The CUDA backend.
//!
//! - [`CudaBackend`] holds the device's primary context (`Arc<CudaContext>`). It is created only
//!   after probing that `libcuda` can be loaded, so a machine without a driver gets an error
//!   (or, with `--backend auto`, the host backend) instead of cudarc's load panic.
//! - `register` pins the ring with `cuMemHostRegister` in chunks of at most 256 GiB.
//! - [`CudaUploader`] owns N device buffers, a copy stream and a kernel stream. `submit` enqueues
//!   `cuMemcpyHtoDAsync` from the raw (registered) host pointer and records a blocking-sync event;
//!   a completion thread waits on the events in submission order and sends [`Completion`]s.
//! - `checksum` / `compute` run embedded PTX kernels (see `ptx.rs`) on the kernel stream.
//!
//! All raw driver calls live in `raw.rs`; this module only sequences them.

mod ptx;
mod raw;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};
use cudarc::driver::sys;
use cudarc::driver::{result, CudaContext, CudaStream, DriverError};

use crate::buf::AlignedBuf;
use crate::checksum::word_term;
use crate::error::cuda_error;
use crate::host::check_range;
use crate::{Backend, BackendError, Completion, Registration, UploadJob, Uploader};

pub use raw::{describe, driver_library_present, ChunkTable, HostRegistration, MAX_REGISTER_CHUNK};

/// Loads the driver library (after probing for it) and runs `cuInit(0)`.
fn init_driver() -> Result<(), BackendError> {
    if !driver_library_present() {
        return Err(BackendError::NoDriver);
    }
    match catch_unwind(result::init) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(BackendError::InitFailed {
            code: e.0,
            description: describe(e.0),
        }),
        Err(p) => Err(BackendError::DriverPanic {
            call: "cuInit",
            message: panic_message(&*p),
        }),
    }
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

/// Runs `f`, turning a panic inside cudarc into [`BackendError::DriverPanic`].
fn guarded<T>(
    call: &'static str,
    f: impl FnOnce() -> Result<T, BackendError>,
) -> Result<T, BackendError> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        Err(BackendError::DriverPanic {
            call,
            message: panic_message(&*p),
        })
    })
}

fn device_count() -> Result<usize, BackendError> {
    result::device::get_count()
        .map(|n| n.max(0) as usize)
        .map_err(|e| cuda_error("cuDeviceGetCount", "the driver".to_string(), e.0))
}

/// Probes the driver without creating a context: `Ok("NVIDIA H200 x1, driver 13.0")`.
pub(crate) fn probe() -> Result<String, BackendError> {
    init_driver()?;
    guarded("probe", || {
        let count = device_count()?;
        if count == 0 {
            return Err(BackendError::NoSuchDevice { device: 0, count });
        }
        let mut names = Vec::with_capacity(count);
        for i in 0..count {
            let name = result::device::get(i as i32)
                .and_then(result::device::get_name)
                .map_err(|e| cuda_error("cuDeviceGetName", format!("device {i}"), e.0))?;
            names.push(name);
        }
        let version = raw::driver_version()
            .map_err(|e| cuda_error("cuDriverGetVersion", "the driver".to_string(), e.0))?;
        let devices = if names.iter().all(|n| *n == names[0]) {
            format!("{} x{count}", names[0])
        } else {
            names.join(", ")
        };
        Ok(format!(
            "{devices}, driver {}.{}",
            version / 1000,
            (version % 1000) / 10
        ))
    })
}

fn gib(bytes: usize) -> u64 {
    (bytes as f64 / (1u64 << 30) as f64).round() as u64
}

/// The CUDA backend for one device.
#[derive(Debug)]
pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    device: usize,
    name: String,
    total_mem: usize,
    sm_count: u32,
    compute_capability: (i32, i32),
    /// Chunks registered through this backend (uploads split at their boundaries).
    chunks: Arc<ChunkTable>,
}

impl CudaBackend {
    /// Loads the driver (probing first), checks that `device` exists and retains its primary
    /// context.
    pub fn new(device: usize) -> Result<Self, BackendError> {
        init_driver()?;
        guarded("CudaBackend::new", || {
            let count = device_count()?;
            if device >= count {
                return Err(BackendError::NoSuchDevice { device, count });
            }
            let object = || format!("device {device}");
            let ctx = CudaContext::new(device)
                .map_err(|e| cuda_error("cuDevicePrimaryCtxRetain", object(), e.0))?;
            let name = ctx
                .name()
                .map_err(|e| cuda_error("cuDeviceGetName", object(), e.0))?;
            let total_mem = ctx
                .total_mem()
                .map_err(|e| cuda_error("cuDeviceTotalMem", object(), e.0))?;
            let sm_count = ctx
                .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
                .map_err(|e| cuda_error("cuDeviceGetAttribute", object(), e.0))?;
            let compute_capability = ctx
                .compute_capability()
                .map_err(|e| cuda_error("cuDeviceGetAttribute", object(), e.0))?;
            Ok(Self {
                ctx,
                device,
                name,
                total_mem,
                sm_count: sm_count.max(1) as u32,
                compute_capability,
                chunks: Arc::new(ChunkTable::default()),
            })
        })
    }

    /// The device's primary context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The device index.
    pub fn device(&self) -> usize {
        self.device
    }

    /// The device name, e.g. "NVIDIA H200".
    pub fn device_name(&self) -> &str {
        &self.name
    }

    /// Total device memory in bytes.
    pub fn total_mem(&self) -> usize {
        self.total_mem
    }

    /// (major, minor) compute capability.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.compute_capability
    }

    /// Zero-copy mode: the device address of `host_ptr`, which must lie in a range registered
    /// with `devicemap = true` (`cuMemHostGetDevicePointer_v2`).
    pub fn mapped_device_ptr(&self, host_ptr: *const u8) -> Result<u64, BackendError> {
        raw::host_device_pointer(&self.ctx, host_ptr).map_err(|e| {
            cuda_error(
                "cuMemHostGetDevicePointer",
                format!("host address {host_ptr:p} on device {}", self.device),
                e.0,
            )
        })
    }

    /// The raw host-to-device ceiling: times `iters` copies of `bytes` from one host buffer
    /// (page-locked with `cuMemHostRegister` when `registered`, else plain pageable memory) into
    /// one device buffer on one stream; returns GB/s (1e9 bytes per second).
    pub fn raw_h2d_gbps(
        &self,
        bytes: usize,
        iters: usize,
        registered: bool,
    ) -> Result<f64, BackendError> {
        if bytes == 0 || iters == 0 {
            return Err(BackendError::InvalidArgument {
                call: "raw_h2d_gbps",
                what: format!("need bytes > 0 and iters > 0, got {bytes} bytes x {iters} iters"),
            });
        }
        let dev = self.device;
        let mut host = AlignedBuf::new(bytes, "raw H2D benchmark source")?;
        host.fill(0xA5); // fault every page in before registering / timing
        let reg = if registered {
            // SAFETY: `host` is a live heap allocation of `bytes` bytes that is neither freed
            // nor moved until after `reg` is dropped (explicit drop order at the end).
            let r = unsafe {
                HostRegistration::register(
                    &self.ctx,
                    host.as_mut_ptr(),
                    host.len(),
                    sys::CU_MEMHOSTREGISTER_PORTABLE,
                    MAX_REGISTER_CHUNK,
                    &Arc::new(ChunkTable::default()),
                )
            };
            Some(r.map_err(|f| register_error(f, host.as_ptr(), bytes, dev))?)
        } else {
            None
        };
        let dst = raw::DeviceBuffer::alloc(&self.ctx, bytes).map_err(|e| {
            cuda_error(
                "cuMemAlloc",
                format!("{bytes} bytes on device {dev} (raw H2D benchmark)"),
                e.0,
            )
        })?;
        let stream = self.new_stream("raw H2D benchmark")?;
        let done = raw::Event::new(&self.ctx)
            .map_err(|e| cuda_error("cuEventCreate", format!("device {dev}"), e.0))?;
        let object = || {
            format!(
                "{bytes} bytes from host {:p} to device {dev}",
                host.as_ptr()
            )
        };
        let run = |n: usize| -> Result<(), BackendError> {
            for _ in 0..n {
                // SAFETY: `host` stays alive and unwritten until `done` below has completed,
                // which covers every copy enqueued on `stream` before it.
                unsafe { raw::memcpy_htod_async(&dst, 0, host.as_ptr(), bytes, &stream) }
                    .map_err(|e| cuda_error("cuMemcpyHtoDAsync", object(), e.0))?;
            }
            done.record(&stream)
                .and_then(|()| done.synchronize())
                .map_err(|e| cuda_error("cuEventSynchronize", object(), e.0))
        };
        run(1)?; // warm-up (first-touch costs, clocks)
        let t0 = Instant::now();
        run(iters)?;
        let secs = t0.elapsed().as_secs_f64();
        drop(dst);
        drop(reg);
        drop(host);
        Ok(bytes as f64 * iters as f64 / secs.max(1e-12) / 1e9)
    }

    fn new_stream(&self, what: &str) -> Result<Arc<CudaStream>, BackendError> {
        self.ctx.new_stream().map_err(|e| {
            cuda_error(
                "cuStreamCreate",
                format!("{what} stream on device {}", self.device),
                e.0,
            )
        })
    }

    /// A concrete uploader (the trait method boxes this).
    pub fn cuda_uploader(
        &self,
        buffers: usize,
        buffer_bytes: usize,
    ) -> Result<CudaUploader, BackendError> {
        CudaUploader::new(self, buffers, buffer_bytes)
    }
}

fn register_error(
    f: raw::RegisterFailure,
    base: *const u8,
    len: usize,
    dev: usize,
) -> BackendError {
    let whole = format!("{len} bytes at {base:p}");
    let object = if f.chunk_len == len {
        format!("{whole} (device {dev})")
    } else {
        format!(
            "chunk {} ({} bytes at {:#x}) of {whole} (device {dev})",
            f.chunk_index, f.chunk_len, f.chunk_base
        )
    };
    cuda_error("cuMemHostRegister", object, f.code)
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn describe(&self) -> String {
        format!(
            "cuda: {} (device {}, {} GiB)",
            self.name,
            self.device,
            gib(self.total_mem)
        )
    }

    unsafe fn register(
        &self,
        base: *mut u8,
        len: usize,
        devicemap: bool,
    ) -> Result<Registration, BackendError> {
        // SAFETY: forwarded from the caller of `Backend::register`.
        unsafe { self.register_chunked(base, len, devicemap, MAX_REGISTER_CHUNK) }
    }

    fn raw_copy_gbps(
        &self,
        bytes: usize,
        iters: usize,
        registered: bool,
    ) -> Result<f64, BackendError> {
        self.raw_h2d_gbps(bytes, iters, registered)
    }

    fn uploader(
        &self,
        buffers: usize,
        buffer_bytes: usize,
    ) -> Result<Box<dyn Uploader>, BackendError> {
        Ok(Box::new(self.cuda_uploader(buffers, buffer_bytes)?))
    }
}

impl CudaBackend {
    /// [`Backend::register`] with an explicit chunk size (a multiple of the page size, at most
    /// [`MAX_REGISTER_CHUNK`] in production; smaller values exercise chunking in tests).
    ///
    /// # Safety
    /// As for [`Backend::register`]: the range must be a live mapping that outlives the guard.
    pub unsafe fn register_chunked(
        &self,
        base: *mut u8,
        len: usize,
        devicemap: bool,
        max_chunk: usize,
    ) -> Result<Registration, BackendError> {
        if base.is_null() || len == 0 || max_chunk == 0 || max_chunk % crate::buf::PAGE != 0 {
            return Err(BackendError::InvalidArgument {
                call: "register",
                what: format!(
                    "empty or null range or bad chunk size: {len} bytes at {base:p}, chunks of {max_chunk} bytes"
                ),
            });
        }
        if (base as usize) % crate::buf::PAGE != 0 || len % crate::buf::PAGE != 0 {
            tracing::warn!(
                "registering {len} bytes at {base:p}, which is not page-aligned; the driver pins \
                 whole pages"
            );
        }
        let mut flags = sys::CU_MEMHOSTREGISTER_PORTABLE;
        if devicemap {
            flags |= sys::CU_MEMHOSTREGISTER_DEVICEMAP;
        }
        let start = Instant::now();
        // SAFETY: the caller guarantees [base, base+len) is a live mapping that outlives the
        // returned guard, which owns the HostRegistration.
        let reg = unsafe {
            HostRegistration::register(&self.ctx, base, len, flags, max_chunk, &self.chunks)
        }
        .map_err(|f| register_error(f, base, len, self.device))?;
        let seconds = start.elapsed().as_secs_f64();
        tracing::info!(
            bytes = len,
            chunks = reg.chunk_count(),
            seconds,
            "registered host range with cuMemHostRegister"
        );
        Ok(Registration {
            base: base as usize,
            bytes: len as u64,
            seconds,
            inner: Some(reg),
        })
    }
}

/// A copy in flight, as handed to the completion thread.
#[derive(Debug)]
struct InFlight {
    tag: u64,
    buffer: usize,
    len: usize,
    submitted: Instant,
    /// Recorded on the copy stream right after the copy.
    event: raw::Event,
}

/// State used by `checksum` / `compute` (one at a time).
#[derive(Debug)]
struct KernelState {
    /// Loaded on first use, so a PTX problem never blocks plain uploads.
    kernels: Option<raw::Kernels>,
    /// 8-byte device word the checksum kernel accumulates into.
    result: raw::DeviceBuffer,
    /// Signalled after each kernel-stream operation.
    done: raw::Event,
}

/// Upload engine of the CUDA backend.
#[derive(Debug)]
pub struct CudaUploader {
    ctx: Arc<CudaContext>,
    device: usize,
    sm_count: u32,
    buffer_bytes: usize,
    buffers: Vec<raw::DeviceBuffer>,
    /// The backend's registered chunks: copies are split at their boundaries.
    chunks: Arc<ChunkTable>,
    /// Uploads submitted into each buffer and not yet observed complete.
    pending: Arc<Vec<AtomicUsize>>,
    copy_stream: Arc<CudaStream>,
    kernel_stream: Arc<CudaStream>,
    inflight: Option<Sender<InFlight>>,
    /// Events the completion thread has finished with, for reuse.
    free_events: Receiver<raw::Event>,
    completions: Receiver<Completion>,
    thread: Option<JoinHandle<()>>,
    kernel_state: Mutex<KernelState>,
    /// Called by the completion thread after it sent completions.
    hook: Arc<crate::HookCell>,
}

impl CudaUploader {
    fn new(
        backend: &CudaBackend,
        buffers: usize,
        buffer_bytes: usize,
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
        let mut bufs = Vec::with_capacity(buffers);
        for i in 0..buffers {
            let b = raw::DeviceBuffer::alloc(&ctx, buffer_bytes).map_err(|e| {
                cuda_error(
                    "cuMemAlloc",
                    format!(
                        "device buffer {i} of {buffers} ({buffer_bytes} bytes each, {} GiB device) on device {device}",
                        gib(backend.total_mem)
                    ),
                    e.0,
                )
            })?;
            bufs.push(b);
        }
        let copy_stream = backend.new_stream("copy")?;
        let kernel_stream = backend.new_stream("kernel")?;
        let result = raw::DeviceBuffer::alloc(&ctx, 8).map_err(|e| {
            cuda_error(
                "cuMemAlloc",
                format!("8-byte checksum word on device {device}"),
                e.0,
            )
        })?;
        let done = raw::Event::new(&ctx)
            .map_err(|e| cuda_error("cuEventCreate", format!("device {device}"), e.0))?;
        let pending: Arc<Vec<AtomicUsize>> =
            Arc::new((0..buffers).map(|_| AtomicUsize::new(0)).collect());
        let (inflight_tx, inflight_rx) = crossbeam_channel::unbounded::<InFlight>();
        let (done_tx, done_rx) = crossbeam_channel::unbounded::<Completion>();
        let (free_tx, free_rx) = crossbeam_channel::unbounded::<raw::Event>();
        let hook: Arc<crate::HookCell> = Arc::new(crate::HookCell::default());
        let thread = {
            let ctx = Arc::clone(&ctx);
            let pending = Arc::clone(&pending);
            std::thread::Builder::new()
                .name(format!("pinring-cuda{device}-complete"))
                .spawn({
                    let hook = Arc::clone(&hook);
                    move || {
                        completion_loop(
                            &ctx,
                            device,
                            &pending,
                            &inflight_rx,
                            &done_tx,
                            &free_tx,
                            &hook,
                        )
                    }
                })
                .map_err(|_| BackendError::WorkerGone {
                    backend: "cuda",
                    call: "spawning the completion thread",
                })?
        };
        Ok(Self {
            ctx,
            device,
            sm_count: backend.sm_count,
            buffer_bytes,
            buffers: bufs,
            chunks: Arc::clone(&backend.chunks),
            pending,
            copy_stream,
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
        })
    }

    /// The device index.
    pub fn device(&self) -> usize {
        self.device
    }

    /// Device address of buffer `buffer` (for callers launching their own kernels).
    pub fn buffer_device_ptr(&self, buffer: usize) -> Option<u64> {
        self.buffers.get(buffer).map(|b| b.ptr())
    }

    /// Checks `buffer`/`len` and that no upload into the buffer is pending.
    fn idle_buffer(
        &self,
        call: &'static str,
        buffer: usize,
        len: usize,
    ) -> Result<&raw::DeviceBuffer, BackendError> {
        check_range(call, buffer, len, self.buffers.len(), self.buffer_bytes)?;
        let pending = self.pending[buffer].load(Ordering::Acquire);
        if pending != 0 {
            return Err(BackendError::BufferBusy {
                call,
                buffer,
                pending,
            });
        }
        Ok(&self.buffers[buffer])
    }

    /// Grid size for `n` items: enough blocks to cover them, at most 8 per SM.
    fn grid(&self, n: u64) -> (u32, u32) {
        let block = u64::from(ptx::BLOCK);
        let max_blocks = u64::from(self.sm_count) * 8;
        let blocks = n.div_ceil(block).clamp(1, max_blocks);
        (blocks as u32, ptx::BLOCK)
    }

    fn lock_kernels(&self) -> Result<std::sync::MutexGuard<'_, KernelState>, BackendError> {
        let mut st = self.kernel_state.lock().unwrap_or_else(|e| e.into_inner());
        if st.kernels.is_none() {
            let k = raw::Kernels::load(&self.ctx, ptx::PTX, ptx::CHECKSUM_KERNEL, ptx::SIN_KERNEL)
                .map_err(|f| {
                    cuda_error(
                        f.call,
                        format!(
                            "pinring's embedded PTX (.target sm_80) on device {}; JIT log: {}",
                            self.device,
                            if f.log.is_empty() { "(empty)" } else { &f.log }
                        ),
                        f.code,
                    )
                })?;
            st.kernels = Some(k);
        }
        Ok(st)
    }

    fn kernel_error(
        &self,
        call: &'static str,
        what: &str,
        buffer: usize,
        len: usize,
        e: DriverError,
    ) -> BackendError {
        cuda_error(
            call,
            format!(
                "{what} over {len} bytes of device buffer {buffer} on device {}",
                self.device
            ),
            e.0,
        )
    }
}

/// How many uploads the completion thread waits for at once: it sleeps on the event of the newest
/// of up to this many queued uploads and then completes them all (copies on one stream finish in
/// order). Fewer sleeps and driver wake-ups per batch, at the cost of completing the first ones
/// up to three copies late.
const COMPLETION_WINDOW: usize = 4;

fn completion_loop(
    ctx: &Arc<CudaContext>,
    device: usize,
    pending: &[AtomicUsize],
    inflight: &Receiver<InFlight>,
    done: &Sender<Completion>,
    free: &Sender<raw::Event>,
    hook: &crate::HookCell,
) {
    let bound = raw::make_current(ctx);
    if let Err(e) = &bound {
        tracing::error!(code = ?e.0, device, "completion thread: cuCtxSetCurrent failed");
    }
    let mut window: std::collections::VecDeque<InFlight> = std::collections::VecDeque::new();
    loop {
        if window.is_empty() {
            match inflight.recv() {
                Ok(f) => window.push_back(f),
                Err(_) => break,
            }
        }
        while window.len() < COMPLETION_WINDOW {
            match inflight.try_recv() {
                Ok(f) => window.push_back(f),
                Err(_) => break,
            }
        }
        let newest = window.back().map(|f| (f.tag, f.buffer, f.len));
        let waited = match (&bound, window.back()) {
            (Err(e), _) => Err(("cuCtxSetCurrent", e.0)),
            (Ok(()), Some(f)) => f
                .event
                .synchronize()
                .map_err(|e| ("cuEventSynchronize", e.0)),
            (Ok(()), None) => Ok(()),
        };
        for f in window.drain(..) {
            let result = waited.map_err(|(call, code)| {
                let (tag, buffer, len) = newest.unwrap_or((f.tag, f.buffer, f.len));
                cuda_error(
                    call,
                    format!(
                        "upload of {} bytes into device buffer {} (tag {}) on device {device}, waited for with the upload of {len} bytes into buffer {buffer} (tag {tag})",
                        f.len, f.buffer, f.tag
                    ),
                    code,
                )
            });
            pending[f.buffer].fetch_sub(1, Ordering::Release);
            let completion = Completion {
                tag: f.tag,
                buffer: f.buffer,
                len: f.len,
                result,
                submitted: f.submitted,
                completed: Instant::now(),
            };
            // The uploader owns the receivers; if it is gone we just keep draining.
            let _ = done.send(completion);
            let _ = free.send(f.event);
        }
        hook.call();
    }
}

impl Uploader for CudaUploader {
    unsafe fn submit(&self, job: UploadJob) -> Result<(), BackendError> {
        check_range(
            "submit",
            job.buffer,
            job.len,
            self.buffers.len(),
            self.buffer_bytes,
        )?;
        if job.len > 0 && job.src.is_null() {
            return Err(BackendError::InvalidArgument {
                call: "submit",
                what: format!(
                    "null source pointer for {} bytes (tag {})",
                    job.len, job.tag
                ),
            });
        }
        let gone = BackendError::WorkerGone {
            backend: "cuda",
            call: "submit",
        };
        let Some(tx) = self.inflight.as_ref() else {
            return Err(gone);
        };
        let device = self.device;
        let event = match self.free_events.try_recv() {
            Ok(e) => e,
            Err(_) => raw::Event::new(&self.ctx)
                .map_err(|e| cuda_error("cuEventCreate", format!("device {device}"), e.0))?,
        };
        let object = || {
            format!(
                "{} bytes from host {:p} into device buffer {} (tag {}) on device {device}",
                job.len, job.src, job.buffer, job.tag
            )
        };
        let b = job.buffer;
        self.pending[b].fetch_add(1, Ordering::AcqRel);
        let submitted = Instant::now();
        // One copy per registered chunk the source touches (usually exactly one).
        let start = job.src as usize;
        let end = start + job.len;
        let mut enqueued = Ok(());
        let mut cur = start;
        while cur < end {
            let next = self.chunks.next_boundary(cur, end);
            // SAFETY: [cur, next) is a piece of src..src+len, and (cur - start) + (next - cur)
            // <= len <= buffer size (checked above); the caller of `submit` guarantees
            // src..src+len stays valid and unwritten until the Completion is received, and the
            // completion thread sends it only after the event recorded below (which follows
            // these copies on the same stream) has completed. Device buffers are freed only
            // after that thread has drained (Drop).
            let r = unsafe {
                raw::memcpy_htod_async(
                    &self.buffers[b],
                    cur - start,
                    cur as *const u8,
                    next - cur,
                    &self.copy_stream,
                )
            };
            if let Err(e) = r {
                enqueued = Err(cuda_error("cuMemcpyHtoDAsync", object(), e.0));
                break;
            }
            cur = next;
        }
        let recorded = enqueued.and_then(|()| {
            event
                .record(&self.copy_stream)
                .map_err(|e| cuda_error("cuEventRecord", object(), e.0))
        });
        if let Err(e) = recorded {
            // The copy may have been enqueued even though recording failed: wait for the
            // stream so the source is no longer read when we return an error.
            if let Ok(ev) = raw::Event::new(&self.ctx) {
                let _ = ev.record(&self.copy_stream).and_then(|()| ev.synchronize());
            }
            self.pending[b].fetch_sub(1, Ordering::AcqRel);
            return Err(e);
        }
        let flight = InFlight {
            tag: job.tag,
            buffer: b,
            len: job.len,
            submitted,
            event,
        };
        if let Err(crossbeam_channel::SendError(f)) = tx.send(flight) {
            // Completion thread gone: wait for the copy ourselves before reporting.
            let _ = f.event.synchronize();
            self.pending[b].fetch_sub(1, Ordering::AcqRel);
            return Err(gone);
        }
        Ok(())
    }

    fn completions(&self) -> &Receiver<Completion> {
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

    fn read_host(
        &self,
        _buffer: usize,
        _len: usize,
        _f: &mut dyn FnMut(&[u8]),
    ) -> Result<bool, BackendError> {
        // Device memory is not readable from the host: verifying sinks use `checksum`.
        Ok(false)
    }

    fn checksum(&self, buffer: usize, len: usize) -> Result<u64, BackendError> {
        let buf = self.idle_buffer("checksum", buffer, len)?;
        let err = |call, e| self.kernel_error(call, "checksum", buffer, len, e);
        // SAFETY: `buf` is a live device allocation of at least `len` bytes (checked), borrowed
        // for the whole call. It had no pending uploads (checked); a copy submitted into it
        // meanwhile (a caller bug) could only change device bytes the kernel reads, never host
        // memory.
        unsafe {
            self.checksum_span(buf.span(), len, &err, &mut |last, st| {
                raw::copy_dtoh_wait(last, buf, len - last.len(), &self.kernel_stream, &st.done)
            })
        }
    }

    fn compute(&self, buffer: usize, len: usize) -> Result<(), BackendError> {
        let buf = self.idle_buffer("compute", buffer, len)?;
        let err = |call, e| self.kernel_error(call, "sin kernel", buffer, len, e);
        // SAFETY: as in `checksum`: a live allocation of at least `len` bytes, borrowed for the
        // call, with no upload pending.
        unsafe { self.sin_span(buf.span(), len, &err) }
    }

    unsafe fn checksum_mapped(&self, host_ptr: *const u8, len: usize) -> Result<u64, BackendError> {
        if len == 0 {
            return Ok(0);
        }
        let span = self.mapped_span("cuMemHostGetDevicePointer", host_ptr, len)?;
        let err = |call, e| self.mapped_error(call, "checksum", host_ptr, len, e);
        let mut read_tail = |last: &mut [u8], _: &KernelState| {
            let tail_ptr = host_ptr.wrapping_add(len - last.len());
            // SAFETY: tail_ptr..tail_ptr+last.len() is the end of the caller's live range.
            last.copy_from_slice(unsafe { std::slice::from_raw_parts(tail_ptr, last.len()) });
            Ok(())
        };
        // SAFETY: the span is the mapped address of a live DEVICEMAP registration of `len` bytes
        // that the caller keeps alive and unwritten until we return.
        unsafe { self.checksum_span(span, len, &err, &mut read_tail) }
    }

    unsafe fn compute_mapped(&self, host_ptr: *mut u8, len: usize) -> Result<(), BackendError> {
        if len < 4 {
            return Ok(());
        }
        let span = self.mapped_span("cuMemHostGetDevicePointer", host_ptr, len)?;
        let err = |call, e| self.mapped_error(call, "sin kernel", host_ptr, len, e);
        // SAFETY: the span is the mapped address of a live DEVICEMAP registration of `len`
        // bytes, alive until we return. The kernel works in place: the slot's bytes become
        // sin(x), which the caller allows by handing the range over (it is recycled afterwards).
        unsafe { self.sin_span(span, len, &err) }
    }
}

/// Fills the bytes of a checksum's partial last word.
type ReadTail<'a> = dyn FnMut(&mut [u8], &KernelState) -> Result<(), DriverError> + 'a;

impl CudaUploader {
    /// The checksum kernel over the whole words of `span[..len]`, plus the partial last word,
    /// whose bytes `read_tail` fills (from the device copy, or from the host range itself).
    ///
    /// # Safety
    /// `span` addresses at least `len` bytes of a live allocation or DEVICEMAP registration that
    /// stays alive, and unwritten by the host, until this returns.
    unsafe fn checksum_span(
        &self,
        span: raw::Span,
        len: usize,
        err: &dyn Fn(&'static str, DriverError) -> BackendError,
        read_tail: &mut ReadTail<'_>,
    ) -> Result<u64, BackendError> {
        if len == 0 {
            return Ok(0);
        }
        let st = self.lock_kernels()?;
        let Some(kernels) = st.kernels.as_ref() else {
            unreachable!("lock_kernels loads the kernels");
        };
        let stream = &self.kernel_stream;
        let nwords = (len / 8) as u64;
        let tail = len % 8;
        raw::memset_zero_async(&st.result, stream).map_err(|e| err("cuMemsetD8Async", e))?;
        if nwords > 0 {
            // SAFETY: the span is live for `len` bytes (caller), and it and `st.result` stay
            // alive until copy_dtoh_wait below has waited for the whole kernel stream.
            unsafe { kernels.launch_checksum(stream, span, nwords, &st.result, self.grid(nwords)) }
                .map_err(|e| err("cuLaunchKernel", e))?;
        }
        let mut word = [0u8; 8];
        raw::copy_dtoh_wait(&mut word, &st.result, 0, stream, &st.done)
            .map_err(|e| err("cuMemcpyDtoHAsync/cuEventSynchronize", e))?;
        let mut sum = u64::from_le_bytes(word);
        if tail > 0 {
            let mut last = [0u8; 8];
            read_tail(&mut last[..tail], &st).map_err(|e| err("reading the last word", e))?;
            sum = sum.wrapping_add(word_term(nwords, u64::from_le_bytes(last)));
        }
        Ok(sum)
    }

    /// The sin kernel in place over the f32s of `span[..len]`, waited for.
    ///
    /// # Safety
    /// As for [`CudaUploader::checksum_span`]; the caller also gives up the bytes' contents.
    unsafe fn sin_span(
        &self,
        span: raw::Span,
        len: usize,
        err: &dyn Fn(&'static str, DriverError) -> BackendError,
    ) -> Result<(), BackendError> {
        let n = (len / 4) as u64;
        if n == 0 {
            return Ok(());
        }
        let st = self.lock_kernels()?;
        let Some(kernels) = st.kernels.as_ref() else {
            unreachable!("lock_kernels loads the kernels");
        };
        let stream = &self.kernel_stream;
        // SAFETY: the span is live for `len` bytes until we return (caller), which is after the
        // event wait below.
        unsafe { kernels.launch_sin(stream, span, n, self.grid(n)) }
            .map_err(|e| err("cuLaunchKernel", e))?;
        st.done
            .record(stream)
            .and_then(|()| st.done.synchronize())
            .map_err(|e| err("cuEventSynchronize", e))
    }
}

impl CudaUploader {
    /// The mapped device span of a zero-copy host range.
    fn mapped_span(
        &self,
        call: &'static str,
        host_ptr: *const u8,
        len: usize,
    ) -> Result<raw::Span, BackendError> {
        let ptr = raw::host_device_pointer(&self.ctx, host_ptr).map_err(|e| {
            cuda_error(
                call,
                format!(
                    "{len} bytes of host memory at {host_ptr:p} on device {} (zero-copy needs the ring registered with DEVICEMAP)",
                    self.device
                ),
                e.0,
            )
        })?;
        Ok(raw::Span { ptr, bytes: len })
    }

    fn mapped_error(
        &self,
        call: &'static str,
        what: &str,
        host_ptr: *const u8,
        len: usize,
        e: DriverError,
    ) -> BackendError {
        cuda_error(
            call,
            format!(
                "{what} over {len} bytes of mapped host memory at {host_ptr:p} on device {}",
                self.device
            ),
            e.0,
        )
    }
}

impl Drop for CudaUploader {
    fn drop(&mut self) {
        // Closing the channel lets the completion thread drain: it waits for every copy still
        // in flight, so device buffers (freed after this) and callers' source ranges are safe.
        self.inflight.take();
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                tracing::error!(
                    device = self.device,
                    "pinring CUDA completion thread panicked"
                );
                // Make sure no copy is still running before the buffers are freed.
                if let Ok(ev) = raw::Event::new(&self.ctx) {
                    let _ = ev.record(&self.copy_stream).and_then(|()| ev.synchronize());
                }
            }
        }
    }
}

/// Compile-time checks that the types cross threads as the traits require.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<CudaBackend>();
    const fn send<T: Send>() {}
    send::<CudaUploader>();
};

#[cfg(test)]
mod tests {
    //! Runs only where a GPU is usable: elsewhere it prints `SKIPPED: <reason>`, or fails with
    //! `PINRING_REQUIRE_GPU=1` ([`crate::testing`]).

    use super::*;
    use crate::checksum::checksum;
    use crate::{select, BackendKind};
    use std::time::Duration;

    fn pattern(seed: u64, n: usize) -> Vec<u8> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    #[test]
    fn gpu_smoke() {
        if crate::testing::gpu().is_none() {
            return;
        }
        if let Ok(path) = std::env::var("PINRING_PTX_OUT") {
            std::fs::write(path, ptx::PTX.to_bytes()).unwrap();
        }
        println!("probe: {:?}", crate::cuda_available());
        let sel = select(BackendKind::Auto, 0).unwrap();
        println!("auto: {}", sel.reason);
        assert_eq!(sel.backend.name(), "cuda");
        let e = CudaBackend::new(64).unwrap_err();
        println!("device 64: {e}");
        assert!(matches!(e, BackendError::NoSuchDevice { device: 64, .. }));

        let b = CudaBackend::new(0).unwrap();
        println!("{} cc {:?}", b.describe(), b.compute_capability());

        // A "ring" of 64 MiB, registered in 16 MiB chunks with DEVICEMAP.
        const RING: usize = 64 << 20;
        let ring = AlignedBuf::new(RING, "test ring").unwrap();
        let content = pattern(1, RING);
        // SAFETY: `content` has RING bytes; the ring is not shared yet.
        unsafe { ring.write_from(content.as_ptr(), RING) };
        // SAFETY: `ring` outlives `reg` (dropped explicitly below).
        let reg = unsafe { b.register_chunked(ring.as_mut_ptr(), RING, true, 16 << 20) }.unwrap();
        assert!(reg.registered());
        assert_eq!(reg.chunks(), 4);
        println!("registered {} bytes in {:.6} s", reg.bytes(), reg.seconds());
        let dptr = b
            .mapped_device_ptr(ring.as_ptr().wrapping_add(4096))
            .unwrap();
        assert_ne!(dptr, 0);
        let e = b.mapped_device_ptr(content.as_ptr()).unwrap_err();
        println!("unregistered mapped_device_ptr: {e}");
        // SAFETY: as above; this must fail (already registered) and leave `reg` intact.
        let e = unsafe { b.register(ring.as_mut_ptr(), RING, false) }.unwrap_err();
        println!("double register: {e}");

        // Uploads from the registered ring, on another thread (fresh thread: no current ctx).
        let up = b.uploader(4, 16 << 20).unwrap();
        let ring_addr = ring.as_ptr() as usize;
        let content_ref = &content;
        std::thread::scope(|s| {
            s.spawn(|| {
                let lens = [16 << 20, (1 << 20) + 3, 5, 8, 4096, 7, (16 << 20) - 1, 1];
                let mut tag = 0u64;
                for round in 0..3usize {
                    let mut expect = Vec::new();
                    for (i, &len) in lens.iter().enumerate().skip(round % 2).step_by(2) {
                        let buffer = expect.len() % 4;
                        let off = (i * 5 * 4096 + round * 8 * 4096) % (RING - len);
                        let job = UploadJob {
                            tag,
                            src: (ring_addr + off) as *const u8,
                            len,
                            buffer,
                        };
                        // SAFETY: the ring outlives the scope and is not written during it.
                        unsafe { up.submit(job) }.unwrap();
                        expect.push((tag, buffer, off, len));
                        tag += 1;
                    }
                    for &(t, buffer, off, len) in &expect {
                        let c = up
                            .completions()
                            .recv_timeout(Duration::from_secs(30))
                            .unwrap();
                        assert_eq!((c.tag, c.buffer, c.len), (t, buffer, len));
                        c.result.unwrap();
                        let got = up.checksum(buffer, len).unwrap();
                        let want = checksum(&content_ref[off..off + len]);
                        assert_eq!(got, want, "tag {t} len {len}");
                        println!(
                            "tag {t}: {len} bytes in {:?}, checksum ok",
                            c.completed - c.submitted
                        );
                    }
                }
                // Pageable source works too (staged by the driver).
                let plain = pattern(7, 1000);
                let job = UploadJob {
                    tag: 999,
                    src: plain.as_ptr(),
                    len: plain.len(),
                    buffer: 1,
                };
                // SAFETY: `plain` outlives the completion received next.
                unsafe { up.submit(job) }.unwrap();
                // Busy check races with the copy; either answer is fine, it must not be wrong.
                match up.checksum(1, plain.len()) {
                    Err(BackendError::BufferBusy { .. }) => println!("busy while in flight: ok"),
                    other => println!("checksum right after submit: {other:?}"),
                }
                let c = up
                    .completions()
                    .recv_timeout(Duration::from_secs(30))
                    .unwrap();
                assert_eq!(c.tag, 999);
                c.result.unwrap();
                assert_eq!(up.checksum(1, plain.len()).unwrap(), checksum(&plain));
            });
        });
        drop(up);

        // compute: sin in place, read back with a raw copy.
        let cu = b.cuda_uploader(1, 1 << 20).unwrap();
        let xs: Vec<f32> = (0..(1 << 18))
            .map(|i| (i as f32 / (1 << 18) as f32) * 6.0 - 3.0)
            .collect();
        let bytes: Vec<u8> = xs.iter().flat_map(|x| x.to_le_bytes()).collect();
        let cu = cu;
        let job = UploadJob {
            tag: 1,
            src: bytes.as_ptr(),
            len: bytes.len(),
            buffer: 0,
        };
        // SAFETY: `bytes` outlives the completion received next.
        unsafe { cu.submit(job) }.unwrap();
        cu.completions()
            .recv_timeout(Duration::from_secs(30))
            .unwrap()
            .result
            .unwrap();
        assert_eq!(cu.checksum(0, bytes.len()).unwrap(), checksum(&bytes));
        cu.compute(0, bytes.len()).unwrap();
        let mut back = vec![0u8; bytes.len()];
        {
            let st = cu.kernel_state.lock().unwrap();
            raw::copy_dtoh_wait(&mut back, &cu.buffers[0], 0, &cu.kernel_stream, &st.done).unwrap();
        }
        let mut max_err = 0f32;
        for (x, c) in xs.iter().zip(back.chunks_exact(4)) {
            let y = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            max_err = max_err.max((y - x.sin()).abs());
        }
        println!("sin.approx max abs error {max_err:e}");
        assert!(max_err < 1e-4);
        drop(cu);

        for registered in [true, false] {
            let gbps = b.raw_h2d_gbps(256 << 20, 20, registered).unwrap();
            println!("raw H2D 256 MiB x20 registered={registered}: {gbps:.1} GB/s");
        }
        drop(reg);
        drop(ring);
    }
}
