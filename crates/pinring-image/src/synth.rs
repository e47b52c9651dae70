//! Deterministic synthetic "photos" for tests and benchmarks: smooth colour gradients plus
//! noise, which JPEG compresses about as well as a natural photo at the same quality.

use crate::transform::{SampleKey, SampleRng};

/// A `width`×`height` RGB image (HWC, 3 bytes a pixel): diagonal gradients that differ per
/// channel and per `seed`, plus uniform noise of ±`noise` levels.
pub fn photo(width: u32, height: u32, seed: u64, noise: u8) -> Vec<u8> {
    let mut rng = SampleRng::new(SampleKey {
        seed,
        epoch: 0,
        sample_id: 0,
    });
    let phase = [rng.next_f64(), rng.next_f64(), rng.next_f64()];
    let (w, h) = (width.max(1) as f64, height.max(1) as f64);
    let mut out = Vec::with_capacity(width as usize * height as usize * 3);
    for y in 0..height {
        for x in 0..width {
            let (u, v) = (x as f64 / w, y as f64 / h);
            for (c, p) in phase.iter().enumerate() {
                let base = 128.0
                    + 90.0 * ((u * (2.0 + c as f64) + v * 3.0 + p * std::f64::consts::TAU).sin())
                    + 30.0 * ((u * 17.0 - v * (11.0 + c as f64)) + p).cos();
                let n = if noise == 0 {
                    0.0
                } else {
                    rng.below(2 * noise as u64 + 1) as f64 - noise as f64
                };
                out.push((base + n).clamp(0.0, 255.0) as u8);
            }
        }
    }
    out
}
