//! What extracting train and val have in common: options, shared counters, first-error
//! bookkeeping, and storing one image.

use std::io::Read;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use anyhow::{bail, Context, Result};

use crate::odd;
use crate::output::{write_file, FileRecord, OddRecord};
use crate::verify::ArchiveTable;

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
        let mut slot = self.first_error.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(e);
        }
        self.failed.store(true, Ordering::SeqCst);
    }

    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::SeqCst)
    }

    pub fn take_error(&self) -> Option<anyhow::Error> {
        self.first_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
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
