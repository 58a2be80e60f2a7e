//! Hostile archives: traversal, absolute paths, links, devices, corrupt and truncated tars.
//! Each must fail with an error naming the member and write nothing outside the output folder.

use crate::common;

use std::path::{Path, PathBuf};

use common::*;
use rn50_data::prepare;

/// A raw tar member: the name bytes are written straight into the header, since tar writers
/// (rightly) refuse `..` and absolute names.
fn raw_member(name: &str, kind: u8, link: &str, data: &[u8]) -> Vec<u8> {
    let mut h = tar::Header::new_gnu();
    h.set_size(data.len() as u64);
    h.set_mode(0o644);
    h.set_mtime(1_330_000_000);
    h.set_entry_type(tar::EntryType::new(kind));
    {
        let old = h.as_old_mut();
        old.name[..name.len()].copy_from_slice(name.as_bytes());
        old.linkname[..link.len()].copy_from_slice(link.as_bytes());
    }
    h.set_cksum();
    let mut out = h.as_bytes().to_vec();
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
    out
}

fn finish(members: Vec<Vec<u8>>) -> Vec<u8> {
    let mut out: Vec<u8> = members.concat();
    out.extend_from_slice(&[0; 1024]);
    out
}

fn photo(i: usize) -> Vec<u8> {
    std::fs::read(&photos()[i]).unwrap()
}

/// A sandbox holding the archive and `out`; afterwards nothing may exist in it but those
/// (and whatever prepare wrote inside `out`).
struct Sandbox {
    dir: tempfile::TempDir,
}

impl Sandbox {
    fn new() -> Sandbox {
        Sandbox {
            dir: tempfile::tempdir().unwrap(),
        }
    }
    fn out(&self) -> PathBuf {
        self.dir.path().join("deep/er/out")
    }
    fn write(&self, name: &str, data: &[u8]) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, data).unwrap();
        p
    }
    /// Asserts the only paths outside `out` are the archives and out's parents.
    fn assert_nothing_outside(&self, archives: &[&Path]) {
        let out = self.out();
        for p in all_paths(self.dir.path()) {
            let allowed =
                p.starts_with(&out) || out.starts_with(&p) || archives.contains(&p.as_path());
            assert!(
                allowed,
                "written outside the output folder: {}",
                p.display()
            );
        }
        assert!(!Path::new("/tmp/rn50-evil.JPEG").exists());
    }
}

fn expect_error(sb: &Sandbox, train: Option<&Path>, val: Option<&Path>, wants: &[&str]) {
    let err = format!(
        "{:#}",
        prepare(&options(train, val, &sb.out())).unwrap_err()
    );
    for w in wants {
        assert!(err.contains(w), "error {err:?} should mention {w:?}");
    }
    let archives: Vec<&Path> = train.into_iter().chain(val).collect();
    sb.assert_nothing_outside(&archives);
}

const REG: u8 = b'0';

#[test]
fn outer_member_with_traversal_or_absolute_path() {
    for name in [
        "../n01440764.tar",
        "/tmp/rn50-evil.tar",
        "a/../../n01440764.tar",
    ] {
        let sb = Sandbox::new();
        let inner = tar_of(&[("n01440764_1.JPEG".into(), photo(0))]);
        let t = sb.write(
            "train.tar",
            &finish(vec![raw_member(name, REG, "", &inner)]),
        );
        expect_error(&sb, Some(&t), None, &[name, "refused"]);
    }
}

#[test]
fn inner_member_with_traversal_or_absolute_path() {
    let sb = Sandbox::new();
    let abs = sb.dir.path().join("abs-evil.JPEG");
    for (i, name) in [
        "../../../evil.JPEG",
        abs.to_str().unwrap(),
        "/tmp/rn50-evil.JPEG",
    ]
    .iter()
    .enumerate()
    {
        let inner = finish(vec![
            raw_member("n01440764_1.JPEG", REG, "", &photo(1)),
            raw_member(name, REG, "", &photo(2)),
        ]);
        let t = sb.write(
            &format!("train{i}.tar"),
            &tar_of(&[("n01440764.tar".into(), inner)]),
        );
        expect_error(&sb, Some(&t), None, &["n01440764.tar", name, "refused"]);
        std::fs::remove_file(&t).unwrap();
        // The class that failed is not left half-done.
        assert!(!sb.out().join("train/n01440764").exists());
    }
}

#[test]
fn links_and_devices_are_refused() {
    let cases = [
        (b'2', "symbolic link"),
        (b'1', "hard link"),
        (b'3', "device"),
        (b'4', "device"),
        (b'6', "FIFO"),
    ];
    for (kind, why) in cases {
        let sb = Sandbox::new();
        // A symlink to the outside, then a file written "through" it: both must be refused.
        let inner = finish(vec![
            raw_member("n01440764_1.JPEG", kind, "/tmp", &[]),
            raw_member("n01440764_1.JPEG/rn50-evil.JPEG", REG, "", &photo(3)),
        ]);
        let t = sb.write("train.tar", &tar_of(&[("n01440764.tar".into(), inner)]));
        expect_error(
            &sb,
            Some(&t),
            None,
            &["n01440764.tar", "n01440764_1.JPEG", why],
        );

        let sb = Sandbox::new();
        let v = sb.write(
            "val.tar",
            &finish(vec![raw_member(
                "ILSVRC2012_val_00000001.JPEG",
                kind,
                "/etc/passwd",
                &[],
            )]),
        );
        expect_error(&sb, None, Some(&v), &["ILSVRC2012_val_00000001.JPEG", why]);
    }
}

#[test]
fn val_member_with_traversal() {
    let sb = Sandbox::new();
    let v = sb.write(
        "val.tar",
        &finish(vec![
            raw_member("ILSVRC2012_val_00000001.JPEG", REG, "", &photo(4)),
            raw_member("../../ILSVRC2012_val_00000002.JPEG", REG, "", &photo(5)),
        ]),
    );
    expect_error(
        &sb,
        None,
        Some(&v),
        &["../../ILSVRC2012_val_00000002.JPEG", "'..'"],
    );
}

#[test]
fn truncated_inner_tar_names_the_class_and_keeps_completed_ones() {
    let sb = Sandbox::new();
    let good = tar_of(&[("n01440764_1.JPEG".into(), photo(6))]);
    let mut bad = tar_of(&[
        ("n01443537_1.JPEG".into(), photo(7)),
        ("n01443537_2.JPEG".into(), photo(8)),
    ]);
    bad.truncate(bad.len() - 1024 - 2000); // a class tar cut inside its second image, in a valid outer tar
    let t = sb.write(
        "train.tar",
        &tar_of(&[
            ("n01440764.tar".into(), good),
            ("n01443537.tar".into(), bad),
        ]),
    );
    let mut opts = options(Some(&t), None, &sb.out());
    opts.extract.threads = 1;
    let err = format!("{:#}", prepare(&opts).unwrap_err());
    assert!(
        err.contains("n01443537.tar")
            && err.contains("n01443537_2.JPEG")
            && err.contains("truncated"),
        "{err}"
    );
    assert!(sb.out().join(".rn50-prepare/train/n01440764.json").exists());
    assert_eq!(
        std::fs::read(sb.out().join("train/n01440764/n01440764_1.JPEG")).unwrap(),
        photo(6)
    );
    assert!(!sb.out().join("train/n01443537").exists());
    sb.assert_nothing_outside(&[&t]);
}

#[test]
fn corrupt_header_and_garbage_are_clear_errors() {
    let sb = Sandbox::new();
    let good = tar_of(&[("n01440764_1.JPEG".into(), photo(9))]);
    let mut outer = tar_of(&[
        ("n01440764.tar".into(), good.clone()),
        ("n01443537.tar".into(), good),
    ]);
    let second = outer
        .windows(13)
        .position(|w| w == b"n01443537.tar")
        .unwrap();
    outer[second + 100] ^= 0x55; // mode field: the header checksum no longer matches
    let t = sb.write("train.tar", &outer);
    expect_error(
        &sb,
        Some(&t),
        None,
        &["after member \"n01440764.tar\"", "checksum"],
    );

    let sb = Sandbox::new();
    let t = sb.write("train.tar", &photo(10)); // not a tar at all
    expect_error(&sb, Some(&t), None, &["train archive"]);

    let sb = Sandbox::new();
    let t = sb.write(
        "train.tar",
        &tar_of(&[("README.txt".into(), b"hello".to_vec())]),
    );
    expect_error(&sb, Some(&t), None, &["README.txt", "per-class tar"]);
}

#[test]
fn archive_missing_its_end_marker_is_truncated() {
    let sb = Sandbox::new();
    let inner = tar_of(&[("n01440764_1.JPEG".into(), photo(11))]);
    // Ends right after a member, without the two zero blocks that close a tar.
    let outer = raw_member("n01440764.tar", REG, "", &inner);
    let t = sb.write("train.tar", &outer);
    expect_error(&sb, Some(&t), None, &["truncated", "n01440764.tar"]);
}

#[test]
fn duplicate_members_are_refused() {
    let sb = Sandbox::new();
    let inner = tar_of(&[
        ("n01440764_1.JPEG".into(), photo(12)),
        ("n01440764_1.JPEG".into(), photo(13)),
    ]);
    let t = sb.write("train.tar", &tar_of(&[("n01440764.tar".into(), inner)]));
    expect_error(&sb, Some(&t), None, &["n01440764_1.JPEG", "twice"]);
}
