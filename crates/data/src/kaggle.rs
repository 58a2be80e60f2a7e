//! `rn50 prepare --kaggle DIR --out OUT`: Kaggle's ImageNet download (the ImageNet Object Localization
//! Challenge, extracted) made into the tree `prepare` makes from the official archives,
//! `OUT/train/<wnid>/*.JPEG` and `OUT/val/<wnid>/*.JPEG`.
//!
//! Kaggle's layout: `DIR/ILSVRC/Data/CLS-LOC/train/<wnid>/*.JPEG` (ImageFolder already), a flat
//! `DIR/ILSVRC/Data/CLS-LOC/val/`, its labels in `DIR/LOC_val_solution.csv` (`ImageId,PredictionString`,
//! the first word of the prediction string the WordNet id) and the class names in
//! `DIR/LOC_synset_mapping.txt`. `test/` (no labels) is left out.
//!
//! Everything is checked before anything is written: every class folder and CSV line names a known
//! synset (those of `LOC_synset_mapping.txt`, else the 1,000 ILSVRC2012 ones), every CSV line a file that
//! is there, every val file has a line. Files are hard links to the download when OUT is on its file
//! system, copies otherwise (copied under a temporary name, then renamed); nothing in DIR is changed. A
//! file already in OUT is kept when it is the download's (the same file, or of its size: a run stopped
//! half-way is resumed); any other file at a name it would write stops it, and nothing is overwritten.
//! Last, the class folders are counted against what was listed.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};

use crate::labels::imagenet_wnids;
use crate::output::{create_dir_all, io_error};

/// Where Kaggle's images are, under DIR.
pub const DATA: &str = "ILSVRC/Data/CLS-LOC";
pub const VAL_SOLUTION: &str = "LOC_val_solution.csv";
pub const SYNSET_MAPPING: &str = "LOC_synset_mapping.txt";

/// What `prepare --kaggle` did.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct KaggleSummary {
    pub train_images: u64,
    pub train_classes: u64,
    pub val_images: u64,
    pub val_classes: u64,
    /// Files linked (or copied) by this run; the rest were already in place.
    pub linked: u64,
    pub copied: u64,
}

/// One file to put in place: the download's `from` at OUT's `to`.
struct Planned {
    from: PathBuf,
    to: PathBuf,
}

/// The known synsets: the first word of each line of `LOC_synset_mapping.txt`, else ImageNet's 1,000.
fn synsets(dir: &Path) -> Result<BTreeSet<String>> {
    let path = dir.join(SYNSET_MAPPING);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let set: BTreeSet<String> = text
                .lines()
                .filter_map(|l| l.split_whitespace().next())
                .map(String::from)
                .collect();
            ensure!(!set.is_empty(), "{}: no synsets in it", path.display());
            Ok(set)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            Ok(imagenet_wnids().into_iter().map(String::from).collect())
        }
        Err(e) => Err(io_error(e, "reading", &path)),
    }
}

/// The files directly in `dir`, sorted (`None` when `dir` does not exist).
fn files_in(dir: &Path) -> Result<Option<Vec<String>>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_error(e, "listing", dir)),
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| io_error(e, "listing", dir))?;
        if entry.path().is_file() {
            let name = entry
                .file_name()
                .into_string()
                .map_err(|n| anyhow::anyhow!("{}: file name {n:?} is not UTF-8", dir.display()))?;
            names.push(name);
        }
    }
    names.sort();
    Ok(Some(names))
}

/// The val file → synset of `LOC_val_solution.csv`, each line checked.
fn val_solution(path: &Path, known: &BTreeSet<String>) -> Result<BTreeMap<String, String>> {
    let text = std::fs::read_to_string(path).map_err(|e| io_error(e, "reading", path))?;
    let mut lines = text.lines().enumerate();
    match lines.next() {
        Some((_, header)) if header.trim() == "ImageId,PredictionString" => {}
        _ => bail!(
            "{}: line 1 is not the header ImageId,PredictionString",
            path.display()
        ),
    }
    let mut labels = BTreeMap::new();
    for (i, line) in lines {
        if line.trim().is_empty() {
            continue;
        }
        let n = i + 1;
        let (id, prediction) = line
            .split_once(',')
            .with_context(|| format!("{}: line {n}: no comma in {line:?}", path.display()))?;
        let wnid = prediction
            .split_whitespace()
            .next()
            .with_context(|| format!("{}: line {n}: no synset for {id:?}", path.display()))?;
        ensure!(
            known.contains(wnid),
            "{}: line {n}: unknown synset {wnid:?} for {id:?} (not in {SYNSET_MAPPING} or \
             ImageNet's 1000)",
            path.display()
        );
        ensure!(
            crate::archive::is_plain_component(id),
            "{}: line {n}: {id:?} is not a file name",
            path.display()
        );
        let file = format!("{id}.JPEG");
        ensure!(
            labels.insert(file, wnid.to_string()).is_none(),
            "{}: line {n}: a second line for {id:?}",
            path.display()
        );
    }
    ensure!(!labels.is_empty(), "{}: no labels in it", path.display());
    Ok(labels)
}

/// The train files to place: every class folder of Kaggle's `train/`.
fn plan_train(
    src: &Path,
    out: &Path,
    known: &BTreeSet<String>,
    plan: &mut Vec<Planned>,
) -> Result<u64> {
    let mut classes = 0;
    let entries = std::fs::read_dir(src).map_err(|e| io_error(e, "listing", src))?;
    let mut dirs = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| io_error(e, "listing", src))?;
        if entry.path().is_dir() {
            dirs.push(entry.file_name().to_string_lossy().into_owned());
        } else {
            bail!("{}: not a class folder", entry.path().display());
        }
    }
    dirs.sort();
    for wnid in dirs {
        ensure!(
            known.contains(&wnid),
            "{}: unknown synset (not in {SYNSET_MAPPING} or ImageNet's 1000)",
            src.join(&wnid).display()
        );
        let files = files_in(&src.join(&wnid))?.unwrap_or_default();
        ensure!(
            !files.is_empty(),
            "{}: no images in this class folder",
            src.join(&wnid).display()
        );
        classes += 1;
        for f in files {
            plan.push(Planned {
                from: src.join(&wnid).join(&f),
                to: out.join(&wnid).join(&f),
            });
        }
    }
    Ok(classes)
}

/// Puts `p.from` at `p.to`: nothing when it is there already (the same file, or one of its size), else a
/// hard link, else (another file system) a copy. `Some(true)` for a link, `Some(false)` for a copy.
fn place(p: &Planned) -> Result<Option<bool>> {
    let from = std::fs::metadata(&p.from).map_err(|e| io_error(e, "reading", &p.from))?;
    match std::fs::symlink_metadata(&p.to) {
        Ok(to) => {
            let same = (to.dev(), to.ino()) == (from.dev(), from.ino());
            ensure!(
                same || (to.is_file() && to.len() == from.len()),
                "{} exists and is not {}: move it away (nothing is overwritten)",
                p.to.display(),
                p.from.display()
            );
            return Ok(None);
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_error(e, "inspecting", &p.to)),
    }
    match std::fs::hard_link(&p.from, &p.to) {
        Ok(()) => Ok(Some(true)),
        Err(e) if e.kind() == io::ErrorKind::CrossesDevices => {
            let tmp =
                rn50_util::atomic::temp_path(&p.to).map_err(|e| io_error(e, "naming", &p.to))?;
            std::fs::copy(&p.from, &tmp).map_err(|e| io_error(e, "copying to", &tmp))?;
            std::fs::rename(&tmp, &p.to).map_err(|e| io_error(e, "renaming", &tmp))?;
            Ok(Some(false))
        }
        Err(e) => Err(io_error(e, "linking", &p.to)),
    }
}

/// Makes `out`'s train/ and val/ from the Kaggle download in `dir`.
pub fn prepare_kaggle(dir: &Path, out: &Path) -> Result<KaggleSummary> {
    let data = dir.join(DATA);
    ensure!(
        data.is_dir(),
        "{}: not Kaggle's ImageNet download (no {DATA}/ in it)",
        dir.display()
    );
    let known = synsets(dir)?;
    let mut summary = KaggleSummary::default();
    let mut plan = Vec::new();
    let train_src = data.join("train");
    if train_src.is_dir() {
        summary.train_classes = plan_train(&train_src, &out.join("train"), &known, &mut plan)?;
        summary.train_images = plan.len() as u64;
    }
    let val_src = data.join("val");
    if let Some(files) = files_in(&val_src)? {
        let labels = val_solution(&dir.join(VAL_SOLUTION), &known)?;
        let present: BTreeSet<&String> = files.iter().collect();
        if let Some(missing) = labels.keys().find(|f| !present.contains(f)) {
            bail!(
                "{}: {VAL_SOLUTION} labels it, but it is missing",
                val_src.join(missing).display()
            );
        }
        if let Some(extra) = files.iter().find(|f| !labels.contains_key(*f)) {
            bail!(
                "{}: no line for it in {VAL_SOLUTION}",
                val_src.join(extra).display()
            );
        }
        summary.val_classes = labels.values().collect::<BTreeSet<_>>().len() as u64;
        summary.val_images = labels.len() as u64;
        for (file, wnid) in labels {
            plan.push(Planned {
                from: val_src.join(&file),
                to: out.join("val").join(wnid).join(file),
            });
        }
    }
    ensure!(
        !plan.is_empty(),
        "{}: no train/ or val/ images in it",
        data.display()
    );
    let mut made = BTreeSet::new();
    for p in &plan {
        let parent = p.to.parent().expect("a class folder");
        if made.insert(parent.to_path_buf()) {
            create_dir_all(parent)?;
        }
        match place(p)? {
            Some(true) => summary.linked += 1,
            Some(false) => summary.copied += 1,
            None => {}
        }
    }
    // Counted again from the disk: each class folder holds what was listed for it, and nothing else.
    let mut expected: BTreeMap<&Path, u64> = BTreeMap::new();
    for p in &plan {
        *expected
            .entry(p.to.parent().expect("a class folder"))
            .or_default() += 1;
    }
    for (folder, n) in expected {
        let found = files_in(folder)?.map_or(0, |f| f.len() as u64);
        ensure!(
            found == n,
            "{}: {found} files, {n} from the download: files not from it are in it; move them out",
            folder.display()
        );
    }
    Ok(summary)
}
