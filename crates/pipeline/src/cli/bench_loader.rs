//! `rn50 bench-loader`: [`BenchLoaderArgs`] and [`run`].

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;
use rn50_args::{check_batch_bytes, usize_in, UsageError, MAX_BATCH, MAX_IMAGE_SIZE, MAX_THREADS};

use super::{
    default_workers, write_json, AugmentArgs, CropArgs, DctScalingArg, PixelLimit, TrainSplitArg,
    ValSplitArg,
};
use crate::loader::{BadImagePolicy, LoaderConfig};
use crate::source::Dataset;
use crate::synthetic::{self, SyntheticConfig};
use crate::transform::Transform;

/// Measure input-pipeline throughput: decode + augment into uint8 NHWC batches, no training.
///
/// Reports images/s, images/s per worker thread, per-image read/decode/augment time and the
/// number of undecodable images. DATA is an ImageFolder directory, packed shards, WebDataset shards, or
/// a dataset repository holding splits (its train split, with --val its validation split); use
/// --synthetic N instead for generated ImageNet-sized JPEGs.
#[derive(Args, Debug, Clone)]
pub struct BenchLoaderArgs {
    /// ImageFolder directory, shard directory or file, WebDataset shards (a directory, a .tar, or a
    /// pattern such as 'train-{0000..0099}.tar'), or a directory with train/ and val/ or timm-named
    /// shards (*-train-NNNN.tar, *-validation-NNNN.tar).
    #[arg(required_unless_present = "synthetic")]
    pub data: Option<PathBuf>,
    #[command(flatten)]
    pub train_split: TrainSplitArg,
    #[command(flatten)]
    pub val_split: ValSplitArg,
    /// Benchmark N synthetic JPEGs with ImageNet's size distribution (generated in memory), 1 to
    /// 100000.
    #[arg(long, value_name = "N", conflicts_with = "data", value_parser = usize_in(1..=rn50_args::MAX_SYNTHETIC_IMAGES))]
    pub synthetic: Option<usize>,
    /// With --synthetic: also write the images as an ImageFolder to DIR (for other loaders)
    /// and benchmark reading them from there.
    #[arg(long, value_name = "DIR", requires = "synthetic")]
    pub save_synthetic: Option<PathBuf>,
    /// Number of decode threads, 1 to 1024.
    #[arg(short = 'j', long = "workers", default_value_t = default_workers(), value_parser = usize_in(1..=MAX_THREADS))]
    pub workers: usize,
    /// Images per batch, 1 to 65536; batch x image size² x 3 bytes at most 16 GiB.
    #[arg(short = 'b', long = "batch-size", default_value_t = 256, value_parser = usize_in(1..=MAX_BATCH))]
    pub batch_size: usize,
    /// Timed batches (epochs repeat as needed), at least 1.
    #[arg(long, default_value_t = 20, value_parser = usize_in(1..))]
    pub steps: usize,
    /// Untimed batches first (thread start-up, page cache).
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    /// Use the evaluation transform (Resize + CenterCrop) instead of RandomResizedCrop + flip.
    #[arg(long)]
    pub val: bool,
    /// Output side length (train crop, or val center crop), 1 to 4096 pixels: `rn50 train` and `rn50 bench`
    /// name it the same.
    #[arg(long = "image-size", visible_alias = "size", default_value_t = 224, value_parser = usize_in(1..=MAX_IMAGE_SIZE))]
    pub image_size: usize,
    /// Shorter side before the center crop (with --val), --image-size to 4096 pixels.
    #[arg(long, default_value_t = 256, value_parser = usize_in(1..=MAX_IMAGE_SIZE))]
    pub val_resize: usize,
    #[command(flatten)]
    pub dct: DctScalingArg,
    /// Batches decoded ahead of the consumer, 1 to 2048 (default: 2 per worker).
    #[arg(long, value_parser = usize_in(1..=2 * MAX_THREADS))]
    pub prefetch: Option<usize>,
    /// Seed for shuffling and augmentation.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// What to do with images that cannot be decoded. With fail, any bad image decoded fails the
    /// command, also one in a batch decoded ahead of the last one timed.
    #[arg(long, value_enum, default_value_t = BadImagePolicy::Skip)]
    pub on_bad_image: BadImagePolicy,
    #[command(flatten)]
    pub crop: CropArgs,
    #[command(flatten)]
    pub augment: AugmentArgs,
    #[command(flatten)]
    pub pixel_limit: PixelLimit,
    /// Write the results as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

/// `rn50 bench-loader`.
pub fn run(cmd: &BenchLoaderArgs) -> Result<()> {
    // Each flag's own range is clap's; these go between flags, checked before anything is made.
    if cmd.val && cmd.image_size > cmd.val_resize {
        bail!(UsageError::new(format!(
            "--image-size {} is larger than --val-resize {}: the center crop is taken from the resized image",
            cmd.image_size, cmd.val_resize
        )));
    }
    if cmd.val && cmd.train_split.train_split.is_some() {
        bail!(UsageError::new(
            "--train-split is for the training split: not with --val"
        ));
    }
    if !cmd.val && cmd.val_split.val_split.is_some() {
        bail!(UsageError::new(
            "--val-split is for the validation split: with --val"
        ));
    }
    cmd.crop.check()?;
    cmd.augment.check()?;
    let augment = cmd.augment.train_augment();
    if cmd.val && !(augment.is_none() && cmd.crop.is_default()) {
        bail!(UsageError::new(
            "--scale, --ratio, --auto-augment and --random-erase are training augmentations: not with --val"
        ));
    }
    check_batch_bytes(
        "--batch-size",
        cmd.batch_size as u64,
        "--image-size",
        cmd.image_size as u64,
    )?;
    let dataset = match (&cmd.data, cmd.synthetic) {
        // A dataset repository's split (--val: its validation split), or DATA itself.
        (Some(path), _) => {
            let split = if cmd.val {
                cmd.val_split.split()
            } else {
                let train = cmd.train_split.split();
                crate::source::warn_if_training_on_validation(path, train, cmd.val_split.split());
                train
            };
            Dataset::open_split_or_whole(path, split)?
        }
        (None, Some(n)) => {
            let cfg = SyntheticConfig {
                seed: cmd.seed,
                ..SyntheticConfig::new(n)
            };
            match &cmd.save_synthetic {
                Some(dir) => {
                    synthetic::write_image_folder(dir, &cfg)?;
                    tracing::info!("wrote {n} synthetic JPEGs to {}", dir.display());
                    Dataset::open(dir)?
                }
                None => synthetic::dataset(&cfg)?,
            }
        }
        (None, None) => bail!("give DATA or --synthetic N"),
    };
    let transform = if cmd.val {
        Transform::val(cmd.val_resize, cmd.image_size)
    } else {
        cmd.crop.train_transform(cmd.image_size)
    };
    let base = if cmd.val {
        LoaderConfig::val(cmd.batch_size, cmd.workers)
    } else {
        LoaderConfig::train(cmd.batch_size, cmd.workers)
    };
    let config = LoaderConfig {
        transform,
        augment,
        seed: cmd.seed,
        prefetch: cmd.prefetch.unwrap_or(base.prefetch),
        on_bad_image: cmd.on_bad_image,
        dct_scaling: cmd.dct.dct_scaling,
        max_image_pixels: cmd.pixel_limit.max_image_pixels,
        ..base
    };
    tracing::info!(
        "bench-loader: {}, {} images, {} threads, batch {}, {} steps, {:?}",
        dataset.description(),
        dataset.len(),
        cmd.workers,
        cmd.batch_size,
        cmd.steps,
        config.augment
    );
    let r = crate::bench::run(dataset, config, cmd.steps, cmd.warmup)?;
    println!(
        "{:.1} images/s, {:.1} images/s per core ({} threads); per image: read {:.3} ms, \
         decode {:.3} ms, augment {:.3} ms; bad images: {}",
        r.images_per_sec,
        r.images_per_sec_per_core,
        r.threads,
        r.read_ms_per_image,
        r.decode_ms_per_image,
        r.augment_ms_per_image,
        r.bad_images
    );
    for b in &r.bad_examples {
        tracing::warn!("bad: {b}");
    }
    if let Some(path) = &cmd.json {
        write_json(path, &r)?;
    }
    Ok(())
}
