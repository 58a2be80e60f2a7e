//! The compute device: choosing it (`auto`, `cpu`, `cuda`, `cuda:N`, one GPU per local rank) and setting it up,
//! the same way for `bench`, `train` and `eval`.
use anyhow::{bail, Result};
use clap::Args;
use tch::Device;

use rn50_args::{usize_in, MAX_THREADS};

use crate::model::{memory_format, Arch, NarrowestConv};
use crate::step::Precision;

/// `--fused-block-plans`' default: the plans timed per cuDNN graph of the fused bottleneck.
pub const DEFAULT_BLOCK_PLANS: usize = 4;

/// Where and how the network computes: the flags `bench`, `train` and `eval` share (flattened into each), resolved
/// by [`ComputeArgs::resolve`] the same way for all three.
#[derive(Args, Debug, Clone, serde::Serialize)]
pub struct ComputeArgs {
    /// Device: auto (CUDA if present, else CPU), cpu, cuda, cuda:N. Under a launcher, auto and cuda mean GPU
    /// LOCAL_RANK modulo the GPUs this process sees.
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Numeric precision [default: bf16 on CPUs with AMX/AVX512-BF16, else fp32; fp16 (AMP) on GPU].
    #[arg(long, value_enum)]
    pub precision: Option<Precision>,
    /// Use the channels_last (NHWC) memory format [default: on; it wins for fp32 and bf16 on CPU and on GPU; off on
    /// CPU for networks narrower than 16 channels (--width), which crash libtorch's oneDNN in channels_last].
    #[arg(long, overrides_with = "no_channels_last")]
    pub channels_last: bool,
    /// Use the contiguous NCHW memory format instead of channels_last.
    #[arg(long, overrides_with = "channels_last")]
    pub no_channels_last: bool,
    /// On CUDA, run BatchNorm, residual add and ReLU as PyTorch's separate kernels instead of one fused cuDNN
    /// batch norm (same numbers; the fused one saves passes over the activations; compare the two step rates
    /// with `bench`).
    #[arg(long)]
    pub no_fused_bn: bool,
    /// On CUDA in fp16, fold each bottleneck's batch norms into its convolutions through cuDNN graphs (statistics
    /// in one convolution's epilogue, normalisation and ReLU in the next one's prologue, bn3 and the shortcut's in
    /// one pass that adds the branches, as NVIDIA's MLPerf ResNet-50). Numbers as without it; with bn1 and bn2
    /// alone 14% less GPU memory, but on an H200 with cuDNN 9.19 the step was 2% slower (docs/benchmarks.md), hence
    /// off by default. Where cuDNN lacks a graph (bf16 there), the block runs without it and says so once.
    #[arg(long)]
    pub fused_block: bool,
    /// With --fused-block, how many of cuDNN's execution plans each of its graphs builds and times on its first run,
    /// the fastest kept for the run: cuDNN's heuristics in their order (mode A, past the default also mode B,
    /// then the fallback list), 1 to 1000; 1000 times every plan they know. More can find faster plans at the
    /// cost of a longer first step.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_BLOCK_PLANS, value_parser = usize_in(1..=1000))]
    pub fused_block_plans: usize,
    /// On CUDA, run the stem's max-pool as PyTorch's kernel (which writes an int64 index per output and reads it
    /// back in backward) instead of cuDNN's NHWC pooling, which keeps no index and finds each window's maximum
    /// again in backward: the same output and input gradient, 2% less step time and 0.4 GiB less GPU memory on
    /// an H200 (docs/benchmarks.md).
    #[arg(long)]
    pub no_cudnn_pool: bool,
    /// CPU threads of libtorch's intra-op pool (convolutions, matmuls and elementwise ops on CPU), 1 to 1024
    /// [default: bench: the CPUs this process may use, divided between the ranks of its node; elsewhere
    /// OMP_NUM_THREADS if set, else in train with several ranks on a node that same share, else libtorch's own:
    /// the CPUs of this process's affinity mask, a container's CPU quota not counted]. On a loaded or shared node fewer threads can be much faster
    /// (one ran 3.4x faster at 1 thread than at the default): `rn50 doctor` says when the default oversubscribes
    /// the CPUs this process may use.
    #[arg(long, value_name = "N", value_parser = usize_in(1..=MAX_THREADS))]
    pub threads: Option<usize>,
}

/// [`ComputeArgs`] resolved against this machine.
pub struct Compute {
    pub device: Device,
    pub precision: Precision,
    pub channels_last: bool,
    /// Fused batch norm + ReLU where it applies (see [`DeviceSettings::fused_bn`]).
    pub fused_bn: bool,
    /// Bottlenecks with batch norm folded into the convolutions (see [`DeviceSettings::fused_block`]).
    pub fused_block: bool,
    /// See [`DeviceSettings::fused_block_plans`].
    pub fused_block_plans: usize,
    /// The max-pool through cuDNN where it applies (see [`DeviceSettings::cudnn_pool`]).
    pub cudnn_pool: bool,
    pub cpu: crate::machine::CpuInfo,
}

impl ComputeArgs {
    /// Resolves the flags for local rank `local_rank` of a job (0 alone) computing a network whose narrowest
    /// convolution is `narrowest` (which can rule out bf16 on some CPUs, and channels_last
    /// on all: see [`Precision::resolve`] and [`memory_format::resolve`]). `--threads`, when given, becomes
    /// libtorch's intra-op thread count here, before any work.
    pub fn resolve(&self, local_rank: usize, narrowest: NarrowestConv) -> Result<Compute> {
        if let Some(n) = self.threads {
            tch::set_num_threads(n as i32);
        }
        let device = select(&self.device, local_rank)?;
        let cpu = crate::machine::cpu_info();
        let precision = Precision::resolve(self.precision, device, &cpu, narrowest)?;
        // channels_last measured faster on this Sapphire Rapids CPU for fp32 too (8.3 vs 6.6 img/s).
        let requested = match (self.channels_last, self.no_channels_last) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        };
        Ok(Compute {
            device,
            precision,
            channels_last: memory_format::resolve(requested, device, narrowest)?,
            fused_bn: !self.no_fused_bn,
            fused_block: !self.no_fused_bn && self.fused_block,
            fused_block_plans: self.fused_block_plans,
            cudnn_pool: !self.no_cudnn_pool,
            cpu,
        })
    }
}

/// The device of local rank `local_rank` for a `--device` value: `auto` (CUDA if present, else CPU), `cpu`,
/// `cuda`, `cuda:N`. Asking for CUDA where there is none is an error, not a silent CPU run.
pub fn select(spec: &str, local_rank: usize) -> Result<Device> {
    select_among(spec, local_rank, tch::Cuda::device_count())
}

/// [`select`] with `visible` CUDA devices. One GPU per process: `auto` and `cuda` mean GPU
/// `local_rank % visible`, as torchrun-based and NVIDIA's scripts pick it, which is also right where every task
/// sees only its own GPU (SLURM `--gpus-per-task=1` and other launchers that set one `CUDA_VISIBLE_DEVICES` per
/// task: each process has one device, number 0). An explicit `cuda:N` stays N.
fn select_among(spec: &str, local_rank: usize, visible: i64) -> Result<Device> {
    let s = spec.trim().to_ascii_lowercase();
    let index = match s.as_str() {
        "cpu" => return Ok(Device::Cpu),
        "auto" if visible == 0 => return Ok(Device::Cpu),
        "auto" | "cuda" if visible > 0 => local_rank % visible as usize,
        _ => match s.strip_prefix("cuda") {
            Some("") => 0,
            Some(rest) => match rest.strip_prefix(':').and_then(|i| i.parse::<usize>().ok()) {
                Some(i) => i,
                None => bail!("unknown device '{spec}': use auto, cpu, cuda or cuda:N"),
            },
            None => bail!("unknown device '{spec}': use auto, cpu, cuda or cuda:N"),
        },
    };
    if visible == 0 {
        // Not a guess at why: libtorch's has_cuda() is false both for a CPU-only build and for a CUDA build on a
        // machine without a GPU or driver; `rn50 doctor` tells the two apart.
        bail!("--device {spec}: no CUDA device is visible (see `rn50 doctor` for this libtorch's CUDA and the driver)");
    }
    if index as i64 >= visible {
        bail!("--device {spec}: only {visible} CUDA device(s) visible");
    }
    Ok(Device::Cuda(index))
}

/// How a process sets up its device before building a model: the same for `bench`, `train` and `eval`. On
/// CUDA, cuDNN autotuning (`torch.backends.cudnn.benchmark`) and TF32 for matmuls and convolutions (Ampere and
/// newer), as NVIDIA's and timm's recipes run; fixed input sizes make autotuning pay off after the first steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DeviceSettings {
    pub tf32: bool,
    pub cudnn_benchmark: bool,
    /// BatchNorm (+ residual add) + ReLU of training as one cuDNN op ([`crate::model::fused`]); it applies to
    /// fp16/bf16 channels_last CUDA tensors and leaves everything else to the separate ops.
    pub fused_bn: bool,
    /// Each bottleneck in training as one autograd function with its batch norms folded into the convolutions
    /// through cuDNN graphs ([`crate::model::fused::bottleneck`]); same reach as `fused_bn`.
    pub fused_block: bool,
    /// How many of cuDNN's execution plans each of the fused bottleneck's graphs times on its first run
    /// (`--fused-block-plans`).
    pub fused_block_plans: usize,
    /// The stem's max-pool through cuDNN's NHWC pooling, without PyTorch's index tensor
    /// ([`crate::model::fused::max_pool`]); it applies to channels_last CUDA tensors.
    pub cudnn_pool: bool,
}

impl DeviceSettings {
    /// The settings for `device` from the resolved flags: `fused_bn: false` (`--no-fused-bn`) keeps PyTorch's
    /// separate kernels, `fused_block` (`--fused-block`) folds bottlenecks' batch norms into their convolutions,
    /// `cudnn_pool: false` (`--no-cudnn-pool`) keeps PyTorch's max-pool.
    pub fn for_device(device: Device, c: &Compute) -> Self {
        Self {
            fused_block_plans: c.fused_block_plans,
            ..Self::new(device, c.fused_bn, c.fused_block, c.cudnn_pool)
        }
    }

    /// The same from each switch (a recorded bench configuration's), with the default plans per graph.
    pub fn new(device: Device, fused_bn: bool, fused_block: bool, cudnn_pool: bool) -> Self {
        let gpu = device.is_cuda();
        Self {
            tf32: gpu,
            cudnn_benchmark: gpu,
            fused_bn: gpu && fused_bn,
            fused_block: gpu && fused_bn && fused_block,
            fused_block_plans: DEFAULT_BLOCK_PLANS,
            cudnn_pool: gpu && cudnn_pool,
        }
    }

    /// These settings for the network `arch`: the fused batch norm + ReLU and the folded block apply ReLU, so a
    /// network with Mish ([`Arch::mish`]) runs neither; the folded block is a bottleneck's, convolves in one group
    /// and has no room for squeeze-and-excitation, so ResNet-18/34 and ResNeXt's and SE's networks do not fold it.
    /// The start line says so.
    pub fn for_arch(self, arch: Arch) -> Self {
        let folds = arch.bottleneck() && !arch.mish && !arch.se && arch.groups == 1;
        Self {
            fused_bn: self.fused_bn && !arch.mish,
            fused_block: self.fused_block && folds,
            ..self
        }
    }

    /// What runs outside PyTorch's own kernels on a GPU for the network `arch`, for start lines (`None` on a CPU,
    /// where nothing does): "fused BN+ReLU on, folded block off, cuDNN max-pool on". The blur sits inside a
    /// strided bottleneck and self-attention in the first stage's last, which then run unfolded: "folded block on
    /// but for the blurred strided blocks and the self-attention block".
    pub fn gpu_paths(&self, arch: Arch) -> Option<String> {
        let on = |b: bool| if b { "on" } else { "off" };
        // TF32 is on exactly on GPUs.
        self.tf32.then(|| {
            let unfolded: Vec<&str> = [
                (arch.blur, "the blurred strided blocks"),
                (arch.sa, "the self-attention block"),
            ]
            .into_iter()
            .filter_map(|(has, what)| has.then_some(what))
            .collect();
            let except = match unfolded.is_empty() {
                true => String::new(),
                false => format!(" but for {}", unfolded.join(" and ")),
            };
            let plans = if self.fused_block {
                format!("{except} ({} plans per graph)", self.fused_block_plans)
            } else {
                String::new()
            };
            format!(
                "fused BN+ReLU {}, folded block {}{plans}, cuDNN max-pool {}",
                on(self.fused_bn),
                on(self.fused_block),
                on(self.cudnn_pool)
            )
        })
    }

    fn apply(self) -> Result<()> {
        crate::shim::set_tf32(self.tf32)?;
        tch::Cuda::cudnn_set_benchmark(self.cudnn_benchmark);
        crate::model::fused::set_enabled(self.fused_bn);
        crate::model::fused::set_block_enabled(self.fused_block);
        crate::shim::set_block_plans(self.fused_block_plans)?;
        crate::model::fused::set_pool_enabled(self.cudnn_pool);
        Ok(())
    }
}

/// Applies `settings` for `device` to this process and starts its peak-memory count afresh.
pub fn setup(device: Device, settings: DeviceSettings) -> Result<DeviceSettings> {
    settings.apply()?;
    if let Device::Cuda(i) = device {
        crate::shim::cuda_reset_peak(i);
    }
    Ok(settings)
}

pub fn device_name(d: Device) -> String {
    match d {
        Device::Cuda(i) => format!("cuda:{i}"),
        Device::Cpu => "cpu".into(),
        other => format!("{other:?}").to_lowercase(),
    }
}

/// The hardware of the live device `d` as result tables name it: the GPU's model for a CUDA device ("NVIDIA H200",
/// from the driver), else [`device_name`]. A bench result's, from what it recorded, is
/// [`rn50_report::schema::bench_hardware_label`].
pub fn hardware_name(d: Device) -> String {
    let gpu = match d {
        Device::Cuda(i) => crate::machine::cuda_devices().0.into_iter().nth(i),
        _ => None,
    };
    gpu.map_or_else(|| device_name(d), |g| g.name)
}

/// Waits for queued device work, so that wall-clock timings mean something on CUDA.
pub fn synchronize(d: Device) {
    if let Device::Cuda(i) = d {
        tch::Cuda::synchronize(i as i64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects() {
        assert_eq!(select("cpu", 0).unwrap(), Device::Cpu);
        assert!(select("tpu", 0).is_err());
        assert!(select("cuda:x", 0).is_err());
        if tch::Cuda::device_count() == 0 {
            assert_eq!(select("auto", 0).unwrap(), Device::Cpu);
            let e = select("cuda", 0).unwrap_err().to_string();
            assert!(e.contains("no CUDA device"), "{e}");
        }
    }

    /// Faked device counts: 4 ranks on a node of 4 visible GPUs, and 4 ranks that each see one GPU (SLURM
    /// --gpus-per-task=1), where `cuda:LOCAL_RANK` would fail on every rank but the first.
    #[test]
    fn one_gpu_per_local_rank_whatever_each_process_sees() {
        for rank in 0..4 {
            assert_eq!(select_among("auto", rank, 4).unwrap(), Device::Cuda(rank));
            assert_eq!(select_among("cuda", rank, 4).unwrap(), Device::Cuda(rank));
            assert_eq!(select_among("auto", rank, 1).unwrap(), Device::Cuda(0));
            assert_eq!(select_among(" CUDA ", rank, 1).unwrap(), Device::Cuda(0));
            assert_eq!(select_among("auto", rank, 0).unwrap(), Device::Cpu);
            assert_eq!(select_among("cpu", rank, 4).unwrap(), Device::Cpu);
        }
        assert_eq!(
            select_among("cuda", 5, 4).unwrap(),
            Device::Cuda(1),
            "2 ranks a GPU"
        );
        assert_eq!(
            select_among("cuda:1", 3, 2).unwrap(),
            Device::Cuda(1),
            "explicit stays"
        );
        let e = select_among("cuda:1", 1, 1).unwrap_err().to_string();
        assert!(e.contains("only 1 CUDA device"), "{e}");
        assert!(select_among("cuda", 0, 0).is_err());
    }

    /// Every command's device set-up: autotuning and TF32 on CUDA, off on CPU (the flags are libtorch's global
    /// context, which exists without a GPU).
    #[test]
    fn device_settings_reach_libtorch() {
        let gpu = DeviceSettings::new(Device::Cuda(0), true, true, true);
        assert!(gpu.tf32 && gpu.cudnn_benchmark && gpu.fused_bn && gpu.fused_block);
        let no_bn = DeviceSettings::new(Device::Cuda(0), false, true, true);
        assert!(
            !no_bn.fused_bn && !no_bn.fused_block,
            "--no-fused-bn turns off both"
        );
        let no_block = DeviceSettings::new(Device::Cuda(0), true, false, false);
        assert!(no_block.fused_bn && !no_block.fused_block && !no_block.cudnn_pool);
        let r50 = Arch::ResNet50;
        assert_eq!(
            no_block.gpu_paths(r50).as_deref(),
            Some("fused BN+ReLU on, folded block off, cuDNN max-pool off")
        );
        assert!(
            gpu.cudnn_pool,
            "the cuDNN max-pool is on by default on a GPU"
        );
        assert_eq!(
            gpu.gpu_paths(r50).as_deref(),
            Some("fused BN+ReLU on, folded block on (4 plans per graph), cuDNN max-pool on")
        );
        let mish: Arch = "resnet50d_mish".parse().unwrap();
        assert_eq!(
            gpu.for_arch(mish).gpu_paths(mish).as_deref(),
            Some("fused BN+ReLU off, folded block off, cuDNN max-pool on"),
            "their kernels apply ReLU"
        );
        let blur: Arch = "resnetblur50d".parse().unwrap();
        assert_eq!(gpu.for_arch(blur), gpu);
        assert_eq!(
            gpu.gpu_paths(blur).as_deref(),
            Some(
                "fused BN+ReLU on, folded block on but for the blurred strided blocks (4 plans per graph), \
                 cuDNN max-pool on"
            )
        );
        let both: Arch = "resnetblur50d_sa".parse().unwrap();
        assert_eq!(
            gpu.for_arch(both).gpu_paths(both).as_deref(),
            Some(
                "fused BN+ReLU on, folded block on but for the blurred strided blocks and the self-attention \
                 block (4 plans per graph), cuDNN max-pool on"
            )
        );
        for unfolded in ["resnext50_32x4d", "seresnet50", "resnet18"] {
            let arch: Arch = unfolded.parse().unwrap();
            assert_eq!(
                gpu.for_arch(arch).gpu_paths(arch).as_deref(),
                Some("fused BN+ReLU on, folded block off, cuDNN max-pool on"),
                "{unfolded}: the folded block is a bottleneck's, convolves in one group, without SE"
            );
        }
        let e = crate::shim::set_block_plans(0).unwrap_err().to_string();
        assert!(e.contains("at least 1"), "{e}");
        gpu.apply().unwrap();
        assert!(crate::shim::tf32() && crate::shim::cudnn_benchmark());
        assert!(crate::model::fused::enabled() && crate::model::fused::block_enabled());
        assert!(crate::model::fused::pool_enabled());
        let cpu = setup(
            Device::Cpu,
            DeviceSettings::new(Device::Cpu, true, true, true),
        )
        .unwrap();
        assert_eq!(
            cpu,
            DeviceSettings {
                tf32: false,
                cudnn_benchmark: false,
                fused_bn: false,
                fused_block: false,
                fused_block_plans: DEFAULT_BLOCK_PLANS,
                cudnn_pool: false
            }
        );
        assert_eq!(cpu.gpu_paths(r50), None);
        assert!(!crate::shim::tf32() && !crate::shim::cudnn_benchmark());
        assert!(!crate::model::fused::enabled(), "no fused BN on a CPU");
        assert!(
            !crate::model::fused::block_enabled(),
            "no fused block on a CPU"
        );
        assert!(
            !crate::model::fused::pool_enabled(),
            "no cuDNN max-pool on a CPU"
        );
    }
}
