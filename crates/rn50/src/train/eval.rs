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
use crate::model::weights::{EvalTransform, Interpolation, WeightsFile};
use crate::model::{Arch, Model, ResNetConfig};
use crate::step::normalize::{IMAGENET_MEAN, IMAGENET_STD};
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

/// One evaluation of a training run: the trained weights', and with --ema their average's on the same images.
pub struct Evaluated {
    pub model: EvalResult,
    pub ema: Option<EvalResult>,
}

impl Evaluated {
    /// The better top-1 of the two (NaN without a dataset): what --target-accuracy and MLPerf's eval_accuracy
    /// judge, as either weights file reaches it.
    pub fn best_acc1(&self) -> f64 {
        // f64::max keeps the number when one of the two is NaN.
        let ema = self.ema.as_ref().map_or(f64::NAN, |e| e.acc1);
        self.model.acc1.max(ema)
    }
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
/// as `progress`; its unreadable images are counted. The images are normalised with ImageNet's mean and std.
pub fn evaluate(
    model: &Model,
    pass: Epoch,
    precision: Precision,
    channels_last: bool,
    progress: EvalProgress,
) -> Result<EvalResult> {
    let norm = Normalizer::new(model.device(), channels_last);
    evaluate_with(model, pass, precision, norm, progress)
}

/// [`evaluate`], the images normalised by `norm`.
pub fn evaluate_with(
    model: &Model,
    pass: Epoch,
    precision: Precision,
    mut norm: Normalizer,
    mut progress: EvalProgress,
) -> Result<EvalResult> {
    let device = model.device();
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
    /// Weights to evaluate: safetensors with torchvision's keys (from `rn50 train`: best/final.safetensors or a
    /// checkpoint) or a torch.save file (torchvision's .pth, pytorch/examples' checkpoint.pth.tar), told apart by
    /// content.
    #[arg(long)]
    pub weights: PathBuf,
    /// Model architecture [default: the one recorded with the weights, else resnet50].
    #[arg(short = 'a', long = "arch", value_parser = clap::value_parser!(Arch))]
    pub arch: Option<Arch>,
    /// Batch size, 1 to 65536; batch x crop² x 3 bytes at most 16 GiB.
    #[arg(short = 'b', long = "batch-size", default_value_t = 64, value_parser = usize_in(1..=rn50_args::MAX_BATCH))]
    pub batch_size: usize,
    /// Decode threads, 1 to 1024 [default: the CPUs this process may use].
    #[arg(short = 'j', long = "workers", value_parser = usize_in(1..=rn50_args::MAX_THREADS))]
    pub workers: Option<usize>,
    #[command(flatten)]
    pub pixel_limit: rn50_pipeline::cli::PixelLimit,
    #[command(flatten)]
    pub sizes: ValSizeArgs,
    #[command(flatten)]
    pub compute: ComputeArgs,
    /// Progress: a line every N batches (at least 1) when stderr is not a terminal (a bar when it is).
    #[arg(short = 'p', long = "print-freq", default_value_t = 10, value_parser = usize_in(1..))]
    pub print_freq: usize,
    /// Write the result as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// The evaluation transform's sizes of `rn50 eval` and `rn50 classify`, named as `rn50 train` names them
/// (`--resize`/`--crop` and torchvision's `--val-resize-size`/`--val-crop-size` say the same). Without them, the
/// sizes the weights record, else torchvision's 256 → 224.
#[derive(Args, Debug, Clone, Default)]
pub struct ValSizeArgs {
    /// Resize the shorter side to this, 1 to 4096 pixels, then center-crop --val-crop [default: the size recorded
    /// with the weights, else 256].
    #[arg(long, aliases = ["resize", "val-resize-size"], value_parser = usize_in(1..=rn50_args::MAX_IMAGE_SIZE))]
    pub val_resize: Option<usize>,
    /// Center crop, 1 to --val-resize pixels [default: the size recorded with the weights, else 224].
    #[arg(long, aliases = ["crop", "val-crop-size"], value_parser = usize_in(1..=rn50_args::MAX_IMAGE_SIZE))]
    pub val_crop: Option<usize>,
}

/// The evaluation sizes of weights that record none: torchvision's (and `rn50 train`'s defaults).
const DEFAULT_RESIZE: usize = 256;
const DEFAULT_CROP: usize = 224;

/// The evaluation transform `rn50 train` records with its weights: `resize` then `crop`, ImageNet's mean and
/// std, as its loader and [`Normalizer`] apply them.
pub fn imagenet_transform(resize: usize, crop: usize) -> EvalTransform {
    EvalTransform {
        resize,
        crop,
        interpolation: Interpolation::Bilinear,
        mean: IMAGENET_MEAN,
        std: IMAGENET_STD,
    }
}

/// Where a setting of `eval`, `classify` or `export` came from, as their first line says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    /// The flag given.
    Flag(&'static str),
    /// The weights' metadata.
    Recorded,
    Default,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Flag(flag) => f.write_str(flag),
            Origin::Recorded => f.write_str("recorded"),
            Origin::Default => f.write_str("default"),
        }
    }
}

/// A size and where it came from.
type Size = (usize, Origin);

/// The flag's value, else the recorded one, else the default.
fn pick<T>(flag: Option<T>, name: &'static str, recorded: Option<T>, default: T) -> (T, Origin) {
    match (flag, recorded) {
        (Some(v), _) => (v, Origin::Flag(name)),
        (None, Some(v)) => (v, Origin::Recorded),
        (None, None) => (default, Origin::Default),
    }
}

impl ValSizeArgs {
    /// What the flags alone say is wrong, before any file is read (exit 2): a crop larger than its resize, and
    /// for `rn50 eval` a batch of `batch_size` crops too large.
    pub(crate) fn check(&self, batch_size: Option<usize>) -> Result<(), UsageError> {
        let resize = self.val_resize.map(|v| (v, Origin::Flag("--val-resize")));
        let crop = self.val_crop.map(|v| (v, Origin::Flag("--val-crop")));
        if let (Some(resize), Some(crop)) = (resize, crop) {
            check_crop(resize, crop)?;
        }
        match (batch_size, crop) {
            (Some(b), Some(crop)) => check_batch(b, crop),
            _ => Ok(()),
        }
    }
}

/// `resize` then a center crop of `crop`: the crop must fit (exit 2 otherwise).
fn check_crop((resize, resize_from): Size, (crop, crop_from): Size) -> Result<(), UsageError> {
    if crop > resize {
        return Err(UsageError::new(format!(
            "{} {crop} is larger than {} {resize}: the crop is taken from the resized image",
            size_name("crop", crop_from),
            size_name("resize", resize_from)
        )));
    }
    Ok(())
}

/// `rn50 eval`'s batch of `batch_size` crops fits in memory (exit 2 otherwise).
fn check_batch(batch_size: usize, (crop, from): Size) -> Result<(), UsageError> {
    check_batch_bytes(
        "--batch-size",
        batch_size as u64,
        &size_name("crop", from),
        crop as u64,
    )
}

/// A size as an error names it: its flag, or "the recorded crop".
fn size_name(what: &str, from: Origin) -> String {
    match from {
        Origin::Flag(flag) => flag.to_string(),
        Origin::Recorded => format!("the recorded {what}"),
        Origin::Default => format!("the default {what}"),
    }
}

/// How saved weights run in `eval`, `classify` and `export`: the network and the evaluation transform, each from
/// its flag, else from what the weights record ([`crate::model::weights::Recorded`]), else torchvision's
/// (ResNet-50, 256 → 224, ImageNet's mean and std). Width, stem and classes are the tensors'.
pub(crate) struct Inference {
    pub arch: Arch,
    pub transform: EvalTransform,
    /// The side of the training images, where recorded.
    pub image_size: Option<usize>,
    /// What is used and where each came from, for the command's first line.
    pub used: String,
    crop_from: Origin,
}

impl Inference {
    /// The settings for `file` under the flags `arch` and `sizes`; a crop larger than its resize is an error
    /// (exit 2) naming where each came from.
    pub(crate) fn new(file: &WeightsFile, arch: Option<Arch>, sizes: &ValSizeArgs) -> Result<Self> {
        let recorded = file.recorded();
        let eval = recorded.eval.as_ref();
        let (arch, arch_from) = pick(arch, "-a", recorded.net.map(|n| n.arch), Arch::ResNet50);
        let resize = pick(
            sizes.val_resize,
            "--val-resize",
            eval.map(|e| e.resize),
            DEFAULT_RESIZE,
        );
        let crop = pick(
            sizes.val_crop,
            "--val-crop",
            eval.map(|e| e.crop),
            DEFAULT_CROP,
        );
        check_crop(resize, crop)?;
        let transform = EvalTransform {
            resize: resize.0,
            crop: crop.0,
            ..eval
                .copied()
                .unwrap_or(imagenet_transform(resize.0, crop.0))
        };
        let stats_from = match eval {
            Some(_) => Origin::Recorded,
            None => Origin::Default,
        };
        let shape = file.shape()?;
        let mut used = format!(
            "{arch} ({arch_from}; width {}, {:?} stem, {} classes), resize {} ({}) then center crop {} ({}), \
             {:?}, mean {:?} std {:?} ({stats_from})",
            shape.width,
            shape.stem,
            shape.num_classes,
            resize.0,
            resize.1,
            crop.0,
            crop.1,
            transform.interpolation,
            transform.mean,
            transform.std,
        );
        if let Some(side) = recorded.image_size {
            used += &format!("; trained at {side} px");
        }
        Ok(Self {
            arch,
            transform,
            image_size: recorded.image_size,
            used,
            crop_from: crop.1,
        })
    }

    /// The sizes' check of `rn50 eval`'s batch (exit 2), naming where the crop came from.
    fn check_batch(&self, batch_size: usize) -> Result<(), UsageError> {
        check_batch(batch_size, (self.transform.crop, self.crop_from))
    }
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
    args.sizes.check(Some(args.batch_size))?;
    // The validation split of DATA (val/, validation/, test/, or WebDataset shards named for it), else DATA.
    let dataset = Dataset::open_split_or_whole(&args.data, args.val_split.split())?;
    let file = WeightsFile::read(&args.weights)?;
    let run = Inference::new(&file, args.arch, &args.sizes)?;
    run.check_batch(args.batch_size)?;
    let what = dataset.description().to_string();
    check_classes(&file, dataset.classes(), &what)?;
    tracing::info!("rn50 eval: {}", run.used);
    let (
        model,
        Compute {
            device,
            precision,
            channels_last,
            cpu,
            ..
        },
    ) = load_for_inference(run.arch, &file, &args.compute)?;
    drop(file);
    let t = run.transform;
    let workers = args.workers.unwrap_or(cpu.logical_cores).max(1);
    let loader_cfg = LoaderConfig {
        transform: Transform::val(t.resize, t.crop),
        max_image_pixels: args.pixel_limit.max_image_pixels,
        ..LoaderConfig::val(args.batch_size, workers)
    };
    let loader = Loader::new(dataset, loader_cfg)?;
    let pass = loader.epoch(0, 0);
    let progress = EvalProgress::new("eval".into(), pass.remaining(), 1, true, args.print_freq);
    let norm = Normalizer::with_stats(device, channels_last, t.mean, t.std);
    let r = evaluate_with(&model, pass, precision, norm, progress)?;
    println!(
        "eval {} on {} ({}, {precision}): Acc@1 {:.3}  Acc@5 {:.3}  ({} images, {} unreadable, {:.1} img/s)",
        run.arch,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// --target-accuracy judges the better of the trained weights and their EMA; a NaN (no dataset) is no score.
    #[test]
    fn the_better_of_the_weights_and_their_average() {
        let r = |acc1| EvalResult {
            acc1,
            ..EvalResult::default()
        };
        let best = |model, ema: Option<f64>| {
            Evaluated {
                model: r(model),
                ema: ema.map(r),
            }
            .best_acc1()
        };
        assert_eq!(best(40.0, None), 40.0);
        assert_eq!(best(40.0, Some(60.0)), 60.0);
        assert_eq!(best(70.0, Some(60.0)), 70.0);
        assert_eq!(best(f64::NAN, Some(12.0)), 12.0);
        assert!(best(f64::NAN, None).is_nan());
    }
}
