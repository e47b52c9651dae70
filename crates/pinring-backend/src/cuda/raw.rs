//! The only place that calls the CUDA driver through raw pointers (cudarc's `driver::sys` and
//! `driver::result`). Every wrapper here is small; the safe types (`Event`, `Kernels`) own their
//! driver handles and release them on drop, and `register::HostRegistration` owns the
//! registrations made with [`host_register`]. Device memory is cudarc's `CudaSlice`.
//!
//! Context handling: the driver keeps a *current context* per thread. Every wrapper that issues
//! driver calls first makes the owning context current with [`make_current`] (a cheap
//! `cuCtxGetCurrent` when it already is). We deliberately do not use
//! `CudaContext::bind_to_thread`, because it also reports errors cudarc recorded in unrelated
//! `Drop`s, which would surface as spurious failures of unrelated uploads.

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

/// A range of device-addressable memory a kernel may read or write: (part of) a device buffer,
/// or host memory registered with DEVICEMAP seen through its mapped device address (zero-copy).
#[derive(Debug, Clone, Copy)]
pub struct Span {
    /// Device address.
    pub ptr: sys::CUdeviceptr,
    /// Bytes from `ptr` that belong to the allocation or registration.
    pub bytes: usize,
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

/// A CUDA event created with `BLOCKING_SYNC | DISABLE_TIMING`: waiting on it puts the thread to
/// sleep instead of spinning a core.
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
        make_current(ctx)?;
        let flags = sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC as u32
            | sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
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

/// Why loading the embedded PTX failed: the code and the JIT's error log.
#[derive(Debug)]
pub struct PtxLoadFailure {
    /// The driver's code.
    pub code: CUresult,
    /// Which call failed: "cuModuleLoadDataEx" or "cuModuleGetFunction".
    pub call: &'static str,
    /// The JIT compiler's error log (may be empty).
    pub log: String,
}

/// The module with the checksum and sin kernels, and their function handles.
#[derive(Debug)]
pub struct Kernels {
    module: sys::CUmodule,
    checksum: sys::CUfunction,
    sin: sys::CUfunction,
    ctx: Arc<CudaContext>,
}

// SAFETY: module and function handles are context-scoped, not thread-scoped; every use makes the
// context current first. The module is unloaded once, in Drop.
unsafe impl Send for Kernels {}
// SAFETY: launching the same CUfunction from several threads is allowed by the driver API;
// nothing is mutated through `&self`.
unsafe impl Sync for Kernels {}

impl Kernels {
    /// JIT-compiles `ptx` (NUL-terminated PTX text) and looks up the two entry points.
    pub fn load(
        ctx: &Arc<CudaContext>,
        ptx: &CStr,
        checksum_name: &CStr,
        sin_name: &CStr,
    ) -> Result<Self, PtxLoadFailure> {
        make_current(ctx).map_err(|e| PtxLoadFailure {
            code: e.0,
            call: "cuCtxSetCurrent",
            log: String::new(),
        })?;
        let mut log = vec![0u8; 16 * 1024];
        let mut options = [
            sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
            sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
        ];
        // The size option's value is passed in the pointer-sized slot itself (per the driver
        // API); on return the driver stores the number of bytes it wrote there.
        let mut values: [*mut c_void; 2] = [
            log.as_mut_ptr().cast::<c_void>(),
            std::ptr::without_provenance_mut::<c_void>(log.len()),
        ];
        let mut module: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: `ptx` is NUL-terminated text that lives through the call; `module` is a valid
        // out-parameter; `options`/`values` have the same length (2), the log buffer is writable
        // for the size given and outlives the call; the context is current.
        let code = unsafe {
            sys::cuModuleLoadDataEx(
                &mut module,
                ptx.as_ptr().cast::<c_void>(),
                options.len() as u32,
                options.as_mut_ptr(),
                values.as_mut_ptr(),
            )
        };
        if code != CUresult::CUDA_SUCCESS {
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            return Err(PtxLoadFailure {
                code,
                call: "cuModuleLoadDataEx",
                log: String::from_utf8_lossy(&log[..end]).trim().to_string(),
            });
        }
        // From here on `kernels` owns the module (Drop unloads it on the error paths too).
        let mut kernels = Kernels {
            module,
            checksum: std::ptr::null_mut(),
            sin: std::ptr::null_mut(),
            ctx: Arc::clone(ctx),
        };
        let lookup = |name: &CStr| {
            let mut f: sys::CUfunction = std::ptr::null_mut();
            // SAFETY: `module` is a live module (owned by `kernels`), `name` is NUL-terminated,
            // `f` is a valid out-parameter; the context is current.
            let code = unsafe { sys::cuModuleGetFunction(&mut f, module, name.as_ptr()) };
            if code == CUresult::CUDA_SUCCESS {
                Ok(f)
            } else {
                Err(PtxLoadFailure {
                    code,
                    call: "cuModuleGetFunction",
                    log: format!("entry point {name:?} not found in the embedded PTX"),
                })
            }
        };
        kernels.checksum = lookup(checksum_name)?;
        kernels.sin = lookup(sin_name)?;
        Ok(kernels)
    }

    /// Enqueues the checksum kernel: adds the terms of `nwords` little-endian u64 words at the
    /// start of `src` into the u64 at the start of `out` (which the caller zeroes first).
    ///
    /// # Safety
    /// `src` and `out` are not freed, and `src[..8*nwords]` is not written by other work, until
    /// the kernel has completed on `stream`.
    ///
    /// # Panics
    /// If `8 * nwords > src.bytes()` or `out.bytes() < 8`.
    pub unsafe fn launch_checksum(
        &self,
        stream: &CudaStream,
        src: Span,
        nwords: u64,
        out: Span,
        grid: (u32, u32),
    ) -> Result<(), DriverError> {
        assert!(
            nwords.saturating_mul(8) <= src.bytes as u64,
            "checksum range too large"
        );
        assert!(out.bytes >= 8, "checksum result buffer too small");
        let mut a_src: u64 = src.ptr;
        let mut a_n: u64 = nwords;
        let mut a_out: u64 = out.ptr;
        let mut params: [*mut c_void; 3] = [
            (&mut a_src as *mut u64).cast(),
            (&mut a_n as *mut u64).cast(),
            (&mut a_out as *mut u64).cast(),
        ];
        make_current(&self.ctx)?;
        // SAFETY: the function is live (module owned by self); the three params match the
        // kernel's (.u64, .u64, .u64) signature and the driver copies their values during the
        // call; the address ranges are inside live allocations (asserted) and the caller keeps
        // them alive until completion; the stream belongs to the current context.
        unsafe {
            result::launch_kernel(
                self.checksum,
                (grid.0, 1, 1),
                (grid.1, 1, 1),
                0,
                stream.cu_stream(),
                &mut params,
            )
        }
    }

    /// Enqueues the sin kernel: `x = sin(x)` over the first `n` f32s of `buf`, in place.
    ///
    /// # Safety
    /// `buf` is not freed, and `buf[..4*n]` is not read or written by other work, until the
    /// kernel has completed on `stream`.
    ///
    /// # Panics
    /// If `4 * n > buf.bytes()`.
    pub unsafe fn launch_sin(
        &self,
        stream: &CudaStream,
        buf: Span,
        n: u64,
        grid: (u32, u32),
    ) -> Result<(), DriverError> {
        assert!(
            n.saturating_mul(4) <= buf.bytes as u64,
            "sin range too large"
        );
        let mut a_data: u64 = buf.ptr;
        let mut a_n: u64 = n;
        let mut params: [*mut c_void; 2] = [
            (&mut a_data as *mut u64).cast(),
            (&mut a_n as *mut u64).cast(),
        ];
        make_current(&self.ctx)?;
        // SAFETY: as in launch_checksum: live function, params match (.u64, .u64), the range is
        // inside a live allocation (asserted) that the caller keeps alive until completion.
        unsafe {
            result::launch_kernel(
                self.sin,
                (grid.0, 1, 1),
                (grid.1, 1, 1),
                0,
                stream.cu_stream(),
                &mut params,
            )
        }
    }
}

impl Drop for Kernels {
    fn drop(&mut self) {
        if make_current(&self.ctx).is_ok() {
            // SAFETY: loaded by cuModuleLoadDataEx, unloaded once, here; owners wait for launched
            // kernels before dropping.
            if let Err(e) = unsafe { result::module::unload(self.module) } {
                tracing::warn!(code = ?e.0, "cuModuleUnload failed");
            }
        }
    }
}
