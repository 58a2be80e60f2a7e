//! `rn50 train`'s flags: pytorch/examples imagenet/main.py's names where it has one, the rest of the
//! large-batch ImageNet recipe (Goyal et al. 2017; FFCV's progressive resizing) beside them.
use std::ops::Bound;
use std::path::PathBuf;

use clap::{Args, ValueEnum};
use serde::Serialize;

use rn50_args::{check_batch_bytes, finite_in, positive, usize_in, UsageError};
use rn50_pipeline::cli::{AugmentArgs, CropArgs};
use rn50_report::table::fmt_decimals;

use crate::device::ComputeArgs;
use crate::model::{Arch, ResNetConfig, Stem, Variant};
use crate::step::mix::MAX_MIX_ALPHA;
use crate::step::{AdamConfig, AdamKind, LookaheadConfig, OptimizerConfig};
use crate::train::foreign::ForeignFlags;
use crate::train::schedule::Resolution;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ScheduleKind {
    Step,
    Cosine,
    Linear,
    /// Polynomial decay to --lr-end with power --lr-poly-power (MLPerf's LARS schedule).
    Poly,
    /// The peak rate until --lr-decay-start, then half a cosine to --lr-end (fast.ai's fit_flat_cos).
    #[serde(rename = "flat-cos")]
    FlatCos,
    /// Over --warmup-epochs the rate rises along half a cosine from the peak / --div-factor, then falls along
    /// half a cosine to --lr-end; momentum goes the other way, --momentum → --base-momentum → --momentum
    /// (PyTorch's OneCycleLR, fast.ai's fit_one_cycle).
    #[serde(rename = "one-cycle")]
    OneCycle,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    /// SGD with momentum (optionally Nesterov).
    Sgd,
    /// SGD with layer-wise adaptive rate scaling (You et al. 2017) for large global batches.
    Lars,
    /// AdamW (torch.optim.AdamW): Adam with decoupled weight decay.
    Adamw,
    /// RAdam (torch.optim.RAdam(decoupled_weight_decay=True)): Adam whose early steps need no warmup; with
    /// --lookahead, fast.ai's Ranger.
    Radam,
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

/// Train a ResNet on DATA/train, evaluating on DATA/val (or DATA/test) after every epoch (or every
/// --eval-every epochs).
///
/// Writes to --out: metrics.jsonl/.csv (per epoch), steps.jsonl (per logged step), checkpoints
/// (resumable with --resume), best/final weights as torchvision safetensors, summary.md/.json and
/// PNG plots. Ctrl-C, SIGTERM or SIGUSR1 saves a checkpoint, prints how to resume and exits 3; a
/// second Ctrl-C stops at once.
#[derive(Args, Debug, Clone, Serialize)]
pub struct TrainArgs {
    /// Dataset root with train/ and val/ (or validation/, test/): ImageFolder trees, packed shards or
    /// WebDataset shards; or a downloaded repository as it is, timm's WebDataset shards
    /// (*-train-NNNN.tar, *-validation-NNNN.tar) or the Hub's parquet files (data/train-*.parquet,
    /// data/validation-*.parquet).
    #[arg(required_unless_present = "dummy")]
    pub data: Option<PathBuf>,
    #[command(flatten)]
    #[serde(flatten)]
    pub train_split: rn50_pipeline::cli::TrainSplitArg,
    #[command(flatten)]
    #[serde(flatten)]
    pub val_split: rn50_pipeline::cli::ValSplitArg,
    /// Model architecture: torchvision's resnet18, resnet34, resnet50, resnet101, resnet152, or timm's variants of
    /// them: the suffix d for ResNet-D (three-conv stem, average-pool shortcuts: resnet50d), c for the stem alone,
    /// the prefix resnetblur for anti-aliased downsampling (resnetblur50, resnetblur50d); ResNeXt as resnext50_32x4d
    /// (groups x channels per group; resnext50d_32x4d), the prefix se for squeeze-and-excitation (seresnet50,
    /// seresnext50d_32x4d: fast.ai's xse_resnext50); any with the suffix _mish for Mish in place of every ReLU
    /// (resnet50d_mish: fast.ai's xresnet's activation), then _sa for fast.ai's simple self-attention in the first
    /// stage's last block (resnet50d_mish_sa); _maxblur before those for the max-blur pool of fast.ai's 2020-10
    /// Imagenette entry in the stem and ResNet-D's shortcuts (resnet50d_maxblur: sides a multiple of 32), or
    /// _maxdown for fast.ai's max-pool shortcuts in ResNet-D (resnet50d_maxdown). Weights keep torchvision's or
    /// timm's keys (self-attention's fast.ai's).
    #[arg(short = 'a', long = "arch", alias = "model", default_value = "resnet50", value_parser = clap::value_parser!(Arch))]
    pub arch: Arch,
    /// Channels of the first stage (torchvision: 64); narrower networks for small data and machines. 1 to 512.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(i64).range(1..=512))]
    pub width: i64,
    /// Batch size per process (per GPU), 1 to 65536; batch x image size² x 3 bytes at most 16 GiB. The global
    /// batch is this times the processes (and --accum-steps): main.py's -b is per node and divided among its GPUs,
    /// so main.py's -b 256 on 8 GPUs is `rn50 launch --nproc-per-node 8 -- train /data/imagenet -b 32`.
    #[arg(short = 'b', long = "batch-size", default_value_t = 256, value_parser = usize_in(1..=rn50_args::MAX_BATCH))]
    pub batch_size: usize,
    /// Micro-batches accumulated per optimizer step, at least 1: the global batch is batch·accum·processes.
    #[arg(long, alias = "grad-accum-steps", default_value_t = 1, value_parser = usize_in(1..))]
    pub accum_steps: usize,
    /// Epochs to train, at least 1.
    #[arg(long, default_value_t = 90, value_parser = usize_in(1..))]
    pub epochs: usize,
    /// The learning rate itself, whatever the batch (pytorch/examples' main.py, timm and NVIDIA's scripts take
    /// --lr this way). Above 0. Not with --lr-base.
    #[arg(long, alias = "learning-rate", value_parser = positive(), conflicts_with = "lr_base")]
    pub lr: Option<f64>,
    /// Learning rate per --lr-base-size images (timm's name): the effective rate is
    /// lr_base·global_batch/lr_base_size (Goyal et al.'s linear scaling); not used with --lr. Above 0.
    #[arg(long, default_value_t = DEFAULT_LR_BASE, value_parser = positive())]
    pub lr_base: f64,
    /// The batch size --lr-base is given for, 1 to 1048576.
    #[arg(long, default_value_t = DEFAULT_LR_BASE_SIZE, value_parser = usize_in(1..=1 << 20))]
    pub lr_base_size: usize,
    /// Momentum, 0 or more (torch.optim.SGD's range); with --optimizer adamw or radam, β1, the first moment's
    /// decay, below 1 (fast.ai's mom; PyTorch's betas[0]).
    #[arg(long, default_value_t = 0.9, value_parser = finite_in(0.0..))]
    pub momentum: f64,
    /// Weight decay, 0 or more.
    #[arg(long = "wd", alias = "weight-decay", default_value_t = 1e-4, value_parser = finite_in(0.0..))]
    pub wd: f64,
    /// The update. With adamw and radam --momentum is β1 and --wd is decoupled (p ← p·(1 - lr·wd) before the
    /// step: fast.ai's true weight decay), and --beta2 and --opt-eps apply; their rates are Adam's, around 1e-3.
    #[arg(long, value_enum, default_value_t = OptimizerKind::Sgd)]
    pub optimizer: OptimizerKind,
    /// LARS trust coefficient η, above 0.
    #[arg(long, default_value_t = 0.001, value_parser = positive())]
    pub lars_eta: f64,
    /// --optimizer adamw or radam: β2, the second moment's decay, 0 to below 1 [default: 0.999, PyTorch's;
    /// fast.ai's sqr_mom is 0.99].
    #[arg(long, value_parser = finite_in(0.0..1.0))]
    pub beta2: Option<f64>,
    /// --optimizer adamw or radam: ε, added to the second moment's square root, above 0 [default: 1e-8,
    /// PyTorch's; fast.ai's is 1e-6] (timm's --opt-eps).
    #[arg(long, value_parser = positive())]
    pub opt_eps: Option<f64>,
    /// Lookahead (Zhang et al. 2019) around the update: every --lookahead-k updates the slow weights (those
    /// training started from) move --lookahead-alpha of the way to the trained ones, and training goes on from
    /// there. --optimizer radam --lookahead is fast.ai's Ranger (timm's lookahead_radam).
    #[arg(long)]
    pub lookahead: bool,
    /// --lookahead's period in updates, 1 to 1000 [default: 6, fast.ai's and timm's].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub lookahead_k: Option<u64>,
    /// --lookahead's step, above 0 to 1 [default: 0.5, fast.ai's and timm's].
    #[arg(long, value_parser = finite_in((Bound::Excluded(0.0), Bound::Included(1.0))))]
    pub lookahead_alpha: Option<f64>,
    /// Linear warmup from 0 to the peak LR over this many epochs (fractions allowed), 0 to below --epochs; for
    /// --lr-schedule one-cycle, above 0: its rise (PyTorch's pct_start x --epochs).
    #[arg(long, alias = "lr-warmup-epochs", default_value_t = 0.0, value_parser = finite_in(0.0..))]
    pub warmup_epochs: f64,
    /// LR decay after warmup: step (÷10 at --lr-milestones), cosine (to --lr-end), linear (to 0), poly
    /// (end + (peak - end)·(1 - t)^--lr-poly-power, t going from 0 after the warmup to 1 at the last step:
    /// MLPerf's LARS schedule), flat-cos (the peak until --lr-decay-start, then cosine to --lr-end: fast.ai's
    /// fit_flat_cos, which its Imagenette leaderboard entries use) or one-cycle (up from the peak / --div-factor
    /// along a cosine over --warmup-epochs, then a cosine down to --lr-end, momentum cycled the other way from
    /// --momentum to --base-momentum and back: PyTorch's OneCycleLR, fast.ai's fit_one_cycle).
    #[arg(long, alias = "sched", value_enum, default_value_t = ScheduleKind::Step)]
    pub lr_schedule: ScheduleKind,
    /// The rate --lr-schedule cosine, poly, flat-cos or one-cycle decays to at the last step, 0 or more and below
    /// the peak rate (MLPerf's LARS reference: 0.0001; timm's --min-lr).
    #[arg(long, visible_alias = "min-lr", default_value_t = 0.0, value_parser = finite_in(0.0..))]
    pub lr_end: f64,
    /// The epoch --lr-schedule flat-cos starts its cosine at, from the end of the warmup to below --epochs
    /// [default: 0.75 x --epochs, fast.ai's fit_flat_cos(pct_start=0.75)].
    #[arg(long, value_parser = finite_in(0.0..))]
    pub lr_decay_start: Option<f64>,
    /// --lr-schedule one-cycle starts at the peak rate divided by this, 1 or more [default: 25, as PyTorch's
    /// OneCycleLR and fast.ai].
    #[arg(long, value_parser = finite_in(1.0..))]
    pub div_factor: Option<f64>,
    /// The momentum --lr-schedule one-cycle cycles down to at the peak rate (from --momentum at the start, back
    /// to it at the end), 0 to --momentum; --momentum itself turns the cycling off [default: 0.85, as PyTorch's
    /// OneCycleLR; fast.ai's moms=(0.95, 0.85, 0.95) is --momentum 0.95 with it].
    #[arg(long, value_parser = finite_in(0.0..))]
    pub base_momentum: Option<f64>,
    /// The power of --lr-schedule poly, above 0 (MLPerf's LARS: 2; 1 is linear).
    #[arg(long, default_value_t = 2.0, value_parser = positive())]
    pub lr_poly_power: f64,
    /// Epochs where --lr-schedule step divides the rate by 10, comma-separated, increasing, above 0 and at most
    /// --epochs [default: every 30 epochs before the last, as main.py's StepLR(step_size=30): 30,60 for 90
    /// epochs; none (a constant rate) for 30 or fewer].
    #[arg(long, value_delimiter = ',', action = clap::ArgAction::Set, value_parser = finite_in(0.0..))]
    pub lr_milestones: Option<Vec<f64>>,
    /// Label smoothing of the cross-entropy loss, 0 to 1 (torch.nn.CrossEntropyLoss's range).
    #[arg(long, alias = "smoothing", default_value_t = 0.0, value_parser = finite_in(0.0..=1.0))]
    pub label_smoothing: f64,
    #[arg(long)]
    pub nesterov: bool,
    /// No weight decay on BN parameters and biases.
    #[arg(long)]
    pub no_bn_wd: bool,
    /// Zero-init the last BN γ of each residual block.
    #[arg(long)]
    pub zero_init_residual: bool,
    /// Keep an EMA of the weights with this decay, 0 to 1 (e.g. 0.9999). Every evaluation evaluates both, as timm
    /// does: the trained weights (acc1, acc5, val_loss in metrics.jsonl) and their average (ema_acc1, ema_acc5,
    /// ema_val_loss). Both bests are kept: best.safetensors the trained weights' best top-1, best_ema.safetensors
    /// the average's; final.safetensors is the trained weights. --target-accuracy is reached by either. timm's
    /// --model-ema-decay; timm's --model-ema alone means 0.9998, its default.
    #[arg(long, visible_alias = "model-ema-decay", value_parser = finite_in(0.0..=1.0),
          default_value_if("model_ema", clap::builder::ArgPredicate::IsPresent, "0.9998"))]
    pub ema: Option<f64>,
    /// Update the EMA every N steps of each epoch (its first step, the (N+1)th, ...), at least 1: torchvision's
    /// --model-ema-steps (its recipe: 32).
    #[arg(long, visible_alias = "model-ema-steps", default_value_t = 1, value_parser = usize_in(1..))]
    pub ema_steps: usize,
    /// timm's switch for --ema 0.9998 (hidden: rn50's way is --ema DECAY).
    #[arg(long, hide = true)]
    #[serde(skip)]
    pub model_ema: bool,
    /// Data loading threads, 1 to 1024 [default: the CPUs this process may use].
    #[arg(short = 'j', long = "workers", value_parser = usize_in(1..=rn50_args::MAX_THREADS))]
    pub workers: Option<usize>,
    #[command(flatten)]
    pub pixel_limit: rn50_pipeline::cli::PixelLimit,
    #[command(flatten)]
    pub dct: rn50_pipeline::cli::DctScalingArg,
    /// Augmentation recipe (and stem): imagenet, or cifar for ~32 px images.
    #[arg(long, value_enum, default_value_t = Augment::Imagenet)]
    pub augment: Augment,
    /// Training crop size (the final one with progressive resizing), 32 to 4096 pixels.
    #[arg(long, alias = "train-crop-size", default_value_t = 224, value_parser = usize_in(32..=rn50_args::MAX_IMAGE_SIZE))]
    pub image_size: usize,
    /// Zero padding of the cifar RandomCrop, 0 to 1024 pixels.
    #[arg(long, default_value_t = 4, value_parser = usize_in(0..=1024))]
    pub pad: usize,
    #[command(flatten)]
    pub crop: CropArgs,
    #[command(flatten)]
    pub augmentation: AugmentArgs,
    /// Mixup's α, 0 (off) to 1e6: images and one-hot targets of a batch blended with the previous image's, weight
    /// λ ~ Beta(α, α) (torchvision's reference: 0.2; from 1e6 on λ is ½ within 0.2%). With --cutmix-alpha too,
    /// each batch gets one of the two, either with probability ½.
    #[arg(long, alias = "mixup", value_name = "ALPHA", default_value_t = 0.0, value_parser = finite_in(0.0..=MAX_MIX_ALPHA))]
    pub mixup_alpha: f64,
    /// CutMix's α, 0 (off) to 1e6: a box of each image replaced by the previous image's, the targets weighted by
    /// area (torchvision's reference: 1.0).
    #[arg(long, alias = "cutmix", value_name = "ALPHA", default_value_t = 0.0, value_parser = finite_in(0.0..=MAX_MIX_ALPHA))]
    pub cutmix_alpha: f64,
    /// Repeated augmentation, 1 (off) to 16: each image shown N times in a row, differently augmented, the copies
    /// spread over the processes (torchvision's RASampler; its recipe: 4). As RASampler, an epoch keeps its length,
    /// so it shows about 1/N of the images.
    #[arg(long, alias = "aug-repeats", default_value_t = 1, value_parser = usize_in(1..=16))]
    pub ra_reps: usize,
    /// Progressive resizing (FFCV): train at this resolution until --start-ramp, then grow linearly to
    /// --image-size by --end-ramp (rounded to multiples of 32). 32 to --image-size.
    #[arg(long, value_parser = usize_in(32..=rn50_args::MAX_IMAGE_SIZE))]
    pub min_res: Option<usize>,
    /// Epoch where progressive resizing starts growing the resolution, 0 or more.
    #[arg(long, default_value_t = 0.0, value_parser = finite_in(0.0..))]
    pub start_ramp: f64,
    /// Epoch where progressive resizing reaches --image-size, --start-ramp or more [default: 85% of --epochs].
    #[arg(long, value_parser = finite_in(0.0..))]
    pub end_ramp: Option<f64>,
    /// Evaluation: resize the shorter side to this, 1 to 4096 pixels, then center-crop --val-crop [default:
    /// --val-crop / 0.875, rounded (torchvision's 256 for 224; timm's crop_pct)].
    #[arg(long, alias = "val-resize-size", value_parser = usize_in(1..=rn50_args::MAX_IMAGE_SIZE))]
    pub val_resize: Option<usize>,
    /// Evaluation center crop, 1 to --val-resize pixels [default: --image-size, the final one with progressive
    /// resizing: the network is evaluated at the size it was trained at]. A larger crop than the training size is
    /// allowed (FFCV tests at 224 after training at 160-192).
    #[arg(long, alias = "val-crop-size", value_parser = usize_in(1..=rn50_args::MAX_IMAGE_SIZE))]
    pub val_crop: Option<usize>,
    /// Evaluate every N epochs (at least 1), from epoch --eval-offset on; the last epoch is always evaluated.
    /// Epochs without evaluation have no accuracy in metrics.jsonl and never become best.safetensors.
    #[arg(long, default_value_t = 1, value_parser = usize_in(1..))]
    pub eval_every: usize,
    /// The first epoch evaluated, 0-based (MLPerf's eval_offset): the epochs evaluated are K, K+N, K+2N, ...
    /// (1-based: K+1, K+N+1, ...), and the last one. 0 or more.
    #[arg(long, default_value_t = 0, value_parser = usize_in(0..))]
    pub eval_offset: usize,
    /// Time to accuracy, MLPerf style: stop at the first evaluation whose top-1 reaches this percent (above 0, at
    /// most 100; MLPerf's ResNet-50 target is 75.9), after saving that epoch's checkpoint, and record the time to
    /// it (time_to_target_s in summary.json). Not reached by the last epoch: said in the last line; exit code 0.
    /// With --mllog the target is MLPerf's 75.9, and another value is refused.
    #[arg(long, value_name = "PERCENT", value_parser = finite_in((Bound::Excluded(0.0), Bound::Included(100.0))))]
    pub target_accuracy: Option<f64>,
    /// Write MLPerf Training's result log to this file (`:::MLLOG {json}` lines as mlperf_logging's mllog writes
    /// them: submission_*, cache_clear, init_start, run_start, epoch_start, eval_accuracy, run_stop...); rank 0
    /// only. One uninterrupted run per file: a file that holds a run is refused, and a resumed run writes none.
    #[arg(long, value_name = "FILE")]
    pub mllog: Option<PathBuf>,
    #[command(flatten)]
    pub mlperf: MlperfArgs,
    /// Stop each epoch after this many optimizer steps, at least 1 (fewer when the data ends first): with
    /// --val-max-images, a check of a whole dataset end to end in a minute (also quick measurements; with
    /// --dummy, the epoch's length: 100 by default). `steps-per-epoch` in a --config file is read as this flag.
    #[arg(long = "max-steps-per-epoch", visible_alias = "steps-per-epoch", value_parser = usize_in(1..))]
    pub steps_per_epoch: Option<usize>,
    /// Evaluate on this many of the validation images, at least 1, evenly spaced through the set so that every
    /// class keeps its share [default: all].
    #[arg(long, value_parser = usize_in(1..))]
    pub val_max_images: Option<usize>,
    /// Start from these weights: fine-tuning. Safetensors with torchvision's names (an rn50 best/final.safetensors)
    /// or a torch.save file (torchvision's resnet50-11ad3fa6.pth, pytorch/examples' checkpoint.pth.tar or
    /// model_best.pth.tar), told apart by content. The classifier is re-initialised when the class count differs
    /// (or with --reset-head). A checkpoint found by --resume takes precedence.
    #[arg(long, value_name = "FILE")]
    pub init_weights: Option<PathBuf>,
    /// With --init-weights: re-initialise the classifier (fc) even when the class count is the same.
    #[arg(long, requires = "init_weights")]
    pub reset_head: bool,
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
    #[arg(long, alias = "output", default_value = "runs/train")]
    pub out: PathBuf,
    /// Also checkpoint every this many minutes (besides every epoch), up to a year (525600); 0 = only per epoch.
    #[arg(long, default_value_t = 30.0, value_parser = finite_in(0.0..=525_600.0))]
    pub checkpoint_minutes: f64,
    /// Checkpoints kept (the newest ones, at least 1; the best weights are kept apart).
    #[arg(long, alias = "checkpoint-hist", default_value_t = 2, value_parser = usize_in(1..))]
    pub keep_checkpoints: usize,
    /// Batch-norm statistics over all ranks' batches in training (PyTorch's SyncBatchNorm, torchvision's
    /// --sync-bn): for small per-GPU batches. Costs an all-gather per BN layer in forward and an all-reduce in
    /// backward; no effect in a single process.
    #[arg(long)]
    pub sync_bn: bool,
    /// Data-parallel gradient bucket size in MiB (PyTorch DDP's bucket_cap_mb), above 0.
    #[arg(long, default_value_t = 25.0, value_parser = positive())]
    pub bucket_cap_mb: f64,
    /// Synthetic data instead of DATA (no disk, no decode).
    #[arg(long)]
    pub dummy: bool,
    /// On one CUDA GPU, run each training step as one CUDA graph (one launch for its thousands of kernels; the
    /// rate and the loss-scale logic on the device). The first 3 steps of each batch shape run eager on a side
    /// stream, the 4th is captured and trained on by the graph's first replay, and every later step of that shape
    /// replays it: each batch is trained on once, in order, as without it. A batch left smaller by unreadable
    /// images runs eager; a new resolution (--min-res) warms up and captures again. Where it cannot apply (CPU,
    /// several processes, --accum-steps above 1, one-cycle's momentum, LARS, Mixup/CutMix, --random-erase,
    /// --sync-bn) the steps run eager and the log says why. Off by default until measured on a GPU
    /// (docs/benchmarks.md).
    #[arg(long)]
    pub cuda_graph: bool,
    #[command(flatten)]
    pub compute: ComputeArgs,
    /// Log every N steps.
    #[arg(short = 'p', long = "print-freq", alias = "log-interval", default_value_t = 10, value_parser = usize_in(1..))]
    pub print_freq: usize,
    /// Take flags from this TOML file, its keys the long flag names (`batch-size = 256`, `no-bn-wd = true`,
    /// `data = "/path"`); flags on the command line override it, and turn off a switch it sets with the switch's
    /// `no-` form (`--no-nesterov`; `--bn-wd` for `no-bn-wd`). See recipes/ and the run directory's config.toml.
    #[arg(long, value_name = "FILE.toml")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// main.py's and timm's flags that rn50 spells or does another way: refused by [`TrainArgs::check`], naming
    /// rn50's way.
    #[command(flatten)]
    #[serde(skip)]
    pub foreign: ForeignFlags,
    /// Every flag's value as TOML (set by the binary from what it parsed), written to --out as config.toml.
    #[arg(skip)]
    #[serde(skip)]
    pub resolved_config: Option<toml::Table>,
}

/// --lr-base's default, the rate when neither --lr nor --lr-base is given: 0.1 per 256 images (main.py's 0.1 at
/// batch 256).
pub const DEFAULT_LR_BASE: f64 = 0.1;
/// --lr-base-size's default: the batch of pytorch/examples' main.py and Goyal et al.'s reference.
pub const DEFAULT_LR_BASE_SIZE: usize = 256;

impl TrainArgs {
    /// The epoch where progressive resizing reaches --image-size: --end-ramp, else 85% of --epochs.
    pub fn end_ramp_epoch(&self) -> f64 {
        self.end_ramp.unwrap_or(0.85 * self.epochs as f64)
    }

    /// Whether 0-based `epoch` is evaluated: --eval-offset, every --eval-every epochs after it, and the last.
    pub fn evaluates(&self, epoch: usize) -> bool {
        let (k, n) = (self.eval_offset, self.eval_every);
        epoch + 1 == self.epochs || (epoch >= k && (epoch - k).is_multiple_of(n))
    }

    /// The rules between flags (each flag's own range is clap's): checked first, before anything is allocated
    /// or written, and a [`UsageError`] (exit 2) when broken.
    pub fn check(&self) -> Result<(), UsageError> {
        self.foreign.check()?;
        let usage = |m: String| Err(UsageError(m));
        if self.warmup_epochs >= self.epochs as f64 {
            return usage(format!(
                "--warmup-epochs {} must be below --epochs {}",
                self.warmup_epochs, self.epochs
            ));
        }
        if let Some(m) = &self.lr_milestones {
            if self.lr_schedule != ScheduleKind::Step {
                return usage("--lr-milestones is for --lr-schedule step".into());
            }
            let epochs = self.epochs as f64;
            if m.is_empty()
                || m.iter().any(|&e| e <= 0.0 || e > epochs)
                || m.windows(2).any(|w| w[0] >= w[1])
            {
                let m: Vec<String> = m.iter().map(|&e| fmt_decimals(e, 3)).collect();
                return usage(format!(
                    "--lr-milestones {} must be increasing epochs above 0 and at most --epochs {epochs}",
                    m.join(",")
                ));
            }
        }
        if self.lr_end != 0.0
            && !matches!(
                self.lr_schedule,
                ScheduleKind::Cosine
                    | ScheduleKind::Poly
                    | ScheduleKind::FlatCos
                    | ScheduleKind::OneCycle
            )
        {
            return usage(
                "--lr-end is for --lr-schedule cosine, poly, flat-cos or one-cycle".into(),
            );
        }
        if self.lr_schedule == ScheduleKind::OneCycle {
            if self.warmup_epochs == 0.0 {
                return usage(format!(
                    "--lr-schedule one-cycle rises over --warmup-epochs: give it above 0 (PyTorch's pct_start 0.3 \
                     is --warmup-epochs {})",
                    fmt_decimals(0.3 * self.epochs as f64, 3)
                ));
            }
            let base = self
                .base_momentum
                .unwrap_or(crate::train::schedule::BASE_MOMENTUM);
            if base > self.momentum {
                return usage(format!(
                    "--base-momentum {base} must be at most --momentum {}: one cycle's momentum goes from \
                     --momentum down to --base-momentum at the peak rate and back",
                    self.momentum
                ));
            }
        } else if self.div_factor.is_some() || self.base_momentum.is_some() {
            return usage(
                "--div-factor and --base-momentum are for --lr-schedule one-cycle".into(),
            );
        }
        if let Some(start) = self.lr_decay_start {
            if self.lr_schedule != ScheduleKind::FlatCos {
                return usage("--lr-decay-start is for --lr-schedule flat-cos".into());
            }
            if start < self.warmup_epochs || start >= self.epochs as f64 {
                return usage(format!(
                    "--lr-decay-start {} must be from --warmup-epochs {} to below --epochs {}",
                    fmt_decimals(start, 3),
                    fmt_decimals(self.warmup_epochs, 3),
                    self.epochs
                ));
            }
        }
        let adam = matches!(self.optimizer, OptimizerKind::Adamw | OptimizerKind::Radam);
        if adam && self.nesterov {
            return usage(
                "--nesterov is SGD's momentum: --optimizer adamw and radam have none".into(),
            );
        }
        if adam && self.momentum >= 1.0 {
            return usage(format!(
                "--momentum {} is --optimizer {}'s β1: it must be below 1",
                self.momentum,
                self.optimizer
                    .to_possible_value()
                    .expect("no variant is skipped")
                    .get_name()
            ));
        }
        if !adam && (self.beta2.is_some() || self.opt_eps.is_some()) {
            return usage("--beta2 and --opt-eps are for --optimizer adamw or radam".into());
        }
        if !self.lookahead && (self.lookahead_k.is_some() || self.lookahead_alpha.is_some()) {
            return usage("--lookahead-k and --lookahead-alpha are for --lookahead".into());
        }
        if self.mllog.is_some() && (adam || self.lookahead) {
            return usage(
                "--mllog logs MLPerf's ResNet-50 optimizers, SGD or LARS: not with --optimizer adamw, radam or \
                 --lookahead"
                    .into(),
            );
        }
        self.crop.check()?;
        if self.augment == Augment::Cifar && !self.crop.is_default() {
            return usage(
                "--scale and --ratio are RandomResizedCrop's, not --augment cifar's".into(),
            );
        }
        self.augmentation.check()?;
        if self.dummy
            && (!self.augmentation.train_augment().is_none()
                || self.ra_reps > 1
                || !self.crop.is_default())
        {
            return usage(
                "--scale, --ratio, --auto-augment, --random-erase and --ra-reps act on the loader's images: --dummy has none".into(),
            );
        }
        if self.ema_steps > 1 && self.ema.is_none() {
            return usage("--ema-steps is for --ema DECAY".into());
        }
        let (resize, crop) = self.val_sizes();
        if crop.0 > resize.0 {
            return usage(format!(
                "--val-crop {}{} is larger than --val-resize {}: the crop is taken from the resized image",
                crop.0,
                match crop.1 {
                    ValSize::Given => String::new(),
                    _ => format!(" (the default: --image-size {})", self.image_size),
                },
                resize.0
            ));
        }
        if let Some(min) = self.min_res {
            if min > self.image_size {
                return usage(format!(
                    "--min-res {min} is larger than --image-size {}, where progressive resizing ends",
                    self.image_size
                ));
            }
            let end = self.end_ramp_epoch();
            if end < self.start_ramp {
                let default = if self.end_ramp.is_none() {
                    " (85% of --epochs)"
                } else {
                    ""
                };
                return usage(format!(
                    "--end-ramp {end}{default} is before --start-ramp {}",
                    self.start_ramp
                ));
            }
        }
        // Batch norm in training needs more than one value per channel (PyTorch refuses: "Expected more than 1
        // value per channel when training"). One image whose last stage is 1x1 gave NaN running variances.
        let mut net = ResNetConfig::new(self.arch);
        net.width = self.width;
        net.check_width().map_err(UsageError)?;
        if self.augment == Augment::Cifar {
            if self.arch.deep_stem() {
                return usage(format!(
                    "-a {}'s three-conv stem is for ImageNet-size images; --augment cifar uses the CIFAR stem \
                     (one 3x3 conv, no pooling): use -a {}",
                    self.arch,
                    Arch {
                        variant: Variant::B,
                        ..self.arch
                    }
                ));
            }
            net.stem = Stem::Cifar;
        }
        let smallest = self.min_res.unwrap_or(self.image_size);
        if let Some(crop) = self.val_crop {
            net.check_side(crop)
                .map_err(|e| UsageError(format!("--val-crop {crop}: -a {e}")))?;
        }
        let resolution = Resolution::of_args(self).map_err(|e| UsageError(format!("{e:#}")))?;
        for size in resolution.sizes(self.epochs) {
            let flag = match self.min_res {
                Some(_) => "--min-res to --image-size",
                None => "--image-size",
            };
            net.check_side(size)
                .map_err(|e| UsageError(format!("training at {size} px ({flag}): -a {e}")))?;
        }
        let side = net.last_stage_side(smallest);
        if !self.evaluate && self.batch_size * side * side < 2 {
            return usage(format!(
                "--batch-size {} with {smallest} px images leaves batch norm one value per channel (the last \
                 stage is {side}x{side}): its statistics would be NaN; use --batch-size 2 or more, or larger images",
                self.batch_size
            ));
        }
        let b = self.batch_size as u64;
        check_batch_bytes("--batch-size", b, "--image-size", self.image_size as u64)?;
        check_batch_bytes(
            "--batch-size",
            b,
            "--val-crop",
            self.val_sizes().1 .0 as u64,
        )
    }

    /// The optimizer the flags ask for, with PyTorch's defaults for what they leave out (β2 0.999, ε 1e-8) and
    /// fast.ai's and timm's for Lookahead (k 6, α 0.5).
    pub fn optimizer_config(&self) -> OptimizerConfig {
        let kind = match self.optimizer {
            OptimizerKind::Adamw => Some(AdamKind::Adamw),
            OptimizerKind::Radam => Some(AdamKind::Radam),
            OptimizerKind::Sgd | OptimizerKind::Lars => None,
        };
        OptimizerConfig {
            momentum: self.momentum,
            weight_decay: self.wd,
            nesterov: self.nesterov,
            no_bn_bias_decay: self.no_bn_wd,
            lars_eta: (self.optimizer == OptimizerKind::Lars).then_some(self.lars_eta),
            adam: kind.map(|kind| AdamConfig {
                kind,
                beta2: self.beta2.unwrap_or(0.999),
                eps: self.opt_eps.unwrap_or(1e-8),
            }),
            lookahead: self.lookahead.then(|| LookaheadConfig {
                k: self.lookahead_k.unwrap_or(6),
                alpha: self.lookahead_alpha.unwrap_or(0.5),
            }),
        }
    }

    /// The resize and center crop the run evaluates with (and records with its weights), and where each came
    /// from: the flag, else the crop is --image-size (the final one with progressive resizing) and the resize
    /// the crop / 0.875 (torchvision's 224 → 256; timm's crop_pct). `--augment cifar` evaluates on the images as
    /// they are.
    pub fn val_sizes(&self) -> ((usize, ValSize), (usize, ValSize)) {
        if self.augment == Augment::Cifar {
            return (
                (self.image_size, ValSize::Cifar),
                (self.image_size, ValSize::Cifar),
            );
        }
        let crop = match self.val_crop {
            Some(c) => (c, ValSize::Given),
            None => (self.image_size, ValSize::FromTraining),
        };
        let resize = match self.val_resize {
            Some(r) => (r, ValSize::Given),
            None => (
                (crop.0 as f64 / VAL_CROP_SHARE).round() as usize,
                ValSize::FromTraining,
            ),
        };
        (resize, crop)
    }

    /// What the start line says of the evaluation's sizes: which, and why.
    pub fn val_sizes_line(&self) -> String {
        let ((resize, r), (crop, c)) = self.val_sizes();
        let why = match (r, c) {
            (ValSize::Cifar, _) => "the images as they are, --augment cifar".to_string(),
            (ValSize::Given, ValSize::Given) => "--val-resize and --val-crop".into(),
            (ValSize::FromTraining, ValSize::Given) => "--val-crop, and the resize from it / 0.875".into(),
            (ValSize::Given, _) => format!("--val-resize, and the crop the training's --image-size {}", self.image_size),
            _ => format!(
                "from --image-size {}: the crop it, the resize it / 0.875 as torchvision's 224/256; set \
                 --val-resize and --val-crop to evaluate otherwise",
                self.image_size
            ),
        };
        format!("evaluates at resize {resize} then center crop {crop} ({why})")
    }
}

/// The share of the resized image that evaluation's center crop keeps: torchvision's 224 of 256 (timm's
/// crop_pct), which sizes the evaluation from --image-size when --val-resize is not given.
pub const VAL_CROP_SHARE: f64 = 0.875;

/// Where an evaluation size of `rn50 train` came from ([`TrainArgs::val_sizes`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValSize {
    /// --val-resize or --val-crop.
    Given,
    /// Sized from --image-size.
    FromTraining,
    /// --augment cifar: the images as they are.
    Cifar,
}

/// `submission_division`: the rules a result is compared under.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Division {
    /// The reference's model, optimizer and hyperparameter rules (LARS or SGD with MLPerf's polynomial decay).
    #[default]
    Closed,
    /// Any model, optimizer or schedule; the same data and quality target.
    Open,
}

/// `submission_status`: how available the system is (the values of the checker's 4.0.0 ruleset).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SubmissionStatus {
    /// Available: can be bought and run on premises.
    #[default]
    Onprem,
    /// Available: can be rented in a cloud.
    Cloud,
    /// Available within 180 days of the results' publication.
    Preview,
    /// Research, development or internal.
    Research,
}

/// The log's submission fields (`submission_org`, `_platform`, `_division`, `_status`) and `cache_clear`: what
/// MLCommons' compliance checker requires of a result log besides the run itself. All need --mllog.
#[derive(Args, Debug, Clone, Default, Serialize)]
pub struct MlperfArgs {
    /// --mllog's submission_org: the submitting organisation, as MLPerf's results name it (MLPerf's scripts take it
    /// from MLPERF_SUBMISSION_ORG). Not empty. The compliance checker requires it: without it the log is no result.
    #[arg(long, value_name = "NAME", requires = "mllog", value_parser = not_blank)]
    pub submission_org: Option<String>,
    /// --mllog's submission_platform: the system, named as its systems/NAME.json in the submission (e.g. 1xDGX-H100;
    /// MLPerf's scripts: MLPERF_SUBMISSION_PLATFORM, prefixed with the node count). Not empty. The compliance
    /// checker requires it.
    #[arg(long, value_name = "NAME", requires = "mllog", value_parser = not_blank)]
    pub submission_platform: Option<String>,
    /// --mllog's submission_division: closed (MLPerf's reference model and hyperparameter rules, LARS or SGD with
    /// its polynomial decay: results compared like for like) or open (any model or optimizer; same data and
    /// target) [default: closed, as MLPerf's reference scripts log].
    #[arg(long, value_enum, requires = "mllog")]
    pub submission_division: Option<Division>,
    /// --mllog's submission_status: onprem or cloud (available to buy or rent), preview (available within 180 days
    /// of publication) or research (research, development or internal) [default: onprem, as MLPerf's reference
    /// scripts log].
    #[arg(long, value_enum, requires = "mllog")]
    pub submission_status: Option<SubmissionStatus>,
    /// Before the run, write dirty pages back (sync) and drop the page cache, dentries and inodes (3 into
    /// /proc/sys/vm/drop_caches), as MLPerf's submission scripts do before each run on every node: the run reads
    /// its data from storage, not from memory a previous run filled. The first process of each node drops that
    /// node's cache. Needs root (an error otherwise, before anything is written). Logged as cache_clear true;
    /// without it cache_clear is false.
    #[arg(long, requires = "mllog")]
    pub drop_caches: bool,
}

/// clap's parser of a name that must say something: not empty, not only spaces.
fn not_blank(s: &str) -> Result<String, String> {
    match s.trim().is_empty() {
        true => Err("must not be empty".into()),
        false => Ok(s.to_string()),
    }
}

impl MlperfArgs {
    /// What keeps --mllog's log from being a result MLPerf accepts, as flags to add (for the warning at the
    /// start), with `logged` the keys the log has already (a job script's `cache_clear`); empty when nothing does.
    pub fn missing(&self, logged: &[String]) -> Vec<&'static str> {
        let mut missing = Vec::new();
        if self.submission_org.is_none() {
            missing.push("--submission-org (the checker requires submission_org)");
        }
        if self.submission_platform.is_none() {
            missing.push("--submission-platform (the checker requires submission_platform)");
        }
        if !self.drop_caches && !logged.iter().any(|k| k == "cache_clear") {
            missing.push("--drop-caches (submissions clear the page cache before each run; cache_clear is false)");
        }
        missing
    }
}

/// `rn50 train`'s arguments parsed from `flags` (split at whitespace), for unit tests.
#[cfg(test)]
pub(crate) fn parse_for_test(flags: &str) -> Result<TrainArgs, clap::Error> {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        train: TrainArgs,
    }
    let words = std::iter::once("train").chain(flags.split_whitespace());
    Cli::try_parse_from(words).map(|c| c.train)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn evaluated(flags: &str) -> Vec<usize> {
        let args = parse_for_test(&format!("--dummy {flags}")).unwrap();
        (0..args.epochs).filter(|&e| args.evaluates(e)).collect()
    }

    #[test]
    fn evaluated_epochs_follow_eval_every_and_offset_and_include_the_last() {
        assert_eq!(
            evaluated("--epochs 4"),
            [0, 1, 2, 3],
            "every epoch by default"
        );
        // MLPerf's eval_period 4, eval_offset 3: 0-based 3, 7 (1-based 4, 8), and the last, 9.
        assert_eq!(
            evaluated("--epochs 10 --eval-every 4 --eval-offset 3"),
            [3, 7, 9]
        );
        assert_eq!(evaluated("--epochs 10 --eval-every 4"), [0, 4, 8, 9]);
        assert_eq!(
            evaluated("--epochs 10 --eval-every 3 --eval-offset 8"),
            [8, 9]
        );
        assert_eq!(
            evaluated("--epochs 3 --eval-offset 20"),
            [2],
            "only the last"
        );
    }

    /// --lr-decay-start only with flat-cos, from the warmup's end to below the last epoch; timm's variants
    /// refused where they cannot run: the deep stem with the CIFAR stem, the blur on maps under 2 px, fast.ai's
    /// max-blur pool where a shortcut's input is odd, at any size the run trains or evaluates at.
    #[test]
    fn flat_cos_and_the_variants_in_range() {
        let error = |flags: &str| {
            parse_for_test(&format!("--dummy {flags}"))
                .unwrap()
                .check()
                .err()
                .map(|e| e.0)
        };
        assert_eq!(
            error("--lr-schedule flat-cos --epochs 5 --lr-decay-start 3"),
            None
        );
        assert_eq!(
            error("--lr-schedule flat-cos --epochs 5 --warmup-epochs 1 --lr-decay-start 1"),
            None
        );
        for (flags, want) in [
            (
                "--epochs 5 --lr-decay-start 3",
                "is for --lr-schedule flat-cos",
            ),
            (
                "--lr-schedule flat-cos --epochs 5 --lr-decay-start 5",
                "to below --epochs 5",
            ),
            (
                "--lr-schedule flat-cos --epochs 5 --warmup-epochs 2 --lr-decay-start 1",
                "from --warmup-epochs 2",
            ),
            (
                "-a resnet18d --augment cifar --image-size 32",
                "use -a resnet18",
            ),
            (
                "-a resnetblur18 --val-crop 16",
                "16 px images leave it 1 px",
            ),
            ("-a resnext50_32x4d --width 15", "use --width 16 or more"),
            ("-a resnext50_32x8d --width 7", "use --width 8 or more"),
            (
                "-a resnet50d_maxblur --image-size 72",
                "training at 72 px (--image-size): -a resnet50d_maxblur halves the stem's output and each strided \
                 shortcut's input with fast.ai's max-blur pool, which needs each 3 px or more and a shortcut's \
                 even: 72 px images give 36, 18, 9, 4 px; use a multiple of 32, 64 or more",
            ),
            // The ramp's first size: 80 px gives a 5 px shortcut input.
            (
                "-a resnet50d_maxblur --image-size 128 --min-res 80 --epochs 10",
                "training at 80 px (--min-res to --image-size)",
            ),
            (
                "-a resnet50d_maxblur --image-size 128 --val-crop 112",
                "--val-crop 112: -a resnet50d_maxblur",
            ),
            ("-a resnet18_maxblur --val-crop 4", "use 5 px or more"),
        ] {
            let got = error(flags).unwrap_or_else(|| panic!("{flags}: accepted"));
            assert!(got.contains(want), "{flags}: {got}");
        }
        assert_eq!(error("-a resnetblur18 --image-size 32 --val-crop 17"), None);
        assert_eq!(error("-a resnet18 --val-crop 8"), None);
        assert_eq!(error("-a seresnext50d_32x4d --width 16"), None);
        assert_eq!(error("-a resnet50d_maxblur --image-size 128"), None);
        assert_eq!(
            error("-a resnet50d_maxblur --image-size 192 --min-res 96 --epochs 16 --val-crop 224"),
            None
        );
        assert_eq!(error("-a resnet18_maxblur --image-size 70"), None);
        assert_eq!(
            error("-a resnetblur18 --augment cifar --image-size 32"),
            None
        );
    }

    /// one-cycle needs a rise (--warmup-epochs above 0) and momentum cycling down (--base-momentum at most
    /// --momentum); --div-factor and --base-momentum are its own, and out of range is clap's exit 2.
    #[test]
    fn one_cycle_in_range() {
        let error = |flags: &str| {
            parse_for_test(&format!("--dummy {flags}"))
                .map_err(|e| e.to_string())
                .and_then(|a| a.check().map_err(|e| e.0))
                .err()
        };
        for ok in [
            "--lr-schedule one-cycle --epochs 5 --warmup-epochs 1.25",
            "--lr-schedule one-cycle --epochs 5 --warmup-epochs 1 --momentum 0.95 --base-momentum 0.85 --div-factor 10 --lr-end 0.0001",
            "--lr-schedule one-cycle --epochs 5 --warmup-epochs 1 --momentum 0.9 --base-momentum 0.9 --div-factor 1",
        ] {
            assert_eq!(error(ok), None, "{ok}");
        }
        for (flags, want) in [
            (
                "--lr-schedule one-cycle --epochs 10",
                "is --warmup-epochs 3",
            ),
            (
                "--lr-schedule one-cycle --epochs 5 --warmup-epochs 1 --momentum 0.8",
                "--base-momentum 0.85 must be at most --momentum 0.8",
            ),
            (
                "--lr-schedule cosine --base-momentum 0.85",
                "are for --lr-schedule one-cycle",
            ),
            ("--div-factor 25", "are for --lr-schedule one-cycle"),
            (
                "--lr-schedule one-cycle --epochs 5 --warmup-epochs 1 --div-factor 0.5",
                "--div-factor",
            ),
            (
                "--lr-schedule one-cycle --epochs 5 --warmup-epochs 1 --base-momentum=-0.1",
                "--base-momentum",
            ),
        ] {
            let got = error(flags).unwrap_or_else(|| panic!("{flags}: accepted"));
            assert!(got.contains(want), "{flags}: {got}");
        }
    }

    #[test]
    fn lr_end_is_for_the_schedules_that_use_it() {
        let check = |flags: &str| {
            parse_for_test(&format!("--dummy {flags}"))
                .unwrap()
                .check()
                .is_ok()
        };
        assert!(check("--lr-schedule poly --lr-end 0.0001"));
        assert!(check("--lr-schedule cosine --lr-end 0.0001"));
        assert!(!check("--lr-schedule linear --lr-end 0.0001"));
        assert!(check("--lr-schedule flat-cos --lr-end 0.0001"));
        assert!(!check("--lr-end 0.0001"), "step");
        let target = |v: &str| parse_for_test(&format!("--dummy --target-accuracy {v}")).is_ok();
        assert!(target("75.9") && target("100"));
        assert!(!target("0") && !target("100.1") && !target("nan"));
    }
}
