//! The networks rn50 trains, by the names torchvision and timm give them (`-a`), and what each name means: depth,
//! downsampling variant, blur, activation, ResNeXt groups, squeeze-and-excitation and self-attention. Free of
//! libtorch, so that `rn50 scaling` counts a network's parameters from its name ([`Arch::param_count`]) where the
//! network itself (rn50's `model::resnet`) is built.
use std::fmt;
use std::str::FromStr;

use anyhow::{bail, Result};

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

/// The largest groups × width per group of a ResNeXt name (`resnext101_32x48d`'s 1,536 the largest published):
/// beyond it the network's size, not the flag, would be the mistake.
pub const MAX_GROUP_CHANNELS: u32 = 2048;

/// A network by the name torchvision or timm gives it: `resnet50` (torchvision's), `resnet50d` (timm's ResNet-D),
/// `resnetblur50` (timm's anti-aliased ResNet), `resnetblur50d`, and every other depth of 18 to 152 with the
/// suffix c or d and the prefix `resnetblur`; ResNeXt with its groups and width per group (`resnext50_32x4d`,
/// torchvision's; `resnext50d_32x4d`, timm's), squeeze-and-excitation with the prefix `se` (`seresnet50`,
/// `seresnext50d_32x4d`, timm's names); any of them with `_mish` (`resnet50d_mish`) has Mish for ReLU, and with
/// `_sa` (`resnet50d_sa`, `seresnext50d_32x4d_mish_sa`) fast.ai's simple self-attention; `_maxblur` before those
/// (`resnet50d_maxblur`) has the max-blur pool of fast.ai's 2020-10 Imagenette entry, `_maxdown`
/// (`resnet50d_maxdown`) fast.ai's max-pool shortcuts ([`Pool`]). The state_dict keys are torchvision's or timm's,
/// so that each loads the other's weights (self-attention's, which neither has, are fast.ai's module's).
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
    /// ResNeXt (Xie et al. 2017): the bottleneck's 3x3 conv in this many groups (torchvision's `groups`, timm's
    /// `cardinality`); 1 for ResNet.
    pub groups: u32,
    /// ResNeXt's channels per group at the first stage's width 64 (torchvision's `width_per_group`, timm's
    /// `base_width`): a bottleneck of `planes` is `floor(planes · width_per_group / 64) · groups` wide. 64 for
    /// ResNet.
    pub width_per_group: u32,
    /// Squeeze-and-excitation (Hu et al. 2018) on each block's last batch norm, before the shortcut's add: timm's
    /// `attn_layer="se"` (`se.fc1`, `se.fc2`: 1x1 convs with biases, to `make_divisible(channels / 16, 8)`
    /// channels and back, ReLU between, a sigmoid gate), the ReLU kept with Mish as timm keeps it.
    pub se: bool,
    /// fast.ai's `SimpleSelfAttention` (its xresnet's `sa=True`, `train_imagenette.py --sa 1`), in one place: the
    /// last block of the first stage, on the last batch norm's output (after squeeze-and-excitation) before the
    /// shortcut's add. With `x` that output as `[C, H·W]` per image, `x + γ · (x xᵀ) (W x)`: `W` a `C×C` 1x1
    /// convolution under spectral normalisation (`torch.nn.utils.spectral_norm`: divided by its largest singular
    /// value, estimated by one power iteration per training step), `γ` a scalar starting at 0, so the block
    /// starts as it is without it. Keys `layer1.N.sa.conv.weight_orig`, `.weight_u`, `.weight_v`, `.gamma`, as
    /// fast.ai's module names them; suffix `_sa`, last.
    pub sa: bool,
    /// The stem's and ResNet-D's shortcuts' pools: timm's, or fast.ai's ([`Pool`]).
    pub pool: Pool,
}

/// The pools fast.ai's xresnet chooses with `pool=` (and its 2020-10 Imagenette entry by replacing every max pool)
/// where timm's ResNet has its own: the stem's max pool and ResNet-D's strided shortcuts' pool. None has
/// parameters: they are told apart only by the name recorded with the weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pool {
    /// timm's (and torchvision's stem): the stem's 3x3 max pool at stride 2, ResNet-D's 2x2 average pool
    /// (`nn.AvgPool2d(2, ceil_mode=True, count_include_pad=False)`, fast.ai's `pool=AvgPool`).
    Timm,
    /// fast.ai's `pool=MaxPool` (suffix `_maxdown`, before `_mish`; ResNet-D only): each strided shortcut's pool a
    /// 2x2 max pool, `nn.MaxPool2d(2, ceil_mode=True)`; the stem's as timm's. The pools of fast.ai's 2020-01
    /// Imagenette runs, and of the 2020-10 entry before it blurred them.
    MaxDown,
    /// The pooling of fast.ai's 2020-10 Imagenette leaderboard entry (its xresnet with `pool=MaxPool`, every
    /// `nn.MaxPool2d` then replaced by kornia 0.4.1's `MaxBlurPool2d(3, ceil_mode=True)`): the stem's max pool and,
    /// in ResNet-D, each strided shortcut's pool become a 3x3 max pool at stride 1 (padding 1), then kornia's
    /// `pyrdown`: each channel blurred by the 5x5 binomial filter (`[1, 4, 6, 4, 1]` outer itself / 256,
    /// reflection padding 2) and resized bilinearly by the scale 0.5 (the side halved rounding down; a 2x2 mean on
    /// even sides). The strided 3x3 convs stay. Suffix `_maxblur`, before `_mish`. Not with [`Arch::blur`], which
    /// blurs the same stem pool.
    MaxBlur,
}

impl Pool {
    /// The name's suffix, without its separator.
    fn suffix(self) -> &'static str {
        match self {
            Pool::Timm => "",
            Pool::MaxDown => "maxdown",
            Pool::MaxBlur => "maxblur",
        }
    }
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
            groups: 1,
            width_per_group: 64,
            se: false,
            sa: false,
            pool: Pool::Timm,
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

    /// ResNeXt's grouped or widened bottleneck (named `resnext`).
    pub fn resnext(self) -> bool {
        (self.groups, self.width_per_group) != (1, 64)
    }

    /// The channels of the 3x3 conv of a bottleneck of `planes` (torchvision's `width`): `planes` for ResNet.
    pub fn bottleneck_width(self, planes: i64) -> i64 {
        planes * i64::from(self.width_per_group) / 64 * i64::from(self.groups)
    }

    /// The channels squeeze-and-excitation reduces `channels` to: timm's `make_divisible(channels / 16, 8,
    /// round_limit=0)`, the nearest multiple of 8 and at least 8.
    pub fn se_channels(channels: i64) -> i64 {
        let v = channels as f64 / 16.0;
        (((v + 4.0) as i64) / 8 * 8).max(8)
    }

    /// torchvision's or timm's name: `resnet50`, `resnet50d`, `resnetblur50d`, `seresnext50d_32x4d`,
    /// `resnet50d_mish`; `resnet50d_mish_sa` with self-attention.
    pub fn name(self) -> String {
        let suffix = match self.variant {
            Variant::B => "",
            Variant::C => "c",
            Variant::D => "d",
        };
        let se = if self.se { "se" } else { "" };
        let (family, groups) = match self.resnext() {
            true => (
                "resnext",
                format!("_{}x{}d", self.groups, self.width_per_group),
            ),
            false => ("resnet", String::new()),
        };
        let blur = if self.blur { "blur" } else { "" };
        let pool = match self.pool {
            Pool::Timm => String::new(),
            p => format!("_{}", p.suffix()),
        };
        let mish = if self.mish { "_mish" } else { "" };
        let sa = if self.sa { "_sa" } else { "" };
        format!(
            "{se}{family}{blur}{}{suffix}{groups}{pool}{mish}{sa}",
            self.depth.number()
        )
    }

    /// The parameters of this network with `num_classes` classes and torchvision's widths (first stage 64): what
    /// `rn50 scaling` sizes the gradients by.
    pub fn param_count(self, num_classes: u64) -> u64 {
        let conv = |cin: u64, cout: u64, k: u64, groups: u64| cin / groups * cout * k * k;
        let bn = |c: u64| 2 * c;
        let mut n = if self.deep_stem() {
            conv(3, 32, 3, 1) + bn(32) + conv(32, 32, 3, 1) + bn(32) + conv(32, 64, 3, 1) + bn(64)
        } else {
            conv(3, 64, 7, 1) + bn(64)
        };
        let expansion = if self.bottleneck() { 4 } else { 1 };
        let mut cin = 64u64;
        for (stage, &blocks) in self.layers().iter().enumerate() {
            let planes = 64u64 << stage;
            let cout = planes * expansion;
            for b in 0..blocks {
                n += if self.bottleneck() {
                    let w = self.bottleneck_width(planes as i64) as u64;
                    conv(cin, w, 1, 1)
                        + bn(w)
                        + conv(w, w, 3, u64::from(self.groups))
                        + bn(w)
                        + conv(w, cout, 1, 1)
                        + bn(cout)
                } else {
                    conv(cin, planes, 3, 1) + bn(planes) + conv(planes, planes, 3, 1) + bn(planes)
                };
                if self.se {
                    let rd = Self::se_channels(cout as i64) as u64;
                    n += conv(cout, rd, 1, 1) + rd + conv(rd, cout, 1, 1) + cout;
                }
                if b == 0 && (stage > 0 || cin != cout) {
                    n += conv(cin, cout, 1, 1) + bn(cout);
                }
                cin = cout;
            }
            if self.sa && stage == 0 {
                // The 1x1 convolution (`weight_orig`) and γ; the power iteration's vectors are buffers.
                n += conv(cout, cout, 1, 1) + 1;
            }
        }
        n + cin * num_classes + num_classes
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// `rest` = `<depth><c|d|>`, the depth one of torchvision's five, then what follows the letter.
fn depth_and_variant(rest: &str) -> Option<(Depth, Variant, &str)> {
    Depth::ALL.into_iter().find_map(|depth| {
        let after = rest.strip_prefix(&depth.number().to_string())?;
        let (variant, after) = match after.as_bytes().first() {
            Some(b'c') => (Variant::C, &after[1..]),
            Some(b'd') => (Variant::D, &after[1..]),
            _ => (Variant::B, after),
        };
        Some((depth, variant, after))
    })
}

impl FromStr for Arch {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        let want = s.to_ascii_lowercase().replace(['-', '_'], "");
        let parse = || -> Option<Arch> {
            let (se, rest) = match want.strip_prefix("se") {
                Some(r) => (true, r),
                None => (false, want.as_str()),
            };
            let (resnext, rest) = match rest.strip_prefix("resnext") {
                Some(r) => (true, r),
                None => (false, rest.strip_prefix("resnet")?),
            };
            let (sa, rest) = match rest.strip_suffix("sa") {
                Some(r) => (true, r),
                None => (false, rest),
            };
            let (mish, rest) = match rest.strip_suffix("mish") {
                Some(r) => (true, r),
                None => (false, rest),
            };
            let (pool, rest) = [Pool::MaxBlur, Pool::MaxDown]
                .into_iter()
                .find_map(|p| Some((p, rest.strip_suffix(p.suffix())?)))
                .unwrap_or((Pool::Timm, rest));
            let (blur, rest) = match rest.strip_prefix("blur") {
                Some(r) => (true, r),
                None => (false, rest),
            };
            let (depth, variant, rest) = depth_and_variant(rest)?;
            let (groups, width_per_group) = match resnext {
                // `<groups>x<width>d`, the separator before it already dropped.
                true => {
                    let (g, w) = rest.strip_suffix('d')?.split_once('x')?;
                    (g.parse().ok()?, w.parse().ok()?)
                }
                false if rest.is_empty() => (1, 64),
                false => return None,
            };
            let arch = Arch {
                depth,
                variant,
                blur,
                mish,
                groups,
                width_per_group,
                se,
                sa,
                pool,
            };
            let fits = groups >= 1
                && width_per_group >= 1
                && groups
                    .checked_mul(width_per_group)
                    .is_some_and(|c| c <= MAX_GROUP_CHANNELS);
            // torchvision's basic block refuses groups and widths ("BasicBlock only supports groups=1 and
            // base_width=64").
            // Both blurs replace the stem's max pool; fast.ai's max-pool shortcuts replace ResNet-D's pools.
            (fits
                && (arch.bottleneck() || !arch.resnext())
                && arch.resnext() == resnext
                && !(blur && pool == Pool::MaxBlur)
                && (pool != Pool::MaxDown || arch.avg_down()))
            .then_some(arch)
        };
        match parse() {
            Some(a) => Ok(a),
            None => bail!(
                "unknown architecture '{s}': choose one of {} (torchvision's), with the suffix c or d for \
                 ResNet-C or -D and the prefix resnetblur for anti-aliased downsampling, as timm names them \
                 (resnet50d, resnetblur50, resnetblur50d); ResNeXt of 50 layers or more as resnext50_32x4d \
                 (groups x width per group, their product at most {MAX_GROUP_CHANNELS}; resnext50d_32x4d); the \
                 prefix se for squeeze-and-excitation (seresnet50, seresnext50d_32x4d); and any of them with the \
                 suffix _mish for Mish in place of ReLU (resnet50d_mish), then _sa for fast.ai's self-attention \
                 (resnet50d_sa, resnet50d_mish_sa); _maxblur before those for the max-blur pool of fast.ai's \
                 2020-10 Imagenette entry (resnet50d_maxblur, not with resnetblur), or _maxdown for fast.ai's \
                 max-pool shortcuts (ResNet-D only: resnet50d_maxdown)",
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every name parses back to itself; timm's spellings and torchvision's are accepted, others refused.
    #[test]
    fn names_of_the_variants() {
        for depth in Depth::ALL {
            for variant in [Variant::B, Variant::C, Variant::D] {
                for (bits, pool) in (0..32u32)
                    .flat_map(|b| [Pool::Timm, Pool::MaxDown, Pool::MaxBlur].map(|p| (b, p)))
                {
                    let (blur, mish, se, resnext, sa) = (
                        bits & 1 != 0,
                        bits & 2 != 0,
                        bits & 4 != 0,
                        bits & 8 != 0,
                        bits & 16 != 0,
                    );
                    let mut a = Arch {
                        depth,
                        variant,
                        blur,
                        mish,
                        se,
                        sa,
                        pool,
                        ..Arch::plain(depth)
                    };
                    if resnext {
                        (a.groups, a.width_per_group) = (32, 4);
                    }
                    if (resnext && !a.bottleneck())
                        || (blur && pool == Pool::MaxBlur)
                        || (pool == Pool::MaxDown && variant != Variant::D)
                    {
                        assert!(a.name().parse::<Arch>().is_err(), "{}", a.name());
                        continue;
                    }
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
        let s: Arch = "seresnext50d_32x4d_mish_sa".parse().unwrap();
        assert_eq!(
            (s.variant, s.se, s.mish, s.sa),
            (Variant::D, true, true, true)
        );
        assert_eq!(s.name(), "seresnext50d_32x4d_mish_sa");
        let x: Arch = "seresnext50d_32x4d_maxblur_mish_sa".parse().unwrap();
        assert_eq!(
            (x.variant, x.pool, x.blur, x.sa),
            (Variant::D, Pool::MaxBlur, false, true)
        );
        assert_eq!(x.name(), "seresnext50d_32x4d_maxblur_mish_sa");
        let m: Arch = "resnetblur50d_maxdown_mish".parse().unwrap();
        assert_eq!(
            (m.variant, m.pool, m.blur, m.mish),
            (Variant::D, Pool::MaxDown, true, true)
        );
        assert_eq!(m.name(), "resnetblur50d_maxdown_mish");
        // torchvision's and timm's ResNeXt and SE names.
        for (name, groups, width, variant, se) in [
            ("resnext50_32x4d", 32, 4, Variant::B, false),
            ("resnext101_32x8d", 32, 8, Variant::B, false),
            ("resnext101_64x4d", 64, 4, Variant::B, false),
            ("resnext50d_32x4d", 32, 4, Variant::D, false),
            ("seresnext50_32x4d", 32, 4, Variant::B, true),
            ("seresnext26d_32x4d", 0, 0, Variant::D, true),
            ("seresnet50", 1, 64, Variant::B, true),
            ("seresnet18", 1, 64, Variant::B, true),
        ] {
            let parsed = name.parse::<Arch>();
            if groups == 0 {
                assert!(parsed.is_err(), "{name}: depth 26 is not torchvision's");
                continue;
            }
            let a = parsed.unwrap();
            assert_eq!(
                (a.groups, a.width_per_group, a.variant, a.se),
                (groups, width, variant, se),
                "{name}"
            );
            assert_eq!(a.name(), name);
        }
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
            "resnet50_sa_mish",
            "resnet50_sa_sa",
            "resnetblur50d_maxblur",
            "resnet50d_mish_maxblur",
            "resnet50d_sa_maxblur",
            "resnet50d_maxblur_maxblur",
            "resnetmaxblur50d",
            "resnet50_maxdown",
            "resnet50c_maxdown",
            "resnet50d_maxdown_maxblur",
            "resnet50d_maxblur_maxdown",
            "resnet50d_mish_maxdown",
            "resnetsa50",
            "resnet50sad",
            "resnetmish",
            "resnet50mishd",
            "resnext50",
            "resnext18_32x4d",
            "resnext50_0x4d",
            "resnext50_32x0d",
            "resnext50_64x64d",
            "resnext50_65536x65536d",
            "resnext50_1x64d",
            "resnet50_32x4d",
            "resnext50_32x4",
            "resnext50_x4d",
            "seresnext50",
            "sese",
            "seresnet",
            "",
        ] {
            assert!(bad.parse::<Arch>().is_err(), "{bad}");
        }
    }

    /// timm's `make_divisible(channels / 16, 8, round_limit=0)` for the widths rn50 builds.
    #[test]
    fn squeeze_channels_are_timm_s() {
        for (channels, want) in [
            (256, 16),
            (512, 32),
            (1024, 64),
            (2048, 128),
            (64, 8),
            (16, 8),
            (200, 16),
        ] {
            assert_eq!(Arch::se_channels(channels), want, "{channels}");
        }
    }

    /// timm 1.0.31's and torchvision's own counts (sum of each network's parameters, 1000 classes).
    #[test]
    fn parameter_counts_are_torchvision_s_and_timm_s() {
        for (name, want) in [
            ("resnet18", 11_689_512),
            ("resnet50", 25_557_032),
            ("resnet152", 60_192_808),
            ("resnet50d", 25_576_264),
            ("resnetblur18d", 11_708_744),
            ("resnext50_32x4d", 25_028_904),
            ("resnext101_32x8d", 88_791_336),
            ("seresnet50", 28_088_024),
            ("seresnext50_32x4d", 27_559_896),
            ("seresnet18", 11_779_624),
            ("resnext50d_32x4d", 25_048_136),
            // fast.ai's module, as the reference trainer builds it, adds 65,537 to resnet50d and 4,097 to resnet18.
            ("resnet50d_sa", 25_576_264 + 256 * 256 + 1),
            ("resnet18_sa", 11_689_512 + 64 * 64 + 1),
            // fast.ai's pools have none.
            ("resnet50d_maxblur", 25_576_264),
            ("resnet50d_maxdown", 25_576_264),
        ] {
            let a: Arch = name.parse().unwrap();
            assert_eq!(a.param_count(1000), want, "{name}");
        }
    }
}
