//! `rn50 train`'s flags: pytorch/examples imagenet/main.py's names where it has one, the rest of the
//! large-batch ImageNet recipe (Goyal et al. 2017; FFCV's progressive resizing) beside them.
use std::path::PathBuf;

use clap::{Args, ValueEnum};
use serde::Serialize;

use crate::device::ComputeArgs;
use crate::model::Arch;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ScheduleKind {
    Step,
    Cosine,
    Linear,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    /// SGD with momentum (optionally Nesterov).
    Sgd,
    /// SGD with layer-wise adaptive rate scaling (You et al. 2017) for large global batches.
    Lars,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Augment {
    /// RandomResizedCrop + flip for training; Resize + CenterCrop for evaluation; ImageNet stem.
    Imagenet,
    /// RandomCrop with zero padding + flip; images as they are for evaluation; 3x3 stem without
    /// max-pool (CIFAR-10/100 and other ~32 px data).
    Cifar,
}

/// Train a ResNet on DATA/train, evaluating on DATA/val (or DATA/test) after every epoch.
///
/// Writes to --out: metrics.jsonl/.csv (per epoch), steps.jsonl (per logged step), checkpoints
/// (resumable with --resume, also after SIGTERM/SIGUSR1), best/final weights as torchvision
/// safetensors, summary.md/.json and PNG plots.
#[derive(Args, Debug, Clone, Serialize)]
pub struct TrainArgs {
    /// Dataset root with train/ and val/ (or test/): ImageFolder trees or packed shards.
    #[arg(required_unless_present = "dummy")]
    pub data: Option<PathBuf>,
    /// Model architecture.
    #[arg(short = 'a', long = "arch", default_value = "resnet50", value_parser = clap::value_parser!(Arch))]
    pub arch: Arch,
    /// Channels of the first stage (torchvision: 64); narrower networks for small data and machines.
    #[arg(long, default_value_t = 64)]
    pub width: i64,
    /// Batch size per process (per GPU).
    #[arg(short = 'b', long = "batch-size", default_value_t = 256)]
    pub batch_size: usize,
    /// Micro-batches accumulated per optimizer step: the global batch is batch·accum·processes.
    #[arg(long, default_value_t = 1)]
    pub accum_steps: usize,
    #[arg(long, default_value_t = 90)]
    pub epochs: usize,
    /// Learning rate per 256 images; the effective rate is lr·global_batch/256.
    #[arg(long, default_value_t = 0.1)]
    pub lr: f64,
    #[arg(long, default_value_t = 0.9)]
    pub momentum: f64,
    /// Weight decay.
    #[arg(long = "wd", alias = "weight-decay", default_value_t = 1e-4)]
    pub wd: f64,
    #[arg(long, value_enum, default_value_t = OptimizerKind::Sgd)]
    pub optimizer: OptimizerKind,
    /// LARS trust coefficient η.
    #[arg(long, default_value_t = 0.001)]
    pub lars_eta: f64,
    /// Linear warmup from 0 to the peak LR over this many epochs (fractions allowed).
    #[arg(long, default_value_t = 0.0)]
    pub warmup_epochs: f64,
    /// LR decay after warmup: step (÷10 at 30, 60, 80 epochs, scaled to --epochs), cosine or linear.
    #[arg(long, value_enum, default_value_t = ScheduleKind::Step)]
    pub lr_schedule: ScheduleKind,
    #[arg(long, default_value_t = 0.0)]
    pub label_smoothing: f64,
    #[arg(long)]
    pub nesterov: bool,
    /// No weight decay on BN parameters and biases.
    #[arg(long)]
    pub no_bn_wd: bool,
    /// Zero-init the last BN γ of each residual block.
    #[arg(long)]
    pub zero_init_residual: bool,
    /// Keep an EMA of the weights with this decay (e.g. 0.9999); evaluation then uses the EMA weights.
    #[arg(long)]
    pub ema: Option<f64>,
    /// Data loading threads [default: the CPUs this process may use].
    #[arg(short = 'j', long = "workers")]
    pub workers: Option<usize>,
    /// Augmentation recipe (and stem): imagenet, or cifar for ~32 px images.
    #[arg(long, value_enum, default_value_t = Augment::Imagenet)]
    pub augment: Augment,
    /// Training crop size (the final one with progressive resizing).
    #[arg(long, default_value_t = 224)]
    pub image_size: usize,
    /// Zero padding of the cifar RandomCrop.
    #[arg(long, default_value_t = 4)]
    pub pad: usize,
    /// Progressive resizing (FFCV): train at this resolution until --start-ramp, then grow linearly to
    /// --image-size by --end-ramp (rounded to multiples of 32).
    #[arg(long)]
    pub min_res: Option<usize>,
    /// Epoch where progressive resizing starts growing the resolution.
    #[arg(long, default_value_t = 0.0)]
    pub start_ramp: f64,
    /// Epoch where progressive resizing reaches --image-size [default: 85% of --epochs].
    #[arg(long)]
    pub end_ramp: Option<f64>,
    #[arg(long, default_value_t = 256)]
    pub val_resize: usize,
    #[arg(long, default_value_t = 224)]
    pub val_crop: usize,
    /// Stop each epoch after this many steps (smoke tests, quick measurements).
    #[arg(long)]
    pub steps_per_epoch: Option<usize>,
    /// Resume from this checkpoint (exact position, optimizer, scaler and EMA state); a run directory
    /// means its latest checkpoint; `auto` resumes from --out if it has one (requeued jobs).
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// Replace the run already in --out: its checkpoints, metrics, weights and plots are removed first
    /// (other files are left alone). Without it, a used --out needs --resume.
    #[arg(long, conflicts_with = "resume")]
    pub overwrite: bool,
    /// Only evaluate (the --resume checkpoint or fresh weights) on DATA/val.
    #[arg(short = 'e', long = "evaluate")]
    pub evaluate: bool,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Run directory: checkpoints, metrics, weights, summary and plots; one train at a time writes to it.
    #[arg(long, default_value = "runs/train")]
    pub out: PathBuf,
    /// Also checkpoint every this many minutes (besides every epoch); 0 = only per epoch.
    #[arg(long, default_value_t = 30.0)]
    pub checkpoint_minutes: f64,
    /// Checkpoints kept (the newest ones; the best weights are kept apart).
    #[arg(long, default_value_t = 2)]
    pub keep_checkpoints: usize,
    /// Data-parallel gradient bucket size in MiB (PyTorch DDP's bucket_cap_mb).
    #[arg(long, default_value_t = 25.0)]
    pub bucket_cap_mb: f64,
    /// Synthetic data instead of DATA (no disk, no decode).
    #[arg(long)]
    pub dummy: bool,
    #[command(flatten)]
    pub compute: ComputeArgs,
    /// Log every N steps.
    #[arg(short = 'p', long = "print-freq", default_value_t = 10)]
    pub print_freq: usize,
}
