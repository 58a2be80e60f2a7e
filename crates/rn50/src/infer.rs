//! Running saved weights, the door of `rn50 eval` ([`crate::train::eval`]), `rn50 classify` ([`crate::classify`])
//! and `rn50 export` ([`crate::export`]): the evaluation sizes' flags ([`ValSizeArgs`]), how the weights run
//! ([`Inference`]: the network and the evaluation transform, each from its flag, else from what the weights record,
//! else torchvision's) and the model loaded with them ([`load_for_inference`]). `rn50 train` records
//! [`imagenet_transform`] with its weights.
use anyhow::Result;
use clap::Args;
use rn50_args::{check_batch_bytes, usize_in, UsageError};

use crate::device::{Compute, ComputeArgs};
use crate::model::weights::{EvalTransform, Interpolation, WeightsFile};
use crate::model::{Arch, Model, ResNetConfig};
use crate::step::normalize::{IMAGENET_MEAN, IMAGENET_STD};

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
/// std, as its loader and [`Normalizer`](crate::step::Normalizer) apply them.
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
/// its flag, else from what the weights record ([`Recorded`](crate::model::weights::Recorded)), else torchvision's
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
        let (mut arch, arch_from) = pick(arch, "-a", recorded.net.map(|n| n.arch), Arch::ResNet50);
        // The stem and shortcuts are the tensors' (as width and classes are), whichever name said otherwise.
        let shape = file.shape()?;
        arch.variant = shape.variant;
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
        let mut net = ResNetConfig::new(arch);
        shape.apply(&mut net);
        net.check_side(crop.0).map_err(|e| {
            UsageError::new(format!("{} {}: {e}", size_name("crop", crop.1), crop.0))
        })?;
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
    pub(crate) fn check_batch(&self, batch_size: usize) -> Result<(), UsageError> {
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
    crate::device::setup(
        c.device,
        crate::device::DeviceSettings::for_device(c.device, &c),
    )?;
    let model = Model::new(cfg, c.device);
    file.load(&model)?;
    if c.channels_last {
        model.to_channels_last();
    }
    Ok((model, c))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::weights::{save, Recorded};

    /// `eval`, `classify` and `export` refuse a crop too small for the blur's reflection padding as a usage
    /// error naming the crop, before any network runs; the plain network takes the same crop.
    #[test]
    fn a_crop_too_small_for_the_blur_is_a_usage_error() {
        let dir = tempfile::tempdir().unwrap();
        for (name, refused) in [("resnetblur18", true), ("resnet18", false)] {
            let mut cfg = ResNetConfig::new(name.parse().unwrap());
            cfg.width = 8;
            let path = dir.path().join(format!("{name}.safetensors"));
            let recorded = Recorded::of_run(&cfg, None, 64, imagenet_transform(73, 64));
            save(&Model::new(cfg, tch::Device::Cpu), &path, &recorded).unwrap();
            let file = WeightsFile::read(&path).unwrap();
            let sizes = |crop| ValSizeArgs {
                val_resize: Some(18),
                val_crop: Some(crop),
            };
            assert!(Inference::new(&file, None, &sizes(17)).is_ok(), "{name}");
            match Inference::new(&file, None, &sizes(16)) {
                Err(e) => {
                    assert!(refused, "{name}: {e:#}");
                    let usage = e.downcast_ref::<UsageError>().expect("a usage error");
                    assert!(usage.to_string().contains("--val-crop 16"), "{usage}");
                }
                Ok(_) => assert!(!refused, "{name}: accepted"),
            }
        }
    }
}
