//! What extracting train ([`crate::extract_train`]) and val ([`crate::extract_val`]) have in
//! common: options, an archive's extraction from its done-marker to its checksum ([`Extraction`]),
//! shared counters, first-error bookkeeping, and storing one image.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use indicatif::ProgressBar;
use rn50_util::lock_unpoisoned;

use crate::archive::Input;
use crate::odd;
use crate::output::{
    read_json, write_file, write_json_atomic, ArchiveMarker, FileRecord, Manifest, OddRecord,
};
use crate::progress::{rate_message, Progress};
use crate::verify::{check_md5, ArchiveTable, Expected};

/// Largest member accepted as an image; anything bigger is not a photo and is refused rather
/// than buffered.
pub const MAX_IMAGE_BYTES: u64 = 256 << 20;

#[derive(Debug, Clone)]
pub struct ExtractOptions {
    /// Extraction threads (the archive is read by one more thread).
    pub threads: usize,
    /// Check size and MD5 against `table` while reading.
    pub verify: bool,
    pub table: ArchiveTable,
    /// Re-encode CMYK/YCCK JPEGs and PNGs as RGB JPEGs.
    pub fix_odd: bool,
    /// Read-ahead memory for the train archive, in bytes.
    pub buffer_bytes: usize,
    /// Size of one read-ahead buffer.
    pub chunk_bytes: usize,
}

impl Default for ExtractOptions {
    fn default() -> Self {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        ExtractOptions {
            threads,
            verify: false,
            table: ArchiveTable::builtin(),
            fix_odd: false,
            buffer_bytes: default_buffer_bytes(threads),
            chunk_bytes: 2 << 20,
        }
    }
}

/// 256 MiB of read-ahead per thread: enough to hold a typical class tar (about 140 MB) while
/// its worker writes it, so the reader can move on to the next class.
pub fn default_buffer_bytes(threads: usize) -> usize {
    threads.max(1) * (256 << 20)
}

/// What extracting one archive did.
#[derive(Debug, Clone, Default)]
pub struct ArchiveStats {
    /// Images per class in the output (this run's and earlier runs').
    pub classes: BTreeMap<String, u64>,
    pub odd: Vec<OddRecord>,
    /// Classes extracted by this run (the rest were already complete).
    pub extracted_classes: u64,
    /// Classes found complete from an earlier run and skipped.
    pub skipped_classes: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// MD5 when verified.
    pub md5: Option<String>,
    /// The whole archive was already done: nothing was read.
    pub already_done: bool,
}

impl ArchiveStats {
    pub fn images(&self) -> u64 {
        self.classes.values().sum()
    }

    pub(crate) fn from_marker(m: ArchiveMarker) -> ArchiveStats {
        ArchiveStats {
            classes: m.classes,
            odd: m.odd,
            md5: m.md5,
            already_done: true,
            ..Default::default()
        }
    }
}

/// Name and size identify the archive a done-marker was written for.
fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Returns the done-marker if it matches this archive (and carries an MD5 when verifying) and
/// every class folder it lists still exists. With `--verify` and a marker from an unverified
/// run, the archive is hashed now, without extracting anything again. A class folder deleted
/// since is redone: `on_missing` is called with its name (train drops its class marker).
fn finished_marker(
    archive: &Path,
    marker_path: &Path,
    class_root: &Path,
    opts: &ExtractOptions,
    on_missing: &dyn Fn(&str) -> Result<()>,
) -> Result<Option<ArchiveMarker>> {
    let Some(mut m) = read_json::<ArchiveMarker>(marker_path)? else {
        return Ok(None);
    };
    let size = std::fs::metadata(archive)
        .with_context(|| format!("reading the size of {}", archive.display()))?
        .len();
    if m.archive != file_name(archive) || m.size != size {
        return Ok(None);
    }
    let mut complete = true;
    for wnid in m.classes.keys() {
        if !class_root.join(wnid).is_dir() {
            on_missing(wnid)?;
            complete = false;
        }
    }
    if !complete {
        return Ok(None);
    }
    if opts.verify && m.md5.is_none() {
        let v = crate::verify::verify_files(&[archive.to_path_buf()], &opts.table, 1)?;
        m.md5 = Some(v[0].md5.clone());
        write_json_atomic(marker_path, &m)?;
    }
    Ok(Some(m))
}

/// What [`Extraction::start`] found.
pub(crate) enum Start {
    /// The archive's done-marker still matches: nothing to read; its stats, from the marker.
    Done(ArchiveStats),
    /// Extracting it: the extraction and the archive, opened.
    Reading(Box<Extraction>, Input),
}

/// One archive's extraction, the part train and val share around their own reading and writing:
/// the checks before it starts, the progress bar and counters while it runs, the checksum and the
/// done-marker after.
pub(crate) struct Extraction {
    archive: PathBuf,
    /// The archive's table entry, when verifying.
    expected: Option<Expected>,
    pub shared: Shared,
    bar: ProgressBar,
    /// Bytes of the archive read so far.
    pos: Arc<AtomicU64>,
    start: Instant,
}

impl Extraction {
    /// Starts extracting `archive` (`what` names its bar): when verifying, its size is checked
    /// against the table first; then the done-marker `done.0` ends it there if it still matches
    /// the archive and the class folders in `done.1` ([`finished_marker`], which calls
    /// `on_missing`); otherwise `make_room` readies the output and the archive is opened.
    pub fn start(
        archive: &Path,
        what: &str,
        done: (&Path, &Path),
        opts: &ExtractOptions,
        progress: &Progress,
        on_missing: &dyn Fn(&str) -> Result<()>,
        make_room: impl FnOnce() -> Result<()>,
    ) -> Result<Start> {
        let expected = if opts.verify {
            Some(opts.table.check_size(archive)?.clone())
        } else {
            None
        };
        if let Some(m) = finished_marker(archive, done.0, done.1, opts, on_missing)? {
            return Ok(Start::Done(ArchiveStats::from_marker(m)));
        }
        make_room()?;
        let input = Input::open(archive, opts.verify)?;
        let run = Extraction {
            archive: archive.to_path_buf(),
            expected,
            shared: Shared::default(),
            bar: progress.bytes_bar(what, input.len()),
            pos: input.progress(),
            start: Instant::now(),
        };
        Ok(Start::Reading(Box::new(run), input))
    }

    /// Redraws the bar: the bytes read, the `classes` done (of `class_total`), the images.
    pub fn tick(&self, classes: Option<u64>, class_total: Option<u64>) {
        self.bar.set_position(self.pos.load(Ordering::Relaxed));
        self.bar.set_message(rate_message(
            self.start,
            classes,
            class_total,
            self.shared.images.load(Ordering::Relaxed),
        ));
    }

    /// Once the workers are done: the first error of the run, if any; else the bytes of the
    /// archive read and its MD5 (when verifying), checked against the table. `corrupt` says what
    /// a mismatch means for what was extracted.
    pub fn finish(
        &self,
        input: Option<Input>,
        corrupt: &'static str,
    ) -> Result<(u64, Option<String>)> {
        self.bar.finish_and_clear();
        if let Some(e) = self.shared.take_error() {
            return Err(e);
        }
        let input = input.ok_or_else(|| anyhow!("internal error: the archive reader vanished"))?;
        let (bytes_read, md5) = input.finish()?;
        if let (Some(expected), Some(md5)) = (&self.expected, &md5) {
            check_md5(&self.archive, expected, md5).context(corrupt)?;
        }
        Ok((bytes_read, md5))
    }

    /// The done-marker of the archive, whose extraction left the images `classes` counts.
    pub fn marker(
        &self,
        md5: Option<String>,
        classes: BTreeMap<String, u64>,
        odd: Vec<OddRecord>,
        files: BTreeMap<String, Manifest>,
    ) -> Result<ArchiveMarker> {
        Ok(ArchiveMarker {
            archive: file_name(&self.archive),
            size: std::fs::metadata(&self.archive)?.len(),
            md5,
            images: classes.values().sum(),
            classes,
            odd,
            files,
        })
    }
}

/// Counters shown in the progress bar and the first error that stops the run.
#[derive(Default)]
pub struct Shared {
    pub images: AtomicU64,
    pub classes: AtomicU64,
    pub bytes_written: AtomicU64,
    failed: AtomicBool,
    first_error: Mutex<Option<anyhow::Error>>,
}

impl Shared {
    /// Records an error; only the first one is kept (later ones are usually its consequences).
    pub fn fail(&self, e: anyhow::Error) {
        let mut slot = lock_unpoisoned(&self.first_error);
        if slot.is_none() {
            *slot = Some(e);
        }
        self.failed.store(true, Ordering::SeqCst);
    }

    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::SeqCst)
    }

    pub fn take_error(&self) -> Option<anyhow::Error> {
        lock_unpoisoned(&self.first_error).take()
    }
}

/// Starts a named worker thread (names show in `top -H` and profilers); a failure to start one
/// is recorded as the run's error.
pub fn spawn_named<'scope, F>(
    s: &'scope std::thread::Scope<'scope, '_>,
    name: String,
    shared: &Shared,
    f: F,
) where
    F: FnOnce() + Send + 'scope,
{
    if let Err(e) = std::thread::Builder::new()
        .name(name.clone())
        .spawn_scoped(s, f)
    {
        shared.fail(anyhow::anyhow!("starting thread {name}: {e}"));
    }
}

/// Reads a whole member into `buf`, refusing oversized or truncated ones.
pub fn read_member(entry: &mut impl Read, size: u64, buf: &mut Vec<u8>) -> Result<()> {
    if size > MAX_IMAGE_BYTES {
        bail!("{size} bytes is larger than any image (limit {MAX_IMAGE_BYTES}): refused");
    }
    buf.clear();
    buf.reserve(size as usize);
    entry.take(size).read_to_end(buf)?;
    if (buf.len() as u64) < size {
        bail!(
            "truncated: the archive ends after {} of its {size} bytes",
            buf.len()
        );
    }
    Ok(())
}

/// Writes one image into `dir`, re-encoding it first if it is odd and `fix_odd` is set.
/// `rel` is the path shown in the summary (`train/<wnid>/<file>`). Returns the manifest record
/// of what was written (size, CRC-32) and the odd-file record, if any.
pub fn store_image(
    dir: &Path,
    name: &str,
    rel: &str,
    data: &[u8],
    fix_odd: bool,
) -> Result<(FileRecord, Option<OddRecord>)> {
    let path = dir.join(name);
    let Some(kind) = odd::detect(data) else {
        write_file(&path, data)?;
        return Ok((FileRecord::of(data), None));
    };
    let mut record = OddRecord {
        file: rel.to_string(),
        kind: kind.describe().to_string(),
        fixed: false,
    };
    if fix_odd && kind.fixable() {
        let fixed =
            odd::fix(data).with_context(|| format!("re-encoding {rel} ({})", record.kind))?;
        write_file(&path, &fixed)?;
        record.fixed = true;
        return Ok((FileRecord::of(&fixed), Some(record)));
    }
    write_file(&path, data)?;
    Ok((FileRecord::of(data), Some(record)))
}
