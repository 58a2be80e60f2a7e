//! `rn50 pack`: write a dataset into a few large shard files (see [`crate::source::shards`]).
//!
//! Every image is fully decoded once (bad ones are skipped and counted, or fail the pack), so
//! shards contain only loadable records. Lossless mode stores the original bytes; with
//! `max_side`, images whose shorter side exceeds it are shrunk to that shorter side (Pillow's
//! bilinear filter, torchvision's size rounding) and re-encoded as JPEG at `quality`, like FFCV's
//! `max_resolution`; smaller images keep their original bytes.
//!
//! The shard directory's manifest ([`crate::source::shards::MANIFEST`]) is written last, after
//! every shard is finished and on disk: a pack killed or failed before then leaves shards that
//! look complete, and the manifest's absence is what marks them as not a dataset. A class whose
//! images are all bad fails the pack, as it would make a dataset that opening refuses; a class the dataset
//! has no image of at all (a WebDataset or parquet split holding some of the ImageNet classes) is listed
//! in the manifest as empty, which opening accepts.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use fast_image_resize::images::{Image, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};
use rayon::prelude::*;
use rn50_resize::resize_rgb8;

use crate::crop::resize_shorter;
use crate::decode::{decode_rgb_with_limit, encode_jpeg, DecodeError};
use crate::loader::BadImagePolicy;
use crate::source::shards::{
    write_manifest, ShardMeta, ShardWriter, EXTENSION, FORMAT_VERSION, MANIFEST,
};
use crate::source::Dataset;

#[derive(Clone, Debug)]
pub struct PackOptions {
    /// Cap on the shorter side; `None` stores original bytes (lossless).
    pub max_side: Option<usize>,
    pub quality: u8,
    /// Start a new shard once the current one reaches this many bytes.
    pub shard_bytes: u64,
    pub workers: usize,
    pub on_bad_image: BadImagePolicy,
    /// Images with more pixels are bad images ([`crate::decode::MAX_IMAGE_PIXELS`] by default).
    pub max_image_pixels: u64,
    pub progress: bool,
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct PackReport {
    pub records: u64,
    pub bad_images: u64,
    pub reencoded: u64,
    pub input_bytes: u64,
    pub output_bytes: u64,
    pub shards: Vec<PathBuf>,
    pub bad_examples: Vec<String>,
}

enum Record {
    Ok {
        bytes: Vec<u8>,
        input_len: usize,
        reencoded: bool,
    },
    Bad(String),
}

/// Pack `dataset` into `out_dir/shard-NNNNN.rn50shard`, then write `out_dir`'s manifest.
pub fn pack(dataset: &Dataset, out_dir: &Path, opts: &PackOptions) -> Result<PackReport> {
    if let Some(s) = opts.max_side {
        anyhow::ensure!(s > 0, "--max-side must be positive");
    }
    std::fs::create_dir_all(out_dir)
        .with_context(|| format!("cannot create {}", out_dir.display()))?;
    // A pack killed mid-shard leaves its temporary shard (`.shard-00000.rn50shard.tmpPID`, as large as a shard).
    rn50_util::atomic::remove_stale_temps_of(out_dir, |name| {
        name.starts_with("shard-") && name.ends_with(EXTENSION)
    });
    if let Some(existing) = crate::source::shards::shard_files(out_dir)? {
        bail!(
            "{} already holds {} .{EXTENSION} files; choose an empty directory",
            out_dir.display(),
            existing.len()
        );
    }
    if out_dir.join(MANIFEST).exists() {
        bail!(
            "{} already holds a packed dataset ({MANIFEST}); choose an empty directory",
            out_dir.display()
        );
    }
    // Ctrl-C (or SIGTERM) stops after the images in hand; what this pack wrote is removed (shards without a
    // manifest are no dataset, and would make the same command refuse OUT); a second Ctrl-C stops at once.
    rn50_util::stop::install("removing the shards written so far, then stopping")?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(opts.workers.max(1))
        .build()
        .context("cannot start worker threads")?;
    let bar = rn50_util::progress_bar(
        dataset.len() as u64,
        "{msg} [{elapsed_precise}] [{wide_bar}] {pos}/{len} ({per_sec}, eta {eta})",
        opts.progress,
    );
    bar.set_message("packing");
    let meta = ShardMeta {
        format_version: FORMAT_VERSION,
        classes: dataset.classes().to_vec(),
        records: 0,
        max_side: opts.max_side,
        quality: opts.max_side.map(|_| opts.quality),
        index_crc32: None,
    };
    let mut report = PackReport::default();
    let mut class_images = vec![0u64; dataset.classes().len()];
    let mut writer: Option<ShardWriter> = None;
    let chunk = 64 * opts.workers.max(1);
    for start in (0..dataset.len()).step_by(chunk) {
        if rn50_util::stop::requested() {
            drop(writer); // removes its temporary file
            for shard in &report.shards {
                std::fs::remove_file(shard)
                    .with_context(|| format!("removing {}", shard.display()))?;
            }
            bar.finish_and_clear();
            bail!(rn50_util::stop::Stopped::new(format!(
                "removed the {} shard(s) this pack had written to {}; run the same command again to pack",
                report.shards.len(),
                out_dir.display()
            )));
        }
        let end = (start + chunk).min(dataset.len());
        // Order-preserving parallel map: shards list samples in dataset order.
        let records: Vec<Record> = pool.install(|| {
            (start..end)
                .into_par_iter()
                .map_init(Vec::new, |buf, i| prepare(dataset, i, buf, opts))
                .collect()
        });
        for (i, rec) in (start..end).zip(records) {
            match rec {
                Record::Bad(msg) => {
                    report.bad_images += 1;
                    if report.bad_examples.len() < 20 {
                        report.bad_examples.push(msg.clone());
                    }
                    if opts.on_bad_image == BadImagePolicy::Fail {
                        bail!("bad image {msg}");
                    }
                }
                Record::Ok {
                    bytes,
                    input_len,
                    reencoded,
                } => {
                    if writer
                        .as_ref()
                        .is_some_and(|w| w.size() >= opts.shard_bytes)
                    {
                        let w = writer.take().expect("checked above");
                        report.shards.push(w.finish()?);
                    }
                    if writer.is_none() {
                        let path =
                            out_dir.join(format!("shard-{:05}.{EXTENSION}", report.shards.len()));
                        writer = Some(ShardWriter::create(&path, meta.clone())?);
                    }
                    let w = writer.as_mut().expect("created above");
                    let label = dataset.label(i);
                    w.push(&bytes, label as u32)?;
                    class_images[label as usize] += 1;
                    report.records += 1;
                    report.reencoded += u64::from(reencoded);
                    report.input_bytes += input_len as u64;
                    report.output_bytes += bytes.len() as u64;
                }
            }
        }
        bar.set_position(end as u64);
    }
    if let Some(w) = writer {
        report.shards.push(w.finish()?);
    }
    bar.finish_and_clear();
    if report.records == 0 {
        bail!("no loadable images in {}", dataset.description());
    }
    // Classes with images in the dataset and none packed; those it has none of (a WebDataset or parquet split
    // holds what it holds of the ImageNet classes) stay empty, and the manifest says so.
    let mut source_images = vec![0u64; dataset.classes().len()];
    for i in 0..dataset.len() {
        source_images[dataset.label(i) as usize] += 1;
    }
    let classes = dataset
        .classes()
        .iter()
        .zip(class_images.iter().zip(&source_images));
    let lost: Vec<&str> = classes
        .clone()
        .filter(|(_, (&packed, &had))| packed == 0 && had > 0)
        .map(|(c, _)| c.as_str())
        .collect();
    if !lost.is_empty() {
        bail!(
            "no loadable images for the classes {} of {}: all of their images are bad (the first \
             bad images: {}); {} is left unfinished, not a dataset",
            lost.join(", "),
            dataset.description(),
            report.bad_examples.join("; "),
            out_dir.display()
        );
    }
    let empty = classes
        .filter(|(_, (_, &had))| had == 0)
        .map(|(c, _)| c.clone())
        .collect();
    write_manifest(out_dir, &report.shards, empty)?;
    Ok(report)
}

fn prepare(dataset: &Dataset, i: usize, buf: &mut Vec<u8>, opts: &PackOptions) -> Record {
    let bytes = match dataset.read(i, buf) {
        Ok(b) => b,
        Err(e) => return Record::Bad(format!("{}: {e:#}", dataset.name(i))),
    };
    let input_len = bytes.len();
    let result = std::panic::catch_unwind(|| encode_record(bytes, opts))
        .unwrap_or_else(|_| Err(DecodeError::Panic("while packing".into())));
    match result {
        Ok(Some(out)) => Record::Ok {
            bytes: out,
            input_len,
            reencoded: true,
        },
        Ok(None) => Record::Ok {
            bytes: bytes.to_vec(),
            input_len,
            reencoded: false,
        },
        Err(e) => Record::Bad(format!("{}: {e}", dataset.name(i))),
    }
}

/// Validate `bytes` by decoding; `Some(jpeg)` if it had to be shrunk and re-encoded.
fn encode_record(bytes: &[u8], opts: &PackOptions) -> Result<Option<Vec<u8>>, DecodeError> {
    let img = decode_rgb_with_limit(bytes, opts.max_image_pixels)?;
    let Some(cap) = opts.max_side else {
        return Ok(None);
    };
    if img.width.min(img.height) <= cap {
        return Ok(None);
    }
    let (nw, nh) = resize_shorter(img.width, img.height, cap);
    let err = |e: &dyn std::fmt::Display| DecodeError::Encode(format!("resize: {e}"));
    let src = ImageRef::new(
        img.width as u32,
        img.height as u32,
        &img.pixels,
        PixelType::U8x3,
    )
    .map_err(|e| err(&e))?;
    let mut dst = Image::new(nw as u32, nh as u32, PixelType::U8x3);
    let bilinear = ResizeOptions::new().resize_alg(ResizeAlg::Convolution(FilterType::Bilinear));
    resize_rgb8(&mut Resizer::new(), &src, None, &mut dst, &bilinear).map_err(|e| err(&e))?;
    encode_jpeg(nw, nh, dst.buffer(), opts.quality).map(Some)
}
