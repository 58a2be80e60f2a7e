//! Extracting the train archive ([`extract_train`]), a tar of per-class tars (`<wnid>.tar`), each a
//! flat tar of JPEGs.
//!
//! One thread streams the outer tar once (hashing it when verifying) into pooled buffers; `-j`
//! workers each take a class, unpack its inner tar from those buffers and write the files. A
//! class folder is marked complete only after all its files are written; on the next run,
//! marked classes are skipped (seeked over, or read only for the hash) and unmarked folders are
//! redone from scratch. `prepare` checks the marked ones against their manifest first and
//! drops the markers of those the disk no longer matches, so they are redone too.

use std::collections::HashSet;
use std::io::Read;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use crossbeam_channel::{bounded, unbounded, Receiver, Sender};

use crate::archive::{classify, is_plain_component, Input, Member};
use crate::chunks::{ChunkReader, Msg, Pool};
use crate::extract::{
    read_member, spawn_named, store_image, ArchiveStats, ExtractOptions, Extraction, Shared, Start,
};
use crate::output::{
    create_dir_all, read_json, remove_dir_all, remove_file_if_any, write_file, write_json_atomic,
    ClassMarker, Layout, Manifest,
};
use crate::progress::Progress;

struct Job {
    wnid: String,
    data: Receiver<Msg>,
}

/// Extracts the train archive into `layout.train()`.
pub fn extract_train(
    archive: &Path,
    layout: &Layout,
    opts: &ExtractOptions,
    progress: &Progress,
) -> Result<ArchiveStats> {
    let drop_marker = |wnid: &str| remove_file_if_any(&layout.class_marker(wnid));
    let make_room = || {
        create_dir_all(&layout.train())?;
        create_dir_all(&layout.class_markers())
    };
    let (run, input) = match Extraction::start(
        archive,
        "train",
        (&layout.train_done(), &layout.train()),
        opts,
        progress,
        &drop_marker,
        make_room,
    )? {
        Start::Done(stats) => return Ok(stats),
        Start::Reading(run, input) => (*run, input),
    };
    let shared = &run.shared;
    let pool = Pool::new(
        opts.buffer_bytes / opts.chunk_bytes.max(1),
        opts.chunk_bytes,
    );
    let threads = opts.threads.max(1);
    // The real archive holds 1,000 classes; for others the count is unknown until the end.
    let official = crate::verify::ArchiveTable::builtin();
    let class_total = official
        .lookup(archive)
        .is_ok_and(|e| e.bytes == input.len())
        .then(|| crate::labels::imagenet_wnids().len() as u64);

    let (job_tx, job_rx) = bounded::<Job>(threads * 4);
    let mut seen = Vec::new();
    let (input, skipped) = std::thread::scope(|s| {
        for i in 0..threads {
            let job_rx = job_rx.clone();
            spawn_named(s, format!("train-{i}"), shared, move || {
                for job in job_rx {
                    let wnid = job.wnid.clone();
                    if let Err(e) = extract_class(job, layout, opts, shared) {
                        // A class cut short because reading stopped: the reader's own error
                        // is the one to report.
                        if !shared.failed() {
                            shared.fail(e);
                        }
                        let _ = remove_dir_all(&layout.train().join(&wnid));
                    }
                }
            });
        }
        drop(job_rx);
        let mut input_back = None;
        let r = read_outer(
            input,
            job_tx,
            &pool,
            layout,
            shared,
            &mut input_back,
            &mut seen,
            &|| run.tick(Some(shared.classes.load(Ordering::Relaxed)), class_total),
        );
        (input_back, r)
    });
    let (bytes_read, md5) = run.finish(
        input,
        "the archive is corrupt: its classes were extracted but the tree cannot be trusted; \
         download it again and rerun with a fresh --out",
    )?;

    // Totals from the markers of this archive's classes: this run's and earlier runs'.
    let mut stats = ArchiveStats {
        extracted_classes: shared.classes.load(Ordering::Relaxed),
        bytes_written: shared.bytes_written.load(Ordering::Relaxed),
        skipped_classes: skipped,
        bytes_read,
        md5: md5.clone(),
        ..Default::default()
    };
    seen.sort();
    for wnid in seen {
        let m: ClassMarker = read_json(&layout.class_marker(&wnid))?
            .ok_or_else(|| anyhow!("class marker for {wnid} vanished"))?;
        stats.classes.insert(wnid, m.images);
        stats.odd.extend(m.odd);
    }
    // The files are in the class markers.
    let marker = run.marker(
        md5,
        stats.classes.clone(),
        stats.odd.clone(),
        Default::default(),
    )?;
    write_json_atomic(&layout.train_done(), &marker)?;
    Ok(stats)
}

/// Class ids that have a completion marker.
pub fn marked_classes(layout: &Layout) -> Result<Vec<String>> {
    let dir = layout.class_markers();
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(crate::output::io_error(e, "listing", &dir)),
    };
    for e in entries {
        let e = e.map_err(|e| crate::output::io_error(e, "listing", &dir))?;
        if let Some(wnid) = e.file_name().to_str().and_then(|n| n.strip_suffix(".json")) {
            out.push(wnid.to_string());
        }
    }
    out.sort();
    Ok(out)
}

/// Streams the outer tar, handing each class not yet complete to a worker. Returns the number
/// of classes skipped as already complete; gives the input back for the final hash. An error is
/// recorded in `shared` before the workers' channels close, so it, not their "reading
/// stopped", is the error reported.
#[allow(clippy::too_many_arguments)]
fn read_outer(
    input: Input,
    jobs: Sender<Job>,
    pool: &Arc<Pool>,
    layout: &Layout,
    shared: &Shared,
    input_back: &mut Option<Input>,
    seen: &mut Vec<String>,
    tick: &dyn Fn(),
) -> u64 {
    let mut current: Option<Sender<Msg>> = None;
    let r = read_outer_inner(
        input,
        &jobs,
        pool,
        layout,
        shared,
        input_back,
        seen,
        tick,
        &mut current,
    );
    r.unwrap_or_else(|e| {
        shared.fail(e);
        0
    })
}

#[allow(clippy::too_many_arguments)]
fn read_outer_inner(
    input: Input,
    jobs: &Sender<Job>,
    pool: &Arc<Pool>,
    layout: &Layout,
    shared: &Shared,
    input_back: &mut Option<Input>,
    seen_classes: &mut Vec<String>,
    tick: &dyn Fn(),
    current: &mut Option<Sender<Msg>>,
) -> Result<u64> {
    let mut archive = tar::Archive::new(input);
    let mut seen = HashSet::new();
    let mut last: Option<String> = None;
    let mut skipped = 0;
    let after = |last: &Option<String>| match last {
        Some(m) => format!("after member {m:?}"),
        None => "at the first member".to_string(),
    };
    {
        let entries = archive
            .entries_with_seek()
            .context("reading the train archive")?;
        for entry in entries {
            if shared.failed() {
                return Ok(skipped);
            }
            // Between classes: the ones queued are extracted and marked complete, as a rerun keeps them.
            if rn50_util::stop::requested() {
                bail!(rn50_util::stop::Stopped::new(
                    "the classes extracted so far are kept; run the same command again to continue"
                ));
            }
            let mut entry =
                entry.with_context(|| format!("train archive: bad tar {}", after(&last)))?;
            let raw = entry.path_bytes().into_owned();
            let shown = String::from_utf8_lossy(&raw).into_owned();
            let Member::File(name) = classify(&raw, entry.header().entry_type())? else {
                continue;
            };
            let wnid = name
                .strip_suffix(".tar")
                .filter(|w| is_plain_component(w) && !w.starts_with('.'))
                .ok_or_else(|| {
                    anyhow!("member {shown:?} is not a per-class tar named <class>.tar")
                })?
                .to_string();
            if !seen.insert(wnid.clone()) {
                bail!("member {shown:?}: class {wnid} appears twice in the archive");
            }
            last = Some(shown.clone());
            seen_classes.push(wnid.clone());
            // Complete from an earlier run, unless its folder has been deleted since.
            if layout.class_marker(&wnid).exists() && layout.train().join(&wnid).is_dir() {
                skipped += 1;
                continue; // the tar reader seeks (or reads, when hashing) past it
            }
            let (tx, rx) = unbounded();
            let tx = current.insert(tx);
            if jobs.send(Job { wnid, data: rx }).is_err() {
                return Ok(skipped); // every worker stopped: their error is reported
            }
            let size = entry.size();
            let mut left = size;
            while left > 0 {
                let mut chunk = pool.take();
                let want = (left as usize).min(pool.chunk_size());
                let mut filled = 0;
                while filled < want {
                    let n = entry
                        .read(&mut chunk.space()[filled..want])
                        .with_context(|| format!("member {shown:?}: reading the archive"))?;
                    if n == 0 {
                        bail!(
                            "member {shown:?}: truncated archive: it ends {} bytes into this \
                             {size}-byte member",
                            size - left + filled as u64
                        );
                    }
                    filled += n;
                }
                chunk.set_len(filled);
                left -= filled as u64;
                tick();
                if tx.send(Msg::Data(chunk)).is_err() {
                    break; // that worker failed; its error stops the run
                }
            }
            let _ = tx.send(Msg::End);
            *current = None;
        }
    }
    let input = archive.into_inner();
    if input.hit_eof() {
        bail!(
            "{}: truncated archive: it ends {} without the end-of-archive marker",
            input.path().display(),
            after(&last)
        );
    }
    *input_back = Some(input);
    Ok(skipped)
}

/// Unpacks one class tar into a fresh `train/<wnid>/` and marks it complete.
fn extract_class(job: Job, layout: &Layout, opts: &ExtractOptions, shared: &Shared) -> Result<()> {
    let wnid = &job.wnid;
    let dir = layout.train().join(wnid);
    // Recorded first, so that the folder an interruption leaves is known as prepare's partial
    // work (redone next time), not taken for a user's (refused).
    write_file(&layout.class_started(wnid), b"")?;
    // A stale marker (its folder was deleted) must not vouch for the partial folder an
    // interruption now would leave.
    remove_file_if_any(&layout.class_marker(wnid))?;
    remove_dir_all(&dir)?; // left by an interrupted run
    create_dir_all(&dir)?;
    let mut archive = tar::Archive::new(ChunkReader::new(job.data));
    let mut marker = ClassMarker {
        images: 0,
        bytes: 0,
        odd: Vec::new(),
        files: Manifest::new(),
    };
    let mut names = HashSet::new();
    let mut buf = Vec::new();
    let mut last: Option<String> = None;
    for entry in archive.entries().with_context(|| format!("{wnid}.tar"))? {
        let mut entry = entry.with_context(|| match &last {
            Some(m) => format!("{wnid}.tar: bad tar after member {m:?}"),
            None => format!("{wnid}.tar: bad tar at the first member"),
        })?;
        let raw = entry.path_bytes().into_owned();
        let shown = String::from_utf8_lossy(&raw).into_owned();
        let member =
            classify(&raw, entry.header().entry_type()).with_context(|| format!("{wnid}.tar"))?;
        let Member::File(name) = member else { continue };
        if !names.insert(name.clone()) {
            bail!("{wnid}.tar: member {shown:?}: file {name} appears twice");
        }
        let size = entry.size();
        read_member(&mut entry, size, &mut buf)
            .with_context(|| format!("{wnid}.tar: member {shown:?}"))?;
        let rel = format!("train/{wnid}/{name}");
        let (written, odd) = store_image(&dir, &name, &rel, &buf, opts.fix_odd)?;
        marker.images += 1;
        marker.bytes += written.bytes;
        marker.odd.extend(odd);
        marker.files.insert(name, written);
        shared.images.fetch_add(1, Ordering::Relaxed);
        shared
            .bytes_written
            .fetch_add(written.bytes, Ordering::Relaxed);
        last = Some(shown);
    }
    let mut reader = archive.into_inner();
    let ended_early = reader.hit_end;
    reader
        .drain()
        .with_context(|| format!("{wnid}.tar: reading the archive"))?;
    if ended_early {
        bail!("{wnid}.tar: truncated class tar: it ends without the end-of-archive marker");
    }
    crate::tree::verify_written(&dir, &marker.files)?;
    write_json_atomic(&layout.class_marker(wnid), &marker)?;
    remove_file_if_any(&layout.class_started(wnid))?;
    shared.classes.fetch_add(1, Ordering::Relaxed);
    Ok(())
}
