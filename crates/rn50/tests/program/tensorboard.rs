//! `rn50 train`'s TensorBoard scalars as TensorBoard itself reads them (its EventAccumulator, under
//! RN50_PYTHON): a run killed with SIGKILL and resumed from an older checkpoint shows every step once, with the
//! resumed run's values; training top-1 and validation loss are among the series; events reach the file while
//! an epoch is still training.
use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{image_tree, json_lines, TinyTrain};

/// Every scalar series of LOGDIR as TensorBoard shows it: tag → (step, value), in TensorBoard's order.
fn tensorboard_shows(logdir: &Path) -> BTreeMap<String, Vec<(i64, f32)>> {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("scalars.json");
    common::reference_script(
        "tensorboard_scalars.py",
        &[logdir.as_os_str(), json.as_os_str()],
    );
    serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap()
}

/// The steps of one series.
fn steps(series: &[(i64, f32)]) -> Vec<i64> {
    series.iter().map(|&(s, _)| s).collect()
}

/// `rn50 train` on DATA into OUT: resnet18 of width 8 at 32 px, 4 steps an epoch, a logged step each.
fn train(data: &Path, out: &Path, epochs: usize, extra: &[&str]) -> Command {
    let mut c = TinyTrain::on(data, out)
        .flags("--width 8 -b 4 -j 2 --image-size 32 --val-resize 36 --val-crop 32 -p 1 --precision fp32")
        .flags(&format!("--epochs {epochs}"))
        .args(extra)
        .command();
    c.stdout(Stdio::null()).stderr(Stdio::piped());
    c
}

/// Waits for `ready` while `child` runs; panics (with its stderr) if it ends first.
fn wait_while_running(child: &mut Child, what: &str, mut ready: impl FnMut() -> bool) {
    while !ready() {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
            panic!("train ended ({status}) before {what}:\n{err}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn lines_in(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |s| s.lines().count())
}

/// The numbered checkpoints of a run directory, oldest first.
fn checkpoints(run: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(run)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.starts_with("checkpoint-") && name.ends_with(".safetensors")
        })
        .collect();
    v.sort();
    v
}

/// The case: kill -9 well after a checkpoint, resume from it. The killed run logged (and TensorBoard
/// shows) steps and an evaluated epoch past the checkpoint; after the resume TensorBoard shows each step once,
/// steps strictly increasing, with the resumed run's values (steps.jsonl's and metrics.jsonl's, which the
/// resume trimmed and logged again), and val/loss and train/acc1 with a point per epoch and per step.
#[test]
fn a_hard_kill_and_resume_show_each_step_once_in_tensorboard() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    image_tree(&data, "train", 4, 4);
    image_tree(&data, "val", 4, 2);
    let run = dir.path().join("run");
    // 16 training images, batch 4: 4 steps an epoch.
    let per_epoch = 4;
    let mut child = train(&data, &run, 100, &[]).spawn().unwrap();
    // Three epochs logged: two checkpoints kept (each epoch's is written after its record).
    wait_while_running(&mut child, "three epochs were logged", || {
        lines_in(&run.join("metrics.jsonl")) >= 3
    });
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();

    // Resume from the older checkpoint kept: the newer one's epoch, logged and flushed, is orphaned.
    let kept = checkpoints(&run);
    assert!(kept.len() >= 2, "{kept:?}");
    let (pos, _) = rn50::train::checkpoint::read_meta(&kept[0]).unwrap();
    let purge = pos.global_step as i64 + 1;
    let before = tensorboard_shows(&run.join("tensorboard"));
    let orphaned = |tag: &str| {
        steps(&before[tag])
            .into_iter()
            .filter(|&s| s >= purge)
            .count()
    };
    assert!(
        orphaned("train/loss") >= per_epoch && orphaned("train/images_per_sec") >= 1,
        "the killed run showed nothing past step {purge} to purge: {before:?}"
    );
    let epochs = pos.epoch as usize + 2;
    let r = train(
        &data,
        &run,
        epochs,
        &["--resume", kept[0].to_str().unwrap()],
    )
    .output()
    .unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));

    let shown = tensorboard_shows(&run.join("tensorboard"));
    let mut tags = rn50_report::tensorboard::TAGS.to_vec();
    tags.sort();
    assert_eq!(
        shown.keys().collect::<Vec<_>>(),
        tags,
        "the tags rn50 documents"
    );
    for (tag, series) in &shown {
        let s = steps(series);
        assert!(
            s.windows(2).all(|w| w[0] < w[1]),
            "{tag}: steps not strictly increasing (a step shown twice?): {s:?}"
        );
    }
    let every_step: Vec<i64> = (1..=(epochs * per_epoch) as i64).collect();
    let epoch_ends: Vec<i64> = (1..=epochs as i64).map(|e| e * per_epoch as i64).collect();
    for tag in ["train/loss", "train/acc1", "train/lr"] {
        assert_eq!(steps(&shown[tag]), every_step, "{tag}");
    }
    for tag in [
        "val/acc1",
        "val/acc5",
        "val/loss",
        "train/images_per_sec",
        "train/data_wait",
    ] {
        assert_eq!(steps(&shown[tag]), epoch_ends, "{tag}");
    }
    // The values shown are the ones the logs keep: the resumed run's where it logged again.
    let logged = common::steps(&run);
    assert_eq!(logged.len(), every_step.len());
    for (rec, (&(_, loss), &(_, acc1))) in logged
        .iter()
        .zip(shown["train/loss"].iter().zip(&shown["train/acc1"]))
    {
        assert_eq!(loss, rec.loss as f32, "{rec:?}");
        assert_eq!(acc1, rec.acc1.unwrap() as f32, "{rec:?}");
    }
    assert_eq!(json_lines(&run.join("metrics.jsonl")).len(), epochs);
    let metrics = common::metrics(&run);
    // An epoch's training top-1 is over all its images: with every step logged and batches of 4, the mean of its
    // steps' (each a multiple of 25%).
    for (e, rec) in metrics.iter().enumerate() {
        let of_steps: Vec<f64> = logged[e * per_epoch..(e + 1) * per_epoch]
            .iter()
            .map(|r| r.acc1.unwrap())
            .collect();
        assert!(of_steps.iter().all(|a| a % 25.0 == 0.0), "{of_steps:?}");
        let mean = of_steps.iter().sum::<f64>() / per_epoch as f64;
        let got = rec.train_acc1.unwrap();
        assert!((got - mean).abs() < 1e-9, "epoch {e}: {got} vs {mean}");
    }
    for (rec, (&(_, loss), &(_, acc1))) in metrics
        .iter()
        .zip(shown["val/loss"].iter().zip(&shown["val/acc1"]))
    {
        assert_eq!(loss, rec.val_loss.unwrap() as f32, "{rec:?}");
        assert_eq!(acc1, rec.acc1.unwrap() as f32, "{rec:?}");
    }
}

/// With a flush every second (RN50_TENSORBOARD_FLUSH_SECS), the logged steps reach the event file while the
/// epoch still trains. Its 20 logged steps take a few KB, less than the writer's buffer: without the timed
/// flush they reached the file only with the epoch's end, after its metrics.jsonl record.
#[test]
fn events_reach_the_file_before_the_epoch_ends() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let mut child = TinyTrain::dummy(&run)
        .flags(
            "--width 8 -b 2 --image-size 32 --augment cifar --steps-per-epoch 2000 -p 100 --epochs 1 \
             --precision fp32",
        )
        .command()
        .env("RN50_TENSORBOARD_FLUSH_SECS", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let tb = run.join("tensorboard");
    let losses_in_file = || -> usize {
        let Ok(files) = std::fs::read_dir(&tb) else {
            return 0;
        };
        files
            .filter_map(|f| rn50_report::tensorboard::read_scalars(&f.unwrap().path()).ok())
            .flatten()
            .filter(|s| s.tag == "train/loss")
            .count()
    };
    let mut ended_first = false;
    wait_while_running(&mut child, "a step reached the event file", || {
        ended_first = lines_in(&run.join("metrics.jsonl")) > 0;
        ended_first || losses_in_file() > 0
    });
    let in_epoch = !ended_first && lines_in(&run.join("metrics.jsonl")) == 0;
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
    assert!(
        in_epoch,
        "the events reached the file only when the epoch ended"
    );
}

/// A bad flush interval is a usage error before anything is written.
#[test]
fn a_bad_flush_interval_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    for bad in ["0", "61", "1.5", "x"] {
        let r = TinyTrain::dummy(&run)
            .command()
            .env("RN50_TENSORBOARD_FLUSH_SECS", bad)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&r.stderr);
        assert_eq!(r.status.code(), Some(2), "{bad}: {err}");
        assert!(
            err.contains("RN50_TENSORBOARD_FLUSH_SECS") && err.lines().count() == 1,
            "{bad}: {err}"
        );
        assert!(!run.exists(), "{bad}: the run directory was created");
    }
}
