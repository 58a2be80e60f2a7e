//! The training step as one CUDA graph (issue 47): a whole step on a uint8 batch (gradients zeroed in place, the
//! normalisation, forward under autocast, the loss scaled, backward, the gradients unscaled, the fused SGD reading
//! this step's rate and the overflow flag on the device, the loss-scale update) captured once into a CUDA graph
//! over static image, label and rate tensors, then replayed: each step copies its batch into the static buffers,
//! sets the rate tensor and launches the graph, one launch for the thousands of kernels of a step, and the host
//! never waits for the GPU. The loss and the skipped flag are read from the graph's outputs only when asked.
//!
//! Capture follows `torch.cuda.graph`'s recipe: [`WARMUP_STEPS`] eager steps on a side stream (cuDNN's autotuning,
//! the gradients allocated, every lazily made handle and plan made), a device-wide synchronize, then the capture on
//! that side stream (`crates/shim/cpp/graph.cpp`). The warm-up steps are real steps on the batch given.
//!
//! The graph bakes in the batch's shape and type and every number of the step but the rate: the momentum (the
//! configuration's), weight decay, Nesterov, label smoothing, precision. A batch of another shape runs the eager step
//! (one graph per shape is left to progressive resizing's turn). [`declined`] says where a graph cannot apply at
//! all: the CPU, a build without CUDA, gradients averaged across ranks (DDP's all-reduce runs from the Reducer's
//! hooks, outside the graph), `--sync-bn` (its all-reduce inside batch norm), LARS (its update takes the rate as a
//! number), and, from the loop, gradient accumulation and a momentum that changes per step (one cycle). NCHW
//! (`--no-channels-last`) changes nothing here: its kernels are captured as the NHWC ones.
use anyhow::{bail, Result};
use tch::{Device, Kind, Tensor};

use super::optim::Rate;
use super::{Skipped, StepOutcome, TrainStep};
use crate::shim::{self, CudaGraph, SideStream};

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
}

/// Whether [`TrainStep::capture_graph`] captured the step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GraphStatus {
    /// Captured: [`TrainStep::step_u8`] replays it for batches of the captured shape.
    Captured,
    /// Not captured, and why: the eager step runs.
    Declined(String),
}

/// A captured step and the tensors its kernels read and write.
pub(super) struct StepGraph {
    graph: CudaGraph,
    /// The static inputs: each step's batch and rate are copied in before a replay.
    images: Tensor,
    labels: Tensor,
    lr: Tensor,
    /// The captured step's loss, rewritten by each replay.
    loss: Tensor,
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
    } else if step.opt.config.lars_eta.is_some() {
        "LARS: its update takes the learning rate as a number, not from the device"
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
        let Device::Cuda(index) = self.device() else {
            bail!("capture_graph: declined() lets only CUDA devices through");
        };
        self.graph = None;
        let device = self.device();
        let (static_images, static_labels) = (
            images.to_device(device).copy(),
            labels.to_device(device).copy(),
        );
        let rate = Tensor::full([1], lr, (Kind::Float, device));
        let side = SideStream::enter(index)?;
        for _ in 0..WARMUP_STEPS {
            let x = self.input.normalize(&static_images);
            self.step(&x, &static_labels, Rate::Device(&rate))?;
        }
        let (graph, (x, loss)) = CudaGraph::capture(|| {
            let x = self.input.normalize(&static_images);
            let out = self.step(&x, &static_labels, Rate::Device(&rate))?;
            Ok((x, out.loss))
        })?;
        drop(side);
        let mut used: Vec<Tensor> = self.opt.params().map(Tensor::shallow_clone).collect();
        used.extend(self.opt.grads());
        for g in &self.opt.groups {
            used.extend(g.momentum_buffers.iter().map(Tensor::shallow_clone));
        }
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
            loss,
            _used: used,
        });
        Ok(GraphStatus::Captured)
    }

    /// Whether a captured graph is held ([`TrainStep::capture_graph`]).
    pub fn graph_captured(&self) -> bool {
        self.graph.is_some()
    }

    /// The captured step on this batch at rate `lr`, or `None` where no graph fits the batch. Copies the batch and
    /// the rate into the graph's static inputs and launches it; the outcome's loss and skipped flag are copies of
    /// its outputs, on the device.
    pub(super) fn replay(
        &mut self,
        images: &Tensor,
        labels: &Tensor,
        lr: f64,
    ) -> Result<Option<StepOutcome>> {
        let Some(g) = self.graph.as_ref().filter(|g| g.fits(images, labels)) else {
            return Ok(None);
        };
        tch::no_grad(|| {
            g.images.shallow_clone().copy_(images);
            g.labels.shallow_clone().copy_(labels);
            let _ = g.lr.shallow_clone().fill_(lr);
        });
        g.graph.replay()?;
        Ok(Some(StepOutcome {
            loss: g.loss.copy(),
            skipped: match &self.scaler {
                Some(scaler) => Skipped::from_flag(scaler.found_inf()),
                None => Skipped::never(),
            },
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
    }

    /// What the loop or the optimizer asks for that a graph cannot bake in is named, before the device.
    #[test]
    fn each_reason_is_named() {
        let (plain, lars) = (cpu_step(false), cpu_step(true));
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
        for (step, needs, want) in [
            (&plain, none, "the device is the CPU"),
            (&plain, one_micro_batch, "the device is the CPU"),
            (&plain, accum, "gradient accumulation"),
            (&plain, cycle, "one-cycle"),
            (&lars, none, "LARS"),
        ] {
            let why = declined(step, needs).expect("a CPU step is always declined");
            assert!(why.contains(want), "{needs:?}: {why}");
        }
    }
}
