//! Decoding JPEG and PNG files to 8-bit RGB, interleaved (HWC), into a buffer the
//! [`Decoder`] owns and reuses.
//!
//! The format is told by the magic bytes ([`sniff`]), never by the file name.
//!
//! - JPEG, full size: `zune-jpeg` (pure Rust, SIMD). Grayscale is replicated to R = G = B;
//!   CMYK and YCCK are converted by zune-jpeg: R = C'·K'/255 on the stored values, which
//!   CMYK JPEGs store inverted (Adobe's convention), so R = (255 - C)(255 - K)/255 in ink
//!   terms; likewise G from M and B from Y. A JPEG truncated after its headers decodes, the
//!   missing blocks filled (as libjpeg-turbo does), rather than failing.
//! - JPEG, reduced size: when the caller allows it ([`Decoder::decode`]'s `max_reduction`),
//!   `jpeg-decoder`'s reduced-size IDCT produces the image at 1/2, 1/4 or 1/8 of its size
//!   directly, skipping most of the IDCT and colour conversion work. Only 1- and 3-component
//!   JPEGs are decoded this way; CMYK ones are always decoded at full size.
//! - PNG: the `png` crate, expanded to 8 bits per channel (palettes expanded, 16-bit
//!   samples reduced to their high byte); grayscale is replicated to R = G = B and alpha is
//!   dropped without compositing, as PIL's `convert("RGB")` does.
//!
//! docs/IMAGES.md says why these crates. A decoder that panics on some input would take the
//! loader down, so every call into a decoder crate also runs under `catch_unwind`, and a panic
//! becomes [`ImageError::Corrupt`].

use std::fmt;
use std::io::Cursor;
use std::panic::{catch_unwind, AssertUnwindSafe};

use zune_core::bytestream::ZCursor;
use zune_core::colorspace::ColorSpace;
use zune_core::options::DecoderOptions;

use crate::error::{HexHead, ImageError};

/// Default cap on the pixels of one image (about PIL's decompression-bomb limit).
pub const DEFAULT_MAX_PIXELS: u64 = 89_478_485;

/// An image file format, as told by its magic bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// JPEG (JFIF, Exif): starts with `ff d8 ff`.
    Jpeg,
    /// PNG: starts with `89 50 4e 47 0d 0a 1a 0a`.
    Png,
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Jpeg => "JPEG",
            Format::Png => "PNG",
        })
    }
}

/// Tells the format of `data` from its first bytes.
pub fn sniff(data: &[u8]) -> Result<Format, ImageError> {
    if data.is_empty() {
        Err(ImageError::Empty)
    } else if data.starts_with(&[0xff, 0xd8, 0xff]) {
        Ok(Format::Jpeg)
    } else if data.starts_with(&[0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a]) {
        Ok(Format::Png)
    } else {
        Err(ImageError::UnknownFormat {
            len: data.len(),
            head: HexHead::of(data),
        })
    }
}

/// What the headers of an image say, read without decoding the pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageInfo {
    /// The file format.
    pub format: Format,
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
}

/// A decoded image: 8-bit RGB, row-major, `width * height * 3` bytes, borrowed from the
/// [`Decoder`] until its next call.
#[derive(Debug, Clone, Copy)]
pub struct DecodedImage<'a> {
    /// Width of `rgb` in pixels (the file's width, or less when decoded at a reduced size).
    pub width: u32,
    /// Height of `rgb` in pixels.
    pub height: u32,
    /// The file's own width.
    pub full_width: u32,
    /// The file's own height.
    pub full_height: u32,
    /// The pixels: `rgb[(y * width + x) * 3 + c]`, c = 0 (R), 1 (G), 2 (B).
    pub rgb: &'a [u8],
}

/// Decoded pixels as [`crate::Pipeline`] takes them: RGB, or RGBX where
/// [`Decoder::decode_raster`] was allowed to give it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Raster<'a> {
    /// Width of `pixels` in pixels.
    pub width: u32,
    /// Height of `pixels` in pixels.
    pub height: u32,
    /// The file's own width.
    pub full_width: u32,
    /// The file's own height.
    pub full_height: u32,
    /// The height of the whole image at the size decoded: `height`, or more where only the
    /// top rows were decoded.
    pub scaled_height: u32,
    /// Bytes a pixel: 3 (RGB) or 4 (RGBX, X = 255).
    pub channels: usize,
    /// `pixels[(y * width + x) * channels + c]`, c = 0 (R), 1 (G), 2 (B).
    pub pixels: &'a [u8],
}

/// Decodes JPEG and PNG files; owns the pixel buffer it decodes into and reuses it.
#[derive(Debug)]
pub struct Decoder {
    max_pixels: u64,
    rgb: Vec<u8>,
    tmp: Vec<u8>,
    /// A copy of the file with its frame height lowered ([`Decoder::decode_raster`]).
    file: Vec<u8>,
}

impl Default for Decoder {
    fn default() -> Self {
        Decoder::new()
    }
}

impl Decoder {
    /// A decoder with the [`DEFAULT_MAX_PIXELS`] limit.
    pub fn new() -> Decoder {
        Decoder {
            max_pixels: DEFAULT_MAX_PIXELS,
            rgb: Vec::new(),
            tmp: Vec::new(),
            file: Vec::new(),
        }
    }

    /// Sets the largest image (width × height) this decoder accepts; larger ones are
    /// refused with [`ImageError::TooLarge`] before their pixels are decoded.
    pub fn with_max_pixels(mut self, max_pixels: u64) -> Decoder {
        self.max_pixels = max_pixels;
        self
    }

    /// Reads the format and size from the headers, without decoding the pixels.
    pub fn info(&self, data: &[u8]) -> Result<ImageInfo, ImageError> {
        let format = sniff(data)?;
        let (width, height) = guarded(format, data.len(), || match format {
            Format::Jpeg => {
                let mut d = zune_decoder(data, self.max_pixels);
                d.decode_headers().map_err(|e| corrupt(format, data, e))?;
                let (w, h) = d.dimensions().ok_or_else(|| {
                    corrupt(format, data, "no frame header (SOF) before the image data")
                })?;
                Ok((w as u64, h as u64))
            }
            Format::Png => {
                let r = png_reader(data, self.max_pixels)?;
                let info = r.info();
                Ok((info.width as u64, info.height as u64))
            }
        })?;
        self.check_size(format, width, height)?;
        Ok(ImageInfo {
            format,
            width: width as u32,
            height: height as u32,
        })
    }

    /// Decodes `data` to RGB.
    ///
    /// `max_reduction` (1, 2, 4 or 8; other values are rounded down to one of these) lets the
    /// decoder return the image shrunk by a power of two up to that factor, when it can do so
    /// more cheaply than decoding it whole (JPEG's reduced-size IDCT). The result says what
    /// size it has; a reduced dimension is `ceil(full / factor)`.
    pub fn decode(
        &mut self,
        data: &[u8],
        max_reduction: u32,
    ) -> Result<DecodedImage<'_>, ImageError> {
        let r = self.decode_raster(data, max_reduction, false, u32::MAX)?;
        debug_assert_eq!(r.channels, 3);
        Ok(DecodedImage {
            width: r.width,
            height: r.height,
            full_width: r.full_width,
            full_height: r.full_height,
            rgb: r.pixels,
        })
    }

    /// As [`Decoder::decode`], but where `rgbx` is set a colour JPEG decoded at full size
    /// comes as RGBX (4 bytes a pixel, X = 255): zune-jpeg writes that as fast as RGB, and
    /// the resampler works faster on 4-byte pixels. Every other image comes as RGB.
    ///
    /// Only the rows from the top to `rows` (in the file's pixels) are needed: a baseline JPEG
    /// decoded at full size may then be decoded down to a little beyond that row only
    /// ([`stop_row`]), its rows being those of a whole decode.
    pub(crate) fn decode_raster(
        &mut self,
        data: &[u8],
        max_reduction: u32,
        rgbx: bool,
        rows: u32,
    ) -> Result<Raster<'_>, ImageError> {
        let format = sniff(data)?;
        let reduction = match max_reduction {
            8.. => 8,
            4..=7 => 4,
            2 | 3 => 2,
            _ => 1,
        };
        let max_pixels = self.max_pixels;
        let (rgb, tmp, file) = (&mut self.rgb, &mut self.tmp, &mut self.file);
        let mut whole = (0, 0);
        let (w, h, fw, fh, channels) = guarded(format, data.len(), || match format {
            Format::Jpeg if reduction > 1 => {
                match decode_jpeg_reduced(data, reduction, max_pixels, rgb)? {
                    Some((w, h, fw, fh)) => Ok((w, h, fw, fh, 3)),
                    None => decode_jpeg(data, max_pixels, rgbx, rgb, tmp),
                }
            }
            Format::Jpeg => {
                // A baseline JPEG that needs fewer rows than it has: decode a copy whose frame
                // header says it has only those rows. The decoder then stops there.
                if let Some(frame) = baseline_frame(data) {
                    let stop = stop_row(rows, frame.mcu_rows);
                    if stop < frame.height as u32 {
                        check_size(format, frame.width as u64, frame.height as u64, max_pixels)?;
                        file.clear();
                        file.extend_from_slice(data);
                        file[frame.height_at..frame.height_at + 2]
                            .copy_from_slice(&(stop as u16).to_be_bytes());
                        let (w, h, _, _, ch) = decode_jpeg(file, max_pixels, rgbx, rgb, tmp)?;
                        whole = (frame.width as u32, frame.height as u32);
                        return Ok((w, h, whole.0, whole.1, ch));
                    }
                }
                decode_jpeg(data, max_pixels, rgbx, rgb, tmp)
            }
            Format::Png => {
                let (w, h, fw, fh) = decode_png(data, max_pixels, rgb, tmp)?;
                Ok((w, h, fw, fh, 3))
            }
        })?;
        Ok(Raster {
            width: w,
            height: h,
            full_width: fw,
            full_height: fh,
            scaled_height: if whole.1 > 0 { whole.1 } else { h },
            channels,
            pixels: &self.rgb[..w as usize * h as usize * channels],
        })
    }

    fn check_size(&self, format: Format, width: u64, height: u64) -> Result<(), ImageError> {
        check_size(format, width, height, self.max_pixels)
    }
}

fn check_size(format: Format, width: u64, height: u64, max_pixels: u64) -> Result<(), ImageError> {
    if width == 0 || height == 0 {
        return Err(ImageError::Corrupt {
            format,
            len: 0,
            detail: format!("the header gives a size of {width}x{height} pixels"),
        });
    }
    if width.saturating_mul(height) > max_pixels
        || width > u32::MAX as u64
        || height > u32::MAX as u64
    {
        return Err(ImageError::TooLarge {
            format,
            width,
            height,
            max_pixels,
        });
    }
    Ok(())
}

fn corrupt(format: Format, data: &[u8], detail: impl fmt::Display) -> ImageError {
    let detail = detail.to_string();
    let detail = detail.trim().trim_start_matches("I/O errors").trim();
    let truncated = [
        "Not enough bytes",
        "failed to fill whole buffer",
        "unexpected EOF",
        "Exhausted",
    ]
    .iter()
    .any(|m| detail.contains(m));
    let detail = if truncated {
        format!("premature end of data before the image was complete (decoder: {detail})")
    } else {
        detail.to_string()
    };
    ImageError::Corrupt {
        format,
        len: data.len(),
        detail,
    }
}

/// Runs `f`, turning a panic inside a decoder crate into [`ImageError::Corrupt`].
fn guarded<T>(
    format: Format,
    len: usize,
    f: impl FnOnce() -> Result<T, ImageError>,
) -> Result<T, ImageError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(result) => result,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown".to_string());
            Err(ImageError::Corrupt {
                format,
                len,
                detail: format!("the decoder failed on it ({what})"),
            })
        }
    }
}

fn zune_decoder(data: &[u8], max_pixels: u64) -> zune_jpeg::JpegDecoder<ZCursor<&[u8]>> {
    zune_decoder_to(data, max_pixels, ColorSpace::RGB)
}

/// A zune-jpeg decoder that writes `out` (RGB or RGBA): zune-jpeg picks its colour
/// conversion before it reads the headers, so the output colour space is fixed here.
fn zune_decoder_to(
    data: &[u8],
    max_pixels: u64,
    out: ColorSpace,
) -> zune_jpeg::JpegDecoder<ZCursor<&[u8]>> {
    let side = max_pixels.min(u16::MAX as u64 * 2) as usize;
    let options = DecoderOptions::default()
        .jpeg_set_out_colorspace(out)
        .set_max_width(side)
        .set_max_height(side);
    zune_jpeg::JpegDecoder::new_with_options(ZCursor::new(data), options)
}

/// Full-size JPEG decode into `rgb`; returns (width, height, width, height, channels): RGBX
/// (4 channels) where `rgbx` is set and the JPEG is YCbCr, else RGB.
fn decode_jpeg(
    data: &[u8],
    max_pixels: u64,
    rgbx: bool,
    rgb: &mut Vec<u8>,
    tmp: &mut Vec<u8>,
) -> Result<(u32, u32, u32, u32, usize), ImageError> {
    let format = Format::Jpeg;
    let out = if rgbx {
        ColorSpace::RGBA
    } else {
        ColorSpace::RGB
    };
    let mut d = zune_decoder_to(data, max_pixels, out);
    d.decode_headers().map_err(|e| corrupt(format, data, e))?;
    if rgbx && d.input_colorspace() != Some(ColorSpace::YCbCr) {
        // Grayscale, CMYK, YCCK, RGB: the plain RGB path, the one `Decoder::decode` takes.
        d = zune_decoder(data, max_pixels);
        d.decode_headers().map_err(|e| corrupt(format, data, e))?;
    }
    let (w, h) = d
        .dimensions()
        .ok_or_else(|| corrupt(format, data, "no frame header (SOF) before the image data"))?;
    let (w, h) = (w as u64, h as u64);
    check_size(format, w, h, max_pixels)?;
    let pixels = (w * h) as usize;
    let out_cs = d
        .output_colorspace()
        .ok_or_else(|| corrupt(format, data, "no colour space after the headers"))?;
    let needed = d
        .output_buffer_size()
        .ok_or_else(|| corrupt(format, data, "no output size after the headers"))?;
    let channels = match out_cs {
        ColorSpace::RGB | ColorSpace::RGBA => {
            let channels = out_cs.num_components();
            resize_buf(rgb, needed.max(pixels * channels));
            d.decode_into(rgb).map_err(|e| corrupt(format, data, e))?;
            channels
        }
        ColorSpace::Luma => {
            resize_buf(tmp, needed.max(pixels));
            d.decode_into(tmp).map_err(|e| corrupt(format, data, e))?;
            resize_buf(rgb, pixels * 3);
            gray_to_rgb(&tmp[..pixels], &mut rgb[..pixels * 3]);
            3
        }
        other => {
            return Err(ImageError::Unsupported {
                format,
                what: format!("output colour space {other:?}"),
            })
        }
    };
    Ok((w as u32, h as u32, w as u32, h as u32, channels))
}

/// Reduced-size JPEG decode into `rgb`; `None` when this JPEG is not one to decode this way
/// (CMYK, 16-bit), so that the caller decodes it at full size instead.
fn decode_jpeg_reduced(
    data: &[u8],
    reduction: u32,
    max_pixels: u64,
    rgb: &mut Vec<u8>,
) -> Result<Option<(u32, u32, u32, u32)>, ImageError> {
    let format = Format::Jpeg;
    let mut d = jpeg_decoder::Decoder::new(data);
    d.set_max_decoding_buffer_size(
        usize::try_from(max_pixels.saturating_mul(4)).unwrap_or(usize::MAX),
    );
    d.read_info().map_err(|e| corrupt(format, data, e))?;
    let Some(info) = d.info() else {
        return Err(corrupt(
            format,
            data,
            "no frame header (SOF) before the image data",
        ));
    };
    let (fw, fh) = (info.width as u32, info.height as u32);
    check_size(format, fw as u64, fh as u64, max_pixels)?;
    let components = match info.pixel_format {
        jpeg_decoder::PixelFormat::L8 => 1,
        jpeg_decoder::PixelFormat::RGB24 => 3,
        _ => return Ok(None),
    };
    let want_w = fw.div_ceil(reduction).min(u16::MAX as u32) as u16;
    let want_h = fh.div_ceil(reduction).min(u16::MAX as u32) as u16;
    let (w, h) = d
        .scale(want_w, want_h)
        .map_err(|e| corrupt(format, data, e))?;
    let pixels_out = d.decode().map_err(|e| corrupt(format, data, e))?;
    let (w, h) = (w as usize, h as usize);
    if pixels_out.len() < w * h * components {
        return Err(corrupt(
            format,
            data,
            format!(
                "the decoder returned {} bytes for {w}x{h} pixels",
                pixels_out.len()
            ),
        ));
    }
    resize_buf(rgb, w * h * 3);
    if components == 3 {
        rgb[..w * h * 3].copy_from_slice(&pixels_out[..w * h * 3]);
    } else {
        gray_to_rgb(&pixels_out[..w * h], &mut rgb[..w * h * 3]);
    }
    Ok(Some((w as u32, h as u32, fw, fh)))
}

/// The frame of a JPEG that can be decoded down to a given row only: baseline or extended
/// sequential Huffman (SOF0, SOF1), whose first scan holds every component (so that each row
/// of MCUs is complete when decoded). Read from the marker segments up to the first SOS.
#[derive(Debug, Clone, Copy, PartialEq)]
struct BaselineFrame {
    /// Offset of the frame header's 2-byte height in the file.
    height_at: usize,
    width: u16,
    height: u16,
    /// Rows of pixels in one row of MCUs: 8 × the largest vertical sampling factor.
    mcu_rows: u32,
}

fn baseline_frame(data: &[u8]) -> Option<BaselineFrame> {
    let mut i = 2; // after SOI
    let mut frame: Option<(BaselineFrame, u8)> = None;
    loop {
        if *data.get(i)? != 0xff {
            return None;
        }
        while *data.get(i)? == 0xff {
            i += 1; // fill bytes
        }
        let marker = data[i];
        let len = u16::from_be_bytes([*data.get(i + 1)?, *data.get(i + 2)?]) as usize;
        let seg = data.get(i + 3..i + 1 + len)?;
        match marker {
            0xc0 | 0xc1 => {
                // P, Y (2), X (2), Nf, then Nf × (id, HV, Tq).
                let nf = *seg.get(5)?;
                let comps = seg.get(6..6 + 3 * nf as usize)?;
                let vmax = comps.chunks_exact(3).map(|c| c[1] & 0x0f).max()?;
                let height = u16::from_be_bytes([seg[1], seg[2]]);
                if !(1..=4).contains(&vmax) || height == 0 || frame.is_some() {
                    return None;
                }
                frame = Some((
                    BaselineFrame {
                        height_at: i + 4,
                        width: u16::from_be_bytes([seg[3], seg[4]]),
                        height,
                        mcu_rows: 8 * vmax as u32,
                    },
                    nf,
                ));
            }
            // Any other frame type (progressive, lossless, arithmetic, hierarchical).
            0xc2 | 0xc3 | 0xc5..=0xc7 | 0xc9..=0xcb | 0xcd..=0xcf => return None,
            0xda => {
                let (f, nf) = frame?;
                // One component: the scan is not interleaved and its rows of blocks are 8
                // pixels high, whatever the sampling factor says.
                let f = if nf == 1 {
                    BaselineFrame { mcu_rows: 8, ..f }
                } else {
                    f
                };
                return (*seg.first()? == nf).then_some(f);
            }
            0xd0..=0xd9 | 0x01 => return None,
            _ => {}
        }
        if len < 2 {
            return None;
        }
        i += 1 + len;
    }
}

/// The height to decode a JPEG to when rows down to `rows` are needed: rounded up to a whole
/// row of MCUs, plus one more, so that the rows needed get the chroma upsampling of a whole
/// decode (which looks at the next MCU row).
fn stop_row(rows: u32, mcu_rows: u32) -> u32 {
    (rows.saturating_add(mcu_rows - 1) / mcu_rows)
        .saturating_add(1)
        .saturating_mul(mcu_rows)
}

fn png_reader(data: &[u8], max_pixels: u64) -> Result<png::Reader<Cursor<&[u8]>>, ImageError> {
    let mut d = png::Decoder::new_with_limits(
        Cursor::new(data),
        png::Limits {
            bytes: usize::try_from(max_pixels.saturating_mul(8)).unwrap_or(usize::MAX),
        },
    );
    d.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
    d.read_info().map_err(|e| match e {
        png::DecodingError::LimitsExceeded => ImageError::TooLarge {
            format: Format::Png,
            width: 0,
            height: 0,
            max_pixels,
        },
        e => corrupt(Format::Png, data, e),
    })
}

fn decode_png(
    data: &[u8],
    max_pixels: u64,
    rgb: &mut Vec<u8>,
    tmp: &mut Vec<u8>,
) -> Result<(u32, u32, u32, u32), ImageError> {
    let format = Format::Png;
    let mut r = png_reader(data, max_pixels)?;
    let (w, h) = (r.info().width, r.info().height);
    check_size(format, w as u64, h as u64, max_pixels)?;
    let (color, depth) = r.output_color_type();
    if depth != png::BitDepth::Eight {
        return Err(ImageError::Unsupported {
            format,
            what: format!("{depth:?} bits per sample after expansion"),
        });
    }
    let size = r
        .output_buffer_size()
        .ok_or_else(|| corrupt(format, data, "the image is too large to hold in memory"))?;
    let pixels = w as usize * h as usize;
    let channels = match color {
        png::ColorType::Grayscale => 1,
        png::ColorType::GrayscaleAlpha => 2,
        png::ColorType::Rgb => 3,
        png::ColorType::Rgba => 4,
        png::ColorType::Indexed => {
            return Err(ImageError::Unsupported {
                format,
                what: "a palette that was not expanded".to_string(),
            })
        }
    };
    if channels == 3 {
        resize_buf(rgb, size.max(pixels * 3));
        r.next_frame(rgb).map_err(|e| corrupt(format, data, e))?;
    } else {
        resize_buf(tmp, size.max(pixels * channels));
        r.next_frame(tmp).map_err(|e| corrupt(format, data, e))?;
        resize_buf(rgb, pixels * 3);
        let out = &mut rgb[..pixels * 3];
        let src = &tmp[..pixels * channels];
        match channels {
            1 => gray_to_rgb(src, out),
            2 => {
                for (o, i) in out.chunks_exact_mut(3).zip(src.chunks_exact(2)) {
                    o.fill(i[0]);
                }
            }
            _ => {
                for (o, i) in out.chunks_exact_mut(3).zip(src.chunks_exact(4)) {
                    o.copy_from_slice(&i[..3]);
                }
            }
        }
    }
    Ok((w, h, w, h))
}

fn resize_buf(buf: &mut Vec<u8>, len: usize) {
    if buf.len() < len {
        buf.resize(len, 0);
    }
}

fn gray_to_rgb(gray: &[u8], rgb: &mut [u8]) {
    for (o, &g) in rgb.chunks_exact_mut(3).zip(gray) {
        o.fill(g);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth;
    use crate::testutil::{jpeg, mae, png, png_with};
    use jpeg_encoder::ColorType as J;
    use png::{BitDepth, ColorType as P};
    use proptest::prelude::*;

    const W: u32 = 37;
    const H: u32 = 23;

    fn decode_all(data: &[u8]) -> (u32, u32, Vec<u8>) {
        let mut d = Decoder::new();
        let img = d.decode(data, 1).expect("decode");
        (img.width, img.height, img.rgb.to_vec())
    }

    #[test]
    fn sniffs_magic_bytes_not_names() {
        let rgb = synth::photo(W, H, 1, 0);
        assert_eq!(sniff(&jpeg(&rgb, W, H, J::Rgb, 90, true)), Ok(Format::Jpeg));
        assert_eq!(
            sniff(&png(&rgb, W, H, P::Rgb, BitDepth::Eight)),
            Ok(Format::Png)
        );
        assert_eq!(sniff(b""), Err(ImageError::Empty));
        let e = Decoder::new().decode(b"GIF89a....", 1).unwrap_err();
        assert!(e.to_string().contains("47 49 46 38 39 61 2e 2e"), "{e}");
    }

    #[test]
    fn rgbx_is_rgb_plus_255_for_colour_jpegs_and_rgb_otherwise() {
        let rgb = synth::photo(W, H, 12, 20);
        let gray: Vec<u8> = rgb.iter().step_by(3).copied().collect();
        let cmyk: Vec<u8> = rgb.chunks(3).flat_map(|p| [p[0], p[1], p[2], 40]).collect();
        let cases = [
            (jpeg(&rgb, W, H, J::Rgb, 90, true), 4),
            (jpeg(&rgb, W, H, J::Rgb, 90, false), 4),
            (jpeg(&gray, W, H, J::Luma, 90, false), 3),
            (jpeg(&cmyk, W, H, J::Cmyk, 90, false), 3),
            (png(&rgb, W, H, P::Rgb, BitDepth::Eight), 3),
        ];
        for (i, (file, channels)) in cases.iter().enumerate() {
            let want = decode_all(file).2;
            let mut d = Decoder::new();
            let r = d.decode_raster(file, 1, true, u32::MAX).unwrap();
            assert_eq!(
                (r.width, r.height, r.channels),
                (W, H, *channels),
                "case {i}"
            );
            let got: Vec<u8> = if r.channels == 4 {
                assert!(r.pixels.chunks_exact(4).all(|p| p[3] == 255), "case {i}");
                r.pixels
                    .chunks_exact(4)
                    .flat_map(|p| p[..3].to_vec())
                    .collect()
            } else {
                r.pixels.to_vec()
            };
            assert_eq!(got, want, "case {i}");
        }
    }

    #[test]
    fn decoding_down_to_a_row_gives_the_rows_of_a_whole_decode() {
        use jpeg_encoder::{Encoder, SamplingFactor as S};
        let (w, h) = (101u32, 203u32);
        let rgb = synth::photo(w, h, 13, 20);
        let gray: Vec<u8> = rgb.iter().step_by(3).copied().collect();
        let enc = |pixels: &[u8], color, sampling, progressive, restart| {
            let mut buf = Vec::new();
            let mut e = Encoder::new(&mut buf, 90);
            e.set_sampling_factor(sampling);
            e.set_progressive(progressive);
            e.set_restart_interval(restart);
            e.encode(pixels, w as u16, h as u16, color).unwrap();
            buf
        };
        for (i, (file, cut)) in [
            (enc(&rgb, J::Rgb, S::F_2_2, false, 0), true),
            (enc(&rgb, J::Rgb, S::F_1_1, false, 0), true),
            (enc(&rgb, J::Rgb, S::F_1_2, false, 0), true),
            (enc(&rgb, J::Rgb, S::F_2_1, false, 3), true),
            (enc(&gray, J::Luma, S::F_1_1, false, 0), true),
            (enc(&rgb, J::Rgb, S::F_2_2, true, 0), false),
        ]
        .iter()
        .enumerate()
        {
            assert_eq!(baseline_frame(file).is_some(), *cut, "case {i}");
            let whole = decode_all(file).2;
            for rows in [1u32, 7, 16, 17, 100, 170, 186, 203, 1000] {
                let mut d = Decoder::new();
                let r = d.decode_raster(file, 1, false, rows).unwrap();
                assert_eq!((r.width, r.full_height, r.scaled_height), (w, h, h));
                assert!(r.height >= rows.min(h), "case {i}, rows {rows}");
                assert!(*cut || r.height == h, "case {i}");
                let n = (rows.min(h) * w * 3) as usize;
                assert_eq!(r.pixels[..n], whole[..n], "case {i}, rows {rows}");
            }
        }
    }

    #[test]
    fn png_rgb_is_exact() {
        let rgb = synth::photo(W, H, 2, 20);
        let (w, h, out) = decode_all(&png(&rgb, W, H, P::Rgb, BitDepth::Eight));
        assert_eq!((w, h), (W, H));
        assert_eq!(out, rgb);
    }

    #[test]
    fn png_other_colour_types_become_rgb() {
        let rgb = synth::photo(W, H, 3, 20);
        let n = (W * H) as usize;
        let gray: Vec<u8> = rgb.iter().step_by(3).copied().collect();
        let gray3: Vec<u8> = gray.iter().flat_map(|&g| [g, g, g]).collect();
        // Grayscale: replicated.
        assert_eq!(
            decode_all(&png(&gray, W, H, P::Grayscale, BitDepth::Eight)).2,
            gray3
        );
        // Gray + alpha: alpha dropped.
        let ga: Vec<u8> = gray.iter().flat_map(|&g| [g, 7]).collect();
        assert_eq!(
            decode_all(&png(&ga, W, H, P::GrayscaleAlpha, BitDepth::Eight)).2,
            gray3
        );
        // RGBA: alpha dropped, not composited.
        let rgba: Vec<u8> = rgb.chunks(3).flat_map(|p| [p[0], p[1], p[2], 0]).collect();
        assert_eq!(
            decode_all(&png(&rgba, W, H, P::Rgba, BitDepth::Eight)).2,
            rgb
        );
        // 16-bit: the high byte.
        let rgb16: Vec<u8> = rgb.iter().flat_map(|&v| [v, 0x5a]).collect();
        assert_eq!(
            decode_all(&png(&rgb16, W, H, P::Rgb, BitDepth::Sixteen)).2,
            rgb
        );
        // Palette: expanded.
        let palette = [10, 20, 30, 40, 50, 60];
        let idx: Vec<u8> = (0..n).map(|i| (i % 2) as u8).collect();
        let want: Vec<u8> = idx
            .iter()
            .flat_map(|&i| palette[i as usize * 3..][..3].to_vec())
            .collect();
        let file = png_with(&idx, W, H, P::Indexed, BitDepth::Eight, Some(&palette));
        assert_eq!(decode_all(&file).2, want);
    }

    /// JPEG tolerance: mean absolute error against the encoder's input, per channel byte.
    /// Quality 95 without chroma subsampling: below 2; quality 90 with 4:2:0: below 4.
    #[test]
    fn jpeg_is_close_to_the_encoder_input() {
        let rgb = synth::photo(64, 48, 4, 3);
        let (w, h, out) = decode_all(&jpeg(&rgb, 64, 48, J::Rgb, 95, false));
        assert_eq!((w, h), (64, 48));
        let e = mae(&out, &rgb);
        assert!(e < 2.0, "{e}");
        let (_, _, out) = decode_all(&jpeg(&rgb, 64, 48, J::Rgb, 90, true));
        let e = mae(&out, &rgb);
        assert!(e < 4.0, "{e}");
    }

    #[test]
    fn jpeg_grayscale_and_cmyk_become_rgb() {
        let rgb = synth::photo(64, 48, 5, 0);
        let gray: Vec<u8> = rgb.iter().step_by(3).copied().collect();
        let (_, _, out) = decode_all(&jpeg(&gray, 64, 48, J::Luma, 95, false));
        assert!(out.chunks(3).all(|p| p[0] == p[1] && p[1] == p[2]));
        let gray3: Vec<u8> = gray.iter().flat_map(|&g| [g, g, g]).collect();
        assert!(mae(&out, &gray3) < 2.0);
        // CMYK with K = 0 and C, M, Y = 255 - R, G, B: RGB comes back.
        let cmyk: Vec<u8> = rgb
            .chunks(3)
            .flat_map(|p| [255 - p[0], 255 - p[1], 255 - p[2], 0])
            .collect();
        let (_, _, out) = decode_all(&jpeg(&cmyk, 64, 48, J::Cmyk, 95, false));
        let e = mae(&out, &rgb);
        assert!(e < 3.0, "{e}");
    }

    #[test]
    fn reduced_decode_gives_a_smaller_image_of_the_same_picture() {
        let (w, h) = (128u32, 96u32);
        let rgb = synth::photo(w, h, 6, 0);
        let file = jpeg(&rgb, w, h, J::Rgb, 95, false);
        let mut d = Decoder::new();
        let img = d.decode(&file, 4).expect("decode");
        assert_eq!(
            (img.width, img.height, img.full_width, img.full_height),
            (32, 24, w, h)
        );
        // Compare with 4x4 box averages of the input.
        let mut boxed = Vec::new();
        for y in 0..24usize {
            for x in 0..32usize {
                for c in 0..3 {
                    let mut s = 0u32;
                    for dy in 0..4 {
                        for dx in 0..4 {
                            s += rgb[((y * 4 + dy) * w as usize + x * 4 + dx) * 3 + c] as u32;
                        }
                    }
                    boxed.push((s / 16) as u8);
                }
            }
        }
        let e = mae(img.rgb, &boxed);
        assert!(e < 3.0, "{e}");
        // Reduction 1 is a full decode.
        assert_eq!(d.decode(&file, 1).unwrap().width, w);
    }

    #[test]
    fn refuses_images_over_the_pixel_limit() {
        let rgb = synth::photo(W, H, 7, 0);
        for file in [
            jpeg(&rgb, W, H, J::Rgb, 90, true),
            png(&rgb, W, H, P::Rgb, BitDepth::Eight),
        ] {
            let mut d = Decoder::new().with_max_pixels(100);
            let e = d.decode(&file, 1).unwrap_err();
            assert!(matches!(e, ImageError::TooLarge { .. }), "{e}");
            // The fix it names exists: no key to raise, a policy to skip.
            let msg = e.to_string();
            assert!(
                !msg.contains("max_pixels") && msg.contains("on_bad_sample"),
                "{msg}"
            );
            assert!(matches!(d.info(&file), Err(ImageError::TooLarge { .. })));
            assert_eq!(Decoder::new().info(&file).unwrap().width, W);
        }
    }

    #[test]
    fn truncated_jpeg_is_an_error_or_a_padded_image() {
        let rgb = synth::photo(64, 48, 8, 3);
        let file = jpeg(&rgb, 64, 48, J::Rgb, 90, true);
        let mut d = Decoder::new();
        match d.decode(&file[..file.len() / 2], 1) {
            Ok(img) => assert_eq!(img.rgb.len(), 64 * 48 * 3),
            Err(e) => assert!(e.to_string().starts_with("corrupt JPEG"), "{e}"),
        }
        let e = d.decode(&file[..100], 1).unwrap_err();
        assert!(e.to_string().contains("re-encode it or drop it"), "{e}");
        assert!(e.to_string().contains("premature end of data"), "{e}");
        let e = d.decode(&file[..100], 4).unwrap_err();
        assert!(e.to_string().contains("premature end of data"), "{e}");
    }

    fn samples() -> Vec<Vec<u8>> {
        let rgb = synth::photo(24, 16, 9, 10);
        let gray: Vec<u8> = rgb.iter().step_by(3).copied().collect();
        vec![
            jpeg(&rgb, 24, 16, J::Rgb, 90, true),
            jpeg(&rgb, 24, 16, J::Rgb, 80, false),
            jpeg(&gray, 24, 16, J::Luma, 90, false),
            png(&rgb, 24, 16, P::Rgb, BitDepth::Eight),
            png(&gray, 24, 16, P::Grayscale, BitDepth::Eight),
        ]
    }

    /// Decodes with every reduction; fails on a panic inside a decoder crate (which
    /// [`guarded`] would have turned into an error).
    fn no_panic(data: &[u8]) -> Result<(), TestCaseError> {
        let mut d = Decoder::new().with_max_pixels(1 << 20);
        for r in [1, 4] {
            if let Err(ImageError::Corrupt { detail, .. }) = d.decode(data, r) {
                prop_assert!(!detail.starts_with("the decoder failed on it"), "{detail}");
            }
        }
        let _ = d.info(data);
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

        #[test]
        fn random_bytes_never_panic(prefix in 0usize..3, body in proptest::collection::vec(any::<u8>(), 0..600)) {
            let heads: [&[u8]; 3] = [b"", &[0xff, 0xd8, 0xff], &[0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a]];
            let mut data = heads[prefix].to_vec();
            data.extend(body);
            no_panic(&data)?;
        }

        #[test]
        fn truncated_files_never_panic(which in 0usize..5, cut in 0.0f64..1.0) {
            let file = &samples()[which];
            no_panic(&file[..(file.len() as f64 * cut) as usize])?;
        }

        #[test]
        fn bit_flipped_files_never_panic(which in 0usize..5, flips in proptest::collection::vec((0.0f64..1.0, 0u8..8), 1..6)) {
            let mut file = samples()[which].clone();
            for (at, bit) in flips {
                let i = ((file.len() as f64 * at) as usize).min(file.len() - 1);
                file[i] ^= 1 << bit;
            }
            no_panic(&file)?;
        }
    }
}
