//! `rn50 prepare` end to end: train, then val, then the summary.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::extract::ExtractOptions;
use crate::labels::ValLabels;
use crate::odd;
use crate::output::{
    create_dir_all, read_json, write_file, write_json_atomic, ArchiveMarker, ClassMarker, Layout,
};
use crate::progress::Progress;
use crate::summary::{Summary, VerifiedArchive};
use crate::train::{extract_train, ArchiveStats};
use crate::val::extract_val;

#[derive(Debug, Clone)]
pub struct PrepareOptions {
    pub train_tar: Option<PathBuf>,
    pub val_tar: Option<PathBuf>,
    pub out: PathBuf,
    pub val_labels: ValLabels,
    pub extract: ExtractOptions,
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

/// With `--fix-odd-files` on a tree extracted without it, re-encodes the odd files recorded in
/// the markers in place (temp file + rename) instead of extracting anything again.
fn fix_left_over(layout: &Layout, stats: &mut ArchiveStats, done_marker: &Path) -> Result<()> {
    let mut changed = false;
    for rec in stats.odd.iter_mut().filter(|r| !r.fixed) {
        let path = layout.out.join(&rec.file);
        let data = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        if !odd::detect(&data).is_some_and(|k| k.fixable()) {
            continue;
        }
        let fixed = odd::fix(&data).with_context(|| format!("re-encoding {}", rec.file))?;
        let tmp = path.with_extension("rn50-tmp");
        write_file(&tmp, &fixed)?;
        std::fs::rename(&tmp, &path).with_context(|| format!("replacing {}", path.display()))?;
        rec.fixed = true;
        changed = true;
        // Keep the per-class marker in step (train only; val has just the archive marker).
        let mut parts = rec.file.split('/');
        if let (Some("train"), Some(wnid)) = (parts.next(), parts.next()) {
            let mpath = layout.class_marker(wnid);
            if let Some(mut m) = read_json::<ClassMarker>(&mpath)? {
                for r in m.odd.iter_mut().filter(|r| r.file == rec.file) {
                    r.fixed = true;
                }
                write_json_atomic(&mpath, &m)?;
            }
        }
    }
    if changed {
        if let Some(mut m) = read_json::<ArchiveMarker>(done_marker)? {
            m.odd = stats.odd.clone();
            write_json_atomic(done_marker, &m)?;
        }
    }
    Ok(())
}
