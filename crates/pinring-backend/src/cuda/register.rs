//! Registration: page-locking a host range with `cuMemHostRegister` in chunks of at most
//! [`MAX_REGISTER_CHUNK`], the RAII guard that unregisters them, and the table of registered
//! chunks that uploads are split at.

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::sys::{self, CUresult};
use cudarc::driver::CudaContext;

use super::raw::{self, describe, make_current};
use super::CudaBackend;
use crate::error::cuda_error;
use crate::{BackendError, Registration};

/// Largest range passed to one `cuMemHostRegister` call.
pub const MAX_REGISTER_CHUNK: usize = 256 << 30;

/// The chunks registered through one backend, as (start address, length).
///
/// A single `cuMemcpyHtoDAsync` whose source spans two separately registered chunks fails with
/// `CUDA_ERROR_INVALID_VALUE` (seen on an H200 with driver 580), so uploaders split copies at
/// chunk boundaries with [`ChunkTable::next_boundary`].
#[derive(Debug, Default)]
pub struct ChunkTable {
    chunks: std::sync::RwLock<Vec<(usize, usize)>>,
}

impl ChunkTable {
    /// The first chunk start or end strictly inside `(from, to)`, or `to` if there is none.
    pub fn next_boundary(&self, from: usize, to: usize) -> usize {
        let chunks = self.chunks.read().unwrap_or_else(|e| e.into_inner());
        let mut next = to;
        for &(s, n) in chunks.iter() {
            for b in [s, s.saturating_add(n)] {
                if b > from && b < next {
                    next = b;
                }
            }
        }
        next
    }

    fn add(&self, start: usize, len: usize) {
        let mut chunks = self.chunks.write().unwrap_or_else(|e| e.into_inner());
        chunks.push((start, len));
    }

    fn remove(&self, start: usize, len: usize) {
        let mut chunks = self.chunks.write().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = chunks.iter().position(|&c| c == (start, len)) {
            chunks.swap_remove(i);
        }
    }
}

/// A host range registered with `cuMemHostRegister`, as one or more chunks; drop unregisters.
#[derive(Debug)]
pub struct HostRegistration {
    ctx: Arc<CudaContext>,
    /// (start address, length) of each registered chunk.
    chunks: Vec<(usize, usize)>,
    /// Where the chunks are listed while registered.
    table: Arc<ChunkTable>,
}

/// A failed chunk registration: the chunk's address and length and the driver code.
#[derive(Debug)]
pub struct RegisterFailure {
    /// Start of the chunk that failed.
    pub chunk_base: usize,
    /// Length of the chunk that failed.
    pub chunk_len: usize,
    /// Index of the chunk that failed.
    pub chunk_index: usize,
    /// The driver's code.
    pub code: CUresult,
}

impl HostRegistration {
    /// Registers `[base, base+len)` in chunks of at most `max_chunk` bytes (normally
    /// [`MAX_REGISTER_CHUNK`]; must be a non-zero multiple of the page size) with `flags`
    /// (`CU_MEMHOSTREGISTER_*`). On failure the chunks already registered are unregistered
    /// again.
    ///
    /// # Safety
    /// `[base, base+len)` is a live mapping of this process that stays mapped (not unmapped or
    /// remapped) until the returned value is dropped.
    pub unsafe fn register(
        ctx: &Arc<CudaContext>,
        base: *mut u8,
        len: usize,
        flags: u32,
        max_chunk: usize,
        table: &Arc<ChunkTable>,
    ) -> Result<Self, RegisterFailure> {
        assert!(max_chunk > 0, "register chunk size must be positive");
        let fail = |chunk_index, code| RegisterFailure {
            chunk_base: base as usize,
            chunk_len: len,
            chunk_index,
            code,
        };
        make_current(ctx).map_err(|e| fail(0, e.0))?;
        let mut reg = HostRegistration {
            ctx: Arc::clone(ctx),
            chunks: Vec::with_capacity(len.div_ceil(max_chunk)),
            table: Arc::clone(table),
        };
        let mut off = 0usize;
        while off < len {
            let n = (len - off).min(max_chunk);
            let p = base.wrapping_add(off);
            // SAFETY: [p, p+n) lies inside [base, base+len), which the caller guarantees is a
            // live mapping that outlives `reg` (whose Drop unregisters exactly this chunk);
            // the context is current on this thread (make_current above).
            if let Err(e) = unsafe { raw::host_register(p, n, flags) } {
                let index = reg.chunks.len();
                drop(reg); // unregisters the chunks done so far
                return Err(RegisterFailure {
                    chunk_base: p as usize,
                    chunk_len: n,
                    chunk_index: index,
                    code: e.0,
                });
            }
            reg.chunks.push((p as usize, n));
            table.add(p as usize, n);
            off += n;
        }
        Ok(reg)
    }

    /// Number of registered chunks.
    pub fn chunk_count(&self) -> usize {
        self.chunks.len()
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        if let Err(e) = make_current(&self.ctx) {
            tracing::warn!(code = ?e.0, "cuCtxSetCurrent before cuMemHostUnregister failed");
        }
        for &(p, n) in &self.chunks {
            self.table.remove(p, n);
            // SAFETY: (p, n) was registered by `register` and not unregistered since; the caller
            // of `register` keeps the mapping alive until now.
            if let Err(e) = unsafe { raw::host_unregister(p as *mut u8) } {
                tracing::warn!(
                    "cuMemHostUnregister failed on {n} bytes at {p:#x}: {:?} ({})",
                    e.0,
                    describe(e.0)
                );
            }
        }
    }
}

pub(super) fn register_error(
    f: RegisterFailure,
    base: *const u8,
    len: usize,
    dev: usize,
) -> BackendError {
    let whole = format!("{len} bytes at {base:p}");
    let object = if f.chunk_len == len {
        format!("{whole} (device {dev})")
    } else {
        format!(
            "chunk {} ({} bytes at {:#x}) of {whole} (device {dev})",
            f.chunk_index, f.chunk_len, f.chunk_base
        )
    };
    cuda_error("cuMemHostRegister", object, f.code)
}

impl CudaBackend {
    /// [`crate::Backend::register`] with an explicit chunk size (a multiple of the page size,
    /// at most [`MAX_REGISTER_CHUNK`] in production; smaller values exercise chunking in tests).
    ///
    /// # Safety
    /// As for [`crate::Backend::register`]: the range must be a live mapping that outlives the
    /// guard.
    pub unsafe fn register_chunked(
        &self,
        base: *mut u8,
        len: usize,
        devicemap: bool,
        max_chunk: usize,
    ) -> Result<Registration, BackendError> {
        if base.is_null() || len == 0 || max_chunk == 0 || max_chunk % crate::buf::PAGE != 0 {
            return Err(BackendError::InvalidArgument {
                call: "register",
                what: format!(
                    "empty or null range or bad chunk size: {len} bytes at {base:p}, chunks of {max_chunk} bytes"
                ),
            });
        }
        if (base as usize) % crate::buf::PAGE != 0 || len % crate::buf::PAGE != 0 {
            tracing::warn!(
                "registering {len} bytes at {base:p}, which is not page-aligned; the driver pins \
                 whole pages"
            );
        }
        let mut flags = sys::CU_MEMHOSTREGISTER_PORTABLE;
        if devicemap {
            flags |= sys::CU_MEMHOSTREGISTER_DEVICEMAP;
        }
        let start = Instant::now();
        // SAFETY: the caller guarantees [base, base+len) is a live mapping that outlives the
        // returned guard, which owns the HostRegistration.
        let reg = unsafe {
            HostRegistration::register(&self.ctx, base, len, flags, max_chunk, &self.chunks)
        }
        .map_err(|f| register_error(f, base, len, self.device))?;
        let seconds = start.elapsed().as_secs_f64();
        tracing::info!(
            bytes = len,
            chunks = reg.chunk_count(),
            seconds,
            "registered host range with cuMemHostRegister"
        );
        Ok(Registration {
            base: base as usize,
            bytes: len as u64,
            seconds,
            inner: Some(reg),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::ChunkTable;

    #[test]
    fn chunk_boundaries_split_copies() {
        let t = ChunkTable::default();
        assert_eq!(t.next_boundary(100, 200), 200);
        t.add(1000, 500);
        t.add(1500, 500);
        // inside one chunk: no split
        assert_eq!(t.next_boundary(1100, 1400), 1400);
        // straddles 1500
        assert_eq!(t.next_boundary(1400, 1600), 1500);
        assert_eq!(t.next_boundary(1500, 1600), 1600);
        // starts before the table, ends inside
        assert_eq!(t.next_boundary(900, 1100), 1000);
        // ends past the last chunk
        assert_eq!(t.next_boundary(1900, 2100), 2000);
        t.remove(1000, 500);
        assert_eq!(t.next_boundary(900, 1100), 1100);
    }
}
