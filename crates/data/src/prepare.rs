//! `rn50 prepare` end to end: train, then val, then the summary.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::extract::ArchiveStats;
use crate::extract::ExtractOptions;
use crate::extract_train::extract_train;
use crate::extract_val::extract_val;
use crate::labels::ValLabels;
use crate::lock::lock_output;
use crate::odd;
use crate::output::{
    create_dir_all, read_json, remove_dir_all, remove_file_if_any, write_file, write_json_atomic,
    ArchiveMarker, ClassMarker, FileRecord, Layout,
};
use crate::progress::Progress;
use crate::summary::{Summary, VerifiedArchive};
use crate::tree::{audit_train, audit_val, list_some, Audit};

#[derive(Debug, Clone)]
pub struct PrepareOptions {
    pub train_tar: Option<PathBuf>,
    pub val_tar: Option<PathBuf>,
    pub out: PathBuf,
    pub val_labels: ValLabels,
    pub extract: ExtractOptions,
    /// Delete files in `train/` and `val/` that prepare did not write, instead of refusing.
    pub force: bool,
}

/// Extracts whichever archives are given into `out` and returns the summary.
pub fn prepare(opts: &PrepareOptions) -> Result<Summary> {
    if opts.train_tar.is_none() && opts.val_tar.is_none() {
        bail!("nothing to do: give --train-tar and/or --val-tar");
    }
    for tar in opts.train_tar.iter().chain(&opts.val_tar) {
        if !tar.is_file() {
            bail!("{}: no such archive file", tar.display());
        }
    }
    let start = Instant::now();
    create_dir_all(&opts.out)?;
    let layout = Layout::new(&opts.out);
    // Held until this function returns: everything below may delete and rewrite.
    let _lock = lock_output(&layout)?;
    // Ctrl-C (or SIGTERM) stops after the classes in hand, keeping every class extracted; a second one at once.
    rn50_util::stop::install("finishing the classes in progress, then stopping")?;
    let mut audit = Audit::default();
    if opts.train_tar.is_some() {
        audit = audit_train(&layout, opts.extract.threads)?;
    }
    if opts.val_tar.is_some() {
        let val = audit_val(&layout)?;
        audit.foreign.extend(val.foreign);
        audit.damaged_val = val.damaged_val;
    }
    settle(&layout, &audit, opts.force)?;
    if rn50_util::stop::requested() {
        bail!(rn50_util::stop::Stopped::new(
            "nothing extracted; run the same command again to start"
        ));
    }
    let progress = Progress::new();
    let mut summary = Summary {
        threads: opts.extract.threads,
        ..Default::default()
    };
    let add = |stats: &ArchiveStats, tar: &Path, summary: &mut Summary| {
        summary.bytes_read += stats.bytes_read;
        summary.bytes_written += stats.bytes_written;
        summary.odd.extend(stats.odd.iter().cloned());
        if let Some(md5) = &stats.md5 {
            summary.verified.push(VerifiedArchive {
                file: tar.display().to_string(),
                md5: md5.clone(),
            });
        }
    };
    if let Some(tar) = &opts.train_tar {
        let mut stats = extract_train(tar, &layout, &opts.extract, &progress)
            .with_context(|| format!("extracting {}", tar.display()))?;
        if opts.extract.fix_odd {
            fix_left_over(&layout, &mut stats, &layout.train_done())?;
        }
        add(&stats, tar, &mut summary);
        summary.train_images = stats.images();
        summary.classes = stats.classes.len() as u64;
        summary.train_classes_extracted = stats.extracted_classes;
        summary.train_classes_skipped = if stats.already_done {
            stats.classes.len() as u64
        } else {
            stats.skipped_classes
        };
    }
    if let Some(tar) = &opts.val_tar {
        let mut stats = extract_val(tar, &opts.val_labels, &layout, &opts.extract, &progress)
            .with_context(|| format!("extracting {}", tar.display()))?;
        if opts.extract.fix_odd {
            fix_left_over(&layout, &mut stats, &layout.val_done())?;
        }
        add(&stats, tar, &mut summary);
        summary.val_images = stats.images();
        if opts.train_tar.is_none() {
            summary.classes = stats.classes.len() as u64;
        }
    }
    summary.odd_files = summary.odd.len() as u64;
    summary.odd_fixed = summary.odd.iter().filter(|o| o.fixed).count() as u64;
    summary.seconds = start.elapsed().as_secs_f64();
    Ok(summary)
}

/// Acts on what the audit found before anything is extracted: files `prepare` did not write
/// stop the run (or, with `force`, are deleted), and the markers of classes (or val) that the
/// disk no longer matches are dropped so that they are extracted again.
fn settle(layout: &Layout, audit: &Audit, force: bool) -> Result<()> {
    if !audit.foreign.is_empty() {
        let files: u64 = audit.foreign.iter().map(|f| f.files).sum();
        let shown: Vec<String> = audit.foreign.iter().map(|f| f.to_string()).collect();
        if !force {
            bail!(
                "{}: {files} file(s) in train/ or val/ were not written by rn50 prepare: {}. \
                 prepare deletes and rewrites what it finds there, so it stops rather than lose \
                 them: move them elsewhere or use another --out, or pass --force to delete them",
                layout.out.display(),
                list_some(&shown)
            );
        }
        for f in &audit.foreign {
            remove_dir_all(&layout.out.join(&f.path))?;
        }
        tracing::warn!(
            "--force: deleted {files} file(s) that rn50 prepare did not write: {}",
            list_some(&shown)
        );
    }
    for (wnid, what) in &audit.damaged_classes {
        tracing::warn!("train/{wnid}: {what} since it was extracted: extracting it again");
        // Started before the marker goes, so the folder stays known as prepare's.
        write_file(&layout.class_started(wnid), b"")?;
        remove_file_if_any(&layout.class_marker(wnid))?;
        remove_file_if_any(&layout.train_done())?;
    }
    if let Some(what) = &audit.damaged_val {
        tracing::warn!("val: {what} since it was extracted: extracting val again");
        write_file(&layout.val_started(), b"")?;
        remove_file_if_any(&layout.val_done())?;
    }
    Ok(())
}

/// With `--fix-odd-files` on a tree extracted without it, re-encodes the odd files recorded in
/// the markers in place (temp file, fsync, rename) instead of extracting anything again; the
/// manifests are updated to the new files.
fn fix_left_over(layout: &Layout, stats: &mut ArchiveStats, done_marker: &Path) -> Result<()> {
    let mut changed = false;
    let mut done = read_json::<ArchiveMarker>(done_marker)?;
    for rec in stats.odd.iter_mut().filter(|r| !r.fixed) {
        let path = layout.out.join(&rec.file);
        let data = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        if !odd::detect(&data).is_some_and(|k| k.fixable()) {
            continue;
        }
        let fixed = odd::fix(&data).with_context(|| format!("re-encoding {}", rec.file))?;
        // The temp file goes in the bookkeeping folder (same file system), so one left by a
        // kill is never taken for a user's file in the class folder.
        let tmp = layout.state().join("fix.rn50-tmp");
        write_file(&tmp, &fixed)?;
        rn50_util::atomic::persist(&tmp, &path)
            .with_context(|| format!("replacing {}", path.display()))?;
        rec.fixed = true;
        changed = true;
        let written = FileRecord::of(&fixed);
        // Keep the per-class marker in step (train; val's manifest is in its archive marker).
        let mut parts = rec.file.split('/');
        match (parts.next(), parts.next(), parts.next()) {
            (Some("train"), Some(wnid), Some(name)) => {
                let mpath = layout.class_marker(wnid);
                if let Some(mut m) = read_json::<ClassMarker>(&mpath)? {
                    for r in m.odd.iter_mut().filter(|r| r.file == rec.file) {
                        r.fixed = true;
                    }
                    if let Some(f) = m.files.get_mut(name) {
                        *f = written;
                    }
                    if !m.files.is_empty() {
                        m.bytes = m.files.values().map(|f| f.bytes).sum();
                    }
                    write_json_atomic(&mpath, &m)?;
                }
            }
            (Some("val"), Some(wnid), Some(name)) => {
                if let Some(f) = done
                    .as_mut()
                    .and_then(|m| m.files.get_mut(wnid))
                    .and_then(|c| c.get_mut(name))
                {
                    *f = written;
                }
            }
            _ => {}
        }
    }
    if changed {
        if let Some(mut m) = done {
            m.odd = stats.odd.clone();
            write_json_atomic(done_marker, &m)?;
        }
    }
    Ok(())
}
