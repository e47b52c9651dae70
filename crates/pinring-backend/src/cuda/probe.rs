//! Finding the driver and the device: loading `libcuda` (probed first: with dynamic loading,
//! cudarc panics on its first call when the library is missing), `cuInit`, device discovery,
//! [`CudaBackend::new`], and the one-line [`probe`] behind [`crate::cuda_available`]. The
//! `auto`/`cuda` choice in [`crate::select`] is made from these errors.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use cudarc::driver::sys;
use cudarc::driver::{result, CudaContext};

use super::raw::{self, describe, driver_library_present};
use super::{ChunkTable, CudaBackend};
use crate::error::cuda_error;
use crate::BackendError;

/// Loads the driver library (after probing for it) and runs `cuInit(0)`.
fn init_driver() -> Result<(), BackendError> {
    if !driver_library_present() {
        return Err(BackendError::NoDriver);
    }
    match catch_unwind(result::init) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(BackendError::InitFailed {
            code: e.0,
            description: describe(e.0),
        }),
        Err(p) => Err(BackendError::DriverPanic {
            call: "cuInit",
            message: panic_message(&*p),
        }),
    }
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

/// Runs `f`, turning a panic inside cudarc into [`BackendError::DriverPanic`].
fn guarded<T>(
    call: &'static str,
    f: impl FnOnce() -> Result<T, BackendError>,
) -> Result<T, BackendError> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        Err(BackendError::DriverPanic {
            call,
            message: panic_message(&*p),
        })
    })
}

fn device_count() -> Result<usize, BackendError> {
    result::device::get_count()
        .map(|n| n.max(0) as usize)
        .map_err(|e| cuda_error("cuDeviceGetCount", "the driver".to_string(), e.0))
}

/// Fails with [`BackendError::NoSuchDevice`] unless the driver counts `device`.
fn check_device(device: usize) -> Result<(), BackendError> {
    let count = device_count()?;
    if device >= count {
        return Err(BackendError::NoSuchDevice { device, count });
    }
    Ok(())
}

/// Probes the driver without creating a context: `Ok("NVIDIA H200 x1, driver 13.0")`.
pub(crate) fn probe() -> Result<String, BackendError> {
    init_driver()?;
    guarded("probe", || {
        let count = device_count()?;
        if count == 0 {
            return Err(BackendError::NoSuchDevice { device: 0, count });
        }
        let mut names = Vec::with_capacity(count);
        for i in 0..count {
            let name = result::device::get(i as i32)
                .and_then(result::device::get_name)
                .map_err(|e| cuda_error("cuDeviceGetName", format!("device {i}"), e.0))?;
            names.push(name);
        }
        let version = raw::driver_version()
            .map_err(|e| cuda_error("cuDriverGetVersion", "the driver".to_string(), e.0))?;
        let devices = if names.iter().all(|n| *n == names[0]) {
            format!("{} x{count}", names[0])
        } else {
            names.join(", ")
        };
        Ok(format!(
            "{devices}, driver {}.{}",
            version / 1000,
            (version % 1000) / 10
        ))
    })
}

/// Loads the driver (probing first) and checks that `device` exists, without creating a context
/// (no GPU memory, nothing scheduled on the GPU): its description as [`crate::Backend::describe`]
/// gives it, and its PCI address.
pub(crate) fn locate(device: usize) -> Result<crate::Located, BackendError> {
    use sys::CUdevice_attribute as A;
    init_driver()?;
    guarded("locate", || {
        check_device(device)?;
        let object = || format!("device {device}");
        let dev = result::device::get(device as i32)
            .map_err(|e| cuda_error("cuDeviceGet", object(), e.0))?;
        let name = result::device::get_name(dev)
            .map_err(|e| cuda_error("cuDeviceGetName", object(), e.0))?;
        // SAFETY: `dev` is a device handle the driver just gave for an ordinal it counts.
        let total = unsafe { result::device::total_mem(dev) }
            .map_err(|e| cuda_error("cuDeviceTotalMem", object(), e.0))?;
        // SAFETY: as above; the attributes are ones every device reports.
        let get = |a| unsafe { result::device::get_attribute(dev, a) }.ok();
        let pci_bus_id = (|| {
            let domain = get(A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?;
            let bus = get(A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?;
            let slot = get(A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?;
            Some(format!("{domain:04x}:{bus:02x}:{slot:02x}.0"))
        })();
        Ok(crate::Located {
            name: "cuda",
            reason: super::description(&name, device, total),
            pci_bus_id,
        })
    })
}

/// Loads the driver (probing first), checks that `device` exists, retains its primary context
/// and makes it current on the calling thread: the consumer's side of CUDA IPC
/// (`ipc::Imported`), which needs none of the backend's set-up.
pub(super) fn primary_context(device: usize) -> Result<Arc<CudaContext>, BackendError> {
    init_driver()?;
    guarded("Imported::open", || {
        check_device(device)?;
        CudaContext::new(device)
            .map_err(|e| cuda_error("cuDevicePrimaryCtxRetain", format!("device {device}"), e.0))
    })
}

impl CudaBackend {
    /// Loads the driver (probing first), checks that `device` exists and retains its primary
    /// context.
    pub fn new(device: usize) -> Result<Self, BackendError> {
        init_driver()?;
        guarded("CudaBackend::new", || {
            check_device(device)?;
            let object = || format!("device {device}");
            let ctx = CudaContext::new(device)
                .map_err(|e| cuda_error("cuDevicePrimaryCtxRetain", object(), e.0))?;
            // cudarc's event tracking would add a cuStreamWaitEvent and a cuEventRecord to every
            // use of a CudaSlice from a second stream, and wait on those events before each free.
            // pinring orders the uses of its device memory itself (the copy streams, one kernel
            // stream, the device-buffer guard), so it is turned off for this context before any
            // stream or slice exists.
            //
            // SAFETY: `disable_event_tracking` leaves stream ordering of the CudaSlices made
            // after it to us; every CudaSlice of this context (the uploader's device buffers and
            // checksum word, the bench's buffer) is: (1) freed only when no other stream still
            // uses it: the uploader's Drop joins the completion thread (every copy waited for)
            // and drains the kernel stream first, the checksum word is used on its own (kernel)
            // stream only, and the bench's buffer on its own stream only; (2) not used on
            // another stream before its allocation has finished: the uploader synchronizes the
            // copy stream after allocating the buffers; (3) never written by two streams at
            // once where they overlap: the device-buffer guard keeps copies (copy streams) and
            // kernels (kernel stream) over one buffer apart, and the two copy streams write
            // disjoint bytes (each byte of a batch's buffer is the destination of one copy).
            // `CudaBackend::context` documents this for callers.
            unsafe { ctx.disable_event_tracking() };
            let name = ctx
                .name()
                .map_err(|e| cuda_error("cuDeviceGetName", object(), e.0))?;
            let total_mem = ctx
                .total_mem()
                .map_err(|e| cuda_error("cuDeviceTotalMem", object(), e.0))?;
            let sm_count = ctx
                .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
                .map_err(|e| cuda_error("cuDeviceGetAttribute", object(), e.0))?;
            let compute_capability = ctx
                .compute_capability()
                .map_err(|e| cuda_error("cuDeviceGetAttribute", object(), e.0))?;
            Ok(Self {
                ctx,
                device,
                name,
                total_mem,
                sm_count: sm_count.max(1) as u32,
                compute_capability,
                chunks: Arc::new(ChunkTable::default()),
            })
        })
    }
}
