//! The copy ceilings `pinring bench` prints next to the pipeline's throughput: one host buffer
//! (page-locked or pageable) copied into one device buffer on one stream, no pipeline. From
//! page-locked memory the copies go to the driver as the upload engine gives them:
//! [`RAW_BATCH`] to a `cuMemcpyBatchAsync` call where the driver has it.

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::sys;

use super::raw;
use super::register::register_error;
use super::uploader::DeviceBuffer;
use super::{ChunkTable, CudaBackend, HostRegistration, MAX_REGISTER_CHUNK};
use crate::buf::AlignedBuf;
use crate::error::cuda_error;
use crate::BackendError;

impl CudaBackend {
    /// The raw host-to-device ceiling: times `iters` copies of `bytes` from one host buffer
    /// (page-locked with `cuMemHostRegister` when `registered`, else plain pageable memory) into
    /// one device buffer on one stream; returns GB/s (1e9 bytes per second). Registered copies
    /// go `RAW_BATCH` (the engine's `EVENT_GROUPS`) to a driver call where the driver batches
    /// copies (each copy of a call writes the same bytes to the same place, so their order does
    /// not matter), one per call otherwise.
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
        let stream = self.new_stream("raw H2D benchmark")?;
        let dst = DeviceBuffer::alloc(&stream, bytes).map_err(|e| {
            cuda_error(
                "cuMemAlloc",
                format!("{bytes} bytes on device {dev} (raw H2D benchmark)"),
                e.0,
            )
        })?;
        let done = raw::Event::new(&self.ctx)
            .map_err(|e| cuda_error("cuEventCreate", format!("device {dev}"), e.0))?;
        let object = || {
            format!(
                "{bytes} bytes from host {:p} to device {dev}",
                host.as_ptr()
            )
        };
        let batch = if registered && raw::has_memcpy_batch() {
            RAW_BATCH
        } else {
            1
        };
        // The same copy `batch` times: one set of arrays serves every call.
        let (mut dsts, mut srcs, mut sizes) = (
            vec![dst.ptr(); batch],
            vec![host.as_ptr() as sys::CUdeviceptr; batch],
            vec![bytes; batch],
        );
        let mut run = |n: usize| -> Result<(), BackendError> {
            let mut left = n;
            while left > 0 {
                let k = left.min(batch);
                left -= k;
                if batch == 1 {
                    // SAFETY: `host` and `dst` stay alive, and `host` unwritten, until `done`
                    // below has completed, which covers every copy enqueued on `stream` before
                    // it.
                    unsafe { dst.copy_in_async(0, host.as_ptr(), bytes, &stream) }
                        .map_err(|e| cuda_error("cuMemcpyHtoDAsync", object(), e.0))?;
                    continue;
                }
                // SAFETY: as for one copy above, for each of the `k` (all the same range of
                // `dst`, inside it); the driver has the call (`has_memcpy_batch`).
                unsafe {
                    raw::memcpy_htod_batch_async(
                        &mut dsts[..k],
                        &mut srcs[..k],
                        &mut sizes[..k],
                        dev as i32,
                        &stream,
                    )
                }
                .map_err(|(e, _)| cuda_error("cuMemcpyBatchAsync", object(), e.0))?;
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
}

/// Copies per driver call in the registered ceiling: what the upload engine gives one
/// `cuMemcpyBatchAsync` call at small slots (`EVENT_GROUPS` parts of one copy each).
const RAW_BATCH: usize = super::uploader::EVENT_GROUPS;
