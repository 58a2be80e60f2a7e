//! `rn50 export`: saved weights as a TorchScript module, which `torch.jit.load` (Python) and `torch::jit::load`
//! (C++) run without rn50, and which `torch.onnx.export` turns into ONNX (docs/train.md, "Exporting").
//!
//! The module is the model's eval forward traced on CPU in fp32: it takes what torchvision's ResNets take, a
//! normalised NCHW float batch (ImageNet's mean and std, as `rn50 eval` and `rn50 classify` apply them outside
//! the model), and returns the logits. Tracing records the operations, not the example's shape: the module runs
//! on any batch size and image size (tests/program/export.rs checks both against torchvision). The weights are frozen
//! into the graph as constants, so the module has no trainable parameters. The network is `-a`'s, else the one
//! the weights record, else ResNet-50; `--json` says how to make the module's input from an image (the resize,
//! crop, mean and std the weights record, else torchvision's).
//!
//! Before any work, --out's (and --json's) folder is checked to take a new file: a missing or read-only folder is
//! a one-line error naming the path, not libtorch's C++ stack after the tracing. An export killed mid-write
//! (kill -9) leaves its temporary `.NAME.tmpPID` (see [`rn50_util::atomic`]) next to --out: the next export to
//! that name removes those of processes that are gone, as `rn50 train` does in its run directory.
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context, Result};
use clap::Args;
use rn50_args::UsageError;
use tch::{CModule, Device, Kind, Tensor};

use crate::device::ComputeArgs;
use crate::infer::{load_for_inference, Inference, ValSizeArgs};
use crate::model::weights::{EvalTransform, WeightsFile};
use crate::model::Arch;
use crate::step::Precision;

/// The side of the example image the model is traced on; any other works as well.
const TRACE_SIZE: i64 = 224;

/// Write saved weights as a TorchScript module (for PyTorch, C++ and ONNX).
#[derive(Args, Debug, Clone)]
pub struct ExportArgs {
    /// Weights: safetensors with torchvision's keys (from `rn50 train`: best/final.safetensors or a checkpoint)
    /// or a torch.save file (torchvision's .pth, pytorch/examples' checkpoint.pth.tar), told apart by content.
    #[arg(long)]
    pub weights: PathBuf,
    /// Model architecture [default: the one recorded with the weights, else resnet50].
    #[arg(short = 'a', long = "arch", value_parser = clap::value_parser!(Arch))]
    pub arch: Option<Arch>,
    /// The TorchScript file to write (written whole or not at all).
    #[arg(long)]
    pub out: PathBuf,
    /// Replace --out if it exists.
    #[arg(long)]
    pub overwrite: bool,
    /// Also write what was exported (arch, classes and their names, the input the module expects, parameters,
    /// bytes) as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

/// What `rn50 export` wrote, as `--json` reports it.
#[derive(Debug, serde::Serialize)]
pub struct Exported {
    pub out: PathBuf,
    pub arch: Arch,
    pub num_classes: i64,
    /// The class names recorded with the weights (null without): the module does not carry them.
    pub class_names: Option<Vec<String>>,
    /// How to make the module's input from an image (resize, center crop, interpolation, mean, std): what the
    /// weights record, else torchvision's 256 → 224 with ImageNet's mean and std.
    pub eval_transform: EvalTransform,
    /// The side of the images the weights were trained on (null where not recorded).
    pub image_size: Option<usize>,
    pub parameters: i64,
    pub bytes: u64,
}

pub fn run(args: &ExportArgs) -> Result<()> {
    if args.out.is_dir() {
        return Err(UsageError::new(format!(
            "--out {} is a directory: give the file to write, e.g. {}",
            args.out.display(),
            args.out.join("model.pt").display()
        ))
        .into());
    }
    if args.out.exists() && !args.overwrite {
        return Err(UsageError::new(format!(
            "--out {} exists: pass --overwrite to replace it",
            args.out.display()
        ))
        .into());
    }
    prepare_out("--out", &args.out)?;
    if let Some(p) = &args.json {
        prepare_out("--json", p)?;
    }
    // CPU, fp32, NCHW: the module computes in the dtype and on the device of its input, like torchvision's.
    let compute = ComputeArgs {
        device: "cpu".into(),
        precision: Some(Precision::Fp32),
        channels_last: false,
        no_channels_last: true,
        no_fused_bn: true,
        fused_block: false,
        fused_block_plans: crate::device::DEFAULT_BLOCK_PLANS,
        no_cudnn_pool: true,
        threads: None,
    };
    let file = WeightsFile::read(&args.weights)?;
    let run = Inference::new(&file, args.arch, &ValSizeArgs::default())?;
    tracing::info!("rn50 export: {}", run.used);
    let (mut model, _) = load_for_inference(run.arch, &file, &compute)?;
    let class_names = file.classes().map(<[String]>::to_vec);
    drop(file);
    let parameters = model.num_parameters();
    // The tracer records tensors other than the input as constants of the graph, which it refuses for tensors
    // that require grad.
    model.vs.freeze();
    let example = Tensor::randn([1, 3, TRACE_SIZE, TRACE_SIZE], (Kind::Float, Device::Cpu));
    let module = tch::no_grad(|| {
        CModule::create_by_tracing("ResNet", "forward", &[example], &mut |x| {
            vec![model.forward_t(&x[0], false)]
        })
    })
    .map_err(torch_error)
    .context("tracing the model")?;
    rn50_util::atomic_write_with(&args.out, |tmp| save_module(&module, tmp))
        .with_context(|| format!("writing {}", args.out.display()))?;
    let exported = Exported {
        out: args.out.clone(),
        arch: run.arch,
        num_classes: model.net.config.num_classes,
        class_names,
        eval_transform: run.transform,
        image_size: run.image_size,
        parameters,
        bytes: std::fs::metadata(&args.out)?.len(),
    };
    println!(
        "wrote {}: TorchScript {}, {} classes, {} parameters, {:.1} MB; input: normalised NCHW float [N, 3, H, W]",
        exported.out.display(),
        exported.arch,
        exported.num_classes,
        exported.parameters,
        exported.bytes as f64 / 1e6
    );
    if let Some(p) = &args.json {
        // As Python's json.dumps writes it: every character beyond printable ASCII escaped, so that the class
        // names (anyone's to write into a weights file) print safely from the file too.
        let json = crate::pyjson::python_json(&exported)? + "\n";
        rn50_util::atomic_write(p, json.as_bytes())
            .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

/// Writes `module` to `path` as TorchScript. libtorch's own writer aborts the process when the disk fills up (its
/// zip writer throws "unexpected pos" from a destructor: "terminate called", exit 134): it writes into memory
/// instead (a memfd, by its /proc/self/fd path), and Rust's I/O copies that to `path`, where a full disk is an
/// error like any other.
fn save_module(module: &CModule, path: &Path) -> Result<()> {
    use std::io::{Seek, Write};
    use std::os::fd::{AsRawFd, FromRawFd};
    // SAFETY: a NUL-terminated name; the descriptor returned is new, and the File owns it from here on.
    let mut memory = unsafe {
        let fd = libc::memfd_create(c"rn50-export".as_ptr(), libc::MFD_CLOEXEC);
        if fd < 0 {
            return Err(std::io::Error::last_os_error()).context("memfd_create");
        }
        std::fs::File::from_raw_fd(fd)
    };
    module
        .save(format!("/proc/self/fd/{}", memory.as_raw_fd()))
        .map_err(torch_error)?;
    memory.rewind()?;
    let mut file = std::fs::File::create(path)?;
    std::io::copy(&mut memory, &mut file)?;
    file.flush()?;
    Ok(())
}

/// Readies `path` (the value of `flag`) to be written: removes the temporary files that killed writers of it left
/// (`.NAME.tmpPID` of a process that is gone; a live writer's, and other files' temporaries, are left alone: the
/// folder is the user's, not rn50's), then checks that its folder exists and takes a new file, by creating and
/// removing this process's own temporary file there. Each failure is one line naming `path`.
pub(crate) fn prepare_out(flag: &str, path: &Path) -> Result<()> {
    let tmp = rn50_util::atomic::temp_path(path)
        .map_err(|e| anyhow!("{flag} {}: {e}", path.display()))?;
    let dir = tmp.parent().unwrap_or(Path::new("."));
    let name = path.file_name().unwrap_or_default();
    rn50_util::atomic::remove_stale_temps_of(dir, |n| name == n);
    match std::fs::metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(anyhow!(
                "{flag} {}: there is no folder {}",
                path.display(),
                dir.display()
            ))
        }
        Err(e) => {
            return Err(anyhow!(
                "{flag} {}: its folder {} cannot be used: {e}",
                path.display(),
                dir.display()
            ))
        }
        Ok(m) if !m.is_dir() => {
            return Err(anyhow!(
                "{flag} {}: {} is not a folder",
                path.display(),
                dir.display()
            ))
        }
        Ok(_) => {}
    }
    std::fs::File::create(&tmp)
        .and_then(|_| std::fs::remove_file(&tmp))
        .map_err(|e| {
            anyhow!(
                "{flag} {}: cannot write in {}: {e}",
                path.display(),
                dir.display()
            )
        })
}

/// A libtorch error without the C++ stack that follows its message ("Exception raised from ...", "frame #0: ..."),
/// on one line.
fn torch_error(e: tch::TchError) -> anyhow::Error {
    let text = e.to_string();
    let message: Vec<&str> = text
        .lines()
        .take_while(|l| !l.starts_with("Exception raised from") && !l.starts_with("frame #"))
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    anyhow!("{}", message.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torch_errors_lose_their_cpp_stack() {
        // What libtorch's save says of a missing folder (17 frames in all), and a message with its source line.
        let save = "Parent directory /x does not exist.\nframe #0: c10::Error::Error(c10::SourceLocation) + \
                    0x9d (0x7f in libc10.so)\nframe #1: <unknown function> + 0x11 (0x55 in rn50)\n";
        let check =
            "Expected a tensor\nof rank 4\nException raised from f at a.cpp:9 (most recent call \
                     first):\nframe #0: g + 0x1 (0x7f in libc10.so)";
        for (raw, want) in [
            (
                save,
                "Internal torch error: Parent directory /x does not exist.",
            ),
            (check, "Internal torch error: Expected a tensor of rank 4"),
        ] {
            let e = torch_error(tch::TchError::Torch(raw.into()));
            assert_eq!(format!("{e:#}"), want);
        }
    }
}
