//! Hugging Face parquet files, written by `datasets` itself (an `Image()` / `ClassLabel` dataset holding the
//! JPEG bytes, `to_parquet`) from the shared ImageNet photos: read by rn50 they are the same (image, class)
//! samples as the ImageFolder of the same photos, with the Hub's human-readable class names or WordNet ids;
//! files of another schema, unlabelled rows, a ClassLabel without names, footers claiming rows their row
//! groups do not hold and non-parquet files are refused naming the file; a damaged image in a row is a bad
//! image like any other; packed, they are the same samples again; training on the validation split is warned
//! of.

use crate::common;

use std::path::{Path, PathBuf};

use common::*;
use rn50_pipeline::source::parquet::ParquetSet;
use rn50_pipeline::source::{Split, TRAIN_SPLIT, VAL_SPLIT};
use rn50_pipeline::Dataset;
use serde_json::json;

/// Writes `rows` (image file, label) with `datasets` to `file`, a row group each `group` rows; `spec` adds
/// to the writer's spec (`names`, `image_column`, `label_column`).
fn to_parquet(file: &Path, group: usize, rows: &[(PathBuf, i64)], mut spec: serde_json::Value) {
    spec["rows"] = rows
        .iter()
        .map(|(image, label)| json!({"image": image, "label": label}))
        .collect();
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    let spec_file = file.with_extension("spec.json");
    std::fs::write(&spec_file, spec.to_string()).unwrap();
    dataset_writer(&[
        "parquet",
        file.to_str().unwrap(),
        &group.to_string(),
        spec_file.to_str().unwrap(),
    ]);
    std::fs::remove_file(spec_file).unwrap();
}

/// The Hub's ClassLabel names for ILSVRC/imagenet-1k: the human-readable names, in the standard order.
/// Two classes are both "crane" (the bird and the machine); `datasets` 5 refuses a ClassLabel with a name
/// twice, so the second one is written "crane (machine)" here: rn50 maps the names by position, whatever
/// their text.
fn hub_names() -> serde_json::Value {
    let mut names: Vec<String> = rn50_pipeline::imagenet::classes()
        .iter()
        .map(|l| l.split_once(' ').unwrap().1.to_string())
        .collect();
    assert_eq!(names[134], "crane");
    assert_eq!(names[517], "crane");
    names[517] = "crane (machine)".into();
    json!(names)
}

fn labelled(photos: &[PathBuf]) -> Vec<(PathBuf, i64)> {
    photos
        .iter()
        .map(|p| (p.clone(), imagenet_label(p) as i64))
        .collect()
}

#[test]
fn parquet_written_by_datasets_is_the_imagefolders_samples() {
    let tmp = tempfile::tempdir().unwrap();
    let folder = Dataset::open(imagenet_folder(tmp.path())).unwrap();
    let photos = jpeg_files("imagenet");
    // The Hub's layout: data/train-0000N-of-00002.parquet, data/validation-00000-of-00001.parquet.
    let repo = tmp.path().join("repo");
    let data = repo.join("data");
    let rows = labelled(&photos);
    let names = json!({"names": hub_names()});
    to_parquet(
        &data.join("train-00000-of-00002.parquet"),
        32,
        &rows[..120],
        names.clone(),
    );
    to_parquet(
        &data.join("train-00001-of-00002.parquet"),
        32,
        &rows[120..],
        names.clone(),
    );
    to_parquet(
        &data.join("validation-00000-of-00001.parquet"),
        4,
        &rows[..10],
        names,
    );

    let train = Dataset::open_split(&repo, TRAIN_SPLIT).unwrap().unwrap();
    assert_eq!(train.len(), 220);
    // The human-readable names are recorded as the WordNet ids, by position (the Hub's names repeat).
    assert_eq!(train.classes(), rn50_pipeline::imagenet::wnids());
    assert!(samples(&train) == samples(&folder));
    let val = Dataset::open_split(&repo, VAL_SPLIT).unwrap().unwrap();
    assert_eq!(val.len(), 10);
    assert_eq!(val.classes(), train.classes());
    assert!(decoded_samples(train) == decoded_samples(folder.clone()));
    // Written again by pyarrow with its default codec, snappy: the same samples.
    let snappy = tmp.path().join("snappy/data/train-00000-of-00001.parquet");
    let names = json!({"names": hub_names(), "compression": "snappy"});
    to_parquet(&snappy, 16, &labelled(&photos), names);
    let ds = Dataset::open_split(&tmp.path().join("snappy"), TRAIN_SPLIT)
        .unwrap()
        .unwrap();
    assert!(samples(&ds) == samples(&folder));
    // One file opens on its own; the folder of both splits' files is refused as one dataset.
    assert_eq!(
        Dataset::open(data.join("train-00001-of-00002.parquet"))
            .unwrap()
            .len(),
        100
    );
    let err = format!("{:#}", Dataset::open(&data).unwrap_err());
    assert!(err.contains("several splits (train, validation)"), "{err}");

    // ClassLabel names that are WordNet ids are the classes as they are: here the ImageFolder's own.
    let own = tmp.path().join("own/data/train-00000-of-00001.parquet");
    let rows: Vec<(PathBuf, i64)> = photos.iter().cloned().zip(0..).collect();
    to_parquet(&own, 64, &rows, json!({"names": folder.classes()}));
    let ds = Dataset::open_split(&tmp.path().join("own"), TRAIN_SPLIT)
        .unwrap()
        .unwrap();
    assert_eq!(ds.classes(), folder.classes());
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for i in 0..folder.len() {
        assert_eq!(ds.label(i), folder.label(i));
        assert_eq!(ds.read(i, &mut a).unwrap(), folder.read(i, &mut b).unwrap());
    }
}

#[test]
fn packed_from_parquet_the_splits_are_the_same_samples_and_other_names_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let rows = labelled(&jpeg_files("imagenet"));
    let names = json!({"names": hub_names()});
    let repo = tmp.path().join("repo");
    // Splits the usual names do not find: data/trn-*.parquet, data/valid-*.parquet.
    let (train, val) = (&rows[..12], &rows[100..105]);
    for (split, rows) in [("trn", train), ("valid", val)] {
        let file = repo.join(format!("data/{split}-00000-of-00001.parquet"));
        to_parquet(&file, 4, rows, names.clone());
    }
    assert!(Dataset::open_split(&repo, TRAIN_SPLIT).unwrap().is_none());
    assert!(Dataset::open_split(&repo, VAL_SPLIT).unwrap().is_none());
    let out = tmp.path().join("packed");
    let p = |p: &Path| p.to_str().unwrap().to_string();
    let split_flags = ["--train-split", "trn", "--val-split", "valid"];
    pack_command(&[&[p(&repo).as_str(), &p(&out)][..], &split_flags].concat()).unwrap();
    for (packed, named) in [(TRAIN_SPLIT, "trn"), (VAL_SPLIT, "valid")] {
        let packed = Dataset::open_required_split(&out, packed).unwrap();
        let parquet = Dataset::open_required_split(&repo, Split::Named(named)).unwrap();
        assert!(packed.description().starts_with("shards"), "{packed:?}");
        assert_eq!(packed.classes(), rn50_pipeline::imagenet::wnids());
        assert!(samples(&packed) == samples(&parquet));
        let labels = |d: &Dataset| (0..d.len()).map(|i| d.label(i)).collect::<Vec<_>>();
        assert_eq!(labels(&packed), labels(&parquet), "in the same order");
    }
    assert_eq!(Dataset::open(out.join("val")).unwrap().len(), 5);
}

/// The error of opening `file` alone (no cache), one line naming it.
fn error_opening(file: &Path) -> String {
    common::open_error(ParquetSet::open(&[file.to_path_buf()]), file)
}

#[test]
fn parquet_of_another_schema_or_without_labels_is_refused_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let photos = jpeg_files("imagenet");
    let rows = labelled(&photos[..4]);
    let names = hub_names();
    let file = |n: &str| tmp.path().join(format!("{n}.parquet"));
    to_parquet(
        &file("img"),
        8,
        &rows,
        json!({"names": names, "image_column": "img"}),
    );
    let e = error_opening(&file("img"));
    assert!(
        e.contains("its columns are img.bytes, img.path, label"),
        "{e}"
    );
    to_parquet(
        &file("nolabel"),
        8,
        &rows,
        json!({"names": names, "label_column": null}),
    );
    let e = error_opening(&file("nolabel"));
    assert!(
        e.contains("its columns are image.bytes, image.path; rn50 reads"),
        "{e}"
    );
    // The Hub's test split: -1, no label.
    let mut unlabelled = rows.clone();
    unlabelled[2].1 = -1;
    to_parquet(&file("test"), 8, &unlabelled, json!({"names": names}));
    let e = error_opening(&file("test"));
    assert!(
        e.contains("row 2 has label -1, outside its 1000 classes"),
        "{e}"
    );
    // A codec rn50 does not read (pyarrow's zstd): refused at open, not a bad image each.
    to_parquet(
        &file("zstd"),
        8,
        &rows,
        json!({"names": names, "compression": "zstd"}),
    );
    let e = error_opening(&file("zstd"));
    assert!(e.contains("its images are compressed with ZSTD"), "{e}");
    // Not parquet: a JPEG so named, an empty file.
    std::fs::copy(&photos[0], file("photo")).unwrap();
    assert!(error_opening(&file("photo")).contains("not a parquet file"));
    std::fs::write(file("empty"), b"").unwrap();
    assert!(error_opening(&file("empty")).contains("not a parquet file"));
    // Each file's verdict is its own: a good one opens, with a bad one beside it the set is refused.
    to_parquet(&file("good"), 8, &rows, json!({"names": names}));
    assert!(ParquetSet::open(&[file("good")]).is_ok());
    assert!(ParquetSet::open(&[file("good"), file("test")]).is_err());
}

#[test]
fn a_damaged_image_in_a_row_is_a_bad_image_skipped_and_counted() {
    let tmp = tempfile::tempdir().unwrap();
    let photos = jpeg_files("imagenet");
    let mut rows = labelled(&photos[..6]);
    rows.insert(3, (shared_data().join("jpeg/edge/truncated_jpeg.jpg"), 7));
    let file = tmp.path().join("d.parquet");
    to_parquet(&file, 2, &rows, json!({"names": hub_names()}));
    let ds = Dataset::open(&file).unwrap();
    assert_eq!(ds.len(), 7);
    let (images, stats) = load_epoch(ds);
    assert_eq!(images, 6);
    assert_eq!(stats.bad_images, 1);
    assert!(
        stats.bad_examples[0].contains("d.parquet (row group 1, row 1)"),
        "{:?}",
        stats.bad_examples
    );
}

/// `file` with the footer's row count of row group `group` replaced by `rows` (what a damaged or hostile
/// file claims), written back by the parquet crate's own metadata writer; the pages are untouched.
fn with_footer_rows(file: &Path, group: usize, rows: i64) {
    use parquet::file::metadata::{ParquetMetaDataReader, ParquetMetaDataWriter};
    let mut bytes = std::fs::read(file).unwrap();
    let n = bytes.len();
    assert_eq!(&bytes[n - 4..], b"PAR1");
    let footer = u32::from_le_bytes(bytes[n - 8..n - 4].try_into().unwrap()) as usize;
    let start = n - 8 - footer;
    let meta = ParquetMetaDataReader::decode_metadata(&bytes[start..n - 8]).unwrap();
    let mut groups = meta.row_groups().to_vec();
    groups[group] = groups[group]
        .clone()
        .into_builder()
        .set_num_rows(rows)
        .build()
        .unwrap();
    let meta = meta.into_builder().set_row_groups(groups).build();
    bytes.truncate(start);
    ParquetMetaDataWriter::new(&mut bytes, &meta)
        .finish()
        .unwrap();
    std::fs::write(file, bytes).unwrap();
}

/// A row group whose footer claims 2^40 rows aborted rn50 (exit 134: the labels' buffers were sized from
/// it), -5 or 2^62 rows panicked ("capacity overflow", exit 101); a few rows more or fewer than the group
/// holds were taken as they were, or refused as "ends early". Each is refused, naming the file and the
/// count, and nothing is sized from the count before the rows are read.
#[test]
fn a_footer_claiming_rows_the_row_group_does_not_hold_is_refused_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let rows = labelled(&jpeg_files("imagenet")[..4]);
    let good = tmp.path().join("good.parquet");
    // Two row groups of two rows.
    to_parquet(&good, 2, &rows, json!({"names": hub_names()}));
    assert_eq!(Dataset::open(&good).unwrap().len(), 4);
    let cases: [(i64, &str); 6] = [
        (
            1 << 40,
            "row group 1 has 1099511627776 rows, more than a row group can hold",
        ),
        (-5, "row group 1 has -5 rows"),
        (
            1 << 62,
            "row group 1 has 4611686018427387904 rows, more than",
        ),
        (
            u32::MAX as i64,
            "row group 1 has 4294967295 rows, but it holds 2",
        ),
        (3, "row group 1 has 3 rows, but it holds 2"),
        (1, "row group 1 has 1 rows, but it holds more"),
    ];
    for (claimed, expected) in cases {
        let file = tmp.path().join(format!("claims{claimed}.parquet"));
        std::fs::copy(&good, &file).unwrap();
        with_footer_rows(&file, 1, claimed);
        let e = error_opening(&file);
        assert!(e.contains(&format!("its footer says {expected}")), "{e}");
        // Through `Dataset::open` (what every command calls) as well.
        common::open_error(Dataset::open(&file), &file);
    }
}

/// A ClassLabel without class names (`datasets` writes one, its rows labelled -1) was refused as "outside its
/// 0 classes (0 to 18446744073709551615)"; it is refused as what it is, naming the file.
#[test]
fn a_class_label_without_names_is_refused_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let rows: Vec<(PathBuf, i64)> = jpeg_files("imagenet")[..2]
        .iter()
        .map(|p| (p.clone(), -1))
        .collect();
    let file = tmp.path().join("nameless.parquet");
    to_parquet(&file, 2, &rows, json!({"names": []}));
    let e = error_opening(&file);
    assert!(
        e.contains("its label is a ClassLabel feature with no class names"),
        "{e}"
    );
    assert!(!e.contains("18446744073709551615"), "{e}");
}

/// Runs `rn50 pack` with the arguments in `RN50_TEST_PACK_ARGS` (JSON) and rn50's log on stderr: the child
/// process of `training_on_the_validation_split_is_warned_of_once`; a no-op without the child's environment.
#[test]
#[ignore = "a child process of training_on_the_validation_split_is_warned_of_once"]
fn pack_logging_to_stderr() {
    let Ok(args) = std::env::var("RN50_TEST_PACK_ARGS") else {
        return;
    };
    let args: Vec<String> = serde_json::from_str(&args).unwrap();
    rn50_util::log::init(None);
    pack_command(&args.iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
}

/// `--train-split validation` read the validation images as the training split without a word: the
/// command warns, once, naming both splits. Not when the training split is another.
#[test]
fn training_on_the_validation_split_is_warned_of_once() {
    let tmp = tempfile::tempdir().unwrap();
    let rows = labelled(&jpeg_files("imagenet"));
    let names = json!({"names": hub_names()});
    let repo = tmp.path().join("repo");
    for (split, rows) in [("train", &rows[..4]), ("validation", &rows[100..104])] {
        let file = repo.join(format!("data/{split}-00000-of-00001.parquet"));
        to_parquet(&file, 4, rows, names.clone());
    }
    let pack = |out: &str, flags: &[&str]| {
        let out = tmp.path().join(out);
        let args = [&[repo.to_str().unwrap(), out.to_str().unwrap()][..], flags].concat();
        let child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "parquet::pack_logging_to_stderr",
                "--ignored",
                "--nocapture",
            ])
            .env("RN50_TEST_PACK_ARGS", serde_json::to_string(&args).unwrap())
            .env("RUST_LOG", "info")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&child.stderr).to_string();
        assert!(child.status.success(), "{stderr}");
        let warnings: Vec<String> = stderr
            .lines()
            .filter(|l| l.contains(" WARN "))
            .map(String::from)
            .collect();
        (warnings, stderr)
    };
    let (warnings, log) = pack("named", &["--train-split", "validation"]);
    assert_eq!(warnings.len(), 1, "{log}");
    assert!(
        warnings[0].contains(
            "the training split (--train-split validation) is the validation split (--val-split's \
             default, the first found of val, validation, test): validation in"
        ),
        "{log}"
    );
    assert!(log.contains("packing 4 images"), "{log}");
    let (warnings, log) = pack(
        "both",
        &["--train-split", "validation", "--val-split", "validation"],
    );
    assert_eq!(warnings.len(), 1, "{log}");
    assert!(
        warnings[0].contains(
            "(--train-split validation) is the validation split (--val-split validation)"
        ),
        "{log}"
    );
    // The usual splits, or a training split that is not the validation one: no warning.
    let (warnings, log) = pack("usual", &[]);
    assert!(warnings.is_empty(), "{log}");
    let (warnings, log) = pack(
        "other",
        &["--train-split", "validation", "--val-split", "train"],
    );
    assert!(warnings.is_empty(), "{log}");
}

/// The same check on a folder repository: the split `--train-split` names is compared with the one the
/// validation split's names find, so `test` is the validation split only where there is no `val/` or
/// `validation/`.
#[test]
fn the_training_split_is_compared_with_the_validation_split_found() {
    use rn50_pipeline::source::training_on_validation;
    let tmp = tempfile::tempdir().unwrap();
    for d in ["train", "val", "test"] {
        std::fs::create_dir_all(tmp.path().join(d)).unwrap();
    }
    let warns = |train, val| training_on_validation(tmp.path(), train, val);
    assert!(warns(Split::Named("val"), VAL_SPLIT).is_some_and(|w| w.contains(": val in ")));
    assert!(warns(Split::Named("test"), VAL_SPLIT).is_none());
    assert!(warns(Split::Named("test"), Split::Named("test")).is_some());
    assert!(warns(TRAIN_SPLIT, VAL_SPLIT).is_none());
    assert!(warns(Split::Named("missing"), VAL_SPLIT).is_none());
    std::fs::remove_dir(tmp.path().join("val")).unwrap();
    assert!(warns(Split::Named("test"), VAL_SPLIT).is_some_and(|w| w.contains(": test in ")));
}
