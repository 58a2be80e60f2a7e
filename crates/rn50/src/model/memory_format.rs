//! channels_last for tch, which has no memory-format API: a 4-D NCHW tensor whose memory is NHWC; and whether
//! a run may use it ([`resolve`]).
use anyhow::{bail, Result};
use tch::{Device, Tensor};

use super::NarrowestConv;

/// Training a network whose narrowest convolution has fewer output channels than this in channels_last corrupts
/// the heap on CPUs. Measured (issue 25) on a Zen 4 EPYC with PyTorch 2.13 (oneDNN 3.12), where plain PyTorch
/// crashes the same way: the weight gradient of a 1x1 stride-2 convolution (a ResNet downsample: stage 2's reads
/// `--width` channels) with fewer than 16 input channels and NHWC input writes past its scratch buffer ("double
/// free or corruption", SIGSEGV), in fp32 and bf16, for ResNet-18 of widths 1-15 from 224-512 px (64-96 px with
/// the CIFAR stem); 16 channels and more pass at every size up to 4096 px, and NCHW passes everywhere. The kernel
/// (`jit_1x1:avx512_core` backward_weights, through its "reduce to unit stride" copy; uxlfoundation/oneDNN#6035)
/// is the only fp32 one oneDNN has for it on every AVX-512 CPU, Intel with AMX included, and its AVX2 twin
/// fails below 8 channels (wrong gradients, hangs, crashes: `ONEDNN_MAX_CPU_ISA=AVX2`). Where the overflow
/// lands depends on the cache-sized blocking, the batch and the thread count, so no image size is promised safe:
/// the bound is on the width alone, on every CPU.
pub const CHANNELS_LAST_MIN_CONV_CHANNELS: i64 = 16;

/// What goes wrong, for messages.
pub const NARROW_CHANNELS_LAST_PROBLEM: &str = "libtorch's oneDNN corrupts the heap (\"double free or \
     corruption\", segmentation faults) when training channels_last 1x1 stride-2 convolutions with fewer than 16 \
     input channels on CPUs (the downsamples of ResNets narrower than 16 channels; seen from 224 px, 64 px with \
     --augment cifar)";

/// Whether a run computes in channels_last. `requested` is `--channels-last` (`Some(true)`),
/// `--no-channels-last` (`Some(false)`) or neither (`None`: channels_last, which wins for fp32 and bf16 on CPU and
/// on GPU), and `narrowest` the network's convolution with the fewest output channels.
/// On a CPU, a network narrower than [`CHANNELS_LAST_MIN_CONV_CHANNELS`] computes in NCHW by default, with a log
/// line saying why, and an explicit `--channels-last` for it is an error: see [`NARROW_CHANNELS_LAST_PROBLEM`].
pub fn resolve(requested: Option<bool>, device: Device, narrowest: NarrowestConv) -> Result<bool> {
    let unsafe_here = device == Device::Cpu && narrowest.channels < CHANNELS_LAST_MIN_CONV_CHANNELS;
    match requested {
        Some(true) if unsafe_here => bail!(
            "--channels-last with convolutions of {} on a CPU: {NARROW_CHANNELS_LAST_PROBLEM}; {}",
            narrowest.describe(),
            narrowest.remedy(CHANNELS_LAST_MIN_CONV_CHANNELS, "--no-channels-last")
        ),
        Some(cl) => Ok(cl),
        None if unsafe_here => {
            tracing::info!(
                "computing in NCHW, not channels_last: {NARROW_CHANNELS_LAST_PROBLEM}, and this network has \
                 convolutions of {}",
                narrowest.describe()
            );
            Ok(false)
        }
        None => Ok(true),
    }
}

/// A copy of `t` with NHWC memory and NCHW shape, and the strides PyTorch gives it (`t.to(memory_format=
/// torch.channels_last)`, as `Module.to` does): `[C·H·W, 1, W·C, C]` also where H and W are 1. A 1x1 conv's weight
/// and squeeze-and-excitation's pooled `[N, C, 1, 1]` are NCHW and NHWC at once in memory, and a convolution picks
/// its kernels by these strides: with others than PyTorch's it computes (and rounds) otherwise.
pub fn channels_last(t: &Tensor) -> Tensor {
    let s = t.size();
    let strides = [s[1] * s[2] * s[3], 1, s[3] * s[1], s[1]];
    let mut out = Tensor::empty_strided(&s, strides, (t.kind(), t.device()));
    out.copy_(t);
    out
}

/// Re-stride a parameter in place, keeping its identity (autograd leaf, optimizer references).
pub fn set_channels_last(t: &mut Tensor) {
    let cl = tch::no_grad(|| channels_last(t));
    t.set_data(&cl);
}

/// True when `t` is a 4-D tensor laid out NHWC in memory.
pub fn is_channels_last(t: &Tensor) -> bool {
    if t.dim() != 4 {
        return false;
    }
    let (size, stride) = (t.size(), t.stride());
    let (c, h, w) = (size[1], size[2], size[3]);
    stride[1] == 1 && stride[3] == c && stride[2] == c * w && stride[0] == c * h * w
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ChannelsSetBy;
    use tch::Kind;

    #[test]
    fn restride_keeps_values_and_changes_layout() {
        let x = Tensor::randn([2, 3, 4, 5], (Kind::Float, Device::Cpu));
        let y = channels_last(&x);
        assert!(is_channels_last(&y));
        assert!(!is_channels_last(&x));
        assert_eq!(x, y);
        // PyTorch's strides where H and W are 1 (`torch.randn(16, 256, 1, 1).to(memory_format=
        // torch.channels_last).stride()`), where a plain permute and copy would keep (256, 1, 1, 1).
        let w = channels_last(&Tensor::randn([16, 256, 1, 1], (Kind::Float, Device::Cpu)));
        assert_eq!(w.stride(), [256, 1, 256, 256]);
        assert!(is_channels_last(&w));
    }

    /// Narrow nets on a CPU: NCHW by default, an explicit --channels-last refused with the reason; 16+ channels,
    /// an explicit --no-channels-last and GPUs are unaffected.
    #[test]
    fn narrow_convolutions_avoid_channels_last_on_cpu() {
        let cpu = |req, width| resolve(req, Device::Cpu, NarrowestConv::width(width));
        assert!(!cpu(None, 15).unwrap());
        assert!(!cpu(None, 8).unwrap());
        assert!(!cpu(None, 1).unwrap());
        assert!(cpu(None, 16).unwrap());
        assert!(cpu(None, 64).unwrap());
        let e = cpu(Some(true), 15).unwrap_err().to_string();
        assert!(
            e.contains("--width 16 or more")
                && e.contains("--no-channels-last")
                && e.contains("1x1 stride-2"),
            "{e}"
        );
        let se = NarrowestConv {
            channels: 8,
            set_by: ChannelsSetBy::SqueezeExcite,
        };
        assert!(!resolve(None, Device::Cpu, se).unwrap());
        let e = resolve(Some(true), Device::Cpu, se)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("8 channels (squeeze-and-excitation's)")
                && e.ends_with("use --no-channels-last")
                && !e.contains("--width"),
            "a wider network does not widen SE's: {e}"
        );
        assert!(cpu(Some(true), 16).unwrap());
        assert!(!cpu(Some(false), 8).unwrap());
        assert!(!cpu(Some(false), 64).unwrap());
        assert!(resolve(None, Device::Cuda(0), NarrowestConv::width(8)).unwrap());
        assert!(resolve(Some(true), Device::Cuda(0), NarrowestConv::width(8)).unwrap());
    }
}
