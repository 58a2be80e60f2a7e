//! The files weights are stored in: safetensors, which rn50 writes (weights and training checkpoints) and reads
//! with what is recorded in its header's metadata, and torch.save's files, which it reads; told apart by their
//! first bytes, not their names. What the tensors must be to load into a model is [`super::weights`]'.
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use safetensors::tensor::{Dtype, View};
use tch::{Device, Kind, Tensor};

use super::recorded::Recorded;

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

/// The tensors of the weights file `path` (safetensors or torch.save's, see the module's doc) by torchvision's
/// names, and what it records ([`Recorded`]: nothing for torch.save's files); the legacy torch.save format is an
/// error with the one-line conversion.
pub(super) fn read(path: &Path) -> Result<(HashMap<String, Tensor>, Recorded)> {
    Ok(match format_of(path)? {
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
})
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::weights::{save, WeightsFile};
    use crate::model::{Arch, Model, ResNetConfig};

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
