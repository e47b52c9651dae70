//! The synthetic dataset: sample bytes and labels computed on the fly.
//!
//! The bytes of sample `i` are a pure function of `(seed, i, sample_bytes)`,
//! generated counter-style so that a loader can write them straight into a
//! shared-memory slot and the daemon (or a test) can verify them without
//! storing anything:
//!
//! ```text
//! key_i = mix64(seed ^ mix64(i))
//! w_j   = mix64(key_i + j * GOLDEN_GAMMA)     (wrapping arithmetic)
//! bytes = w_0.to_le_bytes() ++ w_1.to_le_bytes() ++ ...   (truncated to sample_bytes)
//! ```
//!
//! where `mix64` is the splitmix64 finalizer. Little-endian encoding makes
//! the bytes independent of the host. Each word costs two multiplies, so
//! generation runs at several GB/s per core.
//!
//! A sample has two fields ([`crate::fields`]): `images`, the bytes above, and `labels`,
//! [`Synthetic::label`] stored as a little-endian `i64` ([`LABEL_BYTES`] bytes).
//! [`Synthetic::fill_field`] and [`Synthetic::verify_field`] write and check either field of
//! several samples by name; [`Synthetic::fill_part`] writes a part's field-major payload.

use std::time::Instant;

use crate::fields::{IMAGES, LABELS};
use crate::plan::{mix64, GOLDEN_GAMMA};

/// Bytes of one label in the `labels` field: a little-endian `i64`.
pub const LABEL_BYTES: usize = 8;

/// Salt of the per-sample key.
const KEY_SALT: u64 = 0x7069_6e72_696e_6721; // "pinring!"

/// Salt separating label generation from byte generation.
const LABEL_SALT: u64 = 0x6c61_6265_6c73_2121; // "labels!!"

/// Errors from verifying synthetic data.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SyntheticError {
    /// A byte differs from what the generator produces.
    #[error("synthetic data mismatch in sample at batch position {sample_position} (dataset index {sample_index}), first wrong byte at offset {byte_offset} of the sample; the slot was corrupted or written for a different config/seed")]
    Mismatch {
        /// Position of the sample within the batch.
        sample_position: usize,
        /// Dataset index of the sample.
        sample_index: u64,
        /// Offset of the first wrong byte within the sample.
        byte_offset: usize,
    },
    /// A label differs from what the generator produces.
    #[error("synthetic label mismatch in sample at batch position {sample_position} (dataset index {sample_index}): the labels field holds {found} where the generator says {expected}; the slot was corrupted or written for a different config/seed")]
    LabelMismatch {
        /// Position of the sample within the batch.
        sample_position: usize,
        /// Dataset index of the sample.
        sample_index: u64,
        /// The generator's label.
        expected: i64,
        /// The label found (little-endian i64).
        found: i64,
    },
    /// The buffer does not hold exactly `indices.len() * sample_bytes` bytes of the field.
    #[error("synthetic {field} field of a batch has {found} bytes but {samples} samples of {sample_bytes} bytes need {expected}; payload size and plan disagree")]
    Length {
        /// The field (`images`, `labels`).
        field: &'static str,
        /// Number of samples.
        samples: usize,
        /// Bytes per sample.
        sample_bytes: usize,
        /// Expected total length.
        expected: usize,
        /// Actual length.
        found: usize,
    },
    /// A field the synthetic dataset does not have.
    #[error("the synthetic dataset has no field {field:?} (its fields are \"images\" and \"labels\"); loader and daemon disagree on the dataset: use one config for both")]
    UnknownField {
        /// The field asked for.
        field: String,
    },
}

/// Word `j` of a sample whose counter is `ctr = key + j * GOLDEN_GAMMA`.
///
/// Deliberately cheap (an add, a shift and an xor per 8 bytes, which the compiler vectorises):
/// the generator must never be what limits a benchmark of the pipeline behind it. Every sample
/// still differs from every other (its key is a full mix of seed and index) and every word of a
/// sample differs from its neighbours, so a misplaced, stale, swapped or corrupted word is caught.
#[inline(always)]
fn word(ctr: u64) -> u64 {
    ctr ^ (ctr >> 29)
}

/// The words of one synthetic sample, in order ([`Synthetic::sample_words`]). A stepped counter,
/// not word `k` computed from `k`: a 64-bit multiply per word halves the generator's speed,
/// because it does not vectorise.
#[derive(Debug, Clone, Copy)]
pub struct SampleWords {
    ctr: u64,
}

impl SampleWords {
    /// The next word of the sample.
    #[inline(always)]
    pub fn next_word(&mut self) -> u64 {
        let w = word(self.ctr);
        self.ctr = self.ctr.wrapping_add(GOLDEN_GAMMA);
        w
    }
}

/// Generator of the synthetic dataset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Synthetic {
    seed: u64,
    sample_bytes: usize,
    classes: u32,
}

impl Synthetic {
    /// A dataset whose samples are `sample_bytes` long with labels in
    /// `0..classes` (`classes == 0` is treated as 1).
    pub fn new(seed: u64, sample_bytes: usize, classes: u32) -> Self {
        Synthetic {
            seed,
            sample_bytes,
            classes: classes.max(1),
        }
    }

    /// Bytes per sample.
    pub fn sample_bytes(&self) -> usize {
        self.sample_bytes
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Number of classes.
    pub fn classes(&self) -> u32 {
        self.classes
    }

    #[inline]
    fn key(&self, index: u64) -> u64 {
        // The additive constants keep (seed 0, index 0) away from mix64's fixed point at 0.
        mix64(self.seed.wrapping_add(KEY_SALT) ^ mix64(index.wrapping_add(GOLDEN_GAMMA)))
    }

    /// The words of sample `index`, in order, for writers that cannot take a `&mut [u8]` (a
    /// shared-memory slot): the `k`-th call of [`SampleWords::next_word`] gives bytes
    /// `8k..8k+8` of the sample in little-endian.
    #[inline]
    pub fn sample_words(&self, index: u64) -> SampleWords {
        SampleWords {
            ctr: self.key(index),
        }
    }

    /// The words of sample `index` from word `word` on (bytes `8 × word..` of the sample): the
    /// generator of a byte part that starts mid-sample ([`crate::plan::ByteRange`]). Word `k` is
    /// a function of `k` alone, so any range can be made (and checked) without the words before.
    #[inline]
    pub fn sample_words_from(&self, index: u64, word: u64) -> SampleWords {
        SampleWords {
            ctr: self
                .key(index)
                .wrapping_add(word.wrapping_mul(GOLDEN_GAMMA)),
        }
    }

    /// Writes bytes `offset..offset + out.len()` of sample `index` into `out` (any offset and
    /// length; bytes past the sample's end follow the same sequence, so a caller keeps within
    /// [`Synthetic::sample_bytes`]).
    pub fn fill_sample_range(&self, index: u64, offset: u64, out: &mut [u8]) {
        let mut words = self.sample_words_from(index, offset / 8);
        let skip = (offset % 8) as usize;
        let mut at = 0;
        if skip != 0 && !out.is_empty() {
            let w = words.next_word().to_le_bytes();
            let n = (8 - skip).min(out.len());
            out[..n].copy_from_slice(&w[skip..skip + n]);
            at = n;
        }
        let mut chunks = out[at..].chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&words.next_word().to_le_bytes());
        }
        let rem = chunks.into_remainder();
        if !rem.is_empty() {
            let n = rem.len();
            rem.copy_from_slice(&words.next_word().to_le_bytes()[..n]);
        }
    }

    /// Label of sample `index`, in `0..classes`.
    pub fn label(&self, index: u64) -> u32 {
        (mix64(self.key(index) ^ LABEL_SALT) % u64::from(self.classes)) as u32
    }

    /// Labels of several samples.
    pub fn labels(&self, indices: &[u64]) -> Vec<u32> {
        indices.iter().map(|&i| self.label(i)).collect()
    }

    /// Sample `index`'s entry of the `labels` field: [`Synthetic::label`] as a little-endian
    /// `i64`.
    #[inline]
    pub fn label_le_bytes(&self, index: u64) -> [u8; LABEL_BYTES] {
        i64::from(self.label(index)).to_le_bytes()
    }

    /// Writes the `labels` field of the samples `indices` into `out`: one little-endian `i64`
    /// each, back to back.
    ///
    /// # Panics
    /// If `out.len() != indices.len() * LABEL_BYTES`.
    pub fn fill_labels(&self, indices: &[u64], out: &mut [u8]) {
        assert_eq!(
            out.len(),
            indices.len().saturating_mul(LABEL_BYTES),
            "fill_labels: output slice has {} bytes, {} labels need {}",
            out.len(),
            indices.len(),
            indices.len().saturating_mul(LABEL_BYTES)
        );
        for (&i, chunk) in indices.iter().zip(out.chunks_exact_mut(LABEL_BYTES)) {
            chunk.copy_from_slice(&self.label_le_bytes(i));
        }
    }

    /// Checks a `labels` field written by [`Synthetic::fill_labels`].
    pub fn verify_labels(&self, indices: &[u64], data: &[u8]) -> Result<(), SyntheticError> {
        let expected = indices.len().saturating_mul(LABEL_BYTES);
        if data.len() != expected {
            return Err(SyntheticError::Length {
                field: LABELS,
                samples: indices.len(),
                sample_bytes: LABEL_BYTES,
                expected,
                found: data.len(),
            });
        }
        for (pos, (&i, chunk)) in indices
            .iter()
            .zip(data.chunks_exact(LABEL_BYTES))
            .enumerate()
        {
            let mut b = [0u8; LABEL_BYTES];
            b.copy_from_slice(chunk);
            let found = i64::from_le_bytes(b);
            let expected = i64::from(self.label(i));
            if found != expected {
                return Err(SyntheticError::LabelMismatch {
                    sample_position: pos,
                    sample_index: i,
                    expected,
                    found,
                });
            }
        }
        Ok(())
    }

    /// Writes field `field` (`"images"` or `"labels"`) of the samples `indices` into `out`,
    /// contiguous: [`Synthetic::fill_batch`] or [`Synthetic::fill_labels`].
    ///
    /// # Panics
    /// If `out` is not exactly as long as the field of those samples.
    pub fn fill_field(
        &self,
        field: &str,
        indices: &[u64],
        out: &mut [u8],
    ) -> Result<(), SyntheticError> {
        match field {
            IMAGES => self.fill_batch(indices, out),
            LABELS => self.fill_labels(indices, out),
            other => {
                return Err(SyntheticError::UnknownField {
                    field: other.to_string(),
                })
            }
        }
        Ok(())
    }

    /// Checks field `field` (`"images"` or `"labels"`) of the samples `indices`:
    /// [`Synthetic::verify_batch`] or [`Synthetic::verify_labels`].
    pub fn verify_field(
        &self,
        field: &str,
        indices: &[u64],
        data: &[u8],
    ) -> Result<(), SyntheticError> {
        match field {
            IMAGES => self.verify_batch(indices, data),
            LABELS => self.verify_labels(indices, data),
            other => Err(SyntheticError::UnknownField {
                field: other.to_string(),
            }),
        }
    }

    /// Writes the field-major payload of a part of the samples `indices` into `out`: their
    /// images, then their labels ([`crate::fields`]).
    ///
    /// # Panics
    /// If `out.len() != indices.len() * (sample_bytes + LABEL_BYTES)`.
    pub fn fill_part(&self, indices: &[u64], out: &mut [u8]) {
        let images = indices.len().saturating_mul(self.sample_bytes);
        let want = images.saturating_add(indices.len().saturating_mul(LABEL_BYTES));
        assert_eq!(
            out.len(),
            want,
            "fill_part: output slice has {} bytes, {} samples of {} + {LABEL_BYTES} bytes need {want}",
            out.len(),
            indices.len(),
            self.sample_bytes,
        );
        let (images_out, labels_out) = out.split_at_mut(images);
        self.fill_batch(indices, images_out);
        self.fill_labels(indices, labels_out);
    }

    /// Writes sample `index` into `out` (typically a slice of a shared-memory
    /// slot; no intermediate buffer).
    ///
    /// # Panics
    /// If `out.len() != self.sample_bytes()`.
    pub fn fill_sample(&self, index: u64, out: &mut [u8]) {
        assert_eq!(
            out.len(),
            self.sample_bytes,
            "fill_sample: output slice has {} bytes, sample {} needs {}",
            out.len(),
            index,
            self.sample_bytes
        );
        let key = self.key(index);
        let mut chunks = out.chunks_exact_mut(8);
        let mut ctr = key;
        for c in &mut chunks {
            c.copy_from_slice(&word(ctr).to_le_bytes());
            ctr = ctr.wrapping_add(GOLDEN_GAMMA);
        }
        let rem = chunks.into_remainder();
        if !rem.is_empty() {
            let n = rem.len();
            rem.copy_from_slice(&word(ctr).to_le_bytes()[..n]);
        }
    }

    /// Writes the samples `indices` back to back into `out`.
    ///
    /// # Panics
    /// If `out.len() != indices.len() * self.sample_bytes()`.
    pub fn fill_batch(&self, indices: &[u64], out: &mut [u8]) {
        let want = indices.len().saturating_mul(self.sample_bytes);
        assert_eq!(
            out.len(),
            want,
            "fill_batch: output slice has {} bytes, {} samples of {} bytes need {}",
            out.len(),
            indices.len(),
            self.sample_bytes,
            want
        );
        if self.sample_bytes == 0 {
            return;
        }
        for (&i, chunk) in indices.iter().zip(out.chunks_exact_mut(self.sample_bytes)) {
            self.fill_sample(i, chunk);
        }
    }

    /// Checks `data` against sample `index`; returns the offset of the first
    /// wrong byte, or `None` if it matches. A length different from
    /// `sample_bytes` counts as wrong at the first offset past the shorter
    /// of the two (after the common prefix matched). Does not allocate.
    pub fn verify_sample(&self, index: u64, data: &[u8]) -> Option<usize> {
        let common = data.len().min(self.sample_bytes);
        let data_c = &data[..common];
        let mut ctr = self.key(index);
        let mut chunks = data_c.chunks_exact(8);
        let mut off = 0usize;
        for c in &mut chunks {
            let mut b = [0u8; 8];
            b.copy_from_slice(c);
            let diff = u64::from_le_bytes(b) ^ word(ctr);
            if diff != 0 {
                return Some(off + (diff.trailing_zeros() / 8) as usize);
            }
            ctr = ctr.wrapping_add(GOLDEN_GAMMA);
            off += 8;
        }
        let rem = chunks.remainder();
        if !rem.is_empty() {
            let want = word(ctr).to_le_bytes();
            if let Some(p) = rem.iter().zip(want.iter()).position(|(a, b)| a != b) {
                return Some(off + p);
            }
        }
        if data.len() != self.sample_bytes {
            return Some(common);
        }
        None
    }

    /// Checks a batch written by [`Synthetic::fill_batch`].
    pub fn verify_batch(&self, indices: &[u64], data: &[u8]) -> Result<(), SyntheticError> {
        let expected = indices.len().saturating_mul(self.sample_bytes);
        if data.len() != expected {
            return Err(SyntheticError::Length {
                field: IMAGES,
                samples: indices.len(),
                sample_bytes: self.sample_bytes,
                expected,
                found: data.len(),
            });
        }
        if self.sample_bytes == 0 {
            return Ok(());
        }
        for (pos, (&i, chunk)) in indices
            .iter()
            .zip(data.chunks_exact(self.sample_bytes))
            .enumerate()
        {
            if let Some(off) = self.verify_sample(i, chunk) {
                return Err(SyntheticError::Mismatch {
                    sample_position: pos,
                    sample_index: i,
                    byte_offset: off,
                });
            }
        }
        Ok(())
    }
}

/// Measures generation throughput on the calling thread: fills a buffer of
/// `bytes` bytes (one sample) repeatedly for about `secs` seconds and
/// returns GB/s (10^9 bytes per second). For benchmarks; not timing-asserted
/// anywhere.
pub fn generator_throughput(bytes: usize, secs: f64) -> f64 {
    let bytes = bytes.max(1);
    let gen = Synthetic::new(0x5eed, bytes, 1);
    let mut buf = vec![0u8; bytes];
    let start = Instant::now();
    let mut done: u64 = 0;
    let mut index = 0u64;
    loop {
        gen.fill_sample(index, &mut buf);
        std::hint::black_box(&mut buf);
        index += 1;
        done += bytes as u64;
        let el = start.elapsed().as_secs_f64();
        if el >= secs {
            return done as f64 / el.max(1e-9) / 1e9;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_words_are_the_bytes_of_fill_sample() {
        for bytes in [8, 13, 4096, 1003] {
            let g = Synthetic::new(9, bytes, 10);
            let mut want = vec![0u8; bytes];
            g.fill_sample(77, &mut want);
            let mut words = g.sample_words(77);
            let got: Vec<u8> = (0..bytes.div_ceil(8))
                .flat_map(|_| words.next_word().to_le_bytes())
                .take(bytes)
                .collect();
            assert_eq!(got, want, "{bytes} bytes");
        }
    }

    #[test]
    fn any_byte_range_of_a_sample_is_the_sample_s_bytes_there() {
        let g = Synthetic::new(7, 203, 10);
        let mut whole = vec![0u8; 203];
        g.fill_sample(31, &mut whole);
        for offset in [0usize, 1, 7, 8, 9, 64, 100, 199, 203] {
            for len in [0usize, 1, 5, 8, 16, 57] {
                let len = len.min(203 - offset);
                let mut part = vec![0u8; len];
                g.fill_sample_range(31, offset as u64, &mut part);
                assert_eq!(
                    part,
                    whole[offset..offset + len],
                    "offset {offset} len {len}"
                );
            }
        }
        // The words from word k are the sample's words k, k + 1, ...
        let mut all = g.sample_words(31);
        let _ = (all.next_word(), all.next_word());
        let mut from = g.sample_words_from(31, 2);
        assert_eq!(all.next_word(), from.next_word());
    }

    #[test]
    fn deterministic_and_distinct() {
        let g = Synthetic::new(42, 1 << 20, 1000);
        let mut a = vec![0u8; 1 << 20];
        let mut b = vec![0u8; 1 << 20];
        g.fill_sample(5, &mut a);
        g.fill_sample(5, &mut b);
        assert_eq!(a, b);
        g.fill_sample(6, &mut b);
        assert_ne!(a, b);
        Synthetic::new(43, 1 << 20, 1000).fill_sample(5, &mut b);
        assert_ne!(a, b);
        // Not trivially constant.
        assert_ne!(a[..8], a[8..16]);
    }

    #[test]
    fn pinned_bytes() {
        // Pinned output: changing the generator must bump the fingerprint version.
        let g = Synthetic::new(0, 11, 10);
        let mut out = [0u8; 11];
        g.fill_sample(0, &mut out);
        let key = mix64(KEY_SALT ^ mix64(GOLDEN_GAMMA));
        let w = |c: u64| c ^ (c >> 29);
        let mut want = w(key).to_le_bytes().to_vec();
        want.extend_from_slice(&w(key.wrapping_add(GOLDEN_GAMMA)).to_le_bytes()[..3]);
        assert_ne!(want[..8], [0u8; 8]);
        assert_eq!(out.to_vec(), want);
    }

    #[test]
    fn verify_finds_first_wrong_byte() {
        for len in [0usize, 1, 7, 8, 9, 100, 4096 + 3] {
            let g = Synthetic::new(9, len, 10);
            let mut s = vec![0u8; len];
            g.fill_sample(77, &mut s);
            assert_eq!(g.verify_sample(77, &s), None, "len {len}");
            for off in [0, len / 2, len.saturating_sub(1)] {
                if len == 0 {
                    break;
                }
                let mut bad = s.clone();
                bad[off] ^= 0x10;
                assert_eq!(g.verify_sample(77, &bad), Some(off), "len {len} off {off}");
            }
            if len > 0 {
                assert_eq!(g.verify_sample(77, &s[..len - 1]), Some(len - 1));
                assert!(g.verify_sample(78, &s).is_some() || len < 2);
            }
        }
    }

    #[test]
    fn batch_fill_and_verify() {
        let g = Synthetic::new(1, 13, 5);
        let idx = [3u64, 1, 4, 1, 5];
        let mut buf = vec![0u8; idx.len() * 13];
        g.fill_batch(&idx, &mut buf);
        g.verify_batch(&idx, &buf).unwrap();
        let mut one = [0u8; 13];
        g.fill_sample(4, &mut one);
        assert_eq!(&buf[26..39], &one);
        buf[2 * 13 + 5] ^= 1;
        assert_eq!(
            g.verify_batch(&idx, &buf),
            Err(SyntheticError::Mismatch {
                sample_position: 2,
                sample_index: 4,
                byte_offset: 5
            })
        );
        assert!(matches!(
            g.verify_batch(&idx, &buf[1..]),
            Err(SyntheticError::Length { .. })
        ));
    }

    #[test]
    fn label_fields_are_little_endian_i64() {
        let g = Synthetic::new(42, 13, 1000);
        let idx = [9u64, 2, 700];
        let mut out = vec![0u8; 3 * LABEL_BYTES];
        g.fill_labels(&idx, &mut out);
        for (k, &i) in idx.iter().enumerate() {
            let mut b = [0u8; 8];
            b.copy_from_slice(&out[8 * k..8 * k + 8]);
            assert_eq!(i64::from_le_bytes(b), i64::from(g.label(i)));
        }
        g.verify_labels(&idx, &out).unwrap();
        g.verify_field(LABELS, &idx, &out).unwrap();
        let mut bad = out.clone();
        bad[8 + 7] ^= 0x80; // the sign byte of the second label
        assert_eq!(
            g.verify_labels(&idx, &bad),
            Err(SyntheticError::LabelMismatch {
                sample_position: 1,
                sample_index: 2,
                expected: i64::from(g.label(2)),
                found: i64::from(g.label(2)) ^ i64::MIN,
            })
        );
        assert!(matches!(
            g.verify_labels(&idx, &out[..16]),
            Err(SyntheticError::Length { field: LABELS, .. })
        ));
        let e = g.verify_field("masks", &idx, &out).unwrap_err();
        assert!(e.to_string().contains("\"masks\""), "{e}");
        assert!(g.fill_field("masks", &idx, &mut out).is_err());
    }

    #[test]
    fn a_part_is_field_major() {
        let g = Synthetic::new(3, 13, 10);
        let idx = [4u64, 1, 8];
        let mut part = vec![0u8; 3 * (13 + LABEL_BYTES)];
        g.fill_part(&idx, &mut part);
        let (images, labels) = part.split_at(3 * 13);
        g.verify_field(IMAGES, &idx, images).unwrap();
        g.verify_field(LABELS, &idx, labels).unwrap();
        let mut want = vec![0u8; 3 * 13];
        g.fill_field(IMAGES, &idx, &mut want).unwrap();
        assert_eq!(images, &want[..]);
    }

    #[test]
    fn labels_in_range_and_deterministic() {
        let g = Synthetic::new(42, 8, 10);
        let l: Vec<u32> = (0..1000).map(|i| g.label(i)).collect();
        assert!(l.iter().all(|&x| x < 10));
        assert_eq!(l, g.labels(&(0..1000).collect::<Vec<_>>()));
        // All classes show up.
        for c in 0..10 {
            assert!(l.contains(&c));
        }
        assert_eq!(Synthetic::new(1, 8, 0).label(3), 0);
    }

    #[test]
    fn throughput_helper_runs() {
        let gbps = generator_throughput(1 << 16, 0.05);
        eprintln!("synthetic generator: {gbps:.2} GB/s (debug builds are much slower)");
        assert!(gbps > 0.0);
    }
}
