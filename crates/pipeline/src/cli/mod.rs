//! Command-line surfaces for the `rn50` binary: `rn50 pack` and `rn50 bench-loader`.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use rn50_args::{check_batch_bytes, usize_in, UsageError, MAX_BATCH, MAX_IMAGE_SIZE, MAX_THREADS};

use crate::decode::MAX_IMAGE_PIXELS;
use crate::loader::{BadImagePolicy, LoaderConfig};
use crate::pack::{pack, PackOptions};
use crate::source::Dataset;
use crate::synthetic::{self, SyntheticConfig};
use crate::transform::Transform;

fn default_workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// `--max-image-pixels`, for every command that decodes images (pack, bench-loader, train, eval), passed
/// on as `LoaderConfig::max_image_pixels`.
#[derive(clap::Args, Debug, Clone, Copy, serde::Serialize)]
pub struct PixelLimit {
    /// Images with more pixels than this are bad images, refused from their header before any
    /// pixel is decoded (a guard against decompression bombs). The default is Pillow's
    /// MAX_IMAGE_PIXELS; Pillow warns above it and refuses above twice it.
    #[arg(long, value_name = "PIXELS", default_value_t = MAX_IMAGE_PIXELS,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_image_pixels: u64,
}

/// Pack an ImageFolder dataset into a few large shard files for fast sequential reading.
///
/// Every image is decoded once to validate it; undecodable ones and those over
/// --max-image-pixels are skipped and counted (or abort with --on-bad-image fail). Without
/// --max-side the original bytes are stored (lossless); with it, images whose shorter side exceeds
/// the cap are shrunk and re-encoded.
/// `rn50 train`/`bench-loader` accept the output directory wherever they accept an ImageFolder.
#[derive(clap::Args, Debug, Clone)]
pub struct PackCmd {
    /// Dataset to pack: an ImageFolder directory (root/<class>/<image>) or existing shards.
    pub data: PathBuf,
    /// Output directory for the shard files (created; must not already hold shards).
    pub out: PathBuf,
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
    /// Also write the pack report (records, bad images, bytes) as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

/// Measure input-pipeline throughput: decode + augment into uint8 NHWC batches, no training.
///
/// Reports images/s, images/s per worker thread, per-image read/decode/augment time and the
/// number of undecodable images. DATA is an ImageFolder directory or packed shards; use
/// --synthetic N instead for generated ImageNet-sized JPEGs.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchLoaderCmd {
    /// ImageFolder directory, shard directory or shard file.
    #[arg(required_unless_present = "synthetic")]
    pub data: Option<PathBuf>,
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
    /// Images per batch, 1 to 65536; batch x size² x 3 bytes at most 16 GiB.
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
    /// Output side length (train crop, or val center crop), 1 to 4096 pixels.
    #[arg(long, default_value_t = 224, value_parser = usize_in(1..=MAX_IMAGE_SIZE))]
    pub size: usize,
    /// Shorter side before the center crop (with --val), --size to 4096 pixels.
    #[arg(long, default_value_t = 256, value_parser = usize_in(1..=MAX_IMAGE_SIZE))]
    pub val_resize: usize,
    /// Always decode at full resolution (no 1/2..1/8 DCT-domain downscaling).
    #[arg(long)]
    pub no_dct_scaling: bool,
    /// Batches decoded ahead of the consumer, 1 to 2048 (default: 2 per worker).
    #[arg(long, value_parser = usize_in(1..=2 * MAX_THREADS))]
    pub prefetch: Option<usize>,
    /// Seed for shuffling and augmentation.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// What to do with images that cannot be decoded.
    #[arg(long, value_enum, default_value_t = BadImagePolicy::Skip)]
    pub on_bad_image: BadImagePolicy,
    #[command(flatten)]
    pub pixel_limit: PixelLimit,
    /// Write the results as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

pub fn run_pack(cmd: &PackCmd) -> Result<()> {
    let dataset = Dataset::open(&cmd.data)?;
    eprintln!(
        "packing {} images, {} classes from {}",
        dataset.len(),
        dataset.classes().len(),
        dataset.description()
    );
    let report = pack(
        &dataset,
        &cmd.out,
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
        cmd.out.display(),
        report.input_bytes as f64 / 1e6,
        report.output_bytes as f64 / 1e6,
        report.reencoded,
        report.bad_images
    );
    for b in &report.bad_examples {
        eprintln!("  skipped {b}");
    }
    if let Some(path) = &cmd.json {
        write_json(path, &report)?;
    }
    Ok(())
}

pub fn run_bench_loader(cmd: &BenchLoaderCmd) -> Result<()> {
    // Each flag's own range is clap's; these go between flags, checked before anything is made.
    if cmd.val && cmd.size > cmd.val_resize {
        bail!(UsageError::new(format!(
            "--size {} is larger than --val-resize {}: the center crop is taken from the resized image",
            cmd.size, cmd.val_resize
        )));
    }
    check_batch_bytes(
        "--batch-size",
        cmd.batch_size as u64,
        "--size",
        cmd.size as u64,
    )?;
    let dataset = match (&cmd.data, cmd.synthetic) {
        (Some(path), _) => Dataset::open(path)?,
        (None, Some(n)) => {
            let cfg = SyntheticConfig {
                seed: cmd.seed,
                ..SyntheticConfig::new(n)
            };
            match &cmd.save_synthetic {
                Some(dir) => {
                    synthetic::write_image_folder(dir, &cfg)?;
                    eprintln!("wrote {n} synthetic JPEGs to {}", dir.display());
                    Dataset::open(dir)?
                }
                None => synthetic::dataset(&cfg)?,
            }
        }
        (None, None) => bail!("give DATA or --synthetic N"),
    };
    let transform = if cmd.val {
        Transform::val(cmd.val_resize, cmd.size)
    } else {
        Transform::train(cmd.size)
    };
    let base = if cmd.val {
        LoaderConfig::val(cmd.batch_size, cmd.workers)
    } else {
        LoaderConfig::train(cmd.batch_size, cmd.workers)
    };
    let config = LoaderConfig {
        transform,
        seed: cmd.seed,
        prefetch: cmd.prefetch.unwrap_or(base.prefetch),
        on_bad_image: cmd.on_bad_image,
        dct_scaling: !cmd.no_dct_scaling,
        max_image_pixels: cmd.pixel_limit.max_image_pixels,
        ..base
    };
    eprintln!(
        "bench-loader: {}, {} images, {} threads, batch {}, {} steps",
        dataset.description(),
        dataset.len(),
        cmd.workers,
        cmd.batch_size,
        cmd.steps
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
        eprintln!("  bad: {b}");
    }
    if let Some(path) = &cmd.json {
        write_json(path, &r)?;
    }
    Ok(())
}

fn write_json<T: serde::Serialize>(path: &std::path::Path, value: &T) -> Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    std::fs::write(path, text + "\n").with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(clap::Parser)]
    enum Cli {
        Pack(PackCmd),
        BenchLoader(BenchLoaderCmd),
    }

    fn max_image_pixels(args: &[&str]) -> Result<u64, clap::Error> {
        Ok(match Cli::try_parse_from(args)? {
            Cli::Pack(c) => c.pixel_limit.max_image_pixels,
            Cli::BenchLoader(c) => c.pixel_limit.max_image_pixels,
        })
    }

    #[test]
    fn max_image_pixels_defaults_to_pillows_and_must_be_positive() {
        for cmd in [
            &["rn50", "pack", "in", "out"][..],
            &["rn50", "bench-loader", "in"],
        ] {
            assert_eq!(max_image_pixels(cmd).unwrap(), MAX_IMAGE_PIXELS);
            let with = |v: &str| max_image_pixels(&[cmd, &["--max-image-pixels", v]].concat());
            assert_eq!(with("1000").unwrap(), 1000);
            assert!(with("0").is_err() && with("-1").is_err());
        }
    }
}
