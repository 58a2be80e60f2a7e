//! Where samples come from: an ImageFolder tree, packed shard files, WebDataset tar shards, Hugging Face
//! parquet files, or in-memory synthetic JPEGs. All hand out encoded image bytes plus a label; decoding happens in the loader.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};

mod common;
pub mod folder;
pub mod parquet;
pub mod shards;
pub mod wds;

pub use common::files_with_extension;

/// Which split of a dataset repository to read ([`Dataset::open_split`]): one a user named (`--train-split`,
/// `--val-split`, timm's flags), or the first found of the names a split usually goes by. A training split
/// that is the validation split (`--train-split validation`) is read as asked, and warned of
/// ([`warn_if_training_on_validation`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split<'a> {
    Named(&'a str),
    Usual(&'static [&'static str]),
}

/// The training split: `train`.
pub const TRAIN_SPLIT: Split<'static> = Split::Usual(&["train"]);
/// The validation split: ImageFolder trees' `val`, timm's and the Hub's `validation`, CIFAR-style trees' `test`.
pub const VAL_SPLIT: Split<'static> = Split::Usual(&["val", "validation", "test"]);

impl<'a> Split<'a> {
    /// The names looked for, in order.
    pub fn names(&self) -> &[&'a str] {
        match self {
            Split::Named(name) => std::slice::from_ref(name),
            Split::Usual(names) => names,
        }
    }

    /// The error for a repository `data` without this split: what was looked for.
    fn missing(&self, data: &Path) -> anyhow::Error {
        let names = self.names();
        let folders: Vec<String> = names.iter().map(|n| format!("{n}/")).collect();
        anyhow::anyhow!(
            "{} has no {} folder, nor WebDataset shards *-{}-NNNN.tar, nor parquet files data/{}-*.parquet \
             (--train-split and --val-split name other splits)",
            data.display(),
            folders.join(" or "),
            names[0],
            names[0]
        )
    }
}

/// Where [`Dataset::open_split`] finds a split: a folder, or files and what they are.
enum Found {
    Dir(PathBuf),
    Tars(Vec<PathBuf>, String),
    Parquet(Vec<PathBuf>, String),
}

/// The name under which `split` is found in `data`, and where ([`Dataset::open_split`]): a folder of one of its
/// names, else WebDataset shards named for one, else parquet files (in `data/data`, else in `data`).
fn find_split<'a>(data: &Path, split: Split<'a>) -> Result<Option<(&'a str, Found)>> {
    let names = split.names();
    for name in names {
        let dir = data.join(name);
        if dir.is_dir() {
            return Ok(Some((name, Found::Dir(dir))));
        }
    }
    if let Some(tars) = files_with_extension(data, "", wds::EXTENSION)? {
        for name in names {
            let split: Vec<PathBuf> = tars
                .iter()
                .filter(|t| wds::split_of(t) == Some(name))
                .cloned()
                .collect();
            if !split.is_empty() {
                let what = format!("WebDataset shards *-{name}-NNNN.tar in {}", data.display());
                return Ok(Some((name, Found::Tars(split, what))));
            }
        }
    }
    for dir in [data.join("data"), data.to_path_buf()] {
        for name in names {
            if let Some(files) =
                files_with_extension(&dir, &format!("{name}-"), parquet::EXTENSION)?
            {
                let what = format!("parquet files {name}-* in {}", dir.display());
                return Ok(Some((name, Found::Parquet(files, what))));
            }
        }
    }
    Ok(None)
}

/// The warning for a training split `train` that is, in `data`, the split `val` reads as validation (a
/// `--train-split validation` or `--train-split val`, or the name `--val-split` gives): the model would
/// train on the images its accuracy is measured on. `None` when they are different splits, or either is
/// not there (opening it says so).
pub fn training_on_validation(data: &Path, train: Split, val: Split) -> Option<String> {
    let (t, _) = find_split(data, train).ok()??;
    let (v, _) = find_split(data, val).ok()??;
    if t != v {
        return None;
    }
    let flag = |flag: &str, split: Split| match split {
        Split::Named(name) => format!("{flag} {name}"),
        Split::Usual(names) => format!("{flag}'s default, the first found of {}", names.join(", ")),
    };
    Some(format!(
        "the training split ({}) is the validation split ({}): {t} in {}; the model will train on \
         the images its accuracy is measured on",
        flag("--train-split", train),
        flag("--val-split", val),
        data.display()
    ))
}

/// Logs [`training_on_validation`]'s warning, if any: once, before `train`, `pack` or `bench-loader` read
/// the training split `train` of `data`.
pub fn warn_if_training_on_validation(data: &Path, train: Split, val: Split) {
    if let Some(warning) = training_on_validation(data, train, val) {
        tracing::warn!("{warning}");
    }
}

/// Random access to encoded samples. Implementations must be cheap to share between threads.
pub trait Source: Send + Sync {
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Class index of sample `i`.
    fn label(&self, i: usize) -> i64;
    /// Encoded bytes of sample `i`; `buf` is scratch space the source may read into.
    fn read<'a>(&'a self, i: usize, buf: &'a mut Vec<u8>) -> Result<&'a [u8]>;
    /// Human-readable name of sample `i` (file path or shard record) for error messages.
    fn name(&self, i: usize) -> String;
}

/// A dataset: a [`Source`] plus its class names (index = position, as torchvision's).
#[derive(Clone)]
pub struct Dataset {
    source: Arc<dyn Source>,
    classes: Arc<Vec<String>>,
    description: String,
}

impl Dataset {
    /// Open `path`, detecting its kind: a shard file (`*.rn50shard`), a shard directory (shard
    /// files and the manifest `rn50 pack` writes last, see [`shards`]), WebDataset shards (a `.tar` file,
    /// a directory of them, or webdataset's brace pattern `train-{0000..0099}.tar`, see [`wds`]), or an
    /// Hugging Face parquet files (a `.parquet` file or a directory of them, see [`parquet`]), or an
    /// ImageFolder directory (`class/…/image`).
    pub fn open(path: impl AsRef<Path>) -> Result<Dataset> {
        let path = path.as_ref();
        let text = path.to_string_lossy();
        if text.contains('{') && !path.exists() {
            let tars = wds::expand_braces(&text)?
                .into_iter()
                .map(PathBuf::from)
                .collect();
            return Dataset::open_tars(tars, format!("WebDataset shards {text}"));
        }
        let meta = std::fs::metadata(path)
            .with_context(|| format!("cannot open dataset {}", path.display()))?;
        if meta.is_file() && path.extension().is_some_and(|e| e == wds::EXTENSION) {
            return Dataset::open_tars(
                vec![path.to_path_buf()],
                format!("WebDataset shard {text}"),
            );
        }
        if meta.is_file() && path.extension().is_some_and(|e| e == parquet::EXTENSION) {
            return Dataset::open_parquet(vec![path.to_path_buf()], format!("parquet file {text}"));
        }
        if meta.is_file() || shards::is_shard_dir(path)? {
            let s = shards::ShardSet::open(path)?;
            let classes = s.classes().to_vec();
            let description = format!("shards {} ({} files)", path.display(), s.num_files());
            Ok(Dataset::from_source(Arc::new(s), classes, description))
        } else if let Some(tars) = files_with_extension(path, "", wds::EXTENSION)? {
            let mut splits: Vec<&str> = tars.iter().filter_map(|t| wds::split_of(t)).collect();
            splits.sort();
            splits.dedup();
            if splits.len() > 1 {
                anyhow::bail!(
                    "{} holds the WebDataset shards of several splits ({}): name one's files (as \
                     {}), or give the directory to train or eval, which pick their split",
                    path.display(),
                    splits.join(", "),
                    tars[0].display()
                );
            }
            Dataset::open_tars(tars, format!("WebDataset shards in {text}"))
        } else if let Some(files) = files_with_extension(path, "", parquet::EXTENSION)? {
            let mut splits: Vec<&str> = files.iter().filter_map(|f| parquet::split_of(f)).collect();
            splits.sort();
            splits.dedup();
            if splits.len() > 1 {
                anyhow::bail!(
                    "{} holds the parquet files of several splits ({}): give the directory above it \
                     to train or eval, which pick their split",
                    path.display(),
                    splits.join(", ")
                );
            }
            Dataset::open_parquet(files, format!("parquet files in {text}"))
        } else {
            let f = folder::ImageFolder::open(path)?;
            let classes = f.classes().to_vec();
            let description = format!("image folder {}", path.display());
            Ok(Dataset::from_source(Arc::new(f), classes, description))
        }
    }

    /// The split `split` of the dataset repository `data`, if it has one: the subdirectory `data/<name>/` (an
    /// ImageFolder, shards, tars), or the WebDataset shards in `data` named for it as timm's are
    /// (`imagenet1k-<name>-0000.tar`), or the Hub's parquet files (`data/<name>-00000-of-00014.parquet`, also
    /// directly in `data`). The first of its names found wins.
    pub fn open_split(data: &Path, split: Split) -> Result<Option<Dataset>> {
        let Some((_, found)) = find_split(data, split)? else {
            return Ok(None);
        };
        match found {
            Found::Dir(dir) => Dataset::open(&dir)
                .with_context(|| format!("opening {}", dir.display()))
                .map(Some),
            Found::Tars(tars, what) => Dataset::open_tars(tars, what).map(Some),
            Found::Parquet(files, what) => Dataset::open_parquet(files, what).map(Some),
        }
    }

    /// The split `split` of `data` ([`Dataset::open_split`]), or an error saying what was looked for: what
    /// `train` reads.
    pub fn open_required_split(data: &Path, split: Split) -> Result<Dataset> {
        Dataset::open_split(data, split)?.ok_or_else(|| split.missing(data))
    }

    /// The split `split` of `data` if it has one ([`Dataset::open_split`]), else `data` itself: what `eval`,
    /// `bench` and `bench-loader` read. A split a user named must be there.
    pub fn open_split_or_whole(data: &Path, split: Split) -> Result<Dataset> {
        match Dataset::open_split(data, split)? {
            Some(d) => Ok(d),
            None if matches!(split, Split::Named(_)) => Err(split.missing(data)),
            None => Dataset::open(data).with_context(|| format!("opening {}", data.display())),
        }
    }

    fn open_parquet(files: Vec<PathBuf>, description: String) -> Result<Dataset> {
        let p = parquet::ParquetSet::open(&files)?;
        let classes = p.classes().to_vec();
        let description = format!("{description} ({} files)", p.num_files());
        Ok(Dataset::from_source(Arc::new(p), classes, description))
    }

    fn open_tars(tars: Vec<PathBuf>, description: String) -> Result<Dataset> {
        let cache = wds::default_cache_dir();
        let w = wds::WebDataset::open(&tars, cache.as_deref())?;
        let classes = w.classes().to_vec();
        let description = format!("{description} ({} files)", w.num_files());
        Ok(Dataset::from_source(Arc::new(w), classes, description))
    }

    /// Wrap any source (e.g. [`crate::synthetic::SyntheticSource`]).
    pub fn from_source(
        source: Arc<dyn Source>,
        classes: Vec<String>,
        description: String,
    ) -> Dataset {
        Dataset {
            source,
            classes: Arc::new(classes),
            description,
        }
    }

    pub fn len(&self) -> usize {
        self.source.len()
    }

    pub fn is_empty(&self) -> bool {
        self.source.is_empty()
    }

    /// Class names; a label is an index into this list.
    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    pub fn label(&self, i: usize) -> i64 {
        self.source.label(i)
    }

    pub fn read<'a>(&'a self, i: usize, buf: &'a mut Vec<u8>) -> Result<&'a [u8]> {
        self.source.read(i, buf)
    }

    pub fn name(&self, i: usize) -> String {
        self.source.name(i)
    }

    /// What was opened, for logs.
    pub fn description(&self) -> &str {
        &self.description
    }

    /// `n` of the samples, evenly spaced in the dataset's order (sample `i·len/n` for `i` in `0..n`), or all of
    /// them when there are no more than `n`: a validation set cut down for a quick check keeps every class in
    /// proportion, where its first `n` samples would be the first classes only (`--val-max-images`).
    pub fn evenly_spaced(&self, n: usize) -> Dataset {
        let len = self.len();
        if n >= len {
            return self.clone();
        }
        let indices = (0..n).map(|i| i * len / n).collect();
        Dataset {
            source: Arc::new(Subset {
                source: self.source.clone(),
                indices,
            }),
            classes: self.classes.clone(),
            description: format!("{} ({n} of its {len} images)", self.description),
        }
    }
}

/// Some samples of a source, by index ([`Dataset::evenly_spaced`]).
struct Subset {
    source: Arc<dyn Source>,
    indices: Vec<usize>,
}

impl Source for Subset {
    fn len(&self) -> usize {
        self.indices.len()
    }
    fn label(&self, i: usize) -> i64 {
        self.source.label(self.indices[i])
    }
    fn read<'a>(&'a self, i: usize, buf: &'a mut Vec<u8>) -> Result<&'a [u8]> {
        self.source.read(self.indices[i], buf)
    }
    fn name(&self, i: usize) -> String {
        self.source.name(self.indices[i])
    }
}

impl std::fmt::Debug for Dataset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dataset")
            .field("description", &self.description)
            .field("len", &self.len())
            .field("classes", &self.classes.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sample `i` is named `s{i}` and labelled by its tenth of the set: the classes come in runs, as in a
    /// validation folder sorted by class.
    struct Numbered(usize);

    impl Source for Numbered {
        fn len(&self) -> usize {
            self.0
        }
        fn label(&self, i: usize) -> i64 {
            (i * 10 / self.0) as i64
        }
        fn read<'a>(&'a self, _: usize, _: &'a mut Vec<u8>) -> Result<&'a [u8]> {
            Ok(&[])
        }
        fn name(&self, i: usize) -> String {
            format!("s{i}")
        }
    }

    #[test]
    fn evenly_spaced_keeps_every_class_in_proportion() {
        let classes: Vec<String> = (0..10).map(|c| c.to_string()).collect();
        let d = Dataset::from_source(Arc::new(Numbered(100)), classes, "numbered".into());
        let s = d.evenly_spaced(20);
        assert_eq!(s.len(), 20);
        let names: Vec<String> = (0..s.len()).map(|i| s.name(i)).collect();
        assert_eq!(names[..3], ["s0", "s5", "s10"]);
        assert_eq!(names[19], "s95");
        for c in 0..10 {
            assert_eq!((0..20).filter(|&i| s.label(i) == c).count(), 2, "class {c}");
        }
        assert_eq!(s.description(), "numbered (20 of its 100 images)");
        assert_eq!(s.classes(), d.classes());
        let all = d.evenly_spaced(100);
        assert_eq!((all.len(), all.description()), (100, "numbered"));
    }
}
