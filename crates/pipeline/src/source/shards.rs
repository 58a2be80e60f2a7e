//! Packed shard files: a few large files instead of 1.3 M small ones.
//!
//! Layout of one `*.rn50shard` file (all integers little-endian):
//!
//! ```text
//! "RN50SHD1"                      8-byte magic
//! record 0 bytes, record 1 bytes, … encoded images, back to back
//! index: count × (offset u64, length u32, label u32, crc32 u32)
//! meta:  JSON (ShardMeta: format_version, classes, record count, how images were encoded,
//!        index_crc32)
//! footer: index_offset u64, count u64, meta_offset u64, meta_len u64, "RN50SHDE"
//! ```
//!
//! The index and metadata sit at the end so the writer streams records without knowing their
//! count up front; the footer makes a truncated (or still-being-written) file detectable. Each
//! record's CRC-32 is checked when it is read: a flipped bit is a bad image (skipped and counted),
//! not a silently different one. Those do not cover the labels and class names, so the metadata
//! also holds a CRC-32 of the index and the class list, checked when the shard is opened: a flipped
//! label bit is a refused shard, not a silently relabelled image. Format 1 (rn50 before checksums)
//! has no crc32 field and is still read, unchecked, and so is the index of format 2 files written
//! before its checksum.
//! Readers use positioned reads (`pread`), not mmap, so a file shrinking under us is an I/O
//! error rather than a SIGBUS.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};
use serde::{Deserialize, Serialize};

use super::Source;

pub const EXTENSION: &str = "rn50shard";
const MAGIC: &[u8; 8] = b"RN50SHD1";
const END_MAGIC: &[u8; 8] = b"RN50SHDE";
const FOOTER_LEN: u64 = 40;
/// The format [`ShardWriter`] writes.
pub const FORMAT_VERSION: u32 = 2;

/// Bytes of one index entry in format `version`.
fn index_entry_len(version: u32) -> Result<usize> {
    match version {
        1 => Ok(16),
        2 => Ok(20),
        v => bail!(
            "shard format {v} is newer than this rn50 reads (1 to {FORMAT_VERSION}): update rn50"
        ),
    }
}

/// Per-shard metadata (JSON).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ShardMeta {
    pub format_version: u32,
    pub classes: Vec<String>,
    pub records: u64,
    /// Shorter-side cap used when re-encoding (None: original bytes stored).
    pub max_side: Option<usize>,
    pub quality: Option<u8>,
    /// CRC-32 of the file's index followed by `classes` as JSON; absent in files written before
    /// it, and in a [`ShardSet`]'s merged metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index_crc32: Option<u32>,
}

/// What [`ShardMeta::index_crc32`] holds: the CRC-32 of `index`, then of `classes` as JSON.
fn index_crc32(index: &[u8], classes: &[String]) -> Result<u32> {
    let mut h = crc32fast::Hasher::new();
    h.update(index);
    h.update(&serde_json::to_vec(classes)?);
    Ok(h.finalize())
}

#[derive(Clone, Copy)]
struct Entry {
    file: u32,
    offset: u64,
    len: u32,
    label: u32,
    /// CRC-32 of the record's bytes (None in format 1).
    crc: Option<u32>,
}

/// The list of shard files in `dir`, sorted by name; `None` if `dir` holds none.
pub fn shard_files(dir: &Path) -> Result<Option<Vec<PathBuf>>> {
    if !dir.is_dir() {
        return Ok(None);
    }
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let path = entry?.path();
        if path.is_file() && path.extension().is_some_and(|e| e == EXTENSION) {
            files.push(path);
        }
    }
    files.sort();
    Ok((!files.is_empty()).then_some(files))
}

/// One or more shard files read as one dataset (records in file-name order, then file order).
pub struct ShardSet {
    files: Vec<(PathBuf, File)>,
    entries: Vec<Entry>,
    meta: ShardMeta,
}

impl ShardSet {
    /// Open a single shard file or every shard in a directory.
    pub fn open(path: &Path) -> Result<ShardSet> {
        let paths = match shard_files(path)? {
            Some(p) => p,
            None if path.is_file() => vec![path.to_path_buf()],
            None => bail!("{} contains no .{EXTENSION} files", path.display()),
        };
        let mut set = ShardSet {
            files: Vec::new(),
            entries: Vec::new(),
            meta: ShardMeta {
                format_version: FORMAT_VERSION,
                classes: Vec::new(),
                records: 0,
                max_side: None,
                quality: None,
                index_crc32: None,
            },
        };
        for (i, p) in paths.iter().enumerate() {
            let (file, meta, entries) =
                read_shard(p).with_context(|| format!("invalid shard file {}", p.display()))?;
            if i == 0 {
                set.meta = meta.clone();
                set.meta.records = 0;
                set.meta.index_crc32 = None;
            } else {
                ensure!(
                    meta.classes == set.meta.classes,
                    "shard {} has different classes than {}",
                    p.display(),
                    paths[0].display()
                );
            }
            set.meta.records += meta.records;
            set.entries.extend(entries.into_iter().map(|e| Entry {
                file: i as u32,
                ..e
            }));
            set.files.push((p.clone(), file));
        }
        Ok(set)
    }

    pub fn classes(&self) -> &[String] {
        &self.meta.classes
    }

    pub fn meta(&self) -> &ShardMeta {
        &self.meta
    }

    pub fn num_files(&self) -> usize {
        self.files.len()
    }
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn read_shard(path: &Path) -> Result<(File, ShardMeta, Vec<Entry>)> {
    let file = File::open(path)?;
    let size = file.metadata()?.len();
    ensure!(
        size >= MAGIC.len() as u64 + FOOTER_LEN,
        "file too short ({size} bytes)"
    );
    let mut magic = [0u8; 8];
    file.read_exact_at(&mut magic, 0)?;
    ensure!(&magic == MAGIC, "not a shard file (bad magic)");
    let mut footer = [0u8; FOOTER_LEN as usize];
    file.read_exact_at(&mut footer, size - FOOTER_LEN)?;
    ensure!(
        &footer[32..40] == END_MAGIC,
        "missing footer (truncated or unfinished file)"
    );
    let (index_off, count, meta_off, meta_len) = (
        u64_at(&footer, 0),
        u64_at(&footer, 8),
        u64_at(&footer, 16),
        u64_at(&footer, 24),
    );
    // Every bound is checked without overflow: a damaged footer must not wrap around.
    ensure!(
        meta_off.checked_add(meta_len) == Some(size - FOOTER_LEN),
        "corrupt footer"
    );
    let mut meta = vec![0u8; meta_len as usize];
    file.read_exact_at(&mut meta, meta_off)?;
    let meta: ShardMeta = serde_json::from_slice(&meta).context("corrupt metadata")?;
    let entry_len = index_entry_len(meta.format_version)?;
    let index_len = count
        .checked_mul(entry_len as u64)
        .context("corrupt record count")?;
    ensure!(
        index_off >= MAGIC.len() as u64 && index_off.checked_add(index_len) == Some(meta_off),
        "corrupt footer"
    );
    ensure!(meta.records == count, "metadata and index disagree");
    let mut index = vec![0u8; index_len as usize];
    file.read_exact_at(&mut index, index_off)?;
    let mut entries = Vec::with_capacity(count as usize);
    for e in index.chunks_exact(entry_len) {
        let entry = Entry {
            file: 0,
            offset: u64_at(e, 0),
            len: u32_at(e, 8),
            label: u32_at(e, 12),
            crc: (entry_len == 20).then(|| u32_at(e, 16)),
        };
        let end = entry.offset.checked_add(entry.len as u64);
        ensure!(
            entry.offset >= MAGIC.len() as u64 && end.is_some_and(|end| end <= index_off),
            "record outside the data area"
        );
        ensure!(
            (entry.label as usize) < meta.classes.len(),
            "label {} out of range",
            entry.label
        );
        entries.push(entry);
    }
    if let Some(stored) = meta.index_crc32 {
        let computed = index_crc32(&index, &meta.classes)?;
        ensure!(
            computed == stored,
            "damaged index or class list: CRC-32 {computed:08x}, the metadata says {stored:08x}"
        );
    }
    Ok((file, meta, entries))
}

impl Source for ShardSet {
    fn len(&self) -> usize {
        self.entries.len()
    }

    fn label(&self, i: usize) -> i64 {
        self.entries[i].label as i64
    }

    fn read<'a>(&'a self, i: usize, buf: &'a mut Vec<u8>) -> Result<&'a [u8]> {
        let e = self.entries[i];
        let (path, file) = &self.files[e.file as usize];
        buf.resize(e.len as usize, 0);
        file.read_exact_at(buf, e.offset)
            .with_context(|| format!("cannot read record {i} of {}", path.display()))?;
        if let Some(stored) = e.crc {
            let computed = crc32fast::hash(buf);
            ensure!(
                computed == stored,
                "record {i} of {} is damaged: CRC-32 {computed:08x}, the index says {stored:08x}",
                path.display()
            );
        }
        Ok(buf)
    }

    fn name(&self, i: usize) -> String {
        let e = self.entries[i];
        format!(
            "{} @ {} (record {i})",
            self.files[e.file as usize].0.display(),
            e.offset
        )
    }
}

/// Streams records into one shard file; [`ShardWriter::finish`] writes index, metadata and
/// footer, then puts the temporary file in place ([`rn50_util::atomic::persist`]: fsync, rename,
/// fsync of the folder).
pub struct ShardWriter {
    path: PathBuf,
    partial: PathBuf,
    out: BufWriter<File>,
    offset: u64,
    index: Vec<u8>,
    meta: ShardMeta,
}

impl ShardWriter {
    pub fn create(path: &Path, meta: ShardMeta) -> Result<ShardWriter> {
        let partial = rn50_util::atomic::temp_path(path)?;
        let file = File::create(&partial)
            .with_context(|| format!("cannot create {}", partial.display()))?;
        let mut out = BufWriter::with_capacity(4 << 20, file);
        out.write_all(MAGIC)?;
        Ok(ShardWriter {
            path: path.to_path_buf(),
            partial,
            out,
            offset: MAGIC.len() as u64,
            index: Vec::new(),
            meta: ShardMeta {
                records: 0,
                format_version: FORMAT_VERSION,
                ..meta
            },
        })
    }

    pub fn push(&mut self, bytes: &[u8], label: u32) -> Result<()> {
        let len = u32::try_from(bytes.len()).context("record larger than 4 GiB")?;
        self.out
            .write_all(bytes)
            .with_context(|| format!("cannot write {}", self.partial.display()))?;
        self.index.extend_from_slice(&self.offset.to_le_bytes());
        self.index.extend_from_slice(&len.to_le_bytes());
        self.index.extend_from_slice(&label.to_le_bytes());
        self.index
            .extend_from_slice(&crc32fast::hash(bytes).to_le_bytes());
        self.offset += len as u64;
        self.meta.records += 1;
        Ok(())
    }

    /// Bytes written so far.
    pub fn size(&self) -> u64 {
        self.offset + self.index.len() as u64
    }

    pub fn records(&self) -> u64 {
        self.meta.records
    }

    pub fn finish(mut self) -> Result<PathBuf> {
        self.meta.index_crc32 = Some(index_crc32(&self.index, &self.meta.classes)?);
        let meta = serde_json::to_vec(&self.meta)?;
        let index_off = self.offset;
        let meta_off = index_off + self.index.len() as u64;
        self.out.write_all(&self.index)?;
        self.out.write_all(&meta)?;
        for v in [index_off, self.meta.records, meta_off, meta.len() as u64] {
            self.out.write_all(&v.to_le_bytes())?;
        }
        self.out.write_all(END_MAGIC)?;
        let file = self
            .out
            .into_inner()
            .map_err(|e| e.into_error())
            .with_context(|| format!("cannot write {}", self.partial.display()))?;
        drop(file);
        rn50_util::atomic::persist(&self.partial, &self.path)
            .with_context(|| format!("cannot write {}", self.path.display()))?;
        Ok(self.path)
    }
}
