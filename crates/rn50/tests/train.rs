//! `rn50 train` end to end: an ImageNet-shaped folder of real photos, ResNet-50 at 224 px for a few steps,
//! evaluation, checkpoints, resume; SIGTERM gives a resumable checkpoint; bad data layouts are clear errors.
mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use common::{image_tree, rn50};

/// DATA/{train,val}/<wnid>/: `classes` classes with 2 training copies, the first `val_classes` with 1 val copy.
fn tree(root: &Path, classes: usize, val_classes: usize) {
    image_tree(root, "train", classes, 2);
    image_tree(root, "val", val_classes, 1);
}

fn lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn resnet50_trains_evaluates_checkpoints_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    tree(&data, 4, 4);
    let out = dir.path().join("run");
    let (d, o) = (data.to_str().unwrap(), out.to_str().unwrap());
    let common = [
        "train",
        d,
        "-a",
        "resnet50",
        "-b",
        "4",
        "-j",
        "2",
        "--steps-per-epoch",
        "2",
        "--device",
        "cpu",
    ];
    let r = rn50(&[&common[..], &["--epochs", "2", "--out", o, "-p", "1"]].concat());
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let m = lines(&out.join("metrics.jsonl"));
    assert_eq!(m.len(), 2);
    for rec in &m {
        assert!(rec["train_loss"].as_f64().unwrap().is_finite());
        let acc1 = rec["acc1"].as_f64().unwrap();
        assert!(
            (0.0..=100.0).contains(&acc1) && (acc1 * 4.0 / 100.0).fract() == 0.0,
            "4 val images: {acc1}"
        );
    }
    for f in [
        "checkpoint.safetensors",
        "best.safetensors",
        "final.safetensors",
    ] {
        assert!(out.join(f).exists(), "{f}");
    }
    // Resume for one more epoch: only epoch 2 runs.
    let ckpt = out.join("checkpoint.safetensors");
    let r = rn50(
        &[
            &common[..],
            &[
                "--epochs",
                "3",
                "--out",
                o,
                "--resume",
                ckpt.to_str().unwrap(),
            ],
        ]
        .concat(),
    );
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let m = lines(&out.join("metrics.jsonl"));
    assert_eq!(
        m.iter()
            .map(|r| r["epoch"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [0, 1, 2]
    );
    // The trained weights evaluate with `rn50 eval` as well.
    let final_w = out.join("final.safetensors");
    let r = rn50(&[
        "eval",
        "-a",
        "resnet50",
        "--weights",
        final_w.to_str().unwrap(),
        d,
        "-b",
        "4",
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
}

#[test]
fn sigterm_saves_a_resumable_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let mut child = Command::new(env!("CARGO_BIN_EXE_rn50"))
        .args([
            "train",
            "--dummy",
            "-a",
            "resnet18",
            "-b",
            "2",
            "--image-size",
            "32",
            "--epochs",
            "1",
        ])
        .args([
            "--steps-per-epoch",
            "100000",
            "-p",
            "1",
            "--device",
            "cpu",
            "--precision",
            "fp32",
        ])
        .arg("--out")
        .arg(&out)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until it reports its third step, then ask it to stop as SLURM would.
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("[    3/") {
        line.clear();
        assert!(
            err.read_line(&mut line).unwrap() > 0,
            "rn50 train ended before training"
        );
    }
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(3), "preemption exit code");
    let (pos, cfg) =
        rn50::train::checkpoint::read_meta(&out.join("checkpoint.safetensors")).unwrap();
    assert_eq!(pos.epoch, 0);
    assert!(pos.batch_in_epoch >= 3, "{pos:?}");
    assert_eq!(cfg["arch"], "resnet18");
}

#[test]
fn mismatched_class_sets_are_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    tree(dir.path(), 3, 2);
    let r = rn50(&[
        "train",
        dir.path().to_str().unwrap(),
        "-a",
        "resnet18",
        "--device",
        "cpu",
    ]);
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(
        !r.status.success() && err.contains("must be the same set"),
        "{err}"
    );
    assert!(!err.contains("panicked"));
    let r = rn50(&[
        "train",
        dir.path().join("nope").to_str().unwrap(),
        "--device",
        "cpu",
    ]);
    assert!(!r.status.success() && String::from_utf8_lossy(&r.stderr).contains("opening"));
}

/// (epoch, step) → loss from a run's steps.jsonl.
fn step_losses(run: &Path) -> std::collections::BTreeMap<(u64, u64), f64> {
    lines(&run.join("steps.jsonl"))
        .iter()
        .map(|r| {
            (
                (r["epoch"].as_u64().unwrap(), r["step"].as_u64().unwrap()),
                r["loss"].as_f64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn resuming_mid_epoch_reproduces_the_uninterrupted_losses_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    tree(&data, 4, 4);
    let d = data.to_str().unwrap();
    let args = |run: &Path| -> Vec<String> {
        let flags =
            "-a resnet18 -b 1 -j 2 --image-size 64 --val-resize 73 --val-crop 64 --epochs 2 \
                     --steps-per-epoch 6 -p 1 --device cpu --precision fp32";
        let mut v = vec![
            "train".to_string(),
            d.to_string(),
            "--out".into(),
            run.to_str().unwrap().into(),
        ];
        v.extend(flags.split_whitespace().map(String::from));
        v
    };
    let whole = dir.path().join("whole");
    let r = Command::new(env!("CARGO_BIN_EXE_rn50"))
        .args(args(&whole))
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let want = step_losses(&whole);
    assert_eq!(want.len(), 12);

    // Interrupt a second run with SIGTERM after its second step, then resume it.
    let part = dir.path().join("part");
    let mut child = Command::new(env!("CARGO_BIN_EXE_rn50"))
        .args(args(&part))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("[    2/") {
        line.clear();
        assert!(err.read_line(&mut line).unwrap() > 0, "ended early");
    }
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert_eq!(child.wait().unwrap().code(), Some(3));
    let ckpt = part.join("checkpoint.safetensors");
    let (pos, _) = rn50::train::checkpoint::read_meta(&ckpt).unwrap();
    assert!(
        pos.epoch == 0 && (2..4).contains(&pos.batch_in_epoch),
        "{pos:?}"
    );
    let mut resume = args(&part);
    resume.extend(["--resume".to_string(), ckpt.to_str().unwrap().to_string()]);
    let r = Command::new(env!("CARGO_BIN_EXE_rn50"))
        .args(&resume)
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));

    let got = step_losses(&part);
    assert_eq!(got.len(), 12, "every step logged once: {got:?}");
    for (k, loss) in &want {
        assert_eq!(
            got[k].to_bits(),
            loss.to_bits(),
            "step {k:?}: {} vs {loss}",
            got[k]
        );
    }
}
