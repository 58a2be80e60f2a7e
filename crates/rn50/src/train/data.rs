//! Where `rn50 train` gets its batches: DATA/train and DATA/val (or DATA/validation, DATA/test, or WebDataset
//! shards named for the splits) with the chosen recipe's
//! transforms (with --auto-augment, --random-erase and --ra-reps), a train loader rebuilt when progressive resizing changes the resolution, all on one set of
//! loader threads. The hand-over of a host batch to the device is [`crate::input::DeviceBatch`]. Before any of it is
//! read, `--drop-caches` empties the page cache ([`drop_caches`]).
use std::fs::OpenOptions;
use std::io::Write;
use std::ops::Range;
use std::path::Path;
use std::time::SystemTime;

use anyhow::{bail, Context, Result};
use rn50_pipeline::{Dataset, Epoch, Loader, LoaderConfig, Transform};

use crate::train::args::{Augment, TrainArgs};

/// The training recipe's transforms at training resolution `res`.
fn train_transform(args: &TrainArgs, res: usize) -> Transform {
    match args.augment {
        Augment::Imagenet => args.crop.train_transform(res),
        Augment::Cifar => Transform::pad_crop(res, args.pad),
    }
}

fn val_transform(args: &TrainArgs) -> Transform {
    let (resize, crop) = val_sizes(args);
    Transform::val(resize, crop)
}

/// The resize and center crop the run evaluates with (and records with its weights): [`TrainArgs::val_sizes`].
pub(crate) fn val_sizes(args: &TrainArgs) -> (usize, usize) {
    let ((resize, _), (crop, _)) = args.val_sizes();
    (resize, crop)
}

/// The train loader's (its transform set per resolution by [`RealData::train`]) and the val loader's configuration,
/// `rank`'s shard of each.
fn loader_configs(
    args: &TrainArgs,
    workers: usize,
    rank: usize,
    world: usize,
) -> (LoaderConfig, LoaderConfig) {
    let train = LoaderConfig {
        augment: args.augmentation.train_augment(),
        ra_reps: args.ra_reps,
        seed: args.seed,
        rank,
        world_size: world,
        max_image_pixels: args.pixel_limit.max_image_pixels,
        dct_scaling: args.dct.dct_scaling,
        ..LoaderConfig::train(args.batch_size, workers)
    };
    let val = LoaderConfig {
        transform: val_transform(args),
        rank,
        world_size: world,
        max_image_pixels: args.pixel_limit.max_image_pixels,
        dct_scaling: args.dct.dct_scaling,
        ..LoaderConfig::val(args.batch_size, workers)
    };
    (train, val)
}

pub struct RealData {
    train_set: Dataset,
    train_cfg: LoaderConfig,
    /// The loader for the current resolution.
    train: Option<(usize, Loader)>,
    /// Owns the loader threads; the train loaders share them, so that epochs and evaluation passes are
    /// decoded in the order they are queued.
    pub val: Loader,
    /// The class folder names in label order (the same in both splits).
    pub classes: Vec<String>,
    /// Images of each split, all ranks' (for --mllog's train_samples and eval_samples).
    pub train_images: usize,
    pub val_images: usize,
    /// The validation split's images before --val-max-images chose `val_images` of them.
    pub val_images_total: usize,
}

impl RealData {
    /// Opens both splits (this rank's shard of each) and checks they agree on the classes.
    pub fn open(
        root: &Path,
        args: &TrainArgs,
        workers: usize,
        rank: usize,
        world: usize,
    ) -> Result<Self> {
        if rank == 0 {
            let (train, val) = (args.train_split.split(), args.val_split.split());
            rn50_pipeline::source::warn_if_training_on_validation(root, train, val);
        }
        let train = Dataset::open_required_split(root, args.train_split.split())?;
        let val = Dataset::open_required_split(root, args.val_split.split())?;
        let val_images_total = val.len();
        let val = match args.val_max_images {
            Some(n) => val.evenly_spaced(n),
            None => val,
        };
        if train.classes() != val.classes() {
            bail!(
                "{} has {} classes and {} {}, or their names differ: they must be the same set",
                train.description(),
                train.classes().len(),
                val.description(),
                val.classes().len()
            );
        }
        let classes = train.classes().to_vec();
        let (train_images, val_images) = (train.len(), val.len());
        let (train_cfg, val_cfg) = loader_configs(args, workers, rank, world);
        Ok(Self {
            train_set: train,
            train_cfg,
            train: None,
            val: Loader::new(val, val_cfg)?,
            classes,
            train_images,
            val_images,
            val_images_total,
        })
    }

    /// The train loader at resolution `res` (built on first use and when the resolution changes).
    pub fn train(&mut self, args: &TrainArgs, res: usize) -> Result<&Loader> {
        if self.train.as_ref().is_none_or(|(r, _)| *r != res) {
            let cfg = LoaderConfig {
                transform: train_transform(args, res),
                ..self.train_cfg.clone()
            };
            let loader = self.val.share_workers(self.train_set.clone(), cfg)?;
            self.train = Some((res, loader));
        }
        Ok(&self.train.as_ref().expect("just built").1)
    }

    /// Training epoch `epoch`'s `batches` at resolution `res`, queued behind what is already queued.
    pub fn train_epoch(
        &mut self,
        args: &TrainArgs,
        res: usize,
        epoch: usize,
        batches: Range<usize>,
    ) -> Result<Epoch> {
        Ok(self.train(args, res)?.batches(epoch as u64, batches))
    }

    /// Batches per epoch (the same at every resolution).
    pub fn batches_per_epoch(&mut self, args: &TrainArgs) -> Result<usize> {
        let res = self.train.as_ref().map_or(args.image_size, |(r, _)| *r);
        Ok(self.train(args, res)?.batches_per_epoch())
    }
}

/// The kernel's switch that drops the page cache.
const DROP_CACHES: &str = "/proc/sys/vm/drop_caches";

/// `--drop-caches` in this process: opens the kernel's switch (every process, so that all fail alike, before
/// anything is written, when they may not), and with `drop` (each node's first process) writes dirty pages back
/// and drops the page cache, dentries and inodes, as `sync && sysctl vm.drop_caches=3` in MLPerf's scripts. The
/// time it dropped them.
pub fn drop_caches(drop: bool) -> Result<Option<SystemTime>> {
    let mut switch = OpenOptions::new()
        .write(true)
        .open(DROP_CACHES)
        .with_context(|| {
            format!(
                "--drop-caches: cannot open {DROP_CACHES} for writing: dropping the page cache needs root (or a \
                 container allowed to write /proc/sys); run as root, or without --drop-caches"
            )
        })?;
    if !drop {
        return Ok(None);
    }
    // Only clean pages are dropped: the dirty ones are written back first.
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    switch
        .write_all(b"3")
        .with_context(|| format!("--drop-caches: writing 3 to {DROP_CACHES}"))?;
    Ok(Some(SystemTime::now()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::args::parse_for_test;

    fn configs(flags: &str) -> (LoaderConfig, LoaderConfig) {
        loader_configs(&parse_for_test(&format!("DATA {flags}")).unwrap(), 3, 1, 4)
    }

    #[test]
    fn both_loaders_take_the_decode_flags_and_the_rank_s_shard() {
        let (train, val) = configs("--seed 9 -b 32");
        for c in [&train, &val] {
            assert!(
                !c.dct_scaling,
                "whole decodes (torchvision's pixels) by default"
            );
            assert_eq!(
                (c.rank, c.world_size, c.workers, c.batch_size),
                (1, 4, 3, 32)
            );
        }
        assert!(train.shuffle && train.drop_last && train.seed == 9);
        assert!(!val.shuffle && !val.drop_last);
        let (train, val) = configs("--dct-scaling --max-image-pixels 1000");
        for c in [&train, &val] {
            assert!(c.dct_scaling, "--dct-scaling");
            assert_eq!(c.max_image_pixels, 1000);
        }
        let (train, val) = configs("--dct-scaling --no-dct-scaling");
        assert!(
            !train.dct_scaling && !val.dct_scaling,
            "the last one given wins"
        );
    }

    /// `--scale` and `--ratio` reach RandomResizedCrop at every training resolution (progressive resizing's too);
    /// evaluation is untouched.
    #[test]
    fn the_training_crop_takes_scale_and_ratio() {
        let args = parse_for_test("DATA --scale 0.35,1 --ratio 0.5 2").unwrap();
        for res in [64, 128] {
            assert_eq!(
                train_transform(&args, res),
                Transform::Train {
                    size: res,
                    scale: [0.35, 1.0],
                    ratio: [0.5, 2.0]
                }
            );
        }
        assert_eq!(val_transform(&args), Transform::val(256, 224));
        let args = parse_for_test("DATA").unwrap();
        assert_eq!(train_transform(&args, 224), Transform::train(224));
    }
}
