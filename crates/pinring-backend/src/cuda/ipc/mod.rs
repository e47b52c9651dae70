//! CUDA IPC: handing the daemon's device buffers to a training process in another process,
//! without a copy (docs/ARCHITECTURE.md, "Handing device buffers to a training process").
//!
//! Per device buffer the daemon exports, once ([`crate::BufferHandoff::export`]): the memory handle
//! of the buffer's `cuMemAlloc` allocation and the handles of two interprocess events, "ready"
//! (recorded by the daemon on its copy stream after a batch's last copy,
//! [`crate::BufferHandoff::record_ready`]) and "release" (recorded by the consumer on its stream
//! after its last use of the batch, [`Imported::record_release`]; the daemon's copy stream waits
//! on it before the next copy into the buffer, [`crate::BufferHandoff::wait_release`]). So a buffer
//! is never overwritten while the consumer's kernels still read it, and nobody waits on the host.
//! The consumer opens them with [`Imported::open`].
//!
//! | module | what |
//! | --- | --- |
//! | `export` | the daemon's side: the per-buffer handles and events of a `CudaUploader` |
//! | `import` | the consumer's side: [`Imported`] |
//! | `registry` | the handles this process exported and opened, for the clear errors |
//! | `raw` | every raw driver call of CUDA IPC |

mod export;
mod import;
mod raw;
mod registry;

#[cfg(test)]
mod tests;

use cudarc::driver::sys::CUresult;

pub(crate) use export::Exported;
pub use import::Imported;

use crate::cuda::raw::describe;
use crate::error::cuda_error;
use crate::BackendError;

/// The error of a failed CUDA IPC call (`cuIpcGetMemHandle`, `cuIpcOpenMemHandle`,
/// `cuIpcGetEventHandle`, `cuIpcOpenEventHandle`, an interprocess `cuEventCreate`):
/// [`BackendError::IpcUnavailable`] for the codes with which a driver or container runtime
/// refuses IPC, else [`BackendError::Cuda`].
pub(crate) fn ipc_error(call: &'static str, object: String, code: CUresult) -> BackendError {
    if refuses_ipc(code) {
        BackendError::IpcUnavailable {
            call,
            object,
            code,
            description: describe(code),
        }
    } else {
        cuda_error(call, object, code)
    }
}

/// The codes with which a driver, or a container runtime in front of it (gVisor), refuses CUDA
/// IPC calls.
fn refuses_ipc(code: CUresult) -> bool {
    use CUresult::*;
    matches!(
        code,
        CUDA_ERROR_NOT_SUPPORTED
            | CUDA_ERROR_INVALID_VALUE
            | CUDA_ERROR_NOT_PERMITTED
            | CUDA_ERROR_OPERATING_SYSTEM
            | CUDA_ERROR_INVALID_HANDLE
            | CUDA_ERROR_UNKNOWN
    )
}

#[cfg(test)]
mod no_gpu_tests {
    //! What needs no driver: the classification and the messages.

    use super::*;

    #[test]
    fn refusals_say_ipc_is_unavailable_and_point_to_embedded_mode() {
        for code in [
            CUresult::CUDA_ERROR_NOT_SUPPORTED,
            CUresult::CUDA_ERROR_INVALID_VALUE,
            CUresult::CUDA_ERROR_NOT_PERMITTED,
        ] {
            assert!(refuses_ipc(code), "{code:?}");
            let e = BackendError::IpcUnavailable {
                call: "cuIpcGetMemHandle",
                object: "the allocation of device buffer 2 (4096 bytes at 0x7f00) on device 0"
                    .into(),
                code,
                description: "operation not supported".into(),
            };
            let msg = e.to_string();
            assert!(msg.starts_with("cuIpcGetMemHandle failed on"), "{msg}");
            assert!(msg.contains("device buffer 2"), "{msg}");
            assert!(msg.contains("CUDA IPC is unavailable here"), "{msg}");
            assert!(msg.contains("pinring.Loader(..., embedded=True)"), "{msg}");
        }
        assert!(!refuses_ipc(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
        assert!(!refuses_ipc(CUresult::CUDA_ERROR_ALREADY_MAPPED));
        assert!(!refuses_ipc(CUresult::CUDA_ERROR_INVALID_CONTEXT));
    }

    #[test]
    fn opening_own_exports_says_to_use_device_ptr() {
        let msg = BackendError::IpcOwnExport { buffer: 1 }.to_string();
        assert!(msg.contains("device buffer 1"), "{msg}");
        assert!(msg.contains("CopyEngine::device_ptr"), "{msg}");
        assert!(msg.contains("embedded=True"), "{msg}");
    }
}
