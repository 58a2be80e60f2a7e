//! channels_last for tch, which has no memory-format API: a 4-D NCHW tensor whose memory is NHWC.
use tch::Tensor;

/// A copy of `t` with NHWC memory and NCHW shape (`t.contiguous(memory_format=torch.channels_last)`).
pub fn channels_last(t: &Tensor) -> Tensor {
    t.permute([0, 2, 3, 1]).contiguous().permute([0, 3, 1, 2])
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
    use tch::{Device, Kind};

    #[test]
    fn restride_keeps_values_and_changes_layout() {
        let x = Tensor::randn([2, 3, 4, 5], (Kind::Float, Device::Cpu));
        let y = channels_last(&x);
        assert!(is_channels_last(&y));
        assert!(!is_channels_last(&x));
        assert_eq!(x, y);
    }
}
