//! Every raw driver call of CUDA IPC, each in a small wrapper: memory handles
//! (`cuIpcGetMemHandle`, `cuIpcOpenMemHandle`, `cuIpcCloseMemHandle`), interprocess events
//! (`cuEventCreate` with `CU_EVENT_INTERPROCESS`, `cuIpcGetEventHandle`, `cuIpcOpenEventHandle`,
//! record, `cuStreamWaitEvent`, destroy). cudarc wraps none of these. [`IpcEvent`] and
//! [`OpenedMem`] own what they open or create and give it back on drop. Like `cuda/raw.rs`, each
//! wrapper first makes the owning context current on the calling thread
//! ([`make_current`]).

use std::ffi::c_char;
use std::sync::Arc;

use cudarc::driver::sys::{self, CUresult};
use cudarc::driver::{CudaContext, DriverError};

use crate::cuda::raw::make_current;

/// The driver's 64 opaque bytes as Rust bytes.
fn to_bytes(reserved: &[c_char; 64]) -> [u8; 64] {
    std::array::from_fn(|i| reserved[i].to_ne_bytes()[0])
}

/// Rust bytes as the driver's 64 opaque bytes.
fn to_reserved(bytes: &[u8; 64]) -> [c_char; 64] {
    std::array::from_fn(|i| c_char::from_ne_bytes([bytes[i]]))
}

/// `cuIpcGetMemHandle`: the IPC handle of the `cuMemAlloc` allocation that starts at `ptr`.
/// The driver looks `ptr` up in its own tables (an unknown address, or memory from a
/// stream-ordered pool, is an error); it never dereferences it from the host.
pub fn mem_handle(ctx: &CudaContext, ptr: sys::CUdeviceptr) -> Result<[u8; 64], DriverError> {
    make_current(ctx)?;
    let mut handle = sys::CUipcMemHandle { reserved: [0; 64] };
    // SAFETY: `handle` is a valid, writable out-parameter of the right type; the context is
    // current; `ptr` is only looked up by the driver.
    unsafe { sys::cuIpcGetMemHandle(&mut handle, ptr) }.result()?;
    Ok(to_bytes(&handle.reserved))
}

/// Device memory of another process, opened from its IPC handle with
/// `cuIpcOpenMemHandle(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)`; drop closes it
/// (`cuIpcCloseMemHandle`).
#[derive(Debug)]
pub struct OpenedMem {
    ptr: sys::CUdeviceptr,
    ctx: Arc<CudaContext>,
}

// SAFETY: the mapping is owned (closed once, in Drop); the address is not tied to a thread and
// every driver call on it first makes its context current on the calling thread.
unsafe impl Send for OpenedMem {}
// SAFETY: `&self` only hands out the address.
unsafe impl Sync for OpenedMem {}

impl OpenedMem {
    /// Maps the allocation `handle` names into `ctx`.
    pub fn open(ctx: &Arc<CudaContext>, handle: &[u8; 64]) -> Result<Self, DriverError> {
        make_current(ctx)?;
        let handle = sys::CUipcMemHandle {
            reserved: to_reserved(handle),
        };
        let mut ptr: sys::CUdeviceptr = 0;
        let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
        // SAFETY: `ptr` is a valid out-parameter; the handle is passed by value and is opaque
        // to us: the driver validates it (a handle that names no live export is an error, not
        // a mapping); the flag is a valid CUipcMem_flags value; the context is current. The
        // mapping is owned by the returned value, which closes it once.
        unsafe { sys::cuIpcOpenMemHandle_v2(&mut ptr, handle, flags) }.result()?;
        Ok(Self {
            ptr,
            ctx: Arc::clone(ctx),
        })
    }

    /// Device address of the mapping in this process.
    pub fn ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }
}

impl Drop for OpenedMem {
    fn drop(&mut self) {
        if make_current(&self.ctx).is_ok() {
            // SAFETY: opened by cuIpcOpenMemHandle in this context and closed once, here.
            // `Imported`'s docs make its owner finish the work that reads the memory first.
            if let Err(e) = unsafe { sys::cuIpcCloseMemHandle(self.ptr) }.result() {
                tracing::warn!(code = ?e.0, "cuIpcCloseMemHandle failed");
            }
        }
    }
}

/// An interprocess event (`CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING`), created here or
/// opened from another process's handle, or a local one for a consumer in this process
/// ([`IpcEvent::create_with`]); drop destroys this process's handle of it.
#[derive(Debug)]
pub struct IpcEvent {
    raw: sys::CUevent,
    ctx: Arc<CudaContext>,
}

// SAFETY: a CUevent may be used from any thread once its context is current there, which every
// method ensures; the handle is owned (destroyed once, in Drop).
unsafe impl Send for IpcEvent {}
// SAFETY: the driver API is thread-safe for recording and waiting on one event from several
// threads; nothing in `IpcEvent` is mutated through `&self`.
unsafe impl Sync for IpcEvent {}

impl IpcEvent {
    /// A new interprocess event in `ctx`.
    pub fn create(ctx: &Arc<CudaContext>) -> Result<Self, DriverError> {
        Self::create_with(ctx, true)
    }

    /// A new event in `ctx`, interprocess or (for a consumer in this same process, where CUDA
    /// IPC may be refused) not.
    pub fn create_with(ctx: &Arc<CudaContext>, interprocess: bool) -> Result<Self, DriverError> {
        make_current(ctx)?;
        let ipc = if interprocess {
            sys::CUevent_flags::CU_EVENT_INTERPROCESS as u32
        } else {
            0
        };
        let flags = ipc | sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        let mut raw: sys::CUevent = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-parameter, the flags are valid CUevent_flags bits
        // (INTERPROCESS requires DISABLE_TIMING, which is set); the context is current.
        unsafe { sys::cuEventCreate(&mut raw, flags) }.result()?;
        Ok(Self {
            raw,
            ctx: Arc::clone(ctx),
        })
    }

    /// Opens an interprocess event of another process (`cuIpcOpenEventHandle`) in `ctx`.
    pub fn open(ctx: &Arc<CudaContext>, handle: &[u8; 64]) -> Result<Self, DriverError> {
        make_current(ctx)?;
        let handle = sys::CUipcEventHandle {
            reserved: to_reserved(handle),
        };
        let mut raw: sys::CUevent = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-parameter; the handle is opaque to us and validated by
        // the driver; the context is current. The event is owned by the returned value, which
        // destroys it once (cuEventDestroy is how an opened event is freed).
        unsafe { sys::cuIpcOpenEventHandle(&mut raw, handle) }.result()?;
        Ok(Self {
            raw,
            ctx: Arc::clone(ctx),
        })
    }

    /// The event's IPC handle (`cuIpcGetEventHandle`).
    pub fn handle(&self) -> Result<[u8; 64], DriverError> {
        make_current(&self.ctx)?;
        let mut handle = sys::CUipcEventHandle { reserved: [0; 64] };
        // SAFETY: `handle` is a valid out-parameter; the event is live (owned by self) and was
        // created with CU_EVENT_INTERPROCESS; the context is current.
        unsafe { sys::cuIpcGetEventHandle(&mut handle, self.raw) }.result()?;
        Ok(to_bytes(&handle.reserved))
    }

    /// `cuEventRecord`: captures the work enqueued on `stream` so far.
    ///
    /// # Safety
    /// `stream` is null (the legacy default stream), `CU_STREAM_PER_THREAD`, or a live stream of
    /// this event's context.
    pub unsafe fn record(&self, stream: sys::CUstream) -> Result<(), DriverError> {
        make_current(&self.ctx)?;
        // SAFETY: the event is live (owned by self); the caller guarantees the stream is live
        // and of this (current) context, or one of the special handles.
        unsafe { sys::cuEventRecord(self.raw, stream) }.result()
    }

    /// `cuEventQuery`: whether the work captured by the event's most recent record (in any
    /// process) has completed (true also for an event never recorded). The host does not wait.
    pub fn completed(&self) -> Result<bool, DriverError> {
        make_current(&self.ctx)?;
        // SAFETY: the event is live (owned by self); the context is current.
        match unsafe { sys::cuEventQuery(self.raw) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            other => other.result().map(|()| false),
        }
    }

    /// `cuStreamWaitEvent`: work enqueued on `stream` after this call waits until the work
    /// captured by the event's most recent record (in any process) has completed; the host
    /// does not wait.
    ///
    /// # Safety
    /// As for [`IpcEvent::record`].
    pub unsafe fn wait_on(&self, stream: sys::CUstream) -> Result<(), DriverError> {
        make_current(&self.ctx)?;
        // SAFETY: as in `record`; flags 0 is CU_EVENT_WAIT_DEFAULT.
        unsafe { sys::cuStreamWaitEvent(stream, self.raw, 0) }.result()
    }
}

impl Drop for IpcEvent {
    fn drop(&mut self) {
        if make_current(&self.ctx).is_ok() {
            // SAFETY: created or opened in this context and destroyed once, here. Destroying an
            // event with pending work is allowed (the driver releases it when the work is done).
            let code = unsafe { sys::cuEventDestroy_v2(self.raw) };
            if code != CUresult::CUDA_SUCCESS {
                tracing::warn!(?code, "cuEventDestroy failed");
            }
        }
    }
}

/// What the GPU tests need besides the calls above: a host-side gate on a stream and a
/// device-to-device copy.
#[cfg(test)]
pub mod testing {
    use super::*;
    use std::ffi::c_void;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    /// Runs on a driver thread when the stream reaches it: holds the stream until the flag is
    /// set (at most 120 s, so a failed test cannot wedge the stream for good).
    unsafe extern "C" fn gate(data: *mut c_void) {
        // SAFETY: `launch_gate` passes a pointer to a `&'static AtomicBool`.
        let flag = unsafe { &*data.cast_const().cast::<AtomicBool>() };
        let start = Instant::now();
        while !flag.load(Ordering::Acquire) && start.elapsed() < Duration::from_secs(120) {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Holds `stream` (of `ctx`) until `open` is set (`cuLaunchHostFunc`).
    pub fn launch_gate(
        ctx: &CudaContext,
        stream: sys::CUstream,
        open: &'static AtomicBool,
    ) -> Result<(), DriverError> {
        make_current(ctx)?;
        let data = std::ptr::from_ref(open).cast_mut().cast::<c_void>();
        // SAFETY: `stream` is a live stream of the current context (the tests pass cudarc
        // streams they hold); `gate` calls no CUDA function and only reads the flag, which lives
        // for the whole program.
        unsafe { sys::cuLaunchHostFunc(stream, Some(gate), data) }.result()
    }

    /// `cuMemcpyDtoDAsync` of `len` bytes from `src` to `dst` on `stream`.
    ///
    /// # Safety
    /// Both ranges lie in live device allocations of the current context (or mapped into it),
    /// which stay alive until the copy has completed on `stream`, a live stream of `ctx`.
    pub unsafe fn copy_dtod_async(
        ctx: &CudaContext,
        dst: sys::CUdeviceptr,
        src: sys::CUdeviceptr,
        len: usize,
        stream: sys::CUstream,
    ) -> Result<(), DriverError> {
        make_current(ctx)?;
        // SAFETY: the caller guarantees both ranges and the stream.
        unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, len, stream) }.result()
    }
}
