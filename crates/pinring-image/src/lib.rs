//! Turns encoded image files (JPEG, PNG) into fixed-shape training samples for pinring's
//! loaders, written straight into the caller's buffer (a slot of the ring or a scratch
//! buffer).
//!
//! - [`decode`]: JPEG/PNG to 8-bit RGB ([`Decoder`]), the format told by the magic bytes.
//! - [`transform`]: the crop and flip geometry as pure functions of (seed, epoch, sample id).
//! - [`pipeline`]: [`Pipeline`] = decode + crop + resize + flip + output encoding
//!   (u8 HWC, or normalised f16/bf16/f32 CHW), byte layout documented there.
//! - [`synth`]: deterministic synthetic photos for tests and benchmarks.
//!
//! docs/IMAGES.md gives the choice of decoder and resizer, and the speed against PIL.

#![forbid(unsafe_code)]

pub mod decode;
pub mod error;
pub mod pipeline;
pub mod synth;
pub mod transform;

#[cfg(test)]
mod testutil;

pub use decode::{sniff, DecodedImage, Decoder, Format, ImageInfo};
pub use error::ImageError;
pub use pipeline::{
    Applied, Float, Output, Pipeline, SampleSpec, Transform, IMAGENET_MEAN, IMAGENET_STD,
    MIN_REDUCTION,
};
pub use transform::{CropBox, SampleKey, SampleRng};
