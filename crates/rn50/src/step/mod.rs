//! One training step as a reusable unit: forward, cross-entropy (optional label smoothing), backward,
//! SGD update, in fp32 / bf16 autocast / fp16 autocast with dynamic loss scaling.
pub mod input;
pub mod optim;
pub mod precision;
pub mod scaler;

use anyhow::Result;
use tch::{Device, Reduction, Tensor};

use crate::model::Model;
pub use input::Normalizer;
pub use optim::{Sgd, SgdConfig};
pub use precision::Precision;
pub use scaler::GradScaler;

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct StepConfig {
    pub precision: Precision,
    pub channels_last: bool,
    pub label_smoothing: f64,
    pub sgd: SgdConfig,
}

/// What a step returns. `loss` stays on the device (reading it syncs): fetch it only when logging.
pub struct StepOutcome {
    pub loss: Tensor,
    /// fp16 only: the gradients overflowed, the update was skipped and the loss scale lowered.
    pub skipped: bool,
}

pub struct TrainStep {
    pub model: Model,
    pub opt: Sgd,
    pub scaler: Option<GradScaler>,
    pub input: Normalizer,
    pub config: StepConfig,
}

impl TrainStep {
    /// Takes a freshly built (or loaded) model, converts it to channels_last if asked, and builds the
    /// optimizer and, for fp16, the loss scaler.
    pub fn new(model: Model, config: StepConfig) -> Self {
        if config.channels_last {
            model.to_channels_last();
        }
        let device = model.device();
        let opt = Sgd::new(model.parameters(), config.sgd.clone());
        let scaler = config
            .precision
            .needs_loss_scaling()
            .then(|| GradScaler::new(device));
        let input = Normalizer::new(device, config.channels_last);
        Self {
            model,
            opt,
            scaler,
            input,
            config,
        }
    }

    pub fn device(&self) -> Device {
        self.model.device()
    }

    /// A step on a uint8 NHWC batch already on the device (normalised here, on the device).
    pub fn step_u8(&mut self, images: &Tensor, labels: &Tensor, lr: f64) -> Result<StepOutcome> {
        let x = self.input.normalize(images);
        self.step(&x, labels, lr)
    }

    /// A step on a normalised float NCHW batch.
    pub fn step(&mut self, x: &Tensor, labels: &Tensor, lr: f64) -> Result<StepOutcome> {
        self.opt.zero_grad();
        let loss = self.loss(x, labels)?;
        let skipped = match &mut self.scaler {
            Some(scaler) => {
                scaler.scale_loss(&loss).backward();
                let overflow = scaler.unscale(&self.opt.grads())?;
                if !overflow {
                    self.opt.step(lr)?;
                }
                scaler.update()?;
                overflow
            }
            None => {
                loss.backward();
                self.opt.step(lr)?;
                false
            }
        };
        Ok(StepOutcome {
            loss: loss.detach(),
            skipped,
        })
    }

    /// Forward and loss under this step's precision (train-mode BN).
    pub fn loss(&self, x: &Tensor, labels: &Tensor) -> Result<Tensor> {
        let _autocast = self.config.precision.autocast(self.device())?;
        let logits = self.model.forward_t(x, true);
        Ok(logits.cross_entropy_loss(
            labels,
            None::<Tensor>,
            Reduction::Mean,
            -100,
            self.config.label_smoothing,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Arch, ResNetConfig, Stem};
    use tch::Kind;

    fn small_step(precision: Precision, channels_last: bool) -> TrainStep {
        tch::manual_seed(0);
        let mut cfg = ResNetConfig::new(Arch::ResNet18);
        cfg.stem = Stem::Cifar;
        cfg.num_classes = 10;
        let model = Model::new(cfg, Device::Cpu);
        TrainStep::new(
            model,
            StepConfig {
                precision,
                channels_last,
                label_smoothing: 0.0,
                sgd: SgdConfig::default(),
            },
        )
    }

    #[test]
    fn bf16_channels_last_steps_fit_a_batch() {
        let mut step = small_step(Precision::Bf16, true);
        let images = Tensor::randint(256, [8, 32, 32, 3], (Kind::Uint8, Device::Cpu));
        let labels = Tensor::randint(10, [8], (Kind::Int64, Device::Cpu));
        let losses: Vec<f64> = (0..6)
            .map(|_| f64::try_from(&step.step_u8(&images, &labels, 0.05).unwrap().loss).unwrap())
            .collect();
        assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");
        assert!(
            losses[5] < 0.5 * losses[0],
            "memorising one batch must cut the loss: {losses:?}"
        );
        // Parameters stay fp32 and channels_last under autocast.
        let (_, w) = step
            .model
            .parameters()
            .into_iter()
            .find(|(k, _)| k == "layer1.0.conv1.weight")
            .unwrap();
        assert_eq!(w.kind(), Kind::Float);
        assert!(crate::model::memory_format::is_channels_last(&w));
    }

    #[test]
    fn loss_scaler_skips_overflowing_steps() {
        let mut step = small_step(Precision::Fp32, false);
        step.scaler = Some(GradScaler::with_scale(Device::Cpu, 1024.0));
        let before: Vec<Tensor> = step
            .model
            .parameters()
            .iter()
            .map(|(_, t)| t.copy())
            .collect();
        let images = Tensor::randint(256, [4, 32, 32, 3], (Kind::Uint8, Device::Cpu));
        let labels = Tensor::randint(10, [4], (Kind::Int64, Device::Cpu));
        // One NaN pixel makes every gradient non-finite, as an fp16 overflow would: the update must be
        // skipped, every parameter left untouched, and the scale halved.
        let x = step.input.normalize(&images).copy();
        let _ = x.get(0).get(0).get(0).get(0).fill_(f64::NAN);
        let out = step.step(&x, &labels, 0.1).unwrap();
        assert!(out.skipped);
        for (b, (k, a)) in before.iter().zip(step.model.parameters()) {
            assert_eq!(b, &a, "{k} changed on a skipped step");
        }
        assert_eq!(step.scaler.as_ref().unwrap().current_scale(), 512.0);
        // With a sane scale the step goes through.
        step.scaler = Some(GradScaler::with_scale(Device::Cpu, 1024.0));
        assert!(!step.step_u8(&images, &labels, 0.1).unwrap().skipped);
        assert!(before
            .iter()
            .zip(step.model.parameters())
            .any(|(b, (_, a))| b != &a));
    }
}
