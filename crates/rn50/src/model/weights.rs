//! Weights with torchvision's state_dict keys, saved from and loaded into a [`Model`]. rn50 writes safetensors, so
//! files move freely between rn50 and PyTorch (`safetensors.torch.load_file` + `model.load_state_dict`), with the
//! training set's class names in the header's metadata ([`CLASSES_KEY`]). It reads safetensors and torch.save
//! files alike ([`weights_format`]: told apart by their first bytes, not their names): torchvision's `.pth` (a
//! state_dict), pytorch/examples' `checkpoint.pth.tar` / `model_best.pth.tar` (the state_dict under `state_dict`,
//! with DDP's `module.` prefixes), timm's checkpoints, and rn50's own training checkpoints (the model's weights
//! under `model.`). What rn50 records with its weights (the network, the class names, the training and
//! evaluation sizes: [`Recorded`]) is how `rn50 eval`, `classify` and `export` run them without repeating the
//! training's flags.
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use tch::Tensor;

use super::weights_format;
use super::{Model, ResNetConfig, Stem, Variant};

pub use super::class_names::{names_list, printable};
pub use super::recorded::{EvalTransform, Interpolation, Recorded, RecordedNet, CLASSES_KEY};
pub(crate) use super::weights_format::write_safetensors;
pub use super::weights_format::CHECKPOINT_MODEL_PREFIX;

/// Keys a torchvision state_dict has that rn50 does not track (BN's step counter, unused with momentum 0.1).
fn ignorable(key: &str) -> bool {
    key.ends_with(".num_batches_tracked")
}

/// Writes the model's state (NCHW-contiguous, fp32 as trained) to `path` atomically ([`rn50_util::atomic`]): a
/// crash leaves either the old file or the new one. What is `recorded` (the training set's class names) goes into
/// the metadata.
pub fn save(model: &Model, path: &Path, recorded: &Recorded) -> Result<()> {
    write_safetensors(path, &model.state(), recorded.metadata()?)
}

/// Loads `path` into the model ([`WeightsFile::load`]).
pub fn load(model: &Model, path: &Path) -> Result<()> {
    WeightsFile::read(path)?.load(model)
}

/// `train --init-weights`: the weights of `path` in `model`; the classifier keeps its initialisation when the
/// file's class count differs from the model's, when the file records other class names than `names` (the data's:
/// its labels would mean other classes), or with `reset_head`. `rank0` says what it loaded.
pub fn init_weights(
    model: &Model,
    path: &Path,
    reset_head: bool,
    names: Option<&[String]>,
    rank0: bool,
) -> Result<()> {
    let file = WeightsFile::read(path)?;
    let file_classes = file.shape()?.num_classes;
    let classes = model.net.config.num_classes;
    let renamed =
        file_classes == classes && matches!((file.classes(), names), (Some(a), Some(b)) if a != b);
    if reset_head || file_classes != classes || renamed {
        file.load_backbone(model)?;
        if rank0 {
            tracing::info!(
                "initialised from {} with a new classifier ({file_classes} → {classes} classes{})",
                path.display(),
                match (reset_head, renamed) {
                    (true, _) => ", --reset-head",
                    (false, true) => ", the file's class names differ from the data's",
                    _ => "",
                }
            );
        }
    } else {
        file.load(model)?;
        if rank0 {
            tracing::info!("initialised from {}", path.display());
        }
    }
    Ok(())
}

/// The classifier's tensors (`fc.weight`, `fc.bias`): what fine-tuning on other classes starts afresh.
pub fn is_classifier(key: &str) -> bool {
    key.starts_with("fc.")
}

/// What a weights file says about the network it fits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WeightsShape {
    /// The length of `fc.bias`.
    pub num_classes: i64,
    /// Output channels of `conv1`.
    pub width: i64,
    /// A 3x3 `conv1` is the CIFAR stem, 7x7 ImageNet's.
    pub stem: Stem,
    /// ResNet-C's and -D's three-conv stem (`conv1.0` ...) and -D's shortcut (`downsample.1` a conv).
    pub variant: Variant,
}

impl WeightsShape {
    /// `config` with the classes, width, stem and variant of these weights.
    pub fn apply(&self, config: &mut ResNetConfig) {
        config.num_classes = self.num_classes;
        config.width = self.width;
        config.stem = self.stem;
        config.arch.variant = self.variant;
    }
}

/// A weights file read whole: its tensors by torchvision's names, and the class names it records.
pub struct WeightsFile {
    path: PathBuf,
    tensors: HashMap<String, Tensor>,
    recorded: Recorded,
}

impl WeightsFile {
    /// Reads safetensors or a torch.save file (see the module's doc); the legacy torch.save format is an error
    /// with the one-line conversion.
    pub fn read(path: &Path) -> Result<Self> {
        let (tensors, recorded) = weights_format::read(path)?;
        let (n, fc) = (
            recorded.classes.as_ref().map(Vec::len),
            tensors.get("fc.bias"),
        );
        if let (Some(n), Some(fc)) = (n, fc) {
            if fc.size() != [n as i64] {
                bail!(
                    "{}: its metadata names {n} classes but fc.bias has shape {:?}",
                    path.display(),
                    fc.size()
                );
            }
        }
        let file = Self {
            path: path.to_path_buf(),
            tensors,
            recorded,
        };
        if let Some(net) = &file.recorded.net {
            let shape = file.shape()?;
            if net.shape != shape {
                bail!(
                    "{}: its metadata records {} classes, width {}, the {:?} stem and variant {:?} but its \
                     tensors are for {} classes, width {}, the {:?} stem and variant {:?}",
                    path.display(),
                    net.shape.num_classes,
                    net.shape.width,
                    net.shape.stem,
                    net.shape.variant,
                    shape.num_classes,
                    shape.width,
                    shape.stem,
                    shape.variant
                );
            }
        }
        Ok(file)
    }

    /// The file the weights were read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The class count, width and stem of the ResNet these weights are for.
    pub fn shape(&self) -> Result<WeightsShape> {
        let not_resnet = || format!("{} is not ResNet weights", self.path.display());
        let size = |name: &str| self.tensors.get(name).map(Tensor::size);
        let num_classes = match size("fc.bias").as_deref() {
            Some(&[n]) => n,
            _ => bail!("{}: no 1-D fc.bias", not_resnet()),
        };
        let (width, stem, deep) = match (size("conv1.weight").as_deref(), size("bn1.weight")) {
            (Some(&[w, 3, 7, 7]), _) => (w, Stem::ImageNet, false),
            (Some(&[w, 3, 3, 3]), _) => (w, Stem::Cifar, false),
            (None, Some(w)) if size("conv1.0.weight").is_some_and(|s| s[1..] == [3, 3, 3]) => {
                (w[0], Stem::ImageNet, true)
            }
            (other, _) => bail!("{}: conv1.weight has shape {other:?}", not_resnet()),
        };
        // Stage 2's first block has a shortcut conv in every ResNet: ResNet-D's follows its average pool.
        let variant = match (
            deep,
            self.tensors.contains_key("layer2.0.downsample.2.weight"),
        ) {
            (_, true) => Variant::D,
            (true, false) => Variant::C,
            (false, false) => Variant::B,
        };
        Ok(WeightsShape {
            num_classes,
            width,
            stem,
            variant,
        })
    }

    /// The class names recorded with the weights ([`CLASSES_KEY`]), in label order; None for files without them
    /// (torchvision's, PyTorch's).
    pub fn classes(&self) -> Option<&[String]> {
        self.recorded.classes.as_deref()
    }

    /// Everything recorded with the weights ([`Recorded`]); all None for files made elsewhere.
    pub fn recorded(&self) -> &Recorded {
        &self.recorded
    }

    /// Copies the weights into the model. Every model tensor must be present with the same shape; extra keys
    /// other than `num_batches_tracked` are an error (they mean the file is for another architecture).
    pub fn load(&self, model: &Model) -> Result<()> {
        self.load_where(model, |_| true)
    }

    /// [`Self::load`] for every tensor but the classifier's, which keeps its initialisation: the start of
    /// fine-tuning on another set of classes (`train --init-weights`).
    pub fn load_backbone(&self, model: &Model) -> Result<()> {
        self.load_where(model, |k| !is_classifier(k))
    }

    /// Copies the tensors whose names `take` accepts into `model`; the file must hold exactly those of the
    /// model's (besides ignorable counters).
    fn load_where(&self, model: &Model, take: impl Fn(&str) -> bool) -> Result<()> {
        let state: Vec<(String, Tensor)> =
            model.state().into_iter().filter(|(k, _)| take(k)).collect();
        let known: HashSet<&str> = state.iter().map(|(k, _)| k.as_str()).collect();
        let mut unexpected: Vec<&str> = self
            .tensors
            .keys()
            .map(String::as_str)
            .filter(|k| take(k) && !known.contains(k) && !ignorable(k))
            .collect();
        unexpected.sort_unstable();
        let c = &model.net.config;
        let path = &self.path;
        if !unexpected.is_empty() {
            bail!(
                "{} does not match {} ({} classes): unexpected {:?}",
                path.display(),
                c.arch,
                c.num_classes,
                &unexpected[..unexpected.len().min(5)]
            );
        }
        copy_into(state, &self.tensors, path).with_context(|| {
            format!(
                "{} does not match {} ({} classes)",
                path.display(),
                c.arch,
                c.num_classes
            )
        })
    }
}

/// Copies `file[name]` into each target tensor in place (keeping its memory format), after checking that
/// every name is present with the target's shape.
pub(crate) fn copy_into(
    targets: Vec<(String, Tensor)>,
    file: &HashMap<String, Tensor>,
    path: &Path,
) -> Result<()> {
    let missing: Vec<&str> = targets
        .iter()
        .filter(|(k, _)| !file.contains_key(k))
        .map(|(k, _)| k.as_str())
        .collect();
    if !missing.is_empty() {
        bail!(
            "{} lacks {} tensor(s): {:?}",
            path.display(),
            missing.len(),
            &missing[..missing.len().min(5)]
        );
    }
    tch::no_grad(|| {
        for (k, mut t) in targets {
            let src = &file[&k];
            if src.size() != t.size() {
                bail!(
                    "{}: {k} has shape {:?}, expected {:?}",
                    path.display(),
                    src.size(),
                    t.size()
                );
            }
            // Weights are floating point and finite: integers would be converted silently, and a NaN or an
            // infinity (a diverged run's batch-norm variance) scores and classifies as nonsense without an error.
            if src.kind() != t.kind() {
                bail!(
                    "{}: {k} is {:?}, expected {:?}",
                    path.display(),
                    src.kind(),
                    t.kind()
                );
            }
            let bad = src.isfinite().logical_not().sum(tch::Kind::Int64);
            let bad = i64::try_from(&bad).with_context(|| format!("checking {k}"))?;
            if bad > 0 {
                bail!(
                    "{}: {k} has {bad} value(s) that are NaN or infinite (a run that diverged?): refusing \
                     weights that are not finite",
                    path.display()
                );
            }
            t.f_copy_(src).with_context(|| format!("copying {k}"))?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use tch::{Device, Kind};

    use super::*;
    use crate::model::{Arch, Pool, ResNetConfig};

    #[test]
    fn round_trip_is_exact_and_channels_last_is_saved_as_nchw() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.safetensors");
        tch::manual_seed(1);
        let a = Model::new(ResNetConfig::new(Arch::ResNet18), Device::Cpu);
        a.to_channels_last();
        save(&a, &path, &Recorded::default()).unwrap();
        tch::manual_seed(2);
        let b = Model::new(ResNetConfig::new(Arch::ResNet18), Device::Cpu);
        load(&b, &path).unwrap();
        for ((ka, ta), (kb, tb)) in a.state().iter().zip(b.state().iter()) {
            assert_eq!(ka, kb);
            assert_eq!(ta, tb, "{ka}");
        }
        // Files written by rn50 are plain contiguous tensors.
        let raw = Tensor::read_safetensors(&path).unwrap();
        assert!(raw.iter().all(|(_, t)| t.is_contiguous()));
        assert!(!dir.path().read_dir().unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .contains(".tmp")));
    }

    #[test]
    fn wrong_architecture_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.safetensors");
        save(
            &Model::new(ResNetConfig::new(Arch::ResNet18), Device::Cpu),
            &path,
            &Recorded::default(),
        )
        .unwrap();
        let err = load(
            &Model::new(ResNetConfig::new(Arch::ResNet34), Device::Cpu),
            &path,
        )
        .unwrap_err();
        assert!(
            format!("{err:#}").contains("does not match resnet34"),
            "{err:#}"
        );
    }

    /// Weights with a NaN or infinite value, or an integer tensor, are refused by every loader (`eval`,
    /// `classify`, `export`, `--init-weights`, resume): they used to load, and `eval` printed Acc@1 50.000 for
    /// NaN batch-norm variances (issue 25).
    #[test]
    fn non_finite_or_integer_weights_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = ResNetConfig::new(Arch::ResNet18);
        cfg.width = 8;
        let model = Model::new(cfg.clone(), Device::Cpu);
        let good = dir.path().join("good.safetensors");
        save(&model, &good, &Recorded::default()).unwrap();
        let state: Vec<(String, Tensor)> = Tensor::read_safetensors(&good).unwrap();
        let with = |name: &str, key: &str, f: &dyn Fn(&Tensor) -> Tensor| {
            let path = dir.path().join(name);
            let ts: Vec<(String, Tensor)> = state
                .iter()
                .map(|(k, t)| (k.clone(), if k == key { f(t) } else { t.shallow_clone() }))
                .collect();
            Tensor::write_safetensors(&ts, &path).unwrap();
            path
        };
        let var = "layer4.1.bn2.running_var";
        for (path, want) in [
            (
                with("nan.safetensors", var, &|t| t.fill(f64::NAN)),
                "NaN or infinite",
            ),
            (
                with("inf.safetensors", var, &|t| t.fill(f64::INFINITY)),
                "NaN or infinite",
            ),
            (
                with("int.safetensors", "conv1.weight", &|t| {
                    t.to_kind(tch::Kind::Int64)
                }),
                "Int64",
            ),
        ] {
            let fresh = Model::new(cfg.clone(), Device::Cpu);
            for err in [
                load(&fresh, &path).unwrap_err(),
                WeightsFile::read(&path)
                    .unwrap()
                    .load_backbone(&fresh)
                    .unwrap_err(),
            ] {
                assert!(format!("{err:#}").contains(want), "{err:#}");
            }
        }
        load(&Model::new(cfg, Device::Cpu), &good).unwrap();
    }

    /// The class names given to `save` come back from the file; a file without them has none, and names that
    /// disagree with the classifier's size are an error.
    #[test]
    fn class_names_round_trip_through_the_metadata() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = ResNetConfig::new(Arch::ResNet18);
        cfg.width = 8;
        cfg.num_classes = 3;
        let model = Model::new(cfg, Device::Cpu);
        let names: Vec<String> = ["cat", "dog", "n01440764"].map(String::from).to_vec();
        let (named, plain, wrong) = (
            dir.path().join("named.safetensors"),
            dir.path().join("plain.safetensors"),
            dir.path().join("wrong.safetensors"),
        );
        save(&model, &named, &Recorded::with_classes(Some(&names))).unwrap();
        save(&model, &plain, &Recorded::default()).unwrap();
        save(&model, &wrong, &Recorded::with_classes(Some(&names[..2]))).unwrap();
        assert_eq!(
            WeightsFile::read(&named).unwrap().classes(),
            Some(&names[..])
        );
        assert_eq!(WeightsFile::read(&plain).unwrap().classes(), None);
        let err = WeightsFile::read(&wrong).err().unwrap();
        assert!(
            format!("{err:#}").contains("metadata names 2 classes but fc.bias has shape [3]"),
            "{err:#}"
        );
    }

    /// What a run records comes back whole from the file ([`Recorded`]'s own tests have the metadata); a network
    /// that the tensors contradict is refused; a checkpoint's `model.` tensors load as weights.
    #[test]
    fn the_network_and_evaluation_round_trip_through_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = ResNetConfig::new(Arch::ResNet18);
        cfg.width = 8;
        cfg.num_classes = 3;
        cfg.stem = Stem::Cifar;
        let model = Model::new(cfg.clone(), Device::Cpu);
        let eval = EvalTransform {
            resize: 73,
            crop: 64,
            interpolation: Interpolation::Bilinear,
            mean: [0.5, 0.25, 0.125],
            std: [0.2, 0.3, 0.4],
        };
        let recorded = Recorded::of_run(&cfg, None, 64, eval);
        let path = dir.path().join("w.safetensors");
        save(&model, &path, &recorded).unwrap();
        let file = WeightsFile::read(&path).unwrap();
        assert_eq!(file.recorded(), &recorded);

        let mut wide = cfg.clone();
        wide.width = 16;
        let lying = dir.path().join("lying.safetensors");
        save(&model, &lying, &Recorded::of_run(&wide, None, 64, eval)).unwrap();
        let err = WeightsFile::read(&lying).err().unwrap();
        assert!(format!("{err:#}").contains("width 16"), "{err:#}");

        let ckpt = dir.path().join("checkpoint.safetensors");
        let mut tensors: Vec<(String, Tensor)> = model
            .state()
            .into_iter()
            .map(|(k, t)| (format!("{CHECKPOINT_MODEL_PREFIX}{k}"), t))
            .collect();
        tensors.push((
            "optim.fc.bias".into(),
            Tensor::zeros([3], (Kind::Float, Device::Cpu)),
        ));
        write_safetensors(&ckpt, &tensors, recorded.metadata().unwrap()).unwrap();
        let file = WeightsFile::read(&ckpt).unwrap();
        assert_eq!(file.shape().unwrap().width, 8);
        file.load(&Model::new(cfg, Device::Cpu)).unwrap();
    }

    /// The tensors tell ResNet-C's and -D's stem and shortcut from torchvision's; the blurs and Mish, which have no
    /// tensors, come back from the recorded name (and so do squeeze-and-excitation and ResNeXt's groups, which
    /// the load checks against the tensors), and a name the tensors contradict is refused.
    #[test]
    fn the_variant_is_the_tensors_and_the_blur_the_recorded_name() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "resnet18",
            "resnet18c",
            "resnet18d",
            "resnetblur18d",
            "resnetblur50",
            "resnet18d_mish",
            "resnetblur18_mish",
            "resnet18d_maxblur",
            "resnet18_maxblur",
            "resnet18d_maxdown",
            "seresnet18",
            "seresnext50d_32x4d",
        ] {
            let mut cfg = ResNetConfig::new(name.parse().unwrap());
            // ResNeXt's 4 channels a group at width 64: none under width 16.
            cfg.width = if cfg.arch.resnext() { 16 } else { 8 };
            let model = Model::new(cfg.clone(), Device::Cpu);
            let eval = EvalTransform {
                resize: 73,
                crop: 64,
                interpolation: Interpolation::Bilinear,
                mean: [0.5; 3],
                std: [0.25; 3],
            };
            let (plain, recorded) = (
                dir.path().join(format!("{name}.plain.safetensors")),
                dir.path().join(format!("{name}.safetensors")),
            );
            save(&model, &plain, &Recorded::default()).unwrap();
            save(&model, &recorded, &Recorded::of_run(&cfg, None, 64, eval)).unwrap();
            let shape = WeightsFile::read(&plain).unwrap().shape().unwrap();
            assert_eq!(
                (shape.width, shape.stem, shape.variant),
                (cfg.width, Stem::ImageNet, cfg.arch.variant),
                "{name}"
            );
            let file = WeightsFile::read(&recorded).unwrap();
            assert_eq!(file.recorded().net.unwrap().arch, cfg.arch, "{name}");
            file.load(&Model::new(cfg.clone(), Device::Cpu)).unwrap();

            let mut other = cfg.clone();
            other.arch.variant = match cfg.arch.variant {
                Variant::D => Variant::B,
                _ => Variant::D,
            };
            if other.arch.pool == Pool::MaxDown {
                // fast.ai's max-pool shortcuts are ResNet-D's alone: the lie names the plain network.
                other.arch.pool = Pool::Timm;
            }
            let lying = dir.path().join(format!("{name}.lying.safetensors"));
            save(&model, &lying, &Recorded::of_run(&other, None, 64, eval)).unwrap();
            let err = WeightsFile::read(&lying).err().unwrap();
            assert!(format!("{err:#}").contains("variant"), "{name}: {err:#}");
        }
    }
}
