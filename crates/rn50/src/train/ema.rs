//! Exponential moving average of the weights (eval on the EMA weights is a common recipe option):
//! after each step `ema = decay·ema + (1-decay)·w` for parameters; BN running statistics are copied.
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
