//! Extracting the val archive ([`extract_val`]), a flat tar of `ILSVRC2012_val_NNNNNNNN.JPEG`,
//! sorted into class folders by the ground truth (built in, or `--val-labels`), so no
//! `valprep.sh` is needed.
//!
//! One thread reads the tar; `-j` writers store the images. Val is resumed as a whole: a run
//! that stopped part-way redoes `val/` (6.4 GB, minutes), which keeps the bookkeeping trivial.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Mutex;

use anyhow::{anyhow, bail, Context, Result};
use crossbeam_channel::bounded;
use rn50_util::{lock_unpoisoned, unpoisoned};

use crate::archive::{classify, Input, Member};
use crate::extract::{
    read_member, spawn_named, store_image, ArchiveStats, ExtractOptions, Extraction, Shared, Start,
};
use crate::labels::ValLabels;
use crate::output::{
    create_dir_all, remove_dir_all, remove_file_if_any, write_file, write_json_atomic, FileRecord,
    Layout, Manifest, OddRecord,
};
use crate::progress::Progress;

struct Item {
    wnid: String,
    name: String,
    data: Vec<u8>,
}

/// Extracts the val archive into `layout.val()/<wnid>/`.
pub fn extract_val(
    archive: &Path,
    labels: &ValLabels,
    layout: &Layout,
    opts: &ExtractOptions,
    progress: &Progress,
) -> Result<ArchiveStats> {
    let make_room = || {
        create_dir_all(&layout.state())?;
        // Recorded before val/ is touched, so that what an interruption leaves there is known as
        // prepare's partial work, not taken for a user's.
        write_file(&layout.val_started(), b"")?;
        remove_dir_all(&layout.val())?; // whatever an interrupted run left
        create_dir_all(&layout.val())
    };
    let (run, input) = match Extraction::start(
        archive,
        "val",
        (&layout.val_done(), &layout.val()),
        opts,
        progress,
        &|_| Ok(()),
        make_room,
    )? {
        Start::Done(stats) => return Ok(stats),
        Start::Reading(run, input) => (*run, input),
    };
    let shared = &run.shared;
    let threads = opts.threads.max(1);
    let per_class: Mutex<BTreeMap<String, Manifest>> = Mutex::default();
    let odd: Mutex<Vec<OddRecord>> = Mutex::default();

    // Images in flight are bounded by count; each is at most MAX_IMAGE_BYTES.
    let (tx, rx) = bounded::<Item>(threads * 32);
    let input = std::thread::scope(|s| {
        for i in 0..threads {
            let rx = rx.clone();
            let (per_class, odd) = (&per_class, &odd);
            spawn_named(s, format!("val-{i}"), shared, move || {
                let mut made = HashSet::new();
                for item in rx {
                    if shared.failed() {
                        continue; // drain, so the reader never blocks on a full channel
                    }
                    match store_val(&item, layout, opts, &mut made) {
                        Ok((written, o)) => {
                            lock_unpoisoned(per_class)
                                .entry(item.wnid)
                                .or_default()
                                .insert(item.name, written);
                            lock_unpoisoned(odd).extend(o);
                            shared.images.fetch_add(1, Ordering::Relaxed);
                            shared
                                .bytes_written
                                .fetch_add(written.bytes, Ordering::Relaxed);
                        }
                        Err(e) => shared.fail(e),
                    }
                }
            });
        }
        drop(rx);
        let r = read_val(input, labels, &tx, shared, &|| run.tick(None, None));
        drop(tx);
        r.map_err(|e| shared.fail(e)).ok()
    });
    let (bytes_read, md5) = run.finish(
        input,
        "the archive is corrupt: download it again and rerun with a fresh --out",
    )?;
    let mut odd = unpoisoned(odd.into_inner());
    odd.sort_by(|a, b| a.file.cmp(&b.file));
    let files = unpoisoned(per_class.into_inner());
    // Only what was written, nothing else, before the marker vouches for it.
    let extra: Vec<String> = std::fs::read_dir(layout.val())
        .map_err(|e| crate::output::io_error(e, "listing", &layout.val()))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !files.contains_key(n))
        .collect();
    if !extra.is_empty() {
        bail!(
            "{}: just extracted, but it also holds {} not written by this run; is another \
             program writing into it?",
            layout.val().display(),
            crate::tree::list_some(&extra)
        );
    }
    for (wnid, manifest) in &files {
        crate::tree::verify_written(&layout.val().join(wnid), manifest)?;
    }
    let classes: BTreeMap<String, u64> = files
        .iter()
        .map(|(w, m)| (w.clone(), m.len() as u64))
        .collect();
    let marker = run.marker(md5.clone(), classes.clone(), odd.clone(), files)?;
    write_json_atomic(&layout.val_done(), &marker)?;
    remove_file_if_any(&layout.val_started())?;
    Ok(ArchiveStats {
        extracted_classes: classes.len() as u64,
        classes,
        odd,
        bytes_read,
        bytes_written: shared.bytes_written.load(Ordering::Relaxed),
        md5,
        ..Default::default()
    })
}

fn store_val(
    item: &Item,
    layout: &Layout,
    opts: &ExtractOptions,
    made: &mut HashSet<String>,
) -> Result<(FileRecord, Option<OddRecord>)> {
    let dir = layout.val().join(&item.wnid);
    if !made.contains(&item.wnid) {
        create_dir_all(&dir)?;
        made.insert(item.wnid.clone());
    }
    let rel = format!("val/{}/{}", item.wnid, item.name);
    store_image(&dir, &item.name, &rel, &item.data, opts.fix_odd)
}

/// Streams the val tar, sending each labelled image to the writers.
fn read_val(
    input: Input,
    labels: &ValLabels,
    tx: &crossbeam_channel::Sender<Item>,
    shared: &Shared,
    tick: &dyn Fn(),
) -> Result<Input> {
    let mut archive = tar::Archive::new(input);
    let mut seen = HashSet::new();
    let mut last: Option<String> = None;
    {
        let entries = archive.entries().context("reading the val archive")?;
        for entry in entries {
            if shared.failed() {
                break;
            }
            if rn50_util::stop::requested() {
                bail!(rn50_util::stop::Stopped::new(
                    "val/ is partial and is extracted again next time (the train classes extracted are kept); run \
                     the same command again to continue"
                ));
            }
            let mut entry = entry.with_context(|| match &last {
                Some(m) => format!("val archive: bad tar after member {m:?}"),
                None => "val archive: bad tar at the first member".to_string(),
            })?;
            let raw = entry.path_bytes().into_owned();
            let shown = String::from_utf8_lossy(&raw).into_owned();
            let Member::File(name) = classify(&raw, entry.header().entry_type())? else {
                continue;
            };
            let wnid = labels
                .class_of(&name)
                .ok_or_else(|| {
                    anyhow!("member {shown:?}: no class for {name} in the validation labels")
                })?
                .to_string();
            if !seen.insert(name.clone()) {
                bail!("member {shown:?}: file {name} appears twice in the archive");
            }
            let size = entry.size();
            let mut data = Vec::new();
            read_member(&mut entry, size, &mut data)
                .with_context(|| format!("member {shown:?}"))?;
            last = Some(shown);
            tick();
            if tx.send(Item { wnid, name, data }).is_err() {
                break;
            }
        }
    }
    let input = archive.into_inner();
    if input.hit_eof() {
        bail!(
            "{}: truncated archive: it ends {} without the end-of-archive marker",
            input.path().display(),
            match &last {
                Some(m) => format!("after member {m:?}"),
                None => "before any member".to_string(),
            }
        );
    }
    Ok(input)
}
