//! Exponential moving average of the weights (`--ema`, timm's and torchvision's recipe option): after each step
//! `ema = decay·ema + (1-decay)·w` for parameters; BN running statistics are copied. [`EmaModel`] is the average
//! with the model it is evaluated in, next to the trained weights; [`warn_if_longer_than`] says when a decay
//! outlasts the run.
use tch::Tensor;

use crate::model::Model;

pub struct Ema {
    pub decay: f64,
    /// (name, shadow tensor, is a trainable parameter), in `Model::state()` order.
    shadow: Vec<(String, Tensor, bool)>,
    /// Handles on the tracked model's tensors (shared storage), so a step does not rebuild the name map.
    source: Vec<Tensor>,
}

impl Ema {
    /// Starts from the model's current weights (same device, dtype and memory format).
    pub fn new(model: &Model, decay: f64) -> Self {
        let state = model.state();
        let shadow = tch::no_grad(|| {
            state
                .iter()
                .map(|(k, t)| (k.clone(), t.detach().copy(), t.requires_grad()))
                .collect()
        });
        let source = state.into_iter().map(|(_, t)| t).collect();
        Self {
            decay,
            shadow,
            source,
        }
    }

    /// Folds the tracked model's current weights into the average (in place, on the device, no sync).
    pub fn update(&mut self) {
        tch::no_grad(|| {
            for ((_, s, trainable), t) in self.shadow.iter_mut().zip(&self.source) {
                if *trainable {
                    let _ = s.lerp_(t, 1.0 - self.decay);
                } else {
                    s.copy_(t);
                }
            }
        });
    }

    /// Writes the averaged weights into `target` (a model of the same architecture, e.g. for eval).
    pub fn copy_to(&self, target: &Model) {
        tch::no_grad(|| {
            for ((_, s, _), (_, mut t)) in self.shadow.iter().zip(target.state()) {
                t.copy_(s);
            }
        });
    }

    pub fn tensors(&self) -> impl Iterator<Item = (&str, &Tensor)> {
        self.shadow.iter().map(|(k, t, _)| (k.as_str(), t))
    }
}

/// `--ema`: the average, and the model it is copied into to be evaluated and saved as best_ema.safetensors.
pub struct EmaModel {
    pub ema: Ema,
    pub model: Model,
}

impl EmaModel {
    /// The average as a model (copied into it now).
    pub fn model(&self) -> &Model {
        self.ema.copy_to(&self.model);
        &self.model
    }
}

/// Warns when `--ema decay`'s horizon, about 1/(1-decay) updates, is longer than the run's `steps` optimizer
/// steps updating it every `every`: such an average stays near the first weights (timm's default 0.9998 needs
/// 5,000 updates), so it scores as an untrained network while the trained weights have learnt.
pub fn warn_if_longer_than(decay: f64, every: usize, steps: usize) {
    let updates = steps.div_ceil(every);
    let horizon = 1.0 / (1.0 - decay);
    if horizon > updates as f64 {
        tracing::warn!(
            "--ema {decay} averages over {} updates (1/(1-decay)), more than the {updates} of this run \
             ({steps} steps, one update every --ema-steps {every}): the average will stay close to the first \
             weights. Both are evaluated (ema_acc1 beside acc1); a lower --ema fits a short run (1-1/N averages \
             over N updates)",
            match horizon.is_finite() {
                true => format!("about {horizon:.0}"),
                false => "infinitely many".into(),
            }
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Arch, ResNetConfig};
    use tch::{Device, Kind};

    #[test]
    fn averages_parameters_and_copies_buffers() {
        let model = Model::new(ResNetConfig::new(Arch::ResNet18), Device::Cpu);
        let mut ema = Ema::new(&model, 0.9);
        let state: std::collections::HashMap<_, _> = model.state().into_iter().collect();
        let w0 = state["fc.weight"].copy();
        tch::no_grad(|| {
            let _ = state["fc.weight"].shallow_clone().g_add_scalar_(1.0);
            let _ = state["bn1.running_mean"].shallow_clone().fill_(3.0);
        });
        ema.update();
        let shadow: std::collections::HashMap<_, _> = ema.tensors().collect();
        // 0.9·w0 + 0.1·(w0 + 1) = w0 + 0.1
        let err = f64::try_from((shadow["fc.weight"] - (&w0 + 0.1)).abs().max()).unwrap();
        assert!(err < 1e-6, "{err}");
        assert_eq!(
            f64::try_from(shadow["bn1.running_mean"].mean(Kind::Float)).unwrap(),
            3.0
        );
        let other = Model::new(ResNetConfig::new(Arch::ResNet18), Device::Cpu);
        ema.copy_to(&other);
        let o: std::collections::HashMap<_, _> = other.state().into_iter().collect();
        assert!(o["fc.weight"].equal(shadow["fc.weight"]));
    }
}
