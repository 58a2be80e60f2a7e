//! Dynamic loss scaling for fp16 (torch.amp.GradScaler): scale the loss, unscale the gradients, skip the
//! step on inf/NaN and halve the scale, double it after `growth_interval` clean steps.
use anyhow::Result;
use tch::{Device, Kind, Tensor};

use crate::shim;

pub struct GradScaler {
    pub scale: Tensor,
    pub(crate) growth_tracker: Tensor,
    found_inf: Tensor,
    inv_scale: Tensor,
    pub growth_factor: f64,
    pub backoff_factor: f64,
    pub growth_interval: i64,
}

impl GradScaler {
    /// GradScaler's defaults: initial scale 2^16, ×2 every 2000 clean steps, ×0.5 on overflow.
    pub fn new(device: Device) -> Self {
        Self::with_scale(device, 65536.0)
    }

    pub fn with_scale(device: Device, init_scale: f64) -> Self {
        let f = (Kind::Float, device);
        Self {
            scale: Tensor::full([1], init_scale, f),
            growth_tracker: Tensor::zeros([1], (Kind::Int, device)),
            found_inf: Tensor::zeros([1], f),
            inv_scale: Tensor::zeros([1], f),
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
        }
    }

    pub fn scale_loss(&self, loss: &Tensor) -> Tensor {
        loss * &self.scale
    }

    /// Unscales `grads` in place and reports whether any was inf/NaN (one device sync).
    pub fn unscale(&mut self, grads: &[Tensor]) -> Result<bool> {
        let _ = self.found_inf.zero_();
        tch::no_grad(|| self.inv_scale.copy_(&self.scale.reciprocal()));
        let defined: Vec<Tensor> = grads
            .iter()
            .filter(|g| g.defined())
            .map(Tensor::shallow_clone)
            .collect();
        shim::amp_unscale(&defined, &self.found_inf, &self.inv_scale)?;
        Ok(f64::try_from(&self.found_inf)? != 0.0)
    }

    /// Adjusts the scale after a step, using the overflow flag of the last `unscale`.
    pub fn update(&mut self) -> Result<()> {
        shim::amp_update_scale(
            &self.scale,
            &self.growth_tracker,
            &self.found_inf,
            self.growth_factor,
            self.backoff_factor,
            self.growth_interval,
        )
    }

    pub fn current_scale(&self) -> f64 {
        f64::try_from(&self.scale).unwrap_or(f64::NAN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overflow_halves_and_clean_steps_grow() {
        let mut s = GradScaler::with_scale(Device::Cpu, 8.0);
        s.growth_interval = 2;
        let bad = Tensor::from_slice(&[f32::NAN]);
        assert!(s.unscale(&[bad]).unwrap());
        s.update().unwrap();
        assert_eq!(s.current_scale(), 4.0);
        for _ in 0..2 {
            let good = Tensor::from_slice(&[4.0f32]);
            assert!(!s.unscale(&[good.shallow_clone()]).unwrap());
            assert_eq!(f64::try_from(&good).unwrap(), 1.0, "unscaled by 1/4");
            s.update().unwrap();
        }
        assert_eq!(s.current_scale(), 8.0);
    }
}
