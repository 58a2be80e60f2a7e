//! `rn50 prepare check DIR`: compares what is on disk with what the archives held.
//!
//! `prepare` records every file it writes (name, size, CRC-32) in its markers. Each train and
//! val class folder is compared with that record: files missing, of another size, not from the
//! archive, and with `--deep` of other contents. A tree `prepare` did not finish (no marker for
//! the whole archive) is a problem too. For real ImageNet the totals (1,281,167 / 50,000), the
//! 1,000 classes and every val file name (from the built-in ground truth) are checked as well.
//! Each problem names the fix that works for it.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::Path;

use anyhow::{bail, Result};
use serde::Serialize;

use crate::extract_train::marked_classes;
use crate::labels::{imagenet_wnids, ValLabels, IMAGENET_TRAIN_IMAGES, IMAGENET_VAL_IMAGES};
use crate::lock::running_prepare;
use crate::output::{read_json, ArchiveMarker, ClassMarker, Layout, Manifest};
use crate::tree::{compare, list_dir, list_some, par_map, Diff, Listing};
use crate::verify::ArchiveTable;

#[derive(Debug, Clone, Default, Serialize)]
pub struct CheckReport {
    pub train_images: u64,
    pub val_images: u64,
    pub train_classes: u64,
    pub val_classes: u64,
    /// Checked against the official ILSVRC2012 counts and labels.
    pub imagenet: bool,
    /// Contents were compared too (`--deep`), not only names and sizes.
    pub deep: bool,
    /// Each problem found, one line each, with its fix; empty when the tree is complete.
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

/// What works, quoted in the problems.
const RERUN: &str = "run the same prepare command again";

/// The class folders under `root` with their listings, and the names of entries that are not
/// folders (`None` when `root` does not exist).
type Classes = BTreeMap<String, Listing>;

fn list_classes(root: &Path) -> Result<Option<(Classes, Vec<String>)>> {
    let Some(top) = list_dir(root)? else {
        return Ok(None);
    };
    let mut classes = Classes::new();
    let mut not_dirs: Vec<String> = top.files.keys().cloned().collect();
    for name in top.others {
        let path = root.join(&name);
        if std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
            classes.insert(name, list_dir(&path)?.unwrap_or_default());
        } else {
            not_dirs.push(name);
        }
    }
    not_dirs.sort();
    Ok(Some((classes, not_dirs)))
}

/// The problems of one class folder compared with its manifest (`what` is `train/<wnid>`).
/// `redo` is what makes prepare extract it again when files are missing or resized.
fn diff_problems(what: &str, d: &Diff, on_disk: usize, recorded: usize, redo: &str) -> Vec<String> {
    let mut p = Vec::new();
    if d.damaged() {
        let fix = if d.changed.is_empty() {
            format!("{RERUN} ({redo})")
        } else {
            // Same names and sizes: a re-run sees nothing wrong, a missing folder it redoes.
            format!("delete {what}/ and {RERUN} (a re-run compares names and sizes only)")
        };
        p.push(format!(
            "{what}: {}; {on_disk} files on disk, {recorded} in the archive: {fix}",
            d.describe_damage()
        ));
    }
    if !d.extra.is_empty() {
        p.push(format!(
            "{what}: {} file(s) not from the archive ({}): ImageFolder would read them; move \
             them out of {what}/, or {RERUN} with --force, which deletes them",
            d.extra.len(),
            list_some(&d.extra)
        ));
    }
    p
}

fn foreign_folder(what: &str, n: usize) -> String {
    format!(
        "{what}: not from the archive ({n} file(s); prepare has no record of writing it): \
         ImageFolder would take it for a class; move it out, or {RERUN} with --force, which \
         deletes it"
    )
}

/// Checks `dir` by names and sizes.
pub fn check(dir: &Path, expect: Expect) -> Result<CheckReport> {
    check_tree(dir, expect, false)
}

/// Checks `dir`; with `deep`, reads every file and compares its contents too.
pub fn check_tree(dir: &Path, expect: Expect, deep: bool) -> Result<CheckReport> {
    let layout = Layout::new(dir);
    let mut report = CheckReport {
        deep,
        ..Default::default()
    };
    let mut p = Vec::new();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let train = list_classes(&layout.train())?;
    let val = list_classes(&layout.val())?;
    if train.is_none() && val.is_none() {
        bail!(
            "{}: neither train/ nor val/ exists: nothing to check",
            dir.display()
        );
    }
    if let Some(holder) = running_prepare(&layout) {
        p.push(format!(
            "an rn50 prepare ({holder}) is writing this folder now: check again when it has \
             finished"
        ));
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
                    .is_some_and(|(t, _)| t.keys().cloned().collect::<BTreeSet<_>>() == wnids)
        }
    };

    // A tree made by other tools has no markers: only the ImageNet checks apply to it. (The
    // lock file alone, left by a run that refused to start, does not make it prepare's.)
    let train_started =
        std::fs::read_dir(layout.class_markers()).is_ok_and(|mut d| d.next().is_some());
    let from_prepare = train_started
        || train_done.is_some()
        || val_done.is_some()
        || layout.val_started().exists();
    if !from_prepare {
        report.notes.push(format!(
            "no markers in {}: not written by rn50 prepare, so files are not compared with \
             the archives",
            layout.state().display()
        ));
    }
    let stray = |root: &str, names: &[String], p: &mut Vec<String>| {
        for n in names {
            p.push(if from_prepare {
                format!(
                    "{root}/{n}: not a class folder, and not written by prepare: move it away, \
                     or {RERUN} with --force, which deletes it"
                )
            } else {
                format!("{root}/{n}: not a class folder: move it away")
            });
        }
    };

    if let Some((train, not_dirs)) = &train {
        stray("train", not_dirs, &mut p);
        report.train_classes = train.len() as u64;
        report.train_images = train.values().map(|l| l.files.len() as u64).sum();
        let marked: HashSet<String> = marked_classes(&layout)?.into_iter().collect();
        let classes: Vec<(&String, &Listing)> = train.iter().filter(|_| from_prepare).collect();
        let found = par_map(
            &classes,
            threads,
            |(wnid, listing)| -> Result<(Vec<String>, bool)> {
                let what = format!("train/{wnid}");
                let n = listing.files.len();
                let m: Option<ClassMarker> = if marked.contains(*wnid) {
                    read_json(&layout.class_marker(wnid))?
                } else {
                    None
                };
                Ok(match m {
                    Some(m) if m.files.is_empty() => {
                        // Recorded by an rn50 before the manifest: counts only.
                        let p = (m.images != n as u64).then(|| {
                            format!(
                                "{what}: {n} files on disk, {} in the archive: {RERUN}",
                                m.images
                            )
                        });
                        (p.into_iter().collect(), true)
                    }
                    Some(m) => {
                        let d = compare(&layout.train().join(wnid), &m.files, listing, deep)?;
                        let redo =
                            "it extracts a class again when its files are missing or of the \
                                wrong size";
                        (diff_problems(&what, &d, n, m.files.len(), redo), false)
                    }
                    None if layout.class_started(wnid).exists() => (
                        vec![format!(
                            "{what}: incomplete ({n} files; prepare stopped while extracting it): \
                         {RERUN}"
                        )],
                        false,
                    ),
                    None if n == 0 && listing.others.is_empty() => (Vec::new(), false),
                    None => (vec![foreign_folder(&what, n + listing.others.len())], false),
                })
            },
        );
        let mut legacy = 0;
        for r in found {
            let (problems, old) = r?;
            p.extend(problems);
            legacy += u64::from(old);
        }
        if legacy > 0 {
            report.notes.push(format!(
                "{legacy} train classes were recorded by an rn50 prepare before per-file \
                 records: only their counts are checked"
            ));
        }
        let mut gone: Vec<String> = marked
            .iter()
            .filter(|w| !train.contains_key(*w))
            .cloned()
            .collect();
        gone.sort();
        if !gone.is_empty() {
            p.push(format!(
                "train: {} extracted classes are missing: {}: {RERUN} (it extracts them again)",
                gone.len(),
                list_some(&gone)
            ));
        }
        if from_prepare && train_done.is_none() && train_started {
            p.push(format!(
                "train: prepare did not finish the train archive ({} classes complete, no record \
                 of the whole archive): {RERUN}",
                marked.len()
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

    if let Some((val, not_dirs)) = &val {
        stray("val", not_dirs, &mut p);
        report.val_classes = val.len() as u64;
        report.val_images = val.values().map(|l| l.files.len() as u64).sum();
        let counts: BTreeMap<String, u64> = val
            .iter()
            .map(|(w, l)| (w.clone(), l.files.len() as u64))
            .collect();
        if report.imagenet {
            check_val_files(&layout.val(), &ValLabels::builtin(), &counts, &mut p);
            if report.val_images != IMAGENET_VAL_IMAGES {
                p.push(format!(
                    "val: {} images, ImageNet has {IMAGENET_VAL_IMAGES}",
                    report.val_images
                ));
            }
        }
        match &val_done {
            Some(done) if !done.files.is_empty() => {
                check_val_manifest(&layout, &done.files, val, deep, threads, &mut p)?
            }
            // Recorded by an rn50 before the manifest: counts only.
            Some(done) if !report.imagenet => {
                for (wnid, &want) in &done.classes {
                    let have = counts.get(wnid).copied().unwrap_or(0);
                    if have != want {
                        p.push(format!(
                            "val/{wnid}: {have} files on disk, {want} in the archive: {RERUN}"
                        ));
                    }
                }
            }
            Some(_) => {}
            None if from_prepare => p.push(format!(
                "val: incomplete (prepare did not finish the val archive): {RERUN}"
            )),
            None => {}
        }
    }
    report.problems = p;
    Ok(report)
}

fn check_val_manifest(
    layout: &Layout,
    files: &BTreeMap<String, Manifest>,
    val: &Classes,
    deep: bool,
    threads: usize,
    p: &mut Vec<String>,
) -> Result<()> {
    let classes: Vec<(&String, &Listing)> = val.iter().collect();
    let found = par_map(
        &classes,
        threads,
        |(wnid, listing)| -> Result<Vec<String>> {
            let what = format!("val/{wnid}");
            let n = listing.files.len();
            Ok(match files.get(*wnid) {
                Some(m) => {
                    let d = compare(&layout.val().join(wnid), m, listing, deep)?;
                    let redo =
                        "it extracts val again when its files are missing or of the wrong size";
                    diff_problems(&what, &d, n, m.len(), redo)
                }
                None if n == 0 && listing.others.is_empty() => Vec::new(),
                None => vec![foreign_folder(&what, n + listing.others.len())],
            })
        },
    );
    for r in found {
        p.extend(r?);
    }
    let gone: Vec<String> = files
        .keys()
        .filter(|w| !val.contains_key(*w))
        .cloned()
        .collect();
    if !gone.is_empty() {
        p.push(format!(
            "val: {} class folders are missing: {}: {RERUN} (it extracts val again)",
            gone.len(),
            list_some(&gone)
        ));
    }
    Ok(())
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
