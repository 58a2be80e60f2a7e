//! BatchNorm (+ residual add) + ReLU as one fused cuDNN op in training on CUDA (`crates/shim/cpp/fused_bn.cpp`): a
//! process-wide switch, like `torch.backends.cudnn.benchmark`, that [`crate::device::setup`] turns on for GPUs unless
//! `--no-fused-bn` says otherwise. Where the fused op does not apply (CPU, fp32, NCHW, evaluation) the network runs
//! PyTorch's separate batch norm, add and ReLU, as it always does with the switch off.
//!
//! A second switch folds every batch norm of each bottleneck into its convolutions (`crates/shim/cpp/fused_block.cpp`:
//! statistics in the convolution's epilogue, normalisation and ReLU in the next one's prologue, bn3 and the
//! projection shortcut's batch norm in one pass that adds the branches, as NVIDIA's MLPerf ResNet-50 runs); where
//! cuDNN lacks the tail's graphs, the tail stays the fused batch norm + add + ReLU.
//!
//! A third runs the stem's max-pool through cuDNN (`crates/shim/cpp/pool.cpp`), without the index tensor PyTorch's
//! writes.
use std::sync::atomic::{AtomicBool, Ordering};

use tch::nn::BatchNorm;
use tch::Tensor;

use crate::shim::{self, Fused};

static ENABLED: AtomicBool = AtomicBool::new(false);

pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// `relu(bn(x) + residual)` in training mode through the fused op, or `None` where it is off or does not
/// apply. A cuDNN failure on tensors it accepts is a bug, not a reason to fall back: it panics, as a failing
/// libtorch op does in tch.
pub fn bn_relu(
    x: &Tensor,
    residual: Option<&Tensor>,
    bn: &BatchNorm,
    momentum: f64,
    eps: f64,
) -> Option<Tensor> {
    if !enabled() || !x.device().is_cuda() {
        return None;
    }
    let (Some(weight), Some(bias)) = (bn.ws.as_ref(), bn.bs.as_ref()) else {
        return None;
    };
    let fused = shim::bn_relu(
        x,
        residual,
        weight,
        bias,
        &bn.running_mean,
        &bn.running_var,
        momentum,
        eps,
    );
    match fused {
        Ok(Fused::Done(y)) => Some(y),
        Ok(Fused::NotApplicable(_)) => None,
        Err(e) => panic!("{e:#}"),
    }
}

static BLOCK_ENABLED: AtomicBool = AtomicBool::new(false);

/// Bottleneck bodies with batch norm folded into their convolutions: `--fused-block`, where
/// [`crate::device::setup`] turns the fused batch norm on too.
pub fn set_block_enabled(on: bool) {
    BLOCK_ENABLED.store(on, Ordering::Relaxed);
}

pub fn block_enabled() -> bool {
    BLOCK_ENABLED.load(Ordering::Relaxed)
}

/// A bottleneck in training as one autograd function of cuDNN graphs ([`shim::bottleneck`]): the whole block where
/// `reach` says so, or its body, `conv3(relu(bn2(conv2(relu(bn1(conv1(x)))))))`; `None` where that is off or does not
/// apply (CPU, fp32, NCHW, a cuDNN that lacks one of the graphs for this shape: said once in the log).
pub fn bottleneck(
    x: &Tensor,
    reach: shim::BlockReach,
    params: &[Tensor],
    buffers: &[Tensor],
    stride: i64,
    momentum: f64,
    eps: f64,
) -> Option<Tensor> {
    if !block_enabled()
        || !x.device().is_cuda()
        || !matches!(x.kind(), tch::Kind::Half | tch::Kind::BFloat16)
    {
        return None;
    }
    let fused = shim::bottleneck(x, reach, params, buffers, stride, momentum, eps, true);
    for line in shim::block_report() {
        tracing::warn!("fused bottleneck: {line}");
    }
    match fused {
        Ok(Fused::Done(y)) => Some(y),
        Ok(Fused::NotApplicable(_)) => None,
        Err(e) => panic!("{e:#}"),
    }
}

static POOL_ENABLED: AtomicBool = AtomicBool::new(false);

/// The stem's max-pool through cuDNN's NHWC pooling, which keeps no index tensor: on by default on CUDA
/// ([`crate::device::setup`]), off with `--no-cudnn-pool`.
pub fn set_pool_enabled(on: bool) {
    POOL_ENABLED.store(on, Ordering::Relaxed);
}

pub fn pool_enabled() -> bool {
    POOL_ENABLED.load(Ordering::Relaxed)
}

/// `max_pool2d(x, kernel, stride, padding)` (floor mode, no dilation) through cuDNN ([`shim::max_pool`]), or
/// `None` where that is off or does not apply (CPU, NCHW): the caller then runs PyTorch's.
pub fn max_pool(x: &Tensor, kernel: i64, stride: i64, padding: i64) -> Option<Tensor> {
    if !pool_enabled() || !x.device().is_cuda() {
        return None;
    }
    match shim::max_pool(x, [kernel, kernel], [stride, stride], [padding, padding]) {
        Ok(Fused::Done(y)) => Some(y),
        Ok(Fused::NotApplicable(_)) => None,
        Err(e) => panic!("{e:#}"),
    }
}
