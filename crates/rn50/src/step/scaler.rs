//! Dynamic loss scaling for fp16 (torch.amp.GradScaler): scale the loss, unscale the gradients, skip the
//! step on inf/NaN and halve the scale, double it after `growth_interval` clean steps. The overflow flag stays
//! on the device; [`Skipped`] reads it only when asked.
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

    /// Unscales `grads` in place and sets [`found_inf`](Self::found_inf) if any was inf/NaN, on the device:
    /// no host sync.
    pub fn unscale(&mut self, grads: &[Tensor]) -> Result<()> {
        let _ = self.found_inf.zero_();
        tch::no_grad(|| self.inv_scale.copy_(&self.scale.reciprocal()));
        let defined: Vec<Tensor> = grads
            .iter()
            .filter(|g| g.defined())
            .map(Tensor::shallow_clone)
            .collect();
        shim::amp_unscale(&defined, &self.found_inf, &self.inv_scale)
    }

    /// 1 if the gradients of the last `unscale` overflowed, else 0 (a one-element fp32 tensor on the device).
    pub fn found_inf(&self) -> &Tensor {
        &self.found_inf
    }

    /// Adjusts the scale after a step, using the overflow flag of the last `unscale`.
    pub fn update(&mut self) -> Result<()> {
        // torch's GradScaler.update: torch._amp_update_scale_, in place on the scale and the growth tracker.
        let _ = self.scale.f_internal_amp_update_scale_(
            &self.growth_tracker,
            &self.found_inf,
            self.growth_factor,
            self.backoff_factor,
            self.growth_interval,
        )?;
        Ok(())
    }

    /// Every tensor of the scaler's state (scale, growth tracker, overflow flag, inverse scale), as handles.
    pub(crate) fn state(&self) -> Vec<Tensor> {
        [
            &self.scale,
            &self.growth_tracker,
            &self.found_inf,
            &self.inv_scale,
        ]
        .into_iter()
        .map(Tensor::shallow_clone)
        .collect()
    }

    pub fn current_scale(&self) -> f64 {
        f64::try_from(&self.scale).unwrap_or(f64::NAN)
    }
}

/// Whether a step's update was skipped for overflowing fp16 gradients: a copy of the scaler's flag, still on
/// the device. Reading it waits for the GPU, so read it only where the answer is needed (when logging).
pub struct Skipped(Option<Tensor>);

impl Skipped {
    /// A step without loss scaling: never skipped.
    pub fn never() -> Self {
        Self(None)
    }

    pub fn from_flag(found_inf: &Tensor) -> Self {
        Self(Some(found_inf.copy()))
    }

    pub fn get(&self) -> Result<bool> {
        Ok(match &self.0 {
            Some(flag) => f64::try_from(flag)? != 0.0,
            None => false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overflow_halves_and_clean_steps_grow() {
        let mut s = GradScaler::with_scale(Device::Cpu, 8.0);
        s.growth_interval = 2;
        let overflowed = |s: &GradScaler| f64::try_from(s.found_inf()).unwrap() != 0.0;
        let bad = Tensor::from_slice(&[f32::NAN]);
        s.unscale(&[bad]).unwrap();
        assert!(overflowed(&s));
        s.update().unwrap();
        assert_eq!(s.current_scale(), 4.0);
        for _ in 0..2 {
            let good = Tensor::from_slice(&[4.0f32]);
            s.unscale(&[good.shallow_clone()]).unwrap();
            assert!(!overflowed(&s));
            assert_eq!(f64::try_from(&good).unwrap(), 1.0, "unscaled by 1/4");
            s.update().unwrap();
        }
        assert_eq!(s.current_scale(), 8.0);
    }
}
