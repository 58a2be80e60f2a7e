//! ResNet-18/34/50/101/152, v1.5 (the stride sits on the 3x3 conv of a bottleneck), exactly torchvision's
//! `torchvision.models.resnet`: same modules, same state_dict keys, same initialisation; and timm's ResNet-C/D
//! and anti-aliased variants of them ([`Arch`]), with timm's keys and torchvision's initialisation.
use std::fmt;
use std::str::FromStr;

use anyhow::{bail, Result};
use tch::nn::init::{FanInOut, NonLinearity, NormalOrUniform};
use tch::nn::{self, Init};
use tch::Tensor;

use super::{fused, memory_format, sync_bn};
use crate::shim::BlockReach;

/// The depth of a ResNet: torchvision's five, with their blocks per stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Depth {
    D18,
    D34,
    D50,
    D101,
    D152,
}

impl Depth {
    pub const ALL: [Depth; 5] = [Depth::D18, Depth::D34, Depth::D50, Depth::D101, Depth::D152];

    /// Blocks per stage.
    pub fn layers(self) -> [usize; 4] {
        match self {
            Depth::D18 => [2, 2, 2, 2],
            Depth::D34 => [3, 4, 6, 3],
            Depth::D50 => [3, 4, 6, 3],
            Depth::D101 => [3, 4, 23, 3],
            Depth::D152 => [3, 8, 36, 3],
        }
    }

    pub fn number(self) -> u32 {
        match self {
            Depth::D18 => 18,
            Depth::D34 => 34,
            Depth::D50 => 50,
            Depth::D101 => 101,
            Depth::D152 => 152,
        }
    }
}

/// How the network downsamples, by the letters of He et al. 2019 ("Bag of Tricks for Image Classification",
/// section 4.1) that timm's model names use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Variant {
    /// ResNet-B, torchvision's "v1.5": the stride on a bottleneck's 3x3 conv, the 7x7 stem.
    #[default]
    B,
    /// ResNet-C: the 7x7 stem conv replaced by three 3x3 convs (width/2, width/2, width channels; timm's
    /// `stem_type="deep", stem_width=32`), `conv1.0`, `conv1.3`, `conv1.6` with batch norms `conv1.1` and
    /// `conv1.4` between them.
    C,
    /// ResNet-D: ResNet-C, and each strided shortcut a 2x2 average pool (stride 2, ceil mode, padding not
    /// counted) then its 1x1 conv at stride 1 (timm's `avg_down=True`: `downsample.1` is the conv,
    /// `downsample.2` its batch norm).
    D,
}

/// A network by the name torchvision or timm gives it: `resnet50` (torchvision's), `resnet50d` (timm's ResNet-D),
/// `resnetblur50` (timm's anti-aliased ResNet), `resnetblur50d`, and every other depth of 18 to 152 with the
/// suffix c or d and the prefix `resnetblur`; any of them with `_mish` (`resnet50d_mish`) has Mish for ReLU. The
/// state_dict keys are torchvision's or timm's, so that each loads the other's weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Arch {
    pub depth: Depth,
    pub variant: Variant,
    /// Anti-aliased downsampling (Zhang 2019, "Making Convolutional Networks Shift-Invariant Again"; timm's
    /// `aa_layer=BlurPool2d`): the stem's max-pool and each block's strided 3x3 conv run at stride 1, then a 3x3
    /// binomial blur (`[1, 2, 1]` outer itself / 16, reflection padding 1) with stride 2 on each channel. The
    /// blur has no parameters; it is told apart only by the name recorded with the weights.
    pub blur: bool,
    /// Mish (Misra 2019, `x·tanh(softplus(x))`) wherever torchvision has a ReLU: the activation of fast.ai's
    /// xresnet, which its Imagenette leaderboard entries train; timm's `act_layer="mish"`. No parameters: told
    /// apart only by the name recorded with the weights (suffix `_mish`). Initialisation stays torchvision's.
    pub mish: bool,
}

#[allow(non_upper_case_globals)]
impl Arch {
    pub const ResNet18: Arch = Arch::plain(Depth::D18);
    pub const ResNet34: Arch = Arch::plain(Depth::D34);
    pub const ResNet50: Arch = Arch::plain(Depth::D50);
    pub const ResNet101: Arch = Arch::plain(Depth::D101);
    pub const ResNet152: Arch = Arch::plain(Depth::D152);
}

impl Arch {
    /// torchvision's five ResNets.
    pub const ALL: [Arch; 5] = [
        Arch::ResNet18,
        Arch::ResNet34,
        Arch::ResNet50,
        Arch::ResNet101,
        Arch::ResNet152,
    ];

    /// torchvision's ResNet of `depth`.
    pub const fn plain(depth: Depth) -> Self {
        Self {
            depth,
            variant: Variant::B,
            blur: false,
            mish: false,
        }
    }

    /// Blocks per stage.
    pub fn layers(self) -> [usize; 4] {
        self.depth.layers()
    }

    pub fn bottleneck(self) -> bool {
        !matches!(self.depth, Depth::D18 | Depth::D34)
    }

    /// The three-conv stem of ResNet-C and -D.
    pub fn deep_stem(self) -> bool {
        matches!(self.variant, Variant::C | Variant::D)
    }

    /// ResNet-D's average-pool shortcut.
    pub fn avg_down(self) -> bool {
        self.variant == Variant::D
    }

    /// torchvision's or timm's name: `resnet50`, `resnet50d`, `resnetblur50d`; `resnet50d_mish`.
    pub fn name(self) -> String {
        let suffix = match self.variant {
            Variant::B => "",
            Variant::C => "c",
            Variant::D => "d",
        };
        let blur = if self.blur { "blur" } else { "" };
        let mish = if self.mish { "_mish" } else { "" };
        format!("resnet{blur}{}{suffix}{mish}", self.depth.number())
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

impl FromStr for Arch {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        let want = s.to_ascii_lowercase().replace(['-', '_'], "");
        let parse = || -> Option<Arch> {
            let rest = want.strip_prefix("resnet")?;
            let (mish, rest) = match rest.strip_suffix("mish") {
                Some(r) => (true, r),
                None => (false, rest),
            };
            let (blur, rest) = match rest.strip_prefix("blur") {
                Some(r) => (true, r),
                None => (false, rest),
            };
            let (digits, variant) = match rest.as_bytes().last()? {
                b'c' => (&rest[..rest.len() - 1], Variant::C),
                b'd' => (&rest[..rest.len() - 1], Variant::D),
                _ => (rest, Variant::B),
            };
            let n: u32 = digits.parse().ok()?;
            let depth = Depth::ALL.into_iter().find(|d| d.number() == n)?;
            Some(Arch {
                depth,
                variant,
                blur,
                mish,
            })
        };
        match parse() {
            Some(a) => Ok(a),
            None => bail!(
                "unknown architecture '{s}': choose one of {} (torchvision's), with the suffix c or d for \
                 ResNet-C or -D and the prefix resnetblur for anti-aliased downsampling, as timm names them \
                 (resnet50d, resnetblur50, resnetblur50d), and any of them with the suffix _mish for Mish in place \
                 of ReLU (resnet50d_mish)",
                Arch::ALL.map(|a| a.name()).join(", ")
            ),
        }
    }
}

impl serde::Serialize for Arch {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.name())
    }
}

impl<'de> serde::Deserialize<'de> for Arch {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

/// The first layers: ImageNet's 7x7/2 conv + 3x3/2 max-pool, or a 3x3/1 conv without pooling for 32 px images
/// (CIFAR), the usual adaptation; parameter names stay torchvision's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stem {
    #[default]
    ImageNet,
    Cifar,
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

    /// The fewest output channels of any convolution: the stem's and the first stage's, `width` (3 input
    /// channels of the stem aside).
    pub fn narrowest_conv(&self) -> i64 {
        self.width
    }

    /// The side of the last stage's feature maps for input images of side `side`: every stride-2 layer (the
    /// ImageNet stem's conv and max pool, the first block of stages 2 to 4) maps `n` to `ceil(n / 2)`. Batch
    /// norm there sees batch × side² values per channel, the fewest of the network.
    pub fn last_stage_side(&self, side: usize) -> usize {
        halved(side, self.halvings())
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
    /// of 17 px or more with the ImageNet stem, 5 with CIFAR's); any side runs through the others.
    pub fn check_side(&self, side: usize) -> Result<(), String> {
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

/// A bias-free square conv: its weight `<p>.weight`, `[cout, cin, k, k]`.
#[derive(Debug)]
struct Conv {
    weight: Tensor,
    stride: i64,
    padding: i64,
}

fn conv(p: nn::Path, cin: i64, cout: i64, k: i64, stride: i64) -> Conv {
    Conv {
        weight: p.var("weight", &[cout, cin, k, k], CONV_INIT),
        stride,
        padding: k / 2,
    }
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
        let mut y = self.bn(y, train);
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
            1,
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

/// timm's `BlurPool2d(channels, filt_size=3, stride=2)`: reflection padding 1, then every channel convolved at
/// stride 2 with the binomial filter `[1, 2, 1]ᵀ[1, 2, 1] / 16`. The filter is not state (timm's buffer is not
/// persistent), so weights files hold none.
#[derive(Debug)]
struct Blur {
    /// `[channels, 1, 3, 3]`, fp32 on the model's device.
    filter: Tensor,
}

impl Blur {
    fn new(device: tch::Device, channels: i64) -> Self {
        let taps = Tensor::from_slice(&[1f32, 2., 1.]);
        let filter = (taps.unsqueeze(1) * taps.unsqueeze(0) / 16.0)
            .view([1, 1, 3, 3])
            .repeat([channels, 1, 1, 1])
            .to_device(device);
        Self { filter }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        let mut filter = self.filter.to_kind(x.kind());
        if memory_format::is_channels_last(x) {
            filter = memory_format::channels_last(&filter);
        }
        x.reflection_pad2d([1, 1, 1, 1]).conv2d(
            &filter,
            None::<Tensor>,
            [2, 2],
            [0, 0],
            [1, 1],
            self.filter.size()[0],
        )
    }
}

/// A block's shortcut where its input and output differ in shape: a 1x1 conv with the block's stride and a
/// batch norm (`downsample.0`, `.1`), or ResNet-D's 2x2 average pool then the conv at stride 1 (`downsample.1`,
/// `.2`).
#[derive(Debug)]
struct Downsample {
    avg_pool: bool,
    unit: ConvBn,
}

impl Downsample {
    fn forward(&self, x: &Tensor, train: bool) -> Tensor {
        self.unit.forward(&self.conv_input(x), train)
    }

    /// What the conv reads: the block's input, or ResNet-D's average-pooled input.
    fn conv_input(&self, x: &Tensor) -> Tensor {
        if self.avg_pool {
            // nn.AvgPool2d(2, 2, ceil_mode=True, count_include_pad=False), as timm's downsample_avg.
            return x.avg_pool2d([2, 2], [2, 2], [0, 0], true, false, None::<i64>);
        }
        x.shallow_clone()
    }
}

#[derive(Debug)]
struct Block {
    /// conv1/bn1 … conv{2,3}/bn{2,3}: two for a basic block, three for a bottleneck.
    units: Vec<ConvBn>,
    /// The anti-aliasing blur after the strided unit's ReLU (`Arch::blur`, a block of stride 2): that unit's
    /// conv then runs at stride 1.
    blur: Option<(usize, Blur)>,
    downsample: Option<Downsample>,
}

impl Block {
    fn new(p: &nn::Path, arch: Arch, cin: i64, planes: i64, stride: i64, zero_last: bool) -> Self {
        let bottleneck = arch.bottleneck();
        let expansion = if bottleneck { 4 } else { 1 };
        let cout = planes * expansion;
        // The unit that downsamples: v1.5 puts the stride on the 3x3, the bottleneck's second conv.
        let strided = usize::from(bottleneck);
        let blur = (arch.blur && stride != 1).then(|| (strided, Blur::new(p.device(), planes)));
        let conv_stride = if blur.is_some() { 1 } else { stride };
        // (cin, cout, kernel, stride) of each conv.
        let shapes: Vec<(i64, i64, i64, i64)> = if bottleneck {
            vec![
                (cin, planes, 1, 1),
                (planes, planes, 3, conv_stride),
                (planes, cout, 1, 1),
            ]
        } else {
            vec![(cin, planes, 3, conv_stride), (planes, planes, 3, 1)]
        };
        let last = shapes.len();
        let units = shapes
            .into_iter()
            .enumerate()
            .map(|(i, (ci, co, k, s))| {
                let n = i + 1;
                let gamma = if zero_last && n == last { 0.0 } else { 1.0 };
                ConvBn {
                    conv: conv(p / format!("conv{n}"), ci, co, k, s),
                    bn: bn(p / format!("bn{n}"), co, gamma),
                    mish: arch.mish,
                }
            })
            .collect();
        let downsample = (stride != 1 || cin != cout).then(|| {
            let d = p / "downsample";
            let avg_pool = arch.avg_down();
            let (first, conv_stride) = if avg_pool { (1, 1) } else { (0, stride) };
            Downsample {
                // timm's pool is nn.Identity in a block of stride 1: the keys are the same, nothing to run.
                avg_pool: avg_pool && stride != 1,
                unit: ConvBn {
                    conv: conv(&d / first, cin, cout, 1, conv_stride),
                    bn: bn(&d / (first + 1), cout, 1.0),
                    mish: arch.mish,
                },
            }
        });
        Self {
            units,
            blur,
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
        // The blur sits between bn2 and conv3, where the folded bottleneck cannot; its graphs apply ReLU.
        if train
            && fused::block_enabled()
            && self.units.len() == 3
            && self.blur.is_none()
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
        last.forward_act(&y, train, Some(&self.shortcut(x, train)))
    }
}

/// A ResNet whose parameters live in a `VarStore` under torchvision's names.
#[derive(Debug)]
pub struct ResNet {
    pub config: ResNetConfig,
    /// `conv1`/`bn1`; ResNet-C/D's three: `conv1.0`/`conv1.1`, `conv1.3`/`conv1.4`, `conv1.6`/`bn1`.
    stem: Vec<ConvBn>,
    /// The stem max-pool's blur (`Arch::blur`, ImageNet stem): the max-pool then runs at stride 1.
    stem_blur: Option<Blur>,
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
            let (c1, p) = ((w / 2).max(1), root / "conv1");
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
        let stem_blur =
            (arch.blur && config.stem == Stem::ImageNet).then(|| Blur::new(root.device(), w));
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
                layers.push(Block::new(
                    &(&p / b),
                    arch,
                    cin,
                    planes,
                    stride,
                    config.zero_init_residual,
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
            stem_blur,
            layers,
            fc,
        }
    }

    /// The stem: its convs, batch norms and ReLUs, then (ImageNet's) the 3x3 max-pool, at stride 2 or, with
    /// the blur, at stride 1 then the blur.
    fn stem_forward(&self, x: &Tensor, train: bool) -> Tensor {
        let mut y = x.shallow_clone();
        for u in &self.stem {
            y = u.forward_act(&y, train, None);
        }
        if self.config.stem == Stem::Cifar {
            return y;
        }
        let stride = if self.stem_blur.is_some() { 1 } else { 2 };
        let y = fused::max_pool(&y, 3, stride, 1)
            .unwrap_or_else(|| y.max_pool2d([3, 3], [stride, stride], [1, 1], [1, 1], false));
        match &self.stem_blur {
            Some(blur) => blur.forward(&y),
            None => y,
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

    /// `last_stage_side` is the side of the last stage's output, for both stems and odd sides.
    #[test]
    fn last_stage_side_is_what_the_network_computes() {
        let archs = [Arch::ResNet18, "resnetblur18d".parse().unwrap()];
        for (stem, arch) in [Stem::ImageNet, Stem::Cifar]
            .into_iter()
            .flat_map(|s| archs.map(|a| (s, a)))
        {
            let mut cfg = ResNetConfig::new(arch);
            (cfg.stem, cfg.width, cfg.num_classes) = (stem, 4, 2);
            let vs = nn::VarStore::new(tch::Device::Cpu);
            let net = ResNet::new(&vs.root(), cfg.clone());
            for side in [1usize, 7, 8, 9, 31, 32, 33, 63, 64, 65, 100] {
                if arch.blur && cfg.smallest_blur_input(side) < 2 {
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

    /// Every name parses back to itself; timm's spellings and torchvision's are accepted, others refused.
    #[test]
    fn names_of_the_variants() {
        for depth in Depth::ALL {
            for variant in [Variant::B, Variant::C, Variant::D] {
                for (blur, mish) in [(false, false), (true, false), (false, true), (true, true)] {
                    let a = Arch {
                        depth,
                        variant,
                        blur,
                        mish,
                    };
                    assert_eq!(a.name().parse::<Arch>().unwrap(), a);
                    let json = serde_json::to_string(&a).unwrap();
                    assert_eq!(serde_json::from_str::<Arch>(&json).unwrap(), a);
                }
            }
        }
        let d: Arch = "ResNet-50d".parse().unwrap();
        assert_eq!(
            (d.depth, d.variant, d.blur),
            (Depth::D50, Variant::D, false)
        );
        assert!(d.deep_stem() && d.avg_down());
        let b: Arch = "resnetblur50".parse().unwrap();
        assert_eq!((b.variant, b.blur, b.mish), (Variant::B, true, false));
        let m: Arch = "resnetblur50d_mish".parse().unwrap();
        assert_eq!((m.variant, m.blur, m.mish), (Variant::D, true, true));
        assert_eq!(m.name(), "resnetblur50d_mish");
        assert_eq!(
            serde_json::to_string(&Arch::ResNet50).unwrap(),
            r#""resnet50""#
        );
        for bad in [
            "resnet51",
            "resnet50e",
            "resnetblur",
            "resnet",
            "blur50",
            "resnet50dd",
            "resnet50_mish_mish",
            "resnetmish",
            "resnet50mishd",
            "",
        ] {
            assert!(bad.parse::<Arch>().is_err(), "{bad}");
        }
    }
}
