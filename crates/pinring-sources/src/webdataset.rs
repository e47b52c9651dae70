//! WebDataset tar shards (`kind = "webdataset"`).
//!
//! **Samples.** Each shard (`dataset.webdataset.shards`, its globs expanded by the caller;
//! ustar, GNU or PAX tar, uncompressed) is indexed once at open: the `tar` crate walks the headers, and each regular member's data offset
//! ([`tar::Entry::raw_file_position`]) and size are kept; reads are `pread`s of those bytes
//! later. As in WebDataset, a member `dir/key.ext` has the key `dir/key` (the path up to the
//! first dot of the base name) and the extension `ext` (the rest, lower-cased); consecutive
//! members with the same key form one sample. Regular members whose base name has no dot (or
//! starts with one: `README`, `__meta__`, macOS's `._key.jpg`) belong to no sample and are
//! skipped, as WebDataset does, and reported: [`WebDataset::unowned_members`] counts them per
//! shard, naming the first, and the open logs that as a warning. Directories and links are
//! skipped, and so are members of an extension no configured field asks for (they still belong
//! to their key's sample: a key whose members are all of such extensions is an incomplete
//! sample).
//!
//! The fields (`dataset.fields`, default `["image", "cls"]`), each required in every sample:
//!
//! | config | extensions | field | kind |
//! | --- | --- | --- | --- |
//! | `image` | `jpg`, `jpeg`, `png` | `images` | encoded bytes |
//! | `cls` | `cls` | `labels` | `i64`, shape `[]` (ASCII integer, whitespace trimmed) |
//! | `json` | `json` | `json` | encoded bytes |
//! | `npy` | `npy` | [`WdsConfig::npy`]'s `field` | fixed: its `dtype` and `shape` (the array's data) |
//! | `npy` without [`WdsConfig::npy`] | `npy` | `npy` | encoded bytes (the whole `.npy` member) |
//!
//! **`.npy` members** (pinring's config: `[dataset.webdataset] npy = { field, dtype, shape }`).
//! With [`WdsConfig::npy`] each sample's `npy` member must hold one array of that dtype and
//! shape, so the field is fixed and known before a shard is opened. Reading the sample parses
//! the member's header with the npy parser of [`crate::npy`] ([`NpyHeader::read_at`], which
//! reads only the member's bytes), checks it (little-endian or one byte, C order, the dtype,
//! the shape, and a member exactly as long as header plus data), and `pread`s the data straight
//! into the caller's field buffer. A member that fails is a per-sample [`WdsError::Npy`] naming
//! the shard, the member, its byte offset and the [`NpyProblem`] (what was found, what was
//! expected), so the caller's `on_bad_sample` applies. The index does not read members, so
//! [`WebDataset::bad_samples`] does not list bad `npy` members.
//!
//! **`json` members** are not fields of pinring's config kind: a batch field has a dtype and
//! per-sample shape known before any file is read (the slot layout depends on it), and a JSON
//! document has neither. The reader hands them to Rust callers as encoded bytes.
//!
//! **Ids.** Samples are numbered in shard order, then member order: id = global position. A
//! group that lacks a field, or has two members for one field, is still numbered, but reading
//! it is a per-sample error ([`WdsError::Incomplete`], [`WdsError::Duplicate`]);
//! [`WebDataset::bad_samples`] lists them at open.
//!
//! **Epoch order** (the delivery order: [`pinring_data::Plan::with_shards`], computed in
//! [`pinring_data::shard_order`] and re-exported here as [`ShardOrder`], [`epoch_order_for`]
//! and [`rank_stream`]). Shard `i` belongs to rank `i % world`. With `plan.shuffle`, for
//! `(seed, epoch, rank)` the rank's shards are put in a Fisher-Yates order drawn from
//! `SplitMix64` seeded by `(seed, epoch, rank)`, their samples are streamed in that order (each
//! shard's in member order), and the stream goes through a shuffle buffer of `buffer` samples
//! (`dataset.webdataset.shuffle_buffer`): once the buffer is full, each incoming sample evicts a
//! uniformly drawn one (the same generator), and at the end the rest leave in random order.
//! Without `plan.shuffle` the rank's shards stream in index order, with no buffer. The orders of
//! all ranks are disjoint and cover every sample; a sample never leaves more than `buffer - 1`
//! places before its position in the stream (it may leave later: a shuffle buffer bounds the
//! lead, not the delay). Ranks get different counts (shards differ in size), and the plan evens
//! them out so that every rank has the same number of batches: with `plan.drop_last` each rank
//! truncates its order to the smallest rank's count, otherwise each pads its order to the
//! largest rank's count by repeating from the start of its own order. More ranks than shards, or
//! a rank whose shards hold no sample, is a config error. The loader records
//! [`WebDataset::shard_sizes`] in the config (`dataset.webdataset.shard_samples`, part of the
//! fingerprint), so daemon, loaders and consumers compute the same plan.
//!
//! **Bad data.** A shard that cannot be opened, a corrupt header, a member cut short by a
//! truncated file, or a shard that ends without tar's end-of-archive marker (two zero blocks:
//! cut between members, [`WdsError::NoEndMarker`]) fails the open with an error naming the
//! shard, the member and the byte offset (the caller may drop the shard and open again). These
//! fail the open whatever the caller's `on_bad_sample`: the shard's sample count (which the
//! plan's shard order follows) is not known, and the missing samples have no ids to skip. A bad
//! sample (incomplete, duplicate members, a `.cls` that is not an integer, a bad `.npy` member)
//! is an error of that sample's read only.

use std::fs::File;
use std::io::{self, Read, Seek};
use std::path::PathBuf;

use pinring_data::Dtype;
use serde::{Deserialize, Serialize};

use crate::npy::{NpyDtype, NpyError, NpyHeader};
use crate::{check_bufs, fixed, pread, show, FieldBuf, Source, SourceError, SourceField};

pub use pinring_data::shard_order::{epoch_order_for, rank_stream, ShardOrder};

/// Longest `.cls` member read (an integer with some whitespace).
pub const MAX_CLS_BYTES: u64 = 64;

/// A field of a WebDataset sample (`dataset.fields`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WdsField {
    /// `jpg`/`jpeg`/`png` bytes, field `images`.
    Image,
    /// `cls` integer label, field `labels`.
    Cls,
    /// `json` bytes, field `json`.
    Json,
    /// `npy` member: with [`WdsConfig::npy`] the fixed field it declares (the array's data),
    /// otherwise the member's bytes, field `npy`.
    Npy,
}

impl WdsField {
    /// Whether extension `ext` (lower-cased) is this field's.
    pub fn matches(self, ext: &str) -> bool {
        match self {
            WdsField::Image => matches!(ext, "jpg" | "jpeg" | "png"),
            WdsField::Cls => ext == "cls",
            WdsField::Json => ext == "json",
            WdsField::Npy => ext == "npy",
        }
    }

    /// The config name.
    pub const fn name(self) -> &'static str {
        match self {
            WdsField::Image => "image",
            WdsField::Cls => "cls",
            WdsField::Json => "json",
            WdsField::Npy => "npy",
        }
    }

    fn source_field(self, npy: Option<&WdsNpy>) -> SourceField {
        match self {
            WdsField::Image => SourceField::Encoded {
                name: pinring_data::IMAGES.into(),
            },
            WdsField::Cls => fixed(pinring_data::LABELS, Dtype::I64, vec![]),
            WdsField::Json => SourceField::Encoded {
                name: "json".into(),
            },
            WdsField::Npy => match npy {
                Some(n) => fixed(&n.field, n.dtype.field_dtype(), n.shape.clone()),
                None => SourceField::Encoded { name: "npy".into() },
            },
        }
    }
}

/// The array every `npy` member holds ([`WdsConfig::npy`]): the member's data becomes a fixed
/// field of this name, dtype and shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WdsNpy {
    /// The field's name.
    pub field: String,
    /// The members' dtype (little-endian, or one byte).
    pub dtype: NpyDtype,
    /// The members' shape (`[]`: one value), in C order.
    pub shape: Vec<u32>,
}

/// What is wrong with an `npy` member ([`WdsError::Npy`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NpyProblem {
    /// The header is corrupt, cut short, or describes data pinring does not read (Fortran
    /// order): the parser's message.
    Header {
        /// Byte offset of the problem in the shard.
        offset: u64,
        /// What the parser found.
        problem: String,
    },
    /// Another dtype (or a big-endian or non-numeric one).
    Dtype {
        /// The header's dtype.
        found: String,
        /// The configured dtype (numpy's name).
        expected: &'static str,
    },
    /// Another shape.
    Shape {
        /// The header's shape.
        found: Vec<u64>,
        /// The configured shape.
        expected: Vec<u64>,
    },
    /// The member is shorter (truncated) or longer than its header and data.
    Size {
        /// The member's bytes.
        found: u64,
        /// Header plus data.
        expected: u64,
    },
}

impl std::fmt::Display for NpyProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NpyProblem::Header { offset, problem } => write!(
                f,
                "has no valid .npy header (at byte offset {offset}: {problem}), expected a \
                 .npy header of version 1.0, 2.0 or 3.0 for a little-endian C-order array"
            ),
            NpyProblem::Dtype { found, expected } => write!(
                f,
                "holds dtype {found}, expected {expected} (dataset.webdataset.npy.dtype)"
            ),
            NpyProblem::Shape { found, expected } => write!(
                f,
                "holds shape {found:?}, expected {expected:?} (dataset.webdataset.npy.shape)"
            ),
            NpyProblem::Size { found, expected } => write!(
                f,
                "is {found} bytes long, expected {expected} (its header and data){}",
                if found < expected {
                    ": it is truncated"
                } else {
                    ": it has bytes after its array"
                }
            ),
        }
    }
}

fn default_fields() -> Vec<WdsField> {
    vec![WdsField::Image, WdsField::Cls]
}

/// The `[dataset]` keys of `kind = "webdataset"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WdsConfig {
    /// The tar shards, in order.
    pub shards: Vec<PathBuf>,
    /// The fields every sample must have, in order.
    #[serde(default = "default_fields")]
    pub fields: Vec<WdsField>,
    /// Samples in the shuffle buffer of [`WebDataset::epoch_order`] (0 or 1: none).
    #[serde(default = "default_shuffle_buffer")]
    pub shuffle_buffer: usize,
    /// The array of the `npy` members, making [`WdsField::Npy`] a fixed field; `None`: the
    /// members' bytes (an encoded field named `npy`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub npy: Option<WdsNpy>,
}

/// Default `shuffle_buffer`.
pub const DEFAULT_SHUFFLE_BUFFER: usize = 1000;

fn default_shuffle_buffer() -> usize {
    DEFAULT_SHUFFLE_BUFFER
}

/// Errors of [`WebDataset`].
#[derive(Debug, thiserror::Error)]
pub enum WdsError {
    /// A key is out of range.
    #[error("invalid dataset.{key}: {problem}")]
    Param {
        /// Key name.
        key: &'static str,
        /// What is wrong.
        problem: String,
    },
    /// A shard cannot be opened.
    #[error("cannot open shard {shard}: {source}; check dataset.webdataset.shards")]
    Open {
        /// The shard.
        shard: String,
        /// The cause.
        source: io::Error,
    },
    /// A shard is a directory.
    #[error("shard {shard} is a directory, not a tar file: name the .tar files in it in dataset.webdataset.shards, or give a glob such as \"{shard}/*.tar\"")]
    Directory {
        /// The shard, as opened.
        shard: String,
    },
    /// The tar structure is corrupt.
    #[error("shard {shard} is not a valid tar file after member {member:?} (next header at byte offset {offset}): {source}; rewrite the shard or drop it from dataset.shards")]
    Corrupt {
        /// The shard.
        shard: String,
        /// The last good member ("" if none).
        member: String,
        /// Where the bad header was expected.
        offset: u64,
        /// The cause.
        source: io::Error,
    },
    /// A member's data runs past the end of the shard.
    #[error("shard {shard} is truncated: member {member:?} at byte offset {offset} needs {size} bytes, {missing} are missing; copy the shard again or drop it from dataset.shards")]
    Truncated {
        /// The shard.
        shard: String,
        /// The member.
        member: String,
        /// Its data offset.
        offset: u64,
        /// Its size.
        size: u64,
        /// Bytes past the end of the file.
        missing: u64,
    },
    /// The shard ends without tar's end-of-archive marker: it was cut short between members
    /// (on a 512-byte block boundary), so members past the cut are missing.
    #[error("shard {shard} is truncated: it ends at byte offset {offset}, {after}, without tar's end-of-archive marker (two 512-byte zero blocks; {found}), so the members after that point are missing; copy (or download) the shard again, or re-write it (tar and Python's tarfile end an archive with the marker), or drop it from dataset.shards", after = after_member(member), found = end_found(*tail))]
    NoEndMarker {
        /// The shard.
        shard: String,
        /// The last member ("" if none).
        member: String,
        /// Where the shard ends (its length).
        offset: u64,
        /// Zero bytes after the last member's data and padding (fewer than 1024).
        tail: u64,
    },
    /// A member of a kind pinring does not read (a sparse file).
    #[error("shard {shard}: member {member:?} at byte offset {offset} is a sparse file, which pinring does not read; rewrite the shard without --sparse")]
    Sparse {
        /// The shard.
        shard: String,
        /// The member.
        member: String,
        /// Its header offset.
        offset: u64,
    },
    /// A sample lacks a field (per sample).
    #[error("shard {shard}: sample {key:?} (first member at byte offset {offset}) has no {missing} member, so it is not a complete sample; add the member or set dataset.on_bad_sample = \"skip\"")]
    Incomplete {
        /// The shard.
        shard: String,
        /// The sample key.
        key: String,
        /// Data offset of its first member.
        offset: u64,
        /// The missing field (its config name).
        missing: &'static str,
    },
    /// A sample has two members for one field (per sample).
    #[error("shard {shard}: sample {key:?} has two {field} members, {member:?} at byte offset {offset} is the second; keep one, or set dataset.on_bad_sample = \"skip\"")]
    Duplicate {
        /// The shard.
        shard: String,
        /// The sample key.
        key: String,
        /// The field's config name.
        field: &'static str,
        /// The second member.
        member: String,
        /// Its data offset.
        offset: u64,
    },
    /// A `.cls` member is not an integer (per sample).
    #[error("shard {shard}: member {member:?} at byte offset {offset} is not an ASCII integer label ({text:?}); fix the shard or set dataset.on_bad_sample = \"skip\"")]
    Cls {
        /// The shard.
        shard: String,
        /// The member.
        member: String,
        /// Its data offset.
        offset: u64,
        /// The first bytes of the member.
        text: String,
    },
    /// An `npy` member does not hold the configured array (per sample).
    #[error("shard {shard}: member {member:?} at byte offset {offset} {problem}; rewrite it with numpy.save of a C-order array of the dtype and shape of dataset.webdataset.npy (or fix those), or set dataset.on_bad_sample = \"skip\"")]
    Npy {
        /// The shard.
        shard: String,
        /// The member.
        member: String,
        /// Its data offset.
        offset: u64,
        /// What was found and what was expected.
        problem: NpyProblem,
    },
    /// A read failed (the shard changed since open; per sample).
    #[error("reading member {member:?} ({len} bytes at byte offset {offset}) of shard {shard} failed: {source}; the shard changed or became unreadable since the source was opened: restore it")]
    Read {
        /// The shard.
        shard: String,
        /// The member.
        member: String,
        /// Data offset.
        offset: u64,
        /// Bytes asked for.
        len: u64,
        /// The cause.
        source: io::Error,
    },
}

fn after_member(member: &str) -> String {
    if member.is_empty() {
        "before any member".into()
    } else {
        format!("after member {member:?}")
    }
}

fn end_found(tail: u64) -> String {
    match tail {
        0 => "it has none".into(),
        512 => "it has one".into(),
        n => format!("it has {n} zero bytes"),
    }
}

/// tar's end-of-archive marker: two zero blocks after the last member.
const END_MARKER: usize = 1024;

/// One regular member of a shard, as indexed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Its path in the archive.
    pub path: String,
    /// Byte offset of its data in the shard.
    pub offset: u64,
    /// Bytes of data.
    pub size: u64,
}

/// Indexes the regular members of the tar archive in `reader` (`len` bytes; `shard` names it in
/// errors). The archive must end with tar's end-of-archive marker (two 512-byte zero blocks
/// after the last member, as tar and Python's `tarfile` write it): a shard that ends without it
/// was cut short between members ([`WdsError::NoEndMarker`]), and one zero block followed by
/// anything but a second one is a corrupt archive ([`WdsError::Corrupt`]); what follows the
/// marker is ignored, as tar does. Never panics on any input.
pub fn index_tar<R: Read + Seek>(
    shard: &str,
    reader: R,
    len: u64,
) -> Result<Vec<Member>, WdsError> {
    let mut archive = tar::Archive::new(reader);
    let mut members = Vec::new();
    let mut last = String::new();
    let mut next = 0u64;
    let corrupt = |member: &str, offset: u64, source: io::Error| WdsError::Corrupt {
        shard: shard.into(),
        member: member.into(),
        offset,
        source,
    };
    let entries = archive.entries_with_seek().map_err(|e| corrupt("", 0, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| corrupt(&last, next, e))?;
        let path = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let offset = entry.raw_file_position();
        let size = entry.size();
        next = offset.saturating_add(size.saturating_add(511) & !511);
        let kind = entry.header().entry_type();
        if kind.is_gnu_sparse() {
            return Err(WdsError::Sparse {
                shard: shard.into(),
                member: path,
                offset: entry.raw_header_position(),
            });
        }
        last.clone_from(&path);
        if !kind.is_file() && !kind.is_contiguous() {
            continue;
        }
        let end = offset.saturating_add(size);
        if end > len {
            return Err(WdsError::Truncated {
                shard: shard.into(),
                member: path,
                offset,
                size,
                missing: end - len,
            });
        }
        members.push(Member { path, offset, size });
    }
    // The entries end at the first zero block (or at the end of the file): check that the
    // marker's two zero blocks are there.
    let mut reader = archive.into_inner();
    let mut tail = Vec::with_capacity(END_MARKER);
    let read_tail = reader
        .seek(io::SeekFrom::Start(next))
        .and_then(|_| (&mut reader).take(END_MARKER as u64).read_to_end(&mut tail));
    read_tail.map_err(|e| corrupt(&last, next, e))?;
    if let Some(at) = tail.iter().position(|&b| b != 0) {
        let at = next.saturating_add(at as u64);
        return Err(corrupt(
            &last,
            next,
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "the zero block at byte offset {next} ends the archive, but byte offset \
                     {at} holds data, not tar's second zero block: a header was overwritten \
                     with zeros, and the members after it would be lost"
                ),
            ),
        ));
    }
    if tail.len() < END_MARKER {
        return Err(WdsError::NoEndMarker {
            shard: shard.into(),
            member: last,
            offset: next.saturating_add(tail.len() as u64).min(len),
            tail: tail.len() as u64,
        });
    }
    Ok(members)
}

/// WebDataset's split of a member path into `(key, extension)`: the key is the path up to the
/// first dot of the base name, the extension the rest, lower-cased. `None` when the base name
/// has no dot or starts with one.
pub fn split_key(path: &str) -> Option<(&str, String)> {
    let base_start = path.rfind('/').map_or(0, |i| i + 1);
    let dot = path[base_start..].find('.')?;
    if dot == 0 {
        return None;
    }
    let key_end = base_start + dot;
    Some((&path[..key_end], path[key_end + 1..].to_lowercase()))
}

/// Where a sample's field lies.
#[derive(Debug, Clone)]
struct Part {
    member: String,
    offset: u64,
    size: u64,
}

/// Why a sample cannot be read.
#[derive(Debug, Clone)]
enum Problem {
    Missing(&'static str),
    Duplicate {
        field: &'static str,
        member: String,
        offset: u64,
    },
}

#[derive(Debug, Clone)]
struct Sample {
    shard: u32,
    key: String,
    /// Data offset of the first member.
    offset: u64,
    parts: Vec<Option<Part>>,
    problem: Option<Problem>,
}

#[derive(Debug)]
struct Shard {
    path: PathBuf,
    file: File,
}

/// An open set of WebDataset shards ([`Source`] of `kind = "webdataset"`).
#[derive(Debug)]
pub struct WebDataset {
    shards: Vec<Shard>,
    /// Samples per shard.
    shard_sizes: Vec<u64>,
    samples: Vec<Sample>,
    config_fields: Vec<WdsField>,
    shuffle_buffer: usize,
    fields: Vec<SourceField>,
    /// The configured array of the `npy` members (a fixed field), if any.
    npy: Option<WdsNpy>,
    /// Per shard with any: the members that belong to no sample.
    unowned: Vec<Unowned>,
    scratch: Vec<u8>,
}

/// Members of one shard that belong to no sample: regular files whose base name has no dot, or
/// starts with one ([`split_key`] gives no key), e.g. `README`, `__meta__` or macOS's `._x.jpg`.
/// They are skipped, as WebDataset skips them, and reported ([`WebDataset::unowned_members`], and
/// a warning at open).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unowned {
    /// The shard.
    pub shard: String,
    /// How many such members it has.
    pub count: u64,
    /// The first one.
    pub member: String,
    /// Its data offset.
    pub offset: u64,
}

impl std::fmt::Display for Unowned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "shard {}: {} member{} belong{} to no sample and {} skipped (a base name without an \
             extension, or starting with a dot, has no sample key), the first {:?} at byte offset \
             {}; if one holds a sample's data, re-write the shard with it named key.ext",
            self.shard,
            self.count,
            if self.count == 1 { "" } else { "s" },
            if self.count == 1 { "s" } else { "" },
            if self.count == 1 { "is" } else { "are" },
            self.member,
            self.offset
        )
    }
}

/// Groups `members` of shard `shard` into samples (appended to `out`); returns the members that
/// belong to no sample, as `(count, first)`.
fn group(
    shard: u32,
    members: Vec<Member>,
    fields: &[WdsField],
    out: &mut Vec<Sample>,
) -> Option<(u64, Member)> {
    let mut unowned: Option<(u64, Member)> = None;
    let mut current: Option<Sample> = None;
    let finish = |s: Option<Sample>, out: &mut Vec<Sample>| {
        if let Some(mut s) = s {
            if s.problem.is_none() {
                if let Some(i) = s.parts.iter().position(Option::is_none) {
                    s.problem = Some(Problem::Missing(fields[i].name()));
                }
            }
            out.push(s);
        }
    };
    for m in members {
        let Some((key, ext)) = split_key(&m.path) else {
            match &mut unowned {
                Some((n, _)) => *n += 1,
                None => unowned = Some((1, m)),
            }
            continue;
        };
        if current.as_ref().is_none_or(|s| s.key != key) {
            finish(current.take(), out);
            current = Some(Sample {
                shard,
                key: key.to_string(),
                offset: m.offset,
                parts: vec![None; fields.len()],
                problem: None,
            });
        }
        let Some(s) = current.as_mut() else { continue };
        let Some(i) = fields.iter().position(|f| f.matches(&ext)) else {
            continue;
        };
        if s.parts[i].is_some() {
            if s.problem.is_none() {
                s.problem = Some(Problem::Duplicate {
                    field: fields[i].name(),
                    member: m.path.clone(),
                    offset: m.offset,
                });
            }
            continue;
        }
        s.parts[i] = Some(Part {
            member: m.path,
            offset: m.offset,
            size: m.size,
        });
    }
    finish(current, out);
    unowned
}

impl WebDataset {
    /// Opens and indexes every shard of `config`.
    pub fn open(config: &WdsConfig) -> Result<WebDataset, WdsError> {
        if config.shards.is_empty() {
            return Err(WdsError::Param {
                key: "shards",
                problem: "no shards; list at least one tar file".into(),
            });
        }
        if config.fields.is_empty() {
            return Err(WdsError::Param {
                key: "fields",
                problem: "no fields; list some of \"image\", \"cls\", \"json\", \"npy\"".into(),
            });
        }
        for (i, f) in config.fields.iter().enumerate() {
            if config.fields[..i].contains(f) {
                return Err(WdsError::Param {
                    key: "fields",
                    problem: format!("{:?} is listed twice", f.name()),
                });
            }
        }
        if let Some(n) = &config.npy {
            if !config.fields.contains(&WdsField::Npy) {
                return Err(WdsError::Param {
                    key: "npy",
                    problem: "declares the npy members' array, and dataset.fields has no \"npy\"; \
                              add it or drop dataset.npy"
                        .into(),
                });
            }
            if n.field.is_empty() {
                return Err(WdsError::Param {
                    key: "npy.field",
                    problem: "the field needs a name".into(),
                });
            }
        }
        let fields: Vec<SourceField> = config
            .fields
            .iter()
            .map(|f| f.source_field(config.npy.as_ref()))
            .collect();
        for (i, f) in fields.iter().enumerate() {
            if fields[..i].iter().any(|g| g.name() == f.name()) {
                return Err(WdsError::Param {
                    key: "npy.field",
                    problem: format!(
                        "{:?} is also the name of another field; field names must differ, \
                         rename the npy field",
                        f.name()
                    ),
                });
            }
        }
        let mut shards = Vec::with_capacity(config.shards.len());
        let mut samples = Vec::new();
        let mut shard_sizes = Vec::with_capacity(config.shards.len());
        let mut unowned = Vec::new();
        for (i, path) in config.shards.iter().enumerate() {
            let open_err = |source| WdsError::Open {
                shard: show(path),
                source,
            };
            let file = crate::open_data_file(path).map_err(|e| {
                match crate::NotAFile::of(&e).filter(|n| n.is_dir()) {
                    Some(_) => WdsError::Directory { shard: show(path) },
                    None => open_err(e),
                }
            })?;
            let len = file.metadata().map_err(open_err)?.len();
            let members = index_tar(&show(path), &file, len)?;
            let before = samples.len();
            if let Some((count, first)) = group(i as u32, members, &config.fields, &mut samples) {
                let u = Unowned {
                    shard: show(path),
                    count,
                    member: first.path,
                    offset: first.offset,
                };
                tracing::warn!("{u}");
                unowned.push(u);
            }
            shard_sizes.push((samples.len() - before) as u64);
            shards.push(Shard {
                path: path.clone(),
                file,
            });
        }
        Ok(WebDataset {
            shards,
            shard_sizes,
            samples,
            fields,
            config_fields: config.fields.clone(),
            shuffle_buffer: config.shuffle_buffer,
            npy: config.npy.clone(),
            unowned,
            scratch: Vec::new(),
        })
    }

    /// The members that belong to no sample ([`Unowned`]), one entry per shard that has any;
    /// each was also logged as a warning when the shard was opened.
    pub fn unowned_members(&self) -> &[Unowned] {
        &self.unowned
    }

    /// `shuffle_buffer` of the config (the `buffer` to pass [`WebDataset::epoch_order`]).
    pub fn shuffle_buffer(&self) -> usize {
        self.shuffle_buffer
    }

    /// Samples in each shard, in shard order.
    pub fn shard_sizes(&self) -> &[u64] {
        &self.shard_sizes
    }

    /// The ids of the samples that cannot be read (incomplete or with duplicate members), with
    /// the error reading them gives.
    pub fn bad_samples(&self) -> Vec<(u64, WdsError)> {
        self.samples
            .iter()
            .enumerate()
            .filter_map(|(id, s)| self.problem(s).map(|e| (id as u64, e)))
            .collect()
    }

    /// Sample `id`'s key (`dir/key` in its shard) and shard index.
    pub fn key(&self, id: u64) -> Option<(&str, usize)> {
        let s = self.samples.get(usize::try_from(id).ok()?)?;
        Some((&s.key, s.shard as usize))
    }

    /// The sample ids rank `rank` of `world` streams in `epoch` with shuffling, before the plan
    /// evens the ranks' counts out (see the module docs and [`epoch_order_for`]).
    pub fn epoch_order(
        &self,
        seed: u64,
        epoch: u32,
        rank: u32,
        world: u32,
        buffer: usize,
    ) -> Vec<u64> {
        epoch_order_for(&self.shard_sizes, seed, epoch, rank, world, buffer)
    }

    fn problem(&self, s: &Sample) -> Option<WdsError> {
        let shard = show(&self.shards[s.shard as usize].path);
        match s.problem.as_ref()? {
            Problem::Missing(missing) => Some(WdsError::Incomplete {
                shard,
                key: s.key.clone(),
                offset: s.offset,
                missing,
            }),
            Problem::Duplicate {
                field,
                member,
                offset,
            } => Some(WdsError::Duplicate {
                shard,
                key: s.key.clone(),
                field,
                member: member.clone(),
                offset: *offset,
            }),
        }
    }
}

impl Source for WebDataset {
    fn len(&self) -> u64 {
        self.samples.len() as u64
    }

    fn fields(&self) -> &[SourceField] {
        &self.fields
    }

    fn shard_sizes(&self) -> Option<&[u64]> {
        Some(&self.shard_sizes)
    }

    fn locate(&self, id: u64) -> Option<String> {
        let s = self.samples.get(usize::try_from(id).ok()?)?;
        let shard = show(&self.shards[s.shard as usize].path);
        let k = self
            .config_fields
            .iter()
            .position(|f| matches!(f, WdsField::Image | WdsField::Json | WdsField::Npy));
        Some(match k.and_then(|k| s.parts[k].as_ref()) {
            Some(p) => format!(
                "shard {shard}, member {:?} at byte offset {}",
                p.member, p.offset
            ),
            None => format!(
                "shard {shard}, sample {:?} at byte offset {}",
                s.key, s.offset
            ),
        })
    }

    fn origin(&self, id: u64) -> Option<(u32, u64)> {
        let s = self.samples.get(usize::try_from(id).ok()?)?;
        let image = self
            .config_fields
            .iter()
            .position(|f| matches!(f, WdsField::Image))
            .and_then(|k| s.parts[k].as_ref());
        Some((s.shard, image.map_or(s.offset, |p| p.offset)))
    }

    fn read(&mut self, _epoch: u32, id: u64, out: &mut [FieldBuf<'_>]) -> Result<(), SourceError> {
        check_bufs(&self.fields, out)?;
        let len = self.len();
        let Some(s) = usize::try_from(id).ok().and_then(|i| self.samples.get(i)) else {
            return Err(SourceError::OutOfRange { id, len });
        };
        if let Some(e) = self.problem(s) {
            return Err(e.into());
        }
        let shard = &self.shards[s.shard as usize];
        for ((f, part), buf) in self.config_fields.iter().zip(&s.parts).zip(out.iter_mut()) {
            let Some(part) = part else { continue };
            let read_err = |len: u64, source| WdsError::Read {
                shard: show(&shard.path),
                member: part.member.clone(),
                offset: part.offset,
                len,
                source,
            };
            match (f, buf) {
                (WdsField::Cls, FieldBuf::Fixed(o)) => {
                    let n = part.size.min(MAX_CLS_BYTES);
                    self.scratch.resize(n as usize, 0);
                    pread(&shard.file, &mut self.scratch, part.offset)
                        .map_err(|e| read_err(n, e))?;
                    let text = std::str::from_utf8(&self.scratch).unwrap_or("").trim();
                    let v = (part.size <= MAX_CLS_BYTES)
                        .then(|| text.parse::<i64>().ok())
                        .flatten()
                        .ok_or_else(|| WdsError::Cls {
                            shard: show(&shard.path),
                            member: part.member.clone(),
                            offset: part.offset,
                            text: String::from_utf8_lossy(&self.scratch).into_owned(),
                        })?;
                    o.copy_from_slice(&v.to_le_bytes());
                }
                (WdsField::Npy, FieldBuf::Fixed(o)) => {
                    let Some(want) = &self.npy else { continue }; // check_bufs: fixed with npy
                    read_npy_member(&shard.path, &shard.file, part, want, o, &mut self.scratch)?;
                }
                (_, FieldBuf::Bytes(v)) => {
                    v.clear();
                    v.resize(part.size as usize, 0);
                    pread(&shard.file, v, part.offset).map_err(|e| read_err(part.size, e))?;
                }
                _ => {} // check_bufs matched the fields
            }
        }
        Ok(())
    }
}

/// Reads `npy` member `part` of `file` (shard `shard`) into `out`: parses its header (the npy
/// parser's [`NpyHeader::read_at`], reading only the member's bytes), checks its dtype, shape and
/// size against `want`, and reads its data straight into `out` (whose length is then the data's).
fn read_npy_member(
    shard: &std::path::Path,
    file: &File,
    part: &Part,
    want: &WdsNpy,
    out: &mut [u8],
    scratch: &mut Vec<u8>,
) -> Result<(), WdsError> {
    let bad = |problem| WdsError::Npy {
        shard: show(shard),
        member: part.member.clone(),
        offset: part.offset,
        problem,
    };
    let read_err = |len: u64, source| WdsError::Read {
        shard: show(shard),
        member: part.member.clone(),
        offset: part.offset,
        len,
        source,
    };
    let expected = want.dtype.name();
    let h = match NpyHeader::read_at(&part.member, file, part.offset, part.size, scratch) {
        Ok(h) => h,
        Err(e) => {
            return Err(match e {
                NpyError::Read { len, source, .. } => read_err(len, source),
                NpyError::Header {
                    offset, problem, ..
                } => bad(NpyProblem::Header {
                    offset: part.offset.saturating_add(offset),
                    problem,
                }),
                NpyError::BigEndian { descr, .. } => bad(NpyProblem::Dtype {
                    found: format!("{descr:?} (big-endian)"),
                    expected,
                }),
                NpyError::UnsupportedDtype { descr, .. } => bad(NpyProblem::Dtype {
                    found: format!("{descr:?} (not a number pinring reads)"),
                    expected,
                }),
                NpyError::FortranOrder { .. } => bad(NpyProblem::Header {
                    offset: part.offset,
                    problem: "the array is in Fortran order".into(),
                }),
                e => bad(NpyProblem::Header {
                    offset: part.offset,
                    problem: e.to_string(),
                }),
            })
        }
    };
    if h.dtype != want.dtype {
        return Err(bad(NpyProblem::Dtype {
            found: h.dtype.name().into(),
            expected,
        }));
    }
    if !h
        .shape
        .iter()
        .copied()
        .eq(want.shape.iter().map(|&d| u64::from(d)))
    {
        return Err(bad(NpyProblem::Shape {
            found: h.shape,
            expected: want.shape.iter().map(|&d| u64::from(d)).collect(),
        }));
    }
    let need = h.data_offset.saturating_add(h.data_bytes);
    if part.size != need || h.data_bytes != out.len() as u64 {
        return Err(bad(NpyProblem::Size {
            found: part.size,
            expected: need,
        }));
    }
    pread(file, out, part.offset + h.data_offset).map_err(|e| read_err(h.data_bytes, e))
}
