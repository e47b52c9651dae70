//! Per-batch metadata written by a loader into its slot after the payload.
//!
//! [`BatchMeta`] is encoded with bincode 2 (`config::standard()`, varint
//! integers, little endian) straight into the slot's metadata area. The daemon
//! decodes it from shared memory that another process wrote, so [`BatchMeta::decode`]
//! treats its input as hostile: it never panics and caps how much it reads and
//! allocates.

use std::fmt;

use bincode::config::{Configuration, Limit, LittleEndian, Varint};
use bincode::enc::write::SizeWriter;
use serde::{Deserialize, Serialize};

use crate::plan::{BatchIndices, ByteRange};

/// Hard upper bound (bytes) on an encoded [`BatchMeta`]; [`BatchMeta::decode`]
/// never reads more than this, whatever limit the caller passes.
pub const MAX_META_BYTES: usize = 64 << 20;

type MetaConfig = Configuration<LittleEndian, Varint, Limit<MAX_META_BYTES>>;

fn bincode_config() -> MetaConfig {
    bincode::config::standard().with_limit::<MAX_META_BYTES>()
}

/// Element type of a sample.
///
/// Read from a config by its pinring name ([`Dtype::name`]); a NumPy or PyTorch spelling
/// (`"float32"`, `"torch.bfloat16"`, `"int64"`, `"half"`) is refused with the pinring name that
/// means the same type ([`Dtype::from_other_name`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, bincode::Encode, bincode::Decode)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    Bf16,
    /// IEEE single precision.
    F32,
    /// IEEE double precision.
    F64,
    /// Boolean, one byte (0 or 1).
    Bool,
    /// Signed 8-bit integer.
    I8,
    /// Signed 16-bit integer.
    I16,
    /// Unsigned 16-bit integer.
    U16,
    /// Unsigned 32-bit integer.
    U32,
    /// Unsigned 64-bit integer.
    U64,
}

impl Dtype {
    /// All dtypes, in declaration order (new ones are appended: the order is the metadata's
    /// encoding).
    pub const ALL: [Dtype; 13] = [
        Dtype::U8,
        Dtype::I32,
        Dtype::I64,
        Dtype::F16,
        Dtype::Bf16,
        Dtype::F32,
        Dtype::F64,
        Dtype::Bool,
        Dtype::I8,
        Dtype::I16,
        Dtype::U16,
        Dtype::U32,
        Dtype::U64,
    ];

    /// Size of one element in bytes.
    pub const fn size_of(self) -> usize {
        match self {
            Dtype::U8 | Dtype::Bool | Dtype::I8 => 1,
            Dtype::F16 | Dtype::Bf16 | Dtype::I16 | Dtype::U16 => 2,
            Dtype::I32 | Dtype::F32 | Dtype::U32 => 4,
            Dtype::I64 | Dtype::F64 | Dtype::U64 => 8,
        }
    }

    /// The name used in config files (`"f32"`, `"bf16"`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Dtype::U8 => "u8",
            Dtype::I32 => "i32",
            Dtype::I64 => "i64",
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
            Dtype::F32 => "f32",
            Dtype::F64 => "f64",
            Dtype::Bool => "bool",
            Dtype::I8 => "i8",
            Dtype::I16 => "i16",
            Dtype::U16 => "u16",
            Dtype::U32 => "u32",
            Dtype::U64 => "u64",
        }
    }

    /// A stable numeric code (used by the config fingerprint).
    pub const fn code(self) -> u8 {
        match self {
            Dtype::U8 => 0,
            Dtype::I32 => 1,
            Dtype::I64 => 2,
            Dtype::F16 => 3,
            Dtype::Bf16 => 4,
            Dtype::F32 => 5,
            Dtype::F64 => 6,
            Dtype::Bool => 7,
            Dtype::I8 => 8,
            Dtype::I16 => 9,
            Dtype::U16 => 10,
            Dtype::U32 => 11,
            Dtype::U64 => 12,
        }
    }
}

impl Dtype {
    /// The dtype a config names `name` by: its pinring name only.
    pub fn from_name(name: &str) -> Option<Dtype> {
        Dtype::ALL.into_iter().find(|d| d.name() == name)
    }

    /// The pinring dtype that a NumPy or PyTorch spelling means (`"float32"`, `"np.float32"`,
    /// `"torch.float32"`, `"<f4"`, `"half"`, `"long"`, ...), for the hint of a refused name.
    /// Names whose width differs between the two libraries (`"float"`, `"int"`) have none.
    pub fn from_other_name(name: &str) -> Option<Dtype> {
        let n = name.trim().to_ascii_lowercase();
        let n = ["torch.", "numpy.", "np."]
            .iter()
            .find_map(|p| n.strip_prefix(p))
            .unwrap_or(&n)
            .to_string();
        if let Some(d) = Dtype::from_name(&n) {
            return Some(d);
        }
        Some(match n.as_str() {
            "uint8" | "|u1" | "u1" | "ubyte" => Dtype::U8,
            "int8" | "|i1" | "i1" | "byte" => Dtype::I8,
            "int16" | "<i2" | "i2" | "short" => Dtype::I16,
            "uint16" | "<u2" | "u2" | "ushort" => Dtype::U16,
            "int32" | "<i4" | "i4" | "intc" => Dtype::I32,
            "uint32" | "<u4" | "u4" | "uintc" => Dtype::U32,
            "int64" | "<i8" | "long" | "int_" | "longlong" => Dtype::I64,
            "uint64" | "<u8" | "ulonglong" => Dtype::U64,
            "float16" | "<f2" | "f2" | "half" => Dtype::F16,
            "bfloat16" => Dtype::Bf16,
            "float32" | "<f4" | "f4" | "single" => Dtype::F32,
            "float64" | "<f8" | "f8" | "double" | "float_" => Dtype::F64,
            "bool_" | "|b1" | "b1" | "boolean" => Dtype::Bool,
            _ => return None,
        })
    }

    /// Why `name` is not a dtype, and which one it may mean.
    fn refusal(name: &str) -> String {
        let all: Vec<&str> = Dtype::ALL.iter().map(|d| d.name()).collect();
        match Dtype::from_other_name(name) {
            Some(d) => format!(
                "unknown dtype {name:?}: pinring calls it \"{d}\" (write dtype = \"{d}\"); the \
                 dtypes are {}",
                all.join(", ")
            ),
            None => format!("unknown dtype {name:?}; the dtypes are {}", all.join(", ")),
        }
    }
}

/// [`Dtype`]'s derived form, for formats that are not human-readable (bincode's metadata:
/// the variant's index): the same variants in the same order.
#[derive(Deserialize)]
#[serde(remote = "Dtype", rename_all = "lowercase")]
enum DtypeIndex {
    U8,
    I32,
    I64,
    F16,
    Bf16,
    F32,
    F64,
    Bool,
    I8,
    I16,
    U16,
    U32,
    U64,
}

impl<'de> Deserialize<'de> for Dtype {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        if !d.is_human_readable() {
            return DtypeIndex::deserialize(d);
        }
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Dtype;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a dtype name such as \"f32\" or \"u8\"")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Dtype, E> {
                Dtype::from_name(v).ok_or_else(|| E::custom(Dtype::refusal(v)))
            }
        }
        d.deserialize_str(V)
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Errors from encoding, decoding or checking a [`BatchMeta`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetaError {
    /// The metadata area of the slot is too small.
    #[error("batch metadata for seq {seq} needs {needed} bytes but the slot's metadata area has {available}; increase ring.slot_bytes (or use \"auto\")")]
    TooSmall {
        /// Batch sequence number.
        seq: u64,
        /// Encoded size.
        needed: usize,
        /// Space available.
        available: usize,
    },
    /// bincode failed to encode (should not happen for well-formed values).
    #[error("cannot encode batch metadata for seq {seq}: {message}")]
    Encode {
        /// Batch sequence number.
        seq: u64,
        /// bincode's message.
        message: String,
    },
    /// The bytes are not a valid encoded [`BatchMeta`].
    #[error("corrupt batch metadata ({len} bytes read from the slot, limit {limit}): {message}; the loader that wrote this slot may be from a different build or crashed mid-write")]
    Decode {
        /// Length of the input considered.
        len: usize,
        /// Limit in force.
        limit: usize,
        /// bincode's message.
        message: String,
    },
    /// The metadata disagrees with the plan.
    #[error("batch metadata field {field} is {found} but the plan says {expected} (seq {seq}); loader and daemon disagree: make sure both use the same config (compare fingerprints)")]
    Mismatch {
        /// Batch sequence number expected by the plan.
        seq: u64,
        /// Field that differs (e.g. `sample_ids[3]`).
        field: String,
        /// Value according to the plan.
        expected: String,
        /// Value found in the metadata.
        found: String,
    },
}

/// Metadata of one batch, stored in the slot after the payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchMeta {
    /// Global batch sequence number (see [`crate::Plan::batch`]).
    pub seq: u64,
    /// Epoch the batch belongs to.
    pub epoch: u32,
    /// Index of the batch within its epoch (for this rank).
    pub index_in_epoch: u64,
    /// Dataset indices of the samples, in payload order.
    pub sample_ids: Vec<u64>,
    /// One label per sample, or none (samples without an integer `labels` field).
    pub labels: Vec<u32>,
    /// Shape of one sample's first field (`images`).
    pub sample_shape: Vec<u32>,
    /// Element type of the first field.
    pub dtype: Dtype,
    /// Bytes of payload in the slot: samples × record bytes (all fields, field-major;
    /// [`crate::Config::record_bytes`]), or a byte part's ([`crate::BatchLayout::part_payload_bytes`]).
    pub payload_bytes: u64,
    /// For a byte part of a sample: the range of the sample's cut field it carries (the plan's,
    /// [`crate::Part::bytes`]); `None` for a part of whole samples.
    pub byte_range: Option<ByteRange>,
}

/// Upper bound on the encoded size of a [`BatchMeta`] with `batch_size`
/// samples and an `ndims`-dimensional sample shape.
///
/// Varint bounds: u64 <= 9 bytes, u32 <= 5 bytes, lengths <= 9 bytes, the
/// enum tag <= 5 bytes.
pub const fn max_encoded_len(batch_size: u64, ndims: u64) -> u64 {
    // seq + epoch + index_in_epoch + 3 vec lengths + dtype + payload_bytes + byte_range (option
    // tag and two u64)
    let fixed = 9 + 5 + 9 + 3 * 9 + 5 + 9 + (1 + 9 + 9);
    fixed + batch_size.saturating_mul(9 + 5) + ndims.saturating_mul(5)
}

impl BatchMeta {
    /// Metadata for the batch (part) `indices` of samples with the given shape and dtype (of
    /// their `images` field) and `record_bytes` bytes over all fields.
    pub fn new(
        indices: &BatchIndices,
        labels: Vec<u32>,
        sample_shape: Vec<u32>,
        dtype: Dtype,
        record_bytes: u64,
    ) -> Self {
        BatchMeta {
            seq: indices.seq,
            epoch: indices.epoch,
            index_in_epoch: indices.index_in_epoch,
            sample_ids: indices.samples.clone(),
            labels,
            sample_shape,
            dtype,
            payload_bytes: (indices.samples.len() as u64).saturating_mul(record_bytes),
            byte_range: None,
        }
    }

    /// This metadata for a byte part carrying `range` of its sample's cut field, with
    /// `payload_bytes` of payload ([`crate::BatchLayout::part_payload_bytes`]).
    pub fn with_byte_range(mut self, range: ByteRange, payload_bytes: u64) -> Self {
        self.byte_range = Some(range);
        self.payload_bytes = payload_bytes;
        self
    }

    /// Exact encoded size in bytes.
    pub fn encoded_len(&self) -> usize {
        let mut w = SizeWriter::default();
        match bincode::serde::encode_into_writer(self, &mut w, bincode_config()) {
            Ok(()) => w.bytes_written,
            Err(_) => usize::MAX,
        }
    }

    /// Encodes into `out` (the slot's metadata area), returning the number
    /// of bytes written. Fails without a partial guarantee on `out` if the
    /// encoding does not fit.
    pub fn encode_into(&self, out: &mut [u8]) -> Result<usize, MetaError> {
        match bincode::serde::encode_into_slice(self, out, bincode_config()) {
            Ok(n) => Ok(n),
            Err(bincode::error::EncodeError::UnexpectedEnd) => Err(MetaError::TooSmall {
                seq: self.seq,
                needed: self.encoded_len(),
                available: out.len(),
            }),
            Err(e) => Err(MetaError::Encode {
                seq: self.seq,
                message: e.to_string(),
            }),
        }
    }

    /// Decodes metadata from untrusted bytes. Reads at most
    /// `min(limit, MAX_META_BYTES)` bytes of `bytes`; trailing bytes are
    /// ignored. Never panics; allocation is bounded by the limit.
    pub fn decode(bytes: &[u8], limit: usize) -> Result<BatchMeta, MetaError> {
        Self::decode_prefix(bytes, limit).map(|(m, _)| m)
    }

    /// Like [`BatchMeta::decode`], also returning the number of bytes consumed.
    pub fn decode_prefix(bytes: &[u8], limit: usize) -> Result<(BatchMeta, usize), MetaError> {
        let limit = limit.min(MAX_META_BYTES);
        let input = &bytes[..bytes.len().min(limit)];
        bincode::serde::decode_from_slice::<BatchMeta, _>(input, bincode_config()).map_err(|e| {
            MetaError::Decode {
                len: input.len(),
                limit,
                message: e.to_string(),
            }
        })
    }

    /// [`BatchMeta::decode`] then [`BatchMeta::validate_against`], without building the
    /// metadata: the encoding is walked field by field and compared with the plan as it is
    /// read, so a part that matches costs no allocation (the daemon checks every part it
    /// takes; at 64 KiB slots the decode's three vectors were a tenth of its main loop).
    /// Whenever the walk meets anything other than the expected value, the two-step path runs
    /// and its error is returned, so the answer and the message are always theirs.
    pub fn check_encoded(
        bytes: &[u8],
        limit: usize,
        expected: &BatchIndices,
        range: Option<ByteRange>,
        sample_bytes: u64,
        payload_bytes: u64,
    ) -> Result<(), MetaError> {
        if matches_encoded(bytes, limit, expected, range, sample_bytes, payload_bytes) {
            return Ok(());
        }
        Self::decode(bytes, limit)?.validate_against(expected, range, sample_bytes, payload_bytes)
    }

    /// Checks that this metadata describes exactly the batch (part) the plan
    /// expects (`expected`, and for a byte part the range `bytes` of its sample's cut field)
    /// with samples whose first field has `sample_bytes` bytes and a payload of `payload_bytes`
    /// (all fields; [`crate::BatchLayout::part_payload_bytes`]): seq, epoch, index in epoch,
    /// sample ids, label count, shape, byte range and payload size.
    pub fn validate_against(
        &self,
        expected: &BatchIndices,
        bytes: Option<ByteRange>,
        sample_bytes: u64,
        payload_bytes: u64,
    ) -> Result<(), MetaError> {
        let mismatch = |field: &str, exp: String, found: String| MetaError::Mismatch {
            seq: expected.seq,
            field: field.to_string(),
            expected: exp,
            found,
        };
        if self.seq != expected.seq {
            return Err(mismatch(
                "seq",
                expected.seq.to_string(),
                self.seq.to_string(),
            ));
        }
        if self.epoch != expected.epoch {
            return Err(mismatch(
                "epoch",
                expected.epoch.to_string(),
                self.epoch.to_string(),
            ));
        }
        if self.index_in_epoch != expected.index_in_epoch {
            return Err(mismatch(
                "index_in_epoch",
                expected.index_in_epoch.to_string(),
                self.index_in_epoch.to_string(),
            ));
        }
        if self.sample_ids.len() != expected.samples.len() {
            return Err(mismatch(
                "sample_ids.len()",
                expected.samples.len().to_string(),
                self.sample_ids.len().to_string(),
            ));
        }
        if let Some(i) =
            (0..self.sample_ids.len()).find(|&i| self.sample_ids[i] != expected.samples[i])
        {
            return Err(mismatch(
                &format!("sample_ids[{i}]"),
                expected.samples[i].to_string(),
                self.sample_ids[i].to_string(),
            ));
        }
        // No labels: a sample without an integer `labels` field (kind = "external").
        if !self.labels.is_empty() && self.labels.len() != self.sample_ids.len() {
            return Err(mismatch(
                "labels.len()",
                self.sample_ids.len().to_string(),
                self.labels.len().to_string(),
            ));
        }
        let shape_bytes = self
            .sample_shape
            .iter()
            .try_fold(self.dtype.size_of() as u64, |acc, &d| {
                acc.checked_mul(d as u64)
            });
        if shape_bytes != Some(sample_bytes) {
            return Err(mismatch(
                "sample_shape x dtype",
                format!("{sample_bytes} bytes per sample"),
                format!(
                    "{:?} x {} = {}",
                    self.sample_shape,
                    self.dtype,
                    shape_bytes.map_or_else(|| "overflow".to_string(), |b| format!("{b} bytes"))
                ),
            ));
        }
        if self.byte_range != bytes {
            let show = |r: Option<ByteRange>| match r {
                Some(r) => format!(
                    "bytes {}..{} of the sample's cut field",
                    r.offset,
                    r.offset.saturating_add(r.len)
                ),
                None => "whole samples".to_string(),
            };
            return Err(mismatch("byte_range", show(bytes), show(self.byte_range)));
        }
        if self.payload_bytes != payload_bytes {
            return Err(mismatch(
                "payload_bytes",
                payload_bytes.to_string(),
                self.payload_bytes.to_string(),
            ));
        }
        Ok(())
    }
}

/// Whether `bytes` (at most `limit` of them, and [`MAX_META_BYTES`]) hold the encoding of a
/// [`BatchMeta`] that [`BatchMeta::validate_against`] accepts for these arguments. Reads
/// bincode's own encodings of the fields in declaration order (what the serde encoding of
/// the struct is, byte for byte: varint integers, a varint length before each vector, a
/// varint variant index, a one-byte option tag); false at the first byte that is not the
/// expected value, or could not be decoded.
fn matches_encoded(
    bytes: &[u8],
    limit: usize,
    expected: &BatchIndices,
    range: Option<ByteRange>,
    sample_bytes: u64,
    payload_bytes: u64,
) -> bool {
    use bincode::de::{read::SliceReader, DecoderImpl};
    use bincode::Decode;

    let input = &bytes[..bytes.len().min(limit.min(MAX_META_BYTES))];
    let mut d = DecoderImpl::new(SliceReader::new(input), bincode_config(), ());
    let mut walk = || -> Result<bool, bincode::error::DecodeError> {
        let n = expected.samples.len() as u64;
        if u64::decode(&mut d)? != expected.seq
            || u32::decode(&mut d)? != expected.epoch
            || u64::decode(&mut d)? != expected.index_in_epoch
            || u64::decode(&mut d)? != n
        {
            return Ok(false);
        }
        for &id in &expected.samples {
            if u64::decode(&mut d)? != id {
                return Ok(false);
            }
        }
        // Labels: none, or one per sample (their values are the loader's).
        let labels = u64::decode(&mut d)?;
        if labels != 0 && labels != n {
            return Ok(false);
        }
        for _ in 0..labels {
            u32::decode(&mut d)?;
        }
        // The shape's dimensions times the dtype's size: the first field's bytes per sample.
        // Multiplied in another order than `validate_against`'s, so only a nonzero size is
        // answered here: then no dimension is 0 and neither order overflows. A size of 0, a
        // product that overflows, or more dimensions than bytes left: the two-step path says.
        let dims = u64::decode(&mut d)?;
        if dims > input.len() as u64 || sample_bytes == 0 {
            return Ok(false);
        }
        let mut product = Some(1u64);
        for _ in 0..dims {
            let dim = u32::decode(&mut d)?;
            product = product.and_then(|p| p.checked_mul(u64::from(dim)));
        }
        let Some(dtype) = Dtype::ALL.get(u32::decode(&mut d)? as usize) else {
            return Ok(false);
        };
        if product.and_then(|p| p.checked_mul(dtype.size_of() as u64)) != Some(sample_bytes)
            || u64::decode(&mut d)? != payload_bytes
        {
            return Ok(false);
        }
        let found = match u8::decode(&mut d)? {
            0 => None,
            1 => Some(ByteRange {
                offset: u64::decode(&mut d)?,
                len: u64::decode(&mut d)?,
            }),
            _ => return Ok(false),
        };
        Ok(found == range)
    };
    walk().unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample_meta(n: usize) -> (BatchMeta, BatchIndices) {
        let idx = BatchIndices {
            seq: 7,
            epoch: 1,
            index_in_epoch: 3,
            samples: (0..n as u64).map(|i| i * 1_000_003).collect(),
        };
        let labels = (0..n as u32).map(|i| i % 1000).collect();
        let m = BatchMeta::new(&idx, labels, vec![3, 4], Dtype::F32, 56);
        (m, idx)
    }

    #[test]
    fn roundtrip_and_validate() {
        let (m, idx) = sample_meta(32);
        let mut buf = vec![0u8; 4096];
        let n = m.encode_into(&mut buf).unwrap();
        assert_eq!(n, m.encoded_len());
        assert!(n as u64 <= max_encoded_len(32, 2));
        let back = BatchMeta::decode(&buf, 4096).unwrap();
        assert_eq!(back, m);
        back.validate_against(&idx, None, 48, 56 * idx.samples.len() as u64)
            .unwrap();
        assert_eq!(back.payload_bytes, 32 * 56, "images and labels");
    }

    #[test]
    fn too_small_names_sizes() {
        let (m, _) = sample_meta(32);
        let mut buf = vec![0u8; 10];
        let e = m.encode_into(&mut buf).unwrap_err();
        match &e {
            MetaError::TooSmall {
                needed, available, ..
            } => {
                assert_eq!(*available, 10);
                assert_eq!(*needed, m.encoded_len());
            }
            other => panic!("{other:?}"),
        }
        assert!(e.to_string().contains("slot_bytes"));
    }

    #[test]
    fn max_len_is_an_upper_bound_for_extreme_values() {
        let n = 100;
        let m = BatchMeta {
            seq: u64::MAX,
            epoch: u32::MAX,
            index_in_epoch: u64::MAX,
            sample_ids: vec![u64::MAX; n],
            labels: vec![u32::MAX; n],
            sample_shape: vec![u32::MAX; 5],
            dtype: Dtype::F64,
            payload_bytes: u64::MAX,
            byte_range: Some(ByteRange {
                offset: u64::MAX,
                len: u64::MAX,
            }),
        };
        assert!(m.encoded_len() as u64 <= max_encoded_len(n as u64, 5));
    }

    #[test]
    fn validate_detects_mismatches() {
        let (m, idx) = sample_meta(4);
        let mut bad = m.clone();
        bad.sample_ids[2] += 1;
        let e = bad
            .validate_against(&idx, None, 48, 56 * idx.samples.len() as u64)
            .unwrap_err()
            .to_string();
        assert!(e.contains("sample_ids[2]"), "{e}");
        let mut bad = m.clone();
        bad.seq = 8;
        assert!(bad
            .validate_against(&idx, None, 48, 56 * idx.samples.len() as u64)
            .is_err());
        let mut bad = m.clone();
        bad.payload_bytes = 1;
        assert!(bad
            .validate_against(&idx, None, 48, 56 * idx.samples.len() as u64)
            .is_err());
        let mut bad = m.clone();
        bad.labels.pop();
        assert!(bad
            .validate_against(&idx, None, 48, 56 * idx.samples.len() as u64)
            .is_err());
        assert!(m.validate_against(&idx, None, 40, 48 * 4).is_err());
        // A payload of the images alone (the format before fields) is refused.
        let mut old = m.clone();
        old.payload_bytes = 4 * 48;
        let e = old
            .validate_against(&idx, None, 48, 56 * idx.samples.len() as u64)
            .unwrap_err()
            .to_string();
        assert!(e.contains("payload_bytes"), "{e}");
    }

    #[test]
    fn a_byte_part_must_carry_the_planned_range() {
        let (m, idx) = sample_meta(1);
        let r = ByteRange {
            offset: 4096,
            len: 4096,
        };
        let part = m.with_byte_range(r, 4096);
        let mut buf = vec![0u8; 4096];
        let n = part.encode_into(&mut buf).unwrap();
        assert!(n as u64 <= max_encoded_len(1, 2));
        let back = BatchMeta::decode(&buf, 4096).unwrap();
        back.validate_against(&idx, Some(r), 48, 4096).unwrap();
        // Another range, a whole sample where a range is planned, and the reverse: refused,
        // each naming the byte range.
        let other = ByteRange {
            offset: 0,
            len: 4096,
        };
        let e = back
            .validate_against(&idx, Some(other), 48, 4096)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("byte_range") && e.contains("bytes 0..4096"),
            "{e}"
        );
        assert!(back.validate_against(&idx, None, 48, 4096).is_err());
        let (whole, _) = sample_meta(1);
        let e = whole
            .validate_against(&idx, Some(r), 48, 56)
            .unwrap_err()
            .to_string();
        assert!(e.contains("whole samples"), "{e}");
        // The right range with the wrong payload length.
        assert!(back.validate_against(&idx, Some(r), 48, 4104).is_err());
    }

    #[test]
    fn forged_length_is_rejected_without_huge_allocation() {
        // seq, epoch, index, then a vec length claiming 2^60 elements.
        let mut bytes = vec![1u8, 1, 1, 253];
        bytes.extend_from_slice(&(1u64 << 60).to_le_bytes());
        bytes.extend_from_slice(&[0u8; 64]);
        assert!(BatchMeta::decode(&bytes, 1 << 20).is_err());
    }

    /// The two-step check `check_encoded` must always agree with.
    fn two_step(
        bytes: &[u8],
        limit: usize,
        idx: &BatchIndices,
        range: Option<ByteRange>,
        sample_bytes: u64,
        payload: u64,
    ) -> Result<(), MetaError> {
        BatchMeta::decode(bytes, limit)?.validate_against(idx, range, sample_bytes, payload)
    }

    #[test]
    fn the_check_without_decoding_accepts_the_planned_part_and_refuses_with_the_same_message() {
        let (m, idx) = sample_meta(32);
        let mut buf = vec![0u8; 4096];
        m.encode_into(&mut buf).unwrap();
        BatchMeta::check_encoded(&buf, 4096, &idx, None, 48, 56 * 32).unwrap();
        let mut bad = m.clone();
        bad.sample_ids[5] += 1;
        bad.encode_into(&mut buf).unwrap();
        let e = BatchMeta::check_encoded(&buf, 4096, &idx, None, 48, 56 * 32).unwrap_err();
        assert_eq!(
            Err(e.clone()),
            two_step(&buf, 4096, &idx, None, 48, 56 * 32)
        );
        assert!(e.to_string().contains("sample_ids[5]"), "{e}");
        // Cut short by the limit: the decode's error.
        let e = BatchMeta::check_encoded(&buf, 10, &idx, None, 48, 56 * 32).unwrap_err();
        assert!(matches!(e, MetaError::Decode { limit: 10, .. }), "{e:?}");
    }

    proptest! {
        #[test]
        fn the_check_without_decoding_agrees_with_decode_and_validate(
            n in 0usize..12,
            ids_seed: u64,
            with_labels: bool,
            shape in proptest::collection::vec(0u32..70_000, 0..4),
            dt in 0usize..13,
            ranged: bool,
            change in 0usize..12,
            delta in 1u64..300,
            flip in proptest::option::of((any::<usize>(), any::<u8>())),
            cut in proptest::option::of(any::<usize>()),
            limit_cut in proptest::option::of(0usize..200),
        ) {
            let idx = BatchIndices {
                seq: ids_seed % 1_000,
                epoch: (ids_seed % 7) as u32,
                index_in_epoch: ids_seed % 250,
                samples: (0..n as u64).map(|i| ids_seed.wrapping_mul(i + 1) >> 3).collect(),
            };
            let dtype = Dtype::ALL[dt];
            let sample_bytes = shape.iter().fold(dtype.size_of() as u64, |a, &d| a * u64::from(d));
            let range = ranged.then_some(ByteRange { offset: delta, len: 4096 });
            let payload = sample_bytes * n as u64 + 8;
            let labels = if with_labels { (0..n as u32).collect() } else { Vec::new() };
            let mut m = BatchMeta::new(&idx, labels, shape.clone(), dtype, 0);
            m.payload_bytes = payload;
            m.byte_range = range;
            // One field away from the plan (or none).
            match change {
                0 => m.seq += delta,
                1 => m.epoch = m.epoch.wrapping_add(delta as u32),
                2 => m.index_in_epoch += delta,
                3 if n > 0 => m.sample_ids[(delta as usize) % n] ^= delta,
                4 => m.sample_ids.push(delta),
                5 if n > 0 => { m.labels.pop(); }
                6 => m.sample_shape.push(delta as u32),
                7 => m.dtype = Dtype::ALL[(dt + delta as usize) % 13],
                8 => m.payload_bytes += delta,
                9 => m.byte_range = if ranged { None } else { Some(ByteRange { offset: 0, len: delta }) },
                _ => {}
            }
            let mut buf = vec![0u8; 4096];
            let mut len = m.encode_into(&mut buf).unwrap();
            if let Some((at, x)) = flip {
                buf[at % len.max(1)] ^= x;
            }
            if let Some(c) = cut {
                len = c % (len + 1);
            }
            let limit = limit_cut.unwrap_or(4096);
            let bytes = &buf[..len];
            prop_assert_eq!(
                BatchMeta::check_encoded(bytes, limit, &idx, range, sample_bytes, payload),
                two_step(bytes, limit, &idx, range, sample_bytes, payload)
            );
        }

        #[test]
        fn decode_garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512), limit in 0usize..1024) {
            let _ = BatchMeta::decode(&bytes, limit);
        }

        #[test]
        fn roundtrip(seq: u64, epoch: u32, index_in_epoch: u64,
                     ids in proptest::collection::vec(any::<u64>(), 0..64),
                     shape in proptest::collection::vec(any::<u32>(), 0..6),
                     dt in 0usize..7, payload: u64) {
            let labels = ids.iter().map(|&i| i as u32).collect::<Vec<_>>();
            let m = BatchMeta { seq, epoch, index_in_epoch, sample_ids: ids.clone(), labels,
                sample_shape: shape.clone(), dtype: Dtype::ALL[dt], payload_bytes: payload,
                byte_range: (payload % 2 == 1).then_some(ByteRange { offset: seq, len: payload }) };
            let cap = max_encoded_len(ids.len() as u64, shape.len() as u64) as usize;
            let mut buf = vec![0u8; cap];
            let n = m.encode_into(&mut buf).unwrap();
            prop_assert!(n <= cap);
            let (back, used) = BatchMeta::decode_prefix(&buf, cap).unwrap();
            prop_assert_eq!(used, n);
            prop_assert_eq!(back, m);
        }
    }
}
