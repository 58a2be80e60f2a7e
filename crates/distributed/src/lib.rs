//! Data-parallel training for rn50 on PyTorch's own distributed engine (c10d), never a hand-rolled collective:
//!
//! - [`env`]: rank, world size, local rank and rendezvous address from torchrun/`rn50 launch`, SLURM, Open MPI,
//!   PMI (MPICH, Intel MPI, Cray PALS under PBS) or a single process;
//! - [`group`]: TCPStore rendezvous and the c10d process group (Gloo for CPU tensors, NCCL for CUDA tensors with
//!   the `cuda` feature), collectives whose errors name the rank, the operation and the rank that died; its
//!   network-interface checks (a MASTER_ADDR or GLOO_SOCKET_IFNAME that cannot work) are in `netif`;
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
mod netif;
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

/// The ranges of the environment's time settings, in seconds: RN50_DIST_TIMEOUT as `rn50 launch --timeout`
/// (which sets it) but fractions allowed, RN50_DIST_HEARTBEAT up to an hour.
const TIMEOUT_RANGE: (f64, f64) = (0.001, 604_800.0);
const HEARTBEAT_RANGE: (f64, f64) = (0.001, 3_600.0);

/// InitOptions for `backend`, with the timeout from RN50_DIST_TIMEOUT (seconds; set by `rn50 launch --timeout`)
/// and the heartbeat interval from RN50_DIST_HEARTBEAT (seconds) when present. A value that is not a number of
/// seconds in range is a usage error, as a flag's would be (`rn50` exits 2), never ignored.
pub fn init_options_from_env(backend: Backend) -> Result<InitOptions, rn50_args::UsageError> {
    init_options_from(backend, |k| std::env::var(k).ok())
}

fn init_options_from(
    backend: Backend,
    var: impl Fn(&str) -> Option<String>,
) -> Result<InitOptions, rn50_args::UsageError> {
    let secs = |k: &str,
                (lo, hi): (f64, f64)|
     -> Result<Option<std::time::Duration>, rn50_args::UsageError> {
        let Some(v) = var(k) else {
            return Ok(None);
        };
        match v.trim().parse::<f64>() {
            Ok(s) if (lo..=hi).contains(&s) => Ok(Some(std::time::Duration::from_secs_f64(s))),
            _ => Err(rn50_args::UsageError::new(format!(
                "{k}={v}: expected seconds from {lo} to {hi}"
            ))),
        }
    };
    let mut o = InitOptions {
        backend,
        ..InitOptions::default()
    };
    if let Some(t) = secs("RN50_DIST_TIMEOUT", TIMEOUT_RANGE)? {
        o.timeout = t;
    }
    if let Some(t) = secs("RN50_DIST_HEARTBEAT", HEARTBEAT_RANGE)? {
        o.heartbeat_interval = t;
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Out of range, negative, not a number or huge enough to overflow a Duration: an error naming the variable
    /// (1e20 used to panic; -5 and abc were ignored).
    #[test]
    fn time_settings_from_the_environment_have_ranges() {
        let with = |k: &'static str, v: &'static str| {
            init_options_from(Backend::Gloo, move |q| (q == k).then(|| v.to_string()))
        };
        let o = with("RN50_DIST_TIMEOUT", "2.5").unwrap();
        assert_eq!(o.timeout, std::time::Duration::from_millis(2500));
        let o = with("RN50_DIST_HEARTBEAT", "0.25").unwrap();
        assert_eq!(o.heartbeat_interval, std::time::Duration::from_millis(250));
        for k in ["RN50_DIST_TIMEOUT", "RN50_DIST_HEARTBEAT"] {
            for v in ["1e20", "-5", "abc", "0", "NaN", "inf", ""] {
                let e = with(k, v).unwrap_err().to_string();
                assert!(
                    e.starts_with(&format!("{k}={v}: expected seconds from")),
                    "{e}"
                );
            }
        }
        assert!(init_options_from(Backend::Gloo, |_| None).is_ok());
    }
}
