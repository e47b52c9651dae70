//! The one error type of this crate, [`BackendError`].
//!
//! Every message says which call failed, on what (device index, address range, sizes) and what
//! the operator can do about it. CUDA driver result codes are turned into text when the error is
//! created (the driver library is loaded by then), so formatting an error never calls into
//! `libcuda`.

use cudarc::driver::sys::CUresult;

/// How the errors of finding a GPU ([`crate::locate`], [`crate::select`]) end for the binaries:
/// the host backend, by its flag. [`BackendError::without_host_flag`] leaves it out for callers
/// that name the host backend in their own terms (Python's `backend="host"`, `device="cpu"`).
const OR_HOST_FLAG: &str = "or use --backend host";

/// Everything that can go wrong in a backend.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// `libcuda.so.1` (or another name cudarc searches for) could not be loaded.
    #[error(
        "no NVIDIA driver found (libcuda.so.1 could not be loaded): install the NVIDIA driver \
         (and make libcuda.so.1 visible to the dynamic loader, e.g. via LD_LIBRARY_PATH) \
         {or_host}",
        or_host = OR_HOST_FLAG
    )]
    NoDriver,

    /// The driver library loaded but `cuInit(0)` failed.
    #[error(
        "cuInit(0) failed: {code:?} ({description}): the NVIDIA driver library loaded but the \
         driver is not usable (check `nvidia-smi`, permissions on /dev/nvidia*, that the kernel \
         module matches libcuda, and CUDA_VISIBLE_DEVICES), {or_host}",
        or_host = OR_HOST_FLAG
    )]
    InitFailed {
        /// The driver's result code.
        code: CUresult,
        /// The driver's text for `code`.
        description: String,
    },

    /// The requested device index is not among the visible devices.
    #[error(
        "CUDA device {device} does not exist: the driver reports {count} visible device(s) \
         (check the device number and CUDA_VISIBLE_DEVICES), {or_host}",
        or_host = OR_HOST_FLAG
    )]
    NoSuchDevice {
        /// The requested device index.
        device: usize,
        /// How many devices the driver reports.
        count: usize,
    },

    /// A CUDA driver call returned an error.
    #[error("{call} failed on {object}: {code:?} ({description}); {hint}")]
    Cuda {
        /// The driver function that failed, e.g. `"cuMemHostRegister"`.
        call: &'static str,
        /// What it was called on, e.g. `"1073741824 bytes at 0x7f..."` or `"device 0"`.
        object: String,
        /// The driver's result code.
        code: CUresult,
        /// The driver's text for `code`.
        description: String,
        /// What to do about it.
        hint: &'static str,
    },

    /// The CUDA driver panicked inside cudarc (e.g. a missing symbol in an old `libcuda`).
    #[error(
        "the CUDA driver wrapper panicked in {call}: {message}: the installed driver is probably \
         too old for this build (needs a CUDA 12.8 capable driver); update it or use --backend host"
    )]
    DriverPanic {
        /// What was being done.
        call: &'static str,
        /// The panic message.
        message: String,
    },

    /// An argument was out of range (buffer index, length, address range).
    #[error("invalid argument to {call}: {what}")]
    InvalidArgument {
        /// The operation that was called.
        call: &'static str,
        /// What was wrong, with the offending values.
        what: String,
    },

    /// The buffer still has uploads in flight.
    #[error(
        "{call} on device buffer {buffer}: {pending} upload(s) into it have not completed yet; \
         wait for their Completion before using the buffer"
    )]
    BufferBusy {
        /// The operation that was called.
        call: &'static str,
        /// The buffer index.
        buffer: usize,
        /// Uploads into it still in flight.
        pending: usize,
    },

    /// The uploader's background thread is gone (it panicked or the uploader is shutting down).
    #[error(
        "the {backend} upload thread has stopped, so {call} cannot proceed: this is a bug or an \
         earlier fatal error (see the log); restart the daemon"
    )]
    WorkerGone {
        /// `"host"` or `"cuda"`.
        backend: &'static str,
        /// The operation that was called.
        call: &'static str,
    },

    /// A host allocation failed.
    #[error(
        "allocating {bytes} bytes of page-aligned host memory for {what} failed: reduce the \
         buffer count/size or free memory"
    )]
    HostAlloc {
        /// Requested size.
        bytes: usize,
        /// What the memory was for.
        what: &'static str,
    },

    /// A string did not name a backend.
    #[error("unknown backend {0:?}: expected one of auto, cuda, host")]
    UnknownBackend(String),

    /// The driver refused a CUDA IPC call in a way that means IPC does not work here (some
    /// container runtimes, gVisor among them, refuse it).
    #[error(
        "{call} failed on {object}: {code:?} ({description}); CUDA IPC is unavailable here \
         (some container runtimes, gVisor among them, refuse it; a handle that is not a live \
         export, e.g. of a daemon that has exited, is refused the same way): run the upload \
         inside the training process instead: pinring.Loader(..., embedded=True)"
    )]
    IpcUnavailable {
        /// The driver function that failed, e.g. `"cuIpcGetMemHandle"`.
        call: &'static str,
        /// What it was called on (names the device buffer).
        object: String,
        /// The driver's result code.
        code: CUresult,
        /// The driver's text for `code`.
        description: String,
    },

    /// A device buffer's CUDA IPC memory handle is already open in this process.
    #[error(
        "cuIpcOpenMemHandle refused for device buffer {buffer} on device {device}: its CUDA IPC \
         handle is already open in this process (legacy CUDA IPC handles can be opened once per \
         process and device): share the one cuda::ipc::Imported of these buffers (one \
         pinring.Loader per training process), or drop it before opening them again"
    )]
    IpcAlreadyOpen {
        /// Index of the buffer in the exports passed to `Imported::open`.
        buffer: usize,
        /// The device ordinal it was opened on.
        device: usize,
    },

    /// A process tried to open CUDA IPC handles it exported itself.
    #[error(
        "cuIpcOpenMemHandle not attempted for device buffer {buffer}: it was exported by this \
         process, and a process cannot open its own CUDA IPC handles: in the process that \
         uploads, use CopyEngine::device_ptr (embedded mode: pinring.Loader(..., embedded=True))"
    )]
    IpcOwnExport {
        /// Index of the buffer in the exports passed to `Imported::open`.
        buffer: usize,
    },
}

impl BackendError {
    /// A short phrase for the reason `--backend auto` fell back to the host backend.
    pub fn fallback_reason(&self) -> String {
        match self {
            BackendError::NoDriver => "no NVIDIA driver found (libcuda.so.1 not loadable)".into(),
            BackendError::InitFailed { code, .. } => {
                format!("NVIDIA driver present but cuInit failed ({code:?})")
            }
            BackendError::NoSuchDevice { device, count } => {
                format!("CUDA device {device} not found ({count} visible)")
            }
            other => other.to_string(),
        }
    }
}

/// Builds [`BackendError::Cuda`] for a failed driver call (only after the driver is loaded:
/// it asks the driver for the code's description).
pub(crate) fn cuda_error(call: &'static str, object: String, code: CUresult) -> BackendError {
    BackendError::Cuda {
        call,
        object,
        code,
        description: crate::cuda::describe(code),
        hint: hint(call, code),
    }
}

fn hint(call: &'static str, code: CUresult) -> &'static str {
    use CUresult::*;
    match (call, code) {
        ("cuMemHostRegister", CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED) => {
            "the range (or part of it) is already registered in this process: register the ring once"
        }
        ("cuMemHostRegister", CUDA_ERROR_OUT_OF_MEMORY) => {
            "the driver could not pin these pages: check free host RAM, that the whole range is \
             mapped and prefaulted, and the locked-memory limit (ulimit -l / container limits); \
             or use a smaller ring"
        }
        ("cuMemHostRegister", CUDA_ERROR_NOT_PERMITTED | CUDA_ERROR_NOT_SUPPORTED) => {
            "this kind of mapping cannot be pinned here (check the shared-memory backing and that \
             it is mapped read-write); use --backend host to run without pinning"
        }
        ("cuMemHostRegister", CUDA_ERROR_INVALID_VALUE) => {
            "the driver rejected the address range or flags: the range must be a mapped, \
             read-write region of this process"
        }
        ("cuMemAlloc" | "cuMemAllocAsync", CUDA_ERROR_OUT_OF_MEMORY) => {
            "not enough free device memory: use fewer or smaller device buffers"
        }
        ("cuModuleLoadData" | "cuModuleGetFunction", _) => {
            "the driver rejected pinring's embedded PTX kernels: this is a bug in pinring-backend \
             (report it with the JIT log above); uploads still work, only checksum/compute sinks fail"
        }
        ("cuMemcpyHtoDAsync", CUDA_ERROR_INVALID_VALUE) => {
            "the driver rejected the source range: it must be ordinary mapped memory or lie within \
             one registered range (copies are split at the chunks registered through this backend)"
        }
        ("cuMemHostGetDevicePointer", _) => {
            "the address must lie in a range registered with devicemap=true"
        }
        ("cuIpcOpenMemHandle" | "cuIpcOpenEventHandle", CUDA_ERROR_INVALID_CONTEXT | CUDA_ERROR_INVALID_DEVICE) => {
            "open the handles on the device the buffers live on (CUDA_VISIBLE_DEVICES may number \
             it differently in each process), in another process than the one that exported \
             them; in the exporting process use CopyEngine::device_ptr (embedded mode)"
        }
        ("cuStreamWaitEvent" | "cuEventRecord", CUDA_ERROR_INVALID_HANDLE | CUDA_ERROR_INVALID_CONTEXT) => {
            "the stream must be 0 (the legacy default stream) or a stream of the device's primary \
             context, e.g. torch.cuda.current_stream(device).cuda_stream"
        }
        (
            _,
            CUDA_ERROR_ILLEGAL_ADDRESS
            | CUDA_ERROR_LAUNCH_FAILED
            | CUDA_ERROR_ILLEGAL_INSTRUCTION
            | CUDA_ERROR_MISALIGNED_ADDRESS
            | CUDA_ERROR_HARDWARE_STACK_ERROR
            | CUDA_ERROR_ECC_UNCORRECTABLE,
        ) => "the CUDA context is broken by an earlier device fault: restart the daemon",
        _ => "check the GPU and driver with nvidia-smi; if it persists, use --backend host",
    }
}

impl BackendError {
    /// The message of an error of finding a GPU (no driver, a driver that does not start, no
    /// such device) with its own remedy but without the binaries' last resort, "or use
    /// --backend host": the caller adds the host backend as its users name it. None for the
    /// other errors.
    pub fn without_host_flag(&self) -> Option<String> {
        match self {
            BackendError::NoDriver
            | BackendError::InitFailed { .. }
            | BackendError::NoSuchDevice { .. } => {
                let text = self.to_string();
                let cut = text.strip_suffix(OR_HOST_FLAG)?;
                Some(cut.trim_end_matches([',', ' ']).to_string())
            }
            _ => None,
        }
    }
}

impl pinring_exit::Coded for BackendError {
    fn exit(&self) -> pinring_exit::Exit {
        pinring_exit::Exit::Backend
    }
}
