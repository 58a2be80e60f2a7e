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
//! label bit is a refused shard, not a silently relabelled image. That checksum is required from
//! format 2 on: a file is read unchecked only when its metadata says `"format_version": 1` (rn50
//! before checksums, whose 16-byte index entries a format 2 index does not fit), never because the
//! field is missing, or deleting it would let an edited label through.
//!
//! A shard directory is a dataset only with its [`MANIFEST`], which `rn50 pack` writes last, once
//! every shard is finished and on disk: the shard files and the images of each class. Without it
//! the directory is what a killed pack left (complete shards holding the first classes, the last
//! ones empty), and it is refused, as are shards missing from it or not listed in it, and a class
//! without images (as an ImageFolder's).
//! Readers use positioned reads (`pread`), not mmap, so a file shrinking under us is an I/O
//! error rather than a SIGBUS.
//!
//! What a file says about its own sizes is not trusted with memory: a record longer than
//! [`MAX_IMAGE_BYTES`] (a sparse file can say 4 GiB in a few kilobytes) is a bad image, refused
//! before anything is allocated, and every buffer sized from the file (metadata, index, records)
//! is reserved fallibly, so that a size the machine cannot hold is an error naming the file, not
//! an abort of the process.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};
use rn50_util::atomic::Partial;
use serde::{Deserialize, Serialize};

pub use super::common::MAX_IMAGE_BYTES;
use super::common::{files_with_extension, read_image_at, refuse_empty_classes, reserve};
use super::Source;

pub const EXTENSION: &str = "rn50shard";
/// The file in a shard directory that makes it a finished dataset (see the module doc and
/// [`Manifest`]).
pub const MANIFEST: &str = "rn50-pack.json";
/// The manifest format [`write_manifest`] writes.
pub const MANIFEST_VERSION: u32 = 1;
const MAGIC: &[u8; 8] = b"RN50SHD1";
const END_MAGIC: &[u8; 8] = b"RN50SHDE";
const FOOTER_LEN: u64 = 40;
/// The largest metadata read (the class names and a few numbers: ImageNet's 1,000 are 12 kB).
const MAX_META_BYTES: u64 = 64 << 20;
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
    /// CRC-32 of the file's index followed by `classes` as JSON. Required in a file from format 2
    /// on; absent in format 1 and in a [`ShardSet`]'s merged metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index_crc32: Option<u32>,
}

/// What `rn50 pack` writes into a shard directory as [`MANIFEST`] once all its shards are on disk:
/// the dataset's totals, against which opening the directory checks what it finds.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Manifest {
    pub format_version: u32,
    /// Images in all shards.
    pub images: u64,
    /// Images of each class, in class order.
    pub class_images: Vec<u64>,
    /// The shards, in dataset order.
    pub shards: Vec<ManifestShard>,
    /// The classes without images in the dataset packed (a WebDataset or parquet split holding some of the
    /// ImageNet classes, which are its class list whatever it holds): opening accepts these empty, and only these,
    /// as an ImageFolder's classes are its folders and an empty one is an incomplete copy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub empty_classes: Vec<String>,
}

/// One shard of a [`Manifest`].
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ManifestShard {
    /// File name, in the manifest's directory.
    pub file: String,
    pub images: u64,
    /// The CRC-32 of the file's index and class list (as [`ShardMeta::index_crc32`]): another
    /// shard, or this one rewritten, does not pass for it.
    pub index_crc32: u32,
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

/// Whether `path` is a shard directory: a directory with shard files or a [`MANIFEST`] (one whose
/// shards were all deleted is still one, refused for what it misses).
pub fn is_shard_dir(path: &Path) -> Result<bool> {
    Ok(path.join(MANIFEST).is_file() || shard_files(path)?.is_some())
}

/// The list of shard files in `dir`, sorted by name; `None` if `dir` holds none.
pub fn shard_files(dir: &Path) -> Result<Option<Vec<PathBuf>>> {
    files_with_extension(dir, "", EXTENSION)
}

/// One or more shard files read as one dataset (records in the order of the manifest's shards, then
/// file order).
pub struct ShardSet {
    files: Vec<(PathBuf, File)>,
    entries: Vec<Entry>,
    meta: ShardMeta,
}

impl ShardSet {
    /// Open a single shard file, or a shard directory with its [`MANIFEST`].
    pub fn open(path: &Path) -> Result<ShardSet> {
        if path.is_dir() {
            return ShardSet::open_dir(path);
        }
        let mut set = ShardSet::empty();
        set.add(path)
            .with_context(|| format!("invalid shard file {}", path.display()))?;
        Ok(set)
    }

    fn empty() -> ShardSet {
        ShardSet {
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
        }
    }

    /// Appends the shard file `path`'s records; returns the CRC-32 of its index and classes.
    fn add(&mut self, path: &Path) -> Result<u32> {
        let (file, meta, entries, crc) = read_shard(path)?;
        if self.files.is_empty() {
            self.meta = ShardMeta {
                records: 0,
                index_crc32: None,
                ..meta.clone()
            };
        } else {
            ensure!(
                meta.classes == self.meta.classes,
                "shard {} has different classes than {}",
                path.display(),
                self.files[0].0.display()
            );
        }
        let i = self.files.len() as u32;
        self.meta.records += meta.records;
        self.entries
            .extend(entries.into_iter().map(|e| Entry { file: i, ..e }));
        self.files.push((path.to_path_buf(), file));
        Ok(crc)
    }

    /// The shards `dir`'s manifest lists, each checked against it; refused without the manifest
    /// (a pack killed or failed, or rn50 before manifests), with a shard missing or one too many,
    /// or with a class that has no images.
    fn open_dir(dir: &Path) -> Result<ShardSet> {
        let manifest_path = dir.join(MANIFEST);
        let present = shard_files(dir)?.unwrap_or_default();
        let text = match std::fs::read(&manifest_path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if present.is_empty() {
                    bail!("{} contains no .{EXTENSION} files", dir.display());
                }
                bail!(
                    "{} was not finished by rn50 pack (killed?): run pack again. It holds {} \
                     .{EXTENSION} files but no {MANIFEST}, which pack writes once all are complete \
                     (shard directories written by rn50 before it have none either)",
                    dir.display(),
                    present.len()
                );
            }
            Err(e) => {
                return Err(e).with_context(|| format!("cannot read {}", manifest_path.display()))
            }
        };
        let manifest: Manifest = serde_json::from_slice(&text)
            .with_context(|| format!("corrupt {}", manifest_path.display()))?;
        ensure!(
            manifest.format_version == MANIFEST_VERSION,
            "{} is of format {}; this rn50 reads {MANIFEST_VERSION}: update rn50",
            manifest_path.display(),
            manifest.format_version
        );
        let mut listed = Vec::with_capacity(manifest.shards.len());
        for s in &manifest.shards {
            // A bare file name: the manifest names files in its own directory, nothing else.
            ensure!(
                Path::new(&s.file).file_name() == Some(s.file.as_ref())
                    && s.file.ends_with(&format!(".{EXTENSION}")),
                "corrupt {}: {:?} is not a shard file name",
                manifest_path.display(),
                s.file
            );
            let path = dir.join(&s.file);
            ensure!(
                !listed.contains(&path),
                "corrupt {}: it lists {} twice",
                manifest_path.display(),
                s.file
            );
            ensure!(
                path.is_file(),
                "{} is missing: {} lists it as part of the dataset (run pack again)",
                path.display(),
                manifest_path.display()
            );
            listed.push(path);
        }
        if let Some(extra) = present.iter().find(|p| !listed.contains(p)) {
            bail!(
                "{} is not part of the dataset packed in {} ({MANIFEST} does not list it): remove \
                 it, or run pack again",
                extra.display(),
                dir.display()
            );
        }
        let mut set = ShardSet::empty();
        for (path, s) in listed.iter().zip(&manifest.shards) {
            let before = set.entries.len() as u64;
            let crc = set
                .add(path)
                .with_context(|| format!("invalid shard file {}", path.display()))?;
            let images = set.entries.len() as u64 - before;
            ensure!(
                images == s.images && crc == s.index_crc32,
                "{} is not the shard {MANIFEST} lists ({images} images, index CRC-32 {crc:08x}; \
                 the manifest says {} and {:08x}): run pack again",
                path.display(),
                s.images,
                s.index_crc32
            );
        }
        let counts = set.class_images();
        ensure!(
            counts.len() == manifest.class_images.len(),
            "the shards in {} have {} classes, {MANIFEST} {}: run pack again",
            dir.display(),
            counts.len(),
            manifest.class_images.len()
        );
        if let Some(c) = (0..counts.len()).find(|&c| counts[c] != manifest.class_images[c]) {
            bail!(
                "the shards in {} hold {} images of class {}, {MANIFEST} says {}: run pack again",
                dir.display(),
                counts[c],
                set.classes()[c],
                manifest.class_images[c]
            );
        }
        ensure!(
            set.entries.len() as u64 == manifest.images,
            "the shards in {} hold {} images, {MANIFEST} says {}: run pack again",
            dir.display(),
            set.entries.len(),
            manifest.images
        );
        let (classes, counts): (Vec<String>, Vec<u64>) = set
            .classes()
            .iter()
            .cloned()
            .zip(counts)
            .filter(|(c, _)| !manifest.empty_classes.contains(c))
            .unzip();
        refuse_empty_classes(dir, &classes, &counts, " in its shards")?;
        Ok(set)
    }

    /// Images of each class.
    fn class_images(&self) -> Vec<u64> {
        let mut counts = vec![0u64; self.meta.classes.len()];
        for e in &self.entries {
            counts[e.label as usize] += 1;
        }
        counts
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

/// A buffer of `len` zero bytes, or an error (not an abort) when memory runs out.
pub(crate) fn zeroed(len: u64) -> Result<Vec<u8>> {
    let mut buf = Vec::new();
    reserve(&mut buf, len)?;
    buf.resize(len as usize, 0);
    Ok(buf)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// Opens and checks one shard file: its metadata, its index entries, and the CRC-32 of its index and
/// classes (computed, whatever its format).
fn read_shard(path: &Path) -> Result<(File, ShardMeta, Vec<Entry>, u32)> {
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
    ensure!(
        meta_len <= MAX_META_BYTES,
        "corrupt footer (metadata of {meta_len} bytes)"
    );
    let mut meta = zeroed(meta_len)?;
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
    // Within the file (checked above), which may still be larger than memory (a sparse one).
    let mut index = zeroed(index_len)?;
    file.read_exact_at(&mut index, index_off)?;
    let mut entries = Vec::new();
    entries
        .try_reserve_exact(count as usize)
        .with_context(|| format!("cannot allocate the index of {count} records"))?;
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
    let computed = index_crc32(&index, &meta.classes)?;
    match meta.index_crc32 {
        Some(stored) => ensure!(
            computed == stored,
            "damaged index or class list: CRC-32 {computed:08x}, the metadata says {stored:08x}"
        ),
        // Format 1 is identified by its version alone (see the module doc).
        None => ensure!(
            meta.format_version == 1,
            "format {} metadata without index_crc32: damaged, or written by an rn50 before \
             checksums; run rn50 pack again",
            meta.format_version
        ),
    }
    Ok((file, meta, entries, computed))
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
        read_image_at(file, e.offset, e.len as u64, buf)
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

/// Writes `dir`'s [`MANIFEST`] for the shard files `files` (in `dir`, in dataset order), atomically
/// and durably ([`rn50_util::atomic_write`]): the last step of `rn50 pack`, once every shard is
/// finished and on disk, so that a pack killed at any moment before it leaves a directory that is
/// refused. The shards are read back and checked first; the totals are what they hold. `empty_classes`: the
/// classes the packed dataset itself has no image of ([`Manifest::empty_classes`]).
pub fn write_manifest(
    dir: &Path,
    files: &[PathBuf],
    empty_classes: Vec<String>,
) -> Result<Manifest> {
    let mut set = ShardSet::empty();
    let mut shards = Vec::with_capacity(files.len());
    for path in files {
        let file = path
            .file_name()
            .and_then(|f| f.to_str())
            .filter(|_| path.parent() == Some(dir))
            .with_context(|| {
                format!(
                    "{} is not a shard file in {}",
                    path.display(),
                    dir.display()
                )
            })?;
        let before = set.entries.len() as u64;
        let index_crc32 = set
            .add(path)
            .with_context(|| format!("invalid shard file {}", path.display()))?;
        shards.push(ManifestShard {
            file: file.to_string(),
            images: set.entries.len() as u64 - before,
            index_crc32,
        });
    }
    let manifest = Manifest {
        format_version: MANIFEST_VERSION,
        images: set.entries.len() as u64,
        class_images: set.class_images(),
        shards,
        empty_classes,
    };
    let text = serde_json::to_string_pretty(&manifest)? + "\n";
    let path = dir.join(MANIFEST);
    rn50_util::atomic_write(&path, text.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(manifest)
}

/// Streams records into one shard file; [`ShardWriter::finish`] writes index, metadata and
/// footer, then puts the temporary file in place ([`rn50_util::atomic::persist`]: fsync, rename,
/// fsync of the folder). A writer dropped unfinished (a full disk, a bad image with
/// `--on-bad-image fail`) removes its temporary file.
pub struct ShardWriter {
    path: PathBuf,
    partial: Partial,
    out: BufWriter<File>,
    offset: u64,
    index: Vec<u8>,
    meta: ShardMeta,
}

impl ShardWriter {
    pub fn create(path: &Path, meta: ShardMeta) -> Result<ShardWriter> {
        let partial = Partial::new(path)?;
        let file = File::create(partial.path())
            .with_context(|| format!("cannot create {}", partial.path().display()))?;
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
            .with_context(|| format!("cannot write {}", self.partial.path().display()))?;
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
        let mut tail = || -> std::io::Result<()> {
            self.out.write_all(&self.index)?;
            self.out.write_all(&meta)?;
            for v in [index_off, self.meta.records, meta_off, meta.len() as u64] {
                self.out.write_all(&v.to_le_bytes())?;
            }
            self.out.write_all(END_MAGIC)?;
            self.out.flush()
        };
        tail().with_context(|| format!("cannot write {}", self.partial.path().display()))?;
        drop(self.out);
        self.partial
            .persist(&self.path)
            .with_context(|| format!("cannot write {}", self.path.display()))?;
        Ok(self.path)
    }
}
