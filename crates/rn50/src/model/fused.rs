//! BatchNorm (+ residual add) + ReLU as one fused cuDNN op in training on CUDA (`shim/fused_bn.cpp`): a
//! process-wide switch, like `torch.backends.cudnn.benchmark`, that [`crate::device::setup`] turns on for GPUs
//! unless `--no-fused-bn` says otherwise. Where the fused op does not apply (CPU, fp32, NCHW, evaluation) the
//! network runs PyTorch's separate batch norm, add and ReLU, as it always does with the switch off.
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
