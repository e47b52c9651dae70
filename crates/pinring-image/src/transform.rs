//! The geometry of the transforms, as pure functions: where to crop, whether to flip.
//!
//! - Eval ([`center_crop_box`]): torchvision's `Resize(resize)` then `CenterCrop(crop)`.
//!   Resize scales the shorter side to `resize` and the longer one to
//!   `floor(resize * long / short)`; the crop's top-left corner in the resized image is
//!   `round((resized - crop) / 2)` on each axis. Here both steps are one resampling: the crop
//!   window is mapped back to the source image as a box with fractional edges, and that box
//!   is resampled to `crop`×`crop`.
//! - Train ([`random_resized_crop_box`]): torchvision's `RandomResizedCrop` box (scale and
//!   ratio ranges, 10 attempts, then the centre-crop fallback), then a horizontal flip with
//!   probability `flip_p`.
//!
//! The randomness is a pure function of (seed, epoch, sample id): [`SampleRng::new`] mixes
//! the three through SplitMix64's finaliser into the state of a SplitMix64 generator; the
//! crop draws come first, in torchvision's order (area, log-ratio, then top and left when the
//! box fits), then one draw for the flip. No global generator is touched.

/// A crop window in source pixels; edges may be fractional (see [`center_crop_box`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CropBox {
    /// Left edge.
    pub left: f64,
    /// Top edge.
    pub top: f64,
    /// Width.
    pub width: f64,
    /// Height.
    pub height: f64,
}

/// Identifies one draw of the random transforms: the same key gives the same crop and flip.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SampleKey {
    /// The run's seed.
    pub seed: u64,
    /// The epoch.
    pub epoch: u64,
    /// The sample's id in the dataset.
    pub sample_id: u64,
}

/// SplitMix64 (Steele, Lea, Flood 2014), seeded from a [`SampleKey`].
#[derive(Debug, Clone)]
pub struct SampleRng {
    state: u64,
}

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl SampleRng {
    /// The generator for `key`: state = mix(mix(mix(seed) ^ epoch) ^ sample_id), with
    /// mix = SplitMix64's finaliser applied after adding the golden-ratio increment.
    pub fn new(key: SampleKey) -> SampleRng {
        let s = mix64(key.seed.wrapping_add(GOLDEN));
        let s = mix64((s ^ key.epoch).wrapping_add(GOLDEN));
        let s = mix64((s ^ key.sample_id).wrapping_add(GOLDEN));
        SampleRng { state: s }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN);
        mix64(self.state)
    }

    /// Uniform in [0, 1), 53 bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.next_f64()
    }

    /// Uniform integer in [0, n) (Lemire's multiply-shift; `n` = 0 gives 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
}

/// torchvision's `Resize(resize)` + `CenterCrop(crop)` as one box in the source image of
/// `width`×`height` pixels; resampling that box to `crop`×`crop` gives the same picture.
pub fn center_crop_box(width: u32, height: u32, resize: u32, crop: u32) -> CropBox {
    let (w, h) = (width as f64, height as f64);
    let (rw, rh) = if width <= height {
        (
            resize as u64,
            (resize as u64 * height as u64) / width as u64,
        )
    } else {
        (
            (resize as u64 * width as u64) / height as u64,
            resize as u64,
        )
    };
    let (sx, sy) = (w / rw as f64, h / rh as f64);
    // Python's round(), as torchvision calls it: halves to even.
    let left = ((rw as f64 - crop as f64) / 2.0).round_ties_even();
    let top = ((rh as f64 - crop as f64) / 2.0).round_ties_even();
    CropBox {
        left: left * sx,
        top: top * sy,
        width: crop as f64 * sx,
        height: crop as f64 * sy,
    }
}

/// torchvision's `RandomResizedCrop.get_params`: an integer box whose area is a `scale`
/// fraction of the image's and whose aspect ratio w/h is log-uniform in `ratio`, drawn at
/// most 10 times; if none fits, the largest centred box with a ratio in range.
pub fn random_resized_crop_box(
    width: u32,
    height: u32,
    scale: (f64, f64),
    ratio: (f64, f64),
    rng: &mut SampleRng,
) -> CropBox {
    let (wf, hf) = (width as f64, height as f64);
    let area = wf * hf;
    let (log_lo, log_hi) = (ratio.0.ln(), ratio.1.ln());
    for _ in 0..10 {
        let target_area = area * rng.uniform(scale.0, scale.1);
        let aspect = rng.uniform(log_lo, log_hi).exp();
        let w = (target_area * aspect).sqrt().round();
        let h = (target_area / aspect).sqrt().round();
        if w > 0.0 && h > 0.0 && w <= wf && h <= hf {
            let (w, h) = (w as u64, h as u64);
            let top = rng.below(height as u64 - h + 1);
            let left = rng.below(width as u64 - w + 1);
            return CropBox {
                left: left as f64,
                top: top as f64,
                width: w as f64,
                height: h as f64,
            };
        }
    }
    let in_ratio = wf / hf;
    let (w, h) = if in_ratio < ratio.0.min(ratio.1) {
        (wf, (wf / ratio.0.min(ratio.1)).round())
    } else if in_ratio > ratio.0.max(ratio.1) {
        ((hf * ratio.0.max(ratio.1)).round(), hf)
    } else {
        (wf, hf)
    };
    let (w, h) = (w.clamp(1.0, wf), h.clamp(1.0, hf));
    CropBox {
        left: ((wf - w) / 2.0).floor(),
        top: ((hf - h) / 2.0).floor(),
        width: w,
        height: h,
    }
}

/// Flips `rgb` (`width` pixels of 3 bytes a row) left to right, in place.
pub fn flip_horizontal(rgb: &mut [u8], width: usize) {
    if width == 0 {
        return;
    }
    for row in rgb.chunks_exact_mut(width * 3) {
        let (mut i, mut j) = (0, width - 1);
        while i < j {
            for c in 0..3 {
                row.swap(i * 3 + c, j * 3 + c);
            }
            i += 1;
            j -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn center_box_matches_torchvision_sizes() {
        // 500x375 -> Resize(256) gives 341x256; CenterCrop(224): left round(58.5) = 58 (half
        // to even, as Python rounds), top 16.
        let b = center_crop_box(500, 375, 256, 224);
        let s = 375.0 / 256.0;
        assert!((b.height - 224.0 * s).abs() < 1e-9);
        assert!((b.top - 16.0 * s).abs() < 1e-9);
        assert!((b.width - 224.0 * 500.0 / 341.0).abs() < 1e-9);
        assert!((b.left - 58.0 * 500.0 / 341.0).abs() < 1e-9);
        // Square image, crop = resize: the whole image.
        let b = center_crop_box(300, 300, 224, 224);
        assert_eq!((b.left, b.top, b.width, b.height), (0.0, 0.0, 300.0, 300.0));
    }

    #[test]
    fn rng_is_a_pure_function_of_the_key() {
        let k = SampleKey {
            seed: 7,
            epoch: 3,
            sample_id: 11,
        };
        let a: Vec<u64> = (0..4)
            .scan(SampleRng::new(k), |r, _| Some(r.next_u64()))
            .collect();
        let b: Vec<u64> = (0..4)
            .scan(SampleRng::new(k), |r, _| Some(r.next_u64()))
            .collect();
        assert_eq!(a, b);
        for other in [
            SampleKey { epoch: 4, ..k },
            SampleKey { sample_id: 12, ..k },
            SampleKey { seed: 8, ..k },
        ] {
            assert_ne!(SampleRng::new(other).next_u64(), a[0]);
        }
    }

    #[test]
    fn random_box_reproducible_and_differs_across_epochs() {
        let k = SampleKey {
            seed: 1,
            epoch: 0,
            sample_id: 5,
        };
        let draw = |k| {
            random_resized_crop_box(
                500,
                375,
                (0.08, 1.0),
                (0.75, 4.0 / 3.0),
                &mut SampleRng::new(k),
            )
        };
        assert_eq!(draw(k), draw(k));
        let differ = (1..10)
            .filter(|&e| draw(SampleKey { epoch: e, ..k }) != draw(k))
            .count();
        assert!(differ >= 8, "{differ}");
    }

    #[test]
    fn fallback_is_the_centre_crop() {
        // A 1000x10 image: no box with a ratio in [3/4, 4/3] and area >= 8% fits.
        let b = random_resized_crop_box(
            1000,
            10,
            (0.08, 1.0),
            (0.75, 4.0 / 3.0),
            &mut SampleRng::new(SampleKey::default()),
        );
        assert_eq!((b.width, b.height), (13.0, 10.0));
        assert_eq!((b.left, b.top), (493.0, 0.0));
    }

    #[test]
    fn flip_is_exact() {
        let mut img: Vec<u8> = (0..2 * 3 * 3).map(|v| v as u8).collect();
        flip_horizontal(&mut img, 3);
        assert_eq!(
            img,
            [6, 7, 8, 3, 4, 5, 0, 1, 2, 15, 16, 17, 12, 13, 14, 9, 10, 11]
        );
        flip_horizontal(&mut img, 3);
        assert_eq!(img, (0..18).collect::<Vec<u8>>());
    }

    proptest! {
        #[test]
        fn random_box_inside_and_in_range(w in 1u32..2000, h in 1u32..2000, seed: u64, epoch in 0u64..100, id: u64) {
            let mut rng = SampleRng::new(SampleKey { seed, epoch, sample_id: id });
            let b = random_resized_crop_box(w, h, (0.08, 1.0), (0.75, 4.0 / 3.0), &mut rng);
            prop_assert!(b.left >= 0.0 && b.top >= 0.0 && b.width >= 1.0 && b.height >= 1.0);
            prop_assert!(b.left + b.width <= w as f64 && b.top + b.height <= h as f64);
            prop_assert_eq!(b.left.fract(), 0.0);
            prop_assert_eq!(b.width.fract(), 0.0);
            // A box from the attempts has its area and ratio in range up to the rounding of w
            // and h; the fallback is centred (or the whole image).
            let area = b.width * b.height / (w as f64 * h as f64);
            let r = b.width / b.height;
            let centred = b.left == ((w as f64 - b.width) / 2.0).floor() && b.top == ((h as f64 - b.height) / 2.0).floor();
            let tol_r = 1.0 / b.width.min(b.height);
            let in_range = area <= 1.0 + 1e-9
                && r >= 0.75 * (1.0 - tol_r) - 1e-9 && r <= 4.0 / 3.0 * (1.0 + tol_r) + 1e-9;
            prop_assert!(in_range || centred, "{b:?} in {w}x{h}");
        }
    }
}
