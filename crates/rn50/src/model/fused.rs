//! BatchNorm (+ residual add) + ReLU as one fused cuDNN op in training on CUDA (`shim/fused_bn.cpp`): a
//! process-wide switch, like `torch.backends.cudnn.benchmark`, that [`crate::device::setup`] turns on for GPUs
//! unless `--no-fused-bn` says otherwise. Where the fused op does not apply (CPU, fp32, NCHW, evaluation) the
//! network runs PyTorch's separate batch norm, add and ReLU, as it always does with the switch off.
//!
//! A second switch folds bn1 and bn2 of each bottleneck into its convolutions (`shim/fused_block.cpp`: statistics
//! in the convolution's epilogue, normalisation and ReLU in the next one's prologue, as NVIDIA's MLPerf ResNet-50
//! runs); the block's tail stays the fused batch norm + add + ReLU.
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

/// A bottleneck's body in training, `conv3(relu(bn2(conv2(relu(bn1(conv1(x)))))))`, as one autograd function of
/// cuDNN graphs ([`shim::bottleneck`]), or `None` where that is off or does not apply (CPU, fp32, NCHW, a cuDNN
/// that lacks one of the graphs for this shape: said once in the log).
pub fn bottleneck(
    x: &Tensor,
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
    let fused = shim::bottleneck(x, params, buffers, stride, momentum, eps, true);
    for line in shim::block_report() {
        tracing::warn!("fused bottleneck: {line}");
    }
    match fused {
        Ok(Fused::Done(y)) => Some(y),
        Ok(Fused::NotApplicable(_)) => None,
        Err(e) => panic!("{e:#}"),
    }
}
