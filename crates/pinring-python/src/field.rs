//! [`Field`]: one array of a batch (on the host or on a GPU), exported to NumPy, PyTorch and any
//! other DLPack consumer without a copy.
//!
//! A field is an address, a dtype, a shape and a device, plus an *owner*: whatever keeps the
//! memory valid (a device buffer the daemon must not reuse yet, a host allocation). Every
//! DLPack capsule made from the field holds its own reference to the owner, so the memory stays
//! valid until the field and every array or tensor made from it are gone, in whatever order that
//! happens.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use pinring_data::Dtype;
use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::dlpack::{self, DLDataType, DLDevice, Export};

/// Most dimensions a field may have (NumPy's own limit).
pub const MAX_NDIM: usize = 64;

/// What keeps a field's memory valid, and what a DLPack consumer's stream has to wait for.
///
/// The field and every capsule made from it hold an `Arc` of the owner; it is dropped when the
/// last of them is gone, which may be on any thread and without the GIL (a consumer calls a
/// DLPack deleter wherever it frees its tensor). Its `Drop` must not need the GIL.
pub trait FieldOwner: Any + Send + Sync {
    /// Called by `__dlpack__` before the capsule is made, with the consumer's stream as DLPack
    /// passes it: `None` when the consumer gave none (for CUDA: the legacy default stream, per
    /// the DLPack specification), `Some(s)` for stream handle `s` (for CUDA, 1 is the legacy
    /// default stream, 2 the per-thread default stream, anything else a `cudaStream_t`). Not
    /// called for stream -1, by which a consumer asks for no synchronisation.
    ///
    /// A CUDA owner makes the stream wait for the data (an event recorded after the upload,
    /// `cuStreamWaitEvent`); an owner of host memory has nothing to do (the default). An error
    /// is raised to the consumer as `BufferError`, and no capsule is made.
    fn prepare_for_stream(&self, stream: Option<usize>) -> Result<(), String> {
        let _ = stream;
        Ok(())
    }
}

/// An owner that only keeps a value alive (host memory: a `Vec`, a mapping): no stream work.
#[derive(Debug)]
pub struct KeepAlive<T>(pub T);

impl<T: Send + Sync + 'static> FieldOwner for KeepAlive<T> {}

/// Where a field's memory is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    /// Host memory the CPU can read (DLPack `kDLCPU`).
    Cpu,
    /// Device memory of the CUDA device with this ordinal (DLPack `kDLCUDA`).
    Cuda(u32),
}

impl Device {
    /// DLPack's `(device_type, device_id)`.
    pub fn dlpack(self) -> (i32, i32) {
        match self {
            Device::Cpu => (dlpack::DEVICE_CPU, 0),
            // Ordinals are small: a u32 that does not fit an i32 is no device.
            Device::Cuda(n) => (dlpack::DEVICE_CUDA, i32::try_from(n).unwrap_or(i32::MAX)),
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// DLPack's description of a pinring dtype.
pub fn dl_dtype(dtype: Dtype) -> DLDataType {
    let code = match dtype {
        Dtype::U8 | Dtype::U16 | Dtype::U32 | Dtype::U64 => dlpack::CODE_UINT,
        Dtype::I8 | Dtype::I16 | Dtype::I32 | Dtype::I64 => dlpack::CODE_INT,
        Dtype::Bool => dlpack::CODE_BOOL,
        Dtype::F16 | Dtype::F32 | Dtype::F64 => dlpack::CODE_FLOAT,
        Dtype::Bf16 => dlpack::CODE_BFLOAT,
    };
    DLDataType {
        code,
        // At most 8 bytes: 64 bits.
        bits: (dtype.size_of() * 8) as u8,
        lanes: 1,
    }
}

/// Parses a dtype by the name config files use (`"u8"`, `"bf16"`, ...).
pub fn parse_dtype(name: &str) -> PyResult<Dtype> {
    Dtype::ALL
        .into_iter()
        .find(|d| d.name() == name)
        .ok_or_else(|| {
            let names: Vec<&str> = Dtype::ALL.iter().map(|d| d.name()).collect();
            PyValueError::new_err(format!(
                "unknown dtype {name:?}: expected one of {}",
                names.join(", ")
            ))
        })
}

/// One C-contiguous array of a batch, exported through DLPack (`__dlpack__`,
/// `__dlpack_device__`), so `numpy.from_dlpack(f)` and `torch.from_dlpack(f)` see its memory
/// without a copy.
#[pyclass(module = "pinring", name = "Field", frozen)]
pub struct Field {
    /// The first element's address. Kept as an integer: this crate only hands it to DLPack
    /// consumers and never reads through it.
    addr: usize,
    dtype: Dtype,
    shape: Box<[i64]>,
    device: Device,
    readonly: bool,
    owner: Arc<dyn FieldOwner>,
}

impl fmt::Debug for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Field")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .field("device", &self.device)
            .field("readonly", &self.readonly)
            .finish_non_exhaustive()
    }
}

impl Field {
    /// A field over `shape` elements of `dtype` at `data` on `device`, kept valid by `owner`.
    /// Writable by consumers unless [`Field::with_readonly`] says otherwise. Fails (ValueError)
    /// for more than [`MAX_NDIM`] dimensions or a size that overflows, and for a null `data`
    /// with a non-empty shape.
    ///
    /// # Safety
    ///
    /// `data` must be the address of `shape.iter().product::<usize>() * dtype.size_of()` bytes
    /// of C-contiguous memory on `device`, aligned for `dtype`, that stay allocated, are not
    /// reused for anything else, and are written by nobody but DLPack consumers of this field,
    /// for as long as `owner` is alive (the field and every capsule hold a reference to it).
    /// Consumers (NumPy, PyTorch) read and write it from safe code.
    pub unsafe fn new(
        data: *mut std::ffi::c_void,
        dtype: Dtype,
        shape: &[usize],
        device: Device,
        owner: Arc<dyn FieldOwner>,
    ) -> PyResult<Field> {
        if shape.len() > MAX_NDIM {
            return Err(PyValueError::new_err(format!(
                "a field has at most {MAX_NDIM} dimensions, not {}",
                shape.len()
            )));
        }
        let elements = shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .filter(|n| {
                n.checked_mul(dtype.size_of())
                    .is_some_and(|b| b <= isize::MAX as usize)
            })
            .ok_or_else(|| {
                PyValueError::new_err(format!("shape {shape:?} of {dtype} is too large"))
            })?;
        if data.is_null() && elements > 0 {
            return Err(PyValueError::new_err(
                "a non-empty field needs a non-null address",
            ));
        }
        let shape = shape
            .iter()
            // Each extent is at most the element count, which fits an isize (checked above).
            .map(|&d| d as i64)
            .collect();
        Ok(Field {
            addr: data as usize,
            dtype,
            shape,
            device,
            readonly: false,
            owner,
        })
    }

    /// Marks the field read-only for consumers (DLPack 1.x's read-only flag; legacy capsules
    /// carry no such flag).
    pub fn with_readonly(mut self, readonly: bool) -> Field {
        self.readonly = readonly;
        self
    }

    /// The element type.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// The extents.
    pub fn shape(&self) -> &[i64] {
        &self.shape
    }

    /// Where the memory is.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Whether consumers are told not to write.
    pub fn readonly(&self) -> bool {
        self.readonly
    }

    /// The number of bytes.
    pub fn nbytes(&self) -> usize {
        self.elements() * self.dtype.size_of()
    }

    /// The owner, shared with every capsule made from the field.
    pub fn owner(&self) -> &Arc<dyn FieldOwner> {
        &self.owner
    }

    fn elements(&self) -> usize {
        // Checked against overflow in `new`.
        self.shape.iter().map(|&d| d as usize).product()
    }

    /// C-contiguous strides, in elements.
    fn strides(&self) -> Box<[i64]> {
        let mut strides = vec![0i64; self.shape.len()];
        let mut step = 1i64;
        for (s, &d) in strides.iter_mut().zip(self.shape.iter()).rev() {
            *s = step;
            step = step.saturating_mul(d.max(1));
        }
        strides.into_boxed_slice()
    }

    /// The stream argument of `__dlpack__`, checked against the DLPack specification for this
    /// device. `Ok(None)` with `sync == false` is stream -1: no synchronisation asked for.
    fn stream_arg(&self, stream: Option<&Bound<'_, PyAny>>) -> PyResult<(bool, Option<usize>)> {
        let Some(stream) = stream.filter(|s| !s.is_none()) else {
            return Ok((true, None));
        };
        let value: i64 = stream.extract().map_err(|_| {
            PyTypeError::new_err(format!(
                "__dlpack__: stream must be an int or None, not {}",
                stream
                    .get_type()
                    .name()
                    .map_or_else(|_| "?".into(), |n| n.to_string())
            ))
        })?;
        match (value, self.device) {
            (-1, _) => Ok((false, None)),
            (0, Device::Cuda(_)) => Err(PyBufferError::new_err(
                "__dlpack__: stream 0 is ambiguous for CUDA (DLPack): pass 1 for the legacy \
                 default stream, 2 for the per-thread default stream, or the stream's handle",
            )),
            (v, _) if v < 0 => Err(PyBufferError::new_err(format!(
                "__dlpack__: stream {v} is not a stream (use -1 for no synchronisation)"
            ))),
            // Non-negative, so it fits.
            (v, _) => Ok((true, Some(v as usize))),
        }
    }
}

#[pymethods]
impl Field {
    /// Exports the field as a DLPack capsule (the Python array API's `__dlpack__`).
    #[pyo3(signature = (stream=None, *, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<&Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let here = self.device.dlpack();
        if let Some(asked) = dl_device {
            if asked != here {
                return Err(PyBufferError::new_err(format!(
                    "__dlpack__: field is on {} {here:?}, cannot export it to device {asked:?} \
                     (pinring fields are never copied)",
                    self.device
                )));
            }
        }
        if copy == Some(true) {
            return Err(PyBufferError::new_err(
                "__dlpack__: copy=True is not supported: pinring fields are exported without a \
                 copy (copy the array or tensor after importing it)",
            ));
        }
        let (sync, stream) = self.stream_arg(stream)?;
        if sync {
            self.owner
                .prepare_for_stream(stream)
                .map_err(|e| PyBufferError::new_err(format!("__dlpack__: {e}")))?;
        }
        let (device_type, device_id) = here;
        let export = Export {
            data: self.addr,
            device: DLDevice {
                device_type,
                device_id,
            },
            dtype: dl_dtype(self.dtype),
            shape: self.shape.clone(),
            strides: self.strides(),
            flags: if self.readonly {
                dlpack::FLAG_READ_ONLY
            } else {
                0
            },
            owner: Arc::clone(&self.owner),
        };
        // A consumer that names no version (or an older one) gets the legacy struct, as the
        // specification asks.
        let versioned = max_version.is_some_and(|(major, _)| major >= dlpack::DLPACK_MAJOR);
        dlpack::capsule(py, export, versioned)
    }

    /// DLPack's `(device_type, device_id)`: `(1, 0)` for the host, `(2, n)` for CUDA device `n`.
    fn __dlpack_device__(&self) -> (i32, i32) {
        self.device.dlpack()
    }

    /// The field as a NumPy array over the same memory (host fields only).
    fn numpy<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let device = slf.get().device;
        if device != Device::Cpu {
            return Err(PyTypeError::new_err(format!(
                "field is on {device}: NumPy reads host memory only; use torch.from_dlpack \
                 (or copy it to the host first)"
            )));
        }
        let numpy = slf.py().import("numpy")?;
        numpy.call_method1("from_dlpack", (slf,))
    }

    /// The extents, as a tuple.
    #[getter(shape)]
    fn py_shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.shape.iter())
    }

    /// The element type by pinring's name: `"u8"`, `"i32"`, `"i64"`, `"f16"`, `"bf16"`, `"f32"`,
    /// `"f64"`.
    #[getter(dtype)]
    fn py_dtype(&self) -> &'static str {
        self.dtype.name()
    }

    /// `"cpu"` or `"cuda:N"`.
    #[getter(device)]
    fn py_device(&self) -> String {
        self.device.to_string()
    }

    /// Size in bytes.
    #[getter(nbytes)]
    fn py_nbytes(&self) -> usize {
        self.nbytes()
    }

    /// Whether DLPack consumers are told not to write.
    #[getter(readonly)]
    fn py_readonly(&self) -> bool {
        self.readonly
    }

    fn __repr__(&self) -> String {
        let dims: Vec<String> = self.shape.iter().map(|d| d.to_string()).collect();
        format!(
            "Field(shape=({}{}), dtype='{}', device='{}')",
            dims.join(", "),
            if dims.len() == 1 { "," } else { "" },
            self.dtype,
            self.device
        )
    }
}
