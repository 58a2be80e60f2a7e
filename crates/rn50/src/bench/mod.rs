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
pub mod host_data;
pub mod profile;
pub mod source;
pub mod stats;
pub mod sweep;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use serde::Serialize;
use tch::{Device, Kind, Tensor};

use rn50_args::{check_batch_bytes, usize_in, UsageError, MAX_BATCH, MAX_IMAGE_SIZE, MAX_THREADS};
use rn50_distributed::{DistContext, WorldInfo};
use rn50_pipeline::synthetic::{self, SyntheticConfig};
use rn50_pipeline::{Dataset, LoaderConfig};

use crate::device::{device_name, synchronize, DeviceSettings};
use crate::machine::{self, MachineInfo};
use crate::model::{Arch, Model, ResNetConfig};
use crate::step::{Precision, SgdConfig, StepConfig, TrainStep};
use source::Source;

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
#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Model architecture: resnet18, resnet34, resnet50, resnet101, resnet152.
    #[arg(short = 'a', long = "arch", default_value = "resnet50", value_parser = clap::value_parser!(Arch))]
    pub arch: Arch,
    /// Batch size per device, 1 to 65536; batch x image size² x 3 bytes at most 16 GiB [default: 32 on CPU,
    /// 256 on GPU].
    #[arg(short = 'b', long = "batch-size", value_parser = clap::value_parser!(i64).range(1..=MAX_BATCH as i64))]
    pub batch_size: Option<i64>,
    /// Numeric precision [default: bf16 on CPUs with AMX/AVX512-BF16, else fp32; fp16 (AMP) on GPU].
    #[arg(long, value_enum)]
    pub precision: Option<Precision>,
    /// Use channels_last (NHWC) memory format [default: on; it wins for fp32 and bf16 on CPU and on GPU].
    #[arg(long, overrides_with = "no_channels_last")]
    pub channels_last: bool,
    /// Use the contiguous NCHW memory format.
    #[arg(long, overrides_with = "channels_last")]
    pub no_channels_last: bool,
    /// On CUDA, run BatchNorm, residual add and ReLU as PyTorch's separate kernels instead of one fused cuDNN
    /// batch norm (same numbers; compare the two step rates with it).
    #[arg(long)]
    pub no_fused_bn: bool,
    /// Steps run before measuring (allocator, oneDNN/cuDNN autotuning) [default: 3 on CPU, 20 on GPU].
    #[arg(long)]
    pub warmup: Option<usize>,
    /// Measured steps, at least 1 [default: 20 on CPU, 100 on GPU].
    #[arg(long, value_parser = usize_in(1..))]
    pub steps: Option<usize>,
    /// CPU threads for libtorch's intra-op pool, 1 to 1024 [default: the CPUs this process may use].
    #[arg(long, value_parser = usize_in(1..=MAX_THREADS))]
    pub threads: Option<usize>,
    /// Device: auto (CUDA if present, else CPU), cpu, cuda, cuda:N.
    #[arg(long, default_value = "auto")]
    pub device: String,
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
    #[arg(long)]
    pub sweep: bool,
    /// World sizes of the sweep (comma-separated), 1 to 65536 each.
    #[arg(long, value_delimiter = ',', default_value = "1,2", value_parser = usize_in(1..=65536))]
    pub world_sizes: Vec<usize>,
    /// Batch sizes per rank of the sweep (comma-separated), as --batch-size [default: the --batch-size].
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(i64).range(1..=MAX_BATCH as i64))]
    pub batch_sizes: Vec<i64>,
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
}

/// The resolved configuration a bench ran with (all defaults filled in).
#[derive(Clone, Debug, Serialize)]
pub struct BenchConfig {
    pub arch: Arch,
    pub batch_size: i64,
    pub image_size: i64,
    pub precision: Precision,
    pub channels_last: bool,
    pub warmup: usize,
    pub steps: usize,
    pub threads: usize,
    pub device: String,
    pub data: DataMode,
    pub data_dir: Option<PathBuf>,
    pub workers: usize,
    pub synthetic_images: usize,
    pub seed: u64,
    pub tf32: bool,
    /// BatchNorm (+ add) + ReLU fused into one cuDNN op (CUDA, fp16/bf16, channels_last).
    pub fused_bn: bool,
    pub optimizer: SgdConfig,
    pub lr: f64,
    /// Data-parallel processes and the batch of one step over all of them.
    pub world_size: usize,
    pub global_batch: i64,
    /// Steps profiled after the measured ones (`--profile`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile_steps: Option<usize>,
}

#[derive(Clone, Debug, Serialize)]
pub struct BenchResult {
    /// Over all ranks (the sum of the ranks' medians).
    pub images_per_sec: f64,
    /// What the step alone would sustain (global batch / compute time): the ceiling without data wait.
    pub compute_images_per_sec: f64,
    /// Mean per step of the gradient all-reduce that backward did not hide (data-parallel runs).
    pub allreduce_ms: Option<f64>,
    /// Images the loader could not decode (pipeline/real modes), skipped and counted.
    pub bad_images: u64,
    /// The dataset's disk and this process's reads while measuring (real mode).
    pub io: Option<rn50_report::IoDelta>,
    pub images_per_sec_p10: f64,
    pub images_per_sec_p90: f64,
    /// Median wall time of one step, data included.
    pub step_ms: f64,
    /// Mean time per step spent waiting for and copying the batch.
    pub data_wait_ms: f64,
    /// Mean time per step in forward, backward and update.
    pub compute_ms: f64,
    pub data_wait_share: f64,
    pub peak_rss_bytes: u64,
    pub device_peak_memory_bytes: Option<i64>,
    pub final_loss: f64,
    pub step_times_ms: Vec<f64>,
    /// Time per step by kind of work, from extra profiled steps (`--profile`; this rank's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile: Option<profile::ProfileReport>,
    pub config: BenchConfig,
    pub machine: MachineInfo,
}

impl BenchArgs {
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
        Ok(())
    }

    /// Fills in the defaults that depend on the device, the CPU and this process's place in a data-parallel
    /// job (one GPU per process; the CPUs split between the processes of a node), and rejects what cannot run.
    pub fn resolve(&self, world: &WorldInfo) -> Result<(BenchConfig, Device)> {
        let device = crate::device::select(&self.device, world.local_rank)?;
        let cpu = machine::cpu_info();
        let gpu = device.is_cuda();
        let batch_size = self.batch_size.unwrap_or(if gpu { 256 } else { 32 });
        let precision = Precision::resolve(
            self.precision,
            device,
            &cpu,
            ResNetConfig::new(self.arch).narrowest_conv(),
        )?;
        // channels_last measured faster on this Sapphire Rapids CPU for fp32 too (8.3 vs 6.6 img/s).
        let channels_last = self.channels_last || !self.no_channels_last;
        let per_rank = (cpu.logical_cores / world.local_world_size.max(1)).max(1);
        let threads = self.threads.unwrap_or(per_rank);
        let steps = self.steps.unwrap_or(if gpu { 100 } else { 20 });
        let data = match (self.data, &self.data_dir) {
            (None, Some(_)) | (Some(DataMode::Real), Some(_)) => DataMode::Real,
            (Some(DataMode::Real), None) => bail!("--data real needs --data-dir DATA"),
            (Some(_), Some(_)) => bail!("--data-dir goes with --data real"),
            (Some(m), None) => m,
            (None, None) => DataMode::Device,
        };
        let settings = DeviceSettings::for_device(device, !self.no_fused_bn);
        Ok((
            BenchConfig {
                arch: self.arch,
                batch_size,
                image_size: self.image_size,
                precision,
                channels_last,
                warmup: self.warmup.unwrap_or(if gpu { 20 } else { 3 }),
                steps,
                threads,
                device: device_name(device),
                data,
                data_dir: self.data_dir.clone(),
                workers: self.workers.unwrap_or(per_rank).max(1),
                synthetic_images: self.synthetic_images.max(1),
                seed: self.seed,
                tf32: settings.tf32,
                fused_bn: settings.fused_bn,
                optimizer: SgdConfig::default(),
                lr: 0.1 * (batch_size * world.world_size as i64) as f64 / 256.0,
                world_size: world.world_size,
                global_batch: batch_size * world.world_size as i64,
                profile_steps: self.profile.then_some(self.profile_steps),
            },
            device,
        ))
    }
}

/// The batch source of `cfg.data` for this rank.
fn source(cfg: &BenchConfig, device: Device, dist: &DistContext) -> Result<Source> {
    let (b, s) = (cfg.batch_size, cfg.image_size);
    let loader_cfg = || LoaderConfig {
        seed: cfg.seed,
        rank: dist.rank(),
        world_size: dist.world_size(),
        ..LoaderConfig::train(b as usize, cfg.workers)
    };
    Ok(match cfg.data {
        DataMode::Device => Source::device(b, s, device),
        DataMode::Host => Source::host(b, s, device, cfg.seed)?,
        DataMode::Pipeline => {
            let synth = SyntheticConfig {
                seed: cfg.seed,
                ..SyntheticConfig::new(cfg.synthetic_images)
            };
            Source::loader(synthetic::dataset(&synth)?, loader_cfg(), s as usize)?
        }
        DataMode::Real => {
            let root = cfg
                .data_dir
                .as_ref()
                .expect("resolve checks real has a dir");
            let dir = if root.join("train").exists() {
                root.join("train")
            } else {
                root.clone()
            };
            let dataset =
                Dataset::open(&dir).with_context(|| format!("opening {}", dir.display()))?;
            anyhow::ensure!(
                dataset.classes().len() <= 1000,
                "{} has more than 1000 classes",
                dir.display()
            );
            Source::loader(dataset, loader_cfg(), s as usize)?
        }
    })
}

/// Runs the benchmark described by `cfg` on `device`: this rank's part when `dist` spans several processes.
/// `progress` gets (steps done, steps in all, seconds of the last step), profiled steps included.
pub fn run(
    cfg: &BenchConfig,
    device: Device,
    dist: &DistContext,
    mut progress: impl FnMut(usize, usize, f64),
) -> Result<BenchResult> {
    tch::set_num_threads(cfg.threads as i32);
    crate::device::setup(device, cfg.fused_bn)?;
    tch::manual_seed(cfg.seed as i64);
    let model = Model::new(ResNetConfig::new(cfg.arch), device);
    let step_cfg = StepConfig {
        precision: cfg.precision,
        channels_last: cfg.channels_last,
        label_smoothing: 0.0,
        sgd: cfg.optimizer.clone(),
    };
    let mut step = TrainStep::new(model, step_cfg);
    if dist.world_size() > 1 {
        let params = step.model.parameters_in_forward_order();
        let buffers = step.model.buffers();
        step.grad_sync = Some(dist.gradient_sync(&params, &buffers, &Default::default())?);
    }
    let mut src = source(cfg, device, dist)?;
    let io = match (&cfg.data_dir, dist.is_main()) {
        (Some(dir), true) => Some(rn50_report::IoMonitor::start(
            dir,
            std::time::Duration::from_secs(1),
        )?),
        _ => None,
    };
    let mut io_start = None;

    let total = cfg.warmup + cfg.steps;
    let profiled = cfg.profile_steps.unwrap_or(0);
    let mut wait_ms = Vec::with_capacity(cfg.steps);
    let mut step_ms = Vec::with_capacity(cfg.steps);
    let mut comm_ms = Vec::with_capacity(cfg.steps);
    let mut last_loss = Tensor::zeros([], (Kind::Float, device));
    for i in 0..total {
        if i == cfg.warmup {
            io_start = io.as_ref().map(|m| m.snapshot());
        }
        let t0 = Instant::now();
        let batch = src.next(device)?;
        let t1 = Instant::now();
        let out = step.step_u8(&batch.images, &batch.labels, cfg.lr)?;
        synchronize(device);
        let t2 = Instant::now();
        src.recycle(batch);
        last_loss = out.loss;
        if i >= cfg.warmup {
            wait_ms.push((t1 - t0).as_secs_f64() * 1e3);
            step_ms.push((t2 - t0).as_secs_f64() * 1e3);
            comm_ms.push(step.comm.allreduce_wait_ms);
        }
        progress(i + 1, total + profiled, (t2 - t0).as_secs_f64());
    }
    let io = io.zip(io_start).map(|(m, s0)| m.snapshot().delta(&s0));
    // Profiled steps, after the measured ones: the profiler slows them down.
    let profile = if profiled > 0 {
        synchronize(device);
        let profiler = profile::Profiler::start(device)?;
        let t0 = Instant::now();
        for i in 0..profiled {
            let ts = Instant::now();
            let batch = src.next(device)?;
            step.step_u8(&batch.images, &batch.labels, cfg.lr)?;
            synchronize(device);
            src.recycle(batch);
            progress(total + i + 1, total + profiled, ts.elapsed().as_secs_f64());
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
    let b = cfg.batch_size as f64;
    let ips: Vec<f64> = step_ms.iter().map(|ms| b / (ms / 1e3)).collect();
    let data_wait_ms = stats::mean(&wait_ms);
    let mean_step = stats::mean(&step_ms);
    let compute_ms = mean_step - data_wait_ms;
    // Totals over the ranks (each measured its own steps; they run in lockstep).
    let mut totals = [
        stats::median(&ips),
        stats::quantile(&ips, 0.1),
        stats::quantile(&ips, 0.9),
        b / (compute_ms / 1e3),
        src.bad_images() as f64,
    ];
    dist.sum_f64(&mut totals, "summing bench results")?;
    drop(step.grad_sync.take());
    Ok(BenchResult {
        images_per_sec: totals[0],
        compute_images_per_sec: totals[3],
        allreduce_ms: (dist.world_size() > 1).then(|| stats::mean(&comm_ms)),
        bad_images: totals[4] as u64,
        io,
        images_per_sec_p10: totals[1],
        images_per_sec_p90: totals[2],
        step_ms: stats::median(&step_ms),
        data_wait_ms,
        compute_ms,
        data_wait_share: data_wait_ms / mean_step,
        peak_rss_bytes: machine::peak_rss_bytes(),
        device_peak_memory_bytes: match device {
            Device::Cuda(i) => crate::shim::cuda_memory(i).map(|(peak, _)| peak),
            _ => None,
        },
        final_loss,
        step_times_ms: step_ms,
        profile,
        config: cfg.clone(),
        machine: machine::machine_info(),
    })
}

fn gib(bytes: f64) -> String {
    format!("{:.2} GiB", bytes / (1u64 << 30) as f64)
}

/// The short human-readable table.
pub fn render(r: &BenchResult) -> String {
    let c = &r.config;
    let mut s = format!(
        "rn50 bench: {} batch {}{} {}px {}{}{} on {} ({} threads), data={}, {} steps after {} warm-up\n",
        c.arch,
        c.batch_size,
        if c.world_size > 1 {
            format!(" x {} ranks = {}", c.world_size, c.global_batch)
        } else {
            String::new()
        },
        c.image_size,
        c.precision,
        if c.channels_last { " channels_last" } else { "" },
        if c.fused_bn { " fused-BN" } else { "" },
        c.device,
        c.threads,
        format!("{:?}", c.data).to_lowercase(),
        c.steps,
        c.warmup
    );
    let mut rows = vec![
        ("img/s (median)", format!("{:.2}", r.images_per_sec)),
        (
            "compute-only img/s",
            format!("{:.2}", r.compute_images_per_sec),
        ),
        (
            "img/s p10 / p90",
            format!("{:.2} / {:.2}", r.images_per_sec_p10, r.images_per_sec_p90),
        ),
        ("ms/step (median)", format!("{:.1}", r.step_ms)),
        (
            "data wait / compute",
            format!(
                "{:.1} ms / {:.1} ms ({:.1}% waiting)",
                r.data_wait_ms,
                r.compute_ms,
                100.0 * r.data_wait_share
            ),
        ),
        ("peak RSS", gib(r.peak_rss_bytes as f64)),
    ];
    if let Some(ms) = r.allreduce_ms {
        rows.push((
            "all-reduce wait/step",
            format!("{ms:.1} ms (not hidden by backward)"),
        ));
    }
    if r.bad_images > 0 {
        rows.push(("bad images skipped", r.bad_images.to_string()));
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

/// `rn50 bench` as a command: resolve, run with a progress line, print, write JSON.
pub fn command(args: &BenchArgs) -> Result<()> {
    args.check()?;
    if args.sweep {
        return sweep::command(args);
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
    let bar = indicatif::ProgressBar::new(
        (cfg.warmup + cfg.steps + cfg.profile_steps.unwrap_or(0)) as u64,
    )
    .with_style(
        indicatif::ProgressStyle::with_template(
            "{prefix} [{bar:30}] {pos}/{len} steps {msg} (ETA {eta})",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    bar.set_prefix(format!("bench {} b{}", cfg.arch, cfg.batch_size));
    if !main {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let r = run(&cfg, device, &dist, |i, n, secs| {
        bar.set_position(i as u64);
        let phase = if i <= cfg.warmup {
            "warm-up"
        } else if i <= cfg.warmup + cfg.steps {
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
            std::fs::write(p, serde_json::to_string_pretty(&r)?)
                .with_context(|| format!("writing {}", p.display()))?;
        }
        None => print!("{}", render(&r)),
    }
    Ok(())
}
