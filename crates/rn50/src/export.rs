//! `rn50 export`: saved weights as a TorchScript module, which `torch.jit.load` (Python) and `torch::jit::load`
//! (C++) run without rn50, and which `torch.onnx.export` turns into ONNX (docs/train.md, "Exporting").
//!
//! The module is the model's eval forward traced on CPU in fp32: it takes what torchvision's ResNets take, a
//! normalised NCHW float batch (ImageNet's mean and std, as `rn50 eval` and `rn50 classify` apply them outside
//! the model), and returns the logits. Tracing records the operations, not the example's shape: the module runs
//! on any batch size and image size (tests/export.rs checks both against torchvision). The weights are frozen
//! into the graph as constants, so the module has no trainable parameters.
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use rn50_args::UsageError;
use tch::{CModule, Device, Kind, Tensor};

use crate::device::ComputeArgs;
use crate::model::Arch;
use crate::step::Precision;
use crate::train::eval::load_for_inference;

/// The side of the example image the model is traced on; any other works as well.
const TRACE_SIZE: i64 = 224;

/// Write saved weights as a TorchScript module (for PyTorch, C++ and ONNX).
#[derive(Args, Debug, Clone)]
pub struct ExportArgs {
    /// Weights (safetensors with torchvision's keys, e.g. from `rn50 train` or converted from PyTorch).
    #[arg(long)]
    pub weights: PathBuf,
    /// Model architecture.
    #[arg(short = 'a', long = "arch", default_value = "resnet50", value_parser = clap::value_parser!(Arch))]
    pub arch: Arch,
    /// The TorchScript file to write (written whole or not at all).
    #[arg(long)]
    pub out: PathBuf,
    /// Replace --out if it exists.
    #[arg(long)]
    pub overwrite: bool,
    /// Also write what was exported (arch, classes, parameters, bytes) as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

/// What `rn50 export` wrote, as `--json` reports it.
#[derive(Debug, serde::Serialize)]
pub struct Exported {
    pub out: PathBuf,
    pub arch: Arch,
    pub num_classes: i64,
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
    // CPU, fp32, NCHW: the module computes in the dtype and on the device of its input, like torchvision's.
    let compute = ComputeArgs {
        device: "cpu".into(),
        precision: Some(Precision::Fp32),
        channels_last: false,
        no_channels_last: true,
        no_fused_bn: true,
    };
    let (mut model, _) = load_for_inference(args.arch, &args.weights, &compute)?;
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
    .context("tracing the model")?;
    rn50_util::atomic_write_with(&args.out, |tmp| -> Result<()> { Ok(module.save(tmp)?) })
        .with_context(|| format!("writing {}", args.out.display()))?;
    let exported = Exported {
        out: args.out.clone(),
        arch: args.arch,
        num_classes: model.net.config.num_classes,
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
        rn50_util::atomic_write(p, serde_json::to_string_pretty(&exported)?.as_bytes())
            .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}
