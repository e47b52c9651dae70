//! A field carried encoded in the ring (`[dataset.image] decode = "gpu"`): per sample, the
//! compressed bytes of its image and the crop the plan gave it, for whoever copies the batch
//! out to decode.
//!
//! **In a slot** an encoded field's chunk, in a part of `n` samples, is `n` entries of
//! [`ENTRY_BYTES`] ([`EncodedEntry`], little-endian), then the part's *arena*: `n × share`
//! bytes (`share`: [`crate::ImageDataset::encoded_share`]), holding the samples' compressed
//! bytes packed in sample order from its start. A sample may take more than its share when
//! others take less; the part's arena is the bound.
//!
//! The chunk is shared memory that a loader wrote: [`EncodedChunk::entry`] checks every value
//! of an entry against the chunk before anything reads the bytes it names.

use std::fmt;

/// Bytes of one [`EncodedEntry`] in a slot.
pub const ENTRY_BYTES: u64 = 64;

/// [`EncodedEntry::flags`]: flip the sample horizontally after the crop.
pub const FLAG_FLIP: u32 = 1;
/// [`EncodedEntry::flags`]: the loader could not read the sample and substituted zeros
/// (`dataset.on_bad_sample = "skip"`): the decoder writes a sample of zeros, as the CPU path
/// does, and reads no bytes.
pub const FLAG_ZEROS: u32 = 2;
const KNOWN_FLAGS: u32 = FLAG_FLIP | FLAG_ZEROS;

/// One sample of an encoded chunk (64 bytes, little-endian):
///
/// | bytes | field |
/// | --- | --- |
/// | 0..4 | `offset`: u32, start of the sample's bytes in the part's arena |
/// | 4..8 | `len`: u32, bytes of the compressed image |
/// | 8..12 | `flags`: u32, [`FLAG_FLIP`], [`FLAG_ZEROS`] |
/// | 12..16 | `file`: u32, index of the sample's file in the source (messages) |
/// | 16..24 | `member`: u64, byte offset of the sample's member in that file (messages) |
/// | 24..28, 28..32 | `width`, `height`: u32, the image's size as its headers give it |
/// | 32..64 | `crop`: four f64, the box's left, top, width and height in the image's pixels |
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct EncodedEntry {
    /// Start of the sample's bytes in the part's arena.
    pub offset: u32,
    /// Bytes of the compressed image.
    pub len: u32,
    /// [`FLAG_FLIP`] and [`FLAG_ZEROS`].
    pub flags: u32,
    /// Index of the sample's file in the source, for messages.
    pub file: u32,
    /// Byte offset of the sample's member in its file, for messages.
    pub member: u64,
    /// The image's width, as its headers give it.
    pub width: u32,
    /// The image's height, as its headers give it.
    pub height: u32,
    /// The crop box in the image's pixels: left, top, width, height.
    pub crop: [f64; 4],
}

impl EncodedEntry {
    /// The entry of a sample the loader substituted with zeros: no bytes, no box.
    pub const ZEROS: EncodedEntry = EncodedEntry {
        offset: 0,
        len: 0,
        flags: FLAG_ZEROS,
        file: 0,
        member: 0,
        width: 0,
        height: 0,
        crop: [0.0; 4],
    };

    /// The entry's bytes in a slot.
    pub fn to_bytes(&self) -> [u8; ENTRY_BYTES as usize] {
        let mut b = [0u8; ENTRY_BYTES as usize];
        b[0..4].copy_from_slice(&self.offset.to_le_bytes());
        b[4..8].copy_from_slice(&self.len.to_le_bytes());
        b[8..12].copy_from_slice(&self.flags.to_le_bytes());
        b[12..16].copy_from_slice(&self.file.to_le_bytes());
        b[16..24].copy_from_slice(&self.member.to_le_bytes());
        b[24..28].copy_from_slice(&self.width.to_le_bytes());
        b[28..32].copy_from_slice(&self.height.to_le_bytes());
        for (k, v) in self.crop.iter().enumerate() {
            b[32 + 8 * k..40 + 8 * k].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    /// An entry from its bytes, unchecked ([`EncodedChunk::entry`] checks it).
    pub fn from_bytes(b: &[u8; ENTRY_BYTES as usize]) -> EncodedEntry {
        let u32_at = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let u64_at = |at: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[at..at + 8]);
            u64::from_le_bytes(w)
        };
        EncodedEntry {
            offset: u32_at(0),
            len: u32_at(4),
            flags: u32_at(8),
            file: u32_at(12),
            member: u64_at(16),
            width: u32_at(24),
            height: u32_at(28),
            crop: [0, 1, 2, 3].map(|k| f64::from_bits(u64_at(32 + 8 * k))),
        }
    }

    /// The entry in `raw`, checked against an arena of `arena` bytes as
    /// [`EncodedChunk::entry`] checks it (for a reader that holds the entries apart from the
    /// arena).
    pub fn checked(raw: &[u8; ENTRY_BYTES as usize], arena: u64) -> Result<EncodedEntry, String> {
        let e = EncodedEntry::from_bytes(raw);
        e.check(arena)?;
        Ok(e)
    }

    /// Where the sample's bytes lie in its part's arena (within it once checked).
    pub fn range(&self) -> std::ops::Range<usize> {
        let start = self.offset as usize;
        start..start + self.len as usize
    }

    /// The crop box, as pinring-image's pipeline takes it.
    pub fn crop_box(&self) -> pinring_image::CropBox {
        let [left, top, width, height] = self.crop;
        pinring_image::CropBox {
            left,
            top,
            width,
            height,
        }
    }

    /// Whether the sample is flipped after the crop.
    pub fn flipped(&self) -> bool {
        self.flags & FLAG_FLIP != 0
    }

    /// Whether the loader substituted zeros for the sample.
    pub fn zeros(&self) -> bool {
        self.flags & FLAG_ZEROS != 0
    }

    /// Where the sample came from, for messages: `"file #3, member at byte 10240"`.
    pub fn origin(&self) -> impl fmt::Display + '_ {
        Origin(self)
    }

    /// Checks the entry against an arena of `arena` bytes: its bytes inside the arena, known
    /// flags, and a crop box of finite values inside the image, of positive size. A sample of
    /// zeros names no bytes and no box.
    fn check(&self, arena: u64) -> Result<(), String> {
        if self.flags & !KNOWN_FLAGS != 0 {
            return Err(format!("unknown flags {:#x}", self.flags));
        }
        if self.zeros() {
            return match self.len {
                0 => Ok(()),
                n => Err(format!("a sample of zeros names {n} bytes")),
            };
        }
        let end = u64::from(self.offset) + u64::from(self.len);
        if self.len == 0 || end > arena {
            return Err(format!(
                "bytes {}..{end} are not inside the part's arena of {arena} bytes",
                self.offset
            ));
        }
        let [l, t, w, h] = self.crop;
        let (iw, ih) = (f64::from(self.width), f64::from(self.height));
        // The box is computed in f64 from the image's size: its edges lie inside the image up
        // to rounding.
        let inside = l >= 0.0 && t >= 0.0 && w > 0.0 && h > 0.0 && l + w <= iw + 1e-6;
        if !(self.crop.iter().all(|v| v.is_finite()) && inside && t + h <= ih + 1e-6) {
            return Err(format!(
                "crop box {:?} is not inside the {}x{} image",
                self.crop, self.width, self.height
            ));
        }
        Ok(())
    }
}

struct Origin<'a>(&'a EncodedEntry);

impl fmt::Display for Origin<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "file #{}, member at byte {}", self.0.file, self.0.member)
    }
}

/// An encoded field's chunk of one part, as a slot holds it: entries, then the arena.
#[derive(Debug, Clone, Copy)]
pub struct EncodedChunk<'a> {
    entries: &'a [u8],
    arena: &'a [u8],
}

/// A chunk or an entry that does not hold what [`EncodedChunk`] documents: the slot was
/// scribbled on or a loader wrote it wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("encoded chunk: {problem}; the slot holds what no loader writes (a loader of another build, or the segment was written to)")]
pub struct ChunkError {
    /// What is wrong, naming the sample's place in the part.
    pub problem: String,
}

impl<'a> EncodedChunk<'a> {
    /// The chunk of a part of `samples` samples: `bytes` must be `samples × (ENTRY_BYTES +
    /// share)` for some share, as [`crate::BatchLayout::part_copies`] gives its `len`.
    pub fn new(bytes: &'a [u8], samples: u32) -> Result<EncodedChunk<'a>, ChunkError> {
        let (entries, arena) = bytes.split_at(EncodedChunk::entries_len(bytes.len(), samples)?);
        Ok(EncodedChunk { entries, arena })
    }

    /// Bytes of the entries in a chunk of `len` bytes and `samples` samples (the arena is the
    /// rest), or the error when no chunk is that long.
    pub fn entries_len(len: usize, samples: u32) -> Result<usize, ChunkError> {
        let n = u64::from(samples);
        let len = len as u64;
        let entries = n.saturating_mul(ENTRY_BYTES);
        if n == 0 || len < entries || len % n != 0 {
            return Err(ChunkError {
                problem: format!(
                    "{len} bytes cannot hold {samples} samples' entries and equal shares of an \
                     arena"
                ),
            });
        }
        Ok(entries as usize)
    }

    /// The number of samples.
    pub fn samples(&self) -> usize {
        self.entries.len() / ENTRY_BYTES as usize
    }

    /// The arena's bytes.
    pub fn arena(&self) -> &'a [u8] {
        self.arena
    }

    /// Sample `n`'s entry, checked against the chunk, and its compressed bytes (empty for a
    /// sample of zeros).
    pub fn entry(&self, n: usize) -> Result<(EncodedEntry, &'a [u8]), ChunkError> {
        let at = n * ENTRY_BYTES as usize;
        let raw: &[u8; ENTRY_BYTES as usize] = self
            .entries
            .get(at..at + ENTRY_BYTES as usize)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| ChunkError {
                problem: format!("sample {n} is past the chunk's {} samples", self.samples()),
            })?;
        let e = EncodedEntry::from_bytes(raw);
        e.check(self.arena.len() as u64).map_err(|p| ChunkError {
            problem: format!("sample {n} of the part: {p}"),
        })?;
        let bytes = if e.zeros() {
            &self.arena[..0]
        } else {
            &self.arena[e.range()]
        };
        Ok((e, bytes))
    }
}

/// Where a part's samples' bytes go in its arena: packed in sample order from its start.
/// The writer puts sample `n`'s entry at byte `n × ENTRY_BYTES` of the chunk and its bytes at
/// `samples × ENTRY_BYTES + offset`, the offset [`ArenaCursor::place`] gives.
#[derive(Debug, Clone)]
pub struct ArenaCursor {
    samples: usize,
    arena: u64,
    used: u64,
}

/// Where [`ArenaCursor::put`] placed a sample, in bytes from its chunk's start.
#[derive(Debug, Clone, Copy)]
pub struct Placed {
    /// The sample's entry, its place in the arena set.
    pub entry: [u8; ENTRY_BYTES as usize],
    /// Where the entry goes.
    pub entry_at: u64,
    /// Where the sample's bytes go.
    pub data_at: u64,
}

/// A sample's bytes do not fit what is left of its part's arena.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{len} bytes of compressed image do not fit the {left} bytes left of its part's arena ({arena} bytes for {samples} samples)")]
pub struct ArenaFull {
    /// The sample's bytes.
    pub len: u64,
    /// What was left.
    pub left: u64,
    /// The arena's bytes.
    pub arena: u64,
    /// The part's samples.
    pub samples: usize,
}

impl ArenaCursor {
    /// The arena of a part of `samples` samples, each bringing `share` bytes.
    pub fn new(samples: usize, share: u64) -> ArenaCursor {
        ArenaCursor {
            samples,
            arena: (samples as u64).saturating_mul(share),
            used: 0,
        }
    }

    /// Byte offset of the arena in the chunk.
    pub fn arena_start(&self) -> u64 {
        (self.samples as u64).saturating_mul(ENTRY_BYTES)
    }

    /// Sample `n`, of `len` bytes, placed: where its bytes and its entry (`entry` with `offset`
    /// and `len` set) go, in bytes from the chunk's start.
    pub fn put(
        &mut self,
        n: usize,
        mut entry: EncodedEntry,
        len: usize,
    ) -> Result<Placed, ArenaFull> {
        entry.offset = self.place(len)?;
        entry.len = len as u32;
        Ok(Placed {
            entry: entry.to_bytes(),
            entry_at: n as u64 * ENTRY_BYTES,
            data_at: self.arena_start() + u64::from(entry.offset),
        })
    }

    /// Room for `len` more bytes: their offset in the arena.
    pub fn place(&mut self, len: usize) -> Result<u32, ArenaFull> {
        let left = self.arena - self.used;
        let len = len as u64;
        match u32::try_from(self.used) {
            Ok(at) if len <= left && u32::try_from(self.used + len).is_ok() => {
                self.used += len;
                Ok(at)
            }
            _ => Err(ArenaFull {
                len,
                left,
                arena: self.arena,
                samples: self.samples,
            }),
        }
    }
}

/// Writes sample `n` of a part's encoded chunk (`chunk`, as [`EncodedChunk::new`] takes it):
/// its bytes placed by `cursor`, its entry with `offset` and `len` set. For tests and writers
/// that hold the chunk as one slice.
pub fn write_sample(
    chunk: &mut [u8],
    cursor: &mut ArenaCursor,
    n: usize,
    entry: EncodedEntry,
    bytes: &[u8],
) -> Result<(), ArenaFull> {
    let p = cursor.put(n, entry, bytes.len())?;
    let (data, at) = (p.data_at as usize, p.entry_at as usize);
    chunk[data..data + bytes.len()].copy_from_slice(bytes);
    chunk[at..at + ENTRY_BYTES as usize].copy_from_slice(&p.entry);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(crop: [f64; 4]) -> EncodedEntry {
        EncodedEntry {
            flags: FLAG_FLIP,
            file: 3,
            member: 10240,
            width: 500,
            height: 375,
            crop,
            ..EncodedEntry::default()
        }
    }

    #[test]
    fn entries_round_trip_through_their_bytes() {
        let e = EncodedEntry {
            offset: 7,
            len: 9,
            ..entry([1.5, 2.25, 100.0, 80.0])
        };
        assert_eq!(EncodedEntry::from_bytes(&e.to_bytes()), e);
        assert_eq!(e.origin().to_string(), "file #3, member at byte 10240");
    }

    #[test]
    fn a_chunk_written_reads_back_packed_in_order() {
        let mut chunk = vec![0u8; 3 * (64 + 10)];
        let mut w = ArenaCursor::new(3, 10);
        write_sample(
            &mut chunk,
            &mut w,
            0,
            entry([0.0, 0.0, 500.0, 375.0]),
            &[1; 12],
        )
        .unwrap();
        let zeros = EncodedEntry {
            flags: FLAG_ZEROS,
            ..EncodedEntry::default()
        };
        write_sample(&mut chunk, &mut w, 1, zeros, &[]).unwrap();
        write_sample(
            &mut chunk,
            &mut w,
            2,
            entry([10.0, 20.0, 30.0, 40.0]),
            &[2; 18],
        )
        .unwrap();
        let full = write_sample(&mut chunk, &mut w, 2, entry([0.0; 4]), &[0; 1]).unwrap_err();
        assert_eq!((full.len, full.left, full.arena), (1, 0, 30));
        let c = EncodedChunk::new(&chunk, 3).unwrap();
        assert_eq!(c.samples(), 3);
        let (e0, b0) = c.entry(0).unwrap();
        assert_eq!((e0.offset, e0.len, b0), (0, 12, &[1u8; 12][..]));
        assert!(e0.flipped() && !e0.zeros());
        let (e1, b1) = c.entry(1).unwrap();
        assert!(e1.zeros() && b1.is_empty());
        let (e2, b2) = c.entry(2).unwrap();
        assert_eq!((e2.offset, b2), (12, &[2u8; 18][..]));
        assert!(c.entry(3).is_err());
    }

    #[test]
    fn every_scribbled_value_is_refused_naming_the_sample() {
        let mut chunk = vec![0u8; 64 + 100];
        let mut w = ArenaCursor::new(1, 100);
        write_sample(
            &mut chunk,
            &mut w,
            0,
            entry([0.0, 0.0, 500.0, 375.0]),
            &[5; 40],
        )
        .unwrap();
        let good = EncodedEntry::from_bytes(chunk[..64].try_into().unwrap());
        let bad = [
            EncodedEntry { len: 101, ..good },
            EncodedEntry {
                offset: u32::MAX,
                ..good
            },
            EncodedEntry { len: 0, ..good },
            EncodedEntry { flags: 8, ..good },
            EncodedEntry {
                flags: FLAG_ZEROS,
                ..good
            },
            EncodedEntry {
                crop: [f64::NAN, 0.0, 1.0, 1.0],
                ..good
            },
            EncodedEntry {
                crop: [-1.0, 0.0, 1.0, 1.0],
                ..good
            },
            EncodedEntry {
                crop: [0.0, 0.0, 0.0, 1.0],
                ..good
            },
            EncodedEntry {
                crop: [400.0, 0.0, 101.0, 1.0],
                ..good
            },
            EncodedEntry {
                crop: [0.0, 300.0, 1.0, 76.0],
                ..good
            },
            EncodedEntry { width: 10, ..good },
        ];
        for b in bad {
            chunk[..64].copy_from_slice(&b.to_bytes());
            let e = EncodedChunk::new(&chunk, 1).unwrap().entry(0).unwrap_err();
            assert!(e.to_string().contains("sample 0 of the part"), "{b:?}: {e}");
        }
        assert!(EncodedChunk::new(&chunk[..63], 1).is_err());
        assert!(EncodedChunk::new(&chunk[..101], 2).is_err());
        assert!(EncodedChunk::new(&chunk, 0).is_err());
    }
}
