//! [`ImageError`]: everything that can go wrong turning an encoded file into a sample.
//!
//! Messages name the object (the format, the file when the caller adds it with
//! [`ImageError::in_file`]) and the problem, and say what to do about it.

use std::fmt;

use crate::decode::Format;

/// Errors from decoding an image or producing a sample from it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ImageError {
    /// The input is empty.
    #[error("empty image file (0 bytes); the file was not written completely or the archive member is empty; drop it from the dataset")]
    Empty,
    /// The input is neither a JPEG nor a PNG.
    #[error("not a JPEG or PNG image: the {len} bytes start with {head}, but a JPEG starts with ff d8 ff and a PNG with 89 50 4e 47; check that the dataset's image members are JPEG or PNG files")]
    UnknownFormat {
        /// Length of the input in bytes.
        len: usize,
        /// The first bytes, in hex.
        head: HexHead,
    },
    /// The decoder refused the data.
    #[error("corrupt {format} ({len} bytes): {detail}; the file is truncated, damaged or not a {format}; re-encode it or drop it from the dataset")]
    Corrupt {
        /// Format detected from the magic bytes.
        format: Format,
        /// Length of the input in bytes.
        len: usize,
        /// The decoder's own description.
        detail: String,
    },
    /// A well-formed image that this crate does not handle.
    #[error("unsupported {format}: {what}; convert the file to 8-bit RGB or grayscale")]
    Unsupported {
        /// Format detected from the magic bytes.
        format: Format,
        /// What is not supported.
        what: String,
    },
    /// The image is larger than the decoder's pixel limit.
    #[error("{format} of {width}x{height} pixels exceeds the limit of {max_pixels} pixels; the limit guards against decompression bombs and is not configurable: shrink or re-encode the file, or set dataset.on_bad_sample = \"skip\" to replace it with zeros")]
    TooLarge {
        /// Format detected from the magic bytes.
        format: Format,
        /// Width in pixels.
        width: u64,
        /// Height in pixels.
        height: u64,
        /// The limit in force.
        max_pixels: u64,
    },
    /// The caller's output buffer does not match the sample size.
    #[error("output buffer is {got} bytes but one sample of shape {shape:?} is {expected} bytes; pass a buffer of exactly SampleSpec::sample_bytes()")]
    OutputSize {
        /// Bytes one sample takes.
        expected: usize,
        /// Bytes passed.
        got: usize,
        /// The sample's shape.
        shape: [usize; 3],
    },
    /// The sample specification is invalid.
    #[error("invalid image sample spec: {0}")]
    Spec(String),
    /// Another error, in a named file or archive member.
    #[error("{name}: {source}")]
    InFile {
        /// File name or archive member.
        name: String,
        /// What went wrong.
        source: Box<ImageError>,
    },
}

impl ImageError {
    /// Names the file (or archive member) the error is about: `"n01440764/x.JPEG: corrupt JPEG ..."`.
    pub fn in_file(self, name: impl Into<String>) -> ImageError {
        ImageError::InFile {
            name: name.into(),
            source: Box::new(self),
        }
    }

    /// The error without the file name added by [`ImageError::in_file`].
    pub fn root(&self) -> &ImageError {
        match self {
            ImageError::InFile { source, .. } => source.root(),
            other => other,
        }
    }
}

/// Up to the first 8 bytes of an input, printed as hex (`"47 49 46 38 39 61"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HexHead {
    bytes: [u8; 8],
    len: u8,
}

impl HexHead {
    /// The first bytes of `data` (at most 8).
    pub fn of(data: &[u8]) -> HexHead {
        let len = data.len().min(8);
        let mut bytes = [0; 8];
        bytes[..len].copy_from_slice(&data[..len]);
        HexHead {
            bytes,
            len: len as u8,
        }
    }
}

impl fmt::Display for HexHead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, b) in self.bytes[..self.len as usize].iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_file_and_the_problem() {
        let e = ImageError::UnknownFormat {
            len: 10,
            head: HexHead::of(b"GIF89a"),
        }
        .in_file("shard-000.tar:0001.jpg");
        let s = e.to_string();
        assert!(
            s.starts_with("shard-000.tar:0001.jpg: not a JPEG or PNG"),
            "{s}"
        );
        assert!(s.contains("47 49 46 38 39 61"), "{s}");
        assert!(matches!(e.root(), ImageError::UnknownFormat { .. }));
    }
}
