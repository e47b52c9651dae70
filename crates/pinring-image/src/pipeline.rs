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

use crate::decode::{Decoder, Format, ImageInfo};
use crate::error::ImageError;
use crate::transform::{center_crop_box, random_resized_crop_box, CropBox, SampleKey, SampleRng};

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

/// The element type of a normalised image (pinring-sources names it as the ring's dtype).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Float {
    /// IEEE 754 half precision.
    F16,
    /// bfloat16.
    Bf16,
    /// IEEE 754 single precision.
    F32,
}

impl Float {
    /// Bytes of one element.
    pub fn size_of(self) -> usize {
        match self {
            Float::F16 | Float::Bf16 => 2,
            Float::F32 => 4,
        }
    }
}

/// What a sample's bytes hold.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Output {
    /// u8, HWC, RGB, unnormalised.
    U8Hwc,
    /// `(x / 255 - mean) / std` per channel, CHW, in `dtype`.
    Normalized {
        /// Element type.
        dtype: Float,
        /// Per-channel mean (R, G, B) on the 0..1 scale.
        mean: [f32; 3],
        /// Per-channel standard deviation (R, G, B) on the 0..1 scale.
        std: [f32; 3],
    },
}

impl Output {
    /// Normalised with ImageNet's mean and std, in `dtype`.
    pub fn imagenet(dtype: Float) -> Output {
        Output::Normalized {
            dtype,
            mean: IMAGENET_MEAN,
            std: IMAGENET_STD,
        }
    }

    /// Per channel, the output element's little-endian bytes (2 or 4, in 4-byte cells) for
    /// each u8 value, `(v/255 - mean)/std` rounded once to the dtype; empty for u8 output. The
    /// CPU path writes its samples from it, and the GPU decoder's kernel reads the same table.
    pub fn table(&self) -> Vec<[[u8; 4]; 256]> {
        let Output::Normalized { dtype, mean, std } = *self else {
            return Vec::new();
        };
        (0..3)
            .map(|c| {
                let mut t = [[0u8; 4]; 256];
                for (v, e) in t.iter_mut().enumerate() {
                    let x = (v as f32 / 255.0 - mean[c]) / std[c];
                    match dtype {
                        Float::F16 => e[..2].copy_from_slice(&half::f16::from_f32(x).to_le_bytes()),
                        Float::Bf16 => {
                            e[..2].copy_from_slice(&half::bf16::from_f32(x).to_le_bytes())
                        }
                        Float::F32 => *e = x.to_le_bytes(),
                    }
                }
                t
            })
            .collect()
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
        if let Output::Normalized { std, mean, .. } = self.output {
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

    /// Bytes of one element: 1 for u8, the float's size otherwise.
    pub fn element_bytes(&self) -> usize {
        match self.output {
            Output::U8Hwc => 1,
            Output::Normalized { dtype, .. } => dtype.size_of(),
        }
    }

    /// Bytes of one sample.
    pub fn sample_bytes(&self) -> usize {
        self.shape().iter().product::<usize>() * self.element_bytes()
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
        let lut = spec.output.table();
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
        self.check_out(out)?;
        let info = self.decoder.info(data)?;
        let (crop, flipped) = self.spec.transform.plan(info.width, info.height, key);
        self.resample(data, info, crop, flipped, out)
    }

    /// As [`Pipeline::process`], with the crop box and flip already drawn (by a loader, from
    /// the headers and the sample's key: `Transform::plan`): the same pixels as `process` for
    /// the same box. `crop` must lie inside the image.
    pub fn process_planned(
        &mut self,
        data: &[u8],
        crop: CropBox,
        flipped: bool,
        out: &mut [u8],
    ) -> Result<Applied, ImageError> {
        self.check_out(out)?;
        let info = self.decoder.info(data)?;
        let (w, h) = (f64::from(info.width), f64::from(info.height));
        let inside = crop.left >= 0.0 && crop.top >= 0.0 && crop.width > 0.0 && crop.height > 0.0;
        if !(inside && crop.left + crop.width <= w + 1e-6 && crop.top + crop.height <= h + 1e-6) {
            return Err(ImageError::Spec(format!(
                "crop box {crop:?} is not inside the {}x{} image",
                info.width, info.height
            )));
        }
        self.resample(data, info, crop, flipped, out)
    }

    /// `out` holds exactly one sample.
    fn check_out(&self, out: &[u8]) -> Result<(), ImageError> {
        let expected = self.spec.sample_bytes();
        if out.len() != expected {
            return Err(ImageError::OutputSize {
                expected,
                got: out.len(),
                shape: self.spec.shape(),
            });
        }
        Ok(())
    }

    /// Decodes `data` (whose headers gave `info`) and writes the sample of box `crop` into `out`
    /// (checked by the callers: its size, the box inside the image).
    fn resample(
        &mut self,
        data: &[u8],
        info: ImageInfo,
        crop: CropBox,
        flipped: bool,
        out: &mut [u8],
    ) -> Result<Applied, ImageError> {
        let side = self.spec.transform.crop();
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
        // The rows the resampling reads: down to the box's bottom plus the filter's reach
        // (its support, 1, times the shrink factor when shrinking), and one for rounding.
        let reach = (crop.height / side as f64).max(1.0);
        let rows = (crop.top + crop.height + reach).ceil() as u32 + 1;
        let img = self.decoder.decode_raster(data, reduction, true, rows)?;
        let (fx, fy) = (
            img.width as f64 / img.full_width as f64,
            img.scaled_height as f64 / img.full_height as f64,
        );
        let reduction = (img.full_width / img.width.max(1)).max(1);
        let ch = img.channels;
        let pixel_type = if ch == 4 {
            fir::PixelType::U8x4
        } else {
            fir::PixelType::U8x3
        };
        let src = fir::images::ImageRef::new(img.width, img.height, img.pixels, pixel_type)
            .map_err(|e| resample_error(info.format, e))?;
        let (l, t) = (crop.left * fx, crop.top * fy);
        let w = (crop.width * fx).min(img.width as f64 - l);
        let h = (crop.height * fy).min(img.height as f64 - t);
        let options = fir::ResizeOptions::new()
            .resize_alg(fir::ResizeAlg::Convolution(fir::FilterType::Bilinear))
            .use_alpha(false)
            .crop(l, t, w, h);
        let n = side as usize;
        // RGB, unflipped, u8: resampled straight into `out`; else into the scratch, from
        // which one pass writes `out` (dropping X, mirroring, normalising as needed).
        let direct = ch == 3 && !flipped && self.spec.output == Output::U8Hwc;
        let dst_buf: &mut [u8] = if direct {
            out
        } else {
            if self.scratch.len() != n * n * ch {
                self.scratch.resize(n * n * ch, 0);
            }
            &mut self.scratch
        };
        {
            let mut dst = fir::images::Image::from_slice_u8(side, side, dst_buf, pixel_type)
                .map_err(|e| resample_error(info.format, e))?;
            self.resizer
                .resize(&src, &mut dst, &options)
                .map_err(|e| resample_error(info.format, e))?;
        }
        match self.spec.output {
            Output::U8Hwc if direct => {}
            Output::U8Hwc => write_u8_hwc(&self.scratch, ch, n, flipped, out),
            Output::Normalized { dtype, .. } => {
                write_normalized(
                    &self.scratch,
                    ch,
                    n,
                    flipped,
                    &self.lut,
                    dtype.size_of(),
                    out,
                );
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

/// `n`×`n` pixels of `ch` bytes (RGB or RGBX) to u8 RGB HWC, mirrored if `flip`.
fn write_u8_hwc(src: &[u8], ch: usize, n: usize, flip: bool, out: &mut [u8]) {
    match (ch, flip) {
        (4, false) => rgbx_rows_to_rgb::<false>(src, n, out),
        (4, true) => rgbx_rows_to_rgb::<true>(src, n, out),
        (_, false) => out.copy_from_slice(&src[..out.len()]),
        (_, true) => {
            for (dst_row, src_row) in out.chunks_exact_mut(n * 3).zip(src.chunks_exact(n * 3)) {
                for (d, s) in dst_row
                    .chunks_exact_mut(3)
                    .zip(src_row.chunks_exact(3).rev())
                {
                    d.copy_from_slice(s);
                }
            }
        }
    }
}

/// Rows of `n` RGBX pixels to rows of RGB, in reverse order within the row if `FLIP`: eight
/// pixels (four little-endian u64 of two pixels each) at a time become three u64 (24 bytes).
fn rgbx_rows_to_rgb<const FLIP: bool>(src: &[u8], n: usize, out: &mut [u8]) {
    // Two RGBX pixels (in memory order if `!FLIP`, swapped if `FLIP`) as 6 RGB bytes.
    let pair = |s: &[u8]| {
        let p = u64::from_le_bytes(s.try_into().expect("8 bytes"));
        let (a, b) = (p & 0xff_ffff, (p >> 32) & 0xff_ffff);
        if FLIP {
            b | a << 24
        } else {
            a | b << 24
        }
    };
    for (dst_row, src_row) in out.chunks_exact_mut(n * 3).zip(src.chunks_exact(n * 4)) {
        let octets = n / 8;
        let (dst_octets, dst_rest) = dst_row.split_at_mut(octets * 24);
        let write = |d: &mut [u8], v: [u64; 4]| {
            d[..8].copy_from_slice(&(v[0] | v[1] << 48).to_le_bytes());
            d[8..16].copy_from_slice(&(v[1] >> 16 | v[2] << 32).to_le_bytes());
            d[16..24].copy_from_slice(&(v[2] >> 32 | v[3] << 16).to_le_bytes());
        };
        if FLIP {
            // Source octets from the row's end; the last `n % 8` output pixels are the row's
            // first pixels, reversed.
            let src_octets = src_row.rchunks_exact(32);
            let src_rest = src_octets.remainder();
            for (d, s) in dst_octets.chunks_exact_mut(24).zip(src_octets) {
                let v = [
                    pair(&s[24..32]),
                    pair(&s[16..24]),
                    pair(&s[8..16]),
                    pair(&s[..8]),
                ];
                write(d, v);
            }
            for (d, s) in dst_rest
                .chunks_exact_mut(3)
                .zip(src_rest.chunks_exact(4).rev())
            {
                d.copy_from_slice(&s[..3]);
            }
        } else {
            let src_octets = src_row.chunks_exact(32);
            let src_rest = src_octets.remainder();
            for (d, s) in dst_octets.chunks_exact_mut(24).zip(src_octets) {
                let v = [
                    pair(&s[..8]),
                    pair(&s[8..16]),
                    pair(&s[16..24]),
                    pair(&s[24..32]),
                ];
                write(d, v);
            }
            for (d, s) in dst_rest.chunks_exact_mut(3).zip(src_rest.chunks_exact(4)) {
                d.copy_from_slice(&s[..3]);
            }
        }
    }
}

/// HWC `src` (`n`×`n` pixels of `ch` bytes, RGB or RGBX) to CHW elements through the
/// per-channel tables.
fn write_normalized(
    src: &[u8],
    ch: usize,
    n: usize,
    flip: bool,
    lut: &[[[u8; 4]; 256]],
    esize: usize,
    out: &mut [u8],
) {
    match (esize, ch) {
        (2, 4) => write_planes::<2, 4>(src, n, flip, lut, out),
        (2, _) => write_planes::<2, 3>(src, n, flip, lut, out),
        (_, 4) => write_planes::<4, 4>(src, n, flip, lut, out),
        _ => write_planes::<4, 3>(src, n, flip, lut, out),
    }
}

fn write_planes<const E: usize, const S: usize>(
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
            .zip(src.chunks_exact(n * S))
        {
            let dst_row = dst_row.chunks_exact_mut(E);
            if flip {
                for (e, p) in dst_row.zip(src_row.chunks_exact(S).rev()) {
                    e.copy_from_slice(&t[p[c] as usize]);
                }
            } else {
                for (e, p) in dst_row.zip(src_row.chunks_exact(S)) {
                    e.copy_from_slice(&t[p[c] as usize]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth;
    use crate::testutil::{jpeg, png};
    use png::{BitDepth, ColorType as P};
    use proptest::prelude::*;

    fn png_of(rgb: &[u8], w: u32, h: u32) -> Vec<u8> {
        png(rgb, w, h, P::Rgb, BitDepth::Eight)
    }

    fn run(spec: SampleSpec, file: &[u8], key: SampleKey) -> (Vec<u8>, Applied) {
        let mut p = Pipeline::new(spec).expect("spec");
        let mut out = vec![0xee; spec.sample_bytes()];
        let applied = p.process(file, key, &mut out).expect("process");
        (out, applied)
    }

    fn crop_of(rgb: &[u8], w: usize, left: usize, top: usize, side: usize) -> Vec<u8> {
        (top..top + side)
            .flat_map(|y| rgb[(y * w + left) * 3..(y * w + left + side) * 3].to_vec())
            .collect()
    }

    const U8: Output = Output::U8Hwc;

    #[test]
    fn center_crop_of_a_known_image_gives_the_known_pixels() {
        // Shorter side = resize: no scaling, so the crop is an exact copy.
        for (w, h, left, top) in [
            (256usize, 256usize, 16, 16),
            (512, 256, 144, 16),
            (256, 300, 16, 38),
        ] {
            let rgb = synth::photo(w as u32, h as u32, 1, 30);
            let spec = SampleSpec {
                transform: Transform::EVAL_DEFAULT,
                output: U8,
                reduced_decode: true,
            };
            let (out, a) = run(
                spec,
                &png_of(&rgb, w as u32, h as u32),
                SampleKey::default(),
            );
            assert_eq!(out, crop_of(&rgb, w, left, top, 224), "{w}x{h}");
            assert!(!a.flipped);
            assert_eq!(a.reduction, 1);
        }
    }

    #[test]
    fn flip_mirrors_the_sample_exactly() {
        let rgb = synth::photo(300, 200, 2, 30);
        let file = png_of(&rgb, 300, 200);
        let t = |flip_p| Transform::Train {
            crop: 64,
            scale: (0.08, 1.0),
            ratio: (0.75, 4.0 / 3.0),
            flip_p,
        };
        let key = SampleKey {
            seed: 3,
            epoch: 1,
            sample_id: 9,
        };
        let (plain, a) = run(
            SampleSpec {
                transform: t(0.0),
                output: U8,
                reduced_decode: false,
            },
            &file,
            key,
        );
        let (flipped, b) = run(
            SampleSpec {
                transform: t(1.0),
                output: U8,
                reduced_decode: false,
            },
            &file,
            key,
        );
        assert_eq!(a.crop, b.crop);
        assert!(!a.flipped && b.flipped);
        let mut back = flipped.clone();
        crate::transform::flip_horizontal(&mut back, 64);
        assert_eq!(back, plain);
        // The same flip in the normalised output.
        let o = Output::Normalized {
            dtype: Float::F32,
            mean: [0.0; 3],
            std: [1.0; 3],
        };
        let (f32s, _) = run(
            SampleSpec {
                transform: t(1.0),
                output: o,
                reduced_decode: false,
            },
            &file,
            key,
        );
        for (i, e) in f32s.chunks_exact(4).enumerate() {
            let (c, y, x) = (i / (64 * 64), (i / 64) % 64, i % 64);
            let v = f32::from_le_bytes(e.try_into().unwrap());
            assert_eq!(v, flipped[(y * 64 + x) * 3 + c] as f32 / 255.0);
        }
    }

    #[test]
    fn train_is_reproducible_per_key_and_differs_across_epochs() {
        let rgb = synth::photo(500, 375, 3, 10);
        let file = jpeg(&rgb, 500, 375, jpeg_encoder::ColorType::Rgb, 90, true);
        let spec = SampleSpec {
            transform: Transform::TRAIN_DEFAULT,
            output: Output::imagenet(Float::Bf16),
            reduced_decode: true,
        };
        let key = SampleKey {
            seed: 42,
            epoch: 0,
            sample_id: 1234,
        };
        let (a, pa) = run(spec, &file, key);
        let (b, pb) = run(spec, &file, key);
        assert_eq!(a, b);
        assert_eq!(pa, pb);
        let (c, pc) = run(spec, &file, SampleKey { epoch: 1, ..key });
        assert_ne!(a, c);
        assert_ne!(pa.crop, pc.crop);
    }

    #[test]
    fn normalisation_values_are_exact_for_known_pixels() {
        // 224x224 with resize 224: the identity, so each output element comes from one pixel.
        let (w, h) = (224usize, 224usize);
        let rgb: Vec<u8> = (0..w * h)
            .flat_map(|i| [(i % 256) as u8, (i / 224) as u8, (255 - i % 256) as u8])
            .collect();
        let file = png_of(&rgb, w as u32, h as u32);
        let transform = Transform::Eval {
            resize: 224,
            crop: 224,
        };
        for dtype in [Float::F32, Float::F16, Float::Bf16] {
            let spec = SampleSpec {
                transform,
                output: Output::imagenet(dtype),
                reduced_decode: false,
            };
            assert_eq!(spec.shape(), [3, 224, 224]);
            assert_eq!(spec.sample_bytes(), 3 * 224 * 224 * dtype.size_of());
            let (out, _) = run(spec, &file, SampleKey::default());
            for (i, e) in out.chunks_exact(dtype.size_of()).enumerate() {
                let (c, p) = (i / (w * h), i % (w * h));
                let x = (rgb[p * 3 + c] as f32 / 255.0 - IMAGENET_MEAN[c]) / IMAGENET_STD[c];
                let got = match dtype {
                    Float::F32 => f32::from_le_bytes(e.try_into().unwrap()).to_bits(),
                    Float::F16 => u16::from_le_bytes(e.try_into().unwrap()) as u32,
                    _ => u16::from_le_bytes(e.try_into().unwrap()) as u32,
                };
                let want = match dtype {
                    Float::F32 => x.to_bits(),
                    Float::F16 => half::f16::from_f32(x).to_bits() as u32,
                    _ => half::bf16::from_f32(x).to_bits() as u32,
                };
                assert_eq!(got, want, "{dtype:?} element {i}");
            }
        }
        // A known value: 255 in channel 0 is (1 - 0.485) / 0.229.
        let spec = SampleSpec {
            transform,
            output: Output::imagenet(Float::F32),
            reduced_decode: false,
        };
        let white = png_of(&vec![255u8; w * h * 3], w as u32, h as u32);
        let (out, _) = run(spec, &white, SampleKey::default());
        assert_eq!(
            f32::from_le_bytes(out[..4].try_into().unwrap()),
            (1.0f32 - 0.485) / 0.229
        );
    }

    #[test]
    fn u8_output_is_the_resampled_pixels_hwc() {
        let rgb = synth::photo(224, 224, 4, 30);
        let spec = SampleSpec {
            transform: Transform::Eval {
                resize: 224,
                crop: 224,
            },
            output: U8,
            reduced_decode: false,
        };
        assert_eq!(spec.shape(), [224, 224, 3]);
        assert_eq!(
            run(spec, &png_of(&rgb, 224, 224), SampleKey::default()).0,
            rgb
        );
    }

    #[test]
    fn reduced_decode_when_the_crop_allows_it() {
        let (w, h) = (1400u32, 1100u32); // shorter side 1100 = 4.3 x 256
        let rgb = synth::photo(w, h, 5, 0);
        let file = jpeg(&rgb, w, h, jpeg_encoder::ColorType::Rgb, 95, false);
        let spec = |reduced_decode| SampleSpec {
            transform: Transform::EVAL_DEFAULT,
            output: U8,
            reduced_decode,
        };
        let (full, a) = run(spec(false), &file, SampleKey::default());
        let (fast, b) = run(spec(true), &file, SampleKey::default());
        assert_eq!((a.reduction, b.reduction), (1, 4));
        let e = crate::testutil::mae(&full, &fast);
        assert!(e < 2.0, "{e}");
    }

    #[test]
    fn wrong_buffer_size_and_bad_specs_are_refused() {
        let rgb = synth::photo(64, 64, 6, 0);
        let spec = SampleSpec {
            transform: Transform::EVAL_DEFAULT,
            output: U8,
            reduced_decode: true,
        };
        let mut p = Pipeline::new(spec).unwrap();
        let e = p
            .process(&png_of(&rgb, 64, 64), SampleKey::default(), &mut [0u8; 10])
            .unwrap_err();
        assert!(e.to_string().contains("sample_bytes"), "{e}");
        for bad in [
            SampleSpec {
                transform: Transform::Eval {
                    resize: 100,
                    crop: 224,
                },
                ..spec
            },
            SampleSpec {
                transform: Transform::Train {
                    crop: 224,
                    scale: (0.5, 0.1),
                    ratio: (0.75, 1.3),
                    flip_p: 0.5,
                },
                ..spec
            },
            SampleSpec {
                output: Output::Normalized {
                    dtype: Float::F32,
                    mean: [0.0; 3],
                    std: [1.0, 0.0, 1.0],
                },
                ..spec
            },
        ] {
            assert!(
                matches!(Pipeline::new(bad), Err(ImageError::Spec(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn tiny_and_odd_images_work() {
        for (w, h) in [(1u32, 1u32), (1, 300), (300, 1), (3, 2)] {
            let rgb = synth::photo(w, h, 7, 5);
            for transform in [Transform::EVAL_DEFAULT, Transform::TRAIN_DEFAULT] {
                let spec = SampleSpec {
                    transform,
                    output: Output::imagenet(Float::F16),
                    reduced_decode: true,
                };
                for file in [
                    png_of(&rgb, w, h),
                    jpeg(&rgb, w, h, jpeg_encoder::ColorType::Rgb, 90, true),
                ] {
                    let (_, a) = run(
                        spec,
                        &file,
                        SampleKey {
                            seed: 1,
                            epoch: 2,
                            sample_id: 3,
                        },
                    );
                    assert_eq!((a.width, a.height), (w, h));
                }
            }
        }
    }

    #[test]
    fn rgbx_to_rgb_drops_x_and_mirrors_for_any_width() {
        for n in [1usize, 3, 7, 8, 9, 15, 16, 17, 224] {
            let src: Vec<u8> = (0..n * n * 4).map(|i| (i * 7 + i / 5) as u8).collect();
            let want = |flip: bool| -> Vec<u8> {
                (0..n * n)
                    .flat_map(|i| {
                        let (y, x) = (i / n, i % n);
                        let x = if flip { n - 1 - x } else { x };
                        src[(y * n + x) * 4..(y * n + x) * 4 + 3].to_vec()
                    })
                    .collect()
            };
            for flip in [false, true] {
                let mut out = vec![0u8; n * n * 3];
                write_u8_hwc(&src, 4, n, flip, &mut out);
                assert_eq!(out, want(flip), "n {n}, flip {flip}");
                // The same from RGB.
                let rgb: Vec<u8> = src.chunks_exact(4).flat_map(|p| p[..3].to_vec()).collect();
                let mut out3 = vec![0u8; n * n * 3];
                write_u8_hwc(&rgb, 3, n, flip, &mut out3);
                assert_eq!(out3, want(flip), "RGB, n {n}, flip {flip}");
            }
        }
    }

    #[test]
    fn rgbx_and_rgb_decodes_give_the_same_samples() {
        // Colour JPEGs are resampled as RGBX, the rest as RGB: the samples must not depend on
        // which (the convolution is per channel).
        let rgb = synth::photo(300, 200, 9, 20);
        let file = jpeg(&rgb, 300, 200, jpeg_encoder::ColorType::Rgb, 90, true);
        let decoded = Decoder::new().decode(&file, 1).unwrap().rgb.to_vec();
        let as_png = png_of(&decoded, 300, 200);
        for output in [U8, Output::imagenet(Float::F16)] {
            for id in 0..20 {
                let spec = SampleSpec {
                    transform: Transform::TRAIN_DEFAULT,
                    output,
                    reduced_decode: false,
                };
                let key = SampleKey {
                    seed: 5,
                    epoch: 0,
                    sample_id: id,
                };
                let (a, pa) = run(spec, &file, key);
                let (b, pb) = run(spec, &as_png, key);
                assert_eq!((pa.crop, pa.flipped), (pb.crop, pb.flipped));
                assert!(a == b, "{output:?}, sample {id}");
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// The whole pipeline on damaged files: an error or a sample, never a panic.
        #[test]
        fn damaged_files_never_panic(cut in 0.0f64..1.0, flip_at in 0.0f64..1.0, bit in 0u8..8, id: u64) {
            let rgb = synth::photo(40, 30, 8, 10);
            for mut file in [png_of(&rgb, 40, 30), jpeg(&rgb, 40, 30, jpeg_encoder::ColorType::Rgb, 90, true)] {
                let i = ((file.len() as f64 * flip_at) as usize).min(file.len() - 1);
                file[i] ^= 1 << bit;
                file.truncate(((file.len() as f64 * cut) as usize).max(1));
                let spec = SampleSpec { transform: Transform::TRAIN_DEFAULT, output: Output::imagenet(Float::F32), reduced_decode: true };
                let mut p = Pipeline::new(spec).unwrap();
                let mut out = vec![0u8; spec.sample_bytes()];
                let _ = p.process(&file, SampleKey { seed: 0, epoch: 0, sample_id: id }, &mut out);
            }
        }
    }
}
