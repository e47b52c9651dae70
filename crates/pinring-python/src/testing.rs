//! Test support, for python/tests: a field over a Rust `Vec` whose owner counts its drops and
//! records the streams `__dlpack__` passed it, so tests can watch the owner's lifetime through
//! NumPy and PyTorch.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::field::{parse_dtype, Device, Field, FieldOwner};

/// What the tests observe of an owner.
#[derive(Debug, Default)]
struct Observed {
    drops: AtomicUsize,
    streams: Mutex<Vec<Option<usize>>>,
    /// The next `prepare_for_stream` fails with this message.
    fail_next: Mutex<Option<String>>,
}

/// Host memory for a test field: 8-byte words, so every dtype is aligned.
#[derive(Debug)]
struct VecOwner {
    words: Vec<u64>,
    observed: Arc<Observed>,
}

impl Drop for VecOwner {
    fn drop(&mut self) {
        self.observed.drops.fetch_add(1, Ordering::SeqCst);
    }
}

impl FieldOwner for VecOwner {
    fn prepare_for_stream(&self, stream: Option<usize>) -> Result<(), String> {
        let mut streams = self
            .observed
            .streams
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        streams.push(stream);
        let mut fail = self
            .observed
            .fail_next
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match fail.take() {
            Some(message) => Err(message),
            None => Ok(()),
        }
    }
}

/// A test field's owner, seen from Python.
#[pyclass(module = "pinring._native", name = "OwnerProbe", frozen)]
#[derive(Debug)]
pub struct OwnerProbe {
    observed: Arc<Observed>,
}

#[pymethods]
impl OwnerProbe {
    /// How many times the owner was dropped (0 or 1).
    #[getter]
    fn drops(&self) -> usize {
        self.observed.drops.load(Ordering::SeqCst)
    }

    /// The streams `prepare_for_stream` was called with, in order (`None` for no stream).
    #[getter]
    fn streams(&self) -> Vec<Option<usize>> {
        self.observed
            .streams
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Makes the next `prepare_for_stream` fail with `message`.
    fn fail_next_prepare(&self, message: String) {
        *self
            .observed
            .fail_next
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(message);
    }
}

/// `_test_host_field(data, dtype, shape, readonly=False)`: a host field over a copy of `data`
/// (the raw bytes of the elements) in a Rust `Vec`, and the probe of its owner.
#[pyfunction]
#[pyo3(name = "_test_host_field", signature = (data, dtype, shape, readonly = false))]
pub fn test_host_field(
    data: &[u8],
    dtype: &str,
    shape: Vec<usize>,
    readonly: bool,
) -> PyResult<(Field, OwnerProbe)> {
    let dtype = parse_dtype(dtype)?;
    let elements: usize = shape.iter().product();
    if elements.checked_mul(dtype.size_of()) != Some(data.len()) {
        return Err(PyValueError::new_err(format!(
            "{} bytes of data for shape {shape:?} of {dtype}",
            data.len()
        )));
    }
    let mut words = vec![0u64; data.len().div_ceil(8)];
    for (word, chunk) in words.iter_mut().zip(data.chunks(8)) {
        let mut bytes = [0u8; 8];
        bytes[..chunk.len()].copy_from_slice(chunk);
        // The words hold the bytes in memory order.
        *word = u64::from_ne_bytes(bytes);
    }
    let observed = Arc::new(Observed::default());
    let mut owner = VecOwner {
        words,
        observed: Arc::clone(&observed),
    };
    let addr = owner.words.as_mut_ptr().cast();
    let owner: Arc<dyn FieldOwner> = Arc::new(owner);
    // SAFETY: `addr` is the heap buffer of the owner's `Vec<u64>`: `data.len()` bytes (the
    // shape's elements times the dtype's size, checked above), aligned to 8, which fits every
    // dtype. Moving the `Vec` into the `Arc` does not move its buffer, nothing resizes or
    // writes it after this, and it is freed only when the owner is dropped, after the field and
    // every capsule made from it.
    let field = unsafe { Field::new(addr, dtype, &shape, Device::Cpu, owner)? };
    Ok((field.with_readonly(readonly), OwnerProbe { observed }))
}

/// `_test_load_config(path)`: loads a config file as the binaries do and returns its source
/// name; errors arrive as pinring's exceptions (`ConfigError`), through [`crate::OrRaise`].
#[pyfunction]
#[pyo3(name = "_test_load_config")]
pub fn test_load_config(path: std::path::PathBuf) -> PyResult<String> {
    use crate::errors::OrRaise;
    let config = pinring_data::Config::load(&path).or_raise()?;
    Ok(config.source)
}

/// `_test_check_ring_name(name)`: checks a ring name; an invalid one raises `RingError`.
#[pyfunction]
#[pyo3(name = "_test_check_ring_name")]
pub fn test_check_ring_name(name: &str) -> PyResult<()> {
    use crate::errors::OrRaise;
    pinring_ring::segment::validate_name(name).or_raise()
}
