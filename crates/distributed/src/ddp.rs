//! DistributedDataParallel over a list of parameter tensors, on c10d's own `Reducer` (the engine behind Python's
//! DDP): rank 0's parameters and buffers are broadcast at construction; during backward, gradients are averaged
//! over the ranks by bucketed all-reduces that start as soon as a bucket's gradients are ready, overlapping the rest
//! of backward.
use crate::error::CommError;
use crate::ffi;
use crate::group::ProcessGroup;
use std::ffi::c_void;
use std::sync::atomic::Ordering;
use tch::Tensor;

/// DDP settings; the defaults are PyTorch's.
#[derive(Debug, Clone)]
pub struct DdpOptions {
    /// Gradient bucket size (bucket_cap_mb = 25).
    pub bucket_cap_bytes: usize,
    /// Size of the first bucket (the last layers' gradients, ready first), so communication starts early (1 MiB).
    pub first_bucket_cap_bytes: usize,
    /// Allow parameters that get no gradient in some steps (costs a graph traversal per step).
    pub find_unused_parameters: bool,
    /// Message size of the start-of-training broadcast (250 MiB, like DDP's broadcast_bucket_size).
    pub broadcast_buffer_bytes: usize,
}

impl Default for DdpOptions {
    fn default() -> Self {
        DdpOptions {
            bucket_cap_bytes: 25 * 1024 * 1024,
            first_bucket_cap_bytes: 1024 * 1024,
            find_unused_parameters: false,
            broadcast_buffer_bytes: 250 * 1024 * 1024,
        }
    }
}

/// What one backward cost in communication.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepComm {
    /// The whole backward call (computation + the communication not hidden behind it).
    pub backward_ms: f64,
    /// Time between handing the last bucket to the process group and the end of backward: the all-reduce wait
    /// that overlapping did not hide (0 with no_sync).
    pub allreduce_wait_ms: f64,
    /// When the first bucket was handed to the process group, from the start of backward: communication
    /// overlaps backward from there on.
    pub first_bucket_ms: f64,
    /// Buckets all-reduced in this backward.
    pub buckets: usize,
}

/// Gradient averaging with DDP semantics. Per step: forward, then [`DistributedDataParallel::backward`] instead of
/// `loss.backward()`, then the optimizer step; every rank's `.grad` then holds the mean over all ranks.
pub struct DistributedDataParallel {
    raw: *mut c_void,
    group: ProcessGroup,
    buffers: Vec<Tensor>,
    buckets: usize,
    steps: u64,
    broadcast_buffer_bytes: usize,
}

impl DistributedDataParallel {
    /// Checks that every rank has the same parameter shapes, copies rank 0's parameters and buffers (e.g. BN
    /// running statistics) to every rank, and attaches the reducer to the parameters' gradient accumulators.
    /// `params` must be the leaf tensors the optimizer updates (requires_grad), in the same order on every rank.
    pub fn new(
        group: &ProcessGroup,
        params: &[Tensor],
        buffers: &[Tensor],
        opts: &DdpOptions,
    ) -> Result<DistributedDataParallel, CommError> {
        let inner = &group.inner;
        let bad = |detail: String| CommError {
            rank: inner.rank,
            world_size: inner.world,
            op: "DDP set-up".into(),
            detail,
        };
        if params.is_empty() {
            return Err(bad("no parameters to synchronise".into()));
        }
        if let Some(i) = params.iter().position(|p| !p.requires_grad()) {
            return Err(bad(format!("parameter {i} does not require grad")));
        }
        let refs: Vec<&Tensor> = params.iter().collect();
        group.verify_same_shapes(&refs, "parameters (count, shapes, dtypes)")?;
        // The broadcast writes into the parameters' storage, outside autograd (like DDP's _sync_module_states).
        let states: Vec<Tensor> = params.iter().chain(buffers).map(|t| t.detach()).collect();
        let srefs: Vec<&Tensor> = states.iter().collect();
        group.broadcast_coalesced(
            &srefs,
            0,
            opts.broadcast_buffer_bytes,
            "parameters and buffers",
        )?;

        let hs = ffi::handles(&refs);
        let mut raw = std::ptr::null_mut();
        let mut buckets = 0usize;
        let cap = i64::try_from(opts.bucket_cap_bytes).unwrap_or(i64::MAX);
        let first = i64::try_from(opts.first_bucket_cap_bytes).unwrap_or(i64::MAX);
        // SAFETY: live group and parameter handles; the reducer keeps its own references to the tensors.
        ffi::check(unsafe {
            ffi::rn50d_reducer_new(
                inner.raw(),
                hs.as_ptr(),
                hs.len(),
                cap,
                first,
                opts.find_unused_parameters.into(),
                &mut raw,
                &mut buckets,
            )
        })
        .map_err(bad)?;
        Ok(DistributedDataParallel {
            raw,
            group: group.clone(),
            buffers: buffers.iter().map(|b| b.detach()).collect(),
            buckets,
            steps: 0,
            broadcast_buffer_bytes: opts.broadcast_buffer_bytes,
        })
    }

    /// `loss.backward()` with the gradients averaged over all ranks when it returns.
    pub fn backward(&mut self, loss: &Tensor) -> Result<StepComm, CommError> {
        self.run_backward(loss, true)
    }

    /// `loss.backward()` accumulating gradients locally only (DDP's no_sync, for gradient accumulation): the next
    /// [`DistributedDataParallel::backward`] averages the accumulated sums.
    pub fn backward_no_sync(&mut self, loss: &Tensor) -> Result<StepComm, CommError> {
        self.run_backward(loss, false)
    }

    fn run_backward(&mut self, loss: &Tensor, sync: bool) -> Result<StepComm, CommError> {
        let inner = &self.group.inner;
        let step = self.steps;
        if sync {
            // What DDP.forward does first: after the first iteration, rebuild the buckets in the order gradients
            // became ready (a broadcast from rank 0, so every rank agrees).
            let mut rebuilt = 0;
            // SAFETY: live reducer handle.
            ffi::check(unsafe { ffi::rn50d_reducer_prepare_forward(self.raw, &mut rebuilt) })
                .map_err(|e| inner.fail(&format!("DDP bucket rebuild (step {step})"), e))?;
        }
        let (mut bwd, mut wait, mut first, mut buckets) = (0i64, 0i64, 0i64, 0i64);
        // SAFETY: live reducer and loss handles.
        ffi::check(unsafe {
            ffi::rn50d_reducer_backward(
                self.raw,
                ffi::handle(loss),
                sync.into(),
                &mut bwd,
                &mut wait,
                &mut first,
                &mut buckets,
            )
        })
        .map_err(|e| {
            let op = if sync {
                format!("backward with all-reduce of gradients (step {step})")
            } else {
                format!("backward (no_sync, step {step})")
            };
            inner.fail(&op, e)
        })?;
        self.steps += 1;
        Ok(StepComm {
            backward_ms: bwd as f64 / 1e6,
            allreduce_wait_ms: wait as f64 / 1e6,
            first_bucket_ms: first as f64 / 1e6,
            buckets: usize::try_from(buckets).unwrap_or(0),
        })
    }

    /// Copies rank 0's buffers (e.g. BN running statistics) to every rank: DDP's broadcast_buffers (PyTorch's
    /// default), which rn50's training step does after each synchronised backward so that every rank evaluates
    /// and checkpoints the same model.
    pub fn sync_buffers(&self) -> Result<(), CommError> {
        let refs: Vec<&Tensor> = self.buffers.iter().collect();
        self.group
            .broadcast_coalesced(&refs, 0, self.broadcast_buffer_bytes, "buffers")
    }

    /// Number of gradient buckets of the initial assignment.
    pub fn num_buckets(&self) -> usize {
        self.buckets
    }

    pub fn group(&self) -> &ProcessGroup {
        &self.group
    }
}

impl Drop for DistributedDataParallel {
    fn drop(&mut self) {
        if !self.group.inner_broken() {
            // SAFETY: handle from the shim, freed once; removes the autograd hooks.
            unsafe { ffi::rn50d_reducer_free(self.raw) }
        }
    }
}

impl ProcessGroup {
    pub(crate) fn inner_broken(&self) -> bool {
        self.inner.broken.load(Ordering::SeqCst)
    }
}
