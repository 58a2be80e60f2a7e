//! Weights as safetensors with torchvision's state_dict keys, so files move freely between rn50 and PyTorch
//! (`safetensors.torch.load_file` + `model.load_state_dict`).
use std::collections::{HashMap, HashSet};
use std::path::Path;

use anyhow::{bail, Context, Result};
use tch::Tensor;

use super::{Model, ResNetConfig, Stem};

/// Keys a torchvision state_dict has that rn50 does not track (BN's step counter, unused with momentum 0.1).
fn ignorable(key: &str) -> bool {
    key.ends_with(".num_batches_tracked")
}

/// Writes the model's state (NCHW-contiguous, fp32 as trained) to `path` atomically ([`rn50_util::atomic`]): a
/// crash leaves either the old file or the new one.
pub fn save(model: &Model, path: &Path) -> Result<()> {
    let tensors: Vec<(String, Tensor)> = model
        .state()
        .into_iter()
        .map(|(k, t)| (k, t.detach().to_device(tch::Device::Cpu).contiguous()))
        .collect();
    rn50_util::atomic_write_with(path, |tmp| -> Result<()> {
        Ok(Tensor::write_safetensors(&tensors, tmp)?)
    })
    .with_context(|| format!("writing {}", path.display()))
}

/// Loads `path` into the model. Every model tensor must be present with the same shape; extra keys other
/// than `num_batches_tracked` are an error (they mean the file is for another architecture).
pub fn load(model: &Model, path: &Path) -> Result<()> {
    load_where(model, path, |_| true)
}

/// The classifier's tensors (`fc.weight`, `fc.bias`): what fine-tuning on other classes starts afresh.
pub fn is_classifier(key: &str) -> bool {
    key.starts_with("fc.")
}

/// [`load`] for every tensor but the classifier's, which keeps its initialisation: the start of fine-tuning on
/// another set of classes (`train --init-weights`).
pub fn load_backbone(model: &Model, path: &Path) -> Result<()> {
    load_where(model, path, |k| !is_classifier(k))
}

/// Copies the tensors of `path` whose names `take` accepts into `model`; the file must hold exactly those of
/// the model's (besides ignorable counters).
fn load_where(model: &Model, path: &Path, take: impl Fn(&str) -> bool) -> Result<()> {
    let file: HashMap<String, Tensor> = Tensor::read_safetensors(path)
        .with_context(|| format!("reading weights {}", path.display()))?
        .into_iter()
        .collect();
    let state: Vec<(String, Tensor)> = model.state().into_iter().filter(|(k, _)| take(k)).collect();
    let known: HashSet<&str> = state.iter().map(|(k, _)| k.as_str()).collect();
    let mut unexpected: Vec<&str> = file
        .keys()
        .map(String::as_str)
        .filter(|k| take(k) && !known.contains(k) && !ignorable(k))
        .collect();
    unexpected.sort_unstable();
    let c = &model.net.config;
    if !unexpected.is_empty() {
        bail!(
            "{} does not match {} ({} classes): unexpected {:?}",
            path.display(),
            c.arch,
            c.num_classes,
            &unexpected[..unexpected.len().min(5)]
        );
    }
    copy_into(state, &file, path).with_context(|| {
        format!(
            "{} does not match {} ({} classes)",
            path.display(),
            c.arch,
            c.num_classes
        )
    })
}

/// What a weights file says about the network it fits, read from its header alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WeightsShape {
    /// The length of `fc.bias`.
    pub num_classes: i64,
    /// Output channels of `conv1`.
    pub width: i64,
    /// A 3x3 `conv1` is the CIFAR stem, 7x7 ImageNet's.
    pub stem: Stem,
}

impl WeightsShape {
    /// `config` with the classes, width and stem of these weights.
    pub fn apply(&self, config: &mut ResNetConfig) {
        config.num_classes = self.num_classes;
        config.width = self.width;
        config.stem = self.stem;
    }
}

pub fn shape_of(path: &Path) -> Result<WeightsShape> {
    use std::io::Read;
    let not_st = || format!("{} is not a safetensors file", path.display());
    let mut f =
        std::fs::File::open(path).with_context(|| format!("opening weights {}", path.display()))?;
    let mut len = [0u8; 8];
    f.read_exact(&mut len).with_context(not_st)?;
    let n = u64::from_le_bytes(len);
    if n > 100 << 20 {
        bail!("{} (header of {n} bytes)", not_st());
    }
    let mut header = vec![0u8; n as usize];
    f.read_exact(&mut header).with_context(not_st)?;
    // The header is JSON: {"fc.bias": {"dtype": "F32", "shape": [1000], ...}, ...}.
    let meta: serde_json::Value = serde_json::from_slice(&header).with_context(not_st)?;
    let shape = |name: &str| -> Option<Vec<i64>> {
        meta[name]["shape"]
            .as_array()?
            .iter()
            .map(|d| d.as_i64())
            .collect()
    };
    let not_resnet = || format!("{} is not ResNet weights", path.display());
    let num_classes = match shape("fc.bias").as_deref() {
        Some(&[n]) => n,
        _ => bail!("{}: no 1-D fc.bias", not_resnet()),
    };
    let (width, stem) = match shape("conv1.weight").as_deref() {
        Some(&[w, 3, 7, 7]) => (w, Stem::ImageNet),
        Some(&[w, 3, 3, 3]) => (w, Stem::Cifar),
        other => bail!("{}: conv1.weight has shape {other:?}", not_resnet()),
    };
    Ok(WeightsShape {
        num_classes,
        width,
        stem,
    })
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
    use super::*;
    use crate::model::{Arch, ResNetConfig};
    use tch::Device;

    #[test]
    fn round_trip_is_exact_and_channels_last_is_saved_as_nchw() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.safetensors");
        tch::manual_seed(1);
        let a = Model::new(ResNetConfig::new(Arch::ResNet18), Device::Cpu);
        a.to_channels_last();
        save(&a, &path).unwrap();
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
        save(&model, &good).unwrap();
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
                load_backbone(&fresh, &path).unwrap_err(),
            ] {
                assert!(format!("{err:#}").contains(want), "{err:#}");
            }
        }
        load(&Model::new(cfg, Device::Cpu), &good).unwrap();
    }
}
