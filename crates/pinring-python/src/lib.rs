//! `pinring._native`, the compiled half of the `pinring` Python package (python/): pinring's
//! exceptions ([`errors`]), the DLPack export of batch fields ([`field`], [`dlpack`]), and the
//! trainer's end ([`consumer`]), and a loader's ([`producer`]).
//!
//! Built by maturin (python/pyproject.toml) as an abi3 extension module for CPython 3.10 and
//! later; the Rust tests of the workspace do not build or link it against Python.

pub mod consumer;
mod convert;
pub mod dlpack;
pub mod errors;
pub mod field;
pub mod pipeline;
pub mod place;
pub mod process;
pub mod producer;
mod programs;
mod signals;
pub mod spec;
mod supervise;
mod testing;

use pyo3::prelude::*;

pub use errors::{exit_error, OrRaise, ToPyErr};
pub use field::{Device, Field, FieldOwner, KeepAlive};

/// The extension module.
#[pymodule]
#[pyo3(name = "_native")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    m.add_class::<Field>()?;
    m.add_class::<consumer::Consumer>()?;
    m.add_class::<place::Place>()?;
    m.add_class::<consumer::Batch>()?;
    m.add_class::<consumer::EmbeddedDaemon>()?;
    m.add_class::<spec::PySpec>()?;
    m.add_class::<producer::Producer>()?;
    m.add_class::<producer::Part>()?;
    m.add_class::<testing::OwnerProbe>()?;
    m.add_class::<supervise::Supervisor>()?;
    m.add_class::<pipeline::Pipeline>()?;
    m.add_class::<pipeline::RingTicket>()?;
    m.add_function(wrap_pyfunction!(convert::check_config, m)?)?;
    m.add_function(wrap_pyfunction!(consumer::bound, m)?)?;
    m.add_function(wrap_pyfunction!(process::live_rings, m)?)?;
    m.add_function(wrap_pyfunction!(process::die_with_parent, m)?)?;
    // A forked child reads its own pid again (process::pid caches it).
    let after_fork = wrap_pyfunction!(process::after_fork_in_child, m)?;
    let kwargs = pyo3::types::PyDict::new(m.py());
    kwargs.set_item("after_in_child", &after_fork)?;
    m.py()
        .import("os")?
        .call_method("register_at_fork", (), Some(&kwargs))?;
    m.add_function(wrap_pyfunction!(convert::config_settings, m)?)?;
    m.add_function(wrap_pyfunction!(convert::cuda_unusable_py, m)?)?;
    m.add_function(wrap_pyfunction!(programs::main, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // The one statement of daemon.prefetch's range (pinring-data), for the Python side's
    // prefetch_factor arithmetic.
    let prefetch = pinring_data::config::PREFETCH;
    m.add("PREFETCH_RANGE", (*prefetch.start(), *prefetch.end()))?;
    m.add_function(wrap_pyfunction!(testing::test_host_field, m)?)?;
    m.add_function(wrap_pyfunction!(testing::test_load_config, m)?)?;
    m.add_function(wrap_pyfunction!(testing::test_check_ring_name, m)?)?;
    m.add_function(wrap_pyfunction!(errors::error_for_exit, m)?)?;
    m.add(
        "DLPACK_VERSION",
        (dlpack::DLPACK_MAJOR, dlpack::DLPACK_MINOR),
    )?;
    Ok(())
}
