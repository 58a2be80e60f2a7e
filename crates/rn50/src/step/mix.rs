//! The batch-level mixing of torchvision's reference recipe (references/classification), on the device after
//! normalisation and random erasing ([`super::erase`]): Mixup or CutMix, which turn the labels into soft targets
//! for the cross-entropy.
//!
//! As torchvision's reference: `RandomChoice([MixUp(alpha=--mixup-alpha), CutMix(alpha=--cutmix-alpha)])` on every
//! batch (the one of the two that has an alpha above 0 when only one has; each chosen with probability ½ when both
//! have), each mixing image `i` with image `i - 1` (`batch.roll(1, 0)`), λ drawn from Beta(α, α). The loss is
//! PyTorch's cross-entropy with probability targets, so label smoothing composes as in torchvision's reference
//! (`CrossEntropyLoss(label_smoothing)` on the mixed one-hot targets). `tests/mix.rs` compares both ops with
//! `torchvision.transforms.v2.MixUp` and `CutMix` given the same λ and box, and the draws with theirs.
use rand::Rng;
use rand_distr::{Beta, Distribution};
use tch::{Kind, Tensor};

/// The largest `--mixup-alpha` and `--cutmix-alpha`. rand_distr's Beta(α, α) draws within [0, 1] for every α from
/// the smallest positive f64 up to where α + α overflows (about 9e307), where every draw is NaN (the run stopped
/// with "the loss became NaN" after its files were written); from 1e6 on, λ is ½ within 0.2%: more says nothing.
pub const MAX_MIX_ALPHA: f64 = 1e6;

/// `--mixup-alpha` and `--cutmix-alpha`: which of the two a batch may get, and their Beta parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BatchMix {
    mixup: Option<Beta<f64>>,
    cutmix: Option<Beta<f64>>,
}

/// What one batch got.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mix {
    /// `lam · x + (1 - lam) · x.roll(1, 0)`, targets alike.
    Mixup { lam: f64 },
    /// Rows `y1..y2` and columns `x1..x2` of every image replaced by the previous image's; the targets weighted by
    /// the area kept, `lam` (torchvision's `lam_adjusted`).
    Cutmix {
        x1: usize,
        y1: usize,
        x2: usize,
        y2: usize,
        lam: f64,
    },
}

impl BatchMix {
    /// `None` when both alphas are 0 (no mixing). Alphas must be finite and at least 0 (the flags' range).
    pub fn new(mixup_alpha: f64, cutmix_alpha: f64) -> Option<BatchMix> {
        let beta =
            |a: f64| (a > 0.0).then(|| Beta::new(a, a).expect("alpha is finite and above 0"));
        let mix = BatchMix {
            mixup: beta(mixup_alpha),
            cutmix: beta(cutmix_alpha),
        };
        (mix.mixup.is_some() || mix.cutmix.is_some()).then_some(mix)
    }

    /// Draws the mix of one batch of `height x width` images: the choice between the two (torchvision's
    /// `RandomChoice`, uniform), then λ ~ Beta(α, α), then for CutMix the box's center, uniform over the pixels,
    /// with half-sides `int(½·sqrt(1 - λ)·W)` and `int(½·sqrt(1 - λ)·H)`, clipped to the image (`CutMix.make_params`).
    pub fn draw<R: Rng + ?Sized>(&self, rng: &mut R, height: usize, width: usize) -> Mix {
        let use_mixup = match (self.mixup, self.cutmix) {
            (Some(_), Some(_)) => rng.random::<f64>() < 0.5,
            (m, _) => m.is_some(),
        };
        if use_mixup {
            let lam = self.mixup.expect("chosen").sample(rng);
            return Mix::Mixup { lam };
        }
        let lam = self.cutmix.expect("chosen").sample(rng);
        let (cx, cy) = (rng.random_range(0..width), rng.random_range(0..height));
        let r = 0.5 * (1.0 - lam).sqrt();
        let (half_w, half_h) = ((r * width as f64) as usize, (r * height as f64) as usize);
        let (x1, y1) = (cx.saturating_sub(half_w), cy.saturating_sub(half_h));
        let (x2, y2) = ((cx + half_w).min(width), (cy + half_h).min(height));
        let lam = 1.0 - ((x2 - x1) * (y2 - y1)) as f64 / (width * height) as f64;
        Mix::Cutmix {
            x1,
            y1,
            x2,
            y2,
            lam,
        }
    }
}

impl Mix {
    /// Mixes `x` (a normalised `[N, 3, H, W]` float batch, changed in place) and returns the soft targets,
    /// `[N, classes]` float32, from the class indices `labels`. The same float operations as torchvision's
    /// `MixUp._transform` / `CutMix._transform`, so the same values bit for bit.
    pub fn apply(&self, x: &mut Tensor, labels: &Tensor, classes: i64) -> Tensor {
        let one_hot = labels.one_hot(classes).to_kind(Kind::Float);
        let mixed = |t: &Tensor, lam: f64| -> Tensor {
            // `t.roll(1, 0).mul_(1 - lam).add_(t.mul(lam))`
            let mut rolled = t.roll([1], [0]);
            let _ = rolled.g_mul_scalar_(1.0 - lam).g_add_(&(t * lam));
            rolled
        };
        tch::no_grad(|| match *self {
            Mix::Mixup { lam } => {
                // In place, the same products and (commutative) sum as `mixed`.
                let mut rolled = x.roll([1], [0]);
                let _ = rolled.g_mul_scalar_(1.0 - lam);
                let _ = x.g_mul_scalar_(lam).g_add_(&rolled);
                mixed(&one_hot, lam)
            }
            Mix::Cutmix {
                x1,
                y1,
                x2,
                y2,
                lam,
            } => {
                let window = |t: &Tensor| {
                    t.narrow(2, y1 as i64, (y2 - y1) as i64)
                        .narrow(3, x1 as i64, (x2 - x1) as i64)
                };
                let pasted = window(x).roll([1], [0]);
                window(x).copy_(&pasted);
                mixed(&one_hot, lam)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use tch::Device;

    /// Every α the flags take gives λ and CutMix boxes within range: the smallest positive, 1, and the largest
    /// ([`MAX_MIX_ALPHA`]); 1e308, which the flags took before, gave NaN.
    #[test]
    fn every_alpha_in_range_draws_within_0_and_1() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(0);
        for alpha in [f64::from_bits(1), 1e-300, 1.0, MAX_MIX_ALPHA] {
            let mix = BatchMix::new(alpha, alpha).unwrap();
            for _ in 0..10_000 {
                let lam = match mix.draw(&mut rng, 32, 32) {
                    Mix::Mixup { lam } | Mix::Cutmix { lam, .. } => lam,
                };
                assert!((0.0..=1.0).contains(&lam), "α {alpha:e}: λ {lam}");
            }
        }
        let lam: f64 = Beta::new(1e308, 1e308).unwrap().sample(&mut rng);
        assert!(
            lam.is_nan(),
            "1e308 is out of the flags' range because it gives {lam}"
        );
    }

    #[test]
    fn no_alpha_no_mix_and_one_alpha_always_that_one() {
        assert!(BatchMix::new(0.0, 0.0).is_none());
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        let only_cutmix = BatchMix::new(0.0, 1.0).unwrap();
        let only_mixup = BatchMix::new(0.2, 0.0).unwrap();
        for _ in 0..100 {
            assert!(matches!(
                only_cutmix.draw(&mut rng, 8, 8),
                Mix::Cutmix { .. }
            ));
            assert!(matches!(only_mixup.draw(&mut rng, 8, 8), Mix::Mixup { .. }));
        }
    }

    #[test]
    fn cutmix_pastes_the_previous_image_and_weighs_targets_by_area() {
        let mut x = Tensor::arange(2 * 3 * 4 * 4, (Kind::Float, Device::Cpu)).view([2, 3, 4, 4]);
        let before = x.copy();
        let labels = Tensor::from_slice(&[0i64, 2]);
        let mix = Mix::Cutmix {
            x1: 1,
            y1: 0,
            x2: 3,
            y2: 2,
            lam: 0.75,
        };
        let t = mix.apply(&mut x, &labels, 3);
        let at = |t: &Tensor, n, c, y, xx| t.double_value(&[n, c, y, xx]);
        // Image 0 gets image 1's window (roll by one: the last becomes the first), and the reverse.
        assert_eq!(at(&x, 0, 2, 1, 2), at(&before, 1, 2, 1, 2));
        assert_eq!(at(&x, 1, 0, 0, 1), at(&before, 0, 0, 0, 1));
        assert_eq!(
            at(&x, 0, 0, 3, 3),
            at(&before, 0, 0, 3, 3),
            "outside the box"
        );
        assert_eq!(
            Vec::<f32>::try_from(t.flatten(0, -1)).unwrap(),
            [0.75, 0.0, 0.25, 0.25, 0.0, 0.75]
        );
    }
}
