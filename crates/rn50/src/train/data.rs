//! Where `rn50 train` gets its batches: DATA/train and DATA/val (or DATA/validation, DATA/test, or WebDataset
//! shards named for the splits) with the chosen recipe's
//! transforms (with --auto-augment, --random-erase and --ra-reps), a train loader rebuilt when progressive resizing changes the resolution, all on one set of
//! loader threads. The hand-over of a host batch to the device is [`crate::input::DeviceBatch`].
use std::ops::Range;
use std::path::Path;

use anyhow::{bail, Result};
use rn50_pipeline::source::{TRAIN_SPLIT, VAL_SPLIT};
use rn50_pipeline::{Dataset, Epoch, Loader, LoaderConfig, Transform};

use crate::train::args::{Augment, TrainArgs};

/// One split of DATA ([`Dataset::open_split`]): `train/`, `val/` (or `validation/`, `test/`), or WebDataset
/// shards named for it.
fn open_split(root: &Path, names: &[&str]) -> Result<Dataset> {
    match Dataset::open_split(root, names)? {
        Some(d) => Ok(d),
        None => {
            let folders: Vec<String> = names.iter().map(|n| format!("{n}/")).collect();
            bail!(
                "{} has no {} folder, nor WebDataset shards *-{}-NNNN.tar: expected DATA/train and \
                 DATA/val",
                root.display(),
                folders.join(" or "),
                names[0]
            )
        }
    }
}

/// The training recipe's transforms at training resolution `res`.
fn train_transform(args: &TrainArgs, res: usize) -> Transform {
    match args.augment {
        Augment::Imagenet => Transform::train(res),
        Augment::Cifar => Transform::pad_crop(res, args.pad),
    }
}

fn val_transform(args: &TrainArgs) -> Transform {
    let (resize, crop) = val_sizes(args);
    Transform::val(resize, crop)
}

/// The resize and center crop the run evaluates with (and records with its weights).
pub(crate) fn val_sizes(args: &TrainArgs) -> (usize, usize) {
    match args.augment {
        Augment::Imagenet => (args.val_resize, args.val_crop),
        // CIFAR evaluates on the images as they are.
        Augment::Cifar => (args.image_size, args.image_size),
    }
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
        let train = open_split(root, TRAIN_SPLIT)?;
        let val = open_split(root, VAL_SPLIT)?;
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
        let train_cfg = LoaderConfig {
            augment: args.augmentation.train_augment(),
            ra_reps: args.ra_reps,
            seed: args.seed,
            rank,
            world_size: world,
            max_image_pixels: args.pixel_limit.max_image_pixels,
            ..LoaderConfig::train(args.batch_size, workers)
        };
        let val_cfg = LoaderConfig {
            transform: val_transform(args),
            rank,
            world_size: world,
            max_image_pixels: args.pixel_limit.max_image_pixels,
            ..LoaderConfig::val(args.batch_size, workers)
        };
        Ok(Self {
            train_set: train,
            train_cfg,
            train: None,
            val: Loader::new(val, val_cfg)?,
            classes,
            train_images,
            val_images,
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
