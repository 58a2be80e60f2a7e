//! `rn50 eval` end to end on real ImageNet photos in an ImageFolder tree: every image counted once, the
//! right labels, and clear errors when weights and data do not fit.
use crate::common;

use std::path::Path;

use common::{image_tree, rn50};

use rn50::model::{weights, Arch, Model, ResNetConfig};
use tch::{Device, Tensor};

/// ResNet-18 weights whose logits ignore the image and always favour class `winner`.
fn constant_weights(path: &Path, classes: i64, winner: i64) {
    named_constant_weights(path, classes, winner, None)
}

/// [`constant_weights`] recording `names` as the classes they were trained on.
fn named_constant_weights(path: &Path, classes: i64, winner: i64, names: Option<&[String]>) {
    let mut cfg = ResNetConfig::new(Arch::ResNet18);
    cfg.num_classes = classes;
    let model = Model::new(cfg, Device::Cpu);
    tch::no_grad(|| {
        for (k, mut t) in model.state() {
            if k == "fc.weight" {
                let _ = t.zero_();
            } else if k == "fc.bias" {
                let mut b = vec![0f32; classes as usize];
                b[winner as usize] = 5.0;
                t.copy_(&Tensor::from_slice(&b));
            }
        }
    });
    weights::save(&model, path, &weights::Recorded::with_classes(names)).unwrap();
}

#[test]
fn eval_counts_every_image_once_with_the_right_labels() {
    let dir = tempfile::tempdir().unwrap();
    image_tree(dir.path(), "val", 3, 2);
    let w = dir.path().join("w.safetensors");
    constant_weights(&w, 3, 1);
    let json = dir.path().join("eval.json");
    let out = rn50(&[
        "eval",
        "-a",
        "resnet18",
        "--weights",
        w.to_str().unwrap(),
        "-b",
        "4",
        "-j",
        "2",
        "--device",
        "cpu",
        "--precision",
        "fp32",
        "--json",
        json.to_str().unwrap(),
        dir.path().to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["images"], 6);
    // Always predicting class 1: exactly its two images are right; with 3 classes top-"5" is everything.
    assert!(
        (v["acc1"].as_f64().unwrap() - 100.0 / 3.0).abs() < 1e-9,
        "{v}"
    );
    assert_eq!(v["acc5"].as_f64().unwrap(), 100.0);
    assert!(String::from_utf8_lossy(&out.stdout).contains("Acc@1 33.333"));
}

#[test]
fn eval_rejects_weights_for_another_class_count() {
    let dir = tempfile::tempdir().unwrap();
    image_tree(dir.path(), "val", 2, 2);
    let w = dir.path().join("w.safetensors");
    constant_weights(&w, 3, 0);
    let out = rn50(&[
        "eval",
        "-a",
        "resnet18",
        "--weights",
        w.to_str().unwrap(),
        dir.path().to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("has 2 classes but"),
        "{err}"
    );
    assert!(!err.contains("panicked"));
    let out = rn50(&[
        "eval",
        "-a",
        "resnet34",
        "--weights",
        w.to_str().unwrap(),
        dir.path().to_str().unwrap(),
    ]);
    assert!(!out.status.success());
}

/// Weights that record their classes (rn50 writes them, issue 26) are scored only on data with those classes in
/// the same order: the same count of other classes would score each image against another class's label.
#[test]
fn eval_rejects_data_whose_class_names_differ_from_the_weights() {
    let dir = tempfile::tempdir().unwrap();
    image_tree(dir.path(), "val", 3, 1);
    let mut names: Vec<String> = std::fs::read_dir(dir.path().join("val"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let eval = |names: &[String]| {
        let w = dir.path().join("w.safetensors");
        named_constant_weights(&w, 3, 0, Some(names));
        rn50(&[
            "eval",
            "-a",
            "resnet18",
            "--weights",
            w.to_str().unwrap(),
            "--device",
            "cpu",
            "--resize",
            "64",
            "--crop",
            "64",
            dir.path().to_str().unwrap(),
        ])
    };
    let out = eval(&names);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let swapped = [names[1].clone(), names[0].clone(), names[2].clone()];
    let out = eval(&swapped);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("class 0 is")
            && err.contains(&names[1])
            && err.contains("labels would not line up"),
        "{err}"
    );
}

/// The stderr and stdout of a successful `rn50` run.
fn ok(args: &[&str]) -> (String, String) {
    let out = rn50(args);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "{args:?}: {stderr}");
    (stdout, stderr)
}

/// The number after "Acc@1" in eval's result line.
fn acc1(stdout: &str) -> String {
    let words: Vec<&str> = stdout.split_whitespace().collect();
    let i = words.iter().position(|w| *w == "Acc@1").expect(stdout);
    words[i + 1].to_string()
}

/// Issue 38, item 3: weights describe themselves. A ResNet-18 of width 8 trained at 64 px (evaluated 72 → 64)
/// records it: `eval`, `classify` and `export` run it without `-a` or size flags, say so, and a flag overrides;
/// its training checkpoint is accepted as weights; weights made elsewhere keep torchvision's 256 → 224.
#[test]
fn weights_record_their_network_and_evaluation_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    image_tree(&data, "train", 3, 2);
    image_tree(&data, "val", 3, 1);
    let run = dir.path().join("run");
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let (d, r) = (s(&data), s(&run));
    let mut train = vec!["train", &d, "--out", &r];
    train.extend(
        "-a resnet18 --width 8 -b 3 -j 1 --steps-per-epoch 1 --epochs 1 --image-size 64 --val-resize 72 \
         --val-crop 64 --device cpu --precision fp32"
            .split_whitespace(),
    );
    ok(&train);
    let (final_w, ckpt) = (
        s(&run.join("final.safetensors")),
        s(&run.join("checkpoint.safetensors")),
    );
    let eval = |weights: &str, extra: &[&str]| {
        let mut a = vec![
            "eval",
            &d,
            "--weights",
            weights,
            "--device",
            "cpu",
            "-b",
            "3",
        ];
        a.extend_from_slice(extra);
        ok(&a)
    };
    let (out, log) = eval(&final_w, &[]);
    assert!(
        log.contains("rn50 eval: resnet18 (recorded; width 8, ImageNet stem, 3 classes)")
            && log.contains("resize 72 (recorded) then center crop 64 (recorded)")
            && log.contains("trained at 64 px"),
        "{log}"
    );
    let recorded_acc = acc1(&out);
    // A flag overrides what is recorded, under train's name or eval's older one.
    for flag in ["--val-crop", "--crop"] {
        let (_, log) = eval(&final_w, &[flag, "56"]);
        assert!(
            log.contains("resize 72 (recorded) then center crop 56 (--val-crop)"),
            "{log}"
        );
    }
    let (_, log) = eval(&final_w, &["--val-resize", "64", "-a", "resnet18"]);
    assert!(
        log.contains("resnet18 (-a;") && log.contains("resize 64 (--val-resize)"),
        "{log}"
    );
    // A crop larger than the recorded resize names where each came from (exit 2).
    let out = rn50(&[
        "eval",
        &d,
        "--weights",
        &final_w,
        "--device",
        "cpu",
        "--val-crop",
        "80",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--val-crop 80 is larger than the recorded resize 72"),
        "{err}"
    );

    // The run's checkpoint is weights too: the model's, recorded the same way.
    let (out, log) = eval(&ckpt, &[]);
    assert!(log.contains("center crop 64 (recorded)"), "{log}");
    assert_eq!(acc1(&out), recorded_acc);
    let photo = common::imagenet_photos()[0].clone();
    let (out, log) = ok(&[
        "classify",
        photo.to_str().unwrap(),
        "--weights",
        &ckpt,
        "--device",
        "cpu",
    ]);
    assert!(
        log.contains("rn50 classify: resnet18 (recorded;")
            && log.contains("center crop 64 (recorded)"),
        "{log}"
    );
    assert_eq!(out.lines().count(), 4, "{out}");
    let (model, json) = (dir.path().join("m.pt"), dir.path().join("m.json"));
    ok(&[
        "export",
        "--weights",
        &ckpt,
        "--out",
        model.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ]);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["arch"], "resnet18");
    assert_eq!(v["image_size"], 64);
    assert_eq!(v["eval_transform"]["resize"], 72);
    assert_eq!(v["eval_transform"]["crop"], 64);
    assert_eq!(v["eval_transform"]["interpolation"], "bilinear");

    // Weights made elsewhere record none of it: torchvision's defaults, said as such.
    let foreign = dir.path().join("foreign.safetensors");
    constant_weights(&foreign, 3, 0);
    let (_, log) = eval(foreign.to_str().unwrap(), &["-a", "resnet18"]);
    assert!(
        log.contains("resize 256 (default) then center crop 224 (default)")
            && !log.contains("trained at"),
        "{log}"
    );
}

/// Issue 44: `train --image-size 64` without --val-resize/--val-crop evaluated every epoch at 256 → 224, with no
/// word (35.8% where the same weights gave 57.4% at 73 → 64). The evaluation now follows the training size (crop
/// 64, resize 64 / 0.875 = 73), the start line says so and why, config.toml and the weights record it; --val-crop
/// alone sets the resize from it; a mismatch on purpose is still taken as given.
#[test]
fn the_evaluation_follows_the_training_size_unless_told_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    image_tree(&data, "train", 3, 1);
    image_tree(&data, "val", 3, 1);
    let d = data.to_str().unwrap().to_string();
    let train = |name: &str, extra: &str| {
        let run = dir.path().join(name);
        let r = run.to_str().unwrap().to_string();
        let mut a = vec!["train", &d, "--out", &r];
        let flags = format!(
            "-a resnet18 --width 8 -b 3 -j 1 --steps-per-epoch 1 --epochs 1 --image-size 64 --device cpu \
             --precision fp32 {extra}"
        );
        a.extend(flags.split_whitespace());
        let (_, log) = ok(&a);
        let config = std::fs::read_to_string(run.join("config.toml")).unwrap();
        let (_, eval_log) = ok(&[
            "eval",
            &d,
            "--weights",
            run.join("final.safetensors").to_str().unwrap(),
            "--device",
            "cpu",
        ]);
        (log, config, eval_log)
    };
    let (log, config, eval_log) = train("derived", "");
    assert!(
        log.contains(
            "evaluates at resize 73 then center crop 64 (from --image-size 64: the crop it, the resize it / 0.875"
        ),
        "{log}"
    );
    assert!(
        config.contains("val-resize = 73") && config.contains("val-crop = 64"),
        "{config}"
    );
    assert!(
        eval_log.contains("resize 73 (recorded) then center crop 64 (recorded)"),
        "{eval_log}"
    );
    let (log, _, eval_log) = train("crop", "--val-crop 56");
    assert!(
        log.contains("evaluates at resize 64 then center crop 56 (--val-crop, and the resize from it / 0.875)"),
        "{log}"
    );
    assert!(
        eval_log.contains("resize 64 (recorded) then center crop 56"),
        "{eval_log}"
    );
    let (log, config, _) = train("given", "--val-resize 256 --val-crop 224");
    assert!(
        log.contains("evaluates at resize 256 then center crop 224 (--val-resize and --val-crop)"),
        "{log}"
    );
    assert!(config.contains("val-resize = 256"), "{config}");
}
