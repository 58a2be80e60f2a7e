//! Command-line surfaces for the `rn50` binary, one module per command, each an `XxxArgs` and a
//! `run(&XxxArgs)`: [`pack`] (`rn50 pack`) and [`bench_loader`] (`rn50 bench-loader`); and the
//! flags the commands that decode images share ([`PixelLimit`]), those that train ([`CropArgs`], [`AugmentArgs`]), and
//! those that read a split of a dataset repository ([`TrainSplitArg`], [`ValSplitArg`]).

use std::ops::Bound;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use rn50_args::{finite_in, usize_in};

use crate::autoaugment::Policy;
use crate::decode::MAX_IMAGE_PIXELS;
use crate::source::{Split, TRAIN_SPLIT, VAL_SPLIT};
use crate::transform::{TrainAugment, Transform, DEFAULT_RATIO, DEFAULT_SCALE};

pub mod bench_loader;
pub mod pack;

pub(crate) fn default_workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// `--max-image-pixels`, for every command that decodes images (pack, bench-loader, train, eval), passed
/// on as `LoaderConfig::max_image_pixels`.
#[derive(Args, Debug, Clone, Copy, serde::Serialize)]
pub struct PixelLimit {
    /// Images with more pixels than this are bad images, refused from their header before any
    /// pixel is decoded (a guard against decompression bombs). The default is Pillow's
    /// MAX_IMAGE_PIXELS; Pillow warns above it and refuses above twice it.
    #[arg(long, value_name = "PIXELS", default_value_t = MAX_IMAGE_PIXELS,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_image_pixels: u64,
}

/// `--dct-scaling`, for every command that decodes images for a model (bench-loader, train, eval), passed on as
/// `LoaderConfig::dct_scaling`.
#[derive(Args, Debug, Clone, Copy, Default, serde::Serialize)]
pub struct DctScalingArg {
    /// Decode a JPEG at 1/2, 1/4 or 1/8 scale in the DCT domain when its crop is shrunk at least that much anyway:
    /// a faster decode of small crops, but not torchvision's pixels. On Imagenette at 64 px it cost ResNet-18 about
    /// 1.6 points of top-1 after 5 epochs (docs/imagenette.md). Default: every JPEG decoded whole and then resized,
    /// as torchvision does.
    #[arg(long, overrides_with = "no_dct_scaling")]
    pub dct_scaling: bool,
    /// The default, full-scale decoding (hidden: for command lines written when --dct-scaling was the default).
    #[arg(long, hide = true, overrides_with = "dct_scaling")]
    #[serde(skip)]
    pub no_dct_scaling: bool,
}

/// `--train-split NAME`, for the commands that read a dataset repository's training split (train,
/// bench-loader, pack).
#[derive(Args, Debug, Clone, Default, serde::Serialize)]
pub struct TrainSplitArg {
    /// The training split's name in DATA (timm's --train-split): the folder DATA/NAME/, the WebDataset shards
    /// DATA/*-NAME-NNNN.tar or the parquet files DATA/data/NAME-*.parquet. Letters, digits and _, up to 64
    /// [default: train].
    #[arg(long, value_name = "NAME", value_parser = split_name)]
    pub train_split: Option<String>,
}

impl TrainSplitArg {
    pub fn split(&self) -> Split<'_> {
        self.train_split
            .as_deref()
            .map_or(TRAIN_SPLIT, Split::Named)
    }
}

/// `--val-split NAME`, for the commands that read a dataset repository's validation split (train, eval,
/// bench-loader --val, pack).
#[derive(Args, Debug, Clone, Default, serde::Serialize)]
pub struct ValSplitArg {
    /// The validation split's name in DATA (timm's --val-split), found as --train-split's is. Letters, digits
    /// and _, up to 64 [default: val, validation or test, the first found].
    #[arg(long, value_name = "NAME", value_parser = split_name)]
    pub val_split: Option<String>,
}

impl ValSplitArg {
    pub fn split(&self) -> Split<'_> {
        self.val_split.as_deref().map_or(VAL_SPLIT, Split::Named)
    }
}

/// A split's name: a folder's name and the middle of a shard's (`imagenet1k-NAME-0000.tar`, whose name parts
/// `-` separates), so letters, digits and `_` only.
fn split_name(name: &str) -> Result<String, String> {
    if name.is_empty()
        || name.len() > 64
        || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
    {
        return Err(
            "a split's name is 1 to 64 letters, digits and _ (such as train, val, validation)"
                .into(),
        );
    }
    Ok(name.to_string())
}

/// `--scale`, `--ratio`: the ranges RandomResizedCrop draws the training crop from (timm's flags of the same names,
/// given as `MIN,MAX` or as timm's `MIN MAX`), for every command that makes training crops (train, bench-loader),
/// passed on as `Transform::Train`'s.
#[derive(Args, Debug, Clone, PartialEq, serde::Serialize)]
pub struct CropArgs {
    /// RandomResizedCrop's range of the crop's area, as fractions of the image's: MIN,MAX with 0 < MIN <= MAX <= 1
    /// (torchvision's and timm's 0.08,1; fast.ai's Imagenette scripts 0.35,1: larger crops, for short runs).
    #[arg(long, value_name = "MIN,MAX", num_args = 1..=2, value_delimiter = ',', action = clap::ArgAction::Set,
          default_values_t = DEFAULT_SCALE, value_parser = finite_in((Bound::Excluded(0.0), Bound::Included(1.0))))]
    pub scale: Vec<f64>,
    /// RandomResizedCrop's range of the crop's aspect ratio (width / height), drawn log-uniformly: MIN,MAX with
    /// 0.01 <= MIN <= MAX <= 100 (torchvision's and timm's 0.75,1.3333333333333333).
    #[arg(long, value_name = "MIN,MAX", num_args = 1..=2, value_delimiter = ',', action = clap::ArgAction::Set,
          default_values_t = DEFAULT_RATIO, value_parser = finite_in(0.01..=100.0))]
    pub ratio: Vec<f64>,
}

impl CropArgs {
    pub fn check(&self) -> Result<(), rn50_args::UsageError> {
        for (flag, range) in [("--scale", &self.scale), ("--ratio", &self.ratio)] {
            if range.len() != 2 {
                return Err(rn50_args::UsageError::new(format!(
                    "{flag} takes two numbers, MIN,MAX (or MIN MAX as timm's), got {}",
                    range.len()
                )));
            }
            if range[0] > range[1] {
                return Err(rn50_args::UsageError::new(format!(
                    "{flag} {},{}: MIN is above MAX",
                    range[0], range[1]
                )));
            }
        }
        Ok(())
    }

    /// Both at torchvision's defaults.
    pub fn is_default(&self) -> bool {
        self.scale == DEFAULT_SCALE && self.ratio == DEFAULT_RATIO
    }

    /// RandomResizedCrop + flip at `size` with these ranges.
    pub fn train_transform(&self, size: usize) -> Transform {
        Transform::Train {
            size,
            scale: [self.scale[0], self.scale[1]],
            ratio: [self.ratio[0], self.ratio[1]],
        }
    }
}

/// `--auto-augment`, `--ra-magnitude`, `--random-erase`: the training augmentations of
/// torchvision's recipe (references/classification's flags of the same names), passed on as
/// `LoaderConfig::augment`.
#[derive(Args, Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct AugmentArgs {
    /// Per-image automatic augmentation after the crop and flip (torchvision's recipe: ta_wide):
    /// ta_wide (TrivialAugmentWide: one of 14 ops, random magnitude) or ra (RandAugment: 2 ops at
    /// --ra-magnitude), as torchvision's transforms.v2 computes them on uint8 images (NEAREST).
    #[arg(long, value_enum, value_name = "POLICY")]
    pub auto_augment: Option<AutoAugmentPolicy>,
    /// RandAugment's magnitude, 0 to 30 (of 31 bins).
    #[arg(long, value_name = "N", default_value_t = 9, value_parser = usize_in(0..=30))]
    pub ra_magnitude: usize,
    /// Random erasing: the probability, 0 to 1, that an image gets a box of 2-33% of its area
    /// (aspect ratio 0.3 to 3.3) set to 0 after normalisation, the mean colour (torchvision's
    /// RandomErasing; the box is drawn by the loader and zeroed on the device).
    #[arg(long, value_name = "P", default_value_t = 0.0, value_parser = finite_in(0.0..=1.0))]
    pub random_erase: f64,
}

/// `--auto-augment`'s values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AutoAugmentPolicy {
    /// TrivialAugmentWide.
    #[value(name = "ta_wide")]
    TaWide,
    /// RandAugment.
    #[value(name = "ra")]
    Ra,
}

impl AugmentArgs {
    /// The rule between these flags (each one's range is clap's): --ra-magnitude only with
    /// --auto-augment ra, where it means something.
    pub fn check(&self) -> Result<(), rn50_args::UsageError> {
        if self.ra_magnitude != 9 && self.auto_augment != Some(AutoAugmentPolicy::Ra) {
            return Err(rn50_args::UsageError::new(
                "--ra-magnitude is for --auto-augment ra",
            ));
        }
        Ok(())
    }

    pub fn train_augment(&self) -> TrainAugment {
        TrainAugment {
            auto_augment: self.auto_augment.map(|p| match p {
                AutoAugmentPolicy::TaWide => Policy::trivial_augment_wide(),
                AutoAugmentPolicy::Ra => Policy::rand_augment(self.ra_magnitude),
            }),
            random_erase: self.random_erase,
        }
    }
}

/// `--json FILE`, written atomically.
pub(crate) fn write_json<T: serde::Serialize>(path: &std::path::Path, value: &T) -> Result<()> {
    let text = serde_json::to_string_pretty(value)? + "\n";
    rn50_util::atomic_write(path, text.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{bench_loader, bench_loader::BenchLoaderArgs, pack::PackArgs};

    #[derive(Parser)]
    enum Cli {
        Pack(PackArgs),
        BenchLoader(BenchLoaderArgs),
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

    #[test]
    fn split_flags_name_a_split_and_refuse_other_names() {
        let parse = |args: &[&str]| match Cli::try_parse_from(
            [&["rn50", "pack", "in", "out"], args].concat(),
        ) {
            Ok(Cli::Pack(c)) => Ok((c.train_split, c.val_split)),
            Ok(_) => unreachable!(),
            Err(e) => Err(e.exit_code()),
        };
        let (train, val) = parse(&[]).unwrap();
        assert_eq!((train.split(), val.split()), (TRAIN_SPLIT, VAL_SPLIT));
        let (train, val) = parse(&["--train-split", "trn", "--val-split", "valid_2"]).unwrap();
        assert_eq!(
            (train.split(), val.split()),
            (Split::Named("trn"), Split::Named("valid_2"))
        );
        let long = "a".repeat(65);
        for bad in ["", "val-2", "../val", "a/b", "v{0..1}", "val.tar", &long] {
            assert_eq!(parse(&["--val-split", bad]).err(), Some(2), "{bad:?}");
            assert_eq!(parse(&["--train-split", bad]).err(), Some(2), "{bad:?}");
        }
        // bench-loader reads one split: the other's flag is refused (exit 2) before anything is opened.
        bench_loader_refuses(&["--val", "--train-split", "trn"], "--train-split");
        bench_loader_refuses(&["--val-split", "valid"], "--val-split");
    }

    /// `rn50 bench-loader /nowhere ARGS` parses, and its run refuses the flags with a usage error naming `flag`.
    fn bench_loader_refuses(args: &[&str], flag: &str) {
        let Ok(Cli::BenchLoader(c)) =
            Cli::try_parse_from([&["rn50", "bench-loader", "/nowhere"], args].concat())
        else {
            panic!("{args:?}")
        };
        let err = bench_loader::run(&c).unwrap_err();
        assert!(
            err.downcast_ref::<rn50_args::UsageError>().is_some(),
            "{args:?}: {err:#}"
        );
        assert!(format!("{err}").contains(flag), "{args:?}: {err:#}");
    }

    #[test]
    fn augment_flags_parse_into_the_policies_and_refuse_values_out_of_range() {
        let parse = |args: &[&str]| match Cli::try_parse_from(
            [&["rn50", "bench-loader", "in"], args].concat(),
        ) {
            Ok(Cli::BenchLoader(c)) => Ok(c.augment.train_augment()),
            Ok(_) => unreachable!(),
            Err(e) => Err(e.exit_code()),
        };
        assert_eq!(parse(&[]), Ok(TrainAugment::default()));
        let ta = parse(&["--auto-augment", "ta_wide", "--random-erase", "0.25"]).unwrap();
        assert_eq!(ta.auto_augment, Some(Policy::trivial_augment_wide()));
        assert_eq!(ta.random_erase, 0.25);
        let ra = parse(&["--auto-augment", "ra", "--ra-magnitude", "15"]).unwrap();
        assert_eq!(ra.auto_augment, Some(Policy::rand_augment(15)));
        let ra = parse(&["--auto-augment", "ra"]).unwrap();
        assert_eq!(ra.auto_augment, Some(Policy::rand_augment(9)));
        for bad in [
            &["--auto-augment", "aa"][..],
            &["--ra-magnitude", "31"],
            &["--random-erase", "1.5"],
            &["--random-erase", "-0.1"],
            &["--random-erase", "nan"],
        ] {
            assert_eq!(parse(bad), Err(2), "{bad:?}");
        }
    }

    /// `--scale` and `--ratio` as `MIN,MAX` or timm's `MIN MAX`, into the training crop's ranges; out of range, one
    /// number or three, or MIN above MAX: a usage error (exit 2), from bench-loader before anything is opened.
    #[test]
    fn crop_flags_set_random_resized_crop_s_ranges() {
        let parse = |args: &[&str]| match Cli::try_parse_from(
            [&["rn50", "bench-loader", "/nowhere"], args].concat(),
        ) {
            Ok(Cli::BenchLoader(c)) => match c.crop.check() {
                Ok(()) => Ok(c.crop.train_transform(96)),
                Err(_) => Err(2),
            },
            Ok(_) => unreachable!(),
            Err(e) => Err(e.exit_code()),
        };
        assert_eq!(parse(&[]), Ok(Transform::train(96)));
        let fastai = Transform::Train {
            size: 96,
            scale: [0.35, 1.0],
            ratio: DEFAULT_RATIO,
        };
        assert_eq!(parse(&["--scale", "0.35,1"]), Ok(fastai.clone()));
        assert_eq!(parse(&["--scale", "0.35", "1"]), Ok(fastai.clone()));
        assert_eq!(parse(&["--scale=0.35,1"]), Ok(fastai));
        assert_eq!(
            parse(&["--ratio", "0.5,2", "--scale", "1,1"]),
            Ok(Transform::Train {
                size: 96,
                scale: [1.0, 1.0],
                ratio: [0.5, 2.0]
            })
        );
        for bad in [
            &["--scale", "0,1"][..],
            &["--scale", "0.5,1.5"],
            &["--scale", "0.6,0.5"],
            &["--scale", "0.5"],
            &["--scale", "0.1,0.2,0.3"],
            &["--scale", "nan,1"],
            &["--ratio", "0.001,1"],
            &["--ratio", "2,0.5"],
            &["--ratio", "1,inf"],
        ] {
            assert_eq!(parse(bad), Err(2), "{bad:?}");
        }
        bench_loader_refuses(&["--val", "--scale", "0.35,1"], "--scale");
        bench_loader_refuses(&["--scale", "0.6,0.5"], "--scale");
    }
}
