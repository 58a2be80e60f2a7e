//! `--sync-bn`: in training, every batch-norm layer normalises with the statistics of all ranks' batches
//! (PyTorch's SyncBatchNorm, on [`ProcessGroup::sync_batch_norm`]) instead of its own rank's. A process-wide
//! switch, like [`super::fused`]: the trainer turns it on with the job's process group once the ranks have joined.
//! Evaluation (running statistics) is unchanged.
//!
//! The model's forward returns tensors, not results, so a failed collective is kept here and reported by
//! [`take_failure`] after the forward (the step turns it into its error); the layers after a failure skip the
//! collective and return zeros, so that one broken peer costs one timeout, not one per layer.
use std::sync::Mutex;

use rn50_distributed::{BatchNormState, CommError, ProcessGroup};
use rn50_util::lock_unpoisoned;
use tch::nn::BatchNorm;
use tch::Tensor;

static GROUP: Mutex<Option<ProcessGroup>> = Mutex::new(None);
static FAILURE: Mutex<Option<CommError>> = Mutex::new(None);

/// Batch norm in training over `group`'s ranks from now on.
pub fn enable(group: &ProcessGroup) {
    *lock_unpoisoned(&GROUP) = Some(group.clone());
}

/// Back to each rank's own statistics (and the process group released).
pub fn disable() {
    *lock_unpoisoned(&GROUP) = None;
}

pub fn enabled() -> bool {
    lock_unpoisoned(&GROUP).is_some()
}

/// The first collective that failed in a forward since the last call, if any.
pub fn take_failure() -> Option<CommError> {
    lock_unpoisoned(&FAILURE).take()
}

/// `bn(x)` in training mode over all ranks, or `None` when the switch is off.
pub(crate) fn batch_norm(x: &Tensor, bn: &BatchNorm, momentum: f64, eps: f64) -> Option<Tensor> {
    let group = lock_unpoisoned(&GROUP).clone()?;
    let (Some(weight), Some(bias)) = (bn.ws.as_ref(), bn.bs.as_ref()) else {
        return None;
    };
    let mut failure = lock_unpoisoned(&FAILURE);
    if failure.is_some() {
        return Some(x.zeros_like());
    }
    let state = BatchNormState {
        weight,
        bias,
        running_mean: &bn.running_mean,
        running_var: &bn.running_var,
        momentum,
        eps,
    };
    Some(match group.sync_batch_norm(x, &state) {
        Ok(y) => y,
        Err(e) => {
            *failure = Some(e);
            x.zeros_like()
        }
    })
}
