//! `rn50 prepare --kaggle DIR --out OUT`: Kaggle's ImageNet download (the ImageNet Object Localization
//! Challenge, extracted) made into the tree `prepare` makes from the official archives,
//! `OUT/train/<wnid>/*.JPEG` and `OUT/val/<wnid>/*.JPEG`.
//!
//! Kaggle's layout: `DIR/ILSVRC/Data/CLS-LOC/train/<wnid>/*.JPEG` (ImageFolder already), a flat
//! `DIR/ILSVRC/Data/CLS-LOC/val/`, its labels in `DIR/LOC_val_solution.csv` (`ImageId,PredictionString`,
//! the first word of the prediction string the WordNet id) and the class names in
//! `DIR/LOC_synset_mapping.txt`. `test/` (no labels) is left out.
//!
//! Everything is checked before anything is written: every synset of `LOC_synset_mapping.txt` is a WordNet id
//! (`n` and 8 digits; any other first word is an error naming its line, since synsets become folder names), every
//! class folder and CSV line names a known synset (those of `LOC_synset_mapping.txt`, else the 1,000 ILSVRC2012
//! ones), every CSV line a file that is there, every val file has a line. Links in the download (a class folder or
//! an image that is a symbolic link) and anything else that is not a plain folder or file are refused, not followed,
//! as the archives' link members are. OUT may not be DIR or inside it (nothing in DIR is changed), and DIR may not
//! be inside OUT's `train/` or `val/`; the folders it writes in OUT must be real folders, not links.
//!
//! Files are hard links to the download when OUT is on its file system, copies otherwise, written as every rn50
//! file is ([`rn50_util::atomic`]: under a temporary name `.NAME.tmpPID`, removed on an error, fsynced, renamed,
//! the folder fsynced). A file already in OUT is kept when it
//! is the download's (the same file, or of its size: a run stopped half-way is resumed); any other file at a name
//! it would write stops it, and nothing is overwritten. Ctrl-C, SIGTERM or SIGUSR1 stops it between files
//! ("stopped on request", exit 3), the files in place kept for the next run; the temporary files a killed run
//! left (kill -9) are removed by the next one, only those of the files it writes. Last, the class folders are
//! counted against what was listed.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};
use rn50_pipeline::imagenet::is_wnid;
use rn50_util::stop::{self, Stopped};

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

/// The known synsets: the first word of each line of `LOC_synset_mapping.txt`, else ImageNet's 1,000. Each is a
/// WordNet id, as they become folder names.
fn synsets(dir: &Path) -> Result<BTreeSet<String>> {
    let path = dir.join(SYNSET_MAPPING);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let mut set = BTreeSet::new();
            for (i, line) in text.lines().enumerate() {
                let Some(wnid) = line.split_whitespace().next() else {
                    continue;
                };
                ensure!(
                    is_wnid(wnid),
                    "{}: line {}: {wnid:?} is not a WordNet id (n and 8 digits, as n01440764)",
                    path.display(),
                    i + 1
                );
                set.insert(wnid.to_string());
            }
            ensure!(!set.is_empty(), "{}: no synsets in it", path.display());
            Ok(set)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            Ok(imagenet_wnids().into_iter().map(String::from).collect())
        }
        Err(e) => Err(io_error(e, "reading", &path)),
    }
}

/// The error for a symbolic link in the download, or in OUT where a folder is written.
fn refuse_link(path: &Path) -> anyhow::Error {
    anyhow::anyhow!(
        "{}: a symbolic link; links are refused, not followed (replace it with what it points to)",
        path.display()
    )
}

/// The files directly in `dir`, sorted (`None` when `dir` does not exist). Anything else there (a link, a
/// folder, a device) is an error naming it: nothing is followed.
fn files_in(dir: &Path) -> Result<Option<Vec<String>>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_error(e, "listing", dir)),
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| io_error(e, "listing", dir))?;
        let path = entry.path();
        let kind = entry
            .file_type()
            .map_err(|e| io_error(e, "inspecting", &path))?;
        if kind.is_symlink() {
            return Err(refuse_link(&path));
        }
        ensure!(
            kind.is_file(),
            "{}: not a regular file (only image files are expected here)",
            path.display()
        );
        let name = entry
            .file_name()
            .into_string()
            .map_err(|n| anyhow::anyhow!("{}: file name {n:?} is not UTF-8", dir.display()))?;
        names.push(name);
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

/// The error of a stop requested before anything was written.
fn stopped_before_writing() -> anyhow::Error {
    Stopped::new("nothing written; run the same command again to start").into()
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
        let path = entry.path();
        let kind = entry
            .file_type()
            .map_err(|e| io_error(e, "inspecting", &path))?;
        if kind.is_symlink() {
            return Err(refuse_link(&path));
        }
        ensure!(kind.is_dir(), "{}: not a class folder", path.display());
        dirs.push(entry.file_name().to_string_lossy().into_owned());
    }
    dirs.sort();
    for wnid in dirs {
        ensure!(
            known.contains(&wnid),
            "{}: unknown synset (not in {SYNSET_MAPPING} or ImageNet's 1000)",
            src.join(&wnid).display()
        );
        // Listing 1,000 folders of 1,300 files takes a while: a stop is not kept waiting.
        if stop::requested() {
            return Err(stopped_before_writing());
        }
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

/// `path` made absolute with its links resolved, also when it does not exist yet: its nearest existing
/// ancestor canonicalized, the rest of it appended (`..` taken lexically, as no link can be in what does not exist).
fn resolved(path: &Path) -> Result<PathBuf> {
    let parts: Vec<Component> = path.components().collect();
    for n in (0..=parts.len()).rev() {
        let head: PathBuf = parts[..n].iter().collect();
        let head = if head.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            head
        };
        match std::fs::canonicalize(&head) {
            Ok(mut p) => {
                for part in &parts[n..] {
                    match part {
                        Component::ParentDir => {
                            p.pop();
                        }
                        Component::Normal(name) => p.push(name),
                        _ => {}
                    }
                }
                return Ok(p);
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
                ) => {}
            Err(e) => return Err(io_error(e, "resolving", &head)),
        }
    }
    bail!("{}: cannot resolve this path", path.display())
}

/// OUT is neither DIR nor inside it (nothing in DIR is changed), and DIR is not inside what OUT's tree is made
/// of (`train/`, `val/`: the download would become a class, or files of one).
fn check_apart(dir: &Path, out: &Path) -> Result<()> {
    let (d, o) = (resolved(dir)?, resolved(out)?);
    ensure!(
        !o.starts_with(&d),
        "--out {} is inside the download {} (as {}): nothing in DIR is changed; choose an --out \
         outside it",
        out.display(),
        dir.display(),
        o.display()
    );
    for part in ["train", "val"] {
        ensure!(
            !d.starts_with(o.join(part)),
            "the download {} is inside --out's {part}/ ({}): it would become part of the dataset; \
             move it out, or choose another --out",
            dir.display(),
            o.join(part).display()
        );
    }
    Ok(())
}

/// Every folder a file is written in (and `train/`, `val/` above them) is a real folder when it exists: a link
/// there would take the files out of OUT.
fn check_out_folders(out: &Path, folders: &BTreeSet<&Path>) -> Result<()> {
    let top = [out.join("train"), out.join("val")];
    for folder in top
        .iter()
        .map(PathBuf::as_path)
        .chain(folders.iter().copied())
    {
        match std::fs::symlink_metadata(folder) {
            Ok(m) if m.file_type().is_symlink() => return Err(refuse_link(folder)),
            Ok(m) => ensure!(
                m.is_dir(),
                "{}: not a folder; move it away (nothing is overwritten)",
                folder.display()
            ),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_error(e, "inspecting", folder)),
        }
    }
    Ok(())
}

/// Removes from `folder` the temporary files (`.NAME.tmpPID`) that a killed run (its process gone) left of
/// the files `names` it writes there; any other file, a user's, is left to the count at the end.
fn remove_stale_temps(folder: &Path, names: &BTreeSet<&str>) -> Result<()> {
    let entries = match std::fs::read_dir(folder) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_error(e, "listing", folder)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| io_error(e, "listing", folder))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let target = name
            .strip_prefix('.')
            .and_then(|rest| rest.rsplit_once(".tmp"))
            .map(|(target, _)| target);
        let ours = target.is_some_and(|t| names.contains(t)) && !names.contains(name);
        if ours
            && entry.file_type().is_ok_and(|t| t.is_file())
            && rn50_util::atomic::is_stale_temp(entry.file_name().as_os_str())
        {
            let path = entry.path();
            std::fs::remove_file(&path).map_err(|e| io_error(e, "removing", &path))?;
            tracing::info!("{}: removed, left by a run that was killed", path.display());
        }
    }
    Ok(())
}

/// Puts `p.from` at `p.to`: nothing when it is there already (the same file, or one of its size), else a
/// hard link, else (another file system) a copy. `Some(true)` for a link, `Some(false)` for a copy.
fn place(p: &Planned) -> Result<Option<bool>> {
    let from = std::fs::symlink_metadata(&p.from).map_err(|e| io_error(e, "reading", &p.from))?;
    if from.file_type().is_symlink() {
        return Err(refuse_link(&p.from));
    }
    ensure!(from.is_file(), "{}: not a regular file", p.from.display());
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
            copy(p, &from)?;
            Ok(Some(false))
        }
        Err(e) => Err(io_error(e, "linking", &p.to)),
    }
}

/// Copies `p.from` (the file listed, `from`: opened, then checked to be it, so a link put there since is not
/// followed) to a temporary file next to `p.to`, removed on any error, then put in place durably
/// ([`rn50_util::atomic::persist`]: fsynced, renamed to `p.to`, its folder fsynced).
fn copy(p: &Planned, from: &std::fs::Metadata) -> Result<()> {
    let mut src = File::open(&p.from).map_err(|e| io_error(e, "reading", &p.from))?;
    let opened = src
        .metadata()
        .map_err(|e| io_error(e, "reading", &p.from))?;
    ensure!(
        (opened.dev(), opened.ino()) == (from.dev(), from.ino()),
        "{}: changed while it was being copied (replaced by a link?)",
        p.from.display()
    );
    let tmp = rn50_util::atomic::Partial::new(&p.to).map_err(|e| io_error(e, "naming", &p.to))?;
    let mut dst = File::create_new(tmp.path()).map_err(|e| io_error(e, "creating", tmp.path()))?;
    io::copy(&mut src, &mut dst).map_err(|e| io_error(e, "copying to", tmp.path()))?;
    drop(dst);
    tmp.persist(&p.to)
        .map_err(|e| io_error(e, "renaming a copy to", &p.to))
}

/// Makes `out`'s train/ and val/ from the Kaggle download in `dir`.
pub fn prepare_kaggle(dir: &Path, out: &Path) -> Result<KaggleSummary> {
    let data = dir.join(DATA);
    ensure!(
        data.is_dir(),
        "{}: not Kaggle's ImageNet download (no {DATA}/ in it)",
        dir.display()
    );
    check_apart(dir, out)?;
    // Ctrl-C (or SIGTERM) stops between files, keeping those in place; a second Ctrl-C at once.
    stop::install("finishing the file in hand, then stopping")?;
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
    // Each class folder written, with the names written in it.
    let mut folders: BTreeMap<&Path, BTreeSet<&str>> = BTreeMap::new();
    for p in &plan {
        let name =
            p.to.file_name()
                .and_then(|n| n.to_str())
                .expect("a file name");
        folders
            .entry(p.to.parent().expect("a class folder"))
            .or_default()
            .insert(name);
    }
    check_out_folders(out, &folders.keys().copied().collect())?;
    if stop::requested() {
        return Err(stopped_before_writing());
    }
    for (folder, names) in &folders {
        remove_stale_temps(folder, names)?;
    }
    let mut made = BTreeSet::new();
    for p in &plan {
        // Between files: each is in place whole or not at all (a copy's temporary file is removed).
        if stop::requested() {
            bail!(Stopped::new(
                "the files in place so far are kept; run the same command again to continue"
            ));
        }
        let parent = p.to.parent().expect("a class folder");
        if made.insert(parent) {
            create_dir_all(parent)?;
        }
        match place(p)? {
            Some(true) => summary.linked += 1,
            Some(false) => summary.copied += 1,
            None => {}
        }
    }
    // Counted again from the disk: each class folder holds what was listed for it, and nothing else.
    for (folder, names) in &folders {
        let n = names.len() as u64;
        let found = files_in(folder)?.map_or(0, |f| f.len() as u64);
        ensure!(
            found == n,
            "{}: {found} files, {n} from the download: files not from it are in it; move them out",
            folder.display()
        );
    }
    Ok(summary)
}
