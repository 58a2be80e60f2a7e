//! The optimizer: SGD with momentum (optionally Nesterov) and weight decay, optionally none on BN parameters and
//! biases, computed with the same multi-tensor kernels as `torch.optim.SGD(foreach=True)` (on CUDA its fused kernel,
//! `fused=True`); LARS (You et al. 2017) for large global batches; AdamW and RAdam with decoupled weight decay as
//! `torch.optim.AdamW` and `torch.optim.RAdam(decoupled_weight_decay=True)` (foreach); and Lookahead (Zhang et al.
//! 2019) around any of them: fast.ai's Ranger, the optimizer of its Imagenette leaderboard entries, is RAdam with
//! Lookahead.
use anyhow::{bail, Result};
use tch::{Device, Kind, Tensor};

use crate::shim;

/// The optimizer's settings: the record results and checkpoints keep.
pub use rn50_report::schema::{AdamConfig, AdamKind, LookaheadConfig, OptimizerConfig};

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

/// Parameters sharing one weight decay, with the optimizer's state for each (each list empty where the
/// configuration keeps no such state).
pub struct ParamGroup {
    pub names: Vec<String>,
    pub params: Vec<Tensor>,
    /// SGD's and LARS's momentum buffers.
    pub momentum_buffers: Vec<Tensor>,
    /// Adam's first and second moments.
    pub exp_avgs: Vec<Tensor>,
    pub exp_avg_sqs: Vec<Tensor>,
    /// Lookahead's slow weights.
    pub slow: Vec<Tensor>,
    pub weight_decay: f64,
}

pub struct Optimizer {
    pub config: OptimizerConfig,
    pub groups: Vec<ParamGroup>,
    /// Updates applied so far (skipped ones not counted), a one-element int64 tensor on the CPU so that checkpoints
    /// keep it: Adam's bias corrections and Lookahead's period count it. Kept for SGD too, not checkpointed there.
    steps: Tensor,
}

impl Optimizer {
    /// Splits `params` into a decayed group and (with `no_bn_bias_decay`) an undecayed group of 1-D tensors.
    pub fn new(params: Vec<(String, Tensor)>, config: OptimizerConfig) -> Self {
        let (mut decay, mut no_decay) = (Vec::new(), Vec::new());
        for (name, t) in params {
            if config.no_bn_bias_decay && t.dim() <= 1 {
                no_decay.push((name, t));
            } else {
                decay.push((name, t));
            }
        }
        let zeros = |ps: &[(String, Tensor)], keep: bool| -> Vec<Tensor> {
            if !keep {
                return Vec::new();
            }
            ps.iter()
                .map(|(_, t)| tch::no_grad(|| t.zeros_like()))
                .collect()
        };
        let adam = config.adam.is_some();
        let group = |ps: Vec<(String, Tensor)>, weight_decay: f64| {
            let momentum_buffers = zeros(&ps, !adam);
            let (exp_avgs, exp_avg_sqs) = (zeros(&ps, adam), zeros(&ps, adam));
            let slow = zeros(&ps, config.lookahead.is_some());
            let (names, params) = ps.into_iter().unzip();
            ParamGroup {
                names,
                params,
                momentum_buffers,
                exp_avgs,
                exp_avg_sqs,
                slow,
                weight_decay,
            }
        };
        let mut groups = vec![group(decay, config.weight_decay)];
        if !no_decay.is_empty() {
            groups.push(group(no_decay, 0.0));
        }
        Self {
            config,
            groups,
            steps: Tensor::zeros([1], (Kind::Int64, Device::Cpu)),
        }
    }

    pub fn params(&self) -> impl Iterator<Item = &Tensor> {
        self.groups.iter().flat_map(|g| g.params.iter())
    }

    /// The optimizer's state by checkpoint key: SGD's momentum buffers as `optim.<param>` (the keys of every rn50
    /// checkpoint so far), Adam's moments as `optim.exp_avg.<param>` and `optim.exp_avg_sq.<param>`, Lookahead's
    /// slow weights as `optim.slow.<param>`, and with either of the last two the update count, `optim.step`.
    pub fn state(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        for g in &self.groups {
            let lists = [
                ("", &g.momentum_buffers),
                ("exp_avg.", &g.exp_avgs),
                ("exp_avg_sq.", &g.exp_avg_sqs),
                ("slow.", &g.slow),
            ];
            for (prefix, list) in lists {
                for (name, t) in g.names.iter().zip(list) {
                    out.push((format!("optim.{prefix}{name}"), t.shallow_clone()));
                }
            }
        }
        if self.config.adam.is_some() || self.config.lookahead.is_some() {
            out.push(("optim.step".into(), self.steps.shallow_clone()));
        }
        out
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

    /// Whether an update runs torch.optim.SGD(fused=True)'s CUDA kernel: parameters on CUDA, and plain SGD (not
    /// LARS, Adam or Lookahead, whose updates need to know on the host whether fp16 skipped the step).
    pub fn fused(&self) -> bool {
        let c = &self.config;
        c.lars_eta.is_none()
            && c.adam.is_none()
            && c.lookahead.is_none()
            && self.params().next().is_some_and(|p| p.device().is_cuda())
    }

    /// One update with learning rate `lr` and `momentum` (the config's, or one cycle's of this step: Adam's β1),
    /// none where `found_inf` (fp16's overflow flag on the device) is set. Parameters without a gradient are
    /// skipped, as in PyTorch. On CUDA plain SGD's update is torch.optim.SGD(fused=True)'s kernel, which reads the
    /// flag itself, so the host never waits for the GPU; elsewhere the flag is read first. A rate on the device
    /// ([`Rate::Device`]) needs the fused kernel.
    pub fn step<'a>(
        &mut self,
        lr: impl Into<Rate<'a>>,
        momentum: f64,
        found_inf: Option<&Tensor>,
    ) -> Result<()> {
        let fused = self.fused();
        let lr = lr.into();
        let lr_value = match lr {
            Rate::Value(v) => v,
            Rate::Device(_) if !fused => bail!(
                "a learning rate on the device needs the fused CUDA SGD (parameters on CUDA, plain SGD)"
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
        let _ = self.steps.g_add_scalar_(1);
        let step = i64::try_from(&self.steps)? as u64;
        if step == 1 && self.config.lookahead.is_some() {
            // The slow weights start where training does (after any --init-weights), as in fast.ai's Lookahead.
            for g in &self.groups {
                for (s, p) in g.slow.iter().zip(&g.params) {
                    tch::no_grad(|| s.shallow_clone().copy_(p));
                }
            }
        }
        for g in &self.groups {
            self.update(g, lr, lr_value, momentum, step, found_inf)?;
        }
        if let Some(la) = self.config.lookahead {
            if step.is_multiple_of(la.k) {
                for g in &self.groups {
                    shim::lookahead_sync(&g.slow, &g.params, la.alpha)?;
                }
            }
        }
        Ok(())
    }

    /// One group's update, step number `step` (from 1).
    fn update(
        &self,
        g: &ParamGroup,
        lr: Rate,
        lr_value: f64,
        momentum: f64,
        step: u64,
        found_inf: Option<&Tensor>,
    ) -> Result<()> {
        let c = &self.config;
        // Each parameter's gradient once; the state of parameters without one is left out with them.
        let grads: Vec<Tensor> = g.params.iter().map(Tensor::grad).collect();
        let with_grad = |list: &[Tensor]| -> Vec<Tensor> {
            list.iter()
                .zip(&grads)
                .filter(|(_, grad)| grad.defined())
                .map(|(t, _)| t.shallow_clone())
                .collect()
        };
        let params = with_grad(&g.params);
        let grads = with_grad(&grads);
        let wd = g.weight_decay;
        if let Some(a) = c.adam {
            let rectified = a.kind == AdamKind::Radam;
            let (m, v) = (with_grad(&g.exp_avgs), with_grad(&g.exp_avg_sqs));
            let betas = (momentum, a.beta2, a.eps);
            return shim::adam_foreach(
                &params, &grads, &m, &v, lr_value, betas, wd, step, rectified,
            );
        }
        let bufs = with_grad(&g.momentum_buffers);
        if let Some(eta) = c.lars_eta {
            let (mut plain_p, mut plain_g, mut plain_b) = (Vec::new(), Vec::new(), Vec::new());
            for ((p, grad), b) in params.into_iter().zip(grads).zip(bufs) {
                if p.dim() > 1 {
                    lars_update(&p, &grad, &b, lr_value, momentum, wd, eta);
                } else {
                    plain_p.push(p);
                    plain_g.push(grad);
                    plain_b.push(b);
                }
            }
            return shim::sgd_foreach(
                &plain_p, &plain_g, &plain_b, lr_value, momentum, wd, c.nesterov,
            );
        }
        if self.fused() {
            shim::sgd_fused(
                &params, &grads, &bufs, lr, momentum, wd, c.nesterov, found_inf,
            )
        } else {
            shim::sgd_foreach(&params, &grads, &bufs, lr_value, momentum, wd, c.nesterov)
        }
    }
}

/// The optimizer in words, for the start line: "SGD, momentum 0.9 (Nesterov), weight decay 5e-05 (none on
/// BN and biases)", "RAdam (β1 0.95, β2 0.99, ε 1e-6), decoupled weight decay 0.01, Lookahead (k 6, α 0.5)".
pub fn describe(c: &OptimizerConfig) -> String {
    let mut out = match (c.adam, c.lars_eta) {
        (Some(a), _) => format!(
            "{} (β1 {}, β2 {}, ε {:e}), decoupled weight decay {}",
            match a.kind {
                AdamKind::Adamw => "AdamW",
                AdamKind::Radam => "RAdam",
            },
            c.momentum,
            a.beta2,
            a.eps,
            c.weight_decay
        ),
        (None, lars) => format!(
            "{}, momentum {}{}, weight decay {}",
            lars.map_or("SGD".to_string(), |eta| format!("LARS (η {eta})")),
            c.momentum,
            if c.nesterov { " (Nesterov)" } else { "" },
            c.weight_decay
        ),
    };
    if c.no_bn_bias_decay && c.weight_decay != 0.0 {
        out.push_str(" (none on BN and biases)");
    }
    if let Some(la) = c.lookahead {
        out.push_str(&format!(", Lookahead (k {}, α {})", la.k, la.alpha));
    }
    out
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
        let cfg = OptimizerConfig {
            no_bn_bias_decay: true,
            ..OptimizerConfig::default()
        };
        let opt = Optimizer::new(
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
        let opt = Optimizer::new(params, OptimizerConfig::default());
        assert_eq!(opt.groups.len(), 1);
    }

    /// Each step's momentum is the one given (one cycle's), not the config's: with a constant gradient 1, rate
    /// 0.1, PyTorch's SGD has buf = 1 and w = 0.9 after the first step, then buf = m·1 + 1 and w = 0.9 - 0.1·buf.
    #[test]
    fn each_step_takes_the_momentum_it_is_given() {
        for m in [0.5, 0.95] {
            let w = param(&[1.0], &[1], &[1.0]);
            let cfg = OptimizerConfig {
                weight_decay: 0.0,
                momentum: 0.9,
                ..OptimizerConfig::default()
            };
            let mut opt = Optimizer::new(vec![("w".into(), w.shallow_clone())], cfg);
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
        let cfg = OptimizerConfig {
            weight_decay: 0.0,
            lars_eta: Some(0.001),
            ..OptimizerConfig::default()
        };
        let mut opt = Optimizer::new(
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

    #[test]
    fn the_start_line_names_the_optimizer_and_its_settings() {
        let sgd = OptimizerConfig {
            nesterov: true,
            no_bn_bias_decay: true,
            weight_decay: 5e-5,
            ..OptimizerConfig::default()
        };
        assert_eq!(
            describe(&sgd),
            "SGD, momentum 0.9 (Nesterov), weight decay 0.00005 (none on BN and biases)"
        );
        let ranger = OptimizerConfig {
            momentum: 0.95,
            weight_decay: 0.01,
            adam: Some(AdamConfig {
                kind: AdamKind::Radam,
                beta2: 0.99,
                eps: 1e-6,
            }),
            lookahead: Some(LookaheadConfig { k: 6, alpha: 0.5 }),
            ..OptimizerConfig::default()
        };
        assert_eq!(
            describe(&ranger),
            "RAdam (β1 0.95, β2 0.99, ε 1e-6), decoupled weight decay 0.01, Lookahead (k 6, α 0.5)"
        );
    }
}
