//! What rn50 records beside the tensors of its weights files and checkpoints ([`Recorded`]): the class names,
//! the network, the training image size and the evaluation transform, one safetensors metadata key per field,
//! written and read back here only, each value checked against the range of the flag that sets it.
use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context, Result};

use super::weights::WeightsShape;
use super::{Arch, ResNetConfig};

/// The safetensors metadata key of the class names, in label order, as a JSON list of strings
/// (`{"classes": "[\"airplane\", \"automobile\", ...]"}`): the folder names of the data the weights were trained on
/// (WordNet ids for ImageNet), which `rn50 classify` prints. Safetensors metadata maps strings to strings.
pub const CLASSES_KEY: &str = "classes";

/// What rn50 records beside the tensors, in the safetensors header's metadata, of weights files
/// (best/final.safetensors) and training checkpoints alike: one schema, written ([`Recorded::metadata`]) and read
/// ([`Recorded::from_metadata`]) here only, one metadata key per field. Names are written as they are
/// (`"arch": "resnet50"`), numbers and lists as JSON (`"width": "64"`, `"mean": "[0.485,0.456,0.406]"`), so that
/// Python reads them with `safetensors.safe_open(path, "pt").metadata()` and `json.loads`:
///
/// | key | what |
/// |---|---|
/// | `classes` | the class folder names, in label order ([`CLASSES_KEY`]) |
/// | `arch`, `width`, `stem`, `num_classes` | the network ([`RecordedNet`]) |
/// | `image_size` | the side of the training images (the last one, with progressive resizing) |
/// | `eval_resize`, `eval_crop`, `interpolation`, `mean`, `std` | how to evaluate ([`EvalTransform`]) |
///
/// `rn50 eval`, `classify` and `export` run the network and the transform recorded unless a flag says otherwise.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Recorded {
    /// The training set's class folder names in label order ([`CLASSES_KEY`]); None for weights made elsewhere
    /// (torchvision's) or trained without a dataset (--dummy).
    pub classes: Option<Vec<String>>,
    /// The network the weights are for; None for weights made elsewhere or by rn50 before it recorded it.
    pub net: Option<RecordedNet>,
    /// The side of the training images; None as `net`.
    pub image_size: Option<usize>,
    /// The evaluation the run used; None as `net`.
    pub eval: Option<EvalTransform>,
}

/// The network weights are for: what `rn50 eval` builds without `-a`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordedNet {
    pub arch: Arch,
    /// Classes, width, stem and variant, which the tensors say as well ([`WeightsFile::shape`](super::weights::WeightsFile::shape)); a file whose metadata
    /// disagrees with its tensors is refused.
    pub shape: WeightsShape,
}

/// How images are fed to the network for evaluation: torchvision's `Resize(resize)` (shorter side) then
/// `CenterCrop(crop)`, then `Normalize(mean, std)` of the [0, 1] pixels.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct EvalTransform {
    pub resize: usize,
    pub crop: usize,
    pub interpolation: Interpolation,
    pub mean: [f64; 3],
    pub std: [f64; 3],
}

/// The resize filter, as torchvision's `InterpolationMode` names it. rn50 has one: bilinear with antialiasing
/// (Pillow's filter, which torchvision uses on PIL images); a file recording another is refused rather than
/// evaluated with the wrong one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Interpolation {
    #[default]
    Bilinear,
}

/// The metadata keys of [`Recorded`]'s fields besides the class names.
const ARCH_KEY: &str = "arch";
const WIDTH_KEY: &str = "width";
const STEM_KEY: &str = "stem";
const NUM_CLASSES_KEY: &str = "num_classes";
const IMAGE_SIZE_KEY: &str = "image_size";
const EVAL_RESIZE_KEY: &str = "eval_resize";
const EVAL_CROP_KEY: &str = "eval_crop";
const INTERPOLATION_KEY: &str = "interpolation";
const MEAN_KEY: &str = "mean";
const STD_KEY: &str = "std";

impl Recorded {
    /// What a run on a dataset with these class names records.
    pub fn with_classes(classes: Option<&[String]>) -> Self {
        Self {
            classes: classes.map(<[String]>::to_vec),
            ..Self::default()
        }
    }

    /// What a run of the network `net` records: its class names (None with --dummy), the side of its training
    /// images and the evaluation transform it used.
    pub fn of_run(
        net: &ResNetConfig,
        classes: Option<&[String]>,
        image_size: usize,
        eval: EvalTransform,
    ) -> Self {
        Self {
            net: Some(RecordedNet {
                arch: net.arch,
                shape: WeightsShape {
                    num_classes: net.num_classes,
                    width: net.width,
                    stem: net.stem,
                    variant: net.arch.variant,
                },
            }),
            image_size: Some(image_size),
            eval: Some(eval),
            ..Self::with_classes(classes)
        }
    }

    /// The metadata entries (none for fields that are None).
    pub fn metadata(&self) -> Result<HashMap<String, String>> {
        let mut metadata = HashMap::new();
        let mut put = |key: &str, value: serde_json::Value| {
            let text = match value {
                serde_json::Value::String(s) => s,
                v => v.to_string(),
            };
            metadata.insert(key.to_string(), text);
        };
        if let Some(names) = &self.classes {
            put(CLASSES_KEY, serde_json::to_string(names)?.into());
        }
        if let Some(net) = &self.net {
            put(ARCH_KEY, serde_json::to_value(net.arch)?);
            put(WIDTH_KEY, net.shape.width.into());
            put(STEM_KEY, serde_json::to_value(net.shape.stem)?);
            put(NUM_CLASSES_KEY, net.shape.num_classes.into());
        }
        if let Some(side) = self.image_size {
            put(IMAGE_SIZE_KEY, side.into());
        }
        if let Some(e) = &self.eval {
            put(EVAL_RESIZE_KEY, e.resize.into());
            put(EVAL_CROP_KEY, e.crop.into());
            put(INTERPOLATION_KEY, serde_json::to_value(e.interpolation)?);
            put(MEAN_KEY, serde_json::to_value(e.mean)?);
            put(STD_KEY, serde_json::to_value(e.std)?);
        }
        Ok(metadata)
    }

    /// Read back from the metadata of the file `path` (named in errors). The keys of the network, and those of
    /// the evaluation transform, are there all or none.
    pub fn from_metadata(metadata: &HashMap<String, String>, path: &Path) -> Result<Self> {
        let classes = match metadata.get(CLASSES_KEY) {
            None => None,
            Some(json) => Some(serde_json::from_str(json).with_context(|| {
                format!(
                    "{}: the metadata's {CLASSES_KEY:?} is not a JSON list of strings",
                    path.display()
                )
            })?),
        };
        let part = |keys: &[&str]| {
            anyhow::anyhow!(
                "{}: its metadata records some of {} but not all",
                path.display(),
                keys.join(", ")
            )
        };
        let net = match (
            field::<Arch>(metadata, ARCH_KEY, path)?,
            field(metadata, WIDTH_KEY, path)?,
            field(metadata, STEM_KEY, path)?,
            field(metadata, NUM_CLASSES_KEY, path)?,
        ) {
            (Some(arch), Some(width), Some(stem), Some(num_classes)) => Some(RecordedNet {
                arch,
                shape: WeightsShape {
                    num_classes,
                    width,
                    stem,
                    variant: arch.variant,
                },
            }),
            (None, None, None, None) => None,
            _ => return Err(part(&[ARCH_KEY, WIDTH_KEY, STEM_KEY, NUM_CLASSES_KEY])),
        };
        let eval = match (
            field(metadata, EVAL_RESIZE_KEY, path)?,
            field(metadata, EVAL_CROP_KEY, path)?,
            field(metadata, INTERPOLATION_KEY, path)?,
            field(metadata, MEAN_KEY, path)?,
            field(metadata, STD_KEY, path)?,
        ) {
            (Some(resize), Some(crop), Some(interpolation), Some(mean), Some(std)) => {
                let eval = EvalTransform {
                    resize,
                    crop,
                    interpolation,
                    mean,
                    std,
                };
                eval.check()
                    .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
                Some(eval)
            }
            (None, None, None, None, None) => None,
            _ => {
                return Err(part(&[
                    EVAL_RESIZE_KEY,
                    EVAL_CROP_KEY,
                    INTERPOLATION_KEY,
                    MEAN_KEY,
                    STD_KEY,
                ]))
            }
        };
        let image_size = field(metadata, IMAGE_SIZE_KEY, path)?;
        if let Some(side) = image_size {
            check_size(IMAGE_SIZE_KEY, side, TRAIN_SIZES, "--image-size")
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        }
        Ok(Self {
            classes,
            net,
            image_size,
            eval,
        })
    }
}

/// The sides `rn50 train --image-size` takes, which a recorded `image_size` must be within.
const TRAIN_SIZES: std::ops::RangeInclusive<usize> = 32..=rn50_args::MAX_IMAGE_SIZE as usize;
/// The sides `--val-resize` and `--val-crop` take, which the recorded evaluation sizes must be within.
const EVAL_SIZES: std::ops::RangeInclusive<usize> = 1..=rn50_args::MAX_IMAGE_SIZE as usize;

/// A recorded size within the range of the flag that sets it; the error names the key, the value and the flag.
fn check_size(
    key: &str,
    value: usize,
    range: std::ops::RangeInclusive<usize>,
    flag: &str,
) -> Result<(), String> {
    if range.contains(&value) {
        return Ok(());
    }
    Err(format!(
        "the metadata's {key:?} is {value}, outside {} to {} (the range of {flag})",
        range.start(),
        range.end()
    ))
}

impl EvalTransform {
    /// What a file's metadata may record (the error says what is wrong; [`Recorded::from_metadata`] adds the
    /// file): the sizes within the flags' ranges, the crop within the resize, a finite mean and a finite std
    /// above zero (a std of 0 divides every pixel by zero: a constant prediction, NaN probabilities).
    fn check(&self) -> Result<(), String> {
        check_size(EVAL_RESIZE_KEY, self.resize, EVAL_SIZES, "--val-resize")?;
        check_size(EVAL_CROP_KEY, self.crop, EVAL_SIZES, "--val-crop")?;
        if self.crop > self.resize {
            return Err(format!(
                "the metadata's {EVAL_CROP_KEY:?} {} is larger than its {EVAL_RESIZE_KEY:?} {}: the crop is \
                 taken from the resized image",
                self.crop, self.resize
            ));
        }
        if !self.mean.iter().all(|m| m.is_finite()) {
            return Err(format!(
                "the metadata's {MEAN_KEY:?} is {:?}: not finite",
                self.mean
            ));
        }
        if !self.std.iter().all(|s| s.is_finite() && *s > 0.0) {
            return Err(format!(
                "the metadata's {STD_KEY:?} is {:?}: each must be finite and above 0",
                self.std
            ));
        }
        Ok(())
    }
}

/// The metadata value of `key` of the file `path`, if there is one: as JSON, or as a string where it is no JSON
/// (names are written as they are).
fn field<T: serde::de::DeserializeOwned>(
    metadata: &HashMap<String, String>,
    key: &str,
    path: &Path,
) -> Result<Option<T>> {
    let Some(text) = metadata.get(key) else {
        return Ok(None);
    };
    let value = serde_json::from_str(text).unwrap_or(serde_json::Value::String(text.clone()));
    let parsed = serde_json::from_value(value).with_context(|| {
        format!(
            "{}: the metadata's {key:?} is {text:?}, which this rn50 does not read",
            path.display()
        )
    })?;
    Ok(Some(parsed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Stem;

    /// What a run records comes back whole (one key per field, names as they are); part of a group, or a value
    /// this rn50 does not read, is refused.
    #[test]
    fn the_network_and_evaluation_round_trip_through_the_metadata() {
        let path = Path::new("w.safetensors");
        let mut cfg = ResNetConfig::new(Arch::ResNet18);
        cfg.width = 8;
        cfg.num_classes = 3;
        cfg.stem = Stem::Cifar;
        let eval = EvalTransform {
            resize: 73,
            crop: 64,
            interpolation: Interpolation::Bilinear,
            mean: [0.5, 0.25, 0.125],
            std: [0.2, 0.3, 0.4],
        };
        let recorded = Recorded::of_run(&cfg, None, 64, eval);
        let metadata = recorded.metadata().unwrap();
        assert_eq!(metadata["arch"], "resnet18");
        assert_eq!(metadata["stem"], "cifar");
        assert_eq!(metadata["width"], "8");
        assert_eq!(metadata["mean"], "[0.5,0.25,0.125]");
        assert_eq!(Recorded::from_metadata(&metadata, path).unwrap(), recorded);

        let mut part = metadata.clone();
        part.remove("eval_crop");
        let err = Recorded::from_metadata(&part, path).unwrap_err();
        assert!(
            format!("{err:#}").contains("some of eval_resize"),
            "{err:#}"
        );
        let mut other = metadata.clone();
        other.insert("interpolation".into(), "bicubic".into());
        let err = Recorded::from_metadata(&other, path).unwrap_err();
        assert!(format!("{err:#}").contains("\"bicubic\""), "{err:#}");
    }

    /// Issue 43: a file's metadata is anyone's to write. Sizes outside the flags' ranges (a crop of 0 panicked
    /// `classify`; 10^6 aborted it), a crop larger than its resize, and a std of 0, below it or not finite (a
    /// constant prediction, `NaN%`) are refused where the metadata is read, naming the file and the key.
    #[test]
    fn recorded_values_outside_the_flags_ranges_are_refused() {
        let path = Path::new("w.safetensors");
        let good = Recorded::of_run(
            &ResNetConfig::new(Arch::ResNet18),
            None,
            64,
            EvalTransform {
                resize: 73,
                crop: 64,
                interpolation: Interpolation::Bilinear,
                mean: [0.5, 0.25, 0.125],
                std: [0.2, 0.3, 0.4],
            },
        )
        .metadata()
        .unwrap();
        assert!(Recorded::from_metadata(&good, path).is_ok());
        for (key, value, want) in [
            (
                "eval_crop",
                "0",
                "\"eval_crop\" is 0, outside 1 to 4096 (the range of --val-crop)",
            ),
            (
                "eval_crop",
                "1000000",
                "\"eval_crop\" is 1000000, outside 1 to 4096",
            ),
            (
                "eval_resize",
                "1000000000",
                "\"eval_resize\" is 1000000000, outside 1 to 4096",
            ),
            ("eval_resize", "0", "\"eval_resize\" is 0"),
            (
                "eval_crop",
                "100",
                "\"eval_crop\" 100 is larger than its \"eval_resize\" 73",
            ),
            (
                "image_size",
                "0",
                "\"image_size\" is 0, outside 32 to 4096 (the range of --image-size)",
            ),
            ("image_size", "5000", "\"image_size\" is 5000"),
            (
                "std",
                "[0.2,0,0.4]",
                "\"std\" is [0.2, 0.0, 0.4]: each must be finite and above 0",
            ),
            ("std", "[0.2,-0.3,0.4]", "\"std\" is [0.2, -0.3, 0.4]"),
            ("std", "[0.2,1e400,0.4]", "\"std\" is \"[0.2,1e400,0.4]\""),
            ("mean", "[0.5,1e400,0.1]", "\"mean\" is \"[0.5,1e400,0.1]\""),
        ] {
            let mut bad = good.clone();
            bad.insert(key.into(), value.into());
            let err = format!("{:#}", Recorded::from_metadata(&bad, path).unwrap_err());
            assert!(err.starts_with("w.safetensors: "), "{key}={value}: {err}");
            assert!(err.contains(want), "{key}={value}: {err}");
        }
    }
}
