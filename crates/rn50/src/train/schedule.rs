//! Learning-rate recipes for ImageNet training: linear scaling with the global batch (Goyal et al. 2017),
//! gradual warmup, then a step, cosine, linear or polynomial decay, a flat peak then a cosine, or one cycle (the
//! rate up and down along cosines, momentum the other way). Time is measured in (fractional) epochs so the same
//! recipe holds for any batch size and world size.
use std::f64::consts::PI;
use std::fmt;

use anyhow::{bail, Result};
use rn50_report::table::{fmt_decimals, fmt_lr};

use crate::train::args::{ScheduleKind, TrainArgs};

/// `--lr-base` is per `base_size` images (`--lr-base-size`, 256 by default): the effective rate scales with the
/// global batch (Goyal et al.'s linear scaling rule).
pub fn scaled_lr(lr_base: f64, global_batch: usize, base_size: usize) -> f64 {
    lr_base * global_batch as f64 / base_size as f64
}

impl TrainArgs {
    /// The peak learning rate at `global_batch` images per step, and how it came about, for the start line:
    /// "lr 0.4 (--lr)" or "lr 0.1 x 1024/256 = 0.4 (--lr-base)".
    pub fn peak_lr(&self, global_batch: usize) -> (f64, String) {
        if let Some(lr) = self.lr {
            return (lr, format!("lr {lr} (--lr)"));
        }
        let (base, size) = (self.lr_base, self.lr_base_size);
        let lr = scaled_lr(base, global_batch, size);
        (
            lr,
            format!(
                "lr {base} x {global_batch}/{size} = {} (--lr-base)",
                fmt_lr(lr)
            ),
        )
    }
}

/// Where `--lr-schedule flat-cos` starts its cosine by default, as a fraction of the epochs: fast.ai's
/// `fit_flat_cos(pct_start=0.75)`.
pub const FLAT_FRACTION: f64 = 0.75;

/// `--lr-schedule one-cycle`'s defaults: PyTorch's `OneCycleLR(div_factor=25, base_momentum=0.85)` (fast.ai's
/// `fit_one_cycle(div=25, moms=(0.95, 0.85, 0.95))`).
pub const DIV_FACTOR: f64 = 25.0;
pub const BASE_MOMENTUM: f64 = 0.85;

/// The default step schedule's period in epochs: main.py's `StepLR(optimizer, step_size=30, gamma=0.1)`.
pub const STEP_EVERY: usize = 30;

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Decay {
    /// Multiply by `gamma` at each milestone epoch (÷10 at 30 and 60 for 90 epochs: [`Decay::step_for`]).
    Step { milestones: Vec<f64>, gamma: f64 },
    /// Half a cosine from the peak down to `final_lr` at the last epoch.
    Cosine { final_lr: f64 },
    /// A straight line from the peak down to zero at the last epoch.
    Linear,
    /// `final_lr + (peak - final_lr)·(1 - progress)^power`, progress going from 0 at the warmup's end to 1 at
    /// the last epoch: MLPerf's LARS schedule (power 2; mlcommons/training's image_classification lars_util.py).
    /// The reference counts in optimizer steps and divides by the decay steps + 1, so its rate stops one step
    /// short of `final_lr`; here the last step's rate is `final_lr`.
    Poly { power: f64, final_lr: f64 },
    /// The peak until epoch `start`, then half a cosine down to `final_lr` at the last epoch: fast.ai's
    /// `fit_flat_cos` (its `pct_start`, 0.75 by default, is `start / epochs`).
    FlatCosine { start: f64, final_lr: f64 },
    /// One cycle (Smith 2018; PyTorch's `OneCycleLR` with its cosine annealing, fast.ai's `fit_one_cycle`): over
    /// the warmup the rate rises along half a cosine from `initial_lr` to the peak, then falls along half a
    /// cosine to `final_lr` at the last epoch; momentum moves the other way, from `max_momentum` down to
    /// `base_momentum` at the peak rate and back up to `max_momentum` at the end.
    OneCycle {
        initial_lr: f64,
        final_lr: f64,
        max_momentum: f64,
        base_momentum: f64,
    },
}

impl Decay {
    /// `--lr-schedule step` over `epochs`: ÷10 at `milestones` (`--lr-milestones`), by default every
    /// [`STEP_EVERY`] epochs before the last, as pytorch/examples' main.py (`StepLR(step_size=30)`): 30 and 60 of
    /// 90, none (a constant rate) in a run of 30 epochs or fewer.
    pub fn step_for(epochs: f64, milestones: Option<&[f64]>) -> Self {
        Decay::Step {
            milestones: match milestones {
                Some(m) => m.to_vec(),
                None => (1..)
                    .map(|k| (k * STEP_EVERY) as f64)
                    .take_while(|&m| m < epochs)
                    .collect(),
            },
            gamma: 0.1,
        }
    }
}

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LrSchedule {
    /// The peak rate (already scaled for the global batch).
    pub peak_lr: f64,
    pub warmup_epochs: f64,
    pub epochs: f64,
    pub decay: Decay,
}

impl LrSchedule {
    /// The schedule of `train`'s flags (--lr-schedule, --warmup-epochs, --epochs...), `peak` after the warmup.
    pub fn of_args(args: &TrainArgs, peak: f64) -> Result<Self> {
        let decay = match args.lr_schedule {
            ScheduleKind::Step => {
                Decay::step_for(args.epochs as f64, args.lr_milestones.as_deref())
            }
            ScheduleKind::Cosine => Decay::Cosine {
                final_lr: args.lr_end,
            },
            ScheduleKind::Linear => Decay::Linear,
            ScheduleKind::Poly => Decay::Poly {
                power: args.lr_poly_power,
                final_lr: args.lr_end,
            },
            ScheduleKind::FlatCos => Decay::FlatCosine {
                start: args
                    .lr_decay_start
                    .unwrap_or(FLAT_FRACTION * args.epochs as f64),
                final_lr: args.lr_end,
            },
            ScheduleKind::OneCycle => Decay::OneCycle {
                initial_lr: peak / args.div_factor.unwrap_or(DIV_FACTOR),
                final_lr: args.lr_end,
                max_momentum: args.momentum,
                base_momentum: args.base_momentum.unwrap_or(BASE_MOMENTUM),
            },
        };
        Self::new(peak, args.warmup_epochs, args.epochs as f64, decay)
    }

    pub fn new(peak_lr: f64, warmup_epochs: f64, epochs: f64, decay: Decay) -> Result<Self> {
        if !peak_lr.is_finite() || peak_lr <= 0.0 {
            bail!("the learning rate must be positive (got {peak_lr})");
        }
        if epochs <= 0.0 || warmup_epochs < 0.0 || warmup_epochs >= epochs {
            bail!("need 0 <= --warmup-epochs < --epochs (got {warmup_epochs} and {epochs})");
        }
        if let Decay::Step { milestones, gamma } = &decay {
            if gamma.is_nan() || *gamma <= 0.0 || milestones.windows(2).any(|w| w[0] >= w[1]) {
                bail!(
                    "step decay needs increasing milestones and gamma > 0 (got {}; {gamma})",
                    fmt_epochs(milestones)
                );
            }
        }
        if let Decay::FlatCosine { start, .. } = &decay {
            if !(warmup_epochs..epochs).contains(start) {
                bail!("the cosine must start from --warmup-epochs {warmup_epochs} to below --epochs {epochs} (got {start})");
            }
        }
        if let Decay::OneCycle {
            initial_lr,
            max_momentum,
            base_momentum,
            ..
        } = &decay
        {
            if warmup_epochs == 0.0 {
                bail!("one cycle rises over --warmup-epochs: give it above 0 (fast.ai's and PyTorch's pct_start, 0.25 and 0.3, are 0.25 x --epochs and 0.3 x --epochs)");
            }
            if !(*initial_lr > 0.0 && *initial_lr <= peak_lr) {
                bail!("one cycle starts at the peak rate / --div-factor: it must be above 0 and at most the peak {peak_lr} (got {initial_lr})");
            }
            if !(0.0..=*max_momentum).contains(base_momentum) {
                bail!("--base-momentum {base_momentum} must be from 0 to --momentum {max_momentum}, where one cycle's momentum starts and ends");
            }
        }
        if let Decay::Cosine { final_lr }
        | Decay::Poly { final_lr, .. }
        | Decay::FlatCosine { final_lr, .. }
        | Decay::OneCycle { final_lr, .. } = &decay
        {
            if !(0.0..peak_lr).contains(final_lr) {
                bail!("--lr-end {final_lr} must be 0 or more and below the peak rate {peak_lr}");
            }
        }
        if let Decay::Poly { power, .. } = &decay {
            if !power.is_finite() || *power <= 0.0 {
                bail!("--lr-poly-power must be above 0 (got {power})");
            }
        }
        Ok(Self {
            peak_lr,
            warmup_epochs,
            epochs,
            decay,
        })
    }

    /// The rate for the step that ends at fractional epoch `t` (epoch + (batch + 1) / batches_per_epoch):
    /// during warmup it rises linearly from ~0 to the peak, reaching it at `warmup_epochs`.
    /// One cycle's warmup instead follows half a cosine up from its initial rate.
    pub fn at(&self, t: f64) -> f64 {
        let w = self.warmup_epochs;
        if t < w {
            let rise = (t / w).max(0.0);
            return match &self.decay {
                Decay::OneCycle { initial_lr, .. } => cosine(*initial_lr, self.peak_lr, rise),
                _ => self.peak_lr * rise,
            };
        }
        let progress = ((t - w) / (self.epochs - w)).clamp(0.0, 1.0);
        match &self.decay {
            Decay::Step { milestones, gamma } => {
                let passed = milestones.iter().filter(|&&m| t >= m).count();
                self.peak_lr * gamma.powi(passed as i32)
            }
            Decay::Cosine { final_lr } | Decay::OneCycle { final_lr, .. } => {
                cosine(self.peak_lr, *final_lr, progress)
            }
            Decay::Linear => self.peak_lr * (1.0 - progress),
            Decay::Poly { power, final_lr } => {
                final_lr + (self.peak_lr - final_lr) * (1.0 - progress).powf(*power)
            }
            Decay::FlatCosine { start, final_lr } => {
                let progress = ((t - start) / (self.epochs - start)).clamp(0.0, 1.0);
                cosine(self.peak_lr, *final_lr, progress)
            }
        }
    }

    /// The momentum for the step that ends at fractional epoch `t` where the schedule sets it (one cycle: the
    /// mirror of its rate, from `max_momentum` to `base_momentum` over the warmup and back by the last epoch),
    /// None where the optimizer's `--momentum` holds throughout.
    pub fn momentum_at(&self, t: f64) -> Option<f64> {
        let Decay::OneCycle {
            max_momentum,
            base_momentum,
            ..
        } = self.decay
        else {
            return None;
        };
        let w = self.warmup_epochs;
        Some(if t < w {
            cosine(max_momentum, base_momentum, (t / w).max(0.0))
        } else {
            let progress = ((t - w) / (self.epochs - w)).clamp(0.0, 1.0);
            cosine(base_momentum, max_momentum, progress)
        })
    }
}

/// Half a cosine from `from` (at `progress` 0) to `to` (at 1): PyTorch's `_annealing_cos`.
fn cosine(from: f64, to: f64, progress: f64) -> f64 {
    to + 0.5 * (from - to) * (1.0 + (PI * progress).cos())
}

impl fmt::Display for LrSchedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let decay = match &self.decay {
            Decay::Step { milestones, gamma } if milestones.is_empty() => {
                format!(
                    "step ×{gamma} every {STEP_EVERY} epochs: none in this run (a constant rate)"
                )
            }
            Decay::Step { milestones, gamma } => {
                format!("step ×{gamma} at epochs {}", fmt_epochs(milestones))
            }
            Decay::Cosine { final_lr } => format!("cosine to {}", fmt_lr(*final_lr)),
            Decay::Linear => "linear to 0".into(),
            Decay::Poly { power, final_lr } => {
                format!("polynomial (power {power}) to {}", fmt_lr(*final_lr))
            }
            Decay::FlatCosine { start, final_lr } => format!(
                "flat until epoch {}, then cosine to {}",
                fmt_epochs(&[*start]),
                fmt_lr(*final_lr)
            ),
            Decay::OneCycle {
                initial_lr,
                final_lr,
                max_momentum,
                base_momentum,
            } => format!(
                "one cycle: up from {} along a cosine, then cosine to {}, {}",
                fmt_lr(*initial_lr),
                fmt_lr(*final_lr),
                if base_momentum < max_momentum {
                    format!("momentum {max_momentum} → {base_momentum} → {max_momentum}")
                } else {
                    format!("momentum {max_momentum} throughout")
                }
            ),
        };
        write!(
            f,
            "peak {} after {} warmup epochs, {decay}, {} epochs",
            fmt_lr(self.peak_lr),
            fmt_epochs(&[self.warmup_epochs]),
            fmt_epochs(&[self.epochs])
        )
    }
}

/// Epochs as a person reads them: "30, 60, 80", "0.667, 1.333" (fractions of an epoch to three decimals).
fn fmt_epochs(e: &[f64]) -> String {
    let each: Vec<String> = e.iter().map(|&x| fmt_decimals(x, 3)).collect();
    each.join(", ")
}

/// Progressive resizing as FFCV does it: `min` until epoch `start`, then linear growth to `max` at `end`,
/// rounded to a multiple of 32 (small images early train faster; the last epochs run at full size).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Resolution {
    pub min: usize,
    pub max: usize,
    pub start: f64,
    pub end: f64,
}

impl Resolution {
    /// The resolutions of `train`'s flags: --image-size throughout, or from --min-res up to it (--start-ramp,
    /// --end-ramp).
    pub fn of_args(args: &TrainArgs) -> Result<Self> {
        match args.min_res {
            None => Ok(Self::fixed(args.image_size)),
            Some(min) => Self::new(min, args.image_size, args.start_ramp, args.end_ramp_epoch()),
        }
    }

    pub fn fixed(size: usize) -> Self {
        Self {
            min: size,
            max: size,
            start: 0.0,
            end: 0.0,
        }
    }

    pub fn new(min: usize, max: usize, start: f64, end: f64) -> Result<Self> {
        if min == 0 || min > max || start < 0.0 || end < start {
            bail!("progressive resizing needs 0 < --min-res <= --image-size and --start-ramp <= --end-ramp (got {min}, {max}, {start}, {end})");
        }
        Ok(Self {
            min,
            max,
            start,
            end,
        })
    }

    /// Every training resolution of a run of `epochs` epochs, smallest first.
    pub fn sizes(&self, epochs: usize) -> std::collections::BTreeSet<usize> {
        (0..epochs).map(|e| self.at(e)).collect()
    }

    /// The training resolution of `epoch`.
    pub fn at(&self, epoch: usize) -> usize {
        let e = epoch as f64;
        if self.min == self.max || e <= self.start {
            return self.min;
        }
        if e >= self.end {
            return self.max;
        }
        let t = (e - self.start) / (self.end - self.start);
        let res = self.min as f64 + t * (self.max - self.min) as f64;
        ((res / 32.0).round() as usize * 32).clamp(self.min, self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 * b.abs().max(1.0)
    }

    #[test]
    fn linear_scaling_rule() {
        assert_eq!(scaled_lr(0.1, 256, 256), 0.1);
        assert!(
            close(scaled_lr(0.1, 8192, 256), 3.2),
            "Goyal et al.: 8k batch, lr 3.2"
        );
        assert!(close(scaled_lr(0.1, 32, 256), 0.0125));
        assert!(
            close(scaled_lr(0.2, 1024, 512), 0.4),
            "timm's --lr-base-size"
        );
    }

    #[test]
    fn step_schedule_with_given_milestones() {
        let decay = Decay::step_for(90.0, Some(&[30.0, 60.0]));
        let s = LrSchedule::new(0.1, 0.0, 90.0, decay).unwrap();
        for (t, lr) in [(29.99, 0.1), (30.0, 0.01), (60.0, 0.001), (89.99, 0.001)] {
            assert!(close(s.at(t), lr), "epoch {t}: {} != {lr}", s.at(t));
        }
    }

    /// The default is main.py's `StepLR(step_size=30)`, as docs/train.md and recipes/main-py-90ep.toml say: a
    /// short run keeps its rate rather than dropping it after a third of its epochs.
    #[test]
    fn the_default_milestones_are_main_py_s_every_30_epochs() {
        let milestones = |epochs| match Decay::step_for(epochs, None) {
            Decay::Step { milestones, gamma } => {
                assert_eq!(gamma, 0.1);
                milestones
            }
            d => panic!("{d:?}"),
        };
        assert_eq!(milestones(90.0), [30.0, 60.0]);
        assert_eq!(milestones(100.0), [30.0, 60.0, 90.0]);
        assert_eq!(milestones(31.0), [30.0]);
        for short in [1.0, 3.0, 30.0] {
            assert_eq!(milestones(short), [] as [f64; 0], "{short} epochs");
        }
        let s = LrSchedule::new(0.1, 0.0, 3.0, Decay::step_for(3.0, None)).unwrap();
        for t in [0.5, 1.0, 2.0, 3.0] {
            assert!(close(s.at(t), 0.1), "epoch {t}: {}", s.at(t));
        }
    }

    /// main.py's recipe as recipes/ holds it trains with the default milestones: the recipe file, the default
    /// and docs/train.md's "main.py's recipe" command line (which gives no --lr-milestones) say the same.
    #[test]
    fn main_py_s_recipe_file_has_the_default_milestones() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../recipes/main-py-90ep.toml"
        );
        let recipe: toml::Table = std::fs::read_to_string(path).unwrap().parse().unwrap();
        let epochs = recipe["epochs"].as_integer().unwrap() as f64;
        let milestones: Vec<f64> = recipe["lr-milestones"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m.as_integer().unwrap() as f64)
            .collect();
        assert_eq!(
            Decay::step_for(epochs, None),
            Decay::step_for(epochs, Some(&milestones))
        );
    }

    /// Goyal et al.'s step schedule (recipes/goyal-8k-5ep-warmup.toml), ÷10 at 30, 60 and 80.
    #[test]
    fn step_schedule_of_goyal_et_al() {
        let decay = Decay::step_for(90.0, Some(&[30.0, 60.0, 80.0]));
        let s = LrSchedule::new(0.1, 0.0, 90.0, decay).unwrap();
        let want = [
            (0.0, 0.1),
            (29.99, 0.1),
            (30.0, 0.01),
            (59.0, 0.01),
            (60.0, 0.001),
            (80.0, 0.0001),
            (89.9, 0.0001),
        ];
        for (t, lr) in want {
            assert!(close(s.at(t), lr), "epoch {t}: {} vs {lr}", s.at(t));
        }
    }

    #[test]
    fn warmup_then_cosine() {
        let s = LrSchedule::new(3.2, 5.0, 90.0, Decay::Cosine { final_lr: 0.0 }).unwrap();
        assert!(close(s.at(1.0), 3.2 / 5.0));
        assert!(close(s.at(2.5), 1.6));
        assert!(close(s.at(5.0), 3.2), "peak right after warmup");
        assert!(close(s.at(47.5), 1.6), "half way through the decay");
        assert!(s.at(90.0).abs() < 1e-12);
        // Monotone after warmup.
        let v: Vec<f64> = (50..=900).map(|i| s.at(i as f64 / 10.0)).collect();
        assert!(v.windows(2).all(|w| w[1] <= w[0]));
    }

    /// fast.ai's fit_flat_cos: the peak from the warmup's end to `start`, then half a cosine to the floor.
    #[test]
    fn flat_then_cosine_as_fast_ai() {
        let decay = Decay::FlatCosine {
            start: 15.0,
            final_lr: 0.01,
        };
        let s = LrSchedule::new(1.0, 1.0, 20.0, decay).unwrap();
        assert!(close(s.at(0.5), 0.5), "warmup");
        for t in [1.0, 7.0, 15.0] {
            assert!(close(s.at(t), 1.0), "flat at {t}");
        }
        assert!(close(s.at(17.5), 0.505), "half way through the cosine");
        assert!(close(s.at(20.0), 0.01));
        let v: Vec<f64> = (150..=200).map(|i| s.at(i as f64 / 10.0)).collect();
        assert!(v.windows(2).all(|w| w[1] < w[0]));
        for start in [0.5, 20.0, 21.0] {
            let decay = Decay::FlatCosine {
                start,
                final_lr: 0.0,
            };
            assert!(LrSchedule::new(1.0, 1.0, 20.0, decay).is_err(), "{start}");
        }
    }

    /// One cycle as PyTorch's OneCycleLR(anneal_strategy="cos") draws it: up from peak/25 along half a cosine,
    /// down along another; momentum the mirror image, 0.95 → 0.85 → 0.95.
    #[test]
    fn one_cycle_rate_and_momentum() {
        let decay = Decay::OneCycle {
            initial_lr: 0.04,
            final_lr: 0.001,
            max_momentum: 0.95,
            base_momentum: 0.85,
        };
        let s = LrSchedule::new(1.0, 2.0, 10.0, decay).unwrap();
        let m = |t| s.momentum_at(t).unwrap();
        assert!(close(s.at(0.0), 0.04) && close(m(0.0), 0.95), "the start");
        assert!(close(s.at(1.0), 0.52) && close(m(1.0), 0.9), "half way up");
        assert!(close(s.at(2.0), 1.0) && close(m(2.0), 0.85), "the peak");
        assert!(
            close(s.at(6.0), 0.5005) && close(m(6.0), 0.9),
            "half way down"
        );
        assert!(close(s.at(10.0), 0.001) && close(m(10.0), 0.95), "the end");
        let rates: Vec<f64> = (0..=100).map(|i| s.at(i as f64 / 10.0)).collect();
        assert!(rates[..20].windows(2).all(|w| w[1] > w[0]), "rising");
        assert!(rates[20..].windows(2).all(|w| w[1] < w[0]), "falling");
        // Every rate and its momentum move in opposite directions, by the same fraction of their ranges.
        for i in 0..=100 {
            let t = i as f64 / 10.0;
            let range = if t < 2.0 { 1.0 - 0.04 } else { 1.0 - 0.001 };
            let low = if t < 2.0 { 0.04 } else { 0.001 };
            assert!(close((s.at(t) - low) / range, (0.95 - m(t)) / 0.1), "{t}");
        }
        assert_eq!(
            LrSchedule::new(1.0, 2.0, 10.0, Decay::Cosine { final_lr: 0.0 })
                .unwrap()
                .momentum_at(1.0),
            None,
            "only one cycle sets the momentum"
        );
        let with = |warmup, initial_lr, base_momentum| {
            let decay = Decay::OneCycle {
                initial_lr,
                final_lr: 0.0,
                max_momentum: 0.9,
                base_momentum,
            };
            LrSchedule::new(1.0, warmup, 10.0, decay).map(|_| ())
        };
        assert!(with(1.0, 1.0, 0.9).is_ok(), "no rise, no cycling");
        assert!(with(0.0, 0.04, 0.85).is_err(), "no warmup");
        assert!(with(1.0, 0.0, 0.85).is_err(), "starting at 0");
        assert!(with(1.0, 1.5, 0.85).is_err(), "starting above the peak");
        assert!(with(1.0, 0.04, 0.95).is_err(), "base above max momentum");
    }

    /// The flags' one cycle: PyTorch's defaults where none is given (div_factor 25, base_momentum 0.85), the
    /// momentum cycled from --momentum.
    #[test]
    fn one_cycle_of_the_flags() {
        let of = |flags: &str| {
            let args = crate::train::args::parse_for_test(&format!(
                "--dummy --epochs 5 --warmup-epochs 1.25 {flags}"
            ))
            .unwrap();
            LrSchedule::of_args(&args, 0.4).unwrap()
        };
        let s = of("--lr-schedule one-cycle --momentum 0.95");
        assert_eq!(
            s.decay,
            Decay::OneCycle {
                initial_lr: 0.4 / 25.0,
                final_lr: 0.0,
                max_momentum: 0.95,
                base_momentum: 0.85
            }
        );
        assert!(s.to_string().contains("momentum 0.95 → 0.85 → 0.95"), "{s}");
        let s = of("--lr-schedule one-cycle --div-factor 10 --base-momentum 0.9 --lr-end 0.001");
        assert_eq!(
            s.decay,
            Decay::OneCycle {
                initial_lr: 0.04,
                final_lr: 0.001,
                max_momentum: 0.9,
                base_momentum: 0.9
            }
        );
        assert!(s.to_string().contains("momentum 0.9 throughout"), "{s}");
        assert_eq!(s.momentum_at(1.0), Some(0.9));
    }

    #[test]
    fn linear_decay() {
        let s = LrSchedule::new(1.0, 0.0, 10.0, Decay::Linear).unwrap();
        assert!(close(s.at(0.0), 1.0));
        assert!(close(s.at(7.5), 0.25));
        assert_eq!(s.at(10.0), 0.0);
    }

    #[test]
    fn warmup_then_polynomial_decay_as_mlperf_lars() {
        // Peak 10 after 2 warmup epochs of 42, power 2, down to 0.0001: progress = (t - 2) / 40.
        let decay = Decay::Poly {
            power: 2.0,
            final_lr: 0.0001,
        };
        let s = LrSchedule::new(10.0, 2.0, 42.0, decay).unwrap();
        assert!(close(s.at(1.0), 5.0), "half way through the warmup");
        assert!(close(s.at(2.0), 10.0), "peak right after warmup");
        // t = 12: progress 1/4, (3/4)² = 0.5625; 0.0001 + 9.9999 · 0.5625 = 5.62504375.
        assert!(close(s.at(12.0), 5.62504375), "{}", s.at(12.0));
        // t = 22: progress 1/2, (1/2)² = 0.25; 0.0001 + 9.9999 · 0.25 = 2.500075.
        assert!(close(s.at(22.0), 2.500075), "{}", s.at(22.0));
        assert!(close(s.at(42.0), 0.0001), "the last step ends at --lr-end");
        let v: Vec<f64> = (20..=420).map(|i| s.at(i as f64 / 10.0)).collect();
        assert!(v.windows(2).all(|w| w[1] <= w[0]), "monotone after warmup");
        // Power 1 without an end rate is the linear decay; power 3 by hand: 1 · (1 - 0.5)³ = 0.125.
        let poly = |power| Decay::Poly {
            power,
            final_lr: 0.0,
        };
        let (p1, lin) = (
            LrSchedule::new(1.0, 0.0, 10.0, poly(1.0)).unwrap(),
            LrSchedule::new(1.0, 0.0, 10.0, Decay::Linear).unwrap(),
        );
        for t in [0.0, 2.5, 7.5, 10.0] {
            assert!(close(p1.at(t), lin.at(t)), "epoch {t}");
        }
        let p3 = LrSchedule::new(1.0, 0.0, 10.0, poly(3.0)).unwrap();
        assert!(close(p3.at(5.0), 0.125));
    }

    #[test]
    fn progressive_resizing_like_ffcv() {
        // 160 → 192 between epochs 11 and 13 of 16, as in FFCV's short ResNet-50 configs.
        let r = Resolution::new(160, 192, 11.0, 13.0).unwrap();
        let got: Vec<usize> = (0..16).map(|e| r.at(e)).collect();
        let mut want = vec![160; 12];
        want.extend([192; 4]); // epoch 12: 176 = 5.5·32 rounds to 6·32, as numpy's round does too
        assert_eq!(got, want);
        let r = Resolution::new(128, 224, 0.0, 30.0).unwrap();
        assert_eq!(
            [r.at(0), r.at(10), r.at(15), r.at(29), r.at(30)],
            [128, 160, 192, 224, 224]
        );
        assert!(Resolution::new(256, 224, 0.0, 1.0).is_err());
        assert_eq!(Resolution::fixed(32).at(7), 32);
    }

    #[test]
    fn nonsense_is_rejected() {
        assert!(LrSchedule::new(0.0, 0.0, 90.0, Decay::Linear).is_err());
        assert!(LrSchedule::new(0.1, 90.0, 90.0, Decay::Linear).is_err());
        let poly = |power, final_lr| Decay::Poly { power, final_lr };
        assert!(
            LrSchedule::new(0.1, 0.0, 90.0, poly(2.0, 0.1)).is_err(),
            "end at the peak"
        );
        assert!(
            LrSchedule::new(0.1, 0.0, 90.0, poly(0.0, 0.0)).is_err(),
            "power 0"
        );
        assert!(LrSchedule::new(0.1, 0.0, 90.0, Decay::Cosine { final_lr: -1.0 }).is_err());
        assert!(LrSchedule::new(
            0.1,
            0.0,
            90.0,
            Decay::Step {
                milestones: vec![60.0, 30.0],
                gamma: 0.1
            }
        )
        .is_err());
    }

    #[test]
    fn the_start_line_shows_epochs_and_rates_as_people_write_them() {
        let line = |peak, epochs: f64, milestones: Option<&[f64]>| {
            LrSchedule::new(peak, 0.5, epochs, Decay::step_for(epochs, milestones))
                .unwrap()
                .to_string()
        };
        assert_eq!(
            line(0.1, 90.0, None),
            "peak 0.1 after 0.5 warmup epochs, step ×0.1 at epochs 30, 60, 90 epochs"
        );
        assert_eq!(
            line(
                scaled_lr(0.1, 768, 256),
                2.0,
                Some(&[2.0 / 3.0, 4.0 / 3.0, 16.0 / 9.0])
            ),
            "peak 0.3 after 0.5 warmup epochs, step ×0.1 at epochs 0.667, 1.333, 1.778, 2 epochs"
        );
        assert_eq!(
            line(0.1, 3.0, None),
            "peak 0.1 after 0.5 warmup epochs, step ×0.1 every 30 epochs: none in this run (a constant rate), \
             3 epochs"
        );
    }
}
