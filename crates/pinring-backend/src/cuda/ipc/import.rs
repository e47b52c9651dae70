//! The consumer's side: [`Imported`], the daemon's device buffers opened in a training process.

use std::sync::Arc;

use cudarc::driver::sys::{self, CUresult};
use cudarc::driver::CudaContext;

use super::ipc_error;
use super::raw::{IpcEvent, OpenedMem};
use super::registry::{Held, EXPORTED, OPENED};
use crate::cuda::probe::primary_context;
use crate::error::cuda_error;
use crate::{BackendError, BufferExport};

/// The device buffers of a daemon in another process, opened from their [`BufferExport`]s in
/// the device's primary context (the context PyTorch and the CUDA runtime use), so a training
/// process reads each batch where the daemon uploaded it, without a copy.
///
/// Per batch in buffer `b`, once the daemon has said (through the ring) that the batch is in
/// `b`: [`Imported::wait_ready`] on the stream that will read it, the reads (kernels on
/// [`Imported::device_ptr`]), then [`Imported::record_release`] on the stream of the last read.
/// Neither call waits on the host. The daemon's next copy into `b` waits on the GPU for that
/// release ([`crate::BufferHandoff::wait_release`]).
///
/// Legacy CUDA IPC handles can be opened once per process and device: a second `Imported` of
/// the same buffers in one process is refused ([`BackendError::IpcAlreadyOpen`]) while the
/// first lives; share the first. The process that exported the buffers cannot open them at all
/// ([`BackendError::IpcOwnExport`]): it uses [`crate::CopyEngine::device_ptr`].
///
/// Dropping it closes the memory handles and the events and releases the primary context. Work
/// that reads the buffers must have completed by then (e.g. synchronize the streams that read
/// them): a kernel still reading a closed mapping faults on the device.
#[derive(Debug)]
pub struct Imported {
    /// Declared before `ctx`: closed before the context is released.
    buffers: Vec<ImportedBuffer>,
    ctx: Arc<CudaContext>,
    device: usize,
}

/// One opened buffer. Fields drop in order: the mapping is closed, the events destroyed, then
/// the registry entry removed.
#[derive(Debug)]
struct ImportedBuffer {
    mem: OpenedMem,
    ready: IpcEvent,
    release: IpcEvent,
    _open: Held,
}

impl Imported {
    /// Retains device `device`'s primary context, makes it current on the calling thread, and
    /// opens each buffer's memory handle (`cuIpcOpenMemHandle` with
    /// `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`) and its two events (`cuIpcOpenEventHandle`), once.
    /// `exports[i]` is buffer `i`. `device` is the ordinal in this process (with
    /// `CUDA_VISIBLE_DEVICES` it may differ from the daemon's).
    ///
    /// Errors: [`BackendError::IpcUnavailable`] where the driver refuses CUDA IPC (run the
    /// upload in this process instead: embedded mode), [`BackendError::IpcAlreadyOpen`] and
    /// [`BackendError::IpcOwnExport`] (type docs), and the driver and device errors of
    /// [`crate::cuda::CudaBackend::new`].
    pub fn open(device: usize, exports: &[BufferExport]) -> Result<Self, BackendError> {
        if exports.is_empty() {
            return Err(BackendError::InvalidArgument {
                call: "Imported::open",
                what: format!("no buffer exports given for device {device}"),
            });
        }
        if let Some(buffer) = exports.iter().position(|e| EXPORTED.contains(None, &e.mem)) {
            return Err(BackendError::IpcOwnExport { buffer });
        }
        let ctx = primary_context(device)?;
        let mut buffers = Vec::with_capacity(exports.len());
        for (i, e) in exports.iter().enumerate() {
            let open = OPENED.hold_open(device, i, e.mem)?;
            let object = |what: &str| format!("{what} of device buffer {i} on device {device}");
            let mem = OpenedMem::open(&ctx, &e.mem).map_err(|err| match err.0 {
                // Opened elsewhere in this process (outside pinring, or an earlier mapping).
                CUresult::CUDA_ERROR_ALREADY_MAPPED => {
                    BackendError::IpcAlreadyOpen { buffer: i, device }
                }
                code => ipc_error("cuIpcOpenMemHandle", object("the memory handle"), code),
            })?;
            let event = |handle: &[u8; 64], what: &str| {
                IpcEvent::open(&ctx, handle)
                    .map_err(|err| ipc_error("cuIpcOpenEventHandle", object(what), err.0))
            };
            let ready = event(&e.ready_event, "the ready event")?;
            let release = event(&e.release_event, "the release event")?;
            buffers.push(ImportedBuffer {
                mem,
                ready,
                release,
                _open: open,
            });
        }
        Ok(Self {
            buffers,
            ctx,
            device,
        })
    }

    /// The device ordinal (in this process).
    pub fn device(&self) -> usize {
        self.device
    }

    /// Number of buffers.
    pub fn buffer_count(&self) -> usize {
        self.buffers.len()
    }

    /// The primary context the buffers are open in.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Device address of buffer `buffer` in this process.
    ///
    /// # Panics
    /// If `buffer >= buffer_count()`.
    pub fn device_ptr(&self, buffer: usize) -> u64 {
        self.buffer(buffer).mem.ptr()
    }

    /// Makes `stream` wait (`cuStreamWaitEvent`; the host does not wait) until the daemon's
    /// copies of the batch now in buffer `buffer` have landed: call it after the daemon has
    /// said the batch is there, before the first read of it on `stream`.
    ///
    /// # Safety
    /// `stream` is 0 (the legacy default stream), `CU_STREAM_PER_THREAD` (2), or a live stream
    /// of the device's primary context (e.g. `torch.cuda.current_stream(device).cuda_stream`).
    pub unsafe fn wait_ready(&self, buffer: usize, stream: u64) -> Result<(), BackendError> {
        let b = self.checked(buffer, "wait_ready")?;
        // SAFETY: the caller guarantees `stream`; the event is live and of the same context.
        unsafe { b.ready.wait_on(raw_stream(stream)) }.map_err(|e| {
            cuda_error(
                "cuStreamWaitEvent",
                format!(
                    "stream {stream:#x} waiting for the ready event of device buffer {buffer} on device {}",
                    self.device
                ),
                e.0,
            )
        })
    }

    /// Records the release event of buffer `buffer` on `stream` (`cuEventRecord`), after the
    /// last work on it that reads the batch: the daemon's next copy into the buffer waits for
    /// it on the GPU.
    ///
    /// # Safety
    /// As for [`Imported::wait_ready`].
    pub unsafe fn record_release(&self, buffer: usize, stream: u64) -> Result<(), BackendError> {
        let b = self.checked(buffer, "record_release")?;
        // SAFETY: the caller guarantees `stream`; the event is live and of the same context.
        unsafe { b.release.record(raw_stream(stream)) }.map_err(|e| {
            cuda_error(
                "cuEventRecord",
                format!(
                    "the release event of device buffer {buffer} on stream {stream:#x} on device {}",
                    self.device
                ),
                e.0,
            )
        })
    }

    fn buffer(&self, buffer: usize) -> &ImportedBuffer {
        let count = self.buffers.len();
        match self.buffers.get(buffer) {
            Some(b) => b,
            None => panic!("device buffer {buffer} out of range: {count} buffers were imported"),
        }
    }

    fn checked(&self, buffer: usize, call: &'static str) -> Result<&ImportedBuffer, BackendError> {
        self.buffers
            .get(buffer)
            .ok_or_else(|| BackendError::InvalidArgument {
                call,
                what: format!(
                    "device buffer {buffer} out of range: {} buffers were imported",
                    self.buffers.len()
                ),
            })
    }
}

/// A stream handle passed as an integer (as Python hands it over) as the driver's type. The
/// handle is opaque to this process's Rust code (only the driver interprets it), so it carries
/// no provenance.
fn raw_stream(stream: u64) -> sys::CUstream {
    std::ptr::without_provenance_mut(stream as usize)
}
