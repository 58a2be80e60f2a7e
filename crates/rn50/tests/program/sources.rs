//! Issue 37: ImageNet from wherever users have it. The same photos as an ImageFolder tree (`train/`, `val/`), as
//! WebDataset shards named as timm's (written by webdataset's ShardWriter) and as the Hub's parquet files
//! (written by `datasets`), in the same order: `rn50 train DATA` on each gives the same losses step by step, the
//! weights record the WordNet ids whatever the source, and `rn50 eval` of weights trained on one source against
//! another's data gives the same result. So do the WebDataset shards packed by `rn50 pack` (its two splits), and the
//! parquet files with splits of other names, named with `--train-split` and `--val-split`.
use crate::common;

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use common::{reference_script, rn50, shared_data, shared_photos};
use serde_json::json;

/// Runs `scripts/dataset_writers.py ARGS` (webdataset's and datasets' own writers).
fn dataset_writer(args: &[&str]) {
    reference_script("../../../../scripts/dataset_writers.py", args);
}

/// The 1,000 ImageNet classes, class k holding shared photo k % 220 (a class may not be empty in an
/// ImageFolder): (WordNet id, photo), in the class order.
fn thousand_classes() -> Vec<(String, PathBuf)> {
    let photos = shared_photos();
    let synsets = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../pipeline/assets/synsets.txt"),
    )
    .unwrap();
    synsets
        .lines()
        .enumerate()
        .map(|(k, l)| {
            let wnid = l.split_whitespace().next().unwrap().to_string();
            (wnid, photos[k % photos.len()].clone())
        })
        .collect()
}

/// The three forms of the same data under `dir`: `folder/` (train/ and val/), `wds/` (timm's names) and `hub/`
/// (data/train-*.parquet, data/validation-*.parquet); each split holds every class's photo, in class order.
fn three_sources(dir: &Path) -> [PathBuf; 3] {
    let classes = thousand_classes();
    let folder = dir.join("folder");
    for split in ["train", "val"] {
        for (wnid, photo) in &classes {
            let d = folder.join(split).join(wnid);
            std::fs::create_dir_all(&d).unwrap();
            symlink(photo, d.join(format!("{wnid}.JPEG"))).unwrap();
        }
    }
    let wds = dir.join("wds");
    std::fs::create_dir_all(&wds).unwrap();
    let samples: Vec<_> = classes
        .iter()
        .enumerate()
        .map(|(k, (_, photo))| json!({"key": format!("s{k:05}"), "image": photo, "cls": k}))
        .collect();
    let spec = dir.join("wds.json");
    std::fs::write(&spec, json!(samples).to_string()).unwrap();
    for split in ["train", "validation"] {
        let pattern = wds.join(format!("imagenet1k-{split}-%04d.tar"));
        let pattern = pattern.to_str().unwrap();
        dataset_writer(&["wds", pattern, "300", spec.to_str().unwrap()]);
    }
    let hub = dir.join("hub");
    let names: Vec<String> = (0..1000).map(|k| format!("class {k}")).collect();
    let rows: Vec<_> = classes
        .iter()
        .enumerate()
        .map(|(k, (_, photo))| json!({"image": photo, "label": k}))
        .collect();
    let spec = dir.join("hub.json");
    std::fs::write(&spec, json!({"names": names, "rows": rows}).to_string()).unwrap();
    for split in ["train", "validation"] {
        let file = hub.join(format!("data/{split}-00000-of-00001.parquet"));
        dataset_writer(&[
            "parquet",
            file.to_str().unwrap(),
            "128",
            spec.to_str().unwrap(),
        ]);
    }
    [folder, wds, hub]
}

/// (epoch, step) → loss of a run.
fn step_losses(run: &Path) -> Vec<((u64, u64), u64)> {
    common::steps(run)
        .iter()
        .map(|r| ((r.epoch, r.step), r.loss.to_bits()))
        .collect()
}

/// `rn50 ARGS` with the WebDataset index cache in `cache`, which must succeed.
fn rn50_ok(args: &[&str], cache: &Path) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rn50"))
        .args(args)
        .env("RN50_CACHE_DIR", cache)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn every_source_trains_to_the_same_losses_and_evaluates_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let [folder, wds, hub] = three_sources(dir.path());
    let cache = dir.path().join("cache");
    // The WebDataset repository packed: its two splits become packed/train and packed/val.
    let packed = dir.path().join("packed");
    rn50_ok(
        &[
            "pack",
            wds.to_str().unwrap(),
            packed.to_str().unwrap(),
            "-j",
            "2",
            "--quiet",
        ],
        &cache,
    );
    // The parquet files with splits the usual names do not find.
    let renamed = dir.path().join("renamed/data");
    std::fs::create_dir_all(&renamed).unwrap();
    for (from, to) in [("train", "trn"), ("validation", "valid")] {
        std::fs::copy(
            hub.join(format!("data/{from}-00000-of-00001.parquet")),
            renamed.join(format!("{to}-00000-of-00001.parquet")),
        )
        .unwrap();
    }
    let renamed = renamed.parent().unwrap().to_path_buf();
    let split_flags = ["--train-split", "trn", "--val-split", "valid"];
    // --out in the test's folder: the default, runs/train, would be claimed in the source tree.
    let run = dir.path().join("refused");
    let out = rn50(&[
        "train",
        renamed.to_str().unwrap(),
        "--device",
        "cpu",
        "--out",
        run.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("has no train/ folder"),
        "{err}"
    );
    let sources = [folder, wds, hub, packed, renamed];
    // The split flags each source needs: train's, and eval's (--val-split).
    let no_flags: &[&str] = &[];
    let flags = |i: usize| if i == 4 { &split_flags[..] } else { no_flags };
    let val_flags = |i: usize| if i == 4 { &split_flags[2..] } else { no_flags };
    let mut losses = Vec::new();
    let mut evals = Vec::new();
    for (i, data) in sources.iter().enumerate() {
        let run = dir.path().join(format!("run{i}"));
        let (data, run_dir) = (data.to_str().unwrap(), run.to_str().unwrap());
        // Training's own evaluation on 20 of the 1,000 validation images: `rn50 eval` below evaluates every one.
        let tiny =
            "-a resnet18 -b 4 -j 2 --image-size 32 --val-resize 36 --val-crop 32 --epochs 1 \
                    --steps-per-epoch 3 -p 1 --device cpu --precision fp32 --val-max-images 20";
        let tiny: Vec<&str> = tiny.split_whitespace().collect();
        rn50_ok(
            &[&["train", data, "--out", run_dir], &tiny[..], flags(i)].concat(),
            &cache,
        );
        losses.push(step_losses(&run));
    }
    // The weights trained on each source, evaluated on another one's validation split: the class names recorded
    // (WordNet ids, whatever the source) are those eval checks the data's against.
    for (i, data) in sources.iter().enumerate() {
        let weights = dir
            .path()
            .join(format!("run{}/final.safetensors", (i + 2) % sources.len()));
        let json = dir.path().join(format!("eval{i}.json"));
        let (weights, json_file) = (weights.to_str().unwrap(), json.to_str().unwrap());
        let eval = "-a resnet18 -b 50 -j 2 --resize 36 --crop 32 --device cpu --precision fp32";
        let eval: Vec<&str> = eval.split_whitespace().collect();
        let args = [
            &["eval", "--weights", weights, "--json", json_file],
            &eval[..],
        ]
        .concat();
        rn50_ok(
            &[&args[..], &[data.to_str().unwrap()], val_flags(i)].concat(),
            &cache,
        );
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        assert_eq!(v["images"], 1000, "{v}");
        evals.push((v["acc1"].clone(), v["acc5"].clone()));
    }
    assert_eq!(losses[0].len(), 3);
    assert_eq!(losses[1], losses[0], "WebDataset shards");
    assert_eq!(losses[2], losses[0], "parquet");
    assert_eq!(losses[3], losses[0], "the WebDataset shards packed");
    assert_eq!(losses[4], losses[0], "parquet splits named with flags");
    for (i, e) in evals.iter().enumerate() {
        assert_eq!(e, &evals[0], "{}", sources[i].display());
    }
    // Data of other classes is refused as for any ImageFolder.
    let other = dir.path().join("other/val/n01440764");
    std::fs::create_dir_all(&other).unwrap();
    symlink(
        shared_data().join("jpeg/imagenet/n01440764.JPEG"),
        other.join("a.JPEG"),
    )
    .unwrap();
    let hub_weights = dir.path().join("run2/final.safetensors");
    let out = rn50(&[
        "eval",
        "-a",
        "resnet18",
        "--weights",
        hub_weights.to_str().unwrap(),
        "--device",
        "cpu",
        dir.path().join("other").to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("trained for 1000"),
        "{err}"
    );
}
