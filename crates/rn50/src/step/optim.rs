//! SGD with momentum (optionally Nesterov) and weight decay, optionally none on BN parameters and biases,
//! computed with the same multi-tensor kernels as `torch.optim.SGD(foreach=True)` (on CUDA its fused kernel,
//! `fused=True`); and LARS (You et al. 2017) for large global batches.
use anyhow::{bail, Result};
use tch::Tensor;

use crate::shim;

/// SGD's settings (momentum, weight decay, Nesterov, LARS): the record results and checkpoints keep.
pub use rn50_report::schema::SgdConfig;

/// The learning rate of one update: a number, or a one-element fp32 tensor on the device that the fused CUDA
/// kernel reads when it runs, so that a captured CUDA graph ([`super::graph`]) takes each step's rate from it (set
/// before each replay).
#[derive(Clone, Copy)]
pub enum Rate<'a> {
    Value(f64),
    Device(&'a Tensor),
}

impl From<f64> for Rate<'_> {
    fn from(lr: f64) -> Self {
        Rate::Value(lr)
    }
}

/// Parameters sharing one weight decay.
pub struct ParamGroup {
    pub names: Vec<String>,
    pub params: Vec<Tensor>,
    pub momentum_buffers: Vec<Tensor>,
    pub weight_decay: f64,
}

pub struct Sgd {
    pub config: SgdConfig,
    pub groups: Vec<ParamGroup>,
}

impl Sgd {
    /// Splits `params` into a decayed group and (with `no_bn_bias_decay`) an undecayed group of 1-D tensors.
    pub fn new(params: Vec<(String, Tensor)>, config: SgdConfig) -> Self {
        let (mut decay, mut no_decay) = (Vec::new(), Vec::new());
        for (name, t) in params {
            if config.no_bn_bias_decay && t.dim() <= 1 {
                no_decay.push((name, t));
            } else {
                decay.push((name, t));
            }
        }
        let group = |ps: Vec<(String, Tensor)>, weight_decay: f64| {
            let momentum_buffers = ps
                .iter()
                .map(|(_, t)| tch::no_grad(|| t.zeros_like()))
                .collect();
            let (names, params) = ps.into_iter().unzip();
            ParamGroup {
                names,
                params,
                momentum_buffers,
                weight_decay,
            }
        };
        let mut groups = vec![group(decay, config.weight_decay)];
        if !no_decay.is_empty() {
            groups.push(group(no_decay, 0.0));
        }
        Self { config, groups }
    }

    pub fn params(&self) -> impl Iterator<Item = &Tensor> {
        self.groups.iter().flat_map(|g| g.params.iter())
    }

    /// The current gradients (undefined tensors where backward produced none).
    pub fn grads(&self) -> Vec<Tensor> {
        self.params().map(Tensor::grad).collect()
    }

    /// Zero the gradients in place: no allocation per step.
    pub fn zero_grad(&self) {
        for p in self.params() {
            let mut g = p.grad();
            if g.defined() {
                let _ = g.zero_();
            }
        }
    }

    /// Whether an update runs torch.optim.SGD(fused=True)'s CUDA kernel: parameters on CUDA, and not LARS.
    pub fn fused(&self) -> bool {
        self.config.lars_eta.is_none() && self.params().next().is_some_and(|p| p.device().is_cuda())
    }

    /// One update with learning rate `lr` and `momentum` (the config's, or one cycle's of this step), none where
    /// `found_inf` (fp16's overflow flag on the device) is set. Parameters without a gradient are skipped, as in
    /// PyTorch. On CUDA (LARS aside) the update is
    /// torch.optim.SGD(fused=True)'s kernel, which reads the flag itself, so the host never waits for the GPU;
    /// elsewhere the flag is read first. A rate on the device ([`Rate::Device`]) needs the fused kernel.
    pub fn step<'a>(
        &mut self,
        lr: impl Into<Rate<'a>>,
        momentum: f64,
        found_inf: Option<&Tensor>,
    ) -> Result<()> {
        let fused = self.fused();
        let c = &self.config;
        let lr = lr.into();
        let lr_value = match lr {
            Rate::Value(v) => v,
            Rate::Device(_) if !fused => bail!(
                "a learning rate on the device needs the fused CUDA SGD (parameters on CUDA, not LARS)"
            ),
            // Not read: the fused kernel takes the tensor.
            Rate::Device(_) => f64::NAN,
        };
        if !fused {
            if let Some(inf) = found_inf {
                if f64::try_from(inf)? != 0.0 {
                    return Ok(());
                }
            }
        }
        for g in &self.groups {
            let mut params = Vec::with_capacity(g.params.len());
            let mut grads = Vec::with_capacity(g.params.len());
            let mut bufs = Vec::with_capacity(g.params.len());
            for (p, b) in g.params.iter().zip(&g.momentum_buffers) {
                let grad = p.grad();
                if !grad.defined() {
                    continue;
                }
                match c.lars_eta {
                    Some(eta) if p.dim() > 1 => {
                        lars_update(p, &grad, b, lr_value, momentum, g.weight_decay, eta)
                    }
                    _ => {
                        params.push(p.shallow_clone());
                        grads.push(grad);
                        bufs.push(b.shallow_clone());
                    }
                }
            }
            let (m, wd) = (momentum, g.weight_decay);
            if fused {
                shim::sgd_fused(&params, &grads, &bufs, lr, m, wd, c.nesterov, found_inf)?;
            } else {
                shim::sgd_foreach(&params, &grads, &bufs, lr_value, m, wd, c.nesterov)?;
            }
        }
        Ok(())
    }
}

/// One LARS update, on the device without a host sync:
/// g += wd·w;  buf = m·buf + lr·trust·g;  w -= buf, with trust = η‖w‖/(‖g₀‖ + wd‖w‖) (1 if a norm is 0).
fn lars_update(p: &Tensor, grad: &Tensor, buf: &Tensor, lr: f64, momentum: f64, wd: f64, eta: f64) {
    tch::no_grad(|| {
        let (w_norm, g_norm) = (p.norm(), grad.norm());
        let ratio = &w_norm * eta / (&g_norm + &w_norm * wd);
        let ok = w_norm.gt(0.0).logical_and(&g_norm.gt(0.0));
        let trust = ratio.where_self(&ok, &ratio.ones_like());
        let mut g = grad.shallow_clone();
        let _ = g.g_add_(&(p * wd));
        let mut b = buf.shallow_clone();
        let _ = b.g_mul_scalar_(momentum);
        let _ = b.g_add_(&(g * (trust * lr)));
        let mut w = p.shallow_clone();
        let _ = w.g_sub_(&b);
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    fn param(values: &[f32], shape: &[i64], grad: &[f32]) -> Tensor {
        let p = Tensor::from_slice(values)
            .view(shape)
            .set_requires_grad(true);
        // Give it a gradient through a backward pass, as training does.
        let g = Tensor::from_slice(grad).view(shape);
        (&p * &g).sum(Kind::Float).backward();
        p
    }

    fn values(t: &Tensor) -> Vec<f32> {
        Vec::<f32>::try_from(t.flatten(0, -1)).unwrap()
    }

    #[test]
    fn no_bn_bias_decay_puts_1d_params_in_an_undecayed_group() {
        let params = vec![
            (
                "conv.weight".to_string(),
                Tensor::zeros([2, 2, 1, 1], (Kind::Float, Device::Cpu)),
            ),
            (
                "bn.weight".to_string(),
                Tensor::zeros([2], (Kind::Float, Device::Cpu)),
            ),
            (
                "fc.bias".to_string(),
                Tensor::zeros([2], (Kind::Float, Device::Cpu)),
            ),
        ];
        let cfg = SgdConfig {
            no_bn_bias_decay: true,
            ..SgdConfig::default()
        };
        let opt = Sgd::new(
            params
                .iter()
                .map(|(k, t)| (k.clone(), t.shallow_clone()))
                .collect(),
            cfg,
        );
        assert_eq!(opt.groups.len(), 2);
        assert_eq!(
            (opt.groups[0].names.clone(), opt.groups[0].weight_decay),
            (vec!["conv.weight".to_string()], 1e-4)
        );
        assert_eq!(opt.groups[1].names, ["bn.weight", "fc.bias"]);
        assert_eq!(opt.groups[1].weight_decay, 0.0);
        let opt = Sgd::new(params, SgdConfig::default());
        assert_eq!(opt.groups.len(), 1);
    }

    /// Each step's momentum is the one given (one cycle's), not the config's: with a constant gradient 1, rate
    /// 0.1, PyTorch's SGD has buf = 1 and w = 0.9 after the first step, then buf = m·1 + 1 and w = 0.9 - 0.1·buf.
    #[test]
    fn each_step_takes_the_momentum_it_is_given() {
        for m in [0.5, 0.95] {
            let w = param(&[1.0], &[1], &[1.0]);
            let cfg = SgdConfig {
                weight_decay: 0.0,
                momentum: 0.9,
                ..SgdConfig::default()
            };
            let mut opt = Sgd::new(vec![("w".into(), w.shallow_clone())], cfg);
            opt.step(0.1, 0.9, None).unwrap();
            assert!((values(&w)[0] - 0.9).abs() < 1e-6);
            opt.step(0.1, m, None).unwrap();
            let want = 0.9 - 0.1 * (m + 1.0);
            assert!(
                (values(&w)[0] as f64 - want).abs() < 1e-6,
                "momentum {m}: {:?}",
                values(&w)
            );
        }
    }

    #[test]
    fn lars_scales_each_kernel_by_its_trust_ratio() {
        // ‖w‖ = 5, ‖g‖ = 1, wd = 0: trust = η·5 = 0.005; the 1-D bias gets plain SGD.
        let w = param(&[3.0, 4.0], &[1, 2], &[0.6, 0.8]);
        let b = param(&[1.0], &[1], &[0.5]);
        let cfg = SgdConfig {
            weight_decay: 0.0,
            lars_eta: Some(0.001),
            ..SgdConfig::default()
        };
        let mut opt = Sgd::new(
            vec![
                ("w".into(), w.shallow_clone()),
                ("b".into(), b.shallow_clone()),
            ],
            cfg,
        );
        opt.step(1.0, 0.9, None).unwrap();
        let got = values(&w);
        for (a, want) in got.iter().zip([3.0 - 0.005 * 0.6, 4.0 - 0.005 * 0.8]) {
            assert!((a - want).abs() < 1e-6, "{got:?}");
        }
        assert!((values(&b)[0] - 0.5).abs() < 1e-6, "bias: 1 - 1.0·0.5");
        // Momentum carries lr·trust·g into the next step.
        opt.step(1.0, 0.9, None).unwrap();
        let w_norm = (2.997f64.powi(2) + 3.996f64.powi(2)).sqrt();
        let step2 = 0.9 * 0.005 + 0.001 * w_norm;
        assert!(
            (values(&w)[0] as f64 - (2.997 - step2 * 0.6)).abs() < 1e-5,
            "{:?}",
            values(&w)
        );
    }
}
