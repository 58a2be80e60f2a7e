//! End-to-end: extraction, odd files, re-runs, resume after an interruption, verification,
//! `check`, and the command line.

use crate::common;

use std::path::Path;

use common::*;
use md5::{Digest, Md5};
use rn50_data::{check, Expect};
use rn50_data::{hex, verify_files};
use rn50_data::{prepare, ArchiveTable, ValLabels};

fn file_size(p: &Path) -> u64 {
    std::fs::metadata(p).unwrap().len()
}

#[test]
fn extracts_train_and_val_file_by_file() {
    let fx = build();
    let out = fx.dir.path().join("out");
    let s = prepare(&options(Some(&fx.train_tar), Some(&fx.val_tar), &out)).unwrap();
    assert_same_tree(&read_tree(&out), &fx.expected);
    let train_files = fx
        .expected
        .keys()
        .filter(|k| k.starts_with("train/"))
        .count() as u64;
    assert_eq!(s.train_images, train_files);
    assert_eq!(s.val_images, 24);
    assert_eq!(s.classes, 6);
    assert_eq!(s.train_classes_extracted, 6);
    assert_eq!(
        s.bytes_read,
        file_size(&fx.train_tar) + file_size(&fx.val_tar)
    );
    // Odd files are found by content and left as they are without --fix-odd-files.
    let mut odd: Vec<_> = s.odd.iter().map(|o| o.file.clone()).collect();
    odd.sort();
    assert_eq!(odd, fx.odd);
    assert_eq!((s.odd_files, s.odd_fixed), (2, 0));
    assert!(
        s.odd.iter().any(|o| o.kind == "CMYK JPEG")
            && s.odd.iter().any(|o| o.kind.starts_with("PNG"))
    );
    let r = check(&out, Expect::Auto).unwrap();
    assert!(r.ok(), "{:?}", r.problems);
    assert_eq!(
        (r.train_images, r.val_images, r.imagenet),
        (train_files, 24, false)
    );
}

#[test]
fn single_thread_and_either_tar_alone() {
    let fx = build();
    let out = fx.dir.path().join("out");
    let mut o = options(Some(&fx.train_tar), None, &out);
    o.extract.threads = 1;
    let s = prepare(&o).unwrap();
    assert_eq!(s.val_images, 0);
    let train: Tree = fx
        .expected
        .clone()
        .into_iter()
        .filter(|(k, _)| k.starts_with("train/"))
        .collect();
    assert_same_tree(&read_tree(&out), &train);
    let s = prepare(&options(None, Some(&fx.val_tar), &out)).unwrap();
    assert_eq!(s.val_images, 24);
    assert_same_tree(&read_tree(&out), &fx.expected);
}

#[test]
fn rerun_on_a_finished_tree_does_no_work() {
    let fx = build();
    let out = fx.dir.path().join("out");
    let opts = options(Some(&fx.train_tar), Some(&fx.val_tar), &out);
    prepare(&opts).unwrap();
    let some_file = out.join(fx.expected.keys().next().unwrap());
    let before = std::fs::metadata(&some_file).unwrap().modified().unwrap();
    let s = prepare(&opts).unwrap();
    assert_eq!(s.bytes_read, 0);
    assert_eq!(s.bytes_written, 0);
    assert_eq!((s.train_classes_extracted, s.train_classes_skipped), (0, 6));
    assert_eq!(
        (s.train_images, s.val_images, s.odd_files),
        (fx.expected.len() as u64 - 24, 24, 2)
    );
    assert_eq!(
        std::fs::metadata(&some_file).unwrap().modified().unwrap(),
        before
    );
    assert_same_tree(&read_tree(&out), &fx.expected);
}

#[test]
fn fix_odd_files_reencodes_them_as_rgb_jpeg() {
    let fx = build();
    let out = fx.dir.path().join("out");
    let mut opts = options(Some(&fx.train_tar), Some(&fx.val_tar), &out);
    opts.extract.fix_odd = true;
    let s = prepare(&opts).unwrap();
    assert_eq!((s.odd_files, s.odd_fixed), (2, 2));
    let tree = read_tree(&out);
    for rel in &fx.odd {
        let data = &tree[rel];
        assert_eq!(rn50_data::detect_odd(data), None, "{rel} still odd");
        let orig = rn50_pipeline::decode::decode_rgb(&fx.expected[rel]).unwrap();
        let fixed = rn50_pipeline::decode::decode_rgb(data).unwrap();
        assert_eq!((fixed.width, fixed.height), (orig.width, orig.height));
    }
    // Everything else is byte for byte the archive's.
    let rest = |t: &Tree| -> Tree {
        t.iter()
            .filter(|(k, _)| !fx.odd.contains(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    assert_same_tree(&rest(&tree), &rest(&fx.expected));
}

#[test]
fn fix_odd_files_on_a_finished_tree_fixes_in_place_without_reading_the_archive() {
    let fx = build();
    let out = fx.dir.path().join("out");
    let mut opts = options(Some(&fx.train_tar), None, &out);
    prepare(&opts).unwrap();
    opts.extract.fix_odd = true;
    let s = prepare(&opts).unwrap();
    assert_eq!(s.bytes_read, 0);
    assert_eq!((s.odd_files, s.odd_fixed), (2, 2));
    for rel in &fx.odd {
        assert_eq!(
            rn50_data::detect_odd(&std::fs::read(out.join(rel)).unwrap()),
            None
        );
    }
    let again = prepare(&opts).unwrap();
    assert_eq!(
        (again.odd_files, again.odd_fixed, again.bytes_read),
        (2, 2, 0)
    );
}

#[test]
fn resumes_after_an_interruption() {
    let fx = build();
    let out = fx.dir.path().join("out");
    // An interrupted download/copy: the outer tar cut off inside the fourth class.
    let full = std::fs::read(&fx.train_tar).unwrap();
    let cut_class = &fx.classes[3];
    let start = full
        .windows(cut_class.len() + 4)
        .position(|w| w == format!("{cut_class}.tar").as_bytes())
        .unwrap();
    let cut = fx.dir.path().join("cut").join("ILSVRC2012_img_train.tar");
    std::fs::create_dir_all(cut.parent().unwrap()).unwrap();
    std::fs::write(&cut, &full[..start + 512 + 3000]).unwrap();
    let err = format!(
        "{:#}",
        prepare(&options(Some(&cut), None, &out)).unwrap_err()
    );
    assert!(
        err.contains(&format!("{cut_class}.tar")) && err.contains("truncated"),
        "{err}"
    );
    // The three classes before it are complete and marked; the cut one left nothing behind.
    for (i, wnid) in fx.classes.iter().enumerate() {
        let marker = out.join(".rn50-prepare/train").join(format!("{wnid}.json"));
        assert_eq!(marker.exists(), i < 3, "{wnid}");
    }
    assert!(!out.join("train").join(cut_class).exists());
    let r = check(&out, Expect::Auto).unwrap();
    assert_eq!(r.train_classes, 3);

    // A run killed while writing the fifth class: its folder holds a partial file and junk,
    // and the bookkeeping says the class was started (so it is prepare's, not a user's).
    let partial = out.join("train").join(&fx.classes[4]);
    std::fs::create_dir_all(&partial).unwrap();
    std::fs::write(
        out.join(".rn50-prepare/train")
            .join(format!("{}.started", fx.classes[4])),
        b"",
    )
    .unwrap();
    std::fs::write(partial.join("junk.JPEG"), b"half a file").unwrap();
    let r = check(&out, Expect::Auto).unwrap();
    assert!(
        r.problems
            .iter()
            .any(|p| p.contains(&fx.classes[4]) && p.contains("incomplete")),
        "{:?}",
        r.problems
    );

    let s = prepare(&options(Some(&fx.train_tar), Some(&fx.val_tar), &out)).unwrap();
    assert_eq!((s.train_classes_skipped, s.train_classes_extracted), (3, 3));
    assert_same_tree(&read_tree(&out), &fx.expected);
    assert!(check(&out, Expect::Auto).unwrap().ok());
}

#[test]
fn interrupted_val_is_redone() {
    let fx = build();
    let out = fx.dir.path().join("out");
    let full = std::fs::read(&fx.val_tar).unwrap();
    let cut = fx.dir.path().join("cut").join("ILSVRC2012_img_val.tar");
    std::fs::create_dir_all(cut.parent().unwrap()).unwrap();
    std::fs::write(&cut, &full[..full.len() / 2]).unwrap();
    let err = format!(
        "{:#}",
        prepare(&options(None, Some(&cut), &out)).unwrap_err()
    );
    assert!(
        err.contains("ILSVRC2012_val_000000") && err.contains("truncated"),
        "{err}"
    );
    assert!(!out.join(".rn50-prepare/val.done.json").exists());
    let s = prepare(&options(None, Some(&fx.val_tar), &out)).unwrap();
    assert_eq!(s.val_images, 24);
    let val: Tree = fx
        .expected
        .clone()
        .into_iter()
        .filter(|(k, _)| k.starts_with("val/"))
        .collect();
    assert_same_tree(&read_tree(&out), &val);
}

fn table_for(files: &[&Path], wrong_md5: bool) -> ArchiveTable {
    let mut tsv = String::from("file\tbytes\tmd5\tsha256\n");
    for f in files {
        let mut md5 = hex(&Md5::digest(std::fs::read(f).unwrap()));
        if wrong_md5 {
            md5 = md5.replace(|c: char| c != '0', "0");
        }
        tsv += &format!(
            "{}\t{}\t{md5}\t\n",
            f.file_name().unwrap().to_str().unwrap(),
            file_size(f)
        );
    }
    ArchiveTable::parse(&tsv).unwrap()
}

#[test]
fn verify_hashes_while_extracting() {
    let fx = build();
    let out = fx.dir.path().join("out");
    let mut opts = options(Some(&fx.train_tar), Some(&fx.val_tar), &out);
    opts.extract.verify = true;
    opts.extract.table = table_for(&[&fx.train_tar, &fx.val_tar], false);
    let s = prepare(&opts).unwrap();
    assert_eq!(s.verified.len(), 2);
    assert_eq!(
        s.bytes_read,
        file_size(&fx.train_tar) + file_size(&fx.val_tar),
        "one pass"
    );
    assert_same_tree(&read_tree(&out), &fx.expected);

    // Resuming with --verify still hashes every byte: the complete classes are read through
    // (not seeked over), so the MD5 comes out right.
    std::fs::remove_dir_all(out.join("train").join(&fx.classes[1])).unwrap();
    std::fs::remove_file(out.join(".rn50-prepare/train.done.json")).unwrap();
    let s = prepare(&opts).unwrap();
    assert_eq!((s.train_classes_extracted, s.train_classes_skipped), (1, 5));
    assert_eq!(s.verified.len(), 2);
    assert_same_tree(&read_tree(&out), &fx.expected);

    // The same archives against a table with other MD5s: the error names file and both sums.
    let out2 = fx.dir.path().join("out2");
    let mut bad = options(Some(&fx.train_tar), None, &out2);
    bad.extract.verify = true;
    bad.extract.table = table_for(&[&fx.train_tar], true);
    let actual = hex(&Md5::digest(std::fs::read(&fx.train_tar).unwrap()));
    let err = format!("{:#}", prepare(&bad).unwrap_err());
    assert!(
        err.contains("ILSVRC2012_img_train.tar") && err.contains("MD5 mismatch"),
        "{err}"
    );
    assert!(
        err.contains(&actual) && err.contains("expected 0000"),
        "{err}"
    );
    assert!(!out2.join(".rn50-prepare/train.done.json").exists());
}

#[test]
fn verify_against_the_builtin_table_fails_fast_on_size() {
    let fx = build();
    let out = fx.dir.path().join("out");
    let mut opts = options(Some(&fx.train_tar), None, &out);
    opts.extract.verify = true; // built-in table: the real archive is 147,897,477,120 bytes
    let err = format!("{:#}", prepare(&opts).unwrap_err());
    let size = file_size(&fx.train_tar);
    assert!(
        err.contains("size mismatch: expected 147897477120 bytes")
            && err.contains(&format!("actual {size}")),
        "{err}"
    );
    assert!(
        !out.join("train").exists(),
        "nothing extracted before the size check"
    );

    let err = format!(
        "{:#}",
        verify_files(
            &[fx.val_tar.clone(), fx.train_tar.clone()],
            &ArchiveTable::builtin(),
            2
        )
        .unwrap_err()
    );
    assert!(
        err.contains("2 of 2 files") && err.contains("ILSVRC2012_img_val.tar: size mismatch"),
        "{err}"
    );
    let ok = verify_files(
        std::slice::from_ref(&fx.val_tar),
        &table_for(&[&fx.val_tar], false),
        1,
    )
    .unwrap();
    assert_eq!(
        ok[0].md5,
        hex(&Md5::digest(std::fs::read(&fx.val_tar).unwrap()))
    );
}

#[test]
fn check_reports_what_is_missing() {
    let fx = build();
    let out = fx.dir.path().join("out");
    prepare(&options(Some(&fx.train_tar), Some(&fx.val_tar), &out)).unwrap();
    let train_file = fx
        .expected
        .keys()
        .find(|k| k.starts_with("train/"))
        .unwrap();
    let val_file = fx.expected.keys().find(|k| k.starts_with("val/")).unwrap();
    std::fs::remove_file(out.join(train_file)).unwrap();
    std::fs::remove_file(out.join(val_file)).unwrap();
    let r = check(&out, Expect::Auto).unwrap();
    let wnid = train_file.split('/').nth(1).unwrap();
    let vwnid = val_file.split('/').nth(1).unwrap();
    assert!(
        r.problems
            .iter()
            .any(|p| p.starts_with(&format!("train/{wnid}:")) && p.contains("in the archive")),
        "{:?}",
        r.problems
    );
    assert!(
        r.problems
            .iter()
            .any(|p| p.starts_with(&format!("val/{vwnid}:"))),
        "{:?}",
        r.problems
    );
    // Held to ImageNet, the small tree misses classes, images and named val files.
    let r = check(&out, Expect::ImageNet).unwrap();
    assert!(r.imagenet);
    assert!(
        r.problems
            .iter()
            .any(|p| p.contains("994 of the 1000 ImageNet classes are missing")),
        "{:?}",
        r.problems
    );
    assert!(
        r.problems
            .iter()
            .any(|p| p.contains("ImageNet has 1281167")),
        "{:?}",
        r.problems
    );
    assert!(
        r.problems
            .iter()
            .any(|p| p
                .starts_with("val: 49977 images missing: n01440764/ILSVRC2012_val_00000293.JPEG")),
        "{:?}",
        r.problems
    );
    assert!(check(&fx.dir.path().join("nowhere"), Expect::Auto).is_err());

    // A tree from another tool (no markers): counted, held to ImageNet only when asked.
    std::fs::remove_dir_all(out.join(".rn50-prepare")).unwrap();
    let r = check(&out, Expect::Auto).unwrap();
    assert!(r.ok() && !r.notes.is_empty(), "{:?}", r.problems);
    assert_eq!(r.val_images, 23);
    assert!(!check(&out, Expect::ImageNet).unwrap().ok());
}

#[test]
fn val_labels_from_a_valprep_script() {
    let fx = build();
    let out = fx.dir.path().join("out");
    let mut script = String::from("#!/bin/bash\nmkdir -p cats dogs\n");
    for n in 1..=24 {
        script += &format!(
            "mv ILSVRC2012_val_{n:08}.JPEG {}/\n",
            if n % 2 == 0 { "cats" } else { "dogs" }
        );
    }
    let mut opts = options(None, Some(&fx.val_tar), &out);
    opts.val_labels = ValLabels::parse(&script).unwrap();
    let s = prepare(&opts).unwrap();
    assert_eq!((s.val_images, s.classes), (24, 2));
    let tree = read_tree(&out);
    assert_eq!(
        tree.keys().filter(|k| k.starts_with("val/cats/")).count(),
        12
    );
    assert!(tree.contains_key("val/cats/ILSVRC2012_val_00000002.JPEG"));

    // A val file with no label is an error naming it.
    let out2 = fx.dir.path().join("out2");
    let mut opts = options(None, Some(&fx.val_tar), &out2);
    opts.val_labels = ValLabels::parse("n01440764\n").unwrap();
    let err = format!("{:#}", prepare(&opts).unwrap_err());
    assert!(
        err.contains("ILSVRC2012_val_00000002.JPEG") && err.contains("no class"),
        "{err}"
    );
}

#[test]
fn command_line_with_json_summary_and_check() {
    let fx = build();
    let out = fx.dir.path().join("out");
    let json = fx.dir.path().join("summary.json");
    let p = |p: &Path| p.to_str().unwrap().to_string();
    cli(&[
        "--train-tar",
        &p(&fx.train_tar),
        "--val-tar",
        &p(&fx.val_tar),
        "--out",
        &p(&out),
        "-j",
        "2",
        "--json",
        &p(&json),
    ])
    .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(v["train_images"], fx.expected.len() as u64 - 24);
    assert_eq!(v["val_images"], 24);
    assert_eq!(v["classes"], 6);
    assert_eq!(v["odd_files"], 2);
    assert_eq!(
        v["bytes_read"],
        file_size(&fx.train_tar) + file_size(&fx.val_tar)
    );
    assert!(v["seconds"].as_f64().unwrap() > 0.0);
    let report = fx.dir.path().join("check.json");
    cli(&["check", &p(&out), "--json", &p(&report)]).unwrap();
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(r["problems"].as_array().unwrap().len(), 0);
    let err = format!(
        "{:#}",
        cli(&["check", &p(&out), "--expect", "imagenet"]).unwrap_err()
    );
    assert!(err.contains("problem(s) found"), "{err}");
    let err = format!("{:#}", cli(&["verify", &p(&fx.val_tar)]).unwrap_err());
    assert!(err.contains("size mismatch"), "{err}");
    let err = format!(
        "{:#}",
        cli(&["--train-tar", "/nonexistent.tar", "--out", &p(&out)]).unwrap_err()
    );
    assert!(err.contains("/nonexistent.tar"), "{err}");
}
