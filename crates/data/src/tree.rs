//! The disk compared with the archive's index (the manifests in the markers): what `check`
//! reports, what a re-run redoes, and how `prepare` tells the files it wrote from a user's.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use anyhow::{bail, Result};
use rn50_util::{lock_unpoisoned, unpoisoned};

use crate::output::{io_error, read_json, ArchiveMarker, ClassMarker, Layout, Manifest};

/// One folder: its regular files with their sizes, and any other entries (folders, links,
/// devices), which `prepare` never writes.
#[derive(Debug, Default, Clone)]
pub struct Listing {
    pub files: BTreeMap<String, u64>,
    pub others: Vec<String>,
}

/// Lists `dir` without following links; `None` when it does not exist.
pub fn list_dir(dir: &Path) -> Result<Option<Listing>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_error(e, "listing", dir)),
    };
    let mut out = Listing::default();
    for e in entries {
        let e = e.map_err(|e| io_error(e, "listing", dir))?;
        let name = e.file_name().to_string_lossy().into_owned();
        // DirEntry::metadata is lstat: a link is reported as a link, never followed.
        let meta = e
            .metadata()
            .map_err(|err| io_error(err, "inspecting", &e.path()))?;
        if meta.is_file() {
            out.files.insert(name, meta.len());
        } else {
            out.others.push(name);
        }
    }
    out.others.sort();
    Ok(Some(out))
}

/// An entry of `train/` or `val/` that `prepare` did not write.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Foreign {
    /// Relative to the output folder.
    pub path: String,
    pub is_dir: bool,
    /// Regular files under it (1 for a file or link).
    pub files: u64,
    /// The first few of them, relative to `path`, to show.
    pub sample: Vec<String>,
}

impl Foreign {
    /// Describes `out/rel`, which must exist, walking a folder without following links.
    pub fn at(out: &Path, rel: String) -> Result<Foreign> {
        let mut f = Foreign {
            is_dir: std::fs::symlink_metadata(out.join(&rel))
                .map_err(|e| io_error(e, "inspecting", &out.join(&rel)))?
                .is_dir(),
            path: rel,
            files: 0,
            sample: Vec::new(),
        };
        if f.is_dir {
            let dir = out.join(&f.path);
            f.walk(&dir, "")?;
        } else {
            f.files = 1;
        }
        Ok(f)
    }

    fn walk(&mut self, dir: &Path, prefix: &str) -> Result<()> {
        let listing = list_dir(dir)?.unwrap_or_default();
        for name in listing.files.keys() {
            self.files += 1;
            if self.sample.len() < 3 {
                self.sample.push(format!("{prefix}{name}"));
            }
        }
        for other in &listing.others {
            let path = dir.join(other);
            if list_dir_if_dir(&path)?.is_some() {
                self.walk(&path, &format!("{prefix}{other}/"))?;
            } else {
                self.files += 1;
            }
        }
        Ok(())
    }
}

impl std::fmt::Display for Foreign {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if !self.is_dir {
            return write!(f, "{}", self.path);
        }
        let more = if self.files > self.sample.len() as u64 {
            ", ..."
        } else {
            ""
        };
        write!(
            f,
            "{}/ ({} file(s): {}{more})",
            self.path,
            self.files,
            self.sample.join(", ")
        )
    }
}

fn list_dir_if_dir(path: &Path) -> Result<Option<Listing>> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => list_dir(path),
        Ok(_) => Ok(None),
        Err(e) => Err(io_error(e, "inspecting", path)),
    }
}

/// How one folder differs from its manifest.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Diff {
    pub missing: Vec<String>,
    /// Name, bytes recorded, bytes on disk.
    pub resized: Vec<(String, u64, u64)>,
    /// Right size, other bytes (only looked for when reading contents).
    pub changed: Vec<String>,
    /// Entries the manifest does not list: `prepare` did not write them.
    pub extra: Vec<String>,
}

impl Diff {
    /// Files `prepare` wrote that are no longer as it wrote them.
    pub fn damaged(&self) -> bool {
        !(self.missing.is_empty() && self.resized.is_empty() && self.changed.is_empty())
    }

    pub fn is_empty(&self) -> bool {
        !self.damaged() && self.extra.is_empty()
    }

    /// "2 missing (a, b), 1 of the wrong size (c: 0 bytes, the archive's 1234)".
    pub fn describe_damage(&self) -> String {
        let mut parts = Vec::new();
        if !self.missing.is_empty() {
            parts.push(format!(
                "{} missing ({})",
                self.missing.len(),
                list_some(&self.missing)
            ));
        }
        if !self.resized.is_empty() {
            let shown: Vec<String> = self
                .resized
                .iter()
                .map(|(n, want, have)| format!("{n}: {have} bytes, the archive's {want}"))
                .collect();
            parts.push(format!(
                "{} of the wrong size ({})",
                self.resized.len(),
                list_some(&shown)
            ));
        }
        if !self.changed.is_empty() {
            parts.push(format!(
                "{} with other contents than the archive's ({})",
                self.changed.len(),
                list_some(&self.changed)
            ));
        }
        parts.join(", ")
    }
}

/// Compares a listing of `dir` with its manifest: names and sizes, and with `deep` the
/// contents (CRC-32) of every file of the right size.
pub fn compare(dir: &Path, manifest: &Manifest, listing: &Listing, deep: bool) -> Result<Diff> {
    let mut d = Diff::default();
    for (name, rec) in manifest {
        match listing.files.get(name) {
            None => d.missing.push(name.clone()),
            Some(&have) if have != rec.bytes => d.resized.push((name.clone(), rec.bytes, have)),
            Some(_) if deep => {
                let path = dir.join(name);
                let data = std::fs::read(&path).map_err(|e| io_error(e, "reading", &path))?;
                if crc32fast::hash(&data) != rec.crc32 || data.len() as u64 != rec.bytes {
                    d.changed.push(name.clone());
                }
            }
            Some(_) => {}
        }
    }
    d.extra.extend(
        listing
            .files
            .keys()
            .filter(|n| !manifest.contains_key(*n))
            .cloned(),
    );
    d.extra.extend(listing.others.iter().cloned());
    d.extra.sort();
    Ok(d)
}

/// Checks a folder just written against what was written into it, before a marker vouches for
/// it: anything else (another process, a file system that lost a write) stops the run.
pub fn verify_written(dir: &Path, manifest: &Manifest) -> Result<()> {
    let listing = list_dir(dir)?.unwrap_or_default();
    let d = compare(dir, manifest, &listing, false)?;
    if !d.is_empty() {
        let mut what = d.describe_damage();
        if !d.extra.is_empty() {
            what = format!(
                "{what}{}{} not written by this run ({})",
                if what.is_empty() { "" } else { ", " },
                d.extra.len(),
                list_some(&d.extra)
            );
        }
        bail!(
            "{}: just extracted, but the folder does not hold what was written: {what}; is \
             another program writing into it?",
            dir.display()
        );
    }
    Ok(())
}

/// `items`, up to 10 of them, and how many more.
pub fn list_some(items: &[String]) -> String {
    let shown: Vec<&str> = items.iter().take(10).map(String::as_str).collect();
    let more = if items.len() > 10 {
        format!(" and {} more", items.len() - 10)
    } else {
        String::new()
    };
    format!("{}{more}", shown.join(", "))
}

/// Runs `f` on every item on up to `threads` threads; the results in item order.
pub fn par_map<T: Sync, R: Send>(
    items: &[T],
    threads: usize,
    f: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    let next = AtomicUsize::new(0);
    let slots: Vec<Mutex<Option<R>>> = items.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, items.len().max(1)) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(item) = items.get(i) else { break };
                let r = f(item);
                *lock_unpoisoned(&slots[i]) = Some(r);
            });
        }
    });
    slots
        .into_iter()
        .map(|m| unpoisoned(m.into_inner()).expect("every item was mapped"))
        .collect()
}

/// What `prepare` finds in `train/` or `val/` before it writes there.
#[derive(Debug, Default)]
pub struct Audit {
    /// What `prepare` did not write (a folder stands for everything under it).
    pub foreign: Vec<Foreign>,
    /// Train classes marked complete that the disk no longer matches, and what differs.
    pub damaged_classes: Vec<(String, String)>,
    /// What differs when val is marked complete and the disk no longer matches.
    pub damaged_val: Option<String>,
}

enum ClassState {
    Foreign,
    Ours,
    Extra(Vec<String>, Option<String>),
}

/// The real folders among `others` (entries of `root` that are not regular files); links and
/// the rest, which `prepare` never makes, go to `foreign` as `{shown}/NAME`.
fn split_dirs(
    root: &Path,
    shown: &str,
    others: Vec<String>,
    foreign: &mut Vec<Foreign>,
) -> Result<Vec<String>> {
    let mut dirs = Vec::new();
    for name in others {
        let path = root.join(&name);
        let meta =
            std::fs::symlink_metadata(&path).map_err(|e| io_error(e, "inspecting", &path))?;
        if meta.is_dir() {
            dirs.push(name);
        } else {
            foreign.push(Foreign {
                path: format!("{shown}/{name}"),
                is_dir: false,
                files: 1,
                sample: Vec::new(),
            });
        }
    }
    Ok(dirs)
}

/// Looks at every class folder in `train/`: a marked class must match its manifest (extra
/// entries are foreign, missing or resized files make it damaged); an unmarked one is
/// `prepare`'s partial work only if it was recording the class as started.
pub fn audit_train(layout: &Layout, threads: usize) -> Result<Audit> {
    let mut audit = Audit::default();
    let Some(top) = list_dir(&layout.train())? else {
        return Ok(audit);
    };
    for name in top.files.keys() {
        audit
            .foreign
            .push(Foreign::at(&layout.out, format!("train/{name}"))?);
    }
    let dirs = split_dirs(&layout.train(), "train", top.others, &mut audit.foreign)?;
    let states = par_map(&dirs, threads, |wnid| -> Result<ClassState> {
        let dir = layout.train().join(wnid);
        let listing = list_dir(&dir)?.unwrap_or_default();
        let marker: Option<ClassMarker> = read_json(&layout.class_marker(wnid))?;
        Ok(match marker {
            Some(m) if !m.files.is_empty() => {
                let d = compare(&dir, &m.files, &listing, false)?;
                ClassState::Extra(d.extra.clone(), d.damaged().then(|| d.describe_damage()))
            }
            // Written by an rn50 before the manifest: its count is all there is to compare.
            Some(m) if listing.files.len() as u64 != m.images => ClassState::Extra(
                Vec::new(),
                Some(format!(
                    "{} files, {} recorded",
                    listing.files.len(),
                    m.images
                )),
            ),
            Some(_) => ClassState::Ours,
            None if layout.class_started(wnid).exists() => ClassState::Ours,
            None => ClassState::Foreign,
        })
    });
    for (wnid, state) in dirs.iter().zip(states) {
        match state? {
            ClassState::Ours => {}
            ClassState::Foreign => {
                let f = Foreign::at(&layout.out, format!("train/{wnid}"))?;
                // An empty folder holds nothing to lose.
                if f.files > 0 {
                    audit.foreign.push(f);
                }
            }
            ClassState::Extra(extra, damage) => {
                for e in extra {
                    let f = Foreign::at(&layout.out, format!("train/{wnid}/{e}"))?;
                    audit.foreign.push(f);
                }
                if let Some(d) = damage {
                    audit.damaged_classes.push((wnid.clone(), d));
                }
            }
        }
    }
    audit.foreign.sort();
    Ok(audit)
}

/// The same for `val/`, which is recorded (and redone) as a whole.
pub fn audit_val(layout: &Layout) -> Result<Audit> {
    let mut audit = Audit::default();
    let Some(top) = list_dir(&layout.val())? else {
        return Ok(audit);
    };
    let done: Option<ArchiveMarker> = read_json(&layout.val_done())?;
    let files = match done {
        Some(d) if !d.files.is_empty() => d.files,
        // Marked by an rn50 before the manifest, or left part-way by prepare: all ours.
        Some(_) => return Ok(audit),
        None if layout.val_started().exists() => return Ok(audit),
        None => {
            for name in top.files.keys().chain(&top.others) {
                audit
                    .foreign
                    .push(Foreign::at(&layout.out, format!("val/{name}"))?);
            }
            audit.foreign.retain(|f| f.files > 0);
            audit.foreign.sort();
            return Ok(audit);
        }
    };
    let mut damage = Vec::new();
    for name in top.files.keys() {
        audit
            .foreign
            .push(Foreign::at(&layout.out, format!("val/{name}"))?);
    }
    let dirs = split_dirs(&layout.val(), "val", top.others, &mut audit.foreign)?;
    for wnid in &dirs {
        let dir = layout.val().join(wnid);
        let Some(manifest) = files.get(wnid) else {
            let f = Foreign::at(&layout.out, format!("val/{wnid}"))?;
            if f.files > 0 {
                audit.foreign.push(f);
            }
            continue;
        };
        let listing = list_dir(&dir)?.unwrap_or_default();
        let d = compare(&dir, manifest, &listing, false)?;
        for e in &d.extra {
            audit
                .foreign
                .push(Foreign::at(&layout.out, format!("val/{wnid}/{e}"))?);
        }
        if d.damaged() {
            damage.push(format!("{wnid}: {}", d.describe_damage()));
        }
    }
    let missing: Vec<String> = files
        .keys()
        .filter(|w| !dirs.contains(w))
        .cloned()
        .collect();
    if !missing.is_empty() {
        damage.push(format!(
            "{} class folders missing ({})",
            missing.len(),
            list_some(&missing)
        ));
    }
    if !damage.is_empty() {
        audit.damaged_val = Some(damage.join("; "));
    }
    audit.foreign.sort();
    Ok(audit)
}
