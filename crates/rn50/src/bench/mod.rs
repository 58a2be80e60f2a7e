//! `rn50 bench`: training throughput of a ResNet on synthetic data, the number sites publish (img/s).
//!
//! Data modes (tensorpack's split of input-bound from compute-bound):
//! - `device`: one uint8 batch made on the device once and reused: pure compute;
//! - `host`: a fresh uint8 batch made on the host every step and copied over, as a loader would;
//! - `pipeline`: synthetic JPEGs of ImageNet's size distribution through the real decode/augment loader;
//! - `real`: a dataset on disk (`--data-dir`, ImageFolder or shards) through the loader.
//!
//! Under `rn50 launch` (or any launcher) every rank runs the same bench with DDP; rank 0 reports the total.
//!
//! `--profile` adds a few steps after the measured ones, recorded by libtorch's profiler, and shows where their
//! time goes by kind of work ([`profile`]).
pub mod profile;
pub mod sweep;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use serde::Serialize;
use tch::{Device, Kind, Tensor};

use rn50_args::{check_batch_bytes, usize_in, UsageError, MAX_BATCH, MAX_IMAGE_SIZE, MAX_THREADS};
use rn50_distributed::{DistContext, WorldInfo};
use rn50_pipeline::source::TRAIN_SPLIT;
use rn50_pipeline::synthetic::{self, SyntheticConfig};
use rn50_pipeline::{Dataset, LoaderConfig};

use crate::device::{device_name, synchronize, ComputeArgs, DeviceSettings};
use crate::input::{BatchSource, DeviceBatch};
use crate::machine::{self, MachineInfo};
use crate::model::{Arch, Model, ResNetConfig};
use crate::step::graph::{GraphStatus, LoopNeeds, WARMUP_STEPS};
use crate::step::{OptimizerConfig, Precision, StepConfig, TrainStep};
use crate::train::args::{DEFAULT_LR_BASE, DEFAULT_LR_BASE_SIZE};
use crate::train::schedule::scaled_lr;
pub use rn50_report::schema::{BenchConfig, BenchResult, Machine};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DataMode {
    /// One batch made on the device and reused every step (compute only).
    Device,
    /// A fresh batch made on the host every step and copied to the device.
    Host,
    /// Synthetic JPEGs of ImageNet's sizes decoded and augmented by the real loader every step.
    Pipeline,
    /// A dataset on disk (--data-dir) through the real loader.
    Real,
}

/// Measure training throughput (images/s) on synthetic data.
#[derive(Args, Debug, Clone, Serialize)]
pub struct BenchArgs {
    /// Model architecture: resnet18, resnet34, resnet50, resnet101, resnet152, or the variants as `train -a` names
    /// them (resnet50d, resnetblur50d, resnext50_32x4d, seresnext50d_32x4d, resnet50d_mish).
    #[arg(short = 'a', long = "arch", default_value = "resnet50", value_parser = clap::value_parser!(Arch))]
    pub arch: Arch,
    /// Channels of the first stage (torchvision: 64), as `train --width`: the narrower networks trained on small
    /// data and machines. 1 to 512.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(i64).range(1..=512))]
    pub width: i64,
    /// Batch size per device, 1 to 65536; batch x image size² x 3 bytes at most 16 GiB [default: 32 on CPU,
    /// 256 on GPU].
    #[arg(short = 'b', long = "batch-size", value_parser = usize_in(1..=MAX_BATCH))]
    pub batch_size: Option<usize>,
    #[command(flatten)]
    #[serde(flatten)]
    pub compute: ComputeArgs,
    /// Steps run before measuring (allocator, oneDNN/cuDNN autotuning) [default: 3 on CPU, 20 on GPU].
    #[arg(long)]
    pub warmup: Option<usize>,
    /// Measured steps, at least 1 [default: 20 on CPU, 100 on GPU].
    #[arg(long, value_parser = usize_in(1..))]
    pub steps: Option<usize>,
    /// Where the batches come from (see `--help`): device, host, pipeline, real [default: real with
    /// --data-dir, else device].
    #[arg(long = "data", value_enum)]
    pub data: Option<DataMode>,
    /// Dataset for `--data real`: an ImageFolder tree or shards (DATA/train is used if it exists).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Loader threads for the pipeline and real modes, 1 to 1024 [default: the CPUs of this process].
    #[arg(short = 'j', long = "workers", value_parser = usize_in(1..=MAX_THREADS))]
    pub workers: Option<usize>,
    /// Synthetic JPEGs generated (in memory) for `--data pipeline`, 1 to 100000.
    #[arg(long, default_value_t = 512, value_parser = usize_in(1..=rn50_args::MAX_SYNTHETIC_IMAGES))]
    pub synthetic_images: usize,
    /// Measure a grid instead of one point: every world size (ranks started with `rn50 launch`) times every
    /// batch size, each repeated; reports median and spread, and scaling efficiency against 1 rank.
    /// Ctrl-C (or SIGTERM) ends it with the points measured so far (table and --json), exit 3.
    #[arg(long)]
    pub sweep: bool,
    /// World sizes of the sweep (comma-separated), 1 to 65536 each.
    #[arg(long, value_delimiter = ',', default_value = "1,2", value_parser = usize_in(1..=65536))]
    pub world_sizes: Vec<usize>,
    /// Batch sizes per rank of the sweep (comma-separated), as --batch-size [default: the --batch-size].
    #[arg(long, value_delimiter = ',', value_parser = usize_in(1..=MAX_BATCH))]
    pub batch_sizes: Vec<usize>,
    /// Repeats of each sweep point, at least 1.
    #[arg(long, default_value_t = 3, value_parser = usize_in(1..))]
    pub repeats: usize,
    /// How the sweep starts each point's ranks: `rn50 launch` on this node, or `srun`/`mpirun` inside a
    /// SLURM or PBS/UGE allocation (world sizes up to the tasks it has).
    #[arg(long, value_enum, default_value_t = sweep::SweepLauncher::Launch)]
    pub launcher: sweep::SweepLauncher,
    /// Image size (square), 32 to 4096 pixels.
    #[arg(long, default_value_t = 224, value_parser = clap::value_parser!(i64).range(32..=MAX_IMAGE_SIZE as i64))]
    pub image_size: i64,
    /// Random seed for weights and data.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Write the full result as JSON to this file ("-" for stdout).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// After the measured steps, run --profile-steps more under libtorch's profiler and show the time per step
    /// by kind of work: convolution, batch norm, elementwise, optimizer, casts, copies, communication, other
    /// (with the largest "other" ops). On CPU it sums each op's self time; on CUDA the GPU time of the kernels,
    /// each classified by its name or by the op that launched it. The profiled steps run slower and stay out of
    /// the img/s figures. In the JSON under "profile".
    #[arg(long)]
    pub profile: bool,
    /// Steps profiled with --profile, 1 to 1000.
    #[arg(long, default_value_t = 5, value_parser = usize_in(1..=1000))]
    pub profile_steps: usize,
    /// Measure the step captured as one CUDA graph and replayed (after the warm-up, 3 more eager steps on a side
    /// stream, then the capture): static input buffers, the learning rate and the loss-scale logic on the device,
    /// one launch per step. Where it does not apply (CPU, several ranks, a build without CUDA) the steps run eager
    /// and the result says why. Off by default until measured (docs/benchmarks.md).
    #[arg(long)]
    pub cuda_graph: bool,
}

impl BenchArgs {
    /// The network benchmarked: --arch at --width.
    fn network(&self) -> ResNetConfig {
        network(self.arch, self.width)
    }

    /// The rules between flags (each flag's own range is clap's), checked before anything else: a batch of
    /// uint8 pixels must fit [`rn50_args::MAX_BATCH_BYTES`]. The default batches (32, 256) always do.
    pub fn check(&self) -> Result<(), UsageError> {
        let side = self.image_size as u64;
        if let Some(b) = self.batch_size {
            check_batch_bytes("--batch-size", b as u64, "--image-size", side)?;
        }
        for &b in &self.batch_sizes {
            check_batch_bytes("--batch-sizes", b as u64, "--image-size", side)?;
        }
        self.network().check_width().map_err(UsageError)
    }

    /// Fills in the defaults that depend on the device, the CPU and this process's place in a data-parallel
    /// job (one GPU per process; the CPUs split between the processes of a node), and rejects what cannot run.
    pub fn resolve(&self, world: &WorldInfo) -> Result<(BenchConfig, Device)> {
        let compute = self
            .compute
            .resolve(world.local_rank, self.network().narrowest_conv())?;
        let (device, cpu) = (compute.device, &compute.cpu);
        let gpu = device.is_cuda();
        let batch_size = self.batch_size.unwrap_or(if gpu { 256 } else { 32 });
        let per_rank = (cpu.logical_cores / world.local_world_size.max(1)).max(1);
        let steps = self.steps.unwrap_or(if gpu { 100 } else { 20 });
        let data = match (self.data, &self.data_dir) {
            (None, Some(_)) | (Some(DataMode::Real), Some(_)) => DataMode::Real,
            (Some(DataMode::Real), None) => bail!("--data real needs --data-dir DATA"),
            (Some(_), Some(_)) => bail!("--data-dir goes with --data real"),
            (Some(m), None) => m,
            (None, None) => DataMode::Device,
        };
        let settings = DeviceSettings::for_device(device, &compute).for_arch(self.arch);
        let global_batch = batch_size * world.world_size;
        Ok((
            BenchConfig {
                arch: self.arch.to_string(),
                width: Some(self.width as u64),
                batch_size: batch_size as u64,
                image_size: Some(self.image_size as u64),
                precision: Some(compute.precision.to_string()),
                channels_last: Some(compute.channels_last),
                warmup: Some(self.warmup.unwrap_or(if gpu { 20 } else { 3 }) as u64),
                steps: Some(steps as u64),
                threads: Some(self.compute.threads.unwrap_or(per_rank) as u64),
                device: Some(device_name(device)),
                data: Some(data.name().into()),
                data_dir: self.data_dir.clone(),
                workers: Some(self.workers.unwrap_or(per_rank).max(1) as u64),
                synthetic_images: Some(self.synthetic_images.max(1) as u64),
                seed: Some(self.seed),
                tf32: Some(settings.tf32),
                fused_bn: Some(settings.fused_bn),
                fused_block: Some(settings.fused_block),
                fused_block_plans: settings
                    .fused_block
                    .then_some(settings.fused_block_plans as u64),
                cudnn_pool: Some(settings.cudnn_pool),
                // Asked for here; `measure` records whether the graph ran.
                cuda_graph: self.cuda_graph.then_some(true),
                optimizer: Some(OptimizerConfig::default()),
                // train's default rate (--lr-base 0.1 per 256 images) at this global batch.
                lr: Some(scaled_lr(
                    DEFAULT_LR_BASE,
                    global_batch,
                    DEFAULT_LR_BASE_SIZE,
                )),
                world_size: Some(world.world_size as u64),
                global_batch: Some(global_batch as u64),
                profile_steps: self.profile.then_some(self.profile_steps as u64),
            },
            device,
        ))
    }
}

/// `arch` with `width` channels in its first stage.
fn network(arch: Arch, width: i64) -> ResNetConfig {
    let mut net = ResNetConfig::new(arch);
    net.width = width;
    net
}

impl DataMode {
    /// The name `--data` takes and results record.
    pub fn name(self) -> &'static str {
        match self {
            DataMode::Device => "device",
            DataMode::Host => "host",
            DataMode::Pipeline => "pipeline",
            DataMode::Real => "real",
        }
    }
}

/// What [`run`] needs of a resolved [`BenchConfig`], typed (the record keeps names and optional fields so that
/// older results still read).
struct Plan {
    arch: Arch,
    width: i64,
    precision: Precision,
    data: DataMode,
    batch: usize,
    image_size: usize,
    warmup: usize,
    steps: usize,
    profile_steps: usize,
}

impl Plan {
    fn of(cfg: &BenchConfig) -> Result<Plan> {
        let need = |v: Option<u64>, what: &str| {
            v.map(|v| v as usize)
                .with_context(|| format!("the bench configuration has no {what}"))
        };
        let named = |v: &Option<String>, what: &str| {
            v.clone()
                .with_context(|| format!("the bench configuration has no {what}"))
        };
        Ok(Plan {
            arch: cfg.arch.parse()?,
            width: cfg.width.unwrap_or(64) as i64,
            precision: Precision::from_str(&named(&cfg.precision, "precision")?, true)
                .map_err(anyhow::Error::msg)?,
            data: DataMode::from_str(&named(&cfg.data, "data mode")?, true)
                .map_err(anyhow::Error::msg)?,
            batch: cfg.batch_size as usize,
            image_size: need(cfg.image_size, "image size")?,
            warmup: need(cfg.warmup, "warm-up steps")?,
            steps: need(cfg.steps, "steps")?,
            profile_steps: cfg.profile_steps.unwrap_or(0) as usize,
        })
    }
}

/// The batch source of `cfg.data` for this rank.
fn source(
    cfg: &BenchConfig,
    plan: &Plan,
    device: Device,
    dist: &DistContext,
) -> Result<BatchSource> {
    let (b, s) = (plan.batch, plan.image_size);
    let seed = cfg.seed.unwrap_or(0);
    let loader_cfg = || LoaderConfig {
        seed,
        rank: dist.rank(),
        world_size: dist.world_size(),
        ..LoaderConfig::train(b, cfg.workers.unwrap_or(1).max(1) as usize)
    };
    Ok(match plan.data {
        DataMode::Device => BatchSource::device(b, s, device),
        DataMode::Host => BatchSource::host(b, s, device, seed)?,
        DataMode::Pipeline => {
            let synth = SyntheticConfig {
                seed,
                ..SyntheticConfig::new(cfg.synthetic_images.unwrap_or(1).max(1) as usize)
            };
            BatchSource::loader(synthetic::dataset(&synth)?, loader_cfg(), s)?
        }
        DataMode::Real => {
            let root = cfg
                .data_dir
                .as_ref()
                .expect("resolve checks real has a dir");
            // The training split of DATA (train/, or WebDataset shards named for it), else DATA.
            let dataset = Dataset::open_split_or_whole(root, TRAIN_SPLIT)?;
            anyhow::ensure!(
                dataset.classes().len() <= 1000,
                "{} has more than 1000 classes",
                dataset.description()
            );
            BatchSource::loader(dataset, loader_cfg(), s)?
        }
    })
}

/// One step as [`measure`] times it.
struct Timed {
    loss: Tensor,
    /// The wait for the next batch's producer ([`crate::input::DeviceBatch::wait`]).
    wait: std::time::Duration,
    /// From launching the step to the device finishing it and the next batch's copy queued behind it.
    wall: std::time::Duration,
}

/// The step on `batch`; while the device runs it the host takes the next batch and, on a GPU, queues its copy
/// behind the step, as `train` (which never waits for the device) and a DataLoader with `pin_memory` do; then
/// the device is waited for, so each step is timed alone. `batch` becomes the next batch.
///
/// Taking the next batch only after the device is done, as bench used to, adds the host's part of the hand-over
/// (the copy into page-locked memory, 38.5 MB at batch 256) to every step's time: the likely cause of the 19–22%
/// data wait `bench --data-dir` showed on an H100 while `train` on the same data showed none.
fn timed_step(
    step: &mut TrainStep,
    src: &mut BatchSource,
    batch: &mut DeviceBatch,
    device: Device,
    lr: f64,
) -> Result<Timed> {
    let t0 = Instant::now();
    let out = step.step_u8(&batch.images, &batch.labels, lr)?;
    let next = src.next(device)?;
    let wait = next.wait;
    synchronize(device);
    let wall = t0.elapsed();
    src.recycle(std::mem::replace(batch, next));
    Ok(Timed {
        loss: out.loss,
        wait,
        wall,
    })
}

/// `--cuda-graph`: captures the step on `batch` for the measured steps to replay (after [`WARMUP_STEPS`] more
/// eager steps on it), or says why it runs eager; returns that reason.
fn capture(step: &mut TrainStep, batch: &DeviceBatch, lr: f64) -> Result<Option<String>> {
    match step.capture_graph(&batch.images, &batch.labels, lr, LoopNeeds::default())? {
        GraphStatus::Captured => {
            tracing::info!(
                "--cuda-graph: the step captured as one CUDA graph after {WARMUP_STEPS} more eager steps; the \
                 measured steps replay it"
            );
            Ok(None)
        }
        GraphStatus::Declined(why) => {
            tracing::warn!("--cuda-graph: the steps run eager: {why}");
            Ok(Some(why))
        }
    }
}

/// Runs the benchmark described by `cfg` on `device`: this rank's part when `dist` spans several processes.
/// `progress` gets (steps done, steps in all, seconds of the last step), profiled steps included.
pub fn measure(
    cfg: &BenchConfig,
    device: Device,
    dist: &DistContext,
    mut progress: impl FnMut(usize, usize, f64),
) -> Result<BenchResult> {
    let plan = Plan::of(cfg)?;
    if let Some(t) = cfg.threads {
        tch::set_num_threads(t as i32);
    }
    let settings = DeviceSettings::new(
        device,
        cfg.fused_bn.unwrap_or(false),
        cfg.fused_block.unwrap_or(false),
        cfg.cudnn_pool.unwrap_or(false),
    );
    crate::device::setup(
        device,
        DeviceSettings {
            fused_block_plans: cfg
                .fused_block_plans
                .map_or(settings.fused_block_plans, |n| n as usize),
            ..settings
        },
    )?;
    tch::manual_seed(cfg.seed.unwrap_or(0) as i64);
    let model = Model::new(network(plan.arch, plan.width), device);
    let step_cfg = StepConfig {
        precision: plan.precision,
        channels_last: cfg.channels_last.unwrap_or(true),
        label_smoothing: 0.0,
        optimizer: cfg.optimizer.clone().unwrap_or_default(),
    };
    let mut step = TrainStep::new(model, step_cfg);
    step.sync_gradients(dist, &Default::default())?;
    let mut src = source(cfg, &plan, device, dist)?;
    let io = match (&cfg.data_dir, dist.is_main()) {
        (Some(dir), true) => Some(rn50_report::IoMonitor::start(
            dir,
            std::time::Duration::from_secs(1),
        )?),
        _ => None,
    };
    let mut io_start = None;

    let lr = cfg
        .lr
        .context("the bench configuration has no learning rate")?;
    let (warmup, steps) = (plan.warmup, plan.steps);
    let total = warmup + steps;
    let profiled = plan.profile_steps;
    let mut wait_ms = Vec::with_capacity(steps);
    let mut step_ms = Vec::with_capacity(steps);
    let mut comm_ms = Vec::with_capacity(steps);
    let mut last_loss = Tensor::zeros([], (Kind::Float, device));
    let mut batch = src.next(device)?;
    let mut graph_declined = None;
    for i in 0..total {
        if i == warmup {
            if cfg.cuda_graph == Some(true) {
                graph_declined = capture(&mut step, &batch, lr)?;
            }
            io_start = io.as_ref().map(|m| m.snapshot());
        }
        let t = timed_step(&mut step, &mut src, &mut batch, device, lr)?;
        last_loss = t.loss;
        if i >= warmup {
            wait_ms.push(t.wait.as_secs_f64() * 1e3);
            step_ms.push(t.wall.as_secs_f64() * 1e3);
            comm_ms.push(step.comm.allreduce_wait_ms);
        }
        progress(i + 1, total + profiled, t.wall.as_secs_f64());
    }
    let io = io.zip(io_start).map(|(m, s0)| m.snapshot().delta(&s0));
    // Profiled steps, after the measured ones: the profiler slows them down.
    let profile = if profiled > 0 {
        synchronize(device);
        let profiler = profile::Profiler::start(device)?;
        let t0 = Instant::now();
        for i in 0..profiled {
            let t = timed_step(&mut step, &mut src, &mut batch, device, lr)?;
            progress(total + i + 1, total + profiled, t.wall.as_secs_f64());
        }
        let wall_ms = t0.elapsed().as_secs_f64() * 1e3;
        let events = profiler.stop()?;
        Some(profile::summarize(
            &events,
            device.is_cuda(),
            profiled,
            wall_ms,
        ))
    } else {
        None
    };
    let final_loss = f64::try_from(&last_loss).context("reading the loss")?;
    if !final_loss.is_finite() {
        bail!("the loss became {final_loss}: numerics are broken for this configuration");
    }
    let b = plan.batch as f64;
    let ips: Vec<f64> = step_ms.iter().map(|ms| b / (ms / 1e3)).collect();
    let data_wait_ms = rn50_util::stats::mean(&wait_ms);
    let mean_step = rn50_util::stats::mean(&step_ms);
    // The median step's compute, as step_ms is the median step: a mean would take one slow step (a bucket
    // rebuild, a page-cache miss) as the norm, and under a launcher came out at twice the median step.
    let compute: Vec<f64> = step_ms.iter().zip(&wait_ms).map(|(s, w)| s - w).collect();
    let compute_ms = rn50_util::stats::median(&compute);
    // Totals over the ranks (each measured its own steps; they run in lockstep).
    let mut totals = [
        rn50_util::stats::median(&ips),
        rn50_util::stats::quantile(&ips, 0.1),
        rn50_util::stats::quantile(&ips, 0.9),
        b / (compute_ms / 1e3),
        src.bad_images() as f64,
    ];
    dist.sum_f64(&mut totals, "summing bench results")?;
    drop(step.grad_sync.take());
    let config = BenchConfig {
        cuda_graph: step.graph_captured().then_some(true),
        ..cfg.clone()
    };
    Ok(BenchResult {
        images_per_sec: totals[0],
        compute_images_per_sec: Some(totals[3]),
        allreduce_ms: (dist.world_size() > 1).then(|| rn50_util::stats::mean(&comm_ms)),
        bad_images: Some(totals[4] as u64),
        io,
        images_per_sec_p10: Some(totals[1]),
        images_per_sec_p90: Some(totals[2]),
        step_ms: Some(rn50_util::stats::median(&step_ms)),
        data_wait_ms: Some(data_wait_ms),
        compute_ms: Some(compute_ms),
        data_wait_share: Some(data_wait_ms / mean_step),
        peak_rss_bytes: Some(machine::peak_rss_bytes()),
        device_peak_memory_bytes: match device {
            Device::Cuda(i) => crate::shim::cuda_memory(i).map(|(peak, _)| peak.max(0) as u64),
            _ => None,
        },
        final_loss: Some(final_loss),
        step_times_ms: step_ms,
        profile,
        cuda_graph_declined: graph_declined,
        config,
        machine: Some(machine_record(&machine::machine_info())?),
    })
}

/// This machine's facts as the result records them: every field of [`MachineInfo`], the ones readers use typed.
pub fn machine_record(m: &MachineInfo) -> Result<Machine> {
    Ok(serde_json::from_value(serde_json::to_value(m)?)?)
}

fn gib(bytes: f64) -> String {
    format!("{:.2} GiB", bytes / (1u64 << 30) as f64)
}

/// A figure older results may lack: NaN then.
fn n(v: Option<f64>) -> f64 {
    v.unwrap_or(f64::NAN)
}

/// The short human-readable table.
pub fn render(r: &BenchResult) -> String {
    let c = &r.config;
    let mut s = format!(
        "rn50 bench: {} batch {}{} {}px {}{}{}{}{} on {} ({} threads), data={}, {} steps after {} warm-up\n",
        c.network(),
        c.batch_size,
        if c.world_size() > 1 {
            format!(" x {} ranks = {}", c.world_size(), c.global_batch())
        } else {
            String::new()
        },
        c.image_size.unwrap_or(0),
        c.precision.as_deref().unwrap_or("?"),
        if c.channels_last == Some(true) { " channels_last" } else { "" },
        match (c.fused_bn, c.fused_block) {
            (Some(true), Some(true)) => " fused-BN+block",
            (Some(true), _) => " fused-BN",
            _ => "",
        },
        if c.cudnn_pool == Some(true) { " cuDNN-pool" } else { "" },
        if c.cuda_graph == Some(true) { " CUDA-graph" } else { "" },
        c.device.as_deref().unwrap_or("?"),
        c.threads.unwrap_or(0),
        c.data.as_deref().unwrap_or("?"),
        c.steps.unwrap_or(0),
        c.warmup.unwrap_or(0)
    );
    let mut rows = vec![
        ("img/s (median)", format!("{:.2}", r.images_per_sec)),
        (
            "compute-only img/s",
            format!("{:.2}", n(r.compute_images_per_sec)),
        ),
        (
            "img/s p10 / p90",
            format!(
                "{:.2} / {:.2}",
                n(r.images_per_sec_p10),
                n(r.images_per_sec_p90)
            ),
        ),
        ("ms/step (median)", format!("{:.1}", n(r.step_ms))),
        (
            "data wait / compute",
            format!(
                "{:.1} ms / {:.1} ms ({:.1}% waiting)",
                n(r.data_wait_ms),
                n(r.compute_ms),
                100.0 * n(r.data_wait_share)
            ),
        ),
        ("peak RSS", gib(r.peak_rss_bytes.unwrap_or(0) as f64)),
    ];
    if let Some(ms) = r.allreduce_ms {
        rows.push((
            "all-reduce wait/step",
            format!("{ms:.1} ms (not hidden by backward)"),
        ));
    }
    if let Some(why) = &r.cuda_graph_declined {
        rows.push(("CUDA graph", format!("not used, eager: {why}")));
    }
    if let Some(bad) = r.bad_images.filter(|&b| b > 0) {
        rows.push(("bad images skipped", bad.to_string()));
    }
    if let Some(io) = &r.io {
        rows.push(("I/O", io.summary_line()));
    }
    for (k, v) in rows {
        s += &format!("  {k:<22}{v}\n");
    }
    if let Some(m) = r.device_peak_memory_bytes {
        s += &format!("  {:<22}{}\n", "peak device memory", gib(m as f64));
    }
    if let Some(p) = &r.profile {
        s += &profile::render(p);
    }
    s
}

/// `rn50 bench`: resolve, measure with a progress line, print, write JSON (or run the sweep).
pub fn run(args: &BenchArgs) -> Result<()> {
    args.check()?;
    if args.sweep {
        return sweep::run(args);
    }
    let world = WorldInfo::from_env()?;
    let (cfg, device) = args.resolve(&world)?;
    let dist = DistContext::init_with(world, device)?;
    // One measurement, one configuration: only what is resolved per process (device, threads, loader threads) and a
    // node-local data path may differ between the ranks (lr and global batch follow from the batch size).
    dist.check_same_config(
        &serde_json::to_value(&cfg)?,
        &[
            "device",
            "threads",
            "workers",
            "data_dir",
            "lr",
            "global_batch",
        ],
    )?;
    let main = dist.is_main();
    // Drawn on stderr, hidden when it is not a terminal (logs, CI).
    let bar = rn50_util::progress_bar(
        cfg.warmup.unwrap_or(0) + cfg.steps.unwrap_or(0) + cfg.profile_steps.unwrap_or(0),
        "{prefix} [{bar:30}] {pos}/{len} steps {msg} (ETA {eta})",
        main,
    );
    bar.set_prefix(format!("bench {} b{}", cfg.network(), cfg.batch_size));
    let r = measure(&cfg, device, &dist, |i, n, secs| {
        bar.set_position(i as u64);
        let (warmup, steps) = (cfg.warmup.unwrap_or(0), cfg.steps.unwrap_or(0));
        let phase = if i as u64 <= warmup {
            "warm-up"
        } else if i as u64 <= warmup + steps {
            "measuring"
        } else {
            "profiling"
        };
        bar.set_message(format!("{phase} {:.2} img/s", cfg.batch_size as f64 / secs));
        if i == n {
            bar.finish_and_clear();
        }
    })?;
    // Rank 0 serves the rendezvous store: everyone is done before it leaves.
    dist.finish()?;
    if !main {
        return Ok(());
    }
    match &args.json {
        Some(p) if p.as_os_str() == "-" => println!("{}", serde_json::to_string_pretty(&r)?),
        Some(p) => {
            print!("{}", render(&r));
            rn50_util::atomic_write(p, serde_json::to_string_pretty(&r)?.as_bytes())
                .with_context(|| format!("writing {}", p.display()))?;
        }
        None => print!("{}", render(&r)),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The machine a result records is all of [`MachineInfo`], not only the fields the report reads.
    #[test]
    fn machine_record_keeps_every_field() {
        let m = machine::machine_info();
        let record = machine_record(&m).unwrap();
        assert_eq!(
            serde_json::to_value(&record).unwrap(),
            serde_json::to_value(&m).unwrap()
        );
        assert_eq!(
            record.cpu.unwrap().logical_cores,
            Some(m.cpu.logical_cores as u64)
        );
    }
}
