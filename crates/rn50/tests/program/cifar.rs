//! Real convergence on real data: a CIFAR-stem ResNet-18 from the same code, 8 channels wide, trained for 5 epochs
//! on a 10,000-image subset of CIFAR-10 (32 px crops with padding and flips), must beat the ~40% a linear classifier
//! reaches on the test images by a clear margin.
//!
//! The size of the run is what the suite can afford: it was the longest test, and about a fifth of the CPU time of
//! this binary. Measured alone on the 2-core CI machine (AMD EPYC, fp32, `OMP_WAIT_POLICY=PASSIVE`, seconds of
//! wall-clock and CPU, test accuracy after each epoch):
//!
//! | run | wall | CPU | accuracy per epoch |
//! | --- | ---: | ---: | --- |
//! | width 16, 4 epochs (until 2026-11-28) | 191 | 240 | 31.5, 41.9, 54.3, 59.2 |
//! | **width 8, 5 epochs** | 92 | 163 | 20.2, 44.2, 47.1, 49.4, 57.0 |
//! | width 8, 4 epochs | 80 | 140 | 20.2, 44.1, 45.9, 53.6 |
//! | width 16, 2 epochs (warm-up 0.5) | 89 | 165 | 36.9, 46.6 |
//! | width 16, 4 epochs on 500 images a class | 93 | 173 | 18.8, 32.1, 38.1, 45.3 |
use crate::common;

use std::path::Path;
use std::process::Command;

use common::{metrics_lines, rn50, shared_data};

/// `dst/<split>/<class>/` with links to the first `n` images of each class of `src/<from>/`.
fn subset(src: &Path, from: &str, dst: &Path, split: &str, n: usize) {
    for class in std::fs::read_dir(src.join(from)).unwrap() {
        let class = class.unwrap().path();
        let out = dst.join(split).join(class.file_name().unwrap());
        std::fs::create_dir_all(&out).unwrap();
        let mut files: Vec<_> = std::fs::read_dir(&class)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        assert!(
            files.len() >= n,
            "{} has {} images",
            class.display(),
            files.len()
        );
        for f in &files[..n] {
            std::os::unix::fs::symlink(f, out.join(f.file_name().unwrap())).unwrap();
        }
    }
}

#[test]
fn cifar10_subset_beats_the_linear_baseline() {
    let dir = tempfile::tempdir().unwrap();
    let full = dir.path().join("cifar10");
    std::fs::create_dir_all(&full).unwrap();
    let tar = shared_data().join("cifar10-jpeg.tar.gz");
    let ok = Command::new("tar")
        .arg("xzf")
        .arg(&tar)
        .arg("-C")
        .arg(&full)
        .status()
        .unwrap();
    assert!(ok.success(), "extracting {}", tar.display());
    let data = dir.path().join("subset");
    subset(&full, "train", &data, "train", 1000);
    subset(&full, "test", &data, "val", 200);

    let out = dir.path().join("run");
    // Not `common::TinyTrain`: a real run, on the device `auto` picks (a GPU where there is one), not the CPU.
    let r = rn50(&[
        "train",
        data.to_str().unwrap(),
        "-a",
        "resnet18",
        "--width",
        "8",
        "--augment",
        "cifar",
        "--image-size",
        "32",
        "-b",
        "128",
        "--epochs",
        "5",
        "--lr-base",
        "0.4",
        "--warmup-epochs",
        "1",
        "--lr-schedule",
        "linear",
        "--label-smoothing",
        "0.1",
        "--nesterov",
        "--wd",
        "5e-4",
        "--seed",
        "1",
        "--out",
        out.to_str().unwrap(),
    ]);
    let log = String::from_utf8_lossy(&r.stderr);
    assert!(r.status.success(), "{log}");
    let accs: Vec<f64> = metrics_lines(&out)
        .iter()
        .map(|m| m.acc1.unwrap())
        .collect();
    assert_eq!(accs.len(), 5, "{accs:?}");
    let last = *accs.last().unwrap();
    assert!(
        last >= 52.0,
        "test accuracy {last:.2}% after 5 epochs (per epoch: {accs:?}); a linear classifier gets ~40%\n{log}"
    );
    // The run's report: summary table, CSV and plots.
    for f in [
        "summary.json",
        "summary.md",
        "metrics.csv",
        "loss.png",
        "accuracy.png",
        "lr.png",
    ] {
        assert!(out.join(f).is_file(), "{f} missing");
    }
    let summary: rn50_report::TrainSummary =
        rn50_report::schema::read_json(&out.join("summary.json")).unwrap();
    assert_eq!(summary.acc1, Some(last));
    assert_eq!(summary.global_batch, 128);
}
