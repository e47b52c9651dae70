//! NumPy `.npy` arrays (`kind = "npy"`).
//!
//! `dataset.npy.path` is either
//!
//! * one `.npy` file whose first axis is the sample axis: sample `k` is `array[k]`, of shape
//!   `array.shape[1:]`; or
//! * a directory of per-sample `.npy` files: sample `k` is the `k`-th `*.npy` file in the order of
//!   their names (bytewise, as Python's `sorted` orders them), each of the same shape and dtype.
//!
//! The samples make one field, named `dataset.npy.field` (default `"data"`). With `dataset.npy.labels`
//! (a second `.npy` file whose first axis has one entry per sample) a second field `"labels"`
//! holds `labels[k]`.
//!
//! **Dtypes.** Every numeric dtype `numpy.save` writes is read: `|b1` (bool), `|u1`, `|i1`,
//! `<i2`, `<u2`, `<i4`, `<u4`, `<i8`, `<u8`, `<f2`, `<f4`, `<f8` (`<` or `=`; `|` or any order
//! for one-byte types). Each has a pinring [`Dtype`] of the same representation
//! ([`NpyDtype::field_dtype`]), so a sample's bytes are copied exactly as the file holds them:
//!
//! | file | field |
//! | --- | --- |
//! | `bool` | `bool` (the file's 0/1 bytes) |
//! | `int8`, `int16`, `int32`, `int64` | `i8`, `i16`, `i32`, `i64` |
//! | `uint8`, `uint16`, `uint32`, `uint64` | `u8`, `u16`, `u32`, `u64` |
//! | `float16`, `float32`, `float64` | `f16`, `f32`, `f64` |
//!
//! Big-endian data (`>`) and Fortran order are refused with an error saying how to convert;
//! structured, complex, string and object dtypes are refused too. [`NpyConfig::dtype`] (a numpy
//! name such as `"float32"`) and [`NpyConfig::shape`] (the per-sample shape), when given, are
//! checked against the files; pinring's `[dataset.npy]` always gives them (`dtype` in pinring's
//! names, `"f32"`, mapped by [`NpyDtype::from_dtype`]).
//!
//! **Header.** Versions 1.0, 2.0 and 3.0 are parsed here ([`NpyHeader::parse`]) rather than
//! with a crate such as `npyz`: the grammar is one Python dict literal with three keys, the
//! reader only needs the data offset, the dtype and the shape (it copies raw little-endian
//! bytes, no typed element decoding), and owning the parser lets its errors name the file and
//! the byte offset and lets us fuzz it to never panic (`tests/fuzz.rs`).
//!
//! **Reading.** `pread` (see the crate docs). One file stays open; in directory mode each read
//! opens the sample's file (all headers are checked once at open).
//!
//! **Bad per-sample files.** In directory mode a file that cannot be opened, is truncated, or
//! whose header, dtype or shape is wrong is one bad *sample*, not a bad dataset: the open
//! succeeds (unless no file is good), [`NpySource::bad_samples`] lists them, and reading such a
//! sample returns the file's error (a per-sample [`SourceError`]), so that the caller's
//! `on_bad_sample` policy decides. A single-file array that is bad fails the open.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use pinring_data::Dtype;
use serde::{Deserialize, Serialize};

use crate::{
    check_bufs, fixed, pread, pread_some, show, FieldBuf, Source, SourceError, SourceField,
};

/// Default name of the data field.
pub const DEFAULT_FIELD: &str = "data";
/// Name of the labels field.
pub const LABELS: &str = "labels";
/// Largest header accepted (numpy writes a few hundred bytes).
pub const MAX_HEADER_BYTES: u64 = 1 << 20;
/// Bytes read at first for a header (numpy writes 128 or so; a longer one takes a second read).
const HEADER_PREFIX_BYTES: u64 = 256;
/// Nesting depth accepted in the header's dict literal.
const MAX_DEPTH: usize = 8;

/// Element type of a `.npy` file (little-endian or one byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NpyDtype {
    /// `|b1`.
    Bool,
    /// `|i1`.
    Int8,
    /// `|u1`.
    Uint8,
    /// `<i2`.
    Int16,
    /// `<u2`.
    Uint16,
    /// `<i4`.
    Int32,
    /// `<u4`.
    Uint32,
    /// `<i8`.
    Int64,
    /// `<u8`.
    Uint64,
    /// `<f2`.
    Float16,
    /// `<f4`.
    Float32,
    /// `<f8`.
    Float64,
}

impl NpyDtype {
    /// Bytes per element.
    pub const fn size_of(self) -> u64 {
        match self {
            NpyDtype::Bool | NpyDtype::Int8 | NpyDtype::Uint8 => 1,
            NpyDtype::Int16 | NpyDtype::Uint16 | NpyDtype::Float16 => 2,
            NpyDtype::Int32 | NpyDtype::Uint32 | NpyDtype::Float32 => 4,
            NpyDtype::Int64 | NpyDtype::Uint64 | NpyDtype::Float64 => 8,
        }
    }

    /// numpy's name (`"float32"`), as in the config.
    pub const fn name(self) -> &'static str {
        match self {
            NpyDtype::Bool => "bool",
            NpyDtype::Int8 => "int8",
            NpyDtype::Uint8 => "uint8",
            NpyDtype::Int16 => "int16",
            NpyDtype::Uint16 => "uint16",
            NpyDtype::Int32 => "int32",
            NpyDtype::Uint32 => "uint32",
            NpyDtype::Int64 => "int64",
            NpyDtype::Uint64 => "uint64",
            NpyDtype::Float16 => "float16",
            NpyDtype::Float32 => "float32",
            NpyDtype::Float64 => "float64",
        }
    }

    /// The dtype of the field: the pinring dtype of the same representation (the bytes are
    /// copied as they are).
    pub const fn field_dtype(self) -> Dtype {
        match self {
            NpyDtype::Bool => Dtype::Bool,
            NpyDtype::Int8 => Dtype::I8,
            NpyDtype::Uint8 => Dtype::U8,
            NpyDtype::Int16 => Dtype::I16,
            NpyDtype::Uint16 => Dtype::U16,
            NpyDtype::Int32 => Dtype::I32,
            NpyDtype::Uint32 => Dtype::U32,
            NpyDtype::Int64 => Dtype::I64,
            NpyDtype::Uint64 => Dtype::U64,
            NpyDtype::Float16 => Dtype::F16,
            NpyDtype::Float32 => Dtype::F32,
            NpyDtype::Float64 => Dtype::F64,
        }
    }

    /// The numpy dtype of pinring dtype `d` (`None` for `bf16`, which numpy lacks).
    pub const fn from_dtype(d: Dtype) -> Option<NpyDtype> {
        Some(match d {
            Dtype::Bool => NpyDtype::Bool,
            Dtype::I8 => NpyDtype::Int8,
            Dtype::U8 => NpyDtype::Uint8,
            Dtype::I16 => NpyDtype::Int16,
            Dtype::U16 => NpyDtype::Uint16,
            Dtype::I32 => NpyDtype::Int32,
            Dtype::U32 => NpyDtype::Uint32,
            Dtype::I64 => NpyDtype::Int64,
            Dtype::U64 => NpyDtype::Uint64,
            Dtype::F16 => NpyDtype::Float16,
            Dtype::F32 => NpyDtype::Float32,
            Dtype::F64 => NpyDtype::Float64,
            Dtype::Bf16 => return None,
        })
    }

    /// The type code after the byte-order character (`"f4"`), or `None`.
    fn from_code(code: &str) -> Option<NpyDtype> {
        Some(match code {
            "b1" => NpyDtype::Bool,
            "i1" => NpyDtype::Int8,
            "u1" => NpyDtype::Uint8,
            "i2" => NpyDtype::Int16,
            "u2" => NpyDtype::Uint16,
            "i4" => NpyDtype::Int32,
            "u4" => NpyDtype::Uint32,
            "i8" => NpyDtype::Int64,
            "u8" => NpyDtype::Uint64,
            "f2" => NpyDtype::Float16,
            "f4" => NpyDtype::Float32,
            "f8" => NpyDtype::Float64,
            _ => return None,
        })
    }
}

/// The `[dataset]` keys of `kind = "npy"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NpyConfig {
    /// A `.npy` file (first axis = samples) or a directory of per-sample `.npy` files.
    pub path: PathBuf,
    /// Name of the data field.
    #[serde(default = "default_field")]
    pub field: String,
    /// Expected dtype of the data (numpy name); `None`: whatever the file holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<NpyDtype>,
    /// Expected per-sample shape of the data; `None`: whatever the file holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<Vec<u32>>,
    /// A `.npy` file of labels, one entry per sample (first axis), giving the field `"labels"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<PathBuf>,
}

fn default_field() -> String {
    DEFAULT_FIELD.into()
}

/// Errors of [`NpySource`] and [`NpyHeader::parse`].
#[derive(Debug, thiserror::Error)]
pub enum NpyError {
    /// A file or directory cannot be opened or examined.
    #[error("cannot open {file}: {source}; check dataset.npy.path and dataset.npy.labels")]
    Open {
        /// The file.
        file: String,
        /// The cause.
        source: io::Error,
    },
    /// The header is malformed.
    #[error("{file} is not a valid .npy file: at byte offset {offset}: {problem}; rewrite it with numpy.save")]
    Header {
        /// The file.
        file: String,
        /// Byte offset of the problem.
        offset: u64,
        /// What is wrong.
        problem: String,
    },
    /// Big-endian data.
    #[error("{file} holds big-endian data ({descr:?}); pinring reads little-endian only: save arr.astype(arr.dtype.newbyteorder('<'))")]
    BigEndian {
        /// The file.
        file: String,
        /// The header's `descr`.
        descr: String,
    },
    /// Fortran order.
    #[error(
        "{file} is in Fortran order; pinring reads C order only: save numpy.ascontiguousarray(arr)"
    )]
    FortranOrder {
        /// The file.
        file: String,
    },
    /// A dtype numpy writes but pinring does not read.
    #[error("{file} has dtype {descr:?}, which is not a number pinring reads (bool, int8..int64, uint8..uint64, float16/32/64); convert with arr.astype(...)")]
    UnsupportedDtype {
        /// The file.
        file: String,
        /// The header's `descr`.
        descr: String,
    },
    /// The file is shorter than its header says.
    #[error("{file} is truncated: its header declares {expected} bytes in all, the file has {actual}, {missing} bytes are missing; copy the file again")]
    Truncated {
        /// The file.
        file: String,
        /// Bytes the header implies.
        expected: u64,
        /// Bytes in the file.
        actual: u64,
        /// `expected - actual`.
        missing: u64,
    },
    /// The file is longer than its header says.
    #[error("{file} has {extra} bytes after the end of its array (byte offset {offset}); it is not a plain .npy file: rewrite it with numpy.save")]
    Trailing {
        /// The file.
        file: String,
        /// Where the array ends.
        offset: u64,
        /// Extra bytes.
        extra: u64,
    },
    /// The array has no sample axis.
    #[error("{file} holds a 0-d array: a .npy source needs the samples on the first axis; save a 1-d or larger array")]
    NoSampleAxis {
        /// The file.
        file: String,
    },
    /// The dtype differs from the configured or the first file's.
    #[error(
        "{file} has dtype {found}, expected {expected}; fix dataset.npy.dtype (in pinring's names: uint8 is \"u8\", int16 \"i16\", float32 \"f32\", bool \"bool\") or convert the file"
    )]
    DtypeMismatch {
        /// The file.
        file: String,
        /// Found.
        found: &'static str,
        /// Expected.
        expected: &'static str,
    },
    /// The per-sample shape differs from the configured or the first file's.
    #[error("{file} has per-sample shape {found:?}, expected {expected:?}; fix dataset.npy.shape or the file")]
    ShapeMismatch {
        /// The file.
        file: String,
        /// Found.
        found: Vec<u64>,
        /// Expected.
        expected: Vec<u64>,
    },
    /// The labels do not have one entry per sample.
    #[error("labels file {file} has {found} entries on its first axis, the data has {expected} samples; give one label per sample")]
    LabelsLen {
        /// The labels file.
        file: String,
        /// Its first axis.
        found: u64,
        /// Samples.
        expected: u64,
    },
    /// No samples.
    #[error("{file} holds no samples (an empty first axis, or a directory without *.npy files); point dataset.npy.path at the data")]
    Empty {
        /// The file or directory.
        file: String,
    },
    /// A read failed (the file shrank or the disk failed since open).
    #[error("reading {len} bytes at byte offset {offset} of {file} failed: {source}; the file changed or became unreadable since the source was opened: restore it")]
    Read {
        /// The file.
        file: String,
        /// Byte offset.
        offset: u64,
        /// Bytes asked for.
        len: u64,
        /// The cause.
        source: io::Error,
    },
}

/// A parsed `.npy` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NpyHeader {
    /// Format version `(major, minor)`.
    pub version: (u8, u8),
    /// Element type.
    pub dtype: NpyDtype,
    /// Array shape.
    pub shape: Vec<u64>,
    /// Byte offset of the data.
    pub data_offset: u64,
    /// Bytes of data (`prod(shape) × itemsize`).
    pub data_bytes: u64,
}

/// A value of the header's dict literal.
#[derive(Debug)]
enum Lit {
    Str(String),
    Bool(bool),
    Int(u64),
    Seq(Vec<Lit>),
}

/// A position and a problem, made into [`NpyError::Header`] by the caller.
type LexError = (u64, String);

/// The header dict's entries: key, value, and the value's byte offset.
type Entries = Vec<(String, Lit, u64)>;

struct Lexer<'a> {
    s: &'a [u8],
    pos: usize,
    base: u64,
}

impl Lexer<'_> {
    fn skip_ws(&mut self) {
        while self
            .s
            .get(self.pos)
            .is_some_and(|c| c.is_ascii_whitespace())
        {
            self.pos += 1;
        }
    }

    fn err(&self, problem: impl Into<String>) -> LexError {
        (self.base + self.pos as u64, problem.into())
    }

    fn peek(&mut self) -> Option<u8> {
        self.skip_ws();
        self.s.get(self.pos).copied()
    }

    fn expect(&mut self, c: u8) -> Result<(), LexError> {
        if self.peek() == Some(c) {
            self.pos += 1;
            Ok(())
        } else {
            Err(self.err(format!("expected {:?}", c as char)))
        }
    }

    fn value(&mut self, depth: usize) -> Result<Lit, LexError> {
        if depth > MAX_DEPTH {
            return Err(self.err("nested too deeply"));
        }
        match self.peek() {
            Some(q @ (b'\'' | b'"')) => {
                self.pos += 1;
                let start = self.pos;
                while self.s.get(self.pos).is_some_and(|&c| c != q) {
                    self.pos += 1;
                }
                if self.pos >= self.s.len() {
                    return Err(self.err("unterminated string"));
                }
                let text = String::from_utf8_lossy(&self.s[start..self.pos]).into_owned();
                self.pos += 1;
                Ok(Lit::Str(text))
            }
            Some(open @ (b'(' | b'[')) => {
                let close = if open == b'(' { b')' } else { b']' };
                self.pos += 1;
                let mut items = Vec::new();
                loop {
                    if self.peek() == Some(close) {
                        self.pos += 1;
                        return Ok(Lit::Seq(items));
                    }
                    items.push(self.value(depth + 1)?);
                    match self.peek() {
                        Some(b',') => self.pos += 1,
                        Some(c) if c == close => {}
                        _ => return Err(self.err(format!("expected ',' or {:?}", close as char))),
                    }
                }
            }
            Some(c) if c.is_ascii_digit() => {
                let start = self.pos;
                while self.s.get(self.pos).is_some_and(|c| c.is_ascii_digit()) {
                    self.pos += 1;
                }
                let digits = std::str::from_utf8(&self.s[start..self.pos]).unwrap_or("");
                let v = digits
                    .parse::<u64>()
                    .map_err(|_| self.err("integer too large"))?;
                if self.s.get(self.pos) == Some(&b'L') {
                    self.pos += 1; // Python 2's long suffix
                }
                Ok(Lit::Int(v))
            }
            Some(c) if c.is_ascii_alphabetic() => {
                let start = self.pos;
                while self
                    .s
                    .get(self.pos)
                    .is_some_and(|c| c.is_ascii_alphanumeric())
                {
                    self.pos += 1;
                }
                match &self.s[start..self.pos] {
                    b"True" => Ok(Lit::Bool(true)),
                    b"False" => Ok(Lit::Bool(false)),
                    _ => {
                        self.pos = start;
                        Err(self.err("expected True or False"))
                    }
                }
            }
            Some(_) => Err(self.err("unexpected character")),
            None => Err(self.err("unexpected end of header")),
        }
    }

    /// `{ 'key': value, ... }`
    fn dict(&mut self) -> Result<Entries, LexError> {
        self.expect(b'{')?;
        let mut entries = Vec::new();
        loop {
            if self.peek() == Some(b'}') {
                self.pos += 1;
                return Ok(entries);
            }
            let at = self.base + self.pos as u64;
            let Lit::Str(key) = self.value(1)? else {
                return Err((at, "dict key is not a string".into()));
            };
            self.expect(b':')?;
            let at = self.base + self.pos as u64;
            let v = self.value(1)?;
            entries.push((key, v, at));
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {}
                _ => return Err(self.err("expected ',' or '}'")),
            }
        }
    }
}

/// The header dict's `descr`, `fortran_order` and `shape` (`entries`, of the dict that starts at
/// byte `start` of `file`): each of its type, none other, none missing.
fn header_values(
    file: &str,
    start: u64,
    entries: Entries,
) -> Result<(String, bool, Vec<u64>), NpyError> {
    let header = |offset: u64, problem: String| NpyError::Header {
        file: file.into(),
        offset,
        problem,
    };
    let (mut descr, mut fortran, mut shape) = (None, None, None);
    for (key, v, at) in entries {
        match (key.as_str(), v) {
            ("descr", Lit::Str(s)) => descr = Some(s),
            ("descr", Lit::Seq(_)) => {
                return Err(NpyError::UnsupportedDtype {
                    file: file.into(),
                    descr: "structured (a list of fields)".into(),
                })
            }
            ("fortran_order", Lit::Bool(b)) => fortran = Some(b),
            ("shape", Lit::Seq(items)) => {
                let mut dims = Vec::with_capacity(items.len());
                for d in items {
                    match d {
                        Lit::Int(d) => dims.push(d),
                        _ => return Err(header(at, "shape holds a non-integer".into())),
                    }
                }
                shape = Some(dims);
            }
            (k @ ("descr" | "fortran_order" | "shape"), _) => {
                return Err(header(at, format!("{k:?} has the wrong type")))
            }
            (k, _) => return Err(header(at, format!("unknown key {k:?}"))),
        }
    }
    let (Some(descr), Some(fortran), Some(shape)) = (descr, fortran, shape) else {
        return Err(header(
            start,
            "the dict lacks 'descr', 'fortran_order' or 'shape'".into(),
        ));
    };
    Ok((descr, fortran, shape))
}

impl NpyHeader {
    /// Parses the header at the start of `bytes` (a prefix of file `file`, used in errors).
    /// Never panics; a prefix too short for the header is an error saying how many bytes the
    /// header needs.
    pub fn parse(file: &str, bytes: &[u8]) -> Result<NpyHeader, NpyError> {
        let header = |offset: u64, problem: String| NpyError::Header {
            file: file.into(),
            offset,
            problem,
        };
        if bytes.len() < 10 {
            return Err(header(
                bytes.len() as u64,
                format!(
                    "file ends after {} bytes, inside the 10-byte preamble",
                    bytes.len()
                ),
            ));
        }
        if &bytes[..6] != b"\x93NUMPY" {
            return Err(header(0, "no \\x93NUMPY magic".into()));
        }
        let version = (bytes[6], bytes[7]);
        let (len_bytes, start) = match version.0 {
            1 => (2usize, 10usize),
            2 | 3 => (4, 12),
            v => {
                return Err(header(
                    6,
                    format!("unknown format version {v}.{}", version.1),
                ))
            }
        };
        if bytes.len() < start {
            return Err(header(8, "file ends inside the header length".into()));
        }
        let mut len = [0u8; 4];
        len[..len_bytes].copy_from_slice(&bytes[8..8 + len_bytes]);
        let header_len = u64::from(u32::from_le_bytes(len));
        if header_len > MAX_HEADER_BYTES {
            return Err(header(
                8,
                format!("header length {header_len} is over {MAX_HEADER_BYTES} bytes"),
            ));
        }
        let data_offset = start as u64 + header_len;
        let Some(text) = bytes.get(start..data_offset as usize) else {
            return Err(header(
                bytes.len() as u64,
                format!(
                    "file ends inside the header: it needs {} bytes, has {}",
                    data_offset,
                    bytes.len()
                ),
            ));
        };
        let mut lx = Lexer {
            s: text,
            pos: 0,
            base: start as u64,
        };
        let entries = lx.dict().map_err(|(o, p)| header(o, p))?;
        let (descr, fortran, shape) = header_values(file, start as u64, entries)?;
        let (order, code) = match descr.as_bytes().first() {
            Some(b'<' | b'>' | b'|' | b'=') => descr.split_at(1),
            _ => ("", descr.as_str()),
        };
        let Some(dtype) = NpyDtype::from_code(code) else {
            return Err(NpyError::UnsupportedDtype {
                file: file.into(),
                descr,
            });
        };
        if order == ">" && dtype.size_of() > 1 {
            return Err(NpyError::BigEndian {
                file: file.into(),
                descr,
            });
        }
        if fortran && shape.iter().filter(|&&d| d > 1).count() > 1 {
            return Err(NpyError::FortranOrder { file: file.into() });
        }
        let data_bytes = shape
            .iter()
            .try_fold(dtype.size_of(), |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| header(start as u64, format!("shape {shape:?} is too large")))?;
        Ok(NpyHeader {
            version,
            dtype,
            shape,
            data_offset,
            data_bytes,
        })
    }

    /// Reads and parses the header of the `.npy` bytes that start at byte `offset` of `file` and
    /// span `size` bytes (a whole file, or a member of a tar shard), reading no byte past them;
    /// `name` names them in errors, `buf` is scratch (reused). Offsets in errors are relative to
    /// `offset`. The size is not checked against the header: [`NpyHeader::read`] does that for a
    /// file, the webdataset reader for a member.
    pub fn read_at(
        name: &str,
        file: &File,
        offset: u64,
        size: u64,
        buf: &mut Vec<u8>,
    ) -> Result<NpyHeader, NpyError> {
        let read = |buf: &mut Vec<u8>, len: u64| {
            buf.clear();
            buf.resize(len.min(size) as usize, 0);
            let n = pread_some(file, buf, offset).map_err(|source| NpyError::Read {
                file: name.into(),
                offset,
                len: buf.len() as u64,
                source,
            })?;
            buf.truncate(n);
            Ok::<_, NpyError>(())
        };
        // numpy's headers take 128 bytes or so: one read holds the preamble and the dict.
        read(buf, HEADER_PREFIX_BYTES)?;
        let header_len = match buf.get(6) {
            Some(1) if buf.len() >= 10 => u64::from(u16::from_le_bytes([buf[8], buf[9]])) + 10,
            Some(2 | 3) if buf.len() >= 12 => {
                u64::from(u32::from_le_bytes([buf[8], buf[9], buf[10], buf[11]])) + 12
            }
            _ => 0,
        };
        if header_len > buf.len() as u64 && header_len <= MAX_HEADER_BYTES + 12 {
            read(buf, header_len)?;
        }
        NpyHeader::parse(name, buf)
    }

    /// Reads and parses the header of `path`, and checks the file's size against it.
    pub fn read(path: &Path, file: &File) -> Result<NpyHeader, NpyError> {
        let name = show(path);
        let size = file
            .metadata()
            .map_err(|source| NpyError::Open {
                file: name.clone(),
                source,
            })?
            .len();
        let h = NpyHeader::read_at(&name, file, 0, size, &mut Vec::new())?;
        let expected = h.data_offset.saturating_add(h.data_bytes);
        if size < expected {
            return Err(NpyError::Truncated {
                file: name,
                expected,
                actual: size,
                missing: expected - size,
            });
        }
        if size > expected {
            return Err(NpyError::Trailing {
                file: name,
                offset: expected,
                extra: size - expected,
            });
        }
        Ok(h)
    }
}

/// One array file.
#[derive(Debug)]
struct Array {
    path: PathBuf,
    file: File,
    header: NpyHeader,
    /// Bytes of one sample in the file.
    sample_bytes: u64,
}

#[derive(Debug)]
enum Data {
    /// One file, samples on the first axis.
    One(Array),
    /// One file per sample: paths and data offsets (`None`: the file was bad at open; reading
    /// the sample examines it again and returns its error).
    Dir {
        files: Vec<(PathBuf, Option<u64>)>,
        dtype: NpyDtype,
        shape: Vec<u64>,
    },
}

/// An open `.npy` dataset ([`Source`] of `kind = "npy"`).
#[derive(Debug)]
pub struct NpySource {
    data: Data,
    labels: Option<Array>,
    len: u64,
    fields: Vec<SourceField>,
}

impl NpySource {
    /// Bytes `offset .. offset + out.len()` of sample `id`'s data (`id < len`, the range inside
    /// one sample: checked by the callers).
    fn read_data(&self, id: u64, offset: u64, out: &mut [u8]) -> Result<(), SourceError> {
        match &self.data {
            Data::One(a) => {
                let at = a.header.data_offset + id * a.sample_bytes + offset;
                Ok(read_exact(&a.path, &a.file, at, out)?)
            }
            Data::Dir {
                files,
                dtype,
                shape,
            } => {
                let (path, start) = &files[id as usize];
                // A file bad at open is examined again: its error names the file and the problem.
                let start = match start {
                    Some(o) => *o,
                    None => check_sample_file(path, *dtype, shape)?,
                };
                let file = open_file(path)?;
                Ok(read_exact(path, &file, start + offset, out)?)
            }
        }
    }

    /// Bytes `offset .. offset + out.len()` of sample `id`'s labels, if the dataset has labels.
    fn read_labels(&self, id: u64, offset: u64, out: &mut [u8]) -> Result<(), SourceError> {
        match &self.labels {
            Some(a) => {
                let at = a.header.data_offset + id * a.sample_bytes + offset;
                Ok(read_exact(&a.path, &a.file, at, out)?)
            }
            None => Ok(()),
        }
    }
}

fn open_file(path: &Path) -> Result<File, NpyError> {
    crate::open_data_file(path).map_err(|source| NpyError::Open {
        file: show(path),
        source,
    })
}

/// A directory of `.npy` files, one sample each (`config.path`; see [`NpySource::open`]): its
/// files in name order, each checked against the config's dtype and sample shape (`want_shape`),
/// else the first good file's; a file that fails is kept as a bad sample, unless none is good.
fn open_dir(
    config: &NpyConfig,
    want_shape: Option<&[u64]>,
) -> Result<(Data, u64, NpyDtype, Vec<u32>), NpyError> {
    let mut names = Vec::new();
    let rd = std::fs::read_dir(&config.path).map_err(|source| NpyError::Open {
        file: show(&config.path),
        source,
    })?;
    for entry in rd {
        let entry = entry.map_err(|source| NpyError::Open {
            file: show(&config.path),
            source,
        })?;
        let p = entry.path();
        if p.extension().is_some_and(|e| e == "npy") && !p.is_dir() {
            names.push(p);
        }
    }
    names.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    if names.is_empty() {
        return Err(NpyError::Empty {
            file: show(&config.path),
        });
    }
    // The expected dtype and shape: the config's, else the first good file's.
    let (dtype, sample_shape) = match (config.dtype, want_shape) {
        (Some(d), Some(s)) => (d, s.to_vec()),
        _ => {
            let mut first_err = None;
            let mut found = None;
            for p in &names {
                match open_file(p).and_then(|f| NpyHeader::read(p, &f)) {
                    Ok(h) => {
                        found = Some(h);
                        break;
                    }
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
            }
            let Some(h) = found else {
                return Err(first_err.unwrap_or_else(|| NpyError::Empty {
                    file: show(&config.path),
                }));
            };
            (
                config.dtype.unwrap_or(h.dtype),
                want_shape.map_or(h.shape, <[u64]>::to_vec),
            )
        }
    };
    let mut files = Vec::with_capacity(names.len());
    let mut good = 0usize;
    let mut first_err = None;
    for p in names {
        let offset = match check_sample_file(&p, dtype, &sample_shape) {
            Ok(o) => {
                good += 1;
                Some(o)
            }
            Err(e) => {
                first_err.get_or_insert(e);
                None
            }
        };
        files.push((p, offset));
    }
    if good == 0 {
        if let Some(e) = first_err {
            return Err(e);
        }
    }
    let shape = per_sample_shape(&config.path, &sample_shape)?;
    let len = files.len() as u64;
    Ok((
        Data::Dir {
            files,
            dtype,
            shape: sample_shape,
        },
        len,
        dtype,
        shape,
    ))
}

fn per_sample_shape(path: &Path, shape: &[u64]) -> Result<Vec<u32>, NpyError> {
    shape
        .iter()
        .map(|&d| {
            u32::try_from(d).map_err(|_| NpyError::Header {
                file: show(path),
                offset: 0,
                problem: format!("dimension {d} of shape {shape:?} is over 2^32 - 1"),
            })
        })
        .collect()
}

fn check_expect(
    path: &Path,
    h: &NpyHeader,
    sample_shape: &[u64],
    dtype: Option<NpyDtype>,
    shape: Option<&[u64]>,
) -> Result<(), NpyError> {
    if let Some(want) = dtype {
        if h.dtype != want {
            return Err(NpyError::DtypeMismatch {
                file: show(path),
                found: h.dtype.name(),
                expected: want.name(),
            });
        }
    }
    if let Some(want) = shape {
        if sample_shape != want {
            return Err(NpyError::ShapeMismatch {
                file: show(path),
                found: sample_shape.to_vec(),
                expected: want.to_vec(),
            });
        }
    }
    Ok(())
}

/// Opens a file with samples on its first axis.
fn open_array(path: &Path) -> Result<Array, NpyError> {
    let file = open_file(path)?;
    let header = NpyHeader::read(path, &file)?;
    let Some(&n) = header.shape.first() else {
        return Err(NpyError::NoSampleAxis { file: show(path) });
    };
    let sample_bytes = header.data_bytes.checked_div(n).unwrap_or(0);
    Ok(Array {
        path: path.to_path_buf(),
        file,
        header,
        sample_bytes,
    })
}

/// Opens per-sample file `p` and checks it: its data offset, or its error.
fn check_sample_file(p: &Path, dtype: NpyDtype, shape: &[u64]) -> Result<u64, NpyError> {
    let h = NpyHeader::read(p, &open_file(p)?)?;
    check_expect(p, &h, &h.shape, Some(dtype), Some(shape))?;
    Ok(h.data_offset)
}

impl NpySource {
    /// Opens `config.path` (and `config.labels`), checking every header, size, dtype and shape.
    /// In directory mode a bad per-sample file is a bad sample ([`NpySource::bad_samples`]),
    /// not an error, unless every file is bad.
    pub fn open(config: &NpyConfig) -> Result<NpySource, NpyError> {
        let want_shape: Option<Vec<u64>> = config
            .shape
            .as_ref()
            .map(|s| s.iter().map(|&d| u64::from(d)).collect());
        let meta = std::fs::metadata(&config.path).map_err(|source| NpyError::Open {
            file: show(&config.path),
            source,
        })?;
        let (data, len, dtype, shape) = if meta.is_dir() {
            open_dir(config, want_shape.as_deref())?
        } else {
            let a = open_array(&config.path)?;
            let sample_shape = &a.header.shape[1..];
            check_expect(
                &a.path,
                &a.header,
                sample_shape,
                config.dtype,
                want_shape.as_deref(),
            )?;
            let n = a.header.shape[0];
            if n == 0 {
                return Err(NpyError::Empty {
                    file: show(&a.path),
                });
            }
            let shape = per_sample_shape(&a.path, sample_shape)?;
            let dtype = a.header.dtype;
            (Data::One(a), n, dtype, shape)
        };
        let mut fields = vec![fixed(&config.field, dtype.field_dtype(), shape)];
        let labels = match &config.labels {
            None => None,
            Some(p) => {
                let a = open_array(p)?;
                if a.header.shape[0] != len {
                    return Err(NpyError::LabelsLen {
                        file: show(p),
                        found: a.header.shape[0],
                        expected: len,
                    });
                }
                let shape = per_sample_shape(p, &a.header.shape[1..])?;
                fields.push(fixed(LABELS, a.header.dtype.field_dtype(), shape));
                Some(a)
            }
        };
        Ok(NpySource {
            data,
            labels,
            len,
            fields,
        })
    }

    /// The samples whose per-sample file (directory mode) was bad at open, with the file: reading
    /// one returns the file's error.
    pub fn bad_samples(&self) -> Vec<(u64, &Path)> {
        match &self.data {
            Data::One(_) => Vec::new(),
            Data::Dir { files, .. } => files
                .iter()
                .enumerate()
                .filter(|(_, (_, o))| o.is_none())
                .map(|(k, (p, _))| (k as u64, p.as_path()))
                .collect(),
        }
    }
}

/// Reads the `out.len()` bytes of a sample at `offset` of `file`: the file's bytes as they are.
fn read_exact(path: &Path, file: &File, offset: u64, out: &mut [u8]) -> Result<(), NpyError> {
    pread(file, out, offset).map_err(|source| NpyError::Read {
        file: show(path),
        offset,
        len: out.len() as u64,
        source,
    })
}

impl Source for NpySource {
    fn len(&self) -> u64 {
        self.len
    }

    fn fields(&self) -> &[SourceField] {
        &self.fields
    }

    fn read(&mut self, _epoch: u32, id: u64, out: &mut [FieldBuf<'_>]) -> Result<(), SourceError> {
        check_bufs(&self.fields, out)?;
        if id >= self.len {
            return Err(SourceError::OutOfRange { id, len: self.len });
        }
        let (data_out, labels_out) = match out {
            [FieldBuf::Fixed(d)] => (d, None),
            [FieldBuf::Fixed(d), FieldBuf::Fixed(l)] => (d, Some(l)),
            _ => return Ok(()), // check_bufs matched the fields
        };
        self.read_data(id, 0, data_out)?;
        if let Some(l) = labels_out {
            self.read_labels(id, 0, l)?;
        }
        Ok(())
    }

    fn read_range(
        &mut self,
        _epoch: u32,
        id: u64,
        field: usize,
        offset: u64,
        out: &mut [u8],
    ) -> Result<(), SourceError> {
        if id >= self.len {
            return Err(SourceError::OutOfRange { id, len: self.len });
        }
        let Some(f) = self.fields.get(field).and_then(SourceField::fixed) else {
            return Err(SourceError::Buffers {
                problem: format!(
                    "field {field} asked of a source with {} fields",
                    self.fields.len()
                ),
            });
        };
        let sample_bytes = f.sample_bytes();
        if offset
            .checked_add(out.len() as u64)
            .is_none_or(|end| end > sample_bytes)
        {
            return Err(SourceError::Buffers {
                problem: format!(
                    "bytes {offset}..{} of field {:?} asked, but a sample's field has {sample_bytes}",
                    offset.saturating_add(out.len() as u64),
                    f.name
                ),
            });
        }
        if field == 1 {
            // Checked: a second field is the labels array.
            self.read_labels(id, offset, out)
        } else {
            self.read_data(id, offset, out)
        }
    }
}
