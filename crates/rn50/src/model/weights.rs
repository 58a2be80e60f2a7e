//! Weights with torchvision's state_dict keys. rn50 writes safetensors, so files move freely between rn50 and
//! PyTorch (`safetensors.torch.load_file` + `model.load_state_dict`), with the training set's class names in the
//! header's metadata ([`CLASSES_KEY`]). It reads safetensors and torch.save files alike, told apart by their
//! first bytes, not their names: torchvision's `.pth` (a state_dict), pytorch/examples' `checkpoint.pth.tar` /
//! `model_best.pth.tar` (the state_dict under `state_dict`, with DDP's `module.` prefixes), timm's checkpoints,
//! and rn50's own training checkpoints (the model's weights under `model.`). What rn50 records with its weights
//! (the network, the class names, the training and evaluation sizes: [`Recorded`]) is how `rn50 eval`,
//! `classify` and `export` run them without repeating the training's flags.
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use safetensors::tensor::{Dtype, View};
use tch::{Device, Kind, Tensor};

use super::{Model, ResNetConfig, Stem};

pub use super::recorded::{EvalTransform, Interpolation, Recorded, RecordedNet, CLASSES_KEY};

/// `names` to print in a message, as a list (`["cat", "dog"]`): each quoted with its control characters escaped
/// (Rust's `{:?}`), so that a name read from a file cannot colour the terminal or forge a line; the first ten and
/// the count of the rest when there are more.
pub fn names_list(names: &[String]) -> String {
    let shown: Vec<String> = names.iter().take(10).map(|n| format!("{n:?}")).collect();
    match names.len() {
        n if n > 10 => format!("[{}, ... {} more]", shown.join(", "), n - 10),
        _ => format!("[{}]", shown.join(", ")),
    }
}

/// `name` as printed on its own (`rn50 classify`'s lines): its control characters escaped as `{:?}` escapes them
/// (`\u{1b}`, `\n`), the rest as it is.
pub fn printable(name: &str) -> Cow<'_, str> {
    if !name.chars().any(char::is_control) {
        return Cow::Borrowed(name);
    }
    Cow::Owned(
        name.chars()
            .map(|c| match c.is_control() {
                true => c.escape_debug().to_string(),
                false => c.to_string(),
            })
            .collect(),
    )
}

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

/// A CPU copy of a tensor in the form safetensors serialises.
struct HostTensor {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl HostTensor {
    fn new(t: &Tensor) -> Result<Self> {
        let t = t.detach().to_device(Device::Cpu).contiguous();
        let dtype = match t.kind() {
            Kind::Float => Dtype::F32,
            Kind::Double => Dtype::F64,
            Kind::Half => Dtype::F16,
            Kind::BFloat16 => Dtype::BF16,
            Kind::Int64 => Dtype::I64,
            Kind::Int => Dtype::I32,
            Kind::Uint8 => Dtype::U8,
            Kind::Bool => Dtype::BOOL,
            k => bail!("cannot save a {k:?} tensor"),
        };
        let numel = t.numel();
        let mut bytes = vec![0u8; numel * t.kind().elt_size_in_bytes()];
        t.f_copy_data_u8(&mut bytes, numel)?;
        Ok(Self {
            dtype,
            shape: t.size().iter().map(|&d| d as usize).collect(),
            bytes,
        })
    }
}

impl View for &HostTensor {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

/// Writes `tensors` (copied to the CPU, contiguous) and `metadata` (none if empty) to `path` as safetensors,
/// atomically: what weights and training checkpoints are saved with.
pub(crate) fn write_safetensors(
    path: &Path,
    tensors: &[(String, Tensor)],
    metadata: HashMap<String, String>,
) -> Result<()> {
    let host: BTreeMap<&str, HostTensor> = tensors
        .iter()
        .map(|(k, t)| Ok((k.as_str(), HostTensor::new(t).with_context(|| k.clone())?)))
        .collect::<Result<_>>()?;
    let metadata = (!metadata.is_empty()).then_some(metadata);
    rn50_util::atomic_write_with(path, |tmp| -> Result<()> {
        safetensors::serialize_to_file(host.iter().map(|(k, v)| (*k, v)), &metadata, tmp)
            .map_err(|e| anyhow::anyhow!("{e:?}"))
    })
    .with_context(|| format!("writing {}", path.display()))
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
}

impl WeightsShape {
    /// `config` with the classes, width and stem of these weights.
    pub fn apply(&self, config: &mut ResNetConfig) {
        config.num_classes = self.num_classes;
        config.width = self.width;
        config.stem = self.stem;
    }
}

/// The kinds of file weights come in, told by their first bytes.
#[derive(Debug, PartialEq, Eq)]
enum Format {
    /// An 8-byte little-endian header length, then the JSON header.
    Safetensors,
    /// torch.save's zip archive (PyTorch 1.6 and later): "PK\x03\x04".
    TorchZip,
    /// torch.save's format before PyTorch 1.6: a pickled magic number, then pickles and raw storages.
    TorchLegacy,
}

/// The pickle of torch.save's legacy magic number 0x1950a86a20f9469cfc6c (LONG1, 10 bytes, little-endian), after
/// the 2-byte protocol header.
const LEGACY_MAGIC: [u8; 12] = [
    0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19,
];

fn format_of(path: &Path) -> Result<Format> {
    let mut head = Vec::with_capacity(16);
    std::fs::File::open(path)
        .and_then(|f| f.take(16).read_to_end(&mut head))
        .with_context(|| format!("opening weights {}", path.display()))?;
    if head.starts_with(b"PK\x03\x04") {
        Ok(Format::TorchZip)
    } else if head.first() == Some(&0x80) && head.get(2..14) == Some(&LEGACY_MAGIC[..]) {
        Ok(Format::TorchLegacy)
    } else if head.get(8) == Some(&b'{') {
        Ok(Format::Safetensors)
    } else {
        bail!(
            "{} is not a weights file: neither safetensors nor saved by torch.save",
            path.display()
        )
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
        let (tensors, recorded) = match format_of(path)? {
            Format::Safetensors => {
                // The header first: its checks say what is wrong with a file that is no safetensors.
                let recorded = recorded(path)?;
                let tensors = Tensor::read_safetensors(path)
                    .with_context(|| format!("reading weights {}", path.display()))?;
                (checkpoint_model(tensors), recorded)
            }
            Format::TorchZip => (read_torch(path)?, Recorded::default()),
            Format::TorchLegacy => bail!(
                "{} was saved in torch.save's legacy format (PyTorch before 1.6), which rn50 does not read; \
                 convert it once: python -c \"import torch; torch.save(torch.load('{}', map_location='cpu'), \
                 '{}')\"",
                path.display(),
                path.display(),
                converted_name(path).display()
            ),
        };
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
                    "{}: its metadata records {} classes, width {} and the {:?} stem but its tensors are for {} \
                     classes, width {} and the {:?} stem",
                    path.display(),
                    net.shape.num_classes,
                    net.shape.width,
                    net.shape.stem,
                    shape.num_classes,
                    shape.width,
                    shape.stem
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
        let (width, stem) = match size("conv1.weight").as_deref() {
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

/// The prefix of the model's tensors in rn50's training checkpoints (beside `optim.`, `scaler.` and `ema.`).
pub const CHECKPOINT_MODEL_PREFIX: &str = "model.";

/// The weights among the tensors of a safetensors file: all of them in a weights file; the model's, without their
/// [`CHECKPOINT_MODEL_PREFIX`], in an rn50 training checkpoint (one without `fc.bias` but with `model.fc.bias`),
/// not its optimizer's state nor its EMA.
fn checkpoint_model(tensors: Vec<(String, Tensor)>) -> HashMap<String, Tensor> {
    let prefixed = |k: &str| format!("{CHECKPOINT_MODEL_PREFIX}{k}");
    let names: HashSet<&str> = tensors.iter().map(|(k, _)| k.as_str()).collect();
    let checkpoint = !names.contains("fc.bias") && names.contains(prefixed("fc.bias").as_str());
    if !checkpoint {
        return tensors.into_iter().collect();
    }
    tensors
        .into_iter()
        .filter_map(|(k, t)| Some((k.strip_prefix(CHECKPOINT_MODEL_PREFIX)?.to_string(), t)))
        .collect()
}

/// Where the legacy-format `path` converted to torch.save's current format goes: beside it, `.zip` added.
fn converted_name(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".zip");
    path.with_file_name(name)
}

/// What the metadata of the safetensors file `path` records ([`Recorded`]).
fn recorded(path: &Path) -> Result<Recorded> {
    let metadata = match safetensors_header(path)?.get("__metadata__") {
        None | Some(serde_json::Value::Null) => HashMap::new(),
        Some(m) => serde_json::from_value(m.clone()).with_context(|| {
            format!(
                "{}: its metadata does not map strings to strings",
                path.display()
            )
        })?,
    };
    Recorded::from_metadata(&metadata, path)
}

/// The JSON header of a safetensors file: `{"fc.bias": {"dtype": "F32", "shape": [1000], ...}, ...,
/// "__metadata__": {...}}`.
fn safetensors_header(path: &Path) -> Result<serde_json::Value> {
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
    serde_json::from_slice(&header).with_context(not_st)
}

/// The weights of a torch.save file ([`super::torch_save::tensors`] reads every tensor in it): a plain state_dict
/// (torchvision's `.pth`), else the `state_dict` entry (pytorch/examples' checkpoint, timm's) or the `model`
/// entry (torchvision's references); DDP's `module.` prefix is dropped when every name has it.
fn read_torch(path: &Path) -> Result<HashMap<String, Tensor>> {
    let all = super::torch_save::tensors(path)
        .with_context(|| format!("reading {} (a torch.save file)", path.display()))?;
    let under = |entry: &str| -> Vec<(String, &Tensor)> {
        all.iter()
            .filter_map(|(k, t)| {
                let name = match entry {
                    "" => (!k.contains('/')).then_some(k.as_str()),
                    _ => k.strip_prefix(entry)?.strip_prefix('/'),
                };
                Some((name?.to_string(), t))
            })
            .collect()
    };
    let Some(state) = ["state_dict", "model", ""]
        .into_iter()
        .map(under)
        .find(|s| !s.is_empty())
    else {
        let mut names: Vec<&str> = all.iter().map(|(k, _)| k.as_str()).collect();
        names.truncate(5);
        bail!(
            "{} holds no state_dict: no tensors at its top level nor under \"state_dict\" or \"model\" \
             (its tensors: {names:?})",
            path.display()
        );
    };
    let ddp = state.iter().all(|(k, _)| k.starts_with("module."));
    Ok(state
        .into_iter()
        .map(|(k, t)| {
            let k = if ddp {
                k["module.".len()..].to_string()
            } else {
                k
            };
            (k, t.shallow_clone())
        })
        .collect())
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

    /// The format is read from the first bytes, whatever the name: safetensors named `.pth` loads; torch.save's
    /// legacy magic number is the legacy error with a conversion; anything else is not a weights file.
    #[test]
    fn formats_are_told_apart_by_content_not_name() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = ResNetConfig::new(Arch::ResNet18);
        cfg.width = 8;
        let st = dir.path().join("looks-like.pth");
        save(
            &Model::new(cfg.clone(), Device::Cpu),
            &st,
            &Recorded::default(),
        )
        .unwrap();
        WeightsFile::read(&st)
            .unwrap()
            .load(&Model::new(cfg, Device::Cpu))
            .unwrap();
        let write = |name: &str, bytes: &[u8]| {
            let p = dir.path().join(name);
            std::fs::write(&p, bytes).unwrap();
            p
        };
        let mut legacy = vec![0x80, 0x02];
        legacy.extend(LEGACY_MAGIC);
        legacy.extend(b".junk");
        let legacy = write("old.safetensors", &legacy);
        let err = format!("{:#}", WeightsFile::read(&legacy).err().unwrap());
        assert!(err.contains("legacy format"), "{err}");
        assert!(
            err.contains(&format!("'{}'", converted_name(&legacy).display())),
            "{err}"
        );
        for junk in [&b"{}"[..], b"\x08\0\0\0\0\0\0\0[1,2,3,4]", b"PK\x05\x06"] {
            let err = format!(
                "{:#}",
                WeightsFile::read(&write("junk", junk)).err().unwrap()
            );
            assert!(err.contains("not a weights file"), "{junk:?}: {err}");
        }
    }
}
