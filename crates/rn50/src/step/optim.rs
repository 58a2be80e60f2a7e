//! SGD with momentum (optionally Nesterov) and weight decay, optionally none on BN parameters and biases,
//! computed with the same multi-tensor kernels as `torch.optim.SGD(foreach=True)`.
use anyhow::Result;
use tch::Tensor;

use crate::shim;

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct SgdConfig {
    pub momentum: f64,
    pub weight_decay: f64,
    pub nesterov: bool,
    /// No weight decay on 1-D parameters (BN γ/β and biases), as in Goyal et al. and NVIDIA's recipe.
    pub no_bn_bias_decay: bool,
}

impl Default for SgdConfig {
    fn default() -> Self {
        Self {
            momentum: 0.9,
            weight_decay: 1e-4,
            nesterov: false,
            no_bn_bias_decay: false,
        }
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

    /// One update with learning rate `lr`. Parameters without a gradient are skipped, as in PyTorch.
    pub fn step(&mut self, lr: f64) -> Result<()> {
        let c = &self.config;
        for g in &self.groups {
            let mut params = Vec::with_capacity(g.params.len());
            let mut grads = Vec::with_capacity(g.params.len());
            let mut bufs = Vec::with_capacity(g.params.len());
            for (p, b) in g.params.iter().zip(&g.momentum_buffers) {
                let grad = p.grad();
                if grad.defined() {
                    params.push(p.shallow_clone());
                    grads.push(grad);
                    bufs.push(b.shallow_clone());
                }
            }
            shim::sgd_foreach(
                &params,
                &grads,
                &bufs,
                lr,
                c.momentum,
                g.weight_decay,
                c.nesterov,
            )?;
        }
        Ok(())
    }
}
