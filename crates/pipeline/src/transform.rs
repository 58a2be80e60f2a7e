//! Per-sample decode + augmentation into a caller-provided `size x size x 3` slot.
//!
//! Decoding is planned around the crop: libjpeg-turbo decodes only the rows/columns the crop
//! needs and, when the crop will be shrunk by 2x or more anyway, decodes at 1/2, 1/4 or 1/8 scale
//! in the DCT domain. The resize (bilinear with antialiasing, i.e. Pillow's filter, which is what
//! torchvision uses on PIL images) runs on that smaller region.
//!
//! Training transforms can add the recipe's augmentations ([`TrainAugment`]): an auto-augment
//! policy on the output image, and a random-erasing box drawn here and erased on the device.

use std::time::{Duration, Instant};

use fast_image_resize::images::{Image, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};
use rand::Rng;
use rn50_resize::resize_rgb8;

use crate::autoaugment::{AutoAugment, Policy};
use crate::crop::{center_offset, random_resized_crop, resize_shorter, CropBox};
use crate::decode::{DecodeError, Decoder, Plan};

/// RandomResizedCrop's default range of the crop's area, as fractions of the image's (torchvision's and timm's).
pub const DEFAULT_SCALE: [f64; 2] = [0.08, 1.0];
/// RandomResizedCrop's default range of the crop's aspect ratio (torchvision's and timm's).
pub const DEFAULT_RATIO: [f64; 2] = [3.0 / 4.0, 4.0 / 3.0];

/// The augmentation applied to every sample.
#[derive(Clone, Debug, PartialEq)]
pub enum Transform {
    /// torchvision `RandomResizedCrop(size, scale, ratio)` + `RandomHorizontalFlip()`.
    Train {
        size: usize,
        scale: [f64; 2],
        ratio: [f64; 2],
    },
    /// torchvision `Resize(resize)` (shorter side) + `CenterCrop(crop)`.
    Val { resize: usize, crop: usize },
    /// torchvision `RandomCrop(size, padding)` (zero padding) + `RandomHorizontalFlip()`: the
    /// CIFAR recipe, for images about `size` pixels on a side.
    PadCrop { size: usize, padding: usize },
}

impl Transform {
    /// The standard ImageNet training transform at `size` (224 normally; smaller for
    /// progressive resizing).
    pub fn train(size: usize) -> Transform {
        Transform::Train {
            size,
            scale: DEFAULT_SCALE,
            ratio: DEFAULT_RATIO,
        }
    }

    /// The standard evaluation transform (256 → 224 normally).
    pub fn val(resize: usize, crop: usize) -> Transform {
        Transform::Val { resize, crop }
    }

    /// The CIFAR training transform: 32 px crops of the image padded by 4, and flips.
    pub fn pad_crop(size: usize, padding: usize) -> Transform {
        Transform::PadCrop { size, padding }
    }

    /// Side length of the square output.
    pub fn output_size(&self) -> usize {
        match *self {
            Transform::Train { size, .. } | Transform::PadCrop { size, .. } => size,
            Transform::Val { crop, .. } => crop,
        }
    }

    /// Random (augmenting) rather than deterministic.
    pub fn is_train(&self) -> bool {
        !matches!(self, Transform::Val { .. })
    }

    /// Reject configurations that would make no sense (or divide by zero).
    pub fn validate(&self) -> anyhow::Result<()> {
        match *self {
            Transform::Train { size, scale, ratio } => {
                anyhow::ensure!(size > 0, "train size must be positive");
                anyhow::ensure!(
                    scale[0] > 0.0 && scale[0] <= scale[1],
                    "scale must satisfy 0 < min <= max, got {scale:?}"
                );
                anyhow::ensure!(
                    ratio[0] > 0.0 && ratio[0] <= ratio[1],
                    "ratio must satisfy 0 < min <= max, got {ratio:?}"
                );
            }
            Transform::Val { resize, crop } => {
                anyhow::ensure!(
                    crop > 0 && resize >= crop,
                    "val transform needs 0 < crop <= resize, got resize {resize}, crop {crop}"
                );
            }
            Transform::PadCrop { size, .. } => {
                anyhow::ensure!(size > 0, "crop size must be positive");
            }
        }
        Ok(())
    }
}

/// The augmentations torchvision's recipe (references/classification) adds to a training
/// transform, applied in its order: after RandomResizedCrop (or RandomCrop) and the flip,
/// `auto_augment` on the output image, then `RandomErasing(random_erase)`. Both draw from the
/// sample's own RNG, after the crop and flip, so a sample's result still depends on (seed, epoch,
/// key) only. Not for evaluation transforms.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TrainAugment {
    /// TrivialAugmentWide or RandAugment (`--auto-augment ta_wide|ra`); `None`: none.
    pub auto_augment: Option<Policy>,
    /// Probability of a random-erasing box (`--random-erase`), `RandomErasing(p,
    /// scale=(0.02, 0.33), ratio=(0.3, 3.3), value=0)`. The box is only drawn here
    /// ([`Applied::erase`]): torchvision erases after Normalize, to 0 in normalized space (the mean
    /// colour), which no uint8 value represents, so the consumer zeroes it after normalizing.
    pub random_erase: f64,
}

impl TrainAugment {
    /// Nothing added.
    pub fn is_none(&self) -> bool {
        self.auto_augment.is_none() && self.random_erase == 0.0
    }

    /// A valid policy and a probability in [0, 1].
    pub fn validate(&self) -> anyhow::Result<()> {
        if let Some(policy) = &self.auto_augment {
            policy.validate()?;
        }
        anyhow::ensure!(
            (0.0..=1.0).contains(&self.random_erase),
            "random erasing probability must be in [0, 1], got {}",
            self.random_erase
        );
        Ok(())
    }
}

/// `RandomErasing`'s scale range (of the image area) and aspect-ratio range (height / width).
pub const ERASE_SCALE: [f64; 2] = [0.02, 0.33];
pub const ERASE_RATIO: [f64; 2] = [0.3, 3.3];

/// A random-erasing box in output pixels (rows `top..top + height`, columns `left..left +
/// width`), to be set to 0 after normalization. It may be empty (a side rounded to 0 on images
/// of a few pixels), as torchvision's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Erase {
    pub top: usize,
    pub left: usize,
    pub height: usize,
    pub width: usize,
}

/// torchvision's `RandomErasing(p, scale=(0.02, 0.33), ratio=(0.3, 3.3)).forward` on a `height x
/// width` image, the box only: with probability `p`, up to 10 tries of an area `U(scale)` of the
/// image's and an aspect ratio `exp(U(log ratio))`, sides rounded half to even (Python's
/// `round`); the first box that fits strictly inside (`h < height`, `w < width`) is placed
/// uniformly (row, then column). `None` when `p` says no or all 10 tries failed. Draws nothing
/// when `p` is 0 (torchvision's recipe then leaves the transform out).
pub fn random_erase<R: Rng + ?Sized>(
    p: f64,
    height: usize,
    width: usize,
    rng: &mut R,
) -> Option<Erase> {
    if p <= 0.0 || rng.random::<f64>() >= p {
        return None;
    }
    let area = (height * width) as f64;
    let log_ratio = [ERASE_RATIO[0].ln(), ERASE_RATIO[1].ln()];
    for _ in 0..10 {
        let erase_area = area * rng.random_range(ERASE_SCALE[0]..ERASE_SCALE[1]);
        let aspect = rng.random_range(log_ratio[0]..log_ratio[1]).exp();
        let h = (erase_area * aspect).sqrt().round_ties_even() as usize;
        let w = (erase_area / aspect).sqrt().round_ties_even() as usize;
        if h < height && w < width {
            let top = rng.random_range(0..height - h + 1);
            let left = rng.random_range(0..width - w + 1);
            return Some(Erase {
                top,
                left,
                height: h,
                width: w,
            });
        }
    }
    None
}

/// What the augmenter did with one sample (for tests and statistics).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Applied {
    /// Crop box in original pixels (for `Val`, the center crop mapped back to the original).
    pub crop: [f64; 4],
    pub flipped: bool,
    /// The random-erasing box drawn (see [`TrainAugment::random_erase`]), if any.
    pub erase: Option<Erase>,
    /// DCT downscale used by the decoder (1 = full resolution).
    pub downscale: usize,
    pub decode_time: Duration,
    pub augment_time: Duration,
}

/// One worker's decode + augment state (reusable buffers, no per-sample allocation).
pub struct Augmenter {
    transform: Transform,
    random_erase: f64,
    auto_augment: Option<AutoAugment>,
    decoder: Decoder,
    resizer: Resizer,
    dct_scaling: bool,
}

impl Augmenter {
    /// `dct_scaling`: allow decoding at 1/2..1/8 scale when the crop is shrunk at least that much
    /// (faster; output differs slightly from a full-resolution resize).
    pub fn new(transform: Transform, dct_scaling: bool) -> Result<Augmenter, DecodeError> {
        Ok(Augmenter {
            transform,
            random_erase: 0.0,
            auto_augment: None,
            decoder: Decoder::new()?,
            resizer: Resizer::new(),
            dct_scaling,
        })
    }

    pub fn transform(&self) -> &Transform {
        &self.transform
    }

    /// Adds the recipe's augmentations to a training transform (none by default).
    pub fn set_augment(&mut self, augment: &TrainAugment) -> anyhow::Result<()> {
        augment.validate()?;
        anyhow::ensure!(
            self.transform.is_train() || augment.is_none(),
            "auto-augment and random erasing are for training transforms, not {:?}",
            self.transform
        );
        self.auto_augment = augment.auto_augment.map(AutoAugment::new);
        self.random_erase = augment.random_erase;
        Ok(())
    }

    /// Larger images are refused (see [`Decoder::set_max_image_pixels`]); the default is
    /// [`crate::decode::MAX_IMAGE_PIXELS`].
    pub fn set_max_image_pixels(&mut self, max_image_pixels: u64) {
        self.decoder.set_max_image_pixels(max_image_pixels);
    }

    /// Decode `bytes` and write the augmented `size x size` RGB8 image into `out`. The RNG is
    /// the sample's own (seeded from seed, epoch, index), so results don't depend on threads.
    pub fn apply<R: Rng>(
        &mut self,
        bytes: &[u8],
        rng: &mut R,
        out: &mut [u8],
    ) -> Result<Applied, DecodeError> {
        let t0 = Instant::now();
        let size = self.transform.output_size();
        assert_eq!(out.len(), size * size * 3, "output slot has the wrong size");
        if let Transform::PadCrop { padding, .. } = self.transform {
            let mut applied = self.pad_crop(bytes, size, padding, rng, out, t0)?;
            let t1 = Instant::now();
            applied.erase = self.train_augment(out, size, rng);
            applied.augment_time += t1.elapsed();
            return Ok(applied);
        }
        let dct = self.dct_scaling;
        // Source box in original pixels; `clip` = the resize may not look outside it (train:
        // torchvision crops, then resizes) vs. may (val: it resizes the whole image, then crops).
        let mut src = [0.0f64; 4];
        let transform = self.transform.clone();
        let decoded = self.decoder.decode(bytes, |w, h| match transform {
            Transform::Train { size, scale, ratio } => {
                let CropBox { x, y, w: cw, h: ch } = random_resized_crop(w, h, scale, ratio, rng);
                src = [x as f64, y as f64, cw as f64, ch as f64];
                Plan {
                    region: [x, y, cw, ch],
                    downscale: pick_downscale(dct, cw, ch, size, size),
                }
            }
            Transform::PadCrop { .. } => unreachable!("handled by pad_crop"),
            Transform::Val { resize, crop } => {
                let (nw, nh) = resize_shorter(w, h, resize);
                let (sx, sy) = (w as f64 / nw as f64, h as f64 / nh as f64);
                let (left, top) = (center_offset(nw, crop), center_offset(nh, crop));
                src = [
                    left as f64 * sx,
                    top as f64 * sy,
                    crop.min(nw) as f64 * sx,
                    crop.min(nh) as f64 * sy,
                ];
                // The bilinear filter reaches `scale` pixels beyond the box; keep them.
                let (mx, my) = (sx.max(1.0).ceil() + 1.0, sy.max(1.0).ceil() + 1.0);
                let x0 = (src[0] - mx).floor().max(0.0) as usize;
                let y0 = (src[1] - my).floor().max(0.0) as usize;
                let x1 = ((src[0] + src[2] + mx).ceil() as usize).min(w);
                let y1 = ((src[1] + src[3] + my).ceil() as usize).min(h);
                Plan {
                    region: [x0, y0, x1 - x0, y1 - y0],
                    downscale: pick_downscale(dct, w, h, nw, nh),
                }
            }
        })?;
        let t1 = Instant::now();

        let downscale = decoded.downscale;
        let d = downscale as f64;
        let (bw, bh) = (decoded.width, decoded.height);
        // The box in decoded-buffer pixels.
        let mut b = [
            (src[0] - decoded.origin[0] as f64) / d,
            (src[1] - decoded.origin[1] as f64) / d,
            src[2] / d,
            src[3] / d,
        ];
        b[0] = b[0].clamp(0.0, bw as f64 - 1.0);
        b[1] = b[1].clamp(0.0, bh as f64 - 1.0);
        b[2] = b[2].min(bw as f64 - b[0]).max(f64::MIN_POSITIVE);
        b[3] = b[3].min(bh as f64 - b[1]).max(f64::MIN_POSITIVE);

        let train = self.transform.is_train();
        resize_box(
            &mut self.resizer,
            decoded.pixels,
            [bw, bh],
            b,
            train,
            size,
            out,
        )?;
        let flipped = train && rng.random::<f64>() < 0.5;
        if flipped {
            for row in out.chunks_exact_mut(size * 3) {
                flip_row(row);
            }
        }
        let erase = if train {
            self.train_augment(out, size, rng)
        } else {
            None
        };
        let t2 = Instant::now();
        Ok(Applied {
            crop: src,
            flipped,
            erase,
            downscale,
            decode_time: t1 - t0,
            augment_time: t2 - t1,
        })
    }
}

/// The bilinear resize of [`Augmenter::apply`]: the box `b` (decoded-buffer pixels) of the `bw x bh` RGB8 `pixels`
/// into the `size x size` `out`, by [`resize_rgb8`] (its crate holds fast_image_resize's convolutions, compiled
/// once).
fn resize_box(
    resizer: &mut Resizer,
    pixels: &[u8],
    [bw, bh]: [usize; 2],
    b: [f64; 4],
    train: bool,
    size: usize,
    out: &mut [u8],
) -> Result<(), DecodeError> {
    let resize_err = |e: &dyn std::fmt::Display| DecodeError::Jpeg(format!("resize: {e}"));
    let src_img =
        ImageRef::new(bw as u32, bh as u32, pixels, PixelType::U8x3).map_err(|e| resize_err(&e))?;
    let mut dst = Image::from_slice_u8(size as u32, size as u32, out, PixelType::U8x3)
        .map_err(|e| resize_err(&e))?;
    let alg = ResizeAlg::Convolution(FilterType::Bilinear);
    if train {
        // Restrict the filter to the crop (torchvision crops first): view the integer window
        // containing the box, and crop the fractional rest inside it.
        let ix0 = b[0].floor() as u32;
        let iy0 = b[1].floor() as u32;
        let ix1 = ((b[0] + b[2]).ceil() as u32).clamp(ix0 + 1, bw as u32);
        let iy1 = ((b[1] + b[3]).ceil() as u32).clamp(iy0 + 1, bh as u32);
        let window = [ix0, iy0, ix1 - ix0, iy1 - iy0];
        let opts = ResizeOptions::new().resize_alg(alg).crop(
            b[0] - ix0 as f64,
            b[1] - iy0 as f64,
            b[2],
            b[3],
        );
        resize_rgb8(resizer, &src_img, Some(window), &mut dst, &opts)
            .map_err(|e| resize_err(&e))?;
    } else {
        let opts = ResizeOptions::new()
            .resize_alg(alg)
            .crop(b[0], b[1], b[2], b[3]);
        resize_rgb8(resizer, &src_img, None, &mut dst, &opts).map_err(|e| resize_err(&e))?;
    }
    Ok(())
}

impl Augmenter {
    /// The [`TrainAugment`] steps on the cropped and flipped `size x size` output, in
    /// torchvision's order, drawing on from the sample's RNG: the policy's ops, then the erase box.
    fn train_augment<R: Rng>(&mut self, out: &mut [u8], size: usize, rng: &mut R) -> Option<Erase> {
        if let Some(auto) = &mut self.auto_augment {
            auto.apply(out, size, size, rng);
        }
        random_erase(self.random_erase, size, size, rng)
    }

    /// `RandomCrop(size, padding)` then a flip: no resampling, so the pixels are the decoded ones.
    fn pad_crop<R: Rng>(
        &mut self,
        bytes: &[u8],
        size: usize,
        pad: usize,
        rng: &mut R,
        out: &mut [u8],
        t0: Instant,
    ) -> Result<Applied, DecodeError> {
        let decoded = self.decoder.decode(bytes, |w, h| Plan {
            region: [0, 0, w, h],
            downscale: 1,
        })?;
        let t1 = Instant::now();
        let (w, h) = (decoded.width, decoded.height);
        let (pw, ph) = (w + 2 * pad, h + 2 * pad);
        if pw < size || ph < size {
            return Err(DecodeError::Jpeg(format!(
                "{w}x{h} image is smaller than a {size} px crop with padding {pad}"
            )));
        }
        // torchvision draws the row offset first, then the column.
        let top = rng.random_range(0..=ph - size);
        let left = rng.random_range(0..=pw - size);
        let flipped = rng.random::<f64>() < 0.5;
        for (y, row) in out.chunks_exact_mut(size * 3).enumerate() {
            row.fill(0);
            let sy = (top + y) as isize - pad as isize;
            if sy < 0 || sy >= h as isize {
                continue;
            }
            // Columns of the output that land inside the image.
            let x0 = pad.saturating_sub(left);
            let x1 = (pad + w).saturating_sub(left).min(size);
            if x0 < x1 {
                let sx0 = left + x0 - pad;
                let src = &decoded.pixels[(sy as usize * w + sx0) * 3..][..(x1 - x0) * 3];
                row[x0 * 3..x1 * 3].copy_from_slice(src);
            }
            if flipped {
                flip_row(row);
            }
        }
        Ok(Applied {
            crop: [
                left as f64 - pad as f64,
                top as f64 - pad as f64,
                size as f64,
                size as f64,
            ],
            flipped,
            erase: None,
            downscale: 1,
            decode_time: t1 - t0,
            augment_time: t1.elapsed(),
        })
    }
}

/// Largest DCT downscale (8, 4, 2) that still leaves at least `tw x th` pixels for the box.
fn pick_downscale(enabled: bool, w: usize, h: usize, tw: usize, th: usize) -> usize {
    if !enabled {
        return 1;
    }
    [8, 4, 2]
        .into_iter()
        .find(|&d| w >= tw * d && h >= th * d)
        .unwrap_or(1)
}

fn flip_row(row: &mut [u8]) {
    let n = row.len() / 3;
    for i in 0..n / 2 {
        let j = n - 1 - i;
        for c in 0..3 {
            row.swap(i * 3 + c, j * 3 + c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn downscale_keeps_enough_pixels() {
        assert_eq!(pick_downscale(true, 2000, 1800, 224, 224), 8);
        assert_eq!(pick_downscale(true, 1000, 900, 224, 224), 4);
        assert_eq!(pick_downscale(true, 500, 375, 224, 224), 1);
        assert_eq!(pick_downscale(true, 500, 460, 224, 224), 2);
        assert_eq!(pick_downscale(false, 2000, 1800, 224, 224), 1);
    }

    #[test]
    fn flip_reverses_pixels() {
        let mut row = vec![1, 2, 3, 4, 5, 6, 7, 8, 9];
        flip_row(&mut row);
        assert_eq!(row, vec![7, 8, 9, 4, 5, 6, 1, 2, 3]);
    }
}
