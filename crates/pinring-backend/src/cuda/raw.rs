//! The only place that calls the CUDA driver through raw pointers (cudarc's `driver::sys` and
//! `driver::result`), for what cudarc's safe layer does not offer or offers only at a cost the
//! hot path must not pay (docs/ARCHITECTURE.md lists each with the reason). Every wrapper here is
//! small; [`Event`] owns its handle and destroys it on drop, and `register::HostRegistration`
//! owns the registrations made with [`host_register`]. Device memory (`CudaSlice`), streams and
//! the kernels (`CudaModule`/`CudaFunction`, launched with cudarc's launch builder) are cudarc's.
//!
//! Context handling: the driver keeps a *current context* per thread. Every wrapper that issues
//! driver calls first makes the owning context current with [`make_current`] (a cheap
//! `cuCtxGetCurrent` when it already is). We deliberately do not use
//! `CudaContext::bind_to_thread` here, because it also reports (and clears) errors cudarc
//! recorded in unrelated `Drop`s, which would surface as spurious failures of unrelated uploads.
//! cudarc's own safe calls (allocations, kernel loading and launches, read-backs) do go through
//! it; they are off the upload path, and a recorded error there means the context is failing.

use std::ffi::{c_void, CStr};
use std::sync::Arc;

use cudarc::driver::sys::{self, CUresult};
use cudarc::driver::{result, CudaContext, CudaStream, DriverError};

/// Whether a CUDA driver library (`libcuda.so`, `libcuda.so.1`, ...) can be loaded.
///
/// Must be asked before any other cudarc driver call: with `dynamic-loading`, cudarc panics on
/// its first call when the library is missing.
pub fn driver_library_present() -> bool {
    // SAFETY: `is_culib_present` only dlopen()s the candidate library names and closes the
    // handles again. Loading libcuda runs its ELF constructors, which the driver supports in any
    // process (that is how every CUDA program starts); no symbol is called here.
    unsafe { sys::is_culib_present() }
}

/// `cuDriverGetVersion`: e.g. 13000 for CUDA 13.0. Only call once the library is present.
pub fn driver_version() -> Result<i32, DriverError> {
    let mut v: std::ffi::c_int = 0;
    // SAFETY: `v` is a valid, writable c_int for the out-parameter; the call has no other
    // preconditions (it works even before cuInit).
    unsafe { sys::cuDriverGetVersion(&mut v) }.result()?;
    Ok(v)
}

/// Makes `ctx` the calling thread's current context (no-op when it already is).
pub fn make_current(ctx: &CudaContext) -> Result<(), DriverError> {
    let want = ctx.cu_ctx();
    if result::ctx::get_current()? != Some(want) {
        // SAFETY: `want` is the live context owned by `ctx` (a retained primary context that is
        // released only when the last Arc<CudaContext> is dropped, and we borrow one).
        unsafe { result::ctx::set_current(want) }?;
    }
    Ok(())
}

/// Description of a driver result code, e.g. "out of memory".
pub fn describe(code: CUresult) -> String {
    match DriverError(code).error_string() {
        Ok(s) => s.to_string_lossy().into_owned(),
        Err(_) => "no description from cuGetErrorString".to_string(),
    }
}

/// `cuMemHostRegister_v2`: page-locks `[p, p+n)` with `flags` (`CU_MEMHOSTREGISTER_*`) in the
/// current context (see [`make_current`]). The RAII owner is `register::HostRegistration`.
///
/// # Safety
/// `[p, p+n)` is a live mapping of this process that stays mapped (not unmapped or remapped)
/// until it is unregistered with [`host_unregister`].
pub unsafe fn host_register(p: *mut u8, n: usize, flags: u32) -> Result<(), DriverError> {
    // SAFETY: the caller guarantees the range is a live mapping that outlives the registration;
    // the driver only pins its pages and records the range (no Rust memory is written).
    unsafe { sys::cuMemHostRegister_v2(p.cast::<c_void>(), n, flags) }.result()
}

/// `cuMemHostUnregister`: unpins a range registered with [`host_register`] (context current).
///
/// # Safety
/// `p` is the start of a range registered with [`host_register`] and not unregistered since,
/// and no copy from the range is still running.
pub unsafe fn host_unregister(p: *mut u8) -> Result<(), DriverError> {
    // SAFETY: the caller guarantees `p` starts a live registration; the driver only unpins it.
    unsafe { sys::cuMemHostUnregister(p.cast::<c_void>()) }.result()
}

/// `cuMemHostGetDevicePointer_v2`: the device address of a registered (DEVICEMAP) host address.
pub fn host_device_pointer(ctx: &CudaContext, host: *const u8) -> Result<u64, DriverError> {
    make_current(ctx)?;
    let mut d: sys::CUdeviceptr = 0;
    // SAFETY: `d` is a valid out-parameter; the driver only looks `host` up in its table of
    // registered ranges (it never dereferences it) and returns an error for unknown addresses;
    // flags must be 0.
    unsafe { sys::cuMemHostGetDevicePointer_v2(&mut d, host.cast_mut().cast::<c_void>(), 0) }
        .result()?;
    Ok(d)
}

/// Enqueues a host-to-device copy of `len` bytes from `src` to device address `dst` on
/// `stream`. From page-locked (registered) memory it is truly asynchronous; from pageable memory
/// the driver stages it and the call returns once the source has been read. A registered source
/// must lie within one registered chunk (see `register::ChunkTable`). This is the hot path: one
/// `cuCtxGetCurrent` (see [`make_current`]) and the copy, nothing else.
///
/// cudarc's `CudaStream::memcpy_htod` is not used because it takes the source as a `&[T]` (a
/// Rust reference to ring slot bytes, which pinring never makes: another process may write
/// them) and the destination as `&mut CudaSlice` (one exclusive borrow per buffer per copy).
///
/// # Safety
/// - `dst..dst+len` lies inside a live device allocation of `stream`'s context that stays
///   allocated until the copy has completed on `stream`;
/// - `src..src+len` is valid for reads and is not written or unmapped until the copy has
///   completed on `stream` (observe it with an [`Event`] recorded after this call).
pub unsafe fn memcpy_htod_async(
    dst: sys::CUdeviceptr,
    src: *const u8,
    len: usize,
    stream: &CudaStream,
) -> Result<(), DriverError> {
    make_current(stream.context())?;
    // SAFETY: the caller guarantees the destination lies inside a live allocation that outlives
    // the copy and that the source stays valid and unwritten until the copy completes; the
    // stream belongs to the current context.
    unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src.cast::<c_void>(), len, stream.cu_stream()) }
        .result()
}

/// `cuMemcpy2DAsync`: `rows` host-to-device copies of `width` bytes each on `stream`, row `r`
/// from host address `src + r * src_pitch` to device address `dst + r * dst_pitch`, in one
/// driver call: one copy for the copy engine, however many rows.
///
/// # Safety
/// As [`memcpy_htod_async`], for every row; `rows >= 1`, and both pitches are at least `width`
/// and at most `CU_DEVICE_ATTRIBUTE_MAX_PITCH`. The rows' sources lie in one mapping, page-locked
/// (registered) for the copy to be asynchronous.
pub unsafe fn memcpy_htod_2d_async(
    dst: sys::CUdeviceptr,
    src: usize,
    src_pitch: usize,
    dst_pitch: usize,
    width: usize,
    rows: usize,
    stream: &CudaStream,
) -> Result<(), DriverError> {
    make_current(stream.context())?;
    let copy = sys::CUDA_MEMCPY2D_st {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_HOST,
        srcHost: src as *const c_void,
        srcDevice: 0,
        srcArray: std::ptr::null_mut(),
        srcPitch: src_pitch,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        dstHost: std::ptr::null_mut(),
        dstDevice: dst,
        dstArray: std::ptr::null_mut(),
        dstPitch: dst_pitch,
        WidthInBytes: width,
        Height: rows,
    };
    // SAFETY: `copy` is a fully initialised descriptor the driver only reads during the call;
    // the caller guarantees every row's source and destination as for `memcpy_htod_async`, and
    // the stream belongs to the current context.
    unsafe { sys::cuMemcpy2DAsync_v2(&copy, stream.cu_stream()) }.result()
}

/// Whether the driver has `cuMemcpyBatchAsync` (CUDA 12.8 and later drivers; CUDA 13 drivers
/// keep the 12.8 entry point beside its `_v2`). Asked once, without calling it: cudarc panics
/// on a call to a missing symbol.
pub fn has_memcpy_batch() -> bool {
    type F = unsafe extern "C" fn();
    // SAFETY: the driver library is loaded (the caller made a context first); a reference to
    // cudarc's handle of it, which lives for the process.
    let lib = unsafe { sys::culib() };
    // SAFETY: only looks the symbol up; the address is neither called nor kept.
    unsafe { lib.get::<F>(b"cuMemcpyBatchAsync") }.is_ok()
}

/// `cuMemcpyBatchAsync`: host-to-device copies `srcs[i]..+sizes[i]` to `dsts[i]`, all on
/// `stream` in one driver call, ordered with the stream's other work as one copy would be
/// (`CU_MEMCPY_SRC_ACCESS_ORDER_STREAM`). The three slices have one entry per copy. On an
/// error, also the index of the copy the driver names (`failIdx`).
///
/// # Safety
/// As [`memcpy_htod_async`], for every copy; and [`has_memcpy_batch`] said yes.
pub unsafe fn memcpy_htod_batch_async(
    dsts: &mut [sys::CUdeviceptr],
    srcs: &mut [sys::CUdeviceptr],
    sizes: &mut [usize],
    device: i32,
    stream: &CudaStream,
) -> Result<(), (DriverError, usize)> {
    assert!(
        dsts.len() == srcs.len() && srcs.len() == sizes.len(),
        "one destination, source and size per copy"
    );
    make_current(stream.context()).map_err(|e| (e, 0))?;
    // SAFETY: the attributes are plain data; an all-zero CUmemcpyAttributes is a valid value
    // whose fields are set below.
    let mut attrs: sys::CUmemcpyAttributes = unsafe { std::mem::zeroed() };
    attrs.srcAccessOrder = sys::CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    attrs.srcLocHint.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST;
    attrs.dstLocHint.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    attrs.dstLocHint.id = device;
    let mut attrs_idx: usize = 0;
    let mut fail_idx: usize = 0;
    // SAFETY: the arrays hold `dsts.len()` entries each (asserted) and are only read by the
    // driver; one attribute set applies from copy 0 on; `fail_idx` is a valid out-parameter.
    // The caller guarantees every copy's ranges as for `memcpy_htod_async` and that the symbol
    // exists.
    unsafe {
        sys::cuMemcpyBatchAsync(
            dsts.as_mut_ptr(),
            srcs.as_mut_ptr(),
            sizes.as_mut_ptr(),
            dsts.len(),
            &mut attrs,
            &mut attrs_idx,
            1,
            &mut fail_idx,
            stream.cu_stream(),
        )
    }
    .result()
    .map_err(|e| (e, fail_idx))
}

/// Device memory from `cuMemAlloc`, freed with `cuMemFree` on drop.
///
/// Device buffers are allocated this way rather than through cudarc (`alloc_zeros`), which takes
/// them from the device's stream-ordered pool (`cuMemAllocAsync`) where the device supports
/// one: `cuIpcGetMemHandle` refuses pool memory, and the daemon exports its device buffers to
/// consumers in other processes (`cuda::ipc`).
#[derive(Debug)]
pub struct DeviceAlloc {
    ptr: sys::CUdeviceptr,
    bytes: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: the allocation is owned (freed once, in Drop) and the device address is not tied to a
// thread; every driver call on it first makes its context current on the calling thread.
unsafe impl Send for DeviceAlloc {}
// SAFETY: `&self` only hands out the address; nothing is mutated through it.
unsafe impl Sync for DeviceAlloc {}

impl DeviceAlloc {
    /// `bytes` (at least 1) of uninitialised device memory in `ctx`.
    pub fn new(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Self, DriverError> {
        make_current(ctx)?;
        let bytes = bytes.max(1);
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: `ptr` is a valid out-parameter and `bytes` is non-zero; the context is
        // current. The memory is owned by the returned value, which frees it once.
        unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes) }.result()?;
        Ok(Self {
            ptr,
            bytes,
            ctx: Arc::clone(ctx),
        })
    }

    /// Device address of the first byte.
    pub fn ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for DeviceAlloc {
    fn drop(&mut self) {
        if make_current(&self.ctx).is_ok() {
            // SAFETY: allocated by cuMemAlloc in this context and freed once, here. The owners
            // (the uploader, the bandwidth test) wait for every copy and kernel that uses the
            // memory before dropping it.
            if let Err(e) = unsafe { sys::cuMemFree_v2(self.ptr) }.result() {
                tracing::warn!(code = ?e.0, "cuMemFree failed");
            }
        }
    }
}

/// A CUDA event without timing: created with `BLOCKING_SYNC` ([`Event::new`]), so that waiting on
/// it puts the thread to sleep instead of spinning a core, or without ([`Event::new_polled`]), to
/// be looked at only.
#[derive(Debug)]
pub struct Event {
    raw: sys::CUevent,
    ctx: Arc<CudaContext>,
}

// SAFETY: a CUevent handle may be used from any thread once its context is current there, which
// every method ensures; the handle is owned (destroyed once, in Drop).
unsafe impl Send for Event {}
// SAFETY: the driver API is thread-safe for recording/querying/synchronizing one event from
// several threads; nothing in `Event` is mutated through `&self`.
unsafe impl Sync for Event {}

impl Event {
    /// A new blocking-sync event without timing.
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Self, DriverError> {
        Self::with_flags(
            ctx,
            sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC as u32
                | sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32,
        )
    }

    /// A new event without timing, for looking at with [`Event::is_done`] only: without
    /// `BLOCKING_SYNC` the driver arranges no wake-up when it completes (its event thread's work
    /// per event). [`Event::synchronize`] on it would spin.
    pub fn new_polled(ctx: &Arc<CudaContext>) -> Result<Self, DriverError> {
        Self::with_flags(ctx, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
    }

    fn with_flags(ctx: &Arc<CudaContext>, flags: u32) -> Result<Self, DriverError> {
        make_current(ctx)?;
        let mut raw: sys::CUevent = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-parameter, the flags are valid CUevent_flags bits and the
        // context is current.
        unsafe { sys::cuEventCreate(&mut raw, flags) }.result()?;
        Ok(Self {
            raw,
            ctx: Arc::clone(ctx),
        })
    }

    /// Captures the work enqueued on `stream` so far.
    pub fn record(&self, stream: &CudaStream) -> Result<(), DriverError> {
        if stream.context().cu_ctx() != self.ctx.cu_ctx() {
            return Err(DriverError(CUresult::CUDA_ERROR_INVALID_CONTEXT));
        }
        make_current(&self.ctx)?;
        // SAFETY: the event is live (owned by self) and the stream is live (borrowed) and
        // belongs to the same context, which is current.
        unsafe { result::event::record(self.raw, stream.cu_stream()) }
    }

    /// Whether the captured work has completed (`cuEventQuery`): `Ok(false)` while it runs, the
    /// driver's error if the work failed.
    pub fn is_done(&self) -> Result<bool, DriverError> {
        make_current(&self.ctx)?;
        // SAFETY: the event is live (owned by self); its context is current.
        match unsafe { sys::cuEventQuery(self.raw) } {
            CUresult::CUDA_SUCCESS => Ok(true),
            CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            e => Err(DriverError(e)),
        }
    }

    /// Whether the captured work has completed (an error reads as done).
    #[cfg(test)]
    pub fn query(&self) -> bool {
        self.is_done().unwrap_or(true)
    }

    /// Makes `stream` wait (on the device) until the work this event captured has completed.
    pub fn wait_on(&self, stream: &CudaStream) -> Result<(), DriverError> {
        if stream.context().cu_ctx() != self.ctx.cu_ctx() {
            return Err(DriverError(CUresult::CUDA_ERROR_INVALID_CONTEXT));
        }
        make_current(&self.ctx)?;
        // SAFETY: the event and the stream are live and belong to the current context.
        unsafe { sys::cuStreamWaitEvent(stream.cu_stream(), self.raw, 0) }.result()
    }

    /// Blocks (sleeping) until the captured work has completed.
    pub fn synchronize(&self) -> Result<(), DriverError> {
        make_current(&self.ctx)?;
        // SAFETY: the event is live (owned by self); its context is current.
        unsafe { result::event::synchronize(self.raw) }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if make_current(&self.ctx).is_ok() {
            // SAFETY: created by cuEventCreate, destroyed once, here. Destroying an event
            // whose work is incomplete is allowed (resources are released later).
            if let Err(e) = unsafe { result::event::destroy(self.raw) } {
                tracing::warn!(code = ?e.0, "cuEventDestroy failed");
            }
        }
    }
}

/// The driver JIT's error log for `ptx` (NUL-terminated PTX text), for the error message when
/// cudarc's `CudaContext::load_module` has refused it: cudarc loads with `cuModuleLoadData`, which
/// takes no JIT options, so this loads `ptx` once more through `cuModuleLoadDataEx` with an
/// error-log buffer (and unloads it again should it load this time). Only called on that failure
/// path; an empty string when the driver wrote no log.
pub fn jit_error_log(ctx: &CudaContext, ptx: &CStr) -> String {
    if make_current(ctx).is_err() {
        return String::new();
    }
    let mut log = vec![0u8; 16 * 1024];
    let mut options = [
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
    ];
    // The size option's value is passed in the pointer-sized slot itself (per the driver API);
    // on return the driver stores the number of bytes it wrote there.
    let mut values: [*mut c_void; 2] = [
        log.as_mut_ptr().cast::<c_void>(),
        std::ptr::without_provenance_mut::<c_void>(log.len()),
    ];
    let mut module: sys::CUmodule = std::ptr::null_mut();
    // SAFETY: `ptx` is NUL-terminated text that lives through the call; `module` is a valid
    // out-parameter; `options`/`values` have the same length (2), the log buffer is writable for
    // the size given and outlives the call; the context is current.
    let code = unsafe {
        sys::cuModuleLoadDataEx(
            &mut module,
            ptx.as_ptr().cast::<c_void>(),
            options.len() as u32,
            options.as_mut_ptr(),
            values.as_mut_ptr(),
        )
    };
    if code == CUresult::CUDA_SUCCESS {
        // SAFETY: loaded just above and used by nothing else; unloaded once, here.
        if let Err(e) = unsafe { result::module::unload(module) } {
            tracing::warn!(code = ?e.0, "cuModuleUnload failed");
        }
    }
    let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
    String::from_utf8_lossy(&log[..end]).trim().to_string()
}
