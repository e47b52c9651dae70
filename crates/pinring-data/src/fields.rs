//! Named fields of a sample, and where each field of a batch lies in the batch's device buffer.
//!
//! Every sample of a dataset has the same named fields ([`Field`]: a name, an element type and a
//! per-sample shape), in a fixed order; [`crate::Config::fields`] gives them for a config. For
//! `kind = "synthetic"` they are:
//!
//! | field | dtype | per-sample shape |
//! | --- | --- | --- |
//! | `images` | `dataset.dtype` | `dataset.sample_shape` |
//! | `labels` | `i64` | `[]` (one value) |
//!
//! **In a slot** a part's payload is *field-major*: for each field in order, that field of all
//! the part's samples, contiguous. A part of `n` samples holds `n × record_bytes` bytes, and
//! field `f`'s chunk starts at `n × (per-sample bytes of the fields before f)`
//! ([`FieldPlacement::chunk_in_part`]); no padding, no alignment. Labels are little-endian `i64`.
//!
//! **In a device buffer** each field of a batch is one contiguous tensor, batch dimension first
//! (`[B, ...shape]`), starting at a multiple of [`FIELD_ALIGN`] (16 bytes) ([`BatchLayout`]).
//! The daemon copies each field chunk of each part to `offset + first sample of the part ×
//! per-sample bytes` of its field. A batch with fewer samples than `B` (the tail batch with
//! `plan.drop_last = false`) keeps the offsets of a full batch; only its shapes and byte counts
//! shrink ([`BatchLayout::placements`]).
//!
//! **A byte part** (a sample too large for one part, cut by the plan: [`crate::plan::SampleCut`])
//! carries one sample's byte range of its *cut field* (the largest, [`BatchLayout::cut_field`]),
//! and the sample's first byte part carries the sample's other fields whole as well: its payload
//! is field-major like any part's, with the cut field's chunk being that range. The daemon
//! copies the range to `offset + sample × sample_bytes + range offset` of the cut field.

use crate::encoded::ENTRY_BYTES;
use crate::meta::Dtype;
use crate::plan::ByteRange;

/// Name of the sample field (`dataset.sample_shape` of `dataset.dtype`).
pub const IMAGES: &str = "images";
/// Name of the label field (one `i64` per sample).
pub const LABELS: &str = "labels";
/// Alignment of every field's start in a batch's device buffer: 16 bytes, the widest vector
/// load (a `float4`), so kernels over any field keep their vectorized path. Small on purpose:
/// a whole batch's payload is field-major and unpadded in its slot, so when every field but the
/// last fills a multiple of 16 bytes (most shapes: 65,504 bytes of images, 2,049 u16 tokens × 8)
/// the fields lie in the device buffer exactly as in the slot and the batch goes up in one copy.
/// With 256 most batches needed a second, tiny copy for their labels, and each tiny copy cost
/// the copy engine as much as a 256 KiB one (docs/ARCHITECTURE.md, "Upload signals"). The
/// first field, and the buffer, stay 256-byte aligned (`cuMemAlloc`).
pub const FIELD_ALIGN: u64 = 16;

/// One named field of every sample: its element type and per-sample shape (in a config:
/// `{ name = "images", dtype = "u8", shape = [224, 224, 3] }`).
#[derive(
    Debug,
    Clone,
    PartialEq,
    Eq,
    Hash,
    serde::Serialize,
    serde::Deserialize,
    bincode::Encode,
    bincode::Decode,
)]
#[serde(deny_unknown_fields)]
pub struct Field {
    /// The field's name (`"images"`, `"labels"`).
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Shape of the field in one sample (`[]`: one element).
    #[serde(default)]
    pub shape: Vec<u32>,
}

impl Field {
    /// A field `name` of `shape` elements of `dtype` per sample.
    pub fn new(name: impl Into<String>, dtype: Dtype, shape: Vec<u32>) -> Field {
        Field {
            name: name.into(),
            dtype,
            shape,
        }
    }

    /// Elements per sample: the product of the shape (1 for `[]`), saturating.
    pub fn elements(&self) -> u64 {
        self.shape
            .iter()
            .fold(1u64, |acc, &d| acc.saturating_mul(u64::from(d)))
    }

    /// Bytes of the field per sample (elements × dtype size), saturating.
    pub fn sample_bytes(&self) -> u64 {
        self.elements().saturating_mul(self.dtype.size_of() as u64)
    }
}

/// Where one field of a batch lies in the batch's device buffer, and in a part's payload.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FieldPlacement {
    /// The field's name.
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Shape of the field's tensor in the device buffer, batch dimension first:
    /// `[samples, ...per-sample shape]`.
    pub shape: Vec<u64>,
    /// Byte offset of the tensor in the device buffer (a multiple of [`FIELD_ALIGN`]; the same
    /// for a full and a short batch).
    pub offset: u64,
    /// Bytes of the tensor (`samples × sample_bytes`).
    pub bytes: u64,
    /// Bytes of the field per sample.
    pub sample_bytes: u64,
    /// Per-sample bytes of the fields before this one in a slot (their `wire_bytes`): in the
    /// payload of a part of `n` samples, this field's chunk starts at `n × record_offset`
    /// ([`FieldPlacement::chunk_in_part`]).
    pub record_offset: u64,
    /// Bytes of the field per sample in a slot: `sample_bytes`, or for an encoded field
    /// ([`FieldPlacement::encoded`]) its entry and its share of the part's arena.
    pub wire_bytes: u64,
    /// Whether the slot carries the field encoded (`[dataset.image] decode = "gpu"`): a part's
    /// chunk is an [`crate::EncodedChunk`] that the copier decodes into the field's tensor.
    pub encoded: bool,
}

impl FieldPlacement {
    /// Where this field's chunk lies in the field-major payload of a part of `samples` samples:
    /// `(offset, bytes)` = `(samples × record_offset, samples × wire_bytes)`, saturating.
    pub fn chunk_in_part(&self, samples: u64) -> (u64, u64) {
        (
            samples.saturating_mul(self.record_offset),
            samples.saturating_mul(self.wire_bytes),
        )
    }

    /// Byte offset in the device buffer of sample `index` of the batch (the destination of a
    /// part's chunk whose first sample is sample `index` of its batch), saturating.
    pub fn sample_offset(&self, index: u64) -> u64 {
        self.offset
            .saturating_add(index.saturating_mul(self.sample_bytes))
    }
}

/// One copy of a part's upload ([`BatchLayout::part_copies`]): field `field`'s chunk of the
/// part's payload (in its slot) to where those samples' values go in the field's tensor (in the
/// batch's device buffer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ChunkCopy {
    /// Index of the field in [`BatchLayout::fields`].
    pub field: usize,
    /// Byte offset of the chunk in the part's payload.
    pub src_offset: u64,
    /// Bytes to copy.
    pub len: u64,
    /// Byte offset of the destination in the batch's device buffer.
    pub dst_offset: u64,
    /// For an encoded field's chunk (an [`crate::EncodedChunk`]): its samples, to decode into
    /// `samples × sample_bytes` at `dst_offset` rather than copy; `None`: a copy of `len` bytes.
    pub decode: Option<u32>,
}

/// How a batch's fields lie in its device buffer ([`crate::Config::batch_layout`]): each field
/// one contiguous tensor `[B, ...]`, in field order, each starting at a multiple of
/// [`FIELD_ALIGN`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BatchLayout {
    /// Samples in a full batch (`B`).
    pub batch_size: u32,
    /// The fields of a full batch, in order (the first at offset 0).
    pub fields: Vec<FieldPlacement>,
    /// Bytes of one sample over all fields (the sum of the fields' `sample_bytes`): a part of
    /// `n` samples has a payload of `n × record_bytes`.
    pub record_bytes: u64,
    /// Bytes of the device buffer of one batch: the end of the last field of a full batch.
    pub total_bytes: u64,
    /// Index of the field byte parts cut: the largest per sample, the first of equals (0 with
    /// no fields).
    pub cut_field: usize,
}

impl BatchLayout {
    /// The layout of batches of `batch_size` samples with `fields`: field `k` starts at the end
    /// of field `k - 1` rounded up to [`FIELD_ALIGN`] (the first at 0). Sizes saturate (a
    /// validated config never comes near).
    pub fn new(fields: &[Field], batch_size: u32) -> BatchLayout {
        BatchLayout::with_encoded(fields, batch_size, None)
    }

    /// As [`BatchLayout::new`], with field `encoded.0` carried encoded in the slots
    /// ([`crate::EncodedChunk`]): each sample brings an entry and `encoded.1` bytes of arena to a part.
    /// Byte parts never cut an encoded field (the config refuses a sample that does not fit a
    /// slot whole).
    pub fn with_encoded(
        fields: &[Field],
        batch_size: u32,
        encoded: Option<(usize, u64)>,
    ) -> BatchLayout {
        let b = u64::from(batch_size);
        let mut placed = Vec::with_capacity(fields.len());
        let (mut end, mut record) = (0u64, 0u64);
        for (k, f) in fields.iter().enumerate() {
            let offset = if placed.is_empty() { 0 } else { align_up(end) };
            let sample_bytes = f.sample_bytes();
            let share = encoded.filter(|&(e, _)| e == k).map(|(_, share)| share);
            let wire_bytes = share.map_or(sample_bytes, |s| ENTRY_BYTES.saturating_add(s));
            let bytes = b.saturating_mul(sample_bytes);
            let mut shape = Vec::with_capacity(f.shape.len() + 1);
            shape.push(b);
            shape.extend(f.shape.iter().map(|&d| u64::from(d)));
            placed.push(FieldPlacement {
                name: f.name.clone(),
                dtype: f.dtype,
                shape,
                offset,
                bytes,
                sample_bytes,
                record_offset: record,
                wire_bytes,
                encoded: share.is_some(),
            });
            end = offset.saturating_add(bytes);
            record = record.saturating_add(wire_bytes);
        }
        let mut cut_field = 0;
        for (k, f) in placed.iter().enumerate() {
            if f.wire_bytes > placed[cut_field].wire_bytes {
                cut_field = k;
            }
        }
        BatchLayout {
            batch_size,
            fields: placed,
            record_bytes: record,
            total_bytes: end,
            cut_field,
        }
    }

    /// The fields of a batch of `samples` samples: the offsets of a full batch, shapes
    /// `[samples, ...]` and `bytes = samples × sample_bytes`. A batch never holds more than
    /// `batch_size` samples; a larger `samples` is taken as `batch_size`.
    pub fn placements(&self, samples: u64) -> Vec<FieldPlacement> {
        let n = samples.min(u64::from(self.batch_size));
        self.fields
            .iter()
            .map(|f| {
                let mut p = f.clone();
                p.shape[0] = n;
                p.bytes = n.saturating_mul(p.sample_bytes);
                p
            })
            .collect()
    }

    /// The copies that move a part of `samples` samples, whose first sample is sample `first` of
    /// its batch, from its field-major payload into the batch's device buffer: one per field, in
    /// field order (a part of 0 samples gives copies of 0 bytes). For a byte part (`bytes`, of
    /// one sample) the cut field's copy is that range, to its place in the sample, and the other
    /// fields are copied whole from the sample's first byte part and not at all (0 bytes) from
    /// the others. Offsets saturate; for a part of a batch of this layout (`first + samples <=
    /// batch_size`, a range inside the cut field) every copy lies inside its field's tensor.
    pub fn part_copies(
        &self,
        samples: u64,
        first: u64,
        bytes: Option<ByteRange>,
    ) -> impl Iterator<Item = ChunkCopy> + '_ {
        let mut src = 0u64;
        self.fields.iter().enumerate().map(move |(field, f)| {
            let at = f.sample_offset(first);
            let (len, dst_offset) = match bytes {
                None => (samples.saturating_mul(f.wire_bytes), at),
                Some(r) if field == self.cut_field => (r.len, at.saturating_add(r.offset)),
                Some(r) if r.is_first() => (f.wire_bytes, at),
                Some(_) => (0, at),
            };
            let decode = match bytes {
                None => f
                    .encoded
                    .then(|| u32::try_from(samples).unwrap_or(u32::MAX)),
                Some(r) if f.encoded && field != self.cut_field && r.is_first() => Some(1),
                Some(_) => None,
            };
            let copy = ChunkCopy {
                field,
                src_offset: src,
                len,
                dst_offset,
                decode,
            };
            src = src.saturating_add(len);
            copy
        })
    }

    /// Payload bytes of a part: `samples × record_bytes`, or for a byte part of a sample
    /// (`bytes`) its range of the cut field, plus the sample's other fields in its first byte
    /// part ([`BatchLayout::part_copies`]). Saturating.
    pub fn part_payload_bytes(&self, samples: u64, bytes: Option<ByteRange>) -> u64 {
        match bytes {
            None => self.payload_bytes(samples),
            Some(r) if r.is_first() => r.len.saturating_add(self.others_bytes()),
            Some(r) => r.len,
        }
    }

    /// Per-sample bytes of the fields other than the cut field (what a sample's first byte part
    /// carries besides its range).
    pub fn others_bytes(&self) -> u64 {
        let cut = self.fields.get(self.cut_field).map_or(0, |f| f.wire_bytes);
        self.record_bytes.saturating_sub(cut)
    }

    /// The encoded field (`[dataset.image] decode = "gpu"`), if any.
    pub fn encoded_field(&self) -> Option<usize> {
        self.fields.iter().position(|f| f.encoded)
    }

    /// The field called `name` (of a full batch).
    pub fn field(&self, name: &str) -> Option<&FieldPlacement> {
        self.fields.iter().find(|f| f.name == name)
    }

    /// Payload bytes of a part (or a whole batch) of `samples` samples: `samples × record_bytes`,
    /// saturating.
    pub fn payload_bytes(&self, samples: u64) -> u64 {
        samples.saturating_mul(self.record_bytes)
    }
}

/// Rounds up to a multiple of [`FIELD_ALIGN`], saturating at the largest multiple.
fn align_up(v: u64) -> u64 {
    v.checked_next_multiple_of(FIELD_ALIGN)
        .unwrap_or(u64::MAX / FIELD_ALIGN * FIELD_ALIGN)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn synthetic_fields(dtype: Dtype, shape: Vec<u32>) -> Vec<Field> {
        vec![
            Field::new(IMAGES, dtype, shape),
            Field::new(LABELS, Dtype::I64, vec![]),
        ]
    }

    #[test]
    fn field_sizes() {
        let f = Field::new(IMAGES, Dtype::F32, vec![3, 4]);
        assert_eq!((f.elements(), f.sample_bytes()), (12, 48));
        let scalar = Field::new(LABELS, Dtype::I64, vec![]);
        assert_eq!((scalar.elements(), scalar.sample_bytes()), (1, 8));
    }

    #[test]
    fn fields_are_contiguous_tensors_at_aligned_offsets() {
        // 32 samples of 3 x 5 u8: images 480 bytes at 0, labels right after them at 480 (a
        // multiple of 16: no padding; `three_fields_each_start_aligned` pads).
        let l = BatchLayout::new(&synthetic_fields(Dtype::U8, vec![3, 5]), 32);
        assert_eq!(l.record_bytes, 15 + 8);
        let [images, labels] = &l.fields[..] else {
            panic!("{l:?}")
        };
        assert_eq!(images.name, IMAGES);
        assert_eq!(images.dtype, Dtype::U8);
        assert_eq!(images.shape, vec![32, 3, 5]);
        assert_eq!((images.offset, images.bytes), (0, 480));
        assert_eq!((images.sample_bytes, images.record_offset), (15, 0));
        assert_eq!(labels.name, LABELS);
        assert_eq!(labels.dtype, Dtype::I64);
        assert_eq!(labels.shape, vec![32]);
        assert_eq!((labels.offset, labels.bytes), (480, 256));
        assert_eq!((labels.sample_bytes, labels.record_offset), (8, 15));
        assert_eq!(l.total_bytes, 480 + 256);
        assert_eq!(l.field(LABELS), Some(labels));
        assert_eq!(l.field("masks"), None);
        for f in &l.fields {
            assert_eq!(f.offset % FIELD_ALIGN, 0, "{f:?}");
        }
    }

    #[test]
    fn an_aligned_end_adds_no_padding() {
        // 32 x 128 x 128 f32: 2 MiB of images, labels right after them.
        let l = BatchLayout::new(&synthetic_fields(Dtype::F32, vec![128, 128]), 32);
        assert_eq!(l.fields[1].offset, 2 << 20);
        assert_eq!(l.total_bytes, (2 << 20) + 32 * 8);
        assert_eq!(l.record_bytes, 65536 + 8);
    }

    #[test]
    fn a_tail_batch_keeps_the_offsets_and_shrinks_its_shapes() {
        let l = BatchLayout::new(&synthetic_fields(Dtype::U8, vec![3, 5]), 32);
        let tail = l.placements(7);
        assert_eq!(tail.len(), 2);
        for (t, full) in tail.iter().zip(&l.fields) {
            assert_eq!(t.offset, full.offset);
            assert_eq!(t.shape[0], 7);
            assert_eq!(t.shape[1..], full.shape[1..]);
            assert_eq!(t.bytes, 7 * full.sample_bytes);
        }
        assert_eq!(l.placements(32), l.fields);
        assert_eq!(l.placements(1000), l.fields, "no batch holds more than B");
        assert!(l
            .placements(0)
            .iter()
            .all(|p| p.bytes == 0 && p.shape[0] == 0));
    }

    #[test]
    fn an_encoded_field_brings_entries_and_its_share_to_a_slot_and_its_pixels_to_the_buffer() {
        // images 4 x 4 x 3 u8 carried encoded with a share of 100 bytes, then labels.
        let fields = synthetic_fields(Dtype::U8, vec![4, 4, 3]);
        let l = BatchLayout::with_encoded(&fields, 8, Some((0, 100)));
        let [images, labels] = &l.fields[..] else {
            panic!("{l:?}")
        };
        assert!(images.encoded && !labels.encoded);
        assert_eq!((images.sample_bytes, images.wire_bytes), (48, 164));
        assert_eq!((labels.record_offset, l.record_bytes), (164, 172));
        // The device buffer holds pixels, as without encoding.
        assert_eq!((labels.offset, l.total_bytes), (384, 384 + 64));
        assert_eq!(l.encoded_field(), Some(0));
        let copies: Vec<_> = l.part_copies(3, 5, None).collect();
        assert_eq!(
            copies,
            [
                ChunkCopy {
                    field: 0,
                    src_offset: 0,
                    len: 3 * 164,
                    dst_offset: 5 * 48,
                    decode: Some(3)
                },
                ChunkCopy {
                    field: 1,
                    src_offset: 3 * 164,
                    len: 24,
                    dst_offset: 384 + 40,
                    decode: None
                },
            ]
        );
        assert_eq!(l.payload_bytes(3), 3 * 172);
        assert_eq!(BatchLayout::new(&fields, 8).encoded_field(), None);
    }

    #[test]
    fn part_chunks_are_field_major() {
        let l = BatchLayout::new(&synthetic_fields(Dtype::U8, vec![3, 5]), 32);
        // A part of 4 samples: 60 bytes of images, then 32 bytes of labels; 92 in all.
        assert_eq!(l.fields[0].chunk_in_part(4), (0, 60));
        assert_eq!(l.fields[1].chunk_in_part(4), (60, 32));
        assert_eq!(l.payload_bytes(4), 92);
        // The part's first sample is sample 8 of its batch: where its chunks land.
        assert_eq!(l.fields[0].sample_offset(8), 120);
        assert_eq!(l.fields[1].sample_offset(8), 480 + 64);
    }

    /// A batch of `b` samples cut into parts of `spp`, each part's payload built field-major
    /// (sample `i`'s value of field `f` is bytes derived from `(f, i)`), then copied into a
    /// device buffer with `part_copies`: the buffer holds each field as one tensor at its
    /// offset, and nothing else was written.
    fn assemble(layout: &BatchLayout, b: u64, spp: u64) {
        let value = |f: usize, i: u64, k: u64| (f as u64 * 131 + i * 7 + k) as u8 | 1;
        let mut buffer = vec![0u8; layout.total_bytes as usize];
        let mut first = 0;
        while first < b {
            let n = spp.min(b - first);
            let mut payload = Vec::new();
            for (f, field) in layout.fields.iter().enumerate() {
                assert_eq!(payload.len() as u64, field.chunk_in_part(n).0);
                for i in first..first + n {
                    payload.extend((0..field.sample_bytes).map(|k| value(f, i, k)));
                }
            }
            assert_eq!(payload.len() as u64, layout.payload_bytes(n));
            for c in layout.part_copies(n, first, None) {
                let (src, dst, len) =
                    (c.src_offset as usize, c.dst_offset as usize, c.len as usize);
                buffer[dst..dst + len].copy_from_slice(&payload[src..src + len]);
            }
            first += n;
        }
        let mut want = vec![0u8; layout.total_bytes as usize];
        for (f, p) in layout.placements(b).iter().enumerate() {
            for i in 0..b {
                for k in 0..p.sample_bytes {
                    want[(p.offset + i * p.sample_bytes + k) as usize] = value(f, i, k);
                }
            }
        }
        assert!(buffer == want, "b {b} spp {spp}");
    }

    #[test]
    fn part_copies_assemble_each_field_as_one_tensor() {
        let l = BatchLayout::new(&synthetic_fields(Dtype::U8, vec![3, 5]), 32);
        for spp in [1, 3, 11, 32] {
            assemble(&l, 32, spp);
            // A tail batch of 7 samples, in the parts of a full one.
            assemble(&l, 7, spp);
        }
        let copies: Vec<ChunkCopy> = l.part_copies(4, 8, None).collect();
        assert_eq!(
            copies,
            [
                ChunkCopy {
                    field: 0,
                    src_offset: 0,
                    len: 60,
                    dst_offset: 120,
                    decode: None
                },
                ChunkCopy {
                    field: 1,
                    src_offset: 60,
                    len: 32,
                    dst_offset: 480 + 64,
                    decode: None
                },
            ]
        );
        // An empty part past a short batch's end copies nothing.
        assert!(l.part_copies(0, 28, None).all(|c| c.len == 0));
    }

    /// A batch of `b` samples, each cut into byte parts of `chunk` bytes of its cut field, each
    /// part's payload built as the loader builds it (field-major, the cut field's range, the
    /// other fields in the sample's first part), copied with `part_copies`: the buffer is the
    /// whole batch, each field one tensor.
    fn assemble_bytes(layout: &BatchLayout, b: u64, chunk: u64) {
        let value = |f: usize, i: u64, k: u64| (f as u64 * 131 + i * 7 + k * 3) as u8 | 1;
        let cut = crate::plan::SampleCut {
            field_bytes: layout.fields[layout.cut_field].sample_bytes,
            chunk_bytes: chunk,
        };
        let mut buffer = vec![0u8; layout.total_bytes as usize];
        for i in 0..b {
            for j in 0..cut.chunks() {
                let r = cut.range(j);
                let mut payload = Vec::new();
                for (f, field) in layout.fields.iter().enumerate() {
                    let range = if f == layout.cut_field {
                        r.offset..r.offset + r.len
                    } else if r.is_first() {
                        0..field.sample_bytes
                    } else {
                        0..0
                    };
                    payload.extend(range.map(|k| value(f, i, k)));
                }
                assert_eq!(payload.len() as u64, layout.part_payload_bytes(1, Some(r)));
                for c in layout.part_copies(1, i, Some(r)) {
                    let (src, dst, len) =
                        (c.src_offset as usize, c.dst_offset as usize, c.len as usize);
                    buffer[dst..dst + len].copy_from_slice(&payload[src..src + len]);
                }
            }
        }
        let mut want = vec![0u8; layout.total_bytes as usize];
        for (f, p) in layout.placements(b).iter().enumerate() {
            for i in 0..b {
                for k in 0..p.sample_bytes {
                    want[(p.offset + i * p.sample_bytes + k) as usize] = value(f, i, k);
                }
            }
        }
        assert!(buffer == want, "b {b} chunk {chunk}");
    }

    #[test]
    fn byte_parts_assemble_each_field_as_one_tensor() {
        let l = BatchLayout::new(&synthetic_fields(Dtype::U8, vec![10, 7]), 3);
        assert_eq!(l.cut_field, 0);
        assert_eq!(l.others_bytes(), 8);
        for chunk in [1, 8, 24, 69, 70] {
            assemble_bytes(&l, 3, chunk);
            assemble_bytes(&l, 2, chunk);
        }
        // The cut field is the largest, wherever it is; the others ride in the first part.
        let fields = vec![
            Field::new("small", Dtype::U8, vec![3]),
            Field::new("big", Dtype::F32, vec![25]),
            Field::new("labels", Dtype::I64, vec![]),
        ];
        let l = BatchLayout::new(&fields, 2);
        assert_eq!(l.cut_field, 1);
        for chunk in [7, 32, 100] {
            assemble_bytes(&l, 2, chunk);
        }
        // A middle part of sample 1: only the cut field's range, to its place in the sample.
        let r = ByteRange {
            offset: 32,
            len: 32,
        };
        let copies: Vec<_> = l.part_copies(1, 1, Some(r)).collect();
        assert_eq!(
            copies.iter().map(|c| c.len).collect::<Vec<_>>(),
            vec![0, 32, 0]
        );
        assert_eq!(copies[1].src_offset, 0);
        assert_eq!(copies[1].dst_offset, l.fields[1].offset + 100 + 32);
        assert_eq!(l.part_payload_bytes(1, Some(r)), 32);
        let first = ByteRange { offset: 0, len: 32 };
        assert_eq!(l.part_payload_bytes(1, Some(first)), 3 + 32 + 8);
    }

    #[test]
    fn three_fields_each_start_aligned() {
        let fields = vec![
            Field::new("a", Dtype::U8, vec![1]),
            Field::new("b", Dtype::F16, vec![3]),
            Field::new("c", Dtype::F64, vec![2, 2]),
        ];
        let l = BatchLayout::new(&fields, 100);
        let offsets: Vec<u64> = l.fields.iter().map(|f| f.offset).collect();
        // a: 100 bytes, padded to 112; b: 600 bytes from 112, padded to 720.
        assert_eq!(offsets, vec![0, 112, 720]);
        let record: Vec<u64> = l.fields.iter().map(|f| f.record_offset).collect();
        assert_eq!(record, vec![0, 1, 7]);
        assert_eq!(l.record_bytes, 1 + 6 + 32);
        assert_eq!(l.total_bytes, 720 + 3200);
        // No fields, no bytes.
        let empty = BatchLayout::new(&[], 8);
        assert_eq!((empty.record_bytes, empty.total_bytes), (0, 0));
    }
}
