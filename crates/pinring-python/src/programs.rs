//! The programs `pinring`, `pinring-daemon` and `pinring-loader` inside the interpreter: the
//! package's console scripts (`pinring/_programs.py`) call [`main`] (`_native._main`), so that `pip install`
//! gives working commands with no binary built apart from this extension.

use pinring::Program;
use pyo3::prelude::*;
use std::ffi::OsString;
use std::path::PathBuf;

/// Runs program `name` (`pinring`, `pinring-daemon` or `pinring-loader`) on its command line
/// `args` (the first is the program's name) with the GIL released, and returns its exit code.
/// `exe` and `prefix` say how this program starts itself again (`sys.executable`, `-m pinring`):
/// `pinring run` and `pinring bench` start their children that way. The program installs its
/// own SIGINT/SIGTERM handlers; it is meant to be the whole of the process it runs in.
#[pyfunction]
#[pyo3(name = "_main", signature = (name, args, exe, prefix))]
pub fn main(
    py: Python<'_>,
    name: &str,
    args: Vec<OsString>,
    exe: PathBuf,
    prefix: Vec<OsString>,
) -> PyResult<u8> {
    let program = Program::named(name).ok_or_else(|| {
        crate::exit_error(
            pinring_exit::Exit::Usage,
            format!(
                "no program named {name:?}: the programs are pinring, pinring-daemon and \
                 pinring-loader"
            ),
        )
    })?;
    pinring_runtime::this_program::set(exe, prefix, name);
    // The process's name in ps and top is the program's, not "python3" (15 bytes at most).
    if let Ok(comm) = std::ffi::CString::new(name) {
        let _ = nix::sys::prctl::set_name(&comm);
    }
    Ok(py.detach(|| pinring::main(program, args)).code())
}
