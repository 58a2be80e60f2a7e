//! The training step as one CUDA graph (issue 47): a whole step on a uint8 batch (gradients zeroed in place, the
//! normalisation, forward under autocast, the loss scaled, backward, the gradients unscaled, the fused SGD reading
//! this step's rate and the overflow flag on the device, the loss-scale update) captured once into a CUDA graph
//! over static image, label and rate tensors, then replayed: each step copies its batch into the static buffers,
//! sets the rate tensor and launches the graph, one launch for the thousands of kernels of a step, and the host
//! never waits for the GPU. The loss and the skipped flag are read from the graph's outputs only when asked.
//!
//! Capture follows `torch.cuda.graph`'s recipe: [`WARMUP_STEPS`] eager steps on a side stream (cuDNN's autotuning,
//! the gradients allocated, every lazily made handle and plan made), a device-wide synchronize, then the capture on
//! a side stream (`crates/shim/cpp/graph.cpp`). Two ways to get there: `bench` warms up on its one batch
//! ([`TrainStep::capture_graph`]); `train` takes its own first steps as the warm-up and captures on the next batch,
//! which the graph's first replay then trains on ([`TrainStep::train_step_graphed`]), so every batch is trained on
//! once, in order, as in an eager run, and nothing has to be undone.
//!
//! The graph bakes in the batch's shape and type and every number of the step but the rate: the momentum (the
//! configuration's), weight decay, Nesterov, label smoothing, precision. A batch of another shape runs the eager step
//! (one graph per shape is left to progressive resizing's turn). [`declined`] says where a graph cannot apply at
//! all: the CPU, a build without CUDA, gradients averaged across ranks (DDP's all-reduce runs from the Reducer's
//! hooks, outside the graph), `--sync-bn` (its all-reduce inside batch norm), LARS (its update takes the rate as a
//! number), and, from the loop, gradient accumulation and a momentum that changes per step (one cycle). NCHW
//! (`--no-channels-last`) changes nothing here: its kernels are captured as the NHWC ones.
use anyhow::{bail, Context, Result};
use tch::{Device, Kind, Tensor};

use super::optim::Rate;
use super::{Skipped, StepOutcome, TrainStep};
use crate::shim::{self, CudaGraph, SideStream};
use crate::train::metrics::correct_top1;

/// Eager steps on the side stream before capture (PyTorch's example warms up with 3): the first autotunes cuDNN
/// and allocates the gradients that the captured step then zeroes and accumulates into in place.
pub const WARMUP_STEPS: usize = 3;

/// What the training loop does around each step that a captured step cannot (`bench` does none of it).
#[derive(Clone, Copy, Debug, Default)]
pub struct LoopNeeds {
    /// Micro-batches per step (train's gradient accumulation); 0 or 1: none.
    pub micro_batches: usize,
    /// The momentum changes from step to step (the one-cycle schedule): the graph bakes in one.
    pub momentum_schedule: bool,
    /// Mixup or CutMix: each batch's mix is drawn on the host and changes the step's targets.
    pub mixes: bool,
    /// Random erasing: each batch's boxes are zeroed by host-driven ops of their own size.
    pub erases: bool,
}

/// Whether [`TrainStep::capture_graph`] captured the step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GraphStatus {
    /// Captured: [`TrainStep::step_u8`] replays it for batches of the captured shape.
    Captured,
    /// Not captured, and why: the eager step runs.
    Declined(String),
}

/// A step through [`TrainStep::train_step_graphed`]: its outcome and how many of its images ranked their label
/// first (main.py's training top-1), both on the device.
pub struct GraphedStep {
    pub outcome: StepOutcome,
    pub correct1: Tensor,
}

/// A captured step and the tensors its kernels read and write.
pub(super) struct StepGraph {
    graph: CudaGraph,
    /// The static inputs: each step's batch and rate are copied in before a replay.
    images: Tensor,
    labels: Tensor,
    lr: Tensor,
    /// The captured step's loss and top-1 hits, rewritten by each replay.
    loss: Tensor,
    correct1: Tensor,
    /// What the captured kernels use but did not allocate (parameters, gradients, momentum buffers, batch norm's
    /// running statistics, the scaler's state, the normalised input): held so that their memory stays theirs as
    /// long as the graph may write it, even if the step's parts were replaced.
    _used: Vec<Tensor>,
}

impl StepGraph {
    /// Whether a batch of these tensors can be copied into the static buffers.
    fn fits(&self, images: &Tensor, labels: &Tensor) -> bool {
        let same = |a: &Tensor, b: &Tensor| {
            a.size() == b.size() && a.kind() == b.kind() && a.device() == b.device()
        };
        same(images, &self.images) && same(labels, &self.labels)
    }
}

/// Why `step` cannot be captured as a CUDA graph in a loop that needs `needs`, or `None` where it can. What the
/// step or the loop asks for comes first, the device last, so that each reason can be checked on any machine.
pub fn declined(step: &TrainStep, needs: LoopNeeds) -> Option<String> {
    let why = if needs.micro_batches > 1 {
        "gradient accumulation: a step is several micro-batches"
    } else if needs.momentum_schedule {
        "the momentum changes every step (one-cycle schedule): a graph bakes in one momentum"
    } else if needs.mixes {
        "Mixup/CutMix: each batch's mix is drawn on the host"
    } else if needs.erases {
        "random erasing: each batch's boxes are zeroed by ops of their own size"
    } else if step.opt.config.lars_eta.is_some() {
        "LARS: its update takes the learning rate as a number, not from the device"
    } else if step.opt.config.adam.is_some() {
        "--optimizer adamw/radam: their bias corrections change every step and are computed on the host"
    } else if step.opt.config.lookahead.is_some() {
        "--lookahead: every k-th update, counted on the host, also moves the slow weights"
    } else if step.grad_sync.is_some() {
        "gradients are averaged across ranks: DDP's all-reduce runs from the Reducer's hooks, outside a graph"
    } else if crate::model::sync_bn::enabled() {
        "--sync-bn: batch norm's statistics are all-reduced across ranks inside the step"
    } else if !step.device().is_cuda() {
        "the device is the CPU: a CUDA graph captures CUDA work only"
    } else if !shim::cuda_compiled() {
        "this binary was built without CUDA (a libtorch without CUDA, or no CUDA headers at build time)"
    } else {
        return None;
    };
    Some(why.to_string())
}

impl TrainStep {
    /// Captures this step on batches like `images` (uint8 NHWC on the device) and `labels` as a CUDA graph, after
    /// [`WARMUP_STEPS`] eager steps on them at rate `lr`; from then on [`TrainStep::step_u8`] replays it for
    /// batches of that shape. Where [`declined`] gives a reason, nothing runs and the reason is returned. A new
    /// capture replaces an earlier one. The model, optimizer, scaler and normaliser of this step must stay the
    /// ones captured while it is replayed (the graph updates the tensors it was captured with).
    pub fn capture_graph(
        &mut self,
        images: &Tensor,
        labels: &Tensor,
        lr: f64,
        needs: LoopNeeds,
    ) -> Result<GraphStatus> {
        if let Some(why) = declined(self, needs) {
            return Ok(GraphStatus::Declined(why));
        }
        let side = SideStream::enter(self.cuda_index()?)?;
        for _ in 0..WARMUP_STEPS {
            self.step_with_hits(images, labels, lr)?;
        }
        drop(side);
        self.capture_now(images, labels, lr)?;
        Ok(GraphStatus::Captured)
    }

    /// Train's step with `--cuda-graph`, where [`declined`] gave no reason: replays the captured graph when it fits
    /// the batch; else a batch of the run's size (`full_batch` images) of a shape not captured yet is one of the
    /// [`WARMUP_STEPS`] eager steps on a side stream that precede a capture, or, after them, is the batch the step
    /// is captured on and then trained on by the graph's first replay (capture records without running). A smaller
    /// batch (unreadable images left out) runs eager. So a new resolution (progressive resizing) warms up and
    /// captures again, and every batch is trained on once, in order, as without the graph.
    pub fn train_step_graphed(
        &mut self,
        images: &Tensor,
        labels: &Tensor,
        lr: f64,
        full_batch: i64,
    ) -> Result<GraphedStep> {
        if let Some(out) = self.replay(images, labels, lr)? {
            return Ok(out);
        }
        if images.size()[0] != full_batch {
            return self.step_with_hits(images, labels, lr);
        }
        let shape = images.size();
        let warm = match &self.graph_warmup {
            Some((s, n)) if *s == shape => *n,
            _ => 0,
        };
        if warm < WARMUP_STEPS {
            self.graph_warmup = Some((shape, warm + 1));
            let _side = SideStream::enter(self.cuda_index()?)?;
            return self.step_with_hits(images, labels, lr);
        }
        self.graph_warmup = None;
        self.capture_now(images, labels, lr)?;
        self.replay(images, labels, lr)?
            .context("the CUDA graph just captured does not fit the batch it was captured on")
    }

    /// The CUDA device this step runs on.
    fn cuda_index(&self) -> Result<usize> {
        match self.device() {
            Device::Cuda(index) => Ok(index),
            d => bail!(
                "a CUDA graph needs a CUDA device, not {d:?}: declined() lets only CUDA through"
            ),
        }
    }

    /// An eager step on a uint8 batch, as the graph captures it: normalised, forward, backward, the update at this
    /// step's rate with the configured momentum; with its top-1 hits.
    fn step_with_hits<'a>(
        &mut self,
        images: &Tensor,
        labels: &Tensor,
        lr: impl Into<Rate<'a>>,
    ) -> Result<GraphedStep> {
        Ok(self.step_and_input(images, labels, lr)?.1)
    }

    /// [`TrainStep::step_with_hits`], and the normalised input (the normaliser's buffer, which a capture reads
    /// without having allocated it).
    fn step_and_input<'a>(
        &mut self,
        images: &Tensor,
        labels: &Tensor,
        lr: impl Into<Rate<'a>>,
    ) -> Result<(Tensor, GraphedStep)> {
        let x = self.input.normalize(images);
        self.opt.zero_grad();
        let f = self.backward(&x, labels, 0, 1)?;
        let correct1 = correct_top1(&f.logits, labels);
        let skipped = self.apply(lr, self.opt.config.momentum)?;
        let out = GraphedStep {
            outcome: StepOutcome {
                loss: f.loss,
                skipped,
            },
            correct1,
        };
        Ok((x, out))
    }

    /// Captures the step on batches like `images` and `labels` (replacing any graph held), after eager steps have
    /// warmed it up; records it without running it.
    fn capture_now(&mut self, images: &Tensor, labels: &Tensor, lr: f64) -> Result<()> {
        let index = self.cuda_index()?;
        self.graph = None;
        let device = self.device();
        let (static_images, static_labels) = (
            images.to_device(device).copy(),
            labels.to_device(device).copy(),
        );
        let rate = Tensor::full([1], lr, (Kind::Float, device));
        let side = SideStream::enter(index)?;
        let (graph, (x, out)) = CudaGraph::capture(|| {
            self.step_and_input(&static_images, &static_labels, Rate::Device(&rate))
        })?;
        drop(side);
        let mut used: Vec<Tensor> = self.opt.params().map(Tensor::shallow_clone).collect();
        used.extend(self.opt.grads());
        used.extend(self.opt.state().into_iter().map(|(_, t)| t));
        used.extend(self.model.buffers());
        if let Some(s) = &self.scaler {
            used.extend(s.state());
        }
        used.extend(self.input.constants());
        used.push(x);
        self.graph = Some(StepGraph {
            graph,
            images: static_images,
            labels: static_labels,
            lr: rate,
            loss: out.outcome.loss,
            correct1: out.correct1,
            _used: used,
        });
        Ok(())
    }

    /// Whether a captured graph is held ([`TrainStep::capture_graph`]).
    pub fn graph_captured(&self) -> bool {
        self.graph.is_some()
    }

    /// The captured step on this batch at rate `lr`, or `None` where no graph fits the batch. Copies the batch and
    /// the rate into the graph's static inputs and launches it; the outcome's loss, skipped flag and top-1 hits are
    /// copies of its outputs, on the device.
    pub(super) fn replay(
        &mut self,
        images: &Tensor,
        labels: &Tensor,
        lr: f64,
    ) -> Result<Option<GraphedStep>> {
        let Some(g) = self.graph.as_ref().filter(|g| g.fits(images, labels)) else {
            return Ok(None);
        };
        tch::no_grad(|| {
            g.images.shallow_clone().copy_(images);
            g.labels.shallow_clone().copy_(labels);
            let _ = g.lr.shallow_clone().fill_(lr);
        });
        g.graph.replay()?;
        Ok(Some(GraphedStep {
            outcome: StepOutcome {
                loss: g.loss.copy(),
                skipped: match &self.scaler {
                    Some(scaler) => Skipped::from_flag(scaler.found_inf()),
                    None => Skipped::never(),
                },
            },
            correct1: g.correct1.copy(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::step::optim::{AdamConfig, AdamKind, LookaheadConfig};
    use crate::step::tests::small_step;
    use crate::step::Precision;

    /// A small fp32 CPU step, LARS where `lars`.
    fn cpu_step(lars: bool) -> TrainStep {
        let mut step = small_step(Precision::Fp32, false);
        step.opt.config.lars_eta = lars.then_some(0.001);
        step
    }

    /// On the CPU the graph declines, saying why, runs nothing, and the step stays eager.
    #[test]
    fn the_cpu_declines_with_its_reason() {
        let mut step = cpu_step(false);
        let images = Tensor::zeros([2, 32, 32, 3], (Kind::Uint8, Device::Cpu));
        let labels = Tensor::zeros([2], (Kind::Int64, Device::Cpu));
        let before = step.model.parameters()[0].1.copy();
        let status = step
            .capture_graph(&images, &labels, 0.1, LoopNeeds::default())
            .unwrap();
        let GraphStatus::Declined(why) = status else {
            panic!("captured on the CPU");
        };
        assert!(why.contains("the device is the CPU"), "{why}");
        assert!(!step.graph_captured());
        assert_eq!(before, step.model.parameters()[0].1, "no warm-up step ran");
        assert!(step.replay(&images, &labels, 0.1).unwrap().is_none());
        assert!(
            step.train_step_graphed(&images, &labels, 0.1, 2).is_err(),
            "no CUDA, no graph"
        );
    }

    /// What the loop or the optimizer asks for that a graph cannot bake in is named, before the device.
    #[test]
    fn each_reason_is_named() {
        let (plain, lars) = (cpu_step(false), cpu_step(true));
        let mut adam = cpu_step(false);
        adam.opt.config.adam = Some(AdamConfig {
            kind: AdamKind::Radam,
            beta2: 0.99,
            eps: 1e-6,
        });
        let mut lookahead = cpu_step(false);
        lookahead.opt.config.lookahead = Some(LookaheadConfig { k: 6, alpha: 0.5 });
        let none = LoopNeeds::default();
        let accum = LoopNeeds {
            micro_batches: 2,
            ..none
        };
        let cycle = LoopNeeds {
            momentum_schedule: true,
            ..none
        };
        let one_micro_batch = LoopNeeds {
            micro_batches: 1,
            ..none
        };
        let mixes = LoopNeeds {
            mixes: true,
            ..none
        };
        let erases = LoopNeeds {
            erases: true,
            ..none
        };
        for (step, needs, want) in [
            (&plain, mixes, "Mixup/CutMix"),
            (&plain, erases, "random erasing"),
            (&plain, none, "the device is the CPU"),
            (&plain, one_micro_batch, "the device is the CPU"),
            (&plain, accum, "gradient accumulation"),
            (&plain, cycle, "one-cycle"),
            (&lars, none, "LARS"),
            (&adam, none, "--optimizer adamw/radam"),
            (&lookahead, none, "--lookahead"),
        ] {
            let why = declined(step, needs).expect("a CPU step is always declined");
            assert!(why.contains(want), "{needs:?}: {why}");
        }
    }
}
