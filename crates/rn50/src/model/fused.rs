//! BatchNorm (+ residual add) + ReLU as one fused cuDNN op in training on CUDA (`shim/fused_bn.cpp`): a
//! process-wide switch, like `torch.backends.cudnn.benchmark`, that [`crate::device::setup`] turns on for GPUs
//! unless `--no-fused-bn` says otherwise. Where the fused op does not apply (CPU, fp32, NCHW, evaluation) the
//! network runs PyTorch's separate batch norm, add and ReLU, as it always does with the switch off.
//!
//! A second switch folds each bottleneck's batch norms into its convolutions (`shim/fused_block.cpp`: statistics
//! in the convolution's epilogue, normalisation and ReLU in the next one's prologue, as NVIDIA's MLPerf ResNet-50
//! runs); where it applies it replaces the fused batch norm for the whole block.
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

/// The bottleneck with batch norm folded into its convolutions (`--no-fused-block` turns it off); on where
/// [`crate::device::setup`] turns the fused batch norm on, unless that flag says otherwise.
pub fn set_block_enabled(on: bool) {
    BLOCK_ENABLED.store(on, Ordering::Relaxed);
}

pub fn block_enabled() -> bool {
    BLOCK_ENABLED.load(Ordering::Relaxed)
}

/// A bottleneck in training as one fused autograd function through cuDNN graphs ([`shim::bottleneck`]), or `None`
/// where that is off or does not apply (CPU, fp32, NCHW). A stage cuDNN does not support for its shape runs as
/// ATen ops inside the same function, said once in the log.
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
