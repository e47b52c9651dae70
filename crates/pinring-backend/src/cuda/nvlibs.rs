//! nvJPEG and NVRTC, loaded at run time (`dlopen`) as cudarc loads the driver: the binaries
//! build and run without them, and a machine without them gets an error naming the library,
//! never a panic. Every raw call of either library is here, each behind a safe method whose
//! arguments it checks; the decoder (`decoder.rs`) only sequences them.
//!
//! nvJPEG: `libnvjpeg.so.13`, `.so.12` or `libnvjpeg.so` (the CUDA runtime libraries; PyTorch's
//! wheels ship it too). NVRTC: `libnvrtc.so.13`, `.so.12` or `libnvrtc.so`, for the crop, resize
//! and normalise kernel (`resize.cu`), compiled once per process. cudarc's own NVRTC binding
//! panics when it finds no library and does not look for CUDA 13's name, so it is not used.

use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::ptr;

use libloading::Library;

/// nvJPEG's status codes, named.
fn status_name(s: c_int) -> &'static str {
    match s {
        0 => "NVJPEG_STATUS_SUCCESS",
        1 => "NVJPEG_STATUS_NOT_INITIALIZED",
        2 => "NVJPEG_STATUS_INVALID_PARAMETER",
        3 => "NVJPEG_STATUS_BAD_JPEG",
        4 => "NVJPEG_STATUS_JPEG_NOT_SUPPORTED",
        5 => "NVJPEG_STATUS_ALLOCATOR_FAILURE",
        6 => "NVJPEG_STATUS_EXECUTION_FAILED",
        7 => "NVJPEG_STATUS_ARCH_MISMATCH",
        8 => "NVJPEG_STATUS_INTERNAL_ERROR",
        9 => "NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED",
        10 => "NVJPEG_STATUS_INCOMPLETE_BITSTREAM",
        _ => "an unknown nvJPEG status",
    }
}

/// A failed call of nvJPEG or NVRTC: the call and its status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{call} returned {name} ({code})")]
pub(crate) struct NvError {
    pub(crate) call: &'static str,
    pub(crate) code: i32,
    pub(crate) name: &'static str,
}

fn check(call: &'static str, s: c_int) -> Result<(), NvError> {
    match s {
        0 => Ok(()),
        code => Err(NvError {
            call,
            code,
            name: status_name(code),
        }),
    }
}

/// nvJPEG's `nvjpegImage_t`: up to 4 planes, each a device address and a pitch.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct NvImage {
    pub(crate) channel: [*mut u8; 4],
    pub(crate) pitch: [usize; 4],
}

const _: () = assert!(std::mem::size_of::<NvImage>() == 64);

/// `NVJPEG_BACKEND_HARDWARE`: the GPU's JPEG engine.
pub(crate) const BACKEND_HARDWARE: c_int = 3;
/// `NVJPEG_BACKEND_GPU_HYBRID`: Huffman decoding on the GPU.
pub(crate) const BACKEND_GPU_HYBRID: c_int = 2;
/// `NVJPEG_BACKEND_DEFAULT`.
pub(crate) const BACKEND_DEFAULT: c_int = 0;
/// `NVJPEG_OUTPUT_RGBI`: interleaved RGB, 3 bytes a pixel, one plane.
const OUTPUT_RGBI: c_int = 5;

type Handle = *mut c_void;

struct JpegFns {
    create_ex: unsafe extern "C" fn(c_int, *mut c_void, *mut c_void, c_uint, *mut Handle) -> c_int,
    destroy: unsafe extern "C" fn(Handle) -> c_int,
    state_create: unsafe extern "C" fn(Handle, *mut Handle) -> c_int,
    state_destroy: unsafe extern "C" fn(Handle) -> c_int,
    batched_init: unsafe extern "C" fn(Handle, Handle, c_int, c_int, c_int) -> c_int,
    batched: unsafe extern "C" fn(
        Handle,
        Handle,
        *const *const u8,
        *const usize,
        *mut NvImage,
        *mut c_void,
    ) -> c_int,
}

/// Opens the first of `names` that loads.
const NVJPEG: [&str; 3] = ["libnvjpeg.so.13", "libnvjpeg.so.12", "libnvjpeg.so"];
const NVRTC: [&str; 3] = ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"];

/// Whether nvJPEG and NVRTC load in this process (what the decoder needs beyond the driver).
pub(crate) fn decode_libraries_load() -> bool {
    open(&NVJPEG).is_ok() && open(&NVRTC).is_ok()
}

fn open(names: &[&str]) -> Result<Library, String> {
    let mut last = String::new();
    for n in names {
        // SAFETY: loading runs the library's initialisers; nvJPEG's and NVRTC's only set up
        // their own state (they are the CUDA toolkit's, made to be loaded into any process).
        match unsafe { Library::new(*n) } {
            Ok(l) => return Ok(l),
            Err(e) => last = e.to_string(),
        }
    }
    Err(format!("none of {names:?} loads ({last})"))
}

/// `sym(lib, name)` in its own unsafe block: the field's type, which the caller's struct
/// declares as the function's signature in the library's header, is the `T` it takes.
macro_rules! load {
    ($lib:expr, $name:literal) => {
        // SAFETY: the target's type (a field of `JpegFns` or a typed binding) is the
        // function's C signature in its header (nvjpeg.h, nvrtc.h of CUDA 12 and 13), with
        // handles as opaque pointers, enums as int and cudaStream_t as a pointer.
        unsafe { sym($lib, $name) }
    };
}

/// Looks up `name` as a function of type `T`.
///
/// # Safety
/// `T` must be the symbol's true C signature.
unsafe fn sym<T: Copy>(lib: &Library, name: &str) -> Result<T, String> {
    // SAFETY: the caller names the true signature.
    unsafe { lib.get::<T>(name.as_bytes()) }
        .map(|s| *s)
        .map_err(|e| format!("{name}: {e}"))
}

/// One nvJPEG handle and its batched-decode state, on the backend chosen at [`Nvjpeg::open`].
/// Used by one thread at a time (the decoder's lock).
pub(crate) struct Nvjpeg {
    f: JpegFns,
    handle: Handle,
    batched_state: Handle,
    /// The backend in use ([`BACKEND_HARDWARE`] where the GPU has the engine).
    pub(crate) backend: c_int,
    /// Batch size the batched state was last initialised for.
    batch: c_int,
    _lib: Library,
}

// SAFETY: the handles are used from one thread at a time (the decoder's Mutex); nvJPEG's
// handles are not tied to the thread that made them.
unsafe impl Send for Nvjpeg {}

impl std::fmt::Debug for Nvjpeg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nvjpeg")
            .field("backend", &self.backend)
            .finish()
    }
}

impl Nvjpeg {
    /// Loads nvJPEG and opens the first backend of `backends` that the GPU has (the context
    /// must be current).
    pub(crate) fn open(backends: &[c_int]) -> Result<Nvjpeg, String> {
        let lib = open(&NVJPEG)?;
        let f = JpegFns {
            create_ex: load!(&lib, "nvjpegCreateEx")?,
            destroy: load!(&lib, "nvjpegDestroy")?,
            state_create: load!(&lib, "nvjpegJpegStateCreate")?,
            state_destroy: load!(&lib, "nvjpegJpegStateDestroy")?,
            batched_init: load!(&lib, "nvjpegDecodeBatchedInitialize")?,
            batched: load!(&lib, "nvjpegDecodeBatched")?,
        };
        let mut last = String::new();
        for &backend in backends {
            let mut handle: Handle = ptr::null_mut();
            // SAFETY: null allocators select nvJPEG's defaults; `handle` is an out-parameter.
            let s =
                unsafe { (f.create_ex)(backend, ptr::null_mut(), ptr::null_mut(), 0, &mut handle) };
            if let Err(e) = check("nvjpegCreateEx", s) {
                last = e.to_string();
                continue;
            }
            let mut n = Nvjpeg {
                f,
                handle,
                batched_state: ptr::null_mut(),
                backend,
                batch: 0,
                _lib: lib,
            };
            // The handle is live; each out-parameter below is a field of `n`, which Drop
            // destroys when non-null.
            // SAFETY: see above.
            let s = unsafe { (n.f.state_create)(n.handle, &mut n.batched_state) };
            check("nvjpegJpegStateCreate", s).map_err(|e| e.to_string())?;
            return Ok(n);
        }
        Err(format!("no nvJPEG backend of {backends:?} opens: {last}"))
    }

    /// Decodes `images` (host bitstreams) into `out` (interleaved RGB, one plane each) on
    /// `stream`, as one batch.
    ///
    /// # Safety
    /// Every bitstream stays valid and unwritten, and every destination plane (pitch × height
    /// bytes) stays allocated, until the work queued on `stream` has completed; `stream` is a
    /// live stream of the current context.
    pub(crate) unsafe fn decode_batched(
        &mut self,
        images: &[&[u8]],
        out: &mut [NvImage],
        stream: *mut c_void,
    ) -> Result<(), NvError> {
        assert_eq!(images.len(), out.len());
        let n = c_int::try_from(images.len()).unwrap_or(c_int::MAX);
        if n != self.batch {
            // SAFETY: handle and state are live.
            let s = unsafe {
                (self.f.batched_init)(self.handle, self.batched_state, n, 1, OUTPUT_RGBI)
            };
            check("nvjpegDecodeBatchedInitialize", s)?;
            self.batch = n;
        }
        let ptrs: Vec<*const u8> = images.iter().map(|d| d.as_ptr()).collect();
        let lens: Vec<usize> = images.iter().map(|d| d.len()).collect();
        // SAFETY: the arrays have `n` entries each; the caller keeps the bitstreams and the
        // planes alive until the stream has run the decode.
        let s = unsafe {
            (self.f.batched)(
                self.handle,
                self.batched_state,
                ptrs.as_ptr(),
                lens.as_ptr(),
                out.as_mut_ptr(),
                stream,
            )
        };
        check("nvjpegDecodeBatched", s)
    }
}

impl Drop for Nvjpeg {
    fn drop(&mut self) {
        // Each handle was created by this object and is destroyed once, here; the owner has
        // synchronised the stream their work ran on first.
        for st in [self.batched_state] {
            if !st.is_null() {
                // SAFETY: see above.
                unsafe { (self.f.state_destroy)(st) };
            }
        }
        // SAFETY: see above; the states made from the handle are gone.
        unsafe { (self.f.destroy)(self.handle) };
    }
}

type Prog = *mut c_void;

/// NVRTC's calls that [`compile_ptx`] makes.
struct RtcFns {
    create: unsafe extern "C" fn(
        *mut Prog,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> c_int,
    compile: unsafe extern "C" fn(Prog, c_int, *const *const c_char) -> c_int,
    log_size: unsafe extern "C" fn(Prog, *mut usize) -> c_int,
    log: unsafe extern "C" fn(Prog, *mut c_char) -> c_int,
    ptx_size: unsafe extern "C" fn(Prog, *mut usize) -> c_int,
    ptx: unsafe extern "C" fn(Prog, *mut c_char) -> c_int,
    destroy: unsafe extern "C" fn(*mut Prog) -> c_int,
}

/// A program's log or PTX: `size` then `get` into a buffer of that size.
fn text(
    prog: Prog,
    size: unsafe extern "C" fn(Prog, *mut usize) -> c_int,
    get: unsafe extern "C" fn(Prog, *mut c_char) -> c_int,
) -> String {
    let mut n = 0usize;
    // SAFETY: `prog` is a live program; `n` is an out-parameter.
    unsafe { size(prog, &mut n) };
    let mut buf = vec![0 as c_char; n.max(1)];
    // SAFETY: the buffer holds the `n` bytes NVRTC said it writes (at least 1).
    unsafe { get(prog, buf.as_mut_ptr()) };
    let last = buf.len() - 1;
    buf[last] = 0;
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Compiles CUDA C `src` to PTX for `arch` (`"compute_80"`) with NVRTC.
pub(crate) fn compile_ptx(src: &str, name: &str, arch: &str) -> Result<String, String> {
    let lib = open(&NVRTC)?;
    let f = RtcFns {
        create: load!(&lib, "nvrtcCreateProgram")?,
        compile: load!(&lib, "nvrtcCompileProgram")?,
        log_size: load!(&lib, "nvrtcGetProgramLogSize")?,
        log: load!(&lib, "nvrtcGetProgramLog")?,
        ptx_size: load!(&lib, "nvrtcGetPTXSize")?,
        ptx: load!(&lib, "nvrtcGetPTX")?,
        destroy: load!(&lib, "nvrtcDestroyProgram")?,
    };
    let src = CString::new(src).map_err(|e| e.to_string())?;
    let name = CString::new(name).map_err(|e| e.to_string())?;
    let arch = CString::new(format!("--gpu-architecture={arch}")).map_err(|e| e.to_string())?;
    // No fused multiply-adds: the kernels' f64 arithmetic is the CPU path's, rounding included.
    let fmad = c"--fmad=false";
    let opts = [arch.as_ptr(), fmad.as_ptr()];
    let mut prog: Prog = ptr::null_mut();
    // SAFETY: the strings outlive the call; no headers; `prog` is an out-parameter, destroyed
    // below.
    let made = unsafe {
        (f.create)(
            &mut prog,
            src.as_ptr(),
            name.as_ptr(),
            0,
            ptr::null(),
            ptr::null(),
        )
    };
    if made != 0 {
        return Err(format!("nvrtcCreateProgram returned {made}"));
    }
    // SAFETY: `prog` is live; two option strings, alive for the call.
    let compiled = unsafe { (f.compile)(prog, opts.len() as i32, opts.as_ptr()) };
    let result = if compiled != 0 {
        Err(format!(
            "NVRTC could not compile it ({compiled}): {}",
            text(prog, f.log_size, f.log)
        ))
    } else {
        Ok(text(prog, f.ptx_size, f.ptx))
    };
    // SAFETY: `prog` is live and destroyed once.
    unsafe { (f.destroy)(&mut prog) };
    result
}
