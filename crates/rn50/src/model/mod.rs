//! The network: ResNet definitions with torchvision's names and init, weights ([`weights`]: loading them into a
//! model; [`weights_format`]: the safetensors and torch.save files they are in) and what is recorded with them
//! ([`recorded`]), class names as printed ([`class_names`]), memory format.
pub mod class_names;
pub mod fused;
pub mod memory_format;
pub mod recorded;
pub mod resnet;
pub mod sync_bn;
pub mod torch_save;
pub mod weights;
pub mod weights_format;

pub use resnet::{
    Arch, ChannelsSetBy, Depth, NarrowestConv, Pool, ResNet, ResNetConfig, Stem, Variant,
};

use tch::nn::VarStore;
use tch::{Device, Tensor};

/// A ResNet together with the store that owns its parameters and BN buffers.
pub struct Model {
    pub vs: VarStore,
    pub net: ResNet,
}

impl Model {
    /// A freshly initialised network on `device` (seed with `tch::manual_seed` for reproducibility).
    pub fn new(config: ResNetConfig, device: Device) -> Self {
        let vs = VarStore::new(device);
        let net = ResNet::new(&vs.root(), config);
        Self { vs, net }
    }

    pub fn forward_t(&self, x: &Tensor, train: bool) -> Tensor {
        self.net.forward_t(x, train)
    }

    /// Every tensor of the state_dict (parameters and BN running statistics), sorted by name.
    pub fn state(&self) -> Vec<(String, Tensor)> {
        let mut v: Vec<_> = self.vs.variables().into_iter().collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// The trainable parameters, sorted by name.
    pub fn parameters(&self) -> Vec<(String, Tensor)> {
        self.state()
            .into_iter()
            .filter(|(_, t)| t.requires_grad())
            .collect()
    }

    /// Running statistics of the BN layers (state that is not trained), sorted by name.
    pub fn buffers(&self) -> Vec<Tensor> {
        self.state()
            .into_iter()
            .filter(|(_, t)| !t.requires_grad())
            .map(|(_, t)| t)
            .collect()
    }

    /// Trainable parameters in the order the forward pass uses them (stem, stages by block number, fc), so
    /// that DDP's buckets, filled in reverse, match the order in which backward produces gradients.
    pub fn parameters_in_forward_order(&self) -> Vec<Tensor> {
        let key = |name: &str| -> (usize, usize, String) {
            let mut parts = name.split('.');
            let head = parts.next().unwrap_or("");
            match head
                .strip_prefix("layer")
                .and_then(|n| n.parse::<usize>().ok())
            {
                Some(stage) => {
                    let block = parts.next().and_then(|b| b.parse().ok()).unwrap_or(0);
                    (stage, block, name.to_string())
                }
                None if head == "fc" => (usize::MAX, 0, name.to_string()),
                None => (0, 0, name.to_string()),
            }
        };
        let mut v = self.parameters();
        v.sort_by_key(|(k, _)| key(k));
        v.into_iter().map(|(_, t)| t).collect()
    }

    pub fn num_parameters(&self) -> i64 {
        self.parameters()
            .iter()
            .map(|(_, t)| t.numel() as i64)
            .sum()
    }

    /// Re-stride every 4-D weight to channels_last (NHWC in memory, NCHW logically), as
    /// `model.to(memory_format=torch.channels_last)` does.
    pub fn to_channels_last(&self) {
        for (_, mut t) in self.state() {
            if t.dim() == 4 {
                memory_format::set_channels_last(&mut t);
            }
        }
    }

    pub fn device(&self) -> Device {
        self.vs.device()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Kind;

    #[test]
    fn parameter_counts_match_torchvision() {
        // torchvision.models.<arch>().parameters() summed (1000 classes).
        let want = [
            (Arch::ResNet18, 11_689_512),
            (Arch::ResNet34, 21_797_672),
            (Arch::ResNet50, 25_557_032),
            (Arch::ResNet101, 44_549_160),
            (Arch::ResNet152, 60_192_808),
        ];
        for (arch, n) in want {
            let m = Model::new(ResNetConfig::new(arch), Device::Cpu);
            assert_eq!(m.num_parameters(), n, "{arch}");
        }
    }

    /// `rn50 scaling` sizes the gradients by name (rn50_report::scaling::param_count, built without libtorch):
    /// every depth and variant, with the blur, Mish, squeeze-and-excitation, ResNeXt's groups and self-attention,
    /// counts what the network has.
    #[test]
    fn the_scaling_model_counts_every_variant_s_parameters() {
        for depth in Depth::ALL {
            for variant in [Variant::B, Variant::C, Variant::D] {
                for (blur, mish, se, (groups, width_per_group), sa) in [
                    (false, false, false, (1, 64), false),
                    (true, true, false, (1, 64), false),
                    (false, false, true, (1, 64), true),
                    (false, false, false, (32, 4), true),
                    (true, false, true, (64, 4), false),
                ] {
                    let arch = Arch {
                        depth,
                        variant,
                        blur,
                        mish,
                        groups,
                        width_per_group,
                        se,
                        sa,
                        pool: match (blur, variant) {
                            (false, _) => Pool::MaxBlur,
                            (true, Variant::D) => Pool::MaxDown,
                            (true, _) => Pool::Timm,
                        },
                    };
                    if arch.resnext() && !arch.bottleneck() {
                        continue;
                    }
                    let m = Model::new(ResNetConfig::new(arch), Device::Cpu);
                    let counted = rn50_report::scaling::param_count(&arch.name());
                    assert_eq!(counted, Some(m.num_parameters() as u64), "{arch}");
                }
            }
        }
    }

    #[test]
    fn shapes_and_key_names() {
        let m = Model::new(ResNetConfig::new(Arch::ResNet50), Device::Cpu);
        let state: std::collections::HashMap<_, _> = m.state().into_iter().collect();
        let shape = |k: &str| state.get(k).unwrap_or_else(|| panic!("no {k}")).size();
        assert_eq!(shape("conv1.weight"), [64, 3, 7, 7]);
        assert_eq!(shape("layer1.0.downsample.0.weight"), [256, 64, 1, 1]);
        assert_eq!(shape("layer2.0.conv2.weight"), [128, 128, 3, 3]);
        assert_eq!(shape("layer4.2.bn3.running_var"), [2048]);
        assert_eq!(shape("fc.weight"), [1000, 2048]);
        assert_eq!(shape("fc.bias"), [1000]);
        // BN buffers are state but not parameters.
        assert!(!state["layer1.0.bn1.running_mean"].requires_grad());
        let x = Tensor::randn([2, 3, 64, 64], (Kind::Float, Device::Cpu));
        assert_eq!(m.forward_t(&x, false).size(), [2, 1000]);
    }

    #[test]
    fn torchvision_init_and_zero_init_residual() {
        tch::manual_seed(0);
        let mut cfg = ResNetConfig::new(Arch::ResNet50);
        cfg.zero_init_residual = true;
        let m = Model::new(cfg, Device::Cpu);
        let state: std::collections::HashMap<_, _> = m.state().into_iter().collect();
        // Kaiming normal, fan_out, ReLU gain: std = sqrt(2 / (out_channels * k * k)).
        let w = &state["layer3.0.conv2.weight"];
        let std = f64::try_from(w.std(true)).unwrap();
        let want = (2.0 / (256.0 * 9.0f64)).sqrt();
        assert!((std / want - 1.0).abs() < 0.02, "std {std} vs {want}");
        let mean = |k: &str| f64::try_from(state[k].mean(Kind::Float)).unwrap();
        assert_eq!(
            mean("layer3.0.bn3.weight"),
            0.0,
            "last BN γ of a block zeroed"
        );
        assert_eq!(mean("layer3.0.bn2.weight"), 1.0);
        assert_eq!(mean("layer3.0.downsample.1.weight"), 1.0);
        assert_eq!(mean("bn1.bias"), 0.0);
        // nn.Linear: U(-1/sqrt(2048), 1/sqrt(2048)).
        let bound = 1.0 / 2048f64.sqrt();
        let max = f64::try_from(state["fc.weight"].abs().max()).unwrap();
        assert!(max <= bound && max > 0.9 * bound, "{max} vs {bound}");

        let mut cfg = ResNetConfig::new(Arch::ResNet18);
        cfg.zero_init_residual = true;
        let m = Model::new(cfg, Device::Cpu);
        let state: std::collections::HashMap<_, _> = m.state().into_iter().collect();
        assert_eq!(
            f64::try_from(state["layer1.1.bn2.weight"].sum(Kind::Float)).unwrap(),
            0.0
        );
    }

    #[test]
    fn cifar_stem_keeps_resolution_for_32px() {
        let mut cfg = ResNetConfig::new(Arch::ResNet18);
        cfg.stem = Stem::Cifar;
        cfg.num_classes = 10;
        let m = Model::new(cfg, Device::Cpu);
        let x = Tensor::randn([2, 3, 32, 32], (Kind::Float, Device::Cpu));
        assert_eq!(m.forward_t(&x, true).size(), [2, 10]);
        assert_eq!(
            m.state()
                .iter()
                .find(|(k, _)| k == "conv1.weight")
                .unwrap()
                .1
                .size(),
            [64, 3, 3, 3]
        );
    }

    #[test]
    fn arch_names() {
        assert_eq!("resnet50".parse::<Arch>().unwrap(), Arch::ResNet50);
        assert_eq!("ResNet-101".parse::<Arch>().unwrap(), Arch::ResNet101);
        let e = "resnet51".parse::<Arch>().unwrap_err().to_string();
        assert!(
            e.contains("unknown architecture") && e.contains("resnet152"),
            "{e}"
        );
    }
}
