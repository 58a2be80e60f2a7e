//! `rn50 eval` end to end on real ImageNet photos in an ImageFolder tree: every image counted once, the
//! right labels, and clear errors when weights and data do not fit.
mod common;

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
