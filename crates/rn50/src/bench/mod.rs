//! `rn50 bench`: training throughput of a ResNet on synthetic data, the number sites publish (img/s).
//!
//! Data modes (tensorpack's split of input-bound from compute-bound):
//! - `device`: one uint8 batch made on the device once and reused: pure compute;
//! - `host`: a fresh uint8 batch made on the host every step and copied over, as a loader would.
pub mod host_data;
pub mod stats;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use serde::Serialize;
use tch::{Device, Kind, Tensor};

use crate::device::{device_name, parse_device, synchronize};
use crate::machine::{self, MachineInfo};
use crate::model::{Arch, Model, ResNetConfig};
use crate::step::{Precision, SgdConfig, StepConfig, TrainStep};
use host_data::HostBatches;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DataMode {
    /// One batch made on the device and reused every step (compute only).
    Device,
    /// A fresh batch made on the host every step and copied to the device.
    Host,
}

/// Measure training throughput (images/s) on synthetic data.
#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Model architecture: resnet18, resnet34, resnet50, resnet101, resnet152.
    #[arg(short = 'a', long = "arch", default_value = "resnet50", value_parser = clap::value_parser!(Arch))]
    pub arch: Arch,
    /// Batch size per device [default: 32 on CPU, 256 on GPU].
    #[arg(short = 'b', long = "batch-size")]
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
    /// Steps run before measuring (allocator, oneDNN/cuDNN autotuning) [default: 3 on CPU, 20 on GPU].
    #[arg(long)]
    pub warmup: Option<usize>,
    /// Measured steps [default: 20 on CPU, 100 on GPU].
    #[arg(long)]
    pub steps: Option<usize>,
    /// CPU threads for libtorch's intra-op pool [default: the CPUs this process may use].
    #[arg(long)]
    pub threads: Option<usize>,
    /// Device: auto (CUDA if present, else CPU), cpu, cuda, cuda:N.
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Where the batches come from (see `--help`): device or host.
    #[arg(long = "data", value_enum, default_value_t = DataMode::Device)]
    pub data: DataMode,
    /// Image size (square).
    #[arg(long, default_value_t = 224)]
    pub image_size: i64,
    /// Random seed for weights and data.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Write the full result as JSON to this file ("-" for stdout).
    #[arg(long)]
    pub json: Option<PathBuf>,
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
    pub seed: u64,
    pub tf32: bool,
    pub optimizer: SgdConfig,
    pub lr: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct BenchResult {
    pub images_per_sec: f64,
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
    pub config: BenchConfig,
    pub machine: MachineInfo,
}

impl BenchArgs {
    /// Fills in the defaults that depend on the device and CPU, and rejects what cannot run.
    pub fn resolve(&self) -> Result<(BenchConfig, Device)> {
        let device = parse_device(&self.device)?;
        let cpu = machine::cpu_info();
        let gpu = device.is_cuda();
        let batch_size = self.batch_size.unwrap_or(if gpu { 256 } else { 32 });
        if batch_size < 1 {
            bail!("--batch-size must be at least 1 (got {batch_size})");
        }
        if self.image_size < 32 {
            bail!("--image-size must be at least 32 (got {})", self.image_size);
        }
        let precision = Precision::resolve(self.precision, device, cpu.has_bf16())?;
        // channels_last measured faster on this Sapphire Rapids CPU for fp32 too (8.3 vs 6.6 img/s).
        let channels_last = self.channels_last || !self.no_channels_last;
        let threads = self.threads.unwrap_or(cpu.logical_cores);
        if threads == 0 {
            bail!("--threads must be at least 1");
        }
        let steps = self.steps.unwrap_or(if gpu { 100 } else { 20 });
        if steps == 0 {
            bail!("--steps must be at least 1");
        }
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
                data: self.data,
                seed: self.seed,
                tf32: gpu,
                optimizer: SgdConfig::default(),
                lr: 0.1 * batch_size as f64 / 256.0,
            },
            device,
        ))
    }
}

/// Runs the benchmark described by `cfg` on `device`.
pub fn run(
    cfg: &BenchConfig,
    device: Device,
    mut progress: impl FnMut(usize, usize, f64),
) -> Result<BenchResult> {
    tch::set_num_threads(cfg.threads as i32);
    crate::shim::set_tf32(cfg.tf32)?;
    tch::manual_seed(cfg.seed as i64);
    if let Device::Cuda(i) = device {
        tch::Cuda::cudnn_set_benchmark(true);
        crate::shim::cuda_reset_peak(i);
    }
    let model = Model::new(ResNetConfig::new(cfg.arch), device);
    let step_cfg = StepConfig {
        precision: cfg.precision,
        channels_last: cfg.channels_last,
        label_smoothing: 0.0,
        sgd: cfg.optimizer.clone(),
    };
    let mut step = TrainStep::new(model, step_cfg);
    let (b, s) = (cfg.batch_size, cfg.image_size);
    let labels = Tensor::randint(1000, [b], (Kind::Int64, device));
    let mut on_device = Tensor::randint(256, [b, s, s, 3], (Kind::Uint8, device));
    let host = (cfg.data == DataMode::Host).then(|| HostBatches::new(b, s, device, 3, cfg.seed));

    let total = cfg.warmup + cfg.steps;
    let (mut wait_ms, mut step_ms) = (Vec::with_capacity(cfg.steps), Vec::with_capacity(cfg.steps));
    let mut last_loss = Tensor::zeros([], (Kind::Float, device));
    for i in 0..total {
        let t0 = Instant::now();
        let mut in_flight = None;
        if let Some(h) = &host {
            let batch = h.next();
            if device.is_cuda() {
                // Asynchronous copy from pinned memory, queued ahead of this step's kernels.
                on_device = batch.to_device_(device, Kind::Uint8, true, false);
                in_flight = Some(batch);
            } else {
                on_device.copy_(&batch);
                h.recycle(batch);
            }
        }
        let t1 = Instant::now();
        let out = step.step_u8(&on_device, &labels, cfg.lr)?;
        synchronize(device);
        let t2 = Instant::now();
        if let (Some(h), Some(batch)) = (&host, in_flight) {
            h.recycle(batch);
        }
        last_loss = out.loss;
        if i >= cfg.warmup {
            wait_ms.push((t1 - t0).as_secs_f64() * 1e3);
            step_ms.push((t2 - t0).as_secs_f64() * 1e3);
        }
        progress(i + 1, total, (t2 - t0).as_secs_f64());
    }
    let final_loss = f64::try_from(&last_loss).context("reading the loss")?;
    if !final_loss.is_finite() {
        bail!("the loss became {final_loss}: numerics are broken for this configuration");
    }
    let ips: Vec<f64> = step_ms.iter().map(|ms| b as f64 / (ms / 1e3)).collect();
    let data_wait_ms = stats::mean(&wait_ms);
    let mean_step = stats::mean(&step_ms);
    Ok(BenchResult {
        images_per_sec: stats::median(&ips),
        images_per_sec_p10: stats::quantile(&ips, 0.1),
        images_per_sec_p90: stats::quantile(&ips, 0.9),
        step_ms: stats::median(&step_ms),
        data_wait_ms,
        compute_ms: mean_step - data_wait_ms,
        data_wait_share: data_wait_ms / mean_step,
        peak_rss_bytes: machine::peak_rss_bytes(),
        device_peak_memory_bytes: match device {
            Device::Cuda(i) => crate::shim::cuda_memory(i).map(|(peak, _)| peak),
            _ => None,
        },
        final_loss,
        step_times_ms: step_ms,
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
        "rn50 bench: {} batch {} {}px {}{} on {} ({} threads), data={}, {} steps after {} warm-up\n",
        c.arch,
        c.batch_size,
        c.image_size,
        c.precision,
        if c.channels_last { " channels_last" } else { "" },
        c.device,
        c.threads,
        format!("{:?}", c.data).to_lowercase(),
        c.steps,
        c.warmup
    );
    let rows = [
        ("img/s (median)", format!("{:.2}", r.images_per_sec)),
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
    for (k, v) in rows {
        s += &format!("  {k:<22}{v}\n");
    }
    if let Some(m) = r.device_peak_memory_bytes {
        s += &format!("  {:<22}{}\n", "peak device memory", gib(m as f64));
    }
    s
}

/// `rn50 bench` as a command: resolve, run with a progress line, print, write JSON.
pub fn command(args: &BenchArgs) -> Result<()> {
    let (cfg, device) = args.resolve()?;
    // Drawn on stderr, hidden when it is not a terminal (logs, CI).
    let bar = indicatif::ProgressBar::new((cfg.warmup + cfg.steps) as u64).with_style(
        indicatif::ProgressStyle::with_template(
            "{prefix} [{bar:30}] {pos}/{len} steps {msg} (ETA {eta})",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    bar.set_prefix(format!("bench {} b{}", cfg.arch, cfg.batch_size));
    let r = run(&cfg, device, |i, n, secs| {
        bar.set_position(i as u64);
        let phase = if i <= cfg.warmup {
            "warm-up"
        } else {
            "measuring"
        };
        bar.set_message(format!("{phase} {:.2} img/s", cfg.batch_size as f64 / secs));
        if i == n {
            bar.finish_and_clear();
        }
    })?;
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
