//! Where samples come from: an ImageFolder tree, packed shard files, or in-memory synthetic
//! JPEGs. All three hand out encoded image bytes plus a label; decoding happens in the loader.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};

pub mod folder;
pub mod shards;

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

/// Refuses a dataset in which a class has no images, as torchvision's ImageFolder does: it is the
/// sign of an incomplete extraction, copy or pack, and a class never seen would still count in the
/// accuracy. `counts` are the images of each of `classes`; `detail` ends the message.
pub(crate) fn refuse_empty_classes(
    root: &Path,
    classes: &[String],
    counts: &[u64],
    detail: &str,
) -> Result<()> {
    let empty: Vec<&str> = classes
        .iter()
        .zip(counts)
        .filter(|(_, &n)| n == 0)
        .map(|(c, _)| c.as_str())
        .collect();
    if !empty.is_empty() {
        anyhow::bail!(
            "{}: no image files for the classes {}{detail}",
            root.display(),
            empty.join(", ")
        );
    }
    Ok(())
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
    /// files and the manifest `rn50 pack` writes last, see [`shards`]), or an ImageFolder directory
    /// (`class/…/image`).
    pub fn open(path: impl AsRef<Path>) -> Result<Dataset> {
        let path = path.as_ref();
        let meta = std::fs::metadata(path)
            .with_context(|| format!("cannot open dataset {}", path.display()))?;
        if meta.is_file() || shards::is_shard_dir(path)? {
            let s = shards::ShardSet::open(path)?;
            let classes = s.classes().to_vec();
            let description = format!("shards {} ({} files)", path.display(), s.num_files());
            Ok(Dataset::from_source(Arc::new(s), classes, description))
        } else {
            let f = folder::ImageFolder::open(path)?;
            let classes = f.classes().to_vec();
            let description = format!("image folder {}", path.display());
            Ok(Dataset::from_source(Arc::new(f), classes, description))
        }
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
