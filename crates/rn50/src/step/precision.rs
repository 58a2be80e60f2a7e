//! Numeric precision of the training step.
use std::fmt;
use std::str::FromStr;

use anyhow::{bail, Result};
use tch::{Device, Kind};

use crate::machine::CpuInfo;
use crate::model::NarrowestConv;
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
    /// bf16, else fp32), checked against what the device supports. `narrowest` is the network's convolution
    /// with the fewest output channels: see [`BF16_MIN_CONV_CHANNELS`]. Where
    /// that rules bf16 out, the CPU default is fp32 and an explicit `--precision bf16` is an error.
    pub fn resolve(
        requested: Option<Precision>,
        device: Device,
        cpu: &CpuInfo,
        narrowest: NarrowestConv,
    ) -> Result<Precision> {
        let narrow_bf16_unsafe = narrow_bf16_unsafe(cpu, narrowest.channels);
        let p = requested.unwrap_or_else(|| match (device.is_cuda(), cpu.has_bf16()) {
            (true, _) => Precision::Fp16,
            (false, true) if narrow_bf16_unsafe => {
                tracing::info!(
                    "computing in fp32, not bf16: {NARROW_BF16_PROBLEM}, and this network has \
                     convolutions of {}",
                    narrowest.describe()
                );
                Precision::Fp32
            }
            (false, true) => Precision::Bf16,
            (false, false) => Precision::Fp32,
        });
        p.check(device, cpu.has_bf16())?;
        if p == Precision::Bf16 && device == Device::Cpu && narrow_bf16_unsafe {
            bail!(
                "--precision bf16 with convolutions of {} on this {} CPU: {NARROW_BF16_PROBLEM}; {}",
                narrowest.describe(),
                cpu.vendor,
                narrowest.remedy(BF16_MIN_CONV_CHANNELS, "--precision fp32")
            );
        }
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

/// Training convolutions narrower than this in bf16 corrupts the heap on CPUs where oneDNN uses its
/// AVX512-BF16 kernels (no AMX: AMD Zen 4). Measured (issue 13) on a Zen 4 EPYC with PyTorch 2.13, and plain
/// PyTorch crashes the same way (bf16 autocast, channels_last, ResNet-18 stage widths W..8W, batch 1): W = 8
/// crashed 3 runs of 3 ("double free or corruption", in `jit_avx512_core_bf16_1x1_convolution_bwd_weights_t`'s
/// destructor), W = 16 and 32 passed 3 of 3, standard widths (64+) and fp32 pass.
pub const BF16_MIN_CONV_CHANNELS: i64 = 16;

/// What goes wrong, for messages (`rn50 doctor`, the precision error).
pub const NARROW_BF16_PROBLEM: &str = "libtorch's oneDNN corrupts the heap when training convolutions narrower \
     than 16 channels in bf16 on CPUs with AVX512-BF16 but no AMX (e.g. AMD Zen 4; or ONEDNN_MAX_CPU_ISA below AMX)";

/// Whether bf16 on this CPU would hit [`NARROW_BF16_PROBLEM`] for a network whose narrowest convolution has
/// `narrowest_conv` output channels.
fn narrow_bf16_unsafe(cpu: &CpuInfo, narrowest_conv: i64) -> bool {
    narrowest_conv < BF16_MIN_CONV_CHANNELS && cpu.bf16_without_amx()
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
    use crate::machine::parse_cpuinfo;
    use crate::model::ChannelsSetBy;

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
        let cpu = |flags: &str| parse_cpuinfo(&format!("flags\t: {flags}\n"), 2);
        let (spr, zen3) = (cpu("avx512f avx512_bf16 amx_bf16"), cpu("avx2"));
        assert_eq!(
            Precision::resolve(None, Device::Cpu, &spr, NarrowestConv::width(64)).unwrap(),
            Precision::Bf16
        );
        assert_eq!(
            Precision::resolve(None, Device::Cpu, &zen3, NarrowestConv::width(64)).unwrap(),
            Precision::Fp32
        );
        assert_eq!(
            Precision::resolve(None, Device::Cuda(0), &zen3, NarrowestConv::width(8)).unwrap(),
            Precision::Fp16
        );
        assert!(Precision::resolve(
            Some(Precision::Bf16),
            Device::Cpu,
            &zen3,
            NarrowestConv::width(64)
        )
        .is_err());
    }

    /// Narrow nets in bf16 where oneDNN would use its AVX512-BF16 kernels: the default falls back to fp32, an
    /// explicit bf16 is refused with the reason; AMX CPUs, GPUs and 16+ channels are unaffected.
    #[test]
    fn narrow_convolutions_avoid_bf16_without_amx() {
        let cpu = |flags: &str| {
            parse_cpuinfo(&format!("vendor_id\t: AuthenticAMD\nflags\t: {flags}\n"), 2)
        };
        let (spr, zen4) = (
            cpu("avx512f avx512_bf16 amx_bf16"),
            cpu("avx512f avx512_bf16"),
        );
        let spr_capped = CpuInfo {
            onednn_max_isa: Some("AVX512_CORE_BF16".into()),
            ..spr.clone()
        };
        let resolve = |req, cpu: &CpuInfo, width| {
            Precision::resolve(req, Device::Cpu, cpu, NarrowestConv::width(width))
        };
        assert_eq!(resolve(None, &zen4, 8).unwrap(), Precision::Fp32);
        assert_eq!(resolve(None, &zen4, 16).unwrap(), Precision::Bf16);
        assert_eq!(resolve(None, &zen4, 64).unwrap(), Precision::Bf16);
        let e = resolve(Some(Precision::Bf16), &zen4, 8)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--width 16 or more") && e.contains("AMD"), "{e}");
        let se = NarrowestConv {
            channels: 8,
            set_by: ChannelsSetBy::SqueezeExcite,
        };
        let e = Precision::resolve(Some(Precision::Bf16), Device::Cpu, &zen4, se)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("8 channels (squeeze-and-excitation's)")
                && e.ends_with("use --precision fp32")
                && !e.contains("--width"),
            "a wider network does not widen SE's: {e}"
        );
        assert_eq!(
            resolve(Some(Precision::Fp32), &zen4, 8).unwrap(),
            Precision::Fp32
        );
        assert_eq!(
            resolve(Some(Precision::Bf16), &spr, 8).unwrap(),
            Precision::Bf16
        );
        assert_eq!(resolve(None, &spr_capped, 8).unwrap(), Precision::Fp32);
        assert!(resolve(Some(Precision::Bf16), &spr_capped, 8).is_err());
        assert_eq!(
            Precision::resolve(
                Some(Precision::Bf16),
                Device::Cuda(0),
                &zen4,
                NarrowestConv::width(8)
            )
            .unwrap(),
            Precision::Bf16
        );
    }
}
