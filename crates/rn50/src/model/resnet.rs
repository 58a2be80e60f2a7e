//! ResNet-18/34/50/101/152, v1.5 (the stride sits on the 3x3 conv of a bottleneck), exactly torchvision's
//! `torchvision.models.resnet`: same modules, same state_dict keys, same initialisation; and timm's ResNet-C/D
//! and anti-aliased variants of them, ResNeXt and squeeze-and-excitation ([`Arch`]), with timm's keys and
//! torchvision's (timm's) initialisation; and fast.ai's simple self-attention ([`Arch::sa`]).
use anyhow::Result;
use tch::nn::init::{FanInOut, NonLinearity, NormalOrUniform};
use tch::nn::{self, Init};
use tch::Tensor;

use super::{fused, memory_format, sync_bn};
use crate::shim::{Autocast, BlockReach};

pub use rn50_report::arch::{Arch, Depth, Pool, Variant};

/// The first layers: ImageNet's 7x7/2 conv + 3x3/2 max-pool, or a 3x3/1 conv without pooling for 32 px images
/// (CIFAR), the usual adaptation; parameter names stay torchvision's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stem {
    #[default]
    ImageNet,
    Cifar,
}

/// A network's narrowest convolution, which some CPU kernels cannot train below 16 channels (see
/// [`memory_format::resolve`] and [`crate::step::Precision::resolve`]): its output channels and what sets them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NarrowestConv {
    pub channels: i64,
    pub set_by: ChannelsSetBy,
}

/// What sets the channels of a network's narrowest convolution.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChannelsSetBy {
    /// `--width`: the stem's and the first stage's convolutions.
    Width,
    /// Half of `--width`: the first two convolutions of ResNet-C's and ResNet-D's deep stem.
    HalfWidth,
    /// Squeeze-and-excitation's reduction: at least 8 channels, whatever the width.
    SqueezeExcite,
}

impl NarrowestConv {
    /// A network whose narrowest convolutions have `--width`'s channels.
    pub fn width(width: i64) -> Self {
        Self {
            channels: width,
            set_by: ChannelsSetBy::Width,
        }
    }

    /// For messages: "8 channels (--width 8)", "8 channels (the deep stem's, half of --width)", "8 channels
    /// (squeeze-and-excitation's)".
    pub fn describe(self) -> String {
        let n = self.channels;
        match self.set_by {
            ChannelsSetBy::Width => format!("{n} channels (--width {n})"),
            ChannelsSetBy::HalfWidth => format!("{n} channels (the deep stem's, half of --width)"),
            ChannelsSetBy::SqueezeExcite => format!("{n} channels (squeeze-and-excitation's)"),
        }
    }

    /// The way out of a refusal that needs `min` channels: "use --width 16 or more, or `other`", or "use
    /// `other`" where `--width` does not set them.
    pub fn remedy(self, min: i64, other: &str) -> String {
        match self.set_by {
            ChannelsSetBy::Width => format!("use --width {min} or more, or {other}"),
            ChannelsSetBy::HalfWidth => format!("use --width {} or more, or {other}", 2 * min),
            ChannelsSetBy::SqueezeExcite => format!("use {other}"),
        }
    }
}

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct ResNetConfig {
    pub arch: Arch,
    pub num_classes: i64,
    /// Zero-init the last BN γ of each residual block (Goyal et al. 2017), torchvision's `zero_init_residual`.
    pub zero_init_residual: bool,
    pub stem: Stem,
    /// Channels of the stem and first stage (torchvision: 64); the stages have width·[1, 2, 4, 8]. Narrower
    /// networks suit small images and small machines (CIFAR).
    #[serde(default = "default_width")]
    pub width: i64,
}

fn default_width() -> i64 {
    64
}

impl ResNetConfig {
    pub fn new(arch: Arch) -> Self {
        Self {
            arch,
            num_classes: 1000,
            zero_init_residual: false,
            stem: Stem::ImageNet,
            width: default_width(),
        }
    }

    /// The convolution with the fewest output channels (the stem's 3 input channels aside): the stem's and the
    /// first stage's have `width`, the first two of a deep stem ([`Arch::deep_stem`]) half of it, and
    /// squeeze-and-excitation's first in the first stage may have fewer (8 in `seresnet18`).
    pub fn narrowest_conv(&self) -> NarrowestConv {
        let mut narrowest = NarrowestConv::width(self.width);
        if self.arch.deep_stem() && self.stem == Stem::ImageNet {
            narrowest = NarrowestConv {
                channels: self.deep_stem_width(),
                set_by: ChannelsSetBy::HalfWidth,
            };
        }
        let expansion = if self.arch.bottleneck() { 4 } else { 1 };
        let se = Arch::se_channels(self.width * expansion);
        // Squeeze-and-excitation's where channels tie: a wider network leaves its 8.
        if self.arch.se && se <= narrowest.channels {
            narrowest = NarrowestConv {
                channels: se,
                set_by: ChannelsSetBy::SqueezeExcite,
            };
        }
        narrowest
    }

    /// The output channels of the first two convolutions of a deep stem ([`Arch::deep_stem`]): timm's
    /// `stem_width`, half of `width` (32 of 64).
    fn deep_stem_width(&self) -> i64 {
        (self.width / 2).max(1)
    }

    /// The side of the last stage's feature maps for input images of side `side`: every stride-2 layer (the
    /// ImageNet stem's conv and max pool, the first block of stages 2 to 4) maps `n` to `ceil(n / 2)`, but the
    /// stem's max-blur pool ([`Pool::MaxBlur`]) to `floor(n / 2)`. Batch norm there sees batch × side² values per
    /// channel, the fewest of the network.
    pub fn last_stage_side(&self, side: usize) -> usize {
        if self.arch.pool == Pool::MaxBlur && self.stem == Stem::ImageNet {
            // The stem's max-blur pool halves rounding down.
            return halved(side.div_ceil(2) / 2, self.halvings() - 2);
        }
        halved(side, self.halvings())
    }

    /// The sides of the maps fast.ai's max-blur pool halves ([`Pool::MaxBlur`]) for images of side `side`, and
    /// how many of them the stem's pool halves (the first, or none in CIFAR's stem): the ImageNet stem's output,
    /// then in ResNet-D each strided shortcut's input (stages 2 to 4); none without the pool.
    fn max_blur_inputs(&self, side: usize) -> (Vec<usize>, usize) {
        if self.arch.pool != Pool::MaxBlur {
            return (Vec::new(), 0);
        }
        let (first, stem_pools) = match self.stem {
            Stem::ImageNet => (side.div_ceil(2), 1),
            Stem::Cifar => (side, 0),
        };
        let shortcut_pools = if self.arch.avg_down() { 3 } else { 0 };
        let sides = std::iter::successors(Some(first), |n| Some(n / 2))
            .take(stem_pools + shortcut_pools)
            .collect();
        (sides, stem_pools)
    }

    /// The side of the smallest map the anti-aliasing blur pads ([`Arch::blur`]), for images of side `side`:
    /// the last stage's input, one halving before the last. Reflection padding needs 2 or more.
    pub fn smallest_blur_input(&self, side: usize) -> usize {
        halved(side, self.halvings() - 1)
    }

    /// The stride-2 layers an image passes through.
    fn halvings(&self) -> usize {
        match self.stem {
            Stem::ImageNet => 5,
            Stem::Cifar => 3,
        }
    }

    /// Whether images of side `side` run through the network (the message of a usage error if not): the
    /// anti-aliasing blur pads its smallest input by reflection, which needs that input 2 px or more (images
    /// of 17 px or more with the ImageNet stem, 5 with CIFAR's); fast.ai's max-blur pool pads by reflection by 2,
    /// which needs 3 px or more, and on a shortcut halves rounding down where the strided conv beside it rounds up,
    /// so a shortcut's input must be even (ResNet-D: sides 32k - 1 to 32k + 2 from 63 px; else 5 px or more); any
    /// side runs through the others.
    pub fn check_side(&self, side: usize) -> Result<(), String> {
        let (halved_by_max_blur, stem_pools) = self.max_blur_inputs(side);
        let shortcut_odd = halved_by_max_blur[stem_pools..].iter().any(|n| n % 2 == 1);
        if shortcut_odd || halved_by_max_blur.iter().any(|&n| n < 3) {
            let (maps, advice) = match (stem_pools, self.arch.avg_down()) {
                (1, true) => (
                    "the stem's output and each strided shortcut's input",
                    "a multiple of 32, 64 or more",
                ),
                (1, false) => ("the stem's output", "5 px or more"),
                _ => (
                    "each strided shortcut's input",
                    "a multiple of 8, 16 or more",
                ),
            };
            let sides: Vec<String> = halved_by_max_blur.iter().map(|n| format!("{n}")).collect();
            return Err(format!(
                "{} halves {maps} with fast.ai's max-blur pool, which needs each 3 px or more and a shortcut's \
                 even: {side} px images give {} px; use {advice}",
                self.arch,
                sides.join(", ")
            ));
        }
        let smallest = self.smallest_blur_input(side);
        if self.arch.blur && smallest < 2 {
            return Err(format!(
                "{} blurs the last stage's input with reflection padding, which needs it 2 px or more: {side} px \
                 images leave it {smallest} px; use larger images",
                self.arch
            ));
        }
        Ok(())
    }
}

impl ResNetConfig {
    /// Whether the network has channels at this width (the message of a usage error if not): a ResNeXt
    /// bottleneck of `planes` is `floor(planes · width_per_group / 64) · groups` wide, none below
    /// `64 / width_per_group` channels in the first stage.
    pub fn check_width(&self) -> Result<(), String> {
        if self.arch.bottleneck_width(self.width) == 0 {
            let least = 64_u32.div_ceil(self.arch.width_per_group);
            return Err(format!(
                "{} at width {} leaves its first bottlenecks no channels (floor({} x {} / 64) groups' width): \
                 use --width {least} or more",
                self.arch, self.width, self.width, self.arch.width_per_group
            ));
        }
        Ok(())
    }
}

/// `side` after `times` stride-2 layers, each `n` → `ceil(n / 2)`.
fn halved(side: usize, times: usize) -> usize {
    (0..times).fold(side, |n, _| n.div_ceil(2))
}

const BN_EPS: f64 = 1e-5;
const BN_MOMENTUM: f64 = 0.1;

/// torchvision: `kaiming_normal_(mode="fan_out", nonlinearity="relu")` for every conv.
const CONV_INIT: Init = Init::Kaiming {
    dist: NormalOrUniform::Normal,
    fan: FanInOut::FanOut,
    non_linearity: NonLinearity::ReLU,
};

/// A bias-free square conv: its weight `<p>.weight`, `[cout, cin / groups, k, k]`.
#[derive(Debug)]
struct Conv {
    weight: Tensor,
    stride: i64,
    padding: i64,
    groups: i64,
}

fn conv(p: nn::Path, cin: i64, cout: i64, k: i64, stride: i64) -> Conv {
    grouped_conv(p, cin, cout, k, stride, 1)
}

/// [`conv`] in `groups` groups (ResNeXt's 3x3).
fn grouped_conv(p: nn::Path, cin: i64, cout: i64, k: i64, stride: i64, groups: i64) -> Conv {
    Conv {
        weight: p.var("weight", &[cout, cin / groups, k, k], CONV_INIT),
        stride,
        padding: k / 2,
        groups,
    }
}

/// A 1x1 conv with a bias, squeeze-and-excitation's: the weight torchvision's conv init, the bias nn.Conv2d's
/// default `U(-1/sqrt(cin), 1/sqrt(cin))` (timm's `init_weights` leaves it).
fn conv_with_bias(p: nn::Path, cin: i64, cout: i64) -> (Tensor, Tensor) {
    let bound = 1.0 / (cin as f64).sqrt();
    let bias = Init::Uniform {
        lo: -bound,
        up: bound,
    };
    (
        p.var("weight", &[cout, cin, 1, 1], CONV_INIT),
        p.var("bias", &[cout], bias),
    )
}

fn bn(p: nn::Path, c: i64, gamma: f64) -> nn::BatchNorm {
    let cfg = nn::BatchNormConfig {
        cudnn_enabled: true,
        eps: BN_EPS,
        momentum: BN_MOMENTUM,
        affine: true,
        ws_init: Init::Const(gamma),
        bs_init: Init::Const(0.0),
    };
    nn::batch_norm2d(p, c, cfg)
}

/// Conv then BN, the unit every block is made of. `forward` returns a fresh tensor that later ops may
/// modify in place (as torchvision's `ReLU(inplace=True)` does).
#[derive(Debug)]
struct ConvBn {
    conv: Conv,
    bn: nn::BatchNorm,
    /// The activation after it, where there is one: Mish, else ReLU ([`Arch::mish`]).
    mish: bool,
}

impl ConvBn {
    fn forward(&self, x: &Tensor, train: bool) -> Tensor {
        let y = self.conv(x);
        self.bn(&y, train)
    }

    /// `act(bn(conv(x)) + residual)`, the activation ReLU or Mish: on a GPU in training with ReLU one fused cuDNN
    /// op for BN, add and ReLU (see [`super::fused`]), elsewhere (and with `--sync-bn`) the separate ops.
    fn forward_act(&self, x: &Tensor, train: bool, residual: Option<&Tensor>) -> Tensor {
        self.bn_act(&self.conv(x), train, residual)
    }

    /// `act(bn(y) + residual)` of this unit's conv output `y`.
    fn bn_act(&self, y: &Tensor, train: bool, residual: Option<&Tensor>) -> Tensor {
        if train && !self.mish && !sync_bn::enabled() {
            if let Some(out) = fused::bn_relu(y, residual, &self.bn, BN_MOMENTUM, BN_EPS) {
                return out;
            }
        }
        self.act(self.bn(y, train), residual)
    }

    /// `act(y + residual)`, `y` a fresh tensor the sum may overwrite.
    fn act(&self, mut y: Tensor, residual: Option<&Tensor>) -> Tensor {
        if let Some(r) = residual {
            y = y.g_add_(r);
        }
        // Mish's gradient needs its input, which an in-place Mish would overwrite: out of place, as
        // torch.nn.Mish's default.
        if self.mish {
            y.mish()
        } else {
            y.relu_()
        }
    }

    fn conv(&self, x: &Tensor) -> Tensor {
        let c = &self.conv;
        x.conv2d(
            &c.weight,
            None::<Tensor>,
            [c.stride; 2],
            [c.padding; 2],
            [1, 1],
            c.groups,
        )
    }

    fn bn(&self, y: &Tensor, train: bool) -> Tensor {
        let b = &self.bn;
        if train {
            if let Some(out) = sync_bn::batch_norm(y, b, BN_MOMENTUM, BN_EPS) {
                return out;
            }
        }
        Tensor::batch_norm(
            y,
            b.ws.as_ref(),
            b.bs.as_ref(),
            Some(&b.running_mean),
            Some(&b.running_var),
            train,
            BN_MOMENTUM,
            BN_EPS,
            true,
        )
    }
}

/// A binomial blur of every channel with reflection padding: timm's `BlurPool2d(channels, filt_size=3, stride=2)`
/// ([`Blur::timm`]: `[1, 2, 1]ᵀ[1, 2, 1] / 16`, padding 1, stride 2) or kornia 0.4.1's `filter2D` with pyrdown's
/// kernel ([`Blur::pyramid`]: `[1, 4, 6, 4, 1]ᵀ[1, 4, 6, 4, 1] / 256`, padding 2, stride 1). The filter is not
/// state (timm's buffer is not persistent, kornia's is made per call), so weights files hold none.
#[derive(Debug)]
struct Blur {
    /// `[channels, 1, k, k]`, fp32 on the model's device.
    filter: Tensor,
    stride: i64,
}

impl Blur {
    fn timm(device: tch::Device, channels: i64) -> Self {
        Self::binomial(device, channels, &[1., 2., 1.], 2)
    }

    fn pyramid(device: tch::Device, channels: i64) -> Self {
        Self::binomial(device, channels, &[1., 4., 6., 4., 1.], 1)
    }

    fn binomial(device: tch::Device, channels: i64, taps: &[f32], stride: i64) -> Self {
        let k = taps.len() as i64;
        let sum: f32 = taps.iter().sum();
        let taps = Tensor::from_slice(taps);
        let filter = (taps.unsqueeze(1) * taps.unsqueeze(0) / f64::from(sum * sum))
            .view([1, 1, k, k])
            .repeat([channels, 1, 1, 1])
            .to_device(device);
        Self { filter, stride }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        let mut filter = self.filter.to_kind(x.kind());
        if memory_format::is_channels_last(x) {
            filter = memory_format::channels_last(&filter);
        }
        let pad = self.filter.size()[3] / 2;
        x.reflection_pad2d([pad; 4]).conv2d(
            &filter,
            None::<Tensor>,
            [self.stride; 2],
            [0, 0],
            [1, 1],
            self.filter.size()[0],
        )
    }
}

/// kornia 0.4.1's `MaxBlurPool2d(3, ceil_mode=True)` ([`Pool::MaxBlur`]): a 3x3 max pool at stride 1 (padding 1),
/// then kornia's `pyrdown`: the 5x5 binomial blur ([`Blur::pyramid`]), then a bilinear resize by the scale 0.5
/// (`align_corners=False`, the scale used as given): the side halved rounding down, a 2x2 mean on even sides.
#[derive(Debug)]
struct MaxBlurPool {
    blur: Blur,
}

impl MaxBlurPool {
    fn new(device: tch::Device, channels: i64) -> Self {
        Self {
            blur: Blur::pyramid(device, channels),
        }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        self.blur
            .forward(&max_pool_3x3(x, 1))
            .upsample_bilinear2d_vec(None::<&[i64]>, false, [0.5, 0.5].as_slice())
    }
}

/// A 3x3 max pool (padding 1) at `stride`: cuDNN's on a GPU where rn50 runs it, else libtorch's.
fn max_pool_3x3(x: &Tensor, stride: i64) -> Tensor {
    fused::max_pool(x, 3, stride, 1)
        .unwrap_or_else(|| x.max_pool2d([3, 3], [stride, stride], [1, 1], [1, 1], false))
}

/// Squeeze-and-excitation (Hu et al. 2018) as timm's `SEModule`: each channel of `x` scaled by
/// `sigmoid(fc2(relu(fc1(mean of x over its pixels))))`, `fc1` and `fc2` 1x1 convs with biases (`se.fc1`,
/// `se.fc2`).
#[derive(Debug)]
struct SqueezeExcite {
    fc1: (Tensor, Tensor),
    fc2: (Tensor, Tensor),
}

impl SqueezeExcite {
    fn new(p: nn::Path, channels: i64) -> Self {
        let reduced = Arch::se_channels(channels);
        Self {
            fc1: conv_with_bias(&p / "fc1", channels, reduced),
            fc2: conv_with_bias(&p / "fc2", reduced, channels),
        }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        let fc =
            |y: &Tensor, (w, b): &(Tensor, Tensor)| y.conv2d(w, Some(b), [1, 1], [0, 0], [1, 1], 1);
        let squeezed = x.mean_dim([2, 3].as_slice(), true, None);
        let gate = fc(&fc(&squeezed, &self.fc1).relu_(), &self.fc2).sigmoid();
        x * gate
    }
}

/// fast.ai's `SimpleSelfAttention(n_in, ks=1, sym=False)` ([`Arch::sa`]): `x` of `[N, C, H, W]` seen as `[N, C,
/// H·W]`, `x + γ · bmm(bmm(x, xᵀ), conv(x))`, `conv` a bias-free 1x1 convolution (`C×C`) under
/// `torch.nn.utils.spectral_norm`: its weight `weight_orig / σ`, `σ = uᵀ·weight_orig·v` from the buffers `u` and `v`,
/// which in training each forward first moves one power iteration (`v = normalize(weight_origᵀ u)`, `u =
/// normalize(weight_orig v)`, without gradient) towards the largest singular value's vectors. `γ` starts at 0.
#[derive(Debug)]
struct SelfAttention {
    /// `sa.conv.weight_orig`, `[C, C, 1]`, initialised as fast.ai's `kaiming_normal_` (fan-in is fan-out here).
    weight_orig: Tensor,
    /// `sa.conv.weight_u` and `sa.conv.weight_v`, `[C]`: unit vectors, buffers (not trained).
    u: Tensor,
    v: Tensor,
    /// `sa.gamma`, `[1]`.
    gamma: Tensor,
}

/// `torch.nn.functional.normalize(x, dim=0, eps=1e-12)` of a vector, spectral_norm's.
fn normalize(x: &Tensor) -> Tensor {
    x / x.norm().clamp_min(1e-12)
}

impl SelfAttention {
    fn new(p: nn::Path, channels: i64) -> Self {
        let conv = &p / "conv";
        let weight_orig = conv.var("weight_orig", &[channels, channels, 1], CONV_INIT);
        let u = conv.zeros_no_train("weight_u", &[channels]);
        let v = conv.zeros_no_train("weight_v", &[channels]);
        // spectral_norm's start: each a normalised draw from N(0, 1).
        tch::no_grad(|| {
            for mut t in [u.shallow_clone(), v.shallow_clone()] {
                t.copy_(&normalize(&Tensor::randn(
                    [channels],
                    (t.kind(), t.device()),
                )));
            }
        });
        Self {
            weight_orig,
            u,
            v,
            gamma: p.zeros("gamma", &[1]),
        }
    }

    fn forward(&self, x: &Tensor, train: bool) -> Tensor {
        // The block runs in its parameters' dtype (fp32) under autocast too: its products sum over every position
        // and channel, and fp16 ends at 65504. fast.ai's network starts each block's last batch norm at zero
        // (zero-init-residual), so they start at 0 and reach about 700 at 224 px once trained; without it they
        // are 32,000 at 224 px from the first step, past fp16's range at 320 px, where 0 x inf in γ's product
        // makes every loss NaN (docs/imagenette.md, "Self-attention").
        let _full =
            Autocast::disabled(x.device()).expect("leaving autocast fails only in libtorch");
        let c = self.weight_orig.size()[0];
        let w = self.weight_orig.view([c, c]);
        if train {
            tch::no_grad(|| {
                let v = normalize(&w.tr().mv(&self.u));
                let u = normalize(&w.mv(&v));
                self.v.shallow_clone().copy_(&v);
                self.u.shallow_clone().copy_(&u);
            });
        }
        // The gradient flows through σ to the weight, not through the power iteration's vectors. The ops are
        // fast.ai's and spectral_norm's one for one (a Conv1d, the transpose made contiguous): this block's
        // gradient is sensitive enough that another order of the same sums shows in the parity test.
        let (u, v) = (self.u.detach(), self.v.detach());
        let weight = &self.weight_orig / u.dot(&w.mv(&v));
        // Shapes from x's ops rather than its sizes, so that an exported (traced) module takes any batch and size.
        let flat = x.flatten(2, -1).to_kind(weight.kind());
        let convx = flat.conv1d(&weight, None::<Tensor>, [1], [0], [1], 1);
        let xxt = flat.bmm(&flat.permute([0, 2, 1]).contiguous());
        let o = (&self.gamma * xxt.bmm(&convx) + &flat)
            .view_as(x)
            .to_kind(x.kind());
        if memory_format::is_channels_last(x) {
            memory_format::channels_last(&o)
        } else {
            o
        }
    }
}

/// A block's shortcut where its input and output differ in shape: a 1x1 conv with the block's stride and a
/// batch norm (`downsample.0`, `.1`), or ResNet-D's pool (a 2x2 average pool, or one of fast.ai's: [`Pool`]) then
/// the conv at stride 1 (`downsample.1`, `.2`).
#[derive(Debug)]
struct Downsample {
    pool: Option<ShortcutPool>,
    unit: ConvBn,
}

#[derive(Debug)]
enum ShortcutPool {
    Average,
    Max,
    MaxBlur(MaxBlurPool),
}

impl Downsample {
    fn forward(&self, x: &Tensor, train: bool) -> Tensor {
        self.unit.forward(&self.conv_input(x), train)
    }

    /// What the conv reads: the block's input, or ResNet-D's pooled input.
    fn conv_input(&self, x: &Tensor) -> Tensor {
        match &self.pool {
            // nn.AvgPool2d(2, 2, ceil_mode=True, count_include_pad=False), as timm's downsample_avg.
            Some(ShortcutPool::Average) => {
                x.avg_pool2d([2, 2], [2, 2], [0, 0], true, false, None::<i64>)
            }
            // nn.MaxPool2d(2, ceil_mode=True), as fast.ai's xresnet with pool=MaxPool.
            Some(ShortcutPool::Max) => x.max_pool2d([2, 2], [2, 2], [0, 0], [1, 1], true),
            Some(ShortcutPool::MaxBlur(pool)) => pool.forward(x),
            None => x.shallow_clone(),
        }
    }
}

#[derive(Debug)]
struct Block {
    /// conv1/bn1 … conv{2,3}/bn{2,3}: two for a basic block, three for a bottleneck.
    units: Vec<ConvBn>,
    /// The anti-aliasing blur after the strided unit's ReLU (`Arch::blur`, a block of stride 2): that unit's
    /// conv then runs at stride 1.
    blur: Option<(usize, Blur)>,
    /// Squeeze-and-excitation on the last unit's batch norm, before the shortcut's add (`Arch::se`).
    se: Option<SqueezeExcite>,
    /// Self-attention after that, in the first stage's last block (`Arch::sa`).
    sa: Option<SelfAttention>,
    downsample: Option<Downsample>,
}

impl Block {
    /// `sa`: this block has the network's self-attention.
    fn new(
        p: &nn::Path,
        arch: Arch,
        (cin, planes, stride): (i64, i64, i64),
        zero_last: bool,
        sa: bool,
    ) -> Self {
        let bottleneck = arch.bottleneck();
        let expansion = if bottleneck { 4 } else { 1 };
        let cout = planes * expansion;
        // The unit that downsamples: v1.5 puts the stride on the 3x3, the bottleneck's second conv.
        let (strided, width) = match bottleneck {
            true => (1, arch.bottleneck_width(planes)),
            false => (0, planes),
        };
        let blur = (arch.blur && stride != 1).then(|| (strided, Blur::timm(p.device(), width)));
        let conv_stride = if blur.is_some() { 1 } else { stride };
        // (cin, cout, kernel, stride, groups) of each conv.
        let groups = i64::from(arch.groups);
        let shapes: Vec<(i64, i64, i64, i64, i64)> = if bottleneck {
            vec![
                (cin, width, 1, 1, 1),
                (width, width, 3, conv_stride, groups),
                (width, cout, 1, 1, 1),
            ]
        } else {
            vec![(cin, planes, 3, conv_stride, 1), (planes, planes, 3, 1, 1)]
        };
        let last = shapes.len();
        let units = shapes
            .into_iter()
            .enumerate()
            .map(|(i, (ci, co, k, s, g))| {
                let n = i + 1;
                let gamma = if zero_last && n == last { 0.0 } else { 1.0 };
                ConvBn {
                    conv: grouped_conv(p / format!("conv{n}"), ci, co, k, s, g),
                    bn: bn(p / format!("bn{n}"), co, gamma),
                    mish: arch.mish,
                }
            })
            .collect();
        let downsample = (stride != 1 || cin != cout).then(|| {
            let d = p / "downsample";
            let avg_down = arch.avg_down();
            let (first, conv_stride) = if avg_down { (1, 1) } else { (0, stride) };
            // timm's pool is nn.Identity in a block of stride 1: the keys are the same, nothing to run.
            let pool = (avg_down && stride != 1).then(|| match arch.pool {
                Pool::Timm => ShortcutPool::Average,
                Pool::MaxDown => ShortcutPool::Max,
                Pool::MaxBlur => ShortcutPool::MaxBlur(MaxBlurPool::new(p.device(), cin)),
            });
            Downsample {
                pool,
                unit: ConvBn {
                    conv: conv(&d / first, cin, cout, 1, conv_stride),
                    bn: bn(&d / (first + 1), cout, 1.0),
                    mish: arch.mish,
                },
            }
        });
        let se = arch.se.then(|| SqueezeExcite::new(p / "se", cout));
        let sa = sa.then(|| SelfAttention::new(p / "sa", cout));
        Self {
            units,
            blur,
            se,
            sa,
            downsample,
        }
    }

    /// A bottleneck's tensors as [`fused::bottleneck`] takes them: the conv weights of conv1 to conv3 (and of the
    /// projection shortcut), then γ and β of bn1 and bn2 (and bn3, and the projection's); and the same batch
    /// norms' running means and variances. `whole`: the block's, else the body's (conv1 to conv3, bn1 and bn2).
    fn fused_tensors(&self, whole: bool) -> (Vec<Tensor>, Vec<Tensor>) {
        let shortcut = self.downsample.as_ref().filter(|_| whole).map(|d| &d.unit);
        let norms = if whole { 3 } else { 2 };
        let units: Vec<&ConvBn> = self.units[..norms].iter().chain(shortcut).collect();
        let mut params: Vec<Tensor> = self
            .units
            .iter()
            .chain(shortcut)
            .map(|u| u.conv.weight.shallow_clone())
            .collect();
        let mut buffers = Vec::new();
        for u in units {
            let (Some(w), Some(b)) = (u.bn.ws.as_ref(), u.bn.bs.as_ref()) else {
                unreachable!("rn50's batch norms are affine");
            };
            params.extend([w.shallow_clone(), b.shallow_clone()]);
            buffers.extend([
                u.bn.running_mean.shallow_clone(),
                u.bn.running_var.shallow_clone(),
            ]);
        }
        (params, buffers)
    }

    /// Calls `fold` with what [`fused::bottleneck`] takes for this block on input `x`: the reach (the whole block
    /// with its shortcut, or with `whole` false its body), its tensors ([`Block::fused_tensors`]) and conv2's stride.
    fn with_fused_args<R>(
        &self,
        x: &Tensor,
        whole: bool,
        fold: impl FnOnce(BlockReach, &[Tensor], &[Tensor], i64) -> R,
    ) -> R {
        let pooled;
        let reach = match &self.downsample {
            _ if !whole => BlockReach::Body,
            None => BlockReach::Identity(x),
            Some(d) => {
                pooled = d.conv_input(x);
                BlockReach::Projection {
                    input: &pooled,
                    stride: d.unit.conv.stride,
                }
            }
        };
        let (params, buffers) = self.fused_tensors(whole);
        fold(reach, &params, &buffers, self.units[1].conv.stride)
    }

    /// On a GPU in training, the bottleneck with its batch norms folded into its convolutions (cuDNN graphs): the
    /// whole block, or where cuDNN lacks the tail's graphs its body, then the tail as below. `None` where neither
    /// applies.
    fn forward_fused(&self, x: &Tensor) -> Option<Tensor> {
        let fold = |reach: BlockReach<'_>, params: &[Tensor], buffers: &[Tensor], stride: i64| {
            fused::bottleneck(x, reach, params, buffers, stride, BN_MOMENTUM, BN_EPS)
        };
        if let Some(out) = self.with_fused_args(x, true, fold) {
            return Some(out);
        }
        let y3 = self.with_fused_args(x, false, fold)?;
        Some(self.units[2].bn_act(&y3, true, Some(&self.shortcut(x, true))))
    }

    /// The shortcut branch: the input as it is, or its projection.
    fn shortcut(&self, x: &Tensor, train: bool) -> Tensor {
        match &self.downsample {
            Some(d) => d.forward(x, train),
            None => x.shallow_clone(),
        }
    }

    fn forward(&self, x: &Tensor, train: bool) -> Tensor {
        // The blur sits between bn2 and conv3 and squeeze-and-excitation and self-attention between bn3 and the add,
        // where the folded bottleneck cannot; its graphs apply ReLU and convolve in one group.
        if train
            && fused::block_enabled()
            && self.units.len() == 3
            && self.blur.is_none()
            && self.se.is_none()
            && self.sa.is_none()
            && self.units[1].conv.groups == 1
            && !self.units[0].mish
            && !sync_bn::enabled()
        {
            if let Some(out) = self.forward_fused(x) {
                return out;
            }
        }
        let (last, inner) = self.units.split_last().expect("a block has units");
        let mut y = x.shallow_clone();
        for (i, u) in inner.iter().enumerate() {
            y = u.forward_act(&y, train, None);
            if let Some((_, blur)) = self.blur.as_ref().filter(|(after, _)| *after == i) {
                y = blur.forward(&y);
            }
        }
        let shortcut = self.shortcut(x, train);
        if self.se.is_none() && self.sa.is_none() {
            return last.forward_act(&y, train, Some(&shortcut));
        }
        let mut y = last.forward(&y, train);
        if let Some(se) = &self.se {
            y = se.forward(&y);
        }
        if let Some(sa) = &self.sa {
            y = sa.forward(&y, train);
        }
        last.act(y, Some(&shortcut))
    }
}

/// The ImageNet stem's pool ([`ResNet::stem_pool`]).
#[derive(Debug)]
enum StemPool {
    /// torchvision's `nn.MaxPool2d(3, 2, 1)`.
    Max,
    /// timm's anti-aliased stem: the max pool at stride 1, then its blur.
    Blurred(Blur),
    MaxBlur(MaxBlurPool),
}

/// A ResNet whose parameters live in a `VarStore` under torchvision's names.
#[derive(Debug)]
pub struct ResNet {
    pub config: ResNetConfig,
    /// `conv1`/`bn1`; ResNet-C/D's three: `conv1.0`/`conv1.1`, `conv1.3`/`conv1.4`, `conv1.6`/`bn1`.
    stem: Vec<ConvBn>,
    /// The ImageNet stem's pool: the 3x3 max pool at stride 2, or at stride 1 then timm's blur ([`Arch::blur`]), or
    /// fast.ai's max-blur pool ([`Pool::MaxBlur`]); none in CIFAR's stem.
    stem_pool: Option<StemPool>,
    layers: Vec<Block>,
    fc: nn::Linear,
}

impl ResNet {
    /// Builds the network in `root` with torchvision's random initialisation (seed it with `tch::manual_seed`).
    pub fn new(root: &nn::Path, config: ResNetConfig) -> Self {
        let (k, s) = match config.stem {
            Stem::ImageNet => (7, 2),
            Stem::Cifar => (3, 1),
        };
        let w = config.width;
        let arch = config.arch;
        let stem = if arch.deep_stem() && config.stem == Stem::ImageNet {
            // timm's deep stem: Sequential(conv 3x3/2, bn, relu, conv 3x3, bn, relu, conv 3x3), then bn1.
            let (c1, p) = (config.deep_stem_width(), root / "conv1");
            vec![
                ConvBn {
                    conv: conv(&p / 0, 3, c1, 3, 2),
                    bn: bn(&p / 1, c1, 1.0),
                    mish: arch.mish,
                },
                ConvBn {
                    conv: conv(&p / 3, c1, c1, 3, 1),
                    bn: bn(&p / 4, c1, 1.0),
                    mish: arch.mish,
                },
                ConvBn {
                    conv: conv(&p / 6, c1, w, 3, 1),
                    bn: bn(root / "bn1", w, 1.0),
                    mish: arch.mish,
                },
            ]
        } else {
            vec![ConvBn {
                conv: conv(root / "conv1", 3, w, k, s),
                bn: bn(root / "bn1", w, 1.0),
                mish: arch.mish,
            }]
        };
        let stem_pool = (config.stem == Stem::ImageNet).then(|| match (arch.blur, arch.pool) {
            (true, _) => StemPool::Blurred(Blur::timm(root.device(), w)),
            (_, Pool::MaxBlur) => StemPool::MaxBlur(MaxBlurPool::new(root.device(), w)),
            _ => StemPool::Max,
        });
        let bottleneck = arch.bottleneck();
        let expansion = if bottleneck { 4 } else { 1 };
        let mut cin = w;
        let mut layers = Vec::new();
        for (stage, (&blocks, planes)) in config
            .arch
            .layers()
            .iter()
            .zip([w, 2 * w, 4 * w, 8 * w])
            .enumerate()
        {
            let p = root / format!("layer{}", stage + 1);
            for b in 0..blocks {
                let stride = if stage > 0 && b == 0 { 2 } else { 1 };
                // fast.ai's xresnet: `sa and i == len(layers) - 4` for the stage, `i == blocks - 1` for the block.
                let sa = arch.sa && stage == 0 && b == blocks - 1;
                layers.push(Block::new(
                    &(&p / b),
                    arch,
                    (cin, planes, stride),
                    config.zero_init_residual,
                    sa,
                ));
                cin = planes * expansion;
            }
        }
        // nn.Linear's default init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias.
        let bound = 1.0 / (cin as f64).sqrt();
        let init = Init::Uniform {
            lo: -bound,
            up: bound,
        };
        let fc = nn::linear(
            root / "fc",
            cin,
            config.num_classes,
            nn::LinearConfig {
                ws_init: init,
                bs_init: Some(init),
                bias: true,
            },
        );
        Self {
            config,
            stem,
            stem_pool,
            layers,
            fc,
        }
    }

    /// The stem: its convs, batch norms and ReLUs, then (ImageNet's) its pool.
    fn stem_forward(&self, x: &Tensor, train: bool) -> Tensor {
        let mut y = x.shallow_clone();
        for u in &self.stem {
            y = u.forward_act(&y, train, None);
        }
        match &self.stem_pool {
            None => y,
            Some(StemPool::Max) => max_pool_3x3(&y, 2),
            Some(StemPool::Blurred(blur)) => blur.forward(&max_pool_3x3(&y, 1)),
            Some(StemPool::MaxBlur(pool)) => pool.forward(&y),
        }
    }

    /// Logits for a normalised NCHW float batch (any memory format). `train` selects batch statistics in BN
    /// (and updates the running ones) as `model.train()` does.
    pub fn forward_t(&self, x: &Tensor, train: bool) -> Tensor {
        let mut y = self.stem_forward(x, train);
        for block in &self.layers {
            y = block.forward(&y, train);
        }
        let y = y.adaptive_avg_pool2d([1, 1]).flatten(1, -1);
        y.linear(&self.fc.ws, self.fc.bs.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// fast.ai's self-attention under fp16 autocast runs in fp32: on an input whose products pass fp16's 65504
    /// (x xᵀ sums 1,024 squares of about 100) it gives what it gives without autocast, where fp16's products
    /// would be inf.
    #[test]
    fn self_attention_runs_in_fp32_under_fp16_autocast() {
        tch::manual_seed(0);
        let vs = nn::VarStore::new(tch::Device::Cpu);
        let sa = SelfAttention::new(vs.root() / "sa", 16);
        tch::no_grad(|| {
            let _ = sa.gamma.shallow_clone().fill_(1e-3);
        });
        let x = Tensor::randn([2, 16, 32, 32], tch::kind::FLOAT_CPU) * 10.0;
        let half = x.flatten(2, -1).to_kind(tch::Kind::Half);
        let overflows = half.bmm(&half.permute([0, 2, 1])).isinf().any();
        assert!(
            bool::try_from(overflows).unwrap(),
            "the premise: fp16's products overflow"
        );
        let want = sa.forward(&x, false);
        let got = {
            let _amp = Autocast::enter(tch::Device::Cpu, tch::Kind::Half).unwrap();
            sa.forward(&x, false)
        };
        assert_eq!(got.kind(), tch::Kind::Float);
        assert!(bool::try_from(got.isfinite().all()).unwrap());
        assert!(got.allclose(&want, 1e-6, 1e-6, false));
    }

    /// `last_stage_side` is the side of the last stage's output, for both stems and odd sides.
    #[test]
    fn last_stage_side_is_what_the_network_computes() {
        let archs = [
            Arch::ResNet18,
            "resnetblur18d".parse().unwrap(),
            "resnet18_maxblur".parse().unwrap(),
            "resnet18d_maxblur".parse().unwrap(),
            "resnet18d_maxdown".parse().unwrap(),
        ];
        for (stem, arch) in [Stem::ImageNet, Stem::Cifar]
            .into_iter()
            .flat_map(|s| archs.map(|a| (s, a)))
        {
            let mut cfg = ResNetConfig::new(arch);
            (cfg.stem, cfg.width, cfg.num_classes) = (stem, 4, 2);
            let vs = nn::VarStore::new(tch::Device::Cpu);
            let net = ResNet::new(&vs.root(), cfg.clone());
            for side in [1usize, 7, 8, 9, 31, 32, 33, 63, 64, 65, 66, 100] {
                if cfg.check_side(side).is_err() {
                    continue;
                }
                let x = Tensor::zeros([1, 3, side as i64, side as i64], tch::kind::FLOAT_CPU);
                let mut y = net.stem_forward(&x, false);
                for block in &net.layers {
                    y = block.forward(&y, false);
                }
                let got = cfg.last_stage_side(side) as i64;
                assert_eq!(y.size()[2..], [got, got], "{arch} {stem:?} at {side} px");
            }
        }
    }

    /// `check_side` admits exactly the sides the network runs at: fast.ai's max-blur pool, in the stem alone and in
    /// ResNet-D's shortcuts too, at every side from 1 to 140 px. A refused side fails in libtorch (reflection
    /// padding wider than the map) or has a shortcut narrower than the strided conv beside it (the add would
    /// broadcast a 1-px shortcut: the test compares the two).
    #[test]
    fn the_max_blur_pool_s_sides_are_those_that_run() {
        // A refused side panics in libtorch: this thread's panics go unprinted while the sides run, then the
        // default hook (libtest's) is back for the assertions.
        let this = std::thread::current().id();
        let loud = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current().id() != this {
                loud(info)
            }
        }));
        let mut runs = Vec::new();
        for name in ["resnet18_maxblur", "resnet18d_maxblur"] {
            let mut cfg = ResNetConfig::new(name.parse().unwrap());
            (cfg.width, cfg.num_classes) = (4, 2);
            let vs = nn::VarStore::new(tch::Device::Cpu);
            let net = ResNet::new(&vs.root(), cfg.clone());
            for side in 1..=140i64 {
                let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    tch::no_grad(|| {
                        let x = Tensor::zeros([1, 3, side, side], tch::kind::FLOAT_CPU);
                        let mut y = net.stem_forward(&x, false);
                        net.layers.iter().all(|block| {
                            let shortcut = block.shortcut(&y, false).size();
                            y = block.forward(&y, false);
                            shortcut == y.size()
                        })
                    })
                }))
                .unwrap_or(false);
                runs.push((name, side, cfg.check_side(side as usize), ran));
            }
        }
        drop(std::panic::take_hook());
        for (name, side, verdict, ran) in &runs {
            assert_eq!(verdict.is_ok(), *ran, "{name} at {side} px: {verdict:?}");
        }
        // ResNet-D: 63 to 66, 95 to 98, 127 to 130; the stem alone: 5 px and up.
        for (name, want) in [("resnet18d_maxblur", 12), ("resnet18_maxblur", 136)] {
            let admitted = runs.iter().filter(|r| r.0 == name && r.3).count();
            assert_eq!(admitted, want, "{name}");
        }
    }

    /// `narrowest_conv` is the fewest output channels of any convolution the network builds, and says what set
    /// them.
    #[test]
    fn narrowest_conv_is_the_built_network_s() {
        use ChannelsSetBy::*;
        for (name, width, set_by) in [
            ("resnet18", 64, Width),
            ("resnet18", 8, Width),
            ("resnet50d", 64, HalfWidth),
            ("resnetblur18c", 16, HalfWidth),
            ("resnetblur50", 32, Width),
            ("seresnet18", 64, SqueezeExcite),
            ("seresnet18", 16, SqueezeExcite),
            ("seresnet18", 8, SqueezeExcite),
            ("seresnet50", 64, SqueezeExcite),
            ("seresnext50d_32x4d", 16, SqueezeExcite),
            ("seresnext50d_32x4d", 64, SqueezeExcite),
        ] {
            let mut cfg = ResNetConfig::new(name.parse().unwrap());
            (cfg.width, cfg.num_classes) = (width, 2);
            let vs = nn::VarStore::new(tch::Device::Cpu);
            ResNet::new(&vs.root(), cfg.clone());
            let built = vs
                .variables()
                .values()
                .filter(|t| t.dim() == 4)
                .map(|t| t.size()[0])
                .min()
                .unwrap();
            let got = cfg.narrowest_conv();
            assert_eq!(
                (got.channels, got.set_by),
                (built, set_by),
                "{name} width {width}"
            );
        }
    }

    /// The folded bottleneck gets this network's tensors in the order it reads them: each bottleneck of ResNet-50
    /// and ResNet-D (identity, projection, ResNet-D's pooled projection) through the shim's ATen stages, whole and
    /// body alone (then the tail as `forward` runs it), gives the output, input gradient and running statistics of
    /// the block's plain forward in training.
    #[test]
    fn the_folded_bottleneck_gets_the_tensors_in_its_order() {
        for arch in [Arch::ResNet50, "resnet50d".parse().unwrap()] {
            let mut cfg = ResNetConfig::new(arch);
            cfg.width = 4;
            let vs = nn::VarStore::new(tch::Device::Cpu);
            let net = ResNet::new(&vs.root(), cfg);
            for (i, block) in net.layers.iter().enumerate() {
                let cin = block.units[0].conv.weight.size()[1];
                tch::manual_seed(i as i64);
                let x = Tensor::randn([2, cin, 9, 9], tch::kind::FLOAT_CPU).relu();
                let buffers = block.fused_tensors(true).1;
                let start: Vec<Tensor> = buffers.iter().map(Tensor::copy).collect();
                let run = |forward: &dyn Fn(&Tensor) -> Tensor| {
                    tch::no_grad(|| {
                        for (mut b, s) in buffers.iter().map(Tensor::shallow_clone).zip(&start) {
                            b.copy_(s);
                        }
                    });
                    let x = x.copy().set_requires_grad(true);
                    let out = forward(&x);
                    out.sum(tch::Kind::Float).backward();
                    let running: Vec<Tensor> = buffers.iter().map(Tensor::copy).collect();
                    (out.detach(), x.grad(), running)
                };
                let fold = |x: &Tensor, whole| {
                    block.with_fused_args(x, whole, |reach, params, buffers, stride| {
                        match crate::shim::bottleneck(
                            x,
                            reach,
                            params,
                            buffers,
                            stride,
                            BN_MOMENTUM,
                            BN_EPS,
                            false,
                        )
                        .unwrap()
                        {
                            crate::shim::Fused::Done(y) => y,
                            crate::shim::Fused::NotApplicable(why) => {
                                panic!("{arch} block {i}: {why}")
                            }
                        }
                    })
                };
                let want = run(&|x| block.forward(x, true));
                let whole = run(&|x| fold(x, true));
                let body = run(&|x| {
                    block.units[2].bn_act(&fold(x, false), true, Some(&block.shortcut(x, true)))
                });
                for (what, got) in [("whole", whole), ("body", body)] {
                    let close = |a: &Tensor, b: &Tensor| a.allclose(b, 1e-4, 1e-5, false);
                    assert!(close(&got.0, &want.0), "{arch} block {i} ({what}): output");
                    assert!(
                        close(&got.1, &want.1),
                        "{arch} block {i} ({what}): input gradient"
                    );
                    for (g, w) in got.2.iter().zip(&want.2) {
                        assert!(close(g, w), "{arch} block {i} ({what}): running statistics");
                    }
                }
            }
        }
    }
}
