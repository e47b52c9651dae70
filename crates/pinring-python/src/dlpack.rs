//! The DLPack ABI (dlpack.h, version 1.x), written out by hand: the handful of `#[repr(C)]`
//! structs a producer fills in, checked against the header's layout at compile time, and the
//! two capsule flavours (`"dltensor"` with `DLManagedTensor`, `"dltensor_versioned"` with
//! `DLManagedTensorVersioned`) with their deleters.
//!
//! Ownership follows the DLPack Python specification: the capsule owns the managed tensor until
//! a consumer takes it, which it shows by renaming the capsule to `"used_dltensor"` (or
//! `"used_dltensor_versioned"`); from then on the consumer calls the tensor's `deleter` exactly
//! once, from any thread, when it is done. A capsule that is still called `"dltensor"` when
//! Python frees it was never consumed, and its destructor calls the deleter itself.

use std::ffi::{c_void, CStr};
use std::mem::{offset_of, size_of};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use pyo3::ffi;
use pyo3::prelude::*;

use crate::field::FieldOwner;

/// Highest DLPack version this producer speaks (the versioned structs below are 1.x's).
pub const DLPACK_MAJOR: u32 = 1;
/// Minor version reported in versioned capsules.
pub const DLPACK_MINOR: u32 = 0;

/// Capsule name of an unconsumed legacy tensor.
pub const LEGACY_NAME: &CStr = c"dltensor";
/// Capsule name of an unconsumed versioned tensor.
pub const VERSIONED_NAME: &CStr = c"dltensor_versioned";

/// `DLDeviceType::kDLCPU`.
pub const DEVICE_CPU: i32 = 1;
/// `DLDeviceType::kDLCUDA`.
pub const DEVICE_CUDA: i32 = 2;

/// `DLDataTypeCode::kDLInt`.
pub const CODE_INT: u8 = 0;
/// `DLDataTypeCode::kDLUInt`.
pub const CODE_UINT: u8 = 1;
/// `DLDataTypeCode::kDLFloat`.
pub const CODE_FLOAT: u8 = 2;
/// `DLDataTypeCode::kDLBfloat`.
pub const CODE_BFLOAT: u8 = 4;
/// `kDLBool`.
pub const CODE_BOOL: u8 = 6;

/// `DLPACK_FLAG_BITMASK_READ_ONLY`: the consumer must not write the data.
pub const FLAG_READ_ONLY: u64 = 1 << 0;

/// `DLPackVersion`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DLPackVersion {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

/// `DLDevice`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DLDevice {
    /// `DLDeviceType` (an `int` enum in C).
    pub device_type: i32,
    /// Device ordinal.
    pub device_id: i32,
}

/// `DLDataType`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DLDataType {
    /// `DLDataTypeCode`.
    pub code: u8,
    /// Bits per lane.
    pub bits: u8,
    /// Lanes (1 for scalars).
    pub lanes: u16,
}

/// `DLTensor`.
#[repr(C)]
#[derive(Debug)]
pub struct DLTensor {
    /// Address of the first element (a device address for CUDA).
    pub data: *mut c_void,
    /// Where the data lives.
    pub device: DLDevice,
    /// Number of dimensions.
    pub ndim: i32,
    /// Element type.
    pub dtype: DLDataType,
    /// `ndim` extents.
    pub shape: *mut i64,
    /// `ndim` strides, in elements (never null here, though DLPack 1.x allows it).
    pub strides: *mut i64,
    /// Bytes from `data` to the first element.
    pub byte_offset: u64,
}

/// `DLManagedTensor`, the legacy (unversioned) managed tensor.
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensor {
    /// The tensor.
    pub dl_tensor: DLTensor,
    /// The producer's context (here: the `Holder` this tensor lives in).
    pub manager_ctx: *mut c_void,
    /// Frees the tensor and its context; called once by whoever owns the tensor.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// `DLManagedTensorVersioned` (DLPack 1.0 and later).
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensorVersioned {
    /// The ABI version of this struct.
    pub version: DLPackVersion,
    /// The producer's context (here: the `Holder` this tensor lives in).
    pub manager_ctx: *mut c_void,
    /// Frees the tensor and its context; called once by whoever owns the tensor.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    /// `DLPACK_FLAG_BITMASK_*`.
    pub flags: u64,
    /// The tensor.
    pub dl_tensor: DLTensor,
}

// dlpack.h's layout on the 64-bit targets pinring builds for.
const _: () = {
    assert!(size_of::<DLPackVersion>() == 8);
    assert!(size_of::<DLDevice>() == 8);
    assert!(size_of::<DLDataType>() == 4);
    assert!(offset_of!(DLDataType, bits) == 1);
    assert!(offset_of!(DLDataType, lanes) == 2);
    assert!(offset_of!(DLTensor, data) == 0);
    assert!(offset_of!(DLTensor, device) == 8);
    assert!(offset_of!(DLTensor, ndim) == 16);
    assert!(offset_of!(DLTensor, dtype) == 20);
    assert!(offset_of!(DLTensor, shape) == 24);
    assert!(offset_of!(DLTensor, strides) == 32);
    assert!(offset_of!(DLTensor, byte_offset) == 40);
    assert!(size_of::<DLTensor>() == 48);
    assert!(offset_of!(DLManagedTensor, manager_ctx) == 48);
    assert!(offset_of!(DLManagedTensor, deleter) == 56);
    assert!(size_of::<DLManagedTensor>() == 64);
    assert!(offset_of!(DLManagedTensorVersioned, manager_ctx) == 8);
    assert!(offset_of!(DLManagedTensorVersioned, deleter) == 16);
    assert!(offset_of!(DLManagedTensorVersioned, flags) == 24);
    assert!(offset_of!(DLManagedTensorVersioned, dl_tensor) == 32);
    assert!(size_of::<DLManagedTensorVersioned>() == 80);
};

/// What a capsule describes: everything but the addresses of its own allocations.
pub struct Export {
    /// Address of the first element.
    pub data: usize,
    /// Device of `data`.
    pub device: DLDevice,
    /// Element type.
    pub dtype: DLDataType,
    /// Extents.
    pub shape: Box<[i64]>,
    /// Strides in elements.
    pub strides: Box<[i64]>,
    /// `DLPACK_FLAG_BITMASK_*` (versioned capsules only).
    pub flags: u64,
    /// Kept alive until the consumer calls the deleter (or the capsule dies unconsumed).
    pub owner: Arc<dyn FieldOwner>,
}

impl std::fmt::Debug for Export {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Export")
            .field("data", &format_args!("{:#x}", self.data))
            .field("device", &self.device)
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .field("strides", &self.strides)
            .field("flags", &self.flags)
            .finish_non_exhaustive()
    }
}

/// One managed tensor and everything its pointers point into; `manager_ctx` is its own address.
/// Both managed-tensor flavours live in one of these.
struct Holder<M> {
    managed: M,
    // Read by the consumer through `dl_tensor.shape` / `strides`; kept here so that they live
    // exactly as long as the tensor.
    _shape: Box<[i64]>,
    _strides: Box<[i64]>,
    _owner: Arc<dyn FieldOwner>,
    /// The process that made the tensor: a copy of it in a forked child is never torn down
    /// there (see [`delete`]).
    pid: u32,
}

/// The two managed-tensor structs, for the code they share.
trait Managed: Sized + 'static {
    /// The capsule name an unconsumed tensor of this kind has.
    const NAME: &'static CStr;
    fn new(tensor: DLTensor, flags: u64) -> Self;
    fn set_context(&mut self, ctx: *mut c_void);
    fn manager_ctx(&self) -> *mut c_void;
}

impl Managed for DLManagedTensor {
    const NAME: &'static CStr = LEGACY_NAME;
    fn new(tensor: DLTensor, _flags: u64) -> Self {
        DLManagedTensor {
            dl_tensor: tensor,
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete::<DLManagedTensor>),
        }
    }
    fn set_context(&mut self, ctx: *mut c_void) {
        self.manager_ctx = ctx;
    }
    fn manager_ctx(&self) -> *mut c_void {
        self.manager_ctx
    }
}

impl Managed for DLManagedTensorVersioned {
    const NAME: &'static CStr = VERSIONED_NAME;
    fn new(tensor: DLTensor, flags: u64) -> Self {
        DLManagedTensorVersioned {
            version: DLPackVersion {
                major: DLPACK_MAJOR,
                minor: DLPACK_MINOR,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete::<DLManagedTensorVersioned>),
            flags,
            dl_tensor: tensor,
        }
    }
    fn set_context(&mut self, ctx: *mut c_void) {
        self.manager_ctx = ctx;
    }
    fn manager_ctx(&self) -> *mut c_void {
        self.manager_ctx
    }
}

/// Builds the managed tensor on the heap and returns its address; the caller owns it and must
/// hand it to exactly one call of its `deleter`.
fn into_managed<M: Managed>(export: Export) -> *mut M {
    let Export {
        data,
        device,
        dtype,
        mut shape,
        mut strides,
        flags,
        owner,
    } = export;
    let tensor = DLTensor {
        // The address the field was made with; DLPack hands it on, this crate never reads it.
        data: data as *mut c_void,
        device,
        // At most `field::MAX_NDIM` (checked when the field was made).
        ndim: i32::try_from(shape.len()).expect("a field has at most MAX_NDIM dimensions"),
        dtype,
        // Boxed slices do not move when the box does: these stay valid inside the holder.
        shape: shape.as_mut_ptr(),
        strides: strides.as_mut_ptr(),
        byte_offset: 0,
    };
    let holder = Box::into_raw(Box::new(Holder {
        managed: M::new(tensor, flags),
        _shape: shape,
        _strides: strides,
        _owner: owner,
        pid: crate::process::pid(),
    }));
    // SAFETY: `holder` came from `Box::into_raw` just above, so it is valid, aligned and not
    // aliased; the managed tensor inside it records the holder's address as its context.
    let managed = unsafe { &mut (*holder).managed };
    managed.set_context(holder.cast());
    managed
}

/// The deleter of both flavours: frees the holder the tensor lives in, and with it the owner's
/// reference. DLPack lets consumers call it from any thread, with or without the GIL: the holder
/// holds nothing of Python's.
unsafe extern "C" fn delete<M: Managed>(managed: *mut M) {
    if managed.is_null() {
        return;
    }
    // SAFETY: DLPack calls the deleter with the tensor this producer made (`into_managed`), which
    // is still alive: the deleter runs once.
    let ctx = unsafe { &*managed }.manager_ctx();
    // SAFETY: `manager_ctx` is the `Box<Holder<M>>` the tensor lives in (`into_managed`), not
    // freed before, since the deleter is called exactly once.
    let holder = unsafe { Box::from_raw(ctx.cast::<Holder<M>>()) };
    if holder.pid != crate::process::pid() {
        // A forked child freeing its copy of the parent's tensor (its garbage collector found a
        // copied reference cycle): the owner's teardown is the parent's (join the upload
        // engine's thread, which does not exist here; free memory of the parent's CUDA
        // context), so the copy is left as it is.
        std::mem::forget(holder);
        return;
    }
    // An owner whose drop panics must not unwind into C: the panic is reported by the hook and
    // the owner is gone either way.
    let _ = catch_unwind(AssertUnwindSafe(move || drop(holder)));
}

/// The capsule's destructor: a capsule that still has its unconsumed name was never taken by a
/// consumer, so the tensor is still the capsule's to free. A consumed capsule
/// (`used_dltensor...`) is left alone: its consumer calls the deleter.
unsafe extern "C" fn capsule_destructor<M: Managed>(capsule: *mut ffi::PyObject) {
    // SAFETY: Python calls a capsule's destructor with the capsule, holding the GIL;
    // PyCapsule_IsValid only reads its name and sets no exception.
    let unconsumed = unsafe { ffi::PyCapsule_IsValid(capsule, M::NAME.as_ptr()) } == 1;
    if !unconsumed {
        return;
    }
    // SAFETY: the capsule is valid with this name (checked above), so this returns the pointer
    // it was made with and sets no exception.
    let managed = unsafe { ffi::PyCapsule_GetPointer(capsule, M::NAME.as_ptr()) }.cast::<M>();
    // SAFETY: an unconsumed capsule still owns the tensor `into_managed` made; this is the one
    // call of its deleter.
    unsafe { delete::<M>(managed) };
}

/// Wraps `export` in a capsule; `versioned` picks `DLManagedTensorVersioned` over the legacy
/// struct.
pub fn capsule(py: Python<'_>, export: Export, versioned: bool) -> PyResult<Bound<'_, PyAny>> {
    if versioned {
        make_capsule::<DLManagedTensorVersioned>(py, export)
    } else {
        make_capsule::<DLManagedTensor>(py, export)
    }
}

fn make_capsule<M: Managed>(py: Python<'_>, export: Export) -> PyResult<Bound<'_, PyAny>> {
    let managed = into_managed::<M>(export);
    // SAFETY: the name is a 'static C string, as PyCapsule_New requires (it keeps the pointer);
    // the destructor matches the pointer's type; the GIL is held (`py`).
    let raw = unsafe {
        ffi::PyCapsule_New(
            managed.cast(),
            M::NAME.as_ptr(),
            Some(capsule_destructor::<M>),
        )
    };
    if raw.is_null() {
        // No capsule owns the tensor: free it here (the owner's reference goes with it).
        // SAFETY: `managed` came from `into_managed` and was handed to nobody.
        unsafe { delete::<M>(managed) };
        return Err(PyErr::fetch(py));
    }
    // SAFETY: `raw` is a new, non-null reference returned by PyCapsule_New.
    Ok(unsafe { Bound::from_owned_ptr(py, raw) })
}
