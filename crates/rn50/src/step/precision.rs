//! Numeric precision of the training step.
use std::fmt;
use std::str::FromStr;

use anyhow::{bail, Result};
use tch::{Device, Kind};

use crate::shim::Autocast;

#[derive(
    Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// fp32 everywhere (TF32 matmuls on Ampere+ GPUs unless disabled).
    Fp32,
    /// bf16 autocast: CPU (AMX / AVX512-BF16) or CUDA; no loss scaling needed.
    Bf16,
    /// fp16 autocast with dynamic loss scaling; CUDA only.
    Fp16,
}

impl Precision {
    /// The autocast dtype, None for fp32.
    pub fn autocast_kind(self) -> Option<Kind> {
        match self {
            Precision::Fp32 => None,
            Precision::Bf16 => Some(Kind::BFloat16),
            Precision::Fp16 => Some(Kind::Half),
        }
    }

    /// Enters autocast for this precision on `device` (None for fp32).
    pub fn autocast(self, device: Device) -> Result<Option<Autocast>> {
        self.autocast_kind()
            .map(|k| Autocast::enter(device, k))
            .transpose()
    }

    /// fp16 gradients underflow without a loss scaler.
    pub fn needs_loss_scaling(self) -> bool {
        self == Precision::Fp16
    }

    /// The requested precision, or the default for the device (fp16 AMP on GPU; bf16 on CPUs with native
    /// bf16, else fp32), checked against what the device supports.
    pub fn resolve(
        requested: Option<Precision>,
        device: Device,
        cpu_bf16: bool,
    ) -> Result<Precision> {
        let p = requested.unwrap_or(match (device.is_cuda(), cpu_bf16) {
            (true, _) => Precision::Fp16,
            (false, true) => Precision::Bf16,
            (false, false) => Precision::Fp32,
        });
        p.check(device, cpu_bf16)?;
        Ok(p)
    }

    /// Whether this precision can run on `device`; `cpu_bf16` says if the CPU has native bf16.
    pub fn check(self, device: Device, cpu_bf16: bool) -> Result<()> {
        match (self, device) {
            (Precision::Fp16, Device::Cpu) => {
                bail!("--precision fp16 is for CUDA devices; on CPU use bf16 (or fp32)")
            }
            (Precision::Bf16, Device::Cpu) if !cpu_bf16 => bail!(
                "--precision bf16 needs a CPU with AMX or AVX512-BF16 (this one has neither); use --precision fp32"
            ),
            _ => Ok(()),
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Precision::Fp32 => "fp32",
            Precision::Bf16 => "bf16",
            Precision::Fp16 => "fp16",
        })
    }
}

impl FromStr for Precision {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        <Self as clap::ValueEnum>::from_str(s, true)
            .map_err(|_| anyhow::anyhow!("unknown precision '{s}': fp32, bf16 or fp16"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_support_rules() {
        assert!(Precision::Bf16.check(Device::Cpu, true).is_ok());
        let e = Precision::Bf16
            .check(Device::Cpu, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("AMX or AVX512-BF16"), "{e}");
        assert!(Precision::Fp16.check(Device::Cpu, true).is_err());
        assert!(Precision::Fp16.check(Device::Cuda(0), false).is_ok());
        assert!(Precision::Fp32.check(Device::Cpu, false).is_ok());
        assert_eq!("BF16".parse::<Precision>().unwrap(), Precision::Bf16);
        assert_eq!(
            Precision::resolve(None, Device::Cpu, true).unwrap(),
            Precision::Bf16
        );
        assert_eq!(
            Precision::resolve(None, Device::Cpu, false).unwrap(),
            Precision::Fp32
        );
        assert_eq!(
            Precision::resolve(None, Device::Cuda(0), false).unwrap(),
            Precision::Fp16
        );
        assert!(Precision::resolve(Some(Precision::Bf16), Device::Cpu, false).is_err());
    }
}
