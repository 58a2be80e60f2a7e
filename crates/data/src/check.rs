//! `rn50 prepare check DIR`: counts what is on disk and reports what is missing.
//!
//! Per-class train counts are checked against the counts `prepare` recorded from the archive
//! (its markers); for real ImageNet the totals (1,281,167 / 50,000), the 1,000 classes and every
//! val file name (from the built-in ground truth) are checked too.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::Path;

use anyhow::{bail, Result};
use serde::Serialize;

use crate::labels::{imagenet_wnids, ValLabels, IMAGENET_TRAIN_IMAGES, IMAGENET_VAL_IMAGES};
use crate::output::{io_error, read_json, ArchiveMarker, ClassMarker, Layout};
use crate::train::marked_classes;
use crate::verify::ArchiveTable;

#[derive(Debug, Clone, Default, Serialize)]
pub struct CheckReport {
    pub train_images: u64,
    pub val_images: u64,
    pub train_classes: u64,
    pub val_classes: u64,
    /// Checked against the official ILSVRC2012 counts and labels.
    pub imagenet: bool,
    /// Each problem found, one line each; empty when the tree is complete.
    pub problems: Vec<String>,
    /// What could not be checked, and why.
    pub notes: Vec<String>,
}

impl CheckReport {
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Whether to hold the tree to the official ILSVRC2012 counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// When the markers show the official archives, or the train classes are the 1,000.
    Auto,
    ImageNet,
    /// Only the counts recorded from the archives.
    Recorded,
}

/// Files per class folder under `root` (`None` when `root` does not exist).
fn count_tree(root: &Path, problems: &mut Vec<String>) -> Result<Option<BTreeMap<String, u64>>> {
    let entries = match std::fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_error(e, "listing", root)),
    };
    let mut counts = BTreeMap::new();
    for e in entries {
        let e = e.map_err(|e| io_error(e, "listing", root))?;
        let name = e.file_name().to_string_lossy().into_owned();
        let path = e.path();
        if !e
            .file_type()
            .map_err(|err| io_error(err, "inspecting", &path))?
            .is_dir()
        {
            problems.push(format!("{}: not a class folder", path.display()));
            continue;
        }
        let mut n = 0;
        for f in std::fs::read_dir(&path).map_err(|err| io_error(err, "listing", &path))? {
            let f = f.map_err(|err| io_error(err, "listing", &path))?;
            if f.file_type()
                .map_err(|err| io_error(err, "inspecting", &path))?
                .is_file()
            {
                n += 1;
            }
        }
        counts.insert(name, n);
    }
    Ok(Some(counts))
}

fn list_some(items: &[String]) -> String {
    let shown: Vec<&str> = items.iter().take(10).map(String::as_str).collect();
    let more = if items.len() > 10 {
        format!(" and {} more", items.len() - 10)
    } else {
        String::new()
    };
    format!("{}{more}", shown.join(", "))
}

pub fn check(dir: &Path, expect: Expect) -> Result<CheckReport> {
    let layout = Layout::new(dir);
    let mut report = CheckReport::default();
    let mut p = Vec::new();
    let train = count_tree(&layout.train(), &mut p)?;
    let val = count_tree(&layout.val(), &mut p)?;
    if train.is_none() && val.is_none() {
        bail!(
            "{}: neither train/ nor val/ exists: nothing to check",
            dir.display()
        );
    }
    let train_done: Option<ArchiveMarker> = read_json(&layout.train_done())?;
    let val_done: Option<ArchiveMarker> = read_json(&layout.val_done())?;
    let official = ArchiveTable::builtin();
    let is_official = |m: &Option<ArchiveMarker>| {
        m.as_ref().is_some_and(|m| {
            official
                .lookup(Path::new(&m.archive))
                .is_ok_and(|e| e.bytes == m.size)
        })
    };
    let wnids: BTreeSet<String> = imagenet_wnids().into_iter().map(String::from).collect();
    report.imagenet = match expect {
        Expect::ImageNet => true,
        Expect::Recorded => false,
        Expect::Auto => {
            is_official(&train_done)
                || is_official(&val_done)
                || train
                    .as_ref()
                    .is_some_and(|t| t.keys().cloned().collect::<BTreeSet<_>>() == wnids)
        }
    };

    // A tree made by other tools has no markers: only the ImageNet checks apply to it.
    let from_prepare = layout.state().is_dir();
    if !from_prepare {
        report.notes.push(format!(
            "no {} folder: not written by rn50 prepare, so per-class train counts are unchecked",
            layout.state().display()
        ));
    }
    if let Some(train) = &train {
        report.train_classes = train.len() as u64;
        report.train_images = train.values().sum();
        let marked: HashSet<String> = marked_classes(&layout)?.into_iter().collect();
        for (wnid, &n) in train.iter().filter(|_| from_prepare) {
            if !marked.contains(wnid) {
                p.push(format!(
                    "train/{wnid}: incomplete ({n} files, no completion marker): run prepare again"
                ));
                continue;
            }
            let m: Option<ClassMarker> = read_json(&layout.class_marker(wnid))?;
            if let Some(m) = m.filter(|m| m.images != n) {
                p.push(format!(
                    "train/{wnid}: {n} files on disk, {} in the archive",
                    m.images
                ));
            }
        }
        let mut gone: Vec<String> = marked
            .iter()
            .filter(|w| !train.contains_key(*w))
            .cloned()
            .collect();
        gone.sort();
        if !gone.is_empty() {
            p.push(format!(
                "train: {} extracted classes are missing: {}",
                gone.len(),
                list_some(&gone)
            ));
        }
        if report.imagenet {
            let missing: Vec<String> = wnids
                .iter()
                .filter(|w| !train.contains_key(*w))
                .cloned()
                .collect();
            if !missing.is_empty() {
                p.push(format!(
                    "train: {} of the 1000 ImageNet classes are missing: {}",
                    missing.len(),
                    list_some(&missing)
                ));
            }
            let extra: Vec<String> = train
                .keys()
                .filter(|w| !wnids.contains(*w))
                .cloned()
                .collect();
            if !extra.is_empty() {
                p.push(format!(
                    "train: {} folders are not ImageNet classes: {}",
                    extra.len(),
                    list_some(&extra)
                ));
            }
            if report.train_images != IMAGENET_TRAIN_IMAGES {
                p.push(format!(
                    "train: {} images, ImageNet has {IMAGENET_TRAIN_IMAGES}",
                    report.train_images
                ));
            }
        } else if let Some(done) = &train_done {
            if report.train_images != done.images {
                p.push(format!(
                    "train: {} images on disk, {} in the archive",
                    report.train_images, done.images
                ));
            }
        }
    }

    if let Some(val) = &val {
        report.val_classes = val.len() as u64;
        report.val_images = val.values().sum();
        if report.imagenet {
            check_val_files(&layout.val(), &ValLabels::builtin(), val, &mut p);
            if report.val_images != IMAGENET_VAL_IMAGES {
                p.push(format!(
                    "val: {} images, ImageNet has {IMAGENET_VAL_IMAGES}",
                    report.val_images
                ));
            }
        } else if let Some(done) = &val_done {
            for (wnid, &want) in &done.classes {
                let have = val.get(wnid).copied().unwrap_or(0);
                if have != want {
                    p.push(format!(
                        "val/{wnid}: {have} files on disk, {want} in the archive"
                    ));
                }
            }
        }
        if val_done.is_none() && from_prepare {
            p.push("val: incomplete (no completion marker): run prepare again".to_string());
        }
    }
    report.problems = p;
    Ok(report)
}

/// Every val file the ground truth names must be in its class folder.
fn check_val_files(
    root: &Path,
    labels: &ValLabels,
    val: &BTreeMap<String, u64>,
    p: &mut Vec<String>,
) {
    let mut missing = Vec::new();
    let mut expected: BTreeMap<&str, u64> = BTreeMap::new();
    for (file, wnid) in labels.expected_files() {
        *expected.entry(wnid).or_default() += 1;
        if !root.join(wnid).join(&file).is_file() {
            missing.push(format!("{wnid}/{file}"));
        }
    }
    missing.sort();
    if !missing.is_empty() {
        p.push(format!(
            "val: {} images missing: {}",
            missing.len(),
            list_some(&missing)
        ));
    }
    for (wnid, &have) in val {
        let want = expected.get(wnid.as_str()).copied().unwrap_or(0);
        if have > want {
            p.push(format!(
                "val/{wnid}: {have} files, the ground truth has {want}"
            ));
        }
    }
}
