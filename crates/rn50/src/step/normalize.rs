//! Input normalisation on the device: hosts ship uint8 NHWC (4x fewer bytes than fp32), the device turns
//! it into the normalised float NCHW batch the network wants, in a buffer reused from step to step.
use tch::{Device, Kind, Tensor};

pub const IMAGENET_MEAN: [f64; 3] = [0.485, 0.456, 0.406];
pub const IMAGENET_STD: [f64; 3] = [0.229, 0.224, 0.225];

pub struct Normalizer {
    /// 1/(255·std) and -mean/std per channel, shaped [1, 3, 1, 1].
    scale: Tensor,
    shift: Tensor,
    channels_last: bool,
    buf: Option<Tensor>,
}

impl Normalizer {
    pub fn new(device: Device, channels_last: bool) -> Self {
        Self::with_stats(device, channels_last, IMAGENET_MEAN, IMAGENET_STD)
    }

    pub fn with_stats(device: Device, channels_last: bool, mean: [f64; 3], std: [f64; 3]) -> Self {
        let v = |f: &dyn Fn(usize) -> f64| {
            Tensor::from_slice(&[f(0) as f32, f(1) as f32, f(2) as f32])
                .view([1, 3, 1, 1])
                .to_device(device)
        };
        Self {
            scale: v(&|c| 1.0 / (255.0 * std[c])),
            shift: v(&|c| -mean[c] / std[c]),
            channels_last,
            buf: None,
        }
    }

    /// The per-channel scale and shift, as handles.
    pub(crate) fn constants(&self) -> Vec<Tensor> {
        vec![self.scale.shallow_clone(), self.shift.shallow_clone()]
    }

    /// Normalises a uint8 `[N, H, W, 3]` batch already on the device. The result is NCHW-shaped, NHWC in
    /// memory when channels_last (the NHWC input then needs no transpose at all), and valid until the next call.
    pub fn normalize(&mut self, images: &Tensor) -> Tensor {
        let nchw = images.permute([0, 3, 1, 2]);
        let size = nchw.size();
        let reuse = self
            .buf
            .as_ref()
            .is_some_and(|b| b.size() == size && b.device() == images.device());
        if !reuse {
            let b = Tensor::empty(
                [size[0], size[2], size[3], size[1]],
                (Kind::Float, images.device()),
            );
            let b = b.permute([0, 3, 1, 2]);
            self.buf = Some(if self.channels_last {
                b
            } else {
                b.contiguous()
            });
        }
        let buf = self.buf.as_mut().expect("buffer allocated above");
        // Two passes over the batch: the uint8 → float copy, then shift + x · scale in place in one kernel (not a
        // multiply and then an add). One `addcmul` straight from the uint8 batch would be one pass, but libtorch's
        // CPU kernels take a slow mixed-type path for it (about twice the time of these two passes: 57–62 ms against
        // 26–34 ms for a batch of 64 at 224 px on 2 busy cores, PyTorch 2.13).
        tch::no_grad(|| {
            buf.copy_(&nchw);
            let x = buf.shallow_clone();
            let _ = self.shift.addcmul_out(buf, &x, &self.scale);
        });
        buf.shallow_clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::memory_format::is_channels_last;

    #[test]
    fn matches_to_tensor_then_normalize() {
        for cl in [false, true] {
            let mut n = Normalizer::new(Device::Cpu, cl);
            // The second batch goes into the first one's buffer.
            for _ in 0..2 {
                let img = Tensor::randint(256, [2, 5, 7, 3], (Kind::Uint8, Device::Cpu));
                let got = n.normalize(&img);
                assert_eq!(is_channels_last(&got), cl);
                assert_eq!(got.kind(), Kind::Float);
                check(&img, &got);
            }
        }
    }

    /// `got` is torchvision's ToTensor + Normalize of `img`.
    fn check(img: &Tensor, got: &Tensor) {
        let mean = Tensor::from_slice(&IMAGENET_MEAN)
            .view([1, 3, 1, 1])
            .to_kind(Kind::Float);
        let std = Tensor::from_slice(&IMAGENET_STD)
            .view([1, 3, 1, 1])
            .to_kind(Kind::Float);
        let want = (img.permute([0, 3, 1, 2]).to_kind(Kind::Float) / 255.0 - mean) / std;
        let err = f64::try_from((got - want).abs().max()).unwrap();
        assert!(err < 1e-5, "max error {err}");
    }
}
