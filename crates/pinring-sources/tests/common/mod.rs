//! Helpers shared by the integration tests: reading whole samples, writing `.npy` files, and
//! finding a Python interpreter (with numpy) for reference data.

#![allow(dead_code)]

use std::path::Path;
use std::process::Command;

use pinring_sources::{FieldBuf, Source, SourceError, SourceField};

/// One sample's fields, as owned bytes, in field order.
pub fn read(src: &mut dyn Source, epoch: u32, id: u64) -> Result<Vec<Vec<u8>>, SourceError> {
    let fields: Vec<SourceField> = src.fields().to_vec();
    let mut bufs: Vec<Vec<u8>> = fields
        .iter()
        .map(|f| match f {
            SourceField::Fixed(f) => vec![0xAA; f.sample_bytes() as usize],
            SourceField::Encoded { .. } => vec![0x55; 3],
        })
        .collect();
    let mut out: Vec<FieldBuf<'_>> = fields
        .iter()
        .zip(bufs.iter_mut())
        .map(|(f, b)| match f {
            SourceField::Fixed(_) => FieldBuf::Fixed(b.as_mut_slice()),
            SourceField::Encoded { .. } => FieldBuf::Bytes(b),
        })
        .collect();
    src.read(epoch, id, &mut out)?;
    drop(out);
    Ok(bufs)
}

/// The interpreter named by `PINRING_TEST_PYTHON` (default `python3`) if it imports numpy;
/// otherwise prints why the numpy-based part of `test` is skipped.
pub fn python_numpy(test: &str) -> Option<String> {
    python_with(test, "import numpy")
}

/// The interpreter if it runs at all (`tarfile` and `os` are in the standard library).
pub fn python(test: &str) -> Option<String> {
    python_with(test, "import tarfile, os")
}

fn python_with(test: &str, probe: &str) -> Option<String> {
    let named = std::env::var("PINRING_TEST_PYTHON").ok();
    let py = named.clone().unwrap_or_else(|| "python3".into());
    match Command::new(&py).args(["-c", probe]).output() {
        Ok(o) if o.status.success() => Some(py),
        // An interpreter named on purpose (scripts/test names its venv's) must have it: the
        // reference part of the test is then required, not skipped.
        _ if named.is_some() => panic!("{test}: PINRING_TEST_PYTHON={py} cannot run {probe:?}"),
        _ => {
            println!(
                "{test}: skipping the Python reference part: {py} cannot run {probe:?} \
                 (set PINRING_TEST_PYTHON to an interpreter with numpy)"
            );
            None
        }
    }
}

/// Runs `script` with `py`, arguments `args`; panics with its stderr on failure; returns stdout.
pub fn run_python(py: &str, script: &str, args: &[&Path]) -> String {
    let out = Command::new(py)
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

/// A `.npy` file of format `version` (1, 2 or 3) with `descr`, `shape` and raw `data`
/// (the header padded with spaces to a multiple of 64 bytes, as numpy does).
pub fn npy_bytes(version: u8, descr: &str, fortran: bool, shape: &[u64], data: &[u8]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let fortran = if fortran { "True" } else { "False" };
    let mut dict =
        format!("{{'descr': '{descr}', 'fortran_order': {fortran}, 'shape': {shape}, }}");
    let pre = if version == 1 { 10 } else { 12 };
    while (pre + dict.len() + 1) % 64 != 0 {
        dict.push(' ');
    }
    dict.push('\n');
    let mut out = b"\x93NUMPY".to_vec();
    out.push(version);
    out.push(0);
    if version == 1 {
        out.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    } else {
        out.extend_from_slice(&(dict.len() as u32).to_le_bytes());
    }
    out.extend_from_slice(dict.as_bytes());
    out.extend_from_slice(data);
    out
}
