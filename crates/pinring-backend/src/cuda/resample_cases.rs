//! The cases both checks of the GPU decoder's resampling use: on a GPU host
//! (`gpu_resampling_is_the_cpu_paths_bit_for_bit`) and compiled for the CPU
//! (`tests/kernel_on_cpu.rs`, which includes this file by path). Lossless images, so the CPU
//! path decodes exactly the pixels the kernels are given.

use pinring_image::{synth, CropBox, SampleKey, Transform};

/// A case: an image's size, its RGB pixels, the same as a PNG, and the boxes (with flips) to
/// resample it with.
pub struct Case {
    pub size: (u32, u32),
    pub rgb: Vec<u8>,
    pub png: Vec<u8>,
    pub boxes: Vec<(CropBox, bool)>,
}

/// Five images (landscape, portrait, large, nearly the output's size, smaller than it), each
/// with 12 train boxes, the eval box, the whole image flipped, an inner fractional box and,
/// where the image is large enough, an integer box of the output's size (a copy), one of the
/// output's width only and one of its height only.
pub fn cases() -> Vec<Case> {
    let sizes = [
        (500u32, 375u32),
        (375, 500),
        (1200, 900),
        (230, 230),
        (100, 80),
    ];
    sizes
        .into_iter()
        .enumerate()
        .map(|(i, (w, h))| {
            let rgb = synth::photo(w, h, i as u64 + 7, 20);
            let mut png = Vec::new();
            let mut enc = png::Encoder::new(&mut png, w, h);
            enc.set_color(png::ColorType::Rgb);
            enc.set_depth(png::BitDepth::Eight);
            enc.write_header().unwrap().write_image_data(&rgb).unwrap();
            let (wf, hf) = (f64::from(w), f64::from(h));
            let key = |k| SampleKey {
                seed: 5,
                epoch: 2,
                sample_id: k,
            };
            let mut boxes: Vec<(CropBox, bool)> = (0..12)
                .map(|k| Transform::TRAIN_DEFAULT.plan(w, h, key(k)))
                .collect();
            boxes.push(Transform::EVAL_DEFAULT.plan(w, h, key(0)));
            let cb = |left, top, width, height| CropBox {
                left,
                top,
                width,
                height,
            };
            boxes.push((cb(0.0, 0.0, wf, hf), true));
            boxes.push((cb(wf * 0.3, hf * 0.4, wf * 0.7, hf * 0.6), false));
            if w >= 234 && h >= 231 {
                boxes.push((cb(10.0, 7.0, 224.0, 224.0), false));
                boxes.push((cb(3.0, 0.5, 224.0, hf - 1.0), true));
                boxes.push((cb(2.5, 4.0, wf - 3.0, 224.0), false));
            }
            Case {
                size: (w, h),
                rgb,
                png,
                boxes,
            }
        })
        .collect()
}
