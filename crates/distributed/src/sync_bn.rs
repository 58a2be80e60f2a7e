//! SyncBatchNorm (PyTorch's `torch.nn.SyncBatchNorm`, torchvision's and timm's `--sync-bn`): in training, batch
//! norm normalises each rank's batch with the mean and variance of every rank's batch together, so that small
//! per-GPU batches get the statistics of the global batch.
//!
//! Forward all-gathers each rank's per-channel statistics (mean, sum of squared deviations, count) and merges them
//! with Chan's parallel formula (what `torch.batch_norm_gather_stats_with_counts` computes); the running statistics
//! get the global mean and unbiased variance; the local batch is normalised with the global statistics. All of it
//! is tensor arithmetic over the shim's differentiable all-gather ([`ProcessGroup::allgather_autograd`]), so
//! autograd derives the backward: the gradient of batch norm over the global batch, whose per-channel sums reach
//! every rank through the all-gather's backward (an all-reduce). Statistics and normalisation are computed in fp32
//! whatever the activations' type (as cuDNN's batch norm does under autocast). 2 ranks × B give the batch-norm
//! outputs and gradients of 1 rank × 2B.
use tch::{Kind, Tensor};

use crate::error::CommError;
use crate::group::ProcessGroup;

/// The per-channel parameters and running statistics of one batch-norm layer.
pub struct BatchNormState<'a> {
    pub weight: &'a Tensor,
    pub bias: &'a Tensor,
    pub running_mean: &'a Tensor,
    pub running_var: &'a Tensor,
    pub momentum: f64,
    pub eps: f64,
}

impl ProcessGroup {
    /// Batch norm of `x` (N×C×…, any memory format) in training mode over every rank's batch: the output keeps
    /// `x`'s dtype, the running statistics are updated in place with the global mean and unbiased variance (as
    /// every rank does, so they stay equal), and backward gives `x` the gradient of the global batch norm. The
    /// weight and bias gradients are this rank's part (DDP's all-reduce averages them). Every rank must call it
    /// for the same layers in the same order; a rank's batch may be empty.
    pub fn sync_batch_norm(&self, x: &Tensor, bn: &BatchNormState) -> Result<Tensor, CommError> {
        batch_norm_over(x, bn, |local| {
            self.allgather_autograd(local, "batch statistics (SyncBatchNorm)")
        })
    }
}

/// Batch norm of `x` in training mode with the statistics of the batches `gather` brings together: it gets this
/// batch's [`local_stats`] and returns every batch's, stacked ([batches, 2C + 1]), this one's included.
fn batch_norm_over<E>(
    x: &Tensor,
    bn: &BatchNormState,
    gather: impl FnOnce(&Tensor) -> Result<Tensor, E>,
) -> Result<Tensor, E> {
    let xf = x.to_kind(Kind::Float);
    let (mean, m2, count) = merge(&gather(&local_stats(&xf))?);
    let invstd = (&m2 / &count + bn.eps).rsqrt();
    tch::no_grad(|| {
        let update = |running: &Tensor, batch: Tensor| {
            let new = running * (1.0 - bn.momentum) + batch.to_kind(running.kind()) * bn.momentum;
            running.shallow_clone().copy_(&new);
        };
        update(bn.running_mean, mean.detach());
        update(bn.running_var, (&m2 / (&count - 1.0)).detach());
    });
    let scale = bn.weight.to_kind(Kind::Float) * &invstd;
    let shift = bn.bias.to_kind(Kind::Float) - &mean * &scale;
    Ok((xf * per_channel(&scale, x) + per_channel(&shift, x)).to_kind(x.kind()))
}

/// Every dimension but the channels' (N, H, W, … of an N×C×… tensor): what per-channel statistics reduce.
fn reduce_dims(x: &Tensor) -> Vec<i64> {
    (0..x.dim() as i64).filter(|&d| d != 1).collect()
}

/// A per-channel [C] tensor shaped to broadcast against `x` ([1, C, 1, 1]).
fn per_channel(v: &Tensor, x: &Tensor) -> Tensor {
    let mut shape = vec![1; x.dim()];
    shape[1] = x.size()[1];
    v.view(shape.as_slice())
}

/// The per-channel statistics of a batch (fp32, N×C×…) as one [2C + 1] tensor: the mean, the sum of squared
/// deviations from it, and the count of values per channel. An empty batch counts 0; its zeros still depend on
/// `xf`, so that its rank takes part in the all-gather's backward like the others.
fn local_stats(xf: &Tensor) -> Tensor {
    let c = xf.size()[1];
    let n = if c > 0 { xf.numel() as i64 / c } else { 0 };
    let dims = reduce_dims(xf);
    let (mean, m2) = if n > 0 {
        let (var, mean) = xf.var_mean_correction(dims.as_slice(), 0, false);
        (mean, var * n as f64)
    } else {
        let zeros = xf.sum_dim_intlist(dims.as_slice(), false, None);
        (zeros.shallow_clone(), zeros)
    };
    let count = Tensor::full([1], n as f64, (Kind::Float, xf.device()));
    Tensor::cat(&[mean, m2, count], 0)
}

/// The statistics of the batches together, from each one's [`local_stats`] stacked ([batches, 2C + 1]), by Chan's
/// parallel formula: per-channel mean and sum of squared deviations, and the count of values per channel.
fn merge(all: &Tensor) -> (Tensor, Tensor, Tensor) {
    let c = (all.size()[1] - 1) / 2;
    let (means, m2s, counts) = (
        all.narrow(1, 0, c),
        all.narrow(1, c, c),
        all.narrow(1, 2 * c, 1),
    );
    let count = counts.sum(Kind::Float);
    let mean = (&means * &counts).sum_dim_intlist(0, false, None) / &count;
    let m2 = (m2s + &counts * (&means - &mean).square()).sum_dim_intlist(0, false, None);
    (mean, m2, count)
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use tch::Device;

    use super::*;

    const MOMENTUM: f64 = 0.1;
    const EPS: f64 = 1e-5;

    fn leaf(t: &Tensor) -> Tensor {
        t.detach().copy().set_requires_grad(true)
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
        (a - b).abs().max().double_value(&[])
    }

    /// Running mean and variance before the step.
    fn running(c: i64) -> (Tensor, Tensor) {
        let opts = (Kind::Float, Device::Cpu);
        (Tensor::full([c], 0.2, opts), Tensor::full([c], 1.5, opts))
    }

    /// The batch and parameters of a layer of 3 channels (x NCHW or channels_last), and a gradient for its output.
    fn layer(n: i64, channels_last: bool) -> (Tensor, Tensor, Tensor, Tensor) {
        tch::manual_seed(0);
        let opts = (Kind::Float, Device::Cpu);
        let mut x = Tensor::randn([n, 3, 5, 7], opts) * 2.0 + 0.5;
        if channels_last {
            // NHWC memory, NCHW shape (torch.channels_last).
            x = x.permute([0, 2, 3, 1]).contiguous().permute([0, 3, 1, 2]);
        }
        let dy = Tensor::randn([n, 3, 5, 7], opts);
        let weight = Tensor::rand([3], opts) + 0.5;
        let bias = Tensor::randn([3], opts);
        (x, dy, weight, bias)
    }

    /// libtorch's own batch norm in training mode over `x`: output, input/weight/bias gradients for `dy`, and the
    /// running statistics after the step.
    fn reference(x: &Tensor, dy: &Tensor, weight: &Tensor, bias: &Tensor) -> [Tensor; 6] {
        let (x, w, b) = (leaf(x), leaf(weight), leaf(bias));
        let (rm, rv) = running(x.size()[1]);
        let y = Tensor::batch_norm(
            &x,
            Some(&w),
            Some(&b),
            Some(&rm),
            Some(&rv),
            true,
            MOMENTUM,
            EPS,
            false,
        );
        (&y * dy).sum(Kind::Float).backward();
        [y.detach(), x.grad(), w.grad(), b.grad(), rm, rv]
    }

    fn assert_close(what: &str, got: &[Tensor; 6], want: &[Tensor; 6]) {
        let names = [
            "output",
            "input gradient",
            "weight gradient",
            "bias gradient",
            "running mean",
            "running var",
        ];
        for ((name, g), w) in names.iter().zip(got).zip(want) {
            let d = max_diff(g, w);
            // fp32 rounding of values of order 1-10 summed over a few hundred elements.
            assert!(
                d < 1e-4,
                "{what}: {name} differs from batch norm's by {d:e}"
            );
        }
    }

    #[test]
    fn one_batch_gives_batch_norm() {
        for channels_last in [false, true] {
            let (x, dy, weight, bias) = layer(4, channels_last);
            let want = reference(&x, &dy, &weight, &bias);
            let (x, w, b) = (leaf(&x), leaf(&weight), leaf(&bias));
            let (rm, rv) = running(3);
            let bn = BatchNormState {
                weight: &w,
                bias: &b,
                running_mean: &rm,
                running_var: &rv,
                momentum: MOMENTUM,
                eps: EPS,
            };
            let y =
                batch_norm_over(&x, &bn, |local| Ok::<_, Infallible>(local.unsqueeze(0))).unwrap();
            if channels_last {
                assert_eq!(
                    y.stride()[1],
                    1,
                    "the output is not channels_last like the input"
                );
            }
            (&y * &dy).sum(Kind::Float).backward();
            assert_close(
                &format!("channels_last {channels_last}"),
                &[y.detach(), x.grad(), w.grad(), b.grad(), rm, rv],
                &want,
            );
        }
    }

    /// Three ranks simulated in one process, with 2, 0 and 3 images of one batch: each normalises its part with
    /// the statistics of all three parts (the all-gather: every part's statistics, stacked, with autograd's
    /// gradient reaching each part from every rank's use of it, as the all-gather's backward sums them). Together
    /// they give batch norm over the whole batch: outputs, input gradients, the weight and bias gradients summed
    /// over the ranks, and each rank's running statistics.
    #[test]
    fn batches_merged_give_the_batch_norm_of_the_whole() {
        let (x, dy, weight, bias) = layer(5, false);
        let want = reference(&x, &dy, &weight, &bias);
        let (x, w, b) = (leaf(&x), leaf(&weight), leaf(&bias));
        let rows = [(0, 2), (2, 0), (2, 3)];
        let parts: Vec<Tensor> = rows
            .iter()
            .map(|&(start, n)| x.narrow(0, start, n))
            .collect();
        let mut outputs = vec![];
        let mut stats = vec![];
        for (rank, part) in parts.iter().enumerate() {
            let (rm, rv) = running(3);
            let bn = BatchNormState {
                weight: &w,
                bias: &b,
                running_mean: &rm,
                running_var: &rv,
                momentum: MOMENTUM,
                eps: EPS,
            };
            let y = batch_norm_over(part, &bn, |local| {
                let all: Vec<Tensor> = parts
                    .iter()
                    .enumerate()
                    .map(|(q, p)| match q == rank {
                        true => local.shallow_clone(),
                        false => local_stats(&p.to_kind(Kind::Float)),
                    })
                    .collect();
                Ok::<_, Infallible>(Tensor::stack(&all, 0))
            })
            .unwrap();
            outputs.push(y);
            stats.push((rm, rv));
        }
        let y = Tensor::cat(&outputs, 0);
        (&y * &dy).sum(Kind::Float).backward();
        for (rank, (rm, rv)) in stats.into_iter().enumerate() {
            let got = [y.detach(), x.grad(), w.grad(), b.grad(), rm, rv];
            assert_close(&format!("rank {rank}"), &got, &want);
        }
    }
}
