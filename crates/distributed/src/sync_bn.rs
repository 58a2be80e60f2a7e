//! SyncBatchNorm (PyTorch's `torch.nn.SyncBatchNorm`, torchvision's and timm's `--sync-bn`): in training, batch
//! norm normalises each rank's batch with the mean and variance of every rank's batch together, so that small
//! per-GPU batches get the statistics of the global batch. Forward all-gathers each rank's per-channel statistics,
//! backward all-reduces two per-channel sums; both are recorded for autograd in the shim
//! (`shim/c10d.cpp`, `SyncBatchNormFn`). 2 ranks × B give the batch-norm outputs and gradients of 1 rank × 2B.
use crate::error::CommError;
use crate::ffi;
use crate::group::ProcessGroup;
use tch::Tensor;

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
        let mut out = std::ptr::null_mut();
        // SAFETY: live group and tensor handles; on success the shim stores a new heap tensor in `out`.
        ffi::check(unsafe {
            ffi::rn50d_sync_batch_norm(
                self.inner.raw(),
                ffi::handle(x),
                ffi::handle(bn.weight),
                ffi::handle(bn.bias),
                ffi::handle(bn.running_mean),
                ffi::handle(bn.running_var),
                bn.momentum,
                bn.eps,
                &mut out,
            )
        })
        .map_err(|e| {
            self.inner
                .fail("SyncBatchNorm (all-gather of batch statistics)", e)
        })?;
        // SAFETY: on success `out` is a new heap tensor, owned from here on by the returned Tensor.
        Ok(unsafe { Tensor::from_ptr(out) })
    }
}
