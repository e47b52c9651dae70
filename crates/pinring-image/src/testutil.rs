//! Encoders for the tests: JPEG through `jpeg-encoder`, PNG through `png`.

use jpeg_encoder::{ColorType, Encoder, SamplingFactor};

/// `pixels` (in `color`'s layout) as a JPEG of `quality`, with 4:2:0 chroma when `subsample`.
pub fn jpeg(
    pixels: &[u8],
    w: u32,
    h: u32,
    color: ColorType,
    quality: u8,
    subsample: bool,
) -> Vec<u8> {
    let mut buf = Vec::new();
    let mut enc = Encoder::new(&mut buf, quality);
    enc.set_sampling_factor(if subsample {
        SamplingFactor::F_2_2
    } else {
        SamplingFactor::F_1_1
    });
    enc.encode(pixels, w as u16, h as u16, color)
        .expect("encode JPEG");
    buf
}

/// `pixels` as a PNG of `color` and `depth` (16-bit samples big-endian, as PNG stores them).
pub fn png(pixels: &[u8], w: u32, h: u32, color: png::ColorType, depth: png::BitDepth) -> Vec<u8> {
    png_with(pixels, w, h, color, depth, None)
}

/// Like [`png`], with a palette for indexed images.
pub fn png_with(
    pixels: &[u8],
    w: u32,
    h: u32,
    color: png::ColorType,
    depth: png::BitDepth,
    palette: Option<&[u8]>,
) -> Vec<u8> {
    let mut buf = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut buf, w, h);
        enc.set_color(color);
        enc.set_depth(depth);
        if let Some(p) = palette {
            enc.set_palette(p.to_vec());
        }
        let mut wr = enc.write_header().expect("PNG header");
        wr.write_image_data(pixels).expect("PNG data");
    }
    buf
}

/// Mean absolute difference of two equally long byte slices.
pub fn mae(a: &[u8], b: &[u8]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| x.abs_diff(*y) as f64)
        .sum::<f64>()
        / a.len() as f64
}
