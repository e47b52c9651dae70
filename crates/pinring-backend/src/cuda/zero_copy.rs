//! Zero-copy: host memory registered with DEVICEMAP, seen by kernels through its mapped device
//! address (`cuMemHostGetDevicePointer`), so the checksum and sin kernels read a batch in its
//! ring slot across the bus instead of from a device copy. These paths read no device buffer.

use cudarc::driver::DriverError;

use super::kernels::{KernelState, Span};
use super::raw;
use super::uploader::CudaUploader;
use super::CudaBackend;
use crate::error::cuda_error;
use crate::BackendError;

impl CudaBackend {
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
}

impl CudaUploader {
    /// The mapped device span of a zero-copy host range.
    fn mapped_span(
        &self,
        call: &'static str,
        host_ptr: *const u8,
        len: usize,
    ) -> Result<Span, BackendError> {
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
        Ok(Span { ptr, bytes: len })
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

    /// [`crate::DeviceKernels::checksum_mapped`].
    ///
    /// # Safety
    /// As for [`crate::DeviceKernels::checksum_mapped`].
    pub(super) unsafe fn checksum_mapped_range(
        &self,
        host_ptr: *const u8,
        len: usize,
    ) -> Result<u64, BackendError> {
        if len == 0 {
            return Ok(0);
        }
        let span = self.mapped_span("cuMemHostGetDevicePointer", host_ptr, len)?;
        let err = |call, e| self.mapped_error(call, "checksum", host_ptr, len, e);
        let mut read_tail = |last: &mut [u8], _: &KernelState| {
            let tail_ptr = host_ptr.wrapping_add(len - last.len());
            // SAFETY: tail_ptr..tail_ptr+last.len() is the end of the caller's live range, and
            // `last` is private memory, so the two cannot overlap. A raw copy rather than a
            // slice: ring slot bytes are never viewed through a Rust reference (another process
            // may write them; docs/ARCHITECTURE.md).
            unsafe { std::ptr::copy_nonoverlapping(tail_ptr, last.as_mut_ptr(), last.len()) };
            Ok(())
        };
        // SAFETY: the span is the mapped address of a live DEVICEMAP registration of `len` bytes
        // that the caller keeps alive and unwritten until we return.
        unsafe { self.checksum_span(span, len, &err, &mut read_tail) }
    }

    /// [`crate::DeviceKernels::compute_mapped`].
    ///
    /// # Safety
    /// As for [`crate::DeviceKernels::compute_mapped`].
    pub(super) unsafe fn compute_mapped_range(
        &self,
        host_ptr: *mut u8,
        len: usize,
    ) -> Result<(), BackendError> {
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
