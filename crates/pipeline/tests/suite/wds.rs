//! WebDataset shards, written by webdataset's own `ShardWriter` from the shared ImageNet photos: read by
//! rn50 they are the same (image, class) samples as the ImageFolder of the same photos, through a
//! directory, a brace pattern or a split of a dataset repository; the per-tar index is cached and made
//! again when the tar changes (rewritten in place with its size and mtime too) or the cached index does not
//! fit it; bad shards are refused with an error naming the file, and a damaged image inside one, or a member
//! declaring gigabytes, is a bad image like any other; a brace pattern naming too many files is refused;
//! packed, they are the same samples again.

use crate::common;

use std::path::{Path, PathBuf};

use common::*;
use rn50_pipeline::source::wds::{
    expand_braces, split_of, WebDataset, MAX_IMAGE_BYTES, MAX_PATTERN_FILES,
};
use rn50_pipeline::source::{Source, Split, TRAIN_SPLIT, VAL_SPLIT};
use rn50_pipeline::Dataset;
use serde_json::json;

/// Runs `scripts/dataset_writers.py wds PATTERN MAXCOUNT SPEC`.
fn shard_writer(pattern: &Path, maxcount: usize, spec: serde_json::Value) {
    let spec_file = pattern.with_file_name("spec.json");
    std::fs::create_dir_all(pattern.parent().unwrap()).unwrap();
    std::fs::write(&spec_file, spec.to_string()).unwrap();
    dataset_writer(&[
        "wds",
        pattern.to_str().unwrap(),
        &maxcount.to_string(),
        spec_file.to_str().unwrap(),
    ]);
    std::fs::remove_file(spec_file).unwrap();
}

/// One sample per photo, labelled by `.cls` (and, every third one, by `.json` alone).
fn photo_samples(photos: &[PathBuf]) -> serde_json::Value {
    photos
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let label = imagenet_label(p);
            let mut s = json!({"key": format!("sample{i:05}"), "image": p});
            if i % 3 == 2 {
                s["json"] = json!({"label": label, "filename": p.file_name().unwrap().to_str()});
            } else {
                s["cls"] = json!(label);
            }
            s
        })
        .collect()
}

#[test]
fn shards_written_by_webdataset_are_the_imagefolders_samples() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = temp_cache();
    let folder = Dataset::open(imagenet_folder(tmp.path())).unwrap();
    let photos = jpeg_files("imagenet");
    let repo = tmp.path().join("repo");
    // timm's naming: imagenet1k-train-NNNN.tar and imagenet1k-validation-NNNN.tar side by side.
    shard_writer(
        &repo.join("imagenet1k-train-%04d.tar"),
        64,
        photo_samples(&photos),
    );
    shard_writer(
        &repo.join("imagenet1k-validation-%04d.tar"),
        1000,
        photo_samples(&photos[..10]),
    );
    let tars: Vec<PathBuf> = (0..4)
        .map(|i| repo.join(format!("imagenet1k-train-{i:04}.tar")))
        .collect();
    assert!(tars.iter().all(|t| t.is_file()), "220 photos, 64 a shard");
    assert_eq!(split_of(&tars[0]), Some("train"));

    let expected = samples(&folder);
    let train = Dataset::open_split(&repo, TRAIN_SPLIT).unwrap().unwrap();
    assert_eq!(train.len(), 220);
    assert_eq!(train.classes().len(), 1000);
    assert_eq!(train.classes()[0], "n01440764");
    assert!(samples(&train) == expected);
    let val = Dataset::open_split(&repo, VAL_SPLIT).unwrap().unwrap();
    assert_eq!(val.len(), 10);
    assert_eq!(val.classes(), train.classes());
    // The tars' indexes went to RN50_CACHE_DIR, the test's own folder.
    let indexes = std::fs::read_dir(cache.dir.path().join("wds-index")).unwrap();
    assert_eq!(indexes.count(), 4 + 1);

    // webdataset's brace pattern names the same shards, in the same order.
    let pattern = repo.join("imagenet1k-train-{0000..0003}.tar");
    let by_pattern = Dataset::open(&pattern).unwrap();
    let mut a = Vec::new();
    let mut b = Vec::new();
    for i in 0..220 {
        assert_eq!(by_pattern.label(i), train.label(i));
        assert_eq!(
            by_pattern.read(i, &mut a).unwrap(),
            train.read(i, &mut b).unwrap()
        );
    }
    // A directory holding both splits' shards is not taken as one dataset.
    let err = format!("{:#}", Dataset::open(&repo).unwrap_err());
    assert!(err.contains("several splits (train, validation)"), "{err}");
    // train/ and val/ folders of shards are splits too.
    std::fs::create_dir(repo.join("train")).unwrap();
    for t in &tars {
        std::fs::rename(t, repo.join("train").join(t.file_name().unwrap())).unwrap();
    }
    let train = Dataset::open_split(&repo, TRAIN_SPLIT).unwrap().unwrap();
    assert!(samples(&train) == expected);

    // The loader decodes the same pixels for each image, whatever the source.
    assert!(decoded_samples(train) == decoded_samples(folder));
}

/// Two shards, `<dir>/mini-<split>-0000.tar` for each of `splits`, of 6 and 3 photos.
fn two_splits(dir: &Path, splits: [&str; 2]) -> Vec<PathBuf> {
    let photos = jpeg_files("imagenet");
    for (split, n) in splits.into_iter().zip([6, 3]) {
        let pattern = dir.join(format!("mini-{split}-%04d.tar"));
        shard_writer(&pattern, 100, photo_samples(&photos[..n]));
    }
    photos
}

#[test]
fn splits_of_other_names_are_found_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let _cache = temp_cache();
    let repo = tmp.path().join("repo");
    two_splits(&repo, ["trn", "valid"]);
    assert!(Dataset::open_split(&repo, TRAIN_SPLIT).unwrap().is_none());
    assert!(Dataset::open_split(&repo, VAL_SPLIT).unwrap().is_none());
    let train = Dataset::open_split(&repo, Split::Named("trn")).unwrap();
    assert_eq!(train.unwrap().len(), 6);
    let val = Dataset::open_split_or_whole(&repo, Split::Named("valid")).unwrap();
    assert_eq!(val.len(), 3);
    // Without the split, train's error says what it looked for; a split named and not there is no whole DATA.
    let err = format!(
        "{:#}",
        Dataset::open_required_split(&repo, TRAIN_SPLIT).unwrap_err()
    );
    assert!(
        err.contains(
            "has no train/ folder, nor WebDataset shards *-train-NNNN.tar, nor parquet files"
        ),
        "{err}"
    );
    let err = format!(
        "{:#}",
        Dataset::open_split_or_whole(&repo, Split::Named("val")).unwrap_err()
    );
    assert!(err.contains("has no val/ folder"), "{err}");
}

#[test]
fn packed_from_webdataset_shards_the_splits_are_the_same_samples() {
    let tmp = tempfile::tempdir().unwrap();
    let _cache = temp_cache();
    let repo = tmp.path().join("repo");
    two_splits(&repo, ["train", "validation"]);
    let out = tmp.path().join("packed");
    let p = |p: &Path| p.to_str().unwrap().to_string();
    // The repository's two splits become out/train and out/val, which train and eval read; 6 and 3 of the 1000
    // classes have images, the others are empty in the WebDataset as in the shards.
    pack_command(&[&p(&repo), &p(&out)]).unwrap();
    for split in [TRAIN_SPLIT, VAL_SPLIT] {
        let packed = Dataset::open_required_split(&out, split).unwrap();
        let shards = Dataset::open_required_split(&repo, split).unwrap();
        assert!(packed.description().starts_with("shards"), "{packed:?}");
        assert_eq!(packed.classes(), shards.classes());
        assert!(samples(&packed) == samples(&shards));
        let labels = |d: &Dataset| (0..d.len()).map(|i| d.label(i)).collect::<Vec<_>>();
        assert_eq!(labels(&packed), labels(&shards), "in the same order");
    }
    // Other names, named; one split alone is packed into OUT itself.
    let other = tmp.path().join("other");
    two_splits(&other, ["trn", "valid"]);
    let one = tmp.path().join("one");
    pack_command(&[&p(&other), &p(&one), "--val-split", "valid"]).unwrap();
    assert_eq!(Dataset::open(&one).unwrap().len(), 3);
    let err =
        pack_command(&[&p(&other), &p(&tmp.path().join("x")), "--val-split", "val"]).unwrap_err();
    assert!(format!("{err:#}").contains("has no val/ folder"), "{err:#}");
    assert!(!tmp.path().join("x").exists());
}

#[test]
fn brace_patterns_expand_as_webdatasets() {
    assert_eq!(
        expand_braces("a-{08..11}.tar").unwrap(),
        ["a-08.tar", "a-09.tar", "a-10.tar", "a-11.tar"]
    );
    assert_eq!(
        expand_braces("{x,y}-{1..2}").unwrap(),
        ["x-1", "x-2", "y-1", "y-2"]
    );
    assert_eq!(expand_braces("plain.tar").unwrap(), ["plain.tar"]);
    for bad in ["a-{3..1}.tar", "a-{0..x}.tar", "a-{0..1.tar"] {
        assert!(expand_braces(bad).is_err(), "{bad}");
    }
}

/// Issue 43: each range was capped, their product was not: `x-{0..999999}-{0..999999}.tar` asked for 10^12
/// names and aborted the process ("memory allocation of 24000000000000 bytes failed"). The names a pattern
/// makes are counted, and refused past `MAX_PATTERN_FILES`, before any is made.
#[test]
fn a_brace_pattern_naming_too_many_files_is_refused_before_any_is_made() {
    let err = |pattern: &str| format!("{:#}", expand_braces(pattern).unwrap_err());
    let e = err("x-{0..999999}-{0..999999}.tar");
    assert!(
        e.contains("names 1000000000000 files, more than the 1048576"),
        "{e}"
    );
    // Past u64, and lists multiply as ranges do.
    let e = err("{0..18446744073709551615}{0..1}");
    assert!(e.contains("over 2^64"), "{e}");
    let e = err("{a,b,c,d}-{0..999999}.tar");
    assert!(e.contains("names 4000000 files"), "{e}");
    // At the limit they are all there; one more is too many.
    let top = MAX_PATTERN_FILES - 1;
    let names = expand_braces(&format!("{{0..{}}}-{{0..{}}}", 1023, top / 1024)).unwrap();
    assert_eq!(names.len() as u64, MAX_PATTERN_FILES);
    assert_eq!(names[0], "0-0");
    assert_eq!(names.last().unwrap(), &format!("1023-{}", top / 1024));
    assert!(expand_braces(&format!("{{0..{}}}{{a,b}}", top)).is_err());
    // Long names count too: a million names of 1 kB would be a gigabyte of them.
    let long = "d".repeat(1000);
    let e = err(&format!("/{long}/x-{{0..999999}}.tar"));
    assert!(e.contains("MiB of names"), "{e}");
    // As `bench-loader`, `pack` and `eval` open DATA: an error, not an abort.
    let e = format!(
        "{:#}",
        Dataset::open("/nonexistent/x-{0..999999}-{0..999999}.tar").unwrap_err()
    );
    assert!(e.contains("more than the 1048576"), "{e}");
}

/// A tar header (GNU's: a size past 8 GiB is written in base-256, as GNU tar writes it).
fn tar_header(name: &str, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_path(name).unwrap();
    h.set_size(size);
    h.set_mode(0o644);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_cksum();
    h
}

/// Writes a tar of `members` at `path` (replacing its contents in place, the inode kept): each (name, bytes,
/// size) is a header saying `size` followed by `bytes`, then zeros up to `size`, left as a hole in the file
/// (a sparse file: a member can say gigabytes in a few kilobytes); then the end-of-archive blocks.
fn write_tar(path: &Path, members: &[(&str, &[u8], u64)]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::options()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .unwrap();
    let mut at = 0u64;
    for (name, bytes, size) in members {
        assert!(bytes.len() as u64 <= *size);
        f.write_all_at(tar_header(name, *size).as_bytes(), at)
            .unwrap();
        f.write_all_at(bytes, at + 512).unwrap();
        at += 512 + size.div_ceil(512) * 512;
    }
    f.set_len(at + 1024).unwrap();
}

/// A tar of the samples `(key, image bytes, label)`, as webdataset writes them: `key.jpg`, then `key.cls`.
fn photo_tar(path: &Path, samples: &[(&str, &[u8], u64)]) {
    let labels: Vec<String> = samples.iter().map(|s| s.2.to_string()).collect();
    let names: Vec<[String; 2]> = samples
        .iter()
        .map(|s| [format!("{}.jpg", s.0), format!("{}.cls", s.0)])
        .collect();
    let mut members = Vec::new();
    for ((s, label), [jpg, cls]) in samples.iter().zip(&labels).zip(&names) {
        members.push((jpg.as_str(), s.1, s.1.len() as u64));
        members.push((cls.as_str(), label.as_bytes(), label.len() as u64));
    }
    write_tar(path, &members);
}

/// Issue 43: a member whose header says 9 GiB (a sparse tar of 36 KB on disk) aborted the loader: the read
/// resized its buffer to what the header said. An image member longer than `MAX_IMAGE_BYTES` is a bad image,
/// refused unread (nothing of its size allocated), skipped and counted as any other.
#[test]
fn a_member_declaring_gigabytes_is_a_bad_image_skipped_and_counted() {
    let tmp = tempfile::tempdir().unwrap();
    let _cache = temp_cache();
    let photos = jpeg_files("imagenet");
    let photo = |i: usize| std::fs::read(&photos[i]).unwrap();
    let (a, b, c) = (photo(0), photo(1), photo(2));
    let label = |i: usize| imagenet_label(&photos[i]).to_string();
    let tar = tmp.path().join("big-000000.tar");
    let (la, lb, lc) = (label(0), label(1), label(2));
    write_tar(
        &tar,
        &[
            ("s0.jpg", &a, a.len() as u64),
            ("s0.cls", la.as_bytes(), la.len() as u64),
            // The image's bytes, then zeros to 9 GiB.
            ("huge.jpg", &b, 9 << 30),
            ("huge.cls", lb.as_bytes(), lb.len() as u64),
            ("s2.jpg", &c, c.len() as u64),
            ("s2.cls", lc.as_bytes(), lc.len() as u64),
        ],
    );
    assert!(std::fs::metadata(&tar).unwrap().len() > 9 << 30);
    let ds = Dataset::open(&tar).unwrap();
    assert_eq!(ds.len(), 3);
    let mut buf = Vec::new();
    let err = format!("{:#}", ds.read(1, &mut buf).unwrap_err());
    assert!(
        err.contains("huge.jpg") && err.contains("more than an image may have (256 MiB)"),
        "{err}"
    );
    assert!(
        buf.capacity() as u64 <= MAX_IMAGE_BYTES,
        "{}",
        buf.capacity()
    );
    assert_eq!(ds.read(2, &mut buf).unwrap(), &c[..]);
    // The loader's count, as for an ImageFolder's bad images.
    let (images, stats) = load_epoch(ds);
    assert_eq!((images, stats.bad_images), (2, 1), "{stats:?}");
    assert!(
        stats.bad_examples[0].contains("big-000000.tar: huge.jpg")
            && stats.bad_examples[0].contains("more than an image may have"),
        "{:?}",
        stats.bad_examples
    );
}

/// The cached index of `tar` in `cache` (the only one there), as JSON, and its file.
fn cached_index(cache: &Path) -> (serde_json::Value, PathBuf) {
    let files: Vec<PathBuf> = std::fs::read_dir(cache.join("wds-index"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let json = serde_json::from_slice(&std::fs::read(&files[0]).unwrap()).unwrap();
    (json, files[0].clone())
}

fn labels(w: &WebDataset) -> Vec<i64> {
    (0..w.len()).map(|i| w.label(i)).collect()
}

/// Issue 43: the cached index was used while the tar's size and mtime were those it was made from. A tar
/// rewritten in place with both kept (`cp -p`, `rsync -t --inplace`, `tar x` keep mtimes; other labels,
/// images of the same lengths) trained on the old labels and offsets, where an empty cache read the new ones.
#[test]
fn a_tar_rewritten_in_place_with_its_size_and_mtime_is_indexed_again() {
    use std::os::unix::fs::MetadataExt;
    let tmp = tempfile::tempdir().unwrap();
    let photos = jpeg_files("imagenet");
    let (a, b) = (
        std::fs::read(&photos[0]).unwrap(),
        std::fs::read(&photos[1]).unwrap(),
    );
    let tar = tmp.path().join("s-000000.tar");
    let cache = tmp.path().join("cache");
    let open = || WebDataset::open(std::slice::from_ref(&tar), Some(&cache)).unwrap();
    photo_tar(&tar, &[("s0", &a, 101), ("s1", &b, 202)]);
    assert_eq!(labels(&open()), [101, 202]);
    let before = std::fs::metadata(&tar).unwrap();
    // Rewritten in place: the labels swapped, the same length; then its mtime set back, as `cp -p` does.
    photo_tar(&tar, &[("s0", &a, 202), ("s1", &b, 101)]);
    let f = std::fs::File::options().write(true).open(&tar).unwrap();
    f.set_modified(before.modified().unwrap()).unwrap();
    // The change time is the file system's clock at the change: one tick after the index was made, as for
    // any real rewrite (a coarse clock may not have ticked yet when this test gets here).
    let ctime = |m: &std::fs::Metadata| (m.ctime(), m.ctime_nsec());
    while ctime(&std::fs::metadata(&tar).unwrap()) == ctime(&before) {
        f.set_modified(before.modified().unwrap()).unwrap();
    }
    let after = std::fs::metadata(&tar).unwrap();
    assert_eq!(
        (after.len(), after.modified().unwrap(), after.ino()),
        (before.len(), before.modified().unwrap(), before.ino())
    );
    assert_eq!(labels(&open()), [202, 101], "the old index was used");
    assert_eq!(
        labels(&WebDataset::open(std::slice::from_ref(&tar), None).unwrap()),
        [202, 101]
    );
    // The new index is cached and used: a label edited in it shows.
    let (mut index, file) = cached_index(&cache);
    index["samples"][0]["label"] = json!(7);
    std::fs::write(&file, index.to_string()).unwrap();
    assert_eq!(labels(&open()), [7, 101]);
}

/// Issue 43: a cached entry was trusted as it was: an image length of 10^13 aborted the loader (the buffer
/// resized to it). Each entry is checked against the tar (its image within the file, its label one of the
/// classes); an index that does not fit, or of an older format, is made again from the tar.
#[test]
fn a_cached_index_that_does_not_fit_the_tar_is_made_again() {
    let tmp = tempfile::tempdir().unwrap();
    let photos = jpeg_files("imagenet");
    let (a, b) = (
        std::fs::read(&photos[0]).unwrap(),
        std::fs::read(&photos[1]).unwrap(),
    );
    let tar = tmp.path().join("s-000000.tar");
    let cache = tmp.path().join("cache");
    photo_tar(&tar, &[("s0", &a, 3), ("s1", &b, 4)]);
    let open = || WebDataset::open(std::slice::from_ref(&tar), Some(&cache)).unwrap();
    let good = open();
    let (index, file) = cached_index(&cache);
    let size = std::fs::metadata(&tar).unwrap().len();
    // (what, where in the index, what it is made)
    let edits = [
        (
            "a length of 10^13",
            "/samples/1/len",
            json!(10_000_000_000_000u64),
        ),
        ("an offset past the end", "/samples/0/offset", json!(size)),
        (
            "an offset that wraps",
            "/samples/0/offset",
            json!(u64::MAX - 2),
        ),
        (
            "an offset inside the first header",
            "/samples/0/offset",
            json!(0),
        ),
        ("a label past the classes", "/samples/1/label", json!(5000)),
        ("no samples", "/samples", json!([])),
    ];
    for (what, at, value) in edits {
        let mut edited = index.clone();
        *edited.pointer_mut(at).unwrap() = value;
        std::fs::write(&file, edited.to_string()).unwrap();
        let w = open();
        assert_eq!(labels(&w), [3, 4], "{what}");
        let mut buf = Vec::new();
        for (i, photo) in [&a, &b].into_iter().enumerate() {
            assert_eq!(w.read(i, &mut buf).unwrap(), &photo[..], "{what}");
        }
        // Made again, and cached again.
        assert_eq!(cached_index(&cache).0, index, "{what}");
    }
    // rn50 before issue 43 cached the size and mtime alone (format 2): not an error, no index; what it says
    // (here an edited label) is not read.
    let mut old = json!({
        "format_version": 2,
        "path": index["path"],
        "size": size,
        "mtime_ns": index["stamp"]["mtime_ns"],
        "samples": index["samples"],
    });
    old["samples"][0]["label"] = json!(9);
    std::fs::write(&file, old.to_string()).unwrap();
    assert_eq!(labels(&open()), [3, 4]);
    assert_eq!(cached_index(&cache).0, index);
    // Nor is a file that is no index at all.
    std::fs::write(&file, b"{not json").unwrap();
    assert_eq!(labels(&open()), [3, 4]);
    assert_eq!(labels(&good), [3, 4]);
}

#[test]
fn the_index_is_cached_and_made_again_when_the_tar_changes() {
    let tmp = tempfile::tempdir().unwrap();
    let photos = jpeg_files("imagenet");
    let tar = tmp.path().join("shards/s-000000.tar");
    shard_writer(
        &tmp.path().join("shards/s-%06d.tar"),
        1000,
        photo_samples(&photos[..5]),
    );
    let cache = tmp.path().join("cache");
    let first = WebDataset::open(std::slice::from_ref(&tar), Some(&cache)).unwrap();
    let label0 = first.label(0);
    let indexes: Vec<PathBuf> = std::fs::read_dir(cache.join("wds-index"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(indexes.len(), 1, "{indexes:?}");
    // The cached index is what is read while the tar's size and mtime are unchanged: edited, it shows.
    let mut index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&indexes[0]).unwrap()).unwrap();
    let other = (label0 + 1) % 1000;
    index["samples"][0]["label"] = json!(other);
    std::fs::write(&indexes[0], index.to_string()).unwrap();
    let cached = WebDataset::open(std::slice::from_ref(&tar), Some(&cache)).unwrap();
    assert_eq!(cached.label(0), other);
    // A new mtime (the tar rewritten) makes it index the tar again.
    let f = std::fs::File::options().append(true).open(&tar).unwrap();
    f.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(5))
        .unwrap();
    drop(f);
    let again = WebDataset::open(std::slice::from_ref(&tar), Some(&cache)).unwrap();
    assert_eq!(again.label(0), label0);
    // Without a cache directory it indexes every time, the same.
    let uncached = WebDataset::open(std::slice::from_ref(&tar), None).unwrap();
    assert_eq!(uncached.len(), 5);
    assert_eq!(uncached.label(0), label0);
}

/// The error of opening `tar` alone (no cache), one line naming it.
fn error_opening(tar: &Path) -> String {
    common::open_error(WebDataset::open(&[tar.to_path_buf()], None), tar)
}

#[test]
fn bad_shards_are_refused_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let photos = jpeg_files("imagenet");
    let good = tmp.path().join("good-000000.tar");
    shard_writer(
        &tmp.path().join("good-%06d.tar"),
        1000,
        photo_samples(&photos[..3]),
    );
    let bytes = std::fs::read(&good).unwrap();
    let write = |name: &str, b: &[u8]| {
        let p = tmp.path().join(name);
        std::fs::write(&p, b).unwrap();
        p
    };
    // Cut inside the second photo, and cut at a member's end (no end-of-archive blocks).
    let cut = write("cut.tar", &bytes[..bytes.len() / 2]);
    assert!(error_opening(&cut).contains("truncated"));
    // The tar without its end-of-archive blocks, ending where its last member's data ends.
    let mut one_member = bytes.clone();
    let zeros = one_member.len() - one_member.iter().rev().position(|&b| b != 0).unwrap();
    one_member.truncate(zeros.div_ceil(512) * 512);
    let boundary = write("boundary.tar", &one_member);
    assert!(error_opening(&boundary).contains("no end-of-archive"));
    // Not a tar at all: a JPEG named .tar, and an empty file.
    let photo = std::fs::read(&photos[0]).unwrap();
    assert!(error_opening(&write("photo.tar", &photo)).contains("not a tar"));
    assert!(!error_opening(&write("empty.tar", b"")).is_empty());

    // Samples written by webdataset without a label, with a label past the 1000 classes, with a label
    // that is no number, without an image.
    let bad = |name: &str, sample: serde_json::Value| {
        shard_writer(
            &tmp.path().join(format!("{name}-%06d.tar")),
            1000,
            json!([{"key": "ok", "image": photos[1], "cls": 1}, sample]),
        );
        error_opening(&tmp.path().join(format!("{name}-000000.tar")))
    };
    let e = bad("nolabel", json!({"key": "x", "image": photos[0]}));
    assert!(e.contains("sample \"x\" has no label"), "{e}");
    let e = bad(
        "range",
        json!({"key": "x", "image": photos[0], "cls": 1000}),
    );
    assert!(
        e.contains("label 1000 is outside the 1000 ImageNet classes"),
        "{e}"
    );
    let e = bad(
        "jsonrange",
        json!({"key": "x", "image": photos[0], "json": {"label": 5000}}),
    );
    assert!(e.contains("label 5000"), "{e}");
    let e = bad(
        "noimage",
        json!({"key": "x", "image": photos[0], "ext": "txt", "cls": 3}),
    );
    assert!(e.contains("sample \"x\" has no image"), "{e}");
    // Shards of another class order: the name (a key as ImageNet's train files are named, or the json's
    // filename) says another class than the label's in ImageNet-1k's order.
    let e = bad(
        "order",
        json!({"key": "n01443537_1234", "image": photos[0], "cls": 0}),
    );
    assert!(
        e.contains(
            "label 0 is n01440764 in ImageNet-1k's class order, but its name says n01443537"
        ),
        "{e}"
    );
    let filename = json!({"label": 2, "filename": "n01443537/n01443537_1234.JPEG"});
    let e = bad(
        "orderjson",
        json!({"key": "x", "image": photos[0], "json": filename}),
    );
    assert!(e.contains("its name says n01443537"), "{e}");
    // Named as its label's class, it is read.
    shard_writer(
        &tmp.path().join("named-%06d.tar"),
        1000,
        json!([{"key": "n01443537_1234", "image": photos[0], "cls": 1}]),
    );
    let named = WebDataset::open(&[tmp.path().join("named-000000.tar")], None).unwrap();
    assert_eq!(named.label(0), 1);
    // A shard of other splits' names does not change any of this: each tar's verdict is its own.
    assert!(WebDataset::open(std::slice::from_ref(&good), None).is_ok());
    assert!(WebDataset::open(&[good, cut], None).is_err());
}

#[test]
fn a_damaged_image_in_a_shard_is_a_bad_image_skipped_and_counted() {
    let tmp = tempfile::tempdir().unwrap();
    let _cache = temp_cache();
    let photos = jpeg_files("imagenet");
    let truncated = shared_data().join("jpeg/edge/truncated_jpeg.jpg");
    let mut spec = photo_samples(&photos[..6]);
    // The damaged one in the middle, between good ones.
    spec.as_array_mut()
        .unwrap()
        .insert(3, json!({"key": "damaged", "image": truncated, "cls": 7}));
    let pattern = tmp.path().join("d-%06d.tar");
    shard_writer(&pattern, 1000, spec);
    let ds = Dataset::open(tmp.path().join("d-000000.tar")).unwrap();
    assert_eq!(ds.len(), 7);
    let (images, stats) = load_epoch(ds);
    assert_eq!(images, 6);
    assert_eq!(stats.bad_images, 1);
    assert!(
        stats.bad_examples[0].contains("d-000000.tar: damaged.jpg"),
        "{:?}",
        stats.bad_examples
    );
}
