//! Evaluation: every image of a dataset exactly once (Resize + CenterCrop), top-1/top-5, normalised on the
//! device, BN in eval mode, under the chosen precision.
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use rn50_args::{check_batch_bytes, usize_in, UsageError};
use rn50_pipeline::{Dataset, Epoch, Loader, LoaderConfig, Transform};
use serde::Serialize;
use tch::Tensor;

use crate::device::{device_name, Compute, ComputeArgs};
use crate::input::DeviceBatch;
use crate::model::weights::WeightsFile;
use crate::model::{Arch, Model, ResNetConfig};
use crate::step::{Normalizer, Precision};
use crate::train::metrics::Accuracy;
use crate::train::progress::EvalProgress;

#[derive(Clone, Debug, Default, Serialize)]
pub struct EvalResult {
    pub acc1: f64,
    pub acc5: f64,
    /// Counts behind the percentages (summed over ranks in a data-parallel run).
    pub correct1: u64,
    pub correct5: u64,
    /// Mean cross-entropy over the images (all ranks).
    pub loss: f64,
    pub images: u64,
    pub bad_images: u64,
    pub seconds: f64,
    pub images_per_sec: f64,
}

impl EvalResult {
    /// This rank's counts summed with the other ranks' (each evaluated its own shard of the images).
    pub fn all_ranks(mut self, dist: &rn50_distributed::DistContext) -> Result<Self> {
        let mut v = [
            self.correct1 as f64,
            self.correct5 as f64,
            self.images as f64,
            self.bad_images as f64,
            self.loss * self.images as f64,
        ];
        dist.sum_f64(&mut v, "summing evaluation counts")?;
        let n = v[2].max(1.0);
        self.loss = v[4] / n;
        self.correct1 = v[0] as u64;
        self.correct5 = v[1] as u64;
        self.images = v[2] as u64;
        self.bad_images = v[3] as u64;
        self.acc1 = 100.0 * v[0] / n;
        self.acc5 = 100.0 * v[1] / n;
        self.images_per_sec = v[2] / self.seconds.max(1e-9);
        Ok(self)
    }
}

/// Runs `model` over `pass`, one pass of a loader (queued beforehand, so it may already be decoding), shown
/// as `progress`; its unreadable images are counted.
pub fn evaluate(
    model: &Model,
    pass: Epoch,
    precision: Precision,
    channels_last: bool,
    mut progress: EvalProgress,
) -> Result<EvalResult> {
    let device = model.device();
    let mut norm = Normalizer::new(device, channels_last);
    let mut acc = Accuracy::new(device);
    let start = Instant::now();
    let mut bad_images = 0;
    for (i, batch) in pass.enumerate() {
        let b = batch?;
        bad_images += b.skipped() as u64;
        progress.batch(i, b.n());
        if b.n() == 0 {
            continue;
        }
        let batch = DeviceBatch::new(b, device)?;
        let x = norm.normalize(&batch.images);
        let labels = batch.labels.shallow_clone();
        let logits = tch::no_grad(|| -> Result<Tensor> {
            let _autocast = precision.autocast(device)?;
            Ok(model.forward_t(&x, false))
        })?;
        acc.add(&logits, &labels);
    }
    progress.finish();
    let (acc1, acc5) = acc.percent();
    let (correct1, correct5) = acc.counts();
    let seconds = start.elapsed().as_secs_f64();
    Ok(EvalResult {
        acc1,
        acc5,
        correct1,
        correct5,
        loss: acc.loss_sum() / acc.images.max(1) as f64,
        images: acc.images,
        bad_images,
        seconds,
        images_per_sec: acc.images as f64 / seconds.max(1e-9),
    })
}

/// Evaluate saved weights on a validation set.
#[derive(Args, Debug, Clone)]
pub struct EvalArgs {
    /// The data: a folder with `val/` (or `validation/`, `test/`; ImageFolder layout, packed or WebDataset
    /// shards), timm's `*-validation-NNNN.tar` or the Hub's `data/validation-*.parquet`, or the validation
    /// data itself.
    pub data: PathBuf,
    #[command(flatten)]
    pub val_split: rn50_pipeline::cli::ValSplitArg,
    /// Weights to evaluate: safetensors with torchvision's keys (from `rn50 train`) or a torch.save file
    /// (torchvision's .pth, pytorch/examples' checkpoint.pth.tar), told apart by content.
    #[arg(long)]
    pub weights: PathBuf,
    /// Model architecture.
    #[arg(short = 'a', long = "arch", default_value = "resnet50", value_parser = clap::value_parser!(Arch))]
    pub arch: Arch,
    /// Batch size, 1 to 65536; batch x crop² x 3 bytes at most 16 GiB.
    #[arg(short = 'b', long = "batch-size", default_value_t = 64, value_parser = usize_in(1..=rn50_args::MAX_BATCH))]
    pub batch_size: usize,
    /// Decode threads, 1 to 1024 [default: the CPUs this process may use].
    #[arg(short = 'j', long = "workers", value_parser = usize_in(1..=rn50_args::MAX_THREADS))]
    pub workers: Option<usize>,
    #[command(flatten)]
    pub pixel_limit: rn50_pipeline::cli::PixelLimit,
    /// Resize the shorter side to this, 1 to 4096 pixels, then center-crop `--crop`.
    #[arg(long, default_value_t = 256, value_parser = usize_in(1..=rn50_args::MAX_IMAGE_SIZE))]
    pub resize: usize,
    /// Center crop, 1 to --resize pixels.
    #[arg(long, default_value_t = 224, value_parser = usize_in(1..=rn50_args::MAX_IMAGE_SIZE))]
    pub crop: usize,
    #[command(flatten)]
    pub compute: ComputeArgs,
    /// Progress: a line every N batches (at least 1) when stderr is not a terminal (a bar when it is).
    #[arg(short = 'p', long = "print-freq", default_value_t = 10, value_parser = usize_in(1..))]
    pub print_freq: usize,
    /// Write the result as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// `--resize` then a center crop of `--crop`: the crop must fit (exit 2 otherwise).
pub(crate) fn check_crop(resize: usize, crop: usize) -> Result<(), UsageError> {
    if crop > resize {
        return Err(UsageError::new(format!(
            "--crop {crop} is larger than --resize {resize}: the crop is taken from the resized image"
        )));
    }
    Ok(())
}

/// A model of `arch` with the saved weights `file` (whose class count and width it takes), on the device
/// `compute` resolves, in the memory format it picks: what `rn50 eval`, `rn50 classify` and `rn50 export` run.
pub(crate) fn load_for_inference(
    arch: Arch,
    file: &WeightsFile,
    compute: &ComputeArgs,
) -> Result<(Model, Compute)> {
    let mut cfg = ResNetConfig::new(arch);
    file.shape()?.apply(&mut cfg);
    let c = compute.resolve(0, cfg.narrowest_conv())?;
    crate::device::setup(c.device, c.fused_bn, c.fused_block)?;
    let model = Model::new(cfg, c.device);
    file.load(&model)?;
    if c.channels_last {
        model.to_channels_last();
    }
    Ok((model, c))
}

/// The classes of the data `what` must be those the weights were trained on, in the same order, or labels
/// would not line up: as many, and the same names where the weights record theirs.
fn check_classes(file: &WeightsFile, data: &[String], what: &str) -> Result<()> {
    let classes = file.shape()?.num_classes;
    let path = file.path().display();
    if data.len() as i64 != classes {
        bail!(
            "{what} has {} classes but {path} was trained for {classes}: labels would not line up",
            data.len(),
        );
    }
    let names = file.classes().unwrap_or_default();
    if let Some(i) = names.iter().zip(data).position(|(a, b)| a != b) {
        bail!(
            "{what}'s class {i} is {:?} but {path} was trained with {:?} there: labels would not line up",
            data[i],
            names[i]
        );
    }
    Ok(())
}

/// `rn50 eval`.
pub fn run(args: &EvalArgs) -> Result<()> {
    check_crop(args.resize, args.crop)?;
    check_batch_bytes(
        "--batch-size",
        args.batch_size as u64,
        "--crop",
        args.crop as u64,
    )?;
    // The validation split of DATA (val/, validation/, test/, or WebDataset shards named for it), else DATA.
    let dataset = Dataset::open_split_or_whole(&args.data, args.val_split.split())?;
    let file = WeightsFile::read(&args.weights)?;
    let what = dataset.description().to_string();
    check_classes(&file, dataset.classes(), &what)?;
    let (
        model,
        Compute {
            device,
            precision,
            channels_last,
            cpu,
            ..
        },
    ) = load_for_inference(args.arch, &file, &args.compute)?;
    drop(file);
    let workers = args.workers.unwrap_or(cpu.logical_cores).max(1);
    let loader_cfg = LoaderConfig {
        transform: Transform::val(args.resize, args.crop),
        max_image_pixels: args.pixel_limit.max_image_pixels,
        ..LoaderConfig::val(args.batch_size, workers)
    };
    let loader = Loader::new(dataset, loader_cfg)?;
    let pass = loader.epoch(0, 0);
    let progress = EvalProgress::new("eval".into(), pass.remaining(), 1, true, args.print_freq);
    let r = evaluate(&model, pass, precision, channels_last, progress)?;
    println!(
        "eval {} on {} ({}, {precision}): Acc@1 {:.3}  Acc@5 {:.3}  ({} images, {} unreadable, {:.1} img/s)",
        args.arch,
        what,
        device_name(device),
        r.acc1,
        r.acc5,
        r.images,
        r.bad_images,
        r.images_per_sec
    );
    if let Some(p) = &args.json {
        std::fs::write(p, serde_json::to_string_pretty(&r)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}
