//! WebDataset shards (tar files as webdataset's `ShardWriter` and timm's `imagenet-1k-wds` write them) as a
//! random-access source, so that sampling, sharding across ranks, epoch order and mid-epoch resume are
//! what they are for an ImageFolder.
//!
//! A sample is a run of consecutive tar members sharing a key, webdataset's rule: the member's path up to
//! the first dot of its file name; the rest, lowercased, is the member's extension. Its image is the first of
//! its `jpg`, `jpeg`, `png` and `webp` members, its label the integer in its `cls` member or, without one,
//! the `label` of its `json` member. A label is an index into the 1,000 ILSVRC2012 classes
//! ([`crate::imagenet`]), the order timm's and the Hub's ImageNet count in: the dataset's classes are their
//! WordNet ids, whichever of them the shards hold (no class is refused for being empty, unlike an
//! ImageFolder's, whose classes are its folders). Shards carry no class list, so those of another dataset
//! cannot be read right: a label past 999 is refused, and so is a sample whose name says its class (a key
//! or the `json`'s `filename` starting with a WordNet id, as ImageNet's train files are named,
//! `n01440764_10026`) when that is not its label's class in this order.
//!
//! Each tar's members are indexed once, at open (the image's offset and length, the label), in parallel, and
//! the index is kept in a cache directory ([`default_cache_dir`]), used again while the tar is the file it was
//! made from: the same device, inode, size, mtime and ctime. Size and mtime alone are not enough: `rsync -t`,
//! `cp -p` and `tar x` give a rewritten tar its old mtime, often with the same size (other labels, other
//! images of the same lengths), and the stale index would train on the old labels and offsets. No tool sets a
//! ctime: any rewrite (and the `touch` that set the old mtime back) makes a new one. A cached index is also
//! checked against the file: each image within it, each label one of the classes; one that is not, or of
//! another format (an older rn50's), or unreadable, is no index: the tar is indexed again. A cache directory
//! that cannot be written is one warning per process, naming it; the tars are then indexed at every open.
//! Images are read by offset (`pread`).
//!
//! Bad input is refused at open with an error naming the tar: not a tar (a header's checksum is wrong), a
//! truncated one (a member running past the end of the file, or no end-of-archive blocks), a sample without
//! an image, without a label or with a label outside the classes, two members of a sample with one
//! extension, a tar with no sample. A damaged image is a bad image, skipped and counted by the loader, and so
//! is an image member longer than [`MAX_IMAGE_BYTES`] (a sparse tar's header can say 9 GiB in 36 KB): it is
//! refused unread, and no buffer of the size a member declares is allocated before that check.
//!
//! A brace pattern ([`expand_braces`]) names at most [`MAX_PATTERN_FILES`] files, counted before any name is
//! made: `x-{0..999999}-{0..999999}.tar` is refused, not 10^12 names.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{bail, ensure, Context, Result};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::common::read_image_at;
pub use super::common::MAX_IMAGE_BYTES;
use super::Source;

/// The extension of WebDataset shards.
pub const EXTENSION: &str = "tar";
/// Image members, in the order one is chosen when a sample has several.
pub const IMAGE_EXTENSIONS: &[&str] = &["jpg", "jpeg", "png", "webp"];
/// The format of the cached indexes: 3 is keyed on [`FileStamp`] (2 on the size and mtime alone, read as no
/// index).
const INDEX_VERSION: u32 = 3;
/// The most files a brace pattern may name (webdataset's shards of ImageNet are 1,024 or 2,048 files).
pub const MAX_PATTERN_FILES: u64 = 1 << 20;
/// The most bytes of names a brace pattern may expand to: [`MAX_PATTERN_FILES`] names of 256 bytes.
const MAX_PATTERN_BYTES: u64 = MAX_PATTERN_FILES << 8;
const BLOCK: u64 = 512;

/// Where tar indexes are kept unless told otherwise: `$RN50_CACHE_DIR`, else `$XDG_CACHE_HOME/rn50`, else
/// `~/.cache/rn50`; `None` when none is set (the tars are then indexed at every open).
pub fn default_cache_dir() -> Option<PathBuf> {
    let var = |name| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("RN50_CACHE_DIR")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("rn50")))
        .or_else(|| var("HOME").map(|d| d.join(".cache/rn50")))
}

/// One tar's samples, as indexed (and cached): valid for the file `stamp` describes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct TarIndex {
    format_version: u32,
    /// The tar's absolute path.
    path: PathBuf,
    stamp: FileStamp,
    samples: Vec<IndexedSample>,
}

/// What a cached index is checked against: the file's identity (device and inode), its size, and its
/// modification and change times (ns since the epoch). The ctime is the one a rewrite cannot keep: `touch
/// -d`, `rsync -t`, `cp -p` and `tar x` set the mtime, and setting it is a change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct FileStamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i64,
    ctime_ns: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct IndexedSample {
    /// The image member's name.
    member: String,
    offset: u64,
    len: u64,
    label: u64,
    /// The WordNet id the sample's name gives ([`wnid_in_name`]), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    wnid: Option<String>,
}

impl FileStamp {
    fn of(meta: &std::fs::Metadata) -> FileStamp {
        let ns = |s: i64, ns: i64| s.saturating_mul(1_000_000_000).saturating_add(ns);
        FileStamp {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.len(),
            mtime_ns: ns(meta.mtime(), meta.mtime_nsec()),
            ctime_ns: ns(meta.ctime(), meta.ctime_nsec()),
        }
    }
}

/// webdataset's `base_plus_ext`: (key, extension) of a member's path, `None` without a dot in its file name.
fn key_and_extension(path: &str) -> Option<(&str, String)> {
    let start = path.rfind('/').map_or(0, |i| i + 1);
    let dot = start + path[start..].find('.')?;
    (dot > start).then(|| (&path[..dot], path[dot + 1..].to_lowercase()))
}

/// A sample's members while its run of the tar is read.
#[derive(Default)]
struct Pending {
    key: String,
    /// (extension, member name, offset, length)
    members: Vec<(String, String, u64, u64)>,
    label: Option<u64>,
    /// The `json` member's `filename`.
    filename: Option<String>,
}

impl Pending {
    fn finish(self, tar: &Path, out: &mut Vec<IndexedSample>) -> Result<()> {
        if self.members.is_empty() && self.label.is_none() {
            return Ok(());
        }
        let image = IMAGE_EXTENSIONS
            .iter()
            .find_map(|ext| self.members.iter().find(|m| m.0 == *ext));
        let Some((_, member, offset, len)) = image else {
            bail!(
                "{}: sample {:?} has no image (a {} member)",
                tar.display(),
                self.key,
                IMAGE_EXTENSIONS.join(", ")
            );
        };
        let Some(label) = self.label else {
            bail!(
                "{}: sample {:?} has no label (a .cls member, or a .json with a \"label\")",
                tar.display(),
                self.key
            );
        };
        let wnid = [Some(self.key.as_str()), self.filename.as_deref()]
            .into_iter()
            .flatten()
            .find_map(wnid_in_name);
        out.push(IndexedSample {
            member: member.clone(),
            offset: *offset,
            len: *len,
            label,
            wnid: wnid.map(String::from),
        });
        Ok(())
    }
}

/// The label in a `cls` member (an integer, as webdataset writes it).
fn parse_cls(text: &[u8]) -> Option<u64> {
    std::str::from_utf8(text).ok()?.trim().parse().ok()
}

/// The WordNet id a sample's name starts with, in any of its path's parts: `n01440764_10026` (a key as
/// ImageNet's train files are named), `n01440764/n01440764_10026.JPEG` (a `json`'s `filename`).
fn wnid_in_name(name: &str) -> Option<&str> {
    name.split('/').find_map(|part| {
        let wnid = part.get(..9)?;
        let rest = &part[9..];
        (crate::imagenet::is_wnid(wnid) && (rest.is_empty() || rest.starts_with(['_', '.'])))
            .then_some(wnid)
    })
}

/// Reads `path`'s members and groups them into samples.
fn index_tar(path: &Path, stamp: FileStamp) -> Result<TarIndex> {
    let size = stamp.size;
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut archive = tar::Archive::new(file);
    let mut samples = Vec::new();
    let mut pending = Pending::default();
    // Where the last member's data ends, in whole blocks: the end-of-archive blocks follow.
    let mut end = 0;
    let entries = archive
        .entries_with_seek()
        .with_context(|| format!("{}: not a tar file", path.display()))?;
    for entry in entries {
        let mut entry = entry.with_context(|| {
            format!(
                "{}: not a tar file, or damaged after byte {end}",
                path.display()
            )
        })?;
        let (offset, len) = (entry.raw_file_position(), entry.size());
        end = (offset + len).div_ceil(BLOCK) * BLOCK;
        let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        ensure!(
            end <= size,
            "{}: truncated: member {name} ends at byte {}, past the end of the file ({size} bytes)",
            path.display(),
            offset + len
        );
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let Some((key, ext)) = key_and_extension(&name) else {
            continue;
        };
        if key != pending.key {
            std::mem::replace(
                &mut pending,
                Pending {
                    key: key.to_string(),
                    ..Pending::default()
                },
            )
            .finish(path, &mut samples)?;
        }
        ensure!(
            !pending.members.iter().any(|m| m.0 == ext),
            "{}: sample {key:?} has two .{ext} members",
            path.display()
        );
        if (ext == "cls" || ext == "json") && len <= 1 << 20 {
            let mut text = Vec::with_capacity(len as usize);
            entry
                .read_to_end(&mut text)
                .with_context(|| format!("cannot read {name} in {}", path.display()))?;
            if ext == "cls" {
                pending.label = Some(parse_cls(&text).with_context(|| {
                    format!(
                        "{}: {name} holds {:?}, not a class index",
                        path.display(),
                        String::from_utf8_lossy(&text[..text.len().min(40)])
                    )
                })?);
            } else if let Ok(json) = serde_json::from_slice::<serde_json::Value>(&text) {
                let field = |key| json.get(key);
                pending.label = pending.label.or(field("label").and_then(|l| l.as_u64()));
                pending.filename = field("filename").and_then(|f| f.as_str()).map(String::from);
            }
        }
        pending.members.push((ext, name, offset, len));
    }
    pending.finish(path, &mut samples)?;
    // Two zero blocks end a tar; a file cut at a member's boundary lacks them.
    let mut trailer = [0u8; 2 * BLOCK as usize];
    let whole = File::open(path)
        .and_then(|f| f.read_exact_at(&mut trailer, end))
        .is_ok();
    ensure!(
        whole && trailer.iter().all(|&b| b == 0),
        "{}: truncated: no end-of-archive blocks after byte {end} (a copy or download cut short?)",
        path.display()
    );
    ensure!(
        !samples.is_empty(),
        "{}: no samples (image and label members) in this tar",
        path.display()
    );
    Ok(TarIndex {
        format_version: INDEX_VERSION,
        path: path.to_path_buf(),
        stamp,
        samples,
    })
}

impl TarIndex {
    /// Whether this cached index may stand for the tar `path`, now `stamp`: of this format, made from this
    /// file as it is, each sample's image within the file (after a header) and its label one of the classes.
    /// Anything else (an older format, another file, an edited or damaged entry) is made again from the tar.
    fn fits(&self, path: &Path, stamp: &FileStamp, classes: u64) -> bool {
        self.format_version == INDEX_VERSION
            && self.path == path
            && self.stamp == *stamp
            && !self.samples.is_empty()
            && self.samples.iter().all(|s| {
                s.offset >= BLOCK
                    && s.offset
                        .checked_add(s.len)
                        .is_some_and(|end| end <= stamp.size)
                    && s.label < classes
            })
    }
}

/// Where `path`'s index is cached in `dir`: its file name and a checksum of its full path.
fn cache_file(dir: &Path, path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map_or_else(|| "tar".into(), |n| n.to_string_lossy().into_owned());
    let hash = crc32fast::hash(path.as_os_str().as_encoded_bytes());
    dir.join("wds-index")
        .join(format!("{name}.{hash:08x}.json"))
}

/// Whether this process has warned that it cannot keep indexes: once is enough (a directory that cannot be
/// written is the same for all 1,024 tars).
static CACHE_WARNED: AtomicBool = AtomicBool::new(false);

/// `path`'s index: the cached one while it fits the file ([`TarIndex::fits`]), else made and cached.
fn load_index(path: &Path, cache: Option<&Path>, classes: u64) -> Result<TarIndex> {
    let path =
        std::fs::canonicalize(path).with_context(|| format!("cannot open {}", path.display()))?;
    let meta =
        std::fs::metadata(&path).with_context(|| format!("cannot open {}", path.display()))?;
    ensure!(meta.is_file(), "{} is not a file", path.display());
    let stamp = FileStamp::of(&meta);
    let cached = cache.map(|dir| (dir, cache_file(dir, &path)));
    if let Some((_, file)) = &cached {
        let index = std::fs::read(file)
            .ok()
            .and_then(|text| serde_json::from_slice::<TarIndex>(&text).ok());
        if let Some(index) = index.filter(|i| i.fits(&path, &stamp, classes)) {
            return Ok(index);
        }
    }
    let index = index_tar(&path, stamp)?;
    if let Some((dir, file)) = &cached {
        // A cache: failing to keep it costs time, not correctness.
        let write = || -> Result<()> {
            std::fs::create_dir_all(file.parent().expect("in wds-index/"))?;
            rn50_util::atomic_write(file, &serde_json::to_vec(&index)?)?;
            Ok(())
        };
        if let Err(e) = write() {
            if !CACHE_WARNED.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "cannot keep WebDataset tar indexes in {} ({}: {e:#}): each tar is indexed at every \
                     open (set RN50_CACHE_DIR to a writable directory); not repeated for other tars",
                    dir.display(),
                    file.display()
                );
            }
        }
    }
    Ok(index)
}

#[derive(Clone, Copy)]
struct Entry {
    file: u32,
    offset: u64,
    len: u64,
    label: u32,
}

/// WebDataset tar files read as one dataset: samples in file order, then tar order.
pub struct WebDataset {
    files: Vec<PathBuf>,
    entries: Vec<Entry>,
    members: Vec<String>,
    classes: Vec<String>,
}

impl WebDataset {
    /// Indexes `tars` (in this order), keeping the indexes in `cache` (see [`default_cache_dir`]).
    pub fn open(tars: &[PathBuf], cache: Option<&Path>) -> Result<WebDataset> {
        ensure!(!tars.is_empty(), "no WebDataset shards given");
        let classes: Vec<String> = crate::imagenet::wnids()
            .into_iter()
            .map(String::from)
            .collect();
        let indexes: Vec<TarIndex> = tars
            .par_iter()
            .map(|t| load_index(t, cache, classes.len() as u64))
            .collect::<Result<_>>()?;
        let mut set = WebDataset {
            files: Vec::with_capacity(tars.len()),
            entries: Vec::new(),
            members: Vec::new(),
            classes,
        };
        for (i, index) in indexes.into_iter().enumerate() {
            for s in index.samples {
                ensure!(
                    s.label < set.classes.len() as u64,
                    "{}: {}'s label {} is outside the {} ImageNet classes (0 to {}): rn50 reads WebDataset \
                     labels as ImageNet-1k's class indices",
                    index.path.display(),
                    s.member,
                    s.label,
                    set.classes.len(),
                    set.classes.len() - 1
                );
                let class = &set.classes[s.label as usize];
                if let Some(wnid) = s.wnid.as_ref().filter(|w| *w != class) {
                    bail!(
                        "{}: {}'s label {} is {class} in ImageNet-1k's class order, but its name says \
                         {wnid}: rn50 reads WebDataset labels as ImageNet-1k's class indices, and these \
                         shards count their classes otherwise",
                        index.path.display(),
                        s.member,
                        s.label
                    );
                }
                set.entries.push(Entry {
                    file: i as u32,
                    offset: s.offset,
                    len: s.len,
                    label: s.label as u32,
                });
                set.members.push(s.member);
            }
            set.files.push(index.path);
        }
        Ok(set)
    }

    /// The class names (WordNet ids), label = position.
    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    pub fn num_files(&self) -> usize {
        self.files.len()
    }
}

impl Source for WebDataset {
    fn len(&self) -> usize {
        self.entries.len()
    }

    fn label(&self, i: usize) -> i64 {
        self.entries[i].label as i64
    }

    fn read<'a>(&'a self, i: usize, buf: &'a mut Vec<u8>) -> Result<&'a [u8]> {
        let e = self.entries[i];
        let path = &self.files[e.file as usize];
        let context = || format!("cannot read {} in {}", self.members[i], path.display());
        // Opened per read, as an ImageFolder's files are: 1,024 shards stay under the usual limit of open files.
        let file = File::open(path).with_context(context)?;
        read_image_at(&file, e.offset, e.len, buf).with_context(context)
    }

    fn name(&self, i: usize) -> String {
        let e = self.entries[i];
        format!(
            "{}: {}",
            self.files[e.file as usize].display(),
            self.members[i]
        )
    }
}

/// One part of a brace pattern: its choices, one of which each name holds.
enum Part<'a> {
    /// Text outside braces, or a list `{a,b}`.
    Choices(Vec<&'a str>),
    /// `{lo..hi}`, zero-padded to `width` digits.
    Range { lo: u64, hi: u64, width: usize },
}

impl Part<'_> {
    /// How many choices (`None` past `u64`'s range).
    fn count(&self) -> Option<u64> {
        match self {
            Part::Choices(c) => Some(c.len() as u64),
            Part::Range { lo, hi, .. } => (hi - lo).checked_add(1),
        }
    }

    /// The longest choice's length.
    fn longest(&self) -> u64 {
        match self {
            Part::Choices(c) => c.iter().map(|c| c.len() as u64).max().unwrap_or(0),
            Part::Range { hi, width, .. } => (hi.to_string().len().max(*width)) as u64,
        }
    }
}

/// Expands webdataset's brace notation: `{0000..0099}` (zero-padded as written) and `{a,b}`, as many as
/// there are, left to right. The names are counted first: a pattern naming more than [`MAX_PATTERN_FILES`]
/// files (the product of its ranges and lists), or names of more than 256 MiB in all, is refused before any
/// is made.
pub fn expand_braces(pattern: &str) -> Result<Vec<String>> {
    let mut parts = Vec::new();
    let mut rest = pattern;
    while let Some(open) = rest.find('{') {
        let close = open
            + rest[open..]
                .find('}')
                .with_context(|| format!("{pattern:?}: a '{{' without its '}}'"))?;
        let body = &rest[open + 1..close];
        parts.push(Part::Choices(vec![&rest[..open]]));
        parts.push(if let Some((a, b)) = body.split_once("..") {
            let (lo, hi): (u64, u64) = match (a.parse(), b.parse()) {
                (Ok(lo), Ok(hi)) if lo <= hi => (lo, hi),
                _ => bail!("{pattern:?}: {{{body}}} is not a range of numbers, low to high"),
            };
            let width = if a.starts_with('0') { a.len() } else { 0 };
            Part::Range { lo, hi, width }
        } else {
            Part::Choices(body.split(',').collect())
        });
        rest = &rest[close + 1..];
    }
    parts.push(Part::Choices(vec![rest]));
    let count = parts
        .iter()
        .try_fold(1u64, |n, p| p.count().and_then(|c| n.checked_mul(c)));
    let count = match count {
        Some(n) if n <= MAX_PATTERN_FILES => n,
        n => bail!(
            "{pattern:?} names {} files, more than the {MAX_PATTERN_FILES} a pattern may name",
            n.map_or("over 2^64".into(), |n| n.to_string())
        ),
    };
    let longest: u64 = parts.iter().map(Part::longest).sum();
    ensure!(
        count.saturating_mul(longest) <= MAX_PATTERN_BYTES,
        "{pattern:?} names {count} files of up to {longest} bytes: more than {} MiB of names to list",
        MAX_PATTERN_BYTES >> 20
    );
    let mut names = vec![String::new()];
    for part in &parts {
        let choices: Vec<String> = match part {
            Part::Choices(c) => c.iter().map(|c| c.to_string()).collect(),
            Part::Range { lo, hi, width } => (*lo..=*hi).map(|n| format!("{n:0width$}")).collect(),
        };
        names = names
            .iter()
            .flat_map(|name| choices.iter().map(move |c| format!("{name}{c}")))
            .collect();
    }
    Ok(names)
}

/// The split a shard's name gives, as timm's are named: `imagenet1k-train-0000.tar` → `train`, `validation-0003.tar`
/// → `validation`; `None` for other names.
pub fn split_of(path: &Path) -> Option<&str> {
    let stem = path.file_stem()?.to_str()?;
    let (rest, number) = stem.rsplit_once('-')?;
    if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let split = rest.rsplit_once('-').map_or(rest, |(_, s)| s);
    (!split.is_empty()).then_some(split)
}
