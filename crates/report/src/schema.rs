//! What the report reads and what rn50 writes for it: bench results, sweep results, training runs.
//!
//! Every struct ignores fields it does not know (serde's default), and everything a writer might leave out
//! is an `Option`, so an older or newer rn50 still produces readable files.

use std::fs;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::ReportError;

/// `rn50 bench --json FILE`: what `rn50 bench` writes, and what the sweep, the report and the tests read.
/// Fields older results lack are `Option`s (`None` when reading such a file); a bench of this version writes
/// every one of them except `profile` (only with `--profile`) and `cuda_graph_declined` (only where `--cuda-graph`
/// did not apply).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct BenchResult {
    /// Median over the timed steps, all ranks together (the sum of the ranks' medians).
    pub images_per_sec: f64,
    /// What the step alone would sustain (global batch / `compute_ms`): the ceiling without data wait (NVIDIA
    /// DLE's "compute only" column).
    pub compute_images_per_sec: Option<f64>,
    /// Data-parallel runs: mean per step of the gradient all-reduce that backward did not hide.
    pub allreduce_ms: Option<f64>,
    /// Images the loader could not decode (pipeline/real modes), skipped and counted.
    pub bad_images: Option<u64>,
    /// The dataset's disk and this process's reads while measuring (real mode).
    pub io: Option<crate::IoDelta>,
    pub images_per_sec_p10: Option<f64>,
    pub images_per_sec_p90: Option<f64>,
    /// Median wall time of one step, data included.
    pub step_ms: Option<f64>,
    /// Mean time per step the host waited for the next batch's producer (the loader), as `train` counts it. On a
    /// CPU, which has run the step by then, all of it is time the step lost. On a GPU the next batch is taken
    /// while the device runs the step, so a wait the device hid is counted too.
    pub data_wait_ms: Option<f64>,
    /// Median over the timed steps of the step's time less its data wait: forward, backward and update (with the
    /// all-reduce backward did not hide), and handing the next batch to the
    /// device (the copy into page-locked memory and the host-to-device copy on a GPU; with `--data host` on a
    /// CPU, the copy into the input tensor).
    pub compute_ms: Option<f64>,
    pub data_wait_share: Option<f64>,
    pub peak_rss_bytes: Option<u64>,
    pub device_peak_memory_bytes: Option<u64>,
    pub final_loss: Option<f64>,
    #[serde(default)]
    pub step_times_ms: Vec<f64>,
    /// Time per step by kind of work, from extra profiled steps (`--profile`; rank 0's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<ProfileReport>,
    /// Why `--cuda-graph` was asked for but the steps ran eager (the CPU, several ranks, …); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_graph_declined: Option<String>,
    pub config: BenchConfig,
    pub machine: Option<Machine>,
}

/// The resolved configuration a bench ran with (all defaults filled in).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct BenchConfig {
    /// resnet18 … resnet152.
    pub arch: String,
    /// Channels of the first stage (`--width`); absent in older results: torchvision's 64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub width: Option<u64>,
    /// Per rank.
    pub batch_size: u64,
    pub image_size: Option<u64>,
    /// fp32, bf16, fp16.
    pub precision: Option<String>,
    pub channels_last: Option<bool>,
    /// Steps run before measuring.
    pub warmup: Option<u64>,
    /// Measured steps.
    pub steps: Option<u64>,
    /// libtorch intra-op threads of each rank.
    pub threads: Option<u64>,
    /// "cpu", "cuda:0".
    pub device: Option<String>,
    /// Data mode: device, host, pipeline, real.
    pub data: Option<String>,
    /// The dataset of `data: real`.
    pub data_dir: Option<PathBuf>,
    /// Loader threads (pipeline and real modes).
    pub workers: Option<u64>,
    /// Synthetic JPEGs of `data: pipeline`.
    pub synthetic_images: Option<u64>,
    pub seed: Option<u64>,
    pub tf32: Option<bool>,
    /// BatchNorm (+ add) + ReLU fused into one cuDNN op (CUDA, fp16/bf16, channels_last).
    pub fused_bn: Option<bool>,
    /// Bottlenecks with batch norm folded into the convolutions through cuDNN graphs; absent in older results.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fused_block: Option<bool>,
    /// With `fused_block`, the execution plans each of its cuDNN graphs timed on its first run; absent in older
    /// results (4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fused_block_plans: Option<u64>,
    /// The stem's max-pool through cuDNN without an index tensor; absent in older results.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cudnn_pool: Option<bool>,
    /// `Some(true)`: the measured steps replayed the step captured as one CUDA graph (`--cuda-graph`, where it
    /// applies: see [`BenchResult::cuda_graph_declined`]); absent: eager, as in older results. (Before the run, in
    /// the configuration `bench` resolves: `--cuda-graph` was given.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_graph: Option<bool>,
    pub optimizer: Option<OptimizerConfig>,
    /// Effective learning rate (after linear scaling).
    pub lr: Option<f64>,
    /// Data-parallel processes; absent in older single-process results: 1.
    pub world_size: Option<u64>,
    /// The batch of one step over all ranks; absent: batch_size · world_size.
    pub global_batch: Option<u64>,
    /// Steps profiled after the measured ones (`--profile`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile_steps: Option<u64>,
}

/// The network as tables name it: the architecture, and its `--width` when not torchvision's 64 ("resnet18 width
/// 8"); a narrower network is another model, never compared with the full one.
pub fn network_label(arch: &str, width: Option<u64>) -> String {
    match width {
        Some(w) if w != 64 => format!("{arch} width {w}"),
        _ => arch.to_string(),
    }
}

impl BenchConfig {
    /// [`network_label`] of this configuration.
    pub fn network(&self) -> String {
        network_label(&self.arch, self.width)
    }

    pub fn world_size(&self) -> u64 {
        self.world_size.unwrap_or(1).max(1)
    }
    pub fn global_batch(&self) -> u64 {
        self.global_batch
            .unwrap_or(self.batch_size * self.world_size())
    }
}

/// The optimizer's settings: what `rn50 train` and `bench` step with, as results and checkpoints record them.
/// SGD with momentum unless `lars_eta` or `adam` says otherwise; `lookahead` wraps any of them.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct OptimizerConfig {
    /// SGD's momentum; with `adam`, its β1 (the first moment's decay, fast.ai's `mom`).
    pub momentum: f64,
    pub weight_decay: f64,
    pub nesterov: bool,
    /// No weight decay on 1-D parameters (BN γ/β and biases), as in Goyal et al. and NVIDIA's recipe.
    pub no_bn_bias_decay: bool,
    /// LARS trust coefficient η: when set, every weight matrix/kernel gets its own rate
    /// lr·η·‖w‖/(‖g‖ + wd·‖w‖) (1-D parameters keep plain SGD, as in MLPerf's LARS).
    #[serde(default)]
    pub lars_eta: Option<f64>,
    /// An Adam-family update in place of SGD's; absent in older results and checkpoints: SGD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adam: Option<AdamConfig>,
    /// Lookahead (Zhang et al. 2019) around the update; absent in older results and checkpoints: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lookahead: Option<LookaheadConfig>,
}

/// Which Adam: AdamW (Loshchilov & Hutter 2019) or RAdam (Liu et al. 2020: the second moment's variance
/// rectified, so no warmup is needed), both with decoupled weight decay (p ← p·(1 - lr·wd)), as
/// `torch.optim.AdamW` and `torch.optim.RAdam(decoupled_weight_decay=True)` (fast.ai's `true_wd`).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum AdamKind {
    Adamw,
    Radam,
}

/// The Adam family's settings besides β1 ([`OptimizerConfig::momentum`]) and the weight decay.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
pub struct AdamConfig {
    pub kind: AdamKind,
    /// β2, the second moment's decay (fast.ai's `sqr_mom`).
    pub beta2: f64,
    /// ε, added to the second moment's square root.
    pub eps: f64,
}

/// Lookahead: every `k` updates the slow weights move `alpha` of the way to the fast ones, which restart there.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
pub struct LookaheadConfig {
    pub k: u64,
    pub alpha: f64,
}

impl Default for OptimizerConfig {
    fn default() -> Self {
        Self {
            momentum: 0.9,
            weight_decay: 1e-4,
            nesterov: false,
            no_bn_bias_decay: false,
            lars_eta: None,
            adam: None,
            lookahead: None,
        }
    }
}

/// A kind of work a training step does (`rn50 bench --profile`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkKind {
    Convolution,
    BatchNorm,
    /// ReLU, residual adds, fills, and the other pointwise ops.
    Elementwise,
    /// SGD's multi-tensor (foreach) kernels and AMP's gradient unscaling and scale update.
    Optimizer,
    /// Changes of dtype: autocast's casts, the uint8 batch to float.
    Cast,
    /// Copies and layout changes within and between devices, memsets.
    Copy,
    /// Collectives (NCCL, Gloo) and the bookkeeping of DDP's gradient buckets.
    Communication,
    /// Everything not above (pooling, the classifier's matmul, the loss, allocation); see the top names.
    Other,
}

impl WorkKind {
    pub const ALL: [WorkKind; 8] = [
        WorkKind::Convolution,
        WorkKind::BatchNorm,
        WorkKind::Elementwise,
        WorkKind::Optimizer,
        WorkKind::Cast,
        WorkKind::Copy,
        WorkKind::Communication,
        WorkKind::Other,
    ];

    pub fn name(self) -> &'static str {
        match self {
            WorkKind::Convolution => "convolution",
            WorkKind::BatchNorm => "batch_norm",
            WorkKind::Elementwise => "elementwise",
            WorkKind::Optimizer => "optimizer",
            WorkKind::Cast => "cast",
            WorkKind::Copy => "copy",
            WorkKind::Communication => "communication",
            WorkKind::Other => "other",
        }
    }
}

impl std::fmt::Display for WorkKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What the times of a profile are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProfileSource {
    /// Self time of the ops on the CPU threads that ran them.
    CpuOps,
    /// Device time of CUDA kernels, memcpys and memsets.
    CudaKernels,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct KindTime {
    pub kind: WorkKind,
    pub ms_per_step: f64,
    /// Of `total_ms_per_step`.
    pub share: f64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct NameTime {
    pub name: String,
    pub ms_per_step: f64,
    /// Of `total_ms_per_step`.
    pub share: f64,
}

/// `rn50 bench --profile`'s result: time per step by kind of work.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ProfileReport {
    pub source: ProfileSource,
    /// Steps profiled (after the measured ones; their wall time is not in the img/s figures).
    pub steps: usize,
    /// Wall time of one profiled step (the profiler slows steps down).
    pub wall_ms_per_step: f64,
    /// The time summed over every kind, per step.
    pub total_ms_per_step: f64,
    /// Every kind, largest first, then `other`.
    pub kinds: Vec<KindTime>,
    /// The largest parts of `other`, by op name (on CUDA: the op that launched the kernels, or the kernel).
    pub other_top: Vec<NameTime>,
    /// Events the profiler recorded.
    pub events: usize,
    /// Said when the summary is not what was asked for (CUDA run without CUDA activity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Machine {
    pub hostname: Option<String>,
    pub os: Option<String>,
    pub cpu: Option<Cpu>,
    pub memory_bytes: Option<u64>,
    pub torch_version: Option<String>,
    #[serde(default)]
    pub cuda_devices: Vec<CudaDevice>,
    /// What else the writer recorded (libtorch path, driver and cuDNN versions, …), kept as written.
    #[serde(flatten)]
    pub other: serde_json::Map<String, serde_json::Value>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Cpu {
    pub model: Option<String>,
    pub logical_cores: Option<u64>,
    pub physical_cores: Option<u64>,
    /// Vendor, bf16 features, oneDNN's ISA cap, as the writer recorded them.
    #[serde(flatten)]
    pub other: serde_json::Map<String, serde_json::Value>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct CudaDevice {
    pub index: Option<u64>,
    pub name: String,
    pub total_memory_bytes: Option<u64>,
    pub compute_capability: Option<String>,
}

/// The "hardware" column of a bench result, from what it recorded: the GPU's name on CUDA, else the CPU model and
/// thread count (a live device's is `rn50::device::hardware_name`).
pub fn bench_hardware_label(config: &BenchConfig, machine: Option<&Machine>) -> String {
    let device = config.device.as_deref().unwrap_or("");
    let Some(m) = machine else {
        return if device.is_empty() {
            "unknown".into()
        } else {
            device.into()
        };
    };
    if device.starts_with("cuda") {
        // "cuda:1" names the device; plain "cuda" is device 0.
        let index: usize = device
            .strip_prefix("cuda:")
            .and_then(|i| i.parse().ok())
            .unwrap_or(0);
        if let Some(d) = m.cuda_devices.get(index).or(m.cuda_devices.first()) {
            return d.name.clone();
        }
        return device.into();
    }
    let model = m
        .cpu
        .as_ref()
        .and_then(|c| c.model.clone())
        .unwrap_or_else(|| "CPU".into());
    match config.threads {
        Some(t) => format!("{model} ({t} threads)"),
        None => model,
    }
}

/// One line of a run's `steps.jsonl`: a logged optimizer step (`-p`), its loss averaged over the ranks at full
/// precision, its top-1 and its learning rate. `step` counts from 0 within the epoch.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct StepRecord {
    pub epoch: u64,
    pub step: u64,
    pub loss: f64,
    /// The step's training top-1 over all ranks' images, percent (main.py's `top1` meter of the batch).
    #[serde(default)]
    pub acc1: Option<f64>,
    pub lr: f64,
    /// The run's clock at this step, seconds: the logged epochs' `seconds` and this epoch's so far (a resumed
    /// epoch's before its checkpoint included). A resume tells from it how far a killed attempt had trained past
    /// its checkpoint (`TrainSummary::redone_s`). Absent in older logs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_s: Option<f64>,
}

/// One line of a run's `metrics.jsonl`: one finished epoch, as `rn50 train` writes it and the report reads it.
/// Accuracies in percent; a value that is not a number (no validation set) is written as null and reads as
/// `None`, as does a field an older rn50 did not write.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct EpochMetrics {
    pub epoch: u64,
    /// Mean over the epoch's logged steps of the loss averaged over ranks.
    pub train_loss: Option<f64>,
    /// Training top-1 over the images the epoch trained on (all ranks; from the resumed step on in a resumed
    /// epoch), percent: main.py's `top1` meter at the epoch's end.
    #[serde(default)]
    pub train_acc1: Option<f64>,
    /// The epoch's last step's learning rate.
    pub lr: Option<f64>,
    /// Training images per second over all processes.
    pub images_per_sec: Option<f64>,
    pub acc1: Option<f64>,
    pub acc5: Option<f64>,
    /// Mean cross-entropy over the validation images (all ranks), as main.py's validate() prints.
    #[serde(default)]
    pub val_loss: Option<f64>,
    /// Validation images evaluated (all ranks).
    #[serde(default)]
    pub val_images: Option<u64>,
    /// With `--ema`: the weights' moving average evaluated on the same images (`acc1`, `acc5` and `val_loss`
    /// are the trained weights'); absent without it.
    #[serde(default)]
    pub ema_acc1: Option<f64>,
    #[serde(default)]
    pub ema_acc5: Option<f64>,
    #[serde(default)]
    pub ema_val_loss: Option<f64>,
    /// That epoch's wall time: training and evaluation, and the checkpoint of the epoch before (written after
    /// that epoch's record); a resumed epoch's includes its attempts' seconds up to their checkpoints.
    pub seconds: Option<f64>,
    /// Of `seconds`, those in the training loop (rank 0), which `images_per_sec` is over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub train_seconds: Option<f64>,
    /// Training resolution (pixels), which progressive resizing changes between epochs.
    #[serde(default)]
    pub resolution: Option<u64>,
    /// The share of the training time spent waiting for the loader.
    #[serde(default)]
    pub data_wait_share: Option<f64>,
    /// Training images skipped as unreadable that epoch (all ranks).
    pub bad_images: Option<u64>,
    /// Training batches not trained on that epoch (all ranks): batches that unreadable images left empty, or
    /// with one value per channel for batch norm; the same batch of every rank is left out.
    #[serde(default)]
    pub skipped_batches: Option<u64>,
    /// Validation images skipped as unreadable in that epoch's evaluation (all ranks).
    #[serde(default)]
    pub val_bad_images: Option<u64>,
    /// The epoch's I/O, from `IoMonitor` snapshots at its start and end (`IoDelta`'s fields of the same names).
    pub disk_read_gbs: Option<f64>,
    pub disk_read_iops: Option<f64>,
    pub process_read_gbs: Option<f64>,
}

/// A training run's `summary.json`, written by `rn50 train` at the end (the report falls back to metrics.jsonl
/// when there is none). Missing fields read as their defaults, so an older file still loads.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct TrainSummary {
    pub arch: String,
    /// Channels of the first stage (`--width`; 64 for torchvision's ResNets); absent in older summaries.
    pub width: Option<u64>,
    /// What ran it, e.g. "NVIDIA A100-SXM4-40GB" or "Intel Xeon (2 threads)".
    pub device: String,
    pub world_size: u64,
    /// Per rank.
    pub batch_size: u64,
    pub global_batch: u64,
    /// The peak learning rate the run trained at (after scaling, when it was scaled).
    pub lr: f64,
    /// `--lr-base` and `--lr-base-size` when `lr` was scaled from them (lr_base·global_batch/lr_base_size);
    /// absent when `--lr` gave the rate itself (and in older summaries).
    pub lr_base: Option<f64>,
    pub lr_base_size: Option<u64>,
    /// Epochs finished.
    pub epochs: u64,
    /// Training plus evaluation, first epoch's start to the last one's end.
    pub wall_clock_s: f64,
    /// Final epoch's top-1 / top-5, percent.
    pub acc1: Option<f64>,
    pub acc5: Option<f64>,
    pub best_acc1: Option<f64>,
    /// With `--ema`: the average's final and best top-1 (`acc1` and `best_acc1` are the trained weights').
    pub ema_acc1: Option<f64>,
    pub best_ema_acc1: Option<f64>,
    /// Mean over epochs of the training throughput, all ranks together.
    pub images_per_sec: f64,
    pub precision: String,
    /// Dataset path or name ("imagenet", "/data/ilsvrc", "dummy").
    pub dataset: String,
    /// Optimizer steps each epoch trained, and those of a whole pass over the training set: fewer trained than
    /// whole when `--steps-per-epoch` cut the epochs short (a smoke run, not a result). Absent in older summaries
    /// (and the whole pass with --dummy).
    pub steps_per_epoch: Option<u64>,
    pub full_steps_per_epoch: Option<u64>,
    /// The validation split's images; an epoch's `val_images` fewer when `--val-max-images` evaluated a subset.
    pub val_images_total: Option<u64>,
    /// `train --target-accuracy`: the top-1 (percent) the run stops at; absent without one.
    pub target_acc1: Option<f64>,
    /// The epochs trained when the first evaluation reached `target_acc1`, and their wall-clock seconds
    /// (`EpochMetrics::seconds`: training, evaluation and checkpoints; earlier runs' included when resumed);
    /// absent when not reached.
    pub target_epochs: Option<u64>,
    pub time_to_target_s: Option<f64>,
    /// Seconds of training done twice: what attempts killed without a checkpoint at the end (kill -9, a node
    /// lost) trained past their last checkpoint, which the resume trained again. Not in `wall_clock_s` (the
    /// epochs' seconds), which is what the run takes uninterrupted; the two add up to what it cost. Absent
    /// when none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redone_s: Option<f64>,
}

impl EpochMetrics {
    /// The better top-1 of the trained weights and their EMA: what --target-accuracy judges.
    pub fn best_of_acc1(&self) -> Option<f64> {
        [self.acc1, self.ema_acc1]
            .into_iter()
            .flatten()
            .filter(|a| a.is_finite())
            .reduce(f64::max)
    }
}

impl TrainSummary {
    /// Fills the fields that follow from the per-epoch metrics (epochs, wall clock, accuracies, mean img/s);
    /// the caller sets the configuration fields.
    pub fn fill_from_metrics(&mut self, epochs: &[EpochMetrics]) {
        self.epochs = epochs.len() as u64;
        self.wall_clock_s = epochs.iter().filter_map(|e| e.seconds).sum();
        let last = epochs.last();
        self.acc1 = last.and_then(|e| e.acc1);
        self.acc5 = last.and_then(|e| e.acc5);
        let best = |acc: fn(&EpochMetrics) -> Option<f64>| {
            epochs
                .iter()
                .filter_map(acc)
                .filter(|a| a.is_finite())
                .reduce(f64::max)
        };
        self.best_acc1 = best(|e| e.acc1);
        self.ema_acc1 = last.and_then(|e| e.ema_acc1);
        self.best_ema_acc1 = best(|e| e.ema_acc1);
        let ips: Vec<f64> = epochs.iter().filter_map(|e| e.images_per_sec).collect();
        self.images_per_sec = if ips.is_empty() {
            0.0
        } else {
            ips.iter().sum::<f64>() / ips.len() as f64
        };
    }

    /// Sets `target_acc1` to `target` and, from the per-epoch metrics, the time to it: the epochs up to the
    /// first whose top-1 (the trained weights' or their EMA's) reaches it, and the sum of their seconds.
    pub fn fill_target(&mut self, epochs: &[EpochMetrics], target: Option<f64>) {
        self.target_acc1 = target;
        let reached = target.and_then(|t| time_to_target(epochs, t));
        self.target_epochs = reached.map(|(n, _)| n);
        self.time_to_target_s = reached.map(|(_, s)| s);
    }
}

/// Time to accuracy: the epochs trained when the first evaluation reached `target` (top-1 percent, of the trained
/// weights or their EMA), and the sum of those epochs' seconds (training, evaluation and checkpoints; a resumed
/// run's earlier attempts included); None when no evaluation reached it. What `train --target-accuracy` records
/// and `rn50 report --target-accuracy` tabulates.
pub fn time_to_target(epochs: &[EpochMetrics], target: f64) -> Option<(u64, f64)> {
    let i = epochs
        .iter()
        .position(|e| e.best_of_acc1().is_some_and(|a| a >= target))?;
    Some((
        epochs[i].epoch + 1,
        epochs[..=i].iter().filter_map(|e| e.seconds).sum(),
    ))
}

/// `rn50 bench --sweep`: each point repeated, reported as median with spread.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct SweepResult {
    pub arch: String,
    /// As [`BenchConfig::width`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub width: Option<u64>,
    /// The hardware column, e.g. "NVIDIA A100-SXM4-40GB" or "Intel Xeon (2 threads)". Empty: made from
    /// `device`, `threads` and `machine` as for bench results, so sweep and bench rows group together.
    #[serde(default)]
    pub hardware: String,
    /// "cpu", "cuda", "cuda:0".
    pub device: Option<String>,
    /// Threads per rank on CPU.
    pub threads: Option<u64>,
    pub precision: Option<String>,
    pub image_size: Option<u64>,
    /// Data mode: device, host, pipeline, or a path.
    pub data: Option<String>,
    /// How the ranks were started: "launch", "slurm", "pbs".
    pub launcher: Option<String>,
    pub points: Vec<SweepPoint>,
    pub machine: Option<Machine>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct SweepPoint {
    pub world_size: u64,
    /// Per rank.
    pub batch_size: u64,
    pub global_batch: u64,
    /// Effective learning rate.
    pub lr: Option<f64>,
    /// One entry per repeat, all ranks together.
    pub images_per_sec: Vec<f64>,
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub allreduce_ms: Option<f64>,
    /// The configuration the point's last repeat resolved (absent in older sweeps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<BenchConfig>,
}

impl SweepPoint {
    /// A point from its repeats: median, min and max computed here (NaNs dropped).
    pub fn from_repeats(
        world_size: u64,
        batch_size: u64,
        lr: Option<f64>,
        images_per_sec: Vec<f64>,
        allreduce_ms: Option<f64>,
    ) -> SweepPoint {
        let mut v: Vec<f64> = images_per_sec
            .iter()
            .copied()
            .filter(|x| x.is_finite())
            .collect();
        v.sort_by(f64::total_cmp);
        SweepPoint {
            world_size,
            batch_size,
            global_batch: world_size * batch_size,
            lr,
            median: rn50_util::stats::median(&v),
            min: v.first().copied().unwrap_or(f64::NAN),
            max: v.last().copied().unwrap_or(f64::NAN),
            images_per_sec,
            allreduce_ms,
            config: None,
        }
    }
}

/// A training run directory, read.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainRun {
    pub dir: PathBuf,
    /// Directory name, the legend and "run" column.
    pub name: String,
    pub epochs: Vec<EpochMetrics>,
    pub summary: Option<TrainSummary>,
}

/// One input of `rn50 report`, by what it turned out to be.
#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    Bench {
        path: PathBuf,
        result: Box<BenchResult>,
    },
    Sweep {
        path: PathBuf,
        result: SweepResult,
    },
    Train(TrainRun),
}

impl SweepResult {
    /// The hardware column: `hardware` if set, else as a bench result's ([`bench_hardware_label`]).
    pub fn hardware_label(&self) -> String {
        if !self.hardware.is_empty() {
            return self.hardware.clone();
        }
        let config = BenchConfig {
            arch: self.arch.clone(),
            device: self.device.clone(),
            threads: self.threads,
            ..BenchConfig::default()
        };
        bench_hardware_label(&config, self.machine.as_ref())
    }
}

/// Parses JSON, naming the file, line and column when it is malformed or lacks a field.
pub fn parse_json<T: DeserializeOwned>(text: &str, path: &Path) -> Result<T, ReportError> {
    serde_json::from_str(text).map_err(|e| ReportError::json(path, e.line(), &e))
}

fn read_text(path: &Path) -> Result<String, ReportError> {
    fs::read_to_string(path).map_err(|e| ReportError::Io {
        path: path.to_path_buf(),
        source: e,
    })
}

pub fn read_json<T: DeserializeOwned>(path: &Path) -> Result<T, ReportError> {
    parse_json(&read_text(path)?, path)
}

/// Reads metrics.jsonl. Blank lines are skipped; a resumed run may have appended an epoch twice, the last
/// record of an epoch wins; the result is sorted by epoch. A last line without its newline is a record being
/// written by a running `rn50 train` and is left out rather than reported as malformed.
pub fn read_metrics(path: &Path) -> Result<Vec<EpochMetrics>, ReportError> {
    let text = read_text(path)?;
    let complete = text.ends_with('\n');
    let n_lines = text.lines().count();
    let mut epochs: Vec<EpochMetrics> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let rec: EpochMetrics = match serde_json::from_str(line) {
            Ok(r) => r,
            Err(_) if !complete && i + 1 == n_lines => break,
            Err(e) => return Err(ReportError::json(path, i + 1, &e)),
        };
        epochs.retain(|e| e.epoch != rec.epoch);
        epochs.push(rec);
    }
    epochs.sort_by_key(|e| e.epoch);
    Ok(epochs)
}

/// Reads a run directory: metrics.jsonl (required), summary.json (optional).
pub fn read_train_run(dir: &Path) -> Result<TrainRun, ReportError> {
    let metrics = dir.join("metrics.jsonl");
    if !metrics.is_file() {
        return Err(ReportError::NotARun(dir.to_path_buf()));
    }
    let epochs = read_metrics(&metrics)?;
    let summary_path = dir.join("summary.json");
    let summary = if summary_path.is_file() {
        Some(read_json::<TrainSummary>(&summary_path)?)
    } else {
        None
    };
    Ok(TrainRun {
        dir: dir.to_path_buf(),
        name: run_name(dir),
        epochs,
        summary,
    })
}

fn run_name(path: &Path) -> String {
    // canonicalize so that "." reports as the directory's real name
    let p = fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

/// Reads the `rn50 report` arguments. A directory that is not a run stands for what it holds, one level down:
/// its run directories and its JSON files (JSON that is none of ours, like a report's own report.json, is
/// skipped with a note on stderr; a malformed one is still an error).
pub fn read_inputs(paths: &[PathBuf]) -> Result<Vec<Input>, ReportError> {
    let mut out = vec![];
    for p in paths {
        if !p.is_dir() || p.join("metrics.jsonl").is_file() {
            out.push(read_input(p)?);
            continue;
        }
        let entries = fs::read_dir(p).map_err(|e| ReportError::Io {
            path: p.clone(),
            source: e,
        })?;
        let mut children: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        children.sort();
        let before = out.len();
        for c in children {
            let is_json = c.extension().is_some_and(|e| e == "json");
            if c.is_dir() && c.join("metrics.jsonl").is_file() {
                out.push(Input::Train(read_train_run(&c)?));
            } else if c.is_file() && is_json {
                match read_input(&c) {
                    Ok(i) => out.push(i),
                    Err(ReportError::Unknown(_)) => {
                        tracing::warn!("skipping {}: not a result", c.display())
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        if out.len() == before {
            return Err(ReportError::NotARun(p.clone()));
        }
    }
    Ok(out)
}

/// Reads one `rn50 report` argument: a run directory, a run's summary.json, a sweep JSON or a bench JSON.
pub fn read_input(path: &Path) -> Result<Input, ReportError> {
    if path.is_dir() {
        return Ok(Input::Train(read_train_run(path)?));
    }
    let text = read_text(path)?;
    let value: serde_json::Value = parse_json(&text, path)?;
    let has = |k: &str| value.get(k).is_some();
    if has("points") {
        Ok(Input::Sweep {
            path: path.to_path_buf(),
            result: parse_json(&text, path)?,
        })
    } else if has("images_per_sec") && has("config") {
        Ok(Input::Bench {
            path: path.to_path_buf(),
            result: Box::new(parse_json(&text, path)?),
        })
    } else if has("wall_clock_s") {
        // A summary.json given by itself: its directory is the run.
        let dir = path.parent().filter(|p| !p.as_os_str().is_empty());
        Ok(Input::Train(read_train_run(dir.unwrap_or(Path::new(".")))?))
    } else {
        Err(ReportError::Unknown(path.to_path_buf()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_to_target_sums_the_epochs_up_to_the_first_that_reaches_it() {
        let e = |epoch, acc1, seconds| EpochMetrics {
            epoch,
            acc1,
            seconds: Some(seconds),
            ..Default::default()
        };
        // Epoch 1 is not evaluated; epoch 2 reaches 75.9 first.
        let epochs = [
            e(0, Some(50.0), 10.0),
            e(1, None, 11.0),
            e(2, Some(76.0), 12.0),
            e(3, Some(77.0), 13.0),
        ];
        let mut s = TrainSummary::default();
        s.fill_target(&epochs, Some(75.9));
        assert_eq!(
            (s.target_acc1, s.target_epochs, s.time_to_target_s),
            (Some(75.9), Some(3), Some(33.0))
        );
        s.fill_target(&epochs, Some(100.0));
        assert_eq!((s.target_epochs, s.time_to_target_s), (None, None));
        s.fill_target(&epochs, None);
        assert_eq!(s.target_acc1, None);
    }

    /// With --ema, the trained weights and their average are evaluated alike: either reaching the target reaches
    /// it, and the summary keeps the best of each.
    #[test]
    fn the_ema_reaches_the_target_and_has_its_own_best() {
        let e = |epoch, acc1, ema_acc1| EpochMetrics {
            epoch,
            acc1: Some(acc1),
            ema_acc1: Some(ema_acc1),
            seconds: Some(10.0),
            ..Default::default()
        };
        let epochs = [e(0, 40.0, 10.0), e(1, 60.0, 77.0), e(2, 70.0, 50.0)];
        let mut s = TrainSummary::default();
        s.fill_from_metrics(&epochs);
        assert_eq!((s.acc1, s.best_acc1), (Some(70.0), Some(70.0)));
        assert_eq!((s.ema_acc1, s.best_ema_acc1), (Some(50.0), Some(77.0)));
        s.fill_target(&epochs, Some(75.9));
        assert_eq!((s.target_epochs, s.time_to_target_s), (Some(2), Some(20.0)));
    }
}
