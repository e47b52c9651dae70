//! Kernel launch glue: the checksum and sin kernels (PTX in `ptx.rs`, loaded on first use) over
//! a device buffer or, for zero-copy, a mapped host range (`zero_copy.rs`), on the uploader's
//! kernel stream, one call at a time.

use std::ffi::CStr;
use std::sync::{Arc, MutexGuard};

use cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaSlice, CudaStream, CudaView, DriverError, LaunchConfig,
    PushKernelArg,
};
use cudarc::nvrtc::Ptx;

use super::uploader::CudaUploader;
use super::{ptx, raw};
use crate::checksum::word_term;
use crate::error::cuda_error;
use crate::BackendError;

/// A range of device-addressable memory a kernel may read or write: (part of) a device buffer,
/// or host memory registered with DEVICEMAP seen through its mapped device address (zero-copy).
#[derive(Debug, Clone, Copy)]
pub(super) struct Span {
    /// Device address.
    pub(super) ptr: sys::CUdeviceptr,
    /// Bytes from `ptr` that belong to the allocation or registration.
    pub(super) bytes: usize,
}

/// The checksum and sin kernels of the embedded PTX; cudarc owns the module (unloaded when the
/// last function is dropped).
#[derive(Debug)]
pub(super) struct Kernels {
    checksum: CudaFunction,
    sin: CudaFunction,
}

impl Kernels {
    /// JIT-compiles the embedded PTX (`ptx.rs`) in `ctx` and looks up the two entry points.
    fn load(ctx: &Arc<CudaContext>, device: usize) -> Result<Self, BackendError> {
        let object = |what: String| {
            format!("pinring's embedded PTX (.target sm_80) on device {device}; {what}")
        };
        let module = ctx
            .load_module(Ptx::from_src(ptx::PTX.to_string_lossy()))
            .map_err(|e| {
                let log = raw::jit_error_log(ctx, ptx::PTX);
                let log = if log.is_empty() { "(empty)" } else { &log };
                cuda_error("cuModuleLoadData", object(format!("JIT log: {log}")), e.0)
            })?;
        let function = |name: &CStr| {
            module.load_function(&name.to_string_lossy()).map_err(|e| {
                cuda_error(
                    "cuModuleGetFunction",
                    object(format!(
                        "entry point {name:?} not found in the embedded PTX"
                    )),
                    e.0,
                )
            })
        };
        Ok(Self {
            checksum: function(ptx::CHECKSUM_KERNEL)?,
            sin: function(ptx::SIN_KERNEL)?,
        })
    }

    /// Enqueues the checksum kernel: adds the terms of `nwords` little-endian u64 words at the
    /// start of `src` into the u64 at the start of `out` (which the caller zeroes first).
    ///
    /// # Safety
    /// `src` and `out` are not freed, and `src[..8*nwords]` is not written by other work, until
    /// the kernel has completed on `stream`.
    ///
    /// # Panics
    /// If `8 * nwords > src.bytes` or `out` is shorter than 8 bytes.
    unsafe fn launch_checksum(
        &self,
        stream: &CudaStream,
        src: Span,
        nwords: u64,
        out: &mut CudaSlice<u8>,
        grid: (u32, u32),
    ) -> Result<(), DriverError> {
        assert!(
            nwords.saturating_mul(8) <= src.bytes as u64,
            "checksum range too large"
        );
        assert!(out.len() >= 8, "checksum result buffer too small");
        let mut launch = stream.launch_builder(&self.checksum);
        launch.arg(&src.ptr).arg(&nwords).arg(out);
        // SAFETY: the function is live (its module is owned through it); the three arguments
        // match the kernel's (.u64, .u64, .u64) signature; the address ranges lie inside live
        // allocations (asserted) that the caller keeps alive until completion; with event
        // tracking off (`CudaBackend::new`) the builder adds no waits or records.
        unsafe { launch.launch(launch_config(grid)) }.map(|_| ())
    }

    /// Enqueues the sin kernel: `x = sin(x)` over the first `n` f32s of `buf`, in place.
    ///
    /// # Safety
    /// `buf` is not freed, and `buf[..4*n]` is not read or written by other work, until the
    /// kernel has completed on `stream`.
    ///
    /// # Panics
    /// If `4 * n > buf.bytes`.
    unsafe fn launch_sin(
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
        let mut launch = stream.launch_builder(&self.sin);
        launch.arg(&buf.ptr).arg(&n);
        // SAFETY: as in launch_checksum: live function, arguments match (.u64, .u64), the range
        // is inside a live allocation (asserted) that the caller keeps alive until completion.
        unsafe { launch.launch(launch_config(grid)) }.map(|_| ())
    }
}

/// A 1-D launch of `grid.0` blocks of `grid.1` threads (the PTX's launch contract).
fn launch_config(grid: (u32, u32)) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (grid.0, 1, 1),
        block_dim: (grid.1, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// State used by `checksum` / `compute` (one at a time).
#[derive(Debug)]
pub(super) struct KernelState {
    /// Loaded on first use, so a PTX problem never blocks plain uploads.
    pub(super) kernels: Option<Kernels>,
    /// 8-byte device word the checksum kernel accumulates into (used on the kernel stream only).
    pub(super) result: CudaSlice<u8>,
    /// Signalled after each kernel-stream operation.
    pub(super) done: raw::Event,
}

/// Fills the bytes of a checksum's partial last word.
pub(super) type ReadTail<'a> = dyn FnMut(&mut [u8], &KernelState) -> Result<(), DriverError> + 'a;

impl CudaUploader {
    /// Grid size for `n` items: enough blocks to cover them, at most 8 per SM.
    fn grid(&self, n: u64) -> (u32, u32) {
        let block = u64::from(ptx::BLOCK);
        let max_blocks = u64::from(self.sm_count) * 8;
        let blocks = n.div_ceil(block).clamp(1, max_blocks);
        (blocks as u32, ptx::BLOCK)
    }

    fn lock_kernels(&self) -> Result<MutexGuard<'_, KernelState>, BackendError> {
        let mut st = self.kernel_state.lock().unwrap_or_else(|e| e.into_inner());
        if st.kernels.is_none() {
            st.kernels = Some(Kernels::load(&self.ctx, self.device)?);
        }
        Ok(st)
    }

    fn kernel_error(
        &self,
        call: &'static str,
        what: &str,
        buffer: usize,
        offset: usize,
        len: usize,
        e: DriverError,
    ) -> BackendError {
        cuda_error(
            call,
            format!(
                "{what} over {len} bytes at offset {offset} of device buffer {buffer} on device {}",
                self.device
            ),
            e.0,
        )
    }

    /// [`crate::DeviceKernels::checksum`] over bytes `offset..offset + len` of device buffer `buffer`
    /// (`offset` a multiple of 8, checked by the caller).
    pub(super) fn checksum_buffer(
        &self,
        buffer: usize,
        offset: usize,
        len: usize,
    ) -> Result<u64, BackendError> {
        // Held until we return, which is after the kernel and the read-back have been waited for.
        let (buf, _reading) = self.begin_read("checksum", buffer, offset, len)?;
        let err = |call, e| self.kernel_error(call, "checksum", buffer, offset, len, e);
        let end = offset + len; // checked by begin_read: no overflow, inside the buffer
                                // SAFETY: `buf` is a live device allocation holding bytes offset..offset + len (checked),
                                // borrowed for the whole call, and the span starts at a multiple of 8 bytes from the
                                // allocation's start (the caller checked the offset), so the kernel's 8-byte loads are
                                // aligned. It is held as a reader with no upload pending (uploader docs), so no copy
                                // into it runs until this returns.
        unsafe {
            self.checksum_span(buf.span(offset, len), len, &err, &mut |last, st| {
                let tail = buf.slice().slice(end - last.len()..end);
                read_back(&self.kernel_stream, &tail, last, &st.done)
            })
        }
    }

    /// [`crate::DeviceKernels::compute`] over device buffer `buffer`.
    pub(super) fn compute_buffer(&self, buffer: usize, len: usize) -> Result<(), BackendError> {
        // Held until we return, which is after the kernel has been waited for.
        let (buf, _reading) = self.begin_read("compute", buffer, 0, len)?;
        let err = |call, e| self.kernel_error(call, "sin kernel", buffer, 0, len, e);
        // SAFETY: as in `checksum_buffer`: a live allocation of at least `len` bytes, borrowed
        // for the call and held as a reader, so no copy into it runs until this returns.
        unsafe { self.sin_span(buf.span(0, len), len, &err) }
    }

    /// The checksum kernel over the whole words of `span[..len]`, plus the partial last word,
    /// whose bytes `read_tail` fills (from the device copy, or from the host range itself).
    ///
    /// # Safety
    /// `span` addresses at least `len` bytes of a live allocation or DEVICEMAP registration that
    /// stays alive, and unwritten by the host, until this returns.
    pub(super) unsafe fn checksum_span(
        &self,
        span: Span,
        len: usize,
        err: &dyn Fn(&'static str, DriverError) -> BackendError,
        read_tail: &mut ReadTail<'_>,
    ) -> Result<u64, BackendError> {
        if len == 0 {
            return Ok(0);
        }
        let mut guard = self.lock_kernels()?;
        let st = &mut *guard;
        let Some(kernels) = st.kernels.as_ref() else {
            unreachable!("lock_kernels loads the kernels");
        };
        let stream = &self.kernel_stream;
        let nwords = (len / 8) as u64;
        let tail = len % 8;
        stream
            .memset_zeros(&mut st.result)
            .map_err(|e| err("cuMemsetD8Async", e))?;
        if nwords > 0 {
            // SAFETY: the span is live for `len` bytes (caller), and it and `st.result` stay
            // alive until read_back below has waited for the whole kernel stream.
            unsafe {
                kernels.launch_checksum(stream, span, nwords, &mut st.result, self.grid(nwords))
            }
            .map_err(|e| err("cuLaunchKernel", e))?;
        }
        let mut word = [0u8; 8];
        read_back(stream, &st.result.as_view(), &mut word, &st.done)
            .map_err(|e| err("cuMemcpyDtoHAsync/cuEventSynchronize", e))?;
        let mut sum = u64::from_le_bytes(word);
        if tail > 0 {
            let mut last = [0u8; 8];
            read_tail(&mut last[..tail], st).map_err(|e| err("reading the last word", e))?;
            sum = sum.wrapping_add(word_term(nwords, u64::from_le_bytes(last)));
        }
        Ok(sum)
    }

    /// The sin kernel in place over the f32s of `span[..len]`, waited for.
    ///
    /// # Safety
    /// As for [`CudaUploader::checksum_span`]; the caller also gives up the bytes' contents.
    pub(super) unsafe fn sin_span(
        &self,
        span: Span,
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

/// Copies `src` into `dst` (of the same length) on `stream`, then waits for `done` recorded
/// after the copy, so `dst` is written when this returns.
pub(super) fn read_back(
    stream: &Arc<CudaStream>,
    src: &CudaView<'_, u8>,
    dst: &mut [u8],
    done: &raw::Event,
) -> Result<(), DriverError> {
    if dst.is_empty() {
        return Ok(());
    }
    stream.memcpy_dtoh(src, dst)?;
    done.record(stream)?;
    done.synchronize()
}
