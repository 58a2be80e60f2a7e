//! Crop geometry, following torchvision exactly (so augmentation statistics match the recipes the
//! reference accuracies were trained with).

use rand::Rng;

/// A crop box in original-image pixels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CropBox {
    pub x: usize,
    pub y: usize,
    pub w: usize,
    pub h: usize,
}

/// Python's `int(round(v))` (round half to even) for the non-negative values used here.
fn py_round(v: f64) -> i64 {
    v.round_ties_even() as i64
}

/// `torchvision.transforms.RandomResizedCrop.get_params`: up to 10 tries of an area fraction
/// uniform in `scale` and an aspect ratio log-uniform in `ratio`; the first box that fits is
/// placed uniformly at random; otherwise a center crop with the aspect ratio clamped to `ratio`.
pub fn random_resized_crop<R: Rng>(
    width: usize,
    height: usize,
    scale: [f64; 2],
    ratio: [f64; 2],
    rng: &mut R,
) -> CropBox {
    let area = (width * height) as f64;
    let (log_lo, log_hi) = (ratio[0].ln(), ratio[1].ln());
    for _ in 0..10 {
        let target_area = area * uniform(rng, scale[0], scale[1]);
        let aspect = uniform(rng, log_lo, log_hi).exp();
        let w = py_round((target_area * aspect).sqrt());
        let h = py_round((target_area / aspect).sqrt());
        if 0 < w && w as usize <= width && 0 < h && h as usize <= height {
            let (w, h) = (w as usize, h as usize);
            // torch.randint(0, height - h + 1), then the same for width.
            let y = rng.random_range(0..=height - h);
            let x = rng.random_range(0..=width - w);
            return CropBox { x, y, w, h };
        }
    }
    let in_ratio = width as f64 / height as f64;
    let (min_r, max_r) = (ratio[0].min(ratio[1]), ratio[0].max(ratio[1]));
    let (w, h) = if in_ratio < min_r {
        (
            width,
            (py_round(width as f64 / min_r) as usize).clamp(1, height),
        )
    } else if in_ratio > max_r {
        (
            (py_round(height as f64 * max_r) as usize).clamp(1, width),
            height,
        )
    } else {
        (width, height)
    };
    CropBox {
        x: (width - w) / 2,
        y: (height - h) / 2,
        w,
        h,
    }
}

/// `torch.empty(1).uniform_(lo, hi)`; `lo == hi` is allowed (a fixed value).
fn uniform<R: Rng>(rng: &mut R, lo: f64, hi: f64) -> f64 {
    lo + (hi - lo) * rng.random::<f64>()
}

/// Output size of torchvision's `Resize(size)` with an int size: the shorter side becomes
/// `size`, the longer one `int(size * long / short)`.
pub fn resize_shorter(width: usize, height: usize, size: usize) -> (usize, usize) {
    if width <= height {
        (size, ((size * height) as f64 / width as f64) as usize)
    } else {
        (((size * width) as f64 / height as f64) as usize, size)
    }
}

/// `torchvision.transforms.functional.center_crop` offsets: `int(round((dim - crop) / 2))`.
pub fn center_offset(dim: usize, crop: usize) -> usize {
    py_round(dim.saturating_sub(crop) as f64 / 2.0) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn boxes_always_fit() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        for &(w, h) in &[(1, 1), (1, 1000), (1000, 1), (500, 375), (7, 3), (224, 224)] {
            for _ in 0..2000 {
                let c = random_resized_crop(w, h, [0.08, 1.0], [0.75, 4.0 / 3.0], &mut rng);
                assert!(
                    c.w >= 1 && c.h >= 1 && c.x + c.w <= w && c.y + c.h <= h,
                    "{c:?}"
                );
            }
        }
    }

    #[test]
    fn fallback_is_clamped_center_crop() {
        // scale > 1 can never fit: always the fallback.
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(2);
        let c = random_resized_crop(1000, 100, [2.0, 2.0], [0.75, 4.0 / 3.0], &mut rng);
        assert_eq!(
            c,
            CropBox {
                x: 433,
                y: 0,
                w: 133,
                h: 100
            }
        );
        // 300x200 is wider than 4:3: w = round(200 * 4/3) = 267.
        let c = random_resized_crop(300, 200, [2.0, 2.0], [0.75, 4.0 / 3.0], &mut rng);
        assert_eq!(
            c,
            CropBox {
                x: 16,
                y: 0,
                w: 267,
                h: 200
            }
        );
        // Within the ratio range: the whole image.
        let c = random_resized_crop(280, 240, [2.0, 2.0], [0.75, 4.0 / 3.0], &mut rng);
        assert_eq!(
            c,
            CropBox {
                x: 0,
                y: 0,
                w: 280,
                h: 240
            }
        );
    }

    #[test]
    fn resize_and_center_match_torchvision_arithmetic() {
        assert_eq!(resize_shorter(500, 375, 256), (341, 256));
        assert_eq!(resize_shorter(375, 500, 256), (256, 341));
        assert_eq!(center_offset(341, 224), 58); // round(58.5) = 58 (half to even)
        assert_eq!(center_offset(256, 224), 16);
    }
}
