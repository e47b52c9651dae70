//! The daemon's side: [`Exported`], the per-buffer IPC state of a [`CudaUploader`] (its memory
//! handle and its ready and release events), created by the buffer's first `export`, and the
//! uploader's `export` / `record_ready` / `wait_release`, all on the copy stream in submission
//! order.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream};

use super::ipc_error;
use super::raw::{self, IpcEvent};
use super::registry::{Held, EXPORTED};
use crate::cuda::uploader::CudaUploader;
use crate::error::cuda_error;
use crate::host::check_range;
use crate::{BackendError, BufferExport};

/// The IPC state of one exported device buffer.
#[derive(Debug)]
pub(crate) struct Exported {
    /// Recorded on the copy stream after a batch's last copy (`record_ready`).
    ready: IpcEvent,
    /// Recorded by the consumer after its last use of a batch; the copy stream waits on it
    /// before the next batch's first copy (`wait_release`).
    release: IpcEvent,
    handles: BufferExport,
    /// The memory handle's entry among this process's exports, so that this process refuses to
    /// open it itself (registry).
    _exported: Option<Held>,
}

impl Exported {
    /// Exports device buffer `buffer` (device address `ptr`, `bytes` long) of device `device`.
    fn create(
        ctx: &Arc<CudaContext>,
        device: usize,
        buffer: usize,
        ptr: u64,
        bytes: usize,
    ) -> Result<Self, BackendError> {
        let object = |what: &str| {
            format!(
                "{what} of device buffer {buffer} ({bytes} bytes at {ptr:#x}) on device {device}"
            )
        };
        let mem = raw::mem_handle(ctx, ptr)
            .map_err(|e| ipc_error("cuIpcGetMemHandle", object("the allocation"), e.0))?;
        let event = |what: &str| -> Result<(IpcEvent, [u8; 64]), BackendError> {
            let ev =
                IpcEvent::create(ctx).map_err(|e| ipc_error("cuEventCreate", object(what), e.0))?;
            let handle = ev
                .handle()
                .map_err(|e| ipc_error("cuIpcGetEventHandle", object(what), e.0))?;
            Ok((ev, handle))
        };
        let (ready, ready_event) = event("the interprocess ready event")?;
        let (release, release_event) = event("the interprocess release event")?;
        Ok(Self {
            ready,
            release,
            handles: BufferExport {
                mem,
                ready_event,
                release_event,
            },
            // `None` only if another live uploader exported the same handle, which the driver
            // gives to one allocation only: the first entry stays.
            _exported: EXPORTED.hold(None, mem),
        })
    }

    /// The events of device buffer `buffer` for a consumer in this process (embedded mode):
    /// plain events, no IPC handle (CUDA IPC may be refused here, and is not needed).
    fn create_local(
        ctx: &Arc<CudaContext>,
        device: usize,
        buffer: usize,
    ) -> Result<Self, BackendError> {
        let event = |what: &str| {
            IpcEvent::create_with(ctx, false).map_err(|e| {
                cuda_error(
                    "cuEventCreate",
                    format!("the {what} event of device buffer {buffer} on device {device}"),
                    e.0,
                )
            })
        };
        Ok(Self {
            ready: event("ready")?,
            release: event("release")?,
            handles: BufferExport {
                mem: [0; 64],
                ready_event: [0; 64],
                release_event: [0; 64],
            },
            _exported: None,
        })
    }

    /// Records the ready event on `stream` (the uploader's copy stream).
    fn record_ready(&self, stream: &CudaStream) -> Result<(), cudarc::driver::DriverError> {
        // SAFETY: the copy stream is a live stream (borrowed from the uploader) of the context
        // the event was created in (both the backend's primary context).
        unsafe { self.ready.record(stream.cu_stream()) }
    }

    /// Makes `stream` (the uploader's copy stream) wait for the consumer's last release,
    /// unless the host sees that release complete already: then there is nothing to wait for,
    /// and a device wait on an interprocess event costs the copy stream far more than the query
    /// (docs/BENCHMARKS.md, "The trainer's end").
    fn wait_release(&self, stream: &CudaStream) -> Result<(), cudarc::driver::DriverError> {
        if self.release.completed()? {
            return Ok(());
        }
        // SAFETY: as in `record_ready`.
        unsafe { self.release.wait_on(stream.cu_stream()) }
    }
}

impl CudaUploader {
    /// The buffer's IPC state, created on first use (by `export` only).
    fn exported(&self, buffer: usize) -> Result<&Exported, BackendError> {
        if let Some(e) = self.ipc[buffer].get() {
            return Ok(e);
        }
        // One creator at a time, so a buffer's events and handles are made once.
        let _creating = self.ipc_init.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = self.ipc[buffer].get() {
            return Ok(e);
        }
        let e = Exported::create(
            &self.ctx,
            self.device,
            buffer,
            self.buffers[buffer].ptr(),
            self.buffer_bytes,
        )?;
        Ok(self.ipc[buffer].get_or_init(|| e))
    }

    /// [`crate::BufferHandoff::share_local`].
    pub(crate) fn share_local_buffer(&self, buffer: usize) -> Result<(), BackendError> {
        check_range(
            "share_local",
            buffer,
            0,
            0,
            self.buffers.len(),
            self.buffer_bytes,
        )?;
        let _creating = self.ipc_init.lock().unwrap_or_else(|e| e.into_inner());
        if self.ipc[buffer].get().is_none() {
            let e = Exported::create_local(&self.ctx, self.device, buffer)?;
            let _ = self.ipc[buffer].set(e);
        }
        Ok(())
    }

    /// The buffer's events, for a consumer in this process.
    fn shared(&self, call: &'static str, buffer: usize) -> Result<&Exported, BackendError> {
        check_range(call, buffer, 0, 0, self.buffers.len(), self.buffer_bytes)?;
        self.ipc[buffer]
            .get()
            .ok_or_else(|| BackendError::InvalidArgument {
                call,
                what: format!(
                    "device buffer {buffer} was never shared (share_local or export) with a consumer"
                ),
            })
    }

    /// [`crate::BufferHandoff::local_wait_ready`].
    ///
    /// # Safety
    /// `stream` is 0, `CU_STREAM_LEGACY` (1), `CU_STREAM_PER_THREAD` (2) or a live stream of
    /// the device's primary context.
    pub(crate) unsafe fn local_wait_ready(
        &self,
        buffer: usize,
        stream: u64,
    ) -> Result<(), BackendError> {
        let e = self.shared("local_wait_ready", buffer)?;
        // SAFETY: the caller guarantees the stream; the event is live and of the uploader's
        // context (the primary context, which this process's consumer shares).
        unsafe { e.ready.wait_on(stream as cudarc::driver::sys::CUstream) }.map_err(|err| {
            cuda_error(
                "cuStreamWaitEvent",
                format!("stream {stream:#x} waiting for the ready event of device buffer {buffer}"),
                err.0,
            )
        })
    }

    /// [`crate::BufferHandoff::local_record_release`].
    ///
    /// # Safety
    /// As for [`CudaUploader::local_wait_ready`].
    pub(crate) unsafe fn local_record_release(
        &self,
        buffer: usize,
        stream: u64,
    ) -> Result<(), BackendError> {
        let e = self.shared("local_record_release", buffer)?;
        // SAFETY: as in `local_wait_ready`.
        unsafe { e.release.record(stream as cudarc::driver::sys::CUstream) }.map_err(|err| {
            cuda_error(
                "cuEventRecord",
                format!("the release event of device buffer {buffer} on stream {stream:#x}"),
                err.0,
            )
        })
    }

    /// [`crate::BufferHandoff::export`].
    pub(crate) fn export_buffer(&self, buffer: usize) -> Result<BufferExport, BackendError> {
        check_range(
            "export",
            buffer,
            0,
            0,
            self.buffers.len(),
            self.buffer_bytes,
        )?;
        Ok(self.exported(buffer)?.handles)
    }

    /// [`crate::BufferHandoff::record_ready`].
    pub(crate) fn record_ready_on_copy_stream(&self, buffer: usize) -> Result<(), BackendError> {
        check_range(
            "record_ready",
            buffer,
            0,
            0,
            self.buffers.len(),
            self.buffer_bytes,
        )?;
        let Some(e) = self.ipc[buffer].get() else {
            return Ok(()); // never exported: nobody can wait on it
        };
        e.record_ready(&self.copy_stream).map_err(|err| {
            cuda_error(
                "cuEventRecord",
                format!(
                    "the ready event of device buffer {buffer} on the copy stream of device {}",
                    self.device
                ),
                err.0,
            )
        })
    }

    /// [`crate::BufferHandoff::wait_release`].
    pub(crate) fn wait_release_on_copy_stream(
        &self,
        buffer: usize,
        consumer_alive: bool,
    ) -> Result<(), BackendError> {
        check_range(
            "wait_release",
            buffer,
            0,
            0,
            self.buffers.len(),
            self.buffer_bytes,
        )?;
        let Some(e) = self.ipc[buffer].get() else {
            return Ok(()); // never exported: no consumer holds it
        };
        if !consumer_alive {
            // Its process, and with it its context and the work it recorded, is gone.
            return Ok(());
        }
        // Both copy streams: a buffer's next upload may put copies on either.
        for (stream, name) in [
            (&self.copy_stream, "copy"),
            (&self.small_stream, "small-copy"),
        ] {
            e.wait_release(stream).map_err(|err| {
                cuda_error(
                    "cuStreamWaitEvent",
                    format!(
                        "the {name} stream of device {} waiting for the consumer's release event of device buffer {buffer}",
                        self.device
                    ),
                    err.0,
                )
            })?;
        }
        Ok(())
    }
}
