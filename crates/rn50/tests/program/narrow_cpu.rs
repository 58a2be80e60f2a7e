//! Narrow networks on a CPU at the edge of the channels_last crash (issue 25, item 1): libtorch's oneDNN
//! corrupted the heap training channels_last ResNets narrower than 16 channels (the weight gradient of the
//! stride-2 1x1 downsample convolution), so `rn50 train --width 15` died with "double free or corruption"
//! (exit 134) or a segmentation fault (139) where `--width 16` trained. rn50 now computes such nets in NCHW.
use crate::common;

use std::path::Path;

use common::{image_tree, rn50, TinyTrain};

/// `rn50 train` of one step of ResNet-18 `--width W` on 96 px photos with the CIFAR stem (so the downsample
/// convolution of the second stage reads 96x96 maps with W channels), fp32, on the CPU; its exit code and log.
fn train(data: &Path, out: &Path, width: i64, extra: &[&str]) -> (Option<i32>, String) {
    let r = TinyTrain::on(data, out)
        .flags(&format!(
            "--width {width} -b 2 -j 1 --image-size 96 --augment cifar --epochs 1 --steps-per-epoch 1 \
             --precision fp32"
        ))
        .args(extra)
        .output();
    (
        r.status.code(),
        String::from_utf8_lossy(&r.stderr).into_owned(),
    )
}

/// Just inside the crash (15 channels, which exited 134 or 139 in every run before) and just outside it (16):
/// both train and exit 0; the narrow one in NCHW with the reason logged, the other in channels_last as before.
/// An explicit --channels-last for the narrow net is refused with the reason before anything runs.
#[test]
fn narrow_nets_train_in_nchw_where_channels_last_crashed() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    image_tree(&data, "train", 2, 2);
    image_tree(&data, "val", 2, 1);

    let (code, log) = train(&data, &dir.path().join("w15"), 15, &[]);
    assert_eq!(code, Some(0), "{log}");
    assert!(
        log.contains("computing in NCHW, not channels_last")
            && log.contains("this network has convolutions of 15 channels (--width 15)"),
        "{log}"
    );
    assert!(!log.contains("(fp32, channels_last"), "{log}");

    let (code, log) = train(&data, &dir.path().join("w16"), 16, &[]);
    assert_eq!(code, Some(0), "{log}");
    assert!(log.contains("(fp32, channels_last, "), "{log}");
    assert!(!log.contains("computing in NCHW"), "{log}");

    let out = dir.path().join("refused");
    let (code, log) = train(&data, &out, 15, &["--channels-last"]);
    assert_eq!(code, Some(1), "{log}");
    assert!(
        log.contains("--channels-last with convolutions of 15 channels")
            && log.contains("--no-channels-last"),
        "{log}"
    );
    assert!(!out.exists(), "a refused run wrote {}", out.display());

    // ResNet-D's deep stem starts at half the width: --width 24 has 12-channel convolutions, and the way out is
    // a width of 32.
    let r = TinyTrain::on(&data, &out)
        .flags("-a resnet18d --width 24 -b 2 -j 1 --image-size 64 --epochs 1 --steps-per-epoch 1 --precision fp32")
        .args(["--channels-last"])
        .output();
    let log = String::from_utf8_lossy(&r.stderr);
    assert_eq!(r.status.code(), Some(1), "{log}");
    assert!(
        log.contains("convolutions of 12 channels (the deep stem's, half of --width)")
            && log.contains("use --width 32 or more, or --no-channels-last"),
        "{log}"
    );
    assert!(!out.exists(), "a refused run wrote {}", out.display());
}

/// `bench --width` (issue 38: one spelling per idea across commands) measures the narrow network `train --width`
/// trains: the result records it and names it, and it computes in NCHW on the CPU as the trainer does.
#[test]
fn bench_measures_the_narrow_network_train_trains() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("bench.json");
    let r = rn50(&[
        "bench",
        "-a",
        "resnet18",
        "--width",
        "8",
        "-b",
        "2",
        "--image-size",
        "32",
        "--warmup",
        "0",
        "--steps",
        "1",
        "--threads",
        "1",
        "--device",
        "cpu",
        "--json",
        json.to_str().unwrap(),
    ]);
    let (out, log) = (
        String::from_utf8_lossy(&r.stdout),
        String::from_utf8_lossy(&r.stderr),
    );
    assert!(r.status.success(), "{log}");
    assert!(
        out.contains("rn50 bench: resnet18 width 8 batch 2 "),
        "{out}"
    );
    assert!(
        log.contains("convolutions of 8 channels (--width 8)"),
        "{log}"
    );
    let result: rn50_report::schema::BenchResult =
        serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(
        (result.config.width, result.config.channels_last),
        (Some(8), Some(false))
    );
}
