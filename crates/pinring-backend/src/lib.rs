//! pinring-backend: where uploaded batches go.
//!
//! The GPU daemon registers the whole shared-memory ring once ([`Backend::register`]) and then
//! uploads batches straight from ring slots into device buffers with an [`Uploader`]. Two
//! backends implement this:
//!
//! - [`cuda::CudaBackend`]: `cuMemHostRegister`, then copies straight from the slots on a copy
//!   stream (and a second one for copies under 16 KiB), given to the driver many to a
//!   `cuMemcpyBatchAsync` call where it has one, with a completion thread waiting on events
//!   each shared by several uploads (looking at them after naps timed by the copy engine's
//!   pace, as it learns it); checksum/compute kernels from embedded
//!   PTX. `libcuda` is loaded dynamically and probed first, so nothing panics on a machine
//!   without a driver.
//! - [`host::HostBackend`]: heap buffers and `memcpy`, for machines without a GPU and for tests.
//!
//! [`select`] picks one from a [`BackendKind`] (`--backend auto|cuda|host`).
//!
//! A training process in another process can use the device buffers in place: the cuda
//! uploader exports each buffer's CUDA IPC handles and events ([`BufferHandoff::export`],
//! [`BufferHandoff::record_ready`], [`BufferHandoff::wait_release`]), which the consumer opens with
//! [`cuda::ipc::Imported`]; the host backend can place its buffers in a shared-memory segment
//! ([`HostBackend::uploader_in`]). A consumer in the same process uses [`CopyEngine::device_ptr`].

use std::fmt;
use std::str::FromStr;
use std::time::Instant;

mod buf;
pub mod checksum;
pub mod cuda;
pub mod decode;
pub mod engines;
mod error;
mod guard;
pub mod host;
pub mod testing;

pub use checksum::{checksum, Checksum};
pub use cuda::{CudaBackend, CudaUploader};
pub use decode::{Decode, DecodeCounts, DecodeFault};
pub use error::BackendError;
pub use host::{HostBackend, HostUploader};

/// Which backend to use (`--backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendKind {
    /// CUDA if a usable driver and the device exist, else host.
    #[default]
    Auto,
    /// CUDA or an error.
    Cuda,
    /// Always the host backend.
    Host,
}

impl FromStr for BackendKind {
    type Err = BackendError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "cuda" => Ok(Self::Cuda),
            "host" => Ok(Self::Host),
            _ => Err(BackendError::UnknownBackend(s.to_string())),
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Cuda => "cuda",
            Self::Host => "host",
        })
    }
}

/// The backend [`select`] chose and why.
#[derive(Debug)]
pub struct Selected {
    /// The backend.
    pub backend: Box<dyn Backend>,
    /// E.g. `"cuda: NVIDIA H200 (device 0, 139 GiB)"` or
    /// `"host: no NVIDIA driver found (libcuda.so.1 not loadable)"`.
    pub reason: String,
}

/// Where a daemon's batches go when it copies none of them itself (a consumer that copies): the
/// backend [`select`] would pick, found without opening it (CUDA: no context).
#[derive(Debug, Clone)]
pub struct Located {
    /// `"cuda"` or `"host"`, as [`Backend::name`].
    pub name: &'static str,
    /// As [`Selected::reason`].
    pub reason: String,
    /// The device's PCI address, as [`Backend::pci_bus_id`].
    pub pci_bus_id: Option<String>,
}

/// [`select`]'s choice, made without opening the backend: the same errors and fallback.
pub fn locate(kind: BackendKind, device: usize) -> Result<Located, BackendError> {
    let host = |reason: String| Located {
        name: "host",
        reason,
        pci_bus_id: None,
    };
    match kind {
        BackendKind::Host => Ok(host("host: selected with --backend host".to_string())),
        BackendKind::Cuda => cuda::probe::locate(device),
        BackendKind::Auto => match cuda::probe::locate(device) {
            Ok(l) => Ok(l),
            Err(e) => {
                tracing::info!(error = %e, "CUDA backend unavailable, using host backend");
                Ok(host(format!("host: {}", e.fallback_reason())))
            }
        },
    }
}

/// Picks a backend.
///
/// - `Auto`: CUDA if the driver loads, `cuInit` succeeds and `device` exists; otherwise host,
///   with the reason.
/// - `Cuda`: those failures are errors naming what is missing.
/// - `Host`: always host.
pub fn select(kind: BackendKind, device: usize) -> Result<Selected, BackendError> {
    match kind {
        BackendKind::Host => Ok(Selected {
            backend: Box::new(HostBackend::new()),
            reason: "host: selected with --backend host".to_string(),
        }),
        BackendKind::Cuda => {
            let b = CudaBackend::new(device)?;
            let reason = b.describe();
            Ok(Selected {
                backend: Box::new(b),
                reason,
            })
        }
        BackendKind::Auto => match CudaBackend::new(device) {
            Ok(b) => {
                let reason = b.describe();
                Ok(Selected {
                    backend: Box::new(b),
                    reason,
                })
            }
            Err(e) => {
                tracing::info!(error = %e, "CUDA backend unavailable, using host backend");
                Ok(Selected {
                    backend: Box::new(HostBackend::new()),
                    reason: format!("host: {}", e.fallback_reason()),
                })
            }
        },
    }
}

/// Whether CUDA is usable here: `Ok("NVIDIA H200 x1, driver 13.0")` or `Err(reason)`.
/// Never panics, also without a driver.
pub fn cuda_available() -> Result<String, String> {
    cuda::probe().map_err(|e| e.to_string())
}

/// A way to make host memory DMA-able and to upload into device buffers.
pub trait Backend: Send + Sync + fmt::Debug {
    /// `"host"` or `"cuda"`.
    fn name(&self) -> &'static str;

    /// One line for logs, e.g. `"cuda: NVIDIA H200 (device 0, 139 GiB)"`.
    fn describe(&self) -> String;

    /// The device's PCI address as sysfs names it (`"0000:1a:00.0"`), for placing the ring
    /// and the threads that feed it on the device's NUMA node; `None` for the host backend.
    fn pci_bus_id(&self) -> Option<String> {
        None
    }

    /// Makes `[base, base+len)` DMA-able for the lifetime of the returned guard.
    ///
    /// cuda: `cuMemHostRegister` in chunks of at most 256 GiB with `PORTABLE` (`| DEVICEMAP` when
    /// `devicemap`); dropping the guard unregisters each chunk. Prefaulting the range first is
    /// the caller's job (registration faults pages in otherwise, which is slower). host: a no-op
    /// guard. The guard records how long registration took.
    ///
    /// # Safety
    /// The range must be a live mapping that outlives the guard (it must not be unmapped or
    /// remapped while registered).
    unsafe fn register(
        &self,
        base: *mut u8,
        len: usize,
        devicemap: bool,
    ) -> Result<Registration, BackendError>;

    /// The raw copy ceiling, no pipeline: times `iters` copies of `bytes` from one host buffer
    /// (page-locked when `registered`, else pageable) into one device buffer; GB/s (1e9 B/s).
    /// host: a `memcpy` between two heap buffers (`registered` makes no difference).
    fn raw_copy_gbps(
        &self,
        bytes: usize,
        iters: usize,
        registered: bool,
    ) -> Result<f64, BackendError>;

    /// An upload engine with `buffers` device buffers of `buffer_bytes` each, laid out as
    /// `placement` says (the host backend's buffers are heap memory either way).
    fn uploader(
        &self,
        buffers: usize,
        buffer_bytes: usize,
        placement: Placement,
    ) -> Result<Box<dyn Uploader>, BackendError>;
}

/// One upload signal covers at most this fraction of the source ring
/// ([`CopyEngine::set_source_ring`]). An event that covered a 32-slot ring of 256 KiB slots whole
/// (its 8 MiB were one event's bytes) left the loaders nothing to fill while it ran: 13.9-14.6
/// GB/s; a quarter of the ring per event, 20.4-20.6, the same as an eighth (20.0-20.3), and as
/// the bench's reference pipeline at that ring (H200, docs/BENCHMARKS.md, "Small rings").
pub const SIGNAL_SPAN_DIVISOR: usize = 4;

/// How an upload engine lays out its device buffers ([`Backend::uploader`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Placement {
    /// Each buffer is an allocation of its own, which CUDA IPC can export to a consumer in
    /// another process ([`BufferHandoff::export`]): a legacy IPC handle names a whole allocation and
    /// opens once per process.
    #[default]
    Separate,
    /// All buffers in one allocation, side by side at a constant stride (the buffer size
    /// rounded up to [`cuda::BUFFER_ALIGN`]). Parts taken from consecutive slots into
    /// consecutive buffers then have sources and destinations at constant strides, and the
    /// CUDA backend gives a run of them to the driver as one two-dimensional copy
    /// (docs/ARCHITECTURE.md, "Runs of parts as one copy"). Its buffers cannot be exported
    /// through CUDA IPC ([`BufferHandoff::export`] refuses); a consumer in the same process uses
    /// them through [`CopyEngine::device_ptr`] and [`BufferHandoff::share_local`].
    Contiguous,
}

/// RAII guard of a registered host range; dropping it unregisters (cuda) or does nothing (host).
#[derive(Debug)]
pub struct Registration {
    base: usize,
    bytes: u64,
    seconds: f64,
    /// The CUDA registration, if any; its drop unregisters.
    inner: Option<cuda::HostRegistration>,
}

impl Registration {
    /// A guard that registered nothing (host backend).
    pub(crate) fn unregistered(base: usize, len: usize, seconds: f64) -> Self {
        Self {
            base,
            bytes: len as u64,
            seconds,
            inner: None,
        }
    }

    /// Wall-clock seconds the registration took.
    pub fn seconds(&self) -> f64 {
        self.seconds
    }

    /// Length of the range in bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether the range is actually registered with a driver (false for host).
    pub fn registered(&self) -> bool {
        self.inner.is_some()
    }

    /// Start address of the range.
    pub fn base(&self) -> usize {
        self.base
    }

    /// Number of `cuMemHostRegister` chunks (0 for host).
    pub fn chunks(&self) -> usize {
        self.inner.as_ref().map_or(0, |r| r.chunk_count())
    }
}

/// One upload: copy `src[..len]` into device buffer `buffer` at byte `dst_offset`.
///
/// A device buffer may be larger than one slot (a batch cut into parts, each part a slot, lands
/// part by part at its offset in the batch's buffer): `dst_offset + len` must not exceed
/// [`CopyEngine::buffer_bytes`], or `submit` refuses the job.
#[derive(Debug, Clone, Copy)]
pub struct UploadJob {
    /// Caller's tag, returned in the [`Completion`] (e.g. ring slot and sequence).
    pub tag: u64,
    /// Start of the source bytes (a ring slot).
    pub src: *const u8,
    /// Number of bytes.
    pub len: usize,
    /// Index of the destination device buffer.
    pub buffer: usize,
    /// Byte offset in the destination device buffer where the copy starts.
    pub dst_offset: usize,
    /// `Some`: the source is an encoded images chunk, decoded into `dst_len` bytes at
    /// `dst_offset` rather than copied ([`decode`]); the engine must have a decoder
    /// ([`CopyEngine::set_decoder`]).
    pub decode: Option<Decode>,
}

impl UploadJob {
    /// Bytes the job writes into its buffer: `len`, or a decode's `dst_len`.
    pub fn dst_len(&self) -> usize {
        self.decode.map_or(self.len, |d| d.dst_len)
    }
}

// SAFETY: UploadJob is plain data; `src` is only dereferenced by the uploader's copy, and
// `CopyEngine::submit` (an unsafe fn) makes the caller guarantee the pointed-to bytes stay valid
// and unwritten until the completion is received, from whichever thread the copy runs on.
unsafe impl Send for UploadJob {}

/// The outcome of one [`UploadJob`].
#[derive(Debug)]
pub struct Completion {
    /// The job's tag.
    pub tag: u64,
    /// The job's device buffer.
    pub buffer: usize,
    /// The job's length.
    pub len: usize,
    /// Whether the copy succeeded.
    pub result: Result<(), BackendError>,
    /// When `submit` accepted the job.
    pub submitted: Instant,
    /// When the copy was observed finished.
    pub completed: Instant,
}

/// Where an upload engine's [`Completion`]s arrive. The engine sends them in runs, one message
/// for all it has seen complete at once (on CUDA, every group an event covers: at 64 KiB slots,
/// a send per group and a receive per completion on the daemon's main loop were a fifth of the
/// completion thread's time and 6% of the main loop's); a receiver takes them one at a time
/// ([`Completions::try_recv`], [`Completions::recv_timeout`]) or every one that has arrived
/// ([`Completions::drain_into`]), always in the order they were sent.
#[derive(Debug)]
pub struct Completions {
    runs: crossbeam_channel::Receiver<Vec<Completion>>,
    /// Completions of runs received, not taken yet.
    left: std::sync::Mutex<std::collections::VecDeque<Completion>>,
}

/// The sending end of [`Completions`], for an engine's completion thread.
pub type CompletionSender = crossbeam_channel::Sender<Vec<Completion>>;

impl Completions {
    /// A new pair: the engine keeps the sender.
    pub fn channel() -> (CompletionSender, Completions) {
        let (tx, runs) = crossbeam_channel::unbounded();
        let left = std::sync::Mutex::new(std::collections::VecDeque::new());
        (tx, Completions { runs, left })
    }

    fn left(&self) -> std::sync::MutexGuard<'_, std::collections::VecDeque<Completion>> {
        // A panic while holding it leaves a consistent queue (it is only pushed to and popped).
        self.left
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The next completion, if one has arrived.
    pub fn try_recv(&self) -> Result<Completion, crossbeam_channel::TryRecvError> {
        self.next(|runs| runs.try_recv())
    }

    /// The next completion, waiting for it up to `timeout`.
    pub fn recv_timeout(
        &self,
        timeout: std::time::Duration,
    ) -> Result<Completion, crossbeam_channel::RecvTimeoutError> {
        // A timeout too long to be a deadline is no deadline.
        let deadline = Instant::now().checked_add(timeout);
        self.next(|runs| match deadline {
            Some(d) => runs.recv_deadline(d),
            None => runs
                .recv()
                .map_err(|_| crossbeam_channel::RecvTimeoutError::Disconnected),
        })
    }

    /// The first completion not taken yet, receiving runs with `receive` until one holds one.
    fn next<E>(
        &self,
        mut receive: impl FnMut(
            &crossbeam_channel::Receiver<Vec<Completion>>,
        ) -> Result<Vec<Completion>, E>,
    ) -> Result<Completion, E> {
        let mut left = self.left();
        loop {
            if let Some(c) = left.pop_front() {
                return Ok(c);
            }
            left.extend(receive(&self.runs)?);
        }
    }

    /// Appends every completion that has arrived to `out`, in order. `Err` only when none was
    /// left and the engine is gone (its completion thread stopped).
    pub fn drain_into(
        &self,
        out: &mut Vec<Completion>,
    ) -> Result<(), crossbeam_channel::TryRecvError> {
        let before = out.len();
        out.extend(self.left().drain(..));
        loop {
            match self.runs.try_recv() {
                Ok(run) => out.extend(run),
                Err(crossbeam_channel::TryRecvError::Empty) => return Ok(()),
                Err(e) if out.len() == before => return Err(e),
                Err(_) => return Ok(()),
            }
        }
    }
}

/// Called by an uploader's completion thread each time it has sent completions, so a consumer
/// can sleep on a wake-up of its own choice (a futex word) instead of in `recv`.
pub type CompletionHook = std::sync::Arc<dyn Fn() + Send + Sync>;

/// Where an uploader keeps its [`CompletionHook`] (set once, read by the completion thread).
#[derive(Default)]
pub struct HookCell(std::sync::OnceLock<CompletionHook>);

impl HookCell {
    /// Installs the hook; a second call is ignored.
    pub fn set(&self, hook: CompletionHook) {
        let _ = self.0.set(hook);
    }

    /// Calls the hook, if one is installed.
    pub fn call(&self) {
        if let Some(hook) = self.0.get() {
            hook();
        }
    }
}

impl fmt::Debug for HookCell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HookCell")
            .field("installed", &self.0.get().is_some())
            .finish()
    }
}

/// An upload engine's copies: from host memory (a ring's slots) into its fixed set of batch
/// buffers, each signalled by a [`Completion`].
pub trait CopyEngine: Send + Sync {
    /// Starts copying `job.src[..job.len]` into device buffer `job.buffer`, starting at byte
    /// `job.dst_offset` of it, and returns at once. Fails with `InvalidArgument` (nothing
    /// queued) if the buffer index is out of range or `dst_offset + len` exceeds
    /// [`CopyEngine::buffer_bytes`].
    /// A [`Completion`] for the job arrives on [`CopyEngine::completions`] when the copy has
    /// finished; completions arrive in submission order.
    ///
    /// # Safety
    /// `src..src+len` stays valid and is not written until that completion has been received
    /// (or the uploader has been dropped, which waits for all copies).
    /// Fails with `BufferBusy` if the buffer is being read ([`DeviceKernels::read_host`],
    /// [`DeviceKernels::checksum`], [`DeviceKernels::compute`]) at that moment.
    unsafe fn submit(&self, job: UploadJob) -> Result<(), BackendError>;

    /// Starts the copies of `jobs` (a part's fields, each to its place in one device buffer)
    /// and returns how many [`Completion`]s they will produce. This default submits each job
    /// ([`CopyEngine::submit`]): one completion per job. A backend may instead queue them as one
    /// upload with one completion for the group (tag and buffer of `jobs[0]`, `len` the sum),
    /// which the CUDA backend does when every job names the same buffer: one event to record
    /// and one completion to wait for per part instead of one per field. On an error some
    /// jobs may have been queued already; a caller treats it as fatal, as a failed `submit`.
    ///
    /// # Safety
    /// As [`CopyEngine::submit`], for each job: its source stays valid and unwritten until every
    /// completion the call announced has been received.
    unsafe fn submit_group(&self, jobs: &[UploadJob]) -> Result<usize, BackendError> {
        for &job in jobs {
            // SAFETY: forwarded from our caller, job by job.
            unsafe { self.submit(job) }?;
        }
        Ok(jobs.len())
    }

    /// As [`CopyEngine::submit_group`], but the backend may hold the group's completion signal
    /// back to share it with the groups submitted after it, and its copies too, to hand them to
    /// the driver with theirs (CUDA: `cuMemcpyBatchAsync` where the driver has it). On CUDA a signal is an event on the
    /// copy stream: each one stalls the copy engine between copies and costs the driver an
    /// interrupt and a wake-up, which caps small copies far below the link (64 KiB copies:
    /// 17 GB/s without events, 11 with one per copy, on an H200). The CUDA backend records one
    /// event for several deferred groups (docs/ARCHITECTURE.md, "Upload signals"); the default
    /// signals every group at once.
    ///
    /// A deferred group's copies may not start, and its completion may not come, until
    /// [`CopyEngine::flush`] is called: a caller that submits deferred groups flushes before it
    /// waits for their completions.
    ///
    /// # Safety
    /// As [`CopyEngine::submit_group`].
    unsafe fn submit_group_deferred(&self, jobs: &[UploadJob]) -> Result<usize, BackendError> {
        // SAFETY: forwarded from our caller.
        unsafe { self.submit_group(jobs) }
    }

    /// Tells the engine how many slots the ring its deferred groups come from has (a group is
    /// one part, at most one slot). One upload signal then covers at most
    /// [`SIGNAL_SPAN_DIVISOR`]th of that ring, so that
    /// while one signal's copies run, the rest of the ring is free for the loaders to fill. Call
    /// it before the first submit; without it (or on backends that never defer) groups share
    /// signals by the engine's own counts alone.
    fn set_source_ring(&self, slots: usize) {
        let _ = slots;
    }

    /// Signals every group submitted so far, so that all their completions come: on CUDA one
    /// event after them when [`CopyEngine::submit_group_deferred`] left some without one; nothing
    /// to do otherwise, or on backends that never defer.
    fn flush(&self) -> Result<(), BackendError> {
        Ok(())
    }

    /// Makes the engine decode the uploads marked [`UploadJob::decode`] into samples of
    /// `spec` (once, before the first such submit). The default refuses: the engine cannot
    /// decode.
    fn set_decoder(&self, spec: pinring_image::SampleSpec) -> Result<(), BackendError> {
        let _ = spec;
        Err(BackendError::InvalidArgument {
            call: "set_decoder",
            what: "this upload engine does not decode images: set [dataset.image] decode = \
                   \"cpu\" (the loaders decode), or use a backend that decodes"
                .into(),
        })
    }

    /// The samples that did not decode since the last call, each written as zeros
    /// ([`decode`]); empty for an engine without a decoder.
    fn take_decode_faults(&self) -> Vec<DecodeFault> {
        Vec::new()
    }

    /// How the engine's decoder decoded its samples so far (zeros where it has none).
    fn decode_counts(&self) -> DecodeCounts {
        DecodeCounts::default()
    }

    /// Where completions arrive.
    fn completions(&self) -> &Completions;

    /// Installs the hook the completion thread calls after sending completions (once; later
    /// calls are ignored). Install it before the first `submit` so no completion goes unsignalled.
    fn set_completion_hook(&self, hook: CompletionHook);

    /// Number of device buffers.
    fn buffer_count(&self) -> usize;

    /// Size of each device buffer in bytes.
    fn buffer_bytes(&self) -> usize;

    /// The address of device buffer `buffer`, for a consumer in the same process (embedded
    /// mode): cuda: its device address; host: its host address.
    ///
    /// # Panics
    /// If `buffer >= buffer_count()`.
    fn device_ptr(&self, buffer: usize) -> u64;
}

/// An upload engine's batch buffers handed to a consumer: exported to another process (CUDA
/// IPC) or shared with one in this process, and the ready and release events that order the
/// two sides' streams.
pub trait BufferHandoff: Send + Sync {
    /// What a consumer in another process needs to use device buffer `buffer` in place (CUDA
    /// IPC; docs/ARCHITECTURE.md, "Handing device buffers to a training process").
    ///
    /// cuda: the buffer's memory handle (`cuIpcGetMemHandle`) and the handles of its "ready" and
    /// "release" interprocess events, created by the first call for the buffer; later calls
    /// return the same handles. Until a buffer has been exported, [`BufferHandoff::record_ready`]
    /// and [`BufferHandoff::wait_release`] do nothing for it (no consumer can hold its events).
    /// Fails with [`BackendError::IpcUnavailable`] where the driver refuses CUDA IPC (some
    /// container runtimes do). host: `Ok(None)` (see [`HostBackend::uploader_in`] for buffers
    /// another process can map).
    fn export(&self, buffer: usize) -> Result<Option<BufferExport>, BackendError>;

    /// Marks the end of a batch in `buffer`: cuda: records the buffer's ready event on the copy
    /// stream, after every copy submitted so far, so a consumer's stream that waits on it
    /// ([`cuda::ipc::Imported::wait_ready`]) runs after the batch has landed. Call it from the
    /// thread that submitted the batch, after its last `submit`. A no-op for a buffer never
    /// exported, and on the host backend.
    fn record_ready(&self, buffer: usize) -> Result<(), BackendError>;

    /// Call before the first copy of the next batch into `buffer`: cuda: makes the copy stream
    /// wait (`cuStreamWaitEvent`, no host wait) for the consumer's last release of the buffer
    /// ([`cuda::ipc::Imported::record_release`]), so a copy never overwrites a batch the
    /// consumer's kernels still read. With `consumer_alive == false` (the consumer's process is
    /// gone, and its context with it) nothing is waited for. Every copy submitted afterwards
    /// waits, into any buffer (both copy streams wait, each in order). A no-op for a buffer
    /// never exported, and on the host backend.
    fn wait_release(&self, buffer: usize, consumer_alive: bool) -> Result<(), BackendError>;

    /// Prepares device buffer `buffer` for a consumer in this same process (embedded mode):
    /// cuda: creates its ready and release events as plain events (no CUDA IPC, which some
    /// container runtimes refuse), after which [`BufferHandoff::record_ready`] and
    /// [`BufferHandoff::wait_release`] use them as for an exported buffer. host: nothing to do.
    fn share_local(&self, buffer: usize) -> Result<(), BackendError> {
        let _ = buffer;
        Ok(())
    }

    /// A consumer in this process: makes `stream` wait (on the device) for the batch now in
    /// `buffer` (its ready event). host: nothing to wait for.
    ///
    /// # Safety
    /// cuda: `stream` is 0, `CU_STREAM_LEGACY` (1), `CU_STREAM_PER_THREAD` (2) or a live stream
    /// of the device's primary context.
    unsafe fn local_wait_ready(&self, buffer: usize, stream: u64) -> Result<(), BackendError> {
        let _ = (buffer, stream);
        Ok(())
    }

    /// A consumer in this process: records `buffer`'s release event on `stream`, after the
    /// consumer's last use of the batch. host: nothing to record.
    ///
    /// # Safety
    /// As for [`BufferHandoff::local_wait_ready`].
    unsafe fn local_record_release(&self, buffer: usize, stream: u64) -> Result<(), BackendError> {
        let _ = (buffer, stream);
        Ok(())
    }
}

/// Work over an upload engine's batch buffers other than copies into them: reading them on the
/// host, checksums and compute kernels (the verifying and compute sinks, zero copy).
pub trait DeviceKernels: Send + Sync {
    /// Host backend: calls `f` with bytes `offset..offset + len` of a device buffer (for
    /// verifying sinks: one field of a batch) and returns `Ok(true)`; `BufferBusy` if uploads
    /// into it are pending, `InvalidArgument` if the range passes the buffer's end. Backends
    /// whose device memory the host cannot read return `Ok(false)` without calling `f`.
    fn read_host(
        &self,
        buffer: usize,
        offset: usize,
        len: usize,
        f: &mut dyn FnMut(&[u8]),
    ) -> Result<bool, BackendError>;

    /// Position-sensitive checksum ([`checksum::checksum`]) of bytes `offset..offset + len` of a
    /// device buffer (word indices counted from `offset`, so it equals the checksum of those
    /// bytes alone), computed where the buffer lives (cuda: a kernel over the device address
    /// plus `offset`, then a small D2H of the result). `offset` must be a multiple of 8 (the
    /// kernel reads aligned words; a field's offset always is) and the range inside the buffer,
    /// else `InvalidArgument`. Only for a buffer whose uploads have completed.
    fn checksum(&self, buffer: usize, offset: usize, len: usize) -> Result<u64, BackendError>;

    /// Runs a small compute kernel (y = sin(x) over the f32s of the first `len` bytes) over the
    /// buffer and waits. cuda: in place; host: into a scratch vector.
    fn compute(&self, buffer: usize, len: usize) -> Result<(), BackendError>;

    /// Zero-copy: [`DeviceKernels::checksum`] computed straight over host memory that was registered
    /// with `devicemap` (cuda: the kernel reads it across the bus through its mapped device
    /// address; no copy into device memory). host: over the bytes themselves.
    ///
    /// # Safety
    /// `host_ptr..host_ptr+len` lies inside a live registration made by this uploader's backend
    /// with `devicemap = true` (host: a live mapping), and is not written until this returns.
    unsafe fn checksum_mapped(&self, host_ptr: *const u8, len: usize) -> Result<u64, BackendError>;

    /// Zero-copy: [`DeviceKernels::compute`] straight over registered host memory (cuda: the kernel
    /// reads the f32s through the mapped address and writes sin(x) back in place; host: into a
    /// scratch vector).
    ///
    /// # Safety
    /// As for [`DeviceKernels::checksum_mapped`]; in addition the caller gives up the range's
    /// contents (cuda overwrites them) and no other thread reads it until this returns.
    unsafe fn compute_mapped(&self, host_ptr: *mut u8, len: usize) -> Result<(), BackendError>;
}

/// Asynchronous upload engine with a fixed set of device buffers: its copies
/// ([`CopyEngine`]), the handing of its buffers to a consumer ([`BufferHandoff`]) and the work
/// over them ([`DeviceKernels`]). Every type that is all three is one.
pub trait Uploader: CopyEngine + BufferHandoff + DeviceKernels {}

impl<T: CopyEngine + BufferHandoff + DeviceKernels + ?Sized> Uploader for T {}

/// The CUDA IPC handles of one device buffer ([`BufferHandoff::export`]): each is the driver's opaque
/// 64-byte handle, valid in other processes for as long as the exporting uploader lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BufferExport {
    /// `CUipcMemHandle` of the buffer's allocation (`cuIpcGetMemHandle`).
    pub mem: [u8; 64],
    /// `CUipcEventHandle` of the event the daemon records after a batch's last copy.
    pub ready_event: [u8; 64],
    /// `CUipcEventHandle` of the event the consumer records after its last use of a batch.
    pub release_event: [u8; 64],
}

impl BufferExport {
    /// Size of [`BufferExport::to_bytes`].
    pub const BYTES: usize = 192;

    /// The three handles one after the other (mem, ready, release), e.g. for a shared-memory
    /// segment.
    pub fn to_bytes(&self) -> [u8; Self::BYTES] {
        let mut out = [0u8; Self::BYTES];
        out[..64].copy_from_slice(&self.mem);
        out[64..128].copy_from_slice(&self.ready_event);
        out[128..].copy_from_slice(&self.release_event);
        out
    }

    /// The inverse of [`BufferExport::to_bytes`].
    pub fn from_bytes(bytes: &[u8; Self::BYTES]) -> Self {
        let part = |i: usize| {
            let mut h = [0u8; 64];
            h.copy_from_slice(&bytes[i * 64..(i + 1) * 64]);
            h
        };
        Self {
            mem: part(0),
            ready_event: part(1),
            release_event: part(2),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completions_sent_in_runs_are_taken_one_at_a_time_or_all_at_once_in_order() {
        let (tx, rx) = Completions::channel();
        let c = |tag: u64| Completion {
            tag,
            buffer: tag as usize,
            len: 1,
            result: Ok(()),
            submitted: Instant::now(),
            completed: Instant::now(),
        };
        let tags = |v: &[Completion]| v.iter().map(|c| c.tag).collect::<Vec<_>>();
        assert!(matches!(
            rx.try_recv(),
            Err(crossbeam_channel::TryRecvError::Empty)
        ));
        tx.send(vec![c(0), c(1), c(2)]).unwrap();
        tx.send(Vec::new()).unwrap();
        tx.send(vec![c(3)]).unwrap();
        // One from a run; the rest of it, then the next runs, all at once.
        assert_eq!(rx.try_recv().unwrap().tag, 0);
        let mut out = Vec::new();
        rx.drain_into(&mut out).unwrap();
        assert_eq!(tags(&out), [1, 2, 3]);
        // Nothing arrived: nothing added, no error.
        rx.drain_into(&mut out).unwrap();
        assert_eq!(out.len(), 3);
        tx.send(vec![c(4), c(5)]).unwrap();
        let timeout = std::time::Duration::from_secs(5);
        assert_eq!(rx.recv_timeout(timeout).unwrap().tag, 4);
        // The engine gone: what arrived is still taken, then the error says so.
        drop(tx);
        out.clear();
        rx.drain_into(&mut out).unwrap();
        assert_eq!(tags(&out), [5]);
        assert!(rx.drain_into(&mut out).is_err());
        assert!(matches!(
            rx.recv_timeout(timeout),
            Err(crossbeam_channel::RecvTimeoutError::Disconnected)
        ));
    }

    #[test]
    fn buffer_export_round_trips_through_bytes() {
        let e = BufferExport {
            mem: [1; 64],
            ready_event: std::array::from_fn(|i| i as u8),
            release_event: [0xfe; 64],
        };
        let bytes = e.to_bytes();
        assert_eq!(bytes[64..128], e.ready_event);
        assert_eq!(BufferExport::from_bytes(&bytes), e);
    }

    #[test]
    fn kind_parses_and_displays() {
        for (s, k) in [
            ("auto", BackendKind::Auto),
            ("cuda", BackendKind::Cuda),
            ("host", BackendKind::Host),
            ("CUDA", BackendKind::Cuda),
        ] {
            let parsed: BackendKind = s.parse().unwrap();
            assert_eq!(parsed, k);
            assert_eq!(parsed.to_string(), s.to_ascii_lowercase());
        }
        let e = "gpu".parse::<BackendKind>().unwrap_err();
        assert!(e.to_string().contains("auto, cuda, host"), "{e}");
    }

    #[test]
    fn select_host() {
        let s = select(BackendKind::Host, 0).unwrap();
        assert_eq!(s.backend.name(), "host");
        assert!(s.reason.starts_with("host"));
    }

    #[test]
    fn host_register_is_noop_guard() {
        let b = HostBackend::new();
        let mut mem = vec![0u8; 8192];
        // SAFETY: `mem` outlives the guard.
        let r = unsafe { b.register(mem.as_mut_ptr(), mem.len(), false) }.unwrap();
        assert!(!r.registered());
        assert_eq!(r.bytes(), 8192);
        assert_eq!(r.chunks(), 0);
        assert!(r.seconds() >= 0.0);
    }

    #[test]
    fn select_auto_without_driver_falls_back_to_host() {
        if cuda::driver_library_present() {
            eprintln!(
                "SKIPPED: libcuda is loadable on this machine; the test is for hosts without it"
            );
            return;
        }
        let s = select(BackendKind::Auto, 0).unwrap();
        assert_eq!(s.backend.name(), "host");
        assert!(s.reason.starts_with("host: "), "{}", s.reason);
        assert!(s.reason.contains("NVIDIA driver"), "{}", s.reason);
        assert!(cuda_available().unwrap_err().contains("libcuda.so.1"));
    }

    #[test]
    fn select_cuda_without_driver_is_an_error() {
        if cuda::driver_library_present() {
            eprintln!(
                "SKIPPED: libcuda is loadable on this machine; the test is for hosts without it"
            );
            return;
        }
        let e = select(BackendKind::Cuda, 0).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("no NVIDIA driver found"), "{msg}");
        assert!(msg.contains("libcuda.so.1"), "{msg}");
        assert!(msg.contains("--backend host"), "{msg}");
    }

    #[test]
    fn errors_of_finding_a_gpu_come_without_the_host_flag_for_other_callers() {
        for e in [
            BackendError::NoDriver,
            BackendError::NoSuchDevice {
                device: 3,
                count: 1,
            },
        ] {
            let full = e.to_string();
            assert!(full.ends_with("or use --backend host"), "{full}");
            let cut = e.without_host_flag().unwrap();
            assert!(full.starts_with(&cut) && !cut.contains("--"), "{cut}");
            assert!(!cut.ends_with(',') && !cut.ends_with(' '), "{cut:?}");
        }
        let other = BackendError::InvalidArgument {
            call: "x",
            what: "y".into(),
        };
        assert_eq!(other.without_host_flag(), None);
    }
}
