//! Batch norm across data-parallel ranks (issue 24): DDP's broadcast_buffers (rank 0's running statistics on
//! every rank after each step, so that all ranks evaluate and checkpoint one model) and `--sync-bn` (the batch
//! statistics of all ranks' batches together). Two ranks on CPU over Gloo, through `rn50 launch`.
use crate::common;

use std::ffi::OsString;
use std::path::Path;
use std::process::Command;

use common::{image_tree, metrics_lines, TinyTrain};

/// DATA/{train,val}/<wnid>/: 4 classes, 4 training and 2 validation copies of each photo.
fn data(root: &Path) {
    image_tree(root, "train", 4, 4);
    image_tree(root, "val", 4, 2);
}

/// `rn50 [launch --nproc-per-node N --] train DATA …` for `epochs`, into `out`; panics with the log if it fails.
/// The learning rate drops at epoch 1 whatever --epochs is, so that a run of 1 epoch continued to 3 has the
/// schedule of a run of 3.
fn train(ranks: usize, data: &Path, out: &Path, batch: usize, epochs: usize, extra: &[&str]) {
    // 64 px: the last stage's batch norm then sees 2×2 values per image, not 1, and is not dominated by rounding.
    let run = TinyTrain::on(data, out)
        .flags(&format!(
            "--width 16 --image-size 64 --val-resize 72 --val-crop 64 --precision fp32 --lr 0.02 \
             --lr-milestones 1 -j 1 -p 1 -b {batch} --epochs {epochs}"
        ))
        .args(extra);
    let mut args: Vec<OsString> = Vec::new();
    if ranks > 1 {
        let n = ranks.to_string();
        args.extend(
            ["launch", "--nproc-per-node", &n, "--timeout", "120", "--"].map(OsString::from),
        );
    }
    args.extend(run.to_args());
    let r = Command::new(env!("CARGO_BIN_EXE_rn50"))
        .args(&args)
        .output()
        .unwrap();
    assert!(
        r.status.success(),
        "rn50 {}\n{}",
        args.iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" "),
        String::from_utf8_lossy(&r.stderr)
    );
}

/// The tensors of a safetensors file, by name, as f32.
fn tensors(path: &Path) -> Vec<(String, Vec<f32>)> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut v: Vec<(String, Vec<f32>)> = st
        .tensors()
        .into_iter()
        .filter(|(_, t)| t.dtype() == safetensors::Dtype::F32)
        .map(|(k, t)| {
            let f = t
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            (k, f)
        })
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// The largest difference between two weight files' tensors whose name passes `pick`, relative to the largest
/// magnitude in the first file's tensor.
fn max_diff(a: &Path, b: &Path, pick: impl Fn(&str) -> bool) -> f32 {
    let (ta, tb) = (tensors(a), tensors(b));
    assert_eq!(ta.len(), tb.len());
    let mut d = 0f32;
    for ((ka, va), (kb, vb)) in ta.iter().zip(&tb) {
        assert_eq!(ka, kb);
        if pick(ka) {
            let scale = va.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-6);
            for (x, y) in va.iter().zip(vb) {
                d = d.max((x - y).abs() / scale);
            }
        }
    }
    d
}

/// Each epoch's validation figures as logged: (top-1, top-5, loss).
fn validation(run: &Path) -> Vec<(f64, f64, f64)> {
    metrics_lines(run)
        .iter()
        .map(|r| {
            let f = |v: Option<f64>, k: &str| v.unwrap_or_else(|| panic!("{k} missing: {r:?}"));
            (
                f(r.acc1, "acc1"),
                f(r.acc5, "acc5"),
                f(r.val_loss, "val_loss"),
            )
        })
        .collect()
}

/// Two ranks evaluate the model rank 0 checkpoints: a run stopped after epoch 1 and resumed logs exactly the
/// validation figures of the uninterrupted run. Without the broadcast, rank 1 evaluated with its own running
/// statistics in the uninterrupted run but with rank 0's (loaded from the checkpoint) after the resume, so the
/// figures differed.
#[test]
fn a_resumed_two_rank_run_logs_the_validation_of_the_uninterrupted_one() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("data");
    data(&d);
    let (whole, resumed) = (dir.path().join("whole"), dir.path().join("resumed"));
    train(2, &d, &whole, 2, 3, &[]);
    train(2, &d, &resumed, 2, 1, &[]);
    train(2, &d, &resumed, 2, 3, &["--resume", "auto"]);
    let (a, b) = (validation(&whole), validation(&resumed));
    assert_eq!(a.len(), 3);
    assert_eq!(a, b, "validation (Acc@1, Acc@5, loss) per epoch");
    // And the saved model is the one that was evaluated: weights and running statistics bit for bit.
    assert_eq!(
        max_diff(
            &whole.join("final.safetensors"),
            &resumed.join("final.safetensors"),
            |_| true
        ),
        0.0
    );
}

/// `--sync-bn`: 2 ranks × batch 2 make the update of 1 rank × batch 4 (the same samples and augmentations), to
/// fp32 rounding, running statistics included; without it the ranks' batch norm sees 2 images each and the update
/// differs by orders of magnitude more. One step: over several, rounding differences grow chaotically in these
/// tiny batches whatever the ranks do (1 rank with 1 or 2 threads diverges as much), so only a step compares.
#[test]
fn sync_bn_two_ranks_step_like_one_rank_with_the_global_batch() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("data");
    data(&d);
    let run = |name: &str, ranks: usize, batch: usize, extra: &[&str]| {
        let out = dir.path().join(name);
        train(
            ranks,
            &d,
            &out,
            batch,
            1,
            &[&["--steps-per-epoch", "1"], extra].concat(),
        );
        out.join("final.safetensors")
    };
    let one = run("one", 1, 4, &[]);
    let synced = run("synced", 2, 2, &["--sync-bn"]);
    let local = run("local", 2, 2, &[]);
    let stats = |k: &str| k.contains("running_");
    let params = |k: &str| !k.contains("running_");
    let (synced_p, synced_s) = (
        max_diff(&one, &synced, params),
        max_diff(&one, &synced, stats),
    );
    let (local_p, local_s) = (
        max_diff(&one, &local, params),
        max_diff(&one, &local, stats),
    );
    eprintln!(
        "max relative difference from 1 rank x 4: --sync-bn weights {synced_p:e}, running stats {synced_s:e}; \
         without: {local_p:e}, {local_s:e}"
    );
    assert!(
        synced_p < 1e-4 && synced_s < 1e-4,
        "--sync-bn differs from the global batch: weights {synced_p:e}, running stats {synced_s:e}"
    );
    assert!(
        local_p > 1e-2 && local_s > 1e-2,
        "without --sync-bn the ranks' statistics should differ from the global batch's: weights {local_p:e}, \
         running stats {local_s:e}"
    );
}
