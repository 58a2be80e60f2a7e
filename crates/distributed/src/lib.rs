//! Data-parallel training for rn50 on PyTorch's own distributed engine (c10d), never a hand-rolled collective:
//!
//! - [`env`]: rank, world size, local rank and rendezvous address from torchrun/`rn50 launch`, SLURM, Open MPI,
//!   PMI (MPICH, Intel MPI, Cray PALS under PBS) or a single process;
//! - [`group`]: TCPStore rendezvous and the c10d process group (Gloo for CPU tensors, NCCL for CUDA tensors with
//!   the `cuda` feature), collectives whose errors name the rank, the operation and the rank that died;
//! - [`ddp`]: DistributedDataParallel on c10d's Reducer: start-of-training broadcast, bucketed gradient averaging
//!   overlapped with backward, rank 0's buffers broadcast after each step;
//! - [`sync_bn`]: SyncBatchNorm, batch statistics over all ranks;
//! - [`context`]: [`DistContext`] and [`GradSync`], the same calls for a single process and a distributed job;
//! - [`settings`]: the ranks' configurations compared at start-up;
//! - [`launch`]: `rn50 launch`, the torchrun equivalent.
//!
//! See docs/distributed.md for usage.
pub mod context;
pub mod ddp;
pub mod env;
pub mod error;
mod ffi;
pub mod group;
mod health;
pub mod launch;
pub mod nodelist;
pub mod settings;
pub mod store;
pub mod sync_bn;

pub use context::{DistContext, GradSync};
pub use ddp::{DdpOptions, DistributedDataParallel, StepComm};
pub use env::{LaunchSource, WorldInfo};
pub use error::CommError;
pub use group::{Backend, InitOptions, ProcessGroup, ReduceOp, Work};
pub use store::{Store, StoreError};
pub use sync_bn::BatchNormState;

/// Whether this build has ProcessGroupNCCL (the `cuda` feature).
pub fn nccl_available() -> bool {
    ffi::cuda_compiled()
}

/// InitOptions for `backend`, with the timeout from RN50_DIST_TIMEOUT (seconds; set by `rn50 launch --timeout`)
/// and the heartbeat interval from RN50_DIST_HEARTBEAT (seconds) when present.
pub fn init_options_from_env(backend: Backend) -> InitOptions {
    let secs = |k: &str| {
        std::env::var(k)
            .ok()
            .and_then(|s| s.trim().parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s > 0.0)
            .map(std::time::Duration::from_secs_f64)
    };
    let mut o = InitOptions {
        backend,
        ..InitOptions::default()
    };
    if let Some(t) = secs("RN50_DIST_TIMEOUT") {
        o.timeout = t;
    }
    if let Some(t) = secs("RN50_DIST_HEARTBEAT") {
        o.heartbeat_interval = t;
    }
    o
}
