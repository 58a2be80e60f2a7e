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
