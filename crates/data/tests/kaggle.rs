//! `prepare --kaggle`: Kaggle's ImageNet layout, made from the same photos as the archives of the other tests,
//! becomes the very tree `prepare` extracts from those archives (hard links to the download), which `prepare
//! check` passes; its bad inputs are one-line errors naming the file, with nothing written.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use common::*;
use rn50_data::prepare;

fn p(path: &Path) -> String {
    path.to_str().unwrap().to_string()
}

/// The error of `prepare --kaggle KAGGLE --out OUT`, which must fail.
fn kaggle_error(kaggle: &Path, out: &Path) -> String {
    format!(
        "{:#}",
        cli(&["--kaggle", &p(kaggle), "--out", &p(out)]).unwrap_err()
    )
}

/// Kaggle's layout of the fixture's photos in `dir`: `ILSVRC/Data/CLS-LOC/train/<wnid>/`, a flat
/// `ILSVRC/Data/CLS-LOC/val/`, `LOC_val_solution.csv` (boxes after each synset, as Kaggle's), and
/// `LOC_synset_mapping.txt`.
fn kaggle_download(fx: &Fixture, dir: &Path) -> PathBuf {
    let data = dir.join("ILSVRC/Data/CLS-LOC");
    let mut csv = String::from("ImageId,PredictionString\n");
    for (rel, bytes) in &fx.expected {
        let parts: Vec<&str> = rel.split('/').collect();
        let to = match parts[..] {
            ["train", wnid, file] => data.join("train").join(wnid).join(file),
            ["val", wnid, file] => {
                let id = file.trim_end_matches(".JPEG");
                csv += &format!("{id},{wnid} 12 30 200 180 {wnid} 1 2 50 60 \n");
                data.join("val").join(file)
            }
            _ => unreachable!("{rel}"),
        };
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::write(to, bytes).unwrap();
    }
    std::fs::write(dir.join("LOC_val_solution.csv"), csv).unwrap();
    std::fs::write(
        dir.join("LOC_synset_mapping.txt"),
        rn50_data::imagenet_classes().join("\n") + "\n",
    )
    .unwrap();
    dir.to_path_buf()
}

#[test]
fn the_kaggle_layout_becomes_the_tree_prepare_makes_from_the_archives() {
    let fx = build();
    let kaggle = kaggle_download(&fx, &fx.dir.path().join("kaggle"));
    let from_archives = fx.dir.path().join("from-archives");
    prepare(&options(
        Some(&fx.train_tar),
        Some(&fx.val_tar),
        &from_archives,
    ))
    .unwrap();
    let out = fx.dir.path().join("out");
    let json = fx.dir.path().join("kaggle.json");
    // The command's --json summary.
    let kaggle_run = || -> serde_json::Value {
        let args = [
            "--kaggle",
            &p(&kaggle),
            "--out",
            &p(&out),
            "--json",
            &p(&json),
        ];
        cli(&args).unwrap();
        serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap()
    };
    let v = kaggle_run();
    assert_same_tree(&read_tree(&out), &read_tree(&from_archives));
    assert_eq!(v["val_images"], 24);
    assert_eq!(v["train_classes"], 6);
    assert_eq!(v["linked"], fx.expected.len() as u64);
    // Hard links: the download's own files, no copy (one file system here).
    let (rel, _) = fx.expected.iter().next().unwrap();
    let linked = std::fs::metadata(out.join(rel)).unwrap();
    let original = std::fs::metadata(kaggle.join("ILSVRC/Data/CLS-LOC").join(rel)).unwrap();
    assert_eq!(linked.ino(), original.ino());
    // `prepare check` passes it; a second run finds everything in place.
    cli(&["check", &p(&out)]).unwrap();
    let v = kaggle_run();
    assert_eq!(v["linked"], 0);
    assert_eq!(v["copied"], 0);
}

/// What a case does to a good download.
type Spoil = dyn Fn(&Path);

#[test]
fn bad_kaggle_input_is_refused_naming_the_file_and_writes_nothing() {
    let fx = build();
    let cases: [(&str, &Spoil, &str); 5] = [
        (
            "unknown synset",
            &|k| {
                let csv = k.join("LOC_val_solution.csv");
                let text = std::fs::read_to_string(&csv).unwrap();
                let line = text.lines().nth(3).unwrap();
                let (id, _) = line.split_once(',').unwrap();
                let text = text.replace(line, &format!("{id},n99999999 1 2 3 4"));
                std::fs::write(&csv, text).unwrap();
            },
            "LOC_val_solution.csv: line 4: unknown synset \"n99999999\"",
        ),
        (
            "a line for a missing file",
            &|k| {
                let csv = k.join("LOC_val_solution.csv");
                let mut text = std::fs::read_to_string(&csv).unwrap();
                text += "ILSVRC2012_val_00049999,n01440764 1 2 3 4\n";
                std::fs::write(&csv, text).unwrap();
            },
            "val/ILSVRC2012_val_00049999.JPEG: LOC_val_solution.csv labels it, but it is missing",
        ),
        (
            "a val file without a line",
            &|k| {
                let val = k.join("ILSVRC/Data/CLS-LOC/val");
                std::fs::write(val.join("ILSVRC2012_val_00040000.JPEG"), b"x").unwrap();
            },
            "val/ILSVRC2012_val_00040000.JPEG: no line for it in LOC_val_solution.csv",
        ),
        (
            "an unknown class folder",
            &|k| {
                let dir = k.join("ILSVRC/Data/CLS-LOC/train/n99999999");
                std::fs::create_dir(&dir).unwrap();
                std::fs::write(dir.join("a.JPEG"), b"x").unwrap();
            },
            "train/n99999999: unknown synset",
        ),
        (
            "not a Kaggle download",
            &|k| std::fs::remove_dir_all(k.join("ILSVRC")).unwrap(),
            "not Kaggle's ImageNet download",
        ),
    ];
    for (i, (what, spoil, message)) in cases.iter().enumerate() {
        let kaggle = kaggle_download(&fx, &fx.dir.path().join(format!("kaggle{i}")));
        spoil(&kaggle);
        let out = fx.dir.path().join(format!("out{i}"));
        let err = kaggle_error(&kaggle, &out);
        assert!(err.contains(message), "{what}: {err}");
        assert!(!err.contains('\n'), "{what}: {err}");
        assert!(!out.exists(), "{what}: wrote {}", out.display());
    }
    // A file of the user's at a name it would write stays as it is.
    let kaggle = kaggle_download(&fx, &fx.dir.path().join("kaggle-mine"));
    let out = fx.dir.path().join("out-mine");
    let (rel, _) = fx.expected.iter().next().unwrap();
    std::fs::create_dir_all(out.join(rel).parent().unwrap()).unwrap();
    std::fs::write(out.join(rel), b"mine").unwrap();
    let err = kaggle_error(&kaggle, &out);
    assert!(err.contains("exists and is not"), "{err}");
    assert_eq!(std::fs::read(out.join(rel)).unwrap(), b"mine");
}
