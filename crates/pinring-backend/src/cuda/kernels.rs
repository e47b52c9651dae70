//! Kernel launch glue: the checksum and sin kernels (PTX in `ptx.rs`, loaded on first use) over
//! a device buffer or, for zero-copy, a mapped host range (`zero_copy.rs`), on the uploader's
//! kernel stream, one call at a time.

use std::sync::MutexGuard;

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, CudaView, DevicePtr, DriverError};

use super::uploader::CudaUploader;
use super::{ptx, raw};
use crate::checksum::word_term;
use crate::error::cuda_error;
use crate::BackendError;

/// State used by `checksum` / `compute` (one at a time).
#[derive(Debug)]
pub(super) struct KernelState {
    /// Loaded on first use, so a PTX problem never blocks plain uploads.
    pub(super) kernels: Option<raw::Kernels>,
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

    /// [`crate::Uploader::checksum`] over device buffer `buffer`.
    pub(super) fn checksum_buffer(&self, buffer: usize, len: usize) -> Result<u64, BackendError> {
        // Held until we return, which is after the kernel and the read-back have been waited for.
        let (buf, _reading) = self.begin_read("checksum", buffer, len)?;
        let err = |call, e| self.kernel_error(call, "checksum", buffer, len, e);
        // SAFETY: `buf` is a live device allocation of at least `len` bytes (checked), borrowed
        // for the whole call. It is held as a reader with no upload pending (uploader docs), so
        // no copy into it runs until this returns.
        unsafe {
            self.checksum_span(buf.span(len), len, &err, &mut |last, st| {
                let tail = buf.slice().slice(len - last.len()..len);
                read_back(&self.kernel_stream, &tail, last, &st.done)
            })
        }
    }

    /// [`crate::Uploader::compute`] over device buffer `buffer`.
    pub(super) fn compute_buffer(&self, buffer: usize, len: usize) -> Result<(), BackendError> {
        // Held until we return, which is after the kernel has been waited for.
        let (buf, _reading) = self.begin_read("compute", buffer, len)?;
        let err = |call, e| self.kernel_error(call, "sin kernel", buffer, len, e);
        // SAFETY: as in `checksum_buffer`: a live allocation of at least `len` bytes, borrowed
        // for the call and held as a reader, so no copy into it runs until this returns.
        unsafe { self.sin_span(buf.span(len), len, &err) }
    }

    /// The checksum kernel over the whole words of `span[..len]`, plus the partial last word,
    /// whose bytes `read_tail` fills (from the device copy, or from the host range itself).
    ///
    /// # Safety
    /// `span` addresses at least `len` bytes of a live allocation or DEVICEMAP registration that
    /// stays alive, and unwritten by the host, until this returns.
    pub(super) unsafe fn checksum_span(
        &self,
        span: raw::Span,
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
            // With event tracking off (`CudaBackend::new`) this records nothing.
            let (out, _) = st.result.device_ptr(stream);
            let out = raw::Span {
                ptr: out,
                bytes: st.result.len(),
            };
            // SAFETY: the span is live for `len` bytes (caller), and it and `st.result` stay
            // alive until read_back below has waited for the whole kernel stream.
            unsafe { kernels.launch_checksum(stream, span, nwords, out, self.grid(nwords)) }
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
