//! `rn50 pack`: [`PackArgs`] and [`run`].

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use rn50_args::{usize_in, MAX_THREADS};

use super::{default_workers, write_json, PixelLimit, TrainSplitArg, ValSplitArg};
use crate::loader::BadImagePolicy;
use crate::pack::{pack, PackOptions, PackReport};
use crate::source::{Dataset, Split};

/// Pack an ImageFolder dataset into a few large shard files for fast sequential reading.
///
/// DATA holding both a training and a validation split (train/ and val/, timm's WebDataset shards
/// *-train-NNNN.tar and *-validation-NNNN.tar, the Hub's data/train-*.parquet and data/validation-*.parquet)
/// is packed split by split into OUT/train and OUT/val, a DATA for `rn50 train` and `rn50 eval`.
///
/// Every image is decoded once to validate it; undecodable ones and those over
/// --max-image-pixels are skipped and counted (or abort with --on-bad-image fail). Without
/// --max-side the original bytes are stored (lossless); with it, images whose shorter side exceeds
/// the cap are shrunk and re-encoded.
/// `rn50 train`/`bench-loader` accept the output directory wherever they accept an ImageFolder.
/// Ctrl-C, SIGTERM or SIGUSR1 stops the pack and removes the shards it wrote (exit 3); a second
/// Ctrl-C stops at once.
#[derive(Args, Debug, Clone)]
pub struct PackArgs {
    /// Dataset to pack: an ImageFolder directory (root/<class>/<image>), existing shards, or WebDataset
    /// shards (a directory, a .tar, or a pattern such as 'train-{0000..0099}.tar').
    pub data: PathBuf,
    /// Output directory for the shard files (created; must not already hold shards).
    pub out: PathBuf,
    #[command(flatten)]
    pub train_split: TrainSplitArg,
    #[command(flatten)]
    pub val_split: ValSplitArg,
    /// Shrink images whose shorter side exceeds this many pixels (1 to 65535, JPEG's largest side)
    /// and re-encode them as JPEG (e.g. 256-512, like FFCV's max_resolution). Default: store
    /// original bytes.
    #[arg(long, value_name = "PIXELS", value_parser = usize_in(1..=65535))]
    pub max_side: Option<usize>,
    /// JPEG quality for re-encoded images.
    #[arg(long, default_value_t = 90, value_parser = clap::value_parser!(u8).range(1..=100))]
    pub quality: u8,
    /// Target size of one shard file in MiB, 1 to 1048576 (1 TiB).
    #[arg(long, default_value_t = 1024, value_name = "MIB", value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    pub shard_size: u64,
    /// Number of worker threads, 1 to 1024.
    #[arg(short = 'j', long = "workers", default_value_t = default_workers(), value_parser = usize_in(1..=MAX_THREADS))]
    pub workers: usize,
    /// What to do with images that cannot be decoded.
    #[arg(long, value_enum, default_value_t = BadImagePolicy::Skip)]
    pub on_bad_image: BadImagePolicy,
    #[command(flatten)]
    pub pixel_limit: PixelLimit,
    /// Also write the pack report (records, bad images, bytes) as JSON to this file; for a DATA with splits,
    /// an object of one report per split ("train", "val").
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

/// `rn50 pack`.
pub fn run(cmd: &PackArgs) -> Result<()> {
    let (train, val) = (cmd.train_split.split(), cmd.val_split.split());
    crate::source::warn_if_training_on_validation(&cmd.data, train, val);
    let named = [train, val].iter().any(|s| matches!(s, Split::Named(_)));
    // A split named with --train-split or --val-split must be there; the usual names may not be.
    let open = |split: Split| match split {
        Split::Named(_) => Dataset::open_required_split(&cmd.data, split).map(Some),
        Split::Usual(_) => Dataset::open_split(&cmd.data, split),
    };
    let jobs = match [open(train)?, open(val)?] {
        [Some(train), Some(val)] => vec![
            ("train", train, cmd.out.join("train")),
            ("val", val, cmd.out.join("val")),
        ],
        [Some(one), None] | [None, Some(one)] if named => vec![("split", one, cmd.out.clone())],
        // One dataset (one split's, or DATA without splits).
        _ => vec![("data", Dataset::open(&cmd.data)?, cmd.out.clone())],
    };
    let mut reports = std::collections::BTreeMap::new();
    for (name, dataset, out) in &jobs {
        reports.insert(*name, pack_one(cmd, dataset, out)?);
    }
    if let Some(path) = &cmd.json {
        match reports.len() {
            1 => write_json(path, reports.values().next().expect("one"))?,
            _ => write_json(path, &reports)?,
        }
    }
    Ok(())
}

/// Packs `dataset` into `out` and says what it did.
fn pack_one(cmd: &PackArgs, dataset: &Dataset, out: &std::path::Path) -> Result<PackReport> {
    tracing::info!(
        "packing {} images, {} classes from {}",
        dataset.len(),
        dataset.classes().len(),
        dataset.description()
    );
    let report = pack(
        dataset,
        out,
        &PackOptions {
            max_side: cmd.max_side,
            quality: cmd.quality,
            shard_bytes: cmd.shard_size.max(1) << 20,
            workers: cmd.workers.max(1),
            on_bad_image: cmd.on_bad_image,
            max_image_pixels: cmd.pixel_limit.max_image_pixels,
            progress: !cmd.quiet,
        },
    )?;
    println!(
        "packed {} images into {} shard(s) in {} ({:.1} MB -> {:.1} MB, {} re-encoded, {} bad)",
        report.records,
        report.shards.len(),
        out.display(),
        report.input_bytes as f64 / 1e6,
        report.output_bytes as f64 / 1e6,
        report.reencoded,
        report.bad_images
    );
    for b in &report.bad_examples {
        tracing::warn!("skipped {b}");
    }
    Ok(report)
}
