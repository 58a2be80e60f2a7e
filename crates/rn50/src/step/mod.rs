//! One training step as a reusable unit: the batch's preparation on the device ([`normalize`], [`erase`], [`mix`]),
//! forward, cross-entropy (optional label smoothing), backward, SGD update, in fp32 / bf16 autocast / fp16
//! autocast with dynamic loss scaling; on CUDA, optionally captured once as a CUDA graph and replayed ([`graph`]).
pub mod erase;
pub mod graph;
pub mod mix;
pub mod normalize;
pub mod optim;
pub mod precision;
pub mod scaler;

use anyhow::Result;
use rand::Rng;
use tch::{Device, Reduction, Tensor};

use crate::input::DeviceBatch;
use crate::model::Model;
use mix::BatchMix;
pub use normalize::Normalizer;
pub use optim::{
    describe as describe_optimizer, AdamConfig, AdamKind, LookaheadConfig, Optimizer,
    OptimizerConfig, Rate,
};
pub use precision::Precision;
use rn50_distributed::{DdpOptions, DistContext, GradSync, StepComm};
pub use scaler::{GradScaler, Skipped};

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct StepConfig {
    pub precision: Precision,
    pub channels_last: bool,
    pub label_smoothing: f64,
    pub optimizer: OptimizerConfig,
}

/// What a step returns. `loss` stays on the device (reading it syncs): fetch it only when logging.
pub struct StepOutcome {
    pub loss: Tensor,
    /// fp16 only: the gradients overflowed, the update was skipped and the loss scale lowered.
    pub skipped: Skipped,
}

/// A micro-batch's forward: its mean loss and its logits, on the device (reading them syncs). The training
/// accuracy is counted from the logits (main.py's `top1` meter).
pub struct Forward {
    pub loss: Tensor,
    pub logits: Tensor,
}

pub struct TrainStep {
    pub model: Model,
    pub opt: Optimizer,
    pub scaler: Option<GradScaler>,
    pub input: Normalizer,
    pub config: StepConfig,
    /// Data-parallel gradient averaging (c10d's Reducer, overlapped with backward); `None`: plain backward.
    pub grad_sync: Option<GradSync>,
    /// The last synchronised backward's communication figures.
    pub comm: StepComm,
    /// The step captured as a CUDA graph ([`TrainStep::capture_graph`]), replayed by [`TrainStep::step_u8`].
    graph: Option<graph::StepGraph>,
    /// Train's `--cuda-graph`: the shape of the batches warming up a capture, and how many eager steps of it ran
    /// ([`TrainStep::train_step_graphed`]).
    graph_warmup: Option<(Vec<i64>, usize)>,
}

impl TrainStep {
    /// Takes a freshly built (or loaded) model, converts it to channels_last if asked, and builds the
    /// optimizer and, for fp16, the loss scaler.
    pub fn new(model: Model, config: StepConfig) -> Self {
        if config.channels_last {
            model.to_channels_last();
        }
        let device = model.device();
        let opt = Optimizer::new(model.parameters(), config.optimizer.clone());
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
            grad_sync: None,
            comm: StepComm::default(),
            graph: None,
            graph_warmup: None,
        }
    }

    pub fn device(&self) -> Device {
        self.model.device()
    }

    /// Data parallelism, the same for `bench` and `train`: when `dist` spans several processes, rank 0's weights
    /// everywhere, then gradients averaged in buckets during backward (PyTorch DDP). Call it after the
    /// channels_last conversion and any checkpoint load: buckets follow the parameters' strides. A single
    /// process is left alone.
    pub fn sync_gradients(&mut self, dist: &DistContext, opts: &DdpOptions) -> Result<()> {
        if dist.world_size() > 1 {
            let params = self.model.parameters_in_forward_order();
            let buffers = self.model.buffers();
            self.grad_sync = Some(dist.gradient_sync(&params, &buffers, opts)?);
        }
        Ok(())
    }

    /// A training micro-batch as the network takes it: normalised, random erasing's boxes zeroed, and mixed by
    /// `mix` (--mixup-alpha, --cutmix-alpha) with its draw from the random generator given with it. The input and
    /// its targets: the labels, or class probabilities when mixed.
    pub fn prepare(
        &mut self,
        batch: &DeviceBatch,
        mix: Option<(&BatchMix, &mut impl Rng)>,
    ) -> (Tensor, Tensor) {
        let mut x = self.input.normalize(&batch.images);
        erase::erase(&mut x, &batch.erased);
        let targets = match mix {
            Some((m, rng)) => {
                let (h, w) = (x.size()[2] as usize, x.size()[3] as usize);
                let classes = self.model.net.config.num_classes;
                m.draw(rng, h, w).apply(&mut x, &batch.labels, classes)
            }
            None => batch.labels.shallow_clone(),
        };
        (x, targets)
    }

    /// A step on a uint8 NHWC batch already on the device (normalised here, on the device): the captured CUDA
    /// graph's replay where one was captured for batches of this shape ([`TrainStep::capture_graph`]), else eager.
    pub fn step_u8(&mut self, images: &Tensor, labels: &Tensor, lr: f64) -> Result<StepOutcome> {
        if let Some(out) = self.replay(images, labels, lr)? {
            return Ok(out.outcome);
        }
        let x = self.input.normalize(images);
        self.step(&x, labels, lr)
    }

    /// A step on a normalised float NCHW batch, eager.
    pub fn step<'a>(
        &mut self,
        x: &Tensor,
        labels: &Tensor,
        lr: impl Into<Rate<'a>>,
    ) -> Result<StepOutcome> {
        self.opt.zero_grad();
        let loss = self.backward(x, labels, 0, 1)?.loss;
        let skipped = self.apply(lr, self.opt.config.momentum)?;
        Ok(StepOutcome { loss, skipped })
    }

    /// Forward and backward of micro-batch `micro` of `of` (gradient accumulation: gradients add up, each
    /// loss weighted 1/`of`, so `of` micro-batches of b equal one batch of `of`·b). Call `opt.zero_grad()`
    /// before the first. Returns the micro-batch's (unweighted) loss and its logits, detached.
    pub fn backward(
        &mut self,
        x: &Tensor,
        labels: &Tensor,
        micro: usize,
        of: usize,
    ) -> Result<Forward> {
        let Forward { loss, logits } = self.forward(x, labels)?;
        let weighted = if of > 1 {
            &loss / of as f64
        } else {
            loss.shallow_clone()
        };
        let scaled = match &self.scaler {
            Some(scaler) => scaler.scale_loss(&weighted),
            None => weighted,
        };
        match &mut self.grad_sync {
            // Ranks average only the complete gradient: earlier micro-batches accumulate locally (no_sync).
            Some(sync) if micro + 1 == of => {
                self.comm = sync.backward(&scaled)?;
                // DDP's broadcast_buffers (PyTorch's default, before each forward): rank 0's BN running
                // statistics on every rank, so that every rank evaluates and checkpoints the same model and a
                // resumed run (whose ranks all load rank 0's) continues exactly as an uninterrupted one.
                sync.sync_buffers()?;
            }
            Some(sync) => {
                sync.backward_no_sync(&scaled)?;
            }
            None => scaled.f_backward()?,
        }
        Ok(Forward {
            loss: loss.detach(),
            logits: logits.detach(),
        })
    }

    /// After the last `backward` of a step: (fp16) unscale and skip the update on overflow, else the
    /// optimizer step at rate `lr` and `momentum`. Returns whether the step was skipped, as a flag read on
    /// demand (on CUDA the whole step runs without the host waiting for the GPU).
    pub fn apply<'a>(&mut self, lr: impl Into<Rate<'a>>, momentum: f64) -> Result<Skipped> {
        let lr = lr.into();
        Ok(match &mut self.scaler {
            Some(scaler) => {
                scaler.unscale(&self.opt.grads())?;
                self.opt.step(lr, momentum, Some(scaler.found_inf()))?;
                let skipped = Skipped::from_flag(scaler.found_inf());
                scaler.update()?;
                skipped
            }
            None => {
                self.opt.step(lr, momentum, None)?;
                Skipped::never()
            }
        })
    }

    /// Forward and loss under this step's precision (train-mode BN). `labels`: class indices `[N]`, or class
    /// probabilities `[N, classes]` (Mixup/CutMix's targets; label smoothing then applies to them, as PyTorch's
    /// cross-entropy does).
    pub fn forward(&self, x: &Tensor, labels: &Tensor) -> Result<Forward> {
        let _autocast = self.config.precision.autocast(self.device())?;
        let logits = self.model.forward_t(x, true);
        if let Some(e) = crate::model::sync_bn::take_failure() {
            return Err(e.into());
        }
        let loss = logits.cross_entropy_loss(
            labels,
            None::<Tensor>,
            Reduction::Mean,
            -100,
            self.config.label_smoothing,
        );
        Ok(Forward { loss, logits })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Arch, ResNetConfig, Stem};
    use tch::Kind;

    /// A CIFAR-stem ResNet-18, 16 wide, on the CPU (also for [`graph`]'s tests).
    pub(super) fn small_step(precision: Precision, channels_last: bool) -> TrainStep {
        tch::manual_seed(0);
        let mut cfg = ResNetConfig::new(Arch::ResNet18);
        cfg.stem = Stem::Cifar;
        cfg.num_classes = 10;
        // 16 channels wide, not torchvision's 64: a CPU without bf16 instructions (the CI machine's AMD EPYC Zen 3)
        // emulates bf16, and six bf16 steps at width 64 took 37 s there (4 s at 16); 16 is the narrowest width
        // oneDNN's bf16 training kernels are safe with (README, "CPUs").
        cfg.width = 16;
        let model = Model::new(cfg, Device::Cpu);
        TrainStep::new(
            model,
            StepConfig {
                precision,
                channels_last,
                label_smoothing: 0.0,
                optimizer: OptimizerConfig::default(),
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

    /// Two micro-batches of the same images accumulate to exactly the gradient of one (BN makes a split
    /// batch differ from the whole, so the same batch twice is the case where the two must agree).
    #[test]
    fn accumulated_micro_batches_weigh_like_one_batch() {
        let images = Tensor::randint(256, [4, 32, 32, 3], (Kind::Uint8, Device::Cpu));
        let labels = Tensor::randint(10, [4], (Kind::Int64, Device::Cpu));
        let mut one = small_step(Precision::Fp32, false);
        let mut acc = small_step(Precision::Fp32, false);
        // The same start (tests share the global RNG, so seeding alone does not guarantee it).
        tch::no_grad(|| {
            for ((_, mut a), (_, b)) in acc.model.state().into_iter().zip(one.model.state()) {
                a.copy_(&b);
            }
        });
        let start = one.model.parameters()[0].1.copy();
        one.step_u8(&images, &labels, 0.1).unwrap();
        acc.opt.zero_grad();
        for micro in 0..2 {
            let x = acc.input.normalize(&images);
            let _ = acc.backward(&x, &labels, micro, 2).unwrap();
        }
        let momentum = acc.opt.config.momentum;
        assert!(!acc.apply(0.1, momentum).unwrap().get().unwrap());
        for ((name, a), (_, b)) in one.model.parameters().iter().zip(acc.model.parameters()) {
            let diff = f64::try_from((a - &b).abs().max()).unwrap();
            assert!(diff < 1e-6, "{name} differs by {diff}");
        }
        // And the update did move the weights.
        let moved = one.model.parameters()[0].1.not_equal_tensor(&start);
        assert!(bool::try_from(moved.any()).unwrap());
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
        assert!(out.skipped.get().unwrap());
        for (b, (k, a)) in before.iter().zip(step.model.parameters()) {
            assert_eq!(b, &a, "{k} changed on a skipped step");
        }
        assert_eq!(step.scaler.as_ref().unwrap().current_scale(), 512.0);
        // With a sane scale the step goes through.
        step.scaler = Some(GradScaler::with_scale(Device::Cpu, 1024.0));
        assert!(!step
            .step_u8(&images, &labels, 0.1)
            .unwrap()
            .skipped
            .get()
            .unwrap());
        assert!(before
            .iter()
            .zip(step.model.parameters())
            .any(|(b, (_, a))| b != &a));
    }
}
