//! rn50 against torchvision in the same process tree: same weights through safetensors → same logits (eval
//! and train mode) and, after two SGD steps with momentum and weight decay, the same parameters and BN
//! statistics; and the same against timm for its ResNet-D and anti-aliased variants; under bf16 autocast, the same
//! bits as the reference trainer's. The reference comes from `tests/reference/torchvision_step.py` run with the
//! venv's PyTorch, torchvision and timm.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use rn50::model::{weights, Arch, Model, Pool, ResNetConfig};
use rn50::step::{OptimizerConfig, Precision, StepConfig, TrainStep};
use tch::{Device, Tensor};

use crate::common;

use common::max_abs_rel_err;

/// Runs the reference script once per test binary; panics with the script's stderr if it fails.
fn reference() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = common::run_dir("parity_torchvision");
        // The bf16 case's thread count: this process's (each test thread's) libtorch default.
        let threads = tch::get_num_threads().to_string();
        common::reference_script(
            "torchvision_step.py",
            &[dir.as_os_str(), std::ffi::OsStr::new(&threads)],
        );
        dir
    })
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

fn to_cl(t: &Tensor) -> Tensor {
    rn50::model::memory_format::channels_last(t)
}

fn check_case(name: &str) {
    let meta = meta();
    let c = &meta["cases"][name];
    let precision: Precision = c["precision"].as_str().unwrap().parse().unwrap();
    // fp32: within rounding of other kernels and threads. bf16: the same bits, from the same ops in the same dtypes
    // in the same libtorch on as many threads, where one op in another dtype (or bf16 rounding in another order)
    // moves these values by far more than fp32's bound.
    let tolerance = match precision {
        Precision::Fp32 => 1e-4,
        _ => {
            let (ours, theirs) = (rn50::shim::torch_version(), c["torch"].as_str().unwrap());
            if ours != theirs {
                eprintln!(
                    "{name}: NOT COMPARED: rn50 links libtorch {ours}, the reference ran PyTorch {theirs}; \
                     bf16 results are the same bits only from the same kernels"
                );
                return;
            }
            // Set nowhere in this process (setting it would reach the tests that start meanwhile): libtorch's
            // default, which the reference was given.
            assert_eq!(
                i64::from(tch::get_num_threads()),
                c["threads"].as_i64().unwrap(),
                "{name}: the reference's threads are this test thread's"
            );
            0.0
        }
    };
    let channels_last = c["channels_last"].as_bool().unwrap();
    let arch: Arch = c["arch"].as_str().unwrap().parse().unwrap();
    let r = load(&reference().join(format!("{name}.ref.safetensors")));
    let model = Model::new(ResNetConfig::new(arch), Device::Cpu);
    weights::load(
        &model,
        &reference().join(format!("{name}.weights.safetensors")),
    )
    .unwrap();

    let optimizer = OptimizerConfig {
        momentum: c["momentum"].as_f64().unwrap(),
        weight_decay: c["weight_decay"].as_f64().unwrap(),
        nesterov: c["nesterov"].as_bool().unwrap(),
        no_bn_bias_decay: c["no_bn_bias_decay"].as_bool().unwrap(),
        ..OptimizerConfig::default()
    };
    let cfg = StepConfig {
        precision,
        channels_last,
        label_smoothing: c["label_smoothing"].as_f64().unwrap(),
        optimizer,
    };
    let mut step = TrainStep::new(model, cfg);
    let input = |k: &str| {
        if channels_last {
            to_cl(&r[k])
        } else {
            r[k].shallow_clone()
        }
    };

    let logits = |train: bool| {
        let _autocast = precision.autocast(Device::Cpu).unwrap();
        tch::no_grad(|| step.model.forward_t(&input("x0"), train)).to_kind(tch::Kind::Float)
    };
    let e = max_abs_rel_err(&logits(false), &r["logits_eval"]);
    assert!(
        e <= tolerance,
        "{name} cl={channels_last}: eval logits rel err {e:e}"
    );

    // Train-mode logits: the first step's forward (it also updates the BN running statistics once).
    let e = max_abs_rel_err(&logits(true), &r["logits_train"]);
    assert!(
        e <= tolerance,
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
            (loss - want).abs() <= tolerance * want.abs(),
            "{name} cl={channels_last}: loss {i} {loss} vs {want}"
        );
    }
    let mut worst = (0.0, String::new());
    for (k, t) in step.model.state() {
        let want = &r[&format!("final.{k}")];
        assert_eq!(t.size(), want.size(), "{k}");
        let e = max_abs_rel_err(&t, want);
        if e > worst.0 {
            worst = (e, k);
        }
    }
    assert!(
        worst.0 <= tolerance,
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

/// timm's ResNet-D with the blur (resnetblur50d: deep stem, average-pool shortcuts, anti-aliased strides) in
/// channels_last: the same logits, losses and weights after two steps as timm's.
#[test]
fn resnetblur50d_matches_timm() {
    check_case("rblur50d_nesterov_nobnwd_ls_cl");
}

/// The same with basic blocks, where the blur follows the first conv of a block.
#[test]
fn resnetblur18d_matches_timm() {
    check_case("rblur18d_plain");
}

/// Mish for every ReLU (resnet50d_mish) against timm's `act_layer="mish"`: the same logits, losses and weights after
/// two steps, in channels_last, where the block's ReLUs are also where the fused GPU ops would have been.
#[test]
fn resnet50d_mish_matches_timm() {
    check_case("r50d_mish_nesterov_nobnwd_ls_cl");
}

/// timm's ResNet-18 with `act_layer="mish"` (torchvision's keys; basic blocks, the 7x7 stem).
#[test]
fn resnet18_mish_matches_timm() {
    check_case("r18_mish_plain");
}

/// torchvision's ResNeXt-50 (32 groups of 4 channels in each bottleneck's 3x3): the same logits, losses and weights
/// after two steps.
#[test]
fn resnext50_matches_torchvision() {
    check_case("rx50_plain");
}

/// fast.ai's xse_resnext50 as timm builds it (`seresnext50d_32x4d`: ResNet-D, 32 groups, squeeze-and-excitation)
/// in channels_last: the same logits, losses and weights after two steps as timm's.
#[test]
fn seresnext50d_matches_timm() {
    check_case("sx50d_nesterov_nobnwd_ls_cl");
}

/// fast.ai's simple self-attention (`_sa`) as the reference trainer builds it (fast.ai's module: torch's
/// spectral_norm, whose power iteration updates `weight_u` and `weight_v` in each training forward), in
/// ResNet-D's first stage in channels_last, its scale made non-zero.
#[test]
fn resnet50d_sa_matches_fast_ai_s_self_attention() {
    check_case("r50d_sa_nesterov_nobnwd_ls_cl");
}

/// The same in a basic block (ResNet-18), NCHW.
#[test]
fn resnet18_sa_matches_fast_ai_s_self_attention() {
    check_case("r18_sa_plain");
}

/// fast.ai's 2020-10 max-blur pool (`_maxblur`: kornia 0.4.1's `MaxBlurPool2d` in the stem and in ResNet-D's
/// shortcuts, as the reference trainer builds it) in channels_last: the same logits, losses and weights after two
/// steps.
#[test]
fn resnet50d_maxblur_matches_fast_ai_s_max_blur_pool() {
    check_case("r50d_maxblur_nesterov_nobnwd_ls_cl");
}

/// The same pool in ResNet-18's stem alone, NCHW, on an odd map (70 px images: the stem's is 35).
#[test]
fn resnet18_maxblur_matches_fast_ai_s_max_blur_pool() {
    check_case("r18_maxblur_plain");
}

/// fast.ai's `pool=MaxPool` (`_maxdown`: `nn.MaxPool2d(2, ceil_mode=True)` in ResNet-D's shortcuts), channels_last,
/// at 72 px where the last two shortcuts' inputs have odd sides (9 and 5, the ceil mode's extra row and column).
#[test]
fn resnet50d_maxdown_matches_fast_ai_s_max_pool_shortcuts() {
    check_case("r50d_maxdown_nesterov_nobnwd_ls_cl");
}

/// The same network's step under bf16 autocast, as both trainers take it on a CPU with bf16 instructions: the same
/// bits as the reference trainer's (`model(x)` under `torch.autocast("cpu", torch.bfloat16)`, the loss of the logits
/// as fp32) in eval and train mode and after two steps, so every op runs in PyTorch's dtype.
#[test]
fn resnet50d_maxdown_bf16_steps_are_the_reference_trainer_s_bits() {
    check_case("r50d_maxdown_nesterov_nobnwd_ls_cl_bf16");
}

/// The reference trainer's `MaxBlurPool2d` is kornia 0.4.1's, which fast.ai's entry trained with, exactly in
/// double precision: on even and odd sides, square and not, down to the 3 px reflection padding needs.
#[test]
fn the_reference_trainer_s_max_blur_pool_is_kornia_0_4_1_s() {
    let script = "import json, sys, warnings; sys.path.insert(0, 'benches')\n\
         warnings.filterwarnings('ignore')\n\
         import torch, kornia; from kornia.contrib import MaxBlurPool2d\n\
         import reference_train as ref\n\
         torch.manual_seed(0)\n\
         out = {'version': kornia.__version__}\n\
         for shape in [(2, 8, 32, 32), (3, 5, 17, 34), (1, 4, 3, 3), (2, 3, 33, 33), (1, 2, 16, 9)]:\n\
         \x20   x = torch.randn(*shape, dtype=torch.float64)\n\
         \x20   a, b = MaxBlurPool2d(3, ceil_mode=True)(x), ref.MaxBlurPool2d()(x)\n\
         \x20   out[str(shape)] = [list(a.shape), list(b.shape), (a - b).abs().max().item()]\n\
         print(json.dumps(out))";
    let got: serde_json::Value = python_from_the_repo(&["-c", script]);
    assert_eq!(got["version"], "0.4.1");
    let shapes = got
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| *k != "version");
    assert_eq!(shapes.clone().count(), 5);
    for (shape, v) in shapes {
        assert_eq!(v[0], v[1], "{shape}: kornia's shape, the reference's");
        assert_eq!(v[2].as_f64(), Some(0.0), "{shape}: largest difference");
    }
}

/// Squeeze-and-excitation on basic blocks (timm's `seresnet18`, eight channels in the first stage's).
#[test]
fn seresnet18_matches_timm() {
    check_case("sr18_plain");
}

/// Every depth has exactly torchvision's state_dict keys and shapes, and timm's variants timm's
/// (num_batches_tracked aside).
#[test]
fn every_depth_has_torchvision_keys_and_shapes() {
    let meta = meta();
    let timm = [
        "resnet18d",
        "resnet50c",
        "resnet50d",
        "resnetblur50",
        "resnetblur50d",
        "resnet101d",
        "resnetblur18d",
        "resnext50_32x4d",
        "resnext101_32x8d",
        "seresnet50",
        "seresnext50_32x4d",
        "resnext50d_32x4d",
        "seresnext50d_32x4d",
    ]
    .map(|n| n.parse::<Arch>().unwrap());
    for arch in Arch::ALL.into_iter().chain(timm) {
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

/// What the venv's Python prints (JSON) with `args`, run from the repository's root (where `benches/` is).
fn python_from_the_repo<T: serde::de::DeserializeOwned>(args: &[&str]) -> T {
    let out = common::python_output(
        args,
        Some(Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))),
        &[],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The PyTorch reference trainer (benches/reference_train.py, docs/imagenette.md) sets each step's rate as rn50's
/// schedule does: warmup, step (given and default milestones), cosine to a floor, linear, flat then cosine (its
/// default start and a given one), one cycle (its defaults and given ones), at every step of a short run, to the
/// last bit but rounding; and each step's momentum, which only one cycle moves.
#[test]
fn the_reference_trainer_s_learning_rates_are_rn50_s() {
    use rn50::train::schedule::{Decay, LrSchedule};
    let cases = [
        (
            r#"{"warmup-epochs": 1.0, "epochs": 5, "lr-schedule": "cosine", "lr-end": 0.001}"#,
            1.0,
            5.0,
            Decay::Cosine { final_lr: 0.001 },
        ),
        (
            r#"{"warmup-epochs": 0.5, "epochs": 90, "lr-schedule": "step", "lr-milestones": null}"#,
            0.5,
            90.0,
            Decay::step_for(90.0, None),
        ),
        (
            r#"{"warmup-epochs": 0.0, "epochs": 9, "lr-schedule": "step", "lr-milestones": [2.5, 6]}"#,
            0.0,
            9.0,
            Decay::step_for(9.0, Some(&[2.5, 6.0])),
        ),
        (
            r#"{"warmup-epochs": 2.0, "epochs": 7, "lr-schedule": "linear"}"#,
            2.0,
            7.0,
            Decay::Linear,
        ),
        (
            r#"{"warmup-epochs": 0.0, "epochs": 5, "lr-schedule": "flat-cos"}"#,
            0.0,
            5.0,
            Decay::FlatCosine {
                start: rn50::train::schedule::FLAT_FRACTION * 5.0,
                final_lr: 0.0,
            },
        ),
        (
            r#"{"warmup-epochs": 1.0, "epochs": 6, "lr-schedule": "flat-cos", "lr-decay-start": 3.5, "lr-end": 0.002}"#,
            1.0,
            6.0,
            Decay::FlatCosine {
                start: 3.5,
                final_lr: 0.002,
            },
        ),
        (
            r#"{"warmup-epochs": 1.25, "epochs": 5, "lr-schedule": "one-cycle", "momentum": 0.95}"#,
            1.25,
            5.0,
            Decay::OneCycle {
                initial_lr: 0.4 / rn50::train::schedule::DIV_FACTOR,
                final_lr: 0.0,
                max_momentum: 0.95,
                base_momentum: rn50::train::schedule::BASE_MOMENTUM,
            },
        ),
        (
            r#"{"warmup-epochs": 2.0, "epochs": 6, "lr-schedule": "one-cycle", "div-factor": 10.0, "base-momentum": 0.8, "lr-end": 0.001}"#,
            2.0,
            6.0,
            Decay::OneCycle {
                initial_lr: 0.04,
                final_lr: 0.001,
                max_momentum: 0.9,
                base_momentum: 0.8,
            },
        ),
    ];
    let steps_per_epoch = 7;
    let peak = 0.4;
    for (recipe, warmup, epochs, decay) in cases {
        let schedule = LrSchedule::new(peak, warmup, epochs, decay).unwrap();
        let ts: Vec<f64> = (0..epochs as usize)
            .flat_map(|e| {
                (0..steps_per_epoch)
                    .map(move |i| e as f64 + (i + 1) as f64 / steps_per_epoch as f64)
            })
            .collect();
        let script = format!(
            "import json, sys; sys.path.insert(0, 'benches'); import reference_train as ref\n\
             r = dict(ref.DEFAULTS); r.update(json.loads('{recipe}'))\n\
             print(json.dumps([(ref.lr_at(r, {peak}, t), ref.momentum_at(r, t)) \
                               for t in json.loads(sys.argv[1])]))"
        );
        let theirs: Vec<(f64, f64)> =
            python_from_the_repo(&["-c", &script, &serde_json::to_string(&ts).unwrap()]);
        assert_eq!(theirs.len(), ts.len());
        for (t, (lr, momentum)) in ts.iter().zip(theirs) {
            let ours = schedule.at(*t);
            assert!(
                (ours - lr).abs() <= 1e-12 * peak,
                "{recipe} at epoch {t}: rn50 {ours}, reference {lr}"
            );
            // Only one cycle moves the momentum; the others keep --momentum (the reference's default, 0.9).
            let ours = schedule.momentum_at(*t).unwrap_or(0.9);
            assert!(
                (ours - momentum).abs() <= 1e-12,
                "{recipe} at epoch {t}: rn50's momentum {ours}, reference {momentum}"
            );
        }
    }
}

/// The reference trainer's RandomResizedCrop takes `--scale` and `--ratio` as rn50 does: `MIN,MAX`, timm's
/// `MIN MAX`, or a recipe file's two-number lists, the flag over the file; torchvision's ranges by default; MIN above
/// MAX refused.
#[test]
fn the_reference_trainer_crops_with_the_recipe_s_scale_and_ratio() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = dir.path().join("recipe.toml");
    std::fs::write(&recipe, "scale = [0.35, 1.0]\nratio = [0.5, 2]\n").unwrap();
    let recipe = recipe.to_str().unwrap();
    let script = "import json, sys; sys.path.insert(0, 'benches'); import reference_train as ref\n\
                  out = []\n\
                  for flags in json.loads(sys.argv[1]):\n\
                  \x20   sys.argv = ['reference_train.py', 'DATA', '--out', 'OUT'] + flags\n\
                  \x20   try:\n\
                  \x20       crop = ref.transforms(ref.parse()[1])[0].transforms[1]\n\
                  \x20       out.append([list(crop.scale), list(crop.ratio)])\n\
                  \x20   except SystemExit:\n\
                  \x20       out.append(None)\n\
                  print(json.dumps(out))";
    // The crop's (scale, ratio), or None where the reference refuses the flags.
    type Ranges = Option<[[f64; 2]; 2]>;
    let cases: [(&[&str], Ranges); 6] = [
        (&[], Some([[0.08, 1.0], [0.75, 4.0 / 3.0]])),
        (
            &["--scale", "0.35,1"],
            Some([[0.35, 1.0], [0.75, 4.0 / 3.0]]),
        ),
        (
            &["--scale", "0.35", "1", "--ratio", "1,1"],
            Some([[0.35, 1.0], [1.0, 1.0]]),
        ),
        (&["--config", recipe], Some([[0.35, 1.0], [0.5, 2.0]])),
        (
            &["--config", recipe, "--scale", "0.5,0.9"],
            Some([[0.5, 0.9], [0.5, 2.0]]),
        ),
        (&["--scale", "0.9,0.5"], None),
    ];
    let flags: Vec<&[&str]> = cases.iter().map(|c| c.0).collect();
    let theirs: Vec<Ranges> =
        python_from_the_repo(&["-c", script, &serde_json::to_string(&flags).unwrap()]);
    for ((flags, want), got) in cases.iter().zip(theirs) {
        assert_eq!(got, *want, "reference_train.py {flags:?}");
    }
}

/// The reference trainer refuses a warmup as long as the run, or longer, as rn50 does (its schedule divides by
/// what is left after the warmup), and accepts a shorter one: each command line accepted by both or by neither.
#[test]
fn the_reference_trainer_refuses_a_warmup_as_long_as_the_run_as_rn50_does() {
    let script = "import json, sys; sys.path.insert(0, 'benches'); import reference_train as ref\n\
                  out = []\n\
                  for flags in json.loads(sys.argv[1]):\n\
                  \x20   sys.argv = ['reference_train.py', 'DATA', '--out', 'OUT'] + flags\n\
                  \x20   try:\n\
                  \x20       ref.parse()\n\
                  \x20       out.append(None)\n\
                  \x20   except SystemExit as e:\n\
                  \x20       out.append(str(e.code))\n\
                  print(json.dumps(out))";
    let cases: [&[&str]; 4] = [
        &["--epochs", "2", "--warmup-epochs", "1.5"],
        &["--epochs", "1", "--warmup-epochs", "1"],
        &["--epochs", "2", "--warmup-epochs", "2.5"],
        &["--epochs", "5", "--warmup-epochs", "0"],
    ];
    let theirs: Vec<Option<String>> =
        python_from_the_repo(&["-c", script, &serde_json::to_string(&cases).unwrap()]);
    let refusals = theirs.iter().filter(|t| t.is_some()).count();
    assert_eq!(refusals, 2, "{theirs:?}");
    for (flags, theirs) in cases.iter().zip(theirs) {
        let argv = [&["train", "/d"][..], flags].concat();
        let ours = common::rn50_parse_only(&argv);
        let ours_refused = !ours.status.success();
        assert_eq!(
            ours_refused,
            theirs.is_some(),
            "{flags:?}: rn50, then the reference: {theirs:?}"
        );
        if let Some(message) = theirs {
            assert_eq!(ours.status.code(), Some(2), "{flags:?}");
            let ours = String::from_utf8_lossy(&ours.stderr);
            let rule = message.trim_start_matches("reference_train.py: ");
            assert!(
                ours.contains(rule),
                "{flags:?}: rn50 says {ours:?}, the reference {message:?}"
            );
        }
    }
}

/// The reference trainer turns a recipe's switches off as rn50 does (`--no-nesterov`, `--bn-wd`, ...; the last of
/// a switch and its negation wins): for each command line, its four switches equal rn50's resolved flags.
#[test]
fn the_reference_trainer_turns_off_a_recipe_s_switches_as_rn50_does() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = dir.path().join("recipe.toml");
    std::fs::write(
        &recipe,
        "nesterov = true\nno-bn-wd = true\nzero-init-residual = true\nlookahead = true\n",
    )
    .unwrap();
    let recipe = recipe.to_str().unwrap();
    let switches = ["nesterov", "no-bn-wd", "zero-init-residual", "lookahead"];
    let script = "import json, sys; sys.path.insert(0, 'benches'); import reference_train as ref\n\
                  out, cases, keys = [], json.loads(sys.argv[1]), json.loads(sys.argv[2])\n\
                  for flags in cases:\n\
                  \x20   sys.argv = ['reference_train.py', 'DATA', '--out', 'OUT'] + flags\n\
                  \x20   r = ref.parse()[1]\n\
                  \x20   out.append([r[k] for k in keys])\n\
                  print(json.dumps(out))";
    let cases: [&[&str]; 6] = [
        &[],
        &["--no-nesterov"],
        &["--bn-wd", "--no-lookahead"],
        &["--no-zero-init-residual", "--zero-init-residual"],
        &["--no-nesterov", "--nesterov", "--no-nesterov"],
        &["--no-bn-wd", "--bn-wd", "--no-lookahead", "--lookahead"],
    ];
    let flags: Vec<Vec<&str>> = cases
        .iter()
        .map(|c| [&["--config", recipe][..], c].concat())
        .collect();
    let theirs: Vec<Vec<bool>> = python_from_the_repo(&[
        "-c",
        script,
        &serde_json::to_string(&flags).unwrap(),
        &serde_json::to_string(&switches).unwrap(),
    ]);
    for (flags, theirs) in flags.iter().zip(theirs) {
        let argv = [&["train", "/d"][..], flags].concat();
        let out = common::rn50_parse_only(&argv);
        assert!(
            out.status.success(),
            "{argv:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let ours: toml::Table = String::from_utf8_lossy(&out.stdout).parse().unwrap();
        let ours: Vec<bool> = switches
            .iter()
            .map(|k| ours[*k].as_bool().unwrap())
            .collect();
        assert_eq!(
            ours, theirs,
            "{flags:?}: rn50's {switches:?}, then the reference's"
        );
    }
}

/// Without `--precision` the reference trainer computes on the CPU in the precision rn50 would (bf16 autocast where
/// the CPU has AMX or AVX512-BF16, but for narrow convolutions on AVX512-BF16 kernels; else fp32), so the two
/// train alike on any CPU with the same flags: its rule against `Precision::resolve` for CPUs with and without
/// bf16, oneDNN caps above and below AMX and AVX512-BF16, and networks with and without a narrow convolution.
#[test]
fn the_reference_trainer_s_cpu_precision_is_rn50_s() {
    use rn50::machine::parse_cpuinfo;
    use rn50::model::NarrowestConv;
    let cpu = |vendor: &str, flags: &str| {
        format!("processor\t: 0\nvendor_id\t: {vendor}\nmodel name\t: a CPU\nflags\t\t: fpu sse avx2 {flags}\n")
    };
    let cpus = [
        cpu("GenuineIntel", "avx512f amx_bf16 amx_tile avx512_bf16"), // Sapphire Rapids
        cpu("AuthenticAMD", "avx512f avx512_bf16"),                   // Zen 4
        cpu("GenuineIntel", "avx512f"), // Ice Lake: AVX-512 without bf16
        cpu("GenuineIntel", "avx2"),
    ];
    let caps = [
        None,
        Some("AVX512_CORE_BF16"),
        Some("avx512_core_amx"),
        Some("AVX2"),
        Some("AVX512_CORE"),
        Some("ALL"),
    ];
    let mut cases = Vec::new();
    for text in &cpus {
        for cap in caps {
            for narrowest in [8, 32] {
                cases.push((text.as_str(), cap, narrowest));
            }
        }
    }
    let script = "import json, sys; sys.path.insert(0, 'benches'); import reference_train as ref\n\
                  print(json.dumps([ref.cpu_precision(*case) for case in json.loads(sys.argv[1])]))";
    let theirs: Vec<String> =
        python_from_the_repo(&["-c", script, &serde_json::to_string(&cases).unwrap()]);
    let mut seen = std::collections::BTreeSet::new();
    for ((text, cap, narrowest), theirs) in cases.iter().zip(theirs) {
        let mut info = parse_cpuinfo(text, 2);
        info.onednn_max_isa = cap.map(str::to_string);
        let ours =
            Precision::resolve(None, Device::Cpu, &info, NarrowestConv::width(*narrowest)).unwrap();
        assert_eq!(
            ours.to_string(),
            theirs,
            "{info:?} with a {narrowest}-channel convolution: rn50's, then the reference's"
        );
        seen.insert(theirs);
    }
    // Both outcomes occur: a rule that always said the same would not pass by accident.
    assert_eq!(seen.len(), 2, "{seen:?}");
}

/// `--lr-schedule one-cycle` is PyTorch's `OneCycleLR(anneal_strategy="cos", cycle_momentum=True)` for the same
/// peak, rise, divisors and momenta: from the peak on, step for step to rounding (both count the fall from the
/// peak's step to the last); during the rise within one step's change of it, since OneCycleLR's step i is at
/// i / (rise - 1) of the way up and rn50's at (i + 1) / rise (so both start the peak at the same step).
#[test]
fn one_cycle_is_pytorch_s_one_cycle_lr() {
    use rn50::train::schedule::{Decay, LrSchedule};
    let (per_epoch, epochs, warmup, peak) = (8usize, 5usize, 1.25, 0.4);
    let decay = Decay::OneCycle {
        initial_lr: peak / 10.0,
        final_lr: 0.001,
        max_momentum: 0.95,
        base_momentum: 0.85,
    };
    let schedule = LrSchedule::new(peak, warmup, epochs as f64, decay).unwrap();
    let total = per_epoch * epochs;
    let script = format!(
        "import json, torch\n\
         opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0, momentum=0.9, nesterov=True)\n\
         s = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr={peak}, total_steps={total}, pct_start={warmup} / {epochs}, \
             anneal_strategy='cos', cycle_momentum=True, base_momentum=0.85, max_momentum=0.95, div_factor=10.0, \
             final_div_factor=40.0)\n\
         out = []\n\
         for i in range({total}):\n\
         \x20   g = opt.param_groups[0]; out.append((g['lr'], g['momentum'])); opt.step()\n\
         \x20   if i + 1 < {total}: s.step()\n\
         print(json.dumps(out))"
    );
    let theirs: Vec<(f64, f64)> = python_from_the_repo(&["-c", &script]);
    assert_eq!(theirs.len(), total);
    let ours: Vec<(f64, f64)> = (0..total)
        .map(|i| {
            let t = (i + 1) as f64 / per_epoch as f64;
            (schedule.at(t), schedule.momentum_at(t).unwrap())
        })
        .collect();
    let peak_step = (warmup * per_epoch as f64) as usize - 1;
    assert_eq!(theirs[peak_step].0, peak, "OneCycleLR's peak step");
    // During the rise rn50's step i lies between OneCycleLR's steps i and i + 1 ((i + 1) / 10 of the way up
    // against i / 9 and (i + 1) / 9).
    let next_change = |i: usize| {
        let (a, b) = (theirs[i], theirs[i + 1]);
        ((a.0 - b.0).abs() + 1e-12, (a.1 - b.1).abs() + 1e-12)
    };
    for (i, (&(lr, m), &(their_lr, their_m))) in ours.iter().zip(&theirs).enumerate() {
        let (lr_tol, m_tol) = if i < peak_step {
            next_change(i)
        } else {
            (1e-12 * peak, 1e-12)
        };
        assert!(
            (lr - their_lr).abs() <= lr_tol && (m - their_m).abs() <= m_tol,
            "step {i}: rn50 lr {lr} momentum {m}, OneCycleLR {their_lr} {their_m} (tolerance {lr_tol}, {m_tol})"
        );
    }
}

/// The reference trainer builds rn50's name of each of timm's variants as timm's network with rn50's state_dict
/// keys and shapes, with the blur in the same four places (the stem and the first block of stages 2 to 4), with
/// squeeze-and-excitation in every block, and with the suffix _mish a Mish wherever rn50 has one (no ReLU left
/// but squeeze-and-excitation's, as in timm and rn50), with the suffix _sa one self-attention module, and with
/// _maxblur the max-blur pool in the stem and ResNet-D's shortcuts, no max or average pool left, and with _maxdown
/// max pools in ResNet-D's shortcuts, no average pool left.
#[test]
fn the_reference_trainer_builds_the_variants_rn50_names() {
    let names = [
        "resnet18",
        "resnet34c",
        "resnet50d",
        "resnetblur50",
        "resnetblur18d",
        "resnet50_mish",
        "resnetblur50d_mish",
        "resnext50_32x4d",
        "seresnext50d_32x4d",
        "seresnext50d_32x4d_mish",
        "seresnet18",
        "resnet50d_sa",
        "resnet18_sa",
        "seresnext50d_32x4d_mish_sa",
        "resnet50d_maxblur",
        "resnet18_maxblur",
        "seresnext50d_32x4d_maxblur_mish_sa",
        "resnet50d_maxdown",
        "resnetblur18d_maxdown_mish",
    ];
    let script = "import json, sys; sys.path.insert(0, 'benches')\n\
         import torch; from reference_train import build_model, SimpleSelfAttention, MaxBlurPool2d\n\
         from timm.layers import BlurPool2d\n\
         from timm.layers.squeeze_excite import SEModule\n\
         out = {}\n\
         for name in sys.argv[1:]:\n\
         \x20   m = build_model(name, 10, False)\n\
         \x20   count = lambda kind: sum(isinstance(x, kind) for x in m.modules())\n\
         \x20   out[name] = {'keys': {k: list(v.shape) for k, v in m.state_dict().items() \
                 if not k.endswith('num_batches_tracked')},\n\
         \x20                'blurs': count(BlurPool2d), 'mish': count(torch.nn.Mish), 'relu': count(torch.nn.ReLU),\n\
         \x20                'se': count(SEModule), 'sa': count(SimpleSelfAttention),\n\
         \x20                'maxblur': count(MaxBlurPool2d), 'maxpool': count(torch.nn.MaxPool2d),\n\
         \x20                'avgpool': count(torch.nn.AvgPool2d)}\n\
         print(json.dumps(out))";
    let mut args = vec!["-c", script];
    args.extend(names);
    let theirs: serde_json::Value = python_from_the_repo(&args);
    for name in names {
        let arch: Arch = name.parse().unwrap();
        let mut cfg = ResNetConfig::new(arch);
        cfg.num_classes = 10;
        let ours: BTreeMap<String, Vec<i64>> = Model::new(cfg, Device::Cpu)
            .state()
            .into_iter()
            .map(|(k, t)| (k, t.size()))
            .collect();
        let want: BTreeMap<String, Vec<i64>> =
            serde_json::from_value(theirs[name]["keys"].clone()).unwrap();
        assert_eq!(ours, want, "{name}");
        let blurs = if arch.blur { 4 } else { 0 };
        assert_eq!(theirs[name]["blurs"], blurs, "{name}");
        let blocks: usize = arch.layers().iter().sum();
        let se = if arch.se { blocks } else { 0 };
        assert_eq!(theirs[name]["se"], se, "{name}");
        assert_eq!(theirs[name]["sa"], u64::from(arch.sa), "{name}");
        // The stem's max pool, and ResNet-D's three strided shortcuts' pools (average pools without it).
        let shortcut_pools = if arch.avg_down() { 3 } else { 0 };
        let (maxblur, maxpool, avgpool) = match arch.pool {
            Pool::MaxBlur => (1 + shortcut_pools, 0, 0),
            Pool::MaxDown => (0, 1 + shortcut_pools, 0),
            Pool::Timm => (0, 1, shortcut_pools),
        };
        assert_eq!(
            [
                &theirs[name]["maxblur"],
                &theirs[name]["maxpool"],
                &theirs[name]["avgpool"]
            ],
            [maxblur, maxpool, avgpool],
            "{name}: max-blur pools, max pools, average pools"
        );
        let (mish, relu) = (&theirs[name]["mish"], &theirs[name]["relu"]);
        if arch.mish {
            assert!(
                mish.as_u64() > Some(0) && relu == se,
                "{name}: {mish} Mish, {relu} ReLU"
            );
        } else {
            assert!(
                mish == 0 && relu.as_u64() > Some(0),
                "{name}: {mish} Mish, {relu} ReLU"
            );
        }
    }
}

/// `--optimizer adamw`, `radam` and `--lookahead` update as the reference trainer's torch.optim.AdamW,
/// torch.optim.RAdam(decoupled_weight_decay=True) and its Lookahead (fast.ai's) do: the same 14 gradients, a rate
/// and a β1 that change every step (one cycle's), a decayed matrix and an undecayed vector (--no-bn-wd), give the
/// same parameters and moments to rounding. RAdam's first steps (ρt ≤ 5, an SGD-like step) and its rectified ones
/// are both covered; with k 3 Lookahead synchronises four times.
#[test]
fn adamw_radam_and_lookahead_are_the_reference_trainer_s() {
    use rn50::step::{AdamConfig, AdamKind, LookaheadConfig, Optimizer};
    use tch::Kind;
    let steps = 14;
    tch::manual_seed(7);
    let w0 = Tensor::randn([3, 4], (Kind::Float, Device::Cpu));
    let b0 = Tensor::randn([4], (Kind::Float, Device::Cpu));
    let grads: Vec<(Tensor, Tensor)> = (0..steps)
        .map(|_| {
            (
                Tensor::randn([3, 4], (Kind::Float, Device::Cpu)),
                Tensor::randn([4], (Kind::Float, Device::Cpu)) * 0.1,
            )
        })
        .collect();
    let lrs: Vec<f64> = (0..steps).map(|i| 0.01 * (1 + i % 3) as f64).collect();
    let moms: Vec<f64> = (0..steps).map(|i| 0.95 - 0.005 * i as f64).collect();
    let flat = |t: &Tensor| Vec::<f32>::try_from(t.flatten(0, -1)).unwrap();
    let cases = [
        (AdamKind::Adamw, 0.999, 1e-8, 0.1, None),
        (AdamKind::Radam, 0.99, 1e-6, 0.01, None),
        (
            AdamKind::Radam,
            0.99,
            1e-6,
            0.01,
            Some(LookaheadConfig { k: 3, alpha: 0.5 }),
        ),
    ];
    for (kind, beta2, eps, wd, lookahead) in cases {
        let w = w0.copy().set_requires_grad(true);
        let b = b0.copy().set_requires_grad(true);
        let config = OptimizerConfig {
            momentum: moms[0],
            weight_decay: wd,
            nesterov: false,
            no_bn_bias_decay: true,
            lars_eta: None,
            adam: Some(AdamConfig { kind, beta2, eps }),
            lookahead,
        };
        let mut opt = Optimizer::new(
            vec![
                ("w".into(), w.shallow_clone()),
                ("b".into(), b.shallow_clone()),
            ],
            config,
        );
        for (i, (gw, gb)) in grads.iter().enumerate() {
            opt.zero_grad();
            ((&w * gw).sum(Kind::Float) + (&b * gb).sum(Kind::Float)).backward();
            opt.step(lrs[i], moms[i], None).unwrap();
        }
        let recipe = serde_json::json!({
            "optimizer": if kind == AdamKind::Adamw { "adamw" } else { "radam" },
            "beta2": beta2, "opt-eps": eps, "wd": wd, "momentum": moms[0],
            "lookahead": lookahead.is_some(), "lookahead-k": lookahead.map(|l| l.k),
            "lookahead-alpha": lookahead.map(|l| l.alpha),
        });
        let inputs = serde_json::json!({
            "recipe": recipe, "w": flat(&w0), "b": flat(&b0), "lrs": lrs, "moms": moms,
            "grads": grads.iter().map(|(gw, gb)| (flat(gw), flat(gb))).collect::<Vec<_>>(),
        });
        let script = "import json, sys, torch; sys.path.insert(0, 'benches'); import reference_train as ref\n\
             a = json.loads(sys.argv[1]); r = dict(ref.DEFAULTS); r.update(a['recipe'])\n\
             w = torch.nn.Parameter(torch.tensor(a['w']).view(3, 4)); b = torch.nn.Parameter(torch.tensor(a['b']))\n\
             model = torch.nn.ParameterList([w, b])\n\
             opt = ref.optimizer(r, [{'params': [w], 'weight_decay': r['wd']}, {'params': [b], 'weight_decay': 0.0}], a['lrs'][0])\n\
             la = ref.Lookahead(model, r) if r['lookahead'] else None\n\
             for lr, mom, (gw, gb) in zip(a['lrs'], a['moms'], a['grads']):\n\
             \x20   for g in opt.param_groups: g['lr'] = lr; g['betas'] = (mom, g['betas'][1])\n\
             \x20   w.grad = torch.tensor(gw).view(3, 4); b.grad = torch.tensor(gb)\n\
             \x20   opt.step()\n\
             \x20   if la: la.after_step(True)\n\
             s = opt.state[w]\n\
             print(json.dumps([w.detach().flatten().tolist(), b.detach().flatten().tolist(), \
                               s['exp_avg'].flatten().tolist(), s['exp_avg_sq'].flatten().tolist()]))";
        let theirs: [Vec<f32>; 4] = python_from_the_repo(&["-c", script, &inputs.to_string()]);
        let state: BTreeMap<String, Tensor> = opt.state().into_iter().collect();
        let ours = [
            flat(&w),
            flat(&b),
            flat(&state["optim.exp_avg.w"]),
            flat(&state["optim.exp_avg_sq.w"]),
        ];
        for (what, (o, t)) in ["w", "b", "exp_avg", "exp_avg_sq"]
            .iter()
            .zip(ours.iter().zip(&theirs))
        {
            let e = max_abs_rel_err(&Tensor::from_slice(o), &Tensor::from_slice(t));
            assert!(
                e < 1e-5,
                "{kind:?} {lookahead:?}: {what} rel err {e:e}\nrn50 {o:?}\nreference {t:?}"
            );
        }
        assert_eq!(i64::try_from(&state["optim.step"]).unwrap(), steps as i64);
        // The parameters moved: a test of nothing would pass the comparison too.
        assert!(flat(&w)
            .iter()
            .zip(flat(&w0))
            .any(|(a, b)| (a - b).abs() > 1e-3));
        assert_eq!(state.contains_key("optim.slow.w"), lookahead.is_some());
    }
}
