//! TrivialAugmentWide and RandAugment on uint8 RGB images, pixel for pixel as torchvision 0.28's
//! `transforms.v2` computes them on uint8 tensors (with its defaults: NEAREST interpolation, fill 0).
//!
//! Images are the pipeline's: `width x height` interleaved RGB8 (HWC), changed in place. The 14 ops
//! of torchvision's augmentation space are [`Op`]s holding the parameter that
//! `torchvision.transforms.v2.functional` receives (a shear angle, a factor, a threshold);
//! [`Op::from_magnitude`] maps a policy magnitude to it as `_apply_image_or_video_transform` does,
//! and a [`Policy`] draws the ops from a caller's RNG as `TrivialAugmentWide.forward` and
//! `RandAugment.forward` do, so the loader's per-sample RNG makes augmentation reproducible.
//!
//! Exactness. torchvision does its arithmetic in float32 and truncates back to uint8; the results
//! sit on integer boundaries often enough (factors such as 1.33 make `x * 1.33 + y * -0.33`
//! integral in real numbers) that computing in f64 or rounding would change pixels. So every op
//! here repeats torchvision's float32 operations in its order: `a.mul(r).add_(b, alpha)` is one
//! fused multiply-add (PyTorch's AVX2 and AVX-512 kernels fuse it, its scalar fallback does not),
//! `torch.linspace` steps with fused multiply-adds, the affine grid does not fuse its 3-term
//! matrix product but `grid_sample` fuses its un-normalization, and so on (each function says
//! which). The tests compare every op with torchvision on photos and odd sizes
//! (`tests/suite/autoaugment.rs`; docs/pipeline.md has the findings).

use rand::Rng;

/// The ops of TrivialAugmentWide's and RandAugment's augmentation space, in torchvision's order
/// (the order its uniform op choice indexes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    Identity,
    ShearX,
    ShearY,
    TranslateX,
    TranslateY,
    Rotate,
    Brightness,
    Color,
    Contrast,
    Sharpness,
    Posterize,
    Solarize,
    AutoContrast,
    Equalize,
}

impl OpKind {
    /// All 14, in torchvision's `_AUGMENTATION_SPACE` order.
    pub const ALL: [OpKind; 14] = [
        OpKind::Identity,
        OpKind::ShearX,
        OpKind::ShearY,
        OpKind::TranslateX,
        OpKind::TranslateY,
        OpKind::Rotate,
        OpKind::Brightness,
        OpKind::Color,
        OpKind::Contrast,
        OpKind::Sharpness,
        OpKind::Posterize,
        OpKind::Solarize,
        OpKind::AutoContrast,
        OpKind::Equalize,
    ];

    /// torchvision's name for it (`transform_id`).
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Identity => "Identity",
            OpKind::ShearX => "ShearX",
            OpKind::ShearY => "ShearY",
            OpKind::TranslateX => "TranslateX",
            OpKind::TranslateY => "TranslateY",
            OpKind::Rotate => "Rotate",
            OpKind::Brightness => "Brightness",
            OpKind::Color => "Color",
            OpKind::Contrast => "Contrast",
            OpKind::Sharpness => "Sharpness",
            OpKind::Posterize => "Posterize",
            OpKind::Solarize => "Solarize",
            OpKind::AutoContrast => "AutoContrast",
            OpKind::Equalize => "Equalize",
        }
    }

    /// Whether policies flip the magnitude's sign with probability ½ (torchvision's `signed`).
    pub fn signed(self) -> bool {
        matches!(
            self,
            OpKind::ShearX
                | OpKind::ShearY
                | OpKind::TranslateX
                | OpKind::TranslateY
                | OpKind::Rotate
                | OpKind::Brightness
                | OpKind::Color
                | OpKind::Contrast
                | OpKind::Sharpness
        )
    }
}

/// One op with the parameter `torchvision.transforms.v2.functional` takes for it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op {
    Identity,
    /// `F.affine(shear=[degrees, 0], center=[0, 0])`, about the top-left corner: output pixel
    /// `(x, y)` shows input pixel `(x + tan(degrees) * (y + 1/2), y)` (rounded; black outside).
    ShearX {
        degrees: f64,
    },
    /// `F.affine(shear=[0, degrees], center=[0, 0])`: output pixel `(x, y)` shows input pixel
    /// `(x, y + tan(degrees) * (x + 1/2))`.
    ShearY {
        degrees: f64,
    },
    /// `F.affine(translate=[pixels, 0])`: the image moves right by `pixels`.
    TranslateX {
        pixels: i64,
    },
    /// `F.affine(translate=[0, pixels])`: the image moves down by `pixels`.
    TranslateY {
        pixels: i64,
    },
    /// `F.rotate(angle=degrees)`: counter-clockwise about the image center, same size.
    Rotate {
        degrees: f64,
    },
    /// `F.adjust_brightness`: `x * factor`.
    Brightness {
        factor: f64,
    },
    /// `F.adjust_saturation`: a blend with the image's grayscale.
    Color {
        factor: f64,
    },
    /// `F.adjust_contrast`: a blend with the grayscale's mean.
    Contrast {
        factor: f64,
    },
    /// `F.adjust_sharpness`: a blend with a 3x3 blur, the one-pixel border kept.
    Sharpness {
        factor: f64,
    },
    /// `F.posterize`: keep the top `bits` bits (0..=8).
    Posterize {
        bits: u8,
    },
    /// `F.solarize`: values `>= threshold` (at most 255) are inverted.
    Solarize {
        threshold: f64,
    },
    /// `F.autocontrast`: each channel stretched to 0..=255.
    AutoContrast,
    /// `F.equalize`: each channel's histogram equalized, Pillow's way.
    Equalize,
}

impl Op {
    /// The op TrivialAugmentWide and RandAugment apply for `magnitude` (signed already), as
    /// torchvision's `_apply_image_or_video_transform` maps it: shears take `degrees(atan(m))`,
    /// translations and posterize `int(m)` (towards zero), factors `1 + m`, solarize `255 * m`.
    pub fn from_magnitude(kind: OpKind, magnitude: f64) -> Op {
        match kind {
            OpKind::Identity => Op::Identity,
            OpKind::ShearX => Op::ShearX {
                degrees: magnitude.atan().to_degrees(),
            },
            OpKind::ShearY => Op::ShearY {
                degrees: magnitude.atan().to_degrees(),
            },
            OpKind::TranslateX => Op::TranslateX {
                pixels: magnitude as i64,
            },
            OpKind::TranslateY => Op::TranslateY {
                pixels: magnitude as i64,
            },
            OpKind::Rotate => Op::Rotate { degrees: magnitude },
            OpKind::Brightness => Op::Brightness {
                factor: 1.0 + magnitude,
            },
            OpKind::Color => Op::Color {
                factor: 1.0 + magnitude,
            },
            OpKind::Contrast => Op::Contrast {
                factor: 1.0 + magnitude,
            },
            OpKind::Sharpness => Op::Sharpness {
                factor: 1.0 + magnitude,
            },
            OpKind::Posterize => Op::Posterize {
                bits: magnitude as u8,
            },
            OpKind::Solarize => Op::Solarize {
                threshold: 255.0 * magnitude,
            },
            OpKind::AutoContrast => Op::AutoContrast,
            OpKind::Equalize => Op::Equalize,
        }
    }

    pub fn kind(&self) -> OpKind {
        match self {
            Op::Identity => OpKind::Identity,
            Op::ShearX { .. } => OpKind::ShearX,
            Op::ShearY { .. } => OpKind::ShearY,
            Op::TranslateX { .. } => OpKind::TranslateX,
            Op::TranslateY { .. } => OpKind::TranslateY,
            Op::Rotate { .. } => OpKind::Rotate,
            Op::Brightness { .. } => OpKind::Brightness,
            Op::Color { .. } => OpKind::Color,
            Op::Contrast { .. } => OpKind::Contrast,
            Op::Sharpness { .. } => OpKind::Sharpness,
            Op::Posterize { .. } => OpKind::Posterize,
            Op::Solarize { .. } => OpKind::Solarize,
            Op::AutoContrast => OpKind::AutoContrast,
            Op::Equalize => OpKind::Equalize,
        }
    }

    /// Applies the op in place to the `width x height` RGB8 image `pixels`. `scratch` is a
    /// reusable buffer for the ops that read the original while writing (geometric ops,
    /// sharpness), so a worker allocates nothing per sample.
    ///
    /// # Panics
    /// Where torchvision raises: a negative factor, `bits > 8`, `threshold > 255`; and when
    /// `pixels` is not `width * height * 3` bytes.
    pub fn apply(&self, pixels: &mut [u8], width: usize, height: usize, scratch: &mut Vec<u8>) {
        assert_eq!(
            pixels.len(),
            width * height * 3,
            "image buffer is not {width}x{height} RGB"
        );
        if pixels.is_empty() {
            return;
        }
        let img = Image::new(pixels, width, height);
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU has the features `apply_avx2_fma` is compiled for.
            return unsafe { apply_avx2_fma(self, img, scratch) };
        }
        // AArch64's multiply-add is fused; elsewhere, emulate it.
        if cfg!(target_arch = "aarch64") {
            apply_op::<Fused>(self, img, scratch)
        } else {
            apply_op::<Emulated>(self, img, scratch)
        }
    }
}

/// [`apply_op`] compiled for AVX2 and FMA: `mul_add` is one instruction and the float loops
/// vectorize 8 wide (the default x86-64 target has SSE2 only).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn apply_avx2_fma(op: &Op, img: Image, scratch: &mut Vec<u8>) {
    apply_op::<Fused>(op, img, scratch)
}

/// [`Op::apply`]'s work, inlined (with everything it calls) into the function that picks the
/// instruction set.
#[inline(always)]
fn apply_op<K: MulAdd>(op: &Op, img: Image, scratch: &mut Vec<u8>) {
    match *op {
        Op::Identity => {}
        Op::ShearX { degrees } => {
            let center = [-0.5 * img.width as f64, -0.5 * img.height as f64];
            let m = inverse_affine_matrix(center, 0.0, [0.0, 0.0], [degrees, 0.0]);
            img.warp_nearest::<K>(m, scratch);
        }
        Op::ShearY { degrees } => {
            let center = [-0.5 * img.width as f64, -0.5 * img.height as f64];
            let m = inverse_affine_matrix(center, 0.0, [0.0, 0.0], [0.0, degrees]);
            img.warp_nearest::<K>(m, scratch);
        }
        Op::TranslateX { pixels } => img.translate::<K>(pixels, 0, scratch),
        Op::TranslateY { pixels } => img.translate::<K>(0, pixels, scratch),
        Op::Rotate { degrees } => img.rotate::<K>(degrees, scratch),
        Op::Brightness { factor } => {
            check_factor("brightness", factor);
            let f = factor as f32;
            img.map(|x| to_u8(x as f32 * f));
        }
        Op::Color { factor } => {
            check_factor("saturation", factor);
            img.saturation::<K>(factor);
        }
        Op::Contrast { factor } => {
            check_factor("contrast", factor);
            img.contrast::<K>(factor);
        }
        Op::Sharpness { factor } => {
            check_factor("sharpness", factor);
            img.sharpness::<K>(factor, scratch);
        }
        Op::Posterize { bits } => {
            assert!(bits <= 8, "posterize bits must be in 0..=8, got {bits}");
            // `image & mask` with the top `bits` bits set.
            let mask = (0xFF00u16 >> bits) as u8;
            img.pixels.iter_mut().for_each(|x| *x &= mask);
        }
        Op::Solarize { threshold } => {
            assert!(
                threshold <= 255.0,
                "solarize threshold must be at most 255, got {threshold}"
            );
            // `image >= threshold` promotes both sides to float32.
            let t = threshold as f32;
            img.map(|x| if x as f32 >= t { !x } else { x });
        }
        Op::AutoContrast => img.autocontrast(),
        Op::Equalize => img.equalize(),
    }
}

fn check_factor(what: &str, factor: f64) {
    assert!(
        factor >= 0.0,
        "{what} factor must be non-negative, got {factor}"
    );
}

/// One op as a policy drew it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Draw {
    pub kind: OpKind,
    /// The magnitude bin, for ops that have magnitudes.
    pub bin: Option<usize>,
    /// The table's value at `bin` with the drawn sign (`-0.0` is negative); 0 without a bin.
    pub magnitude: f64,
}

impl Draw {
    pub fn op(&self) -> Op {
        Op::from_magnitude(self.kind, self.magnitude)
    }
}

/// An augmentation policy: how many ops, which, and with what magnitude.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Policy {
    /// `TrivialAugmentWide(num_magnitude_bins)`: one op, uniform over the 14; a magnitude bin
    /// uniform over `num_magnitude_bins` (drawn only for ops that have magnitudes); a random
    /// sign for the signed ones.
    TrivialAugmentWide { num_magnitude_bins: usize },
    /// `RandAugment(num_ops, magnitude, num_magnitude_bins)`: `num_ops` ops one after the
    /// other, each uniform over the 14, all at bin `magnitude`, with a random sign for the signed
    /// ones.
    RandAugment {
        num_ops: usize,
        magnitude: usize,
        num_magnitude_bins: usize,
    },
}

impl Policy {
    /// torchvision's `TrivialAugmentWide()` (31 bins); `--auto-augment ta_wide`.
    pub fn trivial_augment_wide() -> Policy {
        Policy::TrivialAugmentWide {
            num_magnitude_bins: 31,
        }
    }

    /// torchvision's `RandAugment(magnitude=magnitude)` (2 ops, 31 bins; the default magnitude
    /// and `--ra-magnitude`'s is 9); `--auto-augment ra`.
    pub fn rand_augment(magnitude: usize) -> Policy {
        Policy::RandAugment {
            num_ops: 2,
            magnitude,
            num_magnitude_bins: 31,
        }
    }

    /// Rejects what would index outside the magnitude tables (or divide by zero in them).
    pub fn validate(&self) -> anyhow::Result<()> {
        let bins = self.num_magnitude_bins();
        anyhow::ensure!(
            bins >= 2,
            "num_magnitude_bins must be at least 2, got {bins}"
        );
        if let Policy::RandAugment { magnitude, .. } = *self {
            anyhow::ensure!(
                magnitude < bins,
                "RandAugment magnitude must be below num_magnitude_bins ({bins}), got {magnitude}"
            );
        }
        Ok(())
    }

    pub fn num_magnitude_bins(&self) -> usize {
        match *self {
            Policy::TrivialAugmentWide { num_magnitude_bins }
            | Policy::RandAugment {
                num_magnitude_bins, ..
            } => num_magnitude_bins,
        }
    }

    /// The unsigned magnitude of `kind` at `bin` for a `width x height` image, as the float32
    /// value torchvision's magnitude table holds (`None` for ops without magnitudes). The tables
    /// are `torch.linspace(0, max, bins)` (Solarize: from 1 down to 0) and, for Posterize,
    /// `(8 - arange(bins) / ((bins - 1) / d)).round().int()`; `max` and `d` differ between the
    /// policies, and RandAugment's translations scale with the image (`150 / 331 * width`).
    pub fn magnitude(&self, kind: OpKind, bin: usize, width: usize, height: usize) -> Option<f64> {
        let bins = self.num_magnitude_bins();
        let ta = matches!(self, Policy::TrivialAugmentWide { .. });
        let up_to = |max: f64| Some(linspace(0.0, max, bins, bin) as f64);
        match kind {
            OpKind::Identity | OpKind::AutoContrast | OpKind::Equalize => None,
            OpKind::ShearX | OpKind::ShearY => up_to(if ta { 0.99 } else { 0.3 }),
            OpKind::TranslateX if ta => up_to(32.0),
            OpKind::TranslateY if ta => up_to(32.0),
            OpKind::TranslateX => up_to(150.0 / 331.0 * width as f64),
            OpKind::TranslateY => up_to(150.0 / 331.0 * height as f64),
            OpKind::Rotate => up_to(if ta { 135.0 } else { 30.0 }),
            OpKind::Brightness | OpKind::Color | OpKind::Contrast | OpKind::Sharpness => {
                up_to(if ta { 0.99 } else { 0.9 })
            }
            OpKind::Posterize => {
                // int64 arange / Python float: a float32 division, then `8 - ` and round (half to
                // even) in float32.
                let d = ((bins - 1) as f64 / if ta { 6.0 } else { 4.0 }) as f32;
                Some((8.0 - bin as f32 / d).round_ties_even() as i32 as f64)
            }
            OpKind::Solarize => Some(linspace(1.0, 0.0, bins, bin) as f64),
        }
    }

    /// Draws the ops for one `width x height` image into `draws` (cleared first), making the
    /// same draws in the same order as torchvision: per op, the op index, then (if it has
    /// magnitudes, TrivialAugmentWide only) the bin, then (if signed) the sign, negative when a
    /// uniform [0, 1) float32 is `<= 0.5`.
    pub fn draw<R: Rng + ?Sized>(
        &self,
        width: usize,
        height: usize,
        rng: &mut R,
        draws: &mut Vec<Draw>,
    ) {
        draws.clear();
        let (count, fixed_bin) = match *self {
            Policy::TrivialAugmentWide { .. } => (1, None),
            Policy::RandAugment {
                num_ops, magnitude, ..
            } => (num_ops, Some(magnitude)),
        };
        for _ in 0..count {
            let kind = OpKind::ALL[rng.random_range(0..OpKind::ALL.len())];
            let (mut bin, mut magnitude) = (None, 0.0);
            // The table exists for every bin or none.
            if self.magnitude(kind, 0, width, height).is_some() {
                let b = fixed_bin.unwrap_or_else(|| rng.random_range(0..self.num_magnitude_bins()));
                magnitude = self.magnitude(kind, b, width, height).expect("has a table");
                if kind.signed() && rng.random::<f32>() <= 0.5 {
                    magnitude = -magnitude;
                }
                bin = Some(b);
            }
            draws.push(Draw {
                kind,
                bin,
                magnitude,
            });
        }
    }
}

/// A policy with its buffers: the deterministic per-sample entry point.
#[derive(Clone, Debug)]
pub struct AutoAugment {
    policy: Policy,
    draws: Vec<Draw>,
    scratch: Vec<u8>,
}

impl AutoAugment {
    /// # Panics
    /// When the policy is invalid (see [`Policy::validate`]).
    pub fn new(policy: Policy) -> AutoAugment {
        if let Err(e) = policy.validate() {
            panic!("{e}");
        }
        AutoAugment {
            policy,
            draws: Vec::new(),
            scratch: Vec::new(),
        }
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Draws the policy's ops from `rng` and applies them in place to the `width x height` RGB8
    /// image; returns what it drew. With the sample's own RNG (after its crop and flip draws,
    /// where torchvision's transform order puts this), the result depends on (seed, epoch,
    /// index) only.
    pub fn apply<R: Rng + ?Sized>(
        &mut self,
        pixels: &mut [u8],
        width: usize,
        height: usize,
        rng: &mut R,
    ) -> &[Draw] {
        self.policy.draw(width, height, rng, &mut self.draws);
        for d in &self.draws {
            d.op().apply(pixels, width, height, &mut self.scratch);
        }
        &self.draws
    }
}

/// How the ops compute `a * b + c` rounded once to f32, the fused multiply-add PyTorch's AVX2 and
/// AVX-512 kernels use (its scalar fallback does not fuse).
trait MulAdd {
    fn fma(a: f32, b: f32, c: f32) -> f32;
}

/// `f32::mul_add`: one instruction in code compiled for FMA (a libm call elsewhere).
struct Fused;

impl MulAdd for Fused {
    #[inline(always)]
    fn fma(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }
}

/// Without an FMA instruction: the product of two f32 is exact in f64, so the f64 sum is the
/// exact result rounded once; rounding that to f32 is the fused result unless it sits exactly
/// halfway between two f32 (its low 29 bits `1000...`), where the first rounding may have made
/// the tie: then libm decides (musl's `fmaf` makes the same test).
struct Emulated;

impl MulAdd for Emulated {
    #[inline(always)]
    fn fma(a: f32, b: f32, c: f32) -> f32 {
        let s = a as f64 * b as f64 + c as f64;
        if s.to_bits() & 0x1FFF_FFFF == 0x1000_0000 {
            a.mul_add(b, c)
        } else {
            s as f32
        }
    }
}

/// `rint` (round half to even) for `|v| < 2^22`: adding 1.5 * 2^23 leaves no fraction bits, so
/// the float32 addition rounds, to even; subtracting it back is exact. Calling `round_ties_even`
/// instead costs a libm call per value on the default x86-64 target (no SSE4.1).
#[inline(always)]
fn round_half_even(v: f32) -> f32 {
    const SHIFT: f32 = 12_582_912.0;
    (v + SHIFT) - SHIFT
}

/// `.clamp_(0, 255).to(torch.uint8)`: the conversion truncates towards zero.
#[inline(always)]
fn to_u8(v: f32) -> u8 {
    v.clamp(0.0, 255.0) as u8
}

/// Element `i` of `torch.linspace(start, end, steps)` in float32, as PyTorch's CPU kernel
/// computes it: `start + step * i` in the first half and `end - step * (steps - 1 - i)` in the
/// second, both fused.
fn linspace(start: f64, end: f64, steps: usize, i: usize) -> f32 {
    let (start, end) = (start as f32, end as f32);
    if steps == 1 {
        return start;
    }
    let step = (end - start) / (steps - 1) as f32;
    if i < steps / 2 {
        Emulated::fma(step, i as f32, start)
    } else {
        Emulated::fma(-step, (steps - 1 - i) as f32, end)
    }
}

/// Python's `x % y` for floats: the result takes the sign of `y` (and `-1e-20 % 360` is 360).
fn py_mod(x: f64, y: f64) -> f64 {
    let m = x % y;
    if m == 0.0 {
        0.0f64.copysign(y)
    } else if (m < 0.0) != (y < 0.0) {
        m + y
    } else {
        m
    }
}

/// torchvision's `_get_inverse_affine_matrix(center, angle, translate, scale=1, shear)`, operation
/// for operation in f64 (as Python computes it): the output-to-input map, with `center` relative
/// to the image center.
fn inverse_affine_matrix(
    center: [f64; 2],
    angle: f64,
    translate: [f64; 2],
    shear: [f64; 2],
) -> [f64; 6] {
    let rot = angle.to_radians();
    let sx = shear[0].to_radians();
    let sy = shear[1].to_radians();
    let [cx, cy] = center;
    let [tx, ty] = translate;
    let cos_sy = sy.cos();
    let tan_sx = sx.tan();
    let rot_minus_sy = rot - sy;
    let cx_plus_tx = cx + tx;
    let cy_plus_ty = cy + ty;
    let a = rot_minus_sy.cos() / cos_sy;
    let b = -(a * tan_sx + rot.sin());
    let c = rot_minus_sy.sin() / cos_sy;
    let d = rot.cos() - c * tan_sx;
    let mut m = [d, -b, 0.0, -c, a, 0.0];
    m[2] += cx - m[0] * cx_plus_tx - m[1] * cy_plus_ty;
    m[5] += cy - m[3] * cx_plus_tx - m[4] * cy_plus_ty;
    m
}

/// Grayscale as `_rgb_to_grayscale_image(preserve_dtype=False).floor_()`:
/// `r.mul(0.2989).add_(g, alpha=0.587).add_(b, alpha=0.114)` in float32, the adds fused, floored
/// (truncated: it is not negative).
#[inline(always)]
fn gray<K: MulAdd>(p: &[u8]) -> f32 {
    const R: f32 = 0.2989f64 as f32;
    const G: f32 = 0.587f64 as f32;
    const B: f32 = 0.114f64 as f32;
    let l = p[0] as f32 * R;
    let l = K::fma(p[1] as f32, G, l);
    K::fma(p[2] as f32, B, l) as u32 as f32
}

/// A borrowed image for the ops.
struct Image<'a> {
    width: usize,
    height: usize,
    pixels: &'a mut [u8],
}

impl Image<'_> {
    fn new(pixels: &mut [u8], width: usize, height: usize) -> Image<'_> {
        Image {
            width,
            height,
            pixels,
        }
    }

    /// Ops where each output value depends only on its input value: a 256-entry table.
    #[inline(always)]
    fn map(self, f: impl Fn(u8) -> u8) {
        let lut: [u8; 256] = std::array::from_fn(|x| f(x as u8));
        for v in self.pixels.iter_mut() {
            *v = lut[*v as usize];
        }
    }

    /// `_blend(image, gray, factor)`: `image.mul(factor).add_(gray, alpha=1 - factor)` in
    /// float32, clamped, truncated.
    #[inline(always)]
    fn saturation<K: MulAdd>(self, factor: f64) {
        let (ratio, alpha) = (factor as f32, (1.0 - factor) as f32);
        for p in self.pixels.chunks_exact_mut(3) {
            let l = gray::<K>(p);
            for v in p {
                *v = to_u8(K::fma(l, alpha, *v as f32 * ratio));
            }
        }
    }

    /// `_blend(image, mean(gray), factor)`. The mean is `sum(gray) / (h * w)` in float32; the sum
    /// of the (integral) gray values is exact here, and in torch while it stays below 2^24, i.e.
    /// for images up to 65,793 pixels (256x256). Above that, torch's float32 sum rounds in an
    /// order that depends on its vector width and thread count, and so does its output.
    #[inline(always)]
    fn contrast<K: MulAdd>(self, factor: f64) {
        let sum: u64 = self
            .pixels
            .chunks_exact(3)
            .map(|p| gray::<K>(p) as u64)
            .sum();
        let n = (self.width * self.height) as f32;
        let mean = sum as f32 / n;
        let (ratio, alpha) = (factor as f32, (1.0 - factor) as f32);
        self.map(|x| to_u8(K::fma(mean, alpha, x as f32 * ratio)));
    }

    /// `adjust_sharpness_image`: the blur is the 3x3 kernel (1 1 1 / 1 5 1 / 1 1 1) / 13 rounded
    /// to nearest, which float32 convolution gets exactly right (a sum over 13 is never within
    /// 1/26 of a half), blended as `x + (1 - factor) * (blur - x)` (fused) in the interior; the
    /// border and images of 2 or fewer rows or columns are left as they are.
    #[inline(always)]
    fn sharpness<K: MulAdd>(self, factor: f64, scratch: &mut Vec<u8>) {
        let (w, h) = (self.width, self.height);
        if w <= 2 || h <= 2 {
            return;
        }
        let alpha = (1.0 - factor) as f32;
        let (row, len) = (w * 3, self.pixels.len());
        // The original, then room for one row's blur (computed apart, which vectorizes).
        scratch.clear();
        scratch.extend_from_slice(self.pixels);
        scratch.resize(len + row, 0);
        let (src, blur) = scratch.split_at_mut(len);
        let n = row - 6; // a row's interior values
        for y in 1..h - 1 {
            let (up, mid, down) = (
                &src[(y - 1) * row..y * row],
                &src[y * row..(y + 1) * row],
                &src[(y + 1) * row..(y + 2) * row],
            );
            for (k, b) in blur[..n].iter_mut().enumerate() {
                let column = |r: &[u8]| r[k] as u16 + r[k + 3] as u16 + r[k + 6] as u16;
                let s = column(up) + column(mid) + column(down) + 4 * mid[k + 3] as u16;
                *b = ((s + 6) / 13) as u8;
            }
            let out = &mut self.pixels[y * row + 3..(y + 1) * row - 3];
            for ((o, &b), &x) in out.iter_mut().zip(&blur[..n]).zip(&mid[3..row - 3]) {
                let x = x as f32;
                *o = to_u8(K::fma(b as f32 - x, alpha, x));
            }
        }
    }

    /// `autocontrast_image`: per channel, `(x - min) / ((max - min) * (1 / 255))` in float32,
    /// clamped and truncated; a constant channel is left as it is.
    #[inline(always)]
    fn autocontrast(self) {
        // Per channel minimum and maximum, 16 pixels a step (which vectorizes).
        let (mut lo, mut hi) = ([255u8; 48], [0u8; 48]);
        let mut blocks = self.pixels.chunks_exact(48);
        for b in &mut blocks {
            for i in 0..48 {
                lo[i] = lo[i].min(b[i]);
                hi[i] = hi[i].max(b[i]);
            }
        }
        for (i, &v) in blocks.remainder().iter().enumerate() {
            lo[i] = lo[i].min(v);
            hi[i] = hi[i].max(v);
        }
        let lo: [u8; 3] = std::array::from_fn(|c| (c..48).step_by(3).map(|i| lo[i]).min().unwrap());
        let hi: [u8; 3] = std::array::from_fn(|c| (c..48).step_by(3).map(|i| hi[i]).max().unwrap());
        let luts: [[u8; 256]; 3] = std::array::from_fn(|c| {
            let (min, inv_scale) = if lo[c] == hi[c] {
                (0.0, 1.0)
            } else {
                let (lo, hi) = (lo[c] as f32, hi[c] as f32);
                (lo, (hi - lo) * (1.0f64 / 255.0) as f32)
            };
            std::array::from_fn(|x| to_u8((x as f32 - min) / inv_scale))
        });
        apply_luts(self.pixels, &luts);
    }

    /// `equalize_image` (Pillow's `ImageOps.equalize`): per channel, with `step` = (pixels not at
    /// the channel's largest value) / 255, `lut[v] = (cum_hist[v - 1] + step / 2) / step`
    /// (integers, at most 255, `lut[0] = 0`); a channel with `step == 0` is left as it is.
    #[inline(always)]
    fn equalize(self) {
        let mut hist = [[0u64; 256]; 3];
        for p in self.pixels.chunks_exact(3) {
            for c in 0..3 {
                hist[c][p[c] as usize] += 1;
            }
        }
        let n = (self.width * self.height) as u64;
        let luts: [[u8; 256]; 3] = std::array::from_fn(|c| {
            let hist = &hist[c];
            let top = hist.iter().rposition(|&k| k > 0).expect("not empty");
            let mut lut: [u8; 256] = std::array::from_fn(|x| x as u8);
            if let Some(step) = std::num::NonZeroU64::new((n - hist[top]) / 255) {
                let mut cum = 0;
                for v in 1..256 {
                    cum += hist[v - 1];
                    lut[v] = ((cum + step.get() / 2) / step).min(255) as u8;
                }
                lut[0] = 0;
            }
            lut
        });
        apply_luts(self.pixels, &luts);
    }

    /// `rotate_image(angle)` without `expand`: the angle taken modulo 360 as Python does, the
    /// exact transposes torch uses for 0 and 180 degrees (and 90 and 270 on square images), an
    /// affine warp otherwise.
    #[inline(always)]
    fn rotate<K: MulAdd>(self, degrees: f64, scratch: &mut Vec<u8>) {
        let angle = py_mod(degrees, 360.0);
        let (w, h) = (self.width, self.height);
        let quarter_turns = if angle == 0.0 {
            return;
        } else if angle == 180.0 {
            2
        } else if angle == 90.0 && w == h {
            1
        } else if angle == 270.0 && w == h {
            3
        } else {
            let m = inverse_affine_matrix([0.0; 2], -angle, [0.0; 2], [0.0; 2]);
            return self.warp_nearest::<K>(m, scratch);
        };
        scratch.clear();
        scratch.extend_from_slice(self.pixels);
        // `torch.rot90(k)`: output (y, x) reads input (x, w-1-y) for k = 1, (h-1-y, w-1-x) for
        // k = 2, (h-1-x, y) for k = 3 (rows, columns; k = 1 and 3 only when w == h).
        for y in 0..h {
            for x in 0..w {
                let (sy, sx) = match quarter_turns {
                    1 => (x, w - 1 - y),
                    2 => (h - 1 - y, w - 1 - x),
                    _ => (h - 1 - x, y),
                };
                let (d, s) = ((y * w + x) * 3, (sy * w + sx) * 3);
                self.pixels[d..d + 3].copy_from_slice(&scratch[s..s + 3]);
            }
        }
    }

    /// `affine_image(translate=[dx, dy])` with NEAREST and fill 0: a shift by whole pixels. The
    /// warp below computes each source coordinate as `x - dx` plus float32 rounding errors of a
    /// few ulps of the image size (about 10^-3 up to 4096 pixels a side), far from the half pixel
    /// where its rounding would change, so copying rows gives the same pixels, 50x faster. Larger
    /// images take the warp.
    #[inline(always)]
    fn translate<K: MulAdd>(self, dx: i64, dy: i64, scratch: &mut Vec<u8>) {
        if self.width.max(self.height) > 4096 {
            let m = inverse_affine_matrix([0.0; 2], 0.0, [dx as f64, dy as f64], [0.0; 2]);
            return self.warp_nearest::<K>(m, scratch);
        }
        let (w, h) = (self.width as i64, self.height as i64);
        scratch.clear();
        scratch.extend_from_slice(self.pixels);
        // Output columns `x0..x1` read input columns `x0 - dx..x1 - dx`.
        let (x0, x1) = (dx.clamp(0, w), (w + dx).clamp(0, w));
        for (y, row) in self.pixels.chunks_exact_mut(w as usize * 3).enumerate() {
            let sy = y as i64 - dy;
            if !(0..h).contains(&sy) || x0 == x1 {
                row.fill(0);
                continue;
            }
            let src = &scratch[(sy * w * 3) as usize..][..(w * 3) as usize];
            let (a, b) = (x0 as usize * 3, x1 as usize * 3);
            row[..a].fill(0);
            row[a..b]
                .copy_from_slice(&src[(a as i64 - dx * 3) as usize..(b as i64 - dx * 3) as usize]);
            row[b..].fill(0);
        }
    }

    /// `affine_image` / `rotate_image` with NEAREST and fill 0: `_affine_grid` then `grid_sample`
    /// (`align_corners=False`, zero padding), in their float32 arithmetic. `m` is the inverse
    /// matrix in pixels about the image center. The grid is
    /// `[x, y, 1] @ (theta / [w/2, h/2])` with `x, y` the output pixel's offset from the center
    /// (a `linspace` with step 1: exact half-integers); its three products are summed left to
    /// right, unfused. `grid_sample` maps a grid value `g` to the input column
    /// `(g + 1) * (w / 2) - 0.5` (fused), rounds half to even, and reads zero outside.
    #[inline(always)]
    fn warp_nearest<K: MulAdd>(self, m: [f64; 6], scratch: &mut Vec<u8>) {
        let (w, h) = (self.width, self.height);
        // Beyond 2^22, `round_half_even` would not round and the offsets not be exact; pixel
        // indices are i32.
        assert!(
            w < 1 << 22 && h < 1 << 22 && w * h < 1 << 31,
            "{w}x{h} image too large to warp"
        );
        scratch.clear();
        scratch.extend_from_slice(self.pixels);
        let theta = m.map(|v| v as f32);
        let (half_w, half_h) = ((0.5 * w as f64) as f32, (0.5 * h as f64) as f32);
        let t = [
            theta[0] / half_w,
            theta[1] / half_w,
            theta[2] / half_w,
            theta[3] / half_h,
            theta[4] / half_h,
            theta[5] / half_h,
        ];
        let (scale_x, scale_y) = (w as f32 / 2.0, h as f32 / 2.0);
        let (max_x, max_y) = ((w - 1) as f32, (h - 1) as f32);
        let (x0, y0) = ((1.0 - w as f32) * 0.5, (1.0 - h as f32) * 0.5);
        // The rounded coordinate, or -1 outside. Clamped first, so that the rounding trick holds.
        let round = |v: f32, max: f32| {
            let r = round_half_even(v.clamp(-2.0, max + 2.0));
            if (0.0..=max).contains(&r) {
                r as i32
            } else {
                -1
            }
        };
        // Source pixels for a run of output pixels, computed apart (which vectorizes).
        const RUN: usize = 64;
        let mut source = [0i32; RUN];
        for y in 0..h {
            let by = y0 + y as f32;
            let (ty0, ty1) = (by * t[1], by * t[4]);
            let row = &mut self.pixels[y * w * 3..(y + 1) * w * 3];
            for (r, out) in row.chunks_mut(RUN * 3).enumerate() {
                for (k, s) in source.iter_mut().enumerate() {
                    let bx = x0 + (r * RUN + k) as f32;
                    let gx = (bx * t[0] + ty0) + t[2];
                    let gy = (bx * t[3] + ty1) + t[5];
                    let ix = round(K::fma(gx + 1.0, scale_x, -0.5), max_x);
                    let iy = round(K::fma(gy + 1.0, scale_y, -0.5), max_y);
                    *s = if ix < 0 || iy < 0 {
                        -1
                    } else {
                        iy * w as i32 + ix
                    };
                }
                for (px, &s) in out.chunks_exact_mut(3).zip(&source) {
                    if s < 0 {
                        px.fill(0);
                    } else {
                        px.copy_from_slice(&scratch[s as usize * 3..s as usize * 3 + 3]);
                    }
                }
            }
        }
    }
}

#[inline(always)]
fn apply_luts(pixels: &mut [u8], luts: &[[u8; 256]; 3]) {
    for p in pixels.chunks_exact_mut(3) {
        for c in 0..3 {
            p[c] = luts[c][p[c] as usize];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_float_modulo() {
        assert_eq!(py_mod(-30.0, 360.0), 330.0);
        assert_eq!(py_mod(370.0, 360.0), 10.0);
        assert_eq!(py_mod(-0.0, 360.0).to_bits(), 0.0f64.to_bits());
        assert_eq!(py_mod(-1e-20, 360.0), 360.0);
        assert_eq!(py_mod(-360.0, 360.0), 0.0);
    }

    #[test]
    fn fma_rounds_once() {
        use rand::SeedableRng;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let value = |rng: &mut rand_chacha::ChaCha8Rng| {
            let e = rng.random_range(-40..10);
            let v = rng.random_range(1.0f32..2.0) * 2f32.powi(e);
            if rng.random() {
                v
            } else {
                -v
            }
        };
        for _ in 0..1_000_000 {
            let (a, b, c) = (value(&mut rng), value(&mut rng), value(&mut rng));
            assert_eq!(
                Emulated::fma(a, b, c).to_bits(),
                a.mul_add(b, c).to_bits(),
                "{a} {b} {c}"
            );
        }
        // a * b = 2^-24 - 2^-70: the f64 sum rounds up onto the halfway point above c, from
        // where rounding to f32 would go to the even neighbour, 2^-23 too high.
        let a = (2f64.powi(23) + 1.0) as f32 * 2f32.powi(-47);
        let b = (2f64.powi(24) - 2.0) as f32 * 2f32.powi(-24);
        let c = 1.0 + 2f32.powi(-23);
        assert_eq!(
            (a as f64 * b as f64 + c as f64) as f32,
            1.0 + 2f32.powi(-22)
        );
        assert_eq!(Emulated::fma(a, b, c), c);
    }

    /// The torchvision comparison (tests/suite/autoaugment.rs) runs the path this CPU picks (AVX2 and
    /// FMA here); this pins the emulated multiply-add to the fused one on every op.
    #[test]
    fn emulated_and_fused_multiply_adds_agree_on_every_op() {
        use rand::SeedableRng;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
        let policy = Policy::trivial_augment_wide();
        let mut scratch = Vec::new();
        for (w, h) in [(1, 1), (5, 3), (64, 48), (97, 131)] {
            let noise: Vec<u8> = (0..w * h * 3).map(|_| rng.random()).collect();
            let ramp: Vec<u8> = (0..w * h * 3).map(|i| (i * 7 / 3 % 256) as u8).collect();
            for img in [noise, ramp] {
                for kind in OpKind::ALL {
                    for bin in 0..31 {
                        for sign in [1.0, -1.0] {
                            let m = policy.magnitude(kind, bin, w, h).unwrap_or(0.0);
                            let op = Op::from_magnitude(kind, sign * m);
                            let mut out = [img.clone(), img.clone()];
                            let [a, b] = &mut out;
                            apply_op::<Emulated>(&op, Image::new(a, w, h), &mut scratch);
                            apply_op::<Fused>(&op, Image::new(b, w, h), &mut scratch);
                            assert!(a == b, "{op:?} on {w}x{h}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn linspace_ends_are_exact() {
        for steps in [2, 3, 10, 31, 100] {
            assert_eq!(linspace(0.0, 0.99, steps, 0), 0.0);
            assert_eq!(linspace(0.0, 0.99, steps, steps - 1), 0.99f32);
            assert_eq!(linspace(1.0, 0.0, steps, steps - 1), 0.0);
        }
        assert_eq!(linspace(-2.0, 2.0, 5, 3), 1.0);
    }

    /// A 1x1 image (RandomResizedCrop of a tiny photo can make one) goes through every op, at
    /// small, middle and largest magnitudes and both signs, without a panic and with the result
    /// torchvision gives (tests/suite/autoaugment.rs compares a 1x1 image with torchvision itself; this
    /// needs no Python):
    /// - rotations and shears (under 45 degrees) turn about a point of the one pixel: it stays;
    ///   translations by a whole pixel or more move it out: black;
    /// - sharpness needs neighbours, autocontrast and equalize a spread of values: it stays;
    /// - the colour ops depend only on the pixel and the image's mean: the same as for a 4x4
    ///   image of that one colour. Each of them, and the translations, changes the pixel at some
    ///   magnitude (checked at the end), so these are not comparisons of two no-ops.
    #[test]
    fn one_pixel_images_survive_every_op() {
        const PIXEL: [u8; 3] = [10, 200, 77];
        let policy = Policy::trivial_augment_wide();
        let mut scratch = Vec::new();
        let mut changed = Vec::new();
        for kind in OpKind::ALL {
            let signs: &[f64] = if kind.signed() { &[1.0, -1.0] } else { &[1.0] };
            for bin in [0, 15, 30] {
                for &sign in signs {
                    let m = policy.magnitude(kind, bin, 1, 1).unwrap_or(0.0);
                    let op = Op::from_magnitude(kind, sign * m);
                    let mut px = PIXEL;
                    op.apply(&mut px, 1, 1, &mut scratch);
                    let expected = match op {
                        Op::TranslateX { pixels } | Op::TranslateY { pixels } if pixels != 0 => {
                            [0; 3]
                        }
                        Op::Identity
                        | Op::ShearX { .. }
                        | Op::ShearY { .. }
                        | Op::TranslateX { .. }
                        | Op::TranslateY { .. }
                        | Op::Rotate { .. }
                        | Op::Sharpness { .. }
                        | Op::AutoContrast
                        | Op::Equalize => PIXEL,
                        Op::Brightness { .. }
                        | Op::Color { .. }
                        | Op::Contrast { .. }
                        | Op::Posterize { .. }
                        | Op::Solarize { .. } => {
                            let mut flat = PIXEL.repeat(16);
                            op.apply(&mut flat, 4, 4, &mut scratch);
                            assert!(
                                flat.chunks_exact(3).all(|p| p == &flat[..3]),
                                "{op:?} on a one-colour 4x4 image: {flat:?}"
                            );
                            [flat[0], flat[1], flat[2]]
                        }
                    };
                    assert_eq!(px, expected, "{op:?} on {PIXEL:?}");
                    if px != PIXEL {
                        changed.push(kind);
                    }
                }
            }
        }
        for kind in [
            OpKind::TranslateX,
            OpKind::TranslateY,
            OpKind::Brightness,
            OpKind::Color,
            OpKind::Contrast,
            OpKind::Posterize,
            OpKind::Solarize,
        ] {
            assert!(changed.contains(&kind), "{kind:?} never changed the pixel");
        }
    }
}
