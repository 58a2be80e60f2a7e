//! A smoke test of a whole dataset (issue 38): `--max-steps-per-epoch` (`--steps-per-epoch`) and
//! `--val-max-images` cut each epoch's training and its evaluation short, so a full ImageNet tree is checked end
//! to end in a minute.
use crate::common;

use common::{image_tree, metrics, rn50, steps, TinyTrain};

/// 2 epochs of 1 step each on a set of 24 training images, evaluated on 5 of its 12 validation images, spread
/// over the classes.
#[test]
fn a_whole_dataset_end_to_end_in_a_few_steps() {
    let dir = tempfile::tempdir().unwrap();
    let (data, out) = (dir.path().join("data"), dir.path().join("run"));
    image_tree(&data, "train", 4, 6);
    image_tree(&data, "val", 4, 3);
    let r = TinyTrain::on(&data, &out)
        .flags("--width 8 -b 2 --image-size 32 --val-resize 36 --val-crop 32 --epochs 2 -p 1")
        .flags("--max-steps-per-epoch 1 --val-max-images 5")
        .output();
    let log = String::from_utf8_lossy(&r.stderr);
    assert!(r.status.success(), "{log}");
    let m = metrics(&out);
    assert_eq!(m.len(), 2);
    for e in &m {
        assert_eq!(e.val_images, Some(5), "{e:?}");
    }
    let taken: Vec<(u64, u64)> = steps(&out).iter().map(|s| (s.epoch, s.step)).collect();
    assert_eq!(taken, [(0, 0), (1, 0)]);
}

/// MLPerf's accuracy is over the whole validation set: --mllog refuses a part of it, before anything is written.
#[test]
fn mllog_refuses_a_part_of_the_validation_set() {
    let dir = tempfile::tempdir().unwrap();
    let (out, log) = (dir.path().join("run"), dir.path().join("mllog.txt"));
    let r = rn50(&[
        "train",
        "--dummy",
        "--out",
        out.to_str().unwrap(),
        "--val-max-images",
        "100",
        "--mllog",
        log.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&r.stderr);
    assert_eq!(r.status.code(), Some(2), "{err}");
    assert!(err.contains("--val-max-images with --mllog"), "{err}");
    assert!(!out.exists() && !log.exists());
}
