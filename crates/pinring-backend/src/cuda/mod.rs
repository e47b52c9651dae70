//! The CUDA backend.
//!
//! - [`CudaBackend`] holds the device's primary context (`Arc<CudaContext>`). It is created only
//!   after probing that `libcuda` can be loaded, so a machine without a driver gets an error
//!   (or, with `--backend auto`, the host backend) instead of cudarc's load panic.
//! - `register` pins the ring with `cuMemHostRegister` in chunks of at most 256 GiB.
//! - [`CudaUploader`] owns N device buffers, a copy stream, a small-copy stream and a kernel
//!   stream. `submit` copies from the raw (registered) host pointer (`cuMemcpyBatchAsync` for
//!   held copies where the driver has it, else `cuMemcpyHtoDAsync`) and records an event shared
//!   by several uploads; a completion thread waits on the events in submission order (asleep,
//!   or by looks after naps for parts of 1 MiB or more) and sends [`crate::Completion`]s.
//! - `checksum` / `compute` run embedded PTX kernels (see `ptx.rs`) on the kernel stream.
//!
//! The modules, one seam each:
//!
//! | module | what |
//! | --- | --- |
//! | `probe` | loading the driver, `cuInit`, device discovery, [`CudaBackend::new`], the probe line |
//! | `bandwidth` | the raw and pageable copy ceilings `pinring bench` prints |
//! | `register` | `cuMemHostRegister` in chunks, the RAII guard, the table copies are split at |
//! | `uploader` | [`CudaUploader`]: device buffers, `submit`, the per-buffer pending and reader counts |
//! | `completion` | the completion thread's loop |
//! | `kernels` | checksum / sin launch glue (the PTX itself is in `ptx`) |
//! | `zero_copy` | DEVICEMAP mapped addresses and the kernels over them |
//! | [`ipc`] | CUDA IPC: the device buffers' handles and events for a consumer in another process, and [`ipc::Imported`], the consumer's side |
//! //! | `decoder` | decoding on copy: nvJPEG into scratch, then the crop/resize/output kernel (`resize.cu`, compiled by NVRTC), a CPU fallback per sample |
//! | `nvlibs` | nvJPEG and NVRTC loaded at run time: every raw call of theirs |
//! | `raw` | the thin unsafe layer: every raw driver call (those of CUDA IPC are in `ipc/raw.rs`) |
//!
//! Contexts, streams and kernels are cudarc's safe types; device buffers are `cuMemAlloc`
//! allocations (CUDA IPC cannot export cudarc's pool allocations) seen through cudarc slices.
//! The raw driver calls that remain (registration, mapped pointers, the upload copy,
//! events, the device buffers' allocation; the reasons are in
//! docs/ARCHITECTURE.md) all live in `raw.rs`, those of CUDA IPC in `ipc/raw.rs`, and the other
//! modules only sequence them.

mod bandwidth;
mod completion;
mod decoder;
pub mod ipc;
mod kernels;
mod nvlibs;
pub(crate) mod probe;
mod ptx;
mod raw;
mod register;
#[cfg(test)]
mod resample_cases;
mod uploader;
mod zero_copy;

#[cfg(test)]
mod tests;

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream};

use crate::error::cuda_error;
use crate::{Backend, BackendError, Placement, Registration, Uploader};

pub(crate) use probe::probe;
pub use raw::{describe, driver_library_present};
pub use register::{ChunkTable, HostRegistration, MAX_REGISTER_CHUNK};
pub use uploader::CudaUploader;

/// Whether this host can decode JPEGs on GPU `device`: the driver loads, the device exists
/// and nvJPEG and NVRTC load (`[dataset.image] decode = "auto"` resolves to "gpu" if so).
/// Opens no context.
pub fn gpu_decode_available(device: usize) -> bool {
    probe::locate(device).is_ok() && nvlibs::decode_libraries_load()
}

/// [`pinring_data::HostFacts::gpu_decode`] for `cfg` (its overrides applied): whether its
/// `[dataset.image] decode = "auto"` resolves to "gpu" on this host, for daemon.device (else
/// 0). Probes only where the config says "auto" (false otherwise).
pub fn decode_auto_on_gpu(cfg: &pinring_data::Config) -> bool {
    let auto = cfg
        .dataset
        .image
        .as_ref()
        .is_some_and(|i| i.decode == pinring_data::ImageDecode::Auto);
    if !auto {
        return false;
    }
    let device = cfg.daemon.device.map_or(0, |d| d as usize);
    let gpu = gpu_decode_available(device);
    tracing::info!(
        device,
        gpu,
        "[dataset.image] decode = \"auto\": the images are decoded on the {}",
        if gpu {
            "GPU where the batch is copied"
        } else {
            "CPU, by the loaders"
        }
    );
    gpu
}

/// The alignment of each buffer of a [`Placement::Contiguous`] uploader: buffers lie this many
/// bytes apart or a multiple of it (512, the alignment PyTorch's caching allocator gives its own
/// blocks, so a tensor at a buffer's start is aligned as a tensor of PyTorch's own would be).
pub const BUFFER_ALIGN: usize = 512;

/// A device as [`Backend::describe`] and [`crate::locate`] name it.
fn description(name: &str, device: usize, total_mem: usize) -> String {
    format!("cuda: {name} (device {device}, {} GiB)", gib(total_mem))
}

fn gib(bytes: usize) -> u64 {
    (bytes as f64 / (1u64 << 30) as f64).round() as u64
}

/// The CUDA backend for one device.
#[derive(Debug)]
pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    device: usize,
    name: String,
    total_mem: usize,
    sm_count: u32,
    compute_capability: (i32, i32),
    /// Chunks registered through this backend (uploads split at their boundaries).
    chunks: Arc<ChunkTable>,
}

impl CudaBackend {
    /// The device's primary context. cudarc's event tracking is off in it (see
    /// [`CudaBackend::new`]): a caller that allocates `CudaSlice`s through it orders their uses
    /// across streams itself.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The device index.
    pub fn device(&self) -> usize {
        self.device
    }

    /// The device name, e.g. "NVIDIA H200".
    pub fn device_name(&self) -> &str {
        &self.name
    }

    /// Total device memory in bytes.
    pub fn total_mem(&self) -> usize {
        self.total_mem
    }

    /// (major, minor) compute capability.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.compute_capability
    }

    fn new_stream(&self, what: &str) -> Result<Arc<CudaStream>, BackendError> {
        self.ctx.new_stream().map_err(|e| {
            cuda_error(
                "cuStreamCreate",
                format!("{what} stream on device {}", self.device),
                e.0,
            )
        })
    }

    /// A concrete uploader (the trait method boxes this).
    pub fn cuda_uploader(
        &self,
        buffers: usize,
        buffer_bytes: usize,
        placement: Placement,
    ) -> Result<CudaUploader, BackendError> {
        CudaUploader::new(self, buffers, buffer_bytes, placement)
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn describe(&self) -> String {
        description(&self.name, self.device, self.total_mem)
    }

    fn pci_bus_id(&self) -> Option<String> {
        use cudarc::driver::sys::CUdevice_attribute as A;
        let get = |a| self.ctx.attribute(a).ok();
        let domain = get(A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?;
        let bus = get(A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?;
        let device = get(A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?;
        Some(format!("{domain:04x}:{bus:02x}:{device:02x}.0"))
    }

    unsafe fn register(
        &self,
        base: *mut u8,
        len: usize,
        devicemap: bool,
    ) -> Result<Registration, BackendError> {
        // SAFETY: forwarded from the caller of `Backend::register`.
        unsafe { self.register_chunked(base, len, devicemap, MAX_REGISTER_CHUNK) }
    }

    fn raw_copy_gbps(
        &self,
        bytes: usize,
        iters: usize,
        registered: bool,
    ) -> Result<f64, BackendError> {
        self.raw_h2d_gbps(bytes, iters, registered)
    }

    fn uploader(
        &self,
        buffers: usize,
        buffer_bytes: usize,
        placement: Placement,
    ) -> Result<Box<dyn Uploader>, BackendError> {
        Ok(Box::new(self.cuda_uploader(
            buffers,
            buffer_bytes,
            placement,
        )?))
    }
}

/// Compile-time checks that the types cross threads as the traits require.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<CudaBackend>();
    const fn send<T: Send>() {}
    send::<CudaUploader>();
};
