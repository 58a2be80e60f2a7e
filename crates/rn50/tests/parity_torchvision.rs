//! rn50 against torchvision in the same process tree: same weights through safetensors → same logits (eval
//! and train mode) and, after two SGD steps with momentum and weight decay, the same parameters and BN
//! statistics. The reference comes from `tests/reference/torchvision_step.py` run with the venv's PyTorch.
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::OnceLock;

use rn50::model::{weights, Arch, Model, ResNetConfig};
use rn50::step::{Precision, SgdConfig, StepConfig, TrainStep};
use tch::{Device, Tensor};

mod common;

/// Runs the reference script once per test binary; panics with the script's stderr if it fails.
fn reference() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        common::reference_script("torchvision_step.py", &[dir.path()]);
        dir
    })
    .path()
}

fn load(path: &Path) -> BTreeMap<String, Tensor> {
    Tensor::read_safetensors(path)
        .unwrap()
        .into_iter()
        .collect()
}

fn meta() -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(reference().join("meta.json")).unwrap()).unwrap()
}

/// max|a-b| / max|b|: the relative error the acceptance criterion is stated in.
fn rel_err(a: &Tensor, b: &Tensor) -> f64 {
    let num = f64::try_from((a - b).abs().max()).unwrap();
    let den = f64::try_from(b.abs().max()).unwrap().max(1e-12);
    num / den
}

fn to_cl(t: &Tensor) -> Tensor {
    rn50::model::memory_format::channels_last(t)
}

fn check_case(name: &str) {
    let meta = meta();
    let c = &meta["cases"][name];
    let channels_last = c["channels_last"].as_bool().unwrap();
    let arch: Arch = c["arch"].as_str().unwrap().parse().unwrap();
    let r = load(&reference().join(format!("{name}.ref.safetensors")));
    let model = Model::new(ResNetConfig::new(arch), Device::Cpu);
    weights::load(
        &model,
        &reference().join(format!("{name}.weights.safetensors")),
    )
    .unwrap();

    let sgd = SgdConfig {
        momentum: c["momentum"].as_f64().unwrap(),
        weight_decay: c["weight_decay"].as_f64().unwrap(),
        nesterov: c["nesterov"].as_bool().unwrap(),
        no_bn_bias_decay: c["no_bn_bias_decay"].as_bool().unwrap(),
        lars_eta: None,
    };
    let cfg = StepConfig {
        precision: Precision::Fp32,
        channels_last,
        label_smoothing: c["label_smoothing"].as_f64().unwrap(),
        sgd,
    };
    let mut step = TrainStep::new(model, cfg);
    let input = |k: &str| {
        if channels_last {
            to_cl(&r[k])
        } else {
            r[k].shallow_clone()
        }
    };

    let eval = tch::no_grad(|| step.model.forward_t(&input("x0"), false));
    let e = rel_err(&eval, &r["logits_eval"]);
    assert!(
        e < 1e-4,
        "{name} cl={channels_last}: eval logits rel err {e:e}"
    );

    // Train-mode logits: the first step's forward (it also updates the BN running statistics once).
    let train_logits = tch::no_grad(|| step.model.forward_t(&input("x0"), true));
    let e = rel_err(&train_logits, &r["logits_train"]);
    assert!(
        e < 1e-4,
        "{name} cl={channels_last}: train logits rel err {e:e}"
    );
    // Undo that extra BN update by reloading, then take the two reference steps.
    weights::load(
        &step.model,
        &reference().join(format!("{name}.weights.safetensors")),
    )
    .unwrap();

    let lr = c["lr"].as_f64().unwrap();
    let ref_losses = Vec::<f32>::try_from(&r["losses"]).unwrap();
    for (i, (x, y)) in [("x0", "y0"), ("x1", "y1")].into_iter().enumerate() {
        let out = step.step(&input(x), &r[y], lr).unwrap();
        let loss = f64::try_from(&out.loss).unwrap();
        let want = ref_losses[i] as f64;
        assert!(
            (loss - want).abs() <= 1e-4 * want.abs(),
            "{name} cl={channels_last}: loss {i} {loss} vs {want}"
        );
    }
    let mut worst = (0.0, String::new());
    for (k, t) in step.model.state() {
        let want = &r[&format!("final.{k}")];
        assert_eq!(t.size(), want.size(), "{k}");
        let e = rel_err(&t, want);
        if e > worst.0 {
            worst = (e, k);
        }
    }
    assert!(
        worst.0 < 1e-4,
        "{name} cl={channels_last}: after two SGD steps {} rel err {:e}",
        worst.1,
        worst.0
    );
}

#[test]
fn resnet18_matches_torchvision_fp32() {
    check_case("r18_plain");
}

#[test]
fn resnet50_nesterov_no_bn_decay_label_smoothing_matches_torchvision() {
    check_case("r50_nesterov_nobnwd_ls");
}

#[test]
fn resnet50_channels_last_matches_torchvision() {
    check_case("r50_nesterov_nobnwd_ls_cl");
}

/// Every depth has exactly torchvision's state_dict keys and shapes (num_batches_tracked aside).
#[test]
fn every_depth_has_torchvision_keys_and_shapes() {
    let meta = meta();
    for arch in Arch::ALL {
        let want: BTreeMap<String, Vec<i64>> = meta["keys"][arch.name()]
            .as_object()
            .unwrap()
            .iter()
            .filter(|(k, _)| !k.ends_with("num_batches_tracked"))
            .map(|(k, v)| {
                (
                    k.clone(),
                    v.as_array()
                        .unwrap()
                        .iter()
                        .map(|d| d.as_i64().unwrap())
                        .collect(),
                )
            })
            .collect();
        let model = Model::new(ResNetConfig::new(arch), Device::Cpu);
        let got: BTreeMap<String, Vec<i64>> = model
            .state()
            .into_iter()
            .map(|(k, t)| (k, t.size()))
            .collect();
        assert_eq!(got, want, "{arch}");
    }
}
