//! Seeded synthetic JPEGs with ImageNet-like sizes and file sizes, for benchmarks only (tests use
//! the real files under shared/data).
//!
//! Size distribution (approximating ILSVRC2012 train, mean about 470x390): most photos are
//! 500 px on the long side at 4:3 or 3:2, about a fifth are portrait, a tenth are square-ish,
//! and a tail of large (up to 2000 px) and small images. Content is smooth colour fields plus
//! texture and sensor-like noise, encoded at quality 90, which lands near ImageNet's ~110 KB per
//! file and, more importantly, costs a decoder about what a real photo does.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

use crate::decode::encode_jpeg;
use crate::source::{Dataset, Source};

#[derive(Clone, Debug)]
pub struct SyntheticConfig {
    pub count: usize,
    pub classes: usize,
    pub seed: u64,
    pub quality: u8,
}

impl SyntheticConfig {
    pub fn new(count: usize) -> SyntheticConfig {
        SyntheticConfig {
            count,
            classes: 1000.min(count.max(1)),
            seed: 0,
            quality: 90,
        }
    }

    fn rng(&self, i: usize) -> ChaCha8Rng {
        let mut key = [0u8; 32];
        key[..8].copy_from_slice(&self.seed.to_le_bytes());
        key[8..16].copy_from_slice(&(i as u64).to_le_bytes());
        key[16..24].copy_from_slice(b"synthjpg");
        ChaCha8Rng::from_seed(key)
    }

    pub fn label(&self, i: usize) -> usize {
        i % self.classes.max(1)
    }

    pub fn class_names(&self) -> Vec<String> {
        (0..self.classes.max(1))
            .map(|c| format!("c{c:04}"))
            .collect()
    }

    /// JPEG bytes of sample `i` (deterministic in seed and i).
    pub fn jpeg(&self, i: usize) -> Result<Vec<u8>> {
        let mut rng = self.rng(i);
        let (w, h) = image_size(&mut rng);
        let rgb = render(w, h, &mut rng);
        Ok(encode_jpeg(w, h, &rgb, self.quality)?)
    }
}

/// Draw (width, height) from the ImageNet-like distribution.
pub fn image_size<R: Rng>(rng: &mut R) -> (usize, usize) {
    let u: f64 = rng.random();
    let (long, short) = if u < 0.74 {
        let short = match rng.random_range(0..10) {
            0..=5 => 375,
            6..=8 => 333,
            _ => rng.random_range(280..=500),
        };
        (500, short)
    } else if u < 0.84 {
        let s = rng.random_range(300..=500);
        (s, rng.random_range(s * 9 / 10..=s))
    } else if u < 0.90 {
        // Large tail, log-uniform long side.
        let long = (rng.random_range(600f64.ln()..2000f64.ln())).exp() as usize;
        (long, long * rng.random_range(60..=80) / 100)
    } else {
        let long = rng.random_range(100..500);
        (long, long * rng.random_range(55..=100) / 100)
    };
    if rng.random_bool(0.2) {
        (short.max(1), long)
    } else {
        (long, short.max(1))
    }
}

/// Smooth colour field (bilinear random grid) + mid-frequency texture + per-pixel noise.
pub fn render<R: Rng>(w: usize, h: usize, rng: &mut R) -> Vec<u8> {
    const G: usize = 6;
    let coarse: Vec<[f32; 3]> = (0..G * G)
        .map(|_| [0; 3].map(|_: i32| rng.random_range(20.0..235.0)))
        .collect();
    let freq: [f32; 4] = [0; 4].map(|_: i32| rng.random_range(0.02..0.25));
    let amp: f32 = rng.random_range(10.0..30.0);
    let mut state: u64 = rng.random::<u64>() | 1;
    let mut out = vec![0u8; w * h * 3];
    for y in 0..h {
        let gy = y as f32 / h as f32 * (G - 1) as f32;
        let (y0, fy) = (gy as usize, gy.fract());
        let y1 = (y0 + 1).min(G - 1);
        for x in 0..w {
            let gx = x as f32 / w as f32 * (G - 1) as f32;
            let (x0, fx) = (gx as usize, gx.fract());
            let x1 = (x0 + 1).min(G - 1);
            let tex = amp
                * ((x as f32 * freq[0] + y as f32 * freq[1]).sin()
                    * (x as f32 * freq[2] - y as f32 * freq[3]).cos());
            for c in 0..3 {
                let top = coarse[y0 * G + x0][c] * (1.0 - fx) + coarse[y0 * G + x1][c] * fx;
                let bot = coarse[y1 * G + x0][c] * (1.0 - fx) + coarse[y1 * G + x1][c] * fx;
                // xorshift64: cheap noise; quality does not matter, only entropy.
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let noise = (state >> 56) as f32 / 255.0 * 24.0 - 12.0;
                let v = top * (1.0 - fy) + bot * fy + tex + noise;
                out[(y * w + x) * 3 + c] = v.clamp(0.0, 255.0) as u8;
            }
        }
    }
    out
}

/// All samples encoded up front and kept in memory, so a benchmark measures the loader only.
pub struct SyntheticSource {
    images: Vec<Vec<u8>>,
    labels: Vec<u32>,
}

impl SyntheticSource {
    pub fn generate(cfg: &SyntheticConfig) -> Result<SyntheticSource> {
        let images = (0..cfg.count)
            .into_par_iter()
            .map(|i| cfg.jpeg(i))
            .collect::<Result<Vec<_>>>()?;
        let labels = (0..cfg.count).map(|i| cfg.label(i) as u32).collect();
        Ok(SyntheticSource { images, labels })
    }

    /// Total encoded bytes.
    pub fn bytes(&self) -> usize {
        self.images.iter().map(Vec::len).sum()
    }
}

impl Source for SyntheticSource {
    fn len(&self) -> usize {
        self.images.len()
    }

    fn label(&self, i: usize) -> i64 {
        self.labels[i] as i64
    }

    fn read<'a>(&'a self, i: usize, _buf: &'a mut Vec<u8>) -> Result<&'a [u8]> {
        Ok(&self.images[i])
    }

    fn name(&self, i: usize) -> String {
        format!("synthetic #{i}")
    }
}

/// A synthetic in-memory [`Dataset`].
pub fn dataset(cfg: &SyntheticConfig) -> Result<Dataset> {
    let src = SyntheticSource::generate(cfg)?;
    let desc = format!(
        "synthetic ({} JPEGs, {:.1} MB, seed {})",
        cfg.count,
        src.bytes() as f64 / 1e6,
        cfg.seed
    );
    Ok(Dataset::from_source(Arc::new(src), cfg.class_names(), desc))
}

/// Write the synthetic set as an ImageFolder (`dir/<class>/<index>.JPEG`) so other loaders
/// (torchvision) can read the very same files.
pub fn write_image_folder(dir: &Path, cfg: &SyntheticConfig) -> Result<()> {
    let names = cfg.class_names();
    for c in &names {
        std::fs::create_dir_all(dir.join(c))
            .with_context(|| format!("cannot create {}", dir.join(c).display()))?;
    }
    (0..cfg.count).into_par_iter().try_for_each(|i| {
        let path = dir.join(&names[cfg.label(i)]).join(format!("{i:08}.JPEG"));
        std::fs::write(&path, cfg.jpeg(i)?)
            .with_context(|| format!("cannot write {}", path.display()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_decodable() {
        let cfg = SyntheticConfig::new(4);
        let a = cfg.jpeg(3).unwrap();
        assert_eq!(a, cfg.jpeg(3).unwrap());
        assert_ne!(a, cfg.jpeg(2).unwrap());
        let img = crate::decode::decode_rgb(&a).unwrap();
        assert!(img.width >= 50 && img.height >= 50);
    }

    #[test]
    fn sizes_look_like_imagenet() {
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let n = 20_000;
        let sizes: Vec<_> = (0..n).map(|_| image_size(&mut rng)).collect();
        let mean_w = sizes.iter().map(|s| s.0).sum::<usize>() as f64 / n as f64;
        let mean_h = sizes.iter().map(|s| s.1).sum::<usize>() as f64 / n as f64;
        // ILSVRC2012 train averages roughly 470 x 390.
        assert!((430.0..530.0).contains(&mean_w), "mean width {mean_w}");
        assert!((350.0..450.0).contains(&mean_h), "mean height {mean_h}");
        assert!(sizes
            .iter()
            .all(|&(w, h)| w >= 1 && h >= 1 && w <= 2000 && h <= 2000));
    }
}
