//! One handle for the training loop that works the same in a single process and in a distributed job, so that
//! the loop has no `if distributed` branches: metrics reductions are no-ops, backward is plain, in a single process.
use crate::ddp::{DdpOptions, DistributedDataParallel, StepComm};
use crate::env::WorldInfo;
use crate::error::CommError;
use crate::group::{Backend, ProcessGroup, ReduceOp};
use std::time::Instant;
use tch::{Device, Tensor};

/// This process's place in the job and, when there is more than one process, the process group.
pub struct DistContext {
    pub world: WorldInfo,
    group: Option<ProcessGroup>,
}

impl DistContext {
    /// Reads the launcher's environment ([`WorldInfo::from_env`]) and, for a world of more than one process, joins
    /// the process group: NCCL for a CUDA `device` when built with the `cuda` feature, else Gloo; timeout and
    /// heartbeat from RN50_DIST_TIMEOUT / RN50_DIST_HEARTBEAT.
    pub fn init(device: Device) -> anyhow::Result<DistContext> {
        let world = WorldInfo::from_env()?;
        DistContext::init_with(world, device)
    }

    /// As [`DistContext::init`] for a given world.
    pub fn init_with(world: WorldInfo, device: Device) -> anyhow::Result<DistContext> {
        let group = if world.is_distributed() {
            let mut opts = crate::init_options_from_env(Backend::for_device(device))?;
            // NCCL's communicator lives on the GPU this process computes on (not necessarily LOCAL_RANK's: with
            // one visible GPU per task it is cuda:0 on every rank).
            if let Device::Cuda(i) = device {
                opts.device_index = Some(i);
            }
            Some(ProcessGroup::init(&world, &opts)?)
        } else {
            None
        };
        Ok(DistContext { world, group })
    }

    /// A single process.
    pub fn single() -> DistContext {
        DistContext {
            world: WorldInfo::single(),
            group: None,
        }
    }

    pub fn group(&self) -> Option<&ProcessGroup> {
        self.group.as_ref()
    }

    pub fn rank(&self) -> usize {
        self.world.rank
    }

    pub fn world_size(&self) -> usize {
        self.world.world_size
    }

    /// Only rank 0 logs, writes checkpoints and reports.
    pub fn is_main(&self) -> bool {
        self.world.is_main()
    }

    /// Gradient synchronisation for these parameters: DDP in a distributed job (broadcasting rank 0's parameters
    /// and buffers now), plain backward otherwise.
    pub fn gradient_sync(
        &self,
        params: &[Tensor],
        buffers: &[Tensor],
        opts: &DdpOptions,
    ) -> Result<GradSync, CommError> {
        Ok(match &self.group {
            Some(g) => GradSync::Ddp(DistributedDataParallel::new(g, params, buffers, opts)?),
            None => GradSync::Local,
        })
    }

    /// Fails unless every rank runs with the same `config`, apart from the `skip` paths (see
    /// [`ProcessGroup::check_same_config`]); nothing to compare in a single process.
    pub fn check_same_config(
        &self,
        config: &serde_json::Value,
        skip: &[&str],
    ) -> Result<(), CommError> {
        match &self.group {
            Some(g) => g.check_same_config(config, skip),
            None => Ok(()),
        }
    }

    /// Element-wise sum over ranks (metrics, eval counts); unchanged in a single process.
    pub fn sum_f64(&self, values: &mut [f64], what: &str) -> Result<(), CommError> {
        match &self.group {
            Some(g) => g.allreduce_f64(values, ReduceOp::Sum, what),
            None => Ok(()),
        }
    }

    /// Element-wise max over ranks.
    pub fn max_f64(&self, values: &mut [f64], what: &str) -> Result<(), CommError> {
        match &self.group {
            Some(g) => g.allreduce_f64(values, ReduceOp::Max, what),
            None => Ok(()),
        }
    }

    /// Element-wise sums over ranks, an error when a rank is in another collective (see
    /// [`ProcessGroup::sum_in_step`]).
    pub fn sum_in_step(&self, values: &mut [f64], what: &str) -> Result<(), CommError> {
        match &self.group {
            Some(g) => g.sum_in_step(values, what),
            None => Ok(()),
        }
    }

    /// Whether `flag` is set on any rank (e.g. a stop request that reached only some ranks).
    pub fn any_rank(&self, flag: bool, what: &str) -> Result<bool, CommError> {
        match &self.group {
            Some(g) => g.any_rank(flag, what),
            None => Ok(flag),
        }
    }

    pub fn barrier(&self, what: &str) -> Result<(), CommError> {
        match &self.group {
            Some(g) => g.barrier(what),
            None => Ok(()),
        }
    }

    /// Clean end: a barrier, so that rank 0 (which serves the store) leaves last. Drop the GradSync first.
    pub fn finish(self) -> Result<(), CommError> {
        match self.group {
            Some(g) => g.finish(),
            None => Ok(()),
        }
    }
}

/// Backward with the gradients averaged over all ranks (DDP) or, in a single process, plain backward.
pub enum GradSync {
    Local,
    Ddp(DistributedDataParallel),
}

impl GradSync {
    /// `loss.backward()`; with DDP the `.grad` of every parameter then holds the mean over ranks.
    pub fn backward(&mut self, loss: &Tensor) -> anyhow::Result<StepComm> {
        match self {
            GradSync::Ddp(d) => Ok(d.backward(loss)?),
            GradSync::Local => local_backward(loss),
        }
    }

    /// Backward without synchronisation (gradient accumulation micro-steps; the next `backward` averages).
    pub fn backward_no_sync(&mut self, loss: &Tensor) -> anyhow::Result<StepComm> {
        match self {
            GradSync::Ddp(d) => Ok(d.backward_no_sync(loss)?),
            GradSync::Local => local_backward(loss),
        }
    }

    /// Copies rank 0's buffers (BN running statistics) to every rank; nothing to do in a single process.
    pub fn sync_buffers(&self) -> Result<(), CommError> {
        match self {
            GradSync::Ddp(d) => d.sync_buffers(),
            GradSync::Local => Ok(()),
        }
    }
}

fn local_backward(loss: &Tensor) -> anyhow::Result<StepComm> {
    let t0 = Instant::now();
    loss.f_backward()?;
    Ok(StepComm {
        backward_ms: t0.elapsed().as_secs_f64() * 1e3,
        ..StepComm::default()
    })
}
