//! Choosing the compute device: `auto`, `cpu`, `cuda`, `cuda:N`.
use anyhow::{bail, Result};
use clap::Args;
use tch::Device;

use crate::step::Precision;

/// Where and how the network computes: the flags `train` and `eval` share.
#[derive(Args, Debug, Clone, serde::Serialize)]
pub struct ComputeArgs {
    /// Device: auto (CUDA if present, else CPU), cpu, cuda, cuda:N.
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Numeric precision [default: bf16 on CPUs with AMX/AVX512-BF16, else fp32; fp16 on GPU].
    #[arg(long, value_enum)]
    pub precision: Option<Precision>,
    /// Use the contiguous NCHW memory format instead of channels_last.
    #[arg(long)]
    pub no_channels_last: bool,
}

/// [`ComputeArgs`] resolved against this machine.
pub struct Compute {
    pub device: Device,
    pub precision: Precision,
    pub channels_last: bool,
    pub cpu: crate::machine::CpuInfo,
}

impl ComputeArgs {
    pub fn resolve(&self) -> Result<Compute> {
        self.resolve_local(0)
    }

    /// As `resolve` for local rank `local_rank` of a data-parallel job: one GPU per process, so `auto` and
    /// `cuda` mean GPU number `local_rank` (an explicit `cuda:N` stays N).
    pub fn resolve_local(&self, local_rank: usize) -> Result<Compute> {
        let spec = self.device.trim().to_ascii_lowercase();
        let device = match parse_device(&spec)? {
            Device::Cuda(0) if local_rank > 0 && (spec == "auto" || spec == "cuda") => {
                parse_device(&format!("cuda:{local_rank}"))?
            }
            d => d,
        };
        let cpu = crate::machine::cpu_info();
        let precision = Precision::resolve(self.precision, device, cpu.has_bf16())?;
        Ok(Compute {
            device,
            precision,
            channels_last: !self.no_channels_last,
            cpu,
        })
    }
}

/// Resolves a `--device` value; asking for CUDA where there is none is an error, not a silent CPU run.
pub fn parse_device(spec: &str) -> Result<Device> {
    let n = tch::Cuda::device_count();
    let s = spec.trim().to_ascii_lowercase();
    match s.as_str() {
        "auto" => Ok(if n > 0 { Device::Cuda(0) } else { Device::Cpu }),
        "cpu" => Ok(Device::Cpu),
        _ => {
            let index = match s.strip_prefix("cuda") {
                Some("") => 0,
                Some(rest) => match rest.strip_prefix(':').and_then(|i| i.parse::<usize>().ok()) {
                    Some(i) => i,
                    None => bail!("unknown device '{spec}': use auto, cpu, cuda or cuda:N"),
                },
                None => bail!("unknown device '{spec}': use auto, cpu, cuda or cuda:N"),
            };
            if n == 0 {
                bail!(
                    "--device {spec}: no CUDA device is visible (this libtorch {} CUDA; see `rn50 doctor`)",
                    if tch::utils::has_cuda() { "has" } else { "was built without" }
                );
            }
            if index as i64 >= n {
                bail!("--device {spec}: only {n} CUDA device(s) visible");
            }
            Ok(Device::Cuda(index))
        }
    }
}

pub fn device_name(d: Device) -> String {
    match d {
        Device::Cuda(i) => format!("cuda:{i}"),
        Device::Cpu => "cpu".into(),
        other => format!("{other:?}").to_lowercase(),
    }
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
        assert_eq!(parse_device("cpu").unwrap(), Device::Cpu);
        assert!(parse_device("tpu").is_err());
        assert!(parse_device("cuda:x").is_err());
        if tch::Cuda::device_count() == 0 {
            assert_eq!(parse_device("auto").unwrap(), Device::Cpu);
            let e = parse_device("cuda").unwrap_err().to_string();
            assert!(e.contains("no CUDA device"), "{e}");
        }
    }
}
