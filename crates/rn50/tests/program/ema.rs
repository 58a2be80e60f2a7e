//! `--ema` without the trap (issue 38): the trained weights and their moving average are both evaluated, logged
//! (metrics.jsonl, TensorBoard, the epoch's line) and kept (best.safetensors, best_ema.safetensors), and a decay
//! whose horizon outlasts the run is warned of at the start.
use crate::common;

use std::path::Path;

use common::{image_tree, metrics, rn50, TinyTrain};

/// `rn50 eval`'s top-1 of `weights` on `data`'s validation images (the sizes the weights record).
fn eval_acc1(data: &Path, weights: &Path) -> f64 {
    let json = weights.with_extension("eval.json");
    let r = rn50(&[
        "eval",
        data.to_str().unwrap(),
        "--weights",
        weights.to_str().unwrap(),
        "-b",
        "2",
        "--device",
        "cpu",
        "--precision",
        "fp32",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    v["acc1"].as_f64().unwrap()
}

fn best(values: impl Iterator<Item = Option<f64>>) -> f64 {
    values.map(Option::unwrap).fold(f64::NAN, f64::max)
}

/// timm's default decay 0.9998 on an 8-step run: the average is still about the initial weights, so scoring
/// only it (as rn50 did) showed chance accuracy every epoch. Now `acc1` is the trained weights' (the same as
/// `rn50 eval` of final.safetensors gives) and `ema_acc1` the average's, each with its best file, and `-e` on the
/// run's checkpoint prints both.
#[test]
fn the_trained_weights_and_their_average_are_both_evaluated_logged_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let (data, out) = (dir.path().join("data"), dir.path().join("run"));
    image_tree(&data, "train", 4, 2);
    image_tree(&data, "val", 4, 2);
    let sizes = "--width 8 -b 2 --image-size 32 --val-resize 36 --val-crop 32 --precision fp32 --ema 0.9998";
    let r = TinyTrain::on(&data, &out)
        .flags(sizes)
        .flags("--epochs 2 -p 1")
        .output();
    let log = String::from_utf8_lossy(&r.stderr);
    assert!(r.status.success(), "{log}");
    assert!(
        log.contains(
            "--ema 0.9998 averages over about 5000 updates (1/(1-decay)), more than the 8 of this run"
        ),
        "{log}"
    );
    assert_eq!(
        log.lines()
            .filter(|l| l.contains(" INFO epoch ") && l.contains("  EMA Acc@1 "))
            .count(),
        2,
        "each epoch's line has both: {log}"
    );

    let m = metrics(&out);
    assert_eq!(m.len(), 2);
    for e in &m {
        assert!(
            e.acc1.is_some()
                && e.ema_acc1.is_some()
                && e.ema_acc5.is_some()
                && e.ema_val_loss.is_some(),
            "{e:?}"
        );
    }
    let close = |a: f64, b: f64| (a - b).abs() < 1e-6;
    let (last, ema_best) = (m[1].acc1.unwrap(), best(m.iter().map(|e| e.ema_acc1)));
    assert!(close(
        eval_acc1(&data, &out.join("final.safetensors")),
        last
    ));
    let best_acc1 = best(m.iter().map(|e| e.acc1));
    assert!(close(
        eval_acc1(&data, &out.join("best.safetensors")),
        best_acc1
    ));
    assert!(close(
        eval_acc1(&data, &out.join("best_ema.safetensors")),
        ema_best
    ));

    let summary: rn50_report::TrainSummary =
        serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary.best_acc1, Some(best_acc1));
    assert_eq!(summary.best_ema_acc1, Some(ema_best));

    // TensorBoard: the average's tags at each epoch's end, beside val/acc1.
    let mut shown = Vec::new();
    for f in std::fs::read_dir(out.join("tensorboard")).unwrap() {
        shown.extend(rn50_report::tensorboard::read_scalars(&f.unwrap().path()).unwrap());
    }
    for tag in rn50_report::tensorboard::EMA_TAGS
        .iter()
        .chain(&["val/acc1"])
    {
        let n = shown.iter().filter(|s| s.tag == *tag).count();
        assert_eq!(n, 2, "{tag} in {shown:?}");
    }

    // -e on the run's checkpoint: a start line that says what it evaluates, and both accuracies.
    let r = TinyTrain::on(&data, &out)
        .flags(sizes)
        .flags("-e --resume")
        .args([&out])
        .output();
    let (stdout, log) = (
        String::from_utf8_lossy(&r.stdout),
        String::from_utf8_lossy(&r.stderr),
    );
    assert!(r.status.success(), "{log}");
    assert!(
        log.contains("rn50 train -e: evaluating resnet18 on ")
            && log.contains("from the checkpoint ")
            && log.contains(" and its EMA, batch 2 x 1 procs, resize 36 then center crop 32"),
        "{log}"
    );
    assert!(!log.contains("global batch"), "{log}");
    let line = |prefix: &str, acc1: f64| format!("{prefix}Acc@1 {acc1:.3} ");
    assert!(stdout.contains(&line("", last)), "{stdout}");
    assert!(
        stdout.contains(&line("EMA ", m[1].ema_acc1.unwrap())),
        "{stdout}"
    );

    // A run without --ema that replaces this one leaves no average of the earlier run behind.
    let r = TinyTrain::on(&data, &out)
        .flags(
            "--width 8 -b 2 --image-size 32 --val-resize 36 --val-crop 32 --epochs 1 --overwrite",
        )
        .output();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert!(!out.join("best_ema.safetensors").exists());
    assert!(metrics(&out).iter().all(|e| e.ema_acc1.is_none()));
}

/// A decay whose horizon fits the run is not warned of.
#[test]
fn an_ema_that_fits_the_run_is_not_warned_of() {
    let dir = tempfile::tempdir().unwrap();
    let r = TinyTrain::dummy(&dir.path().join("run"))
        .flags("--width 8 -b 2 --image-size 32 --epochs 1 --steps-per-epoch 4 --ema 0.5")
        .output();
    let log = String::from_utf8_lossy(&r.stderr);
    assert!(r.status.success(), "{log}");
    assert!(!log.contains("averages over"), "{log}");
}
