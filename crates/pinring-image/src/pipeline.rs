//! [`Pipeline`]: encoded file in, one fixed-shape training sample out, written into the
//! caller's buffer.
//!
//! Steps: read the headers; pick the crop box ([`crate::transform`]); decode, at a reduced
//! size when the box will be shrunk at least [`MIN_REDUCTION`]× anyway and [`SampleSpec::reduced_decode`]
//! allows it; resample the box to `crop`×`crop` with `fast_image_resize`'s bilinear
//! convolution (antialiased when shrinking, like PIL's `resize(..., BILINEAR, box=...)`);
//! flip; write the output.
//!
//! # Output layout (little-endian)
//!
//! - [`Output::U8Hwc`]: shape `[crop, crop, 3]`, dtype u8, byte `(y * crop + x) * 3 + c`
//!   is channel c (0 = R, 1 = G, 2 = B) of pixel (x, y), unnormalised.
//! - [`Output::Normalized`]: shape `[3, crop, crop]` (CHW), dtype f16, bf16 or f32; element
//!   `(c * crop + y) * crop + x` is `(p / 255 - mean[c]) / std[c]` computed in f32 and then
//!   rounded to the dtype (round to nearest, ties to even), stored little-endian at byte
//!   `element * dtype.size_of()`.
//!
//! The pipeline owns its scratch (decoded pixels, the resampled u8 image, the resizer's
//! buffers, the normalisation tables) and reuses it from one call to the next.

use fast_image_resize as fir;
use pinring_data::meta::Dtype;

use crate::decode::{Decoder, Format};
use crate::error::ImageError;
use crate::transform::{
    center_crop_box, flip_horizontal, random_resized_crop_box, CropBox, SampleKey, SampleRng,
};

/// ImageNet's per-channel mean (R, G, B), on the 0..1 scale.
pub const IMAGENET_MEAN: [f32; 3] = [0.485, 0.456, 0.406];
/// ImageNet's per-channel standard deviation (R, G, B), on the 0..1 scale.
pub const IMAGENET_STD: [f32; 3] = [0.229, 0.224, 0.225];

/// The geometric transform.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Transform {
    /// torchvision `Resize(resize)` + `CenterCrop(crop)`.
    Eval {
        /// Shorter side after resizing (256).
        resize: u32,
        /// Side of the square crop (224).
        crop: u32,
    },
    /// torchvision `RandomResizedCrop(crop, scale, ratio)` + `RandomHorizontalFlip(flip_p)`.
    Train {
        /// Side of the square output (224).
        crop: u32,
        /// Range of the box's area as a fraction of the image's ((0.08, 1.0)).
        scale: (f64, f64),
        /// Range of the box's aspect ratio w/h ((3/4, 4/3)), drawn log-uniformly.
        ratio: (f64, f64),
        /// Probability of a horizontal flip (0.5).
        flip_p: f64,
    },
}

impl Transform {
    /// `Resize(256)` + `CenterCrop(224)`.
    pub const EVAL_DEFAULT: Transform = Transform::Eval {
        resize: 256,
        crop: 224,
    };
    /// `RandomResizedCrop(224)` + `RandomHorizontalFlip()`.
    pub const TRAIN_DEFAULT: Transform = Transform::Train {
        crop: 224,
        scale: (0.08, 1.0),
        ratio: (3.0 / 4.0, 4.0 / 3.0),
        flip_p: 0.5,
    };

    /// Side of the square output.
    pub fn crop(&self) -> u32 {
        match *self {
            Transform::Eval { crop, .. } | Transform::Train { crop, .. } => crop,
        }
    }

    /// The crop box in a `width`×`height` image, and whether to flip, for `key` (eval
    /// ignores the key and never flips).
    pub fn plan(&self, width: u32, height: u32, key: SampleKey) -> (CropBox, bool) {
        match *self {
            Transform::Eval { resize, crop } => {
                (center_crop_box(width, height, resize, crop), false)
            }
            Transform::Train {
                scale,
                ratio,
                flip_p,
                ..
            } => {
                let mut rng = SampleRng::new(key);
                let b = random_resized_crop_box(width, height, scale, ratio, &mut rng);
                (b, rng.next_f64() < flip_p)
            }
        }
    }
}

/// What a sample's bytes hold.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Output {
    /// u8, HWC, RGB, unnormalised.
    U8Hwc,
    /// `(x / 255 - mean) / std` per channel, CHW, in `dtype` (f16, bf16 or f32).
    Normalized {
        /// Element type: [`Dtype::F16`], [`Dtype::Bf16`] or [`Dtype::F32`].
        dtype: Dtype,
        /// Per-channel mean (R, G, B) on the 0..1 scale.
        mean: [f32; 3],
        /// Per-channel standard deviation (R, G, B) on the 0..1 scale.
        std: [f32; 3],
    },
}

impl Output {
    /// Normalised with ImageNet's mean and std, in `dtype`.
    pub fn imagenet(dtype: Dtype) -> Output {
        Output::Normalized {
            dtype,
            mean: IMAGENET_MEAN,
            std: IMAGENET_STD,
        }
    }
}

/// The smallest reduction [`Pipeline`] asks the decoder for: `jpeg-decoder` at 1/2 is slower
/// than `zune-jpeg` at full size (docs/IMAGES.md), so a crop shrunk 2× to 4× is decoded whole.
pub const MIN_REDUCTION: u32 = 4;

/// Everything that fixes a sample's shape and contents.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampleSpec {
    /// The geometric transform.
    pub transform: Transform,
    /// The output encoding.
    pub output: Output,
    /// Lets JPEGs be decoded at 1/4 or 1/8 size when the crop box would be shrunk by at
    /// least that factor anyway ([`MIN_REDUCTION`]). Faster; the pixels differ slightly from a full-size
    /// decode followed by the same resampling (the reduced IDCT is a different low-pass).
    pub reduced_decode: bool,
}

impl SampleSpec {
    /// Checks the values; [`Pipeline::new`] calls it.
    pub fn validate(&self) -> Result<(), ImageError> {
        let bad = |m: String| Err(ImageError::Spec(m));
        match self.transform {
            Transform::Eval { resize, crop } => {
                if crop == 0 || resize < crop {
                    return bad(format!(
                        "eval needs 0 < crop <= resize, got crop {crop}, resize {resize}"
                    ));
                }
            }
            Transform::Train {
                crop,
                scale,
                ratio,
                flip_p,
            } => {
                if crop == 0 {
                    return bad("train crop must be at least 1".into());
                }
                if !(scale.0 > 0.0 && scale.0 <= scale.1 && scale.1 <= 1.0) {
                    return bad(format!(
                        "train scale must satisfy 0 < min <= max <= 1, got {scale:?}"
                    ));
                }
                if !(ratio.0 > 0.0 && ratio.0 <= ratio.1 && ratio.1.is_finite()) {
                    return bad(format!(
                        "train ratio must satisfy 0 < min <= max, got {ratio:?}"
                    ));
                }
                if !(0.0..=1.0).contains(&flip_p) {
                    return bad(format!("flip probability must be in [0, 1], got {flip_p}"));
                }
            }
        }
        if self.transform.crop() > 16384 {
            return bad(format!(
                "crop {} is larger than 16384",
                self.transform.crop()
            ));
        }
        if let Output::Normalized { dtype, std, mean } = self.output {
            if !matches!(dtype, Dtype::F16 | Dtype::Bf16 | Dtype::F32) {
                return bad(format!(
                    "normalised output must be f16, bf16 or f32, got {dtype}"
                ));
            }
            if std.iter().any(|s| !(s.is_finite() && *s != 0.0))
                || mean.iter().any(|m| !m.is_finite())
            {
                return bad(format!(
                    "mean and std must be finite and std non-zero, got {mean:?}, {std:?}"
                ));
            }
        }
        Ok(())
    }

    /// The sample's shape: `[crop, crop, 3]` (HWC) for u8, `[3, crop, crop]` (CHW) otherwise.
    pub fn shape(&self) -> [usize; 3] {
        let c = self.transform.crop() as usize;
        match self.output {
            Output::U8Hwc => [c, c, 3],
            Output::Normalized { .. } => [3, c, c],
        }
    }

    /// The element type.
    pub fn dtype(&self) -> Dtype {
        match self.output {
            Output::U8Hwc => Dtype::U8,
            Output::Normalized { dtype, .. } => dtype,
        }
    }

    /// Bytes of one sample.
    pub fn sample_bytes(&self) -> usize {
        self.shape().iter().product::<usize>() * self.dtype().size_of()
    }
}

/// What [`Pipeline::process`] did to one file.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Applied {
    /// The file's format.
    pub format: Format,
    /// The file's width.
    pub width: u32,
    /// The file's height.
    pub height: u32,
    /// The crop box, in the file's pixels.
    pub crop: CropBox,
    /// Whether the sample was flipped.
    pub flipped: bool,
    /// The factor the image was shrunk by at decoding (1 = full size).
    pub reduction: u32,
}

/// Turns encoded files into samples of one [`SampleSpec`]; owns and reuses its scratch.
#[derive(Debug)]
pub struct Pipeline {
    spec: SampleSpec,
    decoder: Decoder,
    resizer: fir::Resizer,
    scratch: Vec<u8>,
    /// Per channel, the output element's bytes for each u8 value (normalised output only).
    lut: Vec<[[u8; 4]; 256]>,
}

impl Pipeline {
    /// A pipeline for `spec`, with a default [`Decoder`].
    pub fn new(spec: SampleSpec) -> Result<Pipeline, ImageError> {
        Pipeline::with_decoder(spec, Decoder::new())
    }

    /// A pipeline for `spec` that decodes with `decoder` (for its pixel limit).
    pub fn with_decoder(spec: SampleSpec, decoder: Decoder) -> Result<Pipeline, ImageError> {
        spec.validate()?;
        let lut = match spec.output {
            Output::U8Hwc => Vec::new(),
            Output::Normalized { dtype, mean, std } => (0..3)
                .map(|c| {
                    let mut t = [[0u8; 4]; 256];
                    for (v, e) in t.iter_mut().enumerate() {
                        let x = (v as f32 / 255.0 - mean[c]) / std[c];
                        match dtype {
                            Dtype::F16 => {
                                e[..2].copy_from_slice(&half::f16::from_f32(x).to_le_bytes())
                            }
                            Dtype::Bf16 => {
                                e[..2].copy_from_slice(&half::bf16::from_f32(x).to_le_bytes())
                            }
                            _ => *e = x.to_le_bytes(),
                        }
                    }
                    t
                })
                .collect(),
        };
        Ok(Pipeline {
            spec,
            decoder,
            resizer: fir::Resizer::new(),
            scratch: Vec::new(),
            lut,
        })
    }

    /// The spec this pipeline produces.
    pub fn spec(&self) -> &SampleSpec {
        &self.spec
    }

    /// Decodes `data` (a JPEG or PNG file), transforms it with the randomness of `key`, and
    /// writes the sample into `out`, which must be exactly [`SampleSpec::sample_bytes`] long.
    /// On error `out` may hold partial data.
    pub fn process(
        &mut self,
        data: &[u8],
        key: SampleKey,
        out: &mut [u8],
    ) -> Result<Applied, ImageError> {
        let expected = self.spec.sample_bytes();
        if out.len() != expected {
            return Err(ImageError::OutputSize {
                expected,
                got: out.len(),
                shape: self.spec.shape(),
            });
        }
        let info = self.decoder.info(data)?;
        let side = self.spec.transform.crop();
        let (crop, flipped) = self.spec.transform.plan(info.width, info.height, key);
        let mut reduction = 1;
        if self.spec.reduced_decode && info.format == Format::Jpeg {
            let shrink = (crop.width / side as f64).min(crop.height / side as f64);
            // A reduced decode pays only from 1/4 on (docs/IMAGES.md): at 1/2 the reduced
            // decoder is slower than the full-size one.
            reduction = if shrink >= 8.0 {
                8
            } else if shrink >= MIN_REDUCTION as f64 {
                MIN_REDUCTION
            } else {
                1
            };
        }
        let img = self.decoder.decode(data, reduction)?;
        let (fx, fy) = (
            img.width as f64 / img.full_width as f64,
            img.height as f64 / img.full_height as f64,
        );
        let reduction = (img.full_width / img.width.max(1)).max(1);
        let src = fir::images::ImageRef::new(img.width, img.height, img.rgb, fir::PixelType::U8x3)
            .map_err(|e| resample_error(info.format, e))?;
        let (l, t) = (crop.left * fx, crop.top * fy);
        let w = (crop.width * fx).min(img.width as f64 - l);
        let h = (crop.height * fy).min(img.height as f64 - t);
        let options = fir::ResizeOptions::new()
            .resize_alg(fir::ResizeAlg::Convolution(fir::FilterType::Bilinear))
            .crop(l, t, w, h);
        let n = side as usize;
        let dst_buf: &mut [u8] = match self.spec.output {
            Output::U8Hwc => out,
            Output::Normalized { .. } => {
                if self.scratch.len() != n * n * 3 {
                    self.scratch.resize(n * n * 3, 0);
                }
                &mut self.scratch
            }
        };
        {
            let mut dst =
                fir::images::Image::from_slice_u8(side, side, dst_buf, fir::PixelType::U8x3)
                    .map_err(|e| resample_error(info.format, e))?;
            self.resizer
                .resize(&src, &mut dst, &options)
                .map_err(|e| resample_error(info.format, e))?;
        }
        match self.spec.output {
            Output::U8Hwc => {
                if flipped {
                    flip_horizontal(out, n);
                }
            }
            Output::Normalized { dtype, .. } => {
                write_normalized(&self.scratch, n, flipped, &self.lut, dtype.size_of(), out);
            }
        }
        Ok(Applied {
            format: info.format,
            width: info.width,
            height: info.height,
            crop,
            flipped,
            reduction,
        })
    }
}

fn resample_error(format: Format, e: impl std::fmt::Display) -> ImageError {
    ImageError::Unsupported {
        format,
        what: format!("resampling failed: {e}"),
    }
}

/// HWC u8 `src` (`n`×`n`) to CHW elements through the per-channel tables.
fn write_normalized(
    src: &[u8],
    n: usize,
    flip: bool,
    lut: &[[[u8; 4]; 256]],
    esize: usize,
    out: &mut [u8],
) {
    match esize {
        2 => write_planes::<2>(src, n, flip, lut, out),
        _ => write_planes::<4>(src, n, flip, lut, out),
    }
}

fn write_planes<const E: usize>(
    src: &[u8],
    n: usize,
    flip: bool,
    lut: &[[[u8; 4]; 256]],
    out: &mut [u8],
) {
    for (c, (dst_plane, table)) in out.chunks_exact_mut(n * n * E).zip(lut).enumerate() {
        let mut t = [[0u8; E]; 256];
        for (d, s) in t.iter_mut().zip(table) {
            d.copy_from_slice(&s[..E]);
        }
        for (dst_row, src_row) in dst_plane
            .chunks_exact_mut(n * E)
            .zip(src.chunks_exact(n * 3))
        {
            let dst_row = dst_row.chunks_exact_mut(E);
            if flip {
                for (e, p) in dst_row.zip(src_row.chunks_exact(3).rev()) {
                    e.copy_from_slice(&t[p[c] as usize]);
                }
            } else {
                for (e, p) in dst_row.zip(src_row.chunks_exact(3)) {
                    e.copy_from_slice(&t[p[c] as usize]);
                }
            }
        }
    }
}
