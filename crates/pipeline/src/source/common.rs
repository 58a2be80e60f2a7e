//! What the sources share: the largest image any of them reads ([`MAX_IMAGE_BYTES`]) and the bounded,
//! fallibly allocated read of one ([`read_image_at`]), the listing of a dataset's files by extension
//! ([`files_with_extension`]), and the refusal of a dataset with an empty class
//! ([`refuse_empty_classes`]). Here so that the sources (and [`super`]'s dataset detection) use one
//! definition of each without calling into one another.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use anyhow::{ensure, Context, Result};

/// The largest encoded image a source reads (a record of a shard file, a member of a WebDataset tar, a file of an
/// ImageFolder): a longer
/// one is a bad image, refused before its bytes are read, not a buffer of whatever size a damaged or
/// crafted file declares (a sparse tar says 9 GiB in 36 KB). 256 MiB is 3 bytes for each of
/// Pillow's `MAX_IMAGE_PIXELS` ([`crate::decode::MAX_IMAGE_PIXELS`], "a 24-bit image of 256 MiB"):
/// the pixels of the largest image decoded by default, which its encoded bytes only exceed stored
/// without compression, and then at more than 8 bits or with alpha. Each loader thread may hold one
/// such buffer. An ImageFolder's files are read whole: there is no other limit in rn50 to share.
pub const MAX_IMAGE_BYTES: u64 = 256 << 20;

/// Makes room for `len` bytes in `buf` (emptied), or an error when memory runs out.
pub(super) fn reserve(buf: &mut Vec<u8>, len: u64) -> Result<()> {
    buf.clear();
    usize::try_from(len)
        .ok()
        .and_then(|n| buf.try_reserve_exact(n).ok())
        .with_context(|| format!("cannot allocate {len} bytes"))
}

/// Reads the `len` bytes at `offset` of `file` into `buf`: an image ([`MAX_IMAGE_BYTES`] at most, a
/// longer one is refused unread), in memory reserved fallibly.
pub(super) fn read_image_at<'a>(
    file: &File,
    offset: u64,
    len: u64,
    buf: &'a mut Vec<u8>,
) -> Result<&'a [u8]> {
    ensure!(
        len <= MAX_IMAGE_BYTES,
        "{len} bytes, more than an image may have ({} MiB): not read",
        MAX_IMAGE_BYTES >> 20
    );
    reserve(buf, len)?;
    buf.resize(len as usize, 0);
    file.read_exact_at(buf, offset)?;
    Ok(buf)
}

/// The files directly in `dir` whose names start with `prefix` and end in `.extension`, sorted by name;
/// `None` if there are none (or `dir` is not a directory).
pub fn files_with_extension(
    dir: &Path,
    prefix: &str,
    extension: &str,
) -> Result<Option<Vec<PathBuf>>> {
    if !dir.is_dir() {
        return Ok(None);
    }
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with(prefix)
            && path.extension().is_some_and(|e| e == extension)
            && path.is_file()
        {
            files.push(path);
        }
    }
    files.sort();
    Ok((!files.is_empty()).then_some(files))
}

/// Refuses a dataset in which a class has no images, as torchvision's ImageFolder does: it is the
/// sign of an incomplete extraction, copy or pack, and a class never seen would still count in the
/// accuracy. `counts` are the images of each of `classes`; `detail` ends the message.
pub(super) fn refuse_empty_classes(
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
