//! Evaluation: every image of a dataset exactly once (Resize + CenterCrop), top-1/top-5, normalised on the
//! device, BN in eval mode, under the chosen precision.
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use rn50_args::usize_in;
use rn50_pipeline::{Dataset, Epoch, Loader, LoaderConfig, Transform};
use serde::Serialize;
use tch::Tensor;

use crate::device::{device_name, Compute, ComputeArgs};
use crate::infer::{load_for_inference, Inference, ValSizeArgs};
use crate::input::DeviceBatch;
use crate::model::weights::WeightsFile;
use crate::model::{Arch, Model};
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
    pub dct: rn50_pipeline::cli::DctScalingArg,
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
        dct_scaling: args.dct.dct_scaling,
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
