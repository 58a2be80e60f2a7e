//! ResNet-18/34/50/101/152, v1.5 (the stride sits on the 3x3 conv of a bottleneck), exactly torchvision's
//! `torchvision.models.resnet`: same modules, same state_dict keys, same initialisation.
use std::fmt;
use std::str::FromStr;

use anyhow::{bail, Result};
use tch::nn::init::{FanInOut, NonLinearity, NormalOrUniform};
use tch::nn::{self, Init};
use tch::Tensor;

use super::{fused, sync_bn};

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    ResNet18,
    ResNet34,
    ResNet50,
    ResNet101,
    ResNet152,
}

impl Arch {
    pub const ALL: [Arch; 5] = [
        Arch::ResNet18,
        Arch::ResNet34,
        Arch::ResNet50,
        Arch::ResNet101,
        Arch::ResNet152,
    ];

    /// Blocks per stage.
    pub fn layers(self) -> [usize; 4] {
        match self {
            Arch::ResNet18 => [2, 2, 2, 2],
            Arch::ResNet34 => [3, 4, 6, 3],
            Arch::ResNet50 => [3, 4, 6, 3],
            Arch::ResNet101 => [3, 4, 23, 3],
            Arch::ResNet152 => [3, 8, 36, 3],
        }
    }

    pub fn bottleneck(self) -> bool {
        !matches!(self, Arch::ResNet18 | Arch::ResNet34)
    }

    pub fn name(self) -> &'static str {
        match self {
            Arch::ResNet18 => "resnet18",
            Arch::ResNet34 => "resnet34",
            Arch::ResNet50 => "resnet50",
            Arch::ResNet101 => "resnet101",
            Arch::ResNet152 => "resnet152",
        }
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Arch {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        let want = s.to_ascii_lowercase().replace(['-', '_'], "");
        match Arch::ALL.into_iter().find(|a| a.name() == want) {
            Some(a) => Ok(a),
            None => bail!(
                "unknown architecture '{s}': choose one of {}",
                Arch::ALL.map(|a| a.name()).join(", ")
            ),
        }
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
        let halvings = match self.stem {
            Stem::ImageNet => 5,
            Stem::Cifar => 3,
        };
        (0..halvings).fold(side, |n, _| n.div_ceil(2))
    }
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
}

impl ConvBn {
    fn forward(&self, x: &Tensor, train: bool) -> Tensor {
        let y = self.conv(x);
        self.bn(&y, train)
    }

    /// `relu(bn(conv(x)) + residual)`: on a GPU in training one fused cuDNN op for BN, add and ReLU (see
    /// [`super::fused`]), elsewhere (and with `--sync-bn`) the separate ops.
    fn forward_relu(&self, x: &Tensor, train: bool, residual: Option<&Tensor>) -> Tensor {
        self.bn_relu(&self.conv(x), train, residual)
    }

    /// `relu(bn(y) + residual)` of this unit's conv output `y`.
    fn bn_relu(&self, y: &Tensor, train: bool, residual: Option<&Tensor>) -> Tensor {
        if train && !sync_bn::enabled() {
            if let Some(out) = fused::bn_relu(y, residual, &self.bn, BN_MOMENTUM, BN_EPS) {
                return out;
            }
        }
        let mut y = self.bn(y, train);
        if let Some(r) = residual {
            y = y.g_add_(r);
        }
        y.relu_()
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

#[derive(Debug)]
struct Block {
    /// conv1/bn1 … conv{2,3}/bn{2,3}: two for a basic block, three for a bottleneck.
    units: Vec<ConvBn>,
    downsample: Option<ConvBn>,
}

impl Block {
    fn new(
        p: &nn::Path,
        bottleneck: bool,
        cin: i64,
        planes: i64,
        stride: i64,
        zero_last: bool,
    ) -> Self {
        let expansion = if bottleneck { 4 } else { 1 };
        let cout = planes * expansion;
        // (cin, cout, kernel, stride) of each conv; v1.5 puts the stride on the 3x3.
        let shapes: Vec<(i64, i64, i64, i64)> = if bottleneck {
            vec![
                (cin, planes, 1, 1),
                (planes, planes, 3, stride),
                (planes, cout, 1, 1),
            ]
        } else {
            vec![(cin, planes, 3, stride), (planes, planes, 3, 1)]
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
                }
            })
            .collect();
        let downsample = (stride != 1 || cin != cout).then(|| {
            let d = p / "downsample";
            ConvBn {
                conv: conv(&d / 0, cin, cout, 1, stride),
                bn: bn(&d / 1, cout, 1.0),
            }
        });
        Self { units, downsample }
    }

    /// A bottleneck's body (conv1 to conv3, bn1 and bn2) as [`fused::bottleneck`] takes it: the three conv
    /// weights, then γ and β of bn1 and bn2; and their running means and variances.
    fn body_tensors(&self) -> (Vec<Tensor>, Vec<Tensor>) {
        let mut params: Vec<Tensor> = self
            .units
            .iter()
            .map(|u| u.conv.weight.shallow_clone())
            .collect();
        let mut buffers = Vec::new();
        for u in &self.units[..2] {
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

    fn forward(&self, x: &Tensor, train: bool) -> Tensor {
        let identity = || match &self.downsample {
            Some(d) => d.forward(x, train),
            None => x.shallow_clone(),
        };
        // On a GPU in training, a bottleneck's body with bn1 and bn2 folded into its convolutions (cuDNN graphs),
        // then the same tail as below.
        if train && fused::block_enabled() && self.units.len() == 3 && !sync_bn::enabled() {
            let (params, buffers) = self.body_tensors();
            let stride = self.units[1].conv.stride;
            if let Some(y3) = fused::bottleneck(x, &params, &buffers, stride, BN_MOMENTUM, BN_EPS) {
                return self.units[2].bn_relu(&y3, train, Some(&identity()));
            }
        }
        let (last, inner) = self.units.split_last().expect("a block has units");
        let mut y = x.shallow_clone();
        for u in inner {
            y = u.forward_relu(&y, train, None);
        }
        last.forward_relu(&y, train, Some(&identity()))
    }
}

/// A ResNet whose parameters live in a `VarStore` under torchvision's names.
#[derive(Debug)]
pub struct ResNet {
    pub config: ResNetConfig,
    stem: ConvBn,
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
        let stem = ConvBn {
            conv: conv(root / "conv1", 3, w, k, s),
            bn: bn(root / "bn1", w, 1.0),
        };
        let bottleneck = config.arch.bottleneck();
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
                    bottleneck,
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
            layers,
            fc,
        }
    }

    /// Logits for a normalised NCHW float batch (any memory format). `train` selects batch statistics in BN
    /// (and updates the running ones) as `model.train()` does.
    pub fn forward_t(&self, x: &Tensor, train: bool) -> Tensor {
        let mut y = self.stem.forward_relu(x, train, None);
        if self.config.stem == Stem::ImageNet {
            y = fused::max_pool(&y, 3, 2, 1)
                .unwrap_or_else(|| y.max_pool2d([3, 3], [2, 2], [1, 1], [1, 1], false));
        }
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
        for stem in [Stem::ImageNet, Stem::Cifar] {
            let mut cfg = ResNetConfig::new(Arch::ResNet18);
            (cfg.stem, cfg.width, cfg.num_classes) = (stem, 4, 2);
            let vs = nn::VarStore::new(tch::Device::Cpu);
            let net = ResNet::new(&vs.root(), cfg.clone());
            for side in [1usize, 7, 8, 9, 31, 32, 33, 63, 64, 65, 100] {
                let x = Tensor::zeros([1, 3, side as i64, side as i64], tch::kind::FLOAT_CPU);
                let mut y = net.stem.forward_relu(&x, false, None);
                if stem == Stem::ImageNet {
                    y = y.max_pool2d([3, 3], [2, 2], [1, 1], [1, 1], false);
                }
                for block in &net.layers {
                    y = block.forward(&y, false);
                }
                let got = cfg.last_stage_side(side) as i64;
                assert_eq!(y.size()[2..], [got, got], "{stem:?} at {side} px");
            }
        }
    }
}
